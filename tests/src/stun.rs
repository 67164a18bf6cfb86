//! A STUN-style NAT behaviour check of our own: the tests of RFC 5780
//! (NAT behaviour discovery) in a small wire format, plus a rendezvous
//! service for peer-to-peer tests.
//!
//! The [`StunServer`] listens on two addresses and two ports (four UDP
//! sockets, "A1:P1", "A1:P2", "A2:P1", "A2:P2"). It answers every request
//! with the source address and port it saw (the client's mapped endpoint)
//! and, when the request asks for it, answers from the other address
//! and/or the other port (RFC 5780's CHANGE-REQUEST). It also keeps a
//! registry of names to mapped endpoints, so two peers behind NATs can
//! learn each other's public endpoint (what a game's or WebRTC's
//! rendezvous/signalling server does).
//!
//! [`classify`] runs the client side (call it on a thread inside the LAN
//! host's namespace) and reports the NAT's mapping and filtering
//! behaviour (RFC 4787 terms).
//!
//! Wire format (not STUN's, to stay small; the semantics are RFC 5780's):
//! every message starts with [`MAGIC`], a kind byte and a 32-bit
//! transaction id (big endian).
//! - binding request: flags byte ([`CHANGE_ADDR`], [`CHANGE_PORT`]);
//!   response: the mapped endpoint (4 address bytes, 2 port bytes).
//! - register request: a name; response: the mapped endpoint, which the
//!   server records under that name.
//! - lookup request: a name; response: the endpoint recorded under it
//!   (`0.0.0.0:0` if none).
//!
//! Every wait is bounded: a lost request is retried a few times, a
//! filtered response shows as `None` after a bounded wait.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::netns;

/// First bytes of every message.
pub const MAGIC: [u8; 4] = *b"NATB";
/// The server's primary port (STUN's).
pub const PRIMARY_PORT: u16 = 3478;
/// The server's alternate port.
pub const ALTERNATE_PORT: u16 = 3479;
/// Binding flag: answer from the other address.
pub const CHANGE_ADDR: u8 = 1;
/// Binding flag: answer from the other port.
pub const CHANGE_PORT: u8 = 2;
/// The server stops by itself after this long, also if nobody stops it.
pub const SERVER_LIFETIME: Duration = Duration::from_mins(2);
/// How long a client waits for a response it expects (retrying).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a client waits for a response that filtering may drop: its
/// absence is the result, so this is the price of every "filtered".
pub const FILTERED_WAIT: Duration = Duration::from_millis(1500);
/// Interval between retransmissions of a request.
const RETRY: Duration = Duration::from_millis(250);

const KIND_BINDING: u8 = 1;
const KIND_REGISTER: u8 = 2;
const KIND_LOOKUP: u8 = 3;
const HEADER_LEN: usize = 9;
const ENDPOINT_LEN: usize = 6;

/// The two addresses of a [`StunServer`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerAddrs {
    /// A1.
    pub primary: Ipv4Addr,
    /// A2.
    pub alternate: Ipv4Addr,
}

impl ServerAddrs {
    /// The endpoint of address `alt` (A2 if true) and port `alt_port`
    /// (P2 if true).
    #[must_use]
    pub fn endpoint(self, alt: bool, alt_port: bool) -> SocketAddrV4 {
        let ip = if alt { self.alternate } else { self.primary };
        let port = if alt_port {
            ALTERNATE_PORT
        } else {
            PRIMARY_PORT
        };
        SocketAddrV4::new(ip, port)
    }
}

/// RFC 4787 mapping behaviour (section 4.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapping {
    /// The same mapped endpoint for every destination.
    EndpointIndependent,
    /// The same mapped endpoint for every port of one destination address.
    AddressDependent,
    /// A mapped endpoint per destination address and port.
    AddressAndPortDependent,
}

/// RFC 4787 filtering behaviour (section 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filtering {
    /// Any remote may send to an active mapping ("full cone").
    EndpointIndependent,
    /// Only addresses the internal endpoint has sent to.
    AddressDependent,
    /// Only address-and-port pairs the internal endpoint has sent to.
    AddressAndPortDependent,
}

impl Filtering {
    /// The name `router-ctl attach --filtering` takes.
    #[must_use]
    pub fn cli_name(self) -> &'static str {
        match self {
            Self::EndpointIndependent => "endpoint-independent",
            Self::AddressDependent => "address-dependent",
            Self::AddressAndPortDependent => "address-port-dependent",
        }
    }
}

