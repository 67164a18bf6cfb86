//! Parse phases of the IPv6 core: the fixed header, then the L4 header of
//! a flow packet. Bounds checked through [`header`], like IPv4's.

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use router_common::{
    flow::{ASSUMED_WSCALE, Segment},
    hdr::{get_u16, icmp, tcp, udp},
    ipv6::{
        IPPROTO_ICMPV6, Icmp6Kind, Ipv6Verdict, classify_ipv6, frame6, get_addr6, icmp6_kind, ipv6,
        min_payload,
    },
    maps::{Counter, IPPROTO_TCP, IPPROTO_UDP},
};

use crate::{
    Step, Verdict,
    parse::{get_u32, header},
};

/// The fixed header: forwardable, or passed (link scope, not a
/// forwardable address, extension headers by kind, hop limit <= 1) or
/// dropped (malformed).
#[inline(always)]
pub fn classify(ctx: &XdpContext, ip: &[u8; ipv6::LEN]) -> Step<()> {
    let l3_len = ctx.data_end() - ctx.data() - frame6::IPV6;
    match classify_ipv6(ip, l3_len) {
        Ipv6Verdict::Forward => Ok(()),
        Ipv6Verdict::Malformed => Err(Verdict::drop(Counter::DropMalformed)),
        Ipv6Verdict::LinkScope => Err(Verdict::pass(Counter::Pass6LinkScope)),
        // As IPv4's destinations a router does not forward (0/8, 240/4).
        Ipv6Verdict::NotForwardable => Err(Verdict::pass(Counter::PassFibNotForwarded)),
        Ipv6Verdict::Extension(ext) => Err(Verdict::pass(ext.counter())),
        Ipv6Verdict::HopLimit => Err(Verdict::pass(Counter::Pass6HopLimit)),
    }
}

/// The tuple of a TCP/UDP/`ICMPv6` echo packet.
#[derive(Clone, Copy)]
pub struct Packet6 {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Ports; for `ICMPv6` echo both are the identifier.
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// TCP control bits, 0 for other protocols.
    pub tcp_flags: u8,
    /// Packet length, fixed header included (what the MTU limits).
    pub len: usize,
}

/// What the L4 parse found.
pub enum L4 {
    /// A packet of a (possible) flow.
    Flow(Packet6),
    /// An `ICMPv6` error from the WAN, quoting a packet of a flow maybe.
    IcmpError,
    /// From the WAN and opening nothing (an echo request).
    Unsolicited,
}

/// Parses the L4 header. `classify` proved payload <= frame, so a header
/// within the payload length is within the frame; [`header`] re-checks for
/// the verifier.
#[inline(always)]
pub fn l4(ctx: &XdpContext, ip: &[u8; ipv6::LEN], from_lan: bool) -> Step<L4> {
    let payload_len = usize::from(get_u16(ip, ipv6::PAYLOAD_LEN));
    let proto = ip[ipv6::NEXT_HEADER];
    let malformed = Verdict::drop(Counter::DropMalformed);
    let (sport, dport, tcp_flags) = match proto {
        IPPROTO_TCP => {
            if payload_len < min_payload::TCP {
                return Err(malformed);
            }
            let tcp: &mut [u8; tcp::LEN] = header(ctx, frame6::L4)?;
            let data_off = usize::from(tcp[tcp::DATA_OFF] >> 4) * 4;
            if data_off < tcp::LEN || data_off > payload_len {
                return Err(malformed);
            }
            (
                get_u16(tcp, tcp::SPORT),
                get_u16(tcp, tcp::DPORT),
                tcp[tcp::FLAGS],
            )
        }
        IPPROTO_UDP => {
            if payload_len < min_payload::UDP {
                return Err(malformed);
            }
            let udp: &mut [u8; udp::LEN] = header(ctx, frame6::L4)?;
            (get_u16(udp, udp::SPORT), get_u16(udp, udp::DPORT), 0)
        }
        IPPROTO_ICMPV6 => {
            if payload_len < min_payload::ICMP {
                return Err(malformed);
            }
            let icmp: &mut [u8; icmp::LEN] = header(ctx, frame6::L4)?;
            let counter = match icmp6_kind(icmp[icmp::TYPE], from_lan) {
                Icmp6Kind::Echo => {
                    let id = get_u16(icmp, icmp::ECHO_ID);
                    return Ok(L4::Flow(packet(ip, id, id, proto, 0, payload_len)));
                }
                Icmp6Kind::Error => return Ok(L4::IcmpError),
                Icmp6Kind::InboundEchoRequest => return Ok(L4::Unsolicited),
                Icmp6Kind::Ndp => Counter::Pass6Ndp,
                Icmp6Kind::Mld => Counter::Pass6Mld,
                Icmp6Kind::Other => Counter::PassProtocol,
            };
            return Err(Verdict::pass(counter));
        }
        // Other protocols (GRE, SCTP, no next header...): the kernel's.
        _ => return Err(Verdict::pass(Counter::PassProtocol)),
    };
    Ok(L4::Flow(packet(
        ip,
        sport,
        dport,
        proto,
        tcp_flags,
        payload_len,
    )))
}

