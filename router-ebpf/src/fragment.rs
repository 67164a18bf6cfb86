//! IPv4 fragments of the flows the data path carries (RFC 4787 REQ-14).
//!
//! Only a datagram's first fragment carries the ports, so the flow is found
//! through it: translated through the flow's entry like any hit, it leaves
//! a record in `FRAGMENTS` (the datagram's source, destination, protocol
//! and identification, RFC 791, and the addresses it was translated to),
//! and the datagram's later fragments get the same addresses from it. The
//! ports and the L4 checksum live in the first fragment only: the checksum
//! covers the whole datagram, and its incremental update (RFC 1624) needs
//! only the changed words, so the first fragment's rewrite is the
//! datagram's. Every fragment is forwarded as it is (the receiver
//! reassembles), never reassembled here.
//!
//! Carried: TCP, UDP and ICMP echo flows that the data path owns (TCP
//! only when the first fragment holds the header's fixed 20 bytes, and
//! with them the checksum, and no SYN, FIN or RST: a fragment changes no
//! TCP state). Passed to the kernel (`pass_fragment`), as before this path
//! existed: a TCP header split over fragments (RFC 1858's tiny fragment)
//! or a fragmented SYN, FIN or RST, fragments of no flow or of a new one
//! (the kernel's slow path admits it, and in standalone mode keeps the
//! flow's later packets: [`leave_to_kernel`]), an offloaded flow's (the kernel's
//! conntrack reassembles and translates them, in any order), a later
//! fragment that arrives before its first or more than
//! [`FRAGMENT_TIMEOUT_NS`] after it (a datagram whose first fragment XDP
//! forwarded is then lost, as the kernel cannot reassemble it without that
//! one; an endpoint resends), a first fragment whose datagram key a live
//! record of another translation holds (the record goes too: see
//! [`send`]; so does any record under the key of a first fragment this
//! path does not forward, [`retire_record`]), and a fragment whose next hop has no neighbour (the kernel's
//! defragmentation would hold it translated, waiting for the fragments XDP
//! forwards); one the FIB refuses goes with the FIB's reason. A record
//! lives on for its timeout after its flow ends; the map is an LRU of 8192
//! datagrams, so a sender that fills it with first fragments pushes older
//! records out (their later fragments then go to the kernel).

use aya_ebpf::{
    bindings::{BPF_ANY, xdp_action},
    macros::map,
    maps::PerCpuArray,
    programs::XdpContext,
};
use router_common::{
    hdr::{eth, frame, get_addr, get_u16, ipv4, min_len, tcp},
    maps::{
        Admit, Counter, FRAGMENT_TIMEOUT_NS, FragmentKey, FragmentXlat, IPPROTO_TCP, VMAC_IPV4,
    },
    nat::{fragment_is_first, rewrite_addrs},
};

use crate::{
    Packed, Step, Verdict, admit,
    flow::{self, Xlat},
    hop::{self, FibParams, Hop, forward_l2},
    maps::FRAGMENTS,
    parse::{self, Ingress, header},
};

/// What [`forward`]'s steps share, off the stack (see there): the
/// fragment's datagram, its translation and the FIB parameters.
#[repr(C)]
struct Scratch {
    fib: FibParams,
    key: FragmentKey,
    /// The first fragment's ports after translation.
    sport: u16,
    dport: u16,
    /// The addresses after translation, and when the first fragment came.
    record: FragmentXlat,
}

#[map(name = "FRAGMENT_SCRATCH")]
static FRAGMENT_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// The verdict of a fragment this path does not carry: the kernel's.
const NOT_CARRIED: Verdict = Verdict::pass(Counter::PassFragment);

/// What [`translate_first`] returns for a first fragment of no flow: no
/// verdict, the signal for [`leave_to_kernel`] (no step passes with this
/// event counter); the fragment then goes to the kernel ([`NOT_CARRIED`]).
const NO_FLOW: Verdict = Verdict::pass(Counter::FlowNewMasquerade);

