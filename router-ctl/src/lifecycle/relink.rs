//! An attached interface that was deleted and came back under its name
//! (a re-plugged USB NIC, a bridge or VLAN the network manager made anew,
//! as a network restart does with a bridge on `OpenWrt`): its XDP link went
//! with the old interface, so the running program gets a new link on the
//! new one, pinned in the old link's place, and the configuration, the
//! device map and the attach record name the new interface. The maps
//! stay, and with them the flows: a LAN host's connections go on through
//! their mappings once the link is back. `attach` does it (then finds
//! nothing else to change) and so does `router-ctl run` when it sees the
//! interface come back.

use anyhow::{Context, Result, bail};
use std::os::fd::AsFd as _;
use tracing::info;

use super::{Unretryable, inspect, replace::gone_links};
use crate::{bpfsys, ctx::Ctx, netlink, pins::LINK_PINS, state};

/// Under the router's lock: gives every link whose interface was deleted
/// a new one on the interface of the recorded name, if it exists again.
/// What was done, for the user; `Ok(None)`: no link lost its interface,
/// or none of those is back yet. `force`: replace another XDP program on
/// the new interface, and attach over what would make its frames drop
/// (as `attach --force`).
pub fn relink_gone(ctx: &Ctx, force: bool, force_how: &str) -> Result<Option<String>> {
    let running = inspect(&ctx.pin_dir);
    let gone = gone_links(&running);
    let maps = ctx.maps();
    // A link that runs on a live interface the configuration does not
    // name: a relink cut short after its rename (the configuration or the
    // record not written). Adopted below, if the interface has the
    // recorded name.
    let configured = maps
        .read_config()
        .ok()
        .filter(|c| c.lan_ifindex != 0)
        .map(|c| [c.lan_ifindex, c.wan_ifindex]);
    let unnamed: [Option<u32>; 2] = [0, 1].map(|r| {
        let l = running.link(LINK_PINS[r])?;
        let idx = l.info.ifindex;
        (l.mode.is_some() && configured.is_some_and(|n| n[r] != idx)).then_some(idx)
    });
    if !gone.contains(&true) && unnamed.iter().all(Option::is_none) {
        return Ok(None);
    }
    let Some(mut rec) = state::load(ctx.ns())? else {
        bail!(Unretryable(
            "an attached interface was deleted, and there is no attach record to tell which \
             interface it was; run `router-ctl detach`, then attach again"
                .to_owned()
        ));
    };
    let names = [rec.config.lan.clone(), rec.config.wan.clone()];
    let mut devices = maps.devices()?;
    let mut done = Vec::new();
    for (role, idx) in unnamed.into_iter().enumerate() {
        let Some(idx) = idx.filter(|&i| netlink::ifname(i).as_deref() == Some(&names[role])) else {
            continue;
        };
        let mac = netlink::mac(&names[role], idx)?;
        devices
            .insert(idx, idx, None, 0)
            .with_context(|| format!("adding {} to the device map", names[role]))?;
        name_in_config(ctx, &mut rec, role, idx, mac)?;
        done.push((role, idx));
    }
    let back: Vec<(usize, u32)> = (0..2)
        .filter(|&r| gone[r])
        .filter_map(|r| netlink::ifindex(&names[r]).ok().map(|i| (r, i)))
        .collect();
    if back.is_empty() && done.is_empty() {
        return Ok(None);
    }
    let modes = [rec.lan_mode.clone(), rec.wan_mode.clone()];
    if !back.is_empty() {
        // A new link a relink cut short before its rename left staged on
        // the interface: unpinned, it goes (the kernel frees it soon after:
        // if the check below still sees it, the next try passes).
        for &(role, _) in &back {
            let staged = ctx.pin_dir.join(staging_pin(LINK_PINS[role]));
            if std::fs::remove_file(&staged).is_ok() {
                info!("removed {}, left by a relink cut short", staged.display());
            }
        }
        check_new(&names, &back, &modes, force, force_how)?;
    }
    // Each interface in turn, all of its steps: one that fails leaves the
    // other's done and in the configuration, and itself as it was (gone,
    // tried again).
    for &(role, idx) in &back {
        let name = &names[role];
        let prog_id = running
            .link(LINK_PINS[role])
            .map(|l| l.info.prog_id)
            .context("the link lost its interface and cannot be read")?;
        let mac = netlink::mac(name, idx)?;
        devices
            .insert(idx, idx, None, 0)
            .with_context(|| format!("adding {name} to the device map"))?;
        new_link(ctx, role, name, idx, &modes[role], prog_id)?;
        // The configuration names the new interface: until then the
        // program passed its frames to the kernel.
        name_in_config(ctx, &mut rec, role, idx, mac)?;
        done.push((role, idx));
    }
    let said: Vec<String> = done
        .iter()
        .map(|&(role, idx)| {
            format!(
                "{} ({}) was deleted and is back as ifindex {idx}",
                names[role],
                ["LAN", "WAN"][role]
            )
        })
        .collect();
    let msg = format!(
        "{}: a new XDP link for the running program ({} mode); conntrack, counters and rules \
         kept",
        said.join(", "),
        done.iter()
            .map(|&(r, _)| modes[r].as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    info!("{msg}");
    Ok(Some(msg))
}

/// What a fresh attach checks of an interface (another XDP program on it,
/// what would make the frames redirected into it drop), for those of
/// `back` (role, index).
fn check_new(
    names: &[String; 2],
    back: &[(usize, u32)],
    modes: &[String; 2],
    force: bool,
    force_how: &str,
) -> Result<()> {
    for &(role, idx) in back {
        super::fresh::check_foreign(&names[role], idx, force, force_how)?;
    }
    // The other side's mode is the one asked for: both sides alike (see
    // the fresh attach).
    let generic = modes.iter().any(|m| m == "generic");
    // Those of the interfaces made anew only: what the other one has, the
    // attach accepted (or was forced over).
    let anew: Vec<&str> = back.iter().map(|&(r, _)| names[r].as_str()).collect();
    super::fresh::refuse_blockers(
        [&names[0], &names[1]],
        Some(generic),
        Some(&anew),
        force,
        &format!("fix it (the interface was made anew without it), or {force_how}"),
    )
}

/// A new XDP link of program `prog_id` on interface `name` (index `idx`)
/// in `mode` (`native`, `generic`), pinned as the link of `role`.
fn new_link(ctx: &Ctx, role: usize, name: &str, idx: u32, mode: &str, prog_id: u32) -> Result<()> {
    let flags = if mode == "generic" {
        netlink::XDP_FLAGS_SKB_MODE
    } else {
        netlink::XDP_FLAGS_DRV_MODE
    };
    let prog = bpfsys::prog_fd_by_id(prog_id)
        .with_context(|| format!("opening the running program {prog_id}"))?;
    let link = bpfsys::xdp_link_create(prog.as_fd(), idx, flags).with_context(|| {
        format!("attaching XDP to {name} (made anew) in {mode} mode, as it was")
    })?;
    // Pinned under a name of its own, then renamed over the old link's pin
    // (one step: the router's pins are never incomplete). A failure before
    // the rename leaves the old pin, and the new link goes with its fd.
    let path = ctx.pin_dir.join(LINK_PINS[role]);
    let new = ctx.pin_dir.join(staging_pin(LINK_PINS[role]));
    let _ = std::fs::remove_file(&new);
    bpfsys::obj_pin(link.as_fd(), &new)
        .with_context(|| format!("pinning the new link at {}", new.display()))?;
    let placed = super::loader::chmod_600(&new).and_then(|()| {
        std::fs::rename(&new, &path)
            .with_context(|| format!("renaming {} to {}", new.display(), path.display()))
    });
    if placed.is_err() {
        let _ = std::fs::remove_file(&new);
    }
    placed
}

/// Where [`relink_gone`] pins a new link before it renames it over the
/// link pin `pin` (a relink cut short may leave it: detach removes it).
/// No dot: bpffs keeps names with one for itself (`EPERM`).
#[must_use]
pub fn staging_pin(pin: &str) -> String {
    format!("{pin}_new")
}

/// Has the configuration and the attach record `rec` name the interface
/// `idx` (MAC `mac`) as the one of `role` (0: LAN), whose link runs on it;
/// the device map's entry of the one it replaces goes (a leftover would
/// only cost a slot).
fn name_in_config(
    ctx: &Ctx,
    rec: &mut state::State,
    role: usize,
    idx: u32,
    mac: [u8; 6],
) -> Result<()> {
    let maps = ctx.maps();
    let mut cfg = maps.read_config()?;
    let c = &mut rec.config;
    let old_idx = if role == 0 {
        let old = cfg.lan_ifindex;
        (cfg.lan_ifindex, cfg.lan_mac) = (idx, mac);
        (c.lan_ifindex, c.lan_mac) = (idx, mac);
        old
    } else {
        let old = cfg.wan_ifindex;
        (cfg.wan_ifindex, cfg.wan_mac) = (idx, mac);
        (c.wan_ifindex, c.wan_mac) = (idx, mac);
        old
    };
    maps.config()?
        .set(0, cfg, 0)
        .context("writing the configuration with the new interface")?;
    if old_idx != 0 && old_idx != idx {
        let _ = maps.devices()?.remove(old_idx);
    }
    state::save(ctx.ns(), rec)
}
