//! `BPF_PROG_RUN` tests of the IPv6 fast path on crafted frames, in the
//! router namespace of a topology with global IPv6 addresses (so
//! `bpf_fib_lookup` with `AF_INET6` sees its routes and neighbours).
//! Every run checks the verdict, the output bytes against a frame built
//! independently (hop limit - 1, the next hop's MACs, nothing else: L4
//! checksums verified unchanged), the exact change of every counter, and
//! where flows are involved the `CONNTRACK6` content.
#![allow(
    clippy::similar_names,
    reason = "each test is one scripted sequence of frames with short, parallel names"
)]

mod counts;
mod flows;
mod icmp;
mod mss_clamp;
mod pass_drop;
mod tcp_window;

use std::collections::BTreeMap;

use aya::maps::HashMap;
use router_common::maps::{
    Admit, CONNTRACK6_MAP, Config, Counter, CounterValue, FlowEntry6, FlowKey6, FlowState,
    NEXT_HOPS_MAP, NextHopKey, PINHOLES6_MAP, PinholeKey6, Timeouts,
};
use tests::prog::{LoadedRouter, ProgRun, ResolvedTopology, XDP_DROP, XDP_PASS, XDP_REDIRECT};
use tests::v6::{self, Ipv6, checksum_errors6};

const SEED: u32 = 0x5eed_0006;
const CT_ENTRIES: u32 = 1024;

/// The topology with IPv6 on every host and the router's neighbours
/// resolved.
fn topology() -> ResolvedTopology {
    let env = ResolvedTopology::new(false);
    v6::enable(&env.t);
    v6::resolve_neighbours(&env.t);
    env
}

fn config(env: &ResolvedTopology, admit: Admit) -> Config {
    let mut c = env.config(SEED, Timeouts::default());
    c.admit = admit as u8;
    c
}

/// Loads the object in the router namespace, writes `cfg`, runs `f`.
fn with_router<T: Send>(
    env: &ResolvedTopology,
    cfg: Config,
    f: impl FnOnce(&mut Router6) -> T + Send,
) -> T {
    env.in_router(CT_ENTRIES, move |mut loaded| {
        loaded.configure(&cfg);
        f(&mut Router6(loaded))
    })
}

struct Router6(LoadedRouter);

impl Router6 {
    fn lan(&self) -> u32 {
        self.0.lan
    }

    fn wan(&self) -> u32 {
        self.0.wan
    }

    fn conntrack6(&self) -> BTreeMap<FlowKey6, FlowEntry6> {
        let m: HashMap<_, FlowKey6, FlowEntry6> =
            HashMap::try_from(self.0.ebpf.map(CONNTRACK6_MAP).expect("CONNTRACK6")).unwrap();
        m.iter().map(|r| r.expect("iterate CONNTRACK6")).collect()
    }

    /// How many neighbours `NEXT_HOPS` notes as in use.
    fn next_hops_noted(&self) -> usize {
        let m: HashMap<_, NextHopKey, u64> =
            HashMap::try_from(self.0.ebpf.map(NEXT_HOPS_MAP).expect("NEXT_HOPS")).unwrap();
        m.keys().count()
    }

    /// Writes `k -> e` into CONNTRACK6, as the offload daemon does.
    fn put6(&mut self, k: &FlowKey6, e: &FlowEntry6) {
        let mut m: HashMap<_, FlowKey6, FlowEntry6> =
            HashMap::try_from(self.0.ebpf.map_mut(CONNTRACK6_MAP).expect("CONNTRACK6")).unwrap();
        m.insert(k, e, 0).unwrap();
    }

    /// Deletes `k` from CONNTRACK6, as an LRU eviction does.
    fn remove6(&mut self, k: &FlowKey6) {
        let mut m: HashMap<_, FlowKey6, FlowEntry6> =
            HashMap::try_from(self.0.ebpf.map_mut(CONNTRACK6_MAP).expect("CONNTRACK6")).unwrap();
        m.remove(k).unwrap();
    }

    fn pinhole(&mut self, addr: [u8; 16], proto: u8, port: u16) {
        let mut m: HashMap<_, PinholeKey6, u8> =
            HashMap::try_from(self.0.ebpf.map_mut(PINHOLES6_MAP).expect("PINHOLES6")).unwrap();
        let k = PinholeKey6 {
            addr,
            port,
            proto,
            pad: 0,
        };
        m.insert(k, 1, 0).unwrap();
    }

