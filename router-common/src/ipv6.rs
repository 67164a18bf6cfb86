//! IPv6 (routed, not translated): header layouts, the classification of an
//! IPv6 header and of `ICMPv6` types, host-tested here and used by the XDP
//! program's IPv6 core.
//!
//! IPv6 routers never fragment and the fast path rewrites nothing that a
//! checksum covers (the hop limit is in no checksum), so there is no
//! checksum logic here.

use crate::hdr::get_u16;
use crate::maps::Counter;

/// IPv6 header (RFC 8200 section 3).
#[expect(
    clippy::module_inception,
    reason = "named like `hdr::ipv4`: fields read `ipv6::HOP_LIMIT`"
)]
pub mod ipv6 {
    /// Length of the fixed header.
    pub const LEN: usize = 40;
    /// Length of an address.
    pub const ADDR_LEN: usize = 16;
    /// Version (high nibble), traffic class, flow label.
    pub const VERSION: usize = 0;
    /// Length of what follows the fixed header.
    pub const PAYLOAD_LEN: usize = 4;
    /// Protocol of the next header (an extension header or the L4).
    pub const NEXT_HEADER: usize = 6;
    /// Hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// Source address.
    pub const SRC: usize = 8;
    /// Destination address.
    pub const DST: usize = 24;
}

/// Offsets of the headers in a frame the IPv6 fast path handles: a packet
/// with extension headers goes to the kernel, so every header sits at a
/// fixed offset.
pub mod frame6 {
    use super::ipv6;
    use crate::hdr::{eth, icmp};

    /// The IPv6 header.
    pub const IPV6: usize = eth::LEN;
    /// The TCP, UDP or `ICMPv6` header.
    pub const L4: usize = IPV6 + ipv6::LEN;
    /// The IPv6 header quoted by an `ICMPv6` error (RFC 4443), after its
    /// 8-byte header (same layout as ICMP's).
    pub const INNER_IPV6: usize = L4 + icmp::LEN;
    /// The first 8 bytes after the quoted IPv6 header: TCP/UDP ports or an
    /// `ICMPv6` header.
    pub const INNER_L4: usize = INNER_IPV6 + ipv6::LEN;
}

/// Least IPv6 payload length of each kind of packet the fast path reads.
pub mod min_payload {
    use crate::hdr::{ICMP_QUOTED_L4_LEN, icmp, tcp, udp};

    /// A TCP segment: its header without options.
    pub const TCP: usize = tcp::LEN;
    /// A UDP datagram.
    pub const UDP: usize = udp::LEN;
    /// An `ICMPv6` message.
    pub const ICMP: usize = icmp::LEN;
    /// An `ICMPv6` error quoting the fixed IPv6 header and 8 bytes after it.
    pub const ICMP_ERROR: usize = icmp::LEN + super::ipv6::LEN + ICMP_QUOTED_L4_LEN;
}

/// `IPPROTO_ICMPV6`.
pub const IPPROTO_ICMPV6: u8 = 58;

/// Next-header values of the extension headers (RFC 8200 section 4, IANA
/// "IPv6 Extension Header Types").
pub mod next_header {
    pub const HOP_BY_HOP: u8 = 0;
    pub const ROUTING: u8 = 43;
    pub const FRAGMENT: u8 = 44;
    pub const ESP: u8 = 50;
    pub const AH: u8 = 51;
    pub const DEST_OPTS: u8 = 60;
    pub const MOBILITY: u8 = 135;
    pub const HIP: u8 = 139;
    pub const SHIM6: u8 = 140;
    pub const EXPERIMENT1: u8 = 253;
    pub const EXPERIMENT2: u8 = 254;
}

