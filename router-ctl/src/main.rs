//! `router-ctl`: loads the embedded XDP object, attaches it to the LAN and
//! WAN interfaces, pins it under bpffs so it outlives the command, and
//! inspects and edits its maps: counters, port forwards, conntrack. Also a
//! declarative `apply`, a Prometheus endpoint, and `doctor`.

// Module layers, each using only the layers above it (no circles):
//   ground:    bpfsys, caps, clock, netlink, nlmsg, object, parse, service, signals
//   router:    pins (where), maps (the one typed facade over the pinned
//              maps), ctx (which router), config (what is asked for),
//              state (the attach record), inspect (what runs now)
//   lifecycle: attach (fresh or replace), detach, the loader; uses doctor
//   kernel:    ctnetlink (the kernel's conntrack), offload (which of its
//              flows XDP carries, kept coherent)
//   commands:  apply, conntrack, doctor, forward, metrics, stats, status;
//              live (the status page's samples) and web (its HTTP side) over
//              those; daemon (`run`) over apply, live and web
mod apply;
mod bpfsys;
mod caps;
mod clock;
mod config;
mod conntrack;
mod ctnetlink;
mod ctx;
mod daemon;
mod doctor;
mod ebpf_log;
mod event_pace;
mod forward;
mod inspect;
mod lifecycle;
mod live;
mod maps;
mod metrics;
mod netlink;
mod nlmsg;
mod object;
mod offload;
mod parse;
mod pins;
mod service;
mod shaping;
mod signals;
mod standalone;
mod state;
mod stats;
mod status;
mod table_fill;
mod vmac;
mod web;
mod xfrm;

use std::{fs, os::fd::AsRawFd, path::PathBuf};

use anyhow::{Context, Result, bail};
use clap::{CommandFactory as _, Parser, Subcommand};

use crate::{
    config::{AdmitMode, AttachArgs, FilteringMode, ForwardRules, Mode, MssClamp},
    ctx::Ctx,
    parse::{ForwardFrom, Proto, TimeoutArg, WanAddr},
};

const ABOUT: &str = "XDP NAT fast path controller";
const LONG_ABOUT: &str = "XDP NAT fast path controller.

Loads the XDP NAT program embedded in this binary, attaches it to a LAN and a WAN \
interface, pins it under /sys/fs/bpf/xdp-router/<netns> so it keeps running after the \
command exits, and manages its rules, counters and connection table.";
const AFTER_HELP: &str = "Examples:
  router-ctl -n rtr attach lan0 wan0                # start the fast path in netns rtr
  router-ctl -n rtr status                          # what runs where, since when
  router-ctl -n rtr forward add tcp 8080 192.168.50.2:80
  router-ctl -n rtr stats --watch                   # live pps/bps per counter
  router-ctl apply /etc/xdp-router/router.toml      # the whole router from one file
  router-ctl doctor lan0 wan0                       # XDP hazards and their fixes
  RUST_LOG=debug router-ctl attach lan0 wan0        # log every step

Exit status: 0 success, 1 error (the message says what failed and what to do), \
3 `status` when nothing is attached, 75 `status` while another router-ctl changes the router \
(an attach, apply or detach under way: look again), 78 an attach (`attach`, `apply`, `run --config`) \
refused for a reason that trying again does not change (a map layout or table size \
change, other interfaces or XDP mode, forward rules in the way, a value out of range, an \
interface with no Ethernet address such as the loopback: the message says what to do; \
the service's unit does not restart on it; an interface or address not there yet is 1, \
tried again).";

#[derive(Parser)]
#[command(version = version_string(), about = ABOUT, long_about = LONG_ABOUT,
          after_help = AFTER_HELP)]
struct Cli {
    /// Work on the interfaces of this named network namespace (like `ip -n`).
    /// Pins stay in the caller's bpffs, unlike with `ip netns exec`.
    #[arg(short = 'n', long = "netns", global = true, value_name = "NETNS",
          value_parser = parse::parse_netns)]
    netns: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

fn version_string() -> &'static str {
    static V: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        format!(
            "{} (XDP object {})",
            env!("CARGO_PKG_VERSION"),
            object::Object::embedded_id().version()
        )
    })
}

