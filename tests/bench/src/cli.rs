//! The command line (clap): what `cargo xtask bench -- ARGS` passes on.
//! `--quick` and `--smoke` choose the defaults of every other option;
//! options given explicitly win over them.

use std::path::PathBuf;

use clap::Parser;
use clap::builder::BoolishValueParser;

use crate::model::{Offload, Pacing, Point, TcpSink, Workload};
use crate::workloads::{bigtable, live};

/// The XDP router against the kernel's forwarding with iptables MASQUERADE,
/// on one fresh client -- router -- server topology, alternating the two
/// paths point by point. Writes report.md, results.json and throughput.svg.
/// Needs root.
#[derive(Parser, Debug)]
#[expect(clippy::struct_excessive_bools, reason = "command-line switches")]
#[command(
    name = "router-bench",
    version,
    after_help = "Lists are comma-separated. All traffic stays inside the network namespaces \
                  the run creates (and deletes on exit, also on Ctrl-C)."
)]
pub struct Cli {
    /// Fewer points and 2 s runs (under 3 minutes): the review table's
    /// offload-off points, the goals' runs and one of each extra phase; no
    /// `-l 128`, veth offload on, iperf2 UDP or frags experiment.
    #[arg(long)]
    quick: bool,
    /// Print the planned runs, phase by phase, with an estimate of how
    /// long each takes, and exit (runs nothing; no root needed).
    #[arg(long)]
    pub plan: bool,
    /// One point per workload, 1 s runs, then check that every artifact was
    /// written with every path filled (what `cargo xtask test` runs; output
    /// in target/bench-smoke).
    #[arg(long)]
    smoke: bool,
    /// Length of every run in seconds [default: 4, quick 2, smoke 1]; the
    /// connection setup rate's too when given (see --conn-rate-secs).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    secs: Option<u32>,
    /// TCP connection counts [default: 1,100,1000,2000; quick 1,100; smoke 1].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    conns: Option<Vec<u32>>,
    /// TCP connection counts of tcp-paced ("CPU at line rate")
    /// [default: 1,100,1000; quick 1].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    paced_conns: Option<Vec<u32>>,
    /// Total offered rate of tcp-paced in Mbit/s, the review's 2.5 Gbit/s
    /// Ethernet [default: 2500; smoke 500, which every path sustains, so
    /// the smoke run needs no rerun at a lower rate].
    #[arg(long, value_name = "MBPS", value_parser = clap::value_parser!(u32).range(1..))]
    line_rate: Option<u32>,
    /// UDP streams of iperf2's udp-small [default: 1].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    udp_conns: Option<Vec<u32>>,
    /// Flows of the in-kernel UDP generator, IPv4 and (not in smoke) IPv6
    /// rows [default: 1,1000; smoke 64].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = live_flows)]
    live_flows: Option<Vec<u32>>,
    /// Workloads to run [default: all; quick all but udp-small (iperf2's
    /// UDP; the live generator measures 64-byte UDP)].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_enum)]
    workloads: Option<Vec<Workload>>,
    /// TCP offload settings [default: off,on; quick and smoke off].
    #[arg(
        long = "offload",
        value_name = "LIST",
        value_delimiter = ',',
        value_enum
    )]
    offloads: Option<Vec<Offload>>,
    /// Offload settings for tcp-small (`-l 128`) [default: off; quick none:
    /// no tcp-small points].
    #[arg(
        long = "small-offload",
        value_name = "LIST",
        value_delimiter = ',',
        value_enum
    )]
    small_offloads: Option<Vec<Offload>>,
    /// tcp-small variants, of off,on (-N, `TCP_NODELAY`) [default: off, the
    /// review's Nagle on].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = BoolishValueParser::new(), hide_possible_values = true)]
    nodelay: Option<Vec<bool>>,
    /// Ping interval during runs, seconds.
    #[arg(long, value_name = "S", default_value_t = 0.02, value_parser = ping_interval)]
    ping_interval: f64,
    /// Seconds an iperf client may overrun -t (+1 per 50 streams) before
    /// `timeout -k` stops it.
    #[arg(long, value_name = "S", default_value_t = 10)]
    slack: u32,
    /// What receives the TCP streams: a fresh `iperf -s` per run, or a
    /// built-in epoll discard server (`iperf -s` 2.1.8 crashes in many runs
    /// with 1000+ streams).
    #[arg(long, value_name = "SINK", value_enum, default_value_t = TcpSink::Discard)]
    tcp_sink: TcpSink,
    /// How tcp-paced holds each stream to its share of the offered rate:
    /// `iperf` iperf2's `-b` token bucket, whose threads poll every few
    /// microseconds (with 1000 streams that fills the shared cores and the
    /// rate is not generated); `fq` the kernel's per-socket pacing (iperf2
    /// `--fq-rate`; the client's transmit then counts as softirq time, on
    /// every path alike); `auto` `-b` up to 100 streams, the kernel above.
    #[arg(long, value_name = "HOW", value_enum, default_value_t = Pacing::Auto)]
    pacing: Pacing,
    /// GRO on at the router's interfaces, as a NIC's driver has it by
    /// default (off by default: every path then sees the same MTU-size
    /// packets). The kernel path merges a stream's segments into one
    /// packet per batch (one routing and NAT decision for several, cut up
    /// again in software on the way out); XDP runs before GRO and sees each
    /// segment. Between the XDP cables the router's tx checksum offload
    /// goes off too: merged packets cut up again would leave with partial
    /// checksums that a cable's XDP cannot complete, so the kernel path
    /// computes them in software there (a NIC does in hardware).
    #[arg(long)]
    router_gro: bool,
    /// TCP congestion control of client and server (the Linux default;
    /// `keep` leaves the namespaces' own).
    #[arg(long, value_name = "NAME", default_value = "cubic")]
    cc: String,
    /// Reruns of a run cut short.
    #[arg(long, value_name = "N", default_value_t = 1)]
    retries: u32,
    /// `BPF_PROG_RUN` calls per micro-benchmark case [default: 10000; quick 2000; smoke 500].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    micro_calls: Option<u32>,
    /// Repeat for the amortised micro-benchmark cases [default: 1000000;
    /// quick 200000; smoke 10000].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    micro_repeat: Option<u32>,
    /// Skip the `BPF_PROG_RUN` micro-benchmark.
    #[arg(long)]
    no_micro: bool,
    /// Run only the `BPF_PROG_RUN` micro-benchmark, on these XDP objects
    /// (builds of router-ebpf) side by side instead of the embedded one,
    /// interleaved call by call (`--micro-calls` each); prints the medians
    /// and their ratios (to the first object and to the floor).
    #[arg(long, value_name = "OBJECTS", value_delimiter = ',', num_args = 1..)]
    micro_compare: Option<Vec<PathBuf>>,
    /// Skip the frags experiment (TCP -P 1, offload on, kernel path with no /
    /// a plain / a frags-aware `XDP_PASS` program on the router; not in
    /// --quick).
    #[arg(long)]
    no_frags: bool,
    /// Skip the scaling runs (live generator on 1 and on all CPUs, kernel,
    /// xdp and limit, on multi-queue veths).
    #[arg(long)]
    no_scaling: bool,
    /// Skip the runs between XDP cables (a fresh topology with an XDP
    /// "cable" namespace on each side of the router; offload off): TCP and
    /// the connection setup rate's cable rows.
    #[arg(long)]
    no_cable: bool,
    /// TCP connection counts between the cables (`-l 128` too at 1000 and
    /// more) [default: 1,100,1000,2000; quick 1].
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    cable_conns: Option<Vec<u32>>,
    /// Flows of the large table (pre-filled into the XDP flow table; the
    /// live traffic compared with a 1000-flow table) [default: 1000000;
    /// smoke 20000].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2000..=10_000_000))]
    big_table: Option<u32>,
    /// Skip the large flow table runs.
    #[arg(long)]
    no_big_table: bool,
    /// Repetitions of the flows rows' control (path `lookup`: the limit
    /// plus one lookup of each packet in a kernel LRU hash of the router
    /// table's key and value sizes and capacity), each run next to the xdp
    /// row of its table; 0: none. Capped at the xdp rows' repetitions (3;
    /// quick 1). One repetition adds about 30 s to a full run, past its
    /// worst-case budget (every paced point rerun), so only the smoke run
    /// has it by default [default: 0; smoke 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=3))]
    flows_control_reps: Option<u32>,
    /// Value size of the control's table in bytes: 96, the router's flow
    /// entry, or 64 (whether a one-cache-line entry would pay) [default: 96].
    #[arg(long, value_name = "BYTES", value_parser = control_value)]
    flows_control_value: Option<u32>,
    /// Skip the connection setup rate (short TCP connections, many in parallel).
    #[arg(long)]
    no_conn_rate: bool,
    /// Leave out the offload path (`attach --admit kernel` and the daemon:
    /// the kernel admits, XDP carries), which runs on the review table's
    /// points and the connection setup rate.
    #[arg(long)]
    no_offload: bool,
    /// Run only the connection setup rate, on the plain veths and between
    /// the cables (--no-cable: the plain veths only), and the platform
    /// facts (one crypto block size): no points and no other phase. With
    /// --conn-rate-reps, the cheapest side-by-side comparison of the paths'
    /// setup cost.
    #[arg(long, conflicts_with = "no_conn_rate")]
    only_conn_rate: bool,
    /// Rounds of the connection setup rate: each round runs every path once
    /// (kernel, xdp, offload), so the paths alternate and noise hits them
    /// alike; the report's ratios take each path's median [default: 1].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=50))]
    conn_rate_reps: Option<u32>,
    /// Seconds of each connection setup rate run, on the plain veths and
    /// between the cables [default: --secs if given, else 2; quick and
    /// smoke 1]. Shorter than the other runs so that both wires fit the
    /// run-time budgets; each run still makes thousands of connections.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u32).range(1..=600))]
    conn_rate_secs: Option<u32>,
    /// Parallel clients of the connection setup rate [default: 16; smoke 4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    conn_rate_workers: Option<u32>,
    /// Output directory [default: target/bench; quick target/bench-quick;
    /// smoke target/bench-smoke].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

