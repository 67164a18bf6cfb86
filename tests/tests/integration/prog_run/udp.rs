//! UDP through `BPF_PROG_RUN`: translation both ways, the states, a zero checksum.

use super::*;

/// UDP: masqueraded (port preserved; a port below the range remapped),
/// replies translated back, UNREPLIED -> REPLIED in both entries; a zero
/// UDP checksum stays zero both ways.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn udp_snat_reply_and_zero_checksum() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"odd-length query"));
        let run = r.redirect(
            "UDP out",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts = r.stamp(&f.orig, &run);
        r.assert_flows(
            "after UDP out",
            f.entries(FlowState::UdpUnreplied, 0, ts, ts),
        );

        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"answer"));
        let run = r.redirect(
            "UDP reply",
            &env.server_sends(&a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows("after reply", f.entries(FlowState::UdpReplied, 0, ts, seen));

        let run = r.redirect(
            "UDP out again",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after out again",
            f.entries(FlowState::UdpReplied, 0, ts, seen),
        );

        // No checksum: stays 0 (not recomputed, not 0xffff).
        let g = Flow::masq(udp_key(CLIENT, 40002, SERVER, 53), 40002);
        let q0 = Ipv4::new(
            CLIENT,
            SERVER,
            Udp::new(40002, 53, b"no checksum").no_checksum(),
        );
        let run = r.redirect(
            "UDP checksum 0 out",
            &env.client_sends(&q0),
            lan,
            &env.to_server(&snat(&q0, 40002)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        assert_eq!(
            &run.out[L4_OFF + 6..L4_OFF + 8],
            &[0, 0],
            "UDP checksum 0 stays 0"
        );
        let ts_g = r.stamp(&g.orig, &run);
        let a0 = Ipv4::new(
            SERVER,
            WAN,
            Udp::new(53, 40002, b"none either").no_checksum(),
        );
        let run = r.redirect(
            "UDP checksum 0 reply",
            &env.server_sends(&a0),
            wan,
            &env.to_client(&dnat(&a0, CLIENT, 40002)),
            Counter::FwdInbound,
            &[],
        );
        assert_eq!(
            &run.out[L4_OFF + 6..L4_OFF + 8],
            &[0, 0],
            "UDP checksum 0 stays 0"
        );
        let seen_g = r.seen(&g.orig, ts_g, &run);

        // Source port below the range: remapped into it, and back.
        let k = udp_key(CLIENT, 500, SERVER, 53);
        let (p, _) = probe(&k, PORT_MIN, PORT_MAX, &[40000, 40002], &[]).unwrap();
        assert!(p >= PORT_MIN);
        let h = Flow::masq(k, p);
        let q5 = Ipv4::new(CLIENT, SERVER, Udp::new(500, 53, b"low port"));
        let run = r.redirect(
            "UDP low port out",
            &env.client_sends(&q5),
            lan,
            &env.to_server(&snat(&q5, p)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_h = r.stamp(&h.orig, &run);
        let a5 = Ipv4::new(SERVER, WAN, Udp::new(53, p, b"low port answer"));
        let run = r.redirect(
            "UDP low port reply",
            &env.server_sends(&a5),
            wan,
            &env.to_client(&dnat(&a5, CLIENT, 500)),
            Counter::FwdInbound,
            &[],
        );
        let seen_h = r.seen(&h.orig, ts_h, &run);
        r.assert_flows(
            "end",
            f.entries(FlowState::UdpReplied, 0, ts, seen)
                .into_iter()
                .chain(g.entries(FlowState::UdpReplied, 0, ts_g, seen_g))
                .chain(h.entries(FlowState::UdpReplied, 0, ts_h, seen_h)),
        );
    });
}