#[derive(clap::Args, Clone, Debug)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "clap's switches, each a flag of its own on the command line"
)]
struct AttachOpts {
    /// Interface towards the inside hosts.
    lan: String,
    /// Interface towards the upstream; its address is the masquerade source.
    wan: String,
    /// Who admits new flows. `kernel` (offload, the default for a new router): netfilter's firewall and
    /// NAT decide, `router-ctl run` moves established flows to XDP. `xdp` (standalone):
    /// XDP masquerades new flows itself and bypasses the firewall's forward rules.
    /// Without it: the attached router's mode, `kernel` for a new one.
    #[arg(long, value_enum)]
    admit: Option<AdmitMode>,
    /// Standalone: which new inbound flows an active NAT mapping lets in.
    /// `address-port-dependent` (the default, as Linux): only replies of known flows;
    /// `address-dependent`: also from other ports of an address the LAN endpoint sent to;
    /// `endpoint-independent`: from any remote ("full cone", an open NAT for games and
    /// P2P). Offload mode refuses anything but the default: the kernel's NAT decides.
    #[arg(long, value_enum, default_value_t = FilteringMode::default())]
    filtering: FilteringMode,
    /// Standalone: lower the MSS option of the TCP SYNs XDP forwards to what the path
    /// carries, as a firewall's `TCPMSS --clamp-mss-to-pmtu` rule does in the kernel path
    /// (a jumbo-frame LAN behind a 1500-byte WAN). `pmtu` (standalone's default): the
    /// smaller of the egress route's and the ingress interface's MTU; an MTU (`1492`): that
    /// too, for a narrower link the router cannot see (a `PPPoE` modem or an ONT in front
    /// of it, a tunnel upstream); `off`. Like the other options but --admit, left out it
    /// is the default again. Offload mode refuses anything but `off`: clamp in the firewall.
    #[arg(long, value_name = "pmtu|off|MTU", value_parser = MssClamp::parse)]
    clamp_mss: Option<MssClamp>,
    /// XDP attach mode: `native` (in the driver), `generic` (on the skb, any
    /// interface, slower), `auto` (native where both drivers have it, else generic on both:
    /// a native program cannot redirect into a device without native XDP).
    #[arg(long, value_enum, default_value = "auto")]
    mode: Mode,
    /// Masquerade address: `auto` takes the first IPv4 address of WAN.
    #[arg(long, value_name = "auto|ADDR", default_value = "auto",
          value_parser = parse::parse_wan_addr)]
    wan_addr: WanAddr,
    /// Source ports for masqueraded flows, inclusive (standalone); disjoint from
    /// --kernel-nat-ports.
    #[arg(long, value_name = "MIN-MAX", default_value = "1024-60999",
          value_parser = parse::parse_port_range)]
    port_range: (u16, u16),
    /// Standalone: ports of the kernel slow-path NAT (the nftables table `ip xdp_router`
    /// that attach sets up for what XDP passes: fragments and IP options of no XDP
    /// flow, other protocols, exhausted ports).
    #[arg(long, value_name = "MIN-MAX", default_value = "61000-65535",
          value_parser = parse::parse_port_range)]
    kernel_nat_ports: (u16, u16),
    /// Standalone: set up no kernel slow-path NAT table (keep a NAT rule of your own, with
    /// ports outside --port-range).
    #[arg(long)]
    no_kernel_nat: bool,
    /// Conntrack capacity in flows (the table holds two entries per flow).
    #[arg(long, value_name = "N", default_value_t = router_common::maps::DEFAULT_MAX_FLOWS,
          value_parser = parse::parse_max_flows)]
    max_flows: u32,
    #[arg(long = "timeout", value_name = "STATE=SECS", value_parser = parse::parse_timeout,
          help = parse::timeout_help())]
    timeouts: Vec<TimeoutArg>,
    /// Replace an XDP program on LAN or WAN that router-ctl did not attach; attach even
    /// though a veth's peer would drop what the fast path redirects into it (`doctor`:
    /// redirect-target). Not the firewall: see --bypass-forward-rules.
    #[arg(long)]
    force: bool,
    /// Standalone mode (--admit xdp): attach even though the router's netfilter forward
    /// rules would be bypassed (XDP admits every LAN flow and port forward itself);
    /// recorded, as `bypass_forward_rules = true` in an apply file.
    #[arg(long)]
    bypass_forward_rules: bool,
    /// Load and switch to the program again even if nothing changed.
    #[arg(long)]
    reload: bool,
    /// Load this XDP object instead of the embedded one (for tests).
    #[arg(long, hide = true, value_name = "PATH")]
    object: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Load and attach the fast path to LAN and WAN, then exit; it keeps running.
    ///
    /// LAN -> WAN flows are masqueraded to the WAN address. Attaching again with the
    /// same object and configuration changes nothing; with a new configuration (or a new
    /// router-ctl) the program is replaced in place through the pinned links: no traffic
    /// gap, conntrack, counters and rules are kept. If the second interface fails, the
    /// first is detached again.
    #[command(after_help = "Examples:
  router-ctl -n rtr attach lan0 wan0
  router-ctl attach lan0 wan0 --mode native --port-range 20000-60000 --timeout udp-replied=300
  router-ctl attach lan0 wan0 --max-flows 1000000 --wan-addr 203.0.113.1
  router-ctl attach lan0 wan0 --reload          # swap in the program again, flows kept")]
    Attach(AttachOpts),
    /// Turn the fast path off and remove exactly the pins `attach` made.
    ///
    /// The configuration is cleared first (both interfaces go back to the kernel path at
    /// once), then the links and maps are unpinned.
    #[command(after_help = "Example:\n  router-ctl -n rtr detach")]
    Detach,
    /// What is attached where, in which mode, since when, which object, map fill levels.
    ///
    /// Exit status 0 attached and healthy, 3 not attached, 75 `changing` (what it finds is
    /// half done while another router-ctl holds the router's lock: an attach, apply or
    /// detach under way; look again), 1 a problem (pins lost after a reboot, an interrupted
    /// attach or replace, interfaces gone; `degraded`: offload mode with no daemon running,
    /// or standalone's kernel side removed; `other_build`: maps of another build's layout).
    #[command(
        after_help = "Examples:\n  router-ctl -n rtr status\n  router-ctl -n rtr status --json | jq .state"
    )]
    Status {
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Print the summed per-CPU counters, grouped by outcome.
    #[command(after_help = "Examples:
  router-ctl -n rtr stats
  router-ctl -n rtr stats --json
  router-ctl -n rtr stats --watch              # rates each second until Ctrl-C
  router-ctl -n rtr stats --watch --json --count 10")]
    Stats {
        /// One JSON object (with --watch: one per line, with rates).
        #[arg(long)]
        json: bool,
        /// Refresh every interval with packet and bit rates per counter, until Ctrl-C.
        #[arg(long)]
        watch: bool,
        /// Seconds between refreshes with --watch.
        #[arg(long, default_value_t = 1.0, value_name = "SECS", requires = "watch",
              value_parser = parse_interval)]
        interval: f64,
        /// Stop after this many refreshes with --watch (1 or more).
        #[arg(long, value_name = "N", requires = "watch",
              value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
    /// Port-forward rules: new WAN -> LAN flows to the WAN address (standalone mode,
    /// `--admit xdp`; in offload mode a port forward is the firewall's DNAT rule).
    Forward {
        #[command(subcommand)]
        cmd: ForwardCmd,
    },
    /// Inspect or clear the connection tracking table.
    Conntrack {
        #[command(subcommand)]
        cmd: ConntrackCmd,
    },
    /// Make the router match a declarative TOML file (interfaces, WAN address, ports,
    /// table size, timeouts, port forwards).
    ///
    /// The whole file is validated before anything changes; an error names the line and
    /// the field. Applying the same file again changes nothing.
    #[command(after_help = "Examples:
  router-ctl apply router.toml
  router-ctl apply --check router.toml       # validate only
