//! The IPv6 fast path: routed, not translated, with the stateful firewall
//! of a residential gateway (RFC 6092) in standalone mode.
//!
//! Its own inline core, [`route`], entered from [`crate::try_router`] by
//! the Ethernet type, built from named phases like the IPv4 one: parse
//! ([`parse::classify`], [`parse::l4`]), conntrack lookup with state
//! tracking ([`flow::lookup`], [`flow::track_hit`]), admission of a new flow
//! ([`flow::admit`]), next hop (the flow's cached one or `bpf_fib_lookup`
//! with `AF_INET6`: [`flow::cached_hop`], [`fib6`]) and the forwarding
//! tail ([`forward`]: hop limit - 1, MACs, the recorded redirect). Nothing
//! that a checksum covers changes, so there is no rewrite phase; only a
//! SYN's MSS may be clamped on the way (`crate::mss`). `ICMPv6`
//! errors about known flows take [`icmp_error::forward`].
//!
//! Flows live in `CONNTRACK6` ([`maps`]), a map of their own: the IPv4 key
//! and hit path stay exactly as they are.

mod flow;
mod icmp_error;
mod maps;
mod parse;

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use router_common::{
    hdr::{eth, get_u16},
    ipv6::{IPPROTO_ICMPV6, frame6, get_addr6, icmp6, ipv6, judged_when_inbound, next_header},
    maps::{Admit, Counter, FlowKey6, IPPROTO_TCP, IPPROTO_UDP, VMAC_IPV6},
};

use crate::{
    Packed, Step, Verdict,
    hop::{FibParams, Hop, egress, lookup, lookup_unnoted, reachable_via, write_macs},
    parse::{Ingress, addressed_to_us, header, ingress, ptr_at},
};

const AF_INET6: u8 = 10;

/// The IPv6 core: the phases in order.
#[inline(always)]
pub fn route(ctx: &XdpContext, eth: &mut [u8; eth::LEN]) -> Step<Verdict> {
    let ip: &mut [u8; ipv6::LEN] = header(ctx, frame6::IPV6)?;
    parse::classify(ctx, ip)?;
    let Some(side) = ingress(ctx) else {
        return Err(Verdict::pass(Counter::PassNotConfigured));
    };
    addressed_to_us(ctx, eth, side, VMAC_IPV6)?;
    let pkt = match parse::l4(ctx, ip, side.from_lan)? {
        parse::L4::Flow(pkt) => pkt,
        parse::L4::IcmpError => return icmp_error::forward(ctx, side, eth, ip),
        parse::L4::Unsolicited => return Err(unsolicited(ctx, ip, side)),
    };
    let now = crate::clock::now();
    let key = FlowKey6::new(pkt.src, pkt.dst, pkt.sport, pkt.dport, pkt.proto);
    let forwarded = if side.from_lan {
        Counter::Fwd6Outbound
    } else {
        Counter::Fwd6Inbound
    };
    let hop = if let Some(e) =
        flow::lookup(&key, side, now).or_else(|| flow::restored(&key, side, now))
    {
        // SAFETY: map value pointer from the lookup, valid for this run;
        // no other reference to the entry is live.
        flow::kernel_segment(ctx, &key, unsafe { &mut *e }, pkt.proto, pkt.tcp_flags)?;
        // SAFETY: as above.
        let cached = flow::cached_hop(unsafe { &*e }, pkt.len, now);
        // SAFETY: as above; no other reference to the entry is live.
        flow::track_hit(ctx, &key, unsafe { &mut *e }, pkt.tcp_flags, now);
        // SAFETY: as above.
        flow::within_lease(unsafe { &*e }, now)?;
        // SAFETY: as above.
        flow::count(unsafe { &mut *e }, pkt.len);
        if let Some(h) = cached {
            h
        } else {
            // SAFETY: as above.
            let oversize = pkt.len > usize::from(unsafe { (*e).hop_mtu });
            let h = fib6(ctx, ip);
            // SAFETY: as above.
            flow::cache_hop(unsafe { &mut *e }, &h, oversize);
            h?
        }
    } else {
        let h = flow::admit(ctx, ip, &key, pkt.tcp_flags, side, now)?;
        flow::count_first(&key, pkt.len);
        h
    };
    Ok(crate::mss::mark_syn(
        forward(eth, ip, &hop, forwarded),
        side.cfg,
        pkt.tcp_flags,
        &hop,
    ))
}

