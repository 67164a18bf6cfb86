//! One benchmark run: the topology, every point on its paths in
//! alternation (retrying runs cut short), then the frags experiment, the
//! plain-forwarding reference and the micro-benchmark, then the artifacts.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tests::Topology;

use crate::cli::Opts;
use crate::measure::platform::{self, CryptoRun};
use crate::measure::sys;
use crate::model::{
    DataPath, Offload, Point, RunResult, SUSTAINED_SHARE, Settings, Wire, Workload,
};
use crate::plan;
use crate::report::{self, Extra, RunEnv, review};
use crate::router::{
    FastPathSample, OffloadCounters, Router, congestion_control, offload_state, unix_now,
};
use crate::workloads::{
    bigtable, cable, connrate, frags, iperf, ipv6, live, micro, reference, scaling,
};

/// Rough duration of one run in seconds, for the time-left estimate.
pub fn estimate(secs: u32, p: Point) -> f64 {
    let ramp = if p.workload.is_udp() {
        0.0
    } else {
        iperf::ramp_secs(p.conns)
    };
    let per_stream = if p.workload == Workload::UdpLive {
        0.0
    } else {
        f64::from(p.conns) * 0.002
    };
    f64::from(secs) + ramp + 2.0 + per_stream
}

pub fn mmss(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    format!("{}m{:02}s", s / 60, s % 60)
}

pub fn show(r: &RunResult) -> String {
    let thr = if r.point.workload.is_udp() {
        format!(
            "{:.3} Mpps received of {:.3} sent ({:.1}% loss)",
            r.pps / 1e6,
            r.sent_pps / 1e6,
            r.loss_pct
        )
    } else if r.iperf_gbps.is_finite() {
        format!("{:.2} Gbit/s (iperf2 says {:.2})", r.gbps, r.iperf_gbps)
    } else {
        format!("{:.2} Gbit/s", r.gbps)
    };
    let mut s = format!(
        "{thr}, rtt p50 / p99 {} ms, cpu {:.0}% (softirq {:.0}%), {:.0} ns/pkt \
         ({:.0} B/pkt) over {:.1} s active of {:.1} s (whole run: cpu {:.0}%, {:.0} ns per \
         forwarded pkt, {} pkts)",
        crate::report::rtt_cell(r, 3),
        r.cpu_pct,
        r.softirq_pct,
        r.router_ns_per_pkt,
        r.router_avg_pkt_bytes,
        r.active_s,
        r.wall_s,
        r.run_cpu_pct,
        r.run_ns_per_pkt,
        r.router_pkts,
    );
    if let Some(h) = &r.host_tcp {
        let _ = write!(
            s,
            ", end hosts: {:.1}% of segments retransmitted, {} timeouts, {} tx drops",
            h.retrans_pct(),
            h.timeouts,
            h.tx_dropped
        );
    }
    if r.backlog_drops > 0 {
        let _ = write!(s, ", {} backlog drops", r.backlog_drops);
    }
    if r.quiet_wait_s > 1.0 {
        let _ = write!(s, ", waited {:.1} s for quiet", r.quiet_wait_s);
    }
    if let Some(fp) = r.fast_path {
        let _ = write!(
            s,
            ", XDP carried {} of {} forwarded pkts ({:.1} %{}), {} flows offloaded{}",
            fp.xdp_pkts,
            fp.xdp_pkts + fp.kernel_pkts,
            fp.xdp_pct(),
            fp.steady_xdp_pct
                .map(|p| format!("; {p:.1} % once all were offloaded"))
                .unwrap_or_default(),
            fp.flows_offloaded,
            fp.peak_flows
                .map(|n| format!(" (at most {n} in the table at once)"))
                .unwrap_or_default()
        );
    }
    if r.cut_short {
        s.push_str(" [cut short]");
    }
    for n in &r.notes {
        let _ = write!(s, "; {n}");
    }
    s
}

/// The paths a point runs on: the limit only under the live generator
/// (iperf2 cannot load it, and it has no NAT for replies); offload only on
/// the review table's points (TCP, where it has a column; iperf2's UDP has
/// no reply direction, so the daemon would offload none of its flows).
pub fn paths_of(o: &Opts, p: Point) -> Vec<DataPath> {
    let mut paths = vec![DataPath::Kernel, DataPath::Xdp];
    if p.workload == Workload::UdpLive {
        paths.push(DataPath::Limit);
    }
    let veth_offloads = if p.workload == Workload::TcpSmall {
        &o.small_offloads
    } else {
        &o.offloads
    };
    if o.offload_path && review::shows(p, veth_offloads) {
        paths.push(DataPath::Offload);
    }
    paths
}

/// Below this share of the forwarded packets on XDP an offload run gets a
/// note: the kernel carried it, not the fast path.
const LOW_XDP_SHARE_PCT: f64 = 90.0;

/// `run_once` (a run on the offload path) with who forwarded its packets: the
/// fast path's and the kernel's counters read around it, and the flows in
/// the XDP table sampled once a second while it runs.
pub fn with_fast_path_share(
    t: &Topology,
    run_once: impl FnOnce() -> Result<RunResult, String>,
) -> Result<RunResult, String> {
    let before = OffloadCounters::read(t, None);
    let done = AtomicBool::new(false);
    let (res, samples) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| {
            let mut samples = Vec::new();
            while !done.load(Ordering::Relaxed) {
                if let Ok(s) = FastPathSample::read(t) {
                    samples.push(s);
                }
                for _ in 0..20 {
                    if done.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            samples
        });
        let res = run_once();
        done.store(true, Ordering::Relaxed);
        (res, sampler.join().unwrap_or_default())
    });
    let mut result = res?;
    match (before, OffloadCounters::read(t, Some(unix_now()))) {
        (Ok(before), Ok(after)) => {
            let fp = before.share_until(after, &samples);
            // Judged once every flow was offloaded where the samples show
            // it (the ramp of many streams goes through the kernel); NaN
            // (nothing forwarded) counts as low.
            let share = fp.steady_xdp_pct.unwrap_or_else(|| fp.xdp_pct());
            if share.is_nan() || share < LOW_XDP_SHARE_PCT {
                result.notes.push(format!(
                    "XDP carried only {share:.1} % of the forwarded packets, the kernel the \
                     rest: were the flows offloaded? (`router-ctl stats` shows the daemon's \
                     reasons)"
                ));
            }
            result.fast_path = Some(fp);
        }
        (Err(e), _) | (_, Err(e)) => result
            .notes
            .push(format!("fast path share not measured: {e}")),
    }
    Ok(result)
}

