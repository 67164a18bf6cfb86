//! NAT behaviour of standalone mode (RFC 4787 / 5382): endpoint-independent
//! mapping (also after a collision), each filtering setting, hairpinning,
//! mapping expiry.

use router_common::{
    mapping::{UDP_MAPPING_SECS, refresh_tick, remote_tag},
    maps::{Endpoint, Filtering, Mapping},
};

use super::*;

/// A remote host that no flow has talked to.
const OTHER: [u8; 4] = [198, 51, 100, 7];

fn with_filtering(env: &ResolvedTopology, f: Filtering) -> Config {
    Config {
        filtering: f as u8,
        ..config(env)
    }
}

fn endpoint(addr: [u8; 4], port: u16, proto: u8) -> Endpoint {
    Endpoint {
        addr,
        port,
        proto,
        pad: 0,
    }
}

/// The internal endpoint of mapping `m`, without the tag of the flow that
/// set its expiry (kept in `pad`).
fn owner(m: Mapping) -> Endpoint {
    Endpoint {
        pad: 0,
        ..m.internal
    }
}

/// `ip` hairpinned by the router: source `WAN:sport`, destination
/// `addr:dport`, TTL - 1.
fn hairpinned(ip: &Ipv4, sport: u16, addr: [u8; 4], dport: u16) -> Ipv4 {
    let mut o = ip.clone();
    o.src = WAN;
    o.dst = addr;
    o.ttl -= 1;
    set_ports(&mut o.l4, Some(sport), Some(dport));
    o
}