fn control_value(s: &str) -> Result<u32, String> {
    let sizes = [bigtable::CONTROL_VALUE_FULL, bigtable::CONTROL_VALUE_SMALL];
    s.parse()
        .ok()
        .filter(|n| sizes.contains(n))
        .ok_or_else(|| format!("{} or {}", sizes[0], sizes[1]))
}

fn live_flows(s: &str) -> Result<u32, String> {
    let max = live::max_flows();
    s.parse::<u32>()
        .ok()
        .filter(|&n| n > 0 && n <= max)
        .ok_or_else(|| format!("1 to {max} flows"))
}

fn ping_interval(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|&x| x >= 0.002)
        .ok_or_else(|| "seconds >= 0.002".to_owned())
}

/// The options in force: the command line over the defaults of its mode.
#[expect(clippy::struct_excessive_bools, reason = "command-line switches")]
pub struct Opts {
    pub quick: bool,
    pub smoke: bool,
    pub secs: u32,
    pub conns: Vec<u32>,
    pub udp_conns: Vec<u32>,
    pub paced_conns: Vec<u32>,
    pub line_rate_mbps: u32,
    pub live_flows: Vec<u32>,
    pub workloads: Vec<Workload>,
    pub offloads: Vec<Offload>,
    pub small_offloads: Vec<Offload>,
    pub nodelay: Vec<bool>,
    pub ping_interval: f64,
    pub slack: u32,
    pub cc: String,
    pub tcp_sink: TcpSink,
    pub pacing: Pacing,
    /// `--router-gro`.
    pub router_gro: bool,
    pub retries: u32,
    pub micro: bool,
    pub frags: bool,
    pub scaling: bool,
    pub cable: bool,
    pub cable_conns: Vec<u32>,
    pub conn_rate: bool,
    /// Only the connection setup rate runs (`--only-conn-rate`).
    pub only_conn_rate: bool,
    /// Rounds of the connection setup rate, every path once per round.
    pub conn_rate_reps: u32,
    /// Seconds of each connection setup rate run.
    pub conn_rate_secs: u32,
    /// Whether the offload path runs (on the review table's points and the
    /// connection setup rate).
    pub offload_path: bool,
    /// Flows of the large table; 0: skipped.
    pub big_table: u32,
    /// The flows rows' control (`reps` 0: skipped).
    pub flows_control: bigtable::Control,
    pub conn_rate_workers: u32,
    pub micro_calls: u32,
    pub micro_repeat: u32,
    /// `--micro-compare`'s objects (empty: the normal run).
    pub micro_compare: Vec<PathBuf>,
    pub out: PathBuf,
}

