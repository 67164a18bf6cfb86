//! Per-flow counters end to end: a TCP transfer of known size through the
//! topology shows up in `conntrack list` with plausible packets and bytes
//! per direction, and `--sort`, `--limit` and the filters select what they
//! should.

use std::time::Duration;

use serde_json::Value;
use tests::{Ns, SERVER_ADDR, Topology, counter_delta, socket_addr};

use crate::ctl::{attach_and_print, read_until};

/// Payload of the echo round trip, each way (`Topology::try_tcp_echo`).
const ECHO_BYTES: u64 = 256 * 1024;

fn list(t: &Topology, args: &[&str]) -> Vec<Value> {
    let mut a = vec!["conntrack", "list", "--json"];
    a.extend_from_slice(args);
    serde_json::from_str::<Value>(&t.router_ctl_ok(&a))
        .expect("conntrack list --json")
        .as_array()
        .expect("an array of flows")
        .clone()
}

fn n(f: &Value, k: &str) -> u64 {
    f[k].as_u64().unwrap_or_else(|| panic!("no {k} in {f}"))
}

fn dsts(flows: &[Value]) -> Vec<String> {
    flows
        .iter()
        .map(|f| f["orig_dst"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn tcp_transfer_counted_per_direction_and_list_selects() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let before = t.stats();
    let _ = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5301));
    let _ = t.udp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5302));
    println!("{}", t.router_ctl_ok(&["conntrack", "list"]));

    let flows = list(&t, &[]);
    let tcp = flows
        .iter()
        .find(|f| f["proto"] == "tcp" && f["orig_dst"] == "203.0.113.2:5301")
        .unwrap_or_else(|| panic!("no TCP flow in {flows:?}"));
    // Each direction carried the payload, headers on top, plus the ACKs
    // of the other direction's data: at least the payload, not much more.
    for dir in ["orig", "reply"] {
        let (p, b) = (
            n(tcp, &format!("{dir}_packets")),
            n(tcp, &format!("{dir}_bytes")),
        );
        assert!(
            (ECHO_BYTES..=ECHO_BYTES + ECHO_BYTES / 4 + 20_000).contains(&b),
            "{dir}: {b} bytes for {ECHO_BYTES} of payload: {tcp}"
        );
        // At most a 64 KiB IP packet each, at least one per 1500 bytes
        // of the MTU as a bound on the other side.
        assert!(
            p >= ECHO_BYTES / 65_535 && p <= b / 40,
            "{dir}: {p} packets: {tcp}"
        );
    }
    // Every packet the data path forwarded belongs to a flow: the flows'
    // counts add up to the forwarded counters. Read again until they do:
    // the connections' last ACKs can still be on their way through the
    // router (a softirq the loaded machine defers) between the readings.
    let sums = || {
        let after = t.stats();
        let flows = list(&t, &[]);
        let flow_packets: u64 = flows
            .iter()
            .map(|f| n(f, "orig_packets") + n(f, "reply_packets"))
            .sum();
        let forwarded = counter_delta(&before, &after, "fwd_outbound")
            + counter_delta(&before, &after, "fwd_inbound");
        (flow_packets, forwarded, flows)
    };
    let seen = read_until(Duration::from_secs(5), sums, |s| s.0 == s.1);
    assert_eq!(seen.0, seen.1, "flows: {:?}", seen.2);

    let by_bytes = list(&t, &["--sort", "bytes", "--limit", "1"]);
    assert_eq!(dsts(&by_bytes), ["203.0.113.2:5301"]);
    let by_rate = list(&t, &["--sort", "rate"]);
    assert_eq!(dsts(&by_rate)[0], "203.0.113.2:5301");
    assert!(
        by_rate.windows(2).all(|w| {
            w[0]["mean_bytes_per_sec"].as_f64() >= w[1]["mean_bytes_per_sec"].as_f64()
        })
    );
    let udp = list(&t, &["--proto", "udp"]);
    assert!(
        !udp.is_empty() && udp.iter().all(|f| f["proto"] == "udp"),
        "{udp:?}"
    );
    assert_eq!(dsts(&list(&t, &["--port", "5302"])), ["203.0.113.2:5302"]);
    let both = list(&t, &["--addr", "203.0.113.2", "--proto", "tcp"]);
    assert_eq!(dsts(&both), ["203.0.113.2:5301"]);
    // The translated source (the router's WAN address) matches too.
    assert!(list(&t, &["--addr", "203.0.113.1"]).len() >= 2);
    assert!(list(&t, &["--addr", "192.168.50.77"]).is_empty());
    assert!(list(&t, &["--addr", "2001:db8::77"]).is_empty());
    // The table shows the columns.
    let table = t.router_ctl_ok(&["conntrack", "list", "--sort", "bytes"]);
    assert!(table.lines().next().unwrap().contains("o_bytes"), "{table}");
}

/// A table of more flows than one batch read holds (`conntrack count` and
/// `list` read the table `BPF_MAP_LOOKUP_BATCH` calls at a time, 4096
/// entries each): every entry is read once, none twice.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_table_larger_than_a_batch_is_read_whole() {
    use router_common::maps::{CONNTRACK_MAP, FLAG_ORIGINAL, FlowEntry, FlowKey};
    use std::os::fd::AsFd as _;

    const FLOWS: u16 = 5000;
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let mut keys = Vec::new();
    let mut values = Vec::new();
    for i in 0..FLOWS {
        let out = FlowKey::new([192, 168, 50, 2], [198, 51, 100, 7], 10_000 + i, 80, 6);
        let back = FlowKey::new([198, 51, 100, 7], [203, 0, 113, 1], 80, 10_000 + i, 6);
        keys.push(out);
        values.push(FlowEntry {
            peer: back,
            flags: FLAG_ORIGINAL,
            ..FlowEntry::default()
        });
        keys.push(back);
        values.push(FlowEntry {
            peer: out,
            ..FlowEntry::default()
        });
    }
    let path = crate::ctl::pin_dir(&t).join(CONNTRACK_MAP);
    let map = aya::maps::MapData::from_pin(&path).expect("the pinned CONNTRACK map");
    tests::rawbpf::update_batch(map.fd().as_fd(), &keys, &values).expect("filling the table");
    let counts: Value =
        serde_json::from_str(&t.router_ctl_ok(&["conntrack", "count", "--json"])).unwrap();
    assert_eq!(counts["entries"], 2 * u64::from(FLOWS), "{counts}");
    assert_eq!(counts["flows"], u64::from(FLOWS), "{counts}");
    let rows = list(&t, &["--port", "80"]);
    assert_eq!(rows.len(), usize::from(FLOWS));
}
