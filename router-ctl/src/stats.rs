//! `stats`: the per-CPU counters summed, grouped by outcome.

use std::{
    path::PathBuf,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use router_common::maps::{Admit, Counter, CounterValue};
use serde_json::{Map as JsonMap, Value, json};

use crate::{
    clock,
    ctx::Ctx,
    daemon,
    maps::{self, PinnedMaps},
};

/// Groups of the plain table, in display order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    Forwarded,
    Passed,
    Dropped,
    Events,
    Other,
}

impl Group {
    pub const ALL: [Self; 5] = [
        Self::Forwarded,
        Self::Passed,
        Self::Dropped,
        Self::Events,
        Self::Other,
    ];

    const fn title(self) -> &'static str {
        match self {
            Self::Forwarded => "forwarded",
            Self::Passed => "passed to kernel",
            Self::Dropped => "dropped",
            Self::Events => "events",
            Self::Other => "other",
        }
    }

    #[must_use]
    pub fn of(c: Counter) -> Self {
        // IPv6-only counters carry the family in their prefix (`fwd6_`).
        let n = c.name();
        let is = |prefix: &str| {
            n.strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('_') || rest.starts_with("6_"))
        };
        if c.is_event() {
            Self::Events
        } else if is("fwd") {
            Self::Forwarded
        } else if is("pass") {
            Self::Passed
        } else if is("drop") {
            Self::Dropped
        } else {
            Self::Other
        }
    }
}

/// The counters summed over the CPUs. A router attached by another build
/// whose maps do not fit this one's (another entry size) is refused with
/// what to do, rather than read wrongly. One attached by a build with fewer
/// counters (an older one, before attach replaced it) reads 0 for the
/// counters it lacks: counters only ever go last.
pub fn read_counters(maps: &PinnedMaps) -> Result<Vec<(Counter, CounterValue)>> {
    if let Some(m) = crate::inspect::layout_mismatch(maps.dir()) {
        anyhow::bail!("{}", crate::inspect::other_build_message(&m));
    }
    let map = maps.counters()?;
    let len = map.len();
    let mut out = Vec::new();
    for &c in Counter::ALL {
        if c as u32 >= len {
            out.push((c, CounterValue::default()));
            continue;
        }
        let values = map
            .get(&(c as u32), 0)
            .with_context(|| format!("reading counter {}", c.name()))?;
        let sum = values
            .iter()
            .fold(CounterValue::default(), |a, v| CounterValue {
                packets: a.packets.wrapping_add(v.packets),
                bytes: a.bytes.wrapping_add(v.bytes),
            });
        out.push((c, sum));
    }
    Ok(out)
}

/// Conntrack entries in use and capacity, if the table is pinned, and an
/// estimate of the entries the LRU evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableUse {
    pub entries: usize,
    pub capacity: u32,
    /// Entries inserted by the data path, minus those it removed, minus
    /// those `conntrack flush` removed, minus those present: what the LRU
    /// must have evicted. Approximate: the counters and the key walk are not
    /// one snapshot while traffic runs.
    pub evicted_estimate: u64,
    /// The IPv6 flow table, `CONNTRACK6` (`None` on a router attached by a
    /// router-ctl without it).
    pub ipv6: Option<TableUse6>,
}

/// `CONNTRACK6` entries in use and capacity. No eviction estimate: the
/// daemon's and `conntrack flush`'s removals of IPv6 entries are not
/// counted, so inserted - present would overstate it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableUse6 {
    pub entries: usize,
    pub capacity: u32,
}

impl TableUse {
    /// The `"conntrack"` object of `stats --json` and the watch samples.
    #[must_use]
    pub fn json(&self) -> Value {
        let mut v = json!({
            "entries": self.entries,
            "capacity": self.capacity,
            "evicted_estimate": self.evicted_estimate,
        });
        if let Some(t) = self.ipv6 {
            v["ipv6"] = json!({"entries": t.entries, "capacity": t.capacity});
        }
        v
    }

    /// The table line(s) of `stats` and `stats --watch`.
    #[must_use]
    pub fn lines(&self) -> String {
        use std::fmt::Write as _;
        let mut s = format!(
            "\nconntrack entries {} of capacity {} (two per flow), about {} evicted by the LRU\n",
            self.entries, self.capacity, self.evicted_estimate
        );
        if let Some(t) = self.ipv6 {
            let _ = writeln!(
                s,
                "conntrack6 entries {} of capacity {} (IPv6, two per flow)",
                t.entries, t.capacity
            );
        }
        s
    }
}

