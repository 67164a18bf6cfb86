//! NAT mappings of standalone mode (RFC 4787 for UDP, RFC 5382 for TCP):
//! endpoint-independent mapping, the three filtering behaviours, mapping
//! lifetimes, and the translated tuple of a hairpinned flow.
//!
//! A mapping ties an external port on the WAN address (per protocol) to
//! one internal endpoint. Every flow of that endpoint, whatever its
//! destination, leaves with that port (REQ-1 of both RFCs), also when the
//! endpoint's own port was taken and another one was chosen. The data path
//! keeps the mappings in `NAT_MAPPINGS` (external port -> endpoint; its
//! `BPF_NOEXIST` insert is the cross-CPU lock on the port) and
//! `NAT_ENDPOINTS` (endpoint -> external port). A mapping is refreshed when
//! one of its flows is created and by that flow's outbound packets, at most
//! once per refresh tick ([`refresh_tick`], about a second) per flow,
//! never per packet and never by inbound packets (RFC 4787 REQ-6); a TCP
//! flow's state change (SYN+ACK, FIN, RST) sets its mapping's expiry from
//! the new state whichever side sent the segment (RFC 5382 REQ-5), so the
//! port of a closed connection comes free after the closed state's timeout.
//!
//! Port parity and contiguity (RFC 4787 REQ-4 and section 4.2.3) are not
//! kept: the first choice is the endpoint's own port (port preservation,
//! REQ-3 "RECOMMENDED"), which keeps parity when it works; on a collision
//! the port is hashed from the range, of any parity, and an RTP/RTCP pair
//! may end up on non-adjacent ports.

use crate::{
    flow::masquerade_key,
    maps::{
        Endpoint, FLAG_MAPPED, Filtering, FlowEntry, FlowKey, FlowState, IPPROTO_TCP, IPPROTO_UDP,
        Mapping, Timeouts,
    },
};

/// Minimum lifetime of a UDP mapping after its last refresh, in seconds.
/// RFC 4787 REQ-5: a UDP mapping MUST NOT expire in less than two
/// minutes, and five minutes is RECOMMENDED; this takes the recommended
/// five, which keeps P2P and `VoIP` mappings alive across keep-alive
/// intervals of a few minutes (many applications send one every two to
/// three minutes, which the two-minute floor would cut).
pub const UDP_MAPPING_SECS: u32 = 300;

impl Endpoint {
    /// The endpoint as one integer, for comparisons: the derived `==` of
    /// its byte array becomes a `bcmp` loop in BPF, which the verifier
    /// walks byte by byte.
    #[must_use]
    #[inline]
    pub const fn bits(&self) -> u64 {
        u32::from_ne_bytes(self.addr) as u64 | (self.port as u64) << 32 | (self.proto as u64) << 48
    }

    /// The internal endpoint of a flow key seen from the LAN: its source.
    #[must_use]
    #[inline]
    pub const fn source_of(k: &FlowKey) -> Self {
        Self {
            addr: k.src_addr,
            port: k.src_port,
            proto: k.proto,
            pad: 0,
        }
    }
}

/// How long a mapping stays alive after a refresh by a flow of protocol
/// `proto` in state `state`: as long as that flow can live idle (so a
/// mapping never expires under a live flow that refreshed it last), and a
/// UDP mapping at least [`UDP_MAPPING_SECS`]. A TCP mapping so follows its
/// connection: established (at least 2 h 4 min, RFC 5382 REQ-5; 5 days by
/// default), then the closing states' short timeouts, so that the ports of
/// closed connections come free as fast as the conntrack entries do.
#[must_use]
#[inline]
pub const fn mapping_secs(proto: u8, state: u8, t: &Timeouts) -> u32 {
    let flow = FlowState::timeout_secs(state, t);
    if proto == IPPROTO_UDP && flow < UDP_MAPPING_SECS {
        UDP_MAPPING_SECS
    } else {
        flow
    }
}

/// The expiry time a flow of protocol `proto` in state `state` needs of
/// its mapping at `now_ns`.
#[must_use]
#[inline]
pub const fn mapping_expiry(proto: u8, state: u8, now_ns: u64, t: &Timeouts) -> u64 {
    now_ns + mapping_secs(proto, state, t) as u64 * 1_000_000_000
}

