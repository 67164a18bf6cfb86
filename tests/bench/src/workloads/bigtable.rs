//! Flows: the live generator through the XDP path with a small and with a
//! large flow table. The large one is pre-filled with established TCP
//! flows written straight into the pinned CONNTRACK map (both entries of
//! each flow, as the data path writes them), the capacity raised with
//! `attach --max-flows`; the same capacity for both sizes, so only the
//! number of flows differs. The live traffic's flows (the generator's
//! source ports) are admitted by the data path itself: 1000 flows in the
//! small table; in the large one the same 1000 (the table's size alone)
//! and a tenth of the table up to the generator's maximum (traffic spread
//! over many flows); and a table of nothing but those spread flows (their
//! working set alone, without the large table).
//!
//! The rows are repeated (`reps`) and alternate: each repetition runs
//! every row once, in the opposite order of the one before, so a busy
//! neighbour or a drift of the machine's load hits every row alike; the
//! report takes each row's median and the goal the median of the
//! repetitions' own ratios.

use std::os::fd::{AsFd as _, AsRawFd as _};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use aya::maps::{HashMap, MapData};
use router_common::maps::{
    CONNTRACK_MAP, FLAG_ORIGINAL, FlowEntry, FlowKey, FlowState, IPPROTO_TCP,
};
use tests::{Ns, PIN_ROOT, ROUTER_WAN_ADDR, Topology};

use crate::model::{DataPath, Offload, Point, RunResult, Settings, Workload};
use crate::router::Router;
use crate::workloads::live;

/// Flows of the small table (and its live traffic).
pub const SMALL_TABLE: u32 = 1000;

/// Repetitions of the rows in a full run (quick and smoke runs: one).
pub const FULL_REPS: u32 = 3;

/// One run: the table's size, the flows the traffic spread over, the run.
pub struct Row {
    pub table_flows: u32,
    pub live_flows: u32,
    /// The repetition (0-based) this run belongs to.
    pub rep: u32,
    /// Seconds it took to write the filler flows.
    pub fill_s: f64,
    pub run: RunResult,
}