/// target/bench beside the binary's profile directory (honours
/// `CARGO_TARGET_DIR`): target/<profile>/router-bench -> target/bench;
/// `--quick` and `--smoke` write beside it (bench-quick, bench-smoke), so
/// neither overwrites the last full run's results.
fn default_out(mode: Mode) -> PathBuf {
    let name = mode.pick("bench", "bench-quick", "bench-smoke");
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.join(name)))
        .unwrap_or_else(|| PathBuf::from("target").join(name))
}

/// Which defaults apply.
#[derive(Clone, Copy)]
struct Mode {
    quick: bool,
    smoke: bool,
}

impl Mode {
    /// The default of an option for a full run, `--quick` and `--smoke`.
    fn pick<T>(self, full: T, quick: T, smoke: T) -> T {
        if self.smoke {
            smoke
        } else if self.quick {
            quick
        } else {
            full
        }
    }
}

impl Cli {
    /// The options in force.
    pub fn opts(self) -> Opts {
        let smoke = self.smoke;
        let quick = smoke || self.quick;
        let mode = Mode { quick, smoke };
        let only = self.only_conn_rate;
        Opts {
            quick,
            smoke,
            secs: self.secs.unwrap_or(mode.pick(4, 2, 1)),
            conns: self
                .conns
                .unwrap_or_else(|| mode.pick(vec![1, 100, 1000, 2000], vec![1, 100], vec![1])),
            paced_conns: self
                .paced_conns
                .unwrap_or_else(|| mode.pick(vec![1, 100, 1000], vec![1], vec![1])),
            line_rate_mbps: self.line_rate.unwrap_or(mode.pick(2500, 2500, 500)),
            udp_conns: self.udp_conns.unwrap_or_else(|| vec![1]),
            live_flows: self
                .live_flows
                .unwrap_or_else(|| mode.pick(vec![1, 1000], vec![1, 1000], vec![64])),
            workloads: if only {
                Vec::new()
            } else {
                self.workloads.unwrap_or_else(|| {
                    let all = Workload::ALL.to_vec();
                    let quick = all
                        .iter()
                        .copied()
                        .filter(|&w| w != Workload::UdpSmall)
                        .collect();
                    mode.pick(all.clone(), quick, all)
                })
            },
            offloads: self.offloads.unwrap_or_else(|| {
                mode.pick(
                    vec![Offload::Off, Offload::On],
                    vec![Offload::Off],
                    vec![Offload::Off],
                )
            }),
            small_offloads: self
                .small_offloads
                .unwrap_or_else(|| mode.pick(vec![Offload::Off], Vec::new(), vec![Offload::Off])),
            nodelay: self.nodelay.unwrap_or_else(|| vec![false]),
            ping_interval: self.ping_interval,
            slack: self.slack,
            cc: self.cc,
            tcp_sink: self.tcp_sink,
            pacing: self.pacing,
            router_gro: self.router_gro,
            retries: self.retries,
            micro: !self.no_micro && !only,
            frags: !self.no_frags && (smoke || !quick) && !only,
            scaling: !self.no_scaling && !only,
            // --only-conn-rate: no cable points (no workloads), the
            // connection setup rate's cable rows.
            cable: !self.no_cable,
            cable_conns: self
                .cable_conns
                .unwrap_or_else(|| mode.pick(vec![1, 100, 1000, 2000], vec![1], vec![1])),
            conn_rate: !self.no_conn_rate,
            only_conn_rate: only,
            conn_rate_reps: self.conn_rate_reps.unwrap_or(1),
            conn_rate_secs: self
                .conn_rate_secs
                .or(self.secs)
                .unwrap_or(mode.pick(2, 1, 1)),
            offload_path: !self.no_offload,
            big_table: if self.no_big_table || only {
                0
            } else {
                self.big_table
                    .unwrap_or(mode.pick(1_000_000, 1_000_000, 20_000))
            },
            flows_control: bigtable::Control {
                reps: self.flows_control_reps.unwrap_or(mode.pick(0, 0, 1)),
                value_size: self
                    .flows_control_value
                    .unwrap_or(bigtable::CONTROL_VALUE_FULL),
            },
            conn_rate_workers: self.conn_rate_workers.unwrap_or(mode.pick(16, 16, 4)),
            micro_calls: self.micro_calls.unwrap_or(mode.pick(10_000, 2000, 500)),
            micro_repeat: self
                .micro_repeat
                .unwrap_or(mode.pick(1_000_000, 200_000, 10_000)),
            micro_compare: self.micro_compare.unwrap_or_default(),
            out: self.out.unwrap_or_else(|| default_out(mode)),
        }
    }
}

