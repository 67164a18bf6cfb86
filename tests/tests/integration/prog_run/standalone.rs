//! Standalone mode's verdicts: the first packet of a LAN flow towards an
//! unresolved next hop is translated and passed (never a LAN source to
//! the kernel's WAN side), and WAN packets of no flow addressed to a LAN
//! host are dropped (`drop_unsolicited`), while those for the router's
//! own addresses still go to its kernel; a LAN packet whose source the LAN
//! does not route opens nothing (`drop_spoofed_source`). Offload mode
//! keeps passing.

use super::*;

/// A TCP SYN towards a WAN host without a neighbour entry: the flow is
/// created, the SYN leaves XDP translated (source `WAN:port`, checksums
/// fixed, TTL untouched: the kernel decrements it when it forwards) and
/// passed; the next segment of the flow, still without neighbour, gets the
/// same translation.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn first_packet_without_neighbour_is_passed_translated() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        let f = Flow::masq(tcp_key(CLIENT, 40100, WAN_NOBODY, 443), 40100);
        let syn = Ipv4::new(
            CLIENT,
            WAN_NOBODY,
            Tcp::new(40100, 443, TCP_SYN).options(&MSS),
        );
        let mut want = snat(&syn, 40100);
        want.ttl = syn.ttl;
        let input = env.client_sends(&syn);
        let expect = env.client_sends(&want);
        // The exact bytes, independent of the builder: source address
        // (IPv4 bytes 12..16 after the 14-byte Ethernet header) is WAN,
        // TTL (byte 22) unchanged.
        assert_eq!(expect[26..30], WAN);
        assert_eq!(expect[22], input[22]);
        let run = r.check(
            "first SYN, no neighbour",
            &input,
            lan,
            XDP_PASS,
            &expect,
            Counter::PassNoNeighbour,
            &[Counter::FlowNewMasquerade],
        );
        frames::verify_checksums(&run.out);
        let ts = r.stamp(&f.orig, &run);
        r.assert_flows("flow recorded", f.entries(FlowState::TcpSynSent, 0, ts, ts));

        // A retransmitted SYN: a hit, the same mapping, still passed.
        let run = r.check(
            "retransmitted SYN, no neighbour",
            &input,
            lan,
            XDP_PASS,
            &expect,
            Counter::PassNoNeighbour,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows("same flow", f.entries(FlowState::TcpSynSent, 0, ts, seen));

        // UDP and ICMP echo the same way.
        let u = Ipv4::new(CLIENT, WAN_NOBODY, Udp::new(40101, 53, b"first datagram"));
        let mut want = snat(&u, 40101);
        want.ttl = u.ttl;
        r.check(
            "first datagram, no neighbour",
            &env.client_sends(&u),
            lan,
            XDP_PASS,
            &env.client_sends(&want),
            Counter::PassNoNeighbour,
            &[Counter::FlowNewMasquerade],
        );
        let p = Ipv4::new(CLIENT, WAN_NOBODY, Icmp::echo_request(0x4242, 1, b"ping"));
        let mut want = snat(&p, 0x4242);
        want.ttl = p.ttl;
        r.check(
            "first echo request, no neighbour",
            &env.client_sends(&p),
            lan,
            XDP_PASS,
            &env.client_sends(&want),
            Counter::PassNoNeighbour,
            &[Counter::FlowNewMasquerade],
        );
    });
}

