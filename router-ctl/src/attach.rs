//! The router's lifecycle: `attach` (fresh, idempotent, live replace),
//! `detach`, and the inspection `status` builds on.
//!
//! Crash consistency (every step below can be cut short by `kill -9`):
//! - fresh attach: the maps, the program and both links are made and pinned
//!   in a private staging directory (`xdp-router-staging/<ns>`) with the configuration
//!   left empty (the data path passes every packet to the kernel while
//!   `CONFIG` is empty), then the directory is renamed into place, the
//!   record is written, and only then the configuration: that one map
//!   write turns the fast path on for both interfaces at once. A crash
//!   before it leaves traffic on the kernel path (the old state); leftovers
//!   are removed by the next router-ctl that takes the lock, and `status`
//!   reports them.
//! - replace: the new program is loaded against the pinned maps (conntrack,
//!   counters, rules, devices and config are shared, so flows survive); the
//!   record gets a `pending` entry, the configuration is written in place
//!   (one map write, both interfaces at once), then each pinned link is
//!   switched to the new program with `BPF_LINK_UPDATE` (atomic per
//!   interface, no gap). Termination signals are blocked throughout; only
//!   `kill -9` between the two link updates leaves the interfaces on
//!   different program versions (same maps and config), which `status`
//!   detects from the link program ids and `attach` repairs.
//! - detach: the configuration is cleared first (one write: both
//!   interfaces back on the kernel path at once), then the record, the
//!   links and the maps are removed.

use std::{
    borrow::Cow,
    ffi::{CStr, CString},
    fs,
    net::Ipv4Addr,
    os::{fd::AsFd as _, unix::fs::PermissionsExt as _},
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    EbpfLoader,
    maps::{Array, DevMapHash, HashMap, MapData, MapInfo},
    programs::{
        ProgramError, Xdp, XdpMode,
        links::{FdLink, PinnedLink},
        xdp::XdpLink,
    },
};
use router_common::maps::{
    CONFIG_MAP, CONNTRACK_MAP, Config, DEVICES_MAP, PORT_FORWARDS_MAP, PROGRAM_NAME,
    PortForwardKey, PortForwardTarget, Timeouts,
};
use tracing::{debug, info, warn};

use crate::{
    Mode, bpfsys, doctor, netlink,
    parse::WanAddr,
    pins::{LINK_PINS, PINNED_MAPS, ensure_bpffs},
    state::{self, ObjectId, Pending, RouterConfig, State},
};

/// Everything `attach` (and `apply`) asks for.
#[derive(Clone, Debug)]
pub struct AttachArgs {
    pub lan: String,
    pub wan: String,
    pub mode: Mode,
    pub wan_addr: WanAddr,
    pub port_range: (u16, u16),
    pub max_flows: u32,
    pub timeouts: Timeouts,
    /// Replace an XDP program router-ctl did not attach.
    pub force: bool,
    /// Replace the program even when object and configuration are unchanged.
    pub reload: bool,
    /// Load this object instead of the embedded one (hidden, for tests).
    pub object: Option<PathBuf>,
}

/// Where a router lives: its namespace and pin directory.
#[derive(Clone, Debug)]
pub struct Ctx {
    pub netns: Option<String>,
    pub pin_dir: PathBuf,
}

impl Ctx {
    #[must_use]
    pub fn ns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    /// The private directory a fresh attach builds its pins in: on the same
    /// bpffs (so a rename moves it into place), outside the pin root (bpffs
    /// forbids dots in names, so it cannot be a hidden sibling).
    #[must_use]
    pub fn tmp_dir(&self) -> PathBuf {
        let name = self.pin_dir.file_name().unwrap_or_default().to_owned();
        let root = self.pin_dir.parent().unwrap_or(&self.pin_dir);
        let staging = root.file_name().map_or_else(
            || "xdp-router-staging".into(),
            |n| format!("{}-staging", n.to_string_lossy()),
        );
        root.with_file_name(staging).join(name)
    }
}

/// What `attach` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Attached,
    Replaced,
    Unchanged,
}

/// The XDP object to load.
pub struct Object {
    pub bytes: Cow<'static, [u8]>,
    pub id: ObjectId,
}

static EMBEDDED: &[u8] = aya::include_bytes_aligned!(env!("ROUTER_EBPF_OBJ"));

impl Object {
    pub fn load(path: Option<&Path>) -> Result<Self> {
        match path {
            None => Ok(Self {
                bytes: Cow::Borrowed(EMBEDDED),
                id: ObjectId::of(EMBEDDED, "embedded"),
            }),
            Some(p) => {
                let bytes =
                    fs::read(p).with_context(|| format!("reading the object {}", p.display()))?;
                let id = ObjectId::of(&bytes, &p.display().to_string());
                Ok(Self {
                    bytes: Cow::Owned(bytes),
                    id,
                })
            }
        }
    }

