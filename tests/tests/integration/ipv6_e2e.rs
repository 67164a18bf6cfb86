//! IPv6 end to end in standalone mode: global addresses on every host, the
//! server routed back to the LAN prefix through the router (routed, not
//! translated). TCP, UDP and ping6 go through the fast path while the
//! kernel's IPv6 forwarding counter stays flat; unsolicited inbound TCP/UDP
//! to a LAN host is dropped (RFC 6092) until `router-ctl forward add`
//! opens a pinhole. Without the program the kernel would forward all of it
//! (forwarding on, no firewall), so every check depends on the fast path.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;
use tests::v6::{self, CLIENT6, SERVER6};
use tests::{Ns, Topology, counter_delta};

use crate::ctl::attach_and_print;

/// The router namespace's `Ip6OutForwDatagrams` (/proc/net/snmp6).
pub(crate) fn kernel_forwarded6(t: &Topology) -> u64 {
    snmp6(t, Ns::Router, "Ip6OutForwDatagrams")
}

/// The IPv6 counter `name` of namespace `ns` (/proc/net/snmp6).
fn snmp6(t: &Topology, ns: Ns, name: &str) -> u64 {
    let text = t.exec_ok(ns, &["cat", "/proc/net/snmp6"]);
    text.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(name)).then(|| w.next()?.parse().ok())?
        })
        .unwrap_or_else(|| panic!("{name} in /proc/net/snmp6"))
}

pub(crate) fn ping6(t: &Topology, from: Ns, to: std::net::Ipv6Addr, count: u32) -> bool {
    let (c, d) = (count.to_string(), to.to_string());
    t.exec(
        from,
        &[
            "ping", "-6", "-n", "-q", "-c", &c, "-i", "0.2", "-W", "1", &d,
        ],
    )
    .status
    .success()
}

/// The client's `len`-byte UDP datagram to the server's `port` comes back
/// whole, and the server saw the client's own address (IPv6 is routed,
/// not translated); `what` names it in a failure.
fn assert_udp6_echo(t: &Topology, port: u16, len: usize, what: &str) {
    let payload = tests::pattern(len);
    let srv = t.udp_echo_server(Ns::Server, SocketAddr::new(IpAddr::V6(SERVER6), port));
    let got = t.udp_echo_client(
        Ns::Client,
        srv.local_addr(),
        &payload,
        Duration::from_secs(5),
    );
    let peer = srv.join();
    assert_eq!(
        got.as_deref().ok(),
        Some(&payload[..]),
        "{what}: {got:?}\n{}",
        t.router_ctl_ok(&["stats"])
    );
    assert_eq!(peer.map(|p| p.ip()), Some(IpAddr::V6(CLIENT6)), "{what}");
}

/// A standalone router with IPv6 on every host and its neighbours known.
fn router() -> Topology {
    let t = Topology::new();
    v6::enable(&t);
    attach_and_print(&t, &[]);
    v6::resolve_neighbours(&t);
    t
}

