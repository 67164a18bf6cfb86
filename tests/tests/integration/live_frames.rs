//! The fast path under an in-kernel packet generator (`BPF_PROG_RUN` live
//! frames, the benchmark's pps generator): real frames at a rate iperf2
//! cannot send, through client -- router -- server with the XDP router
//! attached. The server's own UDP stack receives them and checks the
//! checksums; every datagram it got must carry the router's WAN address,
//! one of the generated source ports (preserved) and the payload intact,
//! and each generated flow must have exactly one mapping.
//!
//! The same generator over IPv6: its checksum update checked frame by
//! frame under `BPF_PROG_RUN` (including a result of 0, sent as 0xffff),
//! then a bounded flood routed by the fast path, every datagram captured at
//! the server and checked from scratch.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use std::io::Read as _;
use tests::frames::{Frame, Ipv4, Udp};
use tests::rawbpf::{
    FLOW_ENTRY_PACKETS_OFF, FlowTable, Prog, UDP_HDRS_LEN, UdpLayout, flow_lookup_forwarder,
    udp_generator,
};

use router_common::maps::{FlowEntry, FlowKey, IPPROTO_UDP};
use tests::trafficgen::{Generator, Hosts, UdpFlows};
use tests::v6::{self, CLIENT6, Ipv6, SERVER6};
use tests::{
    CLIENT_ADDR, HOST_IF, LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF,
    counter_delta, counter_of, kernel_at_least, pattern,
};

use crate::ipv6_e2e::kernel_forwarded6;

const FLOWS: u16 = 64;
const BASE_PORT: u16 = 30_000;
const DST_PORT: u16 = 9;
const PAYLOAD: usize = 64;
/// Frames generated in all: bounded, a fraction of a second.
const FRAMES: u32 = 100_000;

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn fast_path_translates_every_datagram_of_a_live_frame_flood() {
    let t = Topology::new();
    t.warm_neighbours();
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let before = t.stats();
    let csum_errors0 = t.nstat(Ns::Server, "UdpInCsumErrors");

    let payload = pattern(PAYLOAD);
    let udp = Udp::new(BASE_PORT, DST_PORT, &payload);
    let ip = Ipv4::new(CLIENT_ADDR.octets(), SERVER_ADDR.octets(), udp);
    let frame = Frame::new(t.mac(Ns::Router, LAN_IF), t.mac(Ns::Client, HOST_IF), ip).bytes();
    let generator = Prog::load(
        "test_gen",
        &udp_generator(&frame[..UDP_HDRS_LEN], UdpLayout::IPV4, FLOWS, BASE_PORT),
    )
    .expect("the verifier accepts the generator");

    let sock = t.in_ns(Ns::Server, || {
        UdpSocket::bind(SocketAddr::new(SERVER_ADDR.into(), DST_PORT)).unwrap()
    });
    let sock = socket2::Socket::from(sock);
    let _ = sock.set_recv_buffer_size(8 << 20);
    let sock = UdpSocket::from(sock);
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();

    let cli_if = t.ifindex(Ns::Client, HOST_IF);
    let Some(seen) = flood_and_collect(
        "live_frames::fast_path_translates_every_datagram_of_a_live_frame_flood",
        || {
            t.in_ns(Ns::Client, || {
                generator.run_live(&frame, cli_if, FRAMES, 64)
            })
        },
        |buf| {
            let (n, from) = sock.recv_from(buf)?;
            Ok(Some((from, buf[..n].to_vec())))
        },
    ) else {
        return;
    };

    let after = t.stats();
    let delta = |name: &str| counter_of(&after, name) - counter_of(&before, name);
    println!(
        "generated {FRAMES} frames; the server's socket got {}; router fwd_outbound {}",
        seen.len(),
        delta("fwd_outbound")
    );
    // Frames lost to full veth rings or the socket's buffer are fine; a
    // wrong byte in any that arrived is not.
    assert!(
        seen.len() >= usize::from(FLOWS) * 4,
        "only {} datagrams reached the server",
        seen.len()
    );
    let mut ports = BTreeSet::new();
    for (from, data) in &seen {
        assert_eq!(from.ip(), IpAddr::V4(ROUTER_WAN_ADDR), "not masqueraded");
        assert!(
            (BASE_PORT..BASE_PORT + FLOWS).contains(&from.port()),
            "source port {} was not preserved",
            from.port()
        );
        assert_eq!(data, &payload, "payload changed");
        ports.insert(from.port());
    }
    assert_eq!(
        ports.len(),
        usize::from(FLOWS),
        "not every flow got through"
    );
    assert_eq!(
        t.nstat(Ns::Server, "UdpInCsumErrors") - csum_errors0,
        0,
        "the server saw UDP checksum errors"
    );
    // One mapping per flow: the first datagram of each creates it, the
    // thousands after hit it.
    assert_eq!(delta("flow_new_masquerade"), u64::from(FLOWS));
    assert!(delta("fwd_outbound") >= seen.len() as u64);
    let flows = t.conntrack();
    let udp: Vec<_> = flows
        .iter()
        .filter(|f| f["proto"] == "udp" && f["orig_dst"] == format!("{SERVER_ADDR}:{DST_PORT}"))
        .collect();
    assert_eq!(udp.len(), usize::from(FLOWS), "{udp:?}");
}

