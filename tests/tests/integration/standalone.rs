//! Standalone mode (`attach --admit xdp`) made safe, end to end:
//! - no LAN source address ever leaves on the WAN, also for the first
//!   packets of flows towards neighbours the router has not resolved
//!   (they leave translated, with the mapping of the packets after them),
//!   nor inside the kernel's ICMP errors about a flow whose LAN host is
//!   gone;
//! - the kernel slow path (the nftables table attach sets up, for what XDP
//!   passes) and XDP never map two flows to the same WAN tuple;
//! - attach refuses over netfilter forward rules (nftables and
//!   iptables-legacy) unless `--force`, and doctor reports them;
//! - unsolicited WAN -> LAN traffic is dropped and counted, while replies
//!   and port forwards work;
//! - the slow-path table and the LAN sysctls follow attach, replace and
//!   detach exactly, and a refused attach changes neither.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tests::{
    CLIENT_ADDR, LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF, counter_delta,
    socket_addr,
};

use crate::ctl::{
    ATTACH_STANDALONE_BYPASSING, DetachOnDrop, attach, attach_and_print, ctl_env, read_until,
    stderr,
};

const IO: Duration = Duration::from_secs(3);
const LAN_PREFIX: [u8; 3] = [192, 168, 50];

/// An `AF_PACKET` socket on one interface of a namespace: every IPv4
/// packet that crosses it (in or out), as the wire carries it.
struct Capture(OwnedFd);

/// What a captured packet says about its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    /// Source port (TCP/UDP) or echo identifier; 0 for fragments after
    /// the first and other protocols.
    sport: u16,
}

impl Capture {
    fn start(t: &Topology, ns: Ns, dev: &str) -> Self {
        let ifindex = t.ifindex(ns, dev);
        t.in_ns(ns, || {
            let fd = tests::packet::packet_socket(
                ifindex,
                libc::ETH_P_IP as u16,
                tests::packet::Framing::Packet,
                true,
            )
            .expect("AF_PACKET socket on the capture interface");
            Self(fd)
        })
    }

    /// Every packet captured since the last call, as it was.
    fn drain_packets(&self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            // SAFETY: valid buffer.
            let n =
                unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            let Ok(n) = usize::try_from(n) else {
                return out;
            };
            out.push(buf[..n].to_vec());
        }
    }

    /// Every packet captured since the last call.
    fn drain(&self) -> Vec<Seen> {
        let mut out = Vec::new();
        for p in self.drain_packets() {
            let (p, n) = (&p[..], p.len());
            if n < 20 {
                continue;
            }
            let ihl = usize::from(p[0] & 0x0f) * 4;
            let first_fragment = u16::from_be_bytes([p[6], p[7]]).trailing_zeros() >= 13;
            let proto = p[9];
            let sport = match proto {
                6 | 17 if first_fragment && n >= ihl + 2 => {
                    u16::from_be_bytes([p[ihl], p[ihl + 1]])
                }
                1 if first_fragment && n >= ihl + 6 => u16::from_be_bytes([p[ihl + 4], p[ihl + 5]]),
                _ => 0,
            };
            out.push(Seen {
                src: Ipv4Addr::new(p[12], p[13], p[14], p[15]),
                dst: Ipv4Addr::new(p[16], p[17], p[18], p[19]),
                proto,
                sport,
            });
        }
        out
    }

    /// The ICMP errors (destination unreachable, source quench, redirect,
    /// time exceeded, parameter problem) captured since the last call.
    fn drain_icmp_errors(&self) -> Vec<IcmpError> {
        self.drain_packets()
            .iter()
            .filter_map(|p| IcmpError::parse(p))
            .collect()
    }
}

/// An ICMP error as captured: who sent it, its type and code, and the
/// addresses and ports of the packet it quotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IcmpError {
    src: Ipv4Addr,
    kind: u8,
    code: u8,
    quoted_src: SocketAddr,
    quoted_dst: SocketAddr,
}

impl IcmpError {
    fn parse(p: &[u8]) -> Option<Self> {
        let ihl = usize::from(*p.first()? & 0x0f) * 4;
        let icmp = p.get(ihl..).filter(|_| p.get(9) == Some(&1))?;
        if !matches!(icmp.first()?, 3 | 4 | 5 | 11 | 12) {
            return None;
        }
        let quoted = icmp.get(8..)?;
        let qihl = usize::from(*quoted.first()? & 0x0f) * 4;
        let ports = quoted.get(qihl..qihl + 4)?;
        let addr = |at: usize, port: &[u8]| {
            SocketAddr::new(
                IpAddr::V4(Ipv4Addr::new(
                    quoted[at],
                    quoted[at + 1],
                    quoted[at + 2],
                    quoted[at + 3],
                )),
                u16::from_be_bytes([port[0], port[1]]),
            )
        };
        quoted.get(..20)?;
        Some(Self {
            src: Ipv4Addr::new(p[12], p[13], p[14], p[15]),
            kind: icmp[0],
            code: icmp[1],
            quoted_src: addr(12, &ports[..2]),
            quoted_dst: addr(16, &ports[2..]),
        })
    }

    fn quotes_a_lan_address(&self) -> bool {
        [self.quoted_src, self.quoted_dst]
            .iter()
            .any(|a| matches!(a.ip(), IpAddr::V4(v4) if in_lan(v4)))
    }
}

fn in_lan(a: Ipv4Addr) -> bool {
    a.octets()[..3] == LAN_PREFIX
}

/// A UDP echo server in the server namespace that records the source of
/// every datagram, until stopped.
struct UdpEcho {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<(SocketAddr, usize)>>>,
}

impl UdpEcho {
    fn start(t: &Topology, addr: SocketAddr) -> Self {
        let sock = t.in_ns(Ns::Server, || UdpSocket::bind(addr).expect("bind echo"));
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 65536];
            let deadline = Instant::now() + Duration::from_mins(2);
            while !flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                if let Ok((n, peer)) = sock.recv_from(&mut buf) {
                    seen.push((peer, n));
                    let _ = sock.send_to(&buf[..n], peer);
                }
            }
            seen
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<(SocketAddr, usize)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// Sends `payload` on `sock` and waits for its echo; the round-trip time.
fn echo_once(sock: &UdpSocket, payload: &[u8]) -> Option<Duration> {
    let t0 = Instant::now();
    sock.send(payload).unwrap();
    let mut buf = vec![0u8; 65536];
    match sock.recv(&mut buf) {
        Ok(n) if buf[..n] == *payload => Some(t0.elapsed()),
        _ => None,
    }
}

fn client_udp(t: &Topology, port: u16, dst: SocketAddr) -> UdpSocket {
    let s = t.in_ns(Ns::Client, || {
        UdpSocket::bind(socket_addr(Ipv4Addr::UNSPECIFIED, port)).unwrap()
    });
    s.connect(dst).unwrap();
    s.set_read_timeout(Some(IO)).unwrap();
    s
}

fn flush_wan_neighbours(t: &Topology) {
    t.exec_ok(Ns::Router, &["ip", "neigh", "flush", "dev", WAN_IF]);
}

