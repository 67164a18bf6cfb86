//! The report's first section: the rows a router review prints (single-,
//! 100- and 1000-connection throughput, latency at 2000 connections with
//! `-l 128`, CPU at line rate), one column per path, the review's best
//! figures beside them clearly marked as another machine's; and the
//! platform, as reviews describe it.

use std::fmt::Write as _;

use crate::model::{DataPath, Offload, Point, RunResult, Workload};

use super::goals::Goal;
use super::tables::f;

/// The review's best figures (`RouterOS` on an Intel N5105 with 2.5G NICs):
/// another machine, printed for scale only.
const REVIEW_RETENTION: f64 = 0.88;
const REVIEW_LATENCY_MS: f64 = 2.5;

fn run(runs: &[RunResult], path: DataPath, workload: Workload, conns: u32) -> Option<&RunResult> {
    // Offload off (wire-like) first, the veth defaults where off was not run.
    [Offload::Off, Offload::On].into_iter().find_map(|offload| {
        let p = Point {
            workload,
            conns,
            offload,
            nodelay: false,
        };
        runs.iter().find(|r| r.path == path && r.point == p)
    })
}

fn gbps(r: Option<&RunResult>) -> String {
    r.map_or_else(
        || "-".to_owned(),
        |r| {
            format!(
                "{} Gbit/s (offload {})",
                f(r.gbps, 2),
                r.point.offload.name()
            )
        },
    )
}

/// CPU-seconds of softirq per second and the machine's busy share, with
/// what was carried.
fn cpu_at_rate(r: Option<&RunResult>, cores: f64) -> String {
    r.map_or_else(
        || "-".to_owned(),
        |r| {
            let offered = f64::from(r.offered_mbps) / 1000.0;
            let short = if r.gbps < 0.95 * offered {
                " **below the offered rate**"
            } else {
                ""
            };
            format!(
                "{} s/s softirq ({} % of the machine; busy {} %), {} of {offered} Gbit/s \
                 offered{short}",
                f(r.softirq_pct / 100.0 * cores, 2),
                f(r.softirq_pct, 0),
                f(r.cpu_pct, 0),
                f(r.gbps, 2)
            )
        },
    )
}

/// The review table. `cores`: CPUs of the machine; `line_mbps`: the paced
/// workload's offered rate.
pub fn review_section(runs: &[RunResult], cores: f64, offered_mbps: u32) -> String {
    let paths = [DataPath::Kernel, DataPath::Xdp];
    let line_gbps = f64::from(offered_mbps) / 1000.0;
    let mut s = String::from(
        "## The review's table\n\nThe rows a soft-router review prints, measured here with the \
         same tool (iperf2) on this run's topology. The last column is the review's best \
         system (RouterOS on an Intel N5105 with 2.5G NICs): **another machine's figures**, \
         for scale only. `offload` (the kernel admits flows, XDP carries them) is not yet a \
         path of this benchmark: once the kernel has admitted a flow its packets take the \
         same hit path as `xdp` (see `hit-udp-out-offloaded` in the micro-benchmark), but \
         connection setup and the CPU at line rate differ.\n\n",
    );
    let _ = writeln!(
        s,
        "| | kernel | xdp | offload | review's best (another machine) |\n|---|---|---|---|---|"
    );
    let row = |s: &mut String, name: &str, cell: &dyn Fn(DataPath) -> String, review: &str| {
        let cells: Vec<String> = paths.iter().map(|&p| cell(p)).collect();
        let _ = writeln!(
            s,
            "| {name} | {} | not a bench path yet | {review} |",
            cells.join(" | ")
        );
    };
    for (name, conns) in [
        ("single-connection", 1),
        ("100-connection", 100),
        ("1000-connection", 1000),
    ] {
        row(
            &mut s,
            &format!("{name} throughput"),
            &|p| gbps(run(runs, p, Workload::Tcp, conns)),
            "-",
        );
    }
    row(
        &mut s,
        "retention (1000-connection / single)",
        &|p| match (
            run(runs, p, Workload::Tcp, 1000),
            run(runs, p, Workload::Tcp, 1),
        ) {
            (Some(k), Some(one)) => f(k.gbps / one.gbps, 2),
            _ => "-".to_owned(),
        },
        &format!("{REVIEW_RETENTION:.2} (RouterOS)"),
    );
    row(
        &mut s,
        "latency at 2000 connections, `-l 128` (ping RTT p50 / p99)",
        &|p| {
            run(runs, p, Workload::TcpSmall, 2000).map_or_else(
                || "-".to_owned(),
                |r| format!("{} / {} ms", f(r.rtt_ms_p50, 2), f(r.rtt_ms_p99, 2)),
            )
        },
        &format!("{REVIEW_LATENCY_MS} ms (RouterOS)"),
    );
    for conns in [1, 100, 1000] {
        row(
            &mut s,
            &format!("CPU at line rate ({line_gbps} Gbit/s or what both sustain, TCP -P {conns})"),
            &|p| cpu_at_rate(run(runs, p, Workload::TcpPaced, conns), cores),
            "-",
        );
    }
    let _ = writeln!(
        s,
        "\n\"CPU at line rate\": both paths carry the same paced TCP load (iperf2 `-b`, the \
         rate split over the streams), so the difference in softirq time is the router's. \
         Where a path carried less than 95 % of the offered line rate (the shared cores could \
         not generate it), both paths were run again at 90 % of the lower carried rate, and the \
         cell shows that rate; a cell still marked below the offered rate is at unequal loads. \
         Throughput rows: bytes into the server's interface; latency: ping through the router \
         during the load.\n"
    );
    s
}

