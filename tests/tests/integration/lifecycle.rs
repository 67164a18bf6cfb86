//! router-ctl's lifecycle in fresh topologies: attach (idempotent), live
//! replace under a running TCP stream, detach back to the kernel path,
//! rollback when the second interface fails, foreign XDP programs, pins
//! lost (as after a reboot), a crash (`kill -9`) at every step, and the WAN
//! address found on a labelled address.

use std::net::IpAddr;
use std::time::Duration;

use serde_json::Value;
use tests::{LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF, socket_addr};

use crate::ctl::*;

fn flow_xlat(t: &Topology, port: u16) -> Option<String> {
    let dst = socket_addr(SERVER_ADDR, port).to_string();
    t.conntrack()
        .iter()
        .find(|f| f["proto"] == "tcp" && f["orig_dst"] == dst.as_str())
        .map(|f| f["xlat_src"].as_str().unwrap_or("").to_owned())
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn attach_is_idempotent_and_status_tells_what_runs_where() {
    let t = Topology::new();
    let (v, code) = status(&t);
    assert_eq!(
        (v["state"].as_str(), code),
        (Some("not_attached"), 3),
        "{v}"
    );

    let out = attach(&t, &[]);
    assert!(out.contains("attached:"), "{out}");
    let (v, code) = status(&t);
    println!("{}", t.router_ctl_ok(&["status"]));
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["state"], "attached", "{v}");
    assert_eq!(v["configured"], true);
    let links = v["links"].as_array().unwrap();
    assert_eq!(links.len(), 2);
    assert_eq!(links[0]["name"], LAN_IF);
    assert_eq!(links[1]["name"], WAN_IF);
    for l in links {
        assert_eq!(l["mode"], "native", "{l}");
    }
    let ids = prog_ids(&v);
    assert_eq!(ids[0], ids[1]);
    assert_eq!(v["record"]["prog_id"].as_u64(), Some(ids[0]));
    assert_eq!(v["record"]["version"], v["ctl_object"]);
    assert!(v["record"]["attached_at"].as_u64().unwrap() > 1_600_000_000);
    assert_eq!(v["maps"]["conntrack"]["capacity"], 2 * 262_144);
    assert_eq!(v["maps"]["devices"]["entries"], 2);
    assert_eq!(v["maps"]["port_forwards"]["entries"], 0);
    assert_eq!(xdp_progs(&t, LAN_IF), vec![ids[0]]);
    assert_eq!(xdp_progs(&t, WAN_IF), vec![ids[0]]);

    // Owner-only pins and record.
    let dir = pin_dir(&t);
    assert_eq!(mode_of(&dir), 0o700);
    for f in std::fs::read_dir(&dir).unwrap() {
        let p = f.unwrap().path();
        assert_eq!(mode_of(&p), 0o600, "{}", p.display());
    }
    assert_eq!(mode_of(&state_file(&t)), 0o600);

    // The same attach again: a no-op that says so.
    let out = t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    assert!(out.contains("nothing changed"), "{out}");
    let (v2, _) = status(&t);
    assert_eq!(
        prog_ids(&v2),
        ids,
        "an identical attach replaced the program"
    );
    assert_eq!(v2["record"]["replacements"], 0);

    let peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5501));
    assert_eq!(peer.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn replace_under_a_running_tcp_stream_loses_nothing() {
    let t = Topology::new();
    attach(&t, &[]);
    let (v0, _) = status(&t);
    let id0 = prog_ids(&v0)[0];
    let variant = ObjectVariant::new("b");
    let retrans0 = t.nstat(Ns::Client, "TcpRetransSegs");
    let fwd0 = t.nstat(Ns::Router, "IpForwDatagrams");
    let before = t.stats();

    // 24 MiB over 5 s while the program is replaced three times.
    let stream = Stream::start(&t, socket_addr(SERVER_ADDR, 5601), 24 << 20, 5.0);
    wait_for(
        "the stream's flow to be tracked",
        Duration::from_secs(4),
        || flow_xlat(&t, 5601).is_some(),
    );
    let xlat0 = flow_xlat(&t, 5601).expect("the stream's flow is tracked");

    // 1. A new object (same code, another file hash).
    let out = t.router_ctl_ok(&[
        "attach",
        LAN_IF,
        WAN_IF,
        "--admit",
        "xdp",
        "--object",
        variant.path(),
    ]);
    assert!(
        out.contains("replaced") && out.contains("new object"),
        "{out}"
    );
    let (v1, c1) = status(&t);
    assert_eq!(c1, 0, "{v1}");
    let ids1 = prog_ids(&v1);
    assert_eq!(ids1[0], ids1[1], "{v1}");
    assert_ne!(ids1[0], id0, "the object did not change");
    assert_ne!(v1["record"]["version"], v0["record"]["version"]);
    std::thread::sleep(Duration::from_millis(800));

    // 2. A new configuration (back on the embedded object).
    let out = t.router_ctl_ok(&[
        "attach",
        LAN_IF,
        WAN_IF,
        "--admit",
        "xdp",
        "--timeout",
        "udp-replied=300",
    ]);
    assert!(out.contains("replaced"), "{out}");
    let (v2, _) = status(&t);
    assert_eq!(v2["record"]["config"]["timeouts"]["udp-replied"], 300);
    std::thread::sleep(Duration::from_millis(800));

    // 3. Nothing changed, forced with --reload.
    let out = t.router_ctl_ok(&[
        "attach",
        LAN_IF,
        WAN_IF,
        "--admit",
        "xdp",
        "--timeout",
        "udp-replied=300",
        "--reload",
    ]);
    assert!(out.contains("replaced"), "{out}");
    let (v3, c3) = status(&t);
    assert_eq!(c3, 0, "{v3}");
    assert_eq!(v3["record"]["replacements"], 3, "{v3}");
    assert_eq!(
        flow_xlat(&t, 5601).as_deref(),
        Some(xlat0.as_str()),
        "translation changed"
    );

    let n = stream.finish();
    let after = t.stats();
    let retrans = t.nstat(Ns::Client, "TcpRetransSegs") - retrans0;
    let kernel_fwd = t.nstat(Ns::Router, "IpForwDatagrams") - fwd0;
    let fwd =
        tests::counter_of(&after, "fwd_outbound") - tests::counter_of(&before, "fwd_outbound");
    println!(
        "stream: {n} bytes, {retrans} retransmitted segments, {fwd} packets on the fast path, \
         {kernel_fwd} forwarded by the kernel"
    );
    assert_eq!(n, (24 << 20) / (16 * 1024) * 16 * 1024);
    // Counters survived the replaces (they kept counting up) and the fast
    // path, not the kernel, carried the stream.
    assert!(fwd > 1000, "fast path carried only {fwd} packets");
    assert!(kernel_fwd < 10, "the kernel forwarded {kernel_fwd} packets");
    // A replace is one atomic pointer swap per link: it drops nothing. A
    // few retransmissions still happen on a loaded 2-core machine (a veth
    // ring overflowing when the receiver is starved), so allow a handful
    // per 2000 segments, far below what a lost window at each of the three
    // replaces would cost.
    let allowed = 3 + fwd / 2000;
    assert!(
        retrans <= allowed,
        "{retrans} segments retransmitted across the replaces (allowed {allowed})"
    );
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn detach_restores_kernel_forwarding() {
    let t = Topology::new();
    attach(&t, &[]);
    // Give the kernel path its own NAT; while attached the fast path wins.
    t.masquerade();
    let _ = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5701));
    let out = t.router_ctl_ok(&["detach"]);
    assert!(out.contains("detached"), "{out}");
    assert!(!pin_dir(&t).exists(), "pins left");
    assert!(!state_file(&t).exists(), "record left");
    assert!(xdp_progs(&t, LAN_IF).is_empty() && xdp_progs(&t, WAN_IF).is_empty());
    let (v, code) = status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("not_attached"), 3));
    let fwd0 = t.nstat(Ns::Router, "IpForwDatagrams");
    let peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5702));
    assert_eq!(peer.ip(), IpAddr::V4(ROUTER_WAN_ADDR), "kernel NAT");
    assert!(
        t.nstat(Ns::Router, "IpForwDatagrams") - fwd0 > 50,
        "the kernel did not forward the connection"
    );
    // Detach again: nothing to do, still success.
    let out = t.router_ctl_ok(&["detach"]);
    assert!(out.contains("nothing to do"), "{out}");
}

