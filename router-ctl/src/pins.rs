//! Where the pins live, opening pinned maps, and small kernel helpers
//! shared by the commands.

use std::{
    collections::BTreeSet,
    ffi::CString,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use aya::{
    Pod,
    maps::{Array, HashMap, Map, MapData, MapError},
};
use router_common::maps::{
    CONFIG_MAP, CONNTRACK_MAP, COUNTERS_MAP, Config, DEVICES_MAP, PORT_FORWARDS_MAP,
};

pub const BPFFS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Maps pinned by `attach`, in pin order.
pub const PINNED_MAPS: [&str; 5] = [
    COUNTERS_MAP,
    DEVICES_MAP,
    CONFIG_MAP,
    CONNTRACK_MAP,
    PORT_FORWARDS_MAP,
];
/// Link pins, one per attached interface.
pub const LINK_PINS: [&str; 2] = ["link_lan", "link_wan"];

pub fn pin_dir(netns: Option<&str>) -> PathBuf {
    Path::new(BPFFS)
        .join("xdp-router")
        .join(netns.unwrap_or("default"))
}

pub fn ensure_bpffs() -> Result<()> {
    let c = CString::new(BPFFS).unwrap();
    // SAFETY: statfs writes into the zeroed struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated, st is valid.
    if unsafe { libc::statfs(c.as_ptr(), &raw mut st) } == 0 && st.f_type == BPF_FS_MAGIC {
        return Ok(());
    }
    let fstype = CString::new("bpf").unwrap();
    // SAFETY: all pointers are NUL-terminated strings.
    let rc = unsafe {
        libc::mount(
            fstype.as_ptr(),
            c.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "bpffs is not mounted at {BPFFS} and mounting it failed: {}; \
             run `mount -t bpf bpf {BPFFS}`",
            std::io::Error::last_os_error()
        );
    }
    eprintln!("mounted bpffs at {BPFFS}");
    Ok(())
}

/// Opens the pinned map `name` of the router in `pin_dir`.
pub fn open_map(pin_dir: &Path, name: &str) -> Result<Map> {
    let path = pin_dir.join(name);
    if !path.exists() {
        if pin_dir.join(LINK_PINS[0]).exists() {
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
    let data = MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
    Map::from_map_data(data).with_context(|| format!("opening {}", path.display()))
}

/// Opens a pinned hash (or LRU hash) map with key `K` and value `V`.
pub fn open_hash<K: Pod, V: Pod>(pin_dir: &Path, name: &str) -> Result<HashMap<MapData, K, V>> {
    HashMap::try_from(open_map(pin_dir, name)?).with_context(|| {
        format!("{name} does not have the layout this router-ctl expects; detach and attach again")
    })
}

/// Capacity (`max_entries`) of a map.
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
    let limit = (capacity as usize).saturating_mul(2).saturating_add(64);
    let mut keys = BTreeSet::new();
    for k in map.keys().take(limit) {
        keys.insert(k.context("walking the map's keys")?);
    }
    let mut out = Vec::with_capacity(keys.len());
    for k in keys {
        match map.get(&k, 0) {
            Ok(v) => out.push((k, v)),
            Err(MapError::KeyNotFound) => {}
            Err(e) => return Err(e).context("reading a map entry"),
        }
    }
    Ok(out)
}

/// The router's configuration.
pub fn read_config(pin_dir: &Path) -> Result<Config> {
    let cfg: Array<MapData, Config> = Array::try_from(open_map(pin_dir, CONFIG_MAP)?).context(
        "CONFIG does not have the layout this router-ctl expects; detach and attach again",
    )?;
    cfg.get(&0, 0).context("reading the configuration")
}

/// The OS error behind a map error, if it is a failed syscall.
pub fn errno(e: &MapError) -> Option<i32> {
    match e {
        MapError::SyscallError(s) => s.io_error.raw_os_error(),
        _ => None,
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds, the base of the data path's
/// `bpf_ktime_get_coarse_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC always exists.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}
