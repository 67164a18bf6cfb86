//! The daemon as a service: the shipped systemd unit passes
//! `systemd-analyze verify`, and `run --config` applies the file at start,
//! re-applies it on SIGHUP (a bad file changes nothing and the daemon
//! lives on; a mode switch is followed), talks `Type=notify` and leaves
//! the data path attached on stop.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tests::{Topology, router_ctl_bin};

use crate::ctl::{DetachOnDrop, stderr, stdout};
use crate::daemon_run::{RunningDaemon, Scratch, config_text};

const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../examples/systemd/xdp-router.service"
);
/// Where the unit expects the binary (the README's install command puts it
/// there).
const INSTALLED_BIN: &str = "/usr/local/bin/router-ctl";

/// `systemd-analyze verify` of a unit file: (success, everything it said).
fn verify(unit: &Path) -> (bool, String) {
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(unit)
        .output()
        .expect("systemd-analyze (Debian package systemd; `cargo xtask setup` installs it)");
    (o.status.success(), format!("{}{}", stdout(&o), stderr(&o)))
}

#[test]
fn systemd_unit_passes_systemd_analyze_verify() {
    let text = std::fs::read_to_string(UNIT).expect("the shipped unit");
    assert!(
        text.contains(&format!(
            "ExecStart={INSTALLED_BIN} run --config /etc/xdp-router/router.toml"
        )),
        "{text}"
    );
    // A reload checks the file first (a refused one fails the reload).
    assert!(
        text.contains(&format!(
            "ExecReload={INSTALLED_BIN} apply --check /etc/xdp-router/router.toml\nExecReload=/bin/kill -HUP $MAINPID"
        )),
        "{text}"
    );
    for line in [
        "Type=notify",
        "After=network-online.target",
        "Wants=network-online.target",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "WantedBy=multi-user.target",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in the unit");
    }
    // verify checks that ExecStart's binary exists: point it at the one
    // this build made (the unit file name stays, it names the unit).
    let scratch = Scratch::new("unit");
    let unit = scratch.path("xdp-router.service");
    let bin = router_ctl_bin();
    std::fs::write(
        &unit,
        text.replace(INSTALLED_BIN, bin.to_str().expect("utf-8 path")),
    )
    .unwrap();
    let (ok, said) = verify(&unit);
    assert!(
        ok && said.trim().is_empty(),
        "systemd-analyze verify:\n{said}"
    );
    // The check can fail: an unknown key is reported.
    std::fs::write(
        &unit,
        std::fs::read_to_string(&unit)
            .unwrap()
            .replace("WatchdogSec=", "WatchdogSecs="),
    )
    .unwrap();
    let (_, said) = verify(&unit);
    assert!(
        said.contains("Unknown key"),
        "a broken unit passed:\n{said}"
    );
}

fn rules(t: &Topology) -> Vec<(String, u64, String)> {
    let o = t.router_ctl_ok(&["forward", "list", "--json"]);
    let v: Value = serde_json::from_str(&o).unwrap_or_else(|e| panic!("{e}: {o}"));
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["proto"].as_str().unwrap().to_owned(),
                r["wan_port"].as_u64().unwrap(),
                format!("{}:{}", r["lan_addr"].as_str().unwrap(), r["lan_port"]),
            )
        })
        .collect()
}

/// Sends SIGHUP and waits for the reload to finish (RELOADING=1, READY=1).
/// The daemon's "reloaded FILE" and "reload of FILE failed" lines in
/// `log` (it keeps the earlier ones: a reload is checked by its own).
fn reloads(log: &str, file: &str) -> (usize, usize) {
    let done = format!("router-ctl run: reloaded {file}");
    let failed = format!("router-ctl run: reload of {file} failed");
    (
        log.lines().filter(|l| *l == done).count(),
        log.lines().filter(|l| l.starts_with(&failed)).count(),
    )
}

/// The last reload of `file` succeeded: one "reloaded" line more than
/// `before`, and no failure.
fn one_more_reload(d: &RunningDaemon, file: &str, before: (usize, usize)) {
    // Its line may still be on its way from the daemon's stderr.
    crate::ctl::wait_for("the reload's own line", Duration::from_secs(5), || {
        reloads(&d.log(), file).0 > before.0
    });
    assert_eq!(
        reloads(&d.log(), file),
        (before.0 + 1, before.1),
        "{}",
        d.log()
    );
}

fn reload(d: &mut RunningDaemon) {
    d.signal(libc::SIGHUP);
    d.wait_note("RELOADING=1", Duration::from_secs(10));
    d.wait_note("READY=1", Duration::from_secs(30));
}

