//! `router-ctl run` keeping the attached router in step with the machine:
//! an attached interface's new MAC address goes into the data path's
//! configuration (rtnetlink link notifications), a deleted one is
//! reported, XDP entries a killed daemon left pending are removed when
//! the next one starts, and a detach and new attach are followed without a
//! restart.

use std::{net::UdpSocket, time::Duration};

use aya::maps::{HashMap, Map, MapData};
use router_common::maps::{
    CONNTRACK_MAP, CONNTRACK6_MAP, FLAG_OFFLOADED, FLAG_ORIGINAL, FlowEntry, FlowEntry6, FlowKey,
    FlowKey6, FlowState, IPPROTO_UDP, LEASE_PENDING, Mapping, MappingKey, NAT_MAPPINGS_MAP,
    lease_tick,
};
use serde_json::Value;
use tests::{
    CLIENT_ADDR, HOST_IF, LAN_IF, Ns, ROUTER_LAN_ADDR, ROUTER_WAN_ADDR, SERVER_ADDR, Topology,
    WAN_IF, counter_delta, socket_addr as sa,
};

use crate::{
    ctl::{
        DetachOnDrop, Stream, attach, hold_router_lock, pin_dir, prog_ids, status, stdout,
        wait_for_or_show,
    },
    doctor::{check, doctor},
    metrics::Server,
    offload::{Daemon, Firewall, counter, echoes, install_firewall, offloaded_rows, udp_echo},
};

/// The value of the unlabelled Prometheus sample `name` of one scrape.
fn sample(srv: &Server, name: &str) -> f64 {
    let s = srv.scrape();
    *s.get(name)
        .unwrap_or_else(|| panic!("no sample {name} in {s:?}"))
}

/// The daemon's part of `status --json`.
fn daemon_health(t: &Topology) -> Value {
    status(t).0["daemon"].clone()
}

/// The WAN interface's MAC changes while no daemon runs, the LAN's while
/// it runs (as a user, `NetworkManager` or keepalived changes them): the
/// daemon writes each new one into the configuration and the attach
/// record (the WAN's at its start), so doctor is content, XDP carries the
/// traffic again both ways (not `pass_not_for_us`), and a later attach
/// finds nothing to change.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn daemon_follows_a_mac_change_of_an_attached_interface() {
    const NEW_MAC: &str = "02:00:5e:10:be:ef";
    const NEW_WAN_MAC: &str = "02:00:5e:10:be:f0";
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    println!("{}", attach(&t, &[]));
    t.exec_ok(
        Ns::Router,
        &["ip", "link", "set", "dev", WAN_IF, "address", NEW_WAN_MAC],
    );
    assert_eq!(
        check(&doctor(&t, &[WAN_IF]).0, WAN_IF, "router-mac")["level"],
        "fail"
    );
    let daemon = Daemon::start(&t, &[]);
    // Looked at when it starts, before it says it runs.
    let (v, _) = doctor(&t, &[WAN_IF]);
    assert_eq!(check(&v, WAN_IF, "router-mac")["level"], "ok", "{v}");

    t.exec_ok(
        Ns::Router,
        &["ip", "link", "set", "dev", LAN_IF, "address", NEW_MAC],
    );
    wait_for_or_show(
        "the daemon to write the LAN's new MAC",
        Duration::from_secs(10),
        || check(&doctor(&t, &[LAN_IF, WAN_IF]).0, LAN_IF, "router-mac")["level"] == "ok",
        || format!("{}\ndaemon log:\n{}", doctor(&t, &[LAN_IF]).0, daemon.log()),
    );
    let (v, code) = doctor(&t, &[LAN_IF, WAN_IF]);
    assert_eq!(code, 0, "{v}");
    assert!(
        check(&v, LAN_IF, "router-mac")["detail"]
            .as_str()
            .unwrap()
            .contains(NEW_MAC),
        "{v}"
    );
    // The daemon writes the configuration before it logs the change: wait
    // for the line (seen missing when read right after doctor's answer).
    wait_for_or_show(
        "the daemon to log the LAN's new MAC",
        Duration::from_secs(5),
        || {
            let log = daemon.log();
            log.contains("changed its MAC") && log.contains(NEW_MAC)
        },
        || daemon.log(),
    );

    // The hosts learn the new MACs; XDP carries the traffic again.
    t.exec_ok(Ns::Client, &["ip", "neigh", "flush", "dev", HOST_IF]);
    t.exec_ok(Ns::Server, &["ip", "neigh", "flush", "dev", HOST_IF]);
    // A new MAC flushes the interface's neighbours (neigh_changeaddr): the
    // router learns the hosts' again (the fast path passes packets to a
    // host it has none for).
    t.warm_neighbours();
    let before = t.stats();
    let peer = t.udp_echo_roundtrip(
        Ns::Client,
        Ns::Server,
        tests::socket_addr(tests::SERVER_ADDR, 5321),
    );
    assert_eq!(peer.ip(), std::net::IpAddr::V4(tests::ROUTER_WAN_ADDR));
    let after = t.stats();
    for verdict in ["fwd_outbound", "fwd_inbound"] {
        assert!(
            counter_delta(&before, &after, verdict) >= 1,
            "{verdict}: {after}"
        );
    }
    assert_eq!(counter_delta(&before, &after, "pass_not_for_us"), 0);

    // Counted in the daemon's status (written every tick).
    wait_for_or_show(
        "the status to count the MAC change",
        Duration::from_secs(5),
        || daemon_health(&t)["mac_changes_followed"] == 2,
        || daemon_health(&t).to_string(),
    );
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(text.contains("2 interface MAC changes followed"), "{text}");
    let srv = Server::start(&t);
    assert!((sample(&srv, "xdp_router_daemon_mac_changes_total") - 2.0).abs() < 0.5);
    // The attach record has the new MAC too: attaching again changes nothing.
    let out = attach(&t, &[]);
    assert!(out.contains("nothing changed"), "{out}");
}

