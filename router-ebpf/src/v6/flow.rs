//! IPv6 flows: conntrack lookup, state tracking of a hit (the same TCP/UDP
//! state machine and timeouts as IPv4, from `router-common`), the cached
//! next hop, and the admission of a new flow (RFC 6092 in standalone mode).

use aya_ebpf::{
    bindings::{BPF_NOEXIST, xdp_md},
    macros::map,
    maps::PerCpuArray,
    programs::XdpContext,
};
use router_common::{
    flow::{
        OffloadedHit, Segment, TCP_CONTROL, UNTRACKED, blind_suspect, expired, in_window,
        initial_state, needs_refresh, offloaded_hit, open_tracking, tcp_control, tcp_learn,
        tcp_observe, tcp_opens_flow,
    },
    ipv6::{IPPROTO_ICMPV6, ipv6},
    maps::{
        Admit, Counter, FLAG_OFFLOADED, FLAG_ORIGINAL, FLAG_PORT_FORWARD, FlowEntry6, FlowKey6,
        FlowState, IPPROTO_TCP, IPPROTO_UDP, LEASE_HANDED_BACK, TCP_TRACK_LEARN, TcpWindow,
        Timeouts, lease_tick,
    },
};

use super::{
    egress_of, fib6,
    maps::{CONNTRACK6, Claim, claim, insert_counted, pinhole},
    parse::{fill_tcp_segment, read_tcp_segment},
    source_valid, unsolicited,
};
use crate::{
    Step, Verdict,
    hop::{Hop, redirect_to},
    maps::event,
    parse::Ingress,
};

/// The entry of `key`, if it is a hit: on its own side and not expired.
#[inline(always)]
pub fn lookup(key: &FlowKey6, side: Ingress<'_>, now: u64) -> Option<*mut FlowEntry6> {
    let e = CONNTRACK6.get_ptr_mut(key)?;
    // SAFETY: map value pointer, valid for this run.
    let entry = unsafe { &*e };
    if entry.lan_side() != side.from_lan
        || expired(entry.state, entry.last_seen_ns, now, &side.cfg.timeouts)
    {
        return None;
    }
    Some(e)
}

/// An offloaded flow's TCP FIN, SYN or RST goes to the kernel, which owns
/// the flow's TCP state and must see its teardown, and the first one hands
/// the rest of the connection back to it too (as IPv4's
/// `flow::kernel_segment`; [`OffloadedHit`]). Checked before [`track`]. A
/// RST or FIN outside the receiver's window ([`blind_control`]) is no such
/// segment: carried as a hit, it changes nothing.
#[inline(always)]
pub fn kernel_segment(
    ctx: &XdpContext,
    key: &FlowKey6,
    e: &mut FlowEntry6,
    proto: u8,
    tcp_flags: u8,
) -> Step<()> {
    match offloaded_hit(e.flags, e.lease, proto, tcp_flags) {
        OffloadedHit::Carry => Ok(()),
        OffloadedHit::HandBack => {
            if blind_suspect(e.flags, e.lease, tcp_flags) && blind_control(ctx.ctx, key) {
                return Ok(());
            }
            hand_back(key, e);
            Err(Verdict::pass(Counter::PassOffloadTcpControl))
        }
        OffloadedHit::Control => Err(Verdict::pass(Counter::PassOffloadTcpControl)),
        OffloadedHit::HandedBack => Err(Verdict::pass(Counter::PassOffloadHandedBack)),
        OffloadedHit::Pending => Err(Verdict::pass(Counter::PassOffloadPending)),
    }
}

/// Whether an offloaded connection's RST or FIN falls outside the window
/// of its receiver, the other entry's tracking (as IPv4's
/// `flow::blind_control`, RFC 5961): the segment's fields read from the
/// frame into the per-CPU slot. A subprogram: only control segments pay.
#[inline(never)]
fn blind_control(md: *mut xdp_md, key: &FlowKey6) -> bool {
    let (Some(seg), Some(peer)) = (SEGMENT_SCRATCH6.get_ptr_mut(0), peer_entry(key)) else {
        return false;
    };
    // SAFETY: per-CPU slot, used by this program run only. Filled inline
    // (not by `segment`'s subprogram): a third frame on the entry point's
    // would pass the verifier's 512 bytes.
    let seg = unsafe { &mut *seg };
    super::parse::fill_tcp_segment(md, seg);
    // SAFETY: map value pointer, valid for this run.
    !in_window(unsafe { &(*peer).tcp }, seg)
}

