//! XDP NAT fast path, attached to the LAN and the WAN interface.
//!
//! Per packet: parse Ethernet/IPv4/TCP|UDP|ICMP at fixed offsets (every
//! access bounds-checked by [`ptr_at`]), look the flow up in the conntrack
//! LRU map, open a flow when allowed (masquerade from the LAN, port-forward
//! rules from the WAN), translate addresses/ports with incremental checksum
//! updates, pick the next hop with `bpf_fib_lookup` and redirect through the
//! DEVMAP. Everything else goes to the kernel with `XDP_PASS` and a
//! per-reason counter; malformed packets are dropped and counted. The pure
//! logic lives in `router-common` (flow, nat, checksum) and is unit-tested
//! on the host.
#![no_std]
#![no_main]
// Keep packet pointers in one frame: the verifier tracks their bounds best
// when everything is inlined into the entry point.
#![expect(
    clippy::inline_always,
    reason = "keep packet pointer tracking in one frame for the verifier"
)]
// Map keys and values go to the helpers by reference, so no copy lands on
// the 512-byte BPF stack.
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "keys by reference: no stack copies"
)]

use core::mem::size_of;

use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        BPF_ANY, BPF_FIB_LKUP_RET_FRAG_NEEDED, BPF_FIB_LKUP_RET_FWD_DISABLED,
        BPF_FIB_LKUP_RET_NO_NEIGH, BPF_FIB_LKUP_RET_SUCCESS, BPF_NOEXIST,
        bpf_fib_lookup as FibParams, xdp_action,
    },
    helpers::{bpf_fib_lookup, bpf_ktime_get_coarse_ns},
    macros::{map, xdp},
    maps::{Array, DevMapHash, HashMap, LruHashMap, PerCpuArray},
    programs::XdpContext,
};
use router_common::{
    flow::{
        MAX_PORT_PROBES, candidate_port, expired, fill_new_flow, flow_hash, masquerade_key,
        needs_refresh, tcp_next, tcp_opens_flow,
    },
    maps::{
        Config, Counter, CounterValue, DEFAULT_MAX_FLOWS, FLAG_ORIGINAL, FLAG_PORT_FORWARD,
        FlowEntry, FlowKey, FlowState, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, MAX_PORT_FORWARDS,
        PortForwardKey, PortForwardTarget,
    },
    nat::{
        ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, Ipv4Verdict, classify_ipv4, decrement_ttl,
        icmp_is_error, rewrite_addrs, rewrite_icmp_echo, rewrite_tcp, rewrite_udp,
        translate_icmp_error,
    },
};

const ETH_HLEN: usize = 14;
const ETH_P_IP: u16 = 0x0800;
/// IPv4 header offset; options are passed to the kernel, so L4 is at a
/// fixed offset too.
const IP_OFF: usize = ETH_HLEN;
const L4_OFF: usize = IP_OFF + 20;
/// Embedded header of an ICMP error: after the 8-byte ICMP header.
const INNER_IP_OFF: usize = L4_OFF + 8;
const INNER_L4_OFF: usize = INNER_IP_OFF + 20;
/// The embedded TCP checksum, present when the error quotes >= 18 bytes.
const INNER_TCP_CHECK_OFF: usize = INNER_L4_OFF + 16;
const AF_INET: u8 = 2;
#[expect(clippy::cast_possible_wrap, reason = "64-byte struct")]
const FIB_PARAMS_LEN: i32 = size_of::<FibParams>() as i32;
/// `-EEXIST` from a `BPF_NOEXIST` update: the key is taken.
const EEXIST: i32 = -17;

const PASS: u32 = xdp_action::XDP_PASS;
const DROP: u32 = xdp_action::XDP_DROP;

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<CounterValue> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

#[map(name = "DEVICES")]
static DEVICES: DevMapHash = DevMapHash::with_max_entries(16, 0);

#[map(name = "CONFIG")]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);

/// Two entries per flow; the controller resizes it at load time.
#[map(name = "CONNTRACK")]
static CONNTRACK: LruHashMap<FlowKey, FlowEntry> =
    LruHashMap::with_max_entries(2 * DEFAULT_MAX_FLOWS, 0);