    /// The identity of the embedded object (for `--version` and `status`).
    #[must_use]
    pub fn embedded_id() -> ObjectId {
        ObjectId::of(EMBEDDED, "embedded")
    }
}

/// Stops the process at a named step when `ROUTER_CTL_CRASH_AT` names it:
/// `kill -9` of ourselves, for the crash-consistency tests.
pub fn crash_point(name: &str) {
    if std::env::var("ROUTER_CTL_CRASH_AT").is_ok_and(|v| v == name) {
        eprintln!("router-ctl: crash injected at {name}");
        // SAFETY: plain kill(2) of our own process.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// Blocks SIGINT, SIGTERM, SIGHUP and SIGQUIT until dropped, so Ctrl-C
/// cannot cut a state change in half (it takes effect when the change is
/// done).
pub struct SignalsBlocked(libc::sigset_t);

impl SignalsBlocked {
    #[must_use]
    pub fn new() -> Self {
        // SAFETY: sigset manipulation on zeroed sets we own.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&raw mut set);
            for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
                libc::sigaddset(&raw mut set, s);
            }
            libc::sigprocmask(libc::SIG_BLOCK, &raw const set, &raw mut old);
            Self(old)
        }
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in new().
        unsafe {
            libc::sigprocmask(libc::SIG_SETMASK, &raw const self.0, std::ptr::null_mut());
        }
    }
}

pub fn ifindex(name: &str) -> Result<u32> {
    let c = CString::new(name).map_err(|_| anyhow!("bad interface name {name:?}"))?;
    // SAFETY: c is NUL-terminated.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        bail!("no such interface {name:?} (check `ip link`, or pass -n NETNS)");
    }
    Ok(idx)
}

/// The name of interface `idx`, if it exists.
#[must_use]
pub fn ifname(idx: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf has IF_NAMESIZE bytes.
    let p = unsafe { libc::if_indextoname(idx, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: if_indextoname wrote a NUL-terminated name.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// The IPv4 addresses of `iface` in the current network namespace, in the
/// kernel's order (primary addresses first).
pub fn ipv4_addrs(iface: &str) -> Result<Vec<Ipv4Addr>> {
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

/// Checks the interfaces and arguments and builds the configuration;
/// changes nothing.
pub fn resolve(a: &AttachArgs) -> Result<RouterConfig> {
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
                warn!(
                    "{x} is not an address of {wan}; replies reach the router only \
                     if the upstream routes {x} to it"
                );
            }
            x
        }
    };
    a.max_flows
        .checked_mul(2)
        .context("--max-flows too large")?;
    Ok(RouterConfig {
        lan: a.lan.clone(),
        wan: a.wan.clone(),
        lan_ifindex: lan_idx,
        wan_ifindex: wan_idx,
        wan_addr,
        port_min: a.port_range.0,
        port_max: a.port_range.1,
        max_flows: a.max_flows,
        timeouts: a.timeouts.into(),
    })
}

/// The map value of a configuration.
#[must_use]
pub fn to_map_config(c: &RouterConfig, seed: u32) -> Config {
    Config {
        lan_ifindex: c.lan_ifindex,
        wan_ifindex: c.wan_ifindex,
        wan_addr: c.wan_addr.octets(),
        port_min: c.port_min,
        port_max: c.port_max,
        hash_seed: seed,
        pad: 0,
        timeouts: c.timeouts.into(),
    }
}

fn mode_name(m: XdpMode) -> &'static str {
    if m == XdpMode::Skb {
        "generic"
    } else {
        "native"
    }
}

#[must_use]
pub fn mode_arg_name(m: Mode) -> &'static str {
    match m {
        Mode::Auto => "auto",
        Mode::Native => "native",
        Mode::Generic => "generic",
    }
}

/// One pinned link as the kernel sees it.
#[derive(Clone, Debug)]
pub struct LinkNow {
    pub info: bpfsys::LinkInfo,
    /// The interface's name, if it still exists in this namespace.
    pub iface: Option<String>,
    /// `native`/`generic` if the interface runs this link's program.
    pub mode: Option<&'static str>,
}