/// Ends the lease of both entries of an offloaded flow for good (as
/// IPv4's `flow::hand_back`; routed, so the other direction's key is this
/// one reversed).
#[inline(never)]
fn hand_back(key: &FlowKey6, e: &mut FlowEntry6) {
    e.lease = LEASE_HANDED_BACK;
    if let Some(p) = CONNTRACK6.get_ptr_mut(&key.reversed()) {
        // SAFETY: map value pointer, valid for this run.
        unsafe { (*p).lease = LEASE_HANDED_BACK };
    }
}

/// An offloaded flow is carried only within its lease (as IPv4's
/// `flow::within_lease`); after it the kernel, which still has the flow,
/// carries it. Checked after [`track`], so the packet still counts as
/// activity that a running daemon renews the lease for.
#[inline(always)]
pub fn within_lease(e: &FlowEntry6, now: u64) -> Step<()> {
    if e.flags & FLAG_OFFLOADED != 0 && lease_tick(now) > e.lease {
        return Err(Verdict::pass(Counter::PassLeaseExpired));
    }
    Ok(())
}

/// The hit's cached next hop, if still usable: not due for a refresh and
/// the packet (`len` bytes) fits its MTU.
#[inline(always)]
pub fn cached_hop(e: &FlowEntry6, len: usize, now: u64) -> Option<Hop> {
    if e.hop_ifindex == 0 || needs_refresh(e.last_seen_ns, now) || len > usize::from(e.hop_mtu) {
        return None;
    }
    // A cached egress that left the device map (its interface was deleted,
    // and one made anew under its name has another index) is asked of the
    // FIB again, as a refresh would.
    redirect_to(e.hop_ifindex, e.hop_mtu, e.hop_smac, e.hop_dmac).ok()
}

/// Caches the FIB's next hop in the hit's entry; forgets the cached one
/// when the FIB refuses the hop (as IPv4's `flow::next_hop`: the next
/// packet asks the FIB again instead of using the old hop until the next
/// refresh), but not for a packet `oversize` for the cached hop's MTU too
/// (the route may be fine: the flow's other packets stay on the cache).
#[inline(always)]
pub fn cache_hop(e: &mut FlowEntry6, hop: &Step<Hop>, oversize: bool) {
    if let Ok(Hop::Redirect {
        ifindex,
        mtu,
        smac,
        dmac,
        ..
    }) = *hop
    {
        e.hop_ifindex = ifindex;
        e.hop_mtu = mtu;
        e.hop_smac = smac;
        e.hop_dmac = dmac;
    } else if e.hop_ifindex != 0 && !oversize {
        e.hop_ifindex = 0;
    }
}

/// Counts a packet of `len` IP bytes of the hit `e` (as IPv4's
/// `flow::count`).
#[inline(always)]
pub fn count(e: &mut FlowEntry6, len: usize) {
    e.count.add(len as u64);
}

/// Counts the first packet of a new flow in the entry its commit just
/// wrote under `key` (as IPv4's `flow::count_first`).
#[inline(never)]
pub fn count_first(key: &FlowKey6, len: usize) {
    if let Some(e) = CONNTRACK6.get_ptr_mut(key) {
        // SAFETY: map value pointer, valid for this run.
        unsafe { (*e).count.add(len as u64) };
    }
}

/// The state tracking of a hit. A TCP SYN, FIN or RST goes to
/// [`track_tcp_control`], anything else to [`track`]; both are subprograms
/// called from here, so no chain of calls (the window check's frame, a
/// rebuilt entry's) takes the verifier's 512 bytes of stack past the
/// entry point's.
#[inline(always)]
pub fn track_hit(ctx: &XdpContext, key: &FlowKey6, e: &mut FlowEntry6, tcp_flags: u8, now: u64) {
    let md = ctx.ctx;
    if key.proto == IPPROTO_TCP && tcp_flags & TCP_CONTROL != 0 {
        match track_tcp_control(md, e, peer_entry(key), now) {
            PeerSync::Nothing => {}
            PeerSync::State => sync_peer(key, e, now, false, true),
            PeerSync::Refreshed => sync_peer(key, e, now, true, true),
        }
        return;
    }
    // A UDP or `ICMPv6` echo hit with no refresh due and not a UDP flow's
    // first reply: `track` would change nothing (as in IPv4's
    // `track_hit`), so no call.
    if key.proto != IPPROTO_TCP
        && !needs_refresh(e.last_seen_ns, now)
        && (key.proto != IPPROTO_UDP
            || e.flags & FLAG_ORIGINAL != 0
            || e.state != FlowState::UdpUnreplied as u8)
    {
        return;
    }
    track(md, key, e, now);
}