/// Keys of a pinned map walked, at most its capacity.
fn entries_in<K: aya::Pod, V: aya::Pod>(
    map: &aya::maps::HashMap<aya::maps::MapData, K, V>,
    capacity: u32,
) -> usize {
    let limit = (capacity as usize).saturating_mul(2).saturating_add(64);
    map.keys()
        .take(limit)
        .flatten()
        .count()
        .min(capacity as usize)
}

/// `counters` are the summed counters just read ([`read_counters`]), for
/// the eviction estimate.
#[must_use]
pub fn table_use(maps: &PinnedMaps, counters: &[(Counter, CounterValue)]) -> Option<TableUse> {
    let map = maps.conntrack().ok()?;
    let capacity = maps::capacity(&map).ok()?;
    let entries = entries_in(&map, capacity);
    let ipv6 = maps.conntrack6().ok().and_then(|m| {
        let capacity = maps::capacity(&m).ok()?;
        Some(TableUse6 {
            entries: entries_in(&m, capacity),
            capacity,
        })
    });
    Some(TableUse {
        entries,
        capacity,
        evicted_estimate: evicted_estimate(counters, entries),
        ipv6,
    })
}

/// How long a conntrack fill serves scrapes before the table is walked
/// again: at least this, and at least four times the last walk's duration
/// (so scrapes spend at most a quarter of the time walking, as the status
/// page does).
pub const FILL_MAX_AGE: Duration = Duration::from_secs(5);

/// The last conntrack fill of a pin directory and how long its walk took:
/// `/metrics` is scraped on the daemon's single thread, and a walk is one
/// syscall per key (hundreds of milliseconds for a full default table), so
/// a scrape reuses a recent fill rather than walking every time.
#[derive(Debug, Default)]
pub struct FillCache {
    last: Option<CachedFill>,
}

/// Which table a cached fill is of: the router's pin directory and its
/// CONNTRACK map's kernel id (a detach and attach, or a resize, makes a
/// new map under the same directory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FillKey {
    pub dir: PathBuf,
    pub conntrack_id: Option<u32>,
}

impl FillKey {
    #[must_use]
    pub fn of(maps: &PinnedMaps) -> Self {
        Self {
            dir: maps.dir().to_path_buf(),
            conntrack_id: maps
                .map_id(router_common::maps::CONNTRACK_MAP)
                .ok()
                .flatten(),
        }
    }
}

#[derive(Debug)]
struct CachedFill {
    key: FillKey,
    at: Instant,
    cost: Duration,
    table: TableUse,
}

impl FillCache {
    /// The fill of `key`'s table: the cached one if it is recent (see
    /// [`FILL_MAX_AGE`]), else `walk`'s, remembered. The eviction
    /// estimate is always computed from `counters`, read just now.
    pub fn get(
        &mut self,
        key: &FillKey,
        now: Instant,
        counters: &[(Counter, CounterValue)],
        walk: impl FnOnce() -> Option<TableUse>,
    ) -> Option<TableUse> {
        let fresh = |c: &CachedFill| {
            c.key == *key && now.saturating_duration_since(c.at) < FILL_MAX_AGE.max(c.cost * 4)
        };
        let table = match &self.last {
            Some(c) if fresh(c) => c.table,
            _ => {
                let started = Instant::now();
                let table = walk()?;
                self.put(key, now, started.elapsed(), table);
                table
            }
        };
        Some(TableUse {
            evicted_estimate: evicted_estimate(counters, table.entries),
            ..table
        })
    }

    /// Remembers a fill walked elsewhere (the status page's sampler) at
    /// `at`, its walk having taken `cost`.
    pub fn put(&mut self, key: &FillKey, at: Instant, cost: Duration, table: TableUse) {
        self.last = Some(CachedFill {
            key: key.clone(),
            at,
            cost,
            table,
        });
    }
}

/// The process's fill cache: the daemon's scrapes and its status page
/// sampler share it, as do the scrapes of `router-ctl metrics`.
pub static FILL_CACHE: Mutex<FillCache> = Mutex::new(FillCache { last: None });

