//! `cargo xtask bench`: the XDP NAT router against the kernel's forwarding
//! with iptables MASQUERADE, on one fresh client -- router -- server
//! topology (the server has no route back, so only NAT makes it work),
//! alternating the two paths point by point so noise hits both alike.
//!
//! Workloads: iperf2 TCP at several `-P` (default length and `-l 128`, with
//! and without `-N`), iperf2 UDP with 64-byte payloads, ping RTT during
//! every run, machine CPU and softirq share, and the router's softirq time
//! per forwarded packet; TCP with veth offloads off (wire-like) and on
//! (defaults). Then a `BPF_PROG_RUN` micro-benchmark of the program.
//!
//! Writes `target/bench/report.md`, `results.json` and `throughput.svg`.
//! Needs root; all traffic stays in the namespaces the topology creates
//! (and deletes on exit, also on panic). Run with `--help` for options.

// Counters and nanoseconds here stay far below 2^52; figures are
// rounded for display anyway.
#![allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]
// Report writers are long lists of paragraphs.
#![allow(clippy::too_many_lines)]

#[path = "bench/frags.rs"]
mod frags;
#[path = "bench/goals.rs"]
mod goals;
#[path = "bench/live.rs"]
mod live;
#[path = "bench/load.rs"]
mod load;
#[path = "bench/micro.rs"]
mod micro;
#[path = "bench/report.rs"]
mod report;
#[path = "bench/sink.rs"]
mod sink;
#[path = "bench/sys.rs"]
mod sys;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use load::{DataPath, Offload, Point, RunResult, Settings, TcpSink, Workload};
use tests::Topology;

const HELP: &str = "\
usage: bench [--quick] [options]

  --quick                 fewer points and 2 s runs (under 3 minutes)
  --smoke                 one point per workload, 1 s runs, then check that every
                          artifact was written with both paths filled (what
                          `cargo xtask test` runs; out: target/bench-smoke)
  --secs N                length of every iperf run (default 5, quick 2)
  --conns LIST            TCP connection counts (default 1,100,1000,2000; quick 1,100)
  --udp-conns LIST        UDP streams (default 1,2; quick 1)
  --live-flows LIST       flows of the in-kernel UDP generator (default 1,1000)
  --workloads LIST        of tcp,tcp-small,udp-small,udp-live (default all)
  --offload LIST          TCP offload settings, of off,on (default off,on)
  --small-offload LIST    offload settings for tcp-small (default off,on; quick off)
  --nodelay LIST          tcp-small variants, of off,on (-N) (default off,on)
  --ping-interval S       ping interval during runs (default 0.02)
  --slack S               seconds an iperf client may overrun -t (+1 per 100 streams)
                          before `timeout -k` stops it (default 10)
  --tcp-sink iperf|discard
                          what receives the TCP streams: a fresh `iperf -s` per run, or
                          a built-in epoll discard server (default: iperf -s 2.1.8
                          crashes in many runs with 1000+ streams)
  --cc NAME               TCP congestion control of client and server (default cubic,
                          the Linux default; `keep` leaves the namespaces' own)
  --retries N             reruns of a run cut short (default 1)
  --micro-calls N         BPF_PROG_RUN calls per case (default 20000; quick 5000)
  --micro-repeat N        repeat for the amortised cases (default 1000000; quick 200000)
  --no-micro              skip the BPF_PROG_RUN micro-benchmark
  --no-frags              skip the frags experiment (TCP -P 1, offload on, kernel path
                          with no / a plain / a frags-aware XDP_PASS program on the router)
  --out DIR               output directory (default target/bench)

Lists are comma-separated. The environment variable XDP_BENCH_ARGS adds options
when run through `cargo xtask bench`.";

#[expect(clippy::struct_excessive_bools, reason = "command-line switches")]
struct Opts {
    quick: bool,
    smoke: bool,
    secs: u32,
    conns: Vec<u32>,
    udp_conns: Vec<u32>,
    live_flows: Vec<u32>,
    workloads: Vec<Workload>,
    offloads: Vec<Offload>,
    small_offloads: Vec<Offload>,
    nodelay: Vec<bool>,
    ping_interval: f64,
    slack: u32,
    cc: String,
    tcp_sink: TcpSink,
    retries: u32,
    micro: bool,
    frags: bool,
    micro_calls: u32,
    micro_repeat: u32,
    out: PathBuf,
}

fn list<T>(s: &str, f: impl Fn(&str) -> Option<T>) -> Result<Vec<T>, String> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| f(x.trim()).ok_or_else(|| format!("bad list item {x:?} in {s:?}")))
        .collect()
}

fn on_off(s: &str) -> Option<bool> {
    match s {
        "on" | "true" => Some(true),
        "off" | "false" => Some(false),
        _ => None,
    }
}

fn default_out() -> PathBuf {
    // target/<profile>/examples/bench -> target/bench (honours CARGO_TARGET_DIR).
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.parent()?.parent()?.join("bench")))
        .unwrap_or_else(|| PathBuf::from("target/bench"))
}

