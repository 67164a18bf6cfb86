//! Connection tracking logic: flow entries for a new flow, TCP state from
//! flags, the window check of TCP RST and FIN, idle expiry, and the choice
//! of the SNAT port.

use crate::maps::{
    FLAG_FIN_ORIG, FLAG_FIN_REPLY, FLAG_OFFLOADED, FLAG_ORIGINAL, FlowEntry, FlowKey, FlowState,
    IPPROTO_ICMP, IPPROTO_TCP, LEASE_HANDED_BACK, LEASE_PENDING, TCP_TRACK_EXPECT, TCP_TRACK_KNOWN,
    TCP_TRACK_LEARN, TCP_TRACK_SYN, TcpWindow, Timeouts,
};

/// How often (at most) the data path writes `last_seen_ns` of a flow: the
/// shared entries are not written on every packet, so CPUs do not bounce
/// their cache lines. Expiry is accurate to this interval.
pub const REFRESH_NS: u64 = 1_000_000_000;

/// SNAT ports tried for one new flow's NAT mapping before giving up to
/// the kernel's slow path. Eight: the verifier walks every probe of the
/// loop once per path that reaches it, and each probe (a mapping claim)
/// costs about 57k verified instructions; with 16 the program went past
/// the verifier's one million. At a range half full of live mappings,
/// eight probes all collide with probability 1/256.
pub const MAX_PORT_PROBES: u32 = 8;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;
/// The control bits that can change a flow's TCP state; segments without
/// them take the cheap path of [`tcp_observe`].
pub const TCP_CONTROL: u8 = TCP_SYN | TCP_FIN | TCP_RST;

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
/// entry translates back to the reverse of `orig`. The TCP window tracking
/// is left untracked (see [`open_tracking`]).
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
/// them in a per-CPU map: the BPF stack is only 512 bytes). Every field but
/// the TCP window tracking, which the caller sets once per flow from
/// [`open_tracking`] (the data path tries several ports per flow).
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
    // The first outbound hit refreshes the mapping (which the creation
    // claimed) once more: tick 0 is past, except in one tick of every
    // 65536. Not the creation's tick: computing it here grew the data
    // path's `try_port` frame, on a call chain at the verifier's 512 bytes.
    orig_entry.out_tick = 0;
    orig_entry.last_seen_ns = now_ns;
    orig_entry.created_ns = now_ns;
    orig_entry.clear_next_hop();
    // The data path's own flows are routed as the packet is (no mark).
    orig_entry.route_mark = 0;
    // The reply translates back to the reverse of the original packet.
    reply_entry.peer = *orig;
    reply_entry.new_src_addr = orig.dst_addr;
    reply_entry.new_dst_addr = orig.src_addr;
    reply_entry.new_src_port = orig.dst_port;
    reply_entry.new_dst_port = orig.src_port;
    reply_entry.state = state;
    reply_entry.flags = extra_flags;
    reply_entry.out_tick = 0;
    reply_entry.last_seen_ns = now_ns;
    reply_entry.created_ns = now_ns;
    reply_entry.clear_next_hop();
    reply_entry.route_mark = 0;
}

/// The window tracking of (the opening, the answering) direction of a new
/// flow of protocol `proto` opened by the segment `open` (a TCP flow opens
/// with a SYN); untracked for other protocols.
#[must_use]
pub const fn open_tracking(proto: u8, open: &Segment) -> (TcpWindow, TcpWindow) {
    if proto == IPPROTO_TCP {
        (syn_sender(open), syn_answerer(open))
    } else {
        (UNTRACKED, UNTRACKED)
    }
}

/// Tracking of a direction whose handshake was not seen (or not TCP).
pub const UNTRACKED: TcpWindow = TcpWindow {
    ack: 0,
    win: 0,
    wscale: 0,
    flags: 0,
};

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

/// The fields of a TCP segment that the tracking reads; all zero for other
/// protocols.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Segment {
    pub seq: u32,
    pub ack: u32,
    /// Payload bytes (after the TCP header and its options).
    pub len: u16,
    /// The window field as sent (unscaled).
    pub win: u16,
    /// Control bits (`TCP_*`).
    pub flags: u8,
    /// The window scale shift a SYN offers (RFC 7323), or [`NO_WSCALE`];
    /// only read for SYNs. The data path does not read TCP options: it
    /// gives every SYN [`MAX_WSCALE`] (see [`ASSUMED_WSCALE`]).
    pub wscale: u8,
    pub pad: u16,
}

impl Segment {
    /// The sequence number after this segment: SYN and FIN count one each.
    #[must_use]
    pub const fn end(&self) -> u32 {
        let syn = (self.flags & TCP_SYN != 0) as u32;
        let fin = (self.flags & TCP_FIN != 0) as u32;
        self.seq
            .wrapping_add(self.len as u32)
            .wrapping_add(syn + fin)
    }
}

/// [`Segment::wscale`] of a segment without the window scale option.
pub const NO_WSCALE: u8 = 0xff;
/// Largest window scale shift (RFC 7323 2.3: larger values mean 14).
pub const MAX_WSCALE: u8 = 14;
/// The shift the data path takes a SYN to offer, as it does not read TCP
/// options: the largest. A window is then taken as large as its field
/// could mean, so no segment the receiver accepts is judged out of window;
/// the price is a wider window for a blind guess (a raw window of 502, a
/// Linux client's usual, stands for 8 MiB instead of 64 KiB: one guess in
/// about 500 instead of one in 65000 lands). Reading the option in the
/// program (a bounded walk of the options) took the verifier past its
/// limit of a million instructions.
pub const ASSUMED_WSCALE: u8 = MAX_WSCALE;
/// Least step (bytes) by which a direction's acknowledgement moves before
/// it is written down: keeps small windows from costing a write every few
/// packets.
pub const MIN_ACK_STEP: u32 = 16 * 1024;
/// Largest forward move of the acknowledgement that is written down: more
/// than the largest window (RFC 7323: 2^30) cannot be a real one.
pub const MAX_ACK_JUMP: u32 = 1 << 30;

