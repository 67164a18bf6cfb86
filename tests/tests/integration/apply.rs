//! `router-ctl apply FILE`: the shipped example file, re-applying it (no
//! change), a changed file (live replace and rule sync), and every invalid
//! field (an error naming the line and the field, nothing changed).

use std::net::IpAddr;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tests::{CLIENT_ADDR, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, pattern, socket_addr};

use crate::ctl::*;

pub(crate) fn shipped_example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/router.toml")
}

/// The shipped example with its port forwards switched on, as an owner
/// who opens them does: the lines of each commented-out `[[forward]]`
/// block uncommented (the file ships none active, so that a copy opens
/// nothing to the Internet by itself).
fn example_text() -> String {
    let shipped = std::fs::read_to_string(shipped_example()).expect("examples/router.toml");
    let mut in_forward = false;
    let mut text = String::new();
    for line in shipped.lines() {
        in_forward = line == "# [[forward]]" || in_forward && line.contains(" = ");
        text.push_str(if in_forward {
            line.trim_start_matches("# ")
        } else {
            line
        });
        text.push('\n');
    }
    assert_eq!(text.matches("\n[[forward]]\n").count(), 2, "{text}");
    text
}

/// [`example_text`] in a file.
fn example() -> TempFile {
    TempFile::new("example", &example_text())
}

/// A file `TAG.toml` in a scratch directory of its own (removed with it).
struct TempFile {
    path: PathBuf,
    _dir: tests::Scratch,
}

impl TempFile {
    fn new(tag: &str, text: &str) -> Self {
        let dir = tests::Scratch::new("apply");
        let p = dir.path(&format!("{tag}.toml"));
        std::fs::write(&p, text).unwrap();
        Self { path: p, _dir: dir }
    }

    fn path(&self) -> &str {
        self.path.to_str().unwrap()
    }
}

fn rules(t: &Topology) -> Value {
    serde_json::from_str(&t.router_ctl_ok(&["forward", "list", "--json"])).unwrap()
}

