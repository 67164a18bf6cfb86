//! The kernel's side of standalone mode (`--admit xdp`), set up by
//! `attach` and undone by `detach`:
//! - the slow-path NAT: an nftables table of our own (`table ip
//!   xdp_router`) that source-NATs what XDP passes from the LAN to the WAN
//!   (fragments and IP options of no XDP flow, other protocols, exhausted
//!   ports) to the WAN address and a port range disjoint from XDP's, so the two never map
//!   two flows to the same WAN tuple. Packets XDP already translated
//!   (source = the WAN address) are left alone. What would still leave on
//!   the WAN with a LAN address is dropped: an untranslated LAN source, and
//!   an ICMP error of the kernel's quoting a LAN host (about a packet XDP
//!   translated and passed, which the kernel's NAT cannot translate back).
//! - the sysctls that let the kernel forward the translated first packet
//!   of a flow whose next hop XDP could not resolve yet (and a flow's
//!   packet too large for its next hop with DF clear, which XDP translates
//!   for the kernel to fragment): `accept_local=1`
//!   on the LAN interface (its source is the router's own address, a
//!   martian otherwise) and `rp_filter` loose (2) where it was strict.
//!   The old values are recorded and put back by `detach`.
//! - the firewall check: netfilter forward rules or a forward policy that
//!   standalone mode would bypass (`attach` refuses unless `--bypass-forward-rules`;
//!   `doctor` reports them).
//!
//! `nft` and `iptables-legacy` are run as commands in the current network
//! namespace (the caller entered it before any thread started).

use std::{
    collections::BTreeMap,
    fs,
    io::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::{
    config::RouterConfig,
    state::{self, STATE_DIR},
};

/// The nftables table standalone mode owns (family `ip`).
pub const TABLE: &str = "xdp_router";
/// Default ports XDP allocates (`--port-range`): below Linux's default
/// ephemeral range end, so local ports of LAN hosts are preserved.
pub const DEFAULT_XDP_PORTS: (u16, u16) = (1024, 60999);
/// Default ports of the kernel slow path's NAT (`--kernel-nat-ports`).
pub const DEFAULT_KERNEL_PORTS: (u16, u16) = (61000, 65535);

/// What standalone mode set up in the kernel, to undo it on detach.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelSetup {
    /// The LAN interface whose sysctls were changed.
    pub lan: String,
    /// Old `accept_local` of LAN, if it was changed.
    pub accept_local: Option<String>,
    /// Old `rp_filter` of LAN, if it was changed.
    pub rp_filter: Option<String>,
    /// Whether the slow-path table is ours to remove.
    pub table: bool,
}

fn record_path(netns: Option<&str>) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{}.standalone.json", state::ns_key(netns)))
}

