//! `router-ctl`: loads the embedded XDP object, attaches it to the LAN and
//! WAN interfaces, pins it under bpffs so it outlives the command, and
//! inspects and edits its maps: counters, port forwards, conntrack.

mod attach;
mod conntrack;
mod forward;
mod parse;
mod pins;
mod stats;

use std::{fs, os::fd::AsRawFd, path::Path};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};

use crate::parse::{Proto, TimeoutArg, WanAddr};

#[derive(Parser)]
#[command(version, about = "XDP NAT fast path controller", long_about = None)]
struct Cli {
    /// Work on the interfaces of this named network namespace (like `ip -n`).
    /// Pins stay in the caller's bpffs, unlike with `ip netns exec`.
    #[arg(short = 'n', long = "netns", global = true)]
    netns: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Native (driver) mode, falling back to generic with a warning.
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (skb) mode: works everywhere, slower.
    Generic,
}

#[derive(Subcommand)]
enum Cmd {
    /// Load and attach the fast path to LAN and WAN, then exit; it keeps running.
    ///
    /// LAN -> WAN flows are masqueraded to the WAN address. Example:
    /// `router-ctl -n router attach lan0 wan0 --port-range 20000-60000`
    Attach {
        /// Interface towards the inside hosts.
        lan: String,
        /// Interface towards the upstream; its address is the masquerade source.
        wan: String,
        #[arg(long, value_enum, default_value = "auto")]
        mode: Mode,
        /// Masquerade address: `auto` takes the first IPv4 address of WAN.
        #[arg(long, value_name = "auto|ADDR", default_value = "auto",
              value_parser = parse::parse_wan_addr)]
        wan_addr: WanAddr,
        /// Source ports for masqueraded flows, inclusive.
        #[arg(long, value_name = "MIN-MAX", default_value = "1024-65535",
              value_parser = parse::parse_port_range)]
        port_range: (u16, u16),
        /// Conntrack capacity in flows (the table holds two entries per flow).
        #[arg(long, value_name = "N", default_value_t = router_common::maps::DEFAULT_MAX_FLOWS,
              value_parser = parse::parse_max_flows)]
        max_flows: u32,
        /// Idle timeout of a flow state, repeatable. STATE is one of tcp-syn-sent,
        /// tcp-established, tcp-fin-wait, tcp-closed, udp-unreplied, udp-replied, icmp.
        #[arg(long = "timeout", value_name = "STATE=SECS", value_parser = parse::parse_timeout)]
        timeouts: Vec<TimeoutArg>,
    },
    /// Detach and remove exactly the pins that `attach` made.
    Detach,
    /// Print the summed per-CPU counters, grouped by outcome.
    Stats {
        #[arg(long)]
        json: bool,
    },
    /// Port-forward rules: new WAN -> LAN flows to the WAN address.
    Forward {
        #[command(subcommand)]
        cmd: ForwardCmd,
    },
    /// Inspect or clear the connection tracking table.
    Conntrack {
        #[command(subcommand)]
        cmd: ConntrackCmd,
    },
}

#[derive(Subcommand)]
enum ForwardCmd {
    /// Send new flows to a port of the WAN address on to a LAN host.
    ///
    /// Example: `router-ctl forward add tcp 8080 192.168.50.2:80`
    Add {
        #[arg(value_enum)]
        proto: Proto,
        /// Port on the WAN address, 1-65535.
        #[arg(value_parser = parse::parse_port)]
        wan_port: u16,
        /// LAN host and port the flows go to, e.g. 192.168.50.2:80.
        #[arg(value_name = "LAN_ADDR:PORT", value_parser = parse::parse_forward_target)]
        target: std::net::SocketAddrV4,
    },
    /// Delete the rule of a WAN port (flows it opened run until they expire).
    Del {
        #[arg(value_enum)]
        proto: Proto,
        /// Port on the WAN address, 1-65535.
        #[arg(value_parser = parse::parse_port)]
        wan_port: u16,
    },
    /// List the rules.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ConntrackCmd {
    /// One row per flow: original and translated addresses, state, age.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Number of flows and entries, and the table's capacity in entries.
    Count {
        #[arg(long)]
        json: bool,
    },
    /// Remove every entry (established flows through the fast path break
    /// unless the kernel can take them over).
    Flush,
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
    if let Err(e) = run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("router-ctl needs root (CAP_BPF and CAP_NET_ADMIN); run it with sudo");
    }
    let pin_dir = pins::pin_dir(cli.netns.as_deref());
    if let Some(ns) = &cli.netns {
        // Enter only the network namespace, on the only thread: interface
        // names and netlink resolve there, pins stay in our bpffs.
        enter_netns(ns)?;
    }
    match cli.cmd {
        Cmd::Attach {
            lan,
            wan,
            mode,
            wan_addr,
            port_range,
            max_flows,
            timeouts,
        } => {
            let timeouts = parse::apply_timeouts(&timeouts).map_err(anyhow::Error::msg)?;
            attach::attach(
                &pin_dir,
                &attach::AttachArgs {
                    lan,
                    wan,
                    mode,
                    wan_addr,
                    port_range,
                    max_flows,
                    timeouts,
                },
            )
        }
        Cmd::Detach => attach::detach(&pin_dir),
        Cmd::Stats { json } => stats::stats(&pin_dir, json),
        Cmd::Forward { cmd } => match cmd {
            ForwardCmd::Add {
                proto,
                wan_port,
                target,
            } => forward::add(&pin_dir, proto, wan_port, target),
            ForwardCmd::Del { proto, wan_port } => forward::del(&pin_dir, proto, wan_port),
            ForwardCmd::List { json } => forward::list(&pin_dir, json),
        },
        Cmd::Conntrack { cmd } => match cmd {
            ConntrackCmd::List { json } => conntrack::list(&pin_dir, json),
            ConntrackCmd::Count { json } => conntrack::count(&pin_dir, json),
            ConntrackCmd::Flush => conntrack::flush(&pin_dir),
        },
    }
}

fn enter_netns(name: &str) -> Result<()> {
    let path = Path::new("/run/netns").join(name);
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
    fn attach_defaults() {
        let Cmd::Attach {
            lan,
            wan,
            mode,
            wan_addr,
            port_range,
            max_flows,
            timeouts,
        } = parse(&["-n", "r", "attach", "lan0", "wan0"]).unwrap().cmd
        else {
            panic!("not attach");
        };
        assert_eq!((lan.as_str(), wan.as_str()), ("lan0", "wan0"));
        assert_eq!(mode, Mode::Auto);
        assert_eq!(wan_addr, WanAddr::Auto);
        assert_eq!(port_range, (1024, 65535));
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
        let Cmd::Attach {
            mode,
            wan_addr,
            port_range,
            max_flows,
            timeouts,
            ..
        } = cli.cmd
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
                    wan_port,
                    target,
                },
        } = parse(&["forward", "add", "udp", "5353", "192.168.50.2:53"])
            .unwrap()
            .cmd
        else {
            panic!("not forward add");
        };
        assert_eq!((proto, wan_port), (Proto::Udp, 5353));
        assert_eq!(target.to_string(), "192.168.50.2:53");
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
