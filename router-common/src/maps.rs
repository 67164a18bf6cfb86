//! Map names and the layouts of map keys and values shared with the
//! controller.
//!
//! Every type is `#[repr(C)]`, built from fixed-width fields with explicit
//! padding fields (always zero), and asserted at compile time to have the
//! size its fields add up to, so `aya::Pod` is sound for it. Addresses are
//! kept as the four wire bytes (network order); ports, interface indexes
//! and times are host-order integers.

/// Per-CPU array of [`CounterValue`], indexed by [`Counter`].
pub const COUNTERS_MAP: &str = "COUNTERS";
/// `DEVMAP_HASH` of the attached interfaces, keyed by ifindex.
pub const DEVICES_MAP: &str = "DEVICES";
/// Single-entry array holding the [`Config`].
pub const CONFIG_MAP: &str = "CONFIG";
/// LRU hash of [`FlowKey`] -> [`FlowEntry`], two entries per flow.
pub const CONNTRACK_MAP: &str = "CONNTRACK";
/// Hash of [`PortForwardKey`] -> [`PortForwardTarget`].
pub const PORT_FORWARDS_MAP: &str = "PORT_FORWARDS";
/// LRU hash of [`FlowKey6`] -> [`FlowEntry6`]: the IPv6 flows, two
/// entries per flow. A map of its own rather than one key type for both
/// families: the IPv4 key stays 16 bytes and its hit path unchanged.
pub const CONNTRACK6_MAP: &str = "CONNTRACK6";
/// Hash of [`PinholeKey6`] -> `u8` (1): IPv6 pinholes, the LAN addresses
/// and ports the WAN may open flows to (standalone mode).
pub const PINHOLES6_MAP: &str = "PINHOLES6";
/// Hash of [`MappingKey`] -> [`Mapping`]: standalone mode's NAT mappings
/// by external port (RFC 4787 / 5382 endpoint-independent mapping). A
/// plain hash, not an LRU: its keys (protocol, port) are bounded by
/// [`MAX_NAT_MAPPINGS`], so it cannot fill up, and an expired mapping is
/// replaced in place by the next claim of its port.
pub const NAT_MAPPINGS_MAP: &str = "NAT_MAPPINGS";
/// LRU hash of [`Endpoint`] -> [`MappingKey`]: the external port of an
/// internal endpoint's mapping (valid only while that mapping is live and
/// still names the endpoint).
pub const NAT_ENDPOINTS_MAP: &str = "NAT_ENDPOINTS";
/// LRU hash of [`PermitKey`] -> [`Endpoint`]: address-dependent filtering's
/// permissions, a mapping's port and a remote address it has sent to.
pub const NAT_PERMITS_MAP: &str = "NAT_PERMITS";
/// Single-entry array of `u32`: the highest level the data path's debug
/// log (aya-log) writes, in aya-log's numbering (error 1 .. trace 5), 0
/// for none. Written by `router-ctl run`; not pinned: every loaded program
/// has its own, next to its own `AYA_LOGS` ring buffer.
pub const LOG_LEVEL_MAP: &str = "LOG_LEVEL";
/// Hash of [`VirtualMacKey`] -> `u8` ([`VMAC_IPV4`] | [`VMAC_IPV6`]): the
/// VRRP virtual MACs (RFC 5798 7.3) of keepalived `use_vmac` macvlans on
/// top of an attached interface, which the data path forwards frames to
/// besides the interface's own MAC, for the families the router is the
/// VRRP master of. Written by `attach` and `router-ctl run` from the
/// kernel's links and addresses; read only for a unicast frame not
/// addressed to the interface's own MAC.
pub const VIRTUAL_MACS_MAP: &str = "VIRTUAL_MACS";
/// LRU hash of [`FragmentKey`] -> [`FragmentXlat`]: the translation of
/// each IPv4 datagram whose first fragment the data path translated, for
/// its later fragments (which carry no ports). Not pinned: a record lives
/// for one datagram's reassembly time ([`FRAGMENT_TIMEOUT_NS`]).
pub const FRAGMENTS_MAP: &str = "FRAGMENTS";
/// LRU hash of [`FlowKey`] (as the packet arrives from the LAN) -> `u64`
/// (`CLOCK_MONOTONIC` ns of its last packet from the LAN): standalone
/// mode's LAN flows that the data path left to the kernel's slow-path NAT
/// because it could not open them (no free port among the candidates, the
/// reply tuple another flow's, a fragmented first datagram). Their later
/// packets go to the kernel too while the flow is live there
/// ([`crate::mapping::kernel_flow_live`]), so a flow keeps the kernel's
/// mapping instead of moving to one of the data path's mid-session (RFC
/// 4787 REQ-11). Pinned, so a replace keeps it.
pub const KERNEL_FLOWS_MAP: &str = "KERNEL_FLOWS";
/// Per-CPU array of one token bucket (answers left, `u64`, and the
/// `CLOCK_MONOTONIC` ns of its last fill, `u64`): the ICMP errors the data
/// path may still send itself (see [`Counter::DropTtlExceededAnswered`]). Not
/// pinned.
pub const ICMP_ANSWER_BUDGET_MAP: &str = "ICMP_ANSWER_BUDGET";
/// LRU hash of [`NextHopKey`] -> `u64` (`CLOCK_MONOTONIC` ns): the
/// neighbours the fast path forwarded to, and when it last asked the FIB
/// for one (a flow direction's next hop, about once a second). The kernel
/// never sees those packets, so it would leave such a neighbour's entry
/// STALE for good (`bpf_fib_lookup` neither confirms nor probes it): the
/// daemon has the kernel re-validate the STALE ones in use (`NTF_USE`,
/// what its own output path does on a STALE entry). Pinned, for the
/// daemon.
pub const NEXT_HOPS_MAP: &str = "NEXT_HOPS";
/// Array of `u32`, indexed by [`FlowEntry::route_mark`]: the routing marks
/// the data path's FIB lookups of offloaded IPv4 flows carry
/// (`BPF_FIB_LOOKUP_MARK`, Linux 6.10), so a connection the kernel routes
/// by its mark (multi-WAN, VPN bypass: a ct mark copied into the packets
/// and an `ip rule fwmark`) leaves by the same route on the fast path.
/// Slot 0 is never used (no mark). Written by the offload daemon, which
/// gives each mark it needs a slot and never reuses a slot for another
/// mark while the map lives. Pinned, so a replace and a restarted daemon
/// keep the slots the entries name.
pub const ROUTE_MARKS_MAP: &str = "ROUTE_MARKS";
/// LRU hash [`EgressKey`] -> [`EgressSeen`]: where the kernel sent a
/// connection's packets out of an attached interface, written by
/// [`EGRESS_WITNESS_PROGRAM`] (a tc egress program the offload daemon
/// attaches for as long as it runs). The daemon offloads a UDP or ICMP
/// connection only once one of its replies was seen leaving the inside
/// interface (conntrack calls a reply seen before the forward rules judge
/// it). With policy routing, it offloads a connection only where the
/// kernel's own packets of it left
/// by the interface and to the next hop the fast path's lookup gives: a
/// mark set on each packet, or restored with another mask than the
/// daemon assumes, changes the kernel's route without the daemon seeing
/// it in the connection's ct mark. Not pinned: the daemon's own.
pub const EGRESS_SEEN_MAP: &str = "EGRESS_SEEN";
/// Capacity of [`EGRESS_SEEN_MAP`]: connections' directions recently sent
/// by the kernel (an LRU: each packet's lookup keeps a live connection's
/// record; records of connections that ended give way).
pub const MAX_EGRESS_SEEN: u32 = 32_768;
/// Name of the tc egress program in the object that writes
/// [`EGRESS_SEEN_MAP`].
pub const EGRESS_WITNESS_PROGRAM: &str = "egress_witness";
/// Name of the XDP program in the object.
pub const PROGRAM_NAME: &str = "router";

