//! The vocabulary of the benchmark: data paths, workloads, offload
//! settings, points, what one run measured, and the settings all runs share.

use std::fmt;
use std::path::PathBuf;

use crate::measure::Measured;
use crate::measure::hosts::HostTcp;
use crate::measure::sys::percentile;

/// How the router forwards during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// `ip_forward=1` and iptables MASQUERADE.
    Kernel,
    /// `router-ctl attach`, no iptables NAT.
    Xdp,
    /// The limit: a minimal XDP forwarder (`bpf_fib_lookup` + redirect, no
    /// NAT, no table; `tests::rawbpf::fib_forwarder`), the server given a
    /// route back. Live-generator runs only.
    Limit,
    /// A control for the flow table: the limit plus one lookup of each
    /// packet's 5-tuple in a kernel LRU hash of the router's key and value
    /// sizes, and one add into the entry it hits
    /// (`tests::rawbpf::flow_lookup_forwarder`): what the kernel's hash
    /// table alone costs at a working set. The flows rows only.
    Lookup,
    /// Offload mode: `router-ctl attach --admit kernel` with iptables
    /// MASQUERADE and the daemon (`router-ctl run`): the kernel admits and
    /// NATs each new flow, the daemon moves it to the XDP table once
    /// established, XDP carries the rest of it.
    Offload,
}

impl DataPath {
    pub fn name(self) -> &'static str {
        match self {
            DataPath::Kernel => "kernel",
            DataPath::Xdp => "xdp",
            DataPath::Limit => "limit",
            DataPath::Lookup => "lookup",
            DataPath::Offload => "offload",
        }
    }
}

/// What generates the load (command-line names: `tcp`, `tcp-small`,
/// `udp-small`, `udp-live`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// iperf2 TCP at the default write length (128 KiB).
    Tcp,
    /// iperf2 TCP with `-l 128`.
    TcpSmall,
    /// iperf2 UDP, 64-byte payload, unlimited rate.
    UdpSmall,
    /// UDP, 64-byte payload, from the in-kernel generator
    /// (`BPF_PROG_RUN` live frames, see `workloads/live.rs`).
    UdpLive,
    /// iperf2 TCP paced to a fixed total rate (`--line-rate`, split over the
    /// streams with `-b`), veth offload off: every path carries the same
    /// traffic, so their CPU differs by the router's cost ("CPU at line rate").
    TcpPaced,
}

impl Workload {
    pub const ALL: [Workload; 5] = [
        Workload::Tcp,
        Workload::TcpSmall,
        Workload::UdpSmall,
        Workload::UdpLive,
        Workload::TcpPaced,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Tcp => "tcp",
            Workload::TcpSmall => "tcp-small",
            Workload::UdpSmall => "udp-small",
            Workload::UdpLive => "udp-live",
            Workload::TcpPaced => "tcp-paced",
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

    pub fn is_udp(self) -> bool {
        matches!(self, Workload::UdpSmall | Workload::UdpLive)
    }
}

/// veth offload setting of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Offload {
    /// TSO/GSO off everywhere, GRO off on the router (unless
    /// `--router-gro`): MTU-size packets through the router, like a wire.
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
}

/// The wire a run's traffic crossed: results.json's `"topology"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// client -- router -- server on plain veth pairs: native XDP on the
    /// router copies every cloned TCP skb before its program runs
    /// (`skb_pp_cow_data`), which a NIC's receive ring does not do.
    Veth,
    /// An XDP "cable" namespace on each side of the router
    /// (`tests::bench_topology::CabledTopology`): the cables take that
    /// copy, and the router receives frames as from a NIC, on every path.
    Cable,
}