See examples/router.toml in the source tree for every field.")]
    Apply {
        /// The TOML file.
        file: PathBuf,
        /// Validate the file (and the interfaces it names) and change nothing.
        #[arg(long)]
        check: bool,
    },
    /// Serve Prometheus metrics (counters, conntrack use, port-allocation failures).
    ///
    /// Binds in the caller's network namespace (also with -n, which only selects the
    /// router's pins), on loopback unless told otherwise.
    #[command(after_help = "Examples:
  router-ctl -n rtr metrics                       # http://127.0.0.1:9469/metrics
  router-ctl metrics --listen 127.0.0.1:0         # any free port, printed on start")]
    Metrics {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:9469", value_name = "ADDR:PORT")]
        listen: std::net::SocketAddr,
    },
    /// Check interfaces for XDP hazards and print a fix for each.
    ///
    /// Per interface: native XDP support (`native-xdp`), programs already attached
    /// (`xdp-program`), IP forwarding (`forwarding`), a MAC changed since attach
    /// (`router-mac`), veth peers that drop redirected frames (`veth-peer`,
    /// `redirect-target`), peers that send partial checksums (`tx-checksum`), MTU
    /// mismatches (`mtu-mismatch`), VRRP virtual MACs (`virtual-macs`), traffic shaping and
    /// tc rules the fast path's flows skip (`shaping`). For the router
    /// (`netfilter`, `sysctl`, `daemon`): forward rules standalone mode would bypass
    /// (`forward-rules`), source NAT rules beside its own (`source-nat`), the router's
    /// local ports inside XDP's port range (`local-ports`), `IPsec` policies (`ipsec`), policy
    /// rules standalone mode cannot follow (`policy-rules`). Exit status 1 if a check failed.
    #[command(
        after_help = "Examples:\n  router-ctl -n rtr doctor lan0 wan0\n  router-ctl doctor eth0 eth1 --json"
    )]
    Doctor {
        /// The interfaces to check (the router's LAN and WAN).
        #[arg(required = true, value_name = "IFACE")]
        ifaces: Vec<String>,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// The controller daemon (foreground): in offload mode it moves the kernel's
    /// established flows onto the fast path and keeps both tables coherent.
    ///
    /// Dumps the kernel's conntrack at start, then follows its events over ctnetlink
    /// (resynchronising by dump when events are lost). TCP flows are offloaded once
    /// ESTABLISHED and ASSURED, UDP and ICMP echo after the first reply, if they run
    /// between LAN and WAN without a helper. Stops on SIGINT/SIGTERM and leaves the data
    /// path attached; offloaded flows then go back to the kernel within their lease (at
    /// most 60 s). With --config it applies the file first (as `apply`) and again on
    /// SIGHUP (`systemctl reload`): a bad file changes nothing, is logged, and the daemon
    /// keeps running. Reports readiness to systemd (Type=notify) when started by a unit.
    #[command(after_help = "Examples:
  router-ctl -n rtr attach lan0 wan0 && router-ctl -n rtr run
  router-ctl run --config /etc/xdp-router/router.toml   # what the systemd unit starts
  router-ctl -n rtr run --listen 127.0.0.1:8080  # status page on http://127.0.0.1:8080/
  systemctl reload xdp-router                    # re-apply the file (SIGHUP to the unit's daemon)
  kill -HUP PID        # the same by hand; PID: `status --json`'s daemon.pid (not pidof: other router-ctl runs)
  RUST_LOG=debug router-ctl run                  # every offloaded flow")]
    Run {
        /// Offload mode: leave connections whose ct mark (masked by MASK, all bits when
        /// left out) is MARK in the kernel, so the firewall's rules on established packets
        /// (quotas, rate limits, DSCP or mark setting, counters) keep acting on them: mark
        /// them on their first packet (`ct state new ct mark set 0x100`).
        #[arg(long, value_name = "MARK[/MASK]", value_parser = parse::parse_mark)]
        keep_in_kernel_mark: Option<(u32, u32)>,
        /// Offload mode: the bits of a connection's ct mark its packets are routed with,
        /// as the firewall copies them into the packets before routing (`meta mark set ct
        /// mark and 0x3f00`, mwan3's mask; CONNMARK --restore-mark --mask); all bits
        /// when left out. The daemon routes each connection with its ct mark under this
        /// mask, and the fast path carries those routed by it with that mark.
        #[arg(long, value_name = "MASK", value_parser = parse::parse_mark_mask)]
        route_mark_mask: Option<u32>,
        /// Seconds between refreshes of active flows' kernel timeouts and leases (1-30).
        #[arg(long, default_value_t = 2, value_name = "SECS",
              value_parser = clap::value_parser!(u64).range(1..=30))]
        tick: u64,
        /// Apply this TOML file at start and on SIGHUP (see `apply`).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Serve the live status page (`/`), its JSON (`/api/status`) and the Prometheus
        /// metrics (`/metrics`) here, or `none`. Bound in the caller's network namespace
        /// (also with -n), like `metrics`; a non-loopback address gets a warning.
        #[arg(long, value_name = "ADDR:PORT|none", default_value = web::DEFAULT_LISTEN,
              value_parser = web::parse_listen)]
        listen: web::Listen,
        /// Read conntrack events on the poll timer from the start and whatever the load
        /// (tests: the polled path without the load that switches to it).
        #[arg(long, hide = true)]
        poll_events: bool,
        /// The rates that switch conntrack events from waited for to polled and back:
        /// `POLL_FROM,WAIT_BELOW` per second (tests: lower ones, to cross both switches).
        #[arg(
            long,
            hide = true,
            value_name = "POLL_FROM,WAIT_BELOW",
            default_value = "500,200"
        )]
        event_pace_rates: event_pace::PaceRates,
    },
    /// Print a shell completion script.
    #[command(after_help = "Examples:
  router-ctl completions bash > /etc/bash_completion.d/router-ctl
  router-ctl completions zsh > ~/.zfunc/_router-ctl")]
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    #[command(after_help = "Example:\n  router-ctl man > /usr/local/share/man/man8/router-ctl.8")]
    Man,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if (0.1..=3600.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is out of range (expected 0.1-3600 seconds)"))
    }
}

