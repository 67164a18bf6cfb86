//! Offload mode: which of the kernel's connections the XDP data path
//! carries, and keeping the two tables coherent.
//!
//! The kernel admits every flow (firewall, NAT, helpers). Once a connection
//! is established in its conntrack (TCP ESTABLISHED and ASSURED, UDP and
//! ICMP / `ICMPv6` echo after the first reply) and runs between the LAN and
//! the WAN interface, [`Offloader`] writes both directions into the XDP
//! conntrack map: IPv4 with the kernel's NAT mapping ([`entries`]) into
//! `CONNTRACK`, IPv6 (routed, so only connections the kernel does not
//! translate) into `CONNTRACK6` ([`entries6`]). From then on, in both
//! families alike:
//! - TCP FIN/RST/SYN still go to the kernel (the data path passes them), so
//!   it sees the teardown; the first one also hands the connection back
//!   (the data path ends both entries' lease, `LEASE_HANDED_BACK`), so the
//!   kernel sees the rest of the close and a new connection's handshake on
//!   the same ports. A closing state, a DESTROY event or a handed-back
//!   entry found at a tick removes the XDP entries; a connection the
//!   kernel has ESTABLISHED again (the ports reused) is offloaded anew.
//! - Lifetimes: on every [`Offloader::tick`] a flow XDP forwarded since the
//!   last tick gets its kernel timeout reset to the kernel's own value for
//!   the state (`nf_conntrack_*_timeout*`), and its lease in the XDP entries
//!   extended to half of that (at most [`MAX_LEASE_SECS`]). So the kernel
//!   entry always outlives the lease: if the daemon stops, the lease runs
//!   out first and the kernel, which still has the flow, carries it again.
//!   An idle flow gets neither: both tables let it expire.
//! - The entries are written pending ([`LEASE_PENDING`]: the data path passes
//!   every packet to the kernel, and a TCP SYN, FIN or RST hands the pair
//!   back), the kernel's connection is read back, and only then are both
//!   activated by a compare-and-swap of the lease in the kernel
//!   ([`router_common::lease_cas`]), which fails if the data path handed
//!   them back meanwhile. Lease renewals are the same compare-and-swap.
//! - TCP window tracking is switched off when a connection is offloaded
//!   (`IP_CT_TCP_FLAG_BE_LIBERAL`, as `nf_flowtable` does): the kernel does not
//!   see the segments XDP carries, and must not call the next FIN it sees
//!   out of window. It stays off after a hand-back: the kernel's window
//!   state is as old as the offload, and ctnetlink cannot make it re-learn
//!   the window as `nf_flowtable`'s teardown does (`td_maxwin` reset).

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    io,
    net::IpAddr,
};

use router_common::lease_cas::LeaseSwap;
use router_common::maps::{
    EgressKey, EgressSeen, FLAG_OFFLOADED, FLAG_ORIGINAL, FLAG_PORT_FORWARD, FlowEntry, FlowEntry6,
    FlowKey, FlowKey6, FlowState, LEASE_HANDED_BACK, LEASE_PENDING, MAX_ROUTE_MARKS,
    TCP_TRACK_KNOWN, TCP_TRACK_LEARN, TcpWindow, lease_tick,
};
use serde::{Deserialize, Serialize};

use crate::ctnetlink::{Conn, IPPROTO_ICMP, IPPROTO_ICMPV6, Tuple, status, tcp_state};
use crate::netlink::{RouteAnswer, RouteQuery};

/// Longest lease: how long XDP may go on carrying a flow after the daemon
/// last confirmed the kernel still has it.
pub const MAX_LEASE_SECS: u32 = 60;
/// Under a burst of new TCP connections (beyond [`IMMEDIATE_TCP`]), how
/// long one must stay ESTABLISHED before it is offloaded (nanoseconds).
/// Most short connections (a request and a reply) close within it, and
/// then cost the daemon no request to the kernel and no XDP entries, and
/// their close no hand-back (whose FIN can overtake the reply's last
/// segments still in flight on the fast path, and cost the client a
/// spurious fast retransmission); a long flow spends it on the kernel's
/// path.
pub const TCP_SETTLE_NS: u64 = 200_000_000;
/// TCP connections offloaded as soon as they are ESTABLISHED: a rate per
/// second and a burst. Beyond it they wait [`TCP_SETTLE_NS`]: each
/// immediate offload costs requests to the kernel (its state before and
/// after the timeout is set) and map writes, which a burst of short
/// connections pays for nothing (they close right after), on the cores
/// their packets need. Below it, a short transfer is offloaded at once.
pub const IMMEDIATE_TCP: Rate = Rate {
    per_sec: 200,
    burst: 50,
};
/// The kernel entry must outlive the lease by at least this much (the lease
/// is checked in ~1.07 s ticks, and a tick of the daemon may be late).
const LEASE_MARGIN_SECS: u32 = 4;

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const ICMP_ECHO_REQUEST: u8 = 8;
const ICMPV6_ECHO_REQUEST: u8 = 128;

/// Why a connection is (not yet, or never) carried by XDP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Offload,
    /// Not yet: it may become eligible with a later event.
    Wait(&'static str),
    /// Never, or not any more (closing).
    Refuse(&'static str),
}

/// Whether the kernel connection `c` may be carried by XDP.
#[must_use]
pub fn eligibility(c: &Conn) -> Verdict {
    use Verdict::{Offload, Refuse, Wait};
    let v4 = [c.orig.src, c.orig.dst, c.reply.src, c.reply.dst]
        .iter()
        .filter(|a| a.is_ipv4())
        .count();
    if v4 != 0 && v4 != 4 {
        return Refuse("mixed_family");
    }
    // The IPv6 data path routes and never translates: a connection the
    // kernel translates (NAT66, NPTv6) is its own to carry.
    if v4 == 0 && !untranslated(c) {
        return Refuse("ipv6_nat");
    }
    if c.status & (status::DYING | status::UNTRACKED | status::TEMPLATE) != 0 {
        return Refuse("dying");
    }
    if c.helper || c.status & (status::HELPER | status::EXPECTED) != 0 {
        return Refuse("helper");
    }
    if c.seq_adjust || c.has(status::SEQ_ADJUST) {
        return Refuse("seq_adjust");
    }
    if c.zone != 0 {
        return Refuse("zone");
    }
    if !c.has(status::CONFIRMED) {
        return Wait("unconfirmed");
    }
    match c.orig.proto {
        // `None`: an update without the state. The kernel adds it only to
        // an event that changed it (`IPCT_PROTOINFO`), so a change of the ct
        // mark, label or secmark, or an `IPCT_ASSURED` of its own (a
        // connection picked up mid-stream) says nothing of it. Such an event
        // neither ends an offloaded or settling connection nor refuses one;
        // an assured one is a candidate, and the offload reads the kernel's
        // state before it writes anything.
        IPPROTO_TCP => match c.tcp_state {
            Some(tcp_state::ESTABLISHED) | None if c.has(status::ASSURED | status::SEEN_REPLY) => {
                Offload
            }
            Some(s) if s < tcp_state::ESTABLISHED => Wait("tcp_handshake"),
            Some(tcp_state::ESTABLISHED) => Wait("tcp_not_assured"),
            Some(_) => Refuse("tcp_closing"),
            None => Wait("tcp_no_state"),
        },
        IPPROTO_ICMP if c.orig.icmp.map(|(t, _)| t) != Some(ICMP_ECHO_REQUEST) => {
            Refuse("icmp_type")
        }
        IPPROTO_ICMPV6 if c.orig.icmp.map(|(t, _)| t) != Some(ICMPV6_ECHO_REQUEST) => {
            Refuse("icmp_type")
        }
        // An ICMPv4 tuple over IPv6 or the reverse: not a flow either data
        // path keys.
        IPPROTO_ICMP | IPPROTO_ICMPV6 if (c.orig.proto == IPPROTO_ICMPV6) == (v4 != 0) => {
            Refuse("protocol")
        }
        // UDP and ICMP echo: once the other side answered.
        IPPROTO_UDP | IPPROTO_ICMP | IPPROTO_ICMPV6 if c.has(status::SEEN_REPLY) => Offload,
        IPPROTO_UDP | IPPROTO_ICMP | IPPROTO_ICMPV6 => Wait("unreplied"),
        _ => Refuse("protocol"),
    }
}

/// Whether the reply tuple is the original one reversed: the kernel
/// translates nothing.
fn untranslated(c: &Conn) -> bool {
    let (o, r) = (&c.orig, &c.reply);
    r.src == o.dst && r.dst == o.src && r.sport == o.dport && r.dport == o.sport
}

fn v4(a: IpAddr) -> [u8; 4] {
    match a {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(_) => [0; 4],
    }
}

/// The XDP key of one direction of a kernel connection.
#[must_use]
pub fn flow_key(t: &Tuple) -> FlowKey {
    FlowKey::new(v4(t.src), v4(t.dst), t.sport, t.dport, t.proto)
}

fn v6(a: IpAddr) -> [u8; 16] {
    match a {
        IpAddr::V6(a) => a.octets(),
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
    }
}

/// The IPv6 XDP key of one direction of a kernel connection.
#[must_use]
pub fn flow_key6(t: &Tuple) -> FlowKey6 {
    FlowKey6::new(v6(t.src), v6(t.dst), t.sport, t.dport, t.proto)
}

/// The egress witness's key of a packet of the direction the other
/// direction's tuple `t` answers, as the kernel sends it (after its NAT):
/// the original direction leaves as the reply tuple reversed.
fn leaving_as(t: &Tuple) -> EgressKey {
    flow_key6(&Tuple {
        src: t.dst,
        dst: t.src,
        sport: t.dport,
        dport: t.sport,
        ..*t
    })
}

/// Where the daemon takes the mark a connection's packets are routed with
/// from, under policy routing.
#[derive(Clone, Copy, Debug)]
enum PacketMark {
    /// The egress witness (a connection about to be offloaded): the mark
    /// its packets left with, and they must have left as the fast path
    /// would send them. At the `first` look what the witness holds is
    /// forgotten (it may be from before: another route, another connection
    /// on the same ports): only packets the kernel sends after count.
    Witnessed { first: bool },
    /// The one found at its offload (a connection the fast path carries:
    /// the kernel no longer sends its packets).
    Known(u32),
}

/// Refusals for want of the egress witness's evidence: the kernel's packets
/// of a direction not seen leaving an attached interface since the first
/// look, or seen leaving elsewhere (another interface, another next hop)
/// than the fast path's lookup would send them.
const ROUTE_UNSEEN: &str = "route_unseen";
const ROUTE_DIFFERS: &str = "route_differs";

/// Refusal of a UDP or ICMP connection none of whose replies the egress
/// witness saw the kernel forward to the inside (a forward rule drops
/// them): see [`Offloader::reply_forwarded`].
const REPLY_NOT_FORWARDED: &str = "reply_not_forwarded";

/// Capacity of [`Offloader::awaiting_reply`].
const MAX_AWAITING_REPLY: usize = 16_384;

/// How long (ns) a connection stays in [`Offloader::awaiting_reply`]: one
/// that ended without an event (made while nothing listened), or idle
/// that long, is left to the kernel until its next event or resync.
const AWAIT_REPLY_NS: u64 = 300_000_000_000;

/// Why a connection that ended before its offload was not offloaded:
/// while it waited for the egress witness (`waiting`), or as a TCP
/// connection settling.
const fn closed_while(waiting: bool) -> &'static str {
    if waiting {
        "closed_while_waiting_for_witness"
    } else {
        "tcp_closed_while_settling"
    }
}

/// The data path's state for an offloaded connection.
fn flow_state(proto: u8) -> FlowState {
    match proto {
        IPPROTO_TCP => FlowState::TcpEstablished,
        IPPROTO_UDP => FlowState::UdpReplied,
        _ => FlowState::Icmp,
    }
}

/// The window tracking an offloaded TCP connection's direction starts
/// with (`orig`: the original direction): its window scale as conntrack
/// settled it from the handshake, to learn the rest from the first ACK
/// segment it sends ([`TCP_TRACK_LEARN`]), so that a RST or FIN towards it
/// can be judged: one out of its window (a blind RST, RFC 5961) is carried
/// like data and changes nothing, instead of handing the connection back
/// to a kernel that would take it (its window check is off for offloaded
/// connections, `liberal`), close it and soon forget it. Untracked (taken
/// as it comes, as before) where conntrack's own check is off already:
/// picked up mid-stream, or offloaded by an earlier daemon.
fn tcp_tracking(c: &Conn, orig: bool) -> TcpWindow {
    match c.tcp_wscale {
        Some(w) if c.orig.proto == IPPROTO_TCP && !c.tcp_liberal => TcpWindow {
            wscale: w[usize::from(!orig)],
            flags: TCP_TRACK_LEARN,
            ..TcpWindow::default()
        },
        _ => TcpWindow::default(),
    }
}

/// The window tracking of an existing entry (its flags, lease and
/// tracking) that a rewrite of the same connection keeps: an active
/// offloaded entry's that tracks or learns and whose lease has not run out
/// at `now_ns` (an entry idle that long, such as one left on a router that
/// was a VRRP backup meanwhile, holds an acknowledgement the connection may
/// have left far behind). An entry a new connection on the same ports
/// would have met was handed back by its SYN, so it is not active.
fn tracking_to_keep((flags, lease, t): (u8, u32, TcpWindow), now_ns: u64) -> Option<TcpWindow> {
    (flags & FLAG_OFFLOADED != 0
        && carries(lease)
        && lease_tick(now_ns) <= lease
        && t.flags & (TCP_TRACK_KNOWN | TCP_TRACK_LEARN) != 0)
        .then_some(t)
}

/// The window tracking a rewritten entry keeps: `new` (the kernel's, see
/// [`tcp_tracking`]) unless that is untracked and `old` (what
/// [`tracking_to_keep`] kept of the entry being replaced, or of the pair a
/// new ct mark removed) tracks: the same connection carried on (a session
/// re-opened after an attach, a re-created interface, a restart, a ruleset
/// reload that marks again: conntrack is liberal by then and gives no
/// scale), whose learned windows stay.
fn kept_tracking(new: TcpWindow, old: Option<TcpWindow>) -> TcpWindow {
    match old {
        Some(t) if new == TcpWindow::default() => t,
        _ => new,
    }
}

/// Both XDP entries of kernel connection `c`, original direction first.
/// `orig_from_lan`: the original direction arrives on the LAN (else it came
/// in on the WAN: a port forward). Each entry translates its direction to
/// what the kernel's NAT makes of it: the original tuple becomes the
/// reverse of the reply tuple and vice versa.
#[must_use]
pub fn entries(
    c: &Conn,
    orig_from_lan: bool,
    now_ns: u64,
    lease: u32,
    route_mark: u16,
) -> [(FlowKey, FlowEntry); 2] {
    let orig = flow_key(&c.orig);
    let reply = flow_key(&c.reply);
    let side = if orig_from_lan { 0 } else { FLAG_PORT_FORWARD };
    let entry = |peer: FlowKey, to: FlowKey, flags: u8| FlowEntry {
        peer,
        new_src_addr: to.src_addr,
        new_dst_addr: to.dst_addr,
        new_src_port: to.src_port,
        new_dst_port: to.dst_port,
        state: flow_state(c.orig.proto) as u8,
        flags: flags | side | FLAG_OFFLOADED,
        last_seen_ns: now_ns,
        created_ns: now_ns,
        route_mark,
        lease,
        tcp: tcp_tracking(c, flags & FLAG_ORIGINAL != 0),
        ..FlowEntry::default()
    };
    [
        (orig, entry(reply, reply.reversed(), FLAG_ORIGINAL)),
        (reply, entry(orig, orig.reversed(), 0)),
    ]
}

/// Both `CONNTRACK6` entries of the (untranslated, IPv6) kernel connection
/// `c`, original direction first; `orig_from_lan` as for [`entries`].
/// Routed: each entry's key is the other's reversed, and there is no
/// translation to record.
#[must_use]
pub fn entries6(
    c: &Conn,
    orig_from_lan: bool,
    now_ns: u64,
    lease: u32,
) -> [(FlowKey6, FlowEntry6); 2] {
    let side = if orig_from_lan { 0 } else { FLAG_PORT_FORWARD };
    let entry = |flags: u8| FlowEntry6 {
        last_seen_ns: now_ns,
        created_ns: now_ns,
        state: flow_state(c.orig.proto) as u8,
        flags: flags | side | FLAG_OFFLOADED,
        lease,
        tcp: tcp_tracking(c, flags & FLAG_ORIGINAL != 0),
        ..FlowEntry6::default()
    };
    [
        (flow_key6(&c.orig), entry(FLAG_ORIGINAL)),
        (flow_key6(&c.reply), entry(0)),
    ]
}

/// The XDP conntrack maps (`CONNTRACK`, and `CONNTRACK6` for IPv6), as far
/// as the offloader uses them.
pub trait Table {
    fn get(&self, k: &FlowKey) -> Option<FlowEntry>;
    fn insert(&mut self, k: &FlowKey, v: &FlowEntry) -> io::Result<()>;
    fn remove(&mut self, k: &FlowKey);
    /// Sets the lease of the entry under `k` to `new` if it is `expected`,
    /// atomically with respect to the data path (which may hand the entry
    /// back at any time): [`router_common::lease_cas`].
    fn swap_lease(&mut self, k: &FlowKey, expected: u32, new: u32) -> io::Result<LeaseSwap>;
    fn get6(&self, k: &FlowKey6) -> Option<FlowEntry6>;
    fn insert6(&mut self, k: &FlowKey6, v: &FlowEntry6) -> io::Result<()>;
    fn remove6(&mut self, k: &FlowKey6);
    /// [`Table::swap_lease`] in `CONNTRACK6`.
    fn swap_lease6(&mut self, k: &FlowKey6, expected: u32, new: u32) -> io::Result<LeaseSwap>;
    /// The `ROUTE_MARKS` slots written (slot, mark), when the fast path can
    /// route by a mark; `None` when it cannot (a kernel without
    /// `BPF_FIB_LOOKUP_MARK`, or no `ROUTE_MARKS` pinned).
    fn route_marks(&self) -> Option<Vec<(u16, u32)>>;
    /// Writes `mark` into `ROUTE_MARKS` slot `slot`.
    fn set_route_mark(&mut self, slot: u16, mark: u32) -> io::Result<()>;
}

/// The `ROUTE_MARKS` slots the offloader gave out: each mark it needed
/// keeps its slot while a connection it carries has that mark; once every
/// slot is given out, the slots none of the entries of the connections it
/// carries (or of the pairs an earlier daemon left) holds are taken back
/// ([`RouteMarks::take_back`]): cleared in the map at once (an entry a race
/// left behind that still holds one is then passed to the kernel, not
/// routed by another mark) and given to a new mark only a lease's length
/// later ([`SLOT_COOLING_NS`]), when such an entry's lease has run out.
#[derive(Debug, Default)]
struct RouteMarks {
    /// `false`: the fast path cannot route by a mark.
    usable: bool,
    /// The slot of each mark given one.
    slots: HashMap<u32, u16>,
    /// Slots the map had a mark in that another slot had too (read at the
    /// start): given out as far as this offloader knows, until taken back.
    stray: std::collections::HashSet<u16>,
    /// Slots taken back, when (`CLOCK_MONOTONIC` ns) and the mark they
    /// had: free once [`SLOT_COOLING_NS`] has passed, for that mark at
    /// once (an entry left holding it routes by that mark anyway).
    cooling: HashMap<u16, (u64, u32)>,
    /// Whether the pairs an earlier daemon left were swept
    /// ([`Offloader::sweep_left_behind`]): until then entries this session
    /// does not know may hold any slot, and none is taken back.
    swept: bool,
    /// An epoch that moves whenever entries holding a route mark are
    /// removed (a carried connection with one ended, inherited pairs
    /// released): a slot may have come free.
    marked_ended: u64,
    /// [`Self::marked_ended`] at the last take-back: every slot not taken
    /// back then was held, and is until the epoch moves.
    looked_at: Option<u64>,
    /// Connections were refused a slot, and a resync is owed to them
    /// once one can be had (a lasting connection may send no event).
    refused: Option<Refused>,
}

/// When connections were refused a `ROUTE_MARKS` slot, which says when a
/// resync may find one for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refused {
    /// Before the sweep: after it.
    BeforeSweep,
    /// Every slot held: once a marked connection ends.
    AllHeld,
}

/// How long a `ROUTE_MARKS` slot taken back stays unused: the longest
/// lease of an offloaded entry ([`MAX_LEASE_SECS`]) and two seconds for
/// the lease ticks, so an entry a race left holding it has expired.
const SLOT_COOLING_NS: u64 = (MAX_LEASE_SECS as u64 + 2) * 1_000_000_000;

/// The least time between a resync and the next one owed to connections
/// refused a `ROUTE_MARKS` slot ([`Offloader::resync_retry_due`]).
const SLOTS_RESYNC_SPACING_NS: u64 = 10_000_000_000;

impl RouteMarks {
    /// The slots already written in `table`'s map.
    fn of<T: Table>(table: &T) -> Self {
        let Some(written) = table.route_marks() else {
            return Self::default();
        };
        let mut marks = Self {
            usable: true,
            ..Self::default()
        };
        for (slot, mark) in written {
            if slot == 0 || mark == 0 {
                continue;
            }
            match marks.slots.entry(mark) {
                std::collections::hash_map::Entry::Occupied(_) => {
                    marks.stray.insert(slot);
                }
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(slot);
                }
            }
        }
        marks
    }

    /// The slot of `mark` at `now_ns` (written into `table`'s map if new);
    /// `Ok(None)` when every slot is given out or cooling.
    fn slot<T: Table>(&mut self, table: &mut T, mark: u32, now_ns: u64) -> io::Result<Option<u16>> {
        if let Some(&slot) = self.slots.get(&mark) {
            return Ok(Some(slot));
        }
        self.cooling
            .retain(|_, &mut (since, _)| now_ns.saturating_sub(since) < SLOT_COOLING_NS);
        let own = self
            .cooling
            .iter()
            .find(|&(_, &(_, had))| had == mark)
            .map(|(&slot, _)| slot);
        let Some(slot) = own.or_else(|| {
            (1..u16::try_from(MAX_ROUTE_MARKS).unwrap_or(u16::MAX)).find(|s| {
                !self.slots.values().any(|taken| taken == s)
                    && !self.stray.contains(s)
                    && !self.cooling.contains_key(s)
            })
        }) else {
            return Ok(None);
        };
        table.set_route_mark(slot, mark)?;
        self.cooling.remove(&slot);
        self.slots.insert(mark, slot);
        Ok(Some(slot))
    }

    /// Whether a look for slots to take back may find any: after the
    /// sweep, and once entries holding a mark were removed since the last
    /// look.
    fn may_take_back(&self) -> bool {
        self.usable && self.swept && self.looked_at != Some(self.marked_ended)
    }

    /// Takes back the slots not in `held` (those the entries of carried
    /// connections and inherited pairs hold) at `now_ns`: cleared in
    /// `table`'s map and cooling; how many.
    fn take_back<T: Table>(
        &mut self,
        table: &mut T,
        held: &std::collections::HashSet<u16>,
        now_ns: u64,
    ) -> usize {
        self.looked_at = Some(self.marked_ended);
        let mut free: Vec<u16> = self
            .slots
            .values()
            .chain(&self.stray)
            .copied()
            .filter(|s| !held.contains(s))
            .collect();
        free.sort_unstable();
        free.dedup();
        let mut taken_back = 0;
        for slot in free {
            if let Err(e) = table.set_route_mark(slot, 0) {
                // Kept as given out: an entry may still route by its mark.
                tracing::warn!("offload: clearing ROUTE_MARKS slot {slot}: {e}");
                continue;
            }
            let had = self.mark_in(slot).unwrap_or(0);
            self.slots.retain(|_, s| *s != slot);
            self.stray.remove(&slot);
            self.cooling.insert(slot, (now_ns, had));
            taken_back += 1;
        }
        taken_back
    }

    /// When the first cooling slot is free again (`CLOCK_MONOTONIC` ns).
    fn next_free_at(&self) -> Option<u64> {
        self.cooling
            .values()
            .map(|&(since, _)| since)
            .min()
            .map(|since| since + SLOT_COOLING_NS)
    }

    /// The mark slot `slot` holds (0 for slot 0: no mark); `None` for a
    /// slot this offloader does not know.
    fn mark_in(&self, slot: u16) -> Option<u32> {
        if slot == 0 {
            return Some(0);
        }
        self.slots
            .iter()
            .find(|&(_, &s)| s == slot)
            .map(|(&mark, _)| mark)
    }
}

/// The XDP keys of an offloaded connection: original direction, reply
/// direction, in the map of its family.
#[derive(Clone, Copy, Debug)]
enum Keys {
    V4([FlowKey; 2]),
    V6([FlowKey6; 2]),
}

/// The XDP keys of the connections an offloader carries.
#[derive(Default)]
struct OwnedKeys {
    v4: std::collections::HashSet<FlowKey>,
    v6: std::collections::HashSet<FlowKey6>,
}

/// Whether a lease may carry packets (not pending, not handed back): one
/// [`Keys::remove`] must end before it removes the entry.
fn carries(lease: u32) -> bool {
    lease != LEASE_PENDING && lease != LEASE_HANDED_BACK
}

impl Keys {
    /// The window scales of both entries that track ([`tracking_to_keep`]),
    /// original direction first, as tracking that learns the rest again
    /// ([`TCP_TRACK_LEARN`]): for the connection's offload after a new ct
    /// mark, which may come much later (a keep-in-kernel mark, a witness
    /// wait, the mark changed back), when what the entries learned may be
    /// far behind; its scales are the connection's for good. `None` when
    /// neither tracks (or is gone).
    fn scales_to_keep<T: Table>(&self, table: &T, now_ns: u64) -> Option<[TcpWindow; 2]> {
        let kept = |old: Option<(u8, u32, TcpWindow)>| {
            old.and_then(|o| tracking_to_keep(o, now_ns))
                .map_or_else(TcpWindow::default, |t| TcpWindow {
                    wscale: t.wscale,
                    flags: TCP_TRACK_LEARN,
                    ..TcpWindow::default()
                })
        };
        let w = match self {
            Self::V4(keys) => keys.map(|k| kept(table.get(&k).map(|e| (e.flags, e.lease, e.tcp)))),
            Self::V6(keys) => keys.map(|k| kept(table.get6(&k).map(|e| (e.flags, e.lease, e.tcp)))),
        };
        (w != [TcpWindow::default(); 2]).then_some(w)
    }

    /// Removes those of both entries whose key no connection in `owned`
    /// has (an earlier daemon's pair, whose keys a connection offloaded
    /// since may have taken), live leases handed back first as in
    /// [`Self::remove`]. Returns whether one of them carried.
    fn remove_unowned<T: Table>(&self, table: &mut T, owned: &OwnedKeys) -> bool {
        let mut carried = false;
        match self {
            Self::V4(keys) => {
                let gone = |k: &&FlowKey| !owned.v4.contains(*k);
                for k in keys.iter().filter(gone) {
                    if let Some(e) = table.get(k)
                        && carries(e.lease)
                    {
                        carried = true;
                        let _ = table.swap_lease(k, e.lease, LEASE_HANDED_BACK);
                    }
                }
                for k in keys.iter().filter(gone) {
                    table.remove(k);
                }
            }
            Self::V6(keys) => {
                let gone = |k: &&FlowKey6| !owned.v6.contains(*k);
                for k in keys.iter().filter(gone) {
                    if let Some(e) = table.get6(k)
                        && carries(e.lease)
                    {
                        carried = true;
                        let _ = table.swap_lease6(k, e.lease, LEASE_HANDED_BACK);
                    }
                }
                for k in keys.iter().filter(gone) {
                    table.remove6(k);
                }
            }
        }
        carried
    }

