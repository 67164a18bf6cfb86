//! Phases of a packet of a flow: conntrack lookup (with the state
//! tracking of a hit), the next hop (the flow's cached one or the FIB's),
//! and the address/port rewrite.

use aya_ebpf::{bindings::BPF_NOEXIST, macros::map, maps::PerCpuArray, programs::XdpContext};
use router_common::{
    flow::{
        OffloadedHit, Segment, TCP_CONTROL, blind_suspect, control_in_window, expired,
        needs_refresh, offloaded_hit, tcp_control, tcp_learn, tcp_observe,
    },
    hdr::{frame, get_addr, get_u16, icmp, ipv4, tcp, udp},
    mapping::outbound_refresh_due,
    maps::{
        Counter, FLAG_MAPPED, FLAG_OFFLOADED, FLAG_ORIGINAL, FlowCount, FlowEntry, FlowKey,
        FlowState, IPPROTO_TCP, IPPROTO_UDP, LEASE_HANDED_BACK, TCP_TRACK_LEARN, TcpWindow,
        lease_tick,
    },
    nat::{rewrite_addrs, rewrite_icmp_echo, rewrite_tcp, rewrite_udp},
};

use crate::{
    Step, Verdict,
    hop::{Hop, Note, fib_marked, redirect_to},
    maps::{CONNTRACK, ROUTE_MARKS, event},
    parse::{Ingress, Packet, header},
};

/// Header values after translation.
#[derive(Clone, Copy)]
pub struct Xlat {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    pub sport: u16,
    pub dport: u16,
}

impl Xlat {
    /// The packet's own tuple: no translation (yet).
    #[inline(always)]
    pub fn of_packet(pkt: &Packet) -> Self {
        Self {
            src: pkt.src,
            dst: pkt.dst,
            sport: pkt.sport,
            dport: pkt.dport,
        }
    }

    /// The translation an entry records.
    #[inline(always)]
    pub fn of_entry(e: &FlowEntry) -> Self {
        Self {
            src: e.new_src_addr,
            dst: e.new_dst_addr,
            sport: e.new_src_port,
            dport: e.new_dst_port,
        }
    }
}

/// A flow key on the stack at an 8-byte boundary, for the paths that build
/// one off the hit path: LLVM stores its two addresses, read from the
/// packet, as one 8-byte word, which the verifier refuses at a stack offset
/// that is not a multiple of 8 (the key alone is 2-byte aligned).
#[repr(C, align(8))]
pub struct StackKey(pub FlowKey);

impl StackKey {
    /// The key of the IPv4 packet `ip` with the ports (or echo
    /// identifier) `sport` and `dport`.
    #[inline(always)]
    pub fn of(ip: &[u8; ipv4::LEN], sport: u16, dport: u16) -> Self {
        Self(FlowKey::new(
            get_addr(ip, ipv4::SRC),
            get_addr(ip, ipv4::DST),
            sport,
            dport,
            ip[ipv4::PROTO],
        ))
    }
}

/// The hit of `key` on `side` if the data path carries its flow itself
/// (not an offloaded one, whose packets the kernel's conntrack
/// translates), with the packet's time: the lookup of the paths off the
/// hit path (fragments, IP options, Time Exceeded).
#[inline(always)]
pub fn own_hit(key: &FlowKey, side: Ingress<'_>) -> Option<(*mut FlowEntry, u64)> {
    let (Some(e), now) = lookup(key, side) else {
        return None;
    };
    // SAFETY: map value pointer from the lookup, valid for this run.
    if unsafe { (*e).flags } & FLAG_OFFLOADED != 0 {
        return None;
    }
    Some((e, now))
}

/// What a hit taken off the hit path does to its flow (`key`/`e`, a packet
/// of `len` IP bytes at `now`): the timers ([`touch`]), the NAT mapping's
/// outbound refresh (RFC 4787 REQ-6; the chain to `mapping::refresh` has
/// room under these paths' subprograms) and the flow's counts.
#[inline(always)]
pub fn off_path_hit(key: &FlowKey, e: &mut FlowEntry, now: u64, from_lan: bool, len: usize) {
    touch(e, now);
    if outbound_refresh_due(from_lan, e, now) {
        crate::mapping::refresh(key, e, now, e.state);
    }
    count(e, len);
}

