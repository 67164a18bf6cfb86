//! Interfaces: names, indexes and IPv4 addresses (libc), and a minimal
//! rtnetlink client: what an interface is (MTU, kind, veth peer) and which
//! XDP program runs on it, removing a netlink-attached XDP program
//! (`attach --force`), the namespace id of a netns fd (to find a veth's
//! peer for `doctor`), and the link notifications the daemon follows
//! (address changes, deletions). Everything runs in the calling thread's
//! network namespace.

use std::{
    ffi::{CStr, CString},
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    os::fd::{AsRawFd, OwnedFd, RawFd},
};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::nlmsg::{self, Msg, NLA_F_NESTED, NLM_F_ACK, NLM_F_DUMP, NLMSG_DONE, NLMSG_ERROR};

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// `ndm_flags`: mark the entry used, as the kernel's output path does
/// (`neigh_event_send`: a STALE entry goes to DELAY, then is probed).
const NTF_USE: u8 = 0x01;
/// `ndm_state`: valid but unconfirmed; the kernel re-validates it on its
/// next use.
pub const NUD_STALE: u16 = 0x04;
const RTM_NEWNSID: u16 = 88;
const RTM_GETNSID: u16 = 90;
const RTM_NEWQDISC: u16 = 36;
const RTM_DELQDISC: u16 = 37;
const RTM_GETQDISC: u16 = 38;
const RTM_NEWTFILTER: u16 = 44;
const RTM_DELTFILTER: u16 = 45;
const RTM_GETTFILTER: u16 = 46;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINK: u16 = 5;
const IFLA_MASTER: u16 = 10;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_DRV_PROG_ID: u16 = 5;
const IFLA_XDP_SKB_PROG_ID: u16 = 6;
const IFLA_XDP_HW_PROG_ID: u16 = 7;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_DST: u16 = 1;
const RTA_SRC: u16 = 2;
const RTA_IIF: u16 = 3;
const RTA_OIF: u16 = 4;
const RTA_MARK: u16 = 16;
const RTM_NEWRULE: u16 = 32;
const RTM_GETRULE: u16 = 34;
/// Attributes of a policy rule (`enum fib_rule_attr`) that select
/// packets: a rule with any of them routes some packets by more than
/// their destination.
const FRA_SELECTORS: &[u16] = &[
    1,  // FRA_DST
    2,  // FRA_SRC
    3,  // FRA_IIFNAME
    10, // FRA_FWMARK
    11, // FRA_FLOW
    17, // FRA_OIFNAME
    19, // FRA_L3MDEV
    20, // FRA_UID_RANGE
    22, // FRA_IP_PROTO
    23, // FRA_SPORT_RANGE
    24, // FRA_DPORT_RANGE
];
const FRA_TABLE: u16 = 15;
/// `RT_TABLE_DEFAULT`, `RT_TABLE_MAIN`, `RT_TABLE_LOCAL`.
const DEFAULT_TABLES: [u32; 3] = [253, 254, 255];
/// `FR_ACT_TO_TBL`: a rule that looks up a table.
const FR_ACT_TO_TBL: u8 = 1;
const NETNSA_NSID: u16 = 1;
const NETNSA_FD: u16 = 3;

/// `RTMGRP_LINK`: the multicast group of link notifications (`RTM_NEWLINK`
/// on any change, `RTM_DELLINK`), as an `nl_groups` bit.
const RTMGRP_LINK: u32 = 1;
/// `RTMGRP_IPV4_IFADDR` and `RTMGRP_IPV6_IFADDR`: address notifications
/// (`RTM_NEWADDR`, `RTM_DELADDR`), which say when keepalived adds or
/// removes a virtual address (see [`crate::vmac`]).
const RTMGRP_IPV4_IFADDR: u32 = 0x10;
const RTMGRP_IPV6_IFADDR: u32 = 0x100;
/// `RTMGRP_TC`: qdisc and tc filter notifications (`RTM_NEWQDISC`,
/// `RTM_DELQDISC`, `RTM_NEWTFILTER`, `RTM_DELTFILTER`), which say when
/// traffic shaping changes on an interface (see [`crate::shaping`]).
const RTMGRP_TC: u32 = 0x8;

pub const XDP_FLAGS_SKB_MODE: u32 = 2;
pub const XDP_FLAGS_DRV_MODE: u32 = 4;
pub const XDP_FLAGS_HW_MODE: u32 = 8;

/// `IFLA_XDP_ATTACHED` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum XdpAttached {
    #[default]
    None,
    Driver,
    Generic,
    Hardware,
    Multi,
}

/// The XDP programs of one interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpState {
    pub attached: XdpAttached,
    /// The program id (when exactly one program is attached).
    pub prog_id: u32,
    pub drv_prog_id: u32,
    pub skb_prog_id: u32,
    pub hw_prog_id: u32,
}

impl XdpState {
    /// Every attached program with the `XDP_FLAGS_*` of its mode.
    #[must_use]
    pub fn programs(&self) -> Vec<(u32, u32)> {
        let mut v = Vec::new();
        for (id, flag) in [
            (self.drv_prog_id, XDP_FLAGS_DRV_MODE),
            (self.skb_prog_id, XDP_FLAGS_SKB_MODE),
            (self.hw_prog_id, XDP_FLAGS_HW_MODE),
        ] {
            if id != 0 {
                v.push((id, flag));
            }
        }
        if v.is_empty() && self.prog_id != 0 {
            let flag = match self.attached {
                XdpAttached::Generic => XDP_FLAGS_SKB_MODE,
                XdpAttached::Hardware => XDP_FLAGS_HW_MODE,
                _ => XDP_FLAGS_DRV_MODE,
            };
            v.push((self.prog_id, flag));
        }
        v
    }
}

/// What rtnetlink says about an interface.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkAttrs {
    pub ifindex: u32,
    pub name: String,
    pub mtu: u32,
    /// `IFLA_INFO_KIND` (`veth`, `bridge`, `dummy`...); none for physical NICs.
    pub kind: Option<String>,
    /// `IFLA_LINK`: for a veth the peer's ifindex (in the peer's namespace).
    pub link: Option<u32>,
    /// `IFLA_LINK_NETNSID`: the peer lives in another namespace with this id.
    pub link_netnsid: Option<i32>,
    /// `IFLA_MASTER`: the bridge, bond or team this interface is a port of.
    pub master: Option<u32>,
    pub xdp: XdpState,
    /// `IFF_UP`.
    pub up: bool,
    /// `IFLA_ADDRESS` when it is a 6-byte (Ethernet) hardware address.
    pub mac: Option<[u8; 6]>,
}

