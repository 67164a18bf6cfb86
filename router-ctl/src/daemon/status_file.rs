//! The daemon's status file: its health and counters, written every tick
//! and read by `status`, `stats`, `metrics` and the status page (also
//! while no daemon runs: then it says so).

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};

use crate::{offload::OffloadStats, state};

/// The daemon's health and counters, as its status file holds them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DaemonStatus {
    pub pid: u32,
    pub started_unix: u64,
    /// Rewritten every tick: a stale one means a hung or killed daemon.
    pub heartbeat_unix: u64,
    pub tick_secs: u64,
    /// Until when the daemon's loop may be busy without a heartbeat (a
    /// reload, whose lock waits and replace run on it): alive meanwhile.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub busy_until_unix: u64,
    /// `kernel` (offload) or `xdp` (standalone: nothing to offload).
    pub admit: String,
    /// Connections XDP carries for the kernel now.
    pub offloaded_flows: u64,
    /// TCP connections waiting to settle before their offload (under a
    /// burst of new ones).
    #[serde(default)]
    pub settling_flows: u64,
    /// Connections waiting for the egress witness's evidence before their
    /// offload (a UDP or ICMP connection's forwarded reply; under policy
    /// routing, each direction's route).
    #[serde(default)]
    pub waiting_for_witness: u64,
    pub offload: OffloadStats,
    /// New MAC addresses of the attached interfaces written into the data
    /// path's configuration (and the attach record).
    #[serde(default)]
    pub mac_changes_followed: u64,
    /// New IPv4 addresses of the WAN (`--wan-addr auto`: DHCP, PPP)
    /// written into the configuration, the slow-path NAT and the record.
    #[serde(default)]
    pub wan_addr_changes_followed: u64,
    /// Standalone mode's kernel side (slow-path NAT table, LAN sysctls)
    /// put back after something removed it.
    #[serde(default)]
    pub standalone_repairs: u64,
    /// Attached interfaces deleted (or moved to another namespace) while
    /// the daemon ran, as `NAME (LAN)`: their XDP program went with them.
    #[serde(default)]
    pub interfaces_gone: Vec<String>,
    /// Attached interfaces deleted and made anew under their name that got
    /// a new XDP link (`lifecycle::relink`), the maps and flows kept.
    #[serde(default)]
    pub interfaces_relinked: u64,
    /// Why the last try to give a re-created interface its link failed
    /// (`None`: no such failure since the last success).
    #[serde(default)]
    pub relink_failed: Option<String>,
    /// STALE neighbour entries of next hops the fast path uses that the
    /// daemon had the kernel re-validate (`NTF_USE`).
    #[serde(default)]
    pub neighbours_revalidated: u64,
    /// XDP entries found pending at start (left by a daemon killed between
    /// writing a pair and activating it), removed.
    #[serde(default)]
    pub stale_pending_removed: u64,
    /// New attaches followed (after a detach and attach, new maps; or a
    /// replace that changed the mode): the daemon re-opened its session on
    /// them.
    #[serde(default)]
    pub reattaches_followed: u64,
    /// The router is detached (its maps are no longer pinned): the daemon
    /// waits for the next attach and follows it.
    #[serde(default)]
    pub detached: bool,
    /// Records of the data path's debug log that this router-ctl's aya-log
    /// could not parse, skipped.
    #[serde(default)]
    pub log_records_malformed: u64,
    /// Traffic shaping and tc rules on the attached interfaces, which the
    /// fast path's flows skip, as `NAME: what, what` (`shaping.rs`);
    /// `None` until the daemon looked (or by a daemon that does not).
    #[serde(default)]
    pub shaping_skipped: Option<Vec<String>>,
    /// Offload mode: the egress witness (where the kernel sends
    /// connections, whether a UDP or ICMP reply was forwarded):
    /// `attached`, `not needed yet`,
    /// `unavailable: no tcx`, `failed: WHY`; `None` in standalone mode.
    #[serde(default)]
    pub egress_witness: Option<String>,
    /// Standalone mode: netfilter forward rules added since the attach,
    /// which the fast path bypasses, as the problem that says so (`None`:
    /// none, or the owner accepted the bypass at the attach).
    #[serde(default)]
    pub forward_rules_bypassed: Option<String>,
}

