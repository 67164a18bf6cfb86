//! `conntrack list|count|flush`: the flow table in `CONNTRACK`, and the
//! IPv6 flows in `CONNTRACK6` too.

use std::net::{Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result};
use router_common::{
    flow,
    maps::{
        FLAG_OFFLOADED, FLAG_ORIGINAL, FLAG_PORT_FORWARD, FlowCount, FlowEntry, FlowEntry6,
        FlowKey, FlowKey6, FlowState, Timeouts,
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
    /// Packets and IP bytes the data path carried in the original
    /// direction (`orig_*`) and the reply direction (`reply_*`); an
    /// offloaded flow's packets that it leaves to the kernel are not in
    /// them (the kernel's conntrack counts those: [`FlowRow::kernel`]).
    pub orig_packets: u64,
    pub orig_bytes: u64,
    pub reply_packets: u64,
    pub reply_bytes: u64,
    /// Both directions' bytes over the flow's age (`--sort rate`).
    pub mean_bytes_per_sec: f64,
    /// Offloaded flows: the kernel's own accounting of the flow (what the
    /// kernel forwarded itself, e.g. handshake and teardown), when its
    /// conntrack has the flow and accounting is on
    /// (`net.netfilter.nf_conntrack_acct=1`). The kernel cannot take XDP's
    /// counts into its accounting, so the flow's total is the sum of both.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelCounts>,
}

/// Packets and bytes per direction of the kernel's conntrack entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelCounts {
    pub orig_packets: u64,
    pub orig_bytes: u64,
    pub reply_packets: u64,
    pub reply_bytes: u64,
}

/// The original tuple of a row or a kernel entry: protocol, source,
/// destination.
type TupleKey = (String, std::net::SocketAddr, std::net::SocketAddr);

/// Adds the kernel's accounting to the offloaded rows, from `kernel` (a
/// dump of the kernel's conntrack): matched by the original tuple, which
/// the offload daemon keys the XDP entries by.
pub fn add_kernel_counts(rows: &mut [FlowRow], kernel: &[crate::ctnetlink::Conn]) {
    use std::net::SocketAddr;
    let by_tuple: std::collections::HashMap<TupleKey, KernelCounts> = kernel
        .iter()
        .filter_map(|c| {
            let [(op, ob), (rp, rb)] = c.counters?;
            let o = &c.orig;
            Some((
                (
                    proto_name(o.proto),
                    SocketAddr::new(o.src, o.sport),
                    SocketAddr::new(o.dst, o.dport),
                ),
                KernelCounts {
                    orig_packets: op,
                    orig_bytes: ob,
                    reply_packets: rp,
                    reply_bytes: rb,
                },
            ))
        })
        .collect();
    for r in rows.iter_mut().filter(|r| r.offloaded) {
        if let (Ok(src), Ok(dst)) = (r.orig_src.parse(), r.orig_dst.parse()) {
            r.kernel = by_tuple.get(&(r.proto.clone(), src, dst)).copied();
        }
    }
}

impl FlowRow {
    /// Bytes of both directions.
    #[must_use]
    pub const fn bytes(&self) -> u64 {
        self.orig_bytes.saturating_add(self.reply_bytes)
    }
}

