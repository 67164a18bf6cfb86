//! `doctor IFACE...`: the known hazards of XDP on these interfaces, each
//! with a fix. `attach` runs the same checks and warns.
//!
//! - native XDP support of the driver (else `auto` falls back to generic);
//! - generic mode: GRO on the devices below a VLAN, macvlan, bridge or
//!   bond (down to the ports), LRO turned on again on the interface, a
//!   tunnel (merged packets go to the kernel);
//! - an XDP program already attached (router-ctl's own, or a foreign one);
//! - veth: frames redirected into a veth are dropped unless its peer runs
//!   NAPI (an XDP program or GRO on the peer);
//! - veth: a peer with tx checksum offload on sends `CHECKSUM_PARTIAL`
//!   packets, which leave the fast path with wrong checksums;
//! - MTU: with different MTUs, packets larger than the narrower one leave
//!   the fast path; native XDP on a veth needs an MTU that fits one page;
//! - traffic shaping (a shaping qdisc, tc filters or tcx programs), which
//!   the fast path's flows skip;
//! - netfilter forward rules or a forward drop policy (nftables, iptables
//!   legacy), which standalone mode would bypass; an nftables flowtable
//!   (software flow offloading), a second fast path behind XDP's;
//! - an attached interface whose MAC changed since attach: the data path
//!   compares frames' destinations with the MAC attach wrote, so it passes
//!   every frame to the kernel until attach runs again;
//! - standalone mode: the router's own sockets taking local ports
//!   (`net.ipv4.ip_local_port_range`, less `ip_local_reserved_ports`) inside
//!   XDP's `--port-range`; the kernel accepting IPv4 source routes on the
//!   WAN (`accept_source_route`), which would re-route a packet to the WAN
//!   address into the LAN.

use std::{
    fs,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

use serde::Serialize;
use serde_json::json;

use router_common::maps::{Admit, Config, VirtualMacKey};

use crate::{bpfsys, maps::PinnedMaps, netlink, pins::LINK_PINS, shaping, standalone, state, vmac};

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x3;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_GGRO: u32 = 0x2b;
/// `ETHTOOL_GFLAGS`, whose `ETH_FLAG_LRO` bit is the LRO feature.
const ETHTOOL_GFLAGS: u32 = 0x25;
const ETH_FLAG_LRO: u32 = 1 << 15;
/// Interface kinds stacked on one device (`IFLA_LINK`): what that device
/// receives reaches them after its GRO.
const STACKED_ON_LINK: &[&str] = &["vlan", "macvlan", "macvtap", "ipvlan", "ipvtap"];
/// Interface kinds with ports (`IFLA_MASTER` of each port): what the ports
/// receive reaches them after the ports' GRO.
const WITH_PORTS: &[&str] = &["bridge", "bond", "team"];
/// Largest MTU for native XDP on a veth without multi-buffer support
/// (one page minus headroom and `skb_shared_info`).
const VETH_XDP_MAX_MTU: u32 = 3498;

/// Drivers with native (driver-mode) XDP in mainline Linux.
const NATIVE_XDP_DRIVERS: &[&str] = &[
    "veth",
    "virtio_net",
    "tun",
    "ixgbe",
    "ixgbevf",
    "i40e",
    "ice",
    "igb",
    "igc",
    "mlx4_en",
    "mlx5_core",
    "bnxt_en",
    "nfp",
    "qede",
    "ena",
    "nicvf",
    "sfc",
    "mvneta",
    "mvpp2",
    "stmmac",
    "dpaa2-eth",
    "enetc",
    "fec",
    "tsnep",
    "netsec",
    "cpsw",
    "bonding",
    "hv_netvsc",
    "gve",
    "lan966x-switch",
    "mlxbf_gige",
    "atlantic",
    "idpf",
    "octeontx2-nicvf",
    "fbnic",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    const fn tag(self) -> &'static str {
        match self {
            Self::Ok => "[ok]  ",
            Self::Warn => "[warn]",
            Self::Fail => "[FAIL]",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub iface: String,
    pub name: &'static str,
    pub level: Level,
    pub detail: String,
    pub fix: Option<String>,
}

fn ethtool(iface: &str, buf: &mut [u8]) -> std::io::Result<()> {
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is ours.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // struct ifreq: 16-byte name, then a union holding the data pointer.
    let mut ifr = [0u8; 40];
    let n = iface.len().min(15);
    ifr[..n].copy_from_slice(&iface.as_bytes()[..n]);
    ifr[16..24].copy_from_slice(&(buf.as_mut_ptr() as u64).to_ne_bytes());
    // SAFETY: ifr is a valid ifreq whose data points at buf, which is large
    // enough for the command in it.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL, ifr.as_mut_ptr()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The `data` of an `ethtool_value` command `cmd` at `iface`.
fn ethtool_u32(iface: &str, cmd: u32) -> Option<u32> {
    let mut v = [0u8; 8];
    v[0..4].copy_from_slice(&cmd.to_ne_bytes());
    ethtool(iface, &mut v).ok()?;
    Some(u32::from_ne_bytes(v[4..8].try_into().ok()?))
}

fn ethtool_value(iface: &str, cmd: u32) -> Option<bool> {
    ethtool_u32(iface, cmd).map(|v| v != 0)
}

/// Whether LRO is on at `iface` (`None`: ethtool cannot tell).
fn lro(iface: &str) -> Option<bool> {
    ethtool_u32(iface, ETHTOOL_GFLAGS).map(|flags| flags & ETH_FLAG_LRO != 0)
}

/// Tunnel kinds with an Ethernet header: the NIC their packets arrive over
/// (found by routing, not by a link) merges them before decapsulation.
const TUNNELS: &[&str] = &[
    "gretap",
    "ip6gretap",
    "vxlan",
    "geneve",
    "erspan",
    "ip6erspan",
];
/// How deep [`receive_sources`] follows stacked devices (a VLAN on a bond
/// on NICs is three).
const MAX_STACK_DEPTH: usize = 8;

/// Where the packets an interface receives come from, below it.
#[derive(Default)]
struct Sources {
    /// The devices that run NAPI and GRO for it: the leaves under its
    /// VLAN/macvlan/ipvlan links and bridge/bond/team ports (none for a
    /// plain NIC or veth: it is its own source).
    leaves: Vec<netlink::LinkAttrs>,
    /// A lower device in another namespace (its id here), not inspected.
    elsewhere: Option<i32>,
    /// A tunnel among them.
    tunnel: Option<String>,
}

/// [`Sources`] of `l`, walking stacked devices down to the devices that
/// run GRO (a bridge or bond runs none itself).
fn receive_sources(l: &netlink::LinkAttrs) -> Sources {
    fn walk(d: &netlink::LinkAttrs, depth: usize, all: &[netlink::LinkAttrs], out: &mut Sources) {
        let kind = d.kind.as_deref().unwrap_or_default();
        if TUNNELS.contains(&kind) {
            out.tunnel.get_or_insert_with(|| d.name.clone());
            return;
        }
        let lower: Vec<&netlink::LinkAttrs> = if STACKED_ON_LINK.contains(&kind) {
            if let Some(id) = d.link_netnsid {
                out.elsewhere.get_or_insert(id);
                return;
            }
            all.iter().filter(|x| Some(x.ifindex) == d.link).collect()
        } else if WITH_PORTS.contains(&kind) {
            all.iter().filter(|x| x.master == Some(d.ifindex)).collect()
        } else {
            if depth > 0 && !out.leaves.iter().any(|x| x.ifindex == d.ifindex) {
                out.leaves.push(d.clone());
            }
            return;
        };
        if depth < MAX_STACK_DEPTH {
            for x in lower {
                walk(x, depth + 1, all, out);
            }
        }
    }
    let mut out = Sources::default();
    let kind = l.kind.as_deref().unwrap_or_default();
    if STACKED_ON_LINK.contains(&kind) || WITH_PORTS.contains(&kind) || TUNNELS.contains(&kind) {
        walk(l, 0, &netlink::links().unwrap_or_default(), &mut out);
    }
    out
}

/// Whether the program runs (or an attach puts it) in generic mode: as
/// attached (`attached`: generic or not), else as asked (`asked`:
/// `Some(true)` generic, `Some(false)` native), else `--mode auto`'s
/// fallback where the driver has no native XDP (`falls_back`).
fn runs_generic(
    attached: Option<bool>,
    asked: Option<bool>,
    falls_back: impl FnOnce() -> bool,
) -> bool {
    attached.or(asked).unwrap_or_else(falls_back)
}

/// Whether `iface`'s driver is not one known to run native XDP (`auto`
/// falls back to generic there).
fn driver_lacks_native_xdp(iface: &str) -> bool {
    driver(iface).is_none_or(|d| !NATIVE_XDP_DRIVERS.contains(&d.as_str()))
}

fn driver(iface: &str) -> Option<String> {
    let mut v = [0u8; 256];
    v[0..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
    ethtool(iface, &mut v).ok()?;
    let d = &v[4..36];
    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
    Some(String::from_utf8_lossy(&d[..end]).into_owned())
}

/// What we learn about a veth's peer.
struct Peer {
    /// `netns NAME` or `this namespace`.
    place: String,
    /// The command prefix to run a fix there.
    exec: String,
    attrs: netlink::LinkAttrs,
    gro: Option<bool>,
    tx_csum: Option<bool>,
}

fn peer_info(idx: u32) -> (Option<netlink::LinkAttrs>, Option<bool>, Option<bool>) {
    let attrs = netlink::link(idx).ok();
    let (gro, tx) = attrs.as_ref().map_or((None, None), |a| {
        (
            ethtool_value(&a.name, ETHTOOL_GGRO),
            ethtool_value(&a.name, ETHTOOL_GTXCSUM),
        )
    });
    (attrs, gro, tx)
}

/// Finds a veth's peer: in this namespace, or in the named namespace
/// (`/run/netns/*`) whose id here is `nsid`.
fn find_peer(l: &netlink::LinkAttrs) -> Option<Peer> {
    let peer_idx = l.link?;
    let Some(nsid) = l.link_netnsid else {
        let (attrs, gro, tx_csum) = peer_info(peer_idx);
        return Some(Peer {
            place: "this namespace".into(),
            exec: String::new(),
            attrs: attrs?,
            gro,
            tx_csum,
        });
    };
    let entries = fs::read_dir("/run/netns").ok()?;
    for e in entries.flatten() {
        let path = e.path();
        let Ok(f) = fs::File::open(&path) else {
            continue;
        };
        if netlink::nsid_of(f.as_raw_fd()).ok().flatten() != Some(nsid) {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let found = std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: valid fd; CLONE_NEWNET affects only this thread.
                if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return None;
                }
                let (attrs, gro, tx) = peer_info(peer_idx);
                Some((attrs?, gro, tx))
            })
            .join()
            .ok()
            .flatten()
        });
        let (attrs, gro, tx_csum) = found?;
        return Some(Peer {
            place: format!("netns {name}"),
            exec: format!("ip netns exec {name} "),
            attrs,
            gro,
            tx_csum,
        });
    }
    None
}

