//! The report's notes: how each figure was measured and what limits it,
//! with this run's own numbers where they say something.

use std::fmt::Write as _;

use crate::cli::Opts;
use crate::model::{DataPath, Offload, RunResult, TcpSink, Workload};
use crate::report::RunEnv;
use tests::trafficgen;

use crate::workloads::live;

/// Every note, as a Markdown list.
pub fn notes(runs: &[RunResult], o: &Opts, env: &RunEnv) -> String {
    let mut s = String::new();
    for why in &env.skipped {
        let _ = writeln!(s, "- **Skipped.** {why}");
    }
    s.push_str(&method_notes(runs, o));
    s.push_str(&live_note(runs, o));
    s.push_str(&offload_notes(runs, o.router_gro));
    s.push_str(&loss_notes(runs));
    s.push_str(&tool_notes(o, env));
    s
}

/// Shared cores, the measurement window, the router's cost per packet,
/// iperf2 as a generator.
fn method_notes(runs: &[RunResult], o: &Opts) -> String {
    let mut s = String::new();
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
    s
}

/// The in-kernel generator, with this run's xdp vs kernel figures.
fn live_note(runs: &[RunResult], o: &Opts) -> String {
    let mut s = String::new();
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
        let (generator_insns, sink_insns) = (
            trafficgen::generator_instructions(),
            trafficgen::sink_instructions(),
        );
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
            trafficgen::CALL_SECS,
            trafficgen::BATCH,
            sink_insns,
            live_here.join("; ")
        );
    }
    s
}

/// Offloads and the copy XDP pays on veth, with this run's packet sizes
/// and ratios.
fn offload_notes(runs: &[RunResult], router_gro: bool) -> String {
    let mut s = String::new();
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
    let (router_gro, on_wire, compared) = if router_gro {
        (
            "off and GRO on (`--router-gro`, a NIC driver's default: the kernel path merges a \
             stream's segments into one packet per batch, one routing and NAT decision for \
             several, and cuts it up again in software on the way out; XDP runs before GRO and \
             sees each segment; between the XDP cables the router's tx checksum offload is off \
             too, so the kernel path computes those checksums in software)",
            "every packet on the wire is at most MTU-sized",
            "compare the paths as a router whose NIC runs GRO receives the same wire packets",
        )
    } else {
        (
            "and GRO off",
            "every packet through the router is at most MTU-sized, as on a wire",
            "compare the paths on equal packets",
        )
    };
    let _ = writeln!(
        s,
        "- **Offloads.** `off`: TSO, GSO (and tx checksum offload) off on the end hosts, TSO, GSO \
         {router_gro} on the router's veths: {on_wire}. `on`: the veth defaults (the router's \
         GRO as in `off`). Then the kernel path forwards TSO \
         superpackets (up to 64 KB, one routing and NAT decision for many wire packets: \
         the average this run measured follows), while \
         the XDP path still sees MTU-sized frames: attaching an XDP program (frags-aware or not: \
         see the frags experiment) to a \
         veth turns off TSO/GSO on its peer, and the end hosts must keep tx checksum offload \
         off because XDP cannot complete a partial checksum (redirected TCP stalls otherwise). \
         End hosts keep GRO on in both settings: a veth accepts redirected frames only when \
         the receiver runs NAPI.{measured} The `off` tables {compared}; the `on` tables \
         show what veth offloads give the kernel."
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
         single-stream XDP run on this kind of VM, 2026-12-04; not measured by this run), \
         and the receiving veth builds a new skb around the redirected frame. The kernel path forwards the same skb without a copy, so on veth \
         that copy eats into XDP's saving per MTU-sized TCP packet (the ratios this run \
         measured follow).{here} On a physical NIC \
         the program runs on the driver's receive buffer before any skb exists; the \
         micro-benchmark below is the program's own cost."
    );
    s
}

/// Where UDP datagrams and backlog packets were lost.
fn loss_notes(runs: &[RunResult]) -> String {
    let mut s = String::new();
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
    s
}

/// iperf2's quirks and the latency method.
fn tool_notes(o: &Opts, env: &RunEnv) -> String {
    let nofile = env.nofile;
    let sink = match o.tcp_sink {
        TcpSink::Discard => "a built-in epoll discard server in the server namespace",
        TcpSink::Iperf => "a fresh `iperf -s` per run",
    };
    let mut s = String::new();
    let _ = writeln!(
        s,
        "- **iperf2 2.1.8.** `-b 0` fails, so UDP uses `-b 10G` (unlimited on veth). `-l 128` \
         alone is coalesced by Nagle into ~1 KB segments; `-l 128 -N` (TCP_NODELAY) sends \
         each write as a segment (`--nodelay off,on`; not by default: reviews use plain \
         `-l 128`). With hundreds of streams iperf2 overruns `-t` by \
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
         on both paths) every {} s during each run: p50 / p99 of the echoes sent inside \
         the run's window, a lost echo counted as slower than any answered one (so p99 reads \
         `lost` when more than 1 % of them were lost; the lost share follows in brackets).",
        o.ping_interval
    );
    s
}
