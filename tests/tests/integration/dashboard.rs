//! The Grafana dashboard in `examples/grafana`: every metric its Prometheus
//! queries exists in a running router's `/metrics`, and it covers what an
//! operator watches (rates per reason, conntrack fill, port-allocation
//! failures, offload events, the daemon's health).

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use tests::{Ns, Topology};

use crate::ctl::{DetachOnDrop, wait_for_or_show};
use crate::daemon_run::{RunningDaemon, Scratch, config_text, http};

const DASHBOARD: &str = include_str!("../../../examples/grafana/xdp-router.json");

/// Query-language words that are not metric names.
const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
];

/// Removes bracketed parts that hold no metric names: label matchers
/// `{...}`, ranges `[...]` and string literals.
fn strip(expr: &str) -> String {
    let mut out = String::new();
    let mut close = None;
    for ch in expr.chars() {
        match (close, ch) {
            (None, '{') => close = Some('}'),
            (None, '[') => close = Some(']'),
            (None, '"') => close = Some('"'),
            (None, c) => out.push(c),
            (Some(end), c) if c == end => {
                close = None;
                out.push(' ');
            }
            (Some(_), _) => {}
        }
    }
    out
}

/// The metric names a Prometheus query selects: identifiers that are not
/// functions (followed by `(`), keywords, or the label lists of `by (...)`
/// / `without (...)`. Grafana's `label_values(METRIC, LABEL)` yields METRIC.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let text = strip(expr);
    let mut names = BTreeSet::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    let mut skip_group = false;
    let mut label_values = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' || c == '$' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':' | '$'))
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j] == ' ' {
                j += 1;
            }
            let rest: String = chars[j..].iter().take(8).collect();
            // A function, or an aggregation with its grouping first
            // (`sum by (x) (...)`).
            let call = chars.get(j) == Some(&'(')
                || ["by ", "by(", "without ", "without("]
                    .iter()
                    .any(|g| rest.starts_with(g));
            if [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&word.as_str())
            {
                // Followed by a label list, or (group_*) by nothing.
                skip_group = chars.get(j) == Some(&'(');
            } else if word == "label_values" {
                label_values = true;
            } else if !call && !KEYWORDS.contains(&word.as_str()) && !word.starts_with('$') {
                names.insert(word);
                if label_values {
                    // Its second argument is a label.
                    break;
                }
            }
            continue;
        }
        if c == '(' && skip_group {
            // A label list: skip to its end.
            while i < chars.len() && chars[i] != ')' {
                i += 1;
            }
            skip_group = false;
        } else if c.is_ascii_digit() {
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            continue;
        }
        i += 1;
    }
    names
}