/// Default conntrack capacity in flows; the map holds two entries per flow.
pub const DEFAULT_MAX_FLOWS: u32 = 262_144;
/// Default IPv6 conntrack capacity in flows (two entries per flow).
pub const DEFAULT_MAX_FLOWS6: u32 = 65_536;
/// Capacity of the IPv6 pinhole map.
pub const MAX_PINHOLES6: u32 = 1024;
/// Capacity of the mapping map: every (protocol, port) of TCP, UDP and
/// ICMP echo.
pub const MAX_NAT_MAPPINGS: u32 = 3 * 65_536;
/// Capacity of the endpoint -> mapping map (an LRU).
pub const MAX_NAT_ENDPOINTS: u32 = 262_144;
/// Capacity of the address-dependent filtering permissions (an LRU).
pub const MAX_NAT_PERMITS: u32 = 262_144;
/// Capacity of the virtual MAC map: a VRRP MAC per VRID and family on
/// each of the two interfaces.
pub const MAX_VIRTUAL_MACS: u32 = 2 * 2 * 256;
/// [`VIRTUAL_MACS_MAP`] value bits: the families accepted for a MAC.
pub const VMAC_IPV4: u8 = 1;
pub const VMAC_IPV6: u8 = 2;
/// Capacity of [`FRAGMENTS_MAP`]: fragmented datagrams in flight at once.
pub const MAX_FRAGMENTED_DATAGRAMS: u32 = 8192;
/// Capacity of [`KERNEL_FLOWS_MAP`]: LAN flows on the slow path at once
/// (an LRU: the oldest give way).
pub const MAX_KERNEL_FLOWS: u32 = 16_384;
/// How long after its first fragment a datagram's later fragments are
/// still translated: 5 s. A datagram's fragments travel together (ms
/// apart), while a record held as long as Linux's reassembly waits
/// (`ipfrag_time`, 30 s) would meet the identification's reuse sooner:
/// a busy sender's next datagram under the same identification to
/// another host is refused while the record lives.
pub const FRAGMENT_TIMEOUT_NS: u64 = 5_000_000_000;
/// Capacity of [`NEXT_HOPS_MAP`]: the neighbours in use at once (the LAN
/// hosts with flows and the gateways; an LRU: the least used give way).
pub const MAX_NEXT_HOPS: u32 = 4096;
/// Capacity of [`ROUTE_MARKS_MAP`], slot 0 included: the distinct marks
/// the fast path can route by (multi-WAN setups use a few; connections
/// with a mark beyond these stay in the kernel).
pub const MAX_ROUTE_MARKS: u32 = 256;
/// Capacity of the port-forward rule map.
pub const MAX_PORT_FORWARDS: u32 = 1024;

pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

/// Packets and bytes for one outcome, on one CPU. For event counters
/// ([`Counter::is_event`]) `packets` counts events and `bytes` is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterValue {
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(core::mem::size_of::<CounterValue>() == 16);

impl CounterValue {
    /// Both counts added, wrapping as the data path's counters do.
    #[must_use]
    pub const fn wrapping_add(self, o: Self) -> Self {
        Self {
            packets: self.packets.wrapping_add(o.packets),
            bytes: self.bytes.wrapping_add(o.bytes),
        }
    }
}

/// Controller-written configuration (the single entry of [`CONFIG_MAP`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub lan_ifindex: u32,
    pub wan_ifindex: u32,
    /// Masquerade source address, wire bytes.
    pub wan_addr: [u8; 4],
    /// SNAT port range, inclusive, host order.
    pub port_min: u16,
    pub port_max: u16,
    /// Random per attach: makes the chosen ports unpredictable from outside.
    pub hash_seed: u32,
    /// An [`Admit`] discriminant.
    pub admit: u8,
    /// A [`Filtering`] discriminant (standalone mode).
    pub filtering: u8,
    /// TCP MSS clamping of forwarded SYNs (standalone mode,
    /// [`crate::mss`]): the largest path MTU to clamp to, lowered further
    /// to the ingress and egress interfaces' MTUs;
    /// [`crate::mss::CLAMP_OFF`] (0, what older controllers wrote into the
    /// padding here): no clamping; [`crate::mss::CLAMP_PMTU`]: the
    /// interfaces' MTUs alone.
    pub mss_clamp_mtu: u16,
    pub timeouts: Timeouts,
    /// The LAN and the WAN interface's own MAC addresses: the data path
    /// forwards only frames addressed to the ingress interface's one, as
    /// the kernel does (see [`Counter::PassNotForUs`]).
    pub lan_mac: [u8; 6],
    pub wan_mac: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<Config>() == 68);

impl Config {
    /// Whether `addr` is the router's WAN address: never while the WAN has
    /// none (`wan_addr` 0.0.0.0, written by the daemon when a WAN with
    /// `--wan-addr auto` lost its address), so a packet to or from 0.0.0.0
    /// is never taken for the router's own.
    #[must_use]
    pub fn is_wan_addr(&self, addr: [u8; 4]) -> bool {
        self.has_wan_addr() && addr == self.wan_addr
    }

    /// Whether the WAN has an IPv4 address to masquerade to.
    #[must_use]
    pub fn has_wan_addr(&self) -> bool {
        self.wan_addr != [0; 4]
    }
}

/// A flow as seen in one direction on one interface. For ICMP echo both
/// ports hold the echo identifier, so [`FlowKey::reversed`] of the
/// translated request is the key of the reply.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey {
    pub src_addr: [u8; 4],
    pub dst_addr: [u8; 4],
    /// Host order.
    pub src_port: u16,
    /// Host order.
    pub dst_port: u16,
    pub proto: u8,
    /// Zero. A byte and a word rather than `[u8; 3]`: the BPF backend
    /// zeroes a 3-byte array with a call to a byte-loop `memset`.
    pub pad: u8,
    pub pad2: u16,
}
const _: () = assert!(core::mem::size_of::<FlowKey>() == 16);

impl FlowKey {
    #[must_use]
    pub const fn new(
        src_addr: [u8; 4],
        dst_addr: [u8; 4],
        src_port: u16,
        dst_port: u16,
        proto: u8,
    ) -> Self {
        Self {
            src_addr,
            dst_addr,
            src_port,
            dst_port,
            proto,
            pad: 0,
            pad2: 0,
        }
    }

    /// The same flow seen from the other end.
    #[must_use]
    pub const fn reversed(&self) -> Self {
        Self::new(
            self.dst_addr,
            self.src_addr,
            self.dst_port,
            self.src_port,
            self.proto,
        )
    }
}

