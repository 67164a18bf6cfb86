//! The verdict that ends a packet ([`Verdict`]: action and counter), a
//! phase's result ([`Step`]), and the verdict as a BPF subprogram takes
//! and returns it ([`Packed`]).

use aya_ebpf::bindings::xdp_action;
use router_common::maps::Counter;

/// How a packet leaves the program: the action and the counter it adds to.
#[derive(Clone, Copy)]
pub struct Verdict {
    pub counter: Counter,
    pub action: u32,
}

impl Verdict {
    /// To the kernel, for this reason.
    #[inline(always)]
    #[must_use]
    pub const fn pass(counter: Counter) -> Self {
        Self {
            counter,
            action: xdp_action::XDP_PASS,
        }
    }

    /// Dropped, for this reason.
    #[inline(always)]
    #[must_use]
    pub const fn drop(counter: Counter) -> Self {
        Self {
            counter,
            action: xdp_action::XDP_DROP,
        }
    }
}

/// A [`Verdict`] as one 64-bit value: what a BPF subprogram takes and
/// returns. A two-field struct does not fit BPF's one return register, so
/// LLVM returns it through a pointer into the caller's stack, and wherever
/// its register allocation leaves that pointer in R0 at the exit the
/// verifier refuses the whole program ("cannot return stack pointer to the
/// caller": seen after a one-line change of a condition).
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Packed(u64);

impl Verdict {
    /// The verdict as a subprogram returns it.
    #[inline(always)]
    #[must_use]
    pub const fn pack(self) -> Packed {
        Packed(((self.counter as u64) << 32) | self.action as u64)
    }
}

impl Packed {
    /// No verdict: a subprogram's "go on" (action 0, `XDP_ABORTED`, which
    /// no [`Verdict`] has).
    pub const GO_ON: Self = Self(0);

    /// Whether a subprogram said "go on" ([`Self::GO_ON`]).
    #[inline(always)]
    #[must_use]
    pub const fn goes_on(self) -> bool {
        self.0 == 0
    }

    /// The verdict a subprogram returned.
    #[inline(always)]
    #[must_use]
    pub const fn unpack(self) -> Verdict {
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the two halves of the packed value"
        )]
        let (counter, action) = ((self.0 >> 32) as u32, self.0 as u32);
        Verdict {
            // SAFETY: the high half is a `Counter`'s discriminant: a
            // `Packed` is made by `Verdict::pack` only (its field is
            // private to this module, which makes none otherwise).
            counter: unsafe { core::mem::transmute::<u32, Counter>(counter) },
            action,
        }
    }
}

/// A phase's result, or the verdict that ends the packet early.
///
/// A `Step` never carries a pointer (packet, map value or config): LLVM
/// keeps the `Ok` pointer and the `Err` verdict of such a result in one
/// 64-bit register and splits the verdict out with shifts, which the
/// verifier refuses on a pointer ("pointer arithmetic with >>= operator
/// prohibited"). Phases that yield pointers return `Option` or
/// `Result<_, Truncated>` (a nullable pointer) instead.
pub type Step<T> = Result<T, Verdict>;
