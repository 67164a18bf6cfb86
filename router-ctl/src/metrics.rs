//! `metrics`: a Prometheus text exposition of the router's counters, read
//! from the pinned maps on every scrape (prometheus-client encodes, the
//! status page's HTTP handling in [`web`] serves). Binds to loopback by default, where it answers only requests
//! for an address or `localhost`, as the status page does
//! ([`web::host_allowed`]).

use std::net::SocketAddr;

use anyhow::{Context as _, Result, anyhow};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use router_common::maps::{Counter, CounterValue};
use tracing::warn;

use crate::{ctx::Ctx, daemon, forward, inspect, state, stats, vmac, web};

/// Logs a router attached by another build once (until it is gone), not at
/// every scrape.
fn note_mismatch(m: Option<&crate::lifecycle::loader::Mismatch>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static SAID: AtomicBool = AtomicBool::new(false);
    match m {
        Some(m) if !SAID.swap(true, Ordering::Relaxed) => {
            warn!("metrics: {}", inspect::other_build_message(m));
        }
        Some(_) => {}
        None => SAID.store(false, Ordering::Relaxed),
    }
}

/// The label set of one counter: which metric family and its labels.
#[must_use]
pub fn family(c: Counter) -> (&'static str, &'static str, &'static str) {
    let n = c.name();
    // IPv6-only verdicts (`fwd6_`, `pass6_`, `drop6_`) land in the same
    // families; [`ip_family`] labels every verdict with its family.
    let tail = |prefix: &str| {
        n.strip_prefix(prefix)
            .and_then(|r| r.strip_prefix('_').or_else(|| r.strip_prefix("6_")))
    };
    if let Some(d) = tail("fwd") {
        ("forwarded", "direction", d)
    } else if let Some(r) = tail("pass") {
        ("passed", "reason", r)
    } else if let Some(r) = tail("drop") {
        ("dropped", "reason", r)
    } else {
        ("events", "event", n)
    }
}

/// The IP family a verdict counter counts, its `family` label: `ipv4` or
/// `ipv6` for the counters only one family's path increments, `both` for
/// those the two share (the IPv6 path counts into them too, or the frame's
/// family is not known yet: `pass_not_ipv4` counts frames that are neither
/// IPv4 nor IPv6, such as ARP). `None` for events, which carry no family
/// label. Every counter is named here, so a new one needs a decision.
#[must_use]
pub fn ip_family(c: Counter) -> Option<&'static str> {
    use Counter as C;
    match c {
        // The IPv4 path only (IPv6 has its own `fwd6_`/`drop6_`, no header
        // checksum or options, no SNAT; its "too big" is
        // `pass6_packet_too_big`).
        C::FwdOutbound
        | C::FwdInbound
        | C::FwdFragment
        | C::FwdIpOptions
        | C::DropTtlExceededAnswered
        | C::DropTtlExceeded
        | C::DropSpoofedSource
        | C::PassIpOptions
        | C::PassFragment
        | C::PassTtlExceeded
        | C::PassPortsExhausted
        | C::PassMtu
        | C::PassMtuTranslated
        | C::DropFragNeededAnswered
        | C::DropFragNeeded
        | C::PassKernelFlow
        | C::PassNoWanAddr
        | C::DropIpChecksum
        | C::DropUnsolicited => Some("ipv4"),
        // Counted on both paths (shared parsing, next-hop, redirect and
        // flow code).
        C::PassNotIpv4
        | C::PassProtocol
        | C::PassNoFlow
        | C::PassUnsolicited
        | C::PassNotOffloaded
        | C::PassOffloadTcpControl
        | C::PassLeaseExpired
        | C::PassOffloadHandedBack
        | C::PassOffloadPending
        | C::PassFibNotForwarded
        | C::PassFibForwardingDisabled
        | C::PassNoNeighbour
        | C::PassEgressNotAttached
        | C::PassNotConfigured
        | C::PassNotForUs
        | C::PassReplyTupleTaken
        | C::DropTruncated
        | C::DropMalformed => Some("both"),
        C::Fwd6Outbound
        | C::Fwd6Inbound
        | C::Pass6LinkScope
        | C::Pass6Ndp
        | C::Pass6Mld
        | C::Pass6ExtHopByHop
        | C::Pass6ExtRouting
        | C::Pass6ExtFragment
        | C::Pass6ExtDestOpts
        | C::Pass6ExtEsp
        | C::Pass6ExtAh
        | C::Pass6ExtOther
        | C::Pass6HopLimit
        | C::Pass6PacketTooBig
        | C::Drop6Unsolicited
        | C::Drop6SpoofedSource
        | C::Pass6TableFull => Some("ipv6"),
        C::FlowNewMasquerade
        | C::FlowNewPortForward
        | C::PortCollision
        | C::FlowExpiredReplaced
        | C::EvictionDetected
        | C::IcmpErrorTranslated
        | C::CtEntriesInserted
        | C::CtEntriesRemoved
        | C::CtEntriesFlushed
        | C::TcpOutOfWindow
        | C::Flow6NewOutbound
        | C::Flow6NewPinhole
        | C::Icmp6ErrorForwarded
        | C::Eviction6Detected
        | C::Ct6EntriesInserted
        | C::FlowNewInboundMapping
        | C::FlowNewHairpin
        | C::MappingReclaimed
        | C::TcpMssClamped => None,
    }
}