/// Both directions' bytes over `age_secs`; a flow younger than a second
/// counts as one second old (no huge rate from a first packet).
#[must_use]
#[expect(
    clippy::cast_precision_loss,
    reason = "a rate: 2^53 bytes is far beyond a flow"
)]
pub fn mean_rate(bytes: u64, age_secs: f64) -> f64 {
    let r = bytes as f64 / age_secs.max(1.0);
    (r * 10.0).round() / 10.0
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

/// What a row reads of a conntrack entry, the same in both families.
#[derive(Clone, Copy)]
struct EntryFields {
    state: u8,
    flags: u8,
    /// Offloaded entries: the end of their lease (see `FlowEntry::lease`).
    lease: u32,
    created_ns: u64,
    last_seen_ns: u64,
    count: FlowCount,
}

/// `EntryFields` of either family's entry: the fields carry the same names.
macro_rules! entry_fields_of {
    ($($entry:ty),*) => {$(
        impl From<&$entry> for EntryFields {
            fn from(e: &$entry) -> Self {
                Self {
                    state: e.state,
                    flags: e.flags,
                    lease: e.lease,
                    created_ns: e.created_ns,
                    last_seen_ns: e.last_seen_ns,
                    count: e.count,
                }
            }
        }
    )*};
}
entry_fields_of!(FlowEntry, FlowEntry6);

/// A row's tuples as printed: original and translated source and
/// destination.
struct Tuples {
    orig_src: String,
    orig_dst: String,
    xlat_src: String,
    xlat_dst: String,
}

/// The row of a flow of `family` and protocol `proto` with `tuples`, from
/// its original-direction entry `orig` and its reply entry, if present.
/// Times are the flow's newest refresh of either entry.
fn row(
    family: &'static str,
    proto: u8,
    tuples: Tuples,
    orig: EntryFields,
    reply: Option<EntryFields>,
    now_ns: u64,
    t: &Timeouts,
) -> FlowRow {
    let last_seen = reply.map_or(orig.last_seen_ns, |r| r.last_seen_ns.max(orig.last_seen_ns));
    let Tuples {
        orig_src,
        orig_dst,
        xlat_src,
        xlat_dst,
    } = tuples;
    FlowRow {
        proto: proto_name(proto),
        state: FlowState::name(orig.state),
        origin: if orig.flags & FLAG_PORT_FORWARD == 0 {
            "lan"
        } else {
            "wan"
        },
        orig_src,
        orig_dst,
        xlat_src,
        xlat_dst,
        age_secs: secs(now_ns.saturating_sub(orig.created_ns)),
        idle_secs: secs(now_ns.saturating_sub(last_seen)),
        // An offloaded flow is the fast path's while its lease lasts (the
        // data path passes its packets to the kernel after it: handed
        // back, or no daemon renewing it).
        expired: if orig.flags & FLAG_OFFLOADED == 0 {
            flow::expired(orig.state, last_seen, now_ns, t)
        } else {
            router_common::maps::lease_tick(now_ns) > orig.lease
        },
        reply_present: reply.is_some(),
        offloaded: orig.flags & FLAG_OFFLOADED != 0,
        family,
        orig_packets: orig.count.packets,
        orig_bytes: orig.count.bytes,
        reply_packets: reply.map_or(0, |r| r.count.packets),
        reply_bytes: reply.map_or(0, |r| r.count.bytes),
        mean_bytes_per_sec: 0.0,
        kernel: None,
    }
    .with_rate()
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
    let tuples = Tuples {
        orig_src: endpoint(key.src_addr, key.src_port),
        orig_dst: endpoint(key.dst_addr, key.dst_port),
        xlat_src: endpoint(orig.new_src_addr, orig.new_src_port),
        xlat_dst: endpoint(orig.new_dst_addr, orig.new_dst_port),
    };
    let reply = reply.map(EntryFields::from);
    row("ipv4", key.proto, tuples, orig.into(), reply, now_ns, t)
}

fn endpoint6(addr: [u8; 16], port: u16) -> String {
    format!("[{}]:{port}", Ipv6Addr::from(addr))
}

/// [`flow_row`] of an IPv6 flow: `reply` is the entry under the reversed
/// key. IPv6 is routed: the translated tuples are the original ones.
#[must_use]
pub fn flow_row6(
    key: &FlowKey6,
    orig: &FlowEntry6,
    reply: Option<&FlowEntry6>,
    now_ns: u64,
    t: &Timeouts,
) -> FlowRow {
    let (src, dst) = (
        endpoint6(key.src_addr, key.src_port),
        endpoint6(key.dst_addr, key.dst_port),
    );
    let tuples = Tuples {
        xlat_src: src.clone(),
        xlat_dst: dst.clone(),
        orig_src: src,
        orig_dst: dst,
    };
    let reply = reply.map(EntryFields::from);
    row("ipv6", key.proto, tuples, orig.into(), reply, now_ns, t)
}

impl FlowRow {
    fn with_rate(mut self) -> Self {
        self.mean_bytes_per_sec = mean_rate(self.bytes(), self.age_secs);
        self
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

/// `conntrack list --sort`: largest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SortBy {
    /// Bytes of both directions.
    Bytes,
    /// Both directions' bytes over the flow's age (its mean rate).
    Rate,
    /// Time since the flow opened (oldest first).
    Age,
}

/// `conntrack list --proto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProtoFilter {
    Tcp,
    Udp,
    /// ICMP echo, and `ICMPv6` echo of IPv6 flows.
    Icmp,
}

/// Which rows `conntrack list` shows, in which order, how many.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Query {
    /// Either endpoint, before or after translation, of either family.
    pub addr: Option<std::net::IpAddr>,
    /// Either port, before or after translation.
    pub port: Option<u16>,
    pub proto: Option<ProtoFilter>,
    pub sort: Option<SortBy>,
    pub limit: Option<usize>,
}

/// The endpoints of a row, original and translated.
fn endpoints(r: &FlowRow) -> impl Iterator<Item = std::net::SocketAddr> + '_ {
    [&r.orig_src, &r.orig_dst, &r.xlat_src, &r.xlat_dst]
        .into_iter()
        .filter_map(|e| e.parse().ok())
}

impl Query {
    #[must_use]
    pub fn matches(&self, r: &FlowRow) -> bool {
        let proto_ok = match self.proto {
            None => true,
            Some(ProtoFilter::Tcp) => r.proto == "tcp",
            Some(ProtoFilter::Udp) => r.proto == "udp",
            Some(ProtoFilter::Icmp) => r.proto == "icmp" || r.proto == "icmpv6",
        };
        proto_ok
            && self.addr.is_none_or(|a| endpoints(r).any(|e| e.ip() == a))
            && self
                .port
                .is_none_or(|p| endpoints(r).any(|e| e.port() == p))
    }

    /// The matching rows, sorted (stable: ties keep the key order) and cut
    /// to the limit.
    #[must_use]
    pub fn apply(&self, rows: Vec<FlowRow>) -> Vec<FlowRow> {
        let mut rows: Vec<FlowRow> = rows.into_iter().filter(|r| self.matches(r)).collect();
        match self.sort {
            None => {}
            Some(SortBy::Bytes) => rows.sort_by_key(|r| std::cmp::Reverse(r.bytes())),
            Some(SortBy::Rate) => {
                rows.sort_by(|a, b| b.mean_bytes_per_sec.total_cmp(&a.mean_bytes_per_sec));
            }
            Some(SortBy::Age) => rows.sort_by(|a, b| b.age_secs.total_cmp(&a.age_secs)),
        }
        if let Some(n) = self.limit {
            rows.truncate(n);
        }
        rows
    }
}

