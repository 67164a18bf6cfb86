//! `cargo xtask demo`: the walk-through (tests/examples/demo.rs: topology,
//! kernel-path run, attach, XDP-path run, stats, conntrack, side by side),
//! then the quick benchmark (`cargo xtask bench --quick`).

use crate::{bench, cargo, prepare_topology_run, root};

pub fn run() -> Result<(), String> {
    prepare_topology_run()?;
    walk_through(&[])?;
    eprintln!("\ndemo: now the quick benchmark (kernel path vs XDP path, a few points)");
    bench::run_prepared(&bench::with_quick(true, &[]))
}

/// The walk-through alone (tests/examples/demo.rs), with its arguments
/// (`--secs N`); `cargo xtask test` runs it as a check.
pub fn walk_through(args: &[&str]) -> Result<(), String> {
    crate::run(
        cargo()
            .current_dir(root())
            .args(["run", "-q", "-p", "tests", "--example", "demo", "--"])
            .args(args),
    )
}
