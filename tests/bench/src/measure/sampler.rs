//! Counters sampled while a load runs, and the window of a run in which
//! traffic flowed.

use std::time::{Duration, Instant};

use tests::{HOST_IF, LAN_IF, Ns, Topology, WAN_IF};

use crate::measure::parse::{parse_net_dev, parse_softnet_drops};
use crate::measure::sys::CpuTicks;

/// One reading of the machine's CPU ticks and the interface counters.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    at: f64,
    cpu: CpuTicks,
    /// Packets and bytes received on the router's LAN + WAN interfaces
    /// (veth counts every frame its NAPI or backlog took in, XDP-redirected
    /// ones included).
    rx_pkts: u64,
    rx_bytes: u64,
    /// Bytes the server's interface received (what reached the sink).
    sink_bytes: u64,
    /// Packets the server's interface received.
    sink_pkts: u64,
    /// Packets the kernel dropped for a full per-CPU backlog (all CPUs).
    backlog_drops: u64,
}

/// Reads a /proc file again from the start.
fn reread(f: &mut std::fs::File) -> String {
    use std::io::{Read, Seek};
    let mut s = String::new();
    if f.rewind().is_ok() {
        let _ = f.read_to_string(&mut s);
    }
    s
}

/// Samples CPU and interface counters every `period` without spawning a
/// process while the load runs: a `/proc/thread-self/net/dev` opened
/// inside a network namespace keeps showing that namespace, so one thread
/// opens the router's and the server's and then only rereads them.
pub struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Milliseconds after the start at which the router first saw
    /// [`TRAFFIC_PPS`]; `u64::MAX` until then.
    started_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    handle: std::thread::JoinHandle<Vec<Sample>>,
}

/// Packet rate at the router that counts as "the load is running" (a few
/// pings or ARP are far below, every workload far above).
const TRAFFIC_PPS: f64 = 10_000.0;

impl Sampler {
    pub fn start(t: &Topology, start: Instant, period: Duration) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let started_ms = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
        let started = started_ms.clone();
        let (rtr, srv) = (
            t.ns_name(Ns::Router).to_owned(),
            t.ns_name(Ns::Server).to_owned(),
        );
        let handle = std::thread::spawn(move || {
            let open = |ns: &str| {
                tests::netns::enter(ns);
                std::fs::File::open("/proc/thread-self/net/dev").ok()
            };
            let (Some(mut rdev), Some(mut sdev)) = (open(&rtr), open(&srv)) else {
                return Vec::new();
            };
            let mut softnet = std::fs::File::open("/proc/net/softnet_stat").ok();
            let mut v: Vec<Sample> = Vec::new();
            loop {
                let (rx_pkts, rx_bytes) = parse_net_dev(&reread(&mut rdev), &[LAN_IF, WAN_IF]);
                let (sink_pkts, sink_bytes) = parse_net_dev(&reread(&mut sdev), &[HOST_IF]);
                let backlog_drops = softnet
                    .as_mut()
                    .map_or(0, |f| parse_softnet_drops(&reread(f)));
                let at = start.elapsed().as_secs_f64();
                if let Some(prev) = v.last().copied()
                    && started.load(Ordering::Relaxed) == u64::MAX
                    && (rx_pkts.saturating_sub(prev.rx_pkts)) as f64 / (at - prev.at).max(1e-6)
                        >= TRAFFIC_PPS
                {
                    started.store((prev.at * 1000.0) as u64, Ordering::Relaxed);
                }
                v.push(Sample {
                    at,
                    cpu: CpuTicks::now(),
                    rx_pkts,
                    rx_bytes,
                    sink_bytes,
                    sink_pkts,
                    backlog_drops,
                });
                if flag.load(Ordering::Relaxed) {
                    return v;
                }
                std::thread::sleep(period);
            }
        });
        Self {
            stop,
            started_ms,
            handle,
        }
    }

    /// Seconds since the start at which the load began, once it has.
    pub fn started(&self) -> Option<f64> {
        let ms = self.started_ms.load(std::sync::atomic::Ordering::Relaxed);
        (ms != u64::MAX).then(|| ms as f64 / 1000.0)
    }

    pub fn finish(self) -> Vec<Sample> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// Packets received so far on `devs` of namespace `ns`.
pub fn rx_packets(t: &Topology, ns: Ns, devs: &[&str]) -> u64 {
    let o = t.exec(ns, &["cat", "/proc/net/dev"]);
    parse_net_dev(&String::from_utf8_lossy(&o.stdout), devs).0
}

/// Waits (at most `max`) until the router sees less than `pps` packets per
/// second: data a previous run left in socket buffers must not flow into
/// the next one. Returns the seconds waited.
pub fn wait_quiet(t: &Topology, pps: u64, max: Duration) -> f64 {
    let start = Instant::now();
    let read = || rx_packets(t, Ns::Router, &[LAN_IF, WAN_IF]);
    let mut last = (Instant::now(), read());
    while start.elapsed() < max {
        std::thread::sleep(Duration::from_millis(250));
        let now = (Instant::now(), read());
        let rate = (now.1.saturating_sub(last.1)) as f64 / (now.0 - last.0).as_secs_f64();
        if rate < pps as f64 {
            break;
        }
        last = now;
    }
    start.elapsed().as_secs_f64()
}

/// Figures over the part of the run in which traffic flowed: from the
/// first to the last sampling interval whose packet rate reached a quarter
/// of the peak (thousands of iperf2 streams take seconds to connect and to
/// report, with the cores mostly idle).
#[derive(Clone, Copy, Debug, Default)]
pub struct Window {
    /// Seconds since the client started.
    pub from: f64,
    pub secs: f64,
    pub cpu: CpuTicks,
    pub pkts: u64,
    pub bytes: u64,
    pub sink_bytes: u64,
    pub sink_pkts: u64,
    pub backlog_drops: u64,
}

pub fn active_window(v: &[Sample]) -> Option<Window> {
    let rates: Vec<f64> = v
        .windows(2)
        .map(|w| (w[1].rx_pkts.saturating_sub(w[0].rx_pkts)) as f64 / (w[1].at - w[0].at).max(1e-6))
        .collect();
    let peak = rates.iter().copied().fold(0.0_f64, f64::max);
    if peak <= 0.0 {
        return None;
    }
    let first = rates.iter().position(|&r| r >= peak / 4.0)?;
    let last = rates.iter().rposition(|&r| r >= peak / 4.0)?;
    Some(window_between(v[first], v[last + 1]))
}

/// The `secs` seconds of samples that end at `until` (seconds since the
/// start): the measurement of a run stopped after ramp-up plus `secs`.
pub fn window_ending(v: &[Sample], until: f64, secs: f64) -> Option<Window> {
    let end = v.iter().rposition(|x| x.at <= until + 0.05)?;
    let b = v[end];
    let first = v.iter().position(|x| x.at >= b.at - secs - 0.05)?;
    (first < end).then(|| window_between(v[first], b))
}

fn window_between(a: Sample, b: Sample) -> Window {
    Window {
        from: a.at,
        secs: b.at - a.at,
        cpu: a.cpu.until(b.cpu),
        pkts: b.rx_pkts.saturating_sub(a.rx_pkts),
        bytes: b.rx_bytes.saturating_sub(a.rx_bytes),
        sink_bytes: b.sink_bytes.saturating_sub(a.sink_bytes),
        sink_pkts: b.sink_pkts.saturating_sub(a.sink_pkts),
        backlog_drops: b.backlog_drops.saturating_sub(a.backlog_drops),
    }
}