impl DaemonStatus {
    /// Whether the process that wrote it still runs and ticks.
    #[must_use]
    pub fn alive(&self, now_unix: u64) -> bool {
        process_exists(self.pid)
            && (now_unix.saturating_sub(self.heartbeat_unix) <= 3 * self.tick_secs.max(1) + 2
                || now_unix <= self.busy_until_unix)
    }
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_zero(x: &u64) -> bool {
    *x == 0
}

pub(super) fn process_exists(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid.cast_signed(), 0) == 0 }
}

/// The daemon's health and counters as `status --json`, `stats --json`
/// and the metrics report them: `running` false when none runs (or its
/// heartbeat stopped).
#[must_use]
pub fn health_json(netns: Option<&str>) -> serde_json::Value {
    let now = unix_now();
    match read_status(netns) {
        Some(s) if s.alive(now) => serde_json::json!({
            "running": true,
            "pid": s.pid,
            "heartbeat_age_secs": now.saturating_sub(s.heartbeat_unix),
            "started_unix": s.started_unix,
            "admit": s.admit,
            "offloaded_flows": s.offloaded_flows,
            "settling_flows": s.settling_flows,
            "waiting_for_witness": s.waiting_for_witness,
            "offload": s.offload,
            "mac_changes_followed": s.mac_changes_followed,
            "wan_addr_changes_followed": s.wan_addr_changes_followed,
            "standalone_repairs": s.standalone_repairs,
            "interfaces_gone": s.interfaces_gone,
            "interfaces_relinked": s.interfaces_relinked,
            "relink_failed": s.relink_failed,
            "stale_pending_removed": s.stale_pending_removed,
            "neighbours_revalidated": s.neighbours_revalidated,
            "reattaches_followed": s.reattaches_followed,
            "detached": s.detached,
            "log_records_malformed": s.log_records_malformed,
            "shaping_skipped": s.shaping_skipped,
            "egress_witness": s.egress_witness,
            "forward_rules_bypassed": s.forward_rules_bypassed,
        }),
        _ => serde_json::json!({ "running": false }),
    }
}

