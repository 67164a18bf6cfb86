//! Offload mode end to end: a router namespace with an ordinary firewall
//! (nftables or iptables-legacy: forward policy drop, LAN -> WAN allowed
//! except one UDP port, established allowed, a DNAT port forward,
//! masquerade), `attach --admit kernel` and `router-ctl run`. The kernel
//! decides about every new flow; established ones move to XDP.

use std::{
    io::{BufRead as _, BufReader},
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tests::{
    CLIENT_ADDR, HOST_IF, LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF,
    host::load_nft, router_ctl_bin, socket_addr as sa,
};

use crate::ctl::{DetachOnDrop, Stream, wait_for, wait_for_or_show};

/// The UDP port the firewall drops from the LAN.
const BLOCKED_UDP_PORT: u16 = 9999;
/// The TCP port whose connections the router's quality-of-service rule marks at every packet.
const MARKED_TCP_PORT: u16 = 7300;
/// WAN port forwarded (DNAT) to the client's port 80.
const FORWARDED_PORT: u16 = 8080;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Firewall {
    Nftables,
    IptablesLegacy,
}

/// The router's firewall and NAT, the way a router owner writes them.
pub(crate) fn install_firewall(t: &Topology, fw: Firewall) {
    let dnat_to = format!("{CLIENT_ADDR}:80");
    match fw {
        Firewall::Nftables => {
            let rules = format!(
                "table inet filter {{
  chain forward {{
    type filter hook forward priority 0; policy drop;
    ct state established,related counter accept
    iifname \"{LAN_IF}\" oifname \"{WAN_IF}\" udp dport {BLOCKED_UDP_PORT} counter drop
    iifname \"{LAN_IF}\" oifname \"{WAN_IF}\" accept
    iifname \"{WAN_IF}\" oifname \"{LAN_IF}\" ct status dnat accept
  }}
}}
table ip nat {{
  chain prerouting {{
    type nat hook prerouting priority dstnat;
    iifname \"{WAN_IF}\" tcp dport {FORWARDED_PORT} dnat to {dnat_to}
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat;
    oifname \"{WAN_IF}\" masquerade
  }}
}}
"
            );
            load_nft(t.ns_name(Ns::Router), &rules);
        }
        Firewall::IptablesLegacy => {
            let blocked = BLOCKED_UDP_PORT.to_string();
            let fwd_port = FORWARDED_PORT.to_string();
            for rule in [
                vec!["-P", "FORWARD", "DROP"],
                vec![
                    "-A",
                    "FORWARD",
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "ESTABLISHED,RELATED",
                    "-j",
                    "ACCEPT",
                ],
                vec![
                    "-A", "FORWARD", "-i", LAN_IF, "-o", WAN_IF, "-p", "udp", "--dport", &blocked,
                    "-j", "DROP",
                ],
                vec!["-A", "FORWARD", "-i", LAN_IF, "-o", WAN_IF, "-j", "ACCEPT"],
                vec![
                    "-A",
                    "FORWARD",
                    "-i",
                    WAN_IF,
                    "-o",
                    LAN_IF,
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "DNAT",
                    "-j",
                    "ACCEPT",
                ],
                vec![
                    "-t",
                    "nat",
                    "-A",
                    "PREROUTING",
                    "-i",
                    WAN_IF,
                    "-p",
                    "tcp",
                    "--dport",
                    &fwd_port,
                    "-j",
                    "DNAT",
                    "--to-destination",
                    &dnat_to,
                ],
                vec![
                    "-t",
                    "nat",
                    "-A",
                    "POSTROUTING",
                    "-o",
                    WAN_IF,
                    "-j",
                    "MASQUERADE",
                ],
            ] {
                let mut cmd = vec!["iptables-legacy"];
                cmd.extend(rule);
                t.exec_ok(Ns::Router, &cmd);
            }
        }
    }
}

/// `router-ctl run` in the router namespace, killed on drop. Its stderr is
/// collected for failure messages.
pub(crate) struct Daemon {
    child: Child,
    log: Arc<Mutex<String>>,
    /// The status file it writes (left behind by a SIGKILL).
    status_file: std::path::PathBuf,
}

impl Daemon {
    pub(crate) fn start(t: &Topology, extra: &[&str]) -> Self {
        let mut child = Command::new(router_ctl_bin())
            .args(["-n", t.ns_name(Ns::Router), "run"])
            // No status page: the default port is shared by every test run
            // on the machine (the page has its own tests).
            .args(["--listen", "none"])
            .args(extra)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting router-ctl run");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("stop with Ctrl-C") {
                    let _ = tx.send(());
                }
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let status_file = std::path::Path::new("/run/xdp-router")
            .join(format!("{}.daemon.json", t.ns_name(Ns::Router)));
        let d = Self {
            child,
            log,
            status_file,
        };
        assert!(
            rx.recv_timeout(Duration::from_secs(10)).is_ok(),
            "router-ctl run did not start:\n{}",
            d.log()
        );
        d
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Its exit status if it exits within `within`.
    pub(crate) fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends it `sig` (SIGSTOP, SIGCONT).
    pub(crate) fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: a signal to the child this process started and has not
        // reaped.
        unsafe { libc::kill(pid, sig) };
    }

    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops it as systemd does (SIGTERM) and waits for it to exit (10 s
    /// at most, then SIGKILL): its last lines reach [`Self::log`] soon
    /// after.
    pub(crate) fn terminate(&mut self) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a pid");
        // SAFETY: a signal to the child this process started and has not
        // reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill9();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_file(&self.status_file);
    }
}

/// The router's kernel UDP timeouts, unreplied and stream, set to 10 s.
pub(crate) fn short_udp_timeouts(t: &Topology) {
    for s in [
        "nf_conntrack_udp_timeout=10",
        "nf_conntrack_udp_timeout_stream=10",
    ] {
        t.exec_ok(
            Ns::Router,
            &["sysctl", "-qw", &format!("net.netfilter.{s}")],
        );
    }
}

/// A UDP echo service in `ns` on `addr` for `lifetime` (a thread).
pub(crate) fn udp_echo(
    t: &Topology,
    ns: Ns,
    addr: SocketAddr,
    lifetime: Duration,
) -> JoinHandle<()> {
    let name = t.ns_name(ns).to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        tests::netns::enter(&name);
        let s = UdpSocket::bind(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        tx.send(()).unwrap();
        let end = Instant::now() + lifetime;
        let mut buf = [0u8; 2048];
        while Instant::now() < end {
            if let Ok((n, peer)) = s.recv_from(&mut buf) {
                let _ = s.send_to(&buf[..n], peer);
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("UDP echo bound");
    h
}

/// A connected UDP socket in the client namespace from `port`.
fn udp_client(t: &Topology, port: u16, dst: SocketAddr) -> UdpSocket {
    t.in_ns(Ns::Client, || {
        let s = UdpSocket::bind(sa(Ipv4Addr::UNSPECIFIED, port)).unwrap();
        s.connect(dst).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        s
    })
}

/// Sends `n` datagrams `gap` apart; how many echoes came back.
pub(crate) fn echoes(s: &UdpSocket, n: u32, gap: Duration) -> u32 {
    let mut ok = 0;
    let mut buf = [0u8; 64];
    for i in 0..n {
        let msg = format!("echo {i}");
        s.send(msg.as_bytes()).unwrap();
        if matches!(s.recv(&mut buf), Ok(k) if &buf[..k] == msg.as_bytes()) {
            ok += 1;
        }
        std::thread::sleep(gap);
    }
    ok
}

pub(crate) fn counter(t: &Topology, name: &str) -> u64 {
    t.counter(name)
}

/// The daemon's offload counter `name` (`status --json`; 0 before it
/// counted one).
fn offload_count(t: &Topology, name: &str) -> u64 {
    crate::ctl::status(t).0["daemon"]["offload"][name]
        .as_u64()
        .unwrap_or(0)
}

/// How many connections the daemon left in the kernel for `reason`.
fn not_offloaded(t: &Topology, reason: &str) -> u64 {
    crate::ctl::status(t).0["daemon"]["offload"]["not_offloaded"][reason]
        .as_u64()
        .unwrap_or(0)
}

/// Offloaded flows in the XDP table (conntrack list rows marked offloaded).
pub(crate) fn offloaded_rows(t: &Topology) -> Vec<serde_json::Value> {
    t.conntrack()
        .into_iter()
        .filter(|f| f["offloaded"] == true)
        .collect()
}

/// The offloaded flows XDP carries now: within their lease. Not a pair
/// still pending (written, not yet activated: a stalled daemon's) nor one
/// handed back (the previous connection on the same ports, until the
/// daemon's next tick removes it), whose packets go to the kernel.
pub(crate) fn carried_rows(t: &Topology) -> Vec<serde_json::Value> {
    offloaded_rows(t)
        .into_iter()
        .filter(|f| f["expired"] == false)
        .collect()
}

/// The kernel's conntrack entries (conntrack -L) matching `filter`.
pub(crate) fn kernel_entries(t: &Topology, filter: &[&str]) -> Vec<String> {
    let mut cmd = vec!["conntrack", "-L"];
    cmd.extend_from_slice(filter);
    let o = t.exec(Ns::Router, &cmd);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The offloaded row of the UDP flow from the client's port 42000.
/// Retransmission timeouts on the client, the sender of a [`Stream`]: a
/// stream black-holed for a while fires them again and again (each waits
/// twice as long as the one before), where one segment lost at a switch
/// of paths costs at most one. Counted instead of timing the stream,
/// which a loaded machine slows without anything being lost.
fn rto_count(t: &Topology) -> u64 {
    t.nstat(Ns::Client, "TcpExtTCPTimeouts")
}

fn offloaded_udp_42000(t: &Topology) -> Option<serde_json::Value> {
    offloaded_rows(t)
        .into_iter()
        .find(|f| f["proto"] == "udp" && f["orig_src"] == format!("{CLIENT_ADDR}:42000"))
}

/// After the 40 echoes of the offloaded UDP flow from port 42000: XDP
/// counted them in the flow's entries; the kernel's own accounting, listed
/// next to them, has what the kernel forwarded before the offload (it
/// takes no counts from XDP).
fn assert_counted_by_both(t: &Topology) {
    let row = offloaded_udp_42000(t).unwrap_or_else(|| {
        panic!(
            "no offloaded UDP row: {}",
            t.router_ctl_ok(&["conntrack", "list"])
        )
    });
    let num = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("not a count: {row}"));
    assert!(
        num(&row["orig_packets"]) >= 40 && num(&row["reply_packets"]) >= 40,
        "XDP's counts: {row}"
    );
    let kernel = &row["kernel"];
    assert!(
        num(&kernel["orig_packets"]) >= 1 && num(&kernel["reply_packets"]) >= 1,
        "the kernel's counts of the flow's start: {row}"
    );
    assert!(
        num(&kernel["orig_packets"]) + num(&row["orig_packets"]) >= 43,
        "{row}"
    );
}

/// The port forward (the kernel's DNAT rule) works and is offloaded: a
/// connection from the WAN to the forwarded port, echoed by a LAN server;
/// once the daemon offloaded it (polled: how soon depends on the machine's
/// load, and a fast transfer could end before), its next 512 KiB each way
/// go through XDP.
fn port_forward_is_offloaded(t: &Topology) {
    use std::io::{Read as _, Write as _};
    let lan_srv = t.tcp_echo_server(Ns::Client, sa(CLIENT_ADDR, 80));
    let dst = sa(ROUTER_WAN_ADDR, FORWARDED_PORT);
    let mut conn = t
        .in_ns(Ns::Server, || {
            std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(5))
        })
        .expect("port forward through the kernel's DNAT");
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let payload = tests::pattern(512 * 1024);
    // 16 KiB at a time, each echoed before the next (no buffer fills up).
    let mut echo = |bytes: &[u8]| {
        let mut back = vec![0u8; bytes.len()];
        for (out, chunk) in back.chunks_mut(16 * 1024).zip(bytes.chunks(16 * 1024)) {
            conn.write_all(chunk).expect("write to the forwarded port");
            conn.read_exact(out)
                .expect("the echo through the port forward");
        }
        assert!(back == bytes, "port-forwarded echo differs");
    };
    echo(&payload[..16 * 1024]);
    wait_for(
        "the port-forwarded flow to be offloaded",
        Duration::from_secs(10),
        || {
            carried_rows(t)
                .iter()
                .any(|f| f["proto"] == "tcp" && f["orig_dst"] == dst.to_string().as_str())
        },
    );
    let in1 = counter(t, "fwd_inbound");
    echo(&payload);
    assert!(
        counter(t, "fwd_inbound") - in1 > 100,
        "the port-forwarded flow was not carried by XDP"
    );
    drop(conn);
    assert_eq!(
        lan_srv.join().map(|p| p.ip()),
        Some(std::net::IpAddr::V4(SERVER_ADDR))
    );
}

/// An established UDP flow moves to XDP: after its first reply the
/// kernel forwards (almost) none of its packets any more.
fn established_udp_flow_moves_to_xdp(t: &Topology) {
    let udp = udp_client(t, 42000, sa(SERVER_ADDR, 7000));
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3);
    // The daemon offloads it after the kernel's event: polled, as that
    // takes longer than any fixed pause on a loaded machine.
    wait_for(
        "the UDP flow to be offloaded",
        Duration::from_secs(10),
        || offloaded_udp_42000(t).is_some(),
    );
    let (kernel0, out0, in0) = (
        t.nstat(Ns::Router, "IpForwDatagrams"),
        counter(t, "fwd_outbound"),
        counter(t, "fwd_inbound"),
    );
    assert_eq!(echoes(&udp, 40, Duration::from_millis(5)), 40);
    let kernel_fwd = t.nstat(Ns::Router, "IpForwDatagrams") - kernel0;
    let (xdp_out, xdp_in) = (
        counter(t, "fwd_outbound") - out0,
        counter(t, "fwd_inbound") - in0,
    );
    println!(
        "40 echoes of an offloaded UDP flow: kernel forwarded {kernel_fwd}, XDP {xdp_out} out / {xdp_in} in"
    );
    assert!(
        xdp_out >= 40 && xdp_in >= 40,
        "XDP did not carry the flow: {xdp_out}/{xdp_in}"
    );
    // Other flows run meanwhile (the early TCP stream): allow a few.
    assert!(
        kernel_fwd < 20,
        "the kernel still forwards the offloaded flow ({kernel_fwd})"
    );
    assert_counted_by_both(t);

    // `conntrack flush` takes it off XDP (the kernel carries it, nothing
    // lost); the daemon finds its entries gone at its next tick and puts
    // it back from a dump of the kernel's table.
    let resyncs = |t: &Topology| crate::ctl::status(t).0["daemon"]["offload"]["resyncs"].as_u64();
    let resyncs0 = resyncs(t);
    let out = t.router_ctl_ok(&["conntrack", "flush"]);
    // It says the daemon puts them back (not that they open new flows).
    assert!(
        out.contains("offloads the ones it still has again") && out.contains("conntrack -D"),
        "{out}"
    );
    assert!(offloaded_udp_42000(t).is_none(), "flushed");
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3);
    wait_for(
        "the flushed UDP flow to be offloaded again",
        Duration::from_secs(15),
        || offloaded_udp_42000(t).is_some(),
    );
    assert!(resyncs(t) > resyncs0, "offloaded again without a resync");
}