/// A run of `point` on `path`, retried when cut short or failed.
#[expect(
    clippy::too_many_arguments,
    reason = "the run's whole context, passed through"
)]
fn measured(
    t: &Topology,
    router: &mut Router<'_>,
    s: &Settings,
    path: DataPath,
    point: Point,
    retries: u32,
    port: &mut u16,
    stop: &AtomicBool,
) -> Result<RunResult, String> {
    let mut last_err = String::new();
    let mut best: Option<RunResult> = None;
    for attempt in 1..=retries + 1 {
        // A switch can fail for a while (router-ctl waits at most 10 s for
        // its lock, which every router-ctl on the machine shares): retried
        // like a failed run.
        if let Err(e) = router.switch(path, point.offload) {
            eprintln!(
                "      switching to {} failed: {e}{}",
                path.name(),
                if attempt <= retries { "; retrying" } else { "" }
            );
            last_err = e;
            continue;
        }
        iperf::next_port(port);
        let one = || {
            if point.workload == Workload::UdpLive {
                live::run(t, s, path, point, stop)
            } else {
                iperf::run(t, s, path, point, *port)
            }
        };
        let res = if path == DataPath::Offload {
            with_fast_path_share(t, one)
        } else {
            one()
        };
        match res {
            Ok(mut r) => {
                r.attempts = attempt;
                if !r.suspect {
                    return Ok(r);
                }
                if attempt <= retries {
                    eprintln!("      cut short ({}); retrying", r.notes.join("; "));
                }
                best = Some(r);
            }
            Err(e) if e.contains("Too many open files") => return Err(e),
            Err(e) => {
                eprintln!(
                    "      failed: {e}{}",
                    if attempt <= retries { "; retrying" } else { "" }
                );
                last_err = e;
            }
        }
    }
    best.ok_or(last_err)
}

/// Rounds a paced point runs at most: the first, then each rerun at
/// [`RERUN_SHARE`] of the lowest rate the round before carried.
pub const PACED_ROUNDS: u32 = 3;
/// A rerun's rate against the lowest rate the round before carried: the
/// margin that lets every path sustain it.
const RERUN_SHARE: f64 = 0.9;
/// Paced rates are whole multiples of this, and never below it, Mbit/s.
pub const PACED_STEP_MBPS: u32 = 50;

/// [`RERUN_SHARE`] of `lowest` Mbit/s, rounded down to
/// [`PACED_STEP_MBPS`], at least that.
fn below(lowest: f64) -> u32 {
    let step = f64::from(PACED_STEP_MBPS);
    // (A hair above the quotient: a rate converted between frames and
    // payload lands a rounding error below a whole step.)
    ((lowest * RERUN_SHARE / step + 1e-6).floor() * step).max(step) as u32
}

/// The lowest rate the runs `keep` picks carried, Mbit/s of payload (what
/// an offered rate counts), and each path's ("kernel 2490, xdp 2000");
/// None with fewer than two paths.
fn carried_by(runs: &[RunResult], keep: impl Fn(&RunResult) -> bool) -> Option<(f64, String)> {
    let picked: Vec<&RunResult> = runs.iter().filter(|r| keep(r)).collect();
    let lowest = picked
        .iter()
        .map(|r| r.carried_payload_mbps())
        .fold(f64::INFINITY, f64::min);
    if picked.len() < 2 || !lowest.is_finite() {
        return None;
    }
    let each = picked
        .iter()
        .map(|r| format!("{} {:.0}", r.path.name(), r.carried_payload_mbps()))
        .collect::<Vec<_>>()
        .join(", ");
    Some((lowest, each))
}

/// The rate the first round of paced `point` offers: the line rate, or
/// below what the slowest path carried unpaced at the same count of
/// streams on the same wire (offload off, earlier among `runs`) when that
/// was under 95 % of the line rate: a paced run carries no more than an
/// unpaced one, so a round at the line rate would only be run again (the
/// shared cores cannot generate it). The note says so.
pub fn paced_start(point: Point, line_rate: u32, runs: &[RunResult]) -> (u32, Option<String>) {
    let unpaced = Point::new(Workload::Tcp, point.conns, Offload::Off);
    match carried_by(runs, |r| r.point == unpaced) {
        Some((lowest, each)) if lowest < SUSTAINED_SHARE * f64::from(line_rate) => {
            let mbps = below(lowest);
            (
                mbps,
                Some(format!(
                    "unpaced, -P {} carried {each} Mbit/s, less than {line_rate}: started at \
                     {mbps} Mbit/s",
                    point.conns
                )),
            )
        }
        _ => (line_rate, None),
    }
}

/// What follows a round of a paced point.
#[derive(Debug, PartialEq)]
pub enum NextRound {
    /// Every path carried at least 95 % of the offered rate (or fewer than
    /// two paths ran): the round stands.
    Stands,
    /// Every path runs again at `mbps`, replacing the round, which carried
    /// `carried` (each path's, Mbit/s).
    Rerun { mbps: u32, carried: String },
    /// A path carried less than 95 %, and no rerun is left (`why`): the
    /// round stands at unequal loads.
    Unequal { carried: String, why: String },
}