/// One internal endpoint keeps its external port for every destination,
/// also when its first choice collided (with another host's mapping, and
/// with a live mapping written into the map beforehand).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn same_endpoint_keeps_its_external_port_for_every_destination() {
    let env = ResolvedTopology::new(true);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        let q1 = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"client 1"));
        r.redirect(
            "client 1 takes 40000",
            &env.client_sends(&q1),
            lan,
            &env.to_server(&snat(&q1, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let k2 = udp_key(CLIENT2, 40000, SERVER, 53);
        let (p2, collisions) = probe(&k2, PORT_MIN, PORT_MAX, &[40000], &[]).unwrap();
        let mut events = vec![Counter::FlowNewMasquerade];
        events.extend(std::iter::repeat_n(Counter::PortCollision, collisions));
        let q2 = Ipv4::new(CLIENT2, SERVER, Udp::new(40000, 53, b"client 2"));
        r.redirect(
            "client 2 collides",
            &env.client2_sends(&q2),
            lan,
            &env.to_server(&snat(&q2, p2)),
            Counter::FwdOutbound,
            &events,
        );
        for dport in [54, 123, 40000] {
            let q = Ipv4::new(CLIENT2, SERVER, Udp::new(40000, dport, b"elsewhere"));
            r.redirect(
                &format!("client 2 to port {dport}: its mapping {p2}, no probe"),
                &env.client2_sends(&q),
                lan,
                &env.to_server(&snat(&q, p2)),
                Counter::FwdOutbound,
                &[Counter::FlowNewMasquerade],
            );
        }
        assert_eq!(
            r.mapping(IPPROTO_UDP, p2).map(owner),
            Some(endpoint(CLIENT2, 40000, IPPROTO_UDP))
        );

        // A forced collision: a live mapping of another endpoint on the
        // port client 1's 41000 would keep.
        let squatter = endpoint(LAN_NOBODY, 41000, IPPROTO_UDP);
        r.put_mapping(
            IPPROTO_UDP,
            41000,
            Mapping {
                internal: squatter,
                expires_ns: now_ns() + 600 * NS_PER_SEC,
            },
        );
        let k3 = udp_key(CLIENT, 41000, SERVER, 53);
        let (p3, c3) = probe(&k3, PORT_MIN, PORT_MAX, &[41000], &[]).unwrap();
        assert!(c3 >= 1);
        let mut events = vec![Counter::FlowNewMasquerade];
        events.extend(std::iter::repeat_n(Counter::PortCollision, c3));
        let q3 = Ipv4::new(CLIENT, SERVER, Udp::new(41000, 53, b"forced"));
        r.redirect(
            "client 1's 41000 collides with the written mapping",
            &env.client_sends(&q3),
            lan,
            &env.to_server(&snat(&q3, p3)),
            Counter::FwdOutbound,
            &events,
        );
        let q4 = Ipv4::new(CLIENT, SERVER, Udp::new(41000, 443, b"again"));
        r.redirect(
            "client 1's 41000 elsewhere: the same port",
            &env.client_sends(&q4),
            lan,
            &env.to_server(&snat(&q4, p3)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        assert_eq!(
            r.mapping(IPPROTO_UDP, 41000).map(owner),
            Some(squatter),
            "the other endpoint's mapping is untouched"
        );
        // TCP has mappings of its own: 40000 is free there.
        let s = Ipv4::new(CLIENT2, SERVER, Tcp::new(40000, 80, TCP_SYN));
        r.redirect(
            "client 2 TCP keeps its port",
            &env.client2_sends(&s),
            lan,
            &env.to_server(&snat(&s, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
    });
}

/// What each filtering setting lets in to a mapping that sent to
/// `SERVER:53`: from the same address's other port, from another address.
fn filtering_admits(f: Filtering, same_address: bool, other_address: bool) {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(with_filtering(&env, f)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"out"));
        r.redirect(
            &format!("{f:?}: out"),
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        for (what, src, sport, admitted) in [
            ("same address, other port", SERVER, 9999, same_address),
            ("other address", OTHER, 53, other_address),
        ] {
            let a = Ipv4::new(src, WAN, Udp::new(sport, 40000, b"in"));
            let what = format!("{f:?}: {what}");
            if admitted {
                r.redirect(
                    &what,
                    &env.server_sends(&a),
                    wan,
                    &env.to_client(&dnat(&a, CLIENT, 40000)),
                    Counter::FwdInbound,
                    &[Counter::FlowNewInboundMapping],
                );
                if src != SERVER {
                    // No route to that address in this topology.
                    continue;
                }
                // The flow it opened carries the client's answer back.
                let b = Ipv4::new(CLIENT, src, Udp::new(40000, sport, b"answer"));
                r.redirect(
                    &format!("{what}: answer"),
                    &env.client_sends(&b),
                    lan,
                    &env.to_server(&snat(&b, 40000)),
                    Counter::FwdOutbound,
                    &[],
                );
            } else {
                r.pass(&what, &env.server_sends(&a), wan, Counter::PassUnsolicited);
            }
        }
        // No mapping on that port: nothing in any setting.
        let n = Ipv4::new(OTHER, WAN, Udp::new(53, 40001, b"no mapping"));
        r.pass(
            &format!("{f:?}: no mapping"),
            &env.server_sends(&n),
            wan,
            Counter::PassUnsolicited,
        );
    });
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn endpoint_independent_filtering_admits_any_remote() {
    filtering_admits(Filtering::EndpointIndependent, true, true);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn address_dependent_filtering_admits_only_addresses_sent_to() {
    filtering_admits(Filtering::AddressDependent, true, false);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn address_port_dependent_filtering_admits_only_replies() {
    filtering_admits(Filtering::AddressPortDependent, false, false);
}

/// Endpoint-independent filtering also opens TCP flows with a SYN (RFC
/// 5382 REQ-3 allows it), never with a mid-stream segment.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn endpoint_independent_filtering_opens_tcp_with_a_syn_only() {
    let env = ResolvedTopology::new(false);
    with_router(
        &env,
        Some(with_filtering(&env, Filtering::EndpointIndependent)),
        |r| {
            let (lan, wan) = (r.lan, r.wan);
            let s = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN));
            r.redirect(
                "out",
                &env.client_sends(&s),
                lan,
                &env.to_server(&snat(&s, 40000)),
                Counter::FwdOutbound,
                &[Counter::FlowNewMasquerade],
            );
            let ack = Ipv4::new(OTHER, WAN, Tcp::new(5555, 40000, TCP_ACK));
            r.pass(
                "ACK",
                &env.server_sends(&ack),
                wan,
                Counter::PassUnsolicited,
            );
            let syn = Ipv4::new(OTHER, WAN, Tcp::new(5555, 40000, TCP_SYN));
            r.redirect(
                "SYN",
                &env.server_sends(&syn),
                wan,
                &env.to_client(&dnat(&syn, CLIENT, 40000)),
                Counter::FwdInbound,
                &[Counter::FlowNewInboundMapping],
            );
        },
    );
}

/// A LAN host reaches another's mapping and a port forward through the
/// WAN address: both translations (source the sender's own mapping,
/// destination the LAN endpoint), checksums verified from scratch, both
/// directions forwarded by XDP. With address-and-port-dependent
/// filtering a mapping is not reachable this way, a port forward is.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn hairpinning_to_a_mapping_and_a_port_forward() {
    let env = ResolvedTopology::new(true);
    with_router(
        &env,
        Some(with_filtering(&env, Filtering::EndpointIndependent)),
        |r| {
            let lan = r.lan;
            let q = Ipv4::new(CLIENT2, SERVER, Udp::new(6000, 3478, b"client 2 out"));
            r.redirect(
                "client 2's mapping",
                &env.client2_sends(&q),
                lan,
                &env.to_server(&snat(&q, 6000)),
                Counter::FwdOutbound,
                &[Counter::FlowNewMasquerade],
            );
            let h = Ipv4::new(CLIENT, WAN, Udp::new(5000, 6000, b"hairpin"));
            r.redirect(
                "client 1 to WAN:6000",
                &env.client_sends(&h),
                lan,
                &env.to_client2(&hairpinned(&h, 5000, CLIENT2, 6000)),
                Counter::FwdOutbound,
                &[Counter::FlowNewHairpin],
            );
            let back = Ipv4::new(CLIENT2, WAN, Udp::new(6000, 5000, b"back"));
            r.redirect(
                "client 2 answers to WAN:5000",
                &env.client2_sends(&back),
                lan,
                &env.to_client(&hairpinned(&back, 6000, CLIENT, 5000)),
                Counter::FwdOutbound,
                &[],
            );
            assert_eq!(
                r.mapping(IPPROTO_UDP, 5000).map(owner),
                Some(endpoint(CLIENT, 5000, IPPROTO_UDP)),
                "client 1 hairpinned from its own mapping"
            );
            r.forward(IPPROTO_TCP, 8080, CLIENT2, 80);
            let f = Ipv4::new(CLIENT, WAN, Tcp::new(5001, 8080, TCP_SYN));
            r.redirect(
                "client 1 to the port forward WAN:8080",
                &env.client_sends(&f),
                lan,
                &env.to_client2(&hairpinned(&f, 5001, CLIENT2, 80)),
                Counter::FwdOutbound,
                &[Counter::FlowNewHairpin],
            );
            // A plain ACK (not judged against the window, which these
            // made-up sequence numbers would not fit).
            let sa = Ipv4::new(CLIENT2, WAN, Tcp::new(80, 5001, TCP_ACK));
            r.redirect(
                "ACK back",
                &env.client2_sends(&sa),
                lan,
                &env.to_client(&hairpinned(&sa, 8080, CLIENT, 5001)),
                Counter::FwdOutbound,
                &[],
            );
        },
    );
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        let q = Ipv4::new(CLIENT2, SERVER, Udp::new(6000, 3478, b"client 2 out"));
        r.redirect(
            "client 2's mapping",
            &env.client2_sends(&q),
            lan,
            &env.to_server(&snat(&q, 6000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let h = Ipv4::new(CLIENT, WAN, Udp::new(5000, 6000, b"hairpin"));
        r.pass(
            "address-and-port-dependent: for the router itself",
            &env.client_sends(&h),
            lan,
            Counter::PassFibNotForwarded,
        );
    });
}

/// A mapping expires with the state of the flow that set its expiry
/// (here a TCP SYN unanswered past `tcp-syn-sent`): its port then goes to
/// the next endpoint that asks for it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn expired_mapping_is_taken_over() {
    let env = ResolvedTopology::new(true);
    let cfg = Config {
        timeouts: Timeouts {
            tcp_syn_sent: 1,
            ..Timeouts::default()
        },
        ..config(&env)
    };
    with_router(&env, Some(cfg), |r| {
        let lan = r.lan;
        let s1 = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN));
        r.redirect(
            "client 1",
            &env.client_sends(&s1),
            lan,
            &env.to_server(&snat(&s1, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let m = r.mapping(IPPROTO_TCP, 40000).expect("a mapping");
        assert_eq!(owner(m), endpoint(CLIENT, 40000, IPPROTO_TCP));
        let left = m.expires_ns.saturating_sub(now_ns());
        assert!(left <= NS_PER_SEC, "expires with SYN_SENT's 1 s: {left} ns");
        std::thread::sleep(std::time::Duration::from_millis(2100));
        let s2 = Ipv4::new(CLIENT2, SERVER, Tcp::new(40000, 81, TCP_SYN));
        r.redirect(
            "client 2 takes the expired mapping's port",
            &env.client2_sends(&s2),
            lan,
            &env.to_server(&snat(&s2, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade, Counter::MappingReclaimed],
        );
        assert_eq!(
            r.mapping(IPPROTO_TCP, 40000).map(owner),
            Some(endpoint(CLIENT2, 40000, IPPROTO_TCP))
        );
    });
}

/// Writes the entries `keys` back as if their last refresh, of
/// `last_seen_ns` and of the mapping by outbound packets (`out_tick`), had
/// been `d` ns earlier: the next packet is due to refresh both.
fn age(r: &mut Router, keys: &[FlowKey], d: u64) {
    let tick = refresh_tick(now_ns() - d);
    for k in keys {
        let mut e = r.raw_entry(k);
        e.last_seen_ns -= d;
        e.out_tick = tick;
        r.put(*k, e);
    }
}

/// The expiry of the mapping of `port`, asserted to be `internal`'s.
fn expiry(r: &Router, proto: u8, port: u16, internal: Endpoint) -> u64 {
    let m = r.mapping(proto, port).expect("a mapping");
    assert_eq!(owner(m), internal, "the mapping's endpoint");
    m.expires_ns
}

/// The client's UDP flow from port 40000 to the server's 3478, opened by
/// its first datagram (masqueraded, its port kept): the flow and that
/// datagram as the client sends it.
fn open_client_udp_40000(env: &ResolvedTopology, r: &Router) -> (Flow, Ipv4) {
    let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 3478, b"client"));
    r.redirect(
        "out: new flow",
        &env.client_sends(&q),
        r.lan,
        &env.to_server(&snat(&q, 40000)),
        Counter::FwdOutbound,
        &[Counter::FlowNewMasquerade],
    );
    (Flow::masq(udp_key(CLIENT, 40000, SERVER, 3478), 40000), q)
}

/// RFC 4787 REQ-6 (outbound refresh, required) and REQ-5: in a UDP flow
/// that the WAN side keeps alive (a game server's snapshots, a
/// receive-only RTP leg), the WAN's packets refresh both entries'
/// `last_seen_ns`, and the client's few packets still refresh the mapping,
/// so it does not expire under the live flow. Inbound packets do not
/// refresh the mapping.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn outbound_packets_refresh_the_mapping_of_a_flow_the_wan_keeps_alive() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let client = endpoint(CLIENT, 40000, IPPROTO_UDP);
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 3478), 40000);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 3478, b"client"));
        let a = Ipv4::new(SERVER, WAN, Udp::new(3478, 40000, b"snapshot"));
        let out = |r: &Router, what: &str| {
            r.redirect(
                what,
                &env.client_sends(&q),
                lan,
                &env.to_server(&snat(&q, 40000)),
                Counter::FwdOutbound,
                &[],
            )
        };
        let inb = |r: &Router, what: &str| {
            r.redirect(
                what,
                &env.server_sends(&a),
                wan,
                &env.to_client(&dnat(&a, CLIENT, 40000)),
                Counter::FwdInbound,
                &[],
            )
        };
        r.redirect(
            "out: new flow",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        inb(r, "first snapshot");
        // The mapping about to expire, the flow last refreshed 2 s ago.
        let soon = now_ns() + 5 * NS_PER_SEC;
        r.put_mapping(
            IPPROTO_UDP,
            40000,
            Mapping {
                internal: client,
                expires_ns: soon,
            },
        );
        age(r, &[f.orig, f.reply()], 2 * NS_PER_SEC);
        let run = inb(r, "snapshot: refreshes the flow");
        let t = r.get(&f.orig).last_seen_ns;
        assert!(
            (run.t0..=run.t1).contains(&t),
            "the WAN's packet refreshed the LAN entry too: {t} vs {}..={}",
            run.t0,
            run.t1
        );
        assert_eq!(
            expiry(r, IPPROTO_UDP, 40000, client),
            soon,
            "an inbound packet does not refresh the mapping (REQ-6)"
        );
        // A later tick of the coarse clock than the WAN's refresh.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let run = out(r, "client: refreshes the mapping");
        let secs = u64::from(UDP_MAPPING_SECS) * NS_PER_SEC;
        let e = expiry(r, IPPROTO_UDP, 40000, client);
        assert!(
            (run.t0 + secs..=run.t1 + secs).contains(&e),
            "mapping expires {} s from the outbound packet, want {UDP_MAPPING_SECS}",
            (i128::from(e) - i128::from(run.t1)) / 1_000_000_000
        );
    });
}

