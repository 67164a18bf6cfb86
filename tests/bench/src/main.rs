//! `router-bench` (`cargo xtask bench [-- ARGS]`): the XDP NAT router
//! against the kernel's forwarding with iptables MASQUERADE, on one fresh
//! client -- router -- server topology (the server has no route back, so
//! only NAT makes it work), alternating the two paths point by point so
//! noise hits both alike.
//!
//! Workloads (`workloads/`): iperf2 TCP at several `-P` (default length and
//! `-l 128`, with and without `-N`), iperf2 UDP with 64-byte payloads, the
//! in-kernel live-frame generator, ping RTT during every run; TCP with veth
//! offloads off (wire-like) and on (defaults); a frags experiment, a
//! plain-forwarding reference and a `BPF_PROG_RUN` micro-benchmark of the
//! program. Measurement (`measure/`): machine CPU and softirq share, the
//! router's softirq time per packet, the tools' reports. Report
//! (`report/`): `target/bench/report.md`, `results.json`, `throughput.svg`
//! and the performance goals evaluated on the run's figures.
//!
//! Needs root; all traffic stays in the namespaces the topology creates
//! (and deletes on exit, also on panic). `--help` lists the options.

// Counters and nanoseconds here stay far below 2^52; figures are
// rounded for display anyway.
#![allow(clippy::cast_precision_loss, clippy::cast_sign_loss)]

mod cli;
mod measure;
mod model;
mod plan;
mod report;
mod router;
mod run;
mod smoke;
mod workloads;

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Parser;

/// Set by SIGINT/SIGTERM: finish the current run, write what was
/// measured, delete the namespaces.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    const MSG: &[u8] = b"\nbench: interrupted; finishing the current run, then cleaning up\n";
    STOP.store(true, Ordering::SeqCst);
    // SAFETY: write(2) is async-signal-safe; MSG is a static buffer.
    unsafe { libc::write(2, MSG.as_ptr().cast(), MSG.len()) };
}

fn install_signal_handlers() {
    let handler = on_signal as extern "C" fn(libc::c_int);
    // SAFETY: the handler only stores to an atomic and calls write(2).
    unsafe {
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
}

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    let dry_run = cli.plan;
    let o = cli.opts();
    if dry_run {
        print!("{}", plan::render(&o));
        return ExitCode::SUCCESS;
    }
    if !tests::is_root() {
        eprintln!("bench: needs root (network namespaces, BPF): run `sudo cargo xtask bench`");
        return ExitCode::FAILURE;
    }
    // Before any topology exists: a signal only sets STOP, and the run
    // ends through the topology's guard, which deletes its namespaces.
    install_signal_handlers();
    if !o.micro_compare.is_empty() {
        let r = workloads::micro::compare(&o.micro_compare, o.micro_calls, &STOP);
        if let Err(e) = r {
            eprintln!("bench: micro-compare: {e}");
            return ExitCode::FAILURE;
        }
        return ExitCode::SUCCESS;
    }
    if let Err(e) = run::bench(&o, &STOP) {
        eprintln!("bench: {e}");
        return ExitCode::FAILURE;
    }
    if o.smoke {
        match smoke::check_artifacts(&o) {
            Ok((n, left_out)) if left_out.is_empty() => {
                eprintln!("bench: smoke check passed ({n} runs, every path, all artifacts)");
            }
            Ok((n, left_out)) => eprintln!(
                "bench: smoke check passed ({n} runs, every path, all artifacts) with what \
                 this machine cannot run left out: {}",
                left_out.join("; ")
            ),
            Err(e) => {
                eprintln!("bench: smoke check failed: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