/// The arguments of `conntrack list`.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// One JSON array of the rows.
    #[arg(long)]
    pub json: bool,
    /// Largest first: bytes (both directions), rate (both directions'
    /// bytes over the flow's age: its mean rate since it opened, not a
    /// recent sample; flows younger than 1 s count as 1 s old), age
    /// (oldest first). Without it, by key.
    #[arg(long, value_enum)]
    pub sort: Option<SortBy>,
    /// Only flows with this address at either end, before or after
    /// translation (IPv4 or IPv6).
    #[arg(long, value_name = "IP")]
    pub addr: Option<std::net::IpAddr>,
    /// Only flows with this port at either end, before or after
    /// translation.
    #[arg(long, value_name = "N")]
    pub port: Option<u16>,
    /// Only flows of this protocol (icmp: ICMP and `ICMPv6` echo).
    #[arg(long, value_enum)]
    pub proto: Option<ProtoFilter>,
    /// At most N rows (after filtering and sorting; at least 1).
    #[arg(long, value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub limit: Option<usize>,
}

impl ListArgs {
    #[must_use]
    pub const fn query(&self) -> Query {
        Query {
            addr: self.addr,
            port: self.port,
            proto: self.proto,
            sort: self.sort,
            limit: self.limit,
        }
    }
}

/// A count for the table: exact below 100000, else with a unit suffix.
#[expect(clippy::cast_precision_loss, reason = "display only")]
fn compact(n: u64) -> String {
    if n < 100_000 {
        return n.to_string();
    }
    let mut v = n as f64;
    for unit in ["k", "M", "G", "T"] {
        v /= 1000.0;
        if v < 1000.0 {
            return format!("{v:.1}{unit}");
        }
    }
    format!("{v:.0}T")
}

#[must_use]
pub fn rows_table(rows: &[FlowRow]) -> String {
    use std::fmt::Write as _;
    if rows.is_empty() {
        return "no flows\n".to_owned();
    }
    let mut s = format!(
        "{:<5} {:<11} {:<6} {:<21} {:<21} {:<21} {:<21} {:>10} {:>9} {:>7} {:>7} {:>7} {:>7}\n",
        "proto",
        "state",
        "origin",
        "orig_src",
        "orig_dst",
        "xlat_src",
        "xlat_dst",
        "age",
        "idle",
        "o_pkts",
        "o_bytes",
        "r_pkts",
        "r_bytes"
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
        if let Some(k) = &r.kernel {
            let _ = write!(
                notes,
                " kernel:{}/{}/{}/{}",
                compact(k.orig_packets),
                compact(k.orig_bytes),
                compact(k.reply_packets),
                compact(k.reply_bytes)
            );
        }
        let _ = writeln!(
            s,
            "{:<5} {:<11} {:<6} {:<21} {:<21} {:<21} {:<21} {:>9.1}s {:>8.1}s {:>7} {:>7} {:>7} {:>7}{notes}",
            r.proto,
            r.state,
            r.origin,
            r.orig_src,
            r.orig_dst,
            r.xlat_src,
            r.xlat_dst,
            r.age_secs,
            r.idle_secs,
            compact(r.orig_packets),
            compact(r.orig_bytes),
            compact(r.reply_packets),
            compact(r.reply_bytes)
        );
    }
    s
}

pub fn list(maps: &PinnedMaps, json: bool, query: &Query) -> Result<()> {
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
    if rows.iter().any(|r| r.offloaded) {
        // Offload mode: the kernel's own counts next to XDP's.
        match crate::ctnetlink::CtSocket::requests().and_then(|mut s| s.dump()) {
            Ok(conns) => add_kernel_counts(&mut rows, &conns),
            Err(e) => tracing::warn!("reading the kernel's conntrack for its counters: {e}"),
        }
    }
    let rows = query.apply(rows);
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

/// The flows the data path carries by itself now, whatever the mode says:
/// it forwards every hit of its table, and only a miss looks at the mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OnFastPath {
    /// Flows XDP admitted itself (standalone mode: no [`FLAG_OFFLOADED`]),
    /// not idle past their timeout. In offload mode these are left from
    /// standalone mode, and bypass the firewall until they idle out.
    pub admitted: usize,
    /// Offloaded flows within their lease: carried until it ends, with or
    /// without a daemon renewing it.
    pub leased: usize,
    /// Seconds until the last of those leases ends (0 with none).
    pub lease_left_secs: u64,
}

/// What [`OnFastPath`] reads of a flow: its original entry's flags, state
/// and lease, and its newest refresh of either entry.
#[derive(Clone, Copy)]
struct FlowSeen {
    flags: u8,
    state: u8,
    lease: u32,
    last_seen_ns: u64,
}

impl OnFastPath {
    fn add(&mut self, f: FlowSeen, now_ns: u64, t: &Timeouts) {
        if f.flags & FLAG_OFFLOADED == 0 {
            self.admitted += usize::from(!flow::expired(f.state, f.last_seen_ns, now_ns, t));
        } else if router_common::maps::lease_tick(now_ns) <= f.lease {
            self.leased += 1;
            // Carried while the tick is at most `lease`: up to the start
            // of tick `lease + 1`.
            let end_ns = (u64::from(f.lease) + 1) << router_common::maps::LEASE_TICK_SHIFT;
            self.lease_left_secs = self
                .lease_left_secs
                .max(end_ns.saturating_sub(now_ns).div_ceil(1_000_000_000));
        }
    }

