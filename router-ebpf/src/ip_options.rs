//! IPv4 packets with options (IHL > 5) of the flows the data path carries,
//! either direction.
//!
//! The core parses option-less headers only (every offset fixed) and
//! passes the rest. A flow's packet with options passed so would leave the
//! flow: from the LAN through the kernel's slow-path NAT with another
//! external port; from the WAN, addressed to the WAN address, to the
//! router's own stack, which knows nothing of the data path's flows and
//! answers as the endpoint (a TCP RST the remote accepts). Here such a
//! packet is translated through its flow like a hit (the L4 header at the
//! offset the IHL gives) and forwarded with its options as they are: not
//! processed (a record-route or timestamp option gets no entry of this
//! hop), as many routers forward them (RFC 7126 4.3 ff. lets a router
//! ignore such options); the header checksum, which covers them, is
//! updated for the changed words only.
//!
//! Dropped as malformed (`drop_malformed`), as the core drops such a
//! packet without options: a TCP, UDP or ICMP packet too short for its
//! header, a TCP data offset below the header or past the packet (unless
//! its options already left it to the kernel, below).
//!
//! Left to the kernel (`pass_ip_options`): a header with TTL <= 1, a wrong
//! checksum or the fragment bits set, a source route (loose or strict,
//! LSRR or SSRR: the kernel drops it unless `accept_source_route` says
//! otherwise, as RFC 7126 4.3 and 4.4 advise; forwarded here it would
//! bypass that), an option whose length is wrong, a record route or
//! timestamp whose pointer lies before its data (Linux answers those with
//! a Parameter Problem; one with no room left for its entry is still
//! forwarded), or a list of more than six options, packets of no flow the
//! data path carries, an offloaded flow's, a next hop the FIB refuses
//! (with its reason) or without a neighbour.

use aya_ebpf::{macros::map, maps::PerCpuArray, programs::XdpContext};
use router_common::{
    checksum,
    hdr::{eth, frame, get_u16, icmp, ipv4, tcp, udp},
    maps::{Counter, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, VMAC_IPV4},
    nat::{rewrite_addrs, rewrite_icmp_echo, rewrite_tcp, rewrite_udp},
};

use crate::{
    Packed, Step, Verdict,
    flow::{self, StackKey},
    hop::{self, FibParams, Hop, forward_l2},
    parse::{self, header, ptr_at},
};

/// What [`forward`]'s two steps hand on, off the stack: the translation,
/// the L4 header's offset and the FIB parameters.
#[repr(C)]
struct Scratch {
    fib: FibParams,
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    /// The L4 header's offset in the frame.
    l4: u32,
}

#[map(name = "OPTIONS_SCRATCH")]
static OPTIONS_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// The verdict of a packet this path does not carry: the kernel's.
const NOT_CARRIED: Verdict = Verdict::pass(Counter::PassIpOptions);

/// What [`translate`] returns when the scratch slot holds the packet's
/// translation (no other step passes with this counter).
const TRANSLATED: Verdict = Verdict::pass(Counter::FwdIpOptions);

/// Forwards the IPv4 packet with options of `ctx` (the core's
/// `pass_ip_options` verdict) if it belongs to a flow the data path
/// carries; else passes it with a reason.
// BPF subprograms, called from the entry point for such packets only:
// their frames stay off the entry point's (call chains at the verifier's
// 512 bytes), and the two steps are siblings.
#[inline(never)]
pub fn forward(ctx: &XdpContext) -> Packed {
    let v = translate(ctx);
    if v.unpack().counter != TRANSLATED.counter {
        return v;
    }
    send(ctx)
}

/// The packet's flow translation into the scratch slot ([`TRANSLATED`]),
/// if the data path carries its flow.
#[inline(never)]
fn translate(ctx: &XdpContext) -> Packed {
    match try_translate(ctx) {
        Ok(()) => TRANSLATED,
        Err(v) => v,
    }
    .pack()
}

