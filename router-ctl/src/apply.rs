//! `apply FILE`: the router from one declarative TOML file. The whole file
//! is parsed and validated (every error with its line and field) before
//! anything changes; then the router is attached, replaced or left alone,
//! and the port-forward rules and IPv6 pinholes are made to match the file
//! exactly. Applying the same file twice changes nothing.

use std::{collections::BTreeMap, fmt::Write as _, net::SocketAddrV4, path::Path};

use anyhow::{Context, Result, bail};
use router_common::maps::{
    DEFAULT_MAX_FLOWS, FlowState, MAX_PINHOLES6, MAX_PORT_FORWARDS, PinholeKey6, PortForwardKey,
    PortForwardTarget, Timeouts,
};
use serde::Deserialize;
use toml::Spanned;

use crate::{
    config::{
        self, AdmitMode, AttachArgs, ConfigError, ConfigField, FilteringMode, ForwardRules, Mode,
        MssClamp,
    },
    ctx::Ctx,
    forward::{self, Rule},
    lifecycle::{self, Outcome},
    maps::{PinnedMaps, snapshot},
    parse::{self, ForwardFrom, MAX_FLOWS_LIMIT, Proto, TimeoutArg, WanAddr},
    standalone, state,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    router: Option<RouterSection>,
    interfaces: Spanned<Interfaces>,
    #[serde(default)]
    nat: Option<Nat>,
    #[serde(default)]
    timeouts: Option<BTreeMap<Spanned<String>, Spanned<i64>>>,
    #[serde(default, rename = "forward")]
    forwards: Vec<Spanned<Forward>>,
    /// IPv6 pinholes: `[[pinhole]] proto = "tcp", to = "[LAN_ADDR6]:PORT"`.
    #[serde(default, rename = "pinhole")]
    pinholes: Vec<Spanned<Pinhole>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Pinhole {
    proto: Spanned<String>,
    to: Spanned<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouterSection {
    #[serde(default)]
    admit: Option<Spanned<String>>,
    #[serde(default)]
    filtering: Option<Spanned<String>>,
    /// `"pmtu"`, `"off"` or an MTU (`1492`, a number or a string).
    #[serde(default)]
    clamp_mss: Option<Spanned<StringOrNumber>>,
    /// Standalone mode over netfilter forward rules it would bypass (what
    /// `attach --bypass-forward-rules` does).
    #[serde(default)]
    bypass_forward_rules: Option<bool>,
}

/// A value a file may write as a string or a number.
#[derive(Debug, Deserialize)]
#[serde(
    untagged,
    expecting = "off, pmtu or an MTU (a string, or a number such as 1492)"
)]
enum StringOrNumber {
    String(String),
    Number(i64),
}

impl StringOrNumber {
    fn text(&self) -> String {
        match self {
            Self::String(s) => s.clone(),
            Self::Number(n) => n.to_string(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Interfaces {
    lan: Spanned<String>,
    wan: Spanned<String>,
    #[serde(default)]
    mode: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Nat {
    #[serde(default)]
    wan_addr: Option<Spanned<String>>,
    #[serde(default)]
    port_range: Option<Spanned<String>>,
    /// Standalone: set up the kernel slow-path NAT table.
    #[expect(
        clippy::struct_field_names,
        reason = "named as the TOML key `nat.kernel_nat`"
    )]
    #[serde(default)]
    kernel_nat: Option<Spanned<bool>>,
    #[serde(default)]
    kernel_nat_ports: Option<Spanned<String>>,
    #[serde(default)]
    max_flows: Option<Spanned<i64>>,
}

/// What the `[nat]` section says.
struct NatValues {
    wan_addr: WanAddr,
    port_range: (u16, u16),
    kernel_nat: bool,
    kernel_nat_ports: (u16, u16),
    max_flows: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Forward {
    proto: Spanned<String>,
    wan_port: Spanned<i64>,
    to: Spanned<String>,
}

/// A validated file: what `attach` gets and the rules.
#[derive(Clone, Debug)]
pub struct Desired {
    pub args: AttachArgs,
    pub forwards: Vec<(PortForwardKey, PortForwardTarget)>,
    pub pinholes: Vec<PinholeKey6>,
}

/// 1-based line and column of byte `offset` in `text`.
#[must_use]
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |p| before.len() - p - 1)
        + 1;
    (line, col)
}

/// The dotted name of the key whose line holds `offset`: the nearest
/// `[table]` or `[[array]]` header above it, plus the key before `=`.
#[must_use]
pub fn field_at(text: &str, offset: usize) -> Option<String> {
    // An error about the whole file (a missing table) starts at its first
    // byte: no field to name.
    if offset == 0 {
        return None;
    }
    let (line, _) = line_col(text, offset);
    let lines: Vec<&str> = text.lines().collect();
    let cur = lines.get(line - 1)?;
    let header_of = |l: &str| {
        let t = l.trim();
        t.strip_prefix("[[")
            .and_then(|x| x.strip_suffix("]]"))
            .or_else(|| t.strip_prefix('[').and_then(|x| x.strip_suffix(']')))
            .map(|h| h.trim().to_owned())
    };
    // A table header itself (an unknown table): its own name, not the
    // table before it.
    if let Some(h) = header_of(cur) {
        return Some(h);
    }
    let key = cur.split_once('=').map(|(k, _)| k.trim().trim_matches('"'));
    let header = lines[..line - 1].iter().rev().find_map(|l| header_of(l));
    match (header, key) {
        (Some(h), Some(k)) if !k.is_empty() && !k.starts_with('[') => Some(format!("{h}.{k}")),
        (None, Some(k)) if !k.is_empty() && !k.starts_with('[') => Some(k.to_owned()),
        (Some(h), _) => Some(h),
        _ => None,
    }
}

struct Errors<'a> {
    name: &'a str,
    text: &'a str,
    list: Vec<String>,
}

impl Errors<'_> {
    fn at(&mut self, span: std::ops::Range<usize>, field: &str, msg: impl std::fmt::Display) {
        let (line, _) = line_col(self.text, span.start);
        self.list
            .push(format!("{}:{line}: {field}: {msg}", self.name));
    }
}