impl Wire {
    pub fn name(self) -> &'static str {
        match self {
            Wire::Veth => "veth",
            Wire::Cable => "cable",
        }
    }

    /// How the report labels the topology.
    pub fn label(self) -> &'static str {
        match self {
            Wire::Veth => "plain veth",
            Wire::Cable => "XDP cables",
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

impl Point {
    /// A point without `TCP_NODELAY` (every workload but `tcp-small -N`).
    #[must_use]
    pub const fn new(workload: Workload, conns: u32, offload: Offload) -> Self {
        Self {
            workload,
            conns,
            offload,
            nodelay: false,
        }
    }
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
/// active window (see [`active_window`](crate::measure::sampler::active_window));
/// `run_*` over the whole client run.
#[derive(Clone, Debug)]
pub struct RunResult {
    pub path: DataPath,
    pub point: Point,
    /// The topology the run crossed.
    pub wire: Wire,
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
    /// tcp-paced: the total rate offered, Mbit/s (0 for unpaced runs).
    pub offered_mbps: u32,
    /// Offload path: who forwarded the run's packets (None on the others).
    pub fast_path: Option<FastPathShare>,
    /// TCP runs: the end hosts' sent and retransmitted segments, timeouts
    /// and transmit drops over the whole run (None for UDP).
    pub host_tcp: Option<HostTcp>,
}

/// The share of its offered rate a paced run must carry to count as
/// sustained: "CPU at line rate" compares the paths at equal loads.
pub const SUSTAINED_SHARE: f64 = 0.95;

/// Payload bytes per byte the sink's interface counts of a full-size TCP
/// segment: 1448 B (MSS 1460 less the timestamps option) in a 1514-byte
/// frame, as veth counts a redirected frame. A paced run offers a payload
/// rate (iperf2's `-b`, `--fq-rate`) while the carried rate is counted in
/// frames, so the two are compared in payload. On the kernel path the
/// sink counts 1500 B a frame (without the Ethernet header), which this
/// under-states by 1 %: stricter there, never lenient.
pub const PAYLOAD_PER_WIRE_BYTE: f64 = 1448.0 / 1514.0;

impl RunResult {
    /// What the run carried, Mbit/s, as the sink's interface counts it
    /// (frames).
    pub fn carried_mbps(&self) -> f64 {
        self.gbps * 1000.0
    }

    /// The TCP payload of [`Self::carried_mbps`] (full-size segments:
    /// see [`PAYLOAD_PER_WIRE_BYTE`]), Mbit/s: what compares with the
    /// offered rate.
    pub fn carried_payload_mbps(&self) -> f64 {
        self.carried_mbps() * PAYLOAD_PER_WIRE_BYTE
    }

    /// A paced run (`offered_mbps` set) that carried at least
    /// [`SUSTAINED_SHARE`] of its offered (payload) rate; false for an
    /// unpaced run.
    pub fn sustained(&self) -> bool {
        self.offered_mbps > 0
            && self.carried_payload_mbps() >= SUSTAINED_SHARE * f64::from(self.offered_mbps)
    }
}

/// Who forwarded an offload run's packets, over the whole run: the proof
/// that the fast path carried it, not the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FastPathShare {
    /// Packets XDP redirected (`fwd_outbound` + `fwd_inbound`).
    pub xdp_pkts: u64,
    /// Packets the kernel forwarded (`IpForwDatagrams`): each flow's
    /// handshake and teardown, anything before its offload, the pings.
    pub kernel_pkts: u64,
    /// Flows the daemon wrote to the XDP table during the run.
    pub flows_offloaded: u64,
    /// Most flows in the XDP table at one of the once-a-second samples
    /// during the run (None: no sample succeeded).
    pub peak_flows: Option<u64>,
    /// XDP's share (%) of the packets forwarded from the first sample with
    /// `peak_flows` in the table to the last sample: the run once all its
    /// flows were offloaded, without the ramp (many streams connect over
    /// seconds, and each flow's first packets take the kernel).
    pub steady_xdp_pct: Option<f64>,
}

impl FastPathShare {
    /// XDP's share of the forwarded packets, % (NaN when nothing moved).
    pub fn xdp_pct(&self) -> f64 {
        let all = self.xdp_pkts + self.kernel_pkts;
        if all == 0 {
            f64::NAN
        } else {
            self.xdp_pkts as f64 * 100.0 / all as f64
        }
    }
}

/// What receives the TCP streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TcpSink {
    /// `iperf -s`, fresh per run.
    Iperf,
    /// A built-in epoll discard server (`workloads/discard.rs`).
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

/// How tcp-paced holds each stream to its share of the offered rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pacing {
    /// iperf2's `-b` up to [`Pacing::IPERF_MAX_STREAMS`] streams, the
    /// kernel's pacing above, where `-b` cannot generate the load.
    Auto,
    /// The kernel paces each socket (iperf2 `--fq-rate`:
    /// `SO_MAX_PACING_RATE`, which TCP honours without the fq qdisc since
    /// Linux 4.13); iperf2 writes whenever the socket takes more. The
    /// client's transmit then runs from the pacing timer, in softirq: every
    /// path's softirq time includes it alike.
    Fq,
    /// iperf2's `-b`: a token bucket per stream whose thread, out of
    /// tokens, waits in a 4 us `delay_loop` (iperf 2.1.8
    /// `RunRateLimitedTCP`): with 1000 streams these wake-ups fill the
    /// shared cores, and no path gets the offered rate (at any rate: it
    /// carried a quarter to a half of it down to 50 Mbit/s).
    Iperf,
}

impl Pacing {
    /// The most streams `Auto` leaves to iperf2's `-b`.
    pub const IPERF_MAX_STREAMS: u32 = 100;

