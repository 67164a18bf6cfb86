//! A fairer wire for TCP: the same iperf2 runs (offload off) on a fresh
//! topology with an XDP "cable" namespace on each side of the router
//! ([`tests::bench_topology::CabledTopology`]). On a plain veth, native
//! XDP copies every cloned TCP skb before the router's program runs
//! (`skb_pp_cow_data`), a cost a NIC's receive ring does not have; with
//! the cables that copy happens in the cable, and the router receives
//! frames as from a NIC, on both paths alike.
//!
//! The paced "CPU at line rate" points run here too, on kernel, xdp and
//! offload (offload mode's XDP program gives the router's veths NAPI like
//! standalone mode's), so that the review table compares the router's CPU
//! without the copy that only veth makes.
//!
//! The connection setup rate runs here too (`workloads::connrate`, every
//! path, alternating): on a plain veth, with any XDP program attached,
//! each handshake and close the kernel handles first takes veth's XDP
//! path (the copy above, a new skb after `XDP_PASS`), which is all of a
//! connection on the offload path until its daemon offloads it.
//!
//! The kernel path gets a `return XDP_PASS` program on the router's veths
//! for its runs: a veth accepts the cables' redirected frames only while
//! it runs NAPI, and GRO (the other way to get NAPI) would aggregate what
//! the router forwards, which offload off rules out.

use std::sync::atomic::{AtomicBool, Ordering};

use tests::bench_topology::CabledTopology;
use tests::rawbpf::Attached;

use crate::model::{DataPath, Offload, Point, RunResult, Settings, Wire, Workload};
use crate::plan;
use crate::router::{Router, congestion_control};
use crate::run::{PacedRunner, RerunBudget, paced_rounds, with_fast_path_share};
use crate::workloads::connrate;
use crate::workloads::iperf::{self, next_port};

/// The points on the cables: TCP at every count of `conns`, `-l 128`
/// (Nagle on, the review's setting) at those of 1000 and more, and the
/// paced "CPU at line rate" load at every count of `paced_conns`.
pub fn points(conns: &[u32], paced_conns: &[u32]) -> Vec<Point> {
    let p = |workload, conns| Point::new(workload, conns, Offload::Off);
    let mut v: Vec<Point> = conns.iter().map(|&c| p(Workload::Tcp, c)).collect();
    v.extend(
        conns
            .iter()
            .filter(|&&c| c >= 1000)
            .map(|&c| p(Workload::TcpSmall, c)),
    );
    v.extend(paced_conns.iter().map(|&c| p(Workload::TcpPaced, c)));
    v
}

/// The paths of a point on the cables: kernel and xdp; offload too on the
/// paced points (the review table's "CPU at line rate" rows) when
/// `offload_path`.
pub fn paths_of(point: Point, offload_path: bool) -> Vec<DataPath> {
    let mut paths = vec![DataPath::Kernel, DataPath::Xdp];
    if offload_path && point.workload == Workload::TcpPaced {
        paths.push(DataPath::Offload);
    }
    paths
}

/// The kernel path alone has no XDP program of its own on the router's
/// veths (see the module's comment): its NAPI program, attached while the
/// result lives.
fn napi_for(t: &CabledTopology, path: DataPath) -> Result<Option<Attached>, String> {
    match path {
        DataPath::Kernel => t.napi_for_kernel().map(Some),
        _ => Ok(None),
    }
}

/// The cabled topology and what its runs share.
struct Cables<'a> {
    t: &'a CabledTopology,
    router: Router<'a>,
    s: Settings,
    port: &'a mut u16,
    stop: &'a AtomicBool,
    runs: Vec<RunResult>,
    failures: &'a mut Vec<String>,
}

impl Cables<'_> {
    /// `point` on `path`; a failure is recorded. Returns whether it ran
    /// (not stopped).
    fn run_point(&mut self, point: Point, path: DataPath) -> bool {
        if self.stop.load(Ordering::SeqCst) {
            return false;
        }
        eprintln!("[cable] {point} | {:<6}", path.name());
        let res = self.one(point, path);
        match res {
            Ok(mut r) => {
                r.wire = Wire::Cable;
                if point.workload == Workload::TcpPaced {
                    r.offered_mbps = self.s.line_rate_mbps;
                }
                eprintln!("        {}", crate::run::show(&r));
                self.runs.push(r);
            }
            Err(e) => {
                eprintln!("        FAILED: {e}");
                self.failures
                    .push(format!("cable, {point} on {}: {e}", path.name()));
            }
        }
        true
    }

    fn one(&mut self, point: Point, path: DataPath) -> Result<RunResult, String> {
        self.router.switch(path, point.offload)?;
        let napi = napi_for(self.t, path)?;
        next_port(self.port);
        let (t, s, port): (&tests::Topology, _, _) = (self.t, &self.s, *self.port);
        let one = || iperf::run(t, s, path, point, port);
        let res = if path == DataPath::Offload {
            with_fast_path_share(t, one)
        } else {
            one()
        };
        drop(napi);
        res
    }
}

