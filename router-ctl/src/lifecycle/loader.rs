//! Loading the XDP object with its maps pinned in a directory: fresh maps
//! for a new attach, or the pinned maps of a running router (so a replace
//! shares conntrack, counters, rules, devices and configuration), and
//! checking that a new object's maps fit the pinned ones.

use std::{fs, os::unix::fs::PermissionsExt as _, path::Path};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::MapInfo,
    programs::{ProgramError, Xdp},
};
use router_common::maps::{CONNTRACK_MAP, PROGRAM_NAME};

use crate::{maps::PinnedMaps, object::Object};

/// Loads `obj` with every map of [`PinnedMaps::NAMES`] pinned in `dir`:
/// maps already pinned there are reused, missing ones are created and
/// pinned. The conntrack table gets `entries` entries.
pub fn load_pinned(obj: &Object, dir: &Path, entries: u32) -> Result<Ebpf, EbpfError> {
    let mut loader = EbpfLoader::new();
    loader.map_max_entries(CONNTRACK_MAP, entries);
    for name in PinnedMaps::NAMES {
        loader.map_pin_path(name, dir.join(name));
    }
    loader.load(&obj.bytes)
}

/// Pins are private to root: the maps hold the flows and the rules.
pub fn chmod_600(path: &Path) -> Result<()> {
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))
}

/// Loads the router program into the kernel; returns its id.
pub fn load_program(ebpf: &mut Ebpf) -> Result<u32> {
    let prog = xdp_prog(ebpf)?;
    prog.load().map_err(verifier_error)?;
    Ok(prog.info().map_or(0, |i| i.id()))
}

/// The object's router program.
pub fn xdp_prog(ebpf: &mut Ebpf) -> Result<&mut Xdp> {
    ebpf.program_mut(PROGRAM_NAME)
        .with_context(|| format!("the object has no program {PROGRAM_NAME}"))?
        .try_into()
        .context("the object's router program is not XDP")
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

/// The map definitions of the new object must match the pinned maps it is
/// about to share, or the two programs would read each other's entries
/// wrongly.
pub fn check_layout(dir: &Path, obj: &Object, entries: u32) -> Result<()> {
    let parsed = aya_obj::Object::parse(&obj.bytes).context("parsing the XDP object")?;
    for name in PinnedMaps::NAMES {
        // Not pinned by an earlier router-ctl: the replace creates it.
        if PinnedMaps::ADDED_LATER.contains(&name) && !dir.join(name).exists() {
            continue;
        }
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
