//! `ICMPv6` errors from the WAN: forwarded unchanged (hop limit and MACs
//! only) when they quote a packet of a known flow sent by the LAN host
//! they are addressed to; passed when they quote what the fast path
//! passes (ESP, fragments); dropped as unsolicited otherwise (standalone),
//! passed when addressed to the router.

use router_common::maps::Counter;
use tests::frames::{TCP_SYN, Tcp, Udp};
use tests::v6::{
    CLIENT6, ICMP6_DEST_UNREACH, ICMP6_PACKET_TOO_BIG, ICMP6_TIME_EXCEEDED, LAN_NOBODY6,
    ROUTER_WAN6, SERVER6, o,
};

use super::*;

#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn icmp6_errors_quoting_known_and_unknown_flows() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let udp = Ipv6::udp(c, s, &Udp::new(5000, 6000, &[1; 200]));
        let tcp = Ipv6::tcp(c, s, &Tcp::new(40000, 443, TCP_SYN));
        let ping = Ipv6::echo(c, s, false, 0x42, 1);
        for (what, p) in [("UDP", &udp), ("TCP", &tcp), ("ping", &ping)] {
            r.redirect(
                &format!("{what} out"),
                &from_client(&env, p),
                r.lan(),
                &to_server(&env, p),
                Counter::Fwd6Outbound,
                &[Counter::Flow6NewOutbound],
            );
        }
        // As the packet arrived at the server (hop limit one less).
        let quote = |p: &Ipv6, n: usize| {
            let b = p.clone().hop_limit(p.hop_limit - 1).bytes();
            b[..n.min(b.len())].to_vec()
        };
        let errors = [
            (
                "PTB quoting UDP",
                ICMP6_PACKET_TOO_BIG,
                1280,
                quote(&udp, 1000),
            ),
            (
                "unreachable quoting TCP",
                ICMP6_DEST_UNREACH,
                0,
                quote(&tcp, 48),
            ),
            (
                "time exceeded quoting ping",
                ICMP6_TIME_EXCEEDED,
                0,
                quote(&ping, 200),
            ),
            // RFC 4443 2.4 (b): an error of a type the router does not know
            // goes to the sender of the quoted packet (as Linux's conntrack
            // relates it; RFC 4890 4.3.4 leaves it to policy).
            (
                "an unallocated error type quoting UDP",
                50,
                0,
                quote(&udp, 100),
            ),
        ];
        for (what, t, mtu, q) in &errors {
            let e = Ipv6::error(s, c, *t, *mtu, q);
            r.redirect(
                what,
                &from_server(&env, &e),
                wan,
                &to_client(&env, &e),
                Counter::Fwd6Inbound,
                &[Counter::Icmp6ErrorForwarded],
            );
        }
        let other_port = Ipv6::udp(c, s, &Udp::new(5001, 6000, b"x"));
        let spoofed_src = Ipv6::udp(o(LAN_NOBODY6), s, &Udp::new(5000, 6000, b"x"));
        let unknown = [
            ("quoting no flow", quote(&other_port, 100)),
            ("quoting 47 bytes (no ports)", quote(&udp, 47)),
            ("quoting a reply-direction packet", {
                Ipv6::udp(s, c, &Udp::new(6000, 5000, b"x")).bytes()
            }),
        ];
        // The experimental types and 127 (RFC 4890 4.3.5: dropped), about
        // a known flow all the same.
        for t in [100, 101, 127] {
            let e = Ipv6::error(s, c, t, 0, &quote(&udp, 100));
            r.drop_frame(
                &format!("error type {t} quoting UDP"),
                &from_server(&env, &e),
                wan,
                Counter::Drop6Unsolicited,
            );
        }
        for (what, q) in unknown {
            let e = Ipv6::error(s, c, ICMP6_DEST_UNREACH, 0, &q);
            r.drop_frame(what, &from_server(&env, &e), wan, Counter::Drop6Unsolicited);
        }
        // Addressed to another LAN host than the quoted source.
        let e = Ipv6::error(s, o(LAN_NOBODY6), ICMP6_DEST_UNREACH, 0, &quote(&udp, 100));
        r.drop_frame(
            "to another LAN host",
            &from_server(&env, &e),
            wan,
            Counter::Drop6Unsolicited,
        );
        let e = Ipv6::error(
            s,
            o(LAN_NOBODY6),
            ICMP6_DEST_UNREACH,
            0,
            &spoofed_src.bytes(),
        );
        r.drop_frame(
            "quoting an unknown LAN source",
            &from_server(&env, &e),
            wan,
            Counter::Drop6Unsolicited,
        );
        // About IPsec, which standalone mode lets through both ways (RFC
        // 6092 REC-21, REC-22): the kernel's, which forwards that traffic
        // too (REC-23; path-MTU discovery, RFC 4890 4.3.1), counted by the
        // quoted kind, and so are errors about the host's own fragments.
        // About what else the fast path does not carry (destination
        // options, another protocol): its inbound traffic is dropped, and
        // so are errors about it (REC-10). From another LAN host than the
        // addressee: no.
        let esp = Ipv6::new(c, s, 50, vec![0x11; 64]).bytes();
        let ah = Ipv6::new(
            c,
            s,
            51,
            vec![17, 4, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0],
        )
        .bytes();
        let fragment = Ipv6::new(c, s, 44, vec![17, 0, 0, 1, 0, 0, 0, 7]).bytes();
        let dest_opts = Ipv6::new(c, s, 60, vec![17, 0, 1, 4, 0, 0, 0, 0]).bytes();
        let gre = Ipv6::new(c, s, 47, vec![0; 16]).bytes();
        for (what, q, counter) in [
            ("PTB quoting ESP", &esp, Counter::Pass6ExtEsp),
            ("PTB quoting AH", &ah, Counter::Pass6ExtAh),
            // The host fragments for itself and must learn the path MTU.
            (
                "PTB quoting a fragment",
                &fragment,
                Counter::Pass6ExtFragment,
            ),
        ] {
            let e = Ipv6::error(s, c, ICMP6_PACKET_TOO_BIG, 1280, q);
            r.pass(what, &from_server(&env, &e), wan, counter);
        }
        for (what, q) in [
            ("PTB quoting destination options", &dest_opts),
            ("PTB quoting GRE", &gre),
        ] {
            let e = Ipv6::error(s, c, ICMP6_PACKET_TOO_BIG, 1280, q);
            r.drop_frame(what, &from_server(&env, &e), wan, Counter::Drop6Unsolicited);
        }
        // Of the errors quoting the host's own fragment, besides Packet
        // Too Big, only those about a first fragment of a known flow (the
        // UDP header it starts with): the others match no state (REC-10).
        for (what, icmp_type) in [
            ("unreachable quoting a fragment", ICMP6_DEST_UNREACH),
            ("time exceeded quoting a fragment", ICMP6_TIME_EXCEEDED),
        ] {
            let e = Ipv6::error(s, c, icmp_type, 0, &fragment);
            r.drop_frame(what, &from_server(&env, &e), wan, Counter::Drop6Unsolicited);
        }
        let first_fragment = |sport: u16| {
            let d = Ipv6::udp(c, s, &Udp::new(sport, 6000, &[1; 24]));
            let mut payload = vec![17, 0, 0, 1, 0, 0, 0, 7];
            payload.extend_from_slice(&d.payload);
            Ipv6::new(c, s, 44, payload).bytes()
        };
        let e = Ipv6::error(s, c, ICMP6_DEST_UNREACH, 0, &first_fragment(5000));
        r.pass(
            "unreachable quoting a first fragment of the UDP flow",
            &from_server(&env, &e),
            wan,
            Counter::Pass6ExtFragment,
        );
        let e = Ipv6::error(s, c, ICMP6_DEST_UNREACH, 0, &first_fragment(5001));
        r.drop_frame(
            "unreachable quoting a first fragment of no flow",
            &from_server(&env, &e),
            wan,
            Counter::Drop6Unsolicited,
        );
        let e = Ipv6::error(s, o(LAN_NOBODY6), ICMP6_PACKET_TOO_BIG, 1280, &esp);
        r.drop_frame(
            "PTB quoting another host's ESP",
            &from_server(&env, &e),
            wan,
            Counter::Drop6Unsolicited,
        );
        // About a packet the router sent itself: its kernel's.
        let own = Ipv6::udp(o(ROUTER_WAN6), s, &Udp::new(5000, 6000, b"x"));
        let e = Ipv6::error(s, o(ROUTER_WAN6), ICMP6_DEST_UNREACH, 0, &own.bytes());
        r.pass(
            "to the router",
            &from_server(&env, &e),
            wan,
            Counter::PassFibNotForwarded,
        );
        // Errors from the LAN are the kernel's (it forwards them).
        let e = Ipv6::error(c, s, ICMP6_DEST_UNREACH, 0, &quote(&udp, 100));
        r.pass(
            "error from the LAN",
            &from_client(&env, &e),
            lan,
            Counter::PassProtocol,
        );
    });
}

/// An `ICMPv6` error about a known flow whose LAN host has no neighbour
/// entry is passed for the kernel to resolve and forward: counted
/// `pass_no_neighbour` only, not `icmp6_error_forwarded` (the fast path did
/// not forward it).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn icmp6_error_to_an_unresolved_lan_host_not_counted_forwarded() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (n, s) = (o(LAN_NOBODY6), o(SERVER6));
        let udp = Ipv6::udp(n, s, &Udp::new(5000, 6000, &[1; 200]));
        r.redirect(
            "UDP out from an unresolved LAN address",
            &from_client(&env, &udp),
            lan,
            &to_server(&env, &udp),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        let quoted = udp.clone().hop_limit(udp.hop_limit - 1).bytes();
        let e = Ipv6::error(s, n, ICMP6_PACKET_TOO_BIG, 1280, &quoted);
        r.pass(
            "PTB to the unresolved LAN host",
            &from_server(&env, &e),
            wan,
            Counter::PassNoNeighbour,
        );
    });
}
