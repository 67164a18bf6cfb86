//! IPv4 fragments through `BPF_PROG_RUN`: a UDP or ICMP echo flow's
//! fragments translated both ways (the first through the flow, the later
//! ones through the record the first left in `FRAGMENTS`), and the
//! fragments left to the kernel. Every expected fragment is cut from the
//! translated datagram built from scratch, so its bytes (the first
//! fragment's L4 checksum covers the whole datagram) say that the
//! reassembled datagram verifies.

use router_common::maps::{FRAGMENT_TIMEOUT_NS, FragmentKey, FragmentXlat};
use tests::frames::fragments;

use super::*;

/// Where the test datagrams are cut: 64 bytes of IP payload (the 8-byte
/// UDP or ICMP header and 56 of data) in the first fragment.
const CUT: usize = 64;

/// `n` bytes of data.
fn data(n: usize) -> Vec<u8> {
    (0..n).map(|i| u8::try_from(i % 251).unwrap()).collect()
}

/// `ip` with the identification `id`.
fn with_id(mut ip: Ipv4, id: u16) -> Ipv4 {
    ip.id = id;
    ip
}

/// Both fragments of `sent` (from the client when `from_lan`, else from
/// the server) redirected as the fragments of `want`, each counted
/// `fwd_fragment`; the runs.
fn fragments_redirected(
    r: &Router,
    env: &ResolvedTopology,
    what: &str,
    from_lan: bool,
    sent: &Ipv4,
    want: &Ipv4,
) -> Vec<ProgRun> {
    let ifindex = if from_lan { r.lan } else { r.wan };
    let to = |ip: &Ipv4| {
        if from_lan {
            env.to_server(ip)
        } else {
            env.to_client(ip)
        }
    };
    fragments(sent, CUT)
        .iter()
        .zip(&fragments(want, CUT))
        .zip(["first", "later"])
        .map(|((s, w), which)| {
            r.redirect(
                &format!("{what}: {which} fragment"),
                &env.sends(from_lan, s),
                ifindex,
                &to(w),
                Counter::FwdFragment,
                &[],
            )
        })
        .collect()
}

/// A UDP flow opened by a small datagram: the client's fragmented
/// datagram leaves on the flow's mapping (not the kernel's), the server's
/// fragmented answer reaches the client and marks the flow replied; a
/// later fragment whose first has not come goes to the kernel, and is
/// translated once it has; each first fragment counts as the flow's.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn udp_fragments_of_a_flow_are_translated_both_ways() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let wan = r.wan;
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"small"));
        let run = r.opens_out(&env, "small datagram out", &q, 40000);
        let ts = r.stamp(&f.orig, &run);

        let out = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, &data(120)));
        let runs = fragments_redirected(r, &env, "datagram out", true, &out, &snat(&out, 40000));
        let seen = r.seen(&f.orig, ts, &runs[0]);
        r.assert_flows(
            "after the fragments out",
            f.entries(FlowState::UdpUnreplied, 0, ts, seen),
        );

        let answer = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, &data(200)));
        let runs = fragments_redirected(
            r,
            &env,
            "answer in",
            false,
            &answer,
            &dnat(&answer, CLIENT, 40000),
        );
        let seen = r.seen(&f.orig, seen, &runs[0]);
        r.assert_flows(
            "a fragmented first reply marks the flow replied",
            f.entries(FlowState::UdpReplied, 0, ts, seen),
        );

        // Out of order: the later fragment of another answer before its
        // first is the kernel's (which cannot reassemble it without the
        // first, which XDP forwards: that datagram is lost); after the
        // first it is translated.
        let answer2 = with_id(
            Ipv4::new(SERVER, WAN, Udp::new(53, 40000, &data(100))),
            0x4321,
        );
        let [first2, later2] = fragments(&answer2, CUT);
        r.pass(
            "later fragment before its first",
            &env.server_sends(&later2),
            wan,
            Counter::PassFragment,
        );
        let runs = fragments_redirected(
            r,
            &env,
            "the same answer in order",
            false,
            &answer2,
            &dnat(&answer2, CLIENT, 40000),
        );
        let seen = r.seen(&f.orig, seen, &runs[0]);
        // A duplicate of the first fragment is translated again.
        let dnat2 = dnat(&answer2, CLIENT, 40000);
        r.redirect(
            "first fragment again",
            &env.server_sends(&first2),
            wan,
            &env.to_client(&fragments(&dnat2, CUT)[0]),
            Counter::FwdFragment,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &runs[0]);
        r.assert_flows("end", f.entries(FlowState::UdpReplied, 0, ts, seen));
        // Counted as the flow's: the small datagram and the first fragment
        // out, the three first fragments in (IP bytes).
        let first = (20 + CUT) as u64;
        let count = r.raw_entry(&f.orig).count;
        assert_eq!(
            (count.packets, count.bytes),
            (2, q.bytes().len() as u64 + first),
            "outbound counts"
        );
        let count = r.raw_entry(&f.reply()).count;
        assert_eq!(
            (count.packets, count.bytes),
            (3, 3 * first),
            "inbound counts"
        );
    });
}

