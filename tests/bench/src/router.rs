//! The router under test: switching it between the kernel path, the XDP
//! path (standalone), the offload path (the kernel admits, the daemon
//! offloads, XDP carries), the limit and its flow-table control, veth
//! offload settings, and what it forwarded.

use std::collections::VecDeque;
use std::io::{BufRead as _, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use router_common::maps::DEFAULT_MAX_FLOWS;
use tests::rawbpf::{self, Attached, FlowTable, Insn};
use tests::{HOST_IF, LAN_IF, Ns, Topology, WAN_IF, counter_of, router_ctl_bin};

use crate::model::{DataPath, FastPathShare, Offload};

/// Tracks the router's current path and offload setting, switching only
/// when a run needs another.
pub struct Router<'a> {
    t: &'a Topology,
    state: Option<(DataPath, Offload)>,
    /// The limit's forwarder (or its flow-table control's) while that
    /// path runs.
    limit: Option<Attached>,
    /// The flow-table control's table while that path runs.
    lookup_table: Option<FlowTable>,
    /// Bytes per value of the control's table.
    lookup_value_size: u32,
    /// `attach --max-flows` (None: router-ctl's default).
    max_flows: Option<u32>,
    /// The offload daemon while the offload path runs.
    daemon: Option<Daemon>,
    /// GRO on at the router's interfaces (`--router-gro`).
    gro: bool,
}

/// Lines of the daemon's stderr kept for error messages.
const DAEMON_LOG_LINES: usize = 40;
/// How long the daemon may take to start (it waits for router-ctl's lock,
/// at most 10 s, then dumps the kernel's conntrack table).
const DAEMON_START: Duration = Duration::from_secs(15);
/// How long a stopped daemon may take to exit before it is killed.
const DAEMON_STOP: Duration = Duration::from_secs(5);

/// `router-ctl -n <router> run --listen none` (the offload daemon), in its
/// own process group; stopped (SIGTERM, then SIGKILL) and reaped on drop.
struct Daemon {
    child: Child,
    /// The last lines of its stderr.
    log: Arc<Mutex<VecDeque<String>>>,
    /// The status file it writes (left behind by a SIGKILL).
    status_file: PathBuf,
}

impl Daemon {
    fn start(t: &Topology) -> Result<Self, String> {
        let ns = t.ns_name(Ns::Router);
        let mut child = Command::new(router_ctl_bin())
            .args(["-n", ns, "run"])
            // No status page: its default port is shared by every router
            // on the machine.
            .args(["--listen", "none"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting router-ctl -n {ns} run: {e}"))?;
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(stderr) = child.stderr.take() {
            let sink = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    if line.contains("stop with Ctrl-C") {
                        let _ = tx.send(());
                    }
                    let mut l = sink
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    if l.len() == DAEMON_LOG_LINES {
                        l.pop_front();
                    }
                    l.push_back(line);
                }
            });
        }
        let mut d = Self {
            child,
            log,
            status_file: daemon_status_file(t),
        };
        if rx.recv_timeout(DAEMON_START).is_err() {
            d.stop();
            return Err(format!(
                "router-ctl -n {ns} run did not report readiness within {} s (see its \
                 output below; `router-ctl -n {ns} status` tells what is attached):\n{}",
                DAEMON_START.as_secs(),
                d.log()
            ));
        }
        Ok(d)
    }

    fn log(&self) -> String {
        let l = self
            .log
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        l.iter().map(String::as_str).collect::<Vec<_>>().join("\n")
    }

    /// Whether it still runs (it has exited when this says so).
    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM (it leaves the data path attached and exits), SIGKILL after
    /// [`DAEMON_STOP`]; reaped either way.
    fn stop(&mut self) {
        if self.running() {
            if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
                // SAFETY: signals our own child, which has not been reaped.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            let until = Instant::now() + DAEMON_STOP;
            while self.running() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.status_file);
    }
}

/// The status file of the router's daemon (rewritten every tick, 2 s).
fn daemon_status_file(t: &Topology) -> PathBuf {
    PathBuf::from("/run/xdp-router").join(format!("{}.daemon.json", t.ns_name(Ns::Router)))
}

/// How long to wait for the daemon's next status write (its tick is 2 s).
const DAEMON_STATUS_WAIT: Duration = Duration::from_secs(6);

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The LAN prefix, for the server's route back on the limit path.
const LAN_PREFIX: &str = "192.168.50.0/24";

