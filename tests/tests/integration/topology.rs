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

/// A run ended by a signal (Ctrl-C, a CI timeout's SIGTERM) removes its
/// namespaces and what runs in them, which the drop guards (run on a
/// panic) would not: the kit's signal guard, in `examples/guard_child.rs`
/// (a process that builds a topology and waits).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_interrupted_run_removes_its_namespaces() {
    use std::io::{BufRead as _, BufReader};
    use std::os::unix::process::ExitStatusExt as _;
    // Built by `cargo xtask test` (`cargo build -p tests --example
    // guard_child`), beside the tests.
    let exe = std::env::current_exe().unwrap();
    let child_bin = exe
        .parent()
        .and_then(std::path::Path::parent)
        .map(|d| d.join("examples/guard_child"))
        .unwrap();
    assert!(
        child_bin.exists(),
        "{} not built: `cargo build -p tests --example guard_child` (cargo xtask test does)",
        child_bin.display()
    );
    let mut child = std::process::Command::new(&child_bin)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let names: Vec<String> = line
        .trim()
        .strip_prefix("namespaces ")
        .unwrap_or_else(|| panic!("unexpected line {line:?}"))
        .split(' ')
        .map(str::to_owned)
        .collect();
    assert_eq!(names.len(), 3, "{line}");
    // Should the guard fail, what it left is removed here (the child's
    // namespaces are this run's).
    let _leftovers = Leftovers(names.clone());
    assert!(names.iter().all(|n| netns_exists(n)), "{names:?}");
    let sleepers = |n: &str| {
        let o = std::process::Command::new("ip")
            .args(["netns", "pids", n])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .count()
    };
    let server = &names[2];
    // `ip netns exec` enters the namespace before it runs the sleeper.
    crate::ctl::wait_for(
        "the sleeper to run in the server's namespace",
        Duration::from_secs(10),
        || sleepers(server) == 1,
    );
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: SIGINT to the child this test started and has not reaped.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the interrupted run did not end within 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err);
    assert_eq!(status.code(), Some(130), "{status:?}: {err}");
    assert!(err.contains("removing this run's 3 namespace(s)"), "{err}");
    for n in &names {
        assert!(!netns_exists(n), "namespace {n} left behind: {err}");
    }
    let _ = status.signal();
}

/// Namespaces another process of this run made, removed on drop if left.
struct Leftovers(Vec<String>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for n in self.0.iter().filter(|n| netns_exists(n)) {
            tests::kill_processes_in(n);
            let _ = tests::host::run(&["ip", "netns", "delete", n]);
        }
    }
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
