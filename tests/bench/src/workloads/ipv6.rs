//! IPv6 rows, on a fresh topology with global IPv6 addresses
//! (`tests::v6`), kernel IPv6 forwarding (`forwarding=1`, no NAT66, no
//! netfilter rule) against the XDP path (`attach --admit xdp`: routed, not
//! translated), offloads as the topology sets them (tx checksum off on the
//! hosts):
//!
//! - one iperf2 TCP stream: throughput from iperf2's CSV;
//! - the live-frame generator's 64-byte UDP packets per second
//!   (`udp-live` over IPv6: the same generator program, sink, ping and
//!   figures as the IPv4 rows, see `live`), per flow count.
//!
//! The packets each path forwarded (the kernel's `Ip6OutForwDatagrams`,
//! the program's `fwd6_*`) show who carried each run.

use std::fmt::Write as _;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use serde_json::{Value, json};
use tests::v6::{self, SERVER6};
use tests::{LAN_IF, Ns, Topology, WAN_IF};

use crate::model::{DataPath, Offload, Point, RunResult, Settings, Workload};
use crate::workloads::live::{self, Family};

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Seconds of each TCP run; `None`: no TCP rows.
    pub tcp_secs: Option<u32>,
    /// TCP: kernel, xdp, then kernel again (both orders of a shared
    /// machine's drift).
    pub alternate: bool,
    /// Flow counts of the live-generator rows (empty: none), each on
    /// kernel and xdp for `Settings::secs`, the first path alternating
    /// from one count to the next.
    pub live_flows: Vec<u32>,
}

/// One measured run.
#[derive(Clone, Debug)]
pub enum Row {
    Tcp(TcpRow),
    Live(Box<LiveRow>),
}

