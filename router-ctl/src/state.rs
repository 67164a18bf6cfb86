//! The attach record: what `attach` set up (interfaces, mode, object
//! version, configuration, program id, times), kept outside bpffs so that
//! `status` can tell "never attached" from "the pins were lost" (a reboot,
//! bpffs unmounted). Also the per-namespace lock and the object identity.

use std::{
    fs,
    io::Write as _,
    net::Ipv4Addr,
    os::{
        fd::AsRawFd,
        unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context, Result, bail};
use router_common::maps::Timeouts;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

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

/// Creates `dir` (and parents) owner-only.
pub fn private_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .with_context(|| format!("chmod 0700 {}", dir.display()))
}

/// Writes `data` to `path` owner-only (0600) and atomically (a temporary
/// file renamed over it), so a crash leaves the old or the new file.
pub fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    let dir = path.parent().context("path without a directory")?;
    private_dir(dir)?;
    let tmp = path.with_extension("json.tmp");
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

/// Seconds since the epoch.
#[must_use]
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The identity of an XDP object: its SHA-256 and the router-ctl version
/// that carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectId {
    pub sha256: String,
    pub ctl_version: String,
    /// `embedded` or the path given with `--object`.
    pub source: String,
}

impl ObjectId {
    #[must_use]
    pub fn of(bytes: &[u8], source: &str) -> Self {
        let digest = sha2::Sha256::digest(bytes);
        let sha256 = digest.iter().fold(String::new(), |mut s, b| {
            use std::fmt::Write as _;
            let _ = write!(s, "{b:02x}");
            s
        });
        Self {
            sha256,
            ctl_version: env!("CARGO_PKG_VERSION").to_owned(),
            source: source.to_owned(),
        }
    }

    /// `0.1.0+1a2b3c4d5e6f`: the version and the start of the hash.
    #[must_use]
    pub fn version(&self) -> String {
        format!(
            "{}+{}",
            self.ctl_version,
            &self.sha256[..12.min(self.sha256.len())]
        )
    }

    /// Same object (the source path does not matter).
    #[must_use]
    pub fn same(&self, other: &Self) -> bool {
        self.sha256 == other.sha256 && self.ctl_version == other.ctl_version
    }
}

/// Timeouts with their `--timeout` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct TimeoutsRec {
    pub tcp_syn_sent: u32,
    pub tcp_established: u32,
    pub tcp_fin_wait: u32,
    pub tcp_closed: u32,
    pub udp_unreplied: u32,
    pub udp_replied: u32,
    pub icmp: u32,
}

impl From<Timeouts> for TimeoutsRec {
    fn from(t: Timeouts) -> Self {
        Self {
            tcp_syn_sent: t.tcp_syn_sent,
            tcp_established: t.tcp_established,
            tcp_fin_wait: t.tcp_fin_wait,
            tcp_closed: t.tcp_closed,
            udp_unreplied: t.udp_unreplied,
            udp_replied: t.udp_replied,
            icmp: t.icmp,
        }
    }
}

impl From<TimeoutsRec> for Timeouts {
    fn from(t: TimeoutsRec) -> Self {
        Self {
            tcp_syn_sent: t.tcp_syn_sent,
            tcp_established: t.tcp_established,
            tcp_fin_wait: t.tcp_fin_wait,
            tcp_closed: t.tcp_closed,
            udp_unreplied: t.udp_unreplied,
            udp_replied: t.udp_replied,
            icmp: t.icmp,
            pad: 0,
        }
    }
}

/// The router's configuration as an operator states it (no hash seed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterConfig {
    pub lan: String,
    pub wan: String,
    pub lan_ifindex: u32,
    pub wan_ifindex: u32,
    pub wan_addr: Ipv4Addr,
    pub port_min: u16,
    pub port_max: u16,
    pub max_flows: u32,
    pub timeouts: TimeoutsRec,
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
}

pub const FORMAT: u32 = 1;

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
    let data = serde_json::to_vec_pretty(s)?;
    write_private(&state_path(netns), &data)
}

pub fn remove(netns: Option<&str>) -> Result<()> {
    let path = state_path(netns);
    match fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// An exclusive lock on the routers, held until dropped. Every command
/// that changes a router takes it, so two router-ctl processes never
/// interleave their steps.
pub struct Lock(#[allow(dead_code)] fs::File);

pub fn lock(netns: Option<&str>) -> Result<Lock> {
    // One lock for every namespace: changes are short, and a per-namespace
    // file could never be removed safely (a waiter may hold it open).
    let _ = netns;
    let dir = Path::new(LOCK_DIR);
    private_dir(dir)?;
    let path = dir.join("lock");
    let f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("opening the lock {}", path.display()))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: flock on a valid fd.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(Lock(f));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
        if Instant::now() > deadline {
            bail!(
                "another router-ctl is changing this router (it holds {} for more than 10 s); \
                 wait for it to finish",
                path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_ids() {
        let a = ObjectId::of(b"abc", "embedded");
        assert_eq!(
            a.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            a.version(),
            format!("{}+ba7816bf8f01", env!("CARGO_PKG_VERSION"))
        );
        assert!(a.same(&ObjectId::of(b"abc", "/tmp/x.o")));
        assert!(!a.same(&ObjectId::of(b"abd", "embedded")));
    }

    #[test]
    fn timeouts_round_trip_with_cli_names() {
        let t = Timeouts {
            icmp: 5,
            ..Timeouts::default()
        };
        let r = TimeoutsRec::from(t);
        assert_eq!(Timeouts::from(r), t);
        let j = serde_json::to_value(r).unwrap();
        assert_eq!(j["icmp"], 5);
        assert_eq!(j["tcp-established"], 432_000);
        for k in crate::parse::TIMEOUT_KEYS {
            assert!(j.get(k).is_some(), "{k}");
        }
    }

    #[test]
    fn private_files_are_0600() {
        let dir = std::env::temp_dir().join(format!("router-ctl-state-{}", std::process::id()));
        let p = dir.join("x.json");
        write_private(&p, b"{}").unwrap();
        let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(dmode, 0o700);
        fs::remove_dir_all(&dir).unwrap();
    }
}
