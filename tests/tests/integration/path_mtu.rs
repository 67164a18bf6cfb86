//! Packets of a standalone router's flows that are larger than the next
//! hop's MTU, end to end with real sockets: the router's LAN (or WAN) link
//! is narrowed to 1400 bytes while the hosts' stay at 1500, and the
//! kernel's answers are what the hosts see:
//! - a TCP download without MSS clamping: the server's full-size segments
//!   meet the narrower LAN, the router answers with an ICMP Fragmentation
//!   Needed quoting them as sent, the server's path MTU discovery lowers
//!   its segments, and the download completes (the router's stack would
//!   otherwise take them as its own and reset the connection);
//! - UDP with DF clear is fragmented by the kernel after XDP translated it
//!   (both directions: the server sees the flow's own mapped port), with
//!   DF set the sender learns the MTU.
//!
//! The `BPF_PROG_RUN` tests (`prog_run::oversize`) check the bytes.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use tests::{
    LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF, counter_delta, pattern, sockopt,
};

use crate::ctl::attach_and_print;
use crate::mss_clamp::{COMPLETES_WITHIN, PAYLOAD, download};

/// The narrowed link's MTU; the hosts' interfaces stay at 1500.
const NARROW_MTU: i32 = 1400;
/// A UDP payload whose packet exceeds [`NARROW_MTU`] but fits 1500.
const BIG: usize = 1450;
const UDP_PORT: u16 = 5330;
const RECEIVE_WITHIN: Duration = Duration::from_secs(3);

/// Sets the router's `dev` to [`NARROW_MTU`].
fn narrow(t: &Topology, dev: &str) {
    let mtu = NARROW_MTU.to_string();
    t.exec_ok(Ns::Router, &["ip", "link", "set", dev, "mtu", &mtu]);
}

/// A TCP download through a LAN narrower than the server's link, with
/// MSS clamping off (so the client's SYN advertises 1460 and the server
/// sends 1500-byte packets): the router answers the first ones with
/// Fragmentation Needed, the server's path MTU becomes the LAN's, and the
/// download completes intact.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_tcp_download_finds_the_path_mtu_of_a_narrower_lan() {
    let t = Topology::new();
    narrow(&t, LAN_IF);
    attach_and_print(&t, &["--clamp-mss", "off"]);
    let before = t.stats();
    let d = download(&t, COMPLETES_WITHIN);
    let after = t.stats();
    println!("{}", t.router_ctl_ok(&["stats"]));
    let answered = counter_delta(&before, &after, "drop_frag_needed_answered");
    println!(
        "received {} of {PAYLOAD} bytes (complete: {}); server send MSS {} at first, path MTU \
         {} at the end; {answered} answered",
        d.got.len(),
        d.complete,
        d.server.tcpi_snd_mss,
        d.server_end.tcpi_pmtu,
    );
    assert!(
        d.server.tcpi_snd_mss > 1400,
        "the server's send MSS {} fits the LAN: nothing to discover",
        d.server.tcpi_snd_mss
    );
    assert!(answered >= 1, "no Fragmentation Needed was sent");
    assert_eq!(
        d.server_end.tcpi_pmtu, NARROW_MTU as u32,
        "the server's path MTU"
    );
    assert!(
        d.complete && d.got == pattern(PAYLOAD),
        "the download got {} of {PAYLOAD} bytes (complete: {})",
        d.got.len(),
        d.complete
    );
}

/// Sets `IP_MTU_DISCOVER` of `sock` to `mode` (`IP_PMTUDISC_DO`: DF set and
/// no local fragmenting; `IP_PMTUDISC_DONT`: DF clear).
fn set_pmtu_discovery(sock: &UdpSocket, mode: libc::c_int) {
    let (level, name) = (libc::IPPROTO_IP, libc::IP_MTU_DISCOVER);
    sockopt::set_int(sock, level, name, mode, "IP_MTU_DISCOVER");
}

/// The path MTU the kernel knows for the connected socket `sock`
/// (`IP_MTU`).
fn path_mtu(sock: &UdpSocket) -> i32 {
    // SAFETY: an int option.
    unsafe { sockopt::get(sock, libc::IPPROTO_IP, libc::IP_MTU, "IP_MTU") }
}

/// The next datagram on `sock` within [`RECEIVE_WITHIN`], with its
/// sender; `None` if none came.
fn receive(sock: &UdpSocket) -> Option<(Vec<u8>, SocketAddr)> {
    sock.set_read_timeout(Some(RECEIVE_WITHIN)).unwrap();
    let mut buf = vec![0u8; 4096];
    match sock.recv_from(&mut buf) {
        Ok((n, from)) => Some((buf[..n].to_vec(), from)),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            None
        }
        Err(e) => panic!("recv: {e}"),
    }
}