/// Asks the FIB for the next hop of the IPv6 packet `ip`. A packet larger
/// than the egress MTU is passed so that the kernel sends Packet Too Big.
#[inline(always)]
pub fn fib6(ctx: &XdpContext, ip: &[u8; ipv6::LEN]) -> Step<Hop> {
    fib6_sized(ctx, ip, packet_len(ip))
}

/// [`fib6`] without the MTU check: where the packet `ip` would go, whatever
/// its size.
#[inline(always)]
pub fn egress_of(ctx: &XdpContext, ip: &[u8; ipv6::LEN]) -> Step<Hop> {
    fib6_sized(ctx, ip, 0)
}

/// The length of the IPv6 packet `ip`, header included: what the FIB
/// compares with the egress MTU.
#[inline(always)]
fn packet_len(ip: &[u8; ipv6::LEN]) -> u16 {
    #[expect(clippy::cast_possible_truncation, reason = "LEN is 40")]
    get_u16(ip, ipv6::PAYLOAD_LEN).saturating_add(ipv6::LEN as u16)
}

/// The forward lookup's FIB parameters of the IPv6 packet `ip` as if it
/// were `tot_len` bytes long (0: no MTU check).
#[inline(always)]
fn params_sized(ip: &[u8; ipv6::LEN], tot_len: u16) -> FibParams {
    let mut p = params6(ip, ipv6::SRC, ipv6::DST);
    p.__bindgen_anon_1.tot_len = tot_len;
    // Version, traffic class and flow label in wire order: the kernel
    // masks out the version.
    p.__bindgen_anon_2.flowinfo = u32::from_ne_bytes([ip[0], ip[1], ip[2], ip[3]]);
    p
}

/// [`fib6`] for a packet of `tot_len` bytes, which the kernel compares
/// with the egress MTU; 0: no MTU check, the egress question only (as
/// IPv4's `hop::forward_egress`).
#[inline(always)]
fn fib6_sized(ctx: &XdpContext, ip: &[u8; ipv6::LEN], tot_len: u16) -> Step<Hop> {
    let mut p = params_sized(ip, tot_len);
    lookup(ctx, &mut p).map_err(|v| {
        if v.counter == Counter::PassMtu {
            Verdict::pass(Counter::Pass6PacketTooBig)
        } else {
            v
        }
    })
}

/// Whether the IPv6 packet of `ctx`, which would open a flow, has a source
/// its sender may use from the side it came in on (standalone mode; RFC
/// 6092 3.1, BCP 38 ingress filtering): from the LAN the FIB must route
/// the source back out of the LAN, the interface it came in on (strict
/// reverse path, RFC 3704 2.2: a spoofed source, another network's prefix
/// or one of the router's own addresses never leaves on the WAN); from the
/// WAN it must route elsewhere than to the LAN and not be the router's own
/// (a loose check: a WAN host's route may be any but the interior's).
/// Asked once per new flow, never on a hit.
// A BPF subprogram of its own, called from the entry point: its FIB
// parameters stay off the entry point's frame (whose deepest chains are
// at the verifier's 512 bytes).
#[inline(never)]
pub fn source_valid(ctx: &XdpContext, from_lan: bool, lan_ifindex: u32) -> bool {
    let Ok(ip) = ptr_at::<[u8; ipv6::LEN]>(ctx, frame6::IPV6) else {
        return false;
    };
    // SAFETY: bounds checked by ptr_at; only read, as the caller's
    // reference to the same header is.
    let ip = unsafe { &*ip };
    // The way back: from the packet's destination to its source; no
    // length, so no MTU check.
    let mut p = params6(ip, ipv6::DST, ipv6::SRC);
    if from_lan {
        // From the router's own perspective, as IPv4's
        // `hop::source_reachable_via` (policy rules on the incoming
        // interface do not apply).
        // Forwarding off on the LAN: not judged (the forward lookup passes
        // the packet).
        return reachable_via(ctx, &mut p, lan_ifindex) != Some(false);
    }
    matches!(egress(ctx, &mut p), Some(back) if back != lan_ifindex)
}