/// What [`sync_peer`] must copy from a hit's entry to the other
/// direction's.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum PeerSync {
    Nothing,
    /// State and flags.
    State,
    /// State, flags and the last-seen time.
    Refreshed,
}

/// Updates UDP state, the window tracking of a TCP segment without SYN,
/// FIN or RST, and last-seen of a hit in both entries, writing only on a
/// change or when the refresh interval passed (as IPv4's `track`). The
/// other entry's key is the reverse of this one's.
// A BPF subprogram of its own, as is `sync_peer`: their stack frames (a
// rebuilt entry) do not add to the entry point's.
#[inline(never)]
fn track(md: *mut xdp_md, key: &FlowKey6, e: &mut FlowEntry6, now: u64) {
    let refresh = needs_refresh(e.last_seen_ns, now);
    let state = match key.proto {
        IPPROTO_TCP => {
            let Some(seg) = SEGMENT_SCRATCH6.get_ptr_mut(0) else {
                return;
            };
            // SAFETY: per-CPU slot, used by this program run only.
            let seg = unsafe { &mut *seg };
            fill_tcp_segment(md, seg);
            if e.tcp.flags == TCP_TRACK_LEARN {
                // An offloaded connection's first ACK this way.
                tcp_learn(&mut e.tcp, seg.ack, seg.win, seg.flags);
            } else {
                let t = tcp_observe(e.tcp, seg, refresh);
                if t != e.tcp {
                    e.tcp = t;
                }
            }
            e.state
        }
        IPPROTO_UDP if e.flags & FLAG_ORIGINAL == 0 && e.state == FlowState::UdpUnreplied as u8 => {
            FlowState::UdpReplied as u8
        }
        _ => e.state,
    };
    let changed = state != e.state;
    if !changed && !refresh {
        return;
    }
    // A refresh alone writes the times only, never the state read above
    // (as IPv4's `track`: another CPU's FIN may have changed it since).
    if changed {
        e.state = state;
    }
    if refresh {
        e.last_seen_ns = now;
    }
    sync_peer(key, e, now, refresh, changed);
}

/// A TCP segment with SYN, FIN or RST (as IPv4's `track_tcp_control`):
/// the state changes only if the receiver would accept the segment
/// (`tcp_control`; RFC 5961: a blind RST or FIN whose tuple was guessed
/// but not a sequence number in the window changes nothing, is counted
/// `tcp_out_of_window` and forwarded all the same). Writes the window
/// tracking of both directions; returns what must go to the other
/// direction's entry too.
#[inline(never)]
fn track_tcp_control(
    md: *mut xdp_md,
    e: &mut FlowEntry6,
    peer: Option<*mut FlowEntry6>,
    now: u64,
) -> PeerSync {
    let before = match peer {
        // SAFETY: map value pointer, valid for this run.
        Some(p) => unsafe { (*p).tcp },
        // Evicted: `sync_peer` puts it back, untracked.
        None => TcpWindow::default(),
    };
    let refresh = needs_refresh(e.last_seen_ns, now);
    let from_orig = e.flags & FLAG_ORIGINAL != 0;
    let Some(seg) = segment(md) else {
        return PeerSync::Nothing;
    };
    let c = tcp_control(e.state, e.flags, from_orig, e.tcp, before, seg, refresh);
    if c.out_of_window {
        event(Counter::TcpOutOfWindow);
    }
    if c.own != e.tcp {
        e.tcp = c.own;
    }
    if let Some(p) = peer
        && c.peer != before
    {
        // SAFETY: map value pointer, valid for this run.
        unsafe { (*p).tcp = c.peer };
    }
    if refresh {
        e.last_seen_ns = now;
    } else if c.state == e.state && c.flags == e.flags {
        return PeerSync::Nothing;
    }
    e.state = c.state;
    e.flags = c.flags;
    if refresh {
        PeerSync::Refreshed
    } else {
        PeerSync::State
    }
}

