//! The in-kernel traffic generator for the packets-per-second workload
//! (`udp-live`): iperf2 cannot send more than a few hundred thousand
//! 64-byte datagrams a second here, far below what either path forwards,
//! so its UDP rows measure the generator. This one is the test kit's
//! [`trafficgen`](tests::trafficgen) (`BPF_PROG_RUN` in live-frame mode,
//! as xdp-trafficgen does it) in the client namespace: real frames that
//! arrive at the router's `lan0` like any other.
//!
//! The sink is the trafficgen's `XDP_DROP` program on the server's `eth0`
//! (it passes ping, for the latency figures), counted by the server's
//! interface. Generator and sink are the same programs on both paths; the
//! sink gets skbs from the kernel path and XDP frames from the XDP path,
//! and its softirq time is part of `ns/pkt` on both.
//!
//! A veth accepts frames sent this way only when its receiving end runs
//! NAPI: under XDP the router's `lan0` does; for the kernel path the run
//! turns GRO on at `lan0` (the state of any real NIC; on both paths, so
//! they stay alike), which enables NAPI. Forwarded UDP is not aggregated by
//! GRO (`rx-udp-gro-forwarding` is off).
//!
//! The same workload runs over IPv6 ([`Family::Ipv6`], for the IPv6 rows
//! in `ipv6`): the generator's frames carry the client's and the server's
//! global addresses, the sink drops IPv6 UDP the same way, ping goes to the
//! server's IPv6 address and the forwarded packets are counted from the
//! IPv6 counters.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use router_common::maps::{FlowKey, IPPROTO_UDP};
use tests::trafficgen::{self, Generator, Hosts, Sink, UdpFlows};
use tests::{HOST_IF, LAN_IF, Ns, SERVER_ADDR, Topology, v6};

use crate::measure::parse::parse_ping;
use crate::measure::sampler::{Sampler, active_window, rx_packets, wait_quiet};
use crate::measure::sys::CpuTicks;
use crate::measure::{Measured, read, unix_now};
use crate::model::{DataPath, Point, RunResult, Settings};
use crate::router::{ethtool_feature, forwarded};
use crate::workloads::{ipv6, start_ping_to};

/// UDP payload of every generated datagram (the iperf2 workload's size).
pub const PAYLOAD: usize = 64;
/// First UDP source port of the generated flows.
const BASE_PORT: u16 = 20_000;
/// The discard port (RFC 863): nothing listens, the sink drops first.
const DST_PORT: u16 = 9;

/// Flows the generator can vary over (source ports up to 65535).
pub fn max_flows() -> u32 {
    UdpFlows::max_flows(BASE_PORT)
}

/// The keys of the first `flows` IPv4 flows the generator sends, as a
/// router without NAT sees them: client -> server, UDP, the source ports
/// from the first, in [`FlowKey`]'s layout.
pub fn flow_keys(flows: u32) -> Vec<FlowKey> {
    (0..flows.min(max_flows()))
        .map(|i| {
            let port = u16::try_from(u32::from(BASE_PORT) + i).expect("within max_flows");
            FlowKey::new(
                tests::CLIENT_ADDR.octets(),
                SERVER_ADDR.octets(),
                port,
                DST_PORT,
                IPPROTO_UDP,
            )
        })
        .collect()
}

/// The IP version the generator sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Ipv4,
    /// Routed, not translated; needs `v6::enable` on the topology.
    Ipv6,
}

/// The generated datagrams: client -> server, `flows` source ports from
/// `base_port`.
fn flows(t: &Topology, family: Family, (base_port, flows): (u16, u16)) -> Result<UdpFlows, String> {
    let v4 = UdpFlows::client_to_server(t, base_port, flows, DST_PORT, tests::pattern(PAYLOAD))?;
    Ok(match family {
        Family::Ipv4 => v4,
        Family::Ipv6 => v4.between(Hosts::CLIENT_TO_SERVER6),
    })
}

/// The source ports of `generators` generators sharing `flows` flows from
/// `base_port`, as `(first port, count)` each: disjoint slices, as RSS
/// keeps each flow on one receive queue (so one CPU writes a flow's
/// entries; generators sending the same flows from two CPUs would make
/// every entry's cache line bounce between them, which no NIC does). With
/// fewer flows than generators every generator sends all of them.
fn flow_slices(base_port: u16, flows: u16, generators: usize) -> Vec<(u16, u16)> {
    let k = u16::try_from(generators.max(1)).unwrap_or(u16::MAX);
    if flows < k {
        return vec![(base_port, flows); generators.max(1)];
    }
    let (each, extra) = (flows / k, flows % k);
    let mut next = base_port;
    (0..k)
        .map(|i| {
            let n = each + u16::from(i < extra);
            let slice = (next, n);
            next = next.saturating_add(n);
            slice
        })
        .collect()
}