/// One iperf2 TCP run.
#[derive(Clone, Debug)]
pub struct TcpRow {
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

/// One live-generator run: the IPv4 rows' figures, and who forwarded.
#[derive(Clone, Debug)]
pub struct LiveRow {
    pub run: RunResult,
    /// Packets the kernel forwarded (IPv6) during the run.
    pub kernel_fwd: u64,
    /// Packets the XDP program forwarded (IPv6) during the run.
    pub xdp_fwd: u64,
}

/// Packets forwarded so far over IPv6, by the kernel and by the program:
/// the `router_pkts` of a live run on either path.
pub fn forwarded6(t: &Topology) -> u64 {
    kernel_forwarded6(t) + xdp_forwarded6(t)
}

/// One iperf2 TCP stream over IPv6 for `secs` seconds.
fn one(t: &Topology, path: &'static str, secs: u32, port: u16) -> Result<TcpRow, String> {
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
    // The whole group: `Child::kill` would stop `timeout` alone and leave
    // `iperf -s` running after the topology is gone.
    crate::workloads::procs::kill_group(&server);
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    let bps = parse_bps(&text).ok_or_else(|| {
        format!(
            "ipv6 {path}: no iperf2 result: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(TcpRow {
        path,
        secs,
        gbps: bps / 1e9,
        kernel_fwd: k1.saturating_sub(k0),
        xdp_fwd: x1.saturating_sub(x0),
    })
}

/// Sets the router up for `path`: kernel IPv6 forwarding alone, or the
/// program in standalone mode.
fn switch(t: &Topology, path: DataPath) -> Result<(), String> {
    let _ = t.router_ctl(&["detach"]);
    if path == DataPath::Xdp {
        let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
        if !o.status.success() {
            return Err(format!(
                "router-ctl attach {LAN_IF} {WAN_IF} --admit xdp failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
    }
    Ok(())
}

/// One live-generator run of `flows` flows on `path`.
fn one_live(
    t: &Topology,
    s: &Settings,
    (path, flows): (DataPath, u32),
    stop: &AtomicBool,
) -> Result<LiveRow, String> {
    switch(t, path)?;
    // Offload not applied: the IPv6 topology keeps its own offloads, which
    // 64-byte UDP does not use.
    let point = Point::new(Workload::UdpLive, flows, Offload::Off);
    let (k0, x0) = (kernel_forwarded6(t), xdp_forwarded6(t));
    let run = live::run_family(
        t,
        s,
        Family::Ipv6,
        (path, point),
        &[tests::trafficgen::last_cpu()?],
        stop,
    )?;
    let (k1, x1) = (kernel_forwarded6(t), xdp_forwarded6(t));
    Ok(LiveRow {
        run,
        kernel_fwd: k1.saturating_sub(k0),
        xdp_fwd: x1.saturating_sub(x0),
    })
}

/// Shows `row` as the run's progress and keeps it.
fn keep(rows: &mut Vec<Row>, row: Row) {
    eprintln!("        {}", show(&row));
    rows.push(row);
}

/// The rows of `plan` on one fresh topology: TCP (kernel, then XDP, then
/// kernel again if `alternate`), then the live generator per flow count.
/// A failed run is reported in the second list and the others go on.
pub fn run(
    plan: &Plan,
    s: &Settings,
    stop: &AtomicBool,
    port: &mut u16,
) -> (Vec<Row>, Vec<String>) {
    let t = Topology::new();
    v6::enable(&t);
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    if let Err(e) = v6::try_resolve_neighbours(&t) {
        return (rows, vec![format!("ipv6: {e}")]);
    }
    if let Some(secs) = plan.tcp_secs {
        let mut order = vec!["kernel", "xdp"];
        if plan.alternate {
            order.push("kernel");
        }
        for path in order {
            let dp = if path == "xdp" {
                DataPath::Xdp
            } else {
                DataPath::Kernel
            };
            *port += 1;
            match switch(&t, dp).and_then(|()| one(&t, path, secs, *port)) {
                Ok(r) => keep(&mut rows, Row::Tcp(r)),
                Err(e) => failures.push(format!("ipv6 tcp {path}: {e}")),
            }
        }
    }
    for (i, &flows) in plan.live_flows.iter().enumerate() {
        let mut order = [DataPath::Kernel, DataPath::Xdp];
        if i % 2 == 1 {
            order.reverse();
        }
        for path in order {
            if stop.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            match one_live(&t, s, (path, flows), stop) {
                Ok(r) => keep(&mut rows, Row::Live(Box::new(r))),
                Err(e) => {
                    failures.push(format!("ipv6 udp-live {} {flows} flows: {e}", path.name()));
                }
            }
        }
    }
    let _ = t.router_ctl(&["detach"]);
    (rows, failures)
}

/// One line of progress for the console.
pub fn show(r: &Row) -> String {
    match r {
        Row::Tcp(r) => format!("ipv6 tcp {} {:.2} Gbit/s", r.path, r.gbps),
        Row::Live(r) => format!(
            "ipv6 udp-live {} {} flow(s): {}",
            r.run.path.name(),
            r.run.point.conns,
            crate::run::show(&r.run)
        ),
    }
}

/// A live row for results.json: the IPv4 live rows' names for the same
/// figures, plus `mpps` and `ns_per_pkt` (the router's softirq time per
/// packet into it, the main tables' `router_ns_per_pkt`).
fn live_json(r: &LiveRow) -> Value {
    let run = &r.run;
    json!({
        "family": "ipv6",
        "path": run.path.name(),
        "workload": "udp-live",
        "generator": run.point.workload.generator(),
        "conns": run.point.conns,
        "secs": run.stream_s,
        "mpps": run.pps / 1e6,
        "ns_per_pkt": run.router_ns_per_pkt,
        "pps": run.pps,
        "sent_pps": run.sent_pps,
        "loss_pct": run.loss_pct,
        "lost": run.lost,
        "gbps": run.gbps,
        "rtt_ms_p50": run.rtt_ms_p50,
        "rtt_ms_p99": run.rtt_ms_p99,
        "ping_loss_pct": run.ping_loss_pct,
        "rtt_p99_lost": run.rtt_ms_p99.is_infinite(),
        "cpu_pct": run.cpu_pct,
        "softirq_pct": run.softirq_pct,
        "router_ns_per_pkt": run.router_ns_per_pkt,
        "active_s": run.active_s,
        "router_pkts": run.router_pkts,
        "run_ns_per_pkt": run.run_ns_per_pkt,
        "kernel_forwarded_packets": r.kernel_fwd,
        "xdp_forwarded_packets": r.xdp_fwd,
        "notes": run.notes,
    })
}

/// The rows for results.json, each with `"family": "ipv6"`.
pub fn json(rows: &[Row]) -> Value {
    Value::Array(
        rows.iter()
            .map(|r| match r {
                Row::Tcp(r) => json!({
                    "family": "ipv6",
                    "path": r.path,
                    "workload": "tcp",
                    "conns": 1,
                    "secs": r.secs,
                    "gbps": r.gbps,
                    "kernel_forwarded_packets": r.kernel_fwd,
                    "xdp_forwarded_packets": r.xdp_fwd,
                }),
                Row::Live(r) => live_json(r),
            })
            .collect(),
    )
}

/// Mean of `f` over the rows of `path`; NaN when there are none.
fn mean<T>(rows: &[&T], path: impl Fn(&T) -> bool, f: impl Fn(&T) -> f64) -> f64 {
    let v: Vec<f64> = rows.iter().filter(|r| path(r)).map(|r| f(r)).collect();
    #[expect(clippy::cast_precision_loss, reason = "a handful of runs")]
    let n = v.len() as f64;
    v.iter().sum::<f64>() / n
}

fn tcp_section(s: &mut String, rows: &[&TcpRow]) {
    s.push_str(
        "One iperf2 TCP stream over IPv6.\n\n\
         | path | Gbit/s | packets forwarded by the kernel | by XDP |\n|---|---:|---:|---:|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {:.2} | {} | {} |",
            r.path, r.gbps, r.kernel_fwd, r.xdp_fwd
        );
    }
    let k = mean(rows, |r| r.path == "kernel", |r| r.gbps);
    let x = mean(rows, |r| r.path == "xdp", |r| r.gbps);
    if k > 0.0 && x.is_finite() {
        let _ = writeln!(s, "\nxdp / kernel: {:.2}x\n", x / k);
    }
}

fn live_section(s: &mut String, rows: &[&LiveRow]) {
    s.push_str(
        "The live-frame generator over IPv6 (`udp-live`: 64-byte UDP payloads, one generator \
         CPU, the same generator and `XDP_DROP` sink on both paths). Mpps received at the \
         sink; ns/pkt is the machine's softirq time per packet into the router, as in the \
         IPv4 udp-live rows.\n\n\
         | path | flows | Mpps received | Mpps sent | loss % | ns/pkt | rtt p50 ms | packets \
         forwarded by the kernel | by XDP |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in rows {
        let run = &r.run;
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} | {:.3} | {:.1} | {:.0} | {:.3} | {} | {} |",
            run.path.name(),
            run.point.conns,
            run.pps / 1e6,
            run.sent_pps / 1e6,
            run.loss_pct,
            run.router_ns_per_pkt,
            run.rtt_ms_p50,
            r.kernel_fwd,
            r.xdp_fwd
        );
    }
    let mut flows: Vec<u32> = rows.iter().map(|r| r.run.point.conns).collect();
    flows.dedup();
    s.push('\n');
    for n in flows {
        let of = |p: DataPath| move |r: &LiveRow| r.run.point.conns == n && r.run.path == p;
        let (k, x) = (
            mean(rows, of(DataPath::Kernel), |r| r.run.pps),
            mean(rows, of(DataPath::Xdp), |r| r.run.pps),
        );
        let (kc, xc) = (
            mean(rows, of(DataPath::Kernel), |r| r.run.router_ns_per_pkt),
            mean(rows, of(DataPath::Xdp), |r| r.run.router_ns_per_pkt),
        );
        if k > 0.0 && x.is_finite() {
            let _ = writeln!(
                s,
                "{n} flow(s): xdp / kernel {:.2}x packets per second, {:.2}x ns/pkt\n",
                x / k,
                xc / kc
            );
        }
    }
}

/// The report's IPv6 section.
pub fn section(rows: &[Row]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n## IPv6 (routed, no NAT66)\n\nFresh topology, kernel IPv6 forwarding (no netfilter \
         rule) against `attach --admit xdp`.\n\n",
    );
    let tcp: Vec<&TcpRow> = rows
        .iter()
        .filter_map(|r| match r {
            Row::Tcp(t) => Some(t),
            Row::Live(_) => None,
        })
        .collect();
    let live: Vec<&LiveRow> = rows
        .iter()
        .filter_map(|r| match r {
            Row::Live(l) => Some(&**l),
            Row::Tcp(_) => None,
        })
        .collect();
    if !tcp.is_empty() {
        tcp_section(&mut s, &tcp);
    }
    if !live.is_empty() {
        live_section(&mut s, &live);
    }
    s
}