/// An ICMP echo flow opened by a small ping: a fragmented echo request
/// leaves with the flow's identifier and its fragmented reply comes back
/// with the client's.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn icmp_echo_fragments_of_a_flow_are_translated_both_ways() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let f = Flow::masq(icmp_key(CLIENT, SERVER, 40020), 40020);
        let ping = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(40020, 1, b"small"));
        let run = r.opens_out(&env, "small ping out", &ping, 40020);
        let ts = r.stamp(&f.orig, &run);
        let big = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(40020, 2, &data(300)));
        fragments_redirected(r, &env, "big ping out", true, &big, &snat(&big, 40020));
        let pong = Ipv4::new(SERVER, WAN, Icmp::echo_reply(40020, 2, &data(300)));
        let runs = fragments_redirected(
            r,
            &env,
            "big pong in",
            false,
            &pong,
            &dnat(&pong, CLIENT, 40020),
        );
        let seen = r.seen(&f.orig, ts, &runs[0]);
        r.assert_flows("end", f.entries(FlowState::Icmp, 0, ts, seen));
    });
}

/// Fragments the data path leaves to the kernel: of no flow (the kernel's
/// slow path admits them; no flow opened, no record left), of an
/// offloaded flow (the kernel's conntrack reassembles and translates
/// them), a later fragment whose record is older than the reassembly
/// timeout or that arrives on the other side; one within the timeout is
/// translated. From the WAN to a LAN host, a fragment of no flow is
/// standalone mode's unsolicited traffic.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn fragments_the_data_path_does_not_carry_go_to_the_kernel() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let out = Ipv4::new(CLIENT, SERVER, Udp::new(40010, 53, &data(120)));
        for (i, frag) in fragments(&out, CUT).iter().enumerate() {
            r.pass(
                &format!("fragment {i} of no flow"),
                &env.client_sends(frag),
                lan,
                Counter::PassFragment,
            );
        }
        r.assert_flows("no flow opened", []);
        // The kernel's NAT opens the flow, and keeps its later datagrams
        // (RFC 4787 REQ-11): its first fragment left a marker.
        assert!(
            r.kernel_flow(&udp_key(CLIENT, 40010, SERVER, 53)).is_some(),
            "no marker for the fragmented flow"
        );
        // Not so for a forged source beyond the LAN (the kernel's
        // reverse-path filter has the fragment).
        let forged_src = [10, 99, 0, 1];
        let forged = Ipv4::new(forged_src, SERVER, Udp::new(40010, 53, &data(120)));
        r.pass(
            "first fragment from a forged source",
            &env.client_sends(&fragments(&forged, CUT)[0]),
            lan,
            Counter::PassFragment,
        );
        assert_eq!(
            r.kernel_flow(&udp_key(forged_src, 40010, SERVER, 53)),
            None,
            "a forged source left a marker"
        );

        put_offloaded_udp_flow(r, 40011, 61011);
        let small = Ipv4::new(CLIENT, SERVER, Udp::new(40011, 53, b"small"));
        r.redirect(
            "the offloaded flow carries a small datagram",
            &env.client_sends(&small),
            lan,
            &env.to_server(&snat(&small, 61011)),
            Counter::FwdOutbound,
            &[],
        );
        let out = Ipv4::new(CLIENT, SERVER, Udp::new(40011, 53, &data(120)));
        r.pass(
            "first fragment of an offloaded flow",
            &env.client_sends(&fragments(&out, CUT)[0]),
            lan,
            Counter::PassFragment,
        );

        // A record of an answer's first fragment, written by hand.
        let answer = with_id(
            Ipv4::new(SERVER, WAN, Udp::new(53, 40000, &data(120))),
            0x5555,
        );
        let later = &fragments(&answer, CUT)[1];
        let key = FragmentKey {
            src_addr: SERVER,
            dst_addr: WAN,
            id: 0x5555u16.to_be_bytes(),
            proto: IPPROTO_UDP,
            from_lan: 0,
        };
        let record = |first_ns| FragmentXlat {
            new_src_addr: SERVER,
            new_dst_addr: CLIENT,
            first_ns,
        };
        r.put_fragment(key, record(now_ns() - FRAGMENT_TIMEOUT_NS - 2 * NS_PER_SEC));
        r.pass(
            "later fragment past the reassembly timeout",
            &env.server_sends(later),
            wan,
            Counter::PassFragment,
        );
        r.put_fragment(key, record(now_ns() - FRAGMENT_TIMEOUT_NS + 5 * NS_PER_SEC));
        let mut want = later.clone();
        want.dst = CLIENT;
        want.ttl -= 1;
        r.redirect(
            "later fragment within the reassembly timeout",
            &env.server_sends(later),
            wan,
            &env.to_client(&want),
            Counter::FwdFragment,
            &[],
        );
        r.pass(
            "the same fragment from the LAN",
            &env.client_sends(later),
            lan,
            Counter::PassFragment,
        );
        let to_lan_host = with_id(
            Ipv4::new(SERVER, CLIENT, Udp::new(53, 40012, &data(120))),
            0x6666,
        );
        r.drop_frame(
            "fragment of no flow to a LAN host",
            &env.server_sends(&fragments(&to_lan_host, CUT)[0]),
            wan,
            Counter::DropUnsolicited,
        );
    });
}

