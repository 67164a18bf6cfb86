//! The two routers' topology: namespaces, bridges and links, the routers'
//! firewall, the processes the test starts in them, the fast path, and the
//! cleanup of all of it.

use std::{
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use tests::host::{check, load_nft, run, run_ok};
use tests::{HOST_IF, LAN_IF, WAN_IF, counter_of, name_is_free, router_ctl_bin};

use super::{CLIENT, LAN_NET, LAN_VIP, R1, R2, Router, SERVER, SYNC_IF, WAN_VIP};
use crate::ctl::{ctl_in, kill_group, stderr, stdout, wait_for_or_show};

static PAIR_COUNTER: AtomicU32 = AtomicU32::new(0);

/// The name [`Pair`] gives the `router-ctl run` processes it starts.
const DAEMON: &str = "router-ctl run";

const ROLES: [&str; 6] = ["cli", "lan", "r1", "r2", "wan", "srv"];

/// The namespaces, the processes running in them and the run's temporary
/// directory. Drop kills the processes, detaches XDP, deletes the
/// namespaces and the directory, also when the test fails.
pub(super) struct Pair {
    prefix: String,
    dir: PathBuf,
    procs: Mutex<Vec<(String, Child)>>,
    /// The namespaces this pair created: only those are deleted on drop
    /// (a name free when chosen may be another run's by the time
    /// `ip netns add` fails on it).
    created: Mutex<Vec<String>>,
}

impl Pair {
    pub(super) fn new() -> Self {
        assert!(
            tests::is_root(),
            "needs root (network namespaces, veths, BPF): run cargo xtask test"
        );
        let pid = std::process::id();
        let token = tests::run_token();
        let (prefix, dir) = (0..1000)
            .map(|_| {
                let n = PAIR_COUNTER.fetch_add(1, Ordering::SeqCst);
                let p = format!("fo{pid}{token}x{n}");
                let dir = std::env::temp_dir().join(format!("failover-{p}"));
                (p, dir)
            })
            .find(|(p, dir)| {
                !dir.exists() && ROLES.iter().all(|r| name_is_free(&format!("{p}-{r}")))
            })
            .expect("a free namespace prefix");
        std::fs::create_dir(&dir).expect("creating the run directory");
        let pair = Self {
            prefix,
            dir,
            procs: Mutex::new(Vec::new()),
            created: Mutex::new(Vec::new()),
        };
        // From here a panic drops `pair`, which removes what exists.
        pair.build();
        pair
    }

    pub(super) fn ns(&self, role: &str) -> String {
        format!("{}-{role}", self.prefix)
    }

    fn netns_cmd<'a>(ns: &'a str, cmd: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["ip", "netns", "exec", ns];
        v.extend_from_slice(cmd);
        v
    }

    /// `ip netns exec NS CMD`, its output whatever the status.
    pub(super) fn exec(&self, role: &str, cmd: &[&str]) -> Output {
        run(&Self::netns_cmd(&self.ns(role), cmd))
    }

    /// [`Pair::exec`] that panics unless it succeeds; returns stdout.
    pub(super) fn exec_ok(&self, role: &str, cmd: &[&str]) -> String {
        let ns = self.ns(role);
        let full = Self::netns_cmd(&ns, cmd);
        let out = run(&full);
        check(&full, &out);
        stdout(&out)
    }

    /// `ip -n NS ARGS`.
    pub(super) fn ip(&self, role: &str, args: &[&str]) {
        let ns = self.ns(role);
        let mut v = vec!["ip", "-n", ns.as_str()];
        v.extend_from_slice(args);
        run_ok(&v);
    }

    /// A veth from `(role, name)` into a bridge namespace as port `port`;
    /// `to_router`: the port faces a router.
    fn bridge_port(&self, bridge: &str, port: &str, role: &str, name: &str, to_router: bool) {
        let peer_ns = self.ns(role);
        self.ip(
            bridge,
            &[
                "link", "add", port, "type", "veth", "peer", "name", name, "netns", &peer_ns,
            ],
        );
        self.ip(bridge, &["link", "set", port, "master", "br0"]);
        self.ip(bridge, &["link", "set", port, "up"]);
        // Frames a router XDP-redirects into its veth arrive on a port
        // facing it; a veth accepts redirected frames only if it runs NAPI
        // (GRO here). Not on the ports facing hosts: GRO there would merge
        // a host's segments into super-packets before they reach the
        // router's XDP program (which does not take frags), and they would
        // be dropped at the router's egress; a real switch merges nothing.
        // tx checksum offload off on the ports facing a router: what GRO
        // merged there (another router's frames) then leaves towards a
        // router with complete checksums, as its XDP program cannot
        // complete a partial one (see `Topology::switch_port_offloads`).
        let offloads: &[&str] = if to_router {
            &["gro", "on", "tx", "off"]
        } else {
            &["gro", "off"]
        };
        let mut cmd = vec!["ethtool", "-K", port];
        cmd.extend_from_slice(offloads);
        self.exec_ok(bridge, &cmd);
    }

    fn build(&self) {
        for role in ROLES {
            run_ok(&["ip", "netns", "add", &self.ns(role)]);
            self.created.lock().unwrap().push(self.ns(role));
            tests::guard::register(&self.ns(role));
            self.ip(role, &["link", "set", "lo", "up"]);
        }
        for bridge in ["lan", "wan"] {
            self.ip(bridge, &["link", "add", "br0", "type", "bridge"]);
            self.ip(bridge, &["link", "set", "br0", "up"]);
        }
        self.bridge_port("lan", "p-cli", "cli", HOST_IF, false);
        self.bridge_port("wan", "p-srv", "srv", HOST_IF, false);
        for r in [R1, R2] {
            self.bridge_port("lan", &format!("p-{}", r.role), r.role, LAN_IF, true);
            self.bridge_port("wan", &format!("p-{}", r.role), r.role, WAN_IF, true);
        }
        let r2_ns = self.ns(R2.role);
        self.ip(
            R1.role,
            &[
                "link", "add", SYNC_IF, "type", "veth", "peer", "name", SYNC_IF, "netns", &r2_ns,
            ],
        );
        for r in [R1, R2] {
            self.set_up_router(r);
        }
        // End hosts: full checksums (an XDP program cannot complete a
        // partial one) and GRO (NAPI for frames redirected to them).
        for (role, addr, gw) in [("cli", CLIENT, Some(LAN_VIP)), ("srv", SERVER, None)] {
            self.ip(
                role,
                &["addr", "add", &format!("{addr}/24"), "dev", HOST_IF],
            );
            self.ip(role, &["link", "set", HOST_IF, "up"]);
            self.exec_ok(role, &["ethtool", "-K", HOST_IF, "tx", "off", "gro", "on"]);
            // The server has no route back to the LAN: only the routers'
            // SNAT to the WAN VIP makes the flows work.
            if let Some(gw) = gw {
                self.ip(role, &["route", "add", "default", "via", &gw.to_string()]);
            }
        }
    }

    /// Router `r`'s own addresses (not the VIPs), links up, forwarding on,
    /// its firewall.
    fn set_up_router(&self, r: Router) {
        for (addr, prefix, dev) in [
            (r.lan, 24, LAN_IF),
            (r.wan, 24, WAN_IF),
            (r.sync, 30, SYNC_IF),
        ] {
            self.ip(
                r.role,
                &["addr", "add", &format!("{addr}/{prefix}"), "dev", dev],
            );
        }
        for dev in [LAN_IF, WAN_IF, SYNC_IF] {
            self.ip(r.role, &["link", "set", dev, "up"]);
        }
        self.exec_ok(r.role, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        self.install_firewall(r.role);
    }

    /// The example firewall (`examples/failover/firewall.nft`), the same on
    /// both routers (it must be: the backup judges the committed
    /// connections by it after takeover): forward policy drop, LAN -> WAN
    /// and established allowed, SNAT of the LAN to the WAN VIP (only the
    /// LAN's: the router's own packets, VRRP adverts among them, keep its
    /// own address), and no RST from the router for a WAN segment that
    /// finds no connection while a commit runs.
    fn install_firewall(&self, role: &str) {
        let rules = super::ha::fill(
            &super::ha::template("firewall.nft"),
            &[("LAN_NET", LAN_NET), ("WAN_VIP", &WAN_VIP.to_string())],
        );
        load_nft(&self.ns(role), &rules);
    }

    /// Lets a router learn the client's and the server's MACs (the fast
    /// path hands a packet without a neighbour entry to the kernel).
    pub(super) fn warm_neighbours(&self, r: Router) {
        for host in [CLIENT, SERVER] {
            self.exec_ok(r.role, &["ping", "-c", "1", "-W", "2", &host.to_string()]);
        }
    }

    /// Starts `cmd` (a child of this test, in its own process group so the
    /// drop can kill what it forks), its output into `log`.
    pub(super) fn spawn(&self, what: &str, cmd: &mut Command, log: &Path) {
        let out = std::fs::File::create(log).expect("creating a log file");
        let err = out.try_clone().unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        self.procs.lock().unwrap().push((what.to_owned(), child));
    }

    /// Stops every process started and reaps it: the offload daemons with
    /// SIGTERM first (a clean stop removes their status file under
    /// /run/xdp-router), then SIGKILL to the process groups of all.
    fn kill_all(&self) {
        let mut procs = take_all(&self.procs);
        for (what, child) in &mut procs {
            if what == DAEMON
                && matches!(child.try_wait(), Ok(None))
                && let Ok(pid) = libc::pid_t::try_from(child.id())
            {
                // SAFETY: kill(2) on our own unreaped child.
                unsafe {
                    libc::kill(pid, libc::SIGTERM);
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline
            && procs
                .iter_mut()
                .any(|(what, c)| what == DAEMON && matches!(c.try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for (_, mut child) in procs {
            kill_group(&mut child);
        }
        // A daemon that had to be killed left its status file.
        for r in [R1, R2] {
            let _ = std::fs::remove_file(
                Path::new("/run/xdp-router").join(format!("{}.daemon.json", self.ns(r.role))),
            );
        }
    }

    /// A file of the run's temporary directory.
    pub(super) fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The text of [`Pair::file`] `name`, empty if there is none.
    pub(super) fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).unwrap_or_default()
    }

    pub(super) fn router_ctl(&self, r: Router, args: &[&str]) -> Output {
        ctl_in(&self.ns(r.role), &[], args)
    }

    pub(super) fn router_ctl_ok(&self, r: Router, args: &[&str]) -> String {
        let o = self.router_ctl(r, args);
        assert!(
            o.status.success(),
            "router-ctl -n {} {args:?} failed:\n{}{}",
            r.role,
            stdout(&o),
            stderr(&o)
        );
        stdout(&o)
    }

    /// Router `r` attached in offload mode, without its daemon (which
    /// [`Self::start_fast_path`] adds); detached when the pair is dropped.
    pub(super) fn attach(&self, r: Router) {
        let out = self.router_ctl_ok(r, &["attach", LAN_IF, WAN_IF, "--admit", "kernel"]);
        assert!(
            out.contains("kernel"),
            "attach does not say offload mode: {out}"
        );
    }

    /// Offload mode on router `r` and its daemon.
    pub(super) fn start_fast_path(&self, r: Router) {
        self.attach(r);
        let log = format!("{}-daemon.out", r.role);
        self.spawn(
            DAEMON,
            Command::new(router_ctl_bin())
                .args(["-n", &self.ns(r.role), "run", "--listen", "none"])
                .env("RUST_LOG", "debug"),
            &self.file(&log),
        );
        wait_for_or_show(
            "router-ctl run to start",
            Duration::from_secs(10),
            || self.read(&log).contains("stop with Ctrl-C"),
            || self.read(&log),
        );
    }

    /// XDP-forwarded packets of router `r`, both directions.
    pub(super) fn xdp_forwarded(&self, r: Router) -> u64 {
        let out = self.router_ctl_ok(r, &["stats", "--json"]);
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("stats --json: {e}: {out}"));
        counter_of(&v, "fwd_outbound") + counter_of(&v, "fwd_inbound")
    }

    /// Flows router `r`'s XDP table carries for the kernel.
    pub(super) fn offloaded(&self, r: Router) -> usize {
        let out = self.router_ctl_ok(r, &["conntrack", "list", "--json"]);
        let v: Vec<serde_json::Value> = serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("conntrack list --json: {e}: {out}"));
        v.iter().filter(|f| f["offloaded"] == true).count()
    }

    /// Router `r` fails (`up == false`: its LAN, WAN and sync links lose
    /// carrier, as if it lost power) or comes back.
    pub(super) fn set_links(&self, r: Router, up: bool) {
        let state = if up { "up" } else { "down" };
        let port = format!("p-{}", r.role);
        self.ip("lan", &["link", "set", &port, state]);
        self.ip("wan", &["link", "set", &port, state]);
        self.ip(r.role, &["link", "set", SYNC_IF, state]);
    }
}

/// Empties `list` (also after a panic poisoned it: the drop cleans up).
fn take_all<T>(list: &Mutex<Vec<T>>) -> Vec<T> {
    std::mem::take(
        &mut *list
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.kill_all();
        let created = take_all(&self.created);
        // What escaped its process group (or holds a router's lock) first:
        // a detach would wait for it.
        for name in &created {
            tests::kill_processes_in(name);
        }
        for name in created {
            tests::guard::forget(&name);
            // A router's namespace (pins or a record there): detached.
            tests::host::remove_router(&name);
            // Deleting a namespace destroys the veths inside it (and their
            // peers).
            let _ = run(&["ip", "netns", "delete", &name]);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
