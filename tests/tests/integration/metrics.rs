//! `router-ctl metrics`: the Prometheus endpoint scraped over loopback and
//! parsed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use router_common::maps::Counter;
use tests::{Ns, SERVER_ADDR, Topology, router_ctl_bin};

use crate::ctl::*;

/// The metrics server, killed on drop.
pub(crate) struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    pub(crate) fn start(t: &Topology) -> Self {
        Self::start_in(t.ns_name(Ns::Router))
    }

    /// The metrics server of the router in namespace `netns`.
    pub(crate) fn start_in(netns: &str) -> Self {
        let mut child = Command::new(router_ctl_bin())
            .args(["-n", netns, "metrics", "--listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the metrics server");
        // The first line, read on a thread: a server that never prints it
        // fails the test in 10 s rather than hanging the suite.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let Ok(line) = rx.recv_timeout(std::time::Duration::from_secs(10)) else {
            let _ = child.kill();
            panic!("the metrics server printed no address within 10 s");
        };
        let url = line
            .trim()
            .strip_prefix("serving metrics on http://")
            .unwrap_or_else(|| panic!("unexpected first line: {line:?}"));
        let addr: SocketAddr = url.trim_end_matches("/metrics").parse().unwrap();
        assert!(addr.ip().is_loopback());
        Self { child, addr }
    }

    /// (status code, headers, body) of `METHOD PATH`.
    pub(crate) fn request(&self, method: &str, path: &str) -> (u16, String, String) {
        self.request_for(method, path, "localhost")
    }

    /// [`Self::request`] with `Host: HOST`.
    pub(crate) fn request_for(
        &self,
        method: &str,
        path: &str,
        host: &str,
    ) -> (u16, String, String) {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "{method} {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let (head, body) = resp.split_once("\r\n\r\n").expect("HTTP response");
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status code");
        (code, head.to_owned(), body.to_owned())
    }

    /// The samples of one scrape, `name{labels}` -> value.
    pub(crate) fn scrape(&self) -> BTreeMap<String, f64> {
        let (code, _, body) = self.request("GET", "/metrics");
        assert_eq!(code, 200, "{body}");
        parse(&body).0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sample lines `name{labels} value` -> value, keyed by `name{labels}`.
pub(crate) fn parse(body: &str) -> (BTreeMap<String, f64>, BTreeMap<String, String>) {
    let mut samples = BTreeMap::new();
    let mut types = BTreeMap::new();
    for l in body.lines() {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            let (n, ty) = t.split_once(' ').unwrap();
            types.insert(n.to_owned(), ty.to_owned());
        } else if !l.starts_with('#') && !l.is_empty() {
            let (k, v) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("bad line {l:?}"));
            samples.insert(
                k.to_owned(),
                v.parse().unwrap_or_else(|_| panic!("bad value {l:?}")),
            );
        }
    }
    (samples, types)
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn metrics_are_scraped_over_loopback_and_parse() {
    let t = Topology::new();
    let srv = Server::start(&t);
    // Not attached yet: the endpoint answers with up 0.
    let (code, _, body) = srv.request("GET", "/metrics");
    assert_eq!(code, 200);
    assert!(body.contains("xdp_router_up 0"), "{body}");

    attach(&t, &[]);
    let _ = t.tcp_echo_roundtrip(
        Ns::Client,
        Ns::Server,
        SocketAddr::V4(SocketAddrV4::new(SERVER_ADDR, 7201)),
    );
    let (code, head, body) = srv.request("GET", "/metrics");
    println!("{body}");
    assert_eq!(code, 200);
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let (s, types) = parse(&body);
    assert!((s["xdp_router_up"] - 1.0).abs() < f64::EPSILON);
    let get = |k: &str| {
        *s.get(k)
            .unwrap_or_else(|| panic!("no sample {k} in\n{body}"))
    };
    assert!(
        get("xdp_router_forwarded_packets_total{direction=\"outbound\",family=\"ipv4\"}") > 50.0
    );
    assert!(
        get("xdp_router_forwarded_bytes_total{direction=\"inbound\",family=\"ipv4\"}") > 50_000.0
    );
    assert!(get("xdp_router_events_total{event=\"flow_new_masquerade\"}") >= 1.0);
    assert!((get("xdp_router_conntrack_capacity{family=\"ipv4\"}") - 524_288.0).abs() < 0.5);
    assert!(get("xdp_router_conntrack_entries{family=\"ipv4\"}") >= 2.0);
    // IPv6's flow table, labelled as the IPv6 counters are.
    assert!((get("xdp_router_conntrack_capacity{family=\"ipv6\"}") - 131_072.0).abs() < 0.5);
    assert!(get("xdp_router_conntrack_entries{family=\"ipv6\"}").abs() < 0.5);
    assert!(get("xdp_router_port_allocation_failures_total").abs() < 0.5);
    assert!(get("xdp_router_port_forward_rules").abs() < 0.5);
    every_counter_is_exported_once(&s);
    // No verdict sample without a family.
    for k in s.keys() {
        if ["forwarded", "passed", "dropped"]
            .iter()
            .any(|f| k.starts_with(&format!("xdp_router_{f}_")))
        {
            assert!(k.contains("family=\""), "{k} has no family label");
        }
    }
    assert!(s.contains_key("xdp_router_passed_packets_total{reason=\"no_flow\",family=\"both\"}"));
    assert!(get("xdp_router_attached_timestamp_seconds") > 1.0e9);
    for (name, ty) in &types {
        if ty == "counter" {
            assert!(name.ends_with("_total"), "counter {name} without _total");
        }
    }
    assert_eq!(types["xdp_router_conntrack_entries"], "gauge");
    let info = s
        .keys()
        .find(|k| k.starts_with("xdp_router_info{"))
        .expect("info");
    assert!(
        info.contains("lan=\"lan0\"") && info.contains("lan_mode=\"native\""),
        "{info}"
    );

    // Counters only grow between scrapes.
    let _ = t.tcp_echo_roundtrip(
        Ns::Client,
        Ns::Server,
        SocketAddr::V4(SocketAddrV4::new(SERVER_ADDR, 7202)),
    );
    let (_, _, body2) = srv.request("GET", "/metrics");
    let (s2, _) = parse(&body2);
    let k = "xdp_router_forwarded_packets_total{direction=\"outbound\",family=\"ipv4\"}";
    assert!(s2[k] > s[k]);

    assert_eq!(srv.request("GET", "/nope").0, 404);
    assert_eq!(srv.request("POST", "/metrics").0, 405);
}