/// A TCP echo through the example's port forward (WAN 8080 -> client:80).
fn port_forward_works(t: &Topology) {
    let srv = t.tcp_echo_server(Ns::Client, socket_addr(CLIENT_ADDR, 80));
    let payload = pattern(4096);
    let got = t
        .tcp_echo_client(
            Ns::Server,
            socket_addr(ROUTER_WAN_ADDR, 8080),
            &payload,
            Duration::from_secs(5),
        )
        .expect("echo through the port forward");
    assert_eq!(got, payload);
    let peer = srv.join().expect("the LAN service saw a peer");
    assert_eq!(peer.ip(), IpAddr::V4(SERVER_ADDR));
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn the_example_applies_and_applying_it_again_changes_nothing() {
    let t = Topology::new();
    t.warm_neighbours();
    // The file as shipped: valid, and it opens no port.
    let shipped = shipped_example();
    let out = t.router_ctl_ok(&["apply", "--check", shipped.to_str().unwrap()]);
    assert!(out.contains("is valid"), "{out}");
    let file = example();
    let f = file.path();
    let out = t.router_ctl_ok(&["apply", "--check", f]);
    assert!(
        out.contains("is valid") && !out.contains("does not route"),
        "{out}"
    );
    assert_eq!(status(&t).1, 3, "--check attached something");
    // A forward's target the router does not route out of its LAN (a
    // typo): valid, but said, as `forward add` says it.
    let typo = TempFile::new(
        "typo",
        &example_text().replace("192.168.50.2:80", "10.9.9.9:80"),
    );
    let out = t.router_ctl_ok(&["apply", "--check", typo.path()]);
    assert!(
        out.contains("does not route 10.9.9.9 out of its LAN interface"),
        "{out}"
    );

    let out = t.router_ctl_ok(&["apply", f]);
    println!("{out}");
    assert!(
        out.contains("attached:") && out.contains("applied"),
        "{out}"
    );
    let (v, code) = status(&t);
    assert_eq!(code, 0, "{v}");
    assert_eq!(
        rules(&t),
        json!([
            {"proto": "tcp", "wan_port": 8080, "lan_addr": "192.168.50.2", "lan_port": 80},
            {"proto": "udp", "wan_port": 5353, "lan_addr": "192.168.50.2", "lan_port": 53},
        ])
    );
    assert_eq!(v["record"]["config"]["port_min"], 1024);
    port_forward_works(&t);
    let peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 7001));
    assert_eq!(peer.ip(), IpAddr::V4(ROUTER_WAN_ADDR));

    let out = t.router_ctl_ok(&["apply", f]);
    // apply's own verdict (attach's "nothing changed" comes before it).
    assert_eq!(
        out.lines().last(),
        Some(format!("applied {f}: nothing changed").as_str()),
        "{out}"
    );
    let (v2, _) = status(&t);
    assert_eq!(prog_ids(&v2), prog_ids(&v));
    assert_eq!(v2["record"]["replacements"], 0);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_changed_file_replaces_in_place_and_syncs_the_rules() {
    let t = Topology::new();
    t.warm_neighbours();
    t.router_ctl_ok(&["apply", example().path()]);
    let (v0, _) = status(&t);
    let changed = example_text()
        .replace(
            "port_range = \"1024-60999\"",
            "port_range = \"20000-60000\"",
        )
        .replace("udp-replied = 120", "udp-replied = 300")
        .replace(
            "[[forward]]\nproto = \"udp\"\nwan_port = 5353\nto = \"192.168.50.2:53\"\n",
            "[[forward]]\nproto = \"udp\"\nwan_port = 5454\nto = \"192.168.50.2:54\"\n",
        )
        .replace("to = \"192.168.50.2:80\"", "to = \"192.168.50.2:81\"");
    let f = TempFile::new("changed", &changed);
    let out = t.router_ctl_ok(&["apply", f.path()]);
    println!("{out}");
    assert!(
        out.contains("replaced") && out.contains("new configuration"),
        "{out}"
    );
    assert!(out.contains("deleted rule udp 5353"), "{out}");
    assert!(
        out.contains("added rule udp 5454 -> 192.168.50.2:54"),
        "{out}"
    );
    assert!(
        out.contains("changed rule tcp 8080 -> 192.168.50.2:81"),
        "{out}"
    );
    let (v1, code) = status(&t);
    assert_eq!(code, 0, "{v1}");
    assert_ne!(prog_ids(&v1), prog_ids(&v0));
    assert_eq!(v1["record"]["config"]["port_min"], 20000);
    assert_eq!(v1["record"]["config"]["timeouts"]["udp-replied"], 300);
    assert_eq!(
        rules(&t),
        json!([
            {"proto": "tcp", "wan_port": 8080, "lan_addr": "192.168.50.2", "lan_port": 81},
            {"proto": "udp", "wan_port": 5454, "lan_addr": "192.168.50.2", "lan_port": 54},
        ])
    );
    let peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 7101));
    assert!(
        peer.port() >= 20000 || peer.port() == 0,
        "port range not applied: {peer}"
    );
    let out = t.router_ctl_ok(&["apply", f.path()]);
    assert_eq!(
        out.lines().last(),
        Some(format!("applied {}: nothing changed", f.path()).as_str()),
        "{out}"
    );
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_ctrl_c_during_an_apply_leaves_the_whole_file_applied() {
    // A Ctrl-C (SIGINT) while the replace runs is held off, with the
    // router's lock, until the file's rules are written too: the new
    // configuration never goes live with the old file's port forwards
    // (a port the file closes left open).
    let t = Topology::new();
    t.warm_neighbours();
    t.router_ctl_ok(&["apply", example().path()]);
    let changed = example_text()
        .replace("udp-replied = 120", "udp-replied = 300")
        .replace(
            "[[forward]]\nproto = \"udp\"\nwan_port = 5353\nto = \"192.168.50.2:53\"\n",
            "",
        );
    let file = TempFile::new("ctrl-c", &changed);
    let out = ctl_env(
        &t,
        &[("ROUTER_CTL_SIGNAL_AT", "replace-after-links")],
        &["apply", file.path()],
    );
    let e = stderr(&out);
    assert!(e.contains("SIGINT injected at replace-after-links"), "{e}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGINT),
        "ended by the SIGINT: {e}"
    );
    let (v, code) = status(&t);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["record"]["config"]["timeouts"]["udp-replied"], 300);
    assert_eq!(
        rules(&t),
        json!([
            {"proto": "tcp", "wan_port": 8080, "lan_addr": "192.168.50.2", "lan_port": 80},
        ]),
        "the new configuration went live with the old file's rules"
    );
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_ctrl_z_during_an_apply_stops_it_holding_no_lock() {
    // A Ctrl-Z (SIGTSTP) during the replace is held off until the apply
    // is done and has released its locks: stopped, it blocks no other
    // router-ctl (a rule change, another apply).
    let t = Topology::new();
    t.warm_neighbours();
    t.router_ctl_ok(&["apply", example().path()]);
    let changed = example_text().replace("udp-replied = 120", "udp-replied = 300");
    let file = TempFile::new("ctrl-z", &changed);
    // A process group of its own: in an orphaned one (a CI runner's
    // background job) the kernel discards SIGTSTP, and nothing would stop.
    let stopped = std::process::Command::new(tests::router_ctl_bin())
        .process_group(0)
        .args(["-n", t.ns_name(Ns::Router), "apply", file.path()])
        .env("ROUTER_CTL_SIGNAL_AT", "replace-after-links:TSTP")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed (also when an assertion fails: a stopped process keeps its
    // locks until then).
    let stopped = crate::daemon_run::KillOnDrop(stopped);
    let state = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next()))
            .flatten()
    };
    crate::ctl::wait_for(
        "the apply to stop at its Ctrl-Z",
        Duration::from_secs(20),
        || state(stopped.0.id()) == Some('T'),
    );
    // Its configuration is in place, and neither lock is held.
    assert_eq!(
        status(&t).0["record"]["config"]["timeouts"]["udp-replied"],
        300
    );
    t.router_ctl_ok(&["forward", "add", "tcp", "9090", "192.168.50.2:90"]);
    t.router_ctl_ok(&["apply", example().path()]);
    drop(stopped);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(clippy::too_many_lines, reason = "a table of cases")]
