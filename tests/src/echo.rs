//! Small TCP/UDP echo servers and clients that run inside a namespace.
//!
//! Every socket has read/write timeouts and every loop is bounded by a
//! deadline, so a broken data path makes a test fail instead of hang.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::netns;

/// How long an echo server waits for its (first) peer before giving up.
pub const SERVER_LIFETIME: Duration = Duration::from_secs(15);
/// Per-operation socket timeout used by servers and clients.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(10);

/// A running echo server (TCP or UDP) on its own thread inside a namespace.
pub struct EchoServer {
    local: SocketAddr,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Option<SocketAddr>>>,
}

impl EchoServer {
    /// The address the server is bound to (useful with port 0).
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Stops waiting for new peers and returns the peer address the server
    /// saw first (`None` if nobody reached it). A TCP connection already
    /// accepted is echoed to its end first (bounded by socket timeouts).
    ///
    /// # Panics
    /// If the server thread panicked.
    #[must_use]
    pub fn join(mut self) -> Option<SocketAddr> {
        self.stop.store(true, Ordering::SeqCst);
        let handle = self.handle.take().expect("joined once");
        match handle.join() {
            Ok(peer) => peer,
            Err(e) => std::panic::resume_unwind(e),
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        // Not joined (e.g. the test panicked): tell the thread to stop; it
        // ends by itself within SERVER_LIFETIME at the latest.
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn spawn_server<S, F>(
    ns_name: &str,
    bind: impl FnOnce() -> io::Result<(S, SocketAddr)> + Send + 'static,
    serve: F,
) -> EchoServer
where
    S: Send + 'static,
    F: FnOnce(S, &AtomicBool) -> Option<SocketAddr> + Send + 'static,
{
    let name = ns_name.to_owned();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name(format!("echo-{name}"))
        .spawn(move || {
            netns::enter(&name);
            match bind() {
                Ok((sock, local)) => {
                    let _ = tx.send(Ok(local));
                    serve(sock, &stop2)
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                    None
                }
            }
        })
        .expect("spawn echo server thread");
    // Wait until the socket is bound so the client never races the server.
    let local = match rx.recv_timeout(IO_TIMEOUT) {
        Ok(Ok(local)) => local,
        Ok(Err(e)) => panic!("echo server in {ns_name}: bind failed: {e}"),
        Err(e) => panic!("echo server in {ns_name}: did not start: {e}"),
    };
    EchoServer {
        local,
        stop,
        handle: Some(handle),
    }
}

/// Accepts one connection on `listener` within `timeout` (the listener is
/// left non-blocking): the server's end, blocking again, and its peer. A
/// connection whose handshake never completes on the server (its last ACK
/// lost on the way through the router) is an error, not a hang.
///
/// # Errors
/// `TimedOut` when no connection completed in time; the listener's own
/// errors otherwise.
pub fn accept_within(
    listener: &TcpListener,
    timeout: Duration,
) -> io::Result<(TcpStream, SocketAddr)> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    loop {
        match listener.accept() {
            Ok((stream, peer)) => {
                stream.set_nonblocking(false)?;
                return Ok((stream, peer));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no connection accepted within {timeout:?}"),
                    ));
                }
                std::thread::sleep(POLL);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Starts a TCP server in namespace `ns_name` that accepts one connection,
/// records the peer address and echoes everything until EOF.
#[must_use]
pub fn tcp_server(ns_name: &str, addr: SocketAddr) -> EchoServer {
    spawn_server(
        ns_name,
        move || {
            let l = TcpListener::bind(addr)?;
            l.set_nonblocking(true)?;
            let local = l.local_addr()?;
            Ok((l, local))
        },
        |listener: TcpListener, stop| {
            let deadline = Instant::now() + SERVER_LIFETIME;
            let (mut stream, peer) = loop {
                match listener.accept() {
                    Ok(x) => break x,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if stop.load(Ordering::SeqCst) || Instant::now() >= deadline {
                            return None;
                        }
                        std::thread::sleep(POLL);
                    }
                    Err(_) => return None,
                }
            };
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
            let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
            let mut buf = [0u8; 16 * 1024];
            let deadline = Instant::now() + SERVER_LIFETIME;
            while Instant::now() < deadline {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if stream.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = stream.shutdown(Shutdown::Write);
            Some(peer)
        },
    )
}

/// Starts a UDP server in namespace `ns_name` that echoes every datagram
/// back to its sender until stopped; returns the first sender on join.
#[must_use]
pub fn udp_server(ns_name: &str, addr: SocketAddr) -> EchoServer {
    spawn_server(
        ns_name,
        move || {
            let s = UdpSocket::bind(addr)?;
            s.set_read_timeout(Some(Duration::from_millis(50)))?;
            s.set_write_timeout(Some(IO_TIMEOUT))?;
            let local = s.local_addr()?;
            Ok((s, local))
        },
        |sock: UdpSocket, stop| {
            let deadline = Instant::now() + SERVER_LIFETIME;
            let mut first = None;
            let mut buf = vec![0u8; 65536];
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                if let Ok((n, peer)) = sock.recv_from(&mut buf) {
                    first.get_or_insert(peer);
                    let _ = sock.send_to(&buf[..n], peer);
                }
            }
            first
        },
    )
}

/// TCP client (call on a thread inside the namespace): connects to `dst`,
/// sends `payload`, half-closes and returns what came back.
///
/// Writing happens on a second thread so that a payload larger than the
/// socket buffers cannot deadlock against the echo.
pub fn tcp_client(dst: SocketAddr, payload: &[u8], timeout: Duration) -> io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&dst, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut writer = stream.try_clone()?;
    std::thread::scope(|s| {
        let w = s.spawn(move || -> io::Result<()> {
            writer.write_all(payload)?;
            writer.shutdown(Shutdown::Write)
        });
        let mut out = Vec::with_capacity(payload.len());
        let deadline = Instant::now() + timeout + IO_TIMEOUT;
        let mut buf = [0u8; 16 * 1024];
        let read_result = loop {
            if Instant::now() >= deadline {
                break Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "echo deadline passed",
                ));
            }
            match stream.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) => break Err(e),
            }
        };
        if read_result.is_err() {
            // Unblock the writer if it is stuck.
            let _ = stream.shutdown(Shutdown::Both);
        }
        let write_result = w.join().expect("tcp writer thread panicked");
        read_result?;
        write_result?;
        Ok(out)
    })
}

