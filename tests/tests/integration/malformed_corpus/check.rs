//! Checking one case against the model, and the table at the end.

use super::*;

#[derive(Default)]
pub(super) struct Summary {
    pub(super) cases: usize,
    pub(super) verdicts: BTreeMap<&'static str, usize>,
    pub(super) counters: BTreeMap<&'static str, usize>,
    pub(super) events: BTreeMap<&'static str, u64>,
    pub(super) rewritten: usize,
    pub(super) corrupt_l4_forwarded: usize,
    pub(super) failures: Vec<String>,
}

impl Summary {
    pub(super) fn table(&self, title: &str) -> String {
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

    pub(super) fn merge(&mut self, o: Summary) {
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

/// Bytes a translation may change: MACs, TTL, IPv4 checksum, addresses,
/// ports/identifier and the L4 checksum; for ICMP errors (`icmp_error`:
/// from the LAN or not) the NAT's side only: from the WAN the outer
/// destination and the quoted source address and port (or echo
/// identifier), from the LAN the outer source and the quoted destination
/// address and port; the ICMP checksum and the quoted checksums.
pub(super) fn may_change(f: &[u8], at: usize, icmp_error: Option<bool>) -> bool {
    if at < 12 || at == IP_OFF + 8 || (IP_OFF + 10..IP_OFF + 12).contains(&at) {
        return true;
    }
    if let Some(from_lan) = icmp_error {
        let inner_proto = f[INNER_IP_OFF + 9];
        let (outer_addr, inner_addr, port) = if from_lan {
            (IP_OFF + 12, INNER_IP_OFF + 16, INNER_L4_OFF + 2)
        } else {
            (IP_OFF + 16, INNER_IP_OFF + 12, INNER_L4_OFF)
        };
        return (outer_addr..outer_addr + 4).contains(&at)
            || (L4_OFF + 2..L4_OFF + 4).contains(&at)
            || (INNER_IP_OFF + 10..INNER_IP_OFF + 12).contains(&at)
            || (inner_addr..inner_addr + 4).contains(&at)
            || match inner_proto {
                IPPROTO_ICMP => (INNER_L4_OFF + 2..INNER_L4_OFF + 6).contains(&at),
                IPPROTO_UDP => {
                    (port..port + 2).contains(&at)
                        || (INNER_L4_OFF + 6..INNER_L4_OFF + 8).contains(&at)
                }
                _ => (port..port + 2).contains(&at) || (78..80).contains(&at),
            };
    }
    if (IP_OFF + 12..IP_OFF + 20).contains(&at) {
        return true;
    }
    // A SYN's MSS value (clamping, `mss_clamp_mtu` of the corpus's config).
    if syn_mss_at(f).is_some_and(|m| (m..m + 2).contains(&at)) {
        return true;
    }
    // A later fragment: no L4 header, only the addresses change.
    if be16(f, IP_OFF + 6) & 0x1fff != 0 {
        return false;
    }
    // After the options, if any.
    let l4 = l4_off(f);
    match f[IP_OFF + 9] {
        IPPROTO_TCP => (l4..l4 + 4).contains(&at) || (l4 + 16..l4 + 18).contains(&at),
        IPPROTO_UDP => (l4..l4 + 4).contains(&at) || (l4 + 6..l4 + 8).contains(&at),
        _ => (l4 + 2..l4 + 6).contains(&at),
    }
}

/// Checks the Time Exceeded answering `f`, built from scratch with the
/// kit (not the data path's own `icmp_answer`): back to the MAC and the
/// address `f` came from, from the WAN address, quoting its IPv4 header
/// and 8 payload bytes as received (RFC 792), type of service marked
/// internetwork control, DF, identification 0, TTL 64.
fn check_time_exceeded(f: &[u8], out: &[u8]) -> Vec<String> {
    let mut errs = Vec::new();
    if f[IP_OFF] != 0x45 {
        // The quote is the first 28 bytes: with options it would cut them.
        errs.push(format!(
            "answered a packet with IP options (version/IHL {:#04x})",
            f[IP_OFF]
        ));
        return errs;
    }
    let quote = &f[IP_OFF..IP_OFF + 28];
    let mut ip = Ipv4::new(
        WAN,
        addr(f, IP_OFF + 12),
        Icmp::error(ICMP_TIME_EXCEEDED, 0, quote),
    );
    ip.tos = 0xc0 | (f[IP_OFF + 1] & 0x1e);
    ip.id = 0;
    ip.frag = IP_DF;
    ip.ttl = 64;
    let mut want = Vec::with_capacity(IP_OFF + 56);
    want.extend_from_slice(&f[6..12]);
    want.extend_from_slice(&f[..6]);
    want.extend_from_slice(&[0x08, 0x00]);
    want.extend_from_slice(&ip.bytes());
    if out != want.as_slice() {
        errs.push(format!("Time Exceeded {out:02x?}, want {want:02x?}"));
    }
    // `want`'s own checksums are the kit's; the quote's are the input's,
    // right only if the input's were (a quote keeps what it quotes).
    if frames::checksum_errors(f).is_empty() {
        let e = frames::checksum_errors(out);
        if !e.is_empty() {
            errs.push(format!("Time Exceeded checksums wrong: {e:?}"));
        }
    }
    errs
}

/// Checks a rewritten output (`run.out != f`); `counter` is the verdict
/// counter. Returns what is wrong.
#[expect(
    clippy::too_many_lines,
    reason = "a list of cases, or one check per field, read top to bottom"
)]
pub(super) fn check_rewrite(
    env: &ResolvedTopology,
    r: &LoadedRouter,
    f: &[u8],
    from_lan: bool,
    run: &ProgRun,
    counter: Counter,
    stage: Stage,
) -> Vec<String> {
    let mut errs = Vec::new();
    let out = &run.out;
    if counter == Counter::DropTtlExceededAnswered {
        errs.extend(check_time_exceeded(f, out));
        return errs;
    }
    if out.len() != f.len() {
        errs.push(format!("length {} -> {}", f.len(), out.len()));
        return errs;
    }
    let redirect = run.verdict == XDP_REDIRECT;
    let allowed = match (redirect, counter) {
        (true, Counter::FwdOutbound) => from_lan,
        (true, Counter::FwdInbound) => !from_lan,
        // A fragment or a packet with options, either way; without a
        // neighbour: translated, for the kernel (both ways).
        (true, Counter::FwdFragment | Counter::FwdIpOptions)
        | (false, Counter::PassNoNeighbour) => true,
        _ => false,
    };
    if !allowed {
        errs.push(format!(
            "output rewritten with {} / {counter:?} from the {}",
            action_name(run.verdict),
            if from_lan { "LAN" } else { "WAN" }
        ));
        return errs;
    }
    let icmp_error = stage == Stage::IcmpError;
    for (at, (a, b)) in f.iter().zip(out).enumerate() {
        if a != b && !may_change(f, at, icmp_error.then_some(from_lan)) {
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
    errs.extend(check_mss(f, out));
    let ttl = if redirect {
        f[IP_OFF + 8].wrapping_sub(1)
    } else {
        f[IP_OFF + 8]
    };
    if out[IP_OFF + 8] != ttl {
        errs.push(format!(
            "TTL {} -> {}, want {ttl}",
            f[IP_OFF + 8],
            out[IP_OFF + 8]
        ));
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
        let Some(e) = r.entry(&key) else {
            errs.push(format!("translated ICMP error but no entry {key:?}"));
            return errs;
        };
        let inner_port = if f[INNER_IP_OFF + 9] == IPPROTO_ICMP {
            be16(out, INNER_L4_OFF + 4)
        } else {
            be16(out, INNER_L4_OFF)
        };
        let got = (
            addr(out, IP_OFF + 12),
            addr(out, IP_OFF + 16),
            addr(out, INNER_IP_OFF + 12),
            inner_port,
        );
        let want = (
            addr(f, IP_OFF + 12),
            e.new_dst_addr,
            e.new_dst_addr,
            e.new_dst_port,
        );
        if got != want {
            errs.push(format!(
                "ICMP error translated to {got:?}, entry {key:?} says {want:?}"
            ));
        }
    } else if stage == Stage::LaterFragment {
        let key = fragment_key(f, from_lan);
        let Some(x) = r.fragment(&key) else {
            errs.push(format!("rewritten but no FRAGMENTS record {key:?}"));
            return errs;
        };
        let got = (addr(out, IP_OFF + 12), addr(out, IP_OFF + 16));
        if got != (x.new_src_addr, x.new_dst_addr) {
            errs.push(format!("translated to {got:?}, record {key:?} says {x:?}"));
        }
    } else {
        let key = lookup_key(f);
        let Some(e) = r.entry(&key) else {
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

/// A translated SYN's MSS: lowered to the corpus's clamp (the links are
/// wider), exactly, when it was above it; else as it was.
fn check_mss(f: &[u8], out: &[u8]) -> Option<String> {
    let m = syn_mss_at(f)?;
    let (old, new) = (be16(f, m), be16(out, m));
    let want = old.min(CLAMP_MSS);
    (new != want).then(|| format!("SYN's MSS {old} -> {new}, want {want}"))
}

/// Whether `run` changed the MSS of the SYN `f`.
fn mss_changed(f: &[u8], run: &ProgRun) -> bool {
    syn_mss_at(f).is_some_and(|m| run.out.get(m..m + 2) != f.get(m..m + 2))
}

/// Runs one case, checks everything, records it in `s`.
#[expect(
    clippy::too_many_lines,
    reason = "a list of cases, or one check per field, read top to bottom"
)]
pub(super) fn case(
    env: &ResolvedTopology,
    r: &LoadedRouter,
    what: &str,
    f: &[u8],
    from_lan: bool,
    s: &mut Summary,
) {
    let ifindex = if from_lan { env.lan } else { env.wan };
    let own_mac = if from_lan { env.lan_mac } else { env.wan_mac };
    // The program takes priority tags off first, as the kernel does: what
    // is left is judged, counted and compared as that untagged frame.
    let input = f;
    let stripped = frames::without_priority_tags(input);
    let f = stripped.as_deref().unwrap_or(input);
    let stage = model(f, from_lan, own_mac);
    let (ok, new_event) = match stage {
        Stage::Exactly(c) => (vec![c], None),
        _ => allowed_after_lookup(r, f, from_lan, stage),
    };
    let ok = standalone_policy(f, from_lan, ok);
    let run = r.test_run(input, ifindex);
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
            Counter::FwdOutbound
            | Counter::FwdInbound
            | Counter::FwdFragment
            | Counter::FwdIpOptions
            | Counter::DropTtlExceededAnswered => XDP_REDIRECT,
            Counter::DropMalformed
            | Counter::DropTruncated
            | Counter::DropIpChecksum
            | Counter::DropUnsolicited
            | Counter::DropTtlExceeded
            | Counter::DropSpoofedSource => XDP_DROP,
            _ => XDP_PASS,
        };
        if run.verdict != want_verdict {
            errs.push(format!(
                "verdict {} with counter {c:?}",
                action_name(run.verdict)
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
                        && matches!(
                            c,
                            Counter::FwdOutbound | Counter::FwdInbound | Counter::PassNoNeighbour
                        )
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
                // A translated SYN whose MSS was lowered (the output's
                // value itself is checked with the rewrite).
                Counter::TcpMssClamped => {
                    v.packets == 1
                        && mss_changed(f, &run)
                        && matches!(
                            c,
                            Counter::FwdOutbound | Counter::FwdInbound | Counter::PassNoNeighbour
                        )
                }
                // A flow's SYN, FIN or RST that its receiver would not
                // accept (the window check of `flow::tcp_control`): the
                // state stays, the segment goes on as any hit does.
                Counter::TcpOutOfWindow => {
                    use router_common::{
                        flow::TCP_CONTROL,
                        hdr::{frame, ipv4, tcp},
                    };
                    v.packets == 1
                        && f.get(frame::IPV4 + ipv4::PROTO) == Some(&IPPROTO_TCP)
                        && f.get(frame::L4 + tcp::FLAGS)
                            .is_some_and(|fl| fl & TCP_CONTROL != 0)
                        && !matches!(
                            c,
                            Counter::DropMalformed
                                | Counter::DropTruncated
                                | Counter::DropIpChecksum
                        )
                }
                _ => false,
            };
            if !fine {
                errs.push(format!("event {e:?} +{} with {c:?}", v.packets));
            }
        }
        let translated = stage == Stage::IcmpError
            && matches!(
                c,
                Counter::FwdOutbound | Counter::FwdInbound | Counter::PassNoNeighbour
            )
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
        if mss_changed(f, &run) && !run.delta.iter().any(|(e, _)| *e == Counter::TcpMssClamped) {
            errs.push("SYN's MSS lowered, not counted".to_owned());
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
    *s.verdicts.entry(action_name(run.verdict)).or_default() += 1;
    if !errs.is_empty() {
        s.failures.push(format!(
            "{what} (from {}): {}\n  input  {:02x?}\n  output {:02x?}\n  counters {:?}",
            if from_lan { "LAN" } else { "WAN" },
            errs.join("; "),
            input,
            run.out,
            run.delta
        ));
    }
}

/// Every entry has its peer, the peer points back, and the two entries'
/// translations are each other's reverse.
pub(super) fn table_consistent(r: &LoadedRouter) -> Vec<String> {
    let flows = r.conntrack_entries();
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
