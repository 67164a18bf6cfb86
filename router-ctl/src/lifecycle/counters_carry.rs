//! A live replace whose object counts more (or fewer) things than the
//! running router: the pinned `COUNTERS` has another length than the new
//! object's. Counters only ever go last (`router_common::maps::Counter`), so
//! index `i` is the same counter in both; the new program gets a `COUNTERS`
//! of its own length with the counts carried over, and an upgrade that adds
//! a counter keeps the flows like any other replace (no detach).
//!
//! Order, so that no attached program ever uses a map that is not pinned as
//! `COUNTERS` and a replace cut short leaves a router that the next attach
//! finishes:
//! 1. [`Carry::prepare`]: the old map is opened; the loader creates the new
//!    one pinned as [`NEXT_PIN`] (a leftover of a replace cut short before
//!    step 2 is removed first: no program used it).
//! 2. [`Carry::take_over`], once the replace is journaled (`pending` in the
//!    record, so the next attach finishes a replace cut short after it,
//!    also for the same object): the old counts are written into the new
//!    map (no program uses it yet, so nothing races), and the new map's
//!    pin replaces `COUNTERS` in one rename.
//! 3. The links switch to the new program.
//! 4. [`Carry::finish`]: what the old program counted between step 2 and its
//!    last run is added. A replace cut short between 2 and 4 loses the old
//!    program's counts from then until attach runs again.

use std::{fs, path::Path, thread, time::Duration};

use anyhow::{Context, Result};
use aya::maps::PerCpuValues;
use router_common::maps::{COUNTERS_MAP, CounterValue};
use tracing::info;

use crate::{
    maps::{CountersMap, PinnedMaps},
    object::Object,
};

use super::loader;

/// Where the loader pins the new object's `COUNTERS` until it replaces the
/// old pin (bpffs refuses names with a dot).
pub const NEXT_PIN: &str = "COUNTERS_NEXT";

/// How long the old program may still be running after its links switched:
/// an XDP run in flight on another CPU finishes within one NAPI poll.
const OLD_RUNS_DONE: Duration = Duration::from_millis(50);

/// The old `COUNTERS` of a replace that carries it over, and what step 2
/// copied from it.
pub struct Carry {
    old: CountersMap,
    old_len: u32,
    new_len: u32,
    copied: Vec<Vec<CounterValue>>,
}

impl Carry {
    /// Step 1: `Some` if the pinned `COUNTERS` of `dir` has another length
    /// than `obj`'s (the loader must then pin the new one at [`NEXT_PIN`]).
    pub fn prepare(dir: &Path, obj: &Object) -> Result<Option<Self>> {
        let next = dir.join(NEXT_PIN);
        if next.exists() {
            // Left by a replace cut short before its rename: no program
            // ever used it.
            fs::remove_file(&next).with_context(|| format!("removing {}", next.display()))?;
        }
        let new_len = loader::object_layouts(&obj.bytes)?
            .into_iter()
            .find(|(n, _)| *n == COUNTERS_MAP)
            .map(|(_, l)| l.max_entries)
            .context("the object has no COUNTERS map")?;
        let old = PinnedMaps::at(dir).counters()?;
        let old_len = old.len();
        if old_len == new_len {
            return Ok(None);
        }
        Ok(Some(Self {
            old,
            old_len,
            new_len,
            copied: Vec::new(),
        }))
    }

    /// Step 2: the old counts into the new map pinned at [`NEXT_PIN`], then
    /// that pin replaces `COUNTERS`.
    pub fn take_over(&mut self, dir: &Path) -> Result<()> {
        let next = dir.join(NEXT_PIN);
        loader::chmod_600(&next)?;
        let mut new: CountersMap = PinnedMaps::at(dir).typed(NEXT_PIN)?;
        self.copied = read_all(&self.old, self.old_len.min(self.new_len))?;
        for (i, values) in (0u32..).zip(&self.copied) {
            set(&mut new, i, values.clone())?;
        }
        let pin = dir.join(COUNTERS_MAP);
        fs::rename(&next, &pin)
            .with_context(|| format!("renaming {} to {}", next.display(), pin.display()))?;
        info!(
            "COUNTERS grows from {} to {} counters: the counts go on in the new map",
            self.old_len, self.new_len
        );
        Ok(())
    }

    /// Step 4, once the links run the new program: what the old one counted
    /// after step 2 goes into the new map. The new program counts at the
    /// same time; a packet it counts between this read and write of one
    /// counter on one CPU is lost (a few at most, once).
    pub fn finish(self, dir: &Path) -> Result<()> {
        thread::sleep(OLD_RUNS_DONE);
        let now = read_all(&self.old, self.old_len.min(self.new_len))?;
        let mut new = PinnedMaps::at(dir).counters()?;
        for (i, (was, is)) in (0u32..).zip(self.copied.iter().zip(&now)) {
            let late: Vec<CounterValue> = was.iter().zip(is).map(|(w, n)| minus(*n, *w)).collect();
            if late.iter().all(|v| *v == CounterValue::default()) {
                continue;
            }
            let cur = new.get(&i, 0).context("reading COUNTERS")?;
            let sum = cur
                .iter()
                .zip(&late)
                .map(|(c, l)| c.wrapping_add(*l))
                .collect();
            set(&mut new, i, sum)?;
        }
        Ok(())
    }
}

/// Counters `0..n`, each as its per-CPU values.
fn read_all(map: &CountersMap, n: u32) -> Result<Vec<Vec<CounterValue>>> {
    (0..n)
        .map(|i| Ok(map.get(&i, 0).context("reading COUNTERS")?.to_vec()))
        .collect()
}

fn set(map: &mut CountersMap, i: u32, values: Vec<CounterValue>) -> Result<()> {
    let values = PerCpuValues::try_from(values).context("per-CPU values")?;
    map.set(i, values, 0).context("writing COUNTERS")
}

fn minus(a: CounterValue, b: CounterValue) -> CounterValue {
    CounterValue {
        packets: a.packets.wrapping_sub(b.packets),
        bytes: a.bytes.wrapping_sub(b.bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_counts_are_the_difference_and_wrap() {
        let v = |packets, bytes| CounterValue { packets, bytes };
        assert_eq!(minus(v(10, 1000), v(7, 600)), v(3, 400));
        assert_eq!(minus(v(2, 5), v(u64::MAX, u64::MAX - 1)), v(3, 7));
        assert_eq!(v(u64::MAX, 1).wrapping_add(v(2, 2)), v(1, 3));
    }
}
