//! Entry lifetime: expiry and replacement, refresh, evicted peers rebuilt.

use super::*;

/// A LAN host whose flow went stale.
const STALE_HOST: [u8; 4] = [192, 168, 50, 5];

/// An entry idle past its timeout is a miss: a reply to it is unsolicited,
/// and a new LAN flow replaces it (`FlowExpiredReplaced`), also when the
/// stale flow belonged to another LAN host.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn expired_entry_is_a_miss_and_is_replaced() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let now = now_ns();
        let timeout = u64::from(Timeouts::default().udp_unreplied) * NS_PER_SEC;
        let old = now.saturating_sub(3600 * NS_PER_SEC);
        assert!(
            now - old > timeout + NS_PER_SEC,
            "uptime too short for an expired entry"
        );

        // Same LAN host and port.
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        for (k, e) in f.entries(FlowState::UdpUnreplied, 0, old, old) {
            r.put(k, e);
        }
        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"late answer"));
        r.pass(
            "reply to an expired flow",
            &env.server_sends(&a),
            wan,
            Counter::PassUnsolicited,
        );
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"new query"));
        let run = r.redirect(
            "new flow over the expired one",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade, Counter::FlowExpiredReplaced],
        );
        let ts = r.stamp(&f.orig, &run);
        assert_eq!(r.stamp(&f.reply(), &run), ts);
        r.assert_flows("replaced", f.entries(FlowState::UdpUnreplied, 0, ts, ts));
        let run = r.redirect(
            "reply to the new flow",
            &env.server_sends(&a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows("replied", f.entries(FlowState::UdpReplied, 0, ts, seen));

        // A stale flow of another LAN host holding WAN port 41000 towards
        // the same server port: a new host's flow from 41000 takes it over.
        let stale = Flow::masq(udp_key(STALE_HOST, 41000, SERVER, 53), 41000);
        let [stale_orig, stale_reply] = stale.entries(FlowState::UdpReplied, 0, old, old);
        r.put(stale_orig.0, stale_orig.1);
        r.put(stale_reply.0, stale_reply.1);
        let g = Flow::masq(udp_key(CLIENT, 41000, SERVER, 53), 41000);
        assert_eq!(g.reply(), stale.reply());
        let q2 = Ipv4::new(CLIENT, SERVER, Udp::new(41000, 53, b"takes the port"));
        let run = r.redirect(
            "new host over another host's expired flow",
            &env.client_sends(&q2),
            lan,
            &env.to_server(&snat(&q2, 41000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade, Counter::FlowExpiredReplaced],
        );
        let ts_g = r.stamp(&g.orig, &run);
        // The stale host's own entry may stay (nothing requires deleting it)
        // but, if present, must be unchanged.
        let mut want: Vec<(FlowKey, FlowEntry)> = f
            .entries(FlowState::UdpReplied, 0, ts, seen)
            .into_iter()
            .chain(g.entries(FlowState::UdpUnreplied, 0, ts_g, ts_g))
            .collect();
        if r.flows().contains_key(&stale_orig.0) {
            want.push(stale_orig);
        }
        r.assert_flows("other host replaced", want.clone());
        let a2 = Ipv4::new(SERVER, WAN, Udp::new(53, 41000, b"to the new host"));
        r.redirect(
            "reply goes to the new host",
            &env.server_sends(&a2),
            wan,
            &env.to_client(&dnat(&a2, CLIENT, 41000)),
            Counter::FwdInbound,
            &[],
        );
        // The stale host's packet is a miss too: it opens a new flow, which
        // cannot have port 41000 now.
        let k3 = udp_key(STALE_HOST, 41000, SERVER, 53);
        let (p3, collisions) = probe(&k3, PORT_MIN, PORT_MAX, &[40000, 41000], &[]).unwrap();
        let q3 = Ipv4::new(STALE_HOST, SERVER, Udp::new(41000, 53, b"stale host again"));
        let mut events = vec![Counter::FlowNewMasquerade];
        events.extend(std::iter::repeat_n(Counter::PortCollision, collisions));
        r.redirect(
            "stale host opens a new flow",
            &Frame::new(env.lan_mac, [2, 0, 0, 0, 0, 5], q3.clone()).bytes(),
            lan,
            &env.to_server(&snat(&q3, p3)),
            Counter::FwdOutbound,
            &events,
        );
    });
}

