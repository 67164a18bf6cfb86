//! Topology variants of the benchmark: the router between two XDP
//! "cables" (a fairer wire for TCP on veth).

use std::ops::Deref;

use crate::rawbpf::{self, Attached};
use crate::{HOST_IF, LAN_IF, Ns, Topology, WAN_IF, host::run_ok};

/// The two ends of a cable namespace: towards the host, towards the router.
const CABLE_HOST_END: &str = "c0";
const CABLE_ROUTER_END: &str = "c1";

/// client -- cable -- router -- cable -- server. Each cable is a namespace
/// with two veths and a raw XDP program on each that redirects every frame
/// to the other: on veth, native XDP copies every cloned skb before the
/// program runs (`skb_pp_cow_data`), which a NIC's receive ring never
/// does; the cables take that copy, and the router receives frames the way
/// a NIC hands them over, on both paths alike.
///
/// The router's `lan0`/`wan0` receive redirected frames, which a veth
/// accepts only while it runs NAPI: under XDP it does; the kernel path
/// needs GRO or an XDP program there (see [`CabledTopology::napi_for_kernel`]).
pub struct CabledTopology {
    // Declared first: the cables detach before the namespaces go.
    _cables: Vec<Attached>,
    topology: Topology,
}

impl Deref for CabledTopology {
    type Target = Topology;
    fn deref(&self) -> &Topology {
        &self.topology
    }
}

impl CabledTopology {
    /// Builds the namespaces, links, addresses and the cables' programs.
    ///
    /// # Errors
    /// If a cable's program cannot be loaded or attached.
    ///
    /// # Panics
    /// If a namespace or link cannot be created (as [`Topology::new`]).
    pub fn new() -> Result<Self, String> {
        let t = Topology::alloc(&[
            Ns::Client,
            Ns::CableLan,
            Ns::Router,
            Ns::CableWan,
            Ns::Server,
        ]);
        t.create_namespaces();
        // (namespace, its interface) at each end of a cable.
        let cables = [
            (Ns::CableLan, (Ns::Client, HOST_IF), (Ns::Router, LAN_IF)),
            (Ns::CableWan, (Ns::Server, HOST_IF), (Ns::Router, WAN_IF)),
        ];
        for (cable, (host, host_if), (router, router_if)) in cables {
            let c = t.ns_name(cable);
            for (end, (ns, dev)) in [
                (CABLE_HOST_END, (host, host_if)),
                (CABLE_ROUTER_END, (router, router_if)),
            ] {
                run_ok(&[
                    "ip",
                    "-n",
                    c,
                    "link",
                    "add",
                    end,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    dev,
                    "netns",
                    t.ns_name(ns),
                ]);
                run_ok(&["ip", "-n", c, "link", "set", end, "up"]);
            }
        }
        t.setup_client(Ns::Client, crate::CLIENT_ADDR);
        t.address_router_and_server();
        // Until a path is chosen, GRO gives the router's veths NAPI, so
        // that they accept the cables' frames (neighbour warm-up, ping).
        for dev in [LAN_IF, WAN_IF] {
            t.exec_ok(Ns::Router, &["ethtool", "-K", dev, "gro", "on"]);
        }
        let mut attached = Vec::new();
        for (cable, _, _) in cables {
            let a = t.try_ifindex(cable, CABLE_HOST_END)?;
            let b = t.try_ifindex(cable, CABLE_ROUTER_END)?;
            for (from, to) in [(a, b), (b, a)] {
                attached.push(t.in_ns(cable, || {
                    Attached::new("cable", &rawbpf::redirect_all(to), &[from])
                })?);
            }
        }
        Ok(Self {
            _cables: attached,
            topology: t,
        })
    }

    /// For the kernel path: a `return XDP_PASS` program on the router's
    /// `lan0` and `wan0`, so that they run NAPI and accept the cables'
    /// redirected frames while GRO stays off (offload off: the router
    /// forwards wire-sized packets). Detached when dropped; the XDP path's
    /// own program needs them gone.
    ///
    /// # Errors
    /// If it cannot be loaded or attached.
    pub fn napi_for_kernel(&self) -> Result<Attached, String> {
        let lan = self.try_ifindex(Ns::Router, LAN_IF)?;
        let wan = self.try_ifindex(Ns::Router, WAN_IF)?;
        self.in_ns(Ns::Router, || {
            Attached::new(
                "napi_pass",
                &rawbpf::constant(rawbpf::XDP_PASS),
                &[lan, wan],
            )
        })
    }
}
