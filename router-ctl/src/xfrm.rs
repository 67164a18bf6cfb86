//! The kernel's `IPsec` policies (xfrm), which the fast path does not apply:
//! `bpf_fib_lookup` and a redirect never consult them, so a flow that the
//! kernel would encrypt (an `out` policy), hold for want of a security
//! association, or accept only decrypted (`in`, `fwd`) would leave or
//! arrive in clear on the fast path. The offload daemon leaves every
//! connection a policy's selector covers to the kernel (`ipsec_policy`),
//! and ends offloaded ones that a new policy covers; `doctor` reports the
//! policies (`ipsec`); standalone mode, which admits flows itself, does
//! not check them (see docs/offload.md).

use std::{io, net::IpAddr};

use crate::{ctnetlink::Tuple, netlink};

/// `XFRM_POLICY_IN`, `XFRM_POLICY_OUT`, `XFRM_POLICY_FWD`: the directions
/// of the policy database (socket policies come after them).
const DATABASE_DIRS: u8 = 3;
/// `sizeof(struct xfrm_userpolicy_info)`.
const USERPOLICY_INFO_LEN: usize = 168;
/// Offsets in it: the selector (`struct xfrm_selector`) first, the
/// direction after the lifetimes, priority and index.
const SEL_DADDR: usize = 0;
const SEL_SADDR: usize = 16;
const SEL_FAMILY: usize = 40;
const SEL_PREFIXLEN_D: usize = 42;
const SEL_PREFIXLEN_S: usize = 43;
const SEL_PROTO: usize = 44;
const DIR: usize = 160;
/// `XFRMA_MARK` (`struct xfrm_mark { v, m }`): the policy selects packets
/// whose mark masked by `m` is `v` (a VTI's key).
const XFRMA_MARK: u16 = 21;
/// `XFRMA_IF_ID`: the policy belongs to an xfrm interface.
const XFRMA_IF_ID: u16 = 31;
/// `XFRM_USERPOLICY_BLOCK` in `struct xfrm_userpolicy_default`.
const DEFAULT_BLOCK: u8 = 1;

/// What one policy selects: packets from `src/src_len` to `dst/dst_len`
/// of protocol `proto` (0: any); ports are not compared (a wider match
/// leaves more to the kernel, never less).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector {
    /// `None`: any family (`AF_UNSPEC`).
    pub v6: Option<bool>,
    pub src: [u8; 16],
    pub src_len: u8,
    pub dst: [u8; 16],
    pub dst_len: u8,
    pub proto: u8,
    pub dir: u8,
    /// `(value, mask)`: only packets whose mark masked is the value
    /// (`(0, 0)`: any).
    pub mark: (u32, u32),
}

impl Selector {
    /// Parses an `XFRM_MSG_NEWPOLICY` payload; `None` if it is short, a
    /// socket policy, or an xfrm interface's (route-based `IPsec`: its
    /// traffic is routed into that interface, which the daemon's routing
    /// check already leaves to the kernel).
    #[must_use]
    pub fn parse(p: &[u8]) -> Option<Self> {
        if p.len() < USERPOLICY_INFO_LEN || p[DIR] >= DATABASE_DIRS {
            return None;
        }
        let mut mark = (0, 0);
        for (t, d) in crate::nlmsg::attrs(&p[USERPOLICY_INFO_LEN..]) {
            let word = |o: usize| {
                d.get(o..o + 4)
                    .map_or(0, |b| u32::from_ne_bytes(b.try_into().unwrap_or([0; 4])))
            };
            match t {
                XFRMA_IF_ID if word(0) != 0 => return None,
                XFRMA_MARK => mark = (word(0), word(4)),
                _ => {}
            }
        }
        let family = u16::from_ne_bytes([p[SEL_FAMILY], p[SEL_FAMILY + 1]]);
        let addr = |o: usize| -> [u8; 16] { p[o..o + 16].try_into().unwrap_or([0; 16]) };
        Some(Self {
            v6: match i32::from(family) {
                libc::AF_INET => Some(false),
                libc::AF_INET6 => Some(true),
                _ => None,
            },
            src: addr(SEL_SADDR),
            src_len: p[SEL_PREFIXLEN_S],
            dst: addr(SEL_DADDR),
            dst_len: p[SEL_PREFIXLEN_D],
            proto: p[SEL_PROTO],
            dir: p[DIR],
            mark,
        })
    }

