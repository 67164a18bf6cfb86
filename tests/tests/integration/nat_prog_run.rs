//! `BPF_PROG_RUN` tests of the NAT data path on crafted frames.
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
#![allow(
    clippy::too_many_lines,
    clippy::similar_names,
    clippy::many_single_char_names,
    reason = "each test is one scripted sequence of frames with short, parallel names"
)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;

use router_common::{
    flow::{MAX_PORT_PROBES, REFRESH_NS, candidate_port, flow_hash},
    maps::{
        Config, Counter, CounterValue, FLAG_FIN_ORIG, FLAG_FIN_REPLY, FLAG_ORIGINAL,
        FLAG_PORT_FORWARD, FlowEntry, FlowKey, FlowState, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP,
        Timeouts,
    },
};
use tests::frames::{
    self, Frame, ICMP_DEST_UNREACH, ICMP_PARAMETER_PROBLEM, ICMP_TIME_EXCEEDED, IP_DF, IP_MF,
    IP_OFF, Icmp, Ipv4, L4, L4_OFF, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, Tcp, Udp,
    fix_ipv4_checksum,
};
use tests::prog::LoadedRouter;
use tests::{HOST_IF, LAN_IF, Ns, Topology, WAN_IF};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

const CLIENT: [u8; 4] = [192, 168, 50, 2];
const CLIENT2: [u8; 4] = [192, 168, 50, 3];
const ROUTER_LAN: [u8; 4] = [192, 168, 50, 1];
const WAN: [u8; 4] = [203, 0, 113, 1];
const SERVER: [u8; 4] = [203, 0, 113, 2];
/// LAN and WAN addresses nobody has: no neighbour entry.
const LAN_NOBODY: [u8; 4] = [192, 168, 50, 9];
const WAN_NOBODY: [u8; 4] = [203, 0, 113, 9];

const SEED: u32 = 0x5eed_0001;
const PORT_MIN: u16 = 1024;
const PORT_MAX: u16 = 65535;
/// CONNTRACK capacity for the tests (entries).
const CT_ENTRIES: u32 = 4096;
/// TCP MSS option (data offset 6).
const MSS: [u8; 4] = [2, 4, 0x05, 0xb4];
const NS_PER_SEC: u64 = 1_000_000_000;

// ---------------------------------------------------------------------------
// Topology and router handle
// ---------------------------------------------------------------------------

fn mac_str(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn assert_neighbour(t: &Topology, addr: [u8; 4], dev: &str, mac: [u8; 6]) {
    let a = Ipv4Addr::from(addr).to_string();
    let out = t.exec_ok(Ns::Router, &["ip", "neigh", "show", &a, "dev", dev]);
    let want = format!("lladdr {}", mac_str(mac));
    assert!(
        out.contains(&want),
        "router has no neighbour {a} {want} on {dev}: {out:?}"
    );
}

/// A topology with the router's neighbour table filled, and its MACs and
/// ifindexes.
struct Env {
    t: Topology,
    lan: u32,
    wan: u32,
    lan_mac: [u8; 6],
    wan_mac: [u8; 6],
    client_mac: [u8; 6],
    client2_mac: [u8; 6],
    server_mac: [u8; 6],
}

impl Env {
    fn new(two_clients: bool) -> Self {
        let t = if two_clients {
            Topology::with_two_clients()
        } else {
            Topology::new()
        };
        // The server has no route back. The router learns the clients'
        // MACs from their ARP requests for the gateway and the server's from
        // its ARP request for the WAN address; the pings are answered by the
        // router itself.
        let gw = Ipv4Addr::from(ROUTER_LAN);
        assert!(t.ping(Ns::Client, gw, 1), "client cannot ping the router");
        if two_clients {
            assert!(t.ping(Ns::Client2, gw, 1), "client2 cannot ping the router");
        }
        assert!(
            t.ping(Ns::Server, Ipv4Addr::from(WAN), 1),
            "server cannot ping the router"
        );
        // Also make the router resolve the server itself (forwarded ping).
        let _ = t.exec(Ns::Client, &["ping", "-c", "1", "-W", "1", "203.0.113.2"]);
        let client_mac = t.mac(Ns::Client, HOST_IF);
        let client2_mac = if two_clients {
            t.mac(Ns::Client2, HOST_IF)
        } else {
            [0; 6]
        };
        let server_mac = t.mac(Ns::Server, HOST_IF);
        assert_neighbour(&t, CLIENT, LAN_IF, client_mac);
        if two_clients {
            assert_neighbour(&t, CLIENT2, LAN_IF, client2_mac);
        }
        assert_neighbour(&t, SERVER, WAN_IF, server_mac);
        Self {
            lan: t.ifindex(Ns::Router, LAN_IF),
            wan: t.ifindex(Ns::Router, WAN_IF),
            lan_mac: t.mac(Ns::Router, LAN_IF),
            wan_mac: t.mac(Ns::Router, WAN_IF),
            client_mac,
            client2_mac,
            server_mac,
            t,
        }
    }

    fn config(&self) -> Config {
        Config {
            lan_ifindex: self.lan,
            wan_ifindex: self.wan,
            wan_addr: WAN,
            port_min: PORT_MIN,
            port_max: PORT_MAX,
            hash_seed: SEED,
            pad: 0,
            timeouts: Timeouts::default(),
        }
    }

    /// As sent by the client to the router's `lan0`.
    fn client_sends(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.lan_mac, self.client_mac, ip.clone()).bytes()
    }

    fn client2_sends(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.lan_mac, self.client2_mac, ip.clone()).bytes()
    }

    /// As sent by the server to the router's `wan0`.
    fn server_sends(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.wan_mac, self.server_mac, ip.clone()).bytes()
    }

    /// As redirected out of `wan0` to the server.
    fn to_server(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.server_mac, self.wan_mac, ip.clone()).bytes()
    }

    /// As redirected out of `lan0` to the client.
    fn to_client(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.client_mac, self.lan_mac, ip.clone()).bytes()
    }

    fn to_client2(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.client2_mac, self.lan_mac, ip.clone()).bytes()
    }

    /// Loads the object in the router namespace (DEVICES filled, CONFIG
    /// written when `cfg` is given) and runs `f` there.
    fn with_router<T: Send>(
        &self,
        cfg: Option<Config>,
        f: impl FnOnce(&mut Router) -> T + Send,
    ) -> T {
        let (lan, wan) = (self.lan, self.wan);
        self.t.in_ns(Ns::Router, move || {
            let mut r = Router::load(lan, wan);
            if let Some(c) = cfg {
                r.configure(&c);
            }
            f(&mut r)
        })
    }
}

fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass.
    let rc = unsafe { libc::clock_gettime(id, &raw mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    u64::try_from(ts.tv_sec).unwrap() * NS_PER_SEC + u64::try_from(ts.tv_nsec).unwrap()
}

/// `CLOCK_MONOTONIC` now: the clock of `last_seen_ns`.
fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// One `BPF_PROG_RUN`: verdict, output, counter changes, and a window of
/// `CLOCK_MONOTONIC` that contains the program's clock reading.
struct Run {
    verdict: u32,
    out: Vec<u8>,
    delta: Vec<(Counter, CounterValue)>,
    t0: u64,
    t1: u64,
}

/// The loaded object (see [`LoadedRouter`]) with this file's checks.
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
    fn load(lan: u32, wan: u32) -> Self {
        Self(LoadedRouter::load(lan, wan, CT_ENTRIES))
    }

    fn configure(&mut self, cfg: &Config) {
        self.config.set(0, cfg, 0).unwrap();
    }

    fn put(&mut self, k: FlowKey, e: FlowEntry) {
        self.conntrack.insert(k, e, 0).unwrap();
    }

    fn remove(&mut self, k: &FlowKey) {
        self.conntrack.remove(k).unwrap();
    }

    fn run(&self, frame: &[u8], ifindex: u32) -> Run {
        let t0 = clock_ns(libc::CLOCK_MONOTONIC_COARSE);
        let r = self.0.test_run(frame, ifindex);
        let t1 = now_ns();
        Run {
            verdict: r.verdict,
            out: r.out,
            delta: r.delta,
            t0,
            t1,
        }
    }

    /// Runs `frame` and asserts the verdict, the output bytes, and that
    /// exactly `counter` (+1 packet, +len bytes) and the `events` (+1 each)
    /// moved.
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
    ) -> Run {
        let size_before = self.flows().len();
        let run = self.run(frame, ifindex);
        let size_after = self.flows().len();
        let name = |v| match v {
            XDP_DROP => "XDP_DROP",
            XDP_PASS => "XDP_PASS",
            XDP_REDIRECT => "XDP_REDIRECT",
            _ => "other",
        };
        assert_eq!(
            run.verdict,
            verdict,
            "{what}: verdict {} ({}), expected {} ({}); counters moved: {:?}",
            run.verdict,
            name(run.verdict),
            verdict,
            name(verdict),
            run.delta
        );
        assert_bytes(what, &run.out, expect);
        assert!(!counter.is_event(), "{counter:?} is not a verdict counter");
        let len = frame.len() as u64;
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
    fn pass(&self, what: &str, frame: &[u8], ifindex: u32, counter: Counter) -> Run {
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
    ) -> Run {
        frames::verify_checksums(frame);
        let run = self.check(what, frame, ifindex, XDP_REDIRECT, expect, counter, events);
        frames::verify_checksums(&run.out);
        run
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
    fn stamp(&self, k: &FlowKey, run: &Run) -> u64 {
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
    fn seen(&self, k: &FlowKey, prev: u64, run: &Run) -> u64 {
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

/// `e` with the next-hop cache cleared, as a new entry has it.
fn without_hop(mut e: FlowEntry) -> FlowEntry {
    e.clear_next_hop();
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
        pad: [0; 2],
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
    /// `FLAG_PORT_FORWARD` or 0.
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
            extra: 0,
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

/// The SNAT port the spec's probing picks for `key` when `taken` ports
/// collide and `skip` ports have a port-forward rule; also the number of
/// collisions on the way.
fn probe(key: &FlowKey, min: u16, max: u16, taken: &[u16], skip: &[u16]) -> Option<(u16, usize)> {
    let sport = key.src_port;
    let h = flow_hash(key, SEED);
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

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// TCP: SYN masqueraded (port preserved, options and payload kept), reply
/// translated back, and the state machine visible in both entries: SYN ->
/// `SYN_SENT`, SYN+ACK -> ESTABLISHED, RST -> CLOSED, SYN again -> reopened;
/// FIN from each side -> `FIN_WAIT` -> CLOSED.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn tcp_snat_reply_and_state_transitions() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(tcp_key(CLIENT, 40000, SERVER, 80), 40000);

        let syn = Ipv4::new(
            CLIENT,
            SERVER,
            Tcp::new(40000, 80, TCP_SYN).options(&MSS).payload(b"x"),
        );
        let run = r.redirect(
            "SYN out",
            &env.client_sends(&syn),
            lan,
            &env.to_server(&snat(&syn, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts = r.stamp(&f.orig, &run);
        assert_eq!(
            r.stamp(&f.reply(), &run),
            ts,
            "both entries carry the same time"
        );
        r.assert_flows("after SYN", f.entries(FlowState::TcpSynSent, 0, ts, ts));

        // Retransmitted SYN: same translation, no new flow.
        let run = r.redirect(
            "SYN again",
            &env.client_sends(&syn),
            lan,
            &env.to_server(&snat(&syn, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows(
            "after SYN again",
            f.entries(FlowState::TcpSynSent, 0, ts, seen),
        );

        // A bare ACK from the server does not establish.
        let ack_in = Ipv4::new(SERVER, WAN, Tcp::new(80, 40000, TCP_ACK));
        let run = r.redirect(
            "bare ACK in",
            &env.server_sends(&ack_in),
            wan,
            &env.to_client(&dnat(&ack_in, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after bare ACK",
            f.entries(FlowState::TcpSynSent, 0, ts, seen),
        );

        let synack = Ipv4::new(
            SERVER,
            WAN,
            Tcp::new(80, 40000, TCP_SYN | TCP_ACK).options(&MSS),
        );
        let run = r.redirect(
            "SYN+ACK in",
            &env.server_sends(&synack),
            wan,
            &env.to_client(&dnat(&synack, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after SYN+ACK",
            f.entries(FlowState::TcpEstablished, 0, ts, seen),
        );

        let data = Ipv4::new(
            CLIENT,
            SERVER,
            Tcp::new(40000, 80, TCP_ACK | TCP_PSH).payload(b"GET / HTTP/1.0\r\n\r\n"),
        );
        let run = r.redirect(
            "data out",
            &env.client_sends(&data),
            lan,
            &env.to_server(&snat(&data, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after data",
            f.entries(FlowState::TcpEstablished, 0, ts, seen),
        );

        let rst = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_RST | TCP_ACK));
        let run = r.redirect(
            "RST out",
            &env.client_sends(&rst),
            lan,
            &env.to_server(&snat(&rst, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows("after RST", f.entries(FlowState::TcpClosed, 0, ts, seen));

        // A new SYN on the closed flow reopens it (same port).
        let run = r.redirect(
            "SYN reopens",
            &env.client_sends(&syn),
            lan,
            &env.to_server(&snat(&syn, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after reopen",
            f.entries(FlowState::TcpSynSent, 0, ts, seen),
        );

        // Second flow: FIN from both sides.
        let g = Flow::masq(tcp_key(CLIENT, 40001, SERVER, 80), 40001);
        let syn2 = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 80, TCP_SYN));
        let run = r.redirect(
            "SYN 2 out",
            &env.client_sends(&syn2),
            lan,
            &env.to_server(&snat(&syn2, 40001)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts2 = r.stamp(&g.orig, &run);
        let synack2 = Ipv4::new(SERVER, WAN, Tcp::new(80, 40001, TCP_SYN | TCP_ACK));
        let run = r.redirect(
            "SYN+ACK 2 in",
            &env.server_sends(&synack2),
            wan,
            &env.to_client(&dnat(&synack2, CLIENT, 40001)),
            Counter::FwdInbound,
            &[],
        );
        let seen2 = r.seen(&g.orig, ts2, &run);
        let fin_out = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 80, TCP_FIN | TCP_ACK));
        let run = r.redirect(
            "FIN out",
            &env.client_sends(&fin_out),
            lan,
            &env.to_server(&snat(&fin_out, 40001)),
            Counter::FwdOutbound,
            &[],
        );
        let seen2 = r.seen(&g.orig, seen2, &run);
        r.assert_flows(
            "after FIN out",
            f.entries(FlowState::TcpSynSent, 0, ts, seen)
                .into_iter()
                .chain(g.entries(FlowState::TcpFinWait, FLAG_FIN_ORIG, ts2, seen2)),
        );
        let fin_in = Ipv4::new(SERVER, WAN, Tcp::new(80, 40001, TCP_FIN | TCP_ACK));
        let run = r.redirect(
            "FIN in",
            &env.server_sends(&fin_in),
            wan,
            &env.to_client(&dnat(&fin_in, CLIENT, 40001)),
            Counter::FwdInbound,
            &[],
        );
        let seen2 = r.seen(&g.orig, seen2, &run);
        let both = FLAG_FIN_ORIG | FLAG_FIN_REPLY;
        // The last ACK still goes through the fast path; state stays CLOSED.
        let last_ack = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 80, TCP_ACK));
        let run = r.redirect(
            "last ACK out",
            &env.client_sends(&last_ack),
            lan,
            &env.to_server(&snat(&last_ack, 40001)),
            Counter::FwdOutbound,
            &[],
        );
        let seen2 = r.seen(&g.orig, seen2, &run);
        r.assert_flows(
            "after FIN in",
            f.entries(FlowState::TcpSynSent, 0, ts, seen)
                .into_iter()
                .chain(g.entries(FlowState::TcpClosed, both, ts2, seen2)),
        );
    });
}

/// UDP: masqueraded (port preserved; a port below the range remapped),
/// replies translated back, UNREPLIED -> REPLIED in both entries; a zero
/// UDP checksum stays zero both ways.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn udp_snat_reply_and_zero_checksum() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"odd-length query"));
        let run = r.redirect(
            "UDP out",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts = r.stamp(&f.orig, &run);
        r.assert_flows(
            "after UDP out",
            f.entries(FlowState::UdpUnreplied, 0, ts, ts),
        );

        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"answer"));
        let run = r.redirect(
            "UDP reply",
            &env.server_sends(&a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows("after reply", f.entries(FlowState::UdpReplied, 0, ts, seen));

        let run = r.redirect(
            "UDP out again",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);
        r.assert_flows(
            "after out again",
            f.entries(FlowState::UdpReplied, 0, ts, seen),
        );

        // No checksum: stays 0 (not recomputed, not 0xffff).
        let g = Flow::masq(udp_key(CLIENT, 40002, SERVER, 53), 40002);
        let q0 = Ipv4::new(
            CLIENT,
            SERVER,
            Udp::new(40002, 53, b"no checksum").no_checksum(),
        );
        let run = r.redirect(
            "UDP checksum 0 out",
            &env.client_sends(&q0),
            lan,
            &env.to_server(&snat(&q0, 40002)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        assert_eq!(
            &run.out[L4_OFF + 6..L4_OFF + 8],
            &[0, 0],
            "UDP checksum 0 stays 0"
        );
        let ts_g = r.stamp(&g.orig, &run);
        let a0 = Ipv4::new(
            SERVER,
            WAN,
            Udp::new(53, 40002, b"none either").no_checksum(),
        );
        let run = r.redirect(
            "UDP checksum 0 reply",
            &env.server_sends(&a0),
            wan,
            &env.to_client(&dnat(&a0, CLIENT, 40002)),
            Counter::FwdInbound,
            &[],
        );
        assert_eq!(
            &run.out[L4_OFF + 6..L4_OFF + 8],
            &[0, 0],
            "UDP checksum 0 stays 0"
        );
        let seen_g = r.seen(&g.orig, ts_g, &run);

        // Source port below the range: remapped into it, and back.
        let k = udp_key(CLIENT, 500, SERVER, 53);
        let (p, _) = probe(&k, PORT_MIN, PORT_MAX, &[40000, 40002], &[]).unwrap();
        assert!(p >= PORT_MIN);
        let h = Flow::masq(k, p);
        let q5 = Ipv4::new(CLIENT, SERVER, Udp::new(500, 53, b"low port"));
        let run = r.redirect(
            "UDP low port out",
            &env.client_sends(&q5),
            lan,
            &env.to_server(&snat(&q5, p)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_h = r.stamp(&h.orig, &run);
        let a5 = Ipv4::new(SERVER, WAN, Udp::new(53, p, b"low port answer"));
        let run = r.redirect(
            "UDP low port reply",
            &env.server_sends(&a5),
            wan,
            &env.to_client(&dnat(&a5, CLIENT, 500)),
            Counter::FwdInbound,
            &[],
        );
        let seen_h = r.seen(&h.orig, ts_h, &run);
        r.assert_flows(
            "end",
            f.entries(FlowState::UdpReplied, 0, ts, seen)
                .into_iter()
                .chain(g.entries(FlowState::UdpReplied, 0, ts_g, seen_g))
                .chain(h.entries(FlowState::UdpReplied, 0, ts_h, seen_h)),
        );
    });
}

/// Two LAN hosts with the same source port to the same server port: the
/// first keeps its port, the second collides and gets the next probe;
/// replies reach the right host. Same port with another protocol or
/// another destination port does not collide. LAN -> LAN is not translated.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn port_preservation_and_collision_two_lan_hosts() {
    let env = Env::new(true);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f1 = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let q1 = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"from client 1"));
        let run = r.redirect(
            "client 1 out",
            &env.client_sends(&q1),
            lan,
            &env.to_server(&snat(&q1, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts1 = r.stamp(&f1.orig, &run);

        let k2 = udp_key(CLIENT2, 40000, SERVER, 53);
        let (p2, collisions) = probe(&k2, PORT_MIN, PORT_MAX, &[40000], &[]).unwrap();
        assert_ne!(p2, 40000);
        assert!(collisions >= 1);
        let f2 = Flow::masq(k2, p2);
        let q2 = Ipv4::new(CLIENT2, SERVER, Udp::new(40000, 53, b"from client 2"));
        let mut events = vec![Counter::FlowNewMasquerade];
        events.extend(std::iter::repeat_n(Counter::PortCollision, collisions));
        let run = r.redirect(
            "client 2 out (collision)",
            &env.client2_sends(&q2),
            lan,
            &env.to_server(&snat(&q2, p2)),
            Counter::FwdOutbound,
            &events,
        );
        let ts2 = r.stamp(&f2.orig, &run);
        r.assert_flows(
            "two flows",
            f1.entries(FlowState::UdpUnreplied, 0, ts1, ts1)
                .into_iter()
                .chain(f2.entries(FlowState::UdpUnreplied, 0, ts2, ts2)),
        );

        let a1 = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"to client 1"));
        let run = r.redirect(
            "reply to client 1",
            &env.server_sends(&a1),
            wan,
            &env.to_client(&dnat(&a1, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen1 = r.seen(&f1.orig, ts1, &run);
        let a2 = Ipv4::new(SERVER, WAN, Udp::new(53, p2, b"to client 2"));
        let run = r.redirect(
            "reply to client 2",
            &env.server_sends(&a2),
            wan,
            &env.to_client2(&dnat(&a2, CLIENT2, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen2 = r.seen(&f2.orig, ts2, &run);

        // Same source port, TCP: its own port space, preserved.
        let f3 = Flow::masq(tcp_key(CLIENT2, 40000, SERVER, 53), 40000);
        let s3 = Ipv4::new(CLIENT2, SERVER, Tcp::new(40000, 53, TCP_SYN));
        let run = r.redirect(
            "client 2 TCP out",
            &env.client2_sends(&s3),
            lan,
            &env.to_server(&snat(&s3, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts3 = r.stamp(&f3.orig, &run);
        // Same source port, other destination port: a different reply key.
        let f4 = Flow::masq(udp_key(CLIENT2, 40000, SERVER, 54), 40000);
        let q4 = Ipv4::new(CLIENT2, SERVER, Udp::new(40000, 54, b"other dport"));
        let run = r.redirect(
            "client 2 other dport",
            &env.client2_sends(&q4),
            lan,
            &env.to_server(&snat(&q4, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts4 = r.stamp(&f4.orig, &run);

        // LAN -> LAN through the router: the FIB egress is not the WAN.
        let l2l = Ipv4::new(CLIENT, CLIENT2, Udp::new(40000, 9, b"lan to lan"));
        r.pass(
            "LAN -> LAN",
            &env.client_sends(&l2l),
            lan,
            Counter::PassNoFlow,
        );
        let l2l_tcp = Ipv4::new(CLIENT, CLIENT2, Tcp::new(40005, 22, TCP_SYN));
        r.pass(
            "LAN -> LAN SYN",
            &env.client_sends(&l2l_tcp),
            lan,
            Counter::PassNoFlow,
        );

        r.assert_flows(
            "end",
            f1.entries(FlowState::UdpReplied, 0, ts1, seen1)
                .into_iter()
                .chain(f2.entries(FlowState::UdpReplied, 0, ts2, seen2))
                .chain(f3.entries(FlowState::TcpSynSent, 0, ts3, ts3))
                .chain(f4.entries(FlowState::UdpUnreplied, 0, ts4, ts4)),
        );
    });
}

/// ICMP echo: the identifier is the port (preserved in range, remapped
/// below it), echo replies translated back, unknown identifiers passed.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn icmp_echo_translation() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let k = icmp_key(CLIENT, SERVER, 7);
        let (p, _) = probe(&k, PORT_MIN, PORT_MAX, &[], &[]).unwrap();
        assert_ne!(p, 7);
        let f = Flow::masq(k, p);
        let req = Ipv4::new(
            CLIENT,
            SERVER,
            Icmp::echo_request(7, 1, b"ping payload 0123"),
        );
        let run = r.redirect(
            "echo request (id 7)",
            &env.client_sends(&req),
            lan,
            &env.to_server(&snat(&req, p)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts = r.stamp(&f.orig, &run);
        r.assert_flows("after request", f.entries(FlowState::Icmp, 0, ts, ts));

        let rep = Ipv4::new(SERVER, WAN, Icmp::echo_reply(p, 1, b"ping payload 0123"));
        let run = r.redirect(
            "echo reply",
            &env.server_sends(&rep),
            wan,
            &env.to_client(&dnat(&rep, CLIENT, 7)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);

        let req2 = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(7, 2, b"second"));
        let run = r.redirect(
            "echo request 2",
            &env.client_sends(&req2),
            lan,
            &env.to_server(&snat(&req2, p)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);

        // Identifier inside the range: preserved.
        let g = Flow::masq(icmp_key(CLIENT, SERVER, 4321), 4321);
        let req3 = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(4321, 9, b""));
        let run = r.redirect(
            "echo request (id 4321)",
            &env.client_sends(&req3),
            lan,
            &env.to_server(&snat(&req3, 4321)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_g = r.stamp(&g.orig, &run);
        let rep3 = Ipv4::new(SERVER, WAN, Icmp::echo_reply(4321, 9, b""));
        let run = r.redirect(
            "echo reply (id 4321)",
            &env.server_sends(&rep3),
            wan,
            &env.to_client(&dnat(&rep3, CLIENT, 4321)),
            Counter::FwdInbound,
            &[],
        );
        let seen_g = r.seen(&g.orig, ts_g, &run);

        let unknown = Ipv4::new(SERVER, WAN, Icmp::echo_reply(999, 1, b"?"));
        r.pass(
            "echo reply, unknown id",
            &env.server_sends(&unknown),
            wan,
            Counter::PassUnsolicited,
        );
        r.assert_flows(
            "end",
            f.entries(FlowState::Icmp, 0, ts, seen)
                .into_iter()
                .chain(g.entries(FlowState::Icmp, 0, ts_g, seen_g)),
        );
    });
}

/// ICMP errors from the WAN about masqueraded UDP, TCP and echo flows:
/// outer destination, embedded source address and port (echo id) and all
/// checksums (outer IP, ICMP, embedded IP, embedded L4 when present)
/// translated; errors about unknown flows or with an unusable embedded
/// header passed untouched.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn icmp_errors_with_embedded_headers() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        // Flows: UDP from port 500 (remapped to pu), TCP 40000 (kept), echo id 7 (-> pe).
        let ku = udp_key(CLIENT, 500, SERVER, 53);
        let (pu, _) = probe(&ku, PORT_MIN, PORT_MAX, &[], &[]).unwrap();
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(500, 53, b"query"));
        r.redirect(
            "UDP out",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, pu)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let s = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN).options(&MSS));
        r.redirect(
            "SYN out",
            &env.client_sends(&s),
            lan,
            &env.to_server(&snat(&s, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ke = icmp_key(CLIENT, SERVER, 7);
        let (pe, _) = probe(&ke, PORT_MIN, PORT_MAX, &[], &[]).unwrap();
        let e = Ipv4::new(CLIENT, SERVER, Icmp::echo_request(7, 1, b"ttl test"));
        r.redirect(
            "echo out",
            &env.client_sends(&e),
            lan,
            &env.to_server(&snat(&e, pe)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let flows = r.flows();
        assert_eq!(flows.len(), 6);

        // What the server got (after the router) and quotes back; and what
        // the client must see quoted (its own packet, TTL as quoted).
        let udp_wan = snat(&q, pu);
        let udp_lan = Ipv4 {
            src: CLIENT,
            ..snat(&q, 500)
        };
        let tcp_wan = snat(&s, 40000);
        let tcp_lan = Ipv4 {
            src: CLIENT,
            ..tcp_wan.clone()
        };
        let echo_wan = snat(&e, pe);
        let echo_lan = Ipv4 {
            src: CLIENT,
            ..snat(&e, 7)
        };
        let udp0_wan = Ipv4::new(WAN, SERVER, Udp::new(pu, 53, b"query").no_checksum()).ttl(63);
        let udp0_lan = Ipv4::new(CLIENT, SERVER, Udp::new(500, 53, b"query").no_checksum()).ttl(63);

        let err = |t: u8, c: u8, quoted: &[u8], dst: [u8; 4]| {
            let mut ip = Ipv4::new(SERVER, dst, Icmp::error(t, c, quoted));
            if dst == CLIENT {
                ip.ttl -= 1;
            }
            ip
        };
        let cases: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
            (
                "port unreachable, whole UDP quoted",
                udp_wan.bytes(),
                udp_lan.bytes(),
            ),
            ("UDP checksum 0 quoted", udp0_wan.bytes(), udp0_lan.bytes()),
            ("TCP quoted whole", tcp_wan.bytes(), tcp_lan.bytes()),
            (
                "TCP quoted 28 bytes",
                tcp_wan.bytes()[..28].to_vec(),
                tcp_lan.bytes()[..28].to_vec(),
            ),
            ("echo quoted whole", echo_wan.bytes(), echo_lan.bytes()),
        ];
        for (what, wan_q, lan_q) in &cases {
            for (t, c) in [
                (ICMP_DEST_UNREACH, 3),
                (ICMP_TIME_EXCEEDED, 0),
                (ICMP_PARAMETER_PROBLEM, 0),
            ] {
                let input = err(t, c, wan_q, WAN);
                let want = err(t, c, lan_q, CLIENT);
                let what = format!("ICMP {t}/{c}: {what}");
                r.redirect(
                    &what,
                    &env.server_sends(&input),
                    wan,
                    &env.to_client(&want),
                    Counter::FwdInbound,
                    &[Counter::IcmpErrorTranslated],
                );
            }
        }
        // Fragmentation needed with the next-hop MTU in the rest field.
        let mut input = err(ICMP_DEST_UNREACH, 4, &tcp_wan.bytes()[..28], WAN);
        let mut want = err(ICMP_DEST_UNREACH, 4, &tcp_lan.bytes()[..28], CLIENT);
        for ip in [&mut input, &mut want] {
            if let L4::Icmp(Icmp::Other { rest, .. }) = &mut ip.l4 {
                *rest = [0, 0, 0x05, 0x00];
            }
        }
        r.redirect(
            "frag needed, TCP quoted 28 bytes",
            &env.server_sends(&input),
            wan,
            &env.to_client(&want),
            Counter::FwdInbound,
            &[Counter::IcmpErrorTranslated],
        );
        // 28 bytes quoted, then Ethernet padding where the embedded TCP
        // checksum would be: beyond the outer total length, left alone.
        let mut fin = env.server_sends(&err(ICMP_DEST_UNREACH, 13, &tcp_wan.bytes()[..28], WAN));
        let mut fout = env.to_client(&err(ICMP_DEST_UNREACH, 13, &tcp_lan.bytes()[..28], CLIENT));
        fin.extend_from_slice(&[0xa5; 16]);
        fout.extend_from_slice(&[0xa5; 16]);
        r.redirect(
            "TCP quoted 28 bytes + padding",
            &fin,
            wan,
            &fout,
            Counter::FwdInbound,
            &[Counter::IcmpErrorTranslated],
        );
        assert_eq!(r.flows(), flows, "ICMP errors leave the flows as they were");

        // Not translatable: passed untouched.
        let unknown = Ipv4::new(WAN, SERVER, Udp::new(1111, 53, b"not ours")).ttl(63);
        let e1 = err(ICMP_DEST_UNREACH, 3, &unknown.bytes(), WAN);
        r.pass(
            "error about unknown flow",
            &env.server_sends(&e1),
            wan,
            Counter::PassUnsolicited,
        );
        let mut opts = udp_wan.clone();
        opts.options = vec![1, 1, 1, 0];
        let e2 = err(ICMP_DEST_UNREACH, 3, &opts.bytes(), WAN);
        r.pass(
            "embedded IHL 6",
            &env.server_sends(&e2),
            wan,
            Counter::PassUnsolicited,
        );
        let e3 = err(ICMP_DEST_UNREACH, 3, &udp_wan.bytes()[..20], WAN);
        r.pass(
            "embedded L4 missing",
            &env.server_sends(&e3),
            wan,
            Counter::PassUnsolicited,
        );
        let e4 = err(ICMP_DEST_UNREACH, 3, &udp_wan.bytes()[..26], WAN);
        r.pass(
            "embedded L4 cut short",
            &env.server_sends(&e4),
            wan,
            Counter::PassUnsolicited,
        );
        let e5 = err(ICMP_DEST_UNREACH, 3, &udp_wan.bytes()[..12], WAN);
        r.pass(
            "embedded IPv4 cut short",
            &env.server_sends(&e5),
            wan,
            Counter::PassUnsolicited,
        );
        let e6 = err(ICMP_DEST_UNREACH, 3, &[], WAN);
        r.pass(
            "nothing embedded",
            &env.server_sends(&e6),
            wan,
            Counter::PassUnsolicited,
        );
        let reply_q = Ipv4::new(WAN, SERVER, Icmp::echo_reply(pe, 1, b"")).ttl(63);
        let e7 = err(ICMP_TIME_EXCEEDED, 0, &reply_q.bytes(), WAN);
        r.pass(
            "embedded echo reply",
            &env.server_sends(&e7),
            wan,
            Counter::PassUnsolicited,
        );
        let gre = Ipv4::new(
            WAN,
            SERVER,
            L4::Raw {
                proto: 47,
                bytes: vec![0; 8],
            },
        )
        .ttl(63);
        let e8 = err(ICMP_DEST_UNREACH, 2, &gre.bytes(), WAN);
        r.pass(
            "embedded GRE",
            &env.server_sends(&e8),
            wan,
            Counter::PassUnsolicited,
        );
        // From the LAN, errors are the kernel's business.
        let from_lan = Ipv4::new(
            CLIENT,
            SERVER,
            Icmp::error(ICMP_DEST_UNREACH, 3, &udp_lan.bytes()),
        );
        r.pass(
            "ICMP error from the LAN",
            &env.client_sends(&from_lan),
            lan,
            Counter::PassProtocol,
        );
        assert_eq!(
            r.flows(),
            flows,
            "passed errors leave the flows as they were"
        );
    });
}

/// Port forwarding: a WAN SYN / UDP datagram to a forwarded port creates a
/// flow to the LAN target; the LAN answer goes out from the forwarded port.
/// Non-SYN segments and the other protocol do not open flows. Masquerading
/// skips ports with a rule for the same protocol.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn port_forward_rules() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        r.forward(IPPROTO_TCP, 8080, CLIENT, 80);
        r.forward(IPPROTO_UDP, 5353, CLIENT, 53);
        r.forward(IPPROTO_TCP, 40000, CLIENT, 22);

        let f = Flow::forward(tcp_key(SERVER, 5555, WAN, 8080), CLIENT, 80);
        let syn = Ipv4::new(SERVER, WAN, Tcp::new(5555, 8080, TCP_SYN).options(&MSS));
        let run = r.redirect(
            "SYN to forwarded port",
            &env.server_sends(&syn),
            wan,
            &env.to_client(&dnat(&syn, CLIENT, 80)),
            Counter::FwdInbound,
            &[Counter::FlowNewPortForward],
        );
        let ts = r.stamp(&f.orig, &run);
        r.assert_flows("after SYN", f.entries(FlowState::TcpSynSent, 0, ts, ts));

        let synack = Ipv4::new(
            CLIENT,
            SERVER,
            Tcp::new(80, 5555, TCP_SYN | TCP_ACK).options(&MSS),
        );
        let run = r.redirect(
            "SYN+ACK from the LAN target",
            &env.client_sends(&synack),
            lan,
            &env.to_server(&snat(&synack, 8080)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows(
            "after SYN+ACK",
            f.entries(FlowState::TcpEstablished, 0, ts, seen),
        );
        let ack = Ipv4::new(SERVER, WAN, Tcp::new(5555, 8080, TCP_ACK).payload(b"hello"));
        let run = r.redirect(
            "ACK to forwarded port",
            &env.server_sends(&ack),
            wan,
            &env.to_client(&dnat(&ack, CLIENT, 80)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, seen, &run);

        let stray = Ipv4::new(SERVER, WAN, Tcp::new(5556, 8080, TCP_ACK));
        r.pass(
            "ACK without flow to a rule",
            &env.server_sends(&stray),
            wan,
            Counter::PassUnsolicited,
        );
        let stray = Ipv4::new(SERVER, WAN, Tcp::new(5556, 8080, TCP_SYN | TCP_ACK));
        r.pass(
            "SYN+ACK to a rule",
            &env.server_sends(&stray),
            wan,
            Counter::PassUnsolicited,
        );
        let udp_tcp_rule = Ipv4::new(SERVER, WAN, Udp::new(5555, 8080, b"wrong proto"));
        r.pass(
            "UDP to a TCP rule",
            &env.server_sends(&udp_tcp_rule),
            wan,
            Counter::PassUnsolicited,
        );
        let tcp_udp_rule = Ipv4::new(SERVER, WAN, Tcp::new(5555, 5353, TCP_SYN));
        r.pass(
            "SYN to a UDP rule",
            &env.server_sends(&tcp_udp_rule),
            wan,
            Counter::PassUnsolicited,
        );
        let other_dst = Ipv4::new(SERVER, CLIENT, Tcp::new(5555, 8080, TCP_SYN));
        r.pass(
            "SYN to rule port, not WAN addr",
            &env.server_sends(&other_dst),
            wan,
            Counter::PassUnsolicited,
        );

        let g = Flow::forward(udp_key(SERVER, 6000, WAN, 5353), CLIENT, 53);
        let u = Ipv4::new(SERVER, WAN, Udp::new(6000, 5353, b"udp forwarded"));
        let run = r.redirect(
            "UDP to forwarded port",
            &env.server_sends(&u),
            wan,
            &env.to_client(&dnat(&u, CLIENT, 53)),
            Counter::FwdInbound,
            &[Counter::FlowNewPortForward],
        );
        let ts_g = r.stamp(&g.orig, &run);
        let ua = Ipv4::new(CLIENT, SERVER, Udp::new(53, 6000, b"udp answer"));
        let run = r.redirect(
            "UDP answer from the LAN target",
            &env.client_sends(&ua),
            lan,
            &env.to_server(&snat(&ua, 5353)),
            Counter::FwdOutbound,
            &[],
        );
        let seen_g = r.seen(&g.orig, ts_g, &run);

        // SNAT skips TCP ports 8080 and 40000 (rules) but not for UDP.
        let kt = tcp_key(CLIENT, 40000, SERVER, 80);
        let (pt, collisions) = probe(&kt, PORT_MIN, PORT_MAX, &[], &[8080, 40000]).unwrap();
        assert_eq!(collisions, 0);
        assert_ne!(pt, 40000);
        let h = Flow::masq(kt, pt);
        let s = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN));
        let run = r.redirect(
            "SYN from a port that has a TCP rule",
            &env.client_sends(&s),
            lan,
            &env.to_server(&snat(&s, pt)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_h = r.stamp(&h.orig, &run);
        let i = Flow::masq(udp_key(CLIENT, 40000, SERVER, 80), 40000);
        let uq = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 80, b"udp keeps its port"));
        let run = r.redirect(
            "UDP from a port that has a TCP rule",
            &env.client_sends(&uq),
            lan,
            &env.to_server(&snat(&uq, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_i = r.stamp(&i.orig, &run);
        r.assert_flows(
            "end",
            f.entries(FlowState::TcpEstablished, 0, ts, seen)
                .into_iter()
                .chain(g.entries(FlowState::UdpReplied, 0, ts_g, seen_g))
                .chain(h.entries(FlowState::TcpSynSent, 0, ts_h, ts_h))
                .chain(i.entries(FlowState::UdpUnreplied, 0, ts_i, ts_i)),
        );
    });
}

/// WAN packets of no flow and no rule go to the kernel untouched and
/// create nothing.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn unsolicited_wan_packets_pass_untouched() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let wan = r.wan;
        let cases: Vec<(&str, Ipv4, Counter)> = vec![
            (
                "UDP to WAN",
                Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"?")),
                Counter::PassUnsolicited,
            ),
            (
                "SYN to WAN",
                Ipv4::new(SERVER, WAN, Tcp::new(5555, 22, TCP_SYN)),
                Counter::PassUnsolicited,
            ),
            (
                "ACK to WAN",
                Ipv4::new(SERVER, WAN, Tcp::new(5555, 22, TCP_ACK)),
                Counter::PassUnsolicited,
            ),
            (
                "echo reply to WAN",
                Ipv4::new(SERVER, WAN, Icmp::echo_reply(99, 1, b"")),
                Counter::PassUnsolicited,
            ),
            (
                "UDP to a LAN address",
                Ipv4::new(SERVER, CLIENT, Udp::new(53, 40000, b"?")),
                Counter::PassUnsolicited,
            ),
            (
                "SYN to a LAN address",
                Ipv4::new(SERVER, CLIENT, Tcp::new(5555, 22, TCP_SYN)),
                Counter::PassUnsolicited,
            ),
            (
                "echo request to WAN",
                Ipv4::new(SERVER, WAN, Icmp::echo_request(99, 1, b"")),
                Counter::PassProtocol,
            ),
            (
                "echo request to a LAN address",
                Ipv4::new(SERVER, CLIENT, Icmp::echo_request(99, 1, b"")),
                Counter::PassProtocol,
            ),
        ];
        for (what, ip, counter) in cases {
            r.pass(what, &env.server_sends(&ip), wan, counter);
        }
        r.assert_flows("nothing created", []);
    });
}

/// Malformed frames are dropped (both sides) with the right counter.
/// (Frames shorter than 14 bytes cannot be run: `BPF_PROG_RUN` rejects
/// them.)
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn malformed_frames_are_dropped() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        for (side, ifindex) in [("LAN", r.lan), ("WAN", r.wan)] {
            let mk = |l4: L4| -> Vec<u8> {
                let ip = Ipv4::new(CLIENT, SERVER, l4);
                if ifindex == r.lan {
                    env.client_sends(&ip)
                } else {
                    env.server_sends(&ip)
                }
            };
            let udp = mk(Udp::new(40000, 53, b"payload").into());
            let tcp = mk(Tcp::new(40000, 80, TCP_SYN).payload(b"12345678").into());
            let icmp = mk(Icmp::echo_request(7, 1, b"").into());

            for len in ETH_AND_NOTHING..L4_OFF {
                r.drop_frame(
                    &format!("{side}: truncated to {len}"),
                    &udp[..len],
                    ifindex,
                    Counter::DropTruncated,
                );
            }
            let patched = |base: &[u8], f: &dyn Fn(&mut Vec<u8>)| {
                let mut v = base.to_vec();
                f(&mut v);
                fix_ipv4_checksum_any(&mut v);
                v
            };
            let set_total = |v: &mut Vec<u8>, t: usize| {
                v[IP_OFF + 2..IP_OFF + 4].copy_from_slice(&u16::try_from(t).unwrap().to_be_bytes());
            };
            let l3 = udp.len() - IP_OFF;
            let cases: Vec<(&str, Vec<u8>)> = vec![
                ("IHL 4", patched(&udp, &|v| v[IP_OFF] = 0x44)),
                ("IHL 0", patched(&udp, &|v| v[IP_OFF] = 0x40)),
                ("version 6", patched(&udp, &|v| v[IP_OFF] = 0x65)),
                ("version 0", patched(&udp, &|v| v[IP_OFF] = 0x05)),
                (
                    "total length beyond the frame",
                    patched(&udp, &|v| set_total(v, l3 + 1)),
                ),
                ("total length 1000", patched(&udp, &|v| set_total(v, 1000))),
                ("total length 19", patched(&udp, &|v| set_total(v, 19))),
                ("total length 0", patched(&udp, &|v| set_total(v, 0))),
                ("IHL 6 > total length 22", {
                    let mut v = udp[..IP_OFF + 20].to_vec();
                    v.extend_from_slice(&[1, 1, 1, 0]);
                    v[IP_OFF] = 0x46;
                    set_total(&mut v, 22);
                    fix_ipv4_checksum_any(&mut v);
                    v
                }),
                (
                    "TCP data offset 4",
                    patched(&tcp, &|v| v[L4_OFF + 12] = 0x40),
                ),
                (
                    "TCP data offset 0",
                    patched(&tcp, &|v| v[L4_OFF + 12] = 0x00),
                ),
                (
                    "TCP data offset 15 > segment",
                    patched(&tcp, &|v| v[L4_OFF + 12] = 0xf0),
                ),
                (
                    "TCP data offset 8 > segment of 28",
                    patched(&tcp, &|v| v[L4_OFF + 12] = 0x80),
                ),
                ("TCP header cut (19 bytes)", {
                    let mut v = tcp[..L4_OFF + 19].to_vec();
                    set_total(&mut v, 39);
                    fix_ipv4_checksum_any(&mut v);
                    v
                }),
                ("TCP header beyond total length (padding)", {
                    let mut v = tcp[..L4_OFF + 20].to_vec();
                    set_total(&mut v, 30);
                    fix_ipv4_checksum_any(&mut v);
                    v
                }),
                ("UDP header cut (7 bytes)", {
                    let mut v = udp[..L4_OFF + 7].to_vec();
                    set_total(&mut v, 27);
                    fix_ipv4_checksum_any(&mut v);
                    v
                }),
                (
                    "UDP header beyond total length",
                    patched(&udp, &|v| set_total(v, 24)),
                ),
                ("ICMP header cut (7 bytes)", {
                    let mut v = icmp[..L4_OFF + 7].to_vec();
                    set_total(&mut v, 27);
                    fix_ipv4_checksum_any(&mut v);
                    v
                }),
                (
                    "ICMP header beyond total length",
                    patched(&icmp, &|v| set_total(v, 24)),
                ),
            ];
            for (what, frame) in &cases {
                r.drop_frame(
                    &format!("{side}: {what}"),
                    frame,
                    ifindex,
                    Counter::DropMalformed,
                );
            }
        }
        r.assert_flows("nothing created", []);
    });
}

const ETH_AND_NOTHING: usize = frames::ETH_HLEN;

/// [`fix_ipv4_checksum`] that tolerates an IHL pointing past the frame.
fn fix_ipv4_checksum_any(v: &mut [u8]) {
    let ihl = usize::from(v[IP_OFF] & 0x0f) * 4;
    if ihl >= 20 && IP_OFF + ihl <= v.len() {
        fix_ipv4_checksum(v);
    }
}

/// TTL <= 1, fragments, IP options, non-IPv4 frames and protocols the fast
/// path does not handle: passed untouched, in the spec's order of checks,
/// without touching flows.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn pass_cases_ttl_fragments_options_protocols() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        // A flow, so that replies below would hit it if they got that far.
        let f = Flow::masq(tcp_key(CLIENT, 40000, SERVER, 80), 40000);
        let syn = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN));
        let run = r.redirect(
            "SYN out",
            &env.client_sends(&syn),
            lan,
            &env.to_server(&snat(&syn, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts = r.stamp(&f.orig, &run);
        let synack = Ipv4::new(SERVER, WAN, Tcp::new(80, 40000, TCP_SYN | TCP_ACK));
        let data_out = Ipv4::new(
            CLIENT,
            SERVER,
            Tcp::new(40000, 80, TCP_ACK).payload(b"data"),
        );

        for (side, ifindex, base) in [("LAN", lan, &data_out), ("WAN", wan, &synack)] {
            let frame = |ip: &Ipv4| {
                if ifindex == lan {
                    env.client_sends(ip)
                } else {
                    env.server_sends(ip)
                }
            };
            let with = |g: &dyn Fn(&mut Ipv4)| {
                let mut ip = base.clone();
                g(&mut ip);
                frame(&ip)
            };
            let cases: Vec<(&str, Vec<u8>, Counter)> = vec![
                ("TTL 1", with(&|ip| ip.ttl = 1), Counter::PassTtlExceeded),
                ("TTL 0", with(&|ip| ip.ttl = 0), Counter::PassTtlExceeded),
                ("MF", with(&|ip| ip.frag = IP_MF), Counter::PassFragment),
                (
                    "MF + DF",
                    with(&|ip| ip.frag = IP_MF | IP_DF),
                    Counter::PassFragment,
                ),
                ("offset 1", with(&|ip| ip.frag = 1), Counter::PassFragment),
                (
                    "offset 0x1fff",
                    with(&|ip| ip.frag = 0x1fff),
                    Counter::PassFragment,
                ),
                (
                    "MF + offset 0xb9",
                    with(&|ip| ip.frag = IP_MF | 0xb9),
                    Counter::PassFragment,
                ),
                (
                    "options (IHL 6)",
                    with(&|ip| ip.options = vec![1, 1, 1, 0]),
                    Counter::PassIpOptions,
                ),
                (
                    "options (IHL 15)",
                    with(&|ip| ip.options = [[1u8, 1, 1, 1]; 10].concat()),
                    Counter::PassIpOptions,
                ),
                (
                    "options + MF",
                    with(&|ip| {
                        ip.options = vec![1, 1, 1, 0];
                        ip.frag = IP_MF;
                    }),
                    Counter::PassIpOptions,
                ),
                (
                    "options + TTL 1",
                    with(&|ip| {
                        ip.options = vec![1, 1, 1, 0];
                        ip.ttl = 1;
                    }),
                    Counter::PassIpOptions,
                ),
                (
                    "fragment + TTL 1",
                    with(&|ip| {
                        ip.frag = 8;
                        ip.ttl = 1;
                    }),
                    Counter::PassFragment,
                ),
                (
                    "GRE",
                    frame(&Ipv4::new(
                        base.src,
                        base.dst,
                        L4::Raw {
                            proto: 47,
                            bytes: vec![0; 24],
                        },
                    )),
                    Counter::PassProtocol,
                ),
                (
                    "SCTP",
                    frame(&Ipv4::new(
                        base.src,
                        base.dst,
                        L4::Raw {
                            proto: 132,
                            bytes: vec![7; 32],
                        },
                    )),
                    Counter::PassProtocol,
                ),
                (
                    "ICMP timestamp",
                    frame(&Ipv4::new(
                        base.src,
                        base.dst,
                        Icmp::Other {
                            icmp_type: 13,
                            code: 0,
                            rest: [0, 1, 0, 1],
                            body: vec![0; 12],
                        },
                    )),
                    Counter::PassProtocol,
                ),
            ];
            for (what, f, counter) in &cases {
                r.pass(&format!("{side}: {what}"), f, ifindex, *counter);
            }
            // IHL 4 with TTL 1: malformed wins.
            let mut bad = with(&|ip| ip.ttl = 1);
            bad[IP_OFF] = 0x44;
            r.drop_frame(
                &format!("{side}: IHL 4 + TTL 1"),
                &bad,
                ifindex,
                Counter::DropMalformed,
            );
            // Not IPv4.
            let ok = frame(base);
            for (what, ethertype) in [
                ("ARP", [0x08, 0x06]),
                ("IPv6", [0x86, 0xdd]),
                ("VLAN", [0x81, 0x00]),
            ] {
                let mut v = ok.clone();
                v[12..14].copy_from_slice(&ethertype);
                r.pass(
                    &format!("{side}: {what}"),
                    &v,
                    ifindex,
                    Counter::PassNotIpv4,
                );
                r.pass(
                    &format!("{side}: {what}, 14 bytes"),
                    &v[..14],
                    ifindex,
                    Counter::PassNotIpv4,
                );
            }
        }
        // ICMP the LAN side does not translate.
        for (what, icmp) in [
            ("echo reply", Icmp::echo_reply(7, 1, b"")),
            (
                "redirect",
                Icmp::Other {
                    icmp_type: 5,
                    code: 1,
                    rest: WAN,
                    body: vec![0; 28],
                },
            ),
        ] {
            let ip = Ipv4::new(CLIENT, SERVER, icmp);
            r.pass(
                &format!("LAN: ICMP {what}"),
                &env.client_sends(&ip),
                lan,
                Counter::PassProtocol,
            );
        }
        let ip = Ipv4::new(
            SERVER,
            WAN,
            Icmp::Other {
                icmp_type: 5,
                code: 1,
                rest: WAN,
                body: vec![0; 28],
            },
        );
        r.pass(
            "WAN: ICMP redirect",
            &env.server_sends(&ip),
            wan,
            Counter::PassProtocol,
        );
        // The SYN+ACK with TTL 1 did not establish the flow.
        r.assert_flows(
            "flow untouched",
            f.entries(FlowState::TcpSynSent, 0, ts, ts),
        );
    });
}

/// Without CONFIG every valid IPv4 packet passes (IPv4 checks still
/// first, L4 checks after); with CONFIG, ingress on another interface
/// passes as not configured.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn not_configured_passes() {
    let env = Env::new(false);
    env.with_router(None, |r| {
        let lan = r.lan;
        let udp = env.client_sends(&Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"x")));
        r.pass("unconfigured: UDP", &udp, lan, Counter::PassNotConfigured);
        let mut doff = env.client_sends(&Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN)));
        doff[L4_OFF + 12] = 0x40;
        r.pass(
            "unconfigured: TCP data offset 4",
            &doff,
            lan,
            Counter::PassNotConfigured,
        );
        let mut bad = udp.clone();
        bad[IP_OFF] = 0x44;
        r.drop_frame("unconfigured: IHL 4", &bad, lan, Counter::DropMalformed);
        let ttl1 = env.client_sends(&Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"x")).ttl(1));
        r.pass("unconfigured: TTL 1", &ttl1, lan, Counter::PassTtlExceeded);
        r.drop_frame(
            "unconfigured: truncated",
            &udp[..30],
            lan,
            Counter::DropTruncated,
        );
        r.assert_flows("nothing created", []);

        r.configure(&env.config());
        // ifindex 1 = lo in the router namespace: neither LAN nor WAN.
        r.pass("ingress lo", &udp, 1, Counter::PassNotConfigured);
        let ip = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"x"));
        r.redirect(
            "configured: UDP",
            &udp,
            lan,
            &env.to_server(&snat(&ip, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
    });
}

/// Packets to the router's own addresses go to the kernel
/// (`PassFibNotForwarded`); TCP without a plain SYN and no flow gets
/// `PassNoFlow`; neither creates entries.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn local_destination_and_tcp_without_flow() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let lan = r.lan;
        let cases: Vec<(&str, Ipv4, Counter)> = vec![
            (
                "UDP to router LAN address",
                Ipv4::new(CLIENT, ROUTER_LAN, Udp::new(40000, 53, b"dns?")),
                Counter::PassFibNotForwarded,
            ),
            (
                "SYN to router LAN address",
                Ipv4::new(CLIENT, ROUTER_LAN, Tcp::new(40000, 22, TCP_SYN)),
                Counter::PassFibNotForwarded,
            ),
            (
                "echo to router LAN address",
                Ipv4::new(CLIENT, ROUTER_LAN, Icmp::echo_request(7, 1, b"")),
                Counter::PassFibNotForwarded,
            ),
            (
                "UDP to router WAN address",
                Ipv4::new(CLIENT, WAN, Udp::new(40000, 53, b"dns?")),
                Counter::PassFibNotForwarded,
            ),
            (
                "ACK, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_ACK)),
                Counter::PassNoFlow,
            ),
            (
                "SYN+ACK, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN | TCP_ACK)),
                Counter::PassNoFlow,
            ),
            (
                "RST, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_RST)),
                Counter::PassNoFlow,
            ),
            (
                "FIN+ACK, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_FIN | TCP_ACK)),
                Counter::PassNoFlow,
            ),
            (
                "SYN+RST, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN | TCP_RST)),
                Counter::PassNoFlow,
            ),
            (
                "SYN+FIN, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN | TCP_FIN)),
                Counter::PassNoFlow,
            ),
            (
                "no flags, no flow",
                Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, 0)),
                Counter::PassNoFlow,
            ),
        ];
        for (what, ip, counter) in cases {
            r.pass(what, &env.client_sends(&ip), lan, counter);
        }
        r.assert_flows("nothing created", []);
    });
}

/// An entry idle past its timeout is a miss: a reply to it is unsolicited,
/// and a new LAN flow replaces it (`FlowExpiredReplaced`), also when the
/// stale flow belonged to another LAN host.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn expired_entry_is_a_miss_and_is_replaced() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let now = now_ns();
        let timeout = u64::from(Timeouts::default().udp_unreplied) * NS_PER_SEC;
        let old = now.saturating_sub(3600 * NS_PER_SEC);
        assert!(
            now - old > timeout + NS_PER_SEC,
            "uptime too short for an expired entry"
        );

        // Same LAN host and port.
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        for (k, e) in f.entries(FlowState::UdpUnreplied, 0, old, old) {
            r.put(k, e);
        }
        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"late answer"));
        r.pass(
            "reply to an expired flow",
            &env.server_sends(&a),
            wan,
            Counter::PassUnsolicited,
        );
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"new query"));
        let run = r.redirect(
            "new flow over the expired one",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade, Counter::FlowExpiredReplaced],
        );
        let ts = r.stamp(&f.orig, &run);
        assert_eq!(r.stamp(&f.reply(), &run), ts);
        r.assert_flows("replaced", f.entries(FlowState::UdpUnreplied, 0, ts, ts));
        let run = r.redirect(
            "reply to the new flow",
            &env.server_sends(&a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let seen = r.seen(&f.orig, ts, &run);
        r.assert_flows("replied", f.entries(FlowState::UdpReplied, 0, ts, seen));

        // A stale flow of another LAN host holding WAN port 41000 towards
        // the same server port: a new host's flow from 41000 takes it over.
        let stale = Flow::masq(udp_key([192, 168, 50, 5], 41000, SERVER, 53), 41000);
        let [stale_orig, stale_reply] = stale.entries(FlowState::UdpReplied, 0, old, old);
        r.put(stale_orig.0, stale_orig.1);
        r.put(stale_reply.0, stale_reply.1);
        let g = Flow::masq(udp_key(CLIENT, 41000, SERVER, 53), 41000);
        assert_eq!(g.reply(), stale.reply());
        let q2 = Ipv4::new(CLIENT, SERVER, Udp::new(41000, 53, b"takes the port"));
        let run = r.redirect(
            "new host over another host's expired flow",
            &env.client_sends(&q2),
            lan,
            &env.to_server(&snat(&q2, 41000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade, Counter::FlowExpiredReplaced],
        );
        let ts_g = r.stamp(&g.orig, &run);
        // The stale host's own entry may stay (nothing requires deleting it)
        // but, if present, must be unchanged.
        let mut want: Vec<(FlowKey, FlowEntry)> = f
            .entries(FlowState::UdpReplied, 0, ts, seen)
            .into_iter()
            .chain(g.entries(FlowState::UdpUnreplied, 0, ts_g, ts_g))
            .collect();
        if r.flows().contains_key(&stale_orig.0) {
            want.push(stale_orig);
        }
        r.assert_flows("other host replaced", want.clone());
        let a2 = Ipv4::new(SERVER, WAN, Udp::new(53, 41000, b"to the new host"));
        r.redirect(
            "reply goes to the new host",
            &env.server_sends(&a2),
            wan,
            &env.to_client(&dnat(&a2, CLIENT, 41000)),
            Counter::FwdInbound,
            &[],
        );
        // The stale host's packet is a miss too: it opens a new flow, which
        // cannot have port 41000 now.
        let k3 = udp_key([192, 168, 50, 5], 41000, SERVER, 53);
        let (p3, collisions) = probe(&k3, PORT_MIN, PORT_MAX, &[40000, 41000], &[]).unwrap();
        let q3 = Ipv4::new(
            [192, 168, 50, 5],
            SERVER,
            Udp::new(41000, 53, b"stale host again"),
        );
        let mut events = vec![Counter::FlowNewMasquerade];
        events.extend(std::iter::repeat_n(Counter::PortCollision, collisions));
        r.redirect(
            "stale host opens a new flow",
            &Frame::new(env.lan_mac, [2, 0, 0, 0, 0, 5], q3.clone()).bytes(),
            lan,
            &env.to_server(&snat(&q3, p3)),
            Counter::FwdOutbound,
            &events,
        );
    });
}

