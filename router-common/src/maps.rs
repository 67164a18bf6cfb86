//! Map names and map value layouts shared with the controller.
//!
//! Every value is `#[repr(C)]`, built from fixed-width fields, and asserted
//! at compile time to have no padding, so `aya::Pod` is sound for it.

/// Per-CPU array of [`CounterValue`], indexed by [`Counter`].
pub const COUNTERS_MAP: &str = "COUNTERS";
/// `DEVMAP_HASH` of the attached interfaces, keyed by ifindex.
pub const DEVICES_MAP: &str = "DEVICES";
/// Single-entry array holding the [`Config`].
pub const CONFIG_MAP: &str = "CONFIG";
/// Name of the XDP program in the object.
pub const PROGRAM_NAME: &str = "router";

/// Packets and bytes for one outcome, on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CounterValue {
    pub packets: u64,
    pub bytes: u64,
}
const _: () = assert!(core::mem::size_of::<CounterValue>() == 16);

/// Controller-written configuration. Interface indexes are host order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Config {
    pub lan_ifindex: u32,
    pub wan_ifindex: u32,
}
const _: () = assert!(core::mem::size_of::<Config>() == 8);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: repr(C), only integer fields, no padding (asserted above).
    unsafe impl aya::Pod for super::CounterValue {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Config {}
}

/// One outcome of the data path. The discriminant is the index into
/// [`COUNTERS_MAP`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// Redirected by the fast path.
    Redirected = 0,
    /// Not IPv4 (ARP, IPv6, ...): the kernel handles it.
    PassNotIpv4,
    /// IPv4 header with options: left to the kernel.
    PassIpOptions,
    /// IPv4 fragment: no ports to look at, the kernel reassembles.
    PassFragment,
    /// TTL <= 1: the kernel sends ICMP time exceeded (RFC 1812 5.3.1).
    PassTtlExceeded,
    /// Destination is local, blackholed or unreachable per the FIB.
    PassFibNotForwarded,
    /// Forwarding disabled on the ingress device.
    PassFibForwardingDisabled,
    /// Next hop has no neighbour entry: the kernel resolves ARP.
    PassNoNeighbour,
    /// Packet exceeds the egress MTU: the kernel fragments or sends
    /// ICMP fragmentation needed.
    PassMtu,
    /// Egress interface is not one of the attached ones.
    PassEgressNotAttached,
    /// Frame shorter than its headers.
    DropTruncated,
    /// IHL < 5 or version != 4 or total length inconsistent with the frame.
    DropMalformed,
}

impl Counter {
    /// Number of counters (size of the counter map).
    pub const COUNT: u32 = Counter::DropMalformed as u32 + 1;

    /// All counters in index order.
    pub const ALL: [Counter; Counter::COUNT as usize] = [
        Counter::Redirected,
        Counter::PassNotIpv4,
        Counter::PassIpOptions,
        Counter::PassFragment,
        Counter::PassTtlExceeded,
        Counter::PassFibNotForwarded,
        Counter::PassFibForwardingDisabled,
        Counter::PassNoNeighbour,
        Counter::PassMtu,
        Counter::PassEgressNotAttached,
        Counter::DropTruncated,
        Counter::DropMalformed,
    ];

    /// Stable name used by `router-ctl stats` and its JSON.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Counter::Redirected => "redirected",
            Counter::PassNotIpv4 => "pass_not_ipv4",
            Counter::PassIpOptions => "pass_ip_options",
            Counter::PassFragment => "pass_fragment",
            Counter::PassTtlExceeded => "pass_ttl_exceeded",
            Counter::PassFibNotForwarded => "pass_fib_not_forwarded",
            Counter::PassFibForwardingDisabled => "pass_fib_forwarding_disabled",
            Counter::PassNoNeighbour => "pass_no_neighbour",
            Counter::PassMtu => "pass_mtu",
            Counter::PassEgressNotAttached => "pass_egress_not_attached",
            Counter::DropTruncated => "drop_truncated",
            Counter::DropMalformed => "drop_malformed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Counter;

    #[test]
    fn all_is_in_index_order_and_names_unique() {
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
            for d in &Counter::ALL[i + 1..] {
                assert_ne!(c.name(), d.name());
            }
        }
    }
}
