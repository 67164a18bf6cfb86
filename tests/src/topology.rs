//! Network-namespace topologies for the XDP NAT router.
//!
//! ```text
//! client (eth0 192.168.50.2) --veth-- (lan0 192.168.50.1) router (wan0 203.0.113.1) --veth-- (eth0 203.0.113.2) server
//! ```
//!
//! All traffic stays inside namespaces created here. Their names are unique
//! per process and topology (`rt<pid>x<counter>-<role>`) and [`Topology`]'s
//! `Drop` deletes exactly those namespaces (also while unwinding from a
//! panic) and kills the processes it spawned. Helpers panic on failure.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::addr::{
    BRIDGE_IF, CLIENT_ADDR, CLIENT2_ADDR, HOST_IF, LAN_IF, PIN_ROOT, ROUTER_LAN_ADDR,
    ROUTER_WAN_ADDR, SERVER_ADDR, WAN_IF,
};
use crate::echo::{self, EchoServer};
use crate::host::{CMD_TIMEOUT, check, is_root, parse_snmp, router_ctl_bin, run, run_ok};
use crate::netns;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A namespace role in a topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ns {
    Client,
    Client2,
    Router,
    Server,
    Switch,
    /// The "cable" between client and router ([`crate::bench_topology`]).
    CableLan,
    /// The "cable" between router and server ([`crate::bench_topology`]).
    CableWan,
    /// A second router ([`crate::two_routers`]).
    Router2,
    /// The LAN host behind [`Ns::Router2`].
    Router2Client,
}

impl Ns {
    fn suffix(self) -> &'static str {
        match self {
            Ns::Client => "cli",
            Ns::Client2 => "cli2",
            Ns::Router => "rtr",
            Ns::Server => "srv",
            Ns::Switch => "sw",
            Ns::CableLan => "cl",
            Ns::CableWan => "cw",
            Ns::Router2 => "rtr2",
            Ns::Router2Client => "cli3",
        }
    }
}

/// A set of network namespaces wired as client(s) - router - server.
pub struct Topology {
    names: Vec<(Ns, String)>,
    /// The names this object created: only those are deleted on drop (a
    /// name that was free when chosen may be another run's by the time
    /// `ip netns add` fails on it).
    created: Mutex<Vec<String>>,
    children: Mutex<Vec<u32>>,
}

impl Topology {
    /// client - router - server, each joined by one veth pair.
    #[must_use]
    pub fn new() -> Self {
        let t = Self::alloc(&[Ns::Client, Ns::Router, Ns::Server]);
        // `t` is a live local from here on: a panic during setup drops it and
        // deletes whatever namespaces were already created.
        t.create_namespaces();
        let (cli, rtr) = (t.ns_name(Ns::Client), t.ns_name(Ns::Router));
        run_ok(&[
            "ip", "-n", rtr, "link", "add", LAN_IF, "type", "veth", "peer", "name", HOST_IF,
            "netns", cli,
        ]);
        t.setup_client(Ns::Client, CLIENT_ADDR);
        t.setup_router_and_server();
        t
    }

    /// Two clients and the router's LAN joined by a bridge in a switch namespace.
    #[must_use]
    pub fn with_two_clients() -> Self {
        let t = Self::alloc(&[Ns::Client, Ns::Client2, Ns::Switch, Ns::Router, Ns::Server]);
        t.create_namespaces();
        let sw = t.ns_name(Ns::Switch);
        run_ok(&["ip", "-n", sw, "link", "add", BRIDGE_IF, "type", "bridge"]);
        let ports = [
            ("p0", Ns::Router, LAN_IF),
            ("p1", Ns::Client, HOST_IF),
            ("p2", Ns::Client2, HOST_IF),
        ];
        for (port, peer_ns, peer_if) in ports {
            let peer = t.ns_name(peer_ns);
            run_ok(&[
                "ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", peer_if,
                "netns", peer,
            ]);
            run_ok(&["ip", "-n", sw, "link", "set", port, "master", BRIDGE_IF]);
            run_ok(&["ip", "-n", sw, "link", "set", port, "up"]);
            // Frames the router XDP-redirects out of lan0 arrive on p0 and
            // (after bridging) are delivered to the clients.
            t.switch_port_offloads(Ns::Switch, port);
        }
        run_ok(&["ip", "-n", sw, "link", "set", BRIDGE_IF, "up"]);
        t.setup_client(Ns::Client, CLIENT_ADDR);
        t.setup_client(Ns::Client2, CLIENT2_ADDR);
        t.setup_router_and_server();
        t
    }

