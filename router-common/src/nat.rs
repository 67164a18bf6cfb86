//! Header logic of the NAT: validation of the IPv4 header, the TTL
//! decrement, and address/port rewrites with incremental checksum updates
//! (RFC 1624), including the headers embedded in ICMP errors (RFC 5508).

use crate::checksum::{self, Delta};
use crate::hdr::{self, get_addr, get_u16, icmp, ipv4, set_addr, set_u16, tcp, udp};
use crate::maps::{IPPROTO_ICMP, IPPROTO_UDP};

/// What the fast path may do with an IPv4 header (first 20 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipv4Verdict {
    /// Plain header, forwardable.
    Forward,
    /// Version != 4, IHL < 5, or total length outside `[20, l3_len]`.
    Malformed,
    /// IHL > 5: options are left to the kernel.
    Options,
    /// MF set or fragment offset != 0, and otherwise forwardable (no
    /// options, TTL > 1, header checksum right): the fragment path may
    /// carry it ([`fragment_is_first`]).
    Fragment,
    /// TTL 0 or 1 (RFC 1812 5.3.1: the router must not forward it).
    TtlExceeded,
    /// Header checksum wrong (RFC 1812 5.2.2: verify, silently discard).
    BadChecksum,
}

/// Classifies an IPv4 header; `l3_len` is the frame length after the
/// Ethernet header.
#[must_use]
pub fn classify_ipv4(hdr: &[u8; ipv4::LEN], l3_len: usize) -> Ipv4Verdict {
    let version = hdr[ipv4::VERSION_IHL] >> 4;
    let ihl = hdr[ipv4::VERSION_IHL] & 0x0f;
    let total_len = usize::from(get_u16(hdr, ipv4::TOT_LEN));
    if version != 4 || ihl < 5 || total_len < ipv4::LEN || total_len > l3_len {
        return Ipv4Verdict::Malformed;
    }
    if usize::from(ihl) * 4 > total_len {
        return Ipv4Verdict::Malformed;
    }
    if ihl > 5 {
        return Ipv4Verdict::Options;
    }
    if hdr[ipv4::TTL] <= 1 {
        return Ipv4Verdict::TtlExceeded;
    }
    if !header_checksum_ok(hdr) {
        return Ipv4Verdict::BadChecksum;
    }
    // Last: a fragment is otherwise a header the fast path may forward.
    if get_u16(hdr, ipv4::FRAG_OFF) & ipv4::FRAG_MF_AND_OFFSET != 0 {
        return Ipv4Verdict::Fragment;
    }
    Ipv4Verdict::Forward
}

/// Whether the fragment `hdr` ([`Ipv4Verdict::Fragment`]) is its
/// datagram's first (offset 0, MF set), the one that carries the L4
/// header; a later one carries payload only (RFC 791).
#[must_use]
pub const fn fragment_is_first(hdr: &[u8; ipv4::LEN]) -> bool {
    get_u16(hdr, ipv4::FRAG_OFF) & ipv4::FRAG_OFFSET == 0
}

/// Whether an option-less IPv4 header's checksum verifies (its words sum
/// to 0xffff in one's complement).
///
/// The words are summed in the packet's own byte order: the
/// one's-complement sum does not depend on byte order (RFC 1071 2(B):
/// swapped input gives the swapped sum, and 0xffff is its own swap), so
/// the data path loads each word without a byte swap.
#[must_use]
pub const fn header_checksum_ok(hdr: &[u8; ipv4::LEN]) -> bool {
    let mut sum = 0u32;
    let mut i = 0;
    while i < ipv4::LEN {
        sum += u16::from_ne_bytes([hdr[i], hdr[i + 1]]) as u32;
        i += 2;
    }
    checksum::fold(sum) == 0xffff
}

/// Decrements the TTL and updates the header checksum incrementally: the
/// TTL is the high byte of the word it shares with the protocol (RFC 1624).
pub fn decrement_ttl(hdr: &mut [u8; ipv4::LEN]) {
    let ttl_proto = get_u16(hdr, ipv4::TTL);
    let d = Delta::new().word(ttl_proto, ttl_proto.wrapping_sub(0x0100));
    let check = d.apply(get_u16(hdr, ipv4::CHECK));
    hdr[ipv4::TTL] = hdr[ipv4::TTL].wrapping_sub(1);
    set_u16(hdr, ipv4::CHECK, check);
}

/// Rewrites source and destination address of an IPv4 header, fixing its
/// checksum; returns the change of the TCP/UDP pseudo-header.
pub fn rewrite_addrs(ip: &mut [u8; ipv4::LEN], src: [u8; 4], dst: [u8; 4]) -> Delta {
    let old_src = get_addr(ip, ipv4::SRC);
    let old_dst = get_addr(ip, ipv4::DST);
    let d = Delta::new().addr(old_src, src).addr(old_dst, dst);
    let check = d.apply(get_u16(ip, ipv4::CHECK));
    set_addr(ip, ipv4::SRC, src);
    set_addr(ip, ipv4::DST, dst);
    set_u16(ip, ipv4::CHECK, check);
    d
}

