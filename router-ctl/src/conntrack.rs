//! `conntrack list|count|flush`: the flow table in `CONNTRACK`, and the
//! IPv6 flows in `CONNTRACK6` too.

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result};
use router_common::{
    flow,
    maps::{
        FLAG_OFFLOADED, FLAG_ORIGINAL, FLAG_PORT_FORWARD, FlowEntry, FlowEntry6, FlowKey, FlowKey6,
        FlowState, Timeouts,
    },
};
use serde::Serialize;

use crate::{
    clock::monotonic_ns,
    maps::{self, PinnedMaps, errno, snapshot},
    parse::proto_name,
};

/// One flow as `conntrack list --json` prints it.
#[derive(Debug, PartialEq, Serialize)]
pub struct FlowRow {
    pub proto: String,
    pub state: &'static str,
    /// `lan` (masqueraded) or `wan` (opened through a port forward).
    pub origin: &'static str,
    pub orig_src: String,
    pub orig_dst: String,
    pub xlat_src: String,
    pub xlat_dst: String,
    pub age_secs: f64,
    pub idle_secs: f64,
    pub expired: bool,
    pub reply_present: bool,
    /// Admitted by the kernel and carried by XDP for it (offload mode).
    pub offloaded: bool,
    /// `ipv4` or `ipv6` (routed: its translated endpoints are the
    /// original ones; `origin` `wan` means opened through a pinhole).
    pub family: &'static str,
}

fn endpoint(addr: [u8; 4], port: u16) -> String {
    format!("{}:{port}", Ipv4Addr::from(addr))
}

/// Nanoseconds as seconds, to the millisecond.
#[expect(
    clippy::cast_precision_loss,
    reason = "milliseconds below 2^53 are exact"
)]
fn secs(ns: u64) -> f64 {
    (ns / 1_000_000) as f64 / 1000.0
}

/// The row of the flow whose original-direction entry is `key` -> `orig`;
/// `reply` is the entry under `orig.peer`, if present. Times are the
/// flow's newest refresh of either entry.
#[must_use]
pub fn flow_row(
    key: &FlowKey,
    orig: &FlowEntry,
    reply: Option<&FlowEntry>,
    now_ns: u64,
    t: &Timeouts,
) -> FlowRow {
    let last_seen = reply.map_or(orig.last_seen_ns, |r| r.last_seen_ns.max(orig.last_seen_ns));
    FlowRow {
        proto: proto_name(key.proto),
        state: FlowState::name(orig.state),
        origin: if orig.flags & FLAG_PORT_FORWARD == 0 {
            "lan"
        } else {
            "wan"
        },
        orig_src: endpoint(key.src_addr, key.src_port),
        orig_dst: endpoint(key.dst_addr, key.dst_port),
        xlat_src: endpoint(orig.new_src_addr, orig.new_src_port),
        xlat_dst: endpoint(orig.new_dst_addr, orig.new_dst_port),
        age_secs: secs(now_ns.saturating_sub(orig.created_ns)),
        idle_secs: secs(now_ns.saturating_sub(last_seen)),
        expired: flow::expired(orig.state, last_seen, now_ns, t),
        reply_present: reply.is_some(),
        offloaded: orig.flags & FLAG_OFFLOADED != 0,
        family: "ipv4",
    }
}

fn endpoint6(addr: [u8; 16], port: u16) -> String {
    format!("[{}]:{port}", Ipv6Addr::from(addr))
}

/// [`flow_row`] of an IPv6 flow: `reply` is the entry under the reversed
/// key.
#[must_use]
pub fn flow_row6(
    key: &FlowKey6,
    orig: &FlowEntry6,
    reply: Option<&FlowEntry6>,
    now_ns: u64,
    t: &Timeouts,
) -> FlowRow {
    let last_seen = reply.map_or(orig.last_seen_ns, |r| r.last_seen_ns.max(orig.last_seen_ns));
    let (src, dst) = (
        endpoint6(key.src_addr, key.src_port),
        endpoint6(key.dst_addr, key.dst_port),
    );
    FlowRow {
        proto: proto_name(key.proto),
        state: FlowState::name(orig.state),
        origin: if orig.flags & FLAG_PORT_FORWARD == 0 {
            "lan"
        } else {
            "wan"
        },
        xlat_src: src.clone(),
        xlat_dst: dst.clone(),
        orig_src: src,
        orig_dst: dst,
        age_secs: secs(now_ns.saturating_sub(orig.created_ns)),
        idle_secs: secs(now_ns.saturating_sub(last_seen)),
        expired: flow::expired(orig.state, last_seen, now_ns, t),
        reply_present: reply.is_some(),
        offloaded: orig.flags & FLAG_OFFLOADED != 0,
        family: "ipv6",
    }
}

