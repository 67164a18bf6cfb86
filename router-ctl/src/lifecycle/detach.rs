//! `detach`: the fast path off (one configuration write), then the record,
//! the links and the maps removed; and removing pins, which a failed or
//! interrupted fresh attach needs too.

use std::{fs, os::fd::AsFd as _, path::Path};

use anyhow::{Context, Result};
use router_common::maps::CONFIG_MAP;
use tracing::{debug, warn};

use crate::{
    bpfsys,
    config::AdmitMode,
    ctx::Ctx,
    forward,
    inspect::{Running, inspect},
    maps::PinnedMaps,
    netlink,
    pins::{LINK_PINS, ensure_bpffs},
    signals::crash_point,
    standalone, state,
};

/// Detaches: fast path off (one config write), then record, links and maps
/// removed. Returns whether anything was attached.
pub fn detach(ctx: &Ctx) -> Result<bool> {
    ensure_bpffs()?;
    let lock = state::lock(ctx.ns())?.holding_signals();
    gc_tmp(ctx);
    let dir = &ctx.pin_dir;
    let running = inspect(dir);
    let record = state::load(ctx.ns()).ok().flatten();
    let mode = super::mode_of(running.config, record.as_ref());
    if !running.any_pins() {
        tear_down_kernel_side(ctx);
        let had_record = record.is_some();
        remember_mode(ctx, mode);
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
        warn_open_without_standalone(mode);
        lock.remove_file();
        return Ok(false);
    }
    remember_mode(ctx, mode);
    // The rules live in the maps about to go: read now, told at the end.
    let rules = forward::rules(&ctx.maps());
    // Commit: both interfaces back to the kernel path in one write.
    if running.maps_present.contains(&CONFIG_MAP) {
        ctx.maps().clear_config()?;
    }
    crash_point("detach-after-unconfigure");
    state::remove(ctx.ns())?;
    let ifaces: Vec<(u32, u32)> = running
        .links
        .iter()
        .filter_map(|(_, l)| l.as_ref().ok().map(|l| (l.info.ifindex, l.info.prog_id)))
        .collect();
    let left = match remove_pins(dir) {
        Ok(left) => left,
        Err(e) => {
            // The fast path is off (CONFIG cleared): the kernel side goes
            // too, so a failed unpin leaves no slow-path table behind.
            tear_down_kernel_side(ctx);
            return Err(e.context("detached, but not every pin could be removed; run detach again"));
        }
    };
    crash_point("detach-after-unpin");
    warn_left(dir, &left);
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
    tear_down_kernel_side(ctx);
    if running.links.is_empty() {
        println!("removed stale map pins; nothing was attached");
    } else {
        println!("detached; kernel forwarding handles all traffic again");
    }
    warn_open_without_standalone(mode);
    tell_rules_removed(ctx, rules);
    lock.remove_file();
    Ok(true)
}

/// Says, after standalone mode went, that nothing of it filters or
/// translates any more: it was the router's NAT and its only filter
/// between the WAN and the LAN (attaching it refuses forward rules of the
/// owner's own), so with forwarding on the kernel now forwards LAN packets
/// untranslated and lets WAN hosts (for IPv6 any host) reach LAN hosts.
/// Not said where the kernel forwards nothing, after offload mode (the
/// owner's firewall and NAT stay), nor where forward rules are there (a
/// firewall the attach bypassed as asked decides again).
fn warn_open_without_standalone(mode: Option<AdmitMode>) {
    let on = |path: &str| fs::read_to_string(path).is_ok_and(|v| v.trim() == "1");
    if mode != Some(AdmitMode::Xdp)
        || !(on("/proc/sys/net/ipv4/conf/all/forwarding")
            || on("/proc/sys/net/ipv6/conf/all/forwarding"))
        || !standalone::forward_chains(&standalone::Ruleset::read())
            .0
            .is_empty()
    {
        return;
    }
    warn!(
        "standalone mode was this router's NAT and its only filter between the WAN and the \
         LAN: with forwarding on, the kernel now forwards LAN packets untranslated and lets \
         WAN hosts (over IPv6, any host) reach LAN hosts. Load a firewall with NAT rules \
         (then `attach --admit kernel` carries its flows), turn forwarding off, or attach \
         again"
    );
}