/// The verdict counters (forwarded, passed, dropped: packets and bytes,
/// with their `direction`/`reason` and `family` labels) and the events.
fn encode_verdicts(
    enc: &mut DescriptorEncoder,
    cs: &[(Counter, CounterValue)],
) -> Result<(), std::fmt::Error> {
    let verdicts = |fam: &'static str| {
        cs.iter()
            .filter(move |(c, _)| family(*c).0 == fam)
            .map(|&(c, v): &(Counter, CounterValue)| {
                let (_, k, l) = family(c);
                let mut labels = vec![(k, l.to_owned())];
                if let Some(f) = ip_family(c) {
                    labels.push(("family", f.to_owned()));
                }
                (labels, v)
            })
            .collect::<Vec<_>>()
    };
    for (fam, what) in [
        ("forwarded", "translated and redirected by the fast path"),
        ("passed", "passed to the kernel"),
        (
            "dropped",
            "dropped (malformed, unsolicited, spoofed, TTL exceeded)",
        ),
    ] {
        let rows = verdicts(fam);
        counters(
            enc,
            &format!("xdp_router_{fam}_packets"),
            &format!("Packets {what}"),
            rows.iter().map(|(l, v)| (l.clone(), v.packets)),
        )?;
        counters(
            enc,
            &format!("xdp_router_{fam}_bytes"),
            &format!("Bytes {what}"),
            rows.iter().map(|(l, v)| (l.clone(), v.bytes)),
        )?;
    }
    let events = verdicts("events");
    counters(
        enc,
        "xdp_router_events",
        "Data path events (new flows, port collisions, evictions, ICMP errors translated)",
        events.iter().map(|(l, v)| (l.clone(), v.packets)),
    )
}

#[derive(Debug)]
struct RouterCollector {
    ctx: Ctx,
}

type Labels = Vec<(&'static str, String)>;

/// One metric family of `kind`: its descriptor and a sample per label set
/// (an empty label set is written without braces, so an unlabelled sample
/// reads `name value`).
fn samples<M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    rows: impl IntoIterator<Item = (Labels, M)>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, v) in rows {
        v.encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A counter with a sample per label set; none at all if there are no
/// rows.
fn counters<'a>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: impl Iterator<Item = (Labels, u64)> + 'a,
) -> Result<(), std::fmt::Error> {
    let rows: Vec<_> = rows.map(|(l, v)| (l, ConstCounter::new(v))).collect();
    if rows.is_empty() {
        return Ok(());
    }
    samples(enc, name, help, MetricType::Counter, rows)
}

