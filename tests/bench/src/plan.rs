//! `--plan`: the runs a benchmark would make with the options in force,
//! phase by phase, and how long each phase should take, without running
//! anything (no root needed). The run-time budgets (`--quick` under 3
//! minutes, a full run under 15 on a 2-core machine) are checked against
//! this estimate in the unit tests; a run prints each phase's real time
//! (`bench: phase ... took`) and results.json keeps them
//! (`settings.phase_s`), which is what the constants here were fitted to.

use std::fmt::Write as _;

use crate::cli::Opts;
use crate::model::Wire;
use crate::model::{Offload, Point, Workload};
use crate::run::{
    CRYPTO_SECS, PACED_ROUNDS, cable_conn_rate, cable_points, conn_rate_rounds, estimate,
    ipv6_live_flows, mmss, paths_of,
};
use crate::workloads::{bigtable, cable, connrate, frags};

// Fitted on `--quick` runs on the shared 2-core VM (load average 2 to 5
// from other work; `settings.phase_s` of results.json) and one full
// micro-benchmark: a loaded machine's figures, so that the budgets hold
// when others run too.

/// Real time of an iperf2 run over [`estimate`] (which the time-left
/// display scales by itself): its 2 s of overhead are generous.
const IPERF_FIT: f64 = 0.8;
/// A live-generator run besides its `--secs`: switching, quiet wait,
/// counters, seconds.
const LIVE_EXTRA_S: f64 = 1.0;
/// A fresh topology (namespaces, links, addresses, neighbours) and its
/// teardown, seconds.
const TOPOLOGY_S: f64 = 1.5;
/// A connection-setup-rate run besides its seconds: switching the path,
/// connecting the workers, the counters (the cables' kernel path also
/// attaches its `XDP_PASS` program), seconds. The last full and quick runs
/// took 1.0 s per run besides their seconds.
const CONN_RATE_EXTRA_S: f64 = 1.5;
/// A flows row besides its `--secs`: attaching with a table of 1.5x the
/// large one's capacity (allocating the map), the live run's overhead.
const FLOWS_ROW_EXTRA_S: f64 = 5.5;
/// Writing a million flows into the XDP table (batch update), seconds.
const FILL_S_PER_MILLION: f64 = 3.0;
/// `openssl speed` besides its `-seconds` per block size, seconds.
const CRYPTO_EXTRA_S: f64 = 0.2;
/// The micro-benchmark: per per-call sample over all its cases (the
/// debug-built harness dominates; the amortised runs are milliseconds),
/// seconds.
const MICRO_S_PER_CALL: f64 = 0.002_3;
const MICRO_BASE_S: f64 = 0.5;

/// An iperf2 run of `p`, seconds.
fn iperf_secs(secs: u32, p: Point) -> f64 {
    IPERF_FIT * estimate(secs, p)
}

/// A live-generator run, seconds.
fn live_secs(secs: u32) -> f64 {
    f64::from(secs) + LIVE_EXTRA_S
}

/// A run of `p` of whichever generator, seconds.
fn run_secs(secs: u32, p: Point) -> f64 {
    if p.workload == Workload::UdpLive {
        live_secs(secs)
    } else {
        iperf_secs(secs, p)
    }
}

/// The connection setup rate's rounds: (runs, seconds, what they run).
fn conn_rate_of(plan: &connrate::Rounds) -> (usize, f64, String) {
    let runs = plan.runs();
    let paths: Vec<&str> = plan.paths().iter().map(|p| p.name()).collect();
    (
        runs,
        runs as f64 * (f64::from(plan.secs) + CONN_RATE_EXTRA_S),
        format!(
            "connection setup rate, {}: {} parallel clients, {} round(s) of {} alternating, \
             {} s each",
            plan.wire.label(),
            plan.workers,
            plan.reps,
            paths.join(", "),
            plan.secs
        ),
    )
}

/// One phase of the run as planned.
#[derive(Debug)]
pub struct Phase {
    pub name: &'static str,
    /// Measured runs (each on one path); 0 for a phase of other work.
    pub runs: usize,
    /// Estimated wall time, seconds.
    pub secs: f64,
    /// What it runs, one line per point or part.
    pub detail: Vec<String>,
}