    /// Removes both entries, their live leases handed back first: a packet of
    /// the flow between the two removals that rebuilds the first half from
    /// the second (the data path puts back a half the LRU evicted) then
    /// rebuilds it with a dead lease, not one that would carry a flow the
    /// kernel ended past it until the lease ran out.
    fn remove<T: Table>(&self, table: &mut T) {
        self.remove_unowned(table, &OwnedKeys::default());
    }

    /// Whether the data path handed the connection back to the kernel (a
    /// TCP SYN, FIN or RST) or one of its entries is gone: XDP no longer
    /// carries it.
    fn handed_back<T: Table>(&self, table: &T) -> bool {
        self.read(table).is_none_or(|r| r.handed_back())
    }

    /// Both entries' leases and their newest last-seen time (one read of
    /// each), `None` if one is gone.
    fn read<T: Table>(&self, table: &T) -> Option<PairRead> {
        let (leases, seen) = match self {
            Self::V4([a, b]) => {
                let (a, b) = (table.get(a)?, table.get(b)?);
                ([a.lease, b.lease], [a.last_seen_ns, b.last_seen_ns])
            }
            Self::V6([a, b]) => {
                let (a, b) = (table.get6(a)?, table.get6(b)?);
                ([a.lease, b.lease], [a.last_seen_ns, b.last_seen_ns])
            }
        };
        Some(PairRead {
            leases,
            last_seen_ns: seen[0].max(seen[1]),
        })
    }

    /// Swaps the lease of the `i`-th entry from `expected` to `new`
    /// ([`Table::swap_lease`]).
    fn swap_lease<T: Table>(
        &self,
        table: &mut T,
        i: usize,
        expected: u32,
        new: u32,
    ) -> io::Result<LeaseSwap> {
        match self {
            Self::V4(keys) => table.swap_lease(&keys[i], expected, new),
            Self::V6(keys) => table.swap_lease6(&keys[i], expected, new),
        }
    }

    /// Activates a pair written with [`LEASE_PENDING`]: both leases go from
    /// pending to `lease`, reply direction first (as [`write_pair`]
    /// writes). Whether both did; if not, the data path handed the pair
    /// back in between (a TCP SYN, FIN or RST hit a pending entry) or an
    /// entry is gone, and the pair must be removed: the first entry, if
    /// activated, was handed back too (the data path ends both leases).
    fn activate<T: Table>(&self, table: &mut T, lease: u32) -> io::Result<bool> {
        for i in [1, 0] {
            if self.swap_lease(table, i, LEASE_PENDING, lease)? != LeaseSwap::Swapped {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Extends both entries' lease to `lease`; the failed renewals. Each is
    /// a compare-and-swap from the lease `read` found: an entry the data
    /// path handed back (before or during the renewal) keeps
    /// [`LEASE_HANDED_BACK`], and the tick removes the pair.
    fn set_lease<T: Table>(&self, table: &mut T, read: &PairRead, lease: u32) -> u64 {
        let mut failed = 0;
        for (i, now) in read.leases.into_iter().enumerate() {
            let ok = now == LEASE_HANDED_BACK
                || match self.swap_lease(table, i, now, lease) {
                    Ok(LeaseSwap::Swapped | LeaseSwap::Changed(LEASE_HANDED_BACK)) => true,
                    Ok(LeaseSwap::Changed(_) | LeaseSwap::Gone) => false,
                    Err(e) => {
                        tracing::warn!("offload: renewing a lease: {e}");
                        false
                    }
                };
            failed += u64::from(!ok);
        }
        failed
    }
}

/// The kernel's conntrack, as far as the offloader changes it.
pub trait Kernel {
    /// Sets the timeout (seconds) of the connection whose original tuple is
    /// `orig`, and for TCP switches window checking off (`liberal`).
    /// `ENOENT` when the kernel no longer has it.
    fn refresh(&mut self, orig: &Tuple, timeout: u32, liberal: bool) -> io::Result<()>;
    /// The kernel's TCP connection with original tuple `orig` as it is
    /// now; `None` when the kernel no longer has it.
    fn tcp_now(&mut self, orig: &Tuple) -> io::Result<Option<TcpNow>>;
    /// The kernel's connection with original tuple `orig` as it is now;
    /// `None` when the kernel no longer has it.
    fn conn_now(&mut self, orig: &Tuple) -> io::Result<Option<Conn>>;
    /// Which interface the kernel routes `addr` out of.
    fn route(&mut self, addr: IpAddr) -> Option<u32>;
    /// Whether IPv4's and IPv6's policy rules route some packets by more
    /// than their destination (source, mark, incoming interface, ports),
    /// and a number that changes with the rules.
    fn routing_rules(&mut self) -> ([bool; 2], u64);
    /// The route the kernel forwards the packet `q` by.
    fn forward_route(&mut self, q: &RouteQuery) -> Option<RouteAnswer>;
    /// Whether `addr` is an address of interface `ifindex`.
    fn address_of(&mut self, addr: IpAddr, ifindex: u32) -> bool;
    /// Marks the connection with original tuple `orig` assured
    /// (`IPS_ASSURED`), as the kernel marks a UDP stream.
    fn assure(&mut self, orig: &Tuple) -> io::Result<()>;
    /// The `IPsec` policies now, and a number that changes when they do.
    fn ipsec_policies(&mut self) -> (&[crate::xfrm::Selector], u64);
    /// Every connection the kernel has now (a dump of its table).
    fn dump(&mut self) -> io::Result<Vec<Conn>>;
    /// How the kernel last sent a packet `key` (as it left, after NAT) out
    /// of an attached interface, as the egress witness saw it.
    fn egress_seen(&mut self, _key: &EgressKey) -> Witnessed {
        Witnessed::NoWitness
    }
    /// Whether the egress witness is there to ask (attached at the first
    /// ask, which the daemon makes when its session opens).
    fn has_witness(&mut self) -> bool {
        false
    }
    /// Forgets what the egress witness saw of packets `key`: a decision
    /// after this one must see packets the kernel sends from now on.
    fn forget_egress(&mut self, _key: &EgressKey) {}
    /// The MAC of the neighbour `addr` on interface `ifindex`, as the
    /// kernel has it (read at most once a tick, unless `fresh`).
    fn neighbour_mac(&mut self, _ifindex: u32, _addr: IpAddr, _fresh: bool) -> Option<[u8; 6]> {
        None
    }
}

/// What the egress witness says of a packet the kernel sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Witnessed {
    /// No witness attached (a kernel without tcx): conntrack's "replied"
    /// and the routing rules alone decide.
    NoWitness,
    /// It saw no such packet leave an attached interface.
    Unseen,
    Seen(EgressSeen),
}

/// How often a connection is looked at again ([`WITNESS_WAIT_NS`] apart)
/// for the egress witness's evidence before it is left to the kernel: once
/// after the first look (which forgot what the witness held), then while
/// its packets are not seen leaving as the fast path would send them (a
/// direction with no packet in a second, a neighbour read anew).
const WITNESS_TRIES: u8 = 4;
const WITNESS_WAIT_NS: u64 = 1_000_000_000;

/// What the offloader reads back of a kernel TCP connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpNow {
    /// `enum tcp_conntrack`.
    pub state: u8,
    /// The reply tuple: the translation.
    pub reply: Tuple,
    /// The window scale of each direction (original, reply) while
    /// conntrack checks the connection's windows (`None` once it is
    /// liberal, or when the kernel did not say).
    pub scales: Option<[u8; 2]>,
}

/// The kernel's idle timeouts (seconds) for the states XDP carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelTimeouts {
    /// A replied UDP flow that is not (yet) a stream: the kernel's
    /// `nf_conntrack_udp_timeout` (a DNS exchange keeps it).
    pub udp: u32,
    /// A UDP stream (assured: still active 2 s after it began).
    pub udp_stream: u32,
    pub icmp: u32,
    pub icmpv6: u32,
    /// TCP's timeout per conntrack state (`enum tcp_conntrack`: `NONE`,
    /// `SYN_SENT`, `SYN_RECV`, `ESTABLISHED`, `FIN_WAIT`, `CLOSE_WAIT`,
    /// `LAST_ACK`, `TIME_WAIT`, `CLOSE`, `SYN_SENT2`), to give a closed
    /// connection back the timeout of its state; `ESTABLISHED`'s is the one
    /// an offloaded connection gets ([`KernelTimeouts::of`]).
    pub tcp_by_state: [u32; TCP_STATES],
}

/// Conntrack's TCP states the kernel's timeouts are kept for.
pub const TCP_STATES: usize = 10;

/// The `nf_conntrack_tcp_timeout_*` sysctl of each TCP state, in
/// [`KernelTimeouts::tcp_by_state`]'s order.
const TCP_STATE_SYSCTLS: [&str; TCP_STATES] = [
    "established", // NONE has no sysctl of its own; never read.
    "syn_sent",
    "syn_recv",
    "established",
    "fin_wait",
    "close_wait",
    "last_ack",
    "time_wait",
    "close",
    "syn_sent",
];

impl Default for KernelTimeouts {
    /// Linux's defaults.
    fn default() -> Self {
        Self {
            udp: 30,
            udp_stream: 120,
            icmp: 30,
            icmpv6: 30,
            tcp_by_state: [432_000, 120, 60, 432_000, 120, 60, 30, 120, 10, 120],
        }
    }
}

impl KernelTimeouts {
    /// The running kernel's values (of the current network namespace),
    /// defaults where a sysctl cannot be read.
    #[must_use]
    pub fn read() -> Self {
        let d = Self::default();
        let sysctl = |name: &str, default: u32| {
            std::fs::read_to_string(format!("/proc/sys/net/netfilter/{name}"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(default)
        };
        Self {
            udp: sysctl("nf_conntrack_udp_timeout", d.udp),
            udp_stream: sysctl("nf_conntrack_udp_timeout_stream", d.udp_stream),
            icmp: sysctl("nf_conntrack_icmp_timeout", d.icmp),
            icmpv6: sysctl("nf_conntrack_icmpv6_timeout", d.icmpv6),
            tcp_by_state: std::array::from_fn(|i| {
                let name = format!("nf_conntrack_tcp_timeout_{}", TCP_STATE_SYSCTLS[i]);
                sysctl(&name, d.tcp_by_state[i])
            }),
        }
    }

    /// The kernel's timeout for a TCP connection in conntrack state `state`.
    #[must_use]
    pub fn tcp_state(&self, state: u8) -> u32 {
        self.tcp_by_state
            .get(usize::from(state))
            .copied()
            .unwrap_or(self.tcp_established())
    }

    /// The kernel's timeout for an established TCP connection.
    #[must_use]
    pub const fn tcp_established(&self) -> u32 {
        self.tcp_by_state[tcp_state::ESTABLISHED as usize]
    }

    /// The kernel's timeout for an offloaded flow of `proto`; a UDP flow's
    /// as the kernel would give it: the stream timeout once it is a stream
    /// (`stream`), else the plain one.
    #[must_use]
    pub const fn of(&self, proto: u8, stream: bool) -> u32 {
        match proto {
            IPPROTO_TCP => self.tcp_established(),
            IPPROTO_UDP if stream => self.udp_stream,
            IPPROTO_UDP => self.udp,
            IPPROTO_ICMPV6 => self.icmpv6,
            _ => self.icmp,
        }
    }
}

/// The lease for a flow whose kernel entry was just given `timeout`
/// seconds: half of it, at most [`MAX_LEASE_SECS`]; `None` when the
/// timeout is too short to leave a safe margin (the flow stays in the
/// kernel).
#[must_use]
pub fn lease_secs(timeout: u32) -> Option<u32> {
    let lease = (timeout / 2).min(MAX_LEASE_SECS);
    (lease >= 1 && timeout.saturating_sub(lease) >= LEASE_MARGIN_SECS).then_some(lease)
}

fn lease_until(now_ns: u64, secs: u32) -> u32 {
    lease_tick(now_ns + secs_ns(secs))
}

/// What the offloader has done, for status, stats and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OffloadStats {
    /// Connections written to the XDP table.
    pub offloaded: u64,
    /// TCP connections that settled under a burst ([`TCP_SETTLE_NS`]) and
    /// were then offloaded (the offload's checks may still refuse them).
    #[serde(default)]
    pub settled: u64,
    /// Removed because the kernel destroyed its entry.
    pub ended_destroyed: u64,
    /// Removed because the kernel's TCP state went to closing.
    pub ended_closing: u64,
    /// Removed because the kernel no longer had the entry at a refresh.
    pub ended_kernel_gone: u64,
    /// Removed at a tick because the data path had handed the connection
    /// back at a TCP SYN, FIN or RST (before the kernel's closing update
    /// arrived, or with none: a SYN on an established connection).
    #[serde(default)]
    pub ended_tcp_control: u64,
    /// Removed because an `IPsec` policy added since covers it (the kernel
    /// encrypts or checks its packets; the fast path would not).
    #[serde(default)]
    pub ended_ipsec: u64,
    /// Removed because the policy rules changed and the kernel now routes
    /// it elsewhere than the fast path would.
    #[serde(default)]
    pub ended_rerouted: u64,
    /// Removed because the connection's ct mark changed, then offloaded
    /// again if it still may be.
    #[serde(default)]
    pub ended_remarked: u64,
    /// Removed because it was taken over from an earlier daemon (a
    /// restart, an upgrade) under policy rules, whose packets' mark this
    /// daemon's egress witness never saw; then decided anew with it.
    #[serde(default)]
    pub ended_unwitnessed: u64,
    /// Removed because the kernel's entry for the same original tuple
    /// now has another reply tuple (another translation; its events were
    /// lost) or is another connection (another conntrack id: the old one
    /// ended unsaid), then decided again with the kernel's.
    #[serde(default)]
    pub ended_remapped: u64,
    /// Removed at a start: an earlier daemon's carrying pair of a
    /// connection the kernel has but this daemon does not carry (refused
    /// under what changed while no daemon ran: a keep-in-kernel mark, an
    /// `IPsec` policy, a route; or closed while settling).
    #[serde(default)]
    pub ended_not_taken_over: u64,
    /// TCP connections found closed right after their kernel timeout was
    /// set (closed meanwhile through the kernel): their closing state's
    /// timeout restored, not (or no longer) offloaded.
    #[serde(default)]
    pub closed_while_refreshed: u64,
    /// TCP connections whose XDP entries were removed right after being
    /// written: the kernel's entry had meanwhile become a new connection
    /// on the same ports (or closed), which the entries must not carry.
    #[serde(default)]
    pub undone_replaced: u64,
    /// Connections whose XDP entries were removed before their activation:
    /// the data path handed them back while they were pending (a TCP SYN,
    /// FIN or RST: the connection closed, or the next one on the same
    /// ports began, during the offload), or one was gone (LRU eviction,
    /// flush).
    #[serde(default)]
    pub undone_handed_back: u64,
    /// XDP entries found missing (LRU eviction, flush): the kernel carries
    /// the connection again.
    pub handed_back: u64,
    /// Kernel timeouts refreshed (and leases extended) for active flows.
    pub refreshed: u64,
    /// Full resynchronisations from a dump (start, lost events).
    pub resyncs: u64,
    /// Times the kernel reported lost events (`ENOBUFS`).
    pub events_lost: u64,
    /// Conntrack events read and applied (those the socket's filter lets
    /// through: not the echoes of the daemon's own writes).
    #[serde(default)]
    pub events_read: u64,
    /// Resyncs whose dump of the kernel's table failed: tried again at
    /// the next tick ([`Offloader::resync_due`]).
    #[serde(default)]
    pub resync_failures: u64,
    /// Reads of the event socket on the poll timer, a batch each: under a
    /// load of events the daemon polls for them rather than waking for each
    /// ([`crate::event_pace`]).
    #[serde(default)]
    pub event_polls: u64,
    /// Times the event socket went back from polling to being waited for
    /// (the load thinned out).
    #[serde(default)]
    pub event_waits_again: u64,
    /// Failed writes to the XDP table or the kernel.
    pub errors: u64,
    /// Connections not offloaded, by reason.
    pub not_offloaded: BTreeMap<String, u64>,
}

/// Why [`Offloader::tick`] forgets a connection.
#[derive(Clone, Copy)]
enum Gone {
    /// The kernel no longer has it.
    Kernel,
    /// An XDP entry is missing (LRU eviction, flush).
    Evicted,
    /// The data path handed it back at a TCP SYN, FIN or RST.
    TcpControl,
    /// An `IPsec` policy covers it now.
    Ipsec,
    /// The policy rules route it elsewhere now.
    Rerouted,
    /// Taken over from an earlier daemon under policy rules: handed back
    /// for the egress witness to see how the kernel routes its packets.
    Unwitnessed,
}

/// What one read of a connection's two XDP entries found.
struct PairRead {
    /// Original direction's, reply direction's.
    leases: [u32; 2],
    last_seen_ns: u64,
}

impl PairRead {
    /// The data path handed the connection back to the kernel (a TCP SYN,
    /// FIN or RST): XDP no longer carries it.
    fn handed_back(&self) -> bool {
        self.leases.contains(&LEASE_HANDED_BACK)
    }
}

/// A rate limit: so many events per second, up to `burst` at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub per_sec: u32,
    pub burst: u32,
}

/// A token bucket of [`Rate`]: whether an event may happen now.
#[derive(Clone, Copy, Debug)]
pub struct TokenBucket {
    rate: Rate,
    /// Tokens, in billionths (one token is earned in `1e9 / per_sec`
    /// nanoseconds, so a billionth per nanosecond and event per second).
    nano_tokens: u64,
    at_ns: u64,
}

impl TokenBucket {
    const ONE: u64 = 1_000_000_000;

    /// Full: `burst` events may happen at once.
    #[must_use]
    pub fn new(rate: Rate) -> Self {
        Self {
            rate,
            nano_tokens: u64::from(rate.burst) * Self::ONE,
            at_ns: 0,
        }
    }

    /// Takes a token if there is one at `now_ns`.
    pub fn take(&mut self, now_ns: u64) -> bool {
        let cap = u64::from(self.rate.burst) * Self::ONE;
        let earned = now_ns
            .saturating_sub(self.at_ns)
            .saturating_mul(u64::from(self.rate.per_sec));
        self.nano_tokens = self.nano_tokens.saturating_add(earned).min(cap);
        self.at_ns = self.at_ns.max(now_ns);
        let ok = self.nano_tokens >= Self::ONE;
        if ok {
            self.nano_tokens -= Self::ONE;
        }
        ok
    }
}

/// A TCP connection seen ESTABLISHED under a burst, waiting out
/// [`TCP_SETTLE_NS`].
struct Settling {
    conn: Conn,
    due_ns: u64,
}

struct Offloaded {
    keys: Keys,
    /// The kernel's reply tuple when offloaded (with NAT, the
    /// translation the XDP entries carry).
    reply: Tuple,
    proto: u8,
    /// The kernel's id of the connection (`CTA_ID`; 0: not known).
    id: u32,
    /// Newest `last_seen_ns` of the two XDP entries at the last tick.
    last_seen_ns: u64,
    /// When (`CLOCK_MONOTONIC` ns) the kernel's entry runs out if nothing
    /// refreshes it: the timeout the daemon last wrote, from then. An
    /// idle flow past it is looked up in the kernel ([`Offloader::tick`]).
    kernel_due_ns: u64,
    /// From when (`CLOCK_MONOTONIC` ns) a packet makes a UDP flow a
    /// stream: the offload if the kernel had it assured, else
    /// [`UDP_STREAM_AFTER_NS`] after it.
    stream_from_ns: u64,
    /// The kernel has it assured: a TCP connection, a UDP flow assured
    /// when offloaded or marked so once a stream ([`Kernel::assure`]).
    assured: bool,
    /// The connection's ct mark when offloaded (what marked `IPsec`
    /// policies and policy rules select).
    mark: u32,
    /// The mark its XDP entries' FIB lookups carry (0: none).
    route_mark: u32,
    /// The mark its packets were routed with in the kernel when offloaded
    /// (as the egress witness saw it, else the ct mark under the mask);
    /// `None` for a connection taken over from the entries an earlier
    /// daemon wrote (what its packets carried is not known here: under
    /// policy rules, with the witness, the next tick hands it back to be
    /// decided anew, [`Gone::Unwitnessed`]).
    packet_mark: Option<u32>,
}

impl Offloaded {
    /// Whether the kernel's connection `c` on this flow's tuple is another
    /// one than the flow was offloaded from (both ids known, different).
    fn replaced_by(&self, c: &Conn) -> bool {
        self.id != 0 && c.id != 0 && self.id != c.id
    }
}

/// After a resync whose dump failed, the next try; doubled after each
/// failure in a row, up to the second.
const RESYNC_RETRY_FIRST_NS: u64 = 2_000_000_000;
const RESYNC_RETRY_MAX_NS: u64 = 60_000_000_000;

/// How long a UDP flow must stay active to be a stream, which gets the
/// kernel's longer timeout: netfilter marks a replied flow assured (and
/// gives it `nf_conntrack_udp_timeout_stream`) when a packet comes more
/// than 2 s after the flow began; before, a reply only keeps
/// `nf_conntrack_udp_timeout`. Counted here from the offload.
const UDP_STREAM_AFTER_NS: u64 = 2_000_000_000;

/// Keeps the XDP table in step with the kernel's offloadable connections.
pub struct Offloader<T, K> {
    pub table: T,
    pub kernel: K,
    lan: u32,
    wan: u32,
    timeouts: KernelTimeouts,
    flows: HashMap<Tuple, Offloaded>,
    /// TCP connections to offload once settled, and their due times in
    /// order (a tuple ended and seen again leaves a stale earlier entry
    /// there, skipped).
    settling: HashMap<Tuple, Settling>,
    settle_order: VecDeque<(Tuple, u64)>,
    /// Which TCP connections are offloaded at once ([`IMMEDIATE_TCP`]).
    immediate_tcp: TokenBucket,
    /// A resync is owed: the last one's dump failed (the table may miss
    /// connections the kernel has, or hold some it ended), or a decision
    /// asked for one (a rerouted connection that may send no event again).
    resync_due: bool,
    /// Resyncs failed in a row, and when (`CLOCK_MONOTONIC` ns) the next
    /// try is due: a dump that keeps failing (memory) is tried less often.
    resync_failed_in_row: u32,
    resync_retry_at_ns: u64,
    /// When (`CLOCK_MONOTONIC` ns) a resync is owed to connections refused
    /// a `ROUTE_MARKS` slot, once one can be had ([`Self::owe_resync_at`]).
    slots_free_at_ns: Option<u64>,
    /// When the last resync ran: one owed for slots waits
    /// [`SLOTS_RESYNC_SPACING_NS`] after it (a busy router with every slot
    /// held ends a marked connection every moment).
    last_resync_ns: u64,
    /// The `IPsec` policies' number ([`Kernel::ipsec_policies`]) when the
    /// offloaded connections were last checked against them.
    ipsec_seen: u64,
    /// The policy rules' number ([`Kernel::routing_rules`]) when the
    /// offloaded connections were last routed again; first read when the
    /// offloader is made (the rules a takeover is decided under), so a
    /// restart alone reroutes nothing.
    rules_seen: u64,
    /// Connections whose ct mark masked is this `(value, mask)` stay in
    /// the kernel (`run --keep-in-kernel-mark`).
    pub keep_in_kernel_mark: Option<(u32, u32)>,
    /// The bits of the ct mark the packets are routed with (`run
    /// --route-mark-mask`; all by default).
    pub route_mark_mask: u32,
    route_marks: RouteMarks,
    /// Whether the warning of a full `ROUTE_MARKS` was given (again once
    /// a mark got a slot).
    route_marks_full_said: bool,
    /// Connections waiting for the egress witness's evidence (in
    /// `settling`), and how often they were looked at; their due times in
    /// order.
    witness_tries: HashMap<Tuple, u8>,
    witness_order: VecDeque<(Tuple, u64)>,
    /// UDP and ICMP connections refused for want of a forwarded reply
    /// ([`REPLY_NOT_FORWARDED`]), looked at again at each tick for
    /// [`AWAIT_REPLY_NS`]: such a
    /// connection sends no further event (an assured UDP flow, an echo
    /// flow), and one whose replies the kernel forwards later (a flow idle
    /// at a failover's commit or a daemon's start, a rule removed) is
    /// offloaded then. At most [`MAX_AWAITING_REPLY`], the oldest first out;
    /// each with when it came in, which its place in the order carries too
    /// (a tuple taken out and put in again has a stale place there).
    awaiting_reply: HashMap<Tuple, u64>,
    awaiting_order: VecDeque<(Tuple, u64)>,
    /// The window scales of connections whose pair a new ct mark removed
    /// (original direction first, [`Keys::scales_to_keep`]), for their
    /// offload again: the kernel's entry is liberal by then and gives none.
    remarked_windows: HashMap<Tuple, [TcpWindow; 2]>,
    /// Carrying pairs an earlier daemon left of connections the kernel
    /// has, which this session has not taken over: each is removed at the
    /// next tick unless taken over by then or still settling
    /// ([`Self::release_unclaimed`]; at a tick, not at each offload,
    /// DESTROY or refusal: the keys this session owns are gathered once
    /// per tick, not once per connection of a restart's thousands).
    inherited: HashMap<Tuple, Keys>,
    pub stats: OffloadStats,
}

impl<T: Table, K: Kernel> Offloader<T, K> {
    /// The kernel's timeouts from now on (the daemon reads them again at
    /// every tick: an owner's sysctl change applies to the offloaded
    /// connections the next refresh writes).
    pub fn set_timeouts(&mut self, timeouts: KernelTimeouts) {
        self.timeouts = timeouts;
    }

    pub fn new(table: T, mut kernel: K, lan: u32, wan: u32, timeouts: KernelTimeouts) -> Self {
        let rules_seen = kernel.routing_rules().1;
        Self {
            kernel,
            lan,
            wan,
            timeouts,
            flows: HashMap::new(),
            settling: HashMap::new(),
            settle_order: VecDeque::new(),
            remarked_windows: HashMap::new(),
            inherited: HashMap::new(),
            immediate_tcp: TokenBucket::new(IMMEDIATE_TCP),
            resync_due: false,
            slots_free_at_ns: None,
            last_resync_ns: 0,
            resync_failed_in_row: 0,
            resync_retry_at_ns: 0,
            ipsec_seen: 0,
            rules_seen,
            keep_in_kernel_mark: None,
            route_mark_mask: u32::MAX,
            route_marks: RouteMarks::of(&table),
            route_marks_full_said: false,
            witness_tries: HashMap::new(),
            witness_order: VecDeque::new(),
            awaiting_reply: HashMap::new(),
            awaiting_order: VecDeque::new(),
            stats: OffloadStats::default(),
            table,
        }
    }

    /// Owes the connections refused a `ROUTE_MARKS` slot a resync at
    /// `at_ns` (`CLOCK_MONOTONIC`), or at an earlier time owed already;
    /// apart from a resync the last dump's failure owes (its own backoff).
    fn owe_resync_at(&mut self, at_ns: u64) {
        self.slots_free_at_ns = Some(self.slots_free_at_ns.map_or(at_ns, |t| t.min(at_ns)));
    }