/// `ICMPv6` message types (RFC 4443, 4861, 2710, 3810).
pub mod icmp6 {
    pub const DEST_UNREACH: u8 = 1;
    pub const PACKET_TOO_BIG: u8 = 2;
    pub const TIME_EXCEEDED: u8 = 3;
    pub const PARAMETER_PROBLEM: u8 = 4;
    pub const ECHO_REQUEST: u8 = 128;
    pub const ECHO_REPLY: u8 = 129;
    pub const MLD_QUERY: u8 = 130;
    pub const MLD_REPORT: u8 = 131;
    pub const MLD_DONE: u8 = 132;
    pub const ROUTER_SOLICIT: u8 = 133;
    pub const ROUTER_ADVERT: u8 = 134;
    pub const NEIGHBOUR_SOLICIT: u8 = 135;
    pub const NEIGHBOUR_ADVERT: u8 = 136;
    pub const REDIRECT: u8 = 137;
    pub const MLD2_REPORT: u8 = 143;
}

/// An extension header the fast path leaves to the kernel, by kind (each
/// has its counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext {
    HopByHop,
    Routing,
    Fragment,
    DestOpts,
    Esp,
    Ah,
    /// Mobility, HIP, Shim6, the experimental values.
    Other,
}

impl Ext {
    /// The extension header `next` names, if it names one.
    #[must_use]
    pub const fn of(next: u8) -> Option<Self> {
        use next_header as nh;
        Some(match next {
            nh::HOP_BY_HOP => Ext::HopByHop,
            nh::ROUTING => Ext::Routing,
            nh::FRAGMENT => Ext::Fragment,
            nh::DEST_OPTS => Ext::DestOpts,
            nh::ESP => Ext::Esp,
            nh::AH => Ext::Ah,
            nh::MOBILITY | nh::HIP | nh::SHIM6 | nh::EXPERIMENT1 | nh::EXPERIMENT2 => Ext::Other,
            _ => return None,
        })
    }

    /// The pass counter of this kind.
    #[must_use]
    pub const fn counter(self) -> Counter {
        match self {
            Ext::HopByHop => Counter::Pass6ExtHopByHop,
            Ext::Routing => Counter::Pass6ExtRouting,
            Ext::Fragment => Counter::Pass6ExtFragment,
            Ext::DestOpts => Counter::Pass6ExtDestOpts,
            Ext::Esp => Counter::Pass6ExtEsp,
            Ext::Ah => Counter::Pass6ExtAh,
            Ext::Other => Counter::Pass6ExtOther,
        }
    }
}

/// What the fast path may do with an IPv6 header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipv6Verdict {
    /// Global unicast with a transport header next: forwardable.
    Forward,
    /// Version != 6 or payload length beyond the frame.
    Malformed,
    /// Link-local or unspecified source, link-local or multicast
    /// destination: neighbour discovery, router advertisements, MLD, `DHCPv6`
    /// and the like are the kernel's (never routed).
    LinkScope,
    /// Unspecified destination, IPv4-mapped source or destination: no
    /// address a router forwards (RFC 4291 2.5.2, 2.5.5.2; RFC 6890), which
    /// `bpf_fib_lookup` would match to a default route: the kernel's.
    NotForwardable,
    /// An extension header follows: the kernel's.
    Extension(Ext),
    /// Hop limit 0 or 1: the kernel sends time exceeded (RFC 8200 3).
    HopLimit,
}

/// Whether `a` is in `fe80::/10` (link-local unicast).
#[must_use]
pub const fn is_link_local(a: &[u8; 16]) -> bool {
    a[0] == 0xfe && a[1] & 0xc0 == 0x80
}

/// Whether `a` is in `ff00::/8` (multicast).
#[must_use]
pub const fn is_multicast(a: &[u8; 16]) -> bool {
    a[0] == 0xff
}

/// Whether `a` is `::` (the unspecified address of DAD probes).
#[must_use]
pub const fn is_unspecified(a: &[u8; 16]) -> bool {
    let mut i = 0;
    while i < 16 {
        if a[i] != 0 {
            return false;
        }
        i += 1;
    }
    true
}

