//! `cargo xtask bench [--quick] [-- ARGS]`: build what the benchmark needs,
//! then run it (`router-bench`, the crate in tests/bench): kernel
//! forwarding + iptables MASQUERADE against the XDP router (and, under the
//! live generator, the limit: a minimal XDP forwarder) on fresh namespace
//! topologies, alternating point by point. Writes
//! `target/bench/report.md`, `results.json` and `throughput.svg`
//! (`--quick`: `target/bench-quick/`). ARGS go
//! to router-bench as they are (`cargo xtask bench -- --help` lists them).

use std::time::Instant;

use crate::{cargo, is_root, prepare_topology_run, root};

/// `quick`: the benchmark's `--quick`; `args`: everything after `--`.
pub fn run(quick: bool, args: &[String]) -> Result<(), String> {
    let args = with_quick(quick, args);
    // Help, version and the plan (which runs nothing) need neither root
    // nor the topology's prerequisites, nor a release build.
    if args
        .iter()
        .any(|a| matches!(a.as_str(), "-h" | "--help" | "-V" | "--version" | "--plan"))
    {
        return run_bench(&[], &args);
    }
    if !is_root() {
        return Err(
            "the benchmark needs root (network namespaces, XDP, BPF_PROG_RUN): run `cargo \
             xtask bench` as root"
                .into(),
        );
    }
    let start = Instant::now();
    prepare_topology_run()?;
    let res = run_prepared(&args);
    eprintln!("bench: {:.0?} in all, build included", start.elapsed());
    res
}

/// `args` with the benchmark's `--quick` in front when `quick` (and not
/// already among them: clap refuses a flag given twice).
pub fn with_quick(quick: bool, args: &[String]) -> Vec<String> {
    let add = quick && !args.iter().any(|a| a == "--quick");
    add.then(|| "--quick".to_owned())
        .into_iter()
        .chain(args.iter().cloned())
        .collect()
}

/// The benchmark after [`prepare_topology_run`], with `args`, in the
/// release profile: the harness runs the `router-ctl` next to the
/// benchmark's binary (target/release), so the offload daemon it measures
/// is built as a router owner would deploy it (the debug build spends
/// about three times the CPU per conntrack event).
pub fn run_prepared(args: &[String]) -> Result<(), String> {
    run_bench(&["--release"], args)
}

/// `router-bench` with `args`, built with the `cargo` flags `profile`
/// (`--release`, or none for the dev profile) together with the
/// `router-ctl` it runs.
fn run_bench(profile: &[&str], args: &[String]) -> Result<(), String> {
    crate::run(
        cargo()
            .current_dir(root())
            .args(["build", "-p", "router-ctl", "-p", "router-bench"])
            .args(profile),
    )?;
    let mut cmd = cargo();
    cmd.current_dir(root())
        .args(["run", "-q", "-p", "router-bench"])
        .args(profile)
        .arg("--")
        .args(args);
    // Ctrl-C reaches the benchmark too, which finishes its run, writes what
    // it measured and deletes its namespaces: wait for it instead of dying
    // first. (It installs its own handler, so the inherited "ignore" does
    // not stick.)
    // SAFETY: setting a signal disposition has no preconditions.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    crate::run(&mut cmd)
}
