//! Addresses and interface names of the test topology, each defined once:
//! as `Ipv4Addr` for sockets and commands, and (in [`octets`]) as the byte
//! arrays that frame builders and map keys take.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// Client address (first client in the two-client variant).
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
/// Second client address (two-client variant).
pub const CLIENT2_ADDR: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 3);
/// Router address on the LAN (clients' default gateway).
pub const ROUTER_LAN_ADDR: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 1);
/// Router address on the WAN (the masquerade source).
pub const ROUTER_WAN_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
/// Server address.
pub const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);
/// Router's LAN interface (in the router namespace).
pub const LAN_IF: &str = "lan0";
/// Router's WAN interface (in the router namespace).
pub const WAN_IF: &str = "wan0";
/// Interface name of clients and server in their namespaces.
pub const HOST_IF: &str = "eth0";
/// Bridge in the switch namespace (two-client variant).
pub const BRIDGE_IF: &str = "br0";

/// Where router-ctl pins its links and maps, one directory per namespace.
pub const PIN_ROOT: &str = "/sys/fs/bpf/xdp-router";

/// router-ctl's records (attach records, the mode of a detached router),
/// one set per namespace.
pub const STATE_DIR: &str = "/var/lib/xdp-router";

/// router-ctl's lock files and its daemon's status file, one set per
/// namespace.
pub const LOCK_DIR: &str = "/run/xdp-router";

/// Removes what `router-ctl detach` leaves in [`STATE_DIR`] for the router
/// in namespace `ns` (the mode it had), and its lock files and a killed
/// daemon's status file in [`LOCK_DIR`], once the test is done with it (a
/// router owner's namespace keeps them: a lock file is not removed while
/// another process may hold it).
pub fn forget_detached_router(ns: &str) {
    for leftover in ["last-admit", "last-admit.tmp"] {
        let _ = std::fs::remove_file(format!("{STATE_DIR}/{ns}.{leftover}"));
    }
    for leftover in [
        "lock",
        "apply.lock",
        "daemon.lock",
        "daemon.json",
        "daemon.json.tmp",
    ] {
        let _ = std::fs::remove_file(format!("{LOCK_DIR}/{ns}.{leftover}"));
    }
}

/// [`forget_detached_router`], and at a run's end what else of the
/// router in `ns` (the run's own namespace) may be left: its records and
/// their temporary files, its staging pins, and its pins if a detach
/// failed (said: their maps' memory was held until now).
pub fn forget_router_files(ns: &str) {
    forget_detached_router(ns);
    for leftover in ["json", "json.tmp", "standalone.json", "standalone.json.tmp"] {
        let _ = std::fs::remove_file(format!("{STATE_DIR}/{ns}.{leftover}"));
    }
    let _ = std::fs::remove_dir_all(format!("{PIN_ROOT}-staging/{ns}"));
    let pins = format!("{PIN_ROOT}/{ns}");
    if std::path::Path::new(&pins).exists() {
        eprintln!("test kit: the router's pins in {pins} outlived its detach: removing them");
        let _ = std::fs::remove_dir_all(&pins);
    }
}

/// A LAN address nobody has: the router has no neighbour entry for it.
pub const LAN_NOBODY_ADDR: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 9);
/// A WAN address nobody has: the router has no neighbour entry for it.
pub const WAN_NOBODY_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 9);

/// `ip:port` as a socket address.
#[must_use]
pub fn socket_addr(ip: Ipv4Addr, port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(ip, port))
}

/// The same addresses as byte arrays (network order), derived from the
/// `Ipv4Addr` constants above.
pub mod octets {
    use super::{
        CLIENT_ADDR, CLIENT2_ADDR, LAN_NOBODY_ADDR, ROUTER_LAN_ADDR, ROUTER_WAN_ADDR, SERVER_ADDR,
        WAN_NOBODY_ADDR,
    };

    /// [`CLIENT_ADDR`].
    pub const CLIENT: [u8; 4] = CLIENT_ADDR.octets();
    /// [`CLIENT2_ADDR`].
    pub const CLIENT2: [u8; 4] = CLIENT2_ADDR.octets();
    /// [`ROUTER_LAN_ADDR`].
    pub const ROUTER_LAN: [u8; 4] = ROUTER_LAN_ADDR.octets();
    /// [`ROUTER_WAN_ADDR`]: the masquerade source.
    pub const WAN: [u8; 4] = ROUTER_WAN_ADDR.octets();
    /// [`SERVER_ADDR`].
    pub const SERVER: [u8; 4] = SERVER_ADDR.octets();
    /// [`LAN_NOBODY_ADDR`].
    pub const LAN_NOBODY: [u8; 4] = LAN_NOBODY_ADDR.octets();
    /// [`WAN_NOBODY_ADDR`].
    pub const WAN_NOBODY: [u8; 4] = WAN_NOBODY_ADDR.octets();
}
