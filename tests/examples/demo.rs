//! `cargo xtask demo`: build a client -- router -- server topology (no route
//! back from the server, so only NAT makes it work), run the same traffic
//! through the kernel path (forwarding + iptables MASQUERADE), through the
//! XDP NAT in standalone mode, and in offload mode (an nftables firewall
//! and NAT admit the flow, `router-ctl run` moves it to XDP), and show what
//! each did. Needs root; everything happens in namespaces this program
//! creates and deletes.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use tests::{
    LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF, counter_of, router_ctl_bin,
};

/// The router's own firewall and NAT for the offload step: forward policy
/// drop, LAN -> WAN and established allowed, masquerade.
const FIREWALL: &str = "table inet demo_fw {
  chain forward {
    type filter hook forward priority 0; policy drop;
    ct state established,related accept
    iifname \"lan0\" oifname \"wan0\" accept
  }
  chain postrouting {
    type nat hook postrouting priority srcnat;
    oifname \"wan0\" masquerade
  }
}
";

/// `router-ctl run` in the router namespace, stopped on drop.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Packets the fast path forwarded between two `stats --json` readings.
fn fast_path_packets(before: &serde_json::Value, after: &serde_json::Value) -> u64 {
    counter_of(after, "fwd_outbound") + counter_of(after, "fwd_inbound")
        - counter_of(before, "fwd_outbound")
        - counter_of(before, "fwd_inbound")
}

/// Seconds of each iperf run: `--secs N` (default 3; `cargo xtask test`
/// runs the walk-through with 1 as a check that it still works).
fn secs() -> u32 {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => 3,
        [flag, n] if flag == "--secs" => n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("--secs takes a whole number of seconds, not {n:?}")),
        _ => panic!("usage: demo [--secs N] (got {args:?})"),
    }
}

/// Busy CPU time of the whole machine in clock ticks (user+nice+system+
/// irq+softirq) and the softirq part, from /proc/stat.
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let line = stat.lines().next().expect("cpu line");
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    (v[0] + v[1] + v[2] + v[5] + v[6], v[6])
}

/// Waits (at most 10 s, then panics) until `ready` holds.
fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "waited 10 s for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Run {
    secs: u32,
    gbps: f64,
    softirq_ticks: u64,
    server_saw: String,
}

/// One iperf2 TCP run from client to server; returns throughput and the
/// peer address the server reported.
fn iperf(t: &Topology, extra: &[&str]) -> Run {
    // In a fresh directory of its own: the server's report is written by
    // a root shell redirect, which would follow a link another user left.
    let dir = tests::Scratch::new("demo-iperf");
    let log = dir.path("server.csv");
    let server_cmd = format!("exec iperf -s -p 5001 -y C > {}", log.display());
    let mut server = t.spawn(Ns::Server, &["sh", "-c", &server_cmd]);
    wait_until("the iperf server to listen", || {
        t.exec_ok(Ns::Server, &["ss", "-ltn"]).contains(":5001")
    });
    let run_secs = secs();
    let secs = run_secs.to_string();
    let dst = SERVER_ADDR.to_string();
    let mut args = vec![
        "timeout", "-k", "5", "20", "iperf", "-c", &dst, "-p", "5001",
    ];
    args.extend_from_slice(&["-t", &secs, "-y", "C"]);
    args.extend_from_slice(extra);
    let (_, soft0) = cpu_ticks();
    let out = t.exec_ok(Ns::Client, &args);
    let (_, soft1) = cpu_ticks();
    // The server writes its report line once it has seen the end.
    wait_until("the iperf server's report", || {
        std::fs::read_to_string(&log)
            .is_ok_and(|l| l.lines().next().is_some_and(|l| l.contains(',')))
    });
    let _ = server.kill();
    let _ = server.wait();
    // Client CSV: time,src,sport,dst,dport,id,interval,bytes,bits_per_second;
    // the server's line starts time,peer,peer_port.
    let last = out.lines().last().unwrap_or_default();
    let bps: f64 = last
        .rsplit(',')
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or(0.0);
    let server_log = std::fs::read_to_string(&log).unwrap_or_default();
    let server_saw = server_log
        .lines()
        .next()
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.len() > 4)
        .map_or_else(|| "?".to_owned(), |f| format!("{}:{}", f[1], f[2]));
    Run {
        secs: run_secs,
        gbps: bps / 1e9,
        softirq_ticks: soft1 - soft0,
        server_saw,
    }
}

impl Run {
    /// Panics unless the run carried data and the server saw the router's
    /// WAN address (the flow was masqueraded).
    fn check(&self, path: &str) {
        assert!(self.gbps > 0.0, "{path}: iperf carried nothing");
        assert!(
            self.server_saw.starts_with(&format!("{ROUTER_WAN_ADDR}:")),
            "{path}: the server saw {}, not the router's WAN address {ROUTER_WAN_ADDR}",
            self.server_saw
        );
    }
}

/// One path's figures: the iperf run and the packets the kernel forwarded.
struct PathRun {
    run: Run,
    kernel_pkts: u64,
}

/// The kernel path: forwarding + iptables MASQUERADE. Leaves no NAT rules.
fn kernel_path(t: &Topology) -> PathRun {
    println!("\n== kernel path: ip_forward=1 + iptables MASQUERADE in the router ==");
    t.masquerade();
    let fwd0 = t.nstat(Ns::Router, "IpForwDatagrams");
    let run = iperf(t, &[]);
    let kernel_pkts = t.nstat(Ns::Router, "IpForwDatagrams") - fwd0;
    println!(
        "iperf TCP {}s: {:.2} Gbit/s, kernel forwarded {kernel_pkts} packets, server saw {}",
        run.secs, run.gbps, run.server_saw
    );
    run.check("the kernel path");
    t.iptables(Ns::Router, &["-t", "nat", "-F"]);
    t.iptables(Ns::Router, &["-t", "raw", "-F"]);
    let _ = t.exec(Ns::Router, &["conntrack", "-F"]);
    PathRun { run, kernel_pkts }
}

