//! The witness of where the kernel sends connections: the object's tc
//! egress program (`egress_witness`, see `router-ebpf/src/egress_witness.rs`)
//! attached by the daemon to both attached interfaces (tcx, Linux 6.6+,
//! after every program already there) when an offload-mode session opens
//! ([`Witness`]), for as long as the daemon runs: its links and its map
//! are the daemon's own (nothing pinned), so a stopped daemon leaves
//! nothing behind. The offloader asks it how the kernel's own packets of a
//! connection left ([`crate::offload::Kernel::egress_seen`]): whether a
//! UDP or ICMP connection's reply was forwarded to the inside (every
//! such offload), and under policy routing by which route and mark.

use anyhow::{Context, Result, anyhow};
use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData},
    programs::{LinkOrder, SchedClassifier, TcAttachType, tc::TcAttachOptions},
};
use router_common::maps::{EGRESS_SEEN_MAP, EGRESS_WITNESS_PROGRAM, EgressKey, EgressSeen};

use crate::{netlink, object::Object};

/// Map types whose size is the loader's to choose: the object's other maps
/// (the XDP program's, which the witness never touches) are created with
/// one entry each, so loading the object for the witness costs no memory
/// for a conntrack table. Hash, array, per-CPU array, LRU hash, dev map
/// hash (`BPF_MAP_TYPE_*`).
const SHRINKABLE_MAP_TYPES: [u32; 5] = [1, 2, 6, 9, 25];
/// `BPF_MAP_TYPE_RINGBUF` (aya-log's): at least a page.
const RINGBUF: u32 = 27;
const PAGE: u32 = 4096;

/// The daemon's witness, attached when an offload-mode session opens (every
/// UDP and ICMP offload asks it whether a reply was forwarded): the kernel
/// path pays one hash lookup per packet for it, a write when a note
/// changes.
pub(super) enum Witness {
    /// None wanted (standalone mode, a detached router).
    Off,
    /// Wanted on the egress of these interfaces, not attached yet.
    Wanted([u32; 2]),
    Attached(Box<EgressWitness>),
    /// The kernel has no tcx (before Linux 6.6; said once): conntrack's
    /// "replied" and the routing rules alone decide, for good
    /// ([`WITHOUT_WITNESS`]).
    Unavailable,
    /// Attaching failed (said once per failure in a row): conntrack's
    /// "replied" and the routing rules alone decide until a try after
    /// [`RETRY_AFTER_NS`] works.
    Failed {
        ifindexes: [u32; 2],
        at_ns: u64,
        why: String,
    },
}

/// What the daemon does without the witness, as its warnings and the
/// status line say.
pub(super) const WITHOUT_WITNESS: &str = "UDP and ICMP connections are offloaded once conntrack \
     saw a reply, forwarded or not (a forward rule that drops their replies is not seen), and \
     under policy routing offload decisions rest on the routing rules and the ct mark alone (a \
     mark set on each packet is not seen)";

/// How long after a failed attach the witness is tried again.
const RETRY_AFTER_NS: u64 = 60_000_000_000;

impl Witness {
    /// Forgets what the witness saw of packets `key` (nothing to forget
    /// when it is not attached).
    pub(super) fn forget(&mut self, key: &EgressKey) {
        if let Self::Attached(w) = self {
            // Not there: nothing seen.
            let _ = w.seen.remove(key);
        }
    }

    /// The attached witness, attaching it if it is wanted and not yet.
    pub(super) fn get(&mut self) -> Option<&EgressWitness> {
        let now = crate::clock::monotonic_ns();
        let (ifindexes, failed_before) = match self {
            Self::Wanted(_) if !kernel_has_tcx() => {
                tracing::warn!(
                    "this kernel has no tcx (Linux 6.6) for the egress witness (where the \
                     kernel sends connections): {WITHOUT_WITNESS}"
                );
                *self = Self::Unavailable;
                return None;
            }
            Self::Wanted(ifindexes) => (*ifindexes, false),
            Self::Failed {
                ifindexes, at_ns, ..
            } if now.saturating_sub(*at_ns) >= RETRY_AFTER_NS => (*ifindexes, true),
            _ => return self.attached(),
        };
        let attached = crate::object::Object::load(None)
            .and_then(|obj| EgressWitness::attach(&obj, ifindexes));
        *self = match attached {
            Ok(w) => {
                tracing::info!(
                    "the egress witness (where the kernel sends connections: a UDP or ICMP \
                     connection's forwarded reply, routes under policy rules) is attached to \
                     both interfaces"
                );
                Self::Attached(Box::new(w))
            }
            Err(e) => {
                let why = format!("{e:#}");
                if failed_before {
                    tracing::debug!("the egress witness, tried again: {why}");
                } else {
                    tracing::warn!(
                        "the egress witness (where the kernel sends connections): {why}; \
                         {WITHOUT_WITNESS} until it attaches (tried again every {} s)",
                        RETRY_AFTER_NS / 1_000_000_000
                    );
                }
                Self::Failed {
                    ifindexes,
                    at_ns: now,
                    why,
                }
            }
        };
        self.attached()
    }

