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
//! A control runs the same rows (but the large table with small traffic)
//! on the "lookup" path: the limit's forwarder plus one lookup of each
//! packet's 5-tuple in a kernel LRU hash of the router's key size, value
//! size and capacity, and one add into the entry it hits
//! ([`DataPath::Lookup`]). Its table holds the same filler keys and the
//! live flows' keys (both directions, as the router's): what the kernel's
//! hash table alone costs at each working set, without the router.
//!
//! The rows are repeated (`reps`) and alternate: each repetition runs
//! every row once, in the opposite order of the one before, so a busy
//! neighbour or a drift of the machine's load hits every row alike; the
//! control's row runs right next to the xdp row of the same table in the
//! first repetitions (`Control::reps`). The report takes each row's median
//! and the goal the median of the repetitions' own ratios.

use std::os::fd::{AsFd as _, BorrowedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use aya::maps::{HashMap, MapData};
use router_common::maps::{
    CONNTRACK_MAP, FLAG_ORIGINAL, FlowEntry, FlowKey, FlowState, IPPROTO_TCP,
};
use tests::prog::now_ns;
use tests::rawbpf::{self, FlowTable, update_batch};
use tests::{Ns, PIN_ROOT, ROUTER_WAN_ADDR, Topology};

use crate::model::{DataPath, Offload, Point, RunResult, Settings, Workload};
use crate::router::Router;
use crate::workloads::live;

/// Flows of the small table (and its live traffic).
pub const SMALL_TABLE: u32 = 1000;

/// Repetitions of the rows in a full run (quick and smoke runs: one).
pub const FULL_REPS: u32 = 3;

/// The control's rows: in how many repetitions (the first ones; 0: none)
/// and its table's value size in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Control {
    pub reps: u32,
    pub value_size: u32,
}

/// One run: the path (xdp or the control), the table's size, the flows
/// the traffic spread over, the run.
pub struct Row {
    pub path: DataPath,
    pub table_flows: u32,
    pub live_flows: u32,
    /// The repetition (0-based) this run belongs to.
    pub rep: u32,
    /// Bytes per value of the table (the router's flow entry, or the
    /// control's `Control::value_size`).
    pub value_bytes: u32,
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
    let now = now_ns();
    match write_fillers(data.fd().as_fd(), n, now, |e| e) {
        Ok(()) => Ok(()),
        // A kernel without batch updates for this map: one at a time.
        Err((0, _, e)) if e.raw_os_error() == Some(libc::EINVAL) => {
            fill_one_by_one(data, &path, n, now)
        }
        Err((start, end, e)) => Err(format!(
            "{}: writing filler flows {start}..{end} of {n}: {e}",
            path.display()
        )),
    }
}

/// Writes the filler flows `0..n` into `map`, [`FILL_BATCH`] flows per
/// `BPF_MAP_UPDATE_BATCH`, `value` making each entry the map's value; an
/// error names the batch's flows.
fn write_fillers<V: Copy>(
    map: BorrowedFd<'_>,
    n: u32,
    now: u64,
    value: impl Fn(FlowEntry) -> V,
) -> Result<(), (u32, u32, std::io::Error)> {
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
                values.push(value(v));
            }
        }
        update_batch(map, &keys, &values).map_err(|e| (start, end, e))?;
        start = end;
    }
    Ok(())
}

/// The first `value_size` bytes of `e` (zeros past its end): the value of
/// the control's table, which may be smaller or larger than the router's.
fn entry_bytes<const N: usize>(e: &FlowEntry) -> [u8; N] {
    let bytes = rawbpf::pod_bytes(e);
    let mut out = [0u8; N];
    let n = N.min(bytes.len());
    out[..n].copy_from_slice(&bytes[..n]);
    out
}

