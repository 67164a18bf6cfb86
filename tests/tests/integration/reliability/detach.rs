//! Detach while traffic runs: the kernel path takes over.

use super::*;

/// Outcome of repeated echoes on one flow: (seconds since start, ok).
type Log = Mutex<Vec<(f64, bool)>>;

/// (ok before `at`, ok after, failed after) of a log.
fn split(log: &Log, at: f64) -> (usize, usize, usize) {
    let v = log.lock().unwrap();
    let before = v.iter().filter(|(t, ok)| *t < at && *ok).count();
    let after_ok = v.iter().filter(|(t, ok)| *t >= at && *ok).count();
    let after_failed = v.iter().filter(|(t, ok)| *t >= at && !*ok).count();
    (before, after_ok, after_failed)
}

/// `router-ctl detach` while TCP streams and UDP echoes run, with the
/// kernel's MASQUERADE installed beforehand: the pins and the XDP
/// programs are gone, the kernel forwards, new connections work at once.
/// Two kinds of existing flows: one whose SNAT port the fast path kept
/// (source port inside `--port-range`) and one it remapped (outside). What
/// happens to them is printed, not asserted (the kernel's conntrack never
/// saw them; it picks TCP up mid-stream, `nf_conntrack_tcp_loose`, and
/// MASQUERADE keeps the source port if it can).
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted scenario, read top to bottom"
)]
fn detach_while_traffic_runs() {
    let t = Topology::new();
    t.masquerade();
    attach_and_print(&t, &["--port-range", "40000-49999"]);
    let life = Duration::from_mins(1);
    let _echo = MultiEcho::start(&t, Ns::Server, socket_addr(SERVER_ADDR, 5301), life);
    let udp_srv = UdpRecorder::start(&t, Ns::Server, socket_addr(SERVER_ADDR, 5300), life);
    // Port 44000/44001: kept by the fast path; 51000/51001: remapped.
    let mut streams: Vec<(u16, TcpStream)> = [44000, 51000]
        .into_iter()
        .map(|p| {
            (
                p,
                tcp_from(&t, Ns::Client, p, socket_addr(SERVER_ADDR, 5301)),
            )
        })
        .collect();
    let udps: Vec<(u16, UdpSocket)> = [44001, 51001]
        .into_iter()
        .map(|p| {
            let s = t.in_ns(Ns::Client, || {
                let s = UdpSocket::bind(socket_addr(Ipv4Addr::UNSPECIFIED, p)).unwrap();
                s.connect(socket_addr(SERVER_ADDR, 5300)).unwrap();
                s
            });
            (p, s)
        })
        .collect();
    for (_, s) in &mut streams {
        echo_once(s, b"warm", IO).unwrap();
    }
    for (_, u) in &udps {
        udp_once(u, b"warm", IO).unwrap();
    }
    let flows = t.conntrack();
    let mapping = |port: u16| -> String {
        let src = socket_addr(CLIENT_ADDR, port).to_string();
        flows
            .iter()
            .find(|f| f["orig_src"] == src.as_str())
            .map_or_else(
                || panic!("no flow from {src}: {flows:?}"),
                |f| f["xlat_src"].as_str().unwrap().to_owned(),
            )
    };
    let mappings: Vec<(u16, String)> = [44000, 51000, 44001, 51001]
        .into_iter()
        .map(|p| (p, mapping(p)))
        .collect();
    println!("fast-path mappings: {mappings:?}");
    let fwd_start = t.nstat(Ns::Router, "IpForwDatagrams");
    let xdp_start = t.stats();
    let start = Instant::now();
    let stop = AtomicBool::new(false);
    let chunk = vec![0x5au8; 1024];
    let tcp_logs: Vec<Log> = streams.iter().map(|_| Log::default()).collect();
    let udp_logs: Vec<Log> = udps.iter().map(|_| Log::default()).collect();
    let bounded = || !stop.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(20);
    let (detach_at, fwd_at_detach, xdp_at_detach) = std::thread::scope(|s| {
        for ((_, stream), log) in streams.iter_mut().zip(&tcp_logs) {
            let (chunk, bounded) = (&chunk, &bounded);
            s.spawn(move || {
                while bounded() {
                    let ok = echo_once(stream, chunk, Duration::from_secs(1)).is_ok();
                    log.lock()
                        .unwrap()
                        .push((start.elapsed().as_secs_f64(), ok));
                    if !ok {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            });
        }
        for ((_, u), log) in udps.iter().zip(&udp_logs) {
            let bounded = &bounded;
            s.spawn(move || {
                while bounded() {
                    let ok = udp_once(u, b"udp echo", Duration::from_millis(300)).is_ok();
                    log.lock()
                        .unwrap()
                        .push((start.elapsed().as_secs_f64(), ok));
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
        }
        std::thread::sleep(Duration::from_secs(1));
        let fwd = t.nstat(Ns::Router, "IpForwDatagrams");
        let xdp = t.stats();
        let at = start.elapsed().as_secs_f64();
        t.router_ctl_ok(&["detach"]);
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::SeqCst);
        (at, fwd, xdp)
    });
    assert!(!t.router_attached(), "pins left after detach");
    for dev in [LAN_IF, WAN_IF] {
        let link = t.exec_ok(Ns::Router, &["ip", "-d", "link", "show", dev]);
        assert!(!link.contains("prog/xdp"), "XDP still on {dev}: {link}");
    }
    let fwd_after = t.nstat(Ns::Router, "IpForwDatagrams");
    // New connections through the kernel's NAT work at once.
    let tcp_peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5320));
    let udp_peer = t.udp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5321));
    assert_eq!(tcp_peer.ip(), ROUTER_WAN_ADDR);
    assert_eq!(udp_peer.ip(), ROUTER_WAN_ADDR);
    assert!(
        fwd_after > fwd_at_detach,
        "the kernel does not forward after detach"
    );
    let xdp_out = counter_delta(&xdp_start, &xdp_at_detach, "fwd_outbound");
    let xdp_in = counter_delta(&xdp_start, &xdp_at_detach, "fwd_inbound");
    assert!(xdp_out > 0 && xdp_in > 0, "the fast path carried nothing");
    println!(
        "before detach at {detach_at:.2} s: fast path {xdp_out} packets out, {xdp_in} in; \
         kernel forwarded {}; after detach the kernel forwarded {}",
        fwd_at_detach - fwd_start,
        fwd_after - fwd_at_detach
    );
    for ((port, _), log) in streams.iter().zip(&tcp_logs) {
        println!(
            "TCP stream from port {port}: echoes (ok before, ok after, failed after) = {:?}",
            split(log, detach_at)
        );
    }
    for ((port, _), log) in udps.iter().zip(&udp_logs) {
        println!(
            "UDP from port {port}: echoes (ok before, ok after, failed after) = {:?}",
            split(log, detach_at)
        );
    }
    let mut senders: Vec<SocketAddr> = udp_srv
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|(p, _)| *p)
        .collect();
    senders.sort();
    senders.dedup();
    println!("UDP server saw senders {senders:?}");
    let conntrack = t.exec(Ns::Router, &["cat", "/proc/net/nf_conntrack"]);
    println!(
        "kernel conntrack after detach:\n{}",
        String::from_utf8_lossy(&conntrack.stdout)
    );
}