/// UDP flows of the no-LAN-source test.
const FLOWS: u16 = 5;

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Flows started towards an unresolved next hop (the router's WAN
/// neighbours flushed before each): UDP, TCP and ping. A packet socket on
/// the server's interface sees every packet; none carries a LAN source
/// address, and each flow's first datagram arrives with the mapping of the
/// ones after it. Prints the first datagram's round trip (through the
/// kernel, which resolves the neighbour) against the later ones (XDP).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn no_lan_source_address_leaves_on_the_wan() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let cap = Capture::start(&t, Ns::Server, "eth0");
    let echo = UdpEcho::start(&t, socket_addr(SERVER_ADDR, 5300));
    let before = t.stats();
    let (mut first_rtt, mut later_rtt) = (Vec::new(), Vec::new());
    for i in 0..FLOWS {
        flush_wan_neighbours(&t);
        let sock = client_udp(&t, 42000 + i, socket_addr(SERVER_ADDR, 5300));
        for n in 0..3 {
            let rtt = echo_once(&sock, format!("flow {i} datagram {n}").as_bytes())
                .unwrap_or_else(|| panic!("flow {i}: datagram {n} not echoed"));
            if n == 0 {
                first_rtt.push(micros(rtt));
            } else {
                later_rtt.push(micros(rtt));
            }
        }
    }
    // TCP: the SYN is the first packet.
    let listener = t.in_ns(Ns::Server, || {
        TcpListener::bind(socket_addr(SERVER_ADDR, 5301)).unwrap()
    });
    for i in 0..3 {
        flush_wan_neighbours(&t);
        let c = t.in_ns(Ns::Client, || {
            TcpStream::connect_timeout(&socket_addr(SERVER_ADDR, 5301), IO)
        });
        assert!(c.is_ok(), "TCP connection {i}: {c:?}");
        let (_s, peer) = tests::echo::accept_within(&listener, IO).unwrap();
        assert_eq!(
            peer.ip(),
            IpAddr::V4(ROUTER_WAN_ADDR),
            "TCP {i} from {peer}"
        );
    }
    // Ping: the echo request is the first packet.
    for _ in 0..2 {
        flush_wan_neighbours(&t);
        assert!(t.ping(Ns::Client, SERVER_ADDR, 1), "ping");
    }
    std::thread::sleep(Duration::from_millis(200));
    let seen = cap.drain();
    let after = t.stats();
    let got = echo.finish();

    let leaked: Vec<&Seen> = seen.iter().filter(|s| in_lan(s.src)).collect();
    assert!(
        leaked.is_empty(),
        "LAN source addresses on the WAN: {leaked:?}"
    );
    // Each UDP flow: all three datagrams from the same WAN tuple (the
    // source port is preserved: it is inside XDP's range).
    for i in 0..FLOWS {
        let port = 42000 + i;
        let peers: Vec<SocketAddr> = got
            .iter()
            .filter(|(p, _)| p.port() == port)
            .map(|(p, _)| *p)
            .collect();
        assert_eq!(
            peers,
            vec![socket_addr(ROUTER_WAN_ADDR, port); 3],
            "flow {i}: {got:?}"
        );
    }
    assert_eq!(got.len(), usize::from(FLOWS) * 3, "{got:?}");
    let to_server = seen
        .iter()
        .filter(|s| s.dst == SERVER_ADDR && s.proto != 0)
        .count();
    assert!(
        to_server >= usize::from(FLOWS) * 3 + 3 + 2,
        "captured {seen:?}"
    );
    // The first packets did take the no-neighbour path.
    let passed = counter_delta(&before, &after, "pass_no_neighbour");
    assert!(
        passed >= u64::from(FLOWS) + 3 + 2,
        "pass_no_neighbour +{passed}: the neighbour flush did not reach the data path"
    );
    let avg = |v: &[f64]| v.iter().sum::<f64>() / f64::from(u32::try_from(v.len()).unwrap());
    println!(
        "first datagram of a flow, next hop unresolved (kernel forwards, resolves ARP): {:.0} us \
         round trip on average {first_rtt:.0?}; later datagrams (XDP): {:.0} us",
        avg(&first_rtt),
        avg(&later_rtt)
    );
}

/// WAN frames the kernel takes although they are not plain frames to the
/// WAN interface's MAC, each carrying a UDP datagram to a LAN host: one
/// with a priority tag (802.1Q, VLAN id 0: the kernel strips it and takes
/// the packet as untagged), one to the MAC of a macvlan on the WAN (what
/// keepalived `use_vmac` makes; this router no VRRP master, so the data
/// path does not accept the MAC). The kernel forwards both to the LAN
/// host, which offload mode without firewall rules shows (the kernel
/// decides there); standalone mode drops them as it drops untagged ones
/// to its own MAC (`drop_unsolicited`), so the host neither gets them nor
/// answers with a flow that would let the sender in.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn tagged_frames_and_frames_to_a_macvlan_do_not_open_the_way_in() {
    use tests::addr::HOST_IF;
    use tests::frames::{Frame, Ipv4, Udp};
    const MACVLAN_MAC: [u8; 6] = [0x00, 0x00, 0x5e, 0x00, 0x01, 0x33];
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    attach_and_print(&t, &[]);
    t.exec_ok(
        Ns::Router,
        &[
            "ip",
            "link",
            "add",
            "link",
            WAN_IF,
            "name",
            "vrrp.51",
            "address",
            "00:00:5e:00:01:33",
            "type",
            "macvlan",
            "mode",
            "private",
        ],
    );
    t.exec_ok(Ns::Router, &["ip", "link", "set", "vrrp.51", "up"]);
    let client = t.in_ns(Ns::Client, || {
        UdpSocket::bind(socket_addr(CLIENT_ADDR, 5320)).unwrap()
    });
    client
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let (server_mac, router_mac) = (t.mac(Ns::Server, HOST_IF), t.mac(Ns::Router, WAN_IF));
    let eth0 = t.ifindex(Ns::Server, HOST_IF);
    let send = |tagged: bool, payload: &[u8]| {
        let ip = Ipv4::new(
            SERVER_ADDR.octets(),
            CLIENT_ADDR.octets(),
            Udp::new(4000, 5320, payload),
        );
        let frame = if tagged {
            tests::frames::with_tags(
                &Frame::new(router_mac, server_mac, ip).bytes(),
                &[(0x8100, 0)],
            )
        } else {
            Frame::new(MACVLAN_MAC, server_mac, ip).bytes()
        };
        t.in_ns(Ns::Server, || {
            tests::packet::send_frame(eth0, &frame).expect("sending a raw frame");
        });
    };
    let mut buf = [0u8; 256];
    for (tagged, what) in [(true, "priority-tagged"), (false, "to the macvlan's MAC")] {
        let before = t.stats();
        send(tagged, what.as_bytes());
        let got = client.recv(&mut buf);
        let after = t.stats();
        assert!(
            got.is_err(),
            "a datagram {what} reached the LAN host: {:?}",
            got.map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
        );
        assert_eq!(
            counter_delta(&before, &after, "drop_unsolicited"),
            1,
            "{what}"
        );
    }

    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for (tagged, what) in [(true, "priority-tagged"), (false, "to the macvlan's MAC")] {
        send(tagged, what.as_bytes());
        let n = client.recv(&mut buf).unwrap_or_else(|e| {
            panic!("the kernel forwards a datagram {what} (the test's premise): {e}")
        });
        assert_eq!(&buf[..n], what.as_bytes());
    }
}

