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
//! never per packet; inbound packets never refresh a UDP or ICMP mapping
//! (RFC 4787 REQ-6). A TCP flow's state change (SYN+ACK, FIN, RST) also
//! refreshes its mapping from the new state whichever side sent the
//! segment (RFC 5382 REQ-5): the server's SYN+ACK extends it to the
//! established timeout, and the close of the connection that set the
//! mapping's expiry (its setter, [`refreshed_mapping`]) lowers it, so the
//! port of a closed connection comes free after the closed state's
//! timeout. Any other flow only extends a mapping.
//!
//! Port parity and contiguity (RFC 4787 REQ-4 and section 4.2.3) are not
//! kept: the first choice is the endpoint's own port (port preservation,
//! REQ-3 "RECOMMENDED"), which keeps parity when it works; on a collision
//! the port is hashed from the range, of any parity, and an RTP/RTCP pair
//! may end up on non-adjacent ports.

use crate::{
    flow::masquerade_key,
    maps::{
        Endpoint, FLAG_HAIRPIN, FLAG_MAPPED, FLAG_ORIGINAL, FLAG_PORT_FORWARD, Filtering,
        FlowEntry, FlowKey, FlowState, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, Mapping, Timeouts,
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
/// mapping never expires under the live flow that set its expiry, see
/// [`refreshed_mapping`]), and a
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

/// How long a LAN flow that the data path left to the kernel's slow-path
/// NAT (`KERNEL_FLOWS`: it could not open it) stays there after its last
/// packet from the LAN, in seconds: as long as a mapping of the data
/// path's own would live for it (a TCP connection's opening, an ICMP
/// echo's, a UDP flow's mapping floor). Its later packets then keep the
/// kernel's mapping instead of moving to one of the data path's
/// mid-session (RFC 4787 REQ-11: deterministic mapping). For UDP that is
/// longer than the kernel keeps an idle entry (30 s, 120 s once replied):
/// a flow idle past that is opened afresh by the kernel, with a port of
/// its own again, never one of the data path's.
#[must_use]
#[inline]
pub const fn kernel_flow_secs(proto: u8, t: &Timeouts) -> u32 {
    match proto {
        IPPROTO_TCP => t.tcp_syn_sent,
        IPPROTO_ICMP => t.icmp,
        _ if t.udp_replied > UDP_MAPPING_SECS => t.udp_replied,
        _ => UDP_MAPPING_SECS,
    }
}

/// Whether a flow left to the kernel whose last LAN packet came at
/// `last_ns` is still the kernel's at `now_ns` (see [`kernel_flow_secs`]).
#[must_use]
#[inline]
pub const fn kernel_flow_live(last_ns: u64, now_ns: u64, proto: u8, t: &Timeouts) -> bool {
    now_ns.saturating_sub(last_ns) < kernel_flow_secs(proto, t) as u64 * 1_000_000_000
}

/// The tag of a flow's remote endpoint `addr:port` as the LAN side sees
/// it (the server of a masqueraded flow, the remote host of one opened
/// from the WAN, the WAN address and mapped port of a hairpinned one):
/// 8 bits of a multiplicative hash, kept in the spare byte of a mapping's
/// internal endpoint ([`Endpoint::pad`], which [`Endpoint::bits`] and
/// every ownership comparison ignore) to name the flow that set the
/// mapping's expiry (see [`refreshed_mapping`]). Two remotes may share a
/// tag (about 1 in 256). Never 0: a `pad` of 0 means the setter is unknown (a
/// mapping written by an older build, before the tag existed, and kept
/// across a live replace), and as an argument of [`refreshed_mapping`] a
/// flow that never becomes the setter.
#[must_use]
#[inline]
pub const fn remote_tag(addr: [u8; 4], port: u16) -> u8 {
    let x =
        (u32::from_ne_bytes(addr) ^ (port as u32) << 16 ^ port as u32).wrapping_mul(0x9E37_79B1);
    let t = (x >> 24) as u8;
    t | (t == 0) as u8
}

/// Mapping `m` after a refresh at `now_ns` by one of its flows, of
/// protocol `proto` in state `state` (before the refresh: `old_state`,
/// the same when the state did not change), whose remote has the tag
/// `tag` ([`remote_tag`]; 0 for a flow opened towards the mapping, see
/// [`mapping_of`]). The mapping's internal endpoint's `pad` byte holds
/// the tag of its setter, the flow whose refresh set its current expiry.
/// - A refresh that needs a later expiry extends the mapping, and its
///   flow becomes the setter (also UDP and ICMP echo: a flow with a
///   shorter timeout, unreplied, say, never cuts the mapping short under
///   an older live flow with a longer one; RFC 4787 REQ-5). A flow opened
///   towards the mapping (tag 0: from the WAN, or a hairpin's target
///   side) extends it too but never becomes the setter, and never lowers
///   it: a remote that connects to a listening LAN endpoint and then
///   resets cannot cut its mapping (the mapping then lives on until the
///   expiry that connection gave it).
/// - Only a TCP refresh by the setter (by any flow the mapping's endpoint
///   opened if the setter is unknown: `pad` 0) lowers it, to the new state's
///   timeout, so that the mapping follows its connection to the close and
///   the port of a closed connection comes free after the closed state's
///   timeout (RFC 5382 REQ-5 asks only that established connections'
///   mappings live at least 2 h 4 min). A sibling connection of the same
///   internal endpoint (another remote) that closes, or that sits in
///   `SYN_SENT`, does not cut the mapping of an idle established one.
/// - The setter lowers only a mapping that lives no longer than its flow's
///   previous state needed (`m.expires_ns <= mapping_expiry(old_state)`):
///   the established state's close (to `FIN_WAIT` or `CLOSED`), then
///   `FIN_WAIT`'s, and a connection refused at its SYN (`SYN_SENT` to
///   `CLOSED`: a mapping its SYN created) lower; a flow that never was
///   established (`SYN_SENT`, `FIN_WAIT` reached from it, a `CLOSED` flow
///   reopened by a SYN) and only shares the setter's tag (a remote that
///   sends SYN, FIN or RST from many ports to a mapped port) cannot cut
///   an established connection's mapping.
///
/// With several connections on one internal port the mapping follows the
/// one that extended it last: when that one closes, an older idle
/// connection's mapping is cut until its next outbound packet.
#[must_use]
#[inline]
pub const fn refreshed_mapping(
    m: &Mapping,
    proto: u8,
    state: u8,
    old_state: u8,
    tag: u8,
    now_ns: u64,
    t: &Timeouts,
) -> Mapping {
    let want = mapping_expiry(proto, state, now_ns, t);
    let mut out = *m;
    if want > m.expires_ns {
        out.expires_ns = want;
        if tag != 0 {
            out.internal.pad = tag;
        }
    } else if proto == IPPROTO_TCP
        && tag != 0
        && (tag == m.internal.pad || m.internal.pad == 0)
        && m.expires_ns <= mapping_expiry(proto, old_state, now_ns, t)
    {
        out.expires_ns = want;
    }
    out
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
/// sender's mapping. Third: the tag the flow refreshes the mapping with
/// ([`refreshed_mapping`]): the [`remote_tag`] of the flow's remote, the
/// key's destination on the LAN side, its source on the WAN side (the
/// same remote for both entries), for a flow the mapping's endpoint
/// opened; 0 for one opened towards the mapping ([`opened_inward`]).
#[must_use]
#[inline]
pub const fn mapping_of(key: &FlowKey, e: &FlowEntry) -> (u16, Endpoint, u8) {
    let (port, ep, tag) = if e.lan_side() {
        (
            e.new_src_port,
            Endpoint::source_of(key),
            remote_tag(key.dst_addr, key.dst_port),
        )
    } else {
        (
            key.dst_port,
            translated_destination(key, e),
            remote_tag(key.src_addr, key.src_port),
        )
    };
    (port, ep, if opened_inward(e.flags) { 0 } else { tag })
}

/// The endpoint a WAN-side entry `e` (hit through `key`) translates to:
/// the LAN endpoint whose mapping the entry's destination port is.
#[inline]
const fn translated_destination(key: &FlowKey, e: &FlowEntry) -> Endpoint {
    Endpoint {
        addr: e.new_dst_addr,
        port: e.new_dst_port,
        proto: key.proto,
        pad: 0,
    }
}

/// The other mapping a hairpinned flow's target-side entry `e` (its reply
/// entry, hit through `key`) belongs to: the opener's, named as a WAN-side
/// entry names it ([`mapping_of`] names the target's, with tag 0): the
/// key's destination port, the translated destination as its endpoint,
/// and the tag of the translated source (the WAN address and the port the
/// opener sent to), which is the tag the opener's entry refreshes it
/// with. `None` for every other entry. A TCP state change on the target
/// side (its FIN or RST, often first: servers close idle connections)
/// refreshes this mapping too, so it follows its connection to the close
/// from either side (RFC 5382 REQ-5) and the opener's port comes free.
#[must_use]
#[inline]
pub const fn hairpin_opener_mapping(key: &FlowKey, e: &FlowEntry) -> Option<(u16, Endpoint, u8)> {
    if e.flags & (FLAG_HAIRPIN | FLAG_ORIGINAL) != FLAG_HAIRPIN {
        return None;
    }
    Some((
        key.dst_port,
        translated_destination(key, e),
        remote_tag(e.new_src_addr, e.new_src_port),
    ))
}

/// Whether the entry with `flags` is of a flow opened towards the mapping
/// [`mapping_of`] names: from the WAN through it (endpoint-independent or
/// address-dependent filtering, [`FLAG_PORT_FORWARD`] with
/// [`FLAG_MAPPED`]), or the target side of a hairpin (its reply entry,
/// which names the target's mapping).
#[must_use]
#[inline]
pub const fn opened_inward(flags: u8) -> bool {
    flags & FLAG_PORT_FORWARD != 0 || flags & (FLAG_HAIRPIN | FLAG_ORIGINAL) == FLAG_HAIRPIN
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
    use crate::flow::new_flow;

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

    /// A mapping of `ep` expiring at `expires_ns`, set by the flow with
    /// `tag`.
    fn mapping(expires_ns: u64, tag: u8) -> Mapping {
        Mapping {
            internal: Endpoint {
                pad: tag,
                ..ep(A, 41000, IPPROTO_TCP)
            },
            expires_ns,
        }
    }

    #[test]
    fn udp_refresh_never_shortens_and_its_extender_becomes_the_setter() {
        let t = Timeouts {
            udp_replied: 600,
            ..Timeouts::default()
        };
        let now = 5_000_000_000;
        let sec = 1_000_000_000;
        let replied = FlowState::UdpReplied as u8;
        let unreplied = FlowState::UdpUnreplied as u8;
        let (x, y) = (remote_tag(SRV, 53), remote_tag(SRV, 54));
        let at = |m: &Mapping| (m.expires_ns, m.internal.pad);
        let udp = |m: &Mapping, state, tag, now| {
            refreshed_mapping(m, IPPROTO_UDP, state, replied, tag, now, &t)
        };
        // A replied flow's 600 s, then an unreplied one's 300 s: kept,
        // also when the unreplied one is the setter (UDP never lowers).
        let long = udp(&mapping(0, y), replied, x, now);
        assert_eq!(at(&long), (now + 600 * sec, x), "extended: x sets");
        for tag in [x, y] {
            assert_eq!(udp(&long, unreplied, tag, now + sec), long);
        }
        let m = udp(&mapping(now, x), unreplied, y, now + sec);
        assert_eq!(at(&m), (now + 301 * sec, y), "extended: y sets");
        let icmp = FlowState::Icmp as u8;
        let m = mapping(now + 100 * sec, x);
        assert_eq!(
            refreshed_mapping(&m, IPPROTO_ICMP, icmp, icmp, x, now, &t),
            m
        );
        // The endpoint is kept.
        assert_eq!(long.internal.bits(), ep(A, 41000, IPPROTO_TCP).bits());
    }

    const EST: u8 = FlowState::TcpEstablished as u8;
    const SYN: u8 = FlowState::TcpSynSent as u8;
    const FIN: u8 = FlowState::TcpFinWait as u8;
    const CLOSED: u8 = FlowState::TcpClosed as u8;

    /// `m` after a TCP state change `old` -> `new` of the flow with `tag`.
    fn tcp(m: &Mapping, old: u8, new: u8, tag: u8, now: u64) -> Mapping {
        refreshed_mapping(m, IPPROTO_TCP, new, old, tag, now, &Timeouts::default())
    }

    #[test]
    fn only_the_setter_lowers_a_tcp_mapping() {
        let t = Timeouts::default();
        let now = 5_000_000_000;
        let sec = 1_000_000_000;
        let (x, y) = (remote_tag(SRV, 80), remote_tag(SRV, 81));
        assert_ne!(x, y);
        let days = u64::from(t.tcp_established) * sec;
        // X (A:41000 -> SRV:80) established: sets 5 days.
        let mx = tcp(&mapping(now + 120 * sec, x), SYN, EST, x, now);
        assert_eq!((mx.expires_ns, mx.internal.pad), (now + days, x));
        // A sibling Y (-> SRV:81) in SYN_SENT, then reset: no change.
        let later = now + 10 * sec;
        assert_eq!(tcp(&mx, CLOSED, SYN, y, later), mx);
        assert_eq!(tcp(&mx, SYN, CLOSED, y, later), mx);
        // Y closes after it was established, but X set it.
        assert_eq!(tcp(&mx, EST, FIN, y, later), mx);
        assert_eq!(tcp(&mx, EST, CLOSED, y, later), mx);
        // The setter X lowers at its close (FIN, then RST).
        let m = tcp(&mx, EST, FIN, x, later);
        assert_eq!(
            (m.expires_ns, m.internal.pad),
            (later + u64::from(t.tcp_fin_wait) * sec, x)
        );
        let m = tcp(&m, FIN, CLOSED, x, later + sec);
        assert_eq!(
            (m.expires_ns, m.internal.pad),
            (later + sec + u64::from(t.tcp_closed) * sec, x)
        );
        // Or at its RST.
        let m = tcp(&mx, EST, CLOSED, x, later);
        assert_eq!(m.expires_ns, later + u64::from(t.tcp_closed) * sec);
        // A sibling Y established later extends: Y becomes the setter, and
        // its close then lowers, X's no longer.
        let my = tcp(&mx, SYN, EST, y, later);
        assert_eq!((my.expires_ns, my.internal.pad), (later + days, y));
        assert_eq!(tcp(&my, EST, CLOSED, x, later + sec), my);
        let m = tcp(&my, EST, CLOSED, y, later + sec);
        assert_eq!(m.expires_ns, later + sec + u64::from(t.tcp_closed) * sec);
        // UDP with the setter's tag: never lowered.
        let udp = FlowState::UdpUnreplied as u8;
        assert_eq!(
            refreshed_mapping(&mx, IPPROTO_UDP, udp, EST, x, later, &t),
            mx
        );
    }

    #[test]
    fn a_flow_that_never_was_established_lowers_no_established_mapping() {
        let t = Timeouts::default();
        let now = 5_000_000_000;
        let sec = 1_000_000_000;
        let x = remote_tag(SRV, 80);
        // Its own SYN's mapping (SYN_SENT's 120 s), refused by a RST:
        // lowered to the closed timeout, the port comes free.
        let m = mapping(now + u64::from(t.tcp_syn_sent) * sec, x);
        let r = tcp(&m, SYN, CLOSED, x, now);
        assert_eq!(r.expires_ns, now + u64::from(t.tcp_closed) * sec);
        // An established connection's 5 days with the same tag: a remote's
        // flow from a port whose tag collides is kept from cutting it
        // whatever it sends. SYN answered with a RST; then a second SYN
        // (reopens the closed flow) and a RST again; or a FIN in SYN_SENT
        // (to FIN_WAIT), then a RST.
        let m = mapping(now + u64::from(t.tcp_established) * sec, x);
        for (old, new) in [(SYN, CLOSED), (CLOSED, SYN), (SYN, FIN), (FIN, CLOSED)] {
            assert_eq!(tcp(&m, old, new, x, now), m, "{old} -> {new}");
        }
        // The same flow once established lowers it.
        let r = tcp(&m, EST, CLOSED, x, now);
        assert_eq!(r.expires_ns, now + u64::from(t.tcp_closed) * sec);
    }

    #[test]
    fn a_flow_opened_towards_the_mapping_extends_it_but_never_sets_or_lowers_it() {
        let t = Timeouts::default();
        let now = 5_000_000_000;
        let sec = 1_000_000_000;
        let x = remote_tag(SRV, 80);
        let days = u64::from(t.tcp_established) * sec;
        // X's established mapping; a remote's connection to it (tag 0)
        // established a second later extends it, X stays the setter.
        let mx = mapping(now + days, x);
        let m = tcp(&mx, SYN, EST, 0, now + sec);
        assert_eq!((m.expires_ns, m.internal.pad), (now + sec + days, x));
        // Its RST, or FIN, lowers nothing.
        for new in [FIN, CLOSED] {
            assert_eq!(tcp(&m, EST, new, 0, now + 2 * sec), m);
        }
        // Also of a mapping no longer than its own state needed.
        let m = mapping(now + u64::from(t.tcp_syn_sent) * sec, x);
        assert_eq!(tcp(&m, SYN, CLOSED, 0, now), m);
    }

    #[test]
    fn a_mapping_of_an_older_build_is_lowered_by_a_close_as_its_state_allows() {
        let t = Timeouts::default();
        let now = 5_000_000_000;
        let sec = 1_000_000_000;
        let x = remote_tag(SRV, 80);
        // `pad` 0: written before the tag existed, setter unknown. An
        // established connection's close lowers it (FIN, then RST).
        let old = mapping(now + u64::from(t.tcp_established) * sec, 0);
        let m = tcp(&old, EST, FIN, x, now);
        assert_eq!(
            (m.expires_ns, m.internal.pad),
            (now + u64::from(t.tcp_fin_wait) * sec, 0)
        );
        let m = tcp(&m, FIN, CLOSED, x, now + sec);
        assert_eq!(m.expires_ns, now + sec + u64::from(t.tcp_closed) * sec);
        // Still within the state bound: a flow never established does
        // not; nor does one opened towards the mapping.
        for (old_state, new) in [(SYN, CLOSED), (CLOSED, SYN), (SYN, FIN), (FIN, CLOSED)] {
            assert_eq!(tcp(&old, old_state, new, x, now), old);
        }
        assert_eq!(tcp(&old, EST, CLOSED, 0, now), old);
        // An extension names its setter.
        let m = tcp(&mapping(now, 0), SYN, EST, x, now);
        assert_eq!(m.internal.pad, x);
    }

    #[test]
    fn remote_tags_are_never_zero() {
        let zero = (0..=u16::MAX).find(|&p| {
            let x = (u32::from_ne_bytes(SRV) ^ u32::from(p) << 16 ^ u32::from(p))
                .wrapping_mul(0x9E37_79B1);
            x >> 24 == 0
        });
        let p = zero.expect("a port whose hash is 0");
        assert_eq!(remote_tag(SRV, p), 1);
        assert!((0..=u16::MAX).all(|p| remote_tag(SRV, p) != 0));
    }

    #[test]
    fn remote_tags_spread() {
        // Ports of one remote, and addresses with one port, hit many tags.
        let mut seen = [false; 256];
        for p in 0..256u16 {
            seen[usize::from(remote_tag(SRV, 40000 + p))] = true;
        }
        assert!(seen.iter().filter(|&&b| b).count() > 128);
        let mut seen = [false; 256];
        for a in 0..=255u8 {
            seen[usize::from(remote_tag([203, 0, 113, a], 443))] = true;
        }
        assert!(seen.iter().filter(|&&b| b).count() > 128);
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
        let tag = remote_tag(SRV, 443);
        assert_eq!(mapping_of(&orig, &oe), (5555, owner, tag));
        assert_eq!(mapping_of(&rk, &re), (5555, owner, tag));
        // Opened from the WAN to the mapping (endpoint-independent
        // filtering): SRV:9 -> WAN:5555 reaches A:5000.
        let orig = FlowKey::new(SRV, WAN, 9, 5555, IPPROTO_TCP);
        let tr = FlowKey::new(SRV, A, 9, 5000, IPPROTO_TCP);
        // Opened towards the mapping: tag 0, never the setter.
        let (oe, rk, re) = new_flow(&orig, &tr, FLAG_PORT_FORWARD | FLAG_MAPPED, 1);
        assert_eq!(mapping_of(&orig, &oe), (5555, owner, 0));
        assert_eq!(mapping_of(&rk, &re), (5555, owner, 0));
        // Hairpinned: each entry names its sender's mapping.
        let orig = FlowKey::new(A, WAN, 5000, 7000, IPPROTO_UDP);
        let target = ep(B, 6000, IPPROTO_UDP);
        let tr = translated_key(&orig, WAN, 5555, Some(&target));
        let (oe, rk, re) = new_flow(&orig, &tr, FLAG_MAPPED | FLAG_HAIRPIN, 1);
        assert_eq!(
            mapping_of(&orig, &oe),
            (5555, ep(A, 5000, IPPROTO_UDP), remote_tag(WAN, 7000))
        );
        assert_eq!(
            mapping_of(&rk, &re),
            (7000, target, 0),
            "the target's: inward"
        );
        // The target side's entry also names the opener's mapping, with
        // the tag the opener's entry sets it with.
        assert_eq!(
            hairpin_opener_mapping(&rk, &re),
            Some(mapping_of(&orig, &oe))
        );
        assert_eq!(hairpin_opener_mapping(&orig, &oe), None, "the opener's own");
        let masq = FlowKey::new(A, SRV, 5000, 443, IPPROTO_TCP);
        let (me, mrk, mre) = new_flow(&masq, &masquerade_key(&masq, WAN, 5555), FLAG_MAPPED, 1);
        assert_eq!(hairpin_opener_mapping(&masq, &me), None);
        assert_eq!(hairpin_opener_mapping(&mrk, &mre), None);
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

    #[test]
    fn a_flow_left_to_the_kernel_stays_there_as_long_as_a_mapping_would_live() {
        let t = Timeouts::default();
        let s = 1_000_000_000;
        assert_eq!(kernel_flow_secs(IPPROTO_TCP, &t), t.tcp_syn_sent);
        assert_eq!(kernel_flow_secs(IPPROTO_ICMP, &t), t.icmp);
        assert_eq!(kernel_flow_secs(IPPROTO_UDP, &t), UDP_MAPPING_SECS);
        let mut long = t;
        long.udp_replied = 600;
        assert_eq!(kernel_flow_secs(IPPROTO_UDP, &long), 600);
        let last = 50 * s;
        assert!(kernel_flow_live(last, last, IPPROTO_UDP, &t));
        assert!(kernel_flow_live(last, last + 299 * s, IPPROTO_UDP, &t));
        assert!(!kernel_flow_live(last, last + 300 * s, IPPROTO_UDP, &t));
        assert!(kernel_flow_live(last, last + 29 * s, IPPROTO_ICMP, &t));
        assert!(!kernel_flow_live(last, last + 30 * s, IPPROTO_ICMP, &t));
        // A clock read before the marker was written (another CPU's).
        assert!(kernel_flow_live(last, last - 1, IPPROTO_TCP, &t));
    }
}
