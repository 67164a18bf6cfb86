//! The report's first section: the rows a router review prints (single-,
//! 100- and 1000-connection throughput, latency at 2000 connections with
//! `-l 128`, CPU at line rate), one column per path, the review's best
//! figures beside them clearly marked as another machine's; and the
//! platform, as reviews describe it.

use std::fmt::Write as _;

use crate::model::{DataPath, Offload, Pacing, Point, RunResult, Wire, Workload};

use super::goals::Goal;
use super::tables::{f, rtt_cell};
use crate::run::PACED_ROUNDS;

/// The review's best figures (`RouterOS` on an Intel N5105 with 2.5G NICs):
/// another machine, printed for scale only.
const REVIEW_RETENTION: f64 = 0.88;
const REVIEW_LATENCY_MS: f64 = 2.5;

/// The paths with a column, in column order.
const PATHS: [DataPath; 3] = [DataPath::Kernel, DataPath::Xdp, DataPath::Offload];
/// TCP connection counts of the throughput rows.
const THROUGHPUT_CONNS: [u32; 3] = [1, 100, 1000];
/// TCP connection count of the latency row (`-l 128`).
const LATENCY_CONNS: u32 = 2000;
/// TCP connection counts of the "CPU at line rate" rows.
const PACED_CONNS: [u32; 3] = [1, 100, 1000];

/// Whether the table shows point `p` when the run has `veth_offloads` for
/// its workload: the throughput and latency rows take offload off
/// (wire-like) where it ran, else on; the paced rows are always off.
pub fn shows(p: Point, veth_offloads: &[Offload]) -> bool {
    let setting = if veth_offloads.contains(&Offload::Off) {
        Offload::Off
    } else {
        Offload::On
    };
    match p.workload {
        Workload::Tcp => THROUGHPUT_CONNS.contains(&p.conns) && p.offload == setting,
        Workload::TcpSmall => p.conns == LATENCY_CONNS && !p.nodelay && p.offload == setting,
        Workload::TcpPaced => PACED_CONNS.contains(&p.conns),
        Workload::UdpSmall | Workload::UdpLive => false,
    }
}

fn run(runs: &[RunResult], path: DataPath, workload: Workload, conns: u32) -> Option<&RunResult> {
    // Offload off (wire-like) first, the veth defaults where off was not run.
    [Offload::Off, Offload::On].into_iter().find_map(|offload| {
        let p = Point::new(workload, conns, offload);
        runs.iter().find(|r| r.path == path && r.point == p)
    })
}

fn gbps(r: Option<&RunResult>) -> String {
    r.map_or_else(
        || "-".to_owned(),
        |r| {
            format!(
                "{} Gbit/s (offload {}){}",
                f(r.gbps, 2),
                r.point.offload.name(),
                carried(r)
            )
        },
    )
}

/// Offload path: what share of the forwarded packets XDP carried (the
/// rest the kernel: handshakes, teardowns, pings), over the whole run and
/// once every flow was offloaded.
fn carried(r: &RunResult) -> String {
    r.fast_path.map_or_else(String::new, |fp| {
        let steady = fp
            .steady_xdp_pct
            .map(|p| format!(", {} % once all were offloaded", f(p, 1)))
            .unwrap_or_default();
        format!("; XDP carried {} %{steady}", f(fp.xdp_pct(), 1))
    })
}

/// CPU-seconds of softirq per second and the machine's busy share, with
/// what was carried.
fn cpu_at_rate(r: Option<&RunResult>, cores: f64) -> String {
    r.map_or_else(
        || "-".to_owned(),
        |r| {
            let offered = f64::from(r.offered_mbps) / 1000.0;
            let short = if r.sustained() {
                ""
            } else {
                " **below the offered rate: unequal loads**"
            };
            format!(
                "{} s/s softirq ({} % of the machine; busy {} %), {} of {offered} Gbit/s of \
                 payload offered{short}{}",
                f(r.softirq_pct / 100.0 * cores, 2),
                f(r.softirq_pct, 0),
                f(r.cpu_pct, 0),
                f(r.carried_payload_mbps() / 1000.0, 2),
                carried(r)
            )
        },
    )
}

