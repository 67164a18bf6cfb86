//! End to end through the namespace topology with no iptables NAT and no
//! route back from the server to the LAN: only the XDP NAT can make these
//! work. Each test checks what the far end saw, that replies came back, and
//! that the fast-path counters (not the kernel) carried the flows.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::{
    CLIENT_ADDR, LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF, counter_delta,
    pattern, socket_addr,
};

use crate::ctl::attach_and_print;

const TIMEOUT: Duration = Duration::from_secs(5);

fn flow<'a>(flows: &'a [Value], proto: &str, orig_dst: SocketAddr) -> &'a Value {
    let dst = orig_dst.to_string();
    flows
        .iter()
        .find(|f| f["proto"] == proto && f["orig_dst"] == dst.as_str())
        .unwrap_or_else(|| panic!("no {proto} flow to {dst} in conntrack: {flows:?}"))
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn masquerade_tcp_udp_and_ping() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let before = t.stats();
    let fwd_before = t.nstat(Ns::Router, "IpForwDatagrams");

    let tcp_peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5201));
    assert_eq!(
        tcp_peer.ip(),
        IpAddr::V4(ROUTER_WAN_ADDR),
        "TCP source not masqueraded"
    );
    let udp_peer = t.udp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5202));
    assert_eq!(
        udp_peer.ip(),
        IpAddr::V4(ROUTER_WAN_ADDR),
        "UDP source not masqueraded"
    );
    assert!(
        t.ping(Ns::Client, SERVER_ADDR, 3),
        "ping through the NAT failed"
    );

    let after = t.stats();
    let fwd_after = t.nstat(Ns::Router, "IpForwDatagrams");
    println!("{}", t.router_ctl_ok(&["stats"]));
    // 256 KiB echoed each way is far more than 100 segments per direction.
    let out = counter_delta(&before, &after, "fwd_outbound");
    let inb = counter_delta(&before, &after, "fwd_inbound");
    assert!(
        out >= 100 && inb >= 100,
        "fast path carried only {out} out / {inb} in"
    );
    assert_eq!(
        counter_delta(&before, &after, "flow_new_masquerade"),
        3,
        "tcp, udp and icmp flows"
    );
    assert!(
        fwd_after - fwd_before < 5,
        "the kernel forwarded {} packets; the fast path should have",
        fwd_after - fwd_before
    );

    let flows = t.conntrack();
    println!("{}", t.router_ctl_ok(&["conntrack", "list"]));
    let tcp = flow(&flows, "tcp", socket_addr(SERVER_ADDR, 5201));
    // What the server saw is the translated source; the LAN port was kept.
    assert_eq!(tcp["xlat_src"], tcp_peer.to_string().as_str());
    let orig_src: SocketAddr = tcp["orig_src"].as_str().unwrap().parse().unwrap();
    assert_eq!(orig_src.ip(), IpAddr::V4(CLIENT_ADDR));
    assert_eq!(
        orig_src.port(),
        tcp_peer.port(),
        "source port not preserved"
    );
    // Both sides closed with FIN.
    assert_eq!(tcp["state"], "CLOSED", "{tcp}");
    let udp = flow(&flows, "udp", socket_addr(SERVER_ADDR, 5202));
    assert_eq!(udp["xlat_src"], udp_peer.to_string().as_str());
    assert_eq!(udp["state"], "REPLIED");
    assert!(
        flows.iter().any(|f| f["proto"] == "icmp"),
        "no icmp flow: {flows:?}"
    );
    let count = t.router_ctl_ok(&["conntrack", "count", "--json"]);
    let count: Value = serde_json::from_str(&count).unwrap();
    assert_eq!(count["flows"], 3, "{count}");
    assert_eq!(count["entries"], 6, "{count}");
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn port_forward_reaches_the_lan_service() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let out = t.router_ctl_ok(&["forward", "add", "tcp", "8080", "192.168.50.2:80"]);
    assert!(!out.contains("kernel slow path"), "{out}");
    t.router_ctl_ok(&["forward", "add", "udp", "5353", "192.168.50.2:53"]);
    // A port inside the slow path's NAT range (61000-65535 by default; here
    // Mumble's): said, as its replies could be taken.
    let out = t.router_ctl_ok(&["forward", "add", "udp", "64738", "192.168.50.2:64738"]);
    assert!(
        out.contains("inside the kernel slow path's NAT range 61000-65535"),
        "{out}"
    );
    t.router_ctl_ok(&["forward", "del", "udp", "64738"]);
    // The same rule again is a no-op, a different target a conflict.
    t.router_ctl_ok(&["forward", "add", "tcp", "8080", "192.168.50.2:80"]);
    let e = crate::ctl::ctl_fails(&t, &["forward", "add", "tcp", "8080", "192.168.50.2:81"]);
    assert!(e.contains("conflicts with existing rule tcp 8080"), "{e}");
    let rules: Value =
        serde_json::from_str(&t.router_ctl_ok(&["forward", "list", "--json"])).unwrap();
    assert_eq!(rules.as_array().map(Vec::len), Some(2), "{rules}");

    let before = t.stats();
    let payload = pattern(64 * 1024);
    let srv = t.tcp_echo_server(Ns::Client, socket_addr(CLIENT_ADDR, 80));
    let got = t.tcp_echo_client(
        Ns::Server,
        socket_addr(ROUTER_WAN_ADDR, 8080),
        &payload,
        TIMEOUT,
    );
    let peer = srv.join();
    assert_eq!(got.expect("TCP through the port forward"), payload);
    // DNAT only: the LAN service sees the real remote address.
    assert_eq!(peer.map(|p| p.ip()), Some(IpAddr::V4(SERVER_ADDR)));

    let srv = t.udp_echo_server(Ns::Client, socket_addr(CLIENT_ADDR, 53));
    let got = t.udp_echo_client(
        Ns::Server,
        socket_addr(ROUTER_WAN_ADDR, 5353),
        b"query",
        TIMEOUT,
    );
    let peer = srv.join();
    assert_eq!(got.expect("UDP through the port forward"), b"query");
    assert_eq!(peer.map(|p| p.ip()), Some(IpAddr::V4(SERVER_ADDR)));

    let after = t.stats();
    assert_eq!(counter_delta(&before, &after, "flow_new_port_forward"), 2);
    assert!(counter_delta(&before, &after, "fwd_inbound") >= 20);
    assert!(counter_delta(&before, &after, "fwd_outbound") >= 20);
    let flows = t.conntrack();
    let f = flow(&flows, "tcp", socket_addr(ROUTER_WAN_ADDR, 8080));
    assert_eq!(f["origin"], "wan");
    assert_eq!(f["xlat_dst"], "192.168.50.2:80");

    // Without the rule the router's own stack answers: connection refused.
    t.router_ctl_ok(&["forward", "del", "tcp", "8080"]);
    let srv = t.tcp_echo_server(Ns::Client, socket_addr(CLIENT_ADDR, 80));
    let r = t.tcp_echo_client(
        Ns::Server,
        socket_addr(ROUTER_WAN_ADDR, 8080),
        b"x",
        TIMEOUT,
    );
    assert_eq!(r.map_err(|e| e.kind()), Err(ErrorKind::ConnectionRefused));
    assert_eq!(
        srv.join(),
        None,
        "LAN service reached after the rule was deleted"
    );
}