    pub(crate) fn alloc(roles: &[Ns]) -> Self {
        crate::host::record_failures();
        // Tests that build topologies are `#[ignore]`d with this reason;
        // run with `--include-ignored` as a normal user they stop here.
        assert!(
            is_root(),
            "needs root (network namespaces, veths, BPF): run cargo xtask test"
        );
        let pid = std::process::id();
        let token = crate::host::run_token();
        // Skip counters whose names survive from a killed earlier process
        // with the same pid; never delete them (they are not ours).
        for _ in 0..1000 {
            let n = COUNTER.fetch_add(1, Ordering::SeqCst);
            let names: Vec<(Ns, String)> = roles
                .iter()
                .map(|&r| (r, format!("rt{pid}{token}x{n}-{}", r.suffix())))
                .collect();
            if names
                .iter()
                .all(|(_, name)| crate::host::name_is_free(name))
            {
                return Self {
                    names,
                    created: Mutex::new(Vec::new()),
                    children: Mutex::new(Vec::new()),
                };
            }
        }
        panic!("no free namespace name for pid {pid}");
    }

    pub(crate) fn create_namespaces(&self) {
        for (_, name) in &self.names {
            run_ok(&["ip", "netns", "add", name]);
            self.created.lock().unwrap().push(name.clone());
            crate::guard::register(name);
            run_ok(&["ip", "-n", name, "link", "set", "lo", "up"]);
        }
    }

    /// Client side: `eth0` (already moved into the namespace) addressed,
    /// up, with a default route via the router, and the end host's offloads
    /// ([`Topology::host_offloads`]).
    pub fn setup_client(&self, ns: Ns, addr: Ipv4Addr) {
        let name = self.ns_name(ns);
        let cidr = format!("{addr}/24");
        let gw = ROUTER_LAN_ADDR.to_string();
        run_ok(&["ip", "-n", name, "addr", "add", &cidr, "dev", HOST_IF]);
        run_ok(&["ip", "-n", name, "link", "set", HOST_IF, "up"]);
        run_ok(&["ip", "-n", name, "route", "add", "default", "via", &gw]);
        self.host_offloads(ns);
    }

    /// tx checksum offload off and GRO on for an end host's `eth0`.
    pub(crate) fn host_offloads(&self, ns: Ns) {
        // A veth with tx checksum offload on leaves TCP/UDP checksums
        // CHECKSUM_PARTIAL. The kernel's forwarding path copes (the skb
        // carries that state), but an XDP program cannot see it: a frame it
        // redirects reaches the far end with a wrong checksum and is dropped
        // (TCP stalls). Real NICs deliver complete checksums, so make the
        // end hosts send complete ones.
        self.exec_ok(ns, &["ethtool", "-K", HOST_IF, "tx", "off"]);
        // This veth receives frames the router XDP-redirects into its peer;
        // a veth accepts redirected frames only if the receiving side runs
        // NAPI (an XDP program or GRO, kernel >= 5.13).
        self.exec_ok(ns, &["ethtool", "-K", HOST_IF, "gro", "on"]);
    }

