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
use crate::model::{DataPath, Offload, Point, RunResult, Settings, Wire, Workload};
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
        "{thr}, rtt p50 {:.3} / p99 {:.3} ms, cpu {:.0}% (softirq {:.0}%), {:.0} ns/pkt \
         ({:.0} B/pkt) over {:.1} s active of {:.1} s (whole run: cpu {:.0}%, {:.0} ns per \
         forwarded pkt, {} pkts)",
        r.rtt_ms_p50,
        r.rtt_ms_p99,
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

/// A paced point run again at a rate every path sustains.
#[derive(Debug, PartialEq)]
pub struct PaceDown {
    /// The lower total rate, Mbit/s.
    pub mbps: u32,
    /// What the first set carried, for the reruns' notes.
    pub note: String,
}

/// "CPU at line rate" compares the paths at equal load: where one of the
/// runs of paced `point` at `offered` Mbit/s among `runs` carried less than
/// 95 % of it (the shared cores could not generate it), all paths run
/// again at 90 % of the lowest carried rate (rounded down to 50 Mbit/s).
/// None: all sustained it, or fewer than two paths ran.
pub fn pace_down(point: Point, offered: u32, runs: &[RunResult]) -> Option<PaceDown> {
    let carried: Vec<(DataPath, f64)> = runs
        .iter()
        .filter(|r| r.point == point && r.offered_mbps == offered)
        .map(|r| (r.path, r.gbps * 1000.0))
        .collect();
    let lowest = carried.iter().map(|c| c.1).fold(f64::INFINITY, f64::min);
    if carried.len() < 2 || !lowest.is_finite() || lowest >= 0.95 * f64::from(offered) {
        return None;
    }
    let mbps = ((lowest * 0.9 / 50.0).floor() * 50.0).max(50.0) as u32;
    let first = carried
        .iter()
        .map(|(p, c)| format!("{} {c:.0}", p.name()))
        .collect::<Vec<_>>()
        .join(", ");
    Some(PaceDown {
        mbps,
        note: format!(
            "{offered} Mbit/s offered first: carried {first} Mbit/s; run again at {mbps} \
             Mbit/s, which all sustain"
        ),
    })
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
        // Only an old kernel is a reason to leave it out; anywhere newer a
        // failure is the generator's (or the harness's) and must show.
        if tests::kernel_at_least(5, 18) {
            return Err(format!("the live-frame generator does not work: {e}"));
        }
        eprintln!("bench: skipping udp-live: {e}");
        skipped.push(format!(
            "udp-live skipped: BPF_PROG_RUN live-frame mode needs Linux >= 5.18: {e}"
        ));
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
            for path in order {
                if self.stopped() {
                    self.failures.push(format!(
                        "interrupted after {} of {} runs",
                        progress.done, progress.total
                    ));
                    return Ok(());
                }
                self.run_point(*point, path, &mut progress)?;
            }
            if point.workload == Workload::TcpPaced {
                self.pace_down(*point, &mut progress)?;
            }
        }
        Ok(())
    }

    /// "CPU at line rate" compares the paths at equal load: see
    /// [`pace_down`]; the rerun replaces the first set.
    fn pace_down(&mut self, point: Point, progress: &mut Progress) -> Result<(), String> {
        let offered = self.settings.line_rate_mbps;
        let Some(rerun) = pace_down(point, offered, &self.runs) else {
            return Ok(());
        };
        eprintln!("      {}", rerun.note);
        self.runs.retain(|r| r.point != point);
        self.settings.line_rate_mbps = rerun.mbps;
        let mut paths = paths_of(self.o, point);
        paths.reverse();
        progress.total += paths.len();
        let mut res = Ok(());
        for path in paths {
            if self.stopped() {
                break;
            }
            res = self.run_point(point, path, progress);
            if res.is_err() {
                break;
            }
            if let Some(r) = self.runs.last_mut().filter(|r| r.point == point) {
                r.notes.push(rerun.note.clone());
            }
        }
        self.settings.line_rate_mbps = offered;
        res
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
            self.stop,
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
        router: Router::new(&t),
        settings: Settings {
            tcp_sink: o.tcp_sink,
            secs: o.secs,
            slack: o.slack,
            ping_interval: o.ping_interval,
            tmp: tmp.clone(),
            nofile,
            cc_per_socket,
            line_rate_mbps: o.line_rate_mbps,
        },
        stop,
        live: points.iter().any(|p| p.workload == Workload::UdpLive),
        port: 5000,
        runs: Vec::new(),
        failures: Vec::new(),
        offload_states: serde_json::Map::new(),
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

    fn paced(path: DataPath, carried_mbps: f64) -> RunResult {
        let point = Point::new(Workload::TcpPaced, 100, Offload::Off);
        let mut r = RunResult::blank(path, point);
        r.gbps = carried_mbps / 1000.0;
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
        let again = pace_down(point, 2500, &runs).unwrap();
        // 90 % of 2000, rounded down to 50 Mbit/s.
        assert_eq!(again.mbps, 1800);
        assert!(
            again
                .note
                .contains("carried kernel 2490, xdp 2000 Mbit/s; run again at 1800"),
            "{}",
            again.note
        );
        // Every path within 95 % of the offered rate, or one path alone: no rerun.
        let sustained = [
            paced(DataPath::Kernel, 2400.0),
            paced(DataPath::Xdp, 2380.0),
        ];
        assert_eq!(pace_down(point, 2500, &sustained), None);
        assert_eq!(pace_down(point, 2500, &runs[1..]), None);
        // Runs at another offered rate (a rerun's) do not count.
        assert_eq!(pace_down(point, 1800, &runs), None);
    }
}