/// What is pinned and running right now.
#[derive(Clone, Debug, Default)]
pub struct Running {
    pub maps_present: Vec<&'static str>,
    pub links: Vec<(&'static str, Result<LinkNow, String>)>,
    /// The `CONFIG` map's entry, if the map is pinned and readable.
    pub config: Option<Config>,
}

impl Running {
    #[must_use]
    pub fn any_pins(&self) -> bool {
        !self.maps_present.is_empty() || !self.links.is_empty()
    }

    #[must_use]
    pub fn complete(&self) -> bool {
        self.maps_present.len() == PINNED_MAPS.len()
            && self.links.len() == LINK_PINS.len()
            && self.links.iter().all(|(_, l)| l.is_ok())
    }

    /// The program ids of the links, in `LINK_PINS` order.
    #[must_use]
    pub fn prog_ids(&self) -> Vec<u32> {
        self.links
            .iter()
            .filter_map(|(_, l)| l.as_ref().ok().map(|l| l.info.prog_id))
            .collect()
    }

    #[must_use]
    pub fn link(&self, pin: &str) -> Option<&LinkNow> {
        self.links
            .iter()
            .find(|(p, _)| *p == pin)
            .and_then(|(_, l)| l.as_ref().ok())
    }

    /// Whether the configuration is set (the fast path is on).
    #[must_use]
    pub fn configured(&self) -> bool {
        self.config.is_some_and(|c| c.lan_ifindex != 0)
    }
}

/// Inspects the pins in `dir` (changes nothing).
#[must_use]
pub fn inspect(dir: &Path) -> Running {
    let mut r = Running {
        maps_present: PINNED_MAPS
            .iter()
            .copied()
            .filter(|m| dir.join(m).exists())
            .collect(),
        ..Running::default()
    };
    for pin in LINK_PINS {
        let path = dir.join(pin);
        if !path.exists() {
            continue;
        }
        let now = bpfsys::obj_get(&path)
            .and_then(|fd| bpfsys::link_info(fd.as_fd()))
            .map_err(|e| format!("{}: {e}", path.display()))
            .map(|info| {
                let attrs = netlink::link(info.ifindex).ok();
                let mode = attrs.as_ref().and_then(|a| {
                    a.xdp
                        .programs()
                        .iter()
                        .find(|(id, _)| *id == info.prog_id)
                        .map(|(_, flag)| {
                            if *flag == netlink::XDP_FLAGS_SKB_MODE {
                                "generic"
                            } else {
                                "native"
                            }
                        })
                });
                LinkNow {
                    info,
                    iface: attrs.map(|a| a.name),
                    mode,
                }
            });
        r.links.push((pin, now));
    }
    if r.maps_present.contains(&CONFIG_MAP) {
        r.config = crate::pins::read_config(dir).ok();
    }
    r
}

/// Detaches the link pinned at `path` now (`BPF_LINK_DETACH`), even while
/// another process holds it open; unpinning alone frees it later, from a
/// kernel work queue.
fn detach_link_pin(path: &Path) {
    if let Ok(fd) = bpfsys::obj_get(path)
        && let Err(e) = bpfsys::link_detach(fd.as_fd())
    {
        debug!("BPF_LINK_DETACH {}: {e}", path.display());
    }
}

/// Removes exactly our pins from `dir` (links detached first), then `dir`
/// if it is empty. Returns the names of files left behind that router-ctl
/// did not make.
fn remove_pins(dir: &Path) -> Result<Vec<String>> {
    for name in LINK_PINS {
        detach_link_pin(&dir.join(name));
    }
    for name in LINK_PINS.iter().chain(PINNED_MAPS.iter()) {
        let p = dir.join(name);
        match fs::remove_file(&p) {
            Ok(()) => debug!("removed {}", p.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", p.display())),
        }
    }
    let others: Vec<String> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    if others.is_empty() {
        let _ = fs::remove_dir(dir);
    }
    Ok(others)
}

/// Removes the leftovers of an interrupted fresh attach (we hold the lock,
/// so nobody else is building them). Unpinning its links detaches them.
pub fn gc_tmp(ctx: &Ctx) {
    let tmp = ctx.tmp_dir();
    if tmp.exists() {
        match remove_pins(&tmp) {
            Ok(left) if left.is_empty() => {
                warn!("removed {} left by an interrupted attach", tmp.display());
            }
            Ok(left) => warn!(
                "{} holds files router-ctl did not make: {}",
                tmp.display(),
                left.join(", ")
            ),
            Err(e) => warn!("removing {}: {e:#}", tmp.display()),
        }
    }
}

/// Attaches, replaces, or finds nothing to do. `forwards` are put into a
/// freshly created rule map before the fast path turns on (apply).
pub fn attach(
    ctx: &Ctx,
    a: &AttachArgs,
    forwards: &[(PortForwardKey, PortForwardTarget)],
) -> Result<Outcome> {
    let desired = resolve(a)?;
    let obj = Object::load(a.object.as_deref())?;
    ensure_bpffs()?;
    let _lock = state::lock(ctx.ns())?;
    let _signals = SignalsBlocked::new();
    gc_tmp(ctx);
    let running = inspect(&ctx.pin_dir);
    let record = state::load(ctx.ns()).unwrap_or_else(|e| {
        warn!("ignoring the attach record: {e:#}");
        None
    });
    if running.any_pins() {
        replace_or_keep(ctx, a, &desired, &obj, &running, record)
    } else {
        if record.is_some() {
            warn!(
                "the attach record says the router was attached, but its pins are gone \
                 (a reboot or bpffs unmounted?); attaching afresh"
            );
        }
        fresh(ctx, a, &desired, &obj, forwards)?;
        Ok(Outcome::Attached)
    }
}

/// Refuses (or with `force` removes) XDP programs router-ctl did not attach.
fn check_foreign(iface: &str, idx: u32, force: bool) -> Result<()> {
    let attrs = netlink::link(idx).with_context(|| format!("reading {iface}'s XDP state"))?;
    for (prog_id, flag) in attrs.xdp.programs() {
        let mode = match flag {
            netlink::XDP_FLAGS_SKB_MODE => "generic",
            netlink::XDP_FLAGS_HW_MODE => "offload",
            _ => "native",
        };
        if !force {
            bail!(
                "{iface} already has an XDP program (id {prog_id}, {mode} mode) that router-ctl \
                 did not attach; remove it (`ip link set dev {iface} xdp off`, or detach the \
                 tool that owns it), or pass --force to replace it"
            );
        }
        match netlink::xdp_detach(idx, flag) {
            Ok(()) => {}
            Err(e) => {
                // Attached through a bpf_link, which netlink cannot remove.
                let (link_id, fd) = bpfsys::find_xdp_link(prog_id, idx).ok_or_else(|| {
                    anyhow!(
                        "--force: cannot remove XDP program {prog_id} from {iface}: {e} \
                         (and no bpf_link attaches it)"
                    )
                })?;
                bpfsys::link_detach(fd.as_fd()).with_context(|| {
                    format!("--force: detaching link {link_id} of program {prog_id} from {iface}")
                })?;
            }
        }
        warn!("--force: removed XDP program {prog_id} ({mode} mode) from {iface}");
    }
    Ok(())
}

fn verifier_error(e: ProgramError) -> anyhow::Error {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n  ");
            anyhow!(
                "the kernel verifier rejected the XDP program ({io_error}); the end of its log:\n  \
                 {tail}\nthis object does not fit this kernel: use the router-ctl built for it"
            )
        }
        other => anyhow!("loading the XDP program into the kernel: {other}"),
    }
}