/// WAN packets of no known flow: addressed to a LAN host (the FIB would
/// forward them out of `lan0`) they are dropped and counted, whatever
/// they are; addressed to the router itself they are the kernel's as
/// before. In offload mode the kernel's firewall decides: passed.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn unsolicited_packets_to_lan_hosts_are_dropped() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let wan = r.wan;
        // A known flow, so that an error quoting another one is unknown.
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"q"));
        r.redirect(
            "flow out",
            &env.client_sends(&q),
            r.lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let flows = r.flows();
        let mut fragment = Ipv4::new(SERVER, CLIENT, Udp::new(53, 40000, b"frag"));
        fragment.frag = IP_MF;
        let mut options = Ipv4::new(SERVER, CLIENT, Udp::new(53, 40000, b"opts"));
        options.options = vec![1, 1, 1, 0];
        let quoted = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 9999, b"?")).ttl(63);
        let to_lan: Vec<(&str, Ipv4)> = vec![
            (
                "UDP",
                Ipv4::new(SERVER, CLIENT, Udp::new(53, 40000, b"knock")),
            ),
            (
                "TCP SYN",
                Ipv4::new(SERVER, CLIENT, Tcp::new(5555, 22, TCP_SYN)),
            ),
            (
                "TCP ACK (no SYN)",
                Ipv4::new(SERVER, CLIENT, Tcp::new(5555, 22, TCP_ACK)),
            ),
            (
                "echo request",
                Ipv4::new(SERVER, CLIENT, Icmp::echo_request(7, 1, b"")),
            ),
            (
                "ICMP error quoting no known flow",
                Ipv4::new(
                    SERVER,
                    CLIENT,
                    Icmp::error(ICMP_DEST_UNREACH, 3, &quoted.bytes()),
                ),
            ),
            (
                "GRE",
                Ipv4::new(
                    SERVER,
                    CLIENT,
                    L4::Raw {
                        proto: 47,
                        bytes: vec![0; 8],
                    },
                ),
            ),
            ("fragment", fragment),
            ("IP options", options),
            (
                "UDP to a LAN address without neighbour",
                Ipv4::new(SERVER, LAN_NOBODY, Udp::new(53, 40000, b"knock")),
            ),
        ];
        for (what, ip) in &to_lan {
            r.drop_frame(
                &format!("{what} to a LAN host"),
                &env.server_sends(ip),
                wan,
                Counter::DropUnsolicited,
            );
        }
        let to_router: Vec<(&str, Ipv4, Counter)> = vec![
            (
                "UDP to the WAN address",
                Ipv4::new(SERVER, WAN, Udp::new(53, 40001, b"knock")),
                Counter::PassUnsolicited,
            ),
            (
                "UDP to the router's LAN address",
                Ipv4::new(SERVER, ROUTER_LAN, Udp::new(53, 40001, b"knock")),
                Counter::PassUnsolicited,
            ),
            (
                "echo request to the router's LAN address",
                Ipv4::new(SERVER, ROUTER_LAN, Icmp::echo_request(7, 1, b"")),
                Counter::PassProtocol,
            ),
        ];
        for (what, ip, counter) in &to_router {
            r.pass(what, &env.server_sends(ip), wan, *counter);
        }
        assert_eq!(r.flows(), flows, "nothing created");

        // Offload mode: the kernel's firewall decides; passed.
        let mut offload = config(&env);
        offload.admit = router_common::maps::Admit::Kernel as u8;
        r.configure(&offload);
        r.pass(
            "offload: UDP to a LAN host",
            &env.server_sends(&to_lan[0].1),
            wan,
            Counter::PassNotOffloaded,
        );
        r.pass(
            "offload: echo request to a LAN host",
            &env.server_sends(&to_lan[3].1),
            wan,
            Counter::PassProtocol,
        );
    });
}

/// A LAN packet that would open a flow from a source the FIB does not
/// route back out of the LAN (BCP 38, RFC 3704 strict reverse path) is
/// dropped and opens nothing: another network's address, a WAN host's,
/// the router's own LAN and WAN addresses, the LAN's broadcast address.
/// An unused address of the LAN's own prefix opens its flow.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn lan_packets_from_sources_the_lan_does_not_route_open_nothing() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        for (what, src) in [
            ("another network's", [10, 9, 9, 9]),
            ("a WAN host's", WAN_NOBODY),
            ("the router's LAN address", ROUTER_LAN),
            ("the router's WAN address", WAN),
            ("the LAN's broadcast", [192, 168, 50, 255]),
        ] {
            for l4 in [
                L4::from(Udp::new(40000, 53, b"query")),
                L4::from(Tcp::new(40000, 80, TCP_SYN)),
                L4::from(Icmp::echo_request(40000, 1, b"ping")),
            ] {
                let ip = Ipv4::new(src, SERVER, l4);
                r.drop_frame(
                    &format!("{what} source"),
                    &env.client_sends(&ip),
                    lan,
                    Counter::DropSpoofedSource,
                );
            }
        }
        r.assert_flows("nothing opened", []);
        let q = Ipv4::new(LAN_NOBODY, SERVER, Udp::new(40000, 53, b"query"));
        r.redirect(
            "an unused address of the LAN",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
    });
}

