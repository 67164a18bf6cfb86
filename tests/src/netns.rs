//! Entering a named network namespace on the current thread.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Moves the *calling thread* into the network namespace `/run/netns/NAME`.
///
/// `setns(CLONE_NEWNET)` is per thread: sockets created on this thread after
/// the call live in that namespace, other threads are unaffected. Only the
/// network namespace is entered (not the mount namespace), so the caller's
/// `/sys/fs/bpf` stays visible.
///
/// # Panics
/// If the namespace file cannot be opened or `setns` fails.
pub fn enter(name: &str) {
    let path = format!("/run/netns/{name}");
    if let Err(e) = try_enter(Path::new(&path)) {
        panic!("entering {path} (setns CLONE_NEWNET): {e}");
    }
}

/// Moves the *calling thread* into the network namespace of the file
/// `path` (`/run/netns/NAME`, `/proc/PID/ns/net`), as [`enter`].
///
/// # Errors
/// If the file cannot be opened or `setns` fails.
pub fn try_enter(path: &Path) -> std::io::Result<()> {
    let file = File::open(path)?;
    // SAFETY: `file` is an open namespace fd for the duration of the call.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