/// A UDP flow whose packets come priority-tagged (802.1Q, VLAN id 0), as
/// some access networks and hosts' priority settings send them: the server's
/// tagged reply reaches the LAN socket, and the client's tagged datagram
/// reaches the server from the flow's own WAN port (RFC 4787 REQ-1), both
/// carried by XDP. Passed as they came, the kernel (standalone: no
/// conntrack entry of the flow) answered the reply with a port
/// unreachable and sent the datagram out through its own NAT, with
/// another port.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_flows_priority_tagged_packets_stay_in_the_flow() {
    use tests::addr::HOST_IF;
    use tests::frames::{Frame, Ipv4, Udp};
    const PRIORITY: &[(u16, u16)] = &[(0x8100, 0xa000)];
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    t.warm_neighbours();
    attach_and_print(&t, &[]);
    let server = t.in_ns(Ns::Server, || {
        UdpSocket::bind(socket_addr(SERVER_ADDR, 4100)).unwrap()
    });
    server.set_read_timeout(Some(IO)).unwrap();
    let client = t.in_ns(Ns::Client, || {
        UdpSocket::bind(socket_addr(CLIENT_ADDR, 5330)).unwrap()
    });
    client.set_read_timeout(Some(IO)).unwrap();
    let mut buf = [0u8; 256];
    client
        .send_to(b"open", socket_addr(SERVER_ADDR, 4100))
        .unwrap();
    let (_, mapped) = server
        .recv_from(&mut buf)
        .expect("the flow's first datagram");
    assert_eq!(mapped.ip(), IpAddr::V4(ROUTER_WAN_ADDR));

    let tagged = |from: Ns, to_mac: [u8; 6], ip: Ipv4| {
        let frame = Frame::new(to_mac, t.mac(from, HOST_IF), ip).bytes();
        let frame = tests::frames::with_tags(&frame, PRIORITY);
        let ifindex = t.ifindex(from, HOST_IF);
        t.in_ns(from, || {
            tests::packet::send_frame(ifindex, &frame).expect("sending a raw frame");
        });
    };
    let before = t.stats();
    tagged(
        Ns::Server,
        t.mac(Ns::Router, WAN_IF),
        Ipv4::new(
            SERVER_ADDR.octets(),
            ROUTER_WAN_ADDR.octets(),
            Udp::new(4100, mapped.port(), b"tagged reply"),
        ),
    );
    let n = client
        .recv(&mut buf)
        .expect("the tagged reply reached the LAN socket");
    assert_eq!(&buf[..n], b"tagged reply");
    tagged(
        Ns::Client,
        t.mac(Ns::Router, LAN_IF),
        Ipv4::new(
            CLIENT_ADDR.octets(),
            SERVER_ADDR.octets(),
            Udp::new(5330, 4100, b"tagged datagram"),
        ),
    );
    let (n, from) = server
        .recv_from(&mut buf)
        .expect("the tagged datagram reached the server");
    assert_eq!(
        (&buf[..n], from),
        (&b"tagged datagram"[..], mapped),
        "the flow's mapping"
    );
    let after = t.stats();
    assert_eq!(
        (
            counter_delta(&before, &after, "fwd_inbound"),
            counter_delta(&before, &after, "fwd_outbound")
        ),
        (1, 1),
        "carried by XDP"
    );
}

