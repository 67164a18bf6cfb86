//! Standalone mode's NAT mappings (the logic is in
//! `router_common::mapping`): claiming an external port for an internal
//! endpoint, finding its live mapping again (endpoint-independent
//! mapping), the filtering of new inbound flows, and the refresh of a
//! mapping by its flows (outbound, about once a second per flow, and at a
//! TCP state change). Only new flows, refreshes and state changes come
//! here, never a packet of an established flow between refreshes.

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST},
    macros::map,
    maps::{HashMap, LruHashMap},
};
use router_common::{
    mapping::{
        filter_admits, hairpin_opener_mapping, held_by, live, mapping_of, opened_inward,
        refresh_tick, refreshed_mapping,
    },
    maps::{
        Admit, Config, Counter, Endpoint, FLAG_HAIRPIN, FLAG_MAPPED, Filtering, FlowEntry, FlowKey,
        IPPROTO_UDP, MAX_NAT_ENDPOINTS, MAX_NAT_MAPPINGS, MAX_NAT_PERMITS, Mapping, MappingKey,
        PermitKey, Timeouts,
    },
};

use crate::{
    flow::Xlat,
    maps::{CONFIG, EEXIST, event},
};

/// External port -> internal endpoint; its `BPF_NOEXIST` insert is the
/// cross-CPU lock on a port (see `router_common::maps::NAT_MAPPINGS_MAP`).
#[map(name = "NAT_MAPPINGS")]
static NAT_MAPPINGS: HashMap<MappingKey, Mapping> = HashMap::with_max_entries(MAX_NAT_MAPPINGS, 0);

/// Internal endpoint -> its mapping's key.
#[map(name = "NAT_ENDPOINTS")]
static NAT_ENDPOINTS: LruHashMap<Endpoint, MappingKey> =
    LruHashMap::with_max_entries(MAX_NAT_ENDPOINTS, 0);

/// Address-dependent filtering: (mapping, remote address) -> the endpoint
/// that sent there.
#[map(name = "NAT_PERMITS")]
static NAT_PERMITS: LruHashMap<PermitKey, Endpoint> =
    LruHashMap::with_max_entries(MAX_NAT_PERMITS, 0);

#[inline(always)]
const fn mapping_key(proto: u8, port: u16) -> MappingKey {
    MappingKey {
        proto,
        pad: 0,
        port,
    }
}

/// The external port of `ep`'s live mapping, if it has one.
#[inline(always)]
pub fn current_port(ep: &Endpoint, now: u64) -> Option<u16> {
    // SAFETY: copied out at once.
    let mk = unsafe { NAT_ENDPOINTS.get(ep) }.copied()?;
    // SAFETY: only read here.
    let m = unsafe { NAT_MAPPINGS.get(&mk) }?;
    held_by(m, ep, now).then_some(mk.port)
}

/// Whether the UDP flow of entry `e` (hit through `key`), whose timer ran
/// out, lives on with its NAT mapping: the mapping is still live and its
/// endpoint's. RFC 4787 ties a mapping's filtering to the mapping's life
/// (REQ-5: at least 2 minutes after the last outbound packet, 5 here): the
/// remote the endpoint sent to may still answer after the flow's own 30 s
/// (unreplied) or 120 s (replied), as a peer's late answer to a hole punch
/// or a registrar's call between keep-alives does. A masqueraded flow
/// only (not hairpinned: both its entries face the LAN).
// A BPF subprogram of its own: the look-up's key and value stay off the
// entry point's frame; called only for an entry whose timer ran out.
// Standalone mode only: after a switch to offload mode the
// flows XDP admitted end with their own timers. Not a flow a remote opened
// towards the mapping (`opened_inward`): its admission was the filtering
// setting's, which may have changed since.
#[inline(never)]
pub fn keeps_udp_flow_alive(key: &FlowKey, e: &FlowEntry, now: u64) -> bool {
    // The mode read here, not passed: one more value live across the call
    // would grow the entry point's frame past the verifier's limit.
    let Some(cfg) = CONFIG.get(0) else {
        return false;
    };
    if cfg.admit != Admit::Xdp as u8
        || key.proto != IPPROTO_UDP
        || e.flags & (FLAG_MAPPED | FLAG_HAIRPIN) != FLAG_MAPPED
        || opened_inward(e.flags)
    {
        return false;
    }
    let (port, owner, _) = mapping_of(key, e);
    // SAFETY: only read here.
    unsafe { NAT_MAPPINGS.get(&mapping_key(IPPROTO_UDP, port)) }
        .is_some_and(|m| held_by(m, &owner, now))
}

/// Outcome of [`claim`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum MapClaim {
    /// The port was free (or its mapping expired): now `ep`'s.
    New,
    /// Already `ep`'s mapping (its `NAT_ENDPOINTS` entry was evicted).
    Held,
    /// A live mapping of another endpoint.
    Taken,
    /// The map refused.
    Failed,
}

