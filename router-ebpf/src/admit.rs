//! Admission of new flows (standalone mode: XDP masquerades LAN flows,
//! opens port-forwarded WAN flows and those a NAT mapping's filtering lets
//! in, and hairpins LAN flows to the WAN address back into the LAN) and
//! the commit of a new flow's two conntrack entries.
//
// Kept apart from the hit path because who admits can change: with the
// kernel admitting (offload mode), `admit` passes every miss to the kernel
// and the offload daemon writes the entries that `commit` writes here.

use router_common::{
    flow::{
        MAX_PORT_PROBES, Segment, candidate_port, endpoint_hash, expired, fill_new_flow,
        initial_state, open_tracking, tcp_opens_flow,
    },
    hdr::{eth, frame, get_addr, get_u16, ipv4},
    mapping::{kernel_flow_live, mapping_expiry, remote_tag, translated_key},
    maps::{
        Admit, Config, Counter, Endpoint, FLAG_HAIRPIN, FLAG_MAPPED, FLAG_PORT_FORWARD, FlowEntry,
        FlowKey, IPPROTO_ICMP, IPPROTO_TCP, PortForwardTarget,
    },
    nat::forwardable_addr,
};

use aya_ebpf::{
    bindings::{BPF_ANY, BPF_NOEXIST, xdp_action},
    macros::map,
    maps::PerCpuArray,
    programs::XdpContext,
};

use crate::{
    Packed, Step, Verdict, debug_log,
    flow::Xlat,
    hop::{forward_egress, reverse_egress, source_reachable_via},
    mapping::{self, MapClaim},
    maps::{CONNTRACK, EEXIST, KERNEL_FLOWS, event, port_forward, remove_counted, stale},
    parse::{self, Ingress, Packet, header},
};

/// What opens a flow when the lookup misses. How exactly (a hairpin, a
/// mapping's inbound flow) is noted in `Scratch::kind` instead: a value in
/// map memory, which the verifier does not track, so the phases after
/// admission are walked once per variant here, not once per kind.
#[derive(Clone, Copy)]
pub enum NewFlow {
    /// From the LAN: masqueraded to the WAN or hairpinned back into the
    /// LAN (port chosen after the route check).
    Masquerade,
    /// From the WAN: through a port-forward rule or a NAT mapping that the
    /// filtering lets it in.
    PortForward,
}

/// `Scratch::kind`: a plain masquerade or port-forward flow.
const KIND_PLAIN: u8 = 0;
/// `Scratch::kind`: a LAN flow to the WAN address hairpinned into the LAN.
const KIND_HAIRPIN: u8 = 1;
/// `Scratch::kind`: a WAN flow let in by a NAT mapping's filtering.
const KIND_INBOUND_MAPPING: u8 = 2;

/// Notes how the new flow is opened (`Scratch::kind`).
#[inline(always)]
fn note_kind(kind: u8) -> Step<()> {
    if write_kind(kind) {
        Ok(())
    } else {
        Err(Verdict::pass(Counter::PassPortsExhausted))
    }
}

// BPF subprograms of their own (the miss path only), as is every access
// to `SCRATCH`: its lookup key would take a slot of the entry point's
// frame, whose call chains are at the verifier's 512-byte stack limit.
#[inline(never)]
fn write_kind(kind: u8) -> bool {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    unsafe { (*s).kind = kind };
    true
}

/// Whether a LAN flow noted in `Scratch::kind` leaves where its kind
/// says (the WAN, or the LAN for a hairpin); if so, records its
/// destination after translation in `Scratch::target`.
#[inline(never)]
fn leaves_right(cfg: &Config, xlat: &Xlat, proto: u8, egress: u32) -> bool {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    let out = if s.kind == KIND_HAIRPIN {
        cfg.lan_ifindex
    } else {
        cfg.wan_ifindex
    };
    if egress != out {
        return false;
    }
    s.target = Endpoint {
        addr: xlat.dst,
        port: xlat.dport,
        proto,
        pad: 0,
    };
    true
}

