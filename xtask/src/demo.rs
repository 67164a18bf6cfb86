//! `cargo xtask demo`: the end-to-end forwarding scenario with its output
//! shown (topology, attach, traffic, stats).

use crate::{build_ebpf, cargo, root, setup};

pub fn run() -> Result<(), String> {
    setup()?;
    build_ebpf()?;
    crate::run(
        cargo()
            .current_dir(root())
            .args(["build", "-p", "router-ctl"]),
    )?;
    crate::run(cargo().current_dir(root()).args([
        "test",
        "-p",
        "tests",
        "--test",
        "forwarding",
        "--",
        "--nocapture",
        "--test-threads=1",
    ]))?;
    eprintln!("demo: comparison with the kernel path: not yet (benchmark issue)");
    Ok(())
}
