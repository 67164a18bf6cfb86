//! Port forwarding, and WAN packets of no flow and no rule.

use super::*;

/// Port forwarding: a WAN SYN / UDP datagram to a forwarded port creates a
/// flow to the LAN target; the LAN answer goes out from the forwarded port.
/// Non-SYN segments and the other protocol do not open flows. Masquerading
/// skips ports with a rule for the same protocol.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn port_forward_rules() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        r.forward(IPPROTO_TCP, 8080, CLIENT, 80);
        r.forward(IPPROTO_UDP, 5353, CLIENT, 53);
        r.forward(IPPROTO_TCP, 40000, CLIENT, 22);

        let f = Flow::forward(tcp_key(SERVER, 5555, WAN, 8080), CLIENT, 80);
        let syn = Ipv4::new(SERVER, WAN, Tcp::new(5555, 8080, TCP_SYN).options(&MSS));
        let run = r.redirect(
            "SYN to forwarded port",
            &env.server_sends(&syn),
            wan,
            &env.to_client(&dnat(&syn, CLIENT, 80)),
            Counter::FwdInbound,
            &[Counter::FlowNewPortForward],
        );
        let ts = r.stamp(&f.orig, &run);
        r.assert_flows("after SYN", f.entries(FlowState::TcpSynSent, 0, ts, ts));

        // Acknowledging the SYN (`Tcp::new`'s sequence number + 1): one
        // that does not is out of the opener's window (see `tcp_window`).
        let mut synack_tcp = Tcp::new(80, 5555, TCP_SYN | TCP_ACK).options(&MSS);
        synack_tcp.ack = Tcp::new(0, 0, 0).seq + 1;
        let synack = Ipv4::new(CLIENT, SERVER, synack_tcp);
        let run = r.redirect(
            "SYN+ACK from the LAN target",
            &env.client_sends(&synack),
            lan,
            &env.to_server(&snat(&synack, 8080)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows(
            "after SYN+ACK",
            f.entries(FlowState::TcpEstablished, 0, ts, seen),
        );
        let ack = Ipv4::new(SERVER, WAN, Tcp::new(5555, 8080, TCP_ACK).payload(b"hello"));
        let run = r.redirect(
            "ACK to forwarded port",
            &env.server_sends(&ack),
            wan,
            &env.to_client(&dnat(&ack, CLIENT, 80)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);

        let stray = Ipv4::new(SERVER, WAN, Tcp::new(5556, 8080, TCP_ACK));
        r.pass(
            "ACK without flow to a rule",
            &env.server_sends(&stray),
            wan,
            Counter::PassUnsolicited,
        );
        let stray = Ipv4::new(SERVER, WAN, Tcp::new(5556, 8080, TCP_SYN | TCP_ACK));
        r.pass(
            "SYN+ACK to a rule",
            &env.server_sends(&stray),
            wan,
            Counter::PassUnsolicited,
        );
        let udp_tcp_rule = Ipv4::new(SERVER, WAN, Udp::new(5555, 8080, b"wrong proto"));
        r.pass(
            "UDP to a TCP rule",
            &env.server_sends(&udp_tcp_rule),
            wan,
            Counter::PassUnsolicited,
        );
        let tcp_udp_rule = Ipv4::new(SERVER, WAN, Tcp::new(5555, 5353, TCP_SYN));
        r.pass(
            "SYN to a UDP rule",
            &env.server_sends(&tcp_udp_rule),
            wan,
            Counter::PassUnsolicited,
        );
        // The router's own address as source, from the WAN (spoofed: a
        // martian, RFC 1812 5.3.7): it opens nothing (its reply entry could
        // be a hairpinned flow's), the kernel drops it.
        for (what, spoofed) in [
            (
                "SYN from the WAN address itself to a TCP rule",
                Ipv4::new(WAN, WAN, Tcp::new(5555, 8080, TCP_SYN)),
            ),
            (
                "UDP from the WAN address itself to a UDP rule",
                Ipv4::new(WAN, WAN, Udp::new(5555, 5353, b"spoofed")),
            ),
        ] {
            r.pass(
                what,
                &env.server_sends(&spoofed),
                wan,
                Counter::PassUnsolicited,
            );
        }
        let other_dst = Ipv4::new(SERVER, CLIENT, Tcp::new(5555, 8080, TCP_SYN));
        r.drop_frame(
            "SYN to rule port, not WAN addr (a LAN host)",
            &env.server_sends(&other_dst),
            wan,
            Counter::DropUnsolicited,
        );

        let g = Flow::forward(udp_key(SERVER, 6000, WAN, 5353), CLIENT, 53);
        let u = Ipv4::new(SERVER, WAN, Udp::new(6000, 5353, b"udp forwarded"));
        let run = r.redirect(
            "UDP to forwarded port",
            &env.server_sends(&u),
            wan,
            &env.to_client(&dnat(&u, CLIENT, 53)),
            Counter::FwdInbound,
            &[Counter::FlowNewPortForward],
        );
        let ts_g = r.stamp(&g.orig, &run);
        let ua = Ipv4::new(CLIENT, SERVER, Udp::new(53, 6000, b"udp answer"));
        let run = r.redirect(
            "UDP answer from the LAN target",
            &env.client_sends(&ua),
            lan,
            &env.to_server(&snat(&ua, 5353)),
            Counter::FwdOutbound,
            &[],
        );
        let seen_g = r.seen(&g.orig, ts_g, &run);

        // SNAT skips TCP ports 8080 and 40000 (rules) but not for UDP.
        let kt = tcp_key(CLIENT, 40000, SERVER, 80);
        let (pt, collisions) = probe(&kt, PORT_MIN, PORT_MAX, &[], &[8080, 40000]).unwrap();
        assert_eq!(collisions, 0);
        assert_ne!(pt, 40000);
        let h = Flow::masq(kt, pt);
        let s = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN));
        let run = r.redirect(
            "SYN from a port that has a TCP rule",
            &env.client_sends(&s),
            lan,
            &env.to_server(&snat(&s, pt)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_h = r.stamp(&h.orig, &run);
        let i = Flow::masq(udp_key(CLIENT, 40000, SERVER, 80), 40000);
        let uq = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 80, b"udp keeps its port"));
        let run = r.redirect(
            "UDP from a port that has a TCP rule",
            &env.client_sends(&uq),
            lan,
            &env.to_server(&snat(&uq, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_i = r.stamp(&i.orig, &run);
        r.assert_flows(
            "end",
            f.entries(FlowState::TcpEstablished, 0, ts, seen)
                .into_iter()
                .chain(g.entries(FlowState::UdpReplied, 0, ts_g, seen_g))
                .chain(h.entries(FlowState::TcpSynSent, 0, ts_h, ts_h))
                .chain(i.entries(FlowState::UdpUnreplied, 0, ts_i, ts_i)),
        );
    });
}

/// WAN packets of no flow and no rule create nothing: those for the
/// router's WAN address go to the kernel untouched, those addressed to a
/// LAN host are dropped (standalone mode is the router's forward policy).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn unsolicited_wan_packets_pass_or_drop_untouched() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let wan = r.wan;
        let cases: Vec<(&str, Ipv4, Counter)> = vec![
            (
                "UDP to WAN",
                Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"?")),
                Counter::PassUnsolicited,
            ),
            (
                "SYN to WAN",
                Ipv4::new(SERVER, WAN, Tcp::new(5555, 22, TCP_SYN)),
                Counter::PassUnsolicited,
            ),
            (
                "ACK to WAN",
                Ipv4::new(SERVER, WAN, Tcp::new(5555, 22, TCP_ACK)),
                Counter::PassUnsolicited,
            ),
            (
                "echo reply to WAN",
                Ipv4::new(SERVER, WAN, Icmp::echo_reply(99, 1, b"")),
                Counter::PassUnsolicited,
            ),
            (
                "UDP to a LAN address",
                Ipv4::new(SERVER, CLIENT, Udp::new(53, 40000, b"?")),
                Counter::DropUnsolicited,
            ),
            (
                "SYN to a LAN address",
                Ipv4::new(SERVER, CLIENT, Tcp::new(5555, 22, TCP_SYN)),
                Counter::DropUnsolicited,
            ),
            (
                "echo request to WAN",
                Ipv4::new(SERVER, WAN, Icmp::echo_request(99, 1, b"")),
                Counter::PassProtocol,
            ),
            (
                "echo request to a LAN address",
                Ipv4::new(SERVER, CLIENT, Icmp::echo_request(99, 1, b"")),
                Counter::DropUnsolicited,
            ),
        ];
        for (what, ip, counter) in cases {
            if counter == Counter::DropUnsolicited {
                r.drop_frame(what, &env.server_sends(&ip), wan, counter);
            } else {
                r.pass(what, &env.server_sends(&ip), wan, counter);
            }
        }
        r.assert_flows("nothing created", []);
    });
}