#[cfg(test)]
mod checks {
    use super::*;
    use crate::measure::Measured;

    fn tcp(path: &'static str, gbps: f64) -> Row {
        Row::Tcp(TcpRow {
            path,
            secs: 5,
            gbps,
            kernel_fwd: if path == "kernel" { 100 } else { 2 },
            xdp_fwd: if path == "xdp" { 100 } else { 0 },
        })
    }

    fn live(path: DataPath, flows: u32, mpps: f64, ns: f64) -> Row {
        let point = Point::new(Workload::UdpLive, flows, Offload::Off);
        let mut run = RunResult::new(
            path,
            point,
            Measured {
                window: crate::measure::sampler::Window::default(),
                pings: Some(crate::measure::parse::Pings {
                    rtts: vec![0.05],
                    lost: 0,
                }),
                run_cpu: crate::measure::sys::CpuTicks::default(),
                router_pkts: 1000,
                wall_s: 2.5,
                quiet_wait_s: 0.0,
            },
        );
        run.pps = mpps * 1e6;
        run.sent_pps = 2e6;
        run.router_ns_per_pkt = ns;
        Row::Live(Box::new(LiveRow {
            run,
            kernel_fwd: if path == DataPath::Kernel { 1000 } else { 0 },
            xdp_fwd: if path == DataPath::Xdp { 1000 } else { 0 },
        }))
    }