struct Socket(OwnedFd);

impl Socket {
    fn new() -> io::Result<Self> {
        Self::of(libc::NETLINK_ROUTE)
    }

    /// A request socket of netlink `protocol`.
    fn of(protocol: i32) -> io::Result<Self> {
        // Requests only (no multicast group), blocking with a timeout.
        let s = Self(nlmsg::bound_socket(protocol, 0, false)?);
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: valid option buffer of the right size.
        unsafe {
            libc::setsockopt(
                s.fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                u32::try_from(size_of::<libc::timeval>()).unwrap_or(16),
            );
        }
        Ok(s)
    }

    fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Sends one request and returns the payloads (after the nlmsghdr) of
    /// the replies of type `want`, until an ack, an error or DONE.
    fn request(&self, msg: &[u8], want: u16) -> io::Result<Vec<Vec<u8>>> {
        // SAFETY: msg is a valid buffer; the kernel is the default peer.
        let n = unsafe { libc::send(self.fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            // SAFETY: buf is writable for its length.
            let n = unsafe { libc::recv(self.fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = usize::try_from(n).unwrap_or(0);
            let mut off = 0;
            while off + 16 <= n {
                let len =
                    u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap_or([0; 4])) as usize;
                let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
                if len < 16 || off + len > n {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "truncated netlink message",
                    ));
                }
                let payload = &buf[off + 16..off + len];
                match ty {
                    NLMSG_ERROR => {
                        let code = i32::from_ne_bytes(payload[0..4].try_into().unwrap_or([0; 4]));
                        if code == 0 {
                            return Ok(out);
                        }
                        return Err(io::Error::from_raw_os_error(-code));
                    }
                    NLMSG_DONE => return Ok(out),
                    t if t == want => {
                        out.push(payload.to_vec());
                        // A non-dump request gets exactly one answer (and
                        // an ack only if asked for).
                        if msg_flags(msg) & (NLM_F_ACK | NLM_F_DUMP) == 0 {
                            return Ok(out);
                        }
                    }
                    _ => {}
                }
                off += (len + 3) & !3;
            }
        }
    }
}

fn msg_flags(msg: &[u8]) -> u16 {
    u16::from_ne_bytes([msg[6], msg[7]])
}

/// The payload of a nested attribute holding `attrs`.
fn nested(attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut m = Msg::attrs_only();
    for (t, d) in attrs {
        m.attr(*t, d);
    }
    m.0
}

/// The attributes in `data` as (type without flags, payload).
fn attrs(data: &[u8]) -> Vec<(u16, &[u8])> {
    nlmsg::attrs(data).collect()
}

fn u32_of(d: &[u8]) -> u32 {
    d.get(0..4)
        .map_or(0, |b| u32::from_ne_bytes(b.try_into().unwrap_or([0; 4])))
}

fn str_of(d: &[u8]) -> String {
    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
    String::from_utf8_lossy(&d[..end]).into_owned()
}

fn ifinfomsg(ifindex: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[0] = 0; // AF_UNSPEC
    m[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    m
}

/// Parses an `RTM_NEWLINK` payload.
fn parse_link(payload: &[u8]) -> LinkAttrs {
    let mut l = LinkAttrs {
        ifindex: u32_of(&payload[4..8]),
        up: u32_of(&payload[8..12]) & 1 != 0,
        ..LinkAttrs::default()
    };
    for (ty, d) in attrs(&payload[16..]) {
        match ty {
            IFLA_ADDRESS => l.mac = <[u8; 6]>::try_from(d).ok(),
            IFLA_IFNAME => l.name = str_of(d),
            IFLA_MTU => l.mtu = u32_of(d),
            IFLA_LINK => l.link = Some(u32_of(d)),
            IFLA_LINK_NETNSID => l.link_netnsid = Some(u32_of(d).cast_signed()),
            IFLA_MASTER => l.master = Some(u32_of(d)),
            IFLA_LINKINFO => {
                for (t, v) in attrs(d) {
                    if t == IFLA_INFO_KIND {
                        l.kind = Some(str_of(v));
                    }
                }
            }
            IFLA_XDP => {
                for (t, v) in attrs(d) {
                    match t {
                        IFLA_XDP_ATTACHED => {
                            l.xdp.attached = match v.first() {
                                Some(1) => XdpAttached::Driver,
                                Some(2) => XdpAttached::Generic,
                                Some(3) => XdpAttached::Hardware,
                                Some(4) => XdpAttached::Multi,
                                _ => XdpAttached::None,
                            };
                        }
                        IFLA_XDP_PROG_ID => l.xdp.prog_id = u32_of(v),
                        IFLA_XDP_DRV_PROG_ID => l.xdp.drv_prog_id = u32_of(v),
                        IFLA_XDP_SKB_PROG_ID => l.xdp.skb_prog_id = u32_of(v),
                        IFLA_XDP_HW_PROG_ID => l.xdp.hw_prog_id = u32_of(v),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    l
}

/// A change of an interface, as rtnetlink announces it to `RTMGRP_LINK`
/// and the address groups.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// `RTM_NEWLINK`: created or changed (address, flags, MTU, XDP...), with
    /// all its attributes as they are now.
    Changed(LinkAttrs),
    /// `RTM_DELLINK`: deleted, or moved to another namespace.
    Deleted { ifindex: u32, name: String },
    /// `RTM_NEWADDR` or `RTM_DELADDR`: an IP address of interface
    /// `ifindex` was added or removed.
    Address { ifindex: u32 },
    /// A qdisc or tc filter of interface `ifindex` was added, changed or
    /// removed.
    Tc { ifindex: u32 },
}

/// The link and address notifications in one datagram of a
/// [`LinkEvents`] socket; other messages and truncated ones are skipped.
#[must_use]
pub fn parse_link_events(buf: &[u8]) -> Vec<LinkEvent> {
    nlmsg::messages(buf)
        .filter_map(|(ty, _, p)| match ty {
            RTM_NEWLINK if p.len() >= 16 => Some(LinkEvent::Changed(parse_link(p))),
            RTM_DELLINK if p.len() >= 16 => {
                let l = parse_link(p);
                Some(LinkEvent::Deleted {
                    ifindex: l.ifindex,
                    name: l.name,
                })
            }
            // struct ifaddrmsg: family, prefix length, flags, scope, index.
            RTM_NEWADDR | RTM_DELADDR if p.len() >= 8 => Some(LinkEvent::Address {
                ifindex: u32_of(&p[4..8]),
            }),
            // struct tcmsg: family, padding, index, handle, parent, info.
            RTM_NEWQDISC | RTM_DELQDISC | RTM_NEWTFILTER | RTM_DELTFILTER if p.len() >= 20 => {
                Some(LinkEvent::Tc {
                    ifindex: u32_of(&p[4..8]),
                })
            }
            _ => None,
        })
        .collect()
}

/// A non-blocking rtnetlink socket subscribed to link and address
/// notifications.
pub struct LinkEvents(OwnedFd);

impl LinkEvents {
    pub fn subscribe() -> io::Result<Self> {
        let groups = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_TC;
        nlmsg::bound_socket(libc::NETLINK_ROUTE, groups, true).map(Self)
    }

    /// The notifications of one queued datagram: `Ok(None)` when none is
    /// queued; `ENOBUFS` when the kernel dropped some (read the links
    /// again).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<Vec<LinkEvent>>> {
        Ok(nlmsg::recv(self.0.as_raw_fd(), buf)?.map(|n| parse_link_events(&buf[..n])))
    }
}

impl AsRawFd for LinkEvents {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Every interface of the current namespace (an `RTM_GETLINK` dump).
pub fn links() -> io::Result<Vec<LinkAttrs>> {
    let s = Socket::new()?;
    let msg = Msg::new(RTM_GETLINK, NLM_F_DUMP, &ifinfomsg(0)).finish(1);
    Ok(s.request(&msg, RTM_NEWLINK)?
        .iter()
        .filter(|p| p.len() >= 16)
        .map(|p| parse_link(p))
        .collect())
}

/// Parses an `RTM_NEWADDR` payload: the index of the address's interface
/// (`struct ifaddrmsg`: family, prefix length, flags, scope, index) and
/// the address; `None` for another family or a truncated message.
fn parse_addr(payload: &[u8]) -> Option<(u32, IpAddr)> {
    let family = i32::from(*payload.first()?);
    let ifindex = u32_of(payload.get(4..8)?);
    let (mut address, mut local) = (None, None);
    for (t, d) in attrs(payload.get(8..)?) {
        match t {
            IFA_ADDRESS => address = Some(d),
            IFA_LOCAL => local = Some(d),
            _ => {}
        }
    }
    // rtnetlink(7): IFA_LOCAL is the interface's own address; IFA_ADDRESS
    // is the peer's on a point-to-point link, the own one otherwise.
    let d = local.or(address)?;
    match family {
        libc::AF_INET => Some(IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(d.get(..4)?).ok()?,
        ))),
        libc::AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(d.get(..16)?).ok()?,
        ))),
        _ => None,
    }
    .map(|a| (ifindex, a))
}

