//! What the fast path drops (malformed) or passes to the kernel untouched
//! (TTL, fragments, options, other protocols, not configured, local
//! destinations, TCP without a flow).

use super::*;

/// Malformed frames are dropped (both sides) with the right counter.
/// (Frames shorter than 14 bytes cannot be run: `BPF_PROG_RUN` rejects
/// them.)
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn malformed_frames_are_dropped() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        for (side, ifindex) in [("LAN", r.lan), ("WAN", r.wan)] {
            let mk = |l4: L4| -> Vec<u8> {
                let ip = Ipv4::new(CLIENT, SERVER, l4);
                if ifindex == r.lan {
                    env.client_sends(&ip)
                } else {
                    env.server_sends(&ip)
                }
            };
            let udp = mk(Udp::new(40000, 53, b"payload").into());
            let tcp = mk(Tcp::new(40000, 80, TCP_SYN).payload(b"12345678").into());
            let icmp = mk(Icmp::echo_request(7, 1, b"").into());

            for len in ETH_HLEN..L4_OFF {
                r.drop_frame(
                    &format!("{side}: truncated to {len}"),
                    &udp[..len],
                    ifindex,
                    Counter::DropTruncated,
                );
            }
            let patched = |base: &[u8], f: &dyn Fn(&mut Vec<u8>)| {
                let mut v = base.to_vec();
                f(&mut v);
                fix_ipv4_checksum_any(&mut v);
                v
            };
            let set_total = |v: &mut Vec<u8>, t: usize| {
                v[IP_OFF + 2..IP_OFF + 4].copy_from_slice(&u16::try_from(t).unwrap().to_be_bytes());
            };
            let l3 = udp.len() - IP_OFF;
            let cases: Vec<(&str, Vec<u8>)> = vec![
                ("IHL 4", patched(&udp, &|v| v[IP_OFF] = 0x44)),
                ("IHL 0", patched(&udp, &|v| v[IP_OFF] = 0x40)),
                ("version 6", patched(&udp, &|v| v[IP_OFF] = 0x65)),
                ("version 0", patched(&udp, &|v| v[IP_OFF] = 0x05)),
                (
                    "total length beyond the frame",
                    patched(&udp, &|v| set_total(v, l3 + 1)),
                ),
                ("total length 1000", patched(&udp, &|v| set_total(v, 1000))),
                ("total length 19", patched(&udp, &|v| set_total(v, 19))),
                ("total length 0", patched(&udp, &|v| set_total(v, 0))),
                ("IHL 6 > total length 22", {
                    let mut v = udp[..IP_OFF + 20].to_vec();
                    v.extend_from_slice(&[1, 1, 1, 0]);
                    v[IP_OFF] = 0x46;
                    set_total(&mut v, 22);
                    fix_ipv4_checksum_any(&mut v);
                    v
                }),
                (
                    "TCP data offset 4",
                    patched(&tcp, &|v| v[L4_OFF + 12] = 0x40),
                ),
                (
                    "TCP data offset 0",
                    patched(&tcp, &|v| v[L4_OFF + 12] = 0x00),
                ),
                (
                    "TCP data offset 15 > segment",
                    patched(&tcp, &|v| v[L4_OFF + 12] = 0xf0),
                ),
                (
                    "TCP data offset 8 > segment of 28",
                    patched(&tcp, &|v| v[L4_OFF + 12] = 0x80),
                ),
                ("TCP header cut (19 bytes)", {
                    let mut v = tcp[..L4_OFF + 19].to_vec();
                    set_total(&mut v, 39);
                    fix_ipv4_checksum_any(&mut v);
                    v
                }),
                ("TCP header beyond total length (padding)", {
                    let mut v = tcp[..L4_OFF + 20].to_vec();
                    set_total(&mut v, 30);
                    fix_ipv4_checksum_any(&mut v);
                    v
                }),
                ("UDP header cut (7 bytes)", {
                    let mut v = udp[..L4_OFF + 7].to_vec();
                    set_total(&mut v, 27);
                    fix_ipv4_checksum_any(&mut v);
                    v
                }),
                (
                    "UDP header beyond total length",
                    patched(&udp, &|v| set_total(v, 24)),
                ),
                ("ICMP header cut (7 bytes)", {
                    let mut v = icmp[..L4_OFF + 7].to_vec();
                    set_total(&mut v, 27);
                    fix_ipv4_checksum_any(&mut v);
                    v
                }),
                (
                    "ICMP header beyond total length",
                    patched(&icmp, &|v| set_total(v, 24)),
                ),
            ];
            for (what, frame) in &cases {
                r.drop_frame(
                    &format!("{side}: {what}"),
                    frame,
                    ifindex,
                    Counter::DropMalformed,
                );
            }
        }
        r.assert_flows("nothing created", []);
    });
}

