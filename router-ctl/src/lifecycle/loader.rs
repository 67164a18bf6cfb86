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
use router_common::maps::{CONNTRACK_MAP, COUNTERS_MAP, EGRESS_SEEN_MAP, PROGRAM_NAME};

use super::Unretryable;
use crate::{maps::PinnedMaps, object::Object};

/// Loads `obj` with every map of [`PinnedMaps::NAMES`] pinned in `dir`:
/// maps already pinned there are reused, missing ones are created and
/// pinned. The conntrack table gets `entries` entries. `COUNTERS` is pinned
/// as `counters_pin` instead when given (a replace that carries the counts
/// into a map of another length: `counters_carry`).
pub fn load_pinned(
    obj: &Object,
    dir: &Path,
    entries: u32,
    counters_pin: Option<&str>,
) -> Result<Ebpf, EbpfError> {
    let mut loader = EbpfLoader::new();
    loader.map_max_entries(CONNTRACK_MAP, entries);
    // The tc egress witness's map: the daemon loads its own (see
    // `daemon::egress_witness`); the XDP program never uses it.
    loader.map_max_entries(EGRESS_SEEN_MAP, 1);
    for name in PinnedMaps::NAMES {
        let pin = match counters_pin {
            Some(other) if name == COUNTERS_MAP => other,
            _ => name,
        };
        loader.map_pin_path(name, dir.join(pin));
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

/// One map's layout: what two programs sharing it must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub map_type: u32,
    pub key_size: u32,
    pub value_size: u32,
    pub max_entries: u32,
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "type {}, key {} B, value {} B, {} entries",
            self.map_type, self.key_size, self.value_size, self.max_entries
        )
    }
}

/// The layouts of an object's maps of [`PinnedMaps::NAMES`], in that order.
pub fn object_layouts(bytes: &[u8]) -> Result<Vec<(&'static str, Layout)>> {
    let parsed = aya_obj::Object::parse(bytes).context("parsing the XDP object")?;
    PinnedMaps::NAMES
        .iter()
        .map(|&name| {
            let def = parsed
                .maps
                .get(name)
                .with_context(|| format!("the object has no {name} map"))?;
            Ok((
                name,
                Layout {
                    map_type: def.map_type(),
                    key_size: def.key_size(),
                    value_size: def.value_size(),
                    max_entries: def.max_entries(),
                },
            ))
        })
        .collect()
}

/// The layout of the map pinned at `path` (reads its info; changes nothing).
pub fn pinned_layout(path: &Path) -> Result<Layout> {
    let pinned = MapInfo::from_pin(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Layout {
        map_type: pinned.map_type().map_or(u32::MAX, |t| t as u32),
        key_size: pinned.key_size(),
        value_size: pinned.value_size(),
        max_entries: pinned.max_entries(),
    })
}

/// Whether the pinned map `name` of layout `pinned` fits an object whose
/// definition is `def`. The conntrack table's size is the attach's
/// (`--max-flows`), not the object's: `conntrack_entries` is the size a
/// replace wants, `None` to accept any size (a table attached with another
/// `--max-flows` is not another build's). `COUNTERS` may have any length:
/// counters only ever go last, so a build with more or fewer of them
/// shares the indexes of the ones both have (readers read what is there, a
/// replace carries the counts into a map of its own length).
#[must_use]
pub fn fits(name: &str, def: Layout, pinned: Layout, conntrack_entries: Option<u32>) -> bool {
    let want_entries = match name {
        CONNTRACK_MAP => conntrack_entries.unwrap_or(pinned.max_entries),
        COUNTERS_MAP => pinned.max_entries,
        _ => def.max_entries,
    };
    Layout {
        max_entries: want_entries,
        ..def
    } == pinned
}

/// A pinned map whose layout differs from the object's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    pub map: &'static str,
    pub object: Layout,
    pub pinned: Layout,
}

/// The first pinned map of `dir` whose layout differs from `want`'s
/// (side-effect free: only reads the maps' info). Maps not pinned, or whose
/// info cannot be read, are not compared (`status` reports missing pins of
/// its own). The conntrack table may have any size.
#[must_use]
pub fn first_mismatch(dir: &Path, want: &[(&'static str, Layout)]) -> Option<Mismatch> {
    want.iter().find_map(|&(map, object)| {
        let path = dir.join(map);
        if !path.exists() {
            return None;
        }
        let pinned = pinned_layout(&path).ok()?;
        (!fits(map, object, pinned, None)).then_some(Mismatch {
            map,
            object,
            pinned,
        })
    })
}

/// The map definitions of the new object must match the pinned maps it is
/// about to share, or the two programs would read each other's entries
/// wrongly.
///
/// A refusal is [`Unretryable`]: trying again changes nothing.
pub fn check_layout(dir: &Path, obj: &Object, entries: u32) -> Result<()> {
    for (name, def) in object_layouts(&obj.bytes)? {
        // Not pinned by an earlier router-ctl: the replace creates it.
        if PinnedMaps::ADDED_LATER.contains(&name) && !dir.join(name).exists() {
            continue;
        }
        let pinned =
            pinned_layout(&dir.join(name)).with_context(|| format!("reading the pinned {name}"))?;
        if name == CONNTRACK_MAP && pinned.max_entries != entries {
            bail!(Unretryable(format!(
                "the conntrack table holds {} flows and cannot be resized while attached \
                 (its flows live in it); `router-ctl detach` and attach again to resize \
                 (open connections through the router are then dropped{}), or keep \
                 --max-flows {}",
                pinned.max_entries / 2,
                crate::forward::detach_loses(dir),
                pinned.max_entries / 2
            )));
        }
        if !fits(name, def, pinned, Some(entries)) {
            let want = Layout {
                max_entries: if name == CONNTRACK_MAP {
                    entries
                } else {
                    def.max_entries
                },
                ..def
            };
            bail!(Unretryable(format!(
                "the new object's {name} map ({want}) does not match the pinned one \
                 ({pinned}): a live replace would corrupt it; `router-ctl detach` and attach \
                 again{}",
                crate::forward::detach_loses(dir)
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Layout = Layout {
        map_type: 9,
        key_size: 40,
        value_size: 96,
        max_entries: 1000,
    };

    #[test]
    fn the_conntrack_tables_size_is_the_attachs() {
        let bigger = Layout {
            max_entries: 4000,
            ..L
        };
        assert!(fits(CONNTRACK_MAP, L, bigger, None));
        assert!(fits(CONNTRACK_MAP, L, bigger, Some(4000)));
        assert!(!fits(CONNTRACK_MAP, L, bigger, Some(1000)));
        assert!(!fits("CONFIG", L, bigger, None));
        // One counter more or fewer: the same indexes for the ones both have.
        assert!(fits("COUNTERS", L, bigger, None));
        assert!(!fits("COUNTERS", L, other_value_size(L), None));
        let other_value = Layout {
            value_size: 56,
            ..bigger
        };
        assert!(!fits(CONNTRACK_MAP, L, other_value, None));
        assert!(fits("COUNTERS", L, L, None));
    }

    fn other_value_size(l: Layout) -> Layout {
        Layout {
            value_size: l.value_size + 8,
            ..l
        }
    }

    #[test]
    fn the_embedded_object_has_every_pinned_map() {
        let l = object_layouts(&Object::load(None).unwrap().bytes).unwrap();
        assert_eq!(l.len(), PinnedMaps::NAMES.len());
    }
}