/// A router's network namespace deleted while it was attached (a
/// container or a netns-based router torn down without a detach): its pins
/// (the maps' kernel memory) and records stay. Every command on it says so
/// and how to remove them, and `detach` removes them from outside, once no
/// `router-ctl run` (which keeps the namespace alive) serves it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_router_whose_namespace_was_deleted_is_detached_from_outside() {
    let t = Topology::new();
    // Standalone mode (the kit's attach): its kernel side has a record too.
    attach(&t, &[]);
    let standalone_record = format!(
        "{}/{}.standalone.json",
        tests::STATE_DIR,
        t.ns_name(Ns::Router)
    );
    assert!(std::path::Path::new(&standalone_record).exists());
    // Its daemon keeps the namespace alive (it entered it): the links
    // still run, and detach is refused until it stops.
    let mut daemon = crate::offload::Daemon::start(&t, &[]);
    let deleted = std::process::Command::new("ip")
        .args(["netns", "delete", t.ns_name(Ns::Router)])
        .status()
        .unwrap();
    assert!(deleted.success());
    let o = t.router_ctl(&["status"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("still run on interface index"), "{err}");
    let o = t.router_ctl(&["detach"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("still runs"), "{err}");
    assert!(pin_dir(&t).exists());
    daemon.kill9();
    // The namespace goes with its last holder, its interfaces with it.
    crate::ctl::wait_for(
        "the namespace's interfaces to go",
        Duration::from_secs(10),
        || !String::from_utf8_lossy(&t.router_ctl(&["status"]).stderr).contains("still run on"),
    );
    let o = t.router_ctl(&["status"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains("no network namespace")
            && err.contains(&pin_dir(&t).display().to_string())
            && err.contains("detach` removes them"),
        "{err}"
    );
    // What a killed daemon (the one above), a killed apply and a write
    // cut short leave: no daemon of this router will start again to
    // remove them.
    let ns = t.ns_name(Ns::Router);
    let killed_leftovers = [
        format!("{}/{ns}.daemon.json", tests::LOCK_DIR),
        format!("{}/{ns}.apply.lock", tests::LOCK_DIR),
        format!("{}/{ns}.json.tmp", tests::STATE_DIR),
        format!("{}/{ns}.standalone.json.tmp", tests::STATE_DIR),
    ];
    assert!(
        std::path::Path::new(&killed_leftovers[0]).exists(),
        "the killed daemon left no status file"
    );
    for f in &killed_leftovers[1..] {
        std::fs::write(f, "").unwrap();
    }
    let out = t.router_ctl_ok(&["detach"]);
    assert!(out.contains("is gone, and its interfaces with it"), "{out}");
    assert!(!pin_dir(&t).exists(), "pins left");
    for f in &killed_leftovers {
        assert!(!std::path::Path::new(f).exists(), "{f} left");
    }
    // Nothing of it is kept, its mode neither (a detach notes it for the
    // next attach there; none comes to a namespace that is gone).
    let last_admit = format!("{}/{}.last-admit", tests::STATE_DIR, t.ns_name(Ns::Router));
    assert!(
        !std::path::Path::new(&last_admit).exists(),
        "{last_admit} left"
    );
    assert!(!state_file(&t).exists(), "record left");
    assert!(
        !std::path::Path::new(&standalone_record).exists(),
        "kernel-side record left"
    );
    // Nothing left: the plain answer.
    let o = t.router_ctl(&["detach"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("no network namespace"),
        "{err}"
    );
    assert!(!err.contains("removes them"), "{err}");
}

/// A router's namespace deleted and made again under its name while
/// processes still held the old one (a restart script, a container made
/// anew; here the daemon and another process): the daemon stops rather
/// than serve the old namespace, and while the old router's links still
/// run there the new namespace is not taken for its router (status says
/// so, an attach there is refused, detach removes the pins). (Once nothing
/// holds the old namespace, its interfaces and the links' hold on them go
/// with it, and an attach relinks in the new one, as after an interface
/// made anew.)
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_namespace_made_anew_is_not_taken_for_its_old_router() {
    let t = Topology::new();
    attach(&t, &[]);
    let mut daemon = crate::offload::Daemon::start(&t, &[]);
    // Another holder of the old namespace (killed at the test's end).
    let mut holder = t.spawn(Ns::Router, &["sleep", "60"]);
    let ns = t.ns_name(Ns::Router);
    crate::ctl::wait_for(
        "the holder to run in the router's namespace",
        Duration::from_secs(10),
        || {
            std::process::Command::new("ip")
                .args(["netns", "pids", ns])
                .output()
                .is_ok_and(|o| {
                    String::from_utf8_lossy(&o.stdout)
                        .split_whitespace()
                        .count()
                        >= 2
                })
        },
    );
    tests::host::run_ok(&["ip", "netns", "delete", ns]);
    tests::host::run_ok(&["ip", "netns", "add", ns]);
    let exit = daemon.wait_exit(Duration::from_secs(10));
    let log = daemon.log();
    assert!(
        exit.is_some_and(|s| !s.success()) && log.contains("was deleted and made again"),
        "the daemon went on serving the old namespace ({exit:?}):\n{log}"
    );
    let o = t.router_ctl(&["status"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("was deleted and made again since its router"),
        "{err}"
    );
    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("was deleted and made again"),
        "{err}"
    );
    let out = t.router_ctl_ok(&["detach"]);
    assert!(
        out.contains("was made anew since its router was attached"),
        "{out}"
    );
    assert!(!pin_dir(&t).exists(), "pins left");
    assert!(!state_file(&t).exists(), "record left");
    crate::ctl::kill_group(&mut holder);
}

/// The port forwards and IPv6 pinholes live in the maps `detach` removes:
/// the resize refusal says they go with the detach, `detach` names them
/// with the commands that add them back, and those commands, run as a
/// shell runs them, put them back after the next attach.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn detach_names_the_rules_it_removes_and_how_to_add_them_back() {
    let t = Topology::new();
    attach(&t, &[]);
    t.router_ctl_ok(&["forward", "add", "tcp", "8080", "192.168.50.2:80"]);
    t.router_ctl_ok(&["forward", "add", "udp", "30000", "192.168.50.2:53"]);
    t.router_ctl_ok(&["forward", "add", "tcp", "[2001:db8:50::5]:22"]);
    let before = t.router_ctl_ok(&["forward", "list", "--json"]);

    let err = ctl_fails(
        &t,
        &[
            "attach",
            LAN_IF,
            WAN_IF,
            "--admit",
            "xdp",
            "--max-flows",
            "1000",
        ],
    );
    assert!(
        err.contains("cannot be resized while attached")
            && err.contains("the detach also removes its 2 port-forward rules and 1 IPv6 pinhole"),
        "{err}"
    );

    let out = t.router_ctl_ok(&["detach"]);
    println!("{out}");
    assert!(
        out.contains("removed 2 port-forward rules and 1 IPv6 pinhole with the maps"),
        "{out}"
    );
    let ns = t.ns_name(Ns::Router);
    let commands: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter(|l| l.starts_with("router-ctl "))
        .collect();
    assert_eq!(
        commands,
        [
            format!("router-ctl -n {ns} forward add tcp 8080 192.168.50.2:80"),
            format!("router-ctl -n {ns} forward add udp 30000 192.168.50.2:53"),
            format!("router-ctl -n {ns} forward add tcp '[2001:db8:50::5]:22'"),
        ],
        "{out}"
    );

    attach(&t, &["--max-flows", "1000"]);
    assert_eq!(t.router_ctl_ok(&["forward", "list", "--json"]).trim(), "[]");
    // Pasted into a shell, as the owner would.
    let bin = tests::router_ctl_bin();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for c in &commands {
        let o = std::process::Command::new("timeout")
            .args(["-k", "5", "30", "sh", "-c", c])
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(o.status.success(), "{c}: {}{}", stdout(&o), stderr(&o));
    }
    assert_eq!(t.router_ctl_ok(&["forward", "list", "--json"]), before);
    // Nothing left to name: a detach without rules says nothing of them.
    for c in ["tcp 8080", "udp 30000"] {
        let args: Vec<&str> = ["forward", "del"].into_iter().chain(c.split(' ')).collect();
        t.router_ctl_ok(&args);
    }
    t.router_ctl_ok(&["forward", "del", "tcp", "[2001:db8:50::5]:22"]);
    let out = t.router_ctl_ok(&["detach"]);
    assert!(
        !out.contains("port-forward") && !out.contains("forward add"),
        "{out}"
    );
}

/// `--wan-addr auto` finds the WAN address by the interface's index: an
/// address with a label (`ip addr add ... label wan0:nat`, as keepalived
/// and ifupdown write them) is the interface's too, and flows leave with it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn the_wan_address_is_found_by_interface_also_when_labelled() {
    let t = Topology::new();
    let wan = format!("{ROUTER_WAN_ADDR}/24");
    t.exec_ok(Ns::Router, &["ip", "addr", "del", &wan, "dev", WAN_IF]);
    t.exec_ok(
        Ns::Router,
        &[
            "ip", "addr", "add", &wan, "dev", WAN_IF, "label", "wan0:nat",
        ],
    );
    let out = t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    assert!(
        out.contains(&format!("masquerade to {ROUTER_WAN_ADDR}")),
        "{out}"
    );
    let peer = t.udp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5705));
    assert_eq!(peer.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
}

