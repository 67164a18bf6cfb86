//! One measured run: switch the router to a path and an offload setting,
//! start a fresh iperf2 server, run the iperf2 client (bounded by
//! `timeout -k`) with ping alongside, and turn counters into figures.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tests::{HOST_IF, LAN_IF, Ns, SERVER_ADDR, Topology, WAN_IF, counter_of};

use crate::sink::DiscardSink;
use crate::sys::{CpuTicks, percentile};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPath {
    Kernel,
    Xdp,
}

impl DataPath {
    pub fn name(self) -> &'static str {
        match self {
            DataPath::Kernel => "kernel",
            DataPath::Xdp => "xdp",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// iperf2 TCP at the default write length (128 KiB).
    Tcp,
    /// iperf2 TCP with `-l 128`.
    TcpSmall,
    /// iperf2 UDP, 64-byte payload, unlimited rate.
    UdpSmall,
    /// UDP, 64-byte payload, from the in-kernel generator
    /// (`BPF_PROG_RUN` live frames, see `live.rs`).
    UdpLive,
}

impl Workload {
    pub const ALL: [Workload; 4] = [
        Workload::Tcp,
        Workload::TcpSmall,
        Workload::UdpSmall,
        Workload::UdpLive,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Tcp => "tcp",
            Workload::TcpSmall => "tcp-small",
            Workload::UdpSmall => "udp-small",
            Workload::UdpLive => "udp-live",
        }
    }

    /// The workload in results.json: the live generator sends the same
    /// 64-byte UDP as iperf2 (its runs say `"generator": "bpf-live-frames"`).
    pub fn json_name(self) -> &'static str {
        match self {
            Workload::UdpLive => "udp-small",
            w => w.name(),
        }
    }

    /// Which program generates the load.
    pub fn generator(self) -> &'static str {
        match self {
            Workload::UdpLive => "bpf-live-frames",
            _ => "iperf2",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.name() == s)
    }

    pub fn is_udp(self) -> bool {
        matches!(self, Workload::UdpSmall | Workload::UdpLive)
    }
}

/// veth offload setting of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offload {
    /// TSO/GSO off everywhere, GRO off on the router: MTU-size packets
    /// through the router, like a wire.
    Off,
    /// veth defaults (TSO/GSO on, tx checksum offload on the end hosts
    /// where the path allows it).
    On,
}

impl Offload {
    pub fn name(self) -> &'static str {
        match self {
            Offload::Off => "off",
            Offload::On => "on",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(Offload::Off),
            "on" => Some(Offload::On),
            _ => None,
        }
    }
}

/// One point of the benchmark (measured once per path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Point {
    pub workload: Workload,
    pub conns: u32,
    pub offload: Offload,
    /// `TCP_NODELAY` (`-N`), for tcp-small.
    pub nodelay: bool,
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.workload == Workload::UdpLive {
            let s = if self.conns == 1 { "" } else { "s" };
            return write!(f, "udp-live, {} flow{s}", self.conns);
        }
        write!(f, "{} -P {}", self.workload.name(), self.conns)?;
        if self.workload == Workload::TcpSmall {
            write!(f, " -l 128{}", if self.nodelay { " -N" } else { "" })?;
        }
        if !self.workload.is_udp() {
            write!(f, ", offload {}", self.offload.name())?;
        }
        Ok(())
    }
}