/// Filler flow `i`: LAN host 10.x.y.z (from `i`) port 40000 to remote
/// 100.64.0.0/10 + `i` port 443, masqueraded to the WAN address port
/// 40000. Addresses nobody sends from, so no live packet hits them.
fn filler(i: u32, now_ns: u64) -> [(FlowKey, FlowEntry); 2] {
    let [_, b, c, d] = i.to_be_bytes();
    let lan = [10, b, c, d];
    let remote = [100, 64 | (b & 63), c, d];
    let wan = ROUTER_WAN_ADDR.octets();
    let (lan_port, remote_port, nat_port) = (40_000, 443, 40_000);
    let out = FlowKey::new(lan, remote, lan_port, remote_port, IPPROTO_TCP);
    let back = FlowKey::new(remote, wan, remote_port, nat_port, IPPROTO_TCP);
    let entry = |peer: FlowKey, (src, dst): ([u8; 4], [u8; 4]), (sp, dp), flags| FlowEntry {
        peer,
        new_src_addr: src,
        new_dst_addr: dst,
        new_src_port: sp,
        new_dst_port: dp,
        state: FlowState::TcpEstablished as u8,
        flags,
        last_seen_ns: now_ns,
        created_ns: now_ns,
        ..FlowEntry::default()
    };
    [
        (
            out,
            entry(back, (wan, remote), (nat_port, remote_port), FLAG_ORIGINAL),
        ),
        (back, entry(out, (remote, lan), (remote_port, lan_port), 0)),
    ]
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC always exists (the
    // clock of bpf_ktime_get_coarse_ns, which stamps the data path's flows).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// Filler flows written per `BPF_MAP_UPDATE_BATCH` call.
const FILL_BATCH: u32 = 32_768;

/// Writes `n` filler flows into the router's pinned CONNTRACK map, in
/// batches (one syscall per [`FILL_BATCH`] flows: a million single
/// updates take seconds of syscall overhead per row and repetition).
fn fill(t: &Topology, n: u32) -> Result<(), String> {
    let path = Path::new(PIN_ROOT)
        .join(t.ns_name(Ns::Router))
        .join(CONNTRACK_MAP);
    let data = MapData::from_pin(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let now = monotonic_ns();
    let mut keys = Vec::with_capacity(2 * FILL_BATCH as usize);
    let mut values = Vec::with_capacity(2 * FILL_BATCH as usize);
    let mut start = 0;
    while start < n {
        let end = n.min(start + FILL_BATCH);
        keys.clear();
        values.clear();
        for i in start..end {
            for (k, v) in filler(i, now) {
                keys.push(k);
                values.push(v);
            }
        }
        match update_batch(&data, &keys, &values) {
            Ok(()) => {}
            // A kernel without batch updates for this map: one at a time.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && start == 0 => {
                return fill_one_by_one(data, &path, n, now);
            }
            Err(e) => {
                return Err(format!(
                    "{}: writing filler flows {start}..{end} of {n}: {e}",
                    path.display()
                ));
            }
        }
        start = end;
    }
    Ok(())
}

/// `BPF_MAP_UPDATE_BATCH` of `keys[i] -> values[i]` (flags `BPF_ANY`).
fn update_batch(map: &MapData, keys: &[FlowKey], values: &[FlowEntry]) -> std::io::Result<()> {
    /// The batch part of `union bpf_attr`.
    #[repr(C)]
    struct BatchAttr {
        in_batch: u64,
        out_batch: u64,
        keys: u64,
        values: u64,
        count: u32,
        map_fd: u32,
        elem_flags: u64,
        flags: u64,
    }
    const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
    let count = u32::try_from(keys.len()).map_err(std::io::Error::other)?;
    let mut attr = BatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count,
        map_fd: u32::try_from(map.fd().as_fd().as_raw_fd()).map_err(std::io::Error::other)?,
        elem_flags: 0,
        flags: 0,
    };
    // SAFETY: attr is a valid bpf_attr prefix for this command; keys and
    // values hold `count` elements of the map's key and value size and
    // outlive the call; the kernel writes back only `count`.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            &raw mut attr,
            std::mem::size_of::<BatchAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if attr.count != count {
        return Err(std::io::Error::other(format!(
            "the kernel wrote {} of {count} entries",
            attr.count
        )));
    }
    Ok(())
}

fn fill_one_by_one(data: MapData, path: &Path, n: u32, now: u64) -> Result<(), String> {
    let mut map: HashMap<MapData, FlowKey, FlowEntry> =
        HashMap::try_from(aya::maps::Map::LruHashMap(data))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    for i in 0..n {
        for (k, v) in filler(i, now) {
            map.insert(k, v, 0)
                .map_err(|e| format!("writing filler flow {i} of {n}: {e}"))?;
        }
    }
    Ok(())
}

/// The table sizes and live flows of the rows: the small table; in a
/// `full` run the large one with the small one's live flows and a table
/// of nothing but the spread's live flows (what that working set costs
/// without the large table); the large one with a tenth of it live, at
/// most what the generator varies (its source ports: 45,536 of
/// 1,000,000).
fn rows_of(big: u32, full: bool) -> Vec<(u32, u32)> {
    let spread = (big / 10).min(live::max_flows());
    let mut sizes = vec![(SMALL_TABLE, SMALL_TABLE)];
    if full {
        sizes.push((big, SMALL_TABLE));
        sizes.push((spread, spread));
    }
    sizes.push((big, spread));
    sizes
}

/// The order of the rows in repetition `rep`: as listed in even ones,
/// reversed in odd ones, so no row always runs first (or last).
fn order(sizes: &[(u32, u32)], rep: u32) -> Vec<(u32, u32)> {
    let mut v = sizes.to_vec();
    if rep % 2 == 1 {
        v.reverse();
    }
    v
}

/// `reps` repetitions of the rows of [`rows_of`] (`full`: all four, else
/// the small table and the spread), through the XDP path, alternating
/// order (see [`order`]); the map's capacity is 1.5x `big` for every row
/// (an LRU map evicts before it is quite full). Every row starts from a
/// fresh map. The router is left re-attachable at the default capacity.
pub fn run(
    t: &Topology,
    router: &mut Router<'_>,
    s: &Settings,
    (big, full, reps): (u32, bool, u32),
    stop: &AtomicBool,
) -> Result<Vec<Row>, String> {
    let capacity = big.max(SMALL_TABLE) / 2 * 3;
    let sizes = rows_of(big, full);
    let mut rows = Vec::new();
    let outcome = (|| {
        for rep in 0..reps {
            for (table_flows, live_flows) in order(&sizes, rep) {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                // A fresh, empty table of that capacity.
                router.set_max_flows(Some(capacity));
                router.switch(DataPath::Xdp, Offload::Off)?;
                let t0 = Instant::now();
                fill(t, table_flows - live_flows)?;
                let fill_s = t0.elapsed().as_secs_f64();
                eprintln!(
                    "[flows] repetition {}/{reps}: table of {table_flows} flows ({} written in \
                     {fill_s:.1} s), live traffic over {live_flows}",
                    rep + 1,
                    table_flows - live_flows
                );
                let point = Point {
                    workload: Workload::UdpLive,
                    conns: live_flows,
                    offload: Offload::Off,
                    nodelay: false,
                };
                let run = live::run(t, s, DataPath::Xdp, point, stop)?;
                eprintln!("        {}", crate::run::show(&run));
                rows.push(Row {
                    table_flows,
                    live_flows,
                    rep,
                    fill_s,
                    run,
                });
            }
        }
        Ok(())
    })();
    router.set_max_flows(None);
    outcome.map(|()| rows)
}

/// One row over its repetitions.
pub struct Summary {
    pub table_flows: u32,
    pub live_flows: u32,
    pub reps: usize,
    pub pps_median: f64,
    pub pps_min: f64,
    pub pps_max: f64,
    pub ns_per_pkt_median: f64,
    pub cpu_pct_median: f64,
    pub softirq_pct_median: f64,
    pub fill_s_median: f64,
}

/// The median of `v` (the mean of the middle two for an even count); NaN
/// when empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        f64::midpoint(v[n / 2 - 1], v[n / 2])
    }
}

