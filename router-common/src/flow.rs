//! Connection tracking logic: flow entries for a new flow, TCP state from
//! flags, idle expiry, and the choice of the SNAT port.

use crate::maps::{
    FLAG_FIN_ORIG, FLAG_FIN_REPLY, FLAG_ORIGINAL, FlowEntry, FlowKey, FlowState, IPPROTO_ICMP,
    IPPROTO_TCP, Timeouts,
};

/// How often (at most) the data path writes `last_seen_ns` of a flow: the
/// shared entries are not written on every packet, so CPUs do not bounce
/// their cache lines. Expiry is accurate to this interval.
pub const REFRESH_NS: u64 = 1_000_000_000;

/// SNAT ports tried for one new flow before giving up to the kernel.
pub const MAX_PORT_PROBES: u32 = 16;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// Whether a TCP segment with these flags may open a flow: a plain SYN.
/// Mid-stream segments of unknown flows go to the kernel; translating them
/// with a fresh port could not work anyway.
#[must_use]
pub const fn tcp_opens_flow(flags: u8) -> bool {
    flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN
}

/// The state of a new flow of protocol `proto`.
#[must_use]
pub const fn initial_state(proto: u8) -> FlowState {
    match proto {
        IPPROTO_TCP => FlowState::TcpSynSent,
        IPPROTO_ICMP => FlowState::Icmp,
        _ => FlowState::UdpUnreplied,
    }
}

/// Both entries of a new flow: `orig` as it arrives, `translated` as it
/// leaves. Returns (entry for `orig`, key of the reply direction, entry for
/// that key). The reply key is the reverse of the translated packet, and its
/// entry translates back to the reverse of `orig`.
#[must_use]
pub fn new_flow(
    orig: &FlowKey,
    translated: &FlowKey,
    extra_flags: u8,
    now_ns: u64,
) -> (FlowEntry, FlowKey, FlowEntry) {
    let mut out = (
        FlowEntry::default(),
        FlowKey::default(),
        FlowEntry::default(),
    );
    fill_new_flow(
        orig,
        translated,
        extra_flags,
        now_ns,
        &mut out.0,
        &mut out.1,
        &mut out.2,
    );
    out
}

/// [`new_flow`] writing into caller-provided places (the data path keeps
/// them in a per-CPU map: the BPF stack is only 512 bytes).
#[inline]
pub fn fill_new_flow(
    orig: &FlowKey,
    translated: &FlowKey,
    extra_flags: u8,
    now_ns: u64,
    orig_entry: &mut FlowEntry,
    reply_key: &mut FlowKey,
    reply_entry: &mut FlowEntry,
) {
    let state = initial_state(orig.proto) as u8;
    *reply_key = translated.reversed();
    orig_entry.peer = *reply_key;
    orig_entry.new_src_addr = translated.src_addr;
    orig_entry.new_dst_addr = translated.dst_addr;
    orig_entry.new_src_port = translated.src_port;
    orig_entry.new_dst_port = translated.dst_port;
    orig_entry.state = state;
    orig_entry.flags = FLAG_ORIGINAL | extra_flags;
    orig_entry.pad = [0; 2];
    orig_entry.last_seen_ns = now_ns;
    orig_entry.created_ns = now_ns;
    orig_entry.clear_next_hop();
    // The reply translates back to the reverse of the original packet.
    reply_entry.peer = *orig;
    reply_entry.new_src_addr = orig.dst_addr;
    reply_entry.new_dst_addr = orig.src_addr;
    reply_entry.new_src_port = orig.dst_port;
    reply_entry.new_dst_port = orig.src_port;
    reply_entry.state = state;
    reply_entry.flags = extra_flags;
    reply_entry.pad = [0; 2];
    reply_entry.last_seen_ns = now_ns;
    reply_entry.created_ns = now_ns;
    reply_entry.clear_next_hop();
}

/// The translated key of a masqueraded flow: source becomes `wan:port`
/// (for ICMP echo, the identifier in both port fields becomes `port`).
#[must_use]
#[inline]
pub const fn masquerade_key(orig: &FlowKey, wan_addr: [u8; 4], port: u16) -> FlowKey {
    let dst_port = if orig.proto == IPPROTO_ICMP {
        port
    } else {
        orig.dst_port
    };
    FlowKey::new(wan_addr, orig.dst_addr, port, dst_port, orig.proto)
}