impl<'a> Router<'a> {
    pub fn new(t: &'a Topology) -> Self {
        Self {
            t,
            state: None,
            limit: None,
            lookup_table: None,
            lookup_value_size: crate::workloads::bigtable::CONTROL_VALUE_FULL,
            max_flows: None,
            daemon: None,
            gro: false,
        }
    }

    /// The router with GRO on or off at its interfaces
    /// (`--router-gro`, see [`apply_offload`]).
    #[must_use]
    pub fn with_gro(mut self, on: bool) -> Self {
        self.gro = on;
        self
    }

    /// The value size of the flow-table control's next table
    /// (default: the router's `FlowEntry`); the next [`Router::switch`]
    /// sets up whatever runs again.
    pub fn set_lookup_value_size(&mut self, bytes: u32) {
        self.lookup_value_size = bytes;
        self.state = None;
    }

    /// The flow-table control's table, while the control runs.
    pub fn lookup_table(&self) -> Option<&FlowTable> {
        self.lookup_table.as_ref()
    }

    /// The flow table capacity of the next XDP attach; the next
    /// [`Router::switch`] re-attaches whatever runs (an empty table).
    pub fn set_max_flows(&mut self, max_flows: Option<u32>) {
        self.max_flows = max_flows;
        self.state = None;
    }

