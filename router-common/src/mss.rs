//! TCP MSS clamping of the SYNs the data path forwards (standalone mode):
//! what iptables' `TCPMSS --clamp-mss-to-pmtu` and nftables' `tcp option
//! maxseg size set rt mtu` do in the kernel path, and what a router on a
//! path narrower than one of its links (a jumbo-frame LAN behind a
//! 1500-byte WAN, a `PPPoE` modem in front of it) needs when ICMP
//! "fragmentation needed" does not get through to the remote host (RFC
//! 2923 2.1, "PMTUD black holes"). Only lowers an MSS option, never adds
//! one or raises it (without the option a peer assumes 536 over IPv4,
//! 1220 over IPv6: RFC 9293 3.7.1, RFC 8200 8.3).

use crate::{checksum::Delta, hdr::tcp};

/// TCP option kinds (RFC 9293 3.2).
pub mod option {
    /// End of option list.
    pub const EOL: u8 = 0;
    /// No operation (padding).
    pub const NOP: u8 = 1;
    /// Maximum segment size: kind, length 4, the value (16 bits).
    pub const MSS: u8 = 2;
    /// Length of the MSS option.
    pub const MSS_LEN: u8 = 4;
}

/// The most option bytes a TCP header carries (data offset 15 words).
pub const MAX_OPTIONS: usize = 40;

/// IPv4 and TCP headers without options: an IPv4 packet's MSS is its path
/// MTU less these (RFC 9293 3.7.1).
pub const IPV4_OVERHEAD: u16 = 40;
/// IPv6 and TCP headers without options (RFC 8200 8.3).
pub const IPV6_OVERHEAD: u16 = 60;

/// The configuration's "no clamping" (`Config::mss_clamp_mtu`).
pub const CLAMP_OFF: u16 = 0;
/// The configuration's "clamp to the interfaces' MTUs only" (`--clamp-mss
/// pmtu`): no other limit, the smaller of the two interfaces' decides.
pub const CLAMP_PMTU: u16 = u16::MAX;

/// The largest MSS a SYN may carry through a path of MTU `mtu` with
/// `overhead` bytes of headers; never below 0.
#[must_use]
pub const fn max_mss(mtu: u16, overhead: u16) -> u16 {
    mtu.saturating_sub(overhead)
}

/// The offset of the MSS option's value in a TCP header of `len` bytes
/// (its data offset's; the options start at byte 20), found by walking the
/// options as RFC 9293 3.2 lays them out, reading one byte at a time
/// through `byte` (`None`: not in the packet). `None` when there is no MSS
/// option, or the walk meets a malformed one (a length below 2, or past the
/// header's end) before it: then nothing is changed.
///
/// Written for the BPF verifier: one pass over increasing positions (at
/// most 40), with the bytes inside an option skipped by a counter rather
/// than by jumping the position, and the end compared as the header's
/// length, which a mask of the data offset bounds (a length computed by a
/// subtraction loses its bounds on the way).
#[expect(
    clippy::inline_always,
    reason = "the data path passes a closure over packet reads: inlined, each read is a \
              bounds-checked load the verifier follows; called, a closure would not link"
)]
#[inline(always)]
pub fn find_mss_value(len: usize, byte: impl Fn(usize) -> Option<u8>) -> Option<usize> {
    let mut skip = 0usize;
    let mut pos = tcp::LEN;
    while pos < tcp::LEN + MAX_OPTIONS && pos < len {
        if skip > 0 {
            skip -= 1;
            pos += 1;
            continue;
        }
        let kind = byte(pos)?;
        if kind == option::EOL {
            return None;
        }
        if kind == option::NOP {
            pos += 1;
            continue;
        }
        let opt_len = usize::from(byte(pos + 1)?);
        if opt_len < 2 || pos + opt_len > len {
            return None;
        }
        if kind == option::MSS {
            return (opt_len == usize::from(option::MSS_LEN)).then_some(pos + 2);
        }
        skip = opt_len - 1;
        pos += 1;
    }
    None
}

/// A TCP header's length in bytes, from its data offset field's byte:
/// the word count times 4 as a mask, so the verifier knows it is at most 60.
#[must_use]
pub const fn header_len(data_off_byte: u8) -> usize {
    (data_off_byte >> 2 & 0x3c) as usize
}