/// A port forward whose reply tuple is a live flow's own: the LAN target
/// already talks, through its own mapping, to the remote endpoint that now
/// sends to the forwarded port. The live flow keeps its entry and its
/// mapping (RFC 4787 REQ-1; the kernel's conntrack refuses the clashing
/// tuple the same way): the WAN packet goes to the kernel
/// (`pass_reply_tuple_taken`), nothing is overwritten, and the LAN
/// endpoint's packets still leave from its mapping's port.
/// The client's UDP flow to `SERVER:3478`, opened and mapped to WAN:5000
/// (its own port): its datagram and its flow.
fn client_flow_mapped_to_5000(r: &Router, env: &ResolvedTopology) -> (Ipv4, Flow) {
    let out = Ipv4::new(CLIENT, SERVER, Udp::new(5000, 3478, b"out"));
    r.redirect(
        "the client's flow, mapped to WAN:5000",
        &env.client_sends(&out),
        r.lan,
        &env.to_server(&snat(&out, 5000)),
        Counter::FwdOutbound,
        &[Counter::FlowNewMasquerade],
    );
    (out, Flow::masq(udp_key(CLIENT, 5000, SERVER, 3478), 5000))
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_port_forward_does_not_take_over_a_live_flows_tuple() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let (out, live) = client_flow_mapped_to_5000(r, &env);
        let before = (r.get(&live.orig), r.get(&live.reply()));
        // The same LAN endpoint behind a port forward on another port.
        r.forward(IPPROTO_UDP, 6000, CLIENT, 5000);
        let clash = Ipv4::new(SERVER, WAN, Udp::new(3478, 6000, b"to the forward"));
        r.pass(
            "the remote endpoint to the forwarded port",
            &env.server_sends(&clash),
            wan,
            Counter::PassReplyTupleTaken,
        );
        assert_eq!(
            (r.get(&live.orig), r.get(&live.reply())),
            before,
            "the live flow's entries changed"
        );
        r.redirect(
            "the LAN endpoint again: still from its mapping's port",
            &env.client_sends(&out),
            lan,
            &env.to_server(&snat(&out, 5000)),
            Counter::FwdOutbound,
            &[],
        );
        // Another remote endpoint reaches the forward as usual.
        let other = Ipv4::new(SERVER, WAN, Udp::new(3479, 6000, b"another port"));
        r.redirect(
            "another remote port to the forwarded port",
            &env.server_sends(&other),
            wan,
            &env.to_client(&dnat(&other, CLIENT, 5000)),
            Counter::FwdInbound,
            &[Counter::FlowNewPortForward],
        );
    });
}

