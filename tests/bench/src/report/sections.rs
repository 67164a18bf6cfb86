//! Report sections of the runs beside the main tables: scaling with
//! cores, TCP between XDP cables, the connection setup rate, a large flow
//! table.

use std::fmt::Write as _;

use crate::model::{DataPath, RunResult, Wire, Workload};
use crate::workloads::{bigtable, connrate, scaling};

use super::goals::Goal;
use super::tables::f;

const PATHS: [DataPath; 3] = [DataPath::Kernel, DataPath::Xdp, DataPath::Limit];

fn scaling_pps(rows: &[scaling::Row], path: DataPath, cores: usize) -> Option<f64> {
    rows.iter()
        .find(|r| r.run.path == path && r.cores == cores)
        .map(|r| r.run.pps)
}

fn most_cores(rows: &[scaling::Row]) -> usize {
    rows.iter().map(|r| r.cores).max().unwrap_or(1)
}

/// Scaling with cores: Mpps and ns/packet per path on 1 and on all CPUs.
pub fn scaling_section(rows: &[scaling::Row]) -> String {
    let mut s = String::new();
    if rows.is_empty() {
        return s;
    }
    let n = most_cores(rows);
    let _ = writeln!(
        s,
        "### Scaling with cores: live generator on 1 and on {n} CPUs\n\n\
         A fresh topology whose veths have {n} receive and transmit queues (`ethtool -L`), \
         one live-frame generator per CPU, each pinned: a veth transmit picks the peer's queue \
         by the sending CPU, so each generator feeds its own queue of the router's `lan0` and \
         that queue's NAPI runs on the generator's CPU (as RSS spreads a NIC's queues); each \
         generator sends its own slice of the flows, as RSS keeps a flow on one queue. The \
         generators, the router and the sink share the same {n} cores: on all cores every CPU \
         runs a generator as well as the router's and the sink's work, so the figure is the \
         machine's, not the router's alone; ns/packet (softirq time per packet) shows whether \
         the router's own cost per packet stays flat.\n"
    );
    let _ = writeln!(
        s,
        "| path | Mpps on 1 core | Mpps on {n} | {n} / 1 | ns/pkt on 1 | ns/pkt on {n} | CPU % on {n} (softirq) |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for path in PATHS {
        let one = rows.iter().find(|r| r.run.path == path && r.cores == 1);
        let all = rows.iter().find(|r| r.run.path == path && r.cores == n);
        if one.is_none() && all.is_none() {
            continue;
        }
        let pps = |r: Option<&scaling::Row>| r.map_or(f64::NAN, |r| r.run.pps / 1e6);
        let ns = |r: Option<&scaling::Row>| r.map_or(f64::NAN, |r| r.run.router_ns_per_pkt);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} |",
            path.name(),
            f(pps(one), 3),
            f(pps(all), 3),
            f(pps(all) / pps(one), 2),
            f(ns(one), 0),
            f(ns(all), 0),
            all.map_or_else(
                || "-".to_owned(),
                |r| format!("{} ({})", f(r.run.cpu_pct, 0), f(r.run.softirq_pct, 0))
            ),
        );
    }
    s.push('\n');
    s.push_str(&where_scaling_stops(rows, n));
    s
}

/// What the xdp rows say about where scaling stops on this machine.
fn where_scaling_stops(rows: &[scaling::Row], n: usize) -> String {
    let find = |cores| {
        rows.iter()
            .find(|r| r.run.path == DataPath::Xdp && r.cores == cores)
    };
    let (Some(one), Some(all)) = (find(1), find(n)) else {
        return String::new();
    };
    if n < 2 {
        return String::new();
    }
    format!(
        "Where it stops: xdp went from {} to {} Mpps ({}x on {n} CPUs) while its cost per \
         packet went from {} to {} ns; the machine was {} % busy on {n} generators (loss {} %). \
         Every CPU also runs a generator and the sink, so the cores the router would scale \
         onto are already shared: the figure stops at the core count, and past the machine's \
         saturation a rising ns/packet means cross-CPU contention (shared cache lines: the \
         flow table's LRU lists, the redirect and veth queues), a flat one that the cores \
         simply ran out.\n\n",
        f(one.run.pps / 1e6, 3),
        f(all.run.pps / 1e6, 3),
        f(all.run.pps / one.run.pps, 2),
        f(one.run.router_ns_per_pkt, 0),
        f(all.run.router_ns_per_pkt, 0),
        f(all.run.cpu_pct, 0),
        f(all.run.loss_pct, 1),
    )
}