fn load_record(netns: Option<&str>) -> Result<Option<KernelSetup>> {
    let path = record_path(netns);
    match fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .with_context(|| format!("{} is not a valid record", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn save_record(netns: Option<&str>, r: &KernelSetup) -> Result<()> {
    state::write_private(&record_path(netns), &serde_json::to_vec_pretty(r)?)
}

fn sysctl_path(iface: &str, name: &str) -> PathBuf {
    Path::new("/proc/sys/net/ipv4/conf").join(iface).join(name)
}

fn read_sysctl(iface: &str, name: &str) -> Result<String> {
    let p = sysctl_path(iface, name);
    fs::read_to_string(&p)
        .map(|s| s.trim().to_owned())
        .with_context(|| format!("reading {}", p.display()))
}

fn write_sysctl(iface: &str, name: &str, value: &str) -> Result<()> {
    let p = sysctl_path(iface, name);
    fs::write(&p, value).with_context(|| format!("writing {value} to {}", p.display()))
}

/// Runs `nft` with `args`, feeding `input` on stdin if given.
fn nft(args: &[&str], input: Option<&str>) -> Result<String> {
    let mut child = Command::new("nft")
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                anyhow::anyhow!(
                    "`nft` not found: standalone mode manages its kernel slow-path NAT as an \
                     nftables table; install nftables (`apt-get install nftables`), or pass \
                     --no-kernel-nat (then keep a NAT rule of your own for what XDP passes)"
                )
            } else {
                anyhow::Error::new(e).context("running nft")
            }
        })?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(text.as_bytes()).context("writing to nft")?;
    }
    let out = child.wait_with_output().context("running nft")?;
    if !out.status.success() {
        bail!(
            "nft {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The slow-path table as `nft -f` input: created, emptied and filled in
/// one transaction (so attach and replace are idempotent and atomic).
/// TCP, UDP and ICMP (echo identifiers) get ports from `ports`; other
/// protocols only the address. A filter chain after the NAT drops what
/// still leaves for the WAN with another source than the WAN address: the
/// packets netfilter does not translate because its conntrack calls them
/// invalid (a LAN host's TCP RST or FIN, or its ICMP error, about an XDP
/// flow the kernel never saw), so no LAN address leaves on the WAN.
///
/// The same chain drops the ICMP errors leaving on the WAN about a
/// connection the kernel forwarded, untranslated by itself, to an address
/// out of the LAN: in standalone mode those are packets XDP translated and
/// passed (a reply of an XDP flow whose LAN host has no neighbour entry),
/// and their error (Host Unreachable once ARP fails) quotes the LAN host's
/// address and port, which the kernel's NAT never saw to translate back.
/// The LAN's addresses are the ones the kernel forwarded to out of the LAN
/// in the last minute (the dynamic set [`LAN_DESTINATIONS_SET`], filled by
/// the forward chain [`TO_LAN_CHAIN`]), so routed LAN subnets and a
/// renumbered LAN need no new table; the error's connection is the one
/// conntrack found for its quoted packet, whose original destination is
/// that packet's destination (it was the connection's first direction).
/// An error about a flow of the kernel's own NAT has its quote translated
/// back to the WAN address before this chain (its connection's original
/// destination is the remote), and one about a packet to the router's own
/// address quotes that address, which the kernel delivers, not forwards:
/// both leave.
///
/// With `wan_addr` 0.0.0.0 (the WAN lost its address, `--wan-addr auto`)
/// the NAT chain translates nothing and the untranslated chain drops all
/// the LAN sends to the WAN, as the kernel's masquerade does while its
/// interface has no address: nothing leaves with an address the router
/// no longer holds, nor with a LAN one.
#[must_use]
pub fn table_script(lan: &str, wan: &str, wan_addr: Ipv4Addr, ports: (u16, u16)) -> String {
    let m = format!("iifname \"{lan}\" oifname \"{wan}\" ip saddr != {wan_addr}");
    let snat = if wan_addr.is_unspecified() {
        String::new()
    } else {
        format!(
            "\t\t{m} meta l4proto {{ tcp, udp, icmp }} snat ip to {wan_addr}:{}-{}\n\
             \t\t{m} snat ip to {wan_addr}\n",
            ports.0, ports.1
        )
    };
    format!(
        "table ip {TABLE}\n\
         delete table ip {TABLE}\n\
         table ip {TABLE} {{\n\
         \tset {LAN_DESTINATIONS_SET} {{\n\
         \t\ttype ipv4_addr\n\
         \t\tsize 65536\n\
         \t\tflags dynamic,timeout\n\
         \t\ttimeout 1m\n\
         \t}}\n\
         \tchain postrouting {{\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         {snat}\
         \t}}\n\
         \tchain {TO_LAN_CHAIN} {{\n\
         \t\ttype filter hook forward priority raw; policy accept;\n\
         \t\toifname \"{lan}\" ct state new update @{LAN_DESTINATIONS_SET} {{ ip daddr }}\n\
         \t}}\n\
         \tchain {UNTRANSLATED_CHAIN} {{\n\
         \t\ttype filter hook postrouting priority srcnat + 10; policy accept;\n\
         \t\t{m} counter drop\n\
         \t\toifname \"{wan}\" icmp type {{ {ICMP_ERRORS} }} ct state related ct original ip \
         daddr @{LAN_DESTINATIONS_SET} counter drop\n\
         \t}}\n\
         }}\n"
    )
}

/// The slow-path table's chain that drops untranslated LAN packets, and
/// errors leaving on the WAN that quote a LAN destination.
pub const UNTRANSLATED_CHAIN: &str = "untranslated";
/// The slow-path table's forward chain that records the addresses the
/// kernel forwards to out of the LAN, in [`LAN_DESTINATIONS_SET`].
pub const TO_LAN_CHAIN: &str = "to_lan";
/// The slow-path table's set of the addresses the kernel forwarded to out
/// of the LAN in the last minute.
pub const LAN_DESTINATIONS_SET: &str = "lan_destinations";
/// The ICMP types that quote a packet (RFC 792), as `nft` names them.
const ICMP_ERRORS: &str =
    "destination-unreachable, source-quench, redirect, time-exceeded, parameter-problem";

/// Whether `nft` lists our table.
fn table_present() -> bool {
    nft(&["-t", "list", "table", "ip", TABLE], None).is_ok()
}

/// Whether standalone mode's kernel side is still set up here (its record
/// and its table), also when the router's pins are gone.
#[must_use]
pub fn kernel_side_left(netns: Option<&str>) -> bool {
    matches!(load_record(netns), Ok(Some(_))) && table_present()
}

/// What of the kernel side that [`set_up`] put in place (as its record
/// says) is no longer there: the slow-path table (a firewall reload whose
/// ruleset starts with `flush ruleset`, as Debian's stock
/// `/etc/nftables.conf` does, removes it) or the LAN's sysctls (reset by
/// `sysctl --system`, or by hand). Without the table what XDP passes from
/// the LAN leaves untranslated (nothing drops LAN sources on the WAN); without
/// `accept_local` or with a strict `rp_filter` the first packets of flows
/// towards unresolved neighbours (and oversize packets to fragment) are
/// dropped as martians.
#[must_use]
pub fn kernel_side_gaps(netns: Option<&str>) -> Vec<String> {
    let Ok(Some(rec)) = load_record(netns) else {
        return Vec::new();
    };
    let mut gaps = Vec::new();
    if rec.table {
        match nft(&["-t", "list", "table", "ip", TABLE], None) {
            Ok(t)
                if t.contains("chain postrouting")
                    && t.contains(&format!("chain {UNTRANSLATED_CHAIN} "))
                    && t.contains(&format!("chain {TO_LAN_CHAIN} "))
                    && t.contains(&format!("update @{LAN_DESTINATIONS_SET} "))
                    && t.contains(&format!("ct original ip daddr @{LAN_DESTINATIONS_SET} ")) => {}
            _ => gaps.push(format!(
                "the nftables table ip {TABLE} (slow-path NAT, the drop of untranslated LAN \
                 sources and of errors quoting LAN hosts) is gone or changed (a firewall reload whose ruleset starts with \
                 `flush ruleset`?)"
            )),
        }
    }
    if read_sysctl(&rec.lan, "accept_local").is_ok_and(|v| v != "1") {
        gaps.push(format!(
            "net.ipv4.conf.{}.accept_local is off (`sysctl --system`?)",
            rec.lan
        ));
    }
    if let (Ok(rp), Ok(rp_all)) = (
        read_sysctl(&rec.lan, "rp_filter"),
        read_sysctl("all", "rp_filter"),
    ) && strict_rp_filter(&rp, &rp_all)
    {
        gaps.push(format!(
            "net.ipv4.conf.{}.rp_filter is strict (`sysctl --system`?)",
            rec.lan
        ));
    }
    gaps
}

/// Whether a LAN interface with `rp_filter` `rp` filters strictly, `all`
/// being `rp_all`: the effective value is the larger of the two.
fn strict_rp_filter(rp: &str, rp_all: &str) -> bool {
    rp == "1" || (rp_all == "1" && rp == "0")
}

/// What `attach` asks of the kernel side.
pub struct Wanted<'a> {
    pub lan: &'a str,
    pub wan: &'a str,
    pub wan_addr: Ipv4Addr,
    /// `None`: no slow-path table (`--no-kernel-nat`).
    pub kernel_ports: Option<(u16, u16)>,
}

impl<'a> Wanted<'a> {
    /// What a router's configuration `c` asks of the kernel side.
    #[must_use]
    pub fn of(c: &'a RouterConfig) -> Self {
        Self {
            lan: &c.lan,
            wan: &c.wan,
            wan_addr: c.wan_addr,
            kernel_ports: c.kernel_nat_ports,
        }
    }
}

/// Sets up (or updates) the kernel side of standalone mode, recording the
/// old sysctl values the first time.
pub fn set_up(netns: Option<&str>, w: &Wanted<'_>) -> Result<()> {
    let mut rec = load_record(netns)?.unwrap_or_default();
    if !rec.lan.is_empty() && rec.lan != w.lan {
        // Attached to another LAN before (a detach was lost): put that one back.
        restore_sysctls(&rec);
        rec = KernelSetup::default();
    }
    w.lan.clone_into(&mut rec.lan);
    let accept_local = read_sysctl(w.lan, "accept_local")?;
    if accept_local != "1" {
        rec.accept_local.get_or_insert(accept_local);
        save_record(netns, &rec)?;
        write_sysctl(w.lan, "accept_local", "1")?;
    }
    // The effective rp_filter is the larger of `all` and the interface's.
    let rp = read_sysctl(w.lan, "rp_filter")?;
    let rp_all = read_sysctl("all", "rp_filter")?;
    if strict_rp_filter(&rp, &rp_all) {
        rec.rp_filter.get_or_insert(rp);
        save_record(netns, &rec)?;
        write_sysctl(w.lan, "rp_filter", "2")?;
    }
    if let Some(ports) = w.kernel_ports {
        rec.table = true;
        save_record(netns, &rec)?;
        nft(
            &["-f", "-"],
            Some(&table_script(w.lan, w.wan, w.wan_addr, ports)),
        )
        .context("setting up the kernel slow-path NAT table")?;
        if w.wan_addr.is_unspecified() {
            info!(
                "kernel slow-path NAT: nftables table ip {TABLE}, {} -> {}: no WAN address, \
                 dropped",
                w.lan, w.wan
            );
        } else {
            info!(
                "kernel slow-path NAT: nftables table ip {TABLE}, {} -> {} source {}:{}-{}",
                w.lan, w.wan, w.wan_addr, ports.0, ports.1
            );
        }
    } else {
        if rec.table {
            remove_table();
            rec.table = false;
        }
        save_record(netns, &rec)?;
        warn!(
            "--no-kernel-nat: what XDP passes from {} (fragments, IP options, other \
             protocols, exhausted ports) needs a NAT rule of your own on {}, with ports \
             outside XDP's --port-range",
            w.lan, w.wan
        );
    }
    Ok(())
}

fn remove_table() {
    if table_present()
        && let Err(e) = nft(&["delete", "table", "ip", TABLE], None)
    {
        warn!("removing the nftables table ip {TABLE}: {e:#}");
    }
}

fn restore_sysctls(rec: &KernelSetup) {
    for (name, old) in [
        ("accept_local", &rec.accept_local),
        ("rp_filter", &rec.rp_filter),
    ] {
        if let Some(v) = old
            && let Err(e) = write_sysctl(&rec.lan, name, v)
        {
            // The interface may be gone, and its sysctls with it.
            warn!("restoring {name} of {}: {e:#}", rec.lan);
        }
    }
}

/// Undoes what [`set_up`] did (the table exactly, the sysctls to their
/// old values); nothing if it set up nothing.
pub fn tear_down(netns: Option<&str>) -> Result<bool> {
    let Some(rec) = load_record(netns)? else {
        return Ok(false);
    };
    if rec.table {
        remove_table();
    }
    restore_sysctls(&rec);
    forget(netns)?;
    Ok(true)
}

/// Removes the kernel side's record without undoing anything (what
/// [`tear_down`] does last; alone, for a router whose network namespace is
/// gone, its sysctls and table with it).
pub fn forget(netns: Option<&str>) -> Result<()> {
    crate::state::remove_private(&record_path(netns))
}

/// Whether two inclusive port ranges share a port.
#[must_use]
pub const fn overlap(a: (u16, u16), b: (u16, u16)) -> bool {
    a.0 <= b.1 && b.0 <= a.1
}

// ---------------------------------------------------------------------------
// Firewall rules standalone mode would bypass.
// ---------------------------------------------------------------------------

/// One netfilter chain that standalone mode would bypass: XDP admits and
/// redirects a flow's packets before every netfilter hook, so a forward
/// chain's rules, and a prerouting or postrouting filter chain's (raw,
/// mangle: where blocklists and parental blocks often sit), no longer see
/// them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ForwardChain {
    /// `nftables` or `iptables-legacy`.
    pub tool: &'static str,
    /// e.g. `table inet fw chain forward`.
    pub chain: String,
    pub policy_drop: bool,
    pub rules: usize,
}

