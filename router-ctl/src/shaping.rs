//! Traffic control that the fast path skips. A frame XDP redirects goes
//! straight to the target device's transmit, in native mode the driver's
//! XDP transmit (`ndo_xdp_xmit`), in generic mode the device's queue
//! (`generic_xdp_tx`): past the egress qdisc either way. And XDP runs
//! before tc ingress. So a shaper on an attached interface (SQM: HTB or
//! cake on the WAN for the upload, an ingress filter redirecting to an IFB
//! for the download) and tc filters or programs there act only on the
//! packets the kernel forwards: the flows on the fast path are neither
//! shaped nor queued by them, and the bufferbloat control the owner set up
//! is gone for them. `attach` refuses over it unless told to carry the
//! flows anyway; `doctor` reports it (`shaping`).

use std::io;

use aya::programs::{SchedClassifier, tc::TcAttachType};

use crate::netlink::{self, TcObject};

/// Disciplines that neither shape nor classify: the kernel's defaults
/// (`noqueue` on virtual devices, `mq` over `pfifo_fast` or the
/// `net.core.default_qdisc`) and the work-conserving queue managers a
/// distribution makes the default. They act only when the device's own
/// transmit queue backs up, which the fast path's frames fill the same
/// way (XDP frames wait in the driver's ring instead).
const NOT_SHAPING: &[&str] = &[
    "noqueue",
    "pfifo_fast",
    "pfifo",
    "bfifo",
    "pfifo_head_drop",
    "mq",
    "fq_codel",
    "fq",
    "codel",
    "sfq",
    "pie",
    "fq_pie",
];
/// Qdiscs that only hold filters, reported through those.
const FILTER_HOOKS: &[&str] = &["ingress", "clsact"];
/// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)`: the filters of an
/// `ingress` qdisc or of clsact's ingress hook.
const INGRESS_HOOK: u32 = 0xffff_fff2;
/// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)`.
const EGRESS_HOOK: u32 = 0xffff_fff3;
const TC_H_ROOT: u32 = 0xffff_ffff;

/// What acts on one interface's packets in tc.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TcSeen {
    pub qdiscs: Vec<TcObject>,
    /// The classifiers (`u32`, `bpf`) of the filters on the ingress hook.
    pub ingress_filters: Vec<String>,
    /// ... and on clsact's egress hook.
    pub egress_filters: Vec<String>,
    /// Programs attached through tcx links (kernel 6.6 on).
    pub tcx_ingress: usize,
    pub tcx_egress: usize,
}

impl TcSeen {
    /// Reads interface `iface` (index `ifindex`) in the current namespace.
    pub fn read(iface: &str, ifindex: u32) -> io::Result<Self> {
        let kinds = |hook| -> io::Result<Vec<String>> {
            let mut k: Vec<String> = netlink::filters(ifindex, hook)?
                .into_iter()
                .map(|f| f.kind)
                .filter(|k| !k.is_empty())
                .collect();
            k.sort();
            k.dedup();
            Ok(k)
        };
        // A kernel without tcx (before 6.6) refuses the query: nothing is
        // attached that way then.
        let tcx = |at| SchedClassifier::query_tcx(iface, at).map_or(0, |(_, p)| p.len());
        let qdiscs = netlink::qdiscs(ifindex)?;
        // An `ingress` qdisc answers for any hook with its one block: only
        // clsact has an egress hook.
        let egress_filters = if qdiscs.iter().any(|q| q.kind == "clsact") {
            kinds(EGRESS_HOOK)?
        } else {
            Vec::new()
        };
        Ok(Self {
            ingress_filters: kinds(INGRESS_HOOK)?,
            egress_filters,
            qdiscs,
            tcx_ingress: tcx(TcAttachType::Ingress),
            tcx_egress: tcx(TcAttachType::Egress),
        })
    }

    /// What the fast path's flows skip, one phrase each; empty: nothing.
    #[must_use]
    pub fn skipped(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .qdiscs
            .iter()
            .filter(|q| {
                !NOT_SHAPING.contains(&q.kind.as_str()) && !FILTER_HOOKS.contains(&q.kind.as_str())
            })
            .map(|q| {
                if q.parent == TC_H_ROOT {
                    format!("qdisc {} {} (root)", q.kind, handle(q.handle))
                } else {
                    format!(
                        "qdisc {} {} (parent {})",
                        q.kind,
                        handle(q.handle),
                        handle(q.parent)
                    )
                }
            })
            .collect();
        let hooked = |hook: &str, kinds: &[String], tcx: usize, out: &mut Vec<String>| {
            if !kinds.is_empty() {
                out.push(format!("tc filters on {hook} ({})", kinds.join(", ")));
            }
            if tcx > 0 {
                out.push(format!("{tcx} tcx program(s) on {hook}"));
            }
        };
        hooked("ingress", &self.ingress_filters, self.tcx_ingress, &mut out);
        hooked("egress", &self.egress_filters, self.tcx_egress, &mut out);
        out
    }
}

