//! The malformed and mutated corpus over IPv6 seeds: the same kinds of
//! mutation as for IPv4 (truncation at every byte, payload lengths around
//! the frame and every header's minimum, version, hop limit 0/1/2/255,
//! every extension header kind and whole extension header chains, cut
//! ones too, TCP data offsets, link-scope, multicast, unspecified and
//! IPv4-mapped addresses, trailing padding, `ICMPv6` errors quoting ever shorter
//! packets) plus seeded random mutations, through one program in
//! standalone mode with established TCP, UDP, echo and pinhole flows.
//!
//! For every case: the verdict is `XDP_PASS`, `XDP_DROP` or
//! `XDP_REDIRECT`; exactly one verdict counter moved, by one packet and the
//! frame's bytes, and its kind matches the verdict; an independent model of
//! the IPv6 checks (docs/architecture.md "IPv6" table, in order) predicts the counter of
//! every packet the parse decides, and for the rest (flow lookup,
//! admission) the counter is one the flow phases may give; a passed or
//! dropped frame leaves untouched; a redirected one differs from the input
//! only in its MACs (the egress pair of the interface its counter names)
//! and the hop limit, one less (IPv6 is routed: nothing a checksum covers
//! changes), except a SYN's MSS above the corpus's clamp, lowered to it
//! with its TCP checksum still valid and `tcp_mss_clamped` counted (a
//! passed-translated SYN without a neighbour likewise); new-flow and `ICMPv6`-error events only with a verdict that
//! allows them. At the end every `CONNTRACK6` entry has its reversed peer
//! and the two agree.

use aya::maps::HashMap as BpfHash;
use router_common::ipv6::IPPROTO_ICMPV6;
use router_common::maps::{
    Admit, CONNTRACK6_MAP, FlowEntry6, FlowKey6, PINHOLES6_MAP, PinholeKey6,
};
use tests::v6::{
    self, CLIENT6, ICMP6_PACKET_TOO_BIG, LAN_NOBODY6, ROUTER_LAN6, ROUTER_WAN6, SERVER6,
    checksum_errors6, o,
};

use super::*;

const ETH: usize = 14;
const IP6: usize = ETH;
const L4_6: usize = IP6 + 40;
/// Generated IPv6 cases.
const GENERATED6: usize = 4000;
const RNG_SEED6: u64 = 0x00c0_ffee_5eed_0066;

/// A valid frame the mutations start from.
struct Seed6 {
    name: &'static str,
    frame: Vec<u8>,
    from_lan: bool,
}

/// What the model expects of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect6 {
    /// The parse decides: exactly this counter.
    Exactly(Counter),
    /// The flow phases decide (lookup, admission, next hop).
    FlowPhases,
    /// One of these, by whether the packet belongs to a live flow (a first
    /// fragment from the WAN: passed if its header is a known flow's).
    EitherOf(Counter, Counter),
}

/// [`parse_model6`], then standalone mode's inbound filter as
/// docs/architecture.md ("IPv6") states it: from the WAN, what the parse passes without a flow
/// (extension headers but ESP and AH, MLD, other protocols and `ICMPv6`
/// types, frames not to the router's MAC but what a known flow or a pinhole
/// lets in) is dropped when addressed to a LAN host (the LAN prefix, not the
/// router's own address there); a fragment passes when it is a later one
/// or `IPsec`'s, a first one of TCP, UDP or an echo reply when its flow is
/// known.
fn model6(f: &[u8], from_lan: bool, own_mac: [u8; 6]) -> Expect6 {
    let e = parse_model6(f, from_lan, own_mac);
    let Expect6::Exactly(c) = e else {
        return e;
    };
    if from_lan {
        return lan_policy6(f, c);
    }
    let passed_without_a_flow = matches!(
        c,
        Counter::Pass6ExtHopByHop
            | Counter::Pass6ExtRouting
            | Counter::Pass6ExtFragment
            | Counter::Pass6ExtDestOpts
            | Counter::Pass6ExtOther
            | Counter::Pass6Mld
            | Counter::PassProtocol
            | Counter::PassNotForUs
    );
    let to_lan_host = f
        .get(IP6 + 24..IP6 + 40)
        .is_some_and(|dst| dst[..8] == LAN6_PREFIX && dst != tests::v6::ROUTER_LAN6.octets());
    if !(!from_lan && passed_without_a_flow && to_lan_host) {
        return e;
    }
    if c == Counter::PassNotForUs {
        // Judged too (a macvlan on the WAN would take it in), but what the
        // untagged path lets in passes: a known flow's TCP or UDP reply (or
        // one to a pinhole), echo reply or error about it.
        return if matches!(f.get(IP6 + 6), Some(6 | 17 | 58)) {
            Expect6::EitherOf(c, Counter::Drop6Unsolicited)
        } else {
            Expect6::Exactly(Counter::Drop6Unsolicited)
        };
    }
    if c == Counter::Pass6ExtFragment {
        // The Fragment header right after the fixed one and 8 bytes after
        // it: a later fragment passes (it has no header to judge), a first
        // one of TCP, UDP or an echo reply if its tuple is a flow's.
        let l4 = IP6 + 40;
        if let Some(frag) = f.get(l4..l4 + 8) {
            if be16(frag, 2) & 0xfff8 != 0 || matches!(frag[0], 50 | 51) {
                return e;
            }
            if let Some(next) = f.get(l4 + 8..l4 + 16)
                && (matches!(frag[0], 6 | 17) || frag[0] == 58 && next[0] == 129)
            {
                return Expect6::EitherOf(c, Counter::Drop6Unsolicited);
            }
        }
    }
    Expect6::Exactly(Counter::Drop6Unsolicited)
}