fn load_program(ebpf: &mut aya::Ebpf) -> Result<u32> {
    let prog: &mut Xdp = ebpf
        .program_mut(PROGRAM_NAME)
        .with_context(|| format!("the object has no program {PROGRAM_NAME}"))?
        .try_into()
        .context("the object's router program is not XDP")?;
    prog.load().map_err(verifier_error)?;
    Ok(prog.info().map_or(0, |i| i.id()))
}

fn xdp_prog(ebpf: &mut aya::Ebpf) -> Result<&mut Xdp> {
    ebpf.program_mut(PROGRAM_NAME)
        .context("program missing from object")?
        .try_into()
        .context("the object's router program is not XDP")
}

fn attach_one(prog: &mut Xdp, iface: &str, mode: Mode) -> Result<(XdpLink, XdpMode)> {
    let r = match mode {
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
                warn!(
                    "NATIVE XDP FAILED ON {iface} ({e}); FALLING BACK TO GENERIC MODE: the fast \
                     path runs after the kernel built an skb and is several times slower. \
                     Check `router-ctl doctor {iface}`; use --mode native to fail instead"
                );
                prog.attach(iface, XdpMode::Skb)
                    .map(|id| (id, XdpMode::Skb))
            }),
    };
    let (id, m) = r.with_context(|| {
        let how = match mode {
            Mode::Native => "in native mode (the driver may not support XDP; try --mode auto)",
            Mode::Generic => "in generic mode",
            Mode::Auto => "in native or generic mode",
        };
        format!("attaching XDP to {iface} {how}")
    })?;
    Ok((prog.take_link(id)?, m))
}

fn pin_private(fd: FdLink, path: &Path) -> Result<()> {
    let pinned = fd
        .pin(path)
        .with_context(|| format!("pinning {}", path.display()))?;
    drop(pinned);
    chmod_600(path)
}

