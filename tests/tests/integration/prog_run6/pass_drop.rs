//! What the IPv6 fast path leaves to the kernel or drops: extension
//! headers by kind, hop limit 0/1, link scope (NDP, RS/RA, MLD, `DHCPv6`),
//! NDP and MLD with global addresses, other protocols, and truncation or
//! inconsistent lengths at every header boundary.

use router_common::maps::{IPPROTO_TCP, IPPROTO_UDP};
use tests::frames::{TCP_SYN, Tcp, Udp};
use tests::v6::{
    CLIENT6, ICMP6_MLD2_REPORT, ICMP6_NEIGHBOUR_ADVERT, ICMP6_NEIGHBOUR_SOLICIT,
    ICMP6_ROUTER_ADVERT, ICMP6_ROUTER_SOLICIT, L4_6_OFF, ROUTER_LAN6, ROUTER_WAN6, SERVER6, o,
};

use super::*;

/// Every extension header kind, on both sides, with the next header the
/// fast path would otherwise forward (TCP after it): passed by kind from
/// the LAN, and from the WAN when addressed to the router itself; from the
/// WAN to a LAN host dropped as unsolicited (standalone mode's inbound
/// filter: a SYN behind an empty header would reach the host), but for
/// `IPsec` (RFC 6092 REC-21, REC-22). In offload mode the kernel's firewall
/// decides: all passed.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn ext_headers_hop_limit_and_link_scope_passed() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let tcp = Ipv6::tcp(c, s, &Tcp::new(40000, 80, TCP_SYN));
        // An 8-byte extension header (next header TCP, length 0) then the
        // segment; ESP/AH get the same shape (the fast path reads only
        // the fixed header's next-header byte).
        let with_ext_to = |next: u8, src: [u8; 16], dst: [u8; 16]| {
            let mut payload = vec![IPPROTO_TCP, 0, 0, 0, 0, 0, 0, 0];
            payload.extend_from_slice(&tcp.payload);
            Ipv6::new(src, dst, next, payload)
        };
        let with_ext = |next: u8, from_lan: bool| {
            let (src, dst) = if from_lan { (c, s) } else { (s, c) };
            with_ext_to(next, src, dst)
        };
        let cases = [
            (0, Counter::Pass6ExtHopByHop),
            (43, Counter::Pass6ExtRouting),
            (44, Counter::Pass6ExtFragment),
            (60, Counter::Pass6ExtDestOpts),
            (50, Counter::Pass6ExtEsp),
            (51, Counter::Pass6ExtAh),
            (135, Counter::Pass6ExtOther),
            (139, Counter::Pass6ExtOther),
            (140, Counter::Pass6ExtOther),
            (253, Counter::Pass6ExtOther),
            (254, Counter::Pass6ExtOther),
        ];
        for (next, counter) in cases {
            let p = with_ext(next, true);
            r.pass(
                &format!("ext {next} from the LAN"),
                &from_client(&env, &p),
                lan,
                counter,
            );
            let p = with_ext(next, false);
            let what = format!("ext {next} from the WAN to a LAN host");
            if matches!(next, 50 | 51) {
                r.pass(&what, &from_server(&env, &p), wan, counter);
            } else {
                r.drop_frame(
                    &what,
                    &from_server(&env, &p),
                    wan,
                    Counter::Drop6Unsolicited,
                );
            }
            let p = with_ext_to(next, s, o(ROUTER_WAN6));
            r.pass(
                &format!("ext {next} from the WAN to the router"),
                &from_server(&env, &p),
                wan,
                counter,
            );
        }
        for hl in [0, 1] {
            let p = tcp.clone().hop_limit(hl);
            r.pass(
                &format!("hop limit {hl}"),
                &from_client(&env, &p),
                lan,
                Counter::Pass6HopLimit,
            );
        }
        // Other protocols (SCTP, no next header): the kernel's.
        for next in [132, 59] {
            let p = Ipv6::new(c, s, next, vec![0; 16]);
            r.pass(
                &format!("next header {next}"),
                &from_client(&env, &p),
                lan,
                Counter::PassProtocol,
            );
        }

        let ll_client = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let ll_router = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let all_routers = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let solicited = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 1];
        let mld_routers = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x16];
        let link_scope = [
            (
                "RS",
                Ipv6::icmp6(ll_client, all_routers, ICMP6_ROUTER_SOLICIT, 0, [0; 4], &[])
                    .hop_limit(255),
            ),
            (
                "RA",
                Ipv6::icmp6(
                    ll_router,
                    [0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                    ICMP6_ROUTER_ADVERT,
                    0,
                    [64, 0, 0, 0],
                    &[0; 8],
                )
                .hop_limit(255),
            ),
            (
                "NS from ::",
                Ipv6::icmp6(
                    [0; 16],
                    solicited,
                    ICMP6_NEIGHBOUR_SOLICIT,
                    0,
                    [0; 4],
                    &o(ROUTER_LAN6),
                )
                .hop_limit(255),
            ),
            (
                "NS to solicited-node",
                Ipv6::icmp6(
                    c,
                    solicited,
                    ICMP6_NEIGHBOUR_SOLICIT,
                    0,
                    [0; 4],
                    &o(ROUTER_LAN6),
                )
                .hop_limit(255),
            ),
            (
                "MLDv2 report",
                Ipv6::icmp6(ll_client, mld_routers, ICMP6_MLD2_REPORT, 0, [0; 4], &[]).hop_limit(1),
            ),
            (
                "link-local UDP (DHCPv6 to the router)",
                Ipv6::udp(ll_client, ll_router, &Udp::new(546, 547, b"solicit")),
            ),
            (
                "global to link-local",
                Ipv6::udp(c, ll_router, &Udp::new(1, 2, b"x")),
            ),
        ];
        for (what, p) in link_scope {
            r.pass(what, &from_client(&env, &p), lan, Counter::Pass6LinkScope);
        }
        // Addresses no router forwards (RFC 4291 2.5.3, 2.7): a multicast
        // source, loopback either way. `bpf_fib_lookup` refuses them (it
        // forwards no multicast or loopback address on either side), the
        // kernel drops them; no flow opens. As a source from the LAN it is
        // also no LAN host's: dropped by standalone's source check.
        let mut lo = [0; 16];
        lo[15] = 1;
        let mc_global = [0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        for (what, p, counter) in [
            (
                "SYN from ::1",
                Ipv6::tcp(lo, s, &Tcp::new(40000, 80, TCP_SYN)),
                Counter::Drop6SpoofedSource,
            ),
            (
                "SYN to ::1",
                Ipv6::tcp(c, lo, &Tcp::new(40000, 80, TCP_SYN)),
                Counter::PassFibNotForwarded,
            ),
            (
                "UDP from a global multicast address",
                Ipv6::udp(mc_global, s, &Udp::new(40000, 53, b"m")),
                Counter::Drop6SpoofedSource,
            ),
        ] {
            r.check(
                what,
                &from_client(&env, &p),
                lan,
                if counter == Counter::Drop6SpoofedSource {
                    XDP_DROP
                } else {
                    XDP_PASS
                },
                &from_client(&env, &p),
                counter,
                &[],
            );
        }
        // NDP and MLD between global addresses (NA answering an NS for a
        // global address, a unicast MLD query): still the kernel's.
        let na = Ipv6::icmp6(
            c,
            o(ROUTER_LAN6),
            ICMP6_NEIGHBOUR_ADVERT,
            0,
            [0x60, 0, 0, 0],
            &o(CLIENT6),
        )
        .hop_limit(255);
        r.pass("NA global", &from_client(&env, &na), lan, Counter::Pass6Ndp);
        // NDP from the WAN to a LAN address stays the kernel's (proxy NDP
        // answers it; forwarded, a host would not take it: hop limit 255
        // only); MLD to a LAN host is dropped by the inbound filter.
        let ns = Ipv6::icmp6(s, c, ICMP6_NEIGHBOUR_SOLICIT, 0, [0; 4], &o(CLIENT6)).hop_limit(255);
        r.pass(
            "NS global from the WAN to a LAN address",
            &from_server(&env, &ns),
            wan,
            Counter::Pass6Ndp,
        );
        let ns = Ipv6::icmp6(
            s,
            o(ROUTER_WAN6),
            ICMP6_NEIGHBOUR_SOLICIT,
            0,
            [0; 4],
            &o(ROUTER_WAN6),
        )
        .hop_limit(255);
        r.pass(
            "NS global from the WAN to the router",
            &from_server(&env, &ns),
            wan,
            Counter::Pass6Ndp,
        );
        let query = Ipv6::icmp6(s, c, 130, 0, [0; 4], &[0; 16]).hop_limit(2);
        r.drop_frame(
            "MLD query unicast to a LAN host",
            &from_server(&env, &query),
            wan,
            Counter::Drop6Unsolicited,
        );
        let query = Ipv6::icmp6(s, o(ROUTER_WAN6), 130, 0, [0; 4], &[0; 16]).hop_limit(2);
        r.pass(
            "MLD query unicast to the router",
            &from_server(&env, &query),
            wan,
            Counter::Pass6Mld,
        );
        // Other protocols and ICMPv6 types from the WAN: the same.
        for (what, p) in [
            ("SCTP", Ipv6::new(s, c, 132, vec![0; 16])),
            ("no next header", Ipv6::new(s, c, 59, vec![0; 16])),
            (
                "ICMPv6 node information query",
                Ipv6::icmp6(s, c, 139, 0, [0; 4], &[0; 16]),
            ),
            (
                "ICMPv6 type 200",
                Ipv6::icmp6(s, c, 200, 0, [0; 4], &[0; 8]),
            ),
        ] {
            r.drop_frame(
                &format!("{what} from the WAN to a LAN host"),
                &from_server(&env, &p),
                wan,
                Counter::Drop6Unsolicited,
            );
        }
        let sctp = Ipv6::new(s, o(ROUTER_WAN6), 132, vec![0; 16]);
        r.pass(
            "SCTP from the WAN to the router",
            &from_server(&env, &sctp),
            wan,
            Counter::PassProtocol,
        );
        r.assert_flows("nothing opened", &[]);
    });
    // Offload mode: the kernel's firewall decides, so all are passed.
    with_router(&env, config(&env, Admit::Kernel), |r| {
        let (s, c) = (o(SERVER6), o(CLIENT6));
        let tcp = Ipv6::tcp(s, c, &Tcp::new(80, 40000, TCP_SYN));
        for (next, counter) in [
            (0, Counter::Pass6ExtHopByHop),
            (44, Counter::Pass6ExtFragment),
            (60, Counter::Pass6ExtDestOpts),
        ] {
            let mut payload = vec![IPPROTO_TCP, 0, 0, 0, 0, 0, 0, 0];
            payload.extend_from_slice(&tcp.payload);
            let p = Ipv6::new(s, c, next, payload);
            r.pass(
                &format!("offload mode: ext {next} from the WAN to a LAN host"),
                &from_server(&env, &p),
                r.wan(),
                counter,
            );
        }
        let sctp = Ipv6::new(s, c, 132, vec![0; 16]);
        r.pass(
            "offload mode: SCTP from the WAN to a LAN host",
            &from_server(&env, &sctp),
            r.wan(),
            Counter::PassProtocol,
        );
    });
}

