//! Test harness: a client -- router -- server topology in network
//! namespaces unique to the run, removed on drop (also on panic).

use std::{
    fs,
    os::fd::AsRawFd,
    path::PathBuf,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The namespaces of a [`Topology`].
#[derive(Clone, Copy, Debug)]
pub enum Ns {
    Client,
    Router,
    Server,
}

/// client `eth0` 192.168.50.2/24 -- `lan0` 192.168.50.1 router
/// 203.0.113.1 `wan0` -- `eth0` 203.0.113.2/24 server.
pub struct Topology {
    names: [String; 3],
}

pub const CLIENT_ADDR: &str = "192.168.50.2";
pub const SERVER_ADDR: &str = "203.0.113.2";
pub const ROUTER_WAN_ADDR: &str = "203.0.113.1";

fn sh(args: &[&str]) -> Output {
    Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn sh_ok(args: &[&str]) -> Output {
    let o = sh(args);
    assert!(
        o.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// True when running as root; tests print why they skip otherwise.
#[must_use]
pub fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

impl Topology {
    /// Builds the topology. `server_route_back` adds a route from the
    /// server to the LAN (plain forwarding); without it only NAT works.
    #[must_use]
    pub fn new(server_route_back: bool) -> Self {
        let id = format!(
            "rt{}x{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let names = [
            format!("{id}-cli"),
            format!("{id}-rtr"),
            format!("{id}-srv"),
        ];
        for n in &names {
            sh_ok(&["ip", "netns", "add", n]);
        }
        // From here on Drop cleans up, even if a later step panics.
        let t = Topology { names };
        let (c, r, s) = (t.name(Ns::Client), t.name(Ns::Router), t.name(Ns::Server));
        sh_ok(&[
            "ip", "-n", c, "link", "add", "eth0", "type", "veth", "peer", "name", "lan0", "netns",
            r,
        ]);
        sh_ok(&[
            "ip", "-n", s, "link", "add", "eth0", "type", "veth", "peer", "name", "wan0", "netns",
            r,
        ]);
        for (ns, dev, addr) in [
            (c, "eth0", "192.168.50.2/24"),
            (r, "lan0", "192.168.50.1/24"),
            (r, "wan0", "203.0.113.1/24"),
            (s, "eth0", "203.0.113.2/24"),
        ] {
            sh_ok(&["ip", "-n", ns, "addr", "add", addr, "dev", dev]);
            sh_ok(&["ip", "-n", ns, "link", "set", dev, "up"]);
        }
        for ns in [c, r, s] {
            sh_ok(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        sh_ok(&[
            "ip",
            "-n",
            c,
            "route",
            "add",
            "default",
            "via",
            "192.168.50.1",
        ]);
        if server_route_back {
            sh_ok(&[
                "ip",
                "-n",
                s,
                "route",
                "add",
                "192.168.50.0/24",
                "via",
                "203.0.113.1",
            ]);
        }
        // bpf_fib_lookup answers "forwarding disabled" unless the ingress
        // device forwards, so forwarding stays on under XDP too.
        sh_ok(&[
            "ip",
            "netns",
            "exec",
            r,
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
        ]);
        for ns in [c, s] {
            // A veth with tx checksum offload leaves TCP/UDP checksums
            // partial (CHECKSUM_PARTIAL); XDP cannot see that state, so a
            // redirected frame arrives with a bad checksum and TCP stalls.
            sh_ok(&[
                "ip", "netns", "exec", ns, "ethtool", "-K", "eth0", "tx", "off",
            ]);
            // A veth accepts XDP-redirected frames only when its peer runs
            // NAPI: an XDP program there, or GRO on.
            sh_ok(&[
                "ip", "netns", "exec", ns, "ethtool", "-K", "eth0", "gro", "on",
            ]);
        }
        t
    }

    #[must_use]
    pub fn name(&self, ns: Ns) -> &str {
        &self.names[ns as usize]
    }

    /// Runs `cmd` inside `ns` with `ip netns exec`.
    #[must_use]
    pub fn exec(&self, ns: Ns, cmd: &[&str]) -> Output {
        let mut v = vec!["ip", "netns", "exec", self.name(ns)];
        v.extend_from_slice(cmd);
        sh(&v)
    }

    /// Absolute value of a kernel SNMP counter (e.g. `IpForwDatagrams`).
    #[must_use]
    pub fn nstat(&self, ns: Ns, counter: &str) -> u64 {
        let o = self.exec(ns, &["nstat", "-az", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("nstat json");
        v["kernel"][counter].as_u64().unwrap_or(0)
    }

    /// Runs `f` on a thread that entered `ns`; sockets it opens live there.
    pub fn in_ns<T: Send>(&self, ns: Ns, f: impl FnOnce() -> T + Send) -> T {
        let path = PathBuf::from("/run/netns").join(self.name(ns));
        std::thread::scope(|s| {
            s.spawn(|| {
                let fd = fs::File::open(&path).expect("netns file");
                // SAFETY: valid fd; affects only this thread.
                assert_eq!(
                    unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) },
                    0
                );
                f()
            })
            .join()
            .expect("namespace thread panicked")
        })
    }

    /// Runs router-ctl with `-n <router ns>`.
    #[must_use]
    pub fn router_ctl(&self, args: &[&str]) -> Output {
        let bin = concat!(env!("CARGO_MANIFEST_DIR"), "/../target/debug/router-ctl");
        Command::new(bin)
            .arg("-n")
            .arg(self.name(Ns::Router))
            .args(args)
            .output()
            .expect("router-ctl (built by `cargo xtask test`)")
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Detach first so no pin outlives the namespaces.
        if PathBuf::from("/sys/fs/bpf/xdp-router")
            .join(&self.names[1])
            .exists()
        {
            let _ = self.router_ctl(&["detach"]);
        }
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}