/// xdp on all cores against xdp on one.
pub fn scaling_goal(rows: &[scaling::Row]) -> Goal {
    let n = most_cores(rows);
    let ratio = match (
        scaling_pps(rows, DataPath::Xdp, 1),
        scaling_pps(rows, DataPath::Xdp, n),
    ) {
        (Some(one), Some(all)) if n > 1 && one > 0.0 => Some((one, all)),
        _ => None,
    };
    Goal {
        asks: "scaling: xdp pps on 2 cores >= 1.8x xdp on 1 core (multi-queue veths, one \
               generator per CPU)",
        measured: ratio.map_or_else(
            || "-".to_owned(),
            |(one, all)| {
                format!(
                    "{:.3} Mpps on 1, {:.3} on {n} ({:.2}x)",
                    one / 1e6,
                    all / 1e6,
                    all / one
                )
            },
        ),
        met: ratio.map(|(one, all)| all >= 1.8 * one),
    }
}

pub fn scaling_json(rows: &[scaling::Row]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            let mut run = super::json::runs_json(std::slice::from_ref(&r.run));
            let mut v = run[0].take();
            v["cores"] = r.cores.into();
            v
        })
        .collect()
}

/// TCP between XDP cables: the main tables' layout on those runs.
pub fn cable_section(runs: &[RunResult], router_gro: bool) -> String {
    if runs.is_empty() {
        return String::new();
    }
    let gro = if router_gro {
        "with GRO on and tx checksum offload off (`--router-gro`: a merged packet cut up \
         again must leave with complete checksums, as the cable's XDP cannot finish partial \
         ones; so the kernel path computes them in software, and verifies the arriving \
         frames' in GRO, where a NIC does both in hardware)"
    } else {
        "with GRO kept off"
    };
    let mut s = format!(
        "### A fairer wire for TCP: XDP cables on both sides of the router\n\n\
         A fresh topology, client -- cable -- router -- cable -- server, each cable a \
         namespace whose two veths redirect every frame to each other (a raw XDP program). \
         On a plain veth, native XDP copies every cloned TCP skb before the router's program \
         runs (`skb_pp_cow_data`), which a NIC's receive ring does not do; here the cables \
         take that copy and the router receives frames as from a NIC, on both paths. The \
         kernel path has a `return XDP_PASS` program on the router's veths (NAPI, so that \
         they accept redirected frames, {gro}). Offload off. The paced runs \
         (`tcp-paced`, also on the offload path) are the review table's \"CPU at line rate, \
         XDP cables\" rows.\n\n",
    );
    s.push_str(&super::tables::tables(runs));
    s
}

/// On the cables: one stream xdp/kernel >= 1.4x; xdp ahead at 1000 and
/// 2000 connections with `-l 128`.
pub fn cable_goal(runs: &[RunResult]) -> Goal {
    let get = |path, workload, conns| {
        runs.iter()
            .find(|r| r.path == path && r.point.workload == workload && r.point.conns == conns)
    };
    let mut parts = Vec::new();
    let mut met = Some(true);
    let mut check = |label: String, workload, conns, need: f64| match (
        get(DataPath::Kernel, workload, conns),
        get(DataPath::Xdp, workload, conns),
    ) {
        (Some(k), Some(x)) if k.gbps > 0.0 => {
            let r = x.gbps / k.gbps;
            parts.push(format!(
                "{label}: {r:.2}x ({:.2} vs {:.2} Gbit/s)",
                x.gbps, k.gbps
            ));
            met = met.map(|m| m && r >= need);
        }
        _ => met = None,
    };
    check("tcp -P 1".to_owned(), Workload::Tcp, 1, 1.4);
    for c in [1000, 2000] {
        check(format!("-l 128 -P {c}"), Workload::TcpSmall, c, 1.0);
    }
    Goal {
        asks: "TCP between XDP cables, offload off: single stream xdp/kernel >= 1.4x, and xdp \
               ahead at 1000 and 2000 connections with `-l 128`",
        measured: if parts.is_empty() {
            "-".into()
        } else {
            parts.join("; ")
        },
        met,
    }
}

