//! Project tasks: `cargo xtask setup|build-ebpf|test|demo`.

mod ebpf_build;

use std::{
    path::{Path, PathBuf},
    process::{Command, exit},
};

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
    "rust-web-clippy",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("+ {cmd:?}");
    let st = cmd.status().map_err(|e| format!("{cmd:?}: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed: {st}"))
    }
}

fn missing_packages() -> Vec<&'static str> {
    DEB_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect()
}

fn linker_cmd() -> String {
    "LLVM_PREFIX=/usr/lib/llvm-22 LLVM_SYS_221_PREFIX=/usr/lib/llvm-22 \
     cargo install bpf-linker --locked --no-default-features --features llvm-22"
        .into()
}

fn setup() -> Result<(), String> {
    let debian = Path::new("/etc/debian_version").exists();
    let pkgs = missing_packages();
    let linker = ebpf_build::detect().is_err_and(|e| e.contains("bpf-linker"));
    if pkgs.is_empty() && !linker {
        eprintln!("setup: all prerequisites present");
        return Ok(());
    }
    if !debian || !is_root() {
        eprintln!("setup: cannot install here (needs Debian and root). Run:");
        if !pkgs.is_empty() {
            eprintln!(
                "  sudo apt-get update && sudo apt-get install -y {}",
                pkgs.join(" ")
            );
        }
        if linker {
            eprintln!("  {}", linker_cmd());
        }
        return Err("prerequisites missing".into());
    }
    if !pkgs.is_empty() {
        eprintln!("setup: installing Debian packages: {}", pkgs.join(" "));
        run(Command::new("apt-get").arg("update").arg("-qq"))?;
        run(Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-qq"])
            .args(&pkgs))?;
    }
    if ebpf_build::detect().is_err_and(|e| e.contains("bpf-linker")) {
        eprintln!("setup: installing bpf-linker (about 4 minutes on 2 cores)");
        // bpf-linker's build script reads LLVM_PREFIX; llvm-sys reads the
        // versioned variable. Without them it finds an older llvm-config.
        run(Command::new("cargo")
            .env("LLVM_PREFIX", "/usr/lib/llvm-22")
            .env("LLVM_SYS_221_PREFIX", "/usr/lib/llvm-22")
            .args([
                "install",
                "bpf-linker",
                "--locked",
                "--no-default-features",
                "--features",
                "llvm-22",
            ]))?;
    }
    Ok(())
}

fn build_ebpf() -> Result<PathBuf, String> {
    let (obj, tc) = ebpf_build::build_ebpf(&root())?;
    eprintln!("build-ebpf: built {} with {}", obj.display(), tc.describe());
    Ok(obj)
}

fn clippy() -> Result<(), String> {
    run(Command::new("cargo").current_dir(root()).args([
        "clippy",
        "--workspace",
        "--exclude",
        "router-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
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
            "clippy: skipping the eBPF crate: /usr/bin/cargo-clippy (rust-web-clippy) missing"
        );
    }
    Ok(())
}

fn test(filter: &[String]) -> Result<(), String> {
    setup()?;
    build_ebpf()?;
    clippy()?;
    run(Command::new("cargo").current_dir(root()).args([
        "test",
        "--workspace",
        "--exclude",
        "router-ebpf",
        "--exclude",
        "tests",
    ]))?;
    if !is_root() {
        return Err(
            "the integration tests need root (network namespaces, BPF); rerun as root".into(),
        );
    }
    run(Command::new("cargo")
        .current_dir(root())
        .args(["build", "-p", "router-ctl"]))?;
    run(Command::new("cargo")
        .current_dir(root())
        .args(["test", "-p", "tests", "--tests", "--"])
        .args(filter)
        .arg("--test-threads=1"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let res = match args.first().map(String::as_str) {
        Some("setup") => setup(),
        Some("build-ebpf") => build_ebpf().map(|_| ()),
        Some("clippy") => clippy(),
        Some("test") => test(&args[1..]),
        Some("demo") => demo(),
        _ => {
            eprintln!("usage: cargo xtask setup|build-ebpf|clippy|test [FILTER]|demo");
            exit(2);
        }
    };
    if let Err(e) = res {
        eprintln!("xtask: {e}");
        exit(1);
    }
}

fn demo() -> Result<(), String> {
    setup()?;
    build_ebpf()?;
    run(Command::new("cargo")
        .current_dir(root())
        .args(["build", "-p", "router-ctl"]))?;
    // The demo is the end-to-end forwarding test with its output shown:
    // topology, attach, traffic, stats.
    run(Command::new("cargo").current_dir(root()).args([
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
