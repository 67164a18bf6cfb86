//! `ICMPv6` errors from the WAN (destination unreachable, Packet Too Big,
//! time exceeded, parameter problem) about a packet of a known flow:
//! forwarded to the LAN host unchanged (routed: nothing to translate), so
//! path-MTU discovery and traceroute work through the firewall. Standalone
//! mode only: offload mode leaves every error to the kernel, whose
//! firewall decides on it.

use aya_ebpf::programs::XdpContext;
use router_common::{
    hdr::{ICMP_QUOTED_L4_LEN, eth, get_u16, icmp, udp},
    ipv6::{Ext, IPPROTO_ICMPV6, frame6, get_addr6, icmp6, ipv6, min_payload},
    maps::{Admit, Counter, FlowKey6, IPPROTO_TCP, IPPROTO_UDP},
};

use super::{fib6, forward as forward_l2, maps::live_wan_entry, unsolicited};
use crate::{Step, Verdict, hop::Hop, maps::event, parse::Ingress, parse::header};

/// Forwards the error if the packet it quotes was sent by a LAN host (the
/// outer destination) in a known flow; else it is unsolicited.
#[inline(always)]
pub fn forward(
    ctx: &XdpContext,
    side: Ingress<'_>,
    eth: &mut [u8; eth::LEN],
    ip: &mut [u8; ipv6::LEN],
) -> Step<Verdict> {
    if side.cfg.admit == Admit::Kernel as u8 {
        // Offload mode: the kernel's, as IPv4's (`crate::icmp_error`).
        return Err(Verdict::pass(Counter::PassNotOffloaded));
    }
    if usize::from(get_u16(ip, ipv6::PAYLOAD_LEN)) < min_payload::ICMP_ERROR {
        return Err(unsolicited(ctx, ip, side));
    }
    let inner_ip: &mut [u8; ipv6::LEN] = header(ctx, frame6::INNER_IPV6)?;
    let inner_l4: &mut [u8; ICMP_QUOTED_L4_LEN] = header(ctx, frame6::INNER_L4)?;
    let proto = inner_ip[ipv6::NEXT_HEADER];
    let ports = match proto {
        IPPROTO_TCP | IPPROTO_UDP => {
            Some((get_u16(inner_l4, udp::SPORT), get_u16(inner_l4, udp::DPORT)))
        }
        IPPROTO_ICMPV6 if inner_l4[icmp::TYPE] == icmp6::ECHO_REQUEST => {
            let id = get_u16(inner_l4, icmp::ECHO_ID);
            Some((id, id))
        }
        // Extension headers in the quoted packet, other protocols.
        _ => None,
    };
    let quoted_src = get_addr6(inner_ip, ipv6::SRC);
    if inner_ip[ipv6::VERSION] >> 4 != 6 || quoted_src != get_addr6(ip, ipv6::DST) {
        return Err(unsolicited(ctx, ip, side));
    }
    let Some((sport, dport)) = ports else {
        // About a packet the fast path does not carry (its extension
        // headers or protocol). About IPsec, which standalone mode lets
        // through both ways (RFC 6092 REC-21, REC-22): the kernel's to
        // forward, counted by the quoted kind (REC-23: a gateway that
        // forwards ESP forwards its errors; RFC 4890 4.3.1: Packet Too
        // Big must not be dropped). Any other (a fragment, destination
        // options, GRE): `pass_protocol`, which standalone mode's inbound
        // filter drops if it is addressed to a LAN host, as it drops the
        // inbound traffic itself (REC-10: errors matching no state).
        //
        // An error quoting a fragment the LAN host sent passes too
        // (`pass6_ext_fragment`), and standalone mode's inbound filter
        // lets a Packet Too Big of those reach the host (`solicited_at`):
        // the host fragments for itself and must learn the path's MTU
        // (RFC 4890 4.3.1; RFC 8201); the other types only about a first
        // fragment of a known flow (`quoted_key`), else they match no state. (Not
        // told apart here: reading the type would grow the entry point's
        // frame, which this path is inlined into, past the verifier's
        // limit.)
        return Err(Verdict::pass(match Ext::of(proto) {
            Some(ext @ (Ext::Esp | Ext::Ah | Ext::Fragment)) => ext.counter(),
            _ => Counter::PassProtocol,
        }));
    };
    // A reply to the quoted packet would carry this key.
    let mut key = FlowKey6::new(
        get_addr6(inner_ip, ipv6::DST),
        quoted_src,
        dport,
        sport,
        proto,
    );
    if !live_wan_entry(&mut key, &side.cfg.timeouts, crate::clock::now()) {
        return Err(unsolicited(ctx, ip, side));
    }
    let hop = fib6(ctx, ip)?;
    // Counted only when redirected: without a neighbour entry `forward_l2`
    // passes the error for the kernel to resolve and forward
    // (`pass_no_neighbour`), which is not the fast path forwarding it.
    if matches!(hop, Hop::Redirect { .. }) {
        event(Counter::Icmp6ErrorForwarded);
    }
    Ok(forward_l2(eth, ip, &hop, Counter::Fwd6Inbound))
}