/// A forward on the endpoint's own port (a `WireGuard` or SIP endpoint,
/// `udp 51820 -> L:51820`): the endpoint's own flows leave from that port
/// (port preservation is not kept from it by its own rule), so a peer it
/// talks to that sends to the forward hits the flow's reply entry instead
/// of clashing with it. A forward to another endpoint still keeps the port
/// from everyone else.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_endpoint_leaves_from_the_port_forwarded_to_it() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        r.forward(IPPROTO_UDP, 51820, CLIENT, 51820);
        r.forward(IPPROTO_UDP, 51821, CLIENT, 9);
        let out = Ipv4::new(CLIENT, SERVER, Udp::new(51820, 51820, b"handshake"));
        r.redirect(
            "the endpoint to its peer: from its own, forwarded port",
            &env.client_sends(&out),
            lan,
            &env.to_server(&snat(&out, 51820)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let back = Ipv4::new(SERVER, WAN, Udp::new(51820, 51820, b"peer to the forward"));
        r.redirect(
            "the peer to the forwarded port: a reply of that flow",
            &env.server_sends(&back),
            wan,
            &env.to_client(&dnat(&back, CLIENT, 51820)),
            Counter::FwdInbound,
            &[],
        );
        // Port 51821 forwards to another endpoint (CLIENT:9): CLIENT:51821
        // does not get it.
        let k = udp_key(CLIENT, 51821, SERVER, 53);
        let (p, _) = probe(&k, PORT_MIN, PORT_MAX, &[], &[51821]).unwrap();
        assert_ne!(p, 51821);
        let other = Ipv4::new(CLIENT, SERVER, Udp::new(51821, 53, b"q"));
        r.redirect(
            "another endpoint's forwarded port is skipped",
            &env.client_sends(&other),
            lan,
            &env.to_server(&snat(&other, p)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
    });
}

/// A WAN packet whose source is a LAN address (spoofed: the router sends
/// replies to it out of the LAN; RFC 1812 5.3.8, BCP 38) opens no flow
/// through a port forward: passed as `pass_unsolicited`. With the tuple of
/// a live hairpinned flow (`CLIENT:41000 -> WAN:8080 -> CLIENT2:80`) it
/// leaves that flow's entries as they were (the flow goes on), and from a
/// LAN address no flow uses it does not reach the forward's target either.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_wan_packet_with_a_lan_source_opens_no_forward() {
    let env = ResolvedTopology::new(true);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        r.forward(IPPROTO_TCP, 8080, CLIENT2, 80);
        // `ip` from a LAN host to WAN:8080 as the router hairpins it.
        let hairpinned = |ip: &Ipv4| {
            let mut o = dnat(ip, CLIENT2, 80);
            o.src = WAN;
            set_ports(&mut o.l4, Some(41000), None);
            o
        };
        let syn = Ipv4::new(CLIENT, WAN, Tcp::new(41000, 8080, TCP_SYN));
        r.redirect(
            "hairpinned SYN",
            &env.client_sends(&syn),
            lan,
            &env.to_client2(&hairpinned(&syn)),
            Counter::FwdOutbound,
            &[Counter::FlowNewHairpin],
        );
        let orig = tcp_key(CLIENT, 41000, WAN, 8080);
        let (entry, flows) = (r.raw_entry(&orig), r.flows());
        r.pass(
            "the hairpin's tuple from the WAN",
            &env.server_sends(&syn),
            wan,
            Counter::PassUnsolicited,
        );
        assert_eq!(r.raw_entry(&orig), entry, "the hairpin's entry changed");
        r.assert_flows("nothing opened", flows.clone());
        let ack = Ipv4::new(CLIENT, WAN, Tcp::new(41000, 8080, TCP_ACK));
        r.redirect(
            "the hairpinned flow goes on",
            &env.client_sends(&ack),
            lan,
            &env.to_client2(&hairpinned(&ack)),
            Counter::FwdOutbound,
            &[],
        );
        let nobody = Ipv4::new(LAN_NOBODY, WAN, Tcp::new(41001, 8080, TCP_SYN));
        r.pass(
            "another LAN source from the WAN",
            &env.server_sends(&nobody),
            wan,
            Counter::PassUnsolicited,
        );
        // With forwarding off on the LAN (the kernel forwards from the WAN
        // by the WAN's setting) the check still judges.
        let lan_forwarding = |on: &str| {
            env.t.exec_ok(
                Ns::Router,
                &[
                    "sysctl",
                    "-qw",
                    &format!("net.ipv4.conf.{LAN_IF}.forwarding={on}"),
                ],
            );
        };
        lan_forwarding("0");
        r.pass(
            "a LAN source from the WAN, forwarding off on the LAN",
            &env.server_sends(&nobody),
            wan,
            Counter::PassUnsolicited,
        );
        lan_forwarding("1");
        r.assert_flows("nothing opened", flows);
    });
}