fn each_invalid_field_is_named_and_nothing_changes() {
    let t = Topology::new();
    t.warm_neighbours();
    t.router_ctl_ok(&["apply", example().path()]);
    let (v0, _) = status(&t);
    let rules0 = rules(&t);
    let text = example_text();
    let line_of = |needle: &str| {
        text.lines()
            .position(|l| l.starts_with(needle))
            .map_or_else(|| panic!("{needle} not in the example"), |i| i + 1)
    };
    let cases: Vec<(&str, String, usize, &str)> = vec![
        (
            "lan = \"lan0\"",
            "lan = \"nope0\"".into(),
            line_of("lan ="),
            "interfaces.lan",
        ),
        (
            "wan = \"wan0\"",
            "wan = \"nope1\"".into(),
            line_of("wan ="),
            "interfaces.wan",
        ),
        (
            "wan = \"wan0\"",
            "wan = \"lan0\"".into(),
            line_of("wan ="),
            "interfaces.wan",
        ),
        (
            "mode = \"auto\"",
            "mode = \"turbo\"".into(),
            line_of("mode ="),
            "interfaces.mode",
        ),
        (
            "wan_addr = \"auto\"",
            "wan_addr = \"203.0.113.300\"".into(),
            line_of("wan_addr ="),
            "nat.wan_addr",
        ),
        (
            "port_range = \"1024-60999\"",
            "port_range = \"2000-1000\"".into(),
            line_of("port_range ="),
            "nat.port_range",
        ),
        (
            "max_flows = 262144",
            "max_flows = 0".into(),
            line_of("max_flows ="),
            "nat.max_flows",
        ),
        (
            "max_flows = 262144",
            "max_flows = \"lots\"".into(),
            line_of("max_flows ="),
            "nat.max_flows",
        ),
        // More than the kernel's largest hash map holds (two entries a
        // flow, 2^27 entries): refused here, not by the attach.
        (
            "max_flows = 262144",
            "max_flows = 67108865".into(),
            line_of("max_flows ="),
            "nat.max_flows",
        ),
        (
            "icmp = 30",
            "icmp = -1".into(),
            line_of("icmp ="),
            "timeouts.icmp",
        ),
        (
            "icmp = 30",
            "ping = 30".into(),
            line_of("icmp ="),
            "timeouts.ping",
        ),
        (
            "proto = \"tcp\"",
            "proto = \"sctp\"".into(),
            line_of("proto = \"tcp\""),
            "forward.proto",
        ),
        (
            "wan_port = 8080",
            "wan_port = 0".into(),
            line_of("wan_port = 8080"),
            "forward.wan_port",
        ),
        (
            "wan_port = 5353",
            "wan_port = 65536".into(),
            line_of("wan_port = 5353"),
            "forward.wan_port",
        ),
        (
            "to = \"192.168.50.2:80\"",
            "to = \"192.168.50.2\"".into(),
            line_of("to = \"192.168.50.2:80\""),
            "forward.to",
        ),
        (
            "to = \"192.168.50.2:80\"",
            "to = \"lan-host:80\"".into(),
            line_of("to = \"192.168.50.2:80\""),
            "forward.to",
        ),
        (
            "[nat]",
            "[nat]\ncolour = \"blue\"".into(),
            line_of("[nat]") + 1,
            "colour",
        ),
    ];
    for (from, to, line, field) in &cases {
        let bad = text.replacen(from, to, 1);
        assert_ne!(bad, text, "{from} not found");
        let f = TempFile::new("bad", &bad);
        let e = ctl_fails(&t, &["apply", f.path()]);
        println!("{e}");
        let at = format!("{}:{line}", f.path());
        assert!(e.contains(&at), "{from} -> {to}: expected {at} in: {e}");
        assert!(
            e.contains(field),
            "{from} -> {to}: expected {field} in: {e}"
        );
        assert!(e.contains("nothing was changed"), "{e}");
    }
    // The same WAN port twice: both lines named.
    let dup = format!(
        "{text}\n[[forward]]\nproto = \"tcp\"\nwan_port = 8080\nto = \"192.168.50.3:80\"\n"
    );
    let f = TempFile::new("dup", &dup);
    let o = t.router_ctl(&["apply", f.path()]);
    let e = stderr(&o);
    // Invalid until edited: exit 78, which the service does not restart on.
    assert_eq!(o.status.code(), Some(78), "{e}");
    let dup_line = dup.lines().count() - 1;
    assert!(
        e.contains(&format!(":{dup_line}: forward.wan_port"))
            && e.contains(&format!("first at line {}", line_of("wan_port = 8080"))),
        "{e}"
    );
    // Not TOML at all.
    let f = TempFile::new("syntax", "[interfaces\nlan = \"lan0\"\n");
    let o = t.router_ctl(&["apply", f.path()]);
    let e = stderr(&o);
    assert!(e.contains(&format!("{}:1:", f.path())), "{e}");
    assert_eq!(o.status.code(), Some(78), "{e}");
    // An interface not there (yet: at boot it may come): exit 1, tried again.
    let f = TempFile::new(
        "noif",
        &text.replacen("lan = \"lan0\"", "lan = \"nope0\"", 1),
    );
    let o = t.router_ctl(&["apply", f.path()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("nope0") && e.contains("interfaces.lan"), "{e}");
    // The loopback interface (a typo): it will never do, exit 78.
    let f = TempFile::new("lo", &text.replacen("wan = \"wan0\"", "wan = \"lo\"", 1));
    let o = t.router_ctl(&["apply", f.path()]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{e}");
    assert!(
        e.contains("interfaces.wan") && e.contains("lo has no Ethernet address of its own"),
        "{e}"
    );
    // A missing file.
    let e = ctl_fails(&t, &["apply", "/nonexistent/router.toml"]);
    assert!(e.contains("/nonexistent/router.toml"), "{e}");

    let (v1, code) = status(&t);
    assert_eq!(code, 0);
    assert_eq!(
        prog_ids(&v1),
        prog_ids(&v0),
        "an invalid file changed the program"
    );
    assert_eq!(v1["record"]["config"], v0["record"]["config"]);
    assert_eq!(rules(&t), rules0, "an invalid file changed the rules");
}

/// Standalone mode from a file on a router with a forward rule: `apply`
/// (and `apply --check`) refuses, naming the chain and the file's key that
/// bypasses it, and changes nothing; with `bypass_forward_rules = true` in
/// `[router]` it applies and warns.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_file_bypasses_forward_rules_only_when_it_says_so() {
    let t = Topology::new();
    t.warm_neighbours();
    t.exec_ok(Ns::Router, &["nft", "add", "table", "inet", "fw"]);
    t.exec_ok(
        Ns::Router,
        &[
            "nft",
            "add chain inet fw forward { type filter hook forward priority 0; policy drop; }",
        ],
    );
    let refused = TempFile::new("fw-refused", &example_text());
    for check in [true, false] {
        let mut args = vec!["apply", refused.path()];
        if check {
            args.push("--check");
        }
        let o = t.router_ctl(&args);
        let e = stderr(&o);
        assert!(!o.status.success(), "{args:?} applied over a forward rule");
        for needle in [
            "table inet fw chain forward",
            "bypass_forward_rules = true",
            "nothing was changed",
        ] {
            assert!(e.contains(needle), "{args:?}: {needle:?} not in {e}");
        }
        assert!(!t.router_attached(), "{args:?}: pins left");
    }
    let text = example_text().replacen("[router]\n", "[router]\nbypass_forward_rules = true\n", 1);
    assert!(
        text.contains("bypass_forward_rules"),
        "the example has no [router]"
    );
    let bypassing = TempFile::new("fw-bypassed", &text);
    let o = t.router_ctl(&["apply", bypassing.path()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("table inet fw chain forward"),
        "no warning: {}",
        stderr(&o)
    );
    assert!(t.router_attached());
    t.router_ctl_ok(&["detach"]);
}

/// A router with traffic shaping on its WAN (an HTB root, as SQM sets
/// up): `apply` applies and warns, naming the qdisc.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_file_applies_over_traffic_shaping_and_warns() {
    let t = Topology::new();
    t.warm_neighbours();
    t.exec_ok(
        Ns::Router,
        &[
            "tc", "qdisc", "add", "dev", "wan0", "root", "handle", "1:", "htb",
        ],
    );
    let o = t.router_ctl(&["apply", example().path()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("wan0: qdisc htb 1: (root): the flows the fast path carries skip it"),
        "no warning: {}",
        stderr(&o)
    );
    assert!(t.router_attached());
    t.router_ctl_ok(&["detach"]);
}

/// An attach or a file that states no admit mode keeps the attached
/// router's: a standalone router stays standalone (its LAN flows would
/// otherwise go to a kernel without a NAT rule of its own), here with the
/// shipped example minus its `admit` line, whose port forwards offload
/// mode would refuse.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_unstated_admit_mode_keeps_the_attached_routers() {
    let t = Topology::new();
    t.warm_neighbours();
    t.router_ctl_ok(&["attach", tests::LAN_IF, tests::WAN_IF, "--admit", "xdp"]);
    let admit = |t: &Topology| status(t).0["record"]["config"]["admit"].clone();
    assert_eq!(admit(&t), "xdp");
    let out = t.router_ctl_ok(&["attach", tests::LAN_IF, tests::WAN_IF]);
    assert!(
        out.contains("keeping the attached router's mode, admit xdp"),
        "{out}"
    );
    assert_eq!(admit(&t), "xdp", "attach without --admit switched the mode");

    let text = example_text()
        .lines()
        .filter(|l| !l.trim_start().starts_with("admit"))
        .fold(String::new(), |t, l| t + l + "\n");
    assert!(!text.contains("admit ="), "{text}");
    let file = TempFile::new("no-admit", &text);
    let out = t.router_ctl_ok(&["apply", file.path()]);
    assert!(
        out.contains("keeping the attached router's mode, admit xdp"),
        "{out}"
    );
    assert_eq!(admit(&t), "xdp", "a file without admit switched the mode");
    port_forward_works(&t);

    // An unreadable record (a downgrade, a truncated file): the pinned
    // configuration still says standalone.
    let record = format!(
        "{}/{}.json",
        crate::ctl::STATE_DIR,
        t.ns_name(tests::Ns::Router)
    );
    std::fs::write(&record, "{").unwrap();
    let out = t.router_ctl_ok(&["attach", tests::LAN_IF, tests::WAN_IF]);
    assert!(
        out.contains("keeping the attached router's mode, admit xdp"),
        "{out}"
    );
    assert_eq!(admit(&t), "xdp", "an unreadable record switched the mode");

    // Detached (as for a resize or an upgrade that changes a map's
    // layout): attach again, or the service's file, keeps standalone mode.
    t.router_ctl_ok(&["detach"]);
    let out = t.router_ctl_ok(&["apply", file.path()]);
    assert!(
        out.contains("keeping the mode the router had when it was detached, admit xdp"),
        "{out}"
    );
    assert_eq!(
        admit(&t),
        "xdp",
        "a detach and a file without admit switched the mode"
    );
    t.router_ctl_ok(&["detach"]);
    let out = t.router_ctl_ok(&["attach", tests::LAN_IF, tests::WAN_IF]);
    assert!(out.contains("admit xdp"), "{out}");
    assert_eq!(admit(&t), "xdp", "a detach and attach switched the mode");

    // A router never attached here gets offload mode.
    t.router_ctl_ok(&["detach"]);
    tests::forget_detached_router(t.ns_name(tests::Ns::Router));
    let out = t.router_ctl_ok(&["attach", tests::LAN_IF, tests::WAN_IF]);
    assert!(!out.contains("keeping"), "{out}");
    assert_eq!(admit(&t), "kernel");

    // A detach cut short after it cleared CONFIG, its record gone too (as
    // a failed unpin leaves it): the all-zero CONFIG configures nothing
    // (its admit byte reads as xdp), so the next attach gets offload mode.
    let o = ctl_env(
        &t,
        &[("ROUTER_CTL_CRASH_AT", "detach-after-unconfigure")],
        &["detach"],
    );
    assert!(!o.status.success(), "the crash point was not reached");
    std::fs::remove_file(&record).unwrap();
    let out = t.router_ctl_ok(&["attach", tests::LAN_IF, tests::WAN_IF]);
    assert!(!out.contains("keeping"), "{out}");
    assert_eq!(admit(&t), "kernel");
}