    /// A policy that selects every packet: the kernel's default policy
    /// blocking what no policy allows.
    #[must_use]
    pub const fn everything(dir: u8) -> Self {
        Self {
            v6: None,
            src: [0; 16],
            src_len: 0,
            dst: [0; 16],
            dst_len: 0,
            proto: 0,
            dir,
            mark: (0, 0),
        }
    }

    /// Whether a packet from `src` to `dst` of protocol `proto` with the
    /// mark `mark` is selected.
    #[must_use]
    pub fn selects(&self, src: IpAddr, dst: IpAddr, proto: u8, mark: u32) -> bool {
        if self.v6.is_some_and(|v6| v6 != src.is_ipv6())
            || self.proto != 0 && self.proto != proto
            || mark & self.mark.1 != self.mark.0
        {
            return false;
        }
        in_prefix(src, &self.src, self.src_len) && in_prefix(dst, &self.dst, self.dst_len)
    }
}

/// Whether `a` is in the prefix `net/len` (an IPv4 address in the first
/// four bytes of `net`).
fn in_prefix(a: IpAddr, net: &[u8; 16], len: u8) -> bool {
    let (v4, v6);
    let bytes: &[u8] = match a {
        IpAddr::V4(a) => {
            v4 = a.octets();
            &v4
        }
        IpAddr::V6(a) => {
            v6 = a.octets();
            &v6
        }
    };
    let len = usize::from(len).min(bytes.len() * 8);
    let (whole, rest) = (len / 8, len % 8);
    if bytes[..whole] != net[..whole] {
        return false;
    }
    rest == 0 || {
        let mask = 0xffu8 << (8 - rest);
        bytes[whole] & mask == net[whole] & mask
    }
}

/// Whether a policy of `policies` selects a packet of the connection with
/// original tuple `orig`, reply tuple `reply` and ct mark `mark` (which
/// such setups copy into the packets), as the kernel sees it before,
/// between and after its address translations, either way.
#[must_use]
pub fn covers(policies: &[Selector], orig: &Tuple, reply: &Tuple, mark: u32) -> bool {
    let pairs = [
        (orig.src, orig.dst),
        (orig.src, reply.src),
        (reply.dst, reply.src),
        (reply.src, reply.dst),
        (reply.src, orig.src),
        (orig.dst, orig.src),
    ];
    policies.iter().any(|p| {
        pairs
            .iter()
            .any(|&(s, d)| p.selects(s, d, orig.proto, mark))
    })
}