/// Runs `flood` (the generator) while a reader thread calls `recv` (a
/// read with a timeout, into the buffer it is given) and keeps what it
/// returns; the reader stops at its first timeout after the flood, or
/// after 30 s. Fails where live-frame mode is missing (Linux < 5.18);
/// `None`, recorded as skipped (test `name`), where the kernel refuses it
/// to this process (some sandboxes).
fn flood_and_collect<T: Send>(
    name: &str,
    flood: impl FnOnce() -> Result<(), String> + Send,
    mut recv: impl FnMut(&mut [u8]) -> std::io::Result<Option<T>> + Send,
) -> Option<Vec<T>> {
    let generating = AtomicBool::new(true);
    let (seen, live) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut seen = Vec::new();
            let mut buf = [0u8; 2048];
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                match recv(&mut buf) {
                    Ok(Some(x)) => seen.push(x),
                    Ok(None) => {}
                    Err(_) if generating.load(Ordering::Relaxed) => {}
                    Err(_) => break,
                }
            }
            seen
        });
        let live = flood();
        generating.store(false, Ordering::Relaxed);
        (reader.join().unwrap(), live)
    });
    if let Err(e) = live {
        if e.starts_with(tests::rawbpf::LIVE_FRAMES_NOT_PERMITTED) {
            tests::skipped(name, &e);
            return None;
        }
        // Live-frame mode came with Linux 5.18: on an older kernel the test
        // fails with that reason (it does not pass untested).
        assert!(
            kernel_at_least(5, 18),
            "BPF_PROG_RUN live frames need Linux >= 5.18, which this kernel is not: {e}"
        );
        panic!("{e}");
    }
    Some(seen)
}

/// IPv6 flood: first source port, destination port, payload and frames.
const BASE_PORT6: u16 = 40_000;
const FLOWS6: u16 = 32;
/// Frames of the IPv6 flood: one `BPF_PROG_RUN` call, well under a second.
const FRAMES6: u32 = 50_000;

/// Under `BPF_PROG_RUN` (no interface, nothing sent), the IPv6 generator
/// returns `XDP_TX` with the template's headers, one of its two source
/// ports, and a UDP checksum that verifies from scratch; the template's
/// payload makes the checksum of the second port come out as 0, which
/// must go on the wire as 0xffff (RFC 8200 8.1: 0 is not allowed).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ipv6_generator_updates_the_udp_checksum_per_frame() {
    let (src, dst) = (v6::o(CLIENT6), v6::o(SERVER6));
    let (dst_mac, src_mac) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let datagram = |sport: u16, payload: &[u8]| {
        Ipv6::udp(src, dst, &Udp::new(sport, DST_PORT, payload)).frame(dst_mac, src_mac)
    };
    let layout = UdpLayout::IPV6;
    let csum_of = |f: &[u8]| u16::from_be_bytes([f[layout.csum_off], f[layout.csum_off + 1]]);
    // The checksum with the last payload word zeroed, written into that
    // word: the sum becomes 0xffff and the checksum 0.
    let mut payload = pattern(PAYLOAD);
    payload[PAYLOAD - 2..].fill(0);
    let c = csum_of(&datagram(BASE_PORT6 + 1, &payload));
    payload[PAYLOAD - 2..].copy_from_slice(&c.to_be_bytes());
    assert_eq!(
        csum_of(&datagram(BASE_PORT6 + 1, &payload)),
        0xffff,
        "test setup: the second port's checksum computes to 0"
    );
    let template = datagram(BASE_PORT6, &payload);
    let prog = Prog::load(
        "test_gen6",
        &udp_generator(&template[..layout.headers_len()], layout, 2, BASE_PORT6),
    )
    .expect("the verifier accepts the IPv6 generator");

    let mut per_port = [0u32; 2];
    for _ in 0..200 {
        let (verdict, _, out) = prog.test_run(&template, 0, 1).expect("BPF_PROG_RUN");
        assert_eq!(verdict, tests::rawbpf::XDP_TX.cast_unsigned());
        let sport = u16::from_be_bytes([out[layout.sport_off], out[layout.sport_off + 1]]);
        let i = usize::from(sport.wrapping_sub(BASE_PORT6));
        assert!(i < 2, "source port {sport} out of range");
        per_port[i] += 1;
        assert_eq!(out, datagram(sport, &payload), "frame for port {sport}");
        assert!(v6::checksum_errors6(&out).is_empty(), "{out:02x?}");
        if i == 1 {
            assert_eq!(csum_of(&out), 0xffff, "a 0 checksum must be sent as 0xffff");
        }
    }
    // 200 draws of a fair coin: either side empty has odds 2^-199.
    assert!(per_port.iter().all(|&n| n > 0), "ports drawn {per_port:?}");
}