/// A TCP flow's segment fragmented with the TCP header's fixed 20 bytes
/// (and its checksum) in the first fragment is translated both fragments
/// through, its state unchanged; one whose first fragment holds only 8 or
/// 16 bytes of the header (RFC 1858's tiny fragment) is the kernel's,
/// first and later, and so is a fragmented FIN.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn tcp_fragments_with_the_whole_header_are_translated() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let wan = r.wan;
        r.masq_out(
            &env,
            "SYN out",
            Tcp::new(40001, 80, TCP_SYN),
            &[Counter::FlowNewMasquerade],
        );
        let state = |r: &Router| r.get(&tcp_key(CLIENT, 40001, SERVER, 80)).state;
        let before = state(r);
        let seg = Ipv4::new(
            SERVER,
            WAN,
            Tcp::new(80, 40001, TCP_ACK).payload(&data(100)),
        );
        fragments_redirected(
            r,
            &env,
            "segment in",
            false,
            &seg,
            &dnat(&seg, CLIENT, 40001),
        );
        assert_eq!(state(r), before, "a fragment changes no TCP state");
        // Cut inside the header: after the ports (8), before the checksum
        // (16: total length 36).
        for (id, cut) in [(0x2468, 8), (0x2469, 16)] {
            for (i, frag) in fragments(&with_id(seg.clone(), id), cut).iter().enumerate() {
                r.pass(
                    &format!("fragment {i} of a segment cut after {cut} bytes"),
                    &env.server_sends(frag),
                    wan,
                    Counter::PassFragment,
                );
            }
        }
        // A data offset below the fixed 20 bytes: malformed, as unfragmented.
        for doff in [0u8, 4] {
            let mut first = env.server_sends(&fragments(&with_id(seg.clone(), 0x246a), CUT)[0]);
            first[frames::L4_OFF + 12] = doff << 4;
            r.drop_frame(
                &format!("a first fragment with data offset {doff}"),
                &first,
                wan,
                Counter::DropMalformed,
            );
        }
        // SYN, FIN or RST: the kernel's, whose state tracking sees it.
        let fin = Ipv4::new(
            SERVER,
            WAN,
            Tcp::new(80, 40001, TCP_FIN | TCP_ACK).payload(&data(100)),
        );
        r.pass(
            "the first fragment of a FIN",
            &env.server_sends(&fragments(&fin, CUT)[0]),
            wan,
            Counter::PassFragment,
        );
    });
}

/// The server's answer to CLIENT's UDP flow 40000 -> 53 (identification
/// 0x7777) and the same translated to CLIENT; its first fragment carried,
/// which leaves the datagram's record.
fn answer_first_fragment_carried(r: &Router, env: &ResolvedTopology) -> (Ipv4, Ipv4) {
    let answer = with_id(
        Ipv4::new(SERVER, WAN, Udp::new(53, 40000, &data(120))),
        0x7777,
    );
    let to_client = dnat(&answer, CLIENT, 40000);
    r.redirect(
        "the answer's first fragment",
        &env.server_sends(&fragments(&answer, CUT)[0]),
        r.wan,
        &env.to_client(&fragments(&to_client, CUT)[0]),
        Counter::FwdFragment,
        &[],
    );
    (answer, to_client)
}