/// `last_seen_ns` is refreshed in both entries once `REFRESH_NS` has
/// passed; a missing peer entry (LRU eviction) is rebuilt and counted.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn refresh_and_evicted_peer_reinserted() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let now = now_ns();
        let old = now.saturating_sub(5 * NS_PER_SEC);
        assert!(now - old >= 5 * NS_PER_SEC, "uptime too short");
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let [(ko, eo), (kr, er)] = f.entries(FlowState::UdpUnreplied, 0, old, old);
        r.put(ko, eo);
        r.put(kr, er);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"q"));
        let run = r.redirect(
            "hit after 5 s",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let t = r.get(&ko).last_seen_ns;
        assert!(
            (run.t0..=run.t1).contains(&t),
            "not refreshed: {t} vs {}..={}",
            run.t0,
            run.t1
        );
        r.assert_flows("refreshed", f.entries(FlowState::UdpUnreplied, 0, old, t));

        // Peer (reply entry) evicted: rebuilt on the next refresh.
        r.remove(&kr);
        r.put(ko, eo);
        let run = r.redirect(
            "hit with the reply entry missing",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::EvictionDetected],
        );
        let t = r.get(&ko).last_seen_ns;
        assert!((run.t0..=run.t1).contains(&t), "not refreshed: {t}");
        r.assert_flows(
            "reply entry rebuilt",
            f.entries(FlowState::UdpUnreplied, 0, old, t),
        );

        // Original entry evicted: the reply rebuilds it (and marks the flow replied).
        r.remove(&ko);
        r.put(kr, er);
        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"a"));
        let run = r.redirect(
            "reply with the original entry missing",
            &env.server_sends(&a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[Counter::EvictionDetected],
        );
        let t = r.get(&kr).last_seen_ns;
        assert!((run.t0..=run.t1).contains(&t), "not refreshed: {t}");
        r.assert_flows(
            "original entry rebuilt",
            f.entries(FlowState::UdpReplied, 0, old, t),
        );

        // Within REFRESH_NS: not rewritten.
        let run = r.redirect(
            "hit right after",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[],
        );
        let seen = r.seen(&ko, t, &run);
        r.assert_flows(
            "not refreshed again",
            f.entries(FlowState::UdpReplied, 0, old, seen),
        );
    });
}

