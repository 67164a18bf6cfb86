//! `attach` and `detach`.

use std::{
    ffi::{CStr, CString},
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    EbpfLoader,
    maps::{Array, DevMapHash},
    programs::{Xdp, XdpMode, links::FdLink, links::PinnedLink},
};
use router_common::maps::{CONFIG_MAP, CONNTRACK_MAP, Config, DEVICES_MAP, PROGRAM_NAME, Timeouts};

use crate::{
    Mode,
    parse::WanAddr,
    pins::{LINK_PINS, PINNED_MAPS, ensure_bpffs},
};

pub struct AttachArgs {
    pub lan: String,
    pub wan: String,
    pub mode: Mode,
    pub wan_addr: WanAddr,
    pub port_range: (u16, u16),
    pub max_flows: u32,
    pub timeouts: Timeouts,
}

fn ifindex(name: &str) -> Result<u32> {
    let c = CString::new(name).map_err(|_| anyhow!("bad interface name {name:?}"))?;
    // SAFETY: c is NUL-terminated.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        bail!("no such interface {name:?} (check `ip link`, or pass -n NETNS)");
    }
    Ok(idx)
}

/// The IPv4 addresses of `iface` in the current network namespace, in the
/// kernel's order (primary addresses first).
fn ipv4_addrs(iface: &str) -> Result<Vec<Ipv4Addr>> {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifap with a list freed below.
    if unsafe { libc::getifaddrs(&raw mut ifap) } != 0 {
        bail!(
            "listing interface addresses: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut out = Vec::new();
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points to a sockaddr of at least its family's size.
        let family = unsafe { (*ifa.ifa_addr).sa_family };
        if i32::from(family) != libc::AF_INET {
            continue;
        }
        // SAFETY: ifa_name is a NUL-terminated string.
        if unsafe { CStr::from_ptr(ifa.ifa_name) }.to_bytes() != iface.as_bytes() {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in; read without
        // assuming alignment.
        let sin = unsafe { std::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in>()) };
        out.push(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)));
    }
    // SAFETY: ifap came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifap) };
    Ok(out)
}

/// A random per-attach seed for the SNAT port choice.
fn random_u32() -> Result<u32> {
    let mut buf = [0u8; 4];
    // SAFETY: buf is valid for 4 bytes.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if usize::try_from(n).ok() != Some(buf.len()) {
        use std::io::Read as _;
        fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut buf))
            .context("reading random bytes for the port hash seed")?;
    }
    Ok(u32::from_ne_bytes(buf))
}

/// Refuses when pins of an earlier attach exist.
fn check_not_attached(pin_dir: &Path) -> Result<()> {
    if LINK_PINS.iter().any(|l| pin_dir.join(l).exists()) {
        bail!(
            "already attached (pins in {}); run `router-ctl detach` first",
            pin_dir.display()
        );
    }
    if PINNED_MAPS.iter().any(|m| pin_dir.join(m).exists()) {
        bail!(
            "stale map pins without links in {} (an interrupted attach?); \
             run `router-ctl detach` to remove them",
            pin_dir.display()
        );
    }
    Ok(())
}

fn mode_name(m: XdpMode) -> &'static str {
    if m == XdpMode::Skb {
        "generic"
    } else {
        "native"
    }
}

/// Checks the interfaces and arguments and builds the configuration;
/// changes nothing.
fn resolve(a: &AttachArgs) -> Result<Config> {
    let (lan, wan) = (a.lan.as_str(), a.wan.as_str());
    let lan_idx = ifindex(lan)?;
    let wan_idx = ifindex(wan)?;
    if lan_idx == wan_idx {
        bail!("LAN and WAN are the same interface ({lan}); give two different interfaces");
    }
    let wan_addrs = ipv4_addrs(wan)?;
    let wan_addr = match a.wan_addr {
        WanAddr::Auto => *wan_addrs.first().ok_or_else(|| {
            anyhow!(
                "WAN {wan} has no IPv4 address; pass --wan-addr ADDR \
                 (or add one: `ip addr add ADDR/PREFIX dev {wan}`)"
            )
        })?,
        WanAddr::Addr(x) => {
            if !wan_addrs.contains(&x) {
                eprintln!(
                    "warning: {x} is not an address of {wan}; replies reach the router only \
                     if the upstream routes {x} to it"
                );
            }
            x
        }
    };
    let (port_min, port_max) = a.port_range;
    Ok(Config {
        lan_ifindex: lan_idx,
        wan_ifindex: wan_idx,
        wan_addr: wan_addr.octets(),
        port_min,
        port_max,
        hash_seed: random_u32()?,
        pad: 0,
        timeouts: a.timeouts,
    })
}

