//! IPv6 flows through `BPF_PROG_RUN`: TCP, UDP and `ICMPv6` echo forwarded
//! both ways with exact bytes, their states in CONNTRACK6, RFC 6092
//! admission (outbound opens, inbound only replies and pinholes), offload
//! mode, and the next-hop cache with the egress MTU.

use router_common::ipv6::IPPROTO_ICMPV6;
use router_common::lease_cas::{self, LeaseCas, LeaseCasCtx, LeaseSwap};
use router_common::maps::{
    FLAG_FIN_ORIG, FLAG_OFFLOADED, FLAG_ORIGINAL, FLAG_PORT_FORWARD, IPPROTO_TCP, IPPROTO_UDP,
    LEASE_HANDED_BACK, LEASE_PENDING, lease_tick,
};
use tests::frames::{TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, Tcp, Udp};
use tests::prog::now_ns;
use tests::v6::{CLIENT6, LAN_NOBODY6, ROUTER_LAN6, ROUTER_WAN6, SERVER6, o};

use super::*;

fn key(
    src: std::net::Ipv6Addr,
    sport: u16,
    dst: std::net::Ipv6Addr,
    dport: u16,
    proto: u8,
) -> FlowKey6 {
    FlowKey6::new(o(src), o(dst), sport, dport, proto)
}

/// TCP from the LAN: SYN opens the flow, SYN-ACK establishes it, data both
/// ways, FIN from the client; every packet forwarded with only the hop
/// limit and MACs changed.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted connection: each step's frame, its exact output and the flow after it"
)]
fn tcp6_outbound_flow_forwarded_exactly() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let orig = key(CLIENT6, 40000, SERVER6, 443, IPPROTO_TCP);
        let syn_tcp = Tcp::new(40000, 443, TCP_SYN).options(&[2, 4, 5, 0xa0]);
        let syn = Ipv6::tcp(c, s, &syn_tcp);
        r.redirect(
            "SYN out",
            &from_client(&env, &syn),
            lan,
            &to_server(&env, &syn),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        r.assert_flows(
            "after SYN",
            &[
                (orig, FlowState::TcpSynSent, FLAG_ORIGINAL),
                (orig.reversed(), FlowState::TcpSynSent, 0),
            ],
        );
        let syn_ack_tcp = Tcp::syn_ack_to(&syn_tcp);
        let syn_ack = Ipv6::tcp(s, c, &syn_ack_tcp);
        // The next sequence number of each side, for the window check.
        let (c_next, s_next) = (syn_tcp.seq + 1, syn_ack_tcp.seq + 1);
        r.redirect(
            "SYN-ACK in",
            &from_server(&env, &syn_ack),
            wan,
            &to_client(&env, &syn_ack),
            Counter::Fwd6Inbound,
            &[],
        );
        r.assert_flows(
            "after SYN-ACK",
            &[
                (orig, FlowState::TcpEstablished, FLAG_ORIGINAL),
                (orig.reversed(), FlowState::TcpEstablished, 0),
            ],
        );
        let data = Ipv6::tcp(
            c,
            s,
            &Tcp::new(40000, 443, TCP_ACK | TCP_PSH)
                .numbered(c_next, s_next)
                .payload(b"GET / HTTP/1.1\r\n\r\n"),
        )
        .hop_limit(2);
        r.redirect(
            "data out, hop limit 2",
            &from_client(&env, &data),
            lan,
            &to_server(&env, &data),
            Counter::Fwd6Outbound,
            &[],
        );
        let answer = Ipv6::tcp(
            s,
            c,
            &Tcp::new(443, 40000, TCP_ACK)
                .numbered(s_next, c_next + 18)
                .payload(&[0x5a; 1000]),
        );
        r.redirect(
            "data in (next hop now cached)",
            &from_server(&env, &answer),
            wan,
            &to_client(&env, &answer),
            Counter::Fwd6Inbound,
            &[],
        );
        r.redirect(
            "data in again (from the cache)",
            &from_server(&env, &answer),
            wan,
            &to_client(&env, &answer),
            Counter::Fwd6Inbound,
            &[],
        );
        let cached = r.conntrack6()[&orig.reversed()];
        assert_eq!(cached.hop_ifindex, lan, "cached egress: {cached:?}");
        assert_eq!(cached.hop_dmac, env.client_mac);
        assert_eq!(cached.hop_smac, env.lan_mac);
        // A refresh by the outbound direction takes the inbound entry's
        // cached hop too: its next packet asks the FIB (a LAN host's new
        // MAC is followed within the refresh interval).
        let mut due = r.conntrack6()[&orig];
        due.last_seen_ns -= 2 * router_common::flow::REFRESH_NS;
        r.put6(&orig, &due);
        r.redirect(
            "data out again, refresh due",
            &from_client(&env, &data),
            lan,
            &to_server(&env, &data),
            Counter::Fwd6Outbound,
            &[],
        );
        assert_eq!(
            r.conntrack6()[&orig.reversed()].hop_ifindex,
            0,
            "the refresh took the inbound entry's cached hop"
        );
        let fin = Ipv6::tcp(
            c,
            s,
            &Tcp::new(40000, 443, TCP_FIN | TCP_ACK).numbered(c_next + 18, s_next + 1000),
        );
        r.redirect(
            "FIN out",
            &from_client(&env, &fin),
            lan,
            &to_server(&env, &fin),
            Counter::Fwd6Outbound,
            &[],
        );
        r.assert_flows(
            "after FIN",
            &[
                (orig, FlowState::TcpFinWait, FLAG_ORIGINAL | FLAG_FIN_ORIG),
                (orig.reversed(), FlowState::TcpFinWait, FLAG_FIN_ORIG),
            ],
        );
        // The same tuple replayed on the other side is no hit: a WAN host
        // cannot use the LAN side's entry.
        // (Routed back to the WAN, so not a LAN host's business either.)
        r.pass(
            "client's tuple arriving on the WAN",
            &data.frame(env.wan_mac, env.server_mac),
            wan,
            Counter::PassUnsolicited,
        );
    });
}

/// UDP and `ICMPv6` echo from the LAN: opened, replies forwarded, UDP
/// UNREPLIED -> REPLIED.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn udp6_and_ping6_flows() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let q = Ipv6::udp(c, s, &Udp::new(5353, 53, b"odd-length query"));
        r.redirect(
            "UDP out",
            &from_client(&env, &q),
            lan,
            &to_server(&env, &q),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        let uk = key(CLIENT6, 5353, SERVER6, 53, IPPROTO_UDP);
        r.assert_flows(
            "UDP unreplied",
            &[
                (uk, FlowState::UdpUnreplied, FLAG_ORIGINAL),
                (uk.reversed(), FlowState::UdpUnreplied, 0),
            ],
        );
        let a = Ipv6::udp(s, c, &Udp::new(53, 5353, b"answer"));
        r.redirect(
            "UDP reply",
            &from_server(&env, &a),
            wan,
            &to_client(&env, &a),
            Counter::Fwd6Inbound,
            &[],
        );
        let ping = Ipv6::echo(c, s, false, 0x77, 1);
        r.redirect(
            "echo request out",
            &from_client(&env, &ping),
            lan,
            &to_server(&env, &ping),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        let pong = Ipv6::echo(s, c, true, 0x77, 1);
        r.redirect(
            "echo reply in",
            &from_server(&env, &pong),
            wan,
            &to_client(&env, &pong),
            Counter::Fwd6Inbound,
            &[],
        );
        let ek = key(CLIENT6, 0x77, SERVER6, 0x77, IPPROTO_ICMPV6);
        r.assert_flows(
            "UDP replied and ping",
            &[
                (uk, FlowState::UdpReplied, FLAG_ORIGINAL),
                (uk.reversed(), FlowState::UdpReplied, 0),
                (ek, FlowState::Icmp, FLAG_ORIGINAL),
                (ek.reversed(), FlowState::Icmp, 0),
            ],
        );
        // An echo request from the WAN opens nothing, even with the id of
        // a known ping.
        let inbound_ping = Ipv6::echo(s, c, false, 0x77, 2);
        r.drop_frame(
            "echo request from the WAN to the client",
            &from_server(&env, &inbound_ping),
            wan,
            Counter::Drop6Unsolicited,
        );
    });
}