/// Claims external `port` for `ep` until `expires_ns` at the latest, for
/// a new flow whose remote has the tag `tag`
/// ([`router_common::mapping::remote_tag`]): a new mapping, or one this
/// claim extends, records it as its setter (see [`refresh`]).
#[inline(always)]
pub fn claim(ep: &Endpoint, port: u16, expires_ns: u64, now: u64, tag: u8) -> MapClaim {
    let mk = mapping_key(ep.proto, port);
    let internal = Endpoint { pad: tag, ..*ep };
    let m = Mapping {
        internal,
        expires_ns,
    };
    match NAT_MAPPINGS.insert(&mk, &m, u64::from(BPF_NOEXIST)) {
        Ok(()) => MapClaim::New,
        Err(EEXIST) => {
            let Some(cur) = NAT_MAPPINGS.get_ptr_mut(&mk) else {
                return MapClaim::Taken;
            };
            // SAFETY: map value pointer, valid for this run.
            let cur = unsafe { &mut *cur };
            if cur.internal.bits() == ep.bits() {
                if cur.expires_ns < expires_ns {
                    cur.expires_ns = expires_ns;
                    cur.internal.pad = tag;
                }
                return MapClaim::Held;
            }
            if live(cur, now) {
                return MapClaim::Taken;
            }
            // Expired: taken over in place. Two CPUs taking over the same
            // port at once both write here and the last one keeps it; the
            // other's flow still works (its conntrack entries were claimed
            // with `BPF_NOEXIST`), it only lacks the mapping's inbound
            // filtering and reuse.
            cur.internal = internal;
            cur.expires_ns = expires_ns;
            event(Counter::MappingReclaimed);
            MapClaim::New
        }
        Err(_) => MapClaim::Failed,
    }
}

/// Gives back a port [`claim`] returned `New` for, when the flow could not
/// use it after all.
#[inline(always)]
pub fn release(ep: &Endpoint, port: u16) {
    if let Some(cur) = NAT_MAPPINGS.get_ptr_mut(&mapping_key(ep.proto, port)) {
        // SAFETY: map value pointer, valid for this run.
        let cur = unsafe { &mut *cur };
        if cur.internal.bits() == ep.bits() {
            cur.expires_ns = 0;
        }
    }
}

/// Records `port` as `ep`'s mapping, and for address-dependent filtering
/// the permission for `remote` (the address the new flow goes to).
#[inline(always)]
pub fn bind(ep: &Endpoint, port: u16, filtering: u8, remote: [u8; 4]) {
    let mk = mapping_key(ep.proto, port);
    let _ = NAT_ENDPOINTS.insert(ep, &mk, u64::from(BPF_ANY));
    if filtering == Filtering::AddressDependent as u8 {
        let pk = PermitKey {
            remote,
            port,
            proto: ep.proto,
            pad: 0,
        };
        let _ = NAT_PERMITS.insert(&pk, ep, u64::from(BPF_ANY));
    }
}

/// A new flow from the endpoint `sender` (its [`Endpoint::bits`]: a remote
/// host, or a LAN host for a hairpin, [`HAIRPIN`] set in `to`) to the WAN
/// address and the port in `to`'s low 16 bits with a live mapping, if the filtering setting lets it
/// in: sets `xlat`'s destination to the mapping's internal endpoint. The
/// remote of a hairpinned packet is the WAN address (the sender's own
/// mapping), and a mapping never hairpins to its own endpoint.
/// Address-and-port-dependent filtering (the default) lets nothing in and
/// costs no lookup. Scalars, not the packet: a pointer to it would make
/// the entry point keep the whole packet tuple on its stack, whose call
/// chains are at the verifier's 512-byte limit.
// A BPF subprogram of its own: the miss path only.
#[inline(never)]
pub fn inbound(cfg: &Config, sender: u64, to: u32, now: u64, xlat: &mut Xlat) -> bool {
    let filtering = cfg.filtering;
    let hairpin = to & HAIRPIN != 0;
    #[expect(clippy::cast_possible_truncation, reason = "the low 16 bits")]
    let dport = to as u16;
    if filtering == Filtering::AddressPortDependent as u8 {
        return false;
    }
    #[expect(clippy::cast_possible_truncation, reason = "fields of Endpoint::bits")]
    let (src, proto) = ((sender as u32).to_ne_bytes(), (sender >> 48) as u8);
    // SAFETY: only read here.
    let Some(m) = (unsafe { NAT_MAPPINGS.get(&mapping_key(proto, dport)) }) else {
        return false;
    };
    if !live(m, now) || (hairpin && m.internal.bits() == sender) {
        return false;
    }
    let permit = if filtering == Filtering::AddressDependent as u8 {
        let pk = PermitKey {
            remote: if hairpin { cfg.wan_addr } else { src },
            port: dport,
            proto,
            pad: 0,
        };
        // SAFETY: only read here.
        unsafe { NAT_PERMITS.get(&pk) }
    } else {
        None
    };
    if !filter_admits(filtering, &m.internal, permit) {
        return false;
    }
    xlat.dst = m.internal.addr;
    xlat.dport = m.internal.port;
    true
}