/// RFC 5780 section 4.3: mapped endpoints seen by A1:P1 (test I), A2:P1
/// (test II) and A2:P2 (test III) from one local socket.
#[must_use]
pub fn mapping_from(
    via_primary: SocketAddrV4,
    via_alt_addr: SocketAddrV4,
    via_alt_both: SocketAddrV4,
) -> Mapping {
    if via_alt_addr == via_primary {
        Mapping::EndpointIndependent
    } else if via_alt_both == via_alt_addr {
        Mapping::AddressDependent
    } else {
        Mapping::AddressAndPortDependent
    }
}

/// RFC 5780 section 4.4: whether a response came back from the other
/// address and port (test II) and from the other port only (test III),
/// the local endpoint having sent to A1:P1 only.
#[must_use]
pub fn filtering_from(from_other_addr_and_port: bool, from_other_port: bool) -> Filtering {
    if from_other_addr_and_port {
        Filtering::EndpointIndependent
    } else if from_other_port {
        Filtering::AddressDependent
    } else {
        Filtering::AddressAndPortDependent
    }
}

/// What [`classify`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Behaviour {
    pub mapping: Mapping,
    pub filtering: Filtering,
    /// Mapped endpoints of the mapping test's socket as seen by A1:P1,
    /// A2:P1 and A2:P2.
    pub mapped: [SocketAddrV4; 3],
    /// Local endpoint of the mapping test's socket.
    pub local: SocketAddrV4,
}

/// A running STUN-style server (one thread) inside a namespace.
pub struct StunServer {
    addrs: ServerAddrs,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl StunServer {
    /// Starts the server on A1/A2 x P1/P2, on a thread that entered network
    /// namespace `ns_name` (`None`: the caller's namespace). Returns once
    /// the four sockets are bound.
    ///
    /// # Panics
    /// If a socket cannot be bound or the thread does not start.
    #[must_use]
    pub fn start(ns_name: Option<&str>, addrs: ServerAddrs) -> Self {
        let ns = ns_name.map(str::to_owned);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let (tx, rx) = mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("stun-server".to_owned())
            .spawn(move || {
                if let Some(ns) = &ns {
                    netns::enter(ns);
                }
                match bind_four(addrs) {
                    Ok(socks) => {
                        let _ = tx.send(Ok(()));
                        serve(&socks, &stop2);
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                    }
                }
            })
            .expect("spawn the STUN server thread");
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("STUN server in {ns_name:?}: bind failed: {e}"),
            Err(e) => panic!("STUN server in {ns_name:?}: did not start: {e}"),
        }
        Self {
            addrs,
            stop,
            handle: Some(handle),
        }
    }

    /// The server's addresses.
    #[must_use]
    pub fn addrs(&self) -> ServerAddrs {
        self.addrs
    }
}

impl Drop for StunServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            // The loop polls with a short timeout: this returns quickly.
            // A panic of the server thread is reported, not swallowed,
            // unless this drop runs while unwinding already.
            if let Err(e) = h.join()
                && !std::thread::panicking()
            {
                std::panic::resume_unwind(e);
            }
        }
    }
}

/// Sockets in index order `alt_addr * 2 + alt_port`.
fn bind_four(addrs: ServerAddrs) -> io::Result<Vec<UdpSocket>> {
    let mut socks = Vec::with_capacity(4);
    for alt in [false, true] {
        for alt_port in [false, true] {
            let s = UdpSocket::bind(addrs.endpoint(alt, alt_port))?;
            s.set_nonblocking(true)?;
            socks.push(s);
        }
    }
    Ok(socks)
}

fn serve(socks: &[UdpSocket], stop: &AtomicBool) {
    let deadline = Instant::now() + SERVER_LIFETIME;
    let mut registry: HashMap<Vec<u8>, SocketAddrV4> = HashMap::new();
    let mut fds: Vec<libc::pollfd> = socks
        .iter()
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let nfds = libc::nfds_t::try_from(fds.len()).expect("four sockets");
    let mut buf = [0u8; 1500];
    while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
        // SAFETY: `fds` is a valid array of `nfds` pollfd for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), nfds, 50) };
        if n <= 0 {
            continue;
        }
        for (index, sock) in socks.iter().enumerate() {
            while let Ok((len, SocketAddr::V4(peer))) = sock.recv_from(&mut buf) {
                if let Some((reply_index, reply)) = answer(index, &buf[..len], peer, &mut registry)
                {
                    let _ = socks[reply_index].send_to(&reply, peer);
                }
            }
        }
    }
}