/// Fills the control's table as the router's: `n` filler flows, then both
/// directions of the first `live` flows of the generator (values zero),
/// which the router admits itself; in batches as [`fill`].
fn fill_control(table: &FlowTable, n: u32, live: u32) -> Result<(), String> {
    let now = now_ns();
    let fd = table.as_fd();
    let written = match table.value_size() {
        CONTROL_VALUE_FULL => write_control(fd, n, live, now, |e| entry_bytes::<96>(&e)),
        CONTROL_VALUE_SMALL => write_control(fd, n, live, now, |e| entry_bytes::<64>(&e)),
        other => {
            return Err(format!(
                "the control's table has {other}-byte values; it is filled with \
                 {CONTROL_VALUE_FULL} or {CONTROL_VALUE_SMALL}"
            ));
        }
    };
    written.map_err(|(start, end, e)| {
        format!("the control's table: writing flows {start}..{end} of {n} (+{live} live): {e}")
    })
}

/// How often the control counted a hit on the first `live` flows of the
/// generator (the sum of their entries' counts).
fn live_hits(table: &FlowTable, live: u32) -> u64 {
    live::flow_keys(live)
        .iter()
        .filter_map(|k| table.packets(k))
        .sum()
}

/// The control must have found the live flows in its table for about every
/// packet it forwarded (a few go before and after the measured window, and
/// an LRU may evict a live entry under pressure): if under half, it looked
/// up something else and its figures say nothing of the table.
fn check_hits(hits: u64, run: &RunResult) -> Result<(), String> {
    if hits.saturating_mul(2) < run.router_pkts {
        return Err(format!(
            "the flows control hit its live flows {hits} times for {} forwarded packets: \
             its keys do not match the generator's (see tests::rawbpf::flow_lookup_forwarder)",
            run.router_pkts
        ));
    }
    Ok(())
}

/// The router's value size, and the smaller one the control can try
/// (`--flows-control-value`): one cache line per value.
pub const CONTROL_VALUE_FULL: u32 = 96;
pub const CONTROL_VALUE_SMALL: u32 = 64;
const _: () = assert!(size_of::<FlowEntry>() == CONTROL_VALUE_FULL as usize);

