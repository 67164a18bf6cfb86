//! The one reference the goals need that the two paths do not give: plain
//! kernel forwarding without netfilter.

use tests::Topology;

use crate::model::{DataPath, Offload, Point, RunResult, Settings, Workload};
use crate::router::{apply_offload, congestion_control};
use crate::workloads::iperf::{self, next_port};

/// TCP -P 1, offload off, through a fresh topology whose router only
/// forwards: no iptables rule was ever loaded in its namespace, so no
/// netfilter hook runs, and the server has a route back instead of NAT.
/// Returns the run and the congestion control in force.
pub fn run(s: &Settings, cc: &str, port: &mut u16) -> Result<(RunResult, String), String> {
    let t = Topology::new();
    t.route_back();
    t.warm_neighbours();
    let (cc_in_force, per_socket) = congestion_control(&t, cc);
    let s = Settings {
        cc_per_socket: per_socket,
        tmp: s.tmp.clone(),
        ..*s
    };
    apply_offload(&t, DataPath::Kernel, Offload::Off, s.router_gro);
    let point = Point::new(Workload::Tcp, 1, Offload::Off);
    next_port(port);
    let r = iperf::run(&t, &s, DataPath::Kernel, point, *port)?;
    Ok((r, cc_in_force))
}