/// New connections per second per path, on each wire.
pub fn conn_rate_section(rows: &[connrate::Row]) -> String {
    let mut s = String::new();
    let Some(first) = rows.first() else {
        return s;
    };
    let _ = writeln!(
        s,
        "### Connection setup rate\n\n\
         Short TCP connections through the router (connect, a 16-byte request, a 16-byte \
         reply, the server closes), {} clients in parallel, our own client and server \
         (`workloads/connrate.rs`), offload off. Each connection is a new flow: the kernel \
         creates a conntrack entry and NAT mapping, standalone XDP admits the flow itself, \
         offload takes the kernel's setup, and its daemon offloads a connection once \
         established (over ctnetlink) unless it closes first: under this load most do, \
         while they settle (200 ms) or within one batch of events, and then cost the daemon no \
         offload. The end hosts' own TCP setup \
         costs the same on every path and shares the cores.\n\n\
         Two wires, each with its own rounds: \"XDP cables\" (the cabled topology of \"A fairer \
         wire for TCP\") is the NIC-like guide and decides the goal; \"plain veth\" is the main \
         topology, where with any XDP program attached every packet the kernel handles first \
         takes veth's XDP path (cloned TCP skbs copied, `skb_pp_cow_data`, a new skb built \
         after `XDP_PASS`), a cost a NIC does not add: on the offload path, each connection's \
         handshake and close.\n\n\
         The last column counts the sockets on the whole machine that listened to conntrack \
         events during the run (an offload run's daemon is one): the kernel tracks listeners \
         machine-wide, not per network namespace, so while any listens, every connection the \
         kernel tracks, on the kernel path too, builds a netlink message per state change \
         (measured with perf: about 6-8 us of CPU per short connection here).\n",
        first.workers
    );
    let _ = writeln!(
        s,
        "| wire | path | connections/s | completed | failed | retransmitted segments | CPU % | \
         softirq us per connection | conntrack event listeners |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let wires = connrate::wires(rows);
    for &wire in &wires {
        for r in rows.iter().filter(|r| r.wire == wire) {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                wire.label(),
                r.path.name(),
                f(r.conns_per_s, 0),
                r.completed,
                r.failed,
                r.retransmits,
                f(r.cpu_pct, 0),
                f(r.softirq_us_per_conn, 1),
                r.event_listeners
            );
        }
    }
    for wire in wires {
        let _ = write!(s, "\n{}:", wire.label());
        let _ = writeln!(s, "{}", wire_summary(rows, wire));
    }
    s.push('\n');
    s
}

/// The ratios to the kernel and the offload path's figures of `wire`'s
/// rows: one paragraph.
fn wire_summary(rows: &[connrate::Row], wire: Wire) -> String {
    let mut s = String::new();
    let on_wire: Vec<&connrate::Row> = rows.iter().filter(|r| r.wire == wire).collect();
    let rate = |p| connrate::median_rate(rows, wire, p);
    let rounds = on_wire
        .iter()
        .filter(|r| r.path == DataPath::Kernel)
        .count();
    let of = if rounds > 1 {
        format!(" (medians of {rounds} alternating rounds)")
    } else {
        String::new()
    };
    let ratios: Vec<String> = [DataPath::Xdp, DataPath::Offload]
        .into_iter()
        .filter_map(|p| {
            let (k, x) = (rate(DataPath::Kernel)?, rate(p)?);
            Some(format!("{} / kernel {}x", p.name(), f(x / k, 2)))
        })
        .collect();
    if !ratios.is_empty() {
        let _ = write!(s, " {}{of}.", ratios.join(", "));
    }
    let offloaded: Vec<(u64, u64, f64)> = on_wire
        .iter()
        .filter_map(|r| {
            let fp = r.fast_path?;
            Some((fp.flows_offloaded, r.completed, fp.xdp_pct()))
        })
        .collect();
    if let Some(&(flows, completed, xdp_pct)) = offloaded.first() {
        let _ = write!(
            s,
            " Offload: the daemon offloaded {flows} of the {completed} connections; XDP carried \
             {} % of the forwarded packets{}.",
            f(xdp_pct, 1),
            if offloaded.len() > 1 {
                " (first round)"
            } else {
                ""
            }
        );
    }
    let daemon: Vec<f64> = on_wire
        .iter()
        .filter_map(|r| r.daemon_us_per_conn)
        .collect();
    if !daemon.is_empty() {
        let _ = write!(
            s,
            " The daemon's CPU time per connection: {} us (median).",
            f(bigtable::median(daemon), 1)
        );
    }
    s
}