/// What the data path does to a packet whose key matched, plus the flow's
/// bookkeeping. Both entries of a flow carry the same state and times.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowEntry {
    /// Key of the other direction's entry.
    pub peer: FlowKey,
    /// Header values after translation (addresses wire bytes, ports host order).
    pub new_src_addr: [u8; 4],
    pub new_dst_addr: [u8; 4],
    pub new_src_port: u16,
    pub new_dst_port: u16,
    /// A [`FlowState`] discriminant.
    pub state: u8,
    /// `FLAG_*` bits.
    pub flags: u8,
    /// An entry of a flow with a NAT mapping ([`FLAG_MAPPED`]): the
    /// [`crate::mapping::refresh_tick`] of the last refresh of the mapping
    /// through this entry. Written at every such refresh: an outbound
    /// packet's (LAN side), and a TCP state change's of the segment's own
    /// entry (so also a WAN-side entry, at a WAN-side state change);
    /// never by [`Self::last_seen_ns`]'s refresh from the other direction.
    /// Read on the LAN side only ([`crate::mapping::outbound_refresh_due`]),
    /// so outbound packets refresh the mapping about once per tick
    /// whichever direction keeps the flow alive (RFC 4787 REQ-6); a
    /// WAN-side entry's is written but never read. It took the place of
    /// two padding bytes: the entry stays 96 bytes.
    pub out_tick: u16,
    /// `bpf_ktime_get_coarse_ns` (`CLOCK_MONOTONIC`) of the last refresh.
    pub last_seen_ns: u64,
    pub created_ns: u64,
    /// Next hop of this direction cached from the FIB, so established
    /// flows skip `bpf_fib_lookup`: egress ifindex (0 = nothing cached), the
    /// egress MTU and the MACs to write. Looked up again at each refresh
    /// (every `REFRESH_NS`), so a route or neighbour change takes effect
    /// within that interval.
    pub hop_ifindex: u32,
    pub hop_mtu: u16,
    pub hop_dmac: [u8; 6],
    pub hop_smac: [u8; 6],
    /// Offloaded flows only: the slot in [`ROUTE_MARKS_MAP`] of the mark
    /// this flow's FIB lookups carry (both directions: the kernel routes
    /// the connection's packets with its mark); 0: none, the lookup
    /// carries no mark. It took the place of two padding bytes.
    pub route_mark: u16,
    /// Offloaded flows only ([`FLAG_OFFLOADED`]): the data path carries the
    /// flow until this time, in [`LEASE_TICK_SHIFT`] ticks of
    /// `CLOCK_MONOTONIC`; after it, packets go to the kernel. The offload
    /// daemon extends it while the kernel's entry lives; a stopped daemon
    /// lets it run out, so the kernel, which keeps the flow's state, takes
    /// the flow back before its own entry can expire.
    /// [`LEASE_HANDED_BACK`]: the data path passed one of the flow's TCP
    /// SYN/FIN/RST to the kernel, which carries the rest of the connection.
    pub lease: u32,
    /// What the RST/FIN window check needs of the segments this direction
    /// sends (TCP only; see [`crate::flow::tcp_control`]).
    pub tcp: TcpWindow,
    /// What the data path forwarded in this direction (see [`FlowCount`]).
    pub count: FlowCount,
}
const _: () = assert!(core::mem::size_of::<FlowEntry>() == 96);

/// Packets and bytes of one direction of a flow that the data path took
/// as the flow's: hits past the offload checks, and a new flow's first
/// packet; bytes are IP bytes (header included, Ethernet not), as
/// netfilter's conntrack accounting counts them. An offloaded flow's
/// packets that go to the kernel (TCP FIN/SYN/RST, past the lease) are not
/// counted here: the kernel's conntrack counts those. (The rare hit that
/// the FIB then hands to the kernel, for the MTU or an unresolved
/// neighbour, is counted.) Each direction has its own entry, so a direction's
/// packets, which RSS steers to one CPU, write to one cache line that no
/// other CPU writes per packet; the add is a plain one (no atomic): two
/// CPUs forwarding the same direction at once may rarely lose a count.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowCount {
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(core::mem::size_of::<FlowCount>() == 16);

impl FlowCount {
    /// One more packet of `bytes` IP bytes.
    #[inline]
    pub const fn add(&mut self, bytes: u64) {
        self.packets = self.packets.wrapping_add(1);
        self.bytes = self.bytes.wrapping_add(bytes);
    }
}

/// TCP window tracking of one direction of a flow: what its sender
/// acknowledged and advertised, so that a RST or FIN from the other side
/// can be judged against the receiver's window (RFC 5961 3.2 / 4.2, as
/// netfilter's `tcp_in_window` does). Written coarsely (see
/// [`crate::flow::tcp_observe`]), not per packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpWindow {
    /// The highest acknowledgement number this direction sent, recorded
    /// when it moved by a step ([`crate::flow::ack_step`]) or at a refresh,
    /// so it lags the true one by less than a step. Of the answering
    /// direction before its SYN+ACK: the end of the opening SYN, the
    /// acknowledgement it must send.
    pub ack: u32,
    /// The largest window this direction advertised, in its units of
    /// `1 << wscale` bytes. Of the answering direction before its SYN+ACK:
    /// the opening SYN's payload bytes (see `flow::syn_answerer`).
    pub win: u16,
    /// Window scale shift of this direction's advertisements (RFC 7323),
    /// 0 when scaling is off; of the opening direction before the SYN+ACK,
    /// the shift its SYN offered or `flow::NO_WSCALE`.
    pub wscale: u8,
    /// `TCP_TRACK_*` bits.
    pub flags: u8,
}
const _: () = assert!(core::mem::size_of::<TcpWindow>() == 8);

/// [`TcpWindow::ack`] and [`TcpWindow::win`] hold values: a segment towards
/// this direction can be judged. Without it (an entry rebuilt after an
/// eviction, written by a controller) RST and FIN are taken as they come.
pub const TCP_TRACK_KNOWN: u8 = 1;
/// This direction's opening SYN was seen: its window and offered shift
/// are in [`TcpWindow`], waiting for the SYN+ACK.
pub const TCP_TRACK_SYN: u8 = 2;
/// Of the answering direction before its SYN+ACK: [`TcpWindow::ack`] is
/// the acknowledgement it must send, not one it sent; its segments do not
/// move it.
pub const TCP_TRACK_EXPECT: u8 = 4;
/// The window scale ([`TcpWindow::wscale`]) is known, the acknowledgement
/// and window not yet: an offloaded connection's entry, whose handshake
/// the kernel saw and the data path did not (the offload daemon writes the
/// shift from the kernel's conntrack). The first ACK segment this
/// direction sends fills [`TcpWindow::ack`] and [`TcpWindow::win`] and
/// makes it [`TCP_TRACK_KNOWN`] (`flow::tcp_observe`).
pub const TCP_TRACK_LEARN: u8 = 8;

/// [`FlowEntry::lan_side`] of an entry with `flags` (an IPv6 entry's too:
/// it never has [`FLAG_HAIRPIN`]).
#[must_use]
pub const fn lan_side_of(flags: u8) -> bool {
    (flags & FLAG_ORIGINAL != 0) != (flags & FLAG_PORT_FORWARD != 0) || flags & FLAG_HAIRPIN != 0
}

impl FlowEntry {
    /// Whether packets matching this entry's key arrive on the LAN: the
    /// opening direction of a masqueraded flow, or the answering direction
    /// of a port-forwarded one. The data path uses an entry only on its own
    /// side, so a tuple replayed on the other interface is no hit.
    #[must_use]
    pub const fn lan_side(&self) -> bool {
        lan_side_of(self.flags)
    }

    /// Forgets the cached next hop (the FIB is asked on the next packet).
    #[inline]
    pub const fn clear_next_hop(&mut self) {
        self.hop_ifindex = 0;
        self.hop_mtu = 0;
        self.hop_dmac = [0; 6];
        self.hop_smac = [0; 6];
    }
}

/// The entry is keyed by the direction that opened the flow.
pub const FLAG_ORIGINAL: u8 = 1;
/// The flow was opened from the WAN through a port-forward rule.
pub const FLAG_PORT_FORWARD: u8 = 2;
/// TCP FIN seen from the opening side.
pub const FLAG_FIN_ORIG: u8 = 4;
/// TCP FIN seen from the answering side.
pub const FLAG_FIN_REPLY: u8 = 8;
/// Admitted by the kernel (offload mode) and written by the offload
/// daemon: the kernel's conntrack holds the flow's state and NAT mapping.
/// TCP FIN and RST go to the kernel, and the entry is used only within its
/// [`FlowEntry::lease`].
pub const FLAG_OFFLOADED: u8 = 16;
/// Standalone mode: the flow holds a NAT mapping (a masqueraded flow, one
/// opened from the WAN through a mapping, a hairpinned one): outbound
/// packets (LAN-side hits) refresh the mapping about once a second
/// ([`FlowEntry::out_tick`]), and a TCP state change from either side sets
/// its expiry from the new state (see [`crate::mapping`]).
pub const FLAG_MAPPED: u8 = 32;
/// Hairpinned flow (LAN host to the WAN address, back to a LAN host): both
/// entries are keyed on the LAN side.
pub const FLAG_HAIRPIN: u8 = 64;