/// Two LAN sockets, two paths, one mapping each. A 3000-byte datagram as
/// a socket's first is fragmented by the client, and a fragment opens no
/// XDP flow: it goes through the kernel's slow path, whose NAT would keep
/// the same source port, and so the same WAN tuple as an XDP flow, if its
/// ports were not disjoint from XDP's: with the table attach sets up it
/// gets a port of its own range. The socket's later datagrams, small ones
/// too, stay on the kernel's path with that port (RFC 4787 REQ-11: the
/// mapping does not change mid-session; `pass_kernel_flow`), also across a
/// live replace. A socket whose
/// first datagram is small opens an XDP flow, and its fragmented datagrams
/// go through XDP both ways with the flow's port (RFC 4787 REQ-14): the
/// client's fragments out, the server's fragmented echo back. Every
/// datagram is answered.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn kernel_slow_path_and_xdp_never_share_a_wan_tuple() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    let echo = UdpEcho::start(&t, socket_addr(SERVER_ADDR, 5302));
    let big = vec![0x5a; 3000];
    let before = t.stats();
    let slow = client_udp(&t, 43000, socket_addr(SERVER_ADDR, 5302));
    assert!(
        echo_once(&slow, &big).is_some(),
        "fragmented datagram, no flow yet"
    );
    let kernel_path = t.stats();
    // A live replace (another filtering setting) in between: the flow
    // stays the kernel's (`KERNEL_FLOWS` is pinned, so it is kept).
    let out = crate::ctl::attach(&t, &["--filtering", "endpoint-independent"]);
    assert!(out.contains("replaced"), "{out}");
    assert!(echo_once(&slow, b"small 1").is_some(), "small datagram");
    let slow_small = t.stats();
    assert!(
        echo_once(&slow, &big).is_some(),
        "fragmented datagram again"
    );
    let fast = client_udp(&t, 43001, socket_addr(SERVER_ADDR, 5302));
    assert!(echo_once(&fast, b"fast 1").is_some(), "small datagram");
    let xdp_before = t.stats();
    assert!(
        echo_once(&fast, &big).is_some(),
        "fragmented datagram of the XDP flow, echoed whole"
    );
    let xdp_after = t.stats();
    let got = echo.finish();
    println!("server saw {got:?}");
    let seen_as = |len: usize| -> Vec<SocketAddr> {
        got.iter()
            .filter(|(_, n)| *n == len)
            .map(|(p, _)| *p)
            .collect()
    };
    let large = seen_as(3000);
    assert_eq!(large.len(), 3, "{got:?}");
    let kernels = large[0];
    assert_eq!(kernels.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
    assert!(
        (61000..=65535).contains(&kernels.port()),
        "the kernel path mapped to {kernels}: not its own port range"
    );
    assert_eq!(
        seen_as(7),
        vec![kernels],
        "the slow-path flow's small datagram left with another mapping: {got:?}"
    );
    assert_eq!(large[1], kernels, "{got:?}");
    let flow = socket_addr(ROUTER_WAN_ADDR, 43001);
    assert_eq!(seen_as(6), vec![flow], "{got:?}");
    assert_eq!(large[2], flow, "the XDP flow's fragments left on its port");
    // The first datagram's fragments (3 each way at MTU 1500) went to the
    // kernel, and so did the next one of that socket; the other socket's
    // went through XDP, both ways.
    assert!(counter_delta(&before, &kernel_path, "pass_fragment") >= 6);
    assert_eq!(counter_delta(&before, &kernel_path, "fwd_fragment"), 0);
    assert_eq!(
        counter_delta(&kernel_path, &slow_small, "pass_kernel_flow"),
        1
    );
    assert_eq!(counter_delta(&kernel_path, &slow_small, "fwd_outbound"), 0);
    assert_eq!(counter_delta(&xdp_before, &xdp_after, "fwd_fragment"), 6);
    assert_eq!(counter_delta(&xdp_before, &xdp_after, "pass_fragment"), 0);
    // XDP's table holds only its own flow's tuple.
    let xlat: Vec<String> = t
        .conntrack()
        .iter()
        .map(|f| f["xlat_src"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(xlat, vec![flow.to_string()], "{xlat:?}");
}

/// Asserts that a standalone attach over the firewall chain `needle` is
/// refused (naming it and the fix), changes nothing and that doctor reports
/// it; `--force` is refused too; `--bypass-forward-rules` attaches (and is
/// detached again).
fn refuses_standalone_over(t: &Topology, what: &str, needle: &str) {
    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp"]);
    let e = stderr(&o);
    assert!(!o.status.success(), "{what}: attached over forward rules");
    for n in [needle, "--admit kernel", "--bypass-forward-rules"] {
        assert!(e.contains(n), "{what}: {n:?} not in {e}");
    }
    assert!(!t.router_attached(), "{what}: pins left");
    let tables = t.exec_ok(Ns::Router, &["nft", "list", "tables"]);
    assert!(!tables.contains("xdp_router"), "{what}: {tables}");
    let d = t.router_ctl(&["doctor", LAN_IF, WAN_IF]);
    let out = String::from_utf8_lossy(&d.stdout).into_owned();
    assert!(
        out.contains("forward-rules") && out.contains(needle) && out.contains("--admit kernel"),
        "{what}: doctor says {out}"
    );
    // `--force` (for another XDP program, a veth peer) is not the
    // firewall's answer.
    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "xdp", "--force"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(78), "{what}: {e}");
    assert!(e.contains("--bypass-forward-rules"), "{what}: {e}");
    assert!(!t.router_attached(), "{what}: pins left");
    let o = t.router_ctl(&ATTACH_STANDALONE_BYPASSING);
    let (out, e) = (String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(
        o.status.success() && out.contains("attached"),
        "{what}: {out}{e}"
    );
    // Forced, it says what it does, not what to pass.
    assert!(
        e.contains("bypassing the router's netfilter forward rules, as asked")
            && !e.contains("pass --bypass-forward-rules"),
        "{what}: {e}"
    );
    // What the router cannot do in place is said first (it needs a
    // detach), not hidden behind the forward rules.
    let o = t.router_ctl(&[
        "attach",
        LAN_IF,
        WAN_IF,
        "--admit",
        "xdp",
        "--max-flows",
        "1000",
    ]);
    let e = stderr(&o);
    assert!(
        e.contains("cannot be resized while attached") && !e.contains("would bypass"),
        "{what}: {e}"
    );
    t.router_ctl_ok(&["detach"]);
}

/// nftables forward chains with policy drop (IPv4 and IPv6), then
/// iptables-legacy and ip6tables-legacy FORWARD rules, then an nftables
/// prerouting filter chain's and a legacy raw PREROUTING drop (XDP admits
/// a flow before those hooks too): standalone attach
/// refuses (naming the chain and the fix), changes nothing, doctor reports
/// the chain; `--force` (another XDP program's answer) is refused too,
/// `--bypass-forward-rules` attaches; offload mode attaches without
/// complaint and doctor finds the rules in charge.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn attach_refuses_over_forward_rules_unless_told_to_bypass_them() {
    let t = Topology::new();
    t.warm_neighbours();

    t.exec_ok(Ns::Router, &["nft", "add", "table", "inet", "fw"]);
    t.exec_ok(
        Ns::Router,
        &[
            "nft",
            "add chain inet fw forward { type filter hook forward priority 0; policy drop; }",
        ],
    );
    refuses_standalone_over(&t, "nftables", "table inet fw chain forward");
    t.exec_ok(Ns::Router, &["nft", "delete", "table", "inet", "fw"]);
    // Standalone mode admits IPv6 flows itself: an IPv6-only firewall
    // counts as much.
    t.exec_ok(Ns::Router, &["nft", "add", "table", "ip6", "fw6"]);
    t.exec_ok(
        Ns::Router,
        &[
            "nft",
            "add chain ip6 fw6 forward { type filter hook forward priority 0; policy drop; }",
        ],
    );
    refuses_standalone_over(&t, "nftables ip6", "table ip6 fw6 chain forward");
    t.exec_ok(Ns::Router, &["nft", "delete", "table", "ip6", "fw6"]);
    for tool in ["ip6tables-legacy", "iptables-legacy"] {
        t.exec_ok(
            Ns::Router,
            &[tool, "-A", "FORWARD", "-i", LAN_IF, "-j", "ACCEPT"],
        );
        refuses_standalone_over(&t, tool, &format!("{tool} table filter chain FORWARD"));
        if tool == "ip6tables-legacy" {
            t.exec_ok(Ns::Router, &[tool, "-F", "FORWARD"]);
        }
    }
    // Offload mode keeps the firewall in charge: nothing to refuse, and
    // doctor does not warn of it.
    t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let d = t.router_ctl_ok(&["doctor", LAN_IF, WAN_IF]);
    let line = d
        .lines()
        .find(|l| l.contains("forward-rules"))
        .unwrap_or_else(|| panic!("no forward-rules check: {d}"));
    assert!(
        line.contains("[ok]") && line.contains("in charge"),
        "offload mode: {line}"
    );
    t.router_ctl_ok(&["detach"]);
    t.exec_ok(Ns::Router, &["iptables-legacy", "-F", "FORWARD"]);
    // Prerouting filter chains (raw, mangle: blocklists, parental blocks)
    // see no packet of a flow XDP admits either.
    t.exec_ok(Ns::Router, &["nft", "add", "table", "inet", "blk"]);
    t.exec_ok(
        Ns::Router,
        &[
            "nft",
            "add chain inet blk pre { type filter hook prerouting priority -150; policy accept; }",
        ],
    );
    t.exec_ok(
        Ns::Router,
        &["nft", "add rule inet blk pre ip saddr 192.168.50.3 drop"],
    );
    refuses_standalone_over(
        &t,
        "nftables prerouting",
        "table inet blk chain pre (hook prerouting)",
    );
    t.exec_ok(Ns::Router, &["nft", "delete", "table", "inet", "blk"]);
    t.exec_ok(
        Ns::Router,
        &[
            "iptables-legacy",
            "-t",
            "raw",
            "-A",
            "PREROUTING",
            "-s",
            "192.168.50.3",
            "-j",
            "DROP",
        ],
    );
    refuses_standalone_over(
        &t,
        "iptables-legacy raw",
        "iptables-legacy table raw chain PREROUTING",
    );
    t.exec_ok(
        Ns::Router,
        &["iptables-legacy", "-t", "raw", "-F", "PREROUTING"],
    );
    // No forward rules: doctor says so.
    let d = t.router_ctl_ok(&["doctor", LAN_IF, WAN_IF]);
    assert!(
        d.contains("no forward, prerouting or postrouting filter rules"),
        "{d}"
    );
}

/// A firewall turned on after a standalone attach that found none (a
/// forward chain with policy drop): the fast path bypasses it, and the
/// owner is told: `status` is degraded (exit 1) and names the chain and
/// the fix, doctor says BYPASSED, the daemon logs it and its status says
/// it (which the status page lists). An attach again with
/// `--bypass-forward-rules` (same configuration, nothing replaced) records
/// the owner's answer: status healthy again, until a rule is added to the
/// chain it accepted (reported again, with the new rule count).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_firewall_added_after_a_standalone_attach_is_reported_bypassed() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    attach_and_print(&t, &[]);
    assert_eq!(crate::ctl::status(&t).1, 0);
    t.exec_ok(Ns::Router, &["nft", "add", "table", "inet", "fw"]);
    t.exec_ok(
        Ns::Router,
        &[
            "nft",
            "add chain inet fw forward { type filter hook forward priority 0; policy drop; }",
        ],
    );
    // A blocklist, as routers keep them: the ruleset is read terse (`nft
    // -t`, without the set's elements), its rule still counts.
    t.exec_ok(
        Ns::Router,
        &[
            "nft",
            "add set inet fw blocklist { type ipv4_addr; elements = { 203.0.113.7, 203.0.113.9 }; }",
        ],
    );
    t.exec_ok(
        Ns::Router,
        &["nft", "add rule inet fw forward ip saddr @blocklist drop"],
    );
    let (v, code) = crate::ctl::status(&t);
    let problems = v["problems"].to_string();
    assert_eq!((v["state"].as_str(), code), (Some("degraded"), 1), "{v}");
    for needle in [
        "BYPASSED",
        "table inet fw chain forward (policy drop, 1 rule)",
        "--admit kernel",
        "--bypass-forward-rules",
    ] {
        assert!(problems.contains(needle), "{needle}: {problems}");
    }
    let d = t.router_ctl(&["doctor", LAN_IF, WAN_IF]);
    let out = String::from_utf8_lossy(&d.stdout).into_owned();
    assert!(
        out.lines()
            .any(|l| l.contains("forward-rules") && l.contains("BYPASSED")),
        "{out}"
    );
    let daemon = crate::offload::Daemon::start(&t, &[]);
    crate::ctl::wait_for_or_show(
        "the daemon to report the bypassed forward rules",
        Duration::from_secs(10),
        || {
            crate::ctl::status(&t).0["daemon"]["forward_rules_bypassed"]
                .as_str()
                .is_some_and(|p| p.contains("table inet fw chain forward"))
        },
        || format!("{}\n{}", crate::ctl::status(&t).0, daemon.log()),
    );
    assert!(daemon.log().contains("BYPASSED"), "{}", daemon.log());
    // The owner accepts the bypass.
    let o = t.router_ctl(&ATTACH_STANDALONE_BYPASSING);
    assert!(o.status.success(), "{}", stderr(&o));
    let (v, code) = crate::ctl::status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("attached"), 0), "{v}");
    // The bypass accepted the chain as it was: a rule more is reported.
    t.exec_ok(
        Ns::Router,
        &["nft", "add rule inet fw forward tcp dport 25 drop"],
    );
    let (v, code) = crate::ctl::status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("degraded"), 1), "{v}");
    let problems = v["problems"].to_string();
    assert!(
        problems.contains("table inet fw chain forward (policy drop, 2 rules)"),
        "{problems}"
    );
}