    /// Puts the router on `path` with `offload`. Kernel: forwarding plus
    /// iptables MASQUERADE; xdp: `router-ctl attach --admit xdp`, no
    /// iptables NAT; offload: iptables MASQUERADE, `router-ctl attach
    /// --admit kernel` and the daemon; limit: its raw forwarder and a route
    /// back on the server; lookup: the same with one flow lookup, in a
    /// fresh, empty table of the capacity set by [`Router::set_max_flows`].
    pub fn switch(&mut self, path: DataPath, offload: Offload) -> Result<(), String> {
        if self.state == Some((path, offload)) {
            let dead = self.daemon.as_mut().is_some_and(|d| !d.running());
            if !dead {
                return Ok(());
            }
            if let Some(d) = &self.daemon {
                eprintln!(
                    "      the offload daemon exited; setting the offload path up again:\n{}",
                    d.log()
                );
            }
        }
        self.state = None;
        let t = self.t;
        // Tear down whatever runs now (the daemon before the program it
        // feeds); offloads change only while detached (an attached XDP
        // program pins its peers' TSO off).
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
        if self.limit.take().is_some() {
            let _ = t.exec(Ns::Server, &["ip", "route", "del", LAN_PREFIX]);
        }
        self.lookup_table = None;
        if t.router_attached() {
            let o = t.router_ctl(&["detach"]);
            if !o.status.success() {
                return Err(format!(
                    "router-ctl detach failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                ));
            }
        }
        t.iptables(Ns::Router, &["-t", "nat", "-F"]);
        // Forget the kernel's NAT mappings if conntrack(8) is installed.
        let _ = t.exec(
            Ns::Router,
            &[
                "sh",
                "-c",
                "command -v conntrack >/dev/null && conntrack -F",
            ],
        );
        apply_offload(t, path, offload, self.gro);
        match path {
            DataPath::Kernel => t.masquerade(),
            DataPath::Xdp => self.attach("xdp")?,
            DataPath::Offload => {
                // The kernel path's NAT, which now admits the flows.
                t.masquerade();
                self.attach("kernel")?;
                self.daemon = Some(Daemon::start(t)?);
            }
            DataPath::Limit => {
                self.limit = Some(attach_limit(t, "limit_fwd", &rawbpf::fib_forwarder())?);
            }
            DataPath::Lookup => {
                // As many entries as the router's table of the same
                // capacity (two per flow).
                let flows = self.max_flows.unwrap_or(DEFAULT_MAX_FLOWS);
                let table = FlowTable::create("lookup_flows", self.lookup_value_size, 2 * flows)?;
                let insns = rawbpf::flow_lookup_forwarder(&table, table.packets_off());
                self.limit = Some(attach_limit(t, "lookup_fwd", &insns)?);
                self.lookup_table = Some(table);
            }
        }
        self.state = Some((path, offload));
        Ok(())
    }

    /// `router-ctl attach lan0 wan0 --admit <admit>` with the table size.
    fn attach(&self, admit: &str) -> Result<(), String> {
        let max = self.max_flows.map(|n| n.to_string());
        let mut args = vec!["attach", LAN_IF, WAN_IF, "--admit", admit];
        if let Some(n) = &max {
            args.extend(["--max-flows", n]);
        }
        let o = self.t.router_ctl(&args);
        if o.status.success() {
            Ok(())
        } else {
            Err(format!(
                "router-ctl attach {LAN_IF} {WAN_IF} --admit {admit} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ))
        }
    }

    /// The process id of the offload daemon, if one runs.
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(|d| d.child.id())
    }

    /// Stops the offload daemon, if one runs (before the topology goes).
    pub fn stop_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
        if self.state.is_some_and(|(p, _)| p == DataPath::Offload) {
            self.state = None;
        }
    }
}

/// The limit's forwarder, or another forwarder without NAT (`insns`,
/// loaded as `name`), on the router's `lan0` and `wan0`, and a route back
/// on the server (no NAT: ping replies go to the client's address).
fn attach_limit(t: &Topology, name: &str, insns: &[Insn]) -> Result<Attached, String> {
    let o = t.exec(
        Ns::Server,
        &[
            "ip",
            "route",
            "replace",
            LAN_PREFIX,
            "via",
            &tests::ROUTER_WAN_ADDR.to_string(),
        ],
    );
    if !o.status.success() {
        return Err(format!(
            "route back for the limit: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    let ifs = [
        t.try_ifindex(Ns::Router, LAN_IF)?,
        t.try_ifindex(Ns::Router, WAN_IF)?,
    ];
    t.in_ns(Ns::Router, || Attached::new(name, insns, &ifs))
}

/// ethtool settings of a path and offload mode.
///
/// End hosts keep GRO on in every mode: a veth accepts XDP-redirected
/// frames only when the receiving peer runs NAPI (GRO or XDP), and GRO
/// there only batches the end host's own receive, not what the router sees.
/// The router's GRO is off unless `router_gro` (`--router-gro`): on, as a
/// NIC's driver has it, the kernel path merges a stream's segments; between
/// the XDP cables its tx checksum offload then goes off as well (merged
/// packets cut up again would leave with partial checksums, which the
/// cable's XDP forwards unfinished).
/// The XDP path keeps the end hosts' tx checksum offload off in every mode:
/// with it on, frames reach the XDP program with partial checksums and
/// redirected TCP stalls.
pub fn apply_offload(t: &Topology, path: DataPath, offload: Offload, router_gro: bool) {
    let host: &[&str] = match (offload, path) {
        (Offload::Off, _) => &["tx", "off", "tso", "off", "gso", "off", "gro", "on"],
        (Offload::On, DataPath::Kernel) => &["tx", "on", "tso", "on", "gso", "on", "gro", "on"],
        (Offload::On, DataPath::Xdp | DataPath::Limit | DataPath::Lookup | DataPath::Offload) => {
            &["tx", "off", "tso", "on", "gso", "on", "gro", "on"]
        }
    };
    let segmentation = match offload {
        Offload::Off => "off",
        Offload::On => "on",
    };
    let gro = if router_gro { "on" } else { "off" };
    let mut router = vec!["tso", segmentation, "gso", segmentation, "gro", gro];
    if router_gro && t.has(Ns::CableLan) {
        // Without checksum offload the kernel refuses TSO: the cables run
        // with offloads off only.
        debug_assert_eq!(offload, Offload::Off, "cables with offloads on");
        router.extend_from_slice(&["tx", "off"]);
    }
    let ifs = [
        (Ns::Client, HOST_IF, host),
        (Ns::Server, HOST_IF, host),
        (Ns::Router, LAN_IF, router.as_slice()),
        (Ns::Router, WAN_IF, router.as_slice()),
    ];
    for (ns, dev, feats) in ifs {
        let mut cmd = vec!["ethtool", "-K", dev];
        cmd.extend_from_slice(feats);
        let o = t.exec(ns, &cmd);
        if !o.status.success() {
            eprintln!(
                "warning: ethtool -K {dev} {} in {}: {}",
                feats.join(" "),
                t.ns_name(ns),
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
    }
}

/// The active offload features of the end hosts and the router, for the
/// report.
pub fn offload_state(t: &Topology) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (ns, dev) in [
        (Ns::Client, HOST_IF),
        (Ns::Router, LAN_IF),
        (Ns::Router, WAN_IF),
        (Ns::Server, HOST_IF),
    ] {
        let want = [
            "tx-checksum-ip-generic",
            "tx-tcp-segmentation",
            "generic-segmentation-offload",
            "generic-receive-offload",
        ];
        let feats: Vec<String> = ethtool_features(t, ns, dev)
            .into_iter()
            .filter(|(k, _)| want.contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let role = match ns {
            Ns::Client => "client",
            Ns::Server => "server",
            _ => "router",
        };
        m.insert(format!("{role} {dev}"), feats.join(", ").into());
    }
    m.into()
}

/// Every feature of `dev` as `ethtool -k` shows it: (name, state), the
/// state with a `[requested ...]` or `[fixed]` note where ethtool adds one.
pub fn ethtool_features(t: &Topology, ns: Ns, dev: &str) -> Vec<(String, String)> {
    let out = t.exec(ns, &["ethtool", "-k", dev]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            Some((k.to_owned(), v.trim().to_owned()))
        })
        .collect()
}

/// One feature of [`ethtool_features`].
pub fn ethtool_feature(t: &Topology, ns: Ns, dev: &str, name: &str) -> Option<String> {
    ethtool_features(t, ns, dev)
        .into_iter()
        .find_map(|(k, v)| (k == name).then_some(v))
}

/// Packets the router forwarded so far on `path`: the kernel's
/// `IpForwDatagrams`, plus the fast path's redirects under XDP (standalone
/// or offload).
pub fn forwarded(t: &Topology, path: DataPath) -> u64 {
    let kernel = t.nstat(Ns::Router, "IpForwDatagrams");
    match path {
        DataPath::Kernel => kernel,
        // The limit (and its control) counts nothing: what reached the
        // server came through it.
        DataPath::Limit | DataPath::Lookup => {
            kernel + crate::measure::sampler::rx_packets(t, Ns::Server, &[HOST_IF])
        }
        DataPath::Xdp | DataPath::Offload => {
            let s = t.stats();
            kernel + counter_of(&s, "fwd_outbound") + counter_of(&s, "fwd_inbound")
        }
    }
}

/// The counters an offload run's [`FastPathShare`] is the difference of.
#[derive(Clone, Copy, Debug)]
pub struct OffloadCounters {
    xdp_pkts: u64,
    kernel_pkts: u64,
    offloaded: u64,
}

impl OffloadCounters {
    /// Reads them: the fast path's `fwd_*` counters (`router-ctl stats
    /// --json`), the router's `IpForwDatagrams` and the daemon's count of
    /// offloaded flows from its status file. That file is rewritten once a
    /// tick, so with `written_after` (Unix seconds) this waits for a write
    /// in a later second, which counts everything up to that moment.
    pub fn read(t: &Topology, written_after: Option<u64>) -> Result<Self, String> {
        let file = daemon_status_file(t);
        let until = Instant::now() + DAEMON_STATUS_WAIT;
        let offloaded = loop {
            let status: serde_json::Value = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            let heartbeat = status["heartbeat_unix"].as_u64();
            let offloaded = status["offload"]["offloaded"].as_u64();
            if let (Some(hb), Some(n)) = (heartbeat, offloaded)
                && written_after.is_none_or(|s| hb > s)
            {
                break n;
            }
            if Instant::now() > until {
                return Err(format!(
                    "the offload daemon's status file {} was not {} within {} s (is \
                     `router-ctl -n {} run` hung?): {status}",
                    file.display(),
                    if written_after.is_some() {
                        "rewritten"
                    } else {
                        "written"
                    },
                    DAEMON_STATUS_WAIT.as_secs(),
                    t.ns_name(Ns::Router)
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let s = stats_json(t)?;
        let fwd = |name: &str| s[name]["packets"].as_u64();
        let (Some(out), Some(inb)) = (fwd("fwd_outbound"), fwd("fwd_inbound")) else {
            return Err(format!(
                "router-ctl stats --json has no fwd_* counters: {s}"
            ));
        };
        Ok(Self {
            xdp_pkts: out + inb,
            kernel_pkts: t.nstat(Ns::Router, "IpForwDatagrams"),
            offloaded,
        })
    }

    /// What happened between `self` and `after`, with what the samples in
    /// between show ([`steady_share`]).
    pub fn share_until(self, after: Self, samples: &[FastPathSample]) -> FastPathShare {
        let (peak_flows, steady_xdp_pct) = steady_share(samples);
        FastPathShare {
            xdp_pkts: after.xdp_pkts.saturating_sub(self.xdp_pkts),
            kernel_pkts: after.kernel_pkts.saturating_sub(self.kernel_pkts),
            flows_offloaded: after.offloaded.saturating_sub(self.offloaded),
            peak_flows,
            steady_xdp_pct,
        }
    }
}

/// Now, Unix seconds (for [`OffloadCounters::read`]).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One reading during an offload run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FastPathSample {
    /// Flows in the XDP table (offload mode: an entry per direction, and
    /// only the daemon writes them).
    pub flows: u64,
    /// Packets XDP redirected so far.
    pub xdp_pkts: u64,
    /// Packets the kernel forwarded so far.
    pub kernel_pkts: u64,
}

impl FastPathSample {
    pub fn read(t: &Topology) -> Result<Self, String> {
        let s = stats_json(t)?;
        let n = |v: &serde_json::Value| v.as_u64();
        match (
            n(&s["conntrack"]["entries"]),
            n(&s["fwd_outbound"]["packets"]),
            n(&s["fwd_inbound"]["packets"]),
        ) {
            (Some(entries), Some(out), Some(inb)) => Ok(Self {
                flows: entries / 2,
                xdp_pkts: out + inb,
                kernel_pkts: t.nstat(Ns::Router, "IpForwDatagrams"),
            }),
            _ => Err(format!(
                "router-ctl stats --json lacks conntrack entries or fwd_* counters: {s}"
            )),
        }
    }
}

/// From samples taken once a second: the most flows in the XDP table at
/// once, and XDP's share (%) of the packets forwarded from the first sample
/// with that many flows to the last (once every flow of the run was
/// offloaded; None when that span is empty or nothing moved in it).
pub fn steady_share(samples: &[FastPathSample]) -> (Option<u64>, Option<f64>) {
    let Some(peak) = samples.iter().map(|s| s.flows).max() else {
        return (None, None);
    };
    let (Some(from), Some(to)) = (samples.iter().find(|s| s.flows == peak), samples.last()) else {
        return (Some(peak), None);
    };
    let xdp = to.xdp_pkts.saturating_sub(from.xdp_pkts);
    let all = xdp + to.kernel_pkts.saturating_sub(from.kernel_pkts);
    (
        Some(peak),
        (all > 0).then(|| xdp as f64 * 100.0 / all as f64),
    )
}

fn stats_json(t: &Topology) -> Result<serde_json::Value, String> {
    let o = t.router_ctl(&["stats", "--json"]);
    if !o.status.success() {
        return Err(format!(
            "router-ctl stats --json failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    serde_json::from_slice(&o.stdout).map_err(|e| format!("router-ctl stats --json: {e}"))
}

/// Sets the TCP congestion control of the client and server namespaces
/// (new namespaces inherit the host's, which may be e.g. BBR). Returns the
/// one in force and, when the namespaces may not select it (a non-initial
/// namespace may only pick from the host's
/// `tcp_allowed_congestion_control`), the algorithm to request per socket
/// instead (`iperf -Z`, allowed with `CAP_NET_ADMIN`).
pub fn congestion_control(t: &Topology, want: &str) -> (String, Option<String>) {
    let key = "net.ipv4.tcp_congestion_control";
    let now = || {
        let o = t.exec(Ns::Client, &["sysctl", "-n", key]);
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    };
    let orig = now();
    if want == "keep" {
        return (orig, None);
    }
    for ns in [Ns::Client, Ns::Server] {
        let o = t.exec(ns, &["sysctl", "-qw", &format!("{key}={want}")]);
        if !o.status.success() {
            // Leave both ends alike.
            let _ = t.exec(Ns::Client, &["sysctl", "-qw", &format!("{key}={orig}")]);
            let available =
                std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
                    .unwrap_or_default();
            if available.split_whitespace().any(|a| a == want) {
                eprintln!(
                    "bench: the namespaces may not select TCP congestion control {want}; the \
                     iperf2 clients request it per socket (-Z {want})"
                );
                return (
                    format!("{want} (per socket, iperf -Z)"),
                    Some(want.to_owned()),
                );
            }
            eprintln!(
                "bench: TCP congestion control {want} is not available (available: {}); \
                 keeping {orig}",
                available.trim()
            );
            return (orig, None);
        }
    }
    (now(), None)
}

#[cfg(test)]
mod unit {
    use super::*;

    fn sample(flows: u64, xdp_pkts: u64, kernel_pkts: u64) -> FastPathSample {
        FastPathSample {
            flows,
            xdp_pkts,
            kernel_pkts,
        }
    }

    #[test]
    fn steady_share_counts_from_the_first_sample_with_every_flow() {
        let ramp = [
            sample(0, 0, 0),
            sample(50, 100, 400),
            sample(100, 1000, 500),
            sample(100, 1990, 510),
            sample(99, 2980, 520),
        ];
        let (peak, share) = steady_share(&ramp);
        assert_eq!(peak, Some(100));
        // (2980 - 1000) of (2980 - 1000) + (520 - 500).
        assert!((share.unwrap() - 99.0).abs() < 1e-9, "{share:?}");
        // The peak in the last sample: no span after it.
        assert_eq!(steady_share(&ramp[..3]), (Some(100), None));
        assert_eq!(steady_share(&[]), (None, None));
    }
}