/// An `AF_PACKET` socket on one interface: every IPv6 frame it receives,
/// Ethernet header included, into a buffer forced large (root).
struct Capture6(socket2::Socket);

impl Capture6 {
    const ETH_P_IPV6: u16 = 0x86dd;

    /// Opens it in the calling thread's namespace.
    fn open(ifindex: u32) -> Self {
        let fd = tests::packet::packet_socket(
            ifindex,
            Self::ETH_P_IPV6,
            tests::packet::Framing::Frame,
            false,
        )
        .expect("AF_PACKET socket on the capture interface");
        let sock = socket2::Socket::from(fd);
        let (level, name) = (libc::SOL_SOCKET, libc::SO_RCVBUFFORCE);
        tests::sockopt::set_int(&sock, level, name, 64 << 20, "SO_RCVBUFFORCE");
        sock.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        Self(sock)
    }

    /// Frames the socket dropped for want of buffer space so far
    /// (`PACKET_STATISTICS`, which resets on reading).
    fn drops(&self) -> u32 {
        let (level, name) = (libc::SOL_PACKET, libc::PACKET_STATISTICS);
        // SAFETY: the kernel's struct for PACKET_STATISTICS, valid all zero.
        let st: libc::tpacket_stats =
            unsafe { tests::sockopt::get(&self.0, level, name, "PACKET_STATISTICS") };
        st.tp_drops
    }
}