/// Each row (table size, live flows) over its repetitions, by table size
/// and then live flows.
pub fn summarise(rows: &[Row]) -> Vec<Summary> {
    let mut keys: Vec<(u32, u32)> = Vec::new();
    for r in rows {
        if !keys.contains(&(r.table_flows, r.live_flows)) {
            keys.push((r.table_flows, r.live_flows));
        }
    }
    keys.sort_by_key(|&(table, live)| (table, live));
    keys.into_iter()
        .map(|(table_flows, live_flows)| {
            let of = |get: fn(&Row) -> f64| -> Vec<f64> {
                rows.iter()
                    .filter(|r| (r.table_flows, r.live_flows) == (table_flows, live_flows))
                    .map(get)
                    .collect()
            };
            let pps = of(|r| r.run.pps);
            Summary {
                table_flows,
                live_flows,
                reps: pps.len(),
                pps_min: pps.iter().copied().fold(f64::INFINITY, f64::min),
                pps_max: pps.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                pps_median: median(pps),
                ns_per_pkt_median: median(of(|r| r.run.router_ns_per_pkt)),
                cpu_pct_median: median(of(|r| r.run.cpu_pct)),
                softirq_pct_median: median(of(|r| r.run.softirq_pct)),
                fill_s_median: median(of(|r| r.fill_s)),
            }
        })
        .collect()
}

/// The ratio of the row (`table_flows`, `live_flows`) to the small table's
/// in every repetition that has both (with a non-zero small row), in
/// repetition order: rows of one repetition ran next to each other, so a
/// slow drift of the machine's load cancels out of its ratio.
pub fn ratios(rows: &[Row], key: (u32, u32)) -> Vec<f64> {
    let points: Vec<_> = rows
        .iter()
        .map(|r| (r.rep, (r.table_flows, r.live_flows), r.run.pps))
        .collect();
    ratios_of(&points, key)
}

/// [`ratios`] over (repetition, (table flows, live flows), pps).
fn ratios_of(points: &[(u32, (u32, u32), f64)], key: (u32, u32)) -> Vec<f64> {
    let reps = points.iter().map(|p| p.0 + 1).max().unwrap_or(0);
    (0..reps)
        .filter_map(|rep| {
            let pps = |k| points.iter().find(|p| p.0 == rep && p.1 == k).map(|p| p.2);
            let small = pps((SMALL_TABLE, SMALL_TABLE)).filter(|&p| p > 0.0)?;
            Some(pps(key)? / small)
        })
        .collect()
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn filler_flows_are_distinct_and_paired() {
        let mut keys = std::collections::HashSet::new();
        for i in [0, 1, 255, 65_536, 999_999] {
            let [(ok, ov), (bk, bv)] = filler(i, 1);
            assert!(keys.insert(ok) && keys.insert(bk), "flow {i} collides");
            assert_eq!((ov.peer, bv.peer), (bk, ok));
            assert_eq!(ov.new_src_addr, ROUTER_WAN_ADDR.octets());
            assert_eq!(ok.src_addr[0], 10);
        }
    }

    #[test]
    fn repetitions_alternate_the_order_of_the_rows() {
        let sizes = rows_of(1_000_000, true);
        assert_eq!(sizes.len(), 4);
        assert_eq!(sizes[0], (SMALL_TABLE, SMALL_TABLE));
        let spread = 100_000.min(live::max_flows());
        assert!(sizes.contains(&(spread, spread)));
        assert_eq!(sizes[3], (1_000_000, spread));
        assert_eq!(order(&sizes, 0), sizes);
        let mut back = sizes.clone();
        back.reverse();
        assert_eq!(order(&sizes, 1), back);
        assert_eq!(order(&sizes, 2), sizes);
        assert_eq!(
            rows_of(1_000_000, false),
            vec![(SMALL_TABLE, SMALL_TABLE), (1_000_000, spread)]
        );
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert!((median(vec![3.0, 1.0, 2.0]) - 2.0).abs() < 1e-12);
        assert!((median(vec![4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < 1e-12);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn ratios_pair_rows_of_the_same_repetition() {
        let big = (1_000_000, 45_536);
        let small = (SMALL_TABLE, SMALL_TABLE);
        let points = [
            (0, small, 2.0),
            (0, big, 1.0),
            (1, big, 3.0),
            (1, small, 4.0),
            // A repetition cut short: no small row, no ratio.
            (2, big, 9.0),
        ];
        assert_eq!(ratios_of(&points, big), vec![0.5, 0.75]);
        assert!(ratios_of(&[(0, small, 0.0), (0, big, 1.0)], big).is_empty());
    }
}