#[derive(Subcommand, Clone, Copy)]
enum ForwardCmd {
    /// Send new flows to a port of the WAN address on to a LAN host (standalone mode).
    ///
    /// Takes effect at once (a map update, no reload). Offload mode refuses it: there a
    /// port forward is the firewall's DNAT rule, which the kernel admits. The same rule twice is a no-op; a
    /// different target for a WAN port that has a rule is refused.
    ///
    /// IPv6 form: `forward add PROTO [LAN_ADDR6]:PORT` opens a pinhole (standalone mode):
    /// the WAN may open flows to that LAN address and port; nothing is translated.
    #[command(after_help = "Examples:
  router-ctl forward add tcp 8080 192.168.50.2:80
  router-ctl forward add udp 5353 192.168.50.3:53
  router-ctl forward add tcp '[2001:db8:50::2]:22'")]
    Add {
        #[arg(value_enum)]
        proto: Proto,
        /// Port on the WAN address, 1-65535; or an IPv6 pinhole's LAN address and port.
        #[arg(value_name = "WAN_PORT|[LAN_ADDR6]:PORT", value_parser = parse::parse_forward_from)]
        from: parse::ForwardFrom,
        /// LAN host and port the flows go to, e.g. 192.168.50.2:80 (not with a pinhole).
        #[arg(value_name = "LAN_ADDR:PORT", value_parser = parse::parse_forward_target)]
        target: Option<std::net::SocketAddrV4>,
    },
    /// Delete the rule of a WAN port (flows it opened run until they expire).
    #[command(
        after_help = "Examples:\n  router-ctl forward del tcp 8080\n  router-ctl forward del tcp '[2001:db8:50::2]:22'"
    )]
    Del {
        #[arg(value_enum)]
        proto: Proto,
        /// Port on the WAN address, 1-65535; or an IPv6 pinhole's LAN address and port.
        #[arg(value_name = "WAN_PORT|[LAN_ADDR6]:PORT", value_parser = parse::parse_forward_from)]
        from: parse::ForwardFrom,
    },
    /// List the rules.
    #[command(
        after_help = "Examples:\n  router-ctl forward list\n  router-ctl forward list --json"
    )]
    List {
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ConntrackCmd {
    /// One row per flow: original and translated addresses, state, age,
    /// and per direction the packets and IP bytes the data path forwarded
    /// (o_* original, r_* reply direction; packets passed to the kernel are
    /// not counted: in offload mode the kernel's conntrack counts those).
    #[command(
        after_help = "Examples:\n  router-ctl conntrack list\n  router-ctl conntrack list \
                          --json\n  router-ctl conntrack list --sort bytes --limit 10\n  \
                          router-ctl conntrack list --addr 192.168.50.2 --proto tcp --port 443"
    )]
    List(conntrack::ListArgs),
    /// Number of flows and entries, and the table's capacity in entries.
    #[command(after_help = "Example:\n  router-ctl conntrack count --json")]
    Count {
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Remove every entry. Standalone mode: established flows through the
    /// fast path break unless the kernel can take them over. Offload mode:
    /// the kernel carries them, and a running `router-ctl run` puts them
    /// back on the fast path within a tick (a resync), also a flow a firewall
    /// rule added since would drop: to apply such a rule to established flows,
    /// end them in the kernel (`conntrack -D ...`), which ends them here too.
    #[command(after_help = "Example:\n  router-ctl conntrack flush")]
    Flush,
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .with_target(false)
        .try_init();
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Usage errors exit 1 like every other error; help and version 0.
        Err(e) if e.use_stderr() => {
            let _ = e.print();
            std::process::exit(1);
        }
        Err(e) => e.exit(),
    };
    // A reader that closes the pipe early (`stats | head`) ends a command
    // that only reads quietly, as other Unix tools end, not with a panic of
    // `println!`: SIGPIPE's default. Not a command that changes state
    // (a signal must not cut it in half), nor a server (`run`, `metrics`:
    // a client that goes away is no reason to exit); `completions` and
    // `man` take a closed pipe for success themselves (`print_whole`).
    if cli.cmd.need().1 == caps::Need::Read && !matches!(cli.cmd, Cmd::Metrics { .. }) {
        // SAFETY: a signal disposition, set before any thread starts.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    init_logging();
    match run(cli) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            let unretryable = e.downcast_ref::<lifecycle::Unretryable>().is_some();
            std::process::exit(if unretryable {
                lifecycle::Unretryable::EXIT_CODE
            } else {
                1
            });
        }
    }
}