/// Unsolicited packets from the WAN to a LAN host, dropped, note no
/// neighbour in use in `NEXT_HOPS` (nothing was forwarded to it): the
/// daemon would keep the kernel probing the LAN hosts a scanner walks.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn inbound6_unsolicited_notes_no_next_hop() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let syn = Ipv6::tcp(s, c, &Tcp::new(50000, 22, TCP_SYN));
        let ping = Ipv6::echo(s, c, false, 0x78, 1);
        for (what, ip) in [("SYN", syn), ("echo request", ping)] {
            r.drop_frame(
                what,
                &from_server(&env, &ip),
                r.wan(),
                Counter::Drop6Unsolicited,
            );
        }
        assert_eq!(r.next_hops_noted(), 0, "NEXT_HOPS noted by dropped packets");
    });
}

/// RFC 6092 from the WAN: unsolicited TCP/UDP/mid-stream TCP to a LAN host
/// dropped; to the router's own addresses passed; through a pinhole a SYN
/// opens a flow whose reply goes out; LAN -> LAN routing is the kernel's.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn inbound6_unsolicited_dropped_pinhole_opens() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let syn = Ipv6::tcp(s, c, &Tcp::new(50000, 22, TCP_SYN));
        r.drop_frame(
            "unsolicited SYN",
            &from_server(&env, &syn),
            wan,
            Counter::Drop6Unsolicited,
        );
        let ack = Ipv6::tcp(s, c, &Tcp::new(50000, 22, TCP_ACK));
        r.drop_frame(
            "unsolicited ACK",
            &from_server(&env, &ack),
            wan,
            Counter::Drop6Unsolicited,
        );
        let udp = Ipv6::udp(s, c, &Udp::new(50000, 5060, b"INVITE"));
        r.drop_frame(
            "unsolicited UDP",
            &from_server(&env, &udp),
            wan,
            Counter::Drop6Unsolicited,
        );
        let nobody = Ipv6::udp(s, o(LAN_NOBODY6), &Udp::new(50000, 5060, b"scan"));
        r.drop_frame(
            "unsolicited UDP to an unresolved LAN address",
            &from_server(&env, &nobody),
            wan,
            Counter::Drop6Unsolicited,
        );
        for router in [ROUTER_WAN6, ROUTER_LAN6] {
            let own = Ipv6::tcp(s, o(router), &Tcp::new(50000, 22, TCP_SYN));
            r.pass(
                "SYN to the router itself",
                &from_server(&env, &own),
                wan,
                Counter::PassFibNotForwarded,
            );
        }
        let lan_to_router = Ipv6::udp(c, o(ROUTER_LAN6), &Udp::new(546, 547, b"dhcp"));
        r.pass(
            "LAN to the router itself",
            &from_client(&env, &lan_to_router),
            lan,
            Counter::PassFibNotForwarded,
        );
        r.assert_flows("nothing opened", &[]);

        r.pinhole(c, IPPROTO_TCP, 22);
        r.drop_frame(
            "ACK through the pinhole opens nothing",
            &from_server(&env, &ack),
            wan,
            Counter::Drop6Unsolicited,
        );
        r.drop_frame(
            "UDP to the TCP pinhole's port",
            &from_server(&env, &Ipv6::udp(s, c, &Udp::new(50000, 22, b"x"))),
            wan,
            Counter::Drop6Unsolicited,
        );
        r.redirect(
            "SYN through the pinhole",
            &from_server(&env, &syn),
            wan,
            &to_client(&env, &syn),
            Counter::Fwd6Inbound,
            &[Counter::Flow6NewPinhole],
        );
        let k = key(SERVER6, 50000, CLIENT6, 22, IPPROTO_TCP);
        let syn_ack = Ipv6::tcp(c, s, &Tcp::syn_ack_to(&Tcp::new(50000, 22, TCP_SYN)));
        r.redirect(
            "SYN-ACK out",
            &from_client(&env, &syn_ack),
            lan,
            &to_server(&env, &syn_ack),
            Counter::Fwd6Outbound,
            &[],
        );
        r.assert_flows(
            "pinhole flow",
            &[
                (
                    k,
                    FlowState::TcpEstablished,
                    FLAG_ORIGINAL | FLAG_PORT_FORWARD,
                ),
                (k.reversed(), FlowState::TcpEstablished, FLAG_PORT_FORWARD),
            ],
        );
        r.redirect(
            "data in",
            &from_server(&env, &ack),
            wan,
            &to_client(&env, &ack),
            Counter::Fwd6Inbound,
            &[],
        );
    });
}

/// A flow that lost one direction's entry (the LRU evicted it, or a flush)
/// while the other lives gets it back from the other at the next packet
/// either way, and the packet is the flow's: a WAN packet is not dropped as
/// unsolicited nor taken by a pinhole on the same tuple. A live entry on a
/// new flow's reverse tuple that is not the other half of this packet's
/// flow keeps it (`pass_reply_tuple_taken`, as IPv4 keeps a live flow's
/// reply tuple); once expired, the pinhole opens its flow over it
/// (`flow_expired_replaced`).
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn a_lost_half_comes_back_and_a_live_entry_keeps_its_tuple() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        r.pinhole(c, IPPROTO_UDP, 5060);
        let out = Ipv6::udp(c, s, &Udp::new(5060, 5060, b"REGISTER"));
        r.redirect(
            "outbound flow from the pinholed port",
            &from_client(&env, &out),
            lan,
            &to_server(&env, &out),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        let k = key(CLIENT6, 5060, SERVER6, 5060, IPPROTO_UDP);
        let live = r.conntrack6()[&k];
        let inbound = Ipv6::udp(s, c, &Udp::new(5060, 5060, b"INVITE"));
        for (what, lost, from, frame, to, fwd) in [
            (
                "the server's packet after the WAN-side entry was lost",
                k.reversed(),
                wan,
                from_server(&env, &inbound),
                to_client(&env, &inbound),
                Counter::Fwd6Inbound,
            ),
            (
                "the client's packet after the LAN-side entry was lost",
                k,
                lan,
                from_client(&env, &out),
                to_server(&env, &out),
                Counter::Fwd6Outbound,
            ),
        ] {
            r.remove6(&lost);
            r.redirect(
                what,
                &frame,
                from,
                &to,
                fwd,
                &[Counter::Eviction6Detected, Counter::Ct6EntriesInserted],
            );
            r.assert_flows(
                what,
                &[
                    (k, FlowState::UdpReplied, FLAG_ORIGINAL),
                    (k.reversed(), FlowState::UdpReplied, 0),
                ],
            );
        }
        assert_eq!(
            r.conntrack6()[&k].created_ns,
            live.created_ns,
            "the same flow"
        );

        // A live entry on the reverse tuple that is no half of this
        // packet's flow (its side is the packet's own: not something a
        // real flow leaves, so written here): kept, the packet passed.
        r.remove6(&k.reversed());
        let alien = FlowEntry6 {
            flags: 0,
            ..r.conntrack6()[&k]
        };
        r.put6(&k, &alien);
        r.pass(
            "pinhole packet whose reverse tuple a live entry holds",
            &from_server(&env, &inbound),
            wan,
            Counter::PassReplyTupleTaken,
        );
        let after = r.conntrack6();
        assert_eq!(
            after.keys().collect::<Vec<_>>(),
            vec![&k],
            "only that entry"
        );
        assert_eq!(after[&k], alien, "untouched");

        // Expired: the pinhole's flow replaces it.
        r.put6(
            &k,
            &FlowEntry6 {
                last_seen_ns: 1,
                created_ns: 1,
                ..alien
            },
        );
        r.redirect(
            "pinhole over an expired entry",
            &from_server(&env, &inbound),
            wan,
            &to_client(&env, &inbound),
            Counter::Fwd6Inbound,
            &[Counter::Flow6NewPinhole, Counter::FlowExpiredReplaced],
        );
        r.assert_flows(
            "the pinhole's flow",
            &[
                (
                    k.reversed(),
                    FlowState::UdpUnreplied,
                    FLAG_ORIGINAL | FLAG_PORT_FORWARD,
                ),
                (k, FlowState::UdpUnreplied, FLAG_PORT_FORWARD),
            ],
        );
    });
}

