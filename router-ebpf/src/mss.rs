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
//! verdict ([`mark_syn`]): a subprogram that asks the FIB
//! for the translated packet's egress and MTU again and walks the options.
//! There the verifier reaches the call with few distinct states; called
//! from inside the cores it walked the subprogram for each of their paths.

use aya_ebpf::programs::XdpContext;
use router_common::{
    flow::TCP_SYN,
    hdr::{eth, frame, get_u16, ipv4, tcp},
    ipv6::{frame6, ipv6},
    maps::{Config, Counter},
    mss::{
        CLAMP_OFF, IPV4_OVERHEAD, IPV6_OVERHEAD, checksum_after, find_mss_value, header_len,
        max_mss,
    },
};

use crate::{
    Verdict, hop, maps,
    parse::{header, ptr_at},
    v6,
};

/// A bit of [`Verdict::action`] (whose values are 0 to 4) a core sets on
/// the verdict of a carried TCP SYN when clamping is on: the entry point
/// takes it off and calls [`clamp`]. The SYN bit travels in the register
/// that holds the verdict anyway; read again from the packet at the entry
/// point it cost every forwarded packet a few nanoseconds.
const CLAMP_MARK: u32 = 0x100;

/// `v`, the verdict of a carried packet with TCP flags `tcp_flags` (0 for
/// other protocols), marked for [`clamp`] if it is a SYN and the
/// configuration asks for clamping.
#[inline(always)]
pub fn mark_syn(v: Verdict, cfg: &Config, tcp_flags: u8) -> Verdict {
    if tcp_flags & TCP_SYN != 0 && cfg.mss_clamp_mtu != CLAMP_OFF {
        Verdict {
            action: v.action | CLAMP_MARK,
            ..v
        }
    } else {
        v
    }
}

/// `v` without the mark, and whether it had it.
#[inline(always)]
pub fn take_mark(v: Verdict) -> (Verdict, bool) {
    (
        Verdict {
            action: v.action & !CLAMP_MARK,
            ..v
        },
        v.action & CLAMP_MARK != 0,
    )
}

/// Lowers the MSS option of the carried TCP SYN in `ctx` (already
/// translated; marked by its core, [`mark_syn`]) to what its path
/// carries: the smallest of the configured MTU, the egress route's MTU
/// (the FIB's; the egress interface's when there is no neighbour yet) and
/// the ingress interface's, less the headers. A SYN without the option,
/// or with options the walk cannot follow, goes on unchanged.
// A BPF subprogram called from the entry point for SYNs only: the FIB
// parameters, the option walk's frame and its instructions stay off the
// hit path.
#[inline(never)]
pub fn clamp(ctx: &XdpContext) {
    // Clamping is on: `mark_syn` asked. (Turned off since, the limit is 0
    // and no MSS fits it: `max` below stops there.)
    let Some(cfg) = maps::CONFIG.get(0) else {
        return;
    };
    let limit = u32::from(cfg.mss_clamp_mtu);
    let Ok(eth) = header::<{ eth::LEN }>(ctx, 0) else {
        return;
    };
    let v6 = get_u16(eth, eth::ETHER_TYPE) == eth::P_IPV6;
    // Each family's FIB parameters stay inside its branch: built in one
    // place for both, LLVM stored them at unaligned stack offsets, which
    // the verifier refuses.
    let (l4_at, overhead, path) = if v6 {
        let Ok(ip) = header::<{ ipv6::LEN }>(ctx, frame6::IPV6) else {
            return;
        };
        let mut p = v6::params_of(ip);
        (frame6::L4, IPV6_OVERHEAD, hop::path(ctx, &mut p))
    } else {
        let Ok(ip) = header::<{ ipv4::LEN }>(ctx, frame::IPV4) else {
            return;
        };
        let mut p = hop::params_of(ip);
        (frame::L4, IPV4_OVERHEAD, hop::path(ctx, &mut p))
    };
    let Some((egress, hop_mtu)) = path else {
        return;
    };
    let egress_mtu = if hop_mtu == 0 {
        hop::device_mtu(ctx, egress)
    } else {
        hop_mtu
    };
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