#[map(name = "PORT_FORWARDS")]
static PORT_FORWARDS: HashMap<PortForwardKey, PortForwardTarget> =
    HashMap::with_max_entries(MAX_PORT_FORWARDS, 0);

#[xdp]
#[expect(
    clippy::needless_pass_by_value,
    reason = "the #[xdp] macro passes the context by value"
)]
pub fn router(ctx: XdpContext) -> u32 {
    let len = (ctx.data_end() - ctx.data()) as u64;
    let (counter, action) = match try_router(&ctx) {
        Ok(v) => v,
        // Only ptr_at fails: a header runs past the end of the frame.
        Err(()) => (Counter::DropTruncated, DROP),
    };
    count(counter, len);
    action
}

#[inline(always)]
fn count(counter: Counter, bytes: u64) {
    if let Some(c) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: per-CPU slot, no other writer on this CPU.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += bytes;
        }
    }
}

#[inline(always)]
fn event(counter: Counter) {
    count(counter, 0);
}

/// The one bounds helper: a pointer to `T` at `offset`, or `Err` when the
/// frame is too short.
#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Result<*mut T, ()> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + size_of::<T>() > end {
        return Err(());
    }
    Ok((start + offset) as *mut T)
}

/// Header values after translation.
#[derive(Clone, Copy)]
struct Xlat {
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
}

impl Xlat {
    #[inline(always)]
    fn of_entry(e: &FlowEntry) -> Self {
        Self {
            src: e.new_src_addr,
            dst: e.new_dst_addr,
            sport: e.new_src_port,
            dport: e.new_dst_port,
        }
    }
}

/// What opens a flow when the lookup misses.
#[derive(Clone, Copy)]
enum NewFlow {
    /// LAN -> WAN: masquerade (port chosen after the route check).
    Masquerade,
    /// WAN -> LAN through a port-forward rule.
    PortForward,
}

/// Next hop for a packet with the translated addresses.
enum Hop {
    /// Neighbour known and the redirect to `ifindex` recorded (`action`):
    /// forward in XDP with these MACs.
    Redirect {
        ifindex: u32,
        mtu: u16,
        smac: [u8; 6],
        dmac: [u8; 6],
        action: u32,
    },
    /// Route fine but no neighbour entry: the kernel must resolve it.
    NoNeighbour { ifindex: u32 },
}

#[inline(always)]
fn fib(ctx: &XdpContext, ip: &[u8; 20], src: [u8; 4], dst: [u8; 4]) -> Result<Hop, Counter> {
    // SAFETY: zeroed is a valid bit pattern for this plain C struct.
    let mut p: FibParams = unsafe { core::mem::zeroed() };
    p.family = AF_INET;
    p.l4_protocol = ip[9];
    p.__bindgen_anon_1.tot_len = u16::from_be_bytes([ip[2], ip[3]]);
    p.__bindgen_anon_2.tos = ip[1];
    p.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes(src);
    p.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes(dst);
    p.ifindex = ctx.ingress_ifindex() as u32;
    // SAFETY: ctx is the program's context, p a valid stack struct.
    let rc = unsafe { bpf_fib_lookup(ctx.as_ptr(), &raw mut p, FIB_PARAMS_LEN, 0) };
    #[expect(
        clippy::cast_sign_loss,
        reason = "negative errors map to no BPF_FIB_LKUP_RET_* and are passed"
    )]
    let rc = rc as u32;
    match rc {
        BPF_FIB_LKUP_RET_SUCCESS => {}
        // The kernel fills ifindex before the neighbour lookup.
        BPF_FIB_LKUP_RET_NO_NEIGH => return Ok(Hop::NoNeighbour { ifindex: p.ifindex }),
        BPF_FIB_LKUP_RET_FRAG_NEEDED => return Err(Counter::PassMtu),
        BPF_FIB_LKUP_RET_FWD_DISABLED => return Err(Counter::PassFibForwardingDisabled),
        // Local delivery, blackhole, unreachable, prohibit: the kernel decides.
        _ => return Err(Counter::PassFibNotForwarded),
    }
    // SAFETY: on success the kernel wrote mtu_result (a union with tot_len).
    let mtu = unsafe { p.__bindgen_anon_1.mtu_result };
    redirect_to(p.ifindex, mtu, p.smac, p.dmac)
}

