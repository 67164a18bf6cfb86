//! Keeping a state change whole: termination signals held off while it
//! runs, and the crash points the crash-consistency tests stop at.

/// Blocks SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGTSTP until dropped, so
/// Ctrl-C cannot cut a state change in half nor Ctrl-Z stop it midway
/// (they take effect when the change is done; a lock that holds them,
/// [`crate::state::Lock::holding_signals`], is released first).
pub struct SignalsBlocked(libc::sigset_t);

/// The signals [`SignalsBlocked`] holds off.
pub const HELD: [libc::c_int; 5] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGTSTP,
];

impl SignalsBlocked {
    #[must_use]
    pub fn new() -> Self {
        // SAFETY: sigset manipulation on zeroed sets we own.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut set);
            for s in HELD {
                libc::sigaddset(&raw mut set, s);
            }
            libc::sigprocmask(libc::SIG_BLOCK, &raw const set, &raw mut old);
            Self(old)
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in new().
        unsafe {
            libc::sigprocmask(libc::SIG_SETMASK, &raw const self.0, std::ptr::null_mut());
        }
    }
}

/// Stops the process at a named step when `ROUTER_CTL_CRASH_AT` names it:
/// `kill -9` of ourselves, for the crash-consistency tests. When
/// `ROUTER_CTL_SIGNAL_AT` names it (`NAME`, or `NAME:HUP` / `NAME:TERM` /
/// `NAME:TSTP` for another signal), sends ourselves SIGINT there instead (a Ctrl-C at
/// that step: held off while signals are blocked), for the tests of what
/// a signal leaves.
pub fn crash_point(name: &str) {
    if std::env::var("ROUTER_CTL_CRASH_AT").is_ok_and(|v| v == name) {
        eprintln!("router-ctl: crash injected at {name}");
        // SAFETY: plain kill(2) of our own process.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    let Ok(asked) = std::env::var("ROUTER_CTL_SIGNAL_AT") else {
        return;
    };
    let (at, sig) = asked.split_once(':').unwrap_or((&asked, "INT"));
    let signal = match sig {
        "HUP" => libc::SIGHUP,
        "TERM" => libc::SIGTERM,
        "TSTP" => libc::SIGTSTP,
        _ => libc::SIGINT,
    };
    if at == name {
        eprintln!("router-ctl: SIG{sig} injected at {name}");
        // SAFETY: plain kill(2) of our own process.
        unsafe {
            libc::kill(libc::getpid(), signal);
        }
    }
}
