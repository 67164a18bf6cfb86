//! ICMP: echo translated by identifier, errors with their embedded headers.

use super::*;

/// ICMP echo: the identifier is the port (preserved in range, remapped
/// below it), echo replies translated back, unknown identifiers passed.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn icmp_echo_translation() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let k = icmp_key(CLIENT, SERVER, 7);
        let (p, _) = probe(&k, PORT_MIN, PORT_MAX, &[], &[]).unwrap();
        assert_ne!(p, 7);
        let f = Flow::masq(k, p);
        let req = Ipv4::new(
            CLIENT,
            SERVER,
            Icmp::echo_request(7, 1, b"ping payload 0123"),
        );
        let run = r.redirect(
            "echo request (id 7)",
            &env.client_sends(&req),
            lan,
            &env.to_server(&snat(&req, p)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts = r.stamp(&f.orig, &run);
        r.assert_flows("after request", f.entries(FlowState::Icmp, 0, ts, ts));

        let rep = Ipv4::new(SERVER, WAN, Icmp::echo_reply(p, 1, b"ping payload 0123"));
        let run = r.redirect(
            "echo reply",
            &env.server_sends(&rep),
            wan,
            &env.to_client(&dnat(&rep, CLIENT, 7)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);

        let req2 = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(7, 2, b"second"));
        let run = r.redirect(
            "echo request 2",
            &env.client_sends(&req2),
            lan,
            &env.to_server(&snat(&req2, p)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);

        // Identifier inside the range: preserved.
        let g = Flow::masq(icmp_key(CLIENT, SERVER, 4321), 4321);
        let req3 = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(4321, 9, b""));
        let run = r.redirect(
            "echo request (id 4321)",
            &env.client_sends(&req3),
            lan,
            &env.to_server(&snat(&req3, 4321)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_g = r.stamp(&g.orig, &run);
        let rep3 = Ipv4::new(SERVER, WAN, Icmp::echo_reply(4321, 9, b""));
        let run = r.redirect(
            "echo reply (id 4321)",
            &env.server_sends(&rep3),
            wan,
            &env.to_client(&dnat(&rep3, CLIENT, 4321)),
            Counter::FwdInbound,
            &[],
        );
        let seen_g = r.seen(&g.orig, ts_g, &run);

        let unknown = Ipv4::new(SERVER, WAN, Icmp::echo_reply(999, 1, b"?"));
        r.pass(
            "echo reply, unknown id",
            &env.server_sends(&unknown),
            wan,
            Counter::PassUnsolicited,
        );
        r.assert_flows(
            "end",
            f.entries(FlowState::Icmp, 0, ts, seen)
                .into_iter()
                .chain(g.entries(FlowState::Icmp, 0, ts_g, seen_g)),
        );
    });
}

/// ICMP errors from the WAN about masqueraded UDP, TCP and echo flows:
/// outer destination, embedded source address and port (echo id) and all
/// checksums (outer IP, ICMP, embedded IP, embedded L4 when present)
/// translated; errors about unknown flows or with an unusable embedded
/// header passed untouched.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn icmp_errors_with_embedded_headers() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        // Flows: UDP from port 500 (remapped to pu), TCP 40000 (kept), echo id 7 (-> pe).
        let ku = udp_key(CLIENT, 500, SERVER, 53);
        let (pu, _) = probe(&ku, PORT_MIN, PORT_MAX, &[], &[]).unwrap();
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(500, 53, b"query"));
        r.redirect(
            "UDP out",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, pu)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let s = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN).options(&MSS));
        r.redirect(
            "SYN out",
            &env.client_sends(&s),
            lan,
            &env.to_server(&snat(&s, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ke = icmp_key(CLIENT, SERVER, 7);
        let (pe, _) = probe(&ke, PORT_MIN, PORT_MAX, &[], &[]).unwrap();
        let e = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(7, 1, b"ttl test"));
        r.redirect(
            "echo out",
            &env.client_sends(&e),
            lan,
            &env.to_server(&snat(&e, pe)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let flows = r.flows();
        assert_eq!(flows.len(), 6);
        // RFC 4787 REQ-12, RFC 5382 REQ-10, RFC 5508 REQ-6: errors neither
        // end nor refresh a flow or its mapping.
        let mappings = |r: &Router| {
            [(IPPROTO_UDP, pu), (IPPROTO_TCP, 40000), (IPPROTO_ICMP, pe)]
                .map(|(proto, port)| r.mapping(proto, port).expect("a mapping"))
        };
        let held = mappings(r);

        // What the server got (after the router) and quotes back; and what
        // the client must see quoted (its own packet, TTL as quoted).
        let udp_wan = snat(&q, pu);
        let udp_lan = Ipv4 {
            src: CLIENT,
            ..snat(&q, 500)
        };
        let tcp_wan = snat(&s, 40000);
        let tcp_lan = Ipv4 {
            src: CLIENT,
            ..tcp_wan.clone()
        };
        let echo_wan = snat(&e, pe);
        let echo_lan = Ipv4 {
            src: CLIENT,
            ..snat(&e, 7)
        };
        let udp0_wan = Ipv4::new(WAN, SERVER, Udp::new(pu, 53, b"query").no_checksum()).ttl(63);
        let udp0_lan = Ipv4::new(CLIENT, SERVER, Udp::new(500, 53, b"query").no_checksum()).ttl(63);

        let err = |t: u8, c: u8, quoted: &[u8], dst: [u8; 4]| {
            let mut ip = Ipv4::new(SERVER, dst, Icmp::error(t, c, quoted));
            if dst == CLIENT {
                ip.ttl -= 1;
            }
            ip
        };
        let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
            (
                "port unreachable, whole UDP quoted",
                udp_wan.bytes(),
                udp_lan.bytes(),
            ),
            ("UDP checksum 0 quoted", udp0_wan.bytes(), udp0_lan.bytes()),
            ("TCP quoted whole", tcp_wan.bytes(), tcp_lan.bytes()),
            (
                "TCP quoted 28 bytes",
                tcp_wan.bytes()[..28].to_vec(),
                tcp_lan.bytes()[..28].to_vec(),
            ),
            ("echo quoted whole", echo_wan.bytes(), echo_lan.bytes()),
        ];
        for (what, wan_q, lan_q) in &cases {
            for (t, c) in [
                (ICMP_DEST_UNREACH, 3),
                (ICMP_TIME_EXCEEDED, 0),
                (ICMP_PARAMETER_PROBLEM, 0),
            ] {
                let input = err(t, c, wan_q, WAN);
                let want = err(t, c, lan_q, CLIENT);
                let what = format!("ICMP {t}/{c}: {what}");
                r.redirect(
                    &what,
                    &env.server_sends(&input),
                    wan,
                    &env.to_client(&want),
                    Counter::FwdInbound,
                    &[Counter::IcmpErrorTranslated],
                );
            }
        }
        // Fragmentation needed with the next-hop MTU in the rest field.
        let mut input = err(ICMP_DEST_UNREACH, 4, &tcp_wan.bytes()[..28], WAN);
        let mut want = err(ICMP_DEST_UNREACH, 4, &tcp_lan.bytes()[..28], CLIENT);
        for ip in [&mut input, &mut want] {
            if let L4::Icmp(Icmp::Other { rest, .. }) = &mut ip.l4 {
                *rest = [0, 0, 0x05, 0x00];
            }
        }
        r.redirect(
            "frag needed, TCP quoted 28 bytes",
            &env.server_sends(&input),
            wan,
            &env.to_client(&want),
            Counter::FwdInbound,
            &[Counter::IcmpErrorTranslated],
        );
        // 28 bytes quoted, then Ethernet padding where the embedded TCP
        // checksum would be: beyond the outer total length, left alone.
        let mut fin = env.server_sends(&err(ICMP_DEST_UNREACH, 13, &tcp_wan.bytes()[..28], WAN));
        let mut fout = env.to_client(&err(ICMP_DEST_UNREACH, 13, &tcp_lan.bytes()[..28], CLIENT));
        fin.extend_from_slice(&[0xa5; 16]);
        fout.extend_from_slice(&[0xa5; 16]);
        r.redirect(
            "TCP quoted 28 bytes + padding",
            &fin,
            wan,
            &fout,
            Counter::FwdInbound,
            &[Counter::IcmpErrorTranslated],
        );
        assert_eq!(r.flows(), flows, "ICMP errors leave the flows as they were");
        assert_eq!(mappings(r), held, "and their mappings");

        // An error about a live flow from a martian source or the router's
        // own WAN address (RFC 1812 5.3.7): not forwarded, the kernel drops
        // it. (One from a source a LAN route covers is forwarded, as
        // Linux's loose reverse-path filter lets it through.)
        for (sender, counter) in [
            ([127, 0, 0, 1], Counter::PassFibNotForwarded),
            ([0, 0, 0, 0], Counter::PassFibNotForwarded),
            ([224, 0, 0, 1], Counter::PassFibNotForwarded),
            ([240, 0, 0, 1], Counter::PassFibNotForwarded),
            ([255, 255, 255, 255], Counter::PassFibNotForwarded),
            (WAN, Counter::PassUnsolicited),
        ] {
            let mut spoofed = err(ICMP_DEST_UNREACH, 3, &udp_wan.bytes(), WAN);
            spoofed.src = sender;
            r.pass(
                &format!("error about a live flow from {sender:?}"),
                &env.server_sends(&spoofed),
                wan,
                counter,
            );
        }
        assert_eq!(
            r.flows(),
            flows,
            "the spoofed errors left the flows as they were"
        );

        // Not translatable: passed untouched.
        let unknown = Ipv4::new(WAN, SERVER, Udp::new(1111, 53, b"not ours")).ttl(63);
        let e1 = err(ICMP_DEST_UNREACH, 3, &unknown.bytes(), WAN);
        r.pass(
            "error about unknown flow",
            &env.server_sends(&e1),
            wan,
            Counter::PassUnsolicited,
        );
        let mut opts = udp_wan.clone();
        opts.options = vec![1, 1, 1, 0];
        let e2 = err(ICMP_DEST_UNREACH, 3, &opts.bytes(), WAN);
        r.pass(
            "embedded IHL 6",
            &env.server_sends(&e2),
            wan,
            Counter::PassUnsolicited,
        );
        let e3 = err(ICMP_DEST_UNREACH, 3, &udp_wan.bytes()[..20], WAN);
        r.pass(
            "embedded L4 missing",
            &env.server_sends(&e3),
            wan,
            Counter::PassUnsolicited,
        );
        let e4 = err(ICMP_DEST_UNREACH, 3, &udp_wan.bytes()[..26], WAN);
        r.pass(
            "embedded L4 cut short",
            &env.server_sends(&e4),
            wan,
            Counter::PassUnsolicited,
        );
        let e5 = err(ICMP_DEST_UNREACH, 3, &udp_wan.bytes()[..12], WAN);
        r.pass(
            "embedded IPv4 cut short",
            &env.server_sends(&e5),
            wan,
            Counter::PassUnsolicited,
        );
        let e6 = err(ICMP_DEST_UNREACH, 3, &[], WAN);
        r.pass(
            "nothing embedded",
            &env.server_sends(&e6),
            wan,
            Counter::PassUnsolicited,
        );
        let reply_q = Ipv4::new(WAN, SERVER, Icmp::echo_reply(pe, 1, b"")).ttl(63);
        let e7 = err(ICMP_TIME_EXCEEDED, 0, &reply_q.bytes(), WAN);
        r.pass(
            "embedded echo reply",
            &env.server_sends(&e7),
            wan,
            Counter::PassUnsolicited,
        );
        let gre = Ipv4::new(
            WAN,
            SERVER,
            L4::Raw {
                proto: 47,
                bytes: vec![0; 8],
            },
        )
        .ttl(63);
        let e8 = err(ICMP_DEST_UNREACH, 2, &gre.bytes(), WAN);
        r.pass(
            "embedded GRE",
            &env.server_sends(&e8),
            wan,
            Counter::PassUnsolicited,
        );
        // RFC 5508 / netfilter's `nf_conntrack_inet_error`: an error goes
        // to the quoted packet's source, here the WAN address.
        let e9 = err(ICMP_DEST_UNREACH, 3, &udp_wan.bytes(), [203, 0, 113, 77]);
        r.pass(
            "addressed to another host than the quoted source",
            &env.server_sends(&e9),
            wan,
            Counter::PassUnsolicited,
        );
        // A later fragment's first payload bytes are no ports, even when
        // they read as a flow's.
        let later = Ipv4 {
            frag: 8,
            ..udp_wan.clone()
        };
        let e10 = err(ICMP_TIME_EXCEEDED, 1, &later.bytes(), WAN);
        r.pass(
            "quoting a later fragment",
            &env.server_sends(&e10),
            wan,
            Counter::PassUnsolicited,
        );
        lan_errors_about_delivered_packets(&env, r, pu);
        assert_eq!(r.flows(), flows, "ICMP errors leave the flows as they were");
        assert_eq!(mappings(r), held, "and their mappings");
    });
}

