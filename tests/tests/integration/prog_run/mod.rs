//! `BPF_PROG_RUN` tests of the NAT data path on crafted frames, one module
//! per area.
//!
//! Each test builds a topology, loads the XDP object inside the router
//! namespace (so `bpf_fib_lookup` sees its routes and neighbours), writes
//! `DEVICES`, `CONFIG` and `PORT_FORWARDS`, runs frames with ingress `lan0`
//! or `wan0` and checks, for every frame:
//! - the verdict;
//! - the output bytes, against an expected frame built independently with
//!   [`tests::frames`] (checksums computed from scratch), and every checksum
//!   of the output recomputed ([`frames::verify_checksums`]);
//! - the exact change of every counter (one verdict counter +1 packet and
//!   +frame length bytes, the listed event counters +1 each, nothing else);
//! - where flows are involved, the complete `CONNTRACK` content.
//!
//! This module holds the checks and the expected translations the area
//! modules share.
#![allow(
    clippy::similar_names,
    clippy::many_single_char_names,
    reason = "each test is one scripted sequence of frames with short, parallel names"
)]

mod counts;
mod egress_witness;
mod expiry;
mod fib;
mod fragments;
mod icmp;
mod ip_options;
mod mss_clamp;
mod nat_behaviour;
mod not_for_us;
mod oversize;
mod pass_drop;
mod port_forward;
mod ports;
mod standalone;
mod tags;
mod tcp;
mod tcp_window;
mod time_exceeded;
mod udp;
mod verifier;

use std::collections::BTreeMap;
use std::fmt::Write as _;

use router_common::{
    flow::{MAX_PORT_PROBES, REFRESH_NS, candidate_port, endpoint_hash},
    maps::{
        Config, Counter, CounterValue, FLAG_FIN_ORIG, FLAG_FIN_REPLY, FLAG_MAPPED, FLAG_ORIGINAL,
        FLAG_PORT_FORWARD, FlowCount, FlowEntry, FlowKey, FlowState, IPPROTO_ICMP, IPPROTO_TCP,
        IPPROTO_UDP, TcpWindow, Timeouts,
    },
};
use tests::addr::octets::{CLIENT, CLIENT2, LAN_NOBODY, ROUTER_LAN, SERVER, WAN, WAN_NOBODY};
use tests::frames::{
    self, ETH_HLEN, ETHERTYPE_OFF, Frame, ICMP_DEST_UNREACH, ICMP_PARAMETER_PROBLEM,
    ICMP_TIME_EXCEEDED, IP_DF, IP_MF, IP_OFF, Icmp, Ipv4, L4, L4_OFF, TCP_ACK, TCP_FIN, TCP_PSH,
    TCP_RST, TCP_SYN, Tcp, Udp, fix_ipv4_checksum,
};
use tests::prog::{
    LoadedRouter, NS_PER_SEC, ProgRun, ResolvedTopology, XDP_DROP, XDP_PASS, XDP_REDIRECT,
    action_name, now_ns,
};
use tests::{LAN_IF, Ns, WAN_IF};

const SEED: u32 = 0x5eed_0001;
const PORT_MIN: u16 = 1024;
const PORT_MAX: u16 = 65535;
/// CONNTRACK capacity for the tests (entries).
const CT_ENTRIES: u32 = 4096;
/// TCP MSS option (data offset 6).
const MSS: [u8; 4] = [2, 4, 0x05, 0xb4];

/// `CONFIG` of these tests: the whole port range, default timeouts.
fn config(env: &ResolvedTopology) -> Config {
    env.config(SEED, Timeouts::default())
}

/// Loads the object in the router namespace (DEVICES filled, CONFIG
/// written when `cfg` is given) and runs `f` there.
fn with_router<T: Send>(
    env: &ResolvedTopology,
    cfg: Option<Config>,
    f: impl FnOnce(&mut Router) -> T + Send,
) -> T {
    env.in_router(CT_ENTRIES, move |loaded| {
        let mut r = Router(loaded);
        if let Some(c) = cfg {
            r.configure(&c);
        }
        f(&mut r)
    })
}

/// The loaded object (see [`LoadedRouter`]) with the checks of these tests.
struct Router(LoadedRouter);

