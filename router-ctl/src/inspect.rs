//! What is pinned and running right now: which maps are pinned, what the
//! kernel says about each pinned link (interface, program, mode), and the
//! configuration. `attach`, `detach` and `status` decide from this.

use std::{os::fd::AsFd as _, path::Path, sync::OnceLock};

use router_common::maps::{CONFIG_MAP, Config};

use crate::{
    bpfsys,
    lifecycle::loader::{self, Layout, Mismatch},
    maps::PinnedMaps,
    netlink,
    object::Object,
    pins::LINK_PINS,
};

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
    /// Why a pinned `CONFIG` map could not be read (e.g. its value has the
    /// layout of another build).
    pub config_error: Option<String>,
    /// A pinned map whose type, key size, value size or size differs from
    /// this router-ctl's object: the router was attached by another build.
    pub layout_mismatch: Option<Mismatch>,
}

impl Running {
    #[must_use]
    pub fn any_pins(&self) -> bool {
        !self.maps_present.is_empty() || !self.links.is_empty()
    }

    /// Every pin a running router needs: the maps of
    /// [`PinnedMaps::required`] and both links.
    #[must_use]
    pub fn complete(&self) -> bool {
        PinnedMaps::required().all(|n| self.maps_present.contains(&n))
            && self.links.len() == LINK_PINS.len()
            && self.links.iter().all(|(_, l)| l.is_ok())
    }

    /// The maps of [`PinnedMaps::ADDED_LATER`] that are not pinned: the
    /// router was attached by an earlier router-ctl.
    #[must_use]
    pub fn maps_added_later_missing(&self) -> Vec<&'static str> {
        PinnedMaps::ADDED_LATER
            .iter()
            .copied()
            .filter(|n| !self.maps_present.contains(n))
            .collect()
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
        maps_present: PinnedMaps::at(dir).present(),
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
        match PinnedMaps::at(dir).read_config() {
            Ok(c) => r.config = Some(c),
            Err(e) => r.config_error = Some(format!("{e:#}")),
        }
    }
    r.layout_mismatch = layout_mismatch(dir);
    r
}

/// The layouts of the embedded object's maps, parsed once.
fn embedded_layouts() -> &'static [(&'static str, Layout)] {
    static LAYOUTS: OnceLock<Vec<(&'static str, Layout)>> = OnceLock::new();
    LAYOUTS.get_or_init(|| {
        Object::load(None)
            .and_then(|o| loader::object_layouts(&o.bytes))
            .unwrap_or_default()
    })
}

/// The first map pinned in `dir` whose layout differs from the embedded
/// object's (what a live replace's layout check would refuse, but the
/// conntrack table's size, which `--max-flows` sets). Changes nothing.
#[must_use]
pub fn layout_mismatch(dir: &Path) -> Option<Mismatch> {
    loader::first_mismatch(dir, embedded_layouts())
}

/// What `stats`, `metrics` and the status page say about a router another
/// build attached.
#[must_use]
pub fn other_build_message(m: &Mismatch) -> String {
    format!(
        "attached by another build of router-ctl (map {}'s layout differs: this build {}, \
         pinned {}): use that build's router-ctl, or `router-ctl detach` and attach again \
         with this one",
        m.map, m.object, m.pinned
    )
}
