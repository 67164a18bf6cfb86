//! One iperf2 run: a fresh server (or the discard sink) per run, the
//! client bounded by `timeout -k`, ping alongside, the sampler over the
//! router's and the server's counters; then the counters turned into
//! figures.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use tests::{Ns, SERVER_ADDR, Topology};

use crate::measure::hosts::HostTcp;
use crate::measure::parse::{ClientCsv, parse_client_csv, parse_ping, parse_server_udp};
use crate::measure::sampler::{Sample, Sampler, Window, active_window, wait_quiet, window_ending};
use crate::measure::sys::CpuTicks;
use crate::measure::{Measured, read, unix_now};
use crate::model::{DataPath, Point, RunResult, Settings, TcpSink, Workload};
use crate::router::forwarded;
use crate::workloads::discard::DiscardSink;
use crate::workloads::procs::{Watched, kill_group, spawn_sh};
use crate::workloads::start_ping;

/// What receives the load.
enum Server {
    Iperf(Watched),
    Discard(DiscardSink),
}

/// One run's files and time limits.
struct Plan<'a> {
    s: &'a Settings,
    point: Point,
    port: u16,
    srv_out: PathBuf,
    ping_out: PathBuf,
    cli_out: PathBuf,
    cli_err: PathBuf,
    /// Seconds of load before the measured window (TCP).
    ramp: f64,
    /// iperf2's `-t`.
    t_arg: u32,
    /// Seconds after which `timeout` stops the client.
    limit: u32,
}

impl<'a> Plan<'a> {
    fn new(s: &'a Settings, path: DataPath, point: Point, port: u16) -> Self {
        let w = point.workload;
        let tag = format!("{}-{}-{port}", path.name(), w.name());
        let file = |ext: &str| s.tmp.join(format!("{tag}.{ext}"));
        // TCP: the client runs until stopped: ramp-up, then `secs` measured;
        // `-t` leaves room so that no stream ends inside the window. UDP runs
        // to its own end (the server reports loss only then).
        let ramp = ramp_secs(point.conns);
        let t_arg = if w.is_udp() {
            s.secs
        } else {
            s.secs + ramp.ceil() as u32 + 2
        };
        Self {
            s,
            point,
            port,
            srv_out: file("server.csv"),
            ping_out: file("ping.txt"),
            cli_out: file("client.csv"),
            cli_err: file("client.err"),
            ramp,
            t_arg,
            limit: client_limit(t_arg, s.slack, point.conns),
        }
    }

    fn udp(&self) -> bool {
        self.point.workload.is_udp()
    }
}

/// A fresh server per run, bounded in time: `iperf -s` for UDP (its loss
/// accounting) and with `--tcp-sink iperf`, else the discard sink.
fn start_server(t: &Topology, p: &Plan<'_>) -> Result<Server, String> {
    let port = p.port;
    if !p.udp() && p.s.tcp_sink == TcpSink::Discard {
        let addr = std::net::SocketAddr::new(SERVER_ADDR.into(), port);
        return Ok(Server::Discard(DiscardSink::start(
            t.ns_name(Ns::Server),
            addr,
        )?));
    }
    let udp_flag = if p.udp() { " -u" } else { "" };
    let server = spawn_sh(
        t,
        Ns::Server,
        &format!(
            "exec timeout -k 2 {} iperf -s{udp_flag} -p {port} -y C > {} 2>&1",
            p.limit + 5,
            p.srv_out.display()
        ),
    );
    if !wait_listening(t, port, p.udp()) {
        let _ = server.finish();
        return Err(format!(
            "iperf -s on port {port} did not start: {}",
            read(&p.srv_out)
        ));
    }
    Ok(Server::Iperf(server))
}

