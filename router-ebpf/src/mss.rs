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

use aya_ebpf::{EbpfContext, helpers::bpf_check_mtu, programs::XdpContext};
use router_common::{
    flow::TCP_SYN,
    hdr::{frame, tcp},
    ipv6::frame6,
    maps::{Config, Counter},
    mss::{
        CLAMP_OFF, IPV4_OVERHEAD, IPV6_OVERHEAD, checksum_after, find_mss_value, header_len,
        max_mss,
    },
};

use crate::{
    hop::Hop,
    maps,
    parse::{header, ptr_at},
};

/// Clamps the MSS option of the forwarded packet in `ctx` if it is a TCP
/// SYN (`tcp_flags`) and the configuration asks for it; `hop` is where it
/// goes.
#[inline(always)]
pub fn clamp_syn(ctx: &XdpContext, cfg: &Config, tcp_flags: u8, hop: &Hop, v6: bool) {
    if tcp_flags & TCP_SYN == 0 || cfg.mss_clamp_mtu == CLAMP_OFF {
        return;
    }
    let hop_mtu = match *hop {
        Hop::Redirect { mtu, .. } => u32::from(mtu),
        Hop::NoNeighbour { .. } => 0,
    };
    clamp(ctx, hop.egress(), hop_mtu, u32::from(cfg.mss_clamp_mtu), v6);
}

/// Lowers the MSS option of the TCP SYN in `ctx` (IPv6 if `v6`, else
/// IPv4 without options; already translated) to what a path of MTU
/// `limit` carries, lowered further to the egress route's MTU `hop_mtu`
/// (0: not known, the egress interface `egress`'s is asked) and to the
/// ingress interface's. A SYN without the option, or with options the
/// walk cannot follow, goes on unchanged.
// A BPF subprogram called from the entry point for SYNs only: the option
// walk's frame and instructions stay off the hit path.
#[inline(never)]
pub fn clamp(ctx: &XdpContext, egress: u32, hop_mtu: u32, limit: u32, v6: bool) {
    let (l4_at, overhead) = if v6 {
        (frame6::L4, IPV6_OVERHEAD)
    } else {
        (frame::L4, IPV4_OVERHEAD)
    };
    let egress_mtu = if hop_mtu == 0 {
        device_mtu(ctx, egress)
    } else {
        hop_mtu
    };
    // The reverse path's interface too, as `--clamp-mss-to-pmtu` does: a
    // SYN-ACK from a wider WAN into a narrower LAN and the reverse alike.
    let mtu = limit.min(egress_mtu).min(device_mtu(ctx, 0));
    #[expect(clippy::cast_possible_truncation, reason = "min with a u16 limit")]
    let max = max_mss(mtu as u16, overhead);
    if max == 0 {
        // An MTU no TCP segment fits: nothing sensible to clamp to.
        return;
    }
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

/// The MTU of interface `ifindex` (0: the one the packet came in on);
/// `u32::MAX` (no limit) if the kernel does not know it.
#[inline(always)]
fn device_mtu(ctx: &XdpContext, ifindex: u32) -> u32 {
    let mut mtu: u32 = 0;
    // SAFETY: the helper writes the MTU into `mtu`, a local; length 0 and
    // no flags ask for the MTU only (the packet's own length is checked
    // against it, a result not used here).
    let rc = unsafe { bpf_check_mtu(ctx.as_ptr(), ifindex, &raw mut mtu, 0, 0) };
    if rc < 0 { u32::MAX } else { mtu }
}