/// Bytes of the largest window that `t` advertised.
#[must_use]
pub const fn window_bytes(t: &TcpWindow) -> u32 {
    let shift = if t.wscale > MAX_WSCALE {
        MAX_WSCALE
    } else {
        t.wscale
    };
    (t.win as u32) << shift
}

/// How far a direction's acknowledgement moves before [`tcp_observe`]
/// writes it down: half its window, at least [`MIN_ACK_STEP`]. A write
/// per half window keeps the recorded value within one step of the true
/// one at a few writes per round trip, whatever the rate.
#[must_use]
pub const fn ack_step(t: &TcpWindow) -> u32 {
    let half = window_bytes(t) / 2;
    if half > MIN_ACK_STEP {
        half
    } else {
        MIN_ACK_STEP
    }
}

/// The tracking of a direction after it sent `seg`, a segment without SYN
/// (whose window is unscaled). Equal to `t` (nothing to write) unless the
/// acknowledgement moved forward by a step or more (or at all when
/// `refresh`: the entry is written then anyway), or the window grew. Only
/// directions whose handshake was seen are tracked
/// ([`TCP_TRACK_KNOWN`]): without it the window scale is unknown; nor is
/// the answering direction before its SYN+ACK ([`TCP_TRACK_EXPECT`]).
#[must_use]
pub const fn tcp_observe(t: TcpWindow, seg: &Segment, refresh: bool) -> TcpWindow {
    // The window field means something only with ACK (RFC 9293 3.10.7.4).
    if seg.flags & TCP_ACK == 0 || t.flags & (TCP_TRACK_KNOWN | TCP_TRACK_EXPECT) != TCP_TRACK_KNOWN
    {
        return t;
    }
    let mut n = t;
    let moved = seg.ack.wrapping_sub(t.ack);
    if moved < MAX_ACK_JUMP && (moved >= ack_step(&t) || (refresh && moved != 0)) {
        n.ack = seg.ack;
    }
    if seg.win > t.win {
        n.win = seg.win;
    }
    n
}

/// Whether the receiver whose tracking is `rcv` would accept the RST or
/// FIN `seg` (RFC 5961 3.2 and 4.2; RFC 9293 3.10.7.4), as far as the
/// coarse tracking tells: its RCV.NXT is at or after `rcv.ack` and less
/// than a step after the last acknowledgement it sent, and nothing it
/// accepts starts a window or more past that. So a RST must start in
/// `[ack, ack + step + window]`, a FIN must end after `ack` (it is new)
/// and start at or before `ack + step + window`; sequence numbers wrap.
/// An untracked receiver accepts everything (netfilter's "liberal" mode,
/// as for connections it picked up mid-stream).
#[must_use]
pub const fn in_window(rcv: &TcpWindow, seg: &Segment) -> bool {
    control_in_window(rcv, seg.seq, seg.len, seg.flags)
}

/// [`in_window`] of the RST or FIN with sequence number `seq`, `len`
/// payload bytes and control bits `flags` (for a caller without a
/// [`Segment`] at hand: the data path's offloaded hit).
#[must_use]
pub const fn control_in_window(rcv: &TcpWindow, seq: u32, len: u16, flags: u8) -> bool {
    if rcv.flags & TCP_TRACK_KNOWN == 0 {
        return true;
    }
    let reach = window_bytes(rcv) + ack_step(rcv);
    if flags & TCP_RST != 0 {
        return seq.wrapping_sub(rcv.ack) <= reach;
    }
    let syn = (flags & TCP_SYN != 0) as u32;
    let fin = (flags & TCP_FIN != 0) as u32;
    let end = seq
        .wrapping_add(len as u32)
        .wrapping_add(syn + fin)
        .wrapping_sub(rcv.ack);
    end != 0 && end <= reach + len as u32 + 1
}

/// An offloaded connection's direction whose tracking waits to learn
/// ([`TCP_TRACK_LEARN`]: its window scale from the kernel's conntrack)
/// takes the acknowledgement `ack` and window `win` of the first ACK
/// segment it sends (control bits `flags`) and becomes
/// [`TCP_TRACK_KNOWN`]; from then on [`tcp_observe`] follows it. Written
/// in place (the data path's entry), field by field.
pub const fn tcp_learn(t: &mut TcpWindow, ack: u32, win: u16, flags: u8) {
    if t.flags == TCP_TRACK_LEARN && flags & TCP_ACK != 0 {
        t.ack = ack;
        t.win = win;
        t.flags = TCP_TRACK_KNOWN;
    }
}

/// The tracking of the direction that opens a flow with the SYN `syn`:
/// what it advertised, unscaled, and the shift it offered (or
/// [`NO_WSCALE`]), both settled by the SYN+ACK ([`tcp_control`]).
// No branch on the offer here: the verifier would follow each outcome
// through the whole port search of a new flow.
#[must_use]
pub const fn syn_sender(syn: &Segment) -> TcpWindow {
    TcpWindow {
        ack: 0,
        win: syn.win,
        wscale: syn.wscale,
        flags: TCP_TRACK_SYN,
    }
}

/// The tracking of the direction that answers the SYN `syn`: the
/// acknowledgement it must send (the end of the SYN), and in place of a
/// window the SYN's payload bytes, which its SYN+ACK may leave
/// unacknowledged (TCP Fast Open data the server did not take: RFC 7413
/// 4.2; RFC 9293 3.10.7.3 accepts any ACK in `ISS+1 ..= SND.NXT`).
#[must_use]
pub const fn syn_answerer(syn: &Segment) -> TcpWindow {
    TcpWindow {
        ack: syn.end(),
        win: syn.len,
        wscale: 0,
        flags: TCP_TRACK_KNOWN | TCP_TRACK_EXPECT,
    }
}

/// `win` (a SYN's, unscaled) in units of `1 << shift` bytes, rounded up.
const fn scale_down(win: u16, shift: u8) -> u16 {
    let units = ((win as u32) + (1 << shift) - 1) >> shift;
    #[expect(clippy::cast_possible_truncation, reason = "units <= win")]
    let units = units as u16;
    units
}

