//! `router-ctl doctor`: the veth hazards (no NAPI on the peer, partial
//! checksums from the peer), MTU mismatch, each with its fix; and `attach`
//! warning about them; in standalone mode, the router's own local ports
//! inside XDP's.

use serde_json::Value;
use tests::{HOST_IF, LAN_IF, Ns, Topology, WAN_IF, counter_delta};

use crate::ctl::*;

pub(crate) fn doctor(t: &Topology, args: &[&str]) -> (Value, i32) {
    let mut a = vec!["doctor"];
    a.extend_from_slice(args);
    a.push("--json");
    let o = t.router_ctl(&a);
    let v: Value = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {}{}", stdout(&o), stderr(&o)));
    (v, o.status.code().unwrap_or(-1))
}

pub(crate) fn check<'a>(v: &'a Value, iface: &str, name: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["iface"] == iface && c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check for {iface}: {v}"))
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn doctor_finds_the_veth_hazards_and_says_how_to_fix_them() {
    let t = Topology::new();
    // The harness sets the hosts up right: everything passes.
    let (v, code) = doctor(&t, &[LAN_IF, WAN_IF]);
    println!("{}", stdout(&t.router_ctl(&["doctor", LAN_IF, WAN_IF])));
    assert_eq!(code, 0, "{v}");
    assert_eq!(check(&v, LAN_IF, "redirect-target")["level"], "ok");
    assert_eq!(check(&v, WAN_IF, "tx-checksum")["level"], "ok");
    assert_eq!(check(&v, LAN_IF, "native-xdp")["level"], "ok");

    // Break the client side: GRO off (redirected frames dropped) and tx
    // checksum offload on (partial checksums); shrink the WAN MTU.
    t.exec_ok(
        Ns::Client,
        &["ethtool", "-K", HOST_IF, "gro", "off", "tx", "on"],
    );
    t.exec_ok(
        Ns::Router,
        &["ip", "link", "set", "dev", WAN_IF, "mtu", "1400"],
    );
    let (v, code) = doctor(&t, &[LAN_IF, WAN_IF]);
    println!("{}", stdout(&t.router_ctl(&["doctor", LAN_IF, WAN_IF])));
    assert_eq!(code, 1, "{v}");
    let cli = t.ns_name(Ns::Client);
    let redirect = check(&v, LAN_IF, "redirect-target");
    assert_eq!(redirect["level"], "fail", "{redirect}");
    assert_eq!(
        redirect["fix"],
        format!("ip netns exec {cli} ethtool -K {HOST_IF} gro on").as_str()
    );
    let csum = check(&v, LAN_IF, "tx-checksum");
    assert_eq!(csum["level"], "warn", "{csum}");
    assert_eq!(
        csum["fix"],
        format!("ip netns exec {cli} ethtool -K {HOST_IF} tx off").as_str()
    );
    let mtu = check(&v, WAN_IF, "mtu-mismatch");
    assert_eq!(mtu["level"], "warn", "{mtu}");
    assert!(mtu["fix"].as_str().unwrap().contains("mtu 1400"), "{mtu}");

    // attach checks the same before it changes anything: a peer that
    // would drop every redirected frame refuses a native attach (exit 78)
    // unless forced; forced, or with the rest, it warns.
    t.warm_neighbours();
    let o = ctl_env(&t, &[], &["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{e}");
    assert!(
        e.contains("gro on") && e.contains("--mode generic") && e.contains("--force"),
        "{e}"
    );
    assert!(!t.router_attached(), "a refused attach left pins");
    let o = ctl_env(
        &t,
        &[],
        &["attach", LAN_IF, WAN_IF, "--admit", "xdp", "--force"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    println!("{e}");
    assert!(
        e.contains("gro on") && e.contains("tx off") && e.contains("MTU"),
        "{e}"
    );
    // A generic program's redirect transmits an skb, which the peer takes:
    // nothing to refuse.
    t.router_ctl_ok(&["detach"]);
    let o = ctl_env(
        &t,
        &[],
        &[
            "attach", LAN_IF, WAN_IF, "--admit", "xdp", "--mode", "generic",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The veth checks of `doctor` for `router`'s LAN and WAN interfaces that
/// are not ok (the peer's NAPI and the checksums it sends).
fn veth_hazards(t: &Topology, router: Ns) -> Vec<String> {
    let o = t.router_ctl_in(router, &["doctor", LAN_IF, WAN_IF, "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("doctor --json: {e}: {}{}", stdout(&o), stderr(&o)));
    let checks = v["checks"]
        .as_array()
        .unwrap_or_else(|| panic!("doctor --json has no checks: {v}"));
    // Looked at on both interfaces (a check skipped finds nothing either).
    for iface in [LAN_IF, WAN_IF] {
        for name in ["redirect-target", "tx-checksum"] {
            assert!(
                checks
                    .iter()
                    .any(|c| c["iface"] == iface && c["name"] == name),
                "{router:?}: no {name} check of {iface}: {v}"
            );
        }
    }
    checks
        .iter()
        .filter(|c| c["name"] == "redirect-target" || c["name"] == "tx-checksum")
        .filter(|c| c["level"] != "ok")
        .map(|c| {
            format!(
                "{router:?} {}: {} (fix: {})",
                c["iface"], c["detail"], c["fix"]
            )
        })
        .collect()
}

/// Every topology the kit builds for the fast path is one `doctor` finds
/// no veth hazard in: a switch port that faces a router's XDP interface
/// with tx checksum offload on made TCP through the router stall whenever
/// GRO on the switch merged segments (the hairpin test failed so under
/// load; see `Topology::switch_port_offloads`).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn the_kit_topologies_have_no_veth_hazards() {
    let mut hazards = Vec::new();
    let t = Topology::new();
    hazards.extend(veth_hazards(&t, Ns::Router));
    drop(t);
    let t = Topology::with_two_clients();
    hazards.extend(veth_hazards(&t, Ns::Router));
    drop(t);
    let t = tests::two_routers::two_routers();
    for (router, _) in tests::two_routers::ROUTERS {
        hazards.extend(veth_hazards(&t, router));
    }
    assert!(hazards.is_empty(), "doctor: {hazards:#?}");
}

/// An attached interface whose MAC changes: the data path still compares
/// frames' destinations with the MAC attach wrote (and passes them all to
/// the kernel as `pass_not_for_us`), so doctor fails `router-mac` and says
/// to run attach again; that attach writes the new MAC in place, after
/// which doctor is content and the fast path carries the traffic again.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn doctor_reports_a_mac_changed_since_attach() {
    const NEW_MAC: &str = "02:00:5e:10:be:ef";
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    for iface in [LAN_IF, WAN_IF] {
        assert_eq!(check(&v, iface, "router-mac")["level"], "ok", "{v}");
    }

    t.exec_ok(
        Ns::Router,
        &["ip", "link", "set", "dev", LAN_IF, "address", NEW_MAC],
    );
    let (v, code) = doctor(&t, &[LAN_IF, WAN_IF]);
    println!("{}", stdout(&t.router_ctl(&["doctor", LAN_IF, WAN_IF])));
    assert_eq!(code, 1, "{v}");
    let lan = check(&v, LAN_IF, "router-mac");
    assert_eq!(lan["level"], "fail", "{lan}");
    let detail = lan["detail"].as_str().unwrap();
    assert!(
        detail.contains(NEW_MAC) && detail.contains("pass_not_for_us"),
        "{lan}"
    );
    assert!(lan["fix"].as_str().unwrap().contains("attach"), "{lan}");
    assert_eq!(check(&v, WAN_IF, "router-mac")["level"], "ok", "{v}");

    // The client learns the new MAC; its frames to it go to the kernel.
    t.exec_ok(Ns::Client, &["ip", "neigh", "flush", "dev", HOST_IF]);
    let before = t.stats();
    assert!(t.ping(Ns::Client, tests::ROUTER_LAN_ADDR, 1));
    assert!(counter_delta(&before, &t.stats(), "pass_not_for_us") >= 1);

    let out = attach(&t, &[]);
    println!("{out}");
    assert!(out.contains("new configuration"), "{out}");
    let (v, code) = doctor(&t, &[LAN_IF, WAN_IF]);
    assert_eq!(check(&v, LAN_IF, "router-mac")["level"], "ok", "{v}");
    assert_eq!(code, 0, "{v}");
    let before = t.stats();
    let peer = t.udp_echo_roundtrip(
        Ns::Client,
        Ns::Server,
        tests::socket_addr(tests::SERVER_ADDR, 5320),
    );
    assert_eq!(peer.ip(), std::net::IpAddr::V4(tests::ROUTER_WAN_ADDR));
    let after = t.stats();
    assert!(counter_delta(&before, &after, "fwd_outbound") >= 1);
    assert_eq!(counter_delta(&before, &after, "pass_not_for_us"), 0);
}

/// Standalone mode: with Linux's default `ip_local_port_range`
/// (32768-60999) in the router's namespace, its own sockets take ports
/// inside XDP's default range (1024-60999), so attach and doctor warn and
/// give the kernel NAT's ports as the fix; ports reserved from automatic
/// use (`ip_local_reserved_ports`) do not count; with the fix set, the
/// warning is gone.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn doctor_warns_of_the_routers_own_ports_inside_xdps() {
    const SYSCTL: &str = "net.ipv4.ip_local_port_range";
    const RESERVED: &str = "net.ipv4.ip_local_reserved_ports";
    let t = Topology::new();
    // Not attached: nothing to compare with.
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    assert!(
        !v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "local-ports"),
        "{v}"
    );
    t.warm_neighbours();
    let out = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    assert!(out.status.success(), "attach: {}", stderr(&out));
    let warned = stderr(&out);
    assert!(
        warned.contains("ip_local_port_range") && warned.contains("overlap XDP's --port-range"),
        "attach warns: {warned}"
    );
    let range = t.exec_ok(Ns::Router, &["sysctl", "-n", SYSCTL]);
    assert_eq!(
        range.split_whitespace().collect::<Vec<_>>(),
        ["32768", "60999"],
        "a new namespace's default"
    );
    let (v, code) = doctor(&t, &[LAN_IF, WAN_IF]);
    println!("{}", stdout(&t.router_ctl(&["doctor", LAN_IF, WAN_IF])));
    assert_eq!(code, 0, "a warning, not a failure: {v}");
    let c = check(&v, "sysctl", "local-ports");
    assert_eq!(c["level"], "warn", "{c}");
    let detail = c["detail"].as_str().unwrap();
    assert!(
        detail.contains("32768-60999") && detail.contains("1024-60999"),
        "{c}"
    );
    assert!(
        c["fix"]
            .as_str()
            .unwrap()
            .contains("sysctl -w net.ipv4.ip_local_port_range=\"61000 65535\""),
        "{c}"
    );

    // Reserved ports are not taken automatically: half of the shared ones
    // reserved still warns, all of them does not.
    for (reserved, level) in [("8080,46000-60999", "warn"), ("32768-60999", "ok")] {
        t.exec_ok(
            Ns::Router,
            &["sysctl", "-w", &format!("{RESERVED}={reserved}")],
        );
        let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
        let c = check(&v, "sysctl", "local-ports");
        assert_eq!(c["level"], level, "{reserved}: {c}");
        if level == "warn" {
            assert!(
                c["detail"]
                    .as_str()
                    .unwrap()
                    .contains("in 13232 port(s) not reserved"),
                "{c}"
            );
        }
    }
    t.exec_ok(Ns::Router, &["sysctl", "-w", &format!("{RESERVED}=")]);
    t.exec_ok(
        Ns::Router,
        &["sysctl", "-w", &format!("{SYSCTL}=61000 65535")],
    );
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    let c = check(&v, "sysctl", "local-ports");
    assert_eq!(c["level"], "ok", "{c}");
    assert!(c["fix"].is_null(), "{c}");
}

/// Standalone mode: with `accept_source_route` on for `all` and the WAN
/// (off by default), the kernel re-routes a source-routed packet to the
/// WAN address into the LAN, past the inbound filter: doctor fails the
/// `source-route` check and names both sysctls; with either off it is
/// fine. Offload mode has no such check (its firewall sees the packet).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn doctor_fails_when_the_kernel_accepts_source_routes_in_standalone_mode() {
    let t = Topology::new();
    t.warm_neighbours();
    let out = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    assert!(out.status.success(), "attach: {}", stderr(&out));
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    assert_eq!(check(&v, WAN_IF, "source-route")["level"], "ok", "{v}");
    // No daemon follows the router: said, with what it misses.
    let c = check(&v, "daemon", "not-running");
    assert_eq!(c["level"], "warn", "{c}");
    assert!(c["detail"].as_str().unwrap().contains("next hop"), "{c}");
    let set = |conf: &str, on: u8| {
        t.exec_ok(
            Ns::Router,
            &[
                "sysctl",
                "-w",
                &format!("net.ipv4.conf.{conf}.accept_source_route={on}"),
            ],
        );
    };
    set(WAN_IF, 1);
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    assert_eq!(check(&v, WAN_IF, "source-route")["level"], "ok", "{v}");
    set("all", 1);
    let (v, code) = doctor(&t, &[LAN_IF, WAN_IF]);
    let c = check(&v, WAN_IF, "source-route");
    assert_eq!(c["level"], "fail", "{c}");
    assert_eq!(code, 1, "{v}");
    let fix = c["fix"].as_str().unwrap();
    assert!(
        fix.contains("net.ipv4.conf.all.accept_source_route=0")
            && fix.contains(&format!("net.ipv4.conf.{WAN_IF}.accept_source_route=0")),
        "{c}"
    );
    let out = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    assert!(out.status.success(), "attach: {}", stderr(&out));
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    assert!(
        !v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "source-route"),
        "offload mode: {v}"
    );
    set("all", 0);
    set(WAN_IF, 0);
}

/// Standalone mode: a policy rule by mark (or port) is one the fast
/// path's route lookups do not carry: doctor warns (`policy-rules`) and
/// points to offload mode, which checks each connection; a rule by source
/// is followed by the data path and not reported; in offload mode on a
/// kernel whose `bpf_fib_lookup` takes a mark (this one) the rules are
/// fine: the daemon checks each connection and carries those routed by
/// their ct mark with it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn doctor_warns_of_policy_rules_standalone_mode_cannot_follow() {
    let t = Topology::new();
    t.warm_neighbours();
    let out = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    assert!(out.status.success(), "attach: {}", stderr(&out));
    let rule = |args: &str| t.exec_line_ok(Ns::Router, &format!("ip {args}"));
    rule("route add blackhole default table 100");
    rule("rule add from 192.168.50.0/24 lookup 100 pref 100");
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    assert_eq!(check(&v, "routing", "policy-rules")["level"], "ok", "{v}");
    rule("rule add fwmark 1 lookup 100 pref 101");
    rule("-6 rule add ipproto udp dport 53 lookup 100 pref 102");
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    let c = check(&v, "routing", "policy-rules");
    assert_eq!(c["level"], "warn", "{c}");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .starts_with("2 policy rule(s)"),
        "{c}"
    );
    assert!(c["fix"].as_str().unwrap().contains("--admit kernel"), "{c}");
    // Offload mode on this kernel (6.10+): marked connections carried.
    let out = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    assert!(out.status.success(), "attach: {}", stderr(&out));
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    let c = check(&v, "routing", "policy-rules");
    assert_eq!(c["level"], "ok", "{c}");
    assert!(
        c["detail"]
            .as_str()
            .unwrap()
            .contains("routed by their ct mark are carried with it"),
        "{c}"
    );
    // A router attached by an earlier router-ctl, without ROUTE_MARKS.
    std::fs::remove_file(pin_dir(&t).join(router_common::maps::ROUTE_MARKS_MAP)).unwrap();
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    let c = check(&v, "routing", "policy-rules");
    assert_eq!(c["level"], "warn", "{c}");
    assert!(
        c["fix"].as_str().unwrap().contains("router-ctl attach"),
        "{c}"
    );
    t.router_ctl_ok(&["detach"]);
}

