//! How full the conntrack tables are: entries in use against capacity for
//! IPv4 and IPv6, the estimate of what the LRU evicted, and the cache of
//! that walk which `/metrics` and the status page share (a walk of a large
//! table is not repeated at every scrape).

use std::{
    path::PathBuf,
    sync::Mutex,
    time::{Duration, Instant},
};

use router_common::maps::{Counter, CounterValue};
use serde_json::{Value, json};

use crate::maps::{self, PinnedMaps};

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

/// `counters` are the summed counters just read
/// ([`crate::stats::read_counters`]), for
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
}
