//! A fresh attach: maps, program and both links built and pinned in a
//! private staging directory with the configuration empty (every packet
//! still goes to the kernel), the directory renamed into place, the record
//! written, and only then the configuration: that one map write turns the
//! fast path on for both interfaces at once.

use std::{fs, os::fd::AsFd as _, path::Path};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf,
    programs::{Xdp, XdpMode, links::FdLink, xdp::XdpLink},
};
use router_common::maps::{PortForwardKey, PortForwardTarget};
use tracing::{info, warn};

use super::{loader, new_record, random_u32, xdp_mode_name};
use crate::{
    bpfsys,
    config::{AttachArgs, Mode, RouterConfig},
    ctx::Ctx,
    doctor,
    maps::PinnedMaps,
    netlink,
    object::Object,
    pins::LINK_PINS,
    signals::crash_point,
    state,
};

/// A fresh attach, built in the temporary directory and renamed into place.
pub fn fresh(
    ctx: &Ctx,
    a: &AttachArgs,
    desired: &RouterConfig,
    obj: &Object,
    forwards: &[(PortForwardKey, PortForwardTarget)],
) -> Result<()> {
    let generic_asked = check_interfaces(a, desired)?;
    for w in doctor::attach_warnings(&a.lan, &a.wan, generic_asked) {
        warn!("{w}");
    }
    let root = ctx.pin_dir.parent().context("pin dir without parent")?;
    state::private_dir(root)?;
    let tmp = ctx.tmp_dir();
    state::private_dir(&tmp)?;
    let result = build(ctx, a, desired, obj, forwards, &tmp);
    if result.is_err() {
        // Roll back: the links held only by our fds detach when the Ebpf is
        // dropped (it was, inside build); unpin the rest.
        let _ = super::detach::remove_pins(&tmp);
        let _ = fs::remove_dir(&tmp);
    }
    result
}