/// Standalone mode's source check of what the parse passes from the LAN
/// (docs/architecture.md "IPv6" table, BCP 38): a source outside the LAN prefix, or the
/// router's own LAN address, is dropped (`drop6_spoofed_source`), also
/// one for the router itself; link scope and the packets of flows are
/// left alone.
fn lan_policy6(f: &[u8], c: Counter) -> Expect6 {
    let exempt = matches!(
        c,
        Counter::Pass6LinkScope
            | Counter::PassNoNeighbour
            | Counter::Pass6PacketTooBig
            | Counter::PassNotConfigured
    ) || !c.name().starts_with("pass");
    let lan_source = f
        .get(IP6 + 8..IP6 + 24)
        .is_some_and(|src| src[..8] == LAN6_PREFIX && src != tests::v6::ROUTER_LAN6.octets());
    // A destination no one routes (loopback, unspecified, IPv4-mapped,
    // multicast): the kernel drops it, the source is not asked.
    let unroutable = f.get(IP6 + 24..IP6 + 40).is_some_and(|d| {
        d[0] == 0xff
            || d[..15].iter().all(|&b| b == 0) && d[15] <= 1
            || d[..10].iter().all(|&b| b == 0) && d[10..12] == [0xff, 0xff]
    });
    if exempt || lan_source || c == Counter::PassFibNotForwarded && unroutable {
        Expect6::Exactly(c)
    } else {
        Expect6::Exactly(Counter::Drop6SpoofedSource)
    }
}

/// The LAN's IPv6 /64 (`tests::v6::LAN_PREFIX6`).
const LAN6_PREFIX: [u8; 8] = [0x20, 0x01, 0x0d, 0xb8, 0, 0x50, 0, 0];

