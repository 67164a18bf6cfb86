//! The fast path under an in-kernel packet generator (`BPF_PROG_RUN` live
//! frames, the benchmark's pps generator): real frames at a rate iperf2
//! cannot send, through client -- router -- server with the XDP router
//! attached. The server's own UDP stack receives them and checks the
//! checksums; every datagram it got must carry the router's WAN address,
//! one of the generated source ports (preserved) and the payload intact,
//! and each generated flow must have exactly one mapping.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tests::frames::{Frame, Ipv4, Udp};
use tests::rawbpf::{Prog, UDP_HDRS_LEN, udp_generator};
use tests::{
    CLIENT_ADDR, HOST_IF, LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF, counter_of,
    kernel_at_least, pattern,
};

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
    let headers: &[u8; UDP_HDRS_LEN] = frame[..UDP_HDRS_LEN].try_into().unwrap();
    let generator = Prog::load("test_gen", &udp_generator(headers, FLOWS, BASE_PORT))
        .expect("the verifier accepts the generator");

    let sock = t.in_ns(Ns::Server, || {
        UdpSocket::bind(SocketAddr::new(SERVER_ADDR.into(), DST_PORT)).unwrap()
    });
    let sock = socket2::Socket::from(sock);
    let _ = sock.set_recv_buffer_size(8 << 20);
    let sock = UdpSocket::from(sock);
    sock.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();

    // A reader on another thread drains the socket while the generator
    // runs; it stops after half a second without a datagram.
    let generating = AtomicBool::new(true);
    let cli_if = t.ifindex(Ns::Client, HOST_IF);
    let (seen, live) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut seen: Vec<(SocketAddr, Vec<u8>)> = Vec::new();
            let mut buf = [0u8; 2048];
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                match sock.recv_from(&mut buf) {
                    Ok((n, from)) => seen.push((from, buf[..n].to_vec())),
                    Err(_) if generating.load(Ordering::Relaxed) => {}
                    Err(_) => break,
                }
            }
            seen
        });
        let live = t.in_ns(Ns::Client, || {
            generator.run_live(&frame, cli_if, FRAMES, 64)
        });
        generating.store(false, Ordering::Relaxed);
        (reader.join().unwrap(), live)
    });
    if let Err(e) = live {
        // Live-frame mode came with Linux 5.18; anywhere newer a failure is
        // the generator's or the harness's fault.
        if !kernel_at_least(5, 18) {
            println!("SKIP: BPF_PROG_RUN live frames need Linux >= 5.18: {e}");
            return;
        }
        panic!("{e}");
    }

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