/// One gauge with a sample per label set.
fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: Vec<(Labels, i64)>,
) -> Result<(), std::fmt::Error> {
    let rows = rows.into_iter().map(|(l, v)| (l, ConstGauge::new(v)));
    samples(enc, name, help, MetricType::Gauge, rows)
}

/// One unlabelled gauge.
fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: i64,
) -> Result<(), std::fmt::Error> {
    gauges(enc, name, help, vec![(Labels::new(), v)])
}

/// One unlabelled counter.
fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    counters(enc, name, help, std::iter::once((Labels::new(), v)))
}

fn i64_of(v: impl TryInto<i64>) -> i64 {
    v.try_into().unwrap_or(i64::MAX)
}

impl RouterCollector {
    /// The mode, and the offload daemon's health and events.
    fn encode_daemon(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let kernel_mode = self.ctx.maps().offload_mode();
        gauge(
            enc,
            "xdp_router_admit_kernel",
            "1 in offload mode (the kernel admits flows), 0 in standalone mode",
            i64::from(kernel_mode),
        )?;
        let d = daemon::health_json(self.ctx.ns());
        gauge(
            enc,
            "xdp_router_daemon_up",
            "1 if `router-ctl run` runs and its heartbeat is current",
            i64::from(d["running"] == true),
        )?;
        if d["running"] != true {
            // Offloaded flows outlive the daemon until their leases end.
            if kernel_mode && let Ok(on) = crate::conntrack::OnFastPath::read(&self.ctx.maps()) {
                gauge(
                    enc,
                    "xdp_router_offloaded_flows",
                    "Kernel flows the fast path carries now",
                    i64_of(on.leased),
                )?;
            }
            return Ok(());
        }
        encode_daemon_follow(enc, &d)?;
        encode_offload(enc, &d)
    }
}

/// The running offload daemon's flows and events, from its health JSON
/// ([`daemon::health_json`]).
fn encode_offload(
    enc: &mut DescriptorEncoder,
    d: &serde_json::Value,
) -> Result<(), std::fmt::Error> {
    gauge(
        enc,
        "xdp_router_offloaded_flows",
        "Kernel flows the fast path carries now",
        i64_of(d["offloaded_flows"].as_u64().unwrap_or(0)),
    )?;
    gauge(
        enc,
        "xdp_router_settling_flows",
        "TCP connections waiting to settle before their offload (under a burst of new ones)",
        i64_of(d["settling_flows"].as_u64().unwrap_or(0)),
    )?;
    // Every count the offloader keeps, by its name in the daemon's status
    // (a count added there is exported without a list to keep in step).
    let events: Vec<String> = serde_json::to_value(crate::offload::OffloadStats::default())
        .ok()
        .and_then(|v| {
            v.as_object().map(|o| {
                o.iter()
                    .filter(|(_, v)| v.is_u64())
                    .map(|(k, _)| k.clone())
                    .collect()
            })
        })
        .unwrap_or_default();
    counters(
        enc,
        "xdp_router_offload_events",
        "Offload daemon events (flows offloaded, ended, handed back; refreshes, resyncs)",
        events.iter().map(|e| {
            (
                vec![("event", e.clone())],
                d["offload"][e.as_str()].as_u64().unwrap_or(0),
            )
        }),
    )?;
    let not_offloaded = d["offload"]["not_offloaded"].as_object();
    // Described before the first reason occurs (a family without samples),
    // so a dashboard or alert on it finds the metric from the start.
    samples(
        enc,
        "xdp_router_offload_not_offloaded",
        "Kernel connections the offload daemon left to the kernel, by reason",
        MetricType::Counter,
        not_offloaded.into_iter().flatten().map(|(reason, n)| {
            (
                vec![("reason", reason.clone())],
                ConstCounter::new(n.as_u64().unwrap_or(0)),
            )
        }),
    )
}

