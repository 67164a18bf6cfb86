//! An IPv4 packet of a flow the data path carries (not an offloaded one)
//! that is larger than its next hop's MTU once translated: the core passes
//! it untranslated (`pass_mtu`), and this finishes it as the kernel's NAT
//! would have, which translates first and then fragments or refuses:
//! - DF clear: translated and passed (`pass_mtu_translated`, TTL
//!   untouched, as for want of a neighbour): the kernel forwards it and
//!   fragments it (RFC 1812 5.2.6), with the flow's own mapping. Passed
//!   untranslated, a WAN packet would be taken as the router's own, and a
//!   LAN one would leave through the kernel's slow-path NAT with another
//!   source port.
//! - DF set, to the WAN address (from the WAN, or a hairpinned LAN
//!   packet): answered with an ICMP Fragmentation Needed quoting the
//!   packet as its sender sent it ([`icmp_answer`]), so that its path MTU
//!   discovery (RFC 1191) finds the narrower link. Passed untranslated, the
//!   router's stack would answer as the endpoint (a TCP RST that ends the
//!   connection). So is a WAN packet of no flow yet that a port-forward
//!   rule would let in (its first), without opening the flow.
//! - DF set, from the LAN to the WAN: passed untranslated as it came
//!   (`pass_mtu`): the kernel answers the LAN host itself, quoting its own
//!   packet.
//!
//! Left as `pass_mtu`: a frame larger than the interface it came in on
//! carries (only generic-mode XDP sees those: packets merged below its
//! interface, by GRO or LRO on a VLAN's lower device or a bridge's ports,
//! or a local sender's TSO over a veth, whose partial checksum no
//! translation here could keep right; not the interface's own GRO, which
//! the kernel skips where a generic XDP program runs), a new
//! flow's first packet with DF clear or from the LAN (no entry to
//! translate it with yet), and fragments and packets with IP options (their own paths, which
//! pass such packets as `pass_mtu` too).

use aya_ebpf::{macros::map, maps::PerCpuArray, programs::XdpContext};
use router_common::{
    hdr::{eth, frame, get_addr, get_u16, ipv4},
    maps::{Counter, VMAC_IPV4},
};

use crate::{
    Packed, Verdict, admit,
    flow::{self, StackKey, Xlat},
    hop::{self, FibParams},
    icmp_answer,
    parse::{self, header},
};

/// What [`forward`] hands on, per CPU, off the BPF stack: its FIB
/// lookup's parameters, and the MTU and time of a packet to answer.
#[repr(C)]
struct Scratch {
    fib: FibParams,
    now: u64,
    mtu: u16,
}

#[map(name = "OVERSIZE_SCRATCH")]
static OVERSIZE_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// The verdict [`forward`] gives a packet to answer with Fragmentation
/// Needed, which the entry point then does ([`answer`]): never counted as
/// it is. Two subprograms rather than one: the answer's frame (and that of
/// the frame builder it calls) would add to [`forward`]'s, and the entry
/// point's call chains are at the verifier's 512 bytes.
///
/// An answered packet leaves redirected, so this pass verdict is none that
/// a packet could be given.
pub const TO_ANSWER: Verdict = Verdict::pass(Counter::DropFragNeededAnswered);

/// Whether `v` is [`TO_ANSWER`].
#[inline(always)]
pub fn is_to_answer(v: Verdict) -> bool {
    v.counter == TO_ANSWER.counter && v.action == TO_ANSWER.action
}

/// Answers the packet [`forward`] gave [`TO_ANSWER`] with an ICMP
/// Fragmentation Needed carrying the MTU it found.
#[inline(never)]
pub fn answer(ctx: &XdpContext) -> Packed {
    let Some(s) = OVERSIZE_SCRATCH.get_ptr_mut(0) else {
        return Verdict::drop(Counter::DropFragNeeded).pack();
    };
    // SAFETY: per-CPU slot, written by `forward` in this program run.
    let (now, mtu) = unsafe { ((*s).now, (*s).mtu) };
    icmp_answer::fragmentation_needed(ctx, now, mtu).pack()
}

/// Finishes the packet of `ctx` that a core passed as `v` (`pass_mtu`),
/// larger than its next hop's MTU: see the module's text; `v` when it is
/// no packet of a flow the data path carries.
// A BPF subprogram, called from the entry point for such packets only.
#[inline(never)]
pub fn forward(ctx: &XdpContext, v: Packed) -> Packed {
    finish(ctx, v.unpack()).pack()
}

/// [`forward`]'s decision.
#[inline(always)]
fn finish(ctx: &XdpContext, v: Verdict) -> Verdict {
    let Some(side) = parse::ingress(ctx) else {
        return v;
    };
    let Ok(eth) = header::<{ eth::LEN }>(ctx, 0) else {
        return v;
    };
    // The core passes only whole (unfragmented) IPv4 packets without
    // options as `pass_mtu`; checked again for the verifier and for
    // the ICMP error path, whose own FIB step passes the same way.
    if get_u16(eth, eth::ETHER_TYPE) != eth::P_IPV4
        || parse::addressed_to_us(ctx, eth, side, VMAC_IPV4).is_err()
    {
        return v;
    }
    let Ok(ip) = header::<{ ipv4::LEN }>(ctx, frame::IPV4) else {
        return v;
    };
    let frag = get_u16(ip, ipv4::FRAG_OFF);
    if ip[ipv4::VERSION_IHL] != ipv4::VERSION_IHL_PLAIN || frag & ipv4::FRAG_MF_AND_OFFSET != 0 {
        return v;
    }
    // Larger than its own link: no sender put it on the wire like this.
    if u32::from(get_u16(ip, ipv4::TOT_LEN)) > hop::device_mtu(ctx, 0) {
        return v;
    }
    let Ok(Some((sport, dport))) = parse::ports(ctx, ip, frame::L4, side.from_lan) else {
        return v;
    };
    let df = frag & ipv4::FRAG_DF != 0;
    let to_us = side.cfg.is_wan_addr(get_addr(ip, ipv4::DST));
    let key = StackKey::of(ip, sport, dport);
    let (xlat, now, hit) = if let Some((e, now)) = flow::own_hit(&key.0, side) {
        // SAFETY: map value pointer from the lookup, valid for this run.
        (Xlat::of_entry(unsafe { &*e }), now, true)
    } else if let (false, true, Some(rule)) =
        (side.from_lan, df, admit::forward_rule(side.cfg, ip, dport))
    {
        let x = Xlat {
            src: get_addr(ip, ipv4::SRC),
            dst: rule.addr,
            sport,
            dport: rule.port,
        };
        (x, crate::clock::now(), false)
    } else {
        return v;
    };
    let Some(s) = OVERSIZE_SCRATCH.get_ptr_mut(0) else {
        return v;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    let Some(mtu) = hop::mtu_exceeded(ctx, &mut s.fib, ip, xlat.dst) else {
        return v;
    };
    if df {
        if side.from_lan && !to_us {
            return v;
        }
        s.now = now;
        s.mtu = mtu;
        return TO_ANSWER;
    }
    if !hit {
        return v;
    }
    let proto = ip[ipv4::PROTO];
    // Fails only on a frame shorter than the headers the core read (then
    // dropped: its addresses may be rewritten already).
    if let Err(d) = flow::rewrite(ctx, ip, proto, &xlat) {
        return d;
    }
    Verdict::pass(Counter::PassMtuTranslated)
}
