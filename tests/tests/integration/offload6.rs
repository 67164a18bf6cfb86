//! IPv6 in offload mode end to end: a router namespace with an nftables
//! firewall written for IPv6 (forward policy drop, established allowed,
//! LAN -> WAN allowed except one UDP port; no NAT, IPv6 is routed),
//! `attach --admit kernel` and `router-ctl run`. The kernel admits every
//! flow; the daemon moves established ones to `CONNTRACK6`, and a stopped
//! daemon hands them back to the kernel when their lease ends.

use std::{
    net::{IpAddr, Ipv6Addr, SocketAddr, UdpSocket},
    time::Duration,
};

use tests::v6::{self, CLIENT6, SERVER6};
use tests::{LAN_IF, Ns, Topology, WAN_IF, host::load_nft};

use crate::ctl::{DetachOnDrop, Stream, wait_for};
use crate::ipv6_e2e::{kernel_forwarded6, ping6};
use crate::offload::{
    Daemon, echoes, kernel_entries, offloaded_rows, short_udp_timeouts, udp_echo,
};

/// The UDP port the firewall drops from the LAN.
const BLOCKED_UDP_PORT: u16 = 9999;

fn sa6(a: Ipv6Addr, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(a), port)
}

/// The router's IPv6 firewall, as a home router's owner writes it
/// (RFC 6092 in netfilter terms): outbound opens, inbound only what
/// belongs to a known connection.
fn install_firewall6(t: &Topology) {
    let rules = format!(
        "table ip6 filter6 {{
  chain forward {{
    type filter hook forward priority 0; policy drop;
    ct state established,related counter accept
    iifname \"{LAN_IF}\" oifname \"{WAN_IF}\" udp dport {BLOCKED_UDP_PORT} counter drop
    iifname \"{LAN_IF}\" oifname \"{WAN_IF}\" accept
  }}
}}
"
    );
    load_nft(t.ns_name(Ns::Router), &rules);
}

/// The firewalled IPv6 router in offload mode, its neighbours known.
fn router6(t: &Topology) {
    v6::enable(t);
    install_firewall6(t);
    let out = t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    assert!(out.contains("kernel"), "attach: {out}");
    v6::resolve_neighbours(t);
}

/// A connected IPv6 UDP socket in the client namespace from `port`.
fn udp6_client(t: &Topology, port: u16, dst: SocketAddr) -> UdpSocket {
    t.in_ns(Ns::Client, || {
        let s = UdpSocket::bind(sa6(Ipv6Addr::UNSPECIFIED, port)).unwrap();
        s.connect(dst).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        s
    })
}

fn offloaded6(t: &Topology) -> Vec<serde_json::Value> {
    offloaded_rows(t)
        .into_iter()
        .filter(|f| f["family"] == "ipv6")
        .collect()
}

/// The firewall decides, established IPv6 flows (UDP, TCP, ping6) move to
/// XDP: their packets are counted by the fast path while the kernel's
/// `Ip6OutForwDatagrams` stays (almost) flat.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload6_firewall_decides_and_established_flows_move_to_xdp() {
    let t = Topology::new();
    router6(&t);
    let _detach = DetachOnDrop(&t);
    let daemon = Daemon::start(&t, &[]);
    let life = Duration::from_mins(1);
    let _udp_srv = udp_echo(&t, Ns::Server, sa6(SERVER6, 7000), life);
    let _blocked_srv = udp_echo(&t, Ns::Server, sa6(SERVER6, BLOCKED_UDP_PORT), life);

    // The firewall still decides: the blocked port stays blocked, and so
    // does an unsolicited connection from the WAN to a LAN host.
    let blocked = udp6_client(&t, 41000, sa6(SERVER6, BLOCKED_UDP_PORT));
    assert_eq!(
        echoes(&blocked, 3, Duration::ZERO),
        0,
        "the firewall's IPv6 drop rule was bypassed"
    );
    let r = t.try_tcp_echo(
        Ns::Server,
        Ns::Client,
        sa6(CLIENT6, 2222),
        Duration::from_secs(2),
    );
    assert!(r.is_err(), "unsolicited inbound TCP reached the LAN: {r:?}");

    // An established UDP flow moves to XDP after its first reply.
    let udp = udp6_client(&t, 42000, sa6(SERVER6, 7000));
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3);
    wait_for(
        "the UDP flow to be offloaded",
        Duration::from_secs(5),
        || {
            offloaded6(&t)
                .iter()
                .any(|f| f["proto"] == "udp" && f["orig_dst"] == format!("[{SERVER6}]:7000"))
        },
    );
    let (kernel0, out0, in0) = (
        kernel_forwarded6(&t),
        t.counter("fwd6_outbound"),
        t.counter("fwd6_inbound"),
    );
    assert_eq!(echoes(&udp, 40, Duration::from_millis(5)), 40);
    let kernel_fwd = kernel_forwarded6(&t) - kernel0;
    let (xdp_out, xdp_in) = (
        t.counter("fwd6_outbound") - out0,
        t.counter("fwd6_inbound") - in0,
    );
    println!(
        "40 echoes of an offloaded IPv6 UDP flow: kernel forwarded {kernel_fwd}, XDP {xdp_out} out / {xdp_in} in"
    );
    assert!(
        xdp_out >= 40 && xdp_in >= 40,
        "XDP did not carry the flow: {xdp_out}/{xdp_in}"
    );
    assert!(
        kernel_fwd < 10,
        "the kernel still forwards the offloaded flow ({kernel_fwd})"
    );
    flushed_udp6_flow_is_offloaded_again(&t, &udp);

    // TCP: a stream is offloaded once established, then carried by XDP;
    // its FIN/RST still go to the kernel, which ends it.
    let control0 = t.counter("pass_offload_tcp_control");
    let stream = Stream::start(&t, sa6(SERVER6, 7200), 4 << 20, 3.0);
    wait_for(
        "the TCP stream to be offloaded",
        Duration::from_secs(5),
        || offloaded6(&t).iter().any(|f| f["proto"] == "tcp"),
    );
    let out1 = t.counter("fwd6_outbound");
    let bytes = stream.finish();
    println!("IPv6 TCP stream: {bytes} bytes intact");
    assert!(
        t.counter("fwd6_outbound") - out1 > 100,
        "XDP did not carry the offloaded IPv6 TCP stream"
    );
    assert!(
        t.counter("pass_offload_tcp_control") > control0,
        "the offloaded flow's FIN did not go to the kernel"
    );
    wait_for(
        "the closed TCP flow to leave XDP",
        Duration::from_secs(5),
        || !offloaded6(&t).iter().any(|f| f["proto"] == "tcp"),
    );

    // ping6: after the first reply the echo flow is offloaded too.
    let ping_out0 = t.counter("fwd6_outbound");
    assert!(
        ping6(&t, Ns::Client, SERVER6, 6),
        "ping6 through the router"
    );
    assert!(
        offloaded6(&t).iter().any(|f| f["proto"] == "icmpv6"),
        "no offloaded ICMPv6 echo flow: {}",
        t.router_ctl_ok(&["conntrack", "list"])
    );
    assert!(
        t.counter("fwd6_outbound") - ping_out0 >= 3,
        "XDP carried no echo request"
    );

    println!("{}", t.router_ctl_ok(&["conntrack", "list"]));
    assert!(
        daemon.log().contains("offloaded"),
        "the daemon logged no offload:\n{}",
        daemon.log()
    );
    let stats = t.router_ctl_ok(&["stats"]);
    println!("{stats}");
    assert!(t.counter("pass_not_offloaded") > 0, "{stats}");
}