/// From a LAN host, an ICMP error about a packet of a flow the NAT
/// delivered to it (a late reply to a closed UDP socket, a segment it
/// refuses) leaves as the NAT's own (RFC 5508 REQ-5): outer source the WAN
/// address, the quoted packet's destination the flow's mapping, checksums
/// as recomputed. Errors about no flow of the LAN side go to the kernel
/// (`pass_no_flow`), whose slow-path table translates them or drops them.
/// The flows are those of [`icmp_errors_with_embedded_headers`]: UDP 500
/// mapped to `pu`, TCP 40000 kept.
fn lan_errors_about_delivered_packets(env: &ResolvedTopology, r: &mut Router, pu: u16) {
    let lan = r.lan;
    // What the server sent to the mapping, and what the client got.
    let answer =
        |dst: [u8; 4], dport: u16| Ipv4::new(SERVER, dst, Udp::new(53, dport, b"answer")).ttl(63);
    let synack = |dst: [u8; 4]| {
        Ipv4::new(
            SERVER,
            dst,
            Tcp::new(80, 40000, TCP_SYN | TCP_ACK).options(&MSS),
        )
        .ttl(63)
    };
    let answer0 = |dst: [u8; 4], dport: u16| {
        Ipv4::new(SERVER, dst, Udp::new(53, dport, b"answer").no_checksum()).ttl(63)
    };
    let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
        (
            "UDP quoted whole",
            answer(CLIENT, 500).bytes(),
            answer(WAN, pu).bytes(),
        ),
        (
            "UDP checksum 0 quoted",
            answer0(CLIENT, 500).bytes(),
            answer0(WAN, pu).bytes(),
        ),
        (
            "TCP quoted whole",
            synack(CLIENT).bytes(),
            synack(WAN).bytes(),
        ),
        (
            "TCP quoted 28 bytes",
            synack(CLIENT).bytes()[..28].to_vec(),
            synack(WAN).bytes()[..28].to_vec(),
        ),
    ];
    let from_client =
        |t: u8, c: u8, quoted: &[u8]| Ipv4::new(CLIENT, SERVER, Icmp::error(t, c, quoted));
    for (what, lan_q, wan_q) in &cases {
        for (t, c) in [(ICMP_DEST_UNREACH, 3), (ICMP_PARAMETER_PROBLEM, 0)] {
            let want = Ipv4::new(WAN, SERVER, Icmp::error(t, c, wan_q)).ttl(63);
            r.redirect(
                &format!("from the LAN, ICMP {t}/{c}: {what}"),
                &env.client_sends(&from_client(t, c, lan_q)),
                lan,
                &env.to_server(&want),
                Counter::FwdOutbound,
                &[Counter::IcmpErrorTranslated],
            );
        }
    }
    // Not a packet the NAT delivered on a LAN-side flow: the kernel's.
    let unknown = Ipv4::new(SERVER, CLIENT, Udp::new(53, 501, b"not ours")).ttl(63);
    let as_sent = answer(WAN, pu);
    let echo_reply = Ipv4::new(SERVER, CLIENT, Icmp::echo_reply(7, 1, b"")).ttl(63);
    for (what, quoted) in [
        ("about an unknown flow", unknown.bytes()),
        ("quoting the WAN side's tuple", as_sent.bytes()),
        ("quoting an echo reply", echo_reply.bytes()),
        ("nothing quoted", Vec::new()),
    ] {
        r.pass(
            &format!("ICMP error from the LAN {what}"),
            &env.client_sends(&from_client(ICMP_DEST_UNREACH, 3, &quoted)),
            lan,
            Counter::PassNoFlow,
        );
    }
}

