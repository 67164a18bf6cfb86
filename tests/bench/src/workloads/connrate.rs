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

use std::fmt::Write as _;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tests::rawbpf::Attached;
use tests::{Ns, SERVER_ADDR, Topology};

use crate::measure::sys::{self, CpuTicks};
use crate::model::{DataPath, FastPathShare, Offload, Wire};
use crate::router::{OffloadCounters, Router, unix_now};

/// The server's port in the first run (apart from iperf2's 5001-7000);
/// each path's run takes the next one (see [`run`]).
pub const FIRST_PORT: u16 = 7100;
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
    /// The topology the connections crossed (set by the caller).
    pub wire: Wire,
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
    /// Sockets on the machine listening to conntrack events during the run
    /// (the most seen at its start and end; an offload run's daemon is
    /// one): the kernel tracks listeners machine-wide, so with any, every
    /// connection of the kernel and offload paths builds its event messages
    /// (see `tests::host::conntrack_event_listeners`).
    pub event_listeners: usize,
    /// Offload path: who forwarded the packets, how many flows the daemon
    /// offloaded (set by the caller, None on the other paths).
    pub fast_path: Option<FastPathShare>,
    /// Offload path: CPU time of the offload daemon per completed
    /// connection, microseconds (set by the caller).
    pub daemon_us_per_conn: Option<f64>,
}

#[cfg(test)]
impl Row {
    /// A row for the report's tests: 16 workers, 100 connections in 1 s,
    /// no offload figures.
    pub fn sample(path: DataPath, wire: Wire, conns_per_s: f64) -> Self {
        Row {
            path,
            wire,
            workers: 16,
            conns_per_s,
            completed: 100,
            failed: 0,
            secs: 1.0,
            cpu_pct: 100.0,
            softirq_us_per_conn: 1.0,
            retransmits: 0,
            event_listeners: 0,
            fast_path: None,
            daemon_us_per_conn: None,
        }
    }
}

/// The median connection rate of `path`'s completed runs on `wire` in
/// `rows` (one per round of `--conn-rate-reps`); `None` when it has none.
#[must_use]
pub fn median_rate(rows: &[Row], wire: Wire, path: DataPath) -> Option<f64> {
    let rates: Vec<f64> = rows
        .iter()
        .filter(|r| r.wire == wire && r.path == path && r.completed > 0)
        .map(|r| r.conns_per_s)
        .collect();
    (!rates.is_empty()).then(|| super::bigtable::median(rates))
}

/// The wires `rows` ran on, the cables first: they are the NIC-like guide
/// (the router receives frames as from a NIC, see `workloads::cable`).
#[must_use]
pub fn wires(rows: &[Row]) -> Vec<Wire> {
    [Wire::Cable, Wire::Veth]
        .into_iter()
        .filter(|&w| rows.iter().any(|r| r.wire == w))
        .collect()
}

/// What [`rounds`] runs, on one topology.
pub struct Rounds {
    pub wire: Wire,
    /// Parallel clients.
    pub workers: u32,
    /// Seconds per run.
    pub secs: u32,
    /// Rounds: each runs every path once.
    pub reps: u32,
    /// Whether the offload path runs too.
    pub offload_path: bool,
}

impl Rounds {
    /// The paths of one round, in order.
    #[must_use]
    pub fn paths(&self) -> Vec<DataPath> {
        let mut paths = vec![DataPath::Kernel, DataPath::Xdp];
        if self.offload_path {
            paths.push(DataPath::Offload);
        }
        paths
    }

    /// The paths of round `round` (0: the first) in the order they run:
    /// each round starts one path later than the one before (kernel, xdp,
    /// offload; then xdp, offload, kernel; ...), so no path always runs
    /// first, on a machine just settled after the previous workload.
    #[must_use]
    pub fn round_order(&self, round: u32) -> Vec<DataPath> {
        let mut paths = self.paths();
        let len = paths.len();
        paths.rotate_left(round as usize % len);
        paths
    }

    /// The runs of all rounds.
    #[must_use]
    pub fn runs(&self) -> usize {
        self.paths().len() * self.reps as usize
    }
}