fn firewall_keeps_control_and_established_flows_move_to_xdp(fw: Firewall) {
    let t = Topology::new();
    // The kernel's per-flow accounting, shown next to XDP's counts.
    let acct = t.exec(
        Ns::Router,
        &["sysctl", "-qw", "net.netfilter.nf_conntrack_acct=1"],
    );
    assert!(
        acct.status.success(),
        "turning conntrack accounting on failed"
    );
    install_firewall(&t, fw);
    // A QoS or multi-WAN script's rule: it changes the ct mark of a
    // connection at each of its packets the kernel handles.
    t.exec_ok(
        Ns::Router,
        &[
            "nft",
            &format!(
                "add table inet qos; \
                 add chain inet qos classify {{ type filter hook forward priority mangle; }}; \
                 add rule inet qos classify tcp dport {MARKED_TCP_PORT} ct mark set ct mark xor 0x1"
            ),
        ],
    );
    let _detach = DetachOnDrop(&t);
    let life = Duration::from_secs(90);
    let _udp_srv = udp_echo(&t, Ns::Server, sa(SERVER_ADDR, 7000), life);
    let _blocked_srv = udp_echo(&t, Ns::Server, sa(SERVER_ADDR, BLOCKED_UDP_PORT), life);

    // A connection the kernel admitted before the fast path existed.
    let early = Stream::start(&t, sa(SERVER_ADDR, 7100), 4 << 20, 10.0);
    std::thread::sleep(Duration::from_secs(1));

    let out = t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    assert!(
        out.contains("kernel"),
        "attach does not say offload mode: {out}"
    );
    // Without its daemon offload mode carries nothing: status says so in
    // its exit code too (a monitor reads that).
    crate::ctl::assert_offload_without_daemon(&t);
    let daemon = Daemon::start(&t, &[]);
    let (v, code) = crate::ctl::status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("attached"), 0), "{v}");
    wait_for(
        "the early stream to be offloaded",
        Duration::from_secs(5),
        || !offloaded_rows(&t).is_empty(),
    );
    // The QoS table changes this connection's ct mark at each of its
    // packets the kernel handles (its handshake, and its data until the
    // offload is active): updates without the TCP state, which must
    // neither end its offload nor keep it from being offloaded.
    let marked = Stream::until_stopped(&t, sa(SERVER_ADDR, MARKED_TCP_PORT), 256.0 * 1024.0, 60.0);
    let marked_row = |t: &Topology| {
        offloaded_rows(t)
            .into_iter()
            .any(|f| f["orig_dst"] == format!("{SERVER_ADDR}:{MARKED_TCP_PORT}"))
    };
    wait_for(
        "the stream whose ct mark changes to be offloaded",
        Duration::from_secs(5),
        || marked_row(&t),
    );
    // The daemon's status (written at its 2 s tick) counts the early
    // stream's offload and this one's; a tick later the events are long
    // handled.
    let offload_stats = |t: &Topology| crate::ctl::status(t).0["daemon"]["offload"].clone();
    wait_for(
        "the daemon's status to count both offloads",
        Duration::from_secs(10),
        || offload_stats(&t)["offloaded"].as_u64() >= Some(2),
    );
    std::thread::sleep(Duration::from_millis(2500));
    let v = offload_stats(&t);
    assert_eq!(
        v["ended_closing"].as_u64(),
        Some(0),
        "a ct mark change ended an offload: {v}"
    );
    assert!(marked_row(&t), "a ct mark change ended the offload");
    assert!(marked.finish() > 0);

    // The firewall still decides: the blocked port stays blocked...
    let blocked = udp_client(&t, 41000, sa(SERVER_ADDR, BLOCKED_UDP_PORT));
    assert_eq!(
        echoes(&blocked, 3, Duration::ZERO),
        0,
        "the firewall's drop rule was bypassed"
    );
    // ...and allowed traffic works, masqueraded by the kernel's NAT.
    assert_eq!(
        t.tcp_echo_roundtrip(Ns::Client, Ns::Server, sa(SERVER_ADDR, 7200))
            .ip(),
        ROUTER_WAN_ADDR
    );
    assert!(
        t.ping(Ns::Client, SERVER_ADDR, 3),
        "ping through the router failed"
    );

    established_udp_flow_moves_to_xdp(&t);

    port_forward_is_offloaded(&t);

    // The connection from before attach went on, every byte intact.
    early.finish();
    let rows = t.router_ctl_ok(&["conntrack", "list"]);
    println!("{rows}");
    assert!(
        daemon.log().contains("offloaded"),
        "the daemon logged no offload:\n{}",
        daemon.log()
    );
    let stats = t.router_ctl_ok(&["stats"]);
    assert!(counter(&t, "pass_not_offloaded") > 0, "{stats}");
    // The UDP flow's offload asked the egress witness whether one of its
    // replies was forwarded: attached to both interfaces.
    assert_eq!(witnesses(&t), 2);
    assert_eq!(
        crate::ctl::status(&t).0["daemon"]["egress_witness"],
        "attached"
    );
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_with_nftables_firewall() {
    firewall_keeps_control_and_established_flows_move_to_xdp(Firewall::Nftables);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_with_iptables_legacy_firewall() {
    firewall_keeps_control_and_established_flows_move_to_xdp(Firewall::IptablesLegacy);
}

/// Detach while an offloaded TCP stream runs, and SIGKILL the daemon while
/// another runs: both finish with every byte, none is reset or stalls.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_detach_and_daemon_kill_lose_no_flow() {
    let t = Topology::new();
    install_firewall(&t, Firewall::Nftables);
    let _detach = DetachOnDrop(&t);
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let mut daemon = Daemon::start(&t, &[]);
    // A second daemon on the router is refused and changes nothing of the
    // first's (the one after the SIGKILL below starts: the lock went with
    // the killed process).
    let second = t.router_ctl(&["run", "--listen", "none"]);
    let e = crate::ctl::stderr(&second);
    assert!(
        !second.status.success() && e.contains("another `router-ctl run` serves this router"),
        "{e}"
    );
    let status_file = std::path::Path::new("/run/xdp-router")
        .join(format!("{}.daemon.json", t.ns_name(Ns::Router)));
    assert!(
        status_file.exists(),
        "the refused daemon removed the status file"
    );

    // Kill the daemon mid-stream: the flow stays on XDP for its lease.
    let secs = 6.0;
    let killed = Stream::start(&t, sa(SERVER_ADDR, 7300), 6 << 20, secs);
    wait_for("the stream to be offloaded", Duration::from_secs(5), || {
        !offloaded_rows(&t).is_empty()
    });
    let out0 = counter(&t, "fwd_outbound");
    std::thread::sleep(Duration::from_secs(1));
    let rto0 = rto_count(&t);
    daemon.kill9();
    // Status tells what still runs: the stream, until its lease ends.
    let (v, _) = crate::ctl::status(&t);
    let problems = v["problems"].to_string();
    assert!(
        problems.contains("offloaded flow(s) stay on the fast path until their leases end")
            && v["daemon"]["leased_flows"].as_u64() >= Some(1),
        "{v}"
    );
    killed.finish();
    assert!(
        rto_count(&t) - rto0 <= 1,
        "the stream stalled: retransmission timeouts after the daemon died ({})",
        rto_count(&t) - rto0
    );
    assert!(
        counter(&t, "fwd_outbound") - out0 > 100,
        "XDP stopped carrying the stream"
    );
    // New flows still work (the kernel admits them; nothing offloads).
    assert_eq!(
        t.tcp_echo_roundtrip(Ns::Client, Ns::Server, sa(SERVER_ADDR, 7301))
            .ip(),
        ROUTER_WAN_ADDR
    );

    // Detach mid-stream: the kernel, which kept the flow's state, carries on.
    let _daemon = Daemon::start(&t, &[]);
    let detached = Stream::start(&t, sa(SERVER_ADDR, 7302), 6 << 20, secs);
    wait_for(
        "the second stream to be offloaded",
        Duration::from_secs(5),
        || {
            offloaded_rows(&t)
                .iter()
                .any(|f| f["orig_dst"] == sa(SERVER_ADDR, 7302).to_string().as_str())
        },
    );
    std::thread::sleep(Duration::from_secs(1));
    let fwd0 = t.nstat(Ns::Router, "IpForwDatagrams");
    let rto1 = rto_count(&t);
    t.router_ctl_ok(&["detach"]);
    detached.finish();
    assert!(
        rto_count(&t) - rto1 <= 1,
        "the stream stalled: retransmission timeouts after the detach ({})",
        rto_count(&t) - rto1
    );
    assert!(
        t.nstat(Ns::Router, "IpForwDatagrams") - fwd0 > 100,
        "the kernel did not take the stream over"
    );
}

