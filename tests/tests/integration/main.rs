//! The integration tests: one binary, one module per area (the layout of
//! aya's `test/integration-test`). The shared pieces (namespace
//! topologies, frame builders, the `BPF_PROG_RUN` loader, addresses, XDP
//! action names) are the test kit, the `tests` library next to this
//! binary.
//!
//! Tests that need root (network namespaces, veths, BPF) are marked
//! `#[ignore = "needs root: run cargo xtask test"]`: as a normal user they
//! show as ignored with that reason instead of passing without running.
//! `cargo xtask test` runs them as root with `--include-ignored`; to run
//! some by hand, as root:
//! `cargo test -p tests --test integration -- --include-ignored --test-threads=1 FILTER`.

mod apply;
mod ctl;
mod ctl_errors;
mod daemon_links;
mod daemon_run;
mod dashboard;
mod doctor;
mod ebpf_log;
mod failover;
mod flow_counters;
mod generic_mode;
mod ipv6_e2e;
mod lifecycle;
mod live_frames;
mod malformed_corpus;
mod metrics;
mod mss_clamp;
mod nat_behaviour;
mod nat_e2e;
mod offload;
mod offload6;
mod path_mtu;
mod prog_run;
mod prog_run6;
mod reliability;
mod service;
mod shaping;
mod standalone;
mod status_page;
mod tcp_blind_reset;
mod topology;