/// What the daemon did to keep up with the machine: interfaces and
/// attaches followed, leftovers removed, log records skipped.
fn encode_daemon_follow(
    enc: &mut DescriptorEncoder,
    d: &serde_json::Value,
) -> Result<(), std::fmt::Error> {
    let n = |k: &str| d[k].as_u64().unwrap_or(0);
    counter(
        enc,
        "xdp_router_daemon_mac_changes",
        "New MAC addresses of the attached interfaces the daemon wrote into the data path",
        n("mac_changes_followed"),
    )?;
    counter(
        enc,
        "xdp_router_daemon_wan_addr_changes",
        "Changes of the WAN's IPv4 address (--wan-addr auto, its loss included) the daemon \
         followed",
        n("wan_addr_changes_followed"),
    )?;
    counter(
        enc,
        "xdp_router_daemon_standalone_repairs",
        "Times the daemon put standalone mode's kernel side (slow-path NAT table, LAN \
             sysctls) back after something removed it",
        n("standalone_repairs"),
    )?;
    gauge(
        enc,
        "xdp_router_daemon_interfaces_gone",
        "Attached interfaces deleted while the daemon ran (their XDP program went with \
             them); 0 again after a new attach",
        i64_of(d["interfaces_gone"].as_array().map_or(0, Vec::len)),
    )?;
    counter(
        enc,
        "xdp_router_daemon_neighbours_revalidated",
        "STALE neighbour entries of next hops only the fast path uses that the daemon had \
             the kernel re-validate",
        n("neighbours_revalidated"),
    )?;
    counter(
        enc,
        "xdp_router_daemon_stale_pending_removed",
        "XDP entries left pending by an earlier daemon, removed",
        n("stale_pending_removed"),
    )?;
    counter(
        enc,
        "xdp_router_daemon_reattach",
        "New attaches the daemon followed (re-opened on their maps)",
        n("reattaches_followed"),
    )?;
    counter(
        enc,
        "xdp_router_daemon_interfaces_relinked",
        "Attached interfaces deleted and made anew that the daemon gave a new XDP link",
        n("interfaces_relinked"),
    )?;
    gauge(
        enc,
        "xdp_router_daemon_detached",
        "1 while the router is detached and the daemon waits for an attach",
        i64::from(d["detached"] == true),
    )?;
    counter(
        enc,
        "xdp_router_daemon_log_records_malformed",
        "Data path log records this router-ctl could not parse, skipped",
        n("log_records_malformed"),
    )
}

