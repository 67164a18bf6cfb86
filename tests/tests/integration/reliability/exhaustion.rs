//! Exhaustion: the conntrack table under a flood of new flows, and the SNAT
//! ports of one destination.

use super::*;

const FLOOD_SOCKETS: u16 = 40;
const FLOOD_PORTS: u16 = 500;
const LONG_LIVED: usize = 20;
const IDLE: usize = 10;

/// How many of `conns` still echo (tried in parallel, bounded).
fn count_survivors(conns: &mut [TcpStream]) -> usize {
    std::thread::scope(|s| {
        let hs: Vec<_> = conns
            .iter_mut()
            .map(|c| s.spawn(move || echo_once(c, b"survived?", IO).is_ok()))
            .collect();
        hs.into_iter()
            .filter_map(|h| h.join().ok())
            .filter(|&ok| ok)
            .count()
    })
}

/// A LAN flood of 20000 new UDP flows into a table of 512 flows, while 20
/// long-lived TCP connections keep exchanging messages: how many survive,
/// how evictions and allocation failures are counted, and that new flows
/// work again once the flood stops.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted scenario, read top to bottom"
)]
fn table_exhaustion_flood_keeps_established_flows_and_recovers() {
    let t = Topology::new();
    attach_and_print(&t, &["--max-flows", "512"]);
    let count0 = count_json(&t);
    assert_eq!(count0["capacity"], 1024, "{count0}");
    let echo = MultiEcho::start(
        &t,
        Ns::Server,
        socket_addr(SERVER_ADDR, 5301),
        Duration::from_secs(90),
    );
    let mut conns: Vec<TcpStream> = (0..LONG_LIVED)
        .map(|i| {
            tcp_from(
                &t,
                Ns::Client,
                43000 + i as u16,
                socket_addr(SERVER_ADDR, 5301),
            )
        })
        .collect();
    // A control group that stays idle during the flood.
    let mut idle: Vec<TcpStream> = (0..IDLE)
        .map(|i| {
            tcp_from(
                &t,
                Ns::Client,
                43100 + i as u16,
                socket_addr(SERVER_ADDR, 5301),
            )
        })
        .collect();
    for (i, c) in conns.iter_mut().chain(idle.iter_mut()).enumerate() {
        echo_once(c, format!("hello {i}").as_bytes(), IO).expect("long-lived connection");
    }
    let before = t.stats();
    let done = AtomicBool::new(false);
    let started = Instant::now();
    let (flood, exchanges) = std::thread::scope(|s| {
        let exchanger = s.spawn(|| {
            // Round robin over the connections until the flood is over; a
            // connection that fails once is not used again until the end.
            let mut alive = vec![true; conns.len()];
            let (mut ok, mut failed) = (0u64, 0u64);
            let deadline = Instant::now() + Duration::from_secs(30);
            while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
                for (i, c) in conns.iter_mut().enumerate() {
                    if alive[i] {
                        if echo_once(c, b"keepalive-message", Duration::from_secs(2)).is_ok() {
                            ok += 1;
                        } else {
                            alive[i] = false;
                            failed += 1;
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            (ok, failed)
        });
        let flood = t.in_ns(Ns::Client, || {
            let socks: Vec<UdpSocket> = (0..FLOOD_SOCKETS)
                .map(|_| UdpSocket::bind(socket_addr(Ipv4Addr::UNSPECIFIED, 0)).unwrap())
                .collect();
            let (mut sent, mut errors) = (0u64, 0u64);
            let deadline = Instant::now() + Duration::from_secs(20);
            'outer: for p in 0..FLOOD_PORTS {
                for s in &socks {
                    if Instant::now() >= deadline {
                        break 'outer;
                    }
                    match s.send_to(b"flood", socket_addr(SERVER_ADDR, 20000 + p)) {
                        Ok(_) => sent += 1,
                        Err(_) => errors += 1,
                    }
                    if (sent + errors).is_multiple_of(100) {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                }
            }
            (sent, errors)
        });
        std::thread::sleep(Duration::from_millis(200));
        done.store(true, Ordering::SeqCst);
        (flood, exchanger.join().unwrap())
    });
    let flood_secs = started.elapsed().as_secs_f64();
    let during = t.stats();
    let count_during = count_json(&t);

    // Survivors: each connection echoes once more (in parallel, bounded).
    let survivors = count_survivors(&mut conns);
    let idle_survivors = count_survivors(&mut idle);
    // Recovery: new flows work once the flood is over.
    let udp_peer = t.udp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5310));
    let tcp_peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5311));
    let after = t.stats();
    let count_after = count_json(&t);

    let new_flows = counter_delta(&before, &during, "flow_new_masquerade");
    println!(
        "flood: {} datagrams sent ({} send errors) in {flood_secs:.1} s, {} new flows counted, \
         table {count_during}",
        flood.0, flood.1, new_flows
    );
    println!(
        "during the flood: {} echoes ok, {} connections failed; survivors: active \
         {survivors}/{LONG_LIVED}, idle {idle_survivors}/{IDLE}",
        exchanges.0, exchanges.1
    );
    println!(
        "counters moved during the flood: {:?}",
        moved(&before, &during)
    );
    println!("counters moved by recovery: {:?}", moved(&during, &after));
    println!("after recovery: {count_after}; new flows from {udp_peer} and {tcp_peer}");

    let (flows_left, entries_left) = (
        count_during["flows"].as_u64().unwrap(),
        count_during["entries"].as_u64().unwrap(),
    );
    println!(
        "flows lost to the LRU: {} of {} created during the flood; half-flows (entry without \
         its peer) in the table: {}",
        (new_flows + (LONG_LIVED + IDLE) as u64).saturating_sub(flows_left),
        new_flows,
        entries_left.saturating_sub(2 * flows_left)
    );
    // At least half of the active connections survive (observed: all of
    // them, every run; their lookups keep their LRU entries referenced).
    // The idle ones are only reported: they survive all or none, by LRU
    // list placement.
    assert!(
        survivors * 2 >= LONG_LIVED,
        "only {survivors} of {LONG_LIVED} active connections survived the flood"
    );
    // The flood went far beyond the table and the table stayed bounded.
    assert!(new_flows > 4 * 512, "only {new_flows} new flows");
    // Evictions are counted (estimated from inserted - removed - present):
    // two entries per new flow into a table of 1024 entries, so at least
    // 2 * new_flows - 1024 >= new_flows were evicted.
    let evicted = after["conntrack"]["evicted_estimate"].as_u64().unwrap();
    println!("stats: about {evicted} entries evicted by the LRU");
    assert!(
        evicted >= new_flows,
        "eviction estimate {evicted} < {new_flows} new flows"
    );
    for c in [&count_during, &count_after] {
        assert!(c["entries"].as_u64().unwrap() <= 1024, "{c}");
    }
    // Accounting: each flood datagram the router saw moved one verdict
    // counter; the new flows are at most what was sent.
    assert!(
        new_flows <= flood.0 + LONG_LIVED as u64,
        "{new_flows} > {}",
        flood.0
    );
    assert_eq!(echo.accepted(), (LONG_LIVED + IDLE) as u64);
    assert_eq!(udp_peer.ip(), ROUTER_WAN_ADDR);
    assert_eq!(tcp_peer.ip(), ROUTER_WAN_ADDR);
}

