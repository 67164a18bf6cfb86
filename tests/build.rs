//! Builds the XDP object for the `BPF_PROG_RUN` tests: the same build step
//! (and list of inputs) as router-ctl's build script, from `ebpf-build`.

fn main() {
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap())
        .parent()
        .unwrap()
        .to_path_buf();
    match ebpf_build::build_for_build_script(&root) {
        Ok(obj) => println!("cargo:rustc-env=ROUTER_EBPF_OBJ={}", obj.display()),
        Err(e) => panic!("the tests need the XDP object and could not build it: {e}"),
    }
}