/// What one run measured. CPU, packet rate and cost are taken over the
/// active window (see [`active_window`]); `run_*` over the whole client run.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub path: DataPath,
    pub point: Point,
    /// TCP: bytes into the server's interface over the active window (what
    /// crossed the router to the sink); UDP: received datagrams x 64 B.
    pub gbps: f64,
    /// What the iperf2 client claims: bytes written by all streams over the
    /// longest stream's time (bytes still in socket buffers count too).
    pub iperf_gbps: f64,
    /// Packets per second: received datagrams for UDP, packets into the
    /// router (both directions) for TCP.
    pub pps: f64,
    pub sent_pps: f64,
    /// Packets into the router per second (both directions), active window.
    pub router_pps: f64,
    pub loss_pct: f64,
    /// UDP datagrams lost: iperf2's sequence gaps at the server; for the
    /// live generator, frames generated that did not reach the server.
    pub lost: u64,
    /// Datagrams the server's socket dropped (receive buffer full).
    pub sink_drops: u64,
    pub rtt_ms_p50: f64,
    pub rtt_ms_p99: f64,
    pub ping_loss_pct: f64,
    pub cpu_pct: f64,
    pub softirq_pct: f64,
    /// Machine softirq time / packets into the router, active window.
    pub router_ns_per_pkt: f64,
    pub router_avg_pkt_bytes: f64,
    pub active_s: f64,
    /// Packets dropped machine-wide for a full backlog queue, active window.
    pub backlog_drops: u64,
    /// Seconds waited before the run for traffic left from the previous one.
    pub quiet_wait_s: f64,
    /// Packets the router forwarded over the whole run (kernel
    /// `IpForwDatagrams`, plus the fast path's `fwd_*` under XDP).
    pub router_pkts: u64,
    pub run_cpu_pct: f64,
    pub run_ns_per_pkt: f64,
    /// Longest stream as iperf2 reports it (live generator: how long it
    /// generated).
    pub stream_s: f64,
    pub streams: u32,
    pub connect_failures: u32,
    pub wall_s: f64,
    pub cut_short: bool,
    /// Cut short so that the figures are doubtful (server died, streams
    /// missing, no traffic seen): such a run is retried. A client that only
    /// overran its time limit is not: the window still holds real traffic.
    pub suspect: bool,
    /// Runs made for this result (a run cut short is retried).
    pub attempts: u32,
    pub notes: Vec<String>,
}

/// What receives the TCP streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpSink {
    /// `iperf -s`, fresh per run.
    Iperf,
    /// [`DiscardSink`].
    Discard,
}

impl TcpSink {
    pub fn name(self) -> &'static str {
        match self {
            TcpSink::Iperf => "iperf",
            TcpSink::Discard => "discard",
        }
    }
}

enum Server {
    Iperf(Watched),
    Discard(DiscardSink),
}

/// Settings shared by every run.
pub struct Settings {
    pub tcp_sink: TcpSink,
    pub secs: u32,
    /// Seconds a client may overrun `-t` (plus 1 per 50 streams) before
    /// `timeout` stops it.
    pub slack: u32,
    pub ping_interval: f64,
    pub tmp: PathBuf,
    pub nofile: u64,
    /// TCP congestion control the clients request per socket (`-Z`), when
    /// the namespaces cannot select it.
    pub cc_per_socket: Option<String>,
}

/// Tracks the router's current path and offload setting, switching only
/// when a run needs another.
pub struct Router<'a> {
    t: &'a Topology,
    state: Option<(DataPath, Offload)>,
}

impl<'a> Router<'a> {
    pub fn new(t: &'a Topology) -> Self {
        Self { t, state: None }
    }