/// RFC 5508 REQ-4: an ICMP error about a masqueraded UDP flow is
/// translated while the flow's NAT mapping lives, as the flow's data is
/// (`mapping::keeps_udp_flow_alive`): past the flow's own timeout, with its
/// mapping still held (by the endpoint's other flows, or its 300 s), a
/// Port Unreachable and a Time Exceeded quoting its datagram reach the LAN
/// host, and so does a datagram of the server's; and the LAN host's Port
/// Unreachable about a datagram it got leaves translated (RFC 5508 REQ-5).
/// Once the mapping is gone too, an error about the flow is the router's
/// (unsolicited) from the WAN, the kernel's from the LAN.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_error_about_a_udp_flow_past_its_timeout_is_translated_while_its_mapping_lives() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let client = endpoint(CLIENT, 40000, IPPROTO_UDP);
        let (f, q) = open_client_udp_40000(&env, r);
        // Last seen 10 minutes ago: past every UDP timeout.
        age(r, &[f.orig, f.reply()], 600 * NS_PER_SEC);
        let held = |r: &mut Router, expires_ns| {
            r.put_mapping(
                IPPROTO_UDP,
                40000,
                Mapping {
                    internal: client,
                    expires_ns,
                },
            );
        };
        held(r, now_ns() + 60 * NS_PER_SEC);
        // What the server got (TTL 63 after the router) and quotes back,
        // and the client's own datagram as the client must see it quoted.
        let quoted_wan = snat(&q, 40000);
        let quoted_lan = Ipv4 {
            src: CLIENT,
            ..quoted_wan.clone()
        };
        let err = |t: u8, c: u8, quoted: &Ipv4, dst: [u8; 4]| {
            let mut ip = Ipv4::new(SERVER, dst, Icmp::error(t, c, &quoted.bytes()));
            if dst == CLIENT {
                ip.ttl -= 1;
            }
            ip
        };
        for (t, c) in [(ICMP_DEST_UNREACH, 3), (ICMP_TIME_EXCEEDED, 0)] {
            r.redirect(
                &format!("ICMP {t}/{c} about the expired flow, its mapping held"),
                &env.server_sends(&err(t, c, &quoted_wan, WAN)),
                wan,
                &env.to_client(&err(t, c, &quoted_lan, CLIENT)),
                Counter::FwdInbound,
                &[Counter::IcmpErrorTranslated],
            );
        }
        let a = Ipv4::new(SERVER, WAN, Udp::new(3478, 40000, b"late"));
        r.redirect(
            "the server's datagram, its mapping held",
            &env.server_sends(&a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        // From the LAN: the client's error about the server's datagram
        // (as the client got it), the flow aged again (the datagram
        // refreshed it).
        age(r, &[f.orig, f.reply()], 600 * NS_PER_SEC);
        let got = Ipv4::new(SERVER, CLIENT, Udp::new(3478, 40000, b"late")).ttl(63);
        let sent = Ipv4::new(SERVER, WAN, Udp::new(3478, 40000, b"late")).ttl(63);
        let from_client = Ipv4::new(
            CLIENT,
            SERVER,
            Icmp::error(ICMP_DEST_UNREACH, 3, &got.bytes()),
        );
        r.redirect(
            "the client's ICMP 3/3 about the expired flow, its mapping held",
            &env.client_sends(&from_client),
            lan,
            &env.to_server(
                &Ipv4::new(
                    WAN,
                    SERVER,
                    Icmp::error(ICMP_DEST_UNREACH, 3, &sent.bytes()),
                )
                .ttl(63),
            ),
            Counter::FwdOutbound,
            &[Counter::IcmpErrorTranslated],
        );
        // The mapping gone as well.
        held(r, now_ns() - NS_PER_SEC);
        r.pass(
            "ICMP 3/3 about the expired flow, its mapping gone",
            &env.server_sends(&err(ICMP_DEST_UNREACH, 3, &quoted_wan, WAN)),
            wan,
            Counter::PassUnsolicited,
        );
        r.pass(
            "the client's ICMP 3/3 about the expired flow, its mapping gone",
            &env.client_sends(&from_client),
            lan,
            Counter::PassNoFlow,
        );
    });
}