fn ipv6_flows(t: &Topology) -> Vec<Value> {
    t.conntrack()
        .into_iter()
        .filter(|f| f["family"] == "ipv6")
        .collect()
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ipv6_tcp_udp_ping6_through_the_fast_path() {
    let t = router();
    let before = t.stats();
    let kernel_before = kernel_forwarded6(&t);

    let tcp = SocketAddr::new(IpAddr::V6(SERVER6), 5201);
    let peer = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, tcp);
    assert_eq!(
        peer.ip(),
        IpAddr::V6(CLIENT6),
        "IPv6 is routed, not translated"
    );
    let udp = SocketAddr::new(IpAddr::V6(SERVER6), 5202);
    let peer = t.udp_echo_roundtrip(Ns::Client, Ns::Server, udp);
    assert_eq!(peer.ip(), IpAddr::V6(CLIENT6));
    assert!(
        ping6(&t, Ns::Client, SERVER6, 3),
        "ping6 through the router"
    );

    let after = t.stats();
    let kernel_after = kernel_forwarded6(&t);
    println!("{}", t.router_ctl_ok(&["stats"]));
    println!("{}", t.router_ctl_ok(&["conntrack", "list"]));
    let out = counter_delta(&before, &after, "fwd6_outbound");
    let inb = counter_delta(&before, &after, "fwd6_inbound");
    // 256 KiB echoed each way is far more than 100 segments per direction.
    assert!(
        out >= 100 && inb >= 100,
        "fast path carried only {out} out / {inb} in"
    );
    assert_eq!(
        counter_delta(&before, &after, "flow6_new_outbound"),
        3,
        "tcp, udp and ping6 flows"
    );
    assert!(
        kernel_after - kernel_before < 5,
        "the kernel forwarded {} IPv6 packets; the fast path should have",
        kernel_after - kernel_before
    );
    let flows = ipv6_flows(&t);
    let want = format!("[{SERVER6}]:5201");
    let f = flows
        .iter()
        .find(|f| f["proto"] == "tcp" && f["orig_dst"] == want.as_str())
        .unwrap_or_else(|| panic!("no IPv6 TCP flow to {want}: {flows:?}"));
    assert_eq!(f["origin"], "lan");
    assert_eq!(f["xlat_src"], f["orig_src"]);
    // Real stacks' FINs (after 256 KiB each way, windows scaled) fall in
    // the windows the data path tracked: none judged out of window, and
    // the two FINs closed the flow.
    assert_eq!(
        counter_delta(&before, &after, "tcp_out_of_window"),
        0,
        "a real segment was judged out of window"
    );
    assert_eq!(f["state"], "CLOSED", "{f}");
    assert!(flows.iter().any(|f| f["proto"] == "icmpv6"), "{flows:?}");

    // Every view shows the IPv6 table: count, stats, status.
    let count: Value =
        serde_json::from_str(&t.router_ctl_ok(&["conntrack", "count", "--json"])).unwrap();
    assert_eq!(count["ipv6"]["flows"], 3, "{count}");
    assert_eq!(count["ipv6"]["entries"], 6, "{count}");
    assert_eq!(count["ipv6"]["capacity"], 131_072, "{count}");
    assert_eq!(after["conntrack"]["ipv6"]["entries"], 6, "{after}");
    let stats = t.router_ctl_ok(&["stats"]);
    assert!(
        stats.contains("conntrack6 entries 6 of capacity 131072"),
        "{stats}"
    );
    let status_json: Value = serde_json::from_str(&t.router_ctl_ok(&["status", "--json"])).unwrap();
    assert_eq!(
        status_json["maps"]["conntrack6"]["entries"], 6,
        "{status_json}"
    );
    assert!(
        t.router_ctl_ok(&["status"])
            .contains("map conntrack6: 6 of 131072 entries"),
        "status"
    );
    // Flush empties both tables.
    let flushed = t.router_ctl_ok(&["conntrack", "flush"]);
    assert!(flushed.contains("6 IPv6 entries (3 flows)"), "{flushed}");
    assert!(ipv6_flows(&t).is_empty(), "{:?}", ipv6_flows(&t));
}