/// The IPv6 checks in the order of docs/architecture.md "IPv6", written from the table, not
/// from the program: frame, version and lengths, scope, extension headers,
/// hop limit, the Ethernet destination (`own_mac`: the ingress
/// interface's), then the L4 header by protocol.
fn parse_model6(f: &[u8], from_lan: bool, own_mac: [u8; 6]) -> Expect6 {
    use Expect6::{Exactly, FlowPhases};
    if f.len() < L4_6 {
        return Exactly(Counter::DropTruncated);
    }
    let ip = &f[IP6..];
    let plen = usize::from(be16(ip, 4));
    if ip[0] >> 4 != 6 || 40 + plen > ip.len() {
        return Exactly(Counter::DropMalformed);
    }
    let (src, dst) = (&ip[8..24], &ip[24..40]);
    let link_local = |a: &[u8]| a[0] == 0xfe && a[1] & 0xc0 == 0x80;
    if link_local(src) || src.iter().all(|&b| b == 0) || link_local(dst) || dst[0] == 0xff {
        return Exactly(Counter::Pass6LinkScope);
    }
    let mapped = |a: &[u8]| a[..10].iter().all(|&b| b == 0) && a[10..12] == [0xff, 0xff];
    if dst.iter().all(|&b| b == 0) || mapped(src) || mapped(dst) {
        return Exactly(Counter::PassFibNotForwarded);
    }
    let ext = match ip[6] {
        0 => Some(Counter::Pass6ExtHopByHop),
        43 => Some(Counter::Pass6ExtRouting),
        44 => Some(Counter::Pass6ExtFragment),
        60 => Some(Counter::Pass6ExtDestOpts),
        50 => Some(Counter::Pass6ExtEsp),
        51 => Some(Counter::Pass6ExtAh),
        135 | 139 | 140 | 253 | 254 => Some(Counter::Pass6ExtOther),
        _ => None,
    };
    if let Some(c) = ext {
        return Exactly(c);
    }
    if ip[7] <= 1 {
        return Exactly(Counter::Pass6HopLimit);
    }
    if f[..6] != own_mac {
        return Exactly(Counter::PassNotForUs);
    }
    let l4 = &ip[40..];
    match ip[6] {
        6 => {
            let off = usize::from(l4.get(12).copied().unwrap_or(0) >> 4) * 4;
            if plen < 20 || off < 20 || off > plen {
                return Exactly(Counter::DropMalformed);
            }
            FlowPhases
        }
        17 | 58 if plen < 8 => Exactly(Counter::DropMalformed),
        17 => FlowPhases,
        58 => match (l4[0], from_lan) {
            // Echo request out, echo reply in; errors in: types 1-99 and
            // 102-126 (as `icmp6_kind`).
            (128, _) | (129 | 1..=99 | 102..=126, false) => FlowPhases,
            (133..=137, _) => Exactly(Counter::Pass6Ndp),
            (130..=132 | 143, _) => Exactly(Counter::Pass6Mld),
            _ => Exactly(Counter::PassProtocol),
        },
        _ => Exactly(Counter::PassProtocol),
    }
}

/// What is wrong with verdict counter `c` for frame `f` by [`model6`].
fn against_the_model(f: &[u8], from_lan: bool, own_mac: [u8; 6], c: Counter) -> Option<String> {
    let name = c.name();
    match model6(f, from_lan, own_mac) {
        Expect6::Exactly(want) if want != c => {
            Some(format!("model says {}, got {name}", want.name()))
        }
        Expect6::EitherOf(a, b) if c != a && c != b => Some(format!(
            "model says {} or {}, got {name}",
            a.name(),
            b.name()
        )),
        Expect6::FlowPhases if parse_only(c) => {
            Some(format!("the flow phases' packet got the parse's {name}"))
        }
        _ => None,
    }
}

/// Counters only the parse gives: never the flow phases'.
fn parse_only(c: Counter) -> bool {
    matches!(
        c,
        Counter::DropTruncated
            | Counter::DropMalformed
            | Counter::Pass6LinkScope
            | Counter::Pass6ExtHopByHop
            | Counter::Pass6ExtRouting
            | Counter::Pass6ExtFragment
            | Counter::Pass6ExtDestOpts
            | Counter::Pass6ExtEsp
            | Counter::Pass6ExtAh
            | Counter::Pass6ExtOther
            | Counter::Pass6HopLimit
            | Counter::Pass6Ndp
            | Counter::Pass6Mld
            | Counter::PassNotForUs
    )
}

fn set_plen(f: &mut [u8], v: u16) {
    put16(f, IP6 + 4, v);
}

fn plen(f: &[u8]) -> u16 {
    be16(f, IP6 + 4)
}

/// `f` with an extension header chain (`kinds`, each 8 bytes, the last
/// naming the original next header) inserted after the fixed header, the
/// payload length grown to match.
fn with_chain(f: &[u8], kinds: &[u8]) -> Vec<u8> {
    let mut out = f[..L4_6].to_vec();
    let orig_next = f[IP6 + 6];
    out[IP6 + 6] = kinds[0];
    for (i, _) in kinds.iter().enumerate() {
        let next = kinds.get(i + 1).copied().unwrap_or(orig_next);
        // Next header, length 0 (8 bytes), then PadN-style zeros; for a
        // fragment header the same 8 bytes read as offset 0, no M flag.
        out.extend_from_slice(&[next, 0, 0, 0, 0, 0, 0, 0]);
    }
    out.extend_from_slice(&f[L4_6..]);
    let grown = plen(f) + 8 * u16::try_from(kinds.len()).unwrap();
    set_plen(&mut out, grown);
    out
}

