//! The one typed facade over the maps `attach` pins: every command opens
//! them here, by role, with the key and value types the data path uses, so
//! no module names a map by string or repeats its layout.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use aya::{
    Pod,
    maps::{Array, DevMapHash, HashMap, Map, MapData, MapError, PerCpuArray},
};
use router_common::maps::{
    CONFIG_MAP, CONNTRACK_MAP, CONNTRACK6_MAP, COUNTERS_MAP, Config, Counter, CounterValue,
    DEVICES_MAP, FlowEntry, FlowEntry6, FlowKey, FlowKey6, KERNEL_FLOWS_MAP, NAT_ENDPOINTS_MAP,
    NAT_MAPPINGS_MAP, NAT_PERMITS_MAP, NEXT_HOPS_MAP, NextHopKey, PINHOLES6_MAP, PORT_FORWARDS_MAP,
    PinholeKey6, PortForwardKey, PortForwardTarget, ROUTE_MARKS_MAP, VIRTUAL_MACS_MAP,
    VirtualMacKey,
};

use crate::pins::LINK_PINS;

/// Per-CPU verdict and event counters, indexed by `Counter`.
pub type CountersMap = PerCpuArray<MapData, CounterValue>;
/// The flow table: two entries per flow.
pub type ConntrackMap = HashMap<MapData, FlowKey, FlowEntry>;
/// The single-entry configuration; all zero means "fast path off".
pub type ConfigMap = Array<MapData, Config>;
/// The IPv6 flow table: two entries per flow.
pub type Conntrack6Map = HashMap<MapData, FlowKey6, FlowEntry6>;
/// IPv6 pinholes (value 1).
pub type Pinholes6Map = HashMap<MapData, PinholeKey6, u8>;
/// Port-forward rules.
pub type PortForwardsMap = HashMap<MapData, PortForwardKey, PortForwardTarget>;
/// The VRRP virtual MACs accepted besides the interfaces' own, with their
/// families (`VMAC_IPV4` | `VMAC_IPV6`).
pub type VirtualMacsMap = HashMap<MapData, VirtualMacKey, u8>;
/// The neighbours the fast path forwards to, and when it last did.
pub type NextHopsMap = HashMap<MapData, NextHopKey, u64>;
/// The routing marks of offloaded flows, by slot.
pub type RouteMarksMap = Array<MapData, u32>;
/// The attached interfaces, the redirect targets.
pub type DevicesMap = DevMapHash<MapData>;

/// The maps pinned in one pin directory. Nothing is opened until an
/// accessor is called, so a command touches only the maps it needs.
#[derive(Clone, Debug)]
pub struct PinnedMaps {
    dir: PathBuf,
}

impl PinnedMaps {
    /// Every map `attach` pins, in pin order (the loader's pin paths, the
    /// layout check of a replace, `status`, `detach`).
    /// The NAT mapping maps are pinned too, so that a replace (a new
    /// filtering setting, an upgrade) keeps the mappings of live flows, and
    /// so is `KERNEL_FLOWS`, so that the flows left to the kernel's NAT keep
    /// its mapping across a replace, and `ROUTE_MARKS`, whose slots the
    /// offloaded flows' entries name, and `NEXT_HOPS`, which the daemon
    /// reads.
    pub const NAMES: [&'static str; 14] = [
        COUNTERS_MAP,
        DEVICES_MAP,
        CONFIG_MAP,
        CONNTRACK_MAP,
        PORT_FORWARDS_MAP,
        CONNTRACK6_MAP,
        PINHOLES6_MAP,
        NAT_MAPPINGS_MAP,
        NAT_ENDPOINTS_MAP,
        NAT_PERMITS_MAP,
        VIRTUAL_MACS_MAP,
        KERNEL_FLOWS_MAP,
        ROUTE_MARKS_MAP,
        NEXT_HOPS_MAP,
    ];

    /// The maps of [`Self::NAMES`] that a router attached by an earlier
    /// router-ctl lacks: a live replace creates them (`load_pinned` pins a
    /// missing map), so neither a replace nor `status` requires them.
    pub const ADDED_LATER: [&'static str; 4] = [
        VIRTUAL_MACS_MAP,
        KERNEL_FLOWS_MAP,
        ROUTE_MARKS_MAP,
        NEXT_HOPS_MAP,
    ];

