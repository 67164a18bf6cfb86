//! Telling systemd what the daemon does (`Type=notify`): ready, reloading,
//! stopping, a one-line status, and the watchdog. Every call is a no-op
//! outside a unit (no `NOTIFY_SOCKET`); a failed send is logged, never
//! fatal: the router works the same without a service manager.

use sd_notify::NotifyState;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("telling systemd ({states:?}): {e}");
    }
}

/// Started (or reloaded): the file is applied and the daemon serves.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload begins (`systemctl reload` waits for the next [`ready`]).
pub fn reloading() {
    let mut states = vec![NotifyState::Reloading, NotifyState::Status("reloading")];
    // systemd >= 253 wants the time with RELOADING=1; older ones ignore it.
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    send(&states);
}

pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

/// A one-line status for `systemctl status`.
pub fn status(line: &str) {
    send(&[NotifyState::Status(line)]);
}

/// Whether systemd watches this process (`WatchdogSec=`).
#[must_use]
pub fn watchdog_enabled() -> bool {
    sd_notify::watchdog_enabled().is_some()
}

/// The watchdog ping; sent every tick, so a hung loop gets the daemon
/// restarted.
pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}
