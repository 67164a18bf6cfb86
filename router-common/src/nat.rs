//! Header logic of the NAT: validation of the IPv4 header, the TTL
//! decrement, and address/port rewrites with incremental checksum updates
//! (RFC 1624), including the headers embedded in ICMP errors (RFC 5508).

use crate::checksum::{self, Delta};
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
    /// MF set or fragment offset != 0.
    Fragment,
    /// TTL 0 or 1 (RFC 1812 5.3.1: the router must not forward it).
    TtlExceeded,
    /// Header checksum wrong (RFC 1812 5.2.2: verify, silently discard).
    BadChecksum,
}

/// Classifies an IPv4 header; `l3_len` is the frame length after the
/// Ethernet header.
#[must_use]
pub fn classify_ipv4(hdr: &[u8; 20], l3_len: usize) -> Ipv4Verdict {
    let version = hdr[0] >> 4;
    let ihl = hdr[0] & 0x0f;
    let total_len = usize::from(u16::from_be_bytes([hdr[2], hdr[3]]));
    if version != 4 || ihl < 5 || total_len < 20 || total_len > l3_len {
        return Ipv4Verdict::Malformed;
    }
    if usize::from(ihl) * 4 > total_len {
        return Ipv4Verdict::Malformed;
    }
    if ihl > 5 {
        return Ipv4Verdict::Options;
    }
    let frag = u16::from_be_bytes([hdr[6], hdr[7]]);
    // 0x2000 = MF, 0x1fff = fragment offset; DF (0x4000) is fine.
    if frag & 0x3fff != 0 {
        return Ipv4Verdict::Fragment;
    }
    if hdr[8] <= 1 {
        return Ipv4Verdict::TtlExceeded;
    }
    if !header_checksum_ok(hdr) {
        return Ipv4Verdict::BadChecksum;
    }
    Ipv4Verdict::Forward
}

/// Whether an option-less IPv4 header's checksum verifies (its words sum
/// to 0xffff in one's complement).
#[must_use]
pub const fn header_checksum_ok(hdr: &[u8; 20]) -> bool {
    let mut sum = 0u32;
    let mut i = 0;
    while i < 20 {
        sum += ((hdr[i] as u32) << 8) | hdr[i + 1] as u32;
        i += 2;
    }
    checksum::fold(sum) == 0xffff
}

/// Decrements the TTL and updates the header checksum incrementally.
pub fn decrement_ttl(hdr: &mut [u8; 20]) {
    let check = u16::from_be_bytes([hdr[10], hdr[11]]);
    let new = checksum::ttl_decrement(check, hdr[8], hdr[9]);
    hdr[8] = hdr[8].wrapping_sub(1);
    hdr[10..12].copy_from_slice(&new.to_be_bytes());
}

/// Rewrites source and destination address of an IPv4 header, fixing its
/// checksum; returns the change of the TCP/UDP pseudo-header.
pub fn rewrite_addrs(ip: &mut [u8; 20], src: [u8; 4], dst: [u8; 4]) -> Delta {
    let old_src = [ip[12], ip[13], ip[14], ip[15]];
    let old_dst = [ip[16], ip[17], ip[18], ip[19]];
    let d = Delta::new().addr(old_src, src).addr(old_dst, dst);
    let check = d.apply(u16::from_be_bytes([ip[10], ip[11]]));
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    ip[10..12].copy_from_slice(&check.to_be_bytes());
    d
}

/// Sets the ports at `l4[0..4]` and returns the change of those words.
fn set_ports(l4: &mut [u8], sport: u16, dport: u16) -> Delta {
    let old_s = u16::from_be_bytes([l4[0], l4[1]]);
    let old_d = u16::from_be_bytes([l4[2], l4[3]]);
    l4[0..2].copy_from_slice(&sport.to_be_bytes());
    l4[2..4].copy_from_slice(&dport.to_be_bytes());
    Delta::new().word(old_s, sport).word(old_d, dport)
}

/// Rewrites the ports of a TCP header and updates its checksum with the
/// ports' and the pseudo-header's change (`pseudo`, from [`rewrite_addrs`]).
pub fn rewrite_tcp(tcp: &mut [u8; 20], pseudo: Delta, sport: u16, dport: u16) {
    let d = set_ports(tcp, sport, dport).merge(pseudo);
    let check = d.apply(u16::from_be_bytes([tcp[16], tcp[17]]));
    tcp[16..18].copy_from_slice(&check.to_be_bytes());
}

/// [`rewrite_tcp`] for UDP: a zero checksum ("none", RFC 768) stays zero.
pub fn rewrite_udp(udp: &mut [u8; 8], pseudo: Delta, sport: u16, dport: u16) {
    let d = set_ports(udp, sport, dport).merge(pseudo);
    let check = d.apply_udp(u16::from_be_bytes([udp[6], udp[7]]));
    udp[6..8].copy_from_slice(&check.to_be_bytes());
}