/// A first fragment under the identification of a live record with
/// another translation (another flow's ports: a spoof, or a sender's
/// identification reused within the record's life) takes nothing over: the
/// record goes, and the kernel gets it and both datagrams' later
/// fragments. The same flow reusing the identification makes a record
/// again.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_first_fragment_of_another_flow_does_not_take_a_live_record_over() {
    let env = ResolvedTopology::new(true);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        for (host, port) in [(CLIENT, 40000), (CLIENT2, 40001)] {
            let q = Ipv4::new(host, SERVER, Udp::new(port, 53, b"query"));
            let to = env.to_server(&snat(&q, port));
            let sent = if host == CLIENT {
                env.client_sends(&q)
            } else {
                env.client2_sends(&q)
            };
            r.redirect(
                "query out",
                &sent,
                lan,
                &to,
                Counter::FwdOutbound,
                &[Counter::FlowNewMasquerade],
            );
        }
        let (answer, to_client) = answer_first_fragment_carried(r, &env);
        let spoof = with_id(
            Ipv4::new(SERVER, WAN, Udp::new(53, 40001, &data(120))),
            0x7777,
        );
        r.pass(
            "another flow's first fragment, same identification",
            &env.server_sends(&fragments(&spoof, CUT)[0]),
            wan,
            Counter::PassFragment,
        );
        // The record is gone: neither datagram's later fragment can be
        // told apart, both go to the kernel.
        for (what, ip) in [("the answer's", &answer), ("the other's", &spoof)] {
            r.pass(
                &format!("{what} later fragment"),
                &env.server_sends(&fragments(ip, CUT)[1]),
                wan,
                Counter::PassFragment,
            );
        }
        fragments_redirected(
            r,
            &env,
            "the answer again, the same flow reusing the identification",
            false,
            &answer,
            &to_client,
        );
    });
}

/// A first fragment this path does not carry (of no flow: here one to
/// a port nothing listens on, the router's own) under a live record's key
/// retires the record: the kernel holds that first fragment, so its
/// datagram's later fragments go there too, not to the earlier
/// datagram's host.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_uncarried_first_fragment_retires_a_live_record() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"query"));
        r.redirect(
            "query out",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        answer_first_fragment_carried(r, &env);
        let other = with_id(
            Ipv4::new(SERVER, WAN, Udp::new(53, 40099, &data(120))),
            0x7777,
        );
        r.pass(
            "a first fragment of no flow, same identification",
            &env.server_sends(&fragments(&other, CUT)[0]),
            wan,
            Counter::PassFragment,
        );
        r.pass(
            "its later fragment",
            &env.server_sends(&fragments(&other, CUT)[1]),
            wan,
            Counter::PassFragment,
        );
    });
}

/// An outbound first fragment refreshes its flow's NAT mapping as an
/// unfragmented packet does (RFC 4787 REQ-6): a flow whose outbound
/// datagrams are all fragmented keeps its port.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_outbound_first_fragment_refreshes_the_flows_mapping() {
    use router_common::mapping::{UDP_MAPPING_SECS, refresh_tick};
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"query"));
        r.opens_out(&env, "out: new flow", &q, 40000);
        // The mapping about to expire, the flow's last outbound refresh
        // 2 s ago.
        let soon = now_ns() + 5 * NS_PER_SEC;
        let mut m = r.mapping(IPPROTO_UDP, 40000).expect("the flow's mapping");
        m.expires_ns = soon;
        r.put_mapping(IPPROTO_UDP, 40000, m);
        let mut e = r.raw_entry(&f.orig);
        e.out_tick = refresh_tick(now_ns() - 2 * NS_PER_SEC);
        r.put(f.orig, e);
        let out = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, &data(120)));
        let runs = fragments_redirected(r, &env, "datagram out", true, &out, &snat(&out, 40000));
        let secs = u64::from(UDP_MAPPING_SECS) * NS_PER_SEC;
        let e = r
            .mapping(IPPROTO_UDP, 40000)
            .expect("the mapping")
            .expires_ns;
        assert!(
            (runs[0].t0 + secs..=runs[0].t1 + secs).contains(&e),
            "mapping expires {} s from the first fragment, want {UDP_MAPPING_SECS}",
            (i128::from(e) - i128::from(runs[0].t1)) / 1_000_000_000
        );
    });
}
