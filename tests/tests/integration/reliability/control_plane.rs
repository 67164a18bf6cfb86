//! The control plane under load.

use super::*;
use crate::ctl::kill_group;

/// Asserts that every counter in `b` is at least its value in `a`.
fn assert_monotonic(a: &Value, b: &Value, i: usize) {
    for (name, v) in a.as_object().unwrap() {
        if name == "conntrack" {
            continue;
        }
        for field in ["packets", "bytes", "events"] {
            if let Some(x) = v[field].as_u64() {
                let y = b[name][field]
                    .as_u64()
                    .unwrap_or_else(|| panic!("iteration {i}: {name}.{field} missing: {b}"));
                assert!(y >= x, "iteration {i}: {name}.{field} went back {x} -> {y}");
            }
        }
    }
}

/// `stats --json`, `conntrack list --json` and `forward add/list/del` in a
/// loop of 50 while iperf runs four TCP streams through the NAT: every
/// command succeeds, every JSON parses, counters never go back, rules come
/// and go as told.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn control_plane_is_consistent_under_load() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let mut server = t.spawn(
        Ns::Server,
        &[
            "sh",
            "-c",
            "exec timeout -k 2 150 iperf -s -p 5001 >/dev/null 2>&1",
        ],
    );
    // Wait (bounded) until the iperf server listens.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !t.exec_ok(Ns::Server, &["ss", "-ltn"]).contains(":5001") {
        assert!(Instant::now() < deadline, "iperf server did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut client = t.spawn(
        Ns::Client,
        &[
            "sh",
            "-c",
            "exec timeout -k 2 130 iperf -c 203.0.113.2 -p 5001 -P 4 -t 120 >/dev/null 2>&1",
        ],
    );
    let start_stats = t.stats();
    // Wait (bounded) until the streams run.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counter_delta(&start_stats, &t.stats(), "fwd_outbound") < 1000 {
        assert!(Instant::now() < deadline, "iperf traffic did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let started = Instant::now();
    let mut prev = t.stats();
    let first = prev.clone();
    let mut max_flows = 0;
    for i in 0..50usize {
        let s = t.stats();
        assert_monotonic(&prev, &s, i);
        prev = s;
        let flows = t.conntrack();
        for f in &flows {
            for k in ["proto", "state", "orig_src", "xlat_src", "xlat_dst"] {
                assert!(f[k].is_string(), "iteration {i}: flow without {k}: {f}");
            }
        }
        max_flows = max_flows.max(flows.len());
        let port = (9000 + i).to_string();
        t.router_ctl_ok(&["forward", "add", "tcp", &port, "192.168.50.2:80"]);
        let rules: Value =
            serde_json::from_str(&t.router_ctl_ok(&["forward", "list", "--json"])).unwrap();
        assert_eq!(
            rules.as_array().map(Vec::len),
            Some(1),
            "iteration {i}: {rules}"
        );
        t.router_ctl_ok(&["forward", "del", "tcp", &port]);
        let rules: Value =
            serde_json::from_str(&t.router_ctl_ok(&["forward", "list", "--json"])).unwrap();
        assert_eq!(
            rules.as_array().map(Vec::len),
            Some(0),
            "iteration {i}: {rules}"
        );
    }
    let loop_secs = started.elapsed().as_secs_f64();
    let last = t.stats();
    let iperf_running = client.try_wait().ok().flatten().is_none();
    kill_group(&mut client);
    kill_group(&mut server);
    let carried =
        counter_delta(&first, &last, "fwd_outbound") + counter_delta(&first, &last, "fwd_inbound");
    println!(
        "50 iterations (stats, conntrack list, forward add/list/del/list) in {loop_secs:.1} s \
         while iperf ran (still running at the end: {iperf_running}); the fast path carried \
         {carried} packets meanwhile; up to {max_flows} flows listed"
    );
    println!("counters moved during the loop: {:?}", moved(&first, &last));
    assert!(iperf_running, "iperf ended before the loop did");
    assert!(carried > 1000, "no traffic during the loop");
}
