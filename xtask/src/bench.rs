//! `cargo xtask bench [--quick]`: build what the benchmark needs, then run
//! it (tests/examples/bench.rs): kernel forwarding + iptables MASQUERADE
//! against the XDP router on a fresh namespace topology, alternating point
//! by point. Writes `target/bench/report.md`, `results.json` and
//! `throughput.svg`. More options (`--conns 1,10`, `--secs 3`, ...; see
//! `cargo run -p tests --example bench -- --help`) go in the environment
//! variable `XDP_BENCH_ARGS`.

use std::time::Instant;

use crate::{cargo, is_root, prepare_topology_run, root};

pub fn run(quick: bool) -> Result<(), String> {
    if !is_root() {
        return Err(
            "the benchmark needs root (network namespaces, XDP, BPF_PROG_RUN): run `cargo \
             xtask bench` as root"
                .into(),
        );
    }
    let start = Instant::now();
    prepare_topology_run()?;
    let res = run_prepared(quick);
    eprintln!("bench: {:.0?} in all, build included", start.elapsed());
    res
}

/// The benchmark after [`prepare_topology_run`]. The harness runs
/// target/debug/router-ctl, next to the example binary: both in the dev
/// profile.
pub fn run_prepared(quick: bool) -> Result<(), String> {
    crate::run(
        cargo()
            .current_dir(root())
            .args(["build", "-p", "tests", "--example", "bench"]),
    )?;
    let mut cmd = cargo();
    cmd.current_dir(root())
        .args(["run", "-q", "-p", "tests", "--example", "bench", "--"]);
    if quick {
        cmd.arg("--quick");
    }
    // Ctrl-C reaches the benchmark too, which finishes its run, writes what
    // it measured and deletes its namespaces: wait for it instead of dying
    // first. (It installs its own handler, so the inherited "ignore" does
    // not stick.)
    // SAFETY: setting a signal disposition has no preconditions.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    crate::run(&mut cmd)
}
