//! Malformed and mutated input through `BPF_PROG_RUN`: a systematic corpus
//! (every truncation point, every IHL and TCP data offset, total lengths
//! around the frame, fragments, TTL 0/1/2, IP options, zero, broadcast,
//! loopback and multicast addresses, ICMP errors quoting ever shorter
//! headers, VLAN tags) plus a generated one (seeded random mutations of
//! valid frames from both sides, with and without a matching flow).
//!
//! The hand-written malformed, pass and ICMP-error cases with exact
//! expected outputs are in `nat_prog_run.rs` (`malformed_frames_are_dropped`,
//! `pass_cases_ttl_fragments_options_protocols`,
//! `icmp_errors_with_embedded_headers`, `unsolicited_wan_packets_pass_untouched`);
//! this file does not repeat them but checks invariants on thousands of
//! frames nobody wrote by hand. For every case:
//! - the verdict is `XDP_PASS`, `XDP_DROP` or `XDP_REDIRECT`;
//! - exactly one verdict counter moved, by one packet and the frame's bytes;
//! - the verdict counter is the one a model of the spec's checks predicts
//!   (validation order; conntrack hit or miss looked up before the run);
//! - new-flow and ICMP-translation events only with a verdict that allows
//!   them;
//! - an output that differs from the input is a valid packet: same length,
//!   only the bytes the translation may touch changed, every checksum's
//!   one's-complement residual preserved (a valid checksum stays valid, a
//!   corrupt L4 checksum stays exactly as corrupt, as RFC 1624 updates do),
//!   TTL - 1 and the egress MACs for redirects, the translated tuple equal
//!   to the `CONNTRACK` entry of the input's tuple, redirects leaving by the
//!   interface their counter names (`fwd_outbound`: WAN, `fwd_inbound`: LAN);
//! - at the end, every `CONNTRACK` entry has its peer and the two agree.
//!
//! The generated corpus always fixes the outer IPv4 header checksum after a
//! mutation (so it tests the parser and the rewrites, not checksum
//! validation); `bad_ipv4_header_checksum_is_not_forwarded` tests that.
#![allow(
    clippy::too_many_lines,
    clippy::many_single_char_names,
    clippy::verbose_bit_mask,
    reason = "corpus generators are long lists of cases; short names for frame, run, \
              summary; header bit masks read as in the RFCs"
)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::Instant;

use router_common::checksum::{checksum, fold, sum_words};
use router_common::maps::{
    Config, Counter, CounterValue, FLAG_ORIGINAL, FLAG_PORT_FORWARD, FlowEntry, FlowKey,
    IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, PortForwardKey, PortForwardTarget, Timeouts,
};
use tests::frames::{
    self, Frame, ICMP_DEST_UNREACH, ICMP_ECHO_REQUEST, ICMP_PARAMETER_PROBLEM, ICMP_TIME_EXCEEDED,
    IP_DF, IP_MF, Icmp, Ipv4, TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, Tcp, Udp,
};
use tests::prog::{LoadedRouter, SplitMix64};
use tests::{HOST_IF, LAN_IF, Ns, Topology, WAN_IF};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

const CLIENT: [u8; 4] = [192, 168, 50, 2];
const ROUTER_LAN: [u8; 4] = [192, 168, 50, 1];
const WAN: [u8; 4] = [203, 0, 113, 1];
const SERVER: [u8; 4] = [203, 0, 113, 2];
const LAN_NOBODY: [u8; 4] = [192, 168, 50, 9];
const WAN_NOBODY: [u8; 4] = [203, 0, 113, 9];

/// Addresses a mutation puts into address fields.
const ODD_ADDRS: [[u8; 4]; 12] = [
    [0, 0, 0, 0],
    [255, 255, 255, 255],
    [127, 0, 0, 1],
    [224, 0, 0, 1],
    [192, 168, 50, 255],
    [203, 0, 113, 255],
    ROUTER_LAN,
    WAN,
    CLIENT,
    SERVER,
    LAN_NOBODY,
    WAN_NOBODY,
];

/// Ports of the flows and rules below, and the ends of the range.
const ODD_PORTS: [u16; 12] = [
    0, 1, 53, 80, 1023, 1911, 5353, 5354, 8080, 40000, 40001, 65535,
];

const HASH_SEED: u32 = 0x5eed_c0de;
/// Seed of the generated corpus.
const RNG_SEED: u64 = 0x00c0_ffee_5eed_0006;
/// Number of generated cases.
const GENERATED: usize = 6000;
/// Large enough that nothing is evicted during the corpus.
const CT_ENTRIES: u32 = 1 << 17;
/// Echo identifier of the ICMP flow (in the port range: preserved).
const ECHO_ID: u16 = 1911;

// ---------------------------------------------------------------------------
// Topology and the loaded program (a small subset of nat_prog_run.rs's)
// ---------------------------------------------------------------------------

struct Env {
    t: Topology,
    lan: u32,
    wan: u32,
    lan_mac: [u8; 6],
    wan_mac: [u8; 6],
    client_mac: [u8; 6],
    server_mac: [u8; 6],
}

impl Env {
    fn new() -> Self {
        let t = Topology::new();
        // The router learns the client's MAC from its ARP for the gateway,
        // the server's from its ARP for the WAN address.
        assert!(t.ping(Ns::Client, Ipv4Addr::from(ROUTER_LAN), 1));
        assert!(t.ping(Ns::Server, Ipv4Addr::from(WAN), 1));
        assert!(t.ping(Ns::Router, Ipv4Addr::from(SERVER), 1));
        assert!(t.ping(Ns::Router, Ipv4Addr::from(CLIENT), 1));
        Self {
            lan: t.ifindex(Ns::Router, LAN_IF),
            wan: t.ifindex(Ns::Router, WAN_IF),
            lan_mac: t.mac(Ns::Router, LAN_IF),
            wan_mac: t.mac(Ns::Router, WAN_IF),
            client_mac: t.mac(Ns::Client, HOST_IF),
            server_mac: t.mac(Ns::Server, HOST_IF),
            t,
        }
    }

    /// Long timeouts: nothing expires while the corpus runs, so a hit
    /// looked up before a run is a hit in the run.
    fn config(&self) -> Config {
        Config {
            lan_ifindex: self.lan,
            wan_ifindex: self.wan,
            wan_addr: WAN,
            port_min: 1024,
            port_max: 65535,
            hash_seed: HASH_SEED,
            pad: 0,
            timeouts: Timeouts {
                tcp_syn_sent: 3600,
                tcp_established: 3600,
                tcp_fin_wait: 3600,
                tcp_closed: 3600,
                udp_unreplied: 3600,
                udp_replied: 3600,
                icmp: 3600,
                pad: 0,
            },
        }
    }

    fn client_sends(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.lan_mac, self.client_mac, ip.clone()).bytes()
    }

    fn server_sends(&self, ip: &Ipv4) -> Vec<u8> {
        Frame::new(self.wan_mac, self.server_mac, ip.clone()).bytes()
    }

    fn sends(&self, from_lan: bool, ip: &Ipv4) -> Vec<u8> {
        if from_lan {
            self.client_sends(ip)
        } else {
            self.server_sends(ip)
        }
    }
}

struct Run {
    verdict: u32,
    out: Vec<u8>,
    delta: Vec<(Counter, CounterValue)>,
}

/// The loaded object (see [`LoadedRouter`]) with this file's helpers.
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

    fn rule(&self, proto: u8, port: u16) -> Option<PortForwardTarget> {
        let k = PortForwardKey {
            proto,
            pad: 0,
            port,
        };
        self.forwards.get(&k, 0).ok()
    }

    fn run(&self, frame: &[u8], ifindex: u32) -> Run {
        let r = self.0.test_run(frame, ifindex);
        Run {
            verdict: r.verdict,
            out: r.out,
            delta: r.delta,
        }
    }

    fn get(&self, k: &FlowKey) -> Option<FlowEntry> {
        self.conntrack.get(k, 0).ok()
    }

    fn flows(&self) -> BTreeMap<FlowKey, FlowEntry> {
        self.conntrack
            .iter()
            .map(|r| r.expect("iterate CONNTRACK"))
            .collect()
    }
}