/// A next hop of the fast path that changes its MAC without telling the
/// router (no gratuitous ARP or unsolicited advertisement, and the server
/// never asks for the router's MAC: a static entry) while XDP carries a
/// flow to it. No packet of the flow reaches the kernel, so its entry for
/// the server would stay STALE with the old MAC for good and the datagrams
/// go to a MAC nobody has; the daemon has the kernel re-validate it
/// (`neighbours_revalidated`): the unicast probe to the old MAC fails, the
/// kernel resolves the new one, and the datagrams reach the server again.
/// A static entry of a next hop (the client's) stays static.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn daemon_has_a_stale_next_hop_of_the_fast_path_revalidated() {
    stale_next_hop_revalidated(Family::V4);
}

/// [`daemon_has_a_stale_next_hop_of_the_fast_path_revalidated`] over IPv6
/// (neighbour discovery: the probe is a unicast solicitation).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn daemon_has_a_stale_ipv6_next_hop_of_the_fast_path_revalidated() {
    stale_next_hop_revalidated(Family::V6);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

/// The addresses and names one family's test uses.
struct FamilyAddrs {
    client: std::net::IpAddr,
    router_wan: std::net::IpAddr,
    server: std::net::IpAddr,
    any: std::net::IpAddr,
    /// Its sysctl directory (`net.<proto>.neigh`).
    proto: &'static str,
    /// The counter of LAN-to-WAN packets XDP forwards.
    forwarded: &'static str,
}

impl Family {
    fn addrs(self) -> FamilyAddrs {
        use std::net::{Ipv4Addr, Ipv6Addr};
        use tests::v6::{CLIENT6, ROUTER_WAN6, SERVER6};
        match self {
            Self::V4 => FamilyAddrs {
                client: CLIENT_ADDR.into(),
                router_wan: ROUTER_WAN_ADDR.into(),
                server: SERVER_ADDR.into(),
                any: Ipv4Addr::UNSPECIFIED.into(),
                proto: "ipv4",
                forwarded: "fwd_outbound",
            },
            Self::V6 => FamilyAddrs {
                client: CLIENT6.into(),
                router_wan: ROUTER_WAN6.into(),
                server: SERVER6.into(),
                any: Ipv6Addr::UNSPECIFIED.into(),
                proto: "ipv6",
                forwarded: "fwd6_outbound",
            },
        }
    }
}

/// Short neighbour timers on the router's WAN for `proto` (by default
/// 15-45 s to STALE, 5 s before the first probe): 1.5-4.5 s to STALE,
/// never less than the 1 s before the first probe (an entry the kernel
/// used within that goes to DELAY instead, and its probe marks it used
/// again).
fn short_neighbour_timers(t: &Topology, proto: &str) {
    for (key, value) in [
        ("base_reachable_time_ms", "3000"),
        ("delay_first_probe_time", "1"),
        ("retrans_time_ms", "200"),
        ("ucast_solicit", "2"),
    ] {
        let setting = format!("net.{proto}.neigh.{WAN_IF}.{key}={value}");
        t.exec_ok(Ns::Router, &["sysctl", "-qw", &setting]);
    }
}

