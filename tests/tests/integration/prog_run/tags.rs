//! Priority-tagged frames (802.1Q or 802.1ad tags of VLAN id 0) through
//! `BPF_PROG_RUN`: the tags come off as the kernel takes them off, and the
//! packet inside is carried, judged or passed as its untagged frame is; a
//! VLAN's frame and a stack of tags no sender makes keep their verdicts.

use super::*;

/// One priority tag (802.1Q, VLAN id 0, priority 5).
const PRIORITY: &[(u16, u16)] = &[(0x8100, 0xa000)];
/// An 802.1ad and an 802.1Q tag, both of VLAN id 0.
const PRIORITY_QINQ: &[(u16, u16)] = &[(0x88a8, 0), (0x8100, 0x2000)];

/// A UDP flow whose packets come priority-tagged, standalone mode: the
/// server's tagged reply is translated to the client and leaves untagged,
/// byte for byte the untagged reply's frame; the client's datagram behind
/// two tags leaves with the flow's mapping (RFC 4787 REQ-1: one mapping
/// per session), counted as the flow's. A tagged datagram of no flow to a
/// LAN host is dropped as the untagged one (`drop_unsolicited`).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn priority_tagged_packets_of_a_flow_stay_in_the_flow() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"query"));
        let run = r.opens_out(&env, "UDP out", &q, 40000);
        let ts = r.stamp(&f.orig, &run);

        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"tagged answer"));
        let tagged = frames::with_tags(&env.server_sends(&a), PRIORITY);
        let run = r.check(
            "priority-tagged reply",
            &tagged,
            wan,
            XDP_REDIRECT,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        frames::verify_checksums(&run.out);
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows(
            "after the tagged reply",
            f.entries(FlowState::UdpReplied, 0, ts, seen),
        );

        let q2 = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"tagged query"));
        let run = r.check(
            "802.1ad + 802.1Q priority-tagged datagram out",
            &frames::with_tags(&env.client_sends(&q2), PRIORITY_QINQ),
            lan,
            XDP_REDIRECT,
            &env.to_server(&snat(&q2, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        frames::verify_checksums(&run.out);
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after the tagged datagram out",
            f.entries(FlowState::UdpReplied, 0, ts, seen),
        );

        let to_host = Ipv4::new(SERVER, CLIENT, Udp::new(53, 40001, b"unsolicited"));
        let tagged = frames::with_tags(&env.server_sends(&to_host), PRIORITY);
        r.check(
            "priority-tagged datagram to a LAN host",
            &tagged,
            wan,
            XDP_DROP,
            &env.server_sends(&to_host),
            Counter::DropUnsolicited,
            &[],
        );
    });
}

/// What the tags stay on: a VLAN's frame (id 5: its device's, or dropped
/// by the kernel) is passed as it came (`pass_not_ipv4`), and so is a
/// frame cut short inside a tag; five priority tags, which no sender
/// stacks, are dropped in standalone mode (`drop_malformed`: the kernel
/// would forward what is inside, with no firewall behind the data path)
/// and left to the kernel and its firewall in offload mode.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn vlan_frames_and_too_many_tags_keep_their_tags() {
    let env = ResolvedTopology::new(false);
    let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"answer"));
    let vlan = frames::with_tags(&env.server_sends(&a), &[(0x8100, 0), (0x8100, 5)]);
    let five = frames::with_tags(&env.server_sends(&a), &[(0x8100, 0); 5]);
    let short = frames::with_tags(&env.server_sends(&a), PRIORITY)[..ETHERTYPE_OFF + 3].to_vec();
    with_router(&env, Some(config(&env)), |r| {
        let wan = r.wan;
        for (what, frame) in [
            ("VLAN 5 behind a priority tag", &vlan),
            ("cut short", &short),
        ] {
            r.check(what, frame, wan, XDP_PASS, frame, Counter::PassNotIpv4, &[]);
        }
        r.check(
            "five priority tags, standalone",
            &five,
            wan,
            XDP_DROP,
            &five,
            Counter::DropMalformed,
            &[],
        );
        let mut offload = config(&env);
        offload.admit = router_common::maps::Admit::Kernel as u8;
        r.configure(&offload);
        r.check(
            "five priority tags, offload",
            &five,
            wan,
            XDP_PASS,
            &five,
            Counter::PassNotIpv4,
            &[],
        );
    });
}