/// Receives `n` datagrams (bounded by a deadline), echoes each, returns the
/// senders.
fn udp_echo_n(sock: &UdpSocket, n: usize) -> Vec<SocketAddr> {
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let deadline = Instant::now() + TIMEOUT * 2;
    let mut peers = Vec::new();
    let mut buf = [0u8; 1500];
    while Instant::now() < deadline {
        if let Ok((len, peer)) = sock.recv_from(&mut buf) {
            sock.send_to(&buf[..len], peer).unwrap();
            if !peers.contains(&peer) {
                peers.push(peer);
            }
            if peers.len() == n {
                break;
            }
        }
    }
    peers
}

fn udp_from_port(port: u16, dst: SocketAddr, msg: &[u8]) -> Vec<u8> {
    let s = UdpSocket::bind(socket_addr(Ipv4Addr::UNSPECIFIED, port)).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut buf = [0u8; 1500];
    for _ in 0..20 {
        s.send_to(msg, dst).unwrap();
        if let Ok((n, _)) = s.recv_from(&mut buf) {
            return buf[..n].to_vec();
        }
    }
    panic!("no UDP reply from {dst} to port {port}");
}

fn tcp_from_port(port: u16, dst: SocketAddr, msg: &[u8]) -> Vec<u8> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    s.set_reuse_address(true).unwrap();
    s.bind(&socket_addr(Ipv4Addr::UNSPECIFIED, port).into())
        .unwrap();
    s.connect_timeout(&dst.into(), TIMEOUT).unwrap();
    let mut s: TcpStream = s.into();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s.write_all(msg).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    back
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn two_clients_with_the_same_source_port() {
    let t = Topology::with_two_clients();
    attach_and_print(&t, &[]);
    let before = t.stats();

    let udp = t.in_ns(Ns::Server, || {
        UdpSocket::bind(socket_addr(SERVER_ADDR, 5300)).unwrap()
    });
    let tcp = t.in_ns(Ns::Server, || {
        TcpListener::bind(socket_addr(SERVER_ADDR, 5301)).unwrap()
    });
    let (udp_peers, tcp_peers) = std::thread::scope(|s| {
        let u = s.spawn(|| udp_echo_n(&udp, 2));
        let k = s.spawn(|| {
            tcp.set_nonblocking(true).unwrap();
            let deadline = Instant::now() + TIMEOUT * 2;
            let mut peers = Vec::new();
            while peers.len() < 2 && Instant::now() < deadline {
                match tcp.accept() {
                    Ok((mut c, peer)) => {
                        c.set_nonblocking(false).unwrap();
                        c.set_read_timeout(Some(TIMEOUT)).unwrap();
                        let mut buf = Vec::new();
                        c.read_to_end(&mut buf).unwrap();
                        c.write_all(&buf).unwrap();
                        peers.push(peer);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
            peers
        });
        for (ns, msg) in [(Ns::Client, &b"one"[..]), (Ns::Client2, &b"two"[..])] {
            let back = t.in_ns(ns, || {
                udp_from_port(40000, socket_addr(SERVER_ADDR, 5300), msg)
            });
            assert_eq!(back, msg);
            let back = t.in_ns(ns, || {
                tcp_from_port(40001, socket_addr(SERVER_ADDR, 5301), msg)
            });
            assert_eq!(back, msg);
        }
        (u.join().unwrap(), k.join().unwrap())
    });
    for (peers, port) in [(udp_peers, 40000), (tcp_peers, 40001)] {
        assert_eq!(peers.len(), 2, "server saw {peers:?}");
        assert!(
            peers.iter().all(|p| p.ip() == IpAddr::V4(ROUTER_WAN_ADDR)),
            "{peers:?}"
        );
        assert_ne!(
            peers[0].port(),
            peers[1].port(),
            "two flows share a WAN tuple"
        );
        // The first flow keeps its port, the second one is probed elsewhere.
        assert_eq!(peers[0].port(), port, "{peers:?}");
    }
    let after = t.stats();
    assert!(counter_delta(&before, &after, "port_collision") >= 2);
    assert_eq!(counter_delta(&before, &after, "flow_new_masquerade"), 4);
}

/// One short connection from the client's source `port` (`SO_REUSEADDR`)
/// that the server closes first: sends `REUSE_REQUEST`, reads the reply to
/// the server's FIN. Retries the `connect` while the previous connection
/// on the port is still in `LAST_ACK` (its 4-tuple is taken until the
/// server's ACK of the client's FIN arrives).
fn tcp_reused_port_roundtrip(port: u16, dst: SocketAddr) -> Vec<u8> {
    let local = socket_addr(Ipv4Addr::UNSPECIFIED, port);
    let mut s = tests::echo::tcp_connect_from(local, dst, TIMEOUT)
        .unwrap_or_else(|e| panic!("connect from port {port} to {dst}: {e}"));
    s.write_all(REUSE_REQUEST).unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).unwrap();
    back
}

const REUSE_REQUEST: &[u8; 8] = b"request\n";

/// A client that reuses its source port for one short connection after
/// another to the same server, each closed by the server first (the
/// connection-setup benchmark's pattern, and what a client with a fixed
/// source port does): every new SYN meets the data path's entry of the
/// previous connection in CLOSED and the server's `TIME_WAIT` for the
/// same translated 4-tuple. The SYN reopens the entry (as netfilter
/// reopens a flow in `TIME_WAIT`), so the flow keeps its WAN port and
/// stays on the fast path, and the server accepts the SYN in `TIME_WAIT`
/// (RFC 6191: its sequence number and timestamp are above the old
/// connection's): every connection completes, no SYN is sent again and
/// no retransmission timeout fires (a tail loss probe, which a loaded
/// machine's late ACK can set off with nothing lost, is not counted).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn tcp_port_reuse_reopens_the_closed_flow() {
    const CONNS: usize = 30;
    const CLIENT_PORT: u16 = 40100;
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let dst = socket_addr(SERVER_ADDR, 5302);
    let listener = t.in_ns(Ns::Server, || TcpListener::bind(dst).unwrap());
    let retransmits = || {
        [Ns::Client, Ns::Server]
            .into_iter()
            .map(|ns| t.nstat(ns, "TcpExtTCPSynRetrans") + t.nstat(ns, "TcpExtTCPTimeouts"))
            .sum::<u64>()
    };
    let (retrans_before, fwd_before, before) = (
        retransmits(),
        t.nstat(Ns::Router, "IpForwDatagrams"),
        t.stats(),
    );
    let peers = std::thread::scope(|scope| {
        let server = scope.spawn(|| {
            listener.set_nonblocking(true).unwrap();
            // Bounded: a client that gives up must not leave it waiting.
            let deadline = Instant::now() + TIMEOUT * 4;
            let mut peers = Vec::new();
            while peers.len() < CONNS && Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut c, peer)) => {
                        c.set_nonblocking(false).unwrap();
                        c.set_read_timeout(Some(TIMEOUT)).unwrap();
                        let mut req = [0u8; REUSE_REQUEST.len()];
                        if c.read_exact(&mut req).is_ok() {
                            let _ = c.write_all(&req);
                        }
                        // Dropped: the server closes first and keeps
                        // `TIME_WAIT`.
                        peers.push(peer);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
            peers
        });
        for i in 0..CONNS {
            let back = t.in_ns(Ns::Client, || tcp_reused_port_roundtrip(CLIENT_PORT, dst));
            assert_eq!(back, REUSE_REQUEST, "connection {i}");
        }
        server.join().unwrap()
    });
    let after = t.stats();
    println!("{}", t.router_ctl_ok(&["stats"]));
    println!("{}", t.router_ctl_ok(&["conntrack", "list"]));
    assert_eq!(
        retransmits() - retrans_before,
        0,
        "SYNs sent again or retransmission timeouts: a SYN was refused or lost"
    );
    assert!(
        peers
            .iter()
            .all(|p| *p == socket_addr(ROUTER_WAN_ADDR, CLIENT_PORT)),
        "the server saw other WAN tuples than the first (port preserved): {peers:?}"
    );
    assert_eq!(
        counter_delta(&before, &after, "flow_new_masquerade"),
        1,
        "only the first connection is a new flow; the others reopen it"
    );
    // Each connection: SYN, ACK, request, ACK and FIN out (at least).
    let out = counter_delta(&before, &after, "fwd_outbound");
    assert!(
        out >= 4 * CONNS as u64,
        "fast path carried only {out} segments out"
    );
    let kernel_fwd = t.nstat(Ns::Router, "IpForwDatagrams") - fwd_before;
    assert!(
        kernel_fwd < 5,
        "the kernel forwarded {kernel_fwd} packets; the fast path should have"
    );
    let flows = t.conntrack();
    let tcp = flow(&flows, "tcp", dst);
    assert_eq!(tcp["state"], "CLOSED", "{tcp}");
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn icmp_errors_come_back_translated() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let before = t.stats();
    // Nothing listens on the server's port 5999: it answers with ICMP port
    // unreachable quoting the translated packet. Only if the router
    // translates the quoted header back does the client's socket see it.
    let r = t.in_ns(Ns::Client, || {
        let s = UdpSocket::bind(socket_addr(Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        s.connect(socket_addr(SERVER_ADDR, 5999)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut buf = [0u8; 64];
        for _ in 0..10 {
            let _ = s.send(b"anyone?");
            match s.recv(&mut buf) {
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Ok(()),
                Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {}
                other => return Err(format!("{other:?}")),
            }
        }
        Err("no ICMP error reached the client".to_owned())
    });
    r.unwrap();
    let after = t.stats();
    assert!(counter_delta(&before, &after, "icmp_error_translated") >= 1);
}

/// The other way (RFC 5508 REQ-5): a LAN host's ICMP port unreachable
/// about a datagram the NAT delivered to it (to a socket since closed)
/// leaves as the NAT's own, quoting the mapping. Only then does the
/// server's socket, connected to the mapping, see it (`ECONNREFUSED`); the
/// kernel, which never saw the flow, would let it leave untranslated.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn icmp_errors_from_the_lan_leave_translated() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let client = t.in_ns(Ns::Client, || {
        UdpSocket::bind(socket_addr(CLIENT_ADDR, 42100)).unwrap()
    });
    let server = t.in_ns(Ns::Server, || {
        UdpSocket::bind(socket_addr(SERVER_ADDR, 5998)).unwrap()
    });
    server.set_read_timeout(Some(TIMEOUT)).unwrap();
    client
        .send_to(b"hello", socket_addr(SERVER_ADDR, 5998))
        .unwrap();
    let mut buf = [0u8; 64];
    let (_, mapped) = server.recv_from(&mut buf).expect("the client's datagram");
    assert_eq!(mapped.ip(), IpAddr::V4(ROUTER_WAN_ADDR), "not masqueraded");
    server.connect(mapped).unwrap();
    // Closed: the client's kernel answers the next datagram with an error.
    drop(client);
    server
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let before = t.stats();
    let refused = (0..10).any(|_| {
        server.send(b"late").unwrap();
        match server.recv(&mut buf) {
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => true,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => false,
            other => panic!("the server's socket: {other:?}"),
        }
    });
    let after = t.stats();
    println!("{}", t.router_ctl_ok(&["stats"]));
    assert!(
        refused,
        "no translated ICMP error reached the server's socket"
    );
    assert!(counter_delta(&before, &after, "icmp_error_translated") >= 1);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn unsolicited_wan_traffic_creates_no_state() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let before = t.stats();
    let lan_listener = t.in_ns(Ns::Client, || {
        UdpSocket::bind(socket_addr(CLIENT_ADDR, 7777)).unwrap()
    });
    t.in_ns(Ns::Server, || {
        let s = UdpSocket::bind(socket_addr(SERVER_ADDR, 0)).unwrap();
        for port in [7777, 7778, 40000] {
            s.send_to(b"knock", socket_addr(ROUTER_WAN_ADDR, port))
                .unwrap();
        }
        let r = TcpStream::connect_timeout(&socket_addr(ROUTER_WAN_ADDR, 7777), TIMEOUT);
        assert_eq!(
            r.map_err(|e| e.kind()).err(),
            Some(ErrorKind::ConnectionRefused)
        );
    });
    lan_listener
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert!(
        lan_listener.recv_from(&mut buf).is_err(),
        "an unsolicited packet reached the LAN"
    );
    let after = t.stats();
    assert!(counter_delta(&before, &after, "pass_unsolicited") >= 4);
    let count: Value =
        serde_json::from_str(&t.router_ctl_ok(&["conntrack", "count", "--json"])).unwrap();
    assert_eq!(count["flows"], 0, "{count}");
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn attach_twice_is_a_noop_and_detach_restores_the_kernel_path() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    // The same attach again changes nothing and says so.
    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    assert!(o.status.success(), "second identical attach must succeed");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("already attached") && out.contains("nothing changed"),
        "{out}"
    );
    let _ = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5401));

    t.router_ctl_ok(&["detach"]);
    assert!(!t.router_attached(), "pins left after detach");
    assert!(
        !t.router_ctl(&["stats"]).status.success(),
        "stats after detach must fail"
    );
    // The kernel forwards again, but there is no NAT any more and the
    // server has no route back: the connection cannot complete.
    let fwd_before = t.nstat(Ns::Router, "IpForwDatagrams");
    let r = t.try_tcp_echo(
        Ns::Client,
        Ns::Server,
        socket_addr(SERVER_ADDR, 5402),
        Duration::from_secs(2),
    );
    assert!(r.is_err(), "TCP worked after detach without any NAT: {r:?}");
    assert!(
        t.nstat(Ns::Router, "IpForwDatagrams") > fwd_before,
        "kernel forwards after detach"
    );
}