impl Collector for RouterCollector {
    #[expect(
        clippy::too_many_lines,
        reason = "one linear sequence of checks or steps, in order"
    )]
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let maps = self.ctx.maps();
        let running = inspect::inspect(&self.ctx.pin_dir);
        gauge(
            &mut enc,
            "xdp_router_up",
            "1 if the router's XDP program is attached (its links and maps pinned)",
            i64::from(running.complete()),
        )?;
        gauge(
            &mut enc,
            "xdp_router_layout_mismatch",
            "1 if the router was attached by another build of router-ctl (a pinned map's \
             layout differs) and no counter is read: use that build's router-ctl, or \
             `router-ctl detach` and attach again with this one",
            i64::from(running.layout_mismatch.is_some()),
        )?;
        note_mismatch(running.layout_mismatch.as_ref());
        let read = match running.layout_mismatch {
            Some(_) => None,
            None => match stats::read_counters(&maps) {
                Ok(cs) => Some(cs),
                Err(_) => return Ok(()),
            },
        };
        if let Ok(Some(r)) = state::load(self.ctx.ns()) {
            let labels: Labels = vec![
                ("version", r.object.version()),
                ("lan", r.config.lan.clone()),
                ("wan", r.config.wan.clone()),
                ("lan_mode", r.lan_mode.clone()),
                ("wan_mode", r.wan_mode.clone()),
            ];
            gauges(
                &mut enc,
                "xdp_router_info",
                "The attached router: object version, interfaces and modes",
                vec![(labels, 1)],
            )?;
            gauge(
                &mut enc,
                "xdp_router_attached_timestamp_seconds",
                "Unix time of the attach",
                i64_of(r.attached_at),
            )?;
        }
        self.encode_daemon(&mut enc)?;
        let Some(cs) = read else {
            return Ok(());
        };
        encode_verdicts(&mut enc, &cs)?;
        let get = |c: Counter| {
            cs.iter()
                .find(|(x, _)| *x == c)
                .map_or(0, |(_, v)| v.packets)
        };
        counters(
            &mut enc,
            "xdp_router_port_allocation_failures",
            "New outbound flows that found every probed SNAT port taken (passed to the kernel)",
            std::iter::once((Vec::new(), get(Counter::PassPortsExhausted))),
        )?;
        counters(
            &mut enc,
            "xdp_router_port_collisions",
            "SNAT port probes that found the port taken",
            std::iter::once((Vec::new(), get(Counter::PortCollision))),
        )?;
        if let Some(t) = crate::table_fill::table_use_cached(&maps, &cs) {
            // IPv4's `CONNTRACK` with `family="ipv4"`, IPv6's `CONNTRACK6`
            // with `family="ipv6"`, as the verdict counters are labelled.
            let fam = |f: &str, v: i64| (vec![("family", f.to_owned())], v);
            let v6 = |v: i64| fam("ipv6", v);
            let mut entries = vec![fam("ipv4", i64_of(t.entries))];
            let mut capacity = vec![fam("ipv4", i64::from(t.capacity))];
            if let Some(t6) = t.ipv6 {
                entries.push(v6(i64_of(t6.entries)));
                capacity.push(v6(i64::from(t6.capacity)));
            }
            gauges(
                &mut enc,
                "xdp_router_conntrack_entries",
                "Conntrack entries in use (two per flow)",
                entries,
            )?;
            gauges(
                &mut enc,
                "xdp_router_conntrack_capacity",
                "Conntrack capacity in entries",
                capacity,
            )?;
            gauges(
                &mut enc,
                "xdp_router_conntrack_evicted_estimate",
                "Conntrack entries evicted by the LRU (estimate: inserted - removed - flushed - \
                 present; IPv4's table)",
                vec![fam("ipv4", i64_of(t.evicted_estimate))],
            )?;
        }
        if let Ok(r) = forward::rules(&maps) {
            gauge(
                &mut enc,
                "xdp_router_port_forward_rules",
                "Port-forward rules installed",
                i64_of(r.len()),
            )?;
        }
        if let Ok(v) = vmac::pinned(&maps) {
            gauge(
                &mut enc,
                "xdp_router_virtual_macs",
                "VRRP virtual MACs (keepalived use_vmac) the fast path forwards frames to: \
                 this router is their master",
                i64_of(v.len()),
            )?;
        }
        Ok(())
    }
}

/// The exposition text for the router of `ctx`.
pub fn render(ctx: &Ctx) -> Result<String> {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(RouterCollector { ctx: ctx.clone() }));
    let mut s = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut s, &reg)
        .map_err(|e| anyhow!("encoding metrics: {e}"))?;
    Ok(s)
}

/// What `metrics` says at its start when it finds no router attached
/// where it looks (`ns`: the namespace `-n` named): a typo'd name would
/// otherwise serve `xdp_router_up 0` without a word.
fn nothing_attached(ns: Option<&str>) -> String {
    let (what, flag) = match ns {
        Some(ns) if !crate::ctx::netns_path(ns).exists() => (
            format!(
                "no network namespace {ns:?} (see `ip netns list`) and no router attached for it"
            ),
            format!(" -n {ns}"),
        ),
        Some(ns) => (
            format!("no router attached in namespace {ns:?}"),
            format!(" -n {ns}"),
        ),
        None => (
            "no router attached in this namespace (pass -n NETNS for a router in one)".to_owned(),
            String::new(),
        ),
    };
    format!(
        "{what}: xdp_router_up stays 0 until one is (`router-ctl{flag} attach LAN WAN`); the \
         metrics follow it from then on"
    )
}

