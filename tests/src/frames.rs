//! Crafted Ethernet + IPv4 + TCP/UDP/ICMP frames for `BPF_PROG_RUN` tests,
//! with every checksum computed from scratch, and [`verify_checksums`],
//! which recomputes every checksum of a frame (including the IPv4 header
//! and L4 header embedded in an ICMP error).
//!
//! Builders are plain structs with public fields: a test builds the input
//! frame, clones it, changes the fields the data path is supposed to
//! translate and builds the expected output from scratch.

use router_common::checksum::{checksum, l4_checksum};
use router_common::maps::{IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP};

// Frame offsets, defined once for every test (the data path names the
// same header offsets in router-common).

/// Length of an untagged Ethernet header.
pub const ETH_HLEN: usize = 14;
/// Offset of the Ethernet type field in an untagged frame.
pub const ETHERTYPE_OFF: usize = 12;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Length of an IPv4 header without options.
pub const IPV4_HLEN: usize = 20;
/// Offset of the IPv4 header in a frame.
pub const IP_OFF: usize = ETH_HLEN;
/// Offset of the L4 header in a frame whose IPv4 header has no options.
pub const L4_OFF: usize = ETH_HLEN + IPV4_HLEN;
/// Length of an ICMP header (type, code, checksum, 4 bytes of rest).
pub const ICMP_HLEN: usize = 8;
/// Offset of the quoted IPv4 header in an ICMP error (outer header
/// without options).
pub const INNER_IP_OFF: usize = L4_OFF + ICMP_HLEN;
/// Offset of the quoted L4 header in an ICMP error (neither IPv4 header
/// with options).
pub const INNER_L4_OFF: usize = INNER_IP_OFF + IPV4_HLEN;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;

pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_DEST_UNREACH: u8 = 3;
/// Destination unreachable code: fragmentation needed and DF set (RFC 792).
pub const ICMP_FRAG_NEEDED: u8 = 4;
pub const ICMP_ECHO_REQUEST: u8 = 8;
pub const ICMP_TIME_EXCEEDED: u8 = 11;
pub const ICMP_PARAMETER_PROBLEM: u8 = 12;

/// IPv4 "don't fragment" bit of the flags/fragment-offset word.
pub const IP_DF: u16 = 0x4000;
/// IPv4 "more fragments" bit.
pub const IP_MF: u16 = 0x2000;

/// A TCP segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tcp {
    pub sport: u16,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    /// Flag byte (`TCP_*`).
    pub flags: u8,
    pub window: u16,
    /// Options, a multiple of 4 bytes (the data offset follows from it).
    pub options: Vec<u8>,
    pub payload: Vec<u8>,
}

impl Tcp {
    #[must_use]
    pub fn new(sport: u16, dport: u16, flags: u8) -> Self {
        Self {
            sport,
            dport,
            seq: 0x1000_0001,
            ack: if flags & TCP_ACK != 0 { 0x2000_0001 } else { 0 },
            flags,
            window: 64_240,
            options: Vec::new(),
            payload: Vec::new(),
        }
    }

    #[must_use]
    pub fn options(mut self, options: &[u8]) -> Self {
        assert_eq!(
            options.len() % 4,
            0,
            "TCP options must be padded to 4 bytes"
        );
        self.options = options.to_vec();
        self
    }

    /// The segment with acknowledgement number `ack` (and the ACK bit).
    #[must_use]
    pub const fn acking(mut self, ack: u32) -> Self {
        self.ack = ack;
        self.flags |= TCP_ACK;
        self
    }

    /// The segment with sequence number `seq` and acknowledgement number
    /// `ack`.
    #[must_use]
    pub const fn numbered(mut self, seq: u32, ack: u32) -> Self {
        self.seq = seq;
        self.ack = ack;
        self
    }

