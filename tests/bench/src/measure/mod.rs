//! Measurement: machine counters (`sys`), samplers of the interfaces and
//! CPU during a run (`sampler`), and parsers of what iperf2, ping and
//! `/proc` print (`parse`).

pub mod hosts;
pub mod parse;
pub mod platform;
pub mod sampler;
pub mod sys;

use std::path::Path;

use parse::Pings;
use sampler::Window;
use sys::CpuTicks;

/// What every run measures alike, whatever generates the load.
pub struct Measured {
    /// The part of the run in which traffic flowed.
    pub window: Window,
    /// The pings that count for the run (none answered: `None`).
    pub pings: Option<Pings>,
    /// CPU ticks over the whole run.
    pub run_cpu: CpuTicks,
    /// Packets the router forwarded over the whole run.
    pub router_pkts: u64,
    pub wall_s: f64,
    /// Seconds waited before the run for traffic left from the previous one.
    pub quiet_wait_s: f64,
}

/// Seconds since the Unix epoch (ping's `-D` timestamps are in it).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A report file a tool wrote, empty if it wrote none.
pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}
