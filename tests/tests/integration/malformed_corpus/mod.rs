//! Malformed and mutated input through `BPF_PROG_RUN`: a systematic corpus
//! (every truncation point, every IHL and TCP data offset, total lengths
//! around the frame, fragments, TTL 0/1/2, IP options, zero, broadcast,
//! loopback and multicast addresses, ICMP errors quoting ever shorter
//! headers, VLAN tags) plus a generated one (seeded random mutations of
//! valid frames from both sides, with and without a matching flow).
//!
//! The hand-written malformed, pass and ICMP-error cases with exact
//! expected outputs are in `prog_run` (`malformed_frames_are_dropped`,
//! `pass_cases_ttl_fragments_options_protocols`,
//! `icmp_errors_with_embedded_headers`, `unsolicited_wan_packets_pass_or_drop_untouched`);
//! this module does not repeat them but checks invariants on thousands of
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
//!   to the `CONNTRACK` entry of the input's tuple, a SYN's MSS lowered to
//!   the corpus's clamp exactly when above it, redirects leaving by the
//!   interface their counter names (`fwd_outbound`: WAN, `fwd_inbound`: LAN);
//! - at the end, every `CONNTRACK` entry has its peer and the two agree.
//!
//! The generated corpus always fixes the outer IPv4 header checksum after a
//! mutation (so it tests the parser and the rewrites, not checksum
//! validation); `bad_ipv4_header_checksum_is_not_forwarded` tests that.
#![allow(
    clippy::many_single_char_names,
    clippy::verbose_bit_mask,
    reason = "short names for frame, run, summary; header bit masks read as in the RFCs"
)]

mod check;
mod corpus;
mod frame_fields;
mod ipv6;
mod model;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::time::Instant;

use router_common::checksum::{checksum, fold, sum_words};
use router_common::maps::{
    Config, Counter, CounterValue, FLAG_OFFLOADED, FLAG_ORIGINAL, FLAG_PORT_FORWARD, FlowKey,
    FragmentKey, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, Timeouts,
};
use router_common::nat::forwardable_addr;
use tests::addr::octets::{CLIENT, LAN_NOBODY, ROUTER_LAN, SERVER, WAN, WAN_NOBODY};
use tests::frames::{
    self, Frame, ICMP_DEST_UNREACH, ICMP_ECHO_REQUEST, ICMP_PARAMETER_PROBLEM, ICMP_TIME_EXCEEDED,
    INNER_IP_OFF, INNER_L4_OFF, IP_DF, IP_MF, IP_OFF, Icmp, Ipv4, L4_OFF, TCP_ACK, TCP_FIN,
    TCP_PSH, TCP_RST, TCP_SYN, Tcp, Udp, addr, be16, put_addr, put16,
};
use tests::prog::{
    LoadedRouter, ProgRun, ResolvedTopology, SplitMix64, XDP_DROP, XDP_PASS, XDP_REDIRECT,
    action_name,
};

use check::*;
use corpus::*;
use frame_fields::*;
use model::*;