/// The IPv6 flood through the XDP path (standalone mode): routed, not
/// translated. Every UDP datagram captured at the server's interface has
/// the client's address and a generated source port, the hop limit one
/// less, the router's WAN MAC as source and the server's as destination,
/// the payload intact and a checksum that verifies from scratch; every flow
/// gets through; the program's IPv6 forwarding counter covers them all
/// while the kernel's (`Ip6OutForwDatagrams`) stays flat.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ipv6_live_frame_flood_is_routed_by_the_fast_path() {
    let t = Topology::new();
    v6::enable(&t);
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    v6::resolve_neighbours(&t);
    let flows = UdpFlows::client_to_server(&t, BASE_PORT6, FLOWS6, DST_PORT, pattern(PAYLOAD))
        .unwrap()
        .between(Hosts::CLIENT_TO_SERVER6);
    let cli_if = t.ifindex(Ns::Client, HOST_IF);
    let generator = Generator::load("test_gen6", &flows, cli_if)
        .expect("the verifier accepts the IPv6 generator");
    let template = flows.frame();
    let (router_wan_mac, server_mac) = (t.mac(Ns::Router, WAN_IF), t.mac(Ns::Server, HOST_IF));
    let srv_if = t.ifindex(Ns::Server, HOST_IF);
    // A socket on the port, never read: the datagrams the capture sees
    // end there instead of drawing port unreachables.
    let _bound = t.in_ns(Ns::Server, || {
        UdpSocket::bind(SocketAddr::new(SERVER6.into(), DST_PORT)).unwrap()
    });
    let capture = t.in_ns(Ns::Server, || Capture6::open(srv_if));
    let before = t.stats();
    let kernel_before = kernel_forwarded6(&t);

    let Some(seen) = flood_and_collect(
        "live_frames::ipv6_live_frame_flood_is_routed_by_the_fast_path",
        || t.in_ns(Ns::Client, || generator.send(FRAMES6)),
        |buf| {
            let n = (&capture.0).read(buf)?;
            let f = &buf[..n];
            // Only the flood: the capture sees NDP too.
            let flood = n > v6::L4_6_OFF + 4
                && f[v6::IP6_OFF + 6] == IPPROTO_UDP
                && u16::from_be_bytes([f[v6::L4_6_OFF + 2], f[v6::L4_6_OFF + 3]]) == DST_PORT;
            Ok(flood.then(|| f.to_vec()))
        },
    ) else {
        return;
    };
    let after = t.stats();
    let kernel_fwd = kernel_forwarded6(&t) - kernel_before;
    let fwd6 = counter_delta(&before, &after, "fwd6_outbound");
    let drops = capture.drops();
    println!(
        "generated {FRAMES6} IPv6 frames; captured at the server {}, the capture dropped \
         {drops}; router fwd6_outbound {fwd6}, kernel Ip6OutForwDatagrams {kernel_fwd}",
        seen.len()
    );
    assert!(
        seen.len() >= usize::from(FLOWS6) * 4,
        "only {} datagrams reached the server",
        seen.len()
    );
    let mut ports = BTreeSet::new();
    for f in &seen {
        let sport = u16::from_be_bytes([f[v6::L4_6_OFF], f[v6::L4_6_OFF + 1]]);
        assert!(
            (BASE_PORT6..BASE_PORT6 + FLOWS6).contains(&sport),
            "source port {sport} is not a generated one"
        );
        ports.insert(sport);
        // What the router must have made of the generated frame: MACs
        // rewritten, hop limit - 1, nothing else touched (the UDP checksum
        // of the same port from scratch).
        let expected = Ipv6::udp(
            v6::o(CLIENT6),
            v6::o(SERVER6),
            &Udp::new(sport, DST_PORT, &pattern(PAYLOAD)),
        )
        .hop_limit(template[v6::HOP_LIMIT_OFF] - 1)
        .frame(server_mac, router_wan_mac);
        assert_eq!(f, &expected, "datagram from port {sport}");
        assert!(v6::checksum_errors6(f).is_empty(), "{f:02x?}");
    }
    assert_eq!(
        ports.len(),
        usize::from(FLOWS6),
        "not every flow got through"
    );
    assert!(
        fwd6 >= seen.len() as u64,
        "the program forwarded {fwd6} IPv6 packets, fewer than the {} captured",
        seen.len()
    );
    assert_eq!(
        kernel_fwd, 0,
        "the kernel forwarded {kernel_fwd} IPv6 packets during the flood; the fast path should have"
    );
}

/// The benchmark's sink under `BPF_PROG_RUN`: drops IPv4 and IPv6 UDP,
/// passes what ping and neighbour discovery need (ICMP, `ICMPv6` echo and
/// neighbour solicitation, ARP) and frames too short to judge.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn sink_drops_udp_of_both_families_and_passes_the_rest() {
    let sink = Prog::load("test_sink", &tests::rawbpf::udp_sink()).expect("sink loads");
    let (a, b) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]);
    let (c6, s6) = (v6::o(CLIENT6), v6::o(SERVER6));
    let udp = Udp::new(BASE_PORT, DST_PORT, &pattern(PAYLOAD));
    let udp4 = Frame::new(
        a,
        b,
        Ipv4::new(CLIENT_ADDR.octets(), SERVER_ADDR.octets(), udp.clone()),
    );
    let ping4 = Frame::new(
        a,
        b,
        Ipv4::new(
            CLIENT_ADDR.octets(),
            SERVER_ADDR.octets(),
            tests::frames::Icmp::echo_request(7, 1, b"ping"),
        ),
    );
    let mut arp = vec![0xff; 6];
    arp.extend_from_slice(&b);
    arp.extend_from_slice(&[0x08, 0x06]);
    arp.resize(60, 0);
    let cases: [(&str, Vec<u8>, i32); 6] = [
        ("IPv4 UDP", udp4.bytes(), tests::rawbpf::XDP_DROP),
        (
            "IPv6 UDP",
            Ipv6::udp(c6, s6, &udp).frame(a, b),
            tests::rawbpf::XDP_DROP,
        ),
        ("IPv4 ping", ping4.bytes(), tests::rawbpf::XDP_PASS),
        (
            "ping6",
            Ipv6::echo(c6, s6, false, 7, 1).frame(a, b),
            tests::rawbpf::XDP_PASS,
        ),
        (
            "neighbour solicitation",
            Ipv6::icmp6(c6, s6, v6::ICMP6_NEIGHBOUR_SOLICIT, 0, [0; 4], &s6).frame(a, b),
            tests::rawbpf::XDP_PASS,
        ),
        ("ARP", arp, tests::rawbpf::XDP_PASS),
    ];
    for (what, frame, want) in cases {
        let (verdict, _, _) = sink.test_run(&frame, 0, 1).expect("BPF_PROG_RUN");
        assert_eq!(verdict, want.cast_unsigned(), "{what}");
    }
    let mut short = Ipv6::udp(c6, s6, &udp).frame(a, b);
    short.truncate(33);
    let (verdict, _, _) = sink.test_run(&short, 0, 1).expect("BPF_PROG_RUN");
    assert_eq!(
        verdict,
        tests::rawbpf::XDP_PASS.cast_unsigned(),
        "a 33-byte frame"
    );
}

