//! Generic (SKB-mode) XDP end to end, the mode `--mode auto` falls back to
//! on a NIC whose driver has no native XDP (on both interfaces alike:
//! `auto_mode_falls_back_on_both_interfaces_alike`).
//!
//! The kernel runs no GRO on an interface that has a generic XDP program
//! (`netif_elide_gro`) and turns its hardware GRO and LRO off when the
//! program is installed, so the program sees frames as they came off the
//! wire even with GRO on: a standalone flow's TCP segments are translated
//! and forwarded by XDP one by one. A GRO aggregate reaching the program
//! would be larger than its link, passed untranslated (`pass_mtu`), and
//! the router's own stack would take a standalone flow's and reset the
//! connection. (Devices below the interface still merge: a bridge's
//! ports, a VLAN's lower device; `doctor` warns of those,
//! `doctor::doctor_warns_of_merging_below_a_generic_interface`.)

use std::{
    net::SocketAddr,
    os::fd::{AsRawFd, OwnedFd},
};

use tests::{LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF, counter_delta, pattern};

use crate::ctl::attach_and_print;
use crate::mss_clamp::{COMPLETES_WITHIN, Download, PAYLOAD, download};

/// The router interfaces' MTU (the topology's default).
const LINK_MTU: usize = 1500;

/// Capture socket buffer: room for every packet of a whole download.
const CAPTURE_RCVBUF: i32 = 8 << 20;
/// Most packets read from the capture (more than its buffer holds).
const MAX_DRAINED: usize = 1 << 16;

/// Runs `f` while capturing the IPv4 packets crossing the router's `dev`
/// (as the stack sees them: after GRO, after a generic XDP program); its
/// result and the largest IPv4 total length seen.
fn largest_packet_during<T>(t: &Topology, dev: &str, f: impl FnOnce() -> T) -> (T, usize) {
    let ifindex = t.ifindex(Ns::Router, dev);
    let fd: OwnedFd = t.in_ns(Ns::Router, || {
        tests::packet::packet_socket(
            ifindex,
            libc::ETH_P_IP as u16,
            tests::packet::Framing::Packet,
            true,
        )
        .expect("AF_PACKET socket on the router interface")
    });
    tests::sockopt::set_int(
        &fd,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        CAPTURE_RCVBUF,
        "SO_RCVBUFFORCE",
    );
    let r = f();
    // Read afterwards: the tap queues each packet before the router
    // forwards it, so every packet the download's end saw is queued by now.
    let mut largest = 0;
    let mut buf = vec![0u8; 65536];
    for _ in 0..MAX_DRAINED {
        // SAFETY: a valid buffer of its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        match usize::try_from(n) {
            Ok(n) if n >= 4 => {
                largest = largest.max(usize::from(u16::from_be_bytes([buf[2], buf[3]])));
            }
            Ok(_) => {}
            // Nothing queued any more.
            Err(_) => break,
        }
    }
    (r, largest)
}

fn assert_complete(d: &Download, path: &str) {
    assert!(
        d.complete && d.got == pattern(PAYLOAD),
        "{path}: the download got {} of {PAYLOAD} bytes (complete: {})",
        d.got.len(),
        d.complete
    );
}

/// With GRO on on both router interfaces, the wire first shown to make
/// GRO aggregates (through the kernel's NAT the WAN interface receives
/// the download in packets larger than its MTU), a standalone router in
/// generic mode carries the same download in XDP, every segment
/// translated and forwarded on its own: none passed as too large, and the
/// download completes intact.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn generic_mode_sees_wire_frames_with_gro_on() {
    let t = Topology::new();
    for dev in [LAN_IF, WAN_IF] {
        t.exec_ok(Ns::Router, &["ethtool", "-K", dev, "gro", "on"]);
    }

    t.masquerade();
    let (d, largest) = largest_packet_during(&t, WAN_IF, || download(&t, COMPLETES_WITHIN));
    println!("kernel NAT: largest packet received on {WAN_IF}: {largest} bytes");
    assert_complete(&d, "kernel NAT");
    assert!(
        largest > LINK_MTU,
        "no GRO aggregate on the kernel path (largest {largest} bytes): this wire cannot show \
         what generic mode does with them"
    );
    t.iptables(Ns::Router, &["-t", "nat", "-F", "POSTROUTING"]);

    attach_and_print(&t, &["--mode", "generic"]);
    let link = t.exec_ok(Ns::Router, &["ip", "link", "show", "dev", WAN_IF]);
    assert!(
        link.contains("xdpgeneric"),
        "not attached in generic mode: {link}"
    );
    let features = t.exec_ok(Ns::Router, &["ethtool", "-k", WAN_IF]);
    assert!(
        features.contains("generic-receive-offload: on"),
        "GRO went off with the attach: nothing shows that the kernel skips it\n{features}"
    );
    let before = t.stats();
    let (d, largest) = largest_packet_during(&t, WAN_IF, || download(&t, COMPLETES_WITHIN));
    let after = t.stats();
    let inbound = counter_delta(&before, &after, "fwd_inbound");
    let too_large = counter_delta(&before, &after, "pass_mtu");
    println!(
        "generic XDP: {inbound} packets forwarded inbound, {too_large} passed as too large; \
         largest packet the kernel saw on {WAN_IF}: {largest} bytes"
    );
    assert_eq!(
        too_large, 0,
        "packets larger than the link reached the program: {after}"
    );
    assert!(
        largest <= LINK_MTU,
        "the stack received a {largest}-byte packet on {WAN_IF}: an aggregate the program passed"
    );
    assert_complete(&d, "generic XDP");
    assert!(
        inbound as usize >= PAYLOAD / LINK_MTU,
        "{inbound} packets forwarded by XDP for a download of {PAYLOAD} bytes"
    );
}

/// `--mode auto` with a WAN device that has no native XDP (a bridge, as on
/// many home routers): both interfaces fall back together. A native LAN
/// program's redirect into the bridge would hand the frame to a driver
/// XDP transmit the bridge lacks, and the kernel would drop every
/// LAN -> WAN frame while the program counted it forwarded.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn auto_mode_falls_back_on_both_interfaces_alike() {
    let t = Topology::new();
    let wan_cidr = format!("{ROUTER_WAN_ADDR}/24");
    for cmd in [
        "link add br0 type bridge",
        "link set br0 up",
        &format!("addr del {wan_cidr} dev {WAN_IF}"),
        &format!("link set {WAN_IF} master br0"),
        &format!("addr add {wan_cidr} dev br0"),
    ] {
        let mut args = vec!["ip"];
        args.extend(cmd.split_whitespace());
        t.exec_ok(Ns::Router, &args);
    }
    let out = t.router_ctl_ok(&["attach", LAN_IF, "br0", "--admit", "xdp", "--mode", "auto"]);
    println!("{out}");
    let (v, _) = crate::ctl::status(&t);
    let modes: Vec<&str> = v["links"]
        .as_array()
        .expect("links")
        .iter()
        .filter_map(|l| l["mode"].as_str())
        .collect();
    assert_eq!(modes, ["generic", "generic"], "{v}");

    let before = t.stats();
    let seen = t.tcp_echo_roundtrip(
        Ns::Client,
        Ns::Server,
        SocketAddr::from((SERVER_ADDR, 7400)),
    );
    assert_eq!(seen.ip(), ROUTER_WAN_ADDR, "not masqueraded");
    assert!(
        t.ping(Ns::Client, SERVER_ADDR, 3),
        "ping through the router"
    );
    let after = t.stats();
    assert!(
        counter_delta(&before, &after, "fwd_outbound") > 0,
        "XDP carried nothing: {after}"
    );
}
