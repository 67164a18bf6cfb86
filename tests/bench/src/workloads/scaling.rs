//! Scaling with cores: the live-frame generator on 1 CPU and on every CPU
//! (one generator per CPU), through kernel, xdp and the limit, on a fresh
//! topology whose veths have as many queues as there are CPUs (`ethtool
//! -L`, the same as `numtxqueues N numrxqueues N` at creation). A veth
//! transmit picks the peer's receive queue by the sending CPU, so each
//! generator feeds its own queue of the router's `lan0`, whose NAPI runs on
//! that CPU: the router's work spreads as RSS spreads it on a NIC.

use std::sync::atomic::AtomicBool;

use tests::trafficgen;
use tests::{HOST_IF, LAN_IF, Ns, Topology, WAN_IF};

use crate::model::{DataPath, Offload, Point, RunResult, Settings, Workload};
use crate::router::Router;
use crate::workloads::live;

/// One scaling run: a path on `cores` generators.
pub struct Row {
    pub cores: usize,
    pub run: RunResult,
}

/// Gives every veth of `t` `queues` receive and transmit queues.
fn set_queues(t: &Topology, queues: usize) -> Result<(), String> {
    let n = queues.to_string();
    for (ns, dev) in [
        (Ns::Client, HOST_IF),
        (Ns::Router, LAN_IF),
        (Ns::Router, WAN_IF),
        (Ns::Server, HOST_IF),
    ] {
        let o = t.exec(ns, &["ethtool", "-L", dev, "rx", &n, "tx", &n]);
        if !o.status.success() {
            return Err(format!(
                "ethtool -L {dev} rx {n} tx {n}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
    }
    Ok(())
}

/// Kernel, xdp and limit on 1 (unless `all_only`) and on all CPUs, `flows`
/// flows, rotating the path order per core count. A failed run is recorded
/// in `failures`.
pub fn run(
    s: &Settings,
    (flows, all_only): (u32, bool),
    stop: &AtomicBool,
    failures: &mut Vec<String>,
) -> Result<Vec<Row>, String> {
    let cpus = trafficgen::allowed_cpus()?;
    let t = Topology::new();
    set_queues(&t, cpus.len())?;
    t.warm_neighbours();
    let mut router = Router::new(&t).with_gro(s.router_gro);
    let point = Point::new(Workload::UdpLive, flows, Offload::Off);
    let mut counts = vec![1];
    if cpus.len() > 1 {
        counts.push(cpus.len());
    }
    if all_only {
        counts.drain(..counts.len() - 1);
    }
    let mut rows = Vec::new();
    for (i, &cores) in counts.iter().enumerate() {
        let mut order = [DataPath::Kernel, DataPath::Xdp, DataPath::Limit];
        order.rotate_left(i % 3);
        for path in order {
            if stop.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(rows);
            }
            eprintln!(
                "[scaling] udp-live, {flows} flows, {cores} generator(s) | {:<6}",
                path.name()
            );
            router.switch(path, Offload::Off)?;
            // The last `cores` CPUs: on one core, the one the main runs use.
            let on = &cpus[cpus.len() - cores..];
            match live::run_on(&t, s, (path, point), on, stop) {
                Ok(run) => {
                    eprintln!("        {}", crate::run::show(&run));
                    rows.push(Row { cores, run });
                }
                Err(e) => {
                    eprintln!("        FAILED: {e}");
                    failures.push(format!("scaling, {cores} core(s), {}: {e}", path.name()));
                }
            }
        }
    }
    Ok(rows)
}
