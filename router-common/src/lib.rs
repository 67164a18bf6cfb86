//! Types shared by the XDP program (`router-ebpf`) and the controller
//! (`router-ctl`), and the pure packet logic both sides use.
//!
//! Everything here is `no_std` so the same code runs in the kernel and is
//! unit-tested on the host.
#![no_std]

#[cfg(any(test, feature = "user"))]
extern crate std;

pub mod bpf_insn;
pub mod checksum;
pub mod flow;
pub mod hdr;
pub mod ipv6;
pub mod lease_cas;
pub mod mapping;
pub mod maps;
pub mod mss;
pub mod nat;