/// [`fix_ipv4_checksum`] that tolerates an IHL pointing past the frame.
fn fix_ipv4_checksum_any(v: &mut [u8]) {
    let ihl = usize::from(v[IP_OFF] & 0x0f) * 4;
    if ihl >= 20 && IP_OFF + ihl <= v.len() {
        fix_ipv4_checksum(v);
    }
}

/// TTL <= 1, fragments, IP options, non-IPv4 frames and protocols the fast
/// path does not handle: passed untouched, in the spec's order of checks,
/// without touching flows.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn pass_cases_ttl_fragments_options_protocols() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        // A flow, so that replies below would hit it if they got that far.
        let f = Flow::masq(tcp_key(CLIENT, 40000, SERVER, 80), 40000);
        let syn = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN));
        let run = r.redirect(
            "SYN out",
            &env.client_sends(&syn),
            lan,
            &env.to_server(&snat(&syn, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts = r.stamp(&f.orig, &run);
        let synack = Ipv4::new(SERVER, WAN, Tcp::new(80, 40000, TCP_SYN | TCP_ACK));
        let data_out = Ipv4::new(
            CLIENT,
            SERVER,
            Tcp::new(40000, 80, TCP_ACK).payload(b"data"),
        );

        for (side, ifindex, base) in [("LAN", lan, &data_out), ("WAN", wan, &synack)] {
            let frame = |ip: &Ipv4| {
                if ifindex == lan {
                    env.client_sends(ip)
                } else {
                    env.server_sends(ip)
                }
            };
            let with = |g: &dyn Fn(&mut Ipv4)| {
                let mut ip = base.clone();
                g(&mut ip);
                frame(&ip)
            };
            // TTL <= 1 of a flow from the WAN is answered
            // (`prog_run::time_exceeded`), and a flow's first fragment and
            // packets with options are carried (below).
            let mut cases: Vec<(&str, Vec<u8>, Counter)> = Vec::new();
            if ifindex == lan {
                cases.push(("TTL 1", with(&|ip| ip.ttl = 1), Counter::PassTtlExceeded));
                cases.push(("TTL 0", with(&|ip| ip.ttl = 0), Counter::PassTtlExceeded));
            }
            if ifindex == wan {
                // The SYN+ACK with options or as a first fragment.
                cases.push((
                    "MF, SYN+ACK",
                    with(&|ip| ip.frag = IP_MF),
                    Counter::PassFragment,
                ));
                cases.push((
                    "options, SYN+ACK",
                    with(&|ip| ip.options = vec![1, 1, 1, 0]),
                    Counter::PassIpOptions,
                ));
            }
            cases.extend(vec![
                ("offset 1", with(&|ip| ip.frag = 1), Counter::PassFragment),
                (
                    "offset 0x1fff",
                    with(&|ip| ip.frag = 0x1fff),
                    Counter::PassFragment,
                ),
                (
                    "MF + offset 0xb9",
                    with(&|ip| ip.frag = IP_MF | 0xb9),
                    Counter::PassFragment,
                ),
                (
                    "options + MF",
                    with(&|ip| {
                        ip.options = vec![1, 1, 1, 0];
                        ip.frag = IP_MF;
                    }),
                    Counter::PassIpOptions,
                ),
                (
                    "options + TTL 1",
                    with(&|ip| {
                        ip.options = vec![1, 1, 1, 0];
                        ip.ttl = 1;
                    }),
                    Counter::PassIpOptions,
                ),
                (
                    "fragment + TTL 1",
                    with(&|ip| {
                        ip.frag = 8;
                        ip.ttl = 1;
                    }),
                    Counter::PassTtlExceeded,
                ),
                (
                    "GRE",
                    frame(&Ipv4::new(
                        base.src,
                        base.dst,
                        L4::Raw {
                            proto: 47,
                            bytes: vec![0; 24],
                        },
                    )),
                    Counter::PassProtocol,
                ),
                (
                    "SCTP",
                    frame(&Ipv4::new(
                        base.src,
                        base.dst,
                        L4::Raw {
                            proto: 132,
                            bytes: vec![7; 32],
                        },
                    )),
                    Counter::PassProtocol,
                ),
                (
                    "ICMP timestamp",
                    frame(&Ipv4::new(
                        base.src,
                        base.dst,
                        Icmp::Other {
                            icmp_type: 13,
                            code: 0,
                            rest: [0, 1, 0, 1],
                            body: vec![0; 12],
                        },
                    )),
                    Counter::PassProtocol,
                ),
            ]);
            for (what, f, counter) in &cases {
                r.pass(&format!("{side}: {what}"), f, ifindex, *counter);
            }
            // A first fragment of the flow (the whole segment, MF set), and
            // its packets with options: translated and forwarded.
            // A segment without SYN, FIN or RST (those are the kernel's
            // in a fragment or with options: no state change there).
            let data_in = Ipv4::new(SERVER, WAN, Tcp::new(80, 40000, TCP_ACK).payload(b"data"));
            let carried_base = if ifindex == lan { &data_out } else { &data_in };
            let variant = |g: &dyn Fn(&mut Ipv4)| {
                let mut ip = carried_base.clone();
                g(&mut ip);
                ip
            };
            let carried = [
                ("MF", variant(&|ip| ip.frag = IP_MF), Counter::FwdFragment),
                (
                    "MF + DF",
                    variant(&|ip| ip.frag = IP_MF | IP_DF),
                    Counter::FwdFragment,
                ),
                (
                    "options (IHL 6)",
                    variant(&|ip| ip.options = vec![1, 1, 1, 0]),
                    Counter::FwdIpOptions,
                ),
                (
                    "options (IHL 15: a no-operation, a 39-byte record route)",
                    variant(&|ip| {
                        let mut rr = vec![1u8, 7, 39, 4];
                        rr.resize(40, 0);
                        ip.options = rr;
                    }),
                    Counter::FwdIpOptions,
                ),
            ];
            for (what, ip, counter) in carried {
                let want = if ifindex == lan {
                    env.to_server(&snat(&ip, 40000))
                } else {
                    env.to_client(&dnat(&ip, CLIENT, 40000))
                };
                r.redirect(
                    &format!("{side}: {what}"),
                    &frame(&ip),
                    ifindex,
                    &want,
                    counter,
                    &[],
                );
            }
            // IHL 4 with TTL 1: malformed wins.
            let mut bad = with(&|ip| ip.ttl = 1);
            bad[IP_OFF] = 0x44;
            r.drop_frame(
                &format!("{side}: IHL 4 + TTL 1"),
                &bad,
                ifindex,
                Counter::DropMalformed,
            );
            // Not IPv4.
            let ok = frame(base);
            // The IPv6 type goes to the IPv6 core (prog_run6): an IPv4
            // packet under it is a malformed IPv6 one.
            let mut v = ok.clone();
            v[ETHERTYPE_OFF..ETHERTYPE_OFF + 2].copy_from_slice(&[0x86, 0xdd]);
            r.drop_frame(
                &format!("{side}: IPv4 packet as IPv6"),
                &v,
                ifindex,
                Counter::DropMalformed,
            );
            r.drop_frame(
                &format!("{side}: IPv6 type, 14 bytes"),
                &v[..ETH_HLEN],
                ifindex,
                Counter::DropTruncated,
            );
            for (what, ethertype) in [("ARP", [0x08, 0x06]), ("VLAN", [0x81, 0x00])] {
                let mut v = ok.clone();
                v[ETHERTYPE_OFF..ETHERTYPE_OFF + 2].copy_from_slice(&ethertype);
                r.pass(
                    &format!("{side}: {what}"),
                    &v,
                    ifindex,
                    Counter::PassNotIpv4,
                );
                r.pass(
                    &format!("{side}: {what}, 14 bytes"),
                    &v[..ETH_HLEN],
                    ifindex,
                    Counter::PassNotIpv4,
                );
            }
        }
        // ICMP the LAN side does not translate.
        for (what, icmp) in [
            ("echo reply", Icmp::echo_reply(7, 1, b"")),
            (
                "redirect",
                Icmp::Other {
                    icmp_type: 5,
                    code: 1,
                    rest: WAN,
                    body: vec![0; 28],
                },
            ),
        ] {
            let ip = Ipv4::new(CLIENT, SERVER, icmp);
            r.pass(
                &format!("LAN: ICMP {what}"),
                &env.client_sends(&ip),
                lan,
                Counter::PassProtocol,
            );
        }
        let ip = Ipv4::new(
            SERVER,
            WAN,
            Icmp::Other {
                icmp_type: 5,
                code: 1,
                rest: WAN,
                body: vec![0; 28],
            },
        );
        r.pass(
            "WAN: ICMP redirect",
            &env.server_sends(&ip),
            wan,
            Counter::PassProtocol,
        );
        // The SYN+ACK with TTL 1 did not establish the flow.
        r.assert_flows(
            "flow untouched",
            f.entries(FlowState::TcpSynSent, 0, ts, ts),
        );
    });
}

