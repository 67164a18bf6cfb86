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

/// `struct xdp_md` with `ingress_ifindex` set.
fn xdp_ctx(len: usize, ingress: u32) -> [u8; 24] {
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(len as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ingress.to_ne_bytes());
    ctx
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

/// A two-instruction `r0 = XDP_PASS; exit` loaded with the raw `bpf(2)`
/// syscall: the cost of running any XDP program at all.
struct Trivial {
    fd: libc::c_int,
}

#[repr(C)]
struct BpfInsn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_PROG_TYPE_XDP: u32 = 6;

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> libc::c_long {
    // SAFETY: `attr` is a live, fully initialised repr(C) bpf_attr prefix
    // of the given size; the kernel zero-extends it.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            size_of::<T>(),
        )
    }
}

impl Trivial {
    fn load() -> Result<Self, String> {
        let insns = [
            // BPF_ALU64 | BPF_MOV | BPF_K: r0 = 2 (XDP_PASS)
            BpfInsn {
                code: 0xb7,
                regs: 0,
                off: 0,
                imm: XDP_PASS.cast_signed(),
            },
            // BPF_JMP | BPF_EXIT
            BpfInsn {
                code: 0x95,
                regs: 0,
                off: 0,
                imm: 0,
            },
        ];
        let license = c"GPL";
        let mut name = [0u8; 16];
        name[..7].copy_from_slice(b"xdppass");
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_XDP,
            insn_cnt: insns.len() as u32,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name: name,
            ..ProgLoadAttr::default()
        };
        let fd = bpf(BPF_PROG_LOAD, &mut attr);
        if fd < 0 {
            return Err(format!(
                "loading a trivial XDP program: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(Self {
            fd: fd as libc::c_int,
        })
    }
}

impl Drop for Trivial {
    fn drop(&mut self) {
        // SAFETY: our own fd.
        unsafe { libc::close(self.fd) };
    }
}

impl Runner for Trivial {
    fn run(&self, frame: &[u8], ingress: u32, repeat: u32) -> Result<(u32, f64, Vec<u8>), String> {
        let mut out = vec![0u8; frame.len() + 256];
        let ctx = xdp_ctx(frame.len(), ingress);
        let mut attr = TestRunAttr {
            prog_fd: self.fd.cast_unsigned(),
            data_size_in: frame.len() as u32,
            data_size_out: out.len() as u32,
            data_in: frame.as_ptr() as u64,
            data_out: out.as_mut_ptr() as u64,
            repeat,
            ctx_size_in: ctx.len() as u32,
            ctx_in: ctx.as_ptr() as u64,
            ..TestRunAttr::default()
        };
        if bpf(BPF_PROG_TEST_RUN, &mut attr) != 0 {
            return Err(format!("BPF_PROG_RUN: {}", std::io::Error::last_os_error()));
        }
        out.truncate(attr.data_size_out as usize);
        Ok((attr.retval, f64::from(attr.duration), out))
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
        let trivial = Trivial::load();
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
