//! Next hop and the forwarding tail: `bpf_fib_lookup` (or the flow's
//! cached hop), the redirect through the DEVMAP, and the L2 rewrite that
//! the flow path and the ICMP error path share.

use core::mem::size_of;

use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_FWD_DISABLED, BPF_FIB_LKUP_RET_NO_NEIGH,
        BPF_FIB_LKUP_RET_SUCCESS, BPF_FIB_LOOKUP_OUTPUT,
    },
    helpers::{bpf_check_mtu, bpf_fib_lookup},
    programs::XdpContext,
};
use router_common::{
    flow::REFRESH_NS,
    hdr::{eth, get_addr, get_u16, ipv4},
    maps::{Counter, NextHopKey},
    nat::decrement_ttl,
};

use crate::{
    Step, Verdict,
    maps::{DEVICES, NEXT_HOPS},
};

pub use aya_ebpf::bindings::bpf_fib_lookup as FibParams;

const AF_INET: u8 = 2;
/// `BPF_FIB_LOOKUP_MARK` (Linux 6.10; aya's bindings predate it): the
/// lookup's routing mark is `mark`, an input that shares its bytes with
/// the output `smac` (else the lookup carries mark 0). Older kernels
/// refuse the flag (`-EINVAL`): the offload daemon probes for it before it
/// gives a flow a mark.
const BPF_FIB_LOOKUP_MARK: u32 = 1 << 5;
/// The smallest MTU an IPv4 link may have (RFC 791: a 60-byte header and
/// an 8-byte fragment).
const IPV4_MIN_MTU: u16 = 68;
#[expect(clippy::cast_possible_wrap, reason = "64-byte struct")]
const FIB_PARAMS_LEN: i32 = size_of::<FibParams>() as i32;

/// Next hop for a packet with the translated addresses.
pub enum Hop {
    /// Neighbour known and the redirect to `ifindex` recorded (`action`):
    /// forward in XDP with these MACs.
    Redirect {
        ifindex: u32,
        mtu: u16,
        smac: [u8; eth::ADDR_LEN],
        dmac: [u8; eth::ADDR_LEN],
        action: u32,
    },
    /// Route fine but no neighbour entry: the kernel must resolve it.
    NoNeighbour { ifindex: u32 },
}

impl Hop {
    /// The interface the packet leaves on.
    #[inline(always)]
    pub fn egress(&self) -> u32 {
        match self {
            Hop::Redirect { ifindex, .. } | Hop::NoNeighbour { ifindex } => *ifindex,
        }
    }
}

/// The FIB parameters of the IPv4 packet `ip` with the addresses `src` and
/// `dst` and IPv4 total length `tot_len` (0: no MTU check).
#[inline(always)]
fn params4(ip: &[u8; ipv4::LEN], src: [u8; 4], dst: [u8; 4], tot_len: u16) -> FibParams {
    // SAFETY: zeroed is a valid bit pattern for this plain C struct.
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = ip[ipv4::PROTO];
    p.__bindgen_anon_1.tot_len = tot_len;
    p.__bindgen_anon_2.tos = ip[ipv4::TOS];
    p.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(src);
    p.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(dst);
    p
}

/// Runs `bpf_fib_lookup` on `p` (family, protocol, length and addresses
/// set by the caller) from the ingress interface: the helper's result code.
#[inline(always)]
fn call(ctx: &XdpContext, p: &mut FibParams) -> u32 {
    call_on(ctx, p, ctx.ingress_ifindex() as u32, 0)
}

/// Runs `bpf_fib_lookup` on `p` for interface `ifindex` with `flags` (the
/// ingress one and none: a forward lookup; `BPF_FIB_LOOKUP_OUTPUT`: an
/// output lookup restricted to it): the helper's result code.
#[inline(always)]
fn call_on(ctx: &XdpContext, p: &mut FibParams, ifindex: u32, flags: u32) -> u32 {
    p.ifindex = ifindex;
    // SAFETY: ctx is the program's context, p a valid struct.
    let rc = unsafe { bpf_fib_lookup(ctx.as_ptr(), p, FIB_PARAMS_LEN, flags) };
    #[expect(
        clippy::cast_sign_loss,
        reason = "negative errors map to no BPF_FIB_LKUP_RET_* and are passed"
    )]
    let rc = rc as u32;
    rc
}