    /// The SYN+ACK answering the SYN `syn` (whose ports it swaps): it
    /// acknowledges exactly the SYN's sequence number plus one, as the
    /// data path's window check requires of an answer to an opening SYN.
    #[must_use]
    pub fn syn_ack_to(syn: &Self) -> Self {
        Self::new(syn.dport, syn.sport, TCP_SYN | TCP_ACK).acking(syn.seq.wrapping_add(1))
    }

    #[must_use]
    pub fn payload(mut self, payload: &[u8]) -> Self {
        self.payload = payload.to_vec();
        self
    }

    /// The segment with its checksum for `src` -> `dst`.
    #[must_use]
    pub fn bytes(&self, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let hlen = 20 + self.options.len();
        let mut s = Vec::with_capacity(hlen + self.payload.len());
        s.extend_from_slice(&self.sport.to_be_bytes());
        s.extend_from_slice(&self.dport.to_be_bytes());
        s.extend_from_slice(&self.seq.to_be_bytes());
        s.extend_from_slice(&self.ack.to_be_bytes());
        s.push(((hlen / 4) as u8) << 4);
        s.push(self.flags);
        s.extend_from_slice(&self.window.to_be_bytes());
        s.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
        s.extend_from_slice(&self.options);
        s.extend_from_slice(&self.payload);
        let c = l4_checksum(src, dst, IPPROTO_TCP, &s);
        s[16..18].copy_from_slice(&c.to_be_bytes());
        s
    }
}

/// A UDP datagram.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Udp {
    pub sport: u16,
    pub dport: u16,
    pub payload: Vec<u8>,
    /// `false`: checksum field 0 ("no checksum", RFC 768).
    pub checksum: bool,
}

impl Udp {
    #[must_use]
    pub fn new(sport: u16, dport: u16, payload: &[u8]) -> Self {
        Self {
            sport,
            dport,
            payload: payload.to_vec(),
            checksum: true,
        }
    }

    /// Without a checksum (field 0).
    #[must_use]
    pub fn no_checksum(mut self) -> Self {
        self.checksum = false;
        self
    }

    #[must_use]
    pub fn bytes(&self, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        let len = u16::try_from(8 + self.payload.len()).expect("UDP length");
        let mut d = Vec::with_capacity(usize::from(len));
        d.extend_from_slice(&self.sport.to_be_bytes());
        d.extend_from_slice(&self.dport.to_be_bytes());
        d.extend_from_slice(&len.to_be_bytes());
        d.extend_from_slice(&[0, 0]);
        d.extend_from_slice(&self.payload);
        if self.checksum {
            let c = match l4_checksum(src, dst, IPPROTO_UDP, &d) {
                0 => 0xffff,
                c => c,
            };
            d[6..8].copy_from_slice(&c.to_be_bytes());
        }
        d
    }
}

/// An ICMP message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Icmp {
    /// Echo request (`reply == false`, type 8) or reply (type 0).
    Echo {
        reply: bool,
        id: u16,
        seq: u16,
        payload: Vec<u8>,
    },
    /// An error (or any other type): type, code, the 4 bytes after the
    /// checksum (unused / next-hop MTU / pointer) and the quoted bytes of
    /// the offending packet.
    Other {
        icmp_type: u8,
        code: u8,
        rest: [u8; 4],
        body: Vec<u8>,
    },
}

impl Icmp {
    #[must_use]
    pub fn echo_request(id: u16, seq: u16, payload: &[u8]) -> Self {
        Self::Echo {
            reply: false,
            id,
            seq,
            payload: payload.to_vec(),
        }
    }

    #[must_use]
    pub fn echo_reply(id: u16, seq: u16, payload: &[u8]) -> Self {
        Self::Echo {
            reply: true,
            id,
            seq,
            payload: payload.to_vec(),
        }
    }