/// The entry of `key`, if it is a hit: an entry counts only on its own
/// side (the same tuple replayed on the other interface is spoofed) and
/// while not expired (a masqueraded UDP flow's while its NAT mapping
/// lives: `mapping::keeps_udp_flow_alive`); with the time of the packet ([`crate::clock::now`],
/// read after the map look-up: on a tick's first packet it calls the
/// helper, and fewer of the packet's values are then live across the
/// call, so fewer are spilled to the stack).
// A raw pointer: the entry is written again (state, next hop) after other
// phases borrowed what they need.
#[inline(always)]
pub fn lookup(key: &FlowKey, side: Ingress<'_>) -> (Option<*mut FlowEntry>, u64) {
    let found = CONNTRACK.get_ptr_mut(key);
    let now = crate::clock::now();
    let Some(e) = found else {
        return (None, now);
    };
    // SAFETY: map value pointer, valid for this run; fields are plain
    // integers, a concurrent writer can at worst tear a refresh.
    let entry = unsafe { &*e };
    if entry.lan_side() != side.from_lan
        || expired(entry.state, entry.last_seen_ns, now, &side.cfg.timeouts)
            && !crate::mapping::keeps_udp_flow_alive(key, entry, now)
    {
        return (None, now);
    }
    (Some(e), now)
}

/// An offloaded flow's TCP FIN, SYN or RST goes to the kernel, which owns
/// the flow's TCP state and must see its teardown, and so does the rest of
/// the connection: the first such segment hands the flow back
/// ([`OffloadedHit`]; the daemon then removes the entries, and offloads a
/// new connection on the same ports once the kernel has it established).
/// Checked before [`track`], so the data path's own state machine does not
/// act on it. The hit path pays one compare of two fields it reads anyway.
/// A RST or FIN outside the receiver's window ([`blind_control`]) is no
/// such segment: carried as a hit, it changes nothing.
#[inline(always)]
pub fn kernel_segment(e: &mut FlowEntry, proto: u8, seg: &Segment) -> Step<()> {
    match offloaded_hit(e.flags, e.lease, proto, seg.flags) {
        OffloadedHit::Carry => Ok(()),
        OffloadedHit::HandBack => {
            core::hint::cold_path();
            if blind_suspect(e.flags, e.lease, seg.flags)
                && blind_control(e, seg.seq, seg.len, seg.flags)
            {
                return Ok(());
            }
            hand_back(e);
            Err(Verdict::pass(Counter::PassOffloadTcpControl))
        }
        OffloadedHit::Control => {
            core::hint::cold_path();
            Err(Verdict::pass(Counter::PassOffloadTcpControl))
        }
        OffloadedHit::HandedBack => {
            core::hint::cold_path();
            Err(Verdict::pass(Counter::PassOffloadHandedBack))
        }
        OffloadedHit::Pending => {
            core::hint::cold_path();
            Err(Verdict::pass(Counter::PassOffloadPending))
        }
    }
}

/// Whether an offloaded connection's RST or FIN (not a SYN) falls outside
/// the window of its receiver, whose tracking the other entry holds
/// (learned from the connection's carried ACKs, `tcp_observe`; untracked
/// it accepts everything): a blind RST or FIN, whose sender guessed the
/// tuple but not a sequence number (RFC 5961 3.2, 4.2). Handed back, the
/// kernel, whose window check is off for offloaded connections, would
/// take it and close its entry; the receiver would discard it, and the
/// connection, no longer in the kernel's table, would be cut off by the
/// firewall at its next packet from the WAN. Carried instead, it is
/// judged and counted by `track` (`tcp_out_of_window`) like a standalone
/// flow's. Inline, in the cold branch: as a subprogram of its own the
/// verifier walked some 46,000 instructions more.
#[inline(always)]
fn blind_control(e: &FlowEntry, seq: u32, len: u16, flags: u8) -> bool {
    match CONNTRACK.get_ptr(&e.peer) {
        // SAFETY: map value pointer, valid for this run.
        Some(p) => !control_in_window(unsafe { &(*p).tcp }, seq, len, flags),
        None => false,
    }
}

/// Ends the lease of both entries of an offloaded flow for good
/// ([`LEASE_HANDED_BACK`]): from now on the kernel sees every packet of
/// it, in both directions. A subprogram: only control segments pay for
/// the other direction's lookup.
#[inline(never)]
fn hand_back(e: &mut FlowEntry) {
    e.lease = LEASE_HANDED_BACK;
    if let Some(p) = CONNTRACK.get_ptr_mut(&e.peer) {
        // SAFETY: map value pointer, valid for this run.
        unsafe { (*p).lease = LEASE_HANDED_BACK };
    }
}