/// The server routes the LAN prefix via the router: unsolicited UDP, TCP
/// SYNs and pings to a LAN host are dropped by XDP and counted, nothing
/// reaches the host and the kernel forwards none of it; a port forward
/// and replies of flows the LAN opened still work.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn unsolicited_wan_traffic_is_dropped_while_replies_and_forwards_work() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    t.route_back();
    t.router_ctl_ok(&["forward", "add", "udp", "7000", "192.168.50.2:7777"]);
    let udp = t.in_ns(Ns::Client, || {
        UdpSocket::bind(socket_addr(CLIENT_ADDR, 7777)).unwrap()
    });
    udp.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let tcp = t.in_ns(Ns::Client, || {
        TcpListener::bind(socket_addr(CLIENT_ADDR, 2222)).unwrap()
    });
    tcp.set_nonblocking(true).unwrap();
    let before = t.stats();
    let fwd0 = t.nstat(Ns::Router, "IpForwDatagrams");
    t.in_ns(Ns::Server, || {
        let s = UdpSocket::bind(socket_addr(SERVER_ADDR, 0)).unwrap();
        for _ in 0..3 {
            s.send_to(b"unsolicited", socket_addr(CLIENT_ADDR, 7777))
                .unwrap();
        }
        let r = TcpStream::connect_timeout(
            &socket_addr(CLIENT_ADDR, 2222),
            Duration::from_millis(1500),
        );
        assert!(r.is_err(), "TCP connection to a LAN host from the WAN");
    });
    assert!(
        !t.ping(Ns::Server, CLIENT_ADDR, 1),
        "ping reached a LAN host"
    );
    let mut buf = [0u8; 64];
    assert!(
        udp.recv_from(&mut buf).is_err(),
        "unsolicited datagram arrived"
    );
    assert_eq!(
        tcp.accept().map_err(|e| e.kind()).err(),
        Some(ErrorKind::WouldBlock),
        "a TCP connection was accepted"
    );
    let after = t.stats();
    let dropped = counter_delta(&before, &after, "drop_unsolicited");
    // Three datagrams, at least one SYN, one ping.
    assert!(dropped >= 5, "drop_unsolicited +{dropped}");
    assert_eq!(
        t.nstat(Ns::Router, "IpForwDatagrams") - fwd0,
        0,
        "the kernel forwarded unsolicited packets"
    );

    // The port forward.
    t.in_ns(Ns::Server, || {
        let s = UdpSocket::bind(socket_addr(SERVER_ADDR, 0)).unwrap();
        s.send_to(b"forwarded", socket_addr(ROUTER_WAN_ADDR, 7000))
            .unwrap();
    });
    let (n, peer) = udp.recv_from(&mut buf).expect("port forward");
    assert_eq!(&buf[..n], b"forwarded");
    assert_eq!(peer.ip(), IpAddr::V4(SERVER_ADDR));
    // Replies of LAN flows.
    let p = t.udp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5303));
    assert_eq!(p.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
    let p = t.tcp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5304));
    assert_eq!(p.ip(), IpAddr::V4(ROUTER_WAN_ADDR));
}

fn sysctl(t: &Topology, name: &str) -> String {
    t.exec_ok(Ns::Router, &["sysctl", "-n", name])
        .trim()
        .to_owned()
}

