//! TCP through `BPF_PROG_RUN`: translation both ways and the state machine.

use super::*;

/// The sequence number `Tcp::new` gives every segment: here both sides'
/// initial sequence number.
const ISN: u32 = 0x1000_0001;
/// The end of the first flow's SYN (one byte of payload).
const SYN_END: u32 = ISN + 2;

/// TCP: SYN masqueraded (port preserved, options and payload kept), reply
/// translated back, and the state machine visible in both entries: SYN ->
/// `SYN_SENT`, SYN+ACK -> ESTABLISHED, RST -> CLOSED, SYN again -> reopened;
/// FIN from each side -> `FIN_WAIT` -> CLOSED.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn tcp_snat_reply_and_state_transitions() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(tcp_key(CLIENT, 40000, SERVER, 80), 40000);

        let syn = Ipv4::new(
            CLIENT,
            SERVER,
            Tcp::new(40000, 80, TCP_SYN).options(&MSS).payload(b"x"),
        );
        let run = r.redirect(
            "SYN out",
            &env.client_sends(&syn),
            lan,
            &env.to_server(&snat(&syn, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts = r.stamp(&f.orig, &run);
        assert_eq!(
            r.stamp(&f.reply(), &run),
            ts,
            "both entries carry the same time"
        );
        r.assert_flows("after SYN", f.entries(FlowState::TcpSynSent, 0, ts, ts));

        // Retransmitted SYN: same translation, no new flow.
        let run = r.redirect(
            "SYN again",
            &env.client_sends(&syn),
            lan,
            &env.to_server(&snat(&syn, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows(
            "after SYN again",
            f.entries(FlowState::TcpSynSent, 0, ts, seen),
        );

        // A bare ACK from the server does not establish.
        let ack_in = Ipv4::new(SERVER, WAN, Tcp::new(80, 40000, TCP_ACK));
        let run = r.redirect(
            "bare ACK in",
            &env.server_sends(&ack_in),
            wan,
            &env.to_client(&dnat(&ack_in, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after bare ACK",
            f.entries(FlowState::TcpSynSent, 0, ts, seen),
        );

        // It acknowledges the SYN (ISN and one byte of payload): a SYN+ACK
        // that does not is out of the client's window (see `tcp_window`).
        let mut synack_tcp = Tcp::new(80, 40000, TCP_SYN | TCP_ACK).options(&MSS);
        synack_tcp.ack = SYN_END;
        let synack = Ipv4::new(SERVER, WAN, synack_tcp);
        let run = r.redirect(
            "SYN+ACK in",
            &env.server_sends(&synack),
            wan,
            &env.to_client(&dnat(&synack, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after SYN+ACK",
            f.entries(FlowState::TcpEstablished, 0, ts, seen),
        );

        let data = Ipv4::new(
            CLIENT,
            SERVER,
            Tcp::new(40000, 80, TCP_ACK | TCP_PSH).payload(b"GET / HTTP/1.0\r\n\r\n"),
        );
        let run = r.redirect(
            "data out",
            &env.client_sends(&data),
            lan,
            &env.to_server(&snat(&data, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after data",
            f.entries(FlowState::TcpEstablished, 0, ts, seen),
        );

        // At the server's RCV.NXT, the end of the SYN.
        let mut rst_tcp = Tcp::new(40000, 80, TCP_RST | TCP_ACK);
        rst_tcp.seq = SYN_END;
        let rst = Ipv4::new(CLIENT, SERVER, rst_tcp);
        let run = r.redirect(
            "RST out",
            &env.client_sends(&rst),
            lan,
            &env.to_server(&snat(&rst, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows("after RST", f.entries(FlowState::TcpClosed, 0, ts, seen));

        // A new SYN on the closed flow reopens it (same port).
        let run = r.redirect(
            "SYN reopens",
            &env.client_sends(&syn),
            lan,
            &env.to_server(&snat(&syn, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after reopen",
            f.entries(FlowState::TcpSynSent, 0, ts, seen),
        );

        // Second flow: FIN from both sides.
        let g = Flow::masq(tcp_key(CLIENT, 40001, SERVER, 80), 40001);
        let syn2 = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 80, TCP_SYN));
        let run = r.redirect(
            "SYN 2 out",
            &env.client_sends(&syn2),
            lan,
            &env.to_server(&snat(&syn2, 40001)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts2 = r.stamp(&g.orig, &run);
        let mut synack2_tcp = Tcp::new(80, 40001, TCP_SYN | TCP_ACK);
        synack2_tcp.ack = ISN + 1;
        let synack2 = Ipv4::new(SERVER, WAN, synack2_tcp);
        let run = r.redirect(
            "SYN+ACK 2 in",
            &env.server_sends(&synack2),
            wan,
            &env.to_client(&dnat(&synack2, CLIENT, 40001)),
            Counter::FwdInbound,
            &[],
        );
        let seen2 = r.seen(&g.orig, ts2, &run);
        // Each FIN at its receiver's RCV.NXT: the end of the other's SYN.
        let mut fin_out_tcp = Tcp::new(40001, 80, TCP_FIN | TCP_ACK);
        fin_out_tcp.seq = ISN + 1;
        fin_out_tcp.ack = ISN + 1;
        let fin_out = Ipv4::new(CLIENT, SERVER, fin_out_tcp);
        let run = r.redirect(
            "FIN out",
            &env.client_sends(&fin_out),
            lan,
            &env.to_server(&snat(&fin_out, 40001)),
            Counter::FwdOutbound,
            &[],
        );
        let seen2 = r.seen(&g.orig, seen2, &run);
        r.assert_flows(
            "after FIN out",
            f.entries(FlowState::TcpSynSent, 0, ts, seen)
                .into_iter()
                .chain(g.entries(FlowState::TcpFinWait, FLAG_FIN_ORIG, ts2, seen2)),
        );
        let mut fin_in_tcp = Tcp::new(80, 40001, TCP_FIN | TCP_ACK);
        fin_in_tcp.seq = ISN + 1;
        let fin_in = Ipv4::new(SERVER, WAN, fin_in_tcp);
        let run = r.redirect(
            "FIN in",
            &env.server_sends(&fin_in),
            wan,
            &env.to_client(&dnat(&fin_in, CLIENT, 40001)),
            Counter::FwdInbound,
            &[],
        );
        let seen2 = r.seen(&g.orig, seen2, &run);
        let both = FLAG_FIN_ORIG | FLAG_FIN_REPLY;
        // The last ACK still goes through the fast path; state stays CLOSED.
        let last_ack = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 80, TCP_ACK));
        let run = r.redirect(
            "last ACK out",
            &env.client_sends(&last_ack),
            lan,
            &env.to_server(&snat(&last_ack, 40001)),
            Counter::FwdOutbound,
            &[],
        );
        let seen2 = r.seen(&g.orig, seen2, &run);
        r.assert_flows(
            "after FIN in",
            f.entries(FlowState::TcpSynSent, 0, ts, seen)
                .into_iter()
                .chain(g.entries(FlowState::TcpClosed, both, ts2, seen2)),
        );
    });
}

/// Offload mode, IPv4: a pair the daemon wrote pending (`LEASE_PENDING`)
/// passes every packet to the kernel untouched, a SYN on it hands both
/// entries back, and the daemon's lease compare-and-swap (the real
/// program, on this router's `CONNTRACK`) activates only from pending.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn pending_offload_passes_hands_back_and_activates_only_from_pending() {
    use aya::maps::IterableMap as _;
    use router_common::lease_cas::{self, LeaseCas, LeaseCasCtx, LeaseSwap};
    use router_common::maps::{
        Admit, FLAG_OFFLOADED, LEASE_HANDED_BACK, LEASE_PENDING, lease_tick,
    };
    use std::os::fd::{AsFd as _, AsRawFd as _};
    let env = ResolvedTopology::new(false);
    let mut cfg = config(&env);
    cfg.admit = Admit::Kernel as u8;
    with_router(&env, Some(cfg), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let fd = r.conntrack.map().fd().as_fd().as_raw_fd();
        let cas = LeaseCas::load(&lease_cas::conntrack_program(fd))
            .expect("load the lease compare-and-swap");
        // 192.168.x client:40001 -> server:443, masqueraded to WAN:61001.
        let orig = tcp_key(CLIENT, 40001, SERVER, 443);
        let reply = tcp_key(SERVER, 443, WAN, 61001);
        let write_pending = |r: &mut Router| {
            let e = |peer: FlowKey, flags| FlowEntry {
                peer,
                state: FlowState::TcpEstablished as u8,
                flags: flags | FLAG_OFFLOADED,
                lease: LEASE_PENDING,
                ..FlowEntry::default()
            };
            r.put(orig, e(reply, FLAG_ORIGINAL));
            r.put(reply, e(orig, 0));
        };
        write_pending(r);
        let before = (r.entry(&orig), r.entry(&reply));
        let data = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 443, TCP_ACK).payload(b"hi"));
        let answer = Ipv4::new(SERVER, WAN, Tcp::new(443, 61001, TCP_ACK).payload(b"ho"));
        r.pass(
            "data out, pending",
            &env.client_sends(&data),
            lan,
            Counter::PassOffloadPending,
        );
        r.pass(
            "data in, pending",
            &env.server_sends(&answer),
            wan,
            Counter::PassOffloadPending,
        );
        assert_eq!((r.entry(&orig), r.entry(&reply)), before, "untouched");
        // Activation only from pending.
        let lease = lease_tick(now_ns()) + 60;
        for k in [reply, orig] {
            let swap = cas.swap(LeaseCasCtx::v4(&k, LEASE_PENDING, lease)).unwrap();
            assert_eq!(swap, LeaseSwap::Swapped, "activate {k:?}");
            let again = cas
                .swap(LeaseCasCtx::v4(&k, LEASE_PENDING, lease + 1))
                .unwrap();
            assert_eq!(again, LeaseSwap::Changed(lease), "activate {k:?} again");
            assert_eq!(r.entry(&k).unwrap().lease, lease);
        }
        // Written pending again; the client's next connection on the same
        // ports sends its SYN before the activation: both handed back, the
        // activation fails.
        write_pending(r);
        let syn = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 443, TCP_SYN));
        r.pass(
            "SYN out, pending",
            &env.client_sends(&syn),
            lan,
            Counter::PassOffloadTcpControl,
        );
        for k in [reply, orig] {
            assert_eq!(r.entry(&k).unwrap().lease, LEASE_HANDED_BACK, "{k:?}");
            let swap = cas.swap(LeaseCasCtx::v4(&k, LEASE_PENDING, lease)).unwrap();
            assert_eq!(
                swap,
                LeaseSwap::Changed(LEASE_HANDED_BACK),
                "activate {k:?}"
            );
        }
        let other = tcp_key(CLIENT, 40002, SERVER, 443);
        let gone = cas
            .swap(LeaseCasCtx::v4(&other, LEASE_PENDING, lease))
            .unwrap();
        assert_eq!(gone, LeaseSwap::Gone);
    });
}

/// Offload mode, IPv4: an offloaded connection's entries learn their
/// windows from its first ACK each way (their scale from the kernel's
/// conntrack, `TCP_TRACK_LEARN`). Then a RST from the WAN outside the
/// client's window (a blind one, RFC 5961 3.2) is carried to the client,
/// which discards it, counted out of window (a FIN past its window too),
/// and the connection stays
/// offloaded: handed back, the kernel (window check off for offloaded
/// connections) would have closed it. One in the window hands the
/// connection back to the kernel as before.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence of frames, read top to bottom"
)]
fn offloaded_connection_carries_a_blind_rst_and_hands_back_a_true_one() {
    use router_common::maps::{
        Admit, LEASE_HANDED_BACK, TCP_TRACK_KNOWN, TCP_TRACK_LEARN, TcpWindow,
    };
    let env = ResolvedTopology::new(false);
    let mut cfg = config(&env);
    cfg.admit = Admit::Kernel as u8;
    with_router(&env, Some(cfg), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let orig = tcp_key(CLIENT, 40005, SERVER, 443);
        let reply = tcp_key(SERVER, 443, WAN, 61005);
        let learning = TcpWindow {
            wscale: 7,
            flags: TCP_TRACK_LEARN,
            ..TcpWindow::default()
        };
        let lease = put_offloaded_flow(r, orig, 61005, FlowState::TcpEstablished, learning);
        // The client acknowledges 5000 with a window of 500 (<< 7: 64,000
        // bytes); the server 1000 with 300.
        let seg = |seq, ack, window, flags| Tcp {
            seq,
            ack,
            window,
            ..Tcp::new(0, 0, flags)
        };
        let out = Ipv4::new(
            CLIENT,
            SERVER,
            Tcp {
                sport: 40005,
                dport: 443,
                ..seg(1000, 5000, 500, TCP_ACK)
            },
        );
        r.redirect(
            "data out",
            &env.client_sends(&out),
            lan,
            &env.to_server(&snat(&out, 61005)),
            Counter::FwdOutbound,
            &[],
        );
        let known = |ack, win| TcpWindow {
            ack,
            win,
            wscale: 7,
            flags: TCP_TRACK_KNOWN,
        };
        assert_eq!(r.raw_entry(&orig).tcp, known(5000, 500));
        let from_server = |s: Tcp| {
            Ipv4::new(
                SERVER,
                WAN,
                Tcp {
                    sport: 443,
                    dport: 61005,
                    ..s
                },
            )
        };
        let answer = from_server(seg(5000, 1000, 300, TCP_ACK));
        // The server's first ACK comes at a refresh (the direction's other
        // path: `track`, not the hit's inline tracking).
        let mut aged = r.raw_entry(&reply);
        aged.last_seen_ns -= 2 * router_common::flow::REFRESH_NS;
        r.put(reply, aged);
        r.redirect(
            "data in",
            &env.server_sends(&answer),
            wan,
            &env.to_client(&dnat(&answer, CLIENT, 40005)),
            Counter::FwdInbound,
            &[],
        );
        assert_eq!(r.raw_entry(&reply).tcp, known(1000, 300));

        // A blind RST: before what the client acknowledged (in the
        // server's own window, judged against the receiver's: the client's).
        let blind = from_server(seg(1010, 0, 0, TCP_RST));
        r.redirect(
            "blind RST in",
            &env.server_sends(&blind),
            wan,
            &env.to_client(&dnat(&blind, CLIENT, 40005)),
            Counter::FwdInbound,
            &[Counter::TcpOutOfWindow],
        );
        for k in [orig, reply] {
            let e = r.raw_entry(&k);
            assert_eq!(
                (e.lease, e.state),
                (lease, FlowState::TcpEstablished as u8),
                "{k:?}"
            );
        }
        // A blind FIN: past the client's window (64,000 bytes from 5000,
        // with the half window of slack for acknowledgements in flight).
        // Its acknowledgement moved far on: an out-of-window segment
        // teaches the tracking nothing.
        let blind_fin = from_server(seg(5000 + 200_000, 1000 + 100_000, 300, TCP_FIN | TCP_ACK));
        let tracking = [orig, reply].map(|k| r.raw_entry(&k).tcp);
        r.redirect(
            "blind FIN in",
            &env.server_sends(&blind_fin),
            wan,
            &env.to_client(&dnat(&blind_fin, CLIENT, 40005)),
            Counter::FwdInbound,
            &[Counter::TcpOutOfWindow],
        );
        for (k, t) in [orig, reply].into_iter().zip(tracking) {
            let e = r.raw_entry(&k);
            assert_eq!(
                (e.lease, e.state, e.tcp),
                (lease, FlowState::TcpEstablished as u8, t),
                "after the blind FIN {k:?}"
            );
        }
        assert_eq!(tracking[1], known(1000, 300));
        r.redirect(
            "data in after it",
            &env.server_sends(&answer),
            wan,
            &env.to_client(&dnat(&answer, CLIENT, 40005)),
            Counter::FwdInbound,
            &[],
        );
        // In the client's window: the kernel's.
        let rst = from_server(seg(5000, 0, 0, TCP_RST));
        r.pass(
            "RST in, in the window",
            &env.server_sends(&rst),
            wan,
            Counter::PassOffloadTcpControl,
        );
        for k in [orig, reply] {
            assert_eq!(r.raw_entry(&k).lease, LEASE_HANDED_BACK, "{k:?}");
        }
    });
}