impl Opts {
    fn parse(args: &[String]) -> Result<Self, String> {
        let smoke = args.iter().any(|a| a == "--smoke");
        let quick = smoke || args.iter().any(|a| a == "--quick");
        let mut o = Opts {
            quick,
            smoke,
            secs: if quick { 2 } else { 5 },
            conns: if quick {
                vec![1, 100]
            } else {
                vec![1, 100, 1000, 2000]
            },
            udp_conns: if quick { vec![1] } else { vec![1, 2] },
            live_flows: vec![1, 1000],
            workloads: Workload::ALL.to_vec(),
            offloads: vec![Offload::Off, Offload::On],
            small_offloads: if quick {
                vec![Offload::Off]
            } else {
                vec![Offload::Off, Offload::On]
            },
            nodelay: vec![false, true],
            ping_interval: 0.02,
            slack: 10,
            cc: "cubic".to_owned(),
            tcp_sink: TcpSink::Discard,
            retries: 1,
            micro: true,
            frags: true,
            micro_calls: if quick { 5000 } else { 20_000 },
            micro_repeat: if quick { 200_000 } else { 1_000_000 },
            out: default_out(),
        };
        if smoke {
            o.secs = 1;
            o.conns = vec![1];
            o.live_flows = vec![64];
            o.offloads = vec![Offload::Off];
            o.nodelay = vec![false];
            o.retries = 1;
            o.micro_calls = 500;
            o.micro_repeat = 10_000;
            o.out = o.out.with_file_name("bench-smoke");
        }
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = || it.next().ok_or_else(|| format!("{a} needs a value"));
            let num = |v: &str| v.parse::<u32>().ok();
            match a.as_str() {
                "--quick" | "--smoke" => {}
                "--help" | "-h" => return Err(HELP.to_owned()),
                "--no-micro" => o.micro = false,
                "--no-frags" => o.frags = false,
                "--secs" => o.secs = num(val()?).filter(|&s| s > 0).ok_or("--secs: N > 0")?,
                "--conns" => o.conns = list(val()?, |x| num(x).filter(|&c| c > 0))?,
                "--udp-conns" => o.udp_conns = list(val()?, |x| num(x).filter(|&c| c > 0))?,
                "--live-flows" => {
                    o.live_flows = list(val()?, |x| {
                        num(x).filter(|&c| c > 0 && c <= u32::from(live::MAX_FLOWS))
                    })?;
                }
                "--workloads" => o.workloads = list(val()?, Workload::parse)?,
                "--offload" => o.offloads = list(val()?, Offload::parse)?,
                "--small-offload" => o.small_offloads = list(val()?, Offload::parse)?,
                "--nodelay" => o.nodelay = list(val()?, on_off)?,
                "--ping-interval" => {
                    o.ping_interval = val()?
                        .parse()
                        .ok()
                        .filter(|&x: &f64| x >= 0.002)
                        .ok_or("--ping-interval: seconds >= 0.002")?;
                }
                "--tcp-sink" => {
                    o.tcp_sink = match val()?.as_str() {
                        "iperf" => TcpSink::Iperf,
                        "discard" => TcpSink::Discard,
                        x => return Err(format!("--tcp-sink: iperf or discard, not {x:?}")),
                    };
                }
                "--cc" => val()?.clone_into(&mut o.cc),
                "--slack" => o.slack = num(val()?).ok_or("--slack: seconds")?,
                "--retries" => o.retries = num(val()?).ok_or("--retries: N")?,
                "--micro-calls" => {
                    o.micro_calls = num(val()?).filter(|&c| c > 0).ok_or("--micro-calls: N")?;
                }
                "--micro-repeat" => {
                    o.micro_repeat = num(val()?).filter(|&c| c > 0).ok_or("--micro-repeat: N")?;
                }
                "--out" => o.out = PathBuf::from(val()?),
                other => return Err(format!("unknown option {other:?}\n\n{HELP}")),
            }
        }
        Ok(o)
    }

    /// Every point in run order: grouped by offload setting (fewer
    /// switches), UDP with the first group.
    fn points(&self) -> Vec<Point> {
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
            pts.extend(self.live_flows.iter().map(|&conns| Point {
                workload: Workload::UdpLive,
                conns,
                offload,
                nodelay: false,
            }));
        }
        pts
    }
}

/// Rough duration of one run in seconds, for the time-left estimate.
fn estimate(secs: u32, p: Point) -> f64 {
    let ramp = if p.workload.is_udp() {
        0.0
    } else {
        load::ramp_secs(p.conns)
    };
    let per_stream = if p.workload == Workload::UdpLive {
        0.0
    } else {
        f64::from(p.conns) * 0.002
    };
    f64::from(secs) + ramp + 2.0 + per_stream
}

fn mmss(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    format!("{}m{:02}s", s / 60, s % 60)
}

fn show(r: &RunResult) -> String {
    let thr = if r.point.workload.is_udp() {
        format!(
            "{:.3} Mpps received of {:.3} sent ({:.1}% loss)",
            r.pps / 1e6,
            r.sent_pps / 1e6,
            r.loss_pct
        )
    } else if r.iperf_gbps.is_finite() {
        format!("{:.2} Gbit/s (iperf2 says {:.2})", r.gbps, r.iperf_gbps)
    } else {
        format!("{:.2} Gbit/s", r.gbps)
    };
    let mut s = format!(
        "{thr}, rtt p50 {:.3} / p99 {:.3} ms, cpu {:.0}% (softirq {:.0}%), {:.0} ns/pkt \
         ({:.0} B/pkt) over {:.1} s active of {:.1} s (whole run: cpu {:.0}%, {:.0} ns per \
         forwarded pkt, {} pkts)",
        r.rtt_ms_p50,
        r.rtt_ms_p99,
        r.cpu_pct,
        r.softirq_pct,
        r.router_ns_per_pkt,
        r.router_avg_pkt_bytes,
        r.active_s,
        r.wall_s,
        r.run_cpu_pct,
        r.run_ns_per_pkt,
        r.router_pkts,
    );
    if r.backlog_drops > 0 {
        let _ = write!(s, ", {} backlog drops", r.backlog_drops);
    }
    if r.quiet_wait_s > 1.0 {
        let _ = write!(s, ", waited {:.1} s for quiet", r.quiet_wait_s);
    }
    if r.cut_short {
        s.push_str(" [cut short]");
    }
    for n in &r.notes {
        let _ = write!(s, "; {n}");
    }
    s
}