/// A UDP flow kept busy through XDP for longer than the kernel's UDP
/// timeout stays in both tables; once idle it ends in both.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_lifetimes_follow_the_traffic() {
    let t = Topology::new();
    install_firewall(&t, Firewall::Nftables);
    let _detach = DetachOnDrop(&t);
    t.router_ctl_ok(&[
        "attach",
        LAN_IF,
        WAN_IF,
        "--admit",
        "kernel",
        "--timeout",
        "udp-replied=10",
    ]);
    let _daemon = Daemon::start(&t, &[]);
    // Short kernel UDP timeouts, and the same in XDP; set while the daemon
    // runs, which reads them again at every tick (with the values it found
    // at its start, 30 / 120 s, the idle flow would stay two minutes).
    short_udp_timeouts(&t);
    let _srv = udp_echo(
        &t,
        Ns::Server,
        sa(SERVER_ADDR, 7400),
        Duration::from_mins(1),
    );
    let udp = udp_client(&t, 43000, sa(SERVER_ADDR, 7400));
    let kernel_flow = ["-p", "udp", "--orig-port-src", "43000"];
    // 24 s of one echo every 0.5 s: more than twice the kernel's timeout.
    let out0 = counter(&t, "fwd_outbound");
    assert_eq!(
        echoes(&udp, 48, Duration::from_millis(500)),
        48,
        "the busy flow lost echoes"
    );
    let carried = counter(&t, "fwd_outbound") - out0;
    assert!(carried >= 40, "XDP carried only {carried} of 48 datagrams");
    let entries = kernel_entries(&t, &kernel_flow);
    assert_eq!(entries.len(), 1, "the kernel forgot the busy flow");
    // A stream, as the kernel would have marked it had it seen the
    // packets (kept over unassured entries when its table is full).
    assert!(entries[0].contains("[ASSURED]"), "{entries:?}");
    assert_eq!(offloaded_rows(&t).len(), 1, "XDP forgot the busy flow");
    // Idle: both tables let it go (kernel timeout 10 s after the last refresh).
    wait_for(
        "the idle flow to leave both tables",
        Duration::from_secs(25),
        || kernel_entries(&t, &kernel_flow).is_empty() && offloaded_rows(&t).is_empty(),
    );
}

/// Size of the request and of the reply of one short connection (the
/// benchmark's connection-rate workload exchanges as much).
const SHORT_CONN_BYTES: usize = 16;

/// What a [`request_server`] does with a connection once it answered its
/// request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AfterReply {
    /// Closes it at once: the server closes first.
    Close,
    /// Keeps it open until the client closes it (or the lifetime ends).
    HoldUntilClientCloses,
}

/// A server for `count` connections on `addr` (a thread in the server
/// namespace): each `SHORT_CONN_BYTES` request gets the same bytes back,
/// then `after` says who closes. Accepts until `count` connections or
/// `lifetime`; returns how many it answered.
fn request_server(
    t: &Topology,
    addr: SocketAddr,
    count: usize,
    lifetime: Duration,
    after: AfterReply,
) -> JoinHandle<usize> {
    use std::io::{Read as _, Write as _};
    let name = t.ns_name(Ns::Server).to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        tests::netns::enter(&name);
        let listener = std::net::TcpListener::bind(addr).unwrap();
        listener.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        let end = Instant::now() + lifetime;
        let mut answered = 0;
        let mut held = Vec::new();
        while answered < count && Instant::now() < end {
            let Ok((mut s, _)) = listener.accept() else {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            };
            s.set_nonblocking(false).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut req = [0u8; SHORT_CONN_BYTES];
            if s.read_exact(&mut req).is_ok() && s.write_all(&req).is_ok() {
                answered += 1;
                if after == AfterReply::HoldUntilClientCloses {
                    held.push(s);
                }
            }
            // Otherwise dropped here: the server closes first.
        }
        // Until the client's close (EOF) or the end of the lifetime.
        for s in &mut held {
            let left = end.saturating_duration_since(Instant::now());
            s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            let _ = s.read(&mut [0u8; 1]);
        }
        answered
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("request server bound");
    h
}

/// One short connection from the client's fixed `port` (`SO_REUSEADDR`, as
/// a client cycling through its ports reuses them) to `dst`: connect, then
/// `before_request` (e.g. wait for the offload), 16-byte request, 16-byte
/// reply, the server's close, our close. What failed, if anything.
fn short_connection(
    port: u16,
    dst: SocketAddr,
    before_request: impl FnOnce(),
) -> Result<(), String> {
    use std::io::{Read as _, Write as _};

    let mut s = tests::echo::tcp_connect_from(sa(CLIENT_ADDR, port), dst, Duration::from_secs(5))
        .map_err(|e| format!("connect from port {port}: {e}"))?;
    before_request();
    let req = [port.to_be_bytes()[1]; SHORT_CONN_BYTES];
    s.write_all(&req)
        .map_err(|e| format!("request from port {port}: {e}"))?;
    let mut reply = [0u8; SHORT_CONN_BYTES];
    s.read_exact(&mut reply)
        .map_err(|e| format!("reply to port {port}: {e}"))?;
    if reply != req {
        return Err(format!("reply to port {port} differs"));
    }
    match s.read(&mut reply) {
        Ok(0) => Ok(()),
        Ok(_) => Err(format!("more than the reply to port {port}")),
        Err(e) => Err(format!("the server's close towards port {port}: {e}")),
    }
}

/// How the client and the server namespace recovered lost or reordered
/// TCP segments so far.
#[derive(Clone, Copy, Debug, Default)]
struct Recovery {
    /// Segments retransmitted.
    retransmitted: u64,
    /// Of which by fast retransmit (duplicate ACKs / SACK).
    fast: u64,
    /// Tail loss probes sent (RFC 8985 7.3: after about two round trips
    /// without an ACK, a millisecond-scale probe; on a loaded machine a
    /// late ACK alone triggers one).
    probes: u64,
    /// Retransmission timeouts: a connection stalled for 200 ms or more.
    timeouts: u64,
}

impl Recovery {
    fn now(t: &Topology) -> Self {
        let both = |c: &str| t.nstat(Ns::Client, c) + t.nstat(Ns::Server, c);
        Self {
            retransmitted: both("TcpRetransSegs"),
            fast: both("TcpExtTCPFastRetrans"),
            probes: both("TcpExtTCPLossProbes"),
            timeouts: both("TcpExtTCPTimeouts"),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            retransmitted: self.retransmitted - before.retransmitted,
            fast: self.fast - before.fast,
            probes: self.probes - before.probes,
            timeouts: self.timeouts - before.timeouts,
        }
    }

    /// No loss: at most a fast retransmit of a segment the hand-over to
    /// the kernel reordered. A server's reply goes through XDP and its FIN,
    /// right behind it, through the kernel, which can deliver the FIN
    /// first (seen in captures: 6 us apart); the client's SACK makes the
    /// server resend the 16 bytes at once, or a tail loss probe does.
    /// Nothing waits for a retransmission timeout.
    fn assert_no_loss(self, what: &str, show: &dyn Fn(&str) -> String) {
        assert!(
            self.timeouts == 0 && self.retransmitted <= self.fast + self.probes,
            "{}",
            show(&format!("{what}: {self:?}"))
        );
    }
}

/// The reused-port connections' server.
const SHORT_CONN_SERVER_PORT: u16 = 7500;
/// The client port the connections one after the other reuse; the
/// parallel ones use the next few.
const SHORT_CONN_FIRST_PORT: u16 = 45000;

/// Short TCP connections that reuse the client's source port, the way a
/// busy client cycles through its ephemeral ports: each is offloaded once
/// established, its FIN hands it back to the kernel, and the next one on
/// the same port starts from the kernel again. Every connection completes
/// with no segment lost (no retransmission timeout; see
/// [`Recovery::assert_no_loss`]), the kernel's entry sees the whole close
/// (it ends in `TIME_WAIT`), no closed connection keeps an offloaded one's
/// kernel timeout, and XDP carried the requests and replies.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_short_connections_reusing_a_port() {
    const SEQUENTIAL: usize = 12;
    const PARALLEL_PORTS: u16 = 8;
    const PER_PORT: usize = 40;
    let t = Topology::new();
    install_firewall(&t, Firewall::Nftables);
    let _detach = DetachOnDrop(&t);
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let daemon = Daemon::start(&t, &[]);
    let dst = sa(SERVER_ADDR, SHORT_CONN_SERVER_PORT);
    let total = SEQUENTIAL + usize::from(PARALLEL_PORTS) * PER_PORT;
    let srv = request_server(&t, dst, total, Duration::from_mins(2), AfterReply::Close);
    let server_port = SHORT_CONN_SERVER_PORT.to_string();
    let all_flows = ["-p", "tcp", "--orig-port-dst", server_port.as_str()];
    record_untranslated_arrivals(&t);
    // The daemon's log in the middle: the end says what the router's own
    // TCP stack received untranslated (the segments it reset).
    let show = |what: &str| {
        format!(
            "{what}\nkernel: {:?}\nXDP: {}\ndaemon:\n{}\nstats: {}\ntcp: {}\n\
             untranslated at the router: {}\n{what}",
            kernel_entries(&t, &all_flows),
            t.router_ctl_ok(&["conntrack", "list"]),
            daemon.log(),
            t.router_ctl_ok(&["stats"]),
            tcp_counters(&t),
            untranslated_arrivals(&t),
        )
    };
    one_port_in_turn(&t, SEQUENTIAL, &show);
    ports_at_once(&t, PARALLEL_PORTS, PER_PORT, &show);
    assert_eq!(srv.join().unwrap(), total);
    // No closed connection kept the timeout the daemon gives an offloaded
    // one (the kernel's ESTABLISHED timeout, 5 days by default): it was
    // offloaded only while the kernel had it ESTABLISHED.
    let stuck: Vec<String> = kernel_entries(&t, &all_flows)
        .into_iter()
        .filter(|e| {
            let f: Vec<&str> = e.split_whitespace().collect();
            let timeout: u64 = f.get(2).and_then(|t| t.parse().ok()).unwrap_or(0);
            f.get(3) != Some(&"ESTABLISHED") && timeout > 300
        })
        .collect();
    assert!(
        stuck.is_empty(),
        "closed connections with an offloaded one's timeout: {stuck:?}"
    );
}

/// A burst of new TCP connections, far beyond the daemon's immediate
/// offloads (`IMMEDIATE_TCP` in router-ctl's offload.rs: 200/s, 50 at
/// once), that stay open: each is offloaded, the first at once, the rest
/// once they stayed ESTABLISHED for the settle time (the daemon's settle
/// timer). Nothing is left waiting or lost.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_a_burst_of_lasting_connections_offloads_each_once_settled() {
    burst_of_lasting_connections(&[]);
}

/// The same burst with the daemon reading conntrack events on its poll
/// timer, a batch per read, as it does under a load of events (`run
/// --poll-events` pins it there: the test's burst is too short to switch
/// it reliably): every connection is offloaded all the same.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_a_burst_read_by_polling_offloads_each_once_settled() {
    let d = burst_of_lasting_connections(&["--poll-events"]);
    assert!(d["offload"]["event_polls"].as_u64() > Some(0), "{d}");
    assert_eq!(d["offload"]["events_lost"], 0, "{d}");
}

