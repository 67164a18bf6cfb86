//! The IPv6 maps: the flow table and the pinholes.

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    macros::map,
    maps::{HashMap, LruHashMap},
};
use router_common::{
    flow::expired,
    maps::{
        Counter, DEFAULT_MAX_FLOWS6, FlowEntry6, FlowKey6, MAX_PINHOLES6, PinholeKey6, Timeouts,
    },
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

/// Whether `key` is a live WAN-side entry's: a packet with this tuple
/// belongs to a known flow as it comes in from the WAN (an `ICMPv6`
/// error's quoted packet reversed, a first fragment's header). A flow
/// whose WAN-side entry the LRU evicted is known by its LAN-side one
/// (the other direction's key, which a hit would rebuild it from): `key`
/// is reversed in place to look for it (no second key on the stack).
#[inline(always)]
pub fn live_wan_entry(key: &mut FlowKey6, timeouts: &Timeouts, now: u64) -> bool {
    if live_on(key, false, timeouts, now) {
        return true;
    }
    core::mem::swap(&mut key.src_addr, &mut key.dst_addr);
    core::mem::swap(&mut key.src_port, &mut key.dst_port);
    live_on(key, true, timeouts, now)
}

/// Whether `key` has a live entry of the side `lan_side` (only a WAN-side
/// entry describes a packet that went to the WAN).
#[inline(always)]
fn live_on(key: &FlowKey6, lan_side: bool, timeouts: &Timeouts, now: u64) -> bool {
    match CONNTRACK6.get_ptr(key) {
        // SAFETY: map value pointer, valid for this run; only read.
        Some(e) => unsafe {
            (*e).lan_side() == lan_side && !expired((*e).state, (*e).last_seen_ns, now, timeouts)
        },
        None => false,
    }
}

/// How claiming a tuple for a new flow's first entry went.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    Done,
    /// A live entry holds the tuple: it keeps it.
    Taken,
    /// The map refused the insert.
    Failed,
}

/// Inserts `k -> v` with `BPF_NOEXIST`, the cross-CPU lock on the tuple
/// (as IPv4's `insert_pair`), counting a new key. An entry of the tuple
/// idle past its state's timeout is replaced (`flow_expired_replaced`); a
/// live one is `Claim::Taken`, also when its other half was evicted: IPv6
/// rebuilds that half from this one (`flow::sync_peer`), so unlike IPv4's
/// orphaned reply entry it is still its flow's.
#[inline(always)]
pub fn claim(k: &FlowKey6, v: &FlowEntry6, timeouts: &Timeouts, now: u64) -> Claim {
    match CONNTRACK6.insert(k, v, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            event(Counter::Ct6EntriesInserted);
            return Claim::Done;
        }
        Err(EEXIST) => {}
        Err(_) => return Claim::Failed,
    }
    // SAFETY: map value reference, valid for this run; only the two
    // fields needed are read (no copy of the entry on the stack).
    if let Some(e) = unsafe { CONNTRACK6.get(k) }
        && !expired(e.state, e.last_seen_ns, now, timeouts)
    {
        return Claim::Taken;
    }
    let replaced = CONNTRACK6.remove(k).is_ok();
    match CONNTRACK6.insert(k, v, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            if replaced {
                event(Counter::FlowExpiredReplaced);
            } else {
                event(Counter::Ct6EntriesInserted);
            }
            Claim::Done
        }
        // Another CPU's new flow took it meanwhile.
        Err(EEXIST) => Claim::Taken,
        Err(_) => Claim::Failed,
    }
}

/// Inserts `k -> v`, counting a new key (an existing entry of the tuple,
/// one the lookup refused as expired or of the other side, is overwritten
/// uncounted).
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