/// A TCP, UDP and `ICMPv6` frame cut at every length: shorter than the
/// Ethernet or IPv6 header -> truncated; payload length beyond the frame
/// -> malformed. And L4 headers that do not fit their payload length.
/// Standalone mode drops unsolicited IPv4 from the WAN that the FIB would
/// forward to the LAN (`admit::unsolicited`); that policy reads IPv4
/// headers and must leave IPv6 alone. An IPv6 frame passed from the WAN
/// whose bytes where an IPv4 header would hold its destination spell a
/// LAN host's IPv4 address (the source address's bytes 8-11) is passed
/// all the same, with its own reason (and dropped by IPv6's own filter,
/// with its own counter).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ipv6_from_the_wan_is_not_judged_as_ipv4() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let wan = r.wan();
        let mut src = o(SERVER6);
        src[8..12].copy_from_slice(&tests::addr::octets::CLIENT);
        let tcp = Ipv6::tcp(src, o(CLIENT6), &Tcp::new(80, 40000, TCP_SYN));
        let mut payload = vec![IPPROTO_TCP, 0, 0, 0, 0, 0, 0, 0];
        payload.extend_from_slice(&tcp.payload);
        let esp = Ipv6::new(src, o(CLIENT6), 50, payload.clone());
        r.pass(
            "ESP from a WAN host whose address holds a LAN IPv4 address",
            &from_server(&env, &esp),
            wan,
            Counter::Pass6ExtEsp,
        );
        // What IPv6's own filter drops, it counts as its own.
        let hop_by_hop = Ipv6::new(src, o(CLIENT6), 0, payload);
        r.drop_frame(
            "hop-by-hop from a WAN host whose address holds a LAN IPv4 address",
            &from_server(&env, &hop_by_hop),
            wan,
            Counter::Drop6Unsolicited,
        );
    });
}

