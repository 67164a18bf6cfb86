//! The in-kernel traffic generator for the packets-per-second workload:
//! iperf2 cannot send more than a few hundred thousand 64-byte datagrams a
//! second here, far below what either path forwards, so its UDP rows
//! measure the generator. This one is `BPF_PROG_RUN` in live-frame mode
//! (as xdp-trafficgen does it): in the client namespace, a tiny XDP
//! program (`rawbpf::udp_generator`) runs on page-pool frames and returns
//! `XDP_TX`, which the kernel turns into a transmit on the client's veth:
//! real frames that arrive at the router's `lan0` like any other.
//!
//! The sink is another tiny XDP program on the server's `eth0` that drops
//! UDP (ping still gets through, for the latency figures), counted by the
//! server's interface. Generator and sink are the same programs on both
//! paths; the sink gets skbs from the kernel path and XDP frames from the
//! XDP path, and its softirq time is part of `ns/pkt` on both.
//!
//! A veth accepts frames sent this way only when its receiving end runs
//! NAPI: under XDP the router's `lan0` does; for the kernel path the run
//! turns GRO on at `lan0` (the state of any real NIC; on both paths, so
//! they stay alike), which enables NAPI. Forwarded UDP is not aggregated by
//! GRO (`rx-udp-gro-forwarding` is off).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tests::frames::{Frame, Ipv4, Udp};
use tests::{CLIENT_ADDR, HOST_IF, LAN_IF, Ns, SERVER_ADDR, Topology};

use crate::load::{
    DataPath, Point, RunResult, Sampler, Settings, active_window, ethtool_feature, forwarded,
    parse_net_dev, parse_ping, read, rtts_within, spawn_sh, unix_now, wait_quiet,
};
use crate::sys::{CpuTicks, percentile};
use tests::rawbpf::{self, Prog, UDP_HDRS_LEN, os_err};

/// UDP payload of every generated datagram (the iperf2 workload's size).
pub const PAYLOAD: usize = 64;
/// First UDP source port of the generated flows.
const BASE_PORT: u16 = 20_000;
/// Flows the generator can vary over (source ports up to 65535).
pub const MAX_FLOWS: u16 = u16::MAX - BASE_PORT + 1;

/// The discard port (RFC 863): nothing listens, the sink drops first.
const DST_PORT: u16 = 9;
/// Seconds of one `BPF_PROG_RUN` call. Every call sets up and tears down
/// a page pool, and the teardown sleeps: calls of 65536 frames left the
/// generator idle two thirds of the time. Calls of a quarter second
/// amortise that and still end the run close to its deadline.
pub const CALL_SECS: f64 = 0.25;
/// Frames of the first call, before the rate is known.
const FIRST_CALL: u32 = 1 << 18;
/// Frames per batch inside one call (the kernel's default and NAPI's).
pub const BATCH: u32 = 64;

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

/// The generated frame: client -> server UDP with a valid checksum (as
/// iperf2 and real hosts send; netfilter verifies it on the kernel path),
/// addressed to the router's LAN MAC.
fn frame(t: &Topology) -> Result<Vec<u8>, String> {
    let router = t.try_mac(Ns::Router, LAN_IF)?;
    let client = t.try_mac(Ns::Client, HOST_IF)?;
    let payload = tests::pattern(PAYLOAD);
    let udp = Udp::new(BASE_PORT, DST_PORT, &payload);
    let ip = Ipv4::new(CLIENT_ADDR.octets(), SERVER_ADDR.octets(), udp);
    Ok(Frame::new(router, client, ip).bytes())
}

/// The last CPU the calling thread may run on.
fn last_cpu() -> Result<usize, String> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel writes at
    // most its size; CPU_ISSET indexes below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) != 0 {
            return Err(os_err("sched_getaffinity"));
        }
        (0..libc::CPU_SETSIZE as usize)
            .rev()
            .find(|&c| libc::CPU_ISSET(c, &set))
            .ok_or_else(|| "no CPU in the affinity mask".to_owned())
    }
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET indexes
    // below CPU_SETSIZE (cpu came from the affinity mask).
    unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const one) != 0 {
            return Err(os_err("sched_setaffinity"));
        }
    }
    Ok(())
}

