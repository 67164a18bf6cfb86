//! keepalived `use_vmac`: the VRRP virtual MACs the data path forwards
//! frames to, besides the attached interfaces' own MACs.
//!
//! With `use_vmac`, keepalived runs a VRRP instance on a macvlan (e.g.
//! `vrrp.51`) on top of the LAN (or WAN) interface, carrying the virtual
//! router MAC of RFC 5798 7.3 (`00:00:5e:00:01:VRID` for IPv4,
//! `00:00:5e:00:02:VRID` for IPv6); the hosts' gateway address resolves to
//! it. The kernel takes a frame to that MAC on the lower interface as the
//! macvlan's (`PACKET_HOST`) and forwards it. Both routers keep the
//! macvlan up with the virtual MAC; the master holds the virtual addresses
//! on it, the backup none (keepalived 2.2 with `VRRPv3`: the backup's
//! macvlan has no address at all, IPv6 off for an IPv4 instance). So a
//! macvlan's MAC is accepted for a family while it is up and holds an
//! address of that family other than a link-local one: the router is then
//! the master, and a backup does not forward the frames a switch floods to
//! it (the kernel would). `attach` writes the map from the links and
//! addresses as they are, `router-ctl run` again at each link or address
//! notification (and after lost ones).

use std::{
    collections::BTreeMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use anyhow::{Context as _, Result};
use aya::maps::MapError;
use router_common::maps::{Config, VMAC_IPV4, VMAC_IPV6, VirtualMacKey};
use serde::Serialize;

use crate::{
    maps::{PinnedMaps, VirtualMacsMap},
    netlink::{self, LinkAttrs},
};

/// The VRRP virtual MAC prefix (RFC 5798 7.3), then the family byte and
/// the VRID.
const VRRP_MAC_PREFIX: [u8; 4] = [0x00, 0x00, 0x5e, 0x00];

/// The family (`VMAC_IPV4` or `VMAC_IPV6`) of a VRRP virtual MAC, `None`
/// for any other MAC.
#[must_use]
pub fn vrrp_family(mac: [u8; 6]) -> Option<u8> {
    if mac[..4] != VRRP_MAC_PREFIX {
        return None;
    }
    match mac[4] {
        1 => Some(VMAC_IPV4),
        2 => Some(VMAC_IPV6),
        _ => None,
    }
}

/// A virtual MAC the data path accepts on an attached interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VirtualMac {
    /// The attached interface (the macvlan's lower device).
    pub ifindex: u32,
    /// The macvlan carrying the MAC.
    pub macvlan: String,
    pub mac: [u8; 6],
    /// `VMAC_IPV4` | `VMAC_IPV6`: the families the router is the master of.
    pub families: u8,
}

impl VirtualMac {
    fn key(&self) -> VirtualMacKey {
        VirtualMacKey::new(self.ifindex, self.mac)
    }

    /// `00:00:5e:00:01:33 on lan0 via vrrp.51 (IPv4)`.
    #[must_use]
    pub fn describe(&self) -> String {
        let lower =
            netlink::ifname(self.ifindex).unwrap_or_else(|| format!("ifindex {}", self.ifindex));
        format!(
            "{} on {lower} via {} ({})",
            netlink::mac_str(self.mac),
            self.macvlan,
            families_str(self.families)
        )
    }
}

/// `IPv4`, `IPv6` or `IPv4+IPv6`.
#[must_use]
pub fn families_str(families: u8) -> &'static str {
    match (families & VMAC_IPV4 != 0, families & VMAC_IPV6 != 0) {
        (true, true) => "IPv4+IPv6",
        (true, false) => "IPv4",
        (false, true) => "IPv6",
        (false, false) => "none",
    }
}

/// Whether `a` is an address the master holds: not link-local (an IPv6
/// macvlan gets a link-local one as soon as it is up, on either router).
fn vrrp_held(a: &IpAddr) -> bool {
    match a {
        IpAddr::V4(a) => !a.is_link_local() && !a.is_unspecified() && *a != Ipv4Addr::BROADCAST,
        IpAddr::V6(a) => !a.is_unicast_link_local() && *a != Ipv6Addr::UNSPECIFIED,
    }
}