/// The other direction's entry of the flow whose key is `key`. Its key is
/// built in a per-CPU slot, not on the stack: the entry point's frame,
/// where this is inlined, is at the verifier's limit with the deepest
/// chain of calls below it (IPv4 keeps the other key in the entry).
#[inline(always)]
fn peer_entry(key: &FlowKey6) -> Option<*mut FlowEntry6> {
    let peer_key = PEER_KEY_SCRATCH6.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot, used by this program run only.
    let peer_key = unsafe { &mut *peer_key };
    *peer_key = key.reversed();
    CONNTRACK6.get_ptr_mut(peer_key)
}

/// The TCP fields of the packet (see [`read_tcp_segment`]), read into a
/// per-CPU slot: not on the stack of the subprograms that need them.
#[inline(always)]
fn segment(md: *mut xdp_md) -> Option<&'static Segment> {
    let seg = SEGMENT_SCRATCH6.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot, used by this program run only.
    let seg = unsafe { &mut *seg };
    read_tcp_segment(md, seg);
    Some(seg)
}

/// Where [`segment`] reads a packet's TCP fields into.
#[map(name = "SEGMENT_SCRATCH6")]
static SEGMENT_SCRATCH6: PerCpuArray<Segment> = PerCpuArray::with_max_entries(1, 0);

/// Where [`peer_entry`] (a hit) and [`commit`] (a miss) build the other
/// direction's key.
#[map(name = "PEER_KEY_SCRATCH6")]
static PEER_KEY_SCRATCH6: PerCpuArray<FlowKey6> = PerCpuArray::with_max_entries(1, 0);

/// Where [`sync_peer`] rebuilds an evicted entry.
#[map(name = "RESTORE_SCRATCH6")]
static RESTORE_SCRATCH6: PerCpuArray<FlowEntry6> = PerCpuArray::with_max_entries(1, 0);

/// Copies the state of `e` to the other direction's entry if `state`;
/// refreshes its last-seen time if `refresh`; rebuilds it from `e` if it
/// is gone.
#[inline(never)]
fn sync_peer(key: &FlowKey6, e: &FlowEntry6, now: u64, refresh: bool, state: bool) {
    let peer_flags = (e.flags & !FLAG_ORIGINAL) | (!e.flags & FLAG_ORIGINAL);
    let peer_key = key.reversed();
    if let Some(p) = CONNTRACK6.get_ptr_mut(&peer_key) {
        // SAFETY: map value pointer, valid for this run.
        let p = unsafe { &mut *p };
        if state {
            p.state = e.state;
            p.flags = peer_flags;
        }
        if refresh {
            p.last_seen_ns = now;
            // Its cached next hop goes with the refresh (as IPv4's
            // `sync_peer`): its next packet asks the FIB.
            p.hop_ifindex = 0;
        }
        return;
    }
    // The LRU evicted the other direction: put it back (an offloaded
    // flow's with the same lease, handed back before the daemon removes a
    // flow's entries, as IPv4's `sync_peer` says; its window tracking and
    // counts are lost, so segments towards it are not judged). NOEXIST: a
    // flow that took
    // the tuple meanwhile keeps it. Built in a per-CPU slot, not on the
    // stack: the chain main -> track -> sync_peer must stay within the
    // verifier's 512 bytes.
    let Some(peer) = RESTORE_SCRATCH6.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let peer = unsafe { &mut *peer };
    *peer = FlowEntry6 {
        last_seen_ns: now,
        created_ns: e.created_ns,
        state: e.state,
        flags: peer_flags,
        lease: e.lease,
        ..FlowEntry6::default()
    };
    if CONNTRACK6
        .insert(&peer_key, peer, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        event(Counter::Ct6EntriesInserted);
    }
    event(Counter::Eviction6Detected);
}