fn write_control<const N: usize>(
    fd: BorrowedFd<'_>,
    n: u32,
    live: u32,
    now: u64,
    value: impl Fn(FlowEntry) -> [u8; N],
) -> Result<(), (u32, u32, std::io::Error)> {
    write_fillers(fd, n, now, value)?;
    let keys: Vec<FlowKey> = live::flow_keys(live)
        .into_iter()
        .flat_map(|k| [k, k.reversed()])
        .collect();
    for (i, chunk) in keys.chunks(2 * FILL_BATCH as usize).enumerate() {
        let zero = vec![[0u8; N]; chunk.len()];
        update_batch(fd, chunk, &zero).map_err(|e| {
            let at = u32::try_from(i)
                .unwrap_or(u32::MAX)
                .saturating_mul(FILL_BATCH);
            (n + at, n + live.min(at + FILL_BATCH), e)
        })?;
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

/// Whether the control runs the row (`table_flows`, `live_flows`): every
/// row but the large table with the small table's live flows (the
/// table's size alone, which the xdp rows show is not what costs).
fn has_control(table_flows: u32, live_flows: u32) -> bool {
    table_flows == SMALL_TABLE || live_flows != SMALL_TABLE
}

/// The runs of repetition `rep`, (path, table flows, live flows): the
/// rows as listed, each xdp row followed by the control's of the same
/// table when `control`; reversed in odd repetitions, so no run always
/// comes first (or last).
fn order(sizes: &[(u32, u32)], rep: u32, control: bool) -> Vec<(DataPath, u32, u32)> {
    let mut v = Vec::new();
    for &(table, live) in sizes {
        v.push((DataPath::Xdp, table, live));
        if control && has_control(table, live) {
            v.push((DataPath::Lookup, table, live));
        }
    }
    if rep % 2 == 1 {
        v.reverse();
    }
    v
}

/// `reps` repetitions of the rows of [`rows_of`] (`full`: all four, else
/// the small table and the spread), through the XDP path, and the
/// control's rows in the first `control.reps` of them, alternating order
/// (see [`order`]); the tables' capacity is 1.5x `big` flows for every row
/// (an LRU map evicts before it is quite full). Every row starts from a
/// fresh table. The router is left re-attachable at the default capacity.
pub fn run(
    t: &Topology,
    router: &mut Router<'_>,
    s: &Settings,
    (big, full, reps): (u32, bool, u32),
    control: Control,
    stop: &AtomicBool,
) -> Result<Vec<Row>, String> {
    let capacity = big.max(SMALL_TABLE) / 2 * 3;
    let sizes = rows_of(big, full);
    let mut rows = Vec::new();
    router.set_lookup_value_size(control.value_size);
    let outcome = (|| {
        for rep in 0..reps {
            for (path, table_flows, live_flows) in order(&sizes, rep, rep < control.reps) {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                // A fresh, empty table of that capacity.
                router.set_max_flows(Some(capacity));
                router.switch(path, Offload::Off)?;
                let t0 = Instant::now();
                let fillers = table_flows - live_flows;
                match router.lookup_table() {
                    Some(table) => fill_control(table, fillers, live_flows)?,
                    None => fill(t, fillers)?,
                }
                let fill_s = t0.elapsed().as_secs_f64();
                eprintln!(
                    "[flows] repetition {}/{reps}, {}: table of {table_flows} flows ({fillers} \
                     written in {fill_s:.1} s), live traffic over {live_flows}",
                    rep + 1,
                    path.name(),
                );
                let point = Point::new(Workload::UdpLive, live_flows, Offload::Off);
                let mut run = live::run(t, s, path, point, stop)?;
                if let Some(table) = router.lookup_table() {
                    let hits = live_hits(table, live_flows);
                    check_hits(hits, &run)?;
                    run.notes.push(format!(
                        "the control's lookups hit the live flows {hits} times"
                    ));
                }
                eprintln!("        {}", crate::run::show(&run));
                rows.push(Row {
                    path,
                    table_flows,
                    live_flows,
                    rep,
                    value_bytes: match path {
                        DataPath::Lookup => control.value_size,
                        _ => CONTROL_VALUE_FULL,
                    },
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
    pub path: DataPath,
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

/// A row's identity: path, table flows, live flows.
pub type RowKey = (DataPath, u32, u32);

fn key_of(r: &Row) -> RowKey {
    (r.path, r.table_flows, r.live_flows)
}

/// Each row (path, table size, live flows) over its repetitions: the xdp
/// rows, then the control's, each by table size and then live flows.
pub fn summarise(rows: &[Row]) -> Vec<Summary> {
    let mut keys: Vec<RowKey> = Vec::new();
    for r in rows {
        if !keys.contains(&key_of(r)) {
            keys.push(key_of(r));
        }
    }
    keys.sort_by_key(|&(path, table, live)| (path != DataPath::Xdp, table, live));
    keys.into_iter()
        .map(|key| {
            let of = |get: fn(&Row) -> f64| -> Vec<f64> {
                rows.iter().filter(|r| key_of(r) == key).map(get).collect()
            };
            let pps = of(|r| r.run.pps);
            let (path, table_flows, live_flows) = key;
            Summary {
                path,
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

/// The ratio of the row `key` to the small table's on the same path in
/// every repetition that has both (with a non-zero small row), in
/// repetition order: rows of one repetition ran next to each other, so a
/// slow drift of the machine's load cancels out of its ratio.
pub fn ratios(rows: &[Row], key: RowKey) -> Vec<f64> {
    let points: Vec<_> = rows.iter().map(|r| (r.rep, key_of(r), r.run.pps)).collect();
    ratios_of(&points, key)
}

/// [`ratios`] over (repetition, row, pps).
fn ratios_of(points: &[(u32, RowKey, f64)], key: RowKey) -> Vec<f64> {
    let reps = points.iter().map(|p| p.0 + 1).max().unwrap_or(0);
    let small = (key.0, SMALL_TABLE, SMALL_TABLE);
    (0..reps)
        .filter_map(|rep| {
            let pps = |k| points.iter().find(|p| p.0 == rep && p.1 == k).map(|p| p.2);
            let small = pps(small).filter(|&p| p > 0.0)?;
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
        let xdp: Vec<_> = sizes.iter().map(|&(t, l)| (DataPath::Xdp, t, l)).collect();
        assert_eq!(order(&sizes, 0, false), xdp);
        let mut back = xdp.clone();
        back.reverse();
        assert_eq!(order(&sizes, 1, false), back);
        assert_eq!(order(&sizes, 2, false), xdp);
        assert_eq!(
            rows_of(1_000_000, false),
            vec![(SMALL_TABLE, SMALL_TABLE), (1_000_000, spread)]
        );
    }

    #[test]
    fn the_control_runs_next_to_the_xdp_row_of_its_table() {
        let spread = 100_000.min(live::max_flows());
        let sizes = rows_of(1_000_000, true);
        let (x, l) = (DataPath::Xdp, DataPath::Lookup);
        let with = [
            (x, SMALL_TABLE, SMALL_TABLE),
            (l, SMALL_TABLE, SMALL_TABLE),
            // The table's size alone: no control row.
            (x, 1_000_000, SMALL_TABLE),
            (x, spread, spread),
            (l, spread, spread),
            (x, 1_000_000, spread),
            (l, 1_000_000, spread),
        ];
        assert_eq!(order(&sizes, 0, true), with);
        let mut back = with.to_vec();
        back.reverse();
        assert_eq!(order(&sizes, 1, true), back);
        // Quick runs: both of their rows.
        let quick = order(&rows_of(1_000_000, false), 0, true);
        assert_eq!(quick.iter().filter(|r| r.0 == l).count(), 2);
    }

    #[test]
    fn control_values_are_the_flow_entry_cut_or_padded() {
        let [(_, e), _] = filler(7, 42);
        let full: [u8; 96] = entry_bytes(&e);
        let small: [u8; 64] = entry_bytes(&e);
        let larger: [u8; 100] = entry_bytes(&e);
        assert_eq!(full[..64], small);
        assert_eq!(full[..], larger[..96]);
        assert_eq!(larger[96..], [0; 4]);
        // The peer key comes first, as in FlowEntry.
        assert_eq!(full[..16], entry_bytes::<16>(&e));
        assert_ne!(full[..16], [0; 16]);
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert!((median(vec![3.0, 1.0, 2.0]) - 2.0).abs() < 1e-12);
        assert!((median(vec![4.0, 1.0, 2.0, 3.0]) - 2.5).abs() < 1e-12);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn ratios_pair_rows_of_the_same_repetition_and_path() {
        let x = DataPath::Xdp;
        let big = (x, 1_000_000, 45_536);
        let small = (x, SMALL_TABLE, SMALL_TABLE);
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
        // The control's rows compare with the control's small table.
        let l = DataPath::Lookup;
        let control = [
            (0, small, 2.0),
            (0, big, 1.0),
            (0, (l, SMALL_TABLE, SMALL_TABLE), 4.0),
            (0, (l, 1_000_000, 45_536), 3.0),
        ];
        assert_eq!(ratios_of(&control, (l, 1_000_000, 45_536)), vec![0.75]);
        assert_eq!(ratios_of(&control, big), vec![0.5]);
        assert!(ratios_of(&control[..2], (l, 1_000_000, 45_536)).is_empty());
    }

    #[test]
    fn a_control_that_misses_its_live_flows_is_an_error() {
        let point = Point::new(Workload::UdpLive, 1000, Offload::Off);
        let mut run = RunResult::blank(DataPath::Lookup, point);
        run.router_pkts = 1000;
        assert!(check_hits(990, &run).is_ok());
        assert!(check_hits(500, &run).is_ok());
        let e = check_hits(0, &run).unwrap_err();
        assert!(e.contains("hit its live flows 0 times for 1000"), "{e}");
    }
}
