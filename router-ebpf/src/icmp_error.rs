//! ICMP errors about packets of a flow, translated and forwarded with the
//! flow path's tail: from the WAN about packets the NAT sent, back to the
//! LAN host (RFC 5508 4.2); from a LAN host about packets the NAT
//! delivered to it, out as the NAT's own (RFC 5508 REQ-5), since the
//! kernel, which never saw the flow, would let it leave untranslated.
//! Standalone mode only: in offload mode the kernel saw every flow, and
//! its firewall decides on an error about one.

use aya_ebpf::programs::XdpContext;
use router_common::{
    hdr::{ICMP_QUOTED_L4_LEN, eth, frame, get_addr, get_u16, icmp, ipv4, min_len, udp},
    maps::{Admit, Config, Counter, FlowKey, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP},
    nat::{ErrorWay, ICMP_ECHO_REQUEST, forwardable_addr, translate_icmp_error},
};

use crate::{
    Step, Verdict, debug_log, flow,
    hop::{fib, forward_l2},
    maps::event,
    parse::{Ingress, header},
};

/// If the packet the error quotes belongs to a known flow of this side,
/// translates the quoted header and the outer address (from the WAN: the
/// destination, back to the LAN host; from the LAN: the source, to the
/// NAT's) and forwards it; else the kernel's (from the LAN: it may belong
/// to a slow-path flow, which the kernel translates; the slow-path table
/// drops what it cannot). Offload mode leaves every error to the kernel.
#[inline(always)]
pub fn forward(
    ctx: &XdpContext,
    cfg: &Config,
    from_lan: bool,
    eth: &mut [u8; eth::LEN],
    ip: &mut [u8; ipv4::LEN],
    total_len: usize,
) -> Step<Verdict> {
    if cfg.admit == Admit::Kernel as u8 {
        // Offload mode: the kernel's conntrack knows every flow, even an
        // offloaded one, so its firewall decides on an error about it
        // (a ruleset may accept `established` but not `related`) and its
        // NAT translates it, as nf_flowtable leaves ICMP errors to the
        // slow path.
        return Err(Verdict::pass(Counter::PassNotOffloaded));
    }
    let unsolicited = Verdict::pass(if from_lan {
        Counter::PassNoFlow
    } else {
        Counter::PassUnsolicited
    });
    if total_len < min_len::ICMP_ERROR {
        return Err(unsolicited);
    }
    let inner_ip: &mut [u8; ipv4::LEN] = header(ctx, frame::INNER_IPV4)?;
    let inner_l4: &mut [u8; ICMP_QUOTED_L4_LEN] = header(ctx, frame::INNER_L4)?;
    if inner_ip[ipv4::VERSION_IHL] != ipv4::VERSION_IHL_PLAIN {
        // Quoted header with options or not IPv4: not ours to rewrite.
        return Err(unsolicited);
    }
    // An error goes to the quoted packet's source (from the WAN: the
    // NAT's address; netfilter's `nf_conntrack_inet_error` checks the
    // same, as the IPv6 core does); its sender may be any router on the
    // way. And it quotes the first fragment, the one with the ports: a
    // later one's payload bytes are no ports.
    if get_addr(ip, ipv4::DST) != get_addr(inner_ip, ipv4::SRC)
        || get_u16(inner_ip, ipv4::FRAG_OFF) & ipv4::FRAG_OFFSET != 0
    {
        return Err(unsolicited);
    }
    // The error's own sender, which no flow's key holds (an error is found
    // through the packet it quotes), so no hit's lookup vouches for it: a
    // martian source (RFC 1812 5.3.7: 0/8, 127/8, multicast, broadcast,
    // 240/4) is not forwarded, nor from the WAN one with the router's WAN
    // address (Linux drops both as martians); the kernel gets them. A
    // source the FIB routes to the LAN is not refused: the routers on a
    // path may use addresses a LAN route also covers (a carrier's
    // 100.64/10 next to a VPN's route for it), and Linux's usual loose
    // `rp_filter` takes any source with a route; a Fragmentation Needed
    // refused would break path-MTU discovery.
    let sender = get_addr(ip, ipv4::SRC);
    if !forwardable_addr(sender) {
        return Err(Verdict::pass(Counter::PassFibNotForwarded));
    }
    if !from_lan && sender == cfg.wan_addr {
        return Err(unsolicited);
    }
    let proto = inner_ip[ipv4::PROTO];
    let (src_port_quoted, dst_port_quoted) = match proto {
        IPPROTO_TCP | IPPROTO_UDP => (get_u16(inner_l4, udp::SPORT), get_u16(inner_l4, udp::DPORT)),
        // A quoted echo request the NAT sent to the WAN (a LAN host does
        // not answer echo replies with errors).
        IPPROTO_ICMP if !from_lan && inner_l4[icmp::TYPE] == ICMP_ECHO_REQUEST => {
            let id = get_u16(inner_l4, icmp::ECHO_ID);
            (id, id)
        }
        _ => return Err(unsolicited),
    };
    // A reply to the quoted packet would carry this key: the entry of the
    // direction the error travels.
    let key = FlowKey::new(
        get_addr(inner_ip, ipv4::DST),
        get_addr(inner_ip, ipv4::SRC),
        dst_port_quoted,
        src_port_quoted,
        proto,
    );
    // The entry a hit of a reply to the quoted packet would find, taken as
    // a hit's lookup takes it: on the error's side (from the WAN only a
    // WAN-side entry describes a packet the NAT sent there; from the LAN
    // only a LAN-side one a packet it delivered), and not expired, or a
    // masqueraded UDP flow whose NAT mapping lives (its data still gets
    // through; RFC 5508 REQ-4: an error is translated while the mapping
    // exists).
    let (Some(e), _) = flow::lookup(&key, Ingress { cfg, from_lan }) else {
        return Err(unsolicited);
    };
    // SAFETY: map value pointer from the lookup, valid for this run; plain
    // integers.
    let e = unsafe { &*e };
    // The NAT's side of the flow: the LAN host (inbound) or the mapping
    // (outbound), which the entry's translation of its own direction holds.
    let (way, addr, port, forwarded) = if from_lan {
        (
            ErrorWay::Outbound,
            e.new_src_addr,
            e.new_src_port,
            Counter::FwdOutbound,
        )
    } else {
        (
            ErrorWay::Inbound,
            e.new_dst_addr,
            e.new_dst_port,
            Counter::FwdInbound,
        )
    };
    let dst = if from_lan {
        get_addr(ip, ipv4::DST)
    } else {
        addr
    };
    if !forwardable_addr(dst) {
        return Err(Verdict::pass(Counter::PassFibNotForwarded));
    }
    let hop = fib(ctx, ip, dst)?;
    let icmp: &mut [u8; icmp::LEN] = header(ctx, frame::L4)?;
    // The quoted TCP checksum is rewritten only if the error carries it.
    let tcp_check = if proto == IPPROTO_TCP && total_len >= min_len::ICMP_ERROR_TCP_CHECK {
        Some(header(ctx, frame::INNER_TCP_CHECK)?)
    } else {
        None
    };
    translate_icmp_error(way, ip, icmp, inner_ip, inner_l4, tcp_check, (addr, port));
    event(Counter::IcmpErrorTranslated);
    debug_log::icmp_error_translated(&key, addr, port);
    Ok(forward_l2(eth, ip, &hop, forwarded))
}