    /// An error of `icmp_type`/`code` quoting `quoted` (usually the start
    /// of an [`Ipv4::bytes`]).
    #[must_use]
    pub fn error(icmp_type: u8, code: u8, quoted: &[u8]) -> Self {
        Self::Other {
            icmp_type,
            code,
            rest: [0; 4],
            body: quoted.to_vec(),
        }
    }

    /// A destination unreachable, fragmentation needed (RFC 792 code 4),
    /// with RFC 1191's next-hop MTU in the low half of its second word.
    #[must_use]
    pub fn frag_needed(mtu: u16, quoted: &[u8]) -> Self {
        let [hi, lo] = mtu.to_be_bytes();
        Self::Other {
            icmp_type: ICMP_DEST_UNREACH,
            code: ICMP_FRAG_NEEDED,
            rest: [0, 0, hi, lo],
            body: quoted.to_vec(),
        }
    }

    #[must_use]
    pub fn bytes(&self) -> Vec<u8> {
        let mut m = Vec::new();
        match self {
            Self::Echo {
                reply,
                id,
                seq,
                payload,
            } => {
                m.push(if *reply {
                    ICMP_ECHO_REPLY
                } else {
                    ICMP_ECHO_REQUEST
                });
                m.extend_from_slice(&[0, 0, 0]);
                m.extend_from_slice(&id.to_be_bytes());
                m.extend_from_slice(&seq.to_be_bytes());
                m.extend_from_slice(payload);
            }
            Self::Other {
                icmp_type,
                code,
                rest,
                body,
            } => {
                m.extend_from_slice(&[*icmp_type, *code, 0, 0]);
                m.extend_from_slice(rest);
                m.extend_from_slice(body);
            }
        }
        let c = checksum(&m);
        m[2..4].copy_from_slice(&c.to_be_bytes());
        m
    }
}

/// The payload of an IPv4 packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum L4 {
    Tcp(Tcp),
    Udp(Udp),
    Icmp(Icmp),
    /// Any protocol, raw bytes (no checksum computed).
    Raw {
        proto: u8,
        bytes: Vec<u8>,
    },
}

impl L4 {
    #[must_use]
    pub fn proto(&self) -> u8 {
        match self {
            Self::Tcp(_) => IPPROTO_TCP,
            Self::Udp(_) => IPPROTO_UDP,
            Self::Icmp(_) => IPPROTO_ICMP,
            Self::Raw { proto, .. } => *proto,
        }
    }

    #[must_use]
    pub fn bytes(&self, src: [u8; 4], dst: [u8; 4]) -> Vec<u8> {
        match self {
            Self::Tcp(t) => t.bytes(src, dst),
            Self::Udp(u) => u.bytes(src, dst),
            Self::Icmp(i) => i.bytes(),
            Self::Raw { bytes, .. } => bytes.clone(),
        }
    }
}

impl From<Tcp> for L4 {
    fn from(t: Tcp) -> Self {
        Self::Tcp(t)
    }
}

impl From<Udp> for L4 {
    fn from(u: Udp) -> Self {
        Self::Udp(u)
    }
}

impl From<Icmp> for L4 {
    fn from(i: Icmp) -> Self {
        Self::Icmp(i)
    }
}

/// An IPv4 packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4 {
    pub tos: u8,
    pub id: u16,
    /// Flags and fragment offset word (`IP_DF`, `IP_MF`, offset in 8-byte units).
    pub frag: u16,
    pub ttl: u8,
    pub src: [u8; 4],
    pub dst: [u8; 4],
    /// Options, a multiple of 4 bytes (the IHL follows from it).
    pub options: Vec<u8>,
    pub l4: L4,
}

impl Ipv4 {
    /// TTL 64, DF set, no options.
    #[must_use]
    pub fn new(src: [u8; 4], dst: [u8; 4], l4: impl Into<L4>) -> Self {
        Self {
            tos: 0,
            id: 0x1234,
            frag: IP_DF,
            ttl: 64,
            src,
            dst,
            options: Vec::new(),
            l4: l4.into(),
        }
    }