    /// Puts the router on `path` with `offload`. Kernel: forwarding plus
    /// iptables MASQUERADE; xdp: `router-ctl attach`, no iptables NAT.
    pub fn switch(&mut self, path: DataPath, offload: Offload) -> Result<(), String> {
        if self.state == Some((path, offload)) {
            return Ok(());
        }
        let t = self.t;
        // Tear down whatever runs now; offloads change only while detached
        // (an attached XDP program pins its peers' TSO off).
        if t.router_attached() {
            let o = t.router_ctl(&["detach"]);
            if !o.status.success() {
                return Err(format!(
                    "router-ctl detach failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
        }
        t.iptables(Ns::Router, &["-t", "nat", "-F"]);
        // Forget the kernel's NAT mappings if conntrack(8) is installed.
        let _ = t.exec(
            Ns::Router,
            &[
                "sh",
                "-c",
                "command -v conntrack >/dev/null && conntrack -F",
            ],
        );
        apply_offload(t, path, offload);
        match path {
            DataPath::Kernel => t.masquerade(),
            DataPath::Xdp => {
                let o = t.router_ctl(&["attach", LAN_IF, WAN_IF]);
                if !o.status.success() {
                    return Err(format!(
                        "router-ctl attach {LAN_IF} {WAN_IF} failed: {}",
                        String::from_utf8_lossy(&o.stderr)
                    ));
                }
            }
        }
        self.state = Some((path, offload));
        Ok(())
    }
}

/// ethtool settings of a path and offload mode.
///
/// End hosts keep GRO on in every mode: a veth accepts XDP-redirected
/// frames only when the receiving peer runs NAPI (GRO or XDP), and GRO
/// there only batches the end host's own receive, not what the router sees.
/// The XDP path keeps the end hosts' tx checksum offload off in every mode:
/// with it on, frames reach the XDP program with partial checksums and
/// redirected TCP stalls.
pub fn apply_offload(t: &Topology, path: DataPath, offload: Offload) {
    let (host, router): (&[&str], &[&str]) = match (offload, path) {
        (Offload::Off, _) => (
            &["tx", "off", "tso", "off", "gso", "off", "gro", "on"],
            &["tso", "off", "gso", "off", "gro", "off"],
        ),
        (Offload::On, DataPath::Kernel) => (
            &["tx", "on", "tso", "on", "gso", "on", "gro", "on"],
            &["tso", "on", "gso", "on", "gro", "off"],
        ),
        (Offload::On, DataPath::Xdp) => (
            &["tx", "off", "tso", "on", "gso", "on", "gro", "on"],
            &["tso", "on", "gso", "on", "gro", "off"],
        ),
    };
    let ifs = [
        (Ns::Client, HOST_IF, host),
        (Ns::Server, HOST_IF, host),
        (Ns::Router, LAN_IF, router),
        (Ns::Router, WAN_IF, router),
    ];
    for (ns, dev, feats) in ifs {
        let mut cmd = vec!["ethtool", "-K", dev];
        cmd.extend_from_slice(feats);
        let o = t.exec(ns, &cmd);
        if !o.status.success() {
            eprintln!(
                "warning: ethtool -K {dev} {} in {}: {}",
                feats.join(" "),
                t.ns_name(ns),
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
    }
}

/// The active offload features of the end hosts and the router, for the
/// report.
pub fn offload_state(t: &Topology) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (ns, dev) in [
        (Ns::Client, HOST_IF),
        (Ns::Router, LAN_IF),
        (Ns::Router, WAN_IF),
        (Ns::Server, HOST_IF),
    ] {
        let want = [
            "tx-checksum-ip-generic",
            "tx-tcp-segmentation",
            "generic-segmentation-offload",
            "generic-receive-offload",
        ];
        let feats: Vec<String> = ethtool_features(t, ns, dev)
            .into_iter()
            .filter(|(k, _)| want.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let role = match ns {
            Ns::Client => "client",
            Ns::Server => "server",
            _ => "router",
        };
        m.insert(format!("{role} {dev}"), feats.join(", ").into());
    }
    m.into()
}

/// Every feature of `dev` as `ethtool -k` shows it: (name, state), the
/// state with a `[requested ...]` or `[fixed]` note where ethtool adds one.
pub fn ethtool_features(t: &Topology, ns: Ns, dev: &str) -> Vec<(String, String)> {
    let out = t.exec(ns, &["ethtool", "-k", dev]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            Some((k.to_owned(), v.trim().to_owned()))
        })
        .collect()
}

/// One feature of [`ethtool_features`].
pub fn ethtool_feature(t: &Topology, ns: Ns, dev: &str, name: &str) -> Option<String> {
    ethtool_features(t, ns, dev)
        .into_iter()
        .find_map(|(k, v)| (k == name).then_some(v))
}

/// Packets the router forwarded so far on `path`: the kernel's
/// `IpForwDatagrams`, plus the fast path's redirects under XDP.
pub fn forwarded(t: &Topology, path: DataPath) -> u64 {
    let kernel = t.nstat(Ns::Router, "IpForwDatagrams");
    match path {
        DataPath::Kernel => kernel,
        DataPath::Xdp => {
            let s = t.stats();
            kernel + counter_of(&s, "fwd_outbound") + counter_of(&s, "fwd_inbound")
        }
    }
}

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

/// Receive packets and bytes summed over `devs` from a `/proc/net/dev` text.
pub fn parse_net_dev(text: &str, devs: &[&str]) -> (u64, u64) {
    let mut pk = 0;
    let mut by = 0;
    for l in text.lines() {
        let Some((dev, rest)) = l.split_once(':') else {
            continue;
        };
        if !devs.contains(&dev.trim()) {
            continue;
        }
        let v: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        if v.len() >= 2 {
            by += v[0];
            pk += v[1];
        }
    }
    (pk, by)
}

/// Column 2 of `/proc/net/softnet_stat` (hex, one line per CPU): packets
/// dropped because the backlog queue was full.
fn parse_softnet_drops(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|x| u64::from_str_radix(x, 16).ok())
        .sum()
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
    fn started(&self) -> Option<f64> {
        let ms = self.started_ms.load(std::sync::atomic::Ordering::Relaxed);
        (ms != u64::MAX).then(|| ms as f64 / 1000.0)
    }

    pub fn finish(self) -> Vec<Sample> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// Waits (at most `max`) until the router sees less than `pps` packets per
/// second: data a previous run left in socket buffers must not flow into
/// the next one. Returns the seconds waited.
pub fn wait_quiet(t: &Topology, pps: u64, max: Duration) -> f64 {
    let start = Instant::now();
    let read = || {
        let o = t.exec(Ns::Router, &["cat", "/proc/net/dev"]);
        parse_net_dev(&String::from_utf8_lossy(&o.stdout), &[LAN_IF, WAN_IF]).0
    };
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
fn window_ending(v: &[Sample], until: f64, secs: f64) -> Option<Window> {
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

/// A background process of the topology (its own process group) whose
/// exit time a watcher thread records without reaping it, so that it can
/// be killed by group safely until we reap it ourselves.
pub struct Watched {
    child: Child,
    exited: mpsc::Receiver<Instant>,
}

impl Watched {
    fn new(child: Child) -> Self {
        let (tx, rx) = mpsc::channel();
        let pid = child.id();
        std::thread::spawn(move || {
            // SAFETY: waitid with WNOWAIT on our own child leaves it
            // unreaped (its pid cannot be reused while we hold it).
            unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                libc::waitid(
                    libc::P_PID,
                    pid,
                    &raw mut info,
                    libc::WEXITED | libc::WNOWAIT,
                );
            }
            let _ = tx.send(Instant::now());
        });
        Self { child, exited: rx }
    }

    /// When it exited, if it has.
    fn exited_at(&self, wait: Duration) -> Option<Instant> {
        self.exited.recv_timeout(wait).ok()
    }

    /// Kills the process group if still running, reaps, returns whether it
    /// exited by itself and how.
    pub fn finish(mut self) -> (Option<Instant>, String) {
        let early = self.exited.try_recv().ok();
        if early.is_none()
            && let Ok(pid) = libc::pid_t::try_from(self.child.id())
        {
            // SAFETY: the child is not reaped yet, so neither its pid nor
            // its process group id can belong to anyone else.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
            }
        }
        let st = self
            .child
            .wait()
            .map_or_else(|e| e.to_string(), |s| s.to_string());
        (early, st)
    }
}

pub fn spawn_sh(t: &Topology, ns: Ns, script: &str) -> Watched {
    Watched::new(t.spawn(ns, &["sh", "-c", script]))
}

/// Parsed iperf2 `-y C` client lines.
#[derive(Debug, Default)]
struct ClientCsv {
    bytes: u64,
    /// Longest stream duration (seconds).
    secs: f64,
    streams: u32,
}

/// `time,src,sport,dst,dport,id,interval,bytes,bps[,udp fields]`; iperf
/// 2.1.8 prints one line per stream and no sum line in CSV mode.
fn parse_client_csv(text: &str) -> ClientCsv {
    let mut c = ClientCsv::default();
    for l in text.lines() {
        let f: Vec<&str> = l.trim().split(',').collect();
        if f.len() < 9 || f[5] == "-1" {
            continue;
        }
        let Some(end) = f[6]
            .split_once('-')
            .and_then(|(_, e)| e.parse::<f64>().ok())
        else {
            continue;
        };
        c.bytes += f[7].parse::<u64>().unwrap_or(0);
        c.secs = c.secs.max(end);
        c.streams += 1;
    }
    c
}

/// Parsed iperf2 `-u -y C` server lines: datagrams received and lost.
#[derive(Debug, Default)]
struct ServerUdp {
    received: u64,
    lost: u64,
    secs: f64,
    streams: u32,
}

/// UDP server line: `...,interval,bytes,bps,jitter,lost,total,pct,ooo`.
fn parse_server_udp(text: &str) -> ServerUdp {
    let mut s = ServerUdp::default();
    for l in text.lines() {
        let f: Vec<&str> = l.trim().split(',').collect();
        if f.len() < 12 || f[5] == "-1" {
            continue;
        }
        let (Ok(lost), Ok(total)) = (f[10].parse::<i64>(), f[11].parse::<i64>()) else {
            continue;
        };
        let end = f[6]
            .split_once('-')
            .and_then(|(_, e)| e.parse::<f64>().ok())
            .unwrap_or(0.0);
        s.lost += lost.max(0).cast_unsigned();
        s.received += (total - lost).max(0).cast_unsigned();
        s.secs = s.secs.max(end);
        s.streams += 1;
    }
    s
}

/// `ping -D` output: (Unix time, round-trip ms) per answered echo, and the
/// loss in percent: from the summary line if ping got to print it, else
/// from the gaps in the answered sequence numbers (ping is killed when the
/// client ends).
pub fn parse_ping(text: &str) -> (Vec<(f64, f64)>, f64) {
    let mut seqs: Vec<u64> = Vec::new();
    let rtts: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let at = l
                .strip_prefix('[')
                .and_then(|r| r.split_once(']'))
                .and_then(|(t, _)| t.parse().ok())
                .unwrap_or(f64::NAN);
            let (_, r) = l.split_once("time=")?;
            let rtt = r.split_whitespace().next()?.parse().ok()?;
            if let Some(seq) = l
                .split_once("icmp_seq=")
                .and_then(|(_, x)| x.split_whitespace().next()?.parse().ok())
            {
                seqs.push(seq);
            }
            Some((at, rtt))
        })
        .collect();
    let summary = text.lines().find_map(|l| {
        let (tx, rest) = l.split_once(" packets transmitted, ")?;
        let rx = rest.split_whitespace().next()?;
        let (tx, rx): (f64, f64) = (tx.trim().parse().ok()?, rx.parse().ok()?);
        (tx > 0.0).then(|| (tx - rx) * 100.0 / tx)
    });
    let from_seqs = || {
        let (lo, hi) = (seqs.iter().min()?, seqs.iter().max()?);
        let sent = (hi - lo + 1) as f64;
        Some((sent - seqs.len() as f64).max(0.0) * 100.0 / sent)
    };
    let loss = summary.or_else(from_seqs).unwrap_or(f64::NAN);
    (rtts, loss)
}

/// Round-trip times of the pings answered inside `win` (a window of a run
/// that started at Unix time `start_unix`).
pub fn rtts_within(pings: &[(f64, f64)], start_unix: f64, win: &Window) -> Vec<f64> {
    let (w0, w1) = (start_unix + win.from, start_unix + win.from + win.secs);
    pings
        .iter()
        .filter(|(at, _)| *at >= w0 && *at <= w1)
        .map(|p| p.1)
        .collect()
}

pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Waits until something listens on `port` in the server namespace.
fn wait_listening(t: &Topology, port: u16, udp: bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    let flag = if udp { "-Hlun" } else { "-Hltn" };
    let filter = format!("sport = :{port}");
    while Instant::now() < deadline {
        let o = t.exec(Ns::Server, &["ss", flag, &filter]);
        if !String::from_utf8_lossy(&o.stdout).trim().is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Seconds of load before the measured window of a TCP run: thousands of
/// iperf2 threads take seconds to connect and get going on two cores.
pub fn ramp_secs(conns: u32) -> f64 {
    1.0 + f64::from(conns) / 500.0
}

/// The next iperf2 port: a fresh one per run, so that nothing a previous
/// run left behind (a server in its last seconds, `TIME_WAIT`) meets the next.
pub fn next_port(port: &mut u16) {
    *port = if *port >= 7000 { 5001 } else { *port + 1 };
}

/// Time allowed for a client run before `timeout` stops it: iperf2 with
/// thousands of streams overruns `-t` by seconds.
pub fn client_limit(secs: u32, slack: u32, conns: u32) -> u32 {
    secs + slack + conns / 50
}

/// Runs one point on the router's current path.
pub fn run(
    t: &Topology,
    s: &Settings,
    path: DataPath,
    point: Point,
    port: u16,
) -> Result<RunResult, String> {
    let w = point.workload;
    let quiet_wait_s = wait_quiet(t, 2000, Duration::from_secs(10));
    let tag = format!("{}-{}-{port}", path.name(), w.name());
    let srv_out = s.tmp.join(format!("{tag}.server.csv"));
    let ping_out = s.tmp.join(format!("{tag}.ping.txt"));
    // TCP: the client runs until stopped: ramp-up, then `secs` measured;
    // `-t` leaves room so that no stream ends inside the window. UDP runs
    // to its own end (the server reports loss only then).
    let ramp = ramp_secs(point.conns);
    let t_arg = if w.is_udp() {
        s.secs
    } else {
        s.secs + ramp.ceil() as u32 + 2
    };
    let limit = client_limit(t_arg, s.slack, point.conns);
    let port_s = port.to_string();

    // A fresh server per run, bounded in time.
    let server = if w.is_udp() || s.tcp_sink == TcpSink::Iperf {
        let udp_flag = if w.is_udp() { " -u" } else { "" };
        let server = spawn_sh(
            t,
            Ns::Server,
            &format!(
                "exec timeout -k 2 {} iperf -s{udp_flag} -p {port} -y C > {} 2>&1",
                limit + 5,
                srv_out.display()
            ),
        );
        if !wait_listening(t, port, w.is_udp()) {
            let _ = server.finish();
            return Err(format!(
                "iperf -s on port {port} did not start: {}",
                read(&srv_out)
            ));
        }
        Server::Iperf(server)
    } else {
        let addr = std::net::SocketAddr::new(SERVER_ADDR.into(), port);
        Server::Discard(DiscardSink::start(t.ns_name(Ns::Server), addr)?)
    };

    let secs = t_arg.to_string();
    let dst = SERVER_ADDR.to_string();
    let conns = point.conns.to_string();
    let limit_s = limit.to_string();
    let mut args: Vec<&str> = vec!["timeout", "-k", "3", &limit_s, "iperf", "-c", &dst];
    args.extend_from_slice(&["-p", &port_s, "-t", &secs, "-P", &conns, "-y", "C"]);
    if let (Some(cc), false) = (&s.cc_per_socket, w.is_udp()) {
        args.extend_from_slice(&["-Z", cc]);
    }
    match w {
        Workload::Tcp => {}
        Workload::TcpSmall => {
            args.extend_from_slice(&["-l", "128"]);
            if point.nodelay {
                args.push("-N");
            }
        }
        // `-b 0` fails in iperf 2.1.8; a rate no veth reaches is unlimited.
        Workload::UdpSmall => args.extend_from_slice(&["-u", "-l", "64", "-b", "10G"]),
        Workload::UdpLive => return Err("udp-live runs through live::run, not iperf2".into()),
    }

    let drops0 = if w.is_udp() {
        t.nstat(Ns::Server, "UdpRcvbufErrors")
    } else {
        0
    };
    let fwd0 = forwarded(t, path);
    let cpu0 = CpuTicks::now();
    let start = Instant::now();
    let start_unix = unix_now();
    let sampler = Sampler::start(t, start, Duration::from_millis(100));
    // Output to files, not pipes: thousands of streams' reports would fill
    // a pipe nobody reads while we wait.
    let cli_out = s.tmp.join(format!("{tag}.client.csv"));
    let cli_err = s.tmp.join(format!("{tag}.client.err"));
    let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut client = Command::new("ip")
        .args(["netns", "exec", t.ns_name(Ns::Client)])
        .args(&args)
        .stdin(Stdio::null())
        .stdout(file(&cli_out)?)
        .stderr(file(&cli_err)?)
        .spawn()
        .map_err(|e| format!("spawning iperf -c: {e}"))?;
    // Ping alongside until the client ends (root may ping faster than
    // every 0.2 s); only the samples inside the active window count.
    let ping = spawn_sh(
        t,
        Ns::Client,
        &format!(
            "exec timeout -k 1 {} ping -D -n -i {} -w {limit} -W 1 {dst} > {} 2>&1",
            limit + 2,
            s.ping_interval,
            ping_out.display()
        ),
    );
    // TCP: stop the client once the load has run for `secs` (plus a little
    // for the window's edges). With thousands of streams iperf2 spends many
    // seconds after `-t` draining what it queued in socket buffers, as bulk
    // segments; that is not the workload any more. `timeout` is the bound
    // if the load never starts.
    let mut stopped: Option<f64> = None;
    let status = loop {
        match client.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for iperf -c: {e}")),
        }
        let now = start.elapsed().as_secs_f64();
        let due = sampler
            .started()
            .is_some_and(|at| now >= at + ramp + f64::from(s.secs));
        if due && !w.is_udp() {
            if let Ok(pid) = libc::pid_t::try_from(client.id()) {
                // SAFETY: our unreaped child leads its process group
                // (`timeout` made it one); nobody else can own these ids.
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            stopped = Some(now);
            break client
                .wait()
                .map_err(|e| format!("waiting for iperf -c: {e}"))?;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = Output {
        status,
        stdout: std::fs::read(&cli_out).unwrap_or_default(),
        stderr: std::fs::read(&cli_err).unwrap_or_default(),
    };
    let client_done = Instant::now();
    let wall_s = start.elapsed().as_secs_f64();
    let cpu = cpu0.until(CpuTicks::now());
    let readings = sampler.finish();
    let fwd1 = forwarded(t, path);
    let mut accepted: Option<u64> = None;
    let (server_exit_early, server_status) = match server {
        Server::Iperf(server) => {
            // UDP: the server writes its report when the client's final
            // datagram arrives; give it a moment.
            let early = if w.is_udp() {
                let deadline = Instant::now() + Duration::from_secs(3);
                while Instant::now() < deadline
                    && parse_server_udp(&read(&srv_out)).streams < point.conns
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                server.exited_at(Duration::ZERO)
            } else {
                server.exited_at(Duration::from_millis(200))
            };
            (early, server.finish().1)
        }
        Server::Discard(sink) => {
            accepted = Some(sink.finish().1);
            (None, String::new())
        }
    };
    let _ = ping.finish();
    let drops = if w.is_udp() {
        t.nstat(Ns::Server, "UdpRcvbufErrors")
            .saturating_sub(drops0)
    } else {
        0
    };

    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let c = parse_client_csv(&stdout);
    let mut notes = Vec::new();
    let mut cut_short = false;
    // Cut short in a way that makes the figures doubtful (worth a rerun),
    // as opposed to a client that only overran its time.
    let mut suspect = false;
    let code = out.status.code();
    let timed_out = matches!(code, Some(124 | 137)) || code.is_none();
    if stopped.is_some() {
        // Stopped by us after ramp-up and the window: by design.
    } else if !w.is_udp() {
        // A TCP client should still be sending when we stop it.
        cut_short = true;
        suspect = true;
        let why = if timed_out {
            format!("stopped by timeout after {limit} s")
        } else {
            format!("exited with {}", out.status)
        };
        notes.push(format!(
            "iperf -c {why} before {ramp:.0} s of ramp-up and {} s of traffic",
            s.secs
        ));
    } else if timed_out {
        cut_short = true;
        notes.push(format!("iperf -c stopped by timeout after {limit} s"));
    } else if !out.status.success() {
        notes.push(format!("iperf -c exited with {}", out.status));
    }
    if stderr.contains("Too many open files") {
        return Err(format!(
            "iperf2 could not open {} connections: \"Too many open files\" (RLIMIT_NOFILE \
             is {}; raise the hard limit, e.g. `ulimit -Hn 65536` as root, or pass fewer \
             --conns)",
            point.conns, s.nofile
        ));
    }
    let connect_failures = u32::try_from(stderr.matches("connect failed").count()).unwrap_or(0);
    if c.streams == 0 && stopped.is_none() {
        return Err(format!(
            "iperf2 reported no stream for {point} on the {} path ({} connect failures); \
             stderr: {}",
            path.name(),
            connect_failures,
            stderr.lines().take(5).collect::<Vec<_>>().join(" | ")
        ));
    }
    if c.streams < point.conns && stopped.is_none() {
        cut_short = true;
        suspect |= c.streams * 10 < point.conns * 9;
        notes.push(format!("{} of {} streams reported", c.streams, point.conns));
    }
    if let Some(n) = accepted
        && n < u64::from(point.conns)
    {
        cut_short = true;
        suspect |= n * 10 < u64::from(point.conns) * 9;
        notes.push(format!(
            "the sink accepted {n} of {} connections",
            point.conns
        ));
    }
    if connect_failures > 0 {
        notes.push(format!("{connect_failures} connect failures"));
    }
    if let Some(at) = server_exit_early
        && at < client_done
    {
        cut_short = true;
        suspect = true;
        notes.push(format!("iperf -s died during the run ({server_status})"));
    }

    let router_pkts = fwd1.saturating_sub(fwd0);
    let run_ns = if router_pkts > 0 {
        cpu.softirq_ns() / router_pkts as f64
    } else {
        f64::NAN
    };
    let found = match stopped {
        Some(at) => window_ending(&readings, at, f64::from(s.secs)),
        None => active_window(&readings),
    };
    suspect |= found.is_none();
    let win = found.unwrap_or_else(|| {
        notes.push("no traffic seen by the sampler: whole-run figures".into());
        Window {
            from: 0.0,
            secs: wall_s,
            cpu,
            pkts: router_pkts,
            bytes: 0,
            sink_bytes: 0,
            sink_pkts: 0,
            backlog_drops: 0,
        }
    });
    let (pings, ping_loss) = parse_ping(&read(&ping_out));
    let mut rtts = rtts_within(&pings, start_unix, &win);
    if rtts.is_empty() {
        rtts = pings.iter().map(|p| p.1).collect();
    }
    let rtt_p50 = percentile(&mut rtts, 50.0);
    let rtt_p99 = percentile(&mut rtts, 99.0);
    let per = |x: f64| {
        if win.pkts > 0 {
            x / win.pkts as f64
        } else {
            f64::NAN
        }
    };
    let router_ns = per(win.cpu.softirq_ns());
    let avg_bytes = per(win.bytes as f64);
    // Nothing when the client was stopped before it reported.
    let iperf_gbps = if c.secs > 0.0 && stopped.is_none() {
        c.bytes as f64 * 8.0 / c.secs / 1e9
    } else {
        f64::NAN
    };
    let mut lost_count = 0;
    let (pps, sent_pps, loss_pct) = if w.is_udp() {
        let srv = parse_server_udp(&read(&srv_out));
        if srv.streams < point.conns {
            notes.push(format!(
                "server reported {} of {} UDP streams",
                srv.streams, point.conns
            ));
            cut_short = true;
            suspect = true;
        }
        let sent = c.bytes as f64 / 64.0 / c.secs.max(1e-9);
        let rx = if srv.secs > 0.0 {
            srv.received as f64 / srv.secs
        } else {
            0.0
        };
        lost_count = srv.lost;
        let total = srv.received + srv.lost;
        let loss = if total > 0 {
            srv.lost as f64 * 100.0 / total as f64
        } else {
            f64::NAN
        };
        (rx, sent, loss)
    } else {
        (win.pkts as f64 / win.secs.max(1e-9), 0.0, 0.0)
    };
    Ok(RunResult {
        path,
        point,
        gbps: if w.is_udp() {
            pps * 64.0 * 8.0 / 1e9
        } else if win.sink_bytes > 0 {
            win.sink_bytes as f64 * 8.0 / win.secs.max(1e-9) / 1e9
        } else {
            iperf_gbps
        },
        iperf_gbps,
        pps,
        sent_pps,
        router_pps: win.pkts as f64 / win.secs.max(1e-9),
        loss_pct,
        lost: lost_count,
        sink_drops: drops,
        rtt_ms_p50: rtt_p50,
        rtt_ms_p99: rtt_p99,
        ping_loss_pct: ping_loss,
        cpu_pct: win.cpu.busy_pct(),
        softirq_pct: win.cpu.softirq_pct(),
        router_ns_per_pkt: router_ns,
        router_avg_pkt_bytes: avg_bytes,
        active_s: win.secs,
        backlog_drops: win.backlog_drops,
        quiet_wait_s,
        router_pkts,
        run_cpu_pct: cpu.busy_pct(),
        run_ns_per_pkt: run_ns,
        stream_s: c.secs,
        streams: c.streams,
        connect_failures,
        wall_s,
        cut_short,
        suspect,
        attempts: 1,
        notes,
    })
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn client_csv_sums_streams() {
        let t = "19700101000000,192.168.50.2,1,203.0.113.2,5001,2,0.0-2.0,100,400\n\
                 19700101000000,192.168.50.2,2,203.0.113.2,5001,1,0.0-6.1,300,400\n";
        let c = parse_client_csv(t);
        assert_eq!((c.bytes, c.streams), (400, 2));
        assert!((c.secs - 6.1).abs() < 1e-9);
    }

    #[test]
    fn server_udp_counts() {
        let t = "1,203.0.113.1,45418,203.0.113.2,5001,1,0.0-2.0,10132760,40588757,0.000,\
                 77564,235888,32.882,125\n";
        let s = parse_server_udp(t);
        assert_eq!(
            (s.received, s.lost, s.streams),
            (235_888 - 77_564, 77_564, 1)
        );
    }

    #[test]
    fn ping_times_and_loss() {
        let t = "[1.5] 64 bytes from 203.0.113.2: icmp_seq=1 ttl=63 time=0.123 ms\n\
                 [2.5] 64 bytes from 203.0.113.2: icmp_seq=2 ttl=63 time=1.5 ms\n\
                 4 packets transmitted, 2 received, 50% packet loss, time 3ms\n";
        let (r, loss) = parse_ping(t);
        assert_eq!(r, vec![(1.5, 0.123), (2.5, 1.5)]);
        assert!((loss - 50.0).abs() < 1e-9);
        // Killed before the summary: loss from the sequence gaps.
        let t = "[1.0] 64 bytes from x: icmp_seq=1 ttl=63 time=0.1 ms\n\
                 [1.2] 64 bytes from x: icmp_seq=4 ttl=63 time=0.1 ms\n";
        let (_, loss) = parse_ping(t);
        assert!((loss - 50.0).abs() < 1e-9);
    }
}