/// Rows for every original-direction entry of an IPv6 table snapshot.
#[must_use]
pub fn flow_rows6(entries: &[(FlowKey6, FlowEntry6)], now_ns: u64, t: &Timeouts) -> Vec<FlowRow> {
    let by_key: std::collections::BTreeMap<FlowKey6, &FlowEntry6> =
        entries.iter().map(|(k, e)| (*k, e)).collect();
    by_key
        .iter()
        .filter(|(_, e)| e.flags & FLAG_ORIGINAL != 0)
        .map(|(k, e)| flow_row6(k, e, by_key.get(&k.reversed()).copied(), now_ns, t))
        .collect()
}

/// Rows for every original-direction entry of a table snapshot, sorted by
/// key.
#[must_use]
pub fn flow_rows(entries: &[(FlowKey, FlowEntry)], now_ns: u64, t: &Timeouts) -> Vec<FlowRow> {
    let by_key: std::collections::BTreeMap<FlowKey, &FlowEntry> =
        entries.iter().map(|(k, e)| (*k, e)).collect();
    by_key
        .iter()
        .filter(|(_, e)| e.flags & FLAG_ORIGINAL != 0)
        .map(|(k, e)| flow_row(k, e, by_key.get(&e.peer).copied(), now_ns, t))
        .collect()
}

#[must_use]
pub fn rows_table(rows: &[FlowRow]) -> String {
    use std::fmt::Write as _;
    if rows.is_empty() {
        return "no flows\n".to_owned();
    }
    let mut s = format!(
        "{:<5} {:<11} {:<6} {:<21} {:<21} {:<21} {:<21} {:>10} {:>9}\n",
        "proto", "state", "origin", "orig_src", "orig_dst", "xlat_src", "xlat_dst", "age", "idle"
    );
    for r in rows {
        let mut notes = String::new();
        if r.expired {
            notes.push_str(" expired");
        }
        if r.offloaded {
            notes.push_str(" offloaded");
        }
        if !r.reply_present {
            notes.push_str(" no-reply-entry");
        }
        let _ = writeln!(
            s,
            "{:<5} {:<11} {:<6} {:<21} {:<21} {:<21} {:<21} {:>9.1}s {:>8.1}s{notes}",
            r.proto,
            r.state,
            r.origin,
            r.orig_src,
            r.orig_dst,
            r.xlat_src,
            r.xlat_dst,
            r.age_secs,
            r.idle_secs
        );
    }
    s
}

pub fn list(maps: &PinnedMaps, json: bool) -> Result<()> {
    let table = maps.conntrack()?;
    let cfg = maps.read_config()?;
    let cap = maps::capacity(&table)?;
    let entries = snapshot(&table, cap)?;
    let now = monotonic_ns();
    let mut rows = flow_rows(&entries, now, &cfg.timeouts);
    // A router attached by an older router-ctl has no CONNTRACK6 pinned.
    if let Ok(table6) = maps.conntrack6() {
        let cap6 = maps::capacity(&table6)?;
        rows.extend(flow_rows6(&snapshot(&table6, cap6)?, now, &cfg.timeouts));
    }
    if json {
        println!("{}", serde_json::to_string(&rows)?);
    } else {
        print!("{}", rows_table(&rows));
    }
    Ok(())
}

/// Flows (original entries), all entries, capacity in entries; IPv6's
/// table under `ipv6` where it is pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub flows: usize,
    pub entries: usize,
    pub capacity: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<Counts6>,
}

/// [`Counts`] of `CONNTRACK6`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Counts6 {
    pub flows: usize,
    pub entries: usize,
    pub capacity: u32,
}

impl Counts6 {
    #[must_use]
    pub fn of(entries: &[(FlowKey6, FlowEntry6)], capacity: u32) -> Self {
        Self {
            flows: entries
                .iter()
                .filter(|(_, e)| e.flags & FLAG_ORIGINAL != 0)
                .count(),
            entries: entries.len(),
            capacity,
        }
    }
}