/// A stopped daemon hands IPv6 flows back: with the kernel's UDP timeout at
/// 10 s the lease is 5 s; after a SIGKILL the flow goes on through XDP
/// until its lease ends, then through the kernel (`pass_lease_expired`),
/// without losing an echo. A TCP stream running across the SIGKILL
/// finishes with every byte.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn offload6_daemon_stop_hands_flows_back_to_the_kernel() {
    let t = Topology::new();
    short_udp_timeouts(&t);
    router6(&t);
    let _detach = DetachOnDrop(&t);
    let mut daemon = Daemon::start(&t, &[]);
    let _srv = udp_echo(&t, Ns::Server, sa6(SERVER6, 7400), Duration::from_mins(1));
    let udp = udp6_client(&t, 43000, sa6(SERVER6, 7400));
    assert_eq!(echoes(&udp, 3, Duration::from_millis(100)), 3);
    wait_for(
        "the UDP flow to be offloaded",
        Duration::from_secs(5),
        || offloaded6(&t).iter().any(|f| f["proto"] == "udp"),
    );
    let secs = 6.0;
    let stream = Stream::start(&t, sa6(SERVER6, 7300), 6 << 20, secs);
    wait_for("the stream to be offloaded", Duration::from_secs(5), || {
        offloaded6(&t).iter().any(|f| f["proto"] == "tcp")
    });
    std::thread::sleep(Duration::from_millis(500));
    daemon.kill9();
    let (expired0, out0, kernel0) = (
        t.counter("pass_lease_expired"),
        t.counter("fwd6_outbound"),
        kernel_forwarded6(&t),
    );
    // 9 s of echoes, one every 0.25 s: the lease (5 s from the last
    // renewal) ends in the middle.
    assert_eq!(
        echoes(&udp, 36, Duration::from_millis(250)),
        36,
        "echoes lost across the hand-back"
    );
    stream.finish();
    let (expired, xdp_out, kernel) = (
        t.counter("pass_lease_expired") - expired0,
        t.counter("fwd6_outbound") - out0,
        kernel_forwarded6(&t) - kernel0,
    );
    println!(
        "after the SIGKILL: XDP forwarded {xdp_out} out, {expired} passed after the lease, kernel forwarded {kernel}"
    );
    assert!(xdp_out >= 4, "XDP stopped at once, not at the lease's end");
    assert!(expired >= 10, "the lease never ended ({expired} passed)");
    assert!(
        kernel >= 20,
        "the kernel did not take the flow back ({kernel} forwarded)"
    );
    assert_eq!(
        kernel_entries(&t, &["-f", "ipv6", "-p", "udp", "--orig-port-src", "43000"]).len(),
        1,
        "the kernel lost the flow"
    );
}

/// `conntrack flush` of IPv6 entries alone (no IPv4 flow on the router):
/// the kernel carries the offloaded UDP flow to port 7000 meanwhile, and
/// the daemon offloads it again (the flush counter covers both families).
fn flushed_udp6_flow_is_offloaded_again(t: &Topology, udp: &std::net::UdpSocket) {
    let udp_offloaded = || {
        offloaded6(t)
            .iter()
            .any(|f| f["proto"] == "udp" && f["orig_dst"] == format!("[{SERVER6}]:7000"))
    };
    t.router_ctl_ok(&["conntrack", "flush"]);
    assert!(!udp_offloaded(), "flushed");
    assert_eq!(echoes(udp, 3, Duration::from_millis(100)), 3);
    wait_for(
        "the flushed IPv6 UDP flow to be offloaded again",
        Duration::from_secs(15),
        udp_offloaded,
    );
}