impl Opts {
    /// Every point in run order: grouped by offload setting (fewer
    /// switches), UDP with the first group.
    pub fn points(&self) -> Vec<Point> {
        let mut pts = Vec::new();
        let mut groups = self.offloads.clone();
        for o in &self.small_offloads {
            if !groups.contains(o) {
                groups.push(*o);
            }
        }
        let has = |w| self.workloads.contains(&w);
        for (gi, &offload) in groups.iter().enumerate() {
            let p = |workload, conns, nodelay| Point {
                workload,
                conns,
                offload,
                nodelay,
            };
            if has(Workload::Tcp) && self.offloads.contains(&offload) {
                pts.extend(self.conns.iter().map(|&c| p(Workload::Tcp, c, false)));
            }
            if has(Workload::TcpSmall) && self.small_offloads.contains(&offload) {
                for &nd in &self.nodelay {
                    pts.extend(self.conns.iter().map(|&c| p(Workload::TcpSmall, c, nd)));
                }
            }
            // Paced TCP is always wire-like (offload off), like the review's NICs.
            if has(Workload::TcpPaced) && offload == Offload::Off {
                pts.extend(
                    self.paced_conns
                        .iter()
                        .map(|&c| p(Workload::TcpPaced, c, false)),
                );
            }
            if has(Workload::UdpSmall) && gi == 0 {
                pts.extend(
                    self.udp_conns
                        .iter()
                        .map(|&c| p(Workload::UdpSmall, c, false)),
                );
            }
        }
        // Last, in the first (wire-like) offload group's setting, like the
        // iperf2 UDP runs; the setting does not matter to 64-byte UDP.
        if has(Workload::UdpLive) {
            let offload = groups.first().copied().unwrap_or(Offload::Off);
            pts.extend(
                self.live_flows
                    .iter()
                    .map(|&conns| Point::new(Workload::UdpLive, conns, offload)),
            );
        }
        pts
    }
}

