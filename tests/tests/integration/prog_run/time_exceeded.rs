//! A WAN packet of a flow the data path carries whose TTL ran out, through
//! `BPF_PROG_RUN`: answered with an ICMP Time Exceeded (redirected out of the WAN, the
//! exact frame built from scratch), within the per-CPU rate limit; what
//! the kernel keeps.

use super::*;

/// The Time Exceeded the router sends back for `received` (sent by the
/// server to the WAN address): from the WAN address and MAC to the
/// server's, quoting its IPv4 header and 8 payload bytes as received.
fn time_exceeded_for(env: &ResolvedTopology, received: &Ipv4) -> Vec<u8> {
    let quote = &received.bytes()[..28];
    let mut ip = Ipv4::new(WAN, received.src, Icmp::error(ICMP_TIME_EXCEEDED, 0, quote));
    ip.tos = 0xc0 | (received.tos & 0x1e);
    ip.id = 0;
    ip.frag = IP_DF;
    ip.ttl = 64;
    env.to_server(&ip)
}

/// Asserts that `ip`, sent by the server, is answered with its Time
/// Exceeded (every checksum of which is right).
fn answered(r: &Router, env: &ResolvedTopology, what: &str, ip: &Ipv4) {
    let run = r.check(
        what,
        &env.server_sends(ip),
        r.wan,
        XDP_REDIRECT,
        &time_exceeded_for(env, ip),
        Counter::DropTtlExceededAnswered,
        &[],
    );
    frames::verify_checksums(&run.out);
}

/// UDP, TCP and ICMP echo flows: the server's packets with TTL 1 or 0 are
/// answered, the flows untouched, and so are packets that a port-forward
/// rule would let in (no flow opened); a packet of no flow (a traceroute
/// to the router), a LAN packet, a wrong header checksum and an offloaded flow's
/// packet stay the kernel's; past the budget of answers the packet is
/// dropped, and the budget refills.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn a_wan_packet_of_a_flow_whose_ttl_ran_out_gets_time_exceeded() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"query"));
        r.opens_out(&env, "UDP out", &q, 40000);
        r.masq_out(
            &env,
            "SYN out",
            Tcp::new(40001, 80, TCP_SYN),
            &[Counter::FlowNewMasquerade],
        );
        let ping = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(40020, 1, b"ping"));
        r.opens_out(&env, "ping out", &ping, 40020);
        let flows = r.flows();
        let answer = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"answer"));
        let mut tos = answer.clone().ttl(1);
        tos.tos = 0x2e;
        for (what, ip) in [
            ("UDP, TTL 1", answer.clone().ttl(1)),
            ("UDP, TTL 0", answer.clone().ttl(0)),
            ("UDP, TOS kept", tos),
            (
                "TCP",
                Ipv4::new(
                    SERVER,
                    WAN,
                    Tcp::new(80, 40001, TCP_SYN | TCP_ACK).payload(b"probe"),
                )
                .ttl(1),
            ),
            (
                "echo reply",
                Ipv4::new(SERVER, WAN, Icmp::echo_reply(40020, 1, b"pong")).ttl(1),
            ),
        ] {
            answered(r, &env, what, &ip);
        }
        assert_eq!(r.flows(), flows, "the flows untouched");

        let untouched = |r: &Router, what: &str, frame: &[u8], ifindex| {
            r.pass(what, frame, ifindex, Counter::PassTtlExceeded);
        };
        untouched(
            r,
            "no flow: a traceroute to the router",
            &env.server_sends(&Ipv4::new(SERVER, WAN, Udp::new(53, 33434, b"trace")).ttl(1)),
            wan,
        );
        // No flow yet, but a port-forward rule would open one (what
        // tcptraceroute sends to a forwarded service): answered, and no
        // flow opened. Not for another protocol's rule, nor from a source
        // that opens no flow (the WAN address itself).
        r.forward(IPPROTO_TCP, 8080, CLIENT, 80);
        r.forward(IPPROTO_UDP, 5353, CLIENT, 53);
        for (what, ip) in [
            (
                "a SYN to a forwarded port",
                Ipv4::new(SERVER, WAN, Tcp::new(33000, 8080, TCP_SYN)).ttl(1),
            ),
            (
                "UDP to a forwarded port",
                Ipv4::new(SERVER, WAN, Udp::new(33001, 5353, b"probe")).ttl(1),
            ),
        ] {
            answered(r, &env, what, &ip);
        }
        assert_eq!(r.flows(), flows, "no flow opened");
        untouched(
            r,
            "UDP to a TCP rule's port",
            &env.server_sends(&Ipv4::new(SERVER, WAN, Udp::new(33002, 8080, b"x")).ttl(1)),
            wan,
        );
        untouched(
            r,
            "from the WAN address to a forwarded port",
            &env.server_sends(&Ipv4::new(WAN, WAN, Tcp::new(33003, 8080, TCP_SYN)).ttl(1)),
            wan,
        );
        // As admission judges a packet: a TCP segment without SYN opens
        // no flow, nor does a source that lives behind the LAN (spoofed).
        untouched(
            r,
            "an ACK to a forwarded port",
            &env.server_sends(&Ipv4::new(SERVER, WAN, Tcp::new(33004, 8080, TCP_ACK)).ttl(1)),
            wan,
        );
        untouched(
            r,
            "from a LAN address to a forwarded port",
            &env.server_sends(&Ipv4::new(LAN_NOBODY, WAN, Tcp::new(33005, 8080, TCP_SYN)).ttl(1)),
            wan,
        );
        untouched(r, "from the LAN", &env.client_sends(&q.clone().ttl(1)), lan);
        let mut bad = env.server_sends(&answer.clone().ttl(1));
        bad[IP_OFF + 10] ^= 0x40;
        untouched(r, "a wrong header checksum", &bad, wan);
        // A later fragment whose payload reads as the UDP flow's ports: no
        // ports of its own, never answered.
        let mut later = Ipv4::new(
            SERVER,
            WAN,
            L4::Raw {
                proto: IPPROTO_UDP,
                bytes: [53u16.to_be_bytes(), 40000u16.to_be_bytes(), [0, 16], [0, 0]].concat(),
            },
        )
        .ttl(1);
        later.frag = 3;
        untouched(r, "a later fragment", &env.server_sends(&later), wan);
        put_offloaded_udp_flow(r, 40011, 61011);
        untouched(
            r,
            "an offloaded flow's",
            &env.server_sends(&Ipv4::new(SERVER, WAN, Udp::new(53, 61011, b"x")).ttl(1)),
            wan,
        );

        // The budget, per CPU: this thread stays on one, whose budget is
        // the one the runs take from. None left (last filled in the
        // future, so nothing is earned meanwhile), then one, then a full
        // burst, then a fill long past: up to the burst, no more.
        let cpu = pin_to_this_cpu();
        let later = now_ns() + 3600 * NS_PER_SEC;
        let frame = env.server_sends(&answer.clone().ttl(1));
        r.set_icmp_answer_budget(0, later);
        r.drop_frame("no answer left", &frame, wan, Counter::DropTtlExceeded);
        r.set_icmp_answer_budget(1, later);
        let expect = time_exceeded_for(&env, &answer.clone().ttl(1));
        let answered = |r: &Router, what: &str| {
            r.check(
                what,
                &frame,
                wan,
                XDP_REDIRECT,
                &expect,
                Counter::DropTtlExceededAnswered,
                &[],
            );
        };
        answered(r, "the one answer left");
        r.drop_frame("none left again", &frame, wan, Counter::DropTtlExceeded);
        r.set_icmp_answer_budget(50, later);
        for i in 0..50 {
            answered(r, &format!("answer {i} of a burst"));
        }
        r.drop_frame("past the burst", &frame, wan, Counter::DropTtlExceeded);
        r.set_icmp_answer_budget(0, 0);
        answered(r, "a fill long past");
        let (left, filled) = r.icmp_answer_budget(cpu);
        assert_eq!(left, 49, "filled up to the burst of 50, one taken");
        assert!(filled > 0, "the fill's time is recorded");

        // Offload mode (the rules left from a standalone attach, which
        // `--admit` changes in place): the kernel admits, so a packet to
        // a forwarded port with no flow is its own to judge.
        let mut offload = config(&env);
        offload.admit = router_common::maps::Admit::Kernel as u8;
        r.configure(&offload);
        untouched(
            r,
            "offload mode: a SYN to a forwarded port",
            &env.server_sends(&Ipv4::new(SERVER, WAN, Tcp::new(33006, 8080, TCP_SYN)).ttl(1)),
            wan,
        );
    });
}