/// The client's command line, `timeout` included.
fn client_args(p: &Plan<'_>) -> Result<Vec<String>, String> {
    let mut args: Vec<String> = ["timeout", "-k", "3"].map(str::to_owned).to_vec();
    args.push(p.limit.to_string());
    args.extend(["iperf", "-c"].map(str::to_owned));
    args.push(SERVER_ADDR.to_string());
    for (flag, value) in [
        ("-p", p.port.to_string()),
        ("-t", p.t_arg.to_string()),
        ("-P", p.point.conns.to_string()),
        ("-y", "C".to_owned()),
    ] {
        args.extend([flag.to_owned(), value]);
    }
    if let (Some(cc), false) = (&p.s.cc_per_socket, p.udp()) {
        args.extend(["-Z".to_owned(), cc.clone()]);
    }
    // Per stream: each stream paced at its share, the total is the line rate.
    let (paced_kbps, paced_len) = paced_stream(p.s.line_rate_mbps, p.point.conns);
    let (paced, paced_len) = (format!("{paced_kbps}k"), paced_len.to_string());
    let paced_args: &[&str] = if p.s.pacing.by_kernel(p.point.conns) {
        &["--fq-rate", &paced]
    } else {
        &["-b", &paced, "-l", &paced_len]
    };
    let extra: &[&str] = match p.point.workload {
        Workload::Tcp => &[],
        Workload::TcpPaced => paced_args,
        Workload::TcpSmall if p.point.nodelay => &["-l", "128", "-N"],
        Workload::TcpSmall => &["-l", "128"],
        // `-b 0` fails in iperf 2.1.8; a rate no veth reaches is unlimited.
        Workload::UdpSmall => &["-u", "-l", "64", "-b", "10G"],
        Workload::UdpLive => return Err("udp-live runs through live::run, not iperf2".into()),
    };
    args.extend(extra.iter().map(|&a| a.to_owned()));
    Ok(args)
}

/// iperf2's TCP write length when `-l` is not given.
const DEFAULT_TCP_LEN: u64 = 128 * 1024;

/// A paced stream's `-b` in kbit/s and its write length in bytes: the line
/// rate split over `conns` streams; writes of an eighth of a second's bytes
/// (at most the default 128 KiB, at least 1 KiB, whole KiB). iperf2 refuses
/// a write length above about a fifth of a second's bytes ("option -b and
/// -l of 131072 are incompatible"), so a slow stream (2.5 Gbit/s over 1000
/// streams: 2.5 Mbit/s each) needs shorter writes than the default.
fn paced_stream(line_rate_mbps: u32, conns: u32) -> (u64, u64) {
    let kbps = (u64::from(line_rate_mbps) * 1000 / u64::from(conns.max(1))).max(1);
    let eighth_second_bytes = kbps * 1000 / 8 / 8;
    let len = (eighth_second_bytes / 1024 * 1024).clamp(1024, DEFAULT_TCP_LEN);
    (kbps, len)
}

/// The client run and the counters around it.
struct ClientRun {
    out: Output,
    /// Seconds after the start at which the bench stopped the client.
    stopped: Option<f64>,
    client_done: Instant,
    wall_s: f64,
    start_unix: f64,
    cpu: CpuTicks,
    readings: Vec<Sample>,
}

/// Runs the client with ping and the sampler alongside.
fn drive(t: &Topology, p: &Plan<'_>, args: &[String]) -> Result<ClientRun, String> {
    let cpu0 = CpuTicks::now();
    let start = Instant::now();
    let start_unix = unix_now();
    let sampler = Sampler::start(t, start, Duration::from_millis(100));
    // Output to files, not pipes: thousands of streams' reports would fill
    // a pipe nobody reads while we wait.
    let file = |p: &Path| std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()));
    let mut client = Command::new("ip")
        .args(["netns", "exec", t.ns_name(Ns::Client)])
        .args(args)
        .stdin(Stdio::null())
        .stdout(file(&p.cli_out)?)
        .stderr(file(&p.cli_err)?)
        .spawn()
        .map_err(|e| format!("spawning iperf -c: {e}"))?;
    // Ping alongside until the client ends; only the samples inside the
    // active window count.
    let ping = start_ping(t, p.s, &p.ping_out, p.limit, None);
    let waited = wait_client(&mut client, &sampler, start, p);
    let (status, stopped) = match waited {
        Ok(x) => x,
        Err(e) => {
            kill_group(&client);
            let _ = client.wait();
            let _ = ping.finish();
            sampler.finish();
            return Err(e);
        }
    };
    let out = Output {
        status,
        stdout: std::fs::read(&p.cli_out).unwrap_or_default(),
        stderr: std::fs::read(&p.cli_err).unwrap_or_default(),
    };
    let client_done = Instant::now();
    let wall_s = start.elapsed().as_secs_f64();
    let cpu = cpu0.until(CpuTicks::now());
    let readings = sampler.finish();
    let _ = ping.finish();
    Ok(ClientRun {
        out,
        stopped,
        client_done,
        wall_s,
        start_unix,
        cpu,
        readings,
    })
}