/// Every systematic mutation of one seed, named.
#[expect(
    clippy::too_many_lines,
    reason = "one list of mutation kinds, read top to bottom"
)]
fn systematic6(s: &Seed6) -> Vec<(String, Vec<u8>)> {
    let f = &s.frame;
    let mut out = Vec::new();
    let mut push = |what: String, g: Vec<u8>| out.push((what, g));
    // Every truncation point from the Ethernet header on (BPF_PROG_RUN
    // refuses a shorter XDP frame), as cut off and as a consistent cut
    // (payload length fitted to what is left).
    for cut in ETH..f.len() {
        push(format!("cut at {cut}"), f[..cut].to_vec());
        if cut >= L4_6 {
            let mut g = f[..cut].to_vec();
            set_plen(&mut g, u16::try_from(cut - L4_6).unwrap());
            push(format!("consistent cut at {cut}"), g);
        }
    }
    let actual = plen(f);
    let room = u16::try_from(f.len() - L4_6).unwrap();
    for v in [0, 1, 7, 8, 19, 20, 47, 48, 56, 63, 64] {
        let mut g = f.clone();
        set_plen(&mut g, v);
        push(format!("payload length {v}"), g);
    }
    for v in [
        actual.wrapping_sub(1),
        actual + 1,
        room,
        room + 1,
        0x7fff,
        0xffff,
    ] {
        let mut g = f.clone();
        set_plen(&mut g, v);
        push(format!("payload length {v} (actual {actual})"), g);
    }
    for pad in [1, 2, 7, 8, 64] {
        let mut g = f.clone();
        g.extend(std::iter::repeat_n(0xa5, pad));
        push(format!("{pad} bytes of trailing padding"), g);
    }
    for version in [0u8, 4, 5, 7, 15] {
        let mut g = f.clone();
        g[IP6] = (version << 4) | (g[IP6] & 0x0f);
        push(format!("version {version}"), g);
    }
    for hl in [0u8, 1, 2, 255] {
        let mut g = f.clone();
        g[IP6 + 7] = hl;
        push(format!("hop limit {hl}"), g);
    }
    for next in [
        0u8, 43, 44, 60, 50, 51, 135, 139, 140, 253, 254, 59, 132, 47, 4, 41,
    ] {
        let mut g = f.clone();
        g[IP6 + 6] = next;
        push(format!("next header {next}"), g);
    }
    for chain in [
        &[0u8][..],
        &[0, 43, 44],
        &[60, 43, 44, 60],
        &[44],
        &[51, 60],
        &[0, 0],
    ] {
        let g = with_chain(f, chain);
        for cut in [
            L4_6 + 1,
            L4_6 + 8,
            L4_6 + 8 * chain.len() - 1,
            L4_6 + 8 * chain.len() + 3,
        ] {
            let mut short = g.clone();
            short.truncate(cut.min(g.len()));
            push(format!("chain {chain:?} cut at {cut}"), short);
        }
        let mut lying = g.clone();
        set_plen(&mut lying, 4);
        push(format!("chain {chain:?}, payload length 4"), lying);
        push(format!("chain {chain:?}"), g);
    }
    if f[IP6 + 6] == IPPROTO_TCP {
        for off in 0u8..16 {
            let mut g = f.clone();
            g[L4_6 + 12] = (off << 4) | (g[L4_6 + 12] & 0x0f);
            push(format!("TCP data offset {off}"), g);
        }
        for flags in [0u8, TCP_SYN, TCP_FIN, TCP_RST, TCP_SYN | TCP_FIN, 0xff] {
            let mut g = f.clone();
            g[L4_6 + 13] = flags;
            push(format!("TCP flags {flags:#04x}"), g);
        }
    }
    if f[IP6 + 6] == IPPROTO_ICMPV6 {
        for ty in [
            0u8, 1, 2, 3, 4, 127, 128, 129, 130, 133, 134, 135, 136, 137, 143, 200, 255,
        ] {
            let mut g = f.clone();
            g[L4_6] = ty;
            push(format!("ICMPv6 type {ty}"), g);
        }
    }
    let odd: [(&str, [u8; 16]); 9] = [
        (
            "link-local",
            [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7],
        ),
        (
            "fec0 (not link-local)",
            [0xfe, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7],
        ),
        ("unspecified", [0; 16]),
        (
            "multicast",
            [0xff, 0x0e, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        ),
        ("loopback", [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]),
        (
            "IPv4-mapped",
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 51, 100, 1],
        ),
        ("router LAN", o(ROUTER_LAN6)),
        ("router WAN", o(ROUTER_WAN6)),
        ("LAN nobody", o(LAN_NOBODY6)),
    ];
    for (name, a) in odd {
        for (field, at) in [("source", IP6 + 8), ("destination", IP6 + 24)] {
            let mut g = f.clone();
            g[at..at + 16].copy_from_slice(&a);
            push(format!("{field} {name}"), g);
        }
    }
    out
}