/// IPv4 forwarding off on the LAN interface (Debian's default for every
/// interface): attach and doctor warn and name the sysctl; the data path
/// passes what arrives there (`pass_fib_forwarding_disabled`) and nothing
/// reaches the server; with forwarding on, the check is fine and pings
/// go through.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn attach_and_doctor_warn_when_forwarding_is_off() {
    let t = Topology::new();
    let lan_forwarding = format!("net.ipv4.conf.{LAN_IF}.forwarding");
    t.exec_ok(
        Ns::Router,
        &["sysctl", "-qw", &format!("{lan_forwarding}=0")],
    );
    t.warm_neighbours();
    let out = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    assert!(out.status.success(), "attach: {}", stderr(&out));
    let warned = stderr(&out);
    assert!(
        warned.contains("IPv4 forwarding is off") && warned.contains("net.ipv4.ip_forward=1"),
        "attach warns: {warned}"
    );
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    let c = check(&v, LAN_IF, "forwarding");
    assert_eq!(c["level"], "warn", "{c}");
    assert_eq!(check(&v, WAN_IF, "forwarding")["level"], "ok", "{v}");

    let before = t.stats();
    assert!(
        !t.ping(Ns::Client, tests::SERVER_ADDR, 2),
        "a ping was routed with forwarding off"
    );
    let after = t.stats();
    assert!(
        counter_delta(&before, &after, "pass_fib_forwarding_disabled") >= 2,
        "{after}"
    );

    t.exec_ok(
        Ns::Router,
        &["sysctl", "-qw", &format!("{lan_forwarding}=1")],
    );
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    assert_eq!(check(&v, LAN_IF, "forwarding")["level"], "ok", "{v}");
    assert!(t.ping(Ns::Client, tests::SERVER_ADDR, 2), "forwarding on");
}

