//! Builds the XDP object for the `BPF_PROG_RUN` tests (same logic as
//! router-ctl's build script).

#[path = "../xtask/src/ebpf_build.rs"]
mod ebpf_build;

fn main() {
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    for p in ["router-ebpf/src", "router-common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(p).display());
    }
    match ebpf_build::build_ebpf(&root) {
        Ok((obj, _)) => println!("cargo:rustc-env=ROUTER_EBPF_OBJ={}", obj.display()),
        Err(e) => panic!("the tests need the XDP object and could not build it: {e}"),
    }
}