    /// The flows of IPv4 table snapshot `v4` and IPv6 one `v6` at
    /// `now_ns`.
    #[must_use]
    pub fn of(
        v4: &[(FlowKey, FlowEntry)],
        v6: &[(FlowKey6, FlowEntry6)],
        now_ns: u64,
        t: &Timeouts,
    ) -> Self {
        let mut out = Self::default();
        let seen4 = |e: &FlowEntry| FlowSeen {
            flags: e.flags,
            state: e.state,
            lease: e.lease,
            last_seen_ns: e.last_seen_ns,
        };
        let seen6 = |e: &FlowEntry6| FlowSeen {
            flags: e.flags,
            state: e.state,
            lease: e.lease,
            last_seen_ns: e.last_seen_ns,
        };
        out.add_table(v4, |_, e| e.peer, seen4, now_ns, t);
        out.add_table(v6, |k, _| k.reversed(), seen6, now_ns, t);
        out
    }

    /// Adds the flows of one table snapshot: each original entry, with
    /// the newest refresh of it and of its other direction (`peer` names
    /// its key; `seen` reads an entry of the table's type).
    fn add_table<K: Ord + Copy, E>(
        &mut self,
        entries: &[(K, E)],
        peer: impl Fn(&K, &E) -> K,
        seen: impl Fn(&E) -> FlowSeen,
        now_ns: u64,
        t: &Timeouts,
    ) {
        let by_key: std::collections::BTreeMap<K, &E> =
            entries.iter().map(|(k, e)| (*k, e)).collect();
        for (k, e) in &by_key {
            let f = seen(e);
            if f.flags & FLAG_ORIGINAL == 0 {
                continue;
            }
            let reply_seen = by_key.get(&peer(k, e)).map_or(0, |r| seen(r).last_seen_ns);
            let last_seen_ns = f.last_seen_ns.max(reply_seen);
            self.add(FlowSeen { last_seen_ns, ..f }, now_ns, t);
        }
    }

    /// Read from the pinned tables now.
    pub fn read(maps: &PinnedMaps) -> Result<Self> {
        let cfg = maps.read_config()?;
        let table = maps.conntrack()?;
        let v4 = snapshot(&table, maps::capacity(&table)?)?;
        // A router attached by an older router-ctl has no CONNTRACK6 pinned.
        let v6 = match maps.conntrack6() {
            Ok(table6) => snapshot(&table6, maps::capacity(&table6)?)?,
            Err(_) => Vec::new(),
        };
        Ok(Self::of(&v4, &v6, monotonic_ns(), &cfg.timeouts))
    }

    /// In offload mode, what the flows XDP admitted in standalone mode
    /// still do, and how to end them; `None` without any.
    #[must_use]
    pub fn admitted_warning(&self) -> Option<String> {
        (self.admitted > 0).then(|| {
            format!(
                "{} flow(s) that XDP admitted itself in standalone mode stay on the fast path: \
                 their packets bypass the firewall now in charge until they idle out \
                 (`router-ctl conntrack list` shows them, not offloaded); `router-ctl \
                 conntrack flush` ends them now, and the kernel decides on their next packets \
                 (connections that need XDP's translation break, as at a detach; offloaded \
                 flows go back to the kernel until the daemon offloads them again)",
                self.admitted
            )
        })
    }
}

/// Removes every entry of `table`, both entries of a flow one right after
/// the other (`other_half_of`): the data path puts a lost half back from
/// the other one, so a flow whose halves went far apart in the table's
/// order would come back if a packet arrived in between. Entries and flows
/// (entries whose flags `flags_of` has [`FLAG_ORIGINAL`]) removed.
fn flush_table<K: aya::Pod + Ord, V: aya::Pod>(
    table: &mut aya::maps::HashMap<aya::maps::MapData, K, V>,
    flags_of: fn(&V) -> u8,
    other_half_of: fn(&K, &V) -> K,
) -> Result<(usize, usize)> {
    let cap = maps::capacity(table)?;
    let entries = snapshot(table, cap)?;
    let flags: std::collections::BTreeMap<K, u8> =
        entries.iter().map(|(k, e)| (*k, flags_of(e))).collect();
    let mut done = std::collections::BTreeSet::new();
    let (mut removed, mut flows) = (0usize, 0usize);
    for (k, e) in &entries {
        for key in [*k, other_half_of(k, e)] {
            if !done.insert(key) {
                continue;
            }
            match table.remove(&key) {
                Ok(()) => {
                    removed += 1;
                    if flags.get(&key).is_some_and(|f| f & FLAG_ORIGINAL != 0) {
                        flows += 1;
                    }
                }
                // Gone already (expired and replaced, or evicted).
                Err(err) if errno(&err) == Some(libc::ENOENT) => {}
                Err(err) => return Err(err).context("removing a conntrack entry"),
            }
        }
    }
    Ok((removed, flows))
}

/// Removes both entries of every IPv4 flow translated to or from `addr`
/// on the WAN side (masqueraded to it, or a port forward to it): what
/// `router-ctl run` does when the WAN's address changed, as the kernel's
/// masquerade drops its connections of a vanished address
/// (`nf_nat_masquerade`). Their hosts' next packets open new flows, on the
/// new address. Returns the flows removed.
pub fn remove_translated_to(maps: &PinnedMaps, addr: [u8; 4]) -> Result<usize> {
    let mut table = maps.conntrack()?;
    let cap = maps::capacity(&table)?;
    let mut flows = 0;
    for (k, e) in snapshot(&table, cap)? {
        if !on_the_wan_side_of(&k, &e, addr) {
            continue;
        }
        match table.remove(&k) {
            Ok(()) => flows += usize::from(e.flags & FLAG_ORIGINAL != 0),
            Err(err) if errno(&err) == Some(libc::ENOENT) => {}
            Err(err) => return Err(err).context("removing a conntrack entry"),
        }
    }
    Ok(flows)
}