/// Offload mode: a miss is the kernel's in both directions (netfilter
/// admits; the daemon offloads the flow once established).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_mode6_passes_misses() {
    let env = topology();
    with_router(&env, config(&env, Admit::Kernel), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let out = Ipv6::tcp(c, s, &Tcp::new(40000, 443, TCP_SYN));
        r.pass(
            "SYN out",
            &from_client(&env, &out),
            lan,
            Counter::PassNotOffloaded,
        );
        let inb = Ipv6::tcp(s, c, &Tcp::new(50000, 22, TCP_SYN));
        r.pass(
            "SYN in",
            &from_server(&env, &inb),
            wan,
            Counter::PassNotOffloaded,
        );
        let ping = Ipv6::echo(s, c, false, 1, 1);
        r.pass(
            "echo request in",
            &from_server(&env, &ping),
            wan,
            Counter::PassNotOffloaded,
        );
        r.assert_flows("nothing opened", &[]);
    });
}

/// Larger than the egress MTU: passed for the kernel's Packet Too Big,
/// both for a new flow and on a hit (the cached hop's MTU is checked).
/// The new flow opens all the same: the sender's next packets (smaller,
/// or fragments) and its replies (fragmented ones pass the inbound filter
/// only as a known flow's) belong to it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn oversize6_passed_for_packet_too_big() {
    let env = topology();
    env.t.exec_ok(
        tests::Ns::Router,
        &["ip", "link", "set", tests::WAN_IF, "mtu", "1280"],
    );
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let lan = r.lan();
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let big = Ipv6::udp(c, s, &Udp::new(5000, 6000, &[7; 1300]));
        let frame = from_client(&env, &big);
        r.check(
            "oversize first packet",
            &frame,
            lan,
            XDP_PASS,
            &frame,
            Counter::Pass6PacketTooBig,
            &[Counter::Flow6NewOutbound],
        );
        let k = key(CLIENT6, 5000, SERVER6, 6000, IPPROTO_UDP);
        let reply = key(SERVER6, 6000, CLIENT6, 5000, IPPROTO_UDP);
        let flows = r.conntrack6();
        assert!(
            flows.contains_key(&k) && flows.contains_key(&reply),
            "the oversize packet's flow: {flows:?}"
        );
        // Exactly the MTU fits.
        let fits = Ipv6::udp(c, s, &Udp::new(5000, 6000, &[7; 1280 - 48]));
        r.redirect(
            "1280 bytes",
            &from_client(&env, &fits),
            lan,
            &to_server(&env, &fits),
            Counter::Fwd6Outbound,
            &[],
        );
        r.redirect(
            "again (caches the hop)",
            &from_client(&env, &fits),
            lan,
            &to_server(&env, &fits),
            Counter::Fwd6Outbound,
            &[],
        );
        assert_eq!(r.conntrack6()[&k].hop_mtu, 1280);
        r.pass(
            "oversize on a hit",
            &from_client(&env, &big),
            lan,
            Counter::Pass6PacketTooBig,
        );
    });
}

/// A cached next hop that the FIB refuses at a refresh (a blackhole route
/// to the peer) is forgotten: the packets after the refused one are passed
/// too, not redirected to the old hop until the next refresh; once the
/// route is back the FIB's hop is cached again.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn hop6_refused_at_a_refresh_is_forgotten() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let q = Ipv6::udp(c, s, &Udp::new(5001, 6001, b"q"));
        let (frame, out) = (from_client(&env, &q), to_server(&env, &q));
        let fwd = Counter::Fwd6Outbound;
        r.redirect("open", &frame, lan, &out, fwd, &[Counter::Flow6NewOutbound]);
        r.redirect("again (caches the hop)", &frame, lan, &out, fwd, &[]);
        let k = key(CLIENT6, 5001, SERVER6, 6001, IPPROTO_UDP);
        assert_eq!(r.conntrack6()[&k].hop_ifindex, wan, "cached");

        let server = SERVER6.to_string();
        env.t.exec_ok(
            tests::Ns::Router,
            &["ip", "-6", "route", "add", "blackhole", &server],
        );
        let mut due = r.conntrack6()[&k];
        due.last_seen_ns -= 2 * router_common::flow::REFRESH_NS;
        r.put6(&k, &due);
        let refused = Counter::PassFibNotForwarded;
        r.pass("refused at the refresh", &frame, lan, refused);
        assert_eq!(r.conntrack6()[&k].hop_ifindex, 0, "cached hop forgotten");
        r.pass("refused again, not the old hop", &frame, lan, refused);
        env.t.exec_ok(
            tests::Ns::Router,
            &["ip", "-6", "route", "del", "blackhole", &server],
        );
        r.redirect("route back", &frame, lan, &out, fwd, &[]);
        assert_eq!(r.conntrack6()[&k].hop_ifindex, wan, "cached again");

        // Over the route's MTU (1500): the kernel's (Packet Too Big), and
        // the route is fine, so the flow keeps its cached hop.
        let big = Ipv6::udp(c, s, &Udp::new(5001, 6001, &[7; 1500]));
        r.pass(
            "over the MTU",
            &from_client(&env, &big),
            lan,
            Counter::Pass6PacketTooBig,
        );
        assert_eq!(
            r.conntrack6()[&k].hop_ifindex,
            wan,
            "an oversize packet kept the cache"
        );
    });
}