/// [`table_use`] through [`FILL_CACHE`]: a walk at most once per
/// [`FILL_MAX_AGE`] (or four times the last walk's duration).
#[must_use]
pub fn table_use_cached(
    maps: &PinnedMaps,
    counters: &[(Counter, CounterValue)],
) -> Option<TableUse> {
    FILL_CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&FillKey::of(maps), Instant::now(), counters, || {
            table_use(maps, counters)
        })
}

/// See [`TableUse::evicted_estimate`].
#[must_use]
pub fn evicted_estimate(counters: &[(Counter, CounterValue)], entries: usize) -> u64 {
    let get = |c: Counter| {
        counters
            .iter()
            .find(|(k, _)| *k == c)
            .map_or(0, |(_, v)| v.packets)
    };
    get(Counter::CtEntriesInserted)
        .saturating_sub(get(Counter::CtEntriesRemoved))
        .saturating_sub(get(Counter::CtEntriesFlushed))
        .saturating_sub(entries as u64)
}

/// The JSON object: each counter by name, verdicts as `{"packets", "bytes"}`,
/// events as `{"events"}`; plus `"conntrack": {"entries", "capacity"}` when
/// known.
#[must_use]
pub fn stats_json(counters: &[(Counter, CounterValue)], table: Option<TableUse>) -> Value {
    let mut obj: JsonMap<String, Value> = counters
        .iter()
        .map(|(c, v)| {
            let val = if c.is_event() {
                json!({"events": v.packets})
            } else {
                json!({"packets": v.packets, "bytes": v.bytes})
            };
            (c.name().to_owned(), val)
        })
        .collect();
    if let Some(t) = table {
        obj.insert("conntrack".to_owned(), t.json());
    }
    Value::Object(obj)
}

/// The plain table, one section per group with its total.
#[must_use]
pub fn stats_table(counters: &[(Counter, CounterValue)], table: Option<TableUse>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    for g in Group::ALL {
        let rows: Vec<&(Counter, CounterValue)> = counters
            .iter()
            .filter(|(c, _)| Group::of(*c) == g)
            .collect();
        if rows.is_empty() {
            continue;
        }
        if !s.is_empty() {
            s.push('\n');
        }
        let packets: u64 = rows.iter().map(|(_, v)| v.packets).sum();
        if g == Group::Events {
            let _ = writeln!(s, "{:<32} {:>14}", g.title(), "events");
            for (c, v) in rows {
                let _ = writeln!(s, "  {:<30} {:>14}", c.name(), v.packets);
            }
        } else {
            let bytes: u64 = rows.iter().map(|(_, v)| v.bytes).sum();
            let _ = writeln!(s, "{:<32} {:>14} {:>16}", g.title(), "packets", "bytes");
            for (c, v) in rows {
                let _ = writeln!(s, "  {:<30} {:>14} {:>16}", c.name(), v.packets, v.bytes);
            }
            let _ = writeln!(s, "  {:<30} {:>14} {:>16}", "total", packets, bytes);
        }
    }
    if let Some(t) = table {
        s.push_str(&t.lines());
    }
    s
}

/// Prints the counters, the table's use and (in offload mode, or when it
/// runs) the offload daemon's health and events.
pub fn stats(ctx: &Ctx, json: bool) -> Result<()> {
    let maps = ctx.maps();
    let counters = read_counters(&maps)?;
    let table = table_use(&maps, &counters);
    let kernel_mode = maps
        .read_config()
        .is_ok_and(|c| c.admit == Admit::Kernel as u8);
    let daemon = daemon::health_json(ctx.ns());
    let show_daemon = kernel_mode || daemon["running"] == true;
    if json {
        let mut v = stats_json(&counters, table);
        v["admit"] = json!(if kernel_mode { "kernel" } else { "xdp" });
        if show_daemon {
            v["daemon"] = daemon;
        }
        println!("{v}");
    } else {
        print!("{}", stats_table(&counters, table));
        if show_daemon {
            println!("\n{}", daemon::health_line(&daemon, kernel_mode));
        }
    }
    Ok(())
}

/// Rate of change per second between two readings (0 if the counter went
/// backwards, e.g. after a detach and attach).
#[must_use]
#[expect(clippy::cast_precision_loss, reason = "rates are approximate")]
pub fn rate(before: u64, after: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    after.saturating_sub(before) as f64 / secs
}