fn slow_path_table(t: &Topology) -> Option<String> {
    let o = t.exec(Ns::Router, &["nft", "list", "table", "ip", "xdp_router"]);
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// attach sets up the slow-path table and the LAN sysctls (idempotently:
/// again changes nothing, one table), a replace with other kernel ports
/// updates the table, overlapping ranges are refused, `--no-kernel-nat`
/// removes the table, detach removes it, restores the sysctls' values and
/// says that nothing filters or translates between LAN and WAN any more.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn slow_path_table_and_sysctls_follow_attach_and_detach() {
    let t = Topology::new();
    let accept_local = format!("net.ipv4.conf.{LAN_IF}.accept_local");
    let rp_filter = format!("net.ipv4.conf.{LAN_IF}.rp_filter");
    t.exec_ok(Ns::Router, &["sysctl", "-qw", &format!("{rp_filter}=1")]);
    let old_accept_local = sysctl(&t, &accept_local);
    assert_eq!(slow_path_table(&t), None);

    // Without nft (not on PATH) a clear error, and nothing changed: the
    // firewall's forward rules cannot be read (refused unless forced),
    // and forced, the slow-path table cannot be made.
    t.warm_neighbours();
    for (force, needle) in [
        (None, "forward rules could not all be checked"),
        (Some("--bypass-forward-rules"), "--no-kernel-nat"),
    ] {
        let mut args = vec!["attach", LAN_IF, WAN_IF, "--admit", "xdp"];
        args.extend(force);
        let o = ctl_env(&t, &[("PATH", "/usr/bin:/bin")], &args);
        let e = stderr(&o);
        assert!(!o.status.success(), "attached without nft ({force:?})");
        // Refused for the firewall: trying again changes nothing (78).
        if force.is_none() {
            assert_eq!(o.status.code(), Some(78), "{}", stderr(&o));
        }
        assert!(
            e.contains("`nft` not found") && e.contains("apt-get install nftables"),
            "{e}"
        );
        assert!(e.contains(needle), "{needle:?} not in {e}");
        assert!(!t.router_attached());
        assert_eq!(sysctl(&t, &accept_local), old_accept_local);
        assert_eq!(sysctl(&t, &rp_filter), "1");
    }

    let out = attach(&t, &[]);
    assert!(
        out.contains("kernel slow-path NAT ports 61000-65535"),
        "{out}"
    );
    let table = slow_path_table(&t).expect("slow-path table");
    assert!(
        table.contains(&format!(
            "iifname \"{LAN_IF}\" oifname \"{WAN_IF}\" ip saddr != {ROUTER_WAN_ADDR}"
        )) && table.contains(&format!("snat to {ROUTER_WAN_ADDR}:61000-65535")),
        "{table}"
    );
    assert_eq!(sysctl(&t, &accept_local), "1");
    assert_eq!(sysctl(&t, &rp_filter), "2");

    let out = attach(&t, &[]);
    assert!(out.contains("nothing changed"), "{out}");
    let tables = t.exec_ok(Ns::Router, &["nft", "list", "tables"]);
    assert_eq!(tables.matches("xdp_router").count(), 1, "{tables}");
    assert_eq!(slow_path_table(&t).unwrap(), table, "table changed");

    let out = attach(&t, &["--kernel-nat-ports", "62000-62999"]);
    assert!(out.contains("replaced"), "{out}");
    let table = slow_path_table(&t).unwrap();
    assert!(table.contains(":62000-62999"), "{table}");
    assert!(!table.contains(":61000-65535"), "{table}");

    let o = t.router_ctl(&[
        "attach",
        LAN_IF,
        WAN_IF,
        "--admit",
        "xdp",
        "--port-range",
        "1024-65535",
    ]);
    let e = stderr(&o);
    assert!(!o.status.success());
    assert!(
        e.contains("overlap") && e.contains("--no-kernel-nat"),
        "{e}"
    );
    assert!(
        slow_path_table(&t).is_some(),
        "a refused attach changed the table"
    );

    attach(&t, &["--no-kernel-nat"]);
    assert_eq!(slow_path_table(&t), None, "--no-kernel-nat left the table");
    assert_eq!(sysctl(&t, &accept_local), "1");
    attach(&t, &[]);
    assert!(slow_path_table(&t).is_some());

    let o = t.router_ctl(&["detach"]);
    let (out, e) = (crate::ctl::stdout(&o), stderr(&o));
    assert!(o.status.success() && out.contains("restored"), "{out}{e}");
    // With the topology's forwarding on, nothing filters or translates
    // between the LAN and the WAN any more: said.
    assert!(
        e.contains("standalone mode was this router's NAT and its only filter"),
        "{e}"
    );
    assert_eq!(slow_path_table(&t), None, "detach left the table");
    assert_eq!(sysctl(&t, &accept_local), old_accept_local);
    assert_eq!(sysctl(&t, &rp_filter), "1");
}

/// A replace the running router refuses (here: another table size) leaves
/// standalone mode's kernel side as it was: the slow-path table keeps its
/// ports, the LAN's sysctls their values; and an offload router that is
/// refused a switch to standalone mode gets no table and no sysctl.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_refused_replace_leaves_the_kernel_side_as_it_was() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    let accept_local = format!("net.ipv4.conf.{LAN_IF}.accept_local");
    let rp_filter = format!("net.ipv4.conf.{LAN_IF}.rp_filter");
    t.exec_ok(Ns::Router, &["sysctl", "-qw", &format!("{rp_filter}=1")]);
    let old_accept_local = sysctl(&t, &accept_local);
    let refused = |extra: &[&str]| {
        let mut args = vec!["attach", LAN_IF, WAN_IF];
        args.extend_from_slice(extra);
        let o = t.router_ctl(&args);
        let e = stderr(&o);
        assert!(!o.status.success(), "attached with {extra:?}");
        assert!(e.contains("cannot be resized"), "{e}");
    };

    attach(&t, &["--max-flows", "1000"]);
    let table = slow_path_table(&t).expect("slow-path table");
    refused(&[
        "--admit",
        "xdp",
        "--max-flows",
        "2000",
        "--port-range",
        "1024-49999",
        "--kernel-nat-ports",
        "50000-65535",
    ]);
    assert_eq!(
        slow_path_table(&t).as_deref(),
        Some(table.as_str()),
        "a refused attach changed the slow-path table"
    );
    assert_eq!(sysctl(&t, &accept_local), "1");
    assert_eq!(sysctl(&t, &rp_filter), "2");
    t.router_ctl_ok(&["detach"]);

    t.router_ctl_ok(&[
        "attach",
        LAN_IF,
        WAN_IF,
        "--admit",
        "kernel",
        "--max-flows",
        "1000",
    ]);
    refused(&["--admit", "xdp", "--max-flows", "2000"]);
    assert_eq!(
        slow_path_table(&t),
        None,
        "a refused switch to standalone set up the slow-path table"
    );
    assert_eq!(sysctl(&t, &accept_local), old_accept_local);
    assert_eq!(sysctl(&t, &rp_filter), "1");
    // Offload mode's detach leaves the owner's firewall in charge.
    let o = t.router_ctl(&["detach"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("only filter"), "{}", stderr(&o));
}

/// What the data path passes from the LAN and netfilter does not
/// translate, because its conntrack calls it invalid (a LAN host's TCP RST
/// and FIN about a connection no table knows, as after an XDP flow
/// expired), does not leave on the WAN: the slow-path table's
/// `untranslated` chain drops it and counts it; the server's interface
/// sees no LAN source address.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn untranslatable_lan_packets_do_not_leave_on_the_wan() {
    use socket2::{Domain, Protocol, Socket, Type};
    use tests::frames::{TCP_ACK, TCP_FIN, TCP_RST, Tcp};

    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    attach_and_print(&t, &[]);
    let cap = Capture::start(&t, Ns::Server, "eth0");
    let raw = t.in_ns(Ns::Client, || {
        Socket::new(
            Domain::IPV4,
            Type::from(libc::SOCK_RAW),
            Some(Protocol::TCP),
        )
        .expect("raw socket")
    });
    let before = t.stats();
    let dst = SocketAddr::new(IpAddr::V4(SERVER_ADDR), 0);
    for (i, flags) in [TCP_RST, TCP_FIN | TCP_ACK, TCP_RST | TCP_ACK]
        .into_iter()
        .enumerate()
    {
        let mut seg = Tcp::new(43000 + u16::try_from(i).unwrap(), 5331, flags);
        seg.seq = 1000;
        seg.ack = 2000;
        raw.send_to(
            &seg.bytes(CLIENT_ADDR.octets(), SERVER_ADDR.octets()),
            &dst.into(),
        )
        .expect("send a segment");
    }
    let dropped = |t: &Topology| {
        let chain = t.exec_ok(
            Ns::Router,
            &["nft", "list", "chain", "ip", "xdp_router", "untranslated"],
        );
        chain
            .split("counter packets ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no counter in:\n{chain}"))
    };
    read_until(Duration::from_secs(5), || dropped(&t), |n| *n >= 3);
    // The capture's positive control: a datagram that leaves translated.
    let _ = t.udp_echo_roundtrip(Ns::Client, Ns::Server, socket_addr(SERVER_ADDR, 5332));
    std::thread::sleep(Duration::from_millis(200));
    let seen = cap.drain();
    let after = t.stats();
    println!("{}", t.router_ctl_ok(&["stats"]));
    assert_eq!(
        counter_delta(&before, &after, "pass_no_flow"),
        3,
        "XDP passed the segments to the kernel"
    );
    assert!(
        seen.iter()
            .any(|s| s.proto == 17 && s.src == ROUTER_WAN_ADDR && s.dst == SERVER_ADDR),
        "the capture saw no translated datagram: {seen:?}"
    );
    let leaked: Vec<&Seen> = seen.iter().filter(|s| in_lan(s.src)).collect();
    assert!(
        leaked.is_empty(),
        "LAN source addresses on the WAN: {leaked:?}"
    );
    assert_eq!(dropped(&t), 3, "the untranslated chain's drops");
}