    /// The maps every attached router has pinned: [`Self::NAMES`] but
    /// [`Self::ADDED_LATER`].
    pub fn required() -> impl Iterator<Item = &'static str> {
        Self::NAMES
            .into_iter()
            .filter(|n| !Self::ADDED_LATER.contains(n))
    }

    #[must_use]
    pub fn at(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// The pin directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The names in [`Self::NAMES`] that are pinned.
    #[must_use]
    pub fn present(&self) -> Vec<&'static str> {
        Self::NAMES
            .iter()
            .copied()
            .filter(|m| self.dir.join(m).exists())
            .collect()
    }

    pub fn counters(&self) -> Result<CountersMap> {
        self.typed(COUNTERS_MAP)
    }

    pub fn conntrack(&self) -> Result<ConntrackMap> {
        self.typed(CONNTRACK_MAP)
    }

    pub fn conntrack6(&self) -> Result<Conntrack6Map> {
        self.typed(CONNTRACK6_MAP)
    }

    pub fn pinholes6(&self) -> Result<Pinholes6Map> {
        self.typed(PINHOLES6_MAP)
    }

    pub fn config(&self) -> Result<ConfigMap> {
        self.typed(CONFIG_MAP)
    }

    pub fn port_forwards(&self) -> Result<PortForwardsMap> {
        self.typed(PORT_FORWARDS_MAP)
    }

    pub fn virtual_macs(&self) -> Result<VirtualMacsMap> {
        self.typed(VIRTUAL_MACS_MAP)
    }

    pub fn next_hops(&self) -> Result<NextHopsMap> {
        self.typed(NEXT_HOPS_MAP)
    }

    pub fn route_marks(&self) -> Result<RouteMarksMap> {
        self.typed(ROUTE_MARKS_MAP)
    }

    pub fn devices(&self) -> Result<DevicesMap> {
        self.typed(DEVICES_MAP)
    }

    /// The router's configuration.
    pub fn read_config(&self) -> Result<Config> {
        self.config()?
            .get(&0, 0)
            .context("reading the configuration")
    }

    /// Whether the router is attached in offload mode (the kernel admits
    /// flows): false where its configuration cannot be read.
    pub fn offload_mode(&self) -> bool {
        self.read_config()
            .is_ok_and(|c| c.admit == router_common::maps::Admit::Kernel as u8)
    }

    /// Turns the fast path off: the `CONFIG` entry all zero, which every
    /// build reads as "not configured". Written at the pinned map's own
    /// value size, so that a router attached by another build (whose
    /// `Config` has another layout) can be detached too.
    pub fn clear_config(&self) -> Result<()> {
        let Map::Array(data) = self.open(CONFIG_MAP)? else {
            bail!("{CONFIG_MAP} is not an array map; detach cannot turn the fast path off");
        };
        let size = data
            .info()
            .context("reading CONFIG's map info")?
            .value_size();
        let zero = vec![0u8; size as usize];
        router_common::bpf_insn::map_update(
            std::os::fd::AsFd::as_fd(data.fd()),
            &0u32.to_ne_bytes(),
            &zero,
        )
        .context("clearing the configuration")
    }

    /// The kernel's id of the pinned map `name`: a new attach pins new
    /// maps (new ids), a replace keeps them (same ids). `None` when it is
    /// not pinned (detached).
    pub fn map_id(&self, name: &str) -> Result<Option<u32>> {
        let path = self.dir.join(name);
        if !path.exists() {
            return Ok(None);
        }
        let data =
            MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
        let info = data
            .info()
            .with_context(|| format!("reading the map info of {}", path.display()))?;
        Ok(Some(info.id()))
    }

    /// The map pinned as `name` in this directory, as `T` (also a map
    /// pinned under another name than its role's, as a replace's staging
    /// pin).
    pub(crate) fn typed<T: TryFrom<Map, Error = MapError>>(&self, name: &str) -> Result<T> {
        T::try_from(self.open(name)?).with_context(|| {
            format!(
                "{name} does not have the layout this router-ctl expects; detach and attach again"
            )
        })
    }

    fn open(&self, name: &str) -> Result<Map> {
        let path = self.dir.join(name);
        if !path.exists() {
            if self.dir.join(LINK_PINS[0]).exists() {
                bail!(
                    "{} is missing: the router was attached by an older router-ctl; \
                     run `router-ctl detach` and attach again",
                    path.display()
                );
            }
            bail!(
                "not attached (no {}); run `router-ctl attach LAN WAN` first",
                path.display()
            );
        }
        let data =
            MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
        Map::from_map_data(data).with_context(|| format!("opening {}", path.display()))
    }
}