/// The interface the kernel would forward the IPv4 packet `ip` out of, as
/// it is (no MTU check); `None` when it would not forward it (local
/// delivery, broadcast, unreachable, forwarding off).
#[inline(always)]
pub fn forward_egress(ctx: &XdpContext, ip: &[u8; ipv4::LEN]) -> Option<u32> {
    let mut p = params4(ip, get_addr(ip, ipv4::SRC), get_addr(ip, ipv4::DST), 0);
    egress(ctx, &mut p)
}

/// The next hop's MTU when the FIB refuses the IPv4 packet `ip`, asked as
/// [`fib`] asks it (its own source, the translated destination `dst`), as
/// larger than it
/// (`BPF_FIB_LKUP_RET_FRAG_NEEDED`, the MTU of `ip_mtu_from_fib_result`:
/// the route's if locked or with `ip_forward_use_pmtu`, else a path MTU the
/// router learned for the destination, else the egress device's); `None`
/// for any other answer, and for an MTU no Fragmentation Needed should
/// carry (below IPv4's minimum of 68, RFC 791, or not below the packet's
/// length: a kernel that does not report it). The parameters go in `p` (a
/// per-CPU map slot of the caller).
#[inline(always)]
pub fn mtu_exceeded(
    ctx: &XdpContext,
    p: &mut FibParams,
    ip: &[u8; ipv4::LEN],
    dst: [u8; 4],
) -> Option<u16> {
    let tot_len = get_u16(ip, ipv4::TOT_LEN);
    *p = params4(ip, get_addr(ip, ipv4::SRC), dst, tot_len);
    if call(ctx, p) != BPF_FIB_LKUP_RET_FRAG_NEEDED {
        return None;
    }
    // SAFETY: with this result the kernel wrote mtu_result (a union with
    // tot_len; since Linux 5.12).
    let mtu = unsafe { p.__bindgen_anon_1.mtu_result };
    (IPV4_MIN_MTU..tot_len).contains(&mtu).then_some(mtu)
}

/// The interface the kernel would send a reply to the IPv4 packet `ip`
/// out of: its addresses swapped, looked up as arriving where `ip` did, no
/// MTU check; `None` when it would not forward one.
#[inline(always)]
pub fn reverse_egress(ctx: &XdpContext, ip: &[u8; ipv4::LEN]) -> Option<u32> {
    let mut p = params4(ip, get_addr(ip, ipv4::DST), get_addr(ip, ipv4::SRC), 0);
    egress(ctx, &mut p)
}

/// Whether the IPv4 packet `ip`'s source is reachable out of interface
/// `oif`: the reverse path (RFC 3704 strict), asked as Linux's `rp_filter`
/// asks it, from the router's own perspective (an output lookup, as if
/// from loopback, restricted to `oif`), so policy rules that select a
/// table by the incoming interface (`ip rule iif LAN lookup VPN`) do not
/// apply. A local or broadcast address of `oif` is not reachable out of
/// it. `None`: not judged, forwarding is off on `oif` (the FIB helper
/// checks that first; the forward lookup that follows then passes the
/// packet as `pass_fib_forwarding_disabled`).
#[inline(always)]
pub fn source_reachable_via(ctx: &XdpContext, ip: &[u8; ipv4::LEN], oif: u32) -> Option<bool> {
    let mut p = params4(ip, get_addr(ip, ipv4::DST), get_addr(ip, ipv4::SRC), 0);
    reachable_via(ctx, &mut p, oif)
}

/// Whether the FIB parameters' destination is reachable out of `oif`,
/// looked up from the router's own perspective (see
/// [`source_reachable_via`]; both families).
#[inline(always)]
pub fn reachable_via(ctx: &XdpContext, p: &mut FibParams, oif: u32) -> Option<bool> {
    match call_on(ctx, p, oif, BPF_FIB_LOOKUP_OUTPUT) {
        BPF_FIB_LKUP_RET_SUCCESS | BPF_FIB_LKUP_RET_NO_NEIGH => Some(p.ifindex == oif),
        BPF_FIB_LKUP_RET_FWD_DISABLED => None,
        _ => Some(false),
    }
}

/// The interface the kernel would forward a packet of the FIB parameters
/// `p` out of (family, protocol, length and addresses set by the caller);
/// `None` when it would not forward it.
#[inline(always)]
pub fn egress(ctx: &XdpContext, p: &mut FibParams) -> Option<u32> {
    match call(ctx, p) {
        // The kernel fills ifindex before the neighbour lookup.
        BPF_FIB_LKUP_RET_SUCCESS | BPF_FIB_LKUP_RET_NO_NEIGH => Some(p.ifindex),
        _ => None,
    }
}