/// The FIB parameters of the IPv6 packet `ip` from the address at
/// `src_at` to the one at `dst_at` (as IPv4's `hop::params4`): no length
/// (no MTU check) and no flow label unless the caller sets them.
#[inline(always)]
fn params6(ip: &[u8; ipv6::LEN], src_at: usize, dst_at: usize) -> FibParams {
    // SAFETY: zeroed is a valid bit pattern for this plain C struct.
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    p.family = AF_INET6;
    p.l4_protocol = ip[ipv6::NEXT_HEADER];
    p.__bindgen_anon_3.ipv6_src = words(ip, src_at);
    p.__bindgen_anon_4.ipv6_dst = words(ip, dst_at);
    p
}

/// The address at `at` as the FIB parameters' four wire-order words.
#[inline(always)]
fn words(ip: &[u8; ipv6::LEN], at: usize) -> [u32; 4] {
    let w = |i: usize| u32::from_ne_bytes([ip[i], ip[i + 1], ip[i + 2], ip[i + 3]]);
    [w(at), w(at + 4), w(at + 8), w(at + 12)]
}

/// The forwarding tail: with a neighbour, hop limit - 1 (checked > 1 by
/// the parse) and the next hop's MACs, then the recorded redirect, counted
/// as `forwarded`; without one, passed as it is (the kernel resolves the
/// neighbour and forwards; nothing was translated; the entry point may
/// still clamp a SYN's MSS, `crate::mss`).
#[inline(always)]
pub fn forward(
    eth: &mut [u8; eth::LEN],
    ip: &mut [u8; ipv6::LEN],
    hop: &Hop,
    forwarded: Counter,
) -> Verdict {
    let Hop::Redirect {
        smac, dmac, action, ..
    } = *hop
    else {
        return Verdict::pass(Counter::PassNoNeighbour);
    };
    ip[ipv6::HOP_LIMIT] = ip[ipv6::HOP_LIMIT].wrapping_sub(1);
    write_macs(eth, smac, dmac);
    Verdict {
        counter: forwarded,
        action,
    }
}

/// Standalone mode's inbound filter for what the IPv6 path passed from the
/// WAN with `v` without looking for a flow (extension headers, fragments,
/// other protocols and `ICMPv6` types, NDP and MLD between global
/// addresses: `ipv6::judged_when_inbound`): dropped if the FIB (asked
/// without the MTU check, as [`unsolicited`]) routes it to the LAN, else
/// left as it was (for the router itself, or routed elsewhere). Fragments
/// of known flows pass ([`solicited_at`]), and so does what a known
/// flow or a pinhole lets in sent to a MAC not the interface's
/// ([`unsolicited_at`]). From the LAN, every pass's source is judged
/// ([`judge_lan`]). Offload mode and IPv4 are left as they are.
// A BPF subprogram of its own, as IPv4's `admit::unsolicited`: its flow
// key stays off the entry point's frame.
#[inline(never)]
pub fn judge_passed(ctx: &XdpContext, v: Packed) -> Packed {
    judge(ctx, v.unpack()).pack()
}

/// [`judge_passed`]'s judgement.
#[inline(always)]
fn judge(ctx: &XdpContext, v: Verdict) -> Verdict {
    let Ok(l2) = header::<{ eth::LEN }>(ctx, 0) else {
        return v;
    };
    if get_u16(l2, eth::ETHER_TYPE) != eth::P_IPV6 {
        return v;
    }
    let Some(side) = ingress(ctx) else {
        return v;
    };
    if side.cfg.admit != Admit::Xdp as u8 {
        return v;
    }
    if side.from_lan {
        return judge_lan(ctx, v, side.cfg.lan_ifindex);
    }
    if !judged_when_inbound(v.counter) {
        return v;
    }
    if v.counter == Counter::Pass6ExtFragment && solicited_at(ctx.ctx, frame6::IPV6) {
        return v;
    }
    if v.counter == Counter::PassNotForUs {
        return if unsolicited_at(ctx.ctx, frame6::IPV6) {
            Verdict::drop(Counter::Drop6Unsolicited)
        } else {
            v
        };
    }
    if routed_to(ctx, side.cfg.lan_ifindex) {
        Verdict::drop(Counter::Drop6Unsolicited)
    } else {
        v
    }
}