/// Parses and validates a file's text. `name` is used in messages.
#[cfg(test)]
pub fn parse_file(name: &str, text: &str) -> Result<Desired> {
    parse_file_as(name, text, AdmitMode::default_for_attach)
}

/// Parses and validates a file's text (`name` is used in messages);
/// `unstated` gives the admit mode of a file that states none
/// ([`lifecycle::unstated_admit`]), asked only then.
pub fn parse_file_as(
    name: &str,
    text: &str,
    unstated: impl FnOnce() -> AdmitMode,
) -> Result<Desired> {
    let file: File = toml::from_str(text).map_err(|e| {
        let (line, col) = e.span().map_or((0, 0), |s| line_col(text, s.start));
        let field = e
            .span()
            .and_then(|s| field_at(text, s.start))
            .map_or(String::new(), |f| format!("{f}: "));
        anyhow::anyhow!(
            "{name}:{line}:{col}: {field}{}; nothing was changed",
            e.message().trim_end()
        )
    })?;
    let mut errs = Errors {
        name,
        text,
        list: Vec::new(),
    };
    let admit = errs.admit(file.router.as_ref(), unstated);
    let filtering = errs.filtering(file.router.as_ref(), admit);
    let mss_clamp = errs.mss_clamp(file.router.as_ref(), admit);
    let (lan, wan, mode) = errs.interfaces(file.interfaces.get_ref());
    let nat = errs.nat(file.nat.as_ref());
    if admit == AdmitMode::Xdp
        && nat.kernel_nat
        && standalone::overlap(nat.port_range, nat.kernel_nat_ports)
    {
        let at = file
            .nat
            .as_ref()
            .and_then(|n| n.port_range.as_ref().or(n.kernel_nat_ports.as_ref()))
            .map_or(0..0, Spanned::span);
        errs.at(
            at,
            "nat.port_range",
            format!(
                "XDP's ports {}-{} overlap the kernel slow-path NAT's {}-{} \
                 (nat.kernel_nat_ports): make them disjoint, or set nat.kernel_nat = false",
                nat.port_range.0, nat.port_range.1, nat.kernel_nat_ports.0, nat.kernel_nat_ports.1
            ),
        );
    }
    let timeouts = errs.timeouts(file.timeouts.iter().flatten());
    let forwards = errs.forwards(&file.forwards);
    if admit == AdmitMode::Kernel
        && let Some(f) = file.forwards.first()
    {
        errs.at(
            f.span(),
            "forward",
            "port forwards are the kernel's DNAT rules in offload mode (router.admit = \
             \"kernel\"): write them in nftables/iptables, or use admit = \"xdp\"",
        );
    }
    let pinholes = errs.pinholes(&file.pinholes);
    if admit == AdmitMode::Kernel
        && let Some(p) = file.pinholes.first()
    {
        errs.at(
            p.span(),
            "pinhole",
            "inbound IPv6 is the kernel firewall's in offload mode (router.admit = \
             \"kernel\"): allow it in nftables/ip6tables, or use admit = \"xdp\"",
        );
    }
    if !errs.list.is_empty() {
        let n = errs.list.len();
        bail!(
            "{name} is not valid ({n} error{}); nothing was changed:\n  {}",
            if n == 1 { "" } else { "s" },
            errs.list.join("\n  ")
        );
    }
    Ok(Desired {
        args: AttachArgs {
            admit,
            filtering,
            mss_clamp,
            lan,
            wan,
            mode,
            wan_addr: nat.wan_addr,
            port_range: nat.port_range,
            kernel_nat: nat.kernel_nat,
            kernel_nat_ports: nat.kernel_nat_ports,
            max_flows: nat.max_flows,
            timeouts,
            force: false,
            forward_rules: if file.router.and_then(|r| r.bypass_forward_rules) == Some(true) {
                ForwardRules::Bypass
            } else {
                ForwardRules::Refuse
            },
            bypass_how: None,
            apply_file: None,
            reload: false,
            object: None,
        },
        forwards,
        pinholes,
    })
}