/// `cfg` with TCP's closed state lasting 1 s, so a freed mapping's port
/// comes free within the test.
fn closing_in_1s(cfg: Config) -> Config {
    Config {
        timeouts: Timeouts {
            tcp_closed: 1,
            ..cfg.timeouts
        },
        ..cfg
    }
}

/// A TCP segment from `sport` to `dport` with `flags`, `seq` and `ack`.
fn seg(sport: u16, dport: u16, flags: u8, seq: u32, ack: u32) -> Tcp {
    let mut t = Tcp::new(sport, dport, flags);
    t.seq = seq;
    t.ack = ack;
    t.window = 64240;
    t
}

const C_ISN: u32 = 0x1000_0000;
const S_ISN: u32 = 0x7fff_0000;
/// A second connection's, and a remote's, initial sequence numbers.
const Y_ISN: u32 = 0x2000_0000;
const O_ISN: u32 = 0x3000_0000;
const DAY_NS: u64 = 86400 * NS_PER_SEC;

/// The internal endpoint of the connections from `CLIENT:41000`.
fn client_41000() -> Endpoint {
    endpoint(CLIENT, 41000, IPPROTO_TCP)
}

/// Asserts that the mapping of WAN port 41000 (TCP) lives days.
fn lives_days(r: &Router, what: &str) {
    assert!(
        expiry(r, IPPROTO_TCP, 41000, client_41000()) > now_ns() + DAY_NS,
        "{what}"
    );
}

/// Asserts that the mapping of WAN port 41000 (TCP) expires 1 s (the
/// closed state's timeout of [`closing_in_1s`]) after `run`.
fn expires_1s_after(r: &Router, run: &ProgRun) {
    let e = expiry(r, IPPROTO_TCP, 41000, client_41000());
    assert!(
        (run.t0 + NS_PER_SEC..=run.t1 + NS_PER_SEC).contains(&e),
        "the mapping expires with CLOSED's 1 s: {} ns after the segment",
        i128::from(e) - i128::from(run.t1)
    );
}

/// `CLIENT:41000 -> SERVER:80` established (SYN, SYN+ACK, ACK) and, 2 s
/// later, refreshed by an outbound ACK: its mapping (WAN port 41000)
/// lives days.
fn establish_41000(env: &ResolvedTopology, r: &mut Router) {
    let f = Flow::masq(tcp_key(CLIENT, 41000, SERVER, 80), 41000);
    let syn = seg(41000, 80, TCP_SYN, C_ISN, 0);
    r.masq_out(env, "X: SYN", syn, &[Counter::FlowNewMasquerade]);
    let syn_ack = seg(80, 41000, TCP_SYN | TCP_ACK, S_ISN, C_ISN + 1);
    r.masq_in(env, "X: SYN+ACK", syn_ack, &[]);
    let ack = || seg(41000, 80, TCP_ACK, C_ISN + 1, S_ISN + 1);
    r.masq_out(env, "X: ACK", ack(), &[]);
    age(r, &[f.orig, f.reply()], 2 * NS_PER_SEC);
    r.masq_out(env, "X: ACK, 2 s later", ack(), &[]);
    lives_days(r, "established: the mapping lives days");
}

/// The server's RST of the connection [`establish_41000`] made.
fn server_rst() -> Tcp {
    seg(80, 41000, TCP_RST | TCP_ACK, S_ISN + 1, C_ISN + 1)
}

/// RFC 5382 REQ-5 (and no port leak): a TCP mapping follows its
/// connection. Established, it lives the established timeout; a RST from
/// the server (no LAN packet after it) lowers it to the closed state's
/// timeout, after which another LAN host gets the port.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_wan_rst_frees_the_mapping_of_an_established_connection() {
    let env = ResolvedTopology::new(true);
    with_router(&env, Some(closing_in_1s(config(&env))), |r| {
        establish_41000(&env, r);
        let run = r.masq_in(&env, "RST from the server", server_rst(), &[]);
        let f = tcp_key(CLIENT, 41000, SERVER, 80);
        assert_eq!(r.get(&f).state, FlowState::TcpClosed as u8);
        expires_1s_after(r, &run);
        // Past CLOSED's timeout: another LAN host's SYN from the same
        // port keeps it (no collision).
        std::thread::sleep(std::time::Duration::from_millis(2100));
        let s2 = Ipv4::new(CLIENT2, SERVER, Tcp::new(41000, 81, TCP_SYN));
        r.redirect(
            "client 2 gets the closed connection's port",
            &env.client2_sends(&s2),
            r.lan,
            &env.to_server(&snat(&s2, 41000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade, Counter::MappingReclaimed],
        );
    });
}

