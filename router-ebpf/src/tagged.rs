//! Priority-tagged frames in standalone mode: an IEEE 802.1Q tag of VLAN
//! id 0 (a "priority tag": no VLAN, only the priority bits), also several,
//! and behind an 802.1ad tag of id 0.
//!
//! The fast path carries untagged frames only and passes a tagged one to
//! the kernel (`pass_not_ipv4`). The kernel takes a tag of id 0 for none:
//! it strips it, and each further tag of id 0 behind it, and receives the
//! packet as if untagged (`__netif_receive_skb_core`). In standalone mode
//! no firewall stands behind the data path, so such a packet gets the
//! judgements of the untagged passes. From the WAN
//! ([`crate::admit::unsolicited`], [`crate::v6::judge_passed`]): dropped
//! if the FIB routes it to the LAN (an unsolicited packet would reach any
//! LAN host, whose reply would then open a flow that lets the sender in:
//! RFC 6092 REC-31), unless IPv6 the untagged path lets in (a known flow's
//! reply or error, `IPsec`, a pinhole's port), which the kernel forwards as
//! it is. From the LAN, the source checks: IPv4 with the router's WAN
//! address as source, IPv6 with a source not routed back out of the LAN,
//! are dropped (BCP 38). A tag of any other id is left as it is: the
//! kernel hands it to that VLAN's device (another interface than the
//! attached ones) or drops it. (A NIC that strips tags itself, rx VLAN
//! offload, hands the program the frame untagged: it is then judged, or
//! carried, as any other.)

use aya_ebpf::{bindings::xdp_md, programs::XdpContext};
use router_common::{
    hdr::{eth, get_addr, get_u16, ipv4},
    maps::{Admit, Counter},
};

use crate::{Packed, Verdict, hop::forward_egress, maps::CONFIG, v6};

/// 802.1Q tag protocol identifier (customer VLAN).
const TPID_8021Q: u16 = 0x8100;
/// 802.1ad tag protocol identifier (service VLAN, "`QinQ`").
const TPID_8021AD: u16 = 0x88a8;
/// A tag: its protocol identifier (where an Ethernet type would be) and
/// its control information (priority, drop eligible, VLAN id).
const TAG_LEN: usize = 4;
/// The VLAN id's bits of the control information.
const VID_MASK: u16 = 0x0fff;
/// Priority tags judged in one frame; a frame with more of them (no
/// sender needs more than two) is dropped (`drop_malformed`).
const TAGS_JUDGED: usize = 4;

/// Judges the passed frame of `md` (verdict `v`, `pass_not_ipv4`) if it
/// arrived on a standalone router's attached interface with priority tags
/// only: from the WAN dropped (`drop_unsolicited` for IPv4,
/// `drop6_unsolicited` for IPv6) if the packet inside is unsolicited and
/// routed to the LAN, from the LAN (`drop_spoofed_source`,
/// `drop6_spoofed_source`) if its source is one the LAN may not use; else
/// `v`.
// A BPF subprogram of its own, called from the entry point for frames the
// cores passed as not IPv4 only. Takes the raw context and reads the
// packet bounds with volatile loads (`parse::bounds`).
#[inline(never)]
pub fn judge(md: *mut xdp_md, v: Packed) -> Packed {
    judged(md, v.unpack()).pack()
}