/// An unsolicited WAN packet larger than the LAN's MTU is dropped like a
/// small one (RFC 6092 3: unsolicited inbound traffic is discarded), not
/// passed for the kernel to answer with Packet Too Big, which would tell a
/// scanner that the address is routed; an `ICMPv6` error quoting no flow
/// likewise. A pinhole's or a known flow's oversize packet is still passed
/// for Packet Too Big (path-MTU discovery).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn oversize6_unsolicited_dropped_not_answered() {
    let env = topology();
    env.t.exec_ok(
        tests::Ns::Router,
        &["ip", "link", "set", tests::LAN_IF, "mtu", "1280"],
    );
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let big = Ipv6::udp(s, c, &Udp::new(4444, 9999, &[7; 1400]));
        r.drop_frame(
            "oversize unsolicited UDP",
            &from_server(&env, &big),
            wan,
            Counter::Drop6Unsolicited,
        );
        let quoted = Ipv6::udp(c, s, &Udp::new(5001, 6000, &[1; 1300])).bytes();
        let error = Ipv6::error(s, c, tests::v6::ICMP6_DEST_UNREACH, 0, &quoted);
        r.drop_frame(
            "oversize ICMPv6 error quoting no flow",
            &from_server(&env, &error),
            wan,
            Counter::Drop6Unsolicited,
        );
        r.assert_flows("nothing opened", &[]);

        r.pinhole(c, IPPROTO_UDP, 9999);
        let frame = from_server(&env, &big);
        r.check(
            "oversize through a pinhole (opens the pinhole's flow)",
            &frame,
            wan,
            XDP_PASS,
            &frame,
            Counter::Pass6PacketTooBig,
            &[Counter::Flow6NewPinhole],
        );
        let out = Ipv6::udp(c, s, &Udp::new(5000, 6000, b"hello"));
        r.redirect(
            "flow out",
            &from_client(&env, &out),
            lan,
            &to_server(&env, &out),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        let reply = Ipv6::udp(s, c, &Udp::new(6000, 5000, &[7; 1400]));
        r.pass(
            "oversize reply of a known flow",
            &from_server(&env, &reply),
            wan,
            Counter::Pass6PacketTooBig,
        );
    });
}

/// The current lease tick, waited for until it is at least 50 ms old and
/// has 250 ms to go: the program's coarse clock may lag a few ms, and the
/// packets that follow must all fall in this same tick.
fn settled_lease_tick() -> u32 {
    let tick_ns = 1u64 << router_common::maps::LEASE_TICK_SHIFT;
    loop {
        let now = now_ns();
        let into = now % tick_ns;
        if (50_000_000..tick_ns - 250_000_000).contains(&into) {
            return lease_tick(now);
        }
        std::thread::sleep(std::time::Duration::from_millis(60));
    }
}

/// Both entries of an offloaded flow opened by `orig` from the LAN, as the
/// daemon writes them: `FLAG_OFFLOADED`, the kernel's state, `lease`.
fn offloaded(
    r: &mut Router6,
    orig: &FlowKey6,
    state: FlowState,
    lease: u32,
) -> [(FlowKey6, FlowEntry6); 2] {
    let now = now_ns();
    let e = |flags| FlowEntry6 {
        last_seen_ns: now,
        created_ns: now,
        state: state as u8,
        flags: flags | FLAG_OFFLOADED,
        lease,
        ..FlowEntry6::default()
    };
    let pair = [(*orig, e(FLAG_ORIGINAL)), (orig.reversed(), e(0))];
    for (k, v) in &pair {
        r.put6(k, v);
    }
    pair
}

/// Offload mode, an offloaded TCP flow within its lease: data both ways
/// forwarded exactly; FIN, RST and SYN go to the kernel (which owns the
/// flow's TCP state and must see its teardown), the first of them hands
/// the flow back (both entries' lease ends, state and flags unchanged), and
/// the flow's data goes to the kernel after it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offloaded_tcp6_forwarded_and_control_segments_passed() {
    let env = topology();
    with_router(&env, config(&env, Admit::Kernel), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let orig = key(CLIENT6, 40000, SERVER6, 443, IPPROTO_TCP);
        let lease = lease_tick(now_ns()) + 60;
        offloaded(r, &orig, FlowState::TcpEstablished, lease);
        let data = Ipv6::tcp(
            c,
            s,
            &Tcp::new(40000, 443, TCP_ACK | TCP_PSH).payload(b"hi"),
        );
        r.redirect(
            "data out",
            &from_client(&env, &data),
            lan,
            &to_server(&env, &data),
            Counter::Fwd6Outbound,
            &[],
        );
        let answer = Ipv6::tcp(s, c, &Tcp::new(443, 40000, TCP_ACK).payload(&[0x5a; 600]));
        r.redirect(
            "data in",
            &from_server(&env, &answer),
            wan,
            &to_client(&env, &answer),
            Counter::Fwd6Inbound,
            &[],
        );
        for (what, flags, from_lan) in [
            ("FIN out", TCP_FIN | TCP_ACK, true),
            ("FIN in", TCP_FIN | TCP_ACK, false),
            ("RST in", TCP_RST, false),
            ("RST out", TCP_RST | TCP_ACK, true),
            ("SYN out", TCP_SYN, true),
        ] {
            let (frame, ifindex) = if from_lan {
                let p = Ipv6::tcp(c, s, &Tcp::new(40000, 443, flags));
                (from_client(&env, &p), lan)
            } else {
                let p = Ipv6::tcp(s, c, &Tcp::new(443, 40000, flags));
                (from_server(&env, &p), wan)
            };
            r.pass(what, &frame, ifindex, Counter::PassOffloadTcpControl);
        }
        r.pass(
            "data out after the hand-back",
            &from_client(&env, &data),
            lan,
            Counter::PassOffloadHandedBack,
        );
        r.pass(
            "data in after the hand-back",
            &from_server(&env, &answer),
            wan,
            Counter::PassOffloadHandedBack,
        );
        r.assert_flows(
            "control segments changed no state",
            &[
                (
                    orig,
                    FlowState::TcpEstablished,
                    FLAG_ORIGINAL | FLAG_OFFLOADED,
                ),
                (orig.reversed(), FlowState::TcpEstablished, FLAG_OFFLOADED),
            ],
        );
        for k in [orig, orig.reversed()] {
            assert_eq!(
                r.conntrack6()[&k].lease,
                LEASE_HANDED_BACK,
                "lease of {k:?} (was {lease})"
            );
        }
    });
}

/// Offload mode, IPv6 (as IPv4's
/// `offloaded_connection_carries_a_blind_rst_and_hands_back_a_true_one`):
/// the entries learn their windows from the first ACK each way; a RST from
/// the WAN outside the client's window is carried to it and changes
/// nothing (RFC 5961 3.2), a FIN likewise; one in the window hands the
/// connection back.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offloaded_tcp6_carries_a_blind_rst_and_hands_back_a_true_one() {
    use router_common::maps::{TCP_TRACK_KNOWN, TCP_TRACK_LEARN, TcpWindow};
    let env = topology();
    with_router(&env, config(&env, Admit::Kernel), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let orig = key(CLIENT6, 40000, SERVER6, 443, IPPROTO_TCP);
        let lease = lease_tick(now_ns()) + 60;
        for (k, mut e) in offloaded(r, &orig, FlowState::TcpEstablished, lease) {
            e.tcp = TcpWindow {
                wscale: 7,
                flags: TCP_TRACK_LEARN,
                ..TcpWindow::default()
            };
            r.put6(&k, &e);
        }
        let seg = |sport, dport, seq, ack, window, flags| Tcp {
            seq,
            ack,
            window,
            ..Tcp::new(sport, dport, flags)
        };
        let data = Ipv6::tcp(c, s, &seg(40000, 443, 1000, 5000, 500, TCP_ACK));
        r.redirect(
            "data out",
            &from_client(&env, &data),
            lan,
            &to_server(&env, &data),
            Counter::Fwd6Outbound,
            &[],
        );
        assert_eq!(
            r.conntrack6()[&orig].tcp,
            TcpWindow {
                ack: 5000,
                win: 500,
                wscale: 7,
                flags: TCP_TRACK_KNOWN
            }
        );
        let answer = Ipv6::tcp(s, c, &seg(443, 40000, 5000, 1000, 300, TCP_ACK));
        r.redirect(
            "data in",
            &from_server(&env, &answer),
            wan,
            &to_client(&env, &answer),
            Counter::Fwd6Inbound,
            &[],
        );
        for (what, flags) in [
            ("blind RST in", TCP_RST),
            ("blind FIN in", TCP_FIN | TCP_ACK),
        ] {
            // Before what the client acknowledged: in the server's own
            // window, out of the receiver's (the client's).
            let blind = Ipv6::tcp(s, c, &seg(443, 40000, 1010, 1000, 300, flags));
            r.redirect(
                what,
                &from_server(&env, &blind),
                wan,
                &to_client(&env, &blind),
                Counter::Fwd6Inbound,
                &[Counter::TcpOutOfWindow],
            );
            for k in [orig, orig.reversed()] {
                let e = r.conntrack6()[&k];
                assert_eq!(
                    (e.lease, e.state),
                    (lease, FlowState::TcpEstablished as u8),
                    "{what}: {k:?}"
                );
            }
        }
        let rst = Ipv6::tcp(s, c, &seg(443, 40000, 5000, 0, 0, TCP_RST));
        r.pass(
            "RST in, in the window",
            &from_server(&env, &rst),
            wan,
            Counter::PassOffloadTcpControl,
        );
        for k in [orig, orig.reversed()] {
            assert_eq!(r.conntrack6()[&k].lease, LEASE_HANDED_BACK, "{k:?}");
        }
    });
}