/// The tuple of a live flow's WAN-side entry arriving on the LAN: a LAN
/// host spoofing the remote `SERVER:3478` of `CLIENT`'s flow, to the
/// client's mapping WAN:5000, is refused by the source check
/// (`drop_spoofed_source`). Behind it, the commit's own guard: a WAN-side
/// entry whose remote is a LAN address (written here by hand: the WAN's
/// source check keeps such flows from opening) and a LAN host of that
/// address sending its tuple to the mapping, which endpoint-independent
/// filtering lets a hairpin reach: the hairpin's original entry would be
/// that tuple, so no flow opens (`pass_reply_tuple_taken`, the reply entry
/// it tried is removed again and its new mapping released), and the live
/// entry stays. The server's replies still reach the client.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_new_flow_does_not_overwrite_a_live_entry_of_the_other_side() {
    let env = ResolvedTopology::new(true);
    let cfg = Config {
        filtering: router_common::maps::Filtering::EndpointIndependent as u8,
        ..config(&env)
    };
    with_router(&env, Some(cfg), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let (_, live) = client_flow_mapped_to_5000(r, &env);
        let (entry, flows) = (r.raw_entry(&live.reply()), r.flows());
        let spoofed = Ipv4::new(SERVER, WAN, Udp::new(3478, 5000, b"spoofed"));
        r.drop_frame(
            "the flow's WAN-side tuple from the LAN",
            &env.client2_sends(&spoofed),
            lan,
            Counter::DropSpoofedSource,
        );
        assert_eq!(r.raw_entry(&live.reply()), entry, "the live entry changed");
        r.assert_flows("nothing opened", flows);
        let taken = udp_key(LAN_NOBODY, 3478, WAN, 5000);
        r.put(taken, entry);
        let (entry, flows) = (r.raw_entry(&taken), r.flows());
        let replayed = Ipv4::new(LAN_NOBODY, WAN, Udp::new(3478, 5000, b"replayed"));
        r.pass(
            "a live WAN-side tuple from a LAN host",
            &env.client2_sends(&replayed),
            lan,
            Counter::PassReplyTupleTaken,
        );
        assert_eq!(r.raw_entry(&taken), entry, "the live entry changed");
        r.assert_flows("nothing opened", flows);
        assert!(
            r.mapping(IPPROTO_UDP, 3478)
                .is_none_or(|m| m.expires_ns < now_ns()),
            "no mapping left for the replaying endpoint"
        );
        let back = Ipv4::new(SERVER, WAN, Udp::new(3478, 5000, b"reply"));
        r.redirect(
            "the server's reply still reaches the client",
            &env.server_sends(&back),
            wan,
            &env.to_client(&dnat(&back, CLIENT, 5000)),
            Counter::FwdInbound,
            &[],
        );
    });
}