#[inline(always)]
fn judged(md: *mut xdp_md, v: Verdict) -> Verdict {
    let (data, end) = crate::parse::bounds(md);
    // SAFETY: `md` is the program's context: its fields are readable.
    let ifindex = unsafe { core::ptr::read_volatile(&raw const (*md).ingress_ifindex) };
    let Some(cfg) = CONFIG.get(0) else {
        return v;
    };
    let from_lan = ifindex == cfg.lan_ifindex;
    if cfg.admit != Admit::Xdp as u8 || !from_lan && ifindex != cfg.wan_ifindex {
        return v;
    }
    // The protocol identifier of the first tag, or the Ethernet type.
    let mut at = eth::ETHER_TYPE;
    for tag in 0..=TAGS_JUDGED {
        if data + at + TAG_LEN > end {
            // Cut short inside a tag: nothing the kernel takes.
            return v;
        }
        // SAFETY: within the bounds checked just above.
        let word = unsafe { &*((data + at) as *const [u8; TAG_LEN]) };
        let tpid = get_u16(word, 0);
        if tpid != TPID_8021Q && tpid != TPID_8021AD {
            break;
        }
        if get_u16(word, 2) & VID_MASK != 0 {
            // A VLAN's: its device's, or dropped.
            return v;
        }
        if tag == TAGS_JUDGED {
            // No sender stacks so many; what is inside is not read (IPv4
            // or IPv6 alike): malformed, from either side.
            return Verdict::drop(Counter::DropMalformed);
        }
        at += TAG_LEN;
    }
    if at == eth::ETHER_TYPE {
        // Untagged: not IPv4 nor IPv6 (ARP and the like).
        return v;
    }
    // SAFETY: the type's two bytes were checked with the loop's last read.
    let ether_type = get_u16(unsafe { &*((data + at) as *const [u8; 2]) }, 0);
    let l3 = at + 2;
    if from_lan {
        // The source checks of untagged LAN passes: the router's WAN
        // address (IPv4), a source not routed back out of the LAN (IPv6).
        return match ether_type {
            eth::P_IPV4 if wan_address_source(md, l3, cfg.wan_addr) => {
                Verdict::drop(Counter::DropSpoofedSource)
            }
            eth::P_IPV6 if v6::lan_source_invalid_at(md, l3) => {
                Verdict::drop(Counter::Drop6SpoofedSource)
            }
            _ => v,
        };
    }
    match ether_type {
        eth::P_IPV4 if unsolicited4(md, l3) => Verdict::drop(Counter::DropUnsolicited),
        eth::P_IPV6 if v6::unsolicited_at(md, l3) => Verdict::drop(Counter::Drop6Unsolicited),
        _ => v,
    }
}

/// Whether the IPv4 packet `l3` bytes into the frame of `md` has the WAN
/// address `wan_addr` as its source: from the LAN, one the data path did
/// not translate (it translates untagged frames only), which the kernel
/// would forward as the router's own packet (`crate::admit::unsolicited`).
#[inline(always)]
fn wan_address_source(md: *mut xdp_md, l3: usize, wan_addr: [u8; 4]) -> bool {
    let (data, end) = crate::parse::bounds(md);
    if l3 > eth::LEN + TAGS_JUDGED * TAG_LEN || data + l3 + ipv4::LEN > end {
        return false;
    }
    // SAFETY: within the bounds checked just above.
    let ip = unsafe { &*((data + l3) as *const [u8; ipv4::LEN]) };
    get_addr(ip, ipv4::SRC) == wan_addr
}

/// Whether the IPv4 packet `l3` bytes into the frame of `md` is one the
/// FIB routes to the LAN: unsolicited from the WAN, as standalone mode's
/// IPv4 replies and port forwards are addressed to the WAN address.
// A subprogram of its own: its FIB parameters stay off `judge`'s frame,
// a sibling of the IPv6 judgement's.
#[inline(never)]
fn unsolicited4(md: *mut xdp_md, l3: usize) -> bool {
    let (data, end) = crate::parse::bounds(md);
    let Some(cfg) = CONFIG.get(0) else {
        return false;
    };
    if l3 > eth::LEN + TAGS_JUDGED * TAG_LEN || data + l3 + ipv4::LEN > end {
        return false;
    }
    // SAFETY: within the bounds checked just above.
    let ip = unsafe { &*((data + l3) as *const [u8; ipv4::LEN]) };
    get_addr(ip, ipv4::DST) != cfg.wan_addr
        && forward_egress(&XdpContext::new(md), ip) == Some(cfg.lan_ifindex)
}