/// Without CONFIG every valid IPv4 packet passes (IPv4 checks still
/// first, L4 checks after); with CONFIG, ingress on another interface
/// passes as not configured.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn not_configured_passes() {
    let env = ResolvedTopology::new(false);
    with_router(&env, None, |r| {
        let lan = r.lan;
        let udp = env.client_sends(&Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"x")));
        r.pass("unconfigured: UDP", &udp, lan, Counter::PassNotConfigured);
        let mut doff = env.client_sends(&Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN)));
        doff[L4_OFF + 12] = 0x40;
        r.pass(
            "unconfigured: TCP data offset 4",
            &doff,
            lan,
            Counter::PassNotConfigured,
        );
        let mut bad = udp.clone();
        bad[IP_OFF] = 0x44;
        r.drop_frame("unconfigured: IHL 4", &bad, lan, Counter::DropMalformed);
        let ttl1 = env.client_sends(&Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"x")).ttl(1));
        r.pass("unconfigured: TTL 1", &ttl1, lan, Counter::PassTtlExceeded);
        r.drop_frame(
            "unconfigured: truncated",
            &udp[..30],
            lan,
            Counter::DropTruncated,
        );
        r.assert_flows("nothing created", []);

        r.configure(&config(&env));
        // ifindex 1 = lo in the router namespace: neither LAN nor WAN.
        r.pass("ingress lo", &udp, 1, Counter::PassNotConfigured);
        let ip = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"x"));
        r.redirect(
            "configured: UDP",
            &udp,
            lan,
            &env.to_server(&snat(&ip, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
    });
}

