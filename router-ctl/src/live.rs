//! What the status page of `run` shows, sampled by the daemon: packet and
//! bit rates per outcome once a second into a ring buffer (the chart), and
//! while a page is open the conntrack fill, the busiest flows, the port
//! forwards and the interfaces. The daemon renders it all into one JSON
//! document (`/api/status`) that the page fetches.

use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

use router_common::maps::{Counter, CounterValue};
use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    clock::monotonic_ns, conntrack, ctx::Ctx, forward, inspect, maps, metrics::family, netlink,
    state, stats,
};

/// Ten minutes of one-second samples.
pub const HISTORY_LEN: usize = 600;
/// Rows in each list of busiest flows.
pub const TOP_FLOWS: usize = 10;
/// Conntrack use above which the page reports a problem.
const TABLE_FULL_WARN: f64 = 0.9;
/// The shortest interval a rate is computed over. A newly opened page
/// samples at once, which can fall just after the once-a-second sample
/// (and a late timer's ticks come in a burst): over a few milliseconds a
/// steady stream whose packets come every few tens of milliseconds shows
/// as 0 or as a spike. Such a sample updates the totals only; the next
/// one computes the rate over the whole interval.
pub const MIN_RATE_INTERVAL: Duration = Duration::from_millis(500);

/// Counter totals per outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub forwarded_packets: u64,
    pub forwarded_bytes: u64,
    pub passed_packets: u64,
    pub passed_bytes: u64,
    pub dropped_packets: u64,
    pub dropped_bytes: u64,
}

impl Totals {
    #[must_use]
    pub fn of(counters: &[(Counter, CounterValue)]) -> Self {
        let mut t = Self::default();
        for (c, v) in counters {
            let (p, b) = match family(*c).0 {
                "forwarded" => (&mut t.forwarded_packets, &mut t.forwarded_bytes),
                "passed" => (&mut t.passed_packets, &mut t.passed_bytes),
                "dropped" => (&mut t.dropped_packets, &mut t.dropped_bytes),
                _ => continue,
            };
            *p += v.packets;
            *b += v.bytes;
        }
        t
    }
}

/// Rates over one sample interval: packets and bits per second.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    /// Unix time in milliseconds at the end of the interval.
    pub t: u64,
    pub fwd_pps: f64,
    pub fwd_bps: f64,
    pub pass_pps: f64,
    pub pass_bps: f64,
    pub drop_pps: f64,
    pub drop_bps: f64,
}

/// One decimal is all a chart needs, and it keeps the JSON short.
fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

impl Sample {
    #[must_use]
    pub fn between(before: &Totals, after: &Totals, secs: f64, t: u64) -> Self {
        let r = |a: u64, b: u64| round1(stats::rate(a, b, secs));
        Self {
            t,
            fwd_pps: r(before.forwarded_packets, after.forwarded_packets),
            fwd_bps: r(before.forwarded_bytes, after.forwarded_bytes) * 8.0,
            pass_pps: r(before.passed_packets, after.passed_packets),
            pass_bps: r(before.passed_bytes, after.passed_bytes) * 8.0,
            drop_pps: r(before.dropped_packets, after.dropped_packets),
            drop_bps: r(before.dropped_bytes, after.dropped_bytes) * 8.0,
        }
    }
}

/// The last [`HISTORY_LEN`] samples.
#[derive(Debug, Default)]
pub struct History {
    samples: VecDeque<Sample>,
    prev: Option<(Instant, Totals)>,
}

impl History {
    /// Adds the rates since the previous totals (the first call only
    /// remembers them); totals less than [`MIN_RATE_INTERVAL`] after the
    /// previous ones are not a sample of their own.
    pub fn push(&mut self, now: Instant, unix_ms: u64, totals: Totals) {
        if let Some((then, before)) = self.prev {
            let elapsed = now.duration_since(then);
            if elapsed < MIN_RATE_INTERVAL {
                return;
            }
            let secs = elapsed.as_secs_f64();
            if self.samples.len() == HISTORY_LEN {
                self.samples.pop_front();
            }
            self.samples
                .push_back(Sample::between(&before, &totals, secs, unix_ms));
        }
        self.prev = Some((now, totals));
    }

    #[must_use]
    pub fn samples(&self) -> &VecDeque<Sample> {
        &self.samples
    }
}

/// The bytes of a flow row, when the data path counts them: the sum of its
/// numeric fields named `bytes` or `..._bytes` (one per direction or a
/// total): `conntrack list` rows carry `orig_bytes` and `reply_bytes`, the
/// data path's per-flow counts; `None` for a row without any.
#[must_use]
pub fn flow_bytes(row: &Value) -> Option<u64> {
    let obj = row.as_object()?;
    let mut found = None;
    for (k, v) in obj {
        if (k == "bytes" || k.ends_with("_bytes"))
            && let Some(n) = v.as_u64()
        {
            *found.get_or_insert(0) += n;
        }
    }
    found
}