/// What a TCP segment with SYN, FIN or RST does to a flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpControl {
    /// The flow's state and `FLAG_*` bits after the segment.
    pub state: u8,
    pub flags: u8,
    /// Tracking of the sending direction after the segment.
    pub own: TcpWindow,
    /// Tracking of the other direction after the segment.
    pub peer: TcpWindow,
    /// The segment would have changed the state, but its receiver would
    /// not accept it: nothing changed (the data path counts it).
    pub out_of_window: bool,
}

/// The flow after a segment with SYN, FIN or RST from the opening side
/// (`from_orig`) or the answering one, given its state, flags and the
/// tracking of the sending (`own`) and the receiving (`peer`) direction.
/// The state changes as [`tcp_next`] says, but only on a segment the
/// receiver would accept:
/// - while the answering side has not spoken (`SYN_SENT`), its SYN+ACK,
///   RST or FIN must acknowledge the opening SYN exactly (RFC 9293
///   3.10.7.3: a RST answering a SYN to a closed port carries that ACK);
///   its SYN+ACK settles both directions' window scale (RFC 7323: only if
///   both SYNs offered it);
/// - a SYN from the opening side that reopens a closed flow starts the
///   tracking afresh, as does one that starts later than the SYN of a
///   flow still in `SYN_SENT` (the client reconnected from the same port);
/// - any other change (RST, FIN) must be [`in_window`] of the receiver.
///
/// A segment that changes nothing (a retransmitted SYN or FIN, a RST on a
/// closed flow) is not judged: what it would change already happened.
#[must_use]
#[expect(
    clippy::inline_always,
    reason = "seven arguments are more than a BPF call passes in registers, and the data \
              path calls it from the IPv4 and the IPv6 tracking: a call would not link"
)]
#[inline(always)]
pub const fn tcp_control(
    state: u8,
    flags: u8,
    from_orig: bool,
    own: TcpWindow,
    peer: TcpWindow,
    seg: &Segment,
    refresh: bool,
) -> TcpControl {
    if state == FlowState::TcpSynSent as u8
        && from_orig
        && tcp_opens_flow(seg.flags)
        && peer.flags & TCP_TRACK_EXPECT != 0
        && seq_after(seg.end(), peer.ack)
    {
        // A new SYN with a later sequence number before any answer: the
        // opening side started over (a new connection on the same port,
        // RFC 9293 3.4: a reinitialised TCP uses larger sequence numbers),
        // so its answer acknowledges this SYN. Netfilter's
        // `tcp_in_window` re-initialises the sender alike; a retransmitted
        // (same end) or older SYN changes nothing.
        return TcpControl {
            state,
            flags,
            own: syn_sender(seg),
            peer: syn_answerer(seg),
            out_of_window: false,
        };
    }
    let (next, next_flags) = tcp_next(state, flags, from_orig, seg.flags);
    let keep = TcpControl {
        state,
        flags,
        own,
        peer,
        out_of_window: false,
    };
    if next == state && next_flags == flags {
        return keep;
    }
    let refused = TcpControl {
        out_of_window: true,
        ..keep
    };
    let own_known = own.flags & TCP_TRACK_KNOWN != 0;
    if state == FlowState::TcpSynSent as u8 && !from_orig {
        // The answer must acknowledge the SYN: at least its sequence
        // number + 1, at most its end (its data too).
        if own_known && (seg.flags & TCP_ACK == 0 || own.ack.wrapping_sub(seg.ack) > own.win as u32)
        {
            return refused;
        }
        if next != FlowState::TcpEstablished as u8 || !own_known || peer.flags & TCP_TRACK_SYN == 0
        {
            // A RST or FIN; or a SYN+ACK of a flow whose SYN left no
            // tracking (an entry rebuilt after an eviction): the window
            // scale is unknown, so the flow stays untracked.
            return TcpControl {
                state: next,
                flags: next_flags,
                ..keep
            };
        }
        // The SYN+ACK: both directions' tracking from the two SYNs.
        let scaling = peer.wscale != NO_WSCALE && seg.wscale != NO_WSCALE;
        let (orig_shift, reply_shift) = if scaling {
            let o = if peer.wscale > MAX_WSCALE {
                MAX_WSCALE
            } else {
                peer.wscale
            };
            (o, seg.wscale)
        } else {
            (0, 0)
        };
        return TcpControl {
            state: next,
            flags: next_flags,
            own: TcpWindow {
                ack: seg.ack,
                win: scale_down(seg.win, reply_shift),
                wscale: reply_shift,
                flags: TCP_TRACK_KNOWN,
            },
            peer: TcpWindow {
                ack: seg.end(),
                win: scale_down(peer.win, orig_shift),
                wscale: orig_shift,
                flags: peer.flags | TCP_TRACK_KNOWN,
            },
            out_of_window: false,
        };
    }
    if next == FlowState::TcpSynSent as u8 {
        // Reopened by a new SYN of the opening side (port reuse).
        return TcpControl {
            state: next,
            flags: next_flags,
            own: syn_sender(seg),
            peer: syn_answerer(seg),
            out_of_window: false,
        };
    }
    if !in_window(&peer, seg) {
        return refused;
    }
    TcpControl {
        state: next,
        flags: next_flags,
        own: if seg.flags & TCP_SYN == 0 {
            tcp_observe(own, seg, refresh)
        } else {
            own
        },
        peer,
        out_of_window: false,
    }
}

/// Whether sequence number `a` is after `b` (RFC 9293 3.4, modulo 2^32).
#[must_use]
pub const fn seq_after(a: u32, b: u32) -> bool {
    #[expect(
        clippy::cast_possible_wrap,
        reason = "the sign of the distance is the order"
    )]
    let d = a.wrapping_sub(b) as i32;
    d > 0
}

