//! Next hops: FIB outcomes other than success, the per-flow next-hop cache.

use super::*;

/// FIB outcomes other than success: no neighbour (both sides: translated
/// without TTL change, flow recorded), MTU exceeded, forwarding
/// disabled, egress not attached.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn fib_outcomes_other_than_success() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        // LAN -> WAN host without neighbour: the flow is created and the
        // packet passed translated, TTL untouched (the kernel forwards it).
        let n = Flow::masq(udp_key(CLIENT, 40000, WAN_NOBODY, 53), 40000);
        let q = Ipv4::new(CLIENT, WAN_NOBODY, Udp::new(40000, 53, b"nobody there"));
        let mut want = snat(&q, 40000);
        want.ttl = q.ttl;
        let run = r.check(
            "LAN -> WAN host without neighbour",
            &env.client_sends(&q),
            lan,
            XDP_PASS,
            &env.client_sends(&want),
            Counter::PassNoNeighbour,
            &[Counter::FlowNewMasquerade],
        );
        frames::verify_checksums(&run.out);
        let ts_n = r.stamp(&n.orig, &run);
        let first = n.entries(FlowState::UdpUnreplied, 0, ts_n, ts_n);
        r.assert_flows("the first packet's flow", first);

        // Port forward to a LAN address without neighbour.
        r.forward(IPPROTO_UDP, 9000, LAN_NOBODY, 9001);
        let f = Flow::forward(udp_key(SERVER, 6000, WAN, 9000), LAN_NOBODY, 9001);
        let u = Ipv4::new(SERVER, WAN, Udp::new(6000, 9000, b"forward to nobody"));
        let mut want = dnat(&u, LAN_NOBODY, 9001);
        want.ttl = u.ttl;
        let input = env.server_sends(&u);
        let expect = Frame::new(env.wan_mac, env.server_mac, want).bytes();
        let run = r.check(
            "forward, no neighbour",
            &input,
            wan,
            XDP_PASS,
            &expect,
            Counter::PassNoNeighbour,
            &[Counter::FlowNewPortForward],
        );
        frames::verify_checksums(&run.out);
        let ts = r.stamp(&f.orig, &run);
        r.assert_flows(
            "forward recorded",
            f.entries(FlowState::UdpUnreplied, 0, ts, ts)
                .into_iter()
                .chain(first),
        );

        // A masqueraded flow of a LAN host the router has no neighbour for:
        // the reply is translated and passed.
        let g = Flow::masq(udp_key(LAN_NOBODY, 7000, SERVER, 53), 7000);
        let gq = Ipv4::new(LAN_NOBODY, SERVER, Udp::new(7000, 53, b"from .9"));
        let run = r.redirect(
            "masquerade from .9",
            &Frame::new(env.lan_mac, [2, 0, 0, 0, 0, 9], gq.clone()).bytes(),
            lan,
            &env.to_server(&snat(&gq, 7000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_g = r.stamp(&g.orig, &run);
        let ga = Ipv4::new(SERVER, WAN, Udp::new(53, 7000, b"to .9"));
        let mut want = dnat(&ga, LAN_NOBODY, 7000);
        want.ttl = ga.ttl;
        let input = env.server_sends(&ga);
        let expect = Frame::new(env.wan_mac, env.server_mac, want).bytes();
        let run = r.check(
            "reply to .9, no neighbour",
            &input,
            wan,
            XDP_PASS,
            &expect,
            Counter::PassNoNeighbour,
            &[],
        );
        frames::verify_checksums(&run.out);
        let seen_g = r.seen(&g.orig, ts_g, &run);
        let flows: Vec<(FlowKey, FlowEntry)> = f
            .entries(FlowState::UdpUnreplied, 0, ts, ts)
            .into_iter()
            .chain(g.entries(FlowState::UdpReplied, 0, ts_g, seen_g))
            .chain(first)
            .collect();
        r.assert_flows("after reply to .9", flows.clone());

        // MTU: wan0 at 1000 bytes, a 1200-byte packet.
        env.t
            .exec_ok(Ns::Router, &["ip", "link", "set", WAN_IF, "mtu", "1000"]);
        let big = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, &[0x5a; 1172]));
        r.pass(
            "exceeds the egress MTU",
            &env.client_sends(&big),
            lan,
            Counter::PassMtu,
        );
        env.t
            .exec_ok(Ns::Router, &["ip", "link", "set", WAN_IF, "mtu", "1500"]);

        // Forwarding disabled on the ingress interface.
        let key = format!("net.ipv4.conf.{LAN_IF}.forwarding");
        env.t
            .exec_ok(Ns::Router, &["sysctl", "-qw", &format!("{key}=0")]);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"forwarding off"));
        r.pass(
            "forwarding disabled",
            &env.client_sends(&q),
            lan,
            Counter::PassFibForwardingDisabled,
        );
        env.t
            .exec_ok(Ns::Router, &["sysctl", "-qw", &format!("{key}=1")]);

        // Egress interface not in DEVICES.
        r.devices.remove(wan).unwrap();
        r.pass(
            "egress not attached",
            &env.client_sends(&q),
            lan,
            Counter::PassEgressNotAttached,
        );
        r.devices.insert(wan, wan, None, 0).unwrap();
        r.assert_flows("no flow for passed packets", flows);

        // And with everything back, the same packet is forwarded.
        r.redirect(
            "forwarded again",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
    });
}