    /// GRO on and tx checksum offload off for the bridge port `port` in
    /// `ns` (a switch port of a test topology).
    ///
    /// GRO: frames a router XDP-redirects into its veth arrive on the port
    /// that is its peer, and a veth accepts redirected frames only if the
    /// receiving side runs NAPI (an XDP program or GRO, kernel >= 5.13).
    ///
    /// tx off: GRO on the ports merges a host's segments into one
    /// super-packet whose checksum is left partial (`CHECKSUM_PARTIAL`).
    /// Leaving through the port that faces a router's XDP interface it is
    /// cut up again, and with tx checksum offload on that port the segments
    /// keep partial checksums, which XDP cannot see and forwards unfinished:
    /// the receiving host drops them (`TcpInCsumErrors`) and TCP through
    /// the router stalls whenever the timing lets GRO merge (the hairpin
    /// test failed so under load). With tx off the kernel completes every
    /// checksum before a frame leaves the port, as a real switch delivers
    /// complete ones; `router-ctl doctor` warns about such a peer.
    pub(crate) fn switch_port_offloads(&self, ns: Ns, port: &str) {
        self.exec_ok(ns, &["ethtool", "-K", port, "gro", "on", "tx", "off"]);
    }

    fn setup_router_and_server(&self) {
        let (rtr, srv) = (self.ns_name(Ns::Router), self.ns_name(Ns::Server));
        run_ok(&[
            "ip", "-n", rtr, "link", "add", WAN_IF, "type", "veth", "peer", "name", HOST_IF,
            "netns", srv,
        ]);
        self.address_router_and_server();
    }

    /// Addresses, forwarding and offloads of the router's `lan0`/`wan0` and
    /// the server's `eth0`, once those exist.
    pub(crate) fn address_router_and_server(&self) {
        let (rtr, srv) = (self.ns_name(Ns::Router), self.ns_name(Ns::Server));
        let lan = format!("{ROUTER_LAN_ADDR}/24");
        let wan = format!("{ROUTER_WAN_ADDR}/24");
        run_ok(&["ip", "-n", rtr, "addr", "add", &lan, "dev", LAN_IF]);
        run_ok(&["ip", "-n", rtr, "addr", "add", &wan, "dev", WAN_IF]);
        run_ok(&["ip", "-n", rtr, "link", "set", LAN_IF, "up"]);
        run_ok(&["ip", "-n", rtr, "link", "set", WAN_IF, "up"]);
        // bpf_fib_lookup reports "forwarding disabled" unless forwarding is on
        // in the namespace (and the kernel path needs it anyway).
        self.exec_ok(Ns::Router, &["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        self.exec_ok(
            Ns::Router,
            &["sysctl", "-qw", "net.ipv4.conf.all.forwarding=1"],
        );
        // The server gets only its connected /24: no route to the LAN, so
        // replies reach clients only if the router translates the source.
        let srv_addr = format!("{SERVER_ADDR}/24");
        run_ok(&["ip", "-n", srv, "addr", "add", &srv_addr, "dev", HOST_IF]);
        run_ok(&["ip", "-n", srv, "link", "set", HOST_IF, "up"]);
        self.host_offloads(Ns::Server);
    }

    /// The namespace name of `ns`.
    ///
    /// # Panics
    /// If this topology has no such namespace (e.g. `Switch` in [`Topology::new`]).
    #[must_use]
    pub fn ns_name(&self, ns: Ns) -> &str {
        self.names.iter().find(|(r, _)| *r == ns).map_or_else(
            || panic!("topology has no {ns:?} namespace"),
            |(_, n)| n.as_str(),
        )
    }

    /// Whether this topology has namespace `ns`.
    #[must_use]
    pub fn has(&self, ns: Ns) -> bool {
        self.names.iter().any(|(r, _)| *r == ns)
    }

    /// Names of all namespaces of this topology.
    #[must_use]
    pub fn namespaces(&self) -> Vec<String> {
        self.names.iter().map(|(_, n)| n.clone()).collect()
    }

    fn netns_cmd<'a>(&'a self, ns: Ns, cmd: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["ip", "netns", "exec", self.ns_name(ns)];
        v.extend_from_slice(cmd);
        v
    }

    /// Runs `ip netns exec NAME cmd...` (bounded by a 60 s timeout) and
    /// returns its output whatever the exit status.
    #[must_use]
    pub fn exec(&self, ns: Ns, cmd: &[&str]) -> Output {
        run(&self.netns_cmd(ns, cmd))
    }