// ---------------------------------------------------------------------------
// A small deterministic PRNG (splitmix64)
// ---------------------------------------------------------------------------

struct Rng(SplitMix64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(SplitMix64(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is irrelevant here).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn byte(&mut self) -> u8 {
        self.next() as u8
    }

    fn u16(&mut self) -> u16 {
        self.next() as u16
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())]
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

// ---------------------------------------------------------------------------
// Frame field helpers
// ---------------------------------------------------------------------------

const IP: usize = frames::IP_OFF;
const L4: usize = frames::L4_OFF;
/// Quoted IPv4 header and L4 header of an ICMP error without IP options.
const INNER_IP: usize = L4 + 8;
const INNER_L4: usize = INNER_IP + 20;

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    if at + 2 <= b.len() {
        b[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
}

fn addr(b: &[u8], at: usize) -> [u8; 4] {
    [b[at], b[at + 1], b[at + 2], b[at + 3]]
}

fn put_addr(b: &mut [u8], at: usize, a: [u8; 4]) {
    if at + 4 <= b.len() {
        b[at..at + 4].copy_from_slice(&a);
    }
}

fn is_ipv4(f: &[u8]) -> bool {
    f.len() >= IP && be16(f, 12) == frames::ETHERTYPE_IPV4
}

fn is_icmp_error_type(t: u8) -> bool {
    matches!(
        t,
        ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM
    )
}

/// One's-complement sum of `data` with a 16-bit field at `csum` included
/// (a valid checksum gives 0xffff; 0 and 0xffff are the same number).
fn residual(acc: u32, data: &[u8]) -> u16 {
    match fold(sum_words(data, acc)) {
        0 => 0xffff,
        r => r,
    }
}

fn pseudo(src: [u8; 4], dst: [u8; 4], proto: u8, len: usize) -> u32 {
    let mut acc = sum_words(&src, 0);
    acc = sum_words(&dst, acc);
    acc + u32::from(proto) + len as u32
}

/// The residual of every checksum [`frames::checksum_errors`] would look
/// at, in the same structure (a UDP checksum of 0, "none", as `None`).
fn residuals(pkt: &[u8], quoted: bool, what: &str, out: &mut Vec<(String, Option<u16>)>) {
    if pkt.len() < 20 {
        return;
    }
    let hlen = usize::from(pkt[0] & 0x0f) * 4;
    if pkt[0] >> 4 != 4 || hlen < 20 || pkt.len() < hlen {
        return;
    }
    out.push((format!("{what} ip"), Some(residual(0, &pkt[..hlen]))));
    let total = usize::from(be16(pkt, 2));
    if total < hlen || total > pkt.len() || be16(pkt, 6) & 0x3fff != 0 {
        return;
    }
    let (src, dst, proto) = (addr(pkt, 12), addr(pkt, 16), pkt[9]);
    let l4 = &pkt[hlen..total];
    match proto {
        IPPROTO_TCP if l4.len() >= 20 => {
            let acc = pseudo(src, dst, proto, l4.len());
            out.push((format!("{what} tcp"), Some(residual(acc, l4))));
        }
        IPPROTO_UDP if l4.len() >= 8 => {
            let r = (be16(l4, 6) != 0).then(|| residual(pseudo(src, dst, proto, l4.len()), l4));
            out.push((format!("{what} udp"), r));
        }
        IPPROTO_ICMP if l4.len() >= 8 => {
            out.push((format!("{what} icmp"), Some(residual(0, l4))));
            if !quoted && is_icmp_error_type(l4[0]) {
                residuals(&l4[8..], true, &format!("{what} > embedded"), out);
            }
        }
        _ => {}
    }
}

fn frame_residuals(f: &[u8]) -> Vec<(String, Option<u16>)> {
    let mut v = Vec::new();
    if is_ipv4(f) {
        residuals(&f[IP..], false, "outer", &mut v);
    }
    v
}

/// Recomputes the checksums of an IPv4 packet (`pkt` may be a quote cut
/// short) where its structure allows; `l4` also the L4 ones.
fn fix_packet(pkt: &mut [u8], l4: bool, quoted: bool) {
    if pkt.len() < 20 {
        return;
    }
    let hlen = usize::from(pkt[0] & 0x0f) * 4;
    if hlen < 20 || pkt.len() < hlen {
        return;
    }
    let total = usize::from(be16(pkt, 2));
    if l4 && total >= hlen && total <= pkt.len() && be16(pkt, 6) & 0x3fff == 0 {
        let (src, dst, proto) = (addr(pkt, 12), addr(pkt, 16), pkt[9]);
        let seg = &mut pkt[hlen..total];
        match proto {
            IPPROTO_TCP if seg.len() >= 18 => {
                put16(seg, 16, 0);
                let c = !fold(sum_words(seg, pseudo(src, dst, proto, seg.len())));
                put16(seg, 16, c);
            }
            IPPROTO_UDP if seg.len() >= 8 && be16(seg, 6) != 0 => {
                put16(seg, 6, 0);
                let c = match !fold(sum_words(seg, pseudo(src, dst, proto, seg.len()))) {
                    0 => 0xffff,
                    c => c,
                };
                put16(seg, 6, c);
            }
            IPPROTO_ICMP if seg.len() >= 4 => {
                if !quoted && seg.len() >= 8 && is_icmp_error_type(seg[0]) {
                    fix_packet(&mut seg[8..], true, true);
                }
                put16(seg, 2, 0);
                let c = !fold(sum_words(seg, 0));
                put16(seg, 2, c);
            }
            _ => {}
        }
    }
    pkt[10..12].fill(0);
    let c = !fold(sum_words(&pkt[..hlen], 0));
    pkt[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Fixes the checksums of a frame: the outer IPv4 header always, the L4
/// ones (inner first) when `l4`.
fn fix_frame(f: &mut [u8], l4: bool) {
    if is_ipv4(f) {
        fix_packet(&mut f[IP..], l4, false);
    }
}

/// Sets byte `at` if the frame has it.
fn poke(f: &mut [u8], at: usize, v: u8) {
    if let Some(b) = f.get_mut(at) {
        *b = v;
    }
}

fn set_total(f: &mut [u8], total: usize) {
    put16(f, IP + 2, u16::try_from(total.min(0xffff)).unwrap());
}

/// `f` cut to `len` with the IPv4 total length (and the UDP length, for
/// UDP) following, checksums recomputed: a shorter but consistent packet.
fn consistent_truncation(f: &[u8], len: usize) -> Vec<u8> {
    let mut v = f[..len].to_vec();
    if len >= L4 {
        set_total(&mut v, len - IP);
        if v[IP + 9] == IPPROTO_UDP && len >= L4 + 6 {
            put16(&mut v, L4 + 4, u16::try_from(len - L4).unwrap());
        }
    }
    fix_frame(&mut v, true);
    v
}

/// The key a packet is looked up with (its 5-tuple; ICMP echo: the
/// identifier in both port fields). Only for frames the model lets through
/// to the lookup.
fn lookup_key(f: &[u8]) -> FlowKey {
    let proto = f[IP + 9];
    let (sport, dport) = if proto == IPPROTO_ICMP {
        (be16(f, L4 + 4), be16(f, L4 + 4))
    } else {
        (be16(f, L4), be16(f, L4 + 2))
    };
    FlowKey::new(addr(f, IP + 12), addr(f, IP + 16), sport, dport, proto)
}

/// The key an ICMP error is looked up with: a reply to the quoted packet.
fn icmp_error_key(f: &[u8]) -> FlowKey {
    let proto = f[INNER_IP + 9];
    let (qs, qd) = if proto == IPPROTO_ICMP {
        (be16(f, INNER_L4 + 4), be16(f, INNER_L4 + 4))
    } else {
        (be16(f, INNER_L4), be16(f, INNER_L4 + 2))
    };
    FlowKey::new(
        addr(f, INNER_IP + 16),
        addr(f, INNER_IP + 12),
        qd,
        qs,
        proto,
    )
}

// ---------------------------------------------------------------------------
// The model of the spec's checks
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Decided before any lookup: exactly this counter.
    Exactly(Counter),
    /// TCP/UDP/echo reaching the conntrack lookup.
    Lookup,
    /// ICMP error from the WAN whose quote is usable: looked up as a reply.
    IcmpError,
}

/// What the spec decides from the bytes alone (README "Per packet", steps
/// 1 and 5 of the ICMP error path), in its order of checks.
fn model(f: &[u8], from_lan: bool) -> Stage {
    use Stage::Exactly;
    if !is_ipv4(f) {
        return Exactly(Counter::PassNotIpv4);
    }
    if f.len() < L4 {
        return Exactly(Counter::DropTruncated);
    }
    let l3_len = f.len() - IP;
    let (version, ihl) = (f[IP] >> 4, usize::from(f[IP] & 0x0f));
    let total = usize::from(be16(f, IP + 2));
    if version != 4 || ihl < 5 || total < 20 || total > l3_len || ihl * 4 > total {
        return Exactly(Counter::DropMalformed);
    }
    if ihl > 5 {
        return Exactly(Counter::PassIpOptions);
    }
    if be16(f, IP + 6) & 0x3fff != 0 {
        return Exactly(Counter::PassFragment);
    }
    if f[IP + 8] <= 1 {
        return Exactly(Counter::PassTtlExceeded);
    }
    if checksum(&f[IP..L4]) != 0 {
        return Exactly(Counter::DropIpChecksum);
    }
    match f[IP + 9] {
        IPPROTO_TCP => {
            if total < 40 {
                return Exactly(Counter::DropMalformed);
            }
            let doff = usize::from(f[L4 + 12] >> 4) * 4;
            if doff < 20 || doff > total - 20 {
                return Exactly(Counter::DropMalformed);
            }
            Stage::Lookup
        }
        IPPROTO_UDP => {
            if total < 28 {
                return Exactly(Counter::DropMalformed);
            }
            Stage::Lookup
        }
        IPPROTO_ICMP => {
            if total < 28 {
                return Exactly(Counter::DropMalformed);
            }
            let t = f[L4];
            if !from_lan && is_icmp_error_type(t) {
                if total < 56 || f[INNER_IP] != 0x45 {
                    return Exactly(Counter::PassUnsolicited);
                }
                let ok = match f[INNER_IP + 9] {
                    IPPROTO_TCP | IPPROTO_UDP => true,
                    IPPROTO_ICMP => f[INNER_L4] == ICMP_ECHO_REQUEST,
                    _ => false,
                };
                if !ok {
                    return Exactly(Counter::PassUnsolicited);
                }
                return Stage::IcmpError;
            }
            let wanted = if from_lan { ICMP_ECHO_REQUEST } else { 0 };
            if t == wanted {
                Stage::Lookup
            } else {
                Exactly(Counter::PassProtocol)
            }
        }
        _ => Exactly(Counter::PassProtocol),
    }
}

/// Verdicts of the FIB step that pass untouched.
const FIB_PASSES: [Counter; 5] = [
    Counter::PassFibNotForwarded,
    Counter::PassFibForwardingDisabled,
    Counter::PassMtu,
    Counter::PassEgressNotAttached,
    Counter::PassNoNeighbour,
];

/// What the spec allows after the lookup stage, given whether the key hit
/// before the run: the verdict counters, and whether a new flow
/// (`FlowNewMasquerade`/`FlowNewPortForward`) may be counted.
fn allowed_after_lookup(
    r: &Router,
    f: &[u8],
    from_lan: bool,
    stage: Stage,
) -> (Vec<Counter>, Option<Counter>) {
    let fwd = if from_lan {
        Counter::FwdOutbound
    } else {
        Counter::FwdInbound
    };
    let mut ok = vec![fwd];
    ok.extend_from_slice(&FIB_PASSES);
    if stage == Stage::IcmpError {
        // Only a WAN-side entry may translate an error from the WAN.
        if r.get(&icmp_error_key(f)).is_none_or(|e| e.lan_side()) {
            return (vec![Counter::PassUnsolicited], None);
        }
        return (ok, None);
    }
    let key = lookup_key(f);
    // An entry is a hit only on its own side.
    if r.get(&key).is_some_and(|e| e.lan_side() == from_lan) {
        return (ok, None);
    }
    let proto = key.proto;
    let plain_syn =
        proto == IPPROTO_TCP && f[L4 + 13] & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN;
    if from_lan {
        if proto == IPPROTO_TCP && !plain_syn {
            return (vec![Counter::PassNoFlow], None);
        }
        ok.push(Counter::PassNoFlow);
        ok.push(Counter::PassPortsExhausted);
        return (ok, Some(Counter::FlowNewMasquerade));
    }
    if proto == IPPROTO_TCP && !plain_syn
        || key.dst_addr != WAN
        || proto == IPPROTO_ICMP
        || r.rule(proto, key.dst_port).is_none()
    {
        return (vec![Counter::PassUnsolicited], None);
    }
    ok.push(Counter::PassPortsExhausted);
    (ok, Some(Counter::FlowNewPortForward))
}

// ---------------------------------------------------------------------------
// Checking one case
// ---------------------------------------------------------------------------

#[derive(Default)]
struct Summary {
    cases: usize,
    verdicts: BTreeMap<&'static str, usize>,
    counters: BTreeMap<&'static str, usize>,
    events: BTreeMap<&'static str, u64>,
    rewritten: usize,
    corrupt_l4_forwarded: usize,
    failures: Vec<String>,
}

impl Summary {
    fn table(&self, title: &str) -> String {
        let mut s = format!("{title}\n\n| | cases |\n|---|---:|\n");
        let _ = writeln!(s, "| total | {} |", self.cases);
        for (v, n) in &self.verdicts {
            let _ = writeln!(s, "| {v} | {n} |");
        }
        let _ = writeln!(
            s,
            "| output rewritten (each one checked) | {} |",
            self.rewritten
        );
        let _ = writeln!(
            s,
            "| of those with a corrupt L4 checksum kept corrupt | {} |",
            self.corrupt_l4_forwarded
        );
        let _ = writeln!(s, "| failures | {} |", self.failures.len());
        s.push_str("\n| verdict counter | cases |\n|---|---:|\n");
        for (c, n) in &self.counters {
            let _ = writeln!(s, "| `{c}` | {n} |");
        }
        s.push_str("\n| event counter | events |\n|---|---:|\n");
        for (c, n) in &self.events {
            let _ = writeln!(s, "| `{c}` | {n} |");
        }
        s
    }

    fn merge(&mut self, o: Summary) {
        self.cases += o.cases;
        for (k, v) in o.verdicts {
            *self.verdicts.entry(k).or_default() += v;
        }
        for (k, v) in o.counters {
            *self.counters.entry(k).or_default() += v;
        }
        for (k, v) in o.events {
            *self.events.entry(k).or_default() += v;
        }
        self.rewritten += o.rewritten;
        self.corrupt_l4_forwarded += o.corrupt_l4_forwarded;
        self.failures.extend(o.failures);
    }
}

fn verdict_name(v: u32) -> &'static str {
    match v {
        XDP_DROP => "XDP_DROP",
        XDP_PASS => "XDP_PASS",
        XDP_REDIRECT => "XDP_REDIRECT",
        _ => "other",
    }
}

/// Bytes a translation may change: MACs, TTL, IPv4 checksum, addresses,
/// ports/identifier and the L4 checksum; for ICMP errors the outer
/// destination, ICMP checksum, quoted source address and port (or echo
/// identifier) and the quoted checksums.
fn may_change(f: &[u8], at: usize, icmp_error: bool) -> bool {
    if at < 12 || at == IP + 8 || (IP + 10..IP + 12).contains(&at) {
        return true;
    }
    if icmp_error {
        let inner_proto = f[INNER_IP + 9];
        return (IP + 16..IP + 20).contains(&at)
            || (L4 + 2..L4 + 4).contains(&at)
            || (INNER_IP + 10..INNER_IP + 16).contains(&at)
            || match inner_proto {
                IPPROTO_ICMP => (INNER_L4 + 2..INNER_L4 + 6).contains(&at),
                IPPROTO_UDP => {
                    (INNER_L4..INNER_L4 + 2).contains(&at)
                        || (INNER_L4 + 6..INNER_L4 + 8).contains(&at)
                }
                _ => (INNER_L4..INNER_L4 + 2).contains(&at) || (78..80).contains(&at),
            };
    }
    if (IP + 12..IP + 20).contains(&at) {
        return true;
    }
    match f[IP + 9] {
        IPPROTO_TCP => (L4..L4 + 4).contains(&at) || (L4 + 16..L4 + 18).contains(&at),
        IPPROTO_UDP => (L4..L4 + 4).contains(&at) || (L4 + 6..L4 + 8).contains(&at),
        _ => (L4 + 2..L4 + 6).contains(&at),
    }
}

/// Checks a rewritten output (`run.out != f`); `counter` is the verdict
/// counter. Returns what is wrong.
fn check_rewrite(
    env: &Env,
    r: &Router,
    f: &[u8],
    from_lan: bool,
    run: &Run,
    counter: Counter,
    stage: Stage,
) -> Vec<String> {
    let mut errs = Vec::new();
    let out = &run.out;
    if out.len() != f.len() {
        errs.push(format!("length {} -> {}", f.len(), out.len()));
        return errs;
    }
    let redirect = run.verdict == XDP_REDIRECT;
    let allowed = match (redirect, counter) {
        (true, Counter::FwdOutbound) => from_lan,
        // WAN -> LAN without a neighbour: translated, for the kernel.
        (true, Counter::FwdInbound) | (false, Counter::PassNoNeighbour) => !from_lan,
        _ => false,
    };
    if !allowed {
        errs.push(format!(
            "output rewritten with {} / {counter:?} from the {}",
            verdict_name(run.verdict),
            if from_lan { "LAN" } else { "WAN" }
        ));
        return errs;
    }
    let icmp_error = stage == Stage::IcmpError;
    for (at, (a, b)) in f.iter().zip(out).enumerate() {
        if a != b && !may_change(f, at, icmp_error) {
            errs.push(format!("byte {at} changed {a:#04x} -> {b:#04x}"));
        }
    }
    let (rin, rout) = (frame_residuals(f), frame_residuals(out));
    if rin != rout {
        errs.push(format!("checksum residuals changed: {rin:?} -> {rout:?}"));
    }
    if frames::checksum_errors(f).is_empty() {
        let e = frames::checksum_errors(out);
        if !e.is_empty() {
            errs.push(format!("valid input, output checksums wrong: {e:?}"));
        }
    }
    let ttl = if redirect {
        f[IP + 8].wrapping_sub(1)
    } else {
        f[IP + 8]
    };
    if out[IP + 8] != ttl {
        errs.push(format!("TTL {} -> {}, want {ttl}", f[IP + 8], out[IP + 8]));
    }
    let macs = if !redirect {
        (f[..6].to_vec(), f[6..12].to_vec())
    } else if from_lan {
        (env.server_mac.to_vec(), env.wan_mac.to_vec())
    } else {
        (env.client_mac.to_vec(), env.lan_mac.to_vec())
    };
    if out[..6] != macs.0[..] || out[6..12] != macs.1[..] {
        errs.push(format!(
            "MACs {:02x?} {:02x?}, want {:02x?} {:02x?} (egress of {counter:?})",
            &out[..6],
            &out[6..12],
            macs.0,
            macs.1
        ));
    }
    // The translation is the one CONNTRACK holds for the input's tuple.
    if icmp_error {
        let key = icmp_error_key(f);
        let Some(e) = r.get(&key) else {
            errs.push(format!("translated ICMP error but no entry {key:?}"));
            return errs;
        };
        let inner_port = if f[INNER_IP + 9] == IPPROTO_ICMP {
            be16(out, INNER_L4 + 4)
        } else {
            be16(out, INNER_L4)
        };
        let got = (
            addr(out, IP + 12),
            addr(out, IP + 16),
            addr(out, INNER_IP + 12),
            inner_port,
        );
        let want = (
            addr(f, IP + 12),
            e.new_dst_addr,
            e.new_dst_addr,
            e.new_dst_port,
        );
        if got != want {
            errs.push(format!(
                "ICMP error translated to {got:?}, entry {key:?} says {want:?}"
            ));
        }
    } else {
        let key = lookup_key(f);
        let Some(e) = r.get(&key) else {
            errs.push(format!("rewritten but no CONNTRACK entry {key:?}"));
            return errs;
        };
        let o = lookup_key(out);
        let want = FlowKey::new(
            e.new_src_addr,
            e.new_dst_addr,
            e.new_src_port,
            if key.proto == IPPROTO_ICMP {
                e.new_src_port
            } else {
                e.new_dst_port
            },
            key.proto,
        );
        if o != want {
            errs.push(format!("translated to {o:?}, entry {key:?} says {want:?}"));
        }
    }
    errs
}

/// Runs one case, checks everything, records it in `s`.
fn case(env: &Env, r: &Router, what: &str, f: &[u8], from_lan: bool, s: &mut Summary) {
    let ifindex = if from_lan { env.lan } else { env.wan };
    let stage = model(f, from_lan);
    let (ok, new_event) = match stage {
        Stage::Exactly(c) => (vec![c], None),
        _ => allowed_after_lookup(r, f, from_lan, stage),
    };
    let run = r.run(f, ifindex);
    let mut errs = Vec::new();
    if ![XDP_DROP, XDP_PASS, XDP_REDIRECT].contains(&run.verdict) {
        errs.push(format!("verdict {}", run.verdict));
    }
    let verdicts: Vec<&(Counter, CounterValue)> =
        run.delta.iter().filter(|(c, _)| !c.is_event()).collect();
    let counter = match verdicts.as_slice() {
        [(c, v)] if v.packets == 1 && v.bytes == f.len() as u64 => Some(*c),
        _ => {
            errs.push(format!("verdict counters moved: {verdicts:?}"));
            None
        }
    };
    if let Some(c) = counter {
        *s.counters.entry(c.name()).or_default() += 1;
        if !ok.contains(&c) {
            errs.push(format!("counter {c:?}, the spec allows {ok:?}"));
        }
        let want_verdict = match c {
            Counter::FwdOutbound | Counter::FwdInbound => XDP_REDIRECT,
            Counter::DropMalformed | Counter::DropTruncated | Counter::DropIpChecksum => XDP_DROP,
            _ => XDP_PASS,
        };
        if run.verdict != want_verdict {
            errs.push(format!(
                "verdict {} with counter {c:?}",
                verdict_name(run.verdict)
            ));
        }
        for (e, v) in run.delta.iter().filter(|(c, _)| c.is_event()) {
            *s.events.entry(e.name()).or_default() += v.packets;
            let fine = match e {
                Counter::FlowNewMasquerade | Counter::FlowNewPortForward => {
                    new_event == Some(*e)
                        && v.packets == 1
                        && matches!(
                            c,
                            Counter::FwdOutbound | Counter::FwdInbound | Counter::PassNoNeighbour
                        )
                }
                Counter::IcmpErrorTranslated => {
                    stage == Stage::IcmpError
                        && v.packets == 1
                        && matches!(c, Counter::FwdInbound | Counter::PassNoNeighbour)
                }
                Counter::PortCollision => {
                    new_event == Some(Counter::FlowNewMasquerade) && v.packets <= 16
                }
                // A new flow adds its two entries (no stale entries here:
                // all timeouts are an hour, the table is far from full).
                Counter::CtEntriesInserted => {
                    v.packets == 2
                        && run.delta.iter().any(|(d, _)| {
                            matches!(d, Counter::FlowNewMasquerade | Counter::FlowNewPortForward)
                        })
                }
                _ => false,
            };
            if !fine {
                errs.push(format!("event {e:?} +{} with {c:?}", v.packets));
            }
        }
        let translated = stage == Stage::IcmpError
            && matches!(c, Counter::FwdInbound | Counter::PassNoNeighbour)
            && run.out != f;
        if stage == Stage::IcmpError
            && !translated
            && run
                .delta
                .iter()
                .any(|(e, _)| *e == Counter::IcmpErrorTranslated)
        {
            errs.push("IcmpErrorTranslated counted, nothing translated".to_owned());
        }
        if translated
            && !run
                .delta
                .iter()
                .any(|(e, _)| *e == Counter::IcmpErrorTranslated)
        {
            errs.push("ICMP error translated, not counted".to_owned());
        }
        if run.out != f {
            s.rewritten += 1;
            if frames::checksum_errors(f)
                .iter()
                .any(|e| !e.contains("IPv4 checksum"))
            {
                s.corrupt_l4_forwarded += 1;
            }
            errs.extend(check_rewrite(env, r, f, from_lan, &run, c, stage));
        } else if run.verdict == XDP_REDIRECT {
            errs.push("redirected without any rewrite (no TTL decrement)".to_owned());
        }
    }
    s.cases += 1;
    *s.verdicts.entry(verdict_name(run.verdict)).or_default() += 1;
    if !errs.is_empty() {
        s.failures.push(format!(
            "{what} (from {}): {}\n  input  {:02x?}\n  output {:02x?}\n  counters {:?}",
            if from_lan { "LAN" } else { "WAN" },
            errs.join("; "),
            f,
            run.out,
            run.delta
        ));
    }
}

// ---------------------------------------------------------------------------
// Base frames and flows
// ---------------------------------------------------------------------------

struct Base {
    name: &'static str,
    from_lan: bool,
    frame: Vec<u8>,
}

/// Opens the flows the base frames refer to (asserting the setup works),
/// adds port-forward rules, and returns the bases.
fn setup(env: &Env, r: &mut Router) -> Vec<Base> {
    r.forward(IPPROTO_TCP, 8080, CLIENT, 80);
    r.forward(IPPROTO_UDP, 5353, CLIENT, 53);
    // A rule to a LAN address without a neighbour: translated passes.
    r.forward(IPPROTO_UDP, 5354, LAN_NOBODY, 53);
    let opening: Vec<(bool, Ipv4)> = vec![
        (
            true,
            Ipv4::new(
                CLIENT,
                SERVER,
                Tcp::new(40000, 80, TCP_SYN).options(&[2, 4, 5, 0xb4]),
            ),
        ),
        (
            false,
            Ipv4::new(SERVER, WAN, Tcp::new(80, 40000, TCP_SYN | TCP_ACK)),
        ),
        (
            true,
            Ipv4::new(CLIENT, SERVER, Udp::new(40001, 53, b"query")),
        ),
        (
            false,
            Ipv4::new(SERVER, WAN, Udp::new(53, 40001, b"answer")),
        ),
        (
            true,
            Ipv4::new(CLIENT, SERVER, Icmp::echo_request(ECHO_ID, 1, b"ping")),
        ),
        (
            false,
            Ipv4::new(SERVER, WAN, Tcp::new(50000, 8080, TCP_SYN)),
        ),
    ];
    for (from_lan, ip) in &opening {
        let f = env.sends(*from_lan, ip);
        let run = r.run(&f, if *from_lan { env.lan } else { env.wan });
        assert_eq!(
            run.verdict, XDP_REDIRECT,
            "setup frame {ip:?} not redirected: {:?}",
            run.delta
        );
    }
    assert_eq!(r.flows().len(), 8, "four flows set up");

    let payload: Vec<u8> = (0..48u8).map(|i| i.wrapping_mul(37)).collect();
    // What the server got from the flows (and quotes in errors).
    let udp_wan = Ipv4::new(WAN, SERVER, Udp::new(40001, 53, b"query")).ttl(63);
    let tcp_wan = Ipv4::new(
        WAN,
        SERVER,
        Tcp::new(40000, 80, TCP_ACK | TCP_PSH).payload(&payload),
    )
    .ttl(63);
    let echo_wan = Ipv4::new(WAN, SERVER, Icmp::echo_request(ECHO_ID, 1, b"ping")).ttl(63);
    let nobody_wan = Ipv4::new(WAN, SERVER, Udp::new(33333, 53, b"x")).ttl(63);
    let err = |t: u8, c: u8, q: &[u8]| Ipv4::new(SERVER, WAN, Icmp::error(t, c, q));
    let udp0 = Udp::new(40001, 53, &payload).no_checksum();
    let lan = |name, ip: Ipv4| Base {
        name,
        from_lan: true,
        frame: env.client_sends(&ip),
    };
    let wan = |name, ip: Ipv4| Base {
        name,
        from_lan: false,
        frame: env.server_sends(&ip),
    };
    let mut bases = vec![
        lan(
            "LAN TCP data, flow",
            Ipv4::new(
                CLIENT,
                SERVER,
                Tcp::new(40000, 80, TCP_ACK | TCP_PSH).payload(&payload),
            ),
        ),
        lan(
            "LAN TCP SYN, new flow",
            Ipv4::new(
                CLIENT,
                SERVER,
                Tcp::new(40100, 443, TCP_SYN).options(&[2, 4, 5, 0xb4]),
            ),
        ),
        lan(
            "LAN TCP FIN, flow",
            Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_FIN | TCP_ACK)),
        ),
        lan(
            "LAN UDP, flow",
            Ipv4::new(CLIENT, SERVER, Udp::new(40001, 53, &payload)),
        ),
        lan("LAN UDP checksum 0, flow", Ipv4::new(CLIENT, SERVER, udp0)),
        lan(
            "LAN UDP, new flow",
            Ipv4::new(CLIENT, SERVER, Udp::new(40200, 123, &payload)),
        ),
        lan(
            "LAN echo request, flow",
            Ipv4::new(CLIENT, SERVER, Icmp::echo_request(ECHO_ID, 2, &payload)),
        ),
        lan(
            "LAN echo request, new id",
            Ipv4::new(CLIENT, SERVER, Icmp::echo_request(77, 1, &payload)),
        ),
        lan(
            "LAN answer of a port forward",
            Ipv4::new(CLIENT, SERVER, Tcp::new(80, 50000, TCP_SYN | TCP_ACK)),
        ),
        wan(
            "WAN TCP reply, flow",
            Ipv4::new(
                SERVER,
                WAN,
                Tcp::new(80, 40000, TCP_ACK | TCP_PSH).payload(&payload),
            ),
        ),
        wan(
            "WAN TCP, no flow",
            Ipv4::new(SERVER, WAN, Tcp::new(81, 40000, TCP_ACK).payload(&payload)),
        ),
        wan(
            "WAN UDP reply, flow",
            Ipv4::new(SERVER, WAN, Udp::new(53, 40001, &payload)),
        ),
        wan(
            "WAN UDP, no flow",
            Ipv4::new(SERVER, WAN, Udp::new(54, 40001, &payload)),
        ),
        wan(
            "WAN echo reply, flow",
            Ipv4::new(SERVER, WAN, Icmp::echo_reply(ECHO_ID, 2, &payload)),
        ),
        wan(
            "WAN echo reply, no flow",
            Ipv4::new(SERVER, WAN, Icmp::echo_reply(78, 2, &payload)),
        ),
        wan(
            "WAN SYN to a port forward",
            Ipv4::new(SERVER, WAN, Tcp::new(50001, 8080, TCP_SYN)),
        ),
        wan(
            "WAN UDP to a port forward",
            Ipv4::new(SERVER, WAN, Udp::new(50002, 5353, &payload)),
        ),
        wan(
            "WAN UDP to a port forward, no neighbour",
            Ipv4::new(SERVER, WAN, Udp::new(50003, 5354, &payload)),
        ),
        wan(
            "WAN port unreachable quoting the UDP flow",
            err(ICMP_DEST_UNREACH, 3, &udp_wan.bytes()),
        ),
        wan(
            "WAN fragmentation needed quoting the TCP flow",
            err(ICMP_DEST_UNREACH, 4, &tcp_wan.bytes()),
        ),
        wan(
            "WAN time exceeded quoting the echo flow",
            err(ICMP_TIME_EXCEEDED, 0, &echo_wan.bytes()),
        ),
        wan(
            "WAN parameter problem quoting 28 bytes of the TCP flow",
            err(ICMP_PARAMETER_PROBLEM, 0, &tcp_wan.bytes()[..28]),
        ),
        wan(
            "WAN port unreachable quoting no flow",
            err(ICMP_DEST_UNREACH, 3, &nobody_wan.bytes()),
        ),
    ];
    // VLAN-tagged copies of two frames (802.1Q tag after the MACs).
    for i in [0, 11] {
        let b = &bases[i];
        let mut f = b.frame[..12].to_vec();
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        f.extend_from_slice(&b.frame[12..]);
        let name = if b.from_lan {
            "LAN VLAN-tagged UDP"
        } else {
            "WAN VLAN-tagged UDP"
        };
        bases.push(Base {
            name,
            from_lan: b.from_lan,
            frame: f,
        });
    }
    for b in &bases {
        if is_ipv4(&b.frame) {
            frames::verify_checksums(&b.frame);
        }
    }
    bases
}

