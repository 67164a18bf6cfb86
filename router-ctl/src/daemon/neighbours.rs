//! Neighbours only the fast path sends to. The kernel never sees those
//! packets, and `bpf_fib_lookup` neither confirms nor probes the entry it
//! reads, so the kernel would leave such an entry STALE for good: a next
//! hop that changed its MAC without telling (no gratuitous ARP, no
//! request of its own to the router) or went away would keep getting the
//! fast path's frames. At each tick the daemon has the kernel use the
//! STALE entries of the next hops the data path noted in use
//! (`NEXT_HOPS`), as its own output path does on a packet to one
//! (`NTF_USE`: DELAY, a unicast probe, a new resolution if that fails; the
//! data path then passes the flow's packets to the kernel until the
//! neighbour is resolved again). Entries in any other state are left
//! alone: REACHABLE ones need nothing, and a permanent (static) entry must
//! not be touched (`NTF_USE` would make it dynamic); nor is one learned
//! from a controller or managed by the kernel (`NTF_USE` would clear
//! those flags). An owner who makes an entry static between the dump and
//! the `NTF_USE` (microseconds) gets it dynamic again.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use router_common::{flow::REFRESH_NS, maps::NextHopKey};

use crate::{
    maps::{NextHopsMap, PinnedMaps},
    netlink,
};

/// A noted next hop not used for this long leaves `NEXT_HOPS`.
const FORGET_NS: u64 = 60_000_000_000;

/// The daemon's view of `NEXT_HOPS` (absent for a router attached by an
/// earlier router-ctl: nothing to follow there).
pub(super) struct NeighbourUse {
    map: Option<NextHopsMap>,
    maps: PinnedMaps,
    /// The last pass failed (said once per failure in a row).
    failing: bool,
    /// When the last pass ran (`CLOCK_MONOTONIC` ns).
    last_pass_ns: Option<u64>,
}

impl NeighbourUse {
    pub(super) fn open(maps: &PinnedMaps) -> Self {
        Self {
            map: maps.next_hops().ok(),
            maps: maps.clone(),
            failing: false,
            last_pass_ns: None,
        }
    }

    /// One pass at `now_ns` (ticks `tick_ns` apart): how many STALE
    /// entries of next hops in use the kernel was asked to re-validate.
    pub(super) fn tick(&mut self, now_ns: u64, tick_ns: u64) -> u64 {
        // In use: noted since the pass before the last (a flow direction
        // notes its next hop at most once per `REFRESH_NS`, when it asks
        // the FIB, about once per `REFRESH_NS` while it has packets); a
        // pass that came late (a busy daemon) looks back as far.
        let since_last = self
            .last_pass_ns
            .replace(now_ns)
            .map_or(tick_ns, |last| now_ns.saturating_sub(last));
        let in_use_ns = since_last.max(tick_ns) + 2 * REFRESH_NS;
        if self.map.is_none() {
            // Pinned by a replace since (a router attached by an earlier
            // router-ctl keeps its map ids, so the session stays).
            self.map = self.maps.next_hops().ok();
        }
        let Some(map) = self.map.as_mut() else {
            return 0;
        };
        let mut used = Vec::new();
        let mut old = Vec::new();
        for (key, at) in map.iter().filter_map(Result::ok) {
            let age = now_ns.saturating_sub(at);
            if age <= in_use_ns {
                used.extend(neighbour_of(&key));
            } else if age > FORGET_NS {
                old.push(key);
            }
        }
        for key in old {
            let _ = map.remove(&key);
        }
        if used.is_empty() {
            return 0;
        }
        let result = netlink::use_stale_neighbours(&used);
        match result {
            Ok(done) => {
                self.failing = false;
                // ENOENT: the entry went meanwhile (nothing to keep).
                for e in done.iter().filter_map(|r| r.as_ref().err()) {
                    if e.raw_os_error() != Some(libc::ENOENT) {
                        tracing::debug!("re-validating a neighbour: {e}");
                    }
                }
                done.iter().filter(|r| r.is_ok()).count() as u64
            }
            Err(e) => {
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(
                        "re-validating the neighbours only the fast path uses: {e}; their \
                         entries stay as they are until it works again"
                    );
                }
                0
            }
        }
    }
}

/// The neighbour entry `key` names: its interface and address.
fn neighbour_of(key: &NextHopKey) -> Option<(u32, IpAddr)> {
    let addr = match i32::try_from(key.family).ok()? {
        libc::AF_INET => IpAddr::V4(Ipv4Addr::new(
            key.addr[0],
            key.addr[1],
            key.addr[2],
            key.addr[3],
        )),
        libc::AF_INET6 => IpAddr::V6(Ipv6Addr::from(key.addr)),
        _ => return None,
    };
    Some((key.ifindex, addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_noted_next_hop_names_its_neighbour_entry() {
        let mut v4 = NextHopKey {
            ifindex: 3,
            family: 2,
            addr: [0; 16],
        };
        v4.addr[..4].copy_from_slice(&[203, 0, 113, 2]);
        assert_eq!(neighbour_of(&v4), Some((3, IpAddr::from([203, 0, 113, 2]))));
        let v6 = NextHopKey {
            ifindex: 4,
            family: 10,
            addr: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        };
        assert_eq!(
            neighbour_of(&v6),
            Some((4, "fe80::1".parse::<IpAddr>().unwrap()))
        );
        assert_eq!(neighbour_of(&NextHopKey::default()), None);
    }
}