/// A WAN without an IPv4 address (IPv6 only, or its DHCP lease not there
/// yet, as at boot or during an outage the daemon followed): both modes
/// attach. Standalone mode masquerades to none, says so, and its slow-path
/// table has no snat (what the LAN sends to the WAN is dropped, as the
/// kernel's masquerade does without an address); an attach that moves it
/// there from an address ends that address's flows, as the daemon's follow
/// does; attached again once the WAN has an address, it masquerades to it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_wan_without_ipv4_masquerades_to_none_until_it_has_one() {
    let t = Topology::new();
    let _cleanup = DetachOnDrop(&t);
    attach(&t, &[]);
    let peer = t.udp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5707));
    assert_eq!(peer.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
    assert!(!t.conntrack().is_empty());
    let wan = format!("{ROUTER_WAN_ADDR}/24");
    t.exec_ok(Ns::Router, &["ip", "addr", "del", &wan, "dev", WAN_IF]);
    // Attached again (a service restart during the outage, no daemon to
    // follow it): the old address's flows end with the move.
    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let (out, err) = (stdout(&o), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "{out}{err}");
    assert!(
        err.contains("has no IPv4 address (yet)") && err.contains("`router-ctl run` follows"),
        "{err}"
    );
    assert!(
        out.contains(&format!(
            "ended 1 XDP flows and 0 slow-path connections translated to {ROUTER_WAN_ADDR}"
        )),
        "{out}"
    );
    assert!(t.conntrack().is_empty(), "{:?}", t.conntrack());
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(
        text.contains("masquerade to none (the WAN has no IPv4 address)"),
        "{text}"
    );
    let table = t.exec_ok(Ns::Router, &["nft", "list", "table", "ip", "xdp_router"]);
    assert!(!table.contains("snat"), "{table}");
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(
        text.contains(&format!("{WAN_IF} has no IPv4 address")),
        "{text}"
    );

    t.exec_ok(Ns::Router, &["ip", "addr", "add", &wan, "dev", WAN_IF]);
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(
        text.contains(&format!("masquerade to {ROUTER_WAN_ADDR}")),
        "{text}"
    );
    let table = t.exec_ok(Ns::Router, &["nft", "list", "table", "ip", "xdp_router"]);
    assert!(
        table.contains(&format!("snat to {ROUTER_WAN_ADDR}")),
        "{table}"
    );
    t.warm_neighbours();
    let peer = t.udp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5706));
    assert_eq!(peer.ip(), IpAddr::V4(ROUTER_WAN_ADDR));

    t.router_ctl_ok(&["detach"]);
    t.exec_ok(Ns::Router, &["ip", "addr", "del", &wan, "dev", WAN_IF]);
    let out = t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    assert!(out.contains("attached"), "{out}");
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_failing_second_interface_rolls_the_first_back() {
    let t = Topology::new();
    let _cleanup = DetachOnDrop(&t);
    let rtr = t.ns_name(Ns::Router).to_owned();
    // A veth with a 9000-byte MTU cannot run native XDP without
    // multi-buffer support: the WAN attach fails after the LAN attach worked.
    for cmd in [
        &[
            "ip", "link", "add", "wan9k", "mtu", "9000", "type", "veth", "peer", "name", "wan9kp",
            "mtu", "9000",
        ][..],
        &["ip", "addr", "add", "198.51.100.1/24", "dev", "wan9k"],
        // NAPI on the peer (attach refuses a veth whose peer drops what is
        // redirected into it): the MTU is what fails.
        &["ethtool", "-K", "wan9kp", "gro", "on"],
        &["ip", "link", "set", "wan9kp", "up"],
        &["ip", "link", "set", "wan9k", "up"],
    ] {
        t.exec_ok(Ns::Router, cmd);
    }
    let err = ctl_fails(&t, &["attach", LAN_IF, "wan9k", "--mode", "native"]);
    println!("{err}");
    assert!(err.contains("wan9k"), "{err}");
    assert!(err.contains("rolled back"), "{err}");
    assert!(
        xdp_progs(&t, LAN_IF).is_empty(),
        "LAN still attached in {rtr}"
    );
    assert!(
        !pin_dir(&t).exists() && !tmp_pin_dir(&t).exists(),
        "pins left"
    );
    assert!(!state_file(&t).exists(), "record left");
    // And a good attach works afterwards.
    attach(&t, &[]);
    let _ = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5801));
}

