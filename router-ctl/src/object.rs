//! The XDP object router-ctl loads: the one embedded at build time (see
//! `build.rs`), or a file given with the hidden `--object` (tests), and
//! its identity (SHA-256 and router-ctl version).

use std::{borrow::Cow, fs, path::Path};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

static EMBEDDED: &[u8] = aya::include_bytes_aligned!(env!("ROUTER_EBPF_OBJ"));

/// The XDP object to load.
pub struct Object {
    pub bytes: Cow<'static, [u8]>,
    pub id: ObjectId,
}

impl Object {
    pub fn load(path: Option<&Path>) -> Result<Self> {
        match path {
            None => Ok(Self {
                bytes: Cow::Borrowed(EMBEDDED),
                id: ObjectId::of(EMBEDDED, "embedded"),
            }),
            Some(p) => {
                let bytes =
                    fs::read(p).with_context(|| format!("reading the object {}", p.display()))?;
                let id = ObjectId::of(&bytes, &p.display().to_string());
                Ok(Self {
                    bytes: Cow::Owned(bytes),
                    id,
                })
            }
        }
    }

    /// The identity of the embedded object (for `--version` and `status`).
    #[must_use]
    pub fn embedded_id() -> ObjectId {
        ObjectId::of(EMBEDDED, "embedded")
    }
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
}