/// Waits for the client. TCP: stops it once the load has run for `secs`
/// after the ramp-up (plus a little for the window's edges). With
/// thousands of streams iperf2 spends many seconds after `-t` draining
/// what it queued in socket buffers, as bulk segments; that is not the
/// workload any more. `timeout` is the bound if the load never starts.
fn wait_client(
    client: &mut std::process::Child,
    sampler: &Sampler,
    start: Instant,
    p: &Plan<'_>,
) -> Result<(ExitStatus, Option<f64>), String> {
    loop {
        match client.try_wait() {
            Ok(Some(st)) => return Ok((st, None)),
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for iperf -c: {e}")),
        }
        let now = start.elapsed().as_secs_f64();
        let due = sampler
            .started()
            .is_some_and(|at| now >= at + p.ramp + f64::from(p.s.secs));
        if due && !p.udp() {
            kill_group(client);
            let st = client
                .wait()
                .map_err(|e| format!("waiting for iperf -c: {e}"))?;
            return Ok((st, Some(now)));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How the server ended.
struct ServerEnd {
    /// When it exited by itself, if it did.
    exited: Option<Instant>,
    status: String,
    /// Connections the discard sink accepted.
    accepted: Option<u64>,
}

fn finish_server(server: Server, p: &Plan<'_>) -> ServerEnd {
    match server {
        Server::Iperf(server) => {
            // UDP: the server writes its report when the client's final
            // datagram arrives; give it a moment.
            let exited = if p.udp() {
                let deadline = Instant::now() + Duration::from_secs(3);
                while Instant::now() < deadline
                    && parse_server_udp(&read(&p.srv_out)).streams < p.point.conns
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                server.exited_at(Duration::ZERO)
            } else {
                server.exited_at(Duration::from_millis(200))
            };
            let status = server.finish().1;
            ServerEnd {
                exited,
                status,
                accepted: None,
            }
        }
        Server::Discard(sink) => ServerEnd {
            exited: None,
            status: String::new(),
            accepted: Some(sink.finish().1),
        },
    }
}

/// Whether the run was cut short, and whether so badly that its figures
/// are doubtful (worth a rerun), as opposed to a client that only overran
/// its time.
#[derive(Default)]
struct Verdict {
    cut_short: bool,
    suspect: bool,
    notes: Vec<String>,
    connect_failures: u32,
}

impl Verdict {
    fn cut(&mut self, suspect: bool, note: String) {
        self.cut_short = true;
        self.suspect |= suspect;
        self.notes.push(note);
    }
}

/// Judges how the client and the server ended; errors for runs with
/// nothing to measure.
fn judge(
    p: &Plan<'_>,
    path: DataPath,
    run: &ClientRun,
    c: &ClientCsv,
    srv: &ServerEnd,
) -> Result<Verdict, String> {
    let stderr = String::from_utf8_lossy(&run.out.stderr);
    let status = run.out.status;
    let conns = p.point.conns;
    let mut v = Verdict::default();
    let code = status.code();
    let timed_out = matches!(code, Some(124 | 137)) || code.is_none();
    let limit = p.limit;
    if run.stopped.is_some() {
        // Stopped by us after ramp-up and the window: by design.
    } else if !p.udp() {
        // A TCP client should still be sending when we stop it.
        let why = if timed_out {
            format!("stopped by timeout after {limit} s")
        } else {
            format!("exited with {status}")
        };
        v.cut(
            true,
            format!(
                "iperf -c {why} before {:.0} s of ramp-up and {} s of traffic",
                p.ramp, p.s.secs
            ),
        );
    } else if timed_out {
        v.cut(
            false,
            format!("iperf -c stopped by timeout after {limit} s"),
        );
    } else if !status.success() {
        v.notes.push(format!("iperf -c exited with {status}"));
    }
    if stderr.contains("Too many open files") {
        return Err(format!(
            "iperf2 could not open {conns} connections: \"Too many open files\" (RLIMIT_NOFILE \
             is {}; raise the hard limit, e.g. `ulimit -Hn 65536` as root, or pass fewer \
             --conns)",
            p.s.nofile
        ));
    }
    v.connect_failures = u32::try_from(stderr.matches("connect failed").count()).unwrap_or(0);
    if c.streams == 0 && run.stopped.is_none() {
        return Err(format!(
            "iperf2 reported no stream for {} on the {} path ({} connect failures); \
             stderr: {}",
            p.point,
            path.name(),
            v.connect_failures,
            stderr.lines().take(5).collect::<Vec<_>>().join(" | ")
        ));
    }
    if c.streams < conns && run.stopped.is_none() {
        let few = c.streams * 10 < conns * 9;
        v.cut(few, format!("{} of {conns} streams reported", c.streams));
    }
    if let Some(n) = srv.accepted
        && n < u64::from(conns)
    {
        let few = n * 10 < u64::from(conns) * 9;
        v.cut(few, format!("the sink accepted {n} of {conns} connections"));
    }
    if v.connect_failures > 0 {
        v.notes
            .push(format!("{} connect failures", v.connect_failures));
    }
    if let Some(at) = srv.exited
        && at < run.client_done
    {
        v.cut(
            true,
            format!("iperf -s died during the run ({})", srv.status),
        );
    }
    Ok(v)
}

/// Runs one point on the router's current path.
pub fn run(
    t: &Topology,
    s: &Settings,
    path: DataPath,
    point: Point,
    port: u16,
) -> Result<RunResult, String> {
    let quiet_wait_s = wait_quiet(t, 2000, Duration::from_secs(10));
    let plan = Plan::new(s, path, point, port);
    let server = start_server(t, &plan)?;
    let args = match client_args(&plan) {
        Ok(a) => a,
        Err(e) => {
            finish_server(server, &plan);
            return Err(e);
        }
    };
    let drops0 = plan.udp().then(|| t.nstat(Ns::Server, "UdpRcvbufErrors"));
    let hosts0 = (!plan.udp()).then(|| HostTcp::read(t));
    let fwd0 = forwarded(t, path);
    let driven = drive(t, &plan, &args);
    let fwd1 = forwarded(t, path);
    let host_tcp = hosts0.map(|h0| HostTcp::read(t).since(h0));
    let srv = finish_server(server, &plan);
    let run = driven?;
    let csv = parse_client_csv(&String::from_utf8_lossy(&run.out.stdout));
    let mut verdict = judge(&plan, path, &run, &csv, &srv)?;

    let found = match run.stopped {
        Some(at) => window_ending(&run.readings, at, f64::from(s.secs)),
        None => active_window(&run.readings),
    };
    let router_pkts = fwd1.saturating_sub(fwd0);
    verdict.suspect |= found.is_none();
    let window = found.unwrap_or_else(|| {
        verdict
            .notes
            .push("no traffic seen by the sampler: whole-run figures".into());
        Window {
            from: 0.0,
            secs: run.wall_s,
            cpu: run.cpu,
            pkts: router_pkts,
            ..Window::default()
        }
    });
    let pings = parse_ping(&read(&plan.ping_out)).within(run.start_unix, &window);
    let mut r = RunResult::new(
        path,
        point,
        Measured {
            window,
            pings,
            run_cpu: run.cpu,
            router_pkts,
            wall_s: run.wall_s,
            quiet_wait_s,
        },
    );
    // Nothing when the client was stopped before it reported.
    if csv.secs > 0.0 && run.stopped.is_none() {
        r.iperf_gbps = csv.bytes as f64 * 8.0 / csv.secs / 1e9;
    }
    if plan.udp() {
        r.sink_drops = drops0.map_or(0, |d0| {
            t.nstat(Ns::Server, "UdpRcvbufErrors").saturating_sub(d0)
        });
        udp_figures(&mut r, &mut verdict, &plan, &csv);
    } else {
        r.pps = window.pkts as f64 / window.secs.max(1e-9);
        r.gbps = if window.sink_bytes > 0 {
            window.sink_bytes as f64 * 8.0 / window.secs.max(1e-9) / 1e9
        } else {
            r.iperf_gbps
        };
    }
    r.host_tcp = host_tcp;
    r.stream_s = csv.secs;
    r.streams = csv.streams;
    r.connect_failures = verdict.connect_failures;
    r.cut_short = verdict.cut_short;
    r.suspect = verdict.suspect;
    r.notes = verdict.notes;
    Ok(r)
}

/// UDP throughput and loss, as the iperf2 server counted them.
fn udp_figures(r: &mut RunResult, v: &mut Verdict, p: &Plan<'_>, c: &ClientCsv) {
    let srv = parse_server_udp(&read(&p.srv_out));
    if srv.streams < p.point.conns {
        v.cut(
            true,
            format!(
                "server reported {} of {} UDP streams",
                srv.streams, p.point.conns
            ),
        );
    }
    r.sent_pps = c.bytes as f64 / 64.0 / c.secs.max(1e-9);
    r.pps = if srv.secs > 0.0 {
        srv.received as f64 / srv.secs
    } else {
        0.0
    };
    r.lost = srv.lost;
    let total = srv.received + srv.lost;
    r.loss_pct = if total > 0 {
        srv.lost as f64 * 100.0 / total as f64
    } else {
        f64::NAN
    };
    r.gbps = r.pps * 64.0 * 8.0 / 1e9;
}

/// Waits until something listens on `port` in the server namespace.
fn wait_listening(t: &Topology, port: u16, udp: bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    let flag = if udp { "-Hlun" } else { "-Hltn" };
    let filter = format!("sport = :{port}");
    while Instant::now() < deadline {
        let o = t.exec(Ns::Server, &["ss", flag, &filter]);
        if !String::from_utf8_lossy(&o.stdout).trim().is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Seconds of load before the measured window of a TCP run: thousands of
/// iperf2 threads take seconds to connect and get going on two cores.
pub fn ramp_secs(conns: u32) -> f64 {
    1.0 + f64::from(conns) / 500.0
}

/// The next iperf2 port: a fresh one per run, so that nothing a previous
/// run left behind (a server in its last seconds, `TIME_WAIT`) meets the next.
pub fn next_port(port: &mut u16) {
    *port = if *port >= 7000 { 5001 } else { *port + 1 };
}

/// Time allowed for a client run before `timeout` stops it: iperf2 with
/// thousands of streams overruns `-t` by seconds.
pub fn client_limit(secs: u32, slack: u32, conns: u32) -> u32 {
    secs + slack + conns / 50
}

#[cfg(test)]
mod checks {
    use std::path::PathBuf;

    use super::{Plan, client_args, paced_stream};
    use crate::model::{DataPath, Offload, Pacing, Point, Settings, TcpSink, Workload};

    #[test]
    fn paced_streams_are_paced_by_the_kernel_or_by_iperf2() {
        let mut s = Settings {
            tcp_sink: TcpSink::Discard,
            pacing: Pacing::Fq,
            secs: 2,
            slack: 10,
            ping_interval: 0.02,
            tmp: PathBuf::from("/nonexistent"),
            nofile: 4096,
            cc_per_socket: None,
            line_rate_mbps: 2500,
            router_gro: false,
        };
        let point = Point::new(Workload::TcpPaced, 1000, Offload::Off);
        let args = |s: &Settings| {
            client_args(&Plan::new(s, DataPath::Kernel, point, 5001))
                .unwrap()
                .join(" ")
        };
        // 2.5 Gbit/s over 1000 streams.
        assert!(
            args(&s).ends_with(" -P 1000 -y C --fq-rate 2500k"),
            "{}",
            args(&s)
        );
        s.pacing = Pacing::Iperf;
        assert!(
            args(&s).ends_with(" -P 1000 -y C -b 2500k -l 38912"),
            "{}",
            args(&s)
        );
    }

    #[test]
    fn paced_streams_write_what_iperf2_accepts() {
        // One stream at 2.5 Gbit/s: the default length.
        assert_eq!(paced_stream(2500, 1), (2_500_000, 128 * 1024));
        // 1000 streams of 2.5 Mbit/s: iperf2 said "-l 56250 or lower".
        let (kbps, len) = paced_stream(2500, 1000);
        assert_eq!((kbps, len), (2500, 38 * 1024));
        assert!(len <= 56_250);
        // Very slow streams still write at least 1 KiB.
        assert_eq!(paced_stream(1, 2000), (1, 1024));
    }
}