/// Records the redirect to `ifindex` (an attached interface) for a packet
/// leaving with these MACs. Only records: a packet passed after all goes to
/// the kernel untouched.
#[inline(always)]
fn redirect_to(ifindex: u32, mtu: u16, smac: [u8; 6], dmac: [u8; 6]) -> Result<Hop, Counter> {
    let Ok(action) = DEVICES.redirect(ifindex, 0) else {
        return Err(Counter::PassEgressNotAttached);
    };
    Ok(Hop::Redirect {
        ifindex,
        mtu,
        smac,
        dmac,
        action,
    })
}

#[inline(always)]
#[expect(clippy::too_many_lines, reason = "one inline core, read top to bottom")]
fn try_router(ctx: &XdpContext) -> Result<(Counter, u32), ()> {
    let eth: *mut [u8; ETH_HLEN] = ptr_at(ctx, 0)?;
    // SAFETY: bounds checked by ptr_at.
    let eth = unsafe { &mut *eth };
    if u16::from_be_bytes([eth[12], eth[13]]) != ETH_P_IP {
        // ARP, IPv6, VLAN-tagged frames: the kernel handles them.
        return Ok((Counter::PassNotIpv4, PASS));
    }
    let ip: *mut [u8; 20] = ptr_at(ctx, IP_OFF)?;
    // SAFETY: bounds checked by ptr_at.
    let ip = unsafe { &mut *ip };
    let l3_len = ctx.data_end() - ctx.data() - IP_OFF;
    match classify_ipv4(ip, l3_len) {
        Ipv4Verdict::Forward => {}
        Ipv4Verdict::Malformed => return Ok((Counter::DropMalformed, DROP)),
        Ipv4Verdict::Options => return Ok((Counter::PassIpOptions, PASS)),
        Ipv4Verdict::Fragment => return Ok((Counter::PassFragment, PASS)),
        Ipv4Verdict::TtlExceeded => return Ok((Counter::PassTtlExceeded, PASS)),
        Ipv4Verdict::BadChecksum => return Ok((Counter::DropIpChecksum, DROP)),
    }
    // Array map value, valid for the program's run.
    let Some(cfg) = CONFIG.get(0) else {
        return Ok((Counter::PassNotConfigured, PASS));
    };
    let ingress = ctx.ingress_ifindex() as u32;
    let from_lan = ingress == cfg.lan_ifindex;
    if cfg.lan_ifindex == 0 || !(from_lan || ingress == cfg.wan_ifindex) {
        // Not configured, or a frame from an interface we were not set up for.
        return Ok((Counter::PassNotConfigured, PASS));
    }
    let total_len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let src = [ip[12], ip[13], ip[14], ip[15]];
    let dst = [ip[16], ip[17], ip[18], ip[19]];
    let proto = ip[9];

    // L4 header: classify_ipv4 proved total_len <= frame, so a header that
    // fits in total_len fits in the frame; ptr_at re-checks for the verifier.
    let (sport, dport, tcp_flags) = match proto {
        IPPROTO_TCP => {
            if total_len < 40 {
                return Ok((Counter::DropMalformed, DROP));
            }
            let tcp: *const [u8; 20] = ptr_at(ctx, L4_OFF)?;
            // SAFETY: bounds checked by ptr_at.
            let tcp = unsafe { &*tcp };
            let doff = usize::from(tcp[12] >> 4) * 4;
            if doff < 20 || doff > total_len - 20 {
                return Ok((Counter::DropMalformed, DROP));
            }
            (
                u16::from_be_bytes([tcp[0], tcp[1]]),
                u16::from_be_bytes([tcp[2], tcp[3]]),
                tcp[13],
            )
        }
        IPPROTO_UDP => {
            if total_len < 28 {
                return Ok((Counter::DropMalformed, DROP));
            }
            let udp: *const [u8; 8] = ptr_at(ctx, L4_OFF)?;
            // SAFETY: bounds checked by ptr_at.
            let udp = unsafe { &*udp };
            (
                u16::from_be_bytes([udp[0], udp[1]]),
                u16::from_be_bytes([udp[2], udp[3]]),
                0,
            )
        }
        IPPROTO_ICMP => {
            if total_len < 28 {
                return Ok((Counter::DropMalformed, DROP));
            }
            let icmp: *const [u8; 8] = ptr_at(ctx, L4_OFF)?;
            // SAFETY: bounds checked by ptr_at.
            let icmp = unsafe { &*icmp };
            let t = icmp[0];
            if !from_lan && icmp_is_error(t) {
                return icmp_error(ctx, cfg, eth, ip, total_len);
            }
            // Echo requests leave from the LAN, replies come back on the
            // WAN. Other types (and pings of the router itself, which the
            // FIB calls local) are the kernel's.
            let wanted = if from_lan {
                ICMP_ECHO_REQUEST
            } else {
                ICMP_ECHO_REPLY
            };
            if t != wanted {
                return Ok((Counter::PassProtocol, PASS));
            }
            let id = u16::from_be_bytes([icmp[4], icmp[5]]);
            (id, id, 0)
        }
        // Other protocols (GRE, ESP, SCTP...): the kernel's.
        _ => return Ok((Counter::PassProtocol, PASS)),
    };

    let key = FlowKey::new(src, dst, sport, dport, proto);
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };

    let mut xlat = Xlat {
        src,
        dst,
        sport,
        dport,
    };
    let mut new: Option<NewFlow> = None;
    // The entry hit, and its cached next hop if still usable.
    let mut hit: Option<*mut FlowEntry> = None;
    let mut cached: Option<Hop> = None;
    if let Some(e) = CONNTRACK.get_ptr_mut(&key) {
        // SAFETY: map value pointer, valid for this run; fields are plain
        // integers, a concurrent writer can at worst tear a refresh.
        let entry = unsafe { &mut *e };
        // An entry counts only on its own side: the same tuple replayed on
        // the other interface (spoofed) is no hit.
        if entry.lan_side() == from_lan
            && !expired(entry.state, entry.last_seen_ns, now, &cfg.timeouts)
        {
            xlat = Xlat::of_entry(entry);
            // Refresh due (or nothing cached, or too big for the cached
            // MTU): ask the FIB again below.
            if entry.hop_ifindex != 0
                && !needs_refresh(entry.last_seen_ns, now)
                && total_len <= usize::from(entry.hop_mtu)
            {
                cached = Some(
                    match redirect_to(
                        entry.hop_ifindex,
                        entry.hop_mtu,
                        entry.hop_smac,
                        entry.hop_dmac,
                    ) {
                        Ok(h) => h,
                        Err(c) => return Ok((c, PASS)),
                    },
                );
            }
            track(&key, entry, proto, tcp_flags, now);
            hit = Some(e);
        }
    }
    if hit.is_none() {
        if proto == IPPROTO_TCP && !tcp_opens_flow(tcp_flags) {
            // Mid-stream segment of an unknown flow: a fresh mapping could
            // not carry it; the kernel's (netfilter's) business.
            let c = if from_lan {
                Counter::PassNoFlow
            } else {
                Counter::PassUnsolicited
            };
            return Ok((c, PASS));
        }
        if from_lan {
            xlat.src = cfg.wan_addr;
            new = Some(NewFlow::Masquerade);
        } else {
            if dst != cfg.wan_addr || proto == IPPROTO_ICMP {
                return Ok((Counter::PassUnsolicited, PASS));
            }
            let rule = PortForwardKey {
                proto,
                pad: 0,
                port: dport,
            };
            // SAFETY: hash map value, copied out at once.
            let Some(target) = (unsafe { PORT_FORWARDS.get(&rule) }).copied() else {
                // Unsolicited: the router's own stack answers (RST, port
                // unreachable) or a local service takes it.
                return Ok((Counter::PassUnsolicited, PASS));
            };
            xlat.dst = target.addr;
            xlat.dport = target.port;
            new = Some(NewFlow::PortForward);
        }
    }

    let hop = if let Some(h) = cached {
        h
    } else {
        match fib(ctx, ip, xlat.src, xlat.dst) {
            Ok(h) => {
                if let (
                    Some(e),
                    Hop::Redirect {
                        ifindex,
                        mtu,
                        smac,
                        dmac,
                        ..
                    },
                ) = (hit, &h)
                {
                    // SAFETY: map value pointer from the lookup above.
                    let e = unsafe { &mut *e };
                    e.hop_ifindex = *ifindex;
                    e.hop_mtu = *mtu;
                    e.hop_smac = *smac;
                    e.hop_dmac = *dmac;
                }
                h
            }
            Err(c) => {
                // A new LAN flow that is not routed anywhere (e.g. to the
                // router itself) is not NAT's business either.
                return Ok((c, PASS));
            }
        }
    };
    let (egress, action) = match hop {
        Hop::Redirect {
            ifindex, action, ..
        } => (ifindex, Some(action)),
        Hop::NoNeighbour { ifindex } => (ifindex, None),
    };
    let redirect = action.is_some();
    // A translated packet may only be passed to the kernel when it goes
    // to the LAN: LAN->WAN packets carry the router's own address as
    // source after SNAT, which the kernel drops as martian. Untranslated,
    // the kernel resolves the neighbour and the next packet goes fast.
    if !redirect && from_lan {
        return Ok((Counter::PassNoNeighbour, PASS));
    }

    match new {
        None => {}
        Some(NewFlow::Masquerade) => {
            if egress != cfg.wan_ifindex {
                // LAN -> LAN or another interface: plain routing, not NAT.
                return Ok((Counter::PassNoFlow, PASS));
            }
            let Some(port) = claim_port(cfg, &key, now) else {
                return Ok((Counter::PassPortsExhausted, PASS));
            };
            xlat.sport = port;
            if proto == IPPROTO_ICMP {
                xlat.dport = port;
            }
            event(Counter::FlowNewMasquerade);
        }
        Some(NewFlow::PortForward) => {
            let translated = FlowKey::new(xlat.src, xlat.dst, xlat.sport, xlat.dport, proto);
            if !insert_port_forward(&key, &translated, now) {
                // The map refused (out of memory): leave it to the kernel.
                return Ok((Counter::PassPortsExhausted, PASS));
            }
            event(Counter::FlowNewPortForward);
        }
    }

    // The redirect was recorded before any rewrite (in `redirect_to`), so a
    // failed one passed an untouched frame.
    let action = action.unwrap_or(PASS);

    let pseudo = rewrite_addrs(ip, xlat.src, xlat.dst);
    match proto {
        IPPROTO_TCP => {
            let tcp: *mut [u8; 20] = ptr_at(ctx, L4_OFF)?;
            // SAFETY: bounds checked by ptr_at.
            rewrite_tcp(unsafe { &mut *tcp }, pseudo, xlat.sport, xlat.dport);
        }
        IPPROTO_UDP => {
            let udp: *mut [u8; 8] = ptr_at(ctx, L4_OFF)?;
            // SAFETY: bounds checked by ptr_at.
            rewrite_udp(unsafe { &mut *udp }, pseudo, xlat.sport, xlat.dport);
        }
        _ => {
            let icmp: *mut [u8; 8] = ptr_at(ctx, L4_OFF)?;
            // SAFETY: bounds checked by ptr_at.
            let _ = rewrite_icmp_echo(unsafe { &mut *icmp }, xlat.sport);
        }
    }
    let Hop::Redirect { smac, dmac, .. } = hop else {
        // WAN -> LAN without a neighbour: translated, TTL untouched (the
        // kernel forwards it and decrements).
        return Ok((Counter::PassNoNeighbour, PASS));
    };
    decrement_ttl(ip);
    eth[0..6].copy_from_slice(&dmac);
    eth[6..12].copy_from_slice(&smac);
    let c = if from_lan {
        Counter::FwdOutbound
    } else {
        Counter::FwdInbound
    };
    Ok((c, action))
}