/// The packet's source endpoint as [`Endpoint::bits`].
#[inline(always)]
fn sender_bits(pkt: &Packet) -> u64 {
    Endpoint {
        addr: pkt.src,
        port: pkt.sport,
        proto: pkt.proto,
        pad: 0,
    }
    .bits()
}

/// Decides whether a packet of no known flow opens one, and sets the
/// translation known so far (the port of a masqueraded or hairpinned flow
/// is chosen in [`commit`], once the route is known). Else the kernel's.
#[inline(always)]
pub fn admit(
    ctx: &XdpContext,
    key: &FlowKey,
    pkt: &Packet,
    side: Ingress<'_>,
    xlat: &mut Xlat,
    now: u64,
) -> Step<NewFlow> {
    if side.cfg.admit == Admit::Kernel as u8 {
        // Offload mode: netfilter decides about new flows (firewall, NAT,
        // helpers); the daemon offloads them once established.
        return Err(Verdict::pass(Counter::PassNotOffloaded));
    }
    if pkt.proto == IPPROTO_TCP && !tcp_opens_flow(pkt.seg.flags) {
        // Mid-stream segment of an unknown flow: a fresh mapping could
        // not carry it; the kernel's (netfilter's) business.
        let c = if side.from_lan {
            Counter::PassNoFlow
        } else {
            Counter::PassUnsolicited
        };
        return Err(Verdict::pass(c));
    }
    // Also true of 0.0.0.0 while the WAN has no address: a LAN packet to it
    // is refused below (a martian destination), a WAN one too.
    let to_wan_addr = pkt.dst == side.cfg.wan_addr && pkt.proto != IPPROTO_ICMP;
    // A martian source (RFC 1812 5.3.7: 0/8, 127/8, multicast, 240/4)
    // opens no flow from either side: NAT would translate it like a LAN
    // host's, or a port forward would answer it. The kernel's rules decide
    // (Linux drops loopback, multicast and broadcast sources).
    if !forwardable_addr(pkt.src) {
        return Err(Verdict::pass(Counter::PassFibNotForwarded));
    }
    if side.from_lan {
        // Multicast, broadcast, loopback...: not for the FIB's default
        // route. No flow is made to one, so its later packets never hit.
        if !forwardable_addr(pkt.dst) {
            return Err(Verdict::pass(Counter::PassFibNotForwarded));
        }
        // A source the FIB does not route back out of the LAN is not a LAN
        // host's own (BCP 38 / RFC 2827 ingress filtering, RFC 3704 strict
        // reverse path; the IPv6 path's `source_valid` is the same): a
        // spoofed or foreign address, whose masqueraded flow would carry
        // replies to it, and the router's own addresses. Dropped: the
        // kernel's slow-path masquerade would translate it too, as its
        // `rp_filter` in loose mode (Linux's usual) lets it in. One FIB
        // lookup per packet that would open a flow, none per hit.
        if lan_source_reachable(ctx, side.cfg.lan_ifindex) == Some(false) {
            return Err(Verdict::drop(Counter::DropSpoofedSource));
        }
        // A flow this path could not open earlier went to the kernel's NAT,
        // which chose its port: it stays there while it lives, or it would
        // leave with another port once one of ours comes free (RFC 4787
        // REQ-11). Asked after the source check: a spoofed source's marker
        // (a fragment's, written unchecked) opens nothing.
        if left_to_kernel(key, side.cfg, now) {
            return Err(Verdict::pass(Counter::PassKernelFlow));
        }
        if !side.cfg.has_wan_addr() {
            // The WAN has no IPv4 address (the daemon wrote 0.0.0.0 when
            // it lost it): nothing to masquerade to. The kernel gets it,
            // whose masquerade drops such packets, as standalone mode's
            // slow-path table does. Before the FIB is asked (a branch on
            // the paths after it costs the verifier a fifth of its
            // budget): one to the router itself counts here too.
            return Err(Verdict::pass(Counter::PassNoWanAddr));
        }
        xlat.src = side.cfg.wan_addr;
        let mut kind = KIND_PLAIN;
        if to_wan_addr {
            // Hairpinning (RFC 4787 REQ-9, RFC 5382 REQ-8): to a port
            // forward, or to a mapping as its filtering allows (the remote
            // being the WAN address). Else it is for the router itself:
            // the FIB says local and it is passed.
            if let Some(target) = port_forward(pkt.proto, pkt.dport) {
                xlat.dst = target.addr;
                xlat.dport = target.port;
                kind = KIND_HAIRPIN;
            } else if mapping::inbound(
                side.cfg,
                sender_bits(pkt),
                u32::from(pkt.dport) | mapping::HAIRPIN,
                now,
                xlat,
            ) {
                kind = KIND_HAIRPIN;
            }
        }
        note_kind(kind)?;
        return Ok(NewFlow::Masquerade);
    }
    // From the WAN with the router's own address as source: spoofed (a
    // martian, RFC 1812 5.3.7), whose reply entry could be a hairpinned
    // flow's; or to a martian destination (0.0.0.0: the WAN address while
    // it has none). It opens nothing; the kernel drops it.
    if !to_wan_addr || pkt.src == side.cfg.wan_addr || !forwardable_addr(pkt.dst) {
        return Err(Verdict::pass(Counter::PassUnsolicited));
    }
    let kind = if let Some(target) = port_forward(pkt.proto, pkt.dport) {
        xlat.dst = target.addr;
        xlat.dport = target.port;
        KIND_PLAIN
    } else if mapping::inbound(side.cfg, sender_bits(pkt), u32::from(pkt.dport), now, xlat) {
        KIND_INBOUND_MAPPING
    } else {
        // Unsolicited: the router's own stack answers (RST, port
        // unreachable) or a local service takes it.
        return Err(Verdict::pass(Counter::PassUnsolicited));
    };
    // A source that lives behind the LAN cannot arrive on the WAN: spoofed
    // (RFC 1812 5.3.8, BCP 38 ingress filtering). Forwarded, it would
    // reach a LAN service that trusts its LAN with a LAN source, and its
    // tuple could be a hairpinned flow's. It opens nothing; the kernel
    // decides (`rp_filter` drops it). Asked only of a packet that would
    // open a flow, after the rule or mapping that lets it in.
    if wan_source_in_lan(ctx, side.cfg.lan_ifindex) {
        return Err(Verdict::pass(Counter::PassUnsolicited));
    }
    note_kind(kind)?;
    Ok(NewFlow::PortForward)
}

