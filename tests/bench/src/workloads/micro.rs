//! Packet cost micro-benchmark: `BPF_PROG_RUN` of the router program on
//! crafted frames, in the router namespace of the topology (so
//! `bpf_fib_lookup` sees real routes and neighbours), next to a trivial
//! `XDP_PASS` program as the floor.
//!
//! Method. `BPF_PROG_RUN` without live frames runs the program on one
//! buffer: with `repeat > 1` every iteration sees what the previous one
//! wrote. A forwarded frame is rewritten (NAT, TTL, MACs), so the next
//! iteration would measure some other case. Every case is therefore timed
//! per call (`repeat = 1`, a fresh copy of the frame each time) and
//! reported as the median over many calls; that time includes the test
//! harness's fixed overhead (two clock reads, bottom-half toggling), which
//! the floor measured the same way shows. Cases that leave the frame
//! untouched are also timed with a large `repeat`, which amortises that
//! overhead away. The established-flow hits are amortised too, as a
//! ping-pong: a second entry, keyed by the flow's translated tuple on the
//! same side, translates it back, so every iteration is a full hit
//! (lookup, rewrite, next hop, TTL, MACs) and the frame alternates between
//! the two tuples; the frame starts with TTL 255 and runs [`PINGPONG_REPEAT`]
//! iterations, an even number that leaves its TTL above 1.

use aya::maps::{HashMap, MapData};
use aya::programs::{TestRun, TestRunOptions, Xdp};
use router_common::maps::{
    Config, DEFAULT_MAX_FLOWS, FLAG_OFFLOADED, FlowEntry, FlowKey, IPPROTO_TCP, IPPROTO_UDP,
    PROGRAM_NAME, Timeouts,
};
use tests::frames::{Frame, Ipv4, TCP_ACK, TCP_SYN, Tcp, Udp};
use tests::prog::{LoadedRouter, mac_str};
use tests::rawbpf::{self, Prog, xdp_ctx};
use tests::v6::{CLIENT6, Ipv6, ROUTER_LAN6, ROUTER_WAN6, SERVER6, o};
use tests::{CLIENT_ADDR, HOST_IF, LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF};

use crate::measure::sys::percentile;

const XDP_PASS: u32 = rawbpf::XDP_PASS.cast_unsigned();
const XDP_REDIRECT: u32 = 4;

/// One measured case.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: &'static str,
    pub what: &'static str,
    /// Verdict the case must get (every call is checked).
    pub verdict: &'static str,
    pub calls: u32,
    pub unexpected: u32,
    pub median_ns: f64,
    pub p10_ns: f64,
    pub p90_ns: f64,
    /// Per-iteration time with `repeat`, for cases that do not modify the frame.
    pub amortized_ns: Option<f64>,
    pub repeat: u32,
}

/// Something that can be test-run: the router program or the raw floor.
trait Runner {
    /// (verdict, per-iteration duration ns, output frame).
    fn run(&self, frame: &[u8], ingress: u32, repeat: u32) -> Result<(u32, f64, Vec<u8>), String>;
}

impl Runner for Xdp {
    fn run(&self, frame: &[u8], ingress: u32, repeat: u32) -> Result<(u32, f64, Vec<u8>), String> {
        let mut out = vec![0u8; frame.len() + 256];
        let ctx = xdp_ctx(frame.len(), ingress);
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        opts.data_out = Some(&mut out);
        opts.ctx_in = Some(&ctx);
        opts.repeat = repeat;
        let r = self
            .test_run(opts)
            .map_err(|e| format!("BPF_PROG_RUN: {e}"))?;
        out.truncate(r.data_size_out as usize);
        Ok((r.return_value, r.duration.as_nanos() as f64, out))
    }
}

/// The floor: a two-instruction `r0 = XDP_PASS; exit`, the cost of running
/// any XDP program at all.
impl Runner for Prog {
    fn run(&self, frame: &[u8], ingress: u32, repeat: u32) -> Result<(u32, f64, Vec<u8>), String> {
        self.test_run(frame, ingress, repeat)
    }
}

/// Which frame a case runs on.
#[derive(Clone, Copy)]
enum Input {
    Arp,
    /// The established UDP flow, LAN -> WAN.
    UdpOut,
    /// One of [`SPREAD_FLOWS`] established UDP flows per call, LAN -> WAN,
    /// each call another (see [`spread_flow`]).
    UdpOutSpread,
    /// Its reply, WAN -> LAN.
    UdpReply,
    /// An established UDP flow offloaded from the kernel (offload mode's
    /// entries: `FLAG_OFFLOADED` and a lease), LAN -> WAN.
    UdpOutOffloaded,
    TcpData,
    /// An established IPv6 UDP flow, LAN -> WAN (routed, not translated).
    Udp6Out,
    /// A data segment of an established IPv6 TCP flow, LAN -> WAN.
    Tcp6Data,
    /// A fresh source port per call: every call opens a new flow.
    NewUdpFlow,
    /// A TCP SYN from a fresh source port per call, advertising a jumbo
    /// host's MSS (8960): a new flow whose MSS is clamped.
    NewTcpSyn,
    TcpNoFlow,
}

