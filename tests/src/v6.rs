//! IPv6 in the test topology and crafted IPv6 frames: global addresses
//! from the documentation prefix `2001:db8::/32` on every host (the server
//! routed back to the LAN prefix through the router: IPv6 is routed, not
//! translated), and builders for Ethernet + IPv6 + TCP/UDP/`ICMPv6` frames
//! with every checksum computed from scratch, reusing the IPv4 kit's L4
//! builders with the IPv6 pseudo-header.

use std::net::Ipv6Addr;

use router_common::checksum::{fold, sum_words};
use router_common::ipv6::IPPROTO_ICMPV6;
use router_common::maps::{IPPROTO_TCP, IPPROTO_UDP};

use crate::addr::{HOST_IF, LAN_IF, WAN_IF};
use crate::frames::{Tcp, Udp, be16};
use crate::topology::{Ns, Topology};

/// The client's address (LAN prefix `2001:db8:50::/64`).
pub const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x50, 0, 0, 0, 0, 2);
/// The router on the LAN: the clients' default gateway.
pub const ROUTER_LAN6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x50, 0, 0, 0, 0, 1);
/// The router on the WAN (WAN link `2001:db8:71::/64`).
pub const ROUTER_WAN6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x71, 0, 0, 0, 0, 1);
/// The server.
pub const SERVER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x71, 0, 0, 0, 0, 2);
/// A LAN address nobody has.
pub const LAN_NOBODY6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x50, 0, 0, 0, 0, 9);
/// The LAN prefix.
pub const LAN_PREFIX6: &str = "2001:db8:50::/64";
/// Ethernet type of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Length of the fixed IPv6 header.
pub const IPV6_HLEN: usize = 40;
/// Offset of the IPv6 header in a frame.
pub const IP6_OFF: usize = 14;
/// Offset of the L4 header in a frame without extension headers.
pub const L4_6_OFF: usize = IP6_OFF + IPV6_HLEN;
/// Offset of the hop limit in a frame.
pub const HOP_LIMIT_OFF: usize = IP6_OFF + 7;

pub const ICMP6_DEST_UNREACH: u8 = 1;
pub const ICMP6_PACKET_TOO_BIG: u8 = 2;
pub const ICMP6_TIME_EXCEEDED: u8 = 3;
pub const ICMP6_ECHO_REQUEST: u8 = 128;
pub const ICMP6_ECHO_REPLY: u8 = 129;
pub const ICMP6_NEIGHBOUR_SOLICIT: u8 = 135;
pub const ICMP6_NEIGHBOUR_ADVERT: u8 = 136;
pub const ICMP6_ROUTER_SOLICIT: u8 = 133;
pub const ICMP6_ROUTER_ADVERT: u8 = 134;
pub const ICMP6_MLD2_REPORT: u8 = 143;

/// Gives every host of `t` its IPv6 address (no DAD wait), the client a
/// default route via the router, the server a route to the LAN prefix via
/// the router's WAN address, and turns IPv6 forwarding on in the router.
/// The client(s) of a two-client topology other than the first get none.
pub fn enable(t: &Topology) {
    let add = |ns: Ns, addr: Ipv6Addr, dev: &str| {
        let a = format!("{addr}/64");
        t.exec_ok(ns, &["ip", "-6", "addr", "add", &a, "dev", dev, "nodad"]);
    };
    t.exec_ok(
        Ns::Router,
        &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"],
    );
    add(Ns::Router, ROUTER_LAN6, LAN_IF);
    add(Ns::Router, ROUTER_WAN6, WAN_IF);
    add(Ns::Client, CLIENT6, HOST_IF);
    add(Ns::Server, SERVER6, HOST_IF);
    let gw = ROUTER_LAN6.to_string();
    t.exec_ok(
        Ns::Client,
        &["ip", "-6", "route", "add", "default", "via", &gw],
    );
    let back = ROUTER_WAN6.to_string();
    t.exec_ok(
        Ns::Server,
        &["ip", "-6", "route", "add", LAN_PREFIX6, "via", &back],
    );
}

/// Makes the router resolve the client and the server (pings from the
/// router, which answer with neighbour advertisements).
///
/// # Panics
/// If a host does not answer.
pub fn resolve_neighbours(t: &Topology) {
    try_resolve_neighbours(t).unwrap_or_else(|e| panic!("{e}"));
}

/// [`resolve_neighbours`], saying which host did not answer instead of
/// panicking (for the benchmark, which records the failure and goes on).
///
/// # Errors
/// If the router cannot ping the client or the server over IPv6.
pub fn try_resolve_neighbours(t: &Topology) -> Result<(), String> {
    for addr in [CLIENT6, SERVER6] {
        let a = addr.to_string();
        let out = t.exec(Ns::Router, &["ping", "-6", "-c", "1", "-W", "2", &a]);
        if !out.status.success() {
            return Err(format!(
                "the router cannot ping {a} (IPv6 neighbour discovery): {}",
                String::from_utf8_lossy(&out.stdout).trim()
            ));
        }
    }
    Ok(())
}

/// The address as wire bytes.
#[must_use]
pub const fn o(a: Ipv6Addr) -> [u8; 16] {
    a.octets()
}

/// TCP/UDP/`ICMPv6` checksum of `segment` with the IPv6 pseudo-header
/// (RFC 8200 8.1); the checksum field zeroed to compute, intact to verify
/// (-> 0).
#[must_use]
pub fn l4_checksum6(src: [u8; 16], dst: [u8; 16], proto: u8, segment: &[u8]) -> u16 {
    let mut acc = sum_words(&src, 0);
    acc = sum_words(&dst, acc);
    let len = u32::try_from(segment.len()).unwrap();
    acc = sum_words(&len.to_be_bytes(), acc);
    acc = sum_words(&[0, 0, 0, proto], acc);
    !fold(sum_words(segment, acc))
}