/// RFC 1812 5.3.4 and the kernel's `PACKET_HOST` rule: a frame of an
/// established flow addressed to another host's MAC, which the LAN's bridge
/// floods to every port (the router's too) while it has not learned that
/// MAC, is not forwarded; the same datagram to the router's MAC is. Both
/// are sent raw from the client, the foreign one first: the first datagram
/// the server receives must be the one to the router's MAC.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn flooded_frame_for_another_host_is_not_forwarded() {
    use tests::addr::HOST_IF;
    use tests::frames::{Frame, Ipv4, NOBODY_MAC, Udp};
    const CLIENT_PORT: u16 = 40200;
    let t = Topology::with_two_clients();
    attach_and_print(&t, &[]);
    let server = t.in_ns(Ns::Server, || {
        UdpSocket::bind(socket_addr(SERVER_ADDR, 5310)).unwrap()
    });
    // The flow, opened and answered through the router.
    std::thread::scope(|s| {
        let echo = s.spawn(|| udp_echo_n(&server, 1));
        let back = t.in_ns(Ns::Client, || {
            udp_from_port(CLIENT_PORT, socket_addr(SERVER_ADDR, 5310), b"open")
        });
        assert_eq!(back, b"open");
        assert_eq!(echo.join().unwrap().len(), 1);
    });
    server.set_read_timeout(Some(TIMEOUT)).unwrap();
    let (client_mac, router_mac) = (t.mac(Ns::Client, HOST_IF), t.mac(Ns::Router, LAN_IF));
    let eth0 = t.ifindex(Ns::Client, HOST_IF);
    let datagram = |payload: &[u8]| {
        Ipv4::new(
            CLIENT_ADDR.octets(),
            SERVER_ADDR.octets(),
            Udp::new(CLIENT_PORT, 5310, payload),
        )
    };
    let before = t.stats();
    t.in_ns(Ns::Client, || {
        for (dst, payload) in [
            (NOBODY_MAC, &b"to another host"[..]),
            (router_mac, &b"to the router"[..]),
        ] {
            let frame = Frame::new(dst, client_mac, datagram(payload)).bytes();
            tests::packet::send_frame(eth0, &frame).expect("sending a raw frame");
        }
    });
    let mut buf = [0u8; 1500];
    let (n, _) = server
        .recv_from(&mut buf)
        .expect("the datagram to the router's MAC reached the server");
    assert_eq!(
        String::from_utf8_lossy(&buf[..n]),
        "to the router",
        "the server received the frame flooded to another host's MAC"
    );
    let after = t.stats();
    assert!(
        counter_delta(&before, &after, "pass_not_for_us") >= 1,
        "pass_not_for_us did not count the flooded frame"
    );
}
