//! A live-frame UDP traffic generator and an `XDP_DROP` sink, in the
//! manner of xdp-tools' `xdp-trafficgen`: `BPF_PROG_RUN` in live-frame
//! mode (Linux >= 5.18) runs a tiny XDP program (`rawbpf::udp_generator`)
//! on page-pool frames and returns `XDP_TX`, which the kernel turns into a
//! real transmit on the interface the run names. The frames arrive at the
//! peer like any other, at a rate iperf2 cannot send on a few cores.
//!
//! Used by the benchmark (`udp-live`) and by the live-frame flood test.
//!
//! The same program generates IPv4 or IPv6 (`UdpFlows::between`);
//! the sink drops both.
//!
//! ```no_run
//! # use tests::{Ns, HOST_IF, Topology, pattern, trafficgen::{Generator, UdpFlows}};
//! let t = Topology::new();
//! let flows = UdpFlows::client_to_server(&t, 30_000, 64, 9, pattern(64)).unwrap();
//! let generator = Generator::load("gen", &flows, t.ifindex(Ns::Client, HOST_IF)).unwrap();
//! // The interface belongs to the client namespace: run from there.
//! t.in_ns(Ns::Client, || generator.send(100_000)).unwrap();
//! ```

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::frames::{Frame, Ipv4, Udp};
use crate::rawbpf::{self, Prog, UDP_HDRS_LEN, UdpLayout, XdpLink, os_err};
use crate::v6::{CLIENT6, SERVER6};
use crate::{CLIENT_ADDR, HOST_IF, LAN_IF, Ns, SERVER_ADDR, Topology};

/// Frames per batch inside one `BPF_PROG_RUN` call (the kernel's default
/// and NAPI's).
pub const BATCH: u32 = 64;
/// Seconds of one `BPF_PROG_RUN` call in [`Generator::run_for`]. Every call
/// sets up and tears down a page pool, and the teardown sleeps: calls of
/// 65536 frames left the generator idle two thirds of the time. Calls of a
/// quarter second amortise that and still end a run close to its deadline.
pub const CALL_SECS: f64 = 0.25;
/// Frames of the first call of [`Generator::run_for`], before the rate is known.
const FIRST_CALL: u32 = 1 << 18;

/// Source and destination address of the generated datagrams: one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hosts {
    V4 { src: Ipv4Addr, dst: Ipv4Addr },
    V6 { src: Ipv6Addr, dst: Ipv6Addr },
}

impl Hosts {
    /// The topology's client to its server over IPv6: their global
    /// addresses (`v6::enable`), routed through the router.
    pub const CLIENT_TO_SERVER6: Self = Self::V6 {
        src: CLIENT6,
        dst: SERVER6,
    };

    /// Where the generator finds the UDP header in frames between them.
    #[must_use]
    pub const fn layout(self) -> UdpLayout {
        match self {
            Self::V4 { .. } => UdpLayout::IPV4,
            Self::V6 { .. } => UdpLayout::IPV6,
        }
    }
}

/// What to generate: UDP datagrams from `hosts`' source to its destination
/// at `dst_port`, the source port random over `base_port .. base_port +
/// flows`, with a valid checksum (as real hosts send; netfilter verifies
/// it on the kernel path; IPv6 requires it).
#[derive(Clone, Debug)]
pub struct UdpFlows {
    /// Ethernet destination: the next hop (the router's LAN MAC).
    pub dst_mac: [u8; 6],
    pub src_mac: [u8; 6],
    pub hosts: Hosts,
    pub base_port: u16,
    /// Number of source ports (flows), at least 1.
    pub flows: u16,
    pub dst_port: u16,
    pub payload: Vec<u8>,
}

impl UdpFlows {
    /// The topology's client to its server, through the router's LAN side.
    ///
    /// # Errors
    /// If an interface's MAC address cannot be read.
    pub fn client_to_server(
        t: &Topology,
        base_port: u16,
        flows: u16,
        dst_port: u16,
        payload: Vec<u8>,
    ) -> Result<Self, String> {
        Ok(Self {
            dst_mac: t.try_mac(Ns::Router, LAN_IF)?,
            src_mac: t.try_mac(Ns::Client, HOST_IF)?,
            hosts: Hosts::V4 {
                src: CLIENT_ADDR,
                dst: SERVER_ADDR,
            },
            base_port,
            flows,
            dst_port,
            payload,
        })
    }