/// After round `round` (1: the first) of paced `point` at `offered` Mbit/s
/// among `runs`: "CPU at line rate" compares the paths at equal loads, so
/// where a path carried less than 95 % of the offered rate, every path runs
/// again at 90 % of the lowest carried rate (whole 50 Mbit/s, at least 50),
/// for at most [`PACED_ROUNDS`] rounds in all.
pub fn next_round(point: Point, offered: u32, round: u32, runs: &[RunResult]) -> NextRound {
    let Some((lowest, carried)) =
        carried_by(runs, |r| r.point == point && r.offered_mbps == offered)
    else {
        return NextRound::Stands;
    };
    if lowest >= SUSTAINED_SHARE * f64::from(offered) {
        return NextRound::Stands;
    }
    let mbps = below(lowest);
    if round >= PACED_ROUNDS {
        NextRound::Unequal {
            carried,
            why: format!("{PACED_ROUNDS} rounds run"),
        }
    } else if mbps >= offered {
        NextRound::Unequal {
            carried,
            why: format!("no lower rate than {PACED_STEP_MBPS} Mbit/s"),
        }
    } else {
        NextRound::Rerun { mbps, carried }
    }
}

/// The planned seconds the paced points' reruns may still take (see
/// [`crate::plan::paced_rerun_budget_s`]).
#[derive(Debug)]
pub struct RerunBudget {
    pub left_s: f64,
}

/// What [`paced_rounds`] needs of a wire's runner (the plain veths' bench,
/// the cables).
pub trait PacedRunner {
    fn runs_mut(&mut self) -> &mut Vec<RunResult>;
    /// Runs `point` at `mbps` Mbit/s on each path of `order` in turn,
    /// pushing the results; false: the bench was stopped. `rerun`: not the
    /// point's first round.
    fn round(
        &mut self,
        point: Point,
        order: &[DataPath],
        mbps: u32,
        rerun: bool,
    ) -> Result<bool, String>;
}

/// Paced `point` on the paths of `order`: first at [`paced_start`], then
/// again as [`next_round`] says, in the reverse order each time, while a
/// round's planned `round_s` fits `budget`. Only the last round's runs
/// stay; they note the rounds before, and why they are at unequal loads
/// where they are. False: the bench was stopped during a round (which
/// recorded it).
pub fn paced_rounds(
    w: &mut impl PacedRunner,
    point: Point,
    order: &[DataPath],
    line_rate: u32,
    round_s: f64,
    budget: &mut RerunBudget,
) -> Result<bool, String> {
    let (mut mbps, start) = paced_start(point, line_rate, w.runs_mut());
    let mut history: Vec<String> = start.into_iter().collect();
    let mut order = order.to_vec();
    let mut completed = true;
    for round in 1..=PACED_ROUNDS {
        if !w.round(point, &order, mbps, round > 1)? {
            completed = false;
            break;
        }
        let (said, again) = match next_round(point, mbps, round, w.runs_mut()) {
            NextRound::Stands => break,
            NextRound::Rerun {
                mbps: again,
                carried,
            } if round_s <= budget.left_s => {
                budget.left_s -= round_s;
                (
                    format!(
                        "{mbps} Mbit/s offered: carried {carried} Mbit/s; run again at {again}"
                    ),
                    Some(again),
                )
            }
            NextRound::Rerun { carried, .. } => (
                format!(
                    "{mbps} Mbit/s offered: carried {carried} Mbit/s; no time left for a rerun \
                     in the run's budget: unequal loads"
                ),
                None,
            ),
            NextRound::Unequal { carried, why } => (
                format!("{mbps} Mbit/s offered: carried {carried} Mbit/s; {why}: unequal loads"),
                None,
            ),
        };
        history.push(said);
        let Some(again) = again else {
            break;
        };
        w.runs_mut().retain(|r| r.point != point);
        mbps = again;
        order.reverse();
    }
    if !history.is_empty() {
        let note = history.join("; ");
        eprintln!("      {point}: {note}");
        for r in w.runs_mut().iter_mut().filter(|r| r.point == point) {
            r.notes.push(note.clone());
        }
    }
    Ok(completed)
}

/// Raises the fd limit for the largest run; returns it.
fn raise_nofile(o: &Opts) -> Result<u64, String> {
    let max_conns = o
        .conns
        .iter()
        .chain(&o.udp_conns)
        .chain(&o.paced_conns)
        .chain(&o.cable_conns)
        .copied()
        .max()
        .unwrap_or(1);
    // iperf2 needs one fd per stream on each side (plus a few); children
    // inherit the limit.
    let nofile = sys::raise_nofile(65_536);
    if nofile < u64::from(max_conns) + 64 {
        return Err(format!(
            "RLIMIT_NOFILE is {nofile}, too low for {max_conns} connections and it could not \
             be raised; raise the hard limit (ulimit -Hn) or pass fewer --conns"
        ));
    }
    Ok(nofile)
}