/// Program ids of router-ctl's links in `pin_dir`.
fn our_progs(pin_dir: &Path) -> Vec<u32> {
    LINK_PINS
        .iter()
        .filter_map(|p| {
            let fd = bpfsys::obj_get(&pin_dir.join(p)).ok()?;
            bpfsys::link_info(std::os::fd::AsFd::as_fd(&fd))
                .ok()
                .map(|i| i.prog_id)
        })
        .collect()
}

/// The virtual MACs of both attached interfaces: those the VRRP macvlans
/// say this router is the master of, and those the data path accepts.
struct VirtualMacs {
    want: Vec<vmac::VirtualMac>,
    pinned: Vec<(VirtualMacKey, u8)>,
}

impl VirtualMacs {
    /// Read once for all interfaces (two rtnetlink dumps and a map walk);
    /// `None` if either cannot be read.
    fn read(cfg: &Config, maps: &PinnedMaps) -> Option<Self> {
        Some(Self {
            want: vmac::current([cfg.lan_ifindex, cfg.wan_ifindex]).ok()?,
            pinned: vmac::pinned(maps).ok()?,
        })
    }
}

impl Report<'_> {
    /// On an attached interface with VRRP macvlans (keepalived `use_vmac`):
    /// whether the virtual MACs the data path accepts are those of the
    /// instances this router is the master of.
    fn virtual_macs(&mut self, l: &netlink::LinkAttrs, vm: &VirtualMacs) {
        let VirtualMacs { want, pinned } = vm;
        let mut want: Vec<_> = want
            .iter()
            .filter(|v| v.ifindex == l.ifindex)
            .map(|v| (v.mac, v.families))
            .collect();
        let mut have: Vec<_> = pinned
            .iter()
            .filter(|(k, _)| k.ifindex == l.ifindex)
            .map(|(k, f)| (k.mac, *f))
            .collect();
        if want.is_empty() && have.is_empty() {
            return;
        }
        want.sort_unstable();
        have.sort_unstable();
        let list = |v: &[([u8; 6], u8)]| {
            v.iter()
                .map(|(m, f)| format!("{} ({})", netlink::mac_str(*m), vmac::families_str(*f)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        if want == have {
            self.add(
                "virtual-macs",
                Level::Ok,
                format!(
                    "the data path forwards frames to the VRRP virtual MAC(s) {} (this router is their master)",
                    list(&have)
                ),
                None,
            );
            return;
        }
        self.add(
            "virtual-macs",
            Level::Warn,
            format!(
                "the data path accepts the virtual MAC(s) [{}] but the VRRP macvlans say [{}]: \
                 frames to a missing one go to the kernel (slow but correct); frames to an \
                 extra one are forwarded although this router is not their master",
                list(&have),
                list(&want)
            ),
            Some(
                "run `router-ctl run` (it follows keepalived's changes), or the same \
                 `router-ctl attach` again"
                    .to_owned(),
            ),
        );
    }
}

/// Every check for `ifaces` (names in the current namespace).
#[must_use]
pub fn checks(ifaces: &[String], pin_dir: &Path) -> Vec<Check> {
    checks_for(ifaces, pin_dir, None)
}

/// [`checks`], for an attach that asks for generic mode (`Some(true)`),
/// native mode (`Some(false)`) or `auto` (`None`: native, generic where
/// the driver has none); an attached program's own mode comes first.
fn checks_for(ifaces: &[String], pin_dir: &Path, generic_asked: Option<bool>) -> Vec<Check> {
    let ours = our_progs(pin_dir);
    let attached = PinnedMaps::at(pin_dir)
        .read_config()
        .ok()
        .filter(|c| c.lan_ifindex != 0);
    let mut out = Vec::new();
    let mut mtus: Vec<(String, u32)> = Vec::new();
    // Read at the first attached interface checked.
    let mut virtual_macs: Option<Option<VirtualMacs>> = None;
    for iface in ifaces {
        let mut r = Report {
            iface,
            out: &mut out,
        };
        if let Some(l) = r.link() {
            mtus.push((iface.clone(), l.mtu));
            r.forwarding();
            r.driver();
            r.programs(&l, &ours);
            r.aggregates_in_generic_mode(&l, &ours, generic_asked);
            r.shaping(&l);
            if l.kind.as_deref() == Some("veth") {
                r.veth(&l);
            }
            if let Some(cfg) = &attached {
                r.router_mac(&l, cfg);
                if attached_mac(cfg, l.ifindex).is_some()
                    && let Some(vm) = virtual_macs
                        .get_or_insert_with(|| VirtualMacs::read(cfg, &PinnedMaps::at(pin_dir)))
                {
                    r.virtual_macs(&l, vm);
                }
            }
        }
    }
    mtu_mismatches(&mtus, &mut out);
    out
}

/// The checks of one interface, appended to `out`.
struct Report<'a> {
    iface: &'a str,
    out: &'a mut Vec<Check>,
}

impl Report<'_> {
    fn add(&mut self, name: &'static str, level: Level, detail: String, fix: Option<String>) {
        self.out.push(Check {
            iface: self.iface.to_owned(),
            name,
            level,
            detail,
            fix,
        });
    }

    /// Whether the interface exists and is up; its attributes if it exists.
    fn link(&mut self) -> Option<netlink::LinkAttrs> {
        let iface = self.iface;
        let Ok(idx) = netlink::ifindex(iface) else {
            self.add(
                "exists",
                Level::Fail,
                format!("no interface {iface} in this namespace"),
                Some(format!("check the name: {}", crate::ctx::ip_link_hint())),
            );
            return None;
        };
        let Ok(l) = netlink::link(idx) else {
            self.add(
                "exists",
                Level::Fail,
                "rtnetlink does not answer for it".into(),
                None,
            );
            return None;
        };
        let kind = l.kind.clone().unwrap_or_else(|| "device".into());
        self.add(
            "link",
            if l.up { Level::Ok } else { Level::Warn },
            format!(
                "{kind}, ifindex {idx}, MTU {}, {}",
                l.mtu,
                if l.up { "up" } else { "DOWN" }
            ),
            (!l.up).then(|| format!("ip link set dev {iface} up")),
        );
        Some(l)
    }

    /// Whether the kernel forwards what arrives on the interface: with
    /// forwarding off, `bpf_fib_lookup` answers "forwarding disabled" for
    /// every packet from it (counted `pass_fib_forwarding_disabled`), the
    /// data path passes it, and the kernel drops it (Debian's default).
    /// IPv4's is needed, IPv6's only to route IPv6.
    fn forwarding(&mut self) {
        let iface = self.iface;
        let read = |family: &str| {
            fs::read_to_string(format!("/proc/sys/net/{family}/conf/{iface}/forwarding"))
                .ok()
                .map(|t| t.trim() != "0")
        };
        match read("ipv4") {
            Some(true) => self.add("forwarding", Level::Ok, "IPv4 forwarding on".into(), None),
            Some(false) => self.add(
                "forwarding",
                Level::Warn,
                "IPv4 forwarding is off: nothing that arrives here is routed, by XDP or the \
                 kernel (counted pass_fib_forwarding_disabled)"
                    .into(),
                Some("sysctl -w net.ipv4.ip_forward=1, and in /etc/sysctl.d to keep it".into()),
            ),
            None => {}
        }
        if read("ipv6") == Some(false) {
            self.add(
                "forwarding",
                Level::Ok,
                "IPv6 forwarding is off: IPv6 is not routed (to route it: sysctl -w \
                 net.ipv6.conf.all.forwarding=1)"
                    .into(),
                None,
            );
        }
    }

    /// Whether the driver is known to support native XDP.
    fn driver(&mut self) {
        match driver(self.iface).as_deref() {
            Some(d) if NATIVE_XDP_DRIVERS.contains(&d) => self.add(
                "native-xdp",
                Level::Ok,
                format!("driver {d} supports native XDP"),
                None,
            ),
            Some(d) => self.add(
                "native-xdp",
                Level::Warn,
                format!(
                    "driver {d} is not known to support native XDP: --mode auto falls back to \
                     generic mode (slow)"
                ),
                Some(
                    "use a NIC whose driver supports XDP (ixgbe, i40e, ice, mlx5, virtio_net...)"
                        .into(),
                ),
            ),
            None => self.add(
                "native-xdp",
                Level::Warn,
                "no driver information (ethtool): native XDP support unknown".into(),
                None,
            ),
        }
    }

    /// The XDP programs attached: router-ctl's own (`ours`) or foreign.
    fn programs(&mut self, l: &netlink::LinkAttrs, ours: &[u32]) {
        let iface = self.iface;
        let progs = l.xdp.programs();
        if progs.is_empty() {
            self.add(
                "xdp-program",
                Level::Ok,
                "no XDP program attached".into(),
                None,
            );
        }
        for (id, flag) in progs {
            let mode = if flag == netlink::XDP_FLAGS_SKB_MODE {
                "generic"
            } else {
                "native"
            };
            if ours.contains(&id) {
                self.add(
                    "xdp-program",
                    if mode == "generic" {
                        Level::Warn
                    } else {
                        Level::Ok
                    },
                    format!("router-ctl's program {id} runs here in {mode} mode"),
                    (mode == "generic").then(|| {
                        "generic mode is slow; attach with --mode native if the driver supports it"
                            .into()
                    }),
                );
            } else {
                self.add(
                    "xdp-program",
                    Level::Fail,
                    format!("another XDP program (id {id}, {mode} mode) is attached"),
                    Some(format!(
                        "remove it (`ip link set dev {iface} {} off`) or attach with --force",
                        xdp_off_keyword(mode)
                    )),
                );
            }
        }
    }

    /// On an attached interface: whether the MAC the data path compares
    /// frames' destinations with is still the interface's.
    fn router_mac(&mut self, l: &netlink::LinkAttrs, cfg: &Config) {
        let Some(written) = attached_mac(cfg, l.ifindex) else {
            return;
        };
        let iface = self.iface;
        if l.mac == Some(written) {
            self.add(
                "router-mac",
                Level::Ok,
                format!(
                    "the data path forwards frames addressed to {}",
                    netlink::mac_str(written)
                ),
                None,
            );
            return;
        }
        let now = l.mac.map_or_else(|| "none".to_owned(), netlink::mac_str);
        self.add(
            "router-mac",
            Level::Fail,
            format!(
                "the MAC changed since attach (now {now}, the data path still expects {}): \
                 the data path passes every frame addressed to {now} to the kernel (counted \
                 as pass_not_for_us): slow but correct",
                netlink::mac_str(written)
            ),
            Some(format!(
                "run the same `router-ctl attach` again: it writes {iface}'s new MAC in place \
                 (flows kept); a running `router-ctl run` does so by itself as soon as it \
                 sees the change"
            )),
        );
    }

    /// Merged packets where the program runs in generic mode (or would: a
    /// driver without native XDP, where `--mode auto` falls back). The
    /// kernel skips GRO on the interface that has a generic XDP program
    /// (`netif_elide_gro`) and turns LRO and hardware GRO off there and
    /// (LRO) below it when the program is installed, so a NIC's own packets
    /// arrive as the wire carried them. Not so on a VLAN, macvlan, ipvlan,
    /// bridge, bond or team: the devices below (the ports) run GRO before
    /// the upper interface's generic hook, which then sees packets larger
    /// than its link; nor on a tunnel, whose packets the NIC they arrive
    /// over merges; and LRO turned on again after attach merges on the
    /// interface itself. Such packets go to the kernel untranslated
    /// (`pass_mtu`): a standalone flow's reach the router's own stack,
    /// which resets TCP. Hardware GRO (`rx-gro-hw`) is not read here.
    fn aggregates_in_generic_mode(
        &mut self,
        l: &netlink::LinkAttrs,
        ours: &[u32],
        generic_asked: Option<bool>,
    ) {
        let ours_mode = l
            .xdp
            .programs()
            .into_iter()
            .find(|(id, _)| ours.contains(id))
            .map(|(_, flag)| flag == netlink::XDP_FLAGS_SKB_MODE);
        if !runs_generic(ours_mode, generic_asked, || {
            driver_lacks_native_xdp(self.iface)
        }) {
            return;
        }
        let iface = self.iface;
        let mut merging = Vec::new();
        // Before attach LRO is no hazard: installing the program turns it
        // off here and below.
        if ours_mode == Some(true) && lro(iface) == Some(true) {
            merging.push((iface.to_owned(), "lro off"));
        }
        let sources = receive_sources(l);
        for d in &sources.leaves {
            if ethtool_value(&d.name, ETHTOOL_GGRO) == Some(true) {
                merging.push((d.name.clone(), "gro off"));
            }
        }
        let mut unknown = Vec::new();
        if let Some(id) = sources.elsewhere {
            unknown.push(format!(
                "a device below it is in another namespace (id {id} here): its GRO merges \
                 packets unless it is off there"
            ));
        }
        if let Some(t) = &sources.tunnel {
            unknown.push(format!(
                "{t} is a tunnel: GRO on the NIC its packets arrive over merges them before \
                 they are decapsulated"
            ));
        }
        if merging.is_empty() && unknown.is_empty() {
            let below = if sources.leaves.is_empty() {
                String::new()
            } else {
                let names: Vec<&str> = sources.leaves.iter().map(|d| d.name.as_str()).collect();
                format!(
                    "; GRO is off on the devices it receives from ({})",
                    names.join(", ")
                )
            };
            self.add(
                "generic-aggregates",
                Level::Ok,
                format!(
                    "generic mode sees packets as the link carried them: the kernel runs no GRO \
                     on an interface with a generic XDP program{below}"
                ),
                None,
            );
            return;
        }
        let mut detail = Vec::new();
        if !merging.is_empty() {
            let names: Vec<&str> = merging.iter().map(|(n, _)| n.as_str()).collect();
            detail.push(format!(
                "in generic mode the program sees the packets that {} merged (GRO or LRO), \
                 larger than the link",
                names.join(" and ")
            ));
        }
        detail.extend(unknown);
        let mut fix: Vec<String> = merging
            .iter()
            .map(|(n, off)| format!("ethtool -K {n} {off}"))
            .collect();
        if sources.elsewhere.is_some() || sources.tunnel.is_some() {
            fix.push("ethtool -K <that device> gro off".into());
        }
        self.add(
            "generic-aggregates",
            Level::Warn,
            format!(
                "{}: merged packets go to the kernel untranslated (standalone mode: the \
                 router's own stack takes a flow's, and TCP connections reset; offload mode: \
                 the slow path carries them). To keep GRO off across reboots: a systemd .link \
                 file (GenericReceiveOffload=false) or the distribution's equivalent",
                detail.join("; ")
            ),
            Some(fix.join("; ")),
        );
    }

    /// Traffic shaping and tc rules the fast path's flows skip
    /// (`shaping`; see [`shaping`]).
    fn shaping(&mut self, l: &netlink::LinkAttrs) {
        let iface = self.iface;
        match shaping::TcSeen::read(l.ifindex) {
            Err(e) => self.add(
                "shaping",
                Level::Warn,
                format!("cannot read the qdiscs and tc filters ({e}): not known to be absent"),
                Some(format!(
                    "tc qdisc show dev {iface}; tc filter show dev {iface} ingress"
                )),
            ),
            Ok(seen) => {
                let skipped = seen.skipped();
                if skipped.is_empty() {
                    self.add(
                        "shaping",
                        Level::Ok,
                        "no traffic shaping or tc rules for the fast path to skip".into(),
                        None,
                    );
                } else {
                    self.add(
                        "shaping",
                        Level::Warn,
                        shaping::message(&skipped),
                        Some(seen.fix(iface)),
                    );
                }
            }
        }
    }

    /// A veth's peer (NAPI for redirected frames, checksums it sends) and
    /// the MTU native XDP on a veth allows.
    fn veth(&mut self, l: &netlink::LinkAttrs) {
        let iface = self.iface;
        match find_peer(l) {
            None => self.add(
                "veth-peer",
                Level::Warn,
                format!(
                    "cannot inspect the veth peer (ifindex {:?}, netns id {:?}): it is in a \
                     namespace without a name in /run/netns",
                    l.link, l.link_netnsid
                ),
                Some("on the peer: `ethtool -K PEER gro on` and `ethtool -K PEER tx off`".into()),
            ),
            Some(p) => {
                let pn = p.attrs.name.clone();
                let peer_xdp = !p.attrs.xdp.programs().is_empty();
                if peer_xdp || p.gro == Some(true) {
                    self.add(
                        "redirect-target",
                        Level::Ok,
                        format!(
                            "peer {pn} ({}) runs NAPI ({}): redirected frames are accepted",
                            p.place,
                            if peer_xdp { "an XDP program" } else { "GRO on" }
                        ),
                        None,
                    );
                } else {
                    self.add(
                        "redirect-target",
                        Level::Fail,
                        format!(
                            "peer {pn} ({}) has neither an XDP program nor GRO: frames the \
                             fast path redirects into {iface} are dropped",
                            p.place
                        ),
                        Some(format!("{}ethtool -K {pn} gro on", p.exec)),
                    );
                }
                match p.tx_csum {
                    Some(true) => self.add(
                        "tx-checksum",
                        Level::Warn,
                        format!(
                            "peer {pn} ({}) has tx checksum offload on: it sends partial \
                             checksums, which the fast path forwards unfinished (TCP \
                             through the router stalls)",
                            p.place
                        ),
                        Some(format!("{}ethtool -K {pn} tx off", p.exec)),
                    ),
                    Some(false) => self.add(
                        "tx-checksum",
                        Level::Ok,
                        format!("peer {pn} sends complete checksums (tx offload off)"),
                        None,
                    ),
                    None => {}
                }
            }
        }
        if l.mtu > VETH_XDP_MAX_MTU {
            self.add(
                "mtu",
                Level::Warn,
                format!(
                    "MTU {} is above {VETH_XDP_MAX_MTU}: native XDP on a veth fails (the \
                     program has no multi-buffer support); auto falls back to generic",
                    l.mtu
                ),
                Some(format!("ip link set dev {iface} mtu 1500")),
            );
        }
    }
}