/// An offloaded flow is carried only within its lease, which the daemon
/// extends while the kernel's entry lives. Past it (no daemon renewing),
/// the kernel, which still has the flow, carries it. Checked after
/// [`track`], so the packet still counts as activity that a running
/// daemon renews the lease for.
#[inline(always)]
pub fn within_lease(e: &FlowEntry, now: u64) -> Step<()> {
    if e.flags & FLAG_OFFLOADED != 0 && lease_tick(now) > e.lease {
        core::hint::cold_path();
        return Err(Verdict::pass(Counter::PassLeaseExpired));
    }
    Ok(())
}

/// The hit's cached next hop, if still usable: not due for a refresh and
/// the packet fits its MTU. Else (or with nothing cached) the next-hop
/// phase asks the FIB again.
#[inline(always)]
pub fn cached_hop(e: &FlowEntry, total_len: usize, now: u64) -> Option<Hop> {
    if e.hop_ifindex == 0
        || needs_refresh(e.last_seen_ns, now)
        || total_len > usize::from(e.hop_mtu)
    {
        core::hint::cold_path();
        return None;
    }
    // A cached egress that left the device map (its interface was deleted,
    // and one made anew under its name has another index) is asked of the
    // FIB again, as a refresh would.
    redirect_to(e.hop_ifindex, e.hop_mtu, e.hop_smac, e.hop_dmac).ok()
}

/// The next hop of the packet translated to `xlat`: the hit's cached one,
/// or the FIB's, which a hit then caches.
#[inline(always)]
pub fn next_hop(
    ctx: &XdpContext,
    ip: &[u8; ipv4::LEN],
    xlat: &Xlat,
    hit: Option<*mut FlowEntry>,
    cached: Option<Hop>,
) -> Step<Hop> {
    if let Some(h) = cached {
        return Ok(h);
    }
    let Some(e) = hit else {
        // A new LAN flow that is not routed anywhere (e.g. to the router
        // itself) is not NAT's business either: `fib` passes it.
        return fib_marked(ctx, ip, xlat.dst, 0, Note::Nothing);
    };
    // SAFETY: map value pointer from the lookup.
    let e = unsafe { &mut *e };
    let hop = match route_mark(e) {
        Some(mark) => fib_marked(ctx, ip, xlat.dst, mark, Note::Neighbour),
        // A slot the map does not have: the kernel, which has the
        // connection (only offloaded flows have marks), routes it.
        None => Err(Verdict::pass(Counter::PassFibNotForwarded)),
    };
    if let Ok(Hop::Redirect {
        ifindex,
        mtu,
        smac,
        dmac,
        ..
    }) = &hop
    {
        e.hop_ifindex = *ifindex;
        e.hop_mtu = *mtu;
        e.hop_smac = *smac;
        e.hop_dmac = *dmac;
    } else if e.hop_ifindex != 0 && !too_big_for_the_cache(&hop, ip, e.hop_mtu) {
        // The FIB refuses the hop now (blackhole, unreachable, forwarding
        // off, a lower MTU, no neighbour): forget the cached one, so the
        // next packet asks the FIB again instead of being redirected to
        // the old hop until the next refresh (the last-seen time was just
        // refreshed). While the refusal lasts, every packet goes to the
        // kernel, as it would without XDP. Only on this path: a hit with
        // a usable cached hop never gets here.
        core::hint::cold_path();
        e.hop_ifindex = 0;
    }
    hop
}

/// The routing mark the hit `e`'s FIB lookups carry: 0 for none, else its
/// slot's in `ROUTE_MARKS`; `None` for a slot beyond the map or holding no
/// mark (a lookup without one would take the route the daemon found not
/// to be the connection's).
#[inline(always)]
fn route_mark(e: &FlowEntry) -> Option<u32> {
    if e.route_mark == 0 {
        return Some(0);
    }
    ROUTE_MARKS
        .get(u32::from(e.route_mark))
        .copied()
        .filter(|&m| m != 0)
}

/// Whether the FIB refused `hop` only for a packet that the cached hop's
/// MTU `cached_mtu` would not take either: an oversize packet of a flow
/// whose route is fine keeps the cache (its smaller packets stay on it);
/// one that fits the cached MTU but not the route's means the route's MTU
/// went down, and the cache goes.
#[inline(always)]
fn too_big_for_the_cache(hop: &Step<Hop>, ip: &[u8; ipv4::LEN], cached_mtu: u16) -> bool {
    matches!(hop, Err(v) if v.counter == Counter::PassMtu)
        && get_u16(ip, ipv4::TOT_LEN) > cached_mtu
}

