//! Flows: the live generator through the XDP path with a small and with a
//! large flow table. The large one is pre-filled with established TCP
//! flows written straight into the pinned CONNTRACK map (both entries of
//! each flow, as the data path writes them), the capacity raised with
//! `attach --max-flows`; the same capacity for both sizes, so only the
//! number of flows differs. The live traffic's flows (the generator's
//! source ports) are admitted by the data path itself: 1000 flows in the
//! small table; in the large one first the same 1000 (the table's size
//! alone), then a tenth of the table up to the generator's maximum
//! (traffic spread over many flows).

use std::path::Path;
use std::sync::atomic::AtomicBool;
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

/// One run: the table's size, the flows the traffic spread over, the run.
pub struct Row {
    pub table_flows: u32,
    pub live_flows: u32,
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

/// Writes `n` filler flows into the router's pinned CONNTRACK map.
fn fill(t: &Topology, n: u32) -> Result<(), String> {
    let path = Path::new(PIN_ROOT)
        .join(t.ns_name(Ns::Router))
        .join(CONNTRACK_MAP);
    let data = MapData::from_pin(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut map: HashMap<MapData, FlowKey, FlowEntry> =
        HashMap::try_from(aya::maps::Map::LruHashMap(data))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    let now = monotonic_ns();
    for i in 0..n {
        for (k, v) in filler(i, now) {
            map.insert(k, v, 0)
                .map_err(|e| format!("writing filler flow {i} of {n}: {e}"))?;
        }
    }
    Ok(())
}

/// The small table, then two runs with one of `big` flows (1000 live
/// flows, then as many as the generator varies), through the XDP path; the
/// map's capacity is 1.5x `big` for both (an LRU map evicts before it is
/// quite full). The router is left re-attachable at the default capacity.
/// `same_live`: include the large table with the small one's live flows.
pub fn run(
    t: &Topology,
    router: &mut Router<'_>,
    s: &Settings,
    (big, same_live): (u32, bool),
    stop: &AtomicBool,
) -> Result<Vec<Row>, String> {
    let capacity = big.max(SMALL_TABLE) / 2 * 3;
    let mut rows = Vec::new();
    let mut sizes = vec![(SMALL_TABLE, SMALL_TABLE)];
    if same_live {
        sizes.push((big, SMALL_TABLE));
    }
    // Spread: a tenth of the table, at most what the generator varies (its
    // source ports): 45,536 of 1,000,000.
    sizes.push((big, (big / 10).min(live::max_flows())));
    let res = (|| {
        for (table_flows, live_flows) in sizes {
            // A fresh, empty table of that capacity.
            router.set_max_flows(Some(capacity));
            router.switch(DataPath::Xdp, Offload::Off)?;
            let t0 = Instant::now();
            fill(t, table_flows - live_flows)?;
            let fill_s = t0.elapsed().as_secs_f64();
            eprintln!(
                "[flows] table of {table_flows} flows ({} written in {fill_s:.1} s), live \
                 traffic over {live_flows}",
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
                fill_s,
                run,
            });
        }
        Ok(())
    })();
    router.set_max_flows(None);
    res.map(|()| rows)
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
}
