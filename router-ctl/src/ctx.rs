//! The router a command works on: its network namespace, its pin
//! directory, the staging directory of a fresh attach, and its maps.

use std::path::PathBuf;

use crate::{maps::PinnedMaps, pins::pin_dir};

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
