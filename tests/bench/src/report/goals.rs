//! The performance goals of the benchmark issue, evaluated on this run's
//! figures (never asserted: speed belongs here, not in tests).

use std::fmt::Write as _;

use crate::model::{DataPath, Offload, Point, RunResult, Workload};
use crate::workloads::connrate;
use crate::workloads::micro::Case;

fn find(runs: &[RunResult], path: DataPath, p: Point) -> Option<&RunResult> {
    runs.iter().find(|r| r.path == path && r.point == p)
}

/// One goal: what it asks, what this run measured, and whether it holds
/// (`None`: not measured in this run).
pub struct Goal {
    pub(super) asks: &'static str,
    pub(super) measured: String,
    pub(super) met: Option<bool>,
}

/// Every goal, evaluated on this run's figures.
pub fn evaluate(runs: &[RunResult], micro: &[Case], fwd: Option<&RunResult>) -> Vec<Goal> {
    // Every point measured on both paths.
    let pairs: Vec<(&RunResult, &RunResult)> = runs
        .iter()
        .filter(|x| x.path == DataPath::Xdp)
        .filter_map(|x| Some((find(runs, DataPath::Kernel, x.point)?, x)))
        .collect();
    vec![
        cost_goal(&pairs),
        live_pps_goal(&pairs, runs),
        limit_goal(runs),
        single_stream_goal(runs, fwd),
        small_writes_goal(runs),
        latency_goal(&pairs),
        hit_cost_goal(micro),
    ]
}

/// router ns/packet, on every point measured on both paths.
fn cost_goal(pairs: &[(&RunResult, &RunResult)]) -> Goal {
    let cost: Vec<(String, f64)> = pairs
        .iter()
        .filter(|(k, x)| k.router_ns_per_pkt > 0.0 && x.router_ns_per_pkt > 0.0)
        .map(|(k, x)| {
            (
                x.point.to_string(),
                k.router_ns_per_pkt / x.router_ns_per_pkt,
            )
        })
        .collect();
    let best = cost.iter().max_by(|a, b| a.1.total_cmp(&b.1));
    let worst = cost.iter().min_by(|a, b| a.1.total_cmp(&b.1));
    Goal {
        asks: "router ns/packet: xdp >= 5x lower than kernel NAT on every workload",
        measured: match (worst, best) {
            (Some(w), Some(b)) => format!(
                "kernel/xdp from {:.2}x ({}) to {:.2}x ({}); >= 5x on {} of {} points",
                w.1,
                w.0,
                b.1,
                b.0,
                cost.iter().filter(|c| c.1 >= 5.0).count(),
                cost.len()
            ),
            _ => "-".into(),
        },
        met: worst.map(|w| w.1 >= 5.0),
    }
}

/// 64-byte UDP pps from the in-kernel generator, next to what the limit
/// (no NAT at all) reached against the kernel on the same points: the
/// generator and the sink share the router's CPU, so no forwarder can
/// exceed that ratio on this topology.
fn live_pps_goal(pairs: &[(&RunResult, &RunResult)], runs: &[RunResult]) -> Goal {
    let live_ratios: Vec<(u32, f64, Option<f64>)> = pairs
        .iter()
        .filter(|(k, _)| k.point.workload == Workload::UdpLive && k.pps > 0.0)
        .map(|(k, x)| {
            let limit = find(runs, DataPath::Limit, k.point)
                .filter(|l| l.pps > 0.0)
                .map(|l| l.pps / k.pps);
            (k.point.conns, x.pps / k.pps, limit)
        })
        .collect();
    let live: Vec<String> = live_ratios
        .iter()
        .map(|(c, r, limit)| match limit {
            Some(l) => format!("{r:.2}x at {c} flow(s) (the limit: {l:.2}x)"),
            None => format!("{r:.2}x at {c} flow(s)"),
        })
        .collect();
    let live_min = live_ratios.iter().map(|r| r.1).reduce(f64::min);
    Goal {
        asks: "UDP 64-byte pps through the router (fast generator): xdp >= 5x kernel",
        measured: if live.is_empty() {
            "-".into()
        } else {
            format!(
                "xdp/kernel Mpps {} (in-kernel generator; the limit, a forwarder without NAT, \
                 bounds what any path reaches against the kernel here)",
                live.join(", ")
            )
        },
        met: live_min.map(|m| m >= 5.0),
    }
}