/// The client's DNS query of the next-hop cache tests: its flow, the frame
/// as the client sends it and as it leaves masqueraded (port kept).
fn dns_query(env: &ResolvedTopology) -> (Flow, Vec<u8>, Vec<u8>) {
    let q = Ipv4::new(CLIENT, SERVER, Udp::new(41000, 53, b"q"));
    (
        Flow::masq(udp_key(CLIENT, 41000, SERVER, 53), 41000),
        env.client_sends(&q),
        env.to_server(&snat(&q, 41000)),
    )
}

/// [`dns_query`]'s flow, opened: its first packet translated and
/// redirected out of the WAN, a new masquerade counted.
fn open_dns_flow(env: &ResolvedTopology, r: &Router) -> (Flow, Vec<u8>, Vec<u8>) {
    let (f, frame, out) = dns_query(env);
    r.redirect(
        "open",
        &frame,
        r.lan,
        &out,
        Counter::FwdOutbound,
        &[Counter::FlowNewMasquerade],
    );
    (f, frame, out)
}

/// Established flows use the next hop cached in their entry (no FIB lookup
/// per packet); the FIB is asked again when nothing is cached, when the
/// packet is bigger than the cached MTU, at each refresh, and when the
/// cached egress left the device map (deleted, perhaps made anew). A hop
/// to an interface no longer attached is not used blindly, and one the FIB
/// refuses at a refresh (blackhole route, forwarding off) is forgotten.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn next_hop_cache() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let (f, frame, out) = open_dns_flow(&env, r);
        let fwd = Counter::FwdOutbound;
        assert_eq!(
            r.raw_entry(&f.orig).hop_ifindex,
            0,
            "nothing cached by a new flow"
        );

        r.redirect("second", &frame, lan, &out, fwd, &[]);
        let e = r.raw_entry(&f.orig);
        assert_eq!(
            (e.hop_ifindex, e.hop_mtu, e.hop_dmac, e.hop_smac),
            (wan, 1500, env.server_mac, env.wan_mac),
            "FIB result cached"
        );
        assert_eq!(
            r.raw_entry(&f.reply()).hop_ifindex,
            0,
            "reply direction not seen yet"
        );

        // The cache is what the next packet uses: a doctored MAC shows up.
        let fake = [0x02, 0xde, 0xad, 0xbe, 0xef, 0x01];
        let mut doctored = e;
        doctored.hop_dmac = fake;
        r.put(f.orig, doctored);
        let mut via_cache = out.clone();
        via_cache[0..6].copy_from_slice(&fake);
        r.redirect("cached", &frame, lan, &via_cache, fwd, &[]);

        // Bigger than the cached MTU: the FIB is asked and the cache fixed.
        let mut small = doctored;
        small.hop_mtu = 20;
        r.put(f.orig, small);
        r.redirect("over cached MTU", &frame, lan, &out, fwd, &[]);
        assert_eq!(r.raw_entry(&f.orig).hop_dmac, env.server_mac);
        assert_eq!(r.raw_entry(&f.orig).hop_mtu, 1500);

        // Refresh due: the FIB is asked again.
        let mut stale = r.raw_entry(&f.orig);
        stale.hop_dmac = fake;
        stale.last_seen_ns -= 2 * REFRESH_NS;
        r.put(f.orig, stale);
        r.redirect("refresh", &frame, lan, &out, fwd, &[]);
        assert_eq!(
            r.raw_entry(&f.orig).hop_dmac,
            env.server_mac,
            "refreshed from the FIB"
        );

        // Cached egress detached: passed untouched, not redirected.
        r.devices.remove(wan).unwrap();
        r.pass(
            "egress detached",
            &frame,
            lan,
            Counter::PassEgressNotAttached,
        );
        r.devices.insert(wan, wan, None, 0).unwrap();
        r.redirect("egress back", &frame, lan, &out, fwd, &[]);
        assert_eq!(r.raw_entry(&f.orig).hop_ifindex, wan, "cached again");

        // The cached egress was deleted and made anew (another index; the
        // kernel took the old one out of the device map): the FIB is asked,
        // not the packet passed, and the new egress cached.
        let mut gone = r.raw_entry(&f.orig);
        gone.hop_ifindex = 4000;
        r.put(f.orig, gone);
        r.redirect("cached egress deleted", &frame, lan, &out, fwd, &[]);
        assert_eq!(
            r.raw_entry(&f.orig).hop_ifindex,
            wan,
            "the FIB's egress cached"
        );

        // The FIB refuses the hop at a refresh (a blackhole route, then
        // forwarding off): the cached hop is forgotten, so the packets
        // after the refused one are passed too, not redirected to the old
        // hop until the next refresh.
        let server = tests::addr::SERVER_ADDR.to_string();
        let forwarding = format!("net.ipv4.conf.{LAN_IF}.forwarding");
        let refusals: [(&[&str], &[&str], Counter); 2] = [
            (
                &["ip", "route", "add", "blackhole", &server],
                &["ip", "route", "del", "blackhole", &server],
                Counter::PassFibNotForwarded,
            ),
            (
                &["sysctl", "-qw", &format!("{forwarding}=0")],
                &["sysctl", "-qw", &format!("{forwarding}=1")],
                Counter::PassFibForwardingDisabled,
            ),
        ];
        for (refuse, undo, counter) in refusals {
            env.t.exec_ok(Ns::Router, refuse);
            let mut due = r.raw_entry(&f.orig);
            assert_eq!(due.hop_ifindex, wan, "{refuse:?}: cached before");
            due.last_seen_ns -= 2 * REFRESH_NS;
            r.put(f.orig, due);
            r.pass("refused at the refresh", &frame, lan, counter);
            assert_eq!(
                r.raw_entry(&f.orig).hop_ifindex,
                0,
                "{refuse:?}: cached hop forgotten"
            );
            r.pass("refused again, not the old hop", &frame, lan, counter);
            env.t.exec_ok(Ns::Router, undo);
            r.redirect("forwarded again", &frame, lan, &out, fwd, &[]);
            assert_eq!(r.raw_entry(&f.orig).hop_ifindex, wan, "{undo:?}: cached");
        }
    });
}