/// Every IPv4 and IPv6 address of the current namespace with its
/// interface's index (an `RTM_GETADDR` dump). By index, not by name: an
/// IPv4 address's name in `getifaddrs` is its label (keepalived's
/// `label vrrp.61:vip`), not its interface's.
pub fn addrs_by_ifindex() -> io::Result<Vec<(u32, IpAddr)>> {
    let s = Socket::new()?;
    // struct ifaddrmsg, family AF_UNSPEC: every family.
    let msg = Msg::new(RTM_GETADDR, NLM_F_DUMP, &[0u8; 8]).finish(1);
    Ok(s.request(&msg, RTM_NEWADDR)?
        .iter()
        .filter_map(|p| parse_addr(p))
        .collect())
}

/// The attributes of interface `ifindex` in the current namespace.
pub fn link(ifindex: u32) -> io::Result<LinkAttrs> {
    let s = Socket::new()?;
    let msg = Msg::new(RTM_GETLINK, 0, &ifinfomsg(ifindex)).finish(1);
    let replies = s.request(&msg, RTM_NEWLINK)?;
    replies
        .first()
        .filter(|p| p.len() >= 16)
        .map(|p| parse_link(p))
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no RTM_NEWLINK reply"))
}

/// Removes the netlink-attached XDP program of mode `flags` from `ifindex`.
pub fn xdp_detach(ifindex: u32, flags: u32) -> io::Result<()> {
    let s = Socket::new()?;
    let mut m = Msg::new(RTM_SETLINK, NLM_F_ACK, &ifinfomsg(ifindex));
    let xdp = nested(&[
        (IFLA_XDP_FD, (-1i32).to_ne_bytes().to_vec()),
        (IFLA_XDP_FLAGS, flags.to_ne_bytes().to_vec()),
    ]);
    m.attr(IFLA_XDP | NLA_F_NESTED, &xdp);
    s.request(&m.finish(1), 0).map(|_| ())
}

/// The interface the kernel routes packets to `dst` out of (`lo` for the
/// router's own addresses), or `None` when it has no route.
pub fn route_oif(dst: IpAddr) -> io::Result<Option<u32>> {
    Ok(route_get(None, dst, None)?.map(|r| r.oif))
}

/// A forwarded packet as the kernel routes it: the fields of its input
/// route lookup (`ip route get DST from SRC iif IIF mark MARK ipproto P
/// sport S dport D`), which policy rules select by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouteQuery {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub iif: u32,
    pub mark: u32,
    pub proto: u8,
    /// Source and destination port (TCP and UDP): `None` leaves them out
    /// (as the data path's FIB lookup does).
    pub ports: Option<(u16, u16)>,
}

/// Where a route sends a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteAnswer {
    pub oif: u32,
    /// `RTA_GATEWAY`: the next hop; `None` on a link route.
    pub gateway: Option<IpAddr>,
}

/// The route the kernel forwards the packet `q` by (its input route
/// lookup, with the policy rules). `None` when it has no route, or would
/// not forward the packet (a source its reverse-path filter refuses, a
/// blackhole, unreachable or prohibit route, forwarding off).
pub fn route_forward(q: &RouteQuery) -> io::Result<Option<RouteAnswer>> {
    route_get(Some(q.src), q.dst, Some(q))
}

