//! The window check of TCP RST, FIN and SYN+ACK through `BPF_PROG_RUN`:
//! segments the receiver would not accept change no state, are counted
//! (`tcp_out_of_window`) and forwarded all the same; accepted ones change
//! it. Sequence numbers start just below the wrap of the sequence space.

use router_common::flow::{ASSUMED_WSCALE, MAX_WSCALE, MIN_ACK_STEP};
use router_common::maps::{TCP_TRACK_EXPECT, TCP_TRACK_KNOWN, TCP_TRACK_SYN};

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
fn rst_and_fin_only_in_the_receivers_window() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(tcp_key(CLIENT, 41000, SERVER, 80), 41000);
        let out = |r: &Router, what: &str, t: Tcp, events: &[Counter]| {
            let ip = Ipv4::new(CLIENT, SERVER, t);
            r.redirect(
                what,
                &env.client_sends(&ip),
                lan,
                &env.to_server(&snat(&ip, 41000)),
                Counter::FwdOutbound,
                events,
            );
        };
        let inb = |r: &Router, what: &str, t: Tcp, events: &[Counter]| {
            let ip = Ipv4::new(SERVER, WAN, t);
            r.redirect(
                what,
                &env.server_sends(&ip),
                wan,
                &env.to_client(&dnat(&ip, CLIENT, 41000)),
                Counter::FwdInbound,
                events,
            );
        };
        let state = |r: &Router| {
            let (o, p) = (r.get(&f.orig), r.get(&f.reply()));
            assert_eq!(
                (o.state, o.flags & !FLAG_ORIGINAL),
                (p.state, p.flags),
                "both entries agree"
            );
            (
                FlowState::from_u8(o.state).unwrap(),
                o.flags & (FLAG_FIN_ORIG | FLAG_FIN_REPLY),
            )
        };
        let client_tcp = |r: &Router| r.raw_entry(&f.orig).tcp;
        let server_tcp = |r: &Router| r.raw_entry(&f.reply()).tcp;
        let oow = [Counter::TcpOutOfWindow];

        out(
            r,
            "SYN",
            seg(41000, 80, TCP_SYN, C_ISN, 0, 64240),
            &[Counter::FlowNewMasquerade],
        );
        // The data path does not read options: every SYN is taken to
        // offer the largest window scale.
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
        // SYN windows are unscaled: 64240 bytes in units of 2^14, rounded up.
        assert_eq!(
            client_tcp(r),
            TcpWindow {
                ack: S_ISN + 1,
                win: 4,
                wscale: MAX_WSCALE,
                flags: TCP_TRACK_SYN | TCP_TRACK_KNOWN
            }
        );
        assert_eq!(
            server_tcp(r),
            TcpWindow {
                ack: C_ISN + 1,
                win: 4,
                wscale: MAX_WSCALE,
                flags: TCP_TRACK_KNOWN
            }
        );
        // The client's first ACK advertises its scaled window (502 units).
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
        // Just before the client's ACK: old, also refused.
        inb(r, "old RST in", seg(80, 41000, TCP_RST, S_ISN, 0, 0), &oow);
        // And from the LAN towards the server.
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
        assert!(fin_seq < C_ISN, "wrapped");
        out(
            r,
            "FIN out",
            seg(41000, 80, TCP_FIN | TCP_ACK, fin_seq, S_ISN + 1, 502),
            &[],
        );
        assert_eq!(state(r), (FlowState::TcpFinWait, FLAG_FIN_ORIG));
        // Retransmitted: no change, not judged.
        out(
            r,
            "FIN out again",
            seg(41000, 80, TCP_FIN | TCP_ACK, fin_seq, S_ISN + 1, 502),
            &[],
        );
        assert_eq!(state(r), (FlowState::TcpFinWait, FLAG_FIN_ORIG));

        // The server's RST 1 MB past the client's ACK: beyond any unscaled
        // window, inside the scaled one (502 << 14 bytes plus a step).
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

/// A RST answering a SYN to a closed port (sequence number 0, the ACK of
/// the SYN) closes the flow; one with another ACK does not.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn rst_answering_a_syn_closes_only_with_its_ack() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(tcp_key(CLIENT, 41001, SERVER, 81), 41001);
        let syn = Ipv4::new(CLIENT, SERVER, seg(41001, 81, TCP_SYN, C_ISN, 0, 64240));
        r.redirect(
            "SYN",
            &env.client_sends(&syn),
            lan,
            &env.to_server(&snat(&syn, 41001)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        for (what, ack, events, want) in [
            (
                "RST with another ACK",
                C_ISN,
                &[Counter::TcpOutOfWindow][..],
                FlowState::TcpSynSent,
            ),
            (
                "RST refusing the SYN",
                C_ISN.wrapping_add(1),
                &[][..],
                FlowState::TcpClosed,
            ),
        ] {
            let rst = Ipv4::new(SERVER, WAN, seg(81, 41001, TCP_RST | TCP_ACK, 0, ack, 0));
            r.redirect(
                what,
                &env.server_sends(&rst),
                wan,
                &env.to_client(&dnat(&rst, CLIENT, 41001)),
                Counter::FwdInbound,
                events,
            );
            assert_eq!(r.get(&f.orig).state, want as u8, "{what}");
            assert_eq!(r.get(&f.reply()).state, want as u8, "{what}");
        }
    });
}

/// A client that starts over from the same port before any answer (a new
/// SYN with a later ISN while the flow is `SYN_SENT`): the answer to the
/// new SYN establishes the flow, one to the old SYN does not.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_new_syn_in_syn_sent_is_the_one_answered() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(tcp_key(CLIENT, 41002, SERVER, 82), 41002);
        let second_isn = C_ISN.wrapping_add(0x0100_0000);
        for (what, isn, events) in [
            ("SYN", C_ISN, &[Counter::FlowNewMasquerade][..]),
            ("SYN with a later ISN", second_isn, &[][..]),
        ] {
            let syn = Ipv4::new(CLIENT, SERVER, seg(41002, 82, TCP_SYN, isn, 0, 64240));
            r.redirect(
                what,
                &env.client_sends(&syn),
                lan,
                &env.to_server(&snat(&syn, 41002)),
                Counter::FwdOutbound,
                events,
            );
            assert_eq!(
                r.raw_entry(&f.reply()).tcp.ack,
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
            let synack = Ipv4::new(
                SERVER,
                WAN,
                seg(82, 41002, TCP_SYN | TCP_ACK, S_ISN, ack, 65160),
            );
            r.redirect(
                what,
                &env.server_sends(&synack),
                wan,
                &env.to_client(&dnat(&synack, CLIENT, 41002)),
                Counter::FwdInbound,
                events,
            );
            assert_eq!(r.get(&f.orig).state, want as u8, "{what}");
            assert_eq!(r.get(&f.reply()).state, want as u8, "{what}");
        }
    });
}