/// Interfaces whose MTU differs from the first one's.
fn mtu_mismatches(mtus: &[(String, u32)], out: &mut Vec<Check>) {
    if let Some((first, m0)) = mtus.first().cloned() {
        for (other, m) in &mtus[1..] {
            if *m != m0 {
                let lo = m0.min(*m);
                out.push(Check {
                    iface: other.clone(),
                    name: "mtu-mismatch",
                    level: Level::Warn,
                    detail: format!(
                        "MTU {m} differs from {first}'s {m0}: packets above {lo} bytes leave \
                         the fast path (fragmented by the kernel, or answered with ICMP \
                         fragmentation needed); TCP stays below it when SYNs are MSS-clamped \
                         (standalone mode does so \
                         unless `--clamp-mss off`; offload mode: the firewall's `tcp option \
                         maxseg size set rt mtu` or `TCPMSS --clamp-mss-to-pmtu` rule)"
                    ),
                    fix: Some(format!(
                        "ip link set dev {} mtu {lo} (make the MTUs equal), or clamp the \
                         MSS as said",
                        if *m > m0 { other } else { &first }
                    )),
                });
            }
        }
    }
}

/// The MAC the data path expects on `ifindex`, if it is an attached
/// interface.
fn attached_mac(cfg: &Config, ifindex: u32) -> Option<[u8; 6]> {
    if ifindex == cfg.lan_ifindex {
        Some(cfg.lan_mac)
    } else if ifindex == cfg.wan_ifindex {
        Some(cfg.wan_mac)
    } else {
        None
    }
}