// ---------------------------------------------------------------------------
// Systematic corpus
// ---------------------------------------------------------------------------

/// Inserts `n` 4-byte NOP option words after the IPv4 header.
fn with_options(f: &[u8], words: usize) -> Vec<u8> {
    let mut v = f[..L4].to_vec();
    v.extend(std::iter::repeat_n(1u8, words * 4));
    v.extend_from_slice(&f[L4..]);
    v[IP] = 0x40 | u8::try_from(5 + words).unwrap();
    let l3 = v.len() - IP;
    set_total(&mut v, l3);
    fix_frame(&mut v, false);
    v
}

fn systematic(b: &Base) -> Vec<(String, Vec<u8>)> {
    let f = &b.frame;
    let mut v: Vec<(String, Vec<u8>)> = Vec::new();
    let patched = |g: &dyn Fn(&mut Vec<u8>), l4: bool| {
        let mut x = f.clone();
        g(&mut x);
        fix_frame(&mut x, l4);
        x
    };
    // Every truncation point, as cut off (total length now beyond the
    // frame) and as a shorter consistent packet.
    for len in frames::ETH_HLEN..f.len() {
        v.push((format!("cut to {len}"), f[..len].to_vec()));
        if is_ipv4(f) && len > L4 {
            v.push((
                format!("consistent cut to {len}"),
                consistent_truncation(f, len),
            ));
        }
    }
    if !is_ipv4(f) {
        return v;
    }
    let l3 = f.len() - IP;
    for ihl in 0..16u8 {
        v.push((
            format!("IHL {ihl}"),
            patched(&|x| x[IP] = 0x40 | ihl, false),
        ));
    }
    for version in [0u8, 5, 6, 15] {
        v.push((
            format!("version {version}"),
            patched(&|x| x[IP] = (version << 4) | 5, false),
        ));
    }
    for total in [
        0,
        1,
        19,
        20,
        21,
        27,
        28,
        39,
        40,
        55,
        56,
        65,
        66,
        l3 - 1,
        l3,
        l3 + 1,
        l3 + 100,
    ] {
        v.push((
            format!("total length {total} (frame {l3})"),
            patched(&|x| set_total(x, total), false),
        ));
    }
    v.push((
        "total length 65535".to_owned(),
        patched(&|x| set_total(x, 0xffff), false),
    ));
    if f[IP + 9] == IPPROTO_TCP {
        for doff in 0..16u8 {
            v.push((
                format!("TCP data offset {doff}"),
                patched(&|x| x[L4 + 12] = doff << 4, true),
            ));
        }
        for flags in [
            0,
            TCP_SYN,
            TCP_SYN | TCP_ACK,
            TCP_RST,
            TCP_SYN | TCP_FIN,
            0xff,
        ] {
            v.push((
                format!("TCP flags {flags:#04x}"),
                patched(&|x| x[L4 + 13] = flags, true),
            ));
        }
    }
    for (what, frag) in [
        ("first fragment (MF)", IP_MF),
        ("first fragment MF+DF", IP_MF | IP_DF),
        ("later fragment, offset 1", 1),
        ("last fragment, offset 0x1fff", 0x1fff),
        ("middle fragment", IP_MF | 0xb9),
        ("reserved flag", 0x8000),
        ("no DF", 0),
    ] {
        v.push((what.to_owned(), patched(&|x| put16(x, IP + 6, frag), false)));
    }
    for ttl in [0u8, 1, 2, 255] {
        v.push((format!("TTL {ttl}"), patched(&|x| x[IP + 8] = ttl, false)));
    }
    for words in [1, 2, 10] {
        v.push((format!("{words} option words"), with_options(f, words)));
    }
    for proto in [0u8, 2, 4, 41, 47, 50, 132, 255] {
        v.push((
            format!("protocol {proto}"),
            patched(&|x| x[IP + 9] = proto, false),
        ));
    }
    for a in ODD_ADDRS {
        v.push((
            format!("source {}", Ipv4Addr::from(a)),
            patched(&|x| put_addr(x, IP + 12, a), true),
        ));
        v.push((
            format!("destination {}", Ipv4Addr::from(a)),
            patched(&|x| put_addr(x, IP + 16, a), true),
        ));
    }
    // A frame longer than the packet (Ethernet padding).
    let mut padded = f.clone();
    padded.extend_from_slice(&[0xa5; 18]);
    v.push(("18 bytes of padding".to_owned(), padded));
    if f[IP + 9] == IPPROTO_ICMP && is_icmp_error_type(f[L4]) {
        for b in [0x44u8, 0x46, 0x55, 0x00] {
            v.push((
                format!("quoted version/IHL {b:#04x}"),
                patched(&|x| x[INNER_IP] = b, true),
            ));
        }
        for proto in [0u8, 1, 47] {
            v.push((
                format!("quoted protocol {proto}"),
                patched(&|x| x[INNER_IP + 9] = proto, true),
            ));
        }
        for t in [0u8, 3, 8, 13] {
            v.push((
                format!("quoted ICMP type {t}"),
                patched(&|x| x[INNER_L4] = t, true),
            ));
        }
        for code in [0u8, 1, 4, 13, 255] {
            v.push((format!("code {code}"), patched(&|x| x[L4 + 1] = code, true)));
        }
        v.push((
            "quoted ports swapped".to_owned(),
            patched(
                &|x| {
                    let (s, d) = (be16(x, INNER_L4), be16(x, INNER_L4 + 2));
                    put16(x, INNER_L4, d);
                    put16(x, INNER_L4 + 2, s);
                },
                true,
            ),
        ));
        v.push((
            "quoted source = client (already translated)".to_owned(),
            patched(&|x| put_addr(x, INNER_IP + 12, CLIENT), true),
        ));
    }
    v
}