/// Every query of the dashboard: panel targets (rows included) and
/// template variables.
fn queries(dash: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if (k == "expr" || k == "definition")
                        && let Some(s) = x.as_str()
                    {
                        out.push(s.to_owned());
                    } else {
                        walk(x, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dash, &mut out);
    out
}

fn dashboard_metrics() -> BTreeSet<String> {
    let dash: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let qs = queries(&dash);
    assert!(qs.len() >= 15, "only {} queries", qs.len());
    let mut all = BTreeSet::new();
    for q in &qs {
        let names = metric_names(q);
        assert!(!names.is_empty(), "no metric in {q:?}");
        all.extend(names);
    }
    all
}

#[test]
fn promql_metric_names_are_extracted() {
    let n = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        n(
            r#"sum by (reason) (rate(xdp_router_passed_packets_total{instance=~"$instance"}[$__rate_interval])) > 0"#
        ),
        ["xdp_router_passed_packets_total"]
    );
    assert_eq!(
        n(r#"xdp_router_conntrack_entries{a="b"} / xdp_router_conntrack_capacity"#),
        [
            "xdp_router_conntrack_capacity",
            "xdp_router_conntrack_entries"
        ]
    );
    assert_eq!(
        n("label_values(xdp_router_up, instance)"),
        ["xdp_router_up"]
    );
    assert_eq!(n("rate(foo_total[5m]) * 8"), ["foo_total"]);
    assert_eq!(n("sum without (cpu) (bar) or on (x) baz"), ["bar", "baz"]);
}

#[test]
fn dashboard_covers_what_an_operator_watches() {
    let m = dashboard_metrics();
    for name in &m {
        assert!(name.starts_with("xdp_router_"), "{name} is not ours");
    }
    for need in [
        "xdp_router_forwarded_packets_total",
        "xdp_router_passed_packets_total",
        "xdp_router_dropped_packets_total",
        "xdp_router_conntrack_entries",
        "xdp_router_conntrack_capacity",
        "xdp_router_port_allocation_failures_total",
        "xdp_router_offload_events_total",
        "xdp_router_daemon_up",
        "xdp_router_up",
    ] {
        assert!(m.contains(need), "the dashboard does not show {need}");
    }
}

/// The metrics with a `family` label (every verdict, the conntrack
/// gauges) are plotted per family: a panel target that queries one keeps
/// the label (no `sum by` without it) and shows it in its legend.
#[test]
fn family_labelled_metrics_keep_their_family_in_the_legend() {
    fn targets(v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                if let (Some(e), Some(l)) = (
                    m.get("expr").and_then(Value::as_str),
                    m.get("legendFormat").and_then(Value::as_str),
                ) {
                    out.push((e.to_owned(), l.to_owned()));
                }
                m.values().for_each(|x| targets(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| targets(x, out)),
            _ => {}
        }
    }
    let dash: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut all = Vec::new();
    targets(&dash, &mut all);
    let labelled = [
        "xdp_router_forwarded_",
        "xdp_router_passed_",
        "xdp_router_dropped_",
        "xdp_router_conntrack_",
    ];
    let mut seen = 0;
    for (expr, legend) in &all {
        if labelled.iter().any(|m| expr.contains(m)) {
            seen += 1;
            assert!(legend.contains("{{family}}"), "{expr}: legend {legend:?}");
            assert!(
                keeps_family(expr),
                "{expr} aggregates the families together"
            );
        }
    }
    assert!(seen >= 8, "only {seen} targets of family-labelled metrics");
}

/// Sample names of a Prometheus text exposition.
fn exposed(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_owned))
        .collect()
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn every_dashboard_metric_is_in_a_running_routers_metrics() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    t.warm_neighbours();
    let scratch = Scratch::new("dashboard");
    let file = scratch.path("router.toml");
    std::fs::write(
        &file,
        config_text("1024-60999", &[("tcp", 8080, "192.168.50.2:80")]),
    )
    .unwrap();
    let daemon = RunningDaemon::start(
        &t,
        Some(Ns::Client),
        &scratch,
        &[
            "--config",
            file.to_str().unwrap(),
            // All addresses of the client's namespace: warned about.
            "--listen",
            "0.0.0.0:0",
        ],
    );
    let addr = daemon.page_addr();
    assert!(addr.ip().is_unspecified(), "{addr}");
    // On stderr, read by another thread than the address's stdout line.
    wait_for_or_show(
        "the warning for a non-loopback listener",
        Duration::from_secs(5),
        || daemon.log().contains("not loopback"),
        || daemon.log(),
    );
    let local = std::net::SocketAddr::from(([127, 0, 0, 1], addr.port()));
    let (code, _, body) = http(&t, Ns::Client, local, "GET", "/metrics");
    assert_eq!(code, 200, "{body}");
    let have = exposed(&body);
    let want = dashboard_metrics();
    let missing: Vec<&String> = want.difference(&have).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics /metrics does not have: {missing:?}\n{body}"
    );
    println!(
        "{} metrics queried by the dashboard, all among the {} exposed",
        want.len(),
        have.len()
    );
}

/// Whether every aggregation in the `PromQL` expression `expr` keeps the
/// `family` label: `sum by (..., family)` does; `sum(...)`,
/// `sum without (family)` and a `by` list without it do not.
fn keeps_family(expr: &str) -> bool {
    let ops = ["sum", "avg", "max", "min", "count"];
    let mut rest = expr;
    while let Some(at) = ops
        .iter()
        .filter_map(|op| rest.find(op).map(|i| (i, op.len())))
        .min()
    {
        let (i, len) = at;
        // Only a whole word: `max_over_time`, `xdp_router_..._sum` are not.
        let before_ok = rest[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_'));
        let after = &rest[i + len..];
        let after_ok = after.starts_with([' ', '(']);
        if before_ok && after_ok {
            let clause = after.trim_start();
            if let Some(list) = clause.strip_prefix("by") {
                let list = list.trim_start().trim_start_matches('(');
                if !list.split(')').next().is_some_and(|l| l.contains("family")) {
                    return false;
                }
            } else {
                // `sum(` or `sum without (...)`: the label goes (a
                // `without` that keeps family lists other labels, which
                // this dashboard does not use).
                return false;
            }
        }
        rest = &rest[i + len..];
    }
    true
}

#[test]
fn an_aggregation_keeps_the_family_only_with_it_in_by() {
    assert!(keeps_family("sum by (reason, family) (rate(x[1m]))"));
    assert!(keeps_family("rate(x_total[1m])"));
    assert!(!keeps_family("sum(rate(x[1m]))"));
    assert!(!keeps_family("sum without (family) (rate(x[1m]))"));
    assert!(!keeps_family("sum by (reason) (rate(x[1m]))"));
    assert!(keeps_family("max_over_time(x[5m])"));
}