/// A mapping written by an older build, before the setter's tag existed
/// (`pad` 0, kept across a live replace): its setter is unknown, so an
/// established connection's close lowers it (else the port of an idle
/// connection that closes after the upgrade would be held for days).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn the_close_of_a_connection_lowers_a_mapping_of_an_older_build() {
    let env = ResolvedTopology::new(true);
    with_router(&env, Some(closing_in_1s(config(&env))), |r| {
        establish_41000(&env, r);
        let m = r.mapping(IPPROTO_TCP, 41000).expect("a mapping");
        let internal = owner(m);
        r.put_mapping(IPPROTO_TCP, 41000, Mapping { internal, ..m });
        let run = r.masq_in(&env, "RST from the server", server_rst(), &[]);
        expires_1s_after(r, &run);
    });
}

/// Only the connection that set a TCP mapping's expiry lowers it: a
/// sibling connection of the same internal endpoint (another server) that
/// a server resets in `SYN_SENT` does not cut the mapping of an idle
/// established one (which would then expire under it: a new flow of the
/// endpoint would get another port, inbound flows would no longer be let
/// in).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_siblings_reset_leaves_the_mapping_of_an_idle_established_connection() {
    let env = ResolvedTopology::new(true);
    with_router(&env, Some(closing_in_1s(config(&env))), |r| {
        establish_41000(&env, r);
        let syn = seg(41000, 81, TCP_SYN, Y_ISN, 0);
        r.masq_out(
            &env,
            "Y: SYN from the same port to port 81",
            syn,
            &[Counter::FlowNewMasquerade],
        );
        let rst = seg(81, 41000, TCP_RST | TCP_ACK, 0, Y_ISN + 1);
        r.masq_in(&env, "Y: RST from the server", rst, &[]);
        let y = tcp_key(CLIENT, 41000, SERVER, 81);
        assert_eq!(r.get(&y).state, FlowState::TcpClosed as u8);
        lives_days(
            r,
            "the sibling's reset did not cut the established connection's mapping",
        );
    });
}

/// Two established connections of one internal endpoint: the one whose
/// refresh came last (X's outbound packet after Y was established) is the
/// mapping's setter, and the other's close (Y reset by its server) does not
/// lower the mapping. (Had Y refreshed it last, Y's close would lower it
/// until X's next outbound packet: the mapping records one setter.)
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_sibling_that_is_not_the_setter_closes_without_cutting_the_mapping() {
    let env = ResolvedTopology::new(true);
    with_router(&env, Some(closing_in_1s(config(&env))), |r| {
        establish_41000(&env, r);
        let x = Flow::masq(tcp_key(CLIENT, 41000, SERVER, 80), 41000);
        let y = tcp_key(CLIENT, 41000, SERVER, 81);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let syn = seg(41000, 81, TCP_SYN, Y_ISN, 0);
        r.masq_out(&env, "Y: SYN", syn, &[Counter::FlowNewMasquerade]);
        let syn_ack = seg(81, 41000, TCP_SYN | TCP_ACK, S_ISN, Y_ISN + 1);
        r.masq_in(&env, "Y: SYN+ACK (Y extends the mapping)", syn_ack, &[]);
        assert_eq!(r.get(&y).state, FlowState::TcpEstablished as u8);
        let by_y = expiry(r, IPPROTO_TCP, 41000, client_41000());
        std::thread::sleep(std::time::Duration::from_millis(50));
        age(r, &[x.orig, x.reply()], 2 * NS_PER_SEC);
        let ack = seg(41000, 80, TCP_ACK, C_ISN + 1, S_ISN + 1);
        r.masq_out(&env, "X: ACK (X extends it again)", ack, &[]);
        assert!(expiry(r, IPPROTO_TCP, 41000, client_41000()) > by_y);
        let rst = seg(81, 41000, TCP_RST | TCP_ACK, S_ISN + 1, Y_ISN + 1);
        r.masq_in(&env, "Y: RST from its server", rst, &[]);
        assert_eq!(r.get(&y).state, FlowState::TcpClosed as u8);
        lives_days(r, "Y's close did not cut the mapping X set");
    });
}

/// A connection refused at its SYN frees the mapping it created: the
/// SYN's claim made it the mapping's setter, and a RST that closes a flow
/// still in `SYN_SENT` lowers a mapping no longer than `SYN_SENT`'s own.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_refused_syn_frees_the_mapping_it_created() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(closing_in_1s(config(&env))), |r| {
        let syn = seg(41000, 80, TCP_SYN, C_ISN, 0);
        r.masq_out(&env, "SYN", syn, &[Counter::FlowNewMasquerade]);
        assert!(expiry(r, IPPROTO_TCP, 41000, client_41000()) > now_ns() + 60 * NS_PER_SEC);
        let rst = seg(80, 41000, TCP_RST | TCP_ACK, 0, C_ISN + 1);
        let run = r.masq_in(&env, "RST from the server", rst, &[]);
        expires_1s_after(r, &run);
    });
}

/// A remote port whose tag is the setter's of [`establish_41000`] (the
/// worst case: a remote trying ports finds one within 256).
fn colliding_port() -> u16 {
    let setter = remote_tag(SERVER, 80);
    (1024..=u16::MAX)
        .find(|&p| remote_tag(SERVER, p) == setter)
        .expect("a port")
}

/// With endpoint-independent filtering, after [`establish_41000`]: a SYN
/// to WAN:41000 from `SERVER:rport` (the only remote address the test
/// router routes), which opens an inbound flow to the mapping. Then
/// `rest`.
fn after_a_syn_from(rport: u16, rest: impl FnOnce(&ResolvedTopology, &mut Router) + Send) {
    let env = ResolvedTopology::new(true);
    let cfg = closing_in_1s(with_filtering(&env, Filtering::EndpointIndependent));
    with_router(&env, Some(cfg), |r| {
        establish_41000(&env, r);
        let syn = seg(rport, 41000, TCP_SYN, O_ISN, 0);
        r.masq_in(
            &env,
            "a SYN from another remote endpoint to WAN:41000",
            syn,
            &[Counter::FlowNewInboundMapping],
        );
        rest(&env, r);
    });
}

/// The state of the inbound flow from `SERVER:rport` to WAN:41000.
fn inbound_state(r: &Router, rport: u16) -> u8 {
    r.get(&tcp_key(SERVER, rport, WAN, 41000)).state
}