    #[must_use]
    pub fn ttl(mut self, ttl: u8) -> Self {
        self.ttl = ttl;
        self
    }

    /// Header and payload with correct checksums.
    #[must_use]
    pub fn bytes(&self) -> Vec<u8> {
        assert_eq!(
            self.options.len() % 4,
            0,
            "IPv4 options must be padded to 4 bytes"
        );
        let hlen = 20 + self.options.len();
        assert!(hlen <= 60, "IPv4 options too long");
        let l4 = self.l4.bytes(self.src, self.dst);
        let total = u16::try_from(hlen + l4.len()).expect("IPv4 total length");
        let mut p = Vec::with_capacity(usize::from(total));
        p.push(0x40 | (hlen / 4) as u8);
        p.push(self.tos);
        p.extend_from_slice(&total.to_be_bytes());
        p.extend_from_slice(&self.id.to_be_bytes());
        p.extend_from_slice(&self.frag.to_be_bytes());
        p.push(self.ttl);
        p.push(self.l4.proto());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(&self.src);
        p.extend_from_slice(&self.dst);
        p.extend_from_slice(&self.options);
        let c = checksum(&p[..hlen]);
        p[10..12].copy_from_slice(&c.to_be_bytes());
        p.extend_from_slice(&l4);
        p
    }
}

/// `ip`'s datagram in two fragments (RFC 791 3.2): the first carries
/// the first `first_len` bytes of its IP payload (a multiple of 8; MF set,
/// DF cleared), the second the rest (offset `first_len / 8`). The payload
/// is the whole datagram's, its L4 checksum computed over all of it.
///
/// # Panics
/// If `first_len` is not a multiple of 8 inside the payload.
#[must_use]
pub fn fragments(ip: &Ipv4, first_len: usize) -> [Ipv4; 2] {
    let payload = ip.l4.bytes(ip.src, ip.dst);
    assert!(
        first_len.is_multiple_of(8) && first_len > 0 && first_len < payload.len(),
        "cannot cut a {}-byte payload after {first_len} bytes",
        payload.len()
    );
    let part = |bytes: &[u8], frag: u16| Ipv4 {
        frag,
        l4: L4::Raw {
            proto: ip.l4.proto(),
            bytes: bytes.to_vec(),
        },
        ..ip.clone()
    };
    let offset = u16::try_from(first_len / 8).expect("fragment offset");
    [
        part(&payload[..first_len], IP_MF),
        part(&payload[first_len..], offset),
    ]
}

/// The Ethernet broadcast address.
pub const BROADCAST_MAC: [u8; 6] = [0xff; 6];
/// An IPv4 multicast MAC (224.0.0.251, mDNS: RFC 1112 6.4 mapping).
pub const IPV4_MULTICAST_MAC: [u8; 6] = [0x01, 0x00, 0x5e, 0x00, 0x00, 0xfb];
/// An IPv6 multicast MAC (`ff02::1`, RFC 2464 7).
pub const IPV6_MULTICAST_MAC: [u8; 6] = [0x33, 0x33, 0x00, 0x00, 0x00, 0x01];
/// A locally administered unicast MAC that no interface of the test
/// topologies has (the kit's interfaces get random ones): a frame to it
/// is another host's, which a bridge floods while it has not learned where
/// that host is.
pub const NOBODY_MAC: [u8; 6] = [0x02, 0x00, 0x5e, 0x10, 0xde, 0xad];

/// An Ethernet frame carrying an IPv4 packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub ip: Ipv4,
}

impl Frame {
    #[must_use]
    pub fn new(dst_mac: [u8; 6], src_mac: [u8; 6], ip: Ipv4) -> Self {
        Self {
            dst_mac,
            src_mac,
            ip,
        }
    }