/// The topologies with paced runs to show, in row order: the cables first
/// (the router receives frames as from a NIC there), then the plain veths,
/// kept for transparency (native XDP pays veth's skb copy there).
fn paced_sets<'a>(runs: &'a [RunResult], cable: &'a [RunResult]) -> Vec<(Wire, &'a [RunResult])> {
    let has_paced = |set: &[RunResult]| set.iter().any(|r| r.point.workload == Workload::TcpPaced);
    let mut sets = Vec::new();
    if has_paced(cable) {
        sets.push((Wire::Cable, cable));
    }
    sets.push((Wire::Veth, runs));
    sets
}

/// The review table. `runs`: the main topology's (plain veth); `cable`:
/// the runs between XDP cables; `cores`: CPUs of the machine;
/// `(offered_mbps, pacing)`: the paced workload's offered rate and how its
/// streams were paced.
pub fn review_section(
    runs: &[RunResult],
    cable: &[RunResult],
    cores: f64,
    (offered_mbps, pacing): (u32, Pacing),
) -> String {
    let line_gbps = f64::from(offered_mbps) / 1000.0;
    let mut s = String::from(
        "## The review's table\n\nThe rows a soft-router review prints, measured here with the \
         same tool (iperf2) on this run's topology. The last column is the review's best \
         system (RouterOS on an Intel N5105 with 2.5G NICs): **another machine's figures**, \
         for scale only. `xdp` is standalone mode (`attach --admit xdp`: XDP admits and NATs \
         new flows); `offload` is offload mode (`attach --admit kernel` with iptables \
         MASQUERADE and the daemon `router-ctl run`: the kernel admits and NATs each new \
         flow, the daemon moves it to XDP once established). Its cells say what share of the \
         forwarded packets XDP carried over the whole run (the kernel forwards each flow's \
         handshake and teardown, and with many streams the ramp: each flow's first packets) \
         and from the moment the XDP table held all the run's flows (sampled once a \
         second); the connection setup rate, where the paths differ most, has its own \
         section below.\n\n",
    );
    let _ = writeln!(
        s,
        "| | kernel | xdp | offload | review's best (another machine) |\n|---|---|---|---|---|"
    );
    let row = |s: &mut String, name: &str, cell: &dyn Fn(DataPath) -> String, review: &str| {
        let cells: Vec<String> = PATHS.iter().map(|&p| cell(p)).collect();
        let _ = writeln!(s, "| {name} | {} | {review} |", cells.join(" | "));
    };
    for (name, conns) in ["single-connection", "100-connection", "1000-connection"]
        .into_iter()
        .zip(THROUGHPUT_CONNS)
    {
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
            run(runs, p, Workload::Tcp, THROUGHPUT_CONNS[2]),
            run(runs, p, Workload::Tcp, THROUGHPUT_CONNS[0]),
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
            run(runs, p, Workload::TcpSmall, LATENCY_CONNS).map_or_else(
                || "-".to_owned(),
                |r| format!("{} ms{}", rtt_cell(r, 2), carried(r)),
            )
        },
        &format!("{REVIEW_LATENCY_MS} ms (RouterOS)"),
    );
    for (wire, set) in paced_sets(runs, cable) {
        for conns in PACED_CONNS {
            row(
                &mut s,
                &format!(
                    "CPU at line rate, {} ({line_gbps} Gbit/s or what all sustain, TCP -P \
                     {conns})",
                    wire.label()
                ),
                &|p| cpu_at_rate(run(set, p, Workload::TcpPaced, conns), cores),
                "-",
            );
        }
    }
    s.push_str(&line_rate_note(pacing));
    s
}

