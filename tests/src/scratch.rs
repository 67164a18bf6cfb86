//! Scratch directories of a test: made fresh (never one that exists, so no
//! file another user prepared in `/tmp` is followed or overwritten, as
//! root), removed on drop.

use std::path::PathBuf;

/// A scratch directory of one test, mode 0700, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    /// A new directory under the temporary directory, named after `tag`,
    /// this process and its run token.
    ///
    /// # Panics
    /// If no free name is found.
    #[must_use]
    pub fn new(tag: &str) -> Self {
        use std::os::unix::fs::DirBuilderExt as _;
        // A name nobody holds: `create` fails on one that exists (a
        // killed earlier run's, or another's, left alone) and does not
        // follow a symbolic link there.
        let (pid, token) = (std::process::id(), crate::host::run_token());
        (0..1000)
            .map(|n| std::env::temp_dir().join(format!("router-{tag}-{pid}{token}x{n}")))
            .find(|dir| std::fs::DirBuilder::new().mode(0o700).create(dir).is_ok())
            .map(Self)
            .expect("a free scratch directory name")
    }

    /// The path of `name` inside it.
    #[must_use]
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