fn stale_next_hop_revalidated(family: Family) {
    const NEW_SERVER_MAC: &str = "02:00:5e:10:be:f1";
    let v6 = family == Family::V6;
    let FamilyAddrs {
        client: client_addr,
        router_wan,
        server,
        any,
        proto,
        forwarded: forwarded_counter,
    } = family.addrs();
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    if v6 {
        tests::v6::enable(&t);
    }
    short_neighbour_timers(&t, proto);
    let router_mac = mac_of(&t, Ns::Router, WAN_IF);
    let static_router_entry = || static_neighbour(&t, Ns::Server, router_wan, &router_mac, HOST_IF);
    static_router_entry();
    let _srv = udp_echo(
        &t,
        Ns::Server,
        std::net::SocketAddr::new(server, 7000),
        Duration::from_mins(1),
    );
    t.warm_neighbours();
    if v6 {
        tests::v6::resolve_neighbours(&t);
    }
    // A static entry on the router for the client, a next hop of the fast
    // path too: the daemon leaves it as it is.
    let client_mac = mac_of(&t, Ns::Client, HOST_IF);
    static_neighbour(&t, Ns::Router, client_addr, &client_mac, LAN_IF);
    println!("{}", attach(&t, &[]));
    let client = t.in_ns(Ns::Client, || {
        let s = UdpSocket::bind(std::net::SocketAddr::new(any, 42000)).unwrap();
        s.connect(std::net::SocketAddr::new(server, 7000)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        s
    });
    assert_eq!(echoes(&client, 3, Duration::from_millis(50)), 3);
    // STALE before the change: the kernel's last use of the entry (the
    // neighbour warm-up's ping) is past, and it will not use it again
    // unless something makes it.
    let server_entry = || t.exec_ok(Ns::Router, &["ip", "neigh", "show", &server.to_string()]);
    wait_for_or_show(
        "the router's entry for the server to go STALE",
        Duration::from_secs(15),
        || {
            let _ = echoes(&client, 1, Duration::ZERO);
            server_entry().contains("STALE")
        },
        server_entry,
    );
    let forwarded = counter(&t, forwarded_counter);
    t.exec_ok(
        Ns::Server,
        &[
            "ip",
            "link",
            "set",
            "dev",
            HOST_IF,
            "address",
            NEW_SERVER_MAC,
        ],
    );
    // A new MAC flushes the interface's neighbours, static ones too.
    static_router_entry();
    assert_eq!(echoes(&client, 1, Duration::ZERO), 0, "sent to the old MAC");
    assert!(counter(&t, forwarded_counter) > forwarded, "not by XDP");
    let daemon = Daemon::start(&t, &[]);
    wait_for_or_show(
        "the datagrams to reach the server at its new MAC",
        Duration::from_secs(20),
        || echoes(&client, 1, Duration::from_millis(100)) == 1,
        || {
            format!(
                "{}\n{}\n{}",
                t.exec_ok(Ns::Router, &["ip", "neigh", "show", "dev", WAN_IF]),
                daemon_health(&t),
                daemon.log()
            )
        },
    );
    assert!(
        daemon_health(&t)["neighbours_revalidated"]
            .as_u64()
            .is_some_and(|n| n >= 1),
        "{}",
        daemon_health(&t)
    );
    let entry = server_entry();
    assert!(entry.contains(NEW_SERVER_MAC), "{entry}");
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(
        text.contains("stale neighbour(s) of the fast path re-validated"),
        "{text}"
    );
    let entry = t.exec_ok(
        Ns::Router,
        &["ip", "neigh", "show", &client_addr.to_string()],
    );
    assert!(entry.contains("PERMANENT"), "{entry}");
}

/// The MAC address of interface `dev` in namespace `ns`.
fn mac_of(t: &Topology, ns: Ns, dev: &str) -> String {
    let link = t.exec_ok(ns, &["ip", "-br", "link", "show", "dev", dev]);
    link.split_whitespace()
        .nth(2)
        .expect("ip -br link")
        .to_owned()
}

/// A static (permanent) neighbour entry `addr` -> `mac` on `dev` in `ns`.
fn static_neighbour(t: &Topology, ns: Ns, addr: impl Into<std::net::IpAddr>, mac: &str, dev: &str) {
    let addr: std::net::IpAddr = addr.into();
    let addr = addr.to_string();
    let cmd = [
        "ip",
        "neigh",
        "replace",
        &addr,
        "lladdr",
        mac,
        "dev",
        dev,
        "nud",
        "permanent",
    ];
    t.exec_ok(ns, &cmd);
}

/// An attached interface's MAC changes while another router-ctl holds the
/// router's lock (an attach under way) for longer than router-ctl waits
/// for it (10 s): the daemon does not wait for the lock (its event loop
/// would stall, and give up with an error), it follows the change once
/// the lock is free.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn daemon_follows_a_mac_change_once_the_lock_is_free() {
    const NEW_MAC: &str = "02:00:5e:10:be:f1";
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    println!("{}", attach(&t, &[]));
    let daemon = Daemon::start(&t, &[]);
    let lock = hold_router_lock(&t);
    t.exec_ok(
        Ns::Router,
        &["ip", "link", "set", "dev", LAN_IF, "address", NEW_MAC],
    );
    // Longer than a wait for the lock may last.
    std::thread::sleep(Duration::from_secs(12));
    let log = daemon.log();
    assert!(
        !log.contains("another router-ctl is changing this router"),
        "the daemon waited for the lock:\n{log}"
    );
    assert_eq!(daemon_health(&t)["mac_changes_followed"], 0);
    drop(lock);
    wait_for_or_show(
        "the daemon to follow the MAC change once the lock is free",
        Duration::from_secs(10),
        || daemon_health(&t)["mac_changes_followed"] == 1,
        || format!("{}\ndaemon log:\n{}", daemon_health(&t), daemon.log()),
    );
    let (v, code) = doctor(&t, &[LAN_IF]);
    assert_eq!(code, 0, "{v}");
}

