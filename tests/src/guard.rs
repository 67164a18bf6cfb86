//! The run's namespaces cleaned up when the test process is interrupted
//! (Ctrl-C, a CI timeout's SIGTERM, a closed terminal's SIGHUP): the
//! guards that delete them on drop (`Topology`, the failover pair) run on
//! a panic, not when a signal ends the process, which would leave the
//! namespaces, their routers' pins (the maps' kernel memory) and the
//! processes in them (VRRP still sent inside) behind.
//!
//! A signal handler only writes the signal's number to a pipe; a thread of
//! the kit reads it, removes every namespace still registered (what runs
//! in it killed, its router detached, its files removed) and ends the
//! process as the signal would have. Installed only where the process has
//! no handler of its own for these signals (the benchmark has one).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, Once};

/// The namespaces this process created and has not deleted yet.
static LIVE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The pipe's writing end (the handler's only use of anything).
static PIPE_W: AtomicI32 = AtomicI32::new(-1);

const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// Registers namespace `name`, just created by this process: removed if a
/// signal ends the process before [`forget`].
pub fn register(name: &str) {
    install();
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(name.to_owned());
}

/// Namespace `name` is deleted (or about to be, by its guard).
pub fn forget(name: &str) {
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .retain(|n| n != name);
}

extern "C" fn on_signal(sig: libc::c_int) {
    let byte = u8::try_from(sig).unwrap_or(0);
    // SAFETY: write(2) is async-signal-safe; the fd is the pipe's (or -1,
    // which fails harmlessly).
    unsafe {
        libc::write(PIPE_W.load(Ordering::Relaxed), (&raw const byte).cast(), 1);
    }
}

fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: sigaction queries and sets with zeroed structs we own;
        // pipe2 into a local array.
        unsafe {
            for sig in SIGNALS {
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, std::ptr::null(), &raw mut old);
                if old.sa_sigaction != libc::SIG_DFL {
                    // The process handles it itself (the benchmark).
                    return;
                }
            }
            let mut fds = [0 as libc::c_int; 2];
            if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return;
            }
            PIPE_W.store(fds[1], Ordering::Relaxed);
            let read_fd = fds[0];
            std::thread::Builder::new()
                .name("namespace guard".into())
                .spawn(move || wait_and_clean(read_fd))
                .ok();
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&raw mut act.sa_mask);
            for sig in SIGNALS {
                libc::sigaction(sig, &raw const act, std::ptr::null_mut());
            }
        }
    });
}

/// Waits for a signal's number on the pipe, removes what is registered,
/// then ends the process with the signal's exit status.
fn wait_and_clean(read_fd: libc::c_int) {
    let mut byte = 0u8;
    // SAFETY: read(2) of one byte into a local from the pipe we made.
    let n = unsafe { libc::read(read_fd, (&raw mut byte).cast(), 1) };
    if n != 1 {
        return;
    }
    let names: Vec<String> = LIVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    eprintln!(
        "test kit: signal {byte}: removing this run's {} namespace(s) before exiting",
        names.len()
    );
    for name in &names {
        remove(name);
    }
    // SAFETY: _exit(2) ends the process without running destructors (the
    // test threads are still running).
    unsafe { libc::_exit(128 + i32::from(byte)) };
}

/// Removes namespace `name` and what of its router is left: its
/// processes killed, its router detached (pins, records), the namespace
/// deleted.
fn remove(name: &str) {
    crate::host::kill_processes_in(name);
    crate::host::remove_router(name);
    let _ = std::process::Command::new("timeout")
        .args(["-k", "2", "20", "ip", "netns", "delete", name])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}
