//! The live status page of `router-ctl run`, loaded in headless Chromium
//! while traffic runs through the router: the numbers appear and change,
//! and a phone-sized screenshot is kept under target/tmp.

use std::net::{SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tests::{CLIENT_ADDR, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology};

use crate::ctl::{DetachOnDrop, Stream, read_until, wait_for};
use crate::daemon_run::{RunningDaemon, Scratch, config_text, http};

/// Waits (bounded) until the status the page reads at `addr` has more
/// forwarded than `total` and three rate samples: what the page's next
/// load must show.
fn wait_for_more_than(t: &Topology, addr: SocketAddr, total: f64) {
    wait_for(
        "the status page's figures to move on",
        Duration::from_secs(20),
        || {
            let (code, _, body) = http(t, Ns::Client, addr, "GET", "/api/status");
            code == 200
                && serde_json::from_str::<Value>(&body).is_ok_and(|d| {
                    d["history"].as_array().is_some_and(|h| h.len() >= 3)
                        && d["totals"]["forwarded_packets"]
                            .as_f64()
                            .is_some_and(|n| n > total)
                })
        },
    );
}

/// Headless Chromium on `url`, started from the namespace `ns` (where the
/// page's listener is); `what` is `--dump-dom` or `--screenshot=PATH`.
/// Virtual time lets the page's timers fetch several times.
fn chromium(t: &Topology, ns: Ns, profile: &Path, url: &str, what: &str, size: &str) -> String {
    let o = t.in_ns(ns, || {
        Command::new("timeout")
            .args([
                "-k",
                "5",
                "90",
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
            ])
            // No connections of its own (updates, sync, safe browsing):
            // the page's requests are the only traffic.
            .args([
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg(format!("--window-size={size}"))
            .arg("--virtual-time-budget=4000")
            .arg(what)
            .arg(url)
            .output()
            .expect("chromium (Debian package chromium; `cargo xtask setup` installs it)")
    });
    assert!(
        o.status.success(),
        "chromium {what} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The `data-value` the page set on the element with this id.
fn value(dom: &str, id: &str) -> f64 {
    let at = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id} in the page"));
    let tag_start = dom[..at].rfind('<').unwrap();
    let tag = &dom[tag_start..tag_start + dom[tag_start..].find('>').unwrap()];
    let v = tag
        .split("data-value=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_else(|| panic!("#{id} has no value yet: {tag}"));
    v.parse()
        .unwrap_or_else(|_| panic!("#{id} is not a number: {v:?}"))
}

fn screenshot_path() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("status-page-phone.png")
}

/// What every load of the page must show while the stream runs.
fn check_page(dom: &str) {
    assert!(
        value(dom, "fwd-pps") > 10.0,
        "no forwarding rate while traffic runs"
    );
    assert!(value(dom, "ct-entries") >= 2.0);
    assert!((value(dom, "ct-capacity") - 524_288.0).abs() < 0.5);
    assert!(value(dom, "flow-count") >= 1.0);
    assert!(dom.contains("standalone mode"), "mode missing");
    assert!(dom.contains(">healthy<"), "health missing");
    assert!(
        dom.contains(">lan0<") && dom.contains(">wan0<"),
        "interfaces missing"
    );
    assert!(dom.contains(">192.168.50.2:80<"), "port forward missing");
    // The stream's flow with both tuples: the client's and the WAN address.
    let client = format!("{CLIENT_ADDR}:");
    let wan = format!("{ROUTER_WAN_ADDR}:");
    assert!(
        dom.lines()
            .any(|l| l.contains("class=\"flow\"") && l.contains(&client) && l.contains(&wan))
            || dom
                .split("<tr class=\"flow\">")
                .skip(1)
                .any(|r| r.contains(&client) && r.contains(&wan)),
        "no flow row with both tuples"
    );
    assert!(dom.contains("<polyline"), "no chart");
    // The daemon's follow counters (nothing followed in this test).
    assert!(
        dom.contains(
            "0 MAC changes followed · 0 WAN address changes followed · 0 kernel-side repairs · \
             0 re-attaches followed"
        ),
        "the daemon's follow counters missing"
    );
    // The data path counts bytes per flow: the busiest flows are ranked by
    // them, not by last activity.
    assert!(
        dom.contains(">by bytes<") && dom.contains(">by rate<"),
        "flows not ranked by bytes and rate"
    );
}

/// The daemon's follow counters (nothing followed in this test) in the
/// page's JSON and in the metrics.
fn check_daemon_follow(doc: &Value, metrics: &str) {
    let d = &doc["daemon"];
    for k in [
        "mac_changes_followed",
        "wan_addr_changes_followed",
        "standalone_repairs",
        "stale_pending_removed",
        "reattaches_followed",
        "log_records_malformed",
    ] {
        assert_eq!(d[k], 0, "daemon.{k}: {d}");
    }
    assert_eq!(
        (&d["interfaces_gone"], &d["detached"]),
        (&serde_json::json!([]), &Value::Bool(false)),
        "{d}"
    );
    for m in [
        "xdp_router_daemon_mac_changes_total 0",
        "xdp_router_daemon_wan_addr_changes_total 0",
        "xdp_router_daemon_standalone_repairs_total 0",
        "xdp_router_daemon_interfaces_gone 0",
        "xdp_router_daemon_stale_pending_removed_total 0",
        "xdp_router_daemon_reattach_total 0",
        "xdp_router_daemon_detached 0",
        "xdp_router_daemon_log_records_malformed_total 0",
    ] {
        assert!(metrics.contains(m), "{m} missing:\n{metrics}");
    }
}

/// The loopback listener answers a request for another name (DNS
/// rebinding) with 421 and no data; with `MAX_CONNECTIONS` (64) idle
/// connections open, one more is closed at once, and once they are gone
/// the page answers again.
fn listener_limits(t: &Topology, addr: SocketAddr) {
    use std::io::{Read as _, Write as _};
    use std::net::TcpStream;
    t.in_ns(Ns::Client, || {
        let connect = || {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s
        };
        let mut s = connect();
        write!(
            s,
            "GET /api/status HTTP/1.1\r\nHost: evil.example:{}\r\n\r\n",
            addr.port()
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 421 "), "{resp}");
        assert!(!resp.contains("\"flows\""), "{resp}");

        // A browser's localhost cookies are served ...
        let mut s = connect();
        let cookies = "c".repeat(12 * 1024);
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nCookie: a={cookies}\r\n\r\n"
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 200 "), "{resp}");
        // ... a head over 32 KiB is refused, not served from its first part.
        let mut s = connect();
        let filler = "x".repeat(33 * 1024);
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nX-Filler: {filler}\r\n\r\n"
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 431 "), "{resp}");
        // A head ended by bare newlines (RFC 9112 2.2) is answered (it was
        // held to the read timeout and closed unanswered).
        let mut s = connect();
        write!(s, "GET /metrics HTTP/1.1\nHost: {addr}\n\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        assert!(resp.starts_with("HTTP/1.1 200 "), "{resp}");

        let idle: Vec<TcpStream> = (0..64).map(|_| connect()).collect();
        // Served in the order accepted: the 65th finds no slot.
        std::thread::sleep(Duration::from_millis(300));
        // Closed at once: well before the 5 s a served connection gets
        // to send its request (then it would be closed too, unanswered).
        let mut extra = connect();
        extra
            .set_read_timeout(Some(Duration::from_secs(4)))
            .unwrap();
        let mut buf = [0u8; 1];
        let got = extra.read(&mut buf);
        assert!(
            matches!(got, Ok(0))
                || got
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "a 65th connection was kept open: {got:?}"
        );
        drop(idle);
        // Their slots come back as the daemon sees them closed.
        let resp = read_until(
            Duration::from_secs(10),
            || {
                // Closed at once while no slot is free: the write may fail
                // too; the answer decides.
                let mut s = connect();
                let _ = write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n");
                let mut resp = String::new();
                let _ = s.read_to_string(&mut resp);
                resp
            },
            |r| r.starts_with("HTTP/1.1 200 "),
        );
        assert!(
            resp.starts_with("HTTP/1.1 200 "),
            "the page did not answer again: {resp:?}"
        );
    });
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
#[expect(
    clippy::too_many_lines,
    reason = "one scripted walk through the page and its listener, read top to bottom"
)]
fn status_page_shows_live_numbers_in_chromium() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    t.warm_neighbours();
    let scratch = Scratch::new("page");
    let file = scratch.path("router.toml");
    std::fs::write(
        &file,
        config_text("1024-60999", &[("tcp", 8080, "192.168.50.2:80")]),
    )
    .unwrap();
    // Started from the client's namespace: the page listens on the
    // client's loopback, so the browser's traffic stays in the test's
    // namespaces.
    let daemon = RunningDaemon::start(
        &t,
        Some(Ns::Client),
        &scratch,
        &[
            "--config",
            file.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
    );
    let addr = daemon.page_addr();
    let url = format!("http://{addr}/");

    // The routes, over plain HTTP.
    let (code, head, page) = http(&t, Ns::Client, addr, "GET", "/");
    assert_eq!(code, 200, "{head}");
    assert!(
        head.contains("text/html") && head.contains("Content-Security-Policy"),
        "{head}"
    );
    assert!(page.contains("/api/status"));
    assert_eq!(http(&t, Ns::Client, addr, "GET", "/nope").0, 404);
    assert_eq!(http(&t, Ns::Client, addr, "POST", "/").0, 405);
    let (code, _, head_body) = http(&t, Ns::Client, addr, "HEAD", "/metrics");
    assert_eq!((code, head_body.as_str()), (200, ""));
    listener_limits(&t, addr);

    // Traffic through the NAT for the rest of the test, however long the
    // browser takes (about 3.4 MB/s, as a 48 MiB stream over 14 s).
    let stream = Stream::until_stopped(
        &t,
        SocketAddr::V4(SocketAddrV4::new(SERVER_ADDR, 7401)),
        3.5e6,
        120.0,
    );
    wait_for("XDP to carry the stream", Duration::from_secs(10), || {
        tests::counter_of(&t.stats(), "fwd_outbound") > 0
    });
    let profile = scratch.path("chromium");
    let first = chromium(&t, Ns::Client, &profile, &url, "--dump-dom", "1280,900");
    wait_for_more_than(&t, addr, value(&first, "fwd-total"));
    let second = chromium(&t, Ns::Client, &profile, &url, "--dump-dom", "1280,900");

    for dom in [&first, &second] {
        check_page(dom);
    }
    let (a, b) = (value(&first, "fwd-total"), value(&second, "fwd-total"));
    println!("forwarded packets on the page: {a} then {b}");
    assert!(
        b > a,
        "the page's forwarded total did not grow ({a} -> {b})"
    );
    let updated = |dom: &str| {
        dom.split("data-updated=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .and_then(|v| v.parse::<u64>().ok())
            .expect("body data-updated")
    };
    assert!(updated(&second) > updated(&first));

    // The JSON and the metrics on the same listener.
    let (code, _, body) = http(&t, Ns::Client, addr, "GET", "/api/status");
    assert_eq!(code, 200);
    let doc: Value = serde_json::from_str(&body).expect("status JSON");
    let samples = doc["history"].as_array().unwrap().len();
    assert!(samples >= 3, "{doc}");
    println!(
        "/api/status: {} bytes with {samples} rate samples",
        body.len()
    );
    assert_eq!(doc["router"]["mode"], "standalone");
    let (code, _, metrics) = http(&t, Ns::Client, addr, "GET", "/metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("xdp_router_up 1") && metrics.contains("xdp_router_daemon_up 1"));
    check_daemon_follow(&doc, &metrics);

    let shot = screenshot_path();
    let _ = std::fs::remove_file(&shot);
    chromium(
        &t,
        Ns::Client,
        &profile,
        &url,
        &format!("--screenshot={}", shot.display()),
        "412,1600",
    );
    let png = std::fs::read(&shot).expect("the screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    println!(
        "status page screenshot (phone, 412 px wide): {}",
        shot.display()
    );

    let bytes = stream.finish();
    println!("stream: {bytes} bytes through the NAT while the page was open");
    drop(daemon);
}