/// The steps of a fresh attach after the checks, in order.
fn build(
    ctx: &Ctx,
    a: &AttachArgs,
    desired: &RouterConfig,
    obj: &Object,
    forwards: &[(PortForwardKey, PortForwardTarget)],
    tmp: &Path,
) -> Result<()> {
    let (mut ebpf, prog_id) = load(desired, obj, forwards, tmp)?;
    crash_point("fresh-after-load");
    let prog = loader::xdp_prog(&mut ebpf)?;
    let (lan_link, lan_mode) = attach_one(prog, &a.lan, a.mode)?;
    info!("attached to {} ({})", a.lan, xdp_mode_name(lan_mode));
    // Auto attaches both sides alike: a native program's redirect hands
    // the frame to the target driver's XDP transmit, which a device
    // without native XDP (a bridge, a bond over such NICs) lacks, and the
    // kernel drops the frame; a generic program's redirect transmits an
    // skb, which any device takes. A LAN that fell back takes the WAN
    // with it.
    let wan_asked = match (a.mode, lan_mode) {
        (Mode::Auto, XdpMode::Skb) => Mode::Generic,
        (m, _) => m,
    };
    let (wan_link, wan_mode) = match attach_one(prog, &a.wan, wan_asked) {
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
    // ...and a WAN that fell back takes the LAN with it.
    let (lan_link, lan_mode) = if lan_mode == XdpMode::Driver && wan_mode == XdpMode::Skb {
        warn!(
            "{} fell back to generic mode, so {} is attached in generic mode too: frames a \
             native program on {} redirected into {} would be dropped ({} has no native XDP \
             transmit)",
            a.wan, a.lan, a.lan, a.wan, a.wan
        );
        drop(lan_link); // closes the only fd: LAN's native program detaches
        match attach_one(prog, &a.lan, Mode::Generic) {
            Ok(x) => x,
            Err(e) => {
                drop(wan_link);
                return Err(anyhow!(
                    "{e:#}\nrolled back: {} and {} are detached again and nothing is pinned; \
                     the kernel path handles all traffic as before",
                    a.lan,
                    a.wan
                ));
            }
        }
    } else {
        (lan_link, lan_mode)
    };
    crash_point("fresh-after-links");
    // Before anything is in place, so that only the map write below can
    // still fail past the rename.
    let seed = random_u32()?;
    pin_links(lan_link, wan_link, tmp)?;
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
    let rec = new_record(
        ctx,
        a,
        desired,
        obj,
        xdp_mode_name(lan_mode),
        xdp_mode_name(wan_mode),
        prog_id,
    );
    // A record of pins lost since (a reboot) is put back by a rollback.
    let before = state::load(ctx.ns()).ok().flatten();
    if let Err(e) = state::save(ctx.ns(), &rec) {
        // Undo: nothing is configured yet, so traffic never left the kernel.
        let _ = super::detach::remove_pins(&ctx.pin_dir);
        return Err(e.context("writing the attach record; rolled back"));
    }
    crash_point("fresh-after-record");
    // The commit: one map write turns the fast path on for both interfaces.
    let written = ctx
        .maps()
        .config()
        .and_then(|mut c| Ok(c.set(0, desired.to_map(seed), 0)?));
    if let Err(e) = written {
        // Undo: the configuration never turned the fast path on.
        let _ = super::detach::remove_pins(&ctx.pin_dir);
        let _ = match &before {
            Some(r) => state::save(ctx.ns(), r),
            None => state::remove(ctx.ns()),
        };
        return Err(e.context(
            "writing the configuration; rolled back (nothing pinned, the record as it was): \
             the kernel path handles all traffic as before",
        ));
    }
    state::forget_last_mode(ctx.ns());
    print_attached(ctx, a, desired, obj, lan_mode, wan_mode);
    Ok(())
}

/// Loads the object with fresh maps pinned in `tmp` (owner-only), fills
/// the device map and the port-forward rules, and loads the program.
/// Returns the loaded object (it holds the program) and the program id.
fn load(
    desired: &RouterConfig,
    obj: &Object,
    forwards: &[(PortForwardKey, PortForwardTarget)],
    tmp: &Path,
) -> Result<(Ebpf, u32)> {
    let mut ebpf =
        loader::load_pinned(obj, tmp, desired.max_flows * 2, None).with_context(|| {
            format!(
                "loading the XDP object (a conntrack table of {} flows needs memory; a smaller \
             --max-flows needs less)",
                desired.max_flows
            )
        })?;
    for name in PinnedMaps::NAMES {
        let path = tmp.join(name);
        if ebpf.map(name).is_none() || !path.exists() {
            bail!("the XDP object has no {name} map; rebuild router-ctl");
        }
        loader::chmod_600(&path)?;
    }
    let maps = PinnedMaps::at(tmp);
    let mut devices = maps.devices()?;
    for idx in [desired.lan_ifindex, desired.wan_ifindex] {
        devices
            .insert(idx, idx, None, 0)
            .context("filling the device map")?;
    }
    let mut rules = maps.port_forwards()?;
    for (k, t) in forwards {
        rules
            .insert(k, t, 0)
            .context("filling the port-forward rules")?;
    }
    let prog_id = loader::load_program(&mut ebpf)?;
    Ok((ebpf, prog_id))
}

fn pin_links(lan_link: XdpLink, wan_link: XdpLink, tmp: &Path) -> Result<()> {
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
    Ok(())
}

fn print_attached(
    ctx: &Ctx,
    a: &AttachArgs,
    desired: &RouterConfig,
    obj: &Object,
    lan_mode: XdpMode,
    wan_mode: XdpMode,
) {
    let mode = if lan_mode == wan_mode {
        xdp_mode_name(lan_mode).to_owned()
    } else {
        format!(
            "{} {}, {} {}",
            a.lan,
            xdp_mode_name(lan_mode),
            a.wan,
            xdp_mode_name(wan_mode)
        )
    };
    println!(
        "attached: {} (ifindex {}) <-> {} (ifindex {}), mode {mode}, {}, table {} flows, \
         object {}",
        a.lan,
        desired.lan_ifindex,
        a.wan,
        desired.wan_ifindex,
        desired.admit_summary(),
        desired.max_flows,
        obj.id.version()
    );
    println!("pins in {}", ctx.pin_dir.display());
}

/// What a fresh attach refuses on its interfaces (unless forced), which
/// waiting does not change: another tool's XDP program, or a peer that
/// would drop the fast path's frames (`doctor::attach_blockers`); also
/// asked by `apply --check` for a router not attached yet. Returns the
/// mode asked (`Some(true)`: generic).
pub fn check_interfaces(a: &AttachArgs, desired: &RouterConfig) -> Result<Option<bool>> {
    let how = Fixes::of(a);
    check_foreign(&a.lan, desired.lan_ifindex, a.force, &how.force)?;
    check_foreign(&a.wan, desired.wan_ifindex, a.force, &how.force)?;
    let generic_asked = match a.mode {
        crate::config::Mode::Generic => Some(true),
        crate::config::Mode::Native => Some(false),
        crate::config::Mode::Auto => None,
    };
    refuse_blockers(
        [&a.lan, &a.wan],
        generic_asked,
        None,
        a.force,
        &format!("fix it, {}, or {} to attach anyway", how.generic, how.force),
    )?;
    Ok(generic_asked)
}

/// Refuses, unless `force`, what would make the fast path drop frames
/// while counting them forwarded on interfaces `names` (LAN, WAN) in the
/// mode asked (`generic`; `None`: native where the driver has it), as
/// `doctor` finds it; `only`: the blockers of those interfaces alone (a
/// relink's, made anew). The refusal ends with `fix`.
pub(super) fn refuse_blockers(
    names: [&str; 2],
    generic: Option<bool>,
    only: Option<&[&str]>,
    force: bool,
    fix: &str,
) -> Result<()> {
    if force {
        return Ok(());
    }
    let blockers: Vec<String> = doctor::attach_blockers(names[0], names[1], generic)
        .into_iter()
        .filter(|b| only.is_none_or(|o| o.iter().any(|n| b.starts_with(&format!("{n}:")))))
        .collect();
    if blockers.is_empty() {
        return Ok(());
    }
    bail!(super::Unretryable(format!(
        "{}; the fast path would drop those frames while counting them forwarded: {fix}",
        blockers.join("; ")
    )))
}

/// How a refusal of [`check_interfaces`] says to go on: with `attach`'s
/// flags, or for an `apply` what to set in its file (which has no
/// `--force`: one forced attach, after which the file applies in place).
struct Fixes {
    generic: String,
    force: String,
}

impl Fixes {
    fn of(a: &AttachArgs) -> Self {
        match &a.apply_file {
            // `attach`'s flags.
            None => Self {
                generic: "attach with --mode generic".into(),
                force: "pass --force".into(),
            },
            Some(file) => Self {
                generic: format!("set `mode = \"generic\"` in [interfaces] of {file}"),
                force: format!(
                    "run `router-ctl attach {} {} --force` once (with `-n NETNS` where the \
                     router has one, and the file's `mode` and `max_flows` where it sets them, \
                     which only a detach changes), then apply {file} again",
                    a.lan, a.wan
                ),
            },
        }
    }
}

/// How a refusal that only `--force` overrides says to force it, for the
/// command `a` comes from (`attach`'s flag, or an `apply` file's way).
pub(super) fn force_how(a: &AttachArgs) -> String {
    Fixes::of(a).force
}

/// Refuses (or with `force` removes) XDP programs router-ctl did not
/// attach; a refusal says to `force_how` (see [`force_how`]).
pub(super) fn check_foreign(iface: &str, idx: u32, force: bool, force_how: &str) -> Result<()> {
    let attrs = netlink::link(idx).with_context(|| format!("reading {iface}'s XDP state"))?;
    for (prog_id, flag) in attrs.xdp.programs() {
        let mode = match flag {
            netlink::XDP_FLAGS_SKB_MODE => "generic",
            netlink::XDP_FLAGS_HW_MODE => "offload",
            _ => "native",
        };
        if !force {
            bail!(super::Unretryable(format!(
                "{iface} already has an XDP program (id {prog_id}, {mode} mode) that router-ctl \
                 did not attach; remove it (`ip link set dev {iface} {} off`, or detach the \
                 tool that owns it), or {} to replace it",
                doctor::xdp_off_keyword(mode),
                force_how
            )));
        }
        if let Err(e) = netlink::xdp_detach(idx, flag) {
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
        warn!("--force: removed XDP program {prog_id} ({mode} mode) from {iface}");
    }
    Ok(())
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
    let (id, m) = r.map_err(|e| {
        let e = anyhow::Error::from(e);
        // The driver refuses a program without multi-buffer support on a
        // link whose frames may not fit one page (veth: MTU above 3498).
        let mtu_too_large = e.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::raw_os_error)
                == Some(libc::ERANGE)
        });
        let how = match mode {
            Mode::Native if mtu_too_large => {
                "in native mode: its MTU is too large for a program without multi-buffer \
                 support (a veth takes at most 3498; see `router-ctl doctor`); lower the MTU, \
                 or use --mode auto or generic"
            }
            Mode::Native => "in native mode (the driver may not support XDP; try --mode auto)",
            Mode::Generic => "in generic mode",
            Mode::Auto => "in native or generic mode",
        };
        e.context(format!("attaching XDP to {iface} {how}"))
    })?;
    Ok((prog.take_link(id)?, m))
}

fn pin_private(fd: FdLink, path: &Path) -> Result<()> {
    let pinned = fd
        .pin(path)
        .with_context(|| format!("pinning {}", path.display()))?;
    drop(pinned);
    loader::chmod_600(path)
}