/// The loopback listener answers a request for another name (DNS
/// rebinding through a browser or `ssh -L`) with 421 and no metrics, as
/// the status page does; requests for its address or `localhost` get them.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn metrics_answer_requests_for_their_address_or_localhost_only() {
    let t = Topology::new();
    let srv = Server::start(&t);
    let port = srv.addr.port();
    for host in [format!("evil.example:{port}"), "evil.example".to_owned()] {
        let (code, head, body) = srv.request_for("GET", "/metrics", &host);
        assert_eq!(code, 421, "Host: {host}: {head}\n{body}");
        assert!(!body.contains("xdp_router_"), "Host: {host}: {body}");
    }
    for host in [format!("127.0.0.1:{port}"), "localhost".to_owned()] {
        let (code, _, body) = srv.request_for("GET", "/metrics", &host);
        assert_eq!(code, 200, "Host: {host}: {body}");
        assert!(body.contains("xdp_router_up 0"), "Host: {host}: {body}");
    }
}

/// A client that sends requests on one connection and never reads the
/// answers (its receive buffer full, the server's send buffer full) holds
/// no other scrape back: the server answers one request per connection,
/// each on its own, and gives up a write not taken within 5 s. A server
/// that answered the requests one at a time kept every later scrape
/// waiting for as long as that client stayed connected.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_client_that_does_not_read_its_answers_holds_no_other_scrape_back() {
    let t = Topology::new();
    // Attached: each answer is the whole exposition, tens of KiB.
    attach(&t, &[]);
    let srv = Server::start(&t);
    let stuck = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    // The smallest receive buffer: the answers pile up in the server's
    // send buffer at once.
    stuck.set_recv_buffer_size(1).unwrap();
    stuck
        .connect_timeout(&srv.addr.into(), Duration::from_secs(5))
        .unwrap();
    let mut stuck: TcpStream = stuck.into();
    stuck
        .set_write_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let request = b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
    // Bounded: until the server stops reading its requests or 5000 were
    // sent (thousands of answers fill both sockets' buffers).
    let mut sent = 0;
    while sent < 5000 && stuck.write_all(request).is_ok() {
        sent += 1;
    }
    assert!(sent > 0, "the stuck client sent no request");
    // The server works through what it read until a write blocks.
    std::thread::sleep(Duration::from_secs(2));
    // Another scraper, while that client is still connected: the request
    // waits up to 10 s for its answer.
    let (code, _, body) = srv.request("GET", "/metrics");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("xdp_router_up"), "{body}");
    drop(stuck);
}

