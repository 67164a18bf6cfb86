//! Hostile WAN input: no state, nothing reaches a LAN host.

use super::*;

/// Unsolicited TCP/UDP/ICMP from the WAN to random ports, spoofed packets
/// aimed at the WAN ports of real flows with the wrong remote port or
/// address, and ICMP errors quoting no flow: no state is created, nothing
/// reaches the LAN host (its IP receive counter does not move, listeners on
/// the targeted ports get nothing), no ICMP error is translated, and the
/// real flows still work afterwards.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted scenario, read top to bottom"
)]
fn hostile_wan_input_creates_no_state_and_reaches_no_lan_host() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let life = Duration::from_mins(1);
    let udp_srv = UdpRecorder::start(&t, Ns::Server, socket_addr(SERVER_ADDR, 5300), life);
    let tcp_srv = MultiEcho::start(&t, Ns::Server, socket_addr(SERVER_ADDR, 5301), life);
    // Two real flows, WAN ports 41000/udp and 41001/tcp (ports preserved).
    let udp = t.in_ns(Ns::Client, || {
        let s = UdpSocket::bind(socket_addr(Ipv4Addr::UNSPECIFIED, 41000)).unwrap();
        s.connect(socket_addr(SERVER_ADDR, 5300)).unwrap();
        s
    });
    udp_once(&udp, b"real udp", IO).expect("real UDP flow");
    let mut tcp = tcp_from(&t, Ns::Client, 41001, socket_addr(SERVER_ADDR, 5301));
    echo_once(&mut tcp, b"real tcp", IO).expect("real TCP flow");
    let flows = t.conntrack();
    assert_eq!(flows.len(), 2, "{flows:?}");
    let xlat: Vec<String> = flows.iter().map(|f| f["xlat_src"].to_string()).collect();
    println!("real flows: {xlat:?}");

    // Listeners in the client namespace on ports the flood targets.
    let listen_ports: Vec<u16> = (42000..42032).collect();
    let listeners: Vec<UdpSocket> = t.in_ns(Ns::Client, || {
        listen_ports
            .iter()
            .map(|&p| {
                let s = UdpSocket::bind(socket_addr(Ipv4Addr::UNSPECIFIED, p)).unwrap();
                s.set_nonblocking(true).unwrap();
                s
            })
            .collect()
    });
    let tcp_listener = t.in_ns(Ns::Client, || {
        TcpListener::bind(socket_addr(Ipv4Addr::UNSPECIFIED, 42100)).unwrap()
    });
    tcp_listener.set_nonblocking(true).unwrap();

    std::thread::sleep(Duration::from_millis(300)); // delayed ACKs settle
    let before = t.stats();
    let lan_rx_before = t.nstat(Ns::Client, "IpInReceives");

    let wan = ROUTER_WAN_ADDR.octets();
    let srv = SERVER_ADDR.octets();
    let spoofed: [[u8; 4]; 2] = [[203, 0, 113, 77], [198, 51, 100, 7]];
    let sent = t.in_ns(Ns::Server, || {
        let mut rng = SplitMix64(0x0068_6f73_7469_6c65);
        let mut n = std::collections::BTreeMap::<&str, u64>::new();
        let started = Instant::now();
        let bounded = || started.elapsed() < Duration::from_secs(20);
        // UDP to random WAN ports (and the listeners' ports, and the real
        // flow's port from wrong source ports), from 16 source ports.
        let socks: Vec<UdpSocket> = (0..16)
            .map(|i| UdpSocket::bind(socket_addr(SERVER_ADDR, 6000 + i)).unwrap())
            .collect();
        for i in 0..2000u32 {
            if !bounded() {
                break;
            }
            let port = match i % 8 {
                0 => 41000,
                1 => listen_ports[(i as usize / 8) % listen_ports.len()],
                _ => rng.port(),
            };
            let _ = socks[i as usize % 16].send_to(b"knock", socket_addr(ROUTER_WAN_ADDR, port));
            *n.entry("udp to random/flow ports").or_default() += 1;
            if i % 100 == 99 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        // TCP connection attempts to random ports: refused by the router.
        let mut refused = 0u64;
        for i in 0..300u32 {
            if !bounded() {
                break;
            }
            let port = match i % 10 {
                0 => 41001,
                1 => 42100,
                _ => rng.port(),
            };
            let r = TcpStream::connect_timeout(
                &socket_addr(ROUTER_WAN_ADDR, port),
                Duration::from_secs(2),
            );
            assert!(r.is_err(), "connected to WAN port {port}");
            if r.err().map(|e| e.kind()) == Some(ErrorKind::ConnectionRefused) {
                refused += 1;
            }
            *n.entry("tcp connect attempts").or_default() += 1;
        }
        n.insert("tcp attempts refused", refused);
        // Raw packets: TCP segments of every flag combination to random
        // ports and to the real flow's port with the wrong server port or
        // a spoofed source; UDP to the real flow with a spoofed source;
        // unsolicited echo replies and requests.
        let raw = RawSender::new();
        let flags = [
            TCP_ACK,
            TCP_RST,
            TCP_FIN | TCP_ACK,
            TCP_SYN | TCP_ACK,
            TCP_PSH | TCP_ACK,
            TCP_RST | TCP_ACK,
        ];
        for i in 0..1200u32 {
            if !bounded() {
                break;
            }
            let f = flags[i as usize % flags.len()];
            let (src, sport, dport, what) = match i % 4 {
                0 => (srv, rng.port(), rng.port(), "raw tcp to random ports"),
                1 => (
                    srv,
                    5302 + (i % 50) as u16,
                    41001,
                    "raw tcp to the flow, wrong port",
                ),
                2 => (
                    spoofed[i as usize % 2],
                    5301,
                    41001,
                    "raw tcp to the flow, spoofed source",
                ),
                _ => (
                    spoofed[i as usize % 2],
                    5300,
                    41000,
                    "raw udp to the flow, spoofed source",
                ),
            };
            let pkt = if i % 4 == 3 {
                Ipv4::new(src, wan, Udp::new(sport, dport, b"spoof")).bytes()
            } else {
                let mut seg = Tcp::new(sport, dport, f).payload(b"spoof");
                seg.seq = rng.next_u64() as u32;
                seg.ack = rng.next_u64() as u32;
                Ipv4::new(src, wan, seg).bytes()
            };
            raw.send(&pkt).expect("raw send");
            *n.entry(what).or_default() += 1;
            if i % 100 == 99 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        for i in 0..400u32 {
            let id = rng.port();
            let icmp = if i % 2 == 0 {
                Icmp::echo_reply(id, 1, b"unsolicited")
            } else {
                Icmp::echo_request(id, 1, b"ping the router")
            };
            raw.send(&Ipv4::new(srv, wan, icmp).bytes()).unwrap();
            *n.entry("icmp echo replies/requests").or_default() += 1;
            if i % 100 == 99 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        // ICMP errors quoting packets of no flow: wrong server port,
        // random WAN port, the TCP flow with a wrong port, an unknown echo
        // id, a spoofed quoted destination, and quotes cut short.
        let errors = [
            (ICMP_DEST_UNREACH, 3),
            (ICMP_DEST_UNREACH, 4),
            (ICMP_TIME_EXCEEDED, 0),
            (ICMP_PARAMETER_PROBLEM, 0),
        ];
        for i in 0..400u32 {
            let (ty, code) = errors[i as usize % errors.len()];
            let q = match (i / 4) % 6 {
                0 => Ipv4::new(wan, srv, Udp::new(41000, 5399, b"q")).bytes(),
                1 => Ipv4::new(wan, srv, Udp::new(rng.port(), 5300, b"q")).bytes(),
                2 => Ipv4::new(wan, srv, Tcp::new(41001, 5309, TCP_ACK)).bytes(),
                3 => Ipv4::new(wan, srv, Icmp::echo_request(rng.port(), 1, b"q")).bytes(),
                4 => Ipv4::new(wan, spoofed[0], Udp::new(41000, 5300, b"q")).bytes(),
                _ => Ipv4::new(wan, srv, Udp::new(41000, 5300, b"q")).bytes()[..24].to_vec(),
            };
            let mut e = Icmp::error(ty, code, &q);
            if let Icmp::Other { rest, .. } = &mut e
                && code == 4
            {
                *rest = [0, 0, 0x05, 0x00]; // next-hop MTU 1280
            }
            raw.send(&Ipv4::new(srv, wan, e).bytes()).unwrap();
            *n.entry("icmp errors quoting no flow").or_default() += 1;
            if i % 100 == 99 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        n
    });
    std::thread::sleep(Duration::from_millis(500));
    let after = t.stats();
    let lan_rx = t.nstat(Ns::Client, "IpInReceives") - lan_rx_before;
    let mut got = 0;
    let mut buf = [0u8; 64];
    for l in &listeners {
        while l.recv_from(&mut buf).is_ok() {
            got += 1;
        }
    }
    let tcp_accepted = tcp_listener.accept().is_ok();
    let total: u64 = sent
        .iter()
        .filter(|(k, _)| !k.contains("refused"))
        .map(|(_, v)| v)
        .sum();
    println!("hostile WAN input sent: {sent:#?} (total {total})");
    println!("counters moved: {:?}", moved(&before, &after));
    println!("LAN host IpInReceives during the flood: {lan_rx}");

    assert_eq!(lan_rx, 0, "packets reached the LAN host");
    assert_eq!(got, 0, "UDP listeners in the LAN got datagrams");
    assert!(!tcp_accepted, "a TCP connection reached the LAN");
    for c in [
        "fwd_inbound",
        "pass_no_neighbour",
        "flow_new_masquerade",
        "flow_new_port_forward",
        "icmp_error_translated",
        "eviction_detected",
    ] {
        assert_eq!(counter_delta(&before, &after, c), 0, "{c} moved");
    }
    // Every IPv4 packet the server sent is counted once, as unsolicited
    // (echo requests to the router itself: protocol); a veth could drop a
    // few under load (at most a tenth here), so no more than that.
    let counted = counter_delta(&before, &after, "pass_unsolicited")
        + counter_delta(&before, &after, "pass_protocol");
    assert!(
        counted * 10 >= total * 9 && counted <= total,
        "{counted} WAN packets counted as unsolicited for {total} sent"
    );
    let count = count_json(&t);
    assert_eq!(count["flows"], 2, "state created: {count}");
    // The real flows are untouched and still work.
    let flows_after = t.conntrack();
    for f in &flows_after {
        let want = if f["proto"] == "tcp" {
            "ESTABLISHED"
        } else {
            "REPLIED"
        };
        assert_eq!(f["state"], want, "{f}");
    }
    udp_once(&udp, b"still there?", IO).expect("real UDP flow after the flood");
    echo_once(&mut tcp, b"still there?", IO).expect("real TCP flow after the flood");
    assert_eq!(tcp_srv.accepted(), 1);
    drop(udp_srv);
}