/// The daemon at low switch rates (`run --event-pace-rates 100,10`, hidden):
/// a burst of short connections makes it poll for conntrack events, the
/// quiet after it makes it wait for them again, and a connection made then
/// is offloaded with its events read by waiting (no poll and no switch since
/// the return). Both hand-overs of the event socket (out of the runtime's
/// epoll set and back in) lose and delay nothing.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_after_polling_and_back_waits_for_a_new_connection() {
    const LASTING_PORT: u16 = 7701;
    let t = Topology::new();
    install_firewall(&t, Firewall::Nftables);
    let _detach = DetachOnDrop(&t);
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    // Status written every second: the switches show sooner.
    let daemon = Daemon::start(&t, &["--event-pace-rates", "100,10", "--tick", "1"]);
    let offload = || {
        let v: serde_json::Value =
            serde_json::from_str(&t.router_ctl_ok(&["stats", "--json"])).unwrap();
        v["daemon"]["offload"].clone()
    };
    let counter = |o: &serde_json::Value, name: &str| o[name].as_u64().unwrap_or(0);
    let bursts = bursts_until_polled(&t, &|| counter(&offload(), "event_polls") > 0);
    let show = |what: &str| format!("{what}\ndaemon: {}\nlog:\n{}", offload(), daemon.log());
    assert!(
        counter(&offload(), "event_polls") > 0,
        "{}",
        show(&format!(
            "{bursts} bursts of short connections did not switch to polling"
        ))
    );
    wait_for_or_show(
        "the daemon to wait for events again after the burst",
        Duration::from_secs(10),
        || counter(&offload(), "event_waits_again") > 0,
        || show("still polling"),
    );
    // Written after the return to waiting: its polls are all there were.
    let before = offload();
    println!("after {bursts} burst(s), back to waiting: {before}");
    let lasting_dst = sa(SERVER_ADDR, LASTING_PORT);
    let lasting_srv = request_server(
        &t,
        lasting_dst,
        1,
        Duration::from_mins(1),
        AfterReply::HoldUntilClientCloses,
    );
    let lasting = t.in_ns(Ns::Client, || echo_connection(lasting_dst, 0));
    let lasting_port = format!(":{LASTING_PORT}");
    wait_for_or_show(
        "the connection made after the return to waiting to be offloaded",
        Duration::from_secs(10),
        || {
            carried_rows(&t).iter().any(|f| {
                f["proto"] == "tcp"
                    && f["orig_dst"]
                        .as_str()
                        .is_some_and(|d| d.ends_with(&lasting_port))
            })
        },
        || show("not offloaded"),
    );
    wait_for_or_show(
        "the daemon's status to count that offload",
        Duration::from_secs(10),
        || counter(&offload(), "offloaded") > counter(&before, "offloaded"),
        || show(&format!("before: {before}")),
    );
    let after = offload();
    println!("the new connection offloaded: {after}");
    for name in ["event_polls", "event_waits_again"] {
        assert_eq!(
            counter(&after, name),
            counter(&before, name),
            "{name}: its events were not read by waiting\nbefore: {before}\n{}",
            show("after")
        );
    }
    // Compared as JSON: a missing field (null) fails too.
    assert_eq!(after["events_lost"], 0, "{}", show("events lost"));
    drop(lasting);
    assert_eq!(lasting_srv.join().unwrap(), 1);
}

/// A flow made while no daemon listened to the kernel's events, offloaded
/// from the dump at the daemon's start: the kernel ends it without a
/// DESTROY event (`nf_conntrack_events` 2, the default, gives none for a
/// connection made with no listener), and the daemon, finding it idle past
/// its kernel timeout, asks the kernel and forgets it (`ended_kernel_gone`)
/// instead of showing it offloaded for good and carrying a later flow on
/// the same ports with its entries.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_a_flow_made_before_the_daemon_is_forgotten_when_the_kernel_ends_it() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    short_udp_timeouts(&t);
    let _srv = offload_router_with_udp_echo(&t);
    let udp = udp_client(&t, 42000, sa(SERVER_ADDR, 7000));
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3);
    let daemon = Daemon::start(&t, &["--tick", "1"]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    // Its replies go on (the kernel's, for the egress witness to see one
    // forwarded) until the daemon offloads it.
    wait_for_or_show(
        "the flow made before the daemon to be offloaded",
        Duration::from_secs(20),
        || {
            let _ = echoes(&udp, 1, Duration::from_millis(100));
            offloaded_udp_42000(&t).is_some()
        },
        show,
    );
    // Idle from now on: the kernel's 10 s timeout ends it, unsaid.
    wait_for_or_show(
        "the daemon to forget the flow the kernel ended",
        Duration::from_secs(30),
        || offloaded_udp_42000(&t).is_none(),
        show,
    );
    assert!(offload_count(&t, "ended_kernel_gone") >= 1, "{}", show());
}

/// A forward rule ahead of the `established` accept that drops the replies
/// of one UDP service and all echo replies from the WAN (a blocklist, a
/// fail2ban chain): conntrack calls those connections replied (it sees
/// the replies before the rule drops them), but the daemon offloads a UDP
/// or echo connection only once the egress witness saw the kernel forward
/// one of its replies to the LAN. The blocked ones stay in the kernel,
/// whose rule keeps dropping every reply; the allowed flow is offloaded.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_leaves_connections_whose_replies_a_forward_rule_drops_to_the_kernel() {
    const DROPPED_PORT: u16 = 7003;
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let _srv = offload_router_with_udp_echo(&t);
    for rule in [
        format!("iifname \"{WAN_IF}\" udp sport {DROPPED_PORT} counter drop"),
        format!("iifname \"{WAN_IF}\" icmp type echo-reply counter drop"),
    ] {
        let mut args = vec!["nft", "insert", "rule", "inet", "filter", "forward"];
        args.extend(rule.split_whitespace());
        t.exec_ok(Ns::Router, &args);
    }
    let _dropped = udp_echo(
        &t,
        Ns::Server,
        sa(SERVER_ADDR, DROPPED_PORT),
        Duration::from_mins(1),
    );
    let daemon = Daemon::start(&t, &["--tick", "1"]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    let allowed = udp_client(&t, 42000, sa(SERVER_ADDR, 7000));
    let blocked = udp_client(&t, 42001, sa(SERVER_ADDR, DROPPED_PORT));
    assert_eq!(echoes(&allowed, 3, Duration::from_millis(100)), 3);
    wait_for_or_show(
        "the allowed flow to be offloaded",
        Duration::from_secs(10),
        || offloaded_udp_42000(&t).is_some(),
        show,
    );
    // Past the daemon's looks at them (four, a second apart).
    let answered = echoes(&blocked, 30, Duration::from_millis(200));
    let server = SERVER_ADDR.to_string();
    let ping = t.exec(
        Ns::Client,
        &[
            "ping", "-n", "-q", "-c", "15", "-i", "0.3", "-W", "1", &server,
        ],
    );
    let ping = String::from_utf8_lossy(&ping.stdout).into_owned();
    assert_eq!(
        answered,
        0,
        "replies the rule drops got through\n{}",
        show()
    );
    assert!(
        ping.contains(" 0 received"),
        "echo replies the rule drops got through: {ping}\n{}",
        show()
    );
    let rows = offloaded_rows(&t);
    assert_eq!(rows.len(), 1, "{rows:?}\n{}", show());
    assert!(not_offloaded(&t, "reply_not_forwarded") >= 1, "{}", show());
    assert!(offloaded_udp_42000(&t).is_some(), "{}", show());
}

/// The daemon does not read its own writes back as events: over ticks that
/// refresh the kernel entries of 20 offloaded UDP flows XDP carries (each
/// refresh an UPDATE event to every listener, the writer too), the daemon
/// reads fewer events than flows; the kernel, seeing none of their
/// packets, has nothing of its own to tell. Read back, at 15,000 active
/// flows the echoes overflowed the event socket at every tick.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_the_daemons_own_refreshes_are_not_read_back_as_events() {
    const FLOWS: u16 = 20;
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let _srv = offload_router_with_udp_echo(&t);
    let daemon = Daemon::start(&t, &["--tick", "1"]);
    let flows: Vec<UdpSocket> = (0..FLOWS)
        .map(|i| udp_client(&t, 42100 + i, sa(SERVER_ADDR, 7000)))
        .collect();
    let round = || -> u32 { flows.iter().map(|f| echoes(f, 1, Duration::ZERO)).sum() };
    assert_eq!(round(), u32::from(FLOWS));
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    wait_for_or_show(
        "every flow to be offloaded",
        Duration::from_secs(15),
        || {
            round();
            offload_count(&t, "offloaded") >= u64::from(FLOWS)
        },
        show,
    );
    let before = (
        offload_count(&t, "events_read"),
        offload_count(&t, "refreshed"),
    );
    // Each flow active at each tick (one a second) for at least 3 ticks.
    let forwarded = counter(&t, "fwd_outbound");
    wait_for_or_show(
        "three ticks of refreshes",
        Duration::from_secs(15),
        || {
            assert_eq!(round(), u32::from(FLOWS), "{}", show());
            std::thread::sleep(Duration::from_millis(200));
            offload_count(&t, "refreshed") >= before.1 + 3 * u64::from(FLOWS)
        },
        show,
    );
    assert!(
        counter(&t, "fwd_outbound") - forwarded >= u64::from(FLOWS),
        "XDP did not carry the flows\n{}",
        show()
    );
    let read = offload_count(&t, "events_read") - before.0;
    assert!(
        read < u64::from(FLOWS),
        "{read} events read over {} refreshes\n{}",
        offload_count(&t, "refreshed") - before.1,
        show()
    );
}

/// Events lost while the daemon could not read (stopped here, as a daemon
/// that fell behind): it discards the events still queued, all older than
/// the dump it resynchronises from. A flow whose NEW and reply events were
/// queued and which the owner then marked to stay in the kernel (`conntrack
/// -U --mark`, the update's event lost in the overflow) stays there: from
/// its stale events it was offloaded after the dump had kept it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_events_queued_before_a_loss_are_not_applied_after_the_dump() {
    /// Events enough to overflow the daemon's 16 MiB event socket.
    const FLOOD: u16 = 50_000;
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let _srv = offload_router_with_udp_echo(&t);
    let daemon = Daemon::start(
        &t,
        &["--tick", "1", "--keep-in-kernel-mark", "0x100/0xff00"],
    );
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    daemon.signal(libc::SIGSTOP);
    let udp = udp_client(&t, 42000, sa(SERVER_ADDR, 7000));
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3);
    // The router's own datagrams to as many ports: a NEW event each.
    t.in_ns(Ns::Router, || {
        let s = UdpSocket::bind(sa(Ipv4Addr::UNSPECIFIED, 0)).unwrap();
        for port in 1..=FLOOD {
            if port != 7000 {
                let _ = s.send_to(b"x", sa(SERVER_ADDR, port));
            }
        }
    });
    mark_udp_42000(&t, "0x100");
    daemon.signal(libc::SIGCONT);
    wait_for_or_show(
        "the daemon to resynchronise after the lost events",
        Duration::from_secs(20),
        || offload_count(&t, "events_lost") > 0 && not_offloaded(&t, "kept_by_mark") > 0,
        show,
    );
    // Ticks after the resync: the flow stays the kernel's.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(offloaded_udp_42000(&t).is_none(), "offloaded\n{}", show());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(offload_count(&t, "offloaded"), 0, "{}", show());
    assert!(
        !daemon.log().contains("offloaded Tuple"),
        "offloaded from a stale event\n{}",
        show()
    );
}