/// Updates TCP/UDP state and the coarse last-seen time of a flow hit
/// through `key`/`e`, in both of its entries. Writes only when something
/// changed or the refresh interval passed, so established flows do not
/// write shared cache lines per packet.
// A BPF subprogram of its own: its stack frame (two entries) does not add to
// the entry point's.
#[inline(never)]
fn track(key: &FlowKey, e: &mut FlowEntry, proto: u8, tcp_flags: u8, now: u64) {
    let from_orig = e.flags & FLAG_ORIGINAL != 0;
    let (state, flags) = match proto {
        IPPROTO_TCP => tcp_next(e.state, e.flags, from_orig, tcp_flags),
        IPPROTO_UDP if !from_orig && e.state == FlowState::UdpUnreplied as u8 => {
            (FlowState::UdpReplied as u8, e.flags)
        }
        _ => (e.state, e.flags),
    };
    let refresh = needs_refresh(e.last_seen_ns, now);
    if state == e.state && flags == e.flags && !refresh {
        return;
    }
    e.state = state;
    e.flags = flags;
    if refresh {
        e.last_seen_ns = now;
    }
    let peer_flags = (flags & !FLAG_ORIGINAL) | (!flags & FLAG_ORIGINAL);
    if let Some(p) = CONNTRACK.get_ptr_mut(&e.peer) {
        // SAFETY: map value pointer, valid for this run.
        let p = unsafe { &mut *p };
        p.state = state;
        p.flags = peer_flags;
        if refresh {
            p.last_seen_ns = now;
        }
        return;
    }
    // The LRU evicted the other direction: put it back, rebuilt from this
    // one (its translation is the reverse of our key). NOEXIST: if another
    // flow took that tuple meanwhile, it keeps it.
    let back = key.reversed();
    let peer = FlowEntry {
        peer: *key,
        new_src_addr: back.src_addr,
        new_dst_addr: back.dst_addr,
        new_src_port: back.src_port,
        new_dst_port: back.dst_port,
        state,
        flags: peer_flags,
        pad: [0; 2],
        last_seen_ns: now,
        created_ns: e.created_ns,
        hop_ifindex: 0,
        hop_mtu: 0,
        hop_dmac: [0; 6],
        hop_smac: [0; 6],
        pad2: [0; 6],
    };
    if CONNTRACK
        .insert(&e.peer, &peer, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        event(Counter::CtEntriesInserted);
    }
    event(Counter::EvictionDetected);
}

