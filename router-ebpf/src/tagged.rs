//! Priority-tagged frames: an IEEE 802.1Q tag of VLAN id 0 (a "priority
//! tag": no VLAN, only the priority bits), also several, and behind an
//! 802.1ad tag of id 0. Some access networks tag every frame so, some
//! hosts' priority settings tag some of them.
//!
//! The kernel takes a tag of id 0 for none: it strips it, and each further
//! tag of id 0 behind it, ignores the priority, and receives the packet as
//! if untagged (`__netif_receive_skb_core`). The data path does the same
//! before its cores ([`strip_priority_tags`]): the MAC addresses move up
//! over the tags (`bpf_xdp_adjust_head`), and the packet is carried,
//! judged or passed as the untagged frame the kernel would take it for.
//! So a flow's tagged packet stays in its flow: passed as it came, in
//! standalone mode it would meet no flow in the kernel, which would answer
//! a reply as the endpoint (a TCP RST, an ICMP port unreachable) and send
//! a LAN packet out through its own NAT with another port (RFC 4787 REQ-1:
//! one mapping per session). Frames leave untagged, as the kernel sends
//! them from the attached interface.
//!
//! A tag of any other id is left as it is: the kernel hands it to that
//! VLAN's device (another interface than the attached ones) or drops it.
//! More than [`TAGS_STRIPPED`] priority tags: no sender stacks so many;
//! standalone mode drops the frame (`drop_malformed`: the kernel would
//! strip them all and forward what is inside with no firewall behind the
//! data path), offload mode leaves it to the kernel and its firewall. (A
//! NIC that strips tags itself, rx VLAN offload, hands the program the
//! frame untagged.)

use aya_ebpf::{bindings::xdp_md, helpers::bpf_xdp_adjust_head};
use router_common::{
    hdr::{eth, get_u16},
    maps::{Admit, Counter},
};

use crate::{Packed, Step, Verdict, maps::CONFIG};

/// 802.1Q tag protocol identifier (customer VLAN).
const TPID_8021Q: u16 = 0x8100;
/// 802.1ad tag protocol identifier (service VLAN, "`QinQ`").
const TPID_8021AD: u16 = 0x88a8;
/// A tag: its protocol identifier (where an Ethernet type would be) and
/// its control information (priority, drop eligible, VLAN id).
const TAG_LEN: usize = 4;
/// The VLAN id's bits of the control information.
const VID_MASK: u16 = 0x0fff;
/// Priority tags stripped from one frame.
const TAGS_STRIPPED: usize = 4;

/// Whether Ethernet type `ether_type` is a tag's protocol identifier.
#[inline(always)]
const fn is_tag(ether_type: u16) -> bool {
    ether_type == TPID_8021Q || ether_type == TPID_8021AD
}

/// The program's first step: the priority tags of the frame of `md`
/// taken off ([`strip_priority_tags`]), or the verdict of a tagged frame
/// left as it is. An untagged frame goes on at the cost of one test.
///
/// A stripped frame leaves this step with the same bounds check behind it
/// as an untagged one (its Ethernet header), so both reach the core in one
/// state, which the verifier walks once: without it, the untagged frame's
/// pointers came with the check and the stripped one's without, and the
/// verifier walked the whole core again for the stripped one, past its
/// budget.
#[inline(always)]
pub fn untag(md: *mut xdp_md) -> Step<()> {
    let (data, end) = crate::parse::bounds(md);
    if data + eth::LEN > end {
        // The core's own header read decides (truncated).
        return Ok(());
    }
    // SAFETY: within the bounds checked just above.
    let l2 = unsafe { &*(data as *const [u8; eth::LEN]) };
    if !is_tag(get_u16(l2, eth::ETHER_TYPE)) {
        return Ok(());
    }
    core::hint::cold_path();
    let v = strip_priority_tags(md);
    if !v.goes_on() {
        return Err(v.unpack());
    }
    let (data, end) = crate::parse::bounds(md);
    if data + eth::LEN > end {
        // (Not after a strip: it leaves more than the header.)
        return Err(Verdict::drop(Counter::DropTruncated));
    }
    Ok(())
}

/// Takes the priority tags off the frame of `md`, whose Ethernet type is
/// a tag's: [`Packed::GO_ON`], after which every packet
/// pointer must be read again from the context; else the verdict of a
/// frame left as it is: `pass_not_ipv4` (a VLAN's, cut short inside a
/// tag), or with too many tags `drop_malformed` in standalone mode.
// A BPF subprogram of its own, called from [`untag`] for tagged frames
// only. Takes the raw context and reads the packet bounds with volatile
// loads (`parse::bounds`).
#[inline(never)]
pub fn strip_priority_tags(md: *mut xdp_md) -> Packed {
    let pass = Verdict::pass(Counter::PassNotIpv4).pack();
    let (data, end) = crate::parse::bounds(md);
    // The protocol identifier of the first tag, then of each after it.
    let mut at = eth::ETHER_TYPE;
    for tag in 0..=TAGS_STRIPPED {
        if data + at + TAG_LEN > end {
            // Cut short inside a tag (or no room for an Ethernet type and
            // two bytes behind the last one): nothing the kernel takes.
            return pass;
        }
        // SAFETY: within the bounds checked just above.
        let word = unsafe { &*((data + at) as *const [u8; TAG_LEN]) };
        if !is_tag(get_u16(word, 0)) {
            break;
        }
        if get_u16(word, 2) & VID_MASK != 0 {
            // A VLAN's: its device's, or dropped.
            return pass;
        }
        if tag == TAGS_STRIPPED {
            let standalone = CONFIG.get(0).is_some_and(|c| c.admit == Admit::Xdp as u8);
            return if standalone {
                Verdict::drop(Counter::DropMalformed).pack()
            } else {
                pass
            };
        }
        at += TAG_LEN;
    }
    let tags = at - eth::ETHER_TYPE;
    // The MAC addresses, in registers: 8 and 4 bytes.
    // SAFETY: the loop read `at` + 4 > 12 bytes within the bounds.
    let (macs, macs_end) = unsafe {
        (
            core::ptr::read_unaligned(data as *const u64),
            core::ptr::read_unaligned((data + 8) as *const u32),
        )
    };
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        reason = "at most TAGS_STRIPPED tags: 16 bytes"
    )]
    // SAFETY: a helper call on the program's context; a failed one leaves
    // the frame as it was.
    if unsafe { bpf_xdp_adjust_head(md, tags as i32) } != 0 {
        return pass;
    }
    let (data, end) = crate::parse::bounds(md);
    if data + eth::ETHER_TYPE > end {
        return pass;
    }
    // SAFETY: within the bounds checked just above.
    unsafe {
        core::ptr::write_unaligned(data as *mut u64, macs);
        core::ptr::write_unaligned((data + 8) as *mut u32, macs_end);
    }
    Packed::GO_ON
}