/// The options a command line gives (tests: `args` without the program name).
#[cfg(test)]
pub(crate) fn opts_of(args: &[&str]) -> Opts {
    Cli::try_parse_from(std::iter::once("router-bench").chain(args.iter().copied()))
        .unwrap()
        .opts()
}

#[cfg(test)]
mod unit {
    use super::opts_of as opts;
    use super::*;

    #[test]
    fn modes_choose_the_defaults_and_options_win() {
        let full = opts(&[]);
        assert_eq!(
            (full.secs, full.conns.len(), full.points().len()),
            // tcp at 4 counts x 2 offloads, tcp-small (offload off, Nagle
            // on) at 4, tcp-paced at 3, udp-small 1 stream, udp-live 2.
            (4, 4, 8 + 4 + 3 + 1 + 2)
        );
        assert!(full.frags && full.workloads.contains(&Workload::UdpSmall));
        let quick = opts(&["--quick"]);
        assert_eq!((quick.secs, quick.conns.clone()), (2, vec![1, 100]));
        // --quick: no tcp-small, veth offload on, iperf2 UDP or frags.
        assert_eq!(
            (quick.offloads.clone(), quick.small_offloads.clone()),
            (vec![Offload::Off], vec![])
        );
        assert!(!quick.frags && !quick.workloads.contains(&Workload::UdpSmall));
        assert!(
            quick
                .points()
                .iter()
                .all(|p| p.workload != Workload::TcpSmall)
        );
        // Options still win.
        let asked = opts(&[
            "--quick",
            "--small-offload",
            "off",
            "--workloads",
            "udp-small",
        ]);
        assert_eq!(
            (asked.small_offloads, asked.workloads),
            (vec![Offload::Off], vec![Workload::UdpSmall])
        );
        assert_eq!(
            (quick.paced_conns.clone(), quick.cable_conns.clone()),
            (vec![1], vec![1])
        );
        assert_eq!((full.line_rate_mbps, full.big_table), (2500, 1_000_000));
        let smoke = opts(&["--smoke", "--secs", "3"]);
        assert!(smoke.quick && smoke.out.ends_with("bench-smoke"));
        assert!(opts(&["--quick"]).out.ends_with("bench-quick"));
        assert!(opts(&[]).out.ends_with("bench"));
        assert_eq!((smoke.secs, smoke.live_flows.clone()), (3, vec![64]));
        assert_eq!((smoke.line_rate_mbps, smoke.big_table), (500, 20_000));
        assert_eq!(opts(&["--no-big-table"]).big_table, 0);
        // The flows rows' control: smoke runs, others when asked.
        let control = |o: &Opts| (o.flows_control.reps, o.flows_control.value_size);
        assert_eq!(control(&full), (0, 96));
        assert_eq!((control(&smoke), control(&quick)), ((1, 96), (0, 96)));
        let asked = opts(&["--flows-control-reps", "3", "--flows-control-value", "64"]);
        assert_eq!(control(&asked), (3, 64));
        assert!(
            Cli::try_parse_from(["router-bench", "--flows-control-value", "72"]).is_err(),
            "only the router's value size and one cache line"
        );
        assert!(full.offload_path && smoke.offload_path);
        assert!(!opts(&["--quick", "--no-offload"]).offload_path);
        // One point per workload: tcp, tcp-small, udp-small, udp-live, tcp-paced.
        assert_eq!(smoke.points().len(), 5);
        assert!(smoke.frags);
    }

