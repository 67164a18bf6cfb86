//! The window check of IPv6 TCP RST, FIN and SYN+ACK through
//! `BPF_PROG_RUN`, as IPv4's (`prog_run::tcp_window`): a segment its
//! receiver would not accept (a blind RST or FIN whose tuple was guessed)
//! changes no state, is counted (`tcp_out_of_window`) and forwarded all
//! the same; an accepted one changes it. Sequence numbers start just below
//! the wrap of the sequence space.

use router_common::flow::{ASSUMED_WSCALE, MAX_WSCALE, MIN_ACK_STEP};
use router_common::maps::{
    FLAG_FIN_ORIG, FLAG_ORIGINAL, IPPROTO_TCP, TCP_TRACK_EXPECT, TCP_TRACK_KNOWN, TCP_TRACK_SYN,
    TcpWindow,
};
use tests::frames::{TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, Tcp};
use tests::v6::{CLIENT6, SERVER6, o};

use super::*;

/// Client and server initial sequence numbers: the client's wraps after
/// 16 bytes.
const C_ISN: u32 = 0xffff_fff0;
const S_ISN: u32 = 0x7fff_0000;

fn seg(sport: u16, dport: u16, flags: u8, seq: u32, ack: u32, window: u16) -> Tcp {
    let mut t = Tcp::new(sport, dport, flags);
    t.seq = seq;
    t.ack = ack;
    t.window = window;
    t
}

/// Handshake, blind and real RST/FIN in both directions, with the exact
/// tracking in both entries after each step.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted connection: each step's segment and the exact tracking after it"
)]
fn rst_and_fin6_only_in_the_receivers_window() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let orig = FlowKey6::new(c, s, 41000, 80, IPPROTO_TCP);
        let out = |r: &Router6, what: &str, t: Tcp, events: &[Counter]| {
            let ip = Ipv6::tcp(c, s, &t);
            r.redirect(
                what,
                &from_client(&env, &ip),
                lan,
                &to_server(&env, &ip),
                Counter::Fwd6Outbound,
                events,
            );
        };
        let inb = |r: &Router6, what: &str, t: Tcp, events: &[Counter]| {
            let ip = Ipv6::tcp(s, c, &t);
            r.redirect(
                what,
                &from_server(&env, &ip),
                wan,
                &to_client(&env, &ip),
                Counter::Fwd6Inbound,
                events,
            );
        };
        let entries = |r: &Router6| {
            let ct = r.conntrack6();
            (ct[&orig], ct[&orig.reversed()])
        };
        let state = |r: &Router6| {
            let (o, p) = entries(r);
            assert_eq!(
                (o.state, o.flags & !FLAG_ORIGINAL),
                (p.state, p.flags),
                "both entries agree"
            );
            (
                FlowState::from_u8(o.state).unwrap(),
                o.flags & FLAG_FIN_ORIG,
            )
        };
        let client_tcp = |r: &Router6| entries(r).0.tcp;
        let server_tcp = |r: &Router6| entries(r).1.tcp;
        let oow = [Counter::TcpOutOfWindow];

        out(
            r,
            "SYN",
            seg(41000, 80, TCP_SYN, C_ISN, 0, 64240),
            &[Counter::Flow6NewOutbound],
        );
        assert_eq!(
            client_tcp(r),
            TcpWindow {
                ack: 0,
                win: 64240,
                wscale: ASSUMED_WSCALE,
                flags: TCP_TRACK_SYN
            }
        );
        assert_eq!(
            server_tcp(r),
            TcpWindow {
                ack: C_ISN + 1,
                win: 0,
                wscale: 0,
                flags: TCP_TRACK_KNOWN | TCP_TRACK_EXPECT
            }
        );
        // A blind SYN+ACK (wrong ACK) does not establish.
        inb(
            r,
            "blind SYN+ACK",
            seg(80, 41000, TCP_SYN | TCP_ACK, 5, 12345, 65160),
            &oow,
        );
        assert_eq!(state(r), (FlowState::TcpSynSent, 0));
        inb(
            r,
            "SYN+ACK",
            seg(80, 41000, TCP_SYN | TCP_ACK, S_ISN, C_ISN + 1, 65160),
            &[],
        );
        assert_eq!(state(r), (FlowState::TcpEstablished, 0));
        assert_eq!(
            (client_tcp(r), server_tcp(r)),
            (
                TcpWindow {
                    ack: S_ISN + 1,
                    win: 4,
                    wscale: MAX_WSCALE,
                    flags: TCP_TRACK_SYN | TCP_TRACK_KNOWN
                },
                TcpWindow {
                    ack: C_ISN + 1,
                    win: 4,
                    wscale: MAX_WSCALE,
                    flags: TCP_TRACK_KNOWN
                }
            )
        );
        // The client's first ACK advertises its scaled window (502 units):
        // the hit's inline tracking writes it down.
        out(
            r,
            "ACK",
            seg(41000, 80, TCP_ACK, C_ISN + 1, S_ISN + 1, 502),
            &[],
        );
        assert_eq!(client_tcp(r).win, 502);

        // Blind RST and FIN from the WAN, half the sequence space away:
        // forwarded, counted, nothing changes.
        let blind = S_ISN.wrapping_add(0x8000_0000);
        inb(
            r,
            "blind RST in",
            seg(80, 41000, TCP_RST, blind, 0, 0),
            &oow,
        );
        inb(
            r,
            "blind FIN in",
            seg(80, 41000, TCP_FIN | TCP_ACK, blind, C_ISN + 1, 0),
            &oow,
        );
        out(
            r,
            "stray RST out",
            seg(41000, 80, TCP_RST, C_ISN.wrapping_add(0x4000_0000), 0, 0),
            &oow,
        );
        assert_eq!(state(r), (FlowState::TcpEstablished, 0));

        // The client's FIN after 32 bytes of data, across the wrap: in the
        // server's window.
        let fin_seq = C_ISN.wrapping_add(1 + 32);
        out(
            r,
            "FIN out",
            seg(41000, 80, TCP_FIN | TCP_ACK, fin_seq, S_ISN + 1, 502),
            &[],
        );
        assert_eq!(state(r), (FlowState::TcpFinWait, FLAG_FIN_ORIG));

        // The server's RST just past the client's scaled window plus a
        // step: refused; 1 MB past its ACK: inside, closes.
        let reach = (502u32 << 14) + (502u32 << 13).max(MIN_ACK_STEP);
        inb(
            r,
            "RST in past the window",
            seg(80, 41000, TCP_RST, S_ISN + 1 + reach + 1, 0, 0),
            &oow,
        );
        assert_eq!(state(r), (FlowState::TcpFinWait, FLAG_FIN_ORIG));
        inb(
            r,
            "RST in",
            seg(80, 41000, TCP_RST, S_ISN + 1 + 1_000_000, 0, 0),
            &[],
        );
        assert_eq!(state(r), (FlowState::TcpClosed, FLAG_FIN_ORIG));
    });
}