/// A TCP connection from the fixed local address `local` (`SO_REUSEADDR`)
/// to `dst` (call on a thread inside the namespace), as a client that
/// reuses its source port does. While the previous connection on the port
/// waits for the final ACK of its FIN (`LAST_ACK`) the 4-tuple is taken
/// and `connect` fails with `EADDRNOTAVAIL`: the same socket tries again
/// until `timeout` has passed.
///
/// # Errors
/// What creating, binding or connecting the socket failed with (the last
/// `EADDRNOTAVAIL` once `timeout` has passed).
pub fn tcp_connect_from(
    local: SocketAddr,
    dst: SocketAddr,
    timeout: Duration,
) -> io::Result<TcpStream> {
    use socket2::{Domain, Socket, Type};
    let s = Socket::new(Domain::for_address(dst), Type::STREAM, None)?;
    s.set_reuse_address(true)?;
    s.bind(&local.into())?;
    let deadline = Instant::now() + timeout;
    loop {
        match s.connect_timeout(&dst.into(), timeout) {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::AddrNotAvailable && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    Ok(s)
}

/// UDP client (call on a thread inside the namespace): sends `payload` to
/// `dst` (retrying a few times within `timeout`) and returns the reply.
pub fn udp_client(dst: SocketAddr, payload: &[u8], timeout: Duration) -> io::Result<Vec<u8>> {
    let bind: SocketAddr = if dst.is_ipv4() {
        "0.0.0.0:0".parse().expect("literal")
    } else {
        "[::]:0".parse().expect("literal")
    };
    let sock = UdpSocket::bind(bind)?;
    sock.connect(dst)?;
    sock.set_read_timeout(Some(Duration::from_millis(300)))?;
    sock.set_write_timeout(Some(timeout))?;
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; 65536];
    let mut last_err = io::Error::new(io::ErrorKind::TimedOut, "no UDP reply");
    for _ in 0..100 {
        if Instant::now() >= deadline {
            break;
        }
        sock.send(payload)?;
        match sock.recv(&mut buf) {
            Ok(n) => return Ok(buf[..n].to_vec()),
            Err(e) => last_err = e,
        }
    }
    Err(last_err)
}