/// xdp NAT against the limit (minimal forwarder) on the live generator.
fn limit_goal(runs: &[RunResult]) -> Goal {
    let shares: Vec<(u32, f64)> = runs
        .iter()
        .filter(|l| l.path == DataPath::Limit && l.pps > 0.0)
        .filter_map(|l| {
            Some((
                l.point.conns,
                find(runs, DataPath::Xdp, l.point)?.pps / l.pps,
            ))
        })
        .collect();
    Goal {
        asks: "UDP 64-byte pps (fast generator): xdp NAT >= 90 % of the limit (a minimal \
               fib-lookup + redirect forwarder, no NAT)",
        measured: if shares.is_empty() {
            "-".into()
        } else {
            shares
                .iter()
                .map(|(c, x)| format!("{:.0} % at {c} flow(s)", x * 100.0))
                .collect::<Vec<_>>()
                .join(", ")
        },
        met: shares
            .iter()
            .map(|s| s.1)
            .reduce(f64::min)
            .map(|m| m >= 0.9),
    }
}

/// One TCP stream against plain forwarding.
fn single_stream_goal(runs: &[RunResult], fwd: Option<&RunResult>) -> Goal {
    let single = Point::new(Workload::Tcp, 1, Offload::Off);
    let xdp1 = find(runs, DataPath::Xdp, single);
    Goal {
        asks: "TCP single stream, offloads off: xdp NAT at least as fast as plain kernel \
               forwarding without netfilter",
        measured: match (xdp1, fwd) {
            (Some(x), Some(f)) => format!(
                "xdp NAT {:.2} Gbit/s, plain forwarding {:.2} Gbit/s ({:.2}x){}",
                x.gbps,
                f.gbps,
                x.gbps / f.gbps,
                find(runs, DataPath::Kernel, single)
                    .map(|k| format!(", kernel NAT {:.2} Gbit/s", k.gbps))
                    .unwrap_or_default()
            ),
            _ => "-".into(),
        },
        met: match (xdp1, fwd) {
            (Some(x), Some(f)) => Some(x.gbps >= f.gbps),
            _ => None,
        },
    }
}

/// `-l 128` at 1000 and 2000 connections.
fn small_writes_goal(runs: &[RunResult]) -> Goal {
    let small = |conns| Point::new(Workload::TcpSmall, conns, Offload::Off);
    let small1 = find(runs, DataPath::Xdp, small(1));
    let mut parts = Vec::new();
    let mut ok = Some(true);
    for c in [1000, 2000] {
        match (
            find(runs, DataPath::Kernel, small(c)),
            find(runs, DataPath::Xdp, small(c)),
            small1,
        ) {
            (Some(k), Some(x), Some(x1)) => {
                parts.push(format!(
                    "-P {c}: xdp {:.2} vs kernel {:.2} Gbit/s ({:.2}x), {:.0}% of xdp's -P 1 \
                     ({:.2})",
                    x.gbps,
                    k.gbps,
                    x.gbps / k.gbps,
                    x.gbps * 100.0 / x1.gbps,
                    x1.gbps
                ));
                // "Clearly ahead": at least 10 % more.
                ok = ok.map(|o| o && x.gbps >= 1.1 * k.gbps && x.gbps >= 0.9 * x1.gbps);
            }
            _ => ok = None,
        }
    }
    Goal {
        asks: "TCP `-l 128` (offload off) at 1000 and 2000 connections: xdp clearly ahead of \
               kernel (here: >= 1.1x) and within 10 % of its own single-connection figure",
        measured: if parts.is_empty() {
            "-".into()
        } else {
            parts.join("; ")
        },
        met: ok,
    }
}