/// A one-port range: the first flow gets it, a second flow to the same
/// server port finds it taken on every probe and is passed untouched;
/// flows to another server port or another protocol can still use it.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ports_exhausted_with_one_port_range() {
    let env = Env::new(false);
    let cfg = Config {
        port_min: 5000,
        port_max: 5000,
        ..env.config()
    };
    env.with_router(Some(cfg), |r| {
        let lan = r.lan;
        let f = Flow::masq(tcp_key(CLIENT, 40000, SERVER, 80), 5000);
        let s1 = Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_SYN));
        let run = r.redirect(
            "first flow",
            &env.client_sends(&s1),
            lan,
            &env.to_server(&snat(&s1, 5000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts = r.stamp(&f.orig, &run);
        let s2 = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 80, TCP_SYN));
        let probes = vec![Counter::PortCollision; MAX_PORT_PROBES as usize];
        r.check(
            "second flow: ports exhausted",
            &env.client_sends(&s2),
            lan,
            XDP_PASS,
            &env.client_sends(&s2),
            Counter::PassPortsExhausted,
            &probes,
        );
        // Also for the port the range holds.
        let s3 = Ipv4::new(CLIENT2, SERVER, Tcp::new(5000, 80, TCP_SYN));
        let s3f = Frame::new(env.lan_mac, [2, 0, 0, 0, 0, 3], s3).bytes();
        r.check(
            "third flow: exhausted",
            &s3f,
            lan,
            XDP_PASS,
            &s3f,
            Counter::PassPortsExhausted,
            &probes,
        );
        r.assert_flows(
            "only the first flow",
            f.entries(FlowState::TcpSynSent, 0, ts, ts),
        );

        let g = Flow::masq(tcp_key(CLIENT, 40001, SERVER, 81), 5000);
        let s4 = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 81, TCP_SYN));
        let run = r.redirect(
            "other server port",
            &env.client_sends(&s4),
            lan,
            &env.to_server(&snat(&s4, 5000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_g = r.stamp(&g.orig, &run);
        let h = Flow::masq(udp_key(CLIENT, 40001, SERVER, 80), 5000);
        let u = Ipv4::new(CLIENT, SERVER, Udp::new(40001, 80, b"udp"));
        let run = r.redirect(
            "UDP",
            &env.client_sends(&u),
            lan,
            &env.to_server(&snat(&u, 5000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_h = r.stamp(&h.orig, &run);
        r.assert_flows(
            "end",
            f.entries(FlowState::TcpSynSent, 0, ts, ts)
                .into_iter()
                .chain(g.entries(FlowState::TcpSynSent, 0, ts_g, ts_g))
                .chain(h.entries(FlowState::UdpUnreplied, 0, ts_h, ts_h)),
        );
    });
}

/// FIB outcomes other than success: no neighbour (LAN: untouched; WAN:
/// translated without TTL change, flow recorded), MTU exceeded, forwarding
/// disabled, egress not attached.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn fib_outcomes_other_than_success() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let q = Ipv4::new(CLIENT, WAN_NOBODY, Udp::new(40000, 53, b"nobody there"));
        r.pass(
            "LAN -> WAN host without neighbour",
            &env.client_sends(&q),
            lan,
            Counter::PassNoNeighbour,
        );
        r.assert_flows("nothing created", []);

        // Port forward to a LAN address without neighbour.
        r.forward(IPPROTO_UDP, 9000, LAN_NOBODY, 9001);
        let f = Flow::forward(udp_key(SERVER, 6000, WAN, 9000), LAN_NOBODY, 9001);
        let u = Ipv4::new(SERVER, WAN, Udp::new(6000, 9000, b"forward to nobody"));
        let mut want = dnat(&u, LAN_NOBODY, 9001);
        want.ttl = u.ttl;
        let input = env.server_sends(&u);
        let expect = Frame::new(env.wan_mac, env.server_mac, want).bytes();
        let run = r.check(
            "forward, no neighbour",
            &input,
            wan,
            XDP_PASS,
            &expect,
            Counter::PassNoNeighbour,
            &[Counter::FlowNewPortForward],
        );
        frames::verify_checksums(&run.out);
        let ts = r.stamp(&f.orig, &run);
        r.assert_flows(
            "forward recorded",
            f.entries(FlowState::UdpUnreplied, 0, ts, ts),
        );

        // A masqueraded flow of a LAN host the router has no neighbour for:
        // the reply is translated and passed.
        let g = Flow::masq(udp_key(LAN_NOBODY, 7000, SERVER, 53), 7000);
        let gq = Ipv4::new(LAN_NOBODY, SERVER, Udp::new(7000, 53, b"from .9"));
        let run = r.redirect(
            "masquerade from .9",
            &Frame::new(env.lan_mac, [2, 0, 0, 0, 0, 9], gq.clone()).bytes(),
            lan,
            &env.to_server(&snat(&gq, 7000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        let ts_g = r.stamp(&g.orig, &run);
        let ga = Ipv4::new(SERVER, WAN, Udp::new(53, 7000, b"to .9"));
        let mut want = dnat(&ga, LAN_NOBODY, 7000);
        want.ttl = ga.ttl;
        let input = env.server_sends(&ga);
        let expect = Frame::new(env.wan_mac, env.server_mac, want).bytes();
        let run = r.check(
            "reply to .9, no neighbour",
            &input,
            wan,
            XDP_PASS,
            &expect,
            Counter::PassNoNeighbour,
            &[],
        );
        frames::verify_checksums(&run.out);
        let seen_g = r.seen(&g.orig, ts_g, &run);
        let flows: Vec<(FlowKey, FlowEntry)> = f
            .entries(FlowState::UdpUnreplied, 0, ts, ts)
            .into_iter()
            .chain(g.entries(FlowState::UdpReplied, 0, ts_g, seen_g))
            .collect();
        r.assert_flows("after reply to .9", flows.clone());

        // MTU: wan0 at 1000 bytes, a 1200-byte packet.
        env.t
            .exec_ok(Ns::Router, &["ip", "link", "set", WAN_IF, "mtu", "1000"]);
        let big = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, &[0x5a; 1172]));
        r.pass(
            "exceeds the egress MTU",
            &env.client_sends(&big),
            lan,
            Counter::PassMtu,
        );
        env.t
            .exec_ok(Ns::Router, &["ip", "link", "set", WAN_IF, "mtu", "1500"]);

        // Forwarding disabled on the ingress interface.
        let key = format!("net.ipv4.conf.{LAN_IF}.forwarding");
        env.t
            .exec_ok(Ns::Router, &["sysctl", "-qw", &format!("{key}=0")]);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"forwarding off"));
        r.pass(
            "forwarding disabled",
            &env.client_sends(&q),
            lan,
            Counter::PassFibForwardingDisabled,
        );
        env.t
            .exec_ok(Ns::Router, &["sysctl", "-qw", &format!("{key}=1")]);

        // Egress interface not in DEVICES.
        r.devices.remove(wan).unwrap();
        r.pass(
            "egress not attached",
            &env.client_sends(&q),
            lan,
            Counter::PassEgressNotAttached,
        );
        r.devices.insert(wan, wan, None, 0).unwrap();
        r.assert_flows("no flow for passed packets", flows);

        // And with everything back, the same packet is forwarded.
        r.redirect(
            "forwarded again",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
    });
}