fn addr_octets(a: IpAddr) -> Vec<u8> {
    match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// An `RTM_GETROUTE` request's answer.
fn route_get(
    src: Option<IpAddr>,
    dst: IpAddr,
    input: Option<&RouteQuery>,
) -> io::Result<Option<RouteAnswer>> {
    const RTA_GATEWAY: u16 = 5;
    const RTA_IP_PROTO: u16 = 27;
    const RTA_SPORT: u16 = 28;
    const RTA_DPORT: u16 = 29;
    let s = Socket::new()?;
    // AF_INET, AF_INET6 as the one byte rtmsg holds.
    let family = if dst.is_ipv4() { 2u8 } else { 10u8 };
    let addr = addr_octets(dst);
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope,
    // type, flags (u32).
    let mut rtm = [0u8; 12];
    rtm[0] = family;
    rtm[1] = (addr.len() * 8) as u8;
    if let Some(src) = src {
        rtm[2] = (addr_octets(src).len() * 8) as u8;
    }
    let mut m = Msg::new(RTM_GETROUTE, 0, &rtm);
    m.attr(RTA_DST, &addr);
    if let Some(src) = src {
        m.attr(RTA_SRC, &addr_octets(src));
    }
    if let Some(q) = input {
        m.attr(RTA_IIF, &q.iif.to_ne_bytes());
        m.attr(RTA_MARK, &q.mark.to_ne_bytes());
        m.attr(RTA_IP_PROTO, &[q.proto]);
        if let Some((sport, dport)) = q.ports {
            m.attr(RTA_SPORT, &sport.to_be_bytes());
            m.attr(RTA_DPORT, &dport.to_be_bytes());
        }
    }
    match s.request(&m.finish(1), RTM_NEWROUTE) {
        Ok(replies) => Ok(replies.first().and_then(|p| {
            let mut answer = RouteAnswer {
                oif: 0,
                gateway: None,
            };
            let mut found = false;
            for (t, d) in attrs(p.get(12..)?) {
                match t {
                    RTA_OIF => {
                        answer.oif = u32_of(d);
                        found = true;
                    }
                    RTA_GATEWAY => {
                        answer.gateway = match d.len() {
                            4 => Some(IpAddr::from(<[u8; 4]>::try_from(d).ok()?)),
                            16 => Some(IpAddr::from(<[u8; 16]>::try_from(d).ok()?)),
                            _ => None,
                        };
                    }
                    _ => {}
                }
            }
            found.then_some(answer)
        })),
        // No route; an input lookup also: a source the reverse-path filter
        // refuses or a blackhole route (EINVAL), forwarding off or an
        // unreachable route (EHOSTUNREACH), a prohibit route (EACCES).
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(
                    libc::ENETUNREACH
                        | libc::EHOSTUNREACH
                        | libc::EXDEV
                        | libc::EINVAL
                        | libc::EACCES
                        | libc::EPERM
                )
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The policy rules of `family` (`AF_INET`, `AF_INET6`): whether some
/// route packets by more than their destination (a rule other than the
/// kernel's own, to the local, main and default tables and selecting
/// nothing, that looks up a table: multi-WAN, VPN split routing,
/// `wg-quick`, Tailscale; not one that only refuses, as `OpenWrt`'s
/// `unreachable` rule), and a hash of them all, which changes with them.
pub fn policy_rules(family: u8) -> io::Result<(bool, u64)> {
    use std::hash::{Hash as _, Hasher as _};
    let rules = rules(family)?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    rules.hash(&mut h);
    Ok((rules.iter().any(|p| !kernel_default_rule(p)), h.finish()))
}

/// One entry of the kernel's neighbour table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour {
    pub ifindex: u32,
    pub addr: IpAddr,
    /// `NUD_*`.
    pub state: u16,
    /// Kept by something else than the kernel's own resolution: learned
    /// from a controller (`NTF_EXT_LEARNED`) or managed (`NTF_MANAGED`,
    /// `NDA_FLAGS_EXT`), which the kernel keeps resolved itself.
    pub kept_elsewhere: bool,
    /// `NDA_LLADDR`: its MAC, where known (an INCOMPLETE or FAILED entry
    /// has none).
    pub mac: Option<[u8; 6]>,
}

/// `ndm_flags`: learned from outside the kernel (a controller, a switch).
const NTF_EXT_LEARNED: u8 = 0x10;
/// `NDA_FLAGS_EXT`: the extended flags (`NTF_EXT_MANAGED`, ...).
const NDA_FLAGS_EXT: u16 = 15;

/// The kernel's IPv4 and IPv6 neighbour entries.
pub fn neighbours() -> io::Result<Vec<Neighbour>> {
    neighbours_on(&Socket::new()?)
}

fn neighbours_on(s: &Socket) -> io::Result<Vec<Neighbour>> {
    let mut out = Vec::new();
    for family in [libc::AF_INET, libc::AF_INET6] {
        // struct ndmsg: family, pad (3), ifindex (i32), state (u16),
        // flags, type.
        let mut ndm = [0u8; 12];
        ndm[0] = u8::try_from(family).unwrap_or(0);
        let msg = Msg::new(RTM_GETNEIGH, NLM_F_DUMP, &ndm).finish(1);
        out.extend(
            s.request(&msg, RTM_NEWNEIGH)?
                .iter()
                .filter_map(|p| parse_neighbour(p)),
        );
    }
    Ok(out)
}

fn parse_neighbour(p: &[u8]) -> Option<Neighbour> {
    let ndm = p.get(..12)?;
    let ifindex = u32::from_ne_bytes(ndm[4..8].try_into().ok()?);
    let state = u16::from_ne_bytes(ndm[8..10].try_into().ok()?);
    let a = attrs(&p[12..]);
    let addr = a
        .iter()
        .find(|&&(ty, _)| ty == NDA_DST)
        .and_then(|&(_, d)| match d.len() {
            4 => Some(IpAddr::from(<[u8; 4]>::try_from(d).ok()?)),
            16 => Some(IpAddr::from(<[u8; 16]>::try_from(d).ok()?)),
            _ => None,
        })?;
    let flags_ext = a
        .iter()
        .find(|&&(ty, _)| ty == NDA_FLAGS_EXT)
        .map_or(0, |&(_, d)| u32_of(d));
    let mac = a
        .iter()
        .find(|&&(ty, _)| ty == NDA_LLADDR)
        .and_then(|&(_, d)| <[u8; 6]>::try_from(d).ok());
    Some(Neighbour {
        ifindex,
        addr,
        state,
        kept_elsewhere: ndm[10] & NTF_EXT_LEARNED != 0 || flags_ext != 0,
        mac,
    })
}

/// Has the kernel use those of the neighbour entries `wanted` that are
/// STALE and kept by the kernel's own resolution (one dump, then `NTF_USE`
/// on one socket), as its own output path does on a packet to one: DELAY,
/// a unicast probe, a new resolution if that fails. The result of each
/// entry used. Entries in any other state are left alone: a permanent
/// one would turn dynamic, a learned or managed one lose its flag.
pub fn use_stale_neighbours(wanted: &[(u32, IpAddr)]) -> io::Result<Vec<io::Result<()>>> {
    let s = Socket::new()?;
    let stale: std::collections::HashSet<(u32, IpAddr)> = neighbours_on(&s)?
        .into_iter()
        .filter(|n| n.state == NUD_STALE && !n.kept_elsewhere)
        .map(|n| (n.ifindex, n.addr))
        .collect();
    let entries: Vec<(u32, IpAddr)> = wanted
        .iter()
        .copied()
        .filter(|n| stale.contains(n))
        .collect();
    Ok(entries
        .iter()
        .map(|&(ifindex, addr)| {
            let mut ndm = [0u8; 12];
            let (family, octets) = match addr {
                IpAddr::V4(a) => (libc::AF_INET, a.octets().to_vec()),
                IpAddr::V6(a) => (libc::AF_INET6, a.octets().to_vec()),
            };
            ndm[0] = u8::try_from(family).unwrap_or(0);
            ndm[4..8].copy_from_slice(&ifindex.to_ne_bytes());
            ndm[10] = NTF_USE;
            let mut m = Msg::new(RTM_NEWNEIGH, NLM_F_ACK, &ndm);
            m.attr(NDA_DST, &octets);
            s.request(&m.finish(1), 0).map(|_| ())
        })
        .collect())
}

/// The `RTM_NEWRULE` payloads of a dump of `family`'s policy rules.
fn rules(family: u8) -> io::Result<Vec<Vec<u8>>> {
    let s = Socket::new()?;
    // struct fib_rule_hdr: family, dst_len, src_len, tos, table, res1,
    // res2, action, flags (u32).
    let mut hdr = [0u8; 12];
    hdr[0] = family;
    let msg = Msg::new(RTM_GETRULE, NLM_F_DUMP, &hdr).finish(1);
    s.request(&msg, RTM_NEWRULE)
}

/// Selectors of a policy rule that the data path's FIB lookup does not
/// carry (it passes source, destination, incoming interface, protocol and
/// TOS): mark, ports, user, outgoing interface.
const FRA_BEYOND_FIB: &[u16] = &[
    10, // FRA_FWMARK
    17, // FRA_OIFNAME
    20, // FRA_UID_RANGE
    23, // FRA_SPORT_RANGE
    24, // FRA_DPORT_RANGE
];

/// How many policy rules of `family` look up a table for packets selected
/// by what the data path's FIB lookup does not carry ([`FRA_BEYOND_FIB`]).
pub fn rules_beyond_fib(family: u8) -> io::Result<usize> {
    Ok(rules(family)?
        .iter()
        .filter(|p| {
            p.get(7) == Some(&FR_ACT_TO_TBL)
                && attrs(p.get(12..).unwrap_or_default())
                    .iter()
                    .any(|(t, _)| FRA_BEYOND_FIB.contains(t))
        })
        .count())
}

/// Whether the `RTM_NEWRULE` payload `p` is one of the rules the kernel
/// starts with (to a default table, selecting nothing), or one that does
/// not send a packet to a table (`unreachable`, `prohibit`, `blackhole`,
/// `nop`: the kernel refuses or skips, routes nothing elsewhere).
fn kernel_default_rule(p: &[u8]) -> bool {
    let Some(hdr) = p.get(..12) else {
        return true;
    };
    if hdr[7] != FR_ACT_TO_TBL {
        return true;
    }
    let mut table = u32::from(hdr[4]);
    for (t, d) in attrs(&p[12..]) {
        if FRA_SELECTORS.contains(&t) {
            return false;
        }
        if t == FRA_TABLE {
            table = u32_of(d);
        }
    }
    hdr[1] == 0 && hdr[2] == 0 && hdr[3] == 0 && DEFAULT_TABLES.contains(&table)
}

/// The `IPsec` policies of the current namespace: the payloads of an
/// `XFRM_MSG_GETPOLICY` dump (`NETLINK_XFRM`), each a `struct
/// xfrm_userpolicy_info` and attributes (see [`crate::xfrm`]).
pub fn xfrm_policies() -> io::Result<Vec<Vec<u8>>> {
    const XFRM_MSG_NEWPOLICY: u16 = 0x13;
    const XFRM_MSG_GETPOLICY: u16 = 0x15;
    let s = Socket::of(libc::NETLINK_XFRM)?;
    let msg = Msg::new(XFRM_MSG_GETPOLICY, NLM_F_DUMP, &[]).finish(1);
    s.request(&msg, XFRM_MSG_NEWPOLICY)
}

/// The kernel's default `IPsec` policies (`XFRM_MSG_GETDEFAULT`): `struct
/// xfrm_userpolicy_default`'s in, fwd and out (0 unset, 1 block, 2
/// accept); `None` without an answer.
pub fn xfrm_defaults() -> io::Result<Option<[u8; 3]>> {
    const XFRM_MSG_GETDEFAULT: u16 = 0x28;
    let s = Socket::of(libc::NETLINK_XFRM)?;
    let msg = Msg::new(XFRM_MSG_GETDEFAULT, 0, &[0; 4]).finish(1);
    Ok(s.request(&msg, XFRM_MSG_GETDEFAULT)?
        .first()
        .and_then(|p| p.get(..3))
        .map(|d| [d[0], d[1], d[2]]))
}

/// A queueing discipline or a tc filter (`struct tcmsg` and `TCA_KIND`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcObject {
    pub ifindex: u32,
    pub handle: u32,
    pub parent: u32,
    /// `htb`, `cake`, `ingress`, `clsact`; of a filter, its classifier
    /// (`u32`, `bpf`).
    pub kind: String,
    /// The kind's own attributes (`TCA_OPTIONS`), as they came.
    pub options: Vec<u8>,
}

/// Parses an `RTM_NEWQDISC` / `RTM_NEWTFILTER` payload: `struct tcmsg`
/// (family, padding, ifindex, handle, parent, info) and its attributes.
fn parse_tc(payload: &[u8]) -> Option<TcObject> {
    let (mut kind, mut options) = (String::new(), Vec::new());
    for (t, d) in attrs(payload.get(20..)?) {
        match t {
            TCA_KIND => kind = str_of(d),
            TCA_OPTIONS => options = d.to_vec(),
            _ => {}
        }
    }
    Some(TcObject {
        ifindex: u32_of(payload.get(4..8)?),
        handle: u32_of(payload.get(8..12)?),
        parent: u32_of(payload.get(12..16)?),
        kind,
        options,
    })
}

fn tcmsg(ifindex: u32, parent: u32) -> [u8; 20] {
    let mut m = [0u8; 20];
    m[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    m[12..16].copy_from_slice(&parent.to_ne_bytes());
    m
}

/// The qdiscs of interface `ifindex` (root and children, ingress and
/// clsact; an `RTM_GETQDISC` dump, which lists every interface's: the
/// others are dropped here).
pub fn qdiscs(ifindex: u32) -> io::Result<Vec<TcObject>> {
    let s = Socket::new()?;
    let msg = Msg::new(RTM_GETQDISC, NLM_F_DUMP, &tcmsg(0, 0)).finish(1);
    Ok(s.request(&msg, RTM_NEWQDISC)?
        .iter()
        .filter_map(|p| parse_tc(p))
        .filter(|q| q.ifindex == ifindex)
        .collect())
}

/// The tc filters of interface `ifindex` under `parent` (an
/// `RTM_GETTFILTER` dump; `0xffff_fff2`: the ingress hook of an `ingress`
/// or `clsact` qdisc, `0xffff_fff3`: clsact's egress hook). A classifier
/// answers with a message per filter and one for itself, so this counts
/// messages, not rules; none when there is no such qdisc (the kernel
/// answers an empty dump). A shared block's filters are listed too.
pub fn filters(ifindex: u32, parent: u32) -> io::Result<Vec<TcObject>> {
    let s = Socket::new()?;
    let msg = Msg::new(RTM_GETTFILTER, NLM_F_DUMP, &tcmsg(ifindex, parent)).finish(1);
    Ok(s.request(&msg, RTM_NEWTFILTER)?
        .iter()
        .filter_map(|p| parse_tc(p))
        .collect())
}

/// The id the current namespace gives to the namespace of `netns_fd`, if
/// it has assigned one.
pub fn nsid_of(netns_fd: RawFd) -> io::Result<Option<i32>> {
    let s = Socket::new()?;
    let mut m = Msg::new(RTM_GETNSID, 0, &[0u8; 4]);
    m.attr(
        NETNSA_FD,
        &u32::try_from(netns_fd).unwrap_or(0).to_ne_bytes(),
    );
    let replies = s.request(&m.finish(1), RTM_NEWNSID)?;
    Ok(replies.first().and_then(|p| {
        attrs(p.get(4..)?)
            .into_iter()
            .find(|(t, _)| *t == NETNSA_NSID)
            .map(|(_, d)| u32_of(d).cast_signed())
            .filter(|&id| id >= 0)
    }))
}

/// The index of interface `name`.
pub fn ifindex(name: &str) -> Result<u32> {
    let c = CString::new(name).map_err(|_| anyhow!("bad interface name {name:?}"))?;
    // SAFETY: c is NUL-terminated.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        bail!(
            "no such interface {name:?} ({})",
            crate::ctx::ip_link_hint()
        );
    }
    Ok(idx)
}

