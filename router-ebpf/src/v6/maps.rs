//! The IPv6 maps: the flow table and the pinholes.

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    macros::map,
    maps::{HashMap, LruHashMap},
};
use router_common::maps::{
    Counter, DEFAULT_MAX_FLOWS6, FlowEntry6, FlowKey6, MAX_PINHOLES6, PinholeKey6,
};

use crate::maps::{EEXIST, event};

/// Two entries per IPv6 flow.
#[map(name = "CONNTRACK6")]
pub static CONNTRACK6: LruHashMap<FlowKey6, FlowEntry6> =
    LruHashMap::with_max_entries(2 * DEFAULT_MAX_FLOWS6, 0);

/// LAN addresses and ports the WAN may open flows to (value 1).
#[map(name = "PINHOLES6")]
pub static PINHOLES6: HashMap<PinholeKey6, u8> = HashMap::with_max_entries(MAX_PINHOLES6, 0);

/// Whether a pinhole lets the WAN open a flow of `proto` to `addr`/`port`.
#[inline(always)]
pub fn pinhole(addr: [u8; 16], proto: u8, port: u16) -> bool {
    let k = PinholeKey6 {
        addr,
        port,
        proto,
        pad: 0,
    };
    // SAFETY: only tested for presence.
    unsafe { PINHOLES6.get(&k) }.is_some()
}

/// Inserts `k -> v`, counting a new key (an existing, stale entry of the
/// same tuple is overwritten uncounted).
#[inline(always)]
pub fn insert_counted(k: &FlowKey6, v: &FlowEntry6) -> bool {
    match CONNTRACK6.insert(k, v, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            event(Counter::Ct6EntriesInserted);
            true
        }
        Err(EEXIST) => CONNTRACK6.insert(k, v, u64::from(BPF_ANY)).is_ok(),
        Err(_) => false,
    }
}