/// A LAN packet with the router's WAN address as source that the data
/// path would pass untranslated (no flow: a TCP RST, UDP with IP options,
/// a fragment, GRE, an ICMP timestamp) is dropped (`drop_spoofed_source`):
/// attach's `accept_local` would let the kernel forward it, and the slow
/// path's NAT leaves that address alone, so it would leave as the router's
/// own packet, injected into another host's mapping. The same packets from
/// a LAN host's address go to the kernel as before; offload mode passes.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn lan_packets_with_the_wan_address_as_source_do_not_leave() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        let packets = |src: [u8; 4]| -> Vec<(&'static str, Ipv4, Counter)> {
            let mut options = Ipv4::new(src, SERVER, Udp::new(40000, 53, b"inject"));
            options.options = vec![1, 1, 1, 0];
            let mut fragment = Ipv4::new(src, SERVER, Udp::new(40000, 53, b"inject"));
            fragment.frag = IP_MF;
            vec![
                (
                    "a TCP RST",
                    Ipv4::new(src, SERVER, Tcp::new(40000, 80, TCP_RST)),
                    Counter::PassNoFlow,
                ),
                ("UDP with IP options", options, Counter::PassIpOptions),
                ("a UDP fragment", fragment, Counter::PassFragment),
                (
                    "GRE",
                    Ipv4::new(
                        src,
                        SERVER,
                        L4::Raw {
                            proto: 47,
                            bytes: vec![0; 8],
                        },
                    ),
                    Counter::PassProtocol,
                ),
            ]
        };
        for (what, ip, _) in packets(WAN) {
            r.drop_frame(
                &format!("{what} from the WAN address"),
                &env.client_sends(&ip),
                lan,
                Counter::DropSpoofedSource,
            );
        }
        for (what, ip, counter) in packets(CLIENT) {
            r.pass(
                &format!("{what} from a LAN host"),
                &env.client_sends(&ip),
                lan,
                counter,
            );
        }
        r.assert_flows("nothing opened", []);
        let mut offload = config(&env);
        offload.admit = router_common::maps::Admit::Kernel as u8;
        r.configure(&offload);
        let (what, ip, _) = packets(WAN).swap_remove(0);
        r.pass(
            &format!("offload: {what} from the WAN address"),
            &env.client_sends(&ip),
            lan,
            Counter::PassNotOffloaded,
        );
    });
}

/// While the WAN has no IPv4 address (the daemon wrote 0.0.0.0 into the
/// configuration when it lost it), nothing opens a flow: a LAN packet that
/// would is passed as it came (`pass_no_wan_addr`; standalone mode's
/// slow-path table drops what the kernel would send out of the WAN),
/// never translated to 0.0.0.0; a WAN packet to
/// the address the router had, or to 0.0.0.0 on a forwarded port, is the
/// kernel's (`pass_unsolicited`), never taken for the router's own; and a
/// LAN host's DHCP discover (source 0.0.0.0) is not taken for a forged
/// router address: the kernel gets it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn without_a_wan_address_nothing_opens_a_flow() {
    let env = ResolvedTopology::new(false);
    let mut none = config(&env);
    none.wan_addr = [0; 4];
    with_router(&env, Some(none), |r| {
        r.forward(IPPROTO_UDP, 5353, CLIENT, 53);
        let lan = r.lan;
        let discover = Ipv4::new([0; 4], [255; 4], Udp::new(68, 67, b"discover"));
        r.pass(
            "a DHCP discover",
            &Frame::new(tests::frames::BROADCAST_MAC, env.client_mac, discover).bytes(),
            lan,
            Counter::PassNotForUs,
        );
        for (what, l4) in [
            ("UDP", L4::from(Udp::new(40000, 53, b"query"))),
            ("a TCP SYN", L4::from(Tcp::new(40000, 80, TCP_SYN))),
            (
                "an echo request",
                L4::from(Icmp::echo_request(40000, 1, b"ping")),
            ),
        ] {
            r.pass(
                &format!("{what} from the LAN"),
                &env.client_sends(&Ipv4::new(CLIENT, SERVER, l4)),
                lan,
                Counter::PassNoWanAddr,
            );
        }
        let wan = r.wan;
        r.pass(
            "UDP from the WAN to the address the router had",
            &env.server_sends(&Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"answer"))),
            wan,
            Counter::PassUnsolicited,
        );
        r.pass(
            "UDP from the WAN to 0.0.0.0, a forwarded port",
            &env.server_sends(&Ipv4::new(SERVER, [0; 4], Udp::new(40000, 5353, b"in"))),
            wan,
            Counter::PassUnsolicited,
        );
        r.assert_flows("nothing opened", []);
    });
}