#[inline(always)]
fn packet(
    ip: &[u8; ipv6::LEN],
    sport: u16,
    dport: u16,
    proto: u8,
    tcp_flags: u8,
    payload_len: usize,
) -> Packet6 {
    Packet6 {
        src: get_addr6(ip, ipv6::SRC),
        dst: get_addr6(ip, ipv6::DST),
        sport,
        dport,
        proto,
        tcp_flags,
        len: ipv6::LEN + payload_len,
    }
}

/// Writes into `seg` the TCP fields the window tracking reads, of a
/// packet that [`l4`] found to be TCP: read again from the frame by the
/// subprograms that need them (the hit's window check, a new flow's
/// commit), so the entry point's stack does not hold them; it is at the
/// verifier's limit with the deepest chain of calls below it. All zero if
/// the headers are not where `l4` found them (they are: nothing moved
/// them since).
///
/// Takes the raw context (a register, where `&XdpContext` would put the
/// context on the entry point's stack) and reads its packet bounds with
/// volatile loads: LLVM would otherwise pass the bounds themselves
/// (argument promotion), as 32-bit values that this subprogram widens with
/// shifts the verifier refuses on packet pointers.
#[inline(never)]
pub fn read_tcp_segment(md: *mut xdp_md, seg: &mut Segment) {
    fill_tcp_segment(md, seg);
}

/// [`read_tcp_segment`]'s work, inlined where the caller's frame has room
/// (the hit's `track`, on every TCP segment without SYN, FIN or RST: a
/// call less per packet).
#[inline(always)]
pub fn fill_tcp_segment(md: *mut xdp_md, seg: &mut Segment) {
    let (data, end) = crate::parse::bounds(md);
    // Field by field: a whole-struct write of a zeroed one becomes a byte
    // loop in `memset`.
    if data + frame6::L4 + tcp::LEN > end {
        seg.seq = 0;
        seg.ack = 0;
        seg.len = 0;
        seg.win = 0;
        seg.flags = 0;
        seg.wscale = 0;
        return;
    }
    // SAFETY: both headers lie within the bounds checked above.
    let (ip, tcp) = unsafe {
        (
            &*((data + frame6::IPV6) as *const [u8; ipv6::LEN]),
            &*((data + frame6::L4) as *const [u8; tcp::LEN]),
        )
    };
    let payload_len = usize::from(get_u16(ip, ipv6::PAYLOAD_LEN));
    let data_off = usize::from(tcp[tcp::DATA_OFF] >> 4) * 4;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the payload length field has 16 bits"
    )]
    let len = payload_len.saturating_sub(data_off) as u16;
    seg.seq = get_u32(tcp, tcp::SEQ);
    seg.ack = get_u32(tcp, tcp::ACK_SEQ);
    seg.len = len;
    seg.win = get_u16(tcp, tcp::WINDOW);
    seg.flags = tcp[tcp::FLAGS];
    seg.wscale = ASSUMED_WSCALE;
}