/// Sets the ports of a TCP or UDP header (the same positions in both) and
/// returns the change of those words.
fn set_ports<const N: usize>(l4: &mut [u8; N], sport: u16, dport: u16) -> Delta {
    let old_s = get_u16(l4, udp::SPORT);
    let old_d = get_u16(l4, udp::DPORT);
    set_u16(l4, udp::SPORT, sport);
    set_u16(l4, udp::DPORT, dport);
    Delta::new().word(old_s, sport).word(old_d, dport)
}

/// Rewrites the ports of a TCP header and updates its checksum with the
/// ports' and the pseudo-header's change (`pseudo`, from [`rewrite_addrs`]).
pub fn rewrite_tcp(tcp: &mut [u8; tcp::LEN], pseudo: Delta, sport: u16, dport: u16) {
    let d = set_ports(tcp, sport, dport).merge(pseudo);
    let check = d.apply(get_u16(tcp, tcp::CHECK));
    set_u16(tcp, tcp::CHECK, check);
}

/// [`rewrite_tcp`] for UDP: a zero checksum ("none", RFC 768) stays zero.
pub fn rewrite_udp(udp: &mut [u8; udp::LEN], pseudo: Delta, sport: u16, dport: u16) {
    let d = set_ports(udp, sport, dport).merge(pseudo);
    let check = d.apply_udp(get_u16(udp, udp::CHECK));
    set_u16(udp, udp::CHECK, check);
}

/// Sets the identifier of an ICMP echo request/reply (RFC 792) and updates
/// the ICMP checksum (no pseudo-header). Returns the change of the message's
/// words, for an enclosing checksum.
pub fn rewrite_icmp_echo(icmp: &mut [u8; icmp::LEN], id: u16) -> Delta {
    let old_id = get_u16(icmp, icmp::ECHO_ID);
    let old_check = get_u16(icmp, icmp::CHECK);
    let d = Delta::new().word(old_id, id);
    let check = d.apply(old_check);
    set_u16(icmp, icmp::ECHO_ID, id);
    set_u16(icmp, icmp::CHECK, check);
    d.word(old_check, check)
}

/// Whether `addr` is an address a router forwards a packet to or from:
/// not "this network" (0/8), loopback (127/8), multicast (224/4, which
/// only a multicast router forwards) or reserved and the limited broadcast
/// (240/4; RFC 1812 5.3.5.1, and 5.3.7: a source in any of them is a
/// martian, which a router does not forward). The FIB alone would send
/// such a destination out of the default route, and NAT would translate
/// such a source like any LAN host's; the fast path leaves them to the
/// kernel (which, unlike RFC 1812, takes 240/4 and 0/8 but 0.0.0.0 as
/// unicast).
#[must_use]
pub const fn forwardable_addr(addr: [u8; 4]) -> bool {
    !matches!(addr[0], 0 | 127 | 224..=255)
}

/// ICMP types whose body embeds the offending packet's header.
#[must_use]
pub const fn icmp_is_error(icmp_type: u8) -> bool {
    matches!(
        icmp_type,
        ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM
    )
}

/// Length of the ICMP error frame [`icmp_answer`] builds: Ethernet, IPv4,
/// ICMP and the quote (the received packet's IPv4 header and the first 8
/// bytes of its payload, what RFC 792 asks for).
pub const ICMP_ANSWER_LEN: usize = hdr::frame::INNER_L4 + hdr::ICMP_QUOTED_L4_LEN;
/// Where the received frame sits in that frame before [`icmp_answer`]
/// runs: its IPv4 header already where the quote goes, its Ethernet header
/// just before (overwritten by the new headers).
pub const ICMP_ANSWER_RECEIVED_AT: usize = hdr::frame::INNER_IPV4 - hdr::eth::LEN;
/// TTL of the ICMP errors the data path sends (Linux's default TTL).
pub const ICMP_ERROR_TTL: u8 = 64;
/// Code of a destination unreachable: fragmentation needed and DF set
/// (RFC 792; the next-hop MTU is RFC 1191's).
pub const ICMP_FRAG_NEEDED: u8 = 4;

/// The ICMP error the data path answers a packet of one of its flows with,
/// where the kernel's NAT would have translated the packet and sent the
/// error about it while forwarding (and translated the error's quote back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IcmpAnswer {
    /// Time exceeded in transit: the TTL ran out here (RFC 1812 5.3.1).
    TimeExceeded,
    /// Destination unreachable, fragmentation needed and DF set: larger
    /// than the next hop's MTU `mtu`, which the error carries (RFC 1191
    /// section 4; RFC 1812 5.2.7.1).
    FragmentationNeeded { mtu: u16 },
}

