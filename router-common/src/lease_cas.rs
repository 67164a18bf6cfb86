//! The offload daemon's compare-and-swap of an XDP entry's lease, done in
//! the kernel: a few raw eBPF instructions (a `BPF_PROG_TYPE_SYSCALL`
//! program, run with `BPF_PROG_RUN`) that look the entry up and swap its
//! `lease` with `BPF_ATOMIC | BPF_CMPXCHG`. The map API has no
//! compare-and-swap of a field, and a read-modify-write from user space
//! would overwrite a hand-back ([`LEASE_HANDED_BACK`]) the data path made
//! between the read and the write.
//!
//! The instructions are built with no system call (unit-tested anywhere);
//! the `user` feature loads and runs them ([`LeaseCas`]), for the daemon
//! (against the pinned maps) and the integration tests (against a loaded
//! router's maps) alike. Little-endian
//! hosts only: `struct bpf_insn` packs the registers in a bitfield whose
//! order follows the host's byte order.
//!
//! [`LEASE_HANDED_BACK`]: crate::maps::LEASE_HANDED_BACK

pub use crate::bpf_insn::Insn;
use crate::bpf_insn::{
    insn,
    op::{
        ALU64_ADD_K, ALU64_MOV_K, ALU64_MOV_X, ATOMIC_W, FP, JMP_CALL, JMP_EXIT, JMP_JNE_K,
        JMP_JNE_X, LD_IMM64, LDX_DW, LDX_W, STX_DW, STX_W,
    },
};
use crate::maps::{FlowEntry, FlowEntry6, FlowKey, FlowKey6};

/// `BPF_PROG_TYPE_SYSCALL` (Linux >= 5.14): run only with `BPF_PROG_RUN`,
/// on a context of the caller's making.
pub const PROG_TYPE_SYSCALL: u32 = 31;
/// `BPF_F_SLEEPABLE`: syscall programs must be loaded sleepable.
pub const PROG_FLAGS: u32 = 1 << 4;

/// The program's context: `expected` and `new` lease, the map key (zero
/// padded). After the run `expected` holds the lease the entry had.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LeaseCasCtx {
    pub expected: u32,
    pub new: u32,
    pub key: CasKey,
}

/// The key of the context: a `FlowKey` (zero padded to [`KEY_MAX`]) or a
/// `FlowKey6`. A union so that the key is stored as the map stores it
/// (`repr(C)`, no padding holes) by a plain field write, not serialised
/// field by field; only the kernel reads it.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CasKey {
    pub v4: FlowKey,
    pub v6: FlowKey6,
}

/// The largest key (`FlowKey6`), a multiple of 8: the key is copied to the
/// stack in 8-byte words.
pub const KEY_MAX: usize = 40;
const _: () = assert!(core::mem::size_of::<FlowKey6>() == KEY_MAX);
const _: () = assert!(core::mem::size_of::<FlowKey>() <= KEY_MAX);
const _: () = assert!(core::mem::size_of::<CasKey>() == KEY_MAX);
const _: () = assert!(core::mem::size_of::<LeaseCasCtx>() == 8 + KEY_MAX);

impl LeaseCasCtx {
    /// The context for swapping the lease of the `CONNTRACK` entry under
    /// `k` from `expected` to `new`.
    #[must_use]
    pub fn v4(k: &FlowKey, expected: u32, new: u32) -> Self {
        // All KEY_MAX bytes written (zero) first, then the key's: the
        // program copies the whole key area to the stack.
        let mut key = CasKey {
            v6: FlowKey6::default(),
        };
        key.v4 = *k;
        Self { expected, new, key }
    }

    /// [`Self::v4`] for a `CONNTRACK6` key.
    #[must_use]
    pub const fn v6(k: &FlowKey6, expected: u32, new: u32) -> Self {
        Self {
            expected,
            new,
            key: CasKey { v6: *k },
        }
    }
}

/// What one run of the program found; its return value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseSwap {
    /// The lease was the expected one and is now the new one.
    Swapped,
    /// The lease was another (returned in the context's `expected`):
    /// nothing written.
    Changed(u32),
    /// No entry under the key.
    Gone,
}