impl Counts {
    #[must_use]
    pub fn of(entries: &[(FlowKey, FlowEntry)], capacity: u32) -> Self {
        Self {
            flows: entries
                .iter()
                .filter(|(_, e)| e.flags & FLAG_ORIGINAL != 0)
                .count(),
            entries: entries.len(),
            capacity,
            ipv6: None,
        }
    }

    #[must_use]
    pub fn json(&self) -> String {
        serde_json::to_string(self).expect("plain struct serializes")
    }

    #[must_use]
    pub fn plain(&self) -> String {
        use std::fmt::Write as _;
        let mut s = format!(
            "flows {} entries {} capacity {}",
            self.flows, self.entries, self.capacity
        );
        if let Some(c) = self.ipv6 {
            let _ = write!(
                s,
                "\nipv6 flows {} entries {} capacity {}",
                c.flows, c.entries, c.capacity
            );
        }
        s
    }
}

pub fn count(maps: &PinnedMaps, json: bool) -> Result<()> {
    let table = maps.conntrack()?;
    let cap = maps::capacity(&table)?;
    let mut c = Counts::of(&snapshot(&table, cap)?, cap);
    // A router attached by an older router-ctl has no CONNTRACK6 pinned.
    if let Ok(table6) = maps.conntrack6() {
        let cap6 = maps::capacity(&table6)?;
        c.ipv6 = Some(Counts6::of(&snapshot(&table6, cap6)?, cap6));
    }
    if json {
        println!("{}", c.json());
    } else {
        println!("{}", c.plain());
    }
    Ok(())
}

/// Removes every entry of `table`; entries and flows (entries whose flags
/// `flags_of` has [`FLAG_ORIGINAL`]) removed.
fn flush_table<K: aya::Pod + Ord, V: aya::Pod>(
    table: &mut aya::maps::HashMap<aya::maps::MapData, K, V>,
    flags_of: fn(&V) -> u8,
) -> Result<(usize, usize)> {
    let cap = maps::capacity(table)?;
    let entries = snapshot(table, cap)?;
    let (mut removed, mut flows) = (0usize, 0usize);
    for (k, e) in &entries {
        match table.remove(k) {
            Ok(()) => {
                removed += 1;
                if flags_of(e) & FLAG_ORIGINAL != 0 {
                    flows += 1;
                }
            }
            // Gone already (expired and replaced, or evicted).
            Err(err) if errno(&err) == Some(libc::ENOENT) => {}
            Err(err) => return Err(err).context("removing a conntrack entry"),
        }
    }
    Ok((removed, flows))
}

pub fn flush(maps: &PinnedMaps) -> Result<()> {
    let mut table = maps.conntrack()?;
    let (removed, flows) = flush_table(&mut table, |e: &FlowEntry| e.flags)?;
    record_flushed(maps, removed as u64)?;
    let v6 = match maps.conntrack6() {
        Ok(mut table6) => {
            let (removed6, flows6) = flush_table(&mut table6, |e: &FlowEntry6| e.flags)?;
            format!(", {removed6} IPv6 entries ({flows6} flows)")
        }
        // Attached by an older router-ctl: no CONNTRACK6 pinned.
        Err(_) => String::new(),
    };
    println!(
        "flushed {removed} entries ({flows} flows){v6}; new packets of those flows open new \
         flows or go to the kernel"
    );
    Ok(())
}