/// 32-bit hash of a new flow's internal endpoint (the key's source
/// address, source port and protocol) with a per-attach seed (murmur3's
/// finaliser over those words): spreads SNAT port probes, not
/// cryptographic. Not the destination: the probes are the endpoint's, so
/// two first flows of one endpoint to two destinations, admitted at once
/// on two CPUs before either recorded the endpoint's mapping, probe the
/// same ports in the same order, and the one that loses the race for a
/// port finds it already its endpoint's (`Held`) instead of claiming a
/// second mapping elsewhere (endpoint-independent mapping, RFC 4787 REQ-1;
/// source ports outside `--port-range` are common: macOS, iOS and Windows
/// hand out 49152-65535).
#[must_use]
pub const fn endpoint_hash(k: &FlowKey, seed: u32) -> u32 {
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
    h = mix(h, k.src_port as u32);
    h = mix(h, k.proto as u32);
    // The length hashed, in bytes (three words).
    h ^= 0xc;
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

/// What the data path does with a packet that hit an entry (offload mode:
/// one the daemon wrote from the kernel's conntrack).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffloadedHit {
    /// XDP carries it (a standalone flow's packet, or an offloaded flow's
    /// within its lease, which is checked after the state tracking).
    Carry,
    /// The first TCP SYN, FIN or RST of an offloaded connection: the
    /// kernel, which owns its TCP state, must see it, and every segment
    /// after it: its `FIN_WAIT` / `CLOSE_WAIT` / `LAST_ACK` / `TIME_WAIT` only
    /// follow the ACKs of the FINs (RFC 9293 3.6, netfilter's
    /// `tcp_conntracks`), and a new connection on the same ports (a SYN
    /// after the close) becomes ESTABLISHED there only if the kernel sees
    /// its handshake ACK; segments it did not see it later finds out of
    /// window. So the data path hands the flow back (both entries'
    /// lease becomes [`LEASE_HANDED_BACK`]) and passes the segment; the
    /// daemon re-offloads the connection once the kernel has it
    /// ESTABLISHED again. `nf_flowtable` does the same: a FIN or RST
    /// tears its flow down (`nf_flow_state_check`).
    HandBack,
    /// Another TCP SYN, FIN or RST of a flow already handed back.
    Control,
    /// Any other packet of a flow already handed back: the kernel's.
    HandedBack,
    /// Any other packet of an offloaded flow not yet activated
    /// ([`LEASE_PENDING`]): the kernel's, untouched.
    Pending,
}

/// Whether the TCP control segment `tcp_flags` that would hand an
/// offloaded connection back (its entry's `flags` and `lease`,
/// [`OffloadedHit::HandBack`]) is judged against its receiver's window
/// first: a RST or FIN (a SYN always goes to the kernel), arriving on the
/// WAN (where a blind attacker is; a LAN host's own are taken as they
/// come, so a spoofed ACK the LAN side learned from cannot hide one), of
/// an active pair (a pending one is handed back whatever it gets). One out
/// of the window ([`control_in_window`]) is carried instead (RFC 5961).
#[must_use]
pub const fn blind_suspect(flags: u8, lease: u32, tcp_flags: u8) -> bool {
    tcp_flags & TCP_SYN == 0
        && tcp_flags & (TCP_RST | TCP_FIN) != 0
        && !crate::maps::lan_side_of(flags)
        && lease != LEASE_PENDING
}