/// A run of `point` on `path`, retried when cut short or failed.
fn measured(
    t: &Topology,
    router: &mut load::Router<'_>,
    s: &Settings,
    path: DataPath,
    point: Point,
    retries: u32,
    port: &mut u16,
) -> Result<RunResult, String> {
    let mut last_err = String::new();
    let mut best: Option<RunResult> = None;
    for attempt in 1..=retries + 1 {
        router.switch(path, point.offload)?;
        load::next_port(port);
        let res = if point.workload == Workload::UdpLive {
            live::run(t, s, path, point, &STOP)
        } else {
            load::run(t, s, path, point, *port)
        };
        match res {
            Ok(mut r) => {
                r.attempts = attempt;
                if !r.suspect {
                    return Ok(r);
                }
                if attempt <= retries {
                    eprintln!("      cut short ({}); retrying", r.notes.join("; "));
                }
                best = Some(r);
            }
            Err(e) if e.contains("Too many open files") => return Err(e),
            Err(e) => {
                eprintln!(
                    "      failed: {e}{}",
                    if attempt <= retries { "; retrying" } else { "" }
                );
                last_err = e;
            }
        }
    }
    best.ok_or(last_err)
}

fn notes(runs: &[RunResult], o: &Opts, env: &RunEnv) -> String {
    let nofile = env.nofile;
    let sink = match o.tcp_sink {
        TcpSink::Discard => "a built-in epoll discard server in the server namespace",
        TcpSink::Iperf => "a fresh `iperf -s` per run",
    };
    let mut s = String::new();
    for why in &env.skipped {
        let _ = writeln!(s, "- **Skipped.** {why}");
    }
    let max_sent = runs
        .iter()
        .filter(|r| r.point.workload == Workload::UdpSmall)
        .map(|r| r.sent_pps)
        .fold(0.0_f64, f64::max);
    let _ = writeln!(
        s,
        "- **Shared cores.** Generator (iperf2 client), router and sink (iperf2 server) are \
         network namespaces on one machine joined by veth pairs: all of them run on the same \
         {} cores. A veth has no wire and no queue of its own: a frame sent on one end is \
         processed by the receiver's softirq on the sending CPU. Whatever the router saves \
         goes to the generator and the sink, so throughput measures the whole machine, not \
         the router alone; CPU % is the busy share of the whole machine (100 = every core \
         busy), and a run at ~100 % is CPU-bound everywhere, not router-bound.",
        std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
    );
    let _ = writeln!(
        s,
        "- **Measurement window.** Every 100 ms a thread inside the namespaces reads the \
         machine's CPU ticks (/proc/stat), the router's `lan0` + `wan0` and the server's \
         `eth0` counters. A TCP run loads for a ramp-up of 1 s + 1 s per 500 streams \
         (thousands of iperf2 threads take seconds to connect and get going on two cores), \
         then the next {secs} s are measured and the bench stops the client (its `-t` is \
         longer, so no stream ends inside the window, and the seconds iperf2 would spend \
         draining its socket buffers afterwards are not measured). A UDP run goes to its own \
         end and the window is the span whose packet rate reached a quarter of the peak. \
         Throughput, CPU %, ns/pkt and the latency samples all come from that window.\n\
         - **Router cost per packet** (`ns/pkt`) = softirq time of the whole machine / packets \
         the router's `lan0` and `wan0` received, over the window. veth counts every frame it \
         takes in, XDP-redirected ones included, so the count means the same on both paths; \
         `B/pkt` is bytes per packet as veth counts them (with the 14-byte Ethernet header on \
         the kernel path, without it on the XDP path). results.json also has \
         `run_ns_per_pkt`: the whole run's softirq time over the packets forwarded (kernel \
         `IpForwDatagrams`; xdp `fwd_outbound + fwd_inbound` from `router-ctl stats` plus any \
         the kernel forwarded). The figure holds when the generator is the bottleneck, but \
         softirq time also contains the end hosts' own receive processing (the server's \
         TCP/UDP receive, the client's ACK processing), about the same per packet on both \
         paths: it is an upper bound on router cost, and the difference between the paths is \
         the router's saving. With offload on, the kernel path counts a TSO superpacket as one \
         packet (see `B/pkt`). Other load on the machine lands in these figures too: they \
         are system-wide.",
        secs = o.secs
    );
    if max_sent > 0.0 {
        let _ = writeln!(
            s,
            "- **Generator bottleneck.** iperf2 sent at most {:.0} kpps of 64-byte UDP here \
             (one sending thread per stream, sharing the cores with everything else), so the \
             iperf2 UDP rows measure what the machine can generate and sink, not the router's \
             ceiling: compare `ns/pkt`, the live-generator table and the micro-benchmark.",
            max_sent / 1e3
        );
    }
    let live = |p: DataPath, c: u32| {
        runs.iter()
            .find(|r| r.point.workload == Workload::UdpLive && r.path == p && r.point.conns == c)
    };
    let live_here: Vec<String> = o
        .live_flows
        .iter()
        .filter_map(|&c| {
            let (k, x) = (live(DataPath::Kernel, c)?, live(DataPath::Xdp, c)?);
            Some(format!(
                "{c} flow(s): {:.2} vs {:.2} Mpps ({:.1}x), {:.0} vs {:.0} ns/pkt ({:.1}x lower)",
                x.pps / 1e6,
                k.pps / 1e6,
                x.pps / k.pps,
                x.router_ns_per_pkt,
                k.router_ns_per_pkt,
                k.router_ns_per_pkt / x.router_ns_per_pkt
            ))
        })
        .collect();
    if !live_here.is_empty() {
        let (generator_insns, sink_insns) = live::program_sizes();
        let _ = writeln!(
            s,
            "- **In-kernel generator (udp-live).** `BPF_PROG_RUN` in live-frame mode (as \
             xdp-trafficgen does it) in the client namespace: a {}-instruction XDP program \
             rewrites the headers of page-pool frames ({}-byte UDP payload, valid checksum, \
             source port random over the flows) and returns `XDP_TX`, which the kernel turns \
             into a real transmit on the client's veth; calls of ~{} s, {} frames per batch. \
             The sink is a {}-instruction XDP program on the server's veth that drops UDP and \
             passes ping, the same program on both paths (it gets skbs from the kernel path \
             and XDP frames from the xdp path); `Mpps` is what reached the server's \
             interface, and `ns/pkt` includes the sink's softirq time on both paths. \
             Everything runs on one core: the generator is pinned to the last CPU it may \
             use, and a veth transmit runs the receiver's NAPI on the sending CPU, so the \
             router's and the sink's softirq work share that core with the generator. Ping \
             is pinned there too: a NAPI instance stays on the CPU where it runs while its \
             ring has work, so a ping sent from another core could capture the router's \
             NAPI there, after which every frame crossed cores (seen here: ~40 % more cost \
             per packet and heavy loss, at random). The generator does not pace; the \
             softirq work its transmits raise runs after each batch, and when it is \
             deferred to ksoftirqd instead, the veth ring to the router overflows: that is \
             the `loss`. The run turns GRO on at the router's \
             `lan0` on both paths (the state of a real NIC; needed on the kernel path, where \
             a veth accepts frames sent this way only with NAPI on the receiving side; \
             forwarded UDP is not aggregated). Pinning the router's NAPI to another core \
             (threaded NAPI) was tried and was slower on both paths: every frame then \
             crosses cores twice (veth ring, page-pool recycling). xdp vs kernel here: {}.",
            generator_insns,
            live::PAYLOAD,
            live::CALL_SECS,
            live::BATCH,
            sink_insns,
            live_here.join("; ")
        );
    }
    // Offloads, with the packet sizes this run saw.
    let size = |w: Workload, off: Offload, p: DataPath| {
        runs.iter()
            .filter(|r| r.point.workload == w && r.point.offload == off && r.path == p)
            .min_by_key(|r| r.point.conns)
            .map(|r| (r.router_avg_pkt_bytes, r.gbps, r.point.conns))
    };
    let sizes = (
        size(Workload::Tcp, Offload::On, DataPath::Kernel),
        size(Workload::Tcp, Offload::On, DataPath::Xdp),
        size(Workload::Tcp, Offload::Off, DataPath::Kernel),
    );
    let measured = match sizes {
        (Some(k), Some(x), off) => {
            let off = off.map_or_else(String::new, |o| {
                format!(" (offload off: {:.0} B, {:.2} Gbit/s)", o.0, o.1)
            });
            format!(
                " Here, at -P {}, the kernel path forwarded packets of {:.0} B on average at \
                 {:.2} Gbit/s with offload on{off}, the XDP path {:.0} B frames at {:.2} Gbit/s.",
                k.2, k.0, k.1, x.0, x.1
            )
        }
        _ => String::new(),
    };
    let _ = writeln!(
        s,
        "- **Offloads.** `off`: TSO, GSO (and tx checksum offload) off on the end hosts, TSO, GSO \
         and GRO off on the router's veths: every packet through the router is at most \
         MTU-sized, as on a wire. `on`: the veth defaults. Then the kernel path forwards TSO \
         superpackets (up to 64 KB, one routing and NAT decision for ~45 wire packets), while \
         the XDP path still sees MTU-sized frames: attaching an XDP program (frags-aware or not: \
         see the frags experiment) to a \
         veth turns off TSO/GSO on its peer, and the end hosts must keep tx checksum offload \
         off because XDP cannot complete a partial checksum (redirected TCP stalls otherwise). \
         End hosts keep GRO on in both settings: a veth accepts redirected frames only when \
         the receiver runs NAPI.{measured} The `off` tables compare the paths on equal \
         packets; the `on` tables show what veth offloads give the kernel."
    );
    // Where XDP's per-packet cost goes on veth, with this run's ratios.
    let cost_ratio = |w: Workload| {
        let pick = |p: DataPath| {
            runs.iter()
                .filter(|r| r.point.workload == w && r.point.offload == Offload::Off && r.path == p)
                .min_by_key(|r| r.point.conns)
        };
        match (pick(DataPath::Kernel), pick(DataPath::Xdp)) {
            (Some(k), Some(x)) if k.router_ns_per_pkt > 0.0 => {
                Some((x.router_ns_per_pkt / k.router_ns_per_pkt, k.point.conns))
            }
            _ => None,
        }
    };
    let mut here = Vec::new();
    if let Some((r, c)) = cost_ratio(Workload::Tcp) {
        here.push(format!("TCP offload off at -P {c}: {r:.2}"));
    }
    if let Some((r, c)) = cost_ratio(Workload::UdpSmall) {
        here.push(format!("64-byte UDP at -P {c}: {r:.2}"));
    }
    let here = if here.is_empty() {
        String::new()
    } else {
        format!(" xdp/kernel ns/pkt in this run: {}.", here.join(", "))
    };
    let _ = writeln!(
        s,
        "- **XDP on veth pays a copy per packet.** A veth's native XDP gets skbs from the \
         peer's network stack, not driver buffers: before the program runs, veth copies every \
         skb that is cloned (all TCP data: the original stays on the retransmit queue), \
         nonlinear or short of 256 B headroom into a page-pool page (`skb_pp_cow_data` from \
         `veth_xdp_rcv_skb`: ~7.5% of all CPU samples in `perf record -a` during a \
         single-stream XDP run here), and the receiving veth builds a new skb around the \
         redirected frame. The kernel path forwards the same skb without a copy. On veth, \
         XDP's saving per MTU-sized TCP packet is therefore small or negative, and larger on \
         small packets, which are cheap to copy.{here} On a physical NIC \
         the program runs on the driver's receive buffer before any skb exists; the \
         micro-benchmark below is the program's own cost."
    );
    let (lost, drops): (u64, u64) = runs
        .iter()
        .filter(|r| r.point.workload == Workload::UdpSmall)
        .fold((0, 0), |(l, d), r| (l + r.lost, d + r.sink_drops));
    if lost > 0 {
        let _ = writeln!(
            s,
            "- **UDP loss is mostly at the sink.** Over the UDP runs the server's socket \
             dropped {drops} datagrams for a full receive buffer (`UdpRcvbufErrors` in the \
             server namespace) against {lost} the server counted lost: one iperf2 server thread on \
             the shared cores cannot drain what the generator sends. A path that leaves the \
             generator more CPU (xdp) makes it send more and lose more; `Mpps` is what \
             arrived."
        );
    }
    let drops = |p: DataPath| -> u64 {
        runs.iter()
            .filter(|r| r.path == p)
            .map(|r| r.backlog_drops)
            .sum()
    };
    let (kd, xd) = (drops(DataPath::Kernel), drops(DataPath::Xdp));
    if kd + xd > 0 {
        let _ = writeln!(
            s,
            "- **Backlog drops.** The kernel dropped {kd} packets during kernel-path runs and \
             {xd} during xdp runs at its per-CPU backlog queue (`/proc/net/softnet_stat`, \
             `backlog_drops` per run in results.json; machine-wide). Without XDP (and with \
             GRO off) the router's veth hands received packets to that queue \
             (`netdev_max_backlog`); with XDP attached the veth runs NAPI with its own ring, \
             whose overflows are not counted there."
        );
    }
    let _ = writeln!(
        s,
        "- **iperf2 2.1.8.** `-b 0` fails, so UDP uses `-b 10G` (unlimited on veth). `-l 128` \
         alone is coalesced by Nagle into ~1 KB segments, so `-l 128 -N` (TCP_NODELAY) runs \
         too; reviews use plain `-l 128`. With hundreds of streams iperf2 overruns `-t` by \
         seconds, and its own Gbit/s (`iperf_gbps` in results.json, only where the client \
         ended by itself) counts bytes written into socket buffers, at -P 1000 several times \
         what crosses the router; the tables use the sink's interface counters instead. \
         `iperf -s` crashes (SIGSEGV, SIGABRT) or hangs in a good share of runs with 1000+ \
         streams, so the TCP streams go to {sink} (`--tcp-sink iperf|discard`; with `iperf` \
         a fresh server per run); UDP keeps a fresh `iperf -s -u` per run for its loss \
         accounting. Every client and server runs under `timeout -k`. A run cut short \
         (marked `*`: the client ended before the window was complete, the server died, \
         connections missing) is retried {} time(s). RLIMIT_NOFILE was {nofile}.",
        o.retries
    );
    let _ = writeln!(
        s,
        "- **Latency** is ping from client to server (through the router, ICMP echo is NATed \
         on both paths) every {} s during each run: p50 / p99 of those samples.",
        o.ping_interval
    );
    s
}

