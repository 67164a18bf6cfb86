//! ICMP errors the data path sends itself about a packet to the WAN
//! address of a flow it carries (not an offloaded one), where the kernel's NAT would have
//! translated the packet, found it undeliverable while forwarding, and
//! sent the error with its quote translated back:
//! - Time Exceeded ([`time_exceeded`]): its TTL ran out here (RFC 1812
//!   5.3.1);
//! - Fragmentation Needed ([`fragmentation_needed`], called by
//!   [`crate::oversize`]): larger than the next hop's MTU with DF set
//!   (RFC 1191, RFC 1812 5.2.7.1), so that the remote's path MTU
//!   discovery works.
//!
//! Such a packet is addressed to the WAN address: passed to the kernel as
//! it is, it would be taken as the router's own (TTL is not checked for
//! local delivery, nor the next hop's MTU), and the router's stack, which
//! knows nothing of the data path's flows, would answer as the endpoint: a
//! TCP RST that the remote accepts (a TTL-limited probe or one oversize
//! segment over a live connection resets it), a port unreachable for UDP.
//! So the answer goes from the WAN address, quoting the packet as its
//! sender sent it, back out of the interface it came in on (the WAN; the
//! LAN for a hairpinned flow's packet) to the MAC the packet came from. Rate-limited per CPU at
//! Linux's global defaults for its ICMP errors (`icmp_msgs_per_sec` 1000,
//! burst 50; Linux also limits each destination, this does not): past the
//! limit the packet is dropped unanswered. A later fragment is never
//! answered.
//!
//! Time Exceeded also answers a WAN packet of no flow yet that a
//! port-forward rule would open (a TTL-limited SYN to a forwarded port).
//! Left to the kernel as before (`pass_ttl_exceeded`): LAN packets other
//! than a hairpinned flow's (the kernel forwards them and answers the LAN
//! host itself; a hairpin's first packet too), other packets of
//! no flow the data path carries (the router's own traffic: a traceroute to
//! its WAN address gets the kernel's port unreachable), offloaded flows'
//! (the kernel's conntrack translates them), and a header with a wrong
//! checksum (the kernel drops it, RFC 1812 5.2.2).

