//! The router under test: switching it between the kernel path and the
//! XDP path, veth offload settings, and what it forwarded.

use tests::rawbpf::{self, Attached};
use tests::{HOST_IF, LAN_IF, Ns, Topology, WAN_IF, counter_of};

use crate::model::{DataPath, Offload};

/// Tracks the router's current path and offload setting, switching only
/// when a run needs another.
pub struct Router<'a> {
    t: &'a Topology,
    state: Option<(DataPath, Offload)>,
    /// The limit's forwarder while that path runs.
    limit: Option<Attached>,
    /// `attach --max-flows` (None: router-ctl's default).
    max_flows: Option<u32>,
}

/// The LAN prefix, for the server's route back on the limit path.
const LAN_PREFIX: &str = "192.168.50.0/24";

impl<'a> Router<'a> {
    pub fn new(t: &'a Topology) -> Self {
        Self {
            t,
            state: None,
            limit: None,
            max_flows: None,
        }
    }

    /// The flow table capacity of the next XDP attach; the next
    /// [`Router::switch`] re-attaches whatever runs (an empty table).
    pub fn set_max_flows(&mut self, max_flows: Option<u32>) {
        self.max_flows = max_flows;
        self.state = None;
    }

    /// Puts the router on `path` with `offload`. Kernel: forwarding plus
    /// iptables MASQUERADE; xdp: `router-ctl attach`, no iptables NAT.
    pub fn switch(&mut self, path: DataPath, offload: Offload) -> Result<(), String> {
        if self.state == Some((path, offload)) {
            return Ok(());
        }
        let t = self.t;
        // Tear down whatever runs now; offloads change only while detached
        // (an attached XDP program pins its peers' TSO off).
        if self.limit.take().is_some() {
            let _ = t.exec(Ns::Server, &["ip", "route", "del", LAN_PREFIX]);
        }
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
        apply_offload(t, path, offload);
        match path {
            DataPath::Kernel => t.masquerade(),
            DataPath::Xdp => {
                let max = self.max_flows.map(|n| n.to_string());
                let mut args = vec!["attach", LAN_IF, WAN_IF, "--admit", "xdp"];
                if let Some(n) = &max {
                    args.extend(["--max-flows", n]);
                }
                let o = t.router_ctl(&args);
                if !o.status.success() {
                    return Err(format!(
                        "router-ctl attach {LAN_IF} {WAN_IF} failed: {}",
                        String::from_utf8_lossy(&o.stderr)
                    ));
                }
            }
            DataPath::Limit => self.limit = Some(attach_limit(t)?),
        }
        self.state = Some((path, offload));
        Ok(())
    }
}

/// The limit's forwarder on the router's `lan0` and `wan0`, and a route
/// back on the server (no NAT: ping replies go to the client's address).
fn attach_limit(t: &Topology) -> Result<Attached, String> {
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
    t.in_ns(Ns::Router, || {
        Attached::new("limit_fwd", &rawbpf::fib_forwarder(), &ifs)
    })
}

/// ethtool settings of a path and offload mode.
///
/// End hosts keep GRO on in every mode: a veth accepts XDP-redirected
/// frames only when the receiving peer runs NAPI (GRO or XDP), and GRO
/// there only batches the end host's own receive, not what the router sees.
/// The XDP path keeps the end hosts' tx checksum offload off in every mode:
/// with it on, frames reach the XDP program with partial checksums and
/// redirected TCP stalls.
pub fn apply_offload(t: &Topology, path: DataPath, offload: Offload) {
    let (host, router): (&[&str], &[&str]) = match (offload, path) {
        (Offload::Off, _) => (
            &["tx", "off", "tso", "off", "gso", "off", "gro", "on"],
            &["tso", "off", "gso", "off", "gro", "off"],
        ),
        (Offload::On, DataPath::Kernel) => (
            &["tx", "on", "tso", "on", "gso", "on", "gro", "on"],
            &["tso", "on", "gso", "on", "gro", "off"],
        ),
        (Offload::On, DataPath::Xdp | DataPath::Limit) => (
            &["tx", "off", "tso", "on", "gso", "on", "gro", "on"],
            &["tso", "on", "gso", "on", "gro", "off"],
        ),
    };
    let ifs = [
        (Ns::Client, HOST_IF, host),
        (Ns::Server, HOST_IF, host),
        (Ns::Router, LAN_IF, router),
        (Ns::Router, WAN_IF, router),
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
/// `IpForwDatagrams`, plus the fast path's redirects under XDP.
pub fn forwarded(t: &Topology, path: DataPath) -> u64 {
    let kernel = t.nstat(Ns::Router, "IpForwDatagrams");
    match path {
        DataPath::Kernel => kernel,
        // The limit counts nothing: what reached the server came through it.
        DataPath::Limit => kernel + crate::measure::sampler::rx_packets(t, Ns::Server, &[HOST_IF]),
        DataPath::Xdp => {
            let s = t.stats();
            kernel + counter_of(&s, "fwd_outbound") + counter_of(&s, "fwd_inbound")
        }
    }
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
