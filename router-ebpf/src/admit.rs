//! Admission of new flows (standalone mode: XDP masquerades LAN flows and
//! opens port-forwarded WAN flows itself) and the commit of a new flow's
//! two conntrack entries.
//
// Kept apart from the hit path because who admits can change: with the
// kernel admitting (offload mode), `admit` passes every miss to the kernel
// and the offload daemon writes the entries that `commit` writes here.

use router_common::{
    flow::{
        MAX_PORT_PROBES, Segment, candidate_port, fill_new_flow, flow_hash, masquerade_key,
        open_tracking, tcp_opens_flow,
    },
    hdr::{frame, get_addr, ipv4},
    maps::{
        Admit, Config, Counter, FLAG_PORT_FORWARD, FlowEntry, FlowKey, IPPROTO_ICMP, IPPROTO_TCP,
    },
};

use aya_ebpf::{
    bindings::{BPF_NOEXIST, xdp_action},
    macros::map,
    maps::PerCpuArray,
    programs::XdpContext,
};

use crate::{
    Step, Verdict, debug_log,
    flow::Xlat,
    hop::forward_egress,
    maps::{CONNTRACK, EEXIST, event, insert_counted, port_forward, remove_counted, stale},
    parse::{self, Ingress, Packet, header},
};

/// What opens a flow when the lookup misses.
#[derive(Clone, Copy)]
pub enum NewFlow {
    /// LAN -> WAN: masquerade (port chosen after the route check).
    Masquerade,
    /// WAN -> LAN through a port-forward rule.
    PortForward,
}

/// Decides whether a packet of no known flow opens one, and sets the
/// translation known so far (the port of a masqueraded flow is chosen in
/// [`commit`], once the route is known). Else the kernel's.
#[inline(always)]
pub fn admit(pkt: &Packet, side: Ingress<'_>, xlat: &mut Xlat) -> Step<NewFlow> {
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
    if side.from_lan {
        xlat.src = side.cfg.wan_addr;
        return Ok(NewFlow::Masquerade);
    }
    if pkt.dst != side.cfg.wan_addr || pkt.proto == IPPROTO_ICMP {
        return Err(Verdict::pass(Counter::PassUnsolicited));
    }
    let Some(target) = port_forward(pkt.proto, pkt.dport) else {
        // Unsolicited: the router's own stack answers (RST, port
        // unreachable) or a local service takes it.
        return Err(Verdict::pass(Counter::PassUnsolicited));
    };
    xlat.dst = target.addr;
    xlat.dport = target.port;
    Ok(NewFlow::PortForward)
}

/// Standalone mode's forward policy from the WAN, applied to the verdict
/// `v` of every packet: XDP alone decides what reaches the LAN (replies of
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
pub fn unsolicited(ctx: &XdpContext, v: Verdict) -> Verdict {
    // Not IPv4, not configured: no header to judge. No neighbour: the
    // packet was translated to its LAN host by a flow (a reply or a port
    // forward) and is passed for the kernel to resolve the neighbour.
    if v.action != xdp_action::XDP_PASS
        || matches!(
            v.counter,
            Counter::PassNotIpv4 | Counter::PassNotConfigured | Counter::PassNoNeighbour
        )
    {
        return v;
    }
    let Some(side) = parse::ingress(ctx) else {
        return v;
    };
    if side.from_lan || side.cfg.admit != Admit::Xdp as u8 {
        return v;
    }
    let Ok(ip) = header::<{ ipv4::LEN }>(ctx, frame::IPV4) else {
        return v;
    };
    // Flows of the WAN address (replies, port forwards, the kernel slow
    // path's) are translated by XDP or the kernel's NAT: the kernel's.
    if get_addr(ip, ipv4::DST) == side.cfg.wan_addr {
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
            if egress != cfg.wan_ifindex {
                // LAN -> LAN or another interface: plain routing, not NAT.
                return Err(Verdict::pass(Counter::PassNoFlow));
            }
            let Some(port) = claim_port(cfg, key, open, now) else {
                debug_log::ports_exhausted(key);
                return Err(Verdict::pass(Counter::PassPortsExhausted));
            };
            xlat.sport = port;
            if key.proto == IPPROTO_ICMP {
                xlat.dport = port;
            }
            event(Counter::FlowNewMasquerade);
            debug_log::masqueraded(key, xlat.src, xlat.sport);
        }
        NewFlow::PortForward => {
            let translated = FlowKey::new(xlat.src, xlat.dst, xlat.sport, xlat.dport, key.proto);
            if !insert_port_forward(key, &translated, open, now) {
                // The map refused (out of memory): leave it to the kernel.
                return Err(Verdict::pass(Counter::PassPortsExhausted));
            }
            event(Counter::FlowNewPortForward);
            debug_log::port_forwarded(key, xlat.dst, xlat.dport);
        }
    }
    Ok(())
}

/// Chooses and claims the SNAT port of a new LAN flow. Probes a bounded
/// number of candidates (see [`try_port`]); a port reserved by a
/// port-forward rule is skipped.
// A BPF subprogram of its own, like `track`.
#[inline(never)]
fn claim_port(cfg: &Config, key: &FlowKey, open: &Segment, now: u64) -> Option<u16> {
    let s = SCRATCH.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    (s.orig.tcp, s.reply.tcp) = open_tracking(key.proto, open);
    let hash = flow_hash(key, cfg.hash_seed);
    for attempt in 0..MAX_PORT_PROBES {
        let port = candidate_port(attempt, key.src_port, hash, cfg.port_min, cfg.port_max);
        if key.proto != IPPROTO_ICMP && port_forward(key.proto, port).is_some() {
            // Reserved for inbound flows by a port-forward rule (not a
            // collision with another flow: not counted).
            continue;
        }
        match try_port(cfg, key, port, now) {
            Claim::Done => return Some(port),
            Claim::Taken => event(Counter::PortCollision),
            Claim::Failed => return None,
        }
    }
    None
}

#[repr(u32)]
enum Claim {
    Done,
    Taken,
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
    let translated = masquerade_key(key, cfg.wan_addr, port);
    fill_new_flow(
        key,
        &translated,
        0,
        now,
        &mut s.orig,
        &mut s.reply_key,
        &mut s.reply,
    );
    let mut rc = CONNTRACK.insert(&s.reply_key, &s.reply, u64::from(BPF_NOEXIST));
    if rc == Err(EEXIST) && stale(cfg, &s.reply_key, now) {
        remove_counted(&s.reply_key);
        event(Counter::FlowExpiredReplaced);
        rc = CONNTRACK.insert(&s.reply_key, &s.reply, u64::from(BPF_NOEXIST));
    }
    match rc {
        Ok(()) => {
            event(Counter::CtEntriesInserted);
            if insert_counted(key, &s.orig).is_err() {
                remove_counted(&s.reply_key);
                return Claim::Failed;
            }
            Claim::Done
        }
        Err(EEXIST) => Claim::Taken,
        Err(_) => Claim::Failed,
    }
}

/// Inserts both entries of a flow opened by a port-forward rule.
#[inline(never)]
fn insert_port_forward(key: &FlowKey, translated: &FlowKey, open: &Segment, now: u64) -> bool {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    (s.orig.tcp, s.reply.tcp) = open_tracking(key.proto, open);
    fill_new_flow(
        key,
        translated,
        FLAG_PORT_FORWARD,
        now,
        &mut s.orig,
        &mut s.reply_key,
        &mut s.reply,
    );
    insert_counted(&s.reply_key, &s.reply).is_ok() && insert_counted(key, &s.orig).is_ok()
}