/// Builds the seeds and opens their flows through the program itself.
#[expect(
    clippy::too_many_lines,
    reason = "the flows, then the seeds, one per line"
)]
fn setup6(env: &ResolvedTopology, r: &mut LoadedRouter) -> Vec<Seed6> {
    let (c, s) = (o(CLIENT6), o(SERVER6));
    let lan_frame = |p: &v6::Ipv6| p.frame(env.lan_mac, env.client_mac);
    let wan_frame = |p: &v6::Ipv6| p.frame(env.wan_mac, env.server_mac);
    // Pinhole for the WAN-opened flow.
    {
        let mut holes: BpfHash<_, PinholeKey6, u8> =
            BpfHash::try_from(r.ebpf.map_mut(PINHOLES6_MAP).expect("PINHOLES6")).unwrap();
        let k = PinholeKey6 {
            addr: c,
            port: 2222,
            proto: IPPROTO_TCP,
            pad: 0,
        };
        holes.insert(k, 1, 0).unwrap();
    }
    // MSS 1440, SACK permitted, window scale: the clamp walks them.
    let syn = v6::Ipv6::tcp(
        c,
        s,
        &Tcp::new(40000, 443, TCP_SYN).options(&[2, 4, 5, 0xa0, 4, 2, 1, 1, 1, 3, 3, 7]),
    );
    let syn_ack = v6::Ipv6::tcp(s, c, &Tcp::new(443, 40000, TCP_SYN | TCP_ACK));
    let udp_out = v6::Ipv6::udp(c, s, &Udp::new(5353, 53, b"a question"));
    let echo = v6::Ipv6::echo(c, s, false, 1911, 1);
    let in_syn = v6::Ipv6::tcp(s, c, &Tcp::new(50000, 2222, TCP_SYN));
    for (p, lan) in [
        (&syn, true),
        (&syn_ack, false),
        (&udp_out, true),
        (&echo, true),
        (&in_syn, false),
    ] {
        let (f, ifx) = if lan {
            (lan_frame(p), env.lan)
        } else {
            (wan_frame(p), env.wan)
        };
        let run = r.test_run(&f, ifx);
        assert_eq!(run.verdict, XDP_REDIRECT, "setup: {:?}", run.delta);
    }
    let data_out = v6::Ipv6::tcp(
        c,
        s,
        &Tcp::new(40000, 443, TCP_ACK | TCP_PSH).payload(b"GET / HTTP/1.1\r\n\r\n"),
    );
    let data_in = v6::Ipv6::tcp(s, c, &Tcp::new(443, 40000, TCP_ACK).payload(&[0x5a; 100]));
    let udp_in = v6::Ipv6::udp(s, c, &Udp::new(53, 5353, b"an answer"));
    let echo_reply = v6::Ipv6::echo(s, c, true, 1911, 1);
    let pinhole_ack = v6::Ipv6::tcp(c, s, &Tcp::new(2222, 50000, TCP_ACK).payload(b"x"));
    let new_udp = v6::Ipv6::udp(c, s, &Udp::new(6000, 6001, b"new flow"));
    let unsolicited = v6::Ipv6::udp(s, c, &Udp::new(7000, 7001, b"nobody asked"));
    // A Packet Too Big quoting the client's TCP segment (as a hop beyond
    // the router sends it, from the server's side here).
    let quoted = data_out.bytes();
    let ptb = v6::Ipv6::error(
        s,
        c,
        ICMP6_PACKET_TOO_BIG,
        1280,
        &quoted[..quoted.len().min(1184)],
    );
    vec![
        Seed6 {
            name: "tcp SYN out again (MSS clamped)",
            frame: lan_frame(&syn),
            from_lan: true,
        },
        Seed6 {
            name: "tcp data out",
            frame: lan_frame(&data_out),
            from_lan: true,
        },
        Seed6 {
            name: "tcp data in",
            frame: wan_frame(&data_in),
            from_lan: false,
        },
        Seed6 {
            name: "udp out",
            frame: lan_frame(&udp_out),
            from_lan: true,
        },
        Seed6 {
            name: "udp in",
            frame: wan_frame(&udp_in),
            from_lan: false,
        },
        Seed6 {
            name: "echo request out",
            frame: lan_frame(&echo),
            from_lan: true,
        },
        Seed6 {
            name: "echo reply in",
            frame: wan_frame(&echo_reply),
            from_lan: false,
        },
        Seed6 {
            name: "pinhole flow out",
            frame: lan_frame(&pinhole_ack),
            from_lan: true,
        },
        Seed6 {
            name: "new udp out",
            frame: lan_frame(&new_udp),
            from_lan: true,
        },
        Seed6 {
            name: "unsolicited udp in",
            frame: wan_frame(&unsolicited),
            from_lan: false,
        },
        Seed6 {
            name: "packet too big in",
            frame: wan_frame(&ptb),
            from_lan: false,
        },
    ]
}

