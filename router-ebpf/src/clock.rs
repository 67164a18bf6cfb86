//! The data path's clock: `CLOCK_MONOTONIC` at tick resolution
//! (`bpf_ktime_get_coarse_ns`), read through a per-CPU cache keyed by the
//! tick counter.
//!
//! The coarse clock only moves at a timer tick, and so does `jiffies`: the
//! kernel advances `jiffies_64` and then the timekeeper's coarse time in
//! the same tick (`tick_do_update_jiffies64`, then `update_wall_time`). The
//! verifier inlines `bpf_jiffies64` into one load, and a per-CPU array
//! lookup into a few instructions, while `bpf_ktime_get_coarse_ns` is a
//! helper call that calls the timekeeper in turn: two returns through the
//! kernel's return thunk per packet on hosts with the SRSO or retbleed
//! mitigations. So a CPU reads the clock once per tick, and its other
//! packets of that tick take the value read then: the helper's own reading
//! at that instant, never a later one. A packet that finds `jiffies`
//! advanced but the coarse time not yet (the timekeeper's update follows)
//! gets the time as it still is and leaves the cache as it was, so the
//! next packet reads again; only a CPU whose cached reading is from an
//! earlier tick than the last one can keep a reading from before that
//! update for the rest of the tick. What the times serve (expiry, the 1 s
//! refresh, ~1 s lease ticks) is coarser by far.

use core::sync::atomic::{Ordering, compiler_fence};

use aya_ebpf::{
    helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns},
    macros::map,
    maps::PerCpuArray,
};

/// The coarse clock's reading at a tick.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TickTime {
    /// `jiffies_64` when `ns` was read. Never 0 once read: on 64-bit
    /// kernels `jiffies_64` starts at 2^32 - 300 s of ticks and grows.
    pub jiffies: u64,
    /// `bpf_ktime_get_coarse_ns` then.
    pub ns: u64,
}

#[map(name = "TICK_TIME")]
static TICK_TIME: PerCpuArray<TickTime> = PerCpuArray::with_max_entries(1, 0);

/// `CLOCK_MONOTONIC` in ns at tick resolution (see the module).
#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: helper without arguments (inlined by the verifier).
    let jiffies = unsafe { bpf_jiffies64() };
    let Some(t) = TICK_TIME.get_ptr_mut(0) else {
        core::hint::cold_path();
        // SAFETY: helper without arguments.
        return unsafe { bpf_ktime_get_coarse_ns() };
    };
    // SAFETY: per-CPU slot. Runs on one CPU do not nest (XDP runs with
    // bottom halves off, and so does `BPF_PROG_RUN`); were one to find
    // the slot half written, `ns` is stored before `jiffies`, so it would
    // not match and it would read the clock itself.
    let t = unsafe { &mut *t };
    if t.jiffies == jiffies {
        return t.ns;
    }
    // SAFETY: helper without arguments.
    let ns = unsafe { bpf_ktime_get_coarse_ns() };
    if ns != t.ns {
        t.ns = ns;
        compiler_fence(Ordering::Release);
        t.jiffies = jiffies;
    }
    ns
}
