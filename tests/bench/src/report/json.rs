//! results.json: every run, the micro-benchmark's cases and the frags
//! experiment's rows, field by field.

use crate::measure::hosts::HostTcp;
use crate::model::{FastPathShare, RunResult};
use crate::workloads::frags;
use crate::workloads::micro::Case;

/// Every run with all its figures.
pub fn runs_json(runs: &[RunResult]) -> serde_json::Value {
    runs.iter()
        .map(|r| {
            serde_json::json!({
                "path": r.path.name(),
                "topology": r.wire.name(),
                "workload": r.point.workload.json_name(),
                "generator": r.point.workload.generator(),
                "conns": r.point.conns,
                "gbps": r.gbps,
                "iperf_gbps": r.iperf_gbps,
                "pps": r.pps,
                "sent_pps": r.sent_pps,
                "router_pps": r.router_pps,
                "loss_pct": r.loss_pct,
                "lost": r.lost,
                "sink_drops": r.sink_drops,
                "rtt_ms_p50": r.rtt_ms_p50,
                "rtt_ms_p99": r.rtt_ms_p99,
                "ping_loss_pct": r.ping_loss_pct,
                // `rtt_ms_p99` is null then: more than 1 % of the pings lost.
                "rtt_p99_lost": r.rtt_ms_p99.is_infinite(),
                "cpu_pct": r.cpu_pct,
                "softirq_pct": r.softirq_pct,
                "router_ns_per_pkt": r.router_ns_per_pkt,
                "router_avg_pkt_bytes": r.router_avg_pkt_bytes,
                "active_s": r.active_s,
                "backlog_drops": r.backlog_drops,
                "quiet_wait_s": r.quiet_wait_s,
                "router_pkts": r.router_pkts,
                "run_cpu_pct": r.run_cpu_pct,
                "run_ns_per_pkt": r.run_ns_per_pkt,
                "stream_s": r.stream_s,
                "offload": r.point.offload.name(),
                "nodelay": r.point.nodelay,
                "streams": r.streams,
                "connect_failures": r.connect_failures,
                "wall_s": r.wall_s,
                "cut_short": r.cut_short,
                "attempts": r.attempts,
                "notes": r.notes,
                "offered_mbps": r.offered_mbps,
                "fast_path": fast_path_json(r.fast_path.as_ref()),
                "host_tcp": host_tcp_json(r.host_tcp.as_ref()),
            })
        })
        .collect()
}

/// The end hosts' TCP segments, retransmissions, timeouts and transmit
/// drops; null for UDP.
pub fn host_tcp_json(h: Option<&HostTcp>) -> serde_json::Value {
    h.map_or(serde_json::Value::Null, |h| {
        serde_json::json!({
            "out_segs": h.out_segs,
            "retrans_segs": h.retrans_segs,
            "retrans_pct": h.retrans_pct(),
            "timeouts": h.timeouts,
            "tx_dropped": h.tx_dropped,
        })
    })
}

/// Who forwarded an offload run's packets; null on the other paths.
pub fn fast_path_json(fp: Option<&FastPathShare>) -> serde_json::Value {
    fp.map_or(serde_json::Value::Null, |fp| {
        serde_json::json!({
            "xdp_pkts": fp.xdp_pkts,
            "kernel_pkts": fp.kernel_pkts,
            "xdp_pct": fp.xdp_pct(),
            "flows_offloaded": fp.flows_offloaded,
            "peak_flows": fp.peak_flows,
            "steady_xdp_pct": fp.steady_xdp_pct,
        })
    })
}

pub fn frags_json(rows: &[frags::Row]) -> serde_json::Value {
    rows.iter()
        .map(|r| {
            serde_json::json!({
                "attached": r.attached.key(),
                "client_tso": r.client_tso,
                "gbps": r.run.gbps,
                "router_avg_pkt_bytes": r.run.router_avg_pkt_bytes,
                "router_ns_per_pkt": r.run.router_ns_per_pkt,
                "cpu_pct": r.run.cpu_pct,
                "softirq_pct": r.run.softirq_pct,
                "rtt_ms_p50": r.run.rtt_ms_p50,
                "rtt_ms_p99": r.run.rtt_ms_p99,
                "ping_loss_pct": r.run.ping_loss_pct,
                "rtt_p99_lost": r.run.rtt_ms_p99.is_infinite(),
                "offload": r.run.point.offload.name(),
                "conns": r.run.point.conns,
            })
        })
        .collect()
}

pub fn micro_json(cases: &[Case]) -> serde_json::Value {
    cases
        .iter()
        .map(|c| {
            serde_json::json!({
                "case": c.name,
                "what": c.what,
                "verdict": c.verdict,
                "calls": c.calls,
                "unexpected_verdicts": c.unexpected,
                "ns_per_call_median": c.median_ns,
                "ns_per_call_p10": c.p10_ns,
                "ns_per_call_p90": c.p90_ns,
                "ns_amortized": c.amortized_ns,
                "repeat": c.repeat,
            })
        })
        .collect()
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::model::{DataPath, Offload, Point, Workload};

    #[test]
    fn runs_carry_their_topology() {
        let p = Point::new(Workload::TcpPaced, 1, Offload::Off);
        let mut cabled = RunResult::blank(DataPath::Xdp, p);
        cabled.wire = crate::model::Wire::Cable;
        let v = runs_json(&[RunResult::blank(DataPath::Kernel, p), cabled]);
        assert_eq!(
            (&v[0]["topology"], &v[1]["topology"]),
            (&"veth".into(), &"cable".into())
        );
    }

    #[test]
    fn runs_carry_the_fast_path_share_or_null() {
        let p = Point::new(Workload::Tcp, 1, Offload::Off);
        let mut off = RunResult::blank(DataPath::Offload, p);
        off.fast_path = Some(FastPathShare {
            xdp_pkts: 90,
            kernel_pkts: 10,
            flows_offloaded: 2,
            peak_flows: Some(2),
            steady_xdp_pct: Some(99.5),
        });
        let v = runs_json(&[RunResult::blank(DataPath::Kernel, p), off]);
        assert!(v[0]["fast_path"].is_null());
        assert_eq!(v[0]["topology"], "veth");
        assert_eq!(v[1]["path"], "offload");
        assert_eq!(
            v[1]["fast_path"],
            serde_json::json!({"xdp_pkts": 90, "kernel_pkts": 10, "xdp_pct": 90.0,
                               "flows_offloaded": 2, "peak_flows": 2, "steady_xdp_pct": 99.5})
        );
    }
}
