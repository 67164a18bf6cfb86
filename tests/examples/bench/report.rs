//! The three artifacts: Markdown tables shaped like a router review,
//! results.json, and an SVG chart of throughput against connections.

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;

use crate::frags;
use crate::load::{DataPath, Offload, Point, RunResult, Workload};
use crate::micro::Case;

/// Rows of one table: a workload variant (everything but the connections).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub workload: Workload,
    pub offload: Offload,
    pub nodelay: bool,
}

impl Variant {
    fn of(p: Point) -> Self {
        Self {
            workload: p.workload,
            offload: p.offload,
            nodelay: p.nodelay,
        }
    }

    pub fn title(self) -> String {
        match self.workload {
            Workload::Tcp => format!(
                "TCP, default length (128 KiB writes), offload {}",
                self.offload.name()
            ),
            Workload::TcpSmall => format!(
                "TCP, `-l 128`{}, offload {}",
                if self.nodelay {
                    " `-N` (TCP_NODELAY)"
                } else {
                    " (Nagle on: the review setting)"
                },
                self.offload.name()
            ),
            Workload::UdpSmall => "UDP, 64-byte payload, unlimited rate (`-b 10G`)".to_owned(),
            Workload::UdpLive => "UDP, 64-byte payload, in-kernel generator (`BPF_PROG_RUN` \
                                  live frames; conns = flows)"
                .to_owned(),
        }
    }

    fn short(self) -> String {
        match self.workload {
            Workload::Tcp => format!("tcp, offload {}", self.offload.name()),
            Workload::TcpSmall => format!(
                "tcp -l 128{}, offload {}",
                if self.nodelay { " -N" } else { "" },
                self.offload.name()
            ),
            Workload::UdpSmall => "udp 64 B".to_owned(),
            Workload::UdpLive => "udp 64 B, live generator".to_owned(),
        }
    }
}

/// Variants in first-seen order.
fn variants(runs: &[RunResult]) -> Vec<Variant> {
    let mut v: Vec<Variant> = Vec::new();
    for r in runs {
        let x = Variant::of(r.point);
        if !v.contains(&x) {
            v.push(x);
        }
    }
    // Review order: TCP, then small writes (Nagle, then -N), then UDP;
    // offload off before on.
    v.sort_by_key(|x| (x.workload as u8, x.nodelay, x.offload as u8));
    v
}

fn find(runs: &[RunResult], v: Variant, conns: u32, path: DataPath) -> Option<&RunResult> {
    runs.iter()
        .find(|r| Variant::of(r.point) == v && r.point.conns == conns && r.path == path)
}

fn conns_of(runs: &[RunResult], v: Variant) -> Vec<u32> {
    let mut c: Vec<u32> = runs
        .iter()
        .filter(|r| Variant::of(r.point) == v)
        .map(|r| r.point.conns)
        .collect();
    c.sort_unstable();
    c.dedup();
    c
}

fn f(x: f64, prec: usize) -> String {
    if x.is_finite() {
        format!("{x:.prec$}")
    } else {
        "-".to_owned()
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".to_owned()
    }
}

/// Throughput of a run in the unit of its table.
fn thr(r: &RunResult) -> f64 {
    if r.point.workload.is_udp() {
        r.pps / 1e6
    } else {
        r.gbps
    }
}

fn cells(r: Option<&RunResult>, udp: bool) -> [String; 4] {
    let Some(r) = r else {
        return ["-".into(), "-".into(), "-".into(), "-".into()];
    };
    let star = if r.cut_short { "*" } else { "" };
    let t = if udp {
        format!("{} ({}% loss){star}", f(r.pps / 1e6, 3), f(r.loss_pct, 1))
    } else {
        format!("{}{star}", f(r.gbps, 2))
    };
    [
        t,
        format!("{} / {}", f(r.rtt_ms_p50, 3), f(r.rtt_ms_p99, 3)),
        format!("{} ({})", f(r.cpu_pct, 0), f(r.softirq_pct, 0)),
        format!(
            "{} ({} B)",
            f(r.router_ns_per_pkt, 0),
            f(r.router_avg_pkt_bytes, 0)
        ),
    ]
}

/// One Markdown table per workload variant.
pub fn tables(runs: &[RunResult]) -> String {
    let mut s = String::new();
    for v in variants(runs) {
        let udp = v.workload.is_udp();
        let unit = if udp { "Mpps" } else { "Gbit/s" };
        let _ = writeln!(s, "### {}\n", v.title());
        let _ = writeln!(
            s,
            "| conns | kernel {unit} | kernel RTT p50 / p99 ms | kernel CPU % (softirq) | \
             kernel ns/pkt (B/pkt) | xdp {unit} | xdp RTT p50 / p99 ms | xdp CPU % (softirq) | \
             xdp ns/pkt (B/pkt) | xdp/kernel {unit} | xdp/kernel ns/pkt |"
        );
        let _ = writeln!(
            s,
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        );
        for c in conns_of(runs, v) {
            let k = find(runs, v, c, DataPath::Kernel);
            let x = find(runs, v, c, DataPath::Xdp);
            let [kt, kl, kc, kn] = cells(k, udp);
            let [xt, xl, xc, xn] = cells(x, udp);
            let (tr, nr) = match (k, x) {
                (Some(k), Some(x)) => (
                    ratio(thr(x), thr(k)),
                    ratio(x.router_ns_per_pkt, k.router_ns_per_pkt),
                ),
                _ => ("-".into(), "-".into()),
            };
            let _ = writeln!(
                s,
                "| {c} | {kt} | {kl} | {kc} | {kn} | {xt} | {xl} | {xc} | {xn} | {tr} | {nr} |"
            );
        }
        s.push('\n');
    }
    s
}

