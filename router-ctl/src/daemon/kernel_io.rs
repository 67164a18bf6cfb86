//! The offloader's two sides as the daemon has them: the pinned XDP
//! conntrack maps ([`PinnedTable`], the offloader's `Table`) and the
//! kernel's conntrack over ctnetlink with the routes it asks about
//! ([`NetlinkKernel`], its `Kernel`).

use std::{collections::HashMap, io, net::IpAddr, os::fd::AsRawFd as _};

use anyhow::{Context, Result};
use aya::maps::MapError;
use router_common::{
    lease_cas::{self, LeaseCas, LeaseSwap},
    maps::{EgressKey, FlowEntry, FlowEntry6, FlowKey, FlowKey6},
};

use crate::{
    ctnetlink::{Conn, CtSocket, Tuple},
    maps::{Conntrack6Map, ConntrackMap},
    netlink,
    offload::{Kernel, Table, TcpNow, Witnessed},
};

/// Routes remembered within a tick (one lookup per new address); the cache
/// is emptied at every tick, so a route that changed (a WAN failover, a
/// VPN) is followed within one.
const ROUTE_CACHE_MAX: usize = 65_536;

/// The pinned XDP conntrack maps. `v6` is `None` for a router attached by
/// a router-ctl without `CONNTRACK6`: its IPv6 flows stay in the kernel.
pub(super) struct PinnedTable {
    pub(super) v4: ConntrackMap,
    pub(super) v6: Option<Conntrack6Map>,
    /// The lease compare-and-swap of each map (offload mode only).
    cas: Option<LeaseCas>,
    cas6: Option<LeaseCas>,
    /// `ROUTE_MARKS`, in offload mode on a kernel whose `bpf_fib_lookup`
    /// takes a mark (else connections routed by their mark stay in the
    /// kernel).
    route_marks: Option<crate::maps::RouteMarksMap>,
}

impl PinnedTable {
    /// The pinned maps; with `offload`, the lease compare-and-swap
    /// programs for them too (loaded here, against the maps' fds, so they
    /// need nothing but the maps `attach` pins).
    pub(super) fn open(maps: &crate::maps::PinnedMaps, offload: bool) -> Result<Self> {
        use aya::maps::IterableMap as _;
        use std::os::fd::AsFd as _;
        let v4 = maps.conntrack()?;
        let v6 = maps.conntrack6().ok();
        let load = |insns: &lease_cas::Program| {
            LeaseCas::load(insns).context(
                "loading the offload daemon's lease compare-and-swap (a BPF_PROG_TYPE_SYSCALL \
                 program run with BPF_PROG_RUN; needs Linux >= 5.14 and CAP_BPF)",
            )
        };
        let (mut cas, mut cas6) = (None, None);
        if offload {
            let fd = v4.map().fd().as_fd().as_raw_fd();
            cas = Some(load(&lease_cas::conntrack_program(fd))?);
            if let Some(m) = &v6 {
                let fd = m.map().fd().as_fd().as_raw_fd();
                cas6 = Some(load(&lease_cas::conntrack6_program(fd))?);
            }
        }
        let route_marks = if offload { route_marks(maps) } else { None };
        Ok(Self {
            v4,
            v6,
            cas,
            cas6,
            route_marks,
        })
    }
}

/// The pinned `ROUTE_MARKS`, if the fast path can route by a mark here.
fn route_marks(maps: &crate::maps::PinnedMaps) -> Option<crate::maps::RouteMarksMap> {
    match router_common::bpf_insn::fib_lookup_takes_a_mark() {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!(
                "this kernel's bpf_fib_lookup takes no routing mark (BPF_FIB_LOOKUP_MARK, Linux \
                 6.10): connections the kernel routes by their mark stay in the kernel"
            );
            return None;
        }
        Err(e) => {
            tracing::warn!(
                "probing bpf_fib_lookup for routing marks: {e}; connections the kernel routes \
                 by their mark stay in the kernel"
            );
            return None;
        }
    }
    match maps.route_marks() {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(
                "{e:#}; connections the kernel routes by their mark stay in the kernel (a \
                 replace by this router-ctl pins the map; then restart the daemon)"
            );
            None
        }
    }
}

pub(super) fn swap_with(
    cas: Option<&LeaseCas>,
    ctx: lease_cas::LeaseCasCtx,
) -> io::Result<LeaseSwap> {
    cas.ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::Unsupported,
            "no lease compare-and-swap loaded (standalone mode, or no CONNTRACK6 pinned)",
        )
    })?
    .swap(ctx)
}

pub(super) fn io_error(e: &MapError) -> io::Error {
    match e {
        MapError::SyscallError(s) => io::Error::new(s.io_error.kind(), e.to_string()),
        _ => io::Error::other(e.to_string()),
    }
}