/// The TCP checksum after the MSS value at header offset `at` (see
/// [`find_mss_value`]) changed from `old` to `new`. A value at an odd
/// offset straddles
/// two checksum words, high byte in the low half of one, low byte in the
/// high half of the next, so its contribution to the one's-complement sum
/// is the byte-swapped value (256 * 256 = 1 modulo 0xffff).
#[must_use]
pub const fn checksum_after(check: u16, at: usize, old: u16, new: u16) -> u16 {
    let (old, new) = if at % 2 == 1 {
        (old.swap_bytes(), new.swap_bytes())
    } else {
        (old, new)
    };
    Delta::new().word(old, new).apply(check)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::checksum;

    /// The walk over a header with options `opts`, as an offset in them.
    fn walk(opts: &[u8]) -> Option<usize> {
        let mut h = std::vec![0u8; tcp::LEN];
        h.extend_from_slice(opts);
        find_mss_value(h.len(), |i| h.get(i).copied()).map(|at| at - tcp::LEN)
    }

    #[test]
    fn finds_the_mss_where_stacks_put_it_and_elsewhere() {
        // Linux's SYN: MSS, SACK permitted, timestamps, NOP, window scale.
        let linux = [
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
        ];
        assert_eq!(walk(&linux), Some(2));
        // After a NOP (odd offset), after a window scale, after both.
        assert_eq!(walk(&[1, 2, 4, 5, 0xb4, 0, 0, 0]), Some(3));
        assert_eq!(walk(&[3, 3, 7, 2, 4, 5, 0xb4, 0]), Some(5));
        assert_eq!(walk(&[1, 3, 3, 7, 2, 4, 5, 0xb4]), Some(6));
        // The last four bytes of the longest options.
        let mut long = [1u8; MAX_OPTIONS];
        long[36..].copy_from_slice(&[2, 4, 5, 0xb4]);
        assert_eq!(walk(&long), Some(38));
    }

    #[test]
    fn no_mss_or_a_malformed_walk_finds_nothing() {
        assert_eq!(walk(&[]), None);
        assert_eq!(walk(&[1, 1, 1, 1]), None);
        // After the end of the list.
        assert_eq!(walk(&[0, 0, 2, 4, 5, 0xb4, 0, 0]), None);
        // A length of 0 or 1 (would never advance), one past the end.
        assert_eq!(walk(&[3, 0, 2, 4, 5, 0xb4, 0, 0]), None);
        assert_eq!(walk(&[3, 1, 2, 4, 5, 0xb4, 0, 0]), None);
        assert_eq!(walk(&[3, 9, 2, 4, 5, 0xb4, 0, 0]), None);
        // An MSS option of another length, or cut short.
        assert_eq!(walk(&[2, 3, 5, 0, 0, 0, 0, 0]), None);
        assert_eq!(walk(&[1, 1, 2, 4, 5, 0xb4]), Some(4));
        assert_eq!(walk(&[1, 1, 1, 1, 2, 4, 5]), None);
        // Bytes the packet does not have.
        let cut = [[0u8; tcp::LEN].as_slice(), &[1, 1, 2]].concat();
        assert_eq!(find_mss_value(28, |i| cut.get(i).copied()), None);
        // An MSS lookalike inside another option's data is not one.
        assert_eq!(walk(&[8, 6, 2, 4, 5, 0xb4, 0, 0]), None);
    }

    /// A TCP segment's checksum without the pseudo-header: enough to see
    /// the incremental update match a recomputation at either parity.
    fn sum(seg: &[u8]) -> u16 {
        checksum(seg)
    }

    #[test]
    fn the_checksum_follows_the_value_at_even_and_odd_offsets() {
        for at in [22usize, 23, 26, 27] {
            let mut seg = [0u8; 20 + 12];
            seg[0..4].copy_from_slice(&[0x9c, 0x40, 0x00, 0x50]);
            seg[12] = 0x80;
            seg[13] = 0x02;
            let o = at - 2;
            seg[o] = 2;
            seg[o + 1] = 4;
            seg[o + 2..o + 4].copy_from_slice(&8960u16.to_be_bytes());
            let check = sum(&seg);
            seg[o + 2..o + 4].copy_from_slice(&1452u16.to_be_bytes());
            assert_eq!(
                checksum_after(check, at, 8960, 1452),
                sum(&seg),
                "value at option offset {at}"
            );
        }
    }

    #[test]
    fn header_len_of_the_data_offset() {
        assert_eq!(header_len(0x50), 20);
        assert_eq!(header_len(0xa2), 40);
        assert_eq!(header_len(0xff), 60);
        assert_eq!(header_len(0x0f), 0);
    }

    #[test]
    fn max_mss_per_family() {
        assert_eq!(max_mss(1492, IPV4_OVERHEAD), 1452);
        assert_eq!(max_mss(1492, IPV6_OVERHEAD), 1432);
        assert_eq!(max_mss(20, IPV4_OVERHEAD), 0);
    }
}
