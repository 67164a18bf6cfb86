//! Link flags of the XDP object.

fn main() {
    // bpf-linker generates the code: let LLVM 22 combine byte accesses of
    // packet headers (byte arrays, alignment 1) into wider loads and
    // stores. The verifier accepts misaligned packet and map-value access
    // where the kernel's architecture handles it
    // (CONFIG_HAVE_EFFICIENT_UNALIGNED_ACCESS: x86-64, arm64); stack
    // accesses stay aligned, LLVM aligns its own stack slots.
    println!("cargo:rustc-link-arg-bins=--cpu-features=+allows-misaligned-mem-access");
    println!("cargo:rerun-if-changed=build.rs");
}