/// Whether the IPv6 packet `l3` bytes into the frame of `md`, from a
/// standalone router's WAN, is unsolicited and routed to the LAN: what the
/// core lets in ([`solicited_at`]: a known flow's reply or error,
/// `IPsec`, a pinhole's port, a known flow's fragment) is not, anything else
/// the FIB routes to the LAN is. For the frames the core passes without
/// looking for a flow although the kernel may forward them: to a MAC not
/// the interface's (`pass_not_for_us`: a macvlan on the WAN takes it). The
/// kernel forwards what passes as it is (no flow opens).
// A BPF subprogram of its own (see `routed_to`); the raw context and
// volatile bounds (`parse::bounds`). Its two steps are sibling
// subprograms, so the flow key and the FIB parameters share no frame.
#[inline(never)]
pub fn unsolicited_at(md: *mut xdp_md, l3: usize) -> bool {
    let Some(cfg) = crate::maps::CONFIG.get(0) else {
        return false;
    };
    !solicited_at(md, l3) && routed_at(md, l3, cfg.lan_ifindex)
}

/// Whether the IPv6 packet `l3` bytes into the frame of `md`, from the
/// WAN, is one standalone mode lets in without a new flow, as the core
/// does: a TCP or UDP packet, or an `ICMPv6` echo reply, of a live
/// WAN-side entry (a reply of a known flow); an `ICMPv6` error quoting a
/// packet of one, or quoting `IPsec` (`icmp_error`), a Packet Too Big
/// quoting the LAN host's fragment, another error quoting its first
/// fragment of a known flow; ESP or AH (RFC 6092 REC-21, REC-22);
/// TCP or UDP to a pinhole's port; a later fragment (of any length: it
/// carries no header to judge, and without its first fragment the LAN
/// host reassembles nothing, RFC 8200 4.5), or a first one of `IPsec`,
/// whose TCP or UDP header or echo reply is a known flow's, or whose TCP
/// or UDP header is to a pinhole's port (the kernel reassembles nothing it
/// forwards; an atomic fragment, a whole datagram, is judged as one, RFC
/// 6946). Also what the core's
/// judge asks of its fragments (`pass6_ext_fragment`: a Fragment
/// header, or an `ICMPv6` error quoting the LAN host's own fragment).
// A BPF subprogram of its own: its flow key stays off the frames of the
// call chains to the FIB lookup.
#[inline(never)]
fn solicited_at(md: *mut xdp_md, l3: usize) -> bool {
    let (data, end) = crate::parse::bounds(md);
    let Some(cfg) = crate::maps::CONFIG.get(0) else {
        return false;
    };
    // The fixed header and the 8 bytes after it: the ports, an `ICMPv6`
    // header, a Fragment header.
    if l3 > eth::LEN + 16 || data + l3 + ipv6::LEN + 8 > end {
        return false;
    }
    // SAFETY: within the bounds checked just above.
    let (ip, next) = unsafe {
        (
            &*((data + l3) as *const [u8; ipv6::LEN]),
            &*((data + l3 + ipv6::LEN) as *const [u8; 8]),
        )
    };
    let (src, dst) = (get_addr6(ip, ipv6::SRC), get_addr6(ip, ipv6::DST));
    let mut key = match ip[ipv6::NEXT_HEADER] {
        next_header::ESP | next_header::AH => return true,
        proto @ (IPPROTO_TCP | IPPROTO_UDP) => {
            let dport = get_u16(next, 2);
            if maps::pinhole(dst, proto, dport) {
                return true;
            }
            FlowKey6::new(src, dst, get_u16(next, 0), dport, proto)
        }
        IPPROTO_ICMPV6 if next[0] == icmp6::ECHO_REPLY => {
            let id = get_u16(next, 4);
            FlowKey6::new(src, dst, id, id, IPPROTO_ICMPV6)
        }
        IPPROTO_ICMPV6 if matches!(next[0], 1..=4) => {
            match quoted_key(data + l3 + ipv6::LEN + 8, end, next[0], dst) {
                Ok(key) => key,
                Err(solicited) => return solicited,
            }
        }
        next_header::FRAGMENT => {
            let proto = next[0];
            if get_u16(next, 2) & 0xfff8 != 0
                || proto == next_header::ESP
                || proto == next_header::AH
            {
                return true;
            }
            let l4 = data + l3 + ipv6::LEN + 8;
            if l4 + 8 > end {
                return false;
            }
            // SAFETY: within the bounds checked just above.
            let l4 = unsafe { &*(l4 as *const [u8; 8]) };
            match proto {
                IPPROTO_TCP | IPPROTO_UDP => {
                    // A first fragment (or an atomic one, a whole datagram:
                    // RFC 6946) to a pinhole is let in as the pinhole's
                    // unfragmented packet is: the first packet of a
                    // conversation may be large (a SIP INVITE, a DNS
                    // answer over EDNS).
                    if maps::pinhole(dst, proto, get_u16(l4, 2)) {
                        return true;
                    }
                    FlowKey6::new(src, dst, get_u16(l4, 0), get_u16(l4, 2), proto)
                }
                IPPROTO_ICMPV6 if l4[0] == icmp6::ECHO_REPLY => {
                    let id = get_u16(l4, 4);
                    FlowKey6::new(src, dst, id, id, IPPROTO_ICMPV6)
                }
                _ => return false,
            }
        }
        _ => return false,
    };
    maps::live_wan_entry(&mut key, &cfg.timeouts, crate::clock::now())
}