    /// The same flows between `hosts` (e.g. [`Hosts::CLIENT_TO_SERVER6`]).
    #[must_use]
    pub fn between(self, hosts: Hosts) -> Self {
        Self { hosts, ..self }
    }

    /// Most flows a generator can vary over from `base_port` (ports up to
    /// 65535).
    #[must_use]
    pub fn max_flows(base_port: u16) -> u32 {
        65_536 - u32::from(base_port)
    }

    /// The frame every generated one starts from: the first flow's port.
    #[must_use]
    pub fn frame(&self) -> Vec<u8> {
        let udp = Udp::new(self.base_port, self.dst_port, &self.payload);
        match self.hosts {
            Hosts::V4 { src, dst } => {
                let ip = Ipv4::new(src.octets(), dst.octets(), udp);
                Frame::new(self.dst_mac, self.src_mac, ip).bytes()
            }
            Hosts::V6 { src, dst } => crate::v6::Ipv6::udp(src.octets(), dst.octets(), &udp)
                .frame(self.dst_mac, self.src_mac),
        }
    }
}

/// The generator program loaded for one [`UdpFlows`] and one interface.
pub struct Generator {
    prog: Prog,
    frame: Vec<u8>,
    ifindex: u32,
}

impl Generator {
    /// Loads the generator for `flows`, to transmit on `ifindex`.
    ///
    /// # Errors
    /// If `flows` is empty or runs past port 65535, or the verifier refuses
    /// the program.
    pub fn load(name: &str, flows: &UdpFlows, ifindex: u32) -> Result<Self, String> {
        if flows.flows == 0 || u32::from(flows.flows) > UdpFlows::max_flows(flows.base_port) {
            return Err(format!(
                "trafficgen: 1 to {} flows from port {}, not {}",
                UdpFlows::max_flows(flows.base_port),
                flows.base_port,
                flows.flows
            ));
        }
        let frame = flows.frame();
        let layout = flows.hosts.layout();
        let prog = Prog::load(
            name,
            &rawbpf::udp_generator(
                &frame[..layout.headers_len()],
                layout,
                flows.flows,
                flows.base_port,
            ),
        )?;
        Ok(Self {
            prog,
            frame,
            ifindex,
        })
    }

    /// Transmits `frames` frames in one `BPF_PROG_RUN` call, [`BATCH`] per
    /// batch. Call it from the interface's network namespace.
    ///
    /// # Errors
    /// If `BPF_PROG_RUN` fails (`EINVAL` on kernels without live frames).
    pub fn send(&self, frames: u32) -> Result<(), String> {
        self.prog.run_live(&self.frame, self.ifindex, frames, BATCH)
    }

    /// Transmits for `secs` seconds, or until `stop`, in calls of about
    /// [`CALL_SECS`]; returns (frames sent, seconds spent). Call it from
    /// the interface's network namespace, on the CPU it should load.
    ///
    /// # Errors
    /// If a `BPF_PROG_RUN` call fails.
    pub fn run_for(&self, secs: f64, stop: &AtomicBool) -> Result<(u64, f64), String> {
        let start = Instant::now();
        let mut sent = 0u64;
        let mut frames = FIRST_CALL;
        loop {
            let left = secs - start.elapsed().as_secs_f64();
            if left <= 0.0 || stop.load(Ordering::Relaxed) {
                break;
            }
            let t0 = Instant::now();
            self.send(frames)?;
            sent += u64::from(frames);
            let rate = f64::from(frames) / t0.elapsed().as_secs_f64().max(1e-6);
            // Clamped, so the cast neither wraps nor loses a sign.
            let next = (rate * CALL_SECS.min(left - t0.elapsed().as_secs_f64()))
                .clamp(f64::from(1 << 12), f64::from(1 << 24));
            #[expect(clippy::cast_sign_loss, reason = "clamped to 4096..=16777216 above")]
            let next = next as u32;
            frames = next;
        }
        Ok((sent, start.elapsed().as_secs_f64()))
    }
}