use aya_ebpf::{
    helpers::{bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    macros::map,
    maps::PerCpuArray,
    programs::XdpContext,
};
use router_common::{
    flow::tcp_opens_flow,
    hdr::{eth, frame, ipv4, tcp},
    maps::{Counter, IPPROTO_TCP, VMAC_IPV4},
    nat::{
        ICMP_ANSWER_LEN, ICMP_ANSWER_RECEIVED_AT, IcmpAnswer, fragment_is_first,
        header_checksum_ok, icmp_answer,
    },
};

use crate::{
    Packed, Verdict, admit,
    flow::{self, StackKey},
    maps::DEVICES,
    parse::{self, Ingress, header},
};

/// Linux's `icmp_msgs_per_sec` default: the steady rate of answers, per
/// CPU here.
const ANSWERS_PER_SEC: u64 = 1000;
/// Linux's `icmp_msgs_burst` default: answers in a burst.
const ANSWER_BURST: u64 = 50;

/// A token bucket of answers: what is left, and when it was last filled
/// (see `router_common::maps::ICMP_ANSWER_BUDGET_MAP`).
#[repr(C)]
struct AnswerBudget {
    tokens: u64,
    filled_ns: u64,
}

/// Per CPU: the answers this CPU may still send (see [`AnswerBudget`]).
#[map(name = "ICMP_ANSWER_BUDGET")]
static ICMP_ANSWER_BUDGET: PerCpuArray<AnswerBudget> = PerCpuArray::with_max_entries(1, 0);

/// Answers the packet of `ctx`, passed as `v` (`pass_ttl_exceeded`), with
/// an ICMP Time Exceeded if it is a packet to the WAN address of a flow
/// the data path carries (from the WAN, or a hairpinned one from the
/// LAN; see [`flow_of`]); else `v`.
// A BPF subprogram, called from the entry point for such packets only: its
// frame stays off the entry point's, whose call chains are at the
// verifier's 512 bytes.
#[inline(never)]
pub fn time_exceeded(ctx: &XdpContext, v: Packed) -> Packed {
    answer_time_exceeded(ctx, v.unpack()).pack()
}

/// [`time_exceeded`]'s answer.
#[inline(always)]
fn answer_time_exceeded(ctx: &XdpContext, v: Verdict) -> Verdict {
    let Some(now) = flow_of(ctx) else {
        return v;
    };
    if !within_budget(now) {
        return Verdict::drop(Counter::DropTtlExceeded);
    }
    build(
        ctx,
        IcmpAnswer::TimeExceeded,
        Counter::DropTtlExceededAnswered,
    )
    .unwrap_or(v)
}

/// Answers the packet of `ctx`, received at `now` (to the WAN address, of
/// a flow the data path carries or a port forward's first, with DF set,
/// larger than the next hop's MTU `mtu`), with an ICMP Fragmentation
/// Needed. Dropped unanswered past the
/// rate limit or should the frame not be resizable: passed, it would be
/// taken as the router's own (see the module's text).
#[inline(always)]
pub fn fragmentation_needed(ctx: &XdpContext, now: u64, mtu: u16) -> Verdict {
    if !within_budget(now) {
        return Verdict::drop(Counter::DropFragNeeded);
    }
    let answered = Counter::DropFragNeededAnswered;
    build(ctx, IcmpAnswer::FragmentationNeeded { mtu }, answered)
        .unwrap_or(Verdict::drop(Counter::DropFragNeeded))
}

/// The time of the packet, if it is a WAN packet of a flow the data path
/// carries (the hit of its side, not offloaded) or would open through a
/// port-forward rule, or a LAN packet of a hairpinned flow (to the WAN
/// address), with a right header checksum, addressed to the router's MAC.
#[inline(always)]
fn flow_of(ctx: &XdpContext) -> Option<u64> {
    let eth: &[u8; eth::LEN] = header(ctx, 0).ok()?;
    let ip: &[u8; ipv4::LEN] = header(ctx, frame::IPV4).ok()?;
    let side = parse::ingress(ctx)?;
    // From the LAN only a hairpinned flow's: addressed to the WAN address,
    // the router's stack would take it as its own (a TCP segment answered
    // with a reset of the LAN host's connection, as `tcptraceroute` to the
    // service's public address from inside would cause). Others the kernel
    // forwards, and answers itself when their TTL runs out. A later
    // fragment is never answered (RFC 1812 4.3.2.7, RFC 1122 3.2.2): it
    // has no ports, and its payload read as ports could match a flow.
    if !header_checksum_ok(ip) || !fragment_is_first(ip) {
        return None;
    }
    parse::addressed_to_us(ctx, eth, side, VMAC_IPV4).ok()?;
    let (sport, dport) = parse::ports(ctx, ip, frame::L4, false).ok()??;
    let key = StackKey::of(ip, sport, dport);
    if side.from_lan {
        // A branch of its own, where the side is a constant: the side as a
        // value kept across the lookup grew this path's frame past the
        // combined stack limit of its call chain.
        if key.0.dst_addr != side.cfg.wan_addr {
            return None;
        }
        let lan = Ingress {
            cfg: side.cfg,
            from_lan: true,
        };
        return flow::own_hit(&key.0, lan).map(|(_, now)| now);
    }
    if let Some((_, now)) = flow::own_hit(&key.0, side) {
        return Some(now);
    }
    // No flow yet, but a port-forward rule of standalone mode would open
    // one (the kernel's NAT would translate it and find the TTL exhausted
    // on forwarding): a TTL-limited SYN or datagram to a forwarded port,
    // as tcptraceroute sends them, is answered too rather than taken by
    // the router's own stack. Judged as admission would (which a packet
    // whose TTL ran out never reaches): a TCP segment only if it is a SYN,
    // and not from a source that lives behind the LAN (spoofed).
    admit::forward_rule(side.cfg, ip, dport)?;
    if ip[ipv4::PROTO] == IPPROTO_TCP {
        let t: &[u8; tcp::LEN] = header(ctx, frame::L4).ok()?;
        if !tcp_opens_flow(t[tcp::FLAGS]) {
            return None;
        }
    }
    if admit::wan_source_in_lan(ctx, side.cfg.lan_ifindex) {
        return None;
    }
    Some(crate::clock::now())
}

/// Takes an answer from this CPU's budget, if one is left (refilled at
/// [`ANSWERS_PER_SEC`] up to [`ANSWER_BURST`] since the last fill).
#[inline(always)]
fn within_budget(now: u64) -> bool {
    let Some(b) = ICMP_ANSWER_BUDGET.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let b = unsafe { &mut *b };
    let earned = now.saturating_sub(b.filled_ns) / (1_000_000_000 / ANSWERS_PER_SEC);
    if earned > 0 {
        b.tokens = (b.tokens + earned).min(ANSWER_BURST);
        b.filled_ns = now;
    }
    if b.tokens == 0 {
        return false;
    }
    b.tokens -= 1;
    true
}

/// Turns the frame into the ICMP error `answer` ([`icmp_answer`]), sent
/// back and counted as `answered`: 28 bytes more room at its head, so the
/// received IPv4 header lands where the quote goes, and cut after the
/// quote. `None` if the frame cannot be resized (it is then as it came),
/// or the WAN has no address to answer from.
#[inline(always)]
fn build(ctx: &XdpContext, answer: IcmpAnswer, answered: Counter) -> Option<Verdict> {
    // Read before the resize, which ends every packet pointer.
    let cfg = parse::ingress(ctx)?.cfg;
    let own_addr = cfg.wan_addr;
    if !cfg.has_wan_addr() {
        // The WAN lost its address (a flow the daemon has yet to remove
        // gets here): no source to answer from.
        return None;
    }
    // Back out of the interface it came in on, through the `DEVICES` map
    // rather than `XDP_TX`: a veth passes `XDP_TX` frames to its peer only
    // when the peer runs an XDP program of its own (it kicks the peer's
    // receive queue for them only then), while a redirect's flush always
    // does; a NIC takes either.
    let action = DEVICES.redirect(ctx.ingress_ifindex() as u32, 0).ok()?;
    let len = ctx.data_end() - ctx.data();
    #[expect(clippy::cast_possible_wrap, reason = "frames are < 64 KiB")]
    let cut = (ICMP_ANSWER_LEN - ICMP_ANSWER_RECEIVED_AT) as i32 - len as i32;
    #[expect(clippy::cast_possible_wrap, reason = "28")]
    let room = ICMP_ANSWER_RECEIVED_AT as i32;
    // SAFETY: the program's own context; the helper checks the headroom.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -room) } != 0 {
        return None;
    }
    // The ports were read, so the frame holds at least the 42 bytes kept:
    // `cut` is 0 or less.
    // SAFETY: as above; shrinking to 70 bytes leaves a whole Ethernet header.
    if cut != 0 && unsafe { bpf_xdp_adjust_tail(ctx.ctx, cut) } != 0 {
        // SAFETY: gives back the room taken above: the frame as it came.
        unsafe { bpf_xdp_adjust_head(ctx.ctx, room) };
        return None;
    }
    // Exactly that long now; checked for the verifier. Resized, the frame
    // is no longer the one that came: dropped should this ever fail.
    let Ok(f) = header::<ICMP_ANSWER_LEN>(ctx, 0) else {
        return Some(Verdict::drop(Counter::DropTruncated));
    };
    icmp_answer(f, own_addr, answer);
    Some(Verdict {
        counter: answered,
        action,
    })
}