/// Datagrams a LAN host fragments itself (larger than its own link's MTU:
/// `ping -s 3000`, a 3000-byte UDP datagram) as the first packets of their
/// flows: the fragments cross on the kernel path, the first one opens the
/// flow, and the fragmented replies get in as a known flow's (without the
/// flow standalone mode's inbound filter dropped them).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_lan_hosts_own_fragments_open_their_flow() {
    let t = router();
    let before = t.stats();
    let o = t.exec(
        Ns::Client,
        &[
            "ping",
            "-6",
            "-n",
            "-q",
            "-c",
            "3",
            "-i",
            "0.2",
            "-W",
            "1",
            "-s",
            "3000",
            &SERVER6.to_string(),
        ],
    );
    assert!(
        o.status.success(),
        "ping -s 3000 through the router: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        t.router_ctl_ok(&["stats"])
    );
    assert_udp6_echo(&t, 5303, 3000, "a 3000-byte datagram echoed");
    let after = t.stats();
    assert_eq!(
        counter_delta(&before, &after, "flow6_new_outbound"),
        2,
        "the ping's flow and the datagram's\n{}",
        t.router_ctl_ok(&["stats"])
    );
    assert_eq!(counter_delta(&before, &after, "drop6_unsolicited"), 0);
    assert!(counter_delta(&before, &after, "pass6_ext_fragment") >= 12);
    let flows = ipv6_flows(&t);
    assert!(
        flows.iter().any(|f| f["proto"] == "icmpv6")
            && flows
                .iter()
                .any(|f| f["proto"] == "udp" && f["orig_dst"] == format!("[{SERVER6}]:5303")),
        "{flows:?}"
    );
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ipv6_unsolicited_inbound_blocked_until_a_pinhole() {
    let t = router();
    let tcp = SocketAddr::new(IpAddr::V6(CLIENT6), 2222);
    let udp = SocketAddr::new(IpAddr::V6(CLIENT6), 2223);
    let short = Duration::from_secs(2);
    let before = t.stats();
    let r = t.try_tcp_echo(Ns::Server, Ns::Client, tcp, short);
    assert!(r.is_err(), "unsolicited TCP reached the LAN host: {r:?}");
    let r = t.try_udp_echo(Ns::Server, Ns::Client, udp, short);
    assert!(r.is_err(), "unsolicited UDP reached the LAN host: {r:?}");
    let after = t.stats();
    assert!(
        counter_delta(&before, &after, "drop6_unsolicited") >= 2,
        "{}",
        t.router_ctl_ok(&["stats"])
    );
    assert!(ipv6_flows(&t).is_empty(), "{:?}", ipv6_flows(&t));

    let tcp_hole = format!("[{CLIENT6}]:2222");
    let udp_hole = format!("[{CLIENT6}]:2223");
    println!("{}", t.router_ctl_ok(&["forward", "add", "tcp", &tcp_hole]));
    println!("{}", t.router_ctl_ok(&["forward", "add", "udp", &udp_hole]));
    let list: Value =
        serde_json::from_str(&t.router_ctl_ok(&["forward", "list", "--json"])).unwrap();
    let holes: Vec<&Value> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["family"] == "ipv6")
        .collect();
    assert_eq!(holes.len(), 2, "{list}");
    assert_eq!(holes[0]["lan_addr"], CLIENT6.to_string().as_str());

    let peer = t
        .try_tcp_echo(Ns::Server, Ns::Client, tcp, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("through the TCP pinhole: {e}"));
    assert_eq!(peer.ip(), IpAddr::V6(SERVER6));
    t.try_udp_echo(Ns::Server, Ns::Client, udp, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("through the UDP pinhole: {e}"));
    let flows = ipv6_flows(&t);
    println!("{}", t.router_ctl_ok(&["conntrack", "list"]));
    assert!(
        flows.iter().any(|f| f["proto"] == "tcp"
            && f["origin"] == "wan"
            && f["orig_dst"] == tcp_hole.as_str()),
        "{flows:?}"
    );
    let end = t.stats();
    assert_eq!(counter_delta(&after, &end, "flow6_new_pinhole"), 2);

    println!("{}", t.router_ctl_ok(&["forward", "del", "tcp", &tcp_hole]));
    // A new connection (a new source port: the pinhole's flows run until
    // they expire) finds the port closed again.
    assert!(
        t.try_tcp_echo(Ns::Server, Ns::Client, tcp, short).is_err(),
        "the deleted pinhole still lets connections in"
    );
    let other = SocketAddr::new(IpAddr::V6(CLIENT6), 2224);
    assert!(
        t.try_tcp_echo(Ns::Server, Ns::Client, other, short)
            .is_err(),
        "a port without a pinhole stays closed"
    );

    // In offload mode the kernel's firewall decides: the pinholes kept in
    // the maps are listed as unused.
    println!(
        "{}",
        t.router_ctl_ok(&["attach", tests::LAN_IF, tests::WAN_IF, "--admit", "kernel"])
    );
    let list = t.router_ctl_ok(&["forward", "list"]);
    assert!(
        list.contains(&udp_hole[1..udp_hole.find(']').unwrap()])
            && list.contains("these rules are not used"),
        "{list}"
    );
}