/// Whether the WAN side of the flow of entry `e` (keyed `k`) is `addr`:
/// the entry from the WAN is addressed to it, or the other direction's is.
fn on_the_wan_side_of(k: &FlowKey, e: &FlowEntry, addr: [u8; 4]) -> bool {
    k.dst_addr == addr || e.peer.dst_addr == addr
}

/// The addresses standalone mode's masquerade leaves when it moves to
/// `now` (a daemon's follow, an attach): the data path's old one and the
/// record's (ahead of each other after a follow or replace cut short),
/// each once, never `now` nor 0.0.0.0 (none: no flow has it).
pub fn old_addresses(
    data_path: Ipv4Addr,
    recorded: Ipv4Addr,
    now: Ipv4Addr,
) -> impl Iterator<Item = Ipv4Addr> {
    let recorded = (recorded != data_path).then_some(recorded);
    std::iter::once(data_path)
        .chain(recorded)
        .filter(move |&a| a != now && !a.is_unspecified())
}

/// Whether the kernel's connection `c` was translated to `old`: its reply
/// goes to `old`, and it is neither a connection to `old` (the reply's
/// source is then `old`) nor one of the router's own from `old`
/// (untranslated).
fn translated_to(c: &crate::ctnetlink::Conn, old: Ipv4Addr) -> bool {
    let old = std::net::IpAddr::V4(old);
    c.reply.dst == old && c.orig.dst != old && c.orig.src != old
}