/// What `generic-aggregates` says when something merges.
const MERGED: &str = "generic mode the program sees the packets that";

/// Generic mode on an interface stacked on others (a bridge, a macvlan):
/// the kernel skips GRO only on the interface that has the program, so
/// the devices below merge packets before its generic hook sees them.
/// `doctor` names them with the fix (a bridge's ports, a macvlan's lower
/// device, the ports of the bridge a macvlan sits on, which itself runs
/// no GRO; these interfaces fall back to generic mode, their drivers have
/// no native XDP), and is content once they merge nothing; `attach --mode
/// generic` warns of them too. A plain veth in generic mode has nothing
/// below it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn doctor_warns_of_merging_below_a_generic_interface() {
    let t = Topology::new();
    for cmd in [
        "ip link add brt type bridge",
        "ip link add vt0 type veth peer name vt1",
        "ip link set vt0 master brt",
        "ip link add mvt link vt1 type macvlan mode bridge",
        "ip link add mvb link brt type macvlan mode bridge",
        "ethtool -K vt0 gro on",
        "ethtool -K vt1 gro on",
    ] {
        t.exec_ok(Ns::Router, &cmd.split(' ').collect::<Vec<_>>());
    }
    let (v, _) = doctor(&t, &["brt", "mvt", "mvb"]);
    // A macvlan on the bridge: the bridge runs no GRO, its port does.
    for (iface, lower) in [("brt", "vt0"), ("mvt", "vt1"), ("mvb", "vt0")] {
        let c = check(&v, iface, "generic-aggregates");
        assert_eq!(c["level"], "warn", "{c}");
        assert_eq!(
            c["fix"],
            format!("ethtool -K {lower} gro off").as_str(),
            "{c}"
        );
        assert!(c["detail"].as_str().unwrap().contains(MERGED), "{c}");
    }
    for dev in ["vt0", "vt1"] {
        t.exec_ok(Ns::Router, &["ethtool", "-K", dev, "gro", "off"]);
    }
    let (v, _) = doctor(&t, &["brt", "mvt", "mvb"]);
    for iface in ["brt", "mvt", "mvb"] {
        assert_eq!(check(&v, iface, "generic-aggregates")["level"], "ok", "{v}");
    }

    // attach in generic mode: the router's veths have nothing below them;
    // GRO on them is no hazard (the kernel skips it there).
    t.exec_ok(Ns::Router, &["ethtool", "-K", WAN_IF, "gro", "on"]);
    let o = ctl_env(
        &t,
        &[],
        &[
            "attach", LAN_IF, WAN_IF, "--admit", "xdp", "--mode", "generic",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        !stderr(&o).contains(MERGED),
        "attach --mode generic warned of merging on a plain veth: {}",
        stderr(&o)
    );
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    assert_eq!(
        check(&v, WAN_IF, "generic-aggregates")["level"],
        "ok",
        "{v}"
    );
}

/// Before any attach, doctor's `source-nat` warning (the router's own
/// masquerade, which standalone mode's slow path competes with) says its
/// fix is for standalone mode only: offload mode, the default, needs that
/// very rule, and an owner about to deploy it must not remove it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn doctor_before_an_attach_does_not_tell_offload_mode_to_drop_its_masquerade() {
    let t = Topology::new();
    tests::host::load_nft(
        t.ns_name(Ns::Router),
        &format!(
            "table ip owner_nat {{
  chain postrouting {{
    type nat hook postrouting priority srcnat;
    oifname \"{WAN_IF}\" masquerade
  }}
}}"
        ),
    );
    let (v, _) = doctor(&t, &[LAN_IF, WAN_IF]);
    let c = check(&v, "netfilter", "source-nat");
    let fix = c["fix"].as_str().unwrap_or_default();
    assert!(
        fix.starts_with("only for standalone mode (offload mode, the default, needs them)"),
        "{c}"
    );
}
