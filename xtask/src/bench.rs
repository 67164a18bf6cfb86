//! `cargo xtask bench [--quick]`: build what the benchmark needs, then run
//! it (tests/examples/bench.rs): kernel forwarding + iptables MASQUERADE
//! against the XDP router on a fresh namespace topology, alternating point
//! by point. Writes `target/bench/report.md`, `results.json` and
//! `throughput.svg`. More options (`--conns 1,10`, `--secs 3`, ...; see
//! `cargo run -p tests --example bench -- --help`) go in the environment
//! variable `XDP_BENCH_ARGS`.

use std::time::Instant;

use crate::{build_ebpf, cargo, is_root, root, setup};

pub fn run(quick: bool) -> Result<(), String> {
    if !is_root() {
        return Err(
            "the benchmark needs root (network namespaces, XDP, BPF_PROG_RUN): run `cargo \
             xtask bench` as root"
                .into(),
        );
    }
    let start = Instant::now();
    setup()?;
    build_ebpf()?;
    // The harness runs target/debug/router-ctl, next to the example binary:
    // both in the dev profile.
    crate::run(
        cargo()
            .current_dir(root())
            .args(["build", "-p", "router-ctl"]),
    )?;
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
    let res = crate::run(&mut cmd);
    eprintln!("bench: {:.0?} in all, build included", start.elapsed());
    res
}
