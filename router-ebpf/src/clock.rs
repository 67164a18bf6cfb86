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
//! mitigations. So the clock is read once per tick and CPU, and every
//! other packet of that tick takes the value read then: the same reading
//! the helper would give, except in the tick where a packet saw the new
//! `jiffies` before the timekeeper's update, whose later packets keep the
//! previous tick's time (at most one tick older, as the coarse clock
//! itself can be; a time, never a future one). What the times serve
//! (expiry, the 1 s refresh, ~1 s lease ticks) is coarser by far.

use aya_ebpf::{
    helpers::{bpf_jiffies64, bpf_ktime_get_coarse_ns},
    macros::map,
    maps::PerCpuArray,
};

/// The coarse clock's reading at a tick.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TickTime {
    /// `jiffies_64` when `ns` was read.
    pub jiffies: u64,
    /// `bpf_ktime_get_coarse_ns` then; 0: not read yet on this CPU.
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
    // SAFETY: per-CPU slot. A run that interrupts another on this CPU (a
    // softirq in a `BPF_PROG_RUN` call) can find it written half: a new
    // `jiffies` beside the previous tick's time, which it takes as it is,
    // one tick old; never a later time than its own.
    let t = unsafe { &mut *t };
    // `ns != 0`: `jiffies_64` starts 5 minutes before its wrap to 0, so a
    // never-written slot's 0 must not pass for that tick's reading.
    if t.jiffies == jiffies && t.ns != 0 {
        return t.ns;
    }
    // SAFETY: helper without arguments.
    let ns = unsafe { bpf_ktime_get_coarse_ns() };
    t.jiffies = jiffies;
    t.ns = ns;
    ns
}