fn chmod_600(path: &Path) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))
}

/// A fresh attach, built in the temporary directory and renamed into place.
fn fresh(
    ctx: &Ctx,
    a: &AttachArgs,
    desired: &RouterConfig,
    obj: &Object,
    forwards: &[(PortForwardKey, PortForwardTarget)],
) -> Result<()> {
    check_foreign(&a.lan, desired.lan_ifindex, a.force)?;
    check_foreign(&a.wan, desired.wan_ifindex, a.force)?;
    for w in doctor::attach_warnings(&a.lan, &a.wan) {
        warn!("{w}");
    }
    let root = ctx.pin_dir.parent().context("pin dir without parent")?;
    state::private_dir(root)?;
    let tmp = ctx.tmp_dir();
    state::private_dir(&tmp)?;
    let result = build_fresh(ctx, a, desired, obj, forwards, &tmp);
    match result {
        Ok(()) => Ok(()),
        Err(e) => {
            // Roll back: the links held only by our fds detach when the
            // Ebpf is dropped (it was, inside build_fresh); unpin the rest.
            let _ = remove_pins(&tmp);
            let _ = fs::remove_dir(&tmp);
            Err(e)
        }
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one linear sequence of checks or steps, in order"
)]
fn build_fresh(
    ctx: &Ctx,
    a: &AttachArgs,
    desired: &RouterConfig,
    obj: &Object,
    forwards: &[(PortForwardKey, PortForwardTarget)],
    tmp: &Path,
) -> Result<()> {
    let entries = desired.max_flows * 2;
    let mut loader = EbpfLoader::new();
    loader.map_max_entries(CONNTRACK_MAP, entries);
    let paths: Vec<(&str, PathBuf)> = PINNED_MAPS.iter().map(|m| (*m, tmp.join(m))).collect();
    for (m, p) in &paths {
        loader.map_pin_path(m, p.as_path());
    }
    let mut ebpf = loader.load(&obj.bytes).with_context(|| {
        format!(
            "loading the XDP object (a conntrack table of {} flows needs memory; a smaller \
             --max-flows needs less)",
            desired.max_flows
        )
    })?;
    for (m, p) in &paths {
        if ebpf.map(m).is_none() || !p.exists() {
            bail!("the XDP object has no {m} map; rebuild router-ctl");
        }
        chmod_600(p)?;
    }
    {
        let mut devices = DevMapHash::try_from(ebpf.map_mut(DEVICES_MAP).context("DEVICES map")?)?;
        for idx in [desired.lan_ifindex, desired.wan_ifindex] {
            devices
                .insert(idx, idx, None, 0)
                .context("filling the device map")?;
        }
        let mut rules: HashMap<_, PortForwardKey, PortForwardTarget> = HashMap::try_from(
            ebpf.map_mut(PORT_FORWARDS_MAP)
                .context("PORT_FORWARDS map")?,
        )?;
        for (k, t) in forwards {
            rules
                .insert(k, t, 0)
                .context("filling the port-forward rules")?;
        }
    }
    let prog_id = load_program(&mut ebpf)?;
    crash_point("fresh-after-load");
    let prog = xdp_prog(&mut ebpf)?;
    let (lan_link, lan_mode) = attach_one(prog, &a.lan, a.mode)?;
    info!("attached to {} ({})", a.lan, mode_name(lan_mode));
    let (wan_link, wan_mode) = match attach_one(prog, &a.wan, a.mode) {
        Ok(x) => x,
        Err(e) => {
            drop(lan_link); // closes the only fd: LAN detaches
            return Err(anyhow!(
                "{e:#}\nrolled back: {} is detached again and nothing is pinned; the kernel \
                 path handles all traffic as before",
                a.lan
            ));
        }
    };
    crash_point("fresh-after-links");
    let lan_fd: FdLink = lan_link
        .try_into()
        .context("XDP link is not an fd link (kernel older than 5.9?)")?;
    let wan_fd: FdLink = wan_link
        .try_into()
        .context("XDP link is not an fd link (kernel older than 5.9?)")?;
    pin_private(lan_fd, &tmp.join(LINK_PINS[0]))?;
    crash_point("fresh-between-link-pins");
    pin_private(wan_fd, &tmp.join(LINK_PINS[1]))?;
    crash_point("fresh-after-link-pins");
    // An empty leftover directory would make the rename fail.
    let _ = fs::remove_dir(&ctx.pin_dir);
    fs::rename(tmp, &ctx.pin_dir).with_context(|| {
        format!(
            "moving {} into place at {}",
            tmp.display(),
            ctx.pin_dir.display()
        )
    })?;
    crash_point("fresh-after-rename");
    let now = state::now_unix();
    let rec = State {
        format: state::FORMAT,
        netns: ctx.netns.clone(),
        pin_dir: ctx.pin_dir.display().to_string(),
        config: desired.clone(),
        requested_mode: mode_arg_name(a.mode).to_owned(),
        lan_mode: mode_name(lan_mode).to_owned(),
        wan_mode: mode_name(wan_mode).to_owned(),
        object: obj.id.clone(),
        prog_id,
        attached_at: now,
        replaced_at: None,
        replacements: 0,
        pending: None,
    };
    if let Err(e) = state::save(ctx.ns(), &rec) {
        // Undo: nothing is configured yet, so traffic never left the kernel.
        let _ = remove_pins(&ctx.pin_dir);
        return Err(e.context("writing the attach record; rolled back"));
    }
    crash_point("fresh-after-record");
    // The commit: one map write turns the fast path on for both interfaces.
    let seed = random_u32()?;
    let mut cfg: Array<_, Config> =
        Array::try_from(ebpf.map_mut(CONFIG_MAP).context("CONFIG map")?)?;
    cfg.set(0, to_map_config(desired, seed), 0)
        .context("writing the configuration")?;
    let mode = if lan_mode == wan_mode {
        mode_name(lan_mode).to_owned()
    } else {
        format!(
            "{} {}, {} {}",
            a.lan,
            mode_name(lan_mode),
            a.wan,
            mode_name(wan_mode)
        )
    };
    println!(
        "attached: {} (ifindex {}) <-> {} (ifindex {}), mode {mode}, masquerade to {} ports \
         {}-{}, table {} flows, object {}",
        a.lan,
        desired.lan_ifindex,
        a.wan,
        desired.wan_ifindex,
        desired.wan_addr,
        desired.port_min,
        desired.port_max,
        desired.max_flows,
        obj.id.version()
    );
    println!("pins in {}", ctx.pin_dir.display());
    Ok(())
}

