//! The attach record: what `attach` set up (interfaces, mode, object
//! version, configuration, program id, times), kept outside bpffs so that
//! `status` can tell "never attached" from "the pins were lost" (a reboot,
//! bpffs unmounted). Also the lock that serialises router-ctl runs.

use std::{
    fs,
    io::Write as _,
    os::{
        fd::AsRawFd,
        unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::{
    config::{AdmitMode, RouterConfig},
    object::ObjectId,
};

/// Directory of the attach records.
pub const STATE_DIR: &str = "/var/lib/xdp-router";
/// Directory of the lock files.
pub const LOCK_DIR: &str = "/run/xdp-router";

/// The name a namespace's pins and record go under.
#[must_use]
pub fn ns_key(netns: Option<&str>) -> &str {
    netns.unwrap_or("default")
}

#[must_use]
pub fn state_path(netns: Option<&str>) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{}.json", ns_key(netns)))
}

/// Creates `dir` (and parents) owner-only, refusing one that another
/// user could have prepared ([`check_private`]): the pin, record and lock
/// directories live under `/sys/fs/bpf`, `/run` and `/var/lib`, and a
/// bpffs mounted without a mode (1777, the kernel's default) lets any
/// local user make a directory there before router-ctl does.
pub fn private_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    check_private(dir)?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod 0700 {}", dir.display()))
}

/// Whether `dir` is one only this user controls: a directory (not a
/// symbolic link) owned by this user, in a parent owned by this user or
/// root that no other user may rename entries of (not writable by group or
/// others, or sticky). An error says what to remove (router-ctl's own
/// directory) or to fix (its parent).
pub fn check_private(dir: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    const STICKY: u32 = 0o1000;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let m = fs::symlink_metadata(dir).with_context(|| format!("reading {}", dir.display()))?;
    let planted = |why: String| {
        anyhow::anyhow!(
            "{} {why}: another user may have made it to take over what router-ctl keeps \
             there; remove it (`rm -r {}`) and run the command again",
            dir.display(),
            dir.display()
        )
    };
    if !m.file_type().is_dir() {
        return Err(planted("is not a directory (a symbolic link?)".into()));
    }
    if m.uid() != me {
        return Err(planted(format!("is owned by uid {}, not {me}", m.uid())));
    }
    let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    let p = fs::metadata(parent).with_context(|| format!("reading {}", parent.display()))?;
    let others_may_rename = p.mode() & 0o022 != 0 && p.mode() & STICKY == 0;
    if (p.uid() != me && p.uid() != 0) || others_may_rename {
        // A system directory (/run, /var/lib, the bpffs) is the owner's
        // to fix, never to remove.
        bail!(
            "{} (holding {}) is owned by uid {} with mode {:o}: another user may rename what \
             router-ctl keeps there; make it root's and not writable by others (`chown root \
             {}` and `chmod go-w {}`, or `chmod +t` for a shared directory), and run the \
             command again",
            parent.display(),
            dir.display(),
            p.uid(),
            p.mode() & 0o7777,
            parent.display(),
            parent.display()
        );
    }
    Ok(())
}

/// The temporary file [`write_private`] writes `path` through: its name
/// with `.tmp` appended, so no two files share one.
#[must_use]
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Writes `data` to `path` owner-only (0600) and atomically (a temporary
/// file renamed over it), so a crash leaves the old or the new file.
pub fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().context("path without a directory")?;
    private_dir(dir)?;
    let tmp = tmp_path(path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// A replace that was started and not finished: what it was going to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    pub object: ObjectId,
    pub config: RouterConfig,
    pub prog_id: u32,
    pub started_at: u64,
}

/// The attach record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub format: u32,
    pub netns: Option<String>,
    pub pin_dir: String,
    pub config: RouterConfig,
    /// The mode asked for (`auto`, `native`, `generic`).
    pub requested_mode: String,
    /// The mode each interface got (`native`, `generic`).
    pub lan_mode: String,
    pub wan_mode: String,
    pub object: ObjectId,
    /// The program both links run.
    pub prog_id: u32,
    pub attached_at: u64,
    pub replaced_at: Option<u64>,
    pub replacements: u32,
    pub pending: Option<Pending>,
    /// Standalone mode attached with the netfilter forward rules bypassed
    /// as asked (`--bypass-forward-rules`, `bypass_forward_rules = true`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bypasses_forward_rules: bool,
    /// The forward chains that bypass accepted, as `status` names them
    /// (tool, chain, policy and rule count): a chain not among them, or
    /// one whose rules changed since, is reported as bypassed unasked. A
    /// record with the bypass but without this list (an older router-ctl
    /// wrote it) reports nothing.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bypassed_forward_chains: Vec<String>,
    /// The network namespace the router was attached in (its nsfs inode,
    /// stamped by [`save`]): a namespace deleted and made again under the
    /// same name while the router's pins stayed is another one. `None` in
    /// a record an older router-ctl wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns_inode: Option<u64>,
}