/// Removes the kernel's connections whose reply goes to `old` (what the
/// slow-path table's `snat` translated to it; not the router's own): the
/// kernel's masquerade cleanup on an address change covers `masquerade`
/// rules only, and a LAN host that keeps sending (an ESP or GRE tunnel)
/// would otherwise keep its entry, and its dead translation, alive.
/// Returns how many.
pub fn end_kernel_flows_translated_to(old: Ipv4Addr) -> std::io::Result<usize> {
    let mut ct = crate::ctnetlink::CtSocket::requests()?;
    let mut ended = 0;
    for c in ct.dump()? {
        if !translated_to(&c, old) {
            continue;
        }
        match ct.delete(&c.orig) {
            Ok(()) => ended += 1,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(ended)
}

pub fn flush(maps: &PinnedMaps) -> Result<()> {
    let mut table = maps.conntrack()?;
    let (removed, flows) = flush_table(&mut table, |e: &FlowEntry| e.flags, |_, e| e.peer)?;
    let (v6, removed6) = match maps.conntrack6() {
        Ok(mut table6) => {
            let (removed6, flows6) =
                flush_table(&mut table6, |e: &FlowEntry6| e.flags, |k, _| k.reversed())?;
            (
                format!(", {removed6} IPv6 entries ({flows6} flows)"),
                removed6,
            )
        }
        // Attached by an older router-ctl: no CONNTRACK6 pinned.
        Err(_) => (String::new(), 0),
    };
    // Both families, once both are flushed: a running daemon resyncs
    // offload mode's flows when this moves.
    record_flushed(maps, (removed + removed6) as u64)?;
    let mappings = clear_mappings(maps)?;
    let offload = maps.offload_mode();
    let after = if offload {
        "offload mode: the kernel carries those flows, and a running daemon offloads the ones \
         it still has again at its next tick (to end a flow a new firewall rule refuses, end it \
         in the kernel: conntrack -D)"
    } else {
        "new packets of those flows open new flows or go to the kernel"
    };
    println!("flushed {removed} entries ({flows} flows){v6} and {mappings} NAT mappings; {after}");
    Ok(())
}

/// Ends every NAT mapping (`NAT_MAPPINGS`, with its endpoint and permit
/// indexes): after a flush (no flow is left) or once the WAN address
/// moved (no flow may stay on the old one), a mapping only holds its port.
/// A TCP mapping an established connection extended would hold it for
/// days: no segment of the ended connection opens a flow again, so none
/// lowers it. How many mappings were ended. A router attached by an older
/// router-ctl without these maps has none to end.
pub fn clear_mappings(maps: &PinnedMaps) -> Result<usize> {
    use router_common::maps::{
        Endpoint, Mapping, MappingKey, NAT_ENDPOINTS_MAP, NAT_MAPPINGS_MAP, NAT_PERMITS_MAP,
        PermitKey,
    };
    fn clear<K: aya::Pod + Ord, V: aya::Pod>(maps: &PinnedMaps, name: &str) -> Result<usize> {
        if !maps.dir().join(name).exists() {
            return Ok(0);
        }
        let mut map: aya::maps::HashMap<aya::maps::MapData, K, V> = maps.typed(name)?;
        let keys: std::collections::BTreeSet<K> = map.keys().filter_map(Result::ok).collect();
        let mut ended = 0;
        for k in &keys {
            match map.remove(k) {
                Ok(()) => ended += 1,
                Err(err) if errno(&err) == Some(libc::ENOENT) => {}
                Err(err) => return Err(err).with_context(|| format!("removing from {name}")),
            }
        }
        Ok(ended)
    }
    let ended = clear::<MappingKey, Mapping>(maps, NAT_MAPPINGS_MAP)?;
    clear::<Endpoint, MappingKey>(maps, NAT_ENDPOINTS_MAP)?;
    clear::<PermitKey, Endpoint>(maps, NAT_PERMITS_MAP)?;
    Ok(ended)
}

/// The `ct_entries_flushed` counter: entries `conntrack flush` removed
/// since attach (a flush is what a daemon follows with a resync).
pub fn flushed(maps: &PinnedMaps) -> Result<u64> {
    use router_common::maps::Counter;
    let map = maps.counters()?;
    let Some(idx) = maps::counter_index(&map, Counter::CtEntriesFlushed) else {
        return Ok(0);
    };
    let values = map.get(&idx, 0).context("reading COUNTERS")?;
    Ok(values.iter().map(|v| v.packets).sum())
}

/// Adds `n` to the `ct_entries_flushed` counter (CPU 0's slot: the data
/// path never writes this counter, so there is no lost update), for the
/// eviction estimate of `stats`.
fn record_flushed(maps: &PinnedMaps, n: u64) -> Result<()> {
    use aya::maps::PerCpuValues;
    use router_common::maps::{Counter, CounterValue};
    let mut map = maps.counters()?;
    let Some(idx) = maps::counter_index(&map, Counter::CtEntriesFlushed) else {
        return Ok(());
    };
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

    #[test]
    fn only_connections_translated_to_the_address_are_its_slow_path_ones() {
        use crate::ctnetlink::{Conn, Tuple};
        let ip = |a: [u8; 4]| std::net::IpAddr::V4(a.into());
        let conn = |orig: ([u8; 4], [u8; 4]), reply: ([u8; 4], [u8; 4])| Conn {
            orig: Tuple {
                src: ip(orig.0),
                dst: ip(orig.1),
                ..Tuple::default()
            },
            reply: Tuple {
                src: ip(reply.0),
                dst: ip(reply.1),
                ..Tuple::default()
            },
            ..Conn::default()
        };
        let (old, lan, remote) = ([203, 0, 113, 1], [192, 168, 50, 2], [198, 51, 100, 7]);
        let old_addr = Ipv4Addr::from(old);
        assert!(
            translated_to(&conn((lan, remote), (remote, old)), old_addr),
            "masqueraded"
        );
        assert!(
            !translated_to(&conn((old, remote), (remote, old)), old_addr),
            "the router's own"
        );
        assert!(
            !translated_to(&conn((remote, old), (old, remote)), old_addr),
            "to the router"
        );
        assert!(
            !translated_to(&conn((lan, remote), (remote, [203, 0, 113, 9])), old_addr),
            "to another address"
        );
    }
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
    fn on_the_fast_path_counts_admitted_flows_and_live_leases() {
        use router_common::maps::{LEASE_HANDED_BACK, LEASE_TICK_SHIFT, lease_tick};
        let t = Timeouts::default();
        // 100 s of uptime; TCP entries last seen at 10 s (established: alive).
        let now = 100 * SEC;
        let offloaded = |port: u16, lease: u32| {
            let mut f = masq(port);
            for (_, e) in &mut f {
                e.flags |= FLAG_OFFLOADED;
                e.lease = lease;
            }
            f
        };
        let mut v4: Vec<_> = masq(40_000).into();
        // An XDP-admitted flow idle past its timeout is not counted.
        let mut stale = masq(40_001);
        stale[0].1.last_seen_ns = 0;
        stale[1].1.last_seen_ns = 0;
        stale[0].1.state = FlowState::UdpUnreplied as u8;
        stale[1].1.state = FlowState::UdpUnreplied as u8;
        v4.extend(stale);
        // Leases: ending in the next tick, handed back, past.
        let tick = lease_tick(now);
        v4.extend(offloaded(40_002, tick + 20));
        v4.extend(offloaded(40_003, LEASE_HANDED_BACK));
        v4.extend(offloaded(40_004, tick - 1));
        let k6 = FlowKey6::new(CLIENT6.octets(), SERVER6.octets(), 50_000, 22, IPPROTO_TCP);
        let v6: Vec<_> = established6(k6, 0).into();
        let on = OnFastPath::of(&v4, &v6, now, &t);
        let end = (u64::from(tick) + 21) << LEASE_TICK_SHIFT;
        assert_eq!(
            on,
            OnFastPath {
                admitted: 2,
                leased: 1,
                lease_left_secs: (end - now).div_ceil(SEC),
            }
        );
        assert!(on.admitted_warning().unwrap().starts_with("2 flow(s)"));
        assert_eq!(OnFastPath::default().admitted_warning(), None);
    }

    #[test]
    fn both_entries_of_a_flow_on_an_address_are_on_its_wan_side() {
        let [(ok, oe), (rk, re)] = masq(40000);
        assert!(on_the_wan_side_of(&ok, &oe, WAN) && on_the_wan_side_of(&rk, &re, WAN));
        assert!(!on_the_wan_side_of(&ok, &oe, [203, 0, 113, 9]));
        assert!(!on_the_wan_side_of(&rk, &re, [203, 0, 113, 9]));
    }

    /// A masqueraded flow from client port `port` whose directions
    /// forwarded `out` and `back` bytes (one packet per 1000 bytes), `age`
    /// seconds old at 100 s.
    fn counted(port: u16, proto: u8, out: u64, back: u64, age: u64) -> Vec<(FlowKey, FlowEntry)> {
        // ICMP echo: both ports hold the identifier.
        let dport = if proto == IPPROTO_ICMP { port } else { 443 };
        let k = FlowKey::new(CLIENT, SERVER, port, dport, proto);
        let x = flow::masquerade_key(&k, WAN, port + 1000);
        let (mut oe, rk, mut re) = flow::new_flow(&k, &x, 0, (100 - age) * SEC);
        oe.count = FlowCount {
            packets: out / 1000,
            bytes: out,
        };
        re.count = FlowCount {
            packets: back / 1000,
            bytes: back,
        };
        oe.last_seen_ns = 100 * SEC;
        vec![(k, oe), (rk, re)]
    }

    fn table() -> Vec<FlowRow> {
        let entries: Vec<_> = [
            counted(40_001, IPPROTO_TCP, 1_000, 9_000_000, 90),
            counted(40_002, IPPROTO_UDP, 5_000_000, 1_000, 5),
            counted(40_003, IPPROTO_TCP, 2_000, 2_000, 50),
            counted(40_004, IPPROTO_ICMP, 0, 0, 1),
        ]
        .concat();
        flow_rows(&entries, 100 * SEC, &Timeouts::default())
    }

    fn ports(rows: &[FlowRow]) -> Vec<String> {
        rows.iter().map(|r| r.orig_src.clone()).collect()
    }

    #[test]
    fn rows_carry_both_directions_counts_and_the_mean_rate() {
        let rows = table();
        let r = &rows[0];
        assert_eq!(r.orig_src, "192.168.50.2:40001");
        assert_eq!(
            (r.orig_packets, r.orig_bytes, r.reply_packets, r.reply_bytes),
            (1, 1_000, 9_000, 9_000_000)
        );
        assert_eq!(r.bytes(), 9_001_000);
        assert!(
            (r.mean_bytes_per_sec - 100_011.1).abs() < 0.01,
            "{}",
            r.mean_bytes_per_sec
        );
        // Younger than a second: one second old for the rate.
        assert!((mean_rate(500, 0.2) - 500.0).abs() < f64::EPSILON);
        let v = serde_json::to_value(r).unwrap();
        for f in ["orig_packets", "orig_bytes", "reply_packets", "reply_bytes"] {
            assert!(v[f].is_u64(), "{f} in {v}");
        }
    }

    #[test]
    fn sort_orders_largest_first() {
        let by = |sort| {
            ports(
                &Query {
                    sort: Some(sort),
                    ..Query::default()
                }
                .apply(table()),
            )
        };
        let p = |n: u16| format!("192.168.50.2:{n}");
        assert_eq!(
            by(SortBy::Bytes),
            [p(40_001), p(40_002), p(40_003), p(40_004)]
        );
        // 5 MB over 5 s beats 9 MB over 90 s.
        assert_eq!(
            by(SortBy::Rate),
            [p(40_002), p(40_001), p(40_003), p(40_004)]
        );
        assert_eq!(
            by(SortBy::Age),
            [p(40_001), p(40_003), p(40_002), p(40_004)]
        );
        let top = Query {
            sort: Some(SortBy::Bytes),
            limit: Some(2),
            ..Query::default()
        };
        assert_eq!(ports(&top.apply(table())), [p(40_001), p(40_002)]);
    }

    #[test]
    fn filters_match_either_end_before_or_after_translation() {
        let proto = |p| Query {
            proto: Some(p),
            ..Query::default()
        };
        let port = |p| Query {
            port: Some(p),
            ..Query::default()
        };
        let addr = |a: &str| Query {
            addr: Some(a.parse().unwrap()),
            ..Query::default()
        };
        for (query, flows, why) in [
            (Query::default(), 4, "no filter"),
            (proto(ProtoFilter::Tcp), 2, "tcp"),
            (proto(ProtoFilter::Udp), 1, "udp"),
            (proto(ProtoFilter::Icmp), 1, "icmp"),
            // The client's port and the translated (WAN) port of the same
            // flow.
            (port(40_002), 1, "the client's port"),
            (port(41_002), 1, "the WAN port after translation"),
            (port(443), 3, "the server's port"),
            (port(9), 0, "no flow's port"),
            (addr("192.168.50.2"), 4, "the client's address"),
            (addr("203.0.113.1"), 4, "the WAN address after translation"),
            (addr("192.168.50.3"), 0, "no flow's address"),
            (addr("2001:db8::1"), 0, "an IPv6 address"),
        ] {
            assert_eq!(query.apply(table()).len(), flows, "{why}: {query:?}");
        }
        let both = Query {
            addr: Some("203.0.113.2".parse().unwrap()),
            proto: Some(ProtoFilter::Tcp),
            port: Some(40_003),
            ..Query::default()
        };
        assert_eq!(ports(&both.apply(table())), ["192.168.50.2:40003"]);
    }

    const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x50, 0, 0, 0, 0, 2);
    const SERVER6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x71, 0, 0, 0, 0, 2);

    /// Both entries of an established IPv6 TCP flow under `k` (original)
    /// and its reverse, created and last seen at 10 s, with `flags` (beside
    /// `FLAG_ORIGINAL`) on both.
    fn established6(k: FlowKey6, flags: u8) -> [(FlowKey6, FlowEntry6); 2] {
        let orig = FlowEntry6 {
            created_ns: 10 * SEC,
            last_seen_ns: 10 * SEC,
            state: FlowState::TcpEstablished as u8,
            flags: FLAG_ORIGINAL | flags,
            ..FlowEntry6::default()
        };
        let reply = FlowEntry6 { flags, ..orig };
        [(k, orig), (k.reversed(), reply)]
    }

    #[test]
    fn ipv6_rows_match_ipv6_address_filters() {
        let k = FlowKey6::new(CLIENT6.octets(), SERVER6.octets(), 50_000, 22, IPPROTO_TCP);
        let mut flow = established6(k, 0);
        flow[0].1.count = FlowCount {
            packets: 3,
            bytes: 300,
        };
        flow[1].1.count = FlowCount {
            packets: 2,
            bytes: 200,
        };
        let rows = flow_rows6(&flow, 11 * SEC, &Timeouts::default());
        assert_eq!((rows[0].orig_bytes, rows[0].reply_packets), (300, 2));
        let q = Query {
            addr: Some(SERVER6.into()),
            port: Some(22),
            ..Query::default()
        };
        assert_eq!(q.apply(rows).len(), 1);
    }

    #[test]
    fn offloaded_rows_get_the_kernels_counts_by_original_tuple() {
        use crate::ctnetlink::{Conn, Tuple};
        use std::net::IpAddr;
        let mut rows = table();
        rows[0].offloaded = true;
        rows[1].offloaded = true;
        let tuple = |sport| Tuple {
            src: IpAddr::from(CLIENT),
            dst: IpAddr::from(SERVER),
            proto: IPPROTO_TCP,
            sport,
            dport: 443,
            icmp: None,
        };
        let conn = |sport, counters| Conn {
            orig: tuple(sport),
            counters,
            ..Conn::default()
        };
        let kernel = [
            conn(40_001, Some([(3, 180), (2, 120)])),
            // Not offloaded in XDP: ignored.
            conn(40_003, Some([(9, 9), (9, 9)])),
        ];
        add_kernel_counts(&mut rows, &kernel);
        assert_eq!(
            rows[0].kernel,
            Some(KernelCounts {
                orig_packets: 3,
                orig_bytes: 180,
                reply_packets: 2,
                reply_bytes: 120
            })
        );
        // Offloaded but UDP: no kernel entry with that tuple.
        assert_eq!(rows[1].kernel, None);
        assert_eq!(rows[2].kernel, None, "not offloaded");
        let v = serde_json::to_value(&rows[0]).unwrap();
        assert_eq!(v["kernel"]["reply_bytes"], 120);
        assert!(
            serde_json::to_value(&rows[2])
                .unwrap()
                .get("kernel")
                .is_none()
        );
        assert!(rows_table(&rows[..1]).contains(" kernel:3/180/2/120"));
    }

    #[test]
    fn compact_counts() {
        assert_eq!(compact(99_999), "99999");
        assert_eq!(compact(123_456), "123.5k");
        assert_eq!(compact(9_000_000), "9.0M");
        assert_eq!(compact(2_500_000_000), "2.5G");
    }

    #[test]
    fn ipv6_rows_pair_through_the_reversed_key() {
        use router_common::maps::FLAG_PORT_FORWARD;
        let k = FlowKey6::new(SERVER6.octets(), CLIENT6.octets(), 50000, 22, IPPROTO_TCP);
        let mut flow = established6(k, FLAG_PORT_FORWARD);
        flow[1].1.last_seen_ns = 11 * SEC;
        let rows = flow_rows6(&flow, 12 * SEC, &Timeouts::default());
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
        let alone = flow_rows6(&flow[..1], 12 * SEC, &Timeouts::default());
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
                orig_packets: 0,
                orig_bytes: 0,
                reply_packets: 0,
                reply_bytes: 0,
                mean_bytes_per_sec: 0.0,
                kernel: None,
            }
        );
        assert_eq!(
            serde_json::to_value(&row).unwrap(),
            json!({
                "proto": "tcp", "state": "ESTABLISHED", "origin": "lan",
                "orig_src": "192.168.50.2:40000", "orig_dst": "203.0.113.2:5201",
                "xlat_src": "203.0.113.1:40000", "xlat_dst": "203.0.113.2:5201",
                "age_secs": 1.7, "idle_secs": 0.2, "expired": false, "reply_present": true,
                "offloaded": false, "family": "ipv4",
                "orig_packets": 0, "orig_bytes": 0, "reply_packets": 0, "reply_bytes": 0,
                "mean_bytes_per_sec": 0.0
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
        // An offloaded flow: its lease decides, not the state's timeout.
        let mut offloaded = oe;
        offloaded.flags |= FLAG_OFFLOADED;
        offloaded.lease = router_common::maps::lease_tick(now) + 1;
        let row = flow_row(&k, &offloaded, Some(&re), now, &t);
        assert!(row.offloaded && !row.expired, "within its lease");
        offloaded.lease = router_common::maps::lease_tick(now) - 1;
        assert!(
            flow_row(&k, &offloaded, Some(&fresh), now, &t).expired,
            "lease ended"
        );
        offloaded.lease = router_common::maps::LEASE_HANDED_BACK;
        assert!(
            flow_row(&k, &offloaded, Some(&fresh), now, &t).expired,
            "handed back"
        );
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
        assert!(
            l.ends_with("2.0s      2.0s       0       0       0       0"),
            "{l}"
        );
        assert_eq!(rows_table(&[]), "no flows\n");
        let expired = flow_rows(&entries, 1000 * SEC, &Timeouts::default());
        assert!(rows_table(&expired).contains(" expired"));
    }
}
