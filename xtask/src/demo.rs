//! `cargo xtask demo`: topology, kernel-path run, attach, XDP-path run,
//! stats, conntrack and the side-by-side comparison (tests/examples/demo.rs).

use crate::{build_ebpf, cargo, root, setup};

pub fn run() -> Result<(), String> {
    setup()?;
    build_ebpf()?;
    crate::run(
        cargo()
            .current_dir(root())
            .args(["build", "-p", "router-ctl"]),
    )?;
    crate::run(
        cargo()
            .current_dir(root())
            .args(["run", "-q", "-p", "tests", "--example", "demo"]),
    )
}
