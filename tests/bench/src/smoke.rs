//! The smoke run's check (`--smoke`, run by `cargo xtask test`): the
//! artifacts are there and filled. No timing is asserted.

use crate::cli::Opts;
use crate::model::{DataPath, Point, Wire, Workload};
use crate::run::paths_of;

/// The smoke run's check: the three artifacts exist, and results.json has
/// every point of the run on each of its paths with a throughput above zero
/// (offload runs: with the fast path's share, which carried packets), the
/// goals, the frags experiment and every micro-benchmark case. Returns how
/// many runs it checked and what the run left out (results.json's
/// `settings.skipped`: a workload this machine cannot run, with why).
pub fn check_artifacts(o: &Opts) -> Result<(usize, Vec<String>), String> {
    let read = |name: &str| {
        let p = o.out.join(name);
        std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
    };
    for name in ["report.md", "throughput.svg"] {
        if read(name)?.trim().is_empty() {
            return Err(format!("{name} is empty"));
        }
    }

    let json: serde_json::Value =
        serde_json::from_str(&read("results.json")?).map_err(|e| format!("results.json: {e}"))?;
    check_review_and_platform(&read("report.md")?, &json)?;
    let runs = json["runs"].as_array().ok_or("results.json has no runs")?;
    let left_out: Vec<String> = json["settings"]["skipped"]
        .as_array()
        .map(|v| {
            v.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let live_skipped = left_out.iter().any(|s| s.starts_with("udp-live"));
    // The points that ran: all, but udp-live when it was skipped.
    let points: Vec<Point> = o
        .points()
        .into_iter()
        .filter(|p| p.workload != Workload::UdpLive || !live_skipped)
        .collect();
    check_runs(o, runs, &points)?;
    let mut wanted = Vec::new();
    if o.frags && o.workloads.contains(&Workload::Tcp) {
        wanted.push("frags_experiment");
    }
    if o.micro {
        wanted.push("micro");
    }
    if o.scaling && o.workloads.contains(&Workload::UdpLive) && !live_skipped {
        wanted.push("scaling");
    }
    if !crate::run::cable_points(o).is_empty() {
        wanted.push("cable");
        check_cable_paced(o, &json)?;
    }
    if o.conn_rate {
        wanted.push("conn_rate");
        check_conn_rate(o, &json)?;
    }
    if o.big_table > 0 && o.workloads.contains(&Workload::UdpLive) && !live_skipped {
        wanted.push("flow_table");
        check_flow_table(o, &json)?;
    }
    for key in wanted {
        if json[key].as_array().is_none_or(Vec::is_empty) {
            return Err(format!("results.json: {key} is empty"));
        }
    }
    // The goals that one point per workload can decide.
    let goals = json["goals"]
        .as_array()
        .ok_or("results.json has no goals")?;
    let decided = |prefix: &str| {
        goals.iter().any(|g| {
            g["goal"].as_str().is_some_and(|t| t.starts_with(prefix)) && g["met"].is_boolean()
        })
    };
    let mut must = Vec::new();
    if !points.is_empty() {
        must.push("router ns/packet");
    }
    if o.workloads.contains(&Workload::UdpLive) && !live_skipped {
        must.push("UDP 64-byte pps");
    }
    if o.micro {
        must.push("per-packet cost");
    }
    for m in must {
        if !decided(m) {
            return Err(format!(
                "results.json: the goal \"{m}...\" was not evaluated"
            ));
        }
    }
    Ok((runs.len(), left_out))
}

/// The flows rows: the xdp path's, and the control's when it ran, each
/// with traffic.
fn check_flow_table(o: &Opts, json: &serde_json::Value) -> Result<(), String> {
    let rows = json["flow_table"]
        .as_array()
        .ok_or("results.json: no flow_table")?;
    let mut paths = vec![DataPath::Xdp];
    if o.flows_control.reps > 0 {
        paths.push(DataPath::Lookup);
    }
    for path in paths {
        let ran = rows.iter().any(|r| {
            r["path"] == path.name()
                && r["table_flows"].as_u64().is_some_and(|n| n > 0)
                && r["pps"].as_f64().is_some_and(|p| p > 0.0)
        });
        if !ran {
            return Err(format!(
                "results.json: no flow_table row on the {} path with traffic",
                path.name()
            ));
        }
    }
    Ok(())
}

/// The paced points between the cables, on each of their paths, recorded
/// with their topology and offered rate (the review table's "CPU at line
/// rate" rows and goal take them).
fn check_cable_paced(o: &Opts, json: &serde_json::Value) -> Result<(), String> {
    let runs = json["cable"]
        .as_array()
        .ok_or("results.json has no cable runs")?;
    for p in crate::run::cable_points(o) {
        if p.workload != Workload::TcpPaced {
            continue;
        }
        for path in crate::workloads::cable::paths_of(p, o.offload_path) {
            let found = runs.iter().any(|r| {
                r["path"] == path.name()
                    && r["workload"] == p.workload.json_name()
                    && r["conns"] == p.conns
                    && r["topology"] == "cable"
                    && r["offered_mbps"].as_u64().is_some_and(|m| m > 0)
                    && r["gbps"].as_f64().is_some_and(|g| g > 0.0)
            });
            if !found {
                return Err(format!(
                    "results.json: no {} run of {p} between the cables (with \"topology\": \
                     \"cable\", an offered rate and traffic)",
                    path.name()
                ));
            }
        }
    }
    Ok(())
}

/// Every point of the run on each of its paths, with a throughput above
/// zero (offload runs: with the fast path's share).
fn check_runs(o: &Opts, runs: &[serde_json::Value], points: &[Point]) -> Result<(), String> {
    for p in points {
        for path in paths_of(o, *p) {
            let found = runs.iter().find(|r| {
                r["path"] == path.name()
                    && r["workload"] == p.workload.json_name()
                    && r["generator"] == p.workload.generator()
                    && r["conns"] == p.conns
                    && r["offload"] == p.offload.name()
                    && r["nodelay"] == p.nodelay
            });
            let Some(r) = found else {
                return Err(format!("no {} run of {p}", path.name()));
            };
            let thr = if p.workload.is_udp() {
                &r["pps"]
            } else {
                &r["gbps"]
            };
            if !thr.as_f64().is_some_and(|x| x > 0.0) {
                return Err(format!(
                    "the {} run of {p} moved nothing: {thr}",
                    path.name()
                ));
            }
            if path == DataPath::Offload {
                check_fast_path(&r["fast_path"], &format!("the offload run of {p}"))?;
            }
        }
    }
    Ok(())
}

/// The connection setup rate has a row with completed connections for
/// every path on each wire it ran on (the plain veths; the cables unless
/// --no-cable), each saying its wire; the offload rows' fast path carried
/// packets.
fn check_conn_rate(o: &Opts, json: &serde_json::Value) -> Result<(), String> {
    let rows = json["conn_rate"]
        .as_array()
        .ok_or("results.json has no conn_rate")?;
    let mut wires = vec![Wire::Veth];
    if crate::run::cable_conn_rate(o) {
        wires.push(Wire::Cable);
    }
    for wire in wires {
        for path in crate::run::conn_rate_rounds(o, wire).paths() {
            let what = format!("the {} conn_rate row on the {}", path.name(), wire.label());
            let row = rows
                .iter()
                .find(|r| r["path"] == path.name() && r["topology"] == wire.name())
                .ok_or_else(|| format!("results.json: {what} is missing"))?;
            if row["completed"].as_u64().is_none_or(|n| n == 0) {
                return Err(format!(
                    "results.json: {what} completed no connection: {row}"
                ));
            }
            if path == DataPath::Offload {
                check_fast_path(&row["fast_path"], &what)?;
            }
        }
    }
    Ok(())
}

/// An offload run's `fast_path`: every count there, and XDP carried some
/// of the packets (none would mean the daemon offloaded nothing).
fn check_fast_path(fp: &serde_json::Value, what: &str) -> Result<(), String> {
    for key in ["xdp_pkts", "kernel_pkts", "flows_offloaded"] {
        if fp[key].as_u64().is_none() {
            return Err(format!("results.json: {what} has no fast_path.{key}: {fp}"));
        }
    }
    if fp["xdp_pkts"] == 0 {
        return Err(format!(
            "results.json: on {what} XDP carried no packet (did the daemon offload nothing?): \
             {fp}"
        ));
    }
    Ok(())
}

/// The review's table and the platform are in the report, with a crypto
/// figure.
fn check_review_and_platform(md: &str, json: &serde_json::Value) -> Result<(), String> {
    for section in ["## The review's table", "## Platform"] {
        if !md.contains(section) {
            return Err(format!("report.md has no \"{section}\""));
        }
    }
    if json["platform"]["chacha20_poly1305_bytes_per_s"]
        .as_array()
        .is_none_or(Vec::is_empty)
    {
        return Err(format!(
            "results.json: no crypto figure in the platform ({})",
            json["platform"]["chacha20_poly1305_error"]
        ));
    }
    Ok(())
}

#[cfg(test)]
mod unit {
    use clap::Parser;

    use super::*;

    #[test]
    fn the_cable_paced_runs_must_carry_their_topology() {
        let o = crate::cli::Cli::try_parse_from(["router-bench", "--smoke"])
            .unwrap()
            .opts();
        let run = |path: &str, topology: &str| {
            serde_json::json!({"path": path, "workload": "tcp-paced", "conns": 1,
                               "topology": topology, "offered_mbps": 500, "gbps": 0.5})
        };
        let all = serde_json::json!({"cable": [
            run("kernel", "cable"), run("xdp", "cable"), run("offload", "cable")
        ]});
        assert_eq!(check_cable_paced(&o, &all), Ok(()));
        // A run recorded as the plain veth's, or one path missing: an error.
        let veth = serde_json::json!({"cable": [
            run("kernel", "cable"), run("xdp", "veth"), run("offload", "cable")
        ]});
        let e = check_cable_paced(&o, &veth).unwrap_err();
        assert!(e.contains("no xdp run of tcp-paced -P 1"), "{e}");
        let missing = serde_json::json!({"cable": [run("kernel", "cable"), run("xdp", "cable")]});
        assert!(check_cable_paced(&o, &missing).is_err());
    }

    #[test]
    fn the_conn_rate_rows_must_cover_every_path_on_both_wires() {
        let opts = |args: &[&str]| crate::cli::opts_of(args);
        let row = |path: &str, topology: &str| {
            serde_json::json!({"path": path, "topology": topology, "completed": 10,
                               "fast_path": {"xdp_pkts": 5, "kernel_pkts": 50,
                                             "flows_offloaded": 2}})
        };
        let paths = ["kernel", "xdp", "offload"];
        let rows_on = |wires: &[&str]| {
            let rows: Vec<_> = wires
                .iter()
                .flat_map(|w| paths.iter().map(|p| row(p, w)))
                .collect();
            serde_json::json!({ "conn_rate": rows })
        };
        let both = rows_on(&["veth", "cable"]);
        assert_eq!(check_conn_rate(&opts(&["--smoke"]), &both), Ok(()));
        let plain = rows_on(&["veth"]);
        let e = check_conn_rate(&opts(&["--smoke"]), &plain).unwrap_err();
        assert!(
            e.contains("the kernel conn_rate row on the XDP cables is missing"),
            "{e}"
        );
        // --no-cable: the plain veths' rows are all it wants.
        assert_eq!(
            check_conn_rate(&opts(&["--smoke", "--no-cable"]), &plain),
            Ok(())
        );
        // A row without completed connections, or an offload row whose
        // fast path carried nothing: an error.
        let mut idle = both.clone();
        idle["conn_rate"][4]["completed"] = 0.into();
        let e = check_conn_rate(&opts(&["--smoke"]), &idle).unwrap_err();
        assert!(e.contains("the xdp conn_rate row on the XDP cables"), "{e}");
        let mut unoffloaded = both;
        unoffloaded["conn_rate"][5]["fast_path"]["xdp_pkts"] = 0.into();
        assert!(check_conn_rate(&opts(&["--smoke"]), &unoffloaded).is_err());
    }

    #[test]
    fn the_flows_rows_must_include_the_control_when_it_ran() {
        let opts = |args: &[&str]| crate::cli::opts_of(args);
        let row = |path: &str, pps: f64| serde_json::json!({"path": path, "table_flows": 20000, "live_flows": 2000, "pps": pps});
        let both = serde_json::json!({"flow_table": [row("xdp", 2e6), row("lookup", 2e6)]});
        assert_eq!(check_flow_table(&opts(&["--smoke"]), &both), Ok(()));
        let xdp_only = serde_json::json!({"flow_table": [row("xdp", 2e6)]});
        let e = check_flow_table(&opts(&["--smoke"]), &xdp_only).unwrap_err();
        assert!(e.contains("on the lookup path"), "{e}");
        // Not asked for: not wanted.
        let none = opts(&["--smoke", "--flows-control-reps", "0"]);
        assert_eq!(check_flow_table(&none, &xdp_only), Ok(()));
        // A control row without traffic does not count.
        let idle = serde_json::json!({"flow_table": [row("xdp", 2e6), row("lookup", 0.0)]});
        assert!(check_flow_table(&opts(&["--smoke"]), &idle).is_err());
    }
}