/// Packets carrying a flow's tuple on the wrong interface: the LAN side's
/// tuple arriving on the WAN and the WAN side's on the LAN (spoofed).
fn wrong_side(env: &Env, r: &Router) -> Vec<(String, bool, Vec<u8>)> {
    let mut v = Vec::new();
    for (k, e) in r.flows() {
        // The interface this entry's packets arrive on: an original entry
        // of a masqueraded flow and a reply entry of a port forward on the
        // LAN, the others on the WAN.
        let lan_side = (e.flags & FLAG_ORIGINAL != 0) != (e.flags & FLAG_PORT_FORWARD != 0);
        let l4: tests::frames::L4 = match k.proto {
            IPPROTO_TCP => Tcp::new(k.src_port, k.dst_port, TCP_ACK)
                .payload(b"spoofed")
                .into(),
            IPPROTO_UDP => Udp::new(k.src_port, k.dst_port, b"spoofed").into(),
            _ => {
                if lan_side {
                    Icmp::echo_reply(k.src_port, 9, b"spoofed").into()
                } else {
                    Icmp::echo_request(k.src_port, 9, b"spoofed").into()
                }
            }
        };
        let ip = Ipv4::new(k.src_addr, k.dst_addr, l4);
        let from_lan = !lan_side;
        v.push((
            format!(
                "{} side tuple {}:{} -> {}:{} proto {} on the {}",
                if lan_side { "LAN" } else { "WAN" },
                Ipv4Addr::from(k.src_addr),
                k.src_port,
                Ipv4Addr::from(k.dst_addr),
                k.dst_port,
                k.proto,
                if from_lan { "LAN" } else { "WAN" }
            ),
            from_lan,
            env.sends(from_lan, &ip),
        ));
        if lan_side {
            // An ICMP error from the WAN quoting a packet a reply to which
            // would carry this LAN-side tuple.
            let quoted: tests::frames::L4 = match k.proto {
                IPPROTO_TCP => Tcp::new(k.dst_port, k.src_port, TCP_ACK).into(),
                IPPROTO_UDP => Udp::new(k.dst_port, k.src_port, b"q").into(),
                _ => Icmp::echo_request(k.src_port, 9, b"q").into(),
            };
            let q = Ipv4::new(k.dst_addr, k.src_addr, quoted).bytes();
            let ip = Ipv4::new(SERVER, WAN, Icmp::error(ICMP_DEST_UNREACH, 3, &q));
            v.push((
                format!(
                    "ICMP error from the WAN quoting the LAN side tuple {}:{} -> {}:{} proto {}",
                    Ipv4Addr::from(k.src_addr),
                    k.src_port,
                    Ipv4Addr::from(k.dst_addr),
                    k.dst_port,
                    k.proto
                ),
                false,
                env.server_sends(&ip),
            ));
        }
    }
    v
}