/// Sets the identifier of an ICMP echo request/reply (RFC 792) and updates
/// the ICMP checksum (no pseudo-header). Returns the change of the message's
/// words, for an enclosing checksum.
pub fn rewrite_icmp_echo(icmp: &mut [u8; 8], id: u16) -> Delta {
    let old_id = u16::from_be_bytes([icmp[4], icmp[5]]);
    let old_check = u16::from_be_bytes([icmp[2], icmp[3]]);
    let d = Delta::new().word(old_id, id);
    let check = d.apply(old_check);
    icmp[4..6].copy_from_slice(&id.to_be_bytes());
    icmp[2..4].copy_from_slice(&check.to_be_bytes());
    d.word(old_check, check)
}

/// ICMP types whose body embeds the offending packet's header.
#[must_use]
pub const fn icmp_is_error(icmp_type: u8) -> bool {
    matches!(
        icmp_type,
        ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM
    )
}

pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_DEST_UNREACH: u8 = 3;
pub const ICMP_ECHO_REQUEST: u8 = 8;
pub const ICMP_TIME_EXCEEDED: u8 = 11;
pub const ICMP_PARAMETER_PROBLEM: u8 = 12;

/// Translates an ICMP error that came back from the WAN about a packet the
/// NAT sent (RFC 5508 section 4.2, RFC 5382/4787): the outer destination and
/// the embedded packet's source become `addr:port` (for an embedded ICMP
/// echo, `port` is the identifier). Fixes, incrementally, the outer IPv4
/// checksum, the embedded IPv4 checksum, the embedded UDP checksum (unless
/// 0), the embedded TCP checksum when the error carries it
/// (`inner_tcp_check`), the embedded echo's checksum, and the outer ICMP
/// checksum over all of those changes.
pub fn translate_icmp_error(
    outer_ip: &mut [u8; 20],
    icmp: &mut [u8; 8],
    inner_ip: &mut [u8; 20],
    inner_l4: &mut [u8; 8],
    inner_tcp_check: Option<&mut [u8; 2]>,
    addr: [u8; 4],
    port: u16,
) {
    let outer_src = [outer_ip[12], outer_ip[13], outer_ip[14], outer_ip[15]];
    let _ = rewrite_addrs(outer_ip, outer_src, addr);

    let inner_dst = [inner_ip[16], inner_ip[17], inner_ip[18], inner_ip[19]];
    let old_inner_check = u16::from_be_bytes([inner_ip[10], inner_ip[11]]);
    let pseudo = rewrite_addrs(inner_ip, addr, inner_dst);
    let new_inner_check = u16::from_be_bytes([inner_ip[10], inner_ip[11]]);
    let mut outer = pseudo.word(old_inner_check, new_inner_check);

    match inner_ip[9] {
        IPPROTO_ICMP => {
            outer = outer.merge(rewrite_icmp_echo(inner_l4, port));
        }
        proto => {
            let old_dport = u16::from_be_bytes([inner_l4[2], inner_l4[3]]);
            let ports = set_ports(inner_l4, port, old_dport);
            outer = outer.merge(ports);
            let l4 = ports.merge(pseudo);
            if proto == IPPROTO_UDP {
                let old = u16::from_be_bytes([inner_l4[6], inner_l4[7]]);
                let new = l4.apply_udp(old);
                inner_l4[6..8].copy_from_slice(&new.to_be_bytes());
                outer = outer.word(old, new);
            } else if let Some(c) = inner_tcp_check {
                let old = u16::from_be_bytes(*c);
                let new = l4.apply(old);
                *c = new.to_be_bytes();
                outer = outer.word(old, new);
            }
        }
    }
    let check = outer.apply(u16::from_be_bytes([icmp[2], icmp[3]]));
    icmp[2..4].copy_from_slice(&check.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::checksum::l4_checksum;
    use crate::maps::IPPROTO_TCP;
    use proptest::prelude::*;
    use std::vec::Vec;

    /// IPv4 + L4 packet with correct checksums computed from scratch.
    fn packet(proto: u8, src: [u8; 4], dst: [u8; 4], l4: &[u8]) -> Vec<u8> {
        let total = 20 + l4.len();
        let mut p = std::vec![0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, proto, 0, 0];
        p[2..4].copy_from_slice(&u16::try_from(total).unwrap().to_be_bytes());
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        let c = checksum::checksum(&p[..20]);
        p[10..12].copy_from_slice(&c.to_be_bytes());
        p.extend_from_slice(l4);
        fix_l4(&mut p);
        p
    }

    /// Recomputes the L4 checksum of an IPv4 packet from scratch.
    fn fix_l4(p: &mut [u8]) {
        let (src, dst, proto) = (addr(p, 12), addr(p, 16), p[9]);
        let off = match proto {
            IPPROTO_TCP => 16,
            IPPROTO_UDP => 6,
            _ => 2,
        };
        p[20 + off..22 + off].fill(0);
        let c = if proto == IPPROTO_ICMP {
            checksum::checksum(&p[20..])
        } else {
            let c = l4_checksum(src, dst, proto, &p[20..]);
            if proto == IPPROTO_UDP && c == 0 {
                0xffff
            } else {
                c
            }
        };
        p[20 + off..22 + off].copy_from_slice(&c.to_be_bytes());
    }

    fn addr(p: &[u8], at: usize) -> [u8; 4] {
        p[at..at + 4].try_into().unwrap()
    }

    /// Asserts that every checksum in `p` equals a recomputation.
    fn assert_checksums(p: &[u8]) {
        let mut q = p.to_vec();
        q[10..12].fill(0);
        let c = checksum::checksum(&q[..20]);
        q[10..12].copy_from_slice(&c.to_be_bytes());
        fix_l4(&mut q);
        assert_eq!(p, &q[..], "incremental checksums differ from recomputation");
    }

    proptest! {
        #[test]
        fn tcp_rewrite_equals_recompute(
            src: [u8; 4], dst: [u8; 4], nsrc: [u8; 4], ndst: [u8; 4],
            sp: u16, dp: u16, nsp: u16, ndp: u16,
            body in proptest::collection::vec(any::<u8>(), 20..200),
        ) {
            let mut l4 = body;
            l4[12] = 0x50;
            l4[0..4].copy_from_slice(&[(sp >> 8) as u8, sp as u8, (dp >> 8) as u8, dp as u8]);
            let mut p = packet(IPPROTO_TCP, src, dst, &l4);
            let (ip, rest) = p.split_at_mut(20);
            let pseudo = rewrite_addrs(ip.try_into().unwrap(), nsrc, ndst);
            rewrite_tcp((&mut rest[..20]).try_into().unwrap(), pseudo, nsp, ndp);
            prop_assert_eq!(addr(&p, 12), nsrc);
            prop_assert_eq!(&p[20..24], &[(nsp >> 8) as u8, nsp as u8, (ndp >> 8) as u8, ndp as u8]);
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
            l4[4..6].copy_from_slice(&len.to_be_bytes());
            let mut p = packet(IPPROTO_UDP, src, dst, &l4);
            if no_checksum {
                p[26..28].fill(0);
            }
            let (ip, rest) = p.split_at_mut(20);
            let pseudo = rewrite_addrs(ip.try_into().unwrap(), nsrc, ndst);
            rewrite_udp((&mut rest[..8]).try_into().unwrap(), pseudo, nsp, ndp);
            if no_checksum {
                prop_assert_eq!(&p[26..28], &[0, 0]);
            } else {
                assert_checksums(&p);
            }
        }

        #[test]
        fn icmp_echo_rewrite_equals_recompute(
            src: [u8; 4], dst: [u8; 4], id: u16, body in proptest::collection::vec(any::<u8>(), 8..100),
        ) {
            let mut l4 = body;
            l4[0] = ICMP_ECHO_REQUEST;
            l4[1] = 0;
            let mut p = packet(IPPROTO_ICMP, src, dst, &l4);
            let _ = rewrite_icmp_echo((&mut p[20..28]).try_into().unwrap(), id);
            prop_assert_eq!(&p[24..26], &id.to_be_bytes());
            assert_checksums(&p);
        }

        /// An ICMP error quoting a whole UDP/TCP/echo packet the NAT sent:
        /// after translation every checksum (outer IP, ICMP, inner IP,
        /// inner L4) equals a recomputation, and the quoted source is the
        /// LAN host's.
        #[test]
        fn icmp_error_translation_equals_recompute(
            which in 0u8..3, router: [u8; 4], wan: [u8; 4], remote: [u8; 4], lan: [u8; 4],
            wport: u16, lport: u16, rport: u16, with_tcp_check: bool, udp_zero: bool,
            body in proptest::collection::vec(any::<u8>(), 20..64),
        ) {
            let proto = [IPPROTO_UDP, IPPROTO_TCP, IPPROTO_ICMP][usize::from(which)];
            let mut l4 = body;
            match proto {
                IPPROTO_TCP => {
                    l4[0..4].copy_from_slice(&[(wport >> 8) as u8, wport as u8, (rport >> 8) as u8, rport as u8]);
                    l4[12] = 0x50;
                }
                IPPROTO_UDP => {
                    l4[0..4].copy_from_slice(&[(wport >> 8) as u8, wport as u8, (rport >> 8) as u8, rport as u8]);
                    let len = u16::try_from(l4.len()).unwrap();
                    l4[4..6].copy_from_slice(&len.to_be_bytes());
                }
                _ => {
                    l4[0] = ICMP_ECHO_REQUEST;
                    l4[1] = 0;
                    l4[4..6].copy_from_slice(&wport.to_be_bytes());
                }
            }
            let mut inner = packet(proto, wan, remote, &l4);
            if proto == IPPROTO_UDP && udp_zero {
                inner[26..28].fill(0);
            }
            // The error quotes the whole packet, or (for TCP without the
            // checksum) just the IP header and 8 bytes.
            let quoted = if proto == IPPROTO_TCP && !with_tcp_check { 28 } else { inner.len() };
            let mut icmp = std::vec![ICMP_DEST_UNREACH, 4, 0, 0, 0, 0, 0x05, 0xdc];
            icmp.extend_from_slice(&inner[..quoted]);
            let mut outer = packet(IPPROTO_ICMP, router, wan, &icmp);

            let (o_ip, rest) = outer.split_at_mut(20);
            let (o_icmp, rest) = rest.split_at_mut(8);
            let (i_ip, rest) = rest.split_at_mut(20);
            let (i_l4, rest) = rest.split_at_mut(8);
            let tcp_check = if proto == IPPROTO_TCP && quoted > 28 {
                Some((&mut rest[8..10]).try_into().unwrap())
            } else {
                None
            };
            translate_icmp_error(
                o_ip.try_into().unwrap(), o_icmp.try_into().unwrap(),
                i_ip.try_into().unwrap(), i_l4.try_into().unwrap(), tcp_check, lan, lport,
            );
            // Outer: destination is the LAN host, IP and ICMP checksums right.
            prop_assert_eq!(addr(&outer, 16), lan);
            assert_checksums(&outer);
            // Inner: source is the LAN host's address and port.
            let inner_new = &outer[28..];
            prop_assert_eq!(addr(inner_new, 12), lan);
            let port_at = if proto == IPPROTO_ICMP { 24 } else { 20 };
            prop_assert_eq!(&inner_new[port_at..port_at + 2], &lport.to_be_bytes());
            let mut h = inner_new[..20].to_vec();
            h[10..12].fill(0);
            prop_assert_eq!(checksum::checksum(&h).to_be_bytes(), [inner_new[10], inner_new[11]]);
            if quoted == inner.len() {
                if proto == IPPROTO_UDP && udp_zero {
                    prop_assert_eq!(&inner_new[26..28], &[0, 0]);
                } else {
                    assert_checksums(inner_new);
                }
            }
        }
    }

    fn header(ttl: u8) -> [u8; 20] {
        let mut h = [
            0x45, 0, 0, 60, 0x12, 0x34, 0x40, 0, ttl, 6, 0, 0, 192, 168, 50, 2, 203, 0, 113, 2,
        ];
        let c = checksum::checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h
    }

    #[test]
    fn classify_cases() {
        assert_eq!(classify_ipv4(&header(64), 60), Ipv4Verdict::Forward);
        assert_eq!(classify_ipv4(&header(64), 59), Ipv4Verdict::Malformed);
        assert_eq!(classify_ipv4(&header(1), 60), Ipv4Verdict::TtlExceeded);
        assert_eq!(classify_ipv4(&header(0), 60), Ipv4Verdict::TtlExceeded);
        let mut h = header(64);
        h[0] = 0x44;
        assert_eq!(classify_ipv4(&h, 60), Ipv4Verdict::Malformed);
        h[0] = 0x46;
        assert_eq!(classify_ipv4(&h, 60), Ipv4Verdict::Options);
        h[0] = 0x65;
        assert_eq!(classify_ipv4(&h, 60), Ipv4Verdict::Malformed);
        let mut h = header(64);
        h[6] = 0x20; // MF
        assert_eq!(classify_ipv4(&h, 60), Ipv4Verdict::Fragment);
        let mut h = header(64);
        h[7] = 0x01; // offset 8
        assert_eq!(classify_ipv4(&h, 60), Ipv4Verdict::Fragment);
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
        b[10] ^= 0x01;
        assert_eq!(classify_ipv4(&b, 60), Ipv4Verdict::BadChecksum);
        b[8] = 1;
        assert_eq!(classify_ipv4(&b, 60), Ipv4Verdict::TtlExceeded);
    }

    #[test]
    fn ttl_decrement_keeps_checksum_valid() {
        for ttl in 2..=255 {
            let mut h = header(ttl);
            decrement_ttl(&mut h);
            assert_eq!(h[8], ttl - 1);
            let mut z = h;
            z[10] = 0;
            z[11] = 0;
            assert_eq!(checksum::checksum(&z).to_be_bytes(), [h[10], h[11]]);
        }
    }
}
