//! `struct bpf_insn` and the `bpf(2)` system call, for the few programs
//! written as raw instructions: the offload daemon's lease compare-and-swap
//! ([`crate::lease_cas`]) and the test kit's (the floor, the live-frame
//! generator, the limit, the cable). Little-endian hosts only: the register
//! bitfield's order follows the host's byte order.

/// `struct bpf_insn`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    /// `src_reg << 4 | dst_reg`.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

/// One instruction: opcode, destination and source register, offset,
/// immediate.
#[must_use]
pub const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

/// Opcodes and registers (`include/uapi/linux/bpf.h`, `bpf_common.h`) of the
/// raw programs in this crate.
pub mod op {
    pub const LDX_W: u8 = 0x61;
    pub const LDX_DW: u8 = 0x79;
    pub const STX_W: u8 = 0x63;
    pub const STX_DW: u8 = 0x7b;
    /// `BPF_ST | BPF_MEM | BPF_DW`: `*(u64 *)(dst + off) = imm`.
    pub const ST_DW: u8 = 0x7a;
    /// `BPF_ST | BPF_MEM | BPF_B`: `*(u8 *)(dst + off) = imm`.
    pub const ST_B: u8 = 0x72;
    /// `BPF_STX | BPF_W | BPF_ATOMIC`, with `imm` the operation.
    pub const ATOMIC_W: u8 = 0xc3;
    pub const LD_IMM64: u8 = 0x18;
    pub const ALU64_MOV_K: u8 = 0xb7;
    pub const ALU64_MOV_X: u8 = 0xbf;
    pub const ALU64_ADD_K: u8 = 0x07;
    pub const JMP_JNE_K: u8 = 0x55;
    pub const JMP_JNE_X: u8 = 0x5d;
    pub const JMP_CALL: u8 = 0x85;
    pub const JMP_EXIT: u8 = 0x95;
    /// The frame pointer (read-only stack base).
    pub const FP: u8 = 10;
}

