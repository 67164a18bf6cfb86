//! The report: `report.md` (tables shaped like a router review, the
//! goals, the micro-benchmark, the frags experiment, notes on method and
//! limits), `results.json` and `throughput.svg`.

mod chart;
mod goals;
mod json;
mod notes;
pub mod review;
mod sections;
mod tables;

use std::fmt::Write as _;
use std::time::Duration;

use crate::cli::Opts;
use crate::measure::sys;
use crate::model::{DataPath, RunResult};
use crate::run::mmss;
use crate::workloads::{bigtable, connrate, frags, ipv6, micro, scaling};
pub use tables::rtt_cell;

/// Measurements besides the kernel/xdp runs.
pub struct Extra {
    pub micro: Vec<micro::Case>,
    pub frag_rows: Vec<frags::Row>,
    /// Plain kernel forwarding, TCP -P 1, offload off.
    pub reference: Option<RunResult>,
    /// The live generator on 1 and on all CPUs.
    pub scaling: Vec<scaling::Row>,
    /// The live generator through small and large flow tables.
    pub big_table: Vec<bigtable::Row>,
    /// Short TCP connections per second, on the plain veths and between
    /// the cables (each row says its wire).
    pub conn_rate: Vec<connrate::Row>,
    /// TCP between XDP cables, offload off.
    pub cable: Vec<RunResult>,
    /// One TCP stream over IPv6, kernel and xdp.
    pub ipv6: Vec<ipv6::Row>,
    /// CPU, memory, kernel, NIC, crypto throughput.
    pub platform: serde_json::Value,
}

/// What the runs ran under, for the report.
pub struct RunEnv {
    /// Workloads left out, and why.
    pub skipped: Vec<String>,
    pub nofile: u64,
    /// TCP congestion control of the end hosts.
    pub cc: String,
    /// Active offload features per setting and path.
    pub offloads: serde_json::Value,
    pub elapsed: Duration,
    /// Wall time of each phase, seconds, in run order.
    pub phases: Vec<(&'static str, f64)>,
}

const MICRO_TITLE: &str = "### Packet cost: BPF_PROG_RUN micro-benchmark";

/// The title and what the run ran on.
fn header(o: &Opts, runs: &[RunResult], env: &RunEnv, machine: &serde_json::Value) -> String {
    let mut md = String::from("## Detailed results\n\n");
    let _ = writeln!(
        md,
        "{} run{}, {} s per iperf run, {} runs, took {}. Machine: {}, {} cores, {} GiB, kernel \
         {}, {} ({}). Topology: client ns -- veth -- router ns -- veth -- server ns, the server \
         has no route back (NAT required). kernel = `ip_forward=1` + iptables MASQUERADE; xdp = \
         `router-ctl attach lan0 wan0 --admit xdp` (standalone mode, native XDP, no iptables \
         NAT). The two alternate point by point. TCP congestion control on the end hosts: \
         {}. router-ctl (attach, the offload daemon) and the benchmark: {} build.{}\n",
        machine["date"].as_str().unwrap_or("?"),
        if o.quick { " (--quick)" } else { "" },
        o.secs,
        runs.len(),
        mmss(env.elapsed.as_secs_f64()),
        machine["cpu_model"].as_str().unwrap_or("?"),
        machine["cores"],
        machine["mem_gib"],
        machine["kernel"].as_str().unwrap_or("?"),
        machine["iperf"].as_str().unwrap_or("?"),
        machine["virtualization"].as_str().unwrap_or("?"),
        env.cc,
        // router-ctl is the one beside this binary (`tests::router_ctl_bin`),
        // built with the same profile.
        if cfg!(debug_assertions) {
            "dev (debug)"
        } else {
            "release"
        },
        if o.router_gro {
            " **The router's GRO on** (`--router-gro`, see Notes: Offloads): on the kernel \
             path it merges a stream's segments, so the TCP ratios are not those of the default \
             run; the IPv6 rows keep it off."
        } else {
            ""
        },
    );
    let _ = writeln!(
        md,
        "Columns per path: throughput (TCP: bytes into the server's interface per second \
         over the measurement window, i.e. what crossed the router; UDP: datagrams the iperf2 server \
         received per second, with loss), ping RTT p50 / p99 during the run, busy share of \
         the machine with the softirq share in brackets, router softirq time per packet with \
         bytes per packet; then xdp/kernel ratios (throughput: > 1 is xdp faster; ns/pkt: \
         < 1 is xdp cheaper). `*` = run cut short (see below).\n"
    );
    md
}

/// The plain-forwarding reference, one paragraph.
fn reference_paragraph(r: &RunResult) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Reference, plain kernel forwarding without netfilter (fresh topology whose router \
         namespace never loaded an iptables rule; route back instead of NAT), TCP -P 1, \
         offload off: {:.2} Gbit/s, RTT p50 / p99 {} ms, CPU {:.0}% (softirq \
         {:.0}%), {:.0} ns/pkt ({:.0} B/pkt).\n",
        r.gbps,
        tables::rtt_cell(r, 3),
        r.cpu_pct,
        r.softirq_pct,
        r.router_ns_per_pkt,
        r.router_avg_pkt_bytes
    );
    md
}