pub fn conn_rate_json(rows: &[connrate::Row]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            serde_json::json!({
                "path": r.path.name(),
                // As the runs': which wire the connections crossed.
                "topology": r.wire.name(),
                "workers": r.workers,
                "conns_per_s": r.conns_per_s,
                "completed": r.completed,
                "failed": r.failed,
                "secs": r.secs,
                "cpu_pct": r.cpu_pct,
                "softirq_us_per_conn": r.softirq_us_per_conn,
                "daemon_us_per_conn": r.daemon_us_per_conn,
                "retransmits": r.retransmits,
                "event_listeners": r.event_listeners,
                "fast_path": super::json::fast_path_json(r.fast_path.as_ref()),
            })
        })
        .collect()
}

/// The live generator through a small and a large flow table: each row's
/// median over the repetitions, and every repetition's own ratio to the
/// small table of its path (xdp, or the flow-table control).
pub fn big_table_section(rows: &[bigtable::Row]) -> String {
    let mut s = String::new();
    if rows.is_empty() {
        return s;
    }
    let summary = bigtable::summarise(rows);
    let reps = summary
        .iter()
        .filter(|r| r.path == DataPath::Xdp)
        .map(|r| r.reps)
        .max()
        .unwrap_or(0);
    let capacity = rows.iter().map(|r| r.table_flows).max().unwrap_or(0) / 2 * 3;
    let _ = writeln!(
        s,
        "### Flows: a small and a large flow table\n\n\
         The live generator through the XDP path, once with a table of {} flows and once \
         with the table pre-filled with established TCP flows (written into the pinned \
         CONNTRACK map, both entries per flow) up to the size shown; the capacity is the \
         same for all rows (`attach --max-flows {capacity}`: {} entries, a fresh map for \
         every run). The live flows (the generator's source ports) are admitted by the data \
         path itself: in the large table the same 1000 as in the small one (what the \
         table's size alone costs; full runs only), and a tenth of the table, at most what \
         the generator varies (traffic spread over many flows: a working set that no longer \
         fits the caches). A full run also has a table of nothing but the spread's live \
         flows (the same working set without the large table: what separates the two is \
         the large table's cost, what separates it from the small table is the working \
         set's). {} The goal compares the spread row with the small table.\n",
        bigtable::SMALL_TABLE,
        u64::from(capacity) * 2,
        if reps > 1 {
            format!(
                "Each row ran {reps} times, the rows alternating (every repetition runs \
                 them all, in the opposite order of the one before); the table shows each \
                 row's median and range, and the ratio to the small table is the median of \
                 the repetitions' own ratios."
            )
        } else {
            "Each row ran once (quick run: a busy neighbour can move the ratio; a full run \
             repeats the rows)."
                .to_owned()
        }
    );
    if let Some(c) = summary.iter().find(|r| r.path == DataPath::Lookup) {
        let value = rows
            .iter()
            .find(|r| r.path == DataPath::Lookup)
            .map_or(0, |r| r.value_bytes);
        let _ = writeln!(
            s,
            "The control (path `lookup`): the limit's forwarder (fib lookup + redirect, no \
             NAT) plus one lookup of each packet's 5-tuple in a kernel `LRU_HASH` with the \
             router's key, {value}-byte values and the same capacity, and one 8-byte add into \
             the entry it hits: nothing of the router but its table. Its table holds the \
             same filler flows and both directions of the live flows; its rows ran {} time(s), \
             each next to the xdp row of the same table, and its ratios are to its own \
             1000-flow row. What the control loses at a working set is what the kernel's \
             hash table alone costs there (bucket and element misses in cache and TLB), \
             whatever the router's code around it.\n",
            c.reps
        );
    }
    let _ = writeln!(
        s,
        "| path | table flows | live flows | runs | Mpps (median) | Mpps (min-max) | vs small \
         table (per run) | ns/pkt | CPU % (softirq) | filler written in s |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in &summary {
        let ratios = bigtable::ratios(rows, (r.path, r.table_flows, r.live_flows));
        let vs = if r.table_flows == bigtable::SMALL_TABLE || ratios.is_empty() {
            "-".to_owned()
        } else {
            format!(
                "{} % ({})",
                f(bigtable::median(ratios.clone()) * 100.0, 0),
                ratios
                    .iter()
                    .map(|x| format!("{:.0}", x * 100.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {}-{} | {vs} | {} | {} ({}) | {} |",
            r.path.name(),
            r.table_flows,
            r.live_flows,
            r.reps,
            f(r.pps_median / 1e6, 3),
            f(r.pps_min / 1e6, 3),
            f(r.pps_max / 1e6, 3),
            f(r.ns_per_pkt_median, 0),
            f(r.cpu_pct_median, 0),
            f(r.softirq_pct_median, 0),
            f(r.fill_s_median, 1),
        );
    }
    s.push('\n');
    s
}

/// The spread row of `path` (the largest table, its most live flows) and
/// the median of its ratios to the small table of that path, if both ran.
fn spread_ratio(rows: &[bigtable::Row], path: DataPath) -> Option<(bigtable::Summary, f64)> {
    let big = bigtable::summarise(rows)
        .into_iter()
        .filter(|r| r.path == path && r.table_flows > bigtable::SMALL_TABLE)
        .max_by_key(|r| (r.table_flows, r.live_flows))?;
    let ratios = bigtable::ratios(rows, (path, big.table_flows, big.live_flows));
    (!ratios.is_empty()).then(|| (big, bigtable::median(ratios)))
}

/// The large table with traffic spread over many flows forwards >= 90 %
/// of the small one's pps: the median of the repetitions' own ratios; with
/// the control's ratio on the same rows beside it.
pub fn big_table_goal(rows: &[bigtable::Row]) -> Goal {
    let summary = bigtable::summarise(rows);
    let small = summary
        .iter()
        .find(|r| r.path == DataPath::Xdp && r.table_flows == bigtable::SMALL_TABLE);
    let pair = small
        .zip(spread_ratio(rows, DataPath::Xdp))
        .map(|(s, (b, ratio))| (s, b, ratio));
    // The same live flows without the large table (full runs).
    let working_set = pair.as_ref().and_then(|(_, b, _)| {
        let key = (DataPath::Xdp, b.live_flows, b.live_flows);
        let ratios = bigtable::ratios(rows, key);
        (b.table_flows > b.live_flows && !ratios.is_empty())
            .then(|| (b.live_flows, bigtable::median(ratios)))
    });
    let control = spread_ratio(rows, DataPath::Lookup).map(|(_, ratio)| ratio);
    Goal {
        asks: "flows: a table of 1,000,000 established flows forwards >= 90 % of the pps of \
               a 1,000-flow table (xdp, live generator)",
        measured: pair.as_ref().map_or_else(
            || "-".to_owned(),
            |(s, b, ratio)| {
                let runs = b.reps.min(s.reps);
                format!(
                    "{} flows ({} live) {:.3} Mpps vs {} flows {:.3} Mpps: {:.0} % ({}){}",
                    b.table_flows,
                    b.live_flows,
                    b.pps_median / 1e6,
                    s.table_flows,
                    s.pps_median / 1e6,
                    ratio * 100.0,
                    if runs > 1 {
                        format!("medians of {runs} alternating runs each")
                    } else {
                        "one run each".to_owned()
                    },
                    control.map_or_else(String::new, |c| format!(
                        " (the kernel's LRU hash alone, the lookup control on the same rows: \
                         {:.0} %)",
                        c * 100.0
                    ))
                ) + &working_set.map_or_else(String::new, |(live, ratio)| {
                    format!(
                        "; a table of only its {live} live flows: {:.0} %",
                        ratio * 100.0
                    )
                })
            },
        ),
        met: pair.map(|(_, _, ratio)| ratio >= 0.9),
    }
}

pub fn big_table_json(rows: &[bigtable::Row]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            let mut v = super::json::runs_json(std::slice::from_ref(&r.run))[0].take();
            v["table_flows"] = r.table_flows.into();
            v["live_flows"] = r.live_flows.into();
            v["rep"] = r.rep.into();
            v["fill_s"] = r.fill_s.into();
            v["value_bytes"] = r.value_bytes.into();
            v
        })
        .collect()
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::model::{Offload, Point};

    #[test]
    fn conn_rate_rows_show_their_wire_cables_first() {
        use crate::model::FastPathShare;
        let row = connrate::Row::sample;
        let mut offload = row(DataPath::Offload, Wire::Cable, 760.0);
        offload.fast_path = Some(FastPathShare {
            xdp_pkts: 100,
            kernel_pkts: 900,
            flows_offloaded: 7,
            peak_flows: None,
            steady_xdp_pct: None,
        });
        offload.daemon_us_per_conn = Some(12.5);
        let rows = [
            row(DataPath::Kernel, Wire::Veth, 1000.0),
            row(DataPath::Offload, Wire::Veth, 550.0),
            row(DataPath::Kernel, Wire::Cable, 800.0),
            offload,
            row(DataPath::Kernel, Wire::Cable, 840.0),
            row(DataPath::Offload, Wire::Cable, 700.0),
        ];
        let md = conn_rate_section(&rows);
        let cable_rows = md
            .find("| XDP cables | kernel | 800 |")
            .expect("a cable row");
        let veth_rows = md
            .find("| plain veth | kernel | 1000 |")
            .expect("a veth row");
        assert!(cable_rows < veth_rows, "{md}");
        // Each wire's medians against its own kernel rows.
        assert!(
            md.contains(
                "XDP cables: offload / kernel 0.89x (medians of 2 alternating rounds). Offload: \
                 the daemon offloaded 7 of the 100 connections; XDP carried 10.0 % of the \
                 forwarded packets. The daemon's CPU time per connection: 12.5 us (median)."
            ),
            "{md}"
        );
        assert!(md.contains("plain veth: offload / kernel 0.55x.\n"), "{md}");
        let json = conn_rate_json(&rows);
        assert_eq!(json[0]["topology"], "veth");
        assert_eq!(json[3]["topology"], "cable");
        assert_eq!(json[3]["fast_path"]["flows_offloaded"], 7);
        assert_eq!(conn_rate_section(&[]), "");
    }

    fn row(
        path: DataPath,
        (table_flows, live_flows): (u32, u32),
        rep: u32,
        pps: f64,
    ) -> bigtable::Row {
        let point = Point::new(Workload::UdpLive, live_flows, Offload::Off);
        let mut run = RunResult::blank(path, point);
        run.pps = pps;
        bigtable::Row {
            path,
            table_flows,
            live_flows,
            rep,
            value_bytes: 96,
            fill_s: 0.0,
            run,
        }
    }

    #[test]
    fn the_flows_goal_and_section_show_the_control_beside_xdp() {
        let (x, l) = (DataPath::Xdp, DataPath::Lookup);
        let small = (bigtable::SMALL_TABLE, bigtable::SMALL_TABLE);
        let spread = (1_000_000, 45_536);
        let rows = [
            row(x, small, 0, 4e6),
            row(l, small, 0, 5e6),
            row(x, spread, 0, 1.6e6),
            row(l, spread, 0, 3e6),
        ];
        let goal = big_table_goal(&rows);
        assert_eq!(goal.met, Some(false));
        assert!(
            goal.measured.contains(
                ": 40 % (one run each) (the kernel's LRU hash alone, the \
                                    lookup control on the same rows: 60 %)"
            ),
            "{}",
            goal.measured
        );
        let section = big_table_section(&rows);
        assert!(section.contains("The control (path `lookup`)"), "{section}");
        assert!(
            section.contains("| xdp | 1000000 | 45536 | 1 | 1.600 |"),
            "{section}"
        );
        assert!(
            section.contains("| lookup | 1000000 | 45536 | 1 | 3.000 |"),
            "{section}"
        );
        assert!(section.contains("| 60 % (60) |"), "{section}");
        // Without the control: the goal as before, no control paragraph.
        let xdp_only = [row(x, small, 0, 4e6), row(x, spread, 0, 1.6e6)];
        assert!(!big_table_goal(&xdp_only).measured.contains("lookup"));
        assert!(!big_table_section(&xdp_only).contains("The control"));
    }
}
