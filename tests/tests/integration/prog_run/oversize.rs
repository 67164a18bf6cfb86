//! A packet of a flow the data path carries that is larger than its next
//! hop's MTU once translated, through `BPF_PROG_RUN`: from the WAN with DF
//! set answered with an ICMP Fragmentation Needed carrying that MTU (the
//! exact frame built from scratch), with DF clear translated and passed
//! for the kernel to fragment (either direction); what stays `pass_mtu`.

use super::*;

/// The LAN's MTU in these tests: below the 1500 bytes the WAN carries.
const LAN_MTU: u16 = 1000;
/// A payload that makes a packet larger than [`LAN_MTU`].
const BIG: usize = 1100;

/// The Fragmentation Needed the router sends back for `received` (sent by
/// the server to the WAN address): from the WAN address and MAC to the
/// server's, with the next-hop MTU `mtu`, quoting its IPv4 header and 8
/// payload bytes as received (as the Time Exceeded of
/// `prog_run::time_exceeded`).
fn frag_needed_for(env: &ResolvedTopology, received: &Ipv4, mtu: u16) -> Vec<u8> {
    let quote = &received.bytes()[..28];
    let mut ip = Ipv4::new(WAN, received.src, Icmp::frag_needed(mtu, quote));
    ip.tos = 0xc0 | (received.tos & 0x1e);
    ip.id = 0;
    ip.frag = IP_DF;
    ip.ttl = 64;
    env.to_server(&ip)
}

/// Asserts that `ip`, sent by the server, is answered with its
/// Fragmentation Needed carrying `mtu` (every checksum of which is right).
fn answered(r: &Router, env: &ResolvedTopology, what: &str, ip: &Ipv4, mtu: u16) {
    let run = r.check(
        what,
        &env.server_sends(ip),
        r.wan,
        XDP_REDIRECT,
        &frag_needed_for(env, ip, mtu),
        Counter::DropFragNeededAnswered,
        &[],
    );
    frames::verify_checksums(&run.out);
}

/// `ip` with DF clear.
fn may_fragment(mut ip: Ipv4) -> Ipv4 {
    ip.frag = 0;
    ip
}

/// `ip`, a reply to the client's flow on `port`, as the router passes it
/// translated to the kernel: destination the client's, TTL untouched
/// (the kernel decrements it when it forwards), in the frame it came in.
fn passed_in(env: &ResolvedTopology, ip: &Ipv4, port: u16) -> Vec<u8> {
    let mut t = dnat(ip, CLIENT, port);
    t.ttl = ip.ttl;
    env.server_sends(&t)
}

