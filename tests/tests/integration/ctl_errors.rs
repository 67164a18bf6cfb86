//! The errors an operator hits, each with a clear message and exit code 1:
//! missing capabilities (not root, or root without `CAP_NET_ADMIN`), a
//! missing interface or namespace, a verifier rejection (with the end of
//! the verifier log), bpffs that cannot be mounted, rule conflicts, bad
//! addresses and ports. Plus help, completions and the man page.

use std::process::{Command, Output, Stdio};

use tests::{LAN_IF, Ns, Topology, WAN_IF, router_ctl_bin};

use crate::ctl::*;

/// `PREFIX... router-ctl -n ROUTER ARGS`.
fn ctl_via(t: &Topology, prefix: &[&str], args: &[&str]) -> Output {
    let bin = router_ctl_bin();
    Command::new("timeout")
        .args(["-k", "5", "60"])
        .args(prefix)
        .arg(&bin)
        .arg("-n")
        .arg(t.ns_name(Ns::Router))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run")
}

fn fails_with(o: &Output, needles: &[&str]) -> String {
    let e = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(1),
        "stdout: {}\nstderr: {e}",
        stdout(o)
    );
    for n in needles {
        assert!(e.contains(n), "{n:?} not in: {e}");
    }
    e
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn missing_capabilities_are_named() {
    let t = Topology::new();
    // Not root, no capabilities.
    let nobody = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--",
    ];
    let o = ctl_via(&t, &nobody, &["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let e = fails_with(&o, &["other than root", "CAP_NET_ADMIN", "CAP_BPF", "sudo"]);
    println!("{e}");
    let o = ctl_via(&t, &nobody, &["stats"]);
    fails_with(&o, &["CAP_BPF"]);
    // Another uid cannot open root's owner-only pins even with CAP_BPF:
    // named, not taken for "not attached".
    let o = ctl_via(&t, &nobody, &["status"]);
    fails_with(&o, &["CAP_DAC_OVERRIDE", "run it as root"]);
    assert_ne!(o.status.code(), Some(3), "taken for not attached");
    // doctor reads the pins and the firewall, and enters the router's
    // namespace: named, not a bare setns error.
    let o = ctl_via(&t, &nobody, &["doctor", LAN_IF]);
    fails_with(&o, &["CAP_SYS_ADMIN (for -n NETNS)", "run it as root"]);
    // Root, but without CAP_NET_ADMIN: the uid alone is not enough.
    let no_net_admin = [
        "setpriv",
        "--bounding-set=-net_admin",
        "--inh-caps=-net_admin",
        "--",
    ];
    let o = ctl_via(
        &t,
        &no_net_admin,
        &["attach", LAN_IF, WAN_IF, "--admit", "xdp"],
    );
    let e = fails_with(&o, &["needs CAP_NET_ADMIN, which this root process lacks"]);
    println!("{e}");
    assert!(
        xdp_progs(&t, LAN_IF).is_empty(),
        "attached without CAP_NET_ADMIN"
    );

    attach(&t, &[]);
    // Reading works without CAP_NET_ADMIN, changing does not.
    let o = ctl_via(&t, &no_net_admin, &["stats", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for args in [
        &["detach"][..],
        &["forward", "add", "tcp", "8080", "192.168.50.2:80"],
        &["conntrack", "flush"],
    ] {
        let o = ctl_via(&t, &no_net_admin, args);
        fails_with(&o, &["CAP_NET_ADMIN"]);
    }
    assert_eq!(status(&t).1, 0, "still attached");
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn rule_changes_and_flushes_wait_for_the_routers_lock() {
    // While another router-ctl changes the router (here: its lock held),
    // `forward add/del` and `conntrack flush` wait for it and give up after
    // 10 s, rather than writing into maps a detach may be removing.
    let t = Topology::new();
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let lock = hold_router_lock(&t);
    let changes: [&[&str]; 3] = [
        &["forward", "add", "tcp", "8080", "192.168.50.2:80"],
        &["forward", "del", "tcp", "8080"],
        &["conntrack", "flush"],
    ];
    let refused: Vec<String> = std::thread::scope(|s| {
        let runs: Vec<_> = changes
            .iter()
            .map(|args| s.spawn(|| ctl_fails(&t, args)))
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (args, e) in changes.iter().zip(&refused) {
        assert!(
            e.contains("another router-ctl is changing this router"),
            "{args:?}: {e}"
        );
    }
    drop(lock);
    t.router_ctl_ok(&["forward", "add", "tcp", "8080", "192.168.50.2:80"]);
    t.router_ctl_ok(&["conntrack", "flush"]);
    t.router_ctl_ok(&["forward", "del", "tcp", "8080"]);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn status_says_changing_while_another_router_ctl_holds_the_router() {
    // What an attach, apply or detach under way looks like from outside
    // (here: nothing attached yet, its lock held) is not a problem to act
    // on: `changing`, exit 75 (look again), not "not attached" or an
    // interrupted attach.
    let t = Topology::new();
    let lock = hold_router_lock(&t);
    let o = t.router_ctl(&["status"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(75), "{out}{}", stderr(&o));
    assert!(
        out.contains("another router-ctl is changing this router") && out.contains("not_attached"),
        "{out}"
    );
    drop(lock);
    assert_eq!(t.router_ctl(&["status"]).status.code(), Some(3));
    // Attached, the lock held (a daemon's follow takes it for an
    // instant): still attached, 0.
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let lock = hold_router_lock(&t);
    assert_eq!(status(&t).1, 0);
    drop(lock);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn missing_interfaces_and_namespaces() {
    let t = Topology::new();
    // An interface not there (yet: a USB NIC at boot) is worth another
    // try (exit 1); one refused for what it is (the same twice, the
    // loopback) is not (78: the service stops retrying).
    let code = |args: &[&str]| t.router_ctl(args).status.code();
    assert_eq!(code(&["attach", LAN_IF, "nope0"]), Some(1));
    assert_eq!(code(&["attach", LAN_IF, LAN_IF]), Some(78));
    assert_eq!(code(&["attach", LAN_IF, "lo"]), Some(78));
    let e = ctl_fails(&t, &["attach", LAN_IF, "nope0"]);
    assert!(e.contains("no such interface \"nope0\""), "{e}");
    // It names the namespace -n gave (the kit passes one) to look in.
    let look = format!("`ip -n {} link`", t.ns_name(Ns::Router));
    assert!(e.contains(&look) && !e.contains("pass -n NETNS"), "{e}");
    let e = ctl_fails(&t, &["attach", "eth9", WAN_IF]);
    assert!(e.contains("\"eth9\""), "{e}");
    let e = ctl_fails(&t, &["attach", LAN_IF, LAN_IF]);
    assert!(e.contains("same interface"), "{e}");
    // The loopback interface (a typo): refused, naming it.
    let e = ctl_fails(&t, &["attach", LAN_IF, "lo"]);
    assert!(e.contains("lo has no Ethernet address of its own"), "{e}");
    assert!(xdp_progs(&t, LAN_IF).is_empty() && !pin_dir(&t).exists());
    let o = t.router_ctl(&["doctor", "nope0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("no interface nope0"), "{}", stdout(&o));
    // Not attached: reading commands say how to attach.
    for args in [&["stats"][..], &["forward", "list"], &["conntrack", "list"]] {
        let e = ctl_fails(&t, args);
        assert!(
            e.contains("not attached") && e.contains("router-ctl attach"),
            "{e}"
        );
    }
    let o = Command::new(router_ctl_bin())
        .args(["-n", "no-such-netns-xyz", "stats"])
        .output()
        .unwrap();
    fails_with(&o, &["no network namespace \"no-such-netns-xyz\""]);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_verifier_rejection_shows_the_end_of_its_log() {
    let t = Topology::new();
    let bad = ObjectVariant::rejected_by_verifier();
    let e = ctl_fails(
        &t,
        &[
            "attach",
            LAN_IF,
            WAN_IF,
            "--admit",
            "xdp",
            "--object",
            bad.path(),
        ],
    );
    println!("{e}");
    assert!(e.contains("verifier rejected"), "{e}");
    // The log's last lines: the instruction that failed and the summary.
    assert!(
        e.contains("R0 !read_ok") || e.contains("unreachable insn"),
        "no verifier log in: {e}"
    );
    assert!(e.lines().count() >= 3, "{e}");
    assert!(xdp_progs(&t, LAN_IF).is_empty() && xdp_progs(&t, WAN_IF).is_empty());
    assert!(
        !pin_dir(&t).exists() && !tmp_pin_dir(&t).exists(),
        "pins left"
    );
    assert_eq!(status(&t).1, 3);
    // While attached, a rejected replace changes nothing either.
    attach(&t, &[]);
    let (before, _) = status(&t);
    let e = ctl_fails(
        &t,
        &[
            "attach",
            LAN_IF,
            WAN_IF,
            "--admit",
            "xdp",
            "--object",
            bad.path(),
        ],
    );
    assert!(e.contains("verifier rejected"), "{e}");
    let (after, code) = status(&t);
    assert_eq!(code, 0, "{after}");
    assert_eq!(prog_ids(&after), prog_ids(&before));
}

/// `sh -c script` (bounded) in a private mount namespace of its own:
/// what it mounts or unmounts leaves nothing behind.
fn in_private_mount_namespace(script: &str) -> Output {
    Command::new("timeout")
        .args([
            "-k",
            "5",
            "60",
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn bpffs_that_cannot_be_mounted() {
    let t = Topology::new();
    // In a private mount namespace, hide /sys/fs (so /sys/fs/bpf does not
    // exist and cannot be mounted). Nothing leaves that namespace.
    let script = format!(
        "mount -t tmpfs -o ro none /sys/fs && exec {} -n {} attach {LAN_IF} {WAN_IF}",
        router_ctl_bin().display(),
        t.ns_name(Ns::Router)
    );
    let o = in_private_mount_namespace(&script);
    let e = fails_with(
        &o,
        &[
            "bpffs is not mounted at /sys/fs/bpf",
            "mount -t bpf -o mode=0700 bpf /sys/fs/bpf",
        ],
    );
    println!("{e}");
    assert!(xdp_progs(&t, LAN_IF).is_empty());
}

/// Where no bpffs is mounted (a private mount namespace whose
/// /sys/fs/bpf was unmounted: nothing leaves it), router-ctl mounts one
/// that only root may enter (mode 0700 (1700 as the kernel keeps the
/// sticky bit), nosuid, nodev, noexec), as
/// systemd does: the kernel's default, 1777, would let any local user make
/// the pin directories before router-ctl does.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_bpffs_router_ctl_mounts_is_root_only() {
    let t = Topology::new();
    let script = format!(
        "umount -l /sys/fs/bpf 2>/dev/null; \
         [ \"$(stat -f -c %T /sys/fs/bpf)\" != bpf_fs ] || exit 9; \
         {} -n {} detach >&2 || exit 8; \
         stat -f -c %T /sys/fs/bpf; stat -c %a /sys/fs/bpf; \
         grep ' /sys/fs/bpf ' /proc/self/mountinfo",
        router_ctl_bin().display(),
        t.ns_name(Ns::Router)
    );
    let o = in_private_mount_namespace(&script);
    let (out, e) = (stdout(&o), stderr(&o));
    assert!(o.status.success(), "{out}{e}");
    assert!(e.contains("mounted bpffs at /sys/fs/bpf"), "{e}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"bpf_fs"), "{out}");
    // The kernel keeps the sticky bit on a bpffs root (1700).
    let mode = lines.get(1).and_then(|m| u32::from_str_radix(m, 8).ok());
    assert!(mode.is_some_and(|m| m & 0o777 == 0o700), "{out}");
    let mountinfo = lines.get(2).copied().unwrap_or_default();
    for option in ["nosuid", "nodev", "noexec"] {
        assert!(mountinfo.contains(option), "{option} not in {mountinfo}");
    }
}

/// Removes the record at `.0` when dropped, unless `.1`: it was there
/// before the test.
struct NoNewRecord<'a>(&'a std::path::Path, bool);

impl Drop for NoNewRecord<'_> {
    fn drop(&mut self) {
        if !self.1 {
            let _ = std::fs::remove_file(self.0);
        }
    }
}

/// `ip netns exec ROUTER router-ctl ...` (a private /sys without the
/// bpffs, where pins vanish with the command): every command refuses and
/// names the `-n` command instead; nothing is attached, no record written.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ip_netns_exec_is_refused_with_the_n_command() {
    let t = Topology::new();
    let ns = t.ns_name(Ns::Router);
    let record = std::path::Path::new(tests::addr::STATE_DIR).join("default.json");
    let had_record = record.exists();
    // Should an attach get through after all, the host's state keeps no
    // record of it (also when an assertion below fails).
    let _guard = NoNewRecord(&record, had_record);
    // Each in a private mount namespace whose router-ctl state
    // directories are empty tmpfs: should the refusal ever let a command
    // through, what it writes of the host's own router (no `-n`: the
    // root namespace's) goes nowhere.
    let refused = |args: &[&str]| {
        let script = format!(
            "for d in {state} {run}; do mkdir -p $d && mount -t tmpfs -o mode=0700 none $d \
             || exit 7; done; exec ip netns exec {ns} {bin} {args}",
            state = tests::STATE_DIR,
            run = tests::LOCK_DIR,
            bin = router_ctl_bin().display(),
            args = args.join(" ")
        );
        let o = in_private_mount_namespace(&script);
        assert_ne!(o.status.code(), Some(7), "{}", stderr(&o));
        fails_with(
            &o,
            &[
                &format!("inside `ip netns exec {ns}`"),
                &format!("router-ctl -n {ns} ..."),
            ],
        );
    };
    for args in [&["attach", LAN_IF, WAN_IF][..], &["status"], &["detach"]] {
        refused(args);
    }
    assert!(xdp_progs(&t, LAN_IF).is_empty(), "attached");
    assert_eq!(record.exists(), had_record, "a record of the host's router");
    // With `-n` as well, on a router attached from the host: its pins are
    // not in that private bpffs, so status would say they are lost and
    // detach would remove its record, an attach pin where none lasts.
    let _detach = DetachOnDrop(&t);
    // Standalone: without a daemon to run, `status` says attached.
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let ours = prog_ids(&status(&t).0);
    for args in [&["status"][..], &["detach"], &["attach", LAN_IF, WAN_IF]] {
        refused(&[&["-n", ns][..], args].concat());
    }
    let (v, code) = status(&t);
    assert_eq!(
        (code, &v["state"]),
        (0, &serde_json::json!("attached")),
        "{v}"
    );
    assert_eq!(prog_ids(&v), ours, "{v}");
}

/// A reader that closes the pipe early ends a one-shot command quietly
/// (no panic, killed by SIGPIPE as other tools are), and a second
/// `router-ctl run` on a router that has one announces no status page
/// before it refuses.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_closed_pipe_and_a_refused_second_daemon_say_nothing_false() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF]);
    let script = format!(
        "{} -n {} stats --watch --interval 1 --count 3 | true; echo \"rc=${{PIPESTATUS[0]}}\"",
        router_ctl_bin().display(),
        t.ns_name(Ns::Router)
    );
    let o = Command::new("timeout")
        .args(["-k", "5", "60", "bash", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    let (out, e) = (stdout(&o), stderr(&o));
    assert!(
        out.contains("rc=141") && !e.contains("panicked"),
        "stdout: {out}\nstderr: {e}"
    );
    let _daemon = crate::offload::Daemon::start(&t, &[]);
    let second = ctl_via(&t, &[], &["run", "--listen", "127.0.0.1:0"]);
    let (out, e) = (stdout(&second), stderr(&second));
    assert!(
        !second.status.success()
            && e.contains("another `router-ctl run` serves this router")
            && !out.contains("status page on"),
        "stdout: {out}\nstderr: {e}"
    );
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(clippy::too_many_lines, reason = "a table of cases")]
fn rule_conflicts_and_bad_values() {
    let t = Topology::new();
    attach(&t, &[]);
    let out = t.router_ctl_ok(&["forward", "add", "tcp", "8080", "192.168.50.2:80"]);
    assert!(!out.contains("does not route"), "{out}");
    // A target the router does not route out of the LAN is kept (the host
    // may come later), with a note: a typo gives a dead forward otherwise.
    for (port, target) in [("8083", "10.0.0.5:80"), ("8084", "203.0.113.1:80")] {
        let out = t.router_ctl_ok(&["forward", "add", "tcp", port, target]);
        assert!(
            out.contains("the router does not route") && out.contains("ip route get"),
            "{target}: {out}"
        );
        t.router_ctl_ok(&["forward", "del", "tcp", port]);
    }
    let e = ctl_fails(&t, &["forward", "add", "tcp", "[::ffff:1.2.3.4]:22"]);
    assert!(e.contains("not a global unicast address"), "{e}");
    let e = ctl_fails(&t, &["forward", "add", "tcp", "8080", "192.168.50.3:80"]);
    assert!(
        e.contains("conflicts with existing rule tcp 8080 -> 192.168.50.2:80"),
        "{e}"
    );
    let e = ctl_fails(&t, &["forward", "del", "udp", "9999"]);
    assert!(e.contains("no udp rule for WAN port 9999"), "{e}");
    assert_eq!(tests::ROUTER_LAN_ADDR.to_string(), "192.168.50.1");
    for (args, needle) in [
        (
            &["forward", "add", "tcp", "0", "192.168.50.2:80"][..],
            "WAN_PORT",
        ),
        (
            &["forward", "add", "tcp", "65536", "192.168.50.2:80"],
            "out of range",
        ),
        (
            &["forward", "add", "tcp", "80", "192.168.50.2"],
            "LAN_ADDR:PORT",
        ),
        (
            &["forward", "add", "tcp", "80", "192.168.50.300:80"],
            "not an IPv4 address",
        ),
        (
            &["forward", "add", "tcp", "80", "224.0.0.1:80"],
            "multicast",
        ),
        (&["forward", "add", "sctp", "80", "192.168.50.2:80"], "sctp"),
        (
            &[
                "attach",
                LAN_IF,
                WAN_IF,
                "--admit",
                "xdp",
                "--wan-addr",
                "300.1.1.1",
            ],
            "--wan-addr",
        ),
        // The LAN's address (ROUTER_LAN_ADDR) as the WAN's: refused, not
        // just warned of as an address the WAN lacks.
        (
            &[
                "attach",
                LAN_IF,
                WAN_IF,
                "--admit",
                "xdp",
                "--wan-addr",
                "192.168.50.1",
            ],
            "is an address of the LAN interface lan0",
        ),
        (
            &[
                "attach",
                LAN_IF,
                WAN_IF,
                "--admit",
                "xdp",
                "--port-range",
                "0-10",
            ],
            "--port-range",
        ),
        (
            &[
                "attach",
                LAN_IF,
                WAN_IF,
                "--admit",
                "xdp",
                "--timeout",
                "tcp=5",
            ],
            "unknown state",
        ),
    ] {
        let e = ctl_fails(&t, args);
        assert!(e.contains(needle), "{args:?}: {e}");
    }
    // Changing the table size of a live router is refused (flows live in
    // it), and so is a mode change (it needs new links): only a detach
    // does either, so trying again is pointless (exit 78, which the
    // service's unit does not restart on).
    for (extra, needle) in [
        (["--max-flows", "1000"], "cannot be resized while attached"),
        (["--mode", "generic"], "mode change"),
    ] {
        let mut args = vec!["attach", LAN_IF, WAN_IF, "--admit", "xdp"];
        args.extend(extra);
        let o = t.router_ctl(&args);
        let e = stderr(&o);
        assert!(e.contains(needle), "{e}");
        assert_eq!(o.status.code(), Some(78), "{e}");
    }
    let rules: serde_json::Value =
        serde_json::from_str(&t.router_ctl_ok(&["forward", "list", "--json"])).unwrap();
    assert_eq!(rules.as_array().unwrap().len(), 1);
    assert_eq!(status(&t).1, 0);
}

#[test]
fn help_completions_and_man_page() {
    let bin = router_ctl_bin();
    let run = |args: &[&str]| {
        let o = Command::new(&bin).args(args).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        stdout(&o)
    };
    let top = run(&["--help"]);
    assert!(top.contains("Examples:") && top.contains("apply"), "{top}");
    for sub in [
        &["attach"][..],
        &["detach"],
        &["status"],
        &["stats"],
        &["forward", "add"],
        &["forward", "del"],
        &["forward", "list"],
        &["conntrack", "list"],
        &["conntrack", "count"],
        &["conntrack", "flush"],
        &["apply"],
        &["metrics"],
        &["doctor"],
        &["completions"],
        &["man"],
    ] {
        let mut a = sub.to_vec();
        a.push("--help");
        let h = run(&a);
        assert!(h.contains("Example"), "{sub:?} help has no example:\n{h}");
    }
    assert!(
        !run(&["attach", "--help"]).contains("--object"),
        "hidden flag shown"
    );
    assert!(run(&["metrics", "--help"]).contains("127.0.0.1:9469"));
    let bash = run(&["completions", "bash"]);
    assert!(
        bash.contains("complete -F") && bash.contains("router-ctl"),
        "{bash}"
    );
    assert!(run(&["completions", "zsh"]).contains("#compdef router-ctl"));
    let man = run(&["man"]);
    assert!(
        man.starts_with(".ie") || man.contains(".TH"),
        "{}",
        &man[..200.min(man.len())]
    );
    assert!(man.contains("router\\-ctl"), "man page without the name");
    let v = run(&["--version"]);
    assert!(v.contains("XDP object"), "{v}");
    // A reader that closed the pipe (`| head`): no error, no panic.
    for args in [&["completions", "bash"][..], &["man"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let o = Command::new(&bin)
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
            .wait_with_output()
            .unwrap();
        assert!(
            o.status.success() && o.stderr.is_empty(),
            "{args:?} into a closed pipe: {}\n{}",
            o.status,
            stderr(&o)
        );
    }
}

#[test]
fn namespace_names_and_row_limits_are_checked() {
    let bin = router_ctl_bin();
    for (args, needle) in [
        (
            &["-n", "/run/netns/rtr", "status"][..],
            "not a namespace name",
        ),
        (&["-n", "../rtr", "status"], "not a namespace name"),
        (&["-n", "", "status"], "not a namespace name"),
        (&["-n", "default", "status"], "root namespace router"),
        (&["conntrack", "list", "--limit", "0"], "0 is not in 1.."),
    ] {
        let o = Command::new(&bin).args(args).output().unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {e}");
        assert!(e.contains(needle), "{args:?}: {e}");
    }
}

/// Offload mode takes standalone mode's port settings (a file may keep
/// them for a switch back) and says they do nothing there: the firewall's
/// NAT rule picks the ports.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload_mode_says_which_settings_only_standalone_uses() {
    let t = Topology::new();
    let unused = "only apply to standalone mode";
    let o = t.router_ctl(&[
        "attach",
        LAN_IF,
        WAN_IF,
        "--admit",
        "kernel",
        "--port-range",
        "2000-3000",
        "--kernel-nat-ports",
        "4000-5000",
    ]);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains(&format!(
            "the XDP port range and the kernel slow-path NAT's ports {unused}"
        )),
        "{e}"
    );
    t.router_ctl_ok(&["detach"]);
    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let e = stderr(&o);
    assert!(o.status.success() && !e.contains(unused), "{e}");
}

/// `status` says what on the host keeps an attached router from
/// forwarding (exit 1, degraded): IPv4 forwarding off, an interface down,
/// standalone's masquerade address gone from the WAN.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn status_names_what_on_the_host_stops_forwarding() {
    let t = Topology::new();
    attach(&t, &[]);
    assert_eq!(status(&t).1, 0);
    let degraded_by = |needle: &str| {
        let (v, code) = status(&t);
        assert_eq!((v["state"].as_str(), code), (Some("degraded"), 1), "{v}");
        assert!(v["problems"].to_string().contains(needle), "{v}");
    };
    t.exec_ok(Ns::Router, &["sysctl", "-qw", "net.ipv4.ip_forward=0"]);
    degraded_by(&format!("IPv4 forwarding is off on {LAN_IF}"));
    t.exec_ok(Ns::Router, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    assert_eq!(status(&t).1, 0);
    t.exec_ok(Ns::Router, &["ip", "link", "set", LAN_IF, "down"]);
    degraded_by(&format!("LAN interface {LAN_IF} is down"));
    t.exec_ok(Ns::Router, &["ip", "link", "set", LAN_IF, "up"]);
    assert_eq!(status(&t).1, 0);
    let wan = format!("{}/24", tests::ROUTER_WAN_ADDR);
    t.exec_ok(Ns::Router, &["ip", "addr", "del", &wan, "dev", WAN_IF]);
    degraded_by(&format!("which {WAN_IF} no longer has"));
}