/// Something removes standalone mode's kernel side behind the router's
/// back (a firewall reload with `flush ruleset`, `sysctl --system`):
/// `status` says so (degraded, exit 1) with what is gone; `router-ctl run`
/// puts it back at its next tick and says so, after which status is
/// healthy again and the table drops untranslated LAN sources again.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_removed_kernel_side_is_reported_and_put_back_by_the_daemon() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    attach_and_print(&t, &[]);
    let (v, code) = crate::ctl::status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("attached"), 0), "{v}");
    let accept_local = format!("net.ipv4.conf.{LAN_IF}.accept_local");

    t.exec_ok(Ns::Router, &["nft", "flush", "ruleset"]);
    t.exec_ok(Ns::Router, &["sysctl", "-qw", &format!("{accept_local}=0")]);
    let (v, code) = crate::ctl::status(&t);
    assert_eq!((v["state"].as_str(), code), (Some("degraded"), 1), "{v}");
    let problems = v["problems"].to_string();
    for gap in ["table ip xdp_router", "accept_local"] {
        assert!(problems.contains(gap), "{gap}: {problems}");
    }

    let daemon = crate::offload::Daemon::start(&t, &[]);
    crate::ctl::wait_for_or_show(
        "the daemon to put the kernel side back",
        Duration::from_secs(10),
        || crate::ctl::status(&t).1 == 0,
        || {
            format!(
                "{}\ndaemon log:\n{}",
                crate::ctl::status(&t).0,
                daemon.log()
            )
        },
    );
    assert!(
        slow_path_table(&t).is_some_and(|s| s.contains("untranslated")),
        "no table"
    );
    assert_eq!(sysctl(&t, &accept_local), "1");
    let log = daemon.log();
    assert!(
        log.contains("changed behind the router's back") && log.contains("put back"),
        "{log}"
    );
    let (v, _) = crate::ctl::status(&t);
    assert_eq!(v["daemon"]["standalone_repairs"], 1, "{v}");
    // A table whose drop rules are gone (its chains kept) is changed too.
    t.exec_ok(
        Ns::Router,
        &["nft", "flush", "chain", "ip", "xdp_router", "untranslated"],
    );
    crate::ctl::wait_for_or_show(
        "the daemon to put the drop rules back",
        Duration::from_secs(30),
        || {
            slow_path_table(&t)
                .is_some_and(|s| s.contains("ct original ip daddr @lan_destinations"))
        },
        || {
            format!(
                "{}
daemon log:
{}",
                crate::ctl::status(&t).0,
                daemon.log()
            )
        },
    );
    assert_eq!(crate::ctl::status(&t).0["daemon"]["standalone_repairs"], 2);
}