impl Table for PinnedTable {
    fn get(&self, k: &FlowKey) -> Option<FlowEntry> {
        self.v4.get(k, 0).ok()
    }
    fn insert(&mut self, k: &FlowKey, v: &FlowEntry) -> io::Result<()> {
        self.v4.insert(k, v, 0).map_err(|e| io_error(&e))
    }
    fn remove(&mut self, k: &FlowKey) {
        // Already gone (LRU eviction, flush) is fine.
        let _ = self.v4.remove(k);
    }
    fn swap_lease(&mut self, k: &FlowKey, expected: u32, new: u32) -> io::Result<LeaseSwap> {
        swap_with(
            self.cas.as_ref(),
            lease_cas::LeaseCasCtx::v4(k, expected, new),
        )
    }
    fn swap_lease6(&mut self, k: &FlowKey6, expected: u32, new: u32) -> io::Result<LeaseSwap> {
        swap_with(
            self.cas6.as_ref(),
            lease_cas::LeaseCasCtx::v6(k, expected, new),
        )
    }
    fn get6(&self, k: &FlowKey6) -> Option<FlowEntry6> {
        self.v6.as_ref()?.get(k, 0).ok()
    }
    fn insert6(&mut self, k: &FlowKey6, v: &FlowEntry6) -> io::Result<()> {
        let Some(m) = self.v6.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no CONNTRACK6 pinned (attached by an older router-ctl)",
            ));
        };
        m.insert(k, v, 0).map_err(|e| io_error(&e))
    }
    fn remove6(&mut self, k: &FlowKey6) {
        if let Some(m) = self.v6.as_mut() {
            let _ = m.remove(k);
        }
    }
    fn route_marks(&self) -> Option<Vec<(u16, u32)>> {
        let m = self.route_marks.as_ref()?;
        Some(
            (1..u16::try_from(m.len()).unwrap_or(u16::MAX))
                .filter_map(|slot| Some((slot, m.get(&u32::from(slot), 0).ok()?)))
                .filter(|&(_, mark)| mark != 0)
                .collect(),
        )
    }
    fn set_route_mark(&mut self, slot: u16, mark: u32) -> io::Result<()> {
        let Some(m) = self.route_marks.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no ROUTE_MARKS here",
            ));
        };
        m.set(u32::from(slot), mark, 0).map_err(|e| io_error(&e))
    }
}

/// The kernel over ctnetlink and rtnetlink.
pub(super) struct NetlinkKernel {
    pub(super) ct: CtSocket,
    pub(super) routes: HashMap<IpAddr, u32>,
    /// The interfaces' addresses, read when first needed in a tick.
    pub(super) addrs: Option<Vec<(u32, IpAddr)>>,
    /// When the policy rules were read (`CLOCK_MONOTONIC` ns), whether
    /// IPv4's and IPv6's route by more than the destination, and their
    /// hash.
    pub(super) policy: Option<(u64, [bool; 2], u64)>,
    pub(super) ipsec: IpsecSeen,
    /// The egress witness (offload mode), attached at the first ask (the
    /// session's opening).
    pub(super) witness: super::egress_witness::Witness,
    /// The neighbours' MACs by interface and address, read when first
    /// needed in a tick, and when (`CLOCK_MONOTONIC` ns).
    pub(super) neighbours: Option<(u64, NeighbourMacs)>,
}

/// The `IPsec` policies as the daemon last read them.
#[derive(Default)]
pub(super) struct IpsecSeen {
    policies: Vec<crate::xfrm::Selector>,
    /// Changes with them.
    number: u64,
    /// When they were read (`CLOCK_MONOTONIC` ns; 0: never).
    read_at: u64,
    /// The last read failed (said once per failure in a row).
    failing: bool,
}

/// The neighbours' MACs by interface and address.
pub(super) type NeighbourMacs = HashMap<(u32, IpAddr), [u8; 6]>;

/// How long (ns) a neighbour table read counts as fresh.
const NEIGHBOURS_FRESH_NS: u64 = 100_000_000;

/// How long (ns) the policy rules read are taken as they were.
const POLICY_RULES_FOR_NS: u64 = 1_000_000_000;