/// Warnings `attach` prints before it changes anything (foreign programs
/// are checked separately), for an attach in the mode asked (see
/// [`checks_for`]).
#[must_use]
pub fn attach_warnings(lan: &str, wan: &str, generic_asked: Option<bool>) -> Vec<String> {
    let ifaces = [lan.to_owned(), wan.to_owned()];
    checks_for(&ifaces, Path::new("/nonexistent"), generic_asked)
        .into_iter()
        .filter(|c| matches!(c.level, Level::Warn | Level::Fail) && c.name != "xdp-program")
        .map(Check::line)
        .collect()
}

/// Whether a native attach to `iface` is expected to fail (auto then
/// falls back): a driver without native XDP, or a veth whose MTU needs
/// multi-buffer support.
fn native_attach_fails(iface: &str) -> bool {
    if driver_lacks_native_xdp(iface) {
        return true;
    }
    netlink::ifindex(iface)
        .ok()
        .and_then(|i| netlink::link(i).ok())
        .is_some_and(|l| l.kind.as_deref() == Some("veth") && l.mtu > VETH_XDP_MAX_MTU)
}

/// What keeps the fast path from forwarding at all after a native attach
/// (`generic_asked` not `Some(true)`): a veth whose peer would drop every
/// frame redirected into it (`redirect-target`). `attach` refuses over it
/// unless forced; a generic program's redirect transmits an skb, which the
/// peer takes.
#[must_use]
pub fn attach_blockers(lan: &str, wan: &str, generic_asked: Option<bool>) -> Vec<String> {
    // Auto falls back on both interfaces when either has no native XDP
    // (predicted by its driver, or a veth's MTU).
    let generic = generic_asked.unwrap_or_else(|| [lan, wan].into_iter().any(native_attach_fails));
    if generic {
        return Vec::new();
    }
    let ifaces = [lan.to_owned(), wan.to_owned()];
    checks_for(&ifaces, Path::new("/nonexistent"), generic_asked)
        .into_iter()
        .filter(|c| c.level == Level::Fail && c.name == "redirect-target")
        .map(Check::line)
        .collect()
}

impl Check {
    /// The check as one line of a command's warnings: where, what, the fix.
    #[must_use]
    pub fn line(self) -> String {
        format!(
            "{}: {}{}",
            self.iface,
            self.detail,
            self.fix.map_or(String::new(), |f| format!(" (fix: {f})"))
        )
    }
}

/// The warning for an nftables flowtable `f` ([`standalone::flowtables`]),
/// in offload mode or not.
fn flowtable_check(f: &standalone::Flowtable, offload: bool) -> Check {
    let how = if f.hardware {
        "the NIC forwards its flows before XDP sees them: they skip the fast path and \
         router-ctl's counts"
    } else if offload {
        "a second fast path after XDP's (at the ingress hook): it takes each connection \
         before the daemon offloads it, and its teardown later rewrites the connection's \
         conntrack entry under the daemon"
    } else {
        "a second fast path after XDP's (at the ingress hook): it holds only what XDP \
         leaves to the kernel"
    };
    Check {
        iface: "netfilter".into(),
        name: "flowtable",
        level: Level::Warn,
        detail: format!(
            "nftables {} (software flow offloading): {how}; router-ctl is not tested \
             alongside one",
            f.describe()
        ),
        fix: Some(
            "turn flow offloading off (OpenWrt: Network -> Firewall -> Software flow \
             offloading; fw4's flow_offloading and flow_offloading_hw options), so that one \
             fast path carries each flow"
                .into(),
        ),
    }
}