/// The LAN interface is deleted while the daemon runs: its XDP program
/// went with it; the daemon says so, in its log and in `status`. A new
/// interface of that name comes back (a re-plugged USB NIC, a bridge the
/// network manager made anew): the daemon gives it a new link, keeping
/// the maps, so a flow opened before goes on through its mapping and
/// through XDP. Without a daemon, `attach` does the same.
#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted sequence: deleted, back, cut short, attach; read top to bottom"
)]
fn daemon_relinks_a_deleted_attached_interface_that_comes_back() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    println!("{}", attach(&t, &[]));
    let daemon = Daemon::start(&t, &[]);
    assert_eq!(daemon_health(&t)["interfaces_gone"], serde_json::json!([]));
    let _srv = udp_echo(
        &t,
        Ns::Server,
        sa(SERVER_ADDR, 7000),
        Duration::from_mins(2),
    );
    let client = t.in_ns(Ns::Client, || {
        let s = UdpSocket::bind(sa(std::net::Ipv4Addr::UNSPECIFIED, 42000)).unwrap();
        s.connect(sa(SERVER_ADDR, 7000)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        s
    });
    assert_eq!(echoes(&client, 3, Duration::from_millis(20)), 3);
    let flow = || {
        t.conntrack()
            .into_iter()
            .find(|f| f["orig_src"] == format!("{CLIENT_ADDR}:42000"))
    };
    let mapped = flow().expect("the client's flow")["xlat_src"].clone();
    let old_lan = config_lan_ifindex(&t, None);

    t.exec_ok(Ns::Router, &["ip", "link", "del", "dev", LAN_IF]);
    wait_for_or_show(
        "the status to report the LAN interface gone",
        Duration::from_secs(10),
        || daemon_health(&t)["interfaces_gone"] == serde_json::json!([format!("{LAN_IF} (LAN)")]),
        || format!("{}\ndaemon log:\n{}", daemon_health(&t), daemon.log()),
    );
    let text = stdout(&t.router_ctl(&["status"]));
    println!("{text}");
    assert!(
        text.contains(&format!("INTERFACE GONE: {LAN_IF} (LAN)"))
            && text.contains("the daemon gives it a new link"),
        "{text}"
    );
    // Its detached link is named from the record, not as "?".
    assert!(
        text.contains(&format!("lan: {LAN_IF} (gone)"))
            && text.contains(&format!("{LAN_IF} is gone: its XDP link"))
            && !text.contains("? (ifindex"),
        "{text}"
    );
    let log = daemon.log();
    assert!(
        log.contains("ERROR") && log.contains("is gone") && log.contains("new link"),
        "{log}"
    );
    let srv = Server::start(&t);
    assert!((sample(&srv, "xdp_router_daemon_interfaces_gone") - 1.0).abs() < 0.5);

    recreate_lan(&t);
    wait_for_or_show(
        "the daemon to give the new LAN interface its link",
        Duration::from_secs(15),
        || {
            let d = daemon_health(&t);
            d["interfaces_relinked"] == 1 && d["interfaces_gone"] == serde_json::json!([])
        },
        || format!("{}\ndaemon log:\n{}", daemon_health(&t), daemon.log()),
    );
    // Followed as the same maps on a new interface, not a new attach.
    wait_for_or_show(
        "the daemon's session to follow the new interface",
        Duration::from_secs(5),
        || daemon.log().contains("following the interface made anew"),
        || daemon.log(),
    );
    assert_eq!(daemon_health(&t)["reattaches_followed"], 0);
    assert!(
        daemon.log().contains("was deleted and is back"),
        "{}",
        daemon.log()
    );
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(
        !text.contains("INTERFACE GONE")
            && !text.contains("is gone")
            && text.contains("1 re-created interface(s) given a new link"),
        "{text}"
    );
    carried_on_by_xdp(&t, &client, &mapped);
    // A relink cut short after its new link took the pin (the
    // configuration still naming the deleted interface): the daemon
    // finds the link on the live interface of the recorded name and has
    // the configuration name it.
    let relinked_lan = config_lan_ifindex(&t, None);
    config_lan_ifindex(&t, Some(old_lan));
    wait_for_or_show(
        "the daemon to have the configuration name the relinked interface",
        Duration::from_secs(15),
        || {
            config_lan_ifindex(&t, None) == relinked_lan
                && daemon_health(&t)["interfaces_gone"] == serde_json::json!([])
        },
        || format!("{}\ndaemon log:\n{}", daemon_health(&t), daemon.log()),
    );
    carried_on_by_xdp(&t, &client, &mapped);
    assert!(sample(&srv, "xdp_router_daemon_interfaces_gone").abs() < 0.5);
    assert!((sample(&srv, "xdp_router_daemon_interfaces_relinked_total") - 2.0).abs() < 0.5);
    // Nothing left for attach to change.
    let out = attach(&t, &[]);
    assert!(out.contains("nothing changed"), "{out}");

    // Without a daemon, attach gives the link.
    drop(daemon);
    t.exec_ok(Ns::Router, &["ip", "link", "del", "dev", LAN_IF]);
    recreate_lan(&t);
    let out = attach(&t, &[]);
    assert!(
        out.contains(&format!("{LAN_IF} (LAN) was deleted and is back"))
            && out.contains("conntrack, counters and rules kept")
            && out.contains("nothing changed"),
        "{out}"
    );
    carried_on_by_xdp(&t, &client, &mapped);
    let (v, code) = doctor(&t, &[LAN_IF, WAN_IF]);
    assert_eq!(code, 0, "{v}");
}

/// The LAN ifindex of the pinned configuration; with `set`, written
/// first (what a relink cut short would leave).
fn config_lan_ifindex(t: &Topology, set: Option<u32>) -> u32 {
    let path = pin_dir(t).join(router_common::maps::CONFIG_MAP);
    let data = MapData::from_pin(&path).unwrap();
    let mut config: aya::maps::Array<MapData, router_common::maps::Config> =
        aya::maps::Array::try_from(Map::Array(data)).unwrap();
    let mut c = config.get(&0, 0).unwrap();
    if let Some(idx) = set {
        c.lan_ifindex = idx;
        config.set(0, c, 0).unwrap();
    }
    c.lan_ifindex
}

/// A new LAN interface of the kit's name, set up as the kit sets one up.
fn recreate_lan(t: &Topology) {
    t.exec_ok(
        Ns::Router,
        &[
            "ip",
            "link",
            "add",
            LAN_IF,
            "type",
            "veth",
            "peer",
            "name",
            HOST_IF,
            "netns",
            t.ns_name(Ns::Client),
        ],
    );
    let lan = format!("{ROUTER_LAN_ADDR}/24");
    t.exec_ok(Ns::Router, &["ip", "addr", "add", &lan, "dev", LAN_IF]);
    t.exec_ok(Ns::Router, &["ip", "link", "set", LAN_IF, "up"]);
    // The client's end as the kit sets one up (GRO on: a veth takes
    // redirected frames only with NAPI, and attach refuses otherwise).
    t.setup_client(Ns::Client, CLIENT_ADDR);
}

