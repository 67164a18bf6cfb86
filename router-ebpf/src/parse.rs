//! Parse phases: Ethernet, IPv4, then the L4 header of a flow packet. Every
//! packet access goes through [`ptr_at`], the one bounds check.
//!
//! The headers are byte arrays at the offsets named in
//! [`router_common::hdr`]; the pure checks (`classify_ipv4`) and rewrites
//! take the same arrays and are host-tested there.

use core::mem::size_of;

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use router_common::{
    flow::{ASSUMED_WSCALE, Segment, TCP_CONTROL},
    hdr::{eth, eth_dst_is, frame, get_addr, get_u16, icmp, ipv4, min_len, tcp, udp},
    maps::{Config, Counter, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, VirtualMacKey},
    nat::{ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, Ipv4Verdict, classify_ipv4, icmp_is_error},
};

use crate::{
    Step, Verdict,
    maps::{CONFIG, VIRTUAL_MACS},
};

/// A header runs past the end of the frame: dropped as truncated. An error
/// without a payload, so that a result holding a packet pointer is just a
/// nullable pointer (see [`Step`]).
pub struct Truncated;

impl From<Truncated> for Verdict {
    #[inline(always)]
    fn from(_: Truncated) -> Self {
        Verdict::drop(Counter::DropTruncated)
    }
}

/// The packet's bounds, `data` and `data_end`, read from the raw context
/// `md` with volatile loads: for the subprograms that take the raw context
/// instead of an `&XdpContext`, whose bounds LLVM would pass as 32-bit
/// values, widened with shifts the verifier refuses on packet pointers.
/// Callers check every access against them.
#[inline(always)]
pub fn bounds(md: *mut xdp_md) -> (usize, usize) {
    // SAFETY: `md` is the program's context: its `data` and `data_end`
    // fields are always readable.
    unsafe {
        (
            core::ptr::read_volatile(&raw const (*md).data) as usize,
            core::ptr::read_volatile(&raw const (*md).data_end) as usize,
        )
    }
}

/// A pointer to `T` at `offset` in the frame, if the frame is long enough.
#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Result<*mut T, Truncated> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        core::hint::cold_path();
        return Err(Truncated);
    }
    Ok((start + offset) as *mut T)
}

/// A header of `N` bytes at `offset` in the frame.
#[inline(always)]
pub fn header<'a, const N: usize>(
    ctx: &XdpContext,
    offset: usize,
) -> Result<&'a mut [u8; N], Truncated> {
    let p: *mut [u8; N] = ptr_at(ctx, offset)?;
    // SAFETY: bounds checked by ptr_at; the frame outlives the program run.
    // Callers hold only headers at disjoint offsets at the same time.
    Ok(unsafe { &mut *p })
}

/// Ethernet: IPv4 here (IPv6 branched off to its own core before; ARP,
/// VLAN tags: the kernel's).
#[inline(always)]
pub fn ethernet(eth: &[u8; eth::LEN]) -> Step<()> {
    if get_u16(eth, eth::ETHER_TYPE) != eth::P_IPV4 {
        core::hint::cold_path();
        return Err(Verdict::pass(Counter::PassNotIpv4));
    }
    Ok(())
}

/// IPv4: a header the fast path may forward, or passed (options,
/// fragments, TTL <= 1) or dropped (malformed, bad header checksum).
#[inline(always)]
pub fn ipv4(ctx: &XdpContext, ip: &[u8; ipv4::LEN]) -> Step<()> {
    let l3_len = ctx.data_end() - ctx.data() - frame::IPV4;
    let verdict = classify_ipv4(ip, l3_len);
    if let Ipv4Verdict::Forward = verdict {
        return Ok(());
    }
    core::hint::cold_path();
    let drop_reason = match verdict {
        // (Forward returned above.)
        Ipv4Verdict::Forward | Ipv4Verdict::Malformed => Counter::DropMalformed,
        Ipv4Verdict::BadChecksum => Counter::DropIpChecksum,
        Ipv4Verdict::Options => return Err(Verdict::pass(Counter::PassIpOptions)),
        Ipv4Verdict::Fragment => return Err(Verdict::pass(Counter::PassFragment)),
        Ipv4Verdict::TtlExceeded => return Err(Verdict::pass(Counter::PassTtlExceeded)),
    };
    Err(Verdict::drop(drop_reason))
}

/// Which attached interface the packet came in on, with the config.
#[derive(Clone, Copy)]
pub struct Ingress<'a> {
    pub cfg: &'a Config,
    pub from_lan: bool,
}

/// The ingress side; `None` when not configured or from an interface the
/// router was not set up for.
#[inline(always)]
pub fn ingress<'a>(ctx: &XdpContext) -> Option<Ingress<'a>> {
    // Array map value, valid for the program's run.
    let cfg = CONFIG.get(0)?;
    let ifindex = ctx.ingress_ifindex() as u32;
    let from_lan = ifindex == cfg.lan_ifindex;
    if cfg.lan_ifindex == 0 || !(from_lan || ifindex == cfg.wan_ifindex) {
        core::hint::cold_path();
        return None;
    }
    Some(Ingress { cfg, from_lan })
}