/// Asks the FIB for the next hop of the IPv4 packet `ip` once its
/// destination is `dst`, as the kernel routes it: with the packet's own
/// source (source NAT comes after routing) and the translated destination
/// (destination NAT before it), so a policy rule on a LAN host's source
/// (`ip rule from`: VPN split routing, multi-WAN) selects the same table.
/// Not forwarded by the FIB (local, unreachable, needs fragmenting,
/// forwarding off): passed with a reason.
#[inline(always)]
pub fn fib(ctx: &XdpContext, ip: &[u8; ipv4::LEN], dst: [u8; 4]) -> Step<Hop> {
    fib_marked(ctx, ip, dst, 0, Note::Neighbour)
}

/// Whether a successful lookup notes its neighbour in `NEXT_HOPS`
/// ([`note_neighbour`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Note {
    Neighbour,
    /// A new flow's first packet: its next packets note it (a hit whose
    /// hop is not cached yet asks the FIB), so the first one need not pay.
    Nothing,
}

/// [`fib`] for a packet the kernel routes with the mark `mark` (0: none):
/// an offloaded connection whose ct mark the owner's rules copy into its
/// packets, so that an `ip rule fwmark` selects the same table on the
/// fast path as in the kernel (multi-WAN, VPN bypass).
#[inline(always)]
pub fn fib_marked(
    ctx: &XdpContext,
    ip: &[u8; ipv4::LEN],
    dst: [u8; 4],
    mark: u32,
    note: Note,
) -> Step<Hop> {
    let mut p = params4(ip, get_addr(ip, ipv4::SRC), dst, get_u16(ip, ipv4::TOT_LEN));
    let flags = if mark == 0 {
        0
    } else {
        p.smac[..4].copy_from_slice(&mark.to_ne_bytes());
        BPF_FIB_LOOKUP_MARK
    };
    lookup_with(ctx, &mut p, flags, note)
}

/// [`fib`] with its parameters in `p` (a per-CPU map slot of the caller)
/// rather than on the stack: for a subprogram whose call chain has no room
/// for them.
#[inline(always)]
pub fn fib_in(
    ctx: &XdpContext,
    p: &mut FibParams,
    ip: &[u8; ipv4::LEN],
    dst: [u8; 4],
) -> Step<Hop> {
    *p = params4(ip, get_addr(ip, ipv4::SRC), dst, get_u16(ip, ipv4::TOT_LEN));
    lookup(ctx, p)
}

/// Runs `bpf_fib_lookup` on `p` (both families share this part) and turns
/// the result into a [`Hop`] or a pass verdict.
#[inline(always)]
pub fn lookup(ctx: &XdpContext, p: &mut FibParams) -> Step<Hop> {
    lookup_with(ctx, p, 0, Note::Neighbour)
}

/// [`lookup`] that notes no neighbour: where the answer forwards nothing
/// (a packet it then drops), so a scan of the LAN's addresses from the WAN
/// does not make the daemon keep their neighbour entries fresh.
#[inline(always)]
pub fn lookup_unnoted(ctx: &XdpContext, p: &mut FibParams) -> Step<Hop> {
    lookup_with(ctx, p, 0, Note::Nothing)
}

/// [`lookup`] with the helper's `flags` (a forward lookup from the
/// ingress interface either way), noting the neighbour or not.
#[inline(always)]
fn lookup_with(ctx: &XdpContext, p: &mut FibParams, flags: u32, note: Note) -> Step<Hop> {
    let reason = match call_on(ctx, p, ctx.ingress_ifindex() as u32, flags) {
        BPF_FIB_LKUP_RET_SUCCESS => {
            // SAFETY: on success the kernel wrote mtu_result (a union with
            // tot_len).
            let mtu = unsafe { p.__bindgen_anon_1.mtu_result };
            let hop = redirect_to(p.ifindex, mtu, p.smac, p.dmac);
            if hop.is_ok() && note == Note::Neighbour {
                note_neighbour(p);
            }
            return hop;
        }
        // The kernel fills ifindex before the neighbour lookup.
        BPF_FIB_LKUP_RET_NO_NEIGH => return Ok(Hop::NoNeighbour { ifindex: p.ifindex }),
        BPF_FIB_LKUP_RET_FRAG_NEEDED => Counter::PassMtu,
        BPF_FIB_LKUP_RET_FWD_DISABLED => Counter::PassFibForwardingDisabled,
        // Local delivery, blackhole, unreachable, prohibit: the kernel decides.
        _ => Counter::PassFibNotForwarded,
    };
    Err(Verdict::pass(reason))
}