/// The key a reply to the packet that the `ICMPv6` error of type
/// `icmp_type` to the LAN host `dst` quotes at `quoted` (the frame ends at
/// `end`) would carry: the flow it is about; `Err` with whether it is let
/// in all the same (it quotes `IPsec`, or is a Packet Too Big about the
/// host's fragment) or not (quoting another host's packet, what no flow
/// keys, a later fragment).
#[inline(always)]
fn quoted_key(quoted: usize, end: usize, icmp_type: u8, dst: [u8; 16]) -> Result<FlowKey6, bool> {
    if quoted + ipv6::LEN + 8 > end {
        return Err(false);
    }
    // SAFETY: within the bounds checked just above.
    let (q, ql4) = unsafe {
        (
            &*(quoted as *const [u8; ipv6::LEN]),
            &*((quoted + ipv6::LEN) as *const [u8; 8]),
        )
    };
    let qsrc = get_addr6(q, ipv6::SRC);
    if qsrc != dst {
        return Err(false);
    }
    let (qproto, qdst) = (q[ipv6::NEXT_HEADER], get_addr6(q, ipv6::DST));
    match qproto {
        next_header::ESP | next_header::AH => Err(true),
        // Of the errors quoting the LAN host's own fragment a
        // Packet Too Big: the host fragments for itself and must
        // learn the path's MTU (RFC 4890 4.3.1, RFC 8201). The
        // others only about a first fragment of a known flow, by
        // the header it starts with; a later one carries no port
        // to find one by, so it matches no state (RFC 6092 REC-10).
        next_header::FRAGMENT => {
            if icmp_type == icmp6::PACKET_TOO_BIG {
                return Err(true);
            }
            let first = quoted + ipv6::LEN + 8;
            if get_u16(ql4, 2) & 0xfff8 != 0 || first + 8 > end {
                return Err(false);
            }
            // SAFETY: within the bounds checked just above.
            let fl4 = unsafe { &*(first as *const [u8; 8]) };
            match ql4[0] {
                p @ (IPPROTO_TCP | IPPROTO_UDP) => Ok(FlowKey6::new(
                    qdst,
                    qsrc,
                    get_u16(fl4, 2),
                    get_u16(fl4, 0),
                    p,
                )),
                IPPROTO_ICMPV6 if fl4[0] == icmp6::ECHO_REQUEST => {
                    let id = get_u16(fl4, 4);
                    Ok(FlowKey6::new(qdst, qsrc, id, id, IPPROTO_ICMPV6))
                }
                _ => Err(false),
            }
        }
        IPPROTO_TCP | IPPROTO_UDP => Ok(FlowKey6::new(
            qdst,
            qsrc,
            get_u16(ql4, 2),
            get_u16(ql4, 0),
            qproto,
        )),
        IPPROTO_ICMPV6 if ql4[0] == icmp6::ECHO_REQUEST => {
            let id = get_u16(ql4, 4);
            Ok(FlowKey6::new(qdst, qsrc, id, id, IPPROTO_ICMPV6))
        }
        _ => Err(false),
    }
}