/// Standalone XDP: the fast path admits and masquerades by itself.
fn standalone_path(t: &Topology) -> PathRun {
    println!(
        "\n== XDP path: router-ctl attach {LAN_IF} {WAN_IF} --admit xdp (standalone, no iptables NAT) =="
    );
    // What a router owner sets first (attach and doctor warn otherwise):
    // the router's own sockets take the kernel NAT's ports, outside XDP's.
    let own_ports = "net.ipv4.ip_local_port_range=61000 65535";
    t.exec_ok(Ns::Router, &["sysctl", "-qw", own_ports]);
    println!("sysctl -w {own_ports} (the router's own sockets, outside XDP's ports)");
    println!(
        "{}",
        t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"])
            .trim_end()
    );
    let fwd0 = t.nstat(Ns::Router, "IpForwDatagrams");
    let before = t.stats();
    let run = iperf(t, &[]);
    let after = t.stats();
    let kernel_pkts = t.nstat(Ns::Router, "IpForwDatagrams") - fwd0;
    println!(
        "iperf TCP {}s: {:.2} Gbit/s, fast path forwarded {} packets, kernel {kernel_pkts}, server saw {}",
        run.secs,
        run.gbps,
        fast_path_packets(&before, &after),
        run.server_saw
    );
    run.check("standalone XDP");
    assert!(
        fast_path_packets(&before, &after) > 0,
        "standalone XDP forwarded nothing"
    );
    assert!(
        t.ping(Ns::Client, SERVER_ADDR, 3),
        "ping through the XDP NAT"
    );
    println!("ping client -> server through the XDP NAT: ok");
    println!(
        "\n== router-ctl stats ==\n{}",
        t.router_ctl_ok(&["stats"]).trim_end()
    );
    println!(
        "\n== router-ctl conntrack list ==\n{}",
        t.router_ctl_ok(&["conntrack", "list"]).trim_end()
    );
    t.router_ctl_ok(&["detach"]);
    PathRun { run, kernel_pkts }
}

/// Offload: an nftables firewall and NAT admit the flow, `router-ctl run`
/// moves it to XDP.
fn offload_path(t: &Topology) -> PathRun {
    println!(
        "\n== offload path: nftables firewall + masquerade, router-ctl attach {LAN_IF} {WAN_IF} \
         (--admit kernel) and router-ctl run =="
    );
    tests::host::load_nft(t.ns_name(Ns::Router), FIREWALL);
    println!(
        "{}",
        // Named: left out, attach keeps the mode the router had when it
        // was detached (standalone, just above).
        t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"])
            .trim_end()
    );
    let _daemon = Daemon(
        Command::new(router_ctl_bin())
            .args(["-n", t.ns_name(Ns::Router), "run"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting router-ctl run"),
    );
    // `status` exits 1 (degraded) until the daemon runs.
    wait_until("router-ctl run to start", || {
        let status = t.router_ctl(&["status", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&status.stdout)
            .is_ok_and(|v| v["daemon"]["running"] == true)
    });
    let fwd0 = t.nstat(Ns::Router, "IpForwDatagrams");
    let before = t.stats();
    let run = iperf(t, &[]);
    let after = t.stats();
    let kernel_pkts = t.nstat(Ns::Router, "IpForwDatagrams") - fwd0;
    println!(
        "iperf TCP {}s: {:.2} Gbit/s, fast path forwarded {} packets, kernel {kernel_pkts} \
         (the handshake and teardown), server saw {}",
        run.secs,
        run.gbps,
        fast_path_packets(&before, &after),
        run.server_saw
    );
    run.check("offload");
    assert!(
        fast_path_packets(&before, &after) > 0,
        "offload mode: the daemon moved nothing to the fast path"
    );
    println!(
        "\n== router-ctl status (offload mode) ==\n{}",
        t.router_ctl_ok(&["status"]).trim_end()
    );
    PathRun { run, kernel_pkts }
}

fn main() {
    assert!(
        tests::is_root(),
        "the demo needs root: run `sudo cargo xtask demo`"
    );
    let _ = secs(); // bad arguments stop it before any namespace exists
    let t = Topology::new();
    println!("topology: {}", t.namespaces().join(", "));
    t.warm_neighbours();
    let start = Instant::now();
    let kernel = kernel_path(&t);
    let xdp = standalone_path(&t);
    let offload = offload_path(&t);

    println!("\n== comparison (same run, same topology; veth, 2 shared cores: noisy) ==");
    // kernel: iptables MASQUERADE; xdp: standalone; offload: nftables
    // firewall + masquerade admit, XDP carries.
    println!("| path    | TCP Gbit/s | softirq ticks | packets through the kernel |");
    println!("|---------|-----------:|--------------:|---------------------------:|");
    for (name, p) in [("kernel", &kernel), ("xdp", &xdp), ("offload", &offload)] {
        println!(
            "| {name:<7} | {:>10.2} | {:>13} | {:>26} |",
            p.run.gbps, p.run.softirq_ticks, p.kernel_pkts
        );
    }
    if kernel.run.gbps > 0.0 {
        println!(
            "throughput ratios: xdp/kernel {:.2}, offload/kernel {:.2}",
            xdp.run.gbps / kernel.run.gbps,
            offload.run.gbps / kernel.run.gbps
        );
    }
    println!(
        "(all runs masquerade to {ROUTER_WAN_ADDR}; `cargo xtask bench` is the full comparison; \
         demo took {:.0?})",
        start.elapsed()
    );
}