/// Offload mode: an ICMP error about an offloaded flow, from the WAN (a
/// port unreachable quoting the flow's translated datagram) or from the
/// LAN (quoting the reply the host got), goes to the kernel
/// (`pass_not_offloaded`): its conntrack knows the flow, so its firewall
/// decides on the error (a ruleset may accept `established` and not
/// `related`) and its NAT translates it; the data path carrying it would
/// bypass that. Standalone mode translates the same error (the flow is
/// its own there).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_mode_leaves_icmp_errors_about_offloaded_flows_to_the_kernel() {
    let env = ResolvedTopology::new(false);
    let mut offload = config(&env);
    offload.admit = router_common::maps::Admit::Kernel as u8;
    with_router(&env, Some(offload), |r| {
        let (lan, wan) = (r.lan, r.wan);
        put_offloaded_udp_flow(r, 40011, 61011);
        let out = Ipv4::new(CLIENT, SERVER, Udp::new(40011, 53, b"query"));
        r.redirect(
            "the offloaded flow carries a datagram",
            &env.client_sends(&out),
            lan,
            &env.to_server(&snat(&out, 61011)),
            Counter::FwdOutbound,
            &[],
        );
        let quoted_out = snat(&out, 61011).bytes();
        let from_wan = Ipv4::new(
            SERVER,
            WAN,
            Icmp::error(ICMP_DEST_UNREACH, 3, &quoted_out[..28]),
        );
        r.pass(
            "port unreachable from the WAN about the offloaded flow",
            &env.server_sends(&from_wan),
            wan,
            Counter::PassNotOffloaded,
        );
        let delivered = Ipv4::new(SERVER, CLIENT, Udp::new(53, 40011, b"answer")).bytes();
        let from_lan = Ipv4::new(
            CLIENT,
            SERVER,
            Icmp::error(ICMP_DEST_UNREACH, 3, &delivered[..28]),
        );
        r.pass(
            "port unreachable from the LAN host about the offloaded flow",
            &env.client_sends(&from_lan),
            lan,
            Counter::PassNotOffloaded,
        );
    });
}