/// The points to run: all, but udp-live where this kernel has no
/// live-frame mode (then `skipped` says why).
fn runnable_points(
    t: &Topology,
    o: &Opts,
    skipped: &mut Vec<String>,
) -> Result<Vec<Point>, String> {
    let mut points = o.points();
    if o.workloads.contains(&Workload::UdpLive)
        && let Err(e) = live::supported(t)
    {
        // Only an old kernel, or one that refuses this process the mode,
        // is a reason to leave it out; anywhere else a failure is the
        // generator's (or the harness's) and must show.
        let refused = e.starts_with(tests::rawbpf::LIVE_FRAMES_NOT_PERMITTED);
        if tests::kernel_at_least(5, 18) && !refused {
            return Err(format!("the live-frame generator does not work: {e}"));
        }
        eprintln!("bench: skipping udp-live: {e}");
        let why = if refused {
            e.clone()
        } else {
            format!("BPF_PROG_RUN live-frame mode needs Linux >= 5.18: {e}")
        };
        // The smoke run is part of `cargo xtask test`: its skip is listed
        // with the tests' at the end.
        if o.smoke {
            tests::skipped("bench smoke: udp-live (the in-kernel generator)", &why);
        }
        skipped.push(format!("udp-live skipped: {why}"));
        points.retain(|p| p.workload != Workload::UdpLive);
    }
    Ok(points)
}

/// Seconds of `openssl speed` per block size: 1 s gives the same MB/s as
/// its default 3 s within a few %, and the figure describes the machine,
/// not the router.
pub const CRYPTO_SECS: u32 = 1;

/// The live generator's flow counts of the IPv6 rows: --quick only the
/// last (the IPv4 rows have both).
pub fn ipv6_live_flows(o: &Opts) -> Vec<u32> {
    if o.quick {
        o.live_flows.last().copied().into_iter().collect()
    } else {
        o.live_flows.clone()
    }
}

/// The points on the cables: unpaced TCP if tcp is selected, the paced
/// points if tcp-paced is; none with `--no-cable`.
pub fn cable_points(o: &Opts) -> Vec<Point> {
    if !o.cable {
        return Vec::new();
    }
    let pick = |w: Workload, conns: &[u32]| {
        if o.workloads.contains(&w) {
            conns.to_vec()
        } else {
            Vec::new()
        }
    };
    cable::points(
        &pick(Workload::Tcp, &o.cable_conns),
        &pick(Workload::TcpPaced, &o.paced_conns),
    )
}

/// Whether the connection setup rate runs between the cables too.
pub fn cable_conn_rate(o: &Opts) -> bool {
    o.cable && o.conn_rate
}

/// The connection setup rate's rounds on `wire`: the same on both.
pub fn conn_rate_rounds(o: &Opts, wire: Wire) -> connrate::Rounds {
    connrate::Rounds {
        wire,
        workers: o.conn_rate_workers,
        secs: o.conn_rate_secs,
        reps: o.conn_rate_reps,
        offload_path: o.offload_path,
    }
}

/// The state of a run in progress.
struct Bench<'a> {
    o: &'a Opts,
    t: &'a Topology,
    router: Router<'a>,
    settings: Settings,
    stop: &'a AtomicBool,
    /// Whether the live generator runs here (not on kernels before 5.18).
    live: bool,
    port: u16,
    runs: Vec<RunResult>,
    failures: Vec<String>,
    /// Active offload features per setting and path.
    offload_states: serde_json::Map<String, serde_json::Value>,
    /// What the paced points' reruns may still take: the plain veths' share
    /// during the points, then the rest for the cables.
    paced_budget: RerunBudget,
}

/// Progress through the runs, for the time-left estimate.
#[derive(Default)]
struct Progress {
    total: usize,
    done: usize,
    est_total: f64,
    done_est: f64,
    done_real: f64,
}

impl Progress {
    /// Seconds left, scaled by how the estimate fared so far.
    fn left(&self) -> f64 {
        let scale = if self.done_est > 0.0 {
            self.done_real / self.done_est
        } else {
            1.0
        };
        (self.est_total - self.done_est) * scale
    }
}

/// The plain veths' paced rounds: the bench's runs at the rate of each
/// round, counted in its progress.
struct VethRounds<'a, 'b> {
    bench: &'a mut Bench<'b>,
    progress: &'a mut Progress,
}

impl PacedRunner for VethRounds<'_, '_> {
    fn runs_mut(&mut self) -> &mut Vec<RunResult> {
        &mut self.bench.runs
    }

    fn round(
        &mut self,
        point: Point,
        order: &[DataPath],
        mbps: u32,
        rerun: bool,
    ) -> Result<bool, String> {
        if rerun {
            self.progress.total += order.len();
        }
        let line_rate = self.bench.settings.line_rate_mbps;
        self.bench.settings.line_rate_mbps = mbps;
        let res = self.bench.run_paths(point, order, self.progress);
        self.bench.settings.line_rate_mbps = line_rate;
        res
    }
}