/// A socket of `ty` in namespace `ns` whose packets carry an empty
/// Destination Options header (one `PadN` option: 8 bytes; the kernel
/// fills in the next header).
fn with_dest_opts(t: &Topology, ns: Ns, ty: socket2::Type) -> socket2::Socket {
    t.in_ns(ns, || {
        let s = socket2::Socket::new(socket2::Domain::IPV6, ty, None).expect("IPv6 socket");
        let opts: [u8; 8] = [0, 0, 1, 4, 0, 0, 0, 0];
        // SAFETY: a valid option buffer of its length, on an open socket.
        let rc = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&s),
                libc::IPPROTO_IPV6,
                libc::IPV6_DSTOPTS,
                opts.as_ptr().cast(),
                opts.len() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "IPV6_DSTOPTS: {}", std::io::Error::last_os_error());
        s
    })
}

/// An extension header does not open the way in (RFC 6092 REC-31): a WAN
/// host's TCP SYN and UDP datagram to a LAN host with a Destination
/// Options header in front (which the fast path does not walk, and passes)
/// are dropped by standalone mode's inbound filter, not forwarded by the
/// kernel, so no reply opens a flow that would let the host in after.
/// The same header from the LAN host goes out.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_extension_header_does_not_open_the_way_in() {
    let t = router();
    let tcp_dst = SocketAddr::new(IpAddr::V6(CLIENT6), 2225);
    let udp_dst = SocketAddr::new(IpAddr::V6(CLIENT6), 2226);
    let listener = t.in_ns(Ns::Client, || std::net::TcpListener::bind(tcp_dst).unwrap());
    let receiver = t.in_ns(Ns::Client, || std::net::UdpSocket::bind(udp_dst).unwrap());
    receiver
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let before = t.stats();

    let syn = with_dest_opts(&t, Ns::Server, socket2::Type::STREAM);
    let connected = syn.connect_timeout(&tcp_dst.into(), Duration::from_secs(3));
    assert!(
        connected.is_err(),
        "a SYN with destination options reached the LAN host"
    );
    assert!(tests::echo::accept_within(&listener, Duration::from_millis(200)).is_err());

    let udp = with_dest_opts(&t, Ns::Server, socket2::Type::DGRAM);
    udp.send_to(b"in", &udp_dst.into()).unwrap();
    let mut buf = [0u8; 16];
    let got = receiver.recv_from(&mut buf);
    assert!(
        got.is_err(),
        "a UDP datagram with destination options reached the LAN host: {got:?}"
    );
    let after = t.stats();
    println!("{}", t.router_ctl_ok(&["stats"]));
    assert!(
        counter_delta(&before, &after, "drop6_unsolicited") >= 2,
        "the inbound filter did not count them"
    );
    assert_eq!(
        counter_delta(&before, &after, "pass6_ext_dest_opts"),
        0,
        "an inbound packet with destination options went to the kernel"
    );
    assert!(ipv6_flows(&t).is_empty(), "{:?}", ipv6_flows(&t));

    // From the LAN the header goes out (the kernel forwards it).
    let out = with_dest_opts(&t, Ns::Client, socket2::Type::DGRAM);
    let server = t.in_ns(Ns::Server, || {
        std::net::UdpSocket::bind(SocketAddr::new(IpAddr::V6(SERVER6), 2227)).unwrap()
    });
    server
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    out.send_to(b"out", &server.local_addr().unwrap().into())
        .unwrap();
    let (n, from) = server.recv_from(&mut buf).expect("the LAN host's datagram");
    assert_eq!((&buf[..n], from.ip()), (&b"out"[..], IpAddr::V6(CLIENT6)));
}