/// One line for `status` and `stats`: the daemon's health, in offload
/// mode with what running it or not means.
#[must_use]
pub fn health_line(d: &serde_json::Value, kernel_mode: bool) -> String {
    if d["running"] == true && d["detached"] == true {
        format!(
            "daemon: running (pid {}, heartbeat {} s ago), waiting: the router is detached; \
             it follows the next `router-ctl attach` by itself",
            d["pid"], d["heartbeat_age_secs"],
        )
    } else if d["running"] == true {
        let o = &d["offload"];
        let mut line = format!(
            "daemon: running (pid {}, heartbeat {} s ago), {} flows offloaded, {} settling; \
             {} offloaded, {} ended, {} handed back, {} refreshes, {} resyncs, {} event losses",
            d["pid"],
            d["heartbeat_age_secs"],
            d["offloaded_flows"],
            d["settling_flows"].as_u64().unwrap_or(0),
            o["offloaded"],
            o["ended_destroyed"].as_u64().unwrap_or(0)
                + o["ended_closing"].as_u64().unwrap_or(0)
                + o["ended_kernel_gone"].as_u64().unwrap_or(0)
                + o["ended_tcp_control"].as_u64().unwrap_or(0)
                + o["ended_ipsec"].as_u64().unwrap_or(0)
                + o["ended_rerouted"].as_u64().unwrap_or(0)
                + o["ended_remapped"].as_u64().unwrap_or(0)
                + o["ended_remarked"].as_u64().unwrap_or(0)
                + o["ended_not_taken_over"].as_u64().unwrap_or(0)
                + o["ended_unwitnessed"].as_u64().unwrap_or(0),
            o["handed_back"],
            o["refreshed"],
            o["resyncs"],
            o["events_lost"],
        );
        let waiting = d["waiting_for_witness"].as_u64().unwrap_or(0);
        if waiting > 0 {
            let _ = write!(line, ", {waiting} waiting for the egress witness");
        }
        let macs = d["mac_changes_followed"].as_u64().unwrap_or(0);
        if macs > 0 {
            let _ = write!(line, ", {macs} interface MAC changes followed");
        }
        let repairs = d["standalone_repairs"].as_u64().unwrap_or(0);
        if repairs > 0 {
            let _ = write!(
                line,
                ", standalone mode's kernel side put back {repairs} time(s)"
            );
        }
        let wan_addrs = d["wan_addr_changes_followed"].as_u64().unwrap_or(0);
        if wan_addrs > 0 {
            let _ = write!(line, ", {wan_addrs} WAN address changes followed");
        }
        let neighbours = d["neighbours_revalidated"].as_u64().unwrap_or(0);
        if neighbours > 0 {
            let _ = write!(
                line,
                ", {neighbours} stale neighbour(s) of the fast path re-validated"
            );
        }
        let reattaches = d["reattaches_followed"].as_u64().unwrap_or(0);
        if reattaches > 0 {
            let _ = write!(line, ", {reattaches} re-attaches followed");
        }
        let relinked = d["interfaces_relinked"].as_u64().unwrap_or(0);
        if relinked > 0 {
            let _ = write!(
                line,
                ", {relinked} re-created interface(s) given a new link"
            );
        }
        let malformed = d["log_records_malformed"].as_u64().unwrap_or(0);
        if malformed > 0 {
            let _ = write!(
                line,
                ", {malformed} malformed data path log records skipped (attach this \
                 router-ctl's object)"
            );
        }
        line.push_str(&warnings(d));
        line
    } else if kernel_mode {
        format!(
            "daemon: NOT RUNNING: {}; start `router-ctl run`",
            without_daemon(d)
        )
    } else {
        "daemon: not running: the fast path forwards, but a next hop that changes its MAC \
         silently, a new MAC or WAN address of the attached interfaces and a VRRP transition \
         are not followed; start `router-ctl run`"
            .to_owned()
    }
}

/// The lines of what needs the owner's eye in a running daemon's
/// status `d` (each starting with a newline): a failed egress witness,
/// skipped shaping, interfaces gone.
fn warnings(d: &serde_json::Value) -> String {
    let mut line = String::new();
    if let Some(failed) = d["egress_witness"]
        .as_str()
        .and_then(|w| w.strip_prefix("failed: "))
    {
        let _ = write!(
            line,
            "\negress witness FAILED: {failed}: {}",
            super::egress_witness::WITHOUT_WITNESS
        );
    }
    let shaping = strings(&d["shaping_skipped"]);
    if !shaping.is_empty() {
        let _ = write!(
            line,
            "\nshaping skipped: {}: the flows on the fast path skip it (see `router-ctl \
             doctor`)",
            shaping.join("; ")
        );
    }
    let gone = strings(&d["interfaces_gone"]);
    if !gone.is_empty() {
        let _ = write!(
            line,
            "\nINTERFACE GONE: {}: its XDP program went with it; once an interface of that \
             name is back, the daemon gives it a new link (or `router-ctl attach` does), the \
             flows kept",
            gone.join(", ")
        );
        if let Some(why) = d["relink_failed"].as_str() {
            let _ = write!(line, "; giving it its link FAILED: {why}");
        }
    }
    line
}

/// The strings of the JSON array `v` (none if it is not one: an older
/// daemon's status without the field).
fn strings(v: &serde_json::Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default()
}

/// Adds to `d`, a stopped daemon's [`health_json`], what the fast path
/// still carries without it: `on`, read from the tables (`None`: not
/// read).
pub fn add_stopped(d: &mut serde_json::Value, on: Option<&crate::conntrack::OnFastPath>) {
    if let Some(on) = on {
        d["leased_flows"] = serde_json::json!(on.leased);
        d["lease_left_secs"] = serde_json::json!(on.lease_left_secs);
    }
}