/// Adds `n` to the `ct_entries_flushed` counter (CPU 0's slot: the data
/// path never writes this counter, so there is no lost update), for the
/// eviction estimate of `stats`.
fn record_flushed(maps: &PinnedMaps, n: u64) -> Result<()> {
    use aya::maps::PerCpuValues;
    use router_common::maps::{Counter, CounterValue};
    let mut map = maps.counters()?;
    let idx = Counter::CtEntriesFlushed as u32;
    let mut values: Vec<CounterValue> = map.get(&idx, 0).context("reading COUNTERS")?.to_vec();
    if let Some(v) = values.first_mut() {
        v.packets = v.packets.wrapping_add(n);
    }
    let values = PerCpuValues::try_from(values).context("per-CPU values")?;
    map.set(idx, values, 0).context("writing COUNTERS")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use router_common::maps::{IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP};
    use serde_json::json;

    const SEC: u64 = 1_000_000_000;
    const CLIENT: [u8; 4] = [192, 168, 50, 2];
    const SERVER: [u8; 4] = [203, 0, 113, 2];
    const WAN: [u8; 4] = [203, 0, 113, 1];

    /// A masqueraded TCP flow from client port `port` to the same WAN port,
    /// created at 10 s: both entries.
    fn masq(port: u16) -> [(FlowKey, FlowEntry); 2] {
        let k = FlowKey::new(CLIENT, SERVER, port, 5201, IPPROTO_TCP);
        let x = flow::masquerade_key(&k, WAN, port);
        let (oe, rk, re) = flow::new_flow(&k, &x, 0, 10 * SEC);
        [(k, oe), (rk, re)]
    }

    #[test]
    fn ipv6_rows_pair_through_the_reversed_key() {
        use router_common::maps::FLAG_PORT_FORWARD;
        let client = Ipv6Addr::new(0x2001, 0xdb8, 0x50, 0, 0, 0, 0, 2).octets();
        let server = Ipv6Addr::new(0x2001, 0xdb8, 0x71, 0, 0, 0, 0, 2).octets();
        let k = FlowKey6::new(server, client, 50000, 22, IPPROTO_TCP);
        let orig = FlowEntry6 {
            last_seen_ns: 10 * SEC,
            created_ns: 10 * SEC,
            state: FlowState::TcpEstablished as u8,
            flags: FLAG_ORIGINAL | FLAG_PORT_FORWARD,
            ..FlowEntry6::default()
        };
        let reply = FlowEntry6 {
            flags: FLAG_PORT_FORWARD,
            last_seen_ns: 11 * SEC,
            ..orig
        };
        let rows = flow_rows6(
            &[(k, orig), (k.reversed(), reply)],
            12 * SEC,
            &Timeouts::default(),
        );
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(
            (row.family, row.origin, row.state, row.proto.as_str()),
            ("ipv6", "wan", "ESTABLISHED", "tcp")
        );
        assert_eq!(row.orig_src, "[2001:db8:71::2]:50000");
        assert_eq!(row.orig_dst, "[2001:db8:50::2]:22");
        assert_eq!(
            (&row.xlat_src, &row.xlat_dst),
            (&row.orig_src, &row.orig_dst)
        );
        assert!(row.reply_present);
        assert!((row.idle_secs - 1.0).abs() < 1e-9, "{row:?}");
        let alone = flow_rows6(&[(k, orig)], 12 * SEC, &Timeouts::default());
        assert!(!alone[0].reply_present);
    }

    #[test]
    fn row_of_a_masqueraded_flow() {
        let [(k, mut oe), (_, mut re)] = masq(40000);
        oe.state = FlowState::TcpEstablished as u8;
        re.state = oe.state;
        re.last_seen_ns = 11 * SEC + SEC / 2;
        let now = 11 * SEC + 700 * 1_000_000;
        let row = flow_row(&k, &oe, Some(&re), now, &Timeouts::default());
        assert_eq!(
            row,
            FlowRow {
                proto: "tcp".into(),
                state: "ESTABLISHED",
                origin: "lan",
                orig_src: "192.168.50.2:40000".into(),
                orig_dst: "203.0.113.2:5201".into(),
                xlat_src: "203.0.113.1:40000".into(),
                xlat_dst: "203.0.113.2:5201".into(),
                age_secs: 1.7,
                idle_secs: 0.2,
                expired: false,
                reply_present: true,
                offloaded: false,
                family: "ipv4",
            }
        );
        assert_eq!(
            serde_json::to_value(&row).unwrap(),
            json!({
                "proto": "tcp", "state": "ESTABLISHED", "origin": "lan",
                "orig_src": "192.168.50.2:40000", "orig_dst": "203.0.113.2:5201",
                "xlat_src": "203.0.113.1:40000", "xlat_dst": "203.0.113.2:5201",
                "age_secs": 1.7, "idle_secs": 0.2, "expired": false, "reply_present": true,
                "offloaded": false, "family": "ipv4"
            })
        );
        // Field order is the contract's.
        let s = serde_json::to_string(&row).unwrap();
        assert!(
            s.starts_with(r#"{"proto":"tcp","state":"ESTABLISHED","origin":"lan","#),
            "{s}"
        );
    }

    #[test]
    fn expiry_uses_the_state_timeout_and_newest_refresh() {
        let [(k, oe), (_, re)] = masq(40000);
        let t = Timeouts {
            tcp_syn_sent: 5,
            ..Timeouts::default()
        };
        let now = 10 * SEC + 6 * SEC;
        assert!(flow_row(&k, &oe, Some(&re), now, &t).expired);
        let mut fresh = re;
        fresh.last_seen_ns = 15 * SEC;
        let row = flow_row(&k, &oe, Some(&fresh), now, &t);
        assert!(!row.expired);
        assert!((row.idle_secs - 1.0).abs() < 1e-9);
        // A clock slightly behind the data path's is not negative age.
        let row = flow_row(&k, &oe, None, 9 * SEC, &t);
        assert!(row.age_secs == 0.0 && row.idle_secs == 0.0 && !row.expired);
        assert!(!row.reply_present);
    }

    #[test]
    fn port_forward_udp_and_icmp_rows() {
        let k = FlowKey::new(SERVER, WAN, 50000, 8080, IPPROTO_UDP);
        let x = FlowKey::new(SERVER, CLIENT, 50000, 80, IPPROTO_UDP);
        let (oe, _, re) = flow::new_flow(&k, &x, FLAG_PORT_FORWARD, SEC);
        let row = flow_row(&k, &oe, Some(&re), 2 * SEC, &Timeouts::default());
        assert_eq!(
            (row.proto.as_str(), row.state, row.origin),
            ("udp", "UNREPLIED", "wan")
        );
        assert_eq!(
            (row.orig_dst.as_str(), row.xlat_dst.as_str()),
            ("203.0.113.1:8080", "192.168.50.2:80")
        );

        let k = FlowKey::new(CLIENT, SERVER, 7, 7, IPPROTO_ICMP);
        let x = flow::masquerade_key(&k, WAN, 1500);
        let (oe, _, _) = flow::new_flow(&k, &x, 0, SEC);
        let row = flow_row(&k, &oe, None, SEC, &Timeouts::default());
        assert_eq!((row.proto.as_str(), row.state), ("icmp", "ICMP"));
        assert_eq!(
            (
                row.orig_src.as_str(),
                row.xlat_src.as_str(),
                row.xlat_dst.as_str()
            ),
            ("192.168.50.2:7", "203.0.113.1:1500", "203.0.113.2:1500")
        );
    }

    #[test]
    fn rows_pair_entries_through_peer() {
        let mut entries: Vec<(FlowKey, FlowEntry)> = masq(40000).into();
        entries.extend(masq(40001).into_iter().take(1)); // reply entry evicted
        // An orphan reply entry is not a flow.
        entries.push(masq(40002)[1]);
        let rows = flow_rows(&entries, 10 * SEC, &Timeouts::default());
        assert_eq!(rows.len(), 2);
        let present: Vec<(String, bool)> = rows
            .iter()
            .map(|r| (r.xlat_src.clone(), r.reply_present))
            .collect();
        assert!(present.contains(&("203.0.113.1:40000".into(), true)));
        assert!(present.contains(&("203.0.113.1:40001".into(), false)));
        let c = Counts::of(&entries, 16);
        assert_eq!(
            c,
            Counts {
                flows: 2,
                entries: 4,
                capacity: 16,
                ipv6: None,
            }
        );
        assert_eq!(c.plain(), "flows 2 entries 4 capacity 16");
        assert_eq!(c.json(), r#"{"flows":2,"entries":4,"capacity":16}"#);
        let c6 = Counts {
            ipv6: Some(Counts6 {
                flows: 1,
                entries: 3,
                capacity: 8,
            }),
            ..c
        };
        assert_eq!(
            c6.plain(),
            "flows 2 entries 4 capacity 16\nipv6 flows 1 entries 3 capacity 8"
        );
        assert_eq!(
            c6.json(),
            r#"{"flows":2,"entries":4,"capacity":16,"ipv6":{"flows":1,"entries":3,"capacity":8}}"#
        );
    }

    #[test]
    fn table_rows() {
        let entries: Vec<(FlowKey, FlowEntry)> = masq(40000).into();
        let rows = flow_rows(&entries, 12 * SEC, &Timeouts::default());
        let t = rows_table(&rows);
        let mut lines = t.lines();
        assert!(lines.next().unwrap().starts_with("proto state"));
        let l = lines.next().unwrap();
        assert!(
            l.starts_with("tcp   SYN_SENT    lan    192.168.50.2:40000"),
            "{l}"
        );
        assert!(l.contains("203.0.113.1:40000"));
        assert!(l.ends_with("2.0s      2.0s"), "{l}");
        assert_eq!(rows_table(&[]), "no flows\n");
        let expired = flow_rows(&entries, 1000 * SEC, &Timeouts::default());
        assert!(rows_table(&expired).contains(" expired"));
    }
}