/// Each direction follows a route or neighbour change within the refresh
/// interval, also the one whose entry the other direction refreshes: a
/// busy outbound direction keeps both entries' last-seen times fresh, so
/// the inbound one never came due and kept its cached next hop (a LAN
/// host's old MAC, a gateway replaced) for as long as the flow ran. The
/// refresh now takes the other entry's cached hop with it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn the_other_direction_asks_the_fib_again_at_each_refresh() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let (f, frame, out) = open_dns_flow(&env, r);
        let fwd = Counter::FwdOutbound;
        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 41000, b"a"));
        let answer = env.server_sends(&a);
        let answered = env.to_client(&dnat(&a, CLIENT, 41000));
        let fwd_in = Counter::FwdInbound;
        r.redirect("answer", &answer, wan, &answered, fwd_in, &[]);
        r.redirect("answer, cached", &answer, wan, &answered, fwd_in, &[]);
        r.redirect("query, cached", &frame, lan, &out, fwd, &[]);
        // The LAN host's MAC as the inbound entry cached it is now stale
        // (doctored here), and only the outbound direction comes due.
        let fake = [0x02, 0xde, 0xad, 0xbe, 0xef, 0x02];
        let mut inbound = r.raw_entry(&f.reply());
        assert_eq!(inbound.hop_ifindex, lan, "inbound hop cached");
        inbound.hop_dmac = fake;
        r.put(f.reply(), inbound);
        let mut due = r.raw_entry(&f.orig);
        due.last_seen_ns -= 2 * REFRESH_NS;
        r.put(f.orig, due);
        r.redirect("query, refresh", &frame, lan, &out, fwd, &[]);
        assert_eq!(
            r.raw_entry(&f.reply()).hop_ifindex,
            0,
            "the refresh took the inbound entry's cached hop"
        );
        // The answer asks the FIB: the client's real MAC, not the stale one.
        r.redirect(
            "answer after the refresh",
            &answer,
            wan,
            &answered,
            fwd_in,
            &[],
        );
        assert_eq!(r.raw_entry(&f.reply()).hop_dmac, env.client_mac);
    });
}

