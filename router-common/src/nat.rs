//! IPv4 header logic used by the forwarder: validation of the fixed header
//! and the TTL decrement with its checksum update.

use crate::checksum;

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
    Ipv4Verdict::Forward
}

/// Decrements the TTL and updates the header checksum incrementally.
pub fn decrement_ttl(hdr: &mut [u8; 20]) {
    let check = u16::from_be_bytes([hdr[10], hdr[11]]);
    let new = checksum::ttl_decrement(check, hdr[8], hdr[9]);
    hdr[8] = hdr[8].wrapping_sub(1);
    hdr[10..12].copy_from_slice(&new.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

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