/// The offload daemon's lease compare-and-swap (the real program), loaded
/// against this router's `CONNTRACK6`.
fn lease_cas6(r: &Router6) -> LeaseCas {
    use aya::maps::IterableMap as _;
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let m: HashMap<_, FlowKey6, FlowEntry6> =
        HashMap::try_from(r.0.ebpf.map(CONNTRACK6_MAP).expect("CONNTRACK6")).unwrap();
    let fd = m.map().fd().as_fd().as_raw_fd();
    LeaseCas::load(&lease_cas::conntrack6_program(fd)).expect("load the lease compare-and-swap")
}

/// Offload mode, the daemon's write in two steps: entries written pending
/// (`LEASE_PENDING`) pass every packet to the kernel untouched; a SYN (the
/// next connection on the ports) or FIN on a pending entry hands both back
/// as on a live one; and the daemon's compare-and-swap activates a lease
/// only from pending, so it fails on a pair handed back meanwhile.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn pending6_offload_passes_hands_back_and_activates_only_from_pending() {
    let env = topology();
    with_router(&env, config(&env, Admit::Kernel), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let cas = lease_cas6(r);
        let orig = key(CLIENT6, 40001, SERVER6, 443, IPPROTO_TCP);
        let pair = offloaded(r, &orig, FlowState::TcpEstablished, LEASE_PENDING);
        let data = Ipv6::tcp(
            c,
            s,
            &Tcp::new(40001, 443, TCP_ACK | TCP_PSH).payload(b"hi"),
        );
        let answer = Ipv6::tcp(s, c, &Tcp::new(443, 40001, TCP_ACK).payload(b"ho"));
        r.pass(
            "data out, pending",
            &from_client(&env, &data),
            lan,
            Counter::PassOffloadPending,
        );
        r.pass(
            "data in, pending",
            &from_server(&env, &answer),
            wan,
            Counter::PassOffloadPending,
        );
        for (k, e) in &pair {
            assert_eq!(r.conntrack6()[k], *e, "pending entry {k:?} untouched");
        }
        // Activation, reply direction first as the daemon does: only from
        // pending.
        let lease = lease_tick(now_ns()) + 60;
        for k in [orig.reversed(), orig] {
            let swap = cas.swap(LeaseCasCtx::v6(&k, LEASE_PENDING, lease)).unwrap();
            assert_eq!(swap, LeaseSwap::Swapped, "activate {k:?}");
            let again = cas
                .swap(LeaseCasCtx::v6(&k, LEASE_PENDING, lease + 1))
                .unwrap();
            assert_eq!(again, LeaseSwap::Changed(lease), "activate {k:?} again");
            assert_eq!(r.conntrack6()[&k].lease, lease);
        }
        r.redirect(
            "data out, activated",
            &from_client(&env, &data),
            lan,
            &to_server(&env, &data),
            Counter::Fwd6Outbound,
            &[],
        );
        // A renewal from the lease read.
        let renewed = cas.swap(LeaseCasCtx::v6(&orig, lease, lease + 5)).unwrap();
        assert_eq!(renewed, LeaseSwap::Swapped);
        // A pair written pending, then a SYN of the client's next
        // connection on the same ports (or the FIN of this one) before the
        // activation: handed back, and the activation fails.
        for (what, flags, from_lan) in [
            ("SYN out", TCP_SYN, true),
            ("FIN in", TCP_FIN | TCP_ACK, false),
        ] {
            offloaded(r, &orig, FlowState::TcpEstablished, LEASE_PENDING);
            let (frame, ifindex) = if from_lan {
                let p = Ipv6::tcp(c, s, &Tcp::new(40001, 443, flags));
                (from_client(&env, &p), lan)
            } else {
                let p = Ipv6::tcp(s, c, &Tcp::new(443, 40001, flags));
                (from_server(&env, &p), wan)
            };
            r.pass(what, &frame, ifindex, Counter::PassOffloadTcpControl);
            for k in [orig.reversed(), orig] {
                assert_eq!(r.conntrack6()[&k].lease, LEASE_HANDED_BACK, "{what}: {k:?}");
                let swap = cas.swap(LeaseCasCtx::v6(&k, LEASE_PENDING, lease)).unwrap();
                assert_eq!(
                    swap,
                    LeaseSwap::Changed(LEASE_HANDED_BACK),
                    "{what}: activate {k:?}"
                );
                assert_eq!(r.conntrack6()[&k].lease, LEASE_HANDED_BACK);
            }
        }
        // No entry: nothing written.
        let other = key(CLIENT6, 40002, SERVER6, 443, IPPROTO_TCP);
        let gone = cas
            .swap(LeaseCasCtx::v6(&other, LEASE_PENDING, lease))
            .unwrap();
        assert_eq!(gone, LeaseSwap::Gone);
        assert!(!r.conntrack6().contains_key(&other));
    });
}