pub const FORMAT: u32 = 1;

impl State {
    /// The forward chains this router's attach accepted bypassing (none:
    /// it bypassed none, so every chain found is bypassed unasked), or
    /// `None` where it accepted whatever there is: a bypass recorded by an
    /// older router-ctl, which kept no list.
    #[must_use]
    pub fn accepted_forward_chains(&self) -> Option<&[String]> {
        (!self.bypasses_forward_rules || !self.bypassed_forward_chains.is_empty())
            .then_some(self.bypassed_forward_chains.as_slice())
    }
}

/// The record, if there is one.
pub fn load(netns: Option<&str>) -> Result<Option<State>> {
    let path = state_path(netns);
    match fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .with_context(|| format!("{} is not a valid attach record", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

pub fn save(netns: Option<&str>, s: &State) -> Result<()> {
    // Every writer works inside the router's namespace.
    let stamped = State {
        netns_inode: crate::ctx::own_netns_inode(),
        ..s.clone()
    };
    let data = serde_json::to_vec_pretty(&stamped)?;
    write_private(&state_path(netns), &data)
}

/// Where detach leaves the admit mode of the router it detached: an attach
/// or `apply` file that states none takes it (`lifecycle::unstated_admit`),
/// so a detach (a resize, an upgrade that changes a map's layout) does not
/// turn a standalone router into an offload one.
fn last_mode_path(netns: Option<&str>) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{}.last-admit", ns_key(netns)))
}

/// Remembers `admit` as the mode of the router just detached.
pub fn save_last_mode(netns: Option<&str>, admit: AdmitMode) -> Result<()> {
    write_private(&last_mode_path(netns), admit.name().as_bytes())
}

/// Forgets the detached router's mode once a router is attached here
/// again (its record says its mode from then on; the next detach notes it
/// anew), so no such file stays for a namespace long gone.
pub fn forget_last_mode(netns: Option<&str>) {
    let _ = fs::remove_file(last_mode_path(netns));
}

/// The mode of the router last detached here, if any.
#[must_use]
pub fn last_mode(netns: Option<&str>) -> Option<AdmitMode> {
    let text = fs::read_to_string(last_mode_path(netns)).ok()?;
    AdmitMode::from_name(text.trim())
}

pub fn remove(netns: Option<&str>) -> Result<()> {
    remove_private(&state_path(netns))
}

/// Removes a file [`write_private`] writes, and the temporary file a write
/// a kill cut short left; one already gone is no error.
pub fn remove_private(path: &Path) -> Result<()> {
    let _ = fs::remove_file(tmp_path(path));
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// An exclusive lock on one router (namespace), held until dropped. Every
/// command that changes a router takes it, so two router-ctl processes
/// never interleave their steps on the same router; routers in other
/// namespaces are not held up.
pub struct Lock {
    /// Held open: the flock lasts as long as the file (closed first on drop).
    file: Option<fs::File>,
    path: PathBuf,
    /// Whether dropping it removes its file first ([`Lock::remove_file`]).
    remove_on_drop: bool,
    /// Termination and stop signals held off while it is held
    /// ([`Lock::holding_signals`]), let through only once it is released.
    signals: Option<crate::signals::SignalsBlocked>,
}

impl Lock {
    /// Holds SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGTSTP off until the lock
    /// is released: a Ctrl-C does not cut the change in half, and neither a
    /// Ctrl-C nor a Ctrl-Z pending at the end acts before the lock is free
    /// (a stopped process holding it would block every other router-ctl).
    #[must_use]
    pub fn holding_signals(mut self) -> Self {
        if self.signals.is_none() {
            self.signals = Some(crate::signals::SignalsBlocked::new());
        }
        self
    }

    /// Removes the lock file while still holding it (`detach`: the router is
    /// gone). A waiter that opened the old file notices that the path no
    /// longer names it once it gets the lock, and starts over.
    pub fn remove_file(mut self) {
        self.remove_on_drop = true;
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // Before the file closes.
        if self.remove_on_drop {
            let _ = fs::remove_file(&self.path);
        }
        // Released, then the signals let through.
        drop(self.file.take());
        drop(self.signals.take());
    }
}

/// Whether `f` is still the file at `path` (not unlinked or replaced).
fn same_file(f: &fs::File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (f.metadata(), fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The router's lock, waiting up to 10 s for another router-ctl to
/// release it.
pub fn lock(netns: Option<&str>) -> Result<Lock> {
    let path = lock_path(netns);
    lock_within(&path, Duration::from_secs(10)).map_err(|e| {
        e.context(format!(
            "another router-ctl is changing this router (it holds {} for more than 10 s{}); \
             wait for it to finish",
            path.display(),
            holder(&path)
        ))
    })
}

/// The lock an `apply` (the command, or a daemon's reload of its file)
/// holds from reading the file to its last rule written, waiting up to
/// `wait` for another one to finish: two applies of different files on
/// one router would otherwise interleave (one file's configuration, the
/// other's port forwards). It is not [`lock`], which the attach inside
/// takes.
pub fn apply_lock(netns: Option<&str>, wait: Duration) -> Result<Lock> {
    let path = apply_lock_path(netns);
    let mut lock = lock_within(&path, wait).map_err(|e| {
        e.context(format!(
            "another `router-ctl apply` (or a daemon's reload of its --config file) is \
             applying a file to this router (it held {} for more than {} s{}); wait for it to \
             finish and try again",
            path.display(),
            wait.as_secs(),
            holder(&path)
        ))
    })?;
    // Removed when the apply ends: it exists only while one runs, so no
    // file stays for a namespace long gone.
    lock.remove_on_drop = true;
    Ok(lock)
}

/// Removes the apply lock's file a killed `apply` left, unless an apply
/// holds it now.
pub fn remove_apply_lock(netns: Option<&str>) {
    if let Ok(Some(mut lock)) = try_lock_at(&apply_lock_path(netns)) {
        lock.remove_on_drop = true;
    }
}

fn apply_lock_path(netns: Option<&str>) -> PathBuf {
    Path::new(LOCK_DIR).join(format!("{}.apply.lock", ns_key(netns)))
}

/// The lock file at `path`, waiting up to `wait` for its holder.
fn lock_within(path: &Path, wait: Duration) -> Result<Lock> {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(lock) = try_lock_at(path)? {
            return Ok(lock);
        }
        if Instant::now() > deadline {
            bail!("{} is held", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn lock_path(netns: Option<&str>) -> PathBuf {
    Path::new(LOCK_DIR).join(format!("{}.lock", ns_key(netns)))
}

/// Whether another process holds the router's lock now (an attach, apply,
/// detach or rule change under way), looked at without waiting and
/// without making the lock file where there is none.
#[must_use]
pub fn held_by_another(netns: Option<&str>) -> bool {
    let Ok(f) = fs::File::open(lock_path(netns)) else {
        return false;
    };
    // SAFETY: flock on a valid fd; a shared lock taken for an instant (an
    // attach waiting for it retries).
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// Who holds the router's lock, for a message: ` (held by pid N,
/// `COMMAND`)`, or empty.
#[must_use]
pub fn lock_holder(netns: Option<&str>) -> String {
    holder(&lock_path(netns))
}

/// The router's lock if no other router-ctl holds it now, else `None`
/// without waiting: the daemon, whose event loop must not stall behind an
/// attach, looks again at its next tick.
pub fn try_lock(netns: Option<&str>) -> Result<Option<Lock>> {
    try_lock_at(&lock_path(netns))
}

/// The lock file at `path` if no other process holds it now.
fn try_lock_at(path: &Path) -> Result<Option<Lock>> {
    private_dir(path.parent().context("lock path without a directory")?)?;
    loop {
        let Some(f) = lock_file(path)? else {
            return Ok(None);
        };
        if same_file(&f, path) {
            return Ok(Some(Lock {
                file: Some(f),
                path: path.to_owned(),
                remove_on_drop: false,
                signals: None,
            }));
        }
        // Removed by its holder meanwhile (a detach, an apply or a daemon
        // that ended): lock the new file.
    }
}

/// Who holds the lock at `path` now, as the kernel's lock table
/// (`/proc/locks`) names it: ` (held by pid N, `COMMAND`)`, with a word
/// when that process is stopped (Ctrl-Z): it holds the lock until it goes
/// on; empty when not known.
fn holder(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = fs::metadata(path) else {
        return String::new();
    };
    let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
    let Some(pid) = fs::read_to_string("/proc/locks")
        .ok()
        .and_then(|t| lock_holder_in(&t, dev, meta.ino()))
    else {
        return String::new();
    };
    let cmd = fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            String::from_utf8_lossy(&c)
                .split('\0')
                .filter(|a| !a.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    let stopped = fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(") ")
                .map(|(_, rest)| rest.starts_with(['T', 't']))
        })
        .unwrap_or(false);
    if stopped {
        format!(
            " (held by pid {pid}, `{cmd}`, which is STOPPED (Ctrl-Z?): `kill -CONT {pid}` lets it \
             finish)"
        )
    } else {
        format!(" (held by pid {pid}, `{cmd}`)")
    }
}

/// The pid holding a flock on the file of device `dev` (major, minor)
/// and inode `ino` in `/proc/locks`'s text (`1: FLOCK  ADVISORY  WRITE
/// 1234 00:1a:5678 0 EOF`, the device in hex; a waiter's line starts `1:
/// -> FLOCK`).
fn lock_holder_in(text: &str, dev: (u32, u32), ino: u64) -> Option<u32> {
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(1) != Some(&"FLOCK") {
            return None;
        }
        let mut id = f.get(5)?.split(':');
        let major = u32::from_str_radix(id.next()?, 16).ok()?;
        let minor = u32::from_str_radix(id.next()?, 16).ok()?;
        let file_ino = id.next()?.parse::<u64>().ok()?;
        ((major, minor) == dev && file_ino == ino)
            .then(|| f.get(4)?.parse().ok())
            .flatten()
    })
}

/// The file at `path` (created 0600), locked exclusively; `None` if
/// another process holds the lock.
fn lock_file(path: &Path) -> Result<Option<fs::File>> {
    let f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("opening the lock {}", path.display()))?;
    // SAFETY: flock on a valid fd.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(f));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(None);
    }
    Err(e).with_context(|| format!("locking {}", path.display()))
}

/// The daemon's lock of the router of `netns`: two daemons on one router
/// would each sweep the other's pending offloads, send the kernel every
/// update twice and overwrite each other's status file.
///
/// Held by a running `router-ctl run` as long as it runs (released by the
/// kernel when it exits, however it exits); dropped (the daemon's end), it
/// removes its file while still holding it, as an apply's lock, so no file
/// stays for a router long gone (one a kill left is taken again by the
/// next daemon).
pub fn daemon_lock(netns: Option<&str>) -> Result<Lock> {
    let path = Path::new(LOCK_DIR).join(format!("{}.daemon.lock", ns_key(netns)));
    let Some(mut lock) = try_lock_at(&path)? else {
        bail!(
            "another `router-ctl run` serves this router (it holds {}{}); `router-ctl status` \
             shows its pid: stop it first (systemctl stop xdp-router, or kill it)",
            path.display(),
            holder(&path)
        );
    };
    lock.remove_on_drop = true;
    Ok(lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory another user could have prepared is refused, with what
    /// to remove: a symbolic link, one in a parent others may rename
    /// entries of, and (as root, who can make one) one of another owner.
    #[test]
    fn a_directory_another_user_could_have_prepared_is_refused() {
        use std::os::unix::fs::{MetadataExt as _, symlink};
        let base = fresh_dir("private");
        let mine = base.join("mine");
        private_dir(&mine).unwrap();
        check_private(&mine).unwrap();
        // Under /tmp (1777: sticky) a directory of one's own is private.
        check_private(&base).unwrap();

        let link = base.join("link");
        symlink(&mine, &link).unwrap();
        let e = format!("{:#}", private_dir(&link).unwrap_err());
        assert!(e.contains("not a directory") && e.contains("rm -r"), "{e}");

        let open_parent = base.join("open");
        fs::create_dir(&open_parent).unwrap();
        fs::set_permissions(&open_parent, fs::Permissions::from_mode(0o777)).unwrap();
        let e = format!("{:#}", private_dir(&open_parent.join("pins")).unwrap_err());
        assert!(
            e.contains("another user may rename") && !e.contains("rm -r"),
            "{e}"
        );

        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let theirs = base.join("theirs");
            fs::create_dir(&theirs).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let e = format!("{:#}", private_dir(&theirs).unwrap_err());
            assert!(e.contains("owned by uid 65534"), "{e}");
            // Nor does router-ctl make it its own (chmod) on the way.
            assert_eq!(fs::metadata(&theirs).unwrap().uid(), 65534);
            // Nor a directory of its own in another user's: they may
            // rename it away and put another in its place.
            fs::set_permissions(&theirs, fs::Permissions::from_mode(0o755)).unwrap();
            let e = format!("{:#}", private_dir(&theirs.join("pins")).unwrap_err());
            assert!(
                e.contains("is owned by uid 65534") && e.contains("chown root"),
                "{e}"
            );
        }
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn every_file_has_a_temporary_of_its_own() {
        let t = |p: &str| tmp_path(Path::new(p)).display().to_string();
        assert_eq!(
            t("/var/lib/xdp-router/ns.json"),
            "/var/lib/xdp-router/ns.json.tmp"
        );
        assert_eq!(
            t("/var/lib/xdp-router/ns.last-admit"),
            "/var/lib/xdp-router/ns.last-admit.tmp"
        );
        assert_eq!(
            t("/run/xdp-router/ns.daemon.json"),
            "/run/xdp-router/ns.daemon.json.tmp"
        );
    }

    /// A lock another holder keeps is waited for, then refused; once
    /// released it is taken (flock: two opens in one process conflict as
    /// two processes do, as an apply and a daemon's reload would).
    #[test]
    fn a_held_lock_is_waited_for_then_refused() {
        let dir = fresh_dir("lock-test");
        let path = dir.join("r.apply.lock");
        let held = lock_within(&path, Duration::ZERO).unwrap();
        // Its holder is named for those who wait, from the kernel's table.
        let named = holder(&path);
        assert!(
            named.starts_with(&format!(" (held by pid {}, `", std::process::id())),
            "{named}"
        );
        let started = Instant::now();
        let refused = lock_within(&path, Duration::from_millis(200));
        assert!(refused.is_err());
        assert!(started.elapsed() >= Duration::from_millis(200));
        drop(held);
        let again = lock_within(&path, Duration::ZERO).unwrap();
        again.remove_file();
        let _ = fs::remove_dir(&dir);
    }

    #[test]
    fn the_lock_table_names_the_holder_not_a_waiter() {
        let t = "1: FLOCK  ADVISORY  WRITE 11 00:2b:777 0 EOF\n\
                 2: FLOCK  ADVISORY  WRITE 4242 00:1a:777 0 EOF\n\
                 2: -> FLOCK  ADVISORY  WRITE 5151 00:1a:777 0 EOF\n\
                 3: POSIX  ADVISORY  WRITE 99 00:1a:888 0 EOF\n";
        // The same inode on another device is another file.
        assert_eq!(lock_holder_in(t, (0, 0x1a), 777), Some(4242));
        assert_eq!(lock_holder_in(t, (0, 0x2b), 777), Some(11));
        assert_eq!(lock_holder_in(t, (0, 0x1a), 888), None);
        assert_eq!(lock_holder_in(t, (0, 0x1a), 1), None);
    }

    #[test]
    fn timeouts_are_recorded_with_cli_names() {
        use router_common::maps::{FlowState, Timeouts};
        let config = RouterConfig {
            admit: crate::config::AdmitMode::Xdp,
            filtering: crate::config::FilteringMode::default(),
            mss_clamp: crate::config::MssClamp::Pmtu,
            lan: "lan0".into(),
            wan: "wan0".into(),
            lan_ifindex: 2,
            wan_ifindex: 3,
            lan_mac: [2, 0, 0, 0, 0, 2],
            wan_mac: [2, 0, 0, 0, 0, 3],
            wan_addr: [203, 0, 113, 1].into(),
            wan_addr_auto: true,
            port_min: 1024,
            port_max: 65535,
            kernel_nat_ports: None,
            max_flows: 1000,
            timeouts: Timeouts {
                icmp: 5,
                ..Timeouts::default()
            },
        };
        let j = serde_json::to_value(&config).unwrap();
        let t = &j["timeouts"];
        assert_eq!(t["icmp"], 5);
        assert_eq!(t["tcp-established"], 432_000);
        assert!(t.get("pad").is_none(), "{t}");
        assert_eq!(j["mss_clamp"], "pmtu");
        for s in FlowState::ALL {
            assert!(t.get(s.key()).is_some(), "{}", s.key());
        }
        let back: RouterConfig = serde_json::from_value(j).unwrap();
        assert_eq!(back, config);
    }

    /// A record written by router-ctl before the timeouts came from the
    /// shared table (format 1, as on disk) still loads.
    #[test]
    fn reads_a_record_of_the_earlier_build() {
        let text = r#"{
  "format": 1,
  "netns": "rtr",
  "pin_dir": "/sys/fs/bpf/xdp-router/rtr",
  "config": {
    "lan": "lan0", "wan": "wan0", "lan_ifindex": 2, "wan_ifindex": 3,
    "wan_addr": "203.0.113.1", "port_min": 1024, "port_max": 65535, "max_flows": 262144,
    "timeouts": {
      "tcp-syn-sent": 120, "tcp-established": 432000, "tcp-fin-wait": 120,
      "tcp-closed": 10, "udp-unreplied": 30, "udp-replied": 120, "icmp": 7
    }
  },
  "requested_mode": "auto", "lan_mode": "native", "wan_mode": "native",
  "object": {"sha256": "ab", "ctl_version": "0.1.0", "source": "embedded"},
  "prog_id": 42, "attached_at": 1700000000, "replaced_at": null, "replacements": 0,
  "pending": null
}"#;
        let s: State = serde_json::from_str(text).unwrap();
        assert_eq!(s.format, FORMAT);
        assert_eq!(s.config.timeouts.icmp, 7);
        assert_eq!(s.config.timeouts.pad, 0);
        assert_eq!(s.config.timeouts.tcp_syn_sent, 120);
        // Recorded before the data path checked the destination MAC: the
        // next attach finds the interfaces' MACs differ and rewrites them.
        assert_eq!(s.config.lan_mac, [0; 6]);
        // Recorded before standalone mode clamped the MSS: its data path
        // did not, so the next attach sees a change and replaces it.
        assert_eq!(s.config.mss_clamp, crate::config::MssClamp::Off);
        // No bypass: every forward chain found is reported.
        assert_eq!(s.accepted_forward_chains(), Some(&[][..]));
        // A bypass recorded without its chains (a build that kept none):
        // whatever there is was accepted.
        let mut s = s;
        s.bypasses_forward_rules = true;
        assert_eq!(s.accepted_forward_chains(), None);
        s.bypassed_forward_chains = vec!["nftables table inet fw chain forward (1 rule)".into()];
        assert_eq!(
            s.accepted_forward_chains(),
            Some(&s.bypassed_forward_chains[..])
        );
    }

    #[test]
    fn private_files_are_0600() {
        let dir = fresh_dir("state").join("sub");
        let p = dir.join("x.json");
        write_private(&p, b"{}").unwrap();
        let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(dmode, 0o700);
        fs::remove_dir_all(dir.parent().unwrap()).unwrap();
    }

    /// A new directory (0700) under the temporary directory: never one that
    /// exists (a test run as root must not follow or empty what another
    /// user prepared there).
    fn fresh_dir(tag: &str) -> PathBuf {
        use std::os::unix::fs::DirBuilderExt as _;
        let pid = std::process::id();
        (0..1000)
            .map(|n| std::env::temp_dir().join(format!("router-ctl-{tag}-{pid}x{n}")))
            .find(|d| fs::DirBuilder::new().mode(0o700).create(d).is_ok())
            .expect("a free directory name")
    }
}