/// Return values of the program.
const RET_SWAPPED: i32 = 0;
const RET_CHANGED: i32 = 1;
const RET_GONE: i32 = 2;

impl LeaseSwap {
    /// The outcome of a run that returned `retval` and left `ctx`.
    #[must_use]
    pub const fn of_run(retval: u32, ctx: &LeaseCasCtx) -> Option<Self> {
        match retval.cast_signed() {
            RET_SWAPPED => Some(Self::Swapped),
            RET_CHANGED => Some(Self::Changed(ctx.expected)),
            RET_GONE => Some(Self::Gone),
            _ => None,
        }
    }
}

/// `BPF_CMPXCHG`: `r0 = cmpxchg(dst + off, r0, src)`.
const CMPXCHG: i32 = 0xf0 | 0x01;
/// `BPF_PSEUDO_MAP_FD` in `src_reg` of `LD_IMM64`: `imm` is a map fd.
const PSEUDO_MAP_FD: u8 = 1;
/// `bpf_map_lookup_elem(map, key)`.
const FN_MAP_LOOKUP_ELEM: i32 = 1;
/// Where the key is copied to on the stack: the frame's top `KEY_MAX`
/// bytes.
const KEY_STACK: i16 = -40;
const _: () = assert!(KEY_MAX == 40);

/// Instructions of the program for the `CONNTRACK` map (fd `map_fd`).
pub type Program = [Insn; LEN];
const KEY_WORDS: usize = KEY_MAX / 8;
/// Instructions: 1 + 2 per key word + 19.
const LEN: usize = 1 + 2 * KEY_WORDS + 19;

/// The program for `CONNTRACK` (`FlowKey` -> `FlowEntry`) with fd `map_fd`.
#[must_use]
pub fn conntrack_program(map_fd: i32) -> Program {
    program(map_fd, core::mem::offset_of!(FlowEntry, lease))
}

/// The program for `CONNTRACK6` (`FlowKey6` -> `FlowEntry6`) with fd
/// `map_fd`.
#[must_use]
pub fn conntrack6_program(map_fd: i32) -> Program {
    program(map_fd, core::mem::offset_of!(FlowEntry6, lease))
}

/// `r6` = context; the key goes to the stack (a map key may not point
/// into the context), the entry is looked up, and its `u32` lease at
/// `lease_off` compared with `expected` and swapped for `new` in one
/// atomic instruction. The lease found is written back into the context.
/// The key is copied whole ([`KEY_MAX`] bytes); the lookup reads only the
/// map's key size of it.
fn program(map_fd: i32, lease_off: usize) -> Program {
    const CTX: u8 = 6;
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_possible_wrap,
        reason = "the lease sits a few dozen bytes into the entry"
    )]
    let lease_off = lease_off as i16;
    let mut p = [insn(0, 0, 0, 0, 0); LEN];
    let mut n = 0;
    let mut push = |i: Insn| {
        p[n] = i;
        n += 1;
    };
    push(insn(ALU64_MOV_X, CTX, 1, 0, 0));
    let mut w = 0;
    while w < KEY_WORDS {
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_possible_wrap,
            reason = "w < 5"
        )]
        let off = 8 * w as i16;
        push(insn(LDX_DW, 2, CTX, 8 + off, 0));
        push(insn(STX_DW, FP, 2, KEY_STACK + off, 0));
        w += 1;
    }
    push(insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map_fd));
    push(insn(0, 0, 0, 0, 0));
    push(insn(ALU64_MOV_X, 2, FP, 0, 0));
    push(insn(ALU64_ADD_K, 2, 0, 0, i32::from(KEY_STACK)));
    push(insn(JMP_CALL, 0, 0, 0, FN_MAP_LOOKUP_ELEM));
    push(insn(JMP_JNE_K, 0, 0, 2, 0));
    push(insn(ALU64_MOV_K, 0, 0, 0, RET_GONE));
    push(insn(JMP_EXIT, 0, 0, 0, 0));
    // r1 = entry, r0 = expected (compared and replaced by the old value),
    // r2 = new, r3 = expected (kept for the comparison after).
    push(insn(ALU64_MOV_X, 1, 0, 0, 0));
    push(insn(LDX_W, 0, CTX, 0, 0));
    push(insn(LDX_W, 2, CTX, 4, 0));
    push(insn(ALU64_MOV_X, 3, 0, 0, 0));
    push(insn(ATOMIC_W, 1, 2, lease_off, CMPXCHG));
    push(insn(STX_W, CTX, 0, 0, 0));
    push(insn(JMP_JNE_X, 0, 3, 2, 0));
    push(insn(ALU64_MOV_K, 0, 0, 0, RET_SWAPPED));
    push(insn(JMP_EXIT, 0, 0, 0, 0));
    push(insn(ALU64_MOV_K, 0, 0, 0, RET_CHANGED));
    push(insn(JMP_EXIT, 0, 0, 0, 0));
    assert!(n == LEN, "lease_cas::LEN is the instruction count");
    p
}