/// The client's flow (opened before its interface was made anew) goes on
/// through its mapping `mapped`, both ways through XDP.
fn carried_on_by_xdp(t: &Topology, client: &UdpSocket, mapped: &Value) {
    t.warm_neighbours();
    let before = t.stats();
    let got = echoes(client, 3, Duration::from_millis(20));
    let after = t.stats();
    let changed: Vec<String> = after
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, v)| v["packets"].is_u64() || v["events"].is_u64())
        .filter_map(|(k, _)| {
            let d = counter_delta(&before, &after, k);
            (d > 0).then(|| format!("{k} +{d}"))
        })
        .collect();
    assert_eq!(got, 3, "counters changed: {changed:?}");
    for verdict in ["fwd_outbound", "fwd_inbound"] {
        assert!(
            counter_delta(&before, &after, verdict) >= 3,
            "{verdict}: {after}"
        );
    }
    let row = t
        .conntrack()
        .into_iter()
        .find(|f| f["orig_src"] == format!("{CLIENT_ADDR}:42000"))
        .expect("the client's flow, kept");
    assert_eq!(row["xlat_src"], *mapped, "{row}");
}

/// The router is detached and attached again (new maps) while the daemon
/// runs in offload mode: it says it waits while detached, then re-opens
/// on the new maps, so a new connection is offloaded (XDP carries it)
/// without a restart. A replace of the program, which keeps the maps,
/// re-opens nothing; one that changes the mode re-opens in the new mode.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn daemon_follows_a_detach_and_a_new_attach() {
    let t = Topology::new();
    install_firewall(&t, Firewall::Nftables);
    let _detach = DetachOnDrop(&t);
    let kernel = ["attach", LAN_IF, WAN_IF, "--admit", "kernel"];
    t.router_ctl_ok(&kernel);
    let mut daemon = Daemon::start(&t, &[]);
    let show = || format!("{}\ndaemon log:\n{}", daemon_health(&t), daemon.log());

    // A replace: new program, same maps.
    let prog0 = prog_ids(&status(&t).0)[0];
    let out = t.router_ctl_ok(&[&kernel[..], &["--reload"]].concat());
    assert!(out.contains("replaced"), "{out}");
    let prog1 = prog_ids(&status(&t).0)[0];
    assert_ne!(prog0, prog1);
    // The daemon's tick that opens the new program's debug log follows
    // the attach first.
    wait_for_or_show(
        "the daemon to see the replaced program",
        Duration::from_secs(10),
        || {
            daemon
                .log()
                .contains(&format!("debug log of program {prog1}"))
        },
        show,
    );
    assert!(
        !daemon.log().contains("following the new attach"),
        "{}",
        show()
    );

    t.router_ctl_ok(&["detach"]);
    wait_for_or_show(
        "the daemon to report the router detached",
        Duration::from_secs(10),
        || daemon_health(&t)["detached"] == true,
        show,
    );
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(text.contains("waiting: the router is detached"), "{text}");
    assert_eq!(status(&t).0["daemon"]["detached"], true);
    // Detached, the old maps are orphans (no program reads them): a new
    // connection, which the kernel carries, is not offloaded into them.
    let offloaded = || daemon_health(&t)["offload"]["offloaded"].as_u64();
    let before = offloaded();
    Stream::start(&t, sa(SERVER_ADDR, 7309), 1 << 20, 1.0).finish();
    // Its events are read within a tick; three go by.
    for _ in 0..30 {
        assert_eq!(offloaded(), before, "offloaded while detached\n{}", show());
        std::thread::sleep(Duration::from_millis(100));
    }

    t.router_ctl_ok(&kernel);
    wait_for_or_show(
        "the daemon to follow the new attach",
        Duration::from_secs(10),
        || {
            let d = daemon_health(&t);
            d["reattaches_followed"] == 1 && d["detached"] == false
        },
        show,
    );
    assert!(
        daemon.log().contains("following the new attach"),
        "{}",
        show()
    );
    // Said once while detached, not at every tick.
    assert_eq!(
        daemon.log().matches("the router was detached").count(),
        1,
        "{}",
        show()
    );

    // A new TCP connection: offloaded into the new maps, carried by XDP.
    let dst = sa(SERVER_ADDR, 7310);
    let out0 = counter(&t, "fwd_outbound");
    let stream = Stream::start(&t, dst, 6 << 20, 4.0);
    wait_for_or_show(
        "the new connection to be offloaded",
        Duration::from_secs(10),
        || {
            offloaded_rows(&t)
                .iter()
                .any(|f| f["orig_dst"] == dst.to_string().as_str())
        },
        show,
    );
    stream.finish();
    let carried = counter(&t, "fwd_outbound") - out0;
    assert!(carried > 100, "XDP carried only {carried} packets");
    assert!(daemon_health(&t)["offload"]["offloaded"].as_u64() >= Some(1));

    // A replace that changes the mode (maps kept): followed too, the
    // daemon stops offloading.
    let out = t.router_ctl_ok(&crate::ctl::ATTACH_STANDALONE_BYPASSING);
    assert!(out.contains("replaced"), "{out}");
    wait_for_or_show(
        "the daemon to follow the new mode",
        Duration::from_secs(10),
        || {
            let d = daemon_health(&t);
            d["reattaches_followed"] == 2 && d["admit"] == "xdp"
        },
        show,
    );
    // The counters go on from the first session's.
    assert!(daemon_health(&t)["offload"]["offloaded"].as_u64() >= Some(1));

    stopped_while_detached(&t, &mut daemon);
}

/// `daemon` stopped after a detach it saw: its last line says nothing
/// stays (not that the data path stays attached).
fn stopped_while_detached(t: &Topology, daemon: &mut Daemon) {
    t.router_ctl_ok(&["detach"]);
    crate::ctl::wait_for(
        "the daemon to report the router detached",
        Duration::from_secs(10),
        || daemon_health(t)["detached"] == true,
    );
    daemon.terminate();
    crate::ctl::wait_for("the daemon's last line", Duration::from_secs(5), || {
        daemon.log().contains("stopping; the router is detached")
    });
    assert!(!daemon.log().contains("stays attached"), "{}", daemon.log());
}