/// Only frames link-layer addressed to the ingress interface itself go on:
/// broadcast, multicast and other hosts' unicast frames are the kernel's,
/// which forwards none of them (it forwards `PACKET_HOST` frames only) and
/// delivers what is for the router itself (ARP, DHCP, VRRP); but a frame
/// to a device on top of the interface (a macvlan's MAC) is `PACKET_HOST`
/// there, so standalone mode's inbound filters judge these passes too. A router must
/// not forward a packet received as a link-layer broadcast or multicast
/// (RFC 1812 5.3.4); a frame a bridge floods to every port, or one seen by
/// a promiscuous interface, would otherwise be forwarded twice (also by its
/// real next hop) and could open flows. Both families (`family` is
/// `VMAC_IPV4` or `VMAC_IPV6`), before any flow work. Besides the own MAC,
/// the VRRP virtual MACs of this router's master macvlans
/// ([`virtual_mac`]), looked up only here, off the hit path.
#[inline(always)]
pub fn addressed_to_us(
    ctx: &XdpContext,
    eth: &[u8; eth::LEN],
    side: Ingress<'_>,
    family: u8,
) -> Step<()> {
    let own = if side.from_lan {
        &side.cfg.lan_mac
    } else {
        &side.cfg.wan_mac
    };
    if eth_dst_is(eth, own) {
        return Ok(());
    }
    core::hint::cold_path();
    if virtual_mac(ctx.ctx, family) {
        return Ok(());
    }
    Err(Verdict::pass(Counter::PassNotForUs))
}

/// Whether `dst` is a VRRP virtual MAC (RFC 5798 7.3) that the controller
/// accepts for `family` on interface `ifindex`: a keepalived `use_vmac`
/// macvlan on top of it, of the instance this router is the master of
/// (the kernel would forward the frame: the macvlan takes it as
/// `PACKET_HOST`). A backup keeps the macvlan and its MAC up, without the
/// virtual addresses: the controller leaves its MAC out, so frames a
/// switch floods to it go to the kernel. A group address (multicast or
/// broadcast) is never accepted. A subprogram taking only the context:
/// the key is built on the cold path only (values the caller passed would
/// be kept live, or computed, on the hit path too).
#[inline(never)]
fn virtual_mac(ctx: *mut xdp_md, family: u8) -> bool {
    let ctx = XdpContext::new(ctx);
    let Ok(eth) = header::<{ eth::LEN }>(&ctx, 0) else {
        return false;
    };
    let d = eth::DST;
    if eth[d] & 1 != 0 {
        return false;
    }
    let dst = [
        eth[d],
        eth[d + 1],
        eth[d + 2],
        eth[d + 3],
        eth[d + 4],
        eth[d + 5],
    ];
    let key = VirtualMacKey::new(ctx.ingress_ifindex() as u32, dst);
    // SAFETY: hash map value, read at once.
    unsafe { VIRTUAL_MACS.get(&key) }.is_some_and(|families| families & family != 0)
}

/// The tuple of a TCP/UDP/ICMP echo packet, as it arrived.
#[derive(Clone, Copy)]
pub struct Packet {
    pub src: [u8; 4],
    pub dst: [u8; 4],
    /// Ports; for ICMP echo both are the identifier.
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// The TCP fields the state tracking reads; zero for other protocols.
    pub seg: Segment,
    /// IPv4 total length.
    pub total_len: usize,
}

/// What the L4 parse found.
pub enum L4 {
    /// A packet of a (possible) flow.
    Flow(Packet),
    /// An ICMP error, quoting a packet of a flow maybe.
    IcmpError { total_len: usize },
}