/// Instructions of the generator program (with its checksum update) for
/// IPv4 frames.
#[must_use]
pub fn generator_instructions() -> usize {
    let mut headers = [0u8; UDP_HDRS_LEN];
    headers[UDP_HDRS_LEN - 1] = 1;
    rawbpf::udp_generator(&headers, UdpLayout::IPV4, 1, 0).len()
}

/// Instructions of the sink program.
#[must_use]
pub fn sink_instructions() -> usize {
    rawbpf::udp_sink().len()
}

/// The sink: an XDP program that drops IPv4 and IPv6 UDP and passes the
/// rest (ARP, NDP, and ICMP and `ICMPv6` so that ping measures latency
/// through the router under load).
/// Detached when dropped.
pub struct Sink {
    _link: XdpLink,
    _prog: Prog,
}

impl Sink {
    /// Attaches the sink in native mode to `ifindex`. Call it from the
    /// interface's network namespace.
    ///
    /// # Errors
    /// If the program cannot be loaded or attached.
    pub fn attach(name: &str, ifindex: u32) -> Result<Self, String> {
        let prog = Prog::load(name, &rawbpf::udp_sink())?;
        let link = prog.attach_native(ifindex)?;
        Ok(Self {
            _link: link,
            _prog: prog,
        })
    }
}

/// Whether this kernel runs XDP programs in live-frame mode (Linux >=
/// 5.18): one copy of `frame` through a program that drops it, as if
/// received on `ifindex` (nothing is sent). Call it from the interface's
/// network namespace.
///
/// # Errors
/// Why live-frame mode does not work here.
pub fn probe(frame: &[u8], ifindex: u32) -> Result<(), String> {
    let prog = Prog::load("trafficgen_probe", &rawbpf::constant(rawbpf::XDP_DROP))?;
    prog.run_live(frame, ifindex, 1, 1)
}

/// The last CPU the calling thread may run on.
///
/// # Errors
/// If the affinity mask cannot be read or is empty.
pub fn last_cpu() -> Result<usize, String> {
    allowed_cpus()?
        .pop()
        .ok_or_else(|| "no CPU in the affinity mask".to_owned())
}

/// The CPUs the calling thread may run on, in ascending order (one
/// generator per CPU for the scaling runs).
///
/// # Errors
/// If the affinity mask cannot be read.
pub fn allowed_cpus() -> Result<Vec<usize>, String> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel writes at
    // most its size; CPU_ISSET indexes below CPU_SETSIZE.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) != 0 {
            return Err(os_err("sched_getaffinity"));
        }
        Ok((0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect())
    }
}

/// Pins the calling thread to `cpu` (a generator loads the CPU it runs on:
/// a veth transmit runs the receiver's NAPI on the sending CPU).
///
/// # Errors
/// If the kernel refuses the affinity.
pub fn pin_to_cpu(cpu: usize) -> Result<(), String> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET ignores
    // indexes at or past CPU_SETSIZE.
    unsafe {
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &raw const one) != 0 {
            return Err(os_err("sched_setaffinity"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn frame_carries_the_first_flow() {
        let flows = UdpFlows {
            dst_mac: [2; 6],
            src_mac: [4; 6],
            hosts: Hosts::V4 {
                src: CLIENT_ADDR,
                dst: SERVER_ADDR,
            },
            base_port: 20_000,
            flows: 3,
            dst_port: 9,
            payload: vec![7; 64],
        };
        let f = flows.frame();
        assert_eq!(f.len(), UDP_HDRS_LEN + 64);
        assert_eq!(u16::from_be_bytes([f[34], f[35]]), 20_000);
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 9);
        assert_eq!(UdpFlows::max_flows(20_000), 45_536);

        let flows = flows.between(Hosts::CLIENT_TO_SERVER6);
        let f = flows.frame();
        let layout = flows.hosts.layout();
        assert_eq!(f.len(), layout.headers_len() + 64);
        assert_eq!(u16::from_be_bytes([f[12], f[13]]), 0x86dd);
        assert_eq!(
            u16::from_be_bytes([f[layout.sport_off], f[layout.sport_off + 1]]),
            20_000
        );
        assert_eq!(&f[22..38], &CLIENT6.octets());
        assert!(crate::v6::checksum_errors6(&f).is_empty());
        assert_ne!(&f[layout.csum_off..layout.csum_off + 2], &[0, 0]);
    }
}
