//! Builds the XDP object so `router-ctl` can embed it with
//! `include_bytes_aligned!`: the binary carries its data path and needs no
//! path to the object at run time. The build step and what it watches are
//! the `ebpf-build` crate's, shared with `cargo xtask build-ebpf`.

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    match ebpf_build::build_for_build_script(&root) {
        Ok(obj) => println!("cargo:rustc-env=ROUTER_EBPF_OBJ={}", obj.display()),
        Err(e) => {
            println!("cargo:warning=building the XDP object failed: {e}");
            panic!("router-ctl embeds the XDP object and could not build it: {e}");
        }
    }
}