impl Cmd {
    /// The command's name for messages, and what it needs.
    fn need(&self) -> (&'static str, caps::Need) {
        use caps::Need::{Change, Nothing, Read};
        match self {
            Self::Attach(_) => ("attach", Change),
            Self::Detach => ("detach", Change),
            Self::Status { .. } => ("status", Read),
            Self::Stats { .. } => ("stats", Read),
            Self::Forward { cmd } => match cmd {
                ForwardCmd::Add { .. } => ("forward add", Change),
                ForwardCmd::Del { .. } => ("forward del", Change),
                ForwardCmd::List { .. } => ("forward list", Read),
            },
            Self::Conntrack { cmd } => match cmd {
                ConntrackCmd::Flush => ("conntrack flush", Change),
                ConntrackCmd::List(_) => ("conntrack list", Read),
                ConntrackCmd::Count { .. } => ("conntrack count", Read),
            },
            Self::Apply { check: true, .. } => ("apply --check", Read),
            Self::Apply { .. } => ("apply", Change),
            Self::Metrics { .. } => ("metrics", Read),
            Self::Run { .. } => ("run", Change),
            Self::Doctor { .. } => ("doctor", Read),
            Self::Completions { .. } => ("completions", Nothing),
            Self::Man => ("man", Nothing),
        }
    }
}