/// The points of `points` on their paths: (runs, seconds, one line each).
fn runs_of(
    secs: u32,
    points: &[Point],
    paths: impl Fn(Point) -> Vec<&'static str>,
) -> (usize, f64, Vec<String>) {
    let mut runs = 0;
    let mut total = 0.0;
    let mut lines = Vec::new();
    for &p in points {
        let on = paths(p);
        let each = run_secs(secs, p);
        runs += on.len();
        total += each * on.len() as f64;
        lines.push(format!("{p}: {} (~{each:.0} s each)", on.join(", ")));
    }
    (runs, total, lines)
}

/// One TCP stream, offload `offload`.
fn one_stream(offload: Offload) -> Point {
    Point::new(Workload::Tcp, 1, offload)
}

/// The phases of a run with `o`, in run order, as the bench decides them
/// (it also assumes the live-frame generator works, Linux >= 5.18, and
/// that no paced point has to run again at a lower rate: such reruns take
/// at most [`paced_rerun_budget_s`] more).
#[expect(
    clippy::too_many_lines,
    reason = "one block per phase, in the bench's order"
)]
pub fn phases(o: &Opts) -> Vec<Phase> {
    let has = |w| o.workloads.contains(&w);
    let live_on = has(Workload::UdpLive);
    let mut v = Vec::new();

    let one_size = o.smoke || o.only_conn_rate;
    let (sizes, crypto_s) = (if one_size { 1 } else { 6 }, CRYPTO_SECS);
    v.push(Phase {
        name: "platform",
        runs: 0,
        secs: f64::from(sizes) * (f64::from(crypto_s) + CRYPTO_EXTRA_S),
        detail: vec![format!(
            "openssl speed chacha20-poly1305: {sizes} block size(s) x {crypto_s} s"
        )],
    });

    let points = o.points();
    let (runs, total, detail) = runs_of(o.secs, &points, |p| {
        paths_of(o, p).iter().map(|d| d.name()).collect()
    });
    v.push(Phase {
        name: "points",
        runs,
        secs: total,
        detail,
    });

    if o.conn_rate {
        let (runs, secs, detail) = conn_rate_of(&conn_rate_rounds(o, Wire::Veth));
        v.push(Phase {
            name: "conn-rate",
            runs,
            secs,
            detail: vec![detail],
        });
    }

    if o.big_table > 0 && live_on {
        let reps = if o.quick { 1 } else { bigtable::FULL_REPS };
        // As `bigtable`'s rows: a quick run the 1000-flow table and the
        // large one; a full run also the large one with 1000 live flows and
        // a table of only the spread's flows. Each large table is filled
        // first; the live traffic spans at most the generator's flows.
        let rows = if o.quick { 2 } else { 4 };
        let large_tables = if o.quick { 1 } else { 2 };
        let per_rep = f64::from(rows) * (f64::from(o.secs) + FLOWS_ROW_EXTRA_S)
            + f64::from(large_tables) * f64::from(o.big_table) / 1e6 * FILL_S_PER_MILLION;
        // The control: every row but the large table with small traffic,
        // in its first repetitions; its one large table filled per row.
        let control_reps = o.flows_control.reps.min(reps);
        let control_rows = rows - u32::from(!o.quick);
        let control_per_rep = f64::from(control_rows) * (f64::from(o.secs) + FLOWS_ROW_EXTRA_S)
            + f64::from(o.big_table) / 1e6 * FILL_S_PER_MILLION;
        let mut detail = vec![format!(
            "{reps} repetition(s) of {rows} rows, xdp, tables of {} and {} flows",
            bigtable::SMALL_TABLE,
            o.big_table
        )];
        if control_reps > 0 {
            detail.push(format!(
                "{control_reps} repetition(s) of {control_rows} rows of the control \
                 (lookup, {}-byte values)",
                o.flows_control.value_size
            ));
        }
        v.push(Phase {
            name: "flows",
            runs: (rows * reps + control_rows * control_reps) as usize,
            secs: f64::from(reps) * per_rep + f64::from(control_reps) * control_per_rep,
            detail,
        });
    }

    if o.frags && has(Workload::Tcp) {
        let n = frags::Attached::ALL.len();
        v.push(Phase {
            name: "frags",
            runs: n,
            secs: n as f64 * iperf_secs(o.secs, one_stream(Offload::On)),
            detail: vec![format!("tcp -P 1, offload on, kernel path, {n} variants")],
        });
    }

    if has(Workload::Tcp) && o.offloads.contains(&Offload::Off) && o.conns.contains(&1) {
        v.push(Phase {
            name: "reference",
            runs: 1,
            secs: TOPOLOGY_S + iperf_secs(o.secs, one_stream(Offload::Off)),
            detail: vec!["tcp -P 1, offload off, plain forwarding (fresh topology)".into()],
        });
    }

    if o.scaling
        && live_on
        && let Some(&flows) = o.live_flows.last()
    {
        // On 1 and on all CPUs (smoke: all only), kernel, xdp and limit.
        let counts = if o.smoke { 1 } else { 2 };
        let runs = counts * 3;
        v.push(Phase {
            name: "scaling",
            runs,
            secs: TOPOLOGY_S + runs as f64 * live_secs(o.secs),
            detail: vec![format!(
                "udp-live, {flows} flows, on {} core count(s) x kernel, xdp, limit (fresh \
                 topology)",
                counts
            )],
        });
    }

    let cabled = cable_points(o);
    if !cabled.is_empty() || cable_conn_rate(o) {
        let (mut runs, mut total, mut detail) = runs_of(o.secs, &cabled, |p| {
            cable::paths_of(p, o.offload_path)
                .iter()
                .map(|d| d.name())
                .collect()
        });
        if cable_conn_rate(o) {
            let (conn_runs, conn_secs, line) = conn_rate_of(&conn_rate_rounds(o, Wire::Cable));
            runs += conn_runs;
            total += conn_secs;
            detail.push(line);
        }
        v.push(Phase {
            name: "cable",
            runs,
            secs: TOPOLOGY_S + total,
            detail,
        });
    }

    let tcp = has(Workload::Tcp);
    if !o.smoke && (tcp || live_on) {
        // As `Bench::ipv6`: --quick one TCP run of 3 s per path, else the
        // kernel again after xdp.
        let (tcp_runs, tcp_secs) = match (tcp, o.quick) {
            (false, _) => (0, 0),
            (true, true) => (2, 3),
            (true, false) => (3, o.secs),
        };
        let live_flows = if live_on {
            ipv6_live_flows(o)
        } else {
            Vec::new()
        };
        let live_s: f64 = live_flows.iter().map(|_| 2.0 * live_secs(o.secs)).sum();
        v.push(Phase {
            name: "ipv6",
            runs: tcp_runs + 2 * live_flows.len(),
            secs: TOPOLOGY_S
                + f64::from(tcp_runs as u32) * iperf_secs(tcp_secs, one_stream(Offload::On))
                + live_s,
            detail: vec![format!(
                "tcp -P 1 x {tcp_runs} runs of {tcp_secs} s; udp-live {live_flows:?} flows on \
                 kernel and xdp"
            )],
        });
    }

    if o.micro {
        v.push(Phase {
            name: "micro",
            runs: 0,
            secs: MICRO_BASE_S + f64::from(o.micro_calls) * MICRO_S_PER_CALL,
            detail: vec![format!(
                "BPF_PROG_RUN: {} calls per case, repeat {}",
                o.micro_calls, o.micro_repeat
            )],
        });
    }
    v
}