/// Path-MTU discovery with the router's WAN link as the narrow hop (1280,
/// the IPv6 minimum, on both ends of it): the client's first 1400-byte
/// datagram is larger than the egress MTU, so the fast path passes it and
/// the kernel answers Packet Too Big; the client learns the path MTU and
/// fragments the next ones itself, and the fragments (an extension header)
/// cross on the kernel path. (A Packet Too Big from a hop beyond the router,
/// forwarded by the fast path, is covered by `prog_run6::icmp`.)
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ipv6_path_mtu_discovery_through_the_router() {
    let t = Topology::new();
    v6::enable(&t);
    t.exec_ok(
        Ns::Router,
        &["ip", "link", "set", tests::WAN_IF, "mtu", "1280"],
    );
    t.exec_ok(
        Ns::Server,
        &["ip", "link", "set", tests::HOST_IF, "mtu", "1280"],
    );
    attach_and_print(&t, &[]);
    v6::resolve_neighbours(&t);
    let before = t.stats();
    assert_udp6_echo(&t, 5300, 1400, "1400-byte datagram across the 1280 link");
    let after = t.stats();
    println!("{}", t.router_ctl_ok(&["stats"]));
    assert!(
        counter_delta(&before, &after, "pass6_packet_too_big") >= 1,
        "no oversize packet passed for Packet Too Big"
    );
    assert!(
        counter_delta(&before, &after, "pass6_ext_fragment") >= 2,
        "the client did not fragment after learning the path MTU"
    );
    let route = t.exec_ok(
        Ns::Client,
        &["ip", "-6", "route", "get", &SERVER6.to_string()],
    );
    assert!(route.contains("mtu 1280"), "client's path MTU: {route}");
}

/// A namespace of its own, deleted on drop (also when the test fails).
struct ExtraNs(String);

impl Drop for ExtraNs {
    fn drop(&mut self) {
        let _ = tests::host::run(&["ip", "netns", "del", &self.0]);
    }
}

/// The far host: a namespace behind the server (which routes for it)
/// over a 1280-byte link `2001:db8:72::/64`; its address.
fn far_host(t: &Topology) -> (ExtraNs, std::net::Ipv6Addr) {
    let name = format!("{}-far", t.ns_name(Ns::Server));
    let far_addr: std::net::Ipv6Addr = "2001:db8:72::2".parse().unwrap();
    let srv = t.ns_name(Ns::Server).to_owned();
    let run = tests::host::run_ok;
    // The guard once the namespace is ours: a failed add (a name taken)
    // must not delete another's.
    run(&["ip", "netns", "add", &name]);
    let far = ExtraNs(name);
    run(&[
        "ip", "-n", &srv, "link", "add", "far0", "mtu", "1280", "type", "veth", "peer", "name",
        "eth0", "netns", &far.0,
    ]);
    run(&["ip", "-n", &far.0, "link", "set", "eth0", "mtu", "1280"]);
    for (ns, dev, addr) in [
        (srv.as_str(), "far0", "2001:db8:72::1/64"),
        (far.0.as_str(), "eth0", "2001:db8:72::2/64"),
    ] {
        run(&["ip", "-n", ns, "addr", "add", addr, "dev", dev, "nodad"]);
        run(&["ip", "-n", ns, "link", "set", dev, "up"]);
        run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        // Complete checksums from the end host, as on the topology's
        // hosts: the router's fast path forwards what comes back.
        run(&["ip", "netns", "exec", ns, "ethtool", "-K", dev, "tx", "off"]);
    }
    run(&[
        "ip",
        "netns",
        "exec",
        &srv,
        "sysctl",
        "-qw",
        "net.ipv6.conf.all.forwarding=1",
    ]);
    run(&[
        "ip",
        "-n",
        &far.0,
        "-6",
        "route",
        "add",
        "default",
        "via",
        "2001:db8:72::1",
        // The far host advertises the MSS of a 1500-byte path (as a host
        // behind a narrow link further on does: it does not know the
        // path), so the client starts with full-size segments and only
        // path-MTU discovery brings them down.
        "advmss",
        "1440",
    ]);
    (far, far_addr)
}