/// UDP, TCP and ICMP echo flows over a LAN narrower than the WAN: the
/// server's oversize packets with DF set are answered with the LAN's MTU,
/// within the answers' budget, the flows staying; with DF clear they are
/// translated and passed. A locked route MTU is the one reported; a port
/// forward's first packet with DF set and a hairpinned one are answered
/// too. A LAN packet with DF set to the WAN, a frame larger than its own
/// link, an offloaded flow's packet and a new flow's first packet (but a
/// port forward's with DF set) stay `pass_mtu`, untouched.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn a_packet_of_a_flow_larger_than_its_next_hop_is_answered_or_passed_translated() {
    let env = ResolvedTopology::new(false);
    let mtu = LAN_MTU.to_string();
    env.t
        .exec_ok(Ns::Router, &["ip", "link", "set", LAN_IF, "mtu", &mtu]);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"query"));
        r.opens_out(&env, "UDP out", &q, 40000);
        let syn = Tcp::new(40001, 80, TCP_SYN);
        let syn_ack = Tcp::syn_ack_to(&syn);
        let (c_next, s_next) = (syn.seq + 1, syn_ack.seq + 1);
        r.masq_out(&env, "SYN out", syn, &[Counter::FlowNewMasquerade]);
        r.masq_in(&env, "SYN+ACK in", syn_ack, &[]);
        let ack = Tcp::new(40001, 80, TCP_ACK).numbered(c_next, s_next);
        r.masq_out(&env, "ACK out", ack, &[]);
        let ping = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(40020, 1, b"ping"));
        r.opens_out(&env, "ping out", &ping, 40020);

        let answer = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, &[0xa5; BIG]));
        let segment = Ipv4::new(
            SERVER,
            WAN,
            Tcp::new(80, 40001, TCP_ACK | TCP_PSH)
                .numbered(s_next, c_next)
                .payload(&[0x5a; BIG]),
        );
        let pong = Ipv4::new(SERVER, WAN, Icmp::echo_reply(40020, 1, &[0x3c; BIG]));
        for (what, ip) in [("UDP", &answer), ("TCP", &segment), ("echo reply", &pong)] {
            answered(r, &env, &format!("{what}, DF set"), ip, LAN_MTU);
        }
        let flows = r.flows();
        for (what, ip, port) in [
            ("UDP", may_fragment(answer.clone()), 40000),
            ("TCP", may_fragment(segment.clone()), 40001),
            ("echo reply", may_fragment(pong.clone()), 40020),
        ] {
            let run = r.check(
                &format!("{what}, DF clear"),
                &env.server_sends(&ip),
                wan,
                XDP_PASS,
                &passed_in(&env, &ip, port),
                Counter::PassMtuTranslated,
                &[],
            );
            frames::verify_checksums(&run.out);
        }
        assert_eq!(r.flows(), flows, "the flows stay as they were");
        // A locked route MTU below the device's is the one the FIB, and
        // so the answer, reports (asked before the flow has a cached hop:
        // `prog_run::fib` shows when a cached one is looked up again).
        let client = tests::addr::CLIENT_ADDR.to_string();
        let route = [
            "ip", "route", "add", &client, "dev", LAN_IF, "mtu", "lock", "900",
        ];
        env.t.exec_ok(Ns::Router, &route);
        let mid = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, &[0xa5; 950]));
        answered(r, &env, "over a locked route MTU", &mid, 900);
        env.t
            .exec_ok(Ns::Router, &["ip", "route", "del", &client, "dev", LAN_IF]);

        // A packet that fits still goes the fast way.
        let small = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"small"));
        r.redirect(
            "UDP that fits",
            &env.server_sends(&small),
            wan,
            &env.to_client(&dnat(&small, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );

        // Larger than the WAN link it came in on (1500): a GSO packet only
        // generic-mode XDP sees (a local sender's TSO over a veth), whose
        // partial checksum a translation here would not keep right. The
        // kernel's, untouched.
        let aggregate = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, &[0xa5; 1600]));
        r.pass(
            "larger than its own link",
            &env.server_sends(&aggregate),
            wan,
            Counter::PassMtu,
        );

        // No flow yet, but a port-forward rule lets it in: with DF set the
        // first packet is answered (no flow opened); with DF clear it
        // stays the kernel's (no entry to translate it with yet).
        r.forward(IPPROTO_UDP, 5353, CLIENT, 53);
        let first_in = Ipv4::new(SERVER, WAN, Udp::new(33000, 5353, &[0x11; BIG]));
        let flows = r.flows();
        let what = "a port forward's first packet, DF set";
        answered(r, &env, what, &first_in, LAN_MTU);
        r.pass(
            "a port forward's first packet, DF clear",
            &env.server_sends(&may_fragment(first_in)),
            wan,
            Counter::PassMtu,
        );
        assert_eq!(r.flows(), flows, "no flow opened");

        // Outbound over a narrower WAN (the LAN back at 1500): DF clear,
        // translated and passed in the frame it came in; DF set, the
        // kernel's (it answers the LAN host, quoting what that host sent).
        env.t
            .exec_ok(Ns::Router, &["ip", "link", "set", LAN_IF, "mtu", "1500"]);
        env.t
            .exec_ok(Ns::Router, &["ip", "link", "set", WAN_IF, "mtu", &mtu]);
        let upload = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, &[0x77; BIG]));
        let mut out = snat(&upload, 40000);
        out.ttl = upload.ttl;
        out.frag = 0;
        r.check(
            "LAN UDP, DF clear",
            &env.client_sends(&may_fragment(upload.clone())),
            lan,
            XDP_PASS,
            &env.client_sends(&out),
            Counter::PassMtuTranslated,
            &[],
        );
        r.pass(
            "LAN UDP, DF set",
            &env.client_sends(&upload),
            lan,
            Counter::PassMtu,
        );
        // A new flow's first packet has no entry to be translated with yet.
        let first = Ipv4::new(CLIENT, SERVER, Udp::new(40100, 53, &[0x77; BIG]));
        r.pass(
            "a new flow's first packet",
            &env.client_sends(&may_fragment(first)),
            lan,
            Counter::PassMtu,
        );
        env.t
            .exec_ok(Ns::Router, &["ip", "link", "set", WAN_IF, "mtu", "1500"]);

        // Hairpinned (the client to the WAN address's forwarded port, back
        // to itself), over a locked route MTU towards the target: with DF
        // set the LAN host sent it to the WAN address, so it is answered
        // from there, out of the LAN (passed, the router's stack would
        // take it as its own).
        let client = tests::addr::CLIENT_ADDR.to_string();
        let route = [
            "ip", "route", "add", &client, "dev", LAN_IF, "mtu", "lock", "900",
        ];
        env.t.exec_ok(Ns::Router, &route);
        let hairpin = Ipv4::new(CLIENT, WAN, Udp::new(40300, 5353, b"hairpin"));
        let mut back = hairpin.clone();
        back.src = WAN;
        back.dst = CLIENT;
        back.ttl -= 1;
        back.l4 = Udp::new(40300, 53, b"hairpin").into();
        r.redirect(
            "hairpinned",
            &env.client_sends(&hairpin),
            lan,
            &env.to_client(&back),
            Counter::FwdOutbound,
            &[Counter::FlowNewHairpin],
        );
        let big_hairpin = Ipv4::new(CLIENT, WAN, Udp::new(40300, 5353, &[0x22; 950]));
        let mut quote = big_hairpin.bytes();
        quote.truncate(28);
        let mut expect = Ipv4::new(WAN, CLIENT, Icmp::frag_needed(900, &quote));
        expect.tos = 0xc0;
        expect.id = 0;
        expect.ttl = 64;
        r.check(
            "hairpinned, DF set",
            &env.client_sends(&big_hairpin),
            lan,
            XDP_REDIRECT,
            &env.to_client(&expect),
            Counter::DropFragNeededAnswered,
            &[],
        );
        env.t
            .exec_ok(Ns::Router, &["ip", "route", "del", &client, "dev", LAN_IF]);

        env.t
            .exec_ok(Ns::Router, &["ip", "link", "set", LAN_IF, "mtu", &mtu]);

        // An offloaded flow's packet is the kernel's: its conntrack
        // translates it and fragments or answers.
        put_offloaded_udp_flow(r, 40011, 61011);
        let offloaded = Ipv4::new(SERVER, WAN, Udp::new(53, 61011, &[0xa5; BIG]));
        r.pass(
            "an offloaded flow's",
            &env.server_sends(&offloaded),
            wan,
            Counter::PassMtu,
        );

        // The answers' budget (shared with Time Exceeded): none left,
        // dropped unanswered (passed, the router's stack would answer as
        // the endpoint).
        let cpu = pin_to_this_cpu();
        let later = now_ns() + 3600 * NS_PER_SEC;
        r.set_icmp_answer_budget(0, later);
        r.drop_frame(
            "no answer left",
            &env.server_sends(&answer),
            wan,
            Counter::DropFragNeeded,
        );
        r.set_icmp_answer_budget(0, 0);
        answered(r, &env, "a fill long past", &answer, LAN_MTU);
        assert_eq!(r.icmp_answer_budget(cpu).0, 49, "one answer taken");
    });
}