/// Offload mode, the lease: UDP and `ICMPv6` echo of an offloaded flow go
/// through XDP while the lease runs (its last tick included) and to the
/// kernel once it ended (`pass_lease_expired`), in both directions, and a
/// lease the daemon extends carries the flow again.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offloaded6_carried_only_within_the_lease() {
    let env = topology();
    with_router(&env, config(&env, Admit::Kernel), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let udp = key(CLIENT6, 5000, SERVER6, 53, IPPROTO_UDP);
        let ping = key(CLIENT6, 77, SERVER6, 77, IPPROTO_ICMPV6);
        let query = Ipv6::udp(c, s, &Udp::new(5000, 53, b"query"));
        let answer = Ipv6::udp(s, c, &Udp::new(53, 5000, b"answer"));
        let request = Ipv6::echo(c, s, false, 77, 1);
        let reply = Ipv6::echo(s, c, true, 77, 1);
        // Within the lease: the current tick is still inside.
        let now = settled_lease_tick();
        offloaded(r, &udp, FlowState::UdpReplied, now);
        offloaded(r, &ping, FlowState::Icmp, now + 5);
        for (what, p, from_lan) in [
            ("UDP out", &query, true),
            ("UDP in", &answer, false),
            ("echo request out", &request, true),
            ("echo reply in", &reply, false),
        ] {
            let (frame, ifindex, expect, counter) = if from_lan {
                (
                    from_client(&env, p),
                    lan,
                    to_server(&env, p),
                    Counter::Fwd6Outbound,
                )
            } else {
                (
                    from_server(&env, p),
                    wan,
                    to_client(&env, p),
                    Counter::Fwd6Inbound,
                )
            };
            r.redirect(what, &frame, ifindex, &expect, counter, &[]);
        }
        // Lease over: the kernel carries the flow (it still has it).
        let ended = settled_lease_tick() - 1;
        offloaded(r, &udp, FlowState::UdpReplied, ended);
        offloaded(r, &ping, FlowState::Icmp, ended);
        for (what, p, from_lan) in [
            ("UDP out after the lease", &query, true),
            ("UDP in after the lease", &answer, false),
            ("echo request out after the lease", &request, true),
            ("echo reply in after the lease", &reply, false),
        ] {
            let (frame, ifindex) = if from_lan {
                (from_client(&env, p), lan)
            } else {
                (from_server(&env, p), wan)
            };
            r.pass(what, &frame, ifindex, Counter::PassLeaseExpired);
        }
        r.assert_flows(
            "the entries stay (the daemon or the kernel's DESTROY removes them)",
            &[
                (udp, FlowState::UdpReplied, FLAG_ORIGINAL | FLAG_OFFLOADED),
                (udp.reversed(), FlowState::UdpReplied, FLAG_OFFLOADED),
                (ping, FlowState::Icmp, FLAG_ORIGINAL | FLAG_OFFLOADED),
                (ping.reversed(), FlowState::Icmp, FLAG_OFFLOADED),
            ],
        );
        // The daemon renews the lease: XDP carries the flow again.
        offloaded(r, &udp, FlowState::UdpReplied, lease_tick(now_ns()) + 30);
        r.redirect(
            "UDP in after the renewal",
            &from_server(&env, &answer),
            wan,
            &to_client(&env, &answer),
            Counter::Fwd6Inbound,
            &[],
        );
        // One entry gone (the daemon removing the pair it ends, one entry
        // at a time): the other does not bring it back, the kernel decides
        // (its firewall, not a lease the daemon has forgotten).
        r.remove6(&udp.reversed());
        r.pass(
            "UDP in with the WAN-side entry gone",
            &from_server(&env, &answer),
            wan,
            Counter::PassNotOffloaded,
        );
        assert!(
            !r.conntrack6().contains_key(&udp.reversed()),
            "offload mode put the entry back"
        );
    });
}

/// IPv6 frames not link-layer addressed to the router (broadcast, IPv6
/// multicast, another host's MAC) are passed untouched as
/// `pass_not_for_us` (RFC 1812 5.3.4, the kernel's `PACKET_HOST` rule):
/// an established flow's packets both ways leave its entries as they were
/// (state, times, counts), and a new flow's first packet opens nothing;
/// from the WAN one of no flow to a LAN host is dropped
/// (`drop6_unsolicited`), as standalone mode judges them.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn udp6_frames_not_for_the_router_are_passed() {
    use tests::frames::{BROADCAST_MAC, IPV6_MULTICAST_MAC, NOBODY_MAC};
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let q = Ipv6::udp(c, s, &Udp::new(5353, 53, b"query"));
        let a = Ipv6::udp(s, c, &Udp::new(53, 5353, b"answer"));
        r.redirect(
            "UDP out",
            &from_client(&env, &q),
            lan,
            &to_server(&env, &q),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        r.redirect(
            "UDP reply",
            &from_server(&env, &a),
            wan,
            &to_client(&env, &a),
            Counter::Fwd6Inbound,
            &[],
        );
        let before = r.conntrack6();
        let new = Ipv6::udp(c, s, &Udp::new(5354, 53, b"new flow"));
        for mac in [BROADCAST_MAC, IPV6_MULTICAST_MAC, NOBODY_MAC] {
            for (what, frame, ingress) in [
                ("LAN, flow", q.frame(mac, env.client_mac), lan),
                ("LAN, new flow", new.frame(mac, env.client_mac), lan),
                ("WAN, flow", a.frame(mac, env.server_mac), wan),
            ] {
                r.pass(
                    &format!("{what} to {mac:02x?}"),
                    &frame,
                    ingress,
                    Counter::PassNotForUs,
                );
            }
        }
        // Standalone's inbound filter all the same (a macvlan on the WAN
        // would take it in): unsolicited to a LAN host, dropped.
        let knock = Ipv6::udp(s, c, &Udp::new(53, 5399, b"knock"));
        for mac in [BROADCAST_MAC, IPV6_MULTICAST_MAC, NOBODY_MAC] {
            r.drop_frame(
                &format!("WAN, no flow, to {mac:02x?}"),
                &knock.frame(mac, env.server_mac),
                wan,
                Counter::Drop6Unsolicited,
            );
        }
        assert_eq!(r.conntrack6(), before, "no entry opened or changed");
    });
}

/// keepalived `use_vmac` over IPv6: a frame to a virtual MAC accepted for
/// IPv6 on the ingress interface is forwarded with the same output bytes
/// as one to the router's own MAC; one accepted for IPv4 only, and an
/// IPv6 VRID's MAC accepted on the other interface, are passed as
/// `pass_not_for_us`.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn udp6_frames_to_an_accepted_virtual_mac_are_forwarded() {
    use router_common::maps::{VMAC_IPV4, VMAC_IPV6};
    // RFC 5798 7.3: 00:00:5e:00:02:VRID for IPv6, 00:00:5e:00:01:VRID for IPv4.
    const VMAC6: [u8; 6] = [0, 0, 0x5e, 0, 2, 61];
    const VMAC4: [u8; 6] = [0, 0, 0x5e, 0, 1, 61];
    const WAN_VMAC6: [u8; 6] = [0, 0, 0x5e, 0, 2, 62];
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        r.0.accept_virtual_mac(lan, VMAC6, VMAC_IPV6);
        r.0.accept_virtual_mac(lan, VMAC4, VMAC_IPV4);
        r.0.accept_virtual_mac(wan, WAN_VMAC6, VMAC_IPV6);
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let q = Ipv6::udp(c, s, &Udp::new(5353, 53, b"query"));
        let a = Ipv6::udp(s, c, &Udp::new(53, 5353, b"answer"));
        r.redirect(
            "UDP out to the LAN's IPv6 virtual MAC",
            &q.frame(VMAC6, env.client_mac),
            lan,
            &to_server(&env, &q),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        r.redirect(
            "UDP reply to the WAN's IPv6 virtual MAC",
            &a.frame(WAN_VMAC6, env.server_mac),
            wan,
            &to_client(&env, &a),
            Counter::Fwd6Inbound,
            &[],
        );
        let before = r.conntrack6();
        for (what, frame, ingress) in [
            (
                "LAN to an IPv4-only virtual MAC",
                q.frame(VMAC4, env.client_mac),
                lan,
            ),
            (
                "WAN to the LAN's virtual MAC",
                a.frame(VMAC6, env.server_mac),
                wan,
            ),
            (
                "LAN to the WAN's virtual MAC",
                q.frame(WAN_VMAC6, env.client_mac),
                lan,
            ),
        ] {
            r.pass(what, &frame, ingress, Counter::PassNotForUs);
        }
        assert_eq!(r.conntrack6(), before, "no entry opened or changed");
    });
}