/// Path-MTU discovery end to end across two narrow hops, one at the
/// router and one beyond it: client -- router -(1400)- server -(1280)-
/// far host, IPv6 forwarding in the server namespace. A TCP transfer from
/// the client (full-size segments; IPv6 routers never fragment) completes:
/// its 1500-byte segments are larger than the router's WAN MTU, so the
/// fast path passes them and the router's kernel answers Packet Too Big
/// (1400); its 1400-byte segments then cross the router and meet the
/// 1280 hop, whose Packet Too Big comes back from beyond the router for a
/// known flow and is forwarded by the fast path to the client. Attached
/// with `--clamp-mss off`: clamped, the SYNs' MSS would keep the segments
/// within the router's 1400 from the start (`mss_clamp` tests that), and
/// only the far hop would answer.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ipv6_path_mtu_discovery_across_a_narrow_hop_beyond_the_router() {
    let t = Topology::new();
    v6::enable(&t);
    let (far, far_addr) = far_host(&t);
    let via = SERVER6.to_string();
    t.exec_ok(
        Ns::Router,
        &["ip", "-6", "route", "add", "2001:db8:72::/64", "via", &via],
    );
    // The router's own narrow hop: its WAN link at 1400.
    t.exec_ok(
        Ns::Router,
        &["ip", "link", "set", tests::WAN_IF, "mtu", "1400"],
    );
    t.exec_ok(
        Ns::Server,
        &["ip", "link", "set", tests::HOST_IF, "mtu", "1400"],
    );
    attach_and_print(&t, &["--clamp-mss", "off"]);
    v6::resolve_neighbours(&t);

    let before = t.stats();
    let kernel_before = kernel_forwarded6(&t);
    let echo = tests::echo::tcp_server(&far.0, SocketAddr::new(IpAddr::V6(far_addr), 5400));
    let payload = tests::pattern(1 << 20);
    let got = t
        .tcp_echo_client(
            Ns::Client,
            echo.local_addr(),
            &payload,
            Duration::from_secs(20),
        )
        .expect("TCP across the 1400 and 1280 hops");
    assert!(got == payload, "the echo differs");
    assert_eq!(echo.join().map(|p| p.ip()), Some(IpAddr::V6(CLIENT6)));
    let after = t.stats();
    println!("{}", t.router_ctl_ok(&["stats"]));
    // The router's kernel answered the passed segments with Packet Too
    // Big (this kernel counts them in Ip6OutForwDatagrams too, before its
    // MTU check: they were not forwarded).
    let snmp6 = t.exec_ok(Ns::Router, &["cat", "/proc/net/snmp6"]);
    let too_big_sent = snmp6
        .lines()
        .find_map(|l| l.strip_prefix("Icmp6OutPktTooBigs"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .expect("Icmp6OutPktTooBigs in /proc/net/snmp6");
    assert!(
        too_big_sent >= 1,
        "the router's kernel sent no Packet Too Big"
    );
    let route = t.exec_ok(
        Ns::Client,
        &["ip", "-6", "route", "get", &far_addr.to_string()],
    );
    println!("client's route to the far host: {route}");
    let delta = |c: &str| counter_delta(&before, &after, c);
    println!(
        "pass6_packet_too_big {}, icmp6_error_forwarded {}, fwd6_outbound {}, fwd6_inbound {}, \
         kernel forwarded {}",
        delta("pass6_packet_too_big"),
        delta("icmp6_error_forwarded"),
        delta("fwd6_outbound"),
        delta("fwd6_inbound"),
        kernel_forwarded6(&t) - kernel_before
    );
    assert!(
        delta("pass6_packet_too_big") >= 1,
        "no oversize segment was passed for the router's Packet Too Big"
    );
    assert!(
        delta("icmp6_error_forwarded") >= 1,
        "the Packet Too Big from beyond the router was not forwarded"
    );
    assert!(route.contains("mtu 1280"), "client's path MTU: {route}");
    assert!(
        delta("fwd6_outbound") >= 100 && delta("fwd6_inbound") >= 100,
        "the transfer did not go through the fast path"
    );
}

/// `apply FILE` with `[[pinhole]]` sections: the pinhole opens inbound TCP
/// to the LAN host; applying the file without it closes it again.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ipv6_pinholes_from_apply() {
    let t = Topology::new();
    v6::enable(&t);
    let dir = tests::Scratch::new("pinholes");
    let path = dir.path("router.toml");
    let file = |pinholes: &str| {
        let text = format!(
            "[router]\nadmit = \"xdp\"\n[interfaces]\nlan = \"{}\"\nwan = \"{}\"\n{pinholes}",
            tests::LAN_IF,
            tests::WAN_IF
        );
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let hole = format!("[[pinhole]]\nproto = \"tcp\"\nto = \"[{CLIENT6}]:2222\"\n");
    let out = t.router_ctl_ok(&["apply", &file(&hole)]);
    println!("{out}");
    v6::resolve_neighbours(&t);
    assert!(
        out.contains(&format!("added tcp pinhole to [{CLIENT6}]:2222")),
        "{out}"
    );
    let tcp = SocketAddr::new(IpAddr::V6(CLIENT6), 2222);
    t.try_tcp_echo(Ns::Server, Ns::Client, tcp, Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("through the applied pinhole: {e}"));
    let out = t.router_ctl_ok(&["apply", &file("")]);
    println!("{out}");
    assert!(
        out.contains(&format!("deleted tcp pinhole to [{CLIENT6}]:2222")),
        "{out}"
    );
    let r = t.try_tcp_echo(Ns::Server, Ns::Client, tcp, Duration::from_secs(2));
    assert!(r.is_err(), "the pinhole stayed open: {r:?}");
}

/// Standalone mode forwards no IPv6 packet whose source the LAN does not
/// route (BCP 38, RFC 6092 3.1): a LAN host that also holds an address of
/// another network pings the server from it, and nothing reaches the
/// server (`drop6_spoofed_source`); its own LAN address still does.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_lan_host_pinging_from_a_foreign_address_reaches_nothing() {
    let t = router();
    // As an upstream gives it: a default route out of the WAN, so the
    // foreign address is routable (out of the WAN, not the LAN).
    let server = SERVER6.to_string();
    t.exec_ok(
        Ns::Router,
        &[
            "ip",
            "-6",
            "route",
            "replace",
            "default",
            "via",
            &server,
            "dev",
            tests::WAN_IF,
        ],
    );
    let foreign = "2001:db8:ffff::9";
    t.exec_ok(
        Ns::Client,
        &[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{foreign}/128"),
            "dev",
            tests::HOST_IF,
            "nodad",
        ],
    );
    let echos = |t: &Topology| snmp6(t, Ns::Server, "Icmp6InEchos");
    let (before, echos0) = (t.stats(), echos(&t));
    let o = t.exec(
        Ns::Client,
        &[
            "ping", "-6", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "1", "-I", foreign, &server,
        ],
    );
    assert!(!o.status.success(), "a ping from {foreign} was answered");
    let after = t.stats();
    assert_eq!(echos(&t), echos0, "the server got a ping from {foreign}");
    assert_eq!(
        counter_delta(&before, &after, "drop6_spoofed_source"),
        3,
        "{after}"
    );
    assert_eq!(
        counter_delta(&before, &after, "flow6_new_outbound"),
        0,
        "{after}"
    );
    assert!(ipv6_flows(&t).is_empty(), "{:?}", ipv6_flows(&t));

    assert!(
        ping6(&t, Ns::Client, SERVER6, 3),
        "its LAN address still reaches the server"
    );
    assert!(echos(&t) >= echos0 + 3);
}