/// Validates everything, then loads, configures, pins and attaches. Any
/// failure after the first pin removes every pin made so far.
pub fn attach(pin_dir: &Path, a: &AttachArgs) -> Result<()> {
    let config = resolve(a)?;
    let entries = a
        .max_flows
        .checked_mul(2)
        .context("--max-flows too large")?;
    ensure_bpffs()?;
    check_not_attached(pin_dir)?;

    let mut ebpf = EbpfLoader::new()
        .map_max_entries(CONNTRACK_MAP, entries)
        .load(aya::include_bytes_aligned!(env!("ROUTER_EBPF_OBJ")))
        .with_context(|| {
            format!(
                "loading the embedded XDP object (a conntrack table of {} flows needs \
                 memory; a smaller --max-flows needs less)",
                a.max_flows
            )
        })?;
    for name in PINNED_MAPS {
        if ebpf.map(name).is_none() {
            bail!("the embedded XDP object has no {name} map; rebuild router-ctl");
        }
    }
    {
        let mut devices = DevMapHash::try_from(ebpf.map_mut(DEVICES_MAP).context("DEVICES map")?)?;
        for idx in [config.lan_ifindex, config.wan_ifindex] {
            devices
                .insert(idx, idx, None, 0)
                .context("filling the device map")?;
        }
        let mut cfg: Array<_, Config> =
            Array::try_from(ebpf.map_mut(CONFIG_MAP).context("CONFIG map")?)?;
        cfg.set(0, config, 0).context("writing the configuration")?;
    }

    let created_dir = !pin_dir.exists();
    fs::create_dir_all(pin_dir).with_context(|| format!("creating {}", pin_dir.display()))?;
    let mut pinned: Vec<PathBuf> = Vec::new();
    let result = pin_and_attach(&mut ebpf, pin_dir, a, &mut pinned);
    let modes = match result {
        Ok(m) => m,
        Err(e) => {
            // Roll back: never leave half a router attached. Unpinning a
            // link detaches it once our fds close.
            for p in pinned {
                let _ = fs::remove_file(p);
            }
            if created_dir {
                let _ = fs::remove_dir(pin_dir);
            }
            return Err(e);
        }
    };
    let (lan, wan) = (a.lan.as_str(), a.wan.as_str());
    let mode = if modes[0] == modes[1] {
        modes[0].to_owned()
    } else {
        format!("{lan} {}, {wan} {}", modes[0], modes[1])
    };
    println!(
        "attached: {lan} (ifindex {}) <-> {wan} (ifindex {}), mode {mode}, \
         masquerade to {} ports {}-{}, table {} flows",
        config.lan_ifindex,
        config.wan_ifindex,
        Ipv4Addr::from(config.wan_addr),
        config.port_min,
        config.port_max,
        a.max_flows
    );
    println!("pins in {}", pin_dir.display());
    Ok(())
}

/// Pins the maps, loads the program, attaches and pins both links. Every
/// path pinned goes into `pinned` for the caller's rollback. Returns the
/// mode used on LAN and WAN.
fn pin_and_attach(
    ebpf: &mut aya::Ebpf,
    pin_dir: &Path,
    a: &AttachArgs,
    pinned: &mut Vec<PathBuf>,
) -> Result<[&'static str; 2]> {
    for name in PINNED_MAPS {
        let path = pin_dir.join(name);
        ebpf.map(name)
            .context("map missing")?
            .pin(&path)
            .with_context(|| format!("pinning {}", path.display()))?;
        pinned.push(path);
    }
    let prog: &mut Xdp = ebpf
        .program_mut(PROGRAM_NAME)
        .context("program missing from object")?
        .try_into()?;
    prog.load()
        .map_err(|e| anyhow!("the kernel verifier rejected the program: {e:?}"))?;
    let mut modes = ["native"; 2];
    for (i, (pin, iface)) in LINK_PINS.iter().zip([&a.lan, &a.wan]).enumerate() {
        let (id, mode) = attach_one(prog, iface, a.mode)?;
        modes[i] = mode_name(mode);
        let link = prog.take_link(id)?;
        let fd: FdLink = link
            .try_into()
            .context("XDP link is not an fd link (kernel too old)")?;
        let path = pin_dir.join(pin);
        fd.pin(&path)
            .with_context(|| format!("pinning {}", path.display()))?;
        pinned.push(path);
    }
    Ok(modes)
}

fn attach_one(
    prog: &mut Xdp,
    iface: &str,
    mode: Mode,
) -> Result<(aya::programs::xdp::XdpLinkId, XdpMode)> {
    match mode {
        Mode::Generic => prog
            .attach(iface, XdpMode::Skb)
            .map(|id| (id, XdpMode::Skb)),
        Mode::Native => prog
            .attach(iface, XdpMode::Driver)
            .map(|id| (id, XdpMode::Driver)),
        Mode::Auto => prog
            .attach(iface, XdpMode::Driver)
            .map(|id| (id, XdpMode::Driver))
            .or_else(|e| {
                eprintln!(
                    "warning: native XDP failed on {iface} ({e}); \
                     falling back to generic mode (slow)"
                );
                prog.attach(iface, XdpMode::Skb)
                    .map(|id| (id, XdpMode::Skb))
            }),
    }
    .with_context(|| {
        format!(
            "attaching XDP to {iface} (another XDP program may be attached: `ip link show {iface}`)"
        )
    })
}

pub fn detach(pin_dir: &Path) -> Result<()> {
    let links: Vec<PathBuf> = LINK_PINS
        .iter()
        .map(|l| pin_dir.join(l))
        .filter(|p| p.exists())
        .collect();
    let maps: Vec<PathBuf> = PINNED_MAPS
        .iter()
        .map(|m| pin_dir.join(m))
        .filter(|p| p.exists())
        .collect();
    if links.is_empty() && maps.is_empty() {
        // An empty directory is a leftover, not an attachment.
        let _ = fs::remove_dir(pin_dir);
        bail!("not attached (no pins in {})", pin_dir.display());
    }
    for path in &links {
        // Unpinning drops the last reference: the link detaches.
        let link = PinnedLink::from_pin(path)
            .with_context(|| format!("opening the link pin {}", path.display()))?;
        let fd = link
            .unpin()
            .with_context(|| format!("unpinning {}", path.display()))?;
        drop(fd);
    }
    for path in &maps {
        fs::remove_file(path).with_context(|| format!("removing {}", path.display()))?;
    }
    fs::remove_dir(pin_dir).with_context(|| {
        format!(
            "removing {} (it holds files router-ctl did not make?)",
            pin_dir.display()
        )
    })?;
    if links.is_empty() {
        println!("removed stale map pins; nothing was attached");
    } else {
        println!("detached; kernel forwarding handles all traffic again");
    }
    Ok(())
}
