//! `router-ctl`: loads the embedded XDP object, attaches it to the LAN and
//! WAN interfaces, pins it under bpffs so it outlives the command, and reads
//! its counters.

use std::{
    ffi::CString,
    fs,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf,
    maps::{Array, DevMapHash, Map, MapData, PerCpuArray},
    programs::{Xdp, XdpMode, links::FdLink, links::PinnedLink},
};
use clap::{Parser, Subcommand, ValueEnum};
use router_common::maps::{
    CONFIG_MAP, COUNTERS_MAP, Config, Counter, CounterValue, DEVICES_MAP, PROGRAM_NAME,
};

const BPFFS: &str = "/sys/fs/bpf";
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Parser)]
#[command(version, about = "XDP NAT fast path controller", long_about = None)]
struct Cli {
    /// Work on the interfaces of this named network namespace (like `ip -n`).
    /// Pins stay in the caller's bpffs, unlike with `ip netns exec`.
    #[arg(short = 'n', long = "netns", global = true)]
    netns: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    /// Native (driver) mode, falling back to generic with a warning.
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (skb) mode: works everywhere, slower.
    Generic,
}

#[derive(Subcommand)]
enum Cmd {
    /// Load and attach the fast path to LAN and WAN, then exit; it keeps running.
    ///
    /// Example: `router-ctl -n router attach lan0 wan0`
    Attach {
        lan: String,
        wan: String,
        #[arg(long, value_enum, default_value = "auto")]
        mode: Mode,
    },
    /// Detach and remove exactly the pins that `attach` made.
    Detach,
    /// Print the summed per-CPU counters.
    Stats {
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("router-ctl needs root (CAP_BPF and CAP_NET_ADMIN); run it with sudo");
    }
    let pin_dir = pin_dir(cli.netns.as_deref());
    if let Some(ns) = &cli.netns {
        // Enter only the network namespace, on the only thread: interface
        // names and netlink resolve there, pins stay in our bpffs.
        enter_netns(ns)?;
    }
    match cli.cmd {
        Cmd::Attach { lan, wan, mode } => attach(&pin_dir, &lan, &wan, mode),
        Cmd::Detach => detach(&pin_dir),
        Cmd::Stats { json } => stats(&pin_dir, json),
    }
}

fn pin_dir(netns: Option<&str>) -> PathBuf {
    Path::new(BPFFS)
        .join("xdp-router")
        .join(netns.unwrap_or("default"))
}

fn enter_netns(name: &str) -> Result<()> {
    let path = Path::new("/run/netns").join(name);
    let f = fs::File::open(&path).with_context(|| {
        format!(
            "no network namespace {name:?} ({} missing; see `ip netns list`)",
            path.display()
        )
    })?;
    // SAFETY: valid fd; CLONE_NEWNET affects only this thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns into {name}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn ensure_bpffs() -> Result<()> {
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

fn ifindex(name: &str) -> Result<u32> {
    let c = CString::new(name).map_err(|_| anyhow!("bad interface name {name:?}"))?;
    // SAFETY: c is NUL-terminated.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 {
        bail!("no such interface {name:?} (check `ip link`, or pass -n NETNS)");
    }
    Ok(idx)
}