/// A connection from the client's namespace (the caller's) to `dst` with
/// one `SHORT_CONN_BYTES` request (bytes of `i`) and its reply.
fn echo_connection(dst: SocketAddr, i: usize) -> std::net::TcpStream {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect_timeout(&dst, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connection {i}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = [u8::try_from(i % 256).unwrap(); SHORT_CONN_BYTES];
    let mut reply = [0u8; SHORT_CONN_BYTES];
    s.write_all(&req).unwrap();
    s.read_exact(&mut reply).unwrap();
    assert_eq!(reply, req, "connection {i}: reply differs");
    s
}

/// Bursts of short connections, one after the other, until `polled` (the
/// daemon's status says it polled for events) or a few bursts: how many.
fn bursts_until_polled(t: &Topology, polled: &dyn Fn() -> bool) -> usize {
    const BURST: usize = 200;
    const MAX_BURSTS: usize = 5;
    const BURST_PORT: u16 = 7700;
    let dst = sa(SERVER_ADDR, BURST_PORT);
    let mut bursts = 0;
    while bursts < MAX_BURSTS && !polled() {
        let srv = request_server(t, dst, BURST, Duration::from_mins(1), AfterReply::Close);
        t.in_ns(Ns::Client, || {
            for i in 0..BURST {
                drop(echo_connection(dst, i));
            }
        });
        assert_eq!(srv.join().unwrap(), BURST);
        bursts += 1;
        // The status is written at each tick (1 s): look at the next few.
        let look_until = Instant::now() + Duration::from_millis(2500);
        while Instant::now() < look_until && !polled() {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    bursts
}

/// The burst of lasting connections, against a daemon started with
/// `daemon_args`: its stats once every connection was offloaded.
fn burst_of_lasting_connections(daemon_args: &[&str]) -> serde_json::Value {
    const CONNECTIONS: usize = 200;
    const SERVER_PORT: u16 = 7600;
    let t = Topology::new();
    install_firewall(&t, Firewall::Nftables);
    let _detach = DetachOnDrop(&t);
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let daemon = Daemon::start(&t, daemon_args);
    let dst = sa(SERVER_ADDR, SERVER_PORT);
    let srv = request_server(
        &t,
        dst,
        CONNECTIONS,
        Duration::from_mins(1),
        AfterReply::HoldUntilClientCloses,
    );
    let conns: Vec<std::net::TcpStream> = t.in_ns(Ns::Client, || {
        (0..CONNECTIONS).map(|i| echo_connection(dst, i)).collect()
    });
    let stats = || {
        let v: serde_json::Value =
            serde_json::from_str(&t.router_ctl_ok(&["stats", "--json"])).unwrap();
        v["daemon"].clone()
    };
    println!("{CONNECTIONS} connections open: daemon {}", stats());
    let server_port = format!(":{SERVER_PORT}");
    let offloaded = || {
        offloaded_rows(&t)
            .iter()
            .filter(|f| {
                f["proto"] == "tcp"
                    && f["orig_dst"]
                        .as_str()
                        .is_some_and(|d| d.ends_with(&server_port))
            })
            .count()
    };
    wait_for_or_show(
        "every connection of the burst to be offloaded",
        Duration::from_secs(10),
        || offloaded() == CONNECTIONS,
        || {
            format!(
                "{} of {CONNECTIONS} offloaded\ndaemon: {}\nlog:\n{}",
                offloaded(),
                stats(),
                daemon.log()
            )
        },
    );
    // The daemon's status file is rewritten at its ticks (every 2 s by
    // default): wait for one written after the last offload.
    wait_for_or_show(
        "the daemon's status to count every offload",
        Duration::from_secs(10),
        || stats()["offload"]["offloaded"].as_u64() >= Some(CONNECTIONS as u64),
        || format!("daemon: {}", stats()),
    );
    let d = stats();
    println!("all offloaded: daemon {d}");
    assert_eq!(d["settling_flows"], 0, "{d}");
    drop(conns);
    assert_eq!(srv.join().unwrap(), CONNECTIONS);
    d
}

/// Who sent and met TCP resets, how lost segments were recovered (loss
/// probes and SYN retransmissions are retransmissions that are neither
/// fast nor timeouts), and what the router's conntrack found invalid.
fn tcp_counters(t: &Topology) -> String {
    const COUNTERS: [&str; 9] = [
        "TcpOutRsts",
        "TcpEstabResets",
        "TcpAttemptFails",
        "TcpExtTCPAbortOnData",
        "TcpExtPAWSEstab",
        "TcpExtTCPChallengeACK",
        "TcpExtTCPLossProbes",
        "TcpExtTCPSynRetrans",
        "TcpExtTCPSpuriousRtxHostQueues",
    ];
    let per_ns = [Ns::Client, Ns::Router, Ns::Server]
        .map(|ns| format!("{}: {}", t.ns_name(ns), t.nstat_line(ns, &COUNTERS)));
    let invalid = t.exec(Ns::Router, &["conntrack", "-S"]);
    format!(
        "{}\nrouter conntrack -S:\n{}",
        per_ns.join("\n"),
        String::from_utf8_lossy(&invalid.stdout)
    )
}

/// `count` connections one after the other from one port, each offloaded
/// before its request: the request and reply go through XDP, the close
/// through the kernel.
fn one_port_in_turn(t: &Topology, count: usize, show: &(dyn Fn(&str) -> String + Sync)) {
    let dst = sa(SERVER_ADDR, SHORT_CONN_SERVER_PORT);
    let port = SHORT_CONN_FIRST_PORT;
    let recovery0 = Recovery::now(t);
    let (out0, in0, control0) = (
        counter(t, "fwd_outbound"),
        counter(t, "fwd_inbound"),
        counter(t, "pass_offload_tcp_control"),
    );
    for i in 0..count {
        let offloaded = || {
            wait_for_or_show(
                &format!("connection {i} to be offloaded"),
                Duration::from_secs(5),
                || {
                    carried_rows(t).iter().any(|f| {
                        f["proto"] == "tcp"
                            && f["orig_src"] == sa(CLIENT_ADDR, port).to_string().as_str()
                    })
                },
                || show("not offloaded"),
            );
        };
        if let Err(e) = t.in_ns(Ns::Client, || short_connection(port, dst, offloaded)) {
            panic!("{}", show(&format!("connection {i}: {e}")));
        }
    }
    let (xdp_out, xdp_in) = (
        counter(t, "fwd_outbound") - out0,
        counter(t, "fwd_inbound") - in0,
    );
    let recovery = Recovery::now(t).since(recovery0);
    let control = counter(t, "pass_offload_tcp_control") - control0;
    println!(
        "{count} connections from one port: XDP {xdp_out} out / {xdp_in} in, \
         {control} control segments passed, {recovery:?}"
    );
    // Each server's FIN met the offloaded entries and went to the kernel.
    assert!(
        control >= count as u64,
        "{}",
        show(&format!(
            "only {control} TCP control segments met XDP entries"
        ))
    );
    // At least each request and each reply went through XDP.
    assert!(
        xdp_out >= count as u64 && xdp_in >= count as u64,
        "{}",
        show(&format!(
            "XDP did not carry the connections: {xdp_out}/{xdp_in}"
        ))
    );
    recovery.assert_no_loss("one port", show);
    // The kernel saw the last connection's whole close: the final ACK
    // takes its entry to TIME_WAIT (RFC 9293 3.6; netfilter's TCP state
    // table), not left in LAST_ACK or CLOSE_WAIT.
    let port = port.to_string();
    wait_for_or_show(
        "the kernel's entry of the last connection to reach TIME_WAIT",
        Duration::from_secs(3),
        || {
            kernel_entries(t, &["-p", "tcp", "--orig-port-src", port.as_str()])
                .iter()
                .any(|e| e.contains("TIME_WAIT"))
        },
        || show("kernel state"),
    );
}

/// Records, in the router namespace, each TCP segment that reaches the
/// router itself without a translation to undo (conntrack found it
/// invalid or had no entry for it): the segments its TCP stack answers
/// with a RST. For a failure message ([`untranslated_arrivals`]); no
/// verdict of its own (an input chain that accepts).
fn record_untranslated_arrivals(t: &Topology) {
    load_nft(
        t.ns_name(Ns::Router),
        "table inet untranslated {
  set seen {
    type ipv4_addr . inet_service . inet_service . tcp_flag . ct_state
    size 1024
    flags dynamic
  }
  chain input {
    type filter hook input priority filter;
    ct state invalid,new,untracked add @seen { ip saddr . tcp sport . tcp dport . tcp flags . ct state }
  }
}
",
    );
}

/// What [`record_untranslated_arrivals`] saw: source address and port,
/// destination port, TCP flags and conntrack state of each.
fn untranslated_arrivals(t: &Topology) -> String {
    let o = t.exec(
        Ns::Router,
        &["nft", "list", "set", "inet", "untranslated", "seen"],
    );
    let listed = String::from_utf8_lossy(&o.stdout);
    listed
        .split_once("elements = {")
        .map_or("none", |(_, e)| e.trim_end_matches(['}', '\n', '\t', ' ']))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// `per_port` connections back to back from each of `ports` ports at once,
/// without waiting for the daemon: the next connection on a port starts
/// while the daemon may still be offloading or ending the previous one.
fn ports_at_once(
    t: &Topology,
    ports: u16,
    per_port: usize,
    show: &(dyn Fn(&str) -> String + Sync),
) {
    let dst = sa(SERVER_ADDR, SHORT_CONN_SERVER_PORT);
    let recovery0 = Recovery::now(t);
    let failed: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (1..=ports)
            .map(|p| {
                let name = t.ns_name(Ns::Client).to_owned();
                s.spawn(move || {
                    tests::netns::enter(&name);
                    // Up to the first failure: the port is stuck after it.
                    (0..per_port)
                        .find_map(|_| short_connection(SHORT_CONN_FIRST_PORT + p, dst, || ()).err())
                        .into_iter()
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let recovery = Recovery::now(t).since(recovery0);
    println!(
        "{} connections from {ports} ports at once: {} failed, {recovery:?}",
        usize::from(ports) * per_port,
        failed.len()
    );
    // The router's own TCP stack answers a segment only when conntrack
    // found it invalid and did not translate it back (it was addressed to
    // the router's WAN address): the kernel missed segments XDP carried.
    let router_resets = t.nstat(Ns::Router, "TcpOutRsts");
    assert!(
        router_resets == 0,
        "{}",
        show(&format!(
            "the router reset {router_resets} segments (failed: {failed:?})"
        ))
    );
    assert!(
        failed.is_empty(),
        "{}",
        show(&format!("failed: {failed:?}"))
    );
    recovery.assert_no_loss("ports at once", show);
}

/// The firewall's `inet filter forward` chain gets, first, a rule that
/// drops UDP to `port`: a block added while flows run.
fn block_udp_port_now(t: &Topology, port: u16) {
    t.exec_ok(
        Ns::Router,
        &[
            "nft",
            &format!("insert rule inet filter forward udp dport {port} counter drop"),
        ],
    );
}

/// Packets the rule of [`block_udp_port_now`] for `port` dropped so far.
fn blocked_udp_packets(t: &Topology, port: u16) -> u64 {
    let chain = t.exec_ok(
        Ns::Router,
        &["nft", "list", "chain", "inet", "filter", "forward"],
    );
    let rule = format!("udp dport {port} counter packets ");
    chain
        .lines()
        .find_map(|l| l.split(rule.as_str()).nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no counted drop rule for UDP port {port}:\n{chain}"))
}

/// The router with the nftables firewall, attached in offload mode (no
/// daemon yet), its neighbours resolved, and a UDP echo on the server's
/// port 7000 (for a minute): the echo's thread.
fn offload_router_with_udp_echo(t: &Topology) -> JoinHandle<()> {
    install_firewall(t, Firewall::Nftables);
    let srv = udp_echo(t, Ns::Server, sa(SERVER_ADDR, 7000), Duration::from_mins(1));
    t.warm_neighbours();
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    srv
}

/// Sets the ct mark of the client's UDP flow from port 42000 to the echo
/// (`conntrack -U` by its whole original tuple: conntrack-tools' update by
/// a filter, `--orig-port-src` alone, fails on a NAT entry, EOPNOTSUPP).
fn mark_udp_42000(t: &Topology, mark: &str) {
    let (client, server) = (CLIENT_ADDR.to_string(), SERVER_ADDR.to_string());
    t.exec_ok(
        Ns::Router,
        &[
            "conntrack",
            "-U",
            "-s",
            &client,
            "-d",
            &server,
            "-p",
            "udp",
            "--sport",
            "42000",
            "--dport",
            "7000",
            "--mark",
            mark,
        ],
    );
}

/// The router with the nftables firewall in offload mode, its daemon, a
/// UDP echo on the server's port 7000 and the client's flow from port
/// 42000 to it, offloaded.
fn with_an_offloaded_udp_flow(t: &Topology) -> (JoinHandle<()>, Daemon, UdpSocket) {
    install_firewall(t, Firewall::Nftables);
    let srv = udp_echo(t, Ns::Server, sa(SERVER_ADDR, 7000), Duration::from_mins(1));
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let daemon = Daemon::start(t, &[]);
    let udp = udp_client(t, 42000, sa(SERVER_ADDR, 7000));
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3);
    wait_for(
        "the UDP flow to be offloaded",
        Duration::from_secs(10),
        || offloaded_udp_42000(t).is_some(),
    );
    (srv, daemon, udp)
}

/// A daemon restarted (SIGKILL) on a router without policy rules takes the
/// flows the fast path carries over as they are: none goes back to the
/// kernel at its first ticks (no mark changes a route there), and XDP
/// goes on carrying them.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_restarted_daemon_takes_the_carried_flows_over_as_they_are() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let (_srv, mut daemon, udp) = with_an_offloaded_udp_flow(&t);
    daemon.kill9();
    let daemon = Daemon::start(&t, &[]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    wait_for_or_show(
        "the restarted daemon to take the carried flow over",
        Duration::from_secs(10),
        || offload_count(&t, "offloaded") == 1,
        show,
    );
    let forwarded = counter(&t, "fwd_outbound");
    // Echoes across a few of the daemon's ticks (one a second).
    assert_eq!(
        echoes(&udp, 30, Duration::from_millis(100)),
        30,
        "{}",
        show()
    );
    assert!(
        counter(&t, "fwd_outbound") - forwarded >= 30,
        "XDP stopped carrying the flow\n{}",
        show()
    );
    let (v, _) = crate::ctl::status(&t);
    let o = &v["daemon"]["offload"];
    let ended: u64 = o
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| k.starts_with("ended_"))
        .map(|(_, n)| n.as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        (ended, o["offloaded"].as_u64(), o["handed_back"].as_u64()),
        (0, Some(1), Some(0)),
        "{}",
        show()
    );
    assert!(offloaded_udp_42000(&t).is_some(), "{}", show());
}

/// The owner blocks a flow (a rule, then `conntrack -D`, as told for
/// offloaded flows) while no daemon runs (a restart, an upgrade): the
/// daemon that starts removes the XDP entries of the connection the kernel
/// no longer has, so the rule drops its next datagrams at once, not only
/// once the lease runs out.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_a_flow_ended_while_no_daemon_ran_leaves_xdp_when_one_starts() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let (_srv, mut daemon, udp) = with_an_offloaded_udp_flow(&t);
    daemon.kill9();
    block_udp_port_now(&t, 7000);
    t.exec_ok(
        Ns::Router,
        &["conntrack", "-D", "-p", "udp", "--orig-port-src", "42000"],
    );
    assert!(
        offloaded_udp_42000(&t).is_some(),
        "carried until a daemon starts"
    );
    let ended = offload_count(&t, "ended_destroyed");
    let daemon = Daemon::start(&t, &[]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    assert!(offloaded_udp_42000(&t).is_none(), "{}", show());
    assert!(
        daemon
            .log()
            .contains("of connections the kernel no longer has"),
        "{}",
        show()
    );
    assert_eq!(
        offload_count(&t, "ended_destroyed"),
        ended + 1,
        "{}",
        show()
    );
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 0, "{}", show());
}

/// The owner marks a flow to stay in the kernel (`--keep-in-kernel-mark`,
/// the mark set on its connection) while no daemon runs: the daemon that
/// starts with the option does not take the connection over and removes
/// its earlier pair at its first tick, so the kernel carries the flow, not
/// XDP until the lease runs out.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_a_flow_kept_in_the_kernel_while_no_daemon_ran_leaves_xdp_when_one_starts() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let (_srv, mut daemon, udp) = with_an_offloaded_udp_flow(&t);
    daemon.kill9();
    mark_udp_42000(&t, "0x100");
    let ended = offload_count(&t, "ended_not_taken_over");
    let daemon = Daemon::start(&t, &["--keep-in-kernel-mark", "0x100/0xff00"]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    wait_for(
        "the earlier daemon's pair to be removed",
        Duration::from_secs(10),
        || offloaded_udp_42000(&t).is_none(),
    );
    assert!(
        daemon.log().contains("that this one does not carry"),
        "{}",
        show()
    );
    assert_eq!(
        offload_count(&t, "ended_not_taken_over"),
        ended + 1,
        "{}",
        show()
    );
    // The kernel carries it, XDP none of its datagrams.
    let forwarded = counter(&t, "fwd_outbound");
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3, "{}", show());
    assert_eq!(counter(&t, "fwd_outbound"), forwarded, "{}", show());
    assert!(offloaded_udp_42000(&t).is_none(), "{}", show());
}

/// A firewall rule added later does not stop a flow already offloaded (as
/// with `nf_flowtable`): its packets do not reach the firewall. Ending the
/// flow in the kernel's conntrack (`conntrack -D`) does: the daemon ends
/// the offload, and the kernel judges the next packet as a new flow.
/// `router-ctl conntrack flush` is not enough: the kernel still has the
/// flow established, and the daemon offloads it again from its resync.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_a_rule_added_later_stops_an_offloaded_flow_once_the_kernel_ends_it() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let (_srv, _daemon, udp) = with_an_offloaded_udp_flow(&t);
    block_udp_port_now(&t, 7000);
    assert_eq!(
        echoes(&udp, 3, Duration::from_millis(100)),
        3,
        "the offloaded flow met the rule added later"
    );

    // Off XDP for a moment only: offloaded again, past the rule.
    t.router_ctl_ok(&["conntrack", "flush"]);
    wait_for(
        "the flushed flow to be offloaded again",
        Duration::from_secs(10),
        || {
            let _ = echoes(&udp, 1, Duration::ZERO);
            offloaded_udp_42000(&t).is_some()
        },
    );
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3);

    // Ended in the kernel: off XDP for good once the daemon has its
    // destroy event (a packet racing that moment may still pass), and the
    // rule drops it.
    t.exec_ok(
        Ns::Router,
        &["conntrack", "-D", "-p", "udp", "--orig-port-src", "42000"],
    );
    wait_for(
        "the daemon to end the offload of the destroyed flow",
        Duration::from_secs(10),
        || offloaded_udp_42000(&t).is_none(),
    );
    let dropped_before = blocked_udp_packets(&t, 7000);
    let mut got = Vec::new();
    for _ in 0..6 {
        got.push(echoes(&udp, 2, Duration::from_millis(250)));
    }
    assert!(got.iter().all(|&n| n == 0), "echoes per second: {got:?}");
    // The rule is what stopped them: it dropped every one sent.
    let dropped = blocked_udp_packets(&t, 7000) - dropped_before;
    assert!(
        dropped >= 12,
        "the rule dropped {dropped} of the 12 datagrams"
    );
    assert!(offloaded_udp_42000(&t).is_none(), "offloaded again");
}

/// A standalone router switched to offload mode in place: the flows XDP
/// admitted itself stay on the fast path (it carries every hit of its
/// table), past the firewall now in charge. The switch says so, with the
/// count and `router-ctl conntrack flush`, and `status` lists it until the
/// flush ends them; then the firewall decides on their packets.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_switch_to_offload_mode_tells_of_the_flows_xdp_admitted() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let _srv = udp_echo(
        &t,
        Ns::Server,
        sa(SERVER_ADDR, 7000),
        Duration::from_mins(1),
    );
    crate::ctl::attach(&t, &[]);
    let udp = udp_client(&t, 42000, sa(SERVER_ADDR, 7000));
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3);
    install_firewall(&t, Firewall::Nftables);
    block_udp_port_now(&t, 7000);

    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let err = crate::ctl::stderr(&o);
    assert!(o.status.success(), "{err}");
    let told = "1 flow(s) that XDP admitted itself in standalone mode stay on the fast path";
    assert!(
        err.contains(told) && err.contains("router-ctl conntrack flush"),
        "{err}"
    );
    // As told: the blocked flow still passes, and status says why.
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3);
    let problems = |t: &Topology| crate::ctl::status(t).0["problems"].to_string();
    assert!(problems(&t).contains(told), "{}", problems(&t));

    t.router_ctl_ok(&["conntrack", "flush"]);
    assert_eq!(
        echoes(&udp, 3, Duration::from_millis(100)),
        0,
        "the firewall's drop rule was bypassed after the flush"
    );
    assert!(!problems(&t).contains("XDP admitted"), "{}", problems(&t));
}

