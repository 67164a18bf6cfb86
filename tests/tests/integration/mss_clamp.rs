//! TCP MSS clamping in standalone mode (`attach --admit xdp
//! --clamp-mss`), end to end: what it is for is a path MTU discovery
//! black hole. The router's WAN link is narrowed to 1492 bytes (`PPPoE`'s
//! MTU) while the server's interface stays at 1500, so the server's
//! full-size frames are dropped by the veth on their way into the router
//! and no ICMP "fragmentation needed" ever reaches the server (RFC 2923
//! 2.1), as behind a carelessly filtered path. A client then downloads
//! through the router with real TCP:
//! - clamped to the path MTU (the standalone default), the SYN and the
//!   SYN-ACK carry an MSS that fits 1492 bytes, the server never sends a
//!   frame the link drops, and the download completes;
//! - with `--clamp-mss off` the same download stalls: the server sends
//!   1500-byte frames, they are dropped, and it retransmits them unchanged;
//! - with `--clamp-mss 1400` the MSS goes below what the path carries.
//!
//! The `BPF_PROG_RUN` tests (`prog_run::mss_clamp`) check the bytes of the
//! option and its checksum; these show the effect on a connection.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use tests::{Ns, SERVER_ADDR, Topology, WAN_IF, counter_delta, pattern, socket_addr};

use crate::ctl::attach_and_print;

const PORT: u16 = 5320;
/// The router's WAN link MTU: `PPPoE`'s 1500 less its 8-byte header.
const WAN_MTU: usize = 1492;
/// The IPv4 and TCP headers without options, which an MSS leaves out.
const HEADERS: usize = 40;
/// The download: 512 KiB, hundreds of full-size segments.
pub(crate) const PAYLOAD: usize = 512 * 1024;
/// Bound of a download that should complete (it takes milliseconds).
pub(crate) const COMPLETES_WITHIN: Duration = Duration::from_secs(10);
/// How long a download that should stall is given: several of the
/// server's retransmission timeouts (200 ms, doubling).
const STALLS_FOR: Duration = Duration::from_secs(4);
const CONNECT: Duration = Duration::from_secs(5);
/// `TCPI_OPT_TIMESTAMPS` of `tcp_info.tcpi_options` (linux/tcp.h).
const TCPI_OPT_TIMESTAMPS: u8 = 1;
/// The TCP timestamps option as a segment carries it (with its padding).
const TIMESTAMPS_LEN: usize = 12;

/// Makes the topology's WAN a black hole for 1500-byte frames towards the
/// router: the router's `wan0` at [`WAN_MTU`], its peer (the server's
/// `eth0`) left at 1500. A veth drops a frame longer than the receiving
/// end's MTU without a word to the sender.
fn narrow_wan(t: &Topology) {
    let mtu = WAN_MTU.to_string();
    t.exec_ok(Ns::Router, &["ip", "link", "set", WAN_IF, "mtu", &mtu]);
    // Linux's default, set so the server cannot find the path MTU on its
    // own by probing after timeouts (RFC 4821): only the SYNs' MSS helps.
    t.exec_ok(Ns::Server, &["sysctl", "-qw", "net.ipv4.tcp_mtu_probing=0"]);
}

/// Frames the router's `wan0` dropped on receipt (the veth drops frames
/// over its MTU and counts them here).
fn wan_rx_dropped(t: &Topology) -> u64 {
    let path = format!("/sys/class/net/{WAN_IF}/statistics/rx_dropped");
    let out = t.exec_ok(Ns::Router, &["cat", &path]);
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {e}: {out:?}"))
}

/// The kernel's `TCP_INFO` of `sock`.
pub(crate) fn tcp_info(sock: &TcpStream) -> libc::tcp_info {
    // SAFETY: the kernel's struct for TCP_INFO, valid all zero.
    unsafe { tests::sockopt::get(sock, libc::IPPROTO_TCP, libc::TCP_INFO, "TCP_INFO") }
}

/// The IPv4 packet a full-size segment of `sock` makes: its send MSS
/// (`tcpi_snd_mss`, the peer's MSS option less the options each segment
/// carries) plus those options and the headers.
fn largest_packet(info: &libc::tcp_info) -> usize {
    let options = if info.tcpi_options & TCPI_OPT_TIMESTAMPS == 0 {
        0
    } else {
        TIMESTAMPS_LEN
    };
    info.tcpi_snd_mss as usize + options + HEADERS
}