/// Loading and running the program (host side, `user` feature): shared by
/// the offload daemon and the integration tests.
#[cfg(feature = "user")]
mod host {
    use super::{LeaseCasCtx, LeaseSwap, PROG_FLAGS, PROG_TYPE_SYSCALL, Program};
    use crate::bpf_insn::sys_bpf;
    use std::{
        format, io,
        os::fd::{AsRawFd, FromRawFd, OwnedFd},
    };

    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_RUN: libc::c_long = 10;

    /// A loaded lease compare-and-swap program for one conntrack map; it
    /// holds its own reference to the map.
    pub struct LeaseCas {
        prog: OwnedFd,
    }

    impl LeaseCas {
        /// Loads `insns` (a [`Program`] for an open map).
        ///
        /// # Errors
        /// If the kernel refuses it: no `BPF_PROG_TYPE_SYSCALL` (Linux < 5.14)
        /// or no 32-bit `BPF_CMPXCHG` (Linux < 5.12).
        pub fn load(insns: &Program) -> io::Result<Self> {
            let license = c"GPL";
            // union bpf_attr, BPF_PROG_LOAD: prog_type, insn_cnt, insns,
            // license, log_level, log_size, log_buf, kern_version, prog_flags,
            // prog_name[16].
            let mut attr = [0u8; 64];
            let insn_cnt = u32::try_from(insns.len()).unwrap_or(u32::MAX);
            attr[0..4].copy_from_slice(&PROG_TYPE_SYSCALL.to_ne_bytes());
            attr[4..8].copy_from_slice(&insn_cnt.to_ne_bytes());
            attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
            attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
            attr[44..48].copy_from_slice(&PROG_FLAGS.to_ne_bytes());
            attr[48..58].copy_from_slice(b"lease_cas\0");
            let fd = sys_bpf(BPF_PROG_LOAD, &mut attr)?;
            let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
            // SAFETY: the kernel returned a new fd that we own.
            Ok(Self {
                prog: unsafe { OwnedFd::from_raw_fd(fd) },
            })
        }