/// The same file reloaded: nothing changes, and apply says so for this
/// reload (the log before it has attach's own "nothing changed").
fn reload_unchanged(t: &Topology, d: &mut RunningDaemon) {
    let unchanged = |log: &str| {
        log.lines()
            .filter(|l| l.starts_with("applied ") && l.ends_with(": nothing changed"))
            .count()
    };
    let (unchanged0, before, prog0) = (
        unchanged(&d.log()),
        rules(t),
        crate::ctl::prog_ids(&crate::ctl::status(t).0),
    );
    reload(d);
    assert_eq!(unchanged(&d.log()), unchanged0 + 1, "{}", d.log());
    assert_eq!(rules(t), before, "the same file changed the rules");
    assert_eq!(
        crate::ctl::prog_ids(&crate::ctl::status(t).0),
        prog0,
        "the same file replaced the program"
    );
}

/// Broken files: a syntax error, a bad value, an interface that does not
/// exist (found only after parsing), a table resize (valid, refused by the
/// attach itself). Each is refused and logged; the router
/// keeps its rules and program; the daemon lives on.
fn refuse_bad_files(
    t: &Topology,
    d: &mut RunningDaemon,
    file: &Path,
    before: &[(String, u64, String)],
) {
    let prog_before = crate::ctl::prog_ids(&crate::ctl::status(t).0);
    for (what, text) in [
        ("syntax", "[interfaces\nlan = ".to_owned()),
        (
            "bad port",
            config_text("1024-60999", &[("tcp", 70000, "192.168.50.2:80")]),
        ),
        (
            "missing interface",
            config_text("1024-60999", &[]).replace(tests::LAN_IF, "nosuch0"),
        ),
        // Valid, but refused by the attach itself: a live table resize.
        (
            "table resize",
            config_text("1024-60999", &[]).replace("[nat]\n", "[nat]\nmax_flows = 1000\n"),
        ),
    ] {
        assert!(
            text.contains("max_flows") == (what == "table resize"),
            "{text}"
        );
        std::fs::write(file, text).unwrap();
        // Said as refused with nothing changed, not as failed part way.
        let refusals = |log: &str| {
            log.lines()
                .filter(|l| l.starts_with("router-ctl run: reload of") && l.contains(" refused: "))
                .count()
        };
        let before_reload = refusals(&d.log());
        reload(d);
        assert!(d.running(), "daemon died on a {what} file:\n{}", d.log());
        assert_eq!(
            refusals(&d.log()),
            before_reload + 1,
            "{what} not reported as refused:\n{}",
            d.log()
        );
        assert!(
            !d.log().contains("applying it failed"),
            "{what} reported as failed part way:\n{}",
            d.log()
        );
        assert_eq!(rules(t), before, "{what} changed the rules");
        assert_eq!(
            crate::ctl::prog_ids(&crate::ctl::status(t).0),
            prog_before,
            "{what} changed the program"
        );
    }
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn run_config_applies_at_start_and_reloads_on_sighup() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    t.warm_neighbours();
    let scratch = Scratch::new("reload");
    let file = scratch.path("router.toml");
    std::fs::write(
        &file,
        config_text("1024-60999", &[("tcp", 8080, "192.168.50.2:80")]),
    )
    .unwrap();
    let file_arg = file.to_str().unwrap();
    // No listener: the default port on the host's loopback is shared by
    // every run on the machine.
    let mut d = RunningDaemon::start(
        &t,
        None,
        &scratch,
        &["--config", file_arg, "--listen", "none"],
    );
    // Applied at start: attached in standalone mode, with the file's rule.
    assert!(t.router_attached(), "{}", d.log());
    assert_eq!(
        rules(&t),
        [("tcp".into(), 8080, "192.168.50.2:80".into())],
        "{}",
        d.log()
    );
    let status: Value = serde_json::from_str(&t.router_ctl_ok(&["status", "--json"])).unwrap();
    println!("status after start: {status}");

    // A changed file, applied on SIGHUP.
    std::fs::write(
        &file,
        config_text(
            "1024-60999",
            &[
                ("udp", 5353, "192.168.50.2:53"),
                ("tcp", 2222, "192.168.50.2:22"),
            ],
        ),
    )
    .unwrap();
    let before_reload = reloads(&d.log(), file_arg);
    reload(&mut d);
    assert_eq!(
        rules(&t),
        [
            ("tcp".into(), 2222, "192.168.50.2:22".into()),
            ("udp".into(), 5353, "192.168.50.2:53".into())
        ],
        "{}",
        d.log()
    );
    one_more_reload(&d, file_arg, before_reload);
    reload_unchanged(&t, &mut d);
    let before = rules(&t);

    refuse_bad_files(&t, &mut d, &file, &before);

    // A reload that switches the mode: offload (no forward rules in the
    // file, they are the kernel's DNAT rules then). The daemon follows.
    std::fs::write(
        &file,
        config_text("1024-60999", &[]).replace("admit = \"xdp\"", "admit = \"kernel\""),
    )
    .unwrap();
    let before_reload = reloads(&d.log(), file_arg);
    reload(&mut d);
    one_more_reload(&d, file_arg, before_reload);
    crate::ctl::wait_for(
        "the daemon in offload mode",
        Duration::from_secs(10),
        || {
            let (v, _) = crate::ctl::status(&t);
            v["admit"] == "kernel" && v["daemon"]["admit"] == "kernel"
        },
    );
    assert!(rules(&t).is_empty());
    assert!(
        !d.log().contains("trying again at the next tick"),
        "{}",
        d.log()
    );
    // Followed as an attach that changes the mode is, and counted so.
    let (v, _) = crate::ctl::status(&t);
    assert_eq!(
        v["daemon"]["reattaches_followed"],
        1,
        "the mode change by SIGHUP is counted: {v}\n{}",
        d.log()
    );
    println!("daemon log:\n{}", d.log());

    // Stop: exit 0, STOPPING=1, and the data path stays attached (the
    // documented state, docs/operations.md "As a service").
    let st = d.stop();
    assert!(st.success(), "exit {st}:\n{}", d.log());
    assert!(
        d.notes()
            .iter()
            .any(|n| n.lines().any(|l| l == "STOPPING=1")),
        "{:?}",
        d.notes()
    );
    // Attached, but offload mode carries nothing without its daemon: the
    // exit status says so.
    crate::ctl::assert_offload_without_daemon(&t);
}

