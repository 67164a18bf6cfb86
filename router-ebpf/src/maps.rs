//! The program's maps, and the counted operations on them: per-reason
//! counters, conntrack inserts and removals that keep the insert/remove
//! counters honest (so `router-ctl stats` can estimate LRU evictions).

use aya_ebpf::{
    macros::map,
    maps::{Array, DevMapHash, HashMap, LruHashMap, PerCpuArray},
};
use router_common::{
    flow::expired,
    maps::{
        Config, Counter, CounterValue, DEFAULT_MAX_FLOWS, EgressKey, EgressSeen, FlowEntry,
        FlowKey, FragmentKey, FragmentXlat, MAX_EGRESS_SEEN, MAX_FRAGMENTED_DATAGRAMS,
        MAX_KERNEL_FLOWS, MAX_NEXT_HOPS, MAX_PORT_FORWARDS, MAX_ROUTE_MARKS, MAX_VIRTUAL_MACS,
        NextHopKey, PortForwardKey, PortForwardTarget, VirtualMacKey,
    },
};

#[map(name = "COUNTERS")]
pub static COUNTERS: PerCpuArray<CounterValue> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

/// The interfaces the program may redirect to (both attached ones).
#[map(name = "DEVICES")]
pub static DEVICES: DevMapHash = DevMapHash::with_max_entries(16, 0);

#[map(name = "CONFIG")]
pub static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// Two entries per flow; the controller resizes it at load time.
#[map(name = "CONNTRACK")]
pub static CONNTRACK: LruHashMap<FlowKey, FlowEntry> =
    LruHashMap::with_max_entries(2 * DEFAULT_MAX_FLOWS, 0);

#[map(name = "PORT_FORWARDS")]
pub static PORT_FORWARDS: HashMap<PortForwardKey, PortForwardTarget> =
    HashMap::with_max_entries(MAX_PORT_FORWARDS, 0);

/// VRRP virtual MACs accepted besides the interfaces' own (see
/// `router_common::maps::VIRTUAL_MACS_MAP`).
#[map(name = "VIRTUAL_MACS")]
pub static VIRTUAL_MACS: HashMap<VirtualMacKey, u8> =
    HashMap::with_max_entries(MAX_VIRTUAL_MACS, 0);

/// The translation of fragmented datagrams, for their later fragments
/// (see `router_common::maps::FRAGMENTS_MAP`).
#[map(name = "FRAGMENTS")]
pub static FRAGMENTS: LruHashMap<FragmentKey, FragmentXlat> =
    LruHashMap::with_max_entries(MAX_FRAGMENTED_DATAGRAMS, 0);

/// The LAN flows left to the kernel's slow-path NAT (see
/// `router_common::maps::KERNEL_FLOWS_MAP`): key as the packet arrives,
/// value the time of its last LAN packet.
#[map(name = "KERNEL_FLOWS")]
pub static KERNEL_FLOWS: LruHashMap<FlowKey, u64> =
    LruHashMap::with_max_entries(MAX_KERNEL_FLOWS, 0);

/// The marks offloaded flows are routed by, by slot (see
/// `router_common::maps::ROUTE_MARKS_MAP`).
#[map(name = "ROUTE_MARKS")]
pub static ROUTE_MARKS: Array<u32> = Array::with_max_entries(MAX_ROUTE_MARKS, 0);

/// The neighbours in use and when (see
/// `router_common::maps::NEXT_HOPS_MAP`).
#[map(name = "NEXT_HOPS")]
pub static NEXT_HOPS: LruHashMap<NextHopKey, u64> = LruHashMap::with_max_entries(MAX_NEXT_HOPS, 0);

/// How the kernel sent connections' packets out of the attached
/// interfaces (see `router_common::maps::EGRESS_SEEN_MAP`); written by the
/// tc egress program the offload daemon attaches, not by the XDP program.
#[map(name = "EGRESS_SEEN")]
pub static EGRESS_SEEN: LruHashMap<EgressKey, EgressSeen> =
    LruHashMap::with_max_entries(MAX_EGRESS_SEEN, 0);

/// `-EEXIST` from a `BPF_NOEXIST` update: the key is taken.
pub const EEXIST: i32 = -17;

/// Adds a packet of `bytes` to `counter` (this CPU's slot).
#[inline(always)]
pub fn count(counter: Counter, bytes: u64) {
    if let Some(c) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, no other writer on this CPU.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += bytes;
        }
    }
}

/// Counts an event (a counter without bytes).
#[inline(always)]
pub fn event(counter: Counter) {
    count(counter, 0);
}

/// The port-forward rule for `proto` and WAN port `port`, if any.
#[inline(always)]
pub fn port_forward(proto: u8, port: u16) -> Option<PortForwardTarget> {
    let rule = PortForwardKey {
        proto,
        pad: 0,
        port,
    };
    // SAFETY: hash map value, copied out at once.
    unsafe { PORT_FORWARDS.get(&rule) }.copied()
}

/// Removes `k`, counting it if it was there.
#[inline(always)]
pub fn remove_counted(k: &FlowKey) {
    if CONNTRACK.remove(k).is_ok() {
        event(Counter::CtEntriesRemoved);
    }
}

/// Whether the entry at `k` may be reclaimed: idle past its timeout, or
/// its other half is gone (evicted), so no packet can use it any more.
#[inline(always)]
pub fn stale(cfg: &Config, k: &FlowKey, now: u64) -> bool {
    // SAFETY: map value reference, valid for this run; only the fields
    // needed are read (a copy of the whole entry would sit on the stack
    // of the admission's call chain, which must stay within 512 bytes).
    let Some(e) = (unsafe { CONNTRACK.get(k) }) else {
        return false;
    };
    if expired(e.state, e.last_seen_ns, now, &cfg.timeouts) {
        return true;
    }
    let peer = e.peer;
    // SAFETY: only tested for presence.
    match unsafe { CONNTRACK.get(&peer) } {
        None => true,
        Some(p) => p.peer != *k,
    }
}