/// `plan`'s rounds on `t`, round by round so that the paths alternate, a
/// fresh server port per run (see [`run`]). `prepare` readies the
/// topology for a path after the router switched to it (the cables'
/// kernel path needs an `XDP_PASS` program on the router's veths, see
/// `workloads::cable`); what it returns lives for the run. The offload
/// runs also record who forwarded the packets and the daemon's CPU time.
/// Failed runs are recorded in `failures`.
pub fn rounds(
    t: &Topology,
    router: &mut Router<'_>,
    plan: &Rounds,
    prepare: impl Fn(DataPath) -> Result<Option<Attached>, String>,
    stop: &AtomicBool,
    failures: &mut Vec<String>,
) -> Vec<Row> {
    let mut rows = Vec::new();
    let runs = (0..plan.reps).flat_map(|round| plan.round_order(round));
    for (port, path) in (FIRST_PORT..).zip(runs) {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        // Offload::Off (the veths' offloads, not offload mode): TSO/GSO
        // off, MTU-size packets through the router, as on the TCP points.
        let res = router.switch(path, Offload::Off).and_then(|()| {
            let _prepared = prepare(path)?;
            if path == DataPath::Offload {
                offload_run(t, router, plan, port)
            } else {
                run(t, path, plan.wire, port, plan.workers, plan.secs)
            }
        });
        match res {
            Ok(r) => {
                eprintln!("[conn-rate, {}] {}", plan.wire.label(), show(&r));
                rows.push(r);
            }
            Err(e) => failures.push(format!(
                "conn-rate on {}, {}: {e}",
                path.name(),
                plan.wire.label()
            )),
        }
    }
    rows
}

/// A run on the offload path, with who forwarded its packets and the
/// daemon's CPU time per connection.
fn offload_run(t: &Topology, router: &Router<'_>, plan: &Rounds, port: u16) -> Result<Row, String> {
    let before = OffloadCounters::read(t, None)?;
    let daemon = router.daemon_pid();
    let cpu0 = daemon.and_then(sys::process_ticks);
    let mut row = run(
        t,
        DataPath::Offload,
        plan.wire,
        port,
        plan.workers,
        plan.secs,
    )?;
    let cpu1 = daemon.and_then(sys::process_ticks);
    let after = OffloadCounters::read(t, Some(unix_now()))?;
    row.fast_path = Some(before.share_until(after, &[]));
    if let (Some(a), Some(b)) = (cpu0, cpu1)
        && row.completed > 0
    {
        let us = b.saturating_sub(a) as f64 * 1e6 / sys::clk_tck();
        row.daemon_us_per_conn = Some(us / row.completed as f64);
    }
    Ok(row)
}

/// One row as the progress output prints it.
fn show(r: &Row) -> String {
    let mut s = format!(
        "{:<7} {:.0} connections/s ({} done, {} failed, {} segments retransmitted), cpu \
         {:.0}%, {:.1} us softirq per connection",
        r.path.name(),
        r.conns_per_s,
        r.completed,
        r.failed,
        r.retransmits,
        r.cpu_pct,
        r.softirq_us_per_conn,
    );
    if r.event_listeners > 0 {
        let _ = write!(
            s,
            ", {} conntrack event listener(s) on the machine",
            r.event_listeners
        );
    }
    if let Some(fp) = r.fast_path {
        let _ = write!(
            s,
            ", {} flows offloaded, XDP carried {:.1} % of the forwarded pkts",
            fp.flows_offloaded,
            fp.xdp_pct()
        );
    }
    if let Some(us) = r.daemon_us_per_conn {
        let _ = write!(s, ", daemon {us:.1} us CPU per connection");
    }
    s
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

/// One short connection; whether it completed: the reply, then the
/// server's FIN.
///
/// The client closes only after that FIN (the end of the stream), so the
/// server is the active closer and the `TIME_WAIT` state stays on the
/// server (RFC 9293 3.6). Dropping the socket right after the reply races
/// the server's FIN: whenever the client's close wins, the client ends in
/// `TIME_WAIT` (60 s on Linux) on its source port. Such ports add up over
/// a run and across the alternating runs, and every `connect()` then
/// searches the port range past them (`__inet_hash_connect` checking each
/// candidate against its `TIME_WAIT` socket): client CPU that grows with
/// the run's length and hits whichever path runs later, whatever the
/// router does.
fn one_connection(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, IO_TIMEOUT) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_nodelay(true);
    let mut buf = [0u8; REPLY.len()];
    let mut past_reply = [0u8; 1];
    s.write_all(REQUEST).is_ok()
        && s.read_exact(&mut buf).is_ok()
        && &buf == REPLY
        && matches!(s.read(&mut past_reply), Ok(0))
}