/// A hairpinned flow (a LAN host to a port forward of the WAN address,
/// back into the LAN): its LAN packet whose TTL ran out is answered from
/// the WAN address out of the LAN, quoting it as sent (passed, the
/// router's own stack would take it and reset the connection); a
/// hairpin's first packet stays the kernel's.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_hairpinned_packet_whose_ttl_ran_out_gets_time_exceeded() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        r.forward(IPPROTO_TCP, 8080, CLIENT, 80);
        let first = Ipv4::new(CLIENT, WAN, Tcp::new(40400, 8080, TCP_SYN));
        r.pass(
            "a hairpin's first packet, TTL 1",
            &env.client_sends(&first.clone().ttl(1)),
            lan,
            Counter::PassTtlExceeded,
        );
        let mut back = first.clone();
        back.src = WAN;
        back.dst = CLIENT;
        back.ttl -= 1;
        back.l4 = Tcp::new(40400, 80, TCP_SYN).into();
        r.redirect(
            "the hairpin's SYN",
            &env.client_sends(&first),
            lan,
            &env.to_client(&back),
            Counter::FwdOutbound,
            &[Counter::FlowNewHairpin],
        );
        let flows = r.flows();
        let probe = Ipv4::new(CLIENT, WAN, Tcp::new(40400, 8080, TCP_ACK)).ttl(1);
        let mut expect = Ipv4::new(
            WAN,
            CLIENT,
            Icmp::error(ICMP_TIME_EXCEEDED, 0, &probe.bytes()[..28]),
        );
        expect.tos = 0xc0;
        expect.id = 0;
        expect.frag = IP_DF;
        expect.ttl = 64;
        let run = r.check(
            "the hairpinned flow's segment, TTL 1",
            &env.client_sends(&probe),
            lan,
            XDP_REDIRECT,
            &env.to_client(&expect),
            Counter::DropTtlExceededAnswered,
            &[],
        );
        frames::verify_checksums(&run.out);
        assert_eq!(r.flows(), flows, "the flow untouched");
    });
}
