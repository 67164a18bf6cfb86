//! Header layouts: every offset and field position the data path reads or
//! writes, named once, for the XDP program, the pure logic in [`crate::nat`]
//! and the host tests alike.
//!
//! Field positions are relative to the start of their header; [`frame`]
//! gives the headers' offsets in an Ethernet frame. Multi-byte fields are in
//! network byte order; [`get_u16`], [`set_u16`], [`get_addr`] and
//! [`set_addr`] read and write them.
//!
//! Headers are byte arrays with these named offsets rather than the
//! `network-types` 0.2 structs, because those cost instructions. Measured
//! on the router program (xlated instructions after the verifier): its
//! `TcpHdr`/`UdpHdr` for the L4 parse add 9 (their getters read through
//! `read_unaligned` + `swap_bytes`); its `EthHdr` saves 4, but only by
//! reading the Ethernet type as an aligned `u16`, and the packet start's
//! alignment is not something the program can check (the verifier refuses
//! bitwise operations on packet pointers), so a reference to it would rest
//! on the drivers' layout alone. Nothing else differs: their IPv4, TCP,
//! UDP and ICMP headers are byte arrays with this layout too.

/// Ethernet II header (IEEE 802.3), without VLAN tags.
pub mod eth {
    /// Header length.
    pub const LEN: usize = 14;
    /// Length of a MAC address.
    pub const ADDR_LEN: usize = 6;
    /// Destination MAC address.
    pub const DST: usize = 0;
    /// Source MAC address.
    pub const SRC: usize = 6;
    /// Ethernet type of the payload.
    pub const ETHER_TYPE: usize = 12;
    /// Ethernet type of IPv4.
    pub const P_IPV4: u16 = 0x0800;
    /// Ethernet type of IPv6.
    pub const P_IPV6: u16 = 0x86dd;
}

/// IPv4 header (RFC 791).
pub mod ipv4 {
    /// Length of a header without options (IHL 5), the only kind the fast
    /// path forwards.
    pub const LEN: usize = 20;
    /// Length of an address.
    pub const ADDR_LEN: usize = 4;
    /// Version (high nibble) and IHL in 32-bit words (low nibble).
    pub const VERSION_IHL: usize = 0;
    /// `VERSION_IHL` of a version 4 header without options.
    pub const VERSION_IHL_PLAIN: u8 = 0x45;
    /// Type of service (DSCP and ECN).
    pub const TOS: usize = 1;
    /// Total length of the packet, header included.
    pub const TOT_LEN: usize = 2;
    /// Identification (of a fragmented datagram).
    pub const ID: usize = 4;
    /// Flags (high 3 bits) and fragment offset (low 13 bits).
    pub const FRAG_OFF: usize = 6;
    /// The "more fragments" flag and the fragment offset in the `FRAG_OFF`
    /// word: any of them set means a fragment. DF (0x4000) is fine.
    pub const FRAG_MF_AND_OFFSET: u16 = 0x3fff;
    /// The "don't fragment" flag in the `FRAG_OFF` word.
    pub const FRAG_DF: u16 = 0x4000;
    /// The fragment offset alone (in 8-byte units): 0 in a datagram's
    /// first fragment.
    pub const FRAG_OFFSET: u16 = 0x1fff;
    /// Time to live.
    pub const TTL: usize = 8;
    /// Protocol of the payload (`IPPROTO_*`).
    pub const PROTO: usize = 9;
    /// Header checksum.
    pub const CHECK: usize = 10;
    /// Source address.
    pub const SRC: usize = 12;
    /// Destination address.
    pub const DST: usize = 16;
}

/// TCP header (RFC 9293).
pub mod tcp {
    /// Length of a header without options, the least a segment carries.
    pub const LEN: usize = 20;
    /// Source port.
    pub const SPORT: usize = 0;
    /// Destination port.
    pub const DPORT: usize = 2;
    /// Sequence number.
    pub const SEQ: usize = 4;
    /// Acknowledgement number.
    pub const ACK_SEQ: usize = 8;
    /// Data offset in 32-bit words (high nibble).
    pub const DATA_OFF: usize = 12;
    /// Control bits (`flow::TCP_*`).
    pub const FLAGS: usize = 13;
    /// Receive window.
    pub const WINDOW: usize = 14;
    /// Checksum (with the pseudo-header).
    pub const CHECK: usize = 16;
}

/// UDP header (RFC 768).
pub mod udp {
    /// Header length.
    pub const LEN: usize = 8;
    /// Source port.
    pub const SPORT: usize = 0;
    /// Destination port.
    pub const DPORT: usize = 2;
    /// Length of header and data.
    pub const LENGTH: usize = 4;
    /// Checksum (with the pseudo-header); 0 means none.
    pub const CHECK: usize = 6;
}

/// ICMP header (RFC 792): type, code, checksum and the 4 bytes whose
/// meaning depends on the type.
pub mod icmp {
    /// Header length; an error's quoted packet follows it.
    pub const LEN: usize = 8;
    /// Message type.
    pub const TYPE: usize = 0;
    /// Message code.
    pub const CODE: usize = 1;
    /// Checksum over the whole message (no pseudo-header).
    pub const CHECK: usize = 2;
    /// Identifier of an echo request or reply.
    pub const ECHO_ID: usize = 4;
    /// Sequence number of an echo request or reply.
    pub const ECHO_SEQ: usize = 6;
}

/// Offsets of the headers in a frame the fast path handles: IPv4 with
/// options goes to the kernel, so every header sits at a fixed offset.
pub mod frame {
    use super::{eth, icmp, ipv4, tcp};