/// The Ethernet address of interface `name` (`ifindex` its index), which
/// the data path compares frames' destinations with. An interface without
/// one of its own is refused as [`Unretryable`](crate::lifecycle::Unretryable):
/// it will not get one.
pub fn mac(name: &str, ifindex: u32) -> Result<[u8; 6]> {
    let attrs = link(ifindex).with_context(|| format!("reading the link of {name}"))?;
    match attrs.mac {
        // The loopback interface's (a typo for the LAN or WAN, say): no
        // host sends to it, and XDP on it would only take the router's own
        // traffic.
        Some([0, 0, 0, 0, 0, 0]) => Err(crate::lifecycle::Unretryable(format!(
            "{name} has no Ethernet address of its own (00:00:00:00:00:00: the loopback \
             interface?): the XDP router forwards between Ethernet interfaces; give the LAN \
             and WAN interfaces (`ip link`)"
        ))
        .into()),
        Some(m) => Ok(m),
        None => Err(crate::lifecycle::Unretryable(format!(
            "{name} has no Ethernet address (`ip link show {name}`): the XDP router forwards \
             Ethernet frames only; attach it to Ethernet interfaces"
        ))
        .into()),
    }
}

/// `aa:bb:cc:dd:ee:ff`, as `ip link` shows a MAC address.
#[must_use]
pub fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The name of interface `idx`, if it exists.
#[must_use]
pub fn ifname(idx: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes.
    let p = unsafe { libc::if_indextoname(idx, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// The IPv4 addresses of `iface` in the current network namespace, in the
/// kernel's order (primary addresses first); by index, so a labelled
/// address (`ip addr add ... label wan0:1`) counts for its interface.
pub fn ipv4_addrs(iface: &str) -> Result<Vec<Ipv4Addr>> {
    let index = ifindex(iface)?;
    Ok(addrs_by_ifindex()
        .context("listing interface addresses (rtnetlink)")?
        .into_iter()
        .filter(|(i, _)| *i == index)
        .filter_map(|(_, a)| match a {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `RTM_NEWNEIGH` payload: `struct ndmsg` and its attributes.
    fn neighbour_message(state: u16, flags: u8, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut p = vec![0u8; 12];
        p[0] = 2;
        p[4..8].copy_from_slice(&3u32.to_ne_bytes());
        p[8..10].copy_from_slice(&state.to_ne_bytes());
        p[10] = flags;
        for (ty, data) in attrs {
            let len = u16::try_from(4 + data.len()).unwrap();
            p.extend_from_slice(&len.to_ne_bytes());
            p.extend_from_slice(&ty.to_ne_bytes());
            p.extend_from_slice(data);
            p.resize(p.len().next_multiple_of(4), 0);
        }
        p
    }

    #[test]
    fn a_neighbour_entry_gives_its_address_state_mac_and_keeper() {
        let mac = [2, 0, 0x5e, 0x10, 0xbe, 0xf1];
        let n = parse_neighbour(&neighbour_message(
            NUD_STALE,
            0,
            &[(NDA_DST, &[203, 0, 113, 2]), (NDA_LLADDR, &mac)],
        ))
        .unwrap();
        assert_eq!(
            n,
            Neighbour {
                ifindex: 3,
                addr: IpAddr::from([203, 0, 113, 2]),
                state: NUD_STALE,
                kept_elsewhere: false,
                mac: Some(mac),
            }
        );
        // Still resolving: no MAC; learned from a controller.
        let n = parse_neighbour(&neighbour_message(
            1,
            NTF_EXT_LEARNED,
            &[(NDA_DST, &[203, 0, 113, 3])],
        ))
        .unwrap();
        assert_eq!((n.mac, n.kept_elsewhere), (None, true));
        // Managed (`NDA_FLAGS_EXT`).
        let n = parse_neighbour(&neighbour_message(
            NUD_STALE,
            0,
            &[
                (NDA_DST, &[203, 0, 113, 4]),
                (NDA_FLAGS_EXT, &1u32.to_ne_bytes()),
            ],
        ))
        .unwrap();
        assert!(n.kept_elsewhere);
        // No destination: not an entry the daemon can name.
        assert_eq!(parse_neighbour(&neighbour_message(NUD_STALE, 0, &[])), None);
    }

    #[test]
    fn loopback_is_up_with_no_xdp() {
        let lo = link(1).expect("RTM_GETLINK for lo");
        assert_eq!(lo.name, "lo");
        assert!(lo.mtu > 0);
        assert_eq!(lo.xdp.attached, XdpAttached::None);
        assert!(lo.xdp.programs().is_empty());
        assert_eq!(
            lo.mac,
            Some([0; 6]),
            "lo's hardware address is 6 zero bytes"
        );
    }

    #[test]
    fn only_a_six_byte_hardware_address_is_a_mac() {
        let payload = |addr: &[u8]| {
            let mut p = vec![0u8; 16];
            p.extend(nested(&[(IFLA_ADDRESS, addr.to_vec())]));
            p
        };
        let mac = [0x02, 0, 0, 0, 0, 0x01];
        assert_eq!(parse_link(&payload(&mac)).mac, Some(mac));
        // An IPIP tunnel's "hardware address" is its IPv4 address.
        assert_eq!(parse_link(&payload(&[192, 0, 2, 1])).mac, None);
        assert_eq!(mac_str(mac), "02:00:00:00:00:01");
    }

    /// `RTM_NEWLINK` and `RTM_DELLINK` as the kernel sends them to
    /// `RTMGRP_LINK` (`rtnl_fill_ifinfo`: an `ifinfomsg`, then
    /// `IFLA_IFNAME`, `IFLA_MTU`, ..., `IFLA_ADDRESS`), two in one datagram.
    #[test]
    fn link_notifications_are_parsed_as_the_kernel_sends_them() {
        let notification = |ty: u16, ifindex: u32, mac: [u8; 6]| {
            // struct ifinfomsg: family, pad, type (ARPHRD_ETHER), index,
            // flags (IFF_UP | IFF_BROADCAST | IFF_RUNNING | IFF_MULTICAST),
            // change.
            let mut ifi = [0u8; 16];
            ifi[2..4].copy_from_slice(&1u16.to_ne_bytes());
            ifi[4..8].copy_from_slice(&ifindex.to_ne_bytes());
            ifi[8..12].copy_from_slice(&0x1043u32.to_ne_bytes());
            let mut m = Msg::new(ty, 0, &ifi);
            m.attr(IFLA_IFNAME, b"lan0\0");
            m.attr(IFLA_MTU, &1500u32.to_ne_bytes());
            m.nested(IFLA_LINKINFO, |m| m.attr(IFLA_INFO_KIND, b"veth\0"));
            m.attr(IFLA_ADDRESS, &mac);
            m.attr(2 /* IFLA_BROADCAST */, &[0xff; 6]);
            m.finish(0)
        };
        let new_mac = [0x02, 0, 0x5e, 0x10, 0xbe, 0xef];
        let mut buf = notification(RTM_NEWLINK, 7, new_mac);
        buf.extend(notification(RTM_DELLINK, 7, new_mac));
        // A notification of another kind in the same group is skipped.
        buf.extend(Msg::new(RTM_NEWROUTE, 0, &[0u8; 12]).finish(0));
        let events = parse_link_events(&buf);
        assert_eq!(events.len(), 2, "{events:?}");
        let LinkEvent::Changed(l) = &events[0] else {
            panic!("{events:?}");
        };
        assert_eq!((l.ifindex, l.name.as_str()), (7, "lan0"));
        assert_eq!(l.mac, Some(new_mac));
        assert!(l.up);
        assert_eq!(l.kind.as_deref(), Some("veth"));
        assert_eq!(
            events[1],
            LinkEvent::Deleted {
                ifindex: 7,
                name: "lan0".into()
            }
        );
        // Truncated after the header: nothing.
        assert!(parse_link_events(&buf[..20]).is_empty());
    }

    /// `RTM_NEWADDR` and `RTM_DELADDR` as the kernel sends them to the
    /// address groups (`inet_fill_ifaddr`: an `ifaddrmsg`, then
    /// `IFA_ADDRESS`, `IFA_LOCAL`, `IFA_LABEL`...), as keepalived's virtual
    /// address on its macvlan comes and goes.
    #[test]
    fn address_notifications_name_their_interface() {
        let notification = |ty: u16, ifindex: u32| {
            // struct ifaddrmsg: family AF_INET, prefix length 24, flags
            // IFA_F_PERMANENT, scope universe, index.
            let mut ifa = [0u8; 8];
            ifa[0] = 2;
            ifa[1] = 24;
            ifa[2] = 0x80;
            ifa[4..8].copy_from_slice(&ifindex.to_ne_bytes());
            let mut m = Msg::new(ty, 0, &ifa);
            m.attr(1 /* IFA_ADDRESS */, &[192, 168, 70, 1]);
            m.attr(2 /* IFA_LOCAL */, &[192, 168, 70, 1]);
            m.attr(3 /* IFA_LABEL */, b"vrrp.51\0");
            m.finish(0)
        };
        let mut buf = notification(RTM_NEWADDR, 9);
        buf.extend(notification(RTM_DELADDR, 9));
        assert_eq!(
            parse_link_events(&buf),
            [
                LinkEvent::Address { ifindex: 9 },
                LinkEvent::Address { ifindex: 9 }
            ]
        );
        // Shorter than an ifaddrmsg: skipped.
        let short = Msg::new(RTM_NEWADDR, 0, &[2, 24, 0, 0]).finish(0);
        assert!(parse_link_events(&short).is_empty());
    }

    /// Qdisc and filter notifications (`tc_fill_qdisc`, `tcf_fill_node`: a
    /// `tcmsg`, then `TCA_KIND`...) name their interface; the same
    /// messages as dump replies parse into [`TcObject`]s.
    #[test]
    fn tc_notifications_name_their_interface() {
        let notification = |ty: u16, ifindex: u32, kind: &[u8]| {
            let mut m = Msg::new(ty, 0, &tcmsg(ifindex, 0xffff_ffff));
            m.attr(TCA_KIND, kind);
            m.finish(0)
        };
        let mut buf = notification(RTM_NEWQDISC, 4, b"htb\0");
        buf.extend(notification(RTM_DELTFILTER, 5, b"u32\0"));
        assert_eq!(
            parse_link_events(&buf),
            [LinkEvent::Tc { ifindex: 4 }, LinkEvent::Tc { ifindex: 5 }]
        );
        let payload = &notification(RTM_NEWQDISC, 4, b"htb\0")[16..];
        assert_eq!(
            parse_tc(payload),
            Some(TcObject {
                ifindex: 4,
                handle: 0,
                parent: 0xffff_ffff,
                kind: "htb".into(),
                options: Vec::new(),
            })
        );
        // Shorter than a tcmsg: skipped.
        let short = Msg::new(RTM_NEWQDISC, 0, &[0; 8]).finish(0);
        assert!(parse_link_events(&short).is_empty());
        assert_eq!(parse_tc(&[0; 8]), None);
    }

    /// The dump's replies as the kernel sends them: an IPv4 address with a
    /// label other than its interface's name (keepalived's `label
    /// vrrp.61:vip`) belongs to the interface of its index.
    #[test]
    fn addresses_are_parsed_with_their_interface_index_whatever_their_label() {
        let reply = |family: u8, ifindex: u32, attrs: &[(u16, &[u8])]| {
            let mut ifa = [0u8; 8];
            ifa[0] = family;
            ifa[1] = 24;
            ifa[4..8].copy_from_slice(&ifindex.to_ne_bytes());
            let mut m = Msg::new(RTM_NEWADDR, 0, &ifa);
            for (t, d) in attrs {
                m.attr(*t, d);
            }
            m.finish(0)[16..].to_vec()
        };
        let labelled = reply(
            2,
            9,
            &[
                (IFA_ADDRESS, &[192, 168, 70, 1]),
                (IFA_LOCAL, &[192, 168, 70, 1]),
                (3 /* IFA_LABEL */, b"vrrp.61:vip\0"),
            ],
        );
        assert_eq!(
            parse_addr(&labelled),
            Some((9, IpAddr::V4(Ipv4Addr::new(192, 168, 70, 1))))
        );
        // Point-to-point: IFA_ADDRESS is the peer's.
        let ptp = reply(
            2,
            4,
            &[(IFA_ADDRESS, &[10, 0, 0, 2]), (IFA_LOCAL, &[10, 0, 0, 1])],
        );
        assert_eq!(
            parse_addr(&ptp),
            Some((4, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))))
        );
        let v6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
        assert_eq!(
            parse_addr(&reply(10, 6, &[(IFA_ADDRESS, &v6.octets())])),
            Some((6, IpAddr::V6(v6)))
        );
        // Another family, no address, truncated: none.
        assert_eq!(parse_addr(&reply(17, 6, &[(IFA_ADDRESS, &[1; 6])])), None);
        assert_eq!(parse_addr(&reply(2, 6, &[])), None);
        assert_eq!(parse_addr(&reply(2, 6, &[(IFA_LOCAL, &[10, 0])])), None);
        assert_eq!(parse_addr(&[2, 24, 0, 0]), None);
    }

    #[test]
    fn the_address_dump_lists_loopbacks_address() {
        let all = addrs_by_ifindex().expect("RTM_GETADDR dump");
        assert!(
            all.contains(&(1, IpAddr::V4(Ipv4Addr::LOCALHOST))),
            "{all:?}"
        );
    }

    #[test]
    fn the_link_dump_lists_loopback() {
        let all = links().expect("RTM_GETLINK dump");
        assert!(
            all.iter().any(|l| l.ifindex == 1 && l.name == "lo"),
            "{all:?}"
        );
    }

    #[test]
    fn loopback_address_routes_out_of_lo() {
        let oif = route_oif(std::net::Ipv4Addr::LOCALHOST.into()).expect("RTM_GETROUTE");
        assert_eq!(oif, Some(1));
    }

    #[test]
    fn attributes_round_trip() {
        let data = nested(&[
            (IFLA_MTU, 1500u32.to_ne_bytes().to_vec()),
            (IFLA_IFNAME, b"eth0\0".to_vec()),
        ]);
        let a = attrs(&data);
        assert_eq!(a.len(), 2);
        assert_eq!(u32_of(a[0].1), 1500);
        assert_eq!(str_of(a[1].1), "eth0");
    }

    #[test]
    fn xdp_programs_by_mode() {
        let s = XdpState {
            attached: XdpAttached::Generic,
            prog_id: 7,
            ..XdpState::default()
        };
        assert_eq!(s.programs(), vec![(7, XDP_FLAGS_SKB_MODE)]);
        let m = XdpState {
            attached: XdpAttached::Multi,
            drv_prog_id: 3,
            skb_prog_id: 4,
            ..XdpState::default()
        };
        assert_eq!(
            m.programs(),
            vec![(3, XDP_FLAGS_DRV_MODE), (4, XDP_FLAGS_SKB_MODE)]
        );
    }
}
