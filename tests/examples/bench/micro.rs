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
//! overhead away.

use aya::{
    Ebpf,
    maps::{Array, DevMapHash},
    programs::{TestRun, TestRunOptions, Xdp},
};
use router_common::maps::{CONFIG_MAP, Config, DEVICES_MAP, PROGRAM_NAME, Timeouts};
use tests::frames::{Frame, Ipv4, TCP_ACK, TCP_SYN, Tcp, Udp};
use tests::{CLIENT_ADDR, HOST_IF, LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF};

use crate::sys::percentile;
use tests::rawbpf::{self, Prog, xdp_ctx};

const XDP_PASS: u32 = 2;
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

struct Spec<'a> {
    name: &'static str,
    what: &'static str,
    ingress: u32,
    verdict: u32,
    /// Frame of call `i`.
    frame: &'a dyn Fn(u32) -> Vec<u8>,
    /// Also time with `repeat` (only for cases that leave the frame as is).
    amortize: bool,
}

fn measure(r: &dyn Runner, s: &Spec<'_>, calls: u32, repeat: u32) -> Result<Case, String> {
    let mut times = Vec::with_capacity(calls as usize);
    let mut unexpected = 0;
    for i in 0..calls {
        let f = (s.frame)(i);
        let (v, ns, _) = r.run(&f, s.ingress, 1)?;
        if v != s.verdict {
            unexpected += 1;
        }
        times.push(ns);
    }
    let amortized_ns = if s.amortize {
        let f = (s.frame)(0);
        let (v, ns, out) = r.run(&f, s.ingress, repeat)?;
        if v != s.verdict || out != f {
            return Err(format!("{}: frame changed under repeat", s.name));
        }
        Some(ns)
    } else {
        None
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
        repeat: if s.amortize { repeat } else { 1 },
    })
}