fn attach(pin_dir: &Path, lan: &str, wan: &str, mode: Mode) -> Result<()> {
    let lan_idx = ifindex(lan)?;
    let wan_idx = ifindex(wan)?;
    ensure_bpffs()?;
    if pin_dir.join("link_lan").exists() {
        bail!(
            "already attached (pins in {}); run `router-ctl detach` first",
            pin_dir.display()
        );
    }
    let mut ebpf = Ebpf::load(aya::include_bytes_aligned!(env!("ROUTER_EBPF_OBJ")))
        .context("loading the embedded XDP object")?;
    {
        let mut devices = DevMapHash::try_from(ebpf.map_mut(DEVICES_MAP).context("DEVICES map")?)?;
        for idx in [lan_idx, wan_idx] {
            devices
                .insert(idx, idx, None, 0)
                .context("filling the device map")?;
        }
        let mut config: Array<_, Config> =
            Array::try_from(ebpf.map_mut(CONFIG_MAP).context("CONFIG map")?)?;
        config.set(
            0,
            Config {
                lan_ifindex: lan_idx,
                wan_ifindex: wan_idx,
            },
            0,
        )?;
    }
    fs::create_dir_all(pin_dir).with_context(|| format!("creating {}", pin_dir.display()))?;
    let mut pinned_paths: Vec<PathBuf> = Vec::new();
    let result = (|| -> Result<()> {
        for name in [COUNTERS_MAP, DEVICES_MAP, CONFIG_MAP] {
            let path = pin_dir.join(name);
            ebpf.map(name).context("map missing")?.pin(&path)?;
            pinned_paths.push(path);
        }
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM_NAME)
            .context("program missing from object")?
            .try_into()?;
        prog.load()
            .map_err(|e| anyhow!("the kernel verifier rejected the program: {e:?}"))?;
        for (role, iface) in [("lan", lan), ("wan", wan)] {
            let id = attach_one(prog, iface, mode)?;
            let link = prog.take_link(id)?;
            let fd: FdLink = link
                .try_into()
                .context("XDP link is not an fd link (kernel too old)")?;
            let path = pin_dir.join(format!("link_{role}"));
            fd.pin(&path)
                .with_context(|| format!("pinning {}", path.display()))?;
            pinned_paths.push(path);
        }
        Ok(())
    })();
    if let Err(e) = result {
        // Roll back: never leave half a router attached.
        for p in pinned_paths {
            let _ = fs::remove_file(p);
        }
        let _ = fs::remove_dir(pin_dir);
        return Err(e);
    }
    println!(
        "attached to {lan} (ifindex {lan_idx}) and {wan} (ifindex {wan_idx}); pins in {}",
        pin_dir.display()
    );
    Ok(())
}

fn attach_one(prog: &mut Xdp, iface: &str, mode: Mode) -> Result<aya::programs::xdp::XdpLinkId> {
    match mode {
        Mode::Generic => prog.attach(iface, XdpMode::Skb),
        Mode::Native => prog.attach(iface, XdpMode::Driver),
        Mode::Auto => prog.attach(iface, XdpMode::Driver).or_else(|e| {
            eprintln!(
                "warning: native XDP failed on {iface} ({e}); falling back to generic mode (slow)"
            );
            prog.attach(iface, XdpMode::Skb)
        }),
    }
    .with_context(|| {
        format!(
            "attaching XDP to {iface} (another XDP program may be attached: `ip link show {iface}`)"
        )
    })
}

fn detach(pin_dir: &Path) -> Result<()> {
    if !pin_dir.join("link_lan").exists() && !pin_dir.join("link_wan").exists() {
        bail!("not attached (no pins in {})", pin_dir.display());
    }
    for role in ["lan", "wan"] {
        let path = pin_dir.join(format!("link_{role}"));
        if path.exists() {
            // Unpinning drops the last reference: the link detaches.
            let link = PinnedLink::from_pin(&path)?;
            let fd = link.unpin()?;
            drop(fd);
        }
    }
    for name in [COUNTERS_MAP, DEVICES_MAP, CONFIG_MAP] {
        let _ = fs::remove_file(pin_dir.join(name));
    }
    fs::remove_dir(pin_dir).with_context(|| format!("removing {}", pin_dir.display()))?;
    println!("detached; kernel forwarding handles all traffic again");
    Ok(())
}

fn read_counters(pin_dir: &Path) -> Result<Vec<(Counter, CounterValue)>> {
    let path = pin_dir.join(COUNTERS_MAP);
    let data = MapData::from_pin(&path)
        .with_context(|| format!("not attached? cannot open {}", path.display()))?;
    let map: PerCpuArray<_, CounterValue> = PerCpuArray::try_from(Map::PerCpuArray(data))?;
    let mut out = Vec::new();
    for c in Counter::ALL {
        let values = map.get(&(c as u32), 0)?;
        let sum = values
            .iter()
            .fold(CounterValue::default(), |a, v| CounterValue {
                packets: a.packets + v.packets,
                bytes: a.bytes + v.bytes,
            });
        out.push((c, sum));
    }
    Ok(out)
}

fn stats(pin_dir: &Path, json: bool) -> Result<()> {
    let counters = read_counters(pin_dir)?;
    if json {
        let obj: serde_json::Map<String, serde_json::Value> = counters
            .iter()
            .map(|(c, v)| {
                (
                    c.name().to_owned(),
                    serde_json::json!({"packets": v.packets, "bytes": v.bytes}),
                )
            })
            .collect();
        println!("{}", serde_json::Value::Object(obj));
    } else {
        println!("{:<30} {:>14} {:>16}", "counter", "packets", "bytes");
        for (c, v) in counters {
            println!("{:<30} {:>14} {:>16}", c.name(), v.packets, v.bytes);
        }
    }
    Ok(())
}