/// What the "CPU at line rate" rows compare, and how their loads were
/// made equal.
fn line_rate_note(pacing: Pacing) -> String {
    format!(
        "\n\"CPU at line rate\": every path carries the same paced TCP load (the rate split \
         over the streams, each paced {}), so the difference in softirq time is the router's \
         (softirq time is the whole machine's: the end hosts' share, pacing included, is the \
         same on every path). \
         The rows \"XDP cables\" are measured on the cabled topology (an XDP cable namespace \
         on each side of the router, see \"A fairer wire for TCP\"): the router receives \
         frames as from a NIC, and the goal is judged on them. The rows \"plain veth\" are \
         the main topology's, where native XDP copies every cloned TCP skb \
         (`skb_pp_cow_data`) before the program runs, a cost a NIC does not add; they are \
         kept for transparency. \
         The offered rate is TCP payload (what iperf2 paces) and so is the carried rate it \
         is compared with: the bytes into the server's interface times 1448/1514 (a \
         full-size segment's payload in its frame). \
         Where a path carried less than 95 % of the offered rate (the shared cores could not \
         generate it), all paths were run again at 90 % of the lowest carried rate, up to \
         {PACED_ROUNDS} rounds in all within the run's time budget, and the cell shows the \
         rate of the last round; a point whose unpaced run (same streams, same wire) carried \
         less than 95 % of the line rate on a path started at 90 % of that. A cell still \
         marked below the offered rate is at unequal loads: its row compares nothing, and the \
         goal counts it as not met. \
         Throughput rows: bytes into the server's interface (on the plain veths a frame the \
         fast path redirected counts its 14-byte Ethernet header there, one the kernel \
         forwarded does not: the xdp and offload figures read about 1 % high against the \
         kernel's); latency: ping through the router during the load.\n\n",
        match pacing {
            Pacing::Auto =>
                "by iperf2's `-b` up to 100 streams and by the kernel above \
                             (iperf2 `--fq-rate`: `-b` polls for tokens every few microseconds \
                             per stream, which with 1000 streams fills the shared cores), \
                             `--pacing auto`",
            Pacing::Fq => "by the kernel: iperf2 `--fq-rate`, `--pacing fq`",
            Pacing::Iperf => "by iperf2's `-b`, `--pacing iperf`",
        }
    )
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

/// "CPU at line rate" for `path` (xdp: the goal; offload: ours
/// beside it): its softirq time below the kernel's at every paced point
/// measured on both, at equal loads (both sustained the same offered
/// rate; a point at unequal loads is not met); per connection count on the
/// cables where both ran it, else on the plain veths (each part says
/// which).
pub fn line_rate_goal(runs: &[RunResult], cable: &[RunResult], path: DataPath) -> Goal {
    let is_paced_kernel =
        |k: &&RunResult| k.path == DataPath::Kernel && k.point.workload == Workload::TcpPaced;
    let mut conns: Vec<u32> = runs
        .iter()
        .chain(cable)
        .filter(is_paced_kernel)
        .map(|k| k.point.conns)
        .collect();
    conns.sort_unstable();
    conns.dedup();
    let mut parts = Vec::new();
    let mut met = None;
    for c in conns {
        // The kernel's run and the path's at this count, cables first.
        let found = paced_sets(runs, cable).into_iter().find_map(|(wire, set)| {
            let k = set
                .iter()
                .filter(is_paced_kernel)
                .find(|k| k.point.conns == c)?;
            let x = set.iter().find(|x| x.path == path && x.point == k.point)?;
            Some((wire, k, x))
        });
        let Some((wire, k, x)) = found else {
            continue;
        };
        let equal = k.sustained() && x.sustained() && k.offered_mbps == x.offered_mbps;
        met = Some(met.unwrap_or(true) && equal && x.softirq_pct < k.softirq_pct);
        let unequal = if equal {
            String::new()
        } else {
            format!(
                " **unequal loads** (carried: kernel {:.0}, {} {:.0} Mbit/s of payload),",
                k.carried_payload_mbps(),
                path.name(),
                x.carried_payload_mbps()
            )
        };
        parts.push(format!(
            "{}, -P {} at {} Mbit/s:{unequal} {} {:.0} % vs kernel {:.0} % softirq",
            wire.label(),
            c,
            k.offered_mbps,
            path.name(),
            x.softirq_pct,
            k.softirq_pct
        ));
    }
    Goal {
        asks: if path == DataPath::Offload {
            "CPU at line rate, offload mode (our addition beside the issue's xdp goal; the same \
             points and loads): offload's router softirq time below the kernel's at every \
             point, at equal loads"
        } else {
            "CPU at line rate (paced TCP, the same offered load on every path; between XDP \
             cables where they ran, else on plain veth): xdp's router softirq time below the \
             kernel's at every point, at equal loads (every path carried >= 95 % of the \
             offered rate)"
        },
        measured: if parts.is_empty() {
            "-".into()
        } else {
            parts.join("; ")
        },
        met,
    }
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::model::FastPathShare;

    #[test]
    fn the_table_shows_its_rows_points_only() {
        let both = [Offload::Off, Offload::On];
        assert!(shows(Point::new(Workload::Tcp, 100, Offload::Off), &both));
        // Offload on only where off did not run.
        assert!(!shows(Point::new(Workload::Tcp, 100, Offload::On), &both));
        assert!(shows(
            Point::new(Workload::Tcp, 100, Offload::On),
            &[Offload::On]
        ));
        assert!(!shows(Point::new(Workload::Tcp, 2000, Offload::Off), &both));
        assert!(shows(
            Point::new(Workload::TcpSmall, 2000, Offload::Off),
            &both
        ));
        let nodelay = Point {
            nodelay: true,
            ..Point::new(Workload::TcpSmall, 2000, Offload::Off)
        };
        assert!(!shows(nodelay, &both));
        assert!(shows(
            Point::new(Workload::TcpPaced, 1000, Offload::Off),
            &both
        ));
        assert!(!shows(
            Point::new(Workload::UdpSmall, 1, Offload::Off),
            &both
        ));
    }

    fn paced(path: DataPath, conns: u32, softirq_pct: f64) -> RunResult {
        let mut r = RunResult::blank(path, Point::new(Workload::TcpPaced, conns, Offload::Off));
        r.softirq_pct = softirq_pct;
        r.offered_mbps = 2500;
        // 2500 Mbit/s of payload, counted in frames at the sink.
        r.gbps = 2.5 / crate::model::PAYLOAD_PER_WIRE_BYTE;
        r
    }

    #[test]
    fn line_rate_goal_is_xdp_below_the_kernel_with_offload_beside_it() {
        let mut runs = vec![
            paced(DataPath::Kernel, 1, 30.0),
            paced(DataPath::Xdp, 1, 10.0),
            paced(DataPath::Offload, 1, 12.0),
        ];
        let xdp = |runs: &[RunResult]| line_rate_goal(runs, &[], DataPath::Xdp);
        let offload = |runs: &[RunResult]| line_rate_goal(runs, &[], DataPath::Offload);
        assert_eq!(xdp(&runs).met, Some(true));
        assert_eq!(
            xdp(&runs).measured,
            "plain veth, -P 1 at 2500 Mbit/s: xdp 10 % vs kernel 30 % softirq"
        );
        assert!(xdp(&runs).asks.contains("xdp's router softirq time below"));
        assert_eq!(
            offload(&runs).measured,
            "plain veth, -P 1 at 2500 Mbit/s: offload 12 % vs kernel 30 % softirq"
        );
        assert!(
            offload(&runs)
                .asks
                .contains("our addition beside the issue's xdp goal")
        );
        // Offload above the kernel at -P 100 fails its own row only.
        runs.push(paced(DataPath::Kernel, 100, 20.0));
        runs.push(paced(DataPath::Xdp, 100, 15.0));
        runs.push(paced(DataPath::Offload, 100, 21.0));
        assert_eq!(
            (xdp(&runs).met, offload(&runs).met),
            (Some(true), Some(false))
        );
        // Without the offload runs, offload's row is not measured.
        runs.retain(|r| r.path != DataPath::Offload);
        assert_eq!((xdp(&runs).met, offload(&runs).met), (Some(true), None));
        assert_eq!(xdp(&[paced(DataPath::Kernel, 1, 30.0)]).met, None);
    }

    #[test]
    fn a_point_at_unequal_loads_is_not_met() {
        // xdp below the kernel, but the kernel carried only 2000 of 2500.
        let mut runs = vec![
            paced(DataPath::Kernel, 1000, 30.0),
            paced(DataPath::Xdp, 1000, 10.0),
        ];
        runs[0].gbps = 2.0;
        let g = line_rate_goal(&runs, &[], DataPath::Xdp);
        assert_eq!(g.met, Some(false));
        assert_eq!(
            g.measured,
            "plain veth, -P 1000 at 2500 Mbit/s: **unequal loads** (carried: kernel 1913, xdp \
             2500 Mbit/s of payload), xdp 10 % vs kernel 30 % softirq"
        );
        // Both sustained, but different rates (not the same round).
        runs[0].gbps = 1.5;
        runs[0].offered_mbps = 1500;
        assert_eq!(line_rate_goal(&runs, &[], DataPath::Xdp).met, Some(false));
        // The same round, both sustained: met.
        runs[1].gbps = 1.5;
        runs[1].offered_mbps = 1500;
        assert_eq!(line_rate_goal(&runs, &[], DataPath::Xdp).met, Some(true));
        // The table marks the cell.
        runs[0].gbps = 1.0;
        let md = review_section(&runs, &[], 2.0, (2500, Pacing::Fq));
        assert!(
            md.contains(
                "0.96 of 1.5 Gbit/s of payload offered **below the offered rate: unequal loads**"
            ),
            "{md}"
        );
    }

    fn on_cables(mut r: RunResult) -> RunResult {
        r.wire = Wire::Cable;
        r
    }

    #[test]
    fn line_rate_goal_takes_the_cables_where_they_ran() {
        // Plain veth: xdp above the kernel at -P 1 (veth's skb copy), below
        // at -P 100.
        let veth = vec![
            paced(DataPath::Kernel, 1, 30.0),
            paced(DataPath::Xdp, 1, 40.0),
            paced(DataPath::Kernel, 100, 30.0),
            paced(DataPath::Xdp, 100, 20.0),
        ];
        let xdp =
            |veth: &[RunResult], cable: &[RunResult]| line_rate_goal(veth, cable, DataPath::Xdp);
        assert_eq!(xdp(&veth, &[]).met, Some(false));
        // The cables at -P 1 replace the veth's -P 1; -P 100 stays veth's.
        let cable = vec![
            on_cables(paced(DataPath::Kernel, 1, 30.0)),
            on_cables(paced(DataPath::Xdp, 1, 10.0)),
        ];
        let g = xdp(&veth, &cable);
        assert_eq!(g.met, Some(true), "{}", g.measured);
        assert_eq!(
            g.measured,
            "XDP cables, -P 1 at 2500 Mbit/s: xdp 10 % vs kernel 30 % softirq; plain veth, -P \
             100 at 2500 Mbit/s: xdp 20 % vs kernel 30 % softirq"
        );
        // A cable kernel run with no other path to compare falls back to veth.
        let g = xdp(&veth, &cable[..1]);
        assert_eq!(g.met, Some(false), "{}", g.measured);
    }

    #[test]
    fn the_table_has_cable_and_veth_line_rate_rows() {
        let veth = vec![paced(DataPath::Kernel, 1, 30.0)];
        let rows = |md: &str| -> Vec<String> {
            md.lines()
                .filter(|l| l.starts_with("| CPU at line rate"))
                .map(|l| l.split(" (").next().unwrap_or_default().to_owned())
                .collect()
        };
        // No cable runs: the plain-veth rows alone.
        assert_eq!(
            rows(&review_section(&veth, &[], 2.0, (2500, Pacing::Fq))),
            ["| CPU at line rate, plain veth"; 3]
        );
        let cable = vec![on_cables(paced(DataPath::Xdp, 1, 10.0))];
        let md = review_section(&veth, &cable, 2.0, (2500, Pacing::Fq));
        let mut want = vec!["| CPU at line rate, XDP cables"; 3];
        want.extend(["| CPU at line rate, plain veth"; 3]);
        assert_eq!(rows(&md), want);
        // Each row's cells come from its own topology's runs.
        let first = md
            .lines()
            .find(|l| l.starts_with("| CPU at line rate, XDP cables"))
            .unwrap();
        assert!(
            first.contains("| - | 0.20 s/s softirq (10 % of the machine"),
            "{first}"
        );
        let veth_row = md
            .lines()
            .find(|l| l.starts_with("| CPU at line rate, plain veth"))
            .unwrap();
        assert!(veth_row.contains("| 0.60 s/s softirq (30 %"), "{veth_row}");
    }

    #[test]
    fn the_offload_column_is_filled_from_its_runs() {
        let mut runs = Vec::new();
        for (path, gbps) in [
            (DataPath::Kernel, 1.0),
            (DataPath::Xdp, 2.0),
            (DataPath::Offload, 3.0),
        ] {
            let mut r = RunResult::blank(path, Point::new(Workload::Tcp, 1, Offload::Off));
            r.gbps = gbps;
            if path == DataPath::Offload {
                r.fast_path = Some(FastPathShare {
                    xdp_pkts: 999,
                    kernel_pkts: 1,
                    ..FastPathShare::default()
                });
            }
            runs.push(r);
        }
        let md = review_section(&runs, &[], 2.0, (2500, Pacing::Fq));
        assert!(!md.contains("not a bench path"), "{md}");
        let row = md
            .lines()
            .find(|l| l.starts_with("| single-connection throughput"))
            .unwrap();
        assert_eq!(
            row,
            "| single-connection throughput | 1.00 Gbit/s (offload off) | 2.00 Gbit/s (offload \
             off) | 3.00 Gbit/s (offload off); XDP carried 99.9 % | - |"
        );
    }
}