// ---------------------------------------------------------------------------
// Generated corpus
// ---------------------------------------------------------------------------

/// Applies one random mutation to `f`; returns its name.
fn mutate(rng: &mut Rng, f: &mut Vec<u8>) -> &'static str {
    const BYTES: [u8; 12] = [0, 1, 2, 5, 6, 8, 0x11, 0x40, 0x45, 0x7f, 0x80, 0xff];
    let len = f.len();
    match rng.below(12) {
        0 => {
            // One bit, mostly in the headers.
            let at = if rng.chance(5) {
                rng.below(len)
            } else {
                rng.below(len.min(90))
            };
            f[at] ^= 1 << rng.below(8);
            "bit flip"
        }
        1 => {
            let at = rng.below(len.min(90));
            f[at] = if rng.chance(2) {
                rng.pick(&BYTES)
            } else {
                rng.byte()
            };
            "byte"
        }
        2 => {
            let any = rng.byte();
            poke(
                f,
                IP,
                rng.pick(&[0x45, 0x44, 0x40, 0x46, 0x4f, 0x55, 0x65, 0x05, any]),
            );
            "version/IHL"
        }
        3 => {
            let l3 = len.saturating_sub(IP);
            let t = rng.pick(&[0, 19, 20, 28, 40, 56, 66, l3 - 1, l3, l3 + 1, 0xffff]);
            set_total(f, if rng.chance(4) { rng.u16().into() } else { t });
            "total length"
        }
        4 => {
            let any = rng.u16();
            let v = rng.pick(&[0, IP_DF, IP_MF, IP_MF | IP_DF, 1, 0x1fff, any]);
            put16(f, IP + 6, v);
            "fragment word"
        }
        5 => {
            let any = rng.byte();
            poke(f, IP + 8, rng.pick(&[0, 1, 2, 255, any]));
            if rng.chance(3) {
                poke(f, IP + 9, rng.pick(&[0, 1, 6, 17, 47, 132, 255]));
            }
            "TTL/protocol"
        }
        6 => {
            // TCP data offset/flags, or the ICMP type/code.
            if rng.chance(2) {
                let b = rng.byte() & 0xf0;
                poke(f, L4 + 12, b);
            } else {
                let flags = [
                    0,
                    TCP_SYN,
                    TCP_SYN | TCP_ACK,
                    TCP_ACK,
                    TCP_RST,
                    TCP_FIN | TCP_ACK,
                    TCP_SYN | TCP_FIN,
                    0xff,
                ];
                poke(f, L4 + 13, rng.pick(&flags));
                if f.get(IP + 9) == Some(&IPPROTO_ICMP) {
                    poke(f, L4, rng.pick(&[0, 3, 4, 5, 8, 11, 12, 13, 255]));
                    let code = rng.byte() & 0x0f;
                    poke(f, L4 + 1, code);
                }
            }
            "L4 header byte"
        }
        7 => {
            let p = if rng.chance(2) {
                rng.pick(&ODD_PORTS)
            } else {
                rng.u16()
            };
            let at = rng.pick(&[L4, L4 + 2, L4 + 4, INNER_L4, INNER_L4 + 2, INNER_L4 + 4]);
            put16(f, at, p);
            "port/identifier"
        }
        8 => {
            let a = rng.pick(&ODD_ADDRS);
            let at = rng.pick(&[IP + 12, IP + 16, INNER_IP + 12, INNER_IP + 16]);
            put_addr(f, at, a);
            "address"
        }
        9 => {
            f.truncate(frames::ETH_HLEN + rng.below(len - frames::ETH_HLEN));
            "truncated"
        }
        10 => {
            let n = frames::ETH_HLEN + rng.below(len - frames::ETH_HLEN);
            *f = consistent_truncation(f, n.max(frames::ETH_HLEN));
            "consistent truncation"
        }
        _ => {
            let n = 1 + rng.below(64);
            for _ in 0..n {
                f.push(rng.byte());
            }
            if rng.chance(2) {
                let l3 = f.len() - IP;
                set_total(f, l3);
            }
            "extended"
        }
    }
}

