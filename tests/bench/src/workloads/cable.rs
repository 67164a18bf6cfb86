//! A fairer wire for TCP: the same iperf2 runs (offload off) on a fresh
//! topology with an XDP "cable" namespace on each side of the router
//! ([`tests::bench_topology::CabledTopology`]). On a plain veth, native
//! XDP copies every cloned TCP skb before the router's program runs
//! (`skb_pp_cow_data`), a cost a NIC's receive ring does not have; with
//! the cables that copy happens in the cable, and the router receives
//! frames as from a NIC, on both paths alike.
//!
//! The kernel path gets a `return XDP_PASS` program on the router's veths
//! for its runs: a veth accepts the cables' redirected frames only while
//! it runs NAPI, and GRO (the other way to get NAPI) would aggregate what
//! the router forwards, which offload off rules out.

use std::sync::atomic::{AtomicBool, Ordering};

use tests::bench_topology::CabledTopology;

use crate::model::{DataPath, Offload, Point, RunResult, Settings, Workload};
use crate::router::{Router, congestion_control};
use crate::workloads::iperf::{self, next_port};

/// The points on the cables: TCP at every count of `conns`, and `-l 128`
/// (Nagle on, the review's setting) at those of 1000 and more.
pub fn points(conns: &[u32]) -> Vec<Point> {
    let p = |workload, conns| Point {
        workload,
        conns,
        offload: Offload::Off,
        nodelay: false,
    };
    let mut v: Vec<Point> = conns.iter().map(|&c| p(Workload::Tcp, c)).collect();
    v.extend(
        conns
            .iter()
            .filter(|&&c| c >= 1000)
            .map(|&c| p(Workload::TcpSmall, c)),
    );
    v
}

/// Every point on both paths, alternating which goes first. Failed runs are
/// recorded in `failures`.
pub fn run(
    s: &Settings,
    (cc, points): (&str, &[Point]),
    port: &mut u16,
    stop: &AtomicBool,
    failures: &mut Vec<String>,
) -> Result<Vec<RunResult>, String> {
    let t = CabledTopology::new()?;
    t.warm_neighbours();
    let (_, per_socket) = congestion_control(&t, cc);
    let s = Settings {
        cc_per_socket: per_socket,
        tmp: s.tmp.clone(),
        ..*s
    };
    let mut router = Router::new(&t);
    let mut runs = Vec::new();
    for (i, &point) in points.iter().enumerate() {
        let mut order = [DataPath::Kernel, DataPath::Xdp];
        order.rotate_left(i % 2);
        for path in order {
            if stop.load(Ordering::SeqCst) {
                return Ok(runs);
            }
            eprintln!("[cable] {point} | {:<6}", path.name());
            router.switch(path, point.offload)?;
            let napi = match path {
                DataPath::Kernel => Some(t.napi_for_kernel()?),
                _ => None,
            };
            next_port(port);
            let res = iperf::run(&t, &s, path, point, *port);
            drop(napi);
            match res {
                Ok(r) => {
                    eprintln!("        {}", crate::run::show(&r));
                    runs.push(r);
                }
                Err(e) => {
                    eprintln!("        FAILED: {e}");
                    failures.push(format!("cable, {point} on {}: {e}", path.name()));
                }
            }
        }
    }
    Ok(runs)
}