/// The macvlans in this namespace carrying a VRRP MAC on top of an
/// attached interface (`attached`, LAN and WAN ifindex), up or down:
/// keepalived's `use_vmac` interfaces, with their MAC.
pub fn vrrp_macvlans(
    links: &[LinkAttrs],
    attached: [u32; 2],
) -> impl Iterator<Item = (&LinkAttrs, [u8; 6])> {
    links.iter().filter_map(move |l| {
        let on_attached = l.kind.as_deref() == Some("macvlan")
            // A lower device in another namespace has an ifindex of that
            // namespace.
            && l.link_netnsid.is_none()
            && l.link.is_some_and(|lower| lower != 0 && attached.contains(&lower));
        let mac = l.mac.filter(|&m| on_attached && vrrp_family(m).is_some())?;
        Some((l, mac))
    })
}

/// The virtual MACs to accept: of each macvlan in this namespace on top of
/// an attached interface (`attached`, LAN and WAN ifindex) that is up and
/// carries a VRRP MAC, for the families it holds a non-link-local address
/// of (`addrs`: interface index and address). A macvlan without one is a
/// backup's: left out.
#[must_use]
pub fn accepted(
    links: &[LinkAttrs],
    addrs: &[(u32, IpAddr)],
    attached: [u32; 2],
) -> Vec<VirtualMac> {
    vrrp_macvlans(links, attached)
        .filter(|(l, _)| l.up)
        .filter_map(|(l, mac)| {
            let families = addrs
                .iter()
                .filter(|(ifindex, a)| *ifindex == l.ifindex && vrrp_held(a))
                .fold(0, |f, (_, a)| {
                    f | if a.is_ipv4() { VMAC_IPV4 } else { VMAC_IPV6 }
                });
            (families != 0).then(|| VirtualMac {
                ifindex: l.link.unwrap_or(0),
                macvlan: l.name.clone(),
                mac,
                families,
            })
        })
        .collect()
}

/// The virtual MACs to accept on the attached interfaces `attached` (LAN
/// and WAN ifindex), from the links and addresses of the current
/// namespace.
pub fn current(attached: [u32; 2]) -> Result<Vec<VirtualMac>> {
    let links = netlink::links().context("listing the interfaces (rtnetlink)")?;
    let addrs = netlink::addrs_by_ifindex().context("listing the addresses (rtnetlink)")?;
    Ok(accepted(&links, &addrs, attached))
}

/// The pinned map's entries: key and families.
pub fn pinned(maps: &PinnedMaps) -> Result<Vec<(VirtualMacKey, u8)>> {
    entries(&maps.virtual_macs()?)
}

/// The entries of the open map `map`: key and families.
fn entries(map: &VirtualMacsMap) -> Result<Vec<(VirtualMacKey, u8)>> {
    let mut out = Vec::new();
    for k in map.keys() {
        let k = k.context("walking the virtual MAC map")?;
        if let Ok(v) = map.get(&k, 0) {
            out.push((k, v));
        }
    }
    Ok(out)
}

/// Makes the pinned map hold exactly `want`; the changes made, as lines
/// for the log (nothing when it held them already).
pub fn sync(maps: &PinnedMaps, want: &[VirtualMac]) -> Result<Vec<String>> {
    let mut map = maps.virtual_macs()?;
    let have: BTreeMap<VirtualMacKey, u8> = entries(&map)?.into_iter().collect();
    let mut changes = Vec::new();
    for k in have.keys() {
        if !want.iter().any(|v| v.key() == *k) {
            match map.remove(k) {
                Ok(()) => {}
                // Removed meanwhile by the other writer (the daemon and an
                // attach both follow keepalived): what was asked for.
                Err(MapError::SyscallError(e))
                    if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(e).context("removing a virtual MAC"),
            }
            let lower =
                netlink::ifname(k.ifindex).unwrap_or_else(|| format!("ifindex {}", k.ifindex));
            changes.push(format!(
                "no longer forwarding frames to the virtual MAC {} on {lower} (its macvlan is \
                 gone, down, or holds no virtual address: a VRRP backup)",
                netlink::mac_str(k.mac)
            ));
        }
    }
    for v in want {
        if have.get(&v.key()) == Some(&v.families) {
            continue;
        }
        map.insert(v.key(), v.families, 0)
            .context("writing a virtual MAC")?;
        changes.push(format!(
            "forwarding frames to the virtual MAC {} (VRRP master)",
            v.describe()
        ));
    }
    Ok(changes)
}