/// The map definitions of the new object must match the pinned maps it is
/// about to share, or the two programs would read each other's entries
/// wrongly.
fn check_layout(dir: &Path, obj: &Object, entries: u32) -> Result<()> {
    let parsed = aya_obj::Object::parse(&obj.bytes).context("parsing the XDP object")?;
    for name in PINNED_MAPS {
        let def = parsed
            .maps
            .get(name)
            .with_context(|| format!("the new object has no {name} map"))?;
        let pinned = MapInfo::from_pin(dir.join(name))
            .with_context(|| format!("reading the pinned {name}"))?;
        let ty = pinned.map_type().map_or(u32::MAX, |t| t as u32);
        let want_entries = if name == CONNTRACK_MAP {
            entries
        } else {
            def.max_entries()
        };
        if name == CONNTRACK_MAP && pinned.max_entries() != want_entries {
            bail!(
                "the conntrack table holds {} flows and cannot be resized while attached \
                 (its flows live in it); `router-ctl detach` and attach again to resize \
                 (open connections through the router are then dropped), or keep \
                 --max-flows {}",
                pinned.max_entries() / 2,
                pinned.max_entries() / 2
            );
        }
        if ty != def.map_type()
            || pinned.key_size() != def.key_size()
            || pinned.value_size() != def.value_size()
            || pinned.max_entries() != want_entries
        {
            bail!(
                "the new object's {name} map (type {}, key {} B, value {} B, {} entries) does \
                 not match the pinned one (type {ty}, key {} B, value {} B, {} entries): a live \
                 replace would corrupt it; `router-ctl detach` and attach again",
                def.map_type(),
                def.key_size(),
                def.value_size(),
                want_entries,
                pinned.key_size(),
                pinned.value_size(),
                pinned.max_entries()
            );
        }
    }
    Ok(())
}

