//! `cargo xtask demo`: build a client -- router -- server topology (no route
//! back from the server, so only NAT makes it work), run the same traffic
//! through the kernel path (forwarding + iptables MASQUERADE) and through
//! the XDP NAT, and show what each did. Needs root; everything happens in
//! namespaces this program creates and deletes.

use std::time::{Duration, Instant};

use tests::{LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF, counter_of};

const SECS: u32 = 3;

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

struct Run {
    gbps: f64,
    softirq_ticks: u64,
    server_saw: String,
}

/// One iperf2 TCP run from client to server; returns throughput and the
/// peer address the server reported.
fn iperf(t: &Topology, extra: &[&str]) -> Run {
    let log = std::env::temp_dir().join(format!("xdp-router-demo-{}.csv", std::process::id()));
    let server_cmd = format!("exec iperf -s -p 5001 -y C > {}", log.display());
    let mut server = t.spawn(Ns::Server, &["sh", "-c", &server_cmd]);
    std::thread::sleep(Duration::from_millis(300));
    let secs = SECS.to_string();
    let dst = SERVER_ADDR.to_string();
    let mut args = vec![
        "timeout", "-k", "5", "20", "iperf", "-c", &dst, "-p", "5001",
    ];
    args.extend_from_slice(&["-t", &secs, "-y", "C"]);
    args.extend_from_slice(extra);
    let (_, soft0) = cpu_ticks();
    let out = t.exec_ok(Ns::Client, &args);
    let (_, soft1) = cpu_ticks();
    std::thread::sleep(Duration::from_millis(300));
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
    let _ = std::fs::remove_file(&log);
    let server_saw = server_log
        .lines()
        .next()
        .map(|l| l.split(',').collect::<Vec<_>>())
        .filter(|f| f.len() > 4)
        .map_or_else(|| "?".to_owned(), |f| format!("{}:{}", f[1], f[2]));
    Run {
        gbps: bps / 1e9,
        softirq_ticks: soft1 - soft0,
        server_saw,
    }
}

fn main() {
    assert!(
        tests::is_root(),
        "the demo needs root: run `sudo cargo xtask demo`"
    );
    let t = Topology::new();
    println!("topology: {}", t.namespaces().join(", "));
    t.warm_neighbours();

    println!("\n== kernel path: ip_forward=1 + iptables MASQUERADE in the router ==");
    t.masquerade();
    let fwd0 = t.nstat(Ns::Router, "IpForwDatagrams");
    let kernel = iperf(&t, &[]);
    let kernel_pkts = t.nstat(Ns::Router, "IpForwDatagrams") - fwd0;
    println!(
        "iperf TCP {SECS}s: {:.2} Gbit/s, kernel forwarded {kernel_pkts} packets, server saw {}",
        kernel.gbps, kernel.server_saw
    );
    t.iptables(Ns::Router, &["-t", "nat", "-F"]);
    t.iptables(Ns::Router, &["-t", "raw", "-F"]);
    let _ = t.exec(Ns::Router, &["conntrack", "-F"]);

    println!("\n== XDP path: router-ctl attach {LAN_IF} {WAN_IF} --admit xdp (standalone, no iptables NAT) ==");
    println!(
        "{}",
        t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]).trim_end()
    );
    let start = Instant::now();
    let fwd0 = t.nstat(Ns::Router, "IpForwDatagrams");
    let before = t.stats();
    let xdp = iperf(&t, &[]);
    let after = t.stats();
    let xdp_kernel_pkts = t.nstat(Ns::Router, "IpForwDatagrams") - fwd0;
    let fast = counter_of(&after, "fwd_outbound") + counter_of(&after, "fwd_inbound")
        - counter_of(&before, "fwd_outbound")
        - counter_of(&before, "fwd_inbound");
    println!(
        "iperf TCP {SECS}s: {:.2} Gbit/s, fast path forwarded {fast} packets, kernel {xdp_kernel_pkts}, server saw {}",
        xdp.gbps, xdp.server_saw
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

    println!("\n== comparison (same run, same topology; veth, 2 shared cores: noisy) ==");
    println!("| path   | TCP Gbit/s | softirq ticks | packets through the kernel |");
    println!("|--------|-----------:|--------------:|---------------------------:|");
    println!(
        "| kernel | {:>10.2} | {:>13} | {:>26} |",
        kernel.gbps, kernel.softirq_ticks, kernel_pkts
    );
    println!(
        "| xdp    | {:>10.2} | {:>13} | {:>26} |",
        xdp.gbps, xdp.softirq_ticks, xdp_kernel_pkts
    );
    if kernel.gbps > 0.0 {
        println!("xdp/kernel throughput ratio: {:.2}", xdp.gbps / kernel.gbps);
    }
    println!(
        "(both runs masquerade to {ROUTER_WAN_ADDR}; `cargo xtask bench` is the full comparison; \
         demo took {:.0?})",
        start.elapsed()
    );
}