/// A run's p99 in ms for the goal's text: "lost" when more than 1 % of
/// its pings were (a lost echo counts as slower than any answered one).
fn p99(r: &RunResult) -> String {
    if r.rtt_ms_p99 == f64::INFINITY {
        format!("lost ({:.1} % of pings)", r.ping_loss_pct)
    } else {
        format!("{:.2}", r.rtt_ms_p99)
    }
}

/// p99 latency at 2000 connections (infinite, so never lower, for a run
/// that lost more than 1 % of its pings).
fn latency_goal(pairs: &[(&RunResult, &RunResult)]) -> Goal {
    let at2000: Vec<(&RunResult, &RunResult)> = pairs
        .iter()
        .copied()
        .filter(|(k, _)| k.point.conns == 2000 && !k.point.workload.is_udp())
        .collect();
    Goal {
        asks: "p99 latency under 2000 connections: lower on xdp than on kernel",
        measured: if at2000.is_empty() {
            "-".into()
        } else {
            at2000
                .iter()
                .map(|(k, x)| format!("{}: {} vs {} ms", x.point, p99(x), p99(k)))
                .collect::<Vec<_>>()
                .join("; ")
        },
        met: (!at2000.is_empty()).then(|| at2000.iter().all(|(k, x)| x.rtt_ms_p99 < k.rtt_ms_p99)),
    }
}

/// An established-flow hit against the `XDP_PASS` floor.
fn hit_cost_goal(micro: &[Case]) -> Goal {
    let case = |n: &str| micro.iter().find(|c| c.name == n);
    let hit = ["hit-udp-out", "hit-udp-in", "hit-tcp-out"]
        .iter()
        .filter_map(|n| case(n))
        .map(|c| c.median_ns)
        .reduce(f64::max);
    let floor = case("trivial-pass").map(|c| c.median_ns);
    // The ping-pong figures (the program alone, without the per-call
    // harness), shown beside the per-call goal, which stays the measure.
    let amortised_hit = ["hit-udp-out", "hit-tcp-out"]
        .iter()
        .filter_map(|n| case(n).and_then(|c| c.amortized_ns))
        .reduce(f64::max);
    let amortised_floor = case("trivial-pass").and_then(|c| c.amortized_ns);
    let amortised = match (amortised_hit, amortised_floor) {
        (Some(h), Some(f)) => format!(
            "; amortised, slowest hit {h:.0} ns per iteration vs floor {f:.0} ns ({:.1}x)",
            h / f
        ),
        _ => String::new(),
    };
    Goal {
        asks: "per-packet cost of an established-flow hit within 2x of the XDP_PASS floor",
        measured: match (hit, floor) {
            (Some(h), Some(f)) => format!(
                "slowest hit case {h:.0} ns per call vs floor {f:.0} ns ({:.2}x; the program's \
                 own share {:.0} ns){amortised}",
                h / f,
                h - f
            ),
            _ => "-".into(),
        },
        met: match (hit, floor) {
            (Some(h), Some(f)) => Some(h <= 2.0 * f),
            _ => None,
        },
    }
}

/// Offload's connection rate may fall this far below the kernel's: it is
/// the kernel's setup plus the daemon's offload work per connection.
const OFFLOAD_SETUP_MIN: f64 = 0.9;

/// Connection setup rate per path: standalone XDP (which admits flows
/// itself) at least as fast as the kernel, offload (the kernel's setup and
/// the daemon's work) at least 0.9x the kernel. Judged between the XDP
/// cables where they ran (the NIC-like guide), else on the plain veths;
/// both wires are shown.
pub fn conn_setup_goal(rows: &[connrate::Row]) -> Goal {
    let mut parts = Vec::new();
    let mut met = None;
    let mut judged = false;
    for wire in connrate::wires(rows) {
        let rate = |p| connrate::median_rate(rows, wire, p);
        let Some(kernel) = rate(DataPath::Kernel) else {
            continue;
        };
        let mut others = Vec::new();
        let mut wire_met = true;
        for (path, min) in [(DataPath::Xdp, 1.0), (DataPath::Offload, OFFLOAD_SETUP_MIN)] {
            if let Some(x) = rate(path) {
                others.push(format!(
                    "{} {x:.0}/s ({:.2}x kernel)",
                    path.name(),
                    x / kernel
                ));
                wire_met &= x >= min * kernel;
            }
        }
        if others.is_empty() {
            continue;
        }
        if !judged {
            met = Some(wire_met);
            judged = true;
        }
        parts.push(format!(
            "{}: kernel {kernel:.0}/s, {}",
            wire.label(),
            others.join(", ")
        ));
    }
    Goal {
        asks: "Connection setup (short TCP connections, new connections per second; between \
               XDP cables where they ran, else on plain veth): xdp at least the kernel's rate, \
               offload at least 0.9x (the kernel's setup plus the daemon's offload of each \
               connection)",
        measured: if parts.is_empty() {
            "-".into()
        } else {
            parts.join("; ")
        },
        met,
    }
}