/// Loads the router's own object in the test process: an XDP program
/// router-ctl did not attach.
fn foreign_ebpf() -> aya::Ebpf {
    let mut ebpf = aya::EbpfLoader::new()
        .map_max_entries(router_common::maps::CONNTRACK_MAP, 64)
        .load(aya::include_bytes_aligned!(env!("ROUTER_EBPF_OBJ")))
        .expect("load");
    let prog: &mut aya::programs::Xdp = ebpf
        .program_mut(router_common::maps::PROGRAM_NAME)
        .unwrap()
        .try_into()
        .unwrap();
    prog.load().expect("verifier");
    ebpf
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_foreign_xdp_program_is_refused_unless_forced() {
    let t = Topology::new();
    let _cleanup = DetachOnDrop(&t);
    // LAN: attached over netlink (like `ip link set xdp`), by bpftool from a
    // pinned program. WAN: attached through a bpf_link the test holds.
    let pin =
        std::path::Path::new(tests::PIN_ROOT).join(format!("foreign-{}", t.ns_name(Ns::Router)));
    // The pin is in the host's bpffs, which deleting the namespaces does
    // not clean: removed on drop, also when an assertion fails.
    let _pin_guard = RemoveOnDrop(pin.clone());
    let mut lan_prog = foreign_ebpf();
    let p: &mut aya::programs::Xdp = lan_prog
        .program_mut(router_common::maps::PROGRAM_NAME)
        .unwrap()
        .try_into()
        .unwrap();
    p.pin(&pin).expect("pin the foreign program");
    let netns = format!("--net=/run/netns/{}", t.ns_name(Ns::Router));
    let pin_s = pin.to_str().unwrap();
    let o = std::process::Command::new("nsenter")
        .args([
            netns.as_str(),
            "bpftool",
            "net",
            "attach",
            "xdpgeneric",
            "pinned",
            pin_s,
            "dev",
            LAN_IF,
        ])
        .output()
        .expect("nsenter bpftool");
    assert!(o.status.success(), "bpftool: {}", stderr(&o));
    let wan_prog = t.in_ns(Ns::Router, || {
        let mut e = foreign_ebpf();
        let p: &mut aya::programs::Xdp = e
            .program_mut(router_common::maps::PROGRAM_NAME)
            .unwrap()
            .try_into()
            .unwrap();
        p.attach(WAN_IF, aya::programs::XdpMode::Skb)
            .expect("attach to wan0");
        e
    });
    let (lan_foreign, wan_foreign) = (xdp_progs(&t, LAN_IF), xdp_progs(&t, WAN_IF));
    assert_eq!((lan_foreign.len(), wan_foreign.len()), (1, 1));

    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let err = stderr(&o);
    println!("{err}");
    assert!(
        err.contains("lan0 already has an XDP program") && err.contains("--force"),
        "{err}"
    );
    // Until someone removes it: exit 78, which the service does not
    // restart on.
    assert_eq!(o.status.code(), Some(78), "{err}");
    // From a file: `apply --check` sees it too (the service's start would
    // be refused), and both say what to run, not a flag `apply` lacks.
    let file = crate::apply::shipped_example();
    let file = file.to_str().unwrap();
    for args in [&["apply", "--check", file][..], &["apply", file]] {
        let o = t.router_ctl(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(78), "{args:?}: {err}");
        assert!(
            err.contains("lan0 already has an XDP program")
                && err.contains("run `router-ctl attach lan0 wan0 --force` once"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        xdp_progs(&t, LAN_IF),
        lan_foreign,
        "refusal changed {LAN_IF}"
    );
    assert_eq!(
        xdp_progs(&t, WAN_IF),
        wan_foreign,
        "refusal changed {WAN_IF}"
    );
    let doc = t.router_ctl(&["doctor", LAN_IF, WAN_IF]);
    println!("{}", stdout(&doc));
    assert_eq!(doc.status.code(), Some(1), "{}", stdout(&doc));
    assert!(
        stdout(&doc).contains("another XDP program"),
        "{}",
        stdout(&doc)
    );

    let o = ctl_env(
        &t,
        &[],
        &["attach", LAN_IF, WAN_IF, "--admit", "xdp", "--force"],
    );
    println!("{}", stderr(&o));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).matches("removed XDP program").count(),
        2,
        "{}",
        stderr(&o)
    );
    let (v, code) = status(&t);
    assert_eq!(code, 0, "{v}");
    let ours = prog_ids(&v);
    assert_eq!(xdp_progs(&t, LAN_IF), vec![ours[0]]);
    assert_eq!(xdp_progs(&t, WAN_IF), vec![ours[1]]);
    let _ = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5901));
    drop((lan_prog, wan_prog));
}