/// Counts a packet of `len` IP bytes of the hit `e` (a plain add into
/// this direction's own entry, see [`FlowCount`]). Called once the data
/// path has taken the packet as the flow's (past the offload checks:
/// TCP control segments and packets past the lease are the kernel's).
#[inline(always)]
pub fn count(e: &mut FlowEntry, len: usize) {
    e.count.add(len as u64);
}

/// Counts the first packet of a new flow, `len` IP bytes, in the entry
/// its commit just wrote under `key`. A subprogram of its own: only new
/// flows pay for the lookup, and its null check ends inside it, so the
/// verifier does not explore the rest of the new-flow path twice.
#[inline(never)]
pub fn count_first(key: &FlowKey, len: usize) {
    if let Some(e) = CONNTRACK.get_ptr_mut(key) {
        // SAFETY: map value pointer, valid for this run.
        unsafe { (*e).count.add(len as u64) };
    }
}

/// Rewrites addresses and ports (the ICMP echo identifier) to `xlat`,
/// with incremental checksum updates.
#[inline(always)]
pub fn rewrite(ctx: &XdpContext, ip: &mut [u8; ipv4::LEN], proto: u8, xlat: &Xlat) -> Step<()> {
    let pseudo = rewrite_addrs(ip, xlat.src, xlat.dst);
    match proto {
        IPPROTO_TCP => {
            let tcp: &mut [u8; tcp::LEN] = header(ctx, frame::L4)?;
            rewrite_tcp(tcp, pseudo, xlat.sport, xlat.dport);
        }
        IPPROTO_UDP => {
            let udp: &mut [u8; udp::LEN] = header(ctx, frame::L4)?;
            rewrite_udp(udp, pseudo, xlat.sport, xlat.dport);
        }
        _ => {
            let icmp: &mut [u8; icmp::LEN] = header(ctx, frame::L4)?;
            let _ = rewrite_icmp_echo(icmp, xlat.sport);
        }
    }
    Ok(())
}

/// The state tracking of a hit. What a hit usually needs is done inline:
/// nothing for a UDP or ICMP flow with no refresh due and no first reply,
/// the window tracking (`tcp_observe`) for a TCP segment without
/// SYN/FIN/RST; the rest (refreshes, state changes) goes to [`track`], a
/// subprogram. Every call returns through the kernel's return thunk (the
/// SRSO "safe RET" mitigation on AMD hosts), which the micro-benchmark's
/// profile showed to be one of the hit's largest costs.
#[inline(always)]
pub fn track_hit(key: &FlowKey, e: &mut FlowEntry, seg: &Segment, now: u64) {
    if e.tcp.flags == TCP_TRACK_LEARN && key.proto == IPPROTO_TCP && seg.flags & TCP_CONTROL == 0 {
        // An offloaded connection's first ACK this way, whether a refresh
        // is due or not (here, not in `track`, whose frame has no room).
        tcp_learn(&mut e.tcp, seg.ack, seg.win, seg.flags);
    }
    if !needs_refresh(e.last_seen_ns, now) {
        match key.proto {
            // `track` without a refresh: the window tracking only.
            IPPROTO_TCP if seg.flags & TCP_CONTROL == 0 => {
                let t = tcp_observe(e.tcp, seg, false);
                if t != e.tcp {
                    e.tcp = t;
                }
                return;
            }
            // SYN/FIN/RST, and a UDP flow's first reply, change the state.
            IPPROTO_TCP => {}
            IPPROTO_UDP
                if e.flags & FLAG_ORIGINAL == 0 && e.state == FlowState::UdpUnreplied as u8 => {}
            // `track` would change nothing.
            _ => return,
        }
    }
    track(key, e, seg, now);
}