    #[test]
    fn offload_runs_on_the_review_points_unless_left_out() {
        use crate::model::DataPath;
        use crate::run::paths_of;
        let quick = opts(&["--quick"]);
        let with_offload: Vec<Point> = quick
            .points()
            .into_iter()
            .filter(|&p| paths_of(&quick, p).contains(&DataPath::Offload))
            .collect();
        // tcp -P 1 and -P 100 (offload off) and tcp-paced -P 1.
        assert_eq!(with_offload.len(), 3, "{with_offload:?}");
        let full = opts(&[]);
        let n = |o: &Opts| {
            o.points()
                .into_iter()
                .filter(|&p| paths_of(o, p).contains(&DataPath::Offload))
                .count()
        };
        // tcp -P 1/100/1000, tcp-small -P 2000, tcp-paced -P 1/100/1000.
        assert_eq!(n(&full), 7);
        assert_eq!(n(&opts(&["--no-offload"])), 0);
        let live = Point::new(Workload::UdpLive, 1, Offload::Off);
        assert_eq!(
            paths_of(&full, live),
            vec![DataPath::Kernel, DataPath::Xdp, DataPath::Limit]
        );
    }

    #[test]
    fn micro_compare_takes_a_list_of_objects() {
        assert!(opts(&[]).micro_compare.is_empty());
        let o = opts(&["--micro-compare", "main.o,branch.o", "--micro-calls", "300"]);
        assert_eq!(
            o.micro_compare,
            [PathBuf::from("main.o"), PathBuf::from("branch.o")]
        );
        assert_eq!(o.micro_calls, 300);
    }

