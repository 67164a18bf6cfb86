//! The offload daemon's witness of the kernel's routing: a tc egress
//! program on the two attached interfaces (attached by `router-ctl run`
//! for as long as it runs, never by `attach`) that notes, for each packet
//! the kernel sends out of them, the interface, the packet's mark and the
//! next hop's MAC, under the packet's addresses and ports as it leaves
//! (after the kernel's NAT) in `EGRESS_SEEN`. The daemon offloads a UDP
//! or ICMP connection only once it saw one of its replies leave the
//! inside interface (forwarded: past the firewall's forward rules). With
//! policy routing, it offloads a connection only where the kernel's own packets of it
//! left by the interface and to the next hop the fast path's lookup
//! gives (see `router_common::maps::EGRESS_SEEN_MAP`). The fast path's
//! own frames are not seen here: a redirect from XDP skips tc egress.
//!
//! Every packet goes on unchanged (`TCX_NEXT`); what it cannot read (a
//! short or unknown frame, a later fragment, IPv6 with extension headers,
//! ICMP other than echo) it leaves unnoted: the daemon then finds no
//! record and keeps such a connection in the kernel.

use aya_ebpf::{macros::classifier, programs::TcContext};
use router_common::maps::{EgressKey, EgressSeen};

use crate::maps::EGRESS_SEEN;

/// `TCX_NEXT` (`TC_ACT_UNSPEC` for a classic tc filter): the packet goes on
/// to the next program, or the kernel's default, as it was.
const NEXT: i32 = -1;

const ETH_LEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;

#[classifier]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the #[classifier] macro passes the context by value"
)]
pub fn egress_witness(ctx: TcContext) -> i32 {
    let _ = note(&ctx);
    NEXT
}

/// The key, 8-byte aligned on the stack: the verifier refuses the
/// unaligned 8-byte stack loads LLVM otherwise makes of its byte arrays.
#[repr(C, align(8))]
struct Aligned<T>(T);

/// Notes how the kernel sends `ctx`'s packet; `None` for one it cannot
/// read or whose note failed (nothing else to do about it here). Bytes are
/// read as aligned words (`bpf_skb_load_bytes` into a `u16`, `u32` or
/// `u64` array) and stored at aligned offsets of the key and the value.
#[inline(always)]
fn note(ctx: &TcContext) -> Option<()> {
    let mut seen = Aligned(EgressSeen::default());
    let mac: [u16; 3] = ctx.load(0).ok()?;
    for (i, w) in mac.iter().enumerate() {
        seen.0.dst_mac[2 * i..2 * i + 2].copy_from_slice(&w.to_ne_bytes());
    }
    let mut key = Aligned(EgressKey::default());
    let k = &mut key.0;
    let l4 = match u16::from_be(ctx.load(12).ok()?) {
        ETH_P_IP => {
            let version_ihl: u8 = ctx.load(ETH_LEN).ok()?;
            let ihl = usize::from(version_ihl & 0x0f) * 4;
            if version_ihl >> 4 != 4 || ihl < 20 {
                return None;
            }
            // A later fragment carries no ports.
            let fragment: u16 = u16::from_be(ctx.load(ETH_LEN + 6).ok()?);
            if fragment & 0x1fff != 0 {
                return None;
            }
            k.proto = ctx.load(ETH_LEN + 9).ok()?;
            // IPv4-mapped: `::ffff:a.b.c.d`.
            k.src_addr[10] = 0xff;
            k.src_addr[11] = 0xff;
            k.dst_addr[10] = 0xff;
            k.dst_addr[11] = 0xff;
            let src: u32 = ctx.load(ETH_LEN + 12).ok()?;
            let dst: u32 = ctx.load(ETH_LEN + 16).ok()?;
            k.src_addr[12..].copy_from_slice(&src.to_ne_bytes());
            k.dst_addr[12..].copy_from_slice(&dst.to_ne_bytes());
            ETH_LEN + ihl
        }
        ETH_P_IPV6 => {
            k.proto = ctx.load(ETH_LEN + 6).ok()?;
            k.src_addr = addr16(ctx.load(ETH_LEN + 8).ok()?);
            k.dst_addr = addr16(ctx.load(ETH_LEN + 24).ok()?);
            ETH_LEN + 40
        }
        _ => return None,
    };
    (k.src_port, k.dst_port) = match k.proto {
        // TCP, UDP.
        6 | 17 => (
            u16::from_be(ctx.load(l4).ok()?),
            u16::from_be(ctx.load(l4 + 2).ok()?),
        ),
        // ICMP and ICMPv6 echo: the identifier in both ports.
        1 | 58 => {
            let ty: u8 = ctx.load(l4).ok()?;
            if !matches!((k.proto, ty), (1, 0 | 8) | (58, 128 | 129)) {
                return None;
            }
            let id = u16::from_be(ctx.load(l4 + 4).ok()?);
            (id, id)
        }
        _ => return None,
    };
    // SAFETY: the context's `__sk_buff`, valid for the program's run.
    (seen.0.ifindex, seen.0.mark) = unsafe { ((*ctx.skb.skb).ifindex, (*ctx.skb.skb).mark) };
    // Most packets find their note as it is: one lookup, no write (the
    // lookup also keeps a live connection's note in the LRU).
    // SAFETY: the value is only read, before any update of this key.
    if unsafe { EGRESS_SEEN.get(&key.0) } == Some(&seen.0) {
        return Some(());
    }
    EGRESS_SEEN.insert(&key.0, &seen.0, 0).ok()
}

/// An IPv6 address read as two words, as bytes.
#[inline(always)]
fn addr16(w: [u64; 2]) -> [u8; 16] {
    let mut a = [0; 16];
    a[..8].copy_from_slice(&w[0].to_ne_bytes());
    a[8..].copy_from_slice(&w[1].to_ne_bytes());
    a
}
