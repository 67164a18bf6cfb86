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

/// Whether a bpffs is mounted at [`BPFFS`] in this mount namespace.
fn bpffs_mounted() -> bool {
    let c = CString::new(BPFFS).unwrap();
    // SAFETY: statfs writes into the zeroed struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated, st is valid.
    unsafe { libc::statfs(c.as_ptr(), &raw mut st) == 0 && st.f_type == BPF_FS_MAGIC }
}

/// Refuses to work from inside `ip netns exec NAME`: it runs a command in
/// the named namespace with a mount namespace of its own and a fresh
/// `/sys`, without the bpffs, so pins made there vanish when router-ctl
/// exits (an attach would say "attached" and leave nothing attached) and
/// the router's own pins are not seen (`status` would say not attached, a
/// `--force` attach would remove the running router's program). Told
/// apart by: a network namespace that one of `/run/netns` names (PID 1's
/// is not always readable to tell it from the host's), and no bpffs at
/// [`BPFFS`] (`nsenter --net` into it keeps the host's mounts, and works);
/// `-n NAME` is the way.
/// `asked`: the namespace `-n` named, if any (the one to name in the
/// command to run instead).
pub fn refuse_ip_netns_exec(asked: Option<&str>) -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let id = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
    let Some(net) = id(Path::new("/proc/self/ns/net")) else {
        return Ok(());
    };
    if id(Path::new("/proc/1/ns/net")) == Some(net) || bpffs_mounted() {
        return Ok(());
    }
    let Some(name) = std::fs::read_dir("/run/netns").ok().and_then(|d| {
        d.flatten()
            .find(|e| id(&e.path()) == Some(net))
            .map(|e| e.file_name().to_string_lossy().into_owned())
    }) else {
        return Ok(());
    };
    let target = asked.unwrap_or(&name);
    bail!(
        "router-ctl runs inside `ip netns exec {name}` (its network namespace, with a private \
         /sys without the bpffs): pins made here would vanish when it exits, and the router's \
         own are not seen. Run it from the host's namespaces with `router-ctl -n {target} ...` \
         instead (see `-n NETNS` in the README)"
    )
}

pub fn ensure_bpffs() -> Result<()> {
    if bpffs_mounted() {
        return Ok(());
    }
    let c = CString::new(BPFFS).unwrap();
    let fstype = CString::new("bpf").unwrap();
    // Root's only, as systemd mounts it: the kernel's default mode is
    // 1777, in which any local user could make the directories the pins
    // go into before router-ctl does.
    let data = CString::new("mode=0700").unwrap();
    // SAFETY: all pointers are NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            c.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        bail!(
            "bpffs is not mounted at {BPFFS} and mounting it failed: {}; \
             run `mount -t bpf -o mode=0700 bpf {BPFFS}`",
            std::io::Error::last_os_error()
        );
    }
    eprintln!("mounted bpffs at {BPFFS}");
    Ok(())
}