/// The warning of the router's own source NAT rules `own_nat`, which
/// standalone mode's slow path competes with; its fix says it is for
/// standalone mode only unless the router is attached so (`standalone`).
fn source_nat_check(own_nat: &[String], standalone: bool) -> Check {
    Check {
        iface: "netfilter".into(),
        name: "source-nat",
        level: Level::Warn,
        detail: format!(
            "standalone mode (--admit xdp): {}",
            standalone::source_nat_message(own_nat)
        ),
        // Before any attach the owner may be about to deploy offload
        // mode, which needs exactly those rules: the fix says which mode
        // it is for.
        fix: Some(format!(
            "{}remove the router's own masquerade/snat rules for LAN->WAN traffic, or \
             attach with --no-kernel-nat and give them ports outside XDP's --port-range",
            if standalone {
                ""
            } else {
                "only for standalone mode (offload mode, the default, needs them): "
            }
        )),
    }
}

/// The router's netfilter forward rules, which standalone mode
/// (`--admit xdp`) would bypass (offload mode keeps them in charge: on a
/// router attached in offload mode they are fine). Reported under the
/// name `netfilter`.
#[must_use]
pub fn firewall_checks(netns: Option<&str>, pin_dir: &Path) -> Vec<Check> {
    let mode = PinnedMaps::at(pin_dir)
        .read_config()
        .ok()
        .filter(|c| c.lan_ifindex != 0)
        .map(|c| c.admit);
    let offload = mode == Some(Admit::Kernel as u8);
    let standalone = mode == Some(Admit::Xdp as u8);
    // Attached with --no-kernel-nat: the router's own NAT rule is the slow
    // path, as docs/standalone.md asks.
    let own_slow_path = state::load(netns).ok().flatten().is_some_and(|r| {
        r.config.admit == crate::config::AdmitMode::Xdp && r.config.kernel_nat_ports.is_none()
    });
    let ruleset = standalone::Ruleset::read();
    let (chains, notes) = standalone::forward_chains(&ruleset);
    let mut out: Vec<Check> = notes
        .into_iter()
        .map(|n| Check {
            iface: "netfilter".into(),
            name: "forward-rules",
            level: Level::Warn,
            detail: n.why,
            fix: None,
        })
        .collect();
    if chains.is_empty() {
        out.push(Check {
            iface: "netfilter".into(),
            name: "forward-rules",
            level: Level::Ok,
            detail: "no forward, prerouting or postrouting filter rules, and no drop policy: \
                     standalone mode bypasses none"
                .into(),
            fix: None,
        });
    }
    // Standalone mode's slow-path table competes with source NAT rules of
    // the router's own; offload mode's NAT is the router's own.
    let own_nat = if offload || own_slow_path {
        Vec::new()
    } else {
        standalone::foreign_source_nat(&ruleset)
    };
    if !own_nat.is_empty() {
        out.push(source_nat_check(&own_nat, standalone));
    }
    // Every one: a flowtable lists the ports and lower devices (a bridge's
    // ports, a VLAN's parent), not the interface XDP is attached to.
    out.extend(
        standalone::flowtables(&ruleset)
            .iter()
            .map(|f| flowtable_check(f, offload)),
    );
    for c in chains {
        if offload {
            out.push(Check {
                iface: "netfilter".into(),
                name: "forward-rules",
                level: Level::Ok,
                detail: format!(
                    "{}: in charge (offload mode: the kernel admits every flow)",
                    c.describe()
                ),
                fix: None,
            });
            continue;
        }
        out.push(Check {
            iface: "netfilter".into(),
            name: "forward-rules",
            level: Level::Warn,
            detail: if standalone {
                format!(
                    "{}: BYPASSED: this router runs standalone mode (--admit xdp), which \
                     admits flows itself",
                    c.describe()
                )
            } else {
                format!(
                    "{}: standalone mode (--admit xdp) would bypass it (attach refuses \
                     without --bypass-forward-rules)",
                    c.describe()
                )
            },
            fix: Some(
                "use offload mode (`attach --admit kernel`, the default): the firewall keeps \
                 deciding, `router-ctl run` moves admitted flows onto the fast path"
                    .into(),
            ),
        });
    }
    out
}

/// What an attached router misses while no `router-ctl run` follows it
/// (`daemon_running`: its status file's heartbeat is fresh): a warning,
/// in either mode.
#[must_use]
pub fn daemon_check(pin_dir: &Path, daemon_running: bool) -> Option<Check> {
    if daemon_running {
        return None;
    }
    let cfg = PinnedMaps::at(pin_dir)
        .read_config()
        .ok()
        .filter(|c| c.lan_ifindex != 0)?;
    Some(unfollowed_router(cfg.admit == Admit::Kernel as u8))
}

/// The warning of [`daemon_check`] for offload (`kernel_mode`) or
/// standalone mode.
fn unfollowed_router(kernel_mode: bool) -> Check {
    let missed = if kernel_mode {
        "no connection is offloaded (the kernel forwards every flow once the leases of those \
         offloaded end)"
    } else {
        "the fast path keeps forwarding, but a next hop that changes its MAC without telling \
         (a replaced gateway or LAN host) keeps getting its frames for good (nothing \
         re-validates the neighbours only it uses), and a new MAC or WAN address of the \
         attached interfaces, a VRRP transition or a removed kernel side is not followed"
    };
    Check {
        iface: "daemon".into(),
        name: "not-running",
        level: Level::Warn,
        detail: format!(
            "no `router-ctl run` is running (no fresh heartbeat in its status file): {missed}"
        ),
        fix: Some(
            "start it: `router-ctl run` (as a service: examples/systemd/xdp-router.service)"
                .to_owned(),
        ),
    }
}

/// keepalived `use_vmac` needs `router-ctl run`: `attach` writes the
/// virtual MACs once, the daemon follows each VRRP transition. Checked
/// when none runs (`daemon_running`: its status file's heartbeat is
/// fresh) on an attached router.
#[must_use]
pub fn vrrp_daemon_check(pin_dir: &Path, daemon_running: bool) -> Option<Check> {
    if daemon_running {
        return None;
    }
    let maps = PinnedMaps::at(pin_dir);
    let cfg = maps.read_config().ok().filter(|c| c.lan_ifindex != 0)?;
    // Unreadable (no map: attached by an earlier router-ctl): none.
    let accepted = vmac::pinned(&maps).map_or(0, |v| v.len());
    let links = netlink::links().unwrap_or_default();
    let macvlans: Vec<String> = vmac::vrrp_macvlans(&links, [cfg.lan_ifindex, cfg.wan_ifindex])
        .map(|(l, _)| l.name.clone())
        .collect();
    unfollowed_virtual_macs(accepted, &macvlans)
}

/// The warning when no daemon follows keepalived: the data path accepts
/// `accepted` virtual MACs, or `macvlans` (VRRP macvlans on the attached
/// interfaces) exist; nothing without either.
fn unfollowed_virtual_macs(accepted: usize, macvlans: &[String]) -> Option<Check> {
    if accepted == 0 && macvlans.is_empty() {
        return None;
    }
    let mut what = Vec::new();
    if accepted > 0 {
        what.push(format!(
            "the data path forwards frames to {accepted} VRRP virtual MAC(s)"
        ));
    }
    if !macvlans.is_empty() {
        what.push(format!(
            "keepalived's use_vmac macvlan(s) {} sit on the attached interfaces",
            macvlans.join(", ")
        ));
    }
    Some(Check {
        iface: "daemon".into(),
        name: "virtual-macs",
        level: Level::Warn,
        detail: format!(
            "no `router-ctl run` is running (no fresh heartbeat in its status file), and {}: \
             the virtual MACs stay as the last attach wrote them; after a VRRP transition the \
             new master's frames go the slow way and the former master's XDP keeps forwarding \
             the frames a switch floods to it",
            what.join(" and ")
        ),
        fix: Some(
            "run `router-ctl run` (examples/systemd/xdp-router.service does): it follows \
             keepalived's changes"
                .to_owned(),
        ),
    })
}

/// Where the kernel lists the local ports of this network namespace's
/// sockets (`net.ipv4.ip_local_port_range`, one per namespace).
const LOCAL_PORT_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// The ports this namespace's sockets never take automatically (an
/// explicit `bind` still may): `net.ipv4.ip_local_reserved_ports`.
const LOCAL_RESERVED_PORTS: &str = "/proc/sys/net/ipv4/ip_local_reserved_ports";