struct Spec {
    name: &'static str,
    what: &'static str,
    /// Arrives on the WAN side (else the LAN side).
    from_wan: bool,
    verdict: u32,
    input: Input,
    /// Also time with `repeat` (only for cases that leave the frame as is).
    amortize: bool,
}

/// Every case, in report order. The first runs the trivial floor program,
/// the others the router program.
const SPECS: [Spec; 12] = {
    const fn spec(
        name: &'static str,
        what: &'static str,
        from_wan: bool,
        verdict: u32,
        input: Input,
        amortize: bool,
    ) -> Spec {
        Spec {
            name,
            what,
            from_wan,
            verdict,
            input,
            amortize,
        }
    }
    [
        spec(
            "trivial-pass",
            "floor: trivial `return XDP_PASS` program (raw bpf(2)), ARP frame",
            false,
            XDP_PASS,
            Input::Arp,
            true,
        ),
        spec(
            "pass-not-ipv4",
            "router program, ARP frame: passed at the first check",
            false,
            XDP_PASS,
            Input::Arp,
            true,
        ),
        spec(
            "hit-udp-out",
            "established UDP flow, LAN->WAN: lookup, SNAT rewrite, FIB, redirect",
            false,
            XDP_REDIRECT,
            Input::UdpOut,
            false,
        ),
        spec(
            "hit-udp-out-offloaded",
            "the same, on an offload-mode entry (the kernel admitted it): lease check too",
            false,
            XDP_REDIRECT,
            Input::UdpOutOffloaded,
            false,
        ),
        spec(
            "hit-udp-in",
            "established UDP flow, WAN->LAN reply: lookup, DNAT rewrite, FIB, redirect",
            true,
            XDP_REDIRECT,
            Input::UdpReply,
            false,
        ),
        spec(
            "hit-tcp-out",
            "established TCP flow, LAN->WAN data segment (state and window tracking)",
            false,
            XDP_REDIRECT,
            Input::TcpData,
            false,
        ),
        spec(
            "hit-udp6-out",
            "established IPv6 UDP flow, LAN->WAN: lookup, cached next hop, hop limit, redirect",
            false,
            XDP_REDIRECT,
            Input::Udp6Out,
            false,
        ),
        spec(
            "hit-tcp6-out",
            "established IPv6 TCP flow, LAN->WAN data segment (state and window tracking)",
            false,
            XDP_REDIRECT,
            Input::Tcp6Data,
            false,
        ),
        spec(
            "new-flow-udp",
            "new UDP flow, LAN->WAN: miss, port choice, two inserts, rewrite, redirect",
            false,
            XDP_REDIRECT,
            Input::NewUdpFlow,
            false,
        ),
        spec(
            "new-flow-tcp-syn",
            "new TCP flow, LAN->WAN SYN with MSS 8960: as new-flow-udp, plus the MSS clamped",
            false,
            XDP_REDIRECT,
            Input::NewTcpSyn,
            false,
        ),
        spec(
            "miss-pass",
            "TCP segment of no known flow: lookup miss, passed to the kernel",
            false,
            XDP_PASS,
            Input::TcpNoFlow,
            true,
        ),
        // Last: its 64,000 flows stay in the table.
        spec(
            "hit-udp-out-spread",
            "hit-udp-out, each call on another of 64000 flows: the entry is out of the CPU's near caches",
            false,
            XDP_REDIRECT,
            Input::UdpOutSpread,
            false,
        ),
    ]
};

fn measure(
    r: &dyn Runner,
    s: &Spec,
    (frames, ingress): (&Frames, u32),
    calls: u32,
    repeat: u32,
    pingpong: Option<&[u8]>,
) -> Result<Case, String> {
    let mut times = Vec::with_capacity(calls as usize);
    let mut unexpected = 0;
    let spread = if matches!(s.input, Input::UdpOutSpread) {
        Some(touch_spread(&[r], frames.macs, ingress)?)
    } else {
        None
    };
    for i in 0..calls {
        let f = frames.get(s.input, i);
        let (v, ns, _) = r.run(&f, ingress, 1)?;
        if v != s.verdict {
            unexpected += 1;
        }
        times.push(ns);
    }
    if let Some(w) = spread {
        w.check(s.name);
    }
    let amortized_ns = if s.amortize {
        let f = frames.get(s.input, 0);
        let (v, ns, out) = r.run(&f, ingress, repeat)?;
        if v != s.verdict || out != f {
            return Err(format!("{}: frame changed under repeat", s.name));
        }
        Some(ns)
    } else if let Some(f) = pingpong {
        Some(pingpong_ns(r, s, f, ingress, calls)?)
    } else {
        None
    };
    let repeat = if s.amortize {
        repeat
    } else if pingpong.is_some() {
        u32::from(PINGPONG_REPEAT)
    } else {
        1
    };
    Ok(Case {
        name: s.name,
        what: s.what,
        verdict: verdict_name(s.verdict),
        calls,
        unexpected,
        median_ns: percentile(&mut times, 50.0),
        p10_ns: percentile(&mut times, 10.0),
        p90_ns: percentile(&mut times, 90.0),
        amortized_ns,
        repeat,
    })
}

