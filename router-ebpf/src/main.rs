//! XDP NAT fast path, attached to the LAN and the WAN interface.
//!
//! One inline core, [`try_router`], built from named phases:
//! parse (Ethernet, IPv4, L4: [`parse`]), conntrack lookup with state
//! tracking ([`flow::lookup`]), admission of a new flow ([`admit::admit`]:
//! masquerade from the LAN, port-forward rules from the WAN), next hop (the
//! flow's cached one or `bpf_fib_lookup`: [`flow::next_hop`]), commit of a
//! new flow's entries ([`admit::commit`]), the rewrite with incremental
//! checksum updates ([`flow::rewrite`]) and the L2 forwarding tail shared
//! with the ICMP error path ([`hop::forward_l2`], [`icmp_error`]); a
//! forwarded SYN's MSS is clamped last, from the entry point ([`mss`]). IPv4
//! fragments take a path of their own ([`fragment`]), as do packets with
//! IP options ([`ip_options`]), a WAN
//! packet of a flow whose TTL ran out ([`icmp_answer`]) and a flow's packet
//! larger than its next hop's MTU ([`oversize`]); IPv6 has its own core
//! ([`v6`]). In standalone mode a WAN frame with priority tags (VLAN id 0,
//! which the kernel strips) is judged by the packet inside ([`tagged`]).
//! Each phase either hands its result on or ends the packet with a
//! [`Verdict`]: everything not handled goes to the kernel with `XDP_PASS`
//! and a per-reason counter; malformed packets are dropped and counted. The
//! pure logic lives in `router-common` (flow, nat, checksum, hdr) and is
//! unit-tested on the host.
#![no_std]
#![no_main]
// Keep packet pointers in one frame: the verifier tracks their bounds best
// when everything is inlined into the entry point.
#![expect(
    clippy::inline_always,
    reason = "keep packet pointer tracking in one frame for the verifier"
)]
// Map keys and values go to the helpers by reference, so no copy lands on
// the 512-byte BPF stack.
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys by reference: no stack copies"
)]

mod admit;
mod clock;
mod debug_log;
mod egress_witness;
mod flow;
mod fragment;
mod hop;
mod icmp_answer;
mod icmp_error;
mod ip_options;
mod mapping;
mod maps;
mod mss;
mod oversize;
mod parse;
mod tagged;
mod v6;
mod verdict;

pub use verdict::{Packed, Step, Verdict};

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use router_common::{
    hdr::{eth, frame, get_u16, ipv4},
    mapping::outbound_refresh_due,
    maps::{Counter, FLAG_OFFLOADED, FlowKey, VMAC_IPV4},
};

use crate::{
    flow::Xlat,
    hop::{Hop, forward_l2},
    parse::{L4, header},
};

#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the #[xdp] macro passes the context by value"
)]
// The macro wraps this function in the program's entry point. Not inlined
// (LLVM finds it too large), every packet paid a BPF-to-BPF call into it
// and a return through the kernel's return thunk.
#[inline(always)]
pub fn router(ctx: XdpContext) -> u32 {
    // Priority tags first, taken off as the kernel takes them off: the
    // frame is then counted, carried, judged or passed as the untagged
    // frame the kernel would take it for.
    let untagged = tagged::untag(ctx.ctx);
    let len = (ctx.data_end() - ctx.data()) as u64;
    let (v, syn) = mss::take_mark(match untagged {
        Ok(()) => match try_router(&ctx) {
            Ok(v) | Err(v) => v,
        },
        Err(v) => v,
    });
    // Only a passed packet can be a fragment the core left to its own
    // path, a flow's packet whose TTL ran out or that is too large for its
    // next hop, or unsolicited: forwarded and dropped ones skip the
    // subprogram calls.
    let v = if v.action == xdp_action::XDP_PASS {
        let v = match v.counter {
            Counter::PassFragment => fragment::forward(&ctx).unpack(),
            Counter::PassIpOptions => ip_options::forward(&ctx).unpack(),
            Counter::PassTtlExceeded => icmp_answer::time_exceeded(&ctx, v.pack()).unpack(),
            Counter::PassMtu => match oversize::forward(&ctx, v.pack()).unpack() {
                a if oversize::is_to_answer(a) => oversize::answer(&ctx).unpack(),
                v => v,
            },
            _ => v,
        };
        let v = admit::unsolicited(&ctx, v.pack()).unpack();
        // What the IPv6 path passes without looking for a flow from the
        // WAN (`ipv6::judged_when_inbound`), and every IPv6 pass from the
        // LAN, whose source is judged (IPv4 passes it leaves as they are).
        if v.action == xdp_action::XDP_PASS && v.counter != Counter::PassNotIpv4 {
            let v = v6::judge_passed(&ctx, v.pack()).unpack();
            // A fragment let through: its first one goes to its
            // datagram's flow (tracked, or opened from the LAN).
            if v.counter == Counter::Pass6ExtFragment {
                v6::fragment_of_a_flow(&ctx);
            }
            v
        } else {
            v
        }
    } else {
        v
    };
    maps::count(v.counter, len);
    // After the count, where only the action is still live: the verifier
    // then prunes the paths that reach it with different drop reasons.
    if v.action == xdp_action::XDP_DROP {
        debug_log::dropped(v.counter, ctx.ingress_ifindex() as u32);
    }
    // Here too, for the same reason: the verifier walks a subprogram again
    // for each distinct state its call is reached with (called from the
    // cores, the option walk cost a fifth of the verifier's budget).
    if let Some(egress) = syn {
        mss::clamp(&ctx, egress);
    }
    v.action
}