/// What a translation step returns when the scratch slot holds the
/// fragment's translation: no verdict, the go-ahead for [`send`] (no other
/// step passes with this counter).
const TRANSLATED: Verdict = Verdict::pass(Counter::FwdFragment);

/// Forwards the IPv4 fragment of `ctx` (the core's `pass_fragment`
/// verdict: a header otherwise forwardable, see
/// [`router_common::nat::Ipv4Verdict::Fragment`]) if it belongs to a flow
/// the data path carries; else passes it with a reason.
// BPF subprograms, called from the entry point for fragments only: their
// frames stay off the entry point's, whose call chains are at the
// verifier's 512 bytes. The steps are siblings (each returns before the
// next), so each has the room left under this one, and what they hand on
// is in a per-CPU slot, not in a frame.
#[inline(never)]
pub fn forward(ctx: &XdpContext) -> Packed {
    let Ok(ip) = header::<{ ipv4::LEN }>(ctx, frame::IPV4) else {
        return NOT_CARRIED.pack();
    };
    let first = fragment_is_first(ip);
    let v = if first {
        forget_key();
        translate_first(ctx)
    } else {
        translate_later(ctx)
    };
    let v = match v.unpack().counter {
        c if c == TRANSLATED.counter => send(ctx, first),
        c if c == NO_FLOW.counter => {
            leave_to_kernel(ctx);
            NOT_CARRIED.pack()
        }
        _ => v,
    };
    if first && v.unpack().action != xdp_action::XDP_REDIRECT {
        retire_record();
    }
    v
}

/// Clears the scratch slot's datagram key (protocol 0, which no record
/// has), so that [`retire_record`] removes nothing should the fragment
/// not get as far as [`arrived`], which writes the key. A subprogram: the
/// slot's index on the stack would give [`forward`] a frame, on top of
/// which its steps' chains no longer fit the verifier's 512 bytes.
#[inline(never)]
fn forget_key() {
    if let Some(s) = FRAGMENT_SCRATCH.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, used by this program run only.
        unsafe { (*s).key.proto = 0 };
    }
}

/// A first fragment this path does not forward (its datagram goes to the
/// kernel) retires a live record under its datagram's key: an earlier
/// datagram's of the same identification within the record's timeout
/// (a sender that picks identifications at random, or the router's own
/// traffic under the same source, destination and protocol). Left in
/// place, it would translate the new datagram's later fragments to the
/// earlier one's host, while the kernel holds their first. As with two
/// translated first fragments under one key (see [`send`]), neither
/// datagram's later fragments can be told apart, so all go to the kernel.
#[inline(never)]
fn retire_record() {
    let Some(s) = FRAGMENT_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &*s };
    if s.key.proto != 0 {
        let _ = FRAGMENTS.remove(&s.key);
    }
}

/// A first fragment of no flow: in standalone mode, from the LAN, its flow
/// is left to the kernel's slow path ([`admit::leave_to_kernel`]): the
/// kernel's NAT reassembles the datagram and opens the flow with a port of
/// its own, and the flow's later datagrams stay there (RFC 4787 REQ-11),
/// also the unfragmented ones the data path could open. The header is read
/// again here: keeping the ports for it would grow [`translate_first`]'s
/// frame, whose call chain is at the verifier's combined stack limit.
#[inline(never)]
fn leave_to_kernel(ctx: &XdpContext) {
    let Ok(ip) = header::<{ ipv4::LEN }>(ctx, frame::IPV4) else {
        return;
    };
    let Some(side) = parse::ingress(ctx) else {
        return;
    };
    if !side.from_lan || side.cfg.admit != Admit::Xdp as u8 {
        return;
    }
    // A source the LAN does not route back to (a forged address beyond
    // the LAN) leaves no marker, as the masquerade path opens no flow for
    // it. (Another LAN host's address passes this check there too.) The
    // fragment itself goes to the kernel, whose reverse-path filter
    // judges it.
    if admit::lan_source_reachable(ctx, side.cfg.lan_ifindex) == Some(false) {
        return;
    }
    let Ok(Some((sport, dport))) = parse::ports(ctx, ip, frame::L4, true) else {
        return;
    };
    let key = flow::StackKey::of(ip, sport, dport);
    admit::leave_to_kernel(&key.0, side.cfg, crate::clock::now());
}