    #[test]
    fn iperf_csv_gives_the_last_lines_rate() {
        let csv = "20261203221500,2001:db8:50::2,40000,2001:db8:71::2,5201,3,0.0-5.0,\
                   2900000000,4640000000\n";
        assert_eq!(parse_bps(csv), Some(4.64e9));
        assert_eq!(parse_bps("connect failed"), None);
        let rows = [tcp("kernel", 4.0), tcp("xdp", 5.0)];
        assert_eq!(json(&rows)[1]["family"], "ipv6");
        let md = section(&rows);
        assert!(md.contains("xdp / kernel: 1.25x"), "{md}");
        assert!(!md.contains("live-frame generator"), "{md}");
    }

    #[test]
    fn live_rows_in_json_and_report() {
        let rows = [
            tcp("kernel", 4.0),
            tcp("xdp", 5.0),
            live(DataPath::Kernel, 1, 0.5, 1200.0),
            live(DataPath::Xdp, 1, 1.5, 400.0),
            live(DataPath::Xdp, 1000, 1.2, 500.0),
            live(DataPath::Kernel, 1000, 0.4, 1500.0),
        ];
        let j = json(&rows);
        let l = &j[3];
        assert_eq!(
            (&l["family"], &l["path"], &l["workload"], &l["conns"]),
            (&json!("ipv6"), &json!("xdp"), &json!("udp-live"), &json!(1))
        );
        assert!((l["mpps"].as_f64().unwrap() - 1.5).abs() < 1e-9, "{l}");
        assert!(
            (l["ns_per_pkt"].as_f64().unwrap() - 400.0).abs() < 1e-9,
            "{l}"
        );
        assert_eq!(l["xdp_forwarded_packets"], 1000);
        assert_eq!(j[0]["workload"], "tcp");
        let md = section(&rows);
        assert!(md.contains("xdp / kernel: 1.25x"), "{md}");
        assert!(md.contains("| xdp | 1 | 1.500 | 2.000 |"), "{md}");
        assert!(
            md.contains("1 flow(s): xdp / kernel 3.00x packets per second, 0.33x ns/pkt"),
            "{md}"
        );
        assert!(
            md.contains("1000 flow(s): xdp / kernel 3.00x packets per second, 0.33x ns/pkt"),
            "{md}"
        );
        // Live rows alone still get the section, without a TCP table.
        let md = section(&rows[2..4]);
        assert!(md.contains("## IPv6") && !md.contains("Gbit/s"), "{md}");
    }
}
