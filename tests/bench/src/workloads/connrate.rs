//! Connection setup rate: short TCP connections (connect, one request, one
//! reply, close), many in parallel, through the router: the cost of
//! setting a flow up, where the paths differ most (the kernel creates a
//! conntrack entry and runs NAT setup per connection; standalone XDP
//! admits the flow itself; offload leaves the setup to the kernel, and its
//! daemon offloads each connection once established, shortly before it
//! ends).
//!
//! A small client and server of our own, bounded in count and time: the
//! server (threads in the server namespace) answers each request with a
//! reply and closes first, so the `TIME_WAIT` states stay on the server and
//! the client's ports are free again at once; the client (one thread per
//! worker in the client namespace) loops until the time is up.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tests::{Ns, SERVER_ADDR, Topology};

use crate::measure::sys::CpuTicks;
use crate::model::{DataPath, FastPathShare};

/// The server's port (apart from iperf2's 5001-7000).
const PORT: u16 = 7100;
const REQUEST: &[u8; 16] = b"GET /conn-rate\r\n";
const REPLY: &[u8; 16] = b"200 ok, goodbye\n";
/// Accepting threads of the server.
const SERVER_THREADS: usize = 2;
/// Most connections of one run, whatever the time: a bound on the load.
const MAX_CONNS: u64 = 500_000;
/// Connect, read and write timeout of one connection.
const IO_TIMEOUT: Duration = Duration::from_secs(1);

/// What one run measured.
pub struct Row {
    pub path: DataPath,
    pub workers: u32,
    /// Completed connections per second.
    pub conns_per_s: f64,
    pub completed: u64,
    pub failed: u64,
    pub secs: f64,
    /// Busy share of the machine, %.
    pub cpu_pct: f64,
    /// Machine softirq time per completed connection, microseconds.
    pub softirq_us_per_conn: f64,
    /// TCP segments the client and the server retransmitted (a lost
    /// handshake or reply costs a retransmission timeout, 200 ms or more).
    pub retransmits: u64,
    /// Offload path: who forwarded the packets, how many flows the daemon
    /// offloaded (set by the caller, None on the other paths).
    pub fast_path: Option<FastPathShare>,
}

/// Serves until `stop`: accept, read the request, reply, close.
fn serve(listener: &TcpListener, stop: &AtomicBool) {
    let mut buf = [0u8; REQUEST.len()];
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(IO_TIMEOUT));
                if s.read_exact(&mut buf).is_ok() {
                    let _ = s.write_all(REPLY);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(_) => {}
        }
    }
}

/// One short connection; whether it completed.
fn one_connection(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, IO_TIMEOUT) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_nodelay(true);
    let mut buf = [0u8; REPLY.len()];
    s.write_all(REQUEST).is_ok() && s.read_exact(&mut buf).is_ok() && &buf == REPLY
}

/// `workers` clients for `secs` against the server through the router's
/// current `path`.
pub fn run(t: &Topology, path: DataPath, workers: u32, secs: u32) -> Result<Row, String> {
    let addr = SocketAddr::new(SERVER_ADDR.into(), PORT);
    let listener = t
        .in_ns(Ns::Server, || TcpListener::bind(addr))
        .map_err(|e| format!("conn-rate server on {addr}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("conn-rate server: {e}"))?;
    let stop = AtomicBool::new(false);
    let (done, failed) = (AtomicU64::new(0), AtomicU64::new(0));
    let deadline = Duration::from_secs(secs.into());
    let retransmits =
        || t.nstat(Ns::Client, "TcpRetransSegs") + t.nstat(Ns::Server, "TcpRetransSegs");
    let retrans0 = retransmits();
    let ticks0 = CpuTicks::now();
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..SERVER_THREADS {
            // Accepted sockets belong to the listener's namespace, so the
            // server threads need not enter it.
            scope.spawn(|| serve(&listener, &stop));
        }
        let clients: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    t.in_ns(Ns::Client, || {
                        while start.elapsed() < deadline
                            && done.load(Ordering::Relaxed) + failed.load(Ordering::Relaxed)
                                < MAX_CONNS
                        {
                            let c = if one_connection(addr) { &done } else { &failed };
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                    });
                })
            })
            .collect();
        for c in clients {
            let _ = c.join();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let secs = start.elapsed().as_secs_f64();
    let cpu = ticks0.until(CpuTicks::now());
    let completed = done.load(Ordering::Relaxed);
    Ok(Row {
        path,
        workers,
        conns_per_s: completed as f64 / secs.max(1e-9),
        completed,
        failed: failed.load(Ordering::Relaxed),
        secs,
        cpu_pct: cpu.busy_pct(),
        softirq_us_per_conn: if completed > 0 {
            cpu.softirq_ns() / completed as f64 / 1000.0
        } else {
            f64::NAN
        },
        retransmits: retransmits().saturating_sub(retrans0),
        fast_path: None,
    })
}
