//! The Markdown tables: one per workload variant, shaped like a router
//! review, the micro-benchmark's and the frags experiment's.

use std::fmt::Write as _;

use crate::model::{DataPath, Offload, Point, RunResult, Workload};
use crate::workloads::frags;
use crate::workloads::micro::Case;

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
            Workload::TcpPaced => format!(
                "TCP paced to a fixed total rate (`--line-rate`, `-b` per stream), offload {}",
                self.offload.name()
            ),
        }
    }

    pub fn short(self) -> String {
        match self.workload {
            Workload::Tcp => format!("tcp, offload {}", self.offload.name()),
            Workload::TcpSmall => format!(
                "tcp -l 128{}, offload {}",
                if self.nodelay { " -N" } else { "" },
                self.offload.name()
            ),
            Workload::UdpSmall => "udp 64 B".to_owned(),
            Workload::UdpLive => "udp 64 B, live generator".to_owned(),
            Workload::TcpPaced => format!("tcp paced, offload {}", self.offload.name()),
        }
    }
}

/// Variants in first-seen order.
pub fn variants(runs: &[RunResult]) -> Vec<Variant> {
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

pub fn find(runs: &[RunResult], v: Variant, conns: u32, path: DataPath) -> Option<&RunResult> {
    runs.iter()
        .find(|r| Variant::of(r.point) == v && r.point.conns == conns && r.path == path)
}

pub fn conns_of(runs: &[RunResult], v: Variant) -> Vec<u32> {
    let mut c: Vec<u32> = runs
        .iter()
        .filter(|r| Variant::of(r.point) == v)
        .map(|r| r.point.conns)
        .collect();
    c.sort_unstable();
    c.dedup();
    c
}

/// `x` with `prec` decimals, `-` when not a number.
pub fn f(x: f64, prec: usize) -> String {
    if x.is_finite() {
        format!("{x:.prec$}")
    } else {
        "-".to_owned()
    }
}

/// A run's ping RTT "p50 / p99" in ms with `prec` decimals: "lost" for a
/// percentile that fell among the lost echoes, and the lost share after
/// it when any was lost.
pub fn rtt_cell(r: &RunResult, prec: usize) -> String {
    let ms = |x: f64| {
        if x == f64::INFINITY {
            "lost".to_owned()
        } else {
            f(x, prec)
        }
    };
    let lost = if r.ping_loss_pct > 0.0 {
        format!(" ({} % of pings lost)", f(r.ping_loss_pct, 1))
    } else {
        String::new()
    };
    format!("{} / {}{lost}", ms(r.rtt_ms_p50), ms(r.rtt_ms_p99))
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "-".to_owned()
    }
}

/// Throughput of a run in the unit of its table.
pub fn thr(r: &RunResult) -> f64 {
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
        rtt_cell(r, 3),
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
        if v.workload == Workload::UdpLive {
            s.push_str(&limit_table(runs, v));
        }
    }
    s
}

/// The limit (minimal XDP forwarder, no NAT) beside xdp and kernel on the
/// same generator and topology.
fn limit_table(runs: &[RunResult], v: Variant) -> String {
    let mut s = String::new();
    let rows: Vec<u32> = conns_of(runs, v)
        .into_iter()
        .filter(|&c| find(runs, v, c, DataPath::Limit).is_some())
        .collect();
    if rows.is_empty() {
        return s;
    }
    let _ = writeln!(
        s,
        "The limit on the same generator: a minimal XDP forwarder (`bpf_fib_lookup` + \
         `bpf_redirect`, no NAT, no flow table, like xdp-forward's fib mode), run in \
         alternation with the two paths above.\n"
    );
    let _ = writeln!(
        s,
        "| flows | limit Mpps | limit RTT p50 / p99 ms | limit CPU % (softirq) | limit ns/pkt \
         (B/pkt) | xdp / limit Mpps | kernel / limit Mpps | xdp / limit ns/pkt |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for c in rows {
        let l = find(runs, v, c, DataPath::Limit);
        let [lt, ll, lc, ln] = cells(l, true);
        let ratio_to_limit = |path, f: fn(&RunResult) -> f64| match (find(runs, v, c, path), l) {
            (Some(x), Some(l)) => ratio(f(x), f(l)),
            _ => "-".into(),
        };
        let _ = writeln!(
            s,
            "| {c} | {lt} | {ll} | {lc} | {ln} | {} | {} | {} |",
            ratio_to_limit(DataPath::Xdp, |r| r.pps),
            ratio_to_limit(DataPath::Kernel, |r| r.pps),
            ratio_to_limit(DataPath::Xdp, |r| r.router_ns_per_pkt),
        );
    }
    s.push('\n');
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