/// With a range of ten SNAT ports, 30 UDP flows from distinct source ports
/// to one server address and port: each flow is either mapped by XDP to a
/// port of the range or, when its `MAX_PORT_PROBES` hashed candidates are
/// all taken, counted `pass_ports_exhausted` (one `port_collision` per
/// probe) and handed to the kernel untranslated, whose slow-path NAT (the
/// table standalone attach sets up) maps it to its own, disjoint ports. At
/// most ten flows get XDP ports (so at least 20 are exhausted), and while
/// the range is not full a flow may find no free port in its probes (the
/// probes are hashed, not a walk of the whole range); no WAN tuple is ever
/// mapped twice, by either path.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn port_exhaustion_for_one_destination() {
    let t = Topology::new();
    attach_and_print(&t, &["--port-range", "20000-20009"]);
    let srv = UdpRecorder::start(
        &t,
        Ns::Server,
        socket_addr(SERVER_ADDR, 5300),
        Duration::from_mins(1),
    );
    let base = t.stats();
    let fwd0 = t.nstat(Ns::Router, "IpForwDatagrams");
    let mut peers = Vec::new();
    let mut replies = 0;
    let mut xdp_flows = 0;
    for i in 0..30u16 {
        let port = 41000 + i;
        let msg = format!("flow {i}");
        let sock = t.in_ns(Ns::Client, || {
            let s = UdpSocket::bind(socket_addr(Ipv4Addr::UNSPECIFIED, port)).unwrap();
            s.connect(socket_addr(SERVER_ADDR, 5300)).unwrap();
            s
        });
        // One datagram per flow: a retry of an exhausted flow would be
        // counted again.
        sock.send(msg.as_bytes()).unwrap();
        let peer = srv
            .wait_for(msg.as_bytes(), IO)
            .unwrap_or_else(|| panic!("the server never saw flow {i}"));
        sock.set_read_timeout(Some(Duration::from_millis(if i < 10 { 2000 } else { 100 })))
            .unwrap();
        let mut buf = [0u8; 64];
        if sock.recv(&mut buf).is_ok() {
            replies += 1;
        }
        let s = t.stats();
        let exhausted = counter_delta(&base, &s, "pass_ports_exhausted");
        let new = counter_delta(&base, &s, "flow_new_masquerade");
        // Each flow moved exactly one of the two counters.
        assert_eq!(new + exhausted, u64::from(i) + 1, "flow {i}");
        assert!(new <= 10, "flow {i}: more XDP mappings than ports");
        assert_eq!(peer.ip(), ROUTER_WAN_ADDR, "flow {i} not masqueraded");
        if new > xdp_flows {
            assert!((20000..=20009).contains(&peer.port()), "flow {i}: {peer}");
        } else {
            assert!(
                (61000..=65535).contains(&peer.port()),
                "flow {i}: {peer} outside the kernel slow path's ports"
            );
        }
        // The first flow finds the range empty: its first probe is free.
        assert!(i > 0 || new == 1, "the first flow was not mapped by XDP");
        xdp_flows = new;
        peers.push(peer);
    }
    let after = t.stats();
    let forwarded = t.nstat(Ns::Router, "IpForwDatagrams") - fwd0;
    let flows = t.conntrack();
    println!("counters moved: {:?}", moved(&base, &after));
    println!("kernel forwarded {forwarded} datagrams; {replies} of 30 flows got a reply");
    println!("{}", t.router_ctl_ok(&["conntrack", "list"]));
    assert_eq!(flows.len() as u64, xdp_flows, "{flows:?}");
    let mut tuples: Vec<(String, String, String)> = flows
        .iter()
        .map(|f| {
            (
                f["xlat_src"].as_str().unwrap().to_owned(),
                f["xlat_dst"].as_str().unwrap().to_owned(),
                f["proto"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    tuples.sort();
    let n = tuples.len();
    tuples.dedup();
    assert_eq!(tuples.len(), n, "two flows share a WAN tuple: {flows:?}");
    let exhausted = 30 - xdp_flows;
    assert_eq!(
        counter_delta(&base, &after, "pass_ports_exhausted"),
        exhausted
    );
    // Each exhausted flow probed every candidate.
    let probes = u64::from(router_common::flow::MAX_PORT_PROBES);
    assert!(counter_delta(&base, &after, "port_collision") >= exhausted * probes);
    assert!(
        forwarded >= exhausted,
        "the kernel forwarded only {forwarded}"
    );
    // The WAN tuples the server saw, from both paths: all distinct.
    let mut seen = peers.clone();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), peers.len(), "a WAN tuple used twice: {peers:?}");
    // Every flow was translated by one path or the other, so every one is
    // answered (the server has no route back to the LAN).
    assert_eq!(replies, 30);
}