/// Whether an entry last refreshed at `last_seen_ns` has been idle longer
/// than its state allows. Clocks of different CPUs may put `last_seen_ns`
/// slightly ahead of `now_ns`: that is fresh, not expired.
#[must_use]
pub const fn expired(state: u8, last_seen_ns: u64, now_ns: u64, t: &Timeouts) -> bool {
    let idle = now_ns.saturating_sub(last_seen_ns);
    idle > FlowState::timeout_secs(state, t) as u64 * 1_000_000_000
}

/// Whether `last_seen_ns` is old enough to be rewritten.
#[must_use]
pub const fn needs_refresh(last_seen_ns: u64, now_ns: u64) -> bool {
    now_ns.saturating_sub(last_seen_ns) >= REFRESH_NS
}

/// TCP state after a segment with `tcp_flags`, sent by the opening side
/// (`from_orig`) or the answering side. Returns the new (state, flags), equal
/// to the inputs when nothing changes. Simplified from netfilter's tracker:
/// RST or FIN from both sides closes; SYN+ACK from the answering side
/// establishes; a new SYN from the opening side reopens a closed flow
/// (port reuse, as netfilter allows after `TIME_WAIT`/`CLOSE`).
#[must_use]
pub const fn tcp_next(state: u8, flags: u8, from_orig: bool, tcp_flags: u8) -> (u8, u8) {
    let fin_bits = FLAG_FIN_ORIG | FLAG_FIN_REPLY;
    if tcp_flags & TCP_RST != 0 {
        return (FlowState::TcpClosed as u8, flags);
    }
    if state == FlowState::TcpClosed as u8 {
        if from_orig && tcp_opens_flow(tcp_flags) {
            return (FlowState::TcpSynSent as u8, flags & !fin_bits);
        }
        return (state, flags);
    }
    let mut flags = flags;
    if tcp_flags & TCP_FIN != 0 {
        flags |= if from_orig {
            FLAG_FIN_ORIG
        } else {
            FLAG_FIN_REPLY
        };
    }
    if flags & fin_bits == fin_bits {
        return (FlowState::TcpClosed as u8, flags);
    }
    if flags & fin_bits != 0 {
        return (FlowState::TcpFinWait as u8, flags);
    }
    if state == FlowState::TcpSynSent as u8
        && !from_orig
        && tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN | TCP_ACK
    {
        return (FlowState::TcpEstablished as u8, flags);
    }
    (state, flags)
}