/// Whether the destination of the IPv6 packet of `ctx` is one no router
/// forwards to (RFC 4291: loopback, unspecified, IPv4-mapped, multicast),
/// read in place.
#[inline(always)]
fn unroutable_destination(ctx: &XdpContext) -> bool {
    let Ok(ip) = ptr_at::<[u8; ipv6::LEN]>(ctx, frame6::IPV6) else {
        return true;
    };
    // SAFETY: bounds checked by ptr_at; only read.
    let ip = unsafe { &*ip };
    let d = ipv6::DST;
    let zero_to = |n: usize| (d..d + n).all(|i| ip[i] == 0);
    ip[d] == 0xff
        || zero_to(15) && ip[d + 15] <= 1
        || zero_to(10) && ip[d + 10] == 0xff && ip[d + 11] == 0xff
}

/// Whether the FIB routes the IPv6 packet `l3` bytes into the frame of
/// `md` out of `ifindex` (no MTU check): [`routed_to`] at another offset.
// Its own subprogram, as `routed_to` is, for the same reason: in its
// caller's frame the FIB parameters landed on a 4-byte aligned slot.
#[inline(never)]
fn routed_at(md: *mut xdp_md, l3: usize, ifindex: u32) -> bool {
    let (data, end) = crate::parse::bounds(md);
    if l3 > eth::LEN + 16 || data + l3 + ipv6::LEN > end {
        return false;
    }
    // SAFETY: within the bounds checked just above.
    let ip = unsafe { &*((data + l3) as *const [u8; ipv6::LEN]) };
    let mut p = params_sized(ip, 0);
    egress(&XdpContext::new(md), &mut p) == Some(ifindex)
}

/// Standalone mode's source check (BCP 38, RFC 3704 strict reverse path,
/// RFC 6092 3.1) of what the IPv6 path passed from the LAN without opening
/// a flow (a TCP segment of no flow, extension headers, fragments, other
/// protocols, NDP and MLD with a global source): dropped
/// (`drop6_spoofed_source`) if its source is not one the FIB routes back
/// out of the LAN, as a new flow's is checked: Linux has no IPv6
/// `rp_filter` and standalone mode no firewall, so the kernel would
/// forward it with any source (another network's, the router's own).
/// Also what is for the router itself and a hop limit that ran out: the
/// kernel would answer a forged source, out of the WAN (a resolver's
/// answer, a Time Exceeded: reflection). Left: link scope (no source to
/// route), forwarding off, a destination no one routes (loopback,
/// unspecified, IPv4-mapped, multicast: the kernel drops it, and the way
/// back from it cannot be asked), and the packets of known flows or new
/// ones, whose source was checked when they opened (no neighbour, too big
/// for the next hop).
#[inline(always)]
fn judge_lan(ctx: &XdpContext, v: Verdict, lan_ifindex: u32) -> Verdict {
    if matches!(
        v.counter,
        Counter::Pass6LinkScope
            | Counter::PassFibForwardingDisabled
            | Counter::PassNoNeighbour
            | Counter::Pass6PacketTooBig
            | Counter::PassNotConfigured
    ) || v.counter == Counter::PassFibNotForwarded && unroutable_destination(ctx)
        || source_valid(ctx, true, lan_ifindex)
    {
        v
    } else {
        Verdict::drop(Counter::Drop6SpoofedSource)
    }
}

