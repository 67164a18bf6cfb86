//! The model of the spec's checks: which counter a frame must move.

use router_common::flow::TCP_CONTROL;

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// Decided before any lookup: exactly this counter.
    Exactly(Counter),
    /// TCP/UDP/echo reaching the conntrack lookup.
    Lookup,
    /// ICMP error whose quote is usable: looked up as a reply.
    IcmpError,
    /// A first fragment of UDP or an ICMP echo of its direction: carried
    /// if its flow is (docs/architecture.md "Per packet" step 10).
    FirstFragment,
    /// A later fragment: carried if its datagram's first was.
    LaterFragment,
    /// A packet with IP options that may be a flow's: carried if it is
    /// (docs/architecture.md "Per packet" step 12).
    Options,
    /// A WAN packet with TTL <= 1 that may be a flow's: answered with Time
    /// Exceeded if it is (docs/architecture.md "Per packet" step 11).
    TtlExceeded,
}

/// What the spec decides from the bytes alone (docs/architecture.md "Per packet", steps
/// 1 and 5 of the ICMP error path), in its order of checks; `own_mac` is
/// the ingress interface's MAC.
pub(super) fn model(f: &[u8], from_lan: bool, own_mac: [u8; 6]) -> Stage {
    use Stage::Exactly;
    if !is_ipv4(f) {
        return Exactly(Counter::PassNotIpv4);
    }
    if f.len() < L4_OFF {
        return Exactly(Counter::DropTruncated);
    }
    let l3_len = f.len() - IP_OFF;
    let (version, ihl) = (f[IP_OFF] >> 4, usize::from(f[IP_OFF] & 0x0f));
    let total = usize::from(be16(f, IP_OFF + 2));
    if version != 4 || ihl < 5 || total < 20 || total > l3_len || ihl * 4 > total {
        return Exactly(Counter::DropMalformed);
    }
    if ihl > 5 {
        return options(f, from_lan, own_mac, total);
    }
    if f[IP_OFF + 8] <= 1 {
        return ttl_exceeded(f, from_lan, own_mac, total);
    }
    if checksum(&f[IP_OFF..L4_OFF]) != 0 {
        return Exactly(Counter::DropIpChecksum);
    }
    if f[..6] != own_mac {
        return Exactly(Counter::PassNotForUs);
    }
    if be16(f, IP_OFF + 6) & 0x3fff != 0 {
        return fragment(f, from_lan, total);
    }
    match f[IP_OFF + 9] {
        IPPROTO_TCP => {
            if total < 40 {
                return Exactly(Counter::DropMalformed);
            }
            let doff = usize::from(f[L4_OFF + 12] >> 4) * 4;
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
            let t = f[L4_OFF];
            if is_icmp_error_type(t) {
                let unusable = Exactly(icmp_error_miss(from_lan));
                if total < 56 || f[INNER_IP_OFF] != 0x45 {
                    return unusable;
                }
                // A quoted echo request: one the NAT sent to the WAN.
                let ok = match f[INNER_IP_OFF + 9] {
                    IPPROTO_TCP | IPPROTO_UDP => true,
                    IPPROTO_ICMP => !from_lan && f[INNER_L4_OFF] == ICMP_ECHO_REQUEST,
                    _ => false,
                };
                if !ok {
                    return unusable;
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

/// IP options: the kernel's, unless the header is otherwise forwardable
/// (TTL > 1, its checksum over the options right, no fragment) and the
/// packet holds a TCP header, a UDP one or an ICMP echo of its direction
/// at the offset the IHL gives (what the lookup then decides); a TCP, UDP
/// or ICMP packet too short for its header there, or a TCP data offset
/// below the header or past the packet, is malformed (as without
/// options); not addressed to the interface: the kernel's as any such
/// frame.
fn options(f: &[u8], from_lan: bool, own_mac: [u8; 6], total: usize) -> Stage {
    if f[..6] != own_mac {
        return Stage::Exactly(Counter::PassNotForUs);
    }
    let hlen = usize::from(f[IP_OFF] & 0x0f) * 4;
    let l4 = IP_OFF + hlen;
    let proto = f[IP_OFF + 9];
    let need = if proto == IPPROTO_TCP { 20 } else { 8 };
    let echo = if from_lan { ICMP_ECHO_REQUEST } else { 0 };
    let forwardable =
        f[IP_OFF + 8] > 1 && be16(f, IP_OFF + 6) & 0x3fff == 0 && checksum(&f[IP_OFF..l4]) == 0;
    if !forwardable || !plain_options(&f[IP_OFF + 20..l4]) {
        return Stage::Exactly(Counter::PassIpOptions);
    }
    let carried_proto = matches!(proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_ICMP);
    if total < hlen + need {
        return Stage::Exactly(if carried_proto {
            Counter::DropMalformed
        } else {
            Counter::PassIpOptions
        });
    }
    if proto == IPPROTO_TCP {
        let data_off = usize::from(f[l4 + 12] >> 4) * 4;
        if data_off < 20 || data_off > total - hlen {
            return Stage::Exactly(Counter::DropMalformed);
        }
    }
    let flow_like = match proto {
        IPPROTO_TCP => f[l4 + 13] & TCP_CONTROL == 0,
        IPPROTO_UDP => true,
        IPPROTO_ICMP => f[l4] == echo,
        _ => false,
    };
    if flow_like {
        Stage::Options
    } else {
        Stage::Exactly(Counter::PassIpOptions)
    }
}

/// The options path's look at `options` (docs/architecture.md "Per packet" step 12): at
/// most six options (no-operation bytes counted) up to the end of the list
/// or the header, none a source route (LSRR 0x83, SSRR 0x89), each with
/// a length of at least 2 within the header (but the one-byte end and
/// no-operation ones), a record route's or timestamp's pointer as Linux's
/// option parsing takes it ([`pointer_fits`]).
fn plain_options(options: &[u8]) -> bool {
    let mut at = 0;
    for _ in 0..6 {
        match options.get(at) {
            None | Some(0) => return true,
            Some(1) => at += 1,
            Some(0x83 | 0x89) => return false,
            Some(&kind) => match options.get(at + 1).map(|&l| usize::from(l)) {
                Some(len)
                    if len >= 2
                        && at + len <= options.len()
                        && pointer_fits(kind, &options[at..at + len]) =>
                {
                    at += len;
                }
                _ => return false,
            },
        }
    }
    at >= options.len()
}

/// Whether option `opt` (its bytes) of kind `kind` has a pointer Linux's
/// `ip_options_compile` takes, for a record route (7) and a timestamp
/// (0x44): not before the data, room for an entry when inside, a full
/// timestamp's overflow count below 15; other kinds have none.
fn pointer_fits(kind: u8, opt: &[u8]) -> bool {
    let (first, ts) = match kind {
        7 => (4, false),
        0x44 => (5, true),
        _ => return true,
    };
    let len = opt.len();
    if len < first - 1 {
        return false;
    }
    let pointer = usize::from(opt[2]);
    if pointer < first {
        return false;
    }
    if !ts {
        return pointer > len || pointer + 3 <= len;
    }
    let flags = opt[3];
    if pointer > len {
        return flags & 0xf == 3 || flags >> 4 != 0xf;
    }
    let entry = if matches!(flags & 0xf, 1 | 3) { 8 } else { 4 };
    pointer + entry - 1 <= len
}

/// TTL <= 1: the kernel's, unless it is a WAN packet addressed to the
/// router's MAC with a right header checksum and the 8 bytes of a TCP, UDP
/// or echo reply flow's ports (what the lookup then decides), and not a
/// later fragment (whose payload is no ports).
fn ttl_exceeded(f: &[u8], from_lan: bool, own_mac: [u8; 6], total: usize) -> Stage {
    let flow_like = match f[IP_OFF + 9] {
        IPPROTO_TCP | IPPROTO_UDP => total >= 28,
        IPPROTO_ICMP => total >= 28 && f[L4_OFF] == 0,
        _ => false,
    };
    let later_fragment = be16(f, IP_OFF + 6) & 0x1fff != 0;
    if from_lan
        || checksum(&f[IP_OFF..L4_OFF]) != 0
        || f[..6] != own_mac
        || !flow_like
        || later_fragment
    {
        return Stage::Exactly(Counter::PassTtlExceeded);
    }
    Stage::TtlExceeded
}

/// A fragment (docs/architecture.md "Per packet" step 10): a later one depends on its
/// datagram's first; a first one of TCP (with its whole header), UDP or an
/// ICMP echo of its direction (whose 8-byte header it must hold) on its
/// flow; the rest is the kernel's.
fn fragment(f: &[u8], from_lan: bool, total: usize) -> Stage {
    if be16(f, IP_OFF + 6) & 0x1fff != 0 {
        return Stage::LaterFragment;
    }
    let echo = if from_lan { ICMP_ECHO_REQUEST } else { 0 };
    match f[IP_OFF + 9] {
        // TCP only with its header's fixed 20 bytes (and checksum) in the
        // fragment, and without SYN, FIN or RST.
        IPPROTO_TCP if total < 40 || f[L4_OFF + 13] & TCP_CONTROL != 0 => {
            Stage::Exactly(Counter::PassFragment)
        }
        IPPROTO_UDP | IPPROTO_ICMP if total < 28 => Stage::Exactly(Counter::DropMalformed),
        IPPROTO_TCP | IPPROTO_UDP => Stage::FirstFragment,
        IPPROTO_ICMP if f[L4_OFF] == echo => Stage::FirstFragment,
        _ => Stage::Exactly(Counter::PassFragment),
    }
}

/// The verdicts of a packet one of the paths off the hit path carries
/// (counted `forwarded`), which passes with `passed` when the next hop has
/// no neighbour and with the FIB's reason when the FIB refuses it.
fn carried(forwarded: Counter, passed: Counter) -> Vec<Counter> {
    let mut ok = vec![forwarded, passed];
    ok.extend(
        FIB_PASSES
            .iter()
            .filter(|&&c| c != Counter::PassNoNeighbour),
    );
    ok
}

/// Whether the WAN packet `f` (no options) would open a flow through one
/// of the corpus's port-forward rules: a TCP SYN or UDP to the WAN address
/// and a forwarded port, from a source that may open one (not a martian,
/// not the WAN address, not a LAN host's). A TTL-limited one is answered
/// with Time Exceeded.
fn opens_by_rule(f: &[u8]) -> bool {
    let (proto, src) = (f[IP_OFF + 9], addr(f, IP_OFF + 12));
    let syn_or_udp = match proto {
        IPPROTO_TCP => {
            f.len() >= L4_OFF + 20
                && f[L4_OFF + 13] & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN
        }
        _ => true,
    };
    syn_or_udp
        && addr(f, IP_OFF + 16) == WAN
        && src != WAN
        && forwardable_addr(src)
        && !lan_host(src)
        && PORT_FORWARDS
            .iter()
            .any(|&(p, port, ..)| p == proto && port == be16(f, L4_OFF + 2))
}

/// The verdicts of the stages the paths off the hit path decide
/// (fragments, options, Time Exceeded): by the flow (its own side, not
/// offloaded) or the fragment record a packet has; `None` for the others.
fn off_the_hit_path(
    r: &LoadedRouter,
    f: &[u8],
    from_lan: bool,
    stage: Stage,
) -> Option<Vec<Counter>> {
    let hit = |side: bool| {
        r.entry(&lookup_key(f))
            .is_some_and(|e| e.lan_side() == side && e.flags & FLAG_OFFLOADED == 0)
    };
    let (carried_if, yes, no) = match stage {
        Stage::FirstFragment => (
            hit(from_lan),
            carried(Counter::FwdFragment, Counter::PassFragment),
            Counter::PassFragment,
        ),
        Stage::LaterFragment => (
            r.fragment(&fragment_key(f, from_lan)).is_some(),
            carried(Counter::FwdFragment, Counter::PassFragment),
            Counter::PassFragment,
        ),
        Stage::Options => (
            hit(from_lan),
            carried(Counter::FwdIpOptions, Counter::PassIpOptions),
            Counter::PassIpOptions,
        ),
        Stage::TtlExceeded => (
            hit(false) || opens_by_rule(f),
            vec![Counter::DropTtlExceededAnswered, Counter::DropTtlExceeded],
            Counter::PassTtlExceeded,
        ),
        _ => return None,
    };
    Some(if carried_if { yes } else { vec![no] })
}

/// The verdict of an ICMP error about no flow of its side: from the LAN
/// the kernel's (a slow-path flow's, maybe), from the WAN unsolicited.
const fn icmp_error_miss(from_lan: bool) -> Counter {
    if from_lan {
        Counter::PassNoFlow
    } else {
        Counter::PassUnsolicited
    }
}

/// Verdicts of the FIB step that pass untouched.
pub(super) const FIB_PASSES: [Counter; 5] = [
    Counter::PassFibNotForwarded,
    Counter::PassFibForwardingDisabled,
    Counter::PassMtu,
    Counter::PassEgressNotAttached,
    Counter::PassNoNeighbour,
];

/// What the spec allows after the lookup stage, given whether the key hit
/// before the run: the verdict counters, and whether a new flow
/// (`FlowNewMasquerade`/`FlowNewPortForward`) may be counted.
pub(super) fn allowed_after_lookup(
    r: &LoadedRouter,
    f: &[u8],
    from_lan: bool,
    stage: Stage,
) -> (Vec<Counter>, Option<Counter>) {
    if let Some(ok) = off_the_hit_path(r, f, from_lan, stage) {
        return (ok, None);
    }
    let fwd = if from_lan {
        Counter::FwdOutbound
    } else {
        Counter::FwdInbound
    };
    let mut ok = vec![fwd];
    ok.extend_from_slice(&FIB_PASSES);
    if stage == Stage::IcmpError {
        // Addressed to the quoted packet's source, and quoting a first
        // fragment (a later one's payload holds no ports).
        let quoted = L4_OFF + 8;
        if f[IP_OFF + 16..IP_OFF + 20] != f[quoted + 12..quoted + 16]
            || be16(f, quoted + 6) & 0x1fff != 0
        {
            return (vec![icmp_error_miss(from_lan)], None);
        }
        // Its own sender, in no flow's key: a martian one is not
        // forwarded, nor from the WAN the router's WAN address (RFC 1812
        // 5.3.7).
        let sender: [u8; 4] = f[IP_OFF + 12..IP_OFF + 16].try_into().unwrap();
        if !forwardable_addr(sender) {
            return (vec![Counter::PassFibNotForwarded], None);
        }
        if !from_lan && sender == WAN {
            return (vec![Counter::PassUnsolicited], None);
        }
        // Only an entry of the error's own side may translate it: a
        // WAN-side one an error from the WAN, a LAN-side one from the LAN.
        if r.entry(&icmp_error_key(f))
            .is_none_or(|e| e.lan_side() != from_lan)
        {
            return (vec![icmp_error_miss(from_lan)], None);
        }
        return (ok, None);
    }
    let key = lookup_key(f);
    // An entry is a hit only on its own side.
    if r.entry(&key).is_some_and(|e| e.lan_side() == from_lan) {
        return (ok, None);
    }
    let proto = key.proto;
    let plain_syn =
        proto == IPPROTO_TCP && f[L4_OFF + 13] & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN;
    if from_lan {
        if proto == IPPROTO_TCP && !plain_syn {
            return (vec![Counter::PassNoFlow], None);
        }
        // A source the LAN does not route (BCP 38): dropped, once the
        // martian checks let it through.
        let (src, dst) = (key.src_addr, key.dst_addr);
        if forwardable_addr(src) && forwardable_addr(dst) && !lan_host(src) {
            return (vec![Counter::DropSpoofedSource], None);
        }
        // A flow an earlier case's first fragment left to the kernel's
        // slow path (`KERNEL_FLOWS`; nothing expires in the corpus): its
        // packets stay there (RFC 4787 REQ-11).
        if r.kernel_flow(&key).is_some() {
            return (vec![Counter::PassKernelFlow], None);
        }
        ok.push(Counter::PassNoFlow);
        ok.push(Counter::PassPortsExhausted);
        return (ok, Some(Counter::FlowNewMasquerade));
    }
    if proto == IPPROTO_TCP && !plain_syn {
        return (vec![Counter::PassUnsolicited], None);
    }
    // A martian source (RFC 1812 5.3.7: 0/8, 127/8, 224/4, 240/4) opens
    // nothing.
    if matches!(key.src_addr[0], 0 | 127 | 224..=255) {
        return (vec![Counter::PassFibNotForwarded], None);
    }
    // The WAN address as source from the WAN: spoofed, opens nothing.
    if key.dst_addr != WAN
        || key.src_addr == WAN
        || proto == IPPROTO_ICMP
        || r.rule(proto, key.dst_port).is_none()
    {
        return (vec![Counter::PassUnsolicited], None);
    }
    // A LAN host's address as source from the WAN: spoofed (RFC 1812
    // 5.3.8, BCP 38; replies to it leave on the LAN), opens nothing.
    if lan_host(key.src_addr) {
        return (vec![Counter::PassUnsolicited], None);
    }
    ok.push(Counter::PassPortsExhausted);
    // Its reply tuple may be a live LAN flow's own (a mutated frame can
    // hit one): that flow keeps it.
    ok.push(Counter::PassReplyTupleTaken);
    (ok, Some(Counter::FlowNewPortForward))
}

/// Whether the router forwards a packet to `addr` out of the LAN interface:
/// an address of the LAN's prefix, not the router's own LAN address nor the
/// subnet's broadcast address. The network address is forwarded too: Linux
/// keeps no broadcast route for it.
fn lan_host(addr: [u8; 4]) -> bool {
    addr[..3] == ROUTER_LAN[..3] && addr != ROUTER_LAN && addr[3] != 255
}

/// Standalone mode's forward policy from the WAN (docs/standalone.md "Standalone
/// mode"): a packet the data path would pass to the kernel untranslated
/// whose destination the router forwards out of the LAN interface (a LAN
/// host: not the router's own LAN address, not the subnet's broadcast) is
/// dropped as `DropUnsolicited` instead, also one not addressed to the
/// router's MAC. Packets passed translated (`PassNoNeighbour`), not
/// configured or too short to have a destination keep their verdicts; a
/// frame that is not IPv4 only if it has more priority tags than the data
/// path takes off (see [`too_many_priority_tags`]).
pub(super) fn standalone_policy(f: &[u8], from_lan: bool, ok: Vec<Counter>) -> Vec<Counter> {
    if from_lan {
        return lan_policy(f, ok);
    }
    if !is_ipv4(f) {
        return too_many_priority_tags(f).unwrap_or(ok);
    }
    if f.len() < L4_OFF {
        return ok;
    }
    let dst = [
        f[IP_OFF + 16],
        f[IP_OFF + 17],
        f[IP_OFF + 18],
        f[IP_OFF + 19],
    ];
    if !lan_host(dst) {
        return ok;
    }
    dropping_untranslated_passes(ok, Counter::DropUnsolicited)
}

/// Standalone mode's verdict on a frame with more priority tags (802.1Q or
/// 802.1ad, VLAN id 0) than the data path takes off (docs/standalone.md "Standalone
/// mode"): dropped as malformed, from either side (the kernel would strip
/// them all and forward what is inside). `None`: not such a frame (fewer
/// are taken off before the model is asked, see `check::case`; a tag of
/// another id or a frame cut short inside a tag is left as it is).
fn too_many_priority_tags(f: &[u8]) -> Option<Vec<Counter>> {
    let mut at = 12;
    for _ in 0..=frames::PRIORITY_TAGS_STRIPPED {
        let word = f.get(at..at + 4)?;
        if !matches!(be16(word, 0), 0x8100 | 0x88a8) || be16(word, 2) & 0x0fff != 0 {
            return None;
        }
        at += 4;
    }
    Some(vec![Counter::DropMalformed])
}

/// Standalone mode's check of what it passes from the LAN untranslated
/// (docs/standalone.md "Standalone mode"): with the router's WAN address as source it
/// is dropped (`DropSpoofedSource`: the kernel would forward it as the
/// router's own packet); passes the data path translated itself keep
/// their verdicts; a frame with too many priority tags as
/// [`too_many_priority_tags`] says.
fn lan_policy(f: &[u8], ok: Vec<Counter>) -> Vec<Counter> {
    if !is_ipv4(f) {
        return too_many_priority_tags(f).unwrap_or(ok);
    }
    if f.len() < L4_OFF || f[IP_OFF + 12..IP_OFF + 16] != WAN {
        return ok;
    }
    dropping_untranslated_passes(ok, Counter::DropSpoofedSource)
}

/// `ok` with every pass of a packet the data path did not translate
/// itself (all passes but no neighbour and too large translated, and
/// those with no IPv4 header or before the configuration) turned into
/// the drop `counter`.
fn dropping_untranslated_passes(ok: Vec<Counter>, counter: Counter) -> Vec<Counter> {
    ok.into_iter()
        .map(|c| {
            let untranslated_pass = c.name().starts_with("pass_")
                && !matches!(
                    c,
                    Counter::PassNoNeighbour
                        | Counter::PassMtuTranslated
                        | Counter::PassNotIpv4
                        | Counter::PassNotConfigured
                );
            if untranslated_pass { counter } else { c }
        })
        .collect()
}