/// The micro-benchmark table.
pub fn micro_table(cases: &[Case]) -> String {
    let mut s = String::new();
    let floor = cases
        .iter()
        .find(|c| c.name == "trivial-pass")
        .map(|c| c.median_ns);
    let _ = writeln!(
        s,
        "| case | what | verdict | per call median ns (p10-p90) | above trivial floor ns | \
         amortised ns (repeat) |"
    );
    let _ = writeln!(s, "|---|---|---|---:|---:|---:|");
    for c in cases {
        let above = floor.map_or_else(|| "-".to_owned(), |fl| f(c.median_ns - fl, 0));
        let am = c.amortized_ns.map_or_else(
            || "-".to_owned(),
            |a| format!("{} (x{})", f(a, 1), c.repeat),
        );
        let bad = if c.unexpected > 0 {
            format!(
                " ({} of {} calls got another verdict)",
                c.unexpected, c.calls
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            s,
            "| {} | {} | {}{bad} | {} ({}-{}) | {above} | {am} |",
            c.name,
            c.what,
            c.verdict,
            f(c.median_ns, 0),
            f(c.p10_ns, 0),
            f(c.p90_ns, 0)
        );
    }
    s
}

pub fn runs_json(runs: &[RunResult]) -> serde_json::Value {
    runs.iter()
        .map(|r| {
            serde_json::json!({
                "path": r.path.name(),
                "workload": r.point.workload.json_name(),
                "generator": r.point.workload.generator(),
                "conns": r.point.conns,
                "gbps": r.gbps,
                "iperf_gbps": r.iperf_gbps,
                "pps": r.pps,
                "sent_pps": r.sent_pps,
                "router_pps": r.router_pps,
                "loss_pct": r.loss_pct,
                "lost": r.lost,
                "sink_drops": r.sink_drops,
                "rtt_ms_p50": r.rtt_ms_p50,
                "rtt_ms_p99": r.rtt_ms_p99,
                "ping_loss_pct": r.ping_loss_pct,
                "cpu_pct": r.cpu_pct,
                "softirq_pct": r.softirq_pct,
                "router_ns_per_pkt": r.router_ns_per_pkt,
                "router_avg_pkt_bytes": r.router_avg_pkt_bytes,
                "active_s": r.active_s,
                "backlog_drops": r.backlog_drops,
                "quiet_wait_s": r.quiet_wait_s,
                "router_pkts": r.router_pkts,
                "run_cpu_pct": r.run_cpu_pct,
                "run_ns_per_pkt": r.run_ns_per_pkt,
                "stream_s": r.stream_s,
                "offload": r.point.offload.name(),
                "nodelay": r.point.nodelay,
                "streams": r.streams,
                "connect_failures": r.connect_failures,
                "wall_s": r.wall_s,
                "cut_short": r.cut_short,
                "attempts": r.attempts,
                "notes": r.notes,
            })
        })
        .collect()
}

/// The frags experiment: a table and what it shows.
pub fn frags_section(rows: &[frags::Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### Frags experiment: TCP -P 1, offload on, kernel path\n\n\
         The router forwards with iptables MASQUERADE in every row; only what is attached to \
         its `lan0` and `wan0` differs: nothing, a `return XDP_PASS` program, or the same \
         program loaded with `BPF_F_XDP_HAS_FRAGS` (what `#[xdp(frags)]` sets). Attaching an \
         XDP program to a veth takes TSO/GSO away from its peer, so the client segments in \
         software and the router sees MTU-sized packets. The question was whether a \
         frags-aware program lets the peer keep them: `client TSO` is what the kernel did \
         here. (In veth.c of 6.x, `veth_xdp_set` clears `NETIF_F_GSO_SOFTWARE` from the \
         peer for every program; the frags flag only raises the peer's maximum MTU past a \
         page.)\n"
    );
    let _ = writeln!(
        s,
        "| attached to lan0 + wan0 | client TSO | Gbit/s | router B/pkt | ns/pkt | CPU % (softirq) |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} ({}) |",
            r.attached.name(),
            r.client_tso,
            f(r.run.gbps, 2),
            f(r.run.router_avg_pkt_bytes, 0),
            f(r.run.router_ns_per_pkt, 0),
            f(r.run.cpu_pct, 0),
            f(r.run.softirq_pct, 0)
        );
    }
    let _ = writeln!(
        s,
        "\nThe router program is not built as a frags program. Even where a superpacket \
         reaches a frags-aware program whole (a driver that keeps GSO under XDP), it cannot \
         leave by redirect. veth's `ndo_xdp_xmit` drops frames longer than \
         the peer's MTU, and an XDP frame carries neither `gso_size` nor `CHECKSUM_PARTIAL`, \
         so nothing downstream would segment it or complete the checksum a TSO sender leaves \
         partial. Today such a frame gets `bpf_fib_lookup`'s MTU verdict and goes to the \
         kernel (`pass_mtu`), which keeps that metadata on `XDP_PASS`; on a physical NIC \
         without LRO/GRO-to-XDP, frames are wire-sized and the question does not arise.\n"
    );
    s
}

pub fn frags_json(rows: &[frags::Row]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            serde_json::json!({
                "attached": r.attached.key(),
                "client_tso": r.client_tso,
                "gbps": r.run.gbps,
                "router_avg_pkt_bytes": r.run.router_avg_pkt_bytes,
                "router_ns_per_pkt": r.run.router_ns_per_pkt,
                "cpu_pct": r.run.cpu_pct,
                "softirq_pct": r.run.softirq_pct,
                "rtt_ms_p50": r.run.rtt_ms_p50,
                "rtt_ms_p99": r.run.rtt_ms_p99,
                "offload": r.run.point.offload.name(),
                "conns": r.run.point.conns,
            })
        })
        .collect()
}