/// A lease tick is `1 << LEASE_TICK_SHIFT` ns (about 1.07 s): a `u32` of
/// ticks lasts 146 years of uptime.
pub const LEASE_TICK_SHIFT: u32 = 30;

/// The lease of an offloaded flow the data path handed back to the kernel
/// at a TCP SYN, FIN or RST: over for good (tick 0 is the first second of
/// uptime), and never extended by the daemon, which removes the entries.
pub const LEASE_HANDED_BACK: u32 = 0;

/// The lease of an offloaded flow's entries between the daemon's write and
/// its activation: the data path passes every packet to the kernel
/// untouched (`pass_offload_pending`), and a TCP SYN, FIN or RST hands the
/// pair back ([`LEASE_HANDED_BACK`]) as for a live lease. The daemon then
/// checks the kernel's connection again and activates the entries with a
/// compare-and-swap of this value to the real lease ([`crate::lease_cas`]),
/// which fails if the data path handed them back meanwhile. Tick 1 is in
/// the past for every packet after the first seconds of uptime, and no
/// real lease is this small.
pub const LEASE_PENDING: u32 = 1;

/// The lease tick of a `CLOCK_MONOTONIC` time in ns.
#[must_use]
#[inline]
pub const fn lease_tick(now_ns: u64) -> u32 {
    (now_ns >> LEASE_TICK_SHIFT) as u32
}

/// Who opens new flows (`Config::admit`).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Standalone: the data path masquerades new LAN flows and opens
    /// port-forwarded ones itself.
    Xdp = 0,
    /// Offload: the kernel (netfilter) admits every flow; the data path
    /// carries only what the offload daemon wrote, and passes misses.
    Kernel = 1,
}

/// Which unsolicited inbound packets an active mapping lets in (standalone
/// mode; RFC 4787 section 5, RFC 5382 section 4.3), `Config::filtering`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filtering {
    /// Only replies of a known flow (the remote address and port the
    /// internal endpoint sent to): Linux's behaviour, the default.
    AddressPortDependent = 0,
    /// Also new flows from any port of a remote address the mapping has
    /// sent to.
    AddressDependent = 1,
    /// New flows from any remote ("full cone").
    EndpointIndependent = 2,
}

impl Filtering {
    pub const ALL: [Self; 3] = [
        Self::AddressPortDependent,
        Self::AddressDependent,
        Self::EndpointIndependent,
    ];

    /// The name on the command line, in `apply` files and in `status`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::AddressPortDependent => "address-port-dependent",
            Self::AddressDependent => "address-dependent",
            Self::EndpointIndependent => "endpoint-independent",
        }
    }

    /// The setting of a `Config::filtering` byte; an unknown byte is the
    /// strictest.
    #[must_use]
    pub const fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::AddressDependent,
            2 => Self::EndpointIndependent,
            _ => Self::AddressPortDependent,
        }
    }
}

/// Key of [`NAT_MAPPINGS_MAP`]: protocol and external port (host order) on
/// the WAN address; for ICMP echo the external identifier.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MappingKey {
    pub proto: u8,
    pub pad: u8,
    pub port: u16,
}
const _: () = assert!(core::mem::size_of::<MappingKey>() == 4);

/// An internal endpoint: LAN address, port (host order) and protocol.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub addr: [u8; 4],
    pub port: u16,
    pub proto: u8,
    pub pad: u8,
}
const _: () = assert!(core::mem::size_of::<Endpoint>() == 8);

/// A NAT mapping: the internal endpoint an external port belongs to, until
/// `expires_ns` (`CLOCK_MONOTONIC`; see [`crate::mapping`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mapping {
    /// The internal endpoint. Its `pad` byte is the setter's tag: the
    /// [`crate::mapping::remote_tag`] of the flow whose refresh set
    /// `expires_ns` (only that flow lowers it, see
    /// [`crate::mapping::refreshed_mapping`]), never 0; 0: the setter is
    /// unknown (written by an older build); every comparison of the
    /// endpoint goes through [`Endpoint::bits`], which leaves it out, and
    /// `NAT_ENDPOINTS` keys and `NAT_PERMITS` values keep it 0.
    pub internal: Endpoint,
    pub expires_ns: u64,
}
const _: () = assert!(core::mem::size_of::<Mapping>() == 16);

/// Key of [`NAT_PERMITS_MAP`]: a mapping (protocol, external port) and a
/// remote address it has sent to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PermitKey {
    pub remote: [u8; 4],
    pub port: u16,
    pub proto: u8,
    pub pad: u8,
}
const _: () = assert!(core::mem::size_of::<PermitKey>() == 8);

/// Key of [`PORT_FORWARDS_MAP`]: protocol and WAN port (host order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortForwardKey {
    pub proto: u8,
    pub pad: u8,
    pub port: u16,
}
const _: () = assert!(core::mem::size_of::<PortForwardKey>() == 4);

/// Key of [`FRAGMENTS_MAP`]: a fragmented datagram as it arrived (RFC 791:
/// source, destination, protocol and identification name the datagram
/// whose fragments a receiver reassembles), and the side it came in on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FragmentKey {
    pub src_addr: [u8; 4],
    pub dst_addr: [u8; 4],
    /// The identification field, wire bytes.
    pub id: [u8; 2],
    pub proto: u8,
    /// 1 when it came in on the LAN interface, else 0.
    pub from_lan: u8,
}
const _: () = assert!(core::mem::size_of::<FragmentKey>() == 12);

/// Value of [`FRAGMENTS_MAP`]: the addresses the datagram's first fragment
/// was translated to (the later fragments get the same), and when.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FragmentXlat {
    pub new_src_addr: [u8; 4],
    pub new_dst_addr: [u8; 4],
    /// `bpf_ktime_get_coarse_ns` of the first fragment.
    pub first_ns: u64,
}
const _: () = assert!(core::mem::size_of::<FragmentXlat>() == 16);

/// Key of [`NEXT_HOPS_MAP`]: a neighbour the fast path forwards to, as
/// the kernel's neighbour table names it (the interface and the next hop's
/// address: the gateway, or the destination on a link route).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NextHopKey {
    pub ifindex: u32,
    /// `AF_INET` (the address in the first 4 bytes, the rest zero) or
    /// `AF_INET6`.
    pub family: u32,
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<NextHopKey>() == 24);

/// Key of [`EGRESS_SEEN_MAP`]: a packet as it leaves (after the kernel's
/// NAT), in the layout of [`FlowKey6`]; an IPv4 packet's addresses as
/// IPv4-mapped IPv6 addresses (`::ffff:a.b.c.d`). For ICMP echo both
/// ports hold the identifier.
pub type EgressKey = FlowKey6;

/// Value of [`EGRESS_SEEN_MAP`]: how the kernel sent the packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct EgressSeen {
    /// The interface it left by.
    pub ifindex: u32,
    /// Its mark (`skb->mark`) as it left.
    pub mark: u32,
    /// The next hop it was sent to: its destination MAC.
    pub dst_mac: [u8; 6],
    /// Zero.
    pub pad: u16,
}
const _: () = assert!(core::mem::size_of::<EgressSeen>() == 16);

/// Key of [`VIRTUAL_MACS_MAP`]: an attached interface and a MAC that frames
/// arriving on it may be addressed to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VirtualMacKey {
    pub ifindex: u32,
    pub mac: [u8; 6],
    /// Zero.
    pub pad: u16,
}
const _: () = assert!(core::mem::size_of::<VirtualMacKey>() == 12);

impl VirtualMacKey {
    #[must_use]
    pub const fn new(ifindex: u32, mac: [u8; 6]) -> Self {
        Self {
            ifindex,
            mac,
            pad: 0,
        }
    }
}

