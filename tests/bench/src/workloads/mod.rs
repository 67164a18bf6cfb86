//! The workloads: iperf2 TCP and UDP load (`iperf`), the live-frame UDP
//! generator (`live`), the `BPF_PROG_RUN` micro-benchmark (`micro`), the
//! frags experiment (`frags`), the plain-forwarding reference
//! (`reference`), scaling with cores (`scaling`), TCP between XDP
//! cables (`cable`), the connection setup rate (`connrate`), a large
//! flow table (`bigtable`) and IPv6 rows (`ipv6`), with what they share: the TCP discard sink and
//! background processes.

pub mod bigtable;
pub mod cable;
pub mod connrate;
pub mod discard;
pub mod frags;
pub mod iperf;
pub mod ipv6;
pub mod live;
pub mod micro;
pub mod procs;
pub mod reference;
pub mod scaling;

use std::net::IpAddr;
use std::path::Path;

use tests::{Ns, SERVER_ADDR, Topology};

use crate::model::Settings;
use procs::{Watched, spawn_sh};

/// Ping from the client to the server through the router every
/// `ping_interval` for at most `limit` seconds, `-D` timestamps into `out`
/// (root may ping faster than every 0.2 s). `cpu`: run it there.
pub fn start_ping(
    t: &Topology,
    s: &Settings,
    out: &Path,
    limit: u32,
    cpu: Option<usize>,
) -> Watched {
    start_ping_to(t, s, (out, limit, cpu), SERVER_ADDR.into())
}

/// [`start_ping`] to `dst` (e.g. the server's IPv6 address: ping picks the
/// family from the address).
pub fn start_ping_to(
    t: &Topology,
    s: &Settings,
    (out, limit, cpu): (&Path, u32, Option<usize>),
    dst: IpAddr,
) -> Watched {
    let pin = cpu.map_or_else(String::new, |c| format!("taskset -c {c} "));
    spawn_sh(
        t,
        Ns::Client,
        &format!(
            "exec {pin}timeout -k 1 {} ping -D -n -i {} -w {limit} -W 1 {dst} > {} 2>&1",
            limit + 2,
            s.ping_interval,
            out.display()
        ),
    )
}