/// The entry of `key`, which missed, if it belongs to a live flow that
/// lost this direction's entry (the LRU evicted it) while the other
/// direction's lives: rebuilt from the other ([`sync_peer`]; untracked, as
/// after any eviction), and the packet is a hit of the flow. IPv6 translates nothing, so the
/// lost entry is exactly the other one's key reversed; without this, a
/// flow whose WAN-side entry was lost would drop the server's packets as
/// unsolicited until the LAN host happened to send (RFC 6092 3.3: the
/// state of a flow, not its table entries, decides).
#[inline(always)]
pub fn restored(key: &FlowKey6, side: Ingress<'_>, now: u64) -> Option<*mut FlowEntry6> {
    // Standalone only: offload mode's entries are the daemon's, which
    // removes a pair it ends (a half put back in between would carry the
    // flow past the kernel's firewall until its lease ran out).
    if side.cfg.admit != Admit::Xdp as u8 {
        return None;
    }
    // SAFETY: map value pointer, valid for this run; no other reference
    // to the entry is live.
    let other = unsafe { &mut *peer_entry(key)? };
    if other.lan_side() == side.from_lan
        || expired(other.state, other.last_seen_ns, now, &side.cfg.timeouts)
    {
        return None;
    }
    // Seen now, as the rebuilt entry is: both directions' times agree.
    other.last_seen_ns = now;
    let other_key = PEER_KEY_SCRATCH6.get_ptr(0)?;
    // SAFETY: per-CPU slot holding the key `peer_entry` looked up.
    sync_peer(unsafe { &*other_key }, other, now, true, true);
    lookup(key, side, now)
}

/// A packet of no known flow. Offload mode: the kernel admits. Standalone:
/// from the LAN, a packet that may open a flow (not a TCP segment without
/// SYN) towards the WAN opens one; from the WAN, only through a pinhole,
/// and anything else addressed to a LAN host is dropped (RFC 6092). The
/// flow is written before the neighbour is known: a packet passed for
/// neighbour resolution still opened its flow, so its reply gets in.
#[inline(always)]
pub fn admit(
    ctx: &XdpContext,
    ip: &[u8; ipv6::LEN],
    key: &FlowKey6,
    tcp_flags: u8,
    side: Ingress<'_>,
    now: u64,
) -> Step<Hop> {
    let cfg = side.cfg;
    if cfg.admit == Admit::Kernel as u8 {
        return Err(Verdict::pass(Counter::PassNotOffloaded));
    }
    let opens = key.proto != IPPROTO_TCP || tcp_opens_flow(tcp_flags);
    let (extra_flags, toward, new_flow) = if side.from_lan {
        if !opens {
            return Err(Verdict::pass(Counter::PassNoFlow));
        }
        (0, cfg.wan_ifindex, Counter::Flow6NewOutbound)
    } else {
        if !opens || !pinhole(key.dst_addr, key.proto, key.dst_port) {
            return Err(unsolicited(ctx, ip, side));
        }
        (FLAG_PORT_FORWARD, cfg.lan_ifindex, Counter::Flow6NewPinhole)
    };
    // Too large for the next hop: the kernel answers Packet Too Big, and
    // the flow opens all the same (the egress asked again without the
    // MTU check): the sender's next packets, smaller or in fragments,
    // belong to it, and so do the replies, of which a fragmented one
    // passes the inbound filter only as a known flow's.
    let (hop, too_big) = match fib6(ctx, ip) {
        Ok(hop) => (hop, false),
        Err(v) if v.counter == Counter::Pass6PacketTooBig => (egress_of(ctx, ip)?, true),
        Err(v) => return Err(v),
    };
    if hop.egress() != toward {
        // LAN -> LAN (plain routing), or a pinhole for an address that is
        // not on the LAN: the kernel's.
        let c = if side.from_lan {
            Counter::PassNoFlow
        } else {
            Counter::PassUnsolicited
        };
        return Err(Verdict::pass(c));
    }
    if !source_valid(ctx, side.from_lan, cfg.lan_ifindex) {
        return Err(Verdict::drop(Counter::Drop6SpoofedSource));
    }
    match commit(ctx.ctx, key, extra_flags, &cfg.timeouts, now) {
        Claim::Done => {}
        // The reverse tuple is a live flow's own (its entry for the other
        // direction): it keeps it, as IPv4 and the kernel's conntrack keep
        // a clashing tuple's flow; the kernel gets the packet.
        Claim::Taken => return Err(Verdict::pass(Counter::PassReplyTupleTaken)),
        Claim::Failed => return Err(Verdict::pass(Counter::Pass6TableFull)),
    }
    event(new_flow);
    if too_big {
        return Err(Verdict::pass(Counter::Pass6PacketTooBig));
    }
    Ok(hop)
}