/// With a default route on the router (which `bpf_fib_lookup` matches
/// `::` and `::ffff:0:0/96` to), the unspecified destination (RFC 4291
/// 2.5.2) and IPv4-mapped addresses (RFC 4291 2.5.5.2; RFC 6890: not
/// forwardable) neither open a flow nor are forwarded: passed as not a
/// destination a router forwards to, as IPv4's 0/8 and 240/4. A global
/// destination behind the same default route is forwarded.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn unspecified_and_ipv4_mapped_addresses_do_not_follow_the_default_route() {
    let env = topology();
    let gw = SERVER6.to_string();
    env.t.exec_ok(
        tests::Ns::Router,
        &["ip", "-6", "route", "add", "default", "via", &gw],
    );
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let mapped: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 51, 100, 1];
        let mapped_src: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 1, 2];
        let cases = [
            (
                "UDP to ::",
                Ipv6::udp(c, [0; 16], &Udp::new(5000, 53, b"q")),
            ),
            (
                "SYN to ::",
                Ipv6::tcp(c, [0; 16], &Tcp::new(40000, 80, TCP_SYN)),
            ),
            (
                "UDP to ::ffff:198.51.100.1",
                Ipv6::udp(c, mapped, &Udp::new(5000, 53, b"q")),
            ),
            (
                "SYN to ::ffff:198.51.100.1",
                Ipv6::tcp(c, mapped, &Tcp::new(40000, 80, TCP_SYN)),
            ),
            (
                "echo to ::ffff:198.51.100.1",
                Ipv6::echo(c, mapped, false, 7, 1),
            ),
            (
                "UDP from ::ffff:192.168.1.2",
                Ipv6::udp(mapped_src, s, &Udp::new(5000, 53, b"q")),
            ),
        ];
        for (what, p) in &cases {
            // A mapped source is no LAN host's: standalone's source check.
            let (verdict, counter) = if p.src == mapped_src {
                (XDP_DROP, Counter::Drop6SpoofedSource)
            } else {
                (XDP_PASS, Counter::PassFibNotForwarded)
            };
            r.check(
                &format!("{what} from the LAN"),
                &from_client(&env, p),
                lan,
                verdict,
                &from_client(&env, p),
                counter,
                &[],
            );
        }
        let in_to_unspecified = Ipv6::udp(s, [0; 16], &Udp::new(5000, 53, b"q"));
        r.pass(
            "UDP to :: from the WAN",
            &from_server(&env, &in_to_unspecified),
            wan,
            Counter::PassFibNotForwarded,
        );
        r.assert_flows("nothing opened", &[]);
        let far: [u8; 16] = [
            0x20, 0x01, 0x0d, 0xb8, 0, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1,
        ];
        let global = Ipv6::udp(c, far, &Udp::new(5000, 53, b"q"));
        r.redirect(
            "UDP to a global address by the default route",
            &from_client(&env, &global),
            lan,
            &to_server(&env, &global),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
    });
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn truncations_and_bad_lengths_dropped() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let lan = r.lan();
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let packets = [
            Ipv6::tcp(
                c,
                s,
                &Tcp::new(40000, 80, TCP_SYN).options(&[2, 4, 5, 0xa0]),
            ),
            Ipv6::udp(c, s, &Udp::new(40000, 53, b"q")),
            Ipv6::echo(c, s, false, 9, 9),
        ];
        for p in &packets {
            let full = from_client(&env, p);
            // BPF_PROG_RUN refuses frames shorter than an Ethernet header.
            for len in 14..full.len() {
                let cut = &full[..len];
                let counter = if len < L4_6_OFF {
                    Counter::DropTruncated
                } else {
                    Counter::DropMalformed
                };
                r.drop_frame(
                    &format!("proto {} cut at {len}", p.next_header),
                    cut,
                    lan,
                    counter,
                );
            }
        }
        // Payload lengths shorter than the L4 header (frame consistent).
        for (proto, short) in [(IPPROTO_TCP, 19), (IPPROTO_UDP, 7), (58, 7)] {
            let p = Ipv6::new(c, s, proto, vec![0; short]);
            r.drop_frame(
                &format!("proto {proto} payload {short}"),
                &from_client(&env, &p),
                lan,
                Counter::DropMalformed,
            );
        }
        // TCP data offset below 5 words or beyond the payload.
        for data_off in [4u8, 6] {
            let mut p = Ipv6::tcp(c, s, &Tcp::new(40000, 80, TCP_SYN));
            p.payload[12] = data_off << 4;
            r.drop_frame(
                &format!("TCP data offset {data_off}"),
                &from_client(&env, &p),
                lan,
                Counter::DropMalformed,
            );
        }
        // Version 4 in an IPv6 Ethernet type.
        let mut f = from_client(&env, &packets[1]);
        f[14] = 0x40;
        r.drop_frame("version 4", &f, lan, Counter::DropMalformed);
        r.assert_flows("nothing opened", &[]);
    });
}