/// Builds, in place, the ICMP error `answer` (RFC 792) back to the sender of
/// the frame whose first `ICMP_ANSWER_LEN - ICMP_ANSWER_RECEIVED_AT` bytes
/// sit at [`ICMP_ANSWER_RECEIVED_AT`]: from the MAC that frame was sent to
/// (the interface's own, or a VRRP virtual MAC it answers for) to the MAC
/// it came from, from `own_addr` to its source address, quoting its IPv4
/// header and 8 payload bytes as received (RFC 792's minimum; Linux
/// quotes up to 576 bytes in all), as a NAT quotes a packet: as its sender
/// sent it. The type of service keeps the received one's and is marked
/// internetwork control, as Linux's errors are (`icmp_send`); DF set, so
/// identification 0 is fine (RFC 6864: an atomic datagram).
pub fn icmp_answer(f: &mut [u8; ICMP_ANSWER_LEN], own_addr: [u8; 4], answer: IcmpAnswer) {
    use hdr::{eth, frame};
    let received = ICMP_ANSWER_RECEIVED_AT;
    let mut peer_mac = [0u8; eth::ADDR_LEN];
    peer_mac.copy_from_slice(&f[received + eth::SRC..received + eth::SRC + eth::ADDR_LEN]);
    let mut own_mac = [0u8; eth::ADDR_LEN];
    own_mac.copy_from_slice(&f[received + eth::DST..received + eth::DST + eth::ADDR_LEN]);
    let remote = get_addr(f, frame::INNER_IPV4 + ipv4::SRC);
    let tos = f[frame::INNER_IPV4 + ipv4::TOS];
    f[eth::DST..eth::DST + eth::ADDR_LEN].copy_from_slice(&peer_mac);
    f[eth::SRC..eth::SRC + eth::ADDR_LEN].copy_from_slice(&own_mac);
    set_u16(f, eth::ETHER_TYPE, eth::P_IPV4);
    let ip = frame::IPV4;
    #[expect(clippy::cast_possible_truncation, reason = "a 56-byte packet")]
    let total = (ICMP_ANSWER_LEN - ip) as u16;
    f[ip + ipv4::VERSION_IHL] = ipv4::VERSION_IHL_PLAIN;
    f[ip + ipv4::TOS] = (tos & 0x1e) | 0xc0;
    set_u16(f, ip + ipv4::TOT_LEN, total);
    set_u16(f, ip + ipv4::ID, 0);
    set_u16(f, ip + ipv4::FRAG_OFF, ipv4::FRAG_DF);
    f[ip + ipv4::TTL] = ICMP_ERROR_TTL;
    f[ip + ipv4::PROTO] = IPPROTO_ICMP;
    set_u16(f, ip + ipv4::CHECK, 0);
    set_addr(f, ip + ipv4::SRC, own_addr);
    set_addr(f, ip + ipv4::DST, remote);
    let c = checksum::checksum(&f[ip..frame::L4]);
    set_u16(f, ip + ipv4::CHECK, c);
    let l4 = frame::L4;
    // The second word: unused (0) but for RFC 1191's next-hop MTU in its
    // low half.
    let (icmp_type, code, mtu) = match answer {
        IcmpAnswer::TimeExceeded => (ICMP_TIME_EXCEEDED, 0, 0),
        IcmpAnswer::FragmentationNeeded { mtu } => (ICMP_DEST_UNREACH, ICMP_FRAG_NEEDED, mtu),
    };
    f[l4 + icmp::TYPE] = icmp_type;
    f[l4 + icmp::CODE] = code;
    set_u16(f, l4 + icmp::CHECK, 0);
    set_u16(f, l4 + icmp::ECHO_ID, 0);
    set_u16(f, l4 + icmp::ECHO_SEQ, mtu);
    let c = checksum::checksum(&f[l4..]);
    set_u16(f, l4 + icmp::CHECK, c);
}

pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_DEST_UNREACH: u8 = 3;
pub const ICMP_ECHO_REQUEST: u8 = 8;
pub const ICMP_TIME_EXCEEDED: u8 = 11;
pub const ICMP_PARAMETER_PROBLEM: u8 = 12;

/// Which way an ICMP error about a flow goes through the NAT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorWay {
    /// From the WAN about a packet the NAT sent there (RFC 5508 section
    /// 4.2): the outer destination and the quoted packet's source become
    /// the LAN host's.
    Inbound,
    /// From a LAN host about a packet of a flow the NAT delivered to it
    /// (RFC 5508 REQ-5): the outer source and the quoted packet's
    /// destination become the NAT's own (its WAN address and the flow's
    /// mapped port).
    Outbound,
}