/// Updates TCP/UDP state, the TCP window tracking and the coarse
/// last-seen time of a flow hit through `key`/`e` by a packet whose TCP
/// fields are `seg`. Writes only when something changed or the refresh
/// interval passed, so established flows do not write shared cache lines
/// per packet: a TCP segment without SYN/FIN/RST writes at most its own
/// direction's window tracking, about twice per window of data
/// (`tcp_observe`); only SYN, FIN and RST read the other direction's entry
/// and are judged against its window ([`track_tcp_control`]).
// A BPF subprogram of its own, as are the two it calls: their stack frames
// (a rebuilt entry) do not add to the entry point's.
#[inline(never)]
fn track(key: &FlowKey, e: &mut FlowEntry, seg: &Segment, now: u64) {
    let refresh = needs_refresh(e.last_seen_ns, now);
    let state = match key.proto {
        IPPROTO_TCP if seg.flags & TCP_CONTROL != 0 => {
            let c = track_tcp_control(e, seg, now, refresh);
            if c & CONTROL_SYNC != 0 {
                sync_peer(key, e, now, refresh, true);
            }
            if c & CONTROL_STATE_CHANGED != 0 && e.flags & FLAG_MAPPED != 0 {
                // The mapping follows the connection's new state, whichever
                // side sent the segment: the server's SYN+ACK extends it, a
                // RST or FIN from either side lowers it to the closing
                // state's timeout if this connection set it (not a
                // sibling's), so the port of a closed connection comes
                // free (RFC 5382 REQ-5). A call from here
                // (entry -> track -> refresh), not from `track_tcp_control`,
                // whose chain is at the verifier's 512 bytes.
                #[expect(clippy::cast_possible_truncation, reason = "bits 8-15")]
                let old_state = (c >> CONTROL_OLD_STATE_SHIFT) as u8;
                crate::mapping::refresh(key, e, now, old_state);
            }
            return;
        }
        IPPROTO_TCP => {
            let t = tcp_observe(e.tcp, seg, refresh);
            if t != e.tcp {
                e.tcp = t;
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
    // A refresh alone writes the times only, never the state read above:
    // the other direction's FIN or RST, on another CPU, may have changed
    // both entries' state since (written back, the flow would return to
    // ESTABLISHED and its 5-day timeout).
    if changed {
        e.state = state;
    }
    if refresh {
        e.last_seen_ns = now;
    }
    sync_peer(key, e, now, refresh, changed);
}

/// A TCP segment with SYN, FIN or RST: the state changes only if the
/// receiver would accept the segment (`tcp_control`: its window, or the
/// exact acknowledgement of the opening SYN). One it would not accept
/// changes nothing and is counted (`tcp_out_of_window`), and is forwarded
/// all the same, as netfilter's `tcp_in_window` does by default (it marks
/// such a segment invalid rather than dropping it; RFC 5961 has the
/// endpoint discard it or answer with a challenge ACK). Writes the window
/// tracking of both directions; returns [`CONTROL_SYNC`] if the state or
/// the last-seen time must go to the other direction's entry too, and
/// [`CONTROL_STATE_CHANGED`] if the state changed, with the state it
/// changed from in bits 8-15 ([`CONTROL_OLD_STATE_SHIFT`]; bits of one
/// integer: returned in a register, nothing more kept live across the
/// call).
#[inline(never)]
fn track_tcp_control(e: &mut FlowEntry, seg: &Segment, now: u64, refresh: bool) -> u32 {
    let peer = CONNTRACK.get_ptr_mut(&e.peer);
    let before = match peer {
        // SAFETY: map value pointer, valid for this run.
        Some(p) => unsafe { (*p).tcp },
        // Evicted: `sync_peer` puts it back, untracked.
        None => TcpWindow::default(),
    };
    let from_orig = e.flags & FLAG_ORIGINAL != 0;
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
    if c.state == e.state && c.flags == e.flags && !refresh {
        return 0;
    }
    let changed = if c.state == e.state {
        0
    } else {
        CONTROL_STATE_CHANGED | u32::from(e.state) << CONTROL_OLD_STATE_SHIFT
    };
    e.state = c.state;
    e.flags = c.flags;
    if refresh {
        e.last_seen_ns = now;
    }
    CONTROL_SYNC | changed
}

/// [`track_tcp_control`]: copy the entry to the other direction's.
const CONTROL_SYNC: u32 = 1;
/// [`track_tcp_control`]: the state changed.
const CONTROL_STATE_CHANGED: u32 = 2;
/// [`track_tcp_control`]: ... from the state in these bits (8-15): the
/// flow lowers a mapping it set only as far as that state needed
/// ([`router_common::mapping::refreshed_mapping`]).
const CONTROL_OLD_STATE_SHIFT: u32 = 8;

/// Where [`sync_peer`] rebuilds an evicted entry.
#[map(name = "RESTORE_SCRATCH")]
static RESTORE_SCRATCH: PerCpuArray<FlowEntry> = PerCpuArray::with_max_entries(1, 0);

/// Copies the state of `e` to the other direction's entry if `state`;
/// refreshes its last-seen time if `refresh`; rebuilds it from `e` if it
/// is gone.
#[inline(never)]
fn sync_peer(key: &FlowKey, e: &FlowEntry, now: u64, refresh: bool, state: bool) {
    let peer_flags = (e.flags & !FLAG_ORIGINAL) | (!e.flags & FLAG_ORIGINAL);
    if let Some(p) = CONNTRACK.get_ptr_mut(&e.peer) {
        // SAFETY: map value pointer, valid for this run.
        let p = unsafe { &mut *p };
        if state {
            p.state = e.state;
            p.flags = peer_flags;
        }
        if refresh {
            p.last_seen_ns = now;
            // Its cached next hop goes with the refresh it no longer sees
            // due (`cached_hop`): its next packet asks the FIB, so each
            // direction follows a route or neighbour change within
            // `REFRESH_NS`, not only the one that refreshes the pair.
            p.hop_ifindex = 0;
        }
        return;
    }
    // The LRU evicted the other direction: put it back, rebuilt from this
    // one (its translation is the reverse of our key; its window tracking
    // and counts are lost, so segments towards it are not judged). An
    // offloaded flow's gets this one's lease: the daemon hands a flow's
    // leases back before it removes its two entries, so a half rebuilt in
    // between carries no live lease (and a handed-back entry's hit never
    // gets here: it is passed before the tracking).
    // NOEXIST: if another flow took that tuple meanwhile, it keeps it.
    // Built in a per-CPU slot, not on the stack: the chain main -> track ->
    // sync_peer must stay within the verifier's 512 bytes.
    let Some(peer) = RESTORE_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let peer = unsafe { &mut *peer };
    let back = key.reversed();
    *peer = FlowEntry {
        peer: *key,
        new_src_addr: back.src_addr,
        new_dst_addr: back.dst_addr,
        new_src_port: back.src_port,
        new_dst_port: back.dst_port,
        state: e.state,
        flags: peer_flags,
        // Due: the next outbound packet refreshes the mapping.
        out_tick: 0,
        last_seen_ns: now,
        created_ns: e.created_ns,
        hop_ifindex: 0,
        hop_mtu: 0,
        hop_dmac: [0; 6],
        hop_smac: [0; 6],
        // The flow's: the kernel routes both directions by its mark.
        route_mark: e.route_mark,
        lease: e.lease,
        tcp: TcpWindow::default(),
        count: FlowCount::default(),
    };
    if CONNTRACK
        .insert(&e.peer, peer, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        event(Counter::CtEntriesInserted);
    }
    event(Counter::EvictionDetected);
}

/// The timers of a hit that [`track`] does not see (a fragment's, a
/// packet's with IP options: `fragment`, `ip_options`): the first reply of
/// a UDP flow marks it replied, and the last-seen time is refreshed once
/// per interval, in both entries. No TCP state change (such a packet is
/// forwarded, never judged). Inline, not through `track`: that
/// subprogram's call chain (to the TCP control tracking) has no room left
/// under those paths' own. An evicted other entry is put back by the
/// flow's next ordinary packet.
#[inline(always)]
pub fn touch(e: &mut FlowEntry, now: u64) {
    let refresh = needs_refresh(e.last_seen_ns, now);
    let first_reply = e.flags & FLAG_ORIGINAL == 0
        && e.peer.proto == IPPROTO_UDP
        && e.state == FlowState::UdpUnreplied as u8;
    if !refresh && !first_reply {
        return;
    }
    if first_reply {
        e.state = FlowState::UdpReplied as u8;
    }
    if refresh {
        e.last_seen_ns = now;
    }
    if let Some(p) = CONNTRACK.get_ptr_mut(&e.peer) {
        // SAFETY: map value pointer, valid for this run.
        let p = unsafe { &mut *p };
        // The state only when this packet changed it: written on a refresh
        // alone it could undo the other direction's FIN of another CPU
        // (as in `track`).
        if first_reply {
            p.state = e.state;
        }
        if refresh {
            p.last_seen_ns = now;
            // As in `sync_peer`: its next packet asks the FIB.
            p.hop_ifindex = 0;
        }
    }
}