/// A remote's unsolicited SYN to a mapped port, which the LAN host answers
/// with a RST (its port is a connected socket, not a listener), and the
/// same again after the closed flow was reopened by a second SYN: the
/// flow never was established and its closes do not cut the mapping of
/// the established connection, so a remote cannot drop it at will, also
/// from a port whose tag is the setter's.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_remotes_unsolicited_syn_does_not_cut_the_mapping_of_an_established_connection() {
    let rport = colliding_port();
    after_a_syn_from(rport, |env, r| {
        let rst = |ack| seg(41000, rport, TCP_RST | TCP_ACK, 0, ack);
        r.masq_out(env, "the client's RST", rst(O_ISN + 1), &[]);
        assert_eq!(inbound_state(r, rport), FlowState::TcpClosed as u8);
        lives_days(r, "the remote's flow did not cut the mapping");
        let syn = seg(rport, 41000, TCP_SYN, O_ISN + 5000, 0);
        r.masq_in(env, "a second SYN: reopens the closed flow", syn, &[]);
        assert_eq!(inbound_state(r, rport), FlowState::TcpSynSent as u8);
        r.masq_out(env, "the client's RST again", rst(O_ISN + 5001), &[]);
        lives_days(r, "nor did its reopened flow");
    });
}

/// The same remote flow closed by a FIN in `SYN_SENT` (straight to
/// `FIN_WAIT`), then the client's RST: no LAN packet but the RST, and
/// still no cut.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_remotes_fin_after_its_syn_does_not_cut_the_mapping_of_an_established_connection() {
    let rport = colliding_port();
    after_a_syn_from(rport, |env, r| {
        let fin = seg(rport, 41000, TCP_FIN | TCP_ACK, O_ISN + 1, 0);
        r.masq_in(env, "the remote's FIN", fin, &[]);
        assert_eq!(inbound_state(r, rport), FlowState::TcpFinWait as u8);
        let rst = seg(41000, rport, TCP_RST | TCP_ACK, 0, O_ISN + 2);
        r.masq_out(env, "the client's RST", rst, &[]);
        assert_eq!(inbound_state(r, rport), FlowState::TcpClosed as u8);
        lives_days(r, "the remote's flow did not cut the mapping");
    });
}

/// The same FIN in `SYN_SENT`, then a RST, on a connection the client
/// opened from the mapping's port to a server port whose tag is the
/// setter's (not opened towards the mapping: only the state bound keeps
/// it from cutting the mapping).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_servers_fin_in_syn_sent_does_not_cut_the_mapping_of_an_established_connection() {
    let env = ResolvedTopology::new(true);
    with_router(&env, Some(closing_in_1s(config(&env))), |r| {
        establish_41000(&env, r);
        let rport = colliding_port();
        let y = tcp_key(CLIENT, 41000, SERVER, rport);
        let syn = seg(41000, rport, TCP_SYN, Y_ISN, 0);
        r.masq_out(&env, "Y: SYN", syn, &[Counter::FlowNewMasquerade]);
        let fin = seg(rport, 41000, TCP_FIN | TCP_ACK, O_ISN, Y_ISN + 1);
        r.masq_in(&env, "Y: FIN from its server", fin, &[]);
        assert_eq!(r.get(&y).state, FlowState::TcpFinWait as u8);
        let rst = seg(rport, 41000, TCP_RST | TCP_ACK, O_ISN + 1, Y_ISN + 1);
        r.masq_in(&env, "Y: RST from its server", rst, &[]);
        assert_eq!(r.get(&y).state, FlowState::TcpClosed as u8);
        lives_days(r, "Y never was established: the mapping X set is kept");
    });
}

/// A connection opened from the WAN to a listening LAN endpoint's mapping
/// (endpoint-independent filtering) extends the mapping but does not
/// become its setter: the remote's RST after the LAN host accepted does
/// not cut the mapping (after which the listener would be unreachable and
/// its port could be reclaimed), whatever the remote's tag.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_remote_that_connects_and_resets_does_not_cut_the_listeners_mapping() {
    after_a_syn_from(5555, |env, r| {
        // A later tick of the coarse clock: the SYN+ACK's refresh extends.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let syn_ack = seg(41000, 5555, TCP_SYN | TCP_ACK, Y_ISN, O_ISN + 1);
        r.masq_out(env, "the client's SYN+ACK", syn_ack, &[]);
        assert_eq!(inbound_state(r, 5555), FlowState::TcpEstablished as u8);
        lives_days(r, "the accepted connection extends the mapping");
        let rst = seg(5555, 41000, TCP_RST | TCP_ACK, O_ISN + 1, Y_ISN + 1);
        r.masq_in(env, "the remote's RST", rst, &[]);
        assert_eq!(inbound_state(r, 5555), FlowState::TcpClosed as u8);
        lives_days(r, "the remote's RST did not cut the mapping");
    });
}

/// RFC 4787 REQ-5: a mapping never expires under a live flow that needs it
/// longer. With `udp-replied` at 600 s, a replied flow's refresh gives the
/// mapping 600 s; a newer, unreplied flow of the same endpoint (300 s)
/// refreshing it later does not shorten it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_shorter_udp_flow_does_not_shorten_the_mapping() {
    let env = ResolvedTopology::new(false);
    let cfg = Config {
        timeouts: Timeouts {
            udp_replied: 600,
            ..Timeouts::default()
        },
        ..config(&env)
    };
    with_router(&env, Some(cfg), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let client = endpoint(CLIENT, 40000, IPPROTO_UDP);
        let fa = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let fb = Flow::masq(udp_key(CLIENT, 40000, SERVER, 54), 40000);
        let qa = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"flow A"));
        let qb = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 54, b"flow B"));
        let out = |r: &Router, what: &str, q: &Ipv4, events: &[Counter]| {
            r.redirect(
                what,
                &env.client_sends(q),
                lan,
                &env.to_server(&snat(q, 40000)),
                Counter::FwdOutbound,
                events,
            )
        };
        out(r, "flow A", &qa, &[Counter::FlowNewMasquerade]);
        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"A answered"));
        r.redirect(
            "flow A answered",
            &env.server_sends(&a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        age(r, &[fa.orig, fa.reply()], 2 * NS_PER_SEC);
        let run = out(r, "flow A refreshes", &qa, &[]);
        let long = 600 * NS_PER_SEC;
        let ea = expiry(r, IPPROTO_UDP, 40000, client);
        assert!(
            (run.t0 + long..=run.t1 + long).contains(&ea),
            "replied: 600 s"
        );
        out(
            r,
            "flow B, same mapping",
            &qb,
            &[Counter::FlowNewMasquerade],
        );
        age(r, &[fb.orig, fb.reply()], 2 * NS_PER_SEC);
        out(r, "flow B refreshes", &qb, &[]);
        assert_eq!(
            expiry(r, IPPROTO_UDP, 40000, client),
            ea,
            "the unreplied flow's 300 s does not cut flow A's 600 s"
        );
    });
}