/// One `--watch` sample as JSON: totals and per-second rates.
#[must_use]
pub fn rates_json(
    prev: &[(Counter, CounterValue)],
    cur: &[(Counter, CounterValue)],
    secs: f64,
    table: Option<TableUse>,
) -> Value {
    let mut counters = JsonMap::new();
    for ((c, p), (_, v)) in prev.iter().zip(cur) {
        let val = if c.is_event() {
            json!({"events": v.packets, "per_sec": rate(p.packets, v.packets, secs)})
        } else {
            json!({
                "packets": v.packets,
                "bytes": v.bytes,
                "pps": rate(p.packets, v.packets, secs),
                "bps": rate(p.bytes, v.bytes, secs) * 8.0,
            })
        };
        counters.insert(c.name().to_owned(), val);
    }
    let mut obj = json!({
        "time": clock::now_unix(),
        "interval_secs": secs,
        "counters": counters,
    });
    if let Some(t) = table {
        obj["conntrack"] = t.json();
    }
    obj
}

/// `12.3k`, `4.56M`...: a rate for the table.
#[must_use]
pub fn human(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// The `--watch` screen: every counter with its total and rates.
#[must_use]
pub fn rates_table(
    prev: &[(Counter, CounterValue)],
    cur: &[(Counter, CounterValue)],
    secs: f64,
    table: Option<TableUse>,
) -> String {
    use std::fmt::Write as _;
    let mut s = format!(
        "{:<32} {:>14} {:>10} {:>10}\n",
        "counter", "total", "pps", "bps"
    );
    for g in Group::ALL {
        for ((c, p), (_, v)) in prev
            .iter()
            .zip(cur)
            .filter(|((c, _), _)| Group::of(*c) == g)
        {
            let pps = rate(p.packets, v.packets, secs);
            if c.is_event() {
                let _ = writeln!(
                    s,
                    "  {:<30} {:>14} {:>10} {:>10}",
                    c.name(),
                    v.packets,
                    format!("{}/s", human(pps)),
                    "-"
                );
            } else {
                let bps = rate(p.bytes, v.bytes, secs) * 8.0;
                let _ = writeln!(
                    s,
                    "  {:<30} {:>14} {:>10} {:>10}",
                    c.name(),
                    v.packets,
                    human(pps),
                    human(bps)
                );
            }
        }
    }
    if let Some(t) = table {
        s.push_str(&t.lines());
    }
    s
}

/// `stats --watch`: rates every `interval` seconds until Ctrl-C (or
/// `count` refreshes).
pub fn watch(maps: &PinnedMaps, json: bool, interval: f64, count: Option<u64>) -> Result<()> {
    use std::io::{IsTerminal as _, Write as _};
    let tty = std::io::stdout().is_terminal();
    let mut prev = read_counters(maps)?;
    let mut t0 = std::time::Instant::now();
    let mut n = 0u64;
    loop {
        std::thread::sleep(std::time::Duration::from_secs_f64(interval));
        let cur = read_counters(maps)?;
        let t1 = std::time::Instant::now();
        let secs = (t1 - t0).as_secs_f64();
        let table = table_use(maps, &cur);
        let mut out = std::io::stdout().lock();
        if json {
            writeln!(out, "{}", rates_json(&prev, &cur, secs, table))?;
        } else {
            if tty {
                // Clear the screen and go home.
                write!(out, "\x1b[2J\x1b[H")?;
            }
            writeln!(
                out,
                "{} (every {interval} s, Ctrl-C to stop)",
                clock::format_time(clock::now_unix())
            )?;
            write!(out, "{}", rates_table(&prev, &cur, secs, table))?;
            if !tty {
                writeln!(out)?;
            }
        }
        out.flush()?;
        (prev, t0) = (cur, t1);
        n += 1;
        if count.is_some_and(|c| n >= c) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two scrapes in a row walk the table once; a scrape after
    /// [`FILL_MAX_AGE`] walks again; a slow walk spaces them further; the
    /// eviction estimate follows the counters of each scrape.
    #[test]
    fn scrapes_within_the_interval_walk_the_table_once() {
        let walks = std::cell::Cell::new(0);
        let table = TableUse {
            entries: 10,
            capacity: 100,
            evicted_estimate: 0,
            ipv6: None,
        };
        let walk = || {
            walks.set(walks.get() + 1);
            Some(table)
        };
        let inserted = |n| {
            [(
                Counter::CtEntriesInserted,
                CounterValue {
                    packets: n,
                    bytes: 0,
                },
            )]
        };
        let dir = &FillKey {
            dir: "/sys/fs/bpf/xdp-router/unit".into(),
            conntrack_id: Some(7),
        };
        let mut cache = FillCache::default();
        let t0 = Instant::now();
        let first = cache.get(dir, t0, &inserted(10), walk).unwrap();
        assert_eq!(first.evicted_estimate, 0);
        let second = cache
            .get(dir, t0 + Duration::from_secs(1), &inserted(15), walk)
            .unwrap();
        assert_eq!(walks.get(), 1, "the second scrape walked again");
        assert_eq!((second.entries, second.evicted_estimate), (10, 5));
        let _ = cache.get(dir, t0 + FILL_MAX_AGE, &[], walk);
        assert_eq!(walks.get(), 2);
        // Another router's pins are not this one's fill, nor a new table
        // under the same pins (a detach and attach, a resize).
        let elsewhere = FillKey {
            dir: "/elsewhere".into(),
            conntrack_id: Some(7),
        };
        let _ = cache.get(&elsewhere, t0 + FILL_MAX_AGE, &[], walk);
        assert_eq!(walks.get(), 3);
        let _ = cache.get(dir, t0 + FILL_MAX_AGE, &[], walk);
        assert_eq!(walks.get(), 4);
        let reattached = FillKey {
            conntrack_id: Some(8),
            ..dir.clone()
        };
        let _ = cache.get(&reattached, t0 + FILL_MAX_AGE, &[], walk);
        assert_eq!(walks.get(), 5);
        let _ = cache.get(&reattached, t0 + FILL_MAX_AGE, &[], walk);
        assert_eq!(walks.get(), 5);
        // A walk that took 3 s is reused for 12 s.
        cache.put(dir, t0, Duration::from_secs(3), table);
        let _ = cache.get(dir, t0 + Duration::from_secs(11), &[], walk);
        assert_eq!(walks.get(), 5);
        let _ = cache.get(dir, t0 + Duration::from_secs(12), &[], walk);
        assert_eq!(walks.get(), 6);
        // Nothing to walk (not attached): not remembered.
        let mut empty = FillCache::default();
        assert!(empty.get(dir, t0, &[], || None).is_none());
        assert!(empty.last.is_none());
    }

    fn sample() -> Vec<(Counter, CounterValue)> {
        Counter::ALL
            .iter()
            .zip(1u64..)
            .map(|(&c, i)| {
                let bytes = if c.is_event() { 0 } else { i * 100 };
                (c, CounterValue { packets: i, bytes })
            })
            .collect()
    }

    #[test]
    fn every_counter_has_a_known_group() {
        for &c in Counter::ALL {
            assert_ne!(Group::of(c), Group::Other, "{}", c.name());
        }
        assert_eq!(Group::of(Counter::FwdOutbound), Group::Forwarded);
        assert_eq!(Group::of(Counter::PassNoFlow), Group::Passed);
        assert_eq!(Group::of(Counter::DropMalformed), Group::Dropped);
        assert_eq!(Group::of(Counter::FlowNewMasquerade), Group::Events);
        assert_eq!(Group::of(Counter::Fwd6Inbound), Group::Forwarded);
        assert_eq!(Group::of(Counter::Pass6ExtEsp), Group::Passed);
        assert_eq!(Group::of(Counter::Drop6Unsolicited), Group::Dropped);
    }

    #[test]
    fn json_is_keyed_by_name_with_the_right_shape() {
        let v = stats_json(&sample(), None);
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), Counter::ALL.len());
        for (i, &c) in Counter::ALL.iter().enumerate() {
            let e = &obj[c.name()];
            let n = i as u64 + 1;
            if c.is_event() {
                assert_eq!(*e, json!({"events": n}), "{}", c.name());
            } else {
                assert_eq!(*e, json!({"packets": n, "bytes": n * 100}), "{}", c.name());
            }
        }
        let with = stats_json(
            &sample(),
            Some(TableUse {
                entries: 6,
                capacity: 524_288,
                evicted_estimate: 4,
                ipv6: Some(TableUse6 {
                    entries: 2,
                    capacity: 131_072,
                }),
            }),
        );
        assert_eq!(
            with["conntrack"],
            json!({"entries": 6, "capacity": 524_288, "evicted_estimate": 4,
                   "ipv6": {"entries": 2, "capacity": 131_072}})
        );
    }

    #[test]
    fn eviction_estimate_accounts_for_removals_flushes_and_entries() {
        let c = |k, n| {
            (
                k,
                CounterValue {
                    packets: n,
                    bytes: 0,
                },
            )
        };
        let counters = [
            c(Counter::CtEntriesInserted, 100),
            c(Counter::CtEntriesRemoved, 10),
            c(Counter::CtEntriesFlushed, 20),
        ];
        assert_eq!(evicted_estimate(&counters, 30), 40);
        assert_eq!(evicted_estimate(&counters, 500), 0, "never negative");
        assert_eq!(evicted_estimate(&[], 0), 0);
    }

    #[test]
    fn table_has_every_counter_under_its_group() {
        let t = stats_table(
            &sample(),
            Some(TableUse {
                entries: 2,
                capacity: 8,
                evicted_estimate: 0,
                ipv6: Some(TableUse6 {
                    entries: 4,
                    capacity: 16,
                }),
            }),
        );
        for &c in Counter::ALL {
            assert_eq!(
                t.lines()
                    .filter(|l| l.split_whitespace().next() == Some(c.name()))
                    .count(),
                1,
                "{}",
                c.name()
            );
        }
        let pos = |needle: &str| t.find(needle).unwrap_or_else(|| panic!("{needle} in\n{t}"));
        assert!(pos("forwarded") < pos("fwd_outbound"));
        assert!(pos("fwd_inbound") < pos("passed to kernel"));
        assert!(pos("passed to kernel") < pos("pass_not_ipv4"));
        assert!(pos("dropped") < pos("drop_truncated"));
        assert!(pos("events") < pos("flow_new_masquerade"));
        // Both families' forwarded counters: fwd_outbound 1 pkt/100 B +
        // fwd_inbound 2/200 + fwd6_outbound and fwd6_inbound.
        let (p6, b6): (u64, u64) = sample()
            .iter()
            .filter(|(c, _)| matches!(c, Counter::Fwd6Outbound | Counter::Fwd6Inbound))
            .fold((0, 0), |(p, b), (_, v)| (p + v.packets, b + v.bytes));
        assert!(
            t.contains(&format!(
                "  {:<30} {:>14} {:>16}",
                "total",
                3 + p6,
                300 + b6
            )),
            "{t}"
        );
        assert!(t.contains("conntrack entries 2 of capacity 8"));
        assert!(
            t.contains("conntrack6 entries 4 of capacity 16 (IPv6"),
            "{t}"
        );
    }

    #[test]
    fn rates() {
        assert!((rate(100, 300, 2.0) - 100.0).abs() < 1e-9);
        assert!(rate(300, 100, 1.0).abs() < 1e-9);
        assert!(rate(1, 2, 0.0).abs() < 1e-9);
        assert_eq!(human(999.0), "999");
        assert_eq!(human(12_345.0), "12.3k");
        assert_eq!(human(4_560_000.0), "4.56M");
        assert_eq!(human(2.5e9), "2.50G");
        let prev = sample();
        let cur: Vec<_> = prev
            .iter()
            .map(|&(c, v)| {
                (
                    c,
                    CounterValue {
                        packets: v.packets + 10,
                        bytes: v.bytes + 1000,
                    },
                )
            })
            .collect();
        let j = rates_json(&prev, &cur, 2.0, None);
        assert_eq!(j["counters"]["fwd_outbound"]["pps"], 5.0);
        assert_eq!(j["counters"]["fwd_outbound"]["bps"], 4000.0);
        assert_eq!(j["counters"]["flow_new_masquerade"]["per_sec"], 5.0);
        let t = rates_table(&prev, &cur, 2.0, None);
        assert!(t.contains("fwd_outbound"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.contains("fwd_outbound") && l.contains("4.0k")),
            "{t}"
        );
    }
}