/// In `inbound`'s `to`: the sender is a LAN host (a hairpin).
pub const HAIRPIN: u32 = 1 << 16;

/// Gives the NAT mapping of the flow whose entry `e` was hit through `key`
/// the expiry the flow's state needs, if the mapping is still this flow's
/// endpoint's ([`refreshed_mapping`]: a later expiry extends it and makes
/// this flow, named by its remote's tag, the mapping's setter, unless the
/// flow was opened towards the mapping; only the setter lowers a TCP
/// mapping; UDP and ICMP never lower). Called for two
/// reasons, never per packet:
/// - an outbound packet (a LAN-side hit) whose flow's own outbound refresh
///   tick passed ([`router_common::mapping::outbound_refresh_due`]):
///   outbound refresh, at most once per tick per flow, whichever direction
///   refreshed `last_seen_ns` (RFC 4787 REQ-6 requires outbound refresh;
///   inbound packets refresh their flow, never the mapping); it only
///   extends (`old_state` is the flow's state: it did not change);
/// - a TCP state change of the flow (SYN+ACK, FIN, RST, a new SYN), from
///   either side: the mapping follows its connection (RFC 5382 REQ-5),
///   the setter's down to the closed state's short timeout, so that the
///   port of a connection the server closed or reset comes free (a
///   lowering at the close, not an inbound refresh), but only as far as
///   the flow's previous state `old_state` needed (a flow never
///   established lowers no established connection's mapping).
///
/// A state change of a hairpinned flow's target side (its reply entry)
/// also refreshes the opener's mapping
/// ([`router_common::mapping::hairpin_opener_mapping`]), with the
/// opener's tag: the target (a server reached through the WAN address)
/// often closes first, and the opener's mapping would otherwise keep the
/// established state's days after the connection closed (RFC 5382
/// REQ-5; the same rules: only its setter lowers it, and only as far as
/// `old_state` needed).
///
/// Records the tick in `e.out_tick` (also of a WAN-side entry, at a
/// WAN-side state change; only LAN-side entries read it), found or not,
/// so that the hit path does not call again in this tick.
// A BPF subprogram of its own, called from the entry point (outbound
// refresh) and from `flow::track` (state change): its frame adds to both
// chains, which are near the verifier's 512 bytes.
#[inline(never)]
pub fn refresh(key: &FlowKey, e: &mut FlowEntry, now: u64, old_state: u8) {
    e.out_tick = refresh_tick(now);
    let Some(cfg) = CONFIG.get(0) else {
        return;
    };
    refresh_named(mapping_of(key, e), e.state, old_state, now, &cfg.timeouts);
    // A state change (an outbound refresh passes the state unchanged).
    if old_state != e.state
        && let Some(opener) = hairpin_opener_mapping(key, e)
    {
        refresh_named(opener, e.state, old_state, now, &cfg.timeouts);
    }
}

/// [`refresh`] of the mapping `(port, owner, tag)` (as
/// [`router_common::mapping::mapping_of`] names it) by a flow now in
/// `state`, before in `old_state`: only while the mapping is `owner`'s.
#[inline(always)]
fn refresh_named(
    (port, owner, tag): (u16, Endpoint, u8),
    state: u8,
    old_state: u8,
    now: u64,
    t: &Timeouts,
) {
    let Some(m) = NAT_MAPPINGS.get_ptr_mut(&mapping_key(owner.proto, port)) else {
        return;
    };
    // SAFETY: map value pointer, valid for this run.
    let m = unsafe { &mut *m };
    if m.internal.bits() == owner.bits() {
        let r = refreshed_mapping(m, owner.proto, state, old_state, tag, now, t);
        m.expires_ns = r.expires_ns;
        m.internal.pad = r.internal.pad;
        // Keeps the endpoint's index warm in its LRU (looked up, or put
        // back if evicted): a long session's flows are created once and
        // would never look it up again, and an endpoint whose index was
        // evicted probes afresh at its next new flow, where a port freed
        // meanwhile would give it a second mapping (RFC 4787 REQ-1).
        let ep = Endpoint { pad: 0, ..owner };
        // SAFETY: only tested for presence.
        if unsafe { NAT_ENDPOINTS.get(&ep) }.is_none() {
            let _ = NAT_ENDPOINTS.insert(&ep, &mapping_key(owner.proto, port), u64::from(BPF_ANY));
        }
    }
}
