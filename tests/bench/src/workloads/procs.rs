//! Background processes of a run (servers, ping), killed by process group.

use std::process::Child;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tests::{Ns, Topology};

/// A background process of the topology (its own process group) whose
/// exit time a watcher thread records without reaping it, so that it can
/// be killed by group safely until we reap it ourselves.
pub struct Watched {
    child: Child,
    exited: mpsc::Receiver<Instant>,
}

impl Watched {
    fn new(child: Child) -> Self {
        let (tx, rx) = mpsc::channel();
        let pid = child.id();
        std::thread::spawn(move || {
            // SAFETY: waitid with WNOWAIT on our own child leaves it
            // unreaped (its pid cannot be reused while we hold it).
            unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                libc::waitid(
                    libc::P_PID,
                    pid,
                    &raw mut info,
                    libc::WEXITED | libc::WNOWAIT,
                );
            }
            let _ = tx.send(Instant::now());
        });
        Self { child, exited: rx }
    }

    /// When it exited, if it has.
    pub fn exited_at(&self, wait: Duration) -> Option<Instant> {
        self.exited.recv_timeout(wait).ok()
    }

    /// Kills the process group if still running, reaps, returns whether it
    /// exited by itself and how.
    pub fn finish(mut self) -> (Option<Instant>, String) {
        let early = self.exited.try_recv().ok();
        if early.is_none() {
            kill_group(&self.child);
        }
        let st = self
            .child
            .wait()
            .map_or_else(|e| e.to_string(), |s| s.to_string());
        (early, st)
    }
}

/// Kills `child` and its process group with SIGKILL (`ip netns exec`
/// execs `timeout`, which makes itself a group leader).
///
/// The caller must not have reaped `child`: until then neither its pid nor
/// its process group id can belong to anyone else.
pub fn kill_group(child: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: plain syscalls; the ids are ours while the child is unreaped.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Runs `script` with `sh -c` in namespace `ns`, watched.
pub fn spawn_sh(t: &Topology, ns: Ns, script: &str) -> Watched {
    Watched::new(t.spawn(ns, &["sh", "-c", script]))
}