/// The response to request `req` from `peer` received on socket `index`:
/// which socket sends it, and its bytes. `None` for garbage.
fn answer(
    index: usize,
    req: &[u8],
    peer: SocketAddrV4,
    registry: &mut HashMap<Vec<u8>, SocketAddrV4>,
) -> Option<(usize, Vec<u8>)> {
    if req.len() < HEADER_LEN || req[..4] != MAGIC {
        return None;
    }
    let kind = req[4];
    let body = &req[HEADER_LEN..];
    let mut reply = req[..HEADER_LEN].to_vec();
    let mut from = index;
    match kind {
        KIND_BINDING => {
            let flags = *body.first()?;
            if flags & CHANGE_ADDR != 0 {
                from ^= 2;
            }
            if flags & CHANGE_PORT != 0 {
                from ^= 1;
            }
            put_endpoint(&mut reply, peer);
        }
        KIND_REGISTER => {
            registry.insert(body.to_vec(), peer);
            put_endpoint(&mut reply, peer);
        }
        KIND_LOOKUP => {
            let found = registry
                .get(body)
                .copied()
                .unwrap_or(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
            put_endpoint(&mut reply, found);
        }
        _ => return None,
    }
    Some((from, reply))
}

fn put_endpoint(out: &mut Vec<u8>, ep: SocketAddrV4) {
    out.extend_from_slice(&ep.ip().octets());
    out.extend_from_slice(&ep.port().to_be_bytes());
}

fn get_endpoint(b: &[u8]) -> Option<SocketAddrV4> {
    let b: [u8; ENDPOINT_LEN] = b.get(..ENDPOINT_LEN)?.try_into().ok()?;
    Some(SocketAddrV4::new(
        Ipv4Addr::new(b[0], b[1], b[2], b[3]),
        u16::from_be_bytes([b[4], b[5]]),
    ))
}

/// The client side: one UDP socket and a transaction counter.
pub struct Client {
    sock: UdpSocket,
    next_txid: u32,
}

impl Client {
    /// A client on a new socket bound to `local` (port 0: any). Call on a
    /// thread inside the host's namespace.
    ///
    /// # Errors
    /// If the socket cannot be bound.
    pub fn bind(local: SocketAddrV4) -> io::Result<Self> {
        let sock = UdpSocket::bind(local)?;
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        // Distinct per socket so a late answer to another socket's request
        // can never be mistaken for ours.
        let next_txid = u32::from(sock.local_addr()?.port()) << 16;
        Ok(Self { sock, next_txid })
    }

    /// The socket's local endpoint.
    ///
    /// # Errors
    /// If the socket has none.
    pub fn local(&self) -> io::Result<SocketAddrV4> {
        match self.sock.local_addr()? {
            SocketAddr::V4(a) => Ok(a),
            SocketAddr::V6(a) => Err(io::Error::other(format!("IPv6 socket {a}"))),
        }
    }

    /// The underlying socket (e.g. for peer-to-peer traffic from the same
    /// local endpoint once it has learned its mapping).
    #[must_use]
    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// Sends `kind`+`body` to `dst` every [`RETRY`] until a matching
    /// response comes from `from` or `wait` passes; the response's
    /// endpoint, or `None` after `wait`.
    fn transact(
        &mut self,
        dst: SocketAddrV4,
        kind: u8,
        body: &[u8],
        from: SocketAddrV4,
        wait: Duration,
    ) -> io::Result<Option<SocketAddrV4>> {
        self.next_txid = self.next_txid.wrapping_add(1);
        let txid = self.next_txid;
        let mut req = MAGIC.to_vec();
        req.push(kind);
        req.extend_from_slice(&txid.to_be_bytes());
        req.extend_from_slice(body);
        let deadline = Instant::now() + wait;
        let mut buf = [0u8; 1500];
        while Instant::now() < deadline {
            self.sock.send_to(&req, dst)?;
            let retry_at = (Instant::now() + RETRY).min(deadline);
            while Instant::now() < retry_at {
                match self.sock.recv_from(&mut buf) {
                    Ok((n, src)) => {
                        let msg = &buf[..n];
                        if src == SocketAddr::V4(from)
                            && n >= HEADER_LEN + ENDPOINT_LEN
                            && msg[..HEADER_LEN] == req[..HEADER_LEN]
                        {
                            return Ok(get_endpoint(&msg[HEADER_LEN..]));
                        }
                    }
                    Err(e)
                        if matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock
                                | io::ErrorKind::TimedOut
                                // An ICMP error of an earlier send (e.g. port
                                // unreachable) surfaces here on some sockets.
                                | io::ErrorKind::ConnectionRefused
                        ) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(None)
    }

    /// A binding request to `dst` asking for an answer changed by `flags`;
    /// the mapped endpoint if the answer came back within `wait`.
    ///
    /// # Errors
    /// On a socket error.
    pub fn binding(
        &mut self,
        server: ServerAddrs,
        dst: SocketAddrV4,
        flags: u8,
        wait: Duration,
    ) -> io::Result<Option<SocketAddrV4>> {
        let alt = (dst.ip() == &server.alternate) ^ (flags & CHANGE_ADDR != 0);
        let alt_port = (dst.port() == ALTERNATE_PORT) ^ (flags & CHANGE_PORT != 0);
        let from = server.endpoint(alt, alt_port);
        self.transact(dst, KIND_BINDING, &[flags], from, wait)
    }

    /// A binding request to `dst` that must be answered (from `dst`).
    ///
    /// # Errors
    /// On a socket error or no answer within [`ANSWER_TIMEOUT`].
    pub fn mapped(&mut self, server: ServerAddrs, dst: SocketAddrV4) -> io::Result<SocketAddrV4> {
        self.binding(server, dst, 0, ANSWER_TIMEOUT)?
            .ok_or_else(|| timed_out(&format!("no binding response from {dst}")))
    }

    /// Registers this socket's mapped endpoint under `name` at the
    /// rendezvous endpoint `server`; returns the mapped endpoint.
    ///
    /// # Errors
    /// On a socket error or no answer within [`ANSWER_TIMEOUT`].
    pub fn register(&mut self, server: SocketAddrV4, name: &str) -> io::Result<SocketAddrV4> {
        self.transact(
            server,
            KIND_REGISTER,
            name.as_bytes(),
            server,
            ANSWER_TIMEOUT,
        )?
        .ok_or_else(|| timed_out(&format!("no register response from {server}")))
    }

    /// The endpoint registered under `name` at `server`, if any.
    ///
    /// # Errors
    /// On a socket error or no answer within [`ANSWER_TIMEOUT`].
    pub fn lookup(&mut self, server: SocketAddrV4, name: &str) -> io::Result<Option<SocketAddrV4>> {
        let ep = self
            .transact(server, KIND_LOOKUP, name.as_bytes(), server, ANSWER_TIMEOUT)?
            .ok_or_else(|| timed_out(&format!("no lookup response from {server}")))?;
        Ok((ep.port() != 0).then_some(ep))
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_owned())
}

/// RFC 5780's behaviour discovery against `server`; call on a thread
/// inside the LAN host's namespace.
///
/// Mapping (section 4.3): one socket bound to `mapping_local` asks A1:P1,
/// A2:P1 and A2:P2 for its mapped endpoint. Filtering (section 4.4): a
/// second socket, bound to `filtering_local` (port 0: any), that has sent
/// to A1:P1 only asks for answers from A2:P2 and then from A1:P2. It must
/// be another socket: the first one's mapping has sent to A2 already,
/// which an address-dependent filter would rightly let in.
///
/// # Errors
/// On a socket error or when a request that must be answered is not.
pub fn classify(
    server: ServerAddrs,
    mapping_local: SocketAddrV4,
    filtering_local: SocketAddrV4,
) -> io::Result<Behaviour> {
    let mut m = Client::bind(mapping_local)?;
    let via_primary = m.mapped(server, server.endpoint(false, false))?;
    let via_alt_addr = m.mapped(server, server.endpoint(true, false))?;
    let via_alt_both = m.mapped(server, server.endpoint(true, true))?;
    let mapping = mapping_from(via_primary, via_alt_addr, via_alt_both);

    let mut f = Client::bind(filtering_local)?;
    let primary = server.endpoint(false, false);
    f.mapped(server, primary)?;
    let other_both = f
        .binding(server, primary, CHANGE_ADDR | CHANGE_PORT, FILTERED_WAIT)?
        .is_some();
    // Test III only when test II was filtered: after an answer from A2:P2
    // got in, the filter state would no longer be "sent to A1:P1 only".
    let other_port = other_both
        || f.binding(server, primary, CHANGE_PORT, FILTERED_WAIT)?
            .is_some();
    Ok(Behaviour {
        mapping,
        filtering: filtering_from(other_both, other_port),
        mapped: [via_primary, via_alt_addr, via_alt_both],
        local: m.local()?,
    })
}

#[cfg(test)]
mod unit {
    use super::*;

    fn ep(last: u8, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(203, 0, 113, last), port)
    }

    #[test]
    fn mapping_classes() {
        let (a, b, c) = (ep(1, 40000), ep(1, 40001), ep(1, 40002));
        assert_eq!(mapping_from(a, a, a), Mapping::EndpointIndependent);
        assert_eq!(mapping_from(a, b, b), Mapping::AddressDependent);
        assert_eq!(mapping_from(a, b, c), Mapping::AddressAndPortDependent);
    }

    #[test]
    fn filtering_classes() {
        assert_eq!(filtering_from(true, true), Filtering::EndpointIndependent);
        assert_eq!(filtering_from(false, true), Filtering::AddressDependent);
        assert_eq!(
            filtering_from(false, false),
            Filtering::AddressAndPortDependent
        );
    }

    #[test]
    fn server_answers_garbage_with_nothing() {
        let mut reg = HashMap::new();
        let peer = ep(2, 5);
        assert!(answer(0, b"NATB", peer, &mut reg).is_none());
        assert!(answer(0, b"XXXX\x01\0\0\0\x01\0", peer, &mut reg).is_none());
        assert!(answer(0, b"NATB\x09\0\0\0\x01\0", peer, &mut reg).is_none());
        // A binding without its flags byte.
        assert!(answer(0, b"NATB\x01\0\0\0\x01", peer, &mut reg).is_none());
    }

    #[test]
    fn change_request_picks_the_socket() {
        let mut reg = HashMap::new();
        let peer = ep(2, 5);
        let req = |flags: u8| [&MAGIC[..], &[KIND_BINDING, 0, 0, 0, 7, flags]].concat();
        let (from, reply) = answer(0, &req(0), peer, &mut reg).unwrap();
        assert_eq!(from, 0);
        assert_eq!(get_endpoint(&reply[HEADER_LEN..]), Some(peer));
        assert_eq!(answer(0, &req(CHANGE_ADDR), peer, &mut reg).unwrap().0, 2);
        assert_eq!(answer(0, &req(CHANGE_PORT), peer, &mut reg).unwrap().0, 1);
        let both = CHANGE_ADDR | CHANGE_PORT;
        assert_eq!(answer(0, &req(both), peer, &mut reg).unwrap().0, 3);
        assert_eq!(answer(3, &req(both), peer, &mut reg).unwrap().0, 0);
    }

    /// Without a NAT (loopback, two local addresses) every request is
    /// answered: the classifier must report endpoint-independent mapping
    /// and filtering, the mapped endpoint being the socket itself. This
    /// runs the real server and client, unprivileged.
    #[test]
    fn no_nat_on_loopback_is_endpoint_independent() {
        let addrs = ServerAddrs {
            primary: Ipv4Addr::LOCALHOST,
            alternate: Ipv4Addr::new(127, 0, 0, 2),
        };
        let server = StunServer::start(None, addrs);
        let any = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
        let b = classify(server.addrs(), any, any).unwrap();
        assert_eq!(b.mapping, Mapping::EndpointIndependent, "{b:?}");
        assert_eq!(b.filtering, Filtering::EndpointIndependent, "{b:?}");
        assert_eq!(b.mapped[0], b.local, "{b:?}");

        // Rendezvous: register, then look up from another socket.
        let rendezvous = addrs.endpoint(false, false);
        let mut one = Client::bind(any).unwrap();
        let mapped = one.register(rendezvous, "one").unwrap();
        assert_eq!(mapped, one.local().unwrap());
        let mut two = Client::bind(any).unwrap();
        assert_eq!(two.lookup(rendezvous, "one").unwrap(), Some(mapped));
        assert_eq!(two.lookup(rendezvous, "nobody").unwrap(), None);
    }
}
