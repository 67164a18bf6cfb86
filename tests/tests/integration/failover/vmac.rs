//! keepalived `use_vmac` on the failover pair: VRRP on macvlans carrying
//! the virtual MACs (RFC 5798 7.3), so the client's gateway resolves to
//! `00:00:5e:00:01:3d` and the server's route back to the WAN VIP to
//! `00:00:5e:00:01:3e`. The master's XDP forwards the frames to those
//! MACs (both directions); after it steps down (a lower priority, keepalived
//! reloaded: its macvlans stay up with the MACs, without the addresses) the
//! new master's does, and the former master passes the frames a flooding
//! switch still sends it (`pass_not_for_us`), forwarding none.

use std::{fmt::Write as _, process::Command, time::Duration};

use tests::{LAN_IF, WAN_IF, counter_of};

use super::{LAN_VIP, R1, R2, Router, WAN_VIP, pair::Pair, traffic::UdpFlow};
use crate::{
    ctl::{read_until, stderr, stdout, wait_for_or_show},
    metrics,
};

/// The macvlans keepalived creates, one per instance.
const LAN_VMAC_IF: &str = "vrrp.61";
const WAN_VMAC_IF: &str = "vrrp.62";
/// `00:00:5e:00:01:VRID`.
const LAN_VMAC: &str = "00:00:5e:00:01:3d";
const WAN_VMAC: &str = "00:00:5e:00:01:3e";

/// keepalived's configuration for router `r` with `priority`: the
/// example's two instances in a sync group, each on its macvlan.
fn keepalived_conf(r: Router, priority: u8) -> String {
    // The LAN VIP carries a label (its name in `getifaddrs`), which the
    // router must not take for the interface's.
    let instance = |name: &str, dev: &str, vrid: u8, vmac_if: &str, vip: &str| {
        format!(
            "vrrp_instance {name} {{
    state {state}
    interface {dev}
    virtual_router_id {vrid}
    priority {priority}
    advert_int 0.5
    use_vmac {vmac_if}
    virtual_ipaddress {{
        {vip}
    }}
}}
",
            state = r.state,
        )
    };
    format!(
        "global_defs {{
    router_id {role}
    vrrp_version 3
    script_user root
    vrrp_garp_master_delay 1
    vrrp_garp_master_repeat 3
}}
vrrp_sync_group ROUTER {{
    group {{
        LAN
        WAN
    }}
}}
{lan}{wan}",
        role = r.role,
        lan = instance(
            "LAN",
            LAN_IF,
            61,
            LAN_VMAC_IF,
            &format!("{LAN_VIP}/24 label {LAN_VMAC_IF}:vip")
        ),
        wan = instance("WAN", WAN_IF, 62, WAN_VMAC_IF, &format!("{WAN_VIP}/24")),
    )
}

impl Pair {
    fn vmac_conf_path(&self, r: Router) -> std::path::PathBuf {
        self.file(&format!("{}-vmac-keepalived.conf", r.role))
    }

    /// keepalived (VRRP only) with `use_vmac` on router `r`.
    fn start_vmac_keepalived(&self, r: Router) {
        let conf = self.vmac_conf_path(r);
        std::fs::write(&conf, keepalived_conf(r, r.priority)).unwrap();
        let pid = |what: &str| {
            self.file(&format!("{}-{what}.pid", r.role))
                .display()
                .to_string()
        };
        self.spawn(
            "keepalived",
            Command::new("ip")
                .args(["netns", "exec", &self.ns(r.role), "keepalived"])
                .args([
                    "--dont-fork",
                    "--log-console",
                    "--no-syslog",
                    "--vrrp",
                    "-f",
                ])
                .arg(&conf)
                .args(["-p", &pid("keepalived"), "-r", &pid("vrrp")])
                .args(["-c", &pid("checkers")]),
            &self.file(&format!("{}-keepalived.out", r.role)),
        );
    }

