//! Attach on a running router: nothing to do, or a live replace. The new
//! program is loaded against the pinned maps (conntrack, counters, rules,
//! devices and configuration are shared, so flows survive); the record
//! gets a `pending` entry, the configuration is written in place (one map
//! write, both interfaces at once), then each pinned link is switched to
//! the new program with `BPF_LINK_UPDATE` (atomic per interface, no gap).

use std::path::Path;

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf,
    programs::links::{FdLink, PinnedLink},
    programs::xdp::XdpLink,
};
use tracing::{info, warn};

use super::{
    Outcome, Unretryable,
    counters_carry::{self, Carry},
    loader, new_record, random_u32,
};
use crate::{
    clock,
    config::{AttachArgs, Mode, RouterConfig},
    ctx::Ctx,
    inspect::Running,
    maps::PinnedMaps,
    netlink,
    object::Object,
    pins::LINK_PINS,
    signals::crash_point,
    state::{self, Pending, State},
};

/// Whether the running router can take `desired` in place: checked before
/// anything changes (the standalone kernel side included), so a refused
/// attach leaves everything as it was.
pub fn preflight(
    ctx: &Ctx,
    a: &AttachArgs,
    desired: &RouterConfig,
    obj: &Object,
    running: &Running,
) -> Result<()> {
    let dir = &ctx.pin_dir;
    let recorded = state::load(ctx.ns())
        .ok()
        .flatten()
        .map(|r| [r.config.lan, r.config.wan]);
    check_replaceable(dir, a, desired, running, recorded.as_ref())?;
    loader::check_layout(dir, obj, desired.max_flows * 2)
}

/// Which of the links (LAN, WAN) lost their interface: it was deleted
/// while attached, and the link with it (its interface index reads 0).
pub(super) fn gone_links(running: &Running) -> [bool; 2] {
    [0, 1].map(|i| {
        running
            .link(LINK_PINS[i])
            .is_some_and(|l| l.info.ifindex == 0)
    })
}

/// Already attached: nothing to do, or a live replace ([`preflight`]
/// passed).
pub fn replace_or_keep(
    ctx: &Ctx,
    a: &AttachArgs,
    desired: &RouterConfig,
    obj: &Object,
    running: &Running,
    record: Option<State>,
) -> Result<Outcome> {
    let dir = &ctx.pin_dir;
    let entries = desired.max_flows * 2;

    // Maps this build added, not pinned by the router-ctl that attached:
    // the replace below creates them, so it runs even when nothing else
    // changed.
    let added_maps = running.maps_added_later_missing();

    let ids = running.prog_ids();
    let consistent = ids.len() == 2 && ids[0] == ids[1];
    let cur_cfg = running.config;
    let seed = cur_cfg
        .filter(|c| c.hash_seed != 0)
        .map_or_else(random_u32, |c| Ok(c.hash_seed))?;
    let want_cfg = desired.to_map(seed);
    let same = record.as_ref().is_some_and(|r| {
        r.object.same(&obj.id)
            && r.config == *desired
            && r.pending.is_none()
            && consistent
            && ids[0] == r.prog_id
    }) && cur_cfg == Some(want_cfg)
        && added_maps.is_empty();
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

    // A build with more or fewer counters: its COUNTERS is a new map of
    // its own length, the counts carried over.
    let mut carry = Carry::prepare(dir, obj)?;
    let (prog_id, mut ebpf) = load(obj, dir, entries, carry.is_some())?;
    for name in &added_maps {
        loader::chmod_600(&dir.join(name))?;
        info!("created the {name} map (the router was attached by an earlier router-ctl)");
    }
    crash_point("replace-after-load");

    let now = clock::now_unix();
    let old = record.clone();
    let mut rec = record.unwrap_or_else(|| {
        let mode_of = |pin| running.link(pin).and_then(|l| l.mode).unwrap_or("unknown");
        State {
            prog_id: ids.first().copied().unwrap_or(0),
            ..new_record(
                ctx,
                a,
                desired,
                obj,
                mode_of(LINK_PINS[0]),
                mode_of(LINK_PINS[1]),
                0,
            )
        }
    });
    rec.pending = Some(Pending {
        object: obj.id.clone(),
        config: desired.clone(),
        prog_id,
        started_at: now,
    });
    journal(ctx, &rec, dir, carry.as_mut())?;

    // Commit 1: the configuration, one write seen by both interfaces.
    if cur_cfg != Some(want_cfg) {
        ctx.maps()
            .config()?
            .set(0, want_cfg, 0)
            .context("writing the configuration")?;
        info!("configuration updated");
    }
    crash_point("replace-after-config");
    // Commit 2: each link switches program atomically (BPF_LINK_UPDATE).
    switch_links(dir, &mut ebpf, prog_id)?;
    crash_point("replace-after-links");
    if let Some(c) = carry
        && let Err(e) = c.finish(dir)
    {
        // The program runs on its new COUNTERS; only what the old one
        // counted while the links switched is missing.
        warn!("adding the old program's last counts to the new COUNTERS: {e:#}");
    }
    rec.pending = None;
    rec.config = desired.clone();
    rec.object = obj.id.clone();
    rec.prog_id = prog_id;
    rec.replaced_at = Some(now);
    rec.replacements += 1;
    state::save(ctx.ns(), &rec)?;
    let what = what_changed(old.as_ref(), obj, desired, a.reload, !added_maps.is_empty());
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

/// Saves the record with its `pending` replace; then, if the counters are
/// carried, the new `COUNTERS` takes the pin: only once the replace is
/// journaled, so that one cut short from here on is finished by the next
/// attach (the record's `pending` makes it run even for the same object).
fn journal(ctx: &Ctx, rec: &State, dir: &Path, carry: Option<&mut Carry>) -> Result<()> {
    if let Err(e) = state::save(ctx.ns(), rec) {
        if carry.is_some() {
            // Nothing uses the new COUNTERS yet.
            let _ = std::fs::remove_file(dir.join(counters_carry::NEXT_PIN));
        }
        return Err(e);
    }
    crash_point("replace-after-journal");
    if let Some(c) = carry {
        c.take_over(dir)?;
        crash_point("replace-after-counters");
    }
    Ok(())
}

/// Loads the new object against the pinned maps (`COUNTERS` a new one at
/// `counters_carry::NEXT_PIN` if `carry`) and its program: its id.
fn load(obj: &Object, dir: &Path, entries: u32, carry: bool) -> Result<(u32, Ebpf)> {
    let loaded = loader::load_pinned(obj, dir, entries, carry.then_some(counters_carry::NEXT_PIN))
        .context("loading the new XDP object against the pinned maps")
        .and_then(|mut ebpf| Ok((loader::load_program(&mut ebpf)?, ebpf)));
    if loaded.is_err() && carry {
        // Nothing uses the new COUNTERS.
        let _ = std::fs::remove_file(dir.join(counters_carry::NEXT_PIN));
    }
    loaded
}

/// Why the replace ran, for its message: against the previous record
/// `old`, the new object and configuration; `reload` asked for;
/// `added_maps` created.
fn what_changed(
    old: Option<&State>,
    obj: &Object,
    desired: &RouterConfig,
    reload: bool,
    added_maps: bool,
) -> &'static str {
    match old {
        Some(o) if !o.object.same(&obj.id) && o.config != *desired => {
            "new object and configuration"
        }
        Some(o) if !o.object.same(&obj.id) => "new object",
        Some(o) if o.config != *desired => "new configuration",
        Some(_) if added_maps => "creating the maps this router-ctl added",
        Some(_) if reload => "same object and configuration (--reload)",
        Some(_) => "finishing an interrupted change",
        None => "no attach record (repaired)",
    }
}