/// The checks of each section: each returns what it could read (defaults
/// where a value is wrong) and records what is wrong, so every error of a
/// file is reported at once.
impl Errors<'_> {
    fn admit(
        &mut self,
        router: Option<&RouterSection>,
        unstated: impl FnOnce() -> AdmitMode,
    ) -> AdmitMode {
        let Some(a) = router.and_then(|r| r.admit.as_ref()) else {
            return unstated();
        };
        AdmitMode::from_name(a.get_ref()).unwrap_or_else(|| {
            self.at(
                a.span(),
                "router.admit",
                format!(
                    "{:?} is not an admit mode (expected kernel or xdp)",
                    a.get_ref()
                ),
            );
            AdmitMode::default_for_attach()
        })
    }

    fn filtering(&mut self, router: Option<&RouterSection>, admit: AdmitMode) -> FilteringMode {
        let Some(f) = router.and_then(|r| r.filtering.as_ref()) else {
            return FilteringMode::default();
        };
        let Some(mode) = FilteringMode::from_name(f.get_ref()) else {
            self.at(
                f.span(),
                "router.filtering",
                format!(
                    "{:?} is not a filtering behaviour (expected address-port-dependent, \
                     address-dependent or endpoint-independent)",
                    f.get_ref()
                ),
            );
            return FilteringMode::default();
        };
        if admit == AdmitMode::Kernel && mode != FilteringMode::default() {
            self.at(f.span(), "router.filtering", config::OFFLOAD_FILTERING);
        }
        mode
    }

    fn mss_clamp(&mut self, router: Option<&RouterSection>, admit: AdmitMode) -> Option<MssClamp> {
        let c = router.and_then(|r| r.clamp_mss.as_ref())?;
        let clamp = MssClamp::parse(&c.get_ref().text())
            .map_err(|e| self.at(c.span(), "router.clamp_mss", e))
            .ok()?;
        if admit == AdmitMode::Kernel && clamp != MssClamp::Off {
            self.at(c.span(), "router.clamp_mss", config::OFFLOAD_MSS_CLAMP);
        }
        Some(clamp)
    }

    fn interfaces(&mut self, ifs: &Interfaces) -> (String, String, Mode) {
        let (lan, wan) = (ifs.lan.get_ref().trim(), ifs.wan.get_ref().trim());
        for (v, f, field) in [
            (lan, &ifs.lan, "interfaces.lan"),
            (wan, &ifs.wan, "interfaces.wan"),
        ] {
            if v.is_empty() || v.len() > 15 || v.contains(['/', ' ']) {
                self.at(f.span(), field, format!("{v:?} is not an interface name"));
            }
        }
        if !lan.is_empty() && lan == wan {
            self.at(
                ifs.wan.span(),
                "interfaces.wan",
                format!(
                    "LAN and WAN are the same interface ({lan}); give two different interfaces"
                ),
            );
        }
        let mode = match &ifs.mode {
            None => Mode::Auto,
            Some(m) => Mode::from_name(m.get_ref()).unwrap_or_else(|| {
                self.at(
                    m.span(),
                    "interfaces.mode",
                    format!(
                        "{:?} is not a mode (expected auto, native or generic)",
                        m.get_ref()
                    ),
                );
                Mode::Auto
            }),
        };
        (lan.to_owned(), wan.to_owned(), mode)
    }

    fn nat(&mut self, nat: Option<&Nat>) -> NatValues {
        let mut v = NatValues {
            wan_addr: WanAddr::Auto,
            port_range: standalone::DEFAULT_XDP_PORTS,
            kernel_nat: true,
            kernel_nat_ports: standalone::DEFAULT_KERNEL_PORTS,
            max_flows: DEFAULT_MAX_FLOWS,
        };
        let Some(nat) = nat else {
            return v;
        };
        if let Some(a) = &nat.wan_addr {
            match parse::parse_wan_addr(a.get_ref()) {
                Ok(x) => v.wan_addr = x,
                Err(e) => self.at(a.span(), "nat.wan_addr", e),
            }
        }
        for (field, value, out) in [
            ("nat.port_range", &nat.port_range, &mut v.port_range),
            (
                "nat.kernel_nat_ports",
                &nat.kernel_nat_ports,
                &mut v.kernel_nat_ports,
            ),
        ] {
            if let Some(r) = value {
                match parse::parse_port_range(r.get_ref()) {
                    Ok(x) => *out = x,
                    Err(e) => self.at(r.span(), field, e),
                }
            }
        }
        if let Some(k) = &nat.kernel_nat {
            v.kernel_nat = *k.get_ref();
        }
        if let Some(m) = &nat.max_flows {
            match u32::try_from(*m.get_ref()) {
                Ok(n) if (1..=MAX_FLOWS_LIMIT).contains(&n) => v.max_flows = n,
                _ => self.at(
                    m.span(),
                    "nat.max_flows",
                    format!(
                        "{} flows is out of range (expected 1-{MAX_FLOWS_LIMIT})",
                        m.get_ref()
                    ),
                ),
            }
        }
        v
    }

    fn timeouts<'f>(
        &mut self,
        table: impl Iterator<Item = (&'f Spanned<String>, &'f Spanned<i64>)>,
    ) -> Timeouts {
        let mut targs = Vec::new();
        for (k, v) in table {
            let field = format!("timeouts.{}", k.get_ref());
            let Some(state) = FlowState::from_key(k.get_ref()) else {
                self.at(
                    k.span(),
                    &field,
                    format!("unknown state (expected one of {})", FlowState::KEYS),
                );
                continue;
            };
            match u32::try_from(*v.get_ref()) {
                Ok(secs) if secs >= 1 => targs.push(TimeoutArg { state, secs }),
                _ => self.at(
                    v.span(),
                    &field,
                    format!(
                        "{} is not a timeout (expected 1-{} seconds)",
                        v.get_ref(),
                        u32::MAX
                    ),
                ),
            }
        }
        // Keys of a TOML table are unique, so no state is given twice.
        parse::apply_timeouts(&targs).unwrap_or_default()
    }

    fn forwards(
        &mut self,
        forwards: &[Spanned<Forward>],
    ) -> Vec<(PortForwardKey, PortForwardTarget)> {
        let mut out = Vec::new();
        let mut seen: BTreeMap<(Proto, u16), usize> = BTreeMap::new();
        if forwards.len() > MAX_PORT_FORWARDS as usize {
            self.at(
                forwards[MAX_PORT_FORWARDS as usize].span(),
                "forward",
                format!("more than {MAX_PORT_FORWARDS} rules"),
            );
        }
        for f in forwards {
            let fw = f.get_ref();
            let (proto, port, to) = self.forward(fw);
            if let (Some(p), Some(port)) = (proto, port) {
                let (line, _) = line_col(self.text, fw.wan_port.span().start);
                if let Some(first) = seen.insert((p, port), line) {
                    self.at(
                        fw.wan_port.span(),
                        "forward.wan_port",
                        format!(
                            "{} {port} is forwarded twice (first at line {first}); a WAN port \
                             can have one rule",
                            p.name()
                        ),
                    );
                }
                if let Some(t) = to {
                    out.push((forward::key(p, port), forward::target(t)));
                }
            }
        }
        out
    }

    /// The `[[pinhole]]`s, each valid and given once.
    fn pinholes(&mut self, pinholes: &[Spanned<Pinhole>]) -> Vec<PinholeKey6> {
        let mut out: Vec<PinholeKey6> = Vec::new();
        if pinholes.len() > MAX_PINHOLES6 as usize {
            self.at(
                pinholes[MAX_PINHOLES6 as usize].span(),
                "pinhole",
                format!("more than {MAX_PINHOLES6} pinholes"),
            );
        }
        for p in pinholes {
            let ph = p.get_ref();
            let proto = match ph.proto.get_ref().as_str() {
                "tcp" => Some(Proto::Tcp),
                "udp" => Some(Proto::Udp),
                other => {
                    self.at(
                        ph.proto.span(),
                        "pinhole.proto",
                        format!("{other:?} is not tcp or udp"),
                    );
                    None
                }
            };
            // Only the `[LAN_ADDR6]:PORT` form: anything else (an IPv4
            // target, a bare port) gets that form's message, not a port's.
            let given = ph.to.get_ref();
            let parsed = if given.starts_with('[') {
                parse::parse_forward_from(given)
            } else {
                Ok(ForwardFrom::WanPort(0))
            };
            let to = match parsed {
                Ok(ForwardFrom::Pinhole6(a)) => Some(a),
                Ok(ForwardFrom::WanPort(_)) => {
                    self.at(
                        ph.to.span(),
                        "pinhole.to",
                        format!(
                            "{:?} is not [LAN_ADDR6]:PORT (example: [2001:db8:50::2]:22)",
                            ph.to.get_ref()
                        ),
                    );
                    None
                }
                Err(e) => {
                    self.at(ph.to.span(), "pinhole.to", e);
                    None
                }
            };
            if let (Some(proto), Some(to)) = (proto, to) {
                let k = forward::pinhole_key(proto, to);
                if out.contains(&k) {
                    self.at(
                        ph.to.span(),
                        "pinhole.to",
                        format!("{} {to} is given twice", proto.name()),
                    );
                } else {
                    out.push(k);
                }
            }
        }
        out
    }

    /// One `[[forward]]`: its protocol, WAN port and target, each if valid.
    fn forward(&mut self, fw: &Forward) -> (Option<Proto>, Option<u16>, Option<SocketAddrV4>) {
        let proto = match fw.proto.get_ref().as_str() {
            "tcp" => Some(Proto::Tcp),
            "udp" => Some(Proto::Udp),
            other => {
                self.at(
                    fw.proto.span(),
                    "forward.proto",
                    format!("{other:?} is not tcp or udp"),
                );
                None
            }
        };
        let port = match u16::try_from(*fw.wan_port.get_ref()) {
            Ok(p) if p >= 1 => Some(p),
            _ => {
                self.at(
                    fw.wan_port.span(),
                    "forward.wan_port",
                    format!(
                        "port {} is out of range (expected 1-65535)",
                        fw.wan_port.get_ref()
                    ),
                );
                None
            }
        };
        let to = match parse::parse_forward_target(fw.to.get_ref()) {
            Ok(t) => Some(t),
            Err(e) => {
                self.at(fw.to.span(), "forward.to", e);
                None
            }
        };
        (proto, port, to)
    }
}