#[inline(always)]
fn try_translate(ctx: &XdpContext) -> Step<()> {
    let eth: &[u8; eth::LEN] = header(ctx, 0)?;
    let ip: &[u8; ipv4::LEN] = header(ctx, frame::IPV4)?;
    let side = parse::ingress(ctx).ok_or(NOT_CARRIED)?;
    parse::addressed_to_us(ctx, eth, side, VMAC_IPV4)?;
    // The core judged the header as far as the options (`classify_ipv4`:
    // version, IHL within the total length, total length within the
    // frame); the rest of its checks here.
    let hlen = usize::from(ip[ipv4::VERSION_IHL] & 0x0f) * 4;
    if ip[ipv4::TTL] <= 1
        || get_u16(ip, ipv4::FRAG_OFF) & ipv4::FRAG_MF_AND_OFFSET != 0
        || !header_checksum_ok(ctx, hlen)
        || !plain_options(ctx, hlen)
    {
        return Err(NOT_CARRIED);
    }
    let total_len = usize::from(get_u16(ip, ipv4::TOT_LEN));
    let l4 = frame::IPV4 + hlen;
    let proto = ip[ipv4::PROTO];
    let need = if proto == IPPROTO_TCP {
        tcp::LEN
    } else {
        udp::LEN
    };
    // Malformed as the core judges an option-less packet
    // (docs/architecture.md "Per packet" step 1): too short for its L4 header, or a TCP data offset
    // below the header or past the packet.
    let malformed = Verdict::drop(Counter::DropMalformed);
    if total_len < hlen + need {
        return Err(
            if matches!(proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_ICMP) {
                malformed
            } else {
                NOT_CARRIED
            },
        );
    }
    if proto == IPPROTO_TCP {
        let t: &[u8; tcp::LEN] = header(ctx, l4)?;
        let data_off = usize::from(t[tcp::DATA_OFF] >> 4) * 4;
        if data_off < tcp::LEN || data_off > total_len - hlen {
            return Err(malformed);
        }
        // No SYN, FIN or RST: such a packet changes no TCP state here, so
        // those go to the kernel.
        if parse::tcp_control(ctx, l4)? {
            return Err(NOT_CARRIED);
        }
    }
    let (sport, dport) = parse::ports(ctx, ip, l4, side.from_lan)?.ok_or(NOT_CARRIED)?;
    let key = StackKey::of(ip, sport, dport);
    let (e, now) = flow::own_hit(&key.0, side).ok_or(NOT_CARRIED)?;
    // SAFETY: map value pointer from the lookup, valid for this run.
    let entry = unsafe { &mut *e };
    flow::off_path_hit(&key.0, entry, now, side.from_lan, total_len);
    let s = OPTIONS_SCRATCH.get_ptr_mut(0).ok_or(NOT_CARRIED)?;
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    s.src = entry.new_src_addr;
    s.dst = entry.new_dst_addr;
    s.sport = entry.new_src_port;
    s.dport = entry.new_dst_port;
    #[expect(clippy::cast_possible_truncation, reason = "at most 74")]
    {
        s.l4 = l4 as u32;
    }
    Ok(())
}

/// Whether the header checksum of the `hlen`-byte IPv4 header (options
/// included) verifies (RFC 1812 5.2.2), one word at a time.
#[inline(always)]
fn header_checksum_ok(ctx: &XdpContext, hlen: usize) -> bool {
    let mut sum = 0u32;
    let mut at = 0;
    // At most 60 bytes: 30 words.
    while at < 60 {
        if at >= hlen {
            break;
        }
        let Ok(w) = ptr_at::<[u8; 2]>(ctx, frame::IPV4 + at) else {
            return false;
        };
        // SAFETY: bounds checked by ptr_at.
        let w = unsafe { &*w };
        sum += u32::from(u16::from_be_bytes(*w));
        at += 2;
    }
    checksum::fold(sum) == 0xffff
}

/// Option type of a loose source route (RFC 791 3.1, LSRR).
const OPT_LSRR: u8 = 0x83;
/// Option type of a strict source route (SSRR).
const OPT_SSRR: u8 = 0x89;
/// Option type of Record Route (RFC 791 3.1, RR).
const OPT_RR: u8 = 0x07;
/// Option type of Internet Timestamp (RFC 791 3.1, TS).
const OPT_TS: u8 = 0x44;

/// Options walked ([`plain_options`], no-operation bytes counted): the
/// verifier walks each step's outcomes for every one before it, so few
/// (senders put one or two); a longer list goes to the kernel.
const OPTIONS_WALKED: usize = 6;