/// Translates an ICMP error about a flow (RFC 5508, RFC 5382/4787): on
/// the `way` given, one outer address becomes `addr` and the quoted
/// packet's matching endpoint `addr:port` (for a quoted ICMP echo, `port`
/// is the identifier). Fixes, incrementally, the outer IPv4 checksum, the
/// embedded IPv4 checksum, the embedded UDP checksum (unless 0), the
/// embedded TCP checksum when the error carries it (`inner_tcp_check`),
/// the embedded echo's checksum, and the outer ICMP checksum over all of
/// those changes.
pub fn translate_icmp_error(
    way: ErrorWay,
    outer_ip: &mut [u8; ipv4::LEN],
    icmp: &mut [u8; icmp::LEN],
    inner_ip: &mut [u8; ipv4::LEN],
    inner_l4: &mut [u8; hdr::ICMP_QUOTED_L4_LEN],
    inner_tcp_check: Option<&mut [u8; 2]>,
    (addr, port): ([u8; 4], u16),
) {
    let (outer_src, outer_dst) = (get_addr(outer_ip, ipv4::SRC), get_addr(outer_ip, ipv4::DST));
    let (inner_src, inner_dst) = (get_addr(inner_ip, ipv4::SRC), get_addr(inner_ip, ipv4::DST));
    let inbound = way == ErrorWay::Inbound;
    // The outer and the quoted addresses after translation.
    let ((new_outer_src, new_outer_dst), (new_inner_src, new_inner_dst)) = if inbound {
        ((outer_src, addr), (addr, inner_dst))
    } else {
        ((addr, outer_dst), (inner_src, addr))
    };
    let _ = rewrite_addrs(outer_ip, new_outer_src, new_outer_dst);

    let old_inner_check = get_u16(inner_ip, ipv4::CHECK);
    let pseudo = rewrite_addrs(inner_ip, new_inner_src, new_inner_dst);
    let new_inner_check = get_u16(inner_ip, ipv4::CHECK);
    let mut outer = pseudo.word(old_inner_check, new_inner_check);

    match inner_ip[ipv4::PROTO] {
        IPPROTO_ICMP => {
            outer = outer.merge(rewrite_icmp_echo(inner_l4, port));
        }
        proto => {
            let (quoted_src_port, quoted_dst_port) =
                (get_u16(inner_l4, udp::SPORT), get_u16(inner_l4, udp::DPORT));
            let ports = if inbound {
                set_ports(inner_l4, port, quoted_dst_port)
            } else {
                set_ports(inner_l4, quoted_src_port, port)
            };
            outer = outer.merge(ports);
            let l4 = ports.merge(pseudo);
            if proto == IPPROTO_UDP {
                let old = get_u16(inner_l4, udp::CHECK);
                let new = l4.apply_udp(old);
                set_u16(inner_l4, udp::CHECK, new);
                outer = outer.word(old, new);
            } else if let Some(c) = inner_tcp_check {
                let old = u16::from_be_bytes(*c);
                let new = l4.apply(old);
                *c = new.to_be_bytes();
                outer = outer.word(old, new);
            }
        }
    }
    let check = outer.apply(get_u16(icmp, icmp::CHECK));
    set_u16(icmp, icmp::CHECK, check);
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::checksum::l4_checksum;
    use crate::maps::IPPROTO_TCP;
    use proptest::prelude::*;
    use std::vec::Vec;

    #[test]
    fn only_unicast_addresses_are_forwardable() {
        for ok in [
            [1, 0, 0, 0],
            [10, 0, 0, 1],
            [126, 255, 255, 255],
            [128, 0, 0, 1],
            [223, 255, 255, 254],
        ] {
            assert!(forwardable_addr(ok), "{ok:?}");
        }
        for not in [
            [0, 0, 0, 0],
            [0, 1, 2, 3],
            [127, 0, 0, 1],
            [224, 0, 0, 251],
            [239, 255, 255, 250],
            [240, 0, 0, 1],
            [255, 255, 255, 255],
        ] {
            assert!(!forwardable_addr(not), "{not:?}");
        }
    }

    /// IPv4 + L4 packet with correct checksums computed from scratch.
    fn packet(proto: u8, src: [u8; 4], dst: [u8; 4], l4: &[u8]) -> Vec<u8> {
        let mut h = [0u8; ipv4::LEN];
        h[ipv4::VERSION_IHL] = ipv4::VERSION_IHL_PLAIN;
        set_u16(
            &mut h,
            ipv4::TOT_LEN,
            u16::try_from(ipv4::LEN + l4.len()).unwrap(),
        );
        set_u16(&mut h, ipv4::ID, 0x1234);
        set_u16(&mut h, ipv4::FRAG_OFF, 0x4000);
        h[ipv4::TTL] = 64;
        h[ipv4::PROTO] = proto;
        set_addr(&mut h, ipv4::SRC, src);
        set_addr(&mut h, ipv4::DST, dst);
        let c = checksum::checksum(&h);
        set_u16(&mut h, ipv4::CHECK, c);
        let mut p = h.to_vec();
        p.extend_from_slice(l4);
        fix_l4(&mut p);
        p
    }

    /// Recomputes the L4 checksum of an IPv4 packet from scratch.
    fn fix_l4(p: &mut [u8]) {
        let (src, dst, proto) = (addr(p, ipv4::SRC), addr(p, ipv4::DST), p[ipv4::PROTO]);
        let off = ipv4::LEN
            + match proto {
                IPPROTO_TCP => tcp::CHECK,
                IPPROTO_UDP => udp::CHECK,
                _ => icmp::CHECK,
            };
        p[off..off + 2].fill(0);
        let c = if proto == IPPROTO_ICMP {
            checksum::checksum(&p[ipv4::LEN..])
        } else {
            let c = l4_checksum(src, dst, proto, &p[ipv4::LEN..]);
            if proto == IPPROTO_UDP && c == 0 {
                0xffff
            } else {
                c
            }
        };
        p[off..off + 2].copy_from_slice(&c.to_be_bytes());
    }

    fn addr(p: &[u8], at: usize) -> [u8; 4] {
        p[at..at + ipv4::ADDR_LEN].try_into().unwrap()
    }

    /// Asserts that every checksum in `p` equals a recomputation.
    fn assert_checksums(p: &[u8]) {
        let mut q = p.to_vec();
        q[ipv4::CHECK..ipv4::CHECK + 2].fill(0);
        let c = checksum::checksum(&q[..ipv4::LEN]);
        q[ipv4::CHECK..ipv4::CHECK + 2].copy_from_slice(&c.to_be_bytes());
        fix_l4(&mut q);
        assert_eq!(p, &q[..], "incremental checksums differ from recomputation");
    }

    /// Offset of the L4 header in an IPv4 packet (no Ethernet header here).
    const L4: usize = ipv4::LEN;

    /// A TCP or UDP header's first bytes with these ports, over `body`.
    fn with_ports(mut body: Vec<u8>, sport: u16, dport: u16) -> Vec<u8> {
        body[udp::SPORT..udp::SPORT + 2].copy_from_slice(&sport.to_be_bytes());
        body[udp::DPORT..udp::DPORT + 2].copy_from_slice(&dport.to_be_bytes());
        body
    }

    proptest! {
        #[test]
        fn tcp_rewrite_equals_recompute(
            src: [u8; 4], dst: [u8; 4], nsrc: [u8; 4], ndst: [u8; 4],
            sp: u16, dp: u16, nsp: u16, ndp: u16,
            body in proptest::collection::vec(any::<u8>(), 20..200),
        ) {
            let mut l4 = with_ports(body, sp, dp);
            l4[tcp::DATA_OFF] = 0x50;
            let mut p = packet(IPPROTO_TCP, src, dst, &l4);
            let (ip, rest) = p.split_at_mut(L4);
            let pseudo = rewrite_addrs(ip.try_into().unwrap(), nsrc, ndst);
            rewrite_tcp((&mut rest[..tcp::LEN]).try_into().unwrap(), pseudo, nsp, ndp);
            prop_assert_eq!(addr(&p, ipv4::SRC), nsrc);
            prop_assert_eq!(&p[L4..L4 + 4], &with_ports(std::vec![0; 4], nsp, ndp)[..]);
            assert_checksums(&p);
        }

        #[test]
        fn udp_rewrite_equals_recompute(
            src: [u8; 4], dst: [u8; 4], nsrc: [u8; 4], ndst: [u8; 4],
            nsp: u16, ndp: u16, body in proptest::collection::vec(any::<u8>(), 8..200),
            no_checksum: bool,
        ) {
            let mut l4 = body;
            let len = u16::try_from(l4.len()).unwrap();
            l4[udp::LENGTH..udp::LENGTH + 2].copy_from_slice(&len.to_be_bytes());
            let mut p = packet(IPPROTO_UDP, src, dst, &l4);
            let check = L4 + udp::CHECK..L4 + udp::CHECK + 2;
            if no_checksum {
                p[check.clone()].fill(0);
            }
            let (ip, rest) = p.split_at_mut(L4);
            let pseudo = rewrite_addrs(ip.try_into().unwrap(), nsrc, ndst);
            rewrite_udp((&mut rest[..udp::LEN]).try_into().unwrap(), pseudo, nsp, ndp);
            if no_checksum {
                prop_assert_eq!(&p[check], &[0, 0]);
            } else {
                assert_checksums(&p);
            }
        }

        #[test]
        fn icmp_echo_rewrite_equals_recompute(
            src: [u8; 4], dst: [u8; 4], id: u16, body in proptest::collection::vec(any::<u8>(), 8..100),
        ) {
            let mut l4 = body;
            l4[icmp::TYPE] = ICMP_ECHO_REQUEST;
            l4[icmp::CODE] = 0;
            let mut p = packet(IPPROTO_ICMP, src, dst, &l4);
            let _ = rewrite_icmp_echo((&mut p[L4..L4 + icmp::LEN]).try_into().unwrap(), id);
            prop_assert_eq!(&p[L4 + icmp::ECHO_ID..L4 + icmp::ECHO_ID + 2], &id.to_be_bytes());
            assert_checksums(&p);
        }

        /// An ICMP error quoting a whole UDP/TCP/echo packet (or, for TCP,
        /// only its first 8 bytes), either way: from the WAN about a packet
        /// the NAT sent (the quoted source becomes the LAN host's, and the
        /// outer destination), or from the LAN host about a packet the NAT
        /// delivered to it (the quoted destination becomes the NAT's
        /// mapping, and the outer source its address). After translation
        /// every checksum (outer IP, ICMP, inner IP, inner L4) equals a
        /// recomputation.
        #[test]
        fn icmp_error_translation_equals_recompute(
            which in 0u8..3, router: [u8; 4], wan: [u8; 4], remote: [u8; 4], lan: [u8; 4],
            wport: u16, lport: u16, rport: u16, with_tcp_check: bool, udp_zero: bool,
            outbound: bool,
            body in proptest::collection::vec(any::<u8>(), 20..64),
        ) {
            let proto = [IPPROTO_UDP, IPPROTO_TCP, IPPROTO_ICMP][usize::from(which)];
            // Inbound: the NAT sent wan:wport -> remote:rport. Outbound: it
            // delivered remote:rport -> lan:lport (an echo: id lport).
            let (q_src, q_dst, q_sport, q_dport) = if outbound {
                (remote, lan, rport, lport)
            } else {
                (wan, remote, wport, rport)
            };
            let mut l4 = body;
            match proto {
                IPPROTO_TCP => {
                    l4 = with_ports(l4, q_sport, q_dport);
                    l4[tcp::DATA_OFF] = 0x50;
                }
                IPPROTO_UDP => {
                    l4 = with_ports(l4, q_sport, q_dport);
                    let len = u16::try_from(l4.len()).unwrap();
                    l4[udp::LENGTH..udp::LENGTH + 2].copy_from_slice(&len.to_be_bytes());
                }
                _ => {
                    l4[icmp::TYPE] = ICMP_ECHO_REQUEST;
                    l4[icmp::CODE] = 0;
                    let id = if outbound { lport } else { wport };
                    l4[icmp::ECHO_ID..icmp::ECHO_ID + 2].copy_from_slice(&id.to_be_bytes());
                }
            }
            let udp_check = L4 + udp::CHECK..L4 + udp::CHECK + 2;
            let mut inner = packet(proto, q_src, q_dst, &l4);
            if proto == IPPROTO_UDP && udp_zero {
                inner[udp_check.clone()].fill(0);
            }
            // The error quotes the whole packet, or (for TCP without the
            // checksum) just the IP header and 8 bytes.
            let least = ipv4::LEN + hdr::ICMP_QUOTED_L4_LEN;
            let quoted = if proto == IPPROTO_TCP && !with_tcp_check { least } else { inner.len() };
            let mut icmp = std::vec![ICMP_DEST_UNREACH, 4, 0, 0, 0, 0, 0x05, 0xdc];
            icmp.extend_from_slice(&inner[..quoted]);
            let mut outer = if outbound {
                packet(IPPROTO_ICMP, lan, remote, &icmp)
            } else {
                packet(IPPROTO_ICMP, router, wan, &icmp)
            };

            let (o_ip, rest) = outer.split_at_mut(ipv4::LEN);
            let (o_icmp, rest) = rest.split_at_mut(icmp::LEN);
            let (i_ip, rest) = rest.split_at_mut(ipv4::LEN);
            let (i_l4, rest) = rest.split_at_mut(hdr::ICMP_QUOTED_L4_LEN);
            let tcp_check = if proto == IPPROTO_TCP && quoted > least {
                let at = tcp::CHECK - hdr::ICMP_QUOTED_L4_LEN;
                Some((&mut rest[at..at + 2]).try_into().unwrap())
            } else {
                None
            };
            let (way, to_addr, to_port) = if outbound {
                (ErrorWay::Outbound, wan, wport)
            } else {
                (ErrorWay::Inbound, lan, lport)
            };
            translate_icmp_error(
                way, o_ip.try_into().unwrap(), o_icmp.try_into().unwrap(),
                i_ip.try_into().unwrap(), i_l4.try_into().unwrap(), tcp_check, (to_addr, to_port),
            );
            // Outer: the LAN host's destination (inbound) or the NAT's
            // source (outbound); IP and ICMP checksums right.
            let (outer_at, inner_at, port_field) = if outbound {
                (ipv4::SRC, ipv4::DST, udp::DPORT)
            } else {
                (ipv4::DST, ipv4::SRC, udp::SPORT)
            };
            prop_assert_eq!(addr(&outer, outer_at), to_addr);
            assert_checksums(&outer);
            // Inner: the translated endpoint's address and port.
            let inner_new = &outer[L4 + icmp::LEN..];
            prop_assert_eq!(addr(inner_new, inner_at), to_addr);
            let port_at = L4 + if proto == IPPROTO_ICMP { icmp::ECHO_ID } else { port_field };
            prop_assert_eq!(&inner_new[port_at..port_at + 2], &to_port.to_be_bytes());
            let inner_hdr: [u8; ipv4::LEN] = inner_new[..ipv4::LEN].try_into().unwrap();
            let mut h = inner_hdr;
            set_u16(&mut h, ipv4::CHECK, 0);
            prop_assert_eq!(checksum::checksum(&h), get_u16(&inner_hdr, ipv4::CHECK));
            if quoted == inner.len() {
                if proto == IPPROTO_UDP && udp_zero {
                    prop_assert_eq!(&inner_new[udp_check], &[0, 0]);
                } else {
                    assert_checksums(inner_new);
                }
            }
        }

        /// The incremental TTL decrement equals a recomputation for any
        /// header with a correct checksum.
        #[test]
        fn ttl_decrement_equals_recompute(body in proptest::array::uniform20(any::<u8>())) {
            let mut h = body;
            set_u16(&mut h, ipv4::CHECK, 0);
            let c = checksum::checksum(&h);
            set_u16(&mut h, ipv4::CHECK, c);
            let ttl = h[ipv4::TTL];
            decrement_ttl(&mut h);
            prop_assert_eq!(h[ipv4::TTL], ttl.wrapping_sub(1));
            prop_assert!(matches!(checksum::checksum(&h), 0 | 0xffff));
        }
    }

    fn header(ttl: u8) -> [u8; ipv4::LEN] {
        let mut h = [
            0x45, 0, 0, 60, 0x12, 0x34, 0x40, 0, ttl, 6, 0, 0, 192, 168, 50, 2, 203, 0, 113, 2,
        ];
        let c = checksum::checksum(&h);
        set_u16(&mut h, ipv4::CHECK, c);
        h
    }

    #[test]
    fn classify_cases() {
        assert_eq!(classify_ipv4(&header(64), 60), Ipv4Verdict::Forward);
        assert_eq!(classify_ipv4(&header(64), 59), Ipv4Verdict::Malformed);
        assert_eq!(classify_ipv4(&header(1), 60), Ipv4Verdict::TtlExceeded);
        assert_eq!(classify_ipv4(&header(0), 60), Ipv4Verdict::TtlExceeded);
        let mut h = header(64);
        h[ipv4::VERSION_IHL] = 0x44;
        assert_eq!(classify_ipv4(&h, 60), Ipv4Verdict::Malformed);
        h[ipv4::VERSION_IHL] = 0x46;
        assert_eq!(classify_ipv4(&h, 60), Ipv4Verdict::Options);
        h[ipv4::VERSION_IHL] = 0x65;
        assert_eq!(classify_ipv4(&h, 60), Ipv4Verdict::Malformed);
        let fragment = |frag_off: u16, ttl: u8| {
            let mut h = header(ttl);
            set_u16(&mut h, ipv4::CHECK, 0);
            set_u16(&mut h, ipv4::FRAG_OFF, frag_off);
            let c = checksum::checksum(&h);
            set_u16(&mut h, ipv4::CHECK, c);
            h
        };
        // MF: the first fragment; offset 8 (MF or not): a later one; DF
        // alone is no fragment.
        for (frag_off, first) in [
            (0x2000, true),
            (0x6000, true),
            (0x0001, false),
            (0x2001, false),
        ] {
            let h = fragment(frag_off, 64);
            assert_eq!(
                classify_ipv4(&h, 60),
                Ipv4Verdict::Fragment,
                "{frag_off:#x}"
            );
            assert_eq!(fragment_is_first(&h), first, "{frag_off:#x}");
        }
        assert_eq!(
            classify_ipv4(&fragment(0x4000, 64), 60),
            Ipv4Verdict::Forward
        );
        // A fragment is judged like any packet first: TTL, checksum, options.
        assert_eq!(
            classify_ipv4(&fragment(0x2000, 1), 60),
            Ipv4Verdict::TtlExceeded
        );
        let mut bad = fragment(0x2000, 64);
        bad[ipv4::CHECK] ^= 1;
        assert_eq!(classify_ipv4(&bad, 60), Ipv4Verdict::BadChecksum);
        let mut opts = fragment(0x2000, 64);
        opts[ipv4::VERSION_IHL] = 0x46;
        assert_eq!(classify_ipv4(&opts, 60), Ipv4Verdict::Options);
    }

    #[test]
    fn icmp_answers_go_back_to_the_sender_quoting_what_it_sent() {
        let (own_mac, peer_mac) = ([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 9]);
        let own_addr = [203, 0, 113, 1];
        let mut received = header(1);
        received[ipv4::TOS] = 0x2e;
        set_u16(&mut received, ipv4::CHECK, 0);
        let c = checksum::checksum(&received);
        set_u16(&mut received, ipv4::CHECK, c);
        let payload = [0x00, 0x35, 0x9c, 0x40, 0x00, 0x28, 0xab, 0xcd];
        let mut received_frame = [0x77u8; ICMP_ANSWER_LEN];
        let at = ICMP_ANSWER_RECEIVED_AT;
        received_frame[at..at + 6].copy_from_slice(&own_mac);
        received_frame[at + 6..at + 12].copy_from_slice(&peer_mac);
        received_frame[at + 12..at + 14].copy_from_slice(&[0x08, 0x00]);
        received_frame[at + 14..at + 34].copy_from_slice(&received);
        received_frame[at + 34..].copy_from_slice(&payload);
        let mut f = received_frame;
        icmp_answer(&mut f, own_addr, IcmpAnswer::TimeExceeded);
        assert_eq!(f[..6], peer_mac);
        assert_eq!(f[6..12], own_mac);
        assert_eq!(f[12..14], [0x08, 0x00]);
        let ip: [u8; 20] = f[14..34].try_into().unwrap();
        assert_eq!(
            ip,
            [
                0x45,
                0xc0 | 0x0e,
                0,
                56,
                0,
                0,
                0x40,
                0,
                64,
                1,
                ip[10],
                ip[11],
                203,
                0,
                113,
                1,
                received[12],
                received[13],
                received[14],
                received[15],
            ]
        );
        assert_eq!(checksum::checksum(&ip), 0, "IPv4 header checksum");
        assert_eq!(f[34..42], [11, 0, f[36], f[37], 0, 0, 0, 0]);
        assert_eq!(checksum::checksum(&f[34..]), 0, "ICMP checksum");
        assert_eq!(f[42..62], received, "the quote: the header as received");
        assert_eq!(f[62..], payload, "and 8 bytes of payload");

        // Fragmentation needed: the same but for the ICMP header, whose
        // second word carries the next-hop MTU (RFC 1191).
        let mut g = received_frame;
        icmp_answer(
            &mut g,
            own_addr,
            IcmpAnswer::FragmentationNeeded { mtu: 1400 },
        );
        assert_eq!(g[..34], f[..34], "the same Ethernet and IPv4 headers");
        assert_eq!(g[34..42], [3, 4, g[36], g[37], 0, 0, 0x05, 0x78]);
        assert_eq!(checksum::checksum(&g[34..]), 0, "ICMP checksum");
        assert_eq!(g[42..], f[42..], "the same quote");
    }

    #[test]
    fn bad_header_checksum_is_detected() {
        let h = header(64);
        assert!(header_checksum_ok(&h));
        for bit in 0..160 {
            let mut b = h;
            b[bit / 8] ^= 1 << (bit % 8);
            // Flipping any single bit breaks the checksum; classification
            // sees it last (after the other header checks).
            assert!(!header_checksum_ok(&b), "bit {bit}");
        }
        let mut b = h;
        b[ipv4::CHECK] ^= 0x01;
        assert_eq!(classify_ipv4(&b, 60), Ipv4Verdict::BadChecksum);
        b[ipv4::TTL] = 1;
        assert_eq!(classify_ipv4(&b, 60), Ipv4Verdict::TtlExceeded);
    }

    proptest::proptest! {
        /// The 32-bit native-order verification agrees with the RFC 1071
        /// checksum of the header taken 16 bits at a time, big-endian.
        #[test]
        fn header_checksum_ok_matches_rfc1071(
            mut h in proptest::array::uniform20(proptest::prelude::any::<u8>()),
            fix in proptest::prelude::any::<bool>(),
        ) {
            h[ipv4::VERSION_IHL] = 0x45;
            if fix {
                set_u16(&mut h, ipv4::CHECK, 0);
                let c = checksum::checksum(&h);
                set_u16(&mut h, ipv4::CHECK, c);
            }
            proptest::prop_assert_eq!(header_checksum_ok(&h), checksum::checksum(&h) == 0);
        }
    }

    #[test]
    fn ttl_decrement_keeps_checksum_valid() {
        for ttl in 2..=255 {
            let mut h = header(ttl);
            decrement_ttl(&mut h);
            assert_eq!(h[ipv4::TTL], ttl - 1);
            let mut z = h;
            set_u16(&mut z, ipv4::CHECK, 0);
            assert_eq!(checksum::checksum(&z), get_u16(&h, ipv4::CHECK));
        }
    }
}