/// Makes the pinned rules equal to `want`; returns the changes made.
fn sync_rules(
    maps: &PinnedMaps,
    want: &[(PortForwardKey, PortForwardTarget)],
) -> Result<Vec<String>> {
    let mut map = maps.port_forwards()?;
    let have: BTreeMap<PortForwardKey, PortForwardTarget> =
        snapshot(&map, MAX_PORT_FORWARDS)?.into_iter().collect();
    let want_map: BTreeMap<PortForwardKey, PortForwardTarget> = want.iter().copied().collect();
    let mut changes = Vec::new();
    for (k, t) in &have {
        if !want_map.contains_key(k) {
            map.remove(k).context("deleting a port-forward rule")?;
            changes.push(format!("deleted rule {}", Rule::new(*k, *t).describe()));
        }
    }
    for (k, t) in &want_map {
        match have.get(k) {
            Some(cur) if cur == t => {}
            Some(cur) => {
                map.insert(k, t, 0)
                    .context("changing a port-forward rule")?;
                changes.push(format!(
                    "changed rule {} (was -> {}:{})",
                    Rule::new(*k, *t).describe(),
                    std::net::Ipv4Addr::from(cur.addr),
                    cur.port
                ));
            }
            None => {
                map.insert(k, t, 0).context("adding a port-forward rule")?;
                changes.push(format!("added rule {}", Rule::new(*k, *t).describe()));
            }
        }
    }
    Ok(changes)
}