/// Parses the L4 header. `classify_ipv4` proved total length <= frame, so
/// a header that fits in the total length fits in the frame; [`header`]
/// re-checks for the verifier.
#[inline(always)]
pub fn l4(ctx: &XdpContext, ip: &[u8; ipv4::LEN], from_lan: bool) -> Step<L4> {
    let total_len = usize::from(get_u16(ip, ipv4::TOT_LEN));
    let proto = ip[ipv4::PROTO];
    let mut seg = Segment::default();
    let (sport, dport) = match proto {
        IPPROTO_TCP => {
            if total_len < min_len::TCP {
                core::hint::cold_path();
                return Err(Verdict::drop(Counter::DropMalformed));
            }
            let tcp: &mut [u8; tcp::LEN] = header(ctx, frame::L4)?;
            let data_off = usize::from(tcp[tcp::DATA_OFF] >> 4) * 4;
            if data_off < tcp::LEN || data_off > total_len - ipv4::LEN {
                core::hint::cold_path();
                return Err(Verdict::drop(Counter::DropMalformed));
            }
            #[expect(
                clippy::cast_possible_truncation,
                reason = "a payload length fits 16 bits"
            )]
            {
                seg = Segment {
                    seq: get_u32(tcp, tcp::SEQ),
                    ack: get_u32(tcp, tcp::ACK_SEQ),
                    len: (total_len - ipv4::LEN - data_off) as u16,
                    win: get_u16(tcp, tcp::WINDOW),
                    flags: tcp[tcp::FLAGS],
                    wscale: ASSUMED_WSCALE,
                    pad: 0,
                };
            }
            (get_u16(tcp, tcp::SPORT), get_u16(tcp, tcp::DPORT))
        }
        IPPROTO_UDP => {
            if total_len < min_len::UDP {
                core::hint::cold_path();
                return Err(Verdict::drop(Counter::DropMalformed));
            }
            let udp: &mut [u8; udp::LEN] = header(ctx, frame::L4)?;
            (get_u16(udp, udp::SPORT), get_u16(udp, udp::DPORT))
        }
        IPPROTO_ICMP => {
            if total_len < min_len::ICMP {
                core::hint::cold_path();
                return Err(Verdict::drop(Counter::DropMalformed));
            }
            let icmp: &mut [u8; icmp::LEN] = header(ctx, frame::L4)?;
            let icmp_type = icmp[icmp::TYPE];
            if icmp_is_error(icmp_type) {
                return Ok(L4::IcmpError { total_len });
            }
            // Echo requests leave from the LAN, replies come back on the
            // WAN. Other types (and pings of the router itself, which the
            // FIB calls local) are the kernel's.
            let wanted = if from_lan {
                ICMP_ECHO_REQUEST
            } else {
                ICMP_ECHO_REPLY
            };
            if icmp_type != wanted {
                core::hint::cold_path();
                return Err(Verdict::pass(Counter::PassProtocol));
            }
            let id = get_u16(icmp, icmp::ECHO_ID);
            (id, id)
        }
        // Other protocols (GRE, ESP, SCTP...): the kernel's.
        _ => {
            core::hint::cold_path();
            return Err(Verdict::pass(Counter::PassProtocol));
        }
    };
    Ok(L4::Flow(Packet {
        src: get_addr(ip, ipv4::SRC),
        dst: get_addr(ip, ipv4::DST),
        sport,
        dport,
        proto,
        seg,
        total_len,
    }))
}

/// The ports of a TCP, UDP or ICMP echo packet (the echo identifier twice,
/// as [`l4`] gives them) whose L4 header starts at `l4_at` (after the IPv4
/// header and its options), on its own, for the paths off the hit path
/// that need only the flow's key: `None` for other protocols and ICMP
/// types (an echo counts only in its direction: requests from the LAN,
/// replies from the WAN). A packet too short for its 8 bytes of ports (or
/// identifier) is malformed. Reads no more than those 8 bytes, so also a
/// first fragment's.
#[inline(always)]
pub fn ports(
    ctx: &XdpContext,
    ip: &[u8; ipv4::LEN],
    l4_at: usize,
    from_lan: bool,
) -> Step<Option<(u16, u16)>> {
    let total_len = usize::from(get_u16(ip, ipv4::TOT_LEN));
    let proto = ip[ipv4::PROTO];
    if !matches!(proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_ICMP) {
        return Ok(None);
    }
    // 8 bytes: UDP's and ICMP's header, TCP's ports and sequence number.
    if total_len < l4_at - frame::IPV4 + udp::LEN {
        return Err(Verdict::drop(Counter::DropMalformed));
    }
    let l4: &[u8; udp::LEN] = header(ctx, l4_at)?;
    if proto != IPPROTO_ICMP {
        return Ok(Some((get_u16(l4, udp::SPORT), get_u16(l4, udp::DPORT))));
    }
    let echo = if from_lan {
        ICMP_ECHO_REQUEST
    } else {
        ICMP_ECHO_REPLY
    };
    if l4[icmp::TYPE] != echo {
        return Ok(None);
    }
    let id = get_u16(l4, icmp::ECHO_ID);
    Ok(Some((id, id)))
}

/// Whether the TCP segment whose header starts at `l4_at`, and whose
/// fixed 20 bytes the caller found within the total length, carries SYN,
/// FIN or RST: the paths off the hit path, which change no TCP state,
/// leave those to the kernel.
#[inline(always)]
pub fn tcp_control(ctx: &XdpContext, l4_at: usize) -> Step<bool> {
    let t: &[u8; tcp::LEN] = header(ctx, l4_at)?;
    Ok(t[tcp::FLAGS] & TCP_CONTROL != 0)
}

/// The big-endian 32-bit field at `at` of header `h`.
#[inline(always)]
pub fn get_u32<const N: usize>(h: &[u8; N], at: usize) -> u32 {
    u32::from_be_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]])
}