/// `last_seen_ns` is refreshed in both entries once `REFRESH_NS` has
/// passed; a missing peer entry (LRU eviction) is rebuilt and counted.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn refresh_and_evicted_peer_reinserted() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let now = now_ns();
        let old = now.saturating_sub(5 * NS_PER_SEC);
        assert!(now - old >= 5 * NS_PER_SEC, "uptime too short");
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let [(ko, eo), (kr, er)] = f.entries(FlowState::UdpUnreplied, 0, old, old);
        r.put(ko, eo);
        r.put(kr, er);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"q"));
        let run = r.redirect(
            "hit after 5 s",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let t = r.get(&ko).last_seen_ns;
        assert!(
            (run.t0..=run.t1).contains(&t),
            "not refreshed: {t} vs {}..={}",
            run.t0,
            run.t1
        );
        r.assert_flows("refreshed", f.entries(FlowState::UdpUnreplied, 0, old, t));

        // Peer (reply entry) evicted: rebuilt on the next refresh.
        r.remove(&kr);
        r.put(ko, eo);
        let run = r.redirect(
            "hit with the reply entry missing",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::EvictionDetected],
        );
        let t = r.get(&ko).last_seen_ns;
        assert!((run.t0..=run.t1).contains(&t), "not refreshed: {t}");
        r.assert_flows(
            "reply entry rebuilt",
            f.entries(FlowState::UdpUnreplied, 0, old, t),
        );

        // Original entry evicted: the reply rebuilds it (and marks the flow replied).
        r.remove(&ko);
        r.put(kr, er);
        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"a"));
        let run = r.redirect(
            "reply with the original entry missing",
            &env.server_sends(&a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[Counter::EvictionDetected],
        );
        let t = r.get(&kr).last_seen_ns;
        assert!((run.t0..=run.t1).contains(&t), "not refreshed: {t}");
        r.assert_flows(
            "original entry rebuilt",
            f.entries(FlowState::UdpReplied, 0, old, t),
        );

        // Within REFRESH_NS: not rewritten.
        let run = r.redirect(
            "hit right after",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&ko, t, &run);
        r.assert_flows(
            "not refreshed again",
            f.entries(FlowState::UdpReplied, 0, old, seen),
        );
    });
}

/// The packet's time follows the clock from tick to tick on one CPU: the
/// data path reads the coarse clock once per tick and CPU and keeps it in a
/// per-CPU slot (router-ebpf's `clock`), and flows created ticks apart on
/// the same CPU are each stamped with their own run's time (within a tick
/// or two of it), not with a reading kept from an earlier tick.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn packet_time_follows_the_ticks_on_one_cpu() {
    // One CPU for every run, so that they all share one slot.
    tests::trafficgen::pin_to_cpu(0).expect("pinning the test's thread to CPU 0");
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        let mut last = 0;
        for port in 42000..42005 {
            let f = Flow::masq(udp_key(CLIENT, port, SERVER, 53), port);
            let q = Ipv4::new(CLIENT, SERVER, Udp::new(port, 53, b"tick"));
            let run = r.redirect(
                "new flow, ticks after the one before",
                &env.client_sends(&q),
                lan,
                &env.to_server(&snat(&q, port)),
                Counter::FwdOutbound,
                &[Counter::FlowNewMasquerade],
            );
            let ts = r.stamp(&f.orig, &run);
            assert!(ts > last, "flow {port} stamped {ts}, not after {last}");
            last = ts;
            // Five ticks at HZ 100, more at any higher HZ: past the two
            // ticks of slack in the run's clock window.
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    });
}