/// The planned seconds of one round of paced `point` on `paths` paths.
pub fn paced_round_secs(secs: u32, point: Point, paths: usize) -> f64 {
    paths as f64 * iperf_secs(secs, point)
}

/// Every rerun the paced points could make: each point, on the plain veths
/// and between the cables, run [`PACED_ROUNDS`] - 1 more times, seconds.
fn all_paced_reruns_secs(o: &Opts) -> f64 {
    let paced = |p: &Point| p.workload == Workload::TcpPaced;
    let veth = o
        .points()
        .into_iter()
        .filter(paced)
        .map(|p| paced_round_secs(o.secs, p, paths_of(o, p).len()));
    let cabled = cable_points(o)
        .into_iter()
        .filter(paced)
        .map(|p| paced_round_secs(o.secs, p, cable::paths_of(p, o.offload_path).len()));
    f64::from(PACED_ROUNDS - 1) * veth.chain(cabled).sum::<f64>()
}

/// The run-time budget of issue 16 for `o`'s mode: a full run under 15
/// minutes, `--quick` (and `--smoke`) under 3, seconds.
pub fn run_time_budget_s(o: &Opts) -> f64 {
    if o.quick { 180.0 } else { 900.0 }
}

/// The share of the run-time budget kept free against the estimate's error.
const BUDGET_MARGIN: f64 = 0.01;