/// Established flows use the next hop cached in their entry (no FIB lookup
/// per packet); the FIB is asked again when nothing is cached, when the
/// packet is bigger than the cached MTU, and at each refresh. A cached hop
/// to an interface no longer attached is not used blindly.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn next_hop_cache() {
    let env = Env::new(false);
    env.with_router(Some(env.config()), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(udp_key(CLIENT, 41000, SERVER, 53), 41000);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(41000, 53, b"q"));
        let frame = env.client_sends(&q);
        let out = env.to_server(&snat(&q, 41000));
        let fwd = Counter::FwdOutbound;
        r.redirect(
            "open",
            &frame,
            lan,
            &out,
            fwd,
            &[Counter::FlowNewMasquerade],
        );
        assert_eq!(
            r.raw_entry(&f.orig).hop_ifindex,
            0,
            "nothing cached by a new flow"
        );

        r.redirect("second", &frame, lan, &out, fwd, &[]);
        let e = r.raw_entry(&f.orig);
        assert_eq!(
            (e.hop_ifindex, e.hop_mtu, e.hop_dmac, e.hop_smac),
            (wan, 1500, env.server_mac, env.wan_mac),
            "FIB result cached"
        );
        assert_eq!(
            r.raw_entry(&f.reply()).hop_ifindex,
            0,
            "reply direction not seen yet"
        );

        // The cache is what the next packet uses: a doctored MAC shows up.
        let fake = [0x02, 0xde, 0xad, 0xbe, 0xef, 0x01];
        let mut doctored = e;
        doctored.hop_dmac = fake;
        r.put(f.orig, doctored);
        let mut via_cache = out.clone();
        via_cache[0..6].copy_from_slice(&fake);
        r.redirect("cached", &frame, lan, &via_cache, fwd, &[]);

        // Bigger than the cached MTU: the FIB is asked and the cache fixed.
        let mut small = doctored;
        small.hop_mtu = 20;
        r.put(f.orig, small);
        r.redirect("over cached MTU", &frame, lan, &out, fwd, &[]);
        assert_eq!(r.raw_entry(&f.orig).hop_dmac, env.server_mac);
        assert_eq!(r.raw_entry(&f.orig).hop_mtu, 1500);

        // Refresh due: the FIB is asked again.
        let mut stale = r.raw_entry(&f.orig);
        stale.hop_dmac = fake;
        stale.last_seen_ns -= 2 * REFRESH_NS;
        r.put(f.orig, stale);
        r.redirect("refresh", &frame, lan, &out, fwd, &[]);
        assert_eq!(
            r.raw_entry(&f.orig).hop_dmac,
            env.server_mac,
            "refreshed from the FIB"
        );

        // Cached egress detached: passed untouched, not redirected.
        r.devices.remove(wan).unwrap();
        r.pass(
            "egress detached",
            &frame,
            lan,
            Counter::PassEgressNotAttached,
        );
        r.devices.insert(wan, wan, None, 0).unwrap();
        r.redirect("egress back", &frame, lan, &out, fwd, &[]);
    });
}