    /// Sends `signal` to router `r`'s keepalived.
    fn signal_keepalived(&self, r: Router, signal: libc::c_int) {
        let pid = self.read(&format!("{}-keepalived.pid", r.role));
        let pid: libc::pid_t = pid.trim().parse().expect("keepalived's pid file");
        // SAFETY: kill(2) on the keepalived this test started (its pid
        // file, while it runs).
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal {signal}");
    }

    /// Router `r`'s keepalived reloads with `priority` (SIGHUP).
    fn set_priority(&self, r: Router, priority: u8) {
        std::fs::write(self.vmac_conf_path(r), keepalived_conf(r, priority)).unwrap();
        self.signal_keepalived(r, libc::SIGHUP);
    }

    /// Whether router `r` has the macvlan `dev`.
    fn has_link(&self, r: Router, dev: &str) -> bool {
        self.exec(r.role, &["ip", "link", "show", dev])
            .status
            .success()
    }

    /// Whether router `r` holds both VIPs on its macvlans.
    fn has_vmac_vips(&self, r: Router) -> bool {
        [(LAN_VMAC_IF, LAN_VIP), (WAN_VMAC_IF, WAN_VIP)]
            .iter()
            .all(|(dev, vip)| {
                let out = self.exec(r.role, &["ip", "-4", "-o", "addr", "show", "dev", dev]);
                String::from_utf8_lossy(&out.stdout).contains(&format!(" {vip}/"))
            })
    }

    /// Empties router `r`'s virtual MAC map behind its daemon's back (with
    /// bpftool), as an attach that looked at the links just before a VRRP
    /// transition would leave it.
    fn clear_vmac_map(&self, r: Router) {
        let path = format!("/sys/fs/bpf/xdp-router/{}/VIRTUAL_MACS", self.ns(r.role));
        let out = tests::host::run(&["bpftool", "-j", "map", "dump", "pinned", &path]);
        let dump: serde_json::Value = serde_json::from_str(&stdout(&out))
            .unwrap_or_else(|e| panic!("bpftool map dump {path}: {e}: {}", stderr(&out)));
        let entries = dump.as_array().expect("a dump is a list");
        assert!(!entries.is_empty(), "nothing to clear in {path}");
        for e in entries {
            let key: Vec<&str> = e["key"]
                .as_array()
                .unwrap_or_else(|| panic!("no key bytes in {e}"))
                .iter()
                .map(|b| b.as_str().expect("a key byte"))
                .collect();
            let mut cmd = vec!["bpftool", "map", "delete", "pinned", &path, "key"];
            cmd.extend(key);
            tests::host::run_ok(&cmd);
        }
    }

    /// The virtual MACs `status --json` says router `r`'s data path accepts.
    fn accepted_vmacs(&self, r: Router) -> Vec<String> {
        // Not `router_ctl_ok`: without its daemon an offload-mode router's
        // status exits 1 (degraded), and some steps stop the daemon.
        let o = self.router_ctl(r, &["status", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&o))
            .unwrap_or_else(|e| panic!("{} status --json: {e}: {}", r.role, stderr(&o)));
        // Absent when status could not read the map: not "none".
        let mut macs: Vec<String> = v["virtual_macs"]
            .as_array()
            .unwrap_or_else(|| panic!("{} status lists no virtual_macs: {v}", r.role))
            .iter()
            .map(|m| format!("{} {}", m["interface"].as_str().unwrap_or("?"), m["mac"]))
            .collect();
        macs.sort();
        macs
    }

    /// Router `r`'s counters (`stats --json`).
    fn stats(&self, r: Router) -> serde_json::Value {
        serde_json::from_str(&self.router_ctl_ok(r, &["stats", "--json"])).unwrap()
    }

    fn vmac_logs(&self) -> String {
        let mut s = String::new();
        for r in [R1, R2] {
            for f in ["keepalived.out", "daemon.out"] {
                let name = format!("{}-{f}", r.role);
                let _ = writeln!(s, "--- {name}\n{}", self.read(&name));
            }
        }
        s
    }
}