        /// Runs the swap `ctx` asks for (key, expected and new lease),
        /// atomically with respect to the data path.
        ///
        /// # Errors
        /// If `BPF_PROG_RUN` fails.
        pub fn swap(&self, mut ctx: LeaseCasCtx) -> io::Result<LeaseSwap> {
            let fd = u32::try_from(self.prog.as_raw_fd())
                .map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
            // union bpf_attr, BPF_PROG_RUN: prog_fd, retval, data_size_in,
            // data_size_out, data_in, data_out, repeat, duration, ctx_size_in,
            // ctx_size_out, ctx_in, ctx_out. A syscall program's context is
            // copied back into ctx_in.
            let mut attr = [0u8; 72];
            attr[0..4].copy_from_slice(&fd.to_ne_bytes());
            let size = u32::try_from(std::mem::size_of::<LeaseCasCtx>()).unwrap_or(0);
            attr[40..44].copy_from_slice(&size.to_ne_bytes());
            let ctx_ptr = std::ptr::from_mut(&mut ctx) as u64;
            attr[48..56].copy_from_slice(&ctx_ptr.to_ne_bytes());
            sys_bpf(BPF_PROG_RUN, &mut attr)?;
            let retval = u32::from_ne_bytes(attr[4..8].try_into().unwrap_or([0xff; 4]));
            LeaseSwap::of_run(retval, &ctx).ok_or_else(|| {
                io::Error::other(format!("the lease compare-and-swap returned {retval}"))
            })
        }
    }
}
#[cfg(feature = "user")]
pub use host::LeaseCas;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_swap_is_one_atomic_cmpxchg_on_the_lease() {
        let p = conntrack_program(7);
        let cas: std::vec::Vec<_> = p.iter().filter(|i| i.code == ATOMIC_W).collect();
        assert_eq!(cas.len(), 1);
        assert_eq!(cas[0].imm, CMPXCHG);
        assert_eq!(
            usize::try_from(cas[0].off).unwrap(),
            core::mem::offset_of!(FlowEntry, lease)
        );
        assert_eq!(
            usize::try_from(
                conntrack6_program(7)
                    .iter()
                    .find(|i| i.code == ATOMIC_W)
                    .unwrap()
                    .off
            )
            .unwrap(),
            core::mem::offset_of!(FlowEntry6, lease)
        );
        // The map fd is the LD_IMM64's immediate.
        assert!(p.iter().any(|i| i.code == LD_IMM64 && i.imm == 7));
        assert_eq!(p[LEN - 1].code, JMP_EXIT);
    }

    #[test]
    fn the_run_result_reads_the_lease_found() {
        let ctx = LeaseCasCtx::v4(&FlowKey::default(), 1, 99);
        assert_eq!(LeaseSwap::of_run(0, &ctx), Some(LeaseSwap::Swapped));
        assert_eq!(LeaseSwap::of_run(1, &ctx), Some(LeaseSwap::Changed(1)));
        assert_eq!(LeaseSwap::of_run(2, &ctx), Some(LeaseSwap::Gone));
        assert_eq!(LeaseSwap::of_run(3, &ctx), None);
    }

    /// The context as the kernel reads it (`ctx_in`).
    fn ctx_bytes(ctx: &LeaseCasCtx) -> [u8; 8 + KEY_MAX] {
        // SAFETY: LeaseCasCtx is repr(C) of 8 + KEY_MAX bytes (asserted),
        // all written by its constructors (no padding holes).
        let bytes = unsafe {
            core::slice::from_raw_parts(core::ptr::from_ref(ctx).cast::<u8>(), 8 + KEY_MAX)
        };
        bytes.try_into().unwrap()
    }

    #[test]
    fn the_context_holds_the_key_as_the_map_stores_it_zero_padded() {
        let k = FlowKey::new([10, 0, 0, 1], [192, 0, 2, 7], 0x1234, 0x5678, 6);
        let b = ctx_bytes(&LeaseCasCtx::v4(&k, 0x0102_0304, 0x0506_0708));
        assert_eq!(b[0..4], 0x0102_0304u32.to_ne_bytes());
        assert_eq!(b[4..8], 0x0506_0708u32.to_ne_bytes());
        assert_eq!(b[8..12], [10, 0, 0, 1]);
        assert_eq!(b[12..16], [192, 0, 2, 7]);
        assert_eq!(b[16..18], 0x1234u16.to_ne_bytes());
        assert_eq!(b[18..20], 0x5678u16.to_ne_bytes());
        assert_eq!(b[20..24], [6, 0, 0, 0]);
        assert_eq!(b[24..], [0; KEY_MAX - 16]);

        let k6 = FlowKey6 {
            src_addr: [1; 16],
            dst_addr: [2; 16],
            src_port: 0x1234,
            dst_port: 0x5678,
            proto: 17,
            pad: 0,
            pad2: 0,
        };
        let b = ctx_bytes(&LeaseCasCtx::v6(&k6, 1, 2));
        assert_eq!(b[8..24], [1; 16]);
        assert_eq!(b[24..40], [2; 16]);
        assert_eq!(b[40..42], 0x1234u16.to_ne_bytes());
        assert_eq!(b[42..44], 0x5678u16.to_ne_bytes());
        assert_eq!(b[44..], [17, 0, 0, 0]);
    }
}