/// Inserts `k -> v` and counts a new entry; an existing entry (a stale one
/// of the same tuple) is overwritten without counting, so that inserted -
/// removed - present estimates the LRU's evictions.
#[inline(always)]
fn insert_counted(k: &FlowKey, v: &FlowEntry) -> Result<(), i32> {
    match CONNTRACK.insert(k, v, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            event(Counter::CtEntriesInserted);
            Ok(())
        }
        Err(EEXIST) => CONNTRACK.insert(k, v, u64::from(BPF_ANY)),
        Err(e) => Err(e),
    }
}

/// Removes `k`, counting it if it was there.
#[inline(always)]
fn remove_counted(k: &FlowKey) {
    if CONNTRACK.remove(k).is_ok() {
        event(Counter::CtEntriesRemoved);
    }
}

/// Chooses and claims the SNAT port of a new LAN flow. Probes a bounded
/// number of candidates (see [`try_port`]); a port reserved by a
/// port-forward rule is skipped.
// A subprogram of its own, like `track`.
#[inline(never)]
fn claim_port(cfg: &Config, key: &FlowKey, now: u64) -> Option<u16> {
    let hash = flow_hash(key, cfg.hash_seed);
    for attempt in 0..MAX_PORT_PROBES {
        let port = candidate_port(attempt, key.src_port, hash, cfg.port_min, cfg.port_max);
        if key.proto != IPPROTO_ICMP {
            let rule = PortForwardKey {
                proto: key.proto,
                pad: 0,
                port,
            };
            // SAFETY: only tested for presence.
            if unsafe { PORT_FORWARDS.get(&rule) }.is_some() {
                // Reserved for inbound flows by a port-forward rule (not a
                // collision with another flow: not counted).
                continue;
            }
        }
        match try_port(cfg, key, port, now) {
            Claim::Done => return Some(port),
            Claim::Taken => event(Counter::PortCollision),
            Claim::Failed => return None,
        }
    }
    None
}