/// What a replace cannot change: the pins must be complete, the links stay
/// on their interfaces and keep their mode.
fn check_replaceable(
    dir: &Path,
    a: &AttachArgs,
    desired: &RouterConfig,
    running: &Running,
    recorded: Option<&[String; 2]>,
) -> Result<()> {
    if !running.complete() {
        let missing: Vec<&str> = PinnedMaps::required()
            .chain(LINK_PINS.iter().copied())
            .filter(|n| !dir.join(n).exists())
            .collect();
        bail!(Unretryable(format!(
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
        )));
    }
    // Interfaces: a link cannot move to another interface, but one whose
    // interface was deleted (a re-plugged USB NIC, a bridge or VLAN the
    // network manager made anew) gets a new link on the interface that
    // came back under the name it was attached to (`relink`): the maps,
    // and with them the flows, are kept.
    let gone = gone_links(running);
    let names = [&a.lan, &a.wan];
    for role in (0..2).filter(|&r| gone[r]) {
        if recorded.is_none_or(|n| n[role] != *names[role]) {
            bail!(Unretryable(format!(
                "the router's {} interface {} was deleted while attached, and its XDP link \
                 with it; attach again with the interfaces it was attached to{}, or run \
                 `router-ctl detach` first to attach elsewhere{}",
                ["LAN", "WAN"][role],
                recorded.map_or_else(|| "?".to_owned(), |n| n[role].clone()),
                recorded.map_or_else(String::new, |n| format!(" ({} {})", n[0], n[1])),
                crate::forward::detach_loses(dir)
            )));
        }
    }
    let cur_idx: Vec<u32> = running
        .links
        .iter()
        .filter_map(|(_, l)| l.as_ref().ok().map(|l| l.info.ifindex))
        .collect();
    let want_idx = [desired.lan_ifindex, desired.wan_ifindex];
    let moved = cur_idx.len() != 2 || (0..2).any(|r| !gone[r] && cur_idx[r] != want_idx[r]);
    if moved {
        let names: Vec<String> = cur_idx
            .iter()
            .map(|&i| netlink::ifname(i).unwrap_or_else(|| format!("ifindex {i}")))
            .collect();
        bail!(Unretryable(format!(
            "already attached to {} (LAN) and {} (WAN); to move the router to {} and {}, \
             run `router-ctl detach` first{}",
            names.first().map_or("?", String::as_str),
            names.get(1).map_or("?", String::as_str),
            a.lan,
            a.wan,
            crate::forward::detach_loses(dir)
        )));
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
            bail!(Unretryable(format!(
                "{iface} runs in {c} mode; a mode change needs new links (a short gap): \
                 `router-ctl detach` and attach again with --mode {w}{}",
                crate::forward::detach_loses(dir)
            )));
        }
    }
    Ok(())
}

/// Switches each pinned link to the loaded program, LAN first.
fn switch_links(dir: &Path, ebpf: &mut Ebpf, prog_id: u32) -> Result<()> {
    let prog = loader::xdp_prog(ebpf)?;
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
    Ok(())
}