/// An XDP conntrack table of the router, opened from its pin.
fn pinned_table<K: aya::Pod, V: aya::Pod>(t: &Topology, name: &str) -> HashMap<MapData, K, V> {
    let path = pin_dir(t).join(name);
    let data = MapData::from_pin(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    HashMap::try_from(Map::from_map_data(data).expect("a map")).expect("a hash map")
}

/// A daemon killed between writing a connection's two entries pending and
/// activating them leaves the pair pending: the data path would pass its
/// packets to the kernel until the entries are evicted. The next daemon
/// removes such pairs (IPv4 and IPv6) once it has offloaded the kernel's
/// table, and counts them; so it does with an active offloaded pair of a
/// connection the kernel does not have (ended while no daemon ran). An
/// entry the data path admitted itself (standalone mode before a switch)
/// stays.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn daemon_start_removes_pairs_left_pending_or_ended() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let mut v4 = pinned_table::<FlowKey, FlowEntry>(&t, CONNTRACK_MAP);
    let mut v6 = pinned_table::<FlowKey6, FlowEntry6>(&t, CONNTRACK6_MAP);
    let entry = |peer: FlowKey, flags: u8, lease: u32| FlowEntry {
        peer,
        state: FlowState::UdpReplied as u8,
        flags: flags | FLAG_OFFLOADED,
        lease,
        ..FlowEntry::default()
    };
    let pair = |v4: &mut HashMap<MapData, FlowKey, FlowEntry>, sport: u16, lease: u32| {
        let orig = FlowKey::new([192, 168, 1, 2], [198, 51, 100, 7], sport, 53, IPPROTO_UDP);
        let reply = FlowKey::new([198, 51, 100, 7], [203, 0, 113, 1], 53, sport, IPPROTO_UDP);
        v4.insert(orig, entry(reply, FLAG_ORIGINAL, lease), 0)
            .unwrap();
        v4.insert(reply, entry(orig, 0, lease), 0).unwrap();
        [orig, reply]
    };
    let left = pair(&mut v4, 40001, LEASE_PENDING);
    // Active for ten minutes, of a flow the kernel no longer has.
    let active = pair(&mut v4, 40002, lease_tick(tests::prog::now_ns()) + 600);
    let admitted_by_xdp = FlowKey::new([192, 168, 1, 3], [198, 51, 100, 7], 40004, 53, IPPROTO_UDP);
    v4.insert(
        admitted_by_xdp,
        FlowEntry {
            flags: FLAG_ORIGINAL,
            ..entry(admitted_by_xdp.reversed(), 0, 0)
        },
        0,
    )
    .unwrap();
    let orig6 = FlowKey6::new([0xfd; 16], [0x20; 16], 40003, 53, IPPROTO_UDP);
    let pending6 = FlowEntry6 {
        state: FlowState::UdpReplied as u8,
        flags: FLAG_OFFLOADED | FLAG_ORIGINAL,
        lease: LEASE_PENDING,
        ..FlowEntry6::default()
    };
    v6.insert(orig6, pending6, 0).unwrap();
    v6.insert(
        orig6.reversed(),
        FlowEntry6 {
            flags: FLAG_OFFLOADED,
            ..pending6
        },
        0,
    )
    .unwrap();

    let daemon = Daemon::start(&t, &[]);
    for k in left {
        assert!(
            v4.get(&k, 0).is_err(),
            "{k:?} still there:\n{}",
            daemon.log()
        );
    }
    for k in [orig6, orig6.reversed()] {
        assert!(
            v6.get(&k, 0).is_err(),
            "{k:?} still there:\n{}",
            daemon.log()
        );
    }
    for k in active {
        assert!(
            v4.get(&k, 0).is_err(),
            "active {k:?} of an ended flow still there:\n{}",
            daemon.log()
        );
    }
    assert!(v4.get(&admitted_by_xdp, 0).is_ok(), "{}", daemon.log());
    let log = daemon.log();
    assert!(log.contains("removed 4 XDP entries left pending"), "{log}");
    assert!(
        log.contains("removed 2 XDP entries offloaded before this session")
            && log.contains("of connections the kernel no longer has"),
        "{log}"
    );
    assert_eq!(daemon_health(&t)["stale_pending_removed"], 4);
    let srv = Server::start(&t);
    assert!((sample(&srv, "xdp_router_daemon_stale_pending_removed_total") - 4.0).abs() < 0.5);
    assert!(sample(&srv, "xdp_router_daemon_log_records_malformed_total").abs() < 0.5);
    assert!(sample(&srv, "xdp_router_daemon_detached").abs() < 0.5);
}