/// Removes a file on drop (a pin outside the test's namespaces).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn lost_pins_are_detected_and_repaired() {
    let t = Topology::new();
    let _cleanup = DetachOnDrop(&t);
    attach(&t, &[]);
    // What a reboot does to bpffs: every pin gone (the links detach), but
    // the record on disk stays.
    std::fs::remove_dir_all(pin_dir(&t)).unwrap();
    assert!(xdp_progs(&t, LAN_IF).is_empty());
    let (v, code) = status(&t);
    println!("{}", stdout(&t.router_ctl(&["status"])));
    assert_eq!(code, 1);
    assert_eq!(v["state"], "pins_lost", "{v}");
    assert!(
        v["problems"][0].as_str().unwrap().contains("PINS LOST"),
        "{v}"
    );
    // Standalone mode's kernel side outlived the pins (a bpffs unmount;
    // a reboot takes it too): said, with what removes it.
    assert!(
        v["problems"]
            .to_string()
            .contains("standalone mode's kernel side is still set up"),
        "{v}"
    );
    // attach brings it back.
    let o = ctl_env(&t, &[], &["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("pins are gone"), "{}", stderr(&o));
    assert_eq!(status(&t).1, 0);
    let _ = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 6001));
    // Lost again; detach only forgets the record.
    std::fs::remove_dir_all(pin_dir(&t)).unwrap();
    let out = t.router_ctl_ok(&["detach"]);
    assert!(out.contains("already gone"), "{out}");
    assert!(!state_file(&t).exists());
    assert_eq!(status(&t).1, 3);
    let tables = t.exec_ok(Ns::Router, &["nft", "list", "tables"]);
    assert!(!tables.contains("xdp_router"), "{tables}");
}