/// A SIGHUP while the daemon applies its file at start (a hook that
/// reloads the service as it comes up) is a reload once it runs, not the
/// end of it (SIGHUP's default action before its handler).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_sighup_during_the_start_up_apply_reloads_once_running() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    t.warm_neighbours();
    let scratch = Scratch::new("early-hup");
    let file = scratch.path("router.toml");
    std::fs::write(&file, config_text("1024-60999", &[])).unwrap();
    let file = file.to_str().unwrap();
    let mut d = RunningDaemon::start_env(
        &t,
        None,
        &scratch,
        &["--config", file, "--listen", "none"],
        &[("ROUTER_CTL_SIGNAL_AT", "fresh-after-record:HUP")],
    );
    assert!(
        d.log().contains("SIGHUP injected at fresh-after-record"),
        "{}",
        d.log()
    );
    d.wait_note("RELOADING=1", Duration::from_secs(10));
    d.wait_note("READY=1", Duration::from_secs(30));
    one_more_reload(&d, file, (0, 0));
    assert!(d.stop().success(), "{}", d.log());
}

/// A router's commands leave no file of its namespace behind once they
/// are done, so `/run/xdp-router` and `/var/lib/xdp-router` keep nothing
/// for a namespace long gone: `apply`'s lock goes when it ends, the
/// daemon's lock, status file and the temporary file its writes go through
/// when it stops, the router lock at detach, and the mode a detach noted
/// once the next attach (which keeps it) has a record saying it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_router_leaves_no_files_of_its_namespace_behind() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let ns = t.ns_name(tests::Ns::Router).to_owned();
    let run = |name: &str| Path::new(tests::LOCK_DIR).join(format!("{ns}.{name}"));
    let last_admit = Path::new(tests::STATE_DIR).join(format!("{ns}.last-admit"));
    let scratch = Scratch::new("files");
    let file = scratch.path("router.toml");
    std::fs::write(&file, config_text("1024-60999", &[])).unwrap();
    let file = file.to_str().unwrap();
    t.warm_neighbours();

    t.router_ctl_ok(&["apply", file]);
    assert!(!run("apply.lock").exists(), "apply left its lock");

    // No listener: the default port on the host's loopback is shared by
    // every run on the machine.
    let mut daemon =
        RunningDaemon::start(&t, None, &scratch, &["--config", file, "--listen", "none"]);
    assert!(run("daemon.lock").exists() && run("daemon.json").exists());
    assert!(daemon.stop().success(), "{}", daemon.log());
    for name in [
        "daemon.lock",
        "daemon.json",
        "daemon.json.tmp",
        "apply.lock",
    ] {
        assert!(!run(name).exists(), "the daemon left {name}");
    }

    t.router_ctl_ok(&["detach"]);
    assert!(!run("lock").exists(), "detach left the router's lock");
    assert_eq!(
        std::fs::read_to_string(&last_admit).ok().as_deref(),
        Some("xdp"),
        "detach notes the mode for the next attach"
    );
    // An attach that states no mode keeps it, then forgets the note: its
    // record says the mode now.
    let out = t.router_ctl_ok(&["attach", tests::LAN_IF, tests::WAN_IF]);
    assert!(out.contains("keeping the mode the router had"), "{out}");
    assert!(
        !last_admit.exists(),
        "attach left the detached router's mode"
    );
    let (v, _) = crate::ctl::status(&t);
    assert_eq!(v["record"]["config"]["admit"], "xdp", "{v}");
}