/// The index of counter `c` in the pinned `map`, if it has one: counters
/// only ever go last, and an older build's shorter `COUNTERS` lacks the
/// newer ones.
#[must_use]
pub fn counter_index(map: &CountersMap, c: Counter) -> Option<u32> {
    let i = c as u32;
    (i < map.len()).then_some(i)
}

/// Capacity (`max_entries`) of a hash map.
pub fn capacity<K: Pod, V: Pod>(map: &HashMap<MapData, K, V>) -> Result<u32> {
    // `HashMap` implements `IterableMap`, whose `map()` is the `MapData`.
    let data = aya::maps::IterableMap::map(map);
    Ok(data.info().context("reading map info")?.max_entries())
}

/// Every entry of a hash map that the data path may change meanwhile.
///
/// The kernel restarts a key walk from the start when the current key was
/// deleted under it, so the walk is bounded (twice the capacity plus some
/// slack) and keys are de-duplicated. Entries deleted between the key walk
/// and the lookup are skipped.
pub fn snapshot<K: Pod + Ord, V: Pod>(
    map: &HashMap<MapData, K, V>,
    capacity: u32,
) -> Result<Vec<(K, V)>> {
    snapshot_where(map, capacity, |_| true)
}

/// [`snapshot`], keeping only the entries whose value passes `keep`.
pub fn snapshot_where<K: Pod + Ord, V: Pod>(
    map: &HashMap<MapData, K, V>,
    capacity: u32,
    keep: impl Fn(&V) -> bool,
) -> Result<Vec<(K, V)>> {
    // Thousands of entries per system call where the kernel has batch
    // lookups (a full table of a million entries: a few hundred calls, not
    // two million); else the key walk below.
    let data = aya::maps::IterableMap::map(map);
    match crate::bpfsys::lookup_batch(
        std::os::fd::AsFd::as_fd(data.fd()),
        std::mem::size_of::<K>(),
        std::mem::size_of::<V>(),
    ) {
        Ok(rows) => {
            let mut by_key = std::collections::BTreeMap::new();
            for (k, v) in rows {
                // SAFETY: `Pod` types, read from buffers of exactly their
                // sizes as the map holds them (unaligned reads).
                let (k, v): (K, V) = unsafe {
                    (
                        std::ptr::read_unaligned(k.as_ptr().cast()),
                        std::ptr::read_unaligned(v.as_ptr().cast()),
                    )
                };
                if keep(&v) {
                    by_key.insert(k, v);
                }
            }
            return Ok(by_key.into_iter().collect());
        }
        // No batch operation here (an older kernel, another map type).
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINVAL | libc::EOPNOTSUPP | 524)
            ) => {}
        Err(e) => return Err(e).context("reading the map's entries (BPF_MAP_LOOKUP_BATCH)"),
    }
    let limit = (capacity as usize).saturating_mul(2).saturating_add(64);
    let mut keys = BTreeSet::new();
    for k in map.keys().take(limit) {
        keys.insert(k.context("walking the map's keys")?);
    }
    let mut out = Vec::new();
    for k in keys {
        match map.get(&k, 0) {
            Ok(v) if keep(&v) => out.push((k, v)),
            Ok(_) | Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(e).context("reading a map entry"),
        }
    }
    Ok(out)
}

/// The OS error behind a map error, if it is a failed syscall.
#[must_use]
pub fn errno(e: &MapError) -> Option<i32> {
    match e {
        MapError::SyscallError(s) => s.io_error.raw_os_error(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_maps_say_whether_anything_is_attached() {
        let maps = PinnedMaps::at(Path::new("/nonexistent/xdp-router/none"));
        assert!(maps.present().is_empty());
        let e = format!("{:#}", maps.conntrack().unwrap_err());
        assert!(e.starts_with("not attached (no /nonexistent"), "{e}");
        assert!(e.contains(CONNTRACK_MAP), "{e}");
    }
}
