//! Two home networks behind two routers on a shared "internet", for
//! peer-to-peer tests:
//!
//! ```text
//! client (192.168.50.2) -- router (wan0 203.0.113.1)  --+
//!                                                        br0 "internet" (server: 203.0.113.2, the rendezvous)
//! cli3   (192.168.50.2) -- rtr2   (wan0 203.0.113.21) --+
//! ```
//!
//! Both LANs use the same private addresses, as two homes do. The
//! internet is a bridge in the server's namespace; the server's address
//! sits on the bridge. Namespaces are a [`Topology`]'s: unique names,
//! deleted on drop (both routers detached first), also after a panic.

use std::net::Ipv4Addr;

use crate::addr::{
    BRIDGE_IF, CLIENT_ADDR, HOST_IF, LAN_IF, ROUTER_LAN_ADDR, ROUTER_WAN_ADDR, SERVER_ADDR, WAN_IF,
};
use crate::host::run_ok;
use crate::topology::{Ns, Topology};

/// WAN address of the second router ([`Ns::Router2`]).
pub const ROUTER2_WAN_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 21);

/// The routers of this topology with their WAN addresses.
pub const ROUTERS: [(Ns, Ipv4Addr); 2] = [
    (Ns::Router, ROUTER_WAN_ADDR),
    (Ns::Router2, ROUTER2_WAN_ADDR),
];

/// Builds the topology (nothing attached yet).
#[must_use]
pub fn two_routers() -> Topology {
    let t = Topology::alloc(&[
        Ns::Client,
        Ns::Router,
        Ns::Router2Client,
        Ns::Router2,
        Ns::Server,
    ]);
    // `t` is a live local from here on: a panic during setup drops it and
    // deletes the namespaces already created.
    t.create_namespaces();
    let srv = t.ns_name(Ns::Server);
    run_ok(&["ip", "-n", srv, "link", "add", BRIDGE_IF, "type", "bridge"]);
    for ((router, wan_addr), (host, port)) in ROUTERS
        .into_iter()
        .zip([(Ns::Client, "p1"), (Ns::Router2Client, "p2")])
    {
        let (rtr, cli) = (t.ns_name(router), t.ns_name(host));
        run_ok(&[
            "ip", "-n", rtr, "link", "add", LAN_IF, "type", "veth", "peer", "name", HOST_IF,
            "netns", cli,
        ]);
        run_ok(&[
            "ip", "-n", rtr, "link", "add", WAN_IF, "type", "veth", "peer", "name", port, "netns",
            srv,
        ]);
        run_ok(&["ip", "-n", srv, "link", "set", port, "master", BRIDGE_IF]);
        run_ok(&["ip", "-n", srv, "link", "set", port, "up"]);
        // The router XDP-redirects into its wan0, whose peer is this port.
        t.switch_port_offloads(Ns::Server, port);
        t.setup_client(host, CLIENT_ADDR);
        address_router(&t, router, wan_addr);
    }
    let srv_addr = format!("{SERVER_ADDR}/24");
    run_ok(&["ip", "-n", srv, "addr", "add", &srv_addr, "dev", BRIDGE_IF]);
    run_ok(&["ip", "-n", srv, "link", "set", BRIDGE_IF, "up"]);
    // The server's own datagrams leave through the bridge: complete
    // checksums for them too (see `Topology::host_offloads`).
    t.exec_ok(Ns::Server, &["ethtool", "-K", BRIDGE_IF, "tx", "off"]);
    t
}

fn address_router(t: &Topology, router: Ns, wan_addr: Ipv4Addr) {
    let rtr = t.ns_name(router);
    let lan = format!("{ROUTER_LAN_ADDR}/24");
    let wan = format!("{wan_addr}/24");
    run_ok(&["ip", "-n", rtr, "addr", "add", &lan, "dev", LAN_IF]);
    run_ok(&["ip", "-n", rtr, "addr", "add", &wan, "dev", WAN_IF]);
    run_ok(&["ip", "-n", rtr, "link", "set", LAN_IF, "up"]);
    run_ok(&["ip", "-n", rtr, "link", "set", WAN_IF, "up"]);
    // bpf_fib_lookup reports "forwarding disabled" unless forwarding is on.
    t.exec_ok(router, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
}

/// Lets each router learn the MACs of its LAN host, the server and the
/// other router (the fast path hands packets without a neighbour entry to
/// the kernel, untranslated).
///
/// # Panics
/// If a ping fails.
pub fn warm_neighbours(t: &Topology) {
    for (router, own) in ROUTERS {
        for (_, other) in ROUTERS.into_iter().filter(|(_, a)| *a != own) {
            assert!(t.ping(router, other, 1), "{router:?} cannot ping {other}");
        }
        for h in [CLIENT_ADDR, SERVER_ADDR] {
            assert!(t.ping(router, h, 1), "{router:?} cannot ping {h}");
        }
    }
}
