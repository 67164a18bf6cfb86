//! A minimal ctnetlink client (`NETLINK_NETFILTER`, subsystem
//! `NFNL_SUBSYS_CTNETLINK`): dump the kernel's connection table, follow its
//! NEW / UPDATE / DESTROY events, and change one entry (timeout, TCP window
//! tracking flags). Message layout: `nlmsghdr`, `nfgenmsg` (family, version,
//! resource id), then `CTA_*` attributes; multi-byte attribute values are big
//! endian (`include/uapi/linux/netfilter/nfnetlink_conntrack.h`). Everything
//! runs in the calling thread's network namespace.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, OwnedFd, RawFd},
};

use crate::nlmsg::{
    Datagrams, Msg, NLM_F_ACK, NLM_F_DUMP, NLMSG_DONE, NLMSG_ERROR, attrs, messages,
    sequenced_messages,
};

const NFNL_SUBSYS_CTNETLINK: u16 = 1;
const IPCTNL_MSG_CT_NEW: u16 = 0;
const IPCTNL_MSG_CT_GET: u16 = 1;
const IPCTNL_MSG_CT_DELETE: u16 = 2;

/// On an `IPCTNL_MSG_CT_NEW` event: the entry is new (else an update).
const NLM_F_CREATE: u16 = 0x400;

const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_REPLY: u16 = 2;
const CTA_STATUS: u16 = 3;
const CTA_PROTOINFO: u16 = 4;
const CTA_HELP: u16 = 5;
const CTA_TIMEOUT: u16 = 7;
const CTA_MARK: u16 = 8;
const CTA_COUNTERS_ORIG: u16 = 9;
const CTA_COUNTERS_REPLY: u16 = 10;
const CTA_ID: u16 = 12;
const CTA_TUPLE_MASTER: u16 = 14;
const CTA_SEQ_ADJ_ORIG: u16 = 15;
const CTA_ZONE: u16 = 18;

const CTA_TUPLE_IP: u16 = 1;
const CTA_TUPLE_PROTO: u16 = 2;
/// A zone of one direction only (`ct original zone set`, `ct reply zone
/// set`), inside that direction's tuple; a zone of both is [`CTA_ZONE`].
const CTA_TUPLE_ZONE: u16 = 3;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_IP_V4_DST: u16 = 2;
const CTA_IP_V6_SRC: u16 = 3;
const CTA_IP_V6_DST: u16 = 4;
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_SRC_PORT: u16 = 2;
const CTA_PROTO_DST_PORT: u16 = 3;
const CTA_PROTO_ICMP_ID: u16 = 4;
const CTA_PROTO_ICMP_TYPE: u16 = 5;
const CTA_PROTO_ICMP_CODE: u16 = 6;
const CTA_PROTO_ICMPV6_ID: u16 = 7;
const CTA_PROTO_ICMPV6_TYPE: u16 = 8;
const CTA_PROTO_ICMPV6_CODE: u16 = 9;
const CTA_PROTOINFO_TCP: u16 = 1;
const CTA_PROTOINFO_TCP_STATE: u16 = 1;
const CTA_PROTOINFO_TCP_WSCALE_ORIGINAL: u16 = 2;
const CTA_PROTOINFO_TCP_WSCALE_REPLY: u16 = 3;
const CTA_PROTOINFO_TCP_FLAGS_ORIGINAL: u16 = 4;
const CTA_PROTOINFO_TCP_FLAGS_REPLY: u16 = 5;
const CTA_COUNTERS_PACKETS: u16 = 1;
const CTA_COUNTERS_BYTES: u16 = 2;

/// `IP_CT_TCP_FLAG_BE_LIBERAL`: conntrack stops checking this direction's
/// sequence numbers against its window. Set while XDP carries a flow,
/// because the kernel does not see the segments in between (`nf_flowtable`
/// does the same when it offloads a TCP flow).
pub const TCP_FLAG_BE_LIBERAL: u8 = 0x08;

/// `IPS_*` status bits (`enum ip_conntrack_status`).
pub mod status {
    pub const EXPECTED: u32 = 1 << 0;
    pub const SEEN_REPLY: u32 = 1 << 1;
    pub const ASSURED: u32 = 1 << 2;
    pub const CONFIRMED: u32 = 1 << 3;
    pub const SEQ_ADJUST: u32 = 1 << 6;
    pub const DYING: u32 = 1 << 9;
    pub const TEMPLATE: u32 = 1 << 11;
    pub const UNTRACKED: u32 = 1 << 12;
    pub const HELPER: u32 = 1 << 13;
}

/// `enum tcp_conntrack` values that matter here.
pub mod tcp_state {
    pub const ESTABLISHED: u8 = 3;
    /// A FIN seen (in either direction) on an established connection.
    pub const FIN_WAIT: u8 = 4;
    /// A RST seen.
    pub const CLOSE: u8 = 8;
}

/// `NFNLGRP_CONNTRACK_*` as `nl_groups` bits (group n is bit n - 1).
const GROUP_NEW: u32 = 1 << 0;
const GROUP_UPDATE: u32 = 1 << 1;
const GROUP_DESTROY: u32 = 1 << 2;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_ICMPV6: u8 = 58;

/// One direction of a connection as conntrack keys it. For ICMP and
/// `ICMPv6` both ports hold the identifier and `icmp` the type and code
/// (the kernel needs all three to find the entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tuple {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub icmp: Option<(u8, u8)>,
}

impl Default for Tuple {
    fn default() -> Self {
        Self {
            src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            dst: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            proto: 0,
            sport: 0,
            dport: 0,
            icmp: None,
        }
    }
}