/// As IPv4's `a_new_syn_in_syn_sent_is_the_one_answered`: a client that
/// starts over from the same port with a later ISN before any answer gets
/// its flow established by the answer to the new SYN only.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_new_syn6_in_syn_sent_is_the_one_answered() {
    let env = topology();
    with_router(&env, config(&env, Admit::Xdp), |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let orig = FlowKey6::new(c, s, 41002, 82, IPPROTO_TCP);
        let second_isn = C_ISN.wrapping_add(0x0100_0000);
        for (what, isn, events) in [
            ("SYN", C_ISN, &[Counter::Flow6NewOutbound][..]),
            ("SYN with a later ISN", second_isn, &[][..]),
        ] {
            let ip = Ipv6::tcp(c, s, &seg(41002, 82, TCP_SYN, isn, 0, 64240));
            r.redirect(
                what,
                &from_client(&env, &ip),
                lan,
                &to_server(&env, &ip),
                Counter::Fwd6Outbound,
                events,
            );
            assert_eq!(
                r.conntrack6()[&orig.reversed()].tcp.ack,
                isn.wrapping_add(1),
                "{what}"
            );
        }
        for (what, ack, events, want) in [
            (
                "SYN+ACK to the first SYN",
                C_ISN.wrapping_add(1),
                &[Counter::TcpOutOfWindow][..],
                FlowState::TcpSynSent,
            ),
            (
                "SYN+ACK to the second SYN",
                second_isn.wrapping_add(1),
                &[][..],
                FlowState::TcpEstablished,
            ),
        ] {
            let ip = Ipv6::tcp(s, c, &seg(82, 41002, TCP_SYN | TCP_ACK, S_ISN, ack, 65160));
            r.redirect(
                what,
                &from_server(&env, &ip),
                wan,
                &to_client(&env, &ip),
                Counter::Fwd6Inbound,
                events,
            );
            let ct = r.conntrack6();
            assert_eq!(ct[&orig].state, want as u8, "{what}");
            assert_eq!(ct[&orig.reversed()].state, want as u8, "{what}");
        }
    });
}