/// Whether the options of the `hlen`-byte IPv4 header are ones this path
/// forwards as they are: a list of at most [`OPTIONS_WALKED`] options
/// (no-operation bytes counted) that walks to its end, none a source
/// route, each with a length of at least 2 within the header (but the
/// one-byte end and no-operation ones). What it could not walk to the end
/// is not forwarded unseen (six no-operation bytes would hide a source
/// route).
// A subprogram of its own: the walk's values in `translate`'s frame grew
// it past the 512 bytes of its call chains.
#[inline(never)]
fn plain_options(ctx: &XdpContext, hlen: usize) -> bool {
    let mut at = ipv4::LEN;
    for _ in 0..OPTIONS_WALKED {
        if at >= hlen {
            return true;
        }
        let Ok(kind) = ptr_at::<u8>(ctx, frame::IPV4 + at) else {
            return false;
        };
        // SAFETY: bounds checked by ptr_at.
        let kind = unsafe { *kind };
        match kind {
            // End of the list: the rest is padding.
            0 => return true,
            // No operation.
            1 => at += 1,
            OPT_LSRR | OPT_SSRR => return false,
            _ => {
                let Ok(len) = ptr_at::<u8>(ctx, frame::IPV4 + at + 1) else {
                    return false;
                };
                // SAFETY: bounds checked by ptr_at.
                let len = usize::from(unsafe { *len });
                if len < 2 || at + len > hlen {
                    return false;
                }
                // Record Route and Timestamp carry a pointer into their own
                // data: one Linux's `ip_options_compile` refuses (a
                // Parameter Problem) is the kernel's.
                let pointer_ok = match kind {
                    OPT_RR | OPT_TS => pointer_fits(ctx, at, len, kind),
                    _ => true,
                };
                if !pointer_ok {
                    return false;
                }
                at += len;
            }
        }
    }
    at >= hlen
}

/// Whether the Record Route or Timestamp option (`kind`) of `len` bytes at
/// `at` of the IPv4 header has a pointer (its third byte) Linux's
/// `ip_options_compile` takes: not before the option's data (4 for Record
/// Route, 5 for Timestamp), and one inside the option with room for an
/// entry (an address; a timestamp, with flags 1 and 3 an address and a
/// timestamp); a Timestamp pointing past its end (full) with an overflow
/// count below 15, unless prespecified (flag 3), whose overflow Linux does
/// not count (RFC 791 3.1).
#[inline(always)]
fn pointer_fits(ctx: &XdpContext, at: usize, len: usize, kind: u8) -> bool {
    let byte = |i: usize| {
        ptr_at::<u8>(ctx, frame::IPV4 + at + i)
            .ok()
            // SAFETY: bounds checked by ptr_at.
            .map(|p| usize::from(unsafe { *p }))
    };
    let ts = kind == OPT_TS;
    let first_data = if ts { 5 } else { 4 };
    if len < first_data - 1 {
        return false;
    }
    let Some(pointer) = byte(2) else {
        return false;
    };
    if pointer < first_data {
        return false;
    }
    if !ts {
        return pointer > len || pointer + 3 <= len;
    }
    let Some(flags) = byte(3) else {
        return false;
    };
    if pointer > len {
        return flags & 0xf == 3 || flags >> 4 != 0xf;
    }
    let entry = if matches!(flags & 0xf, 1 | 3) { 8 } else { 4 };
    pointer + entry - 1 <= len
}

/// Sends the packet translated as the scratch slot says, if XDP can
/// forward it.
#[inline(never)]
fn send(ctx: &XdpContext) -> Packed {
    match try_send(ctx) {
        Ok(v) | Err(v) => v.pack(),
    }
}

#[inline(always)]
fn try_send(ctx: &XdpContext) -> Step<Verdict> {
    let eth: &mut [u8; eth::LEN] = header(ctx, 0)?;
    let ip: &mut [u8; ipv4::LEN] = header(ctx, frame::IPV4)?;
    let s = OPTIONS_SCRATCH.get_ptr_mut(0).ok_or(NOT_CARRIED)?;
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    let (src, dst) = (s.src, s.dst);
    let hop = hop::fib_in(ctx, &mut s.fib, ip, dst)?;
    if !matches!(hop, Hop::Redirect { .. }) {
        return Err(NOT_CARRIED);
    }
    // At most 14 + 60: the offset `translate` found, bounded again for
    // the verifier.
    let l4 = (s.l4 as usize) & 0x7f;
    let proto = ip[ipv4::PROTO];
    let pseudo = rewrite_addrs(ip, src, dst);
    match proto {
        IPPROTO_TCP => {
            let t: *mut [u8; tcp::LEN] = ptr_at(ctx, l4)?;
            // SAFETY: bounds checked by ptr_at; no other header borrowed
            // overlaps it.
            rewrite_tcp(unsafe { &mut *t }, pseudo, s.sport, s.dport);
        }
        IPPROTO_UDP => {
            let u: *mut [u8; udp::LEN] = ptr_at(ctx, l4)?;
            // SAFETY: as above.
            rewrite_udp(unsafe { &mut *u }, pseudo, s.sport, s.dport);
        }
        _ => {
            let i: *mut [u8; icmp::LEN] = ptr_at(ctx, l4)?;
            // SAFETY: as above.
            let _ = rewrite_icmp_echo(unsafe { &mut *i }, s.sport);
        }
    }
    Ok(forward_l2(eth, ip, &hop, Counter::FwdIpOptions))
}