fn attach_args(ctx: &Ctx, o: AttachOpts) -> Result<AttachArgs> {
    let timeouts = parse::apply_timeouts(&o.timeouts).map_err(anyhow::Error::msg)?;
    Ok(AttachArgs {
        admit: o
            .admit
            .unwrap_or_else(|| lifecycle::unstated_admit(ctx, "--admit")),
        filtering: o.filtering,
        mss_clamp: o.clamp_mss,
        lan: o.lan,
        wan: o.wan,
        mode: o.mode,
        wan_addr: o.wan_addr,
        port_range: o.port_range,
        kernel_nat: !o.no_kernel_nat,
        kernel_nat_ports: o.kernel_nat_ports,
        max_flows: o.max_flows,
        timeouts,
        force: o.force,
        forward_rules: if o.bypass_forward_rules {
            ForwardRules::Bypass
        } else {
            ForwardRules::Refuse
        },
        bypass_how: None,
        apply_file: None,
        reload: o.reload,
        object: o.object,
    })
}

#[expect(
    clippy::too_many_lines,
    reason = "the dispatch: one arm per subcommand, each a call"
)]
fn run(cli: Cli) -> Result<i32> {
    let (name, need) = cli.cmd.need();
    match &cli.cmd {
        Cmd::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(*shell, &mut Cli::command(), "router-ctl", &mut script);
            return print_whole(&script, "the completion script");
        }
        Cmd::Man => {
            let mut page = Vec::new();
            clap_mangen::Man::new(Cli::command())
                .render(&mut page)
                .context("rendering the man page")?;
            return print_whole(&page, "the man page");
        }
        _ => {}
    }
    // Entering a namespace needs CAP_SYS_ADMIN; metrics does not enter it.
    let enters = cli.netns.is_some() && !matches!(cli.cmd, Cmd::Metrics { .. });
    caps::require(name, need, enters)?;
    // With `-n` too: inside `ip netns exec` the pins would still go into
    // its private bpffs, whichever namespace router-ctl then enters.
    pins::refuse_ip_netns_exec(cli.netns.as_deref())?;
    let ctx = Ctx::new(cli.netns.clone());
    if let Cmd::Metrics { listen } = cli.cmd {
        // Bind before anything else, in the caller's namespace.
        return metrics::serve(&ctx, listen).map(|()| 0);
    }
    // The status page listens in the caller's namespace, as `metrics` does:
    // bound before the daemon enters the router's.
    let listener = match &cli.cmd {
        Cmd::Run { listen, .. } => web::bind(*listen)?,
        _ => None,
    };
    if let Some(ns) = &cli.netns {
        // A namespace deleted while its router was attached: its pins and
        // records stay (the pins hold the maps' kernel memory), and only
        // `detach` removes them, from outside.
        // Or deleted and made again under its name (a restart script, a
        // container made anew): the pins are the old namespace's router's.
        let gone = !ctx::netns_path(ns).exists();
        let replaced = !gone && netns_replaced(&ctx, ns);
        if (gone || replaced)
            && let Some(left) = lifecycle::orphaned(&ctx)
        {
            if matches!(cli.cmd, Cmd::Detach) {
                return lifecycle::detach_orphaned(&ctx, replaced).map(|()| 0);
            }
            let what = if replaced {
                format!(
                    "the network namespace {ns:?} was deleted and made again since its router \
                     was attached, which"
                )
            } else {
                format!(
                    "no network namespace {ns:?} ({} missing), but a router attached there",
                    ctx::netns_path(ns).display()
                )
            };
            bail!(
                "{what} {left}. Its pins hold the maps' kernel memory until removed: \
                 `router-ctl -n {ns} detach` removes them (once no `router-ctl run` serves it), \
                 then attach anew"
            );
        }
        // Enter only the network namespace, on the only thread: interface
        // names and netlink resolve there, pins stay in our bpffs.
        enter_netns(ns)?;
    }
    let maps = ctx.maps();
    match cli.cmd {
        Cmd::Attach(o) => {
            let a = attach_args(&ctx, o)?;
            lifecycle::attach(&ctx, &a, &[]).map(|_| 0)
        }
        Cmd::Detach => lifecycle::detach(&ctx).map(|_| 0),
        Cmd::Status { json } => Ok(status::status(&ctx, json)),
        Cmd::Stats {
            json,
            watch,
            interval,
            count,
        } => {
            if watch {
                stats::watch(&maps, json, interval, count).map(|()| 0)
            } else {
                stats::stats(&ctx, json).map(|()| 0)
            }
        }
        Cmd::Forward { cmd } => {
            // A change under the router's lock, as every change: a rule
            // written while a detach runs would go with its maps, unsaid,
            // and one written during a switch to offload mode would slip
            // past its refusal there.
            let _lock = match cmd {
                ForwardCmd::List { .. } => None,
                ForwardCmd::Add { .. } | ForwardCmd::Del { .. } => {
                    Some(state::lock(ctx.ns())?.holding_signals())
                }
            };
            forward_cmd(&ctx, &maps, cmd).map(|()| 0)
        }
        Cmd::Conntrack { cmd } => match cmd {
            ConntrackCmd::List(a) => conntrack::list(&maps, a.json, &a.query()),
            ConntrackCmd::Count { json } => conntrack::count(&maps, json),
            // Whole or not at all (the daemon resyncs on the count of
            // flushes it records last), one at a time.
            ConntrackCmd::Flush => {
                let _lock = state::lock(ctx.ns())?.holding_signals();
                conntrack::flush(&maps)
            }
        }
        .map(|()| 0),
        Cmd::Apply { file, check } => apply::apply(&ctx, &file, check).map(|()| 0),
        Cmd::Doctor { ifaces, json } => {
            let daemon_running = daemon::health_json(ctx.ns())["running"] == true;
            Ok(doctor::doctor(
                &ifaces,
                ctx.ns(),
                &ctx.pin_dir,
                daemon_running,
                json,
            ))
        }
        Cmd::Run {
            keep_in_kernel_mark,
            route_mark_mask,
            tick,
            config,
            poll_events,
            event_pace_rates,
            ..
        } => daemon::run(
            &ctx,
            daemon::RunOptions {
                tick: std::time::Duration::from_secs(tick),
                config,
                listener,
                poll_events,
                event_pace_rates,
                marks: daemon::MarkOptions {
                    keep_in_kernel: keep_in_kernel_mark,
                    route_mask: route_mark_mask.unwrap_or(u32::MAX),
                    given: keep_in_kernel_mark.is_some() || route_mark_mask.is_some(),
                },
            },
        )
        .map(|()| 0),
        Cmd::Metrics { .. } | Cmd::Completions { .. } | Cmd::Man => Ok(0),
    }
}