    /// Like [`Topology::exec`] but panics (with stdout/stderr) on failure;
    /// returns stdout.
    pub fn exec_ok(&self, ns: Ns, cmd: &[&str]) -> String {
        let full = self.netns_cmd(ns, cmd);
        let out = run(&full);
        check(&full, &out);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// [`Topology::exec_ok`] of a command given as one line of words
    /// separated by single spaces (no quoting: `ip route add ...`,
    /// `tc qdisc add ...`).
    pub fn exec_line_ok(&self, ns: Ns, line: &str) -> String {
        let words: Vec<&str> = line.split(' ').collect();
        self.exec_ok(ns, &words)
    }

    /// Starts `ip netns exec NAME cmd...` in the background (own process
    /// group, stdin null, output inherited). The topology kills its process
    /// group on drop if it has not been reaped by then.
    pub fn spawn(&self, ns: Ns, cmd: &[&str]) -> Child {
        use std::os::unix::process::CommandExt;
        let full = self.netns_cmd(ns, cmd);
        let child = Command::new(full[0])
            .args(&full[1..])
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {full:?}: {e}"));
        self.children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(child.id());
        child
    }

    /// Runs `f` on a new thread that has entered the network namespace `ns`
    /// (only the netns; see [`netns::enter`]). Sockets created in `f` live
    /// in that namespace. A panic in `f` is propagated.
    pub fn in_ns<T: Send>(&self, ns: Ns, f: impl FnOnce() -> T + Send) -> T {
        let name = self.ns_name(ns);
        // Named after the caller (a test thread is named after its test),
        // so a panic here is recorded under the test's name
        // (`host::record_failures`).
        let caller = std::thread::current().name().map(str::to_owned);
        std::thread::scope(|s| {
            let mut b = std::thread::Builder::new();
            if let Some(c) = caller {
                b = b.name(c);
            }
            let h = b
                .spawn_scoped(s, || {
                    netns::enter(name);
                    f()
                })
                .expect("spawning a thread for a namespace");
            match h.join() {
                Ok(v) => v,
                Err(e) => std::panic::resume_unwind(e),
            }
        })
    }

    /// Absolute value of a kernel SNMP counter in namespace `ns`, named as
    /// `nstat` names them (`IpForwDatagrams`, `TcpActiveOpens`,
    /// `TcpExtTCPTimeouts`, `UdpInDatagrams`...), read from the namespace's
    /// /proc/net/snmp and /proc/net/netstat.
    ///
    /// # Panics
    /// If the counter does not exist.
    #[must_use]
    pub fn nstat(&self, ns: Ns, counter: &str) -> u64 {
        let text = self.exec_ok(ns, &["cat", "/proc/net/snmp", "/proc/net/netstat"]);
        parse_snmp(&text, counter).unwrap_or_else(|| {
            panic!(
                "counter {counter} not found in {}'s /proc/net/snmp or netstat",
                self.ns_name(ns)
            )
        })
    }

    /// `NAME=VALUE` of each of `counters` that `ns`'s `/proc/net/snmp` or
    /// `netstat` has, space-separated, from one read: for a failing test's
    /// diagnostics (a counter this kernel lacks is left out, not a panic).
    #[must_use]
    pub fn nstat_line(&self, ns: Ns, counters: &[&str]) -> String {
        let o = self.exec(ns, &["cat", "/proc/net/snmp", "/proc/net/netstat"]);
        let text = String::from_utf8_lossy(&o.stdout);
        counters
            .iter()
            .filter_map(|c| parse_snmp(&text, c).map(|v| format!("{c}={v}")))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Runs `iptables ARGS` in `ns`, falling back to `iptables-legacy`.
    pub fn iptables(&self, ns: Ns, args: &[&str]) {
        let mut cmd = vec!["iptables"];
        cmd.extend_from_slice(args);
        if self.exec(ns, &cmd).status.success() {
            return;
        }
        cmd[0] = "iptables-legacy";
        self.exec_ok(ns, &cmd);
    }

    /// The kernel baseline NAT: `iptables -t nat -A POSTROUTING -o wan0 -j MASQUERADE`
    /// in the router namespace.
    pub fn masquerade(&self) {
        self.iptables(
            Ns::Router,
            &[
                "-t",
                "nat",
                "-A",
                "POSTROUTING",
                "-o",
                WAN_IF,
                "-j",
                "MASQUERADE",
            ],
        );
    }

    /// `ping -c COUNT -W 1` from `ns` to `dst` (bounded by a deadline of
    /// COUNT + 2 s); true if every echo was answered.
    #[must_use]
    pub fn ping(&self, ns: Ns, dst: Ipv4Addr, count: u32) -> bool {
        let count = count.clamp(1, 100);
        let (c, w, d) = (count.to_string(), (count + 2).to_string(), dst.to_string());
        self.exec(
            ns,
            &[
                "ping", "-n", "-q", "-c", &c, "-i", "0.2", "-W", "1", "-w", &w, &d,
            ],
        )
        .status
        .success()
    }

    /// Starts a TCP echo server in `ns` bound to `addr` (one connection).
    #[must_use]
    pub fn tcp_echo_server(&self, ns: Ns, addr: SocketAddr) -> EchoServer {
        echo::tcp_server(self.ns_name(ns), addr)
    }

    /// Starts a UDP echo server in `ns` bound to `addr`.
    #[must_use]
    pub fn udp_echo_server(&self, ns: Ns, addr: SocketAddr) -> EchoServer {
        echo::udp_server(self.ns_name(ns), addr)
    }

    /// TCP client in `ns`: sends `payload` to `dst`, returns the echo.
    pub fn tcp_echo_client(
        &self,
        ns: Ns,
        dst: SocketAddr,
        payload: &[u8],
        timeout: Duration,
    ) -> std::io::Result<Vec<u8>> {
        self.in_ns(ns, || echo::tcp_client(dst, payload, timeout))
    }

    /// UDP client in `ns`: sends `payload` to `dst`, returns the reply.
    pub fn udp_echo_client(
        &self,
        ns: Ns,
        dst: SocketAddr,
        payload: &[u8],
        timeout: Duration,
    ) -> std::io::Result<Vec<u8>> {
        self.in_ns(ns, || echo::udp_client(dst, payload, timeout))
    }

    /// TCP echo server in `server` on `addr`, 256 KiB round trip from
    /// `client`; returns the peer address the server saw, or why it failed.
    pub fn try_tcp_echo(
        &self,
        client: Ns,
        server: Ns,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<SocketAddr, String> {
        let payload = pattern(256 * 1024);
        let srv = self.tcp_echo_server(server, addr);
        let dst = srv.local_addr();
        let got = self.tcp_echo_client(client, dst, &payload, timeout);
        let peer = srv.join();
        check_echo("TCP", dst, &payload, got, peer)
    }

    /// UDP variant of [`Topology::try_tcp_echo`] (1200-byte datagram).
    pub fn try_udp_echo(
        &self,
        client: Ns,
        server: Ns,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<SocketAddr, String> {
        let payload = pattern(1200);
        let srv = self.udp_echo_server(server, addr);
        let dst = srv.local_addr();
        let got = self.udp_echo_client(client, dst, &payload, timeout);
        let peer = srv.join();
        check_echo("UDP", dst, &payload, got, peer)
    }

    /// [`Topology::try_tcp_echo`] with a 5 s timeout that panics on failure.
    #[must_use]
    pub fn tcp_echo_roundtrip(&self, client: Ns, server: Ns, addr: SocketAddr) -> SocketAddr {
        self.try_tcp_echo(client, server, addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Topology::try_udp_echo`] with a 5 s timeout that panics on failure.
    #[must_use]
    pub fn udp_echo_roundtrip(&self, client: Ns, server: Ns, addr: SocketAddr) -> SocketAddr {
        self.try_udp_echo(client, server, addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Gives the server a route back to the LAN via the router, so plain
    /// forwarding (no NAT) works too.
    pub fn route_back(&self) {
        let lan = format!("{}/24", Ipv4Addr::new(192, 168, 50, 0));
        let via = ROUTER_WAN_ADDR.to_string();
        run_ok(&[
            "ip",
            "-n",
            self.ns_name(Ns::Server),
            "route",
            "add",
            &lan,
            "via",
            &via,
        ]);
    }

    /// Runs the workspace's `router-ctl` (built by `cargo xtask test`) with
    /// `-n ROUTER_NS ARGS` and returns its output.
    #[must_use]
    pub fn router_ctl(&self, args: &[&str]) -> Output {
        self.router_ctl_in(Ns::Router, args)
    }

    /// [`Topology::router_ctl`] for the router in namespace `router`
    /// (topologies with two routers).
    #[must_use]
    pub fn router_ctl_in(&self, router: Ns, args: &[&str]) -> Output {
        let bin = router_ctl_bin();
        Command::new("timeout")
            .args(["-k", "5", CMD_TIMEOUT])
            .arg(&bin)
            .arg("-n")
            .arg(self.ns_name(router))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()))
    }

    /// [`Topology::router_ctl`] that panics with stderr on failure; returns stdout.
    pub fn router_ctl_ok(&self, args: &[&str]) -> String {
        let o = self.router_ctl(args);
        assert!(
            o.status.success(),
            "router-ctl {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The MAC address of `dev` in `ns`, or why it could not be read.
    pub fn try_mac(&self, ns: Ns, dev: &str) -> Result<[u8; 6], String> {
        let o = self.exec(ns, &["cat", &format!("/sys/class/net/{dev}/address")]);
        let s = String::from_utf8_lossy(&o.stdout);
        let v: Vec<u8> = s
            .trim()
            .split(':')
            .filter_map(|b| u8::from_str_radix(b, 16).ok())
            .collect();
        v.try_into()
            .map_err(|_| format!("no MAC for {dev} in {ns:?}: {s:?}"))
    }

    /// The ifindex of `dev` in `ns`, or why it could not be read.
    pub fn try_ifindex(&self, ns: Ns, dev: &str) -> Result<u32, String> {
        let o = self.exec(ns, &["cat", &format!("/sys/class/net/{dev}/ifindex")]);
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .map_err(|e| format!("ifindex of {dev} in {ns:?}: {e}"))
    }

    /// [`Topology::try_mac`] that panics on failure.
    #[must_use]
    pub fn mac(&self, ns: Ns, dev: &str) -> [u8; 6] {
        self.try_mac(ns, dev).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Topology::try_ifindex`] that panics on failure.
    #[must_use]
    pub fn ifindex(&self, ns: Ns, dev: &str) -> u32 {
        self.try_ifindex(ns, dev).unwrap_or_else(|e| panic!("{e}"))
    }

    /// `router-ctl stats --json` parsed.
    #[must_use]
    pub fn stats(&self) -> serde_json::Value {
        let out = self.router_ctl_ok(&["stats", "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("stats --json: {e}: {out}"))
    }

    /// One counter of `router-ctl stats --json`: packets for a verdict
    /// counter, events for an event counter.
    ///
    /// # Panics
    /// If the counter is missing from the output.
    #[must_use]
    pub fn counter(&self, name: &str) -> u64 {
        counter_of(&self.stats(), name)
    }

    /// `router-ctl conntrack list --json` parsed (one object per flow).
    #[must_use]
    pub fn conntrack(&self) -> Vec<serde_json::Value> {
        let out = self.router_ctl_ok(&["conntrack", "list", "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("conntrack list --json: {e}: {out}"))
    }

    /// Lets the router learn the MACs of every host (the fast path hands
    /// packets without a neighbour entry to the kernel).
    pub fn warm_neighbours(&self) {
        let mut hosts = vec![SERVER_ADDR, CLIENT_ADDR];
        if self.has(Ns::Client2) {
            hosts.push(CLIENT2_ADDR);
        }
        for h in hosts {
            assert!(self.ping(Ns::Router, h, 1), "router cannot ping {h}");
        }
    }

    /// Whether router-ctl has pins for this topology's router namespace.
    #[must_use]
    pub fn router_attached(&self) -> bool {
        self.router_attached_in(Ns::Router)
    }

    /// Whether router-ctl has pins for the router namespace `router`.
    #[must_use]
    pub fn router_attached_in(&self, router: Ns) -> bool {
        Path::new(PIN_ROOT).join(self.ns_name(router)).exists()
    }

    fn kill_children(&self) {
        let pids = std::mem::take(
            &mut *self
                .children
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for pid in pids {
            let Ok(pid) = libc::pid_t::try_from(pid) else {
                continue;
            };
            // Only signal a pid that is still our unreaped child (running or
            // zombie): then neither it nor its process group id can have
            // been reused by an unrelated process.
            // SAFETY: plain syscalls on a zeroed siginfo_t.
            unsafe {
                let mut info: libc::siginfo_t = std::mem::zeroed();
                let rc = libc::waitid(
                    libc::P_PID,
                    pid.cast_unsigned(),
                    &raw mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                );
                if rc != 0 {
                    continue; // already reaped by the owner of the Child
                }
                libc::kill(-pid, libc::SIGKILL);
                libc::kill(pid, libc::SIGKILL);
                // Reap it (bounded) so no zombie is left behind.
                let deadline = Instant::now() + Duration::from_secs(2);
                while Instant::now() < deadline {
                    let mut status = 0;
                    if libc::waitpid(pid, &raw mut status, libc::WNOHANG) != 0 {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}

impl Default for Topology {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.kill_children();
        // Detach first so no pin outlives the namespaces.
        let created = std::mem::take(
            &mut *self
                .created
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        // What escaped its process group (or holds the router's lock)
        // first: a detach would wait for it.
        for name in &created {
            crate::host::kill_processes_in(name);
        }
        for router in [Ns::Router, Ns::Router2] {
            if !self.has(router) || !created.iter().any(|n| n == self.ns_name(router)) {
                continue;
            }
            crate::host::remove_router(self.ns_name(router));
        }
        for name in &created {
            crate::guard::forget(name);
            // Deleting a namespace destroys the veths inside it (and with them
            // their peers). Errors (e.g. never created) are ignored.
            let _ = Command::new("timeout")
                .args(["-k", "5", "30", "ip", "netns", "delete", name])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A counter from parsed `stats --json` (`packets` or `events`).
///
/// # Panics
/// If the counter is missing.
#[must_use]
pub fn counter_of(stats: &serde_json::Value, name: &str) -> u64 {
    let c = &stats[name];
    c["packets"]
        .as_u64()
        .or_else(|| c["events"].as_u64())
        .unwrap_or_else(|| panic!("no counter {name} in stats: {stats}"))
}

/// How much counter `name` grew between two parsed `stats --json`.
///
/// # Panics
/// If the counter is missing from either.
#[must_use]
pub fn counter_delta(before: &serde_json::Value, after: &serde_json::Value, name: &str) -> u64 {
    counter_of(after, name) - counter_of(before, name)
}

/// Deterministic non-trivial payload of `len` bytes.
#[must_use]
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 8)) as u8)
        .collect()
}

fn check_echo(
    proto: &str,
    dst: SocketAddr,
    payload: &[u8],
    got: std::io::Result<Vec<u8>>,
    peer: Option<SocketAddr>,
) -> Result<SocketAddr, String> {
    let got =
        got.map_err(|e| format!("{proto} echo to {dst} failed: {e} (server saw {peer:?})"))?;
    if got != payload {
        return Err(format!(
            "{proto} echo to {dst}: sent {} bytes, got back {} different bytes",
            payload.len(),
            got.len()
        ));
    }
    peer.ok_or_else(|| format!("{proto} echo to {dst}: data came back but the server saw no peer"))
}