/// The port-forward rule that matches the WAN packet `ip` (to port
/// `dport`) in standalone mode: TCP or UDP to the WAN address from a
/// source that may open a flow (not a martian, RFC 1812 5.3.7, nor the WAN
/// address itself), as [`admit`] checks it. For the paths that answer
/// such a packet without opening its flow (Time Exceeded, Fragmentation
/// Needed). Admission also asks a TCP segment to be a SYN and the source
/// not to live behind the LAN ([`wan_source_in_lan`], a FIB lookup): a
/// caller whose packet admission did not judge checks those itself.
#[inline(always)]
pub fn forward_rule(cfg: &Config, ip: &[u8; ipv4::LEN], dport: u16) -> Option<PortForwardTarget> {
    let src = get_addr(ip, ipv4::SRC);
    let proto = ip[ipv4::PROTO];
    if cfg.admit != Admit::Xdp as u8
        || proto == IPPROTO_ICMP
        || !cfg.is_wan_addr(get_addr(ip, ipv4::DST))
        || src == cfg.wan_addr
        || !forwardable_addr(src)
    {
        return None;
    }
    port_forward(proto, dport)
}

/// Whether the LAN flow `key` is one this path left to the kernel's
/// slow-path NAT ([`leave_to_kernel`]) and still lives there
/// (`kernel_flow_live`, from its last LAN packet); if so, this packet at
/// `now` is its last.
// BPF subprograms of their own (this and the next), called on the miss
// path only: the lookup's key pointer and the map value stay off the
// entry point's frame.
#[inline(never)]
fn left_to_kernel(key: &FlowKey, cfg: &Config, now: u64) -> bool {
    let Some(last) = KERNEL_FLOWS.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: map value pointer, valid for this run; a plain integer that
    // another CPU's write can at worst make a little older.
    let last = unsafe { &mut *last };
    if !kernel_flow_live(*last, now, key.proto, &cfg.timeouts) {
        return false;
    }
    *last = now;
    true
}