    /// The IPv4 header.
    pub const IPV4: usize = eth::LEN;
    /// The TCP, UDP or ICMP header.
    pub const L4: usize = IPV4 + ipv4::LEN;
    /// The IPv4 header quoted by an ICMP error (RFC 792), after its header.
    pub const INNER_IPV4: usize = L4 + icmp::LEN;
    /// The first 8 bytes after the quoted IPv4 header: the ports of a
    /// TCP/UDP header, or an ICMP header.
    pub const INNER_L4: usize = INNER_IPV4 + ipv4::LEN;
    /// The quoted TCP checksum, present when the error quotes 18 bytes of
    /// the TCP header or more (RFC 1812 4.3.2.3 asks for as much as fits).
    pub const INNER_TCP_CHECK: usize = INNER_L4 + tcp::CHECK;
}

/// Bytes of the quoted packet's L4 header that every ICMP error carries
/// (RFC 792): the ports, or an ICMP header.
pub const ICMP_QUOTED_L4_LEN: usize = 8;

/// Least IPv4 total length of each kind of packet the fast path reads.
pub mod min_len {
    use super::{ICMP_QUOTED_L4_LEN, icmp, ipv4, tcp, udp};

    /// A TCP segment: its header without options.
    pub const TCP: usize = ipv4::LEN + tcp::LEN;
    /// A UDP datagram.
    pub const UDP: usize = ipv4::LEN + udp::LEN;
    /// An ICMP message.
    pub const ICMP: usize = ipv4::LEN + icmp::LEN;
    /// An ICMP error with what NAT needs of the quoted packet: its IPv4
    /// header and the 8 bytes after it.
    pub const ICMP_ERROR: usize = ICMP + ipv4::LEN + ICMP_QUOTED_L4_LEN;
    /// An ICMP error that also quotes the TCP checksum.
    pub const ICMP_ERROR_TCP_CHECK: usize = ICMP + ipv4::LEN + tcp::CHECK + 2;
}

/// The big-endian 16-bit field at `at` of header `h`.
#[inline]
#[must_use]
pub const fn get_u16<const N: usize>(h: &[u8; N], at: usize) -> u16 {
    u16::from_be_bytes([h[at], h[at + 1]])
}

/// Writes `v` big-endian into the 16-bit field at `at` of header `h`.
#[inline]
pub const fn set_u16<const N: usize>(h: &mut [u8; N], at: usize, v: u16) {
    let b = v.to_be_bytes();
    h[at] = b[0];
    h[at + 1] = b[1];
}

/// Whether the Ethernet header `eth` is addressed to `mac`: one 32-bit and
/// one 16-bit compare (the frame's bytes are read one by one, see the
/// module doc on the packet start's alignment).
#[inline]
#[must_use]
pub const fn eth_dst_is(eth: &[u8; eth::LEN], mac: &[u8; eth::ADDR_LEN]) -> bool {
    let d = eth::DST;
    u32::from_ne_bytes([eth[d], eth[d + 1], eth[d + 2], eth[d + 3]])
        == u32::from_ne_bytes([mac[0], mac[1], mac[2], mac[3]])
        && u16::from_ne_bytes([eth[d + 4], eth[d + 5]]) == u16::from_ne_bytes([mac[4], mac[5]])
}

/// The IPv4 address at `at` of header `h`, in wire order.
#[inline]
#[must_use]
pub const fn get_addr<const N: usize>(h: &[u8; N], at: usize) -> [u8; 4] {
    [h[at], h[at + 1], h[at + 2], h[at + 3]]
}

/// Writes the IPv4 address `a` (wire order) at `at` of header `h`.
#[inline]
pub const fn set_addr<const N: usize>(h: &mut [u8; N], at: usize, a: [u8; 4]) {
    h[at] = a[0];
    h[at + 1] = a[1];
    h[at + 2] = a[2];
    h[at + 3] = a[3];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_match_the_rfc_layouts() {
        assert_eq!(frame::L4, 34);
        assert_eq!(frame::INNER_TCP_CHECK, 78);
        assert_eq!(min_len::TCP, 40);
        assert_eq!(min_len::UDP, 28);
        assert_eq!(min_len::ICMP_ERROR, 56);
        assert_eq!(min_len::ICMP_ERROR_TCP_CHECK, 66);
    }

    #[test]
    fn fields_round_trip_in_network_order() {
        let mut h = [0u8; ipv4::LEN];
        set_u16(&mut h, ipv4::TOT_LEN, 0x1234);
        set_addr(&mut h, ipv4::DST, [203, 0, 113, 2]);
        assert_eq!(h[2..4], [0x12, 0x34]);
        assert_eq!(get_u16(&h, ipv4::TOT_LEN), 0x1234);
        assert_eq!(h[16..20], [203, 0, 113, 2]);
        assert_eq!(get_addr(&h, ipv4::DST), [203, 0, 113, 2]);
    }

    #[test]
    fn eth_dst_is_compares_all_six_bytes_of_the_destination_only() {
        let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        let mut h = [0u8; eth::LEN];
        h[eth::DST..eth::DST + eth::ADDR_LEN].copy_from_slice(&mac);
        // The source and type do not matter.
        h[eth::SRC..eth::SRC + eth::ADDR_LEN].copy_from_slice(&[0xff; 6]);
        assert!(eth_dst_is(&h, &mac));
        for i in 0..eth::ADDR_LEN {
            let mut other = h;
            other[eth::DST + i] ^= 1;
            assert!(!eth_dst_is(&other, &mac), "byte {i} differs");
        }
        let mut broadcast = h;
        broadcast[eth::DST..eth::DST + eth::ADDR_LEN].copy_from_slice(&[0xff; 6]);
        assert!(!eth_dst_is(&broadcast, &mac));
    }
}
