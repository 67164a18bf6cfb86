//! Traffic control that the fast path skips. A frame XDP redirects goes
//! straight to the target device's transmit, in native mode the driver's
//! XDP transmit (`ndo_xdp_xmit`), in generic mode the device's queue
//! (`generic_xdp_tx`): past the egress qdisc either way. And XDP runs
//! before tc ingress. So a shaper on an attached interface (SQM: HTB or
//! cake on the WAN for the upload, an ingress filter redirecting to an IFB
//! for the download) and tc filters or programs there act only on the
//! packets the kernel forwards: the flows on the fast path are neither
//! shaped nor queued by them, and the bufferbloat control the owner set up
//! is gone for them. `attach` warns of it, `doctor` reports it
//! (`shaping`), the daemon follows it (`status`).
//!
//! Not seen here: rate limits in nftables (`limit rate`, meters, netdev
//! hooks), which the fast path's flows skip as they skip every rule on
//! established packets (README, "Two modes").

use std::io;

use crate::{
    bpfsys,
    netlink::{self, TcObject},
};

/// Disciplines that neither shape nor classify: the kernel's defaults
/// (`noqueue` on virtual devices, `mq` over `pfifo_fast` or the
/// `net.core.default_qdisc`) and the work-conserving queue managers a
/// distribution makes that default. They are not counted because they
/// matter only where this link is the bottleneck, not because the fast
/// path keeps them: its frames wait in the driver's ring, never in them.
/// `fq` and `cake` count when they limit a rate ([`limits_a_rate`]).
const NOT_SHAPING: &[&str] = &[
    "noqueue",
    "pfifo_fast",
    "pfifo",
    "bfifo",
    "pfifo_head_drop",
    "mq",
    "fq_codel",
    "codel",
    "sfq",
    "pie",
    "fq_pie",
    "dualpi2",
];
/// Qdiscs that only hold filters, reported through those.
const FILTER_HOOKS: &[&str] = &["ingress", "clsact"];
/// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS)`: the filters of an
/// `ingress` qdisc or of clsact's ingress hook.
const INGRESS_HOOK: u32 = 0xffff_fff2;
/// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)`.
const EGRESS_HOOK: u32 = 0xffff_fff3;
const TC_H_ROOT: u32 = 0xffff_ffff;
/// `TCA_FQ_FLOW_MAX_RATE` (u32 bytes per second; `u32::MAX`: none).
const TCA_FQ_FLOW_MAX_RATE: u16 = 7;
/// `TCA_CAKE_BASE_RATE64` (u64 bytes per second; 0: `unlimited`).
const TCA_CAKE_BASE_RATE64: u16 = 2;

/// What acts on one interface's packets in tc.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TcSeen {
    pub qdiscs: Vec<TcObject>,
    /// The classifiers (`u32`, `bpf`) of the filters on the ingress hook.
    pub ingress_filters: Vec<String>,
    /// ... and on clsact's egress hook.
    pub egress_filters: Vec<String>,
    /// Programs attached through tcx links (kernel 6.6 on).
    pub tcx_ingress: u32,
    pub tcx_egress: u32,
}

impl TcSeen {
    /// Reads interface `ifindex` of the current namespace.
    pub fn read(ifindex: u32) -> io::Result<Self> {
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
        let qdiscs = netlink::qdiscs(ifindex)?;
        // An `ingress` qdisc answers for any hook with its one block: only
        // clsact has an egress hook.
        let egress_filters = if qdiscs.iter().any(|q| q.kind == "clsact") {
            kinds(EGRESS_HOOK)?
        } else {
            Vec::new()
        };
        // Counting tcx programs needs CAP_NET_ADMIN, which a `doctor` run
        // with CAP_BPF alone lacks: not counted then (the qdiscs and
        // filters, readable by anyone, still are).
        let tcx = |attach_type| match bpfsys::prog_ids(ifindex, attach_type) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(0),
            Err(e) => Err(e),
            Ok(ids) => Ok(u32::try_from(but_the_witness(&ids)).unwrap_or(u32::MAX)),
        };
        Ok(Self {
            ingress_filters: kinds(INGRESS_HOOK)?,
            egress_filters,
            qdiscs,
            tcx_ingress: tcx(bpfsys::TCX_INGRESS)?,
            tcx_egress: tcx(bpfsys::TCX_EGRESS)?,
        })
    }

    /// What the fast path's flows skip, one phrase each; empty: nothing.
    #[must_use]
    pub fn skipped(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .qdiscs
            .iter()
            .filter(|q| shapes(q))
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
        let hooked = |hook: &str, kinds: &[String], tcx: u32, out: &mut Vec<String>| {
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

    /// How to put it right, for what [`Self::skipped`] found on `iface`.
    #[must_use]
    pub fn fix(&self, iface: &str) -> String {
        let mut how = Vec::new();
        if self.qdiscs.iter().any(shapes)
            || !self.ingress_filters.is_empty()
            || !self.egress_filters.is_empty()
        {
            how.push(format!(
                "stop what set it up (OpenWrt: `/etc/init.d/sqm stop` and disable it, else the \
                 next ifup puts it back), or `tc qdisc del dev {iface} root` and `tc qdisc del dev \
                 {iface} ingress`"
            ));
        }
        if self.tcx_ingress + self.tcx_egress > 0 {
            how.push(format!(
                "`bpftool net show dev {iface}` names the tcx programs: remove them with the \
                 tool that attached them"
            ));
        }
        format!(
            "if the fast path's rate is what you want, {}; to keep it for every flow, keep this \
             router on the kernel path (no attach, or `router-ctl detach`)",
            how.join("; ")
        )
    }
}

/// How many of the programs `ids` are not the offload daemon's egress
/// witness (told by its name: a tcx program that only notes where packets
/// go). Naming programs takes `CAP_SYS_ADMIN`; without it the witness
/// counts as any program.
fn but_the_witness(ids: &[u32]) -> usize {
    if ids.is_empty() {
        return 0;
    }
    let witnesses: Vec<u32> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some(router_common::maps::EGRESS_WITNESS_PROGRAM))
        .map(|p| p.id())
        .collect();
    ids.iter().filter(|id| !witnesses.contains(id)).count()
}