/// `workers` clients for `secs` against the server on `port` through the
/// router's current `path`, on the topology `t` (whose wire is `wire`). A fresh port per run, as iperf's: the server's
/// `TIME_WAIT` states of a run (one per client port used, for 60 s) then
/// do not meet the next run's SYNs, so a run does not pay for its
/// predecessor's connections.
pub fn run(
    t: &Topology,
    path: DataPath,
    wire: Wire,
    port: u16,
    workers: u32,
    secs: u32,
) -> Result<Row, String> {
    let addr = SocketAddr::new(SERVER_ADDR.into(), port);
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
    let listeners0 = tests::host::conntrack_event_listeners().len();
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
        wire,
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
        event_listeners: listeners0.max(tests::host::conntrack_event_listeners().len()),
        fast_path: None,
        daemon_us_per_conn: None,
    })
}

#[cfg(test)]
mod checks {
    use std::net::{Ipv4Addr, TcpListener};
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::{DataPath, Rounds, Wire, one_connection, serve};

    /// Connections of the check: enough for the race of a client that
    /// closes without waiting for the server's FIN to leave some of them
    /// in `TIME_WAIT`.
    const CONNS: usize = 300;

    /// `TIME_WAIT` sockets of this network namespace from `/proc/net/tcp`:
    /// (local port, remote port) of each, in host order.
    fn time_wait_ports() -> Vec<(u16, u16)> {
        const TIME_WAIT: &str = "06";
        let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
        let port = |addr: &str| {
            let hex = addr.rsplit(':').next().unwrap_or_default();
            u16::from_str_radix(hex, 16).expect("a hex port in /proc/net/tcp")
        };
        table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                (f.get(3) == Some(&TIME_WAIT)).then(|| (port(f[1]), port(f[2])))
            })
            .collect()
    }

    /// The workload's design holds: the server closes first, so the
    /// `TIME_WAIT` states stay on the server and the client's ports are
    /// free again at once (a client port in `TIME_WAIT` costs every later
    /// `connect()` a longer port search, which made later and longer runs
    /// slower whatever the router did). Over loopback, with the
    /// workload's own client and server.
    #[test]
    fn each_round_starts_with_another_path() {
        let plan = Rounds {
            wire: Wire::Veth,
            workers: 1,
            secs: 1,
            reps: 4,
            offload_path: true,
        };
        let (k, x, o) = (DataPath::Kernel, DataPath::Xdp, DataPath::Offload);
        let order: Vec<Vec<DataPath>> = (0..plan.reps).map(|r| plan.round_order(r)).collect();
        assert_eq!(order, [[k, x, o], [x, o, k], [o, k, x], [k, x, o]]);
    }

    #[test]
    fn the_client_closes_second_and_keeps_no_time_wait() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind on loopback");
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let addr = listener.local_addr().expect("listener address");
        let stop = AtomicBool::new(false);
        let completed = std::thread::scope(|scope| {
            scope.spawn(|| serve(&listener, &stop));
            let completed = (0..CONNS).filter(|_| one_connection(addr)).count();
            stop.store(true, Ordering::Relaxed);
            completed
        });
        assert_eq!(completed, CONNS, "every connection completes");
        let tw = time_wait_ports();
        let on_client = tw
            .iter()
            .filter(|(_, remote)| *remote == addr.port())
            .count();
        let on_server = tw.iter().filter(|(local, _)| *local == addr.port()).count();
        assert_eq!(
            on_client, 0,
            "client sockets left in TIME_WAIT ({on_server} on the server)"
        );
        assert!(
            on_server > 0,
            "the server closed first: TIME_WAIT on the server"
        );
    }
}