    pub fn name(self) -> &'static str {
        match self {
            Pacing::Auto => "auto",
            Pacing::Fq => "fq",
            Pacing::Iperf => "iperf",
        }
    }

    /// Whether the kernel paces a run of `conns` streams (else iperf2's `-b`).
    pub fn by_kernel(self, conns: u32) -> bool {
        match self {
            Pacing::Auto => conns > Self::IPERF_MAX_STREAMS,
            Pacing::Fq => true,
            Pacing::Iperf => false,
        }
    }
}

/// Settings shared by every run.
pub struct Settings {
    pub tcp_sink: TcpSink,
    /// How tcp-paced paces its streams.
    pub pacing: Pacing,
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
    /// Total offered rate of `tcp-paced`, Mbit/s.
    pub line_rate_mbps: u32,
    /// GRO on at the router's interfaces (`--router-gro`).
    pub router_gro: bool,
}

impl Settings {
    /// The settings of a run with options `o`, scratch directory `tmp`,
    /// file limit `nofile` and the congestion control requested per socket.
    pub fn of(
        o: &crate::cli::Opts,
        tmp: PathBuf,
        nofile: u64,
        cc_per_socket: Option<String>,
    ) -> Self {
        Self {
            tcp_sink: o.tcp_sink,
            pacing: o.pacing,
            secs: o.secs,
            slack: o.slack,
            ping_interval: o.ping_interval,
            tmp,
            nofile,
            cc_per_socket,
            line_rate_mbps: o.line_rate_mbps,
            router_gro: o.router_gro,
        }
    }
}

impl RunResult {
    /// A result with the figures every run measures alike (window, ping,
    /// whole-run cost); the workload fills in throughput, loss and streams.
    pub fn new(path: DataPath, point: Point, m: Measured) -> Self {
        let win = m.window;
        let per_pkt = |x: f64| {
            if win.pkts > 0 {
                x / win.pkts as f64
            } else {
                f64::NAN
            }
        };
        // A lost echo counts as slower than any answered one (its round
        // trip never ended): a run that lost more than 1 % of its pings
        // has no finite p99.
        let pings = m.pings.unwrap_or_default();
        let ping_loss_pct = pings.loss_pct();
        let mut rtts = pings.rtts;
        rtts.extend((0..pings.lost).map(|_| f64::INFINITY));
        Self {
            path,
            point,
            wire: Wire::Veth,
            gbps: f64::NAN,
            iperf_gbps: f64::NAN,
            pps: f64::NAN,
            sent_pps: 0.0,
            router_pps: win.pkts as f64 / win.secs.max(1e-9),
            loss_pct: 0.0,
            lost: 0,
            sink_drops: 0,
            rtt_ms_p50: percentile(&mut rtts, 50.0),
            rtt_ms_p99: percentile(&mut rtts, 99.0),
            ping_loss_pct,
            cpu_pct: win.cpu.busy_pct(),
            softirq_pct: win.cpu.softirq_pct(),
            router_ns_per_pkt: per_pkt(win.cpu.softirq_ns()),
            router_avg_pkt_bytes: per_pkt(win.bytes as f64),
            active_s: win.secs,
            backlog_drops: win.backlog_drops,
            quiet_wait_s: m.quiet_wait_s,
            router_pkts: m.router_pkts,
            run_cpu_pct: m.run_cpu.busy_pct(),
            run_ns_per_pkt: if m.router_pkts > 0 {
                m.run_cpu.softirq_ns() / m.router_pkts as f64
            } else {
                f64::NAN
            },
            stream_s: 0.0,
            streams: 0,
            connect_failures: 0,
            wall_s: m.wall_s,
            cut_short: false,
            suspect: false,
            attempts: 1,
            notes: Vec::new(),
            offered_mbps: 0,
            fast_path: None,
            host_tcp: None,
        }
    }
}

#[cfg(test)]
impl RunResult {
    /// A run with no figures, for the report's unit tests.
    pub fn blank(path: DataPath, point: Point) -> Self {
        Self::new(
            path,
            point,
            Measured {
                window: crate::measure::sampler::Window::default(),
                pings: None,
                run_cpu: crate::measure::sys::CpuTicks::default(),
                router_pkts: 0,
                wall_s: 0.0,
                quiet_wait_s: 0.0,
            },
        )
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn xdp_share_of_the_forwarded_packets() {
        let fp = |xdp_pkts, kernel_pkts| FastPathShare {
            xdp_pkts,
            kernel_pkts,
            ..FastPathShare::default()
        };
        assert!((fp(990, 10).xdp_pct() - 99.0).abs() < 1e-9);
        assert!((fp(0, 10).xdp_pct()).abs() < 1e-9);
        assert!(fp(0, 0).xdp_pct().is_nan());
        assert_eq!(DataPath::Offload.name(), "offload");
    }
}