/// Makes the pinned IPv6 pinholes equal to `want`; returns the changes.
/// A router attached by a router-ctl without `PINHOLES6` can take none.
fn sync_pinholes(maps: &PinnedMaps, want: &[PinholeKey6]) -> Result<Vec<String>> {
    let mut map = match maps.pinholes6() {
        Ok(m) => m,
        Err(_) if want.is_empty() => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let have: Vec<PinholeKey6> = snapshot(&map, MAX_PINHOLES6)?
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    let mut changes = Vec::new();
    for k in have.iter().filter(|k| !want.contains(k)) {
        map.remove(k).context("deleting a pinhole")?;
        changes.push(format!("deleted {}", Rule::pinhole6(k).describe()));
    }
    for k in want.iter().filter(|k| !have.contains(k)) {
        map.insert(k, 1, 0).context("adding a pinhole")?;
        changes.push(format!("added {}", Rule::pinhole6(k).describe()));
    }
    Ok(changes)
}

/// The file's field an error of [`config::resolve`] is about, and its
/// key as written in the file.
const fn file_field(field: ConfigField) -> (&'static str, &'static str) {
    match field {
        ConfigField::Lan => ("interfaces.lan", "lan"),
        ConfigField::Wan => ("interfaces.wan", "wan"),
        ConfigField::MaxFlows => ("nat.max_flows", "max_flows"),
        ConfigField::PortRange => ("nat.port_range", "port_range"),
        ConfigField::Filtering => ("router.filtering", "filtering"),
        ConfigField::MssClamp => ("router.clamp_mss", "clamp_mss"),
        ConfigField::WanAddr => ("nat.wan_addr", "wan_addr"),
    }
}

/// `FILE:LINE: field: message` for an error found after parsing (the
/// interfaces and addresses of this machine). The line is the first that
/// sets the field's key (0 if the file leaves it at its default).
fn located(name: &str, text: &str, e: &ConfigError) -> anyhow::Error {
    let (field, key) = file_field(e.field);
    let line = text
        .lines()
        .position(|l| l.split_once('=').is_some_and(|(k, _)| k.trim() == key))
        .map_or(0, |i| i + 1);
    e.to_error(format!("{name}:{line}: {field}: {e}; nothing was changed"))
}

/// The context of an `apply` error raised once the file was found valid
/// and the router may have begun to change: a part of it may be applied
/// (a reload must not say "nothing changed").
#[derive(Debug)]
pub struct PartlyApplied;

impl std::fmt::Display for PartlyApplied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "the file is valid, but applying it failed (a part may be applied: `router-ctl \
             status` shows the router; applying the file again finishes it)",
        )
    }
}

/// How long `apply` waits for another apply of the router to finish.
pub const APPLY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

pub fn apply(ctx: &Ctx, path: &Path, check: bool) -> Result<()> {
    apply_waiting(ctx, path, check, APPLY_WAIT)
}