/// Addresses a mutation puts into address fields: odd ones, the
/// topology's, and other hosts of the LAN's prefix (sources a LAN frame
/// may open flows from, colliding on their ports).
const ODD_ADDRS: [[u8; 4]; 15] = [
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
    [192, 168, 50, 20],
    [192, 168, 50, 77],
    [192, 168, 50, 0],
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

/// The path MTU the corpus's config clamps SYNs to (standalone's
/// `--clamp-mss 1400`): below the links' 1500, so the base SYNs' MSS
/// 1460 is lowered and mutated SYNs walk their options in the data path.
const CLAMP_MTU: u16 = 1400;
/// The MSS a clamped SYN carries: [`CLAMP_MTU`] less 40 bytes of headers.
const CLAMP_MSS: u16 = CLAMP_MTU - 40;

/// Long timeouts: nothing expires while the corpus runs, so a hit
/// looked up before a run is a hit in the run. SYNs clamped to
/// [`CLAMP_MTU`].
fn config(env: &ResolvedTopology) -> Config {
    let mut c = env.config(
        HASH_SEED,
        Timeouts {
            tcp_syn_sent: 3600,
            tcp_established: 3600,
            tcp_fin_wait: 3600,
            tcp_closed: 3600,
            udp_unreplied: 3600,
            udp_replied: 3600,
            icmp: 3600,
            pad: 0,
        },
    );
    c.mss_clamp_mtu = CLAMP_MTU;
    c
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
    let env = ResolvedTopology::new(false);
    let started = Instant::now();
    env.in_router(CT_ENTRIES, |mut r| {
        r.configure(&config(&env));
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
        let mut rng = SplitMix64(RNG_SEED);
        for _ in 0..GENERATED {
            let (what, from_lan, f) = generated(&mut rng, &bases);
            case(&env, &r, &what, &f, from_lan, &mut gen_);
        }
        let elapsed = started.elapsed();
        let table_errs = table_consistent(&r);
        let flows = r.conntrack_entries().len();

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
    let env = ResolvedTopology::new(false);
    let (lan, wan) = (env.lan, env.wan);
    env.in_router(CT_ENTRIES, |mut r| {
        r.configure(&config(&env));
        let _ = setup(&env, &mut r);
        let mut bad = Vec::new();
        for (what, from_lan, f) in wrong_side(&env, &r) {
            let run = r.test_run(&f, if from_lan { lan } else { wan });
            println!("{what}: {} {:?}", action_name(run.verdict), run.delta);
            if run.verdict == XDP_REDIRECT || run.out != f {
                bad.push(format!(
                    "{what}: {} {:?}\n  input  {:02x?}\n  output {:02x?}",
                    action_name(run.verdict),
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
    let env = ResolvedTopology::new(false);
    let (lan, wan) = (env.lan, env.wan);
    env.in_router(CT_ENTRIES, |mut r| {
        r.configure(&config(&env));
        let bases = setup(&env, &mut r);
        let mut bad = Vec::new();
        let mut tried = 0;
        for b in bases.iter().filter(|b| is_ipv4(&b.frame)) {
            for delta in [1u16, 0x100, 0x8000] {
                let mut f = b.frame.clone();
                let c = be16(&f, IP_OFF + 10).wrapping_add(delta);
                put16(&mut f, IP_OFF + 10, c);
                tried += 1;
                let run = r.test_run(&f, if b.from_lan { lan } else { wan });
                if run.verdict == XDP_REDIRECT || run.out != f {
                    bad.push(format!(
                        "{} (IPv4 checksum + {delta:#x}): {} {:?}\n  input  {:02x?}",
                        b.name,
                        action_name(run.verdict),
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
    const ROUTER_MAC: [u8; 6] = [2; 6];
    let ip = Ipv4::new(CLIENT, SERVER, Udp::new(40001, 53, b"some payload"));
    let good = Frame::new(ROUTER_MAC, [4; 6], ip).bytes();
    for corrupt in [false, true] {
        let mut f = good.clone();
        if corrupt {
            f[L4_OFF + 9] ^= 0x40; // payload byte: UDP checksum now wrong
        }
        let mut out = f.clone();
        let hdr: &mut [u8; 20] = (&mut out[IP_OFF..L4_OFF]).try_into().unwrap();
        let pseudo = rewrite_addrs(hdr, WAN, SERVER);
        let udp: &mut [u8; 8] = (&mut out[L4_OFF..L4_OFF + 8]).try_into().unwrap();
        rewrite_udp(udp, pseudo, 20000, 53);
        assert_eq!(
            frame_residuals(&f),
            frame_residuals(&out),
            "corrupt: {corrupt}"
        );
        assert_eq!(frames::checksum_errors(&out).is_empty(), !corrupt);
        // Forgetting the UDP checksum is caught.
        let mut sloppy = out.clone();
        put16(&mut sloppy, L4_OFF, 20001);
        assert_ne!(frame_residuals(&f), frame_residuals(&sloppy));
    }
    assert!(may_change(&good, L4_OFF + 6, None) && !may_change(&good, L4_OFF + 4, None));
    assert_eq!(model(&good, true, ROUTER_MAC), Stage::Lookup);
    assert_eq!(
        model(&good[..20], true, ROUTER_MAC),
        Stage::Exactly(Counter::DropTruncated)
    );
    let mut ihl4 = good.clone();
    ihl4[IP_OFF] = 0x44;
    ihl4[IP_OFF + 8] = 1;
    assert_eq!(
        model(&ihl4, true, ROUTER_MAC),
        Stage::Exactly(Counter::DropMalformed)
    );
    let mut ttl1 = good.clone();
    ttl1[IP_OFF + 8] = 1;
    assert_eq!(
        model(&ttl1, true, ROUTER_MAC),
        Stage::Exactly(Counter::PassTtlExceeded)
    );
    let mut broadcast = good.clone();
    broadcast[..6].copy_from_slice(&[0xff; 6]);
    assert_eq!(
        model(&broadcast, true, ROUTER_MAC),
        Stage::Exactly(Counter::PassNotForUs)
    );
    let mut rng = SplitMix64(RNG_SEED);
    let first: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
    let mut again = SplitMix64(RNG_SEED);
    assert_eq!(first, (0..3).map(|_| again.next_u64()).collect::<Vec<_>>());
}
