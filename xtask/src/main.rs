//! Project tasks: `cargo xtask setup|build-ebpf|clippy|test|demo|bench`.

mod bench;
mod demo;

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use clap::{Parser, Subcommand};

/// Debian packages the build, lints, tests and benchmarks need.
const DEB_PACKAGES: &[&str] = &[
    "rustc-web",
    "libstd-rust-web-dev-bpf",
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "iperf",
    "iputils-ping",
    "iproute2",
    "iptables",
    "ethtool",
    // `openssl speed`: the platform section's crypto figure.
    "openssl",
    "rust-web-clippy",
    "bpftool",
    // Offload mode's tests: the router's firewall and NAT (nftables,
    // iptables-legacy) and the kernel's conntrack as `conntrack -L` shows it.
    "nftables",
    "conntrack",
    // The failover test: VRRP and conntrack state replication between two
    // routers.
    "keepalived",
    "conntrackd",
    // The service test: `systemd-analyze verify` on the shipped unit.
    "systemd",
    // The status page's test loads it in headless Chromium.
    "chromium",
    // `sysctl` in the tests; the hairpin test's capture on failure.
    "procps",
    "tcpdump",
];

/// The bpf-linker release the build is known to work with (LLVM 22).
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Attempts of a step that fetches from the network (a mirror or the
/// registry failing once must not fail a fresh machine's CI run).
const NETWORK_ATTEMPTS: u32 = 3;

/// The Debian compiler packages, not needed where rustup nightly has rust-src.
const DEB_RUSTC_PACKAGES: &[&str] = &["rustc-web", "libstd-rust-web-dev-bpf", "rust-web-clippy"];

/// bpf-linker's build script reads `LLVM_PREFIX`, llvm-sys reads the
/// versioned variable; without both they find Debian's older default
/// llvm-config and linking fails with "unable to find -lLLVM".
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

#[derive(Parser)]
#[command(about = "Build, lint, test and demo the XDP router")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the missing prerequisites (Debian packages, bpf-linker).
    Setup,
    /// Build the XDP object (router-ebpf for bpfel-unknown-none).
    BuildEbpf,
    /// Clippy with -D warnings on the host crates and the eBPF crate.
    Clippy,
    /// Setup, build, clippy, unit tests, the privileged integration tests, then
    /// (unless a test name filter is given) a smoke run of the benchmark.
    Test {
        /// Passed to the integration test binaries (after `--`), e.g. a name filter.
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Make a test topology, attach the router, send traffic, show stats.
    Demo,
    /// Compare the XDP router with kernel forwarding (router-bench; `cargo
    /// xtask bench -- --help` lists its options).
    Bench {
        /// Short runs (the benchmark's own `--quick`).
        #[arg(long)]
        quick: bool,
        /// Passed to router-bench as they are, e.g. `-- --conns 1,100 --secs 3`.
        #[arg(last = true)]
        args: Vec<String>,
    },
}

pub(crate) fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub(crate) fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// [`run`], tried again after 10 s and 20 s if it fails: for steps that
/// fetch from the network.
fn run_retried(cmd: &mut Command) -> Result<(), String> {
    let mut attempt = 1;
    loop {
        match run(cmd) {
            Ok(()) => return Ok(()),
            Err(e) if attempt < NETWORK_ATTEMPTS => {
                eprintln!("setup: {e}; trying again ({attempt} of {NETWORK_ATTEMPTS} failed)");
                std::thread::sleep(std::time::Duration::from_secs(10 * u64::from(attempt)));
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

pub(crate) fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("+ {cmd:?}");
    let st = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed: {st}"))
    }
}

fn deb_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn missing_packages() -> Vec<&'static str> {
    let have_dpkg = Command::new("dpkg-query").arg("--version").output().is_ok();
    // Upstream toolchain instead of Debian's: skip Debian's compiler.
    let skip_rustc = !Path::new("/usr/bin/rustc").is_file() && ebpf_build::nightly_has_rust_src();
    DEB_PACKAGES
        .iter()
        .copied()
        .filter(|p| !(skip_rustc && DEB_RUSTC_PACKAGES.contains(p)))
        .filter(|p| !have_dpkg || !deb_installed(p))
        .collect()
}

fn linker_install_cmd() -> String {
    format!(
        "LLVM_PREFIX={LLVM_PREFIX} LLVM_SYS_221_PREFIX={LLVM_PREFIX} \
         cargo install bpf-linker --version ={BPF_LINKER_VERSION} --locked \
         --no-default-features --features llvm-22"
    )
}

pub(crate) fn setup() -> Result<(), String> {
    let pkgs = missing_packages();
    let linker = !ebpf_build::has_bpf_linker();
    if pkgs.is_empty() && !linker {
        eprintln!("setup: all prerequisites present");
        return Ok(());
    }
    let debian = Path::new("/etc/debian_version").exists()
        && Command::new("apt-get").arg("--version").output().is_ok();
    if !debian || !is_root() {
        let why = if debian {
            "not root"
        } else {
            "not Debian with apt-get"
        };
        eprintln!("setup: cannot install here ({why}). Run these commands:");
        if !pkgs.is_empty() {
            eprintln!("  sudo apt-get update");
            eprintln!(
                "  sudo DEBIAN_FRONTEND=noninteractive apt-get install -y {}",
                pkgs.join(" ")
            );
        }
        if linker {
            eprintln!("  {}", linker_install_cmd());
        }
        return Err(format!(
            "prerequisites missing ({why}): run the commands above, then `cargo xtask setup` again"
        ));
    }
    if !pkgs.is_empty() {
        eprintln!("setup: installing Debian packages: {}", pkgs.join(" "));
        run_retried(Command::new("apt-get").arg("update"))?;
        run_retried(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["-o", "Acquire::Retries=3", "install", "-y"])
                .args(&pkgs),
        )?;
        if pkgs.contains(&"conntrackd") {
            disable_host_conntrackd();
        }
    }
    if !ebpf_build::has_bpf_linker() {
        eprintln!("setup: installing bpf-linker (about 4 minutes on 2 cores)");
        run_retried(
            cargo()
                .env("LLVM_PREFIX", LLVM_PREFIX)
                .env("LLVM_SYS_221_PREFIX", LLVM_PREFIX)
                .args([
                    "install",
                    "bpf-linker",
                    "--version",
                    &format!("={BPF_LINKER_VERSION}"),
                    "--locked",
                    "--no-default-features",
                    "--features",
                    "llvm-22",
                ]),
        )?;
    }
    Ok(())
}

/// Debian enables and starts the conntrackd it installs, a daemon of the
/// host's own conntrack (its events, a stats log, at every boot): the
/// tests run their own in their namespaces. One this setup installed is
/// disabled and stopped (one the machine had before is left alone).
fn disable_host_conntrackd() {
    // `--now` only where systemd runs (PID 1); `disable` alone removes the
    // boot-time link either way.
    let running = std::path::Path::new("/run/systemd/system").exists();
    let mut cmd = Command::new("systemctl");
    cmd.arg("disable");
    if running {
        cmd.arg("--now");
    }
    cmd.arg("conntrackd.service");
    match cmd.status() {
        Ok(s) if s.success() => eprintln!(
            "setup: disabled the host's conntrackd service the package enabled (the tests start \
             their own in their namespaces)"
        ),
        Ok(s) => eprintln!(
            "setup: `systemctl disable conntrackd` failed ({s}): the package may have enabled a \
             conntrackd on the host; disable it with `systemctl disable --now conntrackd`"
        ),
        Err(e) => eprintln!(
            "setup: could not run systemctl ({e}): if the conntrackd package enabled its service, \
             disable it with `systemctl disable --now conntrackd`"
        ),
    }
}

pub(crate) fn build_ebpf() -> Result<PathBuf, String> {
    let (obj, tc) = ebpf_build::build_ebpf(&root())?;
    eprintln!("build-ebpf: built {} with {}", obj.display(), tc.describe());
    Ok(obj)
}

fn clippy() -> Result<(), String> {
    run(cargo().current_dir(root()).args([
        "clippy",
        "--workspace",
        "--exclude",
        "router-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // rustup's `cargo clippy` would swap in its own clippy-driver, which has
    // no bpfel core: call Debian's cargo-clippy directly.
    if Path::new("/usr/bin/cargo-clippy").exists() {
        run(Command::new("/usr/bin/cargo-clippy")
            .current_dir(root().join("router-ebpf"))
            .env("RUSTC", "/usr/bin/rustc")
            .env("RUSTC_BOOTSTRAP", "1")
            .env_remove("RUSTUP_TOOLCHAIN")
            .args([
                "clippy",
                "--release",
                "--target",
                "bpfel-unknown-none",
                "--target-dir",
            ])
            .arg(root().join("target/ebpf"))
            .args(["--", "-D", "warnings"]))?;
    } else {
        eprintln!(
            "clippy: skipping the eBPF crate: /usr/bin/cargo-clippy (Debian rust-web-clippy) \
             is missing; `cargo xtask setup` installs it"
        );
    }
    Ok(())
}

/// What a run in a namespace topology needs: the prerequisites, the XDP
/// object and `target/debug/router-ctl` (the harness runs that one).
pub(crate) fn prepare_topology_run() -> Result<(), String> {
    setup()?;
    build_ebpf()?;
    run(cargo()
        .current_dir(root())
        .args(["build", "-p", "router-ctl"]))?;
    Ok(())
}

fn test(args: &[String]) -> Result<(), String> {
    setup()?;
    build_ebpf()?;
    clippy()?;
    run(cargo().current_dir(root()).args([
        "test",
        "--workspace",
        "--exclude",
        "router-ebpf",
        "--exclude",
        "tests",
    ]))?;
    if !is_root() {
        return Err(
            "the integration tests need root (network namespaces, BPF): run `cargo xtask test` \
             as root"
                .into(),
        );
    }
    run(cargo()
        .current_dir(root())
        .args(["build", "-p", "router-ctl"]))?;
    // The process the kit's signal guard is tested with.
    run(cargo()
        .current_dir(root())
        .args(["build", "-p", "tests", "--example", "guard_child"]))?;
    // Tests that cannot run on this machine record why there (the kit's
    // `tests::skipped`): listed at the end, so a skip shows as one.
    let skipped = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root().join("target"), PathBuf::from)
        .join("debug/skipped-tests.txt");
    let _ = std::fs::remove_file(&skipped);
    // Failing tests append the ends of their messages there (the kit's
    // `tests::record_failures`): printed last, where a long run's output
    // cut to its head and tail still shows why.
    let failed = skipped.with_file_name("failed-tests.txt");
    let _ = std::fs::remove_file(&failed);
    let tested = run(cargo()
        .current_dir(root())
        .args([
            "test",
            "-p",
            "tests",
            "--tests",
            "--",
            "--include-ignored",
            "--test-threads=1",
        ])
        .args(args));
    // Printed last, whatever failed: the benchmark's smoke run below adds
    // what it left out.
    let report_skipped = || {
        if let Ok(list) = std::fs::read_to_string(&skipped) {
            eprintln!(
                "xtask test: {} test(s) SKIPPED on this machine (they passed nothing):\n{list}",
                list.lines().count()
            );
        }
    };
    if tested.is_err() {
        report_skipped();
        if let Ok(said) = std::fs::read_to_string(&failed) {
            eprintln!("xtask test: what the failing tests said (shortened):\n{said}");
        }
    }
    tested?;
    let rest = demo_and_smoke(args);
    report_skipped();
    rest
}

/// After the integration tests, unless a name filter picked some: the
/// demo's walk-through and the benchmark's smoke run.
fn demo_and_smoke(args: &[String]) -> Result<(), String> {
    // A name filter runs just those tests; flags such as --nocapture do not
    // count as one.
    if args.iter().all(|a| a.starts_with('-')) {
        // The demo's walk-through (`cargo xtask demo` without the quick
        // benchmark), 1 s per path: it checks that each path masquerades
        // and that both XDP modes carry the flow, so the README's first
        // command cannot break unnoticed.
        demo::walk_through(&["--secs", "1"])?;
        // The benchmark end to end, smallest settings (about a minute on
        // a quiet machine): every workload on every path, then a check of
        // the three artifacts
        // (written to target/bench-smoke, apart from a real run's). No
        // timing is asserted.
        run(cargo().current_dir(root()).args([
            "run",
            "-q",
            "-p",
            "router-bench",
            "--",
            "--smoke",
        ]))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let res = match Cli::parse().task {
        Task::Setup => setup(),
        Task::BuildEbpf => build_ebpf().map(|_| ()),
        Task::Clippy => clippy(),
        Task::Test { args } => test(&args),
        Task::Demo => demo::run(),
        Task::Bench { quick, args } => bench::run(quick, &args),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