/// Set by SIGINT/SIGTERM: finish the current run, write what was
/// measured, delete the namespaces.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    const MSG: &[u8] = b"\nbench: interrupted; finishing the current run, then cleaning up\n";
    STOP.store(true, Ordering::SeqCst);
    // SAFETY: write(2) is async-signal-safe; MSG is a static buffer.
    unsafe { libc::write(2, MSG.as_ptr().cast(), MSG.len()) };
}

fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int);
    // SAFETY: the handler only stores to an atomic and calls write(2).
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if let Ok(extra) = std::env::var("XDP_BENCH_ARGS") {
        args.extend(extra.split_whitespace().map(str::to_owned));
    }
    let o = match Opts::parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(if args.iter().any(|a| a == "--help" || a == "-h") {
                0
            } else {
                2
            });
        }
    };
    if !tests::is_root() {
        eprintln!("bench: needs root (network namespaces, BPF): run `sudo cargo xtask bench`");
        std::process::exit(1);
    }
    install_signal_handlers();
    if let Err(e) = bench(&o) {
        eprintln!("bench: {e}");
        std::process::exit(1);
    }
    if o.smoke {
        match check_artifacts(&o) {
            Ok(n) => eprintln!("bench: smoke check passed ({n} runs, both paths, all artifacts)"),
            Err(e) => {
                eprintln!("bench: smoke check failed: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// The smoke run's check: the three artifacts exist, and results.json has
/// every point of the run on both paths with a throughput above zero, the
/// goals, the frags experiment and every micro-benchmark case. Returns how
/// many runs it checked.
fn check_artifacts(o: &Opts) -> Result<usize, String> {
    let read = |name: &str| {
        let p = o.out.join(name);
        std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
    };
    for name in ["report.md", "throughput.svg"] {
        if read(name)?.trim().is_empty() {
            return Err(format!("{name} is empty"));
        }
    }
    let json: serde_json::Value =
        serde_json::from_str(&read("results.json")?).map_err(|e| format!("results.json: {e}"))?;
    let runs = json["runs"].as_array().ok_or("results.json has no runs")?;
    let live_skipped = json["settings"]["skipped"].as_array().is_some_and(|v| {
        v.iter()
            .any(|x| x.as_str().is_some_and(|s| s.starts_with("udp-live")))
    });
    // The points that ran: all, but udp-live when it was skipped.
    let points: Vec<Point> = o
        .points()
        .into_iter()
        .filter(|p| p.workload != Workload::UdpLive || !live_skipped)
        .collect();
    for p in &points {
        for path in [DataPath::Kernel, DataPath::Xdp] {
            let found = runs.iter().find(|r| {
                r["path"] == path.name()
                    && r["workload"] == p.workload.json_name()
                    && r["generator"] == p.workload.generator()
                    && r["conns"] == p.conns
                    && r["offload"] == p.offload.name()
                    && r["nodelay"] == p.nodelay
            });
            let Some(r) = found else {
                return Err(format!("no {} run of {p}", path.name()));
            };
            let thr = if p.workload.is_udp() {
                &r["pps"]
            } else {
                &r["gbps"]
            };
            if !thr.as_f64().is_some_and(|x| x > 0.0) {
                return Err(format!(
                    "the {} run of {p} moved nothing: {thr}",
                    path.name()
                ));
            }
        }
    }
    let mut wanted = Vec::new();
    if o.frags && o.workloads.contains(&Workload::Tcp) {
        wanted.push("frags_experiment");
    }
    if o.micro {
        wanted.push("micro");
    }
    for key in wanted {
        if json[key].as_array().is_none_or(Vec::is_empty) {
            return Err(format!("results.json: {key} is empty"));
        }
    }
    // The goals that one point per workload can decide.
    let goals = json["goals"]
        .as_array()
        .ok_or("results.json has no goals")?;
    let decided = |prefix: &str| {
        goals.iter().any(|g| {
            g["goal"].as_str().is_some_and(|t| t.starts_with(prefix)) && g["met"].is_boolean()
        })
    };
    let mut must = Vec::new();
    if !points.is_empty() {
        must.push("router ns/packet");
    }
    if o.workloads.contains(&Workload::UdpLive) && !live_skipped {
        must.push("UDP 64-byte pps");
    }
    if o.micro {
        must.push("per-packet cost");
    }
    for m in must {
        if !decided(m) {
            return Err(format!(
                "results.json: the goal \"{m}...\" was not evaluated"
            ));
        }
    }
    Ok(runs.len())
}

fn bench(o: &Opts) -> Result<(), String> {
    let started = Instant::now();
    let max_conns = o
        .conns
        .iter()
        .chain(&o.udp_conns)
        .copied()
        .max()
        .unwrap_or(1);
    // iperf2 needs one fd per stream on each side (plus a few); children
    // inherit the limit.
    let nofile = sys::raise_nofile(65_536);
    if nofile < u64::from(max_conns) + 64 {
        return Err(format!(
            "RLIMIT_NOFILE is {nofile}, too low for {max_conns} connections and it could not \
             be raised; raise the hard limit (ulimit -Hn) or pass fewer --conns"
        ));
    }
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let tmp = o.out.join(format!("tmp-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;

    let t = Topology::new();
    eprintln!("bench: topology {}", t.namespaces().join(", "));
    t.warm_neighbours();
    let (cc, cc_per_socket) = congestion_control(&t, &o.cc);
    let settings = Settings {
        tcp_sink: o.tcp_sink,
        secs: o.secs,
        slack: o.slack,
        ping_interval: o.ping_interval,
        tmp: tmp.clone(),
        nofile,
        cc_per_socket,
    };
    let mut points = o.points();
    let mut skipped = Vec::new();
    if o.workloads.contains(&Workload::UdpLive)
        && let Err(e) = live::supported(&t)
    {
        // Only an old kernel is a reason to leave it out; anywhere newer a
        // failure is the generator's (or the harness's) and must show.
        if tests::kernel_at_least(5, 18) {
            return Err(format!("the live-frame generator does not work: {e}"));
        }
        eprintln!("bench: skipping udp-live: {e}");
        skipped.push(format!(
            "udp-live skipped: BPF_PROG_RUN live-frame mode needs Linux >= 5.18: {e}"
        ));
        points.retain(|p| p.workload != Workload::UdpLive);
    }
    let total = points.len() * 2;
    let est_total: f64 = points.iter().map(|p| 2.0 * estimate(o.secs, *p)).sum();
    eprintln!(
        "bench: {} points x 2 paths = {total} runs of {} s, about {} (+ micro-benchmark)",
        points.len(),
        o.secs,
        mmss(est_total)
    );

    let mut router = load::Router::new(&t);
    let mut offload_states = serde_json::Map::new();
    let mut runs: Vec<RunResult> = Vec::new();
    let mut failures: Vec<String> = Vec::new();
    let mut port = 5000;
    let (mut done_est, mut done_real) = (0.0, 0.0);
    let mut n = 0;
    'points: for (i, point) in points.iter().enumerate() {
        // Alternate which path goes first: kernel-xdp, xdp-kernel, ...
        let order = if i % 2 == 0 {
            [DataPath::Kernel, DataPath::Xdp]
        } else {
            [DataPath::Xdp, DataPath::Kernel]
        };
        for path in order {
            if STOP.load(Ordering::SeqCst) {
                failures.push(format!("interrupted after {n} of {total} runs"));
                break 'points;
            }
            n += 1;
            let scale = if done_est > 0.0 {
                done_real / done_est
            } else {
                1.0
            };
            let left = (est_total - done_est) * scale;
            eprintln!(
                "[{n:>2}/{total}] {point} | {:<6} | {} s run, ~{} left",
                path.name(),
                o.secs,
                mmss(left)
            );
            let t0 = Instant::now();
            let res = measured(
                &t,
                &mut router,
                &settings,
                path,
                *point,
                o.retries,
                &mut port,
            );
            done_est += estimate(o.secs, *point);
            done_real += t0.elapsed().as_secs_f64();
            let key = format!("{} {}", point.offload.name(), path.name());
            if !point.workload.is_udp() && !offload_states.contains_key(&key) {
                offload_states.insert(key, load::offload_state(&t));
            }
            match res {
                Ok(r) => {
                    eprintln!("        {}", show(&r));
                    runs.push(r);
                }
                Err(e) if e.contains("Too many open files") => return Err(e),
                Err(e) => {
                    eprintln!("        FAILED: {e}");
                    failures.push(format!("{point} on {}: {e}", path.name()));
                }
            }
        }
    }

    let frag_rows =
        if o.frags && o.workloads.contains(&Workload::Tcp) && !STOP.load(Ordering::SeqCst) {
            eprintln!(
                "bench: frags experiment: TCP -P 1, offload on, kernel path, with no / a plain / a \
             frags-aware XDP_PASS program on the router's veths"
            );
            match frags::run(&t, &mut router, &settings, &mut port) {
                Ok(r) => r,
                Err(e) => {
                    failures.push(e);
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };

    let reference = if o.workloads.contains(&Workload::Tcp)
        && o.offloads.contains(&Offload::Off)
        && o.conns.contains(&1)
        && !STOP.load(Ordering::SeqCst)
    {
        eprintln!(
            "bench: reference: TCP -P 1, offload off, plain kernel forwarding (fresh topology, \
             no netfilter, route back)"
        );
        match goals::reference_forwarding(&settings, &o.cc, &mut port) {
            Ok((r, cc)) => {
                eprintln!("        {} (congestion control {cc})", show(&r));
                Some(r)
            }
            Err(e) => {
                failures.push(format!("reference forwarding run: {e}"));
                None
            }
        }
    } else {
        None
    };

    let micro = if o.micro && !STOP.load(Ordering::SeqCst) {
        eprintln!(
            "bench: BPF_PROG_RUN micro-benchmark ({} calls per case, repeat {})",
            o.micro_calls, o.micro_repeat
        );
        // The router program under test is a separate, unattached copy.
        match micro::run(&t, o.micro_calls, o.micro_repeat) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("micro-benchmark: {e}"));
                Vec::new()
            }
        }
    } else {
        Vec::new()
    };
    drop(t);
    let _ = std::fs::remove_dir_all(&tmp);

    let elapsed = started.elapsed();
    let env = RunEnv {
        skipped,
        nofile,
        cc,
        offloads: offload_states.into(),
        elapsed,
    };
    let extra = Extra {
        micro,
        frag_rows,
        reference,
    };
    write_artifacts(o, &runs, &extra, &failures, &env)?;
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} run(s) failed:\n  {}",
            failures.len(),
            failures.join("\n  ")
        ))
    }
}