/// Packets received on interface `dev` of namespace `ns`.
fn rx_packets(t: &Topology, ns: Ns, dev: &str) -> u64 {
    let out = t.exec_ok(ns, &["ip", "-s", "-j", "link", "show", dev]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j");
    v[0]["stats64"]["rx"]["packets"]
        .as_u64()
        .unwrap_or_else(|| panic!("no rx packets of {dev}: {out}"))
}

/// A second way from the router to the server: `vpn0` (10.8.0.1/30) to
/// the server's `vpn1` (10.8.0.2/30), a tunnel or second uplink that is
/// not attached. It carries only what the router forwards into it (what
/// the tests count there): no IPv6 on either end (router solicitations,
/// MLD) and permanent neighbours (no ARP probe of either end, as one
/// ~5 s after the first exchange).
fn tunnel_to_server(t: &Topology) {
    const ROUTER_END: &str = "02:00:0a:08:00:01";
    const SERVER_END: &str = "02:00:0a:08:00:02";
    let server = t.ns_name(Ns::Server).to_owned();
    t.exec_line_ok(
        Ns::Router,
        &format!(
            "ip link add vpn0 address {ROUTER_END} type veth peer name vpn1 address \
             {SERVER_END} netns {server}"
        ),
    );
    for (ns, dev) in [(Ns::Router, "vpn0"), (Ns::Server, "vpn1")] {
        t.exec_ok(
            ns,
            &[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{dev}.disable_ipv6=1"),
            ],
        );
    }
    for (ns, cmd) in [
        (Ns::Router, "addr add 10.8.0.1/30 dev vpn0".to_owned()),
        (
            Ns::Router,
            format!("neigh replace 10.8.0.2 lladdr {SERVER_END} dev vpn0 nud permanent"),
        ),
        (Ns::Router, "link set vpn0 up".to_owned()),
        (Ns::Server, "addr add 10.8.0.2/30 dev vpn1".to_owned()),
        (
            Ns::Server,
            format!("neigh replace 10.8.0.1 lladdr {ROUTER_END} dev vpn1 nud permanent"),
        ),
        (Ns::Server, "link set vpn1 up".to_owned()),
    ] {
        t.exec_line_ok(ns, &format!("ip {cmd}"));
    }
}

/// A firewall that marks connections with the mangle-priority
/// `prerouting` rules `marking` (a ct mark set on new ones, copied into the
/// packets before routing), accepts established ones and new ones from the
/// LAN, and masquerades on the WAN and on `vpn0`.
fn marking_firewall(t: &Topology, marking: &str) {
    load_nft(
        t.ns_name(Ns::Router),
        &format!(
            "table inet fw {{
  chain prerouting {{
    type filter hook prerouting priority mangle; policy accept;
    {marking}
  }}
  chain forward {{
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname \"{LAN_IF}\" accept
  }}
}}
table ip nat {{
  chain postrouting {{
    type nat hook postrouting priority srcnat;
    oifname {{ \"{WAN_IF}\", \"vpn0\" }} masquerade
  }}
}}"
        ),
    );
}

/// Policy routing by the connection's mark (multi-WAN or VPN split
/// routing as mwan3 and pbr set it up: a new LAN connection to one port
/// gets a ct mark, its packets the mark, a rule routes the mark through a
/// second uplink here called `vpn0`, not attached): the kernel sends that
/// flow out of `vpn0`, so the daemon leaves it there (`policy_route`)
/// instead of handing it to a fast path that would send it out of the WAN
/// (the main table's way, with the tunnel's NAT address); every datagram
/// keeps arriving at the far end through the tunnel. A flow the rules do
/// not select is offloaded as ever; a rule added later that selects it by
/// port (which the data path's FIB lookup does not see) takes it off the
/// fast path at the daemon's next look (`ended_rerouted`).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_leaves_a_flow_policy_routed_elsewhere_to_the_kernel() {
    const N: u32 = 30;
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    tunnel_by_mark(&t, "1");
    marking_firewall(
        &t,
        &format!(
            "iifname \"{LAN_IF}\" udp dport 7000 ct state new ct mark set 1
    iifname \"{LAN_IF}\" meta mark set ct mark"
        ),
    );
    let _srv = udp_echo(
        &t,
        Ns::Server,
        sa(SERVER_ADDR, 7000),
        Duration::from_mins(1),
    );
    let _srv2 = udp_echo(
        &t,
        Ns::Server,
        sa(SERVER_ADDR, 7001),
        Duration::from_mins(1),
    );
    t.warm_neighbours();
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let daemon = Daemon::start(&t, &[]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());

    let marked = udp_client(&t, 42000, sa(SERVER_ADDR, 7000));
    let tunnel0 = rx_packets(&t, Ns::Server, "vpn1");
    assert_eq!(echoes(&marked, 3, Duration::from_millis(100)), 3);
    wait_for_or_show(
        "the daemon to leave the marked flow to the kernel",
        Duration::from_secs(10),
        || {
            let _ = echoes(&marked, 1, Duration::ZERO);
            not_offloaded(&t, "policy_route") > 0
        },
        show,
    );
    let before = rx_packets(&t, Ns::Server, "vpn1");
    assert_eq!(echoes(&marked, N, Duration::from_millis(20)), N);
    let through_tunnel = rx_packets(&t, Ns::Server, "vpn1") - before;
    assert!(
        through_tunnel >= u64::from(N),
        "{through_tunnel} of {N} datagrams came through the tunnel (before the daemon: {})",
        before - tunnel0
    );
    assert!(offloaded_rows(&t).is_empty(), "{:?}", offloaded_rows(&t));

    // Not selected: offloaded under the same rules.
    let plain = udp_client(&t, 42001, sa(SERVER_ADDR, 7001));
    assert_eq!(echoes(&plain, 3, Duration::from_millis(100)), 3);
    wait_for_or_show(
        "the flow the rules do not select to be offloaded",
        Duration::from_secs(10),
        || {
            let _ = echoes(&plain, 1, Duration::ZERO);
            offloaded_rows(&t).len() == 1
        },
        show,
    );
    // A rule by port, added now: the kernel routes the flow through the
    // tunnel; the data path's lookup has no ports, so only the daemon's
    // new look at the offloaded flows takes it back.
    t.exec_ok(
        Ns::Router,
        &[
            "ip", "rule", "add", "ipproto", "udp", "dport", "7001", "lookup", "100", "pref", "90",
        ],
    );
    wait_for_or_show(
        "the daemon to take the flow back after the new rule",
        Duration::from_secs(10),
        || offload_count(&t, "ended_rerouted") == 1 && offloaded_rows(&t).is_empty(),
        show,
    );
    // The route changed under the flow: its first datagram may be lost
    // while the kernel resolves the tunnel's next hop.
    let before = rx_packets(&t, Ns::Server, "vpn1");
    let answered = echoes(&plain, N, Duration::from_millis(20));
    assert!(
        answered >= N - 2,
        "{answered} of {N} answered after the new rule"
    );
    let through_tunnel = rx_packets(&t, Ns::Server, "vpn1") - before;
    assert!(
        through_tunnel >= u64::from(answered),
        "{through_tunnel} of the {answered} answered datagrams came through the tunnel after the \
         new rule"
    );
}