/// One random mutation of a seed.
fn generated6(rng: &mut SplitMix64, seeds: &[Seed6]) -> (String, bool, Vec<u8>) {
    let s = &seeds[rng.below(seeds.len())];
    let mut f = s.frame.clone();
    let mut what = vec![s.name.to_owned()];
    for _ in 0..=rng.below(3) {
        match rng.below(7) {
            // The Ethernet header stays: an Ethernet type other than
            // IPv6's is the IPv4 corpus' business.
            0 if f.len() > IP6 => {
                let at = IP6 + rng.below(f.len().min(120) - IP6);
                let v = rng.byte();
                what.push(format!("byte {at} = {v:#04x}"));
                f[at] = v;
            }
            1 if f.len() >= L4_6 => {
                let at = IP6 + rng.below(40);
                let bit = rng.below(8);
                what.push(format!("flip bit {bit} of byte {at}"));
                f[at] ^= 1 << bit;
            }
            2 => {
                let cut = ETH + rng.below(f.len() - ETH + 1);
                what.push(format!("cut at {cut}"));
                f.truncate(cut);
            }
            3 if f.len() >= L4_6 => {
                let v = rng.u16() % 256;
                what.push(format!("payload length {v}"));
                set_plen(&mut f, v);
            }
            4 if f.len() >= L4_6 => {
                let v = rng.pick(&[0u8, 6, 17, 43, 44, 50, 51, 58, 59, 60, 135, 253]);
                what.push(format!("next header {v}"));
                f[IP6 + 6] = v;
            }
            5 if f.len() > L4_6 + 4 => {
                let at = L4_6 + rng.below((f.len() - L4_6).min(48));
                let v = rng.byte();
                what.push(format!("L4 byte {} = {v:#04x}", at - L4_6));
                f[at] = v;
            }
            _ if f.len() >= L4_6 => {
                let v = rng.pick(&[0u8, 1, 2, 64, 255]);
                what.push(format!("hop limit {v}"));
                f[IP6 + 7] = v;
            }
            _ => {}
        }
    }
    (what.join(", "), s.from_lan, f)
}