/// What the fast path of an offload router still carries with its daemon
/// stopped (`d`, with [`add_stopped`]'s counts if they were read): its
/// offloaded flows until their leases end, which nothing renews, then
/// none.
#[must_use]
pub fn without_daemon(d: &serde_json::Value) -> String {
    match d["leased_flows"].as_u64() {
        Some(0) => "the fast path carries no flow (the kernel forwards every flow)".to_owned(),
        Some(n) => format!(
            "{n} offloaded flow(s) stay on the fast path until their leases end (within {} s), \
             then the kernel forwards every flow",
            d["lease_left_secs"].as_u64().unwrap_or(0)
        ),
        None => format!(
            "offloaded flows stay on the fast path until their leases end (at most {} s), \
             then the kernel forwards every flow",
            crate::offload::MAX_LEASE_SECS
        ),
    }
}

/// Where the daemon of a namespace keeps its status.
#[must_use]
pub fn status_path(netns: Option<&str>) -> PathBuf {
    Path::new(state::LOCK_DIR).join(format!("{}.daemon.json", state::ns_key(netns)))
}

/// The daemon's last status, if one ever ran (and left its file).
#[must_use]
pub fn read_status(netns: Option<&str>) -> Option<DaemonStatus> {
    let data = std::fs::read(status_path(netns)).ok()?;
    serde_json::from_slice(&data).ok()
}

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_under_way_keeps_the_daemon_alive_without_a_heartbeat() {
        let s = DaemonStatus {
            pid: std::process::id(),
            heartbeat_unix: 1000,
            tick_secs: 1,
            ..DaemonStatus::default()
        };
        assert!(s.alive(1005) && !s.alive(1006), "3 ticks + 2 s");
        let reloading = DaemonStatus {
            busy_until_unix: 1030,
            ..s
        };
        assert!(reloading.alive(1030) && !reloading.alive(1031));
    }

    #[test]
    fn the_health_line_says_what_the_daemon_followed() {
        let running = |extra: serde_json::Value| {
            let mut d = serde_json::json!({
                "running": true, "pid": 7, "heartbeat_age_secs": 1, "offloaded_flows": 0,
                "offload": OffloadStats::default(), "interfaces_gone": [],
            });
            d.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            health_line(&d, true)
        };
        let line = running(serde_json::json!({
            "reattaches_followed": 2, "log_records_malformed": 3,
        }));
        assert!(line.contains(", 2 re-attaches followed"), "{line}");
        assert!(
            line.contains(", 3 malformed data path log records"),
            "{line}"
        );
        let stopped = |extra: serde_json::Value| health_line(&extra, true);
        assert_eq!(
            stopped(
                serde_json::json!({"running": false, "leased_flows": 2, "lease_left_secs": 41})
            ),
            "daemon: NOT RUNNING: 2 offloaded flow(s) stay on the fast path until their leases \
             end (within 41 s), then the kernel forwards every flow; start `router-ctl run`"
        );
        let line = stopped(serde_json::json!({"running": false, "leased_flows": 0}));
        assert!(line.contains("carries no flow"), "{line}");
        let line = stopped(serde_json::json!({"running": false}));
        assert!(
            line.contains("until their leases end (at most 60 s)"),
            "{line}"
        );
        let line = running(serde_json::json!({ "detached": true }));
        assert!(
            line.contains("waiting: the router is detached") && !line.contains("offloaded"),
            "{line}"
        );
        let line = running(serde_json::json!({ "egress_witness": "failed: no tcx here" }));
        assert!(
            line.contains("egress witness FAILED: no tcx here: UDP and ICMP connections are offloaded once conntrack saw a reply"),
            "{line}"
        );
        let line = running(serde_json::json!({ "egress_witness": "attached" }));
        assert!(!line.contains("witness"), "{line}");
        let line = running(serde_json::json!({ "interfaces_gone": ["lan0 (LAN)"] }));
        assert!(
            line.contains("INTERFACE GONE: lan0 (LAN)") && line.contains("gives it a new link"),
            "{line}"
        );
    }
}