/// Policy routing by the connection's mark that sends a connection out of
/// the attached WAN while the main table sends its destination elsewhere
/// (pbr-style VPN bypass: the server's address is routed through `vpn0`,
/// not attached, and a ct mark given to new LAN connections to one port
/// selects a table whose routes go out of the WAN and back to the LAN):
/// the daemon offloads the marked connection with its mark, and the data
/// path's FIB lookups carry it (`BPF_FIB_LOOKUP_MARK`), so XDP forwards
/// the datagrams out of the WAN, where the kernel sends them, none through
/// the tunnel. The ct mark carries a class in its low bits that the
/// restore leaves out (`and 0xff00`): `run --route-mark-mask 0xff00` says
/// so (with the whole mark, 0x101, no rule matches: `policy_route`).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_carries_a_flow_routed_by_its_mark_with_the_mark() {
    const N: u32 = 30;
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    vpn_bypass_by_mark(&t);
    marking_firewall(
        &t,
        &format!(
            "iifname \"{LAN_IF}\" udp dport 7000 ct state new ct mark set 0x100
    iifname \"{LAN_IF}\" ct state new ct mark set ct mark or 0x1
    meta mark set ct mark and 0xff00"
        ),
    );
    let (_srv, daemon, marked) = udp_flow_under_a_daemon(&t, &["--route-mark-mask", "0xff00"]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    wait_for_or_show(
        "the daemon to offload the flow routed by its mark",
        Duration::from_secs(10),
        || {
            let _ = echoes(&marked, 1, Duration::ZERO);
            offloaded_rows(&t).len() == 1
        },
        show,
    );
    carried_out_of_the_wan_by_xdp(&t, &marked, N, show);
    assert_eq!(not_offloaded(&t, "policy_route"), 0, "{}", show());
}

/// Policy routing by a mark a rule sets on each packet, with no ct mark
/// (`OpenWrt` pbr's and many hand-written rulesets' way: `meta mark set 1`
/// for one port, `ip rule fwmark 1` through `vpn0`, not attached): the
/// daemon sees no mark on the connection, and the routing rules alone
/// would have it go out of the WAN; the egress witness never saw its
/// packets leave an attached interface, so the daemon leaves it to the
/// kernel (`route_unseen`) and every datagram keeps going through the
/// tunnel instead of out of the WAN with the tunnel's address.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_leaves_a_flow_a_mark_on_each_packet_routes_elsewhere_to_the_kernel() {
    const N: u32 = 30;
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    tunnel_by_mark(&t, "1");
    marking_firewall(
        &t,
        &format!("iifname \"{LAN_IF}\" udp dport 7000 meta mark set 1"),
    );
    let (_srv, daemon, marked) = udp_flow_under_a_daemon(&t, &[]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    stays_in_the_kernel_through_the_tunnel(&t, &marked, N, show);
}

/// Policy routing by a mark set on each packet that sends a connection
/// out of the WAN while the main table sends its destination into `vpn0`
/// (a VPN bypass for one port, no ct mark): the daemon routes the
/// connection with the mark its packets left with, as the egress witness
/// saw it, checks they went to the next hop the fast path's lookup with
/// that mark gives, and offloads it with the mark; XDP forwards every
/// datagram out of the WAN, none into the tunnel.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_carries_a_flow_routed_by_a_mark_on_each_packet_with_that_mark() {
    const N: u32 = 30;
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    vpn_bypass_by_mark(&t);
    marking_firewall(
        &t,
        &format!("iifname \"{LAN_IF}\" udp dport 7000 meta mark set 0x100"),
    );
    let (_srv, daemon, marked) = udp_flow_under_a_daemon(&t, &[]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    wait_for_or_show(
        "the daemon to offload the flow routed by the packets' mark",
        Duration::from_secs(15),
        || {
            let _ = echoes(&marked, 1, Duration::from_millis(100));
            offloaded_rows(&t).len() == 1
        },
        show,
    );
    carried_out_of_the_wan_by_xdp(&t, &marked, N, show);
    // A daemon restarted (killed): the new witness sees none of the flow's
    // packets (XDP carries them). The new daemon takes the flow over with
    // the mark its entries carry, hands it back once for its witness to
    // see the kernel route it (the rules did not change: not rerouted),
    // and carries it again, with that mark.
    let mut daemon = daemon;
    daemon.kill9();
    let daemon = Daemon::start(&t, &[]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    wait_for_or_show(
        "the restarted daemon to take the carried flow over, then have it witnessed",
        Duration::from_secs(20),
        || {
            let _ = echoes(&marked, 1, Duration::from_millis(100));
            offload_count(&t, "ended_unwitnessed") == 1 && offload_count(&t, "offloaded") == 2
        },
        show,
    );
    assert_eq!(offload_count(&t, "ended_rerouted"), 0, "{}", show());
    assert_eq!(not_offloaded(&t, "route_unseen"), 0, "{}", show());
    carried_out_of_the_wan_by_xdp(&t, &marked, N, show);
    // A new flow: decided with the new daemon's witness, attached for it.
    let second = udp_client(&t, 42001, sa(SERVER_ADDR, 7000));
    wait_for_or_show(
        "the restarted daemon to offload a new flow",
        Duration::from_secs(15),
        || {
            let _ = echoes(&second, 1, Duration::from_millis(100));
            offload_count(&t, "offloaded") == 3
        },
        show,
    );
    // The witness is the daemon's: on both interfaces while it follows an
    // attached router, gone from them after a detach.
    assert_eq!(witnesses(&t), 2, "{}", show());
    wait_for_or_show(
        "the daemon's status to say its witness is attached",
        Duration::from_secs(10),
        || crate::ctl::status(&t).0["daemon"]["egress_witness"] == "attached",
        show,
    );
    t.router_ctl_ok(&["detach"]);
    wait_for_or_show(
        "the daemon to take its egress witness off the interfaces",
        Duration::from_secs(10),
        || witnesses(&t) == 0,
        show,
    );
}

/// A port forward from the WAN to a LAN host whose own packets a rule
/// marks (`meta mark set`, by source: "this host through the VPN"), and
/// the mark routes into `vpn0` (not attached): the kernel sends the
/// forward's replies through the tunnel. The original direction leaves
/// by the LAN as the fast path would send it; the replies are never seen
/// leaving an attached interface, so the daemon leaves the connection to
/// the kernel (`route_unseen`) and every reply keeps going through the
/// tunnel, none out of the WAN.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_leaves_a_port_forward_whose_replies_a_mark_routes_elsewhere_to_the_kernel() {
    const N: u32 = 20;
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    tunnel_by_mark(&t, "0x100");
    load_nft(
        t.ns_name(Ns::Router),
        &format!(
            "table inet fw {{
  chain prerouting {{
    type filter hook prerouting priority mangle; policy accept;
    iifname \"{LAN_IF}\" ip saddr {CLIENT_ADDR} meta mark set 0x100
  }}
  chain forward {{
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    ct status dnat accept
    iifname \"{LAN_IF}\" accept
  }}
}}
table ip nat {{
  chain prerouting {{
    type nat hook prerouting priority dstnat;
    iifname \"{WAN_IF}\" udp dport 8080 dnat to {CLIENT_ADDR}:7000
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat;
    oifname {{ \"{WAN_IF}\", \"vpn0\" }} masquerade
  }}
}}"
        ),
    );
    let _lan_server = udp_echo(
        &t,
        Ns::Client,
        sa(CLIENT_ADDR, 7000),
        Duration::from_mins(1),
    );
    t.warm_neighbours();
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let daemon = Daemon::start(&t, &[]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    let peer = t.in_ns(Ns::Server, || {
        let s = UdpSocket::bind(sa(Ipv4Addr::UNSPECIFIED, 43000)).unwrap();
        s.connect(sa(ROUTER_WAN_ADDR, 8080)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        s
    });
    assert_eq!(echoes(&peer, 3, Duration::from_millis(100)), 3);
    stays_in_the_kernel_through_the_tunnel(&t, &peer, N, show);
}

/// Waits for the daemon to leave the flow of `sock` to the kernel for
/// want of the witness's evidence (`route_unseen`), then checks that `n`
/// more datagrams are all answered, each through the tunnel (`vpn1` at the
/// server) and none out of the WAN by XDP, with nothing offloaded.
fn stays_in_the_kernel_through_the_tunnel(
    t: &Topology,
    sock: &UdpSocket,
    n: u32,
    show: impl Fn() -> String,
) {
    wait_for_or_show(
        "the daemon to leave the flow to the kernel",
        Duration::from_secs(15),
        || {
            let _ = echoes(sock, 1, Duration::from_millis(100));
            not_offloaded(t, "route_unseen") > 0
        },
        &show,
    );
    let (tunnel, wan) = (
        rx_packets(t, Ns::Server, "vpn1"),
        rx_packets(t, Ns::Server, HOST_IF),
    );
    assert_eq!(echoes(sock, n, Duration::from_millis(20)), n);
    let through_tunnel = rx_packets(t, Ns::Server, "vpn1") - tunnel;
    assert!(
        through_tunnel >= u64::from(n),
        "{through_tunnel} of {n} came through the tunnel, {} by the WAN\n{}",
        rx_packets(t, Ns::Server, HOST_IF) - wan,
        show()
    );
    assert!(offloaded_rows(t).is_empty(), "{:?}", offloaded_rows(t));
}

/// On how many of the router's two interfaces the daemon's egress witness
/// (a tcx program on egress) is attached.
fn witnesses(t: &Topology) -> usize {
    [LAN_IF, WAN_IF]
        .iter()
        .filter(|dev| {
            t.in_ns(Ns::Router, || {
                aya::programs::SchedClassifier::query_tcx(dev, aya::programs::TcAttachType::Egress)
                    .is_ok_and(|(_, progs)| {
                        progs
                            .iter()
                            .any(|p| p.name_as_str() == Some("egress_witness"))
                    })
            })
        })
        .count()
}

/// Sends `n` datagrams on `sock` and checks each is answered, forwarded
/// by XDP out of the WAN (`fwd_outbound`, the server's WAN interface),
/// none through the tunnel (`vpn1` at the server).
fn carried_out_of_the_wan_by_xdp(
    t: &Topology,
    sock: &UdpSocket,
    n: u32,
    show: impl Fn() -> String,
) {
    let (tunnel, wan) = (
        rx_packets(t, Ns::Server, "vpn1"),
        rx_packets(t, Ns::Server, HOST_IF),
    );
    let forwarded = counter(t, "fwd_outbound");
    assert_eq!(echoes(sock, n, Duration::from_millis(20)), n, "{}", show());
    let forwarded = counter(t, "fwd_outbound") - forwarded;
    assert!(
        forwarded >= u64::from(n),
        "XDP forwarded {forwarded} of the {n} datagrams to the server\n{}",
        show()
    );
    assert_eq!(
        rx_packets(t, Ns::Server, "vpn1"),
        tunnel,
        "through the tunnel"
    );
    assert!(rx_packets(t, Ns::Server, HOST_IF) - wan >= u64::from(n));
}

/// The tunnel to the server and table 100, which packets with routing
/// mark `mark` look up, sending everything into it.
fn tunnel_by_mark(t: &Topology, mark: &str) {
    tunnel_to_server(t);
    for cmd in [
        "route add default via 10.8.0.2 dev vpn0 table 100".to_owned(),
        format!("rule add fwmark {mark} lookup 100 pref 100"),
    ] {
        t.exec_line_ok(Ns::Router, &format!("ip {cmd}"));
    }
}

/// A VPN bypass by mark: the main table sends the server's address into
/// `vpn0`, table 100, which mark 0x100 selects, out of the WAN (and back
/// to the LAN).
fn vpn_bypass_by_mark(t: &Topology) {
    tunnel_to_server(t);
    for cmd in [
        format!("route add {SERVER_ADDR}/32 via 10.8.0.2 dev vpn0"),
        format!("route add {} dev {WAN_IF} table 100", net24(SERVER_ADDR)),
        format!("route add {} dev {LAN_IF} table 100", net24(CLIENT_ADDR)),
        "rule add fwmark 0x100 lookup 100 pref 100".to_owned(),
    ] {
        t.exec_line_ok(Ns::Router, &format!("ip {cmd}"));
    }
}

/// The server's UDP echo on port 7000, the router attached in offload
/// mode with a daemon run with `daemon_args`, and a client's flow from
/// port 42000 to the echo, answered three times (by the kernel): the
/// echo's thread, the daemon and the client's socket.
fn udp_flow_under_a_daemon(
    t: &Topology,
    daemon_args: &[&str],
) -> (JoinHandle<()>, Daemon, UdpSocket) {
    let srv = udp_echo(t, Ns::Server, sa(SERVER_ADDR, 7000), Duration::from_mins(1));
    t.warm_neighbours();
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let daemon = Daemon::start(t, daemon_args);
    let flow = udp_client(t, 42000, sa(SERVER_ADDR, 7000));
    assert_eq!(echoes(&flow, 3, Duration::from_millis(100)), 3);
    (srv, daemon, flow)
}

/// The /24 network of `a`.
fn net24(a: Ipv4Addr) -> String {
    let [x, y, z, _] = a.octets();
    format!("{x}.{y}.{z}.0/24")
}

/// An `IPsec` policy added while a flow is offloaded (a tunnel brought up
/// for the server's address): the daemon ends the offload at its next
/// look (`ended_ipsec`), so the kernel applies the policy (here, with no
/// security association, it holds the packets) instead of the fast path
/// sending them in clear; doctor warns of the policy.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_ends_a_flow_an_ipsec_policy_now_covers() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let (_srv, daemon, udp) = with_an_offloaded_udp_flow(&t);
    let (client, server) = (format!("{CLIENT_ADDR}/32"), format!("{SERVER_ADDR}/32"));
    t.exec_ok(
        Ns::Router,
        &[
            "ip",
            "xfrm",
            "policy",
            "add",
            "src",
            &client,
            "dst",
            &server,
            "dir",
            "out",
            "tmpl",
            "src",
            "203.0.113.1",
            "dst",
            "203.0.113.2",
            "proto",
            "esp",
            "mode",
            "tunnel",
        ],
    );
    wait_for_or_show(
        "the daemon to end the offload",
        Duration::from_secs(10),
        || offload_count(&t, "ended_ipsec") == 1 && offloaded_udp_42000(&t).is_none(),
        || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log()),
    );
    let out0 = counter(&t, "fwd_outbound");
    assert_eq!(
        echoes(&udp, 5, Duration::from_millis(50)),
        0,
        "datagrams got through past the policy"
    );
    assert_eq!(counter(&t, "fwd_outbound"), out0, "the fast path sent some");
    let d = t.router_ctl(&["doctor", LAN_IF, WAN_IF]);
    let out = String::from_utf8_lossy(&d.stdout);
    assert!(out.contains("1 IPsec policies"), "{out}");
    // The daemon runs: no warning that none does.
    assert!(!out.contains("no `router-ctl run` is running"), "{out}");
    t.exec_ok(Ns::Router, &["ip", "xfrm", "policy", "flush"]);
}

