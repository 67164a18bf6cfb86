//! IPv6 rows: one iperf2 TCP stream over IPv6 through the router, kernel
//! IPv6 forwarding (`forwarding=1`, no NAT66, no netfilter rule) against
//! the XDP path (`attach --admit xdp`: routed, not translated), on a fresh
//! topology with global IPv6 addresses (`tests::v6`), offloads as the
//! topology sets them (tx checksum off on the hosts). Throughput from
//! iperf2's CSV; the packets each path forwarded (the kernel's
//! `Ip6OutForwDatagrams`, the program's `fwd6_*`) show who carried it.
//!
//! Not here yet: the live-frame generator's 64-byte rows over IPv6 (its
//! raw-instruction program builds IPv4/UDP frames only).

use std::time::Duration;

use serde_json::{Value, json};
use tests::v6::{self, SERVER6};
use tests::{LAN_IF, Ns, Topology, WAN_IF};

/// One measured run.
#[derive(Clone, Debug)]
pub struct Row {
    /// `kernel` or `xdp`.
    pub path: &'static str,
    pub secs: u32,
    pub gbps: f64,
    /// Packets the kernel forwarded (IPv6) during the run.
    pub kernel_fwd: u64,
    /// Packets the XDP program forwarded (IPv6) during the run.
    pub xdp_fwd: u64,
}

fn kernel_forwarded6(t: &Topology) -> u64 {
    let text = t.exec_ok(Ns::Router, &["cat", "/proc/net/snmp6"]);
    text.lines()
        .find_map(|l| l.strip_prefix("Ip6OutForwDatagrams"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn xdp_forwarded6(t: &Topology) -> u64 {
    if !t.router_ctl(&["status"]).status.success() {
        return 0;
    }
    t.counter("fwd6_outbound") + t.counter("fwd6_inbound")
}

/// The bits per second of iperf2's CSV report (`-y C`): the last field of
/// its last line.
fn parse_bps(csv: &str) -> Option<f64> {
    csv.lines()
        .rev()
        .find(|l| l.contains(','))?
        .rsplit(',')
        .next()?
        .trim()
        .parse()
        .ok()
}

/// One iperf2 TCP stream over IPv6 for `secs` seconds.
fn one(t: &Topology, path: &'static str, secs: u32, port: u16) -> Result<Row, String> {
    let p = port.to_string();
    let dst = SERVER6.to_string();
    let limit = (secs + 10).to_string();
    let mut server = t.spawn(
        Ns::Server,
        &[
            "timeout", "-k", "1", &limit, "iperf", "-s", "-V", "-B", &dst, "-p", &p,
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    let (k0, x0) = (kernel_forwarded6(t), xdp_forwarded6(t));
    let t_arg = secs.to_string();
    let out = t.exec(
        Ns::Client,
        &[
            "timeout", "-k", "1", &limit, "iperf", "-V", "-c", &dst, "-p", &p, "-t", &t_arg, "-y",
            "C",
        ],
    );
    let (k1, x1) = (kernel_forwarded6(t), xdp_forwarded6(t));
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    let bps = parse_bps(&text).ok_or_else(|| {
        format!(
            "ipv6 {path}: no iperf2 result: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(Row {
        path,
        secs,
        gbps: bps / 1e9,
        kernel_fwd: k1.saturating_sub(k0),
        xdp_fwd: x1.saturating_sub(x0),
    })
}

/// Kernel, then XDP, then kernel again if `alternate` (both orders of a
/// shared machine's drift), on one fresh topology.
pub fn run(secs: u32, alternate: bool, port: &mut u16) -> Result<Vec<Row>, String> {
    let t = Topology::new();
    v6::enable(&t);
    v6::resolve_neighbours(&t);
    let mut rows = Vec::new();
    let mut order = vec!["kernel", "xdp"];
    if alternate {
        order.push("kernel");
    }
    for path in order {
        if path == "xdp" {
            t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
        } else {
            let _ = t.router_ctl(&["detach"]);
        }
        *port += 1;
        rows.push(one(&t, path, secs, *port)?);
    }
    let _ = t.router_ctl(&["detach"]);
    Ok(rows)
}

/// The rows for results.json, each with `"family": "ipv6"`.
pub fn json(rows: &[Row]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| {
                json!({
                    "family": "ipv6",
                    "path": r.path,
                    "workload": "tcp",
                    "conns": 1,
                    "secs": r.secs,
                    "gbps": r.gbps,
                    "kernel_forwarded_packets": r.kernel_fwd,
                    "xdp_forwarded_packets": r.xdp_fwd,
                })
            })
            .collect(),
    )
}

/// The report's IPv6 section.
pub fn section(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n## IPv6 (routed, no NAT66)\n\nOne iperf2 TCP stream over IPv6, fresh topology, \
         kernel IPv6 forwarding (no netfilter rule) against `attach --admit xdp`.\n\n\
         | path | Gbit/s | packets forwarded by the kernel | by XDP |\n|---|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {} | {} |",
            r.path, r.gbps, r.kernel_fwd, r.xdp_fwd
        );
    }
    let mean = |p: &str| {
        let v: Vec<f64> = rows
            .iter()
            .filter(|r| r.path == p)
            .map(|r| r.gbps)
            .collect();
        #[expect(clippy::cast_precision_loss, reason = "a handful of runs")]
        let n = v.len() as f64;
        v.iter().sum::<f64>() / n
    };
    let (k, x) = (mean("kernel"), mean("xdp"));
    if k > 0.0 && x.is_finite() {
        let _ = writeln!(s, "\nxdp / kernel: {:.2}x\n", x / k);
    }
    s
}

#[cfg(test)]
mod checks {
    use super::*;

    #[test]
    fn iperf_csv_gives_the_last_lines_rate() {
        let csv = "20261203221500,2001:db8:50::2,40000,2001:db8:71::2,5201,3,0.0-5.0,\
                   2900000000,4640000000\n";
        assert_eq!(parse_bps(csv), Some(4.64e9));
        assert_eq!(parse_bps("connect failed"), None);
        let rows = [
            Row {
                path: "kernel",
                secs: 5,
                gbps: 4.0,
                kernel_fwd: 100,
                xdp_fwd: 0,
            },
            Row {
                path: "xdp",
                secs: 5,
                gbps: 5.0,
                kernel_fwd: 2,
                xdp_fwd: 100,
            },
        ];
        assert_eq!(json(&rows)[1]["family"], "ipv6");
        assert!(section(&rows).contains("xdp / kernel: 1.25x"));
    }
}