/// What a download got to see.
pub(crate) struct Download {
    /// The bytes the client received.
    pub(crate) got: Vec<u8>,
    /// Whether the server's FIN arrived (the whole download).
    pub(crate) complete: bool,
    /// The server's connection right after the handshake.
    pub(crate) server: libc::tcp_info,
    /// Segments the server retransmitted on the connection, at the end.
    pub(crate) server_retrans: u32,
    /// The server's connection at the end.
    pub(crate) server_end: libc::tcp_info,
}

/// The client connects through the router to a server on [`PORT`], which
/// writes [`PAYLOAD`] bytes of [`pattern`] and closes; the client reads
/// until the end or until `limit` has passed. Both sockets are shut down
/// at the end either way.
pub(crate) fn download(t: &Topology, limit: Duration) -> Download {
    let dst = socket_addr(SERVER_ADDR, PORT);
    let listener = t.in_ns(Ns::Server, || {
        TcpListener::bind(dst).expect("bind the server")
    });
    let mut client = t.in_ns(Ns::Client, || {
        TcpStream::connect_timeout(&dst, CONNECT).expect("connect through the router")
    });
    let server = accept(&listener);
    let info = tcp_info(&server);
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    server.set_write_timeout(Some(limit)).unwrap();
    let payload = pattern(PAYLOAD);
    let (got, complete) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut w = &server;
            // An error is the stalled case: the read side below tells.
            let _ = w
                .write_all(&payload)
                .and_then(|()| w.shutdown(Shutdown::Write));
        });
        let deadline = Instant::now() + limit;
        let mut got = Vec::with_capacity(PAYLOAD);
        let mut buf = vec![0u8; 64 * 1024];
        let mut complete = false;
        while Instant::now() < deadline {
            match client.read(&mut buf) {
                Ok(0) => {
                    complete = true;
                    break;
                }
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("client read after {} bytes: {e}", got.len()),
            }
        }
        // Unblocks a writer stuck on a full send buffer.
        let _ = server.shutdown(Shutdown::Both);
        writer.join().expect("server writer thread");
        (got, complete)
    });
    let server_end = tcp_info(&server);
    let _ = client.shutdown(Shutdown::Both);
    Download {
        got,
        complete,
        server: info,
        server_retrans: server_end.tcpi_total_retrans,
        server_end,
    }
}

/// The server's end of the connection the client just opened (the
/// handshake's last ACK may still be on its way through the router).
fn accept(listener: &TcpListener) -> TcpStream {
    tests::echo::accept_within(listener, CONNECT)
        .unwrap_or_else(|e| panic!("the server accepted no connection: {e}"))
        .0
}

/// A download through a standalone router attached with `extra`, over the
/// narrowed WAN: what it got, how much `tcp_mss_clamped` grew, and how
/// many frames `wan0` dropped meanwhile.
fn download_through_black_hole(extra: &[&str], limit: Duration) -> (Download, u64, u64) {
    let t = Topology::new();
    narrow_wan(&t);
    attach_and_print(&t, extra);
    let before = t.stats();
    let dropped = wan_rx_dropped(&t);
    let d = download(&t, limit);
    let after = t.stats();
    let dropped = wan_rx_dropped(&t) - dropped;
    println!("{}", t.router_ctl_ok(&["stats"]));
    println!(
        "received {} of {PAYLOAD} bytes (complete: {}); server send MSS {}, largest packet {}, \
         retransmitted {}; wan0 dropped {dropped} frames",
        d.got.len(),
        d.complete,
        d.server.tcpi_snd_mss,
        largest_packet(&d.server),
        d.server_retrans,
    );
    let clamped = counter_delta(&before, &after, "tcp_mss_clamped");
    (d, clamped, dropped)
}

/// The default (`--clamp-mss pmtu`): the client's SYN and the server's
/// SYN-ACK are clamped to what the 1492-byte WAN link carries (1452), the
/// server's largest packet fits the link, and the download completes,
/// every byte intact. Without the clamp the same download stalls (the
/// next test).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn clamping_to_the_path_mtu_carries_a_download_through_a_pmtud_black_hole() {
    let (d, clamped, _) = download_through_black_hole(&[], COMPLETES_WITHIN);
    assert!(
        d.complete && d.got.len() == PAYLOAD,
        "the download got {} of {PAYLOAD} bytes (complete: {})",
        d.got.len(),
        d.complete
    );
    assert!(d.got == pattern(PAYLOAD), "the downloaded bytes differ");
    assert!(
        clamped >= 2,
        "tcp_mss_clamped grew by {clamped}: the SYN and the SYN-ACK should be clamped"
    );
    assert!(
        largest_packet(&d.server) <= WAN_MTU,
        "the server sends {}-byte packets (send MSS {}) over a {WAN_MTU}-byte link",
        largest_packet(&d.server),
        d.server.tcpi_snd_mss
    );
}