/// Iterations of one ping-pong run: even (the frame ends as it started,
/// but for TTL and MACs) and below 254 (its TTL stays above 1).
const PINGPONG_REPEAT: u8 = 250;

/// Median per-iteration time of a hit case run as a ping-pong (see the
/// module's comment) on `frame` (TTL 255), over `calls / 50` runs of
/// [`PINGPONG_REPEAT`] iterations; every run must end redirected with the
/// frame's tuple back where it started.
fn pingpong_ns(
    r: &dyn Runner,
    s: &Spec,
    frame: &[u8],
    ingress: u32,
    calls: u32,
) -> Result<f64, String> {
    const TTL: usize = 22;
    let mut times = Vec::new();
    for _ in 0..(calls / 50).max(10) {
        let (v, ns, out) = r.run(frame, ingress, u32::from(PINGPONG_REPEAT))?;
        let back = out.len() == frame.len()
            && out[TTL] == 255 - PINGPONG_REPEAT
            && out[TTL + 4..] == frame[TTL + 4..];
        if v != s.verdict || !back {
            return Err(format!(
                "{}: ping-pong run gave verdict {v} and a frame that did not come back",
                s.name
            ));
        }
        times.push(ns);
    }
    Ok(percentile(&mut times, 50.0))
}

/// Adds the ping-pong partner of the LAN -> WAN flow `key`: an entry on
/// the same side, keyed by the flow's translated tuple, that translates it
/// back to `key`'s. Returns the partner's key, for removal.
fn add_pingpong_partner(
    conntrack: &mut HashMap<MapData, FlowKey, FlowEntry>,
    key: FlowKey,
) -> Result<FlowKey, String> {
    let e = conntrack
        .get(&key, 0)
        .map_err(|e| format!("ping-pong partner of {key:?}: {e}"))?;
    let translated = FlowKey::new(
        e.new_src_addr,
        e.new_dst_addr,
        e.new_src_port,
        e.new_dst_port,
        key.proto,
    );
    let back = FlowEntry {
        new_src_addr: key.src_addr,
        new_dst_addr: key.dst_addr,
        new_src_port: key.src_port,
        new_dst_port: key.dst_port,
        ..e
    };
    conntrack
        .insert(translated, back, 0)
        .map_err(|e| format!("ping-pong partner: {e}"))?;
    Ok(translated)
}

fn verdict_name(v: u32) -> &'static str {
    match v {
        x if x == rawbpf::XDP_DROP.cast_unsigned() => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        XDP_REDIRECT => "XDP_REDIRECT",
        _ => "other",
    }
}

/// An ARP request from the client for the router's LAN address.
fn arp_frame(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&CLIENT_ADDR.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&tests::ROUTER_LAN_ADDR.octets());
    f.resize(60, 0);
    f
}

/// The frames of the cases, addressed as in the topology.
struct Frames {
    macs: Macs,
    arp: Vec<u8>,
    /// An established UDP flow's reply, WAN -> LAN.
    reply: Vec<u8>,
    /// A data segment of an established TCP flow, LAN -> WAN.
    tcp_data: Vec<u8>,
    /// A data segment of no known flow.
    tcp_no_flow: Vec<u8>,
    /// The IPv6 hits' frames.
    udp6_out: Vec<u8>,
    tcp6_data: Vec<u8>,
    /// `UdpOut` and `TcpData` with TTL 255, for the ping-pong.
    udp_out_ttl255: Vec<u8>,
    tcp_data_ttl255: Vec<u8>,
}

impl Frames {
    /// The frame of call `i` of a case.
    fn get(&self, input: Input, i: u32) -> Vec<u8> {
        match input {
            Input::Arp => self.arp.clone(),
            Input::UdpOut => out_udp(self.macs, 40_000),
            Input::UdpOutSpread => {
                let (sport, dport) = spread_flow(i);
                out_udp_to(self.macs, sport, dport)
            }
            Input::UdpReply => self.reply.clone(),
            Input::UdpOutOffloaded => out_udp(self.macs, OFFLOADED_SPORT),
            Input::TcpData => self.tcp_data.clone(),
            Input::Udp6Out => self.udp6_out.clone(),
            Input::Tcp6Data => self.tcp6_data.clone(),
            Input::NewUdpFlow => out_udp(self.macs, 10_000 + (i % 30_000) as u16),
            Input::NewTcpSyn => out_syn(self.macs, 10_000 + (i % 30_000) as u16),
            Input::TcpNoFlow => self.tcp_no_flow.clone(),
        }
    }
}