/// Runs one case and checks every invariant; failures go to `s`.
fn case6(
    env: &ResolvedTopology,
    r: &LoadedRouter,
    what: &str,
    f: &[u8],
    from_lan: bool,
    s: &mut Summary,
) {
    let run = r.test_run(f, if from_lan { env.lan } else { env.wan });
    let mut errs = Vec::new();
    let verdicts: Vec<&(Counter, CounterValue)> =
        run.delta.iter().filter(|(c, _)| !c.is_event()).collect();
    let counter = if let [(c, v)] = verdicts.as_slice() {
        if (v.packets, v.bytes) != (1, f.len() as u64) {
            errs.push(format!("{} moved by {v:?}", c.name()));
        }
        Some(*c)
    } else {
        errs.push(format!("{} verdict counters moved", verdicts.len()));
        None
    };
    if let Some(c) = counter {
        let name = c.name();
        let kind_ok = match run.verdict {
            XDP_REDIRECT => name.starts_with("fwd"),
            XDP_DROP => name.starts_with("drop"),
            XDP_PASS => name.starts_with("pass"),
            _ => false,
        };
        if !kind_ok {
            errs.push(format!("{name} with {}", action_name(run.verdict)));
        }
        let own_mac = if from_lan { env.lan_mac } else { env.wan_mac };
        errs.extend(against_the_model(f, from_lan, own_mac, c));
        let ev = |e: Counter| run.delta.iter().any(|(c, _)| *c == e);
        if (ev(Counter::Flow6NewOutbound) || ev(Counter::Flow6NewPinhole))
            && !matches!(
                c,
                Counter::Fwd6Outbound | Counter::Fwd6Inbound | Counter::PassNoNeighbour
            )
        {
            errs.push(format!("a new flow with {name}"));
        }
        if ev(Counter::Icmp6ErrorForwarded) && c != Counter::Fwd6Inbound {
            errs.push(format!("ICMPv6 error forwarded with {name}"));
        }
        if c == Counter::Fwd6Outbound && !from_lan || c == Counter::Fwd6Inbound && from_lan {
            errs.push(format!(
                "{name} for a frame from the {}",
                if from_lan { "LAN" } else { "WAN" }
            ));
        }
        let mut want = f.to_vec();
        if run.verdict == XDP_REDIRECT {
            let (dmac, smac) = if c == Counter::Fwd6Outbound {
                (env.server_mac, env.wan_mac)
            } else {
                (env.client_mac, env.lan_mac)
            };
            want[..6].copy_from_slice(&dmac);
            want[6..12].copy_from_slice(&smac);
            want[IP6 + 7] = f[IP6 + 7].wrapping_sub(1);
        }
        let forwarded = matches!(
            c,
            Counter::Fwd6Outbound | Counter::Fwd6Inbound | Counter::PassNoNeighbour
        );
        let clamped = forwarded && expect_clamp6(f, &run.out, &mut want, &mut errs);
        if clamped != ev(Counter::TcpMssClamped) {
            errs.push(format!(
                "MSS clamped: {clamped}, tcp_mss_clamped counted: {}",
                ev(Counter::TcpMssClamped)
            ));
        }
        if run.out != want {
            errs.push(format!(
                "output is not the input with (redirected) MACs and hop limit - 1 and (a SYN) \
                 the MSS clamped:\n  input  {f:02x?}\n  output {:02x?}",
                run.out
            ));
        }
    }
    s.cases += 1;
    *s.verdicts.entry(action_name(run.verdict)).or_default() += 1;
    if let Some(c) = counter {
        *s.counters.entry(c.name()).or_default() += 1;
    }
    for (c, v) in run.delta.iter().filter(|(c, _)| c.is_event()) {
        *s.events.entry(c.name()).or_default() += v.packets;
    }
    if run.verdict == XDP_REDIRECT {
        s.rewritten += 1;
    }
    if !errs.is_empty() {
        s.failures.push(format!("{what}: {}", errs.join("; ")));
    }
}

/// The MSS the corpus's config clamps IPv6 SYNs to: its path MTU less 60
/// bytes of headers.
const CLAMP_MSS6: u16 = super::CLAMP_MTU - 60;

/// For a forwarded TCP SYN `f` whose MSS option is above [`CLAMP_MSS6`]:
/// puts the lowered value into `want`, takes the output's TCP checksum
/// (checked here instead: valid if the input's was) and says it was
/// clamped.
fn expect_clamp6(f: &[u8], out: &[u8], want: &mut [u8], errs: &mut Vec<String>) -> bool {
    let l4 = IP6 + 40;
    if f.get(IP6 + 6) != Some(&IPPROTO_TCP) {
        return false;
    }
    let Some(at) = super::frame_fields::mss_value_at(f, l4) else {
        return false;
    };
    if u16::from_be_bytes([f[at], f[at + 1]]) <= CLAMP_MSS6 {
        return false;
    }
    want[at..at + 2].copy_from_slice(&CLAMP_MSS6.to_be_bytes());
    let check = l4 + 16..l4 + 18;
    want[check.clone()].copy_from_slice(&out[check]);
    if checksum_errors6(f).is_empty() && !checksum_errors6(out).is_empty() {
        errs.push(format!(
            "valid input, output checksums wrong after the clamp: {:?}",
            checksum_errors6(out)
        ));
    }
    true
}