/// The control: with `--clamp-mss off` nothing is clamped, the server
/// sends 1500-byte packets that the router's 1492-byte `wan0` drops, and
/// the download does not complete within [`STALLS_FOR`]: the server only
/// retransmits them. This is the failure the clamp prevents, and what
/// the previous test would show if the clamp did nothing.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn without_clamping_a_download_stalls_in_a_pmtud_black_hole() {
    let (d, clamped, dropped) = download_through_black_hole(&["--clamp-mss", "off"], STALLS_FOR);
    assert_eq!(clamped, 0, "tcp_mss_clamped grew with --clamp-mss off");
    assert!(
        largest_packet(&d.server) > WAN_MTU,
        "the server's packets ({} bytes) fit the {WAN_MTU}-byte link: no black hole to show",
        largest_packet(&d.server)
    );
    assert!(
        !d.complete && d.got.len() < PAYLOAD,
        "the download completed ({} bytes) through the black hole",
        d.got.len()
    );
    assert!(
        d.server_retrans > 0 && dropped > 0,
        "the stall is not the black hole: the server retransmitted {} segments, wan0 dropped \
         {dropped} frames",
        d.server_retrans
    );
}

/// `status --json`'s recorded MSS clamping setting, and the `status`
/// text's line about it.
fn status_clamp(t: &Topology) -> (String, String) {
    let (v, _) = crate::ctl::status(t);
    let setting = v["record"]["config"]["mss_clamp"]
        .as_str()
        .unwrap_or_else(|| panic!("no record.config.mss_clamp in {v}"))
        .to_owned();
    let text = t.router_ctl_ok(&["status"]);
    let line = text
        .lines()
        .find(|l| l.starts_with("config:"))
        .unwrap_or_default()
        .to_owned();
    (setting, line)
}

/// The setting changes in place: attached with the default (`pmtu`),
/// then `--clamp-mss 1400` replaces the program in place, and `status`
/// says so; the server's send MSS follows the clamped SYN (at most
/// 1400 - 40 = 1360 bytes) and the download completes. An attach that
/// leaves the option out puts the default back, as for `--filtering`.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_configured_mtu_changes_in_place_and_clamps_below_the_path_mtu() {
    let t = Topology::new();
    narrow_wan(&t);
    attach_and_print(&t, &[]);
    let (setting, line) = status_clamp(&t);
    assert_eq!(setting, "pmtu", "{line}");
    assert!(line.contains("MSS clamped to the path MTU"), "{line}");
    let out = crate::ctl::attach(&t, &["--clamp-mss", "1400"]);
    assert!(out.contains("in place"), "not replaced in place: {out}");
    let (setting, line) = status_clamp(&t);
    assert_eq!(setting, "1400", "{line}");
    assert!(
        line.contains("MSS clamped to a path MTU of at most 1400"),
        "{line}"
    );
    let before = t.stats();
    let d = download(&t, COMPLETES_WITHIN);
    let clamped = counter_delta(&before, &t.stats(), "tcp_mss_clamped");
    assert!(clamped >= 2, "tcp_mss_clamped grew by {clamped}");
    assert!(
        d.server.tcpi_snd_mss as usize <= 1400 - HEADERS,
        "the server's send MSS is {}",
        d.server.tcpi_snd_mss
    );
    assert!(
        largest_packet(&d.server) <= 1400,
        "the server sends {}-byte packets",
        largest_packet(&d.server)
    );
    assert!(
        d.complete && d.got == pattern(PAYLOAD),
        "the download got {} of {PAYLOAD} bytes (complete: {})",
        d.got.len(),
        d.complete
    );
    let out = crate::ctl::attach(&t, &[]);
    assert!(out.contains("in place"), "not replaced in place: {out}");
    assert_eq!(status_clamp(&t).0, "pmtu");
}