/// Standalone mode: the flow of a first fragment's datagram (`key`, read
/// from the header the fragment starts with) as its unfragmented packet
/// would meet it, the fragments going on to the kernel all the same: a
/// hit (or an evicted half rebuilt) is tracked, its time refreshed and a
/// UDP flow's first reply noted, so a flow whose datagrams are all
/// fragmented lives as long as it is used; a miss from the LAN to the WAN
/// (`to_wan`) opens the flow (`Flow6NewOutbound`, a full table
/// `pass6_table_full`): a datagram the LAN host fragmented itself (larger
/// than the path MTU: a large ping, a large UDP datagram; RFC 8200 4.5),
/// whose replies, fragmented or not, are then a known flow's, which the
/// inbound filter lets in (without the flow it dropped them: `ping -s
/// 3000` from the LAN got no answer). A miss from the WAN opens nothing.
#[inline(always)]
pub fn fragment_of_a_flow(
    ctx: &XdpContext,
    key: &FlowKey6,
    side: Ingress<'_>,
    to_wan: impl FnOnce() -> bool,
    now: u64,
) {
    if let Some(e) = lookup(key, side, now).or_else(|| restored(key, side, now)) {
        // SAFETY: map value pointer from the lookup, valid for this run;
        // no other reference to the entry is live.
        track_hit(ctx, key, unsafe { &mut *e }, 0, now);
        return;
    }
    if !side.from_lan || !to_wan() {
        return;
    }
    match commit(ctx.ctx, key, 0, &side.cfg.timeouts, now) {
        Claim::Done => event(Counter::Flow6NewOutbound),
        Claim::Failed => event(Counter::Pass6TableFull),
        // The reverse tuple is a live flow's own: it keeps it.
        Claim::Taken => {}
    }
}

/// Writes both entries of a new flow opened by `key`'s packet, with the
/// window tracking a TCP SYN starts (as IPv4's `insert_pair`): the reverse
/// entry first, claiming its tuple ([`claim`]), then `key`'s, which may
/// overwrite only an entry the lookup refused (expired, or of the other
/// side); if that fails the reverse entry is removed, so no half-flow is
/// left to admit packets.
#[inline(never)]
fn commit(
    md: *mut xdp_md,
    key: &FlowKey6,
    extra_flags: u8,
    timeouts: &Timeouts,
    now: u64,
) -> Claim {
    // ICMPv6 echo has the ICMP state (`initial_state` knows IPv4's numbers).
    let state = if key.proto == IPPROTO_ICMPV6 {
        FlowState::Icmp
    } else {
        initial_state(key.proto)
    } as u8;
    let (orig_tcp, reply_tcp) = if key.proto == IPPROTO_TCP {
        match segment(md) {
            Some(seg) => open_tracking(key.proto, seg),
            None => (UNTRACKED, UNTRACKED),
        }
    } else {
        (UNTRACKED, UNTRACKED)
    };
    let mut e = FlowEntry6 {
        last_seen_ns: now,
        created_ns: now,
        state,
        flags: extra_flags,
        tcp: reply_tcp,
        ..FlowEntry6::default()
    };
    // The reverse key in a per-CPU slot, not on the stack: main + commit
    // is at the verifier's 512 bytes.
    let Some(reverse) = PEER_KEY_SCRATCH6.get_ptr_mut(0) else {
        return Claim::Failed;
    };
    // SAFETY: per-CPU slot, used by this program run only (a miss: no
    // `peer_entry` in this run).
    let reverse = unsafe { &mut *reverse };
    *reverse = key.reversed();
    match claim(reverse, &e, timeouts, now) {
        Claim::Done => {}
        other => return other,
    }
    e.flags = FLAG_ORIGINAL | extra_flags;
    e.tcp = orig_tcp;
    if insert_counted(key, &e) {
        Claim::Done
    } else {
        let _ = CONNTRACK6.remove(reverse);
        Claim::Failed
    }
}