/// The benchmark's flow-table control (the limit plus one lookup of the
/// packet's 5-tuple) under `BPF_PROG_RUN` in the router's namespace: it
/// builds the key as the router's `FlowKey` (ports in host order), adds 1 to
/// the packet count of the entry it hits, misses every other flow and
/// protocol, and still forwards.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn flow_lookup_control_counts_the_hits_of_its_flow_key() {
    let t = Topology::new();
    t.warm_neighbours();
    let value_size = u32::try_from(size_of::<FlowEntry>()).unwrap();
    let table = FlowTable::create("test_flows", value_size, 64).expect("LRU hash created");
    let key = FlowKey::new(
        CLIENT_ADDR.octets(),
        SERVER_ADDR.octets(),
        BASE_PORT,
        DST_PORT,
        IPPROTO_UDP,
    );
    let zero = vec![0u8; size_of::<FlowEntry>()];
    for k in [key, key.reversed()] {
        table.insert(&k, &zero).expect("entry written");
    }
    let prog = Prog::load(
        "test_lookup",
        &flow_lookup_forwarder(&table, FLOW_ENTRY_PACKETS_OFF),
    )
    .expect("the verifier accepts the control");
    let (lan, client) = (t.mac(Ns::Router, LAN_IF), t.mac(Ns::Client, HOST_IF));
    let udp_from = |sport: u16| {
        let udp = Udp::new(sport, DST_PORT, &pattern(PAYLOAD));
        Frame::new(
            lan,
            client,
            Ipv4::new(CLIENT_ADDR.octets(), SERVER_ADDR.octets(), udp),
        )
        .bytes()
    };
    let ping = Frame::new(
        lan,
        client,
        Ipv4::new(
            CLIENT_ADDR.octets(),
            SERVER_ADDR.octets(),
            tests::frames::Icmp::echo_request(7, 1, b"ping"),
        ),
    )
    .bytes();
    let ingress = t.ifindex(Ns::Router, LAN_IF);
    assert_eq!(table.packets_off(), FLOW_ENTRY_PACKETS_OFF);
    let count = |k: &FlowKey| table.packets(k).expect("the entry is still there");
    t.in_ns(Ns::Router, || {
        let (verdict, _, _) = prog
            .test_run(&udp_from(BASE_PORT), ingress, 3)
            .expect("BPF_PROG_RUN");
        assert_eq!(
            verdict,
            tests::prog::XDP_REDIRECT,
            "the flow's datagram is forwarded"
        );
        assert_eq!(count(&key), 3, "three runs of the flow's datagram");
        for (what, frame) in [
            ("another source port", udp_from(BASE_PORT + 1)),
            ("ping", ping),
        ] {
            let (verdict, _, _) = prog.test_run(&frame, ingress, 1).expect("BPF_PROG_RUN");
            assert_eq!(verdict, tests::prog::XDP_REDIRECT, "{what} is forwarded");
        }
    });
    assert_eq!(count(&key), 3, "a miss counts nothing");
    assert_eq!(
        count(&key.reversed()),
        0,
        "the reply direction is another key"
    );
}
