//! Kept only for `tests/build.rs`, which still includes this file with
//! `#[path]`. The eBPF build step is the `ebpf-build` crate
//! (`xtask/ebpf-build`): a build script should depend on it
//! (`[build-dependencies] ebpf-build`) and call
//! `ebpf_build::build_for_build_script`, after which this file goes.

#[path = "../ebpf-build/src/lib.rs"]
#[allow(
    dead_code,
    reason = "tests/build.rs uses only build_ebpf of the crate's items"
)]
mod imp;

pub use imp::*;