    /// Whether a resync is owed and due at `now_ns`: the last one could
    /// not read the kernel's table ([`Self::resync_from_kernel`]), or
    /// another decision asked for one (`resync_due`: a rerouted
    /// connection, a sweep), or connections refused a `ROUTE_MARKS` slot
    /// may get one now ([`Self::owe_resync_at`], at most every
    /// [`SLOTS_RESYNC_SPACING_NS`]); after a failed dump not before its
    /// next try: 2 s after the first failure, doubling with each one in a
    /// row up to [`RESYNC_RETRY_MAX_NS`].
    #[must_use]
    pub const fn resync_retry_due(&self, now_ns: u64) -> bool {
        let for_slots = matches!(self.slots_free_at_ns, Some(at) if now_ns >= at)
            && now_ns >= self.last_resync_ns.saturating_add(SLOTS_RESYNC_SPACING_NS);
        (self.resync_due || for_slots) && now_ns >= self.resync_retry_at_ns
    }

    /// Resyncs failed in a row (0 after one succeeded).
    #[must_use]
    pub const fn resync_failed_in_row(&self) -> u32 {
        self.resync_failed_in_row
    }

    /// Starts over from a dump of the kernel's table ([`Self::resync`]).
    /// When the dump fails (a transient netlink error, memory), nothing
    /// changes but the resync stays owed: the caller tries again later
    /// while events go on being followed, rather than giving up the
    /// offload of every connection.
    pub fn resync_from_kernel(&mut self, now_ns: u64) -> io::Result<()> {
        match self.kernel.dump() {
            Ok(dump) => {
                self.resync_due = false;
                self.resync_failed_in_row = 0;
                self.resync(&dump, now_ns);
                Ok(())
            }
            Err(e) => {
                self.resync_due = true;
                self.stats.resync_failures += 1;
                let wait = (RESYNC_RETRY_FIRST_NS << self.resync_failed_in_row.min(8))
                    .min(RESYNC_RETRY_MAX_NS);
                self.resync_failed_in_row += 1;
                self.resync_retry_at_ns = now_ns + wait;
                Err(e)
            }
        }
    }

    /// Connections XDP carries now.
    #[must_use]
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// TCP connections waiting to be offloaded ([`TCP_SETTLE_NS`]).
    #[must_use]
    pub fn settling(&self) -> usize {
        self.settling.len().saturating_sub(self.witness_tries.len())
    }

    /// Connections waiting for the egress witness's evidence: looked at
    /// again a second apart, or refused for want of a forwarded reply and
    /// looked at each tick ([`Self::awaiting_reply`]).
    #[must_use]
    pub fn waiting_for_witness(&self) -> usize {
        self.witness_tries.len() + self.awaiting_reply.len()
    }

    /// Whether [`Self::settle`] has anything to look at later: a TCP
    /// connection settling or one waiting for the witness.
    #[must_use]
    pub fn settle_due(&self) -> bool {
        !self.settling.is_empty()
    }

    fn refused(&mut self, why: &str) {
        // No allocation for a reason counted before (most events).
        if let Some(n) = self.stats.not_offloaded.get_mut(why) {
            *n += 1;
        } else {
            self.stats.not_offloaded.insert(why.to_owned(), 1);
        }
    }

    /// A NEW or UPDATE event, or a dump row.
    pub fn conn(&mut self, c: &Conn, now_ns: u64) {
        // A zone's connection is never offloaded, and what this offloader
        // keeps per tuple (no zone in it) may be another zone's connection
        // with the same tuple: not touched.
        if c.zone != 0 {
            return self.refused("zone");
        }
        // Decided anew from what this says.
        self.awaiting_reply.remove(&c.orig);
        match eligibility(c) {
            Verdict::Offload => match self.flows.get(&c.orig) {
                None => self.offload_when_settled(c, now_ns),
                // Established again after the data path handed it back: a
                // new connection on the same ports, whose predecessor's
                // closing update this daemon did not see.
                Some(f) if f.keys.handed_back(&self.table) => {
                    self.end(&c.orig);
                    self.stats.ended_tcp_control += 1;
                    self.offload_when_settled(c, now_ns);
                }
                // The kernel's entry for these ports now translates
                // otherwise: re-created (another mapping) while the events
                // that said so were lost (a resync after `ENOBUFS`, a
                // conntrackd commit at a takeover). The XDP entries must
                // not keep the old translation. Nor carry another
                // connection on the same tuple (another conntrack id: the
                // old one ended without a DESTROY), which must meet the
                // checks of its own (the reply check among them).
                Some(f) if f.reply != c.reply || f.replaced_by(c) => {
                    self.end(&c.orig);
                    self.stats.ended_remapped += 1;
                    self.offload_when_settled(c, now_ns);
                }
                // A new ct mark (`conntrack -U --mark`, a ruleset reload
                // that marks again): what the offload was decided on (the
                // kept mark, IPsec, the route and its mark) is looked at
                // again, with the kernel carrying it meanwhile.
                Some(f) if f.mark != c.mark => {
                    if let Some(w) = f.keys.scales_to_keep(&self.table, now_ns) {
                        self.remarked_windows.insert(c.orig, w);
                    }
                    self.end(&c.orig);
                    self.stats.ended_remarked += 1;
                    self.offload_when_settled(c, now_ns);
                }
                Some(_) => {}
            },
            // A new connection on an offloaded one's tuple, not replied
            // yet: the old one ended unsaid (no DESTROY: made while
            // nothing listened), and its entries must not carry this one.
            Verdict::Wait(_) => {
                if self.flows.get(&c.orig).is_some_and(|f| f.replaced_by(c)) {
                    self.end(&c.orig);
                    self.stats.ended_remapped += 1;
                }
            }
            Verdict::Refuse(why) => {
                self.remarked_windows.remove(&c.orig);
                let waiting = self.witness_tries.remove(&c.orig).is_some();
                if self.end(&c.orig) {
                    self.stats.ended_closing += 1;
                } else if self.settling.remove(&c.orig).is_some() {
                    self.refused(closed_while(waiting));
                } else {
                    self.refused(why);
                }
            }
        }
    }

    /// A DESTROY event.
    pub fn destroy(&mut self, c: &Conn) {
        // Another zone's connection: see `conn`.
        if c.zone != 0 {
            return;
        }
        self.remarked_windows.remove(&c.orig);
        let waiting = self.witness_tries.remove(&c.orig).is_some();
        // What the witness holds of its replies is no evidence for a later
        // connection on the same tuple ([`Self::reply_forwarded`]).
        if c.orig.proto != IPPROTO_TCP {
            self.kernel.forget_egress(&leaving_as(&c.orig));
            self.awaiting_reply.remove(&c.orig);
        }
        if self.end(&c.orig) {
            self.stats.ended_destroyed += 1;
        } else if self.settling.remove(&c.orig).is_some() {
            self.refused(closed_while(waiting));
        }
    }

    /// Offloads `c` now, or for TCP beyond [`IMMEDIATE_TCP`] once it has
    /// stayed ESTABLISHED for [`TCP_SETTLE_NS`] ([`Offloader::settle`]): a
    /// closing update or a DESTROY before then leaves it to the kernel at
    /// no cost. UDP and ICMP are not delayed: their offload costs no
    /// request for a state, and they have no close to hand back.
    fn offload_when_settled(&mut self, c: &Conn, now_ns: u64) {
        // A repeated update does not postpone it, but what it says (a new
        // mark, a new translation) is what the offload goes by.
        if let Some(p) = self.settling.get_mut(&c.orig) {
            p.conn = c.clone();
            return;
        }
        if c.orig.proto != IPPROTO_TCP || self.immediate_tcp.take(now_ns) {
            return self.offload(c, now_ns);
        }
        let due_ns = now_ns + TCP_SETTLE_NS;
        self.settling.insert(
            c.orig,
            Settling {
                conn: c.clone(),
                due_ns,
            },
        );
        self.settle_order.push_back((c.orig, due_ns));
    }

    /// Offloads the TCP connections that stayed ESTABLISHED (no closing
    /// update, no DESTROY) for [`TCP_SETTLE_NS`] up to `now_ns`. The
    /// offload still reads the kernel's state first (`tcp_closed_meanwhile`).
    ///
    /// Connections waiting for the egress witness ([`WITNESS_WAIT_NS`])
    /// are looked at again from a queue of their own: each queue is in due
    /// order, a TCP settle never waits behind a witness wait.
    pub fn settle(&mut self, now_ns: u64) {
        for witness in [false, true] {
            loop {
                let queue = if witness {
                    &mut self.witness_order
                } else {
                    &mut self.settle_order
                };
                let Some(&(orig, due_ns)) = queue.front() else {
                    break;
                };
                if due_ns > now_ns {
                    break;
                }
                queue.pop_front();
                // A stale entry: the tuple ended and came back later.
                if self.settling.get(&orig).is_some_and(|p| p.due_ns == due_ns)
                    && let Some(p) = self.settling.remove(&orig)
                {
                    if !self.witness_tries.contains_key(&orig) {
                        self.stats.settled += 1;
                    }
                    self.offload(&p.conn, now_ns);
                }
            }
        }
    }

