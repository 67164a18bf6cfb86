//! keepalived and conntrackd on the routers, from the templates in
//! `examples/failover/` (the test fills their per-router fields), and what
//! they report: the notify script's events, the virtual addresses,
//! conntrackd's external cache, the logs.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use super::{LAN_VIP, R1, R2, Router, WAN_VIP, pair::Pair};
use crate::ctl::wait_for_or_show;

/// The example configuration the test runs.
fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/failover")
}

pub(super) fn template(name: &str) -> String {
    std::fs::read_to_string(examples().join(name))
        .unwrap_or_else(|e| panic!("examples/failover/{name}: {e}"))
}

/// Replaces every `{{NAME}}` of `template`; panics on one left unfilled.
pub(super) fn fill(template: &str, fields: &[(&str, &str)]) -> String {
    let mut s = template.to_owned();
    for (k, v) in fields {
        s = s.replace(&format!("{{{{{k}}}}}"), v);
    }
    assert!(!s.contains("{{"), "unfilled template field in:\n{s}");
    s
}

fn path_str(p: &Path) -> String {
    p.to_str().expect("a UTF-8 path").to_owned()
}

impl Pair {
    /// conntrackd and keepalived on router `r`, from the example templates.
    pub(super) fn start_ha(&self, r: Router, advert_int: &str) {
        let ct_conf = self.start_conntrackd(r);
        self.start_keepalived(r, advert_int, &ct_conf);
    }

    /// conntrackd on router `r`, once it answers on its control socket;
    /// returns its configuration file.
    fn start_conntrackd(&self, r: Router) -> String {
        let run_dir = self.file(&format!("{}-run", r.role));
        std::fs::create_dir(&run_dir).unwrap();
        let ct_conf = self.file(&format!("{}-conntrackd.conf", r.role));
        std::fs::write(
            &ct_conf,
            fill(
                &template("conntrackd.conf"),
                &[
                    ("SYNC_ADDR", &r.sync.to_string()),
                    ("PEER_SYNC_ADDR", &r.peer_sync.to_string()),
                    ("RUN_DIR", &path_str(&run_dir)),
                ],
            ),
        )
        .unwrap();
        let ct_conf = path_str(&ct_conf);
        let ns = self.ns(r.role);
        self.spawn(
            "conntrackd",
            Command::new("ip").args(["netns", "exec", &ns, "conntrackd", "-C", &ct_conf]),
            &self.file(&format!("{}-conntrackd.out", r.role)),
        );
        wait_for_or_show(
            "conntrackd to answer on its control socket",
            Duration::from_secs(10),
            || {
                self.exec(r.role, &["conntrackd", "-C", &ct_conf, "-s"])
                    .status
                    .success()
            },
            || self.read(&format!("{}-run/conntrackd.log", r.role)),
        );
        ct_conf
    }

    /// keepalived (VRRP only) on router `r`, its notify script driving the
    /// conntrackd of `ct_conf`.
    fn start_keepalived(&self, r: Router, advert_int: &str, ct_conf: &str) {
        let notify = format!(
            "/usr/bin/env CONNTRACKD_CONFIG={ct_conf} NOTIFY_LOG={} {}",
            self.file(&format!("{}-notify.log", r.role)).display(),
            examples()
                .join("primary-backup.sh")
                .canonicalize()
                .unwrap()
                .display(),
        );
        let ka_conf = self.file(&format!("{}-keepalived.conf", r.role));
        std::fs::write(
            &ka_conf,
            fill(
                &template("keepalived.conf"),
                &[
                    ("ROUTER_ID", r.role),
                    ("STATE", r.state),
                    ("PRIORITY", &r.priority.to_string()),
                    ("ADVERT_INT", advert_int),
                    ("NOTIFY", &notify),
                ],
            ),
        )
        .unwrap();
        let pid = |what: &str| path_str(&self.file(&format!("{}-{what}.pid", r.role)));
        let ns = self.ns(r.role);
        self.spawn(
            "keepalived",
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &ns,
                    "keepalived",
                    "--dont-fork",
                    "--log-console",
                    "--log-detail",
                    "--no-syslog",
                    "--vrrp",
                    "-f",
                ])
                .arg(&ka_conf)
                .args([
                    "-p",
                    &pid("keepalived"),
                    "-r",
                    &pid("vrrp"),
                    "-c",
                    &pid("checkers"),
                ]),
            &self.file(&format!("{}-keepalived.out", r.role)),
        );
    }

    /// The times (Unix seconds) of router `r`'s notify log lines that name
    /// `event`.
    pub(super) fn notified(&self, r: Router, event: &str) -> Vec<f64> {
        self.read(&format!("{}-notify.log", r.role))
            .lines()
            .filter(|l| l.split_whitespace().nth(1) == Some(event))
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    }

    /// Both routers' notify events, in ms relative to `t0_unix`.
    pub(super) fn timeline(&self, t0_unix: f64) -> String {
        let mut events: Vec<(f64, String)> = Vec::new();
        for r in [R1, R2] {
            for l in self.read(&format!("{}-notify.log", r.role)).lines() {
                let mut w = l.split_whitespace();
                if let (Some(Ok(t)), Some(e)) = (w.next().map(str::parse::<f64>), w.next()) {
                    events.push((t, format!("{} {e}", r.role)));
                }
            }
        }
        events.sort_by(|a, b| a.0.total_cmp(&b.0));
        events
            .iter()
            .map(|(t, e)| format!("{e} {:+.0} ms", (t - t0_unix) * 1000.0))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether router `r` holds both virtual addresses.
    pub(super) fn has_vips(&self, r: Router) -> bool {
        let out = self.exec(r.role, &["ip", "-4", "-o", "addr", "show"]);
        let s = String::from_utf8_lossy(&out.stdout);
        s.contains(&format!(" {LAN_VIP}/")) && s.contains(&format!(" {WAN_VIP}/"))
    }

    /// Every log of both routers, for failure messages.
    pub(super) fn ha_logs(&self) -> String {
        let mut s = String::new();
        for r in [R1, R2] {
            for f in [
                "notify.log",
                "keepalived.out",
                "conntrackd.out",
                "run/conntrackd.log",
                "daemon.out",
            ] {
                let name = format!("{}-{f}", r.role);
                let _ = writeln!(s, "--- {name}\n{}", self.read(&name));
            }
        }
        s
    }

    /// Sends `signal` to router `r`'s conntrackd daemon (not to a
    /// `conntrackd -c` the notify script runs meanwhile): SIGSTOP holds a
    /// commit back, as a large table's would take long, SIGCONT lets it go.
    pub(super) fn signal_conntrackd(&self, r: Router, signal: &str) {
        let conf = path_str(&self.file(&format!("{}-conntrackd.conf", r.role)));
        let pattern = format!("^conntrackd -C {conf}$");
        let out = tests::host::run(&["pkill", &format!("-{signal}"), "-f", &pattern]);
        assert!(
            out.status.success(),
            "pkill -{signal} of {}'s conntrackd: {}",
            r.role,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `conntrackd -e` on router `r`: the external cache (the peer's flows).
    pub(super) fn external_cache(&self, r: Router) -> String {
        let conf = path_str(&self.file(&format!("{}-conntrackd.conf", r.role)));
        String::from_utf8_lossy(&self.exec(r.role, &["conntrackd", "-C", &conf, "-e"]).stdout)
            .into_owned()
    }
}