/// Standalone mode with `--wan-addr auto` (the default) and a WAN that is
/// renumbered (a DHCP or PPP lease with a new address): the daemon moves
/// the masquerade to the new address (the data path's configuration, the
/// slow-path NAT table, the attach record), ends the XDP flows translated
/// to the old one, and new flows leave from the new address, carried by
/// XDP both ways.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn daemon_follows_a_new_wan_address() {
    const NEW_WAN: std::net::Ipv4Addr = std::net::Ipv4Addr::new(203, 0, 113, 77);
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let daemon = attached_with_a_flow(&t, 5330);
    let xlat = |t: &Topology| -> Vec<String> {
        t.conntrack()
            .iter()
            .map(|f| f["xlat_src"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    assert!(
        xlat(&t).iter().any(|x| x.starts_with("203.0.113.1:")),
        "{:?}",
        xlat(&t)
    );

    let table = t.exec_ok(Ns::Router, &["nft", "list", "table", "ip", "xdp_router"]);
    assert!(mentions(&table, tests::ROUTER_WAN_ADDR), "{table}");

    // A connection of the kernel's slow path (a fragmented datagram, which
    // XDP passes), translated by the standalone table's snat.
    t.in_ns(Ns::Client, || {
        let s = std::net::UdpSocket::bind(sa(CLIENT_ADDR, 0)).unwrap();
        s.send_to(&[7u8; 3000], sa(SERVER_ADDR, 5332)).unwrap();
    });
    let slow_path = |t: &Topology| {
        let o = t.exec(
            Ns::Router,
            &["conntrack", "-L", "-p", "udp", "--dport", "5332"],
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(
        slow_path(&t).contains("dst=203.0.113.1 "),
        "no slow-path connection: {}",
        slow_path(&t)
    );

    assert!(nat_mappings(&t) >= 1, "no NAT mapping of the flow");

    // The lease changes.
    renumber_wan(&t, NEW_WAN);
    wait_for_wan_follows(&t, &daemon, 1, "the new WAN address");
    let log = daemon.log();
    assert!(
        log.contains(&format!("from {} to {NEW_WAN}", tests::ROUTER_WAN_ADDR)),
        "{log}"
    );
    let (v, _) = status(&t);
    assert_eq!(
        v["record"]["config"]["wan_addr"],
        NEW_WAN.to_string(),
        "{v}"
    );
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(text.contains("1 WAN address changes followed"), "{text}");
    let srv = Server::start(&t);
    assert!((sample(&srv, "xdp_router_daemon_wan_addr_changes_total") - 1.0).abs() < 0.5);
    let table = t.exec_ok(Ns::Router, &["nft", "list", "table", "ip", "xdp_router"]);
    assert!(
        mentions(&table, NEW_WAN) && !mentions(&table, tests::ROUTER_WAN_ADDR),
        "{table}"
    );
    assert!(
        xlat(&t).is_empty(),
        "flows on the old address: {:?}",
        xlat(&t)
    );
    assert!(
        !slow_path(&t).contains("dst=203.0.113.1 "),
        "the slow path's connection kept the old address: {}",
        slow_path(&t)
    );
    // The old address's mappings went with its flows (a TCP one would
    // have held its port for days).
    assert_eq!(nat_mappings(&t), 0, "NAT mappings of the old address left");

    a_new_flow_leaves_from(&t, 5331, NEW_WAN);
    // A flush ends the mappings with the flows.
    assert!(nat_mappings(&t) >= 1, "no NAT mapping of the new flow");
    let out = t.router_ctl_ok(&["conntrack", "flush"]);
    assert!(out.contains("NAT mappings"), "{out}");
    assert_eq!(
        nat_mappings(&t),
        0,
        "NAT mappings left after a flush: {out}"
    );
}

/// Attaches `t`'s router in standalone mode, starts its daemon, and opens
/// a UDP flow to the server's `port`, masqueraded to the WAN address.
fn attached_with_a_flow(t: &Topology, port: u16) -> Daemon {
    println!("{}", attach(t, &[]));
    let daemon = Daemon::start(t, &[]);
    let peer = t.udp_echo_roundtrip(Ns::Client, Ns::Server, sa(SERVER_ADDR, port));
    assert_eq!(peer.ip(), std::net::IpAddr::V4(ROUTER_WAN_ADDR));
    daemon
}

/// A new UDP flow to the server's `port` leaves from `addr`, carried by
/// XDP both ways.
fn a_new_flow_leaves_from(t: &Topology, port: u16, addr: std::net::Ipv4Addr) {
    t.warm_neighbours();
    let before = t.stats();
    let peer = t.udp_echo_roundtrip(Ns::Client, Ns::Server, sa(SERVER_ADDR, port));
    assert_eq!(peer.ip(), std::net::IpAddr::V4(addr));
    let after = t.stats();
    for verdict in ["fwd_outbound", "fwd_inbound"] {
        assert!(
            counter_delta(&before, &after, verdict) >= 1,
            "{verdict}: {after}"
        );
    }
}

/// Waits (10 s at most) for `daemon` to have followed `n` changes of the
/// WAN address, the last being `what`.
fn wait_for_wan_follows(t: &Topology, daemon: &Daemon, n: u64, what: &str) {
    wait_for_or_show(
        &format!("the daemon to follow {what}"),
        Duration::from_secs(10),
        || daemon_health(t)["wan_addr_changes_followed"] == n,
        || format!("{}\ndaemon log:\n{}", daemon_health(t), daemon.log()),
    );
}

/// Moves the WAN from its address to `new` of the same /24: the new one
/// comes, the old one goes (in this order, as systemd-networkd does: one
/// change, no moment without an address, which
/// `daemon_follows_a_wan_left_without_an_address` covers). The new one is
/// a secondary of the old one's subnet, promoted when the old one goes.
fn renumber_wan(t: &Topology, new: std::net::Ipv4Addr) {
    let promote = format!("net.ipv4.conf.{WAN_IF}.promote_secondaries=1");
    t.exec_ok(Ns::Router, &["sysctl", "-qw", &promote]);
    let new_cidr = format!("{new}/24");
    t.exec_ok(Ns::Router, &["ip", "addr", "add", &new_cidr, "dev", WAN_IF]);
    let old_cidr = format!("{ROUTER_WAN_ADDR}/24");
    t.exec_ok(Ns::Router, &["ip", "addr", "del", &old_cidr, "dev", WAN_IF]);
}

/// Gives the router's WAN, which has no address, a route to the server's
/// /24 and the server's MAC (ARP without an address of its own on the link
/// may get none): the fast path and the kernel could both send there, as
/// over a point-to-point link or a static route. Undone by
/// [`unroute_wan_without_address`].
fn route_wan_without_address(t: &Topology) {
    t.exec_ok(
        Ns::Router,
        &["ip", "route", "add", "203.0.113.0/24", "dev", WAN_IF],
    );
    let server = SERVER_ADDR.to_string();
    let mac = tests::prog::mac_str(t.mac(Ns::Server, HOST_IF));
    let neigh = ["neigh", "replace", &server, "lladdr", &mac, "dev", WAN_IF];
    t.exec_ok(
        Ns::Router,
        &[&["ip"][..], &neigh[..], &["nud", "permanent"][..]].concat(),
    );
}

/// Undoes [`route_wan_without_address`]'s route.
fn unroute_wan_without_address(t: &Topology) {
    t.exec_ok(
        Ns::Router,
        &["ip", "route", "del", "203.0.113.0/24", "dev", WAN_IF],
    );
}

/// Sends three datagrams from the client to the server's `port`; the
/// source the server saw the first of arrive with, if any did.
fn datagram_reaches_server(t: &Topology, port: u16) -> Option<std::net::SocketAddr> {
    let received = t.in_ns(Ns::Server, || {
        let s = UdpSocket::bind(sa(SERVER_ADDR, port)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        s
    });
    t.in_ns(Ns::Client, || {
        let s = UdpSocket::bind(sa(CLIENT_ADDR, 0)).unwrap();
        for _ in 0..3 {
            s.send_to(b"datagram", sa(SERVER_ADDR, port)).unwrap();
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let mut buf = [0u8; 64];
    received.recv_from(&mut buf).ok().map(|(_, from)| from)
}

/// A WAN that loses its IPv4 address (`--wan-addr auto`; a DHCP lease
/// lost) is followed to none: the XDP flows and NAT mappings of the old
/// address end, the data path opens no flow from the LAN
/// (`pass_no_wan_addr`) and the slow-path table drops what the kernel would
/// forward to the WAN, so nothing leaves with the old address (here the
/// WAN keeps a route to the server without an address: without the
/// follow, XDP and the slow path's snat send the old address out); an
/// address that comes later is followed, and flows open on it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn daemon_follows_a_wan_left_without_an_address() {
    const NEW_WAN: std::net::Ipv4Addr = std::net::Ipv4Addr::new(203, 0, 113, 78);
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let daemon = attached_with_a_flow(&t, 5340);
    assert!(!t.conntrack().is_empty(), "no XDP flow");
    assert!(nat_mappings(&t) >= 1, "no NAT mapping of the flow");

    let old_cidr = format!("{ROUTER_WAN_ADDR}/24");
    t.exec_ok(Ns::Router, &["ip", "addr", "del", &old_cidr, "dev", WAN_IF]);
    wait_for_wan_follows(&t, &daemon, 1, "the WAN without an address");
    let log = daemon.log();
    assert!(
        log.contains(&format!("lost its IPv4 address {ROUTER_WAN_ADDR}")),
        "{log}"
    );
    let (v, _) = status(&t);
    assert_eq!(v["record"]["config"]["wan_addr"], "0.0.0.0", "{v}");
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(
        text.contains("masquerade to none (the WAN has no IPv4 address)")
            && text.contains(&format!("{WAN_IF} has no IPv4 address")),
        "{text}"
    );
    assert!(t.conntrack().is_empty(), "flows left: {:?}", t.conntrack());
    assert_eq!(nat_mappings(&t), 0, "NAT mappings of the old address left");
    let table = t.exec_ok(Ns::Router, &["nft", "list", "table", "ip", "xdp_router"]);
    assert!(
        !table.contains("snat") && !mentions(&table, ROUTER_WAN_ADDR),
        "{table}"
    );

    // A WAN that still routes without an address: what the LAN sends
    // would leave, with the old address, were it translated.
    route_wan_without_address(&t);
    let before = t.stats();
    let got = datagram_reaches_server(&t, 5341);
    assert_eq!(
        got, None,
        "a datagram left without an address to masquerade to"
    );
    let after = t.stats();
    assert!(
        counter_delta(&before, &after, "pass_no_wan_addr") >= 3,
        "{after}"
    );
    let table = t.exec_ok(Ns::Router, &["nft", "list", "table", "ip", "xdp_router"]);
    let dropped = table
        .split("ip saddr != 0.0.0.0 counter packets ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next()?.parse::<u64>().ok());
    assert!(
        dropped.is_some_and(|n| n >= 3),
        "the slow path did not drop them: {table}"
    );

    // An address again: followed, and flows open on it.
    unroute_wan_without_address(&t);
    t.exec_ok(
        Ns::Router,
        &["ip", "addr", "add", &format!("{NEW_WAN}/24"), "dev", WAN_IF],
    );
    wait_for_wan_follows(&t, &daemon, 2, "the new WAN address");
    assert!(
        daemon
            .log()
            .contains(&format!("has an IPv4 address, {NEW_WAN}, after none")),
        "{}",
        daemon.log()
    );
    a_new_flow_leaves_from(&t, 5342, NEW_WAN);
}

/// The router's NAT mappings (`NAT_MAPPINGS`).
fn nat_mappings(t: &Topology) -> usize {
    pinned_table::<MappingKey, Mapping>(t, NAT_MAPPINGS_MAP)
        .keys()
        .filter_map(Result::ok)
        .count()
}

/// Whether `text` names `addr` (not merely a longer address it begins).
fn mentions(text: &str, addr: std::net::Ipv4Addr) -> bool {
    let a = addr.to_string();
    text.match_indices(&a)
        .any(|(i, _)| !text[i + a.len()..].starts_with(|c: char| c.is_ascii_digit()))
}