/// Whether qdisc `q` shapes or classifies (see [`NOT_SHAPING`]).
fn shapes(q: &TcObject) -> bool {
    match q.kind.as_str() {
        "fq" | "cake" => limits_a_rate(q),
        k => !NOT_SHAPING.contains(&k) && !FILTER_HOOKS.contains(&k),
    }
}

/// Whether an `fq` or `cake` qdisc limits a rate: fq's per-flow `maxrate`,
/// cake's `bandwidth` (SQM's cake); unlimited, each is a queue manager
/// (cake can be a distribution's default qdisc).
fn limits_a_rate(q: &TcObject) -> bool {
    let attr = |ty| {
        crate::nlmsg::attrs(&q.options)
            .find(|(t, _)| *t == ty)
            .map(|(_, d)| d)
    };
    match q.kind.as_str() {
        "fq" => attr(TCA_FQ_FLOW_MAX_RATE)
            .and_then(|d| d.get(..4))
            .is_some_and(|d| u32::from_ne_bytes(d.try_into().unwrap_or([0xff; 4])) != u32::MAX),
        _ => attr(TCA_CAKE_BASE_RATE64)
            .and_then(|d| d.get(..8))
            .is_some_and(|d| u64::from_ne_bytes(d.try_into().unwrap_or([0; 8])) != 0),
    }
}

/// What the fast path's flows skip on interface `ifindex` of the current
/// namespace, one phrase each ([`TcSeen::skipped`]).
pub fn skipped_on(ifindex: u32) -> io::Result<Vec<String>> {
    Ok(TcSeen::read(ifindex)?.skipped())
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
        "{list}: the flows the fast path carries skip {} (an XDP redirect transmits past the \
         egress qdisc, and XDP runs before tc ingress), so traffic shaping (SQM) and tc rules \
         here act only on what the kernel forwards",
        if skipped.len() == 1 { "it" } else { "them" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nlmsg::Msg;

    fn qdisc(kind: &str, handle: u32, parent: u32) -> TcObject {
        TcObject {
            ifindex: 2,
            handle,
            parent,
            kind: kind.into(),
            options: Vec::new(),
        }
    }

    fn with_option(mut q: TcObject, ty: u16, value: &[u8]) -> TcObject {
        let mut m = Msg::attrs_only();
        m.attr(ty, value);
        q.options = m.0;
        q
    }

    /// The defaults of a NIC and a veth, an ingress or clsact qdisc
    /// without filters, and fq or cake without a rate skip nothing; SQM's
    /// pieces each show.
    #[test]
    fn only_shaping_qdiscs_and_filters_are_skipped() {
        let cake = |rate: u64| with_option(qdisc("cake", 0, 0x1_0001), 2, &rate.to_ne_bytes());
        let fq = |rate: u32| with_option(qdisc("fq", 0, 0x1_0002), 7, &rate.to_ne_bytes());
        let defaults = TcSeen {
            qdiscs: vec![
                qdisc("mq", 0x1_0000, TC_H_ROOT),
                qdisc("fq_codel", 0, 0x1_0001),
                cake(0),
                fq(u32::MAX),
                qdisc("fq", 0, 0x1_0003),
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
                with_option(
                    qdisc("cake", 0x8001_0000, 0x1_0012),
                    2,
                    &1_250_000u64.to_ne_bytes(),
                ),
                with_option(
                    qdisc("fq", 0x8002_0000, 0x1_0013),
                    7,
                    &125_000u32.to_ne_bytes(),
                ),
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
                "qdisc fq 8002: (parent 1:13)",
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
                "qdisc htb 1: (root), qdisc cake 8001: (parent 1:12) and qdisc fq 8002: (parent \
                 1:13): the flows the fast path carries skip them"
            ),
            "{m}"
        );
        // The fix names what applies: tc and the SQM service for qdiscs,
        // bpftool for tcx programs only.
        let f = sqm.fix("wan0");
        assert!(
            f.contains("tc qdisc del dev wan0 root") && f.contains("bpftool"),
            "{f}"
        );
        let tcx_only = TcSeen {
            tcx_ingress: 1,
            ..TcSeen::default()
        };
        let f = tcx_only.fix("wan0");
        assert!(
            !f.contains("tc qdisc del") && f.contains("bpftool net show dev wan0"),
            "{f}"
        );
    }
}