fn verdict_name(v: u32) -> &'static str {
    match v {
        1 => "XDP_DROP",
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

/// Runs every case; `calls` per-call samples each, `repeat` for the
/// amortised ones.
pub fn run(t: &Topology, calls: u32, repeat: u32) -> Result<Vec<Case>, String> {
    t.warm_neighbours();
    let lan_mac = t.try_mac(Ns::Router, LAN_IF)?;
    let wan_mac = t.try_mac(Ns::Router, WAN_IF)?;
    let cli_mac = t.try_mac(Ns::Client, HOST_IF)?;
    let srv_mac = t.try_mac(Ns::Server, HOST_IF)?;
    let (lan, wan) = (
        t.try_ifindex(Ns::Router, LAN_IF)?,
        t.try_ifindex(Ns::Router, WAN_IF)?,
    );
    let (cli, srv, wan_addr) = (
        CLIENT_ADDR.octets(),
        SERVER_ADDR.octets(),
        ROUTER_WAN_ADDR.octets(),
    );
    let payload = [0x5a_u8; 18];
    let out_udp = move |sport: u16| {
        Frame::new(
            lan_mac,
            cli_mac,
            Ipv4::new(cli, srv, Udp::new(sport, 5001, &payload)),
        )
        .bytes()
    };

    t.in_ns(Ns::Router, || {
        let mut ebpf = Ebpf::load(aya::include_bytes_aligned!(env!("ROUTER_EBPF_OBJ")))
            .map_err(|e| format!("loading the XDP object: {e}"))?;
        {
            let mut devs = DevMapHash::try_from(ebpf.map_mut(DEVICES_MAP).ok_or("no DEVICES")?)
                .map_err(|e| e.to_string())?;
            for i in [lan, wan] {
                devs.insert(i, i, None, 0)
                    .map_err(|e| format!("DEVICES: {e}"))?;
            }
            let mut cfg: Array<_, Config> =
                Array::try_from(ebpf.map_mut(CONFIG_MAP).ok_or("no CONFIG")?)
                    .map_err(|e| e.to_string())?;
            let config = Config {
                lan_ifindex: lan,
                wan_ifindex: wan,
                wan_addr,
                port_min: 1024,
                port_max: 65535,
                hash_seed: 0x5eed_1234,
                pad: 0,
                timeouts: Timeouts::default(),
            };
            cfg.set(0, config, 0).map_err(|e| format!("CONFIG: {e}"))?;
        }
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or("no router program")?
            .try_into()
            .map_err(|e| format!("{e}"))?;
        prog.load()
            .map_err(|e| format!("loading the router program: {e}"))?;

        // Established UDP flow: the first run opens it; learn the SNAT port
        // from its output to build the reply.
        let (v, _, first) = prog.run(&out_udp(40_000), lan, 1)?;
        if v != XDP_REDIRECT || first.len() < 36 {
            return Err(format!(
                "opening a UDP flow gave verdict {v} (expected XDP_REDIRECT); are the \
                 neighbours resolved?"
            ));
        }
        let snat_port = u16::from_be_bytes([first[34], first[35]]);
        let reply = Frame::new(
            wan_mac,
            srv_mac,
            Ipv4::new(srv, wan_addr, Udp::new(5001, snat_port, &payload)),
        )
        .bytes();
        // Established TCP flow: SYN opens it, then data segments hit.
        let syn = Frame::new(
            lan_mac,
            cli_mac,
            Ipv4::new(cli, srv, Tcp::new(40_001, 5001, TCP_SYN)),
        )
        .bytes();
        prog.run(&syn, lan, 1)?;
        let tcp_data = Frame::new(
            lan_mac,
            cli_mac,
            Ipv4::new(cli, srv, Tcp::new(40_001, 5001, TCP_ACK).payload(&payload)),
        )
        .bytes();
        let tcp_nf = Frame::new(
            lan_mac,
            cli_mac,
            Ipv4::new(cli, srv, Tcp::new(40_002, 5001, TCP_ACK).payload(&payload)),
        )
        .bytes();
        let arp = arp_frame(lan_mac, cli_mac);

        let f_arp = |_: u32| arp.clone();
        let f_hit = |_: u32| out_udp(40_000);
        let f_reply = |_: u32| reply.clone();
        let f_tcp = |_: u32| tcp_data.clone();
        // A fresh source port per call: every call opens a new flow.
        let f_new = |i: u32| out_udp(10_000 + (i % 30_000) as u16);
        let f_miss = |_: u32| tcp_nf.clone();
        let specs = [
            Spec {
                name: "trivial-pass",
                what: "floor: trivial `return XDP_PASS` program (raw bpf(2)), ARP frame",
                ingress: lan,
                verdict: XDP_PASS,
                frame: &f_arp,
                amortize: true,
            },
            Spec {
                name: "pass-not-ipv4",
                what: "router program, ARP frame: passed at the first check",
                ingress: lan,
                verdict: XDP_PASS,
                frame: &f_arp,
                amortize: true,
            },
            Spec {
                name: "hit-udp-out",
                what: "established UDP flow, LAN->WAN: lookup, SNAT rewrite, FIB, redirect",
                ingress: lan,
                verdict: XDP_REDIRECT,
                frame: &f_hit,
                amortize: false,
            },
            Spec {
                name: "hit-udp-in",
                what: "established UDP flow, WAN->LAN reply: lookup, DNAT rewrite, FIB, redirect",
                ingress: wan,
                verdict: XDP_REDIRECT,
                frame: &f_reply,
                amortize: false,
            },
            Spec {
                name: "hit-tcp-out",
                what: "established TCP flow, LAN->WAN data segment (state tracking)",
                ingress: lan,
                verdict: XDP_REDIRECT,
                frame: &f_tcp,
                amortize: false,
            },
            Spec {
                name: "new-flow-udp",
                what: "new UDP flow, LAN->WAN: miss, port choice, two inserts, rewrite, redirect",
                ingress: lan,
                verdict: XDP_REDIRECT,
                frame: &f_new,
                amortize: false,
            },
            Spec {
                name: "miss-pass",
                what: "TCP segment of no known flow: lookup miss, passed to the kernel",
                ingress: lan,
                verdict: XDP_PASS,
                frame: &f_miss,
                amortize: true,
            },
        ];
        let trivial = Prog::load("xdppass", &rawbpf::constant(rawbpf::XDP_PASS));
        let mut cases = Vec::new();
        for s in &specs {
            let runner: &dyn Runner = if s.name == "trivial-pass" {
                match &trivial {
                    Ok(tr) => tr,
                    Err(e) => {
                        eprintln!("micro: skipping the trivial floor: {e}");
                        continue;
                    }
                }
            } else {
                &*prog
            };
            cases.push(measure(runner, s, calls, repeat)?);
        }
        Ok(cases)
    })
}