/// The micro-benchmark's section.
fn micro_section(micro: &[micro::Case]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "{MICRO_TITLE}\n");
    let _ = writeln!(
        md,
        "The router program (a separate, unattached copy with its own maps, CONFIG and \
         DEVICES filled as `attach` does) run by `BPF_PROG_RUN` on crafted frames in the \
         router namespace (real FIB and neighbours). A forwarded frame is rewritten in \
         place, so with `repeat` the next iteration would see another packet: every case \
         is timed per call (`repeat` = 1, fresh frame) and reported as the median of the \
         calls; that includes the test-run harness's fixed cost, which the trivial floor \
         shows. Cases that leave the frame untouched are also timed with a large `repeat` \
         (amortised: the program alone). The established LAN->WAN hits are amortised as a \
         ping-pong: a second entry, keyed by the flow's translated tuple on the same side, \
         translates it back, so each of 250 iterations of one call is a full hit (the frame \
         starts with TTL 255). The floor is a two-instruction `return \
         XDP_PASS` program loaded with the raw bpf(2) syscall; `pass-not-ipv4` is the \
         router program passing an ARP frame at its first check.\n"
    );
    md.push_str(&tables::micro_table(micro));
    md.push('\n');
    md
}

/// Runs cut short and runs that failed.
fn cut_short_section(runs: &[RunResult], failures: &[String]) -> String {
    let mut md = String::new();
    let short: Vec<&RunResult> = runs.iter().filter(|r| r.cut_short).collect();
    let _ = writeln!(md, "### Runs cut short\n");
    if short.is_empty() && failures.is_empty() {
        let _ = writeln!(md, "None.\n");
    }
    for r in short {
        let _ = writeln!(
            md,
            "- {} on {} (after {} attempt(s)): {}",
            r.point,
            r.path.name(),
            r.attempts,
            r.notes.join("; ")
        );
    }
    for f in failures {
        let _ = writeln!(md, "- FAILED: {f}");
    }
    md
}

/// results.json.
fn results_json(
    o: &Opts,
    runs: &[RunResult],
    extra: &Extra,
    failures: &[String],
    env: &RunEnv,
    (machine, goals): (serde_json::Value, serde_json::Value),
) -> serde_json::Value {
    let (micro, frag_rows) = (&extra.micro[..], &extra.frag_rows[..]);
    let reference = extra.reference.as_ref();
    serde_json::json!({
        "machine": machine,
        "platform": extra.platform,
        "settings": {
            "quick": o.quick,
            "secs": o.secs,
            "ping_interval_s": o.ping_interval,
            "retries": o.retries,
            "rlimit_nofile": env.nofile,
            "elapsed_s": env.elapsed.as_secs_f64(),
            "phase_s": env.phases.iter().map(|&(name, secs)| (name.to_owned(), secs.into())).collect::<serde_json::Map<_, _>>(),
            "offload_features": env.offloads,
            "tcp_congestion_control": env.cc,
            "tcp_sink": o.tcp_sink.name(),
            "pacing": o.pacing.name(),
            "router_gro": o.router_gro,
            "skipped": env.skipped,
        },
        "runs": json::runs_json(runs),
        "micro": json::micro_json(micro),
        "frags_experiment": json::frags_json(frag_rows),
        "scaling": sections::scaling_json(&extra.scaling),
        "cable": json::runs_json(&extra.cable),
        "conn_rate": sections::conn_rate_json(&extra.conn_rate),
        "flow_table": sections::big_table_json(&extra.big_table),
        "ipv6": ipv6::json(&extra.ipv6),
        // The same fields as a run.
        "reference_forwarding": reference.map(|r| json::runs_json(std::slice::from_ref(r))[0].take()),
        "goals": goals,
        "failures": failures,
    })
}