/// Already attached: nothing to do, or a live replace.
#[expect(
    clippy::too_many_lines,
    reason = "one linear sequence of checks or steps, in order"
)]
fn replace_or_keep(
    ctx: &Ctx,
    a: &AttachArgs,
    desired: &RouterConfig,
    obj: &Object,
    running: &Running,
    record: Option<State>,
) -> Result<Outcome> {
    let dir = &ctx.pin_dir;
    if !running.complete() {
        let missing: Vec<&str> = PINNED_MAPS
            .iter()
            .chain(LINK_PINS.iter())
            .copied()
            .filter(|n| !dir.join(n).exists())
            .collect();
        bail!(
            "the pins in {} are incomplete (missing: {}; unreadable links: {}): this is not a \
             router that can be updated in place; run `router-ctl detach` and attach again",
            dir.display(),
            if missing.is_empty() {
                "none".to_owned()
            } else {
                missing.join(", ")
            },
            running
                .links
                .iter()
                .filter_map(|(_, l)| l.as_ref().err().cloned())
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    // Interfaces: a link cannot move to another interface.
    let cur_idx: Vec<u32> = running
        .links
        .iter()
        .filter_map(|(_, l)| l.as_ref().ok().map(|l| l.info.ifindex))
        .collect();
    if cur_idx != [desired.lan_ifindex, desired.wan_ifindex] {
        let names: Vec<String> = cur_idx
            .iter()
            .map(|&i| ifname(i).unwrap_or_else(|| format!("ifindex {i}")))
            .collect();
        bail!(
            "already attached to {} (LAN) and {} (WAN); to move the router to {} and {}, \
             run `router-ctl detach` first",
            names.first().map_or("?", String::as_str),
            names.get(1).map_or("?", String::as_str),
            a.lan,
            a.wan
        );
    }
    // Mode: fixed when a link is made.
    for (pin, iface) in LINK_PINS.iter().zip([&a.lan, &a.wan]) {
        let cur = running.link(pin).and_then(|l| l.mode);
        let want = match a.mode {
            Mode::Auto => None,
            Mode::Native => Some("native"),
            Mode::Generic => Some("generic"),
        };
        if let (Some(w), Some(c)) = (want, cur)
            && w != c
        {
            bail!(
                "{iface} runs in {c} mode; a mode change needs new links (a short gap): \
                 `router-ctl detach` and attach again with --mode {w}"
            );
        }
    }
    let entries = desired.max_flows * 2;
    check_layout(dir, obj, entries)?;

    let ids = running.prog_ids();
    let consistent = ids.len() == 2 && ids[0] == ids[1];
    let cur_cfg = running.config;
    let seed = cur_cfg
        .filter(|c| c.hash_seed != 0)
        .map_or_else(random_u32, |c| Ok(c.hash_seed))?;
    let want_cfg = to_map_config(desired, seed);
    let same = record.as_ref().is_some_and(|r| {
        r.object.same(&obj.id)
            && r.config == *desired
            && r.pending.is_none()
            && consistent
            && ids[0] == r.prog_id
    }) && cur_cfg == Some(want_cfg);
    if same && !a.reload {
        println!(
            "already attached to {} and {} with this object ({}) and configuration; nothing \
             changed",
            a.lan,
            a.wan,
            obj.id.version()
        );
        return Ok(Outcome::Unchanged);
    }
    if !consistent {
        warn!(
            "the two links run different programs ({ids:?}): an earlier replace was \
             interrupted; finishing it now"
        );
    }

    let mut loader = EbpfLoader::new();
    loader.map_max_entries(CONNTRACK_MAP, entries);
    let paths: Vec<(&str, PathBuf)> = PINNED_MAPS.iter().map(|m| (*m, dir.join(m))).collect();
    for (m, p) in &paths {
        loader.map_pin_path(m, p.as_path());
    }
    let mut ebpf = loader
        .load(&obj.bytes)
        .context("loading the new XDP object against the pinned maps")?;
    let prog_id = load_program(&mut ebpf)?;
    crash_point("replace-after-load");

    let now = state::now_unix();
    let old = record.clone();
    let mut rec = record.unwrap_or_else(|| State {
        format: state::FORMAT,
        netns: ctx.netns.clone(),
        pin_dir: dir.display().to_string(),
        config: desired.clone(),
        requested_mode: mode_arg_name(a.mode).to_owned(),
        lan_mode: running
            .link(LINK_PINS[0])
            .and_then(|l| l.mode)
            .unwrap_or("unknown")
            .to_owned(),
        wan_mode: running
            .link(LINK_PINS[1])
            .and_then(|l| l.mode)
            .unwrap_or("unknown")
            .to_owned(),
        object: obj.id.clone(),
        prog_id: ids.first().copied().unwrap_or(0),
        attached_at: now,
        replaced_at: None,
        replacements: 0,
        pending: None,
    });
    rec.pending = Some(Pending {
        object: obj.id.clone(),
        config: desired.clone(),
        prog_id,
        started_at: now,
    });
    state::save(ctx.ns(), &rec)?;
    crash_point("replace-after-journal");

    // Commit 1: the configuration, one write seen by both interfaces.
    if cur_cfg != Some(want_cfg) {
        let mut cfg: Array<_, Config> =
            Array::try_from(ebpf.map_mut(CONFIG_MAP).context("CONFIG map")?)?;
        cfg.set(0, want_cfg, 0)
            .context("writing the configuration")?;
        info!("configuration updated");
    }
    crash_point("replace-after-config");
    // Commit 2: each link switches program atomically (BPF_LINK_UPDATE).
    let prog = xdp_prog(&mut ebpf)?;
    for (i, pin) in LINK_PINS.iter().enumerate() {
        let path = dir.join(pin);
        let pinned = PinnedLink::from_pin(&path)
            .with_context(|| format!("opening the link pin {}", path.display()))?;
        let link = XdpLink::try_from(FdLink::from(pinned))
            .with_context(|| format!("{} is not an XDP link", path.display()))?;
        let id = prog.attach_to_link(link).with_context(|| {
            format!(
                "switching the link {} to the new program{}",
                path.display(),
                if i == 1 {
                    " (the LAN link already runs it; run attach again to finish)"
                } else {
                    ""
                }
            )
        })?;
        // Keep the link out of the program's drop: the pin holds it.
        drop(prog.take_link(id)?);
        info!("link {pin} now runs program {prog_id}");
        if i == 0 {
            crash_point("replace-between-links");
        }
    }
    crash_point("replace-after-links");
    rec.pending = None;
    rec.config = desired.clone();
    rec.object = obj.id.clone();
    rec.prog_id = prog_id;
    rec.replaced_at = Some(now);
    rec.replacements += 1;
    state::save(ctx.ns(), &rec)?;
    let what = match &old {
        Some(o) if !o.object.same(&obj.id) && o.config != *desired => {
            "new object and configuration"
        }
        Some(o) if !o.object.same(&obj.id) => "new object",
        Some(o) if o.config != *desired => "new configuration",
        Some(_) if a.reload => "same object and configuration (--reload)",
        Some(_) => "finishing an interrupted change",
        None => "no attach record (repaired)",
    };
    println!(
        "replaced the program on {} and {} in place ({what}): program {} -> {prog_id}, object \
         {}; conntrack, counters and rules kept",
        a.lan,
        a.wan,
        ids.first().copied().unwrap_or(0),
        obj.id.version()
    );
    Ok(Outcome::Replaced)
}

/// Detaches: fast path off (one config write), then record, links and maps
/// removed. Returns whether anything was attached.
pub fn detach(ctx: &Ctx) -> Result<bool> {
    ensure_bpffs()?;
    let _lock = state::lock(ctx.ns())?;
    let _signals = SignalsBlocked::new();
    gc_tmp(ctx);
    let dir = &ctx.pin_dir;
    let running = inspect(dir);
    let record = state::load(ctx.ns()).ok().flatten();
    if !running.any_pins() {
        let had_record = record.is_some();
        state::remove(ctx.ns())?;
        let _ = fs::remove_dir(dir);
        if had_record {
            println!(
                "not attached: the pins in {} were already gone (a reboot or bpffs unmounted?); \
                 removed the attach record",
                dir.display()
            );
        } else {
            println!("not attached (no pins in {}); nothing to do", dir.display());
        }
        return Ok(false);
    }
    // Commit: both interfaces back to the kernel path in one write.
    if running.maps_present.contains(&CONFIG_MAP) {
        let map = crate::pins::open_map(dir, CONFIG_MAP)?;
        let mut cfg: Array<MapData, Config> = Array::try_from(map)?;
        cfg.set(0, Config::default(), 0)
            .context("clearing the configuration")?;
    }
    crash_point("detach-after-unconfigure");
    state::remove(ctx.ns())?;
    let ifaces: Vec<(u32, u32)> = running
        .links
        .iter()
        .filter_map(|(_, l)| l.as_ref().ok().map(|l| (l.info.ifindex, l.info.prog_id)))
        .collect();
    let left = remove_pins(dir)?;
    crash_point("detach-after-unpin");
    if !left.is_empty() {
        warn!(
            "left {} in place: it holds files router-ctl did not make ({})",
            dir.display(),
            left.join(", ")
        );
    }
    for (idx, prog) in ifaces {
        if let Ok(l) = netlink::link(idx)
            && l.xdp.programs().iter().any(|(p, _)| *p == prog)
        {
            warn!(
                "{} still runs the XDP program {prog}: another process holds its link open \
                 (it detaches when that process exits)",
                l.name
            );
        }
    }
    if running.links.is_empty() {
        println!("removed stale map pins; nothing was attached");
    } else {
        println!("detached; kernel forwarding handles all traffic again");
    }
    Ok(true)
}
