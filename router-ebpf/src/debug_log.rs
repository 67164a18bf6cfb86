//! The data path's debug log (aya-log): one line per rare event (a flow
//! admitted, SNAT ports exhausted, a malformed packet dropped, an ICMP
//! error translated), never per packet of an established flow.
//!
//! Off unless a reader asks for it: `router-ctl run` writes the highest
//! level its log filter wants for the target `router_ebpf` into
//! [`LOG_LEVEL`] and drains the ring buffer, and writes 0 again when it
//! stops, so a router attached without a daemon never fills a ring buffer
//! nobody drains. aya-log-ebpf's own gate, the `.rodata` global
//! `AYA_LOG_LEVEL`, is fixed when the program is loaded (by `attach`, not
//! by `run`) and stays at its default (every level).
//
// Each log line is a BPF subprogram of its own (never inlined) taking
// only scalars. A log call site is about a thousand instructions (header,
// fields, ring buffer reserve, copies); the verifier still walks a
// subprogram once per distinct state that reaches its call (the object has
// no BTF, so there are no global functions it would check only once), and
// that is why the call sites sit where few states meet: the drop log after
// the count, where only the action is live. Scalars rather than references
// keep the callers' values off the entry point's stack frame (the combined
// stack of a call chain must stay within 512 bytes). Callers test
// [`enabled`] first, so with the log off a call site costs one array
// lookup and a branch, and only on the cold paths that have one.

use aya_ebpf::{macros::map, maps::Array};
use aya_log_ebpf::{debug, macro_support::Level};
use router_common::maps::{Counter, FlowKey};

/// The highest level logged (aya-log's numbering: error 1 .. trace 5),
/// 0 for none. Written by `router-ctl run` only.
#[map(name = "LOG_LEVEL")]
static LOG_LEVEL: Array<u32> = Array::with_max_entries(1, 0);

/// The log target `RUST_LOG` names (`RUST_LOG=router_ebpf=debug`); the
/// crate's own module path starts with the binary's name, `router`.
const TARGET: &str = "router_ebpf";

/// Whether a reader wants lines of `level`.
#[inline(always)]
pub fn enabled(level: Level) -> bool {
    LOG_LEVEL
        .get(0)
        .is_some_and(|max| u32::from(level as u8) <= *max)
}

/// A new LAN flow `key` masqueraded behind `wan_addr:wan_port`.
#[inline(always)]
pub fn masqueraded(key: &FlowKey, wan_addr: [u8; 4], wan_port: u16) {
    if enabled(Level::Debug) {
        router_log_masqueraded(
            addr(key.src_addr),
            addr(key.dst_addr),
            ports(key.src_port, key.dst_port),
            addr(wan_addr),
            ports(u16::from(key.proto), wan_port),
        );
    }
}

/// A new WAN flow `key` let in by a port-forward rule to
/// `lan_addr:lan_port`.
#[inline(always)]
pub fn port_forwarded(key: &FlowKey, lan_addr: [u8; 4], lan_port: u16) {
    if enabled(Level::Debug) {
        router_log_port_forwarded(
            addr(key.src_addr),
            addr(key.dst_addr),
            ports(key.src_port, key.dst_port),
            addr(lan_addr),
            ports(u16::from(key.proto), lan_port),
        );
    }
}

/// No SNAT port could be claimed for the new LAN flow `key`.
#[inline(always)]
pub fn ports_exhausted(key: &FlowKey) {
    if enabled(Level::Debug) {
        router_log_ports_exhausted(
            addr(key.src_addr),
            addr(key.dst_addr),
            ports(key.src_port, key.dst_port),
            u32::from(key.proto),
        );
    }
}

/// A packet that came in on `ingress_ifindex` dropped for `reason`: logged
/// when the reason says it was malformed. Other drops (unsolicited WAN
/// packets in standalone mode, which a port scan makes by the thousand)
/// are not.
#[inline(always)]
pub fn dropped(reason: Counter, ingress_ifindex: u32) {
    if matches!(
        reason,
        Counter::DropTruncated | Counter::DropMalformed | Counter::DropIpChecksum
    ) && enabled(Level::Debug)
    {
        router_log_malformed(reason as u32, ingress_ifindex);
    }
}

