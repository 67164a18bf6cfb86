//! Two routers, one state: failover with keepalived (VRRP) and conntrackd
//! (FTFW), the XDP fast path in offload mode on both routers.
//!
//! Topology (namespaces unique per run, deleted by [`pair::Pair`]'s drop):
//!
//! ```text
//!   client --[lan: bridge]-- r1.lan0 / r2.lan0      (gateway VIP 192.168.60.1)
//!   server --[wan: bridge]-- r1.wan0 / r2.wan0      (SNAT VIP 198.51.100.1)
//!   r1.sync0 ----------------- r2.sync0             (conntrackd only)
//! ```
//!
//! The firewall, keepalived and conntrackd run from the templates in `examples/failover/`
//! (the test fills their per-router fields), inside the router namespaces
//! (`ip netns exec`), with every file (configs, sockets, lock and pid files,
//! logs) in a temporary directory of the run. One test runs three scenarios
//! in a row and prints their figures: the kernel path alone, the XDP fast
//! path, and the fast path with faster VRRP adverts. Each: a paced TCP
//! stream (every byte checked) and a UDP echo flow run through r1; r1 fails
//! (its LAN, WAN and sync links go down, as if it lost power); r2 takes
//! over; both flows continue; r1 returns and takes the addresses back. The
//! test asserts correctness (no TCP loss, bounded UDP loss, the backup's
//! XDP carries the flows after takeover, r1's after failback), never
//! timing. A second test: a download (the server sends) whose server
//! retransmits while the new master's commit is held back (its conntrackd
//! stopped for 2 s, as a large table's commit would take): the example
//! firewall's input rule keeps the router from answering those segments
//! with a RST, and the download goes on after the commit.
//!
//! - [`pair`]: the namespaces, bridges and links, the routers' firewall,
//!   the processes started and their cleanup, the routers' fast path;
//! - [`ha`]: keepalived and conntrackd from the example templates, and what
//!   they report (notify events, virtual addresses, conntrackd's cache);
//! - [`traffic`]: the TCP stream and the UDP flow, their gaps and losses;
//! - [`scenario`]: one failover and failback, its figures and the table;
//! - [`vmac`]: keepalived `use_vmac` (VRRP on macvlans with the virtual
//!   MACs): the master's XDP forwards frames to them, a former master's
//!   passes them.

mod ha;
mod pair;
mod scenario;
mod traffic;
mod vmac;

use std::net::Ipv4Addr;

use tests::host::run;

use scenario::{download_through_a_slow_commit, report, scenario};

const CLIENT: Ipv4Addr = Ipv4Addr::new(192, 168, 60, 10);
const SERVER: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 100);
const LAN_VIP: Ipv4Addr = Ipv4Addr::new(192, 168, 60, 1);
const WAN_VIP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 1);
const LAN_NET: &str = "192.168.60.0/24";
const SYNC_IF: &str = "sync0";

/// One of the two routers: its namespace role and its own addresses.
#[derive(Clone, Copy, Debug)]
struct Router {
    role: &'static str,
    lan: Ipv4Addr,
    wan: Ipv4Addr,
    sync: Ipv4Addr,
    peer_sync: Ipv4Addr,
    /// keepalived: r1 is preferred (and takes the addresses back).
    priority: u8,
    state: &'static str,
}

const R1: Router = Router {
    role: "r1",
    lan: Ipv4Addr::new(192, 168, 60, 2),
    wan: Ipv4Addr::new(198, 51, 100, 2),
    sync: Ipv4Addr::new(10, 255, 0, 1),
    peer_sync: Ipv4Addr::new(10, 255, 0, 2),
    priority: 150,
    state: "MASTER",
};
const R2: Router = Router {
    role: "r2",
    lan: Ipv4Addr::new(192, 168, 60, 3),
    wan: Ipv4Addr::new(198, 51, 100, 3),
    sync: Ipv4Addr::new(10, 255, 0, 2),
    peer_sync: Ipv4Addr::new(10, 255, 0, 1),
    priority: 100,
    state: "BACKUP",
};

/// The failover test: the kernel path alone, the XDP fast path, and the
/// fast path with 5x faster VRRP adverts, each failing over and back.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn failover_keeps_tcp_and_udp_flows_on_the_fast_path() {
    for bin in ["keepalived", "conntrackd"] {
        assert!(
            run(&["sh", "-c", &format!("command -v {bin}")])
                .status
                .success(),
            "{bin} is not installed (cargo xtask setup installs it)"
        );
    }
    let figs = [
        scenario("kernel path, advert 1 s", false, "1"),
        scenario("XDP offload, advert 1 s", true, "1"),
        scenario("XDP offload, advert 0.2 s", true, "0.2"),
    ];
    println!("{}", report(&figs));
}

/// A download whose server retransmits while the new master's commit is
/// held back (docs/failover.md "Two routers: failover": the firewall's input rule)
/// survives the takeover.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn failover_keeps_a_download_whose_server_retransmits_before_the_commit() {
    let bytes = download_through_a_slow_commit();
    println!("downloaded {bytes} bytes across a takeover with a 2 s commit");
}