impl Kernel for NetlinkKernel {
    fn refresh(&mut self, orig: &Tuple, timeout: u32, liberal: bool) -> io::Result<()> {
        self.ct.update(orig, Some(timeout), Some(liberal))
    }
    fn conn_now(&mut self, orig: &Tuple) -> io::Result<Option<Conn>> {
        self.ct.get(orig)
    }
    fn tcp_now(&mut self, orig: &Tuple) -> io::Result<Option<TcpNow>> {
        Ok(self.ct.get(orig)?.and_then(|c| {
            Some(TcpNow {
                state: c.tcp_state?,
                reply: c.reply,
                scales: c.tcp_wscale.filter(|_| !c.tcp_liberal),
            })
        }))
    }
    fn dump(&mut self) -> io::Result<Vec<Conn>> {
        let dump = self.ct.dump()?;
        // Routes may have changed while events were lost.
        self.routes.clear();
        Ok(dump)
    }
    fn route(&mut self, addr: IpAddr) -> Option<u32> {
        if let Some(&oif) = self.routes.get(&addr) {
            return Some(oif);
        }
        if self.routes.len() >= ROUTE_CACHE_MAX {
            self.routes.clear();
        }
        // Only routes found are kept: an unreachable address or a failed
        // lookup (the WAN's default route gone for a moment) is asked again.
        let oif = netlink::route_oif(addr).ok().flatten()?;
        self.routes.insert(addr, oif);
        Some(oif)
    }
    fn address_of(&mut self, addr: IpAddr, ifindex: u32) -> bool {
        if self.addrs.is_none() {
            self.addrs = netlink::addrs_by_ifindex().ok();
        }
        self.addrs
            .as_ref()
            .is_some_and(|a| a.contains(&(ifindex, addr)))
    }
    fn routing_rules(&mut self) -> ([bool; 2], u64) {
        let now = crate::clock::monotonic_ns();
        match self.policy {
            Some((at, rules, number)) if now.saturating_sub(at) < POLICY_RULES_FOR_NS => {
                (rules, number)
            }
            _ => {
                // Unread rules count as policy routing: each flow's route
                // is asked then, which is right either way; and as a
                // change, so the offloaded flows are looked at again.
                let read = |family| netlink::policy_rules(family).unwrap_or((true, u64::MAX));
                let ((v4, h4), (v6, h6)) = (read(2), read(10));
                let read = ([v4, v6], h4 ^ h6.rotate_left(1));
                self.policy = Some((now, read.0, read.1));
                read
            }
        }
    }
    fn assure(&mut self, orig: &Tuple) -> io::Result<()> {
        self.ct.set_assured(orig)
    }
    fn ipsec_policies(&mut self) -> (&[crate::xfrm::Selector], u64) {
        let now = crate::clock::monotonic_ns();
        let s = &mut self.ipsec;
        if s.read_at == 0 || now.saturating_sub(s.read_at) >= POLICY_RULES_FOR_NS {
            s.read_at = now;
            let read = match crate::xfrm::policies() {
                // A kernel without the xfrm netlink interface: no policy
                // can be set (but through PF_KEY, which nothing here uses).
                Err(e) if e.raw_os_error() == Some(libc::EPROTONOSUPPORT) => Ok(Vec::new()),
                r => r,
            };
            match read {
                Ok(p) => {
                    s.failing = false;
                    if p != s.policies {
                        s.policies = p;
                        s.number += 1;
                    }
                }
                // Kept as they were.
                Err(e) => {
                    if !std::mem::replace(&mut s.failing, true) {
                        tracing::warn!("reading the IPsec policies: {e}; trying again");
                    }
                }
            }
        }
        (&s.policies, s.number)
    }
    fn forward_route(&mut self, q: &netlink::RouteQuery) -> Option<netlink::RouteAnswer> {
        netlink::route_forward(q).ok().flatten()
    }
    fn egress_seen(&mut self, key: &EgressKey) -> Witnessed {
        match self.witness.get() {
            None => Witnessed::NoWitness,
            Some(w) => w.seen(key).map_or(Witnessed::Unseen, Witnessed::Seen),
        }
    }
    fn has_witness(&mut self) -> bool {
        self.witness.get().is_some()
    }
    fn forget_egress(&mut self, key: &EgressKey) {
        self.witness.forget(key);
    }
    fn neighbour_mac(&mut self, ifindex: u32, addr: IpAddr, fresh: bool) -> Option<[u8; 6]> {
        let now = crate::clock::monotonic_ns();
        // Fresh: read again, unless read within the last NEIGHBOURS_FRESH_NS
        // (a burst of decisions reads the table once).
        let stale = match &self.neighbours {
            None => true,
            Some((at, _)) => fresh && now.saturating_sub(*at) >= NEIGHBOURS_FRESH_NS,
        };
        if stale {
            self.neighbours = netlink::neighbours().ok().map(|all| {
                let macs = all
                    .into_iter()
                    .filter_map(|n| Some(((n.ifindex, n.addr), n.mac?)))
                    .collect();
                (now, macs)
            });
        }
        self.neighbours.as_ref()?.1.get(&(ifindex, addr)).copied()
    }
}
