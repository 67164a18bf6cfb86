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