/// Every `CONNTRACK6` entry has its reversed peer, exactly one of the two
/// is the original direction, and they agree on state and flags.
fn table6_consistent(r: &LoadedRouter) -> Vec<String> {
    let m: BpfHash<_, FlowKey6, FlowEntry6> =
        BpfHash::try_from(r.ebpf.map(CONNTRACK6_MAP).expect("CONNTRACK6")).unwrap();
    let all: BTreeMap<FlowKey6, FlowEntry6> = m.iter().map(|x| x.unwrap()).collect();
    let mut errs = Vec::new();
    for (k, e) in &all {
        let Some(p) = all.get(&k.reversed()) else {
            errs.push(format!("{k:?} has no peer"));
            continue;
        };
        if (e.flags ^ p.flags) & FLAG_ORIGINAL == 0
            || (e.flags & !FLAG_ORIGINAL, e.state) != (p.flags & !FLAG_ORIGINAL, p.state)
        {
            errs.push(format!("{k:?}: {e:?} and its peer {p:?} disagree"));
        }
    }
    errs
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ipv6_malformed_and_mutated_frames_keep_the_invariants() {
    let env = ResolvedTopology::new(false);
    v6::enable(&env.t);
    v6::resolve_neighbours(&env.t);
    let started = Instant::now();
    env.in_router(CT_ENTRIES, |mut r| {
        let mut cfg = config(&env);
        cfg.admit = Admit::Xdp as u8;
        r.configure(&cfg);
        let seeds = setup6(&env, &mut r);
        let mut sys = Summary::default();
        for sd in &seeds {
            for (what, f) in systematic6(sd) {
                case6(
                    &env,
                    &r,
                    &format!("{}: {what}", sd.name),
                    &f,
                    sd.from_lan,
                    &mut sys,
                );
            }
        }
        let mut gen_ = Summary::default();
        let mut rng = SplitMix64(RNG_SEED6);
        for _ in 0..GENERATED6 {
            let (what, from_lan, f) = generated6(&mut rng, &seeds);
            case6(&env, &r, &what, &f, from_lan, &mut gen_);
        }
        let table_errs = table6_consistent(&r);
        println!("{}", sys.table("### IPv6 systematic corpus"));
        println!(
            "{}",
            gen_.table(&format!(
                "### IPv6 generated corpus ({GENERATED6} cases, seed {RNG_SEED6:#x})"
            ))
        );
        let mut all = Summary::default();
        all.merge(sys);
        all.merge(gen_);
        println!(
            "{} IPv6 cases in {:.1} s",
            all.cases,
            started.elapsed().as_secs_f64()
        );
        report("IPv6 corpus", &all);
        assert!(
            table_errs.is_empty(),
            "CONNTRACK6 inconsistent after the corpus: {table_errs:#?}"
        );
    });
}

/// The model itself (no root needed) on frames built by hand.
#[test]
fn ipv6_model_self_test() {
    const ROUTER_MAC: [u8; 6] = [2; 6];
    let (c, s) = (o(CLIENT6), o(SERVER6));
    let f = v6::Ipv6::tcp(c, s, &Tcp::new(1, 2, TCP_ACK)).frame([2; 6], [4; 6]);
    assert_eq!(model6(&f, true, ROUTER_MAC), Expect6::FlowPhases);
    assert_eq!(
        model6(&f[..53], true, ROUTER_MAC),
        Expect6::Exactly(Counter::DropTruncated)
    );
    assert_eq!(
        model6(&f[..60], true, ROUTER_MAC),
        Expect6::Exactly(Counter::DropMalformed)
    );
    let chained = with_chain(&f, &[0, 43]);
    assert_eq!(chained.len(), f.len() + 16);
    assert_eq!(
        model6(&chained, true, ROUTER_MAC),
        Expect6::Exactly(Counter::Pass6ExtHopByHop)
    );
    assert_eq!(chained[L4_6], 43);
    assert_eq!(chained[L4_6 + 8], IPPROTO_TCP);
    let mut hl = f.clone();
    hl[IP6 + 7] = 1;
    assert_eq!(
        model6(&hl, true, ROUTER_MAC),
        Expect6::Exactly(Counter::Pass6HopLimit)
    );
    let mut off = f.clone();
    off[L4_6 + 12] = 0x40;
    assert_eq!(
        model6(&off, true, ROUTER_MAC),
        Expect6::Exactly(Counter::DropMalformed)
    );
    let echo_in = v6::Ipv6::echo(s, c, false, 1, 1).frame([2; 6], [4; 6]);
    assert_eq!(model6(&echo_in, false, ROUTER_MAC), Expect6::FlowPhases);
    let ns = v6::Ipv6::icmp6(c, s, 135, 0, [0; 4], &[0; 16]).frame([2; 6], [4; 6]);
    assert_eq!(
        model6(&ns, true, ROUTER_MAC),
        Expect6::Exactly(Counter::Pass6Ndp)
    );
    let mut multicast = f.clone();
    multicast[..6].copy_from_slice(&tests::frames::IPV6_MULTICAST_MAC);
    assert_eq!(
        model6(&multicast, true, ROUTER_MAC),
        Expect6::Exactly(Counter::PassNotForUs)
    );
}