/// The planned seconds the paced points' reruns may take in all (each
/// round costs its [`paced_round_secs`]): what the run-time budget leaves
/// after the planned phases, less a margin, and at most every rerun they
/// could make. The bench gives the plain veths half and the cables the
/// rest, so that the worst case stays within the budget.
pub fn paced_rerun_budget_s(o: &Opts) -> f64 {
    let budget = run_time_budget_s(o);
    let left = budget * (1.0 - BUDGET_MARGIN) - total_secs(&phases(o));
    left.clamp(0.0, all_paced_reruns_secs(o))
}

/// The estimated wall time of `phases`, seconds.
pub fn total_secs(phases: &[Phase]) -> f64 {
    phases.iter().map(|p| p.secs).sum()
}

/// What `--plan` prints.
pub fn render(o: &Opts) -> String {
    let phases = phases(o);
    let mode = if o.smoke {
        "--smoke"
    } else if o.quick {
        "--quick"
    } else {
        "full run"
    };
    let mut s = format!(
        "Planned ({mode}, {} s per run; estimates fitted on a 2-core VM, a loaded machine \
         takes longer):\n\n",
        o.secs
    );
    for p in &phases {
        let runs = if p.runs > 0 {
            format!("{:>3} runs", p.runs)
        } else {
            "        ".to_owned()
        };
        let _ = writeln!(s, "{:<10} {runs}  ~{}", p.name, mmss(p.secs));
        for d in &p.detail {
            let _ = writeln!(s, "    {d}");
        }
    }
    let _ = writeln!(
        s,
        "\ntotal      {:>3} runs  ~{} (+ build; paced points run again at a lower rate where \
         a path did not sustain the offered one, up to {PACED_ROUNDS} rounds each, within \
         ~{} more in all)",
        phases.iter().map(|p| p.runs).sum::<usize>(),
        mmss(total_secs(&phases)),
        mmss(paced_rerun_budget_s(o))
    );
    s
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::cli::opts_of as opts;

    fn phase<'a>(phases: &'a [Phase], name: &str) -> Option<&'a Phase> {
        phases.iter().find(|p| p.name == name)
    }

    #[test]
    fn the_plan_counts_the_runs_the_bench_makes() {
        let full = opts(&[]);
        let ph = phases(&full);
        let points = phase(&ph, "points").unwrap();
        let want: usize = full
            .points()
            .iter()
            .map(|&p| paths_of(&full, p).len())
            .sum();
        assert_eq!(points.runs, want);
        assert_eq!(points.detail.len(), full.points().len());
        // The cables: unpaced tcp and -l 128 on kernel and xdp, the paced
        // points on the offload path too, then a round of the connection
        // setup rate on kernel, xdp and offload, as on the plain veths.
        let cabled = cable_points(&full);
        let paced = cabled
            .iter()
            .filter(|p| p.workload == Workload::TcpPaced)
            .count();
        let cable = phase(&ph, "cable").unwrap();
        assert_eq!(cable.runs, 2 * cabled.len() + paced + 3);
        assert_eq!(phase(&ph, "conn-rate").unwrap().runs, 3);
        assert!(
            cable.detail.last().unwrap().starts_with(
                "connection setup rate, XDP cables: 16 parallel clients, 1 round(s) of kernel, \
                 xdp, offload alternating, 2 s each"
            ),
            "{:?}",
            cable.detail
        );
        // Without the connection setup rate, or the offload path, the
        // cables run what they did.
        let no_conn = phases(&opts(&["--no-conn-rate"]));
        assert_eq!(
            phase(&no_conn, "cable").unwrap().runs,
            2 * cabled.len() + paced
        );
        let no_offload = phases(&opts(&["--no-offload", "--conn-rate-reps", "2"]));
        assert_eq!(
            phase(&no_offload, "cable").unwrap().runs,
            2 * cabled.len() + 4
        );
        // Options that leave a phase out leave it out of the plan.
        let lean = phases(&opts(&["--no-cable", "--no-micro", "--no-big-table"]));
        for name in ["cable", "micro", "flows"] {
            assert!(phase(&lean, name).is_none(), "{name} still planned");
        }
        let smoke = phases(&opts(&["--smoke"]));
        assert!(phase(&smoke, "ipv6").is_none());
        assert!(render(&opts(&["--quick"])).contains("\ntotal "));
    }

    #[test]
    fn the_defaults_fit_the_run_time_budgets() {
        // --quick under 3 minutes, a full run under 15 (issue 16), with a
        // margin: the fit is a loaded machine's (load average 3 to 5 on 2
        // cores), where a quiet one ran about 12 % faster.
        let quick_s = total_secs(&phases(&opts(&["--quick"])));
        assert!(quick_s < 165.0, "--quick planned at {}", mmss(quick_s));
        let full = opts(&[]);
        let planned = total_secs(&phases(&full));
        assert!(planned < 810.0, "a full run planned at {}", mmss(planned));
        // Even with every rerun of the paced points their budget allows.
        for (mode, args) in [("a full run", &[][..]), ("--quick", &["--quick"])] {
            let o = opts(args);
            let worst = total_secs(&phases(&o)) + paced_rerun_budget_s(&o);
            assert!(
                worst < run_time_budget_s(&o),
                "{mode} with every paced rerun: {}",
                mmss(worst)
            );
        }
        // The budget buys reruns where they are needed: a full run's plain
        // veths (half the budget) and cables (the other half) two each of
        // the 1000-stream point, which the shared cores cannot generate at
        // the line rate; --quick one of the cables' single stream.
        let round = |o: &Opts, conns, paths| {
            paced_round_secs(
                o.secs,
                Point::new(Workload::TcpPaced, conns, Offload::Off),
                paths,
            )
        };
        let half = paced_rerun_budget_s(&full) / 2.0;
        assert!(half >= 2.0 * round(&full, 1000, 3), "{half} s per wire");
        let quick = opts(&["--quick"]);
        assert!(paced_rerun_budget_s(&quick) >= round(&quick, 1, 3));
        // Never more than every rerun, never negative: a plan past the
        // budget (long runs) has no reruns.
        assert!(paced_rerun_budget_s(&opts(&["--secs", "30"])) == 0.0);
        let paced_only = opts(&["--workloads", "tcp-paced", "--no-cable", "--no-micro"]);
        assert!(
            (paced_rerun_budget_s(&paced_only) - all_paced_reruns_secs(&paced_only)).abs() < 1e-9
        );
        let smoke = total_secs(&phases(&opts(&["--smoke"])));
        assert!(
            smoke < quick_s,
            "--smoke {} vs --quick {}",
            mmss(smoke),
            mmss(quick_s)
        );
    }

    #[test]
    fn the_flows_control_adds_its_rows_to_the_plan() {
        let flows = |args: &[&str]| {
            let ph = phases(&opts(args));
            let p = phase(&ph, "flows").expect("flows planned");
            (p.runs, p.secs)
        };
        let (runs, secs) = flows(&[]);
        let (with_runs, with_secs) = flows(&["--flows-control-reps", "1"]);
        // Every row but the large table with small traffic, within a minute.
        assert_eq!(with_runs, runs + 3);
        assert!(
            with_secs > secs && with_secs - secs < 60.0,
            "{with_secs} vs {secs}"
        );
        let (quick, _) = flows(&["--quick"]);
        assert_eq!(
            flows(&["--quick", "--flows-control-reps", "3"]).0,
            quick + 2
        );
        assert_eq!(flows(&["--smoke"]).0, 4);
    }
}
