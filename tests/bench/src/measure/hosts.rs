//! What the end hosts' TCP went through during a run: segments sent and
//! retransmitted, retransmission timeouts, and the frames their own veth
//! dropped on transmit.
//!
//! A veth with no qdisc (`noqueue`, the default: veth is `IFF_NO_QUEUE`)
//! whose peer runs NAPI (an XDP program, or GRO) puts every frame into the
//! peer's 256-entry ring and drops it when that ring is full, counted as
//! the sender's `tx_dropped`. A NIC's driver stops its queue instead and
//! the qdisc holds the packet. Between the XDP cables the client's `eth0`
//! faces a cable on both paths, so under many streams these drops, not the
//! router, decide how much TCP retransmits; these counters show it run by
//! run.

use tests::{HOST_IF, Ns, Topology, parse_snmp};

/// Counters of both end hosts (client and server), summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostTcp {
    /// TCP segments sent (`TcpOutSegs`, retransmissions not included).
    pub out_segs: u64,
    /// TCP segments retransmitted (`TcpRetransSegs`).
    pub retrans_segs: u64,
    /// Retransmission timeouts (`TcpExtTCPTimeouts`): each stalls its
    /// stream for at least 200 ms (RFC 6298's minimum RTO as Linux sets it).
    pub timeouts: u64,
    /// Frames the end hosts' `eth0` dropped on transmit (`tx_dropped`):
    /// the peer's ring was full.
    pub tx_dropped: u64,
}

impl HostTcp {
    /// The counters of one host from its `/proc/net/snmp` + `netstat` text
    /// and its `eth0`'s `tx_dropped`; a counter missing reads 0.
    pub fn parse(snmp: &str, tx_dropped: &str) -> Self {
        let c = |name| parse_snmp(snmp, name).unwrap_or(0);
        Self {
            out_segs: c("TcpOutSegs"),
            retrans_segs: c("TcpRetransSegs"),
            timeouts: c("TcpExtTCPTimeouts"),
            tx_dropped: tx_dropped.trim().parse().unwrap_or(0),
        }
    }

    /// Client and server now, summed.
    pub fn read(t: &Topology) -> Self {
        [Ns::Client, Ns::Server]
            .into_iter()
            .map(|ns| {
                let snmp = t.exec(ns, &["cat", "/proc/net/snmp", "/proc/net/netstat"]);
                let path = format!("/sys/class/net/{HOST_IF}/statistics/tx_dropped");
                let drops = t.exec(ns, &["cat", &path]);
                Self::parse(
                    &String::from_utf8_lossy(&snmp.stdout),
                    &String::from_utf8_lossy(&drops.stdout),
                )
            })
            .fold(Self::default(), Self::plus)
    }

    fn plus(self, o: Self) -> Self {
        Self {
            out_segs: self.out_segs + o.out_segs,
            retrans_segs: self.retrans_segs + o.retrans_segs,
            timeouts: self.timeouts + o.timeouts,
            tx_dropped: self.tx_dropped + o.tx_dropped,
        }
    }

    /// What happened between `before` and `self` (counters only grow; a
    /// reset reads 0).
    #[must_use]
    pub fn since(self, before: Self) -> Self {
        Self {
            out_segs: self.out_segs.saturating_sub(before.out_segs),
            retrans_segs: self.retrans_segs.saturating_sub(before.retrans_segs),
            timeouts: self.timeouts.saturating_sub(before.timeouts),
            tx_dropped: self.tx_dropped.saturating_sub(before.tx_dropped),
        }
    }

    /// Retransmitted segments per segment sent, % (NaN when none was sent).
    pub fn retrans_pct(&self) -> f64 {
        if self.out_segs == 0 {
            f64::NAN
        } else {
            self.retrans_segs as f64 * 100.0 / self.out_segs as f64
        }
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    const SNMP: &str = "Tcp: RtoAlgorithm OutSegs RetransSegs\nTcp: 1 1000 120\n\
                        TcpExt: TCPTimeouts TCPLossProbes\nTcpExt: 7 3\n";

    #[test]
    fn parses_the_counters_and_takes_the_difference() {
        let after = HostTcp::parse(SNMP, "250\n");
        assert_eq!(
            after,
            HostTcp {
                out_segs: 1000,
                retrans_segs: 120,
                timeouts: 7,
                tx_dropped: 250,
            }
        );
        let before = HostTcp {
            out_segs: 200,
            retrans_segs: 20,
            timeouts: 2,
            tx_dropped: 50,
        };
        let d = after.since(before);
        assert_eq!(
            (d.out_segs, d.retrans_segs, d.timeouts, d.tx_dropped),
            (800, 100, 5, 200)
        );
        assert!((d.retrans_pct() - 12.5).abs() < 1e-9);
        // Two hosts sum; a counter reset (a fresh namespace) reads 0.
        assert_eq!(before.plus(before).out_segs, 400);
        assert_eq!(before.since(after), HostTcp::default());
    }

    #[test]
    fn missing_counters_read_zero_and_nothing_sent_is_no_share() {
        let h = HostTcp::parse("", "");
        assert_eq!(h, HostTcp::default());
        assert!(h.retrans_pct().is_nan());
    }
}