/// Where a port-forward rule sends new inbound flows.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortForwardTarget {
    pub addr: [u8; 4],
    /// Host order.
    pub port: u16,
    pub pad: u16,
}
const _: () = assert!(core::mem::size_of::<PortForwardTarget>() == 8);

/// An IPv6 flow as seen in one direction (routed: the key of the other
/// direction is [`FlowKey6::reversed`]). For `ICMPv6` echo both ports hold
/// the identifier.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowKey6 {
    pub src_addr: [u8; 16],
    pub dst_addr: [u8; 16],
    /// Host order.
    pub src_port: u16,
    /// Host order.
    pub dst_port: u16,
    pub proto: u8,
    pub pad: u8,
    pub pad2: u16,
}
const _: () = assert!(core::mem::size_of::<FlowKey6>() == 40);

impl FlowKey6 {
    #[must_use]
    pub const fn new(
        src_addr: [u8; 16],
        dst_addr: [u8; 16],
        src_port: u16,
        dst_port: u16,
        proto: u8,
    ) -> Self {
        Self {
            src_addr,
            dst_addr,
            src_port,
            dst_port,
            proto,
            pad: 0,
            pad2: 0,
        }
    }

    /// The same flow seen from the other end: the other entry's key.
    #[must_use]
    pub const fn reversed(&self) -> Self {
        Self::new(
            self.dst_addr,
            self.src_addr,
            self.dst_port,
            self.src_port,
            self.proto,
        )
    }
}

/// One direction of an IPv6 flow: no translation, only the flow's state,
/// times and the cached next hop (as in [`FlowEntry`]). `flags` are the
/// same `FLAG_*` bits: [`FLAG_ORIGINAL`] on the opening direction,
/// [`FLAG_PORT_FORWARD`] on both entries of a flow opened through a
/// pinhole (or, offloaded, whose original direction came from the WAN),
/// [`FLAG_OFFLOADED`] on a flow the kernel admitted and the offload daemon
/// wrote.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowEntry6 {
    /// `bpf_ktime_get_coarse_ns` of the last refresh.
    pub last_seen_ns: u64,
    pub created_ns: u64,
    /// A [`FlowState`] discriminant.
    pub state: u8,
    pub flags: u8,
    /// Cached next hop (see [`FlowEntry::hop_ifindex`]); 0 = nothing.
    pub hop_mtu: u16,
    pub hop_ifindex: u32,
    pub hop_dmac: [u8; 6],
    pub hop_smac: [u8; 6],
    /// Offloaded flows only: the end of the lease, as
    /// [`FlowEntry::lease`] (same ticks, same semantics).
    pub lease: u32,
    /// What the RST/FIN window check needs of the segments this direction
    /// sends, as [`FlowEntry::tcp`] (TCP only).
    pub tcp: TcpWindow,
    /// What the data path forwarded in this direction (see [`FlowCount`]).
    pub count: FlowCount,
}
const _: () = assert!(core::mem::size_of::<FlowEntry6>() == 64);

impl FlowEntry6 {
    /// Whether packets matching this entry's key arrive on the LAN (see
    /// [`FlowEntry::lan_side`]).
    #[must_use]
    pub const fn lan_side(&self) -> bool {
        (self.flags & FLAG_ORIGINAL != 0) != (self.flags & FLAG_PORT_FORWARD != 0)
    }
}

/// Key of [`PINHOLES6_MAP`]: a LAN host's address, protocol and port that
/// the WAN may open flows to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PinholeKey6 {
    pub addr: [u8; 16],
    /// Host order.
    pub port: u16,
    pub proto: u8,
    pub pad: u8,
}
const _: () = assert!(core::mem::size_of::<PinholeKey6>() == 20);

#[cfg(feature = "user")]
mod pod {
    // SAFETY (all): repr(C), only integer and byte-array fields, no implicit
    // padding (sizes asserted above).
    unsafe impl aya::Pod for super::CounterValue {}
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::FlowEntry {}
    unsafe impl aya::Pod for super::FlowCount {}
    unsafe impl aya::Pod for super::PortForwardKey {}
    unsafe impl aya::Pod for super::PortForwardTarget {}
    unsafe impl aya::Pod for super::FlowKey6 {}
    unsafe impl aya::Pod for super::EgressSeen {}
    unsafe impl aya::Pod for super::FlowEntry6 {}
    unsafe impl aya::Pod for super::PinholeKey6 {}
    unsafe impl aya::Pod for super::VirtualMacKey {}
    unsafe impl aya::Pod for super::NextHopKey {}
    unsafe impl aya::Pod for super::MappingKey {}
    unsafe impl aya::Pod for super::Endpoint {}
    unsafe impl aya::Pod for super::Mapping {}
    unsafe impl aya::Pod for super::PermitKey {}
    unsafe impl aya::Pod for super::FragmentKey {}
    unsafe impl aya::Pod for super::FragmentXlat {}
}