/// Leaves the LAN flow `key`, whose packet at `now` this path could not
/// open a flow for, to the kernel's slow-path NAT: the kernel chooses its
/// port, and [`left_to_kernel`] keeps its later packets there (RFC 4787
/// REQ-11: a mapping does not change mid-session). A full map pushes
/// out its oldest flow (then only that flow may change mapping later).
/// Not a flow to the WAN address (a hairpin): the slow path does not
/// translate it back into the LAN (the router's own stack gets it), so
/// its next packet is better off trying this path again; nor one from it
/// (a forged source, dropped: [`unsolicited`]).
#[inline(never)]
pub fn leave_to_kernel(key: &FlowKey, cfg: &Config, now: u64) {
    if key.dst_addr == cfg.wan_addr || key.src_addr == cfg.wan_addr {
        return;
    }
    let _ = KERNEL_FLOWS.insert(key, &now, u64::from(BPF_ANY));
}

/// Whether the source of the IPv4 packet of `ctx`, from the LAN, is
/// reachable out of the LAN interface (`lan_ifindex`): the reverse path
/// (RFC 3704 2.2), asked from the router's own perspective as `rp_filter`
/// asks it ([`source_reachable_via`]: a policy rule on the LAN's incoming
/// interface does not apply), as the IPv6 path's `v6::source_valid`;
/// `None` with forwarding off on the LAN (not judged).
// BPF subprograms of their own (this and the next), called from the entry
// point on the miss path only: their FIB parameters stay off the entry
// point's frame, whose call chains are at the verifier's 512 bytes.
#[inline(never)]
pub fn lan_source_reachable(ctx: &XdpContext, lan_ifindex: u32) -> Option<bool> {
    let Ok(ip) = header::<{ ipv4::LEN }>(ctx, frame::IPV4) else {
        return Some(false);
    };
    source_reachable_via(ctx, ip, lan_ifindex)
}

/// Whether the FIB sends a reply to the source of the IPv4 packet of `ctx`,
/// from the WAN, out of the LAN interface (`lan_ifindex`): a lookup as the
/// kernel routes that reply, whatever the LAN's forwarding setting (an
/// output lookup restricted to the LAN answers nothing with forwarding off
/// there, which would let a spoofed LAN source through).
#[inline(never)]
pub fn wan_source_in_lan(ctx: &XdpContext, lan_ifindex: u32) -> bool {
    let Ok(ip) = header::<{ ipv4::LEN }>(ctx, frame::IPV4) else {
        return false;
    };
    reverse_egress(ctx, ip) == Some(lan_ifindex)
}

/// Standalone mode's forward policy from the WAN (and from the LAN, the
/// router's WAN address as a source), applied to the verdict `v` of every
/// passed packet: XDP alone decides what reaches the LAN (replies of
/// known flows, port forwards), so a packet the data path passes to the
/// kernel untranslated from the WAN may only be one for the router itself.
/// One the FIB would forward out of the LAN interface (unsolicited: TCP
/// without SYN, UDP, pings, ICMP errors quoting no known flow, other
/// protocols, fragments, options, all addressed to a LAN host) is dropped
/// and counted instead. Runs on passed packets only, so the hit path does
/// not pay for it; offload mode keeps passing (the kernel's firewall
/// decides).
// A BPF subprogram of its own: its FIB parameters stay off the entry
// point's frame, which the hit path's subprograms (`track`, `claim_port`)
// add to; the combined stack of a call chain must stay within 512 bytes.
#[inline(never)]
pub fn unsolicited(ctx: &XdpContext, v: Packed) -> Packed {
    judge_unsolicited(ctx, v.unpack()).pack()
}