    /// Whether `c`'s original direction comes from the LAN (`true`) or
    /// the WAN, as the fast path would carry it, and the routing mark its
    /// FIB lookups must carry (0: none; `carried` first, the mark an
    /// offloaded connection's entries carry); or why it would not carry
    /// it; and the mark its packets are routed with (`packet_mark`, see
    /// [`Self::route_by_rules`]).
    fn direction(
        &mut self,
        c: &Conn,
        carried: u32,
        packet_mark: PacketMark,
    ) -> Result<(bool, u32, u32), &'static str> {
        let rules = self.kernel.routing_rules().0[usize::from(c.orig.src.is_ipv6())];
        // The original direction arrives where the kernel routes its
        // source; it leaves where it routes the real destination (the
        // reply's source, after DNAT). With policy rules, where the
        // destination's own route goes does not decide: the connection's
        // route, asked below, does.
        let from = self.kernel.route(c.orig.src);
        let to = self.kernel.route(c.reply.src);
        let attached = |i: Option<u32>| i == Some(self.lan) || i == Some(self.wan);
        let orig_from_lan = match (from, to) {
            (Some(f), Some(t)) if f == self.lan && t == self.wan => true,
            (Some(f), Some(t)) if f == self.wan && t == self.lan => false,
            // A LAN connection whose destination the main table routes
            // elsewhere (a VPN by default) that the kernel sent out of the
            // WAN all the same (by its mark: a VPN bypass): masqueraded to
            // a WAN address, which the kernel chose by the interface its
            // first packet left on. The rules below must route it so.
            (Some(f), t)
                if rules
                    && f == self.lan
                    && !attached(t)
                    && self.kernel.address_of(c.reply.dst, self.wan) =>
            {
                true
            }
            _ => return Err("not_lan_wan"),
        };
        // Both data paths key echo flows by side (requests from the LAN,
        // replies from the WAN): a ping from the WAN to a LAN host (a
        // port-forwarded host's, an IPv6 host's the firewall lets be
        // pinged) would be written and never carried, and shown as
        // offloaded.
        if !orig_from_lan && matches!(c.orig.proto, IPPROTO_ICMP | IPPROTO_ICMPV6) {
            return Err("inbound_echo");
        }
        // IPsec: what the kernel encrypts, holds for want of a security
        // association, or accepts only decrypted, the fast path would send
        // or let in as it is.
        if crate::xfrm::covers(self.kernel.ipsec_policies().0, &c.orig, &c.reply, c.mark) {
            return Err("ipsec_policy");
        }
        // Without rules that select a table, no mark changes a route: the
        // one the entries carry stays as good as none.
        let (route_mark, packet_mark) = if rules {
            self.route_by_rules(c, orig_from_lan, carried, packet_mark)?
        } else {
            let known = match packet_mark {
                PacketMark::Known(mark) => mark,
                PacketMark::Witnessed { .. } => c.mark & self.route_mark_mask,
            };
            (carried, known)
        };
        Ok((orig_from_lan, route_mark, packet_mark))
    }

    /// With policy rules (multi-WAN, VPN split routing: by source, mark,
    /// incoming interface, ports) the destination alone does not say where
    /// the kernel sends a packet: each direction's own route, as the
    /// kernel routes it (its source, the interface it arrives on, the
    /// connection's mark, which such setups copy into the packets, its
    /// ports), must be the attached interface the fast path sends it to,
    /// and the data path's own lookup must agree, to the same next hop:
    /// without a mark, or (IPv4, a kernel whose `bpf_fib_lookup` takes
    /// one) with the connection's mark in both directions, which is then
    /// the mark returned (`carried` tried first), with the mark the
    /// packets are routed with. Else the flow stays in the kernel.
    ///
    /// The daemon sees the ct mark, not the packets' marks: a mark a rule
    /// sets on each packet, or restores from the ct mark with another mask
    /// than `--route-mark-mask` or after routing, changes the kernel's
    /// route unseen. So with [`PacketMark::Witnessed`] and the egress
    /// witness attached, the mark the kernel's packets of the original
    /// direction left with is the one asked about, and each direction's
    /// packets sent since the first look must have left by the interface
    /// and to the next hop (its MAC) that the fast path's lookup gives
    /// (`route_unseen`, `route_differs`: looked at again a few times, then
    /// left to the kernel).
    fn route_by_rules(
        &mut self,
        c: &Conn,
        orig_from_lan: bool,
        carried: u32,
        packet_mark: PacketMark,
    ) -> Result<(u32, u32), &'static str> {
        let (inside, outside) = if orig_from_lan {
            (self.lan, self.wan)
        } else {
            (self.wan, self.lan)
        };
        let ported = matches!(c.orig.proto, IPPROTO_TCP | IPPROTO_UDP);
        let witnessed = match packet_mark {
            PacketMark::Witnessed { first } => {
                let keys = [leaving_as(&c.reply), leaving_as(&c.orig)];
                if first && self.kernel.has_witness() {
                    // A record from before could show a route the kernel no
                    // longer takes (it sent the later packets into a
                    // tunnel, which the witness does not see).
                    for key in &keys {
                        self.kernel.forget_egress(key);
                    }
                    return Err(ROUTE_UNSEEN);
                }
                keys.map(|key| self.kernel.egress_seen(&key))
            }
            PacketMark::Known(_) => [Witnessed::NoWitness; 2],
        };
        // The mark the packets are routed with: the one the kernel's
        // packets left with where the witness saw them, else the ct mark
        // as the firewall copies it into them (`--route-mark-mask`).
        let packet_mark = match (packet_mark, witnessed[0]) {
            (PacketMark::Known(mark), _) => mark,
            (PacketMark::Witnessed { .. }, Witnessed::Seen(seen)) => seen.mark,
            (PacketMark::Witnessed { .. }, _) => c.mark & self.route_mark_mask,
        };
        // Each direction after its destination NAT, before its source NAT:
        // the original one to the real destination (the reply's source),
        // the reply one to the original source.
        let directions = [
            (
                c.orig.src,
                c.reply.src,
                inside,
                outside,
                (c.orig.sport, c.reply.sport),
            ),
            (
                c.reply.src,
                c.orig.src,
                outside,
                inside,
                (c.reply.sport, c.orig.sport),
            ),
        ];
        let mut kernel_routes = [None; 2];
        for (route, (src, dst, iif, oif, ports)) in kernel_routes.iter_mut().zip(directions) {
            *route = self.kernel.forward_route(&RouteQuery {
                src,
                dst,
                iif,
                mark: packet_mark,
                proto: c.orig.proto,
                ports: ported.then_some(ports),
            });
            if route.map(|r| r.oif) != Some(oif) {
                return Err("policy_route");
            }
        }
        // What the data path's FIB lookup answers: no ports, the mark
        // tried (0 first: most marks are not for routing).
        let by_mark = packet_mark != 0 && c.orig.src.is_ipv4() && self.route_marks.usable;
        let mut marks = vec![0];
        if by_mark {
            marks.insert(usize::from(carried != packet_mark), packet_mark);
        }
        for mark in marks {
            let agrees =
                directions
                    .iter()
                    .zip(kernel_routes)
                    .all(|(&(src, dst, iif, _, _), kernel)| {
                        self.kernel.forward_route(&RouteQuery {
                            src,
                            dst,
                            iif,
                            mark,
                            proto: c.orig.proto,
                            ports: None,
                        }) == kernel
                    });
            if agrees {
                let dsts = directions.map(|(_, dst, _, _, _)| dst);
                self.witnessed_as_routed(dsts, kernel_routes, witnessed)?;
                return Ok((mark, packet_mark));
            }
        }
        Err("policy_route")
    }

    /// Whether the kernel's packets of each direction (original, reply) to
    /// `dsts`, where the egress witness saw them, left by `routes` (the
    /// ones the fast path's lookup agrees with): by its interface, to its
    /// next hop's MAC as the kernel has it now. Both must have been seen
    /// (since the first look): the direction that leaves by the WAN is the
    /// reply for a connection from the WAN (a port forward).
    fn witnessed_as_routed(
        &mut self,
        dsts: [IpAddr; 2],
        routes: [Option<RouteAnswer>; 2],
        witnessed: [Witnessed; 2],
    ) -> Result<(), &'static str> {
        for ((dst, route), seen) in dsts.into_iter().zip(routes).zip(witnessed) {
            let Some(route) = route else {
                return Err("policy_route");
            };
            match seen {
                Witnessed::Unseen => return Err(ROUTE_UNSEEN),
                Witnessed::NoWitness => {}
                Witnessed::Seen(seen) => {
                    let hop = route.gateway.unwrap_or(dst);
                    // A neighbour resolved, or changed, since the table was
                    // read: read again before calling it another next hop.
                    let hop_mac = |k: &mut K, fresh| k.neighbour_mac(route.oif, hop, fresh);
                    if seen.ifindex != route.oif
                        || (hop_mac(&mut self.kernel, false) != Some(seen.dst_mac)
                            && hop_mac(&mut self.kernel, true) != Some(seen.dst_mac))
                    {
                        return Err(ROUTE_DIFFERS);
                    }
                }
            }
        }
        Ok(())
    }

    /// The `ROUTE_MARKS` slot of `mark` (0 for none); `None`, counted,
    /// when it has none and cannot get one.
    fn route_slot(&mut self, mark: u32, now_ns: u64) -> Option<u16> {
        if mark == 0 {
            return Some(0);
        }
        let slot = self.route_marks.slot(&mut self.table, mark, now_ns);
        if matches!(slot, Ok(None)) && self.route_marks.may_take_back() {
            // Every slot given out: those no carrying entry holds any
            // longer come back, a lease's length from now.
            let held = self.held_route_slots();
            let freed = self.route_marks.take_back(&mut self.table, &held, now_ns);
            if freed > 0 {
                self.route_marks_full_said = false;
                tracing::info!(
                    "offload: {freed} ROUTE_MARKS slots of marks no offloaded connection has \
                     any longer taken back; new marks get them in {} s",
                    SLOT_COOLING_NS / 1_000_000_000
                );
            }
        }
        match slot {
            Ok(Some(slot)) => Some(slot),
            Ok(None) => {
                if !self.route_marks_full_said {
                    self.route_marks_full_said = true;
                    tracing::warn!(
                        "offload: no ROUTE_MARKS slot is free (all {} given out, or taken \
                         back and unused for {} s): a connection with another route mark \
                         ({mark:#x}) stays in the kernel (counted route_marks_full) until one \
                         is",
                        MAX_ROUTE_MARKS - 1,
                        SLOT_COOLING_NS / 1_000_000_000
                    );
                }
                self.refused("route_marks_full");
                if !self.route_marks.swept {
                    self.route_marks.refused = Some(Refused::BeforeSweep);
                } else if let Some(free_at) = self.route_marks.next_free_at() {
                    // A lasting connection may send no event again: a
                    // resync once a slot is free decides on it anew.
                    self.owe_resync_at(free_at);
                } else {
                    self.route_marks.refused = Some(Refused::AllHeld);
                }
                None
            }
            Err(e) => {
                self.stats.errors += 1;
                tracing::warn!("offload: writing route mark {mark:#x}: {e}");
                None
            }
        }
    }

    /// Entries that held a `ROUTE_MARKS` slot were removed: a slot may
    /// have come free, for a connection refused one while every slot was
    /// held too (a resync looks at it again: a lasting one may send no
    /// event).
    fn marked_entries_removed(&mut self) {
        self.route_marks.marked_ended += 1;
        if self.route_marks.refused == Some(Refused::AllHeld) {
            self.route_marks.refused = None;
            self.owe_resync_at(0);
        }
    }

    /// The `ROUTE_MARKS` slots the entries of the connections carried and
    /// of the pairs an earlier daemon left (not yet decided on) hold.
    fn held_route_slots(&self) -> std::collections::HashSet<u16> {
        let carried = self
            .flows
            .values()
            .filter_map(|f| self.route_marks.slots.get(&f.route_mark).copied());
        // Only IPv4 entries route by a mark.
        let inherited = self.inherited.values().flat_map(|keys| match keys {
            Keys::V4(k) => k
                .iter()
                .filter_map(|k| self.table.get(k).map(|e| e.route_mark))
                .collect(),
            Keys::V6(_) => Vec::new(),
        });
        carried.chain(inherited).filter(|&s| s != 0).collect()
    }

    /// Whether the fast path may carry `c` by the owner's choice and the
    /// kernel's routing: its original direction's side, its routing mark,
    /// the mark its packets are routed with and the routing mark's slot;
    /// `None`, counted, when not (or not yet: waiting for the egress
    /// witness's evidence).
    fn carried_as(&mut self, c: &Conn, now_ns: u64) -> Option<(bool, u32, Option<u32>, u16)> {
        // Looked at now: no longer waiting for the witness (back in the
        // waits if it has to wait again).
        let tries = self.witness_tries.remove(&c.orig);
        // The owner's: its packets meet the firewall's rules on
        // established packets in the kernel.
        if self
            .keep_in_kernel_mark
            .is_some_and(|(value, mask)| c.mark & mask == value)
        {
            self.refused("kept_by_mark");
            return None;
        }
        // A pair the fast path already carries it with (an earlier daemon's:
        // a restart, a resync): the kernel sends none of its packets for the
        // witness to see; decided by the rules with the mark it carries
        // (its packets' own mark stays unknown: the next change of the
        // rules decides on it anew, with the witness).
        let carried = self.carried_mark(c);
        let packet_mark = carried.map_or(
            PacketMark::Witnessed {
                first: tries.is_none(),
            },
            PacketMark::Known,
        );
        let (orig_from_lan, route_mark, packet_mark) = match self.direction(c, 0, packet_mark) {
            Ok(d) => d,
            Err(ROUTE_UNSEEN | ROUTE_DIFFERS)
                if self.wait_for_witness(c, now_ns, tries.unwrap_or(0)) =>
            {
                return None;
            }
            Err(why) => {
                self.refused(why);
                return None;
            }
        };
        if carried.is_none() && !self.reply_forwarded(c, orig_from_lan) {
            if !self.wait_for_witness(c, now_ns, tries.unwrap_or(0)) {
                self.refused(REPLY_NOT_FORWARDED);
                self.await_reply(c, now_ns);
            }
            return None;
        }
        let route_slot = self.route_slot(route_mark, now_ns)?;
        let packet_mark = carried.is_none().then_some(packet_mark);
        Some((orig_from_lan, route_mark, packet_mark, route_slot))
    }

    /// Whether the firewall lets `c`'s replies through, as far as the
    /// kernel showed it. Conntrack calls a reply seen when it arrives,
    /// before the forward rules judge it: a UDP or ICMP connection whose
    /// replies a rule drops (a blocklist of WAN sources ahead of the
    /// `established` accept, a fail2ban or `CrowdSec` chain) is replied
    /// and assured all the same, and offloaded it would have them carried
    /// past the rule. So one of its replies must have been seen leaving
    /// the inside interface (the LAN, or the WAN for a connection from
    /// it) by the egress witness, after the kernel's forward rules and
    /// NAT: since the last connection on the same tuple ended (its
    /// DESTROY forgot the record, [`Offloader::destroy`]). Forgotten when
    /// the event is read, which may be after this connection's first
    /// reply on a fast link: then it is looked at again a second later,
    /// when the kernel forwarded its next one. TCP
    /// needs no more than ESTABLISHED: its originator acknowledged the
    /// reply it got. Without the witness (a kernel without tcx) conntrack's
    /// word stands.
    fn reply_forwarded(&mut self, c: &Conn, orig_from_lan: bool) -> bool {
        if c.orig.proto == IPPROTO_TCP {
            return true;
        }
        let inside = if orig_from_lan { self.lan } else { self.wan };
        match self.kernel.egress_seen(&leaving_as(&c.orig)) {
            Witnessed::NoWitness => true,
            Witnessed::Unseen => false,
            Witnessed::Seen(seen) => seen.ifindex == inside,
        }
    }

    /// Keeps `c` in [`Self::awaiting_reply`] from `now_ns` (one waiting
    /// already keeps its place and time), the oldest out beyond its
    /// capacity.
    fn await_reply(&mut self, c: &Conn, now_ns: u64) {
        if self.awaiting_reply.contains_key(&c.orig) {
            return;
        }
        self.awaiting_reply.insert(c.orig, now_ns);
        self.awaiting_order.push_back((c.orig, now_ns));
        while self.awaiting_reply.len() > MAX_AWAITING_REPLY {
            let Some((oldest, since)) = self.awaiting_order.pop_front() else {
                break;
            };
            if self.awaiting_reply.get(&oldest) == Some(&since) {
                self.awaiting_reply.remove(&oldest);
            }
        }
        // Places of tuples taken out since (no search at each removal):
        // dropped once they are as many as the kept ones.
        if self.awaiting_order.len() > 2 * MAX_AWAITING_REPLY {
            let kept = &self.awaiting_reply;
            self.awaiting_order
                .retain(|(t, since)| kept.get(t) == Some(since));
        }
    }

    /// Looks again at the connections in [`Self::awaiting_reply`]: those
    /// waiting longer than [`AWAIT_REPLY_NS`] are left to the kernel (the
    /// order drops the places it no longer holds on the way); those one of
    /// whose replies the egress witness has seen since are read from the
    /// kernel again and decided anew as at an event.
    fn recheck_awaiting_reply(&mut self, now_ns: u64) {
        while let Some(&(orig, since)) = self.awaiting_order.front() {
            let current = self.awaiting_reply.get(&orig) == Some(&since);
            if current && now_ns.saturating_sub(since) < AWAIT_REPLY_NS {
                break;
            }
            self.awaiting_order.pop_front();
            if current {
                self.awaiting_reply.remove(&orig);
            }
        }
        let ready: Vec<Tuple> = self
            .awaiting_reply
            .keys()
            .copied()
            // Only a reply seen: "no witness" (detached, the witness gone)
            // does not lift what a witness said.
            .filter(|orig| {
                matches!(
                    self.kernel.egress_seen(&leaving_as(orig)),
                    Witnessed::Seen(_)
                )
            })
            .collect();
        for orig in ready {
            self.awaiting_reply.remove(&orig);
            match self.kernel.conn_now(&orig) {
                Ok(Some(c)) => self.conn(&c, now_ns),
                Ok(None) => {}
                Err(e) => {
                    self.stats.errors += 1;
                    tracing::warn!("offload: reading the kernel entry {orig:?}: {e}");
                }
            }
        }
    }

    /// The routing mark of the pair of XDP entries the fast path carries
    /// `c` with now (active, not handed back), if there is one.
    fn carried_mark(&self, c: &Conn) -> Option<u32> {
        if c.orig.src.is_ipv4() {
            let e = self.table.get(&flow_key(&c.orig))?;
            if e.flags & FLAG_OFFLOADED == 0 || !carries(e.lease) {
                return None;
            }
            self.route_marks.mark_in(e.route_mark)
        } else {
            let e = self.table.get6(&flow_key6(&c.orig))?;
            (e.flags & FLAG_OFFLOADED != 0 && carries(e.lease))
                .then_some(c.mark & self.route_mark_mask)
        }
    }

    /// Has `c`, looked at again `tries` times so far, looked at again in
    /// [`WITNESS_WAIT_NS`] (with the connections settling), unless that
    /// was [`WITNESS_TRIES`] times already: the witness may have been
    /// attached after its packets, or hold a route from before new rules,
    /// which the next packet the kernel sends replaces.
    fn wait_for_witness(&mut self, c: &Conn, now_ns: u64, tries: u8) -> bool {
        if tries >= WITNESS_TRIES {
            return false;
        }
        self.witness_tries.insert(c.orig, tries + 1);
        let due_ns = now_ns + WITNESS_WAIT_NS;
        self.settling.insert(
            c.orig,
            Settling {
                conn: c.clone(),
                due_ns,
            },
        );
        self.witness_order.push_back((c.orig, due_ns));
        true
    }

    /// What the XDP entries of `c` are written from: a TCP connection as
    /// the kernel has it now, if still ESTABLISHED, with the window scales
    /// of this read (an event that did not change the state, a new status
    /// bit, carries none); another protocol's as it is; `None` (refused or
    /// failed, counted) otherwise.
    fn still_established(&mut self, c: &Conn) -> Option<Conn> {
        if c.orig.proto != IPPROTO_TCP {
            return Some(c.clone());
        }
        match self.kernel.tcp_now(&c.orig) {
            Ok(Some(now)) if now.state == tcp_state::ESTABLISHED => Some(Conn {
                tcp_wscale: now.scales,
                tcp_liberal: false,
                ..c.clone()
            }),
            Ok(_) => {
                self.refused("tcp_closed_meanwhile");
                None
            }
            Err(e) => {
                self.stats.errors += 1;
                tracing::warn!("offload: reading the kernel entry {:?}: {e}", c.orig);
                None
            }
        }
    }

    /// Writes both XDP entries of `c` pending, window tracking kept from
    /// the entries they replace or from `remarked` ([`kept_tracking`]).
    fn write_pending(
        &mut self,
        c: &Conn,
        orig_from_lan: bool,
        route_slot: u16,
        remarked: Option<[TcpWindow; 2]>,
        now_ns: u64,
    ) -> io::Result<Keys> {
        if c.orig.src.is_ipv4() {
            let mut pair = entries(c, orig_from_lan, now_ns, LEASE_PENDING, route_slot);
            for (i, (k, e)) in pair.iter_mut().enumerate() {
                let old = self.table.get(k).map(|o| (o.flags, o.lease, o.tcp));
                let old = old.and_then(|o| tracking_to_keep(o, now_ns));
                e.tcp = kept_tracking(e.tcp, old.or(remarked.map(|w| w[i])));
            }
            write_pair(&mut self.table, &pair, T::insert, T::remove)
                .map(|()| Keys::V4([pair[0].0, pair[1].0]))
        } else {
            let mut pair = entries6(c, orig_from_lan, now_ns, LEASE_PENDING);
            for (i, (k, e)) in pair.iter_mut().enumerate() {
                let old = self.table.get6(k).map(|o| (o.flags, o.lease, o.tcp));
                let old = old.and_then(|o| tracking_to_keep(o, now_ns));
                e.tcp = kept_tracking(e.tcp, old.or(remarked.map(|w| w[i])));
            }
            write_pair(&mut self.table, &pair, T::insert6, T::remove6)
                .map(|()| Keys::V6([pair[0].0, pair[1].0]))
        }
    }

    fn offload(&mut self, c: &Conn, now_ns: u64) {
        let Some((orig_from_lan, route_mark, packet_mark, route_slot)) = self.carried_as(c, now_ns)
        else {
            return;
        };
        let stream = c.has(status::ASSURED);
        let timeout = self.timeouts.of(c.orig.proto, stream);
        let Some(lease) = lease_secs(timeout) else {
            return self.refused("kernel_timeout_too_short");
        };
        // A short connection may have closed while its ESTABLISHED update
        // waited in the event queue: offloading it then would carry its
        // final ACKs past the kernel (which would keep it in LAST_ACK) and
        // give its closed entry the ESTABLISHED timeout (5 days by
        // default). So the kernel's current state decides; the closing
        // update that follows in the queue finds nothing to end.
        let Some(written_from) = self.still_established(c) else {
            return;
        };
        // Kernel first: once the XDP entries exist, the kernel stops seeing
        // the flow's packets, so its window tracking must already be off.
        match refresh_while_established(
            &mut self.kernel,
            &self.timeouts,
            &mut self.stats,
            (&c.orig, None),
            timeout,
        ) {
            Ok(true) => {}
            Ok(false) => return self.refused("tcp_closed_meanwhile"),
            Err(e) => {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    self.stats.errors += 1;
                    tracing::warn!("offload: updating the kernel entry {:?}: {e}", c.orig);
                }
                return;
            }
        }
        // Written pending (the data path passes every packet to the kernel,
        // and a SYN, FIN or RST hands the pair back), then checked against
        // the kernel again, then activated by a compare-and-swap from
        // pending: a segment of a new connection either passed before the
        // write (the read-back sees the kernel's new entry) or hit a
        // pending entry (the activation fails). None rides an entry whose
        // activation did not see it.
        let remarked = self.remarked_windows.remove(&c.orig);
        let written =
            self.write_pending(&written_from, orig_from_lan, route_slot, remarked, now_ns);
        let keys = match written {
            Ok(keys) => keys,
            Err(e) => {
                self.stats.errors += 1;
                tracing::warn!("offload: writing the XDP entries of {:?}: {e}", c.orig);
                return;
            }
        };
        if c.orig.proto == IPPROTO_TCP && !self.still_written_connection(c) {
            keys.remove(&mut self.table);
            self.stats.undone_replaced += 1;
            return;
        }
        match keys.activate(&mut self.table, lease_until(now_ns, lease)) {
            Ok(true) => {}
            Ok(false) => {
                keys.remove(&mut self.table);
                self.stats.undone_handed_back += 1;
                tracing::debug!("offload undone: {:?} handed back while pending", c.orig);
                return;
            }
            Err(e) => {
                keys.remove(&mut self.table);
                self.stats.errors += 1;
                tracing::warn!("offload: activating the XDP entries of {:?}: {e}", c.orig);
                return;
            }
        }
        self.flows.insert(
            c.orig,
            Offloaded {
                keys,
                reply: c.reply,
                proto: c.orig.proto,
                id: c.id,
                last_seen_ns: now_ns,
                kernel_due_ns: now_ns + secs_ns(timeout),
                stream_from_ns: if stream {
                    now_ns
                } else {
                    now_ns + UDP_STREAM_AFTER_NS
                },
                assured: stream,
                mark: c.mark,
                route_mark,
                packet_mark,
            },
        );
        self.stats.offloaded += 1;
        tracing::debug!("offloaded {:?} -> {:?}", c.orig, c.reply);
    }

    /// Right after the XDP entries of TCP connection `c` were written:
    /// switches window tracking off on whatever connection the kernel has
    /// on the tuple now, then whether that is still `c`, ESTABLISHED and
    /// with the same translation. If not, the entries must go; a closed
    /// connection gets its state's timeout back
    /// ([`refresh_while_established`]).
    ///
    /// The state check before the write and the write are two steps (no
    /// compare-and-set between ctnetlink and the map): the daemon can
    /// stall between them while the connection closes through the kernel
    /// and the client opens the next one on the same ports, whose SYN and
    /// SYN-ACK pass before the entries exist. The stale entries then carry
    /// the new connection's handshake ACK and request past the kernel,
    /// whose new entry (`SYN_RECV`, window tracking on) finds the server's
    /// next segment acknowledging data it never saw: invalid, so not
    /// translated back, delivered to the router itself, which answers with
    /// a RST (seen in captures: the client's ACK and request missing on
    /// the router's WAN side, the server's reply there, the router's RST
    /// right after). Window tracking goes off first, one write after the
    /// entries: from then on a segment the entries carried can no longer
    /// make a later one invalid. A new connection the kernel has
    /// ESTABLISHED with the same translation is then one the entries may
    /// carry: it keeps them.
    fn still_written_connection(&mut self, c: &Conn) -> bool {
        let established = refresh_while_established(
            &mut self.kernel,
            &self.timeouts,
            &mut self.stats,
            (&c.orig, Some(&c.reply)),
            self.timeouts.tcp_established(),
        );
        match established {
            Ok(true) => true,
            Ok(false) => {
                tracing::debug!(
                    "offload undone: the kernel entry of {:?} changed during the write",
                    c.orig
                );
                false
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
            Err(e) => {
                self.stats.errors += 1;
                tracing::warn!("offload: reading back the kernel entry {:?}: {e}", c.orig);
                false
            }
        }
    }

    /// Removes a connection's XDP entries; whether it was offloaded.
    fn end(&mut self, orig: &Tuple) -> bool {
        let Some(f) = self.flows.remove(orig) else {
            return false;
        };
        if f.route_mark != 0 {
            // Its mark's slot may be free now.
            self.marked_entries_removed();
        }
        f.keys.remove(&mut self.table);
        self.forget_witnessed(&f.reply);
        true
    }

    /// Forgets what the egress witness saw of the original direction of
    /// the connection whose reply tuple is `reply`: while the fast path carried it, the
    /// kernel sent none of its packets, so what the witness holds is from
    /// before (the mark and route then); a decision on it after this must
    /// see the packets the kernel sends from now on (its mark changed, its
    /// route; a decision under policy rules forgets both directions at its
    /// first look anyway). Its replies' record stays: one the kernel
    /// forwarded since the connection's unreplied event, at most, is this
    /// connection's evidence that the firewall lets its replies through
    /// ([`Self::reply_forwarded`]), which a flush or an eviction of its
    /// entries does not undo (the kernel carries its next replies, and the
    /// witness sees those too).
    fn forget_witnessed(&mut self, reply: &Tuple) {
        self.kernel.forget_egress(&leaving_as(reply));
    }

    /// The offloaded connections that the kernel's `IPsec` policies or
    /// policy rules, changed since the last look, take back: as a set, and
    /// with why.
    fn no_longer_the_fast_paths(
        &mut self,
    ) -> (std::collections::HashSet<Tuple>, Vec<(Tuple, Gone)>) {
        let mut gone = Vec::new();
        // A new IPsec policy: the connections it covers go back to the
        // kernel, which applies it.
        let (policies, number) = self.kernel.ipsec_policies();
        let mut covered = std::collections::HashSet::new();
        if number != self.ipsec_seen {
            self.ipsec_seen = number;
            covered.extend(
                self.flows
                    .iter()
                    .filter(|(orig, f)| crate::xfrm::covers(policies, orig, &f.reply, f.mark))
                    .map(|(orig, _)| *orig),
            );
            gone.extend(covered.iter().map(|orig| (*orig, Gone::Ipsec)));
        }
        // Changed policy rules: the offloaded connections are routed again
        // as at their offload; those the kernel now sends elsewhere than
        // the fast path would go back to it.
        let (policy, rules) = self.kernel.routing_rules();
        if rules != self.rules_seen {
            self.rules_seen = rules;
            let again: Vec<(Conn, u32, Option<u32>)> = self
                .flows
                .iter()
                .filter(|(orig, _)| !covered.contains(*orig))
                .map(|(orig, f)| {
                    let c = Conn {
                        orig: *orig,
                        reply: f.reply,
                        mark: f.mark,
                        ..Conn::default()
                    };
                    (c, f.route_mark, f.packet_mark)
                })
                .collect();
            for (c, route_mark, packet_mark) in again {
                // Routed elsewhere, or now by another mark than the one
                // its entries carry; or taken over without knowing its
                // packets' mark: decided anew, with the witness.
                let rerouted = packet_mark.is_none_or(|packet_mark| {
                    let now = self.direction(&c, route_mark, PacketMark::Known(packet_mark));
                    now.map(|(_, mark, _)| mark) != Ok(route_mark)
                });
                if rerouted {
                    covered.insert(c.orig);
                    gone.push((c.orig, Gone::Rerouted));
                    // A lasting connection may send no event again: a
                    // resync from the kernel's table decides on it anew
                    // (carried with another mark, or left to the kernel).
                    self.resync_due = true;
                }
            }
        }
        self.hand_back_unwitnessed(policy, &mut covered, &mut gone);
        (covered, gone)
    }

    /// Connections taken over from an earlier daemon (a restart, an
    /// upgrade, one from before the witness) under policy rules: the mark
    /// the kernel routes their packets with was never seen by this
    /// daemon's witness (XDP carries all of them), and a wrong one sends
    /// them out of the WAN where the kernel would use a tunnel. With the
    /// witness there, each goes back to the kernel once (a second or so
    /// there) and a resync right after decides on it as on a new one.
    /// Without policy rules (`policy`: whether IPv4's and IPv6's have
    /// some) no mark changes a route: they stay carried.
    fn hand_back_unwitnessed(
        &mut self,
        policy: [bool; 2],
        covered: &mut std::collections::HashSet<Tuple>,
        gone: &mut Vec<(Tuple, Gone)>,
    ) {
        let unwitnessed: Vec<Tuple> = self
            .flows
            .iter()
            .filter(|(orig, f)| {
                f.packet_mark.is_none()
                    && policy[usize::from(orig.src.is_ipv6())]
                    && !covered.contains(*orig)
            })
            .map(|(orig, _)| *orig)
            .collect();
        // Attached for it where it is not yet (its first use).
        if unwitnessed.is_empty() || !self.kernel.has_witness() {
            return;
        }
        for orig in unwitnessed {
            covered.insert(orig);
            gone.push((orig, Gone::Unwitnessed));
        }
        self.resync_due = true;
    }

    /// The periodic pass: refresh the kernel timeout and extend the lease of
    /// every flow XDP forwarded since the last tick; forget flows whose XDP
    /// entries are gone or whose kernel entry is. Returns how many flows
    /// lost their XDP entries while the kernel may still have them
    /// (`conntrack flush`, an eviction): a resync would offload them
    /// again.
    pub fn tick(&mut self, now_ns: u64) -> usize {
        self.release_unclaimed();
        self.recheck_awaiting_reply(now_ns);
        let (covered, mut gone) = self.no_longer_the_fast_paths();
        for (orig, f) in &mut self.flows {
            if covered.contains(orig) {
                continue;
            }
            let Some(read) = f.keys.read(&self.table) else {
                gone.push((*orig, Gone::Evicted));
                continue;
            };
            // The kernel carries the rest of the connection.
            if read.handed_back() {
                gone.push((*orig, Gone::TcpControl));
                continue;
            }
            let seen = read.last_seen_ns;
            if seen <= f.last_seen_ns {
                // Idle. A connection made while nothing listened to the
                // kernel's events (`nf_conntrack_events` 2, the default:
                // before the daemon started, or while the router was
                // detached) ends with no DESTROY; past its kernel entry's
                // timeout, the kernel is asked whether it still has it.
                if now_ns > f.kernel_due_ns + KERNEL_GONE_MARGIN_NS {
                    match self.kernel.conn_now(orig) {
                        Ok(None) => gone.push((*orig, Gone::Kernel)),
                        // Kept by the kernel's own packets or a longer
                        // timeout: asked again once what it has left ran
                        // out.
                        Ok(Some(c)) => {
                            let stream = f.last_seen_ns >= f.stream_from_ns;
                            let left = c.timeout.unwrap_or(self.timeouts.of(f.proto, stream));
                            f.kernel_due_ns = now_ns + secs_ns(left);
                        }
                        // Asked again some ticks later, not at each.
                        Err(e) => {
                            self.stats.errors += 1;
                            f.kernel_due_ns = now_ns + KERNEL_LOOKUP_RETRY_NS;
                            tracing::warn!("offload: looking up the kernel entry {orig:?}: {e}");
                        }
                    }
                }
                continue;
            }
            let stream = seen >= f.stream_from_ns;
            let timeout = self.timeouts.of(f.proto, stream);
            // A UDP stream, which the kernel would have marked assured
            // (kept over unassured entries when its table is full, matched
            // by `ct status assured`) had it seen the packets.
            if stream && !f.assured && f.proto == IPPROTO_UDP {
                match self.kernel.assure(orig) {
                    Ok(()) => f.assured = true,
                    Err(e) => {
                        self.stats.errors += 1;
                        tracing::warn!("offload: marking {orig:?} assured: {e}");
                    }
                }
            }
            match refresh_while_established(
                &mut self.kernel,
                &self.timeouts,
                &mut self.stats,
                (orig, None),
                timeout,
            ) {
                Ok(true) => {}
                Ok(false) => {
                    gone.push((*orig, Gone::TcpControl));
                    continue;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    gone.push((*orig, Gone::Kernel));
                    continue;
                }
                Err(e) => {
                    // Keep the old lease: it runs out before the kernel
                    // entry, whatever happened.
                    self.stats.errors += 1;
                    tracing::warn!("offload: refreshing the kernel entry {orig:?}: {e}");
                    continue;
                }
            }
            f.last_seen_ns = seen;
            f.kernel_due_ns = now_ns + secs_ns(timeout);
            let lease = lease_until(now_ns, lease_secs(timeout).unwrap_or(0));
            self.stats.errors += f.keys.set_lease(&mut self.table, &read, lease);
            self.stats.refreshed += 1;
        }
        let evicted = gone
            .iter()
            .filter(|(_, why)| matches!(why, Gone::Evicted))
            .count();
        for (orig, why) in gone {
            self.end(&orig);
            *match why {
                Gone::Kernel => &mut self.stats.ended_kernel_gone,
                Gone::Evicted => &mut self.stats.handed_back,
                Gone::TcpControl => &mut self.stats.ended_tcp_control,
                Gone::Ipsec => &mut self.stats.ended_ipsec,
                Gone::Rerouted => &mut self.stats.ended_rerouted,
                Gone::Unwitnessed => &mut self.stats.ended_unwitnessed,
            } += 1;
        }
        evicted
    }

    /// Removes the offloaded entries of `v4` and `v6` (the XDP tables'
    /// entries, as read) that are pending, or of a connection that the
    /// kernel's table (`dump`, the one this session's first resync read)
    /// does not have: an earlier daemon wrote them, and the connection
    /// ended while none ran (a `conntrack -D` or `-F`: the owner ending
    /// connections that a new firewall rule refuses, which XDP would
    /// otherwise carry until their leases ran out), or left them pending
    /// (killed between writing a pair and activating it: the data path
    /// passes such a pair's packets to the kernel until it is evicted).
    /// The entries of a connection the kernel has stay, whether this
    /// session took it over already or decides on it later (a TCP
    /// connection settling, one waiting for the egress witness). Live
    /// leases are handed back before any entry is removed, as
    /// [`Keys::remove`] does. The entries the data path admitted itself
    /// (no [`FLAG_OFFLOADED`]: standalone mode before a switch) are not
    /// touched. The ended connections count as `ended_destroyed`.
    pub fn sweep_left_behind(
        &mut self,
        v4: &[(FlowKey, FlowEntry)],
        v6: &[(FlowKey6, FlowEntry6)],
        dump: &[Conn],
    ) -> Swept {
        // An IPv4 entry by its key and its peer's: one key alone may be
        // another connection's now (the same mapped port to the same
        // server after a `conntrack -D`), whose half would rebuild the
        // ended one's. An IPv6 entry's peer is its key reversed.
        let mut own4 = std::collections::HashSet::new();
        let mut own6 = std::collections::HashSet::new();
        // Another zone's connection owns nothing here (see `conn`).
        let dump: Vec<&Conn> = dump.iter().filter(|c| c.zone == 0).collect();
        for c in &dump {
            if c.orig.src.is_ipv6() {
                own6.extend([flow_key6(&c.orig), flow_key6(&c.reply)]);
            } else {
                let (o, r) = (flow_key(&c.orig), flow_key(&c.reply));
                own4.extend([(o, r), (r, o)]);
            }
        }
        let left = |lease: u32, owned: bool| lease == LEASE_PENDING || !owned;
        let left4: Vec<&(FlowKey, FlowEntry)> = v4
            .iter()
            .filter(|(k, e)| {
                e.flags & FLAG_OFFLOADED != 0 && left(e.lease, own4.contains(&(*k, e.peer)))
            })
            .collect();
        let left6: Vec<&(FlowKey6, FlowEntry6)> = v6
            .iter()
            .filter(|(k, e)| e.flags & FLAG_OFFLOADED != 0 && left(e.lease, own6.contains(k)))
            .collect();
        let mut swept = Swept::default();
        let mut connections = 0;
        for (k, e) in &left4 {
            if carries(e.lease) {
                let _ = self.table.swap_lease(k, e.lease, LEASE_HANDED_BACK);
            }
        }
        for (k, e) in &left6 {
            if carries(e.lease) {
                let _ = self.table.swap_lease6(k, e.lease, LEASE_HANDED_BACK);
            }
        }
        for (k, e) in left4 {
            self.table.remove(k);
            swept.count(e.lease, e.flags, &mut connections);
        }
        for (k, e) in left6 {
            self.table.remove6(k);
            swept.count(e.lease, e.flags, &mut connections);
        }
        self.stats.ended_destroyed += connections;
        // The pairs kept: of connections the kernel has, taken over by the
        // first resync or still to be decided on.
        let carrying4: HashMap<FlowKey, FlowKey> = v4
            .iter()
            .filter(|(_, e)| e.flags & FLAG_OFFLOADED != 0 && carries(e.lease))
            .map(|(k, e)| (*k, e.peer))
            .collect();
        let carrying6: std::collections::HashSet<FlowKey6> = v6
            .iter()
            .filter(|(_, e)| e.flags & FLAG_OFFLOADED != 0 && carries(e.lease))
            .map(|(k, _)| *k)
            .collect();
        for c in dump.iter().filter(|c| !self.flows.contains_key(&c.orig)) {
            let keys = if c.orig.src.is_ipv6() {
                let keys = [flow_key6(&c.orig), flow_key6(&c.reply)];
                keys.iter()
                    .any(|k| carrying6.contains(k))
                    .then_some(Keys::V6(keys))
            } else {
                let (o, r) = (flow_key(&c.orig), flow_key(&c.reply));
                (carrying4.get(&o) == Some(&r) || carrying4.get(&r) == Some(&o))
                    .then_some(Keys::V4([o, r]))
            };
            if let Some(keys) = keys {
                self.inherited.insert(c.orig, keys);
            }
        }
        // Every carrying entry is now a connection's this session carries
        // or an inherited pair's: the slots the others held may come back,
        // for the connections refused one meanwhile too.
        self.route_marks.swept = true;
        if self.route_marks.refused.take().is_some() {
            self.owe_resync_at(0);
        }
        swept
    }

    /// Removes the pairs an earlier daemon left carrying
    /// ([`Self::sweep_left_behind`]) whose connection this session neither
    /// took over nor still settles: refused under what changed while no
    /// daemon ran (a keep-in-kernel mark, an `IPsec` policy, a route),
    /// closed or destroyed while settling. Left, such a pair would carry
    /// its connection past the kernel until its lease ran out.
    fn release_unclaimed(&mut self) {
        if self.inherited.is_empty() {
            return;
        }
        let decided: Vec<Tuple> = self
            .inherited
            .keys()
            .filter(|orig| !self.settling.contains_key(*orig))
            .copied()
            .collect();
        if decided.is_empty() {
            return;
        }
        let owned = self.owned_keys();
        let mut removed = 0;
        for orig in decided {
            let Some(keys) = self.inherited.remove(&orig) else {
                continue;
            };
            // Taken over, its entries this session's now (a key of the
            // old pair the new one does not have goes), or not: counted
            // when one of its entries still carried.
            if keys.remove_unowned(&mut self.table, &owned) && !self.flows.contains_key(&orig) {
                removed += 1;
            }
        }
        // The slots the released pairs' entries held may be free now (also
        // those of pairs taken over with another slot).
        self.marked_entries_removed();
        if removed > 0 {
            self.stats.ended_not_taken_over += removed;
            tracing::info!(
                "removed the XDP entries of {removed} connections an earlier daemon offloaded \
                 that this one does not carry (refused under what changed while no daemon ran, \
                 closed while settling, or an offload that failed): the kernel carries them"
            );
        }
    }

    /// The keys of the connections this offloader carries.
    fn owned_keys(&self) -> OwnedKeys {
        let mut owned = OwnedKeys::default();
        for f in self.flows.values() {
            match f.keys {
                Keys::V4(k) => owned.v4.extend(k),
                Keys::V6(k) => owned.v6.extend(k),
            }
        }
        owned
    }

    /// Starts over from a dump of the kernel's table: connections the
    /// kernel no longer has leave XDP, eligible ones are offloaded.
    pub fn resync(&mut self, dump: &[Conn], now_ns: u64) {
        self.stats.resyncs += 1;
        self.slots_free_at_ns = None;
        self.last_resync_ns = now_ns;
        // Refused again below, if still so.
        if self.route_marks.refused == Some(Refused::AllHeld) {
            self.route_marks.refused = None;
        }
        // Another zone's connection keeps no tuple present (see `conn`).
        let present: std::collections::HashSet<Tuple> = dump
            .iter()
            .filter(|c| c.zone == 0)
            .map(|c| c.orig)
            .collect();
        let stale: Vec<Tuple> = self
            .flows
            .keys()
            .filter(|k| !present.contains(k))
            .copied()
            .collect();
        for orig in stale {
            if self.end(&orig) {
                self.stats.ended_destroyed += 1;
            }
        }
        // Their stale order entries are skipped by `settle`.
        self.settling.retain(|k, _| present.contains(k));
        self.witness_tries.retain(|k, _| present.contains(k));
        self.remarked_windows.retain(|k, _| present.contains(k));
        for c in dump {
            self.conn(c, now_ns);
        }
    }
}

/// Gives the kernel entry `orig` an offloaded flow's `timeout`; for TCP
/// then reads it again: whether it is still ESTABLISHED (and, when
/// `reply` is given, still translated to that reply tuple: the same
/// connection, not the next one on the ports).
///
/// ctnetlink has no compare-and-set: a short connection can close
/// entirely through the kernel (its FINs hand it back to the kernel)
/// between the daemon's last look and this write, which would leave its
/// `TIME_WAIT` entry with the ESTABLISHED timeout (5 days by default;
/// no later packet resets it). Seen after the write, the closing state
/// gets its own kernel timeout back. Each packet the kernel handles
/// after that sets its state's timeout itself. Remaining window: a
/// packet between the read and the restoring write sets the next
/// state's timeout, overwritten by the previous state's (for example
/// `LAST_ACK`'s 30 s instead of `TIME_WAIT`'s 120 s): the state is read
/// again after each restore, a few times, to keep that short-lived.
fn refresh_while_established<K: Kernel>(
    kernel: &mut K,
    timeouts: &KernelTimeouts,
    stats: &mut OffloadStats,
    (orig, reply): (&Tuple, Option<&Tuple>),
    timeout: u32,
) -> io::Result<bool> {
    /// Restores after the first: each needs another packet in between.
    const RESTORES: usize = 3;
    kernel.refresh(orig, timeout, true)?;
    if orig.proto != IPPROTO_TCP {
        return Ok(true);
    }
    let mut restored = None;
    for _ in 0..=RESTORES {
        match kernel.tcp_now(orig)? {
            None => return Err(io::Error::from_raw_os_error(libc::ENOENT)),
            Some(now) if now.state == tcp_state::ESTABLISHED && restored.is_none() => {
                return Ok(reply.is_none_or(|r| *r == now.reply));
            }
            Some(now) if restored == Some(now.state) => break,
            Some(now) => {
                kernel.refresh(orig, timeouts.tcp_state(now.state), true)?;
                restored = Some(now.state);
            }
        }
    }
    stats.closed_while_refreshed += 1;
    Ok(false)
}