impl ForwardChain {
    #[must_use]
    pub fn describe(&self) -> String {
        let mut what = Vec::new();
        if self.policy_drop {
            what.push("policy drop".to_owned());
        }
        if self.rules > 0 {
            what.push(format!(
                "{} rule{}",
                self.rules,
                if self.rules == 1 { "" } else { "s" }
            ));
        }
        format!("{} {} ({})", self.tool, self.chain, what.join(", "))
    }
}

/// Forward chains, and prerouting and postrouting chains of type filter
/// (iptables-nft's raw and mangle ones among them), with rules or a drop
/// policy in
/// nftables' ruleset JSON (`nft -j -t list ruleset`), our own table left
/// out. iptables-nft chains show up here too (tables `filter`, `raw`,
/// `mangle`). Prerouting's nat chains are the NAT checks' (a port forward
/// of the kernel's).
#[must_use]
pub fn nft_forward_chains(ruleset: &serde_json::Value) -> Vec<ForwardChain> {
    let items = ruleset
        .get("nftables")
        .and_then(serde_json::Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let s =
        |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_owned();
    let mut out = Vec::new();
    for item in items {
        let Some(c) = item.get("chain") else { continue };
        let family = s(c, "family");
        // Standalone mode admits IPv6 flows too: `ip6` chains count.
        let hook = s(c, "hook");
        let bypassed = hook == "forward"
            || (matches!(hook.as_str(), "prerouting" | "postrouting") && s(c, "type") == "filter");
        if !bypassed || !matches!(family.as_str(), "ip" | "ip6" | "inet") {
            continue;
        }
        let (table, name) = (s(c, "table"), s(c, "name"));
        if family == "ip" && table == TABLE {
            continue;
        }
        let rules = items
            .iter()
            .filter_map(|i| i.get("rule"))
            .filter(|r| s(r, "family") == family && s(r, "table") == table && s(r, "chain") == name)
            .count();
        let policy_drop = s(c, "policy") == "drop";
        if policy_drop || rules > 0 {
            let hook = if hook == "forward" {
                String::new()
            } else {
                format!(" (hook {hook})")
            };
            out.push(ForwardChain {
                tool: "nftables",
                chain: format!("table {family} {table} chain {name}{hook}"),
                policy_drop,
                rules,
            });
        }
    }
    out
}

/// The chains of a legacy iptables tool's tables standalone mode would
/// bypass: filter's FORWARD, raw's PREROUTING, mangle's PREROUTING,
/// FORWARD and POSTROUTING, with rules or a drop policy, from `iptables-save` output
/// (`save`: `*table`, `:CHAIN POLICY [..]`, `-A CHAIN ...` lines).
#[must_use]
pub fn iptables_bypassed_chains(tool: &'static str, save: &str) -> Vec<ForwardChain> {
    const BYPASSED: [(&str, &str); 5] = [
        ("filter", "FORWARD"),
        ("raw", "PREROUTING"),
        ("mangle", "PREROUTING"),
        ("mangle", "FORWARD"),
        ("mangle", "POSTROUTING"),
    ];
    let mut found: Vec<ForwardChain> = Vec::new();
    let mut table = "";
    for line in save.lines().map(str::trim) {
        if let Some(t) = line.strip_prefix('*') {
            table = t;
            continue;
        }
        let (chain, policy_drop) = if let Some(rest) = line.strip_prefix(':') {
            let mut f = rest.split_whitespace();
            let chain = f.next().unwrap_or("");
            (chain, matches!(f.next(), Some("DROP" | "REJECT")))
        } else if let Some(rest) = line.strip_prefix("-A ") {
            (rest.split_whitespace().next().unwrap_or(""), false)
        } else {
            continue;
        };
        if !BYPASSED.contains(&(table, chain)) {
            continue;
        }
        let name = format!("table {table} chain {chain}");
        let c = if let Some(c) = found.iter_mut().find(|c| c.chain == name) {
            c
        } else {
            found.push(ForwardChain {
                tool,
                chain: name,
                policy_drop: false,
                rules: 0,
            });
            found.last_mut().expect("just pushed")
        };
        if line.starts_with(':') {
            c.policy_drop |= policy_drop;
        } else {
            c.rules += 1;
        }
    }
    found.retain(|c| c.policy_drop || c.rules > 0);
    found
}

/// This namespace's nftables ruleset as JSON (`nft -j -t list ruleset`: terse,
/// without the sets' elements, which none of the checks reads and a
/// blocklist makes large; it runs at every `status` and every daemon pass), read
/// once for the checks that look at it ([`forward_chains`],
/// [`foreign_source_nat`]); else why it could not be read.
pub struct Ruleset(Result<serde_json::Value, Unread>);

/// Why something could not be read, and whether that may pass (`nft`
/// failing in a firewall reload at boot, a fork failing) or lasts (the
/// tool missing, output it cannot parse).
#[derive(Clone, Debug)]
pub struct Unread {
    pub why: String,
    pub transient: bool,
}

impl Unread {
    fn lasting(why: String) -> Self {
        Self {
            why,
            transient: false,
        }
    }

    fn transient(why: String) -> Self {
        Self {
            why,
            transient: true,
        }
    }
}

impl Ruleset {
    #[must_use]
    pub fn read() -> Self {
        let listed = Command::new("nft")
            .args(["-j", "-t", "list", "ruleset"])
            .stdin(Stdio::null())
            .output();
        Self(match listed {
            Ok(o) if o.status.success() => serde_json::from_slice(&o.stdout).map_err(|e| {
                Unread::lasting(format!("nft -j -t list ruleset: unreadable output ({e})"))
            }),
            Ok(o) => Err(Unread::transient(format!(
                "nftables not checked: nft -j -t list ruleset failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Unread::lasting(
                "nftables not checked: `nft` not found (iptables-nft rules are nftables rules \
                 too; `apt-get install nftables` lets them be read)"
                    .to_owned(),
            )),
            Err(e) => Err(Unread::transient(format!(
                "nftables not checked: running nft: {e}"
            ))),
        })
    }

    /// A ruleset that could not be read (for a reason that may pass, or
    /// not), for tests.
    #[cfg(test)]
    #[must_use]
    pub fn unreadable(why: &str, transient: bool) -> Self {
        Self(Err(Unread {
            why: why.to_owned(),
            transient,
        }))
    }
}

/// Whether any of iptables-legacy's tables `tables` exists; `names` lists
/// them (`/proc/net/ip_tables_names`, `ip6_tables_names`), read once.
/// Listing a legacy table that is not there would create it: look first.
fn legacy_table_exists(names: &str, tables: &[&str]) -> bool {
    fs::read_to_string(names).is_ok_and(|t| t.lines().any(|l| tables.contains(&l.trim())))
}

/// Seconds the legacy iptables tools wait for the xtables lock (`-w`): the
/// IPv4 and IPv6 tools one after the other stay within the daemon's
/// heartbeat window (3 ticks + 2 s).
const XTABLES_WAIT_SECS: &str = "3";

/// The forward chains of this namespace that standalone mode would
/// bypass (`ruleset`'s, and iptables-legacy's), and what could not be
/// checked.
#[must_use]
pub fn forward_chains(ruleset: &Ruleset) -> (Vec<ForwardChain>, Vec<Unread>) {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    match &ruleset.0 {
        Ok(v) => out.extend(nft_forward_chains(v)),
        Err(note) => notes.push(note.clone()),
    }
    for (names, tool, save) in [
        (
            "/proc/net/ip_tables_names",
            "iptables-legacy",
            "iptables-legacy-save",
        ),
        (
            "/proc/net/ip6_tables_names",
            "ip6tables-legacy",
            "ip6tables-legacy-save",
        ),
    ] {
        if !legacy_table_exists(names, &["filter", "raw", "mangle"]) {
            continue;
        }
        // The save reads the tables without the xtables lock: another tool
        // holding it (a long restore) does not stall the daemon's loop.
        match Command::new(save).stdin(Stdio::null()).output() {
            Ok(o) if o.status.success() => out.extend(iptables_bypassed_chains(
                tool,
                &String::from_utf8_lossy(&o.stdout),
            )),
            Ok(o) => notes.push(Unread::transient(format!(
                "{save} failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))),
            Err(e) => {
                let why = format!(
                    "legacy {tool} tables exist but {save} cannot run ({e}); their FORWARD, \
                     PREROUTING and POSTROUTING chains were not checked"
                );
                notes.push(if e.kind() == std::io::ErrorKind::NotFound {
                    Unread::lasting(why)
                } else {
                    Unread::transient(why)
                });
            }
        }
    }
    (out, notes)
}

/// Source NAT rules of the router's own (masquerade or snat), outside our
/// table, in nftables' ruleset JSON (iptables-nft's included), one line
/// per table: `table ip nat (2 rules)`.
#[must_use]
pub fn nft_source_nat(ruleset: &serde_json::Value) -> Vec<String> {
    let items = ruleset
        .get("nftables")
        .and_then(serde_json::Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let mut per_table: BTreeMap<String, usize> = BTreeMap::new();
    for r in items.iter().filter_map(|i| i.get("rule")) {
        let s = |k: &str| r.get(k).and_then(|x| x.as_str()).unwrap_or("");
        let (family, table) = (s("family"), s("table"));
        if !matches!(family, "ip" | "inet") || (family == "ip" && table == TABLE) {
            continue;
        }
        let expr = r.get("expr").map(ToString::to_string).unwrap_or_default();
        // Native expressions, or xtables targets (iptables-nft with
        // options it cannot translate).
        if ["\"masquerade\"", "\"snat\"", "\"MASQUERADE\"", "\"SNAT\""]
            .iter()
            .any(|e| expr.contains(e))
        {
            *per_table
                .entry(format!("table {family} {table}"))
                .or_default() += 1;
        }
    }
    per_table
        .into_iter()
        .map(|(t, n)| format!("nftables {t} ({n} rule{})", if n == 1 { "" } else { "s" }))
        .collect()
}

/// An nftables flowtable (software flow offloading: the `flow_offloading`
/// option of `OpenWrt`'s `fw4`, `flow add @ft` rules).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flowtable {
    /// `table inet fw4 flowtable ft`.
    pub name: String,
    /// The interfaces it is on.
    pub devices: Vec<String>,
    /// `flags offload`: the NIC forwards its flows.
    pub hardware: bool,
}

impl Flowtable {
    /// `table inet fw4 flowtable ft (devices lan0, wan0)`, with `, hardware
    /// offload` when it has the `offload` flag.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "{} (devices {}{})",
            self.name,
            if self.devices.is_empty() {
                "none".to_owned()
            } else {
                self.devices.join(", ")
            },
            if self.hardware {
                ", hardware offload"
            } else {
                ""
            }
        )
    }
}

/// The nftables flowtables in nftables' ruleset JSON.
#[must_use]
pub fn nft_flowtables(ruleset: &serde_json::Value) -> Vec<Flowtable> {
    let items = ruleset
        .get("nftables")
        .and_then(serde_json::Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    items
        .iter()
        .filter_map(|i| i.get("flowtable"))
        .map(|f| {
            let s = |k: &str| f.get(k).and_then(|x| x.as_str()).unwrap_or("?");
            // One device is a string, more an array.
            let devices = match f.get("dev") {
                Some(serde_json::Value::String(d)) => vec![d.clone()],
                Some(serde_json::Value::Array(a)) => a
                    .iter()
                    .filter_map(serde_json::Value::as_str)
                    .map(str::to_owned)
                    .collect(),
                _ => Vec::new(),
            };
            Flowtable {
                name: format!(
                    "table {} {} flowtable {}",
                    s("family"),
                    s("table"),
                    s("name")
                ),
                devices,
                hardware: f
                    .get("flags")
                    .map(ToString::to_string)
                    .is_some_and(|flags| flags.contains("\"offload\"")),
            }
        })
        .collect()
}

/// [`nft_flowtables`] of a ruleset read (none when it could not be).
#[must_use]
pub fn flowtables(ruleset: &Ruleset) -> Vec<Flowtable> {
    ruleset.0.as_ref().map(nft_flowtables).unwrap_or_default()
}

/// `iptables -t nat -S` output's MASQUERADE and SNAT rules, counted.
#[must_use]
pub fn iptables_source_nat(listing: &str) -> usize {
    listing
        .lines()
        .filter(|l| l.starts_with("-A ") && (l.contains("-j MASQUERADE") || l.contains("-j SNAT")))
        .count()
}

/// The router's own source NAT rules besides standalone mode's table: the
/// kernel may apply them first to what XDP passes from the LAN (netfilter
/// runs NAT chains of equal priority in registration order), with ports
/// of XDP's range, which its conntrack does not know are taken. Empty with
/// none (or none readable).
#[must_use]
pub fn foreign_source_nat(ruleset: &Ruleset) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(v) = &ruleset.0 {
        out.extend(nft_source_nat(v));
    }
    if legacy_table_exists("/proc/net/ip_tables_names", &["nat"])
        && let Ok(o) = Command::new("iptables-legacy")
            .args(["-w", XTABLES_WAIT_SECS, "-t", "nat", "-S"])
            .output()
        && o.status.success()
    {
        let n = iptables_source_nat(&String::from_utf8_lossy(&o.stdout));
        if n > 0 {
            out.push(format!(
                "iptables-legacy table nat ({n} MASQUERADE/SNAT rule{})",
                if n == 1 { "" } else { "s" }
            ));
        }
    }
    out
}

/// The warning for [`foreign_source_nat`]'s rules, with the fix.
#[must_use]
pub fn source_nat_message(rules: &[String]) -> String {
    format!(
        "this router has source NAT rules of its own ({}): if they match traffic from the LAN \
         to the WAN, the kernel may translate what XDP passes (fragments, other protocols, \
         flows past XDP's port search) with them instead of standalone mode's table \
         (61000-65535 by default), picking ports XDP has mapped: replies then reach the wrong \
         host. Remove them for LAN->WAN traffic (standalone's table masquerades it), or keep \
         them with ports outside XDP's --port-range and attach with --no-kernel-nat",
        rules.join("; ")
    )
}

/// The message for forward chains standalone mode would bypass, with the
/// fix and, last, `override_how`: how this command's user bypasses them.
#[must_use]
pub fn bypass_message(chains: &[ForwardChain], override_how: &str) -> String {
    format!(
        "this router has netfilter forward rules that standalone mode (--admit xdp) would \
         bypass: {}. XDP would admit every LAN flow and every port forward itself, so those \
         rules would no longer decide. Fix: use offload mode (--admit kernel, the default; \
         `router-ctl run` moves the flows your firewall admits onto the fast path), or \
         {override_how}",
        describe_chains(chains)
    )
}

/// `chains` as the messages about them list them.
fn describe_chains(chains: &[ForwardChain]) -> String {
    chains
        .iter()
        .map(ForwardChain::describe)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The forward rules standalone mode bypasses now although its attach did
/// not accept them (`accepted`: the chains a bypass as asked found, as
/// [`ForwardChain::describe`] says them; added later: a firewall turned
/// on, a rule to block a host), as the problem `status` and the daemon
/// report; `None` without any (or where none could be read: `doctor` says
/// which). `Err` where they could not all be read.
pub fn bypassed_unasked(accepted: &[String]) -> Result<Option<String>, ()> {
    let (chains, unread) = forward_chains(&Ruleset::read());
    if chains.is_empty() && !unread.is_empty() {
        return Err(());
    }
    let chains = not_accepted(chains, accepted);
    Ok((!chains.is_empty()).then(|| {
        format!(
            "netfilter forward rules the attach did not bypass knowingly (added since, or \
             attached by a router-ctl that did not record it) are BYPASSED: {}. Standalone mode \
             (--admit xdp) admits every LAN flow and port forward itself, so these rules do not \
             decide. Fix: offload mode keeps them in charge (`router-ctl attach LAN WAN --admit \
             kernel`, with `router-ctl run`), or accept the bypass (attach again with \
             --bypass-forward-rules, or `bypass_forward_rules = true` in an apply file)",
            describe_chains(&chains)
        )
    }))
}

/// Of `chains`, those a bypass did not accept: not in `accepted`, or with
/// other rules (a rule added to an accepted chain changes its count).
fn not_accepted(chains: Vec<ForwardChain>, accepted: &[String]) -> Vec<ForwardChain> {
    chains
        .into_iter()
        .filter(|c| !accepted.contains(&c.describe()))
        .collect()
}

/// The warning of a standalone attach forced over the forward rules
/// `chains` (`--bypass-forward-rules`, `bypass_forward_rules = true`).
#[must_use]
pub fn bypassing_message(chains: &[ForwardChain]) -> String {
    format!(
        "bypassing the router's netfilter forward rules, as asked: {}. XDP admits every LAN \
         flow and every port forward itself, so those rules no longer decide; offload mode \
         (--admit kernel) keeps them in charge",
        describe_chains(chains)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bypass accepts the chains it found as they were: one added since,
    /// or an accepted one with a rule more, is bypassed unasked.
    #[test]
    fn a_bypass_accepts_only_the_chains_it_found_as_they_were() {
        let chain = |name: &str, rules: usize| ForwardChain {
            tool: "nftables",
            chain: format!("table inet fw chain {name}"),
            policy_drop: true,
            rules,
        };
        let accepted = vec![chain("forward", 1).describe()];
        assert_eq!(
            accepted,
            ["nftables table inet fw chain forward (policy drop, 1 rule)"]
        );
        assert!(not_accepted(vec![chain("forward", 1)], &accepted).is_empty());
        let later = not_accepted(vec![chain("forward", 2), chain("fwd2", 0)], &accepted);
        assert_eq!(later, vec![chain("forward", 2), chain("fwd2", 0)]);
        assert_eq!(not_accepted(vec![chain("forward", 1)], &[]).len(), 1);
    }

    #[test]
    fn ranges_overlap_only_when_they_share_a_port() {
        assert!(!overlap(DEFAULT_XDP_PORTS, DEFAULT_KERNEL_PORTS));
        assert!(overlap((1024, 61000), DEFAULT_KERNEL_PORTS));
        assert!(overlap((65535, 65535), DEFAULT_KERNEL_PORTS));
        assert!(!overlap((1, 1), (2, 2)));
    }

    #[test]
    fn table_script_skips_translated_packets_and_limits_ports() {
        let t = table_script(
            "lan0",
            "wan0",
            Ipv4Addr::new(203, 0, 113, 1),
            (61000, 65535),
        );
        assert!(
            t.starts_with("table ip xdp_router\ndelete table ip xdp_router\n"),
            "{t}"
        );
        assert!(
            t.contains(
                "iifname \"lan0\" oifname \"wan0\" ip saddr != 203.0.113.1 meta l4proto { tcp, \
                 udp, icmp } snat ip to 203.0.113.1:61000-65535"
            ),
            "{t}"
        );
        // After the NAT (srcnat + 10): what it left untranslated is dropped.
        assert!(
            t.contains(
                "chain untranslated {\n\t\ttype filter hook postrouting priority srcnat + 10; \
                 policy accept;\n\t\tiifname \"lan0\" oifname \"wan0\" ip saddr != 203.0.113.1 \
                 counter drop\n"
            ),
            "{t}"
        );
        // The addresses the kernel forwards to out of the LAN, and the
        // errors leaving on the WAN about connections to them.
        assert!(
            t.contains(
                "set lan_destinations {\n\t\ttype ipv4_addr\n\t\tsize 65536\n\t\tflags \
                 dynamic,timeout\n\t\ttimeout 1m\n\t}"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "chain to_lan {\n\t\ttype filter hook forward priority raw; policy accept;\n\t\t\
                 oifname \"lan0\" ct state new update @lan_destinations { ip daddr }\n\t}"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "counter drop\n\t\toifname \"wan0\" icmp type { destination-unreachable, \
                 source-quench, redirect, time-exceeded, parameter-problem } ct state related ct \
                 original ip daddr @lan_destinations counter drop\n\t}"
            ),
            "{t}"
        );
    }

    #[test]
    fn table_script_without_a_wan_address_translates_nothing_and_drops_all_to_the_wan() {
        let t = table_script("lan0", "wan0", Ipv4Addr::UNSPECIFIED, (61000, 65535));
        assert!(!t.contains("snat"), "{t}");
        assert!(
            t.contains(
                "chain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy \
                 accept;\n\t}"
            ),
            "{t}"
        );
        // A forwarded LAN packet never has source 0.0.0.0 (a martian): all
        // of them are dropped.
        assert!(
            t.contains("iifname \"lan0\" oifname \"wan0\" ip saddr != 0.0.0.0 counter drop\n"),
            "{t}"
        );
        // Otherwise the same table (the kernel side's check finds it whole).
        let whole = table_script("lan0", "wan0", Ipv4Addr::new(203, 0, 113, 1), (1, 2));
        assert_eq!(t.lines().count() + 2, whole.lines().count(), "{t}\n{whole}");
    }

    #[test]
    fn forward_chains_found_in_nft_json() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"nftables":[{"metainfo":{}},
            {"chain":{"family":"inet","table":"fw","name":"fwd","hook":"forward","policy":"drop"}},
            {"chain":{"family":"ip","table":"filter","name":"FORWARD","hook":"forward","policy":"accept"}},
            {"chain":{"family":"ip","table":"t2","name":"f","hook":"forward","policy":"accept"}},
            {"rule":{"family":"ip","table":"t2","chain":"f","expr":[]}},
            {"rule":{"family":"ip","table":"t2","chain":"f","expr":[]}},
            {"chain":{"family":"ip","table":"xdp_router","name":"postrouting","hook":"postrouting"}},
            {"chain":{"family":"ip6","table":"fw6","name":"fwd","hook":"forward","policy":"drop"}},
            {"chain":{"family":"bridge","table":"br","name":"fwd","hook":"forward","policy":"drop"}},
            {"chain":{"family":"inet","table":"fw","name":"in","hook":"input","policy":"drop"}},
            {"chain":{"family":"inet","table":"blk","name":"pre","type":"filter","hook":"prerouting","policy":"accept"}},
            {"rule":{"family":"inet","table":"blk","chain":"pre","expr":[]}},
            {"chain":{"family":"ip","table":"raw","name":"PREROUTING","type":"filter","hook":"prerouting","policy":"accept"}},
            {"chain":{"family":"ip","table":"nat","name":"PREROUTING","type":"nat","hook":"prerouting","policy":"accept"}},
            {"rule":{"family":"ip","table":"nat","chain":"PREROUTING","expr":[]}}]}"#,
        )
        .unwrap();
        let c = nft_forward_chains(&v);
        assert_eq!(c.len(), 4, "{c:?}");
        assert_eq!(c[0].chain, "table inet fw chain fwd");
        assert!(c[0].policy_drop);
        assert_eq!((c[1].rules, c[1].policy_drop), (2, false));
        assert!(c[1].describe().contains("2 rules"));
        // IPv6's: standalone admits IPv6 flows too. A bridge's do not
        // see routed traffic.
        assert_eq!(c[2].chain, "table ip6 fw6 chain fwd");
        // A prerouting filter chain with a rule (a blocklist, a parental
        // block): bypassed too. An empty one, and a nat one (a port
        // forward of the kernel's, the NAT checks'), not listed.
        assert_eq!(
            c[3].describe(),
            "nftables table inet blk chain pre (hook prerouting) (1 rule)"
        );
    }

    #[test]
    fn flowtables_found_in_nft_json() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"nftables":[{"metainfo":{}},
            {"flowtable":{"family":"inet","name":"ft","table":"fw4","handle":1,"hook":"ingress","prio":-100,"dev":["lan0","wan0"]}},
            {"flowtable":{"family":"ip","name":"hw","table":"t","hook":"ingress","prio":0,"dev":"wan0","flags":["offload"]}},
            {"chain":{"family":"inet","table":"fw4","name":"forward","hook":"forward","policy":"drop"}}]}"#,
        )
        .unwrap();
        let f = nft_flowtables(&v);
        assert_eq!(
            f.iter().map(Flowtable::describe).collect::<Vec<_>>(),
            [
                "table inet fw4 flowtable ft (devices lan0, wan0)",
                "table ip t flowtable hw (devices wan0, hardware offload)"
            ]
        );
        assert_eq!((f[0].hardware, f[1].hardware), (false, true));
        assert_eq!(f[1].devices, ["wan0"]);
        assert!(nft_flowtables(&serde_json::json!({"nftables": []})).is_empty());
    }

    #[test]
    fn source_nat_rules_found_in_nft_json_and_iptables() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"nftables":[
            {"rule":{"family":"ip","table":"nat","chain":"POSTROUTING","expr":[{"masquerade":null}]}},
            {"rule":{"family":"ip","table":"nat","chain":"POSTROUTING","expr":[{"snat":{"addr":"1.2.3.4"}}]}},
            {"rule":{"family":"inet","table":"fw","chain":"srcnat","expr":[{"xt":{"type":"target","name":"MASQUERADE"}}]}},
            {"rule":{"family":"inet","table":"fw","chain":"fwd","expr":[{"accept":null}]}},
            {"rule":{"family":"ip","table":"xdp_router","chain":"postrouting","expr":[{"snat":{}}]}},
            {"rule":{"family":"ip6","table":"nat6","chain":"p","expr":[{"masquerade":null}]}}]}"#,
        )
        .unwrap();
        assert_eq!(
            nft_source_nat(&v),
            [
                "nftables table inet fw (1 rule)",
                "nftables table ip nat (2 rules)"
            ]
        );
        assert_eq!(
            iptables_source_nat(
                "-P POSTROUTING ACCEPT\n-A POSTROUTING -o wan0 -j MASQUERADE\n\
                 -A POSTROUTING -j SNAT --to-source 1.2.3.4\n-A PREROUTING -j DNAT --to 1.2.3.4\n"
            ),
            2
        );
    }

    /// `iptables-save` output: filter's FORWARD, raw's and mangle's
    /// PREROUTING and mangle's FORWARD count; other chains (INPUT, nat's
    /// PREROUTING, raw's OUTPUT) do not.
    #[test]
    fn iptables_save_listing() {
        let empty = "*filter\n:INPUT DROP [0:0]\n:FORWARD ACCEPT [0:0]\n\
                     -A INPUT -j ACCEPT\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n\
                     -A PREROUTING -p tcp --dport 22 -j DNAT --to 10.0.0.2\nCOMMIT\n\
                     *raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
                     -A OUTPUT -j NOTRACK\nCOMMIT\n";
        assert_eq!(iptables_bypassed_chains("iptables-legacy", empty), vec![]);
        let save = "# Generated by iptables-save\n*mangle\n:PREROUTING ACCEPT [0:0]\n\
                    :FORWARD ACCEPT [0:0]\n-A FORWARD -j MARK --set-xmark 0x1/0xffffffff\n\
                    COMMIT\n*filter\n:FORWARD DROP [0:0]\n-A FORWARD -i lan0 -j ACCEPT\n\
                    COMMIT\n*raw\n:PREROUTING ACCEPT [0:0]\n\
                    -A PREROUTING -s 10.0.0.3/32 -p tcp -m tcp --dport 80 -j DROP\n\
                    -A PREROUTING -s 10.0.0.4/32 -j DROP\nCOMMIT\n";
        let found: Vec<(String, bool, usize)> = iptables_bypassed_chains("iptables-legacy", save)
            .into_iter()
            .map(|c| (c.chain, c.policy_drop, c.rules))
            .collect();
        assert_eq!(
            found,
            [
                ("table mangle chain FORWARD".to_owned(), false, 1),
                ("table filter chain FORWARD".to_owned(), true, 1),
                ("table raw chain PREROUTING".to_owned(), false, 2),
            ]
        );
    }
}