/// [`unsolicited`]'s judgement.
#[inline(always)]
fn judge_unsolicited(ctx: &XdpContext, v: Verdict) -> Verdict {
    // Not IPv4, not configured: no header to judge (priority tags are
    // stripped before: `crate::tagged`). No neighbour, or too large for the
    // next hop: the packet was translated to its LAN host by a flow (a
    // reply or a port forward) and is passed for the kernel to resolve the
    // neighbour or fragment it. Judged, though, is a frame not addressed to
    // the interface's own MAC (`pass_not_for_us`): the kernel forwards one
    // that a device on top of the WAN takes (a keepalived `use_vmac`
    // macvlan while this router is a backup); any other it drops anyway.
    if v.action != xdp_action::XDP_PASS
        || matches!(
            v.counter,
            Counter::PassNotIpv4
                | Counter::PassNotConfigured
                | Counter::PassNoNeighbour
                | Counter::PassMtuTranslated
        )
    {
        return v;
    }
    let Some(side) = parse::ingress(ctx) else {
        return v;
    };
    if side.cfg.admit != Admit::Xdp as u8 {
        return v;
    }
    // IPv4 only: IPv6 has its own (`v6::judge_passed`), and an IPv6
    // header read as IPv4 would put source address bytes where the
    // destination is judged.
    let Ok(l2) = header::<{ eth::LEN }>(ctx, 0) else {
        return v;
    };
    if get_u16(l2, eth::ETHER_TYPE) != eth::P_IPV4 {
        return v;
    }
    let Ok(ip) = header::<{ ipv4::LEN }>(ctx, frame::IPV4) else {
        return v;
    };
    if side.from_lan {
        // A LAN packet with the WAN address as its source that this path
        // did not translate itself (those passed translated left above): a
        // LAN host forging the router's address (BCP 38). The kernel would
        // forward it, as attach sets `accept_local` for the translated
        // ones, and the slow-path NAT leaves the WAN address alone: it
        // would leave as the router's own packet, with a port the sender
        // chose, which may be another host's mapping (a datagram injected
        // into its session, a RST).
        return if side.cfg.is_wan_addr(get_addr(ip, ipv4::SRC)) {
            Verdict::drop(Counter::DropSpoofedSource)
        } else {
            v
        };
    }
    // Flows of the WAN address (replies, port forwards, the kernel slow
    // path's) are translated by XDP or the kernel's NAT: the kernel's.
    if side.cfg.is_wan_addr(get_addr(ip, ipv4::DST)) {
        return v;
    }
    if forward_egress(ctx, ip) == Some(side.cfg.lan_ifindex) {
        return Verdict::drop(Counter::DropUnsolicited);
    }
    v
}

