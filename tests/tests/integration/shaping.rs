//! Traffic shaping on an attached interface, which the fast path's flows
//! skip: sqm-scripts' layout (HTB on the WAN for the upload; an ingress
//! qdisc whose u32 filter redirects to an IFB, shaped by HTB too, for the
//! download). `attach` and `doctor` warn of it, naming it, the daemon
//! follows it, and the qdiscs' own counters show what the warning says:
//! the kernel path's packets go through both, the fast path's through
//! neither.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use tests::{CLIENT_ADDR, LAN_IF, Ns, SERVER_ADDR, Topology, WAN_IF, socket_addr};

use crate::ctl::{DetachOnDrop, status, stderr, stdout, wait_for_or_show};
use crate::offload::Daemon;

const IFB: &str = "ifb4wan0";

/// sqm-scripts' `simple.qos` in outline, at a rate the test never reaches
/// (the qdiscs count packets; nothing is held back).
fn set_up_sqm(t: &Topology) {
    let tc = |args: &str| t.exec_line_ok(Ns::Router, &format!("tc {args}"));
    // A first ifb link loads the module where it is one, which makes
    // `numifbs` (2) devices in the host's namespace: loaded first with
    // none (a no-op where it is loaded or built in).
    let _ = std::process::Command::new("modprobe")
        .args(["-q", "ifb", "numifbs=0"])
        .stderr(std::process::Stdio::null())
        .status();
    let host_links = || {
        let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let before = host_links();
    t.exec_ok(Ns::Router, &["ip", "link", "add", IFB, "type", "ifb"]);
    assert_eq!(
        host_links(),
        before,
        "the ifb link made interfaces in the host's namespace"
    );
    t.exec_ok(Ns::Router, &["ip", "link", "set", IFB, "up"]);
    tc("qdisc add dev wan0 root handle 1: htb default 10");
    tc("class add dev wan0 parent 1: classid 1:10 htb rate 10gbit");
    tc("qdisc add dev ifb4wan0 root handle 1: htb default 10");
    tc("class add dev ifb4wan0 parent 1: classid 1:10 htb rate 10gbit");
    tc("qdisc add dev wan0 handle ffff: ingress");
    tc(
        "filter add dev wan0 parent ffff: protocol all prio 10 u32 match u32 0 0 flowid 1:1 \
         action mirred egress redirect dev ifb4wan0",
    );
}

/// Packets the root HTB of `dev` sent (`tc -s`).
fn htb_sent(t: &Topology, dev: &str) -> u64 {
    let out = t.exec_ok(Ns::Router, &["tc", "-s", "-j", "qdisc", "show", "dev", dev]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("tc -j");
    v.as_array()
        .and_then(|qs| qs.iter().find(|q| q["kind"] == "htb"))
        .and_then(|q| q["packets"].as_u64())
        .unwrap_or_else(|| panic!("no htb on {dev}: {out}"))
}

/// `n` UDP round trips of one flow, client to server and back; how many
/// came back.
fn udp_round_trips(t: &Topology, n: usize) -> usize {
    let srv = t.in_ns(Ns::Server, || {
        UdpSocket::bind(socket_addr(SERVER_ADDR, 0)).expect("bind server")
    });
    let cli = t.in_ns(Ns::Client, || {
        UdpSocket::bind(socket_addr(CLIENT_ADDR, 0)).expect("bind client")
    });
    for s in [&srv, &cli] {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    }
    let dst: SocketAddr = srv.local_addr().unwrap();
    let mut buf = [0u8; 256];
    let mut back = 0;
    for i in 0..n {
        let payload = [u8::try_from(i % 251).unwrap(); 200];
        cli.send_to(&payload, dst).unwrap();
        let Ok((len, from)) = srv.recv_from(&mut buf) else {
            continue;
        };
        srv.send_to(&buf[..len], from).unwrap();
        if cli.recv(&mut buf).is_ok_and(|l| buf[..l] == payload[..]) {
            back += 1;
        }
    }
    back
}

/// Offload mode (the default) and standalone alike: attach warns of the
/// shaping, naming each qdisc and hook, and attaches; doctor warns too
/// (and counts a clsact qdisc by its filters). The qdiscs' counters show
/// the warning is true: on the kernel path every packet of a flow goes
/// through both shapers, on the fast path none after the first.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn attach_warns_of_traffic_shaping_the_fast_path_skips() {
    const N: usize = 100;
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    t.warm_neighbours();
    set_up_sqm(&t);
    // The kernel path (plain forwarding): every packet through both
    // shapers.
    t.route_back();
    let (up0, down0) = (htb_sent(&t, WAN_IF), htb_sent(&t, IFB));
    assert_eq!(udp_round_trips(&t, N), N, "kernel path");
    let (up1, down1) = (htb_sent(&t, WAN_IF), htb_sent(&t, IFB));
    assert!(
        up1 - up0 >= N as u64 && down1 - down0 >= N as u64,
        "the shapers did not see the kernel path's packets: upload {}, download {}",
        up1 - up0,
        down1 - down0
    );

    let warning = "wan0: qdisc htb 1: (root) and tc filters on ingress (u32): the flows the \
                   fast path carries skip them";
    for admit in ["kernel", "xdp"] {
        let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", admit]);
        let e = stderr(&o);
        assert!(o.status.success(), "{admit}: {e}");
        for needle in [
            warning,
            "XDP runs before tc ingress",
            "/etc/init.d/sqm stop",
        ] {
            assert!(e.contains(needle), "{admit}: {needle:?} not in {e}");
        }
        assert!(
            !e.contains("lan0: qdisc"),
            "{admit}: the LAN has no shaping: {e}"
        );
        t.router_ctl_ok(&["detach"]);
    }
    let d = stdout(&t.router_ctl(&["doctor", LAN_IF, WAN_IF]));
    let line = |d: &str, needle: &str| {
        d.lines()
            .filter(|l| l.contains("shaping"))
            .find(|l| l.contains(needle))
            .map(str::to_owned)
    };
    let wan_line = line(&d, "qdisc htb").unwrap_or_else(|| panic!("doctor: {d}"));
    assert!(wan_line.contains("[warn]"), "{wan_line}");
    assert!(
        line(&d, "no traffic shaping").is_some_and(|l| l.contains("[ok]")),
        "the LAN's check: {d}"
    );
    // A clsact qdisc counts by its filters: none on the LAN's, then one on
    // its egress hook.
    let lan_tc = |args: &str| t.exec_line_ok(Ns::Router, &format!("tc {args}"));
    lan_tc("qdisc add dev lan0 clsact");
    let d = stdout(&t.router_ctl(&["doctor", LAN_IF, WAN_IF]));
    assert!(line(&d, "no traffic shaping").is_some(), "{d}");
    lan_tc("filter add dev lan0 egress protocol all prio 10 u32 match u32 0 0 flowid 1:1");
    let d = stdout(&t.router_ctl(&["doctor", LAN_IF, WAN_IF]));
    assert!(line(&d, "tc filters on egress (u32)").is_some(), "{d}");
    lan_tc("qdisc del dev lan0 clsact");

    // And it is so: the flow's packets pass neither shaper once XDP
    // carries the flow (its first packet may take the kernel path).
    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (up0, down0) = (htb_sent(&t, WAN_IF), htb_sent(&t, IFB));
    assert_eq!(udp_round_trips(&t, N), N, "fast path");
    let (up1, down1) = (htb_sent(&t, WAN_IF), htb_sent(&t, IFB));
    assert!(
        up1 - up0 < 5 && down1 - down0 < 5,
        "the fast path's packets went through the shapers: upload {}, download {}",
        up1 - up0,
        down1 - down0
    );
}

/// Shaping set up after attach (an SQM service that starts after the
/// router's at boot) is not seen by attach: a running daemon notices it from
/// the qdisc notification, logs it and keeps it in its status (`status`
/// says it), and notices its removal too.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn the_daemon_tells_of_shaping_set_up_after_attach() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    t.warm_neighbours();
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF]);
    let daemon = Daemon::start(&t, &[]);
    let skipped = |t: &Topology| status(t).0["daemon"]["shaping_skipped"].clone();
    // Looked at in the first tick (null before).
    wait_for_or_show(
        "the daemon's first look",
        Duration::from_secs(8),
        || skipped(&t) == serde_json::json!([]),
        || format!("{}\ndaemon log:\n{}", skipped(&t), daemon.log()),
    );
    t.exec_ok(
        Ns::Router,
        &[
            "tc", "qdisc", "add", "dev", WAN_IF, "root", "handle", "1:", "htb",
        ],
    );
    // Well before the periodic look (15 s): the notification asks for it.
    wait_for_or_show(
        "the daemon to notice the shaping",
        Duration::from_secs(8),
        || skipped(&t) == serde_json::json!(["wan0: qdisc htb 1: (root)"]),
        || format!("{}\ndaemon log:\n{}", skipped(&t), daemon.log()),
    );
    assert!(
        daemon
            .log()
            .contains("traffic shaping or tc rules on the attached interfaces: wan0: qdisc htb"),
        "{}",
        daemon.log()
    );
    let text = stdout(&t.router_ctl(&["status"]));
    assert!(
        text.contains("shaping skipped: wan0: qdisc htb 1: (root)"),
        "{text}"
    );
    t.exec_ok(Ns::Router, &["tc", "qdisc", "del", "dev", WAN_IF, "root"]);
    wait_for_or_show(
        "the daemon to notice the shaping's removal",
        Duration::from_secs(8),
        || skipped(&t) == serde_json::json!([]),
        || format!("{}\ndaemon log:\n{}", skipped(&t), daemon.log()),
    );
    assert!(
        daemon.log().contains("no traffic shaping"),
        "{}",
        daemon.log()
    );
}
