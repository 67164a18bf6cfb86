//! The test kit of the XDP NAT router, shared by the integration tests
//! (`tests/tests/integration`), the benchmark and the demo; every shared
//! constant and helper is defined here once:
//! - [`addr`]: the topology's addresses and interface names;
//! - [`topology`]: client(s) -- router -- server in network namespaces
//!   (unique names, deleted on drop, also after a panic);
//! - [`frames`]: frame builders, frame offsets and checksum checks;
//! - [`prog`]: the XDP object loaded for `BPF_PROG_RUN`, XDP action names;
//! - [`rawbpf`]: small programs assembled from raw instructions;
//! - [`stun`]: a STUN-style server and client classifying NAT mapping and
//!   filtering behaviour (RFC 5780's tests), with a rendezvous service;
//! - [`two_routers`]: two LANs behind two routers on a shared internet
//!   (peer-to-peer tests);
//! - [`packet`]: `AF_PACKET` sockets capturing one interface's packets;
//! - [`v6`]: IPv6 addresses in the topology and crafted IPv6 frames;
//! - [`host`], [`netns`], [`echo`]: host commands, entering a namespace,
//!   echo servers and clients;
//! - [`sockopt`]: the socket options `socket2` does not offer.

pub mod addr;
pub mod bench_topology;
pub mod echo;
pub mod frames;
pub mod guard;
pub mod host;
pub mod netns;
pub mod packet;
pub mod prog;
pub mod rawbpf;
pub mod scratch;
pub mod sockopt;
pub mod stun;
pub mod topology;
pub mod trafficgen;
pub mod two_routers;
pub mod v6;

pub use addr::{
    BRIDGE_IF, CLIENT_ADDR, CLIENT2_ADDR, HOST_IF, LAN_IF, LOCK_DIR, PIN_ROOT, ROUTER_LAN_ADDR,
    ROUTER_WAN_ADDR, SERVER_ADDR, STATE_DIR, WAN_IF, forget_detached_router, socket_addr,
};
pub use echo::EchoServer;
pub use host::{
    is_root, kernel_at_least, kill_processes_in, name_is_free, netns_exists, parse_snmp,
    record_failures, router_ctl_bin, run_token, skipped,
};
pub use scratch::Scratch;
pub use topology::{Ns, Topology, counter_delta, counter_of, pattern};