/// Generates on `cpu` for `secs`, or until `stop`; returns (frames sent,
/// seconds).
fn generate(
    t: &Topology,
    prog: &Prog,
    frame: &[u8],
    (cpu, secs): (usize, f64),
    stop: &AtomicBool,
) -> Result<(u64, f64), String> {
    let ifindex = t.try_ifindex(Ns::Client, HOST_IF)?;
    t.in_ns(Ns::Client, || {
        // One CPU: the generator, and the router's and the sink's NAPI
        // that its transmits schedule, run there (a veth has no queue of
        // its own).
        pin(cpu).map_err(|e| format!("pinning the generator: {e}"))?;
        let start = Instant::now();
        let mut sent = 0u64;
        let mut frames = FIRST_CALL;
        loop {
            let left = secs - start.elapsed().as_secs_f64();
            if left <= 0.0 || stop.load(Ordering::Relaxed) {
                break;
            }
            let t0 = Instant::now();
            prog.run_live(frame, ifindex, frames, BATCH)?;
            sent += u64::from(frames);
            let rate = f64::from(frames) / t0.elapsed().as_secs_f64().max(1e-6);
            let next = rate * CALL_SECS.min(left - t0.elapsed().as_secs_f64());
            frames = (next as u32).clamp(1 << 12, 1 << 24);
        }
        Ok((sent, start.elapsed().as_secs_f64()))
    })
}

/// Instructions of the generator (with its checksum update) and of the
/// sink, for the report.
pub fn program_sizes() -> (usize, usize) {
    let mut headers = [0u8; UDP_HDRS_LEN];
    headers[UDP_HDRS_LEN - 1] = 1;
    (
        rawbpf::udp_generator(&headers, 1, BASE_PORT).len(),
        rawbpf::udp_sink().len(),
    )
}

/// Whether this kernel runs XDP programs in live-frame mode (Linux >=
/// 5.18): one frame through a program that drops it, on the client's
/// interface (nothing is sent).
pub fn supported(t: &Topology) -> Result<(), String> {
    let prog = Prog::load("bench_probe", &rawbpf::constant(rawbpf::XDP_DROP))?;
    let frame = frame(t)?;
    let ifindex = t.try_ifindex(Ns::Client, HOST_IF)?;
    t.in_ns(Ns::Client, || prog.run_live(&frame, ifindex, 1, 1))
}

