//! TCP MSS clamping of the SYNs the data path forwards in standalone mode
//! (`attach --clamp-mss`; the logic is `router_common::mss`).
//!
//! In the kernel path a router clamps with a firewall rule (iptables'
//! `TCPMSS --clamp-mss-to-pmtu`, `OpenWrt`'s `mtu_fix`); standalone mode
//! admits and carries SYNs itself, past such rules, so it clamps here: a
//! forwarded SYN's (or SYN-ACK's) MSS option is lowered to the smallest
//! of the configured MTU, the egress route's MTU (the FIB's) and the
//! ingress interface's MTU, less the IP and TCP headers (RFC 9293 3.7.1).
//! Both directions then send segments that fit the narrower link without
//! relying on ICMP "fragmentation needed" reaching the sender (RFC 2923
//! 2.1). Offload mode leaves SYNs to the kernel, where the firewall's
//! rules clamp.
//!
//! Done from the entry point, after the count, for SYNs the cores forwarded
//! (or passed translated for want of a neighbour) and marked in their
//! verdict ([`mark_syn`]) with the egress MTU of the next hop their own
//! lookup chose: a subprogram that walks the options. There the verifier
//! reaches the call with few distinct states; called from inside the cores
//! it walked the subprogram for each of their paths. The MTU is the core's,
//! not asked of the FIB again after the rewrite: routed from the translated
//! source (the WAN address), without the flow's route mark, a second
//! lookup could pick another table than the packet's own (a policy rule
//! on the LAN hosts' source, `ip rule add from 192.168.1.0/24 table 100`,
//! whose route has a narrower MTU) and leave the SYN unclamped.

use aya_ebpf::programs::XdpContext;
use router_common::{
    flow::TCP_SYN,
    hdr::{eth, frame, get_u16, tcp},
    ipv6::frame6,
    maps::{Config, Counter},
    mss::{
        CLAMP_OFF, IPV4_OVERHEAD, IPV6_OVERHEAD, checksum_after, find_mss_value, header_len,
        max_mss,
    },
};

use crate::{
    Verdict,
    hop::{self, Hop},
    maps,
    parse::{header, ptr_at},
};

/// A bit of [`Verdict::action`] (whose values are 0 to 4) a core sets on
/// the verdict of a carried TCP SYN when clamping is on: the entry point
/// takes it off and calls [`clamp`]. The SYN bit travels in the register
/// that holds the verdict anyway; read again from the packet at the entry
/// point it cost every forwarded packet a few nanoseconds.
const CLAMP_MARK: u32 = 0x100;

/// A bit of a marked action: its [`EGRESS_SHIFT`] bits are the egress
/// interface's index, no MTU known (no neighbour yet), rather than the
/// route's MTU.
const EGRESS_IS_IFINDEX: u32 = 0x200;

/// Where a marked action carries the egress ([`mark_syn`]): its upper 22
/// bits.
const EGRESS_SHIFT: u32 = 10;

/// The bits of an action that are the XDP action itself.
const ACTION_BITS: u32 = 0xff;

/// What a core knew of a marked SYN's egress ([`mark_syn`]).
#[derive(Clone, Copy)]
pub enum Egress {
    /// The route's MTU, as the FIB reported it with the next hop.
    Mtu(u32),
    /// The egress interface, no neighbour yet (the FIB does not report
    /// the MTU then); 0 when its index did not fit the mark's 22 bits (a
    /// namespace that made four million interfaces).
    Interface(u32),
}

impl Egress {
    /// The egress MTU; `u32::MAX` when not known (an interface index that
    /// did not fit, or a cached hop written without its MTU).
    #[inline(always)]
    fn mtu(self, ctx: &XdpContext) -> u32 {
        match self {
            Egress::Mtu(mtu) if mtu != 0 => mtu,
            Egress::Interface(ifindex) if ifindex != 0 => hop::device_mtu(ctx, ifindex),
            Egress::Mtu(_) | Egress::Interface(_) => u32::MAX,
        }
    }
}