/// Addresses of the two sides, as seen by the router.
#[derive(Clone, Copy)]
struct Macs {
    /// The MAC LAN frames are addressed to, and CONFIG's LAN MAC: the
    /// server's, not `lan0`'s. The ping-pong feeds a redirected frame,
    /// addressed to its next hop (the server), back in on the LAN side, and
    /// the data path takes only frames to CONFIG's MAC (the compare costs
    /// the same whatever the MAC).
    lan: [u8; 6],
    wan: [u8; 6],
    client: [u8; 6],
    server: [u8; 6],
}

const PAYLOAD: [u8; 18] = [0x5a; 18];

/// The client port of the flow the offloaded case uses.
const OFFLOADED_SPORT: u16 = 40_003;

/// Turns both entries of the flow `key` into offload mode's: the flag the
/// offload daemon sets and a lease that does not run out during the run.
/// The translation stays what the data path chose, so the offloaded and
/// the standalone hit differ only in what offload mode adds.
fn mark_offloaded(
    conntrack: &mut HashMap<MapData, FlowKey, FlowEntry>,
    key: FlowKey,
) -> Result<(), String> {
    let orig = conntrack
        .get(&key, 0)
        .map_err(|e| format!("offloaded case, {key:?}: {e}"))?;
    for k in [key, orig.peer] {
        let mut e = conntrack
            .get(&k, 0)
            .map_err(|e| format!("offloaded case, {k:?}: {e}"))?;
        e.flags |= FLAG_OFFLOADED;
        e.lease = u32::MAX;
        conntrack
            .insert(k, e, 0)
            .map_err(|e| format!("offloaded case: {e}"))?;
    }
    Ok(())
}

/// A UDP datagram from the client's `sport` to the server, LAN -> WAN.
fn out_udp(m: Macs, sport: u16) -> Vec<u8> {
    out_udp_to(m, sport, 5001)
}

/// A UDP datagram from the client's `sport` to the server's `dport`.
fn out_udp_to(m: Macs, sport: u16, dport: u16) -> Vec<u8> {
    let (cli, srv) = (CLIENT_ADDR.octets(), SERVER_ADDR.octets());
    Frame::new(
        m.lan,
        m.client,
        Ipv4::new(cli, srv, Udp::new(sport, dport, &PAYLOAD)),
    )
    .bytes()
}

/// Flows of the spread case: 16,000 client ports (apart from the other
/// cases' 10,000-40,003) to 4 server ports. Their LAN-side entries alone
/// (160 bytes each in the kernel's hash table) are about 10 MB, past the
/// CPU's own caches, so each call's entry comes from the shared cache or
/// memory, as in a table whose live flows do not fit the caches (the
/// flows rows of the live benchmark).
const SPREAD_FLOWS: u32 = 64_000;
const SPREAD_FIRST_SPORT: u16 = 41_000;
const SPREAD_DPORTS: u32 = 4;

/// The client and server port of the spread case's call `i`: the flows in
/// an order that strides through the table (a multiplier prime to
/// [`SPREAD_FLOWS`]), so consecutive calls never hit neighbouring flows.
fn spread_flow(i: u32) -> (u16, u16) {
    let j = (u64::from(i) * 48_271 % u64::from(SPREAD_FLOWS)) as u32;
    let sport = SPREAD_FIRST_SPORT + (j / SPREAD_DPORTS) as u16;
    let dport = 6001 + (j % SPREAD_DPORTS) as u16;
    (sport, dport)
}