/// `t` from `CLIENT` to WAN:8080, hairpinned to `CLIENT2:80` from WAN:41000
/// (the client's port, preserved): asserts the redirect and `events`.
fn hairpin_out(
    env: &ResolvedTopology,
    r: &Router,
    what: &str,
    t: Tcp,
    events: &[Counter],
) -> ProgRun {
    let ip = Ipv4::new(CLIENT, WAN, t);
    r.redirect(
        what,
        &env.client_sends(&ip),
        r.lan,
        &env.to_client2(&hairpinned(&ip, 41000, CLIENT2, 80)),
        Counter::FwdOutbound,
        events,
    )
}

/// `t` from `CLIENT2:80` to WAN:41000, hairpinned back to `CLIENT:41000`
/// from WAN:8080: asserts the redirect.
fn hairpin_back(env: &ResolvedTopology, r: &Router, what: &str, t: Tcp) -> ProgRun {
    let ip = Ipv4::new(CLIENT2, WAN, t);
    r.redirect(
        what,
        &env.client2_sends(&ip),
        r.lan,
        &env.to_client(&hairpinned(&ip, 8080, CLIENT, 41000)),
        Counter::FwdOutbound,
        &[],
    )
}

/// `CLIENT:41000 -> WAN:8080`, forwarded to `CLIENT2:80` (hairpinned),
/// established (SYN, SYN+ACK, ACK) and, 2 s later, refreshed by the
/// client's ACK: its mapping (WAN port 41000) lives days.
fn establish_hairpin_41000(env: &ResolvedTopology, r: &mut Router) {
    r.forward(IPPROTO_TCP, 8080, CLIENT2, 80);
    let syn = seg(41000, 8080, TCP_SYN, C_ISN, 0);
    hairpin_out(
        env,
        r,
        "SYN to the forward",
        syn,
        &[Counter::FlowNewHairpin],
    );
    let syn_ack = seg(80, 41000, TCP_SYN | TCP_ACK, S_ISN, C_ISN + 1);
    hairpin_back(env, r, "SYN+ACK from client 2", syn_ack);
    let ack = || seg(41000, 8080, TCP_ACK, C_ISN + 1, S_ISN + 1);
    hairpin_out(env, r, "ACK", ack(), &[]);
    let (orig, reply) = (
        tcp_key(CLIENT, 41000, WAN, 8080),
        tcp_key(CLIENT2, 80, WAN, 41000),
    );
    age(r, &[orig, reply], 2 * NS_PER_SEC);
    hairpin_out(env, r, "ACK, 2 s later", ack(), &[]);
    lives_days(r, "established: the mapping lives days");
}

/// RFC 5382 REQ-5 (and no port leak) for a hairpinned connection (NAT
/// loopback to a server on the LAN, which usually closes first): the
/// target's FIN lowers the opener's mapping to `FIN_WAIT`'s timeout, the
/// opener's FIN then to the closed state's; a RST from the target lowers
/// it to the closed state's at once. (The target's entry names the
/// target's side of the flow; the opener's mapping follows it too.)
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_hairpin_targets_close_frees_the_openers_mapping() {
    let env = ResolvedTopology::new(true);
    with_router(&env, Some(closing_in_1s(config(&env))), |r| {
        establish_hairpin_41000(&env, r);
        let fin = seg(80, 41000, TCP_FIN | TCP_ACK, S_ISN + 1, C_ISN + 1);
        let run = hairpin_back(&env, r, "FIN from client 2", fin);
        let e = expiry(r, IPPROTO_TCP, 41000, client_41000());
        let fin_wait = u64::from(Timeouts::default().tcp_fin_wait) * NS_PER_SEC;
        assert!(
            e <= run.t1 + fin_wait,
            "the target's FIN lowers the mapping to FIN_WAIT's: {} s left",
            (i128::from(e) - i128::from(run.t1)) / 1_000_000_000
        );
        let ack = seg(41000, 8080, TCP_ACK, C_ISN + 1, S_ISN + 2);
        hairpin_out(&env, r, "ACK of client 2's FIN", ack, &[]);
        let fin = seg(41000, 8080, TCP_FIN | TCP_ACK, C_ISN + 1, S_ISN + 2);
        let run = hairpin_out(&env, r, "the client's FIN", fin, &[]);
        assert_eq!(
            r.get(&tcp_key(CLIENT, 41000, WAN, 8080)).state,
            FlowState::TcpClosed as u8
        );
        expires_1s_after(r, &run);
    });
    with_router(&env, Some(closing_in_1s(config(&env))), |r| {
        establish_hairpin_41000(&env, r);
        let rst = seg(80, 41000, TCP_RST | TCP_ACK, S_ISN + 1, C_ISN + 1);
        let run = hairpin_back(&env, r, "RST from client 2", rst);
        assert_eq!(
            r.get(&tcp_key(CLIENT2, 80, WAN, 41000)).state,
            FlowState::TcpClosed as u8
        );
        expires_1s_after(r, &run);
    });
}

/// RFC 5382 REQ-2: a simultaneous open with the LAN's SYN first (TCP hole
/// punching where both ends connect at once): the remote's crossing SYN
/// matches the flow's reply entry and is forwarded, both SYN+ACKs are,
/// the flow becomes established and its mapping follows (days).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_simultaneous_open_with_the_lans_syn_first_is_carried() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (c, s) = (C_ISN, S_ISN);
        r.masq_out(
            &env,
            "client SYN",
            seg(41000, 80, TCP_SYN, c, 0),
            &[Counter::FlowNewMasquerade],
        );
        r.masq_in(
            &env,
            "server SYN, crossing",
            seg(80, 41000, TCP_SYN, s, 0),
            &[],
        );
        r.masq_out(
            &env,
            "client SYN+ACK",
            seg(41000, 80, TCP_SYN | TCP_ACK, c, s + 1),
            &[],
        );
        r.masq_in(
            &env,
            "server SYN+ACK",
            seg(80, 41000, TCP_SYN | TCP_ACK, s, c + 1),
            &[],
        );
        let k = tcp_key(CLIENT, 41000, SERVER, 80);
        assert_eq!(r.get(&k).state, FlowState::TcpEstablished as u8);
        r.masq_out(
            &env,
            "client data",
            seg(41000, 80, TCP_ACK | TCP_PSH, c + 1, s + 1),
            &[],
        );
        r.masq_in(
            &env,
            "server data",
            seg(80, 41000, TCP_ACK | TCP_PSH, s + 1, c + 1),
            &[],
        );
        let m = r
            .mapping(IPPROTO_TCP, 41000)
            .expect("the connection's mapping");
        assert!(
            m.expires_ns > now_ns() + 86_400 * NS_PER_SEC,
            "the mapping follows the established connection"
        );
    });
}