/// The inline core: the phases in order.
#[inline(always)]
fn try_router(ctx: &XdpContext) -> Step<Verdict> {
    let eth: &mut [u8; eth::LEN] = header(ctx, 0)?;
    if get_u16(eth, eth::ETHER_TYPE) == eth::P_IPV6 {
        return v6::route(ctx, eth);
    }
    parse::ethernet(eth)?;
    let ip: &mut [u8; ipv4::LEN] = header(ctx, frame::IPV4)?;
    parse::ipv4(ctx, ip)?;
    let Some(side) = parse::ingress(ctx) else {
        return Err(Verdict::pass(Counter::PassNotConfigured));
    };
    parse::addressed_to_us(ctx, eth, side, VMAC_IPV4)?;
    let pkt = match parse::l4(ctx, ip, side.from_lan)? {
        L4::Flow(pkt) => pkt,
        L4::IcmpError { total_len } => {
            return icmp_error::forward(ctx, side.cfg, side.from_lan, eth, ip, total_len);
        }
    };
    let key = FlowKey::new(pkt.src, pkt.dst, pkt.sport, pkt.dport, pkt.proto);
    let (hit, now) = flow::lookup(&key, side);
    let mut xlat = Xlat::of_packet(&pkt);
    let mut cached = None;
    let mut offloaded = false;
    let new = if let Some(e) = hit {
        // SAFETY: map value pointer from the lookup, valid for this run.
        let entry = unsafe { &mut *e };
        flow::kernel_segment(entry, pkt.proto, &pkt.seg)?;
        xlat = Xlat::of_entry(entry);
        cached = flow::cached_hop(entry, pkt.total_len, now);
        flow::track_hit(&key, entry, &pkt.seg, now);
        if outbound_refresh_due(side.from_lan, entry, now) {
            // An outbound packet whose flow has not refreshed its NAT
            // mapping in this tick (its own tick, `out_tick`: a refresh of
            // `last_seen_ns` by the other direction does not count), so
            // the mapping lives as long as outbound traffic does (RFC 4787
            // REQ-6: outbound refresh). Per packet: the side, a test of
            // the entry's flags and a compare of `out_tick`. Called here, not in `track`:
            // `track` runs at a refresh of `last_seen_ns`, which either
            // direction makes; and tested after `track` so that no value
            // stays live across that call (a spill would grow this frame).
            mapping::refresh(&key, entry, now, entry.state);
        }
        flow::within_lease(entry, now)?;
        flow::count(entry, pkt.total_len);
        offloaded = entry.flags & FLAG_OFFLOADED != 0;
        None
    } else {
        Some(admit::admit(ctx, &key, &pkt, side, &mut xlat, now)?)
    };
    let hop = flow::next_hop(ctx, ip, &xlat, hit, cached)?;
    if offloaded && matches!(hop, Hop::NoNeighbour { .. }) {
        // An offloaded flow's packets go to the kernel untranslated: the
        // kernel translates them with its own conntrack entry, and an
        // already translated reply would match none of its tuples and be
        // dropped (seen after a VRRP failback, when the neighbours were
        // flushed with the links). Standalone flows go on below: their
        // packets (a new flow's first one too, after its commit) are
        // passed translated, so the same mapping reaches the WAN from the
        // first packet on and no LAN source address leaves; the kernel
        // resolves the neighbour and forwards them (a LAN -> WAN one,
        // whose source is then the router's own address, because attach
        // sets `accept_local` on the LAN interface).
        return Err(Verdict::pass(Counter::PassNoNeighbour));
    }
    if let Some(new) = new {
        admit::commit(new, &key, &pkt.seg, side.cfg, hop.egress(), &mut xlat, now)?;
        flow::count_first(&key, pkt.total_len);
    }
    // The redirect was recorded before any rewrite (in `hop::redirect_to`),
    // so a failed one passed an untouched frame.
    flow::rewrite(ctx, ip, pkt.proto, &xlat)?;
    let forwarded = if side.from_lan {
        Counter::FwdOutbound
    } else {
        Counter::FwdInbound
    };
    Ok(mss::mark_syn(
        forward_l2(eth, ip, &hop, forwarded),
        side.cfg,
        pkt.seg.flags,
        &hop,
    ))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