/// An upgrade whose build changes a map other than CONFIG: attached by a
/// build with one counter fewer, this router-ctl's `status` says
/// `other_build` naming the map (exit 1), `stats` refuses with what to do,
/// and a live replace (what `run --config` does at start) is refused;
/// `detach` and attach again switch to this build.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_router_of_a_build_with_another_counters_layout_is_other_build() {
    let t = Topology::new();
    let _cleanup = DetachOnDrop(&t);
    let other = ObjectVariant::with_wider_counter_values();
    attach(&t, &["--object", other.path()]);
    let peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 6201));
    assert_eq!(
        peer.ip(),
        IpAddr::V4(ROUTER_WAN_ADDR),
        "the other build forwards"
    );

    let (v, code) = status(&t);
    println!("{v}");
    assert_eq!((v["state"].as_str(), code), (Some("other_build"), 1), "{v}");
    let problem = v["problems"][0].as_str().unwrap();
    assert!(problem.contains("map COUNTERS's layout differs"), "{v}");
    assert!(problem.contains("router-ctl detach"), "{v}");
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(text.contains("state: other_build"), "{text}");

    let err = ctl_fails(&t, &["stats"]);
    println!("{err}");
    assert!(
        err.contains("attached by another build of router-ctl (map COUNTERS's layout differs"),
        "{err}"
    );
    assert!(
        err.contains("use that build's router-ctl, or `router-ctl detach` and attach again"),
        "{err}"
    );
    assert!(!err.contains("reading counter"), "{err}");

    // The exporter: the program is attached (up 1), its maps are another
    // build's (layout_mismatch 1), and no counter is served.
    let srv = crate::metrics::Server::start(&t);
    let (code, _, body) = srv.request("GET", "/metrics");
    assert_eq!(code, 200, "{body}");
    let lines: Vec<&str> = body.lines().collect();
    assert!(lines.contains(&"xdp_router_up 1"), "{body}");
    assert!(lines.contains(&"xdp_router_layout_mismatch 1"), "{body}");
    assert!(
        !body.contains("xdp_router_forwarded_packets_total"),
        "{body}"
    );
    drop(srv);

    // Refused with the exit code the service's unit does not restart on
    // (78, EX_CONFIG): trying again would not help.
    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let err = stderr(&o);
    assert!(err.contains("COUNTERS") && err.contains("detach"), "{err}");
    assert_eq!(o.status.code(), Some(78), "{err}");

    t.router_ctl_ok(&["detach"]);
    attach(&t, &[]);
    let (v, code) = status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("attached"), 0), "{v}");
    t.router_ctl_ok(&["stats"]);
    let srv = crate::metrics::Server::start(&t);
    let (_, _, body) = srv.request("GET", "/metrics");
    assert!(
        body.lines().any(|l| l == "xdp_router_layout_mismatch 0"),
        "{body}"
    );
}