pub fn micro_json(cases: &[Case]) -> serde_json::Value {
    cases
        .iter()
        .map(|c| {
            serde_json::json!({
                "case": c.name,
                "what": c.what,
                "verdict": c.verdict,
                "calls": c.calls,
                "unexpected_verdicts": c.unexpected,
                "ns_per_call_median": c.median_ns,
                "ns_per_call_p10": c.p10_ns,
                "ns_per_call_p90": c.p90_ns,
                "ns_amortized": c.amortized_ns,
                "repeat": c.repeat,
            })
        })
        .collect()
}

/// Throughput against connections, one panel per workload variant, both
/// paths in each.
pub fn chart(runs: &[RunResult], path: &Path) -> Result<(), String> {
    let vs = variants(runs);
    if vs.is_empty() {
        return Err("no runs to chart".into());
    }
    let cols = if vs.len() > 1 { 2 } else { 1 };
    let rows = vs.len().div_ceil(cols);
    let (w, h) = (560 * cols as u32, 40 + 340 * rows as u32);
    let root = SVGBackend::new(path, (w, h)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root
        .titled(
            "Throughput vs connections: kernel (iptables MASQUERADE) vs XDP",
            ("sans-serif", 22),
        )
        .map_err(|x| e(&x))?;
    let panels = root.split_evenly((rows, cols));
    let kernel_style = RGBColor(0xd6, 0x27, 0x28);
    let xdp_style = RGBColor(0x1f, 0x77, 0xb4);
    for (area, v) in panels.iter().zip(&vs) {
        let conns = conns_of(runs, *v);
        let x_max = f64::from(*conns.last().unwrap_or(&1)) * 1.5;
        let series: Vec<(DataPath, Vec<(f64, f64)>)> = [DataPath::Kernel, DataPath::Xdp]
            .into_iter()
            .map(|p| {
                let pts = conns
                    .iter()
                    .filter_map(|&c| find(runs, *v, c, p).map(|r| (f64::from(c), thr(r))))
                    .collect();
                (p, pts)
            })
            .collect();
        let y_max = series
            .iter()
            .flat_map(|(_, s)| s.iter().map(|p| p.1))
            .filter(|y| y.is_finite())
            .fold(0.0_f64, f64::max)
            .max(1e-3)
            * 1.35;
        let unit = if v.workload.is_udp() {
            "Mpps received"
        } else {
            "Gbit/s"
        };
        let mut chart = ChartBuilder::on(area)
            .caption(v.short(), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(52)
            .build_cartesian_2d((0.7_f64..x_max).log_scale(), 0.0..y_max)
            .map_err(|x| e(&x))?;
        chart
            .configure_mesh()
            .x_desc(if v.workload == Workload::UdpLive {
                "flows (in-kernel generator)"
            } else {
                "connections (iperf -P)"
            })
            .y_desc(unit)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()
            .map_err(|x| e(&x))?;
        for (p, pts) in series {
            let color = if p == DataPath::Kernel {
                kernel_style
            } else {
                xdp_style
            };
            let pts: Vec<(f64, f64)> = pts.into_iter().filter(|p| p.1.is_finite()).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|x| e(&x))?
                .label(p.name())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color));
            chart
                .draw_series(
                    pts.iter()
                        .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
                )
                .map_err(|x| e(&x))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.85))
            .draw()
            .map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}