/// Notes the neighbour a successful lookup `p` forwards to (its egress
/// interface and next hop, which the kernel writes into the destination:
/// the gateway, or the destination itself on a link route) as in use now
/// in `NEXT_HOPS`, for the daemon to keep the kernel's entry valid. At
/// most one write per neighbour and second (a hit asks the FIB about once
/// a second per flow direction; the lookup alone writes nothing).
// A subprogram of its own: its key stays off the callers' frames.
#[inline(never)]
fn note_neighbour(p: &FibParams) {
    let mut key = NextHopKey {
        ifindex: p.ifindex,
        family: u32::from(p.family),
        addr: [0; 16],
    };
    // SAFETY: the destination union holds the address of the family the
    // kernel left in `family` (an IPv4 route may have an IPv6 gateway).
    unsafe {
        if p.family == AF_INET {
            key.addr[..4].copy_from_slice(&p.__bindgen_anon_4.ipv4_dst.to_ne_bytes());
        } else {
            for (i, w) in p.__bindgen_anon_4.ipv6_dst.iter().enumerate() {
                key.addr[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
            }
        }
    }
    let now = crate::clock::now();
    if let Some(t) = NEXT_HOPS.get_ptr_mut(&key) {
        // SAFETY: map value pointer; a racing writer can only write a
        // time as recent.
        let t = unsafe { &mut *t };
        if now.saturating_sub(*t) >= REFRESH_NS {
            *t = now;
        }
    } else {
        let _ = NEXT_HOPS.insert(&key, &now, 0);
    }
}

/// Records the redirect to `ifindex` (an attached interface) for a packet
/// leaving with these MACs. Only records: a packet passed after all goes to
/// the kernel untouched.
#[inline(always)]
pub fn redirect_to(
    ifindex: u32,
    mtu: u16,
    smac: [u8; eth::ADDR_LEN],
    dmac: [u8; eth::ADDR_LEN],
) -> Step<Hop> {
    let Ok(action) = DEVICES.redirect(ifindex, 0) else {
        return Err(Verdict::pass(Counter::PassEgressNotAttached));
    };
    Ok(Hop::Redirect {
        ifindex,
        mtu,
        smac,
        dmac,
        action,
    })
}

/// The forwarding tail of a translated packet: with a neighbour, TTL - 1
/// and the next hop's MACs, then the recorded redirect, counted as
/// `forwarded`; without one, passed as it is (translated, TTL untouched:
/// the kernel forwards it, decrements and resolves the neighbour).
#[inline(always)]
pub fn forward_l2(
    eth: &mut [u8; eth::LEN],
    ip: &mut [u8; ipv4::LEN],
    hop: &Hop,
    forwarded: Counter,
) -> Verdict {
    let Hop::Redirect {
        smac, dmac, action, ..
    } = *hop
    else {
        return Verdict::pass(Counter::PassNoNeighbour);
    };
    decrement_ttl(ip);
    write_macs(eth, smac, dmac);
    Verdict {
        counter: forwarded,
        action,
    }
}

/// The next hop's MACs into the Ethernet header (both families).
#[inline(always)]
pub fn write_macs(eth: &mut [u8; eth::LEN], smac: [u8; eth::ADDR_LEN], dmac: [u8; eth::ADDR_LEN]) {
    eth[eth::DST..eth::DST + eth::ADDR_LEN].copy_from_slice(&dmac);
    eth[eth::SRC..eth::SRC + eth::ADDR_LEN].copy_from_slice(&smac);
}

/// The MTU of interface `ifindex` (0: the one the packet came in on);
/// `u32::MAX` (no limit) if the kernel does not know it.
#[inline(always)]
pub fn device_mtu(ctx: &XdpContext, ifindex: u32) -> u32 {
    let mut mtu: u32 = 0;
    // SAFETY: the helper writes the MTU into `mtu`, a local; length 0 and
    // no flags ask for the MTU only (the packet's own length is checked
    // against it, a result not used here).
    let rc = unsafe { bpf_check_mtu(ctx.as_ptr(), ifindex, &raw mut mtu, 0, 0) };
    if rc < 0 { u32::MAX } else { mtu }
}