/// Opens every spread flow on each of `progs` and brings it to the state
/// of a flow seen a moment ago, so that the timed calls that follow are
/// plain hits: a first pass opens them; after a second (each flow's
/// refresh then due) and at the start of a mapping tick, a second pass
/// refreshes each flow's times and its NAT mapping, so neither is due
/// again in the next second, which the second pass and the timed calls
/// take less of (at the default number of calls). Flow by flow across the
/// objects, so that each flow's entries are as old in every object.
fn touch_spread(progs: &[&dyn Runner], m: Macs, lan: u32) -> Result<SpreadWindow, String> {
    let pass = || {
        for i in 0..SPREAD_FLOWS {
            let (sport, dport) = spread_flow(i);
            let frame = out_udp_to(m, sport, dport);
            for (obj, prog) in progs.iter().enumerate() {
                let (v, _, _) = prog.run(&frame, lan, 1)?;
                if v != XDP_REDIRECT {
                    return Err(format!(
                        "object {obj}: spread flow {sport}->{dport} gave verdict {v} (expected \
                         XDP_REDIRECT)"
                    ));
                }
            }
        }
        Ok(())
    };
    pass()?;
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let first = mapping_tick();
    // Bounded: a tick is 1.07 s.
    for _ in 0..2000 {
        if mapping_tick() != first {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let (tick, touched) = (mapping_tick(), std::time::Instant::now());
    pass()?;
    Ok(SpreadWindow { tick, touched })
}

/// The NAT mappings' refresh tick now, on the data path's clock.
fn mapping_tick() -> u16 {
    router_common::mapping::refresh_tick(tests::prog::coarse_now_ns())
}

/// When [`touch_spread`] left the spread flows: the mapping tick of their
/// last refresh, and when that refresh began (the first flow's).
struct SpreadWindow {
    tick: u16,
    touched: std::time::Instant,
}

impl SpreadWindow {
    /// Says so if the timed calls that just ended ran past the window in
    /// which they are plain hits (another mapping tick, or a second after
    /// the flows' refresh): then some of them refreshed a mapping or a
    /// flow too (more calls than the window holds).
    fn check(&self, name: &str) {
        if mapping_tick() != self.tick
            || self.touched.elapsed() >= std::time::Duration::from_secs(1)
        {
            eprintln!(
                "micro: {name}: the timed calls ran past the spread flows' refresh window; some \
                 of them refreshed their flow or mapping (fewer --micro-calls keep them plain hits)"
            );
        }
    }
}

/// A SYN from `CLIENT:sport` with a Linux SYN's options and a jumbo
/// host's MSS (8960), which the router's default clamping lowers.
fn out_syn(m: Macs, sport: u16) -> Vec<u8> {
    let (cli, srv) = (CLIENT_ADDR.octets(), SERVER_ADDR.octets());
    let options = [
        2, 4, 0x23, 0x00, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
    ];
    let syn = Tcp::new(sport, 5002, TCP_SYN).options(&options);
    Frame::new(m.lan, m.client, Ipv4::new(cli, srv, syn)).bytes()
}

/// Opens the established flows the hit cases need (their first packets
/// run through the program) and builds every frame.
fn open_flows(prog: &Xdp, m: Macs, lan: u32, wan: u32) -> Result<Frames, String> {
    let (cli, srv, wan_addr) = (
        CLIENT_ADDR.octets(),
        SERVER_ADDR.octets(),
        ROUTER_WAN_ADDR.octets(),
    );
    // Established UDP flow: the first run opens it; learn the SNAT port
    // from its output to build the reply.
    let (v, _, first) = prog.run(&out_udp(m, 40_000), lan, 1)?;
    if v != XDP_REDIRECT || first.len() < 36 {
        return Err(format!(
            "opening a UDP flow gave verdict {v} (expected XDP_REDIRECT); are the \
             neighbours resolved?"
        ));
    }
    let snat_port = u16::from_be_bytes([first[34], first[35]]);
    // The flow of the offloaded case, opened the same way.
    let (v, _, _) = prog.run(&out_udp(m, OFFLOADED_SPORT), lan, 1)?;
    if v != XDP_REDIRECT {
        return Err(format!(
            "opening the offloaded case's flow gave verdict {v}"
        ));
    }
    let reply = Frame::new(
        m.wan,
        m.server,
        Ipv4::new(srv, wan_addr, Udp::new(5001, snat_port, &PAYLOAD)),
    )
    .bytes();
    // Established TCP flow: SYN opens it, then data segments hit.
    let tcp = |sport, flags| Tcp::new(sport, 5001, flags);
    let syn = Frame::new(m.lan, m.client, Ipv4::new(cli, srv, tcp(40_001, TCP_SYN))).bytes();
    let (_, _, first) = prog.run(&syn, lan, 1)?;
    // Its SYN+ACK (acknowledging the SYN) establishes it, so that the data
    // segments take the tracked path (the window tracking's compare).
    let port = u16::from_be_bytes([first[34], first[35]]);
    let mut synack = Tcp::new(5001, port, TCP_SYN | TCP_ACK);
    synack.ack = Tcp::new(0, 0, 0).seq.wrapping_add(1);
    let synack = Frame::new(m.wan, m.server, Ipv4::new(srv, wan_addr, synack)).bytes();
    prog.run(&synack, wan, 1)?;
    let data = |sport, ttl| {
        let seg = tcp(sport, TCP_ACK).payload(&PAYLOAD);
        Frame::new(m.lan, m.client, Ipv4::new(cli, srv, seg).ttl(ttl)).bytes()
    };
    let (udp6_out, tcp6_data) = open_flows6(prog, m, lan, wan)?;
    Ok(Frames {
        macs: m,
        arp: arp_frame(m.lan, m.client),
        reply,
        tcp_data: data(40_001, 64),
        tcp_no_flow: data(40_002, 64),
        udp6_out,
        tcp6_data,
        udp_out_ttl255: Frame::new(
            m.lan,
            m.client,
            Ipv4::new(cli, srv, Udp::new(40_000, 5001, &PAYLOAD)).ttl(255),
        )
        .bytes(),
        tcp_data_ttl255: data(40_001, 255),
    })
}

/// Opens the IPv6 flows of the IPv6 hit cases (a UDP flow; a TCP flow
/// through its handshake, so that its data segments take the tracked
/// path) and returns their LAN -> WAN frames.
fn open_flows6(prog: &Xdp, m: Macs, lan: u32, wan: u32) -> Result<(Vec<u8>, Vec<u8>), String> {
    let (c, s) = (o(CLIENT6), o(SERVER6));
    let udp6 = Ipv6::udp(c, s, &Udp::new(40_010, 5001, &PAYLOAD)).frame(m.lan, m.client);
    let (v, _, _) = prog.run(&udp6, lan, 1)?;
    if v != XDP_REDIRECT {
        return Err(format!(
            "opening an IPv6 UDP flow gave verdict {v} (expected XDP_REDIRECT); are the \
             IPv6 neighbours known?"
        ));
    }
    let syn = Tcp::new(40_011, 5001, TCP_SYN);
    prog.run(&Ipv6::tcp(c, s, &syn).frame(m.lan, m.client), lan, 1)?;
    let synack = Tcp::syn_ack_to(&syn);
    prog.run(&Ipv6::tcp(s, c, &synack).frame(m.wan, m.server), wan, 1)?;
    let seg = Tcp::new(40_011, 5001, TCP_ACK)
        .numbered(syn.seq + 1, synack.seq + 1)
        .payload(&PAYLOAD);
    Ok((udp6, Ipv6::tcp(c, s, &seg).frame(m.lan, m.client)))
}

/// Gives the router namespace what the IPv6 cases' FIB lookups need,
/// without touching the hosts (the topology is the benchmark's, shared
/// with the other phases): IPv6 forwarding, its two addresses, and the
/// client and server as permanent neighbours with the MACs the cases'
/// frames use.
fn ipv6_router_side(t: &Topology, m: Macs) -> Result<(), String> {
    let (client_mac, server_mac) = (mac_str(m.client), mac_str(m.server));
    let (lan6, wan6) = (format!("{ROUTER_LAN6}/64"), format!("{ROUTER_WAN6}/64"));
    let (client6, server6) = (CLIENT6.to_string(), SERVER6.to_string());
    let cmds: [&[&str]; 5] = [
        &["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"],
        &["ip", "-6", "addr", "replace", &lan6, "dev", LAN_IF, "nodad"],
        &["ip", "-6", "addr", "replace", &wan6, "dev", WAN_IF, "nodad"],
        &[
            "ip",
            "-6",
            "neigh",
            "replace",
            &client6,
            "lladdr",
            &client_mac,
            "dev",
            LAN_IF,
            "nud",
            "permanent",
        ],
        &[
            "ip",
            "-6",
            "neigh",
            "replace",
            &server6,
            "lladdr",
            &server_mac,
            "dev",
            WAN_IF,
            "nud",
            "permanent",
        ],
    ];
    for cmd in cmds {
        let out = t.exec(Ns::Router, cmd);
        if !out.status.success() {
            return Err(format!(
                "IPv6 set-up of the micro-benchmark, `{}`: {}",
                cmd.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    Ok(())
}

/// The router program, loaded unattached in the calling thread's
/// namespace, configured as `attach` does.
fn load_router(object: Option<&[u8]>, m: Macs, lan: u32, wan: u32) -> Result<LoadedRouter, String> {
    // The test kit's loader panics on failure (it serves tests); here a
    // failure is one failed section of the report, not the end of the run.
    let loaded = tests::host::catch_expected_panic(|| match object {
        None => LoadedRouter::load(lan, wan, 2 * DEFAULT_MAX_FLOWS),
        Some(obj) => LoadedRouter::load_object(obj, lan, wan, 2 * DEFAULT_MAX_FLOWS),
    });
    let mut router = loaded.map_err(|p| {
        let why = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        format!("loading the router program: {why}")
    })?;
    let config = Config {
        lan_ifindex: lan,
        wan_ifindex: wan,
        wan_addr: ROUTER_WAN_ADDR.octets(),
        port_min: 1024,
        port_max: 65535,
        hash_seed: 0x5eed_1234,
        admit: 0,
        filtering: 0,
        // Standalone's default: SYNs clamped to the path MTU.
        mss_clamp_mtu: router_common::mss::CLAMP_PMTU,
        timeouts: Timeouts::default(),
        lan_mac: m.lan,
        wan_mac: m.wan,
    };
    router.config.set(&config)?;
    Ok(router)
}

/// The router's MACs and ifindexes (LAN, WAN) and its neighbours', with
/// the neighbours resolved (IPv6 ones too, see [`ipv6_router_side`]).
fn sides(t: &Topology) -> Result<(Macs, u32, u32), String> {
    t.warm_neighbours();
    let m = Macs {
        lan: t.try_mac(Ns::Server, HOST_IF)?,
        wan: t.try_mac(Ns::Router, WAN_IF)?,
        client: t.try_mac(Ns::Client, HOST_IF)?,
        server: t.try_mac(Ns::Server, HOST_IF)?,
    };
    let lan = t.try_ifindex(Ns::Router, LAN_IF)?;
    let wan = t.try_ifindex(Ns::Router, WAN_IF)?;
    ipv6_router_side(t, m)?;
    Ok((m, lan, wan))
}

/// A loaded router program with the flows and frames of the cases.
struct Prepared {
    router: LoadedRouter,
    frames: Frames,
    partners: [FlowKey; 2],
}

/// The router program of a loaded object.
fn router_program(router: &LoadedRouter) -> Result<&Xdp, String> {
    router
        .ebpf
        .program(PROGRAM_NAME)
        .ok_or("no router program")?
        .try_into()
        .map_err(|e| format!("{e}"))
}

/// Loads `object` (`None`: the embedded one) and opens the cases' flows;
/// in the router namespace.
fn prepare(object: Option<&[u8]>, m: Macs, lan: u32, wan: u32) -> Result<Prepared, String> {
    let mut router = load_router(object, m, lan, wan)?;
    let frames = open_flows(router_program(&router)?, m, lan, wan)?;
    let offloaded = FlowKey::new(
        CLIENT_ADDR.octets(),
        SERVER_ADDR.octets(),
        OFFLOADED_SPORT,
        5001,
        IPPROTO_UDP,
    );
    mark_offloaded(&mut router.conntrack, offloaded)?;
    let mut partner = |sport, proto| {
        add_pingpong_partner(
            &mut router.conntrack,
            FlowKey::new(
                CLIENT_ADDR.octets(),
                SERVER_ADDR.octets(),
                sport,
                5001,
                proto,
            ),
        )
    };
    let partners = [partner(40_000, IPPROTO_UDP)?, partner(40_001, IPPROTO_TCP)?];
    Ok(Prepared {
        router,
        frames,
        partners,
    })
}

/// Runs every case; `calls` per-call samples each, `repeat` for the
/// amortised ones.
pub fn run(t: &Topology, calls: u32, repeat: u32) -> Result<Vec<Case>, String> {
    let (m, lan, wan) = sides(t)?;
    t.in_ns(Ns::Router, || {
        let mut prepared = prepare(None, m, lan, wan)?;
        let prog = router_program(&prepared.router)?;
        let frames = &prepared.frames;
        let trivial = Prog::load("xdppass", &rawbpf::constant(rawbpf::XDP_PASS));
        let mut cases = Vec::new();
        for s in &SPECS {
            let runner: &dyn Runner = if s.name == "trivial-pass" {
                match &trivial {
                    Ok(tr) => tr,
                    Err(e) => {
                        eprintln!("micro: skipping the trivial floor: {e}");
                        continue;
                    }
                }
            } else {
                prog
            };
            let ingress = if s.from_wan { wan } else { lan };
            let pingpong = match s.input {
                Input::UdpOut => Some(frames.udp_out_ttl255.as_slice()),
                Input::TcpData => Some(frames.tcp_data_ttl255.as_slice()),
                _ => None,
            };
            cases.push(measure(
                runner,
                s,
                (frames, ingress),
                calls,
                repeat,
                pingpong,
            )?);
        }
        for k in prepared.partners {
            prepared
                .router
                .conntrack
                .remove(&k)
                .map_err(|e| format!("ping-pong partner: {e}"))?;
        }
        Ok(cases)
    })
}

/// Per case: its name and, per object, the median ns per call and per
/// ping-pong iteration (NaN: the case has no ping-pong).
type CompareRow = (&'static str, Vec<(f64, f64)>);

/// The micro-benchmark of several builds of the program side by side
/// (`--micro-compare`): one topology, every object loaded at once, and
/// every case measured interleaved call by call (object 0, 1, .., 0, 1,
/// ..), so that load from elsewhere on the machine, which comes and goes
/// over seconds, hits every object alike. Prints, per case and object, the
/// median per-call time and (hit cases) the median per-iteration time of
/// the ping-pong, and their ratios to object 0 and to the floor.
pub fn compare(
    objects: &[std::path::PathBuf],
    calls: u32,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), String> {
    let bytes = objects
        .iter()
        .map(|p| std::fs::read(p).map_err(|e| format!("reading the object {}: {e}", p.display())))
        .collect::<Result<Vec<_>, _>>()?;
    let topology = Topology::new();
    let (macs, lan, wan) = sides(&topology)?;
    let rows = topology.in_ns(Ns::Router, || {
        let prepared = bytes
            .iter()
            .map(|b| prepare(Some(b), macs, lan, wan))
            .collect::<Result<Vec<_>, _>>()?;
        let rows = interleaved(&prepared, (lan, wan), calls, stop);
        for mut p in prepared {
            for k in p.partners {
                p.router
                    .conntrack
                    .remove(&k)
                    .map_err(|e| format!("ping-pong partner: {e}"))?;
            }
        }
        rows
    })?;
    print_comparison(objects, calls, &rows);
    Ok(())
}

/// Every case on every prepared program, interleaved call by call.
fn interleaved(
    prepared: &[Prepared],
    (lan, wan): (u32, u32),
    calls: u32,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<Vec<CompareRow>, String> {
    let progs = prepared
        .iter()
        .map(|p| router_program(&p.router))
        .collect::<Result<Vec<_>, String>>()?;
    let trivial = Prog::load("xdppass", &rawbpf::constant(rawbpf::XDP_PASS))?;
    let n = prepared.len();
    let mut rows = Vec::new();
    for spec in &SPECS {
        // Interrupted (SIGINT, SIGTERM): end here, so the topology's guard
        // deletes its namespaces.
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            return Err("interrupted".into());
        }
        let ingress = if spec.from_wan { wan } else { lan };
        let runner = |obj: usize| -> &dyn Runner {
            if spec.name == "trivial-pass" {
                &trivial
            } else {
                progs[obj]
            }
        };
        let mut per_call = vec![Vec::new(); n];
        let spread = if matches!(spec.input, Input::UdpOutSpread) {
            let all: Vec<&dyn Runner> = (0..n).map(runner).collect();
            Some(touch_spread(&all, prepared[0].frames.macs, ingress)?)
        } else {
            None
        };
        for i in 0..calls {
            for k in 0..n {
                let obj = (k + i as usize) % n;
                let frame = prepared[obj].frames.get(spec.input, i);
                let (verdict, ns, _) = runner(obj).run(&frame, ingress, 1)?;
                if verdict != spec.verdict {
                    return Err(format!(
                        "object {obj}: {} gave verdict {verdict}, not {}",
                        spec.name,
                        verdict_name(spec.verdict)
                    ));
                }
                per_call[obj].push(ns);
            }
        }
        if let Some(w) = spread {
            w.check(spec.name);
        }
        let mut per_iteration = vec![Vec::new(); n];
        if matches!(spec.input, Input::UdpOut | Input::TcpData) {
            for i in 0..(calls / 50).max(10) {
                for k in 0..n {
                    let obj = (k + i as usize) % n;
                    let frames = &prepared[obj].frames;
                    let frame = if matches!(spec.input, Input::UdpOut) {
                        &frames.udp_out_ttl255
                    } else {
                        &frames.tcp_data_ttl255
                    };
                    let ns = pingpong_ns(runner(obj), spec, frame, ingress, 1)
                        .map_err(|e| format!("object {obj}: {e}"))?;
                    per_iteration[obj].push(ns);
                }
            }
        }
        let median = |v: &mut Vec<f64>| {
            if v.is_empty() {
                f64::NAN
            } else {
                percentile(v, 50.0)
            }
        };
        let row = per_call
            .iter_mut()
            .zip(&mut per_iteration)
            .map(|(c, p)| (median(c), median(p)))
            .collect();
        rows.push((spec.name, row));
    }
    Ok(rows)
}

/// `--micro-compare`'s table.
fn print_comparison(objects: &[std::path::PathBuf], calls: u32, rows: &[CompareRow]) {
    println!(
        "median ns per call (per ping-pong iteration), {calls} calls per case and object, \
         interleaved; ratio to object [0]; per-call ratio to the floor"
    );
    for (obj, path) in objects.iter().enumerate() {
        println!("  [{obj}] {}", path.display());
    }
    let Some((_, floor_row)) = rows.first() else {
        return;
    };
    for (name, row) in rows {
        let base = row[0];
        let cols = row
            .iter()
            .zip(floor_row)
            .map(|(&(call, iter), &(floor, _))| {
                format!(
                    "{call:6.1} ({iter:5.1}) x{:.3} (x{:.3}) /floor {:.2}",
                    call / base.0,
                    iter / base.1,
                    call / floor
                )
            })
            .collect::<Vec<_>>()
            .join(" | ");
        println!("{name:22} {cols}");
    }
}