/// What a router whose network namespace was deleted while it was
/// attached left behind, described (`None`: nothing): its pin directory
/// (the maps and the links, held in kernel memory until unpinned) and its
/// records, then, when a pinned link still runs on an interface, which
/// (the namespace lives on without its name: a process holds it; or a NIC
/// went back to the host's namespace).
#[must_use]
pub fn orphaned(ctx: &Ctx) -> Option<String> {
    let mut left = Vec::new();
    if ctx.pin_dir.exists() {
        left.push(format!("its pins in {}", ctx.pin_dir.display()));
    }
    let record = state::state_path(ctx.ns());
    if record.exists() {
        left.push(format!("its attach record {}", record.display()));
    }
    if left.is_empty() {
        return None;
    }
    let mut said = format!("left {} behind", left.join(" and "));
    let live = live_links(&inspect(&ctx.pin_dir));
    if !live.is_empty() {
        said = format!(
            "{said}; its XDP links still run on interface index {} (the namespace lives on, \
             held by a process, or a NIC went back to the host's namespace)",
            live.join(", ")
        );
    }
    Some(said)
}

/// Whether any of the router's pinned links still runs on an interface
/// (one whose interface was destroyed has none).
#[must_use]
pub fn links_still_run(ctx: &Ctx) -> bool {
    !live_links(&inspect(&ctx.pin_dir)).is_empty()
}

/// The interface indexes the router's pinned links (`running`) still run
/// on (a link whose interface was destroyed has none).
fn live_links(running: &Running) -> Vec<String> {
    running
        .links
        .iter()
        .filter_map(|(_, l)| l.as_ref().ok())
        .filter(|l| l.info.ifindex != 0)
        .map(|l| l.info.ifindex.to_string())
        .collect()
}

/// `detach` of a router whose network namespace is gone from
/// `/run/netns` ([`orphaned`]), run from outside it: refused while a
/// `router-ctl run` serves it (its daemon holds the namespace); else its
/// links detached (also one still on an interface: said), its pins and
/// records removed, its mode remembered and its port forwards named as
/// `detach` does. What lived inside the namespace (standalone mode's
/// nftables table and sysctls) went with it, or is out of reach.
///
/// `replaced`: the namespace of that name is another one now (deleted and
/// made again); the old one's interfaces are not this one's.
pub fn detach_orphaned(ctx: &Ctx, replaced: bool) -> Result<()> {
    ensure_bpffs()?;
    // Free only while no daemon serves the router; held until the end.
    // The signals held by the outer lock, let through once both are
    // released.
    let _no_daemon = state::daemon_lock(ctx.ns())
        .context(
            "its `router-ctl run` still runs, in the namespace it keeps alive: stop it first \
             (systemctl stop xdp-router, or kill it), then detach",
        )?
        .holding_signals();
    let lock = state::lock(ctx.ns())?;
    gc_tmp(ctx);
    let dir = &ctx.pin_dir;
    let running = inspect(dir);
    // The namespace is gone: nothing of its router is kept, its mode
    // neither (a detach notes it for the next attach there; none comes to
    // a namespace torn down, and such notes would pile up on a host that
    // makes and deletes them).
    state::forget_last_mode(ctx.ns());
    let rules = forward::rules(&ctx.maps());
    let live = live_links(&running);
    let left = if running.any_pins() {
        remove_pins(dir)?
    } else {
        let _ = fs::remove_dir(dir);
        Vec::new()
    };
    state::remove(ctx.ns())?;
    standalone::forget(ctx.ns())?;
    // What a killed daemon or apply left: no daemon runs (its lock is
    // ours), and none will start for a namespace that is gone.
    crate::daemon::remove_status_files(ctx);
    state::remove_apply_lock(ctx.ns());
    let ns = state::ns_key(ctx.ns());
    if replaced {
        println!(
            "the network namespace {ns} was made anew since its router was attached: removed the \
             old router's {}records{}; attach anew in this one",
            if running.any_pins() {
                format!("pins in {} and its ", dir.display())
            } else {
                String::new()
            },
            if live.is_empty() {
                String::new()
            } else {
                format!(
                    " (its XDP links still ran on interface index {} of the old namespace: \
                     detached)",
                    live.join(", ")
                )
            }
        );
    } else if live.is_empty() {
        println!(
            "the network namespace {ns} is gone, and its interfaces with it: removed the \
             router's {}records",
            if running.any_pins() {
                format!("pins in {} and its ", dir.display())
            } else {
                String::new()
            }
        );
    } else {
        println!(
            "the network namespace {ns} is gone from /run/netns, but the router's XDP links \
             still ran on interface index {}: detached them and removed the router's pins and \
             records; what standalone mode set up inside the namespace (its nftables table, \
             sysctls) is out of reach",
            live.join(", ")
        );
    }
    warn_left(dir, &left);
    if running.any_pins() {
        tell_rules_removed(ctx, rules);
    }
    lock.remove_file();
    Ok(())
}