fn generated(rng: &mut Rng, bases: &[Base]) -> (String, bool, Vec<u8>) {
    let b = &bases[rng.below(bases.len())];
    let mut f = b.frame.clone();
    let mut names = Vec::new();
    for _ in 0..=rng.below(3) {
        if f.len() <= frames::ETH_HLEN + 1 {
            break;
        }
        names.push(mutate(rng, &mut f));
    }
    // Outer IPv4 header checksum always fixed; L4 checksums (inner first)
    // in half of the cases, else left as the mutation made them.
    let l4 = rng.chance(2);
    fix_frame(&mut f, l4);
    let what = format!(
        "{}: {} ({})",
        b.name,
        names.join(", "),
        if l4 {
            "checksums fixed"
        } else {
            "L4 checksums as mutated"
        }
    );
    (what, b.from_lan, f)
}

/// Every entry has its peer, the peer points back, and the two entries'
/// translations are each other's reverse.
fn table_consistent(r: &Router) -> Vec<String> {
    let flows = r.flows();
    let mut errs = Vec::new();
    for (k, e) in &flows {
        let Some(p) = flows.get(&e.peer) else {
            errs.push(format!("{k:?}: peer {:?} missing", e.peer));
            continue;
        };
        let translated = FlowKey::new(
            e.new_src_addr,
            e.new_dst_addr,
            e.new_src_port,
            e.new_dst_port,
            k.proto,
        );
        let back = FlowKey::new(
            p.new_src_addr,
            p.new_dst_addr,
            p.new_src_port,
            p.new_dst_port,
            k.proto,
        );
        if p.peer != *k
            || e.peer != translated.reversed()
            || back != k.reversed()
            || (e.flags ^ p.flags) & FLAG_ORIGINAL == 0
            || e.state != p.state
        {
            errs.push(format!("{k:?} {e:?} <-> {p:?} disagree"));
        }
        if e.flags & FLAG_ORIGINAL != 0 && e.flags & FLAG_PORT_FORWARD != 0 {
            let rule = r.rule(k.proto, k.dst_port);
            if k.dst_addr != WAN
                || rule.is_none_or(|t| (t.addr, t.port) != (e.new_dst_addr, e.new_dst_port))
            {
                errs.push(format!("port-forward flow {k:?} {e:?} without its rule"));
            }
        }
        if e.flags & FLAG_ORIGINAL != 0 && e.flags & FLAG_PORT_FORWARD == 0 && e.new_src_addr != WAN
        {
            errs.push(format!(
                "masqueraded flow {k:?} not to the WAN address: {e:?}"
            ));
        }
    }
    errs
}