/// The expiry of a mapping that expired at `current` after a refresh at
/// `now_ns` by one of its flows, of protocol `proto` in state `state`.
/// UDP (and ICMP echo): never earlier than it was, as a new flow's claim
/// extends it, so a flow with a shorter timeout (unreplied, say) cannot cut
/// the mapping short under an older live flow with a longer one (RFC 4787
/// REQ-5: a mapping lives as long as its flows need). TCP: set from the
/// state, shorter too, so that the mapping follows its connection to the
/// close and the port of a closed connection comes free after the closed
/// state's timeout (RFC 5382 REQ-5 asks only that established
/// connections' mappings live at least 2 h 4 min). With several TCP
/// connections on one internal port the mapping follows the one that
/// refreshed it last.
#[must_use]
#[inline]
pub const fn refreshed_expiry(
    proto: u8,
    current: u64,
    state: u8,
    now_ns: u64,
    t: &Timeouts,
) -> u64 {
    let want = mapping_expiry(proto, state, now_ns, t);
    if proto != IPPROTO_TCP && current > want {
        current
    } else {
        want
    }
}

/// How coarse the outbound refresh of a mapping is: [`refresh_tick`]
/// counts units of `1 << REFRESH_TICK_SHIFT` ns (1.07 s), about
/// `flow::REFRESH_NS`.
pub const REFRESH_TICK_SHIFT: u32 = 30;

/// The refresh tick of `now_ns` (see [`FlowEntry::out_tick`]): a shift
/// instead of a division, kept in 16 bits, so it wraps after 65536 ticks
/// (19.5 hours). An outbound packet exactly a multiple of that after the
/// last outbound refresh (no outbound packet in between) skips one
/// refresh; the next packet in another tick makes it.
#[must_use]
#[inline]
pub const fn refresh_tick(now_ns: u64) -> u16 {
    #[expect(clippy::cast_possible_truncation, reason = "wraps, see above")]
    let t = (now_ns >> REFRESH_TICK_SHIFT) as u16;
    t
}

/// Whether the entry `e`, hit at `now_ns` by a packet that arrived on the
/// LAN (`from_lan`; a hit's entry is always of its packet's side, which
/// the look-up checks, so this is [`FlowEntry::lan_side`] without
/// computing it again), is due to refresh its flow's NAT mapping: an
/// outbound packet (outbound refresh only, RFC 4787 REQ-6) of a flow with
/// a mapping whose own outbound refresh tick has passed, whatever
/// direction refreshed `last_seen_ns`. The hit path's whole cost: the
/// side it knows, a test of the entry's flags and a compare of one 16-bit
/// field next to them.
#[must_use]
#[inline]
pub const fn outbound_refresh_due(from_lan: bool, e: &FlowEntry, now_ns: u64) -> bool {
    from_lan && e.flags & FLAG_MAPPED != 0 && e.out_tick != refresh_tick(now_ns)
}

/// The mapping a flow's entry `e`, hit through `key`, belongs to: its
/// external port and the internal endpoint that must own it. On the LAN
/// side the key's source is the internal endpoint and the translated
/// source port the mapping's; on the WAN side (a masqueraded flow's reply,
/// or a flow opened from the WAN to a mapping) the key's destination port
/// is the mapping's and the translated destination the endpoint. Of a
/// hairpinned flow (both entries on the LAN side) each entry names its
/// sender's mapping.
#[must_use]
#[inline]
pub const fn mapping_of(key: &FlowKey, e: &FlowEntry) -> (u16, Endpoint) {
    if e.lan_side() {
        (e.new_src_port, Endpoint::source_of(key))
    } else {
        (
            key.dst_port,
            Endpoint {
                addr: e.new_dst_addr,
                port: e.new_dst_port,
                proto: key.proto,
                pad: 0,
            },
        )
    }
}

/// Whether mapping `m` is alive at `now_ns`.
#[must_use]
#[inline]
pub const fn live(m: &Mapping, now_ns: u64) -> bool {
    now_ns <= m.expires_ns
}