/// Packets to the router's own addresses go to the kernel
/// (`PassFibNotForwarded`); TCP without a plain SYN and no flow gets
/// `PassNoFlow`; neither creates entries.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn local_destination_and_tcp_without_flow() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        let cases: Vec<(&str, Ipv4, Counter)> = vec![
            (
                "UDP to router LAN address",
                Ipv4::new(CLIENT, ROUTER_LAN, Udp::new(40000, 53, b"dns?")),
                Counter::PassFibNotForwarded,
            ),
            (
                "SYN to router LAN address",
                Ipv4::new(CLIENT, ROUTER_LAN, Tcp::new(40000, 22, TCP_SYN)),
                Counter::PassFibNotForwarded,
            ),
            (
                "echo to router LAN address",
                Ipv4::new(CLIENT, ROUTER_LAN, Icmp::echo_request(7, 1, b"")),
                Counter::PassFibNotForwarded,
            ),
            (
                "UDP to router WAN address",
                Ipv4::new(CLIENT, WAN, Udp::new(40000, 53, b"dns?")),
                Counter::PassFibNotForwarded,
            ),
            (
                "ACK, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_ACK)),
                Counter::PassNoFlow,
            ),
            (
                "SYN+ACK, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN | TCP_ACK)),
                Counter::PassNoFlow,
            ),
            (
                "RST, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_RST)),
                Counter::PassNoFlow,
            ),
            (
                "FIN+ACK, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_FIN | TCP_ACK)),
                Counter::PassNoFlow,
            ),
            (
                "SYN+RST, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN | TCP_RST)),
                Counter::PassNoFlow,
            ),
            (
                "SYN+FIN, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN | TCP_FIN)),
                Counter::PassNoFlow,
            ),
            (
                "no flags, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, 0)),
                Counter::PassNoFlow,
            ),
        ];
        for (what, ip, counter) in cases {
            r.pass(what, &env.client_sends(&ip), lan, counter);
        }
        r.assert_flows("nothing created", []);
    });
}