    #[test]
    fn only_conn_rate_leaves_every_other_phase_out() {
        let o = opts(&["--only-conn-rate", "--conn-rate-reps", "5", "--secs", "3"]);
        assert!(o.points().is_empty());
        assert!(o.conn_rate && o.only_conn_rate && o.offload_path);
        assert!(!(o.micro || o.frags || o.scaling));
        assert!(crate::run::cable_points(&o).is_empty());
        assert_eq!((o.big_table, o.conn_rate_reps, o.secs), (0, 5, 3));
        // --secs sets the connection runs' length too.
        assert_eq!(o.conn_rate_secs, 3);
        // The plan: the platform's one crypto size and 5 rounds of kernel,
        // xdp and offload on each wire, nothing else.
        let phases = crate::plan::phases(&o);
        let named: Vec<(&str, usize)> = phases
            .iter()
            .filter(|p| p.runs > 0 || p.name == "platform")
            .map(|p| (p.name, p.runs))
            .collect();
        assert_eq!(
            named,
            vec![("platform", 0), ("conn-rate", 15), ("cable", 15)]
        );
        let plain_only = opts(&["--only-conn-rate", "--no-cable"]);
        assert!(!crate::run::cable_conn_rate(&plain_only));
        assert_eq!(opts(&[]).conn_rate_reps, 1);
        // The connection runs' length: their own, else --secs, else the mode's.
        let secs = |args: &[&str]| opts(args).conn_rate_secs;
        assert_eq!(
            (secs(&[]), secs(&["--quick"]), secs(&["--smoke"])),
            (2, 1, 1)
        );
        assert_eq!(secs(&["--secs", "5", "--conn-rate-secs", "3"]), 3);
        for bad in [
            &["--only-conn-rate", "--no-conn-rate"][..],
            &["--conn-rate-reps", "0"],
        ] {
            let args = std::iter::once("router-bench").chain(bad.iter().copied());
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn lists_and_values_are_checked() {
        let o = opts(&[
            "--workloads",
            "tcp,udp-live",
            "--nodelay",
            "on",
            "--tcp-sink",
            "iperf",
        ]);
        assert_eq!(o.workloads, vec![Workload::Tcp, Workload::UdpLive]);
        assert_eq!((o.nodelay, o.tcp_sink), (vec![true], TcpSink::Iperf));
        // iperf2's -b paces up to 100 streams, the kernel more, unless asked.
        let auto = opts(&[]).pacing;
        assert_eq!(auto, Pacing::Auto);
        assert!(!auto.by_kernel(100) && auto.by_kernel(1000));
        assert_eq!(opts(&["--pacing", "iperf"]).pacing, Pacing::Iperf);
        assert!(opts(&["--pacing", "fq"]).pacing.by_kernel(1));
        for bad in [
            &["--conns", "0"][..],
            &["--workloads", "tcp,bogus"],
            &["--live-flows", "50000"],
            &["--ping-interval", "0.001"],
            &["--secs"],
        ] {
            let args = std::iter::once("router-bench").chain(bad.iter().copied());
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?} was accepted");
        }
    }
}
