//! Where a router's pins live (the pin directory of a namespace, the link
//! pins) and mounting bpffs. The maps pinned there are opened through
//! [`crate::maps`].

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

use anyhow::{Result, bail};

pub const BPFFS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Link pins, one per attached interface: LAN first, then WAN.
pub const LINK_PINS: [&str; 2] = ["link_lan", "link_wan"];

#[must_use]
pub fn pin_dir(netns: Option<&str>) -> PathBuf {
    Path::new(BPFFS)
        .join("xdp-router")
        .join(netns.unwrap_or("default"))
}

pub fn ensure_bpffs() -> Result<()> {
    let c = CString::new(BPFFS).unwrap();
    // SAFETY: statfs writes into the zeroed struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated, st is valid.
    if unsafe { libc::statfs(c.as_ptr(), &raw mut st) } == 0 && st.f_type == BPF_FS_MAGIC {
        return Ok(());
    }
    let fstype = CString::new("bpf").unwrap();
    // SAFETY: all pointers are NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            c.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "bpffs is not mounted at {BPFFS} and mounting it failed: {}; \
             run `mount -t bpf bpf {BPFFS}`",
            std::io::Error::last_os_error()
        );
    }
    eprintln!("mounted bpffs at {BPFFS}");
    Ok(())
}
