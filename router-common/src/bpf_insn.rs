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
