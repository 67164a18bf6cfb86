//! The frags experiment: what attaching an XDP program to the router's
//! veths does to a TCP stream with offloads on, with and without
//! multi-buffer support (`BPF_F_XDP_HAS_FRAGS`, what `#[xdp(frags)]`
//! sets). The router forwards on the kernel path (iptables MASQUERADE) in
//! every row; the XDP program only passes, so the rows differ only in what
//! the attached program does to the veths' offloads.
//!
//! Why not the router itself as a frags program: a GSO superpacket can
//! reach a frags-aware program whole, but it cannot leave through a
//! redirect. veth's `ndo_xdp_xmit` drops frames longer than the peer's MTU,
//! and an `xdp_frame` carries neither `gso_size` nor `CHECKSUM_PARTIAL`, so
//! nobody downstream would segment it or complete its checksum (which a
//! TSO sender leaves partial). The router program already hands such a
//! frame to the kernel (`bpf_fib_lookup` says the MTU is exceeded), which
//! keeps the metadata on `XDP_PASS`.

use tests::rawbpf::{self, BPF_F_XDP_HAS_FRAGS, Prog};
use tests::{LAN_IF, Ns, Topology, WAN_IF};

use crate::model::{DataPath, Offload, Point, RunResult, Settings, Workload};
use crate::router::{Router, ethtool_feature};
use crate::workloads::iperf::{self, next_port};

/// What is attached to the router's `lan0` and `wan0`.
#[derive(Clone, Copy, Debug)]
pub enum Attached {
    Nothing,
    /// `return XDP_PASS`, single-buffer only (the default).
    Pass,
    /// `return XDP_PASS`, loaded with `BPF_F_XDP_HAS_FRAGS`.
    PassFrags,
}

impl Attached {
    pub const ALL: [Attached; 3] = [Attached::Nothing, Attached::Pass, Attached::PassFrags];

    pub fn name(self) -> &'static str {
        match self {
            Attached::Nothing => "no XDP program",
            Attached::Pass => "XDP_PASS program",
            Attached::PassFrags => "XDP_PASS program, frags-aware",
        }
    }

    pub fn key(self) -> &'static str {
        match self {
            Attached::Nothing => "none",
            Attached::Pass => "pass",
            Attached::PassFrags => "pass-frags",
        }
    }
}

/// One row: the run, and the client's TSO state while it ran.
pub struct Row {
    pub attached: Attached,
    pub run: RunResult,
    pub client_tso: String,
}

/// The client's `tcp-segmentation-offload` as ethtool shows it.
fn client_tso(t: &Topology) -> String {
    ethtool_feature(t, Ns::Client, tests::HOST_IF, "tcp-segmentation-offload")
        .unwrap_or_else(|| "?".to_owned())
}

/// Runs a single TCP stream with offloads on once per [`Attached`].
pub fn run(
    t: &Topology,
    router: &mut Router<'_>,
    s: &Settings,
    port: &mut u16,
) -> Result<Vec<Row>, String> {
    let point = Point::new(Workload::Tcp, 1, Offload::On);
    let mut rows = Vec::new();
    for attached in Attached::ALL {
        router.switch(DataPath::Kernel, Offload::On)?;
        let prog = match attached {
            Attached::Nothing => None,
            Attached::Pass => Some(Prog::load(
                "bench_pass",
                &rawbpf::constant(rawbpf::XDP_PASS),
            )?),
            Attached::PassFrags => Some(Prog::load_with_flags(
                "bench_pass_frags",
                &rawbpf::constant(rawbpf::XDP_PASS),
                BPF_F_XDP_HAS_FRAGS,
            )?),
        };
        let links = match &prog {
            None => Vec::new(),
            Some(p) => {
                let (lan, wan) = (
                    t.try_ifindex(Ns::Router, LAN_IF)?,
                    t.try_ifindex(Ns::Router, WAN_IF)?,
                );
                t.in_ns(Ns::Router, || {
                    Ok::<_, String>(vec![p.attach_native(lan)?, p.attach_native(wan)?])
                })?
            }
        };
        let tso = client_tso(t);
        next_port(port);
        let res = iperf::run(t, s, DataPath::Kernel, point, *port);
        drop(links);
        let run = res.map_err(|e| format!("frags experiment, {}: {e}", attached.name()))?;
        eprintln!(
            "        {}: {:.2} Gbit/s, {:.0} B/pkt at the router, client TSO {tso}",
            attached.name(),
            run.gbps,
            run.router_avg_pkt_bytes
        );
        rows.push(Row {
            attached,
            run,
            client_tso: tso,
        });
    }
    Ok(rows)
}