/// What the data path does with a packet of `proto` with TCP flags
/// `tcp_flags` that hit an entry with `flags` and `lease`. Only the TCP
/// control segments of offloaded flows and the packets of handed-back
/// flows leave the hit path.
#[must_use]
#[inline]
pub const fn offloaded_hit(flags: u8, lease: u32, proto: u8, tcp_flags: u8) -> OffloadedHit {
    if flags & FLAG_OFFLOADED == 0 {
        return OffloadedHit::Carry;
    }
    let control = proto == IPPROTO_TCP && tcp_flags & TCP_CONTROL != 0;
    match lease {
        LEASE_HANDED_BACK if control => OffloadedHit::Control,
        LEASE_HANDED_BACK => OffloadedHit::HandedBack,
        // A pending pair is handed back like a live one: the daemon's
        // activation (a compare-and-swap from `LEASE_PENDING`) then fails,
        // so no entry written before this segment ever carries a packet
        // after it.
        _ if control => OffloadedHit::HandBack,
        LEASE_PENDING => OffloadedHit::Pending,
        _ => OffloadedHit::Carry,
    }
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
        let h = endpoint_hash(&k, 1);
        let mut seen = std::collections::BTreeSet::new();
        for a in 1..MAX_PORT_PROBES {
            seen.insert(candidate_port(a, 40000, h, 1024, 65535));
        }
        assert_eq!(
            seen.len(),
            MAX_PORT_PROBES as usize - 1,
            "probes repeat: {seen:?}"
        );
        assert_ne!(
            endpoint_hash(&k, 1),
            endpoint_hash(&k, 2),
            "seed changes the hash"
        );
    }

    /// Known answers, computed apart from this code: `endpoint_hash` is
    /// `MurmurHash3_x86_32` (checked against its published vectors:
    /// "test" -> 0xba6bd213) of the three words (source address as a
    /// big-endian number, port, protocol) in little-endian bytes, and the
    /// probes step through the range from it. A change to the hash or the
    /// stride (which the data path and the `BPF_PROG_RUN` tests share)
    /// shows here.
    #[test]
    fn endpoint_hash_and_probes_give_the_known_answers() {
        let k = FlowKey {
            src_addr: [192, 168, 50, 2],
            dst_addr: [203, 0, 113, 2],
            src_port: 40000,
            dst_port: 53,
            proto: 17,
            pad: 0,
            pad2: 0,
        };
        assert_eq!(endpoint_hash(&k, 0), 0x4828_eeff);
        let h = endpoint_hash(&k, 0x1234_5678);
        assert_eq!(h, 0x1ec4_9bf4);
        let probes: [u16; 4] = core::array::from_fn(|a| {
            candidate_port(u32::try_from(a).unwrap(), 40000, h, 1024, 60999)
        });
        assert_eq!(probes, [40000, 7005, 58974, 16951]);
    }

    #[test]
    fn an_endpoints_probes_do_not_depend_on_the_destination() {
        // A source port outside the range (macOS/iOS/Windows ephemeral
        // ports above 60999): the first probe is hashed. Two first flows
        // of one endpoint, to two destinations, probe the same ports in
        // the same order, so concurrent ones race for one port (the
        // loser finds it `Held`) instead of each taking its own mapping.
        let (min, max) = (1024, 60999);
        let k1 = FlowKey::new(LAN, SRV, 62000, 3478, IPPROTO_UDP);
        let k2 = FlowKey::new(LAN, [198, 51, 100, 9], 62000, 19302, IPPROTO_UDP);
        let (h1, h2) = (endpoint_hash(&k1, 7), endpoint_hash(&k2, 7));
        for a in 0..MAX_PORT_PROBES {
            assert_eq!(
                candidate_port(a, 62000, h1, min, max),
                candidate_port(a, 62000, h2, min, max),
                "probe {a}"
            );
        }
        // Other endpoints (another port, address or protocol) start
        // elsewhere.
        let first = |k: &FlowKey| candidate_port(0, k.src_port, endpoint_hash(k, 7), min, max);
        let others = [
            FlowKey::new(LAN, SRV, 62001, 3478, IPPROTO_UDP),
            FlowKey::new([192, 168, 1, 3], SRV, 62000, 3478, IPPROTO_UDP),
            FlowKey::new(LAN, SRV, 62000, 3478, IPPROTO_TCP),
        ];
        for k in &others {
            assert_ne!(first(k), first(&k1), "{k:?}");
        }
    }

    fn seg(flags: u8, seq: u32, ack: u32, win: u16) -> Segment {
        Segment {
            seq,
            ack,
            len: 0,
            win,
            flags,
            wscale: NO_WSCALE,
            pad: 0,
        }
    }

    /// A flow through its handshake: client ISN `c`, server ISN `s`, the
    /// client offering shift `cws`, the server `sws` (or `NO_WSCALE`).
    /// Returns (state, flags, client tracking, server tracking).
    fn handshake(c: u32, s: u32, cws: u8, sws: u8) -> (u8, u8, TcpWindow, TcpWindow) {
        let syn = Segment {
            wscale: cws,
            ..seg(TCP_SYN, c, 0, 64240)
        };
        let (ct, st) = open_tracking(IPPROTO_TCP, &syn);
        let synack = Segment {
            wscale: sws,
            ..seg(TCP_SYN | TCP_ACK, s, c.wrapping_add(1), 65160)
        };
        let r = tcp_control(
            FlowState::TcpSynSent as u8,
            0,
            false,
            st,
            ct,
            &synack,
            false,
        );
        assert!(!r.out_of_window);
        assert_eq!(r.state, FlowState::TcpEstablished as u8);
        (r.state, r.flags, r.peer, r.own)
    }

    #[test]
    fn handshake_settles_window_scale_only_if_both_offer() {
        let (_, _, c, s) = handshake(100, 5000, 7, 9);
        assert_eq!((c.wscale, s.wscale), (7, 9));
        // The SYNs' windows are unscaled: kept in units of the shift, up.
        assert_eq!(c.win, 64240_u16.div_ceil(128));
        assert_eq!(s.win, 65160_u16.div_ceil(512));
        assert_eq!((c.ack, s.ack), (5001, 101));
        assert_eq!(c.flags & TCP_TRACK_KNOWN, TCP_TRACK_KNOWN);
        let (_, _, c, s) = handshake(100, 5000, 7, NO_WSCALE);
        assert_eq!((c.wscale, s.wscale, c.win, s.win), (0, 0, 64240, 65160));
        let (_, _, c, s) = handshake(100, 5000, NO_WSCALE, 9);
        assert_eq!((c.wscale, s.wscale), (0, 0));
    }

    #[test]
    fn a_syn_ack_may_leave_fast_open_data_unacknowledged() {
        // A SYN with 100 bytes of data (TCP Fast Open): the server may
        // acknowledge all of it or only the SYN (RFC 7413 4.2), nothing
        // below the SYN nor past its end.
        let syn = Segment {
            len: 100,
            ..seg(TCP_SYN, 1000, 0, 64240)
        };
        let (ct, st) = open_tracking(IPPROTO_TCP, &syn);
        let s = FlowState::TcpSynSent as u8;
        for (ack, accepted) in [
            (1101, true),
            (1001, true),
            (1050, true),
            (1000, false),
            (1102, false),
        ] {
            let r = tcp_control(
                s,
                0,
                false,
                st,
                ct,
                &seg(TCP_SYN | TCP_ACK, 7, ack, 65160),
                false,
            );
            assert_eq!(!r.out_of_window, accepted, "ack {ack}");
            let want = if accepted {
                FlowState::TcpEstablished
            } else {
                FlowState::TcpSynSent
            };
            assert_eq!(r.state, want as u8, "ack {ack}");
        }
    }

    #[test]
    fn syn_ack_or_rst_must_acknowledge_the_syn() {
        let syn = seg(TCP_SYN, 1000, 0, 64240);
        let (ct, st) = open_tracking(IPPROTO_TCP, &syn);
        let s = FlowState::TcpSynSent as u8;
        // Blind SYN+ACK or RST from the server side: wrong ACK.
        for f in [TCP_SYN | TCP_ACK, TCP_RST | TCP_ACK, TCP_RST] {
            let r = tcp_control(s, 0, false, st, ct, &seg(f, 77, 999, 0), false);
            assert!(r.out_of_window, "{f:#x}");
            assert_eq!((r.state, r.own, r.peer), (s, st, ct));
        }
        // RST answering the SYN to a closed port: seq 0, ACK = ISN + 1.
        let r = tcp_control(
            s,
            0,
            false,
            st,
            ct,
            &seg(TCP_RST | TCP_ACK, 0, 1001, 0),
            false,
        );
        assert!(!r.out_of_window);
        assert_eq!(r.state, FlowState::TcpClosed as u8);
        // A retransmitted SYN changes nothing and is not judged.
        let r = tcp_control(s, 0, true, ct, st, &syn, false);
        assert_eq!((r.state, r.out_of_window), (s, false));
    }

    #[test]
    fn rst_and_fin_judged_against_the_receivers_window() {
        // Both sides unscaled: the server's window is 65160 bytes.
        let (st, fl, c, s) = handshake(100, 5000, NO_WSCALE, NO_WSCALE);
        let reach = window_bytes(&s) + ack_step(&s);
        assert_eq!(reach, 65160 + 32580);
        // From the client (peer = server tracking, ack 101).
        for (seq, ok) in [
            (101, true),
            (101 + reach, true),
            (102 + reach, false),
            (100, false),
            (0x8000_0000, false),
        ] {
            let r = tcp_control(
                st,
                fl,
                true,
                c,
                s,
                &seg(TCP_RST | TCP_ACK, seq, 5001, 0),
                false,
            );
            assert_eq!(!r.out_of_window, ok, "RST seq {seq}");
            let want = if ok {
                FlowState::TcpClosed
            } else {
                FlowState::TcpEstablished
            };
            assert_eq!(r.state, want as u8);
            let r = tcp_control(
                st,
                fl,
                true,
                c,
                s,
                &seg(TCP_FIN | TCP_ACK, seq, 5001, 500),
                false,
            );
            // A FIN ending at or before what the receiver acked is old:
            // seq 100 ends at 101 = ack, refused.
            assert_eq!(!r.out_of_window, ok, "FIN seq {seq}");
            if ok {
                assert_eq!(
                    (r.state, r.flags),
                    (FlowState::TcpFinWait as u8, FLAG_FIN_ORIG)
                );
            } else {
                assert_eq!((r.state, r.flags, r.own), (st, fl, c));
            }
        }
        // A FIN carrying data that starts before the receiver's ack but ends
        // after it is new.
        let fin = Segment {
            len: 10,
            ..seg(TCP_FIN | TCP_ACK, 95, 5001, 500)
        };
        assert!(!tcp_control(st, fl, true, c, s, &fin, false).out_of_window);
    }

    #[test]
    fn window_scaling_widens_the_window() {
        let (st, fl, c, s) = handshake(100, 5000, 7, 7);
        // The client advertises 502 units of 128 bytes after the handshake.
        let c = tcp_observe(c, &seg(TCP_ACK, 101, 5001, 502), false);
        assert_eq!(window_bytes(&c), 502 * 128);
        // A server RST 60000 bytes past the client's ack is in its window
        // (unscaled, 502 bytes plus a step, it would not be).
        let rst = seg(TCP_RST, 5001 + 60_000, 0, 0);
        let r = tcp_control(st, fl, false, s, c, &rst, false);
        assert!(!r.out_of_window);
        let far = seg(TCP_RST, 5001 + 502 * 128 + 32 * 1024 + 1, 0, 0);
        assert!(tcp_control(st, fl, false, s, c, &far, false).out_of_window);
    }

    #[test]
    fn sequence_numbers_wrap() {
        let (st, fl, c, s) = handshake(u32::MAX - 10, 5000, NO_WSCALE, NO_WSCALE);
        assert_eq!(s.ack, u32::MAX - 9);
        // 20 bytes later the sequence space has wrapped: still in window.
        let r = tcp_control(
            st,
            fl,
            true,
            c,
            s,
            &seg(TCP_FIN | TCP_ACK, 10, 5001, 0),
            false,
        );
        assert!(!r.out_of_window);
        // Just before the ack (old) across the wrap: refused.
        let r = tcp_control(
            st,
            fl,
            true,
            c,
            s,
            &seg(TCP_RST, u32::MAX - 10, 0, 0),
            false,
        );
        assert!(r.out_of_window);
    }

    #[test]
    fn duplicate_fin_and_simultaneous_close() {
        let (st, fl, c, s) = handshake(100, 5000, NO_WSCALE, NO_WSCALE);
        let fin_c = seg(TCP_FIN | TCP_ACK, 101, 5001, 500);
        let fin_s = seg(TCP_FIN | TCP_ACK, 5001, 101, 500);
        // Both FINs cross (simultaneous close): each is in the other's window.
        let r1 = tcp_control(st, fl, true, c, s, &fin_c, false);
        let r2 = tcp_control(r1.state, r1.flags, false, r1.peer, r1.own, &fin_s, false);
        assert!(!r1.out_of_window && !r2.out_of_window);
        assert_eq!(r2.state, FlowState::TcpClosed as u8);
        // The client's FIN again (retransmitted) changes nothing, unjudged,
        // even after the server acknowledged it.
        let (st2, fl2) = (r1.state, r1.flags);
        let acked = tcp_observe(r1.peer, &seg(TCP_ACK, 5001, 102, 500), true);
        let r = tcp_control(st2, fl2, true, r1.own, acked, &fin_c, false);
        assert_eq!((r.state, r.flags, r.out_of_window), (st2, fl2, false));
    }

    #[test]
    fn untracked_receiver_takes_everything() {
        let r = tcp_control(
            FlowState::TcpEstablished as u8,
            0,
            false,
            UNTRACKED,
            UNTRACKED,
            &seg(TCP_RST, 12345, 0, 0),
            false,
        );
        assert!(!r.out_of_window);
        assert_eq!(r.state, FlowState::TcpClosed as u8);
    }

    #[test]
    fn reopening_syn_restarts_the_tracking() {
        let closed = FlowState::TcpClosed as u8;
        let syn = seg(TCP_SYN, 9000, 0, 1000);
        let r = tcp_control(closed, 0, true, UNTRACKED, UNTRACKED, &syn, false);
        assert_eq!(r.state, FlowState::TcpSynSent as u8);
        assert_eq!((r.own, r.peer), open_tracking(IPPROTO_TCP, &syn));
        assert_eq!(r.peer.ack, 9001);
    }

    #[test]
    fn a_later_syn_in_syn_sent_restarts_the_tracking() {
        let s = FlowState::TcpSynSent as u8;
        let first = seg(TCP_SYN, 9000, 0, 1000);
        let (ct, st) = open_tracking(IPPROTO_TCP, &first);
        // A retransmission of the first SYN, and an older one: nothing.
        for again in [first, seg(TCP_SYN, 8000, 0, 2000)] {
            let r = tcp_control(s, 0, true, ct, st, &again, false);
            assert_eq!(
                (r.state, r.own, r.peer, r.out_of_window),
                (s, ct, st, false)
            );
        }
        // The client starts over from the same port with a later ISN.
        let second = seg(TCP_SYN, 70_000, 0, 3000);
        let r = tcp_control(s, 0, true, ct, st, &second, false);
        assert!(!r.out_of_window);
        assert_eq!(r.state, s);
        assert_eq!((r.own, r.peer), open_tracking(IPPROTO_TCP, &second));
        // Its answer establishes the flow; an answer to the first SYN does
        // not any more.
        let late = seg(TCP_SYN | TCP_ACK, 5000, 9001, 65160);
        let stale = tcp_control(s, 0, false, r.peer, r.own, &late, false);
        assert!(stale.out_of_window);
        assert_eq!(stale.state, s);
        let synack = seg(TCP_SYN | TCP_ACK, 5000, 70_001, 65160);
        let est = tcp_control(s, 0, false, r.peer, r.own, &synack, false);
        assert!(!est.out_of_window);
        assert_eq!(est.state, FlowState::TcpEstablished as u8);
        // Across the wrap of sequence numbers too.
        let wrapped = seg(TCP_SYN, 5, 0, 3000);
        let (hi_c, hi_s) = open_tracking(IPPROTO_TCP, &seg(TCP_SYN, u32::MAX - 10, 0, 1000));
        let r = tcp_control(s, 0, true, hi_c, hi_s, &wrapped, false);
        assert_eq!(r.peer.ack, 6);
        // Only the opening side's plain SYN: not a SYN from the answering
        // side, nor once the flow is established.
        let from_reply = tcp_control(s, 0, false, st, ct, &second, false);
        assert_eq!(from_reply.own, st);
        let (es, ef, c, sv) = handshake(9000, 5000, NO_WSCALE, NO_WSCALE);
        let r = tcp_control(es, ef, true, c, sv, &second, false);
        assert_eq!((r.state, r.own, r.peer), (es, c, sv));
    }

    #[test]
    fn observe_writes_only_on_a_step_or_a_bigger_window() {
        let (_, _, _, s) = handshake(100, 5000, NO_WSCALE, NO_WSCALE);
        let step = ack_step(&s);
        // Small moves and the same window: nothing to write.
        assert_eq!(
            tcp_observe(s, &seg(TCP_ACK, 5001, 101 + step - 1, 100), false),
            s
        );
        // ... unless the entry is refreshed anyway.
        assert_eq!(
            tcp_observe(s, &seg(TCP_ACK, 5001, 1101, 100), true).ack,
            1101
        );
        assert_eq!(
            tcp_observe(s, &seg(TCP_ACK, 5001, 101 + step, 100), false).ack,
            101 + step
        );
        // Backwards or a jump past any window: ignored.
        assert_eq!(tcp_observe(s, &seg(TCP_ACK, 5001, 50, 100), true), s);
        assert_eq!(
            tcp_observe(s, &seg(TCP_ACK, 5001, 101 + MAX_ACK_JUMP, 100), true),
            s
        );
        let grown = tcp_observe(s, &seg(TCP_ACK, 5001, 101, 65535), false);
        assert_eq!(grown.win, 65535);
        // No ACK bit (a bare RST): its fields mean nothing.
        assert_eq!(tcp_observe(s, &seg(TCP_RST, 0, 99_999, 65535), true), s);
        // Untracked: stays so.
        assert_eq!(
            tcp_observe(UNTRACKED, &seg(TCP_ACK, 1, 2, 3), true),
            UNTRACKED
        );
    }

    #[test]
    fn only_wan_rsts_and_fins_of_active_pairs_are_judged() {
        use crate::maps::FLAG_PORT_FORWARD;
        let live = 1000;
        // The reply entry of a masqueraded connection: WAN side.
        assert!(blind_suspect(FLAG_OFFLOADED, live, TCP_RST));
        assert!(blind_suspect(FLAG_OFFLOADED, live, TCP_FIN | TCP_ACK));
        assert!(!blind_suspect(FLAG_OFFLOADED, live, TCP_SYN));
        assert!(!blind_suspect(FLAG_OFFLOADED, live, TCP_SYN | TCP_RST));
        assert!(!blind_suspect(FLAG_OFFLOADED, LEASE_PENDING, TCP_RST));
        // The LAN side: the opening direction, or a port forward's answer.
        assert!(!blind_suspect(
            FLAG_OFFLOADED | FLAG_ORIGINAL,
            live,
            TCP_RST
        ));
        assert!(!blind_suspect(
            FLAG_OFFLOADED | FLAG_PORT_FORWARD,
            live,
            TCP_RST
        ));
        assert!(blind_suspect(
            FLAG_OFFLOADED | FLAG_ORIGINAL | FLAG_PORT_FORWARD,
            live,
            TCP_RST
        ));
    }

    /// An offloaded connection's direction (its shift from the kernel)
    /// learns its acknowledgement and window from its first ACK segment;
    /// from then on a RST towards it is judged.
    #[test]
    fn an_offloaded_direction_learns_its_window_from_its_first_ack() {
        let learning = TcpWindow {
            wscale: 7,
            flags: TCP_TRACK_LEARN,
            ..TcpWindow::default()
        };
        // A bare RST teaches nothing; until it learned, a RST is taken as
        // it comes, and `tcp_observe` leaves it as it is.
        let mut t = learning;
        tcp_learn(&mut t, 9, 0, TCP_RST);
        assert_eq!(t, learning);
        assert!(in_window(&t, &seg(TCP_RST, 1, 0, 0)));
        assert_eq!(tcp_observe(t, &seg(TCP_ACK, 5000, 70_000, 500), true), t);
        tcp_learn(&mut t, 70_000, 500, TCP_ACK);
        assert_eq!(
            t,
            TcpWindow {
                ack: 70_000,
                win: 500,
                wscale: 7,
                flags: TCP_TRACK_KNOWN
            }
        );
        // Once known, never again: `tcp_observe` follows it.
        tcp_learn(&mut t, 1, 1, TCP_ACK);
        assert_eq!(t.ack, 70_000);
        // 500 << 7 = 64,000 bytes of window, a step of half of it.
        assert!(in_window(&t, &seg(TCP_RST, 70_000 + 64_000, 0, 0)));
        assert!(!in_window(&t, &seg(TCP_RST, 70_000 + 96_001, 0, 0)));
        assert!(!in_window(&t, &seg(TCP_RST, 69_000, 0, 0)));
        assert!(control_in_window(&t, 70_000 + 10, 0, TCP_RST));
        // A FIN must end after what the receiver acknowledged.
        assert!(!control_in_window(&t, 60_000, 0, TCP_FIN | TCP_ACK));
        assert!(control_in_window(&t, 70_000, 0, TCP_FIN | TCP_ACK));
    }

    proptest! {
        #[test]
        fn candidate_always_in_range(attempt in 0u32..64, orig: u16, hash: u32, a: u16, b: u16) {
            let p = candidate_port(attempt, orig, hash, a, b);
            prop_assert!(p >= a.min(b) && p <= a.max(b));
        }

        #[test]
        fn in_window_matches_the_reference_at_any_offset(
            ack: u32, win: u16, shift in 0u8..=14, off: u32, len in 0u16..2000, fin: bool,
        ) {
            // Reference: with the receiver's RCV.NXT anywhere in
            // [ack, ack + step], what may it accept? Computed in u64
            // without wrap, on the offset from `ack`.
            let rcv = TcpWindow { ack, win, wscale: shift, flags: TCP_TRACK_KNOWN };
            let reach = u64::from(window_bytes(&rcv)) + u64::from(ack_step(&rcv));
            let flags = if fin { TCP_FIN | TCP_ACK } else { TCP_RST };
            let len = if fin { len } else { 0 };
            let s = Segment { seq: ack.wrapping_add(off), len, ..seg(flags, 0, 0, 0) };
            let off = u64::from(off);
            let want = if fin {
                let end = (off + u64::from(len) + 1) % (1 << 32);
                end != 0 && end <= reach + u64::from(len) + 1
            } else {
                off <= reach
            };
            prop_assert_eq!(in_window(&rcv, &s), want);
        }

        #[test]
        fn a_blind_rst_rarely_lands(ack: u32, seq: u32, win: u16) {
            // Unscaled: at most (window + step) / 2^32 of the space.
            let rcv = TcpWindow { ack, win, wscale: 0, flags: TCP_TRACK_KNOWN };
            let hit = in_window(&rcv, &seg(TCP_RST, seq, 0, 0));
            prop_assert_eq!(hit, seq.wrapping_sub(ack) <= u32::from(win) + ack_step(&rcv));
        }

        #[test]
        fn out_of_window_changes_nothing(
            c in any::<u32>(), s in any::<u32>(), f in prop::sample::select(&[TCP_RST, TCP_RST | TCP_ACK, TCP_FIN | TCP_ACK][..]),
            seq: u32, from_client: bool,
        ) {
            let (st, fl, ct, stt) = handshake(c, s, NO_WSCALE, NO_WSCALE);
            let (own, peer) = if from_client { (ct, stt) } else { (stt, ct) };
            let r = tcp_control(st, fl, from_client, own, peer, &seg(f, seq, 0, 0), false);
            if r.out_of_window {
                prop_assert_eq!((r.state, r.flags, r.own, r.peer), (st, fl, own, peer));
            } else {
                prop_assert!(in_window(&peer, &seg(f, seq, 0, 0)));
                prop_assert_ne!(r.state, st);
            }
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

    #[test]
    fn offloaded_tcp_control_hands_the_flow_back_for_good() {
        use OffloadedHit::{Carry, Control, HandBack, HandedBack};
        let off = FLAG_OFFLOADED | FLAG_ORIGINAL;
        let lease = 1000;
        // Established data and ACKs of an offloaded flow: XDP's.
        assert_eq!(offloaded_hit(off, lease, IPPROTO_TCP, TCP_ACK), Carry);
        assert_eq!(offloaded_hit(off, lease, IPPROTO_UDP, TCP_FIN), Carry);
        // SYN, FIN or RST: handed back, and everything after it too.
        for f in [TCP_SYN, TCP_FIN | TCP_ACK, TCP_RST, TCP_SYN | TCP_ACK] {
            assert_eq!(offloaded_hit(off, lease, IPPROTO_TCP, f), HandBack);
            assert_eq!(
                offloaded_hit(off, LEASE_HANDED_BACK, IPPROTO_TCP, f),
                Control
            );
        }
        assert_eq!(
            offloaded_hit(off, LEASE_HANDED_BACK, IPPROTO_TCP, TCP_ACK),
            HandedBack
        );
        assert_eq!(
            offloaded_hit(off, LEASE_HANDED_BACK, IPPROTO_UDP, 0),
            HandedBack
        );
        // Standalone flows keep their own TCP state machine.
        assert_eq!(
            offloaded_hit(FLAG_ORIGINAL, LEASE_HANDED_BACK, IPPROTO_TCP, TCP_FIN),
            Carry
        );
    }

    #[test]
    fn a_pending_offload_passes_everything_and_hands_back_at_tcp_control() {
        use OffloadedHit::{HandBack, Pending};
        let off = FLAG_OFFLOADED | FLAG_ORIGINAL;
        // Written, not yet activated: the kernel's, whatever the packet.
        assert_eq!(
            offloaded_hit(off, LEASE_PENDING, IPPROTO_TCP, TCP_ACK),
            Pending
        );
        assert_eq!(
            offloaded_hit(off, LEASE_PENDING, IPPROTO_UDP, TCP_FIN),
            Pending
        );
        // A SYN (the next connection on the ports), FIN or RST hands the
        // pair back, so that the daemon's activation fails.
        for f in [TCP_SYN, TCP_FIN | TCP_ACK, TCP_RST, TCP_SYN | TCP_ACK] {
            assert_eq!(offloaded_hit(off, LEASE_PENDING, IPPROTO_TCP, f), HandBack);
        }
        // Standalone entries know no lease.
        assert_eq!(
            offloaded_hit(FLAG_ORIGINAL, LEASE_PENDING, IPPROTO_TCP, TCP_ACK),
            OffloadedHit::Carry
        );
    }
}