/// A policy rule on a LAN host's source (VPN split routing, multi-WAN):
/// the kernel routes a packet before its source NAT, so the FIB is asked
/// with the packet's own source, and the table the rule selects (here a
/// blackhole) is the fast path's too, at the refresh and for a new flow;
/// not the main table the WAN address would select.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_source_policy_rule_routes_the_fast_path_too() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let lan = r.lan;
        let (f, frame, out) = open_dns_flow(&env, r);
        let fwd = Counter::FwdOutbound;
        r.redirect("cached", &frame, lan, &out, fwd, &[]);
        let client = tests::addr::CLIENT_ADDR.to_string();
        let rule = [
            "ip", "rule", "add", "from", &client, "lookup", "100", "pref", "100",
        ];
        env.t.exec_ok(
            Ns::Router,
            &["ip", "route", "add", "blackhole", "default", "table", "100"],
        );
        env.t.exec_ok(Ns::Router, &rule);
        let mut due = r.raw_entry(&f.orig);
        due.last_seen_ns -= 2 * REFRESH_NS;
        r.put(f.orig, due);
        let not_forwarded = Counter::PassFibNotForwarded;
        r.pass("source rule at the refresh", &frame, lan, not_forwarded);
        assert_eq!(r.raw_entry(&f.orig).hop_ifindex, 0, "cached hop forgotten");
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(41001, 53, b"new"));
        r.pass(
            "source rule, new flow",
            &env.client_sends(&q),
            lan,
            not_forwarded,
        );
        env.t
            .exec_ok(Ns::Router, &["ip", "rule", "del", "pref", "100"]);
        r.redirect("rule gone", &frame, lan, &out, fwd, &[]);
    });
}

/// A packet over the route's MTU keeps a flow's cached hop (the route is
/// fine, the flow's other packets stay on it); a route MTU lowered under
/// the cached one forgets it at the refresh, so no packet goes on at the
/// old MTU.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_oversize_packet_keeps_the_cached_hop_and_a_lowered_mtu_forgets_it() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let (f, frame, out) = open_dns_flow(&env, r);
        let fwd = Counter::FwdOutbound;
        r.redirect("cached", &frame, lan, &out, fwd, &[]);
        assert_eq!(r.raw_entry(&f.orig).hop_ifindex, wan);
        let server = tests::addr::SERVER_ADDR.to_string();

        // A packet over the route's MTU (1500) is the kernel's, and the
        // route is fine: the flow keeps its cached hop for the rest.
        let big = Ipv4::new(CLIENT, SERVER, Udp::new(41000, 53, &[7; 1600]));
        r.pass(
            "over the MTU",
            &env.client_sends(&big),
            lan,
            Counter::PassMtu,
        );
        assert_eq!(
            r.raw_entry(&f.orig).hop_ifindex,
            wan,
            "an oversize packet kept the cache"
        );
        r.redirect("still cached", &frame, lan, &out, fwd, &[]);

        // The route's MTU went down under the cached one (locked: a
        // forwarding router uses a route's MTU only then, as the FIB
        // helper does): a packet the cache would take but the route
        // refuses forgets the cache.
        let route = [
            "ip", "route", "add", &server, "dev", WAN_IF, "mtu", "lock", "1000",
        ];
        env.t.exec_ok(Ns::Router, &route);
        let mid = Ipv4::new(CLIENT, SERVER, Udp::new(41000, 53, &[7; 1200]));
        let mut due = r.raw_entry(&f.orig);
        due.last_seen_ns -= 2 * REFRESH_NS;
        r.put(f.orig, due);
        r.pass(
            "over the lowered MTU",
            &env.client_sends(&mid),
            lan,
            Counter::PassMtu,
        );
        assert_eq!(
            r.raw_entry(&f.orig).hop_ifindex,
            0,
            "the lowered MTU forgot the cache"
        );
        r.pass(
            "not on the old MTU",
            &env.client_sends(&mid),
            lan,
            Counter::PassMtu,
        );
        env.t
            .exec_ok(Ns::Router, &["ip", "route", "del", &server, "dev", WAN_IF]);
    });
}