    #[must_use]
    pub fn bytes(&self) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&self.dst_mac);
        f.extend_from_slice(&self.src_mac);
        f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f.extend_from_slice(&self.ip.bytes());
        f
    }
}

/// Recomputes the IPv4 header checksum of a frame (no-options or with
/// options) after a test patched header bytes.
pub fn fix_ipv4_checksum(frame: &mut [u8]) {
    let hlen = usize::from(frame[IP_OFF] & 0x0f) * 4;
    frame[IP_OFF + 10..IP_OFF + 12].fill(0);
    let c = checksum(&frame[IP_OFF..IP_OFF + hlen]);
    frame[IP_OFF + 10..IP_OFF + 12].copy_from_slice(&c.to_be_bytes());
}

/// The big-endian 16-bit field at `at`.
#[must_use]
pub fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Writes the big-endian 16-bit field at `at` if the frame has it.
pub fn put16(b: &mut [u8], at: usize, v: u16) {
    if at + 2 <= b.len() {
        b[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
}

/// The IPv4 address at `at`.
#[must_use]
pub fn addr(b: &[u8], at: usize) -> [u8; 4] {
    [b[at], b[at + 1], b[at + 2], b[at + 3]]
}

/// Writes the IPv4 address at `at` if the frame has it.
pub fn put_addr(b: &mut [u8], at: usize, a: [u8; 4]) {
    if at + 4 <= b.len() {
        b[at..at + 4].copy_from_slice(&a);
    }
}

/// `data` with the 16-bit field at `at` zeroed.
fn zeroed(data: &[u8], at: usize) -> Vec<u8> {
    let mut v = data.to_vec();
    v[at..at + 2].fill(0);
    v
}

/// Checks an IPv4 packet (`pkt` may be cut short when `quoted`, as in an
/// ICMP error body); appends a message per wrong or unverifiable checksum.
fn check_ipv4(pkt: &[u8], what: &str, quoted: bool, errs: &mut Vec<String>) {
    if pkt.len() < 20 {
        errs.push(format!("{what}: {} bytes, no IPv4 header", pkt.len()));
        return;
    }
    let hlen = usize::from(pkt[0] & 0x0f) * 4;
    if pkt[0] >> 4 != 4 || hlen < 20 || pkt.len() < hlen {
        errs.push(format!("{what}: bad version/IHL byte {:#04x}", pkt[0]));
        return;
    }
    let stored = be16(pkt, 10);
    let computed = checksum(&zeroed(&pkt[..hlen], 10));
    if stored != computed {
        errs.push(format!(
            "{what} IPv4 checksum {stored:#06x}, recomputed {computed:#06x}"
        ));
    }
    let total = usize::from(be16(pkt, 2));
    if total < hlen {
        errs.push(format!("{what}: total length {total} < header {hlen}"));
        return;
    }
    if total > pkt.len() {
        if !quoted {
            errs.push(format!(
                "{what}: total length {total} beyond the {} bytes",
                pkt.len()
            ));
        }
        // A quoted packet cut short: its L4 checksum covers bytes that
        // are not there; only a quoted UDP/ICMP header's checksum field is
        // left to the translator, nothing to recompute here.
        return;
    }
    if be16(pkt, 6) & 0x3fff != 0 {
        return; // fragment: the L4 checksum spans the whole datagram
    }
    let (src, dst, proto) = (addr(pkt, 12), addr(pkt, 16), pkt[9]);
    let l4 = &pkt[hlen..total];
    match proto {
        IPPROTO_TCP => {
            if l4.len() < 20 {
                errs.push(format!("{what}: TCP segment of {} bytes", l4.len()));
                return;
            }
            let stored = be16(l4, 16);
            let computed = l4_checksum(src, dst, IPPROTO_TCP, &zeroed(l4, 16));
            if stored != computed {
                errs.push(format!(
                    "{what} TCP checksum {stored:#06x}, recomputed {computed:#06x}"
                ));
            }
        }
        IPPROTO_UDP => {
            if l4.len() < 8 {
                errs.push(format!("{what}: UDP datagram of {} bytes", l4.len()));
                return;
            }
            let stored = be16(l4, 6);
            let computed = match l4_checksum(src, dst, IPPROTO_UDP, &zeroed(l4, 6)) {
                0 => 0xffff,
                c => c,
            };
            if stored != 0 && stored != computed {
                errs.push(format!(
                    "{what} UDP checksum {stored:#06x}, recomputed {computed:#06x}"
                ));
            }
        }
        IPPROTO_ICMP => {
            if l4.len() < 8 {
                errs.push(format!("{what}: ICMP message of {} bytes", l4.len()));
                return;
            }
            let stored = be16(l4, 2);
            let computed = checksum(&zeroed(l4, 2));
            if stored != computed {
                errs.push(format!(
                    "{what} ICMP checksum {stored:#06x}, recomputed {computed:#06x}"
                ));
            }
            if matches!(
                l4[0],
                ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM
            ) {
                check_ipv4(&l4[8..], &format!("{what} > embedded"), true, errs);
            }
        }
        _ => {}
    }
}

/// Every checksum of an Ethernet + IPv4 frame that does not match a
/// recomputation from scratch: the IPv4 header, the TCP/UDP checksum with
/// the pseudo-header (UDP 0 = none), the ICMP checksum, and for ICMP errors
/// the embedded IPv4 header and, when the whole embedded packet is quoted,
/// its L4 checksum. Empty when all are right.
#[must_use]
pub fn checksum_errors(frame: &[u8]) -> Vec<String> {
    let mut errs = Vec::new();
    if frame.len() < ETH_HLEN {
        errs.push(format!("frame of {} bytes", frame.len()));
    } else if be16(frame, 12) != ETHERTYPE_IPV4 {
        errs.push(format!("ethertype {:#06x}", be16(frame, 12)));
    } else {
        check_ipv4(&frame[ETH_HLEN..], "outer", false, &mut errs);
    }
    errs
}

/// Panics unless every checksum in `frame` equals a recomputation (see
/// [`checksum_errors`]).
pub fn verify_checksums(frame: &[u8]) {
    let errs = checksum_errors(frame);
    assert!(
        errs.is_empty(),
        "checksums wrong: {errs:?}\nframe: {frame:02x?}"
    );
}

/// `frame` with VLAN tags inserted before its Ethernet type: each a tag
/// protocol identifier (`0x8100` 802.1Q, `0x88a8` 802.1ad) and control
/// information (priority, drop eligible, VLAN id; VLAN id 0: a priority
/// tag), outermost first.
#[must_use]
pub fn with_tags(frame: &[u8], tags: &[(u16, u16)]) -> Vec<u8> {
    let mut v = frame[..ETHERTYPE_OFF].to_vec();
    for (tpid, tci) in tags {
        v.extend_from_slice(&tpid.to_be_bytes());
        v.extend_from_slice(&tci.to_be_bytes());
    }
    v.extend_from_slice(&frame[ETHERTYPE_OFF..]);
    v
}

/// Priority tags (802.1Q or 802.1ad, VLAN id 0) the data path takes off
/// a frame first, as the kernel does: at most 4 of them.
pub const PRIORITY_TAGS_STRIPPED: usize = 4;

/// `frame` as the data path goes on with it after taking its priority
/// tags off: `None` if it has none, or keeps its tags (a tag of another
/// VLAN id, more than [`PRIORITY_TAGS_STRIPPED`], cut short inside a tag
/// or right behind the last one).
#[must_use]
pub fn without_priority_tags(frame: &[u8]) -> Option<Vec<u8>> {
    let mut at = ETHERTYPE_OFF;
    for tag in 0..=PRIORITY_TAGS_STRIPPED {
        let word = frame.get(at..at + 4)?;
        if !matches!(u16::from_be_bytes([word[0], word[1]]), 0x8100 | 0x88a8) {
            break;
        }
        if u16::from_be_bytes([word[2], word[3]]) & 0x0fff != 0 || tag == PRIORITY_TAGS_STRIPPED {
            return None;
        }
        at += 4;
    }
    (at > ETHERTYPE_OFF).then(|| [&frame[..ETHERTYPE_OFF], &frame[at..]].concat())
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::addr::octets::{CLIENT as A, SERVER as B};

    const M: [u8; 6] = [2, 0, 0, 0, 0, 1];

    #[test]
    fn priority_tags_come_off_as_the_data_path_takes_them_off() {
        let f = Frame::new(M, M, Ipv4::new(A, B, Udp::new(1, 2, b"x"))).bytes();
        assert_eq!(without_priority_tags(&f), None, "untagged");
        for tags in [
            &[(0x8100, 0xe000)][..],
            &[(0x88a8, 0), (0x8100, 0)],
            &[(0x8100, 0); 4],
        ] {
            assert_eq!(without_priority_tags(&with_tags(&f, tags)), Some(f.clone()));
        }
        for kept in [
            &[(0x8100, 5)][..],
            &[(0x8100, 0), (0x8100, 5)],
            &[(0x8100, 0); 5],
        ] {
            assert_eq!(without_priority_tags(&with_tags(&f, kept)), None);
        }
        let tagged = with_tags(&f, &[(0x8100, 0)]);
        assert_eq!(
            without_priority_tags(&tagged[..ETHERTYPE_OFF + 5]),
            None,
            "cut short"
        );
        assert!(without_priority_tags(&tagged[..ETHERTYPE_OFF + 8]).is_some());
    }

    fn frames() -> Vec<Vec<u8>> {
        let tcp = Ipv4::new(A, B, Tcp::new(40000, 80, TCP_SYN).options(&[2, 4, 5, 0xb4]));
        let udp = Ipv4::new(A, B, Udp::new(1, 2, b"odd"));
        let echo = Ipv4::new(A, B, Icmp::echo_request(7, 1, b"ping"));
        let err = Ipv4::new(B, A, Icmp::error(ICMP_DEST_UNREACH, 3, &udp.bytes()));
        [tcp, udp, echo, err]
            .into_iter()
            .map(|ip| Frame::new(M, M, ip).bytes())
            .collect()
    }

    #[test]
    fn built_frames_verify() {
        for f in frames() {
            assert_eq!(checksum_errors(&f), Vec::<String>::new());
        }
    }

    #[test]
    fn corruption_is_found_in_every_checksummed_region() {
        for f in frames() {
            // Every byte from the IPv4 header on is covered by some checksum
            // (the ICMP error's body by the ICMP checksum).
            for at in IP_OFF..f.len() {
                let mut g = f.clone();
                g[at] ^= 0x10;
                assert!(
                    !checksum_errors(&g).is_empty(),
                    "flip at {at} not detected: {f:02x?}"
                );
            }
        }
    }

    #[test]
    fn udp_without_checksum_verifies_and_known_header() {
        let f = Frame::new(M, M, Ipv4::new(A, B, Udp::new(1, 2, b"x").no_checksum())).bytes();
        assert_eq!(&f[L4_OFF + 6..L4_OFF + 8], &[0, 0]);
        assert!(checksum_errors(&f).is_empty());
        // RFC 1071-style known answer: the header in router-common's tests.
        let ip = Ipv4 {
            tos: 0,
            id: 0,
            frag: IP_DF,
            ttl: 64,
            src: [192, 168, 0, 1],
            dst: [192, 168, 0, 199],
            options: Vec::new(),
            l4: L4::Raw {
                proto: 17,
                bytes: vec![0; 0x73 - 20],
            },
        };
        assert_eq!(&ip.bytes()[10..12], &[0xb8, 0x61]);
    }
}