impl PacedRunner for Cables<'_> {
    fn runs_mut(&mut self) -> &mut Vec<RunResult> {
        &mut self.runs
    }

    fn round(
        &mut self,
        point: Point,
        order: &[DataPath],
        mbps: u32,
        _rerun: bool,
    ) -> Result<bool, String> {
        let line_rate = self.s.line_rate_mbps;
        self.s.line_rate_mbps = mbps;
        let all = order.iter().all(|&path| self.run_point(point, path));
        self.s.line_rate_mbps = line_rate;
        Ok(all)
    }
}

/// Every point on its paths ([`paths_of`]), rotating which goes first
/// (the paced ones in rounds, within `paced_budget`: see
/// [`paced_rounds`]), then the connection setup rate's rounds of
/// `conn_rate` if given. Failed runs are recorded in `failures`.
pub fn run(
    s: &Settings,
    (cc, points, offload_path): (&str, &[Point], bool),
    conn_rate: Option<&connrate::Rounds>,
    port: &mut u16,
    (stop, paced_budget): (&AtomicBool, &mut RerunBudget),
    failures: &mut Vec<String>,
) -> Result<(Vec<RunResult>, Vec<connrate::Row>), String> {
    let t = CabledTopology::new()?;
    t.warm_neighbours();
    let (_, per_socket) = congestion_control(&t, cc);
    let mut cables = Cables {
        t: &t,
        router: Router::new(&t).with_gro(s.router_gro),
        s: Settings {
            cc_per_socket: per_socket,
            tmp: s.tmp.clone(),
            ..*s
        },
        port,
        stop,
        runs: Vec::new(),
        failures,
    };
    'points: for (i, &point) in points.iter().enumerate() {
        let mut order = paths_of(point, offload_path);
        let n = order.len();
        order.rotate_left(i % n);
        if point.workload == Workload::TcpPaced {
            let round_s = plan::paced_round_secs(s.secs, point, order.len());
            match paced_rounds(
                &mut cables,
                point,
                &order,
                s.line_rate_mbps,
                round_s,
                paced_budget,
            ) {
                Ok(true) => {}
                Ok(false) => break 'points,
                Err(e) => cables.failures.push(format!("cable, {point}: {e}")),
            }
        } else {
            for &path in &order {
                if !cables.run_point(point, path) {
                    break 'points;
                }
            }
        }
        if stop.load(Ordering::SeqCst) {
            break;
        }
    }
    let conn_rows = match conn_rate {
        Some(plan) if !stop.load(Ordering::SeqCst) => connrate::rounds(
            &t,
            &mut cables.router,
            plan,
            |path| napi_for(&t, path),
            stop,
            cables.failures,
        ),
        _ => Vec::new(),
    };
    // The daemon works on the cabled topology's router namespace: stopped
    // before the topology goes.
    cables.router.stop_daemon();
    Ok((cables.runs, conn_rows))
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn paced_points_run_on_the_cables_with_offload_when_it_runs() {
        let pts = points(&[1, 1000], &[1, 100]);
        let names: Vec<String> = pts.iter().map(ToString::to_string).collect();
        assert_eq!(
            names,
            [
                "tcp -P 1, offload off",
                "tcp -P 1000, offload off",
                "tcp-small -P 1000 -l 128, offload off",
                "tcp-paced -P 1, offload off",
                "tcp-paced -P 100, offload off",
            ]
        );
        let paced = pts[3];
        assert_eq!(
            paths_of(paced, true),
            [DataPath::Kernel, DataPath::Xdp, DataPath::Offload]
        );
        assert_eq!(paths_of(paced, false), [DataPath::Kernel, DataPath::Xdp]);
        assert_eq!(paths_of(pts[0], true), [DataPath::Kernel, DataPath::Xdp]);
    }
}