/// An endpoint's `NAT_ENDPOINTS` index, evicted by the LRU while its
/// mapping lives (a long session's flows never look it up again), is put
/// back by the flow's next outbound refresh of the mapping: the endpoint's
/// next new flow then finds its mapping instead of probing afresh (where a
/// port freed meanwhile would give it a second one, RFC 4787 REQ-1).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_evicted_endpoint_index_comes_back_with_the_mappings_refresh() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        let client = endpoint(CLIENT, 40000, IPPROTO_UDP);
        let (f, q) = open_client_udp_40000(&env, r);
        assert!(r.endpoints.get(&client, 0).is_ok(), "indexed at creation");
        r.endpoints.remove(&client).unwrap();
        age(r, &[f.orig, f.reply()], 2 * NS_PER_SEC);
        r.redirect(
            "out: refreshes the mapping",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let back = r.endpoints.get(&client, 0).expect("the index is back");
        assert_eq!((back.proto, back.port), (IPPROTO_UDP, 40000));
    });
}

/// RFC 4787: a mapping's filtering lives as long as the mapping (REQ-5:
/// at least 2 minutes after the last outbound packet; 5 here), not only
/// as long as the flow's own timer: the remote the endpoint sent to still
/// gets in after a replied flow's 120 s, and a late answer to a hole punch
/// after an unreplied flow's 30 s; once the mapping has expired it is
/// refused, and another port of the same remote never was (address- and
/// port-dependent filtering).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_udp_flow_lives_as_long_as_its_mapping() {
    let env = ResolvedTopology::new(false);
    for (what, replied, idle_secs) in [
        ("replied, idle 121 s", true, 121),
        ("unreplied, idle 31 s", false, 31),
    ] {
        with_router(&env, Some(config(&env)), |r| {
            let (lan, wan) = (r.lan, r.wan);
            let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 3478), 40000);
            let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 3478, b"client"));
            let a = Ipv4::new(SERVER, WAN, Udp::new(3478, 40000, b"answer"));
            let answered = |r: &Router, what: &str| {
                r.redirect(
                    what,
                    &env.server_sends(&a),
                    wan,
                    &env.to_client(&dnat(&a, CLIENT, 40000)),
                    Counter::FwdInbound,
                    &[],
                );
            };
            r.redirect(
                "out",
                &env.client_sends(&q),
                lan,
                &env.to_server(&snat(&q, 40000)),
                Counter::FwdOutbound,
                &[Counter::FlowNewMasquerade],
            );
            if replied {
                answered(r, "first answer");
            }
            age(r, &[f.orig, f.reply()], idle_secs * NS_PER_SEC);
            let m = r.mapping(IPPROTO_UDP, 40000).expect("the mapping");
            assert!(m.expires_ns > now_ns(), "{what}: the mapping lives");
            answered(r, &format!("{what}: the remote answers"));
            // Another port of the same remote: no flow, refused.
            let other = Ipv4::new(SERVER, WAN, Udp::new(3479, 40000, b"other port"));
            r.pass(
                &format!("{what}: another port of the remote"),
                &env.server_sends(&other),
                wan,
                Counter::PassUnsolicited,
            );
            // The mapping gone (and the flow, replied now, idle past its
            // 120 s): refused.
            age(r, &[f.orig, f.reply()], 121 * NS_PER_SEC);
            r.put_mapping(
                IPPROTO_UDP,
                40000,
                Mapping {
                    internal: endpoint(CLIENT, 40000, IPPROTO_UDP),
                    expires_ns: now_ns() - NS_PER_SEC,
                },
            );
            r.pass(
                &format!("{what}: the mapping expired"),
                &env.server_sends(&a),
                wan,
                Counter::PassUnsolicited,
            );
        });
    }
}

/// What a UDP flow's mapping keeps alive past the flow's own timer, and
/// what it does not: a flow a remote opened towards the mapping (its
/// admission was the filtering setting's: once the setting is
/// address-and-port-dependent again, the remote is refused when the flow's
/// timer has run out), and any flow after a switch to offload mode (the
/// kernel admits; XDP-admitted flows end with their own timers).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_mapping_keeps_alive_only_the_flows_its_endpoint_opened_in_standalone_mode() {
    let env = ResolvedTopology::new(false);
    with_router(
        &env,
        Some(with_filtering(&env, Filtering::EndpointIndependent)),
        |r| {
            let (lan, wan) = (r.lan, r.wan);
            let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"out"));
            r.redirect(
                "out",
                &env.client_sends(&q),
                lan,
                &env.to_server(&snat(&q, 40000)),
                Counter::FwdOutbound,
                &[Counter::FlowNewMasquerade],
            );
            // Another port of the server opens a flow towards the mapping.
            let a = Ipv4::new(SERVER, WAN, Udp::new(9999, 40000, b"in"));
            r.redirect(
                "in, opened towards the mapping",
                &env.server_sends(&a),
                wan,
                &env.to_client(&dnat(&a, CLIENT, 40000)),
                Counter::FwdInbound,
                &[Counter::FlowNewInboundMapping],
            );
            r.configure(&config(&env));
            let inward = Flow::masq(udp_key(CLIENT, 40000, SERVER, 9999), 40000);
            let own = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
            age(
                r,
                &[inward.orig, inward.reply(), own.orig, own.reply()],
                121 * NS_PER_SEC,
            );
            r.pass(
                "the inward flow's remote, its timer run out",
                &env.server_sends(&a),
                wan,
                Counter::PassUnsolicited,
            );
            let b = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"answer"));
            r.redirect(
                "the endpoint's own flow's remote",
                &env.server_sends(&b),
                wan,
                &env.to_client(&dnat(&b, CLIENT, 40000)),
                Counter::FwdInbound,
                &[],
            );
            // Offload mode: the kernel's.
            age(r, &[own.orig, own.reply()], 121 * NS_PER_SEC);
            r.configure(&Config {
                admit: router_common::maps::Admit::Kernel as u8,
                ..config(&env)
            });
            r.pass(
                "offload mode, the timer run out",
                &env.server_sends(&b),
                wan,
                Counter::PassNotOffloaded,
            );
        },
    );
}