/// Sets the TCP congestion control of the client and server namespaces
/// (new namespaces inherit the host's, which may be e.g. BBR). Returns the
/// one in force and, when the namespaces may not select it (a non-initial
/// namespace may only pick from the host's
/// `tcp_allowed_congestion_control`), the algorithm to request per socket
/// instead (`iperf -Z`, allowed with `CAP_NET_ADMIN`).
fn congestion_control(t: &Topology, want: &str) -> (String, Option<String>) {
    use tests::Ns;
    let key = "net.ipv4.tcp_congestion_control";
    let now = || {
        let o = t.exec(Ns::Client, &["sysctl", "-n", key]);
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let orig = now();
    if want == "keep" {
        return (orig, None);
    }
    for ns in [Ns::Client, Ns::Server] {
        let o = t.exec(ns, &["sysctl", "-qw", &format!("{key}={want}")]);
        if !o.status.success() {
            // Leave both ends alike.
            let _ = t.exec(Ns::Client, &["sysctl", "-qw", &format!("{key}={orig}")]);
            let available =
                std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
                    .unwrap_or_default();
            if available.split_whitespace().any(|a| a == want) {
                eprintln!(
                    "bench: the namespaces may not select TCP congestion control {want}; the \
                     iperf2 clients request it per socket (-Z {want})"
                );
                return (
                    format!("{want} (per socket, iperf -Z)"),
                    Some(want.to_owned()),
                );
            }
            eprintln!(
                "bench: TCP congestion control {want} is not available (available: {}); \
                 keeping {orig}",
                available.trim()
            );
            return (orig, None);
        }
    }
    (now(), None)
}

/// Measurements besides the kernel/xdp runs.
struct Extra {
    micro: Vec<micro::Case>,
    frag_rows: Vec<frags::Row>,
    /// Plain kernel forwarding, TCP -P 1, offload off.
    reference: Option<RunResult>,
}

/// What the runs ran under, for the report.
struct RunEnv {
    /// Workloads left out, and why.
    skipped: Vec<String>,
    nofile: u64,
    /// TCP congestion control of the end hosts.
    cc: String,
    /// Active offload features per setting and path.
    offloads: serde_json::Value,
    elapsed: Duration,
}

fn write_artifacts(
    o: &Opts,
    runs: &[RunResult],
    extra: &Extra,
    failures: &[String],
    env: &RunEnv,
) -> Result<(), String> {
    let (micro, frag_rows) = (&extra.micro[..], &extra.frag_rows[..]);
    let reference = extra.reference.as_ref();
    let (nofile, elapsed) = (env.nofile, env.elapsed);
    let machine = sys::machine();
    let mut md = String::new();
    let _ = writeln!(md, "# XDP router benchmark: kernel path vs XDP path\n");
    let _ = writeln!(
        md,
        "{} run{}, {} s per iperf run, {} runs, took {}. Machine: {}, {} cores, {} GiB, kernel \
         {}, {} ({}). Topology: client ns -- veth -- router ns -- veth -- server ns, the server \
         has no route back (NAT required). kernel = `ip_forward=1` + iptables MASQUERADE; xdp = \
         `router-ctl attach lan0 wan0` (native XDP, no iptables NAT). The two alternate point \
         by point. TCP congestion control on the end hosts: {}.\n",
        machine["date"].as_str().unwrap_or("?"),
        if o.quick { " (--quick)" } else { "" },
        o.secs,
        runs.len(),
        mmss(elapsed.as_secs_f64()),
        machine["cpu_model"].as_str().unwrap_or("?"),
        machine["cores"],
        machine["mem_gib"],
        machine["kernel"].as_str().unwrap_or("?"),
        machine["iperf"].as_str().unwrap_or("?"),
        machine["virtualization"].as_str().unwrap_or("?"),
        env.cc,
    );
    let _ = writeln!(
        md,
        "Columns per path: throughput (TCP: bytes into the server's interface per second \
         over the measurement window, i.e. what crossed the router; UDP: datagrams the iperf2 server \
         received per second, with loss), ping RTT p50 / p99 during the run, busy share of \
         the machine with the softirq share in brackets, router softirq time per packet with \
         bytes per packet; then xdp/kernel ratios (throughput: > 1 is xdp faster; ns/pkt: \
         < 1 is xdp cheaper). `*` = run cut short (see below).\n"
    );
    let tables = report::tables(runs);
    md.push_str(&tables);
    if let Some(r) = reference {
        let _ = writeln!(
            md,
            "Reference, plain kernel forwarding without netfilter (fresh topology whose router \
             namespace never loaded an iptables rule; route back instead of NAT), TCP -P 1, \
             offload off: {:.2} Gbit/s, RTT p50 / p99 {:.3} / {:.3} ms, CPU {:.0}% (softirq \
             {:.0}%), {:.0} ns/pkt ({:.0} B/pkt).\n",
            r.gbps,
            r.rtt_ms_p50,
            r.rtt_ms_p99,
            r.cpu_pct,
            r.softirq_pct,
            r.router_ns_per_pkt,
            r.router_avg_pkt_bytes
        );
    }
    let goals = goals::evaluate(runs, micro, reference);
    let goals_md = goals::section(&goals);
    md.push_str(&goals_md);
    if !micro.is_empty() {
        let _ = writeln!(md, "### Packet cost: BPF_PROG_RUN micro-benchmark\n");
        let _ = writeln!(
            md,
            "The router program (a separate, unattached copy with its own maps, CONFIG and \
             DEVICES filled as `attach` does) run by `BPF_PROG_RUN` on crafted frames in the \
             router namespace (real FIB and neighbours). A forwarded frame is rewritten in \
             place, so with `repeat` the next iteration would see another packet: every case \
             is timed per call (`repeat` = 1, fresh frame) and reported as the median of the \
             calls; that includes the test-run harness's fixed cost, which the trivial floor \
             shows. Cases that leave the frame untouched are also timed with a large `repeat` \
             (amortised: the program alone). The floor is a two-instruction `return \
             XDP_PASS` program loaded with the raw bpf(2) syscall; `pass-not-ipv4` is the \
             router program passing an ARP frame at its first check.\n"
        );
        md.push_str(&report::micro_table(micro));
        md.push('\n');
    }
    let frags_md = if frag_rows.is_empty() {
        String::new()
    } else {
        report::frags_section(frag_rows)
    };
    md.push_str(&frags_md);
    let short: Vec<&RunResult> = runs.iter().filter(|r| r.cut_short).collect();
    let _ = writeln!(md, "### Runs cut short\n");
    if short.is_empty() && failures.is_empty() {
        let _ = writeln!(md, "None.\n");
    }
    for r in short {
        let _ = writeln!(
            md,
            "- {} on {} (after {} attempt(s)): {}",
            r.point,
            r.path.name(),
            r.attempts,
            r.notes.join("; ")
        );
    }
    for f in failures {
        let _ = writeln!(md, "- FAILED: {f}");
    }
    let _ = writeln!(md, "\n### Notes\n");
    md.push_str(&notes(runs, o, env));

    let json = serde_json::json!({
        "machine": machine,
        "settings": {
            "quick": o.quick,
            "secs": o.secs,
            "ping_interval_s": o.ping_interval,
            "retries": o.retries,
            "rlimit_nofile": nofile,
            "elapsed_s": elapsed.as_secs_f64(),
            "offload_features": env.offloads,
            "tcp_congestion_control": env.cc,
            "tcp_sink": o.tcp_sink.name(),
            "skipped": env.skipped,
        },
        "runs": report::runs_json(runs),
        "micro": report::micro_json(micro),
        "frags_experiment": report::frags_json(frag_rows),
        // The same fields as a run.
        "reference_forwarding": reference.map(|r| report::runs_json(std::slice::from_ref(r))[0].take()),
        "goals": goals::json(&goals),
        "failures": failures,
    });
    let md_path = o.out.join("report.md");
    let json_path = o.out.join("results.json");
    let svg_path = o.out.join("throughput.svg");
    std::fs::write(&md_path, &md).map_err(|e| format!("{}: {e}", md_path.display()))?;
    let pretty = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, pretty).map_err(|e| format!("{}: {e}", json_path.display()))?;
    if runs.is_empty() {
        return Err("no run succeeded; nothing to chart".into());
    }
    report::chart(runs, &svg_path)?;
    println!("{tables}");
    println!("{goals_md}");
    if !frags_md.is_empty() {
        println!("{frags_md}");
    }
    if !micro.is_empty() {
        println!(
            "### Packet cost: BPF_PROG_RUN micro-benchmark\n\n{}",
            report::micro_table(micro)
        );
    }
    println!(
        "wrote {}, {}, {} (took {})",
        md_path.display(),
        json_path.display(),
        svg_path.display(),
        mmss(elapsed.as_secs_f64())
    );
    Ok(())
}