/// Writes the three artifacts and prints the tables.
pub fn write_artifacts(
    o: &Opts,
    runs: &[RunResult],
    extra: &Extra,
    failures: &[String],
    env: &RunEnv,
) -> Result<(), String> {
    let (micro, frag_rows) = (&extra.micro[..], &extra.frag_rows[..]);
    let reference = extra.reference.as_ref();
    let machine = sys::machine();
    let cores = machine["cores"].as_f64().unwrap_or(f64::NAN);
    let mut md = String::from("# XDP router benchmark: kernel path vs XDP path\n\n");
    md.push_str(&review::review_section(
        runs,
        &extra.cable,
        cores,
        (o.line_rate_mbps, o.pacing),
    ));
    md.push_str(&review::platform_section(&extra.platform));
    md.push_str(&header(o, runs, env, &machine));
    let tables = tables::tables(runs);
    md.push_str(&tables);
    if let Some(r) = reference {
        md.push_str(&reference_paragraph(r));
    }
    md.push_str(&sections::scaling_section(&extra.scaling));
    md.push_str(&sections::cable_section(&extra.cable, o.router_gro));
    md.push_str(&sections::conn_rate_section(&extra.conn_rate));
    md.push_str(&sections::big_table_section(&extra.big_table));
    md.push_str(&ipv6::section(&extra.ipv6));
    let mut goals = goals::evaluate(runs, micro, reference);
    goals.push(review::line_rate_goal(runs, &extra.cable, DataPath::Xdp));
    goals.push(review::line_rate_goal(
        runs,
        &extra.cable,
        DataPath::Offload,
    ));
    goals.push(goals::conn_setup_goal(&extra.conn_rate));
    goals.push(sections::scaling_goal(&extra.scaling));
    goals.push(sections::cable_goal(&extra.cable));
    goals.push(sections::big_table_goal(&extra.big_table));
    let goals_md = goals::section(&goals);
    md.push_str(&goals_md);
    if !micro.is_empty() {
        md.push_str(&micro_section(micro));
    }
    let frags_md = if frag_rows.is_empty() {
        String::new()
    } else {
        tables::frags_section(frag_rows)
    };
    md.push_str(&frags_md);
    md.push_str(&cut_short_section(runs, failures));
    let _ = writeln!(md, "\n### Notes\n");
    md.push_str(&notes::notes(runs, o, env));
    let json = results_json(
        o,
        runs,
        extra,
        failures,
        env,
        (machine, goals::json(&goals)),
    );
    let md_path = o.out.join("report.md");
    let json_path = o.out.join("results.json");
    let svg_path = o.out.join("throughput.svg");
    std::fs::write(&md_path, &md).map_err(|e| format!("{}: {e}", md_path.display()))?;
    let pretty = serde_json::to_string_pretty(&json).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, pretty).map_err(|e| format!("{}: {e}", json_path.display()))?;
    if o.only_conn_rate {
        // No points ran: nothing to chart.
        println!("{}", sections::conn_rate_section(&extra.conn_rate));
        println!("wrote {}, {}", md_path.display(), json_path.display());
        return Ok(());
    }
    if runs.is_empty() {
        return Err("no run succeeded; nothing to chart".into());
    }
    chart::chart(runs, &svg_path)?;
    println!("{tables}");
    println!("{goals_md}");
    if !frags_md.is_empty() {
        println!("{frags_md}");
    }
    if !micro.is_empty() {
        println!("{MICRO_TITLE}\n\n{}", tables::micro_table(micro));
    }
    println!(
        "wrote {}, {}, {} (took {})",
        md_path.display(),
        json_path.display(),
        svg_path.display(),
        mmss(env.elapsed.as_secs_f64())
    );
    Ok(())
}