/// Standalone mode, after [`judge_passed`] let a Fragment header pass
/// (`pass6_ext_fragment`; from the LAN, its source judged there): a first
/// fragment of a UDP datagram or an echo request or reply, sent to this
/// router's MAC and with a hop limit it forwards, goes to its flow
/// ([`flow::fragment_of_a_flow`]: tracked, or opened from the LAN to the
/// WAN).
// Inline in the entry point, whose frame has room for the flow key: in
// a subprogram of its own (or in `judge_passed`) the chain down to
// `commit` passed the 512-byte stack.
#[inline(always)]
pub fn fragment_of_a_flow(ctx: &XdpContext) {
    let Some(side) = ingress(ctx) else {
        return;
    };
    if side.cfg.admit != Admit::Xdp as u8 {
        return;
    }
    let (data, end) = crate::parse::bounds(ctx.ctx);
    let l3 = data + frame6::IPV6;
    // The fixed header, the Fragment header, 8 bytes of what it carries.
    if l3 + ipv6::LEN + 16 > end {
        return;
    }
    // SAFETY: within the bounds checked just above.
    let (eth, ip, fragment, l4) = unsafe {
        (
            &*(data as *const [u8; eth::LEN]),
            &*(l3 as *const [u8; ipv6::LEN]),
            &*((l3 + ipv6::LEN) as *const [u8; 8]),
            &*((l3 + ipv6::LEN + 8) as *const [u8; 8]),
        )
    };
    // Within the payload (trailing bytes are no header), a first fragment
    // the kernel forwards (its hop limit), sent to this router.
    if ip[ipv6::NEXT_HEADER] != next_header::FRAGMENT
        || get_u16(ip, ipv6::PAYLOAD_LEN) < 16
        || ip[ipv6::HOP_LIMIT] <= 1
        || get_u16(fragment, 2) & 0xfff8 != 0
        || addressed_to_us(ctx, eth, side, VMAC_IPV6).is_err()
    {
        return;
    }
    let (src, dst) = (get_addr6(ip, ipv6::SRC), get_addr6(ip, ipv6::DST));
    let echo = if side.from_lan {
        icmp6::ECHO_REQUEST
    } else {
        icmp6::ECHO_REPLY
    };
    let key = match fragment[0] {
        IPPROTO_UDP => FlowKey6::new(src, dst, get_u16(l4, 0), get_u16(l4, 2), IPPROTO_UDP),
        IPPROTO_ICMPV6 if l4[0] == echo => {
            let id = get_u16(l4, 4);
            FlowKey6::new(src, dst, id, id, IPPROTO_ICMPV6)
        }
        _ => return,
    };
    flow::fragment_of_a_flow(
        ctx,
        &key,
        side,
        || routed_to(ctx, side.cfg.wan_ifindex),
        crate::clock::now(),
    );
}

/// Whether the FIB routes the IPv6 packet of `ctx` out of `ifindex` (no
/// MTU check).
// A BPF subprogram of its own: inlined, the FIB parameters landed on a
// 4-byte aligned slot, where the addresses' 8-byte stores are refused
// ("misaligned stack access").
#[inline(never)]
fn routed_to(ctx: &XdpContext, ifindex: u32) -> bool {
    let Ok(ip) = ptr_at::<[u8; ipv6::LEN]>(ctx, frame6::IPV6) else {
        return false;
    };
    // SAFETY: bounds checked by ptr_at; only read.
    let ip = unsafe { &*ip };
    let mut p = params_sized(ip, 0);
    egress(ctx, &mut p) == Some(ifindex)
}

/// A WAN packet that no flow or pinhole admits. Offload mode: the kernel
/// decides. Standalone (RFC 6092): dropped if it is addressed to a LAN
/// host; the kernel's if it is for the router itself (or not routable,
/// or routed elsewhere).
#[inline(always)]
pub fn unsolicited(ctx: &XdpContext, ip: &[u8; ipv6::LEN], side: Ingress<'_>) -> Verdict {
    if side.cfg.admit == Admit::Kernel as u8 {
        return Verdict::pass(Counter::PassNotOffloaded);
    }
    if side.from_lan {
        return Verdict::pass(Counter::PassNoFlow);
    }
    // Where it would go, not whether it fits: with the MTU check an
    // oversize packet to a LAN host would be passed and answered with
    // Packet Too Big by the kernel, telling a scanner that the address is
    // routed, where RFC 6092 3 discards unsolicited inbound traffic. The
    // next hop not noted in `NEXT_HOPS`: nothing is forwarded to it.
    let mut p = params_sized(ip, 0);
    match lookup_unnoted(ctx, &mut p) {
        Ok(hop) if hop.egress() == side.cfg.lan_ifindex => Verdict::drop(Counter::Drop6Unsolicited),
        Ok(_) => Verdict::pass(Counter::PassUnsolicited),
        Err(v) => v,
    }
}