/// Whether mapping `m` is alive and belongs to the endpoint `ep`.
#[must_use]
#[inline]
pub fn held_by(m: &Mapping, ep: &Endpoint, now_ns: u64) -> bool {
    live(m, now_ns) && m.internal.bits() == ep.bits()
}

/// Whether a new inbound flow from a remote to a live mapping owned by
/// `owner` is let in under the `Config::filtering` byte `filtering`, given
/// the address-dependent permission found for the remote's address
/// (`permit`: the endpoint that sent to that address through this port).
/// Address-and-port-dependent filtering lets in no new flow: only replies
/// of known flows, which are conntrack hits and never come here.
#[must_use]
#[inline]
pub fn filter_admits(filtering: u8, owner: &Endpoint, permit: Option<&Endpoint>) -> bool {
    match Filtering::from_u8(filtering) {
        Filtering::EndpointIndependent => true,
        Filtering::AddressDependent => matches!(permit, Some(p) if p.bits() == owner.bits()),
        Filtering::AddressPortDependent => false,
    }
}

/// The translated key of a new LAN flow leaving with external `port`:
/// masqueraded (`hairpin` `None`: only the source changes) or hairpinned
/// to the internal endpoint `hairpin` (the destination, the WAN address
/// and a mapped or forwarded port, becomes that endpoint, so the flow's
/// reply key is the target's packet back to `wan_addr:port`).
#[must_use]
#[inline]
pub const fn translated_key(
    orig: &FlowKey,
    wan_addr: [u8; 4],
    port: u16,
    hairpin: Option<&Endpoint>,
) -> FlowKey {
    match hairpin {
        Some(t) => FlowKey::new(wan_addr, t.addr, port, t.port, orig.proto),
        None => masquerade_key(orig, wan_addr, port),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        flow::new_flow,
        maps::{FLAG_HAIRPIN, FLAG_MAPPED, FLAG_PORT_FORWARD, IPPROTO_ICMP, IPPROTO_TCP},
    };

    const A: [u8; 4] = [192, 168, 50, 2];
    const B: [u8; 4] = [192, 168, 50, 3];
    const WAN: [u8; 4] = [203, 0, 113, 1];
    const SRV: [u8; 4] = [203, 0, 113, 2];

    fn ep(addr: [u8; 4], port: u16, proto: u8) -> Endpoint {
        Endpoint {
            addr,
            port,
            proto,
            pad: 0,
        }
    }

    #[test]
    fn udp_mappings_live_at_least_five_minutes_tcp_ones_follow_the_connection() {
        let t = Timeouts::default();
        for state in [FlowState::UdpUnreplied, FlowState::UdpReplied] {
            let s = mapping_secs(IPPROTO_UDP, state as u8, &t);
            assert!(s >= 120, "REQ-5 floor");
            assert_eq!(s, UDP_MAPPING_SECS);
        }
        let mut long = t;
        long.udp_replied = 600;
        assert_eq!(
            mapping_secs(IPPROTO_UDP, FlowState::UdpReplied as u8, &long),
            600,
            "never shorter than the flow it serves"
        );
        let est = mapping_secs(IPPROTO_TCP, FlowState::TcpEstablished as u8, &t);
        assert!(est >= 2 * 3600 + 4 * 60, "RFC 5382 REQ-5");
        assert_eq!(
            mapping_secs(IPPROTO_TCP, FlowState::TcpClosed as u8, &t),
            t.tcp_closed
        );
        assert_eq!(
            mapping_secs(IPPROTO_ICMP, FlowState::Icmp as u8, &t),
            t.icmp
        );
    }

    #[test]
    fn udp_refresh_never_shortens_tcp_refresh_follows_the_state() {
        let t = Timeouts {
            udp_replied: 600,
            ..Timeouts::default()
        };
        let now = 5_000_000_000;
        let s = 1_000_000_000;
        let replied = FlowState::UdpReplied as u8;
        let unreplied = FlowState::UdpUnreplied as u8;
        // A replied flow's 600 s, then an unreplied one's 300 s: kept.
        let long = refreshed_expiry(IPPROTO_UDP, 0, replied, now, &t);
        assert_eq!(long, now + 600 * s);
        assert_eq!(
            refreshed_expiry(IPPROTO_UDP, long, unreplied, now + s, &t),
            long
        );
        assert_eq!(
            refreshed_expiry(IPPROTO_UDP, now, unreplied, now + s, &t),
            now + 301 * s,
            "extended"
        );
        assert_eq!(
            refreshed_expiry(IPPROTO_ICMP, now + 100 * s, FlowState::Icmp as u8, now, &t),
            now + 100 * s
        );
        // TCP: the close lowers an established connection's 5 days.
        let est = refreshed_expiry(IPPROTO_TCP, 0, FlowState::TcpEstablished as u8, now, &t);
        assert_eq!(est, now + u64::from(t.tcp_established) * s);
        assert_eq!(
            refreshed_expiry(IPPROTO_TCP, est, FlowState::TcpClosed as u8, now + s, &t),
            now + s + u64::from(t.tcp_closed) * s
        );
    }

    #[test]
    fn outbound_refresh_is_due_once_per_tick_on_the_lan_side_only() {
        let orig = FlowKey::new(A, SRV, 5000, 53, IPPROTO_UDP);
        let tr = masquerade_key(&orig, WAN, 5555);
        let now = 7 << REFRESH_TICK_SHIFT;
        let (mut oe, _, mut re) = new_flow(&orig, &tr, FLAG_MAPPED, now);
        let due = |e: &FlowEntry, now| outbound_refresh_due(e.lan_side(), e, now);
        assert!(due(&oe, now), "due after the creation");
        oe.out_tick = refresh_tick(now);
        assert!(!due(&oe, now + (1 << REFRESH_TICK_SHIFT) - 1));
        assert!(due(&oe, now + (1 << REFRESH_TICK_SHIFT)));
        re.out_tick = 3;
        assert!(!due(&re, now), "inbound: never (REQ-6)");
        oe.flags &= !FLAG_MAPPED;
        oe.out_tick = 3;
        assert!(!due(&oe, now), "no mapping");
        // The tick wraps in 16 bits.
        assert_eq!(refresh_tick(0x1_0000 << REFRESH_TICK_SHIFT), 0);
    }

    #[test]
    fn both_entries_name_the_flows_mapping() {
        let owner = ep(A, 5000, IPPROTO_TCP);
        // Masqueraded: A:5000 -> SRV:443 leaves as WAN:5555.
        let orig = FlowKey::new(A, SRV, 5000, 443, IPPROTO_TCP);
        let tr = masquerade_key(&orig, WAN, 5555);
        let (oe, rk, re) = new_flow(&orig, &tr, FLAG_MAPPED, 1);
        assert_eq!(mapping_of(&orig, &oe), (5555, owner));
        assert_eq!(mapping_of(&rk, &re), (5555, owner));
        // Opened from the WAN to the mapping (endpoint-independent
        // filtering): SRV:9 -> WAN:5555 reaches A:5000.
        let orig = FlowKey::new(SRV, WAN, 9, 5555, IPPROTO_TCP);
        let tr = FlowKey::new(SRV, A, 9, 5000, IPPROTO_TCP);
        let (oe, rk, re) = new_flow(&orig, &tr, FLAG_PORT_FORWARD | FLAG_MAPPED, 1);
        assert_eq!(mapping_of(&orig, &oe), (5555, owner));
        assert_eq!(mapping_of(&rk, &re), (5555, owner));
        // Hairpinned: each entry names its sender's mapping.
        let orig = FlowKey::new(A, WAN, 5000, 7000, IPPROTO_UDP);
        let target = ep(B, 6000, IPPROTO_UDP);
        let tr = translated_key(&orig, WAN, 5555, Some(&target));
        let (oe, rk, re) = new_flow(&orig, &tr, FLAG_MAPPED | FLAG_HAIRPIN, 1);
        assert_eq!(mapping_of(&orig, &oe), (5555, ep(A, 5000, IPPROTO_UDP)));
        assert_eq!(mapping_of(&rk, &re), (7000, target));
    }

    #[test]
    fn expiry_and_ownership() {
        let t = Timeouts::default();
        let now = 5_000_000_000;
        let owner = ep(A, 4000, IPPROTO_UDP);
        let m = Mapping {
            internal: owner,
            expires_ns: mapping_expiry(IPPROTO_UDP, FlowState::UdpUnreplied as u8, now, &t),
        };
        assert!(held_by(&m, &owner, now));
        assert!(held_by(&m, &owner, now + 300_000_000_000));
        assert!(!live(&m, now + 300_000_000_001));
        assert!(!held_by(&m, &ep(A, 4001, IPPROTO_UDP), now));
        assert!(!held_by(&m, &ep(B, 4000, IPPROTO_UDP), now));
        assert!(!held_by(&m, &ep(A, 4000, IPPROTO_TCP), now));
    }

    #[test]
    fn each_filtering_admits_exactly_its_remotes() {
        let owner = ep(A, 4000, IPPROTO_UDP);
        let other = ep(B, 4000, IPPROTO_UDP);
        let ei = Filtering::EndpointIndependent as u8;
        let ad = Filtering::AddressDependent as u8;
        let apd = Filtering::AddressPortDependent as u8;
        assert!(filter_admits(ei, &owner, None));
        assert!(filter_admits(ei, &owner, Some(&other)));
        assert!(filter_admits(ad, &owner, Some(&owner)));
        assert!(!filter_admits(ad, &owner, None));
        assert!(
            !filter_admits(ad, &owner, Some(&other)),
            "a permission left by the port's previous owner"
        );
        assert!(!filter_admits(apd, &owner, Some(&owner)));
        assert!(!filter_admits(apd, &owner, None));
        assert!(
            !filter_admits(99, &owner, Some(&owner)),
            "unknown: strictest"
        );
        for f in Filtering::ALL {
            assert_eq!(Filtering::from_u8(f as u8), f);
        }
    }

    #[test]
    fn hairpin_entries_translate_both_ways_on_the_lan_side() {
        // A:5000 -> WAN:7000 (B:6000's mapping); A leaves with its own
        // mapping's port 5555.
        let orig = FlowKey::new(A, WAN, 5000, 7000, IPPROTO_UDP);
        let target = ep(B, 6000, IPPROTO_UDP);
        let tr = translated_key(&orig, WAN, 5555, Some(&target));
        assert_eq!(tr, FlowKey::new(WAN, B, 5555, 6000, IPPROTO_UDP));
        let (oe, rk, re) = new_flow(&orig, &tr, FLAG_MAPPED | FLAG_HAIRPIN, 1);
        // B answers to A's mapping; the reply reaches A from B's mapping.
        assert_eq!(rk, FlowKey::new(B, WAN, 6000, 5555, IPPROTO_UDP));
        assert_eq!((re.new_src_addr, re.new_src_port), (WAN, 7000));
        assert_eq!((re.new_dst_addr, re.new_dst_port), (A, 5000));
        assert_eq!((oe.new_src_addr, oe.new_src_port), (WAN, 5555));
        assert_eq!((oe.new_dst_addr, oe.new_dst_port), (B, 6000));
        assert!(
            oe.lan_side() && re.lan_side(),
            "both packets come from the LAN"
        );
        // Without the hairpin flag only the opening side is the LAN's.
        let (oe, _, re) = new_flow(&orig, &tr, FLAG_MAPPED, 1);
        assert!(oe.lan_side() && !re.lan_side());
        let (oe, _, re) = new_flow(&orig, &tr, FLAG_PORT_FORWARD | FLAG_MAPPED, 1);
        assert!(!oe.lan_side() && re.lan_side());
    }

    #[test]
    fn masquerade_translation_keeps_the_destination() {
        let orig = FlowKey::new(A, SRV, 5000, 53, IPPROTO_UDP);
        assert_eq!(
            translated_key(&orig, WAN, 5555, None),
            FlowKey::new(WAN, SRV, 5555, 53, IPPROTO_UDP)
        );
        assert_eq!(Endpoint::source_of(&orig), ep(A, 5000, IPPROTO_UDP));
    }
}