/// 32-bit hash of a flow key with a per-attach seed (murmur3's finaliser
/// over the key's words): spreads SNAT port probes, not cryptographic.
#[must_use]
pub const fn flow_hash(k: &FlowKey, seed: u32) -> u32 {
    const fn mix(h: u32, w: u32) -> u32 {
        let w = w
            .wrapping_mul(0xcc9e_2d51)
            .rotate_left(15)
            .wrapping_mul(0x1b87_3593);
        (h ^ w)
            .rotate_left(13)
            .wrapping_mul(5)
            .wrapping_add(0xe654_6b64)
    }
    let mut h = seed;
    h = mix(h, u32::from_be_bytes(k.src_addr));
    h = mix(h, u32::from_be_bytes(k.dst_addr));
    h = mix(h, ((k.src_port as u32) << 16) | k.dst_port as u32);
    h = mix(h, k.proto as u32);
    h ^= 16;
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// The SNAT port to try on probe `attempt` (0-based) inside `[min, max]`.
/// Attempt 0 keeps the original port when it is in range (port
/// preservation, RFC 4787 REQ-3 recommends it; games and `VoIP` like it);
/// later attempts walk the range from a hashed start with an odd stride.
#[must_use]
pub const fn candidate_port(attempt: u32, orig_port: u16, hash: u32, min: u16, max: u16) -> u16 {
    let (min, max) = if min <= max { (min, max) } else { (max, min) };
    if attempt == 0 && orig_port >= min && orig_port <= max {
        return orig_port;
    }
    let size = max as u32 - min as u32 + 1;
    // Never true (max >= min); lets the compiler drop the division-by-zero
    // panic path, which BPF cannot have.
    if size == 0 {
        return min;
    }
    let step = attempt.wrapping_mul(0x9e37_79b1 | 1);
    let off = hash.wrapping_add(step) % size;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "off < size <= 65536, min + off <= max"
    )]
    let port = (min as u32 + off) as u16;
    port
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps::{FLAG_PORT_FORWARD, IPPROTO_UDP};
    use proptest::prelude::*;

    const LAN: [u8; 4] = [192, 168, 50, 2];
    const SRV: [u8; 4] = [203, 0, 113, 2];
    const WAN: [u8; 4] = [203, 0, 113, 1];

    #[test]
    fn masquerade_flow_entries_translate_both_ways() {
        let orig = FlowKey::new(LAN, SRV, 40000, 80, IPPROTO_TCP);
        let tr = masquerade_key(&orig, WAN, 1234);
        let (oe, rk, re) = new_flow(&orig, &tr, 0, 7);
        assert_eq!(rk, FlowKey::new(SRV, WAN, 80, 1234, IPPROTO_TCP));
        assert_eq!((oe.new_src_addr, oe.new_src_port), (WAN, 1234));
        assert_eq!((oe.new_dst_addr, oe.new_dst_port), (SRV, 80));
        assert_eq!((re.new_dst_addr, re.new_dst_port), (LAN, 40000));
        assert_eq!((re.new_src_addr, re.new_src_port), (SRV, 80));
        assert_eq!(oe.peer, rk);
        assert_eq!(re.peer, orig);
        assert_eq!(oe.flags, FLAG_ORIGINAL);
        assert_eq!(re.flags, 0);
        assert_eq!(oe.state, FlowState::TcpSynSent as u8);
        assert_eq!((oe.created_ns, re.last_seen_ns), (7, 7));
    }

    #[test]
    fn icmp_masquerade_rewrites_the_identifier_in_both_fields() {
        let orig = FlowKey::new(LAN, SRV, 77, 77, IPPROTO_ICMP);
        let tr = masquerade_key(&orig, WAN, 900);
        assert_eq!((tr.src_port, tr.dst_port), (900, 900));
        let (_, rk, re) = new_flow(&orig, &tr, 0, 0);
        assert_eq!(rk, FlowKey::new(SRV, WAN, 900, 900, IPPROTO_ICMP));
        assert_eq!((re.new_src_port, re.new_dst_port), (77, 77));
        assert_eq!(re.state, FlowState::Icmp as u8);
    }

    #[test]
    fn port_forward_flow_entries() {
        let remote = [198, 51, 100, 9];
        let orig = FlowKey::new(remote, WAN, 5555, 8080, IPPROTO_UDP);
        let tr = FlowKey::new(remote, LAN, 5555, 80, IPPROTO_UDP);
        let (oe, rk, re) = new_flow(&orig, &tr, FLAG_PORT_FORWARD, 0);
        assert_eq!(rk, FlowKey::new(LAN, remote, 80, 5555, IPPROTO_UDP));
        assert_eq!((re.new_src_addr, re.new_src_port), (WAN, 8080));
        assert_eq!((oe.new_dst_addr, oe.new_dst_port), (LAN, 80));
        assert_eq!(oe.flags, FLAG_ORIGINAL | FLAG_PORT_FORWARD);
        assert_eq!(re.state, FlowState::UdpUnreplied as u8);
    }

    #[test]
    fn tcp_lifecycle() {
        let s = FlowState::TcpSynSent as u8;
        let est = FlowState::TcpEstablished as u8;
        // The SYN itself and a retransmitted SYN keep SYN_SENT.
        assert_eq!(tcp_next(s, 1, true, TCP_SYN), (s, 1));
        // A bare ACK from the reply side does not establish; SYN+ACK does.
        assert_eq!(tcp_next(s, 0, false, TCP_ACK), (s, 0));
        assert_eq!(tcp_next(s, 0, false, TCP_SYN | TCP_ACK), (est, 0));
        assert_eq!(tcp_next(est, 0, true, TCP_ACK), (est, 0));
        let (st, f) = tcp_next(est, 0, true, TCP_FIN | TCP_ACK);
        assert_eq!((st, f), (FlowState::TcpFinWait as u8, FLAG_FIN_ORIG));
        // A second FIN from the same side changes nothing.
        assert_eq!(tcp_next(st, f, true, TCP_FIN | TCP_ACK), (st, f));
        let (st, f) = tcp_next(st, f, false, TCP_FIN | TCP_ACK);
        assert_eq!(
            (st, f),
            (FlowState::TcpClosed as u8, FLAG_FIN_ORIG | FLAG_FIN_REPLY)
        );
        // Closed: an ACK stays closed, a new SYN from the opener reopens.
        assert_eq!(tcp_next(st, f, true, TCP_ACK), (st, f));
        assert_eq!(tcp_next(st, f, false, TCP_SYN), (st, f));
        assert_eq!(tcp_next(st, f, true, TCP_SYN), (s, 0));
    }

    #[test]
    fn rst_closes_from_any_state() {
        for st in 1..=4 {
            for orig in [true, false] {
                assert_eq!(
                    tcp_next(st, 0, orig, TCP_RST | TCP_ACK).0,
                    FlowState::TcpClosed as u8
                );
            }
        }
    }

    #[test]
    fn opens_only_on_plain_syn() {
        assert!(tcp_opens_flow(TCP_SYN));
        assert!(tcp_opens_flow(TCP_SYN | 0x08)); // PSH is harmless
        assert!(!tcp_opens_flow(TCP_SYN | TCP_ACK));
        assert!(!tcp_opens_flow(TCP_ACK));
        assert!(!tcp_opens_flow(TCP_SYN | TCP_RST));
        assert!(!tcp_opens_flow(TCP_SYN | TCP_FIN));
    }

    #[test]
    fn expiry_per_state() {
        let t = Timeouts::default();
        let s = FlowState::TcpClosed as u8;
        assert!(!expired(s, 0, 10_000_000_000, &t));
        assert!(expired(s, 0, 10_000_000_001, &t));
        // last_seen ahead of now (other CPU's clock): fresh.
        assert!(!expired(s, 50, 10, &t));
        assert!(!expired(
            FlowState::TcpEstablished as u8,
            0,
            3600 * 1_000_000_000,
            &t
        ));
        assert!(needs_refresh(0, REFRESH_NS));
        assert!(!needs_refresh(5, REFRESH_NS));
    }

    #[test]
    fn preserves_port_in_range_only() {
        assert_eq!(candidate_port(0, 40000, 123, 1024, 65535), 40000);
        let p = candidate_port(0, 80, 123, 1024, 65535);
        assert!((1024..=65535).contains(&p));
        assert_eq!(candidate_port(0, 5, 0, 5, 5), 5);
        assert_eq!(candidate_port(3, 5, 99, 5, 5), 5);
    }

    #[test]
    fn probes_spread_over_the_range() {
        let k = FlowKey::new(LAN, SRV, 40000, 80, IPPROTO_TCP);
        let h = flow_hash(&k, 1);
        let mut seen = std::collections::BTreeSet::new();
        for a in 1..MAX_PORT_PROBES {
            seen.insert(candidate_port(a, 40000, h, 1024, 65535));
        }
        assert_eq!(
            seen.len(),
            MAX_PORT_PROBES as usize - 1,
            "probes repeat: {seen:?}"
        );
        assert_ne!(flow_hash(&k, 1), flow_hash(&k, 2), "seed changes the hash");
    }

    proptest! {
        #[test]
        fn candidate_always_in_range(attempt in 0u32..64, orig: u16, hash: u32, a: u16, b: u16) {
            let p = candidate_port(attempt, orig, hash, a, b);
            prop_assert!(p >= a.min(b) && p <= a.max(b));
        }

        #[test]
        fn new_flow_round_trips(src: [u8; 4], dst: [u8; 4], sp: u16, dp: u16, wan: [u8; 4], port: u16) {
            // Translating the original packet and then the reply with the
            // two entries gives back the original tuple, reversed.
            let orig = FlowKey::new(src, dst, sp, dp, IPPROTO_TCP);
            let tr = masquerade_key(&orig, wan, port);
            let (oe, rk, re) = new_flow(&orig, &tr, 0, 0);
            let out = FlowKey::new(oe.new_src_addr, oe.new_dst_addr, oe.new_src_port, oe.new_dst_port, 6);
            prop_assert_eq!(out.reversed(), rk);
            let back = FlowKey::new(re.new_src_addr, re.new_dst_addr, re.new_src_port, re.new_dst_port, 6);
            prop_assert_eq!(back, orig.reversed());
            prop_assert_eq!(re.peer, orig);
        }
    }
}