/// Whether `a` is in `::ffff:0:0/96` (IPv4-mapped: how a dual-stack host
/// names an IPv4 peer to its own sockets, never a packet's address).
#[must_use]
pub const fn is_ipv4_mapped(a: &[u8; 16]) -> bool {
    let mut i = 0;
    while i < 10 {
        if a[i] != 0 {
            return false;
        }
        i += 1;
    }
    a[10] == 0xff && a[11] == 0xff
}

/// The IPv6 address at `at` of header `h`.
#[inline]
#[must_use]
pub fn get_addr6<const N: usize>(h: &[u8; N], at: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&h[at..at + 16]);
    a
}

/// Classifies an IPv6 header; `l3_len` is the frame length after the
/// Ethernet header (trailing padding allowed).
#[must_use]
pub fn classify_ipv6(hdr: &[u8; ipv6::LEN], l3_len: usize) -> Ipv6Verdict {
    let payload_len = usize::from(get_u16(hdr, ipv6::PAYLOAD_LEN));
    if hdr[ipv6::VERSION] >> 4 != 6 || ipv6::LEN + payload_len > l3_len {
        return Ipv6Verdict::Malformed;
    }
    let src = get_addr6(hdr, ipv6::SRC);
    let dst = get_addr6(hdr, ipv6::DST);
    if is_link_local(&src) || is_unspecified(&src) || is_link_local(&dst) || is_multicast(&dst) {
        return Ipv6Verdict::LinkScope;
    }
    if is_unspecified(&dst) || is_ipv4_mapped(&dst) || is_ipv4_mapped(&src) {
        return Ipv6Verdict::NotForwardable;
    }
    if let Some(ext) = Ext::of(hdr[ipv6::NEXT_HEADER]) {
        return Ipv6Verdict::Extension(ext);
    }
    if hdr[ipv6::HOP_LIMIT] <= 1 {
        return Ipv6Verdict::HopLimit;
    }
    Ipv6Verdict::Forward
}

/// What an `ICMPv6` message of `icmp_type` is to the fast path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Icmp6Kind {
    /// Echo request from the LAN or echo reply from the WAN: a flow packet
    /// (the identifier in both port fields).
    Echo,
    /// An echo request from the WAN: it opens nothing (RFC 6092 keeps
    /// inbound flows to pinholes), so it is unsolicited unless it is for
    /// the router itself.
    InboundEchoRequest,
    /// An error from the WAN: destination unreachable, packet too big,
    /// time exceeded, parameter problem, and the unallocated error types
    /// 5-99 and 102-126 (an error's high-order bit is 0, RFC 4443 2.1;
    /// 2.4 (b) has one of an unknown type reach the process that sent the
    /// quoted packet; RFC 4890 4.3.4 leaves them to policy, and Linux's
    /// conntrack relates them to the quoted connection): forwarded if it
    /// quotes a known flow. Not the private experimentation types 100 and
    /// 101 nor 127, reserved for expansion, which RFC 4890 4.3.5 has
    /// dropped.
    Error,
    /// Router/neighbour solicitation and advertisement, redirect.
    Ndp,
    /// Multicast listener discovery.
    Mld,
    /// Anything else (errors from the LAN, LAN hosts' echo replies,
    /// unknown informational types): the kernel's.
    Other,
}

/// The kind of an `ICMPv6` message of `icmp_type` arriving on the LAN
/// (`from_lan`) or the WAN.
#[must_use]
pub const fn icmp6_kind(icmp_type: u8, from_lan: bool) -> Icmp6Kind {
    match (icmp_type, from_lan) {
        (icmp6::ECHO_REQUEST, true) | (icmp6::ECHO_REPLY, false) => Icmp6Kind::Echo,
        (icmp6::ECHO_REQUEST, false) => Icmp6Kind::InboundEchoRequest,
        // DEST_UNREACH (1), PACKET_TOO_BIG, TIME_EXCEEDED,
        // PARAMETER_PROBLEM (4), and the unallocated error types (0 is
        // reserved; 100, 101 and 127: see `Icmp6Kind::Error`).
        (1..=99 | 102..=126, false) => Icmp6Kind::Error,
        (
            icmp6::ROUTER_SOLICIT
            | icmp6::ROUTER_ADVERT
            | icmp6::NEIGHBOUR_SOLICIT
            | icmp6::NEIGHBOUR_ADVERT
            | icmp6::REDIRECT,
            _,
        ) => Icmp6Kind::Ndp,
        (icmp6::MLD_QUERY | icmp6::MLD_REPORT | icmp6::MLD_DONE | icmp6::MLD2_REPORT, _) => {
            Icmp6Kind::Mld
        }
        _ => Icmp6Kind::Other,
    }
}