/// Writes both entries of a new flow opened by the segment `open` (its
/// TCP fields start the window tracking) leaving on `egress`; for a
/// masqueraded flow, claims its WAN port first and completes `xlat`.
#[inline(always)]
pub fn commit(
    new: NewFlow,
    key: &FlowKey,
    open: &Segment,
    cfg: &Config,
    egress: u32,
    xlat: &mut Xlat,
    now: u64,
) -> Step<()> {
    match new {
        NewFlow::Masquerade => {
            if !leaves_right(cfg, xlat, key.proto, egress) {
                // LAN -> LAN or another interface: plain routing, not NAT.
                return Err(Verdict::pass(Counter::PassNoFlow));
            }
            // Few values live across these calls: a spill would grow the
            // entry point's frame, whose call chains are at the verifier's
            // 512-byte limit.
            // What this path cannot open goes to the kernel's NAT, and
            // stays there ([`leave_to_kernel`]).
            let claimed = claim_mapping(cfg, key, now);
            if claimed & MAPPING_CLAIMED == 0 {
                debug_log::ports_exhausted(key);
                leave_to_kernel(key, cfg, now);
                return Err(Verdict::pass(Counter::PassPortsExhausted));
            }
            let claimed = claim_port(cfg, key, open, claimed, now);
            if claimed == TUPLE_TAKEN {
                leave_to_kernel(key, cfg, now);
                return Err(Verdict::pass(Counter::PassReplyTupleTaken));
            }
            if claimed == 0 {
                debug_log::ports_exhausted(key);
                leave_to_kernel(key, cfg, now);
                return Err(Verdict::pass(Counter::PassPortsExhausted));
            }
            #[expect(clippy::cast_possible_truncation, reason = "the port's 16 bits")]
            let port = claimed as u16;
            xlat.sport = port;
            if key.proto == IPPROTO_ICMP {
                xlat.dport = port;
            }
            debug_log::masqueraded(key, xlat.src, xlat.sport);
        }
        NewFlow::PortForward => {
            let translated = FlowKey::new(xlat.src, xlat.dst, xlat.sport, xlat.dport, key.proto);
            match insert_port_forward(key, &translated, open, cfg, now) {
                Claim::Done => {}
                Claim::Taken | Claim::TupleTaken => {
                    return Err(Verdict::pass(Counter::PassReplyTupleTaken));
                }
                // The map refused (out of memory): leave it to the kernel.
                Claim::Failed => return Err(Verdict::pass(Counter::PassPortsExhausted)),
            }
            debug_log::port_forwarded(key, xlat.dst, xlat.dport);
        }
    }
    Ok(())
}

/// Chooses and claims the NAT mapping of a new LAN flow's endpoint: the
/// live one it has (endpoint-independent mapping), else a new one: probes
/// a bounded number of candidate ports (port preservation first, see
/// `candidate_port`); a port with a live mapping of another endpoint is a
/// collision, one reserved by a port-forward rule is skipped. Returns the
/// port with [`MAPPING_CLAIMED`] (and [`MAPPING_FRESH`] for a new
/// mapping), or 0.
// A BPF subprogram of its own, called from the entry point, apart from
// `claim_port`: the chain entry -> claim_port -> try_port is at the
// verifier's 512-byte combined stack.
#[inline(never)]
fn claim_mapping(cfg: &Config, key: &FlowKey, now: u64) -> u32 {
    let ep = &Endpoint::source_of(key);
    let expires = mapping_expiry(
        key.proto,
        initial_state(key.proto) as u8,
        now,
        &cfg.timeouts,
    );
    // The new flow's remote (for a hairpin, the WAN address and mapped
    // port it sent to): the setter of the mapping if it creates or extends
    // it.
    let tag = remote_tag(key.dst_addr, key.dst_port);
    if let Some(port) = mapping::current_port(ep, now) {
        // Extends it if this flow needs it longer.
        let _ = mapping::claim(ep, port, expires, now, tag);
        return MAPPING_CLAIMED | u32::from(port);
    }
    let hash = endpoint_hash(key, cfg.hash_seed);
    for attempt in 0..MAX_PORT_PROBES {
        let port = candidate_port(attempt, key.src_port, hash, cfg.port_min, cfg.port_max);
        if key.proto != IPPROTO_ICMP
            && port_forward(key.proto, port)
                .is_some_and(|t| t.addr != key.src_addr || t.port != key.src_port)
        {
            // Reserved for inbound flows by a port-forward rule to another
            // endpoint (not a collision with another flow: not counted). A
            // rule to this very endpoint does not keep it from its own
            // port: it leaves from the port the WAN reaches it on (as the
            // kernel's masquerade keeps a free port), so a peer it talks to
            // that sends to the forward hits this flow's reply entry.
            continue;
        }
        match mapping::claim(ep, port, expires, now, tag) {
            MapClaim::New => return MAPPING_CLAIMED | MAPPING_FRESH | u32::from(port),
            MapClaim::Held => return MAPPING_CLAIMED | u32::from(port),
            MapClaim::Taken => event(Counter::PortCollision),
            MapClaim::Failed => return 0,
        }
    }
    0
}