/// Serves `/metrics` on `listen` until killed, with the status page's
/// HTTP handling ([`web::handle`]: one request per connection, 5 s to send
/// the request head and to take the answer, at most
/// [`web::MAX_CONNECTIONS`] at once, the `Host` rule), so a client that
/// never reads its answers holds no other scrape back.
pub fn serve(ctx: &Ctx, listen: SocketAddr) -> Result<()> {
    if !listen.ip().is_loopback() {
        warn!(
            "metrics listen on {listen}, not loopback: anyone who reaches it sees the \
             router's traffic counters"
        );
    }
    let listener = std::net::TcpListener::bind(listen)
        .map_err(|e| anyhow!("listening on {listen}: {e} (is another exporter on that port?)"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    println!("serving metrics on http://{bound}/metrics");
    let _ = std::io::Write::flush(&mut std::io::stdout());
    if !inspect::inspect(&ctx.pin_dir).complete() {
        warn!("{}", nothing_attached(ctx.ns()));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the metrics server's runtime")?;
    let shared = std::sync::Arc::new(web::Shared::metrics_only());
    rt.block_on(async {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        loop {
            if let Some((sock, peer)) = web::accept(Some(&listener)).await {
                web::serve_connection(sock, peer, ctx, &shared);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_namespace_is_named_at_the_start() {
        let s = nothing_attached(Some("router-ctl-unit-test-none"));
        assert!(
            s.starts_with(
                "no network namespace \"router-ctl-unit-test-none\" (see `ip netns list`)"
            ),
            "{s}"
        );
        assert!(
            s.contains("`router-ctl -n router-ctl-unit-test-none attach LAN WAN`"),
            "{s}"
        );
        assert!(nothing_attached(None).contains("pass -n NETNS"));
    }

    #[test]
    fn every_counter_lands_in_a_family_with_a_label() {
        for &c in Counter::ALL {
            let (fam, key, val) = family(c);
            assert!(
                ["forwarded", "passed", "dropped", "events"].contains(&fam),
                "{}",
                c.name()
            );
            assert!(!key.is_empty() && !val.is_empty());
        }
        assert_eq!(
            family(Counter::FwdOutbound),
            ("forwarded", "direction", "outbound")
        );
        assert_eq!(family(Counter::PassNoFlow), ("passed", "reason", "no_flow"));
        assert_eq!(
            family(Counter::DropMalformed),
            ("dropped", "reason", "malformed")
        );
        assert_eq!(
            family(Counter::FlowNewMasquerade),
            ("events", "event", "flow_new_masquerade")
        );
        assert_eq!(
            family(Counter::Fwd6Inbound),
            ("forwarded", "direction", "inbound")
        );
        assert_eq!(
            family(Counter::Pass6ExtFragment),
            ("passed", "reason", "ext_fragment")
        );
        assert_eq!(ip_family(Counter::Drop6Unsolicited), Some("ipv6"));
        assert_eq!(ip_family(Counter::FwdOutbound), Some("ipv4"));
        assert_eq!(ip_family(Counter::PassNoNeighbour), Some("both"));
        for &c in Counter::ALL {
            // The name says IPv6 only (`fwd6_`...) exactly when the label does;
            // verdicts carry a family, events none.
            let v6_name = ["fwd6_", "pass6_", "drop6_"]
                .iter()
                .any(|p| c.name().starts_with(p));
            assert_eq!(ip_family(c) == Some("ipv6"), v6_name, "{}", c.name());
            assert_eq!(ip_family(c).is_none(), c.is_event(), "{}", c.name());
        }
        // A label set appears once per metric family.
        let mut seen = std::collections::BTreeSet::new();
        for &c in Counter::ALL {
            let (fam, key, val) = family(c);
            assert!(seen.insert((fam, key, val, ip_family(c))), "{}", c.name());
        }
    }

    /// Every verdict sample rendered (forwarded, passed, dropped) carries a
    /// `family` label, so that no unlabelled series means IPv4 in one
    /// metric and both families in another.
    #[test]
    fn every_rendered_verdict_sample_has_a_family() {
        #[derive(Debug)]
        struct Verdicts;
        impl Collector for Verdicts {
            fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
                let cs: Vec<_> = Counter::ALL
                    .iter()
                    .map(|&c| {
                        (
                            c,
                            CounterValue {
                                packets: 1,
                                bytes: 1,
                            },
                        )
                    })
                    .collect();
                encode_verdicts(&mut enc, &cs)
            }
        }
        let mut reg = Registry::default();
        reg.register_collector(Box::new(Verdicts));
        let mut s = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut s, &reg).unwrap();
        let samples: Vec<&str> = s
            .lines()
            .filter(|l| {
                ["forwarded", "passed", "dropped"]
                    .iter()
                    .any(|f| l.starts_with(&format!("xdp_router_{f}_")))
            })
            .collect();
        // Packets and bytes of every verdict counter.
        let verdicts = Counter::ALL.iter().filter(|c| !c.is_event()).count();
        assert_eq!(samples.len(), 2 * verdicts, "{s}");
        for l in samples {
            assert!(
                ["ipv4", "ipv6", "both"]
                    .iter()
                    .any(|f| l.contains(&format!("family=\"{f}\""))),
                "{l}"
            );
        }
        assert!(
            s.lines().any(|l| l
                == "xdp_router_forwarded_packets_total{direction=\"outbound\",family=\"ipv4\"} 1"),
            "{s}"
        );
    }

    /// The offload daemon's part of the metrics for its health JSON `d`.
    fn offload_metrics(d: serde_json::Value) -> String {
        #[derive(Debug)]
        struct Offload(serde_json::Value);
        impl Collector for Offload {
            fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
                encode_offload(&mut enc, &self.0)
            }
        }
        let mut reg = Registry::default();
        reg.register_collector(Box::new(Offload(d)));
        let mut s = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut s, &reg).unwrap();
        s
    }

    #[test]
    fn the_offload_daemons_flows_and_reasons_not_to_offload_are_metrics() {
        let s = offload_metrics(serde_json::json!({
            "running": true,
            "offloaded_flows": 3,
            "settling_flows": 7,
            "offload": {
                "offloaded": 10,
                "not_offloaded": {"tcp_closed_while_settling": 5, "not_lan_wan": 2},
            },
        }));
        for line in [
            "xdp_router_offloaded_flows 3",
            "xdp_router_settling_flows 7",
            "xdp_router_offload_events_total{event=\"offloaded\"} 10",
            "xdp_router_offload_events_total{event=\"closed_while_refreshed\"} 0",
            "xdp_router_offload_not_offloaded_total{reason=\"tcp_closed_while_settling\"} 5",
            "xdp_router_offload_not_offloaded_total{reason=\"not_lan_wan\"} 2",
        ] {
            assert!(s.lines().any(|l| l == line), "{line} missing in:\n{s}");
        }
        // Counts only: the reasons are a series of their own.
        assert!(!s.contains("event=\"not_offloaded\""), "{s}");
        // Described before the first reason occurs.
        let s = offload_metrics(serde_json::json!({
            "running": true,
            "offload": {"offloaded": 0, "not_offloaded": {}},
        }));
        assert!(
            s.contains("# TYPE xdp_router_offload_not_offloaded_total counter"),
            "{s}"
        );
    }

    #[test]
    fn not_attached_renders_up_zero() {
        let ctx = Ctx {
            netns: Some("router-ctl-unit-test-none".into()),
            pin_dir: "/nonexistent/xdp-router/none".into(),
        };
        let s = render(&ctx).unwrap();
        assert!(s.contains("# TYPE xdp_router_up gauge"), "{s}");
        assert!(s.contains("xdp_router_up 0"), "{s}");
    }
}
