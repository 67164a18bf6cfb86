//! Entering a named network namespace on the current thread.

use std::fs::File;
use std::os::fd::AsRawFd;

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
    let file = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    // SAFETY: `file` is an open namespace fd for the duration of the call.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert!(
        rc == 0,
        "setns({path}, CLONE_NEWNET) failed: {}",
        std::io::Error::last_os_error()
    );
}