/// An upgrade: a router attached by a router-ctl without the
/// `VIRTUAL_MACS` map (keepalived `use_vmac`) lacks its pin; the new
/// router-ctl's attach (as `apply` and `run --config` do at start) must
/// not refuse it but create the map in a live replace.
/// An upgrade to a build that counts one thing more: `stats` reads the
/// older router (0 for the counter it lacks) and `attach` replaces it in
/// place: the flows and their NAT stay, the counts go on from where they
/// were in a `COUNTERS` of the new length.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_upgrade_that_adds_a_counter_is_a_live_replace_keeping_flows_and_counts() {
    use router_common::maps::{COUNTERS_MAP, Counter};
    let t = Topology::new();
    let _cleanup = DetachOnDrop(&t);
    let older = ObjectVariant::with_one_counter_fewer();
    attach(&t, &["--object", older.path()]);
    let pin = pin_dir(&t).join(COUNTERS_MAP);
    let pinned_len = || aya::maps::MapInfo::from_pin(&pin).unwrap().max_entries();
    assert_eq!(pinned_len(), Counter::COUNT - 1);
    let (v, code) = status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("attached"), 0), "{v}");

    let stream = Stream::until_stopped(&t, socket_addr(SERVER_ADDR, 5611), 2e6, 60.0);
    wait_for(
        "the stream's flow to be tracked",
        Duration::from_secs(10),
        || flow_xlat(&t, 5611).is_some(),
    );
    let xlat0 = flow_xlat(&t, 5611).expect("the stream's flow is tracked");
    wait_for("XDP to carry the stream", Duration::from_secs(10), || {
        tests::counter_of(&t.stats(), "fwd_outbound") > 100
    });
    let last = Counter::ALL[Counter::ALL.len() - 1].name();
    let before = t.stats();
    assert_eq!(tests::counter_of(&before, last), 0, "{before}");

    // Cut short right after the new COUNTERS took the pin: the replace is
    // journaled, the old program still forwards, and the next attach
    // finishes it.
    crashed(
        &t,
        "replace-after-counters",
        &["attach", LAN_IF, WAN_IF, "--admit", "xdp"],
    );
    assert_eq!(pinned_len(), Counter::COUNT);
    let (v, _) = status(&t);
    assert!(!v["record"]["pending"].is_null(), "not journaled: {v}");
    assert_eq!(flow_xlat(&t, 5611).as_deref(), Some(xlat0.as_str()));

    let out = attach(&t, &[]);
    println!("{out}");
    assert!(
        out.contains("replaced") && out.contains("new object"),
        "{out}"
    );
    let after = t.stats();
    assert_eq!(pinned_len(), Counter::COUNT);
    assert_eq!(mode_of(&pin), 0o600, "{}", pin.display());
    assert!(!pin_dir(&t).join("COUNTERS_NEXT").exists());
    // The stream's one flow: no flow opened meanwhile, so the count is the
    // same; the packet counts went on from where they were.
    assert_eq!(
        tests::counter_of(&after, "flow_new_masquerade"),
        tests::counter_of(&before, "flow_new_masquerade"),
        "{after}"
    );
    for c in ["fwd_outbound", "fwd_inbound"] {
        assert!(
            tests::counter_of(&after, c) >= tests::counter_of(&before, c),
            "{c}: {before} -> {after}"
        );
    }
    assert_eq!(flow_xlat(&t, 5611).as_deref(), Some(xlat0.as_str()));
    wait_for(
        "the new program to carry the stream",
        Duration::from_secs(10),
        || tests::counter_delta(&after, &t.stats(), "fwd_outbound") > 10,
    );
    let n = stream.finish();
    assert!(n > 0);
    let end = t.stats();
    assert!(
        tests::counter_delta(&after, &end, "fwd_outbound") > 10,
        "the new program carries the stream: {end}"
    );
    let (v, code) = status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("attached"), 0), "{v}");
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn attach_creates_the_map_an_earlier_router_ctl_did_not_pin() {
    use router_common::maps::{KERNEL_FLOWS_MAP, NEXT_HOPS_MAP, ROUTE_MARKS_MAP, VIRTUAL_MACS_MAP};
    let t = Topology::new();
    let _cleanup = DetachOnDrop(&t);
    attach(&t, &[]);
    // What earlier router-ctl versions left: every pin but these, the
    // maps added since.
    let added_later = [
        VIRTUAL_MACS_MAP,
        KERNEL_FLOWS_MAP,
        ROUTE_MARKS_MAP,
        NEXT_HOPS_MAP,
    ];
    for name in added_later {
        std::fs::remove_file(pin_dir(&t).join(name)).unwrap();
    }
    let (v, code) = status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("degraded"), 1), "{v}");
    let problems = v["problems"].to_string();
    assert!(problems.contains("not pinned"), "{v}");
    for name in added_later {
        assert!(problems.contains(name), "{v}");
    }

    let out = attach(&t, &[]);
    assert!(out.contains("replaced"), "{out}");
    for name in added_later {
        let pin = pin_dir(&t).join(name);
        assert_eq!(mode_of(&pin), 0o600, "{}", pin.display());
    }
    let (v, code) = status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("attached"), 0), "{v}");
    assert!(v["virtual_macs"].is_array(), "status reads the map: {v}");
    let before = t.stats();
    let peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 6101));
    assert_eq!(peer.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
    let after = t.stats();
    assert!(
        tests::counter_delta(&before, &after, "fwd_outbound") >= 1,
        "the replaced program forwarded nothing: {after}"
    );
}

fn crashed(t: &Topology, at: &str, args: &[&str]) {
    let o = ctl_env(t, &[("ROUTER_CTL_CRASH_AT", at)], args);
    assert!(
        stderr(&o).contains(&format!("crash injected at {at}")),
        "{at} was not reached: {}{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(!o.status.success());
}

/// After a crash the fast path is either off (old state: no NAT) or fully on.
fn fast_path_off(t: &Topology) -> bool {
    let (v, _) = status(t);
    match v["state"].as_str() {
        Some("not_attached" | "unconfigured") => true,
        Some("attached" | "degraded") => false,
        other => panic!("half a router after a crash: {other:?}: {v}"),
    }
}

fn healthy(t: &Topology, port: u16) {
    let (v, code) = status(t);
    assert_eq!(code, 0, "{v}");
    assert!(!tmp_pin_dir(t).exists(), "temporary pins left");
    let ids = prog_ids(&v);
    assert_eq!(xdp_progs(t, LAN_IF), vec![ids[0]]);
    assert_eq!(xdp_progs(t, WAN_IF), vec![ids[1]]);
    let peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, port));
    assert_eq!(peer.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
}

