//! `stats`: the per-CPU counters summed, grouped by outcome.

use anyhow::{Context, Result};
use router_common::maps::{Counter, CounterValue};
use serde_json::{Map as JsonMap, Value, json};

use crate::{
    clock,
    ctx::Ctx,
    daemon,
    maps::PinnedMaps,
    table_fill::{TableUse, table_use},
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
    let mut out = Vec::new();
    for &c in Counter::ALL {
        let Some(idx) = crate::maps::counter_index(&map, c) else {
            out.push((c, CounterValue::default()));
            continue;
        };
        let values = map
            .get(&idx, 0)
            .with_context(|| format!("reading counter {}", c.name()))?;
        let sum = values
            .iter()
            .fold(CounterValue::default(), |a, v| a.wrapping_add(*v));
        out.push((c, sum));
    }
    Ok(out)
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
    let kernel_mode = maps.offload_mode();
    let mut daemon = daemon::health_json(ctx.ns());
    if kernel_mode && daemon["running"] != true {
        let on = crate::conntrack::OnFastPath::read(&maps).ok();
        daemon::add_stopped(&mut daemon, on.as_ref());
    }
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
    use crate::table_fill::TableUse6;

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
        // Every forwarded counter: fwd_outbound 1 pkt/100 B + fwd_inbound
        // 2/200 + fwd_fragment, fwd_ip_options, fwd6_outbound and
        // fwd6_inbound.
        let (p6, b6): (u64, u64) = sample()
            .iter()
            .filter(|(c, _)| {
                matches!(
                    c,
                    Counter::FwdFragment
                        | Counter::FwdIpOptions
                        | Counter::Fwd6Outbound
                        | Counter::Fwd6Inbound
                )
            })
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
