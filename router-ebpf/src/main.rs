//! XDP fast path: parse Ethernet/IPv4, look up the next hop with
//! `bpf_fib_lookup`, decrement TTL, rewrite MACs and redirect through a
//! DEVMAP of the attached interfaces. Everything else goes to the kernel
//! with `XDP_PASS` and a per-reason counter.
#![no_std]
#![no_main]
// BPF has no real calls across map/ctx-heavy helpers: the verifier tracks
// packet pointers best when everything is inlined into the entry point.
#![expect(
    clippy::inline_always,
    reason = "keep packet pointer tracking in one frame for the verifier"
)]

use core::mem::size_of;

use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_FWD_DISABLED, BPF_FIB_LKUP_RET_NO_NEIGH,
        BPF_FIB_LKUP_RET_SUCCESS, bpf_fib_lookup as FibParams, xdp_action,
    },
    helpers::bpf_fib_lookup,
    macros::{map, xdp},
    maps::{Array, DevMapHash, PerCpuArray},
    programs::XdpContext,
};
use router_common::{
    maps::{Config, Counter, CounterValue},
    nat::{Ipv4Verdict, classify_ipv4, decrement_ttl},
};

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
const AF_INET: u8 = 2;
#[expect(clippy::cast_possible_wrap, reason = "64-byte struct")]
const FIB_PARAMS_LEN: i32 = size_of::<FibParams>() as i32;

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<CounterValue> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

#[map(name = "DEVICES")]
static DEVICES: DevMapHash = DevMapHash::with_max_entries(16, 0);

#[map(name = "CONFIG")]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the #[xdp] macro passes the context by value"
)]
pub fn router(ctx: XdpContext) -> u32 {
    let len = (ctx.data_end() - ctx.data()) as u64;
    let (counter, action) = match try_router(&ctx) {
        Ok(v) => v,
        Err(()) => (Counter::DropTruncated, xdp_action::XDP_DROP),
    };
    count(counter, len);
    action
}

#[inline(always)]
fn count(counter: Counter, bytes: u64) {
    if let Some(c) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, no other writer on this CPU.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += bytes;
        }
    }
}

/// The one bounds helper: a pointer to `T` at `offset`, or `Err` when the
/// frame is too short.
#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Result<*mut T, ()> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        return Err(());
    }
    Ok((start + offset) as *mut T)
}

#[inline(always)]
fn try_router(ctx: &XdpContext) -> Result<(Counter, u32), ()> {
    const PASS: u32 = xdp_action::XDP_PASS;
    let eth: *mut [u8; ETH_HLEN] = ptr_at(ctx, 0)?;
    // SAFETY: bounds checked by ptr_at.
    let eth = unsafe { &mut *eth };
    if u16::from_be_bytes([eth[12], eth[13]]) != ETH_P_IP {
        // ARP, IPv6, VLAN-tagged frames: the kernel handles them.
        return Ok((Counter::PassNotIpv4, PASS));
    }
    let ip: *mut [u8; 20] = ptr_at(ctx, ETH_HLEN)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &mut *ip };
    let l3_len = ctx.data_end() - ctx.data() - ETH_HLEN;
    match classify_ipv4(ip, l3_len) {
        Ipv4Verdict::Forward => {}
        Ipv4Verdict::Malformed => return Ok((Counter::DropMalformed, xdp_action::XDP_DROP)),
        Ipv4Verdict::Options => return Ok((Counter::PassIpOptions, PASS)),
        Ipv4Verdict::Fragment => return Ok((Counter::PassFragment, PASS)),
        Ipv4Verdict::TtlExceeded => return Ok((Counter::PassTtlExceeded, PASS)),
    }

    // SAFETY: zeroed is a valid bit pattern for this plain C struct.
    let mut fib: FibParams = unsafe { core::mem::zeroed() };
    fib.family = AF_INET;
    fib.l4_protocol = ip[9];
    fib.__bindgen_anon_1.tot_len = u16::from_be_bytes([ip[2], ip[3]]);
    fib.__bindgen_anon_2.tos = ip[1];
    fib.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes([ip[12], ip[13], ip[14], ip[15]]);
    fib.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes([ip[16], ip[17], ip[18], ip[19]]);
    fib.ifindex = ctx.ingress_ifindex() as u32;
    // SAFETY: ctx is the program's context, params a valid stack struct.
    let rc = unsafe { bpf_fib_lookup(ctx.as_ptr(), &raw mut fib, FIB_PARAMS_LEN, 0) };
    #[expect(
        clippy::cast_sign_loss,
        reason = "negative errors map to no BPF_FIB_LKUP_RET_* and are passed"
    )]
    let rc = rc as u32;
    if rc == BPF_FIB_LKUP_RET_NO_NEIGH {
        return Ok((Counter::PassNoNeighbour, PASS));
    }
    if rc == BPF_FIB_LKUP_RET_FRAG_NEEDED {
        return Ok((Counter::PassMtu, PASS));
    }
    if rc == BPF_FIB_LKUP_RET_FWD_DISABLED {
        return Ok((Counter::PassFibForwardingDisabled, PASS));
    }
    if rc != BPF_FIB_LKUP_RET_SUCCESS {
        // Local delivery, blackhole, unreachable, prohibit: kernel decides.
        return Ok((Counter::PassFibNotForwarded, PASS));
    }
    if DEVICES.get(fib.ifindex).is_none() {
        return Ok((Counter::PassEgressNotAttached, PASS));
    }
    // Redirect first: it only records the target, so on failure the frame
    // is still untouched when it goes to the kernel.
    let Ok(action) = DEVICES.redirect(fib.ifindex, 0) else {
        return Ok((Counter::PassEgressNotAttached, PASS));
    };
    decrement_ttl(ip);
    eth[0..6].copy_from_slice(&fib.dmac);
    eth[6..12].copy_from_slice(&fib.smac);
    Ok((Counter::Redirected, action))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