/// The Markdown section.
pub fn section(goals: &[Goal]) -> String {
    let mut s = String::from(
        "### Performance goals in this run\n\nThe goals of the benchmark issue, evaluated on \
         the figures above (not asserted anywhere: this machine's numbers are noisy, and the \
         notes below say what limits each).\n\n| goal | measured | met |\n|---|---|---|\n",
    );
    for g in goals {
        let met = match g.met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "not measured",
        };
        let _ = writeln!(s, "| {} | {} | {met} |", g.asks, g.measured);
    }
    s.push('\n');
    s
}

pub fn json(goals: &[Goal]) -> serde_json::Value {
    goals
        .iter()
        .map(|g| serde_json::json!({"goal": g.asks, "measured": g.measured, "met": g.met}))
        .collect()
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::model::Wire;

    fn row(path: DataPath, conns_per_s: f64) -> connrate::Row {
        connrate::Row::sample(path, Wire::Veth, conns_per_s)
    }

    fn live(path: DataPath, flows: u32, mpps: f64) -> RunResult {
        let point = Point::new(Workload::UdpLive, flows, Offload::Off);
        let mut r = RunResult::blank(path, point);
        r.pps = mpps * 1e6;
        r
    }

    /// A TCP run at 2000 connections whose pings had round trips `rtts`
    /// and lost `lost` echoes.
    fn pinged(path: DataPath, rtts: &[f64], lost: u64) -> RunResult {
        let point = Point::new(Workload::TcpSmall, 2000, Offload::Off);
        RunResult::new(
            path,
            point,
            crate::measure::Measured {
                window: crate::measure::sampler::Window::default(),
                pings: Some(crate::measure::parse::Pings {
                    rtts: rtts.to_vec(),
                    lost,
                }),
                run_cpu: crate::measure::sys::CpuTicks::default(),
                router_pkts: 0,
                wall_s: 0.0,
                quiet_wait_s: 0.0,
            },
        )
    }

    #[test]
    fn lost_pings_count_as_slower_than_any_answered_one() {
        let rtts: Vec<f64> = (1..=100).map(f64::from).collect();
        // 2 of 102 lost: the p99 is among them; 1 of 101: it is answered.
        let kernel = pinged(DataPath::Kernel, &rtts[..], 2);
        let xdp = pinged(DataPath::Xdp, &rtts[..], 1);
        assert!(kernel.rtt_ms_p99.is_infinite());
        assert!((xdp.rtt_ms_p99 - 100.0).abs() < 1e-9);
        assert_eq!(
            crate::report::rtt_cell(&kernel, 2),
            "51.00 / lost (2.0 % of pings lost)"
        );
        let g = latency_goal(&[(&kernel, &xdp)]);
        assert_eq!(g.met, Some(true));
        assert!(
            g.measured.ends_with("100.00 vs lost (2.0 % of pings) ms"),
            "{}",
            g.measured
        );
        // Both lost: neither is lower.
        assert_eq!(latency_goal(&[(&kernel, &kernel)]).met, Some(false));
        // Nothing lost: the plain percentiles, no loss note.
        let clean = pinged(DataPath::Xdp, &rtts[..], 0);
        assert_eq!(crate::report::rtt_cell(&clean, 1), "50.0 / 99.0");
    }

    #[test]
    fn live_pps_goal_shows_what_the_limit_reached_against_the_kernel() {
        let runs = [
            live(DataPath::Kernel, 1, 1.0),
            live(DataPath::Xdp, 1, 4.0),
            live(DataPath::Limit, 1, 4.2),
            live(DataPath::Kernel, 1000, 1.0),
            live(DataPath::Xdp, 1000, 5.5),
        ];
        let pairs = [(&runs[0], &runs[1]), (&runs[3], &runs[4])];
        let g = live_pps_goal(&pairs, &runs);
        assert_eq!(g.met, Some(false));
        assert!(
            g.measured.starts_with(
                "xdp/kernel Mpps 4.00x at 1 flow(s) (the limit: 4.20x), 5.50x at 1000 flow(s) ("
            ),
            "{}",
            g.measured
        );
        assert_eq!(live_pps_goal(&pairs[1..], &runs).met, Some(true));
        assert_eq!(live_pps_goal(&[], &runs).measured, "-");
    }

    #[test]
    fn connection_setup_per_path_against_the_kernel() {
        let rows = [
            row(DataPath::Kernel, 1000.0),
            row(DataPath::Xdp, 1200.0),
            row(DataPath::Offload, 950.0),
        ];
        let g = conn_setup_goal(&rows);
        assert_eq!(g.met, Some(true));
        assert_eq!(
            g.measured,
            "plain veth: kernel 1000/s, xdp 1200/s (1.20x kernel), offload 950/s (0.95x kernel)"
        );
        let slow = [row(DataPath::Kernel, 1000.0), row(DataPath::Offload, 500.0)];
        assert_eq!(conn_setup_goal(&slow).met, Some(false));
        assert_eq!(conn_setup_goal(&rows[1..]).met, None);
        assert_eq!(conn_setup_goal(&[]).measured, "-");
        // Alternating rounds: each path's median, whatever the order.
        let rounds = [
            row(DataPath::Kernel, 900.0),
            row(DataPath::Offload, 400.0),
            row(DataPath::Kernel, 1000.0),
            row(DataPath::Offload, 950.0),
            row(DataPath::Kernel, 5000.0),
            row(DataPath::Offload, 920.0),
        ];
        let g = conn_setup_goal(&rounds);
        assert_eq!(
            g.measured,
            "plain veth: kernel 1000/s, offload 920/s (0.92x kernel)"
        );
        assert_eq!(g.met, Some(true));
    }

    #[test]
    fn connection_setup_is_judged_between_the_cables_where_they_ran() {
        let cable = |path, rate| connrate::Row::sample(path, Wire::Cable, rate);
        // Offload short of 0.9x on the plain veths, past it on the cables:
        // the cables decide, both show, cables first.
        let rows = [
            row(DataPath::Kernel, 1000.0),
            row(DataPath::Xdp, 1000.0),
            row(DataPath::Offload, 550.0),
            cable(DataPath::Kernel, 800.0),
            cable(DataPath::Xdp, 900.0),
            cable(DataPath::Offload, 760.0),
        ];
        let g = conn_setup_goal(&rows);
        assert_eq!(
            g.measured,
            "XDP cables: kernel 800/s, xdp 900/s (1.12x kernel), offload 760/s (0.95x kernel); \
             plain veth: kernel 1000/s, xdp 1000/s (1.00x kernel), offload 550/s (0.55x kernel)"
        );
        assert_eq!(g.met, Some(true));
        // And the other way round: met on the plain veths, not on the cables.
        let slow_cables = [
            row(DataPath::Kernel, 1000.0),
            row(DataPath::Offload, 950.0),
            cable(DataPath::Kernel, 1000.0),
            cable(DataPath::Offload, 500.0),
        ];
        assert_eq!(conn_setup_goal(&slow_cables).met, Some(false));
        // Cables without a kernel row: the plain veths decide.
        let no_cable_kernel = [
            row(DataPath::Kernel, 1000.0),
            row(DataPath::Offload, 950.0),
            cable(DataPath::Offload, 500.0),
        ];
        let g = conn_setup_goal(&no_cable_kernel);
        assert_eq!(g.met, Some(true));
        assert!(g.measured.starts_with("plain veth: "), "{}", g.measured);
    }
}