fn flow_id(row: &Value) -> String {
    format!("{} {} {}", row["proto"], row["orig_src"], row["orig_dst"])
}

/// The busiest flows of a table listing: by bytes and by byte rate when the
/// rows carry byte counters (rates against `prev`, the last listing's
/// bytes per flow), and always the most recently active ones.
#[derive(Debug, Default)]
pub struct FlowRanker {
    prev: HashMap<String, u64>,
    prev_at: Option<Instant>,
}

impl FlowRanker {
    pub fn rank(&mut self, rows: Vec<Value>, now: Instant) -> Value {
        let count = rows.len();
        let secs = self
            .prev_at
            .map_or(0.0, |t| now.duration_since(t).as_secs_f64());
        let mut next = HashMap::new();
        let mut rows: Vec<Value> = rows
            .into_iter()
            .filter(|r| r["expired"] != true)
            .map(|mut r| {
                if let Some(b) = flow_bytes(&r) {
                    let id = flow_id(&r);
                    r["bytes"] = b.into();
                    if let Some(&before) = self.prev.get(&id) {
                        r["bytes_per_sec"] = round1(stats::rate(before, b, secs)).into();
                    }
                    next.insert(id, b);
                }
                r
            })
            .collect();
        let has_bytes = !next.is_empty();
        self.prev = next;
        self.prev_at = Some(now);
        let top = |rows: &mut Vec<Value>, key: &dyn Fn(&Value) -> f64| -> Vec<Value> {
            rows.sort_by(|a, b| key(b).total_cmp(&key(a)));
            rows.iter().take(TOP_FLOWS).cloned().collect()
        };
        let num = |k: &'static str| move |r: &Value| r[k].as_f64().unwrap_or(0.0);
        let (by_bytes, by_rate) = if has_bytes {
            (
                top(&mut rows, &num("bytes")),
                top(&mut rows, &num("bytes_per_sec")),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let recent = top(&mut rows, &|r: &Value| {
            -r["idle_secs"].as_f64().unwrap_or(0.0)
        });
        json!({
            "count": count,
            "has_bytes": has_bytes,
            "by_bytes": by_bytes,
            "by_rate": by_rate,
            "recent": recent,
        })
    }
}

/// What the daemon knows about itself, for the page.
#[derive(Debug, Serialize)]
pub struct DaemonView {
    pub pid: u32,
    pub started_unix: u64,
    pub admit: &'static str,
    pub offloaded_flows: u64,
    pub offload: Value,
    /// New MAC addresses of the attached interfaces followed.
    pub mac_changes_followed: u64,
    /// New WAN addresses followed (`--wan-addr auto`).
    pub wan_addr_changes_followed: u64,
    /// Standalone mode's kernel side put back.
    pub standalone_repairs: u64,
    /// Attached interfaces deleted while it ran, as `NAME (LAN)`.
    pub interfaces_gone: Vec<String>,
    /// XDP entries left pending by an earlier daemon, removed.
    pub stale_pending_removed: u64,
    /// New attaches it followed (re-opened on their maps).
    pub reattaches_followed: u64,
    /// The router is detached: the daemon waits for the next attach.
    pub detached: bool,
    /// Data path log records this router-ctl could not parse, skipped.
    pub log_records_malformed: u64,
    /// Traffic shaping and tc rules the fast path's flows skip (`None`:
    /// not looked at yet).
    pub shaping_skipped: Option<Vec<String>>,
    /// Standalone mode's bypassed forward rules, added since the attach,
    /// as the problem that says so.
    pub forward_rules_bypassed: Option<String>,
}

/// The sampler: counters every call, the table walk while a page is open.
#[derive(Debug, Default)]
pub struct Live {
    history: History,
    ranker: FlowRanker,
    /// The last table walk's results and when it ran.
    table: Option<(Instant, Value, Value)>,
    /// How long the last table walk took: walks are spaced by four times
    /// that, so a large table costs at most a quarter of the daemon's time.
    walk_cost: Duration,
    totals: Totals,
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Live {
    /// Reads the counters into the history; walks the table too when
    /// `viewed`.
    pub fn sample(&mut self, ctx: &Ctx, viewed: bool) {
        let maps = ctx.maps();
        let now = Instant::now();
        let Ok(cs) = stats::read_counters(&maps) else {
            return;
        };
        self.totals = Totals::of(&cs);
        self.history.push(now, unix_ms(), self.totals);
        let due = self.table.as_ref().is_none_or(|(at, ..)| {
            now.duration_since(*at) >= (self.walk_cost * 4).max(Duration::from_millis(900))
        });
        if viewed && due {
            let table = crate::table_fill::table_use(&maps, &cs);
            // A scrape of `/metrics` in the next seconds reuses this fill.
            if let Some(t) = table {
                crate::table_fill::FILL_CACHE
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .put(
                        &crate::table_fill::FillKey::of(&maps),
                        now,
                        now.elapsed(),
                        t,
                    );
            }
            let fill = table.map_or(Value::Null, |t| t.json());
            let flows = self.flows(ctx);
            self.walk_cost = now.elapsed();
            self.table = Some((now, fill, flows));
        }
    }

    fn flows(&mut self, ctx: &Ctx) -> Value {
        let maps = ctx.maps();
        let rows = (|| -> anyhow::Result<Vec<Value>> {
            let table = maps.conntrack()?;
            let cfg = maps.read_config()?;
            let entries = maps::snapshot(&table, maps::capacity(&table)?)?;
            let now = monotonic_ns();
            let mut rows = conntrack::flow_rows(&entries, now, &cfg.timeouts);
            // IPv6 flows (rows with `family: "ipv6"`), where pinned.
            if let Ok(table6) = maps.conntrack6() {
                let entries6 = maps::snapshot(&table6, maps::capacity(&table6)?)?;
                rows.extend(conntrack::flow_rows6(&entries6, now, &cfg.timeouts));
            }
            Ok(rows
                .iter()
                .filter_map(|r| serde_json::to_value(r).ok())
                .collect())
        })();
        match rows {
            Ok(rows) => self.ranker.rank(rows, Instant::now()),
            Err(e) => json!({ "error": format!("{e:#}") }),
        }
    }

    /// The document `/api/status` serves.
    #[must_use]
    pub fn render(&self, ctx: &Ctx, daemon: &DaemonView) -> Value {
        let maps = ctx.maps();
        let record = state::load(ctx.ns()).ok().flatten();
        let mut problems: Vec<String> = Vec::new();
        let interfaces: Vec<Value> = record.as_ref().map_or_else(Vec::new, |r| {
            [
                ("lan", &r.config.lan, r.config.lan_ifindex, &r.lan_mode),
                ("wan", &r.config.wan, r.config.wan_ifindex, &r.wan_mode),
            ]
            .into_iter()
            .map(|(role, name, ifindex, xdp_mode)| {
                let link = netlink::link(ifindex).ok();
                let up = link.as_ref().is_some_and(|l| l.up);
                if !up {
                    problems.push(format!("{role} interface {name} is down or gone"));
                }
                json!({
                    "role": role,
                    "name": name,
                    "ifindex": ifindex,
                    "xdp_mode": xdp_mode,
                    "up": up,
                    "mtu": link.map(|l| l.mtu),
                })
            })
            .collect()
        });
        let attached = record.is_some() && maps.read_config().is_ok();
        if !attached {
            problems.push("the data path is not attached (router-ctl attach / apply)".into());
        }
        problems.extend(daemon.forward_rules_bypassed.clone());
        // Standalone mode's address (`--wan-addr auto`) against the WAN's.
        problems.extend(
            record
                .as_ref()
                .and_then(|r| crate::status::wan_addr_problem(&r.config)),
        );
        // Its counters and table cannot be read: say why, or the page would
        // show no numbers and no problem.
        if let Some(m) = inspect::layout_mismatch(&ctx.pin_dir) {
            problems.push(format!(
                "the router was {}",
                inspect::other_build_message(&m)
            ));
        }
        let (conntrack, flows) = match &self.table {
            Some((_, fill, flows)) => (fill.clone(), flows.clone()),
            None => (Value::Null, Value::Null),
        };
        if let (Some(e), Some(c)) = (
            conntrack["entries"].as_f64(),
            conntrack["capacity"].as_f64(),
        ) && c > 0.0
            && e / c > TABLE_FULL_WARN
        {
            problems.push(format!(
                "conntrack {:.0} % full: new flows evict idle ones",
                100.0 * e / c
            ));
        }
        let forwards = forward::rules(&maps)
            .ok()
            .and_then(|r| serde_json::to_value(r).ok());
        json!({
            "now_ms": unix_ms(),
            "version": env!("CARGO_PKG_VERSION"),
            "router": {
                "attached": attached,
                "namespace": ctx.ns(),
                "admit": daemon.admit,
                "mode": if daemon.admit == "kernel" { "offload" } else { "standalone" },
                "object": record.as_ref().map(|r| r.object.version()),
                "attached_at": record.as_ref().map(|r| r.attached_at),
                "wan_addr": record.as_ref().map(|r| r.config.wan_addr.to_string()),
            },
            "health": { "ok": problems.is_empty(), "problems": problems },
            "daemon": daemon,
            "interfaces": interfaces,
            "totals": self.totals,
            "rates": self.history.samples().back(),
            "history": self.history.samples(),
            "conntrack": conntrack,
            "flows": flows,
            "forwards": forwards,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_keeps_the_last_samples_with_rates() {
        let mut h = History::default();
        let t0 = Instant::now();
        let mut tot = Totals::default();
        h.push(t0, 0, tot);
        assert!(h.samples().is_empty());
        for i in 1..=(HISTORY_LEN as u64 + 5) {
            tot.forwarded_packets += 100;
            tot.forwarded_bytes += 1000;
            h.push(t0 + Duration::from_secs(i), i, tot);
        }
        assert_eq!(h.samples().len(), HISTORY_LEN);
        let last = h.samples().back().unwrap();
        assert_eq!(last.t, HISTORY_LEN as u64 + 5);
        assert!((last.fwd_pps - 100.0).abs() < 1e-9);
        assert!((last.fwd_bps - 8000.0).abs() < 1e-9);
        assert_eq!(h.samples().front().unwrap().t, 6);
    }

    #[test]
    fn totals_soon_after_a_sample_wait_for_the_whole_interval() {
        // 100 packets a second, counted at 0 s, 1 s, 1.01 s (a page
        // opened) and 2 s: the rate stays 100, never 0 or a spike.
        let mut h = History::default();
        let t0 = Instant::now();
        let at = |ms: u64, packets: u64| {
            (
                t0 + Duration::from_millis(ms),
                ms,
                Totals {
                    forwarded_packets: packets,
                    ..Totals::default()
                },
            )
        };
        for (now, unix_ms, tot) in [at(0, 0), at(1000, 100), at(1010, 100), at(2000, 200)] {
            h.push(now, unix_ms, tot);
        }
        let got: Vec<(u64, f64)> = h.samples().iter().map(|s| (s.t, s.fwd_pps)).collect();
        assert_eq!(got, [(1000, 100.0), (2000, 100.0)]);
        // Half a second is a sample of its own.
        h.push(t0 + Duration::from_millis(2500), 2500, at(0, 250).2);
        assert_eq!(h.samples().back().map(|s| s.fwd_pps), Some(100.0));
    }

    #[test]
    fn totals_sum_each_outcome() {
        let v = |packets, bytes| CounterValue { packets, bytes };
        let t = Totals::of(&[
            (Counter::FwdOutbound, v(3, 300)),
            (Counter::FwdInbound, v(2, 200)),
            (Counter::PassNoFlow, v(5, 50)),
            (Counter::DropMalformed, v(1, 10)),
            (Counter::FlowNewMasquerade, v(7, 0)),
        ]);
        assert_eq!(
            (
                t.forwarded_packets,
                t.forwarded_bytes,
                t.passed_packets,
                t.dropped_bytes
            ),
            (5, 500, 5, 10)
        );
    }

    fn row(src: &str, idle: f64, bytes: Option<(u64, u64)>) -> Value {
        let mut r = json!({
            "proto": "tcp", "orig_src": src, "orig_dst": "10.0.0.1:80",
            "idle_secs": idle, "expired": false,
        });
        if let Some((o, rep)) = bytes {
            r["orig_bytes"] = o.into();
            r["reply_bytes"] = rep.into();
        }
        r
    }

    #[test]
    fn flows_without_byte_counters_rank_by_recency_only() {
        let mut r = FlowRanker::default();
        let v = r.rank(
            vec![row("a:1", 5.0, None), row("b:1", 0.5, None)],
            Instant::now(),
        );
        assert_eq!(v["has_bytes"], false);
        assert_eq!(v["by_bytes"].as_array().unwrap().len(), 0);
        assert_eq!(v["recent"][0]["orig_src"], "b:1");
        assert_eq!(v["count"], 2);
    }

    #[test]
    fn flows_with_byte_counters_rank_by_bytes_and_by_rate() {
        let mut r = FlowRanker::default();
        let t0 = Instant::now();
        // a: big but idle; b: small but growing fast.
        let _ = r.rank(
            vec![
                row("a:1", 9.0, Some((9000, 1000))),
                row("b:1", 0.0, Some((10, 0))),
            ],
            t0,
        );
        let v = r.rank(
            vec![
                row("a:1", 9.0, Some((9000, 1000))),
                row("b:1", 0.0, Some((2010, 0))),
            ],
            t0 + Duration::from_secs(2),
        );
        assert_eq!(v["has_bytes"], true);
        assert_eq!(v["by_bytes"][0]["orig_src"], "a:1");
        assert_eq!(v["by_bytes"][0]["bytes"], 10_000);
        assert_eq!(v["by_rate"][0]["orig_src"], "b:1");
        assert!((v["by_rate"][0]["bytes_per_sec"].as_f64().unwrap() - 1000.0).abs() < 1e-9);
    }
}
