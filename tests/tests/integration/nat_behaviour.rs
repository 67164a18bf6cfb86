//! NAT behaviour for games and peer-to-peer (issue 15; RFC 4787, RFC 5382),
//! end to end in standalone mode: a STUN-style check of our own
//! ([`tests::stun`]) classifies mapping and filtering for each
//! `--filtering` setting and after a forced port collision; LAN hosts
//! reach each other's port forwards and mappings through the WAN address
//! (hairpinning); two hosts behind two routers exchange UDP after meeting
//! at a rendezvous server. Every flow must be carried by the fast path:
//! the XDP counters move and the kernel's forwarding counter stays flat.
//!
//! docs/nat-compliance.md cites these tests by name.

use std::fmt::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::stun::{self, Behaviour, Client, Filtering, Mapping, ServerAddrs, StunServer};
use tests::two_routers::{self, ROUTER2_WAN_ADDR};
use tests::{
    CLIENT_ADDR, LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF, netns, pattern,
    socket_addr,
};

use crate::ctl::attach_and_print;

const TIMEOUT: Duration = Duration::from_secs(5);
/// The STUN server's second address (A2), next to [`SERVER_ADDR`] (A1).
const SERVER_ALT_ADDR: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 3);
const STUN_ADDRS: ServerAddrs = ServerAddrs {
    primary: SERVER_ADDR,
    alternate: SERVER_ALT_ADDR,
};
/// More than any stray packet the kernel might forward during a test
/// (none is expected), far fewer than the flows of the test.
const KERNEL_FORWARD_SLACK: u64 = 3;

fn any_port() -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)
}

fn local_port(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, port)
}

/// Gives the server its second address and lets the router learn its MAC
/// (an unresolved neighbour sends the first packet of a flow to the
/// kernel, untranslated).
fn add_stun_alt_address(t: &Topology) {
    let cidr = format!("{SERVER_ALT_ADDR}/24");
    t.exec_ok(Ns::Server, &["ip", "addr", "add", &cidr, "dev", "eth0"]);
    assert!(
        t.ping(Ns::Router, SERVER_ALT_ADDR, 1),
        "router cannot ping {SERVER_ALT_ADDR}"
    );
}

/// `--filtering NAME` for `setting`, nothing for the default.
fn filtering_args(setting: Option<Filtering>) -> Vec<&'static str> {
    setting.map_or_else(Vec::new, |f| vec!["--filtering", f.cli_name()])
}

/// The value of key `key` anywhere in `v` (first found, depth first).
fn find_key<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => m
            .get(key)
            .or_else(|| m.values().find_map(|x| find_key(x, key))),
        Value::Array(a) => a.iter().find_map(|x| find_key(x, key)),
        _ => None,
    }
}

/// `status --json`'s "filtering", if it has one.
fn status_filtering(t: &Topology, router: Ns) -> Option<String> {
    let o = t.router_ctl_in(router, &["status", "--json"]);
    let out = String::from_utf8_lossy(&o.stdout);
    let v: Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("status --json: {e}: {out}"));
    find_key(&v, "filtering").map(|f| f.as_str().unwrap_or_default().to_owned())
}

/// Sum of every `fwd_*` verdict counter (whatever direction a hairpinned
/// packet is counted in, it is one of these).
fn forwarded(stats: &Value) -> u64 {
    stats.as_object().map_or(0, |m| {
        m.iter()
            .filter(|(k, _)| k.starts_with("fwd_"))
            .filter_map(|(_, c)| c["packets"].as_u64())
            .sum()
    })
}

/// Packets the router refused as unsolicited: passed to its own stack or
/// dropped (`pass_unsolicited`, `drop_unsolicited`, or a counter named for
/// filtering).
fn refused(stats: &Value) -> u64 {
    stats.as_object().map_or(0, |m| {
        m.iter()
            .filter(|(k, _)| k.ends_with("_unsolicited") || k.contains("filter"))
            .filter_map(|(_, c)| c["packets"].as_u64())
            .sum()
    })
}