/// [`claim_port`]: the packet's own tuple is a live flow's
/// (`Claim::TupleTaken`); no port claimed.
const TUPLE_TAKEN: u32 = 1 << 18;
/// [`claim_mapping`] found a port (in the low 16 bits).
const MAPPING_CLAIMED: u32 = 1 << 16;
/// ... and the mapping is new (released again if the flow fails).
const MAPPING_FRESH: u32 = 1 << 17;

/// Claims the conntrack entries of a new LAN flow leaving with the port of
/// the mapping `claimed` ([`claim_mapping`]'s result) with [`try_port`],
/// records the mapping and counts the new flow; returns `claimed` if that
/// worked, else 0 (a `u32`, not an `Option`: that would be returned
/// through a pointer, a sixth argument, which BPF calls cannot pass). The caller has set `Scratch::target` and `Scratch::kind`.
// A BPF subprogram of its own, like `track`.
#[inline(never)]
fn claim_port(cfg: &Config, key: &FlowKey, open: &Segment, claimed: u32, now: u64) -> u32 {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    (s.orig.tcp, s.reply.tcp) = open_tracking(key.proto, open);
    #[expect(clippy::cast_possible_truncation, reason = "the port's 16 bits")]
    let port = claimed as u16;
    let ep = &Endpoint::source_of(key);
    match try_port(cfg, key, port, now) {
        Claim::Done => {
            mapping::bind(ep, port, cfg.filtering, key.dst_addr);
            event(if s.kind == KIND_HAIRPIN {
                Counter::FlowNewHairpin
            } else {
                Counter::FlowNewMasquerade
            });
            claimed
        }
        // The mapping's port is right but that exact tuple is another
        // flow's (a previous owner's flow still alive): rare; the kernel's
        // slow path takes this flow rather than the mapping changing.
        Claim::Taken | Claim::Failed => {
            event(Counter::PortCollision);
            if claimed & MAPPING_FRESH != 0 {
                mapping::release(ep, port);
            }
            0
        }
        // Not the port's fault: another port would not help.
        Claim::TupleTaken => {
            if claimed & MAPPING_FRESH != 0 {
                mapping::release(ep, port);
            }
            TUPLE_TAKEN
        }
    }
}

#[repr(u32)]
enum Claim {
    Done,
    /// The reply tuple is a live flow's.
    Taken,
    /// The packet's own tuple is a live flow's entry of the other side
    /// (see [`insert_pair`]).
    TupleTaken,
    /// The map refused (out of memory or similar): no point probing on.
    Failed,
}

/// Entries of a flow being created: kept in a per-CPU map, not on the
/// 512-byte BPF stack.
#[repr(C)]
struct Scratch {
    orig: FlowEntry,
    reply: FlowEntry,
    reply_key: FlowKey,
    /// The flow's destination after translation: its own (masquerade) or
    /// the LAN endpoint it is hairpinned to.
    target: Endpoint,
    /// How the flow is opened: `KIND_*` (see [`NewFlow`]).
    kind: u8,
}

#[map(name = "SCRATCH")]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Claims `port` for the flow `key`: inserting the reply entry with
/// `BPF_NOEXIST` is the cross-CPU lock on the WAN tuple. A taken port whose
/// entry expired or lost its other half is reclaimed. Then inserts the
/// original entry.
#[inline(never)]
fn try_port(cfg: &Config, key: &FlowKey, port: u16, now: u64) -> Claim {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return Claim::Failed;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    let (translated, flags) = if s.kind == KIND_HAIRPIN {
        (
            translated_key(key, cfg.wan_addr, port, Some(&s.target)),
            FLAG_MAPPED | FLAG_HAIRPIN,
        )
    } else {
        (translated_key(key, cfg.wan_addr, port, None), FLAG_MAPPED)
    };
    fill_new_flow(
        key,
        &translated,
        flags,
        now,
        &mut s.orig,
        &mut s.reply_key,
        &mut s.reply,
    );
    insert_pair(cfg, key, s, now)
}

