//! The two flows that run through the failover, and what is measured on
//! them: a paced TCP stream (every byte checked) and a UDP echo flow, the
//! arrival times at their receivers, the longest gaps and the UDP loss.

use std::{
    net::{Ipv4Addr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use tests::socket_addr;

use super::{SERVER, pair::Pair};
use crate::ctl::{Tally, receive_all, same_bytes, send_paced};

pub(super) const TCP_PORT: u16 = 7100;
pub(super) const TCP_DOWNLOAD_PORT: u16 = 7110;
pub(super) const UDP_PORT: u16 = 7200;
const UDP_CLIENT_PORT: u16 = 41000;
/// The UDP flow's pace: one datagram (and its echo) every 5 ms.
pub(super) const UDP_GAP: Duration = Duration::from_millis(5);
/// The TCP stream's pace: one 8 KiB chunk every 10 ms (~800 KB/s).
const TCP_CHUNK: usize = 8 * 1024;
const TCP_GAP: Duration = Duration::from_millis(10);
/// Upper bound of any flow of a scenario (the loops stop long before).
const FLOW_MAX: Duration = Duration::from_secs(90);

/// Arrival times of a flow's data at its receiver.
pub(super) type Arrivals = Arc<Mutex<Vec<Instant>>>;

/// A paced TCP stream until stopped, from the client to a sink on the
/// server (an upload) or from the server to the client (a download); the
/// receiver records when data arrives and hashes every byte.
pub(super) struct TcpFlow {
    stop: Arc<AtomicBool>,
    pub(super) arrivals: Arrivals,
    client: JoinHandle<Result<Tally, String>>,
    server: JoinHandle<Result<Tally, String>>,
    /// The server sends.
    download: bool,
}

/// One end of a [`TcpFlow`]: sends paced chunks until stopped, or receives
/// until the other end closes, recording arrivals.
fn stream_end(
    sock: &mut TcpStream,
    sends: bool,
    stop: &AtomicBool,
    arrivals: &Arrivals,
) -> Result<Tally, String> {
    // Longer than any failover: a stall is measured, not an error.
    sock.set_write_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    if sends {
        let start = Instant::now();
        // Paced until stopped: chunk i is due at i + 1 gaps from the start.
        send_paced(sock, TCP_CHUNK, |i| {
            (!stop.load(Ordering::Relaxed) && start.elapsed() < FLOW_MAX).then(|| TCP_GAP * (i + 1))
        })
    } else {
        receive_all(sock, Instant::now() + FLOW_MAX, || {
            arrivals.lock().unwrap().push(Instant::now());
        })
    }
}

impl TcpFlow {
    /// The client's upload to the server's [`TCP_PORT`].
    pub(super) fn start(pair: &Pair) -> Self {
        Self::run(pair, TCP_PORT, false)
    }

    /// A download from the server's [`TCP_DOWNLOAD_PORT`]: the server sends.
    pub(super) fn download(pair: &Pair) -> Self {
        Self::run(pair, TCP_DOWNLOAD_PORT, true)
    }

    fn run(pair: &Pair, port: u16, download: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let arrivals = Arrivals::default();
        let (tx, rx) = std::sync::mpsc::channel();
        let srv_ns = pair.ns("srv");
        let (server_stop, server_arrivals) = (Arc::clone(&stop), Arc::clone(&arrivals));
        let server = std::thread::spawn(move || {
            tests::netns::enter(&srv_ns);
            let listener =
                TcpListener::bind(socket_addr(SERVER, port)).map_err(|e| format!("bind: {e}"))?;
            tx.send(()).unwrap();
            // Bounded: a client that never connects must fail the test,
            // not leave `finish` waiting for this thread.
            let (mut sock, _) = tests::echo::accept_within(&listener, Duration::from_secs(10))
                .map_err(|e| format!("accept: {e}"))?;
            stream_end(&mut sock, download, &server_stop, &server_arrivals)
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("TCP server bound");
        let cli_ns = pair.ns("cli");
        let (client_stop, client_arrivals) = (Arc::clone(&stop), Arc::clone(&arrivals));
        let client = std::thread::spawn(move || {
            tests::netns::enter(&cli_ns);
            let mut sock =
                TcpStream::connect_timeout(&socket_addr(SERVER, port), Duration::from_secs(5))
                    .map_err(|e| format!("connect: {e}"))?;
            stream_end(&mut sock, !download, &client_stop, &client_arrivals)
        });
        Self {
            stop,
            arrivals,
            client,
            server,
            download,
        }
    }

    /// Stops the sender; panics unless every byte arrived intact. Returns
    /// the bytes and the arrival times.
    pub(super) fn finish(self) -> (u64, Vec<Instant>) {
        self.stop.store(true, Ordering::Relaxed);
        let c = self.client.join().expect("client thread");
        let s = self.server.join().expect("server thread");
        // `same_bytes` takes (sender, receiver): the stream's ends as they
        // ran, whichever sent.
        let bytes = if self.download {
            same_bytes(s, c)
        } else {
            same_bytes(c, s)
        };
        let arrivals = self.arrivals.lock().unwrap().clone();
        (bytes, arrivals)
    }
}

/// A UDP flow: the client sends a numbered datagram every [`UDP_GAP`], the
/// server echoes it, the client records each echo's arrival.
pub(super) struct UdpFlow {
    stop: Arc<AtomicBool>,
    pub(super) arrivals: Arrivals,
    sender: JoinHandle<u32>,
    receiver: JoinHandle<u32>,
    echo: JoinHandle<()>,
}

impl UdpFlow {
    pub(super) fn start(pair: &Pair) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let arrivals = Arrivals::default();
        let echo = udp_echo(pair, Arc::clone(&stop));
        let cli_ns = pair.ns("cli");
        let sock = std::thread::spawn(move || {
            tests::netns::enter(&cli_ns);
            let s = UdpSocket::bind(socket_addr(Ipv4Addr::UNSPECIFIED, UDP_CLIENT_PORT)).unwrap();
            s.connect(socket_addr(SERVER, UDP_PORT)).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(100)))
                .unwrap();
            s
        })
        .join()
        .expect("UDP client socket");
        let recv_sock = sock.try_clone().unwrap();
        let (send_stop, recv_stop) = (Arc::clone(&stop), Arc::clone(&stop));
        let sender = std::thread::spawn(move || {
            let start = Instant::now();
            let mut seq: u32 = 0;
            while !send_stop.load(Ordering::Relaxed) && start.elapsed() < FLOW_MAX {
                // A send error (no route during the failover) is a loss.
                let _ = sock.send(&seq.to_be_bytes());
                seq += 1;
                if let Some(wait) = (UDP_GAP * seq).checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            seq
        });
        let recv_arrivals = Arc::clone(&arrivals);
        let receiver =
            std::thread::spawn(move || receive_echoes(&recv_sock, &recv_stop, &recv_arrivals));
        Self {
            stop,
            arrivals,
            sender,
            receiver,
            echo,
        }
    }

    /// Echoes back so far.
    pub(super) fn echoes(&self) -> usize {
        self.arrivals.lock().unwrap().len()
    }

    /// Stops the flow: (datagrams sent, distinct echoes back, arrivals).
    pub(super) fn finish(self) -> (u32, u32, Vec<Instant>) {
        self.stop.store(true, Ordering::Relaxed);
        let sent = self.sender.join().expect("UDP sender");
        let echoed = self.receiver.join().expect("UDP receiver");
        self.echo.join().expect("UDP echo server");
        let arrivals = self.arrivals.lock().unwrap().clone();
        (sent, echoed, arrivals)
    }
}

/// The server's UDP echo until `stop`, once bound.
fn udp_echo(pair: &Pair, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let srv_ns = pair.ns("srv");
    let echo = std::thread::spawn(move || {
        tests::netns::enter(&srv_ns);
        let s = UdpSocket::bind(socket_addr(SERVER, UDP_PORT)).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        tx.send(()).unwrap();
        let start = Instant::now();
        let mut buf = [0u8; 64];
        while !stop.load(Ordering::Relaxed) && start.elapsed() < FLOW_MAX {
            if let Ok((n, peer)) = s.recv_from(&mut buf) {
                let _ = s.send_to(&buf[..n], peer);
            }
        }
    });
    rx.recv_timeout(Duration::from_secs(5))
        .expect("UDP echo bound");
    echo
}

/// The client's receiving side: records each echo's arrival until `stop`
/// (and the echoes still on their way); returns the distinct echoes.
fn receive_echoes(sock: &UdpSocket, stop: &AtomicBool, arrivals: &Arrivals) -> u32 {
    let mut seen = std::collections::HashSet::new();
    let start = Instant::now();
    let mut stopped_at = None;
    let mut buf = [0u8; 64];
    // After the stop, drain the echoes still on their way.
    while stopped_at.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(500))
        && start.elapsed() < FLOW_MAX
    {
        if stopped_at.is_none() && stop.load(Ordering::Relaxed) {
            stopped_at = Some(Instant::now());
        }
        if let Ok(4) = sock.recv(&mut buf) {
            arrivals.lock().unwrap().push(Instant::now());
            seen.insert(u32::from_be_bytes(buf[..4].try_into().unwrap()));
        }
    }
    u32::try_from(seen.len()).unwrap_or(u32::MAX)
}

/// The longest time without an arrival within `[from, to)`, counted from
/// the last arrival before `from`.
pub(super) fn longest_gap(arrivals: &[Instant], from: Instant, to: Instant) -> Duration {
    let mut prev = arrivals
        .iter()
        .copied()
        .filter(|&t| t < from)
        .max()
        .unwrap_or(from);
    let mut gap = Duration::ZERO;
    for &t in arrivals.iter().filter(|&&t| t >= from && t < to) {
        gap = gap.max(t - prev);
        prev = t;
    }
    gap
}

/// Datagrams sent in `[from, to)` whose echo never came back, estimated
/// from the pace: the window's expected echoes minus those that arrived.
pub(super) fn udp_lost_in(arrivals: &[Instant], from: Instant, to: Instant) -> u32 {
    let expected = (to - from).as_secs_f64() / UDP_GAP.as_secs_f64();
    let got = arrivals.iter().filter(|&&t| t >= from && t < to).count();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a count estimate, clamped at zero"
    )]
    let lost = (expected - got as f64).max(0.0).round() as u32;
    lost
}