/// Fragments from the WAN to a LAN host in standalone mode: a first
/// fragment goes on to the kernel only if the UDP header it starts with is
/// a known flow's reply or to a pinhole; a later fragment always (it has
/// no header to judge, and without its first fragment the host
/// reassembles nothing); a first fragment of no flow is dropped as
/// unsolicited.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn inbound_fragments_pass_only_as_part_of_a_known_flow() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let out = Ipv6::udp(c, s, &Udp::new(40000, 53, b"query"));
        r.redirect(
            "UDP out",
            &from_client(&env, &out),
            lan,
            &to_server(&env, &out),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        // A Fragment header (RFC 8200 4.5: next header UDP, offset in
        // 8-byte units with the M flag, identification 9), then the
        // reply's UDP header and data (first) or more data (later).
        let fragment = |sport: u16, offset: u16| {
            let reply = Ipv6::udp(s, c, &Udp::new(sport, 40000, &[7; 64]));
            let mut payload = vec![IPPROTO_UDP, 0];
            payload.extend_from_slice(&((offset << 3) | 1).to_be_bytes());
            payload.extend_from_slice(&[0, 0, 0, 9]);
            if offset == 0 {
                payload.extend_from_slice(&reply.payload);
            } else {
                payload.extend_from_slice(&[7; 64]);
            }
            Ipv6::new(s, c, 44, payload)
        };
        r.pass(
            "first fragment of the flow's reply",
            &from_server(&env, &fragment(53, 0)),
            wan,
            Counter::Pass6ExtFragment,
        );
        r.pass(
            "later fragment",
            &from_server(&env, &fragment(53, 9)),
            wan,
            Counter::Pass6ExtFragment,
        );
        r.drop_frame(
            "first fragment of no flow",
            &from_server(&env, &fragment(54, 0)),
            wan,
            Counter::Drop6Unsolicited,
        );
        // A datagram's last fragment may carry a single byte.
        let mut short = vec![IPPROTO_UDP, 0];
        short.extend_from_slice(&(9u16 << 3).to_be_bytes());
        short.extend_from_slice(&[0, 0, 0, 9, 7]);
        r.pass(
            "a last fragment of one byte",
            &from_server(&env, &Ipv6::new(s, c, 44, short)),
            wan,
            Counter::Pass6ExtFragment,
        );
        // To a pinhole: a first fragment (the first datagram of a
        // conversation may be large, a SIP INVITE) and an atomic fragment
        // (RFC 6946: a whole datagram), as the pinhole's unfragmented
        // datagram; to a closed port, neither.
        let first_to = |dport: u16, more: bool| {
            let d = Ipv6::udp(s, c, &Udp::new(33000, dport, &[7; 64]));
            let mut payload = vec![IPPROTO_UDP, 0];
            payload.extend_from_slice(&u16::from(more).to_be_bytes());
            payload.extend_from_slice(&[0, 0, 0, 10]);
            payload.extend_from_slice(&d.payload);
            Ipv6::new(s, c, 44, payload)
        };
        for more in [true, false] {
            r.drop_frame(
                &format!("first fragment (more {more}) to a closed port"),
                &from_server(&env, &first_to(5060, more)),
                wan,
                Counter::Drop6Unsolicited,
            );
        }
        r.pinhole(c, IPPROTO_UDP, 5060);
        for more in [true, false] {
            r.pass(
                &format!("first fragment (more {more}) to a pinhole"),
                &from_server(&env, &first_to(5060, more)),
                wan,
                Counter::Pass6ExtFragment,
            );
        }
        // IPsec in fragments, as IPsec whole (RFC 6092 REC-21, REC-22).
        let mut esp = vec![50, 0, 0, 1, 0, 0, 0, 10];
        esp.extend_from_slice(&[0x11; 32]);
        r.pass(
            "a first fragment of ESP",
            &from_server(&env, &Ipv6::new(s, c, 44, esp)),
            wan,
            Counter::Pass6ExtFragment,
        );
    });
}

