//! SNAT port choice: preservation, collisions between LAN hosts, a range with one port.

use super::*;

/// Two LAN hosts with the same source port to the same server port: the
/// first keeps its port, the second collides and gets the next probe;
/// replies reach the right host. Same port with another protocol or
/// another destination port does not collide. LAN -> LAN is not translated.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn port_preservation_and_collision_two_lan_hosts() {
    let env = ResolvedTopology::new(true);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f1 = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let q1 = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"from client 1"));
        let run = r.redirect(
            "client 1 out",
            &env.client_sends(&q1),
            lan,
            &env.to_server(&snat(&q1, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts1 = r.stamp(&f1.orig, &run);

        let k2 = udp_key(CLIENT2, 40000, SERVER, 53);
        let (p2, collisions) = probe(&k2, PORT_MIN, PORT_MAX, &[40000], &[]).unwrap();
        assert_ne!(p2, 40000);
        assert!(collisions >= 1);
        let f2 = Flow::masq(k2, p2);
        let q2 = Ipv4::new(CLIENT2, SERVER, Udp::new(40000, 53, b"from client 2"));
        let mut events = vec![Counter::FlowNewMasquerade];
        events.extend(std::iter::repeat_n(Counter::PortCollision, collisions));
        let run = r.redirect(
            "client 2 out (collision)",
            &env.client2_sends(&q2),
            lan,
            &env.to_server(&snat(&q2, p2)),
            Counter::FwdOutbound,
            &events,
        );
        let ts2 = r.stamp(&f2.orig, &run);
        r.assert_flows(
            "two flows",
            f1.entries(FlowState::UdpUnreplied, 0, ts1, ts1)
                .into_iter()
                .chain(f2.entries(FlowState::UdpUnreplied, 0, ts2, ts2)),
        );

        let a1 = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"to client 1"));
        let run = r.redirect(
            "reply to client 1",
            &env.server_sends(&a1),
            wan,
            &env.to_client(&dnat(&a1, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen1 = r.seen(&f1.orig, ts1, &run);
        let a2 = Ipv4::new(SERVER, WAN, Udp::new(53, p2, b"to client 2"));
        let run = r.redirect(
            "reply to client 2",
            &env.server_sends(&a2),
            wan,
            &env.to_client2(&dnat(&a2, CLIENT2, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen2 = r.seen(&f2.orig, ts2, &run);

        // Same source port, TCP: its own port space, preserved.
        let f3 = Flow::masq(tcp_key(CLIENT2, 40000, SERVER, 53), 40000);
        let s3 = Ipv4::new(CLIENT2, SERVER, Tcp::new(40000, 53, TCP_SYN));
        let run = r.redirect(
            "client 2 TCP out",
            &env.client2_sends(&s3),
            lan,
            &env.to_server(&snat(&s3, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts3 = r.stamp(&f3.orig, &run);
        // Same source port, other destination port: client 2's mapping
        // (endpoint-independent mapping), not the port it asked for.
        let f4 = Flow::masq(udp_key(CLIENT2, 40000, SERVER, 54), p2);
        let q4 = Ipv4::new(CLIENT2, SERVER, Udp::new(40000, 54, b"other dport"));
        let run = r.redirect(
            "client 2 other dport",
            &env.client2_sends(&q4),
            lan,
            &env.to_server(&snat(&q4, p2)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts4 = r.stamp(&f4.orig, &run);

        // LAN -> LAN through the router: the FIB egress is not the WAN.
        let l2l = Ipv4::new(CLIENT, CLIENT2, Udp::new(40000, 9, b"lan to lan"));
        r.pass(
            "LAN -> LAN",
            &env.client_sends(&l2l),
            lan,
            Counter::PassNoFlow,
        );
        let l2l_tcp = Ipv4::new(CLIENT, CLIENT2, Tcp::new(40005, 22, TCP_SYN));
        r.pass(
            "LAN -> LAN SYN",
            &env.client_sends(&l2l_tcp),
            lan,
            Counter::PassNoFlow,
        );

        r.assert_flows(
            "end",
            f1.entries(FlowState::UdpReplied, 0, ts1, seen1)
                .into_iter()
                .chain(f2.entries(FlowState::UdpReplied, 0, ts2, seen2))
                .chain(f3.entries(FlowState::TcpSynSent, 0, ts3, ts3))
                .chain(f4.entries(FlowState::UdpUnreplied, 0, ts4, ts4)),
        );
    });
}

/// A one-port range: the first flow's endpoint gets its mapping, flows of
/// other endpoints find it taken on every probe and are passed untouched,
/// also to another server port (one external port per internal endpoint:
/// no port overloading, RFC 4787 REQ-3); the first endpoint's flows to
/// another server port use it (endpoint-independent mapping), and another
/// protocol has its own port space.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ports_exhausted_with_one_port_range() {
    let env = ResolvedTopology::new(false);
    let cfg = Config {
        port_min: 5000,
        port_max: 5000,
        ..config(&env)
    };
    with_router(&env, Some(cfg), |r| {
        let lan = r.lan;
        let f = Flow::masq(tcp_key(CLIENT, 40000, SERVER, 80), 5000);
        let s1 = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN));
        let run = r.redirect(
            "first flow",
            &env.client_sends(&s1),
            lan,
            &env.to_server(&snat(&s1, 5000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts = r.stamp(&f.orig, &run);
        let s2 = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 80, TCP_SYN));
        let probes = vec![Counter::PortCollision; MAX_PORT_PROBES as usize];
        r.check(
            "second flow: ports exhausted",
            &env.client_sends(&s2),
            lan,
            XDP_PASS,
            &env.client_sends(&s2),
            Counter::PassPortsExhausted,
            &probes,
        );
        // Also for the port the range holds.
        let s3 = Ipv4::new(CLIENT2, SERVER, Tcp::new(5000, 80, TCP_SYN));
        let s3f = Frame::new(env.lan_mac, [2, 0, 0, 0, 0, 3], s3).bytes();
        r.check(
            "third flow: exhausted",
            &s3f,
            lan,
            XDP_PASS,
            &s3f,
            Counter::PassPortsExhausted,
            &probes,
        );
        r.assert_flows(
            "only the first flow",
            f.entries(FlowState::TcpSynSent, 0, ts, ts),
        );

        let s4 = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 81, TCP_SYN));
        r.check(
            "other endpoint, other server port: exhausted",
            &env.client_sends(&s4),
            lan,
            XDP_PASS,
            &env.client_sends(&s4),
            Counter::PassPortsExhausted,
            &probes,
        );
        let g = Flow::masq(tcp_key(CLIENT, 40000, SERVER, 81), 5000);
        let s5 = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 81, TCP_SYN));
        let run = r.redirect(
            "first endpoint, other server port",
            &env.client_sends(&s5),
            lan,
            &env.to_server(&snat(&s5, 5000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_g = r.stamp(&g.orig, &run);
        let h = Flow::masq(udp_key(CLIENT, 40001, SERVER, 80), 5000);
        let u = Ipv4::new(CLIENT, SERVER, Udp::new(40001, 80, b"udp"));
        let run = r.redirect(
            "UDP",
            &env.client_sends(&u),
            lan,
            &env.to_server(&snat(&u, 5000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_h = r.stamp(&h.orig, &run);
        r.assert_flows(
            "end",
            f.entries(FlowState::TcpSynSent, 0, ts, ts)
                .into_iter()
                .chain(g.entries(FlowState::TcpSynSent, 0, ts_g, ts_g))
                .chain(h.entries(FlowState::UdpUnreplied, 0, ts_h, ts_h)),
        );
    });
}

/// A LAN flow the data path could not open (no free port) goes to the
/// kernel's slow-path NAT, which chooses its port; its later packets go
/// there too while it lives (RFC 4787 REQ-11: the mapping does not change
/// mid-session), also once a port of the data path's comes free, each
/// refreshing its `KERNEL_FLOWS` marker. Only after a UDP mapping's
/// lifetime without a LAN packet does the data path open it. A hairpin is
/// never left so (the slow path does not translate it back).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_flow_left_to_the_kernel_stays_there_while_it_lives() {
    use router_common::mapping::UDP_MAPPING_SECS;
    let env = ResolvedTopology::new(false);
    let cfg = Config {
        port_min: 5000,
        port_max: 5000,
        ..config(&env)
    };
    with_router(&env, Some(cfg), |r| {
        let lan = r.lan;
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 5000);
        let first = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"first"));
        r.opens_out(&env, "first flow, the range's one port", &first, 5000);
        let k = udp_key(CLIENT, 40001, SERVER, 53);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40001, 53, b"second"));
        let probes = vec![Counter::PortCollision; MAX_PORT_PROBES as usize];
        let run = r.check(
            "second flow: no free port, the kernel's",
            &env.client_sends(&q),
            lan,
            XDP_PASS,
            &env.client_sends(&q),
            Counter::PassPortsExhausted,
            &probes,
        );
        let marked = r
            .kernel_flow(&k)
            .expect("the second flow left to the kernel");
        assert!((run.t0..=run.t1).contains(&marked), "marker time {marked}");
        assert_eq!(
            r.kernel_flow(&f.orig),
            None,
            "the first flow is the data path's"
        );
        // A hairpin (to a port forward on the WAN address) that finds no
        // port is not left to the kernel: its slow path would not bring it
        // back into the LAN, so the next packet tries this path again.
        r.forward(IPPROTO_UDP, 8053, CLIENT, 53);
        let h = Ipv4::new(CLIENT, WAN, Udp::new(40002, 8053, b"hairpin"));
        r.check(
            "hairpin: no free port",
            &env.client_sends(&h),
            lan,
            XDP_PASS,
            &env.client_sends(&h),
            Counter::PassPortsExhausted,
            &probes,
        );
        assert_eq!(r.kernel_flow(&udp_key(CLIENT, 40002, WAN, 8053)), None);

        // The port comes free: the first flow and its mapping end.
        r.remove(&f.orig);
        r.remove(&f.reply());
        let mut m = r
            .mapping(IPPROTO_UDP, 5000)
            .expect("the first flow's mapping");
        m.expires_ns = now_ns() - NS_PER_SEC;
        r.put_mapping(IPPROTO_UDP, 5000, m);
        let run = r.pass(
            "second flow, port free: still the kernel's",
            &env.client_sends(&q),
            lan,
            Counter::PassKernelFlow,
        );
        let refreshed = r.kernel_flow(&k).expect("marker");
        assert!(
            (run.t0..=run.t1).contains(&refreshed),
            "marker refreshed to {refreshed}"
        );
        r.assert_flows("no flow of the data path's", []);

        // Almost a UDP mapping's lifetime without a LAN packet: still
        // the kernel's.
        let secs = u64::from(UDP_MAPPING_SECS) * NS_PER_SEC;
        r.put_kernel_flow(k, now_ns() - secs + 20 * NS_PER_SEC);
        r.pass(
            "second flow, marker about to run out",
            &env.client_sends(&q),
            lan,
            Counter::PassKernelFlow,
        );
        // The whole lifetime: the kernel's entry has ended too, and the
        // data path opens the flow with its own port.
        r.put_kernel_flow(k, now_ns() - secs - NS_PER_SEC);
        r.redirect(
            "second flow after its time on the kernel",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 5000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade, Counter::MappingReclaimed],
        );
    });
}
