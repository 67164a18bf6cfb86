//! The kernel's `IPsec` policies (xfrm), which the fast path does not apply:
//! `bpf_fib_lookup` and a redirect never consult them, so a flow that the
//! kernel would encrypt (an `out` policy), hold for want of a security
//! association, or accept only decrypted (`in`, `fwd`) would leave or
//! arrive in clear on the fast path. The offload daemon leaves every
//! connection a policy's selector covers to the kernel (`ipsec_policy`),
//! and ends offloaded ones that a new policy covers; `doctor` reports the
//! policies (`ipsec`); standalone mode, which admits flows itself, does
//! not check them (see README).

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
}

impl Selector {
    /// Parses an `XFRM_MSG_NEWPOLICY` payload; `None` if it is short or a
    /// socket policy.
    #[must_use]
    pub fn parse(p: &[u8]) -> Option<Self> {
        if p.len() < USERPOLICY_INFO_LEN || p[DIR] >= DATABASE_DIRS {
            return None;
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
        })
    }

    /// Whether a packet from `src` to `dst` of protocol `proto` is
    /// selected.
    #[must_use]
    pub fn selects(&self, src: IpAddr, dst: IpAddr, proto: u8) -> bool {
        if self.v6.is_some_and(|v6| v6 != src.is_ipv6()) || self.proto != 0 && self.proto != proto {
            return false;
        }
        in_prefix(src, &self.src, self.src_len) && in_prefix(dst, &self.dst, self.dst_len)
    }
}

/// Whether `a` is in the prefix `net/len` (an IPv4 address in the first
/// four bytes of `net`).
fn in_prefix(a: IpAddr, net: &[u8; 16], len: u8) -> bool {
    let bytes: Vec<u8> = match a {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
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
/// original tuple `orig` and reply tuple `reply`, as the kernel sees it
/// before, between and after its address translations, either way.
#[must_use]
pub fn covers(policies: &[Selector], orig: &Tuple, reply: &Tuple) -> bool {
    let pairs = [
        (orig.src, orig.dst),
        (orig.src, reply.src),
        (reply.dst, reply.src),
        (reply.src, reply.dst),
        (reply.src, orig.src),
        (orig.dst, orig.src),
    ];
    policies
        .iter()
        .any(|p| pairs.iter().any(|&(s, d)| p.selects(s, d, orig.proto)))
}

/// The policies of the current namespace's database.
pub fn policies() -> io::Result<Vec<Selector>> {
    Ok(netlink::xfrm_policies()?
        .iter()
        .filter_map(|p| Selector::parse(p))
        .collect())
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
        assert!(covers(std::slice::from_ref(&site), &inner.0, &inner.1));
        // The reply direction's own packet matches a fwd policy the other
        // way round.
        let fwd = Selector::parse(&policy([10, 0, 0, 0], 24, [192, 168, 50, 0], 24, 2)).unwrap();
        assert!(covers(&[fwd], &inner.0, &inner.1));
        let masq = (
            tuple([192, 168, 50, 2], [198, 51, 100, 9]),
            tuple([198, 51, 100, 9], [203, 0, 113, 1]),
        );
        assert!(!covers(&[site], &masq.0, &masq.1));
        let wan_addr =
            Selector::parse(&policy([203, 0, 113, 1], 32, [198, 51, 100, 0], 24, 1)).unwrap();
        assert!(covers(&[wan_addr], &masq.0, &masq.1));
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
