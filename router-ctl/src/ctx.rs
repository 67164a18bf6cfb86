//! The router a command works on: its network namespace, its pin
//! directory, the staging directory of a fresh attach, and its maps.

use std::path::PathBuf;

use crate::{maps::PinnedMaps, pins::pin_dir};

/// The namespace `-n` named (one per process), for messages that tell
/// the user which command to look with.
static NAMED_NETNS: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// How to list the interfaces router-ctl sees: `ip -n NS link` when `-n`
/// named a namespace, else `ip link` (or that `-n` may be missing).
#[must_use]
pub fn ip_link_hint() -> String {
    match NAMED_NETNS.get() {
        Some(ns) => format!("check `ip -n {ns} link`"),
        None => "check `ip link`, or pass -n NETNS".to_owned(),
    }
}

/// Where `ip netns` keeps the named network namespace `name`.
#[must_use]
pub fn netns_path(name: &str) -> PathBuf {
    std::path::Path::new("/run/netns").join(name)
}

/// The identity (nsfs inode) of the named network namespace `name` as
/// `/run/netns` has it now; `None` if there is none of that name, or its
/// file is not (or no longer) a namespace: `ip netns add` makes the file
/// before it mounts the namespace on it, `ip netns delete` unmounts it
/// before it removes the file, and in between the name is a plain file
/// of `/run` (told by its device: every namespace file is on nsfs).
#[must_use]
pub fn named_netns_inode(name: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    let named = std::fs::metadata(netns_path(name)).ok()?;
    let nsfs = std::fs::metadata("/proc/thread-self/ns/net").ok()?.dev();
    (named.dev() == nsfs).then(|| named.ino())
}

/// The identity (nsfs inode) of the network namespace this thread is in.
#[must_use]
pub fn own_netns_inode() -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/thread-self/ns/net")
        .ok()
        .map(|m| m.ino())
}

/// Where a router lives: its namespace and pin directory.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub netns: Option<String>,
    pub pin_dir: PathBuf,
}

impl Ctx {
    /// The router of `netns` (`None`: the caller's namespace).
    #[must_use]
    pub fn new(netns: Option<String>) -> Self {
        let pin_dir = pin_dir(netns.as_deref());
        if let Some(ns) = &netns {
            let _ = NAMED_NETNS.set(ns.clone());
        }
        Self { netns, pin_dir }
    }

    #[must_use]
    pub fn ns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    /// The maps pinned in this router's pin directory.
    #[must_use]
    pub fn maps(&self) -> PinnedMaps {
        PinnedMaps::at(&self.pin_dir)
    }

    /// The private directory a fresh attach builds its pins in: on the same
    /// bpffs (so a rename moves it into place), outside the pin root (bpffs
    /// forbids dots in names, so it cannot be a hidden sibling).
    #[must_use]
    pub fn tmp_dir(&self) -> PathBuf {
        let name = self.pin_dir.file_name().unwrap_or_default().to_owned();
        let root = self.pin_dir.parent().unwrap_or(&self.pin_dir);
        let staging = root.file_name().map_or_else(
            || "xdp-router-staging".into(),
            |n| format!("{}-staging", n.to_string_lossy()),
        );
        root.with_file_name(staging).join(name)
    }
}