/// Writes `text` to stdout; a reader that closed the pipe early (`| head`)
/// is no error.
fn print_whole(text: &[u8], what: &str) -> Result<i32> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).with_context(|| format!("writing {what}"))
        }
        _ => Ok(0),
    }
}

/// A `forward` command (`cmd`), on the router's maps.
fn forward_cmd(ctx: &Ctx, maps: &maps::PinnedMaps, cmd: ForwardCmd) -> Result<()> {
    match cmd {
        ForwardCmd::Add {
            proto,
            from,
            target,
        } => match (from, target) {
            (ForwardFrom::WanPort(port), Some(to)) => {
                let kernel_ports = state::load(ctx.ns())
                    .ok()
                    .flatten()
                    .and_then(|r| r.config.kernel_nat_ports);
                forward::add(maps, proto, port, to, kernel_ports)
            }
            (ForwardFrom::Pinhole6(to), None) => forward::add_pinhole6(maps, proto, to),
            (ForwardFrom::WanPort(port), None) => Err(anyhow::anyhow!(
                "forward add {} {port} needs the LAN_ADDR:PORT to send the flows to",
                proto.name()
            )),
            (ForwardFrom::Pinhole6(to), Some(_)) => Err(anyhow::anyhow!(
                "an IPv6 pinhole translates nothing: `forward add {} {to}` takes no \
                 LAN_ADDR:PORT",
                proto.name()
            )),
        },
        ForwardCmd::Del { proto, from } => match from {
            ForwardFrom::WanPort(port) => forward::del(maps, proto, port),
            ForwardFrom::Pinhole6(to) => forward::del_pinhole6(maps, proto, to),
        },
        ForwardCmd::List { json } => forward::list(maps, json),
    }
}

/// Whether the named namespace `ns` is another one than the one its
/// router's pins serve: the record names another namespace, and the
/// router's links still run (on the old namespace's interfaces: it lives
/// on, held by a process, so no namespace made since can have its inode).
/// Links whose interfaces went with the old namespace are relinked in the
/// new one, as after an interface made anew. (A reboot takes the pins.)
fn netns_replaced(ctx: &Ctx, ns: &str) -> bool {
    if !ctx.pin_dir.exists() || !lifecycle::links_still_run(ctx) {
        return false;
    }
    let recorded = state::load(ctx.ns())
        .ok()
        .flatten()
        .and_then(|r| r.netns_inode);
    match (recorded, ctx::named_netns_inode(ns)) {
        (Some(then), Some(now)) => then != now,
        _ => false,
    }
}