/// `LOW\tHIGH` of [`LOCAL_PORT_RANGE`].
fn parse_local_port_range(s: &str) -> Option<(u16, u16)> {
    let mut it = s.split_ascii_whitespace().map(str::parse::<u16>);
    match (it.next(), it.next(), it.next()) {
        (Some(Ok(lo)), Some(Ok(hi)), None) if lo <= hi => Some((lo, hi)),
        _ => None,
    }
}

/// `8080,9000-9100` of [`LOCAL_RESERVED_PORTS`] (an empty line: none).
fn parse_reserved_ports(s: &str) -> Option<Vec<(u16, u16)>> {
    let s = s.trim();
    if s.is_empty() {
        return Some(Vec::new());
    }
    s.split(',')
        .map(|r| {
            let (lo, hi) = r.split_once('-').unwrap_or((r, r));
            let (lo, hi) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
            (lo <= hi).then_some((lo, hi))
        })
        .collect()
}

/// The configuration of the router pinned under `pin_dir` if it is
/// attached in standalone mode (`--admit xdp`), which the router-wide
/// checks of that mode ask.
fn standalone_config(pin_dir: &Path) -> Option<Config> {
    PinnedMaps::at(pin_dir)
        .read_config()
        .ok()
        .filter(|c| c.lan_ifindex != 0 && c.admit == Admit::Xdp as u8)
}

/// Standalone mode only (`--admit xdp`; in offload mode the kernel's NAT
/// knows the router's own sockets): whether those take local ports inside
/// XDP's range. The router of `netns` (the one this process runs in).
#[must_use]
pub fn local_ports_check(netns: Option<&str>, pin_dir: &Path) -> Option<Check> {
    let cfg = standalone_config(pin_dir)?;
    // The kernel NAT's ports are only in the attach record (`None`: it
    // has none, or --no-kernel-nat).
    let kernel_nat = state::load(netns)
        .ok()
        .flatten()
        .and_then(|r| r.config.kernel_nat_ports);
    Some(local_ports_now((cfg.port_min, cfg.port_max), kernel_nat))
}

/// Standalone mode only: whether the kernel accepts IPv4 source routes
/// (LSRR/SSRR options) arriving on the WAN. It does when
/// `accept_source_route` is on for both `all` and the interface (Linux's
/// default is off), and then re-routes a packet addressed to the WAN
/// address along the route its options name, into the LAN: the data path
/// leaves packets for the WAN address to the kernel, and standalone mode
/// has no firewall behind it, so any WAN host would reach any LAN host.
#[must_use]
pub fn source_route_check(pin_dir: &Path) -> Option<Check> {
    let cfg = standalone_config(pin_dir)?;
    let wan = netlink::ifname(cfg.wan_ifindex)?;
    let on = |conf: &str| {
        fs::read_to_string(format!(
            "/proc/sys/net/ipv4/conf/{conf}/accept_source_route"
        ))
        .ok()
        .map(|t| t.trim() != "0")
    };
    Some(source_route_verdict(&wan, on("all")?, on(&wan)?))
}

/// Policy rules that select by what the data path's FIB lookup carries
/// only in part (mark, ports, user), reported under `routing` as
/// `policy-rules`. Standalone mode: the flows XDP admits take the way of
/// an unmarked, portless packet (a warning). Offload mode: the daemon
/// routes each connection as the kernel does and leaves those that differ
/// in the kernel; it carries IPv4 connections routed by their ct mark
/// with the mark where this kernel's `bpf_fib_lookup` takes one (Linux
/// 6.10) and `ROUTE_MARKS` is pinned (else a warning: they stay on the
/// slow path). `None` when not attached, or with the rules unreadable.
#[must_use]
pub fn policy_rules_check(pin_dir: &Path) -> Option<Check> {
    let maps = PinnedMaps::at(pin_dir);
    let cfg = maps.read_config().ok().filter(|c| c.lan_ifindex != 0)?;
    let n = netlink::rules_beyond_fib(2).ok()? + netlink::rules_beyond_fib(10).ok()?;
    let check = |level, detail: String, fix: Option<&str>| Check {
        iface: "routing".to_owned(),
        name: "policy-rules",
        level,
        detail,
        fix: fix.map(str::to_owned),
    };
    if n == 0 {
        return Some(check(
            Level::Ok,
            "no policy rule selects by mark, port or user".to_owned(),
            None,
        ));
    }
    let rules = format!("{n} policy rule(s) select by mark, port or user (ip rule)");
    if cfg.admit == Admit::Xdp as u8 {
        return Some(check(
            Level::Warn,
            format!(
                "{rules}, which the fast path's route lookups do not carry: the flows \
                 standalone mode admits take the way of an unmarked packet without ports (by \
                 source, destination and incoming interface they are routed as the kernel \
                 routes them)"
            ),
            Some(
                "router-ctl attach LAN WAN --admit kernel (offload mode routes each connection \
                 as the kernel does and leaves those that differ in the kernel)",
            ),
        ));
    }
    let kept = "the daemon leaves each connection the kernel routes otherwise than the fast \
                path would in the kernel";
    Some(match router_common::bpf_insn::fib_lookup_takes_a_mark() {
        Ok(true) if maps.route_marks().is_ok() => check(
            Level::Ok,
            format!(
                "{rules}: {kept}; IPv4 connections routed by their ct mark are carried with it \
                 (BPF_FIB_LOOKUP_MARK), those routed by ports or user, or IPv6 by mark, stay \
                 there"
            ),
            None,
        ),
        Ok(true) => check(
            Level::Warn,
            format!(
                "{rules}: {kept}; ROUTE_MARKS is not pinned (attached by an earlier \
                 router-ctl), so connections routed by their ct mark stay there too"
            ),
            Some("router-ctl attach LAN WAN (a live replace pins it), then restart the daemon"),
        ),
        Ok(false) => check(
            Level::Warn,
            format!(
                "{rules}: {kept}; this kernel's bpf_fib_lookup takes no routing mark \
                 (BPF_FIB_LOOKUP_MARK, Linux 6.10), so connections routed by their ct mark \
                 stay there too (the slow path)"
            ),
            Some("a kernel of Linux 6.10 or later carries them on the fast path"),
        ),
        Err(e) => check(
            Level::Ok,
            format!(
                "{rules}: {kept}; whether this kernel's bpf_fib_lookup takes a routing mark \
                 was not probed ({e}: needs CAP_BPF and CAP_NET_ADMIN)"
            ),
            None,
        ),
    })
}

/// The kernel's `IPsec` policies (xfrm), which the fast path does not apply
/// (`ipsec`, reported for the router under `xfrm`): offload mode leaves
/// the connections they cover in the kernel, so a warning (the fast path
/// carries less); standalone mode admits flows without looking at them,
/// so a failure (covered traffic would leave or arrive in clear). `None`
/// with no policy, or none readable (no xfrm in the kernel).
#[must_use]
pub fn ipsec_check(pin_dir: &Path) -> Option<Check> {
    let policies = crate::xfrm::policies().ok()?;
    Some(ipsec_verdict(
        policies.len(),
        standalone_config(pin_dir).is_some(),
    ))
}

/// [`ipsec_check`]'s verdict for `n` policies, attached in standalone mode
/// or not.
#[must_use]
pub fn ipsec_verdict(n: usize, standalone: bool) -> Check {
    let (level, detail, fix) = match (n, standalone) {
        (0, _) => (Level::Ok, "no IPsec policies".to_owned(), None),
        (n, false) => (
            Level::Warn,
            format!(
                "{n} IPsec policies (ip xfrm policy): the fast path does not apply them, so \
                 offload mode leaves the connections they cover in the kernel (`ipsec_policy` \
                 in the daemon's not-offloaded reasons) and ends offloaded ones a new policy \
                 covers; standalone mode would not"
            ),
            None,
        ),
        (n, true) => (
            Level::Fail,
            format!(
                "{n} IPsec policies (ip xfrm policy), and standalone mode admits flows without \
                 looking at them: traffic they cover (a site-to-site tunnel's subnets) leaves \
                 and arrives on the fast path in clear"
            ),
            Some(
                "router-ctl attach LAN WAN --admit kernel (offload mode keeps covered \
                 connections in the kernel), or remove the policies"
                    .to_owned(),
            ),
        ),
    };
    Check {
        iface: "xfrm".to_owned(),
        name: "ipsec",
        level,
        detail,
        fix,
    }
}