/// A kernel conntrack entry: what a dump row or an event carries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Conn {
    pub id: u32,
    pub orig: Tuple,
    /// The reply direction; with NAT it holds the translation (for
    /// masquerade its destination is the router's address and mapped port).
    pub reply: Tuple,
    /// `IPS_*` bits.
    pub status: u32,
    /// TCP only: `enum tcp_conntrack`.
    pub tcp_state: Option<u8>,
    /// TCP only: the window scale shift each direction's advertisements
    /// use (original, reply), as conntrack settled it from the handshake.
    pub tcp_wscale: Option<[u8; 2]>,
    /// TCP only: conntrack does not check a direction's window
    /// ([`TCP_FLAG_BE_LIBERAL`]: picked up mid-stream, or offloaded
    /// already), so its window scale may not be the connection's.
    pub tcp_liberal: bool,
    /// Seconds left before the entry expires.
    pub timeout: Option<u32>,
    /// A helper (ALG) is attached, or the entry is an expected one.
    pub helper: bool,
    /// TCP sequence numbers are being adjusted (a helper changed a payload).
    pub seq_adjust: bool,
    /// The connection's conntrack zone: both directions' (`CTA_ZONE`), else
    /// one direction's own (`CTA_TUPLE_ZONE` in its tuple), 0 for none.
    pub zone: u16,
    /// The connection's mark (`ct mark`), which rules copy into its
    /// packets' marks (`meta mark set ct mark`) for policy routing.
    pub mark: u32,
    /// Packets and bytes per direction (original, reply) when conntrack
    /// accounting is on.
    pub counters: Option<[(u64, u64); 2]>,
}

impl Conn {
    #[must_use]
    pub const fn has(&self, bits: u32) -> bool {
        self.status & bits == bits
    }
}

/// What the kernel announced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    New(Conn),
    Update(Conn),
    Destroy(Conn),
}

fn be16(d: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes(d.get(..2)?.try_into().ok()?))
}

fn be32(d: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(d.get(..4)?.try_into().ok()?))
}

fn be64(d: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(d.get(..8)?.try_into().ok()?))
}

/// The zone of one direction a tuple's attributes carry (0: none).
fn tuple_zone(data: &[u8]) -> u16 {
    attrs(data)
        .find(|(ty, _)| *ty == CTA_TUPLE_ZONE)
        .and_then(|(_, d)| be16(d))
        .unwrap_or(0)
}