/// Inserts the new flow's entries built in `s`: the reply entry with
/// `BPF_NOEXIST` (a taken one whose entry expired or lost its other half
/// is reclaimed; a live one is `Claim::Taken`), then the original under
/// `key`, also with `BPF_NOEXIST`: the lookup missed, but an entry of the
/// other side may hold that tuple (a hairpinned flow's LAN-side original
/// entry, or a masqueraded flow's WAN-side reply entry, replayed from the
/// other interface with a spoofed source). Only an expired one is
/// replaced; a live one keeps its tuple, also when its other half was
/// evicted (its next packet puts that back) (`Claim::TupleTaken`: the reply entry just
/// inserted is removed again), as the kernel's conntrack refuses a
/// clashing tuple and as step 2 of docs/architecture.md "Per packet" says a tuple of
/// the other side is never translated.
#[inline(always)]
fn insert_pair(cfg: &Config, key: &FlowKey, s: &Scratch, now: u64) -> Claim {
    let mut rc = CONNTRACK.insert(&s.reply_key, &s.reply, u64::from(BPF_NOEXIST));
    if rc == Err(EEXIST) && stale(cfg, &s.reply_key, now) {
        remove_counted(&s.reply_key);
        event(Counter::FlowExpiredReplaced);
        rc = CONNTRACK.insert(&s.reply_key, &s.reply, u64::from(BPF_NOEXIST));
    }
    match rc {
        Ok(()) => event(Counter::CtEntriesInserted),
        Err(EEXIST) => return Claim::Taken,
        Err(_) => return Claim::Failed,
    }
    let mut rc = CONNTRACK.insert(key, &s.orig, u64::from(BPF_NOEXIST));
    if rc == Err(EEXIST) {
        // SAFETY: map value reference, valid for this run; two fields read.
        let live = unsafe { CONNTRACK.get(key) }
            .is_some_and(|e| !expired(e.state, e.last_seen_ns, now, &cfg.timeouts));
        if live {
            remove_counted(&s.reply_key);
            return Claim::TupleTaken;
        }
        // Overwritten in place, not counted: inserted - removed - present
        // then estimates the LRU's evictions.
        rc = CONNTRACK.insert(key, &s.orig, u64::from(BPF_ANY));
    } else if rc.is_ok() {
        event(Counter::CtEntriesInserted);
    }
    if rc.is_err() {
        remove_counted(&s.reply_key);
        return Claim::Failed;
    }
    Claim::Done
}

/// Inserts both entries of a flow opened from the WAN (a port-forward
/// rule's, or a mapping's: `Scratch::kind`) and counts it. Its reply
/// tuple (the LAN endpoint towards the remote one) may already be a live
/// flow's own, when the LAN endpoint talks to the same remote endpoint
/// through its mapping: that flow keeps its entry (`Claim::Taken`), as the
/// kernel's conntrack refuses a clashing tuple; a stale one is replaced.
#[inline(never)]
fn insert_port_forward(
    key: &FlowKey,
    translated: &FlowKey,
    open: &Segment,
    cfg: &Config,
    now: u64,
) -> Claim {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return Claim::Failed;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    let (flags, counter) = if s.kind == KIND_INBOUND_MAPPING {
        (
            FLAG_PORT_FORWARD | FLAG_MAPPED,
            Counter::FlowNewInboundMapping,
        )
    } else {
        (FLAG_PORT_FORWARD, Counter::FlowNewPortForward)
    };
    (s.orig.tcp, s.reply.tcp) = open_tracking(key.proto, open);
    fill_new_flow(
        key,
        translated,
        flags,
        now,
        &mut s.orig,
        &mut s.reply_key,
        &mut s.reply,
    );
    let claim = insert_pair(cfg, key, s, now);
    if matches!(claim, Claim::Done) {
        event(counter);
    }
    claim
}