/// The virtual MACs of both instances, as `accepted_vmacs` lists them.
fn both_vmacs() -> Vec<String> {
    vec![
        format!("{LAN_IF} \"{LAN_VMAC}\""),
        format!("{WAN_IF} \"{WAN_VMAC}\""),
    ]
}

/// Packets router `r`'s XDP forwarded (both directions) and passed as not
/// addressed to it, between `before` and `after`.
fn deltas(before: &serde_json::Value, after: &serde_json::Value) -> (u64, u64) {
    let d = |name| counter_of(after, name) - counter_of(before, name);
    (d("fwd_outbound") + d("fwd_inbound"), d("pass_not_for_us"))
}

/// Both routers' keepalived with `use_vmac`, r1 master; the forward rule
/// for the connections' first packets, which the kernel takes in on the
/// macvlan.
fn start_vrrp(pair: &Pair) {
    for r in [R1, R2] {
        pair.warm_neighbours(r);
        pair.exec_ok(
            r.role,
            &[
                "nft",
                "add",
                "rule",
                "inet",
                "xdp_failover",
                "forward",
                "iifname",
                LAN_VMAC_IF,
                "oifname",
                WAN_IF,
                "accept",
            ],
        );
        pair.start_vmac_keepalived(r);
    }
    wait_for_or_show(
        "r1 to be master with both VIPs on its macvlans, r2 backup with its macvlans up",
        Duration::from_secs(20),
        || pair.has_vmac_vips(R1) && !pair.has_vmac_vips(R2) && pair.has_link(R2, WAN_VMAC_IF),
        || pair.vmac_logs(),
    );
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn use_vmac_frames_are_forwarded_in_xdp_by_the_master_only() {
    let pair = Pair::new();
    start_vrrp(&pair);
    for r in [R1, R2] {
        pair.start_fast_path(r);
    }
    assert_eq!(pair.accepted_vmacs(R1), both_vmacs(), "the master's");
    assert!(
        pair.accepted_vmacs(R2).is_empty(),
        "the backup accepts none"
    );
    let doctor = pair.router_ctl(R1, &["doctor", LAN_IF, WAN_IF]);
    let doctor = String::from_utf8_lossy(&doctor.stdout);
    assert_eq!(
        doctor.matches("[ok]   virtual-macs").count(),
        2,
        "doctor on the master, both interfaces:\n{doctor}"
    );
    for (r, n) in [(R1, 2.0), (R2, 0.0)] {
        let m = metrics::Server::start_in(&pair.ns(r.role)).scrape();
        assert_eq!(
            m.get("xdp_router_virtual_macs"),
            Some(&n),
            "{}'s metric",
            r.role
        );
    }

    let udp = UdpFlow::start(&pair);
    let carried = |r: Router, what: &str| {
        wait_for_or_show(
            &format!("{} to offload the UDP flow ({what})", r.role),
            Duration::from_secs(10),
            || udp.echoes() > 20 && pair.offloaded(r) >= 1,
            || pair.vmac_logs(),
        );
        // About 200 packets in half a second; read until 100 went by.
        let before = pair.stats(r);
        let d = read_until(
            Duration::from_secs(5),
            || deltas(&before, &pair.stats(r)),
            |d| d.0 >= 100,
        );
        println!(
            "{} ({what}): XDP forwarded {}, passed as not for it {}",
            r.role, d.0, d.1
        );
        d
    };
    let (fwd, not_for_us) = carried(R1, "r1 master");
    // Once the flow is echoed the client has resolved its gateway (right
    // after the flow's start the entry may still be incomplete).
    let neigh = pair.exec_ok("cli", &["ip", "neigh", "show", &LAN_VIP.to_string()]);
    assert!(neigh.contains(LAN_VMAC), "the client's gateway: {neigh}");
    assert!(
        fwd >= 100 && not_for_us == 0,
        "r1's XDP forwarded {fwd} packets and passed {not_for_us} as not for it"
    );

    // A stale map (an attach that read the links before a transition and
    // wrote after the daemon followed it): the daemon, which looks at the
    // links now and then without a notification, puts it right.
    pair.clear_vmac_map(R1);
    assert!(pair.accepted_vmacs(R1).is_empty(), "cleared");
    wait_for_or_show(
        "r1's daemon to put its virtual MACs back without a notification",
        Duration::from_secs(25),
        || pair.accepted_vmacs(R1) == both_vmacs(),
        || pair.vmac_logs(),
    );

    // r1 steps down: r2 preempts it; r1's macvlans stay up, with their
    // MACs, without the VIPs.
    pair.set_priority(R1, 50);
    wait_for_or_show(
        "r2 to take both VIPs and r1's daemon to drop the virtual MACs",
        Duration::from_secs(20),
        || {
            pair.has_vmac_vips(R2)
                && !pair.has_vmac_vips(R1)
                && pair.accepted_vmacs(R1).is_empty()
                && pair.accepted_vmacs(R2) == both_vmacs()
        },
        || pair.vmac_logs(),
    );
    let (fwd, _) = carried(R2, "r2 master");
    assert!(fwd >= 100, "r2's XDP forwarded only {fwd} packets in 5 s");
    // A LAN switch that floods (it learns no MAC): r1 sees the client's
    // frames to the virtual MAC again, and its XDP must not forward them.
    pair.ip(
        "lan",
        &["link", "set", "br0", "type", "bridge", "ageing_time", "0"],
    );
    let before = pair.stats(R1);
    let (fwd, not_for_us) = read_until(
        Duration::from_secs(5),
        || deltas(&before, &pair.stats(R1)),
        |d| d.1 >= 50,
    );
    assert!(
        fwd == 0 && not_for_us >= 50,
        "the former master's XDP forwarded {fwd} packets and passed {not_for_us} as not for it"
    );
    let (sent, echoed, _) = udp.finish();
    assert!(
        echoed > 0 && echoed <= sent,
        "UDP: {echoed} of {sent} echoed"
    );
}

/// keepalived stopped on the master deletes its macvlans: the daemon
/// (`RTM_DELLINK`) removes their MACs from the data path. A router that
/// runs no daemon is flagged by `doctor`: nothing would follow keepalived.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_stopped_keepalived_takes_its_virtual_macs_along_and_doctor_asks_for_the_daemon() {
    let pair = Pair::new();
    start_vrrp(&pair);
    pair.start_fast_path(R1);
    // The backup, attached without `router-ctl run`.
    pair.attach(R2);
    assert_eq!(pair.accepted_vmacs(R1), both_vmacs(), "the master's");
    assert!(pair.accepted_vmacs(R2).is_empty(), "the backup's");
    let doctor = |r: Router| {
        let out = pair.router_ctl(r, &["doctor", LAN_IF, WAN_IF]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let no_daemon = "no `router-ctl run` is running";
    let d1 = doctor(R1);
    assert!(
        !d1.contains(no_daemon),
        "doctor on r1 (daemon running):\n{d1}"
    );
    let d2 = doctor(R2);
    assert!(
        d2.contains("[warn] virtual-macs")
            && d2.contains(no_daemon)
            && d2.contains(LAN_VMAC_IF)
            && d2.contains(WAN_VMAC_IF),
        "doctor on r2 (no daemon, keepalived's macvlans):\n{d2}"
    );

    pair.signal_keepalived(R1, libc::SIGTERM);
    wait_for_or_show(
        "r1's keepalived to delete its macvlans and r1's daemon to drop their MACs",
        Duration::from_secs(20),
        || {
            !pair.has_link(R1, LAN_VMAC_IF)
                && !pair.has_link(R1, WAN_VMAC_IF)
                && pair.accepted_vmacs(R1).is_empty()
        },
        || pair.vmac_logs(),
    );
    let log = pair.read(&format!("{}-daemon.out", R1.role));
    assert!(
        log.contains(&format!(
            "no longer forwarding frames to the virtual MAC {LAN_VMAC}"
        )),
        "r1's daemon log:\n{log}"
    );
}