/// Fast-path evidence around `f`: the XDP `fwd_*` counters of `router`
/// grew by at least `min_forwarded` and the kernel's `IpForwDatagrams` of
/// that namespace by at most [`KERNEL_FORWARD_SLACK`].
fn on_fast_path<T>(t: &Topology, router: Ns, min_forwarded: u64, f: impl FnOnce() -> T) -> T {
    let stats = || -> Value {
        let o = t.router_ctl_in(router, &["stats", "--json"]);
        serde_json::from_slice(&o.stdout).expect("stats --json")
    };
    let (before, kernel_before) = (stats(), t.nstat(router, "IpForwDatagrams"));
    let r = f();
    let (after, kernel_after) = (stats(), t.nstat(router, "IpForwDatagrams"));
    let fast = forwarded(&after) - forwarded(&before);
    let kernel = kernel_after - kernel_before;
    println!("{router:?}: fast path forwarded {fast} packets, the kernel {kernel}");
    assert!(
        fast >= min_forwarded,
        "{router:?}: the fast path forwarded {fast} packets, expected at least {min_forwarded}"
    );
    assert!(
        kernel <= KERNEL_FORWARD_SLACK,
        "{router:?}: the kernel forwarded {kernel} packets; the fast path should have"
    );
    r
}

fn classify_in(t: &Topology, ns: Ns, mapping_local: SocketAddrV4) -> Behaviour {
    let b = t
        .in_ns(ns, || stun::classify(STUN_ADDRS, mapping_local, any_port()))
        .unwrap_or_else(|e| panic!("classifier in {ns:?}: {e}"));
    println!("{ns:?}: {b:?}");
    for m in b.mapped {
        assert_eq!(*m.ip(), ROUTER_WAN_ADDR, "{ns:?} mapped to {m}: {b:?}");
    }
    b
}