/// What the fast path's flows skip on interface `iface` of the current
/// namespace, one phrase each ([`TcSeen::skipped`]).
pub fn skipped_on(iface: &str) -> io::Result<Vec<String>> {
    let ifindex = netlink::ifindex(iface).map_err(io::Error::other)?;
    Ok(TcSeen::read(iface, ifindex)?.skipped())
}

/// A tc handle as `tc` prints it: `1:`, `1:10`, `ffff:`.
fn handle(h: u32) -> String {
    let (major, minor) = (h >> 16, h & 0xffff);
    if minor == 0 {
        format!("{major:x}:")
    } else {
        format!("{major:x}:{minor:x}")
    }
}

/// The sentence `doctor` and `attach` say about `skipped` on an
/// interface (which they name before it).
#[must_use]
pub fn message(skipped: &[String]) -> String {
    let list = match skipped {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    };
    format!(
        "{list}: the flows the fast path carries skip {} (an XDP redirect \
         transmits past the egress qdisc, and XDP runs before tc ingress), so traffic shaping \
         (SQM) and tc rules here act only on what the kernel forwards",
        if skipped.len() == 1 { "it" } else { "them" }
    )
}

/// How to put it right, for `doctor` and `attach`.
#[must_use]
pub fn fix(iface: &str) -> String {
    format!(
        "if the fast path's rate is what you want, remove the shaping (`tc qdisc del dev \
         {iface} root`, `tc qdisc del dev {iface} ingress`, or the SQM service); to keep the \
         shaping, leave this router on the kernel path (`detach`)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qdisc(kind: &str, handle: u32, parent: u32) -> TcObject {
        TcObject {
            ifindex: 2,
            handle,
            parent,
            kind: kind.into(),
        }
    }

    /// The defaults of a NIC and a veth, and an ingress or clsact qdisc
    /// without filters, skip nothing; SQM's pieces each show.
    #[test]
    fn only_shaping_qdiscs_and_filters_are_skipped() {
        let defaults = TcSeen {
            qdiscs: vec![
                qdisc("mq", 0, TC_H_ROOT),
                qdisc("fq_codel", 0, 0x1),
                qdisc("fq_codel", 0, 0x2),
                qdisc("clsact", 0xffff_0000, 0xffff_fff1),
            ],
            ..TcSeen::default()
        };
        assert_eq!(defaults.skipped(), Vec::<String>::new());
        assert_eq!(TcSeen::default().skipped(), Vec::<String>::new());
        // sqm-scripts' simple.qos: HTB with a leaf per class on the WAN,
        // and an ingress qdisc whose u32 filter redirects to an IFB.
        let sqm = TcSeen {
            qdiscs: vec![
                qdisc("htb", 0x1_0000, TC_H_ROOT),
                qdisc("fq_codel", 0x110_0000, 0x1_0011),
                qdisc("cake", 0x8001_0000, 0x1_0012),
                qdisc("ingress", 0xffff_0000, 0xffff_fff1),
            ],
            ingress_filters: vec!["u32".into()],
            egress_filters: vec!["bpf".into()],
            tcx_ingress: 0,
            tcx_egress: 2,
        };
        assert_eq!(
            sqm.skipped(),
            [
                "qdisc htb 1: (root)",
                "qdisc cake 8001: (parent 1:12)",
                "tc filters on ingress (u32)",
                "tc filters on egress (bpf)",
                "2 tcx program(s) on egress",
            ]
        );
        let m = message(&sqm.skipped()[..1]);
        assert!(
            m.starts_with("qdisc htb 1: (root): the flows the fast path carries skip it"),
            "{m}"
        );
        let m = message(&sqm.skipped()[..3]);
        assert!(
            m.starts_with(
                "qdisc htb 1: (root), qdisc cake 8001: (parent 1:12) and tc filters on \
                 ingress (u32): the flows the fast path carries skip them"
            ),
            "{m}"
        );
    }
}