fn report(what: &str, s: &Summary) {
    if s.failures.is_empty() {
        return;
    }
    let shown: Vec<String> = s.failures.iter().take(15).cloned().collect();
    panic!(
        "{what}: {} of {} cases failed; first ones:\n{}",
        s.failures.len(),
        s.cases,
        shown.join("\n")
    );
}

/// The systematic and the generated corpus through one loaded program.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn malformed_and_mutated_frames_keep_the_invariants() {
    let env = Env::new();
    let (lan, wan) = (env.lan, env.wan);
    env.t.in_ns(Ns::Router, || {
        let started = Instant::now();
        let mut r = Router::load(lan, wan);
        r.config.set(0, env.config(), 0).unwrap();
        let bases = setup(&env, &mut r);

        let mut sys = Summary::default();
        for b in &bases {
            for (what, f) in systematic(b) {
                case(
                    &env,
                    &r,
                    &format!("{}: {what}", b.name),
                    &f,
                    b.from_lan,
                    &mut sys,
                );
            }
        }
        let mut gen_ = Summary::default();
        let mut rng = Rng::new(RNG_SEED);
        for _ in 0..GENERATED {
            let (what, from_lan, f) = generated(&mut rng, &bases);
            case(&env, &r, &what, &f, from_lan, &mut gen_);
        }
        let elapsed = started.elapsed();
        let table_errs = table_consistent(&r);
        let flows = r.flows().len();

        println!("{}", sys.table("### Systematic corpus"));
        println!(
            "{}",
            gen_.table(&format!(
                "### Generated corpus ({GENERATED} cases, seed {RNG_SEED:#x})"
            ))
        );
        let mut all = Summary::default();
        all.merge(sys);
        all.merge(gen_);
        println!("{}", all.table("### Both"));
        println!(
            "{} cases in {:.1} s; {} CONNTRACK entries at the end",
            all.cases,
            elapsed.as_secs_f64(),
            flows
        );
        report("corpus", &all);
        assert!(
            table_errs.is_empty(),
            "CONNTRACK inconsistent after the corpus: {table_errs:#?}"
        );
    });
}