/// The classifier against a router attached with `setting` (`None`: the
/// default): mapping endpoint-independent, filtering as configured.
fn check_filtering(setting: Option<Filtering>) {
    let t = Topology::new();
    add_stun_alt_address(&t);
    attach_and_print(&t, &filtering_args(setting));
    let expected = setting.unwrap_or(Filtering::AddressAndPortDependent);
    if setting.is_some() {
        assert_eq!(
            status_filtering(&t, Ns::Router).as_deref(),
            Some(expected.cli_name()),
            "status --json filtering"
        );
    }
    let _server = StunServer::start(Some(t.ns_name(Ns::Server)), STUN_ADDRS);
    let stats = || -> Value {
        serde_json::from_slice(&t.router_ctl_in(Ns::Router, &["stats", "--json"]).stdout)
            .expect("stats --json")
    };
    let refused_before = refused(&stats());
    // Mapping test: 3 requests + 3 answers; filtering test: 1 + 1 at least.
    let b = on_fast_path(&t, Ns::Router, 8, || {
        classify_in(&t, Ns::Client, any_port())
    });
    // The filtered answers came and the router refused them (the
    // classifier would report the same class if they never came): at least
    // one per test the filter fails (the client sends again until its
    // wait ends), none for endpoint-independent filtering.
    let refused = refused(&stats()) - refused_before;
    println!("refused {refused} answer(s)");
    match expected {
        Filtering::EndpointIndependent => assert_eq!(refused, 0, "{b:?}"),
        Filtering::AddressDependent => assert!(refused >= 1, "none refused: {b:?}"),
        Filtering::AddressAndPortDependent => assert!(refused >= 2, "{refused} refused: {b:?}"),
    }
    assert_eq!(b.mapping, Mapping::EndpointIndependent, "{b:?}");
    assert_eq!(
        b.mapped[0].port(),
        b.local.port(),
        "the source port was not preserved: {b:?}"
    );
    assert_eq!(b.filtering, expected, "{b:?}");
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn stun_default_is_eim_and_address_port_dependent_filtering() {
    check_filtering(None);
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn stun_filtering_address_port_dependent() {
    check_filtering(Some(Filtering::AddressAndPortDependent));
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn stun_filtering_address_dependent() {
    check_filtering(Some(Filtering::AddressDependent));
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn stun_filtering_endpoint_independent() {
    check_filtering(Some(Filtering::EndpointIndependent));
}

/// Two LAN hosts use the same source port towards the same servers: the
/// second cannot keep its port (the first holds that WAN port towards
/// the same remote endpoints), and must still get one external port for
/// every destination (RFC 4787 REQ-1), not one per destination.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn stun_port_collision_keeps_endpoint_independent_mapping() {
    const SHARED_PORT: u16 = 40000;
    let t = Topology::with_two_clients();
    add_stun_alt_address(&t);
    attach_and_print(&t, &[]);
    let _server = StunServer::start(Some(t.ns_name(Ns::Server)), STUN_ADDRS);
    let (first, second) = on_fast_path(&t, Ns::Router, 16, || {
        (
            classify_in(&t, Ns::Client, local_port(SHARED_PORT)),
            classify_in(&t, Ns::Client2, local_port(SHARED_PORT)),
        )
    });
    assert_eq!(first.mapping, Mapping::EndpointIndependent, "{first:?}");
    assert_eq!(first.mapped[0].port(), SHARED_PORT, "{first:?}");
    let collisions = t.counter("port_collision");
    println!("port_collision events: {collisions}");
    assert!(
        collisions >= 1,
        "the second client's port {SHARED_PORT} collided with the first's mapping"
    );
    assert_eq!(
        second.mapping,
        Mapping::EndpointIndependent,
        "after a port collision: {second:?}"
    );
    assert_ne!(
        second.mapped[0], first.mapped[0],
        "two internal endpoints share one external endpoint"
    );
}

/// A LAN host reaches another LAN host's port forward through the WAN
/// address (TCP and UDP); the service sees the WAN address as the source,
/// so its replies go back through the router (RFC 4787 REQ-9, RFC 5382
/// REQ-8: hairpinning with the external source address).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn hairpin_to_a_port_forward_tcp_and_udp() {
    let t = Topology::with_two_clients();
    attach_and_print(&t, &[]);
    t.router_ctl_ok(&["forward", "add", "tcp", "8080", "192.168.50.2:80"]);
    t.router_ctl_ok(&["forward", "add", "udp", "5353", "192.168.50.2:53"]);
    let payload = pattern(64 * 1024);
    let mut capture = SwitchCapture::start(&t);
    let csum_errors = || {
        [Ns::Client, Ns::Client2]
            .map(|ns| t.nstat(ns, "TcpInCsumErrors") + t.nstat(ns, "UdpInCsumErrors"))
    };
    let csum_errors_before = csum_errors();
    let (tcp_peer, udp_peer) = on_fast_path(&t, Ns::Router, 40, || {
        let srv = t.tcp_echo_server(Ns::Client, socket_addr(CLIENT_ADDR, 80));
        let got = t.tcp_echo_client(
            Ns::Client2,
            socket_addr(ROUTER_WAN_ADDR, 8080),
            &payload,
            TIMEOUT,
        );
        let tcp_peer = srv.join();
        if !got.as_ref().is_ok_and(|g| *g == payload) {
            println!("{}", hairpin_diagnostics(&t, &mut capture));
            panic!(
                "TCP to the WAN address's port forward from the LAN: {:?} (server saw {tcp_peer:?})",
                got.map(|g| g.len())
            );
        }
        let srv = t.udp_echo_server(Ns::Client, socket_addr(CLIENT_ADDR, 53));
        let got = t.udp_echo_client(
            Ns::Client2,
            socket_addr(ROUTER_WAN_ADDR, 5353),
            b"hairpin",
            TIMEOUT,
        );
        let udp_peer = srv.join();
        assert_eq!(
            got.as_deref().ok(),
            Some(&b"hairpin"[..]),
            "UDP to the WAN address's port forward from the LAN: {got:?} (server saw {udp_peer:?})"
        );
        // TCP recovers from a few corrupt segments by retransmitting, so
        // the echo above can pass with them: they are failures all the same.
        if csum_errors() != csum_errors_before {
            println!("{}", hairpin_diagnostics(&t, &mut capture));
            panic!(
                "the clients dropped segments with bad checksums (Client, Client2): {:?} -> {:?}",
                csum_errors_before,
                csum_errors()
            );
        }
        (tcp_peer, udp_peer)
    });
    for (proto, peer) in [("TCP", tcp_peer), ("UDP", udp_peer)] {
        let peer = peer.unwrap_or_else(|| panic!("{proto}: the service saw no peer"));
        assert_eq!(
            peer.ip(),
            IpAddr::V4(ROUTER_WAN_ADDR),
            "{proto}: the service must see the WAN address as source, saw {peer}"
        );
    }
}

/// A packet capture on the switch's ports, read only when a test fails.
struct SwitchCapture {
    child: std::process::Child,
    file: std::path::PathBuf,
    // After the child (fields drop in order): removes the file's directory.
    _dir: tests::Scratch,
}

impl SwitchCapture {
    /// Far more than a hairpin exchange sends, even with retransmissions.
    const MAX_PACKETS: u32 = 20_000;

    /// Captures TCP, UDP and ARP on every port of the switch (at most
    /// [`Self::MAX_PACKETS`]), written to a file; waits until tcpdump
    /// listens. tcpdump is the spawned process itself (`ip netns exec`
    /// and the shell exec it), so killing the child stops the capture.
    fn start(t: &Topology) -> Self {
        let dir = tests::Scratch::new("capture");
        let file = dir.path("switch.pcap");
        let path = file.to_string_lossy().into_owned();
        // `exec`: the shell becomes tcpdump; its banner is noise in the
        // test output.
        let script = format!(
            "exec tcpdump -q -i any -nn -s 96 -U -c {} -w '{path}' 'tcp or udp or arp' 2>/dev/null",
            Self::MAX_PACKETS
        );
        let child = t.spawn(Ns::Switch, &["sh", "-c", &script]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !file.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            file,
            _dir: dir,
        }
    }

    /// Stops the capture and returns it as text: `tcpdump -r` in the
    /// switch's namespace, where the capture's interface indexes name its
    /// ports.
    fn finish(&mut self, t: &Topology) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let path = self.file.to_string_lossy();
        let o = t.exec(Ns::Switch, &["tcpdump", "-nn", "-tt", "-r", &path]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for SwitchCapture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the router and the hosts saw, for a failed hairpin exchange: the
/// data path's counters (pass reasons), the flow table, the router's
/// neighbours and kernel conntrack, the kernel's drop and forwarding
/// counters of the router and both clients, and the switch capture.
fn hairpin_diagnostics(t: &Topology, capture: &mut SwitchCapture) -> String {
    /// Capture lines shown from the start and from the end.
    const SHOWN: usize = 150;
    const COUNTERS: [&str; 17] = [
        "IpForwDatagrams",
        "IpInAddrErrors",
        "IpInDiscards",
        "IpOutDiscards",
        "IpOutNoRoutes",
        "IpExtInNoRoutes",
        "TcpExtTCPAbortOnData",
        "TcpExtTCPAbortOnClose",
        "TcpExtTCPTimeouts",
        "TcpRetransSegs",
        "TcpInErrs",
        "TcpInCsumErrors",
        "TcpOutRsts",
        "TcpEstabResets",
        "TcpAttemptFails",
        "UdpInCsumErrors",
        "TcpExtIPReversePathFilter",
    ];
    let text = |o: std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let mut d = String::from("--- diagnostics of the failed hairpin exchange ---\n");
    let stats = t.router_ctl_in(Ns::Router, &["stats", "--json"]);
    let nonzero: Vec<String> = serde_json::from_slice::<Value>(&stats.stdout)
        .ok()
        .and_then(|v| v.as_object().cloned())
        .map(|m| {
            m.iter()
                .filter(|(_, c)| c["packets"].as_u64().or(c["events"].as_u64()) != Some(0))
                .map(|(k, c)| format!("{k}={c}"))
                .collect()
        })
        .unwrap_or_default();
    let _ = writeln!(d, "router-ctl stats (non-zero): {}", nonzero.join(" "));
    let flows = t.router_ctl_in(Ns::Router, &["conntrack", "list"]);
    let _ = writeln!(d, "router-ctl conntrack list:\n{}", text(flows));
    for (ns, cmd) in [
        (Ns::Router, &["ip", "neigh"][..]),
        (Ns::Router, &["conntrack", "-L"][..]),
        (Ns::Client, &["ip", "neigh"][..]),
        (Ns::Client2, &["ip", "neigh"][..]),
        (Ns::Client, &["ss", "-tani"][..]),
        (Ns::Client2, &["ss", "-tani"][..]),
    ] {
        let _ = writeln!(d, "{ns:?}: {}:\n{}", cmd.join(" "), text(t.exec(ns, cmd)));
    }
    for ns in [Ns::Router, Ns::Client, Ns::Client2] {
        let _ = writeln!(d, "{ns:?} kernel counters: {}", t.nstat_line(ns, &COUNTERS));
    }
    let cap = capture.finish(t);
    let lines: Vec<&str> = cap.lines().collect();
    let _ = writeln!(d, "switch capture ({} packets):", lines.len());
    let tail = SHOWN.max(lines.len().saturating_sub(SHOWN));
    for l in lines.iter().take(SHOWN) {
        let _ = writeln!(d, "{l}");
    }
    if tail > SHOWN {
        d.push_str("...\n");
    }
    for l in lines.iter().skip(tail) {
        let _ = writeln!(d, "{l}");
    }
    d
}

/// A LAN host reaches another LAN host's *mapping* (learned from the
/// rendezvous server) through the WAN address: hairpinning of a mapped
/// port, the source being the sender's own mapping. Needs a filter that
/// lets a new remote in (endpoint-independent), as from the WAN.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn hairpin_to_a_mapping_with_endpoint_independent_filtering() {
    let t = Topology::with_two_clients();
    add_stun_alt_address(&t);
    attach_and_print(&t, &filtering_args(Some(Filtering::EndpointIndependent)));
    let server = StunServer::start(Some(t.ns_name(Ns::Server)), STUN_ADDRS);
    let rendezvous = server.addrs().endpoint(false, false);
    let outcome = on_fast_path(&t, Ns::Router, 4, || {
        exchange(
            (t.ns_name(Ns::Client2), "active"),
            (t.ns_name(Ns::Client), "passive"),
            rendezvous,
        )
    });
    println!("{outcome:?}");
    assert_eq!(*outcome.passive_mapped.ip(), ROUTER_WAN_ADDR);
    assert_eq!(*outcome.active_mapped.ip(), ROUTER_WAN_ADDR);
    assert_eq!(
        outcome.passive_got_from,
        Some(outcome.active_mapped),
        "the passive host must see the active one's mapping as source: {outcome:?}"
    );
    assert!(outcome.active_got_reply, "{outcome:?}");
}

/// What [`exchange`] observed.
#[derive(Debug)]
struct Exchange {
    /// Mapped endpoints the rendezvous server saw.
    active_mapped: SocketAddrV4,
    passive_mapped: SocketAddrV4,
    /// Where the passive peer's first datagram came from, if one came.
    passive_got_from: Option<SocketAddrV4>,
    /// Whether the passive peer's reply reached the active one.
    active_got_reply: bool,
}

/// How long the active peer keeps trying, and the passive one waits.
const P2P_WINDOW: Duration = Duration::from_secs(3);

/// A UDP peer-to-peer exchange through a rendezvous server. Both peers
/// register (the server records the mapped endpoint it sees) and look each
/// other up. The passive peer then only listens: it sends nothing to the
/// active peer before that one's datagram arrives, so only its router's
/// filtering decides whether the first datagram gets in. The active peer
/// sends to the passive peer's mapped endpoint (a few times, bounded)
/// until a reply comes back.
///
/// With endpoint-independent mapping plus address-and-port-dependent
/// filtering on both sides, simultaneous hole punching (both peers send
/// at once, each opening its own filter towards the other's mapping)
/// would also succeed; that is why this exchange has one passive peer: it
/// tells the filtering settings apart.
fn exchange(
    (active_ns, active_name): (&str, &str),
    (passive_ns, passive_name): (&str, &str),
    rendezvous: SocketAddrV4,
) -> Exchange {
    let (registered_tx, registered_rx) = mpsc::channel::<SocketAddrV4>();
    let (active_tx, active_rx) = mpsc::channel::<SocketAddrV4>();
    std::thread::scope(|s| {
        let passive = s.spawn(move || {
            netns::enter(passive_ns);
            let mut c = Client::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).expect("bind");
            let mine = c
                .register(rendezvous, passive_name)
                .expect("passive register");
            registered_tx.send(mine).expect("active peer waits");
            // The active peer has registered before it tells us.
            let active_mapped = active_rx.recv_timeout(TIMEOUT).expect("active registered");
            let looked_up = c
                .lookup(rendezvous, active_name)
                .expect("passive lookup")
                .expect("the active peer is registered");
            assert_eq!(looked_up, active_mapped);
            let sock = c.socket();
            let deadline = Instant::now() + P2P_WINDOW + Duration::from_secs(1);
            let mut buf = [0u8; 1500];
            while Instant::now() < deadline {
                if let Ok((n, SocketAddr::V4(from))) = sock.recv_from(&mut buf)
                    && &buf[..n] == b"hello"
                {
                    sock.send_to(b"welcome", from).expect("reply");
                    return Some(from);
                }
            }
            None
        });
        let active = s.spawn(move || {
            netns::enter(active_ns);
            let peer = registered_rx
                .recv_timeout(TIMEOUT)
                .expect("passive registered");
            let mut c = Client::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).expect("bind");
            let mine = c
                .register(rendezvous, active_name)
                .expect("active register");
            let looked_up = c
                .lookup(rendezvous, passive_name)
                .expect("active lookup")
                .expect("the passive peer is registered");
            assert_eq!(looked_up, peer);
            active_tx.send(mine).expect("passive peer waits");
            let sock = c.socket();
            let deadline = Instant::now() + P2P_WINDOW;
            let mut buf = [0u8; 1500];
            while Instant::now() < deadline {
                sock.send_to(b"hello", peer).expect("send");
                let wait = Instant::now() + Duration::from_millis(200);
                while Instant::now() < wait {
                    if let Ok((n, from)) = sock.recv_from(&mut buf)
                        && from == SocketAddr::V4(peer)
                        && &buf[..n] == b"welcome"
                    {
                        return (mine, peer, true);
                    }
                }
            }
            (mine, peer, false)
        });
        let passive_got_from = passive
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        let (active_mapped, passive_mapped, active_got_reply) = active
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        Exchange {
            active_mapped,
            passive_mapped,
            passive_got_from,
            active_got_reply,
        }
    })
}

/// Two hosts behind two routers: the active one behind `router`
/// (default filtering), the passive one behind `rtr2` attached with
/// `passive_filtering`. Returns what the exchange observed and how many
/// packets the passive router refused meanwhile ([`refused`]).
fn peer_to_peer(passive_filtering: Option<Filtering>) -> (Exchange, u64) {
    let t = two_routers::two_routers();
    let alt = format!("{SERVER_ALT_ADDR}/24");
    t.exec_ok(Ns::Server, &["ip", "addr", "add", &alt, "dev", "br0"]);
    two_routers::warm_neighbours(&t);
    for (router, extra) in [
        (Ns::Router, Vec::new()),
        (Ns::Router2, filtering_args(passive_filtering)),
    ] {
        let mut args = vec!["attach", LAN_IF, WAN_IF, "--admit", "xdp"];
        args.extend_from_slice(&extra);
        let o = t.router_ctl_in(router, &args);
        assert!(
            o.status.success(),
            "attach {router:?} {extra:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let expected = passive_filtering.unwrap_or(Filtering::AddressAndPortDependent);
    let shown = status_filtering(&t, Ns::Router2);
    assert!(
        (shown.is_none() && passive_filtering.is_none())
            || shown.as_deref() == Some(expected.cli_name()),
        "passive router's filtering: {shown:?}"
    );
    let server = StunServer::start(Some(t.ns_name(Ns::Server)), STUN_ADDRS);
    let rendezvous = server.addrs().endpoint(false, false);
    let unsolicited = |router| -> u64 {
        let o = t.router_ctl_in(router, &["stats", "--json"]);
        let v: Value = serde_json::from_slice(&o.stdout).expect("stats --json");
        refused(&v)
    };
    let refused_before = unsolicited(Ns::Router2);
    // Registering and looking up alone are 4 packets through each router.
    let outcome = on_fast_path(&t, Ns::Router, 4, || {
        on_fast_path(&t, Ns::Router2, 4, || {
            exchange(
                (t.ns_name(Ns::Client), "active"),
                (t.ns_name(Ns::Router2Client), "passive"),
                rendezvous,
            )
        })
    });
    println!("{outcome:?}");
    // The rendezvous saw each peer behind its router's WAN address.
    assert_eq!(*outcome.active_mapped.ip(), ROUTER_WAN_ADDR, "{outcome:?}");
    assert_eq!(
        *outcome.passive_mapped.ip(),
        ROUTER2_WAN_ADDR,
        "{outcome:?}"
    );
    (outcome, unsolicited(Ns::Router2) - refused_before)
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn p2p_udp_succeeds_with_endpoint_independent_filtering() {
    let (outcome, _) = peer_to_peer(Some(Filtering::EndpointIndependent));
    assert_eq!(
        outcome.passive_got_from,
        Some(outcome.active_mapped),
        "the passive peer must receive the active peer's datagram from its mapping"
    );
    assert!(
        outcome.active_got_reply,
        "the passive peer's reply must come back: {outcome:?}"
    );
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn p2p_udp_fails_with_address_port_dependent_filtering() {
    // The default is address-and-port-dependent filtering.
    let (outcome, refused) = peer_to_peer(None);
    assert_eq!(
        outcome.passive_got_from, None,
        "an unsolicited datagram got through address-and-port-dependent filtering"
    );
    assert!(!outcome.active_got_reply, "{outcome:?}");
    // Not a broken path: the datagrams reached the passive router, whose
    // filter refused them.
    assert!(
        refused >= 3,
        "the passive router refused only {refused} datagrams"
    );
}

/// What [`tcp_syn_to_a_mapping`] observed.
#[derive(Debug)]
struct InboundSyn {
    /// Where the server saw the LAN host's outbound connection come from.
    outbound_seen_as: SocketAddr,
    /// The remote peer the LAN host's listener accepted, if any.
    accepted: Option<SocketAddr>,
    /// How the remote's connect to the mapping ended.
    connect: Result<(), std::io::ErrorKind>,
}

/// `SO_REUSEPORT` on (socket2 has it only with its "all" feature).
fn set_reuse_port(s: &socket2::Socket) {
    let (level, name) = (libc::SOL_SOCKET, libc::SO_REUSEPORT);
    tests::sockopt::set_int(s, level, name, 1, "SO_REUSEPORT");
}

/// RFC 5382 section 4.3: a LAN host connects out from port `LOCAL_PORT`
/// (creating the mapping) while listening on the same port (`SO_REUSEPORT`,
/// as TCP hole punching does); then the server connects *from another
/// port* to the mapping. Only a filter that lets new remotes in
/// (endpoint-independent; address-dependent too, the address being the
/// same) opens that connection.
fn tcp_syn_to_a_mapping(filtering: Option<Filtering>) -> InboundSyn {
    use socket2::{Domain, Socket, Type};
    const LOCAL_PORT: u16 = 45000;
    let t = Topology::new();
    attach_and_print(&t, &filtering_args(filtering));
    let reusable = || {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).expect("socket");
        s.set_reuse_address(true).expect("SO_REUSEADDR");
        set_reuse_port(&s);
        s.bind(&socket_addr(Ipv4Addr::UNSPECIFIED, LOCAL_PORT).into())
            .expect("bind the shared port");
        s
    };
    let (listener, outbound) = t.in_ns(Ns::Client, || {
        let l = reusable();
        l.listen(4).expect("listen");
        l.set_nonblocking(true).expect("nonblocking");
        (l, reusable())
    });
    let server = t.in_ns(Ns::Server, || {
        std::net::TcpListener::bind(socket_addr(SERVER_ADDR, 5410)).expect("server bind")
    });
    outbound
        .connect_timeout(&server.local_addr().expect("bound").into(), TIMEOUT)
        .expect("outbound connection");
    // The connection is established, so it waits in the accept queue. Both
    // ends stay open until the test ends: the mapping lives under an
    // established flow, as in TCP hole punching.
    let (_server_side, outbound_seen_as) =
        tests::echo::accept_within(&server, TIMEOUT).expect("server accept");
    let mapping = socket_addr(ROUTER_WAN_ADDR, LOCAL_PORT);
    let connect = t.in_ns(Ns::Server, || {
        std::net::TcpStream::connect_timeout(&mapping, Duration::from_secs(2))
            .map(drop)
            .map_err(|e| e.kind())
    });
    let deadline = Instant::now() + Duration::from_secs(1);
    let accepted = loop {
        match listener.accept() {
            Ok((_, peer)) => break peer.as_socket(),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break None,
        }
    };
    drop(outbound);
    let r = InboundSyn {
        outbound_seen_as,
        accepted,
        connect,
    };
    println!("{r:?}");
    r
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn tcp_syn_to_a_mapping_opens_with_endpoint_independent_filtering() {
    let r = tcp_syn_to_a_mapping(Some(Filtering::EndpointIndependent));
    assert_eq!(
        r.outbound_seen_as,
        socket_addr(ROUTER_WAN_ADDR, 45000),
        "mapping"
    );
    assert_eq!(r.connect, Ok(()), "{r:?}");
    let peer = r
        .accepted
        .expect("the LAN host's listener accepted nothing");
    assert_eq!(peer.ip(), IpAddr::V4(SERVER_ADDR), "{r:?}");
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn tcp_syn_to_a_mapping_is_refused_with_address_port_dependent_filtering() {
    let r = tcp_syn_to_a_mapping(None);
    assert_eq!(
        r.outbound_seen_as,
        socket_addr(ROUTER_WAN_ADDR, 45000),
        "mapping"
    );
    assert!(r.connect.is_err(), "{r:?}");
    assert_eq!(r.accepted, None, "{r:?}");
}