    fn attached(&self) -> Option<&EgressWitness> {
        match self {
            Self::Attached(w) => Some(w),
            _ => None,
        }
    }

    /// What the status says of it: `attached`, `not needed yet` (a
    /// session not opened on an attached router yet), `unavailable: no tcx`,
    /// `failed: WHY`; `None` when none is wanted.
    pub(super) fn describe(&self) -> Option<String> {
        match self {
            Self::Off => None,
            Self::Wanted(_) => Some("not needed yet".to_owned()),
            Self::Attached(_) => Some("attached".to_owned()),
            Self::Unavailable => Some("unavailable: no tcx (Linux 6.6)".to_owned()),
            Self::Failed { why, .. } => Some(format!("failed: {why}")),
        }
    }
}

/// Whether the running kernel has tcx (Linux 6.6 on), by its release.
fn kernel_has_tcx() -> bool {
    // SAFETY: uname fills the struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&raw mut u) } != 0 {
        return true;
    }
    // SAFETY: uname NUL-terminates its fields.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    release_at_least(&release.to_string_lossy(), (6, 6))
}

/// Whether kernel release `release` (`6.18.44-amd64`) is `min` or later;
/// one that does not parse counts as later (let the attach tell).
fn release_at_least(release: &str, min: (u32, u32)) -> bool {
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= min,
        _ => true,
    }
}

/// The attached witness: its object (which holds the program and its two
/// links) and its map.
pub(super) struct EgressWitness {
    _ebpf: Ebpf,
    seen: HashMap<MapData, EgressKey, EgressSeen>,
}

impl EgressWitness {
    /// Loads the witness from `obj` and attaches it to the egress of the
    /// interfaces `ifindexes`.
    pub(super) fn attach(obj: &Object, ifindexes: [u32; 2]) -> Result<Self> {
        let parsed = aya_obj::Object::parse(&obj.bytes).context("parsing the object")?;
        let mut loader = EbpfLoader::new();
        for (name, def) in &parsed.maps {
            if name == EGRESS_SEEN_MAP {
                continue;
            }
            if SHRINKABLE_MAP_TYPES.contains(&def.map_type()) {
                loader.map_max_entries(name, 1);
            } else if def.map_type() == RINGBUF {
                loader.map_max_entries(name, PAGE);
            }
        }
        let mut ebpf = loader.load(&obj.bytes).context("loading the object")?;
        let prog: &mut SchedClassifier = ebpf
            .program_mut(EGRESS_WITNESS_PROGRAM)
            .with_context(|| format!("the object has no program {EGRESS_WITNESS_PROGRAM}"))?
            .try_into()
            .context("the object's egress witness is not a tc program")?;
        prog.load().context("loading the tc egress program")?;
        for ifindex in ifindexes {
            let name =
                netlink::ifname(ifindex).ok_or_else(|| anyhow!("interface {ifindex} is gone"))?;
            prog.attach_with_options(
                &name,
                TcAttachType::Egress,
                TcAttachOptions::TcxOrder(LinkOrder::last()),
            )
            .with_context(|| format!("attaching it to the egress of {name} (tcx, Linux 6.6+)"))?;
        }
        let map = ebpf
            .take_map(EGRESS_SEEN_MAP)
            .with_context(|| format!("the object has no map {EGRESS_SEEN_MAP}"))?;
        let seen = HashMap::try_from(map).context("the egress witness's map")?;
        Ok(Self { _ebpf: ebpf, seen })
    }

    /// How the kernel last sent a packet `key` out of an attached
    /// interface, if the witness saw one.
    pub(super) fn seen(&self, key: &EgressKey) -> Option<EgressSeen> {
        self.seen.get(key, 0).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcx_is_there_from_linux_6_6() {
        assert!(release_at_least("6.18.44-amd64", (6, 6)));
        assert!(release_at_least("6.6.0", (6, 6)));
        assert!(!release_at_least("6.1.0-28-amd64", (6, 6)));
        assert!(!release_at_least("5.15.167", (6, 6)));
        assert!(release_at_least("7.0", (6, 6)));
        assert!(release_at_least("weird", (6, 6)));
    }

    /// Every map of the embedded object is one the witness's load shrinks
    /// (or its own): a map of a new type would otherwise be created at full
    /// size for as long as the daemon runs.
    #[test]
    fn the_witness_load_shrinks_every_other_map_of_the_object() {
        let obj = Object::load(None).unwrap();
        let parsed = aya_obj::Object::parse(&obj.bytes).unwrap();
        assert!(parsed.maps.contains_key(EGRESS_SEEN_MAP));
        for (name, def) in &parsed.maps {
            assert!(
                name == EGRESS_SEEN_MAP
                    || SHRINKABLE_MAP_TYPES.contains(&def.map_type())
                    || def.map_type() == RINGBUF,
                "{name}: map type {} is not shrunk",
                def.map_type()
            );
        }
    }
}
