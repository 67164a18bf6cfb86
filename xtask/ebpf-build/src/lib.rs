//! Builds `router-ebpf` for `bpfel-unknown-none`: the one eBPF build step
//! of `cargo xtask build-ebpf` and of the build scripts that embed the
//! object (`router-ctl/build.rs`), as aya's `aya-build` is for aya
//! projects. std only, so it is cheap as a build-dependency.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// What the object is built from, relative to the workspace root: a build
/// script that embeds the object runs again when one of these changes.
pub const INPUTS: &[&str] = &[
    "router-ebpf/src",
    "router-ebpf/Cargo.toml",
    "router-ebpf/build.rs",
    "router-common/src",
    "router-common/Cargo.toml",
    "Cargo.lock",
];

/// For a build script: prints `cargo:rerun-if-changed` for every one of
/// [`INPUTS`], builds the object and returns its path.
pub fn build_for_build_script(workspace_root: &Path) -> Result<PathBuf, String> {
    for p in INPUTS {
        println!(
            "cargo:rerun-if-changed={}",
            workspace_root.join(p).display()
        );
    }
    build_ebpf(workspace_root).map(|(obj, _)| obj)
}

/// Which toolchain path built the object.
pub enum Toolchain {
    /// Debian `rustc-web` + prebuilt bpfel core + bpf-linker.
    Debian,
    /// rustup nightly with rust-src (`-Z build-std=core`).
    NightlyBuildStd,
}

impl Toolchain {
    #[must_use]
    pub fn describe(&self) -> &'static str {
        match self {
            Toolchain::Debian => "Debian rustc-web with prebuilt bpfel core (/usr/bin/rustc)",
            Toolchain::NightlyBuildStd => "rustup nightly with -Z build-std=core",
        }
    }
}

fn cargo_bin_dir() -> Option<PathBuf> {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .map(|p| p.join("bin"))
}

fn path_with_cargo_bin() -> std::ffi::OsString {
    let mut paths: Vec<PathBuf> = cargo_bin_dir().into_iter().collect();
    if let Some(p) = env::var_os("PATH") {
        paths.extend(env::split_paths(&p));
    }
    env::join_paths(paths).unwrap_or_default()
}

/// Whether `bpf-linker` is on `PATH` or in `~/.cargo/bin`.
#[must_use]
pub fn has_bpf_linker() -> bool {
    env::split_paths(&path_with_cargo_bin()).any(|d| d.join("bpf-linker").is_file())
}

/// Whether `rustup` has a nightly toolchain with the `rust-src` component
/// (needed for `-Z build-std=core`).
#[must_use]
pub fn nightly_has_rust_src() -> bool {
    Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| {
            let root = String::from_utf8_lossy(&o.stdout).trim().to_owned();
            Path::new(&root)
                .join("lib/rustlib/src/rust/library/core")
                .is_dir()
        })
}

/// Picks the toolchain path available on this machine.
pub fn detect() -> Result<Toolchain, String> {
    if !has_bpf_linker() {
        return Err("bpf-linker not found; run `cargo xtask setup`".into());
    }
    if Path::new("/usr/bin/rustc").is_file()
        && Path::new("/usr/lib/rustlib/bpfel-unknown-none").is_dir()
    {
        return Ok(Toolchain::Debian);
    }
    if nightly_has_rust_src() {
        return Ok(Toolchain::NightlyBuildStd);
    }
    Err(
        "no BPF-capable Rust toolchain (Debian rustc-web + libstd-rust-web-dev-bpf, \
         or rustup nightly with rust-src); run `cargo xtask setup`"
            .into(),
    )
}

/// Builds the object and returns its path and the toolchain used.
pub fn build_ebpf(workspace_root: &Path) -> Result<(PathBuf, Toolchain), String> {
    let toolchain = detect()?;
    let target_dir = workspace_root.join("target/ebpf");
    // Debian path: the cargo that runs us (env CARGO) with Debian's rustc.
    // Nightly path: CARGO names a concrete toolchain's binary, not the rustup
    // proxy, so `+nightly`/RUSTUP_TOOLCHAIN would not reach it; go through
    // `rustup run nightly cargo` instead.
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = match toolchain {
        Toolchain::Debian => Command::new(&cargo),
        Toolchain::NightlyBuildStd => {
            let mut c = Command::new("rustup");
            c.args(["run", "nightly", "cargo"]);
            c
        }
    };
    // A build script's environment describes the host build; none of it
    // applies to the BPF build.
    for (k, _) in env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_CFG_")
            || [
                "RUSTC",
                "RUSTC_WRAPPER",
                "RUSTC_WORKSPACE_WRAPPER",
                "RUSTFLAGS",
                "CARGO_ENCODED_RUSTFLAGS",
                "CARGO_TARGET_DIR",
                "CARGO_BUILD_TARGET",
                "RUSTUP_TOOLCHAIN",
                "CARGO_MAKEFLAGS",
                "TARGET",
                "HOST",
                "OUT_DIR",
            ]
            .contains(&k.as_str())
        {
            cmd.env_remove(&k);
        }
    }
    // In a build script stdout carries `cargo:` directives: send everything
    // the child prints to stderr.
    cmd.current_dir(workspace_root)
        .env("PATH", path_with_cargo_bin())
        .stdout(std::io::stderr());
    match toolchain {
        Toolchain::Debian => {
            cmd.env("RUSTC", "/usr/bin/rustc")
                .env("RUSTC_BOOTSTRAP", "1");
            cmd.arg("build");
        }
        Toolchain::NightlyBuildStd => {
            cmd.args(["build", "-Z", "build-std=core"]);
        }
    }
    cmd.args([
        "--release",
        "--target",
        "bpfel-unknown-none",
        "-p",
        "router-ebpf",
    ])
    .arg("--target-dir")
    .arg(&target_dir);
    let status = cmd.status().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if !status.success() {
        return Err(format!(
            "building router-ebpf with {} failed ({status}); see the compiler output above",
            toolchain.describe()
        ));
    }
    Ok((
        target_dir.join("bpfel-unknown-none/release/router"),
        toolchain,
    ))
}
