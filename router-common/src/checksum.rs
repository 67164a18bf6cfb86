//! Internet checksum helpers (RFC 1071) and incremental updates (RFC 1624).
//!
//! All 16-bit words are taken in network byte order, as they sit in the
//! packet; callers pass `u16::from_be_bytes` of the wire bytes.

/// Folds a 32-bit one's-complement accumulator to 16 bits.
#[must_use]
pub const fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Full checksum of `data` (odd trailing byte padded with zero), as stored
/// in a header: the one's complement of the folded sum.
#[must_use]
pub fn checksum(data: &[u8]) -> u16 {
    !fold(sum_words(data, 0))
}

/// One's-complement sum of `data` added to `acc`, not yet folded.
#[must_use]
pub fn sum_words(data: &[u8], mut acc: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for w in &mut chunks {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
        acc = (acc & 0xffff) + (acc >> 16);
    }
    if let [last] = chunks.remainder() {
        acc += u32::from(u16::from_be_bytes([*last, 0]));
    }
    acc
}

/// Full TCP/UDP checksum of `segment` (its checksum field zeroed or not:
/// pass it zeroed to compute, intact to verify -> 0) with the IPv4
/// pseudo-header (RFC 793 3.1, RFC 768).
#[must_use]
pub fn l4_checksum(src: [u8; 4], dst: [u8; 4], proto: u8, segment: &[u8]) -> u16 {
    let mut acc = sum_words(&src, 0);
    acc = sum_words(&dst, acc);
    acc += u32::from(proto);
    #[expect(
        clippy::cast_possible_truncation,
        reason = "IPv4 segments are < 64 KiB"
    )]
    let len = segment.len() as u16;
    acc += u32::from(len);
    !fold(sum_words(segment, acc))
}

/// Accumulated RFC 1624 update for several changed 16-bit words, applied
/// to a checksum once: `HC' = ~(~HC + sum(~m + m'))`.
///
/// The sum stays unfolded until [`Delta::apply`] (or [`Delta::merge`])
/// folds it, once: one's-complement addition is associative (RFC 1071
/// 2(A)), so a late fold gives the same checksum as folding after every
/// word, with fewer instructions on the data path. Each word adds at most
/// `0x1_fffe`, so a `Delta` holds over 30,000 words before the `u32`
/// could overflow; no header rewrite records more than a dozen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delta(u32);

impl Delta {
    #[must_use]
    pub const fn new() -> Self {
        Self(0)
    }

    /// Records that a word changed from `old` to `new`.
    #[must_use]
    pub const fn word(self, old: u16, new: u16) -> Self {
        Self(self.0 + (!old as u32) + (new as u32))
    }

    /// Records that a 4-byte field (an address) changed.
    #[must_use]
    pub const fn addr(self, old: [u8; 4], new: [u8; 4]) -> Self {
        self.word(
            u16::from_be_bytes([old[0], old[1]]),
            u16::from_be_bytes([new[0], new[1]]),
        )
        .word(
            u16::from_be_bytes([old[2], old[3]]),
            u16::from_be_bytes([new[2], new[3]]),
        )
    }

    /// Records the change of a stored checksum word (e.g. an embedded
    /// header's checksum covered by an outer checksum).
    #[must_use]
    pub const fn merge(self, other: Self) -> Self {
        Self(fold(self.0 + other.0) as u32)
    }

    /// The checksum after the recorded changes.
    #[must_use]
    pub const fn apply(self, check: u16) -> u16 {
        !fold((!check as u32) + self.0)
    }

    /// [`Delta::apply`] with UDP's rules: 0 ("no checksum", RFC 768) stays
    /// 0, a computed 0 is sent as 0xffff.
    #[must_use]
    pub const fn apply_udp(self, check: u16) -> u16 {
        if check == 0 {
            return 0;
        }
        let c = self.apply(check);
        if c == 0 { 0xffff } else { c }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hdr::{get_addr, get_u16, ipv4, set_addr, set_u16};
    use proptest::prelude::*;

    /// Header from RFC 1071 examples / a captured IPv4 header.
    const IP_HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

    #[test]
    fn known_header_checksum_verifies() {
        assert_eq!(checksum(&IP_HDR), 0);
        let mut h = IP_HDR;
        set_u16(&mut h, ipv4::CHECK, 0);
        assert_eq!(checksum(&h), 0xb861);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(checksum(&[0x01]), !0x0100);
    }

    #[test]
    fn udp_zero_checksum_stays_zero() {
        let d = Delta::new().addr([1, 2, 3, 4], [5, 6, 7, 8]).word(1, 2);
        assert_eq!(d.apply_udp(0), 0);
    }

    #[test]
    fn udp_computed_zero_is_sent_as_ffff() {
        // ~(~0xfffe + ~1 + 0) folds to 0: UDP must send it as 0xffff.
        let d = Delta::new().word(1, 0);
        assert_eq!(d.apply(0xfffe), 0);
        assert_eq!(d.apply_udp(0xfffe), 0xffff);
    }

    fn with_check(mut h: [u8; ipv4::LEN]) -> [u8; ipv4::LEN] {
        set_u16(&mut h, ipv4::CHECK, 0);
        let c = checksum(&h);
        set_u16(&mut h, ipv4::CHECK, c);
        h
    }

    proptest! {
        #[test]
        fn incremental_address_update_equals_recompute(
            body in proptest::array::uniform20(any::<u8>()),
            new_src in proptest::array::uniform4(any::<u8>()),
        ) {
            let h = with_check(body);
            let old = get_addr(&h, ipv4::SRC);
            let mut n = h;
            set_addr(&mut n, ipv4::SRC, new_src);
            let inc = Delta::new().addr(old, new_src).apply(get_u16(&h, ipv4::CHECK));
            set_u16(&mut n, ipv4::CHECK, inc);
            // A correct header sums to zero (either zero representation).
            prop_assert!(checksum(&n) == 0 || checksum(&n) == 0xffff);
        }
    }
}