impl Bench<'_> {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Every point on its paths (kernel and xdp; the limit too for the
    /// live generator, offload on the review table's points), rotating
    /// which path goes first: kernel-xdp, xdp-kernel, ...
    fn run_points(&mut self, points: &[Point]) -> Result<(), String> {
        let o = self.o;
        let mut progress = Progress {
            total: points.iter().map(|p| paths_of(o, *p).len()).sum(),
            est_total: points
                .iter()
                .map(|p| paths_of(o, *p).len() as f64 * estimate(self.o.secs, *p))
                .sum(),
            ..Progress::default()
        };
        eprintln!(
            "bench: {} points, {} runs of {} s, about {} (+ micro-benchmark)",
            points.len(),
            progress.total,
            self.o.secs,
            mmss(progress.est_total)
        );
        for (i, point) in points.iter().enumerate() {
            let mut order = paths_of(o, *point);
            let n = order.len();
            order.rotate_left(i % n);
            let completed = if point.workload == Workload::TcpPaced {
                let round_s = plan::paced_round_secs(o.secs, *point, order.len());
                let mut budget =
                    std::mem::replace(&mut self.paced_budget, RerunBudget { left_s: 0.0 });
                let mut veth = VethRounds {
                    bench: self,
                    progress: &mut progress,
                };
                let completed = paced_rounds(
                    &mut veth,
                    *point,
                    &order,
                    o.line_rate_mbps,
                    round_s,
                    &mut budget,
                );
                self.paced_budget = budget;
                completed?
            } else {
                self.run_paths(*point, &order, &mut progress)?
            };
            if !completed {
                return Ok(());
            }
        }
        Ok(())
    }

    /// `point` on each path of `order` in turn; false: stopped (recorded
    /// as a failure).
    fn run_paths(
        &mut self,
        point: Point,
        order: &[DataPath],
        progress: &mut Progress,
    ) -> Result<bool, String> {
        for &path in order {
            if self.stopped() {
                self.failures.push(format!(
                    "interrupted after {} of {} runs",
                    progress.done, progress.total
                ));
                return Ok(false);
            }
            self.run_point(point, path, progress)?;
        }
        Ok(true)
    }

    /// One point on one path; a failure is recorded, except one that
    /// would fail every run after it.
    fn run_point(&mut self, point: Point, path: DataPath, p: &mut Progress) -> Result<(), String> {
        p.done += 1;
        eprintln!(
            "[{:>2}/{}] {point} | {:<6} | {} s run, ~{} left",
            p.done,
            p.total,
            path.name(),
            self.o.secs,
            mmss(p.left())
        );
        let t0 = Instant::now();
        let res = measured(
            self.t,
            &mut self.router,
            &self.settings,
            path,
            point,
            self.o.retries,
            &mut self.port,
            self.stop,
        );
        p.done_est += estimate(self.o.secs, point);
        p.done_real += t0.elapsed().as_secs_f64();
        let key = format!("{} {}", point.offload.name(), path.name());
        if !point.workload.is_udp() && !self.offload_states.contains_key(&key) {
            self.offload_states.insert(key, offload_state(self.t));
        }
        match res {
            Ok(mut r) => {
                if point.workload == Workload::TcpPaced {
                    r.offered_mbps = self.settings.line_rate_mbps;
                }
                eprintln!("        {}", show(&r));
                self.runs.push(r);
            }
            Err(e) if e.contains("Too many open files") => return Err(e),
            Err(e) => {
                eprintln!("        FAILED: {e}");
                self.failures
                    .push(format!("{point} on {}: {e}", path.name()));
            }
        }
        Ok(())
    }

    fn frags(&mut self) -> Vec<frags::Row> {
        let o = self.o;
        if !o.frags || !o.workloads.contains(&Workload::Tcp) || self.stopped() {
            return Vec::new();
        }
        eprintln!(
            "bench: frags experiment: TCP -P 1, offload on, kernel path, with no / a plain / a \
             frags-aware XDP_PASS program on the router's veths"
        );
        frags::run(self.t, &mut self.router, &self.settings, &mut self.port).unwrap_or_else(|e| {
            self.failures.push(e);
            Vec::new()
        })
    }

    fn reference(&mut self) -> Option<RunResult> {
        let o = self.o;
        if !o.workloads.contains(&Workload::Tcp)
            || !o.offloads.contains(&Offload::Off)
            || !o.conns.contains(&1)
            || self.stopped()
        {
            return None;
        }
        eprintln!(
            "bench: reference: TCP -P 1, offload off, plain kernel forwarding (fresh topology, \
             no netfilter, route back)"
        );
        match reference::run(&self.settings, &o.cc, &mut self.port) {
            Ok((r, cc)) => {
                eprintln!("        {} (congestion control {cc})", show(&r));
                Some(r)
            }
            Err(e) => {
                self.failures.push(format!("reference forwarding run: {e}"));
                None
            }
        }
    }

    fn scaling(&mut self) -> Vec<scaling::Row> {
        let o = self.o;
        let Some(&flows) = o.live_flows.last() else {
            return Vec::new();
        };
        if !o.scaling || !self.live || self.stopped() {
            return Vec::new();
        }
        eprintln!(
            "bench: scaling: live generator on 1 and on all CPUs, {flows} flows, kernel / xdp / \
             limit (fresh topology, multi-queue veths)"
        );
        // The smoke run only on all CPUs: one generator runs the same code
        // as the udp-live point.
        let counts = (flows, o.smoke);
        scaling::run(&self.settings, counts, self.stop, &mut self.failures).unwrap_or_else(|e| {
            self.failures.push(format!("scaling: {e}"));
            Vec::new()
        })
    }

    /// IPv6, kernel and xdp (not in --smoke): one TCP stream if tcp is
    /// selected (--quick: 3 s each, once per path), the live generator per
    /// --live-flows if udp-live is (for --secs per path).
    fn ipv6(&mut self) -> Vec<ipv6::Row> {
        let o = self.o;
        let tcp = o.workloads.contains(&Workload::Tcp);
        let live = o.workloads.contains(&Workload::UdpLive) && self.live;
        if o.smoke || !(tcp || live) || self.stopped() {
            return Vec::new();
        }
        let plan = ipv6::Plan {
            tcp_secs: tcp.then_some(if o.quick { 3 } else { o.secs }),
            alternate: !o.quick,
            live_flows: if live { ipv6_live_flows(o) } else { Vec::new() },
        };
        eprintln!("bench: IPv6: kernel IPv6 forwarding vs xdp (fresh topology): {plan:?}");
        let (rows, failures) = ipv6::run(&plan, &self.settings, self.stop, &mut self.port);
        self.failures.extend(failures);
        rows
    }

    /// TCP between the cables, then the connection setup rate there.
    fn cable(&mut self) -> (Vec<RunResult>, Vec<connrate::Row>) {
        let o = self.o;
        let points = cable_points(o);
        let conn_rate = cable_conn_rate(o).then(|| conn_rate_rounds(o, Wire::Cable));
        if (points.is_empty() && conn_rate.is_none()) || self.stopped() {
            return (Vec::new(), Vec::new());
        }
        eprintln!(
            "bench: TCP between XDP cables (fresh topology, offload off): {} points, {} runs; \
             connection setup rate: {} runs",
            points.len(),
            points
                .iter()
                .map(|&p| cable::paths_of(p, o.offload_path).len())
                .sum::<usize>(),
            conn_rate.as_ref().map_or(0, connrate::Rounds::runs)
        );
        cable::run(
            &self.settings,
            (&o.cc, &points, o.offload_path),
            conn_rate.as_ref(),
            &mut self.port,
            (self.stop, &mut self.paced_budget),
            &mut self.failures,
        )
        .unwrap_or_else(|e| {
            self.failures.push(format!("cable: {e}"));
            (Vec::new(), Vec::new())
        })
    }

    fn conn_rate(&mut self) -> Vec<connrate::Row> {
        let o = self.o;
        if !o.conn_rate || self.stopped() {
            return Vec::new();
        }
        let plan = conn_rate_rounds(o, Wire::Veth);
        eprintln!(
            "bench: connection setup rate: {} parallel clients, {} s per path, {} round(s)",
            plan.workers, plan.secs, plan.reps
        );
        connrate::rounds(
            self.t,
            &mut self.router,
            &plan,
            |_| Ok(None),
            self.stop,
            &mut self.failures,
        )
    }

    fn big_table(&mut self) -> Vec<bigtable::Row> {
        let o = self.o;
        if o.big_table == 0 || !self.live || self.stopped() {
            return Vec::new();
        }
        eprintln!(
            "bench: flows: live generator through xdp with a {}-flow and a {}-flow table",
            bigtable::SMALL_TABLE,
            o.big_table
        );
        // Quick and smoke runs leave out the diagnostic rows (the large
        // table with small traffic, a table of only the spread's flows) and
        // run the rows once; a full run three times (medians in the report).
        let reps = if o.quick { 1 } else { bigtable::FULL_REPS };
        bigtable::run(
            self.t,
            &mut self.router,
            &self.settings,
            (o.big_table, !o.quick, reps),
            o.flows_control,
            self.stop,
        )
        .unwrap_or_else(|e| {
            self.failures.push(format!("flows (big table): {e}"));
            Vec::new()
        })
    }

    fn micro(&mut self) -> Vec<micro::Case> {
        let o = self.o;
        if !o.micro || self.stopped() {
            return Vec::new();
        }
        eprintln!(
            "bench: BPF_PROG_RUN micro-benchmark ({} calls per case, repeat {})",
            o.micro_calls, o.micro_repeat
        );
        // The router program under test is a separate, unattached copy.
        micro::run(self.t, o.micro_calls, o.micro_repeat).unwrap_or_else(|e| {
            self.failures.push(format!("micro-benchmark: {e}"));
            Vec::new()
        })
    }
}