/// A datagram a LAN host fragmented itself (larger than the path MTU: a
/// large ping, a large UDP datagram) in standalone mode: its fragments go
/// to the kernel, and its first fragment opens its flow, as its
/// unfragmented packet would, so that the reply, fragmented or not, gets
/// in (without the flow the inbound filter dropped it). A later fragment
/// opens nothing (no header), nor does a TCP segment's first fragment (a
/// TCP sender does not fragment), one to another LAN host, one with a
/// source the LAN does not route back (another network's, the router's
/// own), one with a hop limit of 1, one sent to another MAC, or any in
/// offload mode. First fragments of a flow keep it alive both ways (a
/// flow whose datagrams are all fragmented), note its first reply, and
/// rebuild an evicted half rather than overwrite the other.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn outbound_first_fragment_opens_its_datagrams_flow() {
    use router_common::{
        ipv6::IPPROTO_ICMPV6,
        maps::{FLAG_ORIGINAL, FLAG_PORT_FORWARD, FlowKey6, FlowState},
    };
    use tests::v6::LAN_NOBODY6;
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        // The Fragment header (next header `proto`, offset in 8-byte units
        // with the M flag, identification `id`), then `body`.
        let fragment =
            |src: [u8; 16], dst: [u8; 16], proto: u8, offset: u16, id: u8, body: &[u8]| {
                let mut payload = vec![proto, 0];
                payload.extend_from_slice(&((offset << 3) | 1).to_be_bytes());
                payload.extend_from_slice(&[0, 0, 0, id]);
                payload.extend_from_slice(body);
                Ipv6::new(src, dst, 44, payload)
            };
        let udp =
            |src, dst, sport, dport| Ipv6::udp(src, dst, &Udp::new(sport, dport, &[7; 64])).payload;
        r.pass(
            "later fragment out",
            &from_client(&env, &fragment(c, s, IPPROTO_UDP, 9, 1, &[7; 64])),
            lan,
            Counter::Pass6ExtFragment,
        );
        r.pass(
            "first fragment of a TCP segment out",
            &from_client(
                &env,
                &fragment(
                    c,
                    s,
                    IPPROTO_TCP,
                    0,
                    2,
                    &Ipv6::tcp(c, s, &Tcp::new(40000, 80, TCP_SYN)).payload,
                ),
            ),
            lan,
            Counter::Pass6ExtFragment,
        );
        r.pass(
            "first fragment to another LAN host",
            &from_client(
                &env,
                &fragment(
                    c,
                    o(LAN_NOBODY6),
                    IPPROTO_UDP,
                    0,
                    3,
                    &udp(c, o(LAN_NOBODY6), 5000, 6000),
                ),
            ),
            lan,
            Counter::Pass6ExtFragment,
        );
        r.drop_frame(
            "first fragment with the server's address as source",
            &from_client(
                &env,
                &fragment(s, s, IPPROTO_UDP, 0, 4, &udp(s, s, 5000, 6000)),
            ),
            lan,
            Counter::Drop6SpoofedSource,
        );
        let own = o(ROUTER_WAN6);
        r.drop_frame(
            "first fragment with the router's address as source",
            &from_client(
                &env,
                &fragment(own, s, IPPROTO_UDP, 0, 4, &udp(own, s, 5000, 6000)),
            ),
            lan,
            Counter::Drop6SpoofedSource,
        );
        let last_hop = fragment(c, s, IPPROTO_UDP, 0, 4, &udp(c, s, 5001, 6000)).hop_limit(1);
        r.pass(
            "first fragment with hop limit 1",
            &from_client(&env, &last_hop),
            lan,
            Counter::Pass6ExtFragment,
        );
        let elsewhere = fragment(c, s, IPPROTO_UDP, 0, 4, &udp(c, s, 5002, 6000));
        r.pass(
            "first fragment to another MAC",
            &elsewhere.frame([2, 0, 0, 0, 0, 0x99], env.client_mac),
            lan,
            Counter::Pass6ExtFragment,
        );
        r.0.configure(&config(&env, Admit::Kernel));
        r.pass(
            "first fragment in offload mode",
            &from_client(&env, &elsewhere),
            lan,
            Counter::Pass6ExtFragment,
        );
        r.0.configure(&config(&env, Admit::Xdp));
        r.assert_flows("nothing opened", &[]);

        // A large UDP datagram's first fragment, and a large ping's.
        let first = fragment(c, s, IPPROTO_UDP, 0, 5, &udp(c, s, 40000, 5060));
        r.check(
            "first fragment of a UDP datagram out",
            &from_client(&env, &first),
            lan,
            XDP_PASS,
            &from_client(&env, &first),
            Counter::Pass6ExtFragment,
            &[Counter::Flow6NewOutbound],
        );
        let ping = fragment(
            c,
            s,
            IPPROTO_ICMPV6,
            0,
            6,
            &Ipv6::echo(c, s, false, 77, 1).payload,
        );
        r.check(
            "first fragment of an echo request out",
            &from_client(&env, &ping),
            lan,
            XDP_PASS,
            &from_client(&env, &ping),
            Counter::Pass6ExtFragment,
            &[Counter::Flow6NewOutbound],
        );
        let udp_flow = FlowKey6::new(c, s, 40000, 5060, IPPROTO_UDP);
        let echo_flow = FlowKey6::new(c, s, 77, 77, IPPROTO_ICMPV6);
        let opened = [
            (udp_flow, FlowState::UdpUnreplied, FLAG_ORIGINAL),
            (udp_flow.reversed(), FlowState::UdpUnreplied, 0),
            (echo_flow, FlowState::Icmp, FLAG_ORIGINAL),
            (echo_flow.reversed(), FlowState::Icmp, 0),
        ];
        r.assert_flows("both flows opened", &opened);
        // Again: the flow stays as it is.
        r.pass(
            "the next datagram's first fragment",
            &from_client(
                &env,
                &fragment(c, s, IPPROTO_UDP, 0, 7, &udp(c, s, 40000, 5060)),
            ),
            lan,
            Counter::Pass6ExtFragment,
        );
        r.assert_flows("nothing more", &opened);

        // The replies get in: fragmented, and whole.
        r.pass(
            "first fragment of the UDP reply",
            &from_server(
                &env,
                &fragment(s, c, IPPROTO_UDP, 0, 8, &udp(s, c, 5060, 40000)),
            ),
            wan,
            Counter::Pass6ExtFragment,
        );
        let mut reply = Ipv6::echo(s, c, true, 77, 1).payload;
        reply.extend_from_slice(&[0; 8]);
        r.pass(
            "first fragment of the echo reply",
            &from_server(&env, &fragment(s, c, IPPROTO_ICMPV6, 0, 9, &reply)),
            wan,
            Counter::Pass6ExtFragment,
        );
        // The fragmented reply noted the UDP flow's first reply.
        let replied = [
            (udp_flow, FlowState::UdpReplied, FLAG_ORIGINAL),
            (udp_flow.reversed(), FlowState::UdpReplied, 0),
            (echo_flow, FlowState::Icmp, FLAG_ORIGINAL),
            (echo_flow.reversed(), FlowState::Icmp, 0),
        ];
        r.assert_flows("the fragmented reply noted", &replied);
        let whole = Ipv6::udp(s, c, &Udp::new(5060, 40000, b"200 OK"));
        r.redirect(
            "a whole UDP reply",
            &from_server(&env, &whole),
            wan,
            &to_client(&env, &whole),
            Counter::Fwd6Inbound,
            &[],
        );

        // Fragments alone keep the flow alive: its times, aged past the
        // refresh interval, are refreshed by a first fragment each way.
        for (what, k, frame, ifindex) in [
            (
                "out",
                udp_flow,
                from_client(
                    &env,
                    &fragment(c, s, IPPROTO_UDP, 0, 10, &udp(c, s, 40000, 5060)),
                ),
                lan,
            ),
            (
                "in",
                udp_flow.reversed(),
                from_server(
                    &env,
                    &fragment(s, c, IPPROTO_UDP, 0, 11, &udp(s, c, 5060, 40000)),
                ),
                wan,
            ),
        ] {
            let mut e = r.conntrack6()[&k];
            e.last_seen_ns -= 2 * router_common::flow::REFRESH_NS;
            r.put6(&k, &e);
            r.pass(
                &format!("first fragment {what}"),
                &frame,
                ifindex,
                Counter::Pass6ExtFragment,
            );
            let after = r.conntrack6();
            assert!(
                after[&k].last_seen_ns > e.last_seen_ns,
                "{what}: {:?}",
                after[&k]
            );
            assert_eq!(
                after[&k].last_seen_ns,
                after[&k.reversed()].last_seen_ns,
                "{what}: both entries"
            );
        }

        // The WAN-side entry evicted: the reply's first fragment still
        // belongs to the flow (known by its LAN-side entry) and rebuilds it.
        r.remove6(&udp_flow.reversed());
        let reply = from_server(
            &env,
            &fragment(s, c, IPPROTO_UDP, 0, 13, &udp(s, c, 5060, 40000)),
        );
        r.check(
            "first fragment in, its entry evicted",
            &reply,
            wan,
            XDP_PASS,
            &reply,
            Counter::Pass6ExtFragment,
            &[Counter::Eviction6Detected],
        );
        assert!(r.conntrack6().contains_key(&udp_flow.reversed()));

        // An evicted half is rebuilt from the other, not written anew over
        // it: a pinhole's flow keeps its flag.
        r.pinhole(c, IPPROTO_UDP, 5062);
        let inbound = Ipv6::udp(s, c, &Udp::new(33000, 5062, b"call"));
        r.redirect(
            "UDP to a pinhole",
            &from_server(&env, &inbound),
            wan,
            &to_client(&env, &inbound),
            Counter::Fwd6Inbound,
            &[Counter::Flow6NewPinhole],
        );
        let pinhole_flow = FlowKey6::new(s, c, 33000, 5062, IPPROTO_UDP);
        let flags = r.conntrack6()[&pinhole_flow.reversed()].flags;
        r.remove6(&pinhole_flow);
        let answer = from_client(
            &env,
            &fragment(c, s, IPPROTO_UDP, 0, 12, &udp(c, s, 5062, 33000)),
        );
        r.check(
            "the LAN host's fragmented answer",
            &answer,
            lan,
            XDP_PASS,
            &answer,
            Counter::Pass6ExtFragment,
            &[Counter::Eviction6Detected],
        );
        let after = r.conntrack6();
        assert_eq!(
            (
                after[&pinhole_flow.reversed()].flags,
                after[&pinhole_flow].flags & FLAG_PORT_FORWARD
            ),
            (flags, FLAG_PORT_FORWARD),
            "{after:?}"
        );
    });
}
