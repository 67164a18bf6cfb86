//! Builds the XDP object so `router-ctl` can embed it with
//! `include_bytes_aligned!`: the binary carries its data path and needs no
//! path to the object at run time.

#[path = "../xtask/src/ebpf_build.rs"]
mod ebpf_build;

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    for p in [
        "router-ebpf/src",
        "router-ebpf/Cargo.toml",
        "router-common/src",
        "router-common/Cargo.toml",
        "xtask/src/ebpf_build.rs",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    match ebpf_build::build_ebpf(&root) {
        Ok((obj, _)) => println!("cargo:rustc-env=ROUTER_EBPF_OBJ={}", obj.display()),
        Err(e) => {
            println!("cargo:warning=building the XDP object failed: {e}");
            panic!("router-ctl embeds the XDP object and could not build it: {e}");
        }
    }
}