/// `f`, timed as phase `name`: printed, and kept in `phases` for
/// results.json.
fn timed<T>(phases: &mut Vec<(&'static str, f64)>, name: &'static str, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let out = f();
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("bench: phase {name} took {}", mmss(secs));
    phases.push((name, secs));
    out
}

/// The whole benchmark; `stop` (set on SIGINT/SIGTERM) ends it after the
/// current run, with what was measured written.
pub fn bench(o: &Opts, stop: &AtomicBool) -> Result<(), String> {
    let started = Instant::now();
    let nofile = raise_nofile(o)?;
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let tmp = o.out.join(format!("tmp-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;

    let t = Topology::new();
    eprintln!("bench: topology {}", t.namespaces().join(", "));
    t.warm_neighbours();
    let (cc, cc_per_socket) = congestion_control(&t, &o.cc);
    let mut skipped = Vec::new();
    let points = runnable_points(&t, o, &mut skipped)?;
    let mut b = Bench {
        o,
        t: &t,
        router: Router::new(&t).with_gro(o.router_gro),
        settings: Settings::of(o, tmp.clone(), nofile, cc_per_socket),
        stop,
        live: points.iter().any(|p| p.workload == Workload::UdpLive),
        port: 5000,
        runs: Vec::new(),
        failures: Vec::new(),
        offload_states: serde_json::Map::new(),
        // Half for the plain veths, the rest (with what they left) for the
        // cables, where the goal is judged.
        paced_budget: RerunBudget {
            left_s: plan::paced_rerun_budget_s(o) / 2.0,
        },
    };
    // Each phase's wall time, for the run-time budgets (`--plan` estimates
    // them beforehand).
    let mut phases = Vec::new();
    let platform = timed(&mut phases, "platform", || {
        platform::platform(
            &t,
            CryptoRun {
                secs: CRYPTO_SECS,
                all_sizes: !o.smoke && !o.only_conn_rate,
            },
        )
    });
    timed(&mut phases, "points", || b.run_points(&points))?;
    b.paced_budget.left_s += plan::paced_rerun_budget_s(o) / 2.0;
    b.router.stop_daemon();
    let conn_rate = timed(&mut phases, "conn-rate", || b.conn_rate());
    // An offload run's daemon stops before the next phase: the kernel
    // tracks conntrack event listeners machine-wide (not per network
    // namespace), so while it listens every namespace's conntrack builds
    // an event message per state change, and the kernel path of a later
    // phase on another topology (the cables' connection setup rate) would
    // pay for it.
    b.router.stop_daemon();
    let big_table = timed(&mut phases, "flows", || b.big_table());
    let frag_rows = timed(&mut phases, "frags", || b.frags());
    let reference = timed(&mut phases, "reference", || b.reference());
    let scaling = timed(&mut phases, "scaling", || b.scaling());
    let (cable, cable_conn_rate) = timed(&mut phases, "cable", || b.cable());
    let ipv6 = timed(&mut phases, "ipv6", || b.ipv6());
    let micro = timed(&mut phases, "micro", || b.micro());
    // Both wires' rows, each row saying its own.
    let mut conn_rate = conn_rate;
    conn_rate.extend(cable_conn_rate);
    let extra = Extra {
        micro,
        frag_rows,
        reference,
        scaling,
        big_table,
        conn_rate,
        cable,
        ipv6,
        platform,
    };
    let Bench {
        runs,
        failures,
        offload_states,
        mut router,
        ..
    } = b;
    // The daemon works on the topology's router namespace: stopped first.
    router.stop_daemon();
    drop(router);
    drop(t);
    let _ = std::fs::remove_dir_all(&tmp);

    let env = RunEnv {
        skipped,
        nofile,
        cc,
        offloads: offload_states.into(),
        elapsed: started.elapsed(),
        phases,
    };
    report::write_artifacts(o, &runs, &extra, &failures, &env)?;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} run(s) failed:\n  {}",
            failures.len(),
            failures.join("\n  ")
        ))
    }
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::model::PAYLOAD_PER_WIRE_BYTE;

    fn paced(path: DataPath, carried_mbps: f64) -> RunResult {
        let point = Point::new(Workload::TcpPaced, 100, Offload::Off);
        let mut r = RunResult::blank(path, point);
        // Counted at the sink in frames: `carried_mbps` of payload.
        r.gbps = carried_mbps / PAYLOAD_PER_WIRE_BYTE / 1000.0;
        r.offered_mbps = 2500;
        r
    }

    #[test]
    fn a_paced_point_runs_again_below_what_the_slowest_path_carried() {
        let point = paced(DataPath::Kernel, 0.0).point;
        let runs = [
            paced(DataPath::Kernel, 2490.0),
            paced(DataPath::Xdp, 2000.0),
        ];
        // 90 % of 2000, rounded down to 50 Mbit/s.
        assert_eq!(
            next_round(point, 2500, 1, &runs),
            NextRound::Rerun {
                mbps: 1800,
                carried: "kernel 2490, xdp 2000".into()
            }
        );
        // Every path within 95 % of the offered rate, or one path alone: it stands.
        let sustained = [
            paced(DataPath::Kernel, 2400.0),
            paced(DataPath::Xdp, 2380.0),
        ];
        assert_eq!(next_round(point, 2500, 1, &sustained), NextRound::Stands);
        assert_eq!(next_round(point, 2500, 1, &runs[1..]), NextRound::Stands);
        // Runs at another offered rate (an earlier round's) do not count.
        assert_eq!(next_round(point, 1800, 2, &runs), NextRound::Stands);
        // The last round stands at unequal loads.
        assert!(matches!(
            next_round(point, 2500, PACED_ROUNDS, &runs),
            NextRound::Unequal { why, .. } if why == "3 rounds run"
        ));
        // Never below 50 Mbit/s: a round there that a path did not sustain
        // stands; one above it reruns at 50.
        let mut slow = [paced(DataPath::Kernel, 10.0), paced(DataPath::Xdp, 20.0)];
        assert!(matches!(
            next_round(point, 2500, 1, &slow),
            NextRound::Rerun { mbps: 50, .. }
        ));
        for r in &mut slow {
            r.offered_mbps = 50;
        }
        assert!(matches!(
            next_round(point, 50, 2, &slow),
            NextRound::Unequal { why, .. } if why == "no lower rate than 50 Mbit/s"
        ));
    }

    /// A wire whose paths carry `carry(path, offered)` Mbit/s.
    struct Fake {
        runs: Vec<RunResult>,
        carry: fn(DataPath, u32) -> f64,
        /// Each round's rate and order.
        rounds: Vec<(u32, Vec<DataPath>)>,
        /// The bench is stopped during this round (1-based), if any.
        stopped_in_round: Option<usize>,
    }

    impl PacedRunner for Fake {
        fn runs_mut(&mut self) -> &mut Vec<RunResult> {
            &mut self.runs
        }

        fn round(
            &mut self,
            point: Point,
            order: &[DataPath],
            mbps: u32,
            rerun: bool,
        ) -> Result<bool, String> {
            assert_eq!(rerun, !self.rounds.is_empty());
            self.rounds.push((mbps, order.to_vec()));
            if self.stopped_in_round == Some(self.rounds.len()) {
                return Ok(false);
            }
            for &path in order {
                let mut r = RunResult::blank(path, point);
                r.gbps = (self.carry)(path, mbps) / PAYLOAD_PER_WIRE_BYTE / 1000.0;
                r.offered_mbps = mbps;
                self.runs.push(r);
            }
            Ok(true)
        }
    }

    const PATHS: [DataPath; 3] = [DataPath::Kernel, DataPath::Xdp, DataPath::Offload];

    /// `paced_rounds` of -P 1000 at 2500 Mbit/s on `fake` with `budget_s`
    /// (rounds of 10 s): each round's rate, the notes of the runs left.
    fn rounds_of(fake: &mut Fake, budget_s: f64) -> (Vec<u32>, Vec<String>) {
        let point = Point::new(Workload::TcpPaced, 1000, Offload::Off);
        let mut budget = RerunBudget { left_s: budget_s };
        assert!(paced_rounds(fake, point, &PATHS, 2500, 10.0, &mut budget).unwrap());
        let kept: Vec<&RunResult> = fake.runs.iter().filter(|r| r.point == point).collect();
        assert_eq!(kept.len(), 3, "only the last round stays");
        let last = fake.rounds.last().unwrap().0;
        assert!(
            kept.iter()
                .all(|r| r.offered_mbps == last && r.notes == kept[0].notes)
        );
        (
            fake.rounds.iter().map(|r| r.0).collect(),
            kept[0].notes.clone(),
        )
    }

    #[test]
    fn paced_rounds_converge_to_a_rate_every_path_sustains() {
        // The kernel path tops out at 1000 Mbit/s, the others at 1500.
        let mut fake = Fake {
            runs: Vec::new(),
            carry: |path, offered| {
                let top = if path == DataPath::Kernel {
                    1000.0
                } else {
                    1500.0
                };
                f64::from(offered).min(top)
            },
            rounds: Vec::new(),
            stopped_in_round: None,
        };
        let (rates, notes) = rounds_of(&mut fake, 100.0);
        assert_eq!(rates, [2500, 900]);
        // The rerun goes the other way round.
        let order: Vec<&[DataPath]> = fake.rounds.iter().map(|r| &r.1[..]).collect();
        assert_eq!(
            order,
            [
                &PATHS[..],
                &[DataPath::Offload, DataPath::Xdp, DataPath::Kernel]
            ]
        );
        assert_eq!(
            notes,
            [
                "2500 Mbit/s offered: carried kernel 1000, xdp 1500, offload 1500 Mbit/s; run \
              again at 900"
            ]
        );
        assert!(fake.runs.iter().all(RunResult::sustained));
    }

    #[test]
    fn a_stop_during_paced_rounds_ends_them_and_says_so() {
        // Never sustained, so it would run again; the bench is stopped in
        // the second round. The round recorded the stop: paced_rounds says
        // false, so the caller ends there rather than recording it again
        // at the next point (review finding 11).
        let point = Point::new(Workload::TcpPaced, 1000, Offload::Off);
        let mut fake = Fake {
            runs: Vec::new(),
            carry: |_, offered| f64::from(offered) / 2.0,
            rounds: Vec::new(),
            stopped_in_round: Some(2),
        };
        let mut budget = RerunBudget { left_s: 100.0 };
        let completed = paced_rounds(&mut fake, point, &PATHS, 2500, 10.0, &mut budget);
        assert_eq!(completed, Ok(false));
        assert_eq!(fake.rounds.len(), 2, "no round after the stop");
        // Not stopped: it completes.
        fake.stopped_in_round = None;
        fake.rounds.clear();
        let mut budget = RerunBudget { left_s: 100.0 };
        assert_eq!(
            paced_rounds(&mut fake, point, &PATHS, 2500, 10.0, &mut budget),
            Ok(true)
        );
    }

    #[test]
    fn paced_rounds_stop_at_the_bound_the_floor_and_the_budget() {
        // Every path carries half of any rate: never sustained.
        let half = |_: DataPath, offered: u32| f64::from(offered) / 2.0;
        let fake = || Fake {
            runs: Vec::new(),
            carry: half,
            rounds: Vec::new(),
            stopped_in_round: None,
        };
        let mut bounded = fake();
        let (rates, notes) = rounds_of(&mut bounded, 100.0);
        assert_eq!(rates, [2500, 1100, 450]);
        assert!(
            notes[0].ends_with(
                "450 Mbit/s offered: carried kernel 225, xdp 225, offload 225 \
                 Mbit/s; 3 rounds run: unequal loads"
            ),
            "{notes:?}"
        );
        // The budget pays for one rerun of 10 s only.
        let mut short = fake();
        let (rates, notes) = rounds_of(&mut short, 15.0);
        assert_eq!(rates, [2500, 1100]);
        assert!(notes[0].ends_with("no time left for a rerun in the run's budget: unequal loads"));
        // A path that carries almost nothing: down to 50 Mbit/s, no lower.
        let mut crawl = Fake {
            runs: Vec::new(),
            carry: |_, offered| f64::from(offered).min(5.0),
            rounds: Vec::new(),
            stopped_in_round: None,
        };
        let (rates, notes) = rounds_of(&mut crawl, 100.0);
        assert_eq!(rates, [2500, 50]);
        assert!(notes[0].ends_with("no lower rate than 50 Mbit/s: unequal loads"));
    }

    #[test]
    fn a_paced_point_starts_below_what_its_unpaced_run_carried() {
        // `mbps` of payload, counted in frames at the sink.
        let unpaced = |path, mbps: f64| {
            let mut r = RunResult::blank(path, Point::new(Workload::Tcp, 1000, Offload::Off));
            r.gbps = mbps / PAYLOAD_PER_WIRE_BYTE / 1000.0;
            r
        };
        let mut fake = Fake {
            runs: vec![
                unpaced(DataPath::Kernel, 1200.0),
                unpaced(DataPath::Xdp, 1700.0),
            ],
            carry: |_, offered| f64::from(offered),
            rounds: Vec::new(),
            stopped_in_round: None,
        };
        let (rates, notes) = rounds_of(&mut fake, 100.0);
        assert_eq!(rates, [1050]);
        assert_eq!(
            notes,
            [
                "unpaced, -P 1000 carried kernel 1200, xdp 1700 Mbit/s, less than 2500: started \
              at 1050 Mbit/s"
            ]
        );
        // The unpaced runs stay; an unpaced run near the line rate (or at
        // another count of streams) leaves the start at the line rate.
        assert_eq!(fake.runs.len(), 5);
        let point = Point::new(Workload::TcpPaced, 1000, Offload::Off);
        let fast = [
            unpaced(DataPath::Kernel, 2400.0),
            unpaced(DataPath::Xdp, 3000.0),
        ];
        assert_eq!(paced_start(point, 2500, &fast), (2500, None));
        let other = Point::new(Workload::TcpPaced, 100, Offload::Off);
        assert_eq!(paced_start(other, 2500, &fake.runs[..2]), (2500, None));
    }
}