/// A UDP flow from the client to the server (opened by a small datagram,
/// so the data path carries it): the client's socket, the server's, and
/// the flow's mapped address (where the server saw it come from).
fn udp_flow(t: &Topology) -> (UdpSocket, UdpSocket, SocketAddr) {
    let server = t.in_ns(Ns::Server, || {
        UdpSocket::bind((SERVER_ADDR, UDP_PORT)).expect("bind the server")
    });
    let client = t.in_ns(Ns::Client, || {
        UdpSocket::bind(("0.0.0.0", 0)).expect("bind the client")
    });
    client.connect((SERVER_ADDR, UDP_PORT)).unwrap();
    client.send(b"open").unwrap();
    let (got, mapped) = receive(&server).expect("the first datagram reached the server");
    assert_eq!(got, b"open");
    assert_eq!(mapped.ip(), ROUTER_WAN_ADDR, "masqueraded");
    (client, server, mapped)
}

/// UDP over a LAN narrower than the server's link: a datagram with DF
/// clear reaches the client whole (XDP translated it, the kernel
/// fragmented it); one with DF set does not, and the server's kernel
/// learns the LAN's MTU from the router's answer.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn udp_larger_than_the_lan_is_fragmented_or_answered() {
    let t = Topology::new();
    narrow(&t, LAN_IF);
    attach_and_print(&t, &[]);
    let (client, server, mapped) = udp_flow(&t);
    server.connect(mapped).unwrap();
    let big = pattern(BIG);

    passed_translated(&t, (&server, &client));

    assert_eq!(path_mtu(&server), 1500, "the server's path MTU at first");
    refused_with_df(&t, (&server, &client), "drop_frag_needed_answered");
    // The answer also reached the socket: a connected one gets the error
    // (pending until read, as a later send would return it).
    let pending = server.take_error().unwrap();
    assert_eq!(
        pending.as_ref().and_then(std::io::Error::raw_os_error),
        Some(libc::EMSGSIZE),
        "the server socket's pending error: {pending:?}"
    );
    let e = server
        .send(&big)
        .expect_err("a DF datagram over the path MTU");
    assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE), "{e}");
    // What fits the path still goes through.
    let fits = pattern(NARROW_MTU as usize - 28);
    server.send(&fits).unwrap();
    assert_eq!(receive(&client).map(|(d, _)| d), Some(fits));
}

/// UDP from the client over a WAN narrower than its LAN: with DF clear,
/// translated by XDP and fragmented by the kernel, it reaches the server
/// from the flow's own mapped address (passed untranslated, the kernel's
/// slow-path NAT would give it another port); with DF set the kernel
/// answers the client, whose kernel learns the WAN's MTU.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn udp_from_the_lan_larger_than_the_wan_keeps_its_mapping() {
    let t = Topology::new();
    narrow(&t, WAN_IF);
    attach_and_print(&t, &[]);
    let (client, server, mapped) = udp_flow(&t);
    let from = passed_translated(&t, (&client, &server));
    assert_eq!(from, mapped, "from the flow's mapped address");

    refused_with_df(&t, (&client, &server), "pass_mtu");
}

/// A [`BIG`] datagram with DF clear from `from` (connected) to `to`
/// through the narrowed link: XDP translates and passes it, the kernel
/// fragments it, and it arrives whole. Where it came from, as `to` saw it.
fn passed_translated(t: &Topology, (from, to): (&UdpSocket, &UdpSocket)) -> SocketAddr {
    set_pmtu_discovery(from, libc::IP_PMTUDISC_DONT);
    let big = pattern(BIG);
    let before = t.stats();
    from.send(&big).unwrap();
    let got = receive(to);
    let after = t.stats();
    assert!(
        got.as_ref().is_some_and(|(d, _)| *d == big),
        "DF clear: {:?} bytes arrived",
        got.map(|(d, _)| d.len())
    );
    assert_eq!(
        counter_delta(&before, &after, "pass_mtu_translated"),
        1,
        "the datagram passed translated"
    );
    got.expect("checked above").1
}

/// A [`BIG`] datagram with DF set from `from` (connected) to `to` through
/// the narrowed link: it does not arrive, the router's data path counts it
/// under `counter`, and the sender's kernel learns [`NARROW_MTU`] from the
/// Fragmentation Needed (the data path's answer, or the kernel's).
fn refused_with_df(t: &Topology, (from, to): (&UdpSocket, &UdpSocket), counter: &str) {
    set_pmtu_discovery(from, libc::IP_PMTUDISC_DO);
    let before = t.stats();
    from.send(&pattern(BIG)).unwrap();
    assert!(
        receive(to).is_none(),
        "DF set: the datagram went through the narrower link"
    );
    let after = t.stats();
    assert_eq!(counter_delta(&before, &after, counter), 1, "{counter}");
    assert_eq!(path_mtu(from), NARROW_MTU, "the sender's path MTU");
}