/// Defines the flow states from one table: the [`FlowState`] enum, the
/// [`Timeouts`] struct (one `u32` field per state, in state order, then
/// `pad`), its defaults, and the names `conntrack list` shows and
/// `--timeout` / `[timeouts]` accept. A state is added or renamed here
/// only. Each row: index (discriminant - 1) => variant, `Timeouts`
/// field, `--timeout` key, `conntrack list` name, default seconds.
/// `fallback` names the field whose timeout an unknown state byte gets;
/// its row is marked `fallback` too.
macro_rules! flow_states {
    (
        fallback $fallback:ident;
        $( $(#[$doc:meta])* $index:literal => $variant:ident, $field:ident,
           $key:literal, $name:literal, $default:literal $(, $is_fallback:ident)?; )*
    ) => {
        /// A flow's state; the idle timeout depends on it.
        #[repr(u8)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum FlowState {
            $( $(#[$doc])* $variant = $index + 1, )*
        }

        /// Idle timeouts in seconds, per flow state. Defaults follow
        /// netfilter's (`nf_conntrack_tcp_timeout_*`,
        /// `nf_conntrack_udp_timeout*`, `nf_conntrack_icmp_timeout`). With
        /// the `serde` feature it serializes with the `--timeout` names as
        /// keys (`pad` left out).
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        pub struct Timeouts {
            $( $(#[$doc])* #[cfg_attr(feature = "serde", serde(rename = $key))] pub $field: u32, )*
            #[cfg_attr(feature = "serde", serde(skip))]
            pub pad: u32,
        }

        impl Default for Timeouts {
            fn default() -> Self {
                Self { $( $field: $default, )* pad: 0 }
            }
        }

        impl Timeouts {
            /// The timeout of `state`, in seconds.
            #[must_use]
            pub const fn get(&self, state: FlowState) -> u32 {
                match state { $( FlowState::$variant => self.$field, )* }
            }

            /// Sets the timeout of `state`.
            pub const fn set(&mut self, state: FlowState, secs: u32) {
                match state { $( FlowState::$variant => self.$field = secs, )* }
            }
        }

        impl FlowState {
            /// Every state, in discriminant order.
            pub const ALL: &'static [FlowState] = &[$(FlowState::$variant),*];
            /// The `--timeout` names of [`FlowState::ALL`], comma-separated
            /// (help texts and error messages).
            pub const KEYS: &'static str = flow_states!(@join $($key),*);

            #[must_use]
            pub const fn from_u8(v: u8) -> Option<Self> {
                match v.wrapping_sub(1) {
                    $( $index => Some(Self::$variant), )*
                    _ => None,
                }
            }

            /// The name `--timeout STATE=SECS` and the `[timeouts]` table
            /// of `apply` use (`tcp-syn-sent`).
            #[must_use]
            pub const fn key(self) -> &'static str {
                match self { $( Self::$variant => $key, )* }
            }

            /// The state named `key` (see [`FlowState::key`]).
            #[must_use]
            pub fn from_key(key: &str) -> Option<Self> {
                match key {
                    $( $key => Some(Self::$variant), )*
                    _ => None,
                }
            }

            /// Idle timeout in seconds. An unknown state gets the
            /// `fallback` one.
            #[must_use]
            pub const fn timeout_secs(state: u8, t: &Timeouts) -> u32 {
                // Index masked to 0..=7 before use: the compiler turns the
                // match into an offset computation, and the BPF
                // verifier must see that offset bounded on the very
                // register that is used.
                // The fallback state has no arm of its own (its pattern
                // cannot match after the mask): with it in the default arm
                // LLVM computes the offset linearly, with an arm of its own
                // it emits a tree of branches.
                match state.wrapping_sub(1) & 7 {
                    $( flow_states!(@index $index $($is_fallback)?) => t.$field, )*
                    _ => t.$fallback,
                }
            }

            /// Name shown by `router-ctl conntrack list`.
            #[must_use]
            pub const fn name(state: u8) -> &'static str {
                match Self::from_u8(state) {
                    $( Some(Self::$variant) => $name, )*
                    None => "UNKNOWN",
                }
            }
        }
    };
    (@index $index:literal) => { $index };
    (@index $index:literal fallback) => { 8..=u8::MAX };
    (@join $first:literal $(, $rest:literal)*) => { concat!($first $(, ", ", $rest)*) };
}

flow_states! {
    fallback tcp_closed;
    0 => TcpSynSent, tcp_syn_sent, "tcp-syn-sent", "SYN_SENT", 120;
    1 => TcpEstablished, tcp_established, "tcp-established", "ESTABLISHED", 432_000;
    /// One side sent FIN.
    2 => TcpFinWait, tcp_fin_wait, "tcp-fin-wait", "FIN_WAIT", 120;
    /// RST seen, or FIN from both sides.
    3 => TcpClosed, tcp_closed, "tcp-closed", "CLOSED", 10, fallback;
    /// UDP flow that has seen packets in one direction only.
    4 => UdpUnreplied, udp_unreplied, "udp-unreplied", "UNREPLIED", 30;
    /// UDP flow that has seen a reply ("stream" in netfilter).
    5 => UdpReplied, udp_replied, "udp-replied", "REPLIED", 120;
    6 => Icmp, icmp, "icmp", "ICMP", 30;
}
const _: () = assert!(core::mem::size_of::<Timeouts>() == 32);

macro_rules! counters {
    ($( $(#[$doc:meta])* $variant:ident = $name:literal, $event:literal; )*) => {
        /// One outcome of the data path, the index into [`COUNTERS_MAP`].
        /// Every packet moves exactly one verdict counter; event counters
        /// (`is_event`) count things that happened on the way.
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Counter {
            $( $(#[$doc])* $variant, )*
        }

        impl Counter {
            /// All counters in index order.
            pub const ALL: &'static [Counter] = &[$(Counter::$variant),*];
            /// Number of counters (size of the counter map).
            #[expect(clippy::cast_possible_truncation, reason = "a few dozen counters")]
            pub const COUNT: u32 = Self::ALL.len() as u32;

            /// Stable name used by `router-ctl stats` and its JSON.
            #[must_use]
            pub const fn name(self) -> &'static str {
                match self { $(Counter::$variant => $name,)* }
            }

            /// Whether this counts events rather than packet verdicts.
            #[must_use]
            pub const fn is_event(self) -> bool {
                match self { $(Counter::$variant => $event,)* }
            }
        }
    };
}

counters! {
    /// LAN -> WAN packet translated and redirected by the fast path.
    FwdOutbound = "fwd_outbound", false;
    /// WAN -> LAN packet (reply, port-forwarded, ICMP error) translated and redirected.
    FwdInbound = "fwd_inbound", false;
    /// Neither IPv4 nor IPv6 (ARP, VLAN-tagged...): the kernel handles it.
    PassNotIpv4 = "pass_not_ipv4", false;
    /// IPv4 header with options of no flow the data path carries (or TTL
    /// <= 1, a wrong checksum, a fragment): left to the kernel. See
    /// `fwd_ip_options`.
    PassIpOptions = "pass_ip_options", false;
    /// IPv4 fragment the data path does not carry (a TCP header split over
    /// fragments, a fragmented TCP SYN, FIN or RST, of no flow it carries
    /// or an offloaded one, a later fragment before its first or past
    /// `FRAGMENT_TIMEOUT_NS`, a first fragment under another translation's
    /// live record, one without a neighbour): the kernel reassembles it.
    /// See `fwd_fragment`.
    PassFragment = "pass_fragment", false;
    /// TTL <= 1: the kernel sends ICMP time exceeded (RFC 1812 5.3.1), or
    /// takes a packet addressed to the router as its own. (A WAN packet of
    /// a flow the data path carries is answered by it: `drop_ttl_exceeded_answered`.)
    PassTtlExceeded = "pass_ttl_exceeded", false;
    /// Not TCP/UDP, or an ICMP type the fast path does not translate.
    PassProtocol = "pass_protocol", false;
    /// LAN packet of no known flow that cannot open one (TCP without SYN,
    /// traffic not bound for the WAN).
    PassNoFlow = "pass_no_flow", false;
    /// WAN packet of no known flow and no port-forward rule (also ICMP
    /// errors about no known flow) addressed to the router itself: the
    /// kernel's local stack answers. (Standalone mode drops such packets
    /// when they are addressed to a LAN host: `drop_unsolicited`.)
    PassUnsolicited = "pass_unsolicited", false;
    /// Offload mode: no offloaded flow matches; the kernel admits and
    /// forwards it (the daemon offloads the flow once it is eligible).
    PassNotOffloaded = "pass_not_offloaded", false;
    /// TCP FIN, RST or SYN of an offloaded flow: the kernel must see it.
    PassOffloadTcpControl = "pass_offload_tcp_control", false;
    /// Offloaded flow whose lease ran out (no daemon renewing it): the
    /// kernel carries it.
    PassLeaseExpired = "pass_lease_expired", false;
    /// Offloaded TCP flow handed back to the kernel by one of its SYN, FIN
    /// or RST (`pass_offload_tcp_control`): the kernel carries the rest of
    /// the connection (the final ACKs, a new connection on the same ports)
    /// until the daemon removes the entries.
    PassOffloadHandedBack = "pass_offload_handed_back", false;
    /// Offloaded flow whose entries the daemon has written but not yet
    /// activated ([`LEASE_PENDING`]): the kernel carries the packet.
    PassOffloadPending = "pass_offload_pending", false;
    /// Every probed SNAT port was taken.
    PassPortsExhausted = "pass_ports_exhausted", false;
    /// Destination is local, blackholed or unreachable per the FIB, or not
    /// one a router forwards to (multicast, broadcast, 0/8, 127/8); or a
    /// source no router forwards from (the same ranges, RFC 1812 5.3.7;
    /// IPv6: multicast or loopback either way, which the FIB refuses).
    PassFibNotForwarded = "pass_fib_not_forwarded", false;
    /// Forwarding disabled on the ingress device.
    PassFibForwardingDisabled = "pass_fib_forwarding_disabled", false;
    /// Next hop has no neighbour entry: passed translated (TTL untouched)
    /// so that the kernel forwards it and resolves ARP; LAN -> WAN packets
    /// too, which the kernel accepts because attach (standalone) sets
    /// `accept_local` on the LAN interface. Only an offloaded flow's
    /// packets are passed untranslated (the kernel's conntrack translates
    /// them).
    PassNoNeighbour = "pass_no_neighbour", false;
    /// Packet exceeds the egress MTU, passed untranslated: the kernel
    /// fragments it or sends ICMP fragmentation needed. A flow's packet the
    /// data path carries is finished off the hit path instead (passed
    /// translated, `pass_mtu_translated`, or answered,
    /// `drop_frag_needed_answered`); this stays for a LAN packet with DF
    /// set to the WAN, a new flow's first packet (but a port forward's with
    /// DF set), an offloaded flow's, a frame larger than the link it came
    /// in on (in generic mode, packets merged below its interface: GRO or
    /// LRO on a lower device or a bridge's ports, a local sender's TSO),
    /// fragments, packets
    /// with IP options and ICMP errors, and a packet for which the FIB's
    /// second answer differs (a route changed between the two lookups, an
    /// MTU it does not report or below 68).
    PassMtu = "pass_mtu", false;
    /// Egress interface is not one of the attached ones.
    PassEgressNotAttached = "pass_egress_not_attached", false;
    /// No configuration written yet.
    PassNotConfigured = "pass_not_configured", false;
    /// Frame shorter than its headers.
    DropTruncated = "drop_truncated", false;
    /// IHL < 5, version != 4, total length inconsistent with the frame,
    /// L4 header cut short, TCP data offset < 5.
    DropMalformed = "drop_malformed", false;
    /// IPv4 header checksum wrong: silently discarded (RFC 1812 5.2.2).
    DropIpChecksum = "drop_ip_checksum", false;
    /// Standalone mode: a WAN packet of no known flow and no port-forward
    /// rule that the FIB would forward to the LAN (not addressed to the
    /// router itself): XDP is the router's whole forward policy.
    DropUnsolicited = "drop_unsolicited", false;
    /// New LAN -> WAN flow masqueraded.
    FlowNewMasquerade = "flow_new_masquerade", true;
    /// New WAN -> LAN flow through a port-forward rule.
    FlowNewPortForward = "flow_new_port_forward", true;
    /// SNAT port probe that found the port taken.
    PortCollision = "port_collision", true;
    /// A stale entry was replaced by a new flow: idle past its timeout, or
    /// orphaned (its other half evicted or taken over), so no packet could
    /// use it any more.
    FlowExpiredReplaced = "flow_expired_replaced", true;
    /// A flow's other entry was missing (evicted by the LRU) and was put
    /// back. A lower bound on LRU evictions: only noticed on refresh.
    EvictionDetected = "eviction_detected", true;
    /// ICMP error whose embedded header was translated (RFC 5508).
    IcmpErrorTranslated = "icmp_error_translated", true;
    /// Conntrack entries the data path added (new keys only).
    CtEntriesInserted = "ct_entries_inserted", true;
    /// Conntrack entries the data path deleted (stale ones it reclaimed).
    CtEntriesRemoved = "ct_entries_removed", true;
    /// Conntrack entries `router-ctl conntrack flush` deleted. Written by
    /// the controller only (CPU 0's slot), never by the data path. With the
    /// two above and the entries present it estimates the LRU's evictions.
    CtEntriesFlushed = "ct_entries_flushed", true;
    /// TCP RST, FIN or SYN+ACK that the receiver would not accept (outside
    /// its window, or not acknowledging what it sent): the flow's state
    /// stays as it was; the segment is forwarded all the same (netfilter's
    /// default for such segments is to accept, not drop, them).
    TcpOutOfWindow = "tcp_out_of_window", true;
    /// IPv6 packet of a flow forwarded LAN -> WAN.
    Fwd6Outbound = "fwd6_outbound", false;
    /// IPv6 packet forwarded WAN -> LAN (reply, pinhole, `ICMPv6` error).
    Fwd6Inbound = "fwd6_inbound", false;
    /// IPv6 with link scope (link-local or unspecified source, link-local
    /// or multicast destination): never routed, the kernel's.
    Pass6LinkScope = "pass6_link_scope", false;
    /// `ICMPv6` router/neighbour solicitation, advertisement or redirect.
    Pass6Ndp = "pass6_ndp", false;
    /// `ICMPv6` multicast listener discovery.
    Pass6Mld = "pass6_mld", false;
    /// IPv6 hop-by-hop options header.
    Pass6ExtHopByHop = "pass6_ext_hop_by_hop", false;
    /// IPv6 routing header.
    Pass6ExtRouting = "pass6_ext_routing", false;
    /// IPv6 fragment header.
    Pass6ExtFragment = "pass6_ext_fragment", false;
    /// IPv6 destination options header.
    Pass6ExtDestOpts = "pass6_ext_dest_opts", false;
    /// `IPsec` ESP (encapsulating security payload).
    Pass6ExtEsp = "pass6_ext_esp", false;
    /// `IPsec` AH (authentication header).
    Pass6ExtAh = "pass6_ext_ah", false;
    /// Mobility, HIP, Shim6 or experimental extension header.
    Pass6ExtOther = "pass6_ext_other", false;
    /// Hop limit <= 1: the kernel sends time exceeded.
    Pass6HopLimit = "pass6_hop_limit", false;
    /// Larger than the egress MTU: the kernel sends Packet Too Big
    /// (IPv6 routers never fragment).
    Pass6PacketTooBig = "pass6_packet_too_big", false;
    /// Standalone mode: IPv6 packet from the WAN to a LAN host that is no
    /// reply of a known flow and matches no pinhole (RFC 6092), including
    /// one behind an extension header (but `IPsec`'s) or a first fragment
    /// of no known flow.
    Drop6Unsolicited = "drop6_unsolicited", false;
    /// The IPv6 conntrack map refused a new flow: left to the kernel.
    Pass6TableFull = "pass6_table_full", false;
    /// New IPv6 flow opened from the LAN.
    Flow6NewOutbound = "flow6_new_outbound", true;
    /// New IPv6 flow opened from the WAN through a pinhole.
    Flow6NewPinhole = "flow6_new_pinhole", true;
    /// `ICMPv6` error quoting a known flow forwarded to the LAN host.
    Icmp6ErrorForwarded = "icmp6_error_forwarded", true;
    /// An IPv6 flow's other entry was missing (LRU eviction) and was put back.
    Eviction6Detected = "eviction6_detected", true;
    /// `CONNTRACK6` entries the data path added (new keys only).
    Ct6EntriesInserted = "ct6_entries_inserted", true;
    /// New WAN -> LAN flow opened through an active NAT mapping, as the
    /// filtering setting allows (endpoint-independent or address-dependent).
    FlowNewInboundMapping = "flow_new_inbound_mapping", true;
    /// New flow from a LAN host to the WAN address hairpinned back to a LAN
    /// host (a mapping's or a port forward's).
    FlowNewHairpin = "flow_new_hairpin", true;
    /// An expired NAT mapping of another internal endpoint was taken over.
    MappingReclaimed = "mapping_reclaimed", true;
    /// Ethernet destination is not the ingress interface's own MAC: a
    /// broadcast or multicast frame, or unicast to another host (a bridge
    /// flooding a frame whose destination it has not learned, a
    /// promiscuous interface). The kernel forwards only frames addressed
    /// to the interface (it drops the other hosts' frames in `ip_rcv`, and
    /// `ip_forward`/`ip6_forward` forward only `PACKET_HOST` ones), and a
    /// router must not forward a packet received as a link-layer broadcast
    /// or multicast (RFC 1812 5.3.4): the kernel gets it (and delivers
    /// what is for the router itself: ARP, DHCP, VRRP...). Frames to a
    /// VRRP virtual MAC ([`VIRTUAL_MACS_MAP`]) go on only while this router
    /// is the master (a backup's macvlan keeps the MAC). Also counted
    /// after an interface's MAC changed until attach runs again
    /// (`router-ctl doctor` says so).
    PassNotForUs = "pass_not_for_us", false;
    /// A WAN packet that would open a flow to a LAN endpoint (a port
    /// forward, a mapping's inbound flow) whose reply tuple is already a
    /// live flow's: the LAN endpoint talks to the same remote endpoint
    /// through another mapping. Opening it would take that flow's entry
    /// over and change its mapping mid-flow (RFC 4787 REQ-1); the kernel
    /// gets the packet instead. IPv6: a new flow (pinhole or outbound)
    /// whose reverse tuple is a live entry's.
    PassReplyTupleTaken = "pass_reply_tuple_taken", false;
    /// Standalone mode: an IPv6 packet that would open a flow with a source
    /// address that cannot be the sender's from that side (RFC 6092 3.1,
    /// BCP 38 ingress filtering, RFC 3704 strict reverse path): from the
    /// LAN one the FIB does not route back out of the LAN (a spoofed or
    /// foreign prefix would leave on the WAN); from the WAN one it routes
    /// to the LAN or one of the router's own addresses. Checked when a
    /// flow opens, not per hit, and for every packet passed from the LAN.
    ///
    Drop6SpoofedSource = "drop6_spoofed_source", false;
    /// IPv4 fragment of a TCP (whole header in the first fragment), UDP or
    /// ICMP echo flow the data path carries (not an offloaded one),
    /// translated and redirected, either direction: the
    /// first fragment through the flow's entry, a later one through the
    /// record its first left in `FRAGMENTS` (RFC 4787 REQ-14). Fragments
    /// of anything else, and later fragments that arrive before their
    /// first, go to the kernel (`pass_fragment`).
    FwdFragment = "fwd_fragment", false;
    /// A WAN packet of a flow the data path carries (not an offloaded one)
    /// with TTL <= 1: discarded and answered with an ICMP Time Exceeded
    /// from the WAN address quoting it as received (RFC 1812 5.3.1), which
    /// takes the packet's place in the frame, sent back out of the WAN
    /// (a redirect to the interface it came in on).
    /// Passed to the kernel it would be taken as the router's own and
    /// answered as the endpoint (a TCP RST).
    DropTtlExceededAnswered = "drop_ttl_exceeded_answered", false;
    /// The same, past the answers' rate limit (per CPU, Linux's ICMP
    /// defaults: 1000 a second, bursts of 50): dropped unanswered.
    DropTtlExceeded = "drop_ttl_exceeded", false;
    /// Standalone mode: a LAN packet that would open an IPv4 flow with a
    /// source the FIB does not route back out of the LAN (BCP 38, RFC 3704
    /// strict reverse path): a spoofed or foreign address, or one of the
    /// router's own. Checked when a flow opens, not per packet; and any
    /// LAN packet passed untranslated with the WAN address as its source
    /// (the kernel would forward it as the router's own). IPv6 has
    /// `drop6_spoofed_source`.
    DropSpoofedSource = "drop_spoofed_source", false;
    /// IPv4 packet with options (IHL > 5) of a flow the data path carries
    /// (not an offloaded one), translated and redirected with its options
    /// as they are, either direction.
    FwdIpOptions = "fwd_ip_options", false;
    /// Standalone mode: a TCP SYN (either direction, IPv4 or IPv6) whose
    /// MSS option the data path lowered to what the path's MTU carries
    /// (`attach --clamp-mss`, [`crate::mss`]); the packet is also counted
    /// by its verdict.
    TcpMssClamped = "tcp_mss_clamped", true;
    /// A packet of a flow the data path carries (not an offloaded one),
    /// larger than its next hop's MTU with DF clear: translated and passed
    /// (TTL untouched) for the kernel to fragment and forward (RFC 1812
    /// 5.2.6), with the flow's own mapping. With DF set, a LAN packet to
    /// the WAN stays `pass_mtu` (the kernel answers the LAN host) and one
    /// to the WAN address (from the WAN, or hairpinned) is answered:
    /// `drop_frag_needed_answered`.
    PassMtuTranslated = "pass_mtu_translated", false;
    /// A packet to the WAN address (from the WAN, or hairpinned from the
    /// LAN) of a flow the data path carries, or a port forward's first,
    /// larger than its next hop's MTU with DF set: discarded and answered
    /// with an ICMP Fragmentation Needed carrying that MTU (RFC 1191), from
    /// the WAN address quoting it as received, sent back out of the
    /// interface it came in on. Passed to the kernel it would be taken as
    /// the router's own (a TCP RST).
    DropFragNeededAnswered = "drop_frag_needed_answered", false;
    /// The same, past the answers' rate limit (shared with Time Exceeded),
    /// or with a frame that could not be resized: dropped unanswered.
    DropFragNeeded = "drop_frag_needed", false;
    /// Standalone mode: a LAN packet of a flow the data path left to the
    /// kernel's slow-path NAT when it could not open it (its first packet
    /// went with `pass_ports_exhausted`, `pass_reply_tuple_taken` or as a
    /// fragment of no flow, `pass_fragment`): passed again while the flow
    /// lives there ([`KERNEL_FLOWS_MAP`]), so it keeps the kernel's
    /// mapping (RFC 4787 REQ-11) even once a port of the data path's
    /// comes free.
    PassKernelFlow = "pass_kernel_flow", false;
    /// Standalone mode: a LAN packet that would open an IPv4 flow (also
    /// one to the router itself: counted before the FIB is asked) while
    /// the WAN has no IPv4 address (`--wan-addr auto` and the
    /// address gone: a DHCP lease lost or between two leases; the
    /// configuration's address is then 0.0.0.0). Nothing can be
    /// masqueraded: the kernel gets it, and standalone mode's slow-path
    /// table drops what it would forward to the WAN (with
    /// `--no-kernel-nat`, the owner's NAT rule decides), as the kernel's
    /// masquerade does without an address.
    ///
    /// New counters go last: the others keep the indexes older objects
    /// write, and a live replace carries the counts over by index.
    PassNoWanAddr = "pass_no_wan_addr", false;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_in_index_order_and_names_unique() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
            for d in &Counter::ALL[i + 1..] {
                assert_ne!(c.name(), d.name());
            }
        }
        assert_eq!(Counter::COUNT as usize, Counter::ALL.len());
    }

    #[test]
    fn states_round_trip_and_have_timeouts() {
        let t = Timeouts::default();
        for v in 1..=7 {
            let s = FlowState::from_u8(v).unwrap();
            assert_eq!(s as u8, v);
            assert!(FlowState::timeout_secs(v, &t) > 0);
            assert_ne!(FlowState::name(v), "UNKNOWN");
        }
        assert_eq!(FlowState::from_u8(0), None);
        assert_eq!(FlowState::timeout_secs(0, &t), t.tcp_closed);
    }

    #[test]
    fn one_table_drives_keys_fields_and_timeouts() {
        let mut keys = std::string::String::new();
        for (i, &s) in FlowState::ALL.iter().enumerate() {
            assert_eq!(s as usize, i + 1, "discriminants in table order");
            assert_eq!(FlowState::from_key(s.key()), Some(s));
            let mut t = Timeouts::default();
            t.set(s, 1000 + i as u32);
            assert_eq!(t.get(s), 1000 + i as u32);
            assert_eq!(FlowState::timeout_secs(s as u8, &t), 1000 + i as u32);
            for &other in FlowState::ALL {
                if other != s {
                    assert_eq!(t.get(other), Timeouts::default().get(other));
                }
            }
            if !keys.is_empty() {
                keys.push_str(", ");
            }
            keys.push_str(s.key());
        }
        assert_eq!(FlowState::KEYS, keys);
        assert_eq!(FlowState::from_key("udp"), None);
        let t = Timeouts::default();
        for unknown in [0, 8] {
            assert_eq!(FlowState::timeout_secs(unknown, &t), t.tcp_closed);
        }
    }

    #[test]
    fn reversed_twice_is_identity() {
        let k = FlowKey::new([1, 2, 3, 4], [5, 6, 7, 8], 1000, 80, IPPROTO_TCP);
        assert_eq!(k.reversed().reversed(), k);
        assert_eq!(k.reversed().src_port, 80);
    }
}