/// [`source_route_check`]'s verdict for WAN interface `wan`, with
/// `accept_source_route` on for `all` and for `wan` as given.
#[must_use]
pub fn source_route_verdict(wan: &str, all: bool, iface: bool) -> Check {
    let (level, detail, fix) = if all && iface {
        (
            Level::Fail,
            "the kernel accepts IPv4 source routes arriving here (accept_source_route): a \
             source-routed packet to the WAN address is re-routed into the LAN, past standalone \
             mode's inbound filter"
                .to_owned(),
            Some(format!(
                "sysctl -w net.ipv4.conf.all.accept_source_route=0 \
                 net.ipv4.conf.{wan}.accept_source_route=0 in the router's namespace, and in \
                 /etc/sysctl.d to keep it"
            )),
        )
    } else {
        (
            Level::Ok,
            "IPv4 source routes arriving here are dropped by the kernel".to_owned(),
            None,
        )
    };
    Check {
        iface: wan.to_owned(),
        name: "source-route",
        level,
        detail,
        fix,
    }
}

/// The local-ports check of standalone mode for XDP's ports `xdp` and the
/// kernel NAT's `kernel_nat`, against this namespace's sysctls as they are
/// (also what `attach` warns of before it turns the fast path on).
#[must_use]
pub fn local_ports_now(xdp: (u16, u16), kernel_nat: Option<(u16, u16)>) -> Check {
    let text = fs::read_to_string(LOCAL_PORT_RANGE);
    let Some(local) = text.as_deref().ok().and_then(parse_local_port_range) else {
        return Check {
            iface: "sysctl".into(),
            name: "local-ports",
            level: Level::Warn,
            detail: format!(
                "cannot read {LOCAL_PORT_RANGE} ({}): whether the router's own sockets take \
                 ports inside XDP's {}-{} is unknown",
                text.map_or_else(|e| e.to_string(), |t| format!("{:?}", t.trim())),
                xdp.0,
                xdp.1
            ),
            fix: None,
        };
    };
    // Without the file (an old kernel) nothing is reserved.
    let reserved = fs::read_to_string(LOCAL_RESERVED_PORTS)
        .ok()
        .and_then(|t| parse_reserved_ports(&t))
        .unwrap_or_default();
    local_ports(xdp, local, &reserved, kernel_nat)
}

/// How many ports of `local` inside `xdp` are not `reserved`: those the
/// router's own sockets may take automatically.
fn shared_unreserved(xdp: (u16, u16), local: (u16, u16), reserved: &[(u16, u16)]) -> u32 {
    let (lo, hi) = (xdp.0.max(local.0), xdp.1.min(local.1));
    if lo > hi {
        return 0;
    }
    let reserved_port = |p: u16| reserved.iter().any(|&(a, b)| (a..=b).contains(&p));
    (lo..=hi).filter(|&p| !reserved_port(p)).map(|_| 1).sum()
}

/// The ports to give the router's own sockets, outside XDP's `xdp`: the
/// kernel NAT's (`kernel_nat`; its conntrack knows the router's sockets
/// too, so they share its ports safely), else those above XDP's, else
/// those below (down to 1024, where unprivileged ports start); `None` if
/// XDP leaves fewer than [`MIN_LOCAL_PORTS`] on either side (a resolver
/// with a handful of ports fails under load: narrowing XDP's range is the
/// fix then).
fn ports_outside(xdp: (u16, u16), kernel_nat: Option<(u16, u16)>) -> Option<(u16, u16)> {
    [
        kernel_nat.filter(|&k| !standalone::overlap(k, xdp)),
        (xdp.1 < u16::MAX).then(|| (xdp.1 + 1, u16::MAX)),
        (xdp.0 > 1024).then(|| (1024, xdp.0 - 1)),
    ]
    .into_iter()
    .flatten()
    .find(|&(lo, hi)| lo <= hi && u32::from(hi - lo) + 1 >= MIN_LOCAL_PORTS)
}

/// The fewest local ports [`ports_outside`] offers the router's own
/// sockets (the kernel's default range has 28,232).
const MIN_LOCAL_PORTS: u32 = 1024;

/// The router's own local ports `local` (less the `reserved` ones)
/// against XDP's `xdp` in standalone mode: a warning if they overlap, with
/// a range outside XDP's.
fn local_ports(
    xdp: (u16, u16),
    local: (u16, u16),
    reserved: &[(u16, u16)],
    kernel_nat: Option<(u16, u16)>,
) -> Check {
    let (name, iface) = ("local-ports", "sysctl".to_owned());
    let shared = shared_unreserved(xdp, local, reserved);
    if shared == 0 {
        return Check {
            iface,
            name,
            level: Level::Ok,
            detail: format!(
                "the router's own sockets take local ports {}-{} \
                 (net.ipv4.ip_local_port_range), outside XDP's {}-{}{}",
                local.0,
                local.1,
                xdp.0,
                xdp.1,
                if standalone::overlap(xdp, local) {
                    " but for reserved ones (net.ipv4.ip_local_reserved_ports)"
                } else {
                    ""
                }
            ),
            fix: None,
        };
    }
    let all_shared = u32::from(xdp.1.min(local.1) - xdp.0.max(local.0)) + 1;
    let fix = match ports_outside(xdp, kernel_nat) {
        Some((lo, hi)) => format!(
            "sysctl -w net.ipv4.ip_local_port_range=\"{lo} {hi}\" in the router's namespace \
             ({}), and in /etc/sysctl.d to keep it",
            if kernel_nat == Some((lo, hi)) {
                "the kernel NAT's --kernel-nat-ports: its conntrack knows the router's sockets \
                 too, so they share those ports safely"
            } else {
                "outside XDP's --port-range"
            }
        ),
        None => "narrow --port-range to leave ports for the router's own sockets, then give \
                 them those (sysctl net.ipv4.ip_local_port_range)"
            .to_owned(),
    };
    Check {
        iface,
        name,
        level: Level::Warn,
        detail: format!(
            "the router's own sockets (resolver, NTP, a VPN client) take local ports {}-{} \
             (net.ipv4.ip_local_port_range), which overlap XDP's --port-range {}-{}{}: XDP \
             does not know them, so the router and a LAN host can pick the same WAN tuple \
             towards the same server, and the server's replies then go to the LAN host",
            local.0,
            local.1,
            xdp.0,
            xdp.1,
            if shared < all_shared {
                format!(" in {shared} port(s) not reserved (net.ipv4.ip_local_reserved_ports)")
            } else {
                String::new()
            }
        ),
        fix: Some(fix),
    }
}

/// Prints the checks; exit code 1 if any failed. `daemon_running`: a
/// `router-ctl run` ticks (its status file's heartbeat).
pub fn doctor(
    ifaces: &[String],
    netns: Option<&str>,
    pin_dir: &Path,
    daemon_running: bool,
    as_json: bool,
) -> i32 {
    let mut cs = checks(ifaces, pin_dir);
    cs.extend(daemon_check(pin_dir, daemon_running));
    cs.extend(vrrp_daemon_check(pin_dir, daemon_running));
    cs.extend(local_ports_check(netns, pin_dir));
    cs.extend(source_route_check(pin_dir));
    cs.extend(ipsec_check(pin_dir));
    cs.extend(policy_rules_check(pin_dir));
    cs.extend(firewall_checks(netns, pin_dir));
    let failed = cs.iter().any(|c| c.level == Level::Fail);
    if as_json {
        println!("{}", json!({"checks": cs, "ok": !failed}));
    } else {
        let mut last = String::new();
        for c in &cs {
            if c.iface != last {
                println!("{}:", c.iface);
                last.clone_from(&c.iface);
            }
            println!("  {} {:<16} {}", c.level.tag(), c.name, c.detail);
            if let Some(f) = &c.fix {
                println!("         {:<16} fix: {f}", "");
            }
        }
        let (w, f) = (
            cs.iter().filter(|c| c.level == Level::Warn).count(),
            cs.iter().filter(|c| c.level == Level::Fail).count(),
        );
        println!("{f} failed, {w} warnings");
    }
    i32::from(failed)
}