/// A datagram's first fragment: its flow's translation, if the data path
/// carries the flow, into the scratch slot ([`TRANSLATED`]).
#[inline(never)]
fn translate_first(ctx: &XdpContext) -> Packed {
    match try_translate_first(ctx) {
        Ok(()) => TRANSLATED,
        Err(v) => v,
    }
    .pack()
}

#[inline(always)]
fn try_translate_first(ctx: &XdpContext) -> Step<()> {
    let (ip, side, s) = arrived(ctx)?;
    of_first(ctx, ip, side, s)
}

/// A later fragment: the translation its datagram's first fragment
/// recorded, if there is one, into the scratch slot ([`TRANSLATED`]).
#[inline(never)]
fn translate_later(ctx: &XdpContext) -> Packed {
    match try_translate_later(ctx) {
        Ok(()) => TRANSLATED,
        Err(v) => v,
    }
    .pack()
}

#[inline(always)]
fn try_translate_later(ctx: &XdpContext) -> Step<()> {
    let (_, _, s) = arrived(ctx)?;
    // SAFETY: hash map value, copied out at once.
    let Some(r) = (unsafe { FRAGMENTS.get(&s.key) }).copied() else {
        return Err(NOT_CARRIED);
    };
    if crate::clock::now().saturating_sub(r.first_ns) > FRAGMENT_TIMEOUT_NS {
        return Err(NOT_CARRIED);
    }
    s.record = r;
    Ok(())
}

/// The fragment's IPv4 header and side, and the scratch slot with its
/// datagram's key, if it came in addressed to the router on an attached
/// interface.
#[inline(always)]
fn arrived<'a>(ctx: &XdpContext) -> Step<(&'a mut [u8; ipv4::LEN], Ingress<'a>, &'a mut Scratch)> {
    let eth: &mut [u8; eth::LEN] = header(ctx, 0)?;
    let ip: &mut [u8; ipv4::LEN] = header(ctx, frame::IPV4)?;
    let side = parse::ingress(ctx).ok_or(NOT_CARRIED)?;
    parse::addressed_to_us(ctx, eth, side, VMAC_IPV4)?;
    let s = FRAGMENT_SCRATCH.get_ptr_mut(0).ok_or(NOT_CARRIED)?;
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    s.key = FragmentKey {
        src_addr: get_addr(ip, ipv4::SRC),
        dst_addr: get_addr(ip, ipv4::DST),
        id: [ip[ipv4::ID], ip[ipv4::ID + 1]],
        proto: ip[ipv4::PROTO],
        from_lan: u8::from(side.from_lan),
    };
    Ok((ip, side, s))
}

/// Sends the fragment translated as the scratch slot says (a first
/// fragment's ports too, and its translation recorded for the later ones),
/// if XDP can forward it: else the kernel's (whose defragmentation would
/// hold a translated fragment, waiting for the ones XDP forwards).
#[inline(never)]
fn send(ctx: &XdpContext, first: bool) -> Packed {
    match try_send(ctx, first) {
        Ok(v) | Err(v) => v.pack(),
    }
}