/// What a crash of a replace at `at` left: the old state (`before`), the
/// new one (`variant`'s), or (only between the two link updates) one
/// program of each on the same maps and config.
fn old_or_new_after_crash(t: &Topology, at: &str, before: &Value, variant: &ObjectVariant) {
    let (v, code) = status(t);
    println!("after a crash at {at}: {} {:?}", v["state"], v["problems"]);
    // Old, new, or (only between the two link updates) both programs
    // on the same maps and config: traffic flows in every case.
    assert!(
        matches!(
            v["state"].as_str(),
            Some("attached" | "degraded" | "inconsistent")
        ),
        "{at}: {v}"
    );
    // Degraded only with what is wrong named.
    if v["state"] == "degraded" {
        assert!(
            v["problems"].as_array().is_some_and(|p| !p.is_empty()),
            "{at}: degraded without a problem named: {v}"
        );
    }
    // The record names the old object or the new one.
    assert!(
        v["record"]["version"] == before["record"]["version"]
            || v["record"]["version"] == status_version(variant),
        "{at}: the record names neither object: {v}"
    );
    // The interfaces run the old program, or both the new one, or (only
    // between the two link updates) one of each.
    let old = prog_ids(before);
    let (lan, wan) = (xdp_progs(t, LAN_IF), xdp_progs(t, WAN_IF));
    assert!(
        lan.len() == 1 && wan.len() == 1,
        "{at}: lan {lan:?}, wan {wan:?}"
    );
    if at == "replace-between-links" {
        assert_eq!(v["state"], "inconsistent", "{v}");
        assert_eq!(code, 1);
        assert!(
            lan[0] != old[0] && wan[0] == old[1],
            "{at}: lan {lan:?}, wan {wan:?}, before {old:?}"
        );
    } else {
        assert!(
            (lan[0] == old[0] && wan[0] == old[1]) || (lan == wan && lan[0] != old[0]),
            "{at}: lan {lan:?}, wan {wan:?}, before {old:?}"
        );
    }
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_crash_at_any_step_leaves_the_old_or_the_new_state() {
    let t = Topology::new();
    let _cleanup = DetachOnDrop(&t);
    t.warm_neighbours();
    let mut port = 6100;
    let attach_args = ["attach", LAN_IF, WAN_IF, "--admit", "xdp"];
    for at in [
        "fresh-after-load",
        "fresh-after-links",
        "fresh-between-link-pins",
        "fresh-after-link-pins",
        "fresh-after-rename",
        "fresh-after-record",
    ] {
        crashed(&t, at, &attach_args);
        assert!(
            fast_path_off(&t),
            "{at}: the fast path is on after a crashed attach"
        );
        // No interface runs a program while the other does not... unless
        // it is unconfigured (every packet to the kernel).
        t.router_ctl_ok(&attach_args);
        port += 1;
        healthy(&t, port);
        t.router_ctl_ok(&["detach"]);
        assert!(xdp_progs(&t, LAN_IF).is_empty() && xdp_progs(&t, WAN_IF).is_empty());
    }

    let variant = ObjectVariant::new("crash");
    t.router_ctl_ok(&attach_args);
    for at in [
        "replace-after-load",
        "replace-after-journal",
        "replace-after-config",
        "replace-between-links",
        "replace-after-links",
    ] {
        let (before, _) = status(&t);
        crashed(
            &t,
            at,
            &[
                "attach",
                LAN_IF,
                WAN_IF,
                "--admit",
                "xdp",
                "--object",
                variant.path(),
                "--reload",
            ],
        );
        old_or_new_after_crash(&t, at, &before, &variant);
        port += 1;
        let peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, port));
        assert_eq!(peer.ip(), IpAddr::V4(ROUTER_WAN_ADDR), "{at}");
        // attach again finishes the job.
        let out = t.router_ctl_ok(&[
            "attach",
            LAN_IF,
            WAN_IF,
            "--admit",
            "xdp",
            "--object",
            variant.path(),
        ]);
        println!("{out}");
        port += 1;
        healthy(&t, port);
        let (after, _) = status(&t);
        assert_eq!(after["record"]["version"], status_version(&variant), "{at}");
        assert!(after["record"]["pending"].is_null(), "{at}: {after}");
        // Back to the embedded object for the next round.
        t.router_ctl_ok(&attach_args);
    }

    for at in ["detach-after-unconfigure", "detach-after-unpin"] {
        crashed(&t, at, &["detach"]);
        assert!(
            fast_path_off(&t),
            "{at}: fast path still on after a crashed detach"
        );
        let out = t.router_ctl_ok(&["detach"]);
        println!("{out}");
        assert!(!pin_dir(&t).exists(), "{at}");
        assert!(xdp_progs(&t, LAN_IF).is_empty() && xdp_progs(&t, WAN_IF).is_empty());
        assert_eq!(status(&t).1, 3);
        t.router_ctl_ok(&attach_args);
    }
}

/// The version string router-ctl shows for an object file.
fn status_version(v: &ObjectVariant) -> Value {
    use sha2_free_hash as h;
    Value::String(format!(
        "{}+{}",
        env!("CARGO_PKG_VERSION"),
        &h::sha256_hex(&std::fs::read(&v.0).unwrap())[..12]
    ))
}

/// SHA-256 without a dependency: `sha256sum`.
mod sha2_free_hash {
    pub fn sha256_hex(data: &[u8]) -> String {
        use std::io::Write;
        let mut c = std::process::Command::new("sha256sum")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sha256sum");
        c.stdin.take().unwrap().write_all(data).unwrap();
        let out = c.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    }
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn stats_watch_shows_rates() {
    let t = Topology::new();
    attach(&t, &[]);
    let stream = Stream::start(&t, socket_addr(SERVER_ADDR, 6301), 8 << 20, 3.0);
    let o = t.router_ctl(&[
        "stats",
        "--watch",
        "--json",
        "--count",
        "3",
        "--interval",
        "0.5",
    ]);
    stream.finish();
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 3);
    for l in &lines {
        let f = &l["counters"]["fwd_outbound"];
        assert!(
            f["pps"].is_number() && f["bps"].is_number() && f["packets"].is_u64(),
            "{l}"
        );
        assert!(
            l["counters"]["flow_new_masquerade"]["per_sec"].is_number(),
            "{l}"
        );
        assert!(
            (l["interval_secs"].as_f64().unwrap() - 0.5).abs() < 0.3,
            "{l}"
        );
    }
    let max_pps = lines
        .iter()
        .map(|l| l["counters"]["fwd_outbound"]["pps"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(max_pps > 100.0, "no outbound rate seen: {lines:?}");
    // The text screen has the rate columns.
    let o = t.router_ctl(&["stats", "--watch", "--count", "1", "--interval", "0.2"]);
    let s = stdout(&o);
    assert!(
        s.contains("pps") && s.contains("bps") && s.contains("fwd_outbound"),
        "{s}"
    );
}