/// The `ip link` keyword that removes an XDP program attached in `mode`
/// (`native`, `generic`, `offload`): a plain `xdp off` leaves a generic
/// one attached.
#[must_use]
pub fn xdp_off_keyword(mode: &str) -> &'static str {
    match mode {
        "generic" => "xdpgeneric",
        "offload" => "xdpoffload",
        _ => "xdp",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An nftables flowtable's warning says what it does beside XDP:
    /// hardware offload forwards first, a software one after XDP, before
    /// the daemon in offload mode.
    #[test]
    fn a_flowtable_is_described_by_what_it_does_beside_xdp() {
        let f = |hardware| standalone::Flowtable {
            name: "table inet fw4 flowtable ft".into(),
            devices: vec!["lan0".into(), "wan0".into()],
            hardware,
        };
        let hw = flowtable_check(&f(true), true);
        assert!(
            hw.detail.contains("the NIC forwards its flows before XDP"),
            "{}",
            hw.detail
        );
        let offload = flowtable_check(&f(false), true);
        assert!(
            offload.detail.contains("before the daemon offloads it"),
            "{}",
            offload.detail
        );
        let standalone = flowtable_check(&f(false), false);
        assert!(
            standalone.detail.contains("holds only what XDP leaves"),
            "{}",
            standalone.detail
        );
        assert!(
            [hw, offload, standalone]
                .iter()
                .all(|c| c.level == Level::Warn && c.detail.contains("(devices lan0, wan0"))
        );
    }

    /// `IPsec` policies: none is fine, some warn in offload mode (covered
    /// connections stay in the kernel) and fail in standalone mode.
    #[test]
    fn ipsec_policies_warn_in_offload_mode_and_fail_standalone() {
        assert_eq!(ipsec_verdict(0, true).level, Level::Ok);
        let offload = ipsec_verdict(2, false);
        assert_eq!(offload.level, Level::Warn);
        assert!(offload.detail.starts_with("2 IPsec policies"));
        let standalone = ipsec_verdict(1, true);
        assert_eq!(standalone.level, Level::Fail);
        assert!(standalone.fix.unwrap().contains("--admit kernel"));
    }

    /// Source routes reach the LAN only with `accept_source_route` on for
    /// both `all` and the WAN (the kernel ANDs the two); then the check
    /// fails and names both sysctls.
    #[test]
    fn source_routing_fails_only_when_the_kernel_accepts_it() {
        for (all, iface) in [(false, false), (true, false), (false, true)] {
            let c = source_route_verdict("wan0", all, iface);
            assert_eq!(c.level, Level::Ok, "{all} {iface}");
            assert!(c.fix.is_none());
        }
        let c = source_route_verdict("wan0", true, true);
        assert_eq!(c.level, Level::Fail);
        assert_eq!((c.iface.as_str(), c.name), ("wan0", "source-route"));
        let fix = c.fix.unwrap();
        assert!(
            fix.contains("net.ipv4.conf.all.accept_source_route=0")
                && fix.contains("net.ipv4.conf.wan0.accept_source_route=0"),
            "{fix}"
        );
    }

    /// The attached program's mode decides, then the mode asked; only
    /// `auto` before an attach asks the driver.
    #[test]
    fn generic_mode_as_attached_else_as_asked_else_the_fallback() {
        let never = || -> bool { panic!("the driver asked although the mode is known") };
        assert!(runs_generic(Some(true), Some(false), never));
        assert!(!runs_generic(Some(false), Some(true), never));
        assert!(runs_generic(None, Some(true), never));
        assert!(!runs_generic(None, Some(false), never));
        assert!(runs_generic(None, None, || true));
        assert!(!runs_generic(None, None, || false));
    }

    #[test]
    fn virtual_macs_without_a_daemon_warn() {
        assert!(unfollowed_virtual_macs(0, &[]).is_none());
        let c = unfollowed_virtual_macs(2, &[]).expect("accepted MACs warn");
        assert_eq!((c.level, c.name), (Level::Warn, "virtual-macs"));
        assert!(c.detail.contains("2 VRRP virtual MAC(s)"), "{}", c.detail);
        assert!(c.fix.is_some_and(|f| f.contains("router-ctl run")));
        // A backup: its macvlan, no MAC accepted.
        let c = unfollowed_virtual_macs(0, &["vrrp.61".into()]).expect("a macvlan warns");
        assert!(c.detail.contains("vrrp.61"), "{}", c.detail);
    }

    #[test]
    fn the_routers_own_ports_inside_xdps_warn() {
        let (xdp, kernel) = (
            standalone::DEFAULT_XDP_PORTS,
            standalone::DEFAULT_KERNEL_PORTS,
        );
        // Linux's default range, inside XDP's default one.
        let c = local_ports(xdp, (32768, 60999), &[], Some(kernel));
        assert_eq!((c.level, c.name), (Level::Warn, "local-ports"));
        assert!(
            c.detail.contains("32768-60999") && c.detail.contains("1024-60999"),
            "{}",
            c.detail
        );
        let fix = c.fix.unwrap();
        assert!(
            fix.contains("sysctl -w net.ipv4.ip_local_port_range=\"61000 65535\""),
            "{fix}"
        );
        // Edges: one shared port warns, the next one up does not.
        assert_eq!(
            local_ports(xdp, (60999, 65535), &[], None).level,
            Level::Warn
        );
        assert_eq!(local_ports(xdp, (61000, 65535), &[], None).level, Level::Ok);
        assert_eq!(
            local_ports((2000, 3000), (1024, 1999), &[], None).level,
            Level::Ok
        );
        assert_eq!(
            local_ports((2000, 3000), (1024, 2000), &[], None).level,
            Level::Warn
        );
        // Inside XDP's, or around it.
        assert_eq!(
            local_ports(xdp, (40000, 40010), &[], None).level,
            Level::Warn
        );
        assert_eq!(
            local_ports((40000, 40010), (1024, 65535), &[], None).level,
            Level::Warn
        );
    }

    #[test]
    fn reserved_ports_are_not_the_routers_to_take() {
        let (xdp, local) = ((1024, 60999), (32768, 60999));
        let c = local_ports(xdp, local, &[(32768, 60999)], None);
        assert_eq!(c.level, Level::Ok, "{}", c.detail);
        assert!(c.detail.contains("ip_local_reserved_ports"), "{}", c.detail);
        // Reserved in two pieces, with one port left between them.
        let c = local_ports(xdp, local, &[(30000, 40000), (40002, 61000)], None);
        assert_eq!(c.level, Level::Warn);
        assert!(
            c.detail.contains("in 1 port(s) not reserved"),
            "{}",
            c.detail
        );
        assert_eq!(
            local_ports(xdp, local, &[(30000, 40000), (40001, 61000)], None).level,
            Level::Ok
        );
        // Reserved ports elsewhere change nothing.
        let c = local_ports(xdp, local, &[(8080, 8080)], None);
        assert!(!c.detail.contains("reserved"), "{}", c.detail);
        assert_eq!(shared_unreserved(xdp, local, &[]), 28232);
        assert_eq!(shared_unreserved((1024, 2000), local, &[]), 0);
    }

    #[test]
    fn reserved_ports_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_reserved_ports("\n"), Some(vec![]));
        assert_eq!(
            parse_reserved_ports("8080,9000-9100\n"),
            Some(vec![(8080, 8080), (9000, 9100)])
        );
        for bad in ["a", "9100-9000", "1,", "70000"] {
            assert_eq!(parse_reserved_ports(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_fix_gives_the_router_ports_outside_xdps() {
        let fix = |xdp, kernel| local_ports(xdp, (1024, 65535), &[], kernel).fix.unwrap();
        // The kernel NAT's ports, when they are outside XDP's.
        assert!(fix((1024, 40000), Some((50000, 51999))).contains("\"50000 51999\""));
        // Without a kernel NAT: the ports above XDP's, else below.
        assert!(fix((1024, 40000), None).contains("\"40001 65535\""));
        // Too few on a side (one port above, 100 below): the other side,
        // or narrow XDP's.
        assert!(fix((1124, 65534), None).contains("narrow --port-range"));
        assert!(fix((3000, 65534), None).contains("\"1024 2999\""));
        assert!(fix((1024, 40000), Some((65000, 65100))).contains("\"40001 65535\""));
        assert!(fix((30000, 65535), None).contains("\"1024 29999\""));
        // XDP takes every unprivileged port: narrow it first.
        assert!(fix((1024, 65535), None).contains("narrow --port-range"));
    }

    #[test]
    fn local_port_ranges_parse_as_the_kernel_writes_them() {
        assert_eq!(
            parse_local_port_range("32768\t60999\n"),
            Some((32768, 60999))
        );
        assert_eq!(parse_local_port_range("61000 65535"), Some((61000, 65535)));
        for bad in ["", "32768", "1 2 3", "60999\t32768", "a b"] {
            assert_eq!(parse_local_port_range(bad), None, "{bad:?}");
        }
    }
}