/// Standalone mode opens a flow only for a source its sender may use from
/// that side (RFC 6092 3.1, BCP 38): from the LAN one the FIB routes back
/// out of the LAN (any host of the LAN prefix, resolved or not), from the
/// WAN one it routes elsewhere than to the LAN and not the router's own.
/// A spoofed source opens nothing and is dropped, counted
/// `drop6_spoofed_source`; a source that is fine opens its flow as before.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn spoofed_sources_open_no_flow() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let foreign = o(std::net::Ipv6Addr::new(
            0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 9,
        ));
        let other_server = o(std::net::Ipv6Addr::new(0x2001, 0xdb8, 0x71, 0, 0, 0, 0, 7));
        for (what, src, dst) in [
            ("another network's prefix", foreign, s),
            ("the router's LAN address", o(ROUTER_LAN6), s),
            ("the router's WAN address", o(ROUTER_WAN6), s),
            ("a WAN host's address", s, other_server),
        ] {
            let p = Ipv6::udp(src, dst, &Udp::new(40000, 53, b"query"));
            r.drop_frame(
                &format!("from the LAN with {what} as source"),
                &from_client(&env, &p),
                lan,
                Counter::Drop6SpoofedSource,
            );
        }
        r.assert_flows("nothing opened from the LAN", &[]);

        r.pinhole(c, IPPROTO_TCP, 22);
        for (what, src) in [
            ("a LAN address", o(LAN_NOBODY6)),
            ("the router's WAN address", o(ROUTER_WAN6)),
        ] {
            let syn = Ipv6::tcp(src, c, &Tcp::new(50000, 22, TCP_SYN));
            r.drop_frame(
                &format!("SYN through the pinhole from the WAN with {what} as source"),
                &from_server(&env, &syn),
                wan,
                Counter::Drop6SpoofedSource,
            );
        }
        r.assert_flows("nothing opened from the WAN", &[]);

        // The same shapes with sources that are fine open their flows: a
        // LAN host (one not resolved yet too) and a WAN host.
        for src in [c, o(LAN_NOBODY6)] {
            let p = Ipv6::udp(src, s, &Udp::new(40000, 53, b"query"));
            r.redirect(
                "from the LAN with a LAN address as source",
                &from_client(&env, &p),
                lan,
                &to_server(&env, &p),
                Counter::Fwd6Outbound,
                &[Counter::Flow6NewOutbound],
            );
        }
        let syn = Ipv6::tcp(s, c, &Tcp::new(50000, 22, TCP_SYN));
        r.redirect(
            "SYN through the pinhole from a WAN host",
            &from_server(&env, &syn),
            wan,
            &to_client(&env, &syn),
            Counter::Fwd6Inbound,
            &[Counter::Flow6NewPinhole],
        );
        assert_eq!(r.conntrack6().len(), 6, "three flows, two entries each");
    });
}

/// Offload mode: an offloaded flow's half the LRU evicted comes back from
/// the other at its next refresh, with the same lease, so the flow stays
/// on the fast path both ways; a flow the daemon is ending (it hands both
/// leases back, then removes the entries one after the other) is passed
/// to the kernel from the half left, which rebuilds nothing, so no entry
/// with a live lease carries a flow the kernel ended.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_offloaded_flows_lost_half_comes_back_unless_it_is_being_ended() {
    let env = topology();
    with_router(&env, config(&env, Admit::Kernel), |r| {
        let lan = r.lan();
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let orig = key(CLIENT6, 40001, SERVER6, 53, IPPROTO_UDP);
        let lease = lease_tick(now_ns()) + 60;
        let q = Ipv6::udp(c, s, &Udp::new(40001, 53, b"q"));
        let refresh_due = |r: &mut Router6| {
            let mut due = r.conntrack6()[&orig];
            due.last_seen_ns -= 2 * router_common::flow::REFRESH_NS;
            r.put6(&orig, &due);
        };
        // Evicted: rebuilt with the flow's lease.
        offloaded(r, &orig, FlowState::UdpReplied, lease);
        r.remove6(&orig.reversed());
        refresh_due(r);
        r.redirect(
            "the half left, a refresh due",
            &from_client(&env, &q),
            lan,
            &to_server(&env, &q),
            Counter::Fwd6Outbound,
            &[Counter::Eviction6Detected],
        );
        let back = r.conntrack6()[&orig.reversed()];
        assert_eq!(
            back.lease, lease,
            "the rebuilt half carries the flow's lease"
        );
        // Being ended: leases handed back, one half removed.
        for k in [orig, orig.reversed()] {
            let mut e = r.conntrack6()[&k];
            e.lease = LEASE_HANDED_BACK;
            r.put6(&k, &e);
        }
        r.remove6(&orig.reversed());
        refresh_due(r);
        r.pass(
            "the half left of a flow being ended",
            &from_client(&env, &q),
            lan,
            Counter::PassOffloadHandedBack,
        );
        assert!(
            !r.conntrack6().contains_key(&orig.reversed()),
            "the removed half came back"
        );
    });
}

/// IPv6 frames with priority tags (VLAN id 0: the kernel strips them and
/// forwards the packet as untagged), standalone: their tags come off and
/// each goes as its untagged frame does (the same verdict, verdict
/// counter and output): an unsolicited TCP SYN, UDP datagram, echo reply
/// or error to a LAN host dropped; a reply of a known UDP flow or ping, a
/// Packet Too Big quoting the known flow, ESP, a SYN to a pinhole let in;
/// to the router itself passed; from the LAN a forged source dropped
/// (`drop6_spoofed_source`), a LAN host's packet carried. Left as they
/// are: a VLAN id's, more than four priority tags (dropped as malformed).
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn priority_tagged_ipv6_is_judged_on_both_sides() {
    use tests::frames::with_tags as tagged;
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let q = Ipv6::udp(c, s, &Udp::new(5353, 53, b"query"));
        r.redirect(
            "UDP out",
            &from_client(&env, &q),
            lan,
            &to_server(&env, &q),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        let prio = [(0x8100, 0)];
        let stacked = [(0x88a8, 0), (0x8100, 0)];
        let syn = Ipv6::tcp(s, c, &Tcp::new(50000, 22, TCP_SYN));
        let udp = Ipv6::udp(s, c, &Udp::new(50000, 5060, b"INVITE"));
        let other = Ipv6::udp(c, s, &Udp::new(5354, 53, b"not sent"))
            .hop_limit(63)
            .bytes();
        let unknown_error = Ipv6::error(s, c, tests::v6::ICMP6_PACKET_TOO_BIG, 1280, &other);
        let unknown_pong = Ipv6::echo(s, c, true, 0x78, 1);
        for (what, p) in [
            ("SYN", &syn),
            ("UDP", &udp),
            ("Packet Too Big quoting no flow", &unknown_error),
            ("echo reply of no flow", &unknown_pong),
        ] {
            for tags in [&prio[..], &stacked[..]] {
                let what = format!("unsolicited {what} behind {} priority tag(s)", tags.len());
                let counter = like_untagged(r, &what, &from_server(&env, p), tags, wan);
                assert_eq!(counter, Some(Counter::Drop6Unsolicited), "{what}");
            }
        }
        // More than four: dropped unread, as malformed (IPv4 or IPv6).
        r.drop_frame(
            "UDP behind five priority tags",
            &tagged(&from_server(&env, &udp), &[(0x8100, 0); 5]),
            wan,
            Counter::DropMalformed,
        );
        r.pass(
            "SYN to a LAN host in VLAN 7",
            &tagged(&from_server(&env, &syn), &[(0x8100, 7)]),
            wan,
            Counter::PassNotIpv4,
        );
        let ping = Ipv6::echo(c, s, false, 0x77, 1);
        r.redirect(
            "echo request out",
            &from_client(&env, &ping),
            lan,
            &to_server(&env, &ping),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        r.pinhole(c, IPPROTO_TCP, 8022);
        let a = Ipv6::udp(s, c, &Udp::new(53, 5353, b"answer"));
        let own = Ipv6::tcp(s, o(ROUTER_WAN6), &Tcp::new(50000, 22, TCP_SYN));
        let pong = Ipv6::echo(s, c, true, 0x77, 1);
        let quoted = q.clone().hop_limit(q.hop_limit - 1).bytes();
        let too_big = Ipv6::error(s, c, tests::v6::ICMP6_PACKET_TOO_BIG, 1280, &quoted);
        let esp = Ipv6::new(s, c, 50, vec![0; 24]);
        let to_pinhole = Ipv6::tcp(s, c, &Tcp::new(50000, 8022, TCP_SYN));
        let foreign = o(std::net::Ipv6Addr::new(
            0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 9,
        ));
        let forged = Ipv6::udp(foreign, s, &Udp::new(5353, 53, b"forged"));
        let counter = like_untagged(
            r,
            "LAN: another network's source behind priority tags",
            &from_client(&env, &forged),
            &stacked,
            lan,
        );
        assert_eq!(counter, Some(Counter::Drop6SpoofedSource));
        let counter = like_untagged(
            r,
            "LAN: a LAN host's packet behind a priority tag",
            &from_client(&env, &q),
            &prio,
            lan,
        );
        assert_eq!(counter, Some(Counter::Fwd6Outbound), "carried");
        for (what, p, tags) in [
            ("a reply of the known flow", &a, &prio[..]),
            ("an echo reply of the known ping", &pong, &prio[..]),
            (
                "Packet Too Big quoting the known flow",
                &too_big,
                &stacked[..],
            ),
            ("ESP (RFC 6092 REC-21)", &esp, &prio[..]),
            ("SYN to a pinhole", &to_pinhole, &prio[..]),
            ("SYN to the router", &own, &prio[..]),
        ] {
            let what = format!("{what} behind a priority tag");
            let counter = like_untagged(r, &what, &from_server(&env, p), tags, wan);
            assert!(
                !matches!(
                    counter,
                    Some(Counter::Drop6Unsolicited | Counter::DropMalformed) | None
                ),
                "{what}: {counter:?}"
            );
        }
    });
}

