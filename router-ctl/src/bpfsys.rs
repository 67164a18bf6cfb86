//! The few `bpf(2)` commands aya 0.14 does not expose: the interface of an
//! XDP link, detaching a link by id (`attach --force`), counting the tcx
//! programs of an interface (`doctor`'s `shaping`), and a new XDP link for
//! the running program, pinned (an interface deleted and made anew).

use router_common::bpf_insn::sys_bpf;
use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
};

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_XDP`, the attach type of an XDP link.
const ATTACH_XDP: u32 = 37;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_DETACH: libc::c_long = 34;
const BPF_PROG_QUERY: libc::c_long = 16;
/// `BPF_TCX_INGRESS`; `BPF_TCX_EGRESS` is the next.
pub const TCX_INGRESS: u32 = 46;
pub const TCX_EGRESS: u32 = 47;
/// `BPF_LINK_TYPE_XDP`.
pub const LINK_TYPE_XDP: u32 = 6;

/// What `bpf_link_info` says about a link.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkInfo {
    pub id: u32,
    pub prog_id: u32,
    pub link_type: u32,
    /// For XDP links: the interface (in the namespace the link was made in).
    pub ifindex: u32,
}

/// `BPF_OBJ_GET`: an fd for the object pinned at `path`.
pub fn obj_get(path: &std::path::Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut attr = [0u8; 16];
    attr[0..8].copy_from_slice(&(c.as_ptr() as u64).to_ne_bytes());
    let fd = sys_bpf(BPF_OBJ_GET, &mut attr)?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel returned a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `BPF_OBJ_PIN`: pins the object of `fd` at `path` (a new name on bpffs).
pub fn obj_pin(fd: BorrowedFd<'_>, path: &std::path::Path) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let fd =
        u32::try_from(fd.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // pathname (u64), bpf_fd, file_flags (u32 each).
    let mut attr = [0u8; 16];
    attr[0..8].copy_from_slice(&(c.as_ptr() as u64).to_ne_bytes());
    attr[8..12].copy_from_slice(&fd.to_ne_bytes());
    sys_bpf(BPF_OBJ_PIN, &mut attr).map(|_| ())
}

/// An fd for the loaded program with this id.
pub fn prog_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = [0u8; 12];
    attr[0..4].copy_from_slice(&id.to_ne_bytes());
    let fd = sys_bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel returned a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `BPF_LINK_CREATE` of an XDP link: program `prog` on interface `ifindex`
/// with `flags` (`XDP_FLAGS_SKB_MODE` or `XDP_FLAGS_DRV_MODE`). The link
/// lives while the returned fd (or a pin of it) does.
pub fn xdp_link_create(prog: BorrowedFd<'_>, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    let prog =
        u32::try_from(prog.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // prog_fd, target_ifindex, attach_type, flags (u32 each).
    let mut attr = [0u8; 16];
    attr[0..4].copy_from_slice(&prog.to_ne_bytes());
    attr[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    attr[8..12].copy_from_slice(&ATTACH_XDP.to_ne_bytes());
    attr[12..16].copy_from_slice(&flags.to_ne_bytes());
    let fd = sys_bpf(BPF_LINK_CREATE, &mut attr)?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel returned a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The ids of the programs attached to interface `ifindex` at
/// `attach_type` (a tcx hook), in order; empty where the kernel has no such
/// hook (a kernel without tcx, before 6.6, refuses the attach type). At
/// most 64 are read.
pub fn prog_ids(ifindex: u32, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut ids = [0u32; 64];
    // union bpf_attr's query: target_ifindex, attach_type, query_flags,
    // attach_flags (u32 each), prog_ids (u64), prog_cnt (u32), padding,
    // prog_attach_flags, link_ids, link_attach_flags, revision (u64 each).
    let mut attr = [0u8; 64];
    attr[0..4].copy_from_slice(&ifindex.to_ne_bytes());
    attr[4..8].copy_from_slice(&attach_type.to_ne_bytes());
    attr[16..24].copy_from_slice(&(ids.as_mut_ptr() as u64).to_ne_bytes());
    attr[24..28].copy_from_slice(&64u32.to_ne_bytes());
    match sys_bpf(BPF_PROG_QUERY, &mut attr) {
        Ok(_) => {
            let n = u32::from_ne_bytes(attr[24..28].try_into().unwrap_or([0; 4]));
            Ok(ids[..usize::try_from(n).unwrap_or(0).min(ids.len())].to_vec())
        }
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(Vec::new()),
        // More than the buffer holds: the first ones (more than any
        // shaping setup needs to be told apart).
        Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => Ok(ids.to_vec()),
        Err(e) => Err(e),
    }
}

/// `BPF_OBJ_GET_INFO_BY_FD` on a link fd.
pub fn link_info(fd: BorrowedFd<'_>) -> io::Result<LinkInfo> {
    // struct bpf_link_info: type, id, prog_id (u32 each), then an 8-aligned
    // union whose xdp member starts with the ifindex (offset 16).
    let mut info = [0u8; 64];
    let mut attr = [0u8; 16];
    let fd =
        u32::try_from(fd.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    attr[0..4].copy_from_slice(&fd.to_ne_bytes());
    attr[4..8].copy_from_slice(&64u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
    sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    let u = |o: usize| u32::from_ne_bytes(info[o..o + 4].try_into().unwrap_or([0; 4]));
    Ok(LinkInfo {
        link_type: u(0),
        id: u(4),
        prog_id: u(8),
        ifindex: u(16),
    })
}

/// An fd for the link with this id.
pub fn link_fd_by_id(id: u32) -> io::Result<OwnedFd> {
    let mut attr = [0u8; 12];
    attr[0..4].copy_from_slice(&id.to_ne_bytes());
    let fd = sys_bpf(BPF_LINK_GET_FD_BY_ID, &mut attr)?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: the kernel returned a new fd that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `BPF_LINK_DETACH`: detaches the link even while others hold it.
pub fn link_detach(fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut attr = [0u8; 4];
    let fd =
        u32::try_from(fd.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    attr.copy_from_slice(&fd.to_ne_bytes());
    sys_bpf(BPF_LINK_DETACH, &mut attr).map(|_| ())
}

/// The XDP link (if any) that attaches program `prog_id` to `ifindex`.
#[must_use]
pub fn find_xdp_link(prog_id: u32, ifindex: u32) -> Option<(u32, OwnedFd)> {
    for info in aya::programs::loaded_links().flatten() {
        if info.program_id() != prog_id {
            continue;
        }
        let Ok(fd) = link_fd_by_id(info.id()) else {
            continue;
        };
        let Ok(li) = link_info(std::os::fd::AsFd::as_fd(&fd)) else {
            continue;
        };
        if li.link_type == LINK_TYPE_XDP && li.ifindex == ifindex {
            return Some((li.id, fd));
        }
    }
    None
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Entries a [`lookup_batch`] call asks for: more than any hash bucket
/// holds (the kernel answers `ENOSPC` if one bucket does not fit), few
/// enough for a small buffer.
pub const BATCH_ENTRIES: u32 = 4096;

/// `BPF_MAP_LOOKUP_BATCH` (Linux >= 5.6) over the whole hash map `map`:
/// its entries as `(key bytes, value bytes)`, `key_size` and `value_size`
/// bytes each, read [`BATCH_ENTRIES`] per call instead of two calls per
/// entry. Like a key walk it is no snapshot: entries the data path adds or
/// removes meanwhile may be missed or seen twice (callers de-duplicate).
/// `Err` with `EINVAL` or `ENOTSUPP` (524) where the kernel or the map has
/// no batch operation: callers walk the keys instead.
pub fn lookup_batch(
    map: BorrowedFd<'_>,
    key_size: usize,
    value_size: usize,
) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let n = BATCH_ENTRIES as usize;
    let mut keys = vec![0u8; n * key_size];
    let mut values = vec![0u8; n * value_size];
    // The position tokens of a hash map: a bucket index (u32), in 8 bytes.
    let mut in_batch = [0u8; 8];
    let mut out_batch = [0u8; 8];
    let mut out = Vec::new();
    let fd =
        u32::try_from(map.as_raw_fd()).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    let mut first = true;
    loop {
        // union bpf_attr, batch: in_batch, out_batch, keys, values (u64
        // pointers), count, map_fd (u32), elem_flags, flags (u64).
        let mut attr = [0u8; 56];
        let ptr = |p: *const u8| (p as u64).to_ne_bytes();
        if !first {
            attr[0..8].copy_from_slice(&ptr(in_batch.as_ptr()));
        }
        attr[8..16].copy_from_slice(&ptr(out_batch.as_mut_ptr()));
        attr[16..24].copy_from_slice(&ptr(keys.as_mut_ptr()));
        attr[24..32].copy_from_slice(&ptr(values.as_mut_ptr()));
        attr[32..36].copy_from_slice(&BATCH_ENTRIES.to_ne_bytes());
        attr[36..40].copy_from_slice(&fd.to_ne_bytes());
        let r = sys_bpf(BPF_MAP_LOOKUP_BATCH, &mut attr);
        let count = u32::from_ne_bytes(attr[32..36].try_into().unwrap_or([0; 4])) as usize;
        for i in 0..count.min(n) {
            out.push((
                keys[i * key_size..(i + 1) * key_size].to_vec(),
                values[i * value_size..(i + 1) * value_size].to_vec(),
            ));
        }
        match r {
            Ok(_) => {}
            // The end of the map.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(out),
            Err(e) => return Err(e),
        }
        in_batch = out_batch;
        first = false;
    }
}