/// `run --keep-in-kernel-mark`: connections the firewall marks on their
/// first packet stay in the kernel, so its rules on established packets
/// keep acting on them (here a quota, which an offloaded flow would skip),
/// while other connections are offloaded as ever.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_keeps_connections_with_the_kept_mark_in_the_kernel() {
    const N: u32 = 40;
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    load_nft(
        t.ns_name(Ns::Router),
        &format!(
            "table inet fw {{
  chain prerouting {{
    type filter hook prerouting priority mangle; policy accept;
    iifname \"{LAN_IF}\" udp dport 7000 ct state new ct mark set 0x100
  }}
  chain forward {{
    type filter hook forward priority 0; policy drop;
    ct mark 0x100 udp dport 7000 quota over 1000 bytes drop
    ct state established,related accept
    iifname \"{LAN_IF}\" accept
  }}
}}
table ip nat {{
  chain postrouting {{
    type nat hook postrouting priority srcnat;
    oifname \"{WAN_IF}\" masquerade
  }}
}}"
        ),
    );
    let _srv = udp_echo(
        &t,
        Ns::Server,
        sa(SERVER_ADDR, 7000),
        Duration::from_mins(1),
    );
    let _srv2 = udp_echo(
        &t,
        Ns::Server,
        sa(SERVER_ADDR, 7001),
        Duration::from_mins(1),
    );
    t.warm_neighbours();
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let daemon = Daemon::start(&t, &["--keep-in-kernel-mark", "0x100/0xff00"]);
    let quota = udp_client(&t, 42000, sa(SERVER_ADDR, 7000));
    assert_eq!(echoes(&quota, 3, Duration::from_millis(100)), 3);
    wait_for_or_show(
        "the daemon to keep the marked flow in the kernel",
        Duration::from_secs(10),
        || not_offloaded(&t, "kept_by_mark") > 0,
        || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log()),
    );
    // The quota (1000 bytes of the flow's datagrams to the server) ends it.
    let answered = echoes(&quota, N, Duration::from_millis(10));
    assert!(
        answered < N,
        "the quota did not act: {answered} of {N} answered"
    );
    assert!(
        offloaded_rows(&t).is_empty(),
        "the marked flow was offloaded: {:?}",
        offloaded_rows(&t)
    );
    let plain = udp_client(&t, 42001, sa(SERVER_ADDR, 7001));
    assert_eq!(echoes(&plain, 3, Duration::from_millis(100)), 3);
    wait_for(
        "the unmarked flow to be offloaded",
        Duration::from_secs(10),
        || {
            let _ = echoes(&plain, 1, Duration::ZERO);
            offloaded_rows(&t).len() == 1
        },
    );
    // Offload mode reads the option: nothing said of it.
    assert!(!daemon.log().contains(MARKS_UNUSED), "{}", daemon.log());
}

/// What the daemon says of the mark options on a standalone router.
const MARKS_UNUSED: &str = "are read in offload mode only";

/// The mark options are offload mode's: the daemon of a standalone router
/// started with them says they do nothing there.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn mark_options_on_a_standalone_router_are_said_to_do_nothing() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let daemon = Daemon::start(&t, &["--route-mark-mask", "0xff"]);
    wait_for("the daemon's warning", Duration::from_secs(10), || {
        daemon.log().contains(MARKS_UNUSED)
    });
}

/// Conntrack zones (`ct zone set`, set on both sides' packets, and one
/// direction's only: `ct original zone set`, `ct reply zone set`, which
/// ctnetlink reports inside that direction's tuple) keep their
/// connections in the kernel, counted `zone`: the daemon's lookups and
/// updates by tuple would not find them (they carry no zone), and the fast
/// path has none.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_leaves_zoned_connections_to_the_kernel() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    install_firewall(&t, Firewall::Nftables);
    load_nft(
        t.ns_name(Ns::Router),
        &format!(
            "table inet zones {{
  chain prerouting {{
    type filter hook prerouting priority raw; policy accept;
    iifname \"{LAN_IF}\" udp dport 7000 ct zone set 7
    iifname \"{WAN_IF}\" udp sport 7000 ct zone set 7
    iifname \"{LAN_IF}\" udp dport 7001 ct original zone set 7
    iifname \"{LAN_IF}\" udp dport 7002 ct reply zone set 7
    iifname \"{WAN_IF}\" udp sport 7002 ct zone set 7
  }}
}}"
        ),
    );
    let ports = [7000, 7001, 7002];
    let _servers: Vec<_> = ports
        .iter()
        .map(|&p| udp_echo(&t, Ns::Server, sa(SERVER_ADDR, p), Duration::from_mins(1)))
        .collect();
    t.warm_neighbours();
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let daemon = Daemon::start(&t, &[]);
    let show = || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log());
    // One at a time: each zoned connection is counted `zone` itself (the
    // count is per event, so a wait for the total could be met by one).
    let settled_count = || {
        let mut last = not_offloaded(&t, "zone");
        for _ in 0..10 {
            std::thread::sleep(Duration::from_millis(500));
            let now = not_offloaded(&t, "zone");
            if now == last {
                break;
            }
            last = now;
        }
        last
    };
    let mut clients = Vec::new();
    for (p, sport) in ports.into_iter().zip(42000..) {
        let before = settled_count();
        let c = udp_client(&t, sport, sa(SERVER_ADDR, p));
        assert_eq!(
            echoes(&c, 3, Duration::from_millis(100)),
            3,
            "{p}: {}",
            show()
        );
        wait_for_or_show(
            &format!("the daemon to leave the zoned flow to {p} to the kernel"),
            Duration::from_secs(10),
            || not_offloaded(&t, "zone") > before,
            show,
        );
        clients.push((c, p));
    }
    for (c, p) in &clients {
        assert_eq!(
            echoes(c, 3, Duration::from_millis(100)),
            3,
            "{p}: {}",
            show()
        );
    }
    assert!(offloaded_rows(&t).is_empty(), "{:?}", offloaded_rows(&t));
}
