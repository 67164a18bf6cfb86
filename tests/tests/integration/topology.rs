//! The harness itself, checked against the kernel's own NAT (no XDP).

use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use tests::{
    CLIENT_ADDR, Ns, ROUTER_LAN_ADDR, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, netns_exists,
    socket_addr,
};

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn kernel_masquerade_tcp_udp_ping() {
    let t = Topology::new();
    t.masquerade();
    let fwd_before = t.nstat(Ns::Router, "IpForwDatagrams");

    assert!(
        t.ping(Ns::Client, ROUTER_LAN_ADDR, 1),
        "client cannot ping its gateway"
    );
    assert!(
        t.ping(Ns::Client, SERVER_ADDR, 3),
        "ping client -> server through NAT failed"
    );

    let peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5201));
    assert_eq!(
        peer.ip(),
        IpAddr::V4(ROUTER_WAN_ADDR),
        "TCP source not masqueraded"
    );

    let peer = t.udp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5202));
    assert_eq!(
        peer.ip(),
        IpAddr::V4(ROUTER_WAN_ADDR),
        "UDP source not masqueraded"
    );

    let fwd_after = t.nstat(Ns::Router, "IpForwDatagrams");
    // 256 KiB of TCP each way alone is well over 100 forwarded packets.
    assert!(
        fwd_after >= fwd_before + 100,
        "IpForwDatagrams only went {fwd_before} -> {fwd_after}"
    );
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn without_nat_server_cannot_reply() {
    let t = Topology::new();
    // Router reachable, server's subnet reachable from the router...
    assert!(t.ping(Ns::Router, SERVER_ADDR, 1));
    // ...but the server has no route back to the LAN, so without NAT the
    // client's connection cannot complete.
    let r = t.try_tcp_echo(
        Ns::Client,
        Ns::Server,
        socket_addr(SERVER_ADDR, 5203),
        Duration::from_secs(2),
    );
    assert!(
        r.is_err(),
        "TCP worked without NAT: {r:?} (server has a route back?)"
    );
    assert!(
        !t.ping(Ns::Client, SERVER_ADDR, 1),
        "ping worked without NAT"
    );
    // The SYN did get forwarded: the failure is the missing return path.
    assert!(t.nstat(Ns::Router, "IpForwDatagrams") > 0);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn two_clients_share_the_wan_address() {
    let t = Topology::with_two_clients();
    t.masquerade();
    let p1 = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5204));
    let p2 = t.tcp_echo_roundtrip(Ns::Client2, Ns::Server, socket_addr(SERVER_ADDR, 5205));
    assert_eq!(p1.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
    assert_eq!(p2.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
    let u = t.udp_echo_roundtrip(Ns::Client2, Ns::Server, socket_addr(SERVER_ADDR, 5206));
    assert_eq!(u.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
    assert!(t.ping(Ns::Client2, SERVER_ADDR, 2));
    // Clients reach each other across the bridge.
    assert!(t.ping(Ns::Client2, CLIENT_ADDR, 1));
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn in_ns_runs_in_that_namespace() {
    let t = Topology::new();
    // Binding the server's address only works inside the server namespace.
    let bound = t.in_ns(Ns::Server, || {
        std::net::TcpListener::bind(socket_addr(SERVER_ADDR, 0)).is_ok()
    });
    assert!(bound);
    let bound = t.in_ns(Ns::Client, || {
        std::net::TcpListener::bind(socket_addr(SERVER_ADDR, 0)).is_ok()
    });
    assert!(!bound);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn namespaces_and_children_gone_after_drop() {
    // Normal drop, with a spawned child that must be killed.
    let t = Topology::with_two_clients();
    let names = t.namespaces();
    assert_eq!(names.len(), 5);
    assert!(
        names.iter().all(|n| netns_exists(n) && n.len() < 30),
        "{names:?}"
    );
    let child = t.spawn(Ns::Server, &["sleep", "100"]);
    let pid = child.id();
    drop(t);
    for n in &names {
        assert!(!netns_exists(n), "namespace {n} left behind");
    }
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "child {pid} still alive"
    );
    drop(child);

    // Drop while unwinding from a panic inside an in_ns closure.
    let mut names = Vec::new();
    let r = tests::host::catch_expected_panic(AssertUnwindSafe(|| {
        let t = Topology::new();
        names = t.namespaces();
        t.in_ns(Ns::Client, || {
            panic!("deliberate panic inside the client namespace")
        });
    }));
    assert!(r.is_err());
    assert_eq!(names.len(), 3);
    for n in &names {
        assert!(!netns_exists(n), "namespace {n} left behind after panic");
    }
    let listed = String::from_utf8_lossy(
        &std::process::Command::new("ip")
            .args(["netns", "list"])
            .output()
            .unwrap()
            .stdout,
    )
    .into_owned();
    for n in &names {
        assert!(!listed.contains(n.as_str()), "{n} still in `ip netns list`");
    }
}
