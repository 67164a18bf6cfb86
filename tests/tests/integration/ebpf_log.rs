//! The data path's debug log (aya-log) through `router-ctl run`, in
//! standalone mode: with `RUST_LOG=router_ebpf=debug` a new flow gives its
//! admitted-flow line with the right tuple and mapped port, a malformed
//! frame its drop line; without the variable no data-path line appears.
//! The program's `LOG_LEVEL` gate is 0 after attach and again after the
//! daemon stops (nobody drains the ring buffer then), 4 (debug) while a
//! daemon with that filter runs; after a live replace the daemon follows
//! the new program.

use std::io::{BufRead as _, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::{CLIENT_ADDR, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, router_ctl_bin, socket_addr};

use crate::ctl::attach_and_print;

const IO: Duration = Duration::from_secs(3);
/// The prefix of every data-path line the tests look for.
const LINE_ADMITTED: &str = "flow admitted: masquerade";
const LINE_MALFORMED: &str = "malformed packet dropped";

/// `router-ctl run` with its stderr and stdout collected; killed on drop if
/// still running.
struct Daemon {
    child: Child,
    out: Arc<Mutex<String>>,
}

impl Daemon {
    /// Starts `router-ctl -n ROUTER run --listen none`, with `RUST_LOG`
    /// set to `rust_log` or unset, and waits for its start line.
    fn start(t: &Topology, rust_log: Option<&str>) -> Self {
        let mut cmd = Command::new(router_ctl_bin());
        cmd.args(["-n", t.ns_name(Ns::Router), "run", "--listen", "none"])
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(v) = rust_log {
            cmd.env("RUST_LOG", v);
        }
        let mut child = cmd.spawn().expect("starting router-ctl run");
        let out = Arc::new(Mutex::new(String::new()));
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let sink = Arc::clone(&out);
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let mut o = sink.lock().unwrap();
                    o.push_str(&line);
                    o.push('\n');
                }
            });
        }
        let d = Self { child, out };
        d.wait_for("router-ctl run: ", Duration::from_secs(30));
        d
    }

    fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Waits until a line of the output contains `what`; returns that line.
    fn wait_for(&self, what: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self.output().lines().find(|l| l.contains(what)) {
                return l.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no line with {what:?} from router-ctl run within {timeout:?}; output:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then waits (10 s at most) for the exit.
    fn stop(&mut self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: plain kill(2) of our own, unreaped child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "router-ctl run ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One UDP datagram from the client's `sport` to the server's `dport`,
/// received there: the source address the server saw (the WAN mapping).
fn udp_through(t: &Topology, sport: u16, dport: u16) -> SocketAddr {
    let server = t.in_ns(Ns::Server, || {
        UdpSocket::bind(socket_addr(SERVER_ADDR, dport)).expect("bind the server")
    });
    server.set_read_timeout(Some(IO)).unwrap();
    let client = t.in_ns(Ns::Client, || {
        UdpSocket::bind(socket_addr(CLIENT_ADDR, sport)).expect("bind the client")
    });
    client
        .send_to(b"debug log", socket_addr(SERVER_ADDR, dport))
        .expect("send");
    let mut buf = [0u8; 64];
    let (n, seen) = server
        .recv_from(&mut buf)
        .expect("the datagram through the router");
    assert_eq!(&buf[..n], b"debug log");
    seen
}

/// From the client, an IPv4 packet that says UDP but is 4 bytes too short
/// for a UDP header: the data path drops it as malformed (the kernel fills
/// in the IPv4 total length and checksum of a raw packet, not the rest).
fn send_malformed(t: &Topology) {
    let mut pkt = vec![
        0x45, 0, 0, 24, // version/IHL, TOS, total length (the kernel's)
        0, 1, 0, 0, // id, flags/fragment offset
        64, 17, 0, 0, // TTL, UDP, checksum (the kernel's)
    ];
    pkt.extend_from_slice(&CLIENT_ADDR.octets());
    pkt.extend_from_slice(&SERVER_ADDR.octets());
    pkt.extend_from_slice(&[0x9c, 0x40, 0x00, 0x35]); // half a UDP header
    t.in_ns(Ns::Client, || {
        // SAFETY: plain socket(2) call.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        // SAFETY: fd is a new, owned descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: zeroed is a valid sockaddr_in.
        let mut to: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        to.sin_family = libc::AF_INET as libc::sa_family_t;
        to.sin_addr.s_addr = u32::from_ne_bytes(SERVER_ADDR.octets());
        // SAFETY: valid buffer and address for the duration of the call.
        let rc = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                pkt.as_ptr().cast(),
                pkt.len(),
                0,
                (&raw const to).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        assert_eq!(
            usize::try_from(rc).ok(),
            Some(pkt.len()),
            "send: {}",
            std::io::Error::last_os_error()
        );
    });
}

/// The attached program's `LOG_LEVEL` gate, read with bpftool from the
/// program the status names.
fn log_gate(t: &Topology) -> u32 {
    log_gate_map(t).1
}

/// The current program's `LOG_LEVEL` map: its id and the gate's value.
fn log_gate_map(t: &Topology) -> (u64, u32) {
    let status: serde_json::Value =
        serde_json::from_str(&t.router_ctl_ok(&["status", "--json"])).expect("status JSON");
    let prog_id = status["record"]["prog_id"].as_u64().expect("prog_id");
    let prog: serde_json::Value = serde_json::from_slice(
        &Command::new("bpftool")
            .args(["prog", "show", "id", &prog_id.to_string(), "--json"])
            .output()
            .expect("bpftool prog show")
            .stdout,
    )
    .expect("bpftool JSON");
    for id in prog["map_ids"].as_array().expect("map_ids") {
        let id = id.as_u64().unwrap().to_string();
        let map: serde_json::Value = serde_json::from_slice(
            &Command::new("bpftool")
                .args(["map", "show", "id", &id, "--json"])
                .output()
                .expect("bpftool map show")
                .stdout,
        )
        .expect("bpftool JSON");
        if map["name"] != "LOG_LEVEL" {
            continue;
        }
        let out = Command::new("bpftool")
            .args([
                "map", "lookup", "id", &id, "key", "0", "0", "0", "0", "--json",
            ])
            .output()
            .expect("bpftool map lookup");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("lookup JSON");
        let bytes: Vec<u8> = v["value"]
            .as_array()
            .expect("value bytes")
            .iter()
            .map(|b| {
                let s = b.as_str().expect("hex byte");
                u8::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex")
            })
            .collect();
        return (
            id.parse().unwrap(),
            u32::from_ne_bytes(bytes[..4].try_into().unwrap()),
        );
    }
    panic!("program {prog_id} has no LOG_LEVEL map: {prog}");
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn debug_log_shows_admitted_flow_and_malformed_drop() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    assert_eq!(
        log_gate(&t),
        0,
        "the log is on after attach, with no reader"
    );

    let mut d = Daemon::start(&t, Some("router_ebpf=debug"));
    assert_eq!(
        log_gate(&t),
        4,
        "run with router_ebpf=debug set the gate to debug"
    );
    let seen = udp_through(&t, 40_123, 5_353);
    assert_eq!(seen.ip(), ROUTER_WAN_ADDR, "not masqueraded");
    let want = format!(
        "{LINE_ADMITTED} proto 17 {CLIENT_ADDR}:40123 -> {SERVER_ADDR}:5353 as \
         {ROUTER_WAN_ADDR}:{}",
        seen.port()
    );
    let line = d.wait_for(&want, Duration::from_secs(10));
    println!("admitted: {line}");

    let before = t.counter("drop_malformed");
    send_malformed(&t);
    let line = d.wait_for(LINE_MALFORMED, Duration::from_secs(10));
    println!("malformed: {line}");
    assert!(
        line.contains("malformed (inconsistent header lengths)"),
        "{line}"
    );
    assert_eq!(
        t.counter("drop_malformed"),
        before + 1,
        "the frame was not dropped as malformed"
    );

    // Established: the flow's later packets make no line.
    let admitted = |d: &Daemon| d.output().matches(LINE_ADMITTED).count();
    let n = admitted(&d);
    for _ in 0..5 {
        assert_eq!(udp_through(&t, 40_123, 5_353), seen, "the mapping changed");
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        admitted(&d),
        n,
        "lines for an established flow:\n{}",
        d.output()
    );

    // A port forward: the WAN flow's tuple and the LAN host it goes to.
    t.router_ctl_ok(&["forward", "add", "udp", "8053", "192.168.50.2:53"]);
    let lan = t.in_ns(Ns::Client, || {
        UdpSocket::bind(socket_addr(CLIENT_ADDR, 53)).expect("bind the LAN host")
    });
    lan.set_read_timeout(Some(IO)).unwrap();
    let wan = t.in_ns(Ns::Server, || {
        UdpSocket::bind(socket_addr(SERVER_ADDR, 40_200)).expect("bind the WAN host")
    });
    wan.send_to(b"forwarded", socket_addr(ROUTER_WAN_ADDR, 8053))
        .expect("send");
    let mut buf = [0u8; 64];
    let (n, _) = lan.recv_from(&mut buf).expect("the forwarded datagram");
    assert_eq!(&buf[..n], b"forwarded");
    let want = format!(
        "flow admitted: port forward proto 17 {SERVER_ADDR}:40200 -> {ROUTER_WAN_ADDR}:8053 \
         to {CLIENT_ADDR}:53"
    );
    println!(
        "port forward: {}",
        d.wait_for(&want, Duration::from_secs(10))
    );

    d.stop();
    assert_eq!(
        log_gate(&t),
        0,
        "the log stayed on after the daemon stopped"
    );
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn no_data_path_lines_without_rust_log() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let mut d = Daemon::start(&t, None);
    let before = t.counter("flow_new_masquerade");
    let malformed_before = t.counter("drop_malformed");
    udp_through(&t, 40_124, 5_354);
    send_malformed(&t);
    // The daemon drains the ring buffer on readiness and every tick: give
    // a line the time it would need to show.
    std::thread::sleep(Duration::from_secs(2));
    // Both events happened: their lines were not printed for want of them.
    assert_eq!(
        t.counter("flow_new_masquerade"),
        before + 1,
        "no new flow admitted"
    );
    assert_eq!(
        t.counter("drop_malformed"),
        malformed_before + 1,
        "the frame was not dropped as malformed"
    );
    d.stop();
    let out = d.output();
    assert!(
        !out.contains(LINE_ADMITTED) && !out.contains(LINE_MALFORMED),
        "data-path lines without RUST_LOG:\n{out}"
    );
    assert_eq!(log_gate(&t), 0);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn debug_log_follows_a_replaced_program() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let d = Daemon::start(&t, Some("router_ebpf=debug"));
    let status = || -> serde_json::Value {
        serde_json::from_str(&t.router_ctl_ok(&["status", "--json"])).expect("status JSON")
    };
    let old = status();
    let (old_gate, level) = log_gate_map(&t);
    assert_eq!(level, 4, "run with router_ebpf=debug set the gate");
    // A live replace loads a new program, with its own log and gate.
    attach_and_print(&t, &["--reload"]);
    let new = status();
    assert_ne!(
        new["record"]["prog_id"], old["record"]["prog_id"],
        "the reload replaced no program"
    );
    assert_eq!(
        new["record"]["replacements"].as_u64(),
        old["record"]["replacements"].as_u64().map(|n| n + 1),
        "the record counts no replacement"
    );
    // The new program has a gate of its own, which starts off (attach
    // does not write it): a debug level in it is the daemon's doing.
    assert_ne!(
        log_gate_map(&t).0,
        old_gate,
        "the replaced program kept the old log gate"
    );
    // The daemon notices the new program at its next tick (2 s) and turns
    // its gate on.
    let deadline = Instant::now() + Duration::from_secs(10);
    while log_gate(&t) != 4 {
        assert!(
            Instant::now() < deadline,
            "the daemon did not turn the replaced program's log on; status: {}\noutput:\n{}",
            status(),
            d.output()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let seen = udp_through(&t, 40_125, 5_355);
    let want = format!(
        "{LINE_ADMITTED} proto 17 {CLIENT_ADDR}:40125 -> {SERVER_ADDR}:5355 as \
         {ROUTER_WAN_ADDR}:{}",
        seen.port()
    );
    println!(
        "after the replace: {}",
        d.wait_for(&want, Duration::from_secs(10))
    );
}