/// The policies of the current namespace's database, and a policy that
/// selects everything for a default policy that blocks forwarded or
/// outgoing packets no policy allows (`ip xfrm policy setdefault`: the
/// kernel drops them; the fast path would carry them).
pub fn policies() -> io::Result<Vec<Selector>> {
    let mut all: Vec<Selector> = netlink::xfrm_policies()?
        .iter()
        .filter_map(|p| Selector::parse(p))
        .collect();
    // struct xfrm_userpolicy_default: in, fwd, out. A kernel before 5.16
    // has no defaults (refuses the request): none then.
    if let Ok(Some([_, fwd, out])) = netlink::xfrm_defaults() {
        for (dir, default) in [(2, fwd), (1, out)] {
            if default == DEFAULT_BLOCK {
                all.push(Selector::everything(dir));
            }
        }
    }
    Ok(all)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(src: [u8; 4], src_len: u8, dst: [u8; 4], dst_len: u8, dir: u8) -> Vec<u8> {
        let mut p = vec![0u8; USERPOLICY_INFO_LEN];
        p[SEL_DADDR..SEL_DADDR + 4].copy_from_slice(&dst);
        p[SEL_SADDR..SEL_SADDR + 4].copy_from_slice(&src);
        p[SEL_FAMILY..SEL_FAMILY + 2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        p[SEL_PREFIXLEN_D] = dst_len;
        p[SEL_PREFIXLEN_S] = src_len;
        p[DIR] = dir;
        p
    }

    fn tuple(src: [u8; 4], dst: [u8; 4]) -> Tuple {
        Tuple {
            src: IpAddr::from(src),
            dst: IpAddr::from(dst),
            proto: 17,
            sport: 40000,
            dport: 53,
            icmp: None,
        }
    }

    /// A site-to-site policy (LAN /24 to a remote /24) covers a LAN host's
    /// untranslated flow there, both ways, and not a masqueraded flow
    /// elsewhere; a policy on the router's own WAN address (a tunnel's
    /// outer packets) covers the masqueraded flows it translates to; a
    /// socket policy is not the database's.
    #[test]
    fn selectors_cover_the_flows_they_select_before_and_after_nat() {
        let site = Selector::parse(&policy([192, 168, 50, 0], 24, [10, 0, 0, 0], 24, 1)).unwrap();
        let inner = (
            tuple([192, 168, 50, 2], [10, 0, 0, 7]),
            tuple([10, 0, 0, 7], [192, 168, 50, 2]),
        );
        assert!(covers(std::slice::from_ref(&site), &inner.0, &inner.1, 0));
        // The reply direction's own packet matches a fwd policy the other
        // way round.
        let fwd = Selector::parse(&policy([10, 0, 0, 0], 24, [192, 168, 50, 0], 24, 2)).unwrap();
        assert!(covers(&[fwd], &inner.0, &inner.1, 0));
        let masq = (
            tuple([192, 168, 50, 2], [198, 51, 100, 9]),
            tuple([198, 51, 100, 9], [203, 0, 113, 1]),
        );
        assert!(!covers(std::slice::from_ref(&site), &masq.0, &masq.1, 0));
        let wan_addr =
            Selector::parse(&policy([203, 0, 113, 1], 32, [198, 51, 100, 0], 24, 1)).unwrap();
        assert!(covers(&[wan_addr], &masq.0, &masq.1, 0));
        // A VTI's policy selects the packets its key marks; an xfrm
        // interface's policy is that interface's; a blocking default
        // selects everything.
        let mut vti = policy([0; 4], 0, [0; 4], 0, 1);
        let mut m = crate::nlmsg::Msg::attrs_only();
        m.attr(
            XFRMA_MARK,
            &[5u32.to_ne_bytes(), u32::MAX.to_ne_bytes()].concat(),
        );
        vti.extend(m.0);
        let vti = Selector::parse(&vti).unwrap();
        assert!(!covers(std::slice::from_ref(&vti), &masq.0, &masq.1, 0));
        assert!(covers(std::slice::from_ref(&vti), &masq.0, &masq.1, 5));
        let mut xfrmi = policy([0; 4], 0, [0; 4], 0, 1);
        let mut m = crate::nlmsg::Msg::attrs_only();
        m.attr(XFRMA_IF_ID, &7u32.to_ne_bytes());
        xfrmi.extend(m.0);
        assert_eq!(Selector::parse(&xfrmi), None);
        assert!(covers(&[Selector::everything(2)], &masq.0, &masq.1, 0));
        let socket = policy([0; 4], 0, [0; 4], 0, 3 + 1);
        assert_eq!(Selector::parse(&socket), None);
        assert_eq!(Selector::parse(&[0; 20]), None);
        // Prefix lengths that do not end on a byte.
        assert!(in_prefix(
            IpAddr::from([10, 0, 0, 130]),
            &[10, 0, 0, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            25
        ));
        assert!(!in_prefix(
            IpAddr::from([10, 0, 0, 127]),
            &[10, 0, 0, 128, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            25
        ));
    }
}