/// Runs the live-frame UDP workload with `point.conns` flows on the
/// router's current path.
/// `stop` ends the load early (Ctrl-C).
pub fn run(
    t: &Topology,
    s: &Settings,
    path: DataPath,
    point: Point,
    stop: &AtomicBool,
) -> Result<RunResult, String> {
    let flows = u16::try_from(point.conns)
        .ok()
        .filter(|&f| f <= MAX_FLOWS)
        .ok_or_else(|| format!("udp-live: at most {MAX_FLOWS} flows"))?;
    let quiet_wait_s = wait_quiet(t, 2000, Duration::from_secs(10));
    let frame = frame(t)?;
    let headers: &[u8; UDP_HDRS_LEN] = frame[..UDP_HDRS_LEN].try_into().unwrap();
    let generator = Prog::load(
        "bench_gen",
        &rawbpf::udp_generator(headers, flows, BASE_PORT),
    )?;
    let sink = Prog::load("bench_sink", &rawbpf::udp_sink())?;
    let srv_if = t.try_ifindex(Ns::Server, HOST_IF)?;
    let _sink_link = t.in_ns(Ns::Server, || sink.attach_native(srv_if))?;
    let _gro = Feature::set(
        t,
        Ns::Router,
        LAN_IF,
        ("gro", "generic-receive-offload"),
        "on",
    )?;
    // The router resolves the server's MAC before the load (the fast path
    // hands packets without a neighbour entry to the kernel).
    t.warm_neighbours();

    let tag = format!("{}-live-{}", path.name(), point.conns);
    let ping_out = s.tmp.join(format!("{tag}.ping.txt"));
    let read_sink = || {
        let o = t.exec(Ns::Server, &["cat", "/proc/net/dev"]);
        parse_net_dev(&String::from_utf8_lossy(&o.stdout), &[HOST_IF]).0
    };
    let sink0 = read_sink();
    let fwd0 = forwarded(t, path);
    let cpu0 = CpuTicks::now();
    let start = Instant::now();
    let start_unix = unix_now();
    let sampler = Sampler::start(t, start, Duration::from_millis(100));
    let limit = s.secs + 3;
    // Ping from the generator's CPU too. A veth transmit schedules the
    // receiver's NAPI on the sending CPU, and a NAPI instance stays where
    // it runs while its ring has work: a ping sent from another CPU can
    // capture the router's NAPI there, and every frame then crosses cores
    // (measured: ~40 % more cost per packet and heavy loss, at random).
    let cpu = last_cpu()?;
    let ping = spawn_sh(
        t,
        Ns::Client,
        &format!(
            "exec taskset -c {cpu} timeout -k 1 {limit} ping -D -n -i {} -w {limit} -W 1 \
             {SERVER_ADDR} > {} 2>&1",
            s.ping_interval,
            ping_out.display()
        ),
    );
    // Let ping start before the load, as in the iperf2 runs.
    std::thread::sleep(Duration::from_millis(300));
    let result = generate(t, &generator, &frame, (cpu, f64::from(s.secs)), stop);
    // Frames still in flight drain within milliseconds.
    std::thread::sleep(Duration::from_millis(200));
    let wall_s = start.elapsed().as_secs_f64();
    let cpu = cpu0.until(CpuTicks::now());
    let readings = sampler.finish();
    let _ = ping.finish();
    let (sent, gen_s) = result?;
    let received = read_sink().saturating_sub(sink0);
    let router_pkts = forwarded(t, path).saturating_sub(fwd0);

    let mut notes = Vec::new();
    let found = active_window(&readings);
    let Some(win) = found else {
        return Err(format!(
            "udp-live on the {} path: the router saw no traffic (generated {sent} frames)",
            path.name()
        ));
    };
    let (pings, ping_loss) = parse_ping(&read(&ping_out));
    let mut rtts = rtts_within(&pings, start_unix, &win);
    if rtts.is_empty() {
        notes.push("no ping answered inside the window".to_owned());
    }
    let per = |x: f64| {
        if win.pkts > 0 {
            x / win.pkts as f64
        } else {
            f64::NAN
        }
    };
    let secs = win.secs.max(1e-9);
    let pps = win.sink_pkts as f64 / secs;
    let loss_pct = if sent > 0 {
        (sent.saturating_sub(received)) as f64 * 100.0 / sent as f64
    } else {
        f64::NAN
    };
    Ok(RunResult {
        path,
        point,
        gbps: pps * PAYLOAD as f64 * 8.0 / 1e9,
        iperf_gbps: f64::NAN,
        pps,
        sent_pps: sent as f64 / gen_s.max(1e-9),
        router_pps: win.pkts as f64 / secs,
        loss_pct,
        lost: sent.saturating_sub(received),
        sink_drops: 0,
        rtt_ms_p50: percentile(&mut rtts, 50.0),
        rtt_ms_p99: percentile(&mut rtts, 99.0),
        ping_loss_pct: ping_loss,
        cpu_pct: win.cpu.busy_pct(),
        softirq_pct: win.cpu.softirq_pct(),
        router_ns_per_pkt: per(win.cpu.softirq_ns()),
        router_avg_pkt_bytes: per(win.bytes as f64),
        active_s: win.secs,
        backlog_drops: win.backlog_drops,
        quiet_wait_s,
        router_pkts,
        run_cpu_pct: cpu.busy_pct(),
        run_ns_per_pkt: if router_pkts > 0 {
            cpu.softirq_ns() / router_pkts as f64
        } else {
            f64::NAN
        },
        stream_s: gen_s,
        streams: u32::from(flows),
        connect_failures: 0,
        wall_s,
        cut_short: false,
        suspect: false,
        attempts: 1,
        notes,
    })
}