/// An IPv6 packet: fixed header and what follows it (extension headers
/// and L4 as bytes, built by the functions below).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv6 {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub next_header: u8,
    pub hop_limit: u8,
    pub payload: Vec<u8>,
}

impl Ipv6 {
    /// A packet of `next_header` carrying `payload`, hop limit 64.
    #[must_use]
    pub fn new(src: [u8; 16], dst: [u8; 16], next_header: u8, payload: Vec<u8>) -> Self {
        Self {
            src,
            dst,
            next_header,
            hop_limit: 64,
            payload,
        }
    }

    /// A TCP segment (checksum with the IPv6 pseudo-header).
    #[must_use]
    pub fn tcp(src: [u8; 16], dst: [u8; 16], tcp: &Tcp) -> Self {
        let mut s = tcp.bytes([0; 4], [0; 4]);
        s[16..18].fill(0);
        let c = l4_checksum6(src, dst, IPPROTO_TCP, &s);
        s[16..18].copy_from_slice(&c.to_be_bytes());
        Self::new(src, dst, IPPROTO_TCP, s)
    }

    /// A UDP datagram (checksum mandatory in IPv6).
    #[must_use]
    pub fn udp(src: [u8; 16], dst: [u8; 16], udp: &Udp) -> Self {
        let mut d = udp.clone().no_checksum().bytes([0; 4], [0; 4]);
        let c = match l4_checksum6(src, dst, IPPROTO_UDP, &d) {
            0 => 0xffff,
            c => c,
        };
        d[6..8].copy_from_slice(&c.to_be_bytes());
        Self::new(src, dst, IPPROTO_UDP, d)
    }

    /// An `ICMPv6` message of `icmp_type`/`code` with the 4 bytes after the
    /// checksum (`rest`: echo id and sequence, MTU...) and `body`.
    #[must_use]
    pub fn icmp6(
        src: [u8; 16],
        dst: [u8; 16],
        icmp_type: u8,
        code: u8,
        rest: [u8; 4],
        body: &[u8],
    ) -> Self {
        let mut m = vec![icmp_type, code, 0, 0];
        m.extend_from_slice(&rest);
        m.extend_from_slice(body);
        let c = l4_checksum6(src, dst, IPPROTO_ICMPV6, &m);
        m[2..4].copy_from_slice(&c.to_be_bytes());
        Self::new(src, dst, IPPROTO_ICMPV6, m)
    }

    /// An echo request (`reply == false`) or reply.
    #[must_use]
    pub fn echo(src: [u8; 16], dst: [u8; 16], reply: bool, id: u16, seq: u16) -> Self {
        let t = if reply {
            ICMP6_ECHO_REPLY
        } else {
            ICMP6_ECHO_REQUEST
        };
        let mut rest = [0u8; 4];
        rest[..2].copy_from_slice(&id.to_be_bytes());
        rest[2..].copy_from_slice(&seq.to_be_bytes());
        Self::icmp6(src, dst, t, 0, rest, b"ping6 payload")
    }

    /// An error quoting `quoted` (as many bytes as RFC 4443 allows to fit
    /// in 1280 are the caller's choice); `rest` is the MTU for Packet Too
    /// Big, else zero.
    #[must_use]
    pub fn error(src: [u8; 16], dst: [u8; 16], icmp_type: u8, mtu: u32, quoted: &[u8]) -> Self {
        Self::icmp6(src, dst, icmp_type, 0, mtu.to_be_bytes(), quoted)
    }

    #[must_use]
    pub fn hop_limit(mut self, hop_limit: u8) -> Self {
        self.hop_limit = hop_limit;
        self
    }

    /// The packet's bytes.
    #[must_use]
    pub fn bytes(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(IPV6_HLEN + self.payload.len());
        p.extend_from_slice(&[0x60, 0, 0, 0]);
        p.extend_from_slice(&u16::try_from(self.payload.len()).unwrap().to_be_bytes());
        p.push(self.next_header);
        p.push(self.hop_limit);
        p.extend_from_slice(&self.src);
        p.extend_from_slice(&self.dst);
        p.extend_from_slice(&self.payload);
        p
    }

    /// The Ethernet frame of this packet.
    #[must_use]
    pub fn frame(&self, dst_mac: [u8; 6], src_mac: [u8; 6]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&dst_mac);
        f.extend_from_slice(&src_mac);
        f.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        f.extend_from_slice(&self.bytes());
        f
    }
}

/// Every L4 checksum of an Ethernet + IPv6 frame (no extension headers)
/// that does not verify. Empty when all are right.
#[must_use]
pub fn checksum_errors6(frame: &[u8]) -> Vec<String> {
    let mut errs = Vec::new();
    if frame.len() < L4_6_OFF || be16(frame, 12) != ETHERTYPE_IPV6 {
        errs.push(format!("not an IPv6 frame: {} bytes", frame.len()));
        return errs;
    }
    let ip = &frame[IP6_OFF..];
    let payload_len = usize::from(be16(ip, 4));
    let (next, l4) = (ip[6], &ip[IPV6_HLEN..IPV6_HLEN + payload_len]);
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&ip[8..24]);
    dst.copy_from_slice(&ip[24..40]);
    if matches!(next, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_ICMPV6)
        && l4_checksum6(src, dst, next, l4) != 0
    {
        errs.push(format!("L4 checksum of protocol {next} does not verify"));
    }
    errs
}