#[inline(always)]
fn try_send(ctx: &XdpContext, first: bool) -> Step<Verdict> {
    let eth: &mut [u8; eth::LEN] = header(ctx, 0)?;
    let ip: &mut [u8; ipv4::LEN] = header(ctx, frame::IPV4)?;
    let s = FRAGMENT_SCRATCH.get_ptr_mut(0).ok_or(NOT_CARRIED)?;
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    let (src, dst) = (s.record.new_src_addr, s.record.new_dst_addr);
    let hop = hop::fib_in(ctx, &mut s.fib, ip, dst)?;
    if !matches!(hop, Hop::Redirect { .. }) {
        return Err(NOT_CARRIED);
    }
    if first {
        // A live record of the same datagram with another translation: a
        // first fragment of another flow under the same identification, a
        // spoof (the sender's identifications are unique per source,
        // destination and protocol while the datagram lives, RFC 791 and
        // RFC 6864); taking the record over would send the first
        // datagram's later fragments to that flow's host. The kernel gets
        // it (Linux's reassembly drops such an overlap). One with the same
        // translation, or an expired one, is replaced: the flow's sender
        // reused the identification. Should the insert fail, the later
        // fragments go to the kernel (and the datagram is lost).
        // SAFETY: hash map value, read at once.
        if let Some(old) = unsafe { FRAGMENTS.get(&s.key) }
            && s.record.first_ns.saturating_sub(old.first_ns) <= FRAGMENT_TIMEOUT_NS
            && (old.new_src_addr, old.new_dst_addr) != (src, dst)
        {
            // Neither datagram can be told apart by its later fragments:
            // the record goes, and they all go to the kernel (both
            // datagrams are lost; their senders resend).
            let _ = FRAGMENTS.remove(&s.key);
            return Err(NOT_CARRIED);
        }
        let _ = FRAGMENTS.insert(&s.key, &s.record, u64::from(BPF_ANY));
        let xlat = Xlat {
            src,
            dst,
            sport: s.sport,
            dport: s.dport,
        };
        flow::rewrite(ctx, ip, s.key.proto, &xlat)?;
    } else {
        let _ = rewrite_addrs(ip, src, dst);
    }
    Ok(forward_l2(eth, ip, &hop, Counter::FwdFragment))
}

/// A first fragment: the translation of its flow into `s`, if the data
/// path carries that flow (a hit on its own side, not expired, not
/// offloaded), whose timers it refreshes and whose counts it adds to as any
/// hit does. Written into the slot, not returned: a translation returned
/// on the stack is read back with wider loads than its alignment, which
/// the verifier refuses on the stack.
#[inline(always)]
fn of_first(
    ctx: &XdpContext,
    ip: &[u8; ipv4::LEN],
    side: Ingress<'_>,
    s: &mut Scratch,
) -> Step<()> {
    // TCP only with its header's fixed 20 bytes in the first fragment:
    // its checksum is there then (a header split over fragments, RFC
    // 1858's tiny fragment, is the kernel's), and only a segment without
    // SYN, FIN or RST: a fragment changes no TCP state here, so those go
    // to the kernel as before.
    if ip[ipv4::PROTO] == IPPROTO_TCP {
        if usize::from(get_u16(ip, ipv4::TOT_LEN)) < min_len::TCP {
            return Err(NOT_CARRIED);
        }
        // A data offset below the fixed header is malformed whatever the
        // datagram's length, as the core and the options path judge it
        // (one past this fragment's end cannot be judged without the
        // datagram's).
        let t: &[u8; tcp::LEN] = header(ctx, frame::L4)?;
        if usize::from(t[tcp::DATA_OFF] >> 4) * 4 < tcp::LEN {
            return Err(Verdict::drop(Counter::DropMalformed));
        }
        if parse::tcp_control(ctx, frame::L4)? {
            return Err(NOT_CARRIED);
        }
    }
    let (sport, dport) = parse::ports(ctx, ip, frame::L4, side.from_lan)?.ok_or(NOT_CARRIED)?;
    let key = flow::StackKey::of(ip, sport, dport);
    let (e, now) = flow::own_hit(&key.0, side).ok_or(NO_FLOW)?;
    // SAFETY: map value pointer from the lookup, valid for this run.
    let entry = unsafe { &mut *e };
    let len = usize::from(get_u16(ip, ipv4::TOT_LEN));
    flow::off_path_hit(&key.0, entry, now, side.from_lan, len);
    s.sport = entry.new_src_port;
    s.dport = entry.new_dst_port;
    s.record = FragmentXlat {
        new_src_addr: entry.new_src_addr,
        new_dst_addr: entry.new_dst_addr,
        first_ns: now,
    };
    Ok(())
}