    /// Runs `frame` on `ifindex` and asserts the verdict, the output, and
    /// that exactly `counter` (+1, +len bytes) and `events` (+1 each)
    /// moved; `ct6_entries_inserted` must equal the growth of CONNTRACK6.
    #[expect(
        clippy::too_many_arguments,
        reason = "one call site shape for every check"
    )]
    fn check(
        &self,
        what: &str,
        frame: &[u8],
        ifindex: u32,
        verdict: u32,
        expect: &[u8],
        counter: Counter,
        events: &[Counter],
    ) -> ProgRun {
        let before = self.conntrack6().len();
        let run = self.0.test_run(frame, ifindex);
        let grown = self.conntrack6().len() - before;
        assert_eq!(
            run.verdict, verdict,
            "{what}: verdict; counters moved: {:?}",
            run.delta
        );
        assert_eq!(run.out, expect, "{what}: output frame");
        let mut want: Vec<(Counter, CounterValue)> = Counter::ALL
            .iter()
            .filter_map(|&c| {
                let n = events.iter().filter(|&&e| e == c).count() as u64;
                let v = if c == counter {
                    CounterValue {
                        packets: 1,
                        bytes: frame.len() as u64,
                    }
                } else if c == Counter::Ct6EntriesInserted {
                    CounterValue {
                        packets: grown as u64,
                        bytes: 0,
                    }
                } else {
                    CounterValue {
                        packets: n,
                        bytes: 0,
                    }
                };
                (v != CounterValue::default()).then_some((c, v))
            })
            .collect();
        want.sort_by_key(|(c, _)| *c as u32);
        assert_eq!(run.delta, want, "{what}: counter changes");
        run
    }

    fn pass(&self, what: &str, frame: &[u8], ifindex: u32, counter: Counter) {
        self.check(what, frame, ifindex, XDP_PASS, frame, counter, &[]);
    }

    fn drop_frame(&self, what: &str, frame: &[u8], ifindex: u32, counter: Counter) {
        self.check(what, frame, ifindex, XDP_DROP, frame, counter, &[]);
    }

    /// Asserts a redirect whose output is `expect`, with every L4
    /// checksum of input and output verifying.
    fn redirect(
        &self,
        what: &str,
        frame: &[u8],
        ifindex: u32,
        expect: &[u8],
        counter: Counter,
        events: &[Counter],
    ) -> ProgRun {
        assert_eq!(
            checksum_errors6(frame),
            Vec::<String>::new(),
            "{what}: input"
        );
        let run = self.check(what, frame, ifindex, XDP_REDIRECT, expect, counter, events);
        assert_eq!(
            checksum_errors6(&run.out),
            Vec::<String>::new(),
            "{what}: output"
        );
        run
    }

    /// Asserts that CONNTRACK6 holds exactly these keys with these states
    /// and flags, both entries of a flow with the same times.
    fn assert_flows(&self, what: &str, want: &[(FlowKey6, FlowState, u8)]) {
        let got = self.conntrack6();
        let keys: Vec<&FlowKey6> = got.keys().collect();
        let mut want_keys: Vec<&FlowKey6> = want.iter().map(|(k, _, _)| k).collect();
        want_keys.sort();
        assert_eq!(keys, want_keys, "{what}: CONNTRACK6 keys");
        for (k, state, flags) in want {
            let e = got[k];
            assert_eq!(
                (e.state, e.flags),
                (*state as u8, *flags),
                "{what}: entry {k:?}: {e:?}"
            );
            let peer = got
                .get(&k.reversed())
                .unwrap_or_else(|| panic!("{what}: no other entry for {k:?}"));
            assert_eq!(
                (peer.created_ns, peer.last_seen_ns),
                (e.created_ns, e.last_seen_ns),
                "{what}: times of the two entries of {k:?}"
            );
        }
    }
}

/// As sent by the client to the router's LAN interface.
fn from_client(env: &ResolvedTopology, p: &Ipv6) -> Vec<u8> {
    p.frame(env.lan_mac, env.client_mac)
}

/// As sent by the server to the router's WAN interface.
fn from_server(env: &ResolvedTopology, p: &Ipv6) -> Vec<u8> {
    p.frame(env.wan_mac, env.server_mac)
}

/// `p` forwarded by the router out of the WAN to the server: hop limit
/// one less, the router's and the server's MACs, nothing else changed.
fn to_server(env: &ResolvedTopology, p: &Ipv6) -> Vec<u8> {
    p.clone()
        .hop_limit(p.hop_limit - 1)
        .frame(env.server_mac, env.wan_mac)
}

/// `p` forwarded out of the LAN to the client.
fn to_client(env: &ResolvedTopology, p: &Ipv6) -> Vec<u8> {
    p.clone()
        .hop_limit(p.hop_limit - 1)
        .frame(env.client_mac, env.lan_mac)
}