/// `v`, the verdict of a carried packet with TCP flags `tcp_flags` (0 for
/// other protocols) leaving by `hop`, marked for [`clamp`] with what the
/// core's lookup knew of the egress if it is a SYN and the configuration
/// asks for clamping. Arithmetic only: a helper call here, inside the
/// cores, cost the verifier a sixth more states.
#[inline(always)]
pub fn mark_syn(v: Verdict, cfg: &Config, tcp_flags: u8, hop: &Hop) -> Verdict {
    if tcp_flags & TCP_SYN != 0 && cfg.mss_clamp_mtu != CLAMP_OFF {
        let egress = match *hop {
            Hop::Redirect { mtu, .. } => u32::from(mtu) << EGRESS_SHIFT,
            Hop::NoNeighbour { ifindex } if ifindex < 1 << (32 - EGRESS_SHIFT) => {
                EGRESS_IS_IFINDEX | (ifindex << EGRESS_SHIFT)
            }
            Hop::NoNeighbour { .. } => EGRESS_IS_IFINDEX,
        };
        Verdict {
            action: v.action | CLAMP_MARK | egress,
            ..v
        }
    } else {
        v
    }
}

/// `v` without the mark, and the egress it carried if it had one.
#[inline(always)]
pub fn take_mark(v: Verdict) -> (Verdict, Option<Egress>) {
    let egress = v.action >> EGRESS_SHIFT;
    (
        Verdict {
            action: v.action & ACTION_BITS,
            ..v
        },
        (v.action & CLAMP_MARK != 0).then_some(if v.action & EGRESS_IS_IFINDEX != 0 {
            Egress::Interface(egress)
        } else {
            Egress::Mtu(egress)
        }),
    )
}

/// Lowers the MSS option of the carried TCP SYN in `ctx` (already
/// translated; marked by its core, [`mark_syn`]) to what its path
/// carries: the smallest of the configured MTU, the egress MTU (the
/// route's as the core's lookup found it, or the egress interface's when
/// there is no neighbour yet) and the ingress interface's, less the
/// headers. A SYN without the option, or with options the walk cannot
/// follow, goes on unchanged.
// A BPF subprogram called from the entry point for SYNs only: the option
// walk's frame and its instructions stay off the hit path.
#[inline(never)]
pub fn clamp(ctx: &XdpContext, egress: Egress) {
    // Clamping is on: `mark_syn` asked. (Turned off since, the limit is 0
    // and no MSS fits it: `max` below stops there.)
    let Some(cfg) = maps::CONFIG.get(0) else {
        return;
    };
    let limit = u32::from(cfg.mss_clamp_mtu);
    let Ok(eth) = header::<{ eth::LEN }>(ctx, 0) else {
        return;
    };
    let (l4_at, overhead) = if get_u16(eth, eth::ETHER_TYPE) == eth::P_IPV6 {
        (frame6::L4, IPV6_OVERHEAD)
    } else {
        (frame::L4, IPV4_OVERHEAD)
    };
    let egress_mtu = egress.mtu(ctx);
    // The reverse path's interface too, as `--clamp-mss-to-pmtu` does: a
    // SYN-ACK from a wider WAN into a narrower LAN and the reverse alike.
    let mtu = limit.min(egress_mtu).min(hop::device_mtu(ctx, 0));
    #[expect(clippy::cast_possible_truncation, reason = "min with a u16 limit")]
    let max = max_mss(mtu as u16, overhead);
    if max == 0 {
        // An MTU no TCP segment fits (or clamping off): nothing sensible to
        // clamp to.
        return;
    }
    lower(ctx, l4_at, max);
}

/// Lowers the MSS option of the TCP header at `l4_at` to `max` if it is
/// above, the checksum following.
#[inline(always)]
fn lower(ctx: &XdpContext, l4_at: usize, max: u16) {
    let Ok(hdr) = header::<{ tcp::LEN }>(ctx, l4_at) else {
        return;
    };
    let len = header_len(hdr[tcp::DATA_OFF]);
    let byte = |i: usize| {
        ptr_at::<u8>(ctx, l4_at + i)
            .ok()
            // SAFETY: bounds checked by ptr_at.
            .map(|p| unsafe { *p })
    };
    let Some(at) = find_mss_value(len, byte) else {
        return;
    };
    let Ok(value) = header::<2>(ctx, l4_at + at) else {
        return;
    };
    let old = u16::from_be_bytes(*value);
    if old <= max {
        return;
    }
    *value = max.to_be_bytes();
    let check = u16::from_be_bytes([hdr[tcp::CHECK], hdr[tcp::CHECK + 1]]);
    let check = checksum_after(check, at, old, max);
    hdr[tcp::CHECK..tcp::CHECK + 2].copy_from_slice(&check.to_be_bytes());
    maps::event(Counter::TcpMssClamped);
}
