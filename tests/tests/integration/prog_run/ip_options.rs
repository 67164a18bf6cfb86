//! IPv4 packets with options through `BPF_PROG_RUN`: a flow's packets with
//! options translated both ways with the options as they are (the L4
//! header where the IHL puts it, checksums computed from scratch in the
//! expected frames), and what stays the kernel's.

use super::*;

/// Two NOPs, a record-route option with room for one address, an end of
/// options: 12 bytes, IHL 8.
const OPTIONS: [u8; 12] = [1, 1, 7, 7, 4, 0, 0, 0, 0, 0, 0, 0];

/// `ip` with [`OPTIONS`].
fn with_options(mut ip: Ipv4) -> Ipv4 {
    ip.options = OPTIONS.to_vec();
    ip
}

/// UDP, TCP and ICMP echo flows: their packets with options are translated
/// both ways (a UDP answer with options marks its flow replied); a packet
/// with options of no flow yet, a TCP FIN, with TTL 1, a wrong header
/// checksum (over the options), the fragment bits, or of an offloaded flow
/// is the kernel's; a malformed TCP header is dropped, as without options.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn a_flows_packets_with_options_are_translated_both_ways() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let plain = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"query"));
        let q = with_options(plain.clone());
        r.pass(
            "options, no flow yet",
            &env.client_sends(&q),
            lan,
            Counter::PassIpOptions,
        );
        let run = r.opens_out(&env, "a plain query opens the flow", &plain, 40000);
        let ts = r.stamp(&f.orig, &run);
        r.redirect(
            "query with options",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdIpOptions,
            &[],
        );
        // Pointers Linux takes, at their edges: forwarded as they are.
        for (what, options) in [
            ("a full record route", [7, 7, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
            (
                "a timestamp with room for its last address and time",
                [0x44, 12, 5, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                "a timestamp with room for one time",
                [0x44, 8, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                "a full timestamp that overflowed 14 times",
                [0x44, 4, 5, 0xe0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                "a full prespecified timestamp (its overflow not counted)",
                [0x44, 4, 5, 0xf3, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
        ] {
            let mut edge = plain.clone();
            edge.options = options.to_vec();
            r.redirect(
                what,
                &env.client_sends(&edge),
                lan,
                &env.to_server(&snat(&edge, 40000)),
                Counter::FwdIpOptions,
                &[],
            );
        }
        let a = with_options(Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"answer")));
        let run = r.redirect(
            "answer with options",
            &env.server_sends(&a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdIpOptions,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows(
            "an answer with options marks the flow replied",
            f.entries(FlowState::UdpReplied, 0, ts, seen),
        );

        r.masq_out(
            &env,
            "SYN out",
            Tcp::new(40001, 80, TCP_SYN),
            &[Counter::FlowNewMasquerade],
        );
        let seg = with_options(Ipv4::new(
            SERVER,
            WAN,
            Tcp::new(80, 40001, TCP_ACK).payload(b"segment"),
        ));
        r.redirect(
            "TCP segment with options",
            &env.server_sends(&seg),
            wan,
            &env.to_client(&dnat(&seg, CLIENT, 40001)),
            Counter::FwdIpOptions,
            &[],
        );
        let ping = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(40020, 1, b"ping"));
        r.opens_out(&env, "ping out", &ping, 40020);
        let pong = with_options(Ipv4::new(SERVER, WAN, Icmp::echo_reply(40020, 1, b"pong")));
        r.redirect(
            "echo reply with options",
            &env.server_sends(&pong),
            wan,
            &env.to_client(&dnat(&pong, CLIENT, 40020)),
            Counter::FwdIpOptions,
            &[],
        );

        let flows = r.flows();
        let kernels = |r: &Router, what: &str, frame: &[u8]| {
            r.pass(what, frame, wan, Counter::PassIpOptions);
        };
        kernels(
            r,
            "a FIN (the kernel's state tracking sees it)",
            &env.server_sends(&with_options(Ipv4::new(
                SERVER,
                WAN,
                Tcp::new(80, 40001, TCP_FIN | TCP_ACK),
            ))),
        );
        kernels(r, "TTL 1", &env.server_sends(&a.clone().ttl(1)));
        // A source route, loose or strict (the kernel drops it unless
        // accept_source_route says otherwise), also behind six
        // no-operations; an option whose length runs past the header; more
        // options than the path walks (one could hide a source route).
        for (what, options) in [
            (
                "a loose source route",
                [1, 0x83, 7, 4, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                "a strict source route",
                [0x89, 7, 4, 0, 0, 0, 0, 0, 1, 1, 1, 0],
            ),
            (
                "an option running past the header",
                [1, 1, 7, 15, 4, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                "a source route behind six no-operations",
                [1, 1, 1, 1, 1, 1, 0x83, 3, 4, 0, 0, 0],
            ),
            (
                "more than six options",
                [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0],
            ),
            // Pointers Linux's option parsing refuses (a Parameter
            // Problem): before a record route's or a timestamp's data.
            (
                "a record route pointing before its data",
                [1, 1, 7, 7, 3, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                "a timestamp pointing before its data",
                [0x44, 8, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            // Inside the option with no room for an entry, and a full
            // timestamp whose overflow count is at its 15.
            (
                "a record route with no room for an address",
                [7, 6, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                "a timestamp with addresses and no room for one",
                [0x44, 8, 5, 1, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                "a full timestamp that overflowed 15 times",
                [0x44, 4, 5, 0xf0, 0, 0, 0, 0, 0, 0, 0, 0],
            ),
        ] {
            let mut routed = a.clone();
            routed.options = options.to_vec();
            kernels(r, what, &env.server_sends(&routed));
        }
        let mut bad = env.server_sends(&a);
        bad[IP_OFF + 20 + 1] ^= 0x01;
        kernels(r, "a wrong checksum over the options", &bad);
        let mut mf = a.clone();
        mf.frag = IP_MF;
        kernels(r, "a fragment", &env.server_sends(&mf));
        // Malformed as without options, where the core drops it: a TCP
        // data offset below the header, or past the packet.
        for (what, words) in [
            ("TCP data offset of 4 words", 4_u8),
            ("TCP data offset past the packet", 15),
        ] {
            let mut f = env.server_sends(&seg);
            f[IP_OFF + 20 + OPTIONS.len() + 12] = words << 4;
            r.drop_frame(what, &f, wan, Counter::DropMalformed);
        }
        kernels(
            r,
            "no flow",
            &env.server_sends(&with_options(Ipv4::new(SERVER, WAN, Udp::new(53, 9, b"x")))),
        );
        assert_eq!(r.flows(), flows, "nothing changed");
        put_offloaded_udp_flow(r, 40011, 61011);
        kernels(
            r,
            "an offloaded flow's",
            &env.server_sends(&with_options(Ipv4::new(
                SERVER,
                WAN,
                Udp::new(53, 61011, b"x"),
            ))),
        );
    });
}