/// Reads the links and addresses and makes the map match them, logging
/// each change.
pub fn follow(maps: &PinnedMaps, cfg: &Config) -> Result<()> {
    let want = current([cfg.lan_ifindex, cfg.wan_ifindex])?;
    for change in sync(maps, &want)? {
        tracing::info!("{change}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAN: u32 = 2;
    const WAN: u32 = 3;
    const VMAC4: [u8; 6] = [0, 0, 0x5e, 0, 1, 51];
    const VMAC6: [u8; 6] = [0, 0, 0x5e, 0, 2, 51];

    fn macvlan(ifindex: u32, name: &str, lower: u32, mac: [u8; 6], up: bool) -> LinkAttrs {
        LinkAttrs {
            ifindex,
            name: name.into(),
            kind: Some("macvlan".into()),
            link: Some(lower),
            up,
            mac: Some(mac),
            ..LinkAttrs::default()
        }
    }

    fn addr(ifindex: u32, a: &str) -> (u32, IpAddr) {
        (ifindex, a.parse().unwrap())
    }

    #[test]
    fn vrrp_macs_are_recognised_by_family() {
        assert_eq!(vrrp_family(VMAC4), Some(VMAC_IPV4));
        assert_eq!(vrrp_family(VMAC6), Some(VMAC_IPV6));
        assert_eq!(vrrp_family([0, 0, 0x5e, 0, 3, 51]), None);
        assert_eq!(vrrp_family([0, 0, 0x5e, 1, 1, 51]), None);
        assert_eq!(vrrp_family([2, 0, 0, 0, 0, 1]), None);
    }

    /// As keepalived leaves them (see the report of branch vmac): the
    /// master's macvlan holds the virtual address, the backup's is up with
    /// the same MAC and no address.
    #[test]
    fn the_master_accepts_and_the_backup_does_not() {
        let links = [macvlan(5, "vrrp.51", LAN, VMAC4, true)];
        let master = [addr(LAN, "192.168.70.2"), addr(5, "192.168.70.1")];
        let got = accepted(&links, &master, [LAN, WAN]);
        assert_eq!(
            got,
            [VirtualMac {
                ifindex: LAN,
                macvlan: "vrrp.51".into(),
                mac: VMAC4,
                families: VMAC_IPV4
            }]
        );
        let backup = [addr(LAN, "192.168.70.3")];
        assert!(accepted(&links, &backup, [LAN, WAN]).is_empty());
        // Down (keepalived stopped with the address left): not accepted.
        let down = [macvlan(5, "vrrp.51", LAN, VMAC4, false)];
        assert!(accepted(&down, &master, [LAN, WAN]).is_empty());
    }

    #[test]
    fn an_ipv6_instance_needs_more_than_its_link_local_address() {
        let links = [macvlan(6, "vrrp6.51", WAN, VMAC6, true)];
        let backup = [addr(6, "fe80::200:5eff:fe00:233")];
        assert!(accepted(&links, &backup, [LAN, WAN]).is_empty());
        let master = [backup[0], addr(6, "2001:db8::1")];
        let got = accepted(&links, &master, [LAN, WAN]);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].ifindex, got[0].families), (WAN, VMAC_IPV6));
        let v4_link_local = [addr(6, "169.254.1.1")];
        assert!(accepted(&links, &v4_link_local, [LAN, WAN]).is_empty());
    }

    #[test]
    fn other_macvlans_and_other_lower_devices_are_left_out() {
        let held = |ifindex| addr(ifindex, "192.168.70.1");
        // Not a VRRP MAC (a container's macvlan).
        let other_mac = macvlan(5, "mv0", LAN, [2, 0, 0, 0, 0, 9], true);
        // On top of an interface that is not attached.
        let other_lower = macvlan(6, "vrrp.52", 9, [0, 0, 0x5e, 0, 1, 52], true);
        // Not a macvlan (a VRRP MAC set on a dummy).
        let mut dummy = macvlan(7, "dummy0", LAN, [0, 0, 0x5e, 0, 1, 53], true);
        dummy.kind = Some("dummy".into());
        // Its lower device lives in another namespace.
        let mut foreign = macvlan(8, "vrrp.54", LAN, [0, 0, 0x5e, 0, 1, 54], true);
        foreign.link_netnsid = Some(0);
        let links = [other_mac, other_lower, dummy, foreign];
        let addrs: Vec<_> = links.iter().map(|l| held(l.ifindex)).collect();
        assert!(accepted(&links, &addrs, [LAN, WAN]).is_empty());
    }

    #[test]
    fn families_are_named() {
        assert_eq!(families_str(VMAC_IPV4), "IPv4");
        assert_eq!(families_str(VMAC_IPV6), "IPv6");
        assert_eq!(families_str(VMAC_IPV4 | VMAC_IPV6), "IPv4+IPv6");
    }
}