#[repr(u32)]
enum Claim {
    Done,
    Taken,
    /// The map refused (out of memory or similar): no point probing on.
    Failed,
}

/// Entries of a flow being created: kept in a per-CPU map, not on the
/// 512-byte BPF stack.
#[repr(C)]
struct Scratch {
    orig: FlowEntry,
    reply: FlowEntry,
    reply_key: FlowKey,
}

#[map(name = "SCRATCH")]
static SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Claims `port` for the flow `key`: inserting the reply entry with
/// `BPF_NOEXIST` is the cross-CPU lock on the WAN tuple. A taken port whose
/// entry expired or lost its other half is reclaimed. Then inserts the
/// original entry.
#[inline(never)]
fn try_port(cfg: &Config, key: &FlowKey, port: u16, now: u64) -> Claim {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return Claim::Failed;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    let translated = masquerade_key(key, cfg.wan_addr, port);
    fill_new_flow(
        key,
        &translated,
        0,
        now,
        &mut s.orig,
        &mut s.reply_key,
        &mut s.reply,
    );
    let mut rc = CONNTRACK.insert(&s.reply_key, &s.reply, u64::from(BPF_NOEXIST));
    if rc == Err(EEXIST) && stale(cfg, &s.reply_key, now) {
        remove_counted(&s.reply_key);
        event(Counter::FlowExpiredReplaced);
        rc = CONNTRACK.insert(&s.reply_key, &s.reply, u64::from(BPF_NOEXIST));
    }
    match rc {
        Ok(()) => {
            event(Counter::CtEntriesInserted);
            if insert_counted(key, &s.orig).is_err() {
                remove_counted(&s.reply_key);
                return Claim::Failed;
            }
            Claim::Done
        }
        Err(EEXIST) => Claim::Taken,
        Err(_) => Claim::Failed,
    }
}