/// [`apply`], waiting up to `wait` for another apply of the router (a
/// daemon's reload waits less: its event loop waits with it).
pub fn apply_waiting(ctx: &Ctx, path: &Path, check: bool, wait: std::time::Duration) -> Result<()> {
    // One apply at a time, from the file's reading (the mode it leaves
    // unstated is the router's then) to its last rule.
    let applying = if check {
        None
    } else {
        Some(state::apply_lock(ctx.ns(), wait)?)
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let name = path.display().to_string();
    let unstated = || lifecycle::unstated_admit(ctx, &format!("`admit` in [router] of {name}"));
    // A file that does not parse or validate stays so until it is edited
    // (the interfaces and the WAN address, resolved below, may yet come).
    let d = parse_file_as(&name, &text, unstated)
        .map_err(|e| anyhow::Error::new(lifecycle::Unretryable(format!("{e:#}"))))?;
    // The interfaces and the WAN address, still without changing anything.
    // Its warnings said by the attach below, or here by a check.
    let cfg = if check {
        config::resolve(&d.args)
    } else {
        config::resolve_quietly(&d.args)
    }
    .map_err(|e| located(&name, &text, &e))?;
    let mut summary = String::new();
    let _ = write!(
        summary,
        "{} -> {}, {}, table {} flows, {} port-forward rule(s), {} IPv6 pinhole(s)",
        cfg.lan,
        cfg.wan,
        cfg.admit_summary(),
        cfg.max_flows,
        d.forwards.len(),
        d.pinholes.len()
    );
    for (k, t) in &d.forwards {
        if let Some(note) = forward::kernel_range_note(k.port, cfg.kernel_nat_ports) {
            println!("{name}: {note}");
        }
        let to = std::net::Ipv4Addr::from(t.addr).into();
        if let Some(note) = forward::lan_route_note_via(cfg.lan_ifindex, to) {
            println!("{name}: {note}");
        }
    }
    let mut args = d.args;
    // A refusal over the forward rules says how to bypass them from the
    // file. `--check` looks at them here; an apply lets attach do it, after
    // what the router cannot do in place (which needs a detach).
    args.bypass_how = Some(format!(
        "set `bypass_forward_rules = true` in [router] of {name}"
    ));
    args.apply_file = Some(name.clone());
    if check {
        // What a fresh attach would refuse on the interfaces themselves
        // (another tool's XDP program, a peer that drops the fast path's
        // frames); an attached router's programs are its own. Told by its
        // pins, as attach tells it (a record outlives a reboot, the pins
        // do not).
        if !crate::inspect::inspect(&ctx.pin_dir).any_pins() {
            lifecycle::check_interfaces(&args, &cfg)
                .with_context(|| format!("{name} cannot be applied, nothing was changed"))?;
        }
        if args.admit == AdmitMode::Xdp {
            lifecycle::check_firewall(
                args.forward_rules,
                &standalone::Ruleset::read(),
                args.bypass_how.as_deref().unwrap_or_default(),
            )
            .with_context(|| format!("{name} cannot be applied, nothing was changed"))?;
        }
        config::warn_standalone_only(&args);
        println!("{name} is valid: {summary}");
        return Ok(());
    }
    // An attach that refuses (a resize, another interface) or rolls back
    // leaves the record as it was: nothing changed then.
    let record_before = state::load(ctx.ns()).ok().flatten();
    let held = lifecycle::attach_held(ctx, &args, &d.forwards).map_err(|e| {
        if state::load(ctx.ns()).ok().flatten() == record_before {
            e.context(format!("{name} cannot be applied, nothing was changed"))
        } else {
            e.context(PartlyApplied)
        }
    })?;
    // Under the attach's lock, its signals still held off: nothing comes
    // between the file's configuration and its rules.
    let changes = (|| {
        let mut changes = sync_rules(&ctx.maps(), &d.forwards)?;
        changes.extend(sync_pinholes(&ctx.maps(), &d.pinholes)?);
        Ok::<_, anyhow::Error>(changes)
    })()
    .context(PartlyApplied)?;
    let outcome = held.outcome;
    // The apply's own lock released before the router's lets the signals
    // through: a pending Ctrl-Z must not stop a process holding either.
    drop(applying);
    drop(held);
    for c in &changes {
        println!("{c}");
    }
    if outcome == Outcome::Unchanged && changes.is_empty() {
        println!("applied {name}: nothing changed");
    } else {
        println!("applied {name}: {summary}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../examples/router.toml");
    const OFFLOAD_EXAMPLE: &str = include_str!("../../examples/router-offload.toml");

    fn err(text: &str) -> String {
        format!("{:#}", parse_file("r.toml", text).unwrap_err())
    }

    #[test]
    fn the_shipped_example_is_valid() {
        let d = parse_file("router.toml", EXAMPLE).unwrap();
        assert_eq!(d.args.lan, "lan0");
        assert_eq!(d.args.wan, "wan0");
        assert_eq!(d.args.mode, Mode::Auto);
        // Its port forwards are there to be uncommented: a copied file
        // opens nothing to the Internet by itself.
        assert!(d.forwards.is_empty());
        assert_eq!(EXAMPLE.matches("\n# [[forward]]\n").count(), 2);
    }

    #[test]
    fn the_shipped_offload_example_is_valid() {
        let d = parse_file("router-offload.toml", OFFLOAD_EXAMPLE).unwrap();
        assert_eq!(d.args.admit, AdmitMode::Kernel);
        assert_eq!((d.args.lan.as_str(), d.args.wan.as_str()), ("lan0", "wan0"));
        assert!(d.forwards.is_empty());
    }

    #[test]
    fn minimal_file_gets_defaults() {
        let d = parse_file("r", "[interfaces]\nlan = \"a\"\nwan = \"b\"\n").unwrap();
        assert_eq!(d.args.port_range, standalone::DEFAULT_XDP_PORTS);
        assert!(d.args.kernel_nat);
        assert_eq!(d.args.kernel_nat_ports, standalone::DEFAULT_KERNEL_PORTS);
        assert_eq!(d.args.max_flows, DEFAULT_MAX_FLOWS);
        assert_eq!(d.args.wan_addr, WanAddr::Auto);
        assert!(d.forwards.is_empty());
        assert_eq!(d.args.timeouts, router_common::maps::Timeouts::default());
        assert_eq!(d.args.admit, AdmitMode::Kernel);
    }

    #[test]
    fn ipv6_pinholes_are_read_checked_and_refused_in_offload_mode() {
        let base = "[router]\nadmit = \"xdp\"\n[interfaces]\nlan = \"a\"\nwan = \"b\"\n";
        let d = parse_file(
            "r",
            &format!(
                "{base}[[pinhole]]\nproto = \"tcp\"\nto = \"[2001:db8:50::2]:22\"\n\
                 [[pinhole]]\nproto = \"udp\"\nto = \"[2001:db8:50::3]:5000\"\n"
            ),
        )
        .unwrap();
        let to: std::net::SocketAddrV6 = "[2001:db8:50::2]:22".parse().unwrap();
        assert_eq!(d.pinholes.len(), 2);
        assert_eq!(d.pinholes[0], forward::pinhole_key(Proto::Tcp, to));
        // Every error at once, with its line and field.
        let e = err(&format!(
            "{base}[[pinhole]]\nproto = \"sctp\"\nto = \"[fe80::1]:22\"\n\
             [[pinhole]]\nproto = \"tcp\"\nto = \"22\"\n\
             [[pinhole]]\nproto = \"tcp\"\nto = \"[2001:db8:50::2]:22\"\n\
             [[pinhole]]\nproto = \"tcp\"\nto = \"[2001:db8:50::2]:22\"\n\
             [[pinhole]]\nproto = \"tcp\"\nto = \"192.168.50.2:22\"\n"
        ));
        for want in [
            "r.toml:7: pinhole.proto: \"sctp\" is not tcp or udp",
            "r.toml:8: pinhole.to: fe80::1 is not a global unicast address",
            "r.toml:11: pinhole.to: \"22\" is not [LAN_ADDR6]:PORT",
            "r.toml:17: pinhole.to: tcp [2001:db8:50::2]:22 is given twice",
            "r.toml:20: pinhole.to: \"192.168.50.2:22\" is not [LAN_ADDR6]:PORT",
        ] {
            assert!(e.contains(want), "{want:?} in {e}");
        }
        let e = err(
            "[router]\nadmit = \"kernel\"\n[interfaces]\nlan = \"a\"\nwan = \"b\"\n\
             [[pinhole]]\nproto = \"tcp\"\nto = \"[2001:db8:50::2]:22\"\n",
        );
        assert!(
            e.contains("r.toml:6: pinhole: inbound IPv6 is the kernel firewall's"),
            "{e}"
        );
    }

    #[test]
    fn a_file_without_admit_takes_the_mode_it_is_given() {
        let text = "[interfaces]\nlan = \"a\"\nwan = \"b\"\n\
            [[forward]]\nproto = \"tcp\"\nwan_port = 8080\nto = \"192.168.50.2:80\"\n";
        let d = parse_file_as("r", text, || AdmitMode::Xdp).expect("standalone takes forwards");
        assert_eq!((d.args.admit, d.forwards.len()), (AdmitMode::Xdp, 1));
        assert!(parse_file_as("r", text, || AdmitMode::Kernel).is_err());
    }

    #[test]
    fn offload_mode_refuses_port_forward_rules() {
        let e = parse_file(
            "r",
            "[router]\nadmit = \"kernel\"\n[interfaces]\nlan = \"a\"\nwan = \"b\"\n\
             [[forward]]\nproto = \"udp\"\nwan_port = 5353\nto = \"192.168.50.2:53\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("r:6: forward: port forwards are the kernel's DNAT rules"),
            "{e}"
        );
        let e = parse_file(
            "r",
            "[router]\nadmit = \"nat\"\n[interfaces]\nlan = \"a\"\nwan = \"b\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("r:2: router.admit: \"nat\" is not an admit mode"),
            "{e}"
        );
    }

    #[test]
    fn clamp_mss_key_parses_and_is_refused_in_offload_mode() {
        let parse = |router: &str| {
            parse_file(
                "r",
                &format!("[router]\n{router}\n[interfaces]\nlan = \"a\"\nwan = \"b\"\n"),
            )
        };
        let d = parse("admit = \"xdp\"\nclamp_mss = 1492").unwrap();
        assert_eq!(d.args.mss_clamp, Some(MssClamp::Mtu(1492)));
        let d = parse("admit = \"xdp\"\nclamp_mss = \"off\"").unwrap();
        assert_eq!(d.args.mss_clamp, Some(MssClamp::Off));
        // Unsaid: the mode's default, decided when the file resolves.
        let d = parse("admit = \"xdp\"").unwrap();
        assert_eq!(d.args.mss_clamp, None);
        let e = parse("admit = \"xdp\"\nclamp_mss = \"auto\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("r:3: router.clamp_mss: \"auto\" is not off, pmtu or an MTU"),
            "{e}"
        );
        let e = parse("admit = \"xdp\"\nclamp_mss = true")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("r:3:13: router.clamp_mss: off, pmtu or an MTU (a string, or a number"),
            "{e}"
        );
        let e = parse("admit = \"xdp\"\nclamp_mss = 100")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("r:3: router.clamp_mss: MTU 100 is below 576"),
            "{e}"
        );
        let e = parse("admit = \"kernel\"\nclamp_mss = \"pmtu\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("r:3: router.clamp_mss: in offload mode (admit kernel) every SYN"),
            "{e}"
        );
        let d = parse("admit = \"kernel\"\nclamp_mss = \"off\"").unwrap();
        assert_eq!(d.args.mss_clamp, Some(MssClamp::Off));
    }

    #[test]
    fn filtering_key_parses_and_is_refused_in_offload_mode() {
        let d = parse_file(
            "r",
            "[router]\nadmit = \"xdp\"\nfiltering = \"endpoint-independent\"\n\
             [interfaces]\nlan = \"a\"\nwan = \"b\"\n",
        )
        .unwrap();
        assert_eq!(d.args.filtering, FilteringMode::EndpointIndependent);
        let d = parse_file("r", "[interfaces]\nlan = \"a\"\nwan = \"b\"\n").unwrap();
        assert_eq!(d.args.filtering, FilteringMode::AddressPortDependent);
        let e = parse_file(
            "r",
            "[router]\nadmit = \"xdp\"\nfiltering = \"full-cone\"\n\
             [interfaces]\nlan = \"a\"\nwan = \"b\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("r:3: router.filtering: \"full-cone\" is not a filtering behaviour"),
            "{e}"
        );
        let e = parse_file(
            "r",
            "[router]\nadmit = \"kernel\"\nfiltering = \"address-dependent\"\n\
             [interfaces]\nlan = \"a\"\nwan = \"b\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("r:3: router.filtering: in offload mode (admit kernel) the kernel's NAT"),
            "{e}"
        );
        // The default is fine in offload mode, written or not.
        let d = parse_file(
            "r",
            "[router]\nadmit = \"kernel\"\nfiltering = \"address-port-dependent\"\n\
             [interfaces]\nlan = \"a\"\nwan = \"b\"\n",
        )
        .unwrap();
        assert_eq!(d.args.filtering, FilteringMode::AddressPortDependent);
    }

    #[test]
    fn values_arrive() {
        let d = parse_file(
            "r",
            "[router]\nadmit = \"xdp\"\n\
             [interfaces]\nlan = \"a\"\nwan = \"b\"\nmode = \"generic\"\n\
             [nat]\nwan_addr = \"203.0.113.1\"\nport_range = \"20000-20010\"\nmax_flows = 1000\n\
             [timeouts]\nicmp = 5\nudp-replied = 300\n\
             [[forward]]\nproto = \"udp\"\nwan_port = 5353\nto = \"192.168.50.2:53\"\n",
        )
        .unwrap();
        assert_eq!(d.args.mode, Mode::Generic);
        assert_eq!(d.args.wan_addr, WanAddr::Addr([203, 0, 113, 1].into()));
        assert_eq!(d.args.port_range, (20000, 20010));
        assert_eq!(d.args.max_flows, 1000);
        assert_eq!(
            (d.args.timeouts.icmp, d.args.timeouts.udp_replied),
            (5, 300)
        );
        assert_eq!(
            d.forwards,
            vec![(
                forward::key(Proto::Udp, 5353),
                forward::target("192.168.50.2:53".parse().unwrap())
            )]
        );
    }

    #[test]
    fn each_bad_field_names_its_line_and_field() {
        let base = |extra: &str| format!("[interfaces]\nlan = \"lan0\"\nwan = \"wan0\"\n{extra}");
        for (extra, line, field) in [
            ("[nat]\nport_range = \"0-10\"\n", 5, "nat.port_range"),
            ("[nat]\nport_range = \"9-1\"\n", 5, "nat.port_range"),
            ("[nat]\nwan_addr = \"300.1.1.1\"\n", 5, "nat.wan_addr"),
            ("[nat]\nwan_addr = \"224.0.0.1\"\n", 5, "nat.wan_addr"),
            ("[nat]\nmax_flows = 0\n", 5, "nat.max_flows"),
            ("[nat]\nmax_flows = \"many\"\n", 5, "nat.max_flows"),
            ("[nat]\ncolour = 1\n", 5, "colour"),
            ("[timeouts]\nudp = 5\n", 5, "timeouts.udp"),
            ("[timeouts]\nicmp = 0\n", 5, "timeouts.icmp"),
            (
                "[[forward]]\nproto = \"icmp\"\nwan_port = 1\nto = \"1.2.3.4:1\"\n",
                5,
                "forward.proto",
            ),
            (
                "[[forward]]\nproto = \"tcp\"\nwan_port = 70000\nto = \"1.2.3.4:1\"\n",
                6,
                "forward.wan_port",
            ),
            (
                "[[forward]]\nproto = \"tcp\"\nwan_port = 80\nto = \"1.2.3.4\"\n",
                7,
                "forward.to",
            ),
            (
                "[[forward]]\nproto = \"tcp\"\nwan_port = 80\nto = \"0.0.0.0:80\"\n",
                7,
                "forward.to",
            ),
            (
                "[[forward]]\nproto = \"tcp\"\nwan_port = 80\nto = \"1.2.3.4:80\"\n\
                 [[forward]]\nproto = \"tcp\"\nwan_port = 80\nto = \"1.2.3.5:80\"\n",
                10,
                "forward.wan_port",
            ),
            ("mode = \"fast\"\n", 4, "interfaces.mode"),
            ("[nat]\nport_range = [1, 2]\n", 5, "nat.port_range"),
        ] {
            let text = base(extra);
            let e = err(&text);
            assert!(
                e.contains(&format!("r.toml:{line}")),
                "line {line} for {extra:?}: {e}"
            );
            assert!(e.contains(field), "field {field} for {extra:?}: {e}");
        }
        let e = err("[interfaces]\nlan = \"x\"\nwan = \"x\"\n");
        assert!(
            e.contains("r.toml:3") && e.contains("same interface"),
            "{e}"
        );
        let e = err("[interfaces]\nlan = \"x\"\n");
        assert!(e.contains("wan"), "{e}");
        let e = err("[interfaces\n");
        assert!(e.contains("r.toml:1"), "{e}");
    }

    #[test]
    fn kernel_nat_ports_are_checked_against_xdp_ports() {
        let base = "[router]\nadmit = \"xdp\"\n[interfaces]\nlan = \"a\"\nwan = \"b\"\n[nat]\n";
        let e = err(&format!("{base}port_range = \"1024-61000\"\n"));
        assert!(
            e.contains("r.toml:7: nat.port_range: XDP's ports 1024-61000 overlap"),
            "{e}"
        );
        let d = parse_file(
            "r",
            &format!("{base}port_range = \"1024-61000\"\nkernel_nat = false\n"),
        )
        .unwrap();
        assert!(!d.args.kernel_nat);
        let d = parse_file(
            "r",
            &format!("{base}port_range = \"1024-61000\"\nkernel_nat_ports = \"62000-62999\"\n"),
        )
        .unwrap();
        assert_eq!(d.args.kernel_nat_ports, (62000, 62999));
    }

    #[test]
    fn all_errors_are_reported_at_once() {
        let e = err(
            "[interfaces]\nlan = \"a\"\nwan = \"b\"\n[nat]\nport_range = \"0-1\"\nmax_flows = 0\n",
        );
        assert!(e.contains("2 errors"), "{e}");
        assert!(e.contains("r.toml:5") && e.contains("r.toml:6"), "{e}");
        assert!(e.contains("nothing was changed"), "{e}");
    }

    #[test]
    fn machine_errors_point_at_the_field_they_name() {
        let text = "[interfaces]\nlan = \"lan0\"\nwan = \"wan0\"\n";
        for (field, want) in [
            (
                ConfigField::Lan,
                "r.toml:2: interfaces.lan: boom; nothing was changed",
            ),
            (
                ConfigField::Wan,
                "r.toml:3: interfaces.wan: boom; nothing was changed",
            ),
            (
                ConfigField::MaxFlows,
                "r.toml:0: nat.max_flows: boom; nothing was changed",
            ),
        ] {
            let e = ConfigError {
                field,
                message: "boom".into(),
                lasting: false,
            };
            assert_eq!(located("r.toml", text, &e).to_string(), want);
        }
    }

    #[test]
    fn line_and_field_helpers() {
        let t = "a = 1\n[nat]\nport_range = \"x\"\n[[forward]]\nproto = 1\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, t.find("\"x\"").unwrap()), (3, 14));
        assert_eq!(
            field_at(t, t.find("\"x\"").unwrap()).as_deref(),
            Some("nat.port_range")
        );
        assert_eq!(field_at(t, t.find("1\n[").unwrap()).as_deref(), Some("a"));
        assert_eq!(
            field_at(t, t.rfind('1').unwrap()).as_deref(),
            Some("forward.proto")
        );
        // The whole file: no field (not the first table's name).
        assert_eq!(field_at("[router]\nadmit = \"xdp\"\n", 0), None);
        // An unknown table is named by its own header.
        let t = "[interfaces]\nlan = \"a\"\n[extra]\nfoo = 1\n";
        assert_eq!(
            field_at(t, t.find("extra").unwrap()).as_deref(),
            Some("extra")
        );
    }
}