/// `bpf(cmd, attr, size)` on a `union bpf_attr` prefix; the return value
/// (a new fd for the commands that make one).
///
/// # Errors
/// The OS error of a failed call.
#[cfg(feature = "user")]
pub fn sys_bpf(cmd: libc::c_long, attr: &mut [u8]) -> std::io::Result<libc::c_long> {
    // SAFETY: attr is a valid, writable buffer of the given size; the
    // kernel reads and writes only within it (and the memory its pointers
    // name, which the callers keep alive).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            libc::c_uint::try_from(attr.len()).unwrap_or(0),
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `BPF_MAP_UPDATE_ELEM` (`BPF_ANY`) of `key` -> `value` in the map `map`:
/// the slices must have the map's key and value sizes (the kernel reads
/// that many bytes), which aya's typed maps insist on knowing beforehand.
///
/// # Errors
/// The OS error of a refused update.
#[cfg(feature = "user")]
pub fn map_update(
    map: std::os::fd::BorrowedFd<'_>,
    key: &[u8],
    value: &[u8],
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    // union bpf_attr: map_fd (u32, then 4 bytes of padding), key, value
    // (pointers as u64), flags (u64: BPF_ANY = 0).
    let mut attr = [0u8; 32];
    attr[0..4].copy_from_slice(&map.as_raw_fd().cast_unsigned().to_ne_bytes());
    attr[8..16].copy_from_slice(&(key.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(value.as_ptr() as u64).to_ne_bytes());
    sys_bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
}

/// `BPF_FUNC_fib_lookup`.
const FN_FIB_LOOKUP: i32 = 69;
/// `BPF_FIB_LOOKUP_MARK` (Linux 6.10).
const FIB_LOOKUP_MARK: i32 = 1 << 5;

/// An XDP program that calls `bpf_fib_lookup` with `BPF_FIB_LOOKUP_MARK`
/// for interface 0 and returns what the helper returned: `-EINVAL` from a
/// kernel that does not know the flag (it checks the flags first),
/// `-ENODEV` from one that does (no interface 0).
#[must_use]
pub fn fib_mark_probe() -> [Insn; 17] {
    use op::{ALU64_ADD_K, ALU64_MOV_K, ALU64_MOV_X, FP, JMP_CALL, JMP_EXIT, ST_B, ST_DW};
    const PARAMS: i16 = -64;
    const AF_INET: i32 = 2;
    [
        insn(ALU64_MOV_X, 6, 1, 0, 0),
        insn(ST_DW, FP, 0, PARAMS, 0),
        insn(ST_DW, FP, 0, PARAMS + 8, 0),
        insn(ST_DW, FP, 0, PARAMS + 16, 0),
        insn(ST_DW, FP, 0, PARAMS + 24, 0),
        insn(ST_DW, FP, 0, PARAMS + 32, 0),
        insn(ST_DW, FP, 0, PARAMS + 40, 0),
        insn(ST_DW, FP, 0, PARAMS + 48, 0),
        insn(ST_DW, FP, 0, PARAMS + 56, 0),
        insn(ST_B, FP, 0, PARAMS, AF_INET),
        insn(ALU64_MOV_X, 1, 6, 0, 0),
        insn(ALU64_MOV_X, 2, FP, 0, 0),
        insn(ALU64_ADD_K, 2, 0, 0, i32::from(PARAMS)),
        insn(ALU64_MOV_K, 3, 0, 0, 64),
        insn(ALU64_MOV_K, 4, 0, 0, FIB_LOOKUP_MARK),
        insn(JMP_CALL, 0, 0, 0, FN_FIB_LOOKUP),
        insn(JMP_EXIT, 0, 0, 0, 0),
    ]
}

/// Whether this kernel's `bpf_fib_lookup` takes a routing mark
/// (`BPF_FIB_LOOKUP_MARK`, Linux 6.10): loads and runs
/// [`fib_mark_probe`] once.
///
/// # Errors
/// If the probe cannot be loaded or run (no `CAP_BPF` and
/// `CAP_NET_ADMIN`).
#[cfg(feature = "user")]
pub fn fib_lookup_takes_a_mark() -> std::io::Result<bool> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_RUN: libc::c_long = 10;
    const PROG_TYPE_XDP: u32 = 6;
    let insns = fib_mark_probe();
    let license = c"GPL";
    // union bpf_attr, BPF_PROG_LOAD: prog_type, insn_cnt, insns, license,
    // ..., prog_name[16] at 48.
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&PROG_TYPE_XDP.to_ne_bytes());
    let n = u32::try_from(insns.len()).unwrap_or(0);
    attr[4..8].copy_from_slice(&n.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    attr[48..57].copy_from_slice(b"fib_mark\0");
    let fd = sys_bpf(BPF_PROG_LOAD, &mut attr)?;
    let fd = i32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel returned a new fd that we own.
    let prog = unsafe { OwnedFd::from_raw_fd(fd) };
    // union bpf_attr, BPF_PROG_RUN: prog_fd, retval, data_size_in,
    // data_size_out, data_in: an Ethernet header's worth of zeroes.
    let frame = [0u8; 64];
    let mut attr = [0u8; 72];
    attr[0..4].copy_from_slice(&prog.as_raw_fd().cast_unsigned().to_ne_bytes());
    attr[8..12].copy_from_slice(&64u32.to_ne_bytes());
    attr[16..24].copy_from_slice(&(frame.as_ptr() as u64).to_ne_bytes());
    sys_bpf(BPF_PROG_RUN, &mut attr)?;
    let retval = i32::from_ne_bytes([attr[4], attr[5], attr[6], attr[7]]);
    Ok(retval != -libc::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_pack_source_high_destination_low() {
        let i = insn(0xbf, 1, 6, -8, 7);
        assert_eq!((i.code, i.regs, i.off, i.imm), (0xbf, 0x61, -8, 7));
        assert_eq!(core::mem::size_of::<Insn>(), 8);
    }
}