/// A masquerade rule of the router's own (iptables-legacy, then nftables)
/// competes with standalone mode's slow-path table: attach and doctor warn
/// and name it; with `--no-kernel-nat` (the owner's rule does the slow
/// path) attach does not; on a router attached in offload mode doctor
/// does not either (the router's NAT is in charge there).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_source_nat_rule_of_the_routers_own_is_warned_of() {
    let t = Topology::new();
    t.warm_neighbours();
    let _detach = DetachOnDrop(&t);
    let attach_warning = |extra: &[&str]| {
        let mut args = vec!["attach", LAN_IF, WAN_IF, "--admit", "xdp"];
        args.extend_from_slice(extra);
        let o = t.router_ctl(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        let e = stderr(&o);
        t.router_ctl_ok(&["detach"]);
        e
    };
    let doctor_says = || {
        let o = t.router_ctl(&["doctor", LAN_IF, WAN_IF]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(!attach_warning(&[]).contains("source NAT rules of its own"));
    assert!(!doctor_says().contains("source-nat"));

    for (what, add, needle, remove) in [
        (
            "iptables-legacy",
            vec![
                "iptables-legacy",
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-o",
                WAN_IF,
                "-j",
                "MASQUERADE",
            ],
            "iptables-legacy table nat (1 MASQUERADE/SNAT rule)",
            vec!["iptables-legacy", "-t", "nat", "-F", "POSTROUTING"],
        ),
        (
            "nftables",
            vec![
                "nft",
                "add table ip mynat; add chain ip mynat post { type nat hook postrouting priority srcnat; }; add rule ip mynat post oifname wan0 masquerade",
            ],
            "nftables table ip mynat (1 rule)",
            vec!["nft", "delete", "table", "ip", "mynat"],
        ),
    ] {
        t.exec_ok(Ns::Router, &add);
        let e = attach_warning(&[]);
        assert!(
            e.contains("source NAT rules of its own") && e.contains(needle),
            "{what}: attach: {e}"
        );
        let d = doctor_says();
        assert!(
            d.contains("source-nat") && d.contains(needle),
            "{what}: doctor: {d}"
        );
        let e = attach_warning(&["--no-kernel-nat"]);
        assert!(!e.contains("source NAT rules of its own"), "{what}: {e}");
        t.router_ctl_ok(&[
            "attach",
            LAN_IF,
            WAN_IF,
            "--admit",
            "xdp",
            "--no-kernel-nat",
        ]);
        assert!(
            !doctor_says().contains("source-nat"),
            "{what}: --no-kernel-nat"
        );
        t.router_ctl_ok(&["detach"]);
        t.router_ctl_ok(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
        assert!(
            !doctor_says().contains("source-nat"),
            "{what}: offload mode"
        );
        t.router_ctl_ok(&["detach"]);
        t.exec_ok(Ns::Router, &remove);
    }
}

/// The IPv4 counter `name` of group `group` (`Icmp`, `Ip`...) of
/// namespace `ns` (/proc/net/snmp: a line of names, then one of values).
fn snmp(t: &Topology, ns: Ns, group: &str, name: &str) -> u64 {
    let text = t.exec_ok(ns, &["cat", "/proc/net/snmp"]);
    let prefix = format!("{group}:");
    let mut lines = text.lines().filter(|l| l.starts_with(&prefix));
    let (names, values) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find_map(|(n, v)| (n == name).then(|| v.parse().ok())?)
        .unwrap_or_else(|| panic!("{group} {name} in /proc/net/snmp"))
}

/// Standalone mode forwards no IPv4 packet whose source the LAN does not
/// route (BCP 38, RFC 3704 strict reverse path): a LAN host that also
/// holds an address of another network pings the server from it, and
/// nothing reaches the server (`drop_spoofed_source`; masqueraded, its
/// replies would go to that address); its own LAN address still does,
/// also with a policy rule on the LAN's incoming interface.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_lan_host_pinging_from_a_foreign_address_reaches_nothing() {
    let t = Topology::new();
    attach_and_print(&t, &[]);
    // As an upstream gives it: a default route out of the WAN, so the
    // foreign address is routable (out of the WAN, not the LAN).
    let server = SERVER_ADDR.to_string();
    t.exec_ok(
        Ns::Router,
        &[
            "ip", "route", "replace", "default", "via", &server, "dev", WAN_IF,
        ],
    );
    let foreign = "10.9.9.9";
    t.exec_ok(
        Ns::Client,
        &["ip", "addr", "add", "10.9.9.9/32", "dev", tests::HOST_IF],
    );
    let echos = |t: &Topology| snmp(t, Ns::Server, "Icmp", "InEchos");
    let (before, echos0) = (t.stats(), echos(&t));
    let ping = |from: &[&str]| {
        let mut cmd = vec!["ping", "-n", "-q", "-c", "3", "-i", "0.2", "-W", "1"];
        cmd.extend_from_slice(from);
        cmd.push(&server);
        t.exec(Ns::Client, &cmd).status.success()
    };
    assert!(
        !ping(&["-I", foreign]),
        "a ping from {foreign} was answered"
    );
    let after = t.stats();
    assert_eq!(echos(&t), echos0, "the server got a ping from {foreign}");
    assert_eq!(
        counter_delta(&before, &after, "drop_spoofed_source"),
        3,
        "{after}"
    );
    assert_eq!(counter_delta(&before, &after, "flow_new_masquerade"), 0);
    assert!(ping(&[]), "its LAN address still reaches the server");
    assert!(echos(&t) >= echos0 + 3);
    // Policy routing of the LAN's traffic (a "LAN via VPN" rule, here to a
    // table whose default route is the WAN's): the source check asks from
    // the router's own perspective, as `rp_filter` does, so such a rule
    // changes nothing for it. A new flow (another ping) still opens.
    for cmd in [
        &["ip", "rule", "add", "iif", LAN_IF, "lookup", "100"][..],
        &[
            "ip", "route", "add", "default", "via", &server, "dev", WAN_IF, "table", "100",
        ],
    ] {
        t.exec_ok(Ns::Router, cmd);
    }
    let before = t.stats();
    assert!(
        ping(&[]),
        "a LAN host policy-routed by its incoming interface"
    );
    let after = t.stats();
    assert_eq!(counter_delta(&before, &after, "drop_spoofed_source"), 0);
    assert_eq!(counter_delta(&before, &after, "flow_new_masquerade"), 1);
}

/// The kernel's errors about an XDP flow whose LAN host is gone do not
/// leave with its address. A WAN packet of an XDP flow that finds no LAN
/// neighbour is passed translated (`pass_no_neighbour`); when the kernel's
/// ARP for the host then fails, it sends Host Unreachable to the remote,
/// quoting the packet as it forwarded it: the LAN host's address and port,
/// which its conntrack never translated. The slow-path table's
/// `untranslated` chain drops such errors and counts them. The same error
/// about a flow of the kernel's own slow path (a first datagram that was
/// fragmented) still reaches the remote, its quote translated back to the
/// WAN address by the kernel's NAT.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn an_error_about_a_flow_whose_lan_host_is_gone_does_not_leave_with_its_address() {
    let t = Topology::new();
    let _detach = DetachOnDrop(&t);
    attach_and_print(&t, &[]);
    let srv = t.in_ns(Ns::Server, || {
        UdpSocket::bind(socket_addr(SERVER_ADDR, 5300)).unwrap()
    });
    srv.set_read_timeout(Some(IO)).unwrap();
    let cli = client_udp(&t, 42000, socket_addr(SERVER_ADDR, 5300));
    let cli_slow = client_udp(&t, 42001, socket_addr(SERVER_ADDR, 5300));
    let mut buf = vec![0u8; 65536];
    // From two sockets of the client: a fragmented first datagram opens a
    // flow in the kernel's slow path, a small one an XDP flow.
    let mut peer_of = |cli: &UdpSocket, payload: &[u8]| {
        cli.send(payload).unwrap();
        let (n, peer) = srv.recv_from(&mut buf).expect("the server got a datagram");
        assert_eq!(n, payload.len());
        srv.send_to(b"reply", peer).unwrap();
        assert_eq!(cli.recv(&mut buf).ok(), Some(5), "the client got no reply");
        peer
    };
    let kernel_flow = peer_of(&cli_slow, &[0x5a; 3000]);
    let xdp_flow = peer_of(&cli, b"small");
    assert_eq!(xdp_flow, socket_addr(ROUTER_WAN_ADDR, 42000));
    assert!(
        kernel_flow.ip() == IpAddr::V4(ROUTER_WAN_ADDR) && kernel_flow.port() >= 61000,
        "the first datagram left as {kernel_flow}, not through the kernel's NAT"
    );
    // The client goes away: it answers no ARP, and the router forgets it.
    t.exec_ok(Ns::Client, &["ip", "link", "set", "eth0", "arp", "off"]);
    t.exec_ok(Ns::Router, &["ip", "neigh", "flush", "dev", LAN_IF]);
    // The XDP flow's cached next hop is asked of the FIB again once a
    // second: past that, its next packet finds no neighbour.
    std::thread::sleep(Duration::from_millis(1300));
    let cap = Capture::start(&t, Ns::Server, "eth0");
    let before = t.stats();
    srv.send_to(b"late reply", kernel_flow).unwrap();
    srv.send_to(b"late reply", xdp_flow).unwrap();
    // The kernel gives up on ARP after its probes (3 x 1 s) and answers
    // both queued packets at once.
    let mut errors = Vec::new();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10)
        && !errors
            .iter()
            .any(|e: &IcmpError| e.quoted_dst == kernel_flow)
    {
        std::thread::sleep(Duration::from_millis(100));
        errors.extend(cap.drain_icmp_errors());
    }
    std::thread::sleep(Duration::from_millis(300));
    errors.extend(cap.drain_icmp_errors());
    let after = t.stats();
    println!("ICMP errors seen by the server: {errors:?}");
    assert_eq!(
        counter_delta(&before, &after, "pass_no_neighbour"),
        1,
        "the XDP flow's packet was passed translated"
    );
    let leaked: Vec<&IcmpError> = errors.iter().filter(|e| e.quotes_a_lan_address()).collect();
    assert!(
        leaked.is_empty(),
        "errors quoting a LAN address reached the WAN: {leaked:?}"
    );
    assert_eq!(
        errors,
        [IcmpError {
            src: ROUTER_WAN_ADDR,
            kind: 3,
            code: 1,
            quoted_src: socket_addr(SERVER_ADDR, 5300),
            quoted_dst: kernel_flow,
        }],
        "the slow-path flow's Host Unreachable, translated by the kernel's NAT"
    );
    let chain = t.exec_ok(
        Ns::Router,
        &["nft", "list", "chain", "ip", "xdp_router", "untranslated"],
    );
    let dropped = chain
        .lines()
        .find(|l| l.contains("icmp type"))
        .and_then(|l| l.split("counter packets ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no counted ICMP error rule in:\n{chain}"));
    assert_eq!(
        dropped, 1,
        "the error about the XDP flow, dropped:\n{chain}"
    );
}

/// A switch to offload mode whose undoing of standalone mode's kernel side
/// fails (its record unreadable, here cut short) still attaches: the fast
/// path runs in offload mode, the command succeeds (so `apply` goes on to
/// its rules), and the warning names what to check.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_switch_to_offload_mode_attaches_when_standalones_record_is_unreadable() {
    let t = Topology::new();
    attach(&t, &[]);
    assert!(slow_path_table(&t).is_some());
    let record = format!(
        "{}/{}.standalone.json",
        tests::STATE_DIR,
        t.ns_name(Ns::Router)
    );
    std::fs::write(&record, b"{\"tab").expect("cutting the record short");
    let o = t.router_ctl(&["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
    let e = stderr(&o);
    let _ = std::fs::remove_file(&record);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("undoing standalone mode's kernel side failed") && e.contains("not a valid"),
        "{e}"
    );
    let (v, _) = crate::ctl::status(&t);
    assert_eq!(v["admit"], "kernel", "{v}");
}
