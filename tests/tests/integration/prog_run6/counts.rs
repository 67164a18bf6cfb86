//! Per-flow packet and byte counters of IPv6 flows through
//! `BPF_PROG_RUN`: exact per direction, the opening packet counted, a
//! packet passed to the kernel (hop limit 1) not counted.

use router_common::maps::{FlowCount, IPPROTO_UDP};
use tests::frames::Udp;
use tests::v6::{CLIENT6, SERVER6, o};

use super::*;

/// The IPv6 packet length of an Ethernet frame: fixed header plus payload
/// length (what a flow's bytes count).
fn ip6_len(frame: &[u8]) -> u64 {
    const ETH_HLEN: usize = 14;
    40 + u64::from(u16::from_be_bytes([
        frame[ETH_HLEN + 4],
        frame[ETH_HLEN + 5],
    ]))
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn udp6_counts_are_exact_per_direction() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let k = FlowKey6::new(c, s, 5454, 53, IPPROTO_UDP);
        let mut out = FlowCount::default();
        for (i, payload) in [&b"q"[..], &[3; 300][..], &[4; 1200][..]]
            .iter()
            .enumerate()
        {
            let q = Ipv6::udp(c, s, &Udp::new(5454, 53, payload));
            let frame = from_client(&env, &q);
            let events: &[Counter] = if i == 0 {
                &[Counter::Flow6NewOutbound]
            } else {
                &[]
            };
            r.redirect(
                "UDP out",
                &frame,
                lan,
                &to_server(&env, &q),
                Counter::Fwd6Outbound,
                events,
            );
            out.add(ip6_len(&frame));
        }
        assert_eq!(out.bytes, (48 + 1) + (48 + 300) + (48 + 1200));
        let mut back = FlowCount::default();
        for payload in [&[1; 20][..], &[2; 900][..]] {
            let a = Ipv6::udp(s, c, &Udp::new(53, 5454, payload));
            let frame = from_server(&env, &a);
            r.redirect(
                "UDP reply",
                &frame,
                wan,
                &to_client(&env, &a),
                Counter::Fwd6Inbound,
                &[],
            );
            back.add(ip6_len(&frame));
        }
        let ct = r.conntrack6();
        assert_eq!(
            ct[&k].count,
            FlowCount { packets: 3, ..out },
            "original direction"
        );
        assert_eq!(
            ct[&k.reversed()].count,
            FlowCount { packets: 2, ..back },
            "reply direction"
        );

        let last = Ipv6::udp(c, s, &Udp::new(5454, 53, b"expiring")).hop_limit(1);
        r.pass(
            "hop limit 1",
            &from_client(&env, &last),
            lan,
            Counter::Pass6HopLimit,
        );
        let ct = r.conntrack6();
        assert_eq!(ct[&k].count, out, "a passed packet is not counted");
        assert_eq!(ct[&k.reversed()].count, back);
    });
}
