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
//! - DF set, from the WAN: answered with an ICMP Fragmentation Needed
//!   quoting the packet as the remote sent it ([`icmp_answer`]), so that
//!   its path MTU discovery (RFC 1191) finds the narrower LAN. Passed
//!   untranslated, the router's stack would answer as the endpoint (a TCP
//!   RST that ends the connection).
//! - DF set, from the LAN: passed untranslated as it came (`pass_mtu`):
//!   the kernel answers the LAN host itself, quoting its own packet.
//!
//! Left as `pass_mtu`: a new flow's first packet (no entry to translate it
//! with yet), and fragments and packets with IP options (their own paths,
//! `pass_fragment`, `pass_ip_options`).

use aya_ebpf::{macros::map, maps::PerCpuArray, programs::XdpContext};
use router_common::{
    hdr::{eth, frame, get_u16, ipv4},
    maps::{Counter, VMAC_IPV4},
};

use crate::{
    Verdict,
    flow::{self, StackKey, Xlat},
    hop::{self, FibParams},
    icmp_answer,
    parse::{self, header},
};

/// Per CPU: the FIB parameters of [`forward`]'s lookup, off the BPF stack
/// (the entry point's frame and this subprogram's must fit 512 bytes).
#[map(name = "OVERSIZE_SCRATCH")]
static OVERSIZE_SCRATCH: PerCpuArray<FibParams> = PerCpuArray::with_max_entries(1, 0);

/// Finishes the packet of `ctx` that a core passed as `v` (`pass_mtu`),
/// larger than its next hop's MTU: see the module's text; `v` when it is
/// no packet of a flow the data path carries.
// A BPF subprogram, called from the entry point for such packets only.
#[inline(never)]
pub fn forward(ctx: &XdpContext, v: Verdict) -> Verdict {
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
    let Ok(Some((sport, dport))) = parse::ports(ctx, ip, frame::L4, side.from_lan) else {
        return v;
    };
    let key = StackKey::of(ip, sport, dport);
    let Some((e, now)) = flow::own_hit(&key.0, side) else {
        return v;
    };
    // SAFETY: map value pointer from the lookup, valid for this run.
    let xlat = Xlat::of_entry(unsafe { &*e });
    let Some(p) = OVERSIZE_SCRATCH.get_ptr_mut(0) else {
        return v;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let Some(mtu) = hop::mtu_exceeded(ctx, unsafe { &mut *p }, ip, xlat.src, xlat.dst) else {
        return v;
    };
    if frag & ipv4::FRAG_DF != 0 {
        if side.from_lan {
            return v;
        }
        return icmp_answer::fragmentation_needed(ctx, now, mtu);
    }
    let proto = ip[ipv4::PROTO];
    // Fails only on a frame shorter than the headers the core read (then
    // dropped: its addresses may be rewritten already).
    if let Err(d) = flow::rewrite(ctx, ip, proto, &xlat) {
        return d;
    }
    Verdict::pass(Counter::PassMtuTranslated)
}