/// An ICMP error about the packet that the reply tuple `key` answers
/// (from the WAN: one the NAT sent; from the LAN: one it delivered),
/// translated to `to_addr:to_port` (the LAN host, or the NAT's mapping).
#[inline(always)]
pub fn icmp_error_translated(key: &FlowKey, to_addr: [u8; 4], to_port: u16) {
    if enabled(Level::Debug) {
        router_log_icmp_error_translated(
            addr(key.dst_addr),
            addr(key.src_addr),
            ports(key.dst_port, key.src_port),
            addr(to_addr),
            ports(u16::from(key.proto), to_port),
        );
    }
}

/// An IPv4 address as the number aya-log's `:i` prints as one.
#[inline(always)]
fn addr(a: [u8; 4]) -> u32 {
    u32::from_be_bytes(a)
}

/// Two 16-bit values in one argument (a BPF call has five).
#[inline(always)]
fn ports(high: u16, low: u16) -> u32 {
    (u32::from(high) << 16) | u32::from(low)
}

#[inline(never)]
fn router_log_masqueraded(src: u32, dst: u32, ports_: u32, wan: u32, proto_port: u32) {
    debug!(
        &(),
        target: TARGET,
        "flow admitted: masquerade proto {} {:i}:{} -> {:i}:{} as {:i}:{}",
        proto_port >> 16,
        src,
        ports_ >> 16,
        dst,
        ports_ & 0xffff,
        wan,
        proto_port & 0xffff
    );
}

#[inline(never)]
fn router_log_port_forwarded(src: u32, dst: u32, ports_: u32, lan: u32, proto_port: u32) {
    debug!(
        &(),
        target: TARGET,
        "flow admitted: port forward proto {} {:i}:{} -> {:i}:{} to {:i}:{}",
        proto_port >> 16,
        src,
        ports_ >> 16,
        dst,
        ports_ & 0xffff,
        lan,
        proto_port & 0xffff
    );
}

#[inline(never)]
fn router_log_ports_exhausted(src: u32, dst: u32, ports_: u32, proto: u32) {
    debug!(
        &(),
        target: TARGET,
        "ports exhausted: proto {} {:i}:{} -> {:i}:{} passed to the kernel",
        proto,
        src,
        ports_ >> 16,
        dst,
        ports_ & 0xffff
    );
}

/// `reason`: the drop counter's index.
#[inline(never)]
fn router_log_malformed(reason: u32, ingress_ifindex: u32) {
    if reason == Counter::DropTruncated as u32 {
        debug!(
            &(),
            target: TARGET,
            "malformed packet dropped: truncated (frame shorter than its headers), ifindex {}",
            ingress_ifindex
        );
    } else if reason == Counter::DropIpChecksum as u32 {
        debug!(
            &(),
            target: TARGET,
            "malformed packet dropped: bad IPv4 header checksum, ifindex {}",
            ingress_ifindex
        );
    } else {
        debug!(
            &(),
            target: TARGET,
            "malformed packet dropped: malformed (inconsistent header lengths), ifindex {}",
            ingress_ifindex
        );
    }
}

/// The quoted packet `src:src_port -> dst:dst_port` (ports: source high,
/// destination low); the endpoint it was translated to, `to:to_port`.
#[inline(never)]
fn router_log_icmp_error_translated(src: u32, dst: u32, ports_: u32, to: u32, proto_port: u32) {
    debug!(
        &(),
        target: TARGET,
        "ICMP error translated: about proto {} {:i}:{} -> {:i}:{}, to {:i}:{}",
        proto_port >> 16,
        src,
        ports_ >> 16,
        dst,
        ports_ & 0xffff,
        to,
        proto_port & 0xffff
    );
}