/// Whether a packet the IPv6 path passed to the kernel with `counter`,
/// arriving from the WAN, is judged by standalone mode's inbound filter:
/// dropped (`drop6_unsolicited`) if the FIB routes it to the LAN. These
/// are the passes that say nothing of a flow: extension headers the fast
/// path does not walk (a TCP SYN or a UDP datagram behind an empty
/// Destination Options header would otherwise reach any LAN host, and the
/// host's plain reply would open a flow that then lets the sender in),
/// fragments (no flow to match them to), other protocols and `ICMPv6`
/// types (`pass_protocol`), MLD between global addresses (never meant to
/// be forwarded). Not NDP: a neighbour solicitation for a LAN address the
/// router answers by proxy NDP is the router's own (the kernel answers it
/// and forwards no NDP a host would take: hop limit 255 only; forwarded
/// to an address no host has, it draws the kernel's address unreachable,
/// as ESP does: a scanner learns which LAN addresses are unused). RFC 6092 section 3: a residential gateway
/// forwards inbound only what matches a flow or is explicitly permitted
/// (REC-31), and drops `ICMPv6` errors that match no flow (REC-10). HIP
/// (REC-26: not to be prohibited) shares its counter with the other rare
/// kinds and is judged with them. A frame not addressed to the WAN
/// interface's own MAC (`pass_not_for_us`): the kernel forwards one that a
/// device on top of the interface takes (a keepalived `use_vmac` macvlan
/// of a VRRP instance this router is a backup of, or that is IPv4 only);
/// for any other it is judged for nothing (the kernel drops it).
///
/// Not judged: ESP and AH (RFC 6092 REC-21, REC-22: a gateway must not
/// prohibit `IPsec` in its default mode; the LAN host's `IPsec` decides), a
/// hop limit that ran out or a link-scope packet (the kernel answers or
/// keeps them; it forwards neither), and the passes of known flows (no
/// neighbour, too large for the next hop).
#[must_use]
pub const fn judged_when_inbound(counter: Counter) -> bool {
    matches!(
        counter,
        Counter::Pass6ExtHopByHop
            | Counter::Pass6ExtRouting
            | Counter::Pass6ExtFragment
            | Counter::Pass6ExtDestOpts
            | Counter::Pass6ExtOther
            | Counter::Pass6Mld
            | Counter::PassProtocol
            | Counter::PassNotForUs
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hdr::set_u16;

    const GLOBAL_A: [u8; 16] = [
        0x20, 0x01, 0x0d, 0xb8, 0, 0x50, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
    ];
    const GLOBAL_B: [u8; 16] = [
        0x20, 0x01, 0x0d, 0xb8, 0, 0x71, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2,
    ];

    fn header(src: [u8; 16], dst: [u8; 16], next: u8, hop_limit: u8, payload: u16) -> [u8; 40] {
        let mut h = [0u8; ipv6::LEN];
        h[ipv6::VERSION] = 0x60;
        set_u16(&mut h, ipv6::PAYLOAD_LEN, payload);
        h[ipv6::NEXT_HEADER] = next;
        h[ipv6::HOP_LIMIT] = hop_limit;
        h[ipv6::SRC..ipv6::SRC + 16].copy_from_slice(&src);
        h[ipv6::DST..ipv6::DST + 16].copy_from_slice(&dst);
        h
    }

    #[test]
    fn inbound_passes_without_a_flow_are_judged_ipsec_and_flow_passes_are_not() {
        for c in [
            Counter::Pass6ExtHopByHop,
            Counter::Pass6ExtRouting,
            Counter::Pass6ExtFragment,
            Counter::Pass6ExtDestOpts,
            Counter::Pass6ExtOther,
            Counter::Pass6Mld,
            Counter::PassProtocol,
            Counter::PassNotForUs,
        ] {
            assert!(judged_when_inbound(c), "{c:?}");
        }
        for c in [
            Counter::Pass6ExtEsp,
            Counter::Pass6ExtAh,
            Counter::Pass6Ndp,
            Counter::Pass6HopLimit,
            Counter::Pass6LinkScope,
            Counter::Pass6PacketTooBig,
            Counter::PassNoNeighbour,
            Counter::PassFibNotForwarded,
            Counter::PassNotOffloaded,
            Counter::PassUnsolicited,
        ] {
            assert!(!judged_when_inbound(c), "{c:?}");
        }
        // Every extension kind but IPsec's.
        for next in 0..=u8::MAX {
            if let Some(ext) = Ext::of(next) {
                assert_eq!(
                    judged_when_inbound(ext.counter()),
                    !matches!(ext, Ext::Esp | Ext::Ah),
                    "{ext:?}"
                );
            }
        }
    }

    #[test]
    fn offsets_match_the_rfc_layouts() {
        assert_eq!(frame6::L4, 54);
        assert_eq!(frame6::INNER_IPV6, 62);
        assert_eq!(frame6::INNER_L4, 102);
        assert_eq!(min_payload::ICMP_ERROR, 56);
    }

    #[test]
    fn plain_global_tcp_is_forwarded() {
        let h = header(GLOBAL_A, GLOBAL_B, 6, 64, 20);
        assert_eq!(classify_ipv6(&h, 60), Ipv6Verdict::Forward);
        // Ethernet minimum-size padding after the packet is fine.
        assert_eq!(classify_ipv6(&h, 66), Ipv6Verdict::Forward);
    }

    #[test]
    fn malformed_version_and_length() {
        let mut h = header(GLOBAL_A, GLOBAL_B, 6, 64, 20);
        assert_eq!(classify_ipv6(&h, 59), Ipv6Verdict::Malformed);
        h[ipv6::VERSION] = 0x40;
        assert_eq!(classify_ipv6(&h, 60), Ipv6Verdict::Malformed);
    }

    #[test]
    fn link_scope_goes_to_the_kernel() {
        let ll = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let ll_high = [0xfe, 0xbf, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let mc = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 2];
        for (s, d) in [
            (ll, GLOBAL_B),
            (ll_high, GLOBAL_B),
            (GLOBAL_A, ll),
            (GLOBAL_A, mc),
            ([0; 16], mc),
            ([0; 16], GLOBAL_B),
        ] {
            let h = header(s, d, IPPROTO_ICMPV6, 255, 8);
            assert_eq!(classify_ipv6(&h, 48), Ipv6Verdict::LinkScope, "{s:?} {d:?}");
        }
        // fec0::/10 (deprecated site-local) is not link-local.
        let site = [0xfe, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let h = header(site, GLOBAL_B, 17, 64, 8);
        assert_eq!(classify_ipv6(&h, 48), Ipv6Verdict::Forward);
    }

    #[test]
    fn unspecified_destination_and_ipv4_mapped_are_not_forwardable() {
        let mapped = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 51, 100, 1];
        for (s, d) in [
            (GLOBAL_A, [0; 16]),
            (GLOBAL_A, mapped),
            (mapped, GLOBAL_B),
            (mapped, mapped),
        ] {
            // Before the extension headers and the hop limit.
            let h = header(s, d, 44, 1, 8);
            assert_eq!(
                classify_ipv6(&h, 48),
                Ipv6Verdict::NotForwardable,
                "{s:?} {d:?}"
            );
        }
        // The unspecified source (a DAD probe) stays link scope.
        let h = header([0; 16], [0; 16], 17, 64, 8);
        assert_eq!(classify_ipv6(&h, 48), Ipv6Verdict::LinkScope);
        // Neighbours of the mapped prefix are addresses like any other:
        // IPv4-compatible (::/96, deprecated), ::fffe:0:0, 64:ff9b::/96
        // (NAT64) and the loopback (the FIB refuses it).
        for d in [
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 198, 51, 100, 1],
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xfe, 198, 51, 100, 1],
            [0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, 198, 51, 100, 1],
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ] {
            let h = header(GLOBAL_A, d, 17, 64, 8);
            assert_eq!(classify_ipv6(&h, 48), Ipv6Verdict::Forward, "{d:?}");
        }
    }

    #[test]
    fn extension_headers_by_kind_before_hop_limit() {
        let cases = [
            (0, Ext::HopByHop),
            (43, Ext::Routing),
            (44, Ext::Fragment),
            (50, Ext::Esp),
            (51, Ext::Ah),
            (60, Ext::DestOpts),
            (135, Ext::Other),
            (139, Ext::Other),
            (140, Ext::Other),
            (253, Ext::Other),
            (254, Ext::Other),
        ];
        for (next, ext) in cases {
            let h = header(GLOBAL_A, GLOBAL_B, next, 1, 8);
            assert_eq!(classify_ipv6(&h, 48), Ipv6Verdict::Extension(ext));
        }
        for next in [6, 17, 58, 59, 47, 132] {
            assert_eq!(Ext::of(next), None, "{next}");
        }
    }

    #[test]
    fn hop_limit_zero_and_one_go_to_the_kernel() {
        for (hl, v) in [
            (0, Ipv6Verdict::HopLimit),
            (1, Ipv6Verdict::HopLimit),
            (2, Ipv6Verdict::Forward),
        ] {
            let h = header(GLOBAL_A, GLOBAL_B, 17, hl, 8);
            assert_eq!(classify_ipv6(&h, 48), v);
        }
    }

    #[test]
    fn icmp6_kinds_by_side() {
        use icmp6::*;
        assert_eq!(icmp6_kind(ECHO_REQUEST, true), Icmp6Kind::Echo);
        assert_eq!(icmp6_kind(ECHO_REPLY, false), Icmp6Kind::Echo);
        assert_eq!(
            icmp6_kind(ECHO_REQUEST, false),
            Icmp6Kind::InboundEchoRequest
        );
        assert_eq!(icmp6_kind(ECHO_REPLY, true), Icmp6Kind::Other);
        for t in [
            DEST_UNREACH,
            PACKET_TOO_BIG,
            TIME_EXCEEDED,
            PARAMETER_PROBLEM,
        ] {
            assert_eq!(icmp6_kind(t, false), Icmp6Kind::Error);
            assert_eq!(icmp6_kind(t, true), Icmp6Kind::Other);
        }
        // Unallocated error types (RFC 4890 4.3.4: 5-99, 102-126), as
        // Linux's conntrack takes them; not the reserved 0, the
        // experimental 100 and 101, 127, nor informational ones.
        for t in [5, 50, 99, 102, 126] {
            assert_eq!(icmp6_kind(t, false), Icmp6Kind::Error);
            assert_eq!(icmp6_kind(t, true), Icmp6Kind::Other);
        }
        for t in [0, 100, 101, 127, 200] {
            assert_eq!(icmp6_kind(t, false), Icmp6Kind::Other);
        }
        for t in [
            ROUTER_SOLICIT,
            ROUTER_ADVERT,
            NEIGHBOUR_SOLICIT,
            NEIGHBOUR_ADVERT,
            REDIRECT,
        ] {
            assert_eq!(icmp6_kind(t, false), Icmp6Kind::Ndp);
            assert_eq!(icmp6_kind(t, true), Icmp6Kind::Ndp);
        }
        for t in [MLD_QUERY, MLD_REPORT, MLD_DONE, MLD2_REPORT] {
            assert_eq!(icmp6_kind(t, true), Icmp6Kind::Mld);
        }
        assert_eq!(icmp6_kind(200, false), Icmp6Kind::Other);
    }
}