impl std::ops::Deref for Router {
    type Target = LoadedRouter;
    fn deref(&self) -> &LoadedRouter {
        &self.0
    }
}

impl std::ops::DerefMut for Router {
    fn deref_mut(&mut self) -> &mut LoadedRouter {
        &mut self.0
    }
}

impl Router {
    /// Runs `frame` and asserts the verdict, the output bytes, and that
    /// exactly `counter` (+1 packet, +len bytes: the frame's length without
    /// the priority tags the program takes off first) and the `events` (+1
    /// each) moved.
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
        let size_before = self.flows().len();
        let run = self.0.test_run(frame, ifindex);
        let size_after = self.flows().len();
        assert_eq!(
            run.verdict,
            verdict,
            "{what}: verdict {} ({}), expected {} ({}); counters moved: {:?}",
            run.verdict,
            action_name(run.verdict),
            verdict,
            action_name(verdict),
            run.delta
        );
        assert_bytes(what, &run.out, expect);
        assert!(!counter.is_event(), "{counter:?} is not a verdict counter");
        let len = frames::without_priority_tags(frame).map_or(frame.len(), |f| f.len()) as u64;
        let want: Vec<(Counter, CounterValue)> = Counter::ALL
            .iter()
            .filter_map(|&c| {
                let n = events.iter().filter(|&&e| e == c).count() as u64;
                let v = if c == counter {
                    CounterValue {
                        packets: 1,
                        bytes: len,
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
        // The entry bookkeeping counters must add up to the table's change
        // (nothing is evicted from these small tables); the rest is exact.
        let moved = |c: Counter| {
            run.delta
                .iter()
                .find(|(d, _)| *d == c)
                .map_or(0, |(_, v)| v.packets)
        };
        let (inserted, removed) = (
            moved(Counter::CtEntriesInserted),
            moved(Counter::CtEntriesRemoved),
        );
        assert_eq!(
            i128::from(inserted) - i128::from(removed),
            size_after as i128 - size_before as i128,
            "{what}: ct_entries_inserted/removed vs CONNTRACK size"
        );
        let bookkeeping = [Counter::CtEntriesInserted, Counter::CtEntriesRemoved];
        let delta: Vec<(Counter, CounterValue)> = run
            .delta
            .iter()
            .copied()
            .filter(|(c, _)| !bookkeeping.contains(c))
            .collect();
        assert_eq!(delta, want, "{what}: counter changes");
        run
    }

    /// Asserts `XDP_PASS`, frame untouched, only `counter` moved.
    fn pass(&self, what: &str, frame: &[u8], ifindex: u32, counter: Counter) -> ProgRun {
        self.check(what, frame, ifindex, XDP_PASS, frame, counter, &[])
    }

    /// Asserts `XDP_DROP`, frame untouched, only `counter` moved.
    fn drop_frame(&self, what: &str, frame: &[u8], ifindex: u32, counter: Counter) {
        self.check(what, frame, ifindex, XDP_DROP, frame, counter, &[]);
    }

    /// Asserts `XDP_REDIRECT` with output `expect` (whose checksums are
    /// verified from scratch too), `counter` and `events`.
    fn redirect(
        &self,
        what: &str,
        frame: &[u8],
        ifindex: u32,
        expect: &[u8],
        counter: Counter,
        events: &[Counter],
    ) -> ProgRun {
        frames::verify_checksums(frame);
        let run = self.check(what, frame, ifindex, XDP_REDIRECT, expect, counter, events);
        frames::verify_checksums(&run.out);
        run
    }

    /// `ip`, sent by `CLIENT`, opening a flow masqueraded to `WAN:port`
    /// (ICMP echo: identifier `port`): asserts the redirect, `fwd_outbound`
    /// and `flow_new_masquerade`.
    fn opens_out(&self, env: &ResolvedTopology, what: &str, ip: &Ipv4, port: u16) -> ProgRun {
        self.redirect(
            what,
            &env.client_sends(ip),
            self.lan,
            &env.to_server(&snat(ip, port)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        )
    }

    /// `t` from `CLIENT` to `SERVER`, masqueraded to the client's own port
    /// (port preservation): asserts the redirect, `fwd_outbound` and
    /// `events`.
    fn masq_out(&self, env: &ResolvedTopology, what: &str, t: Tcp, events: &[Counter]) -> ProgRun {
        let port = t.sport;
        let ip = Ipv4::new(CLIENT, SERVER, t);
        self.redirect(
            what,
            &env.client_sends(&ip),
            self.lan,
            &env.to_server(&snat(&ip, port)),
            Counter::FwdOutbound,
            events,
        )
    }

    /// `t` from `SERVER` to the WAN address, translated to `CLIENT`'s same
    /// port: asserts the redirect, `fwd_inbound` and `events`.
    fn masq_in(&self, env: &ResolvedTopology, what: &str, t: Tcp, events: &[Counter]) -> ProgRun {
        let port = t.dport;
        let ip = Ipv4::new(SERVER, WAN, t);
        self.redirect(
            what,
            &env.server_sends(&ip),
            self.wan,
            &env.to_client(&dnat(&ip, CLIENT, port)),
            Counter::FwdInbound,
            events,
        )
    }

    /// CONNTRACK content without the next-hop caches (see
    /// [`Router::raw_entry`] and the `next_hop_cache` test for those).
    fn flows(&self) -> BTreeMap<FlowKey, FlowEntry> {
        self.conntrack
            .iter()
            .map(|r| r.expect("iterate CONNTRACK"))
            .map(|(k, v)| (k, without_hop(v)))
            .collect()
    }

    fn get(&self, k: &FlowKey) -> FlowEntry {
        without_hop(self.raw_entry(k))
    }

    /// A CONNTRACK entry as stored, next-hop cache included.
    fn raw_entry(&self, k: &FlowKey) -> FlowEntry {
        self.conntrack
            .get(k, 0)
            .unwrap_or_else(|e| panic!("no CONNTRACK entry {k:?}: {e}; map: {:#?}", self.flows()))
    }

    /// Asserts that CONNTRACK holds exactly `expected`.
    fn assert_flows(&self, what: &str, expected: impl IntoIterator<Item = (FlowKey, FlowEntry)>) {
        let want: BTreeMap<FlowKey, FlowEntry> = expected.into_iter().collect();
        let got = self.flows();
        if got != want {
            let mut msg = format!("{what}: CONNTRACK differs\n");
            for (k, v) in &want {
                match got.get(k) {
                    None => writeln!(msg, "  missing {k:?}\n    want {v:?}").unwrap(),
                    Some(g) if g != v => {
                        writeln!(msg, "  {k:?}\n    got  {g:?}\n    want {v:?}").unwrap();
                    }
                    Some(_) => {}
                }
            }
            for (k, v) in &got {
                if !want.contains_key(k) {
                    writeln!(msg, "  unexpected {k:?}\n    {v:?}").unwrap();
                }
            }
            panic!("{msg}");
        }
    }

    /// The time the entry `k` was created by `run`: `created_ns ==
    /// last_seen_ns`, inside the run's clock window.
    fn stamp(&self, k: &FlowKey, run: &ProgRun) -> u64 {
        let e = self.get(k);
        assert_eq!(
            e.created_ns, e.last_seen_ns,
            "new entry {k:?}: created != last seen"
        );
        assert!(
            (run.t0..=run.t1).contains(&e.last_seen_ns),
            "entry {k:?} time {} outside the run's window {}..={}",
            e.last_seen_ns,
            run.t0,
            run.t1
        );
        e.last_seen_ns
    }

    /// The `last_seen_ns` expected of `k` after `run` hit it, when it was
    /// `prev` before: unchanged if less than `REFRESH_NS` passed, refreshed
    /// to the run's time if more did (either when undecidable).
    fn seen(&self, k: &FlowKey, prev: u64, run: &ProgRun) -> u64 {
        let actual = self.get(k).last_seen_ns;
        if run.t1.saturating_sub(prev) < REFRESH_NS {
            return prev;
        }
        let must_refresh = run.t0.saturating_sub(prev) >= REFRESH_NS;
        if must_refresh || actual != prev {
            assert!(
                (run.t0..=run.t1).contains(&actual),
                "entry {k:?} last seen {actual} (was {prev}) not refreshed to {}..={}",
                run.t0,
                run.t1
            );
        }
        actual
    }
}

fn assert_bytes(what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    let first = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    panic!(
        "{what}: output differs (lengths {} / {}), first at byte {first}\n got  {:02x?}\n want {:02x?}",
        got.len(),
        want.len(),
        got,
        want
    );
}

// ---------------------------------------------------------------------------
// Expected translations and flow entries (written independently of the
// data path: addresses, ports, TTL; checksums come from the frame builder).
// ---------------------------------------------------------------------------

fn set_ports(l4: &mut L4, src: Option<u16>, dst: Option<u16>) {
    match l4 {
        L4::Tcp(t) => {
            t.sport = src.unwrap_or(t.sport);
            t.dport = dst.unwrap_or(t.dport);
        }
        L4::Udp(u) => {
            u.sport = src.unwrap_or(u.sport);
            u.dport = dst.unwrap_or(u.dport);
        }
        L4::Icmp(Icmp::Echo { id, .. }) => *id = src.or(dst).unwrap_or(*id),
        other => panic!("no ports in {other:?}"),
    }
}

/// `ip` as the router forwards it to the WAN: source `WAN:port` (ICMP
/// echo: identifier `port`), TTL - 1.
fn snat(ip: &Ipv4, port: u16) -> Ipv4 {
    let mut o = ip.clone();
    o.src = WAN;
    o.ttl -= 1;
    set_ports(&mut o.l4, Some(port), None);
    o
}

/// `ip` as the router forwards it to the LAN: destination `addr:port`
/// (ICMP echo: identifier `port`), TTL - 1.
fn dnat(ip: &Ipv4, addr: [u8; 4], port: u16) -> Ipv4 {
    let mut o = ip.clone();
    o.dst = addr;
    o.ttl -= 1;
    set_ports(&mut o.l4, None, Some(port));
    o
}

/// `e` with the next-hop cache cleared, as a new entry has it, and
/// without the TCP window tracking, the packet counts and the outbound
/// mapping refresh tick (the `tcp_window`, `counts` and `nat_behaviour`
/// tests check those through [`Router::raw_entry`] and the mappings).
fn without_hop(mut e: FlowEntry) -> FlowEntry {
    e.clear_next_hop();
    e.out_tick = 0;
    e.tcp = TcpWindow::default();
    e.count = FlowCount::default();
    e
}

fn entry(
    peer: FlowKey,
    tr: FlowKey,
    state: FlowState,
    flags: u8,
    created: u64,
    seen: u64,
) -> FlowEntry {
    FlowEntry {
        peer,
        new_src_addr: tr.src_addr,
        new_dst_addr: tr.dst_addr,
        new_src_port: tr.src_port,
        new_dst_port: tr.dst_port,
        state: state as u8,
        flags,
        out_tick: 0,
        last_seen_ns: seen,
        created_ns: created,
        ..FlowEntry::default()
    }
}

/// A flow as the spec says the data path records it.
#[derive(Clone, Copy, Debug)]
struct Flow {
    /// Key of the opening direction, as it arrived.
    orig: FlowKey,
    /// The opening direction after translation.
    tr: FlowKey,
    /// `FLAG_PORT_FORWARD`, `FLAG_MAPPED` (a flow holding a NAT
    /// mapping), `FLAG_HAIRPIN`.
    extra: u8,
}

impl Flow {
    /// LAN -> WAN, masqueraded to `WAN:port` (ICMP echo: both ports).
    fn masq(orig: FlowKey, port: u16) -> Self {
        let dport = if orig.proto == IPPROTO_ICMP {
            port
        } else {
            orig.dst_port
        };
        Self {
            orig,
            tr: FlowKey::new(WAN, orig.dst_addr, port, dport, orig.proto),
            extra: FLAG_MAPPED,
        }
    }

    /// WAN -> LAN through a port-forward rule to `addr:port`.
    fn forward(orig: FlowKey, addr: [u8; 4], port: u16) -> Self {
        let tr = FlowKey::new(orig.src_addr, addr, orig.src_port, port, orig.proto);
        Self {
            orig,
            tr,
            extra: FLAG_PORT_FORWARD,
        }
    }

    /// Key of the answering direction (as it arrives).
    fn reply(&self) -> FlowKey {
        let t = self.tr;
        FlowKey::new(t.dst_addr, t.src_addr, t.dst_port, t.src_port, t.proto)
    }

    /// Both entries; `fin` = `FLAG_FIN_*` bits.
    fn entries(
        &self,
        state: FlowState,
        fin: u8,
        created: u64,
        seen: u64,
    ) -> [(FlowKey, FlowEntry); 2] {
        let o = self.orig;
        let back = FlowKey::new(o.dst_addr, o.src_addr, o.dst_port, o.src_port, o.proto);
        [
            (
                self.orig,
                entry(
                    self.reply(),
                    self.tr,
                    state,
                    FLAG_ORIGINAL | self.extra | fin,
                    created,
                    seen,
                ),
            ),
            (
                self.reply(),
                entry(self.orig, back, state, self.extra | fin, created, seen),
            ),
        ]
    }
}

/// Writes an offloaded UDP flow (offload mode's, with a live lease) from
/// `CLIENT:sport` to `SERVER:53`, masqueraded to `WAN:wan_port`.
fn put_offloaded_udp_flow(r: &mut Router, sport: u16, wan_port: u16) {
    put_offloaded_flow(
        r,
        udp_key(CLIENT, sport, SERVER, 53),
        wan_port,
        FlowState::UdpReplied,
        router_common::maps::TcpWindow::default(),
    );
}

/// Writes both entries of an offloaded flow (offload mode's, with a live
/// lease, as the daemon writes them) whose original direction is `orig`
/// (from a LAN host), masqueraded to `WAN:wan_port`, in `state`, each
/// entry's window tracking `tcp`. Its lease.
fn put_offloaded_flow(
    r: &mut Router,
    orig: FlowKey,
    wan_port: u16,
    state: FlowState,
    tcp: router_common::maps::TcpWindow,
) -> u32 {
    use router_common::maps::{FLAG_OFFLOADED, lease_tick};
    let reply = FlowKey::new(orig.dst_addr, WAN, orig.dst_port, wan_port, orig.proto);
    let lease = lease_tick(now_ns()) + 60;
    let e = |peer: FlowKey, new_src, new_dst, sport, dport, flags| FlowEntry {
        peer,
        new_src_addr: new_src,
        new_dst_addr: new_dst,
        new_src_port: sport,
        new_dst_port: dport,
        state: state as u8,
        flags: flags | FLAG_OFFLOADED,
        last_seen_ns: now_ns(),
        lease,
        tcp,
        ..FlowEntry::default()
    };
    let (lan_host, server) = (orig.src_addr, orig.dst_addr);
    r.put(
        orig,
        e(reply, WAN, server, wan_port, orig.dst_port, FLAG_ORIGINAL),
    );
    r.put(
        reply,
        e(orig, server, lan_host, orig.dst_port, orig.src_port, 0),
    );
    lease
}

/// The SNAT port the spec's probing picks for `key` when `taken` ports
/// collide and `skip` ports have a port-forward rule; also the number of
/// collisions on the way.
fn probe(key: &FlowKey, min: u16, max: u16, taken: &[u16], skip: &[u16]) -> Option<(u16, usize)> {
    let sport = key.src_port;
    let h = endpoint_hash(key, SEED);
    let mut collisions = 0;
    for attempt in 0..MAX_PORT_PROBES {
        let p = candidate_port(attempt, sport, h, min, max);
        assert!((min..=max).contains(&p));
        if skip.contains(&p) {
            continue;
        }
        if taken.contains(&p) {
            collisions += 1;
            continue;
        }
        return Some((p, collisions));
    }
    None
}

fn tcp_key(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> FlowKey {
    FlowKey::new(src, dst, sport, dport, IPPROTO_TCP)
}

fn udp_key(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> FlowKey {
    FlowKey::new(src, dst, sport, dport, IPPROTO_UDP)
}

fn icmp_key(src: [u8; 4], dst: [u8; 4], id: u16) -> FlowKey {
    FlowKey::new(src, dst, id, id, IPPROTO_ICMP)
}

/// Keeps the calling thread on the CPU it runs on (`BPF_PROG_RUN` runs the
/// program there, with that CPU's per-CPU map slots); that CPU.
fn pin_to_this_cpu() -> usize {
    // SAFETY: plain libc calls on this thread, with a zeroed, then filled,
    // CPU set of the right size.
    unsafe {
        let cpu = usize::try_from(libc::sched_getcpu()).expect("sched_getcpu");
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set),
            0,
            "pin to CPU {cpu}"
        );
        cpu
    }
}