/// Warns of the files `remove_pins` left in `dir` (`left`: not router-ctl's).
fn warn_left(dir: &Path, left: &[String]) {
    if !left.is_empty() {
        warn!(
            "left {} in place: it holds files router-ctl did not make ({})",
            dir.display(),
            left.join(", ")
        );
    }
}

/// Says which port forwards and IPv6 pinholes went with the maps, and the
/// commands that add them back after the next attach: nothing keeps them
/// (an attach starts with none, and `apply` sets those of its file).
fn tell_rules_removed(ctx: &Ctx, rules: Result<Vec<forward::Rule>>) {
    let rules = match rules {
        Ok(rules) => rules,
        Err(e) => {
            warn!(
                "could not read the port forwards and IPv6 pinholes before removing them \
                 ({e:#}): any there were are gone; add them again after the next attach"
            );
            return;
        }
    };
    let Some(count) = forward::rules_count(&rules) else {
        return;
    };
    println!(
        "removed {count} with the maps: an attach starts without them. To put them back \
         after the next attach in standalone mode (--admit xdp), run (or keep them in the \
         file `router-ctl apply` reads):"
    );
    for r in &rules {
        println!("  {}", r.add_command(ctx.ns()));
    }
}

/// Leaves the detached router's mode `admit` for the next attach that
/// states none (`unstated_admit`). A failure only costs that: said, not
/// fatal.
fn remember_mode(ctx: &Ctx, admit: Option<AdmitMode>) {
    if let Some(admit) = admit
        && let Err(e) = state::save_last_mode(ctx.ns(), admit)
    {
        warn!(
            "could not note the detached router's mode (admit {}): {e:#}; attach it again \
             with --admit {} (or `admit` in its file) to keep it",
            admit.name(),
            admit.name()
        );
    }
}

/// Removes standalone mode's slow-path table and puts its sysctls back
/// (after the fast path is off: nothing passes translated packets any
/// more).
fn tear_down_kernel_side(ctx: &Ctx) {
    match standalone::tear_down(ctx.ns()) {
        Ok(true) => println!(
            "removed the kernel slow-path NAT table (ip {}) and restored the LAN sysctls",
            standalone::TABLE
        ),
        Ok(false) => {}
        Err(e) => warn!("undoing the kernel side of standalone mode: {e:#}"),
    }
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
pub fn remove_pins(dir: &Path) -> Result<Vec<String>> {
    // A relink cut short may have left a new link under its staging name.
    let staged = LINK_PINS.map(super::relink::staging_pin);
    for name in LINK_PINS
        .iter()
        .copied()
        .chain(staged.iter().map(String::as_str))
    {
        detach_link_pin(&dir.join(name));
    }
    // A replace cut short may have left the new COUNTERS it was about to
    // put in place.
    let ours = [super::counters_carry::NEXT_PIN];
    for name in LINK_PINS
        .iter()
        .chain(PinnedMaps::NAMES.iter())
        .chain(&ours)
        .copied()
        .chain(staged.iter().map(String::as_str))
    {
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
