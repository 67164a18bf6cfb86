//! Reliability end to end in the namespace topology: hostile WAN input,
//! conntrack table exhaustion, SNAT port exhaustion for one destination,
//! detach under traffic, and the control plane under load. Every load loop
//! is bounded in packets and time; no assertion depends on timing (the
//! figures these tests print go into docs/reliability.md).

mod control_plane;
mod detach;
mod exhaustion;
mod hostile;

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::frames::{
    ICMP_DEST_UNREACH, ICMP_PARAMETER_PROBLEM, ICMP_TIME_EXCEEDED, Icmp, Ipv4, TCP_ACK, TCP_FIN,
    TCP_PSH, TCP_RST, TCP_SYN, Tcp, Udp,
};
use tests::prog::SplitMix64;

use tests::{
    CLIENT_ADDR, LAN_IF, Ns, ROUTER_WAN_ADDR, SERVER_ADDR, Topology, WAN_IF, counter_delta,
    socket_addr,
};

use crate::ctl::attach_and_print;

pub(super) const IO: Duration = Duration::from_secs(3);

pub(super) fn count_json(t: &Topology) -> Value {
    let out = t.router_ctl_ok(&["conntrack", "count", "--json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("conntrack count --json: {e}: {out}"))
}

/// Every counter of `stats --json` that moved between two snapshots.
pub(super) fn moved(before: &Value, after: &Value) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = after
        .as_object()
        .expect("stats object")
        .iter()
        // Counters only: `conntrack` is the table's fill, `admit` (and
        // other strings) the mode.
        .filter(|(_, v)| v.get("packets").is_some() || v.get("events").is_some())
        .map(|(k, _)| k)
        .map(|k| (k.clone(), counter_delta(before, after, k)))
        .filter(|(_, d)| *d > 0)
        .collect();
    v.sort();
    v
}

// Servers and sockets shared by the scenarios.

/// A TCP echo server that accepts any number of connections, each echoed
/// on its own thread; everything ends on `stop` or after `lifetime`.
pub(super) struct MultiEcho {
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    handle: Option<JoinHandle<()>>,
}

impl MultiEcho {
    pub(super) fn start(t: &Topology, ns: Ns, addr: SocketAddr, lifetime: Duration) -> Self {
        let listener = t.in_ns(ns, || TcpListener::bind(addr).expect("bind echo listener"));
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let (stop2, acc2) = (Arc::clone(&stop), Arc::clone(&accepted));
        let handle = std::thread::spawn(move || {
            let deadline = Instant::now() + lifetime;
            let mut conns = Vec::new();
            while !stop2.load(Ordering::SeqCst) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((c, _)) => {
                        acc2.fetch_add(1, Ordering::SeqCst);
                        let stop3 = Arc::clone(&stop2);
                        conns.push(std::thread::spawn(move || echo_conn(c, &stop3, deadline)));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => break,
                }
            }
            stop2.store(true, Ordering::SeqCst);
            for c in conns {
                let _ = c.join();
            }
        });
        Self {
            stop,
            accepted,
            handle: Some(handle),
        }
    }

    pub(super) fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for MultiEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

pub(super) fn echo_conn(mut c: TcpStream, stop: &AtomicBool, deadline: Instant) {
    let _ = c.set_nonblocking(false);
    let _ = c.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = c.set_write_timeout(Some(IO));
    let mut buf = [0u8; 16 * 1024];
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if c.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
}

/// A datagram's sender and payload.
pub(super) type Datagram = (SocketAddr, Vec<u8>);

/// A UDP server that records every datagram's sender and echoes it back
/// (send errors, e.g. no route to an untranslated LAN source, ignored).
pub(super) struct UdpRecorder {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Datagram>>>,
    handle: Option<JoinHandle<()>>,
}

impl UdpRecorder {
    pub(super) fn start(t: &Topology, ns: Ns, addr: SocketAddr, lifetime: Duration) -> Self {
        let sock = t.in_ns(ns, || UdpSocket::bind(addr).expect("bind UDP server"));
        sock.set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (stop2, seen2) = (Arc::clone(&stop), Arc::clone(&seen));
        let handle = std::thread::spawn(move || {
            let deadline = Instant::now() + lifetime;
            let mut buf = [0u8; 2048];
            while !stop2.load(Ordering::SeqCst) && Instant::now() < deadline {
                if let Ok((n, peer)) = sock.recv_from(&mut buf) {
                    seen2.lock().unwrap().push((peer, buf[..n].to_vec()));
                    let _ = sock.send_to(&buf[..n], peer);
                }
            }
        });
        Self {
            stop,
            seen,
            handle: Some(handle),
        }
    }

    /// Waits (bounded) for a datagram with `payload`; returns its sender.
    pub(super) fn wait_for(&self, payload: &[u8], timeout: Duration) -> Option<SocketAddr> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some((p, _)) = self.seen.lock().unwrap().iter().find(|(_, d)| d == payload) {
                return Some(*p);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }
}

impl Drop for UdpRecorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Sends `msg` on `s` and reads the same number of bytes back.
pub(super) fn echo_once(s: &mut TcpStream, msg: &[u8], timeout: Duration) -> io::Result<()> {
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(msg)?;
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back)?;
    if back == msg {
        Ok(())
    } else {
        Err(io::Error::other("echo differs"))
    }
}

/// One UDP request/response on a connected socket (one send, bounded wait).
pub(super) fn udp_once(s: &UdpSocket, msg: &[u8], timeout: Duration) -> io::Result<()> {
    s.set_read_timeout(Some(timeout))?;
    s.send(msg)?;
    let mut buf = [0u8; 2048];
    let n = s.recv(&mut buf)?;
    if &buf[..n] == msg {
        Ok(())
    } else {
        Err(io::Error::other("reply differs"))
    }
}

pub(super) fn tcp_from(t: &Topology, ns: Ns, port: u16, dst: SocketAddr) -> TcpStream {
    t.in_ns(ns, || {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.set_reuse_address(true).unwrap();
        s.bind(&socket_addr(Ipv4Addr::UNSPECIFIED, port).into())
            .unwrap();
        s.connect_timeout(&dst.into(), IO)
            .unwrap_or_else(|e| panic!("connect {dst} from port {port}: {e}"));
        s.into()
    })
}

/// `socket(AF_INET, SOCK_RAW, IPPROTO_RAW)`: sends complete IPv4 packets
/// (any source address) out of the namespace it was created in.
pub(super) struct RawSender(OwnedFd);

impl RawSender {
    pub(super) fn new() -> Self {
        // SAFETY: plain socket(2) call.
        let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW) };
        assert!(fd >= 0, "raw socket: {}", io::Error::last_os_error());
        // SAFETY: fd is a new, owned descriptor.
        Self(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    pub(super) fn send(&self, pkt: &[u8]) -> io::Result<()> {
        let mut to: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        to.sin_family = libc::AF_INET as libc::sa_family_t;
        to.sin_addr.s_addr = u32::from_ne_bytes([pkt[16], pkt[17], pkt[18], pkt[19]]);
        // SAFETY: valid buffer and address for the duration of the call.
        let rc = unsafe {
            libc::sendto(
                self.0.as_raw_fd(),
                pkt.as_ptr().cast(),
                pkt.len(),
                0,
                (&raw const to).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
}