/// Frames with priority tags (VLAN id 0, which the kernel strips and
/// takes the packet as untagged) are judged as untagged ones, their tags
/// taken off (`tagged.rs`): from the WAN to a LAN host dropped, one tag or
/// 802.1ad + 802.1Q, with any priority, up to four; to the WAN address or
/// a broadcast as their untagged frames are (same verdict, counters and
/// output); from the LAN, the WAN address as source dropped
/// (`drop_spoofed_source`). Left as they are: more than four such tags
/// (dropped whatever they carry), a tag with a VLAN id (also behind a
/// priority tag: another interface's, or dropped), one cut short in its
/// tag; in offload mode more than four are passed.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn priority_tagged_frames_from_the_wan_are_judged_as_untagged() {
    use tests::frames::with_tags as tagged;
    const Q: u16 = 0x8100;
    const AD: u16 = 0x88a8;
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let knock = Ipv4::new(SERVER, CLIENT, Udp::new(53, 40000, b"knock"));
        let syn = Ipv4::new(SERVER, CLIENT, Tcp::new(5555, 22, TCP_SYN));
        let to_router = Ipv4::new(SERVER, WAN, Udp::new(53, 40001, b"knock"));
        for (what, ip) in [("UDP", &knock), ("TCP SYN", &syn)] {
            for (tags, how) in [
                (&[(Q, 0)][..], "a priority tag"),
                (&[(Q, 0xe000)][..], "a priority tag, priority 7"),
                (&[(AD, 0), (Q, 0)][..], "802.1ad + 802.1Q priority tags"),
                (&[(Q, 0); 4][..], "four priority tags"),
            ] {
                r.check(
                    &format!("{what} to a LAN host behind {how}"),
                    &tagged(&env.server_sends(ip), tags),
                    wan,
                    XDP_DROP,
                    &env.server_sends(ip),
                    Counter::DropUnsolicited,
                    &[],
                );
            }
        }
        r.drop_frame(
            "five priority tags",
            &tagged(&env.server_sends(&to_router), &[(Q, 0); 5]),
            wan,
            Counter::DropMalformed,
        );
        // As their untagged frames: the same verdict, counts and output.
        let broadcast = Frame::new(
            tests::frames::BROADCAST_MAC,
            env.server_mac,
            Ipv4::new(SERVER, [255; 4], Udp::new(67, 68, b"offer")),
        )
        .bytes();
        for (what, untagged) in [
            (
                "to the WAN address behind a priority tag",
                env.server_sends(&to_router),
            ),
            (
                "a DHCP offer to the broadcast address behind a priority tag",
                broadcast,
            ),
        ] {
            let want = r.test_run(&untagged, wan);
            let got = r.test_run(&tagged(&untagged, &[(Q, 0)]), wan);
            assert_eq!(
                (got.verdict, &got.out, &got.delta),
                (want.verdict, &want.out, &want.delta),
                "{what}"
            );
            assert_eq!(got.verdict, XDP_PASS, "{what}");
        }
        for (what, frame) in [
            (
                "to a LAN host in VLAN 5",
                tagged(&env.server_sends(&knock), &[(Q, 5)]),
            ),
            (
                "to a LAN host in VLAN 5 behind a priority tag",
                tagged(&env.server_sends(&knock), &[(AD, 0), (Q, 5)]),
            ),
            (
                "cut short in its second tag",
                tagged(&env.server_sends(&knock), &[(Q, 0), (Q, 0)])[..16].to_vec(),
            ),
        ] {
            r.pass(what, &frame, wan, Counter::PassNotIpv4);
        }
        // The LAN's source check: the WAN address as source, which the
        // kernel would forward as the router's own packet.
        let forged = Ipv4::new(WAN, SERVER, Udp::new(40000, 53, b"q"));
        for tags in [&[(Q, 0)][..], &[(AD, 0), (Q, 0)][..]] {
            r.check(
                "LAN: a priority-tagged packet from the WAN address",
                &tagged(&env.client_sends(&forged), tags),
                lan,
                XDP_DROP,
                &env.client_sends(&forged),
                Counter::DropSpoofedSource,
                &[],
            );
        }
        r.assert_flows("nothing opened", []);

        // Offload mode: the kernel's firewall decides; passed, the tags
        // taken off (and more than four left to it as they are).
        let mut offload = config(&env);
        offload.admit = router_common::maps::Admit::Kernel as u8;
        r.configure(&offload);
        let run = r.test_run(&tagged(&env.server_sends(&knock), &[(Q, 0)]), wan);
        assert_eq!(
            (run.verdict, run.out),
            (XDP_PASS, env.server_sends(&knock)),
            "offload: to a LAN host behind a priority tag"
        );
        r.pass(
            "offload: five priority tags",
            &tagged(&env.server_sends(&knock), &[(Q, 0); 5]),
            wan,
            Counter::PassNotIpv4,
        );
    });
}
