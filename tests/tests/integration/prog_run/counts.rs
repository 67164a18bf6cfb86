//! Per-flow packet and byte counters through `BPF_PROG_RUN`: exact after
//! a scripted number of frames per direction, the opening packet counted,
//! packets passed to the kernel not counted.

use super::*;

/// The IP total length of an Ethernet frame (what a flow's bytes count).
fn ip_len(frame: &[u8]) -> u64 {
    u64::from(u16::from_be_bytes([
        frame[ETH_HLEN + 2],
        frame[ETH_HLEN + 3],
    ]))
}

/// UDP: 3 datagrams of different sizes out (the first opens the flow), 2
/// replies in; each direction's entry counts exactly its own packets and
/// IP bytes. A datagram of the flow with TTL 1 goes to the kernel and is
/// not counted.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn udp_counts_are_exact_per_direction() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(udp_key(CLIENT, 40010, SERVER, 53), 40010);
        let mut out = FlowCount::default();
        for (i, payload) in [&b"q"[..], &[7; 100][..], &[9; 1000][..]]
            .iter()
            .enumerate()
        {
            let q = Ipv4::new(CLIENT, SERVER, Udp::new(40010, 53, payload));
            let frame = env.client_sends(&q);
            let events: &[Counter] = if i == 0 {
                &[Counter::FlowNewMasquerade]
            } else {
                &[]
            };
            r.redirect(
                "UDP out",
                &frame,
                lan,
                &env.to_server(&snat(&q, 40010)),
                Counter::FwdOutbound,
                events,
            );
            out.add(ip_len(&frame));
        }
        assert_eq!(out.packets, 3);
        assert_eq!(out.bytes, (28 + 1) + (28 + 100) + (28 + 1000));
        let mut back = FlowCount::default();
        for payload in [&[1; 40][..], &[2; 1400][..]] {
            let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40010, payload));
            let frame = env.server_sends(&a);
            r.redirect(
                "UDP reply",
                &frame,
                wan,
                &env.to_client(&dnat(&a, CLIENT, 40010)),
                Counter::FwdInbound,
                &[],
            );
            back.add(ip_len(&frame));
        }
        assert_eq!(r.raw_entry(&f.orig).count, out, "original direction");
        assert_eq!(r.raw_entry(&f.reply()).count, back, "reply direction");

        let mut ttl1 = Ipv4::new(CLIENT, SERVER, Udp::new(40010, 53, b"expiring"));
        ttl1.ttl = 1;
        let frame = env.client_sends(&ttl1);
        r.pass("TTL 1", &frame, lan, Counter::PassTtlExceeded);
        assert_eq!(
            r.raw_entry(&f.orig).count,
            out,
            "a passed packet is not counted"
        );
        assert_eq!(r.raw_entry(&f.reply()).count, back);
    });
}

/// Many frames: the counts add up exactly (no sampling), and another flow's
/// entries keep their own counts.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn counts_add_up_over_many_frames_and_stay_per_flow() {
    const N: u64 = 200;
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        let f = Flow::masq(udp_key(CLIENT, 40020, SERVER, 4000), 40020);
        let g = Flow::masq(udp_key(CLIENT, 40021, SERVER, 4000), 40021);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40020, 4000, &[5; 64]));
        let other = Ipv4::new(CLIENT, SERVER, Udp::new(40021, 4000, &[6; 10]));
        let frame = env.client_sends(&q);
        for i in 0..N {
            let run = r.test_run(&frame, lan);
            assert_eq!(
                run.verdict,
                XDP_REDIRECT,
                "frame {i}: {}",
                action_name(run.verdict)
            );
            if i == N / 2 {
                let run = r.test_run(&env.client_sends(&other), lan);
                assert_eq!(run.verdict, XDP_REDIRECT);
            }
        }
        assert_eq!(
            r.raw_entry(&f.orig).count,
            FlowCount {
                packets: N,
                bytes: N * (20 + 8 + 64)
            }
        );
        assert_eq!(
            r.raw_entry(&g.orig).count,
            FlowCount {
                packets: 1,
                bytes: 20 + 8 + 10
            }
        );
        assert_eq!(r.raw_entry(&f.reply()).count, FlowCount::default());
    });
}