/// Packets the router forwarded so far in `family` on `path`.
fn forwarded_in(t: &Topology, family: Family, path: DataPath) -> u64 {
    match family {
        Family::Ipv4 => forwarded(t, path),
        Family::Ipv6 => ipv6::forwarded6(t),
    }
}

/// Interface feature switched for the run and switched back on drop (also
/// when the run fails).
struct Feature<'a> {
    t: &'a Topology,
    ns: Ns,
    dev: &'a str,
    name: &'a str,
    restore: &'a str,
}

impl<'a> Feature<'a> {
    /// Sets `feature` (as `ethtool -K` names it; `long` is its name in
    /// `ethtool -k`) to `on`, remembering what it was.
    fn set(
        t: &'a Topology,
        ns: Ns,
        dev: &'a str,
        (feature, long): (&'a str, &str),
        on: &'a str,
    ) -> Result<Self, String> {
        let state = ethtool_feature(t, ns, dev, long)
            .ok_or_else(|| format!("ethtool -k {dev}: no {long}"))?;
        // What was requested, which is what to restore: `on [requested
        // off]` is veth turning GRO on by itself while XDP is attached.
        let was = state
            .split_once("[requested ")
            .and_then(|(_, r)| r.split(']').next())
            .or_else(|| state.split_whitespace().next())
            .unwrap_or_default();
        let restore = if was == "on" { "on" } else { "off" };
        let o = t.exec(ns, &["ethtool", "-K", dev, feature, on]);
        if !o.status.success() {
            return Err(format!(
                "ethtool -K {dev} {feature} {on}: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(Self {
            t,
            ns,
            dev,
            name: feature,
            restore,
        })
    }
}

impl Drop for Feature<'_> {
    fn drop(&mut self) {
        let o = self.t.exec(
            self.ns,
            &["ethtool", "-K", self.dev, self.name, self.restore],
        );
        if !o.status.success() {
            eprintln!(
                "warning: could not restore {} {} on {}: {}",
                self.name,
                self.restore,
                self.dev,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
    }
}

/// Whether this kernel runs XDP programs in live-frame mode (Linux >=
/// 5.18), on the client's interface (nothing is sent).
pub fn supported(t: &Topology) -> Result<(), String> {
    let frame = flows(t, Family::Ipv4, (BASE_PORT, 1))?.frame();
    let ifindex = t.try_ifindex(Ns::Client, HOST_IF)?;
    t.in_ns(Ns::Client, || trafficgen::probe(&frame, ifindex))
}

/// Generates on each of `cpus` (one thread each, all on one program) for
/// `secs`, or until `stop`; returns (frames sent, seconds of the longest).
fn generate(
    t: &Topology,
    generators: &[(usize, Generator)],
    secs: f64,
    stop: &AtomicBool,
) -> Result<(u64, f64), String> {
    std::thread::scope(|scope| {
        let threads: Vec<_> = generators
            .iter()
            .map(|&(cpu, ref generator)| {
                scope.spawn(move || {
                    t.in_ns(Ns::Client, || {
                        // One CPU per generator: it, and the router's and
                        // the sink's NAPI that its transmits schedule, run
                        // there (a veth transmit picks the peer's queue by
                        // the sending CPU).
                        trafficgen::pin_to_cpu(cpu)
                            .map_err(|e| format!("pinning the generator: {e}"))?;
                        generator.run_for(secs, stop)
                    })
                })
            })
            .collect();
        let mut total = (0, 0.0f64);
        for th in threads {
            let (sent, s) = th
                .join()
                .map_err(|_| "a generator thread panicked".to_owned())??;
            total = (total.0 + sent, total.1.max(s));
        }
        Ok(total)
    })
}

/// Runs the live-frame UDP workload with `point.conns` flows on the
/// router's current path, one generator on the last CPU.
/// `stop` ends the load early (Ctrl-C).
pub fn run(
    t: &Topology,
    s: &Settings,
    path: DataPath,
    point: Point,
    stop: &AtomicBool,
) -> Result<RunResult, String> {
    run_on(t, s, (path, point), &[trafficgen::last_cpu()?], stop)
}

/// [`run`] with one generator on each of `cpus` (ping on the last of
/// them).
pub fn run_on(
    t: &Topology,
    s: &Settings,
    (path, point): (DataPath, Point),
    cpus: &[usize],
    stop: &AtomicBool,
) -> Result<RunResult, String> {
    run_family(t, s, Family::Ipv4, (path, point), cpus, stop)
}

/// [`run_on`] in `family`. The caller has set up the path (for IPv6:
/// kernel forwarding with no netfilter rule, or `attach --admit xdp`).
pub fn run_family(
    t: &Topology,
    s: &Settings,
    family: Family,
    (path, point): (DataPath, Point),
    cpus: &[usize],
    stop: &AtomicBool,
) -> Result<RunResult, String> {
    let n_flows = u16::try_from(point.conns)
        .ok()
        .filter(|&f| u32::from(f) <= max_flows())
        .ok_or_else(|| format!("udp-live: at most {} flows", max_flows()))?;
    let quiet_wait_s = wait_quiet(t, 2000, Duration::from_secs(10));
    let cli_if = t.try_ifindex(Ns::Client, HOST_IF)?;
    // One generator per CPU, each with its own slice of the flows.
    let generators = cpus
        .iter()
        .zip(flow_slices(BASE_PORT, n_flows, cpus.len()))
        .map(|(&cpu, slice)| {
            Generator::load("bench_gen", &flows(t, family, slice)?, cli_if).map(|g| (cpu, g))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let srv_if = t.try_ifindex(Ns::Server, HOST_IF)?;
    let _sink = t.in_ns(Ns::Server, || Sink::attach("bench_sink", srv_if))?;
    let _gro = Feature::set(
        t,
        Ns::Router,
        LAN_IF,
        ("gro", "generic-receive-offload"),
        "on",
    )?;
    // The router resolves the server's MAC before the load (the fast path
    // hands packets without a neighbour entry to the kernel).
    let ping_dst = match family {
        Family::Ipv4 => {
            t.warm_neighbours();
            SERVER_ADDR.into()
        }
        Family::Ipv6 => {
            v6::try_resolve_neighbours(t)?;
            v6::SERVER6.into()
        }
    };

    let ping_out = s.tmp.join(format!(
        "{}-live{}-{}-{}.ping.txt",
        path.name(),
        if family == Family::Ipv6 { "6" } else { "" },
        point.conns,
        cpus.len()
    ));
    let sink0 = rx_packets(t, Ns::Server, &[HOST_IF]);
    let fwd0 = forwarded_in(t, family, path);
    let ticks0 = CpuTicks::now();
    let start = Instant::now();
    let start_unix = unix_now();
    let sampler = Sampler::start(t, start, Duration::from_millis(100));
    // Ping from the generator's CPU too. A veth transmit schedules the
    // receiver's NAPI on the sending CPU, and a NAPI instance stays where
    // it runs while its ring has work: a ping sent from another CPU can
    // capture the router's NAPI there, and every frame then crosses cores
    // (measured: ~40 % more cost per packet and heavy loss, at random).
    let cpu = *cpus.last().ok_or("udp-live: no generator CPU")?;
    let ping = start_ping_to(t, s, (&ping_out, s.secs + 3, Some(cpu)), ping_dst);
    // Let ping start before the load, as in the iperf2 runs.
    std::thread::sleep(Duration::from_millis(300));
    let result = generate(t, &generators, f64::from(s.secs), stop);
    // Frames still in flight drain within milliseconds.
    std::thread::sleep(Duration::from_millis(200));
    let wall_s = start.elapsed().as_secs_f64();
    let run_cpu = ticks0.until(CpuTicks::now());
    let readings = sampler.finish();
    let _ = ping.finish();
    let (sent, gen_s) = result?;
    let received = rx_packets(t, Ns::Server, &[HOST_IF]).saturating_sub(sink0);
    let router_pkts = forwarded_in(t, family, path).saturating_sub(fwd0);

    let Some(window) = active_window(&readings) else {
        return Err(format!(
            "udp-live on the {} path: the router saw no traffic (generated {sent} frames)",
            path.name()
        ));
    };
    let pings = parse_ping(&read(&ping_out)).within(start_unix, &window);
    let no_ping = pings.as_ref().is_none_or(|p| p.rtts.is_empty());
    let mut r = RunResult::new(
        path,
        point,
        Measured {
            window,
            pings,
            run_cpu,
            router_pkts,
            wall_s,
            quiet_wait_s,
        },
    );
    if no_ping {
        r.notes
            .push("no ping answered inside the window".to_owned());
    }
    r.pps = window.sink_pkts as f64 / window.secs.max(1e-9);
    r.gbps = r.pps * PAYLOAD as f64 * 8.0 / 1e9;
    r.sent_pps = sent as f64 / gen_s.max(1e-9);
    r.lost = sent.saturating_sub(received);
    r.loss_pct = if sent > 0 {
        r.lost as f64 * 100.0 / sent as f64
    } else {
        f64::NAN
    };
    r.stream_s = gen_s;
    r.streams = u32::from(n_flows);
    Ok(r)
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn generators_get_disjoint_slices_of_the_flows() {
        assert_eq!(flow_slices(20_000, 1000, 1), [(20_000, 1000)]);
        assert_eq!(flow_slices(20_000, 1000, 2), [(20_000, 500), (20_500, 500)]);
        assert_eq!(
            flow_slices(20_000, 1001, 3),
            [(20_000, 334), (20_334, 334), (20_668, 333)]
        );
        // Every flow once, none twice.
        let slices = flow_slices(20_000, 45_536, 4);
        assert_eq!(slices.iter().map(|s| u32::from(s.1)).sum::<u32>(), 45_536);
        assert!(slices.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
        // Fewer flows than generators: each sends them all.
        assert_eq!(flow_slices(20_000, 1, 2), [(20_000, 1), (20_000, 1)]);
    }
}