fn parse_tuple(data: &[u8]) -> Option<Tuple> {
    let mut t = Tuple::default();
    let (mut src, mut dst) = (None, None);
    let (mut icmp_type, mut icmp_code) = (None, None);
    for (ty, d) in attrs(data) {
        match ty {
            CTA_TUPLE_IP => {
                for (ty, d) in attrs(d) {
                    let addr = match d.len() {
                        4 => IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(d).ok()?)),
                        16 => IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(d).ok()?)),
                        _ => return None,
                    };
                    match ty {
                        CTA_IP_V4_SRC | CTA_IP_V6_SRC => src = Some(addr),
                        CTA_IP_V4_DST | CTA_IP_V6_DST => dst = Some(addr),
                        _ => {}
                    }
                }
            }
            CTA_TUPLE_PROTO => {
                for (ty, d) in attrs(d) {
                    match ty {
                        CTA_PROTO_NUM => t.proto = *d.first()?,
                        CTA_PROTO_SRC_PORT => t.sport = be16(d)?,
                        CTA_PROTO_DST_PORT => t.dport = be16(d)?,
                        CTA_PROTO_ICMP_ID | CTA_PROTO_ICMPV6_ID => {
                            t.sport = be16(d)?;
                            t.dport = t.sport;
                        }
                        CTA_PROTO_ICMP_TYPE | CTA_PROTO_ICMPV6_TYPE => {
                            icmp_type = d.first().copied();
                        }
                        CTA_PROTO_ICMP_CODE | CTA_PROTO_ICMPV6_CODE => {
                            icmp_code = d.first().copied();
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    t.src = src?;
    t.dst = dst?;
    if let (Some(ty), Some(code)) = (icmp_type, icmp_code) {
        t.icmp = Some((ty, code));
    }
    Some(t)
}

fn parse_counters(data: &[u8]) -> (u64, u64) {
    let (mut packets, mut bytes) = (0, 0);
    for (ty, d) in attrs(data) {
        match ty {
            CTA_COUNTERS_PACKETS => packets = be64(d).unwrap_or(0),
            CTA_COUNTERS_BYTES => bytes = be64(d).unwrap_or(0),
            _ => {}
        }
    }
    (packets, bytes)
}

/// Parses the attributes of a conntrack message (after the `nfgenmsg`).
/// `None` when a tuple is missing or malformed.
#[must_use]
pub fn parse_conn(data: &[u8]) -> Option<Conn> {
    let mut c = Conn::default();
    let (mut orig, mut reply) = (None, None);
    let (mut c_orig, mut c_reply) = (None, None);
    let mut direction_zone = 0;
    for (ty, d) in attrs(data) {
        match ty {
            CTA_TUPLE_ORIG => {
                orig = parse_tuple(d);
                direction_zone = direction_zone.max(tuple_zone(d));
            }
            CTA_TUPLE_REPLY => {
                reply = parse_tuple(d);
                direction_zone = direction_zone.max(tuple_zone(d));
            }
            CTA_STATUS => c.status = be32(d).unwrap_or(0),
            CTA_TIMEOUT => c.timeout = be32(d),
            CTA_MARK => c.mark = be32(d).unwrap_or(0),
            CTA_ID => c.id = be32(d).unwrap_or(0),
            CTA_ZONE => c.zone = be16(d).unwrap_or(0),
            CTA_HELP | CTA_TUPLE_MASTER => c.helper = true,
            CTA_SEQ_ADJ_ORIG => c.seq_adjust = true,
            CTA_COUNTERS_ORIG => c_orig = Some(parse_counters(d)),
            CTA_COUNTERS_REPLY => c_reply = Some(parse_counters(d)),
            CTA_PROTOINFO => {
                for (ty, d) in attrs(d) {
                    if ty == CTA_PROTOINFO_TCP {
                        let mut wscale = [None; 2];
                        for (ty, d) in attrs(d) {
                            match ty {
                                CTA_PROTOINFO_TCP_STATE => c.tcp_state = d.first().copied(),
                                CTA_PROTOINFO_TCP_WSCALE_ORIGINAL => wscale[0] = d.first().copied(),
                                CTA_PROTOINFO_TCP_WSCALE_REPLY => wscale[1] = d.first().copied(),
                                // `struct nf_ct_tcp_flags`: flags, mask.
                                CTA_PROTOINFO_TCP_FLAGS_ORIGINAL
                                | CTA_PROTOINFO_TCP_FLAGS_REPLY => {
                                    c.tcp_liberal |=
                                        d.first().is_some_and(|f| f & TCP_FLAG_BE_LIBERAL != 0);
                                }
                                _ => {}
                            }
                        }
                        if let [Some(o), Some(r)] = wscale {
                            c.tcp_wscale = Some([o, r]);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    c.orig = orig?;
    c.reply = reply?;
    if c.zone == 0 {
        c.zone = direction_zone;
    }
    if let (Some(o), Some(r)) = (c_orig, c_reply) {
        c.counters = Some([o, r]);
    }
    Some(c)
}

/// A ctnetlink request: header, `nfgenmsg` (family, `NFNETLINK_V0`,
/// resource id 0), attributes to follow.
fn ct_msg(msg_type: u16, flags: u16, family: u8) -> Msg {
    Msg::new(
        (NFNL_SUBSYS_CTNETLINK << 8) | msg_type,
        flags,
        &[family, 0, 0, 0],
    )
}

/// Appends the tuple `t` as the nested attribute `ty` (`CTA_TUPLE_*`).
fn put_tuple(m: &mut Msg, ty: u16, t: &Tuple) {
    m.nested(ty, |m| put_tuple_attrs(m, t));
}

/// What a tuple's nest holds: addresses, then protocol and ports.
fn put_tuple_attrs(m: &mut Msg, t: &Tuple) {
    m.nested(CTA_TUPLE_IP, |m| match (t.src, t.dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            m.attr(CTA_IP_V4_SRC, &s.octets());
            m.attr(CTA_IP_V4_DST, &d.octets());
        }
        (s, d) => {
            m.attr(CTA_IP_V6_SRC, &v6_octets(s));
            m.attr(CTA_IP_V6_DST, &v6_octets(d));
        }
    });
    m.nested(CTA_TUPLE_PROTO, |m| {
        m.attr(CTA_PROTO_NUM, &[t.proto]);
        match (t.proto, t.icmp) {
            (IPPROTO_ICMP, Some((ty, code))) => {
                m.attr(CTA_PROTO_ICMP_ID, &t.sport.to_be_bytes());
                m.attr(CTA_PROTO_ICMP_TYPE, &[ty]);
                m.attr(CTA_PROTO_ICMP_CODE, &[code]);
            }
            (IPPROTO_ICMPV6, Some((ty, code))) => {
                m.attr(CTA_PROTO_ICMPV6_ID, &t.sport.to_be_bytes());
                m.attr(CTA_PROTO_ICMPV6_TYPE, &[ty]);
                m.attr(CTA_PROTO_ICMPV6_CODE, &[code]);
            }
            _ => {
                m.attr(CTA_PROTO_SRC_PORT, &t.sport.to_be_bytes());
                m.attr(CTA_PROTO_DST_PORT, &t.dport.to_be_bytes());
            }
        }
    });
}

fn v6_octets(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
    }
}

fn family_of(t: &Tuple) -> u8 {
    if t.src.is_ipv4() {
        libc::AF_INET as u8
    } else {
        libc::AF_INET6 as u8
    }
}

/// The message type of a ctnetlink message, or `None` for another subsystem.
fn ct_msg_type(nl_type: u16) -> Option<u16> {
    (nl_type >> 8 == NFNL_SUBSYS_CTNETLINK).then_some(nl_type & 0xff)
}

/// Parses one buffer of event messages.
#[must_use]
pub fn parse_events(buf: &[u8]) -> Vec<Event> {
    let mut out = Vec::new();
    for (ty, flags, payload) in messages(buf) {
        let (Some(msg), Some(conn)) = (ct_msg_type(ty), payload.get(4..).and_then(parse_conn))
        else {
            continue;
        };
        out.push(match msg {
            IPCTNL_MSG_CT_NEW if flags & NLM_F_CREATE != 0 => Event::New(conn),
            IPCTNL_MSG_CT_NEW => Event::Update(conn),
            IPCTNL_MSG_CT_DELETE => Event::Destroy(conn),
            _ => continue,
        });
    }
    out
}

/// Whether the offload daemon acts on a conntrack event (NEW, UPDATE or
/// DESTROY) about `c`: what [`event_filter`] lets through, in Rust.
///
/// TCP events name the connection's state (when it changed, and always in
/// DESTROY). The daemon offloads only ESTABLISHED connections and ends an
/// offloaded (or pending) one at the first state after ESTABLISHED, which
/// is always `FIN_WAIT` (a FIN in either direction) or `CLOSE` (a RST)
/// (netfilter's TCP state table, `nf_conntrack_proto_tcp.c`): the
/// handshake's states (NEW at the SYN, `SYN_RECV`) and the later closing
/// ones (`CLOSE_WAIT`, `LAST_ACK`, `TIME_WAIT`, and the DESTROY of a
/// connection that ended through them) change nothing it carries. That is
/// five to six of a short connection's seven to eight events. Everything
/// else (other protocols, TCP events without a state) it reads.
#[must_use]
pub fn event_needed(c: &Conn) -> bool {
    c.orig.proto != libc::IPPROTO_TCP as u8
        || c.tcp_state.is_none_or(|s| {
            matches!(
                s,
                tcp_state::ESTABLISHED | tcp_state::FIN_WAIT | tcp_state::CLOSE
            )
        })
}

/// Classic BPF instructions (`linux/bpf_common.h`, `linux/filter.h`):
/// `ld #k`, `ldx #k`, `ld b[k]`, `ld b[x + k]`, `tax`, `jeq #k`, `ret #k`.
const LD_IMM: u16 = (libc::BPF_LD | libc::BPF_IMM) as u16;
const LDX_IMM: u16 = (libc::BPF_LDX | libc::BPF_IMM) as u16;
const LD_ABS_B: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
/// `ld w[k]`: a 32-bit load, which classic BPF reads in network order.
const LD_ABS_W: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
/// Where a message's `nlmsg_pid` is: the netlink port of the socket whose
/// request caused the event (0: the kernel's own, a packet's).
const NLMSG_PID_AT: u32 = 12;
const LD_IND_B: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_IND) as u16;
/// `BPF_MISC | BPF_TAX` (`BPF_TAX` is 0).
const TAX: u16 = libc::BPF_MISC as u16;
const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
/// The ancillary loads that find a netlink attribute: `A` = offset of the
/// attribute of type `X` in the attributes starting at offset `A`
/// (`NLATTR`) or inside the nested attribute at offset `A`
/// (`NLATTR_NEST`); 0 when there is none.
const AD_NLATTR: u32 = (libc::SKF_AD_OFF + libc::SKF_AD_NLATTR).cast_unsigned();
const AD_NLATTR_NEST: u32 = (libc::SKF_AD_OFF + libc::SKF_AD_NLATTR_NEST).cast_unsigned();
/// Where an event's attributes start: after the `nlmsghdr` and the
/// `nfgenmsg` (each event is a datagram of one message).
const EVENT_ATTRS_AT: u32 = 16 + 4;
/// Attribute header length: a value is at the attribute's offset + 4.
const NLA_HDRLEN: u32 = 4;

/// The classic BPF socket filter that drops, in the kernel, the events
/// [`event_needed`] says the daemon does not act on, before they are
/// queued and wake it (as conntrackd's filters do). A short connection
/// then costs the daemon two events instead of seven or eight.
///
/// And the events its own requests caused, those whose `nlmsg_pid` is
/// `own_port` (the port of the daemon's request socket; 0: none dropped
/// for that): each refresh of an entry's timeout, each status bit it sets,
/// comes back as an UPDATE to every listener, the writer's own event
/// socket too, and tells it only what it wrote. A tick refreshing some
/// 15,000 active flows overflowed the socket with them by itself, every
/// tick (each time a loss, a dump and a warning).
#[must_use]
pub fn event_filter(own_port: u32) -> Vec<libc::sock_filter> {
    /// A step of the program; jumps go to "accept" (the last instruction)
    /// or "drop" (the one before it).
    #[derive(Clone, Copy)]
    enum Step {
        Insn(u16, u32),
        /// `jeq #k`: accept when equal.
        AcceptIfEq(u32),
        /// `jeq #k`: go on when equal, else accept.
        AcceptIfNe(u32),
        /// `jeq #k`: drop when equal.
        DropIfEq(u32),
    }
    use Step::{AcceptIfEq, AcceptIfNe, DropIfEq, Insn};
    // A = offset of attribute `ty` in the top-level attributes / in the
    // nest at A; no such attribute (A = 0): accept.
    let find = |ty: u16| {
        [
            Insn(LDX_IMM, ty.into()),
            Insn(LD_ABS_B, AD_NLATTR),
            AcceptIfEq(0),
        ]
    };
    let find_in = |ty: u16| {
        [
            Insn(LDX_IMM, ty.into()),
            Insn(LD_ABS_B, AD_NLATTR_NEST),
            AcceptIfEq(0),
        ]
    };
    // A = the u8 value of the attribute at offset A.
    let value = [Insn(TAX, 0), Insn(LD_IND_B, NLA_HDRLEN)];
    let mut steps = Vec::new();
    if own_port != 0 {
        // The load reads the host-order field as big-endian.
        steps.push(Insn(LD_ABS_W, NLMSG_PID_AT));
        steps.push(DropIfEq(u32::from_be_bytes(own_port.to_ne_bytes())));
    }
    steps.push(Insn(LD_IMM, EVENT_ATTRS_AT));
    steps.extend(find(CTA_TUPLE_ORIG));
    steps.extend(find_in(CTA_TUPLE_PROTO));
    steps.extend(find_in(CTA_PROTO_NUM));
    steps.extend(value);
    steps.push(AcceptIfNe(libc::IPPROTO_TCP.cast_unsigned()));
    steps.push(Insn(LD_IMM, EVENT_ATTRS_AT));
    steps.extend(find(CTA_PROTOINFO));
    steps.extend(find_in(CTA_PROTOINFO_TCP));
    steps.extend(find_in(CTA_PROTOINFO_TCP_STATE));
    steps.extend(value);
    for state in [
        tcp_state::ESTABLISHED,
        tcp_state::FIN_WAIT,
        tcp_state::CLOSE,
    ] {
        steps.push(AcceptIfEq(state.into()));
    }
    // Drop, then accept (the whole message).
    steps.push(Insn(RET_K, 0));
    let accept = steps.len();
    steps.push(Insn(RET_K, u32::MAX));
    steps
        .into_iter()
        .enumerate()
        .map(|(i, step)| {
            // Jumps are relative to the next instruction and only go
            // forward; the program is far shorter than 255.
            let to_accept = u8::try_from(accept.saturating_sub(i + 1)).unwrap_or(u8::MAX);
            let to_drop = to_accept.saturating_sub(1);
            let (code, jt, jf, k) = match step {
                Insn(code, k) => (code, 0, 0, k),
                AcceptIfEq(k) => (JEQ_K, to_accept, 0, k),
                AcceptIfNe(k) => (JEQ_K, 0, to_accept, k),
                DropIfEq(k) => (JEQ_K, to_drop, 0, k),
            };
            libc::sock_filter { code, jt, jf, k }
        })
        .collect()
}

/// A `NETLINK_NETFILTER` socket: requests, or (after [`CtSocket::events`])
/// the conntrack event groups.
pub struct CtSocket {
    fd: OwnedFd,
    seq: u32,
    /// The replies' receive buffer, allocated at the first request and
    /// kept (the daemon makes a request per connection it offloads).
    replies: Vec<u8>,
}

/// Size of the replies' receive buffer: a dump's datagrams fit.
const REPLY_BUF: usize = 1 << 17;

impl AsRawFd for CtSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

fn setsockopt_int(fd: RawFd, level: i32, opt: i32, value: i32) -> io::Result<()> {
    // SAFETY: valid option buffer of the right size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&raw const value).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl CtSocket {
    fn open(groups: u32, nonblocking: bool) -> io::Result<Self> {
        let fd = crate::nlmsg::bound_socket(libc::NETLINK_NETFILTER, groups, nonblocking)?;
        Ok(Self {
            fd,
            seq: 1,
            replies: Vec::new(),
        })
    }

    /// A socket for requests (dump, get, update). Replies wait at most 5 s.
    pub fn requests() -> io::Result<Self> {
        let s = Self::open(0, false)?;
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: valid option buffer of the right size.
        unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        Ok(s)
    }

    /// The netlink port the kernel gave this socket: what events caused
    /// by its requests carry as their `nlmsg_pid`.
    pub fn port(&self) -> io::Result<u32> {
        // SAFETY: zeroed sockaddr_nl is valid; the kernel fills it.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::sockaddr_nl>() as libc::socklen_t;
        // SAFETY: sa and len are valid for the call.
        let rc = unsafe { libc::getsockname(self.as_raw_fd(), (&raw mut sa).cast(), &raw mut len) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sa.nl_pid)
    }

    /// A non-blocking socket subscribed to NEW, UPDATE and DESTROY events,
    /// with a receive buffer of `rcvbuf` bytes, without the events the
    /// requests of the socket at port `own_port` caused ([`event_filter`]).
    /// When the kernel cannot queue an event, a later receive fails with
    /// `ENOBUFS`: events were lost and the caller must resynchronise with a
    /// dump.
    pub fn events(rcvbuf: usize, own_port: u32) -> io::Result<Self> {
        let s = Self::open(GROUP_NEW | GROUP_UPDATE | GROUP_DESTROY, true)?;
        let program = event_filter(own_port);
        let prog = libc::sock_fprog {
            len: u16::try_from(program.len()).unwrap_or(u16::MAX),
            filter: program.as_ptr().cast_mut(),
        };
        // SAFETY: prog points to `program`, alive during the call (the
        // kernel copies it).
        let rc = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_FILTER,
                (&raw const prog).cast(),
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let size = i32::try_from(rcvbuf).unwrap_or(i32::MAX);
        // SO_RCVBUFFORCE needs CAP_NET_ADMIN (the daemon has it); fall back
        // to the limited SO_RCVBUF.
        if setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, size).is_err() {
            setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, size)?;
        }
        Ok(s)
    }

    /// Receives the event datagrams queued (the kernel sends each event in
    /// its own), up to `batch`'s slots in one syscall: how many (0: none is
    /// queued). Read their events with [`parse_events`].
    pub fn recv_events(&self, batch: &mut Datagrams) -> io::Result<usize> {
        batch.recv(self.as_raw_fd())
    }

    /// One datagram into `buf`: `Ok(None)` if none is queued on a
    /// non-blocking socket.
    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        crate::nlmsg::recv(self.as_raw_fd(), buf)
    }

    fn send(&mut self, m: Msg) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let msg = m.finish(self.seq);
        // SAFETY: msg is a valid buffer; the kernel is the default peer.
        let n = unsafe { libc::send(self.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `m` and collects the conntrack entries answered, until DONE,
    /// an ack or an error.
    fn transact(&mut self, m: Msg) -> io::Result<Vec<Conn>> {
        // A request socket carries only the answers to its own requests,
        // one at a time; what is left of an earlier one's (cut short by an
        // error or a timeout) is skipped by its sequence number.
        self.send(m)?;
        let mut buf = std::mem::take(&mut self.replies);
        buf.resize(REPLY_BUF, 0);
        let answer = self.answer(&mut buf);
        self.replies = buf;
        answer
    }

    /// The conntrack entries answered to the request just sent, until
    /// DONE, an ack or an error.
    fn answer(&self, buf: &mut [u8]) -> io::Result<Vec<Conn>> {
        let mut out = Vec::new();
        loop {
            let n = match self.recv(buf) {
                Ok(Some(n)) => n,
                // `SO_RCVTIMEO` ran out (`EAGAIN`).
                Ok(None) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no answer from the kernel's conntrack within 5 s",
                    ));
                }
                // A signal, even with `SA_RESTART` (a receive timeout is set).
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            for (ty, _flags, seq, payload) in sequenced_messages(&buf[..n]) {
                if seq != self.seq {
                    continue;
                }
                match ty {
                    NLMSG_ERROR => {
                        let code = payload
                            .get(..4)
                            .map_or(0, |b| i32::from_ne_bytes(b.try_into().unwrap_or([0; 4])));
                        if code == 0 {
                            return Ok(out);
                        }
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                    NLMSG_DONE => return Ok(out),
                    t if ct_msg_type(t) == Some(IPCTNL_MSG_CT_NEW) => {
                        if let Some(c) = payload.get(4..).and_then(parse_conn) {
                            out.push(c);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// Every entry of the table (both address families).
    pub fn dump(&mut self) -> io::Result<Vec<Conn>> {
        self.transact(ct_msg(IPCTNL_MSG_CT_GET, NLM_F_DUMP, libc::AF_UNSPEC as u8))
    }

    /// The entry whose original direction is `orig` as the kernel has it
    /// now; `None` when it is gone.
    pub fn get(&mut self, orig: &Tuple) -> io::Result<Option<Conn>> {
        let mut m = ct_msg(IPCTNL_MSG_CT_GET, NLM_F_ACK, family_of(orig));
        put_tuple(&mut m, CTA_TUPLE_ORIG, orig);
        match self.transact(m) {
            Ok(found) => Ok(found.into_iter().next()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes the entry whose original direction is `orig`; `ENOENT`
    /// when it is gone already.
    pub fn delete(&mut self, orig: &Tuple) -> io::Result<()> {
        let mut m = ct_msg(IPCTNL_MSG_CT_DELETE, NLM_F_ACK, family_of(orig));
        put_tuple(&mut m, CTA_TUPLE_ORIG, orig);
        self.transact(m).map(|_| ())
    }

    /// Changes the entry whose original direction is `orig`: its timeout
    /// to `timeout` seconds (if given) and, for TCP, whether conntrack
    /// checks the sequence numbers of both directions against the window
    /// (`liberal`: it does not). `ENOENT` when the entry is gone.
    pub fn update(
        &mut self,
        orig: &Tuple,
        timeout: Option<u32>,
        liberal: Option<bool>,
    ) -> io::Result<()> {
        let mut m = ct_msg(IPCTNL_MSG_CT_NEW, NLM_F_ACK, family_of(orig));
        put_tuple(&mut m, CTA_TUPLE_ORIG, orig);
        if let Some(t) = timeout {
            m.attr(CTA_TIMEOUT, &t.to_be_bytes());
        }
        if let Some(on) = liberal.filter(|_| orig.proto == libc::IPPROTO_TCP as u8) {
            // struct nf_ct_tcp_flags { u8 flags; u8 mask; }
            let flags = [
                if on { TCP_FLAG_BE_LIBERAL } else { 0 },
                TCP_FLAG_BE_LIBERAL,
            ];
            m.nested(CTA_PROTOINFO, |m| {
                m.nested(CTA_PROTOINFO_TCP, |m| {
                    m.attr(CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, &flags);
                    m.attr(CTA_PROTOINFO_TCP_FLAGS_REPLY, &flags);
                });
            });
        }
        self.transact(m).map(|_| ())
    }

    /// Sets `IPS_ASSURED` on the connection with original tuple `orig`.
    /// The kernel only sets status bits from `CTA_STATUS`
    /// (`nf_ct_change_status_common`), refusing a change of the confirmed
    /// or expected bits or a cleared seen-reply: so the message carries the
    /// bits a replied, confirmed connection has.
    pub fn set_assured(&mut self, orig: &Tuple) -> io::Result<()> {
        let mut m = ct_msg(IPCTNL_MSG_CT_NEW, NLM_F_ACK, family_of(orig));
        put_tuple(&mut m, CTA_TUPLE_ORIG, orig);
        let bits = status::CONFIRMED | status::SEEN_REPLY | status::ASSURED;
        m.attr(CTA_STATUS, &bits.to_be_bytes());
        self.transact(m).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(src: [u8; 4], dst: [u8; 4], proto: u8, sport: u16, dport: u16) -> Tuple {
        Tuple {
            src: IpAddr::V4(src.into()),
            dst: IpAddr::V4(dst.into()),
            proto,
            sport,
            dport,
            icmp: None,
        }
    }

    /// A conntrack message as the kernel builds it, from the same encoder
    /// the requests use.
    fn encoded(c: &Conn) -> Vec<u8> {
        let mut m = Msg::attrs_only();
        put_tuple(&mut m, CTA_TUPLE_ORIG, &c.orig);
        put_tuple(&mut m, CTA_TUPLE_REPLY, &c.reply);
        m.attr(CTA_STATUS, &c.status.to_be_bytes());
        if let Some(t) = c.timeout {
            m.attr(CTA_TIMEOUT, &t.to_be_bytes());
        }
        m.attr(CTA_ID, &c.id.to_be_bytes());
        if c.mark != 0 {
            m.attr(CTA_MARK, &c.mark.to_be_bytes());
        }
        if let Some(s) = c.tcp_state {
            // In the kernel's order (`tcp_to_nlattr`).
            m.nested(CTA_PROTOINFO, |m| {
                m.nested(CTA_PROTOINFO_TCP, |m| {
                    m.attr(CTA_PROTOINFO_TCP_STATE, &[s]);
                    if let Some([o, r]) = c.tcp_wscale {
                        m.attr(CTA_PROTOINFO_TCP_WSCALE_ORIGINAL, &[o]);
                        m.attr(CTA_PROTOINFO_TCP_WSCALE_REPLY, &[r]);
                        let f = if c.tcp_liberal {
                            TCP_FLAG_BE_LIBERAL
                        } else {
                            0
                        };
                        m.attr(CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, &[f, 0]);
                        m.attr(CTA_PROTOINFO_TCP_FLAGS_REPLY, &[0x04, 0]);
                    }
                });
            });
        }
        m.0
    }

    #[test]
    fn conn_round_trips_through_the_attribute_encoding() {
        let c = Conn {
            id: 0xdead_beef,
            orig: tuple([192, 168, 50, 2], [203, 0, 113, 2], 6, 40000, 80),
            reply: tuple([203, 0, 113, 2], [203, 0, 113, 1], 6, 80, 40000),
            status: status::CONFIRMED | status::SEEN_REPLY | status::ASSURED,
            tcp_state: Some(tcp_state::ESTABLISHED),
            tcp_wscale: Some([7, 9]),
            timeout: Some(431_999),
            mark: 0x0100_0002,
            ..Conn::default()
        };
        assert_eq!(parse_conn(&encoded(&c)), Some(c.clone()));
        // Liberal in one direction: said so.
        let liberal = Conn {
            tcp_liberal: true,
            ..c
        };
        assert_eq!(parse_conn(&encoded(&liberal)), Some(liberal));
    }

    /// A zone of one direction (`ct original zone set 7`) comes inside
    /// that direction's tuple, not as `CTA_ZONE`: read as the
    /// connection's zone all the same (the offload refuses zones).
    #[test]
    fn a_zone_of_one_direction_is_the_connections_zone() {
        let c = Conn {
            orig: tuple([192, 168, 50, 2], [203, 0, 113, 2], 17, 5000, 53),
            reply: tuple([203, 0, 113, 2], [203, 0, 113, 1], 17, 53, 61000),
            ..Conn::default()
        };
        for zoned in [CTA_TUPLE_ORIG, CTA_TUPLE_REPLY] {
            let mut m = Msg::attrs_only();
            for (ty, t) in [(CTA_TUPLE_ORIG, &c.orig), (CTA_TUPLE_REPLY, &c.reply)] {
                m.nested(ty, |m| {
                    put_tuple_attrs(m, t);
                    if ty == zoned {
                        m.attr(CTA_TUPLE_ZONE, &7u16.to_be_bytes());
                    }
                });
            }
            m.attr(CTA_STATUS, &0u32.to_be_bytes());
            let parsed = parse_conn(&m.0).unwrap();
            assert_eq!(
                (parsed.orig, parsed.reply, parsed.zone),
                (c.orig, c.reply, 7)
            );
        }
    }

    #[test]
    fn icmp_tuple_keeps_id_type_and_code() {
        let mut t = tuple([10, 0, 0, 1], [10, 0, 0, 2], IPPROTO_ICMP, 77, 77);
        t.icmp = Some((8, 0));
        let c = Conn {
            orig: t,
            reply: Tuple {
                icmp: Some((0, 0)),
                ..tuple([10, 0, 0, 2], [10, 0, 0, 1], IPPROTO_ICMP, 77, 77)
            },
            ..Conn::default()
        };
        assert_eq!(parse_conn(&encoded(&c)), Some(c));
    }

    #[test]
    fn ipv6_tuple_round_trips() {
        let t = Tuple {
            src: "2001:db8::2".parse().unwrap(),
            dst: "2001:db8:1::2".parse().unwrap(),
            proto: 17,
            sport: 5000,
            dport: 53,
            icmp: None,
        };
        let c = Conn {
            orig: t,
            reply: Tuple {
                src: t.dst,
                dst: t.src,
                sport: t.dport,
                dport: t.sport,
                ..t
            },
            ..Conn::default()
        };
        assert_eq!(parse_conn(&encoded(&c)), Some(c));
    }

    #[test]
    fn missing_or_truncated_tuples_are_rejected() {
        let c = Conn {
            orig: tuple([1, 1, 1, 1], [2, 2, 2, 2], 17, 1, 2),
            reply: tuple([2, 2, 2, 2], [1, 1, 1, 1], 17, 2, 1),
            ..Conn::default()
        };
        let full = encoded(&c);
        // Every prefix either parses into the same entry or is refused.
        for cut in 0..full.len() {
            if let Some(p) = parse_conn(&full[..cut]) {
                assert_eq!((p.orig, p.reply), (c.orig, c.reply));
            }
        }
        let mut only_orig = Msg::attrs_only();
        put_tuple(&mut only_orig, CTA_TUPLE_ORIG, &c.orig);
        assert_eq!(parse_conn(&only_orig.0), None);
    }

    /// Runs the classic BPF `program` on the datagram `pkt` as the kernel
    /// does for a netlink socket (`net/core/filter.c`): the instructions
    /// [`event_filter`] uses, with the kernel's semantics of the netlink
    /// attribute loads (`bpf_skb_get_nlattr`, `..._nest`, over
    /// `nla_find`). Returns what the program returns (0: dropped).
    fn run_cbpf(program: &[libc::sock_filter], pkt: &[u8]) -> u32 {
        /// `nla_find`: the offset of the first attribute of type `ty` in
        /// `pkt[from..from + len]`, 0 if none.
        fn nla_find(pkt: &[u8], from: usize, len: usize, ty: u32) -> u32 {
            let end = (from + len).min(pkt.len());
            let mut at = from;
            while at + 4 <= end {
                let nla_len = usize::from(u16::from_ne_bytes([pkt[at], pkt[at + 1]]));
                let nla_type = u16::from_ne_bytes([pkt[at + 2], pkt[at + 3]]) & 0x3fff;
                if nla_len < 4 || nla_len > end - at {
                    return 0;
                }
                if u32::from(nla_type) == ty {
                    return u32::try_from(at).unwrap();
                }
                at += (nla_len + 3) & !3;
            }
            0
        }
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let len = pkt.len();
        loop {
            let i = program[pc];
            pc += 1;
            match i.code {
                LD_IMM => a = i.k,
                LDX_IMM => x = i.k,
                // Network order; out of bounds: 0 (drop).
                LD_ABS_W => match pkt.get(i.k as usize..i.k as usize + 4) {
                    Some(w) => a = u32::from_be_bytes(w.try_into().unwrap()),
                    None => return 0,
                },
                TAX => x = a,
                LD_ABS_B if i.k == AD_NLATTR => {
                    let at = a as usize;
                    a = if len < 4 || at > len - 4 {
                        0
                    } else {
                        nla_find(pkt, at, len - at, x)
                    };
                }
                LD_ABS_B if i.k == AD_NLATTR_NEST => {
                    let at = a as usize;
                    a = if len < 4 || at > len - 4 {
                        0
                    } else {
                        let nla_len = usize::from(u16::from_ne_bytes([pkt[at], pkt[at + 1]]));
                        if nla_len > len - at {
                            0
                        } else {
                            nla_find(pkt, at + 4, nla_len.saturating_sub(4), x)
                        }
                    };
                }
                // Out of bounds: the kernel's filter returns 0 (drop).
                LD_IND_B => match pkt.get((x + i.k) as usize) {
                    Some(&b) => a = b.into(),
                    None => return 0,
                },
                JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                RET_K => return i.k,
                code => panic!("instruction {code:#x} not modelled"),
            }
        }
    }

    /// An event message as the kernel sends it: `nlmsghdr`, `nfgenmsg`,
    /// the connection's attributes.
    fn event_message(ty: u16, flags: u16, c: &Conn) -> Vec<u8> {
        let mut m = ct_msg(ty, flags, 2);
        m.0.extend_from_slice(&encoded(c));
        m.finish(0)
    }

    /// The filter with the daemon's port drops the events its own requests
    /// caused (an UPDATE after its refresh carries its port) and decides
    /// the others as without it: the kernel's (port 0) and another
    /// process's (`conntrack -U`, another router-ctl).
    #[test]
    fn the_kernel_filter_drops_the_daemons_own_echoes() {
        let own = 0x8000_1234_u32;
        let with_port = event_filter(own);
        let without = event_filter(0);
        let udp = Conn {
            orig: tuple([192, 168, 50, 2], [203, 0, 113, 2], 17, 40000, 53),
            reply: tuple([203, 0, 113, 2], [203, 0, 113, 1], 17, 53, 40000),
            ..Conn::default()
        };
        let closing = Conn {
            orig: tuple([192, 168, 50, 2], [203, 0, 113, 2], 6, 40001, 80),
            reply: tuple([203, 0, 113, 2], [203, 0, 113, 1], 6, 80, 40001),
            tcp_state: Some(7), // TIME_WAIT, which the filter drops
            ..Conn::default()
        };
        for c in [&udp, &closing] {
            for port in [0, own, own + 1, 1] {
                let mut m = event_message(IPCTNL_MSG_CT_NEW, 0, c);
                m[12..16].copy_from_slice(&port.to_ne_bytes());
                let kept = run_cbpf(&with_port, &m) != 0;
                let want = port != own && run_cbpf(&without, &m) != 0;
                assert_eq!(kept, want, "port {port:#x}, {c:?}");
            }
        }
        let mut m = event_message(IPCTNL_MSG_CT_NEW, 0, &udp);
        assert!(run_cbpf(&with_port, &m) != 0, "the kernel's event kept");
        m[12..16].copy_from_slice(&own.to_ne_bytes());
        assert_eq!(run_cbpf(&with_port, &m), 0, "the daemon's own dropped");
    }

    #[test]
    fn the_kernel_filter_drops_exactly_the_events_the_daemon_ignores() {
        let program = event_filter(0);
        assert!(program.len() < 64, "{} instructions", program.len());
        let mut seen = (0, 0);
        for proto in [6, 17, 1, 132] {
            // None: an update without the TCP state (a mark, a status bit).
            for state in std::iter::once(None).chain((0..=10).map(Some)) {
                for (ty, flags) in [
                    (IPCTNL_MSG_CT_NEW, NLM_F_CREATE),
                    (IPCTNL_MSG_CT_NEW, 0),
                    (IPCTNL_MSG_CT_DELETE, 0),
                ] {
                    let c = Conn {
                        orig: tuple([192, 168, 50, 2], [203, 0, 113, 2], proto, 40000, 80),
                        reply: tuple([203, 0, 113, 2], [203, 0, 113, 1], proto, 80, 40000),
                        status: status::CONFIRMED | status::SEEN_REPLY | status::ASSURED,
                        tcp_state: state,
                        ..Conn::default()
                    };
                    let kept = run_cbpf(&program, &event_message(ty, flags, &c)) != 0;
                    assert_eq!(kept, event_needed(&c), "{proto} {state:?} {ty} {flags}");
                    if kept {
                        seen.0 += 1;
                    } else {
                        seen.1 += 1;
                    }
                }
            }
        }
        assert!(seen.0 > 0 && seen.1 > 0, "{seen:?}");
        // A TCP handshake and a closed connection's later states are
        // dropped; ESTABLISHED and the first closing states kept.
        let tcp = |s| Conn {
            orig: tuple([1, 1, 1, 1], [2, 2, 2, 2], 6, 1, 2),
            reply: tuple([2, 2, 2, 2], [1, 1, 1, 1], 6, 2, 1),
            tcp_state: Some(s),
            ..Conn::default()
        };
        let kept: Vec<u8> = (0..=9).filter(|&s| event_needed(&tcp(s))).collect();
        assert_eq!(
            kept,
            [
                tcp_state::ESTABLISHED,
                tcp_state::FIN_WAIT,
                tcp_state::CLOSE
            ]
        );
        // Truncated messages: decided without reading out of bounds.
        let full = event_message(IPCTNL_MSG_CT_NEW, 0, &tcp(2));
        for cut in 0..full.len() {
            let _ = run_cbpf(&program, &full[..cut]);
        }
    }

    #[test]
    fn events_are_told_apart_by_type_and_create_flag() {
        let c = Conn {
            orig: tuple([1, 1, 1, 1], [2, 2, 2, 2], 17, 1, 2),
            reply: tuple([2, 2, 2, 2], [1, 1, 1, 1], 17, 2, 1),
            ..Conn::default()
        };
        let mut buf = Vec::new();
        for (ty, flags) in [
            (IPCTNL_MSG_CT_NEW, NLM_F_CREATE),
            (IPCTNL_MSG_CT_NEW, 0),
            (IPCTNL_MSG_CT_DELETE, 0),
        ] {
            let mut m = ct_msg(ty, flags, 2);
            m.0.extend_from_slice(&encoded(&c));
            buf.extend_from_slice(&m.finish(0));
        }
        assert_eq!(
            parse_events(&buf),
            vec![
                Event::New(c.clone()),
                Event::Update(c.clone()),
                Event::Destroy(c)
            ]
        );
    }
}