fn enter_netns(name: &str) -> Result<()> {
    let path = ctx::netns_path(name);
    let f = fs::File::open(&path).with_context(|| {
        format!(
            "no network namespace {name:?} ({} missing; see `ip netns list`)",
            path.display()
        )
    })?;
    // SAFETY: valid fd; CLONE_NEWNET affects only this thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns into {name}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("router-ctl").chain(args.iter().copied()))
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    #[test]
    fn stats_watch_counts_one_refresh_or_more() {
        assert!(parse(&["stats", "--watch", "--count", "0"]).is_err());
        assert!(parse(&["stats", "--watch", "--count", "1"]).is_ok());
    }

    #[test]
    fn attach_defaults() {
        let Cmd::Attach(AttachOpts {
            lan,
            wan,
            mode,
            wan_addr,
            port_range,
            kernel_nat_ports,
            no_kernel_nat,
            max_flows,
            timeouts,
            ..
        }) = parse(&["-n", "r", "attach", "lan0", "wan0"]).unwrap().cmd
        else {
            panic!("not attach");
        };
        assert_eq!((lan.as_str(), wan.as_str()), ("lan0", "wan0"));
        assert_eq!(mode, Mode::Auto);
        assert_eq!(wan_addr, WanAddr::Auto);
        assert_eq!(port_range, standalone::DEFAULT_XDP_PORTS);
        assert_eq!(kernel_nat_ports, standalone::DEFAULT_KERNEL_PORTS);
        assert!(!no_kernel_nat);
        assert_eq!(max_flows, router_common::maps::DEFAULT_MAX_FLOWS);
        assert!(timeouts.is_empty());
    }

    #[test]
    fn attach_options() {
        let cli = parse(&[
            "attach",
            "lan0",
            "wan0",
            "--mode",
            "generic",
            "--wan-addr",
            "203.0.113.1",
            "--port-range",
            "20000-20010",
            "--max-flows",
            "1000",
            "--timeout",
            "icmp=5",
            "--timeout",
            "tcp-established=600",
        ])
        .unwrap();
        let Cmd::Attach(AttachOpts {
            mode,
            wan_addr,
            port_range,
            max_flows,
            timeouts,
            ..
        }) = cli.cmd
        else {
            panic!("not attach");
        };
        assert_eq!(mode, Mode::Generic);
        assert_eq!(wan_addr, WanAddr::Addr([203, 0, 113, 1].into()));
        assert_eq!(port_range, (20000, 20010));
        assert_eq!(max_flows, 1000);
        let t = parse::apply_timeouts(&timeouts).unwrap();
        assert_eq!((t.icmp, t.tcp_established), (5, 600));
    }

    #[test]
    fn bad_values_name_the_argument() {
        for (args, needle) in [
            (
                &["attach", "a", "b", "--port-range", "0-10"][..],
                "--port-range",
            ),
            (&["attach", "a", "b", "--timeout", "foo=1"][..], "--timeout"),
            (&["attach", "a", "b", "--max-flows", "0"][..], "--max-flows"),
            (&["attach", "a", "b", "--wan-addr", "x"][..], "--wan-addr"),
            (&["forward", "add", "icmp", "80", "1.2.3.4:80"][..], "PROTO"),
            (
                &["forward", "add", "tcp", "0", "1.2.3.4:80"][..],
                "WAN_PORT",
            ),
            (
                &["forward", "add", "tcp", "80", "1.2.3.4"][..],
                "LAN_ADDR:PORT",
            ),
            (&["forward", "del", "udp", "70000"][..], "WAN_PORT"),
        ] {
            let e = parse(args)
                .err()
                .unwrap_or_else(|| panic!("{args:?} parsed"));
            let msg = e.to_string();
            assert!(msg.contains(needle), "{args:?}: {msg}");
            assert!(e.use_stderr());
        }
    }

    #[test]
    fn forward_and_conntrack_parse() {
        let Cmd::Forward {
            cmd:
                ForwardCmd::Add {
                    proto,
                    from,
                    target,
                },
        } = parse(&["forward", "add", "udp", "5353", "192.168.50.2:53"])
            .unwrap()
            .cmd
        else {
            panic!("not forward add");
        };
        assert_eq!((proto, from), (Proto::Udp, ForwardFrom::WanPort(5353)));
        assert_eq!(target.unwrap().to_string(), "192.168.50.2:53");
        let Cmd::Forward {
            cmd: ForwardCmd::Add { from, target, .. },
        } = parse(&["forward", "add", "tcp", "[2001:db8:50::2]:22"])
            .unwrap()
            .cmd
        else {
            panic!("not forward add");
        };
        assert!(matches!(from, ForwardFrom::Pinhole6(a) if a.port() == 22));
        assert_eq!(target, None);
        assert!(matches!(
            parse(&["conntrack", "count", "--json"]).unwrap().cmd,
            Cmd::Conntrack {
                cmd: ConntrackCmd::Count { json: true }
            }
        ));
        assert!(matches!(
            parse(&["conntrack", "flush"]).unwrap().cmd,
            Cmd::Conntrack {
                cmd: ConntrackCmd::Flush
            }
        ));
    }
}