/// Inserts both entries of a flow opened by a port-forward rule.
#[inline(never)]
fn insert_port_forward(key: &FlowKey, translated: &FlowKey, now: u64) -> bool {
    let Some(s) = SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU slot, used by this program run only.
    let s = unsafe { &mut *s };
    fill_new_flow(
        key,
        translated,
        FLAG_PORT_FORWARD,
        now,
        &mut s.orig,
        &mut s.reply_key,
        &mut s.reply,
    );
    insert_counted(&s.reply_key, &s.reply).is_ok() && insert_counted(key, &s.orig).is_ok()
}

/// Whether the entry at `k` may be reclaimed: idle past its timeout, or
/// its other half is gone (evicted), so no packet can use it any more.
#[inline(always)]
fn stale(cfg: &Config, k: &FlowKey, now: u64) -> bool {
    // SAFETY: copied out at once.
    let Some(e) = (unsafe { CONNTRACK.get(k) }).copied() else {
        return false;
    };
    if expired(e.state, e.last_seen_ns, now, &cfg.timeouts) {
        return true;
    }
    // SAFETY: only tested for presence.
    match unsafe { CONNTRACK.get(&e.peer) } {
        None => true,
        Some(p) => p.peer != *k,
    }
}

/// An ICMP error arriving on the WAN: if the packet it quotes belongs to a
/// known flow, translate the quoted header and the outer destination back
/// to the LAN host (RFC 5508 4.2) and forward it; else the kernel's.
#[inline(always)]
fn icmp_error(
    ctx: &XdpContext,
    cfg: &Config,
    eth: &mut [u8; ETH_HLEN],
    ip: &mut [u8; 20],
    total_len: usize,
) -> Result<(Counter, u32), ()> {
    // Needs the quoted IPv4 header and the first 8 bytes after it.
    if total_len < 20 + 8 + 20 + 8 {
        return Ok((Counter::PassUnsolicited, PASS));
    }
    let inner_ip: *mut [u8; 20] = ptr_at(ctx, INNER_IP_OFF)?;
    // SAFETY: bounds checked by ptr_at.
    let inner_ip = unsafe { &mut *inner_ip };
    let inner_l4: *mut [u8; 8] = ptr_at(ctx, INNER_L4_OFF)?;
    // SAFETY: bounds checked by ptr_at.
    let inner_l4 = unsafe { &mut *inner_l4 };
    if inner_ip[0] != 0x45 {
        // Quoted header with options or not IPv4: not ours to rewrite.
        return Ok((Counter::PassUnsolicited, PASS));
    }
    let proto = inner_ip[9];
    let (src_port_quoted, dst_port_quoted) = match proto {
        IPPROTO_TCP | IPPROTO_UDP => (
            u16::from_be_bytes([inner_l4[0], inner_l4[1]]),
            u16::from_be_bytes([inner_l4[2], inner_l4[3]]),
        ),
        IPPROTO_ICMP if inner_l4[0] == ICMP_ECHO_REQUEST => {
            let id = u16::from_be_bytes([inner_l4[4], inner_l4[5]]);
            (id, id)
        }
        _ => return Ok((Counter::PassUnsolicited, PASS)),
    };
    let src_quoted = [inner_ip[12], inner_ip[13], inner_ip[14], inner_ip[15]];
    let dst_quoted = [inner_ip[16], inner_ip[17], inner_ip[18], inner_ip[19]];
    // A reply to the quoted packet would carry this key.
    let key = FlowKey::new(
        dst_quoted,
        src_quoted,
        dst_port_quoted,
        src_port_quoted,
        proto,
    );
    // SAFETY: helper without arguments.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    // SAFETY: copied out at once.
    let Some(e) = (unsafe { CONNTRACK.get(&key) }).copied() else {
        return Ok((Counter::PassUnsolicited, PASS));
    };
    // Only a WAN-side entry describes a packet the NAT sent to the WAN.
    if e.lan_side() || expired(e.state, e.last_seen_ns, now, &cfg.timeouts) {
        return Ok((Counter::PassUnsolicited, PASS));
    }
    let outer_src = [ip[12], ip[13], ip[14], ip[15]];
    let hop = match fib(ctx, ip, outer_src, e.new_dst_addr) {
        Ok(h) => h,
        Err(c) => return Ok((c, PASS)),
    };
    let action = match hop {
        Hop::Redirect { action, .. } => action,
        Hop::NoNeighbour { .. } => PASS,
    };
    let icmp: *mut [u8; 8] = ptr_at(ctx, L4_OFF)?;
    // The quoted TCP checksum is rewritten only if the error carries it.
    let tcp_check = if proto == IPPROTO_TCP && total_len >= 20 + 8 + 20 + 18 {
        let c: *mut [u8; 2] = ptr_at(ctx, INNER_TCP_CHECK_OFF)?;
        // SAFETY: bounds checked by ptr_at.
        Some(unsafe { &mut *c })
    } else {
        None
    };
    translate_icmp_error(
        ip,
        // SAFETY: bounds checked by ptr_at.
        unsafe { &mut *icmp },
        inner_ip,
        inner_l4,
        tcp_check,
        e.new_dst_addr,
        e.new_dst_port,
    );
    event(Counter::IcmpErrorTranslated);
    let Hop::Redirect { smac, dmac, .. } = hop else {
        return Ok((Counter::PassNoNeighbour, PASS));
    };
    decrement_ttl(ip);
    eth[0..6].copy_from_slice(&dmac);
    eth[6..12].copy_from_slice(&smac);
    Ok((Counter::FwdInbound, action))
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