/// Every counter of the data path is exported, as a `_total` counter.
/// IPv6-only verdicts (`fwd6_`, `pass6_`, `drop6_`) are in the same
/// families as the others; every verdict carries a `family` label:
/// `ipv6` for those, `ipv4` or `both` (one of them) for the others.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_namespace_without_a_router_is_named_at_the_start() {
    // A name no namespace has (a typo'd `-n`): the server still serves
    // (a router may be attached there later) and says why it reads 0.
    let ns = format!("rt-metrics-none-{}", std::process::id());
    let mut child = Command::new(router_ctl_bin())
        .args(["-n", &ns, "metrics", "--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the metrics server");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let said = rx.recv_timeout(Duration::from_secs(10));
    let _ = child.kill();
    let _ = child.wait();
    let said = said.expect("the metrics server said nothing on stderr within 10 s");
    assert!(
        said.contains(&format!("no network namespace \"{ns}\""))
            && said.contains("xdp_router_up stays 0"),
        "{said}"
    );
}

fn every_counter_is_exported_once(s: &BTreeMap<String, f64>) {
    for &c in Counter::ALL {
        let n = c.name();
        let (v6, n4) = ["fwd6_", "pass6_", "drop6_"]
            .iter()
            .find_map(|p| {
                n.strip_prefix(p)
                    .map(|rest| (true, format!("{}_{rest}", &p[..p.len() - 2])))
            })
            .unwrap_or((false, n.to_owned()));
        let families: &[&str] = if v6 { &["ipv6"] } else { &["ipv4", "both"] };
        let mut keys: Vec<String> = families
            .iter()
            .map(|f| {
                let fam = format!(",family=\"{f}\"");
                if let Some(d) = n4.strip_prefix("fwd_") {
                    format!("xdp_router_forwarded_packets_total{{direction=\"{d}\"{fam}}}")
                } else if let Some(r) = n4.strip_prefix("pass_") {
                    format!("xdp_router_passed_packets_total{{reason=\"{r}\"{fam}}}")
                } else if let Some(r) = n4.strip_prefix("drop_") {
                    format!("xdp_router_dropped_packets_total{{reason=\"{r}\"{fam}}}")
                } else {
                    format!("xdp_router_events_total{{event=\"{n}\"}}")
                }
            })
            .collect();
        // An event has no family label: one key.
        keys.dedup();
        assert_eq!(
            keys.iter().filter(|k| s.contains_key(*k)).count(),
            1,
            "{keys:?}: exactly one family"
        );
    }
}