/// Runs `untagged` as received on `ifindex`, then the same frame behind
/// `tags`, and asserts that both got the same verdict, verdict counter
/// and output (events aside: the untagged frame may open a flow, which the
/// tagged one then hits); the verdict counter.
fn like_untagged(
    r: &Router6,
    what: &str,
    untagged: &[u8],
    tags: &[(u16, u16)],
    ifindex: u32,
) -> Option<Counter> {
    let verdicts = |run: &tests::prog::ProgRun| -> Vec<(Counter, CounterValue)> {
        run.delta
            .iter()
            .filter(|(c, _)| !c.is_event())
            .copied()
            .collect()
    };
    let want = r.0.test_run(untagged, ifindex);
    let got =
        r.0.test_run(&tests::frames::with_tags(untagged, tags), ifindex);
    assert_eq!(
        (got.verdict, &got.out, verdicts(&got)),
        (want.verdict, &want.out, verdicts(&want)),
        "{what}"
    );
    verdicts(&got).first().map(|(c, _)| *c)
}

/// Offload mode: an `ICMPv6` error from the WAN about an offloaded flow
/// goes to the kernel (`pass_not_offloaded`), whose firewall decides on it
/// (a ruleset may accept `established` and not `related`), as IPv4's.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_mode_leaves_icmp6_errors_about_offloaded_flows_to_the_kernel() {
    use tests::v6::ICMP6_DEST_UNREACH;
    let env = topology();
    with_router(&env, config(&env, Admit::Kernel), |r| {
        let wan = r.wan();
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let orig = key(CLIENT6, 5000, SERVER6, 6000, IPPROTO_UDP);
        offloaded(r, &orig, FlowState::UdpReplied, lease_tick(now_ns()) + 60);
        let udp = Ipv6::udp(c, s, &Udp::new(5000, 6000, b"datagram"));
        let quoted = udp.clone().hop_limit(udp.hop_limit - 1).bytes();
        let e = Ipv6::error(s, c, ICMP6_DEST_UNREACH, 0, &quoted);
        r.pass(
            "unreachable from the WAN about the offloaded flow",
            &from_server(&env, &e),
            wan,
            Counter::PassNotOffloaded,
        );
    });
}

/// What the IPv6 path passes from the LAN without opening a flow (a TCP
/// segment of no flow, UDP behind a Destination Options header, a
/// later fragment, GRE) is source-checked in standalone mode as a new flow is
/// (BCP 38; Linux has no IPv6 `rp_filter`): another network's source or
/// one of the router's own is dropped (`drop6_spoofed_source`); a LAN
/// host's passes to the kernel as before; link scope is left alone;
/// offload mode passes.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn lan_passes_with_spoofed_sources_do_not_leave() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let lan = r.lan();
        let s = o(SERVER6);
        let foreign = o(std::net::Ipv6Addr::new(
            0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 9,
        ));
        let packets = |src: [u8; 16]| -> Vec<(&'static str, Ipv6, Counter)> {
            // Ports 40000 -> 53, length 9, no checksum (not verified here).
            let udp = [0x9c, 0x40, 0, 53, 0, 9, 0, 0, b'x'];
            let mut dest_opts = vec![IPPROTO_UDP, 0, 1, 4, 0, 0, 0, 0];
            dest_opts.extend_from_slice(&udp);
            // A later fragment (offset 8 bytes, more to come): a first
            // one opens its flow (`pass_drop`).
            let mut fragment = vec![IPPROTO_UDP, 0, 0, 9, 0, 0, 0, 7];
            fragment.extend_from_slice(&udp);
            vec![
                (
                    "a TCP ACK of no flow",
                    Ipv6::tcp(src, s, &Tcp::new(40000, 80, TCP_ACK)),
                    Counter::PassNoFlow,
                ),
                (
                    "UDP behind Destination Options",
                    Ipv6::new(src, s, 60, dest_opts),
                    Counter::Pass6ExtDestOpts,
                ),
                (
                    "a later UDP fragment",
                    Ipv6::new(src, s, 44, fragment),
                    Counter::Pass6ExtFragment,
                ),
                (
                    "GRE",
                    Ipv6::new(src, s, 47, vec![0; 8]),
                    Counter::PassProtocol,
                ),
            ]
        };
        let to_router =
            |src: [u8; 16]| Ipv6::udp(src, o(ROUTER_LAN6), &Udp::new(40000, 53, b"query"));
        for (who, src) in [
            ("another network's", foreign),
            ("the router's WAN", o(ROUTER_WAN6)),
            ("the router's LAN", o(ROUTER_LAN6)),
        ] {
            for (what, p, _) in packets(src) {
                r.drop_frame(
                    &format!("{what} with {who} address as source"),
                    &from_client(&env, &p),
                    lan,
                    Counter::Drop6SpoofedSource,
                );
            }
            // For the router itself: it would answer the forged source out
            // of the WAN (reflection).
            r.drop_frame(
                &format!("a DNS query to the router with {who} address as source"),
                &from_client(&env, &to_router(src)),
                lan,
                Counter::Drop6SpoofedSource,
            );
        }
        r.pass(
            "a DNS query to the router from a LAN host",
            &from_client(&env, &to_router(o(CLIENT6))),
            lan,
            Counter::PassFibNotForwarded,
        );
        for (what, p, counter) in packets(o(CLIENT6)) {
            r.pass(
                &format!("{what} from a LAN host"),
                &from_client(&env, &p),
                lan,
                counter,
            );
        }
        r.assert_flows("nothing opened", &[]);
        r.0.configure(&config(&env, Admit::Kernel));
        let (what, p, _) = packets(foreign).swap_remove(0);
        r.pass(
            &format!("offload: {what} with another network's source"),
            &from_client(&env, &p),
            lan,
            Counter::PassNotOffloaded,
        );
    });
}
