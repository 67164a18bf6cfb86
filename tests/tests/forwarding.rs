//! End to end: the XDP program forwards real TCP and UDP between the
//! client and server namespaces, and the kernel does not.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    time::Duration,
};

use tests::{Ns, SERVER_ADDR, Topology, is_root};

fn counters(t: &Topology) -> serde_json::Value {
    let o = t.router_ctl(&["stats", "--json"]);
    assert!(
        o.status.success(),
        "stats: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("stats json")
}

fn tcp_roundtrip(t: &Topology, port: u16, bytes: usize) -> SocketAddr {
    let listener = t.in_ns(Ns::Server, || {
        TcpListener::bind((SERVER_ADDR, port)).unwrap()
    });
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut buf = vec![0u8; bytes];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&buf).unwrap();
        peer
    });
    t.in_ns(Ns::Client, || {
        let addr: SocketAddr = format!("{SERVER_ADDR}:{port}").parse().unwrap();
        let mut c = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let data: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
        c.write_all(&data).unwrap();
        let mut back = vec![0u8; bytes];
        c.read_exact(&mut back).unwrap();
        assert_eq!(back, data, "echoed data differs");
    });
    server.join().unwrap()
}

fn udp_roundtrip(t: &Topology, port: u16) {
    let sock = t.in_ns(Ns::Server, || UdpSocket::bind((SERVER_ADDR, port)).unwrap());
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let server = std::thread::spawn(move || {
        let mut buf = [0u8; 1500];
        let (n, peer) = sock.recv_from(&mut buf).unwrap();
        sock.send_to(&buf[..n], peer).unwrap();
    });
    t.in_ns(Ns::Client, || {
        let c = UdpSocket::bind("0.0.0.0:0").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.send_to(b"hello through xdp", (SERVER_ADDR, port))
            .unwrap();
        let mut buf = [0u8; 64];
        let (n, _) = c.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"hello through xdp");
    });
    server.join().unwrap();
}

#[test]
fn xdp_forwards_tcp_and_udp_instead_of_the_kernel() {
    if !is_root() {
        eprintln!("SKIP: needs root for network namespaces and BPF");
        return;
    }
    let t = Topology::new();
    t.route_back();
    // Resolve neighbours first: on "no neighbour" the program passes to
    // the kernel, which runs ARP.
    let o = t.exec(
        Ns::Client,
        &["ping", "-c", "2", "-W", "1", &SERVER_ADDR.to_string()],
    );
    assert!(o.status.success(), "ping before attach failed");

    let o = t.router_ctl(&["attach", "lan0", "wan0"]);
    assert!(
        o.status.success(),
        "attach: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    println!("{}", String::from_utf8_lossy(&o.stdout));
    let o = t.router_ctl(&["attach", "lan0", "wan0"]);
    assert!(!o.status.success(), "second attach must refuse");
    assert!(String::from_utf8_lossy(&o.stderr).contains("already attached"));

    let fwd_before = t.nstat(Ns::Router, "IpForwDatagrams");
    let red_before = counters(&t)["redirected"]["packets"].as_u64().unwrap();
    let peer = tcp_roundtrip(&t, 5001, 200_000);
    assert_eq!(
        peer.ip(),
        tests::CLIENT_ADDR,
        "plain forwarding keeps the source"
    );
    udp_roundtrip(&t, 5002);
    let fwd_after = t.nstat(Ns::Router, "IpForwDatagrams");
    let stats = counters(&t);
    let red_after = stats["redirected"]["packets"].as_u64().unwrap();
    let o = t.router_ctl(&["stats"]);
    println!("{}", String::from_utf8_lossy(&o.stdout));
    assert!(
        red_after - red_before >= 20,
        "redirect counter grew only {}",
        red_after - red_before
    );
    // A handful of packets may still reach the kernel (e.g. neighbour
    // refresh), but not the flow's data packets.
    assert!(
        fwd_after - fwd_before < 5,
        "kernel forwarded {} datagrams; the fast path should carry them",
        fwd_after - fwd_before
    );

    let o = t.router_ctl(&["detach"]);
    assert!(
        o.status.success(),
        "detach: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let fwd_before = t.nstat(Ns::Router, "IpForwDatagrams");
    let _ = tcp_roundtrip(&t, 5003, 10_000);
    assert!(
        t.nstat(Ns::Router, "IpForwDatagrams") > fwd_before,
        "kernel forwards after detach"
    );
    assert!(
        !t.router_ctl(&["stats"]).status.success(),
        "stats after detach must fail"
    );
}

#[test]
fn namespaces_are_removed_after_a_panic() {
    if !is_root() {
        eprintln!("SKIP: needs root");
        return;
    }
    let mut name = String::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let t = Topology::new();
        name = t.ns_name(Ns::Router).to_owned();
        panic!("deliberate");
    }));
    assert!(r.is_err());
    let list = String::from_utf8(
        std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(
        !name.is_empty() && !list.contains(&name),
        "{name} still present"
    );
}