/// With a default route (a router's usual FIB), a frame to the router's
/// MAC whose destination is not unicast (RFC 1812 5.3.5: a router does not
/// forward a limited broadcast, nor multicast it does not route) or not an
/// address a packet may go to (0/8, 127/8, 240/4) is not forwarded out of
/// the default route (`bpf_fib_lookup` matches it like any address): it
/// goes to the kernel (`pass_fib_not_forwarded`) and opens no flow; so
/// does a LAN packet from a martian source (RFC 1812 5.3.7), which NAT
/// would otherwise translate like a LAN host's.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn non_unicast_destinations_and_martian_sources_do_not_follow_the_default_route() {
    let env = ResolvedTopology::new(false);
    let gw = std::net::Ipv4Addr::from(SERVER).to_string();
    env.t
        .exec_ok(Ns::Router, &["ip", "route", "add", "default", "via", &gw]);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        let cases: Vec<(&str, Ipv4, Counter)> = vec![
            (
                "UDP to multicast 224.0.0.251, router MAC",
                Ipv4::new(CLIENT, [224, 0, 0, 251], Udp::new(5353, 5353, b"mdns")),
                Counter::PassFibNotForwarded,
            ),
            (
                "UDP to multicast 239.255.255.250, router MAC",
                Ipv4::new(CLIENT, [239, 255, 255, 250], Udp::new(40000, 1900, b"ssdp")),
                Counter::PassFibNotForwarded,
            ),
            (
                "UDP to the limited broadcast, router MAC",
                Ipv4::new(CLIENT, [255, 255, 255, 255], Udp::new(68, 67, b"dhcp")),
                Counter::PassFibNotForwarded,
            ),
            (
                "UDP to class E 240.0.0.1",
                Ipv4::new(CLIENT, [240, 0, 0, 1], Udp::new(40000, 53, b"e")),
                Counter::PassFibNotForwarded,
            ),
            (
                "SYN to 127.0.0.1",
                Ipv4::new(CLIENT, [127, 0, 0, 1], Tcp::new(40000, 22, TCP_SYN)),
                Counter::PassFibNotForwarded,
            ),
            (
                "echo to 0.0.0.1",
                Ipv4::new(CLIENT, [0, 0, 0, 1], Icmp::echo_request(7, 1, b"")),
                Counter::PassFibNotForwarded,
            ),
            // Martian sources (RFC 1812 5.3.7) to a forwardable server:
            // not translated like a LAN host's.
            (
                "SYN from 127.0.0.1",
                Ipv4::new([127, 0, 0, 1], SERVER, Tcp::new(40000, 80, TCP_SYN)),
                Counter::PassFibNotForwarded,
            ),
            (
                "UDP from multicast 224.1.2.3",
                Ipv4::new([224, 1, 2, 3], SERVER, Udp::new(40000, 53, b"m")),
                Counter::PassFibNotForwarded,
            ),
            (
                "UDP from 0.0.0.5",
                Ipv4::new([0, 0, 0, 5], SERVER, Udp::new(40000, 53, b"z")),
                Counter::PassFibNotForwarded,
            ),
            (
                "echo from class E 240.0.0.9",
                Ipv4::new([240, 0, 0, 9], SERVER, Icmp::echo_request(8, 1, b"")),
                Counter::PassFibNotForwarded,
            ),
        ];
        for (what, ip, counter) in &cases {
            r.pass(what, &env.client_sends(ip), lan, *counter);
        }
        assert!(r.flows().is_empty(), "{:?}", r.flows());
        // A unicast destination beyond the default route is forwarded.
        let far = Ipv4::new(CLIENT, [198, 51, 100, 7], Udp::new(40000, 53, b"far"));
        r.redirect(
            "UDP to a host beyond the default route",
            &env.client_sends(&far),
            lan,
            &env.to_server(&snat(&far, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
    });
}