/// How long past an idle flow's kernel timeout [`Offloader::tick`] waits
/// before asking the kernel whether it still has it (the kernel's
/// garbage collection runs a little late).
const KERNEL_GONE_MARGIN_NS: u64 = 2_000_000_000;

/// How long (ns) after a failed look-up of an idle flow's kernel entry
/// [`Offloader::tick`] asks again.
const KERNEL_LOOKUP_RETRY_NS: u64 = 30_000_000_000;

/// `secs` seconds in ns.
const fn secs_ns(secs: u32) -> u64 {
    secs as u64 * 1_000_000_000
}

/// What [`Offloader::sweep_left_behind`] removed, in entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Left pending ([`LEASE_PENDING`]).
    pub pending: u64,
    /// Of connections the kernel no longer has (carrying or handed back).
    pub ended: u64,
}

impl Swept {
    /// One entry removed, with its lease and flags; `connections` counts
    /// the ended connections (their original direction's entries).
    fn count(&mut self, lease: u32, flags: u8, connections: &mut u64) {
        if lease == LEASE_PENDING {
            self.pending += 1;
        } else {
            self.ended += 1;
            if flags & FLAG_ORIGINAL != 0 {
                *connections += 1;
            }
        }
    }
}

/// Writes a connection's two entries, reply direction first: a packet of
/// the original direction that hits before the pair is complete would have
/// no way back in XDP. On a failure the entries written are removed again.
fn write_pair<T, K, V>(
    table: &mut T,
    pair: &[(K, V); 2],
    insert: fn(&mut T, &K, &V) -> io::Result<()>,
    remove: fn(&mut T, &K),
) -> io::Result<()> {
    insert(table, &pair[1].0, &pair[1].1)?;
    insert(table, &pair[0].0, &pair[0].1).inspect_err(|_| remove(table, &pair[1].0))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::ctnetlink::status::{ASSURED, CONFIRMED, SEEN_REPLY};

    const LAN: u32 = 2;
    const WAN: u32 = 3;

    #[derive(Default)]
    struct MemTable(
        BTreeMap<FlowKey, FlowEntry>,
        BTreeMap<FlowKey6, FlowEntry6>,
        /// Hand back before the next compare-and-swap (once).
        bool,
        /// `ROUTE_MARKS` (slot, mark); `None`: no routing by mark.
        Option<Vec<(u16, u32)>>,
    );

    impl Table for MemTable {
        fn get(&self, k: &FlowKey) -> Option<FlowEntry> {
            self.0.get(k).copied()
        }
        fn insert(&mut self, k: &FlowKey, v: &FlowEntry) -> io::Result<()> {
            self.0.insert(*k, *v);
            Ok(())
        }
        fn remove(&mut self, k: &FlowKey) {
            self.0.remove(k);
        }
        fn swap_lease(&mut self, k: &FlowKey, expected: u32, new: u32) -> io::Result<LeaseSwap> {
            self.data_path_before_swap();
            Ok(swap(self.0.get_mut(k).map(|e| &mut e.lease), expected, new))
        }
        fn get6(&self, k: &FlowKey6) -> Option<FlowEntry6> {
            self.1.get(k).copied()
        }
        fn insert6(&mut self, k: &FlowKey6, v: &FlowEntry6) -> io::Result<()> {
            self.1.insert(*k, *v);
            Ok(())
        }
        fn remove6(&mut self, k: &FlowKey6) {
            self.1.remove(k);
        }
        fn swap_lease6(&mut self, k: &FlowKey6, expected: u32, new: u32) -> io::Result<LeaseSwap> {
            self.data_path_before_swap();
            Ok(swap(self.1.get_mut(k).map(|e| &mut e.lease), expected, new))
        }
        fn route_marks(&self) -> Option<Vec<(u16, u32)>> {
            self.3.clone()
        }
        fn set_route_mark(&mut self, slot: u16, mark: u32) -> io::Result<()> {
            let marks = self.3.as_mut().ok_or(io::ErrorKind::Unsupported)?;
            marks.retain(|&(s, _)| s != slot);
            marks.push((slot, mark));
            Ok(())
        }
    }

    /// The kernel program's compare-and-swap ([`router_common::lease_cas`]).
    fn swap(lease: Option<&mut u32>, expected: u32, new: u32) -> LeaseSwap {
        match lease {
            None => LeaseSwap::Gone,
            Some(l) if *l == expected => {
                *l = new;
                LeaseSwap::Swapped
            }
            Some(l) => LeaseSwap::Changed(*l),
        }
    }

    impl MemTable {
        /// The data path hands every pair back (a TCP SYN, FIN or RST hit
        /// each) right before the next compare-and-swap, if asked to.
        fn data_path_before_swap(&mut self) {
            if std::mem::take(&mut self.2) {
                self.0
                    .values_mut()
                    .for_each(|e| e.lease = LEASE_HANDED_BACK);
                self.1
                    .values_mut()
                    .for_each(|e| e.lease = LEASE_HANDED_BACK);
            }
        }
    }

    /// A kernel with a LAN 192.168.50.0/24 and everything else on the WAN,
    /// that knows the connections in `present`.
    #[derive(Default)]
    struct FakeKernel {
        present: Vec<Tuple>,
        /// What a dump returns.
        conns: Vec<Conn>,
        /// Dumps to fail before one succeeds.
        dump_failures: u32,
        /// TCP connections the kernel has in a closing state already.
        closing: Vec<Tuple>,
        /// TCP connections that close through the kernel while their
        /// timeout is being set (the race with the daemon's write).
        closing_at_refresh: Vec<Tuple>,
        refreshed: Vec<(Tuple, u32)>,
        /// Reply tuples (translations) of the connections.
        replies: HashMap<Tuple, Tuple>,
        /// Connections whose window tracking the daemon switched off.
        liberal: Vec<Tuple>,
        /// `(orig, n)`: a new connection on the same ports replaces the
        /// kernel's entry just before its `n`-th read (from 1): the old one
        /// closed meanwhile and the client reconnected.
        replaced_at_read: Vec<(Tuple, usize)>,
        /// Reads of each connection so far.
        reads: HashMap<Tuple, usize>,
        /// Connections replaced by a new one, which is in `SYN_RECV`.
        replaced: Vec<Tuple>,
        /// Policy rules route by more than the destination.
        policy: bool,
        /// Forwarding routes `(src, dst, iif, mark) -> oif` under them;
        /// unlisted ones go where [`Kernel::route`] sends `dst`.
        forward: HashMap<(IpAddr, IpAddr, u32, u32), u32>,
        /// Main-table routes `addr -> oif` besides [`Kernel::route`]'s
        /// fixed ones.
        main: HashMap<IpAddr, u32>,
        /// Changes with the rules.
        rules_number: u64,
        /// Forwarding routes asked.
        forward_asked: usize,
        /// `IPsec` policies and their number.
        ipsec: (Vec<crate::xfrm::Selector>, u64),
        /// Connections marked assured.
        assured: Vec<Tuple>,
        /// The egress witness's records; `None`: no witness.
        witness: Option<HashMap<EgressKey, EgressSeen>>,
        /// How the kernel sends each direction's next packets: what the
        /// witness sees at a look after one it forgot what it held.
        sends: HashMap<EgressKey, EgressSeen>,
        /// Neighbour MACs by interface and address.
        macs: HashMap<(u32, IpAddr), [u8; 6]>,
    }

    impl Kernel for FakeKernel {
        fn refresh(&mut self, orig: &Tuple, timeout: u32, liberal: bool) -> io::Result<()> {
            assert!(liberal);
            if !self.present.contains(orig) {
                return Err(io::Error::from_raw_os_error(libc::ENOENT));
            }
            self.refreshed.push((*orig, timeout));
            if !self.liberal.contains(orig) {
                self.liberal.push(*orig);
            }
            if self.closing_at_refresh.contains(orig) && !self.closing.contains(orig) {
                self.closing.push(*orig);
            }
            Ok(())
        }
        fn conn_now(&mut self, orig: &Tuple) -> io::Result<Option<Conn>> {
            if !self.present.contains(orig) {
                return Ok(None);
            }
            Ok(self.conns.iter().find(|c| c.orig == *orig).cloned())
        }
        fn tcp_now(&mut self, orig: &Tuple) -> io::Result<Option<TcpNow>> {
            let reads = self.reads.entry(*orig).or_default();
            *reads += 1;
            if self.replaced_at_read.contains(&(*orig, *reads)) {
                self.replaced.push(*orig);
                self.liberal.retain(|t| t != orig);
            }
            let state = if self.replaced.contains(orig) {
                FAKE_SYN_RECV
            } else if self.closing.contains(orig) {
                tcp_state::ESTABLISHED + 1
            } else {
                tcp_state::ESTABLISHED
            };
            let scales = self
                .conns
                .iter()
                .find(|c| c.orig == *orig && !c.tcp_liberal)
                .and_then(|c| c.tcp_wscale);
            Ok(self.present.contains(orig).then(|| TcpNow {
                state,
                reply: self.replies.get(orig).copied().unwrap_or_default(),
                scales,
            }))
        }
        fn route(&mut self, addr: IpAddr) -> Option<u32> {
            if let Some(&oif) = self.main.get(&addr) {
                return Some(oif);
            }
            match addr {
                IpAddr::V4(a) if a.octets()[..3] == [192, 168, 50] => Some(LAN),
                IpAddr::V4(a) if a.octets() == [203, 0, 113, 1] => Some(1),
                // fd00:50::/64 is the LAN prefix.
                IpAddr::V6(a) if a.segments()[..4] == [0xfd00, 0x50, 0, 0] => Some(LAN),
                _ => Some(WAN),
            }
        }
        fn routing_rules(&mut self) -> ([bool; 2], u64) {
            ([self.policy; 2], self.rules_number)
        }
        fn ipsec_policies(&mut self) -> (&[crate::xfrm::Selector], u64) {
            (&self.ipsec.0, self.ipsec.1)
        }
        fn assure(&mut self, orig: &Tuple) -> io::Result<()> {
            self.assured.push(*orig);
            Ok(())
        }
        fn address_of(&mut self, addr: IpAddr, ifindex: u32) -> bool {
            addr == IpAddr::from([203, 0, 113, 1]) && ifindex == WAN
        }
        fn forward_route(&mut self, q: &RouteQuery) -> Option<RouteAnswer> {
            self.forward_asked += 1;
            self.forward
                .get(&(q.src, q.dst, q.iif, q.mark))
                .copied()
                .or_else(|| self.route(q.dst))
                .map(|oif| RouteAnswer { oif, gateway: None })
        }
        fn egress_seen(&mut self, key: &EgressKey) -> Witnessed {
            let Some(w) = self.witness.as_mut() else {
                return Witnessed::NoWitness;
            };
            if let Some(next) = self.sends.get(key) {
                w.insert(*key, *next);
            }
            w.get(key)
                .map_or(Witnessed::Unseen, |s| Witnessed::Seen(*s))
        }
        fn has_witness(&mut self) -> bool {
            self.witness.is_some()
        }
        fn forget_egress(&mut self, key: &EgressKey) {
            if let Some(w) = self.witness.as_mut() {
                w.remove(key);
            }
        }
        fn neighbour_mac(&mut self, ifindex: u32, addr: IpAddr, _fresh: bool) -> Option<[u8; 6]> {
            self.macs.get(&(ifindex, addr)).copied()
        }
        fn dump(&mut self) -> io::Result<Vec<Conn>> {
            if self.dump_failures > 0 {
                self.dump_failures -= 1;
                return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
            }
            Ok(self.conns.clone())
        }
    }

    fn t(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16, proto: u8) -> Tuple {
        Tuple {
            src: IpAddr::V4(Ipv4Addr::from(src)),
            dst: IpAddr::V4(Ipv4Addr::from(dst)),
            proto,
            sport,
            dport,
            icmp: None,
        }
    }

    /// An IPv6 tuple, as [`t`].
    fn t6(src: &str, sport: u16, dst: &str, dport: u16, proto: u8) -> Tuple {
        Tuple {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            proto,
            sport,
            dport,
            icmp: None,
        }
    }

    /// A masqueraded UDP flow 192.168.50.2:5000 -> 198.51.100.2:53 mapped to
    /// 203.0.113.1:61000.
    fn masq_udp(status: u32) -> Conn {
        Conn {
            orig: t([192, 168, 50, 2], 5000, [198, 51, 100, 2], 53, 17),
            reply: t([198, 51, 100, 2], 53, [203, 0, 113, 1], 61000, 17),
            status,
            ..Conn::default()
        }
    }

    /// An offloader that knows the kernel connections `present`. Its
    /// immediate TCP offloads ([`IMMEDIATE_TCP`]) are not used up: a TCP
    /// connection's ESTABLISHED update offloads it at once, as outside a
    /// burst.
    fn offloader(present: &[&Conn]) -> Offloader<MemTable, FakeKernel> {
        offloader_on(present, MemTable::default(), FakeKernel::default())
    }

    /// [`offloader`] under policy rules, on a table whose `ROUTE_MARKS`
    /// has the slots `marks` written (`None`: no routing by mark).
    fn policy_offloader(
        present: &[&Conn],
        marks: Option<Vec<(u16, u32)>>,
    ) -> Offloader<MemTable, FakeKernel> {
        let table = MemTable(BTreeMap::new(), BTreeMap::new(), false, marks);
        let kernel = FakeKernel {
            policy: true,
            ..FakeKernel::default()
        };
        offloader_on(present, table, kernel)
    }

    /// An offloader over `table` and `kernel`, the kernel knowing the
    /// connections `present`.
    fn offloader_on(
        present: &[&Conn],
        table: MemTable,
        kernel: FakeKernel,
    ) -> Offloader<MemTable, FakeKernel> {
        let kernel = FakeKernel {
            present: present.iter().map(|c| c.orig).collect(),
            conns: present.iter().map(|&c| c.clone()).collect(),
            replies: present.iter().map(|c| (c.orig, c.reply)).collect(),
            ..kernel
        };
        Offloader::new(table, kernel, LAN, WAN, KernelTimeouts::default())
    }

    #[test]
    fn eligibility_follows_state_and_features() {
        let est = CONFIRMED | SEEN_REPLY | ASSURED;
        let mut tcp = masq_udp(est);
        tcp.orig.proto = 6;
        tcp.reply.proto = 6;
        tcp.tcp_state = Some(tcp_state::ESTABLISHED);
        assert_eq!(eligibility(&tcp), Verdict::Offload);
        tcp.tcp_state = Some(2);
        assert_eq!(eligibility(&tcp), Verdict::Wait("tcp_handshake"));
        tcp.tcp_state = Some(4);
        assert_eq!(eligibility(&tcp), Verdict::Refuse("tcp_closing"));
        tcp.tcp_state = None;
        assert_eq!(eligibility(&tcp), Verdict::Offload);
        tcp.status = CONFIRMED | SEEN_REPLY;
        assert_eq!(eligibility(&tcp), Verdict::Wait("tcp_no_state"));
        tcp.status = est;
        tcp.tcp_state = Some(tcp_state::ESTABLISHED);
        tcp.helper = true;
        assert_eq!(eligibility(&tcp), Verdict::Refuse("helper"));
        assert_eq!(
            eligibility(&masq_udp(CONFIRMED)),
            Verdict::Wait("unreplied")
        );
        assert_eq!(
            eligibility(&masq_udp(CONFIRMED | SEEN_REPLY)),
            Verdict::Offload
        );
        let mut seq = masq_udp(CONFIRMED | SEEN_REPLY | status::SEQ_ADJUST);
        assert_eq!(eligibility(&seq), Verdict::Refuse("seq_adjust"));
        seq.status = CONFIRMED | SEEN_REPLY;
        seq.orig.proto = 47;
        assert_eq!(eligibility(&seq), Verdict::Refuse("protocol"));
    }

    #[test]
    fn entries_carry_the_kernels_mapping_both_ways() {
        let c = masq_udp(CONFIRMED | SEEN_REPLY);
        let [(ok, o), (rk, r)] = entries(&c, true, 5, 9, 0);
        assert_eq!(ok, flow_key(&c.orig));
        assert_eq!(rk, flow_key(&c.reply));
        // LAN -> WAN: source becomes the mapped WAN endpoint.
        assert_eq!((o.new_src_addr, o.new_src_port), ([203, 0, 113, 1], 61000));
        assert_eq!((o.new_dst_addr, o.new_dst_port), ([198, 51, 100, 2], 53));
        // WAN -> LAN: destination becomes the LAN host.
        assert_eq!((r.new_src_addr, r.new_src_port), ([198, 51, 100, 2], 53));
        assert_eq!((r.new_dst_addr, r.new_dst_port), ([192, 168, 50, 2], 5000));
        assert!(o.lan_side() && !r.lan_side());
        assert_eq!((o.peer, r.peer), (rk, ok));
        for e in [o, r] {
            assert_ne!(e.flags & FLAG_OFFLOADED, 0);
            assert_eq!((e.lease, e.state), (9, FlowState::UdpReplied as u8));
        }
        // A port forward: the original direction came in on the WAN.
        let [(_, o), (_, r)] = entries(&c, false, 5, 9, 0);
        assert!(!o.lan_side() && r.lan_side());
    }

    /// A TCP connection's entries start their window tracking from the
    /// kernel's window scale, each its own direction's, to be learned
    /// (RFC 5961: RSTs towards them judged); untracked where conntrack's
    /// own check is off (liberal), and for other protocols.
    #[test]
    fn tcp_entries_learn_their_windows_from_the_kernels_scale() {
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        (c.orig.proto, c.reply.proto) = (IPPROTO_TCP, IPPROTO_TCP);
        c.tcp_wscale = Some([7, 9]);
        let learning = |wscale| TcpWindow {
            wscale,
            flags: TCP_TRACK_LEARN,
            ..TcpWindow::default()
        };
        let [(_, o), (_, r)] = entries(&c, true, 5, 9, 0);
        assert_eq!((o.tcp, r.tcp), (learning(7), learning(9)));
        let mut c6 = c.clone();
        c6.orig.src = "fd00::2".parse().unwrap();
        let [(_, o), (_, r)] = entries6(&c6, true, 5, 9);
        assert_eq!((o.tcp, r.tcp), (learning(7), learning(9)));
        let liberal = Conn {
            tcp_liberal: true,
            ..c.clone()
        };
        let [(_, o), (_, r)] = entries(&liberal, true, 5, 9, 0);
        assert_eq!((o.tcp, r.tcp), (TcpWindow::default(), TcpWindow::default()));
        let mut udp = masq_udp(CONFIRMED | SEEN_REPLY);
        udp.tcp_wscale = Some([7, 9]);
        let [(_, o), _] = entries(&udp, true, 5, 9, 0);
        assert_eq!(o.tcp, TcpWindow::default());
    }

    /// The scales come from the kernel's entry as read at the offload: the
    /// event that made the connection a candidate may carry none (an
    /// update of a status bit).
    #[test]
    fn the_window_scales_come_from_the_kernels_entry_at_the_offload() {
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        (c.orig.proto, c.reply.proto) = (IPPROTO_TCP, IPPROTO_TCP);
        c.tcp_state = Some(tcp_state::ESTABLISHED);
        let in_kernel = Conn {
            tcp_wscale: Some([7, 9]),
            ..c.clone()
        };
        let mut o = offloader(&[&in_kernel]);
        o.conn(&c, 1);
        assert_eq!(o.len(), 1, "{:?}", o.stats);
        let tcp = |t: &Tuple| o.table.0[&flow_key(t)].tcp;
        assert_eq!(
            (tcp(&c.orig).flags, tcp(&c.orig).wscale),
            (TCP_TRACK_LEARN, 7)
        );
        assert_eq!(
            (tcp(&c.reply).flags, tcp(&c.reply).wscale),
            (TCP_TRACK_LEARN, 9)
        );
        // Liberal in the kernel already: untracked, whatever the event said.
        let mut d = c.clone();
        d.orig.sport += 1;
        d.reply.dport += 1;
        d.tcp_wscale = Some([7, 9]);
        let liberal = Conn {
            tcp_liberal: true,
            ..d.clone()
        };
        let mut o = offloader(&[&liberal]);
        o.conn(&d, 1);
        assert_eq!(o.len(), 1, "{:?}", o.stats);
        assert_eq!(o.table.0[&flow_key(&d.orig)].tcp, TcpWindow::default());
    }

    /// The window tracking the original direction of
    /// [`offloaded_with_learned_windows`]'s connection learned.
    const LEARNED: TcpWindow = TcpWindow {
        ack: 5000,
        win: 500,
        wscale: 7,
        flags: TCP_TRACK_KNOWN,
    };

    /// A TCP connection (scales 7 and 9 in the kernel's entry at its
    /// offload) offloaded, whose original direction's entry then learned
    /// [`LEARNED`]; and the kernel's entry as it is after the offload
    /// (liberal: no scales).
    fn offloaded_with_learned_windows() -> (Conn, Offloader<MemTable, FakeKernel>, Conn) {
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        (c.orig.proto, c.reply.proto) = (IPPROTO_TCP, IPPROTO_TCP);
        c.tcp_state = Some(tcp_state::ESTABLISHED);
        let fresh = Conn {
            tcp_wscale: Some([7, 9]),
            ..c.clone()
        };
        let mut o = offloader(&[&fresh]);
        o.conn(&c, 1);
        assert_eq!(o.len(), 1, "{:?}", o.stats);
        o.table.0.get_mut(&flow_key(&c.orig)).unwrap().tcp = LEARNED;
        let liberal = Conn {
            tcp_liberal: true,
            ..fresh
        };
        (c, o, liberal)
    }

    /// A connection taken over (a restarted daemon, a re-opened session:
    /// conntrack is liberal by then and gives no scale) keeps the windows
    /// the data path learned, and one still learning keeps learning.
    #[test]
    fn a_taken_over_connection_keeps_its_learned_windows() {
        let (c, mut earlier, liberal) = offloaded_with_learned_windows();
        let table = std::mem::take(&mut earlier.table);
        let mut o = offloader_on(&[&liberal], table, FakeKernel::default());
        o.resync(std::slice::from_ref(&liberal), 10);
        assert_eq!(o.len(), 1, "{:?}", o.stats);
        assert_eq!(o.table.0[&flow_key(&c.orig)].tcp, LEARNED);
        let reply = o.table.0[&flow_key(&c.reply)].tcp;
        assert_eq!((reply.flags, reply.wscale), (TCP_TRACK_LEARN, 9));
        // Not what a handed-back pair learned: a new connection's.
        o.table.0.get_mut(&flow_key(&c.orig)).unwrap().lease = LEASE_HANDED_BACK;
        let old = |o: &Offloader<MemTable, FakeKernel>| {
            let e = &o.table.0[&flow_key(&c.orig)];
            (e.flags, e.lease, e.tcp)
        };
        assert_eq!(tracking_to_keep(old(&o), 10), None);
        // Nor what an entry whose lease ran out holds (left idle on a
        // router that was a VRRP backup meanwhile: its acknowledgement may
        // be far behind the connection's).
        let lease = lease_until(10, 30);
        o.table.0.get_mut(&flow_key(&c.orig)).unwrap().lease = lease;
        assert_eq!(tracking_to_keep(old(&o), 10), Some(LEARNED));
        let later = (u64::from(lease) + 1) << router_common::maps::LEASE_TICK_SHIFT;
        assert_eq!(tracking_to_keep(old(&o), later), None);
    }

    /// A new ct mark (a ruleset reload that marks again, mwan3) removes an
    /// offloaded connection's pair and offloads it again from the kernel's
    /// entry, liberal by then (no scales): its entries' window scales are
    /// carried over and the rest learned again, so a blind RST is still
    /// judged.
    #[test]
    fn a_remarked_connection_keeps_its_window_scales() {
        let (c, mut o, liberal) = offloaded_with_learned_windows();
        // The kernel's entry is liberal now (the offload set it).
        o.kernel.conns = vec![liberal];
        let remarked = Conn {
            mark: c.mark ^ 0x10,
            ..c.clone()
        };
        o.conn(&remarked, 2);
        assert_eq!((o.len(), o.stats.ended_remarked), (1, 1), "{:?}", o.stats);
        // Its scales, to learn the rest again: what it learned may be far
        // behind by the time it is offloaded again.
        for (k, wscale) in [(flow_key(&c.orig), 7), (flow_key(&c.reply), 9)] {
            assert_eq!(
                o.table.0[&k].tcp,
                TcpWindow {
                    wscale,
                    flags: TCP_TRACK_LEARN,
                    ..TcpWindow::default()
                },
                "{k:?}"
            );
        }
        assert!(o.remarked_windows.is_empty());
    }

    #[test]
    fn offload_waits_for_the_reply_and_ends_on_destroy() {
        let c = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = offloader(&[&c]);
        o.conn(&masq_udp(CONFIRMED), 1);
        assert_eq!((o.len(), o.table.0.len()), (0, 0));
        o.conn(&c, 1);
        assert_eq!((o.len(), o.table.0.len()), (1, 2));
        assert_eq!(o.kernel.refreshed, vec![(c.orig, 30)]);
        // A second update changes nothing.
        o.conn(&c, 2);
        assert_eq!((o.stats.offloaded, o.kernel.refreshed.len()), (1, 1));
        o.destroy(&c);
        assert_eq!(
            (o.len(), o.table.0.len(), o.stats.ended_destroyed),
            (0, 0, 1)
        );
    }

    #[test]
    fn flows_not_between_lan_and_wan_stay_in_the_kernel() {
        // From the router itself (routed via lo's index 1 here).
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
        c.orig.src = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 1));
        let mut o = offloader(&[&c]);
        o.conn(&c, 1);
        assert_eq!(o.len(), 0);
        assert_eq!(o.stats.not_offloaded.get("not_lan_wan"), Some(&1));
    }

    /// With policy rules, each direction's own route (source, incoming
    /// interface, the connection's mark) decides: a flow the kernel sends
    /// out of another interface (a second uplink, a VPN tunnel) stays in
    /// the kernel; without them no such lookup is made.
    #[test]
    fn with_policy_rules_a_flow_routed_elsewhere_stays_in_the_kernel() {
        const TUNNEL: u32 = 9;
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
        c.mark = 1;
        let mut o = offloader(&[&c]);
        o.conn(&c, 1);
        assert_eq!((o.len(), o.kernel.forward_asked), (1, 0), "no rules");
        o.destroy(&c);

        let mut o = offloader(&[&c]);
        o.kernel.policy = true;
        o.conn(&c, 1);
        assert_eq!((o.len(), o.kernel.forward_asked), (1, 4), "rules, same way");
        o.destroy(&c);

        // The mark selects the tunnel for the LAN host's packets.
        let mut o = offloader(&[&c]);
        o.kernel.policy = true;
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 1), TUNNEL);
        o.conn(&c, 1);
        assert_eq!(o.len(), 0);
        assert_eq!(o.stats.not_offloaded.get("policy_route"), Some(&1));
        // Rules that change while it is offloaded: routed again at the
        // next tick, and ended now that the mark selects the tunnel.
        let mut o = offloader(&[&c]);
        o.kernel.policy = true;
        o.conn(&c, 1);
        o.tick(2);
        assert_eq!((o.len(), o.stats.ended_rerouted), (1, 0));
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 1), TUNNEL);
        o.tick(3);
        assert_eq!((o.len(), o.stats.ended_rerouted), (1, 0), "rules unchanged");
        o.kernel.rules_number += 1;
        o.tick(4);
        assert_eq!((o.len(), o.stats.ended_rerouted), (0, 1));
        // The replies come in elsewhere than the LAN would send them.
        let mut o = offloader(&[&c]);
        o.kernel.policy = true;
        o.kernel
            .forward
            .insert((c.reply.src, c.orig.src, WAN, 1), TUNNEL);
        o.conn(&c, 1);
        assert_eq!(o.stats.not_offloaded.get("policy_route"), Some(&1));
    }

    /// Policy rules that route a connection by its mark out of the WAN
    /// while its route without one goes elsewhere (a VPN by default, the
    /// marked connections bypassing it): carried with the mark in both
    /// entries' FIB lookups, one `ROUTE_MARKS` slot per mark, on a kernel
    /// whose `bpf_fib_lookup` takes one; else left to the kernel.
    #[test]
    fn a_connection_routed_by_its_mark_is_carried_with_it() {
        const TUNNEL: u32 = 9;
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
        c.mark = 0x100;
        let mut other_port = c.clone();
        other_port.orig.sport += 1;
        other_port.reply.dport += 1;
        let mut other_mark = other_port.clone();
        other_mark.orig.sport += 1;
        other_mark.reply.dport += 1;
        other_mark.mark = 0x200;
        let setup = |marks: Option<Vec<(u16, u32)>>| {
            let mut o = policy_offloader(&[&c, &other_port, &other_mark], marks);
            o.kernel
                .forward
                .insert((c.orig.src, c.reply.src, LAN, 0), TUNNEL);
            o
        };
        let mut o = setup(None);
        o.conn(&c, 1);
        assert_eq!(o.len(), 0);
        assert_eq!(o.stats.not_offloaded.get("policy_route"), Some(&1));

        let mut o = setup(Some(vec![]));
        for conn in [&c, &other_port, &other_mark] {
            o.conn(conn, 1);
        }
        assert_eq!(o.len(), 3, "{:?}", o.stats);
        let slot = |conn: &Conn| {
            let e = |t| o.table.0.get(&flow_key(t)).map(|e| e.route_mark);
            (e(&conn.orig), e(&conn.reply))
        };
        assert_eq!(slot(&c), (Some(1), Some(1)));
        assert_eq!(
            slot(&other_port),
            (Some(1), Some(1)),
            "the same mark's slot"
        );
        assert_eq!(slot(&other_mark), (Some(2), Some(2)));
        assert_eq!(o.table.3, Some(vec![(1, 0x100), (2, 0x200)]));
        // Rules that change: the connections whose marked route still is
        // the kernel's stay, also where the mark-less one now agrees too.
        o.kernel.forward.clear();
        o.kernel.rules_number += 1;
        o.tick(2);
        assert_eq!((o.len(), o.stats.ended_rerouted), (3, 0));
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 0x100), TUNNEL);
        o.kernel.rules_number += 1;
        o.tick(3);
        assert_eq!((o.len(), o.stats.ended_rerouted), (1, 2));

        // A daemon started again keeps the slots written; a full map
        // leaves a connection with a new mark in the kernel.
        let full: Vec<(u16, u32)> = (1..u16::try_from(MAX_ROUTE_MARKS).unwrap())
            .map(|s| (s, 0x1000 + u32::from(s)))
            .collect();
        let mut o = setup(Some(full));
        o.conn(&c, 1);
        assert_eq!(o.stats.not_offloaded.get("route_marks_full"), Some(&1));
        let mut o = setup(Some(vec![(7, 0x100)]));
        o.conn(&c, 1);
        assert_eq!(slot_of(&o, &c), Some(7));
    }

    /// `ROUTE_MARKS` slots come back once every one is given out: those
    /// no carrying entry holds (an earlier daemon's marks, marks of ended
    /// connections) are cleared at once and given to a new mark a lease's
    /// length later; not before the sweep of what an earlier daemon left
    /// (its entries may hold any; a connection refused meanwhile is looked
    /// at again by a resync after it); never one a carried connection's
    /// entries hold (a connection with another mark stays in the kernel
    /// until one ends, and a resync once its slot is free looks at it
    /// again).
    #[test]
    fn route_mark_slots_no_entry_holds_come_back_for_new_marks() {
        const TUNNEL: u32 = 9;
        let max = u16::try_from(MAX_ROUTE_MARKS).unwrap() - 1;
        let conn = |i: u16, mark: u32| {
            let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
            c.orig.sport += i;
            c.reply.dport += i;
            c.mark = mark;
            c
        };
        let marked: Vec<Conn> = (0..=max).map(|i| conn(i, 0x1000 + u32::from(i))).collect();
        let setup = |marks: Vec<(u16, u32)>| {
            let present: Vec<&Conn> = marked.iter().collect();
            let mut o = policy_offloader(&present, Some(marks));
            o.kernel
                .forward
                .insert((marked[0].orig.src, marked[0].reply.src, LAN, 0), TUNNEL);
            o
        };
        let slot_mark = |o: &Offloader<MemTable, FakeKernel>, slot: u16| {
            let marks = o.table.3.as_ref().unwrap();
            marks.iter().find(|&&(s, _)| s == slot).map(|&(_, m)| m)
        };
        let full = |o: &Offloader<MemTable, FakeKernel>| o.stats.not_offloaded["route_marks_full"];

        // An earlier daemon's marks fill the map: kept until the sweep,
        // cleared by the first look after it, given out a lease later.
        let old: Vec<(u16, u32)> = (1..=max).map(|s| (s, 0x9000 + u32::from(s))).collect();
        let mut o = setup(old);
        o.conn(&marked[0], 1);
        assert_eq!(full(&o), 1);
        assert_eq!(o.slots_free_at_ns, None);
        o.sweep_left_behind(&[], &[], &[]);
        assert_eq!(
            o.slots_free_at_ns,
            Some(0),
            "the refused one looked at again"
        );
        o.slots_free_at_ns = None;
        o.conn(&marked[0], 2);
        assert_eq!((o.len(), full(&o)), (0, 2), "cooling");
        assert_eq!(slot_mark(&o, 1), Some(0), "cleared at once");
        assert_eq!(
            o.slots_free_at_ns,
            Some(2 + SLOT_COOLING_NS),
            "a resync then"
        );
        assert!(!o.resync_retry_due(3) && o.resync_retry_due(2 + SLOT_COOLING_NS));
        // A mark a slot had takes it back at once.
        let mut had = marked[1].clone();
        had.mark = 0x9000 + 7;
        o.kernel.present.push(had.orig);
        o.kernel.conns.push(had.clone());
        o.kernel.replies.insert(had.orig, had.reply);
        o.conn(&had, 3);
        assert_eq!(slot_of(&o, &had), Some(7), "{:?}", o.stats);
        assert_eq!(slot_mark(&o, 7), Some(0x9007));
        o.conn(&marked[0], 2 + SLOT_COOLING_NS);
        assert_eq!(o.len(), 2, "{:?}", o.stats);
        let slot = slot_of(&o, &marked[0]).unwrap();
        assert_eq!(slot_mark(&o, slot), Some(0x1000));

        // Every slot held by a carried connection's entries.
        let mut o = setup(Vec::new());
        o.sweep_left_behind(&[], &[], &[]);
        for c in &marked[..usize::from(max)] {
            o.conn(c, 1);
        }
        assert_eq!(o.len(), usize::from(max), "{:?}", o.stats);
        let last = &marked[usize::from(max)];
        o.conn(last, 2);
        o.conn(last, 3);
        assert_eq!((o.len(), full(&o)), (usize::from(max), 2));
        assert_eq!(o.slots_free_at_ns, None);
        // One of them ends: a resync looks at the refused one again (at
        // most every 10 s); the slot comes back, a lease later the new
        // mark's.
        let freed = slot_of(&o, &marked[7]).unwrap();
        o.destroy(&marked[7]);
        assert_eq!(
            o.slots_free_at_ns,
            Some(0),
            "the refused one looked at again"
        );
        assert!(!o.resync_retry_due(3) && o.resync_retry_due(SLOTS_RESYNC_SPACING_NS));
        o.conn(last, 4);
        assert_eq!(slot_mark(&o, freed), Some(0));
        o.conn(last, 4 + SLOT_COOLING_NS);
        assert_eq!(o.len(), usize::from(max), "{:?}", o.stats);
        assert_eq!(slot_of(&o, last), Some(freed));
        assert_eq!(slot_mark(&o, freed), Some(0x1000 + u32::from(max)));
        // The others kept theirs.
        for (i, c) in marked[..usize::from(max)].iter().enumerate() {
            if i != 7 {
                let slot = slot_of(&o, c).unwrap();
                assert_eq!(
                    slot_mark(&o, slot),
                    Some(0x1000 + u32::try_from(i).unwrap())
                );
            }
        }
    }

    /// A map that holds one mark in two slots (read at a start) keeps both
    /// given out: the second is never handed to a new mark while an entry
    /// may hold it, only taken back when none does.
    #[test]
    fn a_mark_read_in_two_slots_keeps_both_until_taken_back() {
        let max = u16::try_from(MAX_ROUTE_MARKS).unwrap() - 1;
        let mut written: Vec<(u16, u32)> = (1..=max).map(|s| (s, 0x100 + u32::from(s))).collect();
        written[4].1 = written[2].1;
        let mut table = MemTable(BTreeMap::new(), BTreeMap::new(), false, Some(written));
        let mut marks = RouteMarks::of(&table);
        assert_eq!(
            marks.slot(&mut table, 0x7777, 1).unwrap(),
            None,
            "slot 5 is not free"
        );
        marks.swept = true;
        assert!(marks.may_take_back());
        let held = (1..=max).filter(|&s| s != 9).collect();
        assert_eq!(marks.take_back(&mut table, &held, 1), 1, "only slot 9");
        assert!(!marks.may_take_back(), "looked at until an entry goes");
        assert_eq!(
            marks.slot(&mut table, 0x7777, 1 + SLOT_COOLING_NS).unwrap(),
            Some(9)
        );
        let held = (1..=max).filter(|&s| s != 5).collect();
        marks.marked_ended += 1;
        assert_eq!(
            marks.take_back(&mut table, &held, 2),
            1,
            "the second slot of the mark"
        );
        assert_eq!(
            marks.slot(&mut table, 0x8888, 2 + SLOT_COOLING_NS).unwrap(),
            Some(5)
        );
    }

    /// The egress witness under policy routing: a connection the kernel's
    /// packets were never seen leaving by an attached interface, or seen
    /// leaving to another next hop than the fast path's lookup gives, is
    /// looked at again a few times and then left to the kernel; one whose
    /// packets carried a mark the ct mark does not show is carried with
    /// that mark.
    #[test]
    fn the_egress_witness_decides_where_the_kernel_routes_by_marks_it_does_not_see() {
        const TUNNEL: u32 = 9;
        let c = masq_udp(CONFIRMED | SEEN_REPLY);
        let elsewhere = seen_on(WAN, 0, [2, 0, 0, 0, 0, 9]);
        // Never seen leaving an attached interface (a mark on each packet
        // sends it into a tunnel): looked at again, then left to the
        // kernel. What the witness held before the first look (the route
        // of earlier packets, out of the WAN) does not count.
        let mut o = witnessed_offloader(&[&c], &[]);
        o.kernel.sends.remove(&leaving_as(&c.reply));
        o.kernel.witness = Some([(leaving_as(&c.reply), seen_on(WAN, 0, GATEWAY))].into());
        o.conn(&c, 1);
        for i in 1..=u64::from(WITNESS_TRIES) {
            assert_eq!((o.len(), o.stats.not_offloaded.len()), (0, 0), "try {i}");
            o.settle(1 + i * WITNESS_WAIT_NS);
        }
        assert_eq!(o.len(), 0);
        assert_eq!(o.stats.not_offloaded.get(ROUTE_UNSEEN), Some(&1));
        assert_eq!(o.stats.settled, 0);
        assert!(o.witness_tries.is_empty() && o.settling.is_empty());

        // Both directions must be seen: replies the kernel sends elsewhere
        // than the LAN (into a tunnel) keep it there too.
        let mut o = witnessed_offloader(&[&c], &[(&c, seen_on(WAN, 0, GATEWAY))]);
        o.kernel.sends.remove(&leaving_as(&c.orig));
        o.conn(&c, 1);
        every_look(&mut o, 1);
        assert_eq!(o.stats.not_offloaded.get(ROUTE_UNSEEN), Some(&1));

        // Seen going to another next hop: left to the kernel; unless a
        // later packet, seen by a later look, went where the fast path
        // would send it (a neighbour that changed).
        let mut o = witnessed_offloader(&[&c], &[(&c, elsewhere)]);
        o.conn(&c, 1);
        o.settle(1 + WITNESS_WAIT_NS);
        assert_eq!(o.len(), 0);
        o.kernel
            .sends
            .insert(leaving_as(&c.reply), seen_on(WAN, 0, GATEWAY));
        o.settle(1 + 2 * WITNESS_WAIT_NS);
        assert_eq!(o.len(), 1, "{:?}", o.stats);
        assert!(o.witness_tries.is_empty());
        let mut o = witnessed_offloader(&[&c], &[(&c, elsewhere)]);
        o.conn(&c, 1);
        every_look(&mut o, 1);
        assert_eq!(o.stats.not_offloaded.get(ROUTE_DIFFERS), Some(&1));

        // A mark set on each packet (no ct mark) that routes it out of the
        // WAN where the unmarked packet would go into a tunnel: carried,
        // with the mark the packets left with.
        let mut o = witnessed_offloader(&[&c], &[(&c, seen_on(WAN, 0x100, GATEWAY))]);
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 0), TUNNEL);
        o.conn(&c, 1);
        assert_eq!(o.len(), 0, "the first look waits");
        o.settle(1 + WITNESS_WAIT_NS);
        assert_eq!(o.len(), 1, "{:?}", o.stats);
        assert_eq!(slot_of(&o, &c), Some(1));
        assert_eq!(o.table.3, Some(vec![(1, 0x100)]));
        // New rules that leave its route as it was: it stays carried (its
        // packets' mark, not its ct mark, is what it is routed again
        // with); rules that route that mark elsewhere end it.
        o.kernel.rules_number += 1;
        o.tick(2 * WITNESS_WAIT_NS);
        assert_eq!((o.len(), o.stats.ended_rerouted), (1, 0));
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 0x100), TUNNEL);
        o.kernel.rules_number += 1;
        o.tick(3 * WITNESS_WAIT_NS);
        assert_eq!((o.len(), o.stats.ended_rerouted), (0, 1));

        // Without a witness the rules and the ct mark decide as before, at
        // once.
        let mut o = policy_offloader(&[&c], Some(vec![]));
        o.conn(&c, 1);
        assert_eq!(o.len(), 1);
    }

    /// `--route-mark-mask`: the connection is routed with the bits of its
    /// ct mark the firewall copies into its packets (a class in the low
    /// bits, as quality-of-service tools keep there, is not part of the route), and
    /// carried with those.
    #[test]
    fn the_route_mark_mask_selects_the_bits_packets_are_routed_with() {
        const TUNNEL: u32 = 9;
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
        c.mark = 0x101;
        let carried_with = |mask: u32| {
            let mut o = policy_offloader(&[&c], Some(vec![]));
            o.route_mark_mask = mask;
            // Unmarked packets go into a tunnel; marked ones (any mark
            // here) out of the WAN, as the main table's route says.
            o.kernel
                .forward
                .insert((c.orig.src, c.reply.src, LAN, 0), TUNNEL);
            o.conn(&c, 1);
            assert_eq!(o.len(), 1, "{:?}", o.stats);
            o.table.3.clone()
        };
        assert_eq!(carried_with(u32::MAX), Some(vec![(1, 0x101)]));
        assert_eq!(carried_with(0xff00), Some(vec![(1, 0x100)]));
    }

    /// Rules that change so that an offloaded connection now needs its
    /// mark: ended at the next tick (`ended_rerouted`), then carried again
    /// with the mark after the resync that follows, with no event of its
    /// own.
    #[test]
    fn a_connection_rerouted_by_new_rules_is_decided_again_at_a_resync() {
        const TUNNEL: u32 = 9;
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
        c.mark = 0x100;
        let mut o = policy_offloader(&[&c], Some(vec![]));
        o.conn(&c, 1);
        assert_eq!(slot_of(&o, &c), Some(0));
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 0), TUNNEL);
        o.kernel.rules_number += 1;
        o.tick(2);
        assert_eq!((o.len(), o.stats.ended_rerouted), (0, 1));
        assert!(o.resync_retry_due(2));
        o.resync_from_kernel(3).unwrap();
        assert_eq!(o.len(), 1, "{:?}", o.stats);
        assert_eq!(slot_of(&o, &c), Some(1));
        assert!(!o.resync_retry_due(4));
    }

    /// With policy rules, a LAN connection whose destination the main
    /// table sends into a tunnel is judged by its own route only when the
    /// kernel masqueraded it to a WAN address (it left by the WAN): one
    /// masqueraded to the tunnel's address stays in the kernel
    /// (`not_lan_wan`), as does one between LAN hosts.
    #[test]
    fn a_connection_the_main_table_sends_elsewhere_needs_a_wan_address() {
        const TUNNEL: u32 = 9;
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
        c.mark = 0x100;
        let mut via_tunnel = c.clone();
        via_tunnel.orig.sport += 1;
        via_tunnel.reply.dst = IpAddr::from([10, 8, 0, 1]);
        let mut lan_to_lan = masq_udp(CONFIRMED | SEEN_REPLY);
        lan_to_lan.orig.dst = IpAddr::from([192, 168, 50, 3]);
        lan_to_lan.reply.src = lan_to_lan.orig.dst;
        lan_to_lan.reply.dst = lan_to_lan.orig.src;
        let mut o = policy_offloader(&[&c, &via_tunnel, &lan_to_lan], Some(vec![]));
        o.kernel.main.insert(c.reply.src, TUNNEL);
        // Its route without the mark: the main table's, the tunnel.
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 0), TUNNEL);
        // With the mark: out of the WAN, and back to the LAN.
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 0x100), WAN);
        for conn in [&c, &via_tunnel, &lan_to_lan] {
            o.conn(conn, 1);
        }
        assert_eq!(o.len(), 1, "{:?}", o.stats);
        assert_eq!(slot_of(&o, &c), Some(1));
        assert_eq!(o.stats.not_offloaded.get("not_lan_wan"), Some(&2));
    }

    /// A ping from the WAN to a LAN host (IPv6, as a firewall following
    /// RFC 4890 lets in; IPv4, a port-forwarded host): neither data path
    /// keys an echo flow that starts on the WAN, so it stays the kernel's
    /// (`inbound_echo`) rather than shown offloaded and never carried.
    #[test]
    fn a_ping_from_the_wan_stays_in_the_kernel() {
        let ping6 = Conn {
            orig: Tuple {
                icmp: Some((ICMPV6_ECHO_REQUEST, 0)),
                ..t6("2001:db8:1::2", 7, "fd00:50::2", 7, IPPROTO_ICMPV6)
            },
            reply: Tuple {
                icmp: Some((129, 0)),
                ..t6("fd00:50::2", 7, "2001:db8:1::2", 7, IPPROTO_ICMPV6)
            },
            status: CONFIRMED | SEEN_REPLY,
            ..Conn::default()
        };
        let mut ping4 = masq_udp(CONFIRMED | SEEN_REPLY);
        ping4.orig = Tuple {
            icmp: Some((ICMP_ECHO_REQUEST, 0)),
            ..t([198, 51, 100, 2], 7, [203, 0, 113, 1], 7, IPPROTO_ICMP)
        };
        ping4.reply = Tuple {
            icmp: Some((0, 0)),
            ..t([192, 168, 50, 2], 7, [198, 51, 100, 2], 7, IPPROTO_ICMP)
        };
        let mut o = offloader(&[&ping6, &ping4]);
        o.conn(&ping6, 1);
        o.conn(&ping4, 1);
        assert_eq!(o.len(), 0, "{:?}", o.stats);
        assert_eq!(o.stats.not_offloaded.get("inbound_echo"), Some(&2));
        // A ping from the LAN is carried.
        let mut out = ping6.clone();
        (out.orig, out.reply) = (ping6.reply, ping6.orig);
        out.orig.icmp = Some((ICMPV6_ECHO_REQUEST, 0));
        out.reply.icmp = Some((129, 0));
        let mut o = offloader(&[&out]);
        o.conn(&out, 1);
        assert_eq!(o.len(), 1, "{:?}", o.stats);
    }

    /// A new ct mark on an offloaded connection ends its offload, which is
    /// then decided again: carried on without a reason to refuse it, left
    /// to the kernel under the kept mark.
    #[test]
    fn a_changed_mark_decides_the_offload_again() {
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = offloader(&[&c]);
        o.keep_in_kernel_mark = Some((0x100, 0xff00));
        o.conn(&c, 1);
        assert_eq!(o.len(), 1);
        o.conn(&c, 2);
        assert_eq!((o.len(), o.stats.ended_remarked), (1, 0), "same mark");
        c.mark = 0x7;
        o.conn(&c, 3);
        assert_eq!((o.len(), o.stats.ended_remarked), (1, 1));
        c.mark = 0x107;
        o.conn(&c, 4);
        assert_eq!((o.len(), o.stats.ended_remarked), (0, 2));
        assert_eq!(o.stats.not_offloaded.get("kept_by_mark"), Some(&1));
    }

    fn slot_of(o: &Offloader<MemTable, FakeKernel>, c: &Conn) -> Option<u16> {
        o.table.0.get(&flow_key(&c.orig)).map(|e| e.route_mark)
    }

    /// An `IPsec` policy that covers a connection keeps it in the kernel
    /// (`ipsec_policy`); one added later ends the offloaded connections it
    /// covers at the next tick (`ended_ipsec`), and only those.
    #[test]
    fn ipsec_policies_keep_their_connections_in_the_kernel() {
        let covered = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut other = masq_udp(CONFIRMED | SEEN_REPLY);
        other.orig.sport = 5001;
        other.orig.dst = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 77));
        other.reply.src = other.orig.dst;
        other.reply.dport = 61001;
        let to_server = crate::xfrm::Selector {
            v6: Some(false),
            src: [0; 16],
            src_len: 0,
            dst: {
                let mut d = [0; 16];
                d[..4].copy_from_slice(&[198, 51, 100, 2]);
                d
            },
            dst_len: 32,
            proto: 0,
            dir: 1,
            mark: (0, 0),
        };
        let mut o = offloader(&[&covered, &other]);
        o.kernel.ipsec = (vec![to_server.clone()], 1);
        o.conn(&covered, 1);
        o.conn(&other, 1);
        assert_eq!(o.len(), 1);
        assert_eq!(o.stats.not_offloaded.get("ipsec_policy"), Some(&1));

        let mut o = offloader(&[&covered, &other]);
        o.conn(&covered, 1);
        o.conn(&other, 1);
        o.tick(2);
        assert_eq!((o.len(), o.stats.ended_ipsec), (2, 0));
        o.kernel.ipsec = (vec![to_server], 1);
        o.tick(3);
        assert_eq!((o.len(), o.stats.ended_ipsec), (1, 1));
        assert!(o.flows.contains_key(&other.orig));
        o.tick(4);
        assert_eq!(o.stats.ended_ipsec, 1, "checked once per change");
    }

    /// `run --keep-in-kernel-mark`: a connection with the mark (under its
    /// mask) stays in the kernel, one with another mark is offloaded.
    #[test]
    fn a_connection_with_the_kept_mark_stays_in_the_kernel() {
        let mut kept = masq_udp(CONFIRMED | SEEN_REPLY);
        kept.mark = 0x0123;
        let mut other = masq_udp(CONFIRMED | SEEN_REPLY);
        other.orig.sport = 5001;
        other.reply.dport = 61001;
        other.mark = 0x0200;
        let mut o = offloader(&[&kept, &other]);
        o.keep_in_kernel_mark = Some((0x0100, 0xff00));
        o.conn(&kept, 1);
        o.conn(&other, 1);
        assert_eq!(o.len(), 1);
        assert!(o.flows.contains_key(&other.orig));
        assert_eq!(o.stats.not_offloaded.get("kept_by_mark"), Some(&1));
    }

    /// A UDP flow keeps the timeout the kernel would give it: replied but
    /// not a stream, `nf_conntrack_udp_timeout` (a DNS exchange does not
    /// hold a kernel entry for 120 s); assured when offloaded, or carried
    /// by XDP 2 s or more after the offload, the stream timeout.
    #[test]
    fn udp_gets_the_stream_timeout_only_as_a_stream() {
        let replied = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = offloader(&[&replied]);
        o.conn(&replied, 1_000_000_000);
        let k = flow_key(&replied.orig);
        assert_eq!(o.kernel.refreshed, vec![(replied.orig, 30)]);
        assert_eq!(o.table.0[&k].lease, lease_until(1_000_000_000, 15));
        // Active again 1.5 s after the offload: still not a stream.
        o.table.0.get_mut(&k).unwrap().last_seen_ns = 2_500_000_000;
        o.tick(2_600_000_000);
        assert_eq!(o.kernel.refreshed[1], (replied.orig, 30));
        assert_eq!(o.table.0[&k].lease, lease_until(2_600_000_000, 15));
        assert!(o.kernel.assured.is_empty());
        // Active 2 s after it: a stream from then on, and assured.
        o.table.0.get_mut(&k).unwrap().last_seen_ns = 3_000_000_000;
        o.tick(3_100_000_000);
        assert_eq!(o.kernel.refreshed[2], (replied.orig, 120));
        assert_eq!(o.kernel.assured, vec![replied.orig]);
        assert_eq!(o.table.0[&k].lease, lease_until(3_100_000_000, 60));

        let assured = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        let mut o = offloader(&[&assured]);
        o.conn(&assured, 1_000);
        assert_eq!(o.kernel.refreshed, vec![(assured.orig, 120)]);
    }

    #[test]
    fn tick_refreshes_only_active_flows_and_extends_their_lease() {
        let c = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = offloader(&[&c]);
        o.conn(&c, 1_000);
        let k = flow_key(&c.orig);
        let lease0 = o.table.0[&k].lease;
        // Idle: nothing refreshed.
        o.tick(10_000_000_000);
        assert_eq!(o.kernel.refreshed.len(), 1);
        assert_eq!(o.table.0[&k].lease, lease0);
        // XDP forwarded a packet: kernel timeout and lease renewed.
        o.table.0.get_mut(&k).unwrap().last_seen_ns = 20_000_000_000;
        o.tick(21_000_000_000);
        assert_eq!(o.kernel.refreshed.len(), 2);
        assert_eq!(o.table.0[&k].lease, lease_until(21_000_000_000, 60));
        assert!(o.table.0[&k].lease > lease0);
        assert_eq!(o.stats.refreshed, 1);
    }

    /// A new connection on an offloaded flow's tuple (another conntrack id:
    /// the old one ended without a DESTROY) ends the old flow's entries,
    /// replied or not: they do not carry it past its own checks.
    #[test]
    fn another_connection_on_the_tuple_ends_the_old_ones_entries() {
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
        c.id = 7;
        let mut o = offloader(&[&c]);
        o.conn(&c, 1);
        assert_eq!(o.len(), 1);
        o.conn(&c, 2);
        assert_eq!((o.len(), o.stats.ended_remapped), (1, 0), "the same one");
        let mut new = masq_udp(CONFIRMED);
        new.id = 8;
        o.conn(&new, 3);
        assert_eq!(
            (o.len(), o.table.0.len(), o.stats.ended_remapped),
            (0, 0, 1)
        );
        // Replied (its unreplied event missed): ended, and decided anew.
        let mut o = offloader(&[&c]);
        o.conn(&c, 1);
        new.status = CONFIRMED | SEEN_REPLY;
        o.conn(&new, 3);
        assert_eq!((o.len(), o.stats.ended_remapped), (1, 1));
    }

    /// An idle flow whose kernel entry ended without a DESTROY (made while
    /// nothing listened to the kernel's events): forgotten once past its
    /// kernel timeout; one the kernel still has is kept and asked about
    /// again a timeout later.
    #[test]
    fn tick_forgets_an_idle_flow_the_kernel_ended_unsaid() {
        let c = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = offloader(&[&c]);
        o.conn(&c, 1);
        let due = 1 + secs_ns(o.timeouts.of(IPPROTO_UDP, false));
        o.tick(due);
        assert_eq!(o.len(), 1, "within its timeout");
        // Still the kernel's past it: kept.
        o.tick(due + KERNEL_GONE_MARGIN_NS + 1);
        assert_eq!((o.len(), o.stats.ended_kernel_gone), (1, 0));
        // Gone unsaid: forgotten, but only once past the new due time.
        o.kernel.present.clear();
        o.tick(due + KERNEL_GONE_MARGIN_NS + 2);
        assert_eq!(o.len(), 1, "asked again only a timeout later");
        o.tick(2 * due + 2 * KERNEL_GONE_MARGIN_NS + 2);
        assert_eq!(
            (o.len(), o.table.0.len(), o.stats.ended_kernel_gone),
            (0, 0, 1)
        );
    }

    #[test]
    fn tick_forgets_flows_the_kernel_or_xdp_lost() {
        let c = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = offloader(&[&c]);
        o.conn(&c, 1);
        o.kernel.present.clear();
        o.table.0.get_mut(&flow_key(&c.orig)).unwrap().last_seen_ns = 5;
        assert_eq!(o.tick(10), 0, "the kernel's end is no eviction");
        assert_eq!(
            (o.len(), o.table.0.len(), o.stats.ended_kernel_gone),
            (0, 0, 1)
        );
        // An evicted XDP half hands the flow back, and is counted for a
        // resync to offload it again.
        o.kernel.present.push(c.orig);
        o.conn(&c, 20);
        o.table.remove(&flow_key(&c.reply));
        assert_eq!(o.tick(30), 1);
        assert_eq!((o.len(), o.table.0.len(), o.stats.handed_back), (0, 0, 1));
        o.resync(std::slice::from_ref(&c), 40);
        assert_eq!((o.len(), o.table.0.len()), (1, 2), "offloaded again");
    }

    #[test]
    fn resync_drops_what_the_kernel_forgot() {
        let a = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut b = a.clone();
        b.orig.sport = 5001;
        b.reply.dport = 61001;
        let mut o = offloader(&[&a, &b]);
        o.resync(&[a.clone(), b.clone()], 1);
        assert_eq!(o.len(), 2);
        o.resync(&[b], 2);
        assert_eq!((o.len(), o.table.0.len()), (1, 2));
        assert_eq!(o.stats.resyncs, 2);
    }

    /// Events lost while the kernel re-created an offloaded flow's entry
    /// with another translation (a conntrackd commit at a takeover): the
    /// resync sees the same original tuple with another reply tuple and
    /// offloads it again with the kernel's translation.
    #[test]
    fn a_flow_the_kernel_remapped_unseen_is_offloaded_again_with_its_translation() {
        let a = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = offloader(&[&a]);
        o.resync(std::slice::from_ref(&a), 1);
        assert_eq!(o.len(), 1);
        let mut remapped = a.clone();
        remapped.reply.dport = 62000;
        o.kernel.conns = vec![remapped.clone()];
        o.kernel.replies.insert(remapped.orig, remapped.reply);
        o.resync(std::slice::from_ref(&remapped), 2);
        let e = o
            .table
            .0
            .get(&flow_key(&a.orig))
            .expect("the original entry");
        assert_eq!(e.new_src_port, 62000, "XDP kept the old translation");
        assert!(
            !o.table.0.keys().any(|k| k.dst_port == 61000),
            "the old translation's reply entry is left: {:?}",
            o.table.0.keys().collect::<Vec<_>>()
        );
        assert_eq!((o.len(), o.stats.ended_remapped), (1, 1));
        // The same reply tuple again changes nothing.
        o.conn(&remapped, 3);
        assert_eq!((o.len(), o.stats.ended_remapped), (1, 1));
    }

    #[test]
    fn a_failed_resync_stays_owed_and_changes_nothing() {
        let a = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = offloader(&[&a]);
        o.kernel.dump_failures = 1;
        assert!(o.resync_from_kernel(1).is_err());
        assert!(o.resync_retry_due(1 + RESYNC_RETRY_FIRST_NS));
        assert_eq!(
            (o.len(), o.stats.resyncs, o.stats.resync_failures),
            (0, 0, 1)
        );
        o.resync_from_kernel(2).expect("the second dump succeeds");
        assert!(!o.resync_retry_due(u64::MAX));
        assert_eq!(o.resync_failed_in_row(), 0);
        assert_eq!(
            (o.len(), o.stats.resyncs, o.stats.resync_failures),
            (1, 1, 1)
        );
    }

    #[test]
    fn a_dump_that_keeps_failing_is_tried_less_often() {
        let mut o = offloader(&[]);
        o.kernel.dump_failures = 100;
        let mut now = 0;
        let mut waits = Vec::new();
        for _ in 0..8 {
            assert!(o.resync_from_kernel(now).is_err());
            let at = (now..)
                .step_by(1_000_000_000)
                .find(|&t| o.resync_retry_due(t))
                .unwrap();
            waits.push((at - now) / 1_000_000_000);
            now = at;
        }
        assert_eq!(waits, [2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(o.resync_failed_in_row(), 8);
    }

    /// An offloader whose next TCP connections all wait to settle, as
    /// under a burst.
    fn in_a_burst(present: &[&Conn]) -> Offloader<MemTable, FakeKernel> {
        let mut o = offloader(present);
        o.immediate_tcp = TokenBucket::new(Rate {
            per_sec: 0,
            burst: 0,
        });
        o
    }

    /// Both ways a TCP connection is offloaded: at once (outside a burst)
    /// and once settled (in a burst), each driven by [`established`].
    fn at_once_and_settled(present: &[&Conn]) -> [Offloader<MemTable, FakeKernel>; 2] {
        [offloader(present), in_a_burst(present)]
    }

    /// The ESTABLISHED update of `c` at `now_ns`, and no closing one until
    /// it settled (the settle clock run to its due time).
    fn established(o: &mut Offloader<MemTable, FakeKernel>, c: &Conn, now_ns: u64) {
        o.conn(c, now_ns);
        o.settle(now_ns + TCP_SETTLE_NS);
    }

    /// Requests the fake kernel answered for a TCP connection's state.
    fn state_reads(o: &Offloader<MemTable, FakeKernel>) -> usize {
        o.kernel.reads.values().sum()
    }

    #[test]
    fn closing_tcp_leaves_xdp() {
        let mut c = established_tcp();
        for mut o in at_once_and_settled(&[&c]) {
            c.tcp_state = Some(tcp_state::ESTABLISHED);
            established(&mut o, &c, 1);
            assert_eq!(o.len(), 1);
            c.tcp_state = Some(tcp_state::FIN_WAIT);
            o.conn(&c, TCP_SETTLE_NS + 2);
            assert_eq!((o.len(), o.table.0.len(), o.stats.ended_closing), (0, 0, 1));
        }
    }

    #[test]
    fn an_update_without_the_tcp_state_neither_ends_nor_refuses_a_connection() {
        // A ct mark, label or secmark change: the event has no CTA_PROTOINFO.
        let c = established_tcp();
        let mut marked = c.clone();
        marked.tcp_state = None;
        for mut o in at_once_and_settled(&[&c]) {
            established(&mut o, &c, 1);
            o.conn(&marked, TCP_SETTLE_NS + 2);
            assert_eq!((o.len(), o.table.0.len(), o.stats.ended_closing), (1, 2, 0));
        }
        // Nor drops one that is settling.
        let mut o = in_a_burst(&[&c]);
        o.conn(&c, 1);
        o.conn(&marked, 2);
        o.settle(1 + TCP_SETTLE_NS);
        assert_eq!((o.len(), o.settling()), (1, 0));
        // A connection first seen so (picked up mid-stream, its assured
        // event alone) is offloaded once the kernel says ESTABLISHED, and
        // left to it otherwise.
        let mut o = offloader(&[&c]);
        o.conn(&marked, 1);
        assert_eq!(o.len(), 1);
        let mut o = offloader(&[&c]);
        o.kernel.closing.push(c.orig);
        o.conn(&marked, 1);
        assert_eq!((o.len(), o.table.0.len()), (0, 0));
        assert_eq!(o.stats.not_offloaded.get("tcp_closed_meanwhile"), Some(&1));
    }

    #[test]
    fn the_immediate_offloads_follow_their_rate() {
        let mut b = TokenBucket::new(Rate {
            per_sec: 10,
            burst: 3,
        });
        let t0 = 5_000_000_000;
        assert_eq!((0..5).filter(|_| b.take(t0)).count(), 3);
        // A token per 100 ms, never more than the burst.
        assert!(!b.take(t0 + 99_000_000));
        assert!(b.take(t0 + 100_000_000));
        assert_eq!((0..10).filter(|_| b.take(t0 + 60_000_000_000)).count(), 3);
        // A clock read late (an event stamped before the last) earns no
        // token.
        assert!(!b.take(t0));
    }

    #[test]
    fn outside_a_burst_a_tcp_connection_is_offloaded_at_once() {
        let c = established_tcp();
        let mut o = offloader(&[&c]);
        o.conn(&c, 1);
        assert_eq!((o.len(), o.settling()), (1, 0));
        // In a burst the immediate ones run out: the rest wait.
        let conns: Vec<Conn> = (0..IMMEDIATE_TCP.burst + 10)
            .map(|i| {
                let mut d = established_tcp();
                d.orig.sport = 10_000 + u16::try_from(i).unwrap();
                d.reply.dport = d.orig.sport;
                d
            })
            .collect();
        let mut o = offloader(&conns.iter().collect::<Vec<_>>());
        for d in &conns {
            o.conn(d, 1);
        }
        assert_eq!(o.len(), IMMEDIATE_TCP.burst as usize);
        assert_eq!(o.settling(), 10);
        o.settle(1 + TCP_SETTLE_NS);
        assert_eq!((o.len(), o.settling()), (conns.len(), 0));
    }

    #[test]
    fn in_a_burst_a_tcp_connection_is_offloaded_once_it_stayed_established() {
        let c = established_tcp();
        let mut o = in_a_burst(&[&c]);
        o.conn(&c, 1_000);
        // A repeated update does not postpone it.
        o.conn(&c, 50_000_000);
        o.settle(TCP_SETTLE_NS);
        assert_eq!((o.len(), o.settling(), state_reads(&o)), (0, 1, 0));
        o.settle(1_000 + TCP_SETTLE_NS);
        assert_eq!((o.len(), o.settling(), o.table.0.len()), (1, 0, 2));
        assert_eq!((o.stats.settled, o.stats.offloaded), (1, 1));
        assert_eq!(o.kernel.refreshed.len(), 2);
        assert_eq!(o.kernel.refreshed[0], (c.orig, 432_000));
        // UDP does not wait: no request to the kernel to spare.
        let u = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = in_a_burst(&[&u]);
        o.conn(&u, 1);
        assert_eq!((o.len(), o.settling()), (1, 0));
    }

    #[test]
    fn a_connection_closed_while_settling_costs_no_request_to_the_kernel() {
        let c = established_tcp();
        let mut closing = c.clone();
        closing.tcp_state = Some(tcp_state::FIN_WAIT);
        let mut d = established_tcp();
        d.orig.sport = 5001;
        d.reply.dport = 61001;
        let mut o = in_a_burst(&[&c, &d]);
        o.conn(&c, 1);
        o.conn(&closing, 2);
        // Or gone altogether.
        o.conn(&d, 3);
        o.destroy(&d);
        o.settle(10 * TCP_SETTLE_NS);
        assert_eq!((o.len(), o.settling(), o.table.0.len()), (0, 0, 0));
        assert_eq!((state_reads(&o), o.kernel.refreshed.len()), (0, 0));
        assert_eq!(
            o.stats.not_offloaded.get("tcp_closed_while_settling"),
            Some(&2)
        );
        // The ports' next connection waits its own time, not its
        // predecessor's.
        o.conn(&c, 100_000_000);
        o.settle(TCP_SETTLE_NS + 1);
        assert_eq!(o.len(), 0);
        o.settle(100_000_000 + TCP_SETTLE_NS);
        assert_eq!(o.len(), 1);
        // A resync forgets a settling connection the kernel no longer has.
        o.conn(&d, 1_000_000_000);
        o.resync(std::slice::from_ref(&c), 1_000_000_001);
        o.settle(2_000_000_000);
        // (c's offload: a read before setting its timeout, one after, one
        // after the XDP write; d's: none.)
        assert_eq!((o.len(), o.settling(), state_reads(&o)), (1, 0, 3));
    }

    /// An established masqueraded TCP connection, as its update event
    /// reports it.
    fn established_tcp() -> Conn {
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        c.orig.proto = 6;
        c.reply.proto = 6;
        c.tcp_state = Some(tcp_state::ESTABLISHED);
        c
    }

    #[test]
    fn a_connection_closed_since_its_established_event_stays_in_the_kernel() {
        let c = established_tcp();
        for mut o in at_once_and_settled(&[&c]) {
            o.kernel.closing.push(c.orig);
            established(&mut o, &c, 1);
            assert_eq!((o.len(), o.table.0.len()), (0, 0));
            // Its kernel entry keeps the closing state's timeout.
            assert!(o.kernel.refreshed.is_empty());
            assert_eq!(o.stats.not_offloaded.get("tcp_closed_meanwhile"), Some(&1));
        }
    }

    /// `SYN_RECV`: a new connection's entry once its SYN-ACK passed.
    const FAKE_SYN_RECV: u8 = 2;

    /// The fake's closing state (`FIN_WAIT`) and its default timeout.
    const FAKE_CLOSING_TIMEOUT: u32 = 120;

    #[test]
    fn a_connection_closed_while_offloaded_gets_its_closing_timeout_back() {
        let c = established_tcp();
        for mut o in at_once_and_settled(&[&c]) {
            o.kernel.closing_at_refresh.push(c.orig);
            established(&mut o, &c, 1);
            // Not offloaded, and the kernel entry keeps no ESTABLISHED
            // timeout.
            assert_eq!((o.len(), o.table.0.len()), (0, 0));
            assert_eq!(
                o.kernel.refreshed,
                [(c.orig, 432_000), (c.orig, FAKE_CLOSING_TIMEOUT)]
            );
            assert_eq!(o.stats.closed_while_refreshed, 1);
        }
    }

    #[test]
    fn entries_written_after_the_next_connection_on_the_ports_began_are_undone() {
        let c = established_tcp();
        let mut o = offloader(&[&c]);
        // Read 1: the check, read 2: after the liberal write, both
        // ESTABLISHED; then, before the XDP write, the connection closes
        // and the next one on the same ports has passed its SYN and
        // SYN-ACK: read 3, after the write, finds a new entry.
        o.kernel.replaced_at_read.push((c.orig, 3));
        o.conn(&c, 1);
        assert_eq!((o.len(), o.table.0.len()), (0, 0));
        assert_eq!(o.stats.undone_replaced, 1);
        // The new entry gets window tracking off (XDP may have carried its
        // handshake ACK and request) and keeps its state's timeout.
        assert!(o.kernel.liberal.contains(&c.orig));
        assert_eq!(
            o.kernel.refreshed.last(),
            Some(&(c.orig, KernelTimeouts::default().tcp_state(FAKE_SYN_RECV)))
        );
        // Its own ESTABLISHED update offloads it.
        o.kernel.replaced.clear();
        o.conn(&c, 2);
        assert_eq!((o.len(), o.table.0.len(), o.stats.offloaded), (1, 2, 1));
    }

    #[test]
    fn entries_are_undone_when_the_kernel_translates_the_ports_differently() {
        let c = established_tcp();
        let mut o = offloader(&[&c]);
        // The kernel's connection on these ports is another one by now,
        // mapped to another port (and offloaded already: liberal).
        let mut other = c.reply;
        other.dport += 1;
        o.kernel.replies.insert(c.orig, other);
        o.conn(&c, 1);
        assert_eq!(
            (o.len(), o.table.0.len(), o.stats.undone_replaced),
            (0, 0, 1)
        );
    }

    #[test]
    fn entries_handed_back_while_pending_are_removed_not_activated() {
        for c in [established_tcp(), masq_udp(CONFIRMED | SEEN_REPLY)] {
            let mut o = offloader(&[&c]);
            // Between the write (pending) and the activation, the data
            // path hands the pair back: the connection's FIN or the next
            // connection's SYN hit a pending entry.
            o.table.2 = true;
            o.conn(&c, 1);
            assert_eq!(
                (o.len(), o.table.0.len(), o.stats.undone_handed_back),
                (0, 0, 1)
            );
            assert_eq!((o.stats.offloaded, o.stats.undone_replaced), (0, 0));
            // Its own ESTABLISHED update (or the next packet's) offloads it.
            o.conn(&c, 2);
            assert_eq!((o.len(), o.table.0.len(), o.stats.offloaded), (1, 2, 1));
            let lease = lease_until(
                2,
                lease_secs(o.timeouts.of(c.orig.proto, c.has(ASSURED))).unwrap(),
            );
            for e in o.table.0.values() {
                assert_eq!(e.lease, lease);
            }
        }
    }

    #[test]
    fn entries_are_written_pending_and_activated_after_the_read_back() {
        let c = established_tcp();
        let mut o = offloader(&[&c]);
        // The read after the write finds another connection: the entries
        // go while still pending, never carrying a packet.
        o.kernel.replaced_at_read.push((c.orig, 3));
        o.table.2 = true;
        o.conn(&c, 1);
        assert_eq!(
            (o.stats.undone_replaced, o.stats.undone_handed_back),
            (1, 0)
        );
        // The hand-back was not consumed by a swap: none ran.
        assert!(o.table.2);
    }

    #[test]
    fn a_lease_renewal_never_overwrites_a_hand_back() {
        let c = established_tcp();
        let mut o = offloader(&[&c]);
        o.conn(&c, 1);
        let k = flow_key(&c.orig);
        o.table.0.get_mut(&k).unwrap().last_seen_ns = 20_000_000_000;
        // The tick reads a live lease, then the data path hands the pair
        // back before the renewal's write.
        o.table.2 = true;
        o.tick(21_000_000_000);
        assert_eq!(o.stats.errors, 0);
        for e in o.table.0.values() {
            assert_eq!(e.lease, LEASE_HANDED_BACK);
        }
        // The next tick ends it.
        o.tick(22_000_000_000);
        assert_eq!(
            (o.len(), o.table.0.len(), o.stats.ended_tcp_control),
            (0, 0, 1)
        );
    }

    #[test]
    fn a_connection_closed_while_its_lease_is_renewed_leaves_xdp() {
        let c = established_tcp();
        for mut o in at_once_and_settled(&[&c]) {
            established(&mut o, &c, 1);
            assert_eq!(o.len(), 1);
            // XDP carried a packet, then the kernel closes the connection
            // between the tick's look at the entries and its write.
            let k = flow_key(&c.orig);
            o.table.0.get_mut(&k).unwrap().last_seen_ns = 20_000_000_000;
            o.kernel.closing_at_refresh.push(c.orig);
            o.tick(21_000_000_000);
            assert_eq!((o.len(), o.table.0.len()), (0, 0));
            assert_eq!(
                o.kernel.refreshed.last(),
                Some(&(c.orig, FAKE_CLOSING_TIMEOUT))
            );
            assert_eq!(o.stats.closed_while_refreshed, 1);
        }
    }

    #[test]
    fn a_handed_back_connection_leaves_xdp_and_its_ports_next_one_is_offloaded() {
        let c = established_tcp();
        for mut o in at_once_and_settled(&[&c]) {
            established(&mut o, &c, 1);
            let (ok, rk) = (flow_key(&c.orig), flow_key(&c.reply));
            // The data path passed a FIN and handed the flow back (both
            // entries), and forwarded a packet just before.
            for k in [ok, rk] {
                let e = o.table.0.get_mut(&k).unwrap();
                e.lease = LEASE_HANDED_BACK;
                e.last_seen_ns = 5_000_000_000;
            }
            // A lease renewal never takes the hand-back back.
            let f = &o.flows[&c.orig];
            let read = f.keys.read(&o.table).unwrap();
            assert_eq!(f.keys.set_lease(&mut o.table, &read, 99), 0);
            assert_eq!(o.table.0[&ok].lease, LEASE_HANDED_BACK);
            // The tick ends it without refreshing the kernel entry
            // (refreshed twice by the offload: before and right after the
            // XDP write).
            o.tick(6_000_000_000);
            assert_eq!(
                (o.len(), o.table.0.len(), o.stats.ended_tcp_control),
                (0, 0, 1)
            );
            assert_eq!(o.kernel.refreshed.len(), 2);
            // The next connection on the same ports: offloaded once
            // established.
            established(&mut o, &c, 7_000_000_000);
            assert_eq!((o.len(), o.table.0.len()), (1, 2));
            // Its predecessor's closing update never came: an ESTABLISHED
            // update of a handed-back connection offloads it again.
            o.table.0.get_mut(&rk).unwrap().lease = LEASE_HANDED_BACK;
            established(&mut o, &c, 8_000_000_000);
            assert_eq!(
                (o.len(), o.stats.offloaded, o.stats.ended_tcp_control),
                (1, 3, 2)
            );
            assert_ne!(o.table.0[&rk].lease, LEASE_HANDED_BACK);
        }
    }

    #[test]
    fn lease_leaves_the_kernel_entry_a_margin() {
        assert_eq!(lease_secs(432_000), Some(MAX_LEASE_SECS));
        assert_eq!(lease_secs(120), Some(60));
        assert_eq!(lease_secs(10), Some(5));
        assert_eq!(lease_secs(6), None);
    }

    /// A routed IPv6 UDP flow `[fd00:50::2]:5000 -> [2001:db8:1::2]:53` (no
    /// translation: the reply tuple is the original reversed).
    fn udp6(status: u32) -> Conn {
        let orig = Tuple {
            src: "fd00:50::2".parse().unwrap(),
            dst: "2001:db8:1::2".parse().unwrap(),
            proto: 17,
            sport: 5000,
            dport: 53,
            icmp: None,
        };
        Conn {
            orig,
            reply: Tuple {
                src: orig.dst,
                dst: orig.src,
                sport: orig.dport,
                dport: orig.sport,
                ..orig
            },
            status,
            ..Conn::default()
        }
    }

    #[test]
    fn ipv6_eligibility_refuses_translation_and_foreign_icmp() {
        let c = udp6(CONFIRMED | SEEN_REPLY);
        assert_eq!(eligibility(&c), Verdict::Offload);
        assert_eq!(eligibility(&udp6(CONFIRMED)), Verdict::Wait("unreplied"));
        // NAT66 / masquerade: the reply goes to another address or port.
        let mut nat = c.clone();
        nat.reply.dst = "2001:db8::1".parse().unwrap();
        assert_eq!(eligibility(&nat), Verdict::Refuse("ipv6_nat"));
        let mut nat = c.clone();
        nat.reply.dport = 61000;
        assert_eq!(eligibility(&nat), Verdict::Refuse("ipv6_nat"));
        let mut mixed = c.clone();
        mixed.reply.src = IpAddr::V4(Ipv4Addr::new(198, 51, 100, 2));
        assert_eq!(eligibility(&mixed), Verdict::Refuse("mixed_family"));
        // ICMPv6: echo only, and not under IPv4's protocol number.
        let mut ping = c.clone();
        for t in [&mut ping.orig, &mut ping.reply] {
            t.proto = IPPROTO_ICMPV6;
            (t.sport, t.dport) = (7, 7);
        }
        ping.orig.icmp = Some((128, 0));
        ping.reply.icmp = Some((129, 0));
        assert_eq!(eligibility(&ping), Verdict::Offload);
        let mut other = ping.clone();
        other.orig.icmp = Some((1, 4));
        assert_eq!(eligibility(&other), Verdict::Refuse("icmp_type"));
        let mut v4_over_v6 = ping.clone();
        v4_over_v6.orig.proto = IPPROTO_ICMP;
        v4_over_v6.orig.icmp = Some((8, 0));
        assert_eq!(eligibility(&v4_over_v6), Verdict::Refuse("protocol"));
    }

    #[test]
    fn ipv6_entries_are_routed_halves_of_one_flow() {
        let c = udp6(CONFIRMED | SEEN_REPLY);
        let [(ok, o), (rk, r)] = entries6(&c, true, 5, 9);
        assert_eq!(ok, flow_key6(&c.orig));
        assert_eq!(rk, ok.reversed());
        assert!(o.lan_side() && !r.lan_side());
        assert_eq!(
            (o.flags & FLAG_ORIGINAL, r.flags & FLAG_ORIGINAL),
            (FLAG_ORIGINAL, 0)
        );
        for e in [o, r] {
            assert_ne!(e.flags & FLAG_OFFLOADED, 0);
            assert_eq!((e.lease, e.state), (9, FlowState::UdpReplied as u8));
            assert_eq!((e.last_seen_ns, e.created_ns), (5, 5));
        }
        // Opened from the WAN (a firewall rule admitted it): the reply
        // direction is the LAN side.
        let [(_, o), (_, r)] = entries6(&c, false, 5, 9);
        assert!(!o.lan_side() && r.lan_side());
    }

    #[test]
    fn ipv6_flow_is_offloaded_renewed_and_ended_like_ipv4() {
        let c = udp6(CONFIRMED | SEEN_REPLY);
        let mut o = offloader(&[&c]);
        o.conn(&c, 1_000);
        assert_eq!((o.len(), o.table.0.len(), o.table.1.len()), (1, 0, 2));
        // Replied, not a stream yet: the kernel's plain UDP timeout.
        assert_eq!(o.kernel.refreshed, vec![(c.orig, 30)]);
        let k = flow_key6(&c.orig);
        let lease0 = o.table.1[&k].lease;
        assert_eq!(lease0, lease_until(1_000, 15));
        // Idle: nothing renewed.
        o.tick(10_000_000_000);
        assert_eq!((o.kernel.refreshed.len(), o.table.1[&k].lease), (1, lease0));
        // XDP carried a packet of the reply direction: both leases renewed.
        o.table.1.get_mut(&k.reversed()).unwrap().last_seen_ns = 20_000_000_000;
        o.tick(21_000_000_000);
        // Active 20 s after the offload: a stream, with its timeout.
        assert_eq!(o.kernel.refreshed[1], (c.orig, 120));
        for key in [k, k.reversed()] {
            assert_eq!(o.table.1[&key].lease, lease_until(21_000_000_000, 60));
        }
        o.destroy(&c);
        assert_eq!(
            (o.len(), o.table.1.len(), o.stats.ended_destroyed),
            (0, 0, 1)
        );
        // An evicted half hands the flow back.
        o.conn(&c, 30);
        o.table.remove6(&k.reversed());
        o.tick(40);
        assert_eq!((o.len(), o.table.1.len(), o.stats.handed_back), (0, 0, 1));
    }

    #[test]
    fn icmpv6_echo_uses_the_kernels_icmpv6_timeout() {
        let t = KernelTimeouts {
            icmp: 30,
            icmpv6: 16,
            ..KernelTimeouts::default()
        };
        assert_eq!(
            (t.of(IPPROTO_ICMP, false), t.of(IPPROTO_ICMPV6, false)),
            (30, 16)
        );
    }

    /// A pair left pending by a killed daemon (IPv4 and IPv6) is removed;
    /// the starting daemon's own offloaded pair and a standalone entry
    /// (no `FLAG_OFFLOADED`, whose lease field means nothing) stay.
    #[test]
    fn sweep_removes_only_pairs_left_pending() {
        let c = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        let mut o = offloader(&[&c]);
        o.resync(std::slice::from_ref(&c), 10);
        assert_eq!(o.len(), 1);
        let pending = |flags| FlowEntry {
            flags: flags | FLAG_OFFLOADED,
            lease: LEASE_PENDING,
            ..FlowEntry::default()
        };
        let left = flow_key(&t([192, 168, 50, 3], 6000, [198, 51, 100, 2], 53, 17));
        o.table.0.insert(left, pending(FLAG_ORIGINAL));
        o.table.0.insert(left.reversed(), pending(0));
        let standalone = flow_key(&t([192, 168, 50, 4], 6000, [198, 51, 100, 2], 53, 17));
        o.table.0.insert(
            standalone,
            FlowEntry {
                lease: LEASE_PENDING,
                ..FlowEntry::default()
            },
        );
        let k6 = FlowKey6::new([0xfd; 16], [0x20; 16], 6000, 53, 17);
        let pending6 = FlowEntry6 {
            flags: FLAG_OFFLOADED,
            lease: LEASE_PENDING,
            ..FlowEntry6::default()
        };
        o.table.1.insert(k6, pending6);
        o.table.1.insert(k6.reversed(), pending6);
        let before: Vec<_> = o.table.0.iter().map(|(k, e)| (*k, *e)).collect();
        let before6: Vec<_> = o.table.1.iter().map(|(k, e)| (*k, *e)).collect();
        assert_eq!(
            o.sweep_left_behind(&before, &before6, std::slice::from_ref(&c)),
            Swept {
                pending: 4,
                ended: 0
            }
        );
        assert!(o.table.1.is_empty());
        assert!(!o.table.0.contains_key(&left) && !o.table.0.contains_key(&left.reversed()));
        assert!(o.table.0.contains_key(&standalone));
        // The offloaded connection: both entries, active.
        for k in [flow_key(&c.orig), flow_key(&c.reply)] {
            assert!(o.table.0[&k].lease > LEASE_PENDING, "{k:?}");
        }
        assert_eq!(o.table.0.len(), 3);
    }

    /// A connection offloaded by an earlier daemon and deleted from the
    /// kernel's table while no daemon ran (`conntrack -D` after a new
    /// firewall rule): the starting daemon removes its carrying pair (its
    /// packets meet the firewall again), counted as ended; a connection the
    /// kernel still has stays, taken over or not yet (a TCP connection
    /// settling under a burst).
    #[test]
    fn a_starting_daemon_removes_pairs_of_connections_the_kernel_ended() {
        let kept = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        let mut ended = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        ended.orig.sport = 5001;
        ended.reply.dport = 61001;
        let mut later = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        later.orig.sport = 5002;
        later.reply.dport = 61002;
        // The earlier daemon offloaded all three.
        let mut earlier = offloader(&[&kept, &ended, &later]);
        earlier.resync(&[kept.clone(), ended.clone(), later.clone()], 10);
        assert_eq!(earlier.len(), 3);
        let table = std::mem::take(&mut earlier.table);
        let ended_keys = [flow_key(&ended.orig), flow_key(&ended.reply)];
        for k in &ended_keys {
            assert!(carries(table.0[k].lease), "{k:?}");
        }
        // The new one finds `kept` and `later` in the kernel, and has taken
        // `kept` over only; and another LAN host's connection mapped to the
        // ended one's port on the same server (its reply tuple is the
        // ended one's: that half alone is no reason to keep the pair).
        let mut reuser = ended.clone();
        reuser.orig.src = IpAddr::from([192, 168, 50, 9]);
        let dump = [kept.clone(), later.clone(), reuser];
        let mut o = offloader_on(&[&kept, &later], table, FakeKernel::default());
        o.resync(std::slice::from_ref(&kept), 20);
        assert_eq!(o.len(), 1);
        let v4: Vec<_> = o.table.0.iter().map(|(k, e)| (*k, *e)).collect();
        let destroyed = o.stats.ended_destroyed;
        assert_eq!(
            o.sweep_left_behind(&v4, &[], &dump),
            Swept {
                pending: 0,
                ended: 2
            }
        );
        assert_eq!(o.stats.ended_destroyed, destroyed + 1);
        for k in &ended_keys {
            assert!(!o.table.0.contains_key(k), "{k:?}");
        }
        for c in [&kept, &later] {
            for k in [flow_key(&c.orig), flow_key(&c.reply)] {
                assert!(carries(o.table.0[&k].lease), "{k:?}");
            }
        }
        // Nothing more on a second look.
        let v4: Vec<_> = o.table.0.iter().map(|(k, e)| (*k, *e)).collect();
        assert_eq!(o.sweep_left_behind(&v4, &[], &dump), Swept::default());
    }

    /// A connection an earlier daemon offloaded that the kernel still has
    /// but the new daemon does not carry (a keep-in-kernel mark set while
    /// no daemon ran): its carrying pair is removed at the first tick,
    /// counted, while a taken-over one stays and a TCP connection still
    /// settling keeps its pair until it is decided on: carried on when
    /// offloaded, removed when it closed meanwhile.
    #[test]
    fn a_starting_daemon_removes_pairs_it_does_not_take_over() {
        let taken = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        let mut kept_in_kernel = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        kept_in_kernel.orig.sport = 5001;
        kept_in_kernel.reply.dport = 61001;
        kept_in_kernel.mark = 0x100;
        let tcp = |sport: u16, mapped: u16| {
            let mut c = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
            (c.orig.proto, c.reply.proto) = (IPPROTO_TCP, IPPROTO_TCP);
            c.tcp_state = Some(tcp_state::ESTABLISHED);
            (c.orig.sport, c.reply.dport) = (sport, mapped);
            c
        };
        let (settles, closes) = (tcp(5002, 61002), tcp(5003, 61003));
        let all = [&taken, &kept_in_kernel, &settles, &closes];
        let mut earlier = offloader(&all);
        earlier.resync(&all.map(Conn::clone), 10);
        assert_eq!(earlier.len(), 4, "{:?}", earlier.stats);
        let table = std::mem::take(&mut earlier.table);
        let pair = |c: &Conn| [flow_key(&c.orig), flow_key(&c.reply)];

        let mut o = offloader_on(&all, table, FakeKernel::default());
        o.keep_in_kernel_mark = Some((0x100, 0xff00));
        o.immediate_tcp = TokenBucket::new(Rate {
            per_sec: 0,
            burst: 0,
        });
        let dump = all.map(Conn::clone);
        o.resync(&dump, 20);
        assert_eq!((o.len(), o.settling()), (1, 2), "{:?}", o.stats);
        let v4: Vec<_> = o.table.0.iter().map(|(k, e)| (*k, *e)).collect();
        assert_eq!(o.sweep_left_behind(&v4, &[], &dump), Swept::default());
        // The kernel closes one of the settling connections.
        o.kernel.closing.push(closes.orig);
        o.tick(21);
        assert_eq!(o.stats.ended_not_taken_over, 1, "{:?}", o.stats);
        for k in pair(&kept_in_kernel) {
            assert!(!o.table.0.contains_key(&k), "{k:?}");
        }
        for c in [&taken, &settles, &closes] {
            for k in pair(c) {
                assert!(carries(o.table.0[&k].lease), "{k:?}");
            }
        }
        o.settle(20 + TCP_SETTLE_NS);
        assert_eq!(o.len(), 2, "{:?}", o.stats);
        o.tick(21 + TCP_SETTLE_NS);
        assert_eq!(o.stats.ended_not_taken_over, 2, "{:?}", o.stats);
        for k in pair(&closes) {
            assert!(!o.table.0.contains_key(&k), "{k:?}");
        }
        for c in [&taken, &settles] {
            for k in pair(c) {
                assert!(carries(o.table.0[&k].lease), "{k:?}");
            }
        }
        o.tick(22 + TCP_SETTLE_NS);
        assert_eq!((o.len(), o.stats.ended_not_taken_over), (2, 2));
    }

    /// A connection of another conntrack zone with the same tuple as an
    /// offloaded one (zones exist for that) is refused without touching the
    /// offloaded one: its updates and its end are not the other's.
    #[test]
    fn another_zones_connection_leaves_an_offloaded_one_with_its_tuple_alone() {
        let c = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        let mut o = offloader(&[&c]);
        o.conn(&c, 1);
        assert_eq!(o.len(), 1);
        let zoned = Conn {
            zone: 7,
            mark: 0x42,
            ..c.clone()
        };
        o.conn(&zoned, 2);
        o.destroy(&zoned);
        o.resync(std::slice::from_ref(&zoned), 3);
        assert_eq!(o.stats.not_offloaded.get("zone"), Some(&2), "{:?}", o.stats);
        // The resync found only the zoned one: the zone-0 one is not in it.
        assert_eq!((o.len(), o.stats.ended_destroyed), (0, 1), "{:?}", o.stats);
        let mut o = offloader(&[&c]);
        o.conn(&c, 1);
        o.conn(&zoned, 2);
        o.destroy(&zoned);
        assert_eq!(
            (o.len(), o.stats.ended_remarked, o.stats.ended_destroyed),
            (1, 0, 0)
        );
        assert_eq!(o.table.0.len(), 2);
    }

    /// An earlier daemon's pair of a connection the kernel ends while the
    /// new daemon settles it goes at the next tick; one whose key a
    /// connection offloaded since owns keeps that key.
    #[test]
    fn an_inherited_pair_goes_with_its_connection_and_keeps_keys_taken_since() {
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        (c.orig.proto, c.reply.proto) = (IPPROTO_TCP, IPPROTO_TCP);
        c.tcp_state = Some(tcp_state::ESTABLISHED);
        let mut earlier = offloader(&[&c]);
        earlier.conn(&c, 1);
        assert_eq!(earlier.len(), 1);
        let table = std::mem::take(&mut earlier.table);
        let mut o = offloader_on(&[&c], table, FakeKernel::default());
        o.immediate_tcp = TokenBucket::new(Rate {
            per_sec: 0,
            burst: 0,
        });
        let dump = [c.clone()];
        o.resync(&dump, 10);
        assert_eq!((o.len(), o.settling()), (0, 1));
        let v4: Vec<_> = o.table.0.iter().map(|(k, e)| (*k, *e)).collect();
        assert_eq!(o.sweep_left_behind(&v4, &[], &dump), Swept::default());
        o.destroy(&c);
        assert_eq!(o.table.0.len(), 2, "removed at the next tick");
        o.tick(11);
        assert_eq!(o.stats.ended_not_taken_over, 1, "{:?}", o.stats);
        assert!(o.table.0.is_empty(), "{:?}", o.table.0);
        assert!(o.inherited.is_empty());

        // Owned since: a key of the inherited pair that a carried
        // connection has now stays.
        let owned = OwnedKeys {
            v4: [flow_key(&c.reply)].into_iter().collect(),
            ..OwnedKeys::default()
        };
        let mut t = MemTable::default();
        let pair = entries(&c, true, 1, lease_until(1, 30), 0);
        for (k, e) in &pair {
            t.0.insert(*k, *e);
        }
        let keys = Keys::V4([pair[0].0, pair[1].0]);
        assert!(keys.remove_unowned(&mut t, &owned));
        assert_eq!(
            t.0.keys().copied().collect::<Vec<_>>(),
            [flow_key(&c.reply)]
        );
    }

    /// Every look the witness waits allow after the first one at `first_ns`,
    /// [`WITNESS_WAIT_NS`] apart.
    fn every_look(o: &mut Offloader<MemTable, FakeKernel>, first_ns: u64) {
        for i in 1..=u64::from(WITNESS_TRIES) {
            o.settle(first_ns + i * WITNESS_WAIT_NS);
        }
    }

    const GATEWAY: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const CLIENT_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

    fn seen_on(ifindex: u32, mark: u32, dst_mac: [u8; 6]) -> EgressSeen {
        EgressSeen {
            ifindex,
            mark,
            dst_mac,
            pad: 0,
        }
    }

    fn seen_on_wan(mark: u32) -> EgressSeen {
        seen_on(WAN, mark, GATEWAY)
    }

    /// An offloader under policy rules with the egress witness, the WAN
    /// gateway's and the client's MACs, and the kernel sending each
    /// connection's replies to the client on the LAN and its original
    /// direction as `seen` says (unlisted: nowhere the witness sees).
    fn witnessed_offloader(
        present: &[&Conn],
        seen: &[(&Conn, EgressSeen)],
    ) -> Offloader<MemTable, FakeKernel> {
        let mut o = policy_offloader(present, Some(vec![]));
        o.kernel.witness = Some(HashMap::new());
        for c in present {
            o.kernel.macs.insert((WAN, c.reply.src), GATEWAY);
            o.kernel.macs.insert((LAN, c.orig.src), CLIENT_MAC);
            o.kernel
                .sends
                .insert(leaving_as(&c.orig), seen_on(LAN, 0, CLIENT_MAC));
        }
        for (c, s) in seen {
            o.kernel.sends.insert(leaving_as(&c.reply), *s);
        }
        o
    }

    /// UDP without policy rules, the egress witness attached: offloaded
    /// once one of its replies was seen leaving the LAN; one whose replies
    /// a forward rule drops (none seen, or only an earlier connection's
    /// record, forgotten at that one's DESTROY) is looked at again and
    /// left to the kernel; one seen leaving elsewhere too.
    #[test]
    fn udp_is_offloaded_only_once_a_reply_was_forwarded_to_the_lan() {
        let unreplied = masq_udp(CONFIRMED);
        let replied = masq_udp(CONFIRMED | SEEN_REPLY);
        let reply_key = leaving_as(&replied.orig);
        let with_witness = |sends: Option<EgressSeen>, held: Option<EgressSeen>| {
            let mut o = offloader(&[&replied]);
            o.kernel.witness = Some(held.map(|h| (reply_key, h)).into_iter().collect());
            if held.is_some() {
                // The earlier connection on the tuple, whose reply was
                // forwarded, ends.
                o.destroy(&replied);
            }
            if let Some(s) = sends {
                o.kernel.sends.insert(reply_key, s);
            }
            o.conn(&unreplied, 1);
            o.conn(&replied, 2);
            o
        };
        // Forwarded: offloaded at once.
        let o = with_witness(Some(seen_on(LAN, 0, CLIENT_MAC)), None);
        assert_eq!(o.len(), 1);
        // Dropped by the firewall, with or without an earlier connection's
        // record of the same tuple: looked at again, then left.
        for held in [None, Some(seen_on(LAN, 0, CLIENT_MAC))] {
            let mut o = with_witness(None, held);
            assert_eq!((o.len(), o.stats.not_offloaded.len()), (0, 0), "{held:?}");
            every_look(&mut o, 2);
            assert_eq!(o.len(), 0, "{held:?}");
            assert_eq!(
                o.stats.not_offloaded.get(REPLY_NOT_FORWARDED),
                Some(&1),
                "{held:?}"
            );
            assert!(o.witness_tries.is_empty() && o.settling.is_empty());
        }
        // Sent back out of the WAN (not to the LAN host): left too.
        let mut o = with_witness(Some(seen_on(WAN, 0, GATEWAY)), None);
        every_look(&mut o, 2);
        assert_eq!(o.len(), 0);
        assert_eq!(o.stats.not_offloaded.get(REPLY_NOT_FORWARDED), Some(&1));
        // A reply forwarded while it waited: offloaded at the next look.
        let mut o = with_witness(None, None);
        o.kernel
            .sends
            .insert(reply_key, seen_on(LAN, 0, CLIENT_MAC));
        o.settle(2 + WITNESS_WAIT_NS);
        assert_eq!(o.len(), 1);
        // Refused, then a reply forwarded (a rule removed, an idle flow
        // active again: no event says so): offloaded at the next tick; one
        // that ended is forgotten.
        let mut o = with_witness(None, None);
        every_look(&mut o, 2);
        assert_eq!((o.len(), o.awaiting_reply.len()), (0, 1));
        o.tick(10 * WITNESS_WAIT_NS);
        assert_eq!(o.len(), 0, "no reply yet");
        o.kernel
            .sends
            .insert(reply_key, seen_on(LAN, 0, CLIENT_MAC));
        o.tick(11 * WITNESS_WAIT_NS);
        assert_eq!((o.len(), o.awaiting_reply.len()), (1, 0));
        let mut o = with_witness(None, None);
        every_look(&mut o, 2);
        o.destroy(&replied);
        assert!(o.awaiting_reply.is_empty());
        // The witness gone (a detach): nothing it said is lifted.
        let mut o = with_witness(None, None);
        every_look(&mut o, 2);
        o.kernel.witness = None;
        o.tick(10 * WITNESS_WAIT_NS);
        assert_eq!((o.len(), o.awaiting_reply.len()), (0, 1));
        // Waiting longer than AWAIT_REPLY_NS: left to the kernel.
        let mut o = with_witness(None, None);
        every_look(&mut o, 2);
        o.tick(AWAIT_REPLY_NS + 10 * WITNESS_WAIT_NS);
        assert!(o.awaiting_reply.is_empty() && o.awaiting_order.is_empty());
        // A reply seen, but the kernel ended it meanwhile (no DESTROY
        // read): read again, nothing offloaded.
        let mut o = with_witness(None, None);
        every_look(&mut o, 2);
        o.kernel.present.clear();
        o.kernel
            .sends
            .insert(reply_key, seen_on(LAN, 0, CLIENT_MAC));
        o.tick(10 * WITNESS_WAIT_NS);
        assert_eq!((o.len(), o.awaiting_reply.len()), (0, 0));
        // No witness (a kernel without tcx): conntrack's word, as before.
        let mut o = offloader(&[&replied]);
        o.conn(&replied, 1);
        assert_eq!(o.len(), 1);
    }

    /// A ct mark changed on an offloaded flow (`conntrack -U --mark`) to
    /// one that routes it into a tunnel: what the witness saw before the
    /// offload (the old mark, out of the WAN) is forgotten when the offload
    /// ends, so the new decision waits for the packets the kernel sends
    /// now (into the tunnel: never seen on an attached interface) and
    /// leaves the flow to the kernel, instead of carrying it out of the WAN
    /// again with the old mark.
    #[test]
    fn a_remarked_flow_is_decided_on_the_packets_the_kernel_sends_after() {
        const TUNNEL: u32 = 9;
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
        c.mark = 0x100;
        let mut o = witnessed_offloader(&[&c], &[(&c, seen_on_wan(0x100))]);
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 0x200), TUNNEL);
        o.conn(&c, 1);
        o.settle(1 + WITNESS_WAIT_NS);
        assert_eq!(o.len(), 1);
        // The kernel sends its packets into the tunnel from now on.
        c.mark = 0x200;
        o.kernel.sends.remove(&leaving_as(&c.reply));
        o.conn(&c, 2 * WITNESS_WAIT_NS);
        assert_eq!((o.stats.ended_remarked, o.len()), (1, 0));
        every_look(&mut o, 2 * WITNESS_WAIT_NS);
        assert_eq!(o.len(), 0, "{:?}", o.stats);
        // Its ct mark routes it into the tunnel, as the rules say: that
        // is the reason given (before the witness's).
        assert_eq!(o.stats.not_offloaded.get("policy_route"), Some(&1));
        // The same with a mark set on each packet (no ct mark to tell):
        // the witness's old record would have had it carried again.
        let c = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = witnessed_offloader(&[&c], &[(&c, seen_on_wan(0x100))]);
        o.conn(&c, 1);
        o.settle(1 + WITNESS_WAIT_NS);
        assert_eq!(o.len(), 1);
        o.kernel.rules_number += 1;
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 0x100), TUNNEL);
        o.kernel.sends.remove(&leaving_as(&c.reply));
        o.tick(2 * WITNESS_WAIT_NS);
        assert_eq!((o.stats.ended_rerouted, o.len()), (1, 0));
        o.resync_from_kernel(3 * WITNESS_WAIT_NS).unwrap();
        every_look(&mut o, 3 * WITNESS_WAIT_NS);
        assert_eq!(o.len(), 0, "{:?}", o.stats);
        assert_eq!(o.stats.not_offloaded.get(ROUTE_UNSEEN), Some(&1));
    }

    /// A daemon restarted under policy rules: the flows the fast path
    /// carries with an earlier daemon's entries send the kernel no packet
    /// for the new witness to see. Taken over with the mark their entries
    /// carry, then handed back once at the next tick (`ended_unwitnessed`)
    /// and, seen leaving by the kernel's route, carried again.
    #[test]
    fn a_restarted_daemon_has_the_flows_it_took_over_witnessed() {
        const TUNNEL: u32 = 9;
        let c = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = witnessed_offloader(&[&c], &[(&c, seen_on_wan(0x100))]);
        o.kernel
            .forward
            .insert((c.orig.src, c.reply.src, LAN, 0), TUNNEL);
        o.conn(&c, 1);
        o.settle(1 + WITNESS_WAIT_NS);
        assert_eq!(o.len(), 1);
        let table = std::mem::take(&mut o.table);
        let kernel = std::mem::take(&mut o.kernel);
        let mut restarted = offloader_on(&[&c], table, kernel);
        restarted.kernel.witness = Some(HashMap::new());
        restarted.resync_from_kernel(10).unwrap();
        assert_eq!(restarted.len(), 1, "{:?}", restarted.stats);
        assert_eq!(slot_of(&restarted, &c), Some(1));
        assert_eq!(restarted.waiting_for_witness(), 0);
        restarted.tick(11);
        assert_eq!((restarted.len(), restarted.stats.ended_unwitnessed), (0, 1));
        assert_eq!(
            restarted.stats.ended_rerouted, 0,
            "the rules did not change"
        );
        restarted.resync_from_kernel(12).unwrap();
        every_look(&mut restarted, 12);
        assert_eq!(restarted.len(), 1, "{:?}", restarted.stats);
        assert_eq!(slot_of(&restarted, &c), Some(1));
        // Witnessed now: the ticks after leave it carried.
        restarted.tick(13 + 5 * WITNESS_WAIT_NS);
        assert_eq!(restarted.len(), 1, "{:?}", restarted.stats);
    }

    /// A flow an earlier daemon (one from before the witness) carries out
    /// of the WAN while the kernel routes its packets into a tunnel by a
    /// mark it sets on each of them: after a restart it goes back to the
    /// kernel for good (`route_unseen`), where it stays in the tunnel.
    #[test]
    fn a_restarted_daemon_leaves_a_wrongly_carried_flow_to_the_kernel() {
        let c = masq_udp(CONFIRMED | SEEN_REPLY);
        // The earlier daemon: no witness, the ct mark (0) routes it out of
        // the WAN.
        let mut earlier = policy_offloader(&[&c], Some(vec![]));
        earlier.conn(&c, 1);
        assert_eq!(earlier.len(), 1, "{:?}", earlier.stats);
        let table = std::mem::take(&mut earlier.table);
        let mut restarted = witnessed_offloader(&[&c], &[]);
        restarted.table = table;
        restarted.resync_from_kernel(10).unwrap();
        assert_eq!(restarted.len(), 1, "{:?}", restarted.stats);
        restarted.tick(11);
        assert_eq!((restarted.len(), restarted.stats.ended_unwitnessed), (0, 1));
        // The kernel sends its packets into the tunnel (by the mark a rule
        // sets on each, which the ct mark does not show): the witness
        // never sees them leave an attached interface.
        restarted.resync_from_kernel(12).unwrap();
        every_look(&mut restarted, 12);
        assert_eq!(restarted.len(), 0, "{:?}", restarted.stats);
        assert_eq!(restarted.stats.not_offloaded.get(ROUTE_UNSEEN), Some(&1));
    }

    /// A restart where no policy rule routes by more than the destination
    /// (or where no witness can be attached): no mark changes the route,
    /// the flows taken over stay carried through the ticks after.
    #[test]
    fn a_restarted_daemon_keeps_the_flows_it_took_over_without_policy_rules() {
        let c = masq_udp(CONFIRMED | SEEN_REPLY);
        for policy in [false, true] {
            let kernel = FakeKernel {
                policy,
                // A hash of the rules, as the kernel's reads give.
                rules_number: 0x5eed,
                ..FakeKernel::default()
            };
            let mut o = offloader_on(
                &[&c],
                MemTable(BTreeMap::new(), BTreeMap::new(), false, Some(vec![])),
                kernel,
            );
            o.conn(&c, 1);
            o.tick(2);
            assert_eq!(o.len(), 1, "{:?}", o.stats);
            let table = std::mem::take(&mut o.table);
            let kernel = std::mem::take(&mut o.kernel);
            let mut restarted = offloader_on(&[&c], table, kernel);
            restarted.resync_from_kernel(10).unwrap();
            restarted.tick(11);
            restarted.tick(12);
            assert_eq!(restarted.len(), 1, "policy {policy}: {:?}", restarted.stats);
            assert_eq!(
                restarted.stats.ended_rerouted + restarted.stats.ended_unwitnessed,
                0
            );
        }
    }

    /// A TCP connection settling is offloaded when it settles, not behind
    /// a connection waiting for the witness (a queue each).
    #[test]
    fn a_tcp_settle_does_not_wait_behind_a_witness_wait() {
        let udp = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut tcp = masq_udp(CONFIRMED | SEEN_REPLY | ASSURED);
        tcp.orig.proto = IPPROTO_TCP;
        tcp.reply.proto = IPPROTO_TCP;
        tcp.orig.sport += 1;
        tcp.reply.dport += 1;
        tcp.tcp_state = Some(tcp_state::ESTABLISHED);
        let mut o = witnessed_offloader(
            &[&udp, &tcp],
            &[(&udp, seen_on_wan(0)), (&tcp, seen_on_wan(0))],
        );
        o.immediate_tcp = TokenBucket::new(Rate {
            per_sec: 0,
            burst: 0,
        });
        o.conn(&udp, 0);
        o.conn(&tcp, 100_000_000);
        assert_eq!(o.settling(), 1, "the witness wait is not a TCP settle");
        // Settled on time (then waiting for the witness like any other).
        o.settle(100_000_000 + TCP_SETTLE_NS);
        assert_eq!(o.stats.settled, 1, "{:?}", o.stats);
        o.settle(100_000_000 + TCP_SETTLE_NS + WITNESS_WAIT_NS);
        assert_eq!(o.len(), 2, "{:?}", o.stats);
    }

    /// A new ct mark while a connection waits for the witness is what the
    /// decision goes by: the owner's keep-in-kernel mark keeps it there;
    /// one closed meanwhile is counted as such.
    #[test]
    fn a_connection_waiting_for_the_witness_is_decided_as_it_is_now() {
        let mut c = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = witnessed_offloader(&[&c], &[]);
        o.keep_in_kernel_mark = Some((0x7, 0xff));
        o.conn(&c, 1);
        // Waiting: not a TCP settle, but the settle timer must run.
        assert_eq!((o.settling(), o.waiting_for_witness()), (0, 1));
        assert!(o.settle_due());
        c.mark = 0x7;
        o.conn(&c, 2);
        o.kernel.witness = Some([(leaving_as(&c.reply), seen_on_wan(0x7))].into());
        o.settle(1 + WITNESS_WAIT_NS);
        assert_eq!(o.len(), 0, "{:?}", o.stats);
        assert_eq!(o.stats.not_offloaded.get("kept_by_mark"), Some(&1));
        assert_eq!(o.waiting_for_witness(), 0, "no wait left behind");
        assert!(!o.settle_due());
        let other = masq_udp(CONFIRMED | SEEN_REPLY);
        let mut o = witnessed_offloader(&[&other], &[]);
        o.conn(&other, 1);
        o.destroy(&other);
        assert_eq!(
            o.stats
                .not_offloaded
                .get("closed_while_waiting_for_witness"),
            Some(&1)
        );
    }
}