/// A flow's tuple arriving on the other interface (a WAN host sending
/// with the LAN host's address as source, or a LAN host with the server's
/// address and the router's WAN address as destination) is not the flow:
/// it must not be translated and forwarded.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn spoofed_tuples_from_the_wrong_side_are_not_forwarded() {
    let env = Env::new();
    let (lan, wan) = (env.lan, env.wan);
    env.t.in_ns(Ns::Router, || {
        let mut r = Router::load(lan, wan);
        r.config.set(0, env.config(), 0).unwrap();
        let _ = setup(&env, &mut r);
        let mut bad = Vec::new();
        for (what, from_lan, f) in wrong_side(&env, &r) {
            let run = r.run(&f, if from_lan { lan } else { wan });
            println!("{what}: {} {:?}", verdict_name(run.verdict), run.delta);
            if run.verdict == XDP_REDIRECT || run.out != f {
                bad.push(format!(
                    "{what}: {} {:?}\n  input  {:02x?}\n  output {:02x?}",
                    verdict_name(run.verdict),
                    run.delta,
                    f,
                    run.out
                ));
            }
        }
        assert!(
            bad.is_empty(),
            "spoofed wrong-side tuples were translated:\n{}",
            bad.join("\n")
        );
    });
}

/// RFC 1812 5.2.2: a router must verify the IPv4 header checksum and
/// discard packets whose checksum is wrong. The fast path must not
/// translate and forward them (dropping or passing them to the kernel,
/// which drops them, are both fine).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn bad_ipv4_header_checksum_is_not_forwarded() {
    let env = Env::new();
    let (lan, wan) = (env.lan, env.wan);
    env.t.in_ns(Ns::Router, || {
        let mut r = Router::load(lan, wan);
        r.config.set(0, env.config(), 0).unwrap();
        let bases = setup(&env, &mut r);
        let mut bad = Vec::new();
        let mut tried = 0;
        for b in bases.iter().filter(|b| is_ipv4(&b.frame)) {
            for delta in [1u16, 0x100, 0x8000] {
                let mut f = b.frame.clone();
                let c = be16(&f, IP + 10).wrapping_add(delta);
                put16(&mut f, IP + 10, c);
                tried += 1;
                let run = r.run(&f, if b.from_lan { lan } else { wan });
                if run.verdict == XDP_REDIRECT || run.out != f {
                    bad.push(format!(
                        "{} (IPv4 checksum + {delta:#x}): {} {:?}\n  input  {:02x?}",
                        b.name,
                        verdict_name(run.verdict),
                        run.delta,
                        f
                    ));
                }
            }
        }
        assert!(
            bad.is_empty(),
            "{} of {tried} frames with a wrong IPv4 header checksum were forwarded:\n{}",
            bad.len(),
            bad.join("\n")
        );
    });
}

/// The checker itself (no root needed): residuals survive a correct
/// incremental rewrite, also of a frame whose UDP checksum is corrupt, and
/// change when a rewrite forgets the checksum; the model's order of checks.
#[test]
fn checker_self_test() {
    use router_common::nat::{rewrite_addrs, rewrite_udp};
    let ip = Ipv4::new(CLIENT, SERVER, Udp::new(40001, 53, b"some payload"));
    let good = Frame::new([2; 6], [4; 6], ip).bytes();
    for corrupt in [false, true] {
        let mut f = good.clone();
        if corrupt {
            f[L4 + 9] ^= 0x40; // payload byte: UDP checksum now wrong
        }
        let mut out = f.clone();
        let hdr: &mut [u8; 20] = (&mut out[IP..L4]).try_into().unwrap();
        let pseudo = rewrite_addrs(hdr, WAN, SERVER);
        let udp: &mut [u8; 8] = (&mut out[L4..L4 + 8]).try_into().unwrap();
        rewrite_udp(udp, pseudo, 20000, 53);
        assert_eq!(
            frame_residuals(&f),
            frame_residuals(&out),
            "corrupt: {corrupt}"
        );
        assert_eq!(frames::checksum_errors(&out).is_empty(), !corrupt);
        // Forgetting the UDP checksum is caught.
        let mut sloppy = out.clone();
        put16(&mut sloppy, L4, 20001);
        assert_ne!(frame_residuals(&f), frame_residuals(&sloppy));
    }
    assert!(may_change(&good, L4 + 6, false) && !may_change(&good, L4 + 4, false));
    assert_eq!(model(&good, true), Stage::Lookup);
    assert_eq!(
        model(&good[..20], true),
        Stage::Exactly(Counter::DropTruncated)
    );
    let mut ihl4 = good.clone();
    ihl4[IP] = 0x44;
    ihl4[IP + 8] = 1;
    assert_eq!(model(&ihl4, true), Stage::Exactly(Counter::DropMalformed));
    let mut ttl1 = good.clone();
    ttl1[IP + 8] = 1;
    assert_eq!(model(&ttl1, true), Stage::Exactly(Counter::PassTtlExceeded));
    let mut rng = Rng::new(RNG_SEED);
    let first: Vec<u64> = (0..3).map(|_| rng.next()).collect();
    let mut again = Rng::new(RNG_SEED);
    assert_eq!(first, (0..3).map(|_| again.next()).collect::<Vec<_>>());
}