/// The platform, as reviews print it.
pub fn platform_section(p: &serde_json::Value) -> String {
    let mut s = String::from("## Platform\n\n| | |\n|---|---|\n");
    for (name, key) in [
        ("CPU", "cpu_model"),
        ("cores", "cores"),
        ("memory, GiB", "mem_gib"),
        ("kernel", "kernel"),
        ("virtualization", "virtualization"),
        ("NIC / driver", "nic"),
        ("openssl", "openssl"),
    ] {
        let v = match &p[key] {
            serde_json::Value::String(x) => x.clone(),
            serde_json::Value::Null => "?".to_owned(),
            x => x.to_string(),
        };
        let _ = writeln!(s, "| {name} | {v} |");
    }
    if let Some(rates) = p["chacha20_poly1305_bytes_per_s"].as_array() {
        let sizes: Vec<String> = rates
            .iter()
            .map(|r| format!("{} B", r["block_bytes"]))
            .collect();
        let vals: Vec<String> = rates
            .iter()
            .map(|r| f(r["bytes_per_s"].as_f64().unwrap_or(f64::NAN) / 1e6, 0))
            .collect();
        let _ = writeln!(
            s,
            "\nCrypto throughput, `openssl speed -evp chacha20-poly1305`, one core, MB/s \
             (10^6 bytes):\n\n| {} |\n|{}\n| {} |",
            sizes.join(" | "),
            "---:|".repeat(sizes.len()),
            vals.join(" | ")
        );
    } else if let Some(e) = p["chacha20_poly1305_error"].as_str() {
        let _ = writeln!(s, "\nCrypto throughput: not measured ({e}).");
    }
    s.push('\n');
    s
}

/// "CPU at line rate": xdp's softirq time below the kernel's at every
/// paced point measured on both.
pub fn line_rate_goal(runs: &[RunResult]) -> Goal {
    let pairs: Vec<(&RunResult, &RunResult)> = runs
        .iter()
        .filter(|x| x.path == DataPath::Xdp && x.point.workload == Workload::TcpPaced)
        .filter_map(|x| {
            let k = runs
                .iter()
                .find(|k| k.path == DataPath::Kernel && k.point == x.point)?;
            Some((k, x))
        })
        .collect();
    Goal {
        asks: "CPU at line rate (paced TCP, same offered load on both paths): xdp's router \
               softirq time below the kernel's at every point",
        measured: if pairs.is_empty() {
            "-".into()
        } else {
            pairs
                .iter()
                .map(|(k, x)| {
                    format!(
                        "-P {} at {} Mbit/s: xdp {:.0} % vs kernel {:.0} % softirq",
                        x.point.conns, x.offered_mbps, x.softirq_pct, k.softirq_pct
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        },
        met: (!pairs.is_empty()).then(|| pairs.iter().all(|(k, x)| x.softirq_pct < k.softirq_pct)),
    }
}
