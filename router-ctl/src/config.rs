//! What an operator asks for (`attach` options, or an `apply` file) and
//! the configuration it resolves to: interfaces checked, WAN address
//! chosen. Validation errors are typed and name the field they are about,
//! so `apply` can point at the line of its file.

use std::{fmt, net::Ipv4Addr, path::PathBuf};

use router_common::maps::{Admit, Config, Filtering, Timeouts};
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::{netlink, parse::WanAddr, standalone};

/// The XDP attach mode asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Native (driver) mode, falling back to generic with a loud warning.
    Auto,
    /// Native (driver) mode only: fail if the driver cannot.
    Native,
    /// Generic (skb) mode: works everywhere, several times slower.
    Generic,
}

impl Mode {
    /// The name on the command line, in `apply` files and in the record.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Generic => "generic",
        }
    }

    /// The mode named `name` (see [`Mode::name`]).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Auto, Self::Native, Self::Generic]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

/// Who admits new flows (`attach --admit`, `admit` in an `apply` file).
/// No `Default`: what applies when none is stated depends on the router
/// (`lifecycle::unstated_admit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AdmitMode {
    /// Offload: the kernel admits every flow (firewall, NAT, helpers) and
    /// `router-ctl run` moves established ones to XDP.
    Kernel,
    /// Standalone: XDP masquerades new LAN flows and opens port forwards
    /// itself, bypassing netfilter's forward rules.
    Xdp,
}

impl AdmitMode {
    /// The name on the command line, in `apply` files and in the record.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Xdp => "xdp",
        }
    }

    /// What `attach` and `apply` use when not told, for a router that was
    /// never attached: offload, so that the router's firewall and NAT rules
    /// stay in charge unless the owner asks for standalone mode, which
    /// bypasses them.
    #[must_use]
    pub const fn default_for_attach() -> Self {
        Self::Kernel
    }

    /// The mode of an attach record without one: written before modes
    /// existed, when every router was standalone.
    #[must_use]
    pub const fn of_records_without_one() -> Self {
        Self::Xdp
    }

    /// The mode named `name` (see [`AdmitMode::name`]).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Kernel, Self::Xdp]
            .into_iter()
            .find(|m| m.name() == name)
    }

    /// The data path's value (`Config::admit`).
    #[must_use]
    pub const fn to_map(self) -> Admit {
        match self {
            Self::Kernel => Admit::Kernel,
            Self::Xdp => Admit::Xdp,
        }
    }
}

/// Which unsolicited inbound flows an active NAT mapping lets in
/// (`attach --filtering`, `filtering` in an `apply` file's `[router]`;
/// standalone mode only, RFC 4787 section 5 / RFC 5382 section 4.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FilteringMode {
    /// Only replies from the remote address and port a flow was opened to
    /// (Linux's behaviour; games call it a strict or moderate NAT).
    #[default]
    AddressPortDependent,
    /// Also new flows from another port of an address the internal
    /// endpoint has sent to.
    AddressDependent,
    /// New flows from any remote to an active mapping ("full cone", an
    /// open NAT for games and P2P).
    EndpointIndependent,
}

impl FilteringMode {
    const ALL: [Self; 3] = [
        Self::AddressPortDependent,
        Self::AddressDependent,
        Self::EndpointIndependent,
    ];

    /// The data path's value (`Config::filtering`).
    #[must_use]
    pub const fn to_map(self) -> Filtering {
        match self {
            Self::AddressPortDependent => Filtering::AddressPortDependent,
            Self::AddressDependent => Filtering::AddressDependent,
            Self::EndpointIndependent => Filtering::EndpointIndependent,
        }
    }

    /// The name on the command line, in `apply` files and in `status`.
    #[must_use]
    pub const fn name(self) -> &'static str {
        self.to_map().name()
    }

    /// The mode named `name` (see [`FilteringMode::name`]).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// TCP MSS clamping of the SYNs standalone mode forwards (`attach
/// --clamp-mss`, `clamp_mss` in an `apply` file's `[router]`): what a
/// firewall rule such as `TCPMSS --clamp-mss-to-pmtu` (`OpenWrt`'s
/// `mtu_fix`) does in the kernel path, which standalone mode's SYNs do not
/// take. Written and read as `off`, `pmtu` or an MTU (`1492`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum MssClamp {
    /// SYNs keep the MSS their sender wrote.
    Off,
    /// Lowered to fit the smaller MTU of the egress route and the ingress
    /// interface (standalone mode's default).
    Pmtu,
    /// As `Pmtu`, and to fit this path MTU too: a narrower link beyond
    /// the router that it cannot see (a `PPPoE` modem in front of it: 1492).
    Mtu(u16),
}

impl MssClamp {
    /// The smallest MTU accepted: IPv4's smallest datagram every host
    /// takes (RFC 791); MSS 536.
    pub const MIN_MTU: u16 = 576;

    /// A record written before the setting existed: its data path did not
    /// clamp.
    #[must_use]
    pub const fn of_records_without_one() -> Self {
        Self::Off
    }

    /// What a mode applies when not told: standalone clamps to the path's
    /// MTU; offload leaves SYNs to the kernel's rules.
    #[must_use]
    pub const fn default_for(admit: AdmitMode) -> Self {
        match admit {
            AdmitMode::Xdp => Self::Pmtu,
            AdmitMode::Kernel => Self::Off,
        }
    }

    /// The data path's value (`Config::mss_clamp_mtu`).
    #[must_use]
    pub const fn to_map(self) -> u16 {
        match self {
            Self::Off => router_common::mss::CLAMP_OFF,
            Self::Pmtu => router_common::mss::CLAMP_PMTU,
            Self::Mtu(mtu) => mtu,
        }
    }

    /// The setting named `s`: `off`, `pmtu` or an MTU of
    /// [`MssClamp::MIN_MTU`]-65535 (65535: `pmtu`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "off" => return Ok(Self::Off),
            "pmtu" => return Ok(Self::Pmtu),
            _ => {}
        }
        let mtu: u16 = s.trim().parse().map_err(|_| {
            format!("{s:?} is not off, pmtu or an MTU (example: 1492 behind a PPPoE modem)")
        })?;
        match mtu {
            u16::MAX => Ok(Self::Pmtu),
            m if m >= Self::MIN_MTU => Ok(Self::Mtu(m)),
            m => Err(format!(
                "MTU {m} is below {} (the least every IPv4 host takes)",
                Self::MIN_MTU
            )),
        }
    }

    /// The setting as written (`off`, `pmtu`, `1492`).
    #[must_use]
    pub fn name(self) -> String {
        match self {
            Self::Off => "off".to_owned(),
            Self::Pmtu => "pmtu".to_owned(),
            Self::Mtu(m) => m.to_string(),
        }
    }

    /// How `attach` and `status` describe it.
    #[must_use]
    pub fn describe(self) -> String {
        match self {
            Self::Off => "no MSS clamping".to_owned(),
            Self::Pmtu => "MSS clamped to the path MTU".to_owned(),
            Self::Mtu(m) => format!("MSS clamped to a path MTU of at most {m}"),
        }
    }
}

impl From<MssClamp> for String {
    fn from(c: MssClamp) -> Self {
        c.name()
    }
}

impl TryFrom<String> for MssClamp {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Self::parse(&s)
    }
}

/// Refusal of an MSS clamping setting in offload mode, where the kernel
/// forwards every SYN.
pub const OFFLOAD_MSS_CLAMP: &str = "in offload mode (admit kernel) every SYN takes the \
     kernel's path, where the firewall clamps the MSS (nftables: `tcp flags syn tcp option \
     maxseg size set rt mtu` in a forward chain; iptables: `-t mangle -A FORWARD -p tcp \
     --tcp-flags SYN,RST SYN -j TCPMSS --clamp-mss-to-pmtu`); --clamp-mss is for standalone \
     mode (`attach --admit xdp`)";

/// Refusal of a filtering setting in offload mode, where it cannot apply.
pub const OFFLOAD_FILTERING: &str = "in offload mode (admit kernel) the kernel's NAT decides \
     filtering (Linux filters address-and-port dependent); for endpoint-independent or \
     address-dependent filtering use standalone mode (`attach --admit xdp --filtering ...`, \
     or `admit = \"xdp\"` in [router] of an apply file)";

/// What standalone mode's attach does about netfilter forward rules it
/// would bypass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardRules {
    /// Refuse, naming them (the default).
    Refuse,
    /// Warn and attach (`attach --bypass-forward-rules`).
    Bypass,
    /// Already looked at and answered for by the caller (`apply`, with the
    /// file's own way out).
    Checked,
}

/// Everything `attach` (and `apply`) asks for.
#[derive(Clone, Debug)]
pub struct AttachArgs {
    pub admit: AdmitMode,
    pub filtering: FilteringMode,
    /// `None`: the mode's default ([`MssClamp::default_for`]).
    pub mss_clamp: Option<MssClamp>,
    pub lan: String,
    pub wan: String,
    pub mode: Mode,
    pub wan_addr: WanAddr,
    pub port_range: (u16, u16),
    /// Standalone mode: set up the kernel slow-path NAT table (not with
    /// `--no-kernel-nat`).
    pub kernel_nat: bool,
    /// Its ports, disjoint from `port_range`.
    pub kernel_nat_ports: (u16, u16),
    pub max_flows: u32,
    pub timeouts: Timeouts,
    /// Replace an XDP program router-ctl did not attach.
    pub force: bool,
    /// Standalone mode over netfilter forward rules it would bypass.
    pub forward_rules: ForwardRules,
    /// How a refusal over them says to bypass them (`None`:
    /// `--bypass-forward-rules`;
    /// `apply`: the file's key).
    pub bypass_how: Option<String>,
    /// The file an `apply` reads (`None`: the command line), so that a
    /// refusal says what to change there rather than which flag to pass.
    pub apply_file: Option<String>,
    /// Replace the program even when object and configuration are unchanged.
    pub reload: bool,
    /// Load this object instead of the embedded one (hidden, for tests).
    pub object: Option<PathBuf>,
}

/// The router's configuration as an operator states it (no hash seed).
/// Also the `config` of the attach record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterConfig {
    #[serde(default = "AdmitMode::of_records_without_one")]
    pub admit: AdmitMode,
    /// Records written before the setting existed filter as Linux does.
    #[serde(default)]
    pub filtering: FilteringMode,
    #[serde(default = "MssClamp::of_records_without_one")]
    pub mss_clamp: MssClamp,
    pub lan: String,
    pub wan: String,
    pub lan_ifindex: u32,
    pub wan_ifindex: u32,
    /// The interfaces' MAC addresses when attach ran: the data path
    /// forwards only frames addressed to them. (Zero in records written
    /// before the data path checked; the next attach rewrites them.)
    #[serde(default)]
    pub lan_mac: [u8; 6],
    #[serde(default)]
    pub wan_mac: [u8; 6],
    pub wan_addr: Ipv4Addr,
    /// `wan_addr` is the WAN's first IPv4 address (`--wan-addr auto`):
    /// `router-ctl run` follows it when it changes (DHCP, PPP).
    #[serde(default)]
    pub wan_addr_auto: bool,
    pub port_min: u16,
    pub port_max: u16,
    /// Standalone mode's kernel slow-path NAT ports (`None`: no table, in
    /// offload mode or with `--no-kernel-nat`).
    #[serde(default)]
    pub kernel_nat_ports: Option<(u16, u16)>,
    pub max_flows: u32,
    pub timeouts: Timeouts,
}

/// What standalone mode masquerades to, as `attach` and `status` say it:
/// the WAN address, or none while the WAN has no IPv4 address (0.0.0.0).
#[must_use]
pub fn masquerade_target(wan_addr: Ipv4Addr) -> String {
    if wan_addr.is_unspecified() {
        "none (the WAN has no IPv4 address)".to_owned()
    } else {
        wan_addr.to_string()
    }
}

impl RouterConfig {
    /// Who admits flows, as `attach`, `apply` and `status` say it.
    #[must_use]
    pub fn admit_summary(&self) -> String {
        match self.admit {
            AdmitMode::Kernel => "admit kernel (offload: the firewall and NAT decide, \
                                  `router-ctl run` moves established flows to XDP)"
                .to_owned(),
            AdmitMode::Xdp => format!(
                "admit xdp (standalone), masquerade to {} ports {}-{}, filtering {}, {}, {}",
                masquerade_target(self.wan_addr),
                self.port_min,
                self.port_max,
                self.filtering.name(),
                self.mss_clamp.describe(),
                self.kernel_nat_ports.map_or_else(
                    || "no kernel slow-path NAT".to_owned(),
                    |(lo, hi)| format!("kernel slow-path NAT ports {lo}-{hi}")
                )
            ),
        }
    }

    /// The map value of this configuration.
    #[must_use]
    pub fn to_map(&self, hash_seed: u32) -> Config {
        Config {
            lan_ifindex: self.lan_ifindex,
            wan_ifindex: self.wan_ifindex,
            wan_addr: self.wan_addr.octets(),
            port_min: self.port_min,
            port_max: self.port_max,
            hash_seed,
            admit: self.admit.to_map() as u8,
            filtering: self.filtering.to_map() as u8,
            mss_clamp_mtu: self.mss_clamp.to_map(),
            timeouts: self.timeouts,
            lan_mac: self.lan_mac,
            wan_mac: self.wan_mac,
        }
    }
}

/// The argument a [`ConfigError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigField {
    Lan,
    /// Also the WAN's addresses unreadable.
    Wan,
    MaxFlows,
    /// `--port-range` against `--kernel-nat-ports`.
    PortRange,
    /// `--filtering` in offload mode.
    Filtering,
    /// `--clamp-mss` in offload mode.
    MssClamp,
    /// `--wan-addr` one of the LAN's addresses.
    WanAddr,
}

/// A request that cannot be resolved on this machine, and which field
/// says so. Displays as the message alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub field: ConfigField,
    pub message: String,
    /// Whether only an edit of the request changes the answer (a value
    /// out of range, the loopback interface); `false` for what the host
    /// may yet bring (an interface or WAN address not there yet), which a
    /// service tries again.
    pub lasting: bool,
}

impl ConfigError {
    /// A refusal of the request itself: asking again gets it again.
    fn new(field: ConfigField, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
            lasting: true,
        }
    }

    /// A refusal for what the host does not have yet.
    fn for_now(field: ConfigField, message: impl Into<String>) -> Self {
        Self {
            lasting: false,
            ..Self::new(field, message)
        }
    }

    /// The error a command returns: [`Unretryable`](crate::lifecycle::Unretryable)
    /// when it is lasting (the exit code tells a service to stop trying),
    /// `message` its text.
    #[must_use]
    pub fn to_error(&self, message: String) -> anyhow::Error {
        if self.lasting {
            anyhow::Error::new(crate::lifecycle::Unretryable(message))
        } else {
            anyhow::anyhow!(message)
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Offload mode accepts standalone mode's port settings and its
/// forward-rules bypass (a file may keep them for a switch back), but says
/// so: the kernel's NAT rule picks offload mode's ports, and its firewall
/// decides.
pub fn warn_standalone_only(a: &AttachArgs) {
    if a.admit != AdmitMode::Kernel {
        return;
    }
    let mut unused = Vec::new();
    if a.port_range != standalone::DEFAULT_XDP_PORTS {
        unused.push("the XDP port range");
    }
    if a.kernel_nat_ports != standalone::DEFAULT_KERNEL_PORTS || !a.kernel_nat {
        unused.push("the kernel slow-path NAT's ports");
    }
    if a.forward_rules == ForwardRules::Bypass {
        warn!(
            "offload mode: the forward rules are in charge, nothing bypasses them \
             (--bypass-forward-rules and bypass_forward_rules = true only apply to standalone \
             mode, --admit xdp)"
        );
    }
    if !unused.is_empty() {
        warn!(
            "offload mode: {} only apply to standalone mode (--admit xdp); here the \
             firewall's NAT rule picks the ports (e.g. nftables `masquerade to \
             :1024-65535`)",
            unused.join(" and ")
        );
    }
}

/// An interface name goes into nftables scripts between double quotes:
/// one that holds a quote or a backslash (Linux allows both) would end the
/// string, and an asterisk makes it a wildcard (`iifname "lan*"` matches
/// every interface whose name starts with `lan`).
fn nft_safe_name(field: ConfigField, name: &str) -> Result<(), ConfigError> {
    if name.contains(['"', '\\', '*']) || name.chars().any(char::is_control) {
        return Err(ConfigError::new(
            field,
            format!(
                "interface name {name:?} has a quote, backslash, asterisk or control character, \
                 which router-ctl's nftables rules cannot carry as it is: rename it (`ip link \
                 set dev OLD name NEW`)"
            ),
        ));
    }
    Ok(())
}

/// The address standalone mode masquerades to (`--wan-addr`): `auto`, the
/// WAN's first (`wan_addrs`; none yet: 0.0.0.0), or the one given, which
/// must not be the LAN's (warned of where the WAN lacks it; `say`: the
/// warnings are said).
fn resolve_wan_addr(
    a: &AttachArgs,
    wan_addrs: &[Ipv4Addr],
    say: bool,
) -> Result<Ipv4Addr, ConfigError> {
    let (lan, wan) = (a.lan.as_str(), a.wan.as_str());
    Ok(match a.wan_addr {
        // None yet: 0.0.0.0, which `router-ctl run` follows to the address
        // that comes (a DHCP lease at boot, after an outage). Offload mode
        // translates nothing itself (the kernel's NAT does): an IPv6-only
        // WAN (DS-Lite) needs none. Standalone mode masquerades nothing
        // meanwhile, as the kernel's masquerade without an address: said.
        WanAddr::Auto => {
            let first = wan_addrs.first().copied();
            if first.is_none() && say && a.admit == AdmitMode::Xdp {
                warn!(
                    "WAN {wan} has no IPv4 address (yet): until it has one, standalone mode \
                     masquerades nothing and what the LAN sends to the WAN over IPv4 is \
                     dropped; `router-ctl run` follows the address when it comes (a DHCP \
                     lease), or add one (`ip addr add ADDR/PREFIX dev {wan}`)"
                );
            }
            first.unwrap_or(Ipv4Addr::UNSPECIFIED)
        }
        WanAddr::Addr(x) => {
            // A LAN address (a typo, LAN and WAN swapped): every flow
            // would leave the WAN with it, and no reply could come back.
            let lan_addrs = netlink::ipv4_addrs(lan).unwrap_or_default();
            if lan_addrs.contains(&x) && !wan_addrs.contains(&x) {
                return Err(ConfigError::new(
                    ConfigField::WanAddr,
                    format!(
                        "--wan-addr {x} is an address of the LAN interface {lan}: the router \
                         would send the LAN's flows to the WAN from a LAN address; give an \
                         address of {wan} (or auto, its first)"
                    ),
                ));
            }
            if say && !wan_addrs.contains(&x) {
                warn!(
                    "{x} is not an address of {wan}; replies reach the router only \
                     if the upstream routes {x} to it"
                );
            }
            x
        }
    })
}

/// `field`'s error for a failed [`netlink::mac`]: lasting for an
/// interface that has no Ethernet address of its own (it will not get
/// one), for now when the link could not be read.
fn mac_error(field: ConfigField, e: &anyhow::Error) -> ConfigError {
    let lasting = e.downcast_ref::<crate::lifecycle::Unretryable>().is_some();
    ConfigError {
        lasting,
        ..ConfigError::new(field, format!("{e:#}"))
    }
}

/// Checks the interfaces and arguments and builds the configuration;
/// changes nothing.
pub fn resolve(a: &AttachArgs) -> Result<RouterConfig, ConfigError> {
    resolve_saying(a, true)
}

/// [`resolve`] without its warning about a `--wan-addr` that is not the
/// WAN's: for a look ahead of the attach that resolves again and says it
/// (`apply`'s summary), so it is said once.
pub fn resolve_quietly(a: &AttachArgs) -> Result<RouterConfig, ConfigError> {
    resolve_saying(a, false)
}

fn resolve_saying(a: &AttachArgs, say: bool) -> Result<RouterConfig, ConfigError> {
    if a.admit == AdmitMode::Kernel && a.filtering != FilteringMode::default() {
        return Err(ConfigError::new(ConfigField::Filtering, OFFLOAD_FILTERING));
    }
    let mss_clamp = a.mss_clamp.unwrap_or(MssClamp::default_for(a.admit));
    if a.admit == AdmitMode::Kernel && mss_clamp != MssClamp::Off {
        return Err(ConfigError::new(ConfigField::MssClamp, OFFLOAD_MSS_CLAMP));
    }
    let kernel_nat_ports =
        (a.admit == AdmitMode::Xdp && a.kernel_nat).then_some(a.kernel_nat_ports);
    if let Some(k) = kernel_nat_ports
        && standalone::overlap(a.port_range, k)
    {
        return Err(ConfigError::new(
            ConfigField::PortRange,
            format!(
                "XDP's ports {}-{} overlap the kernel slow-path NAT's {}-{}: the two would map \
                 flows to the same WAN tuples; make them disjoint (defaults: --port-range \
                 {}-{}, --kernel-nat-ports {}-{}), or pass --no-kernel-nat",
                a.port_range.0,
                a.port_range.1,
                k.0,
                k.1,
                standalone::DEFAULT_XDP_PORTS.0,
                standalone::DEFAULT_XDP_PORTS.1,
                standalone::DEFAULT_KERNEL_PORTS.0,
                standalone::DEFAULT_KERNEL_PORTS.1,
            ),
        ));
    }
    let (lan, wan) = (a.lan.as_str(), a.wan.as_str());
    nft_safe_name(ConfigField::Lan, lan)?;
    nft_safe_name(ConfigField::Wan, wan)?;
    let lan_idx =
        netlink::ifindex(lan).map_err(|e| ConfigError::for_now(ConfigField::Lan, e.to_string()))?;
    let wan_idx =
        netlink::ifindex(wan).map_err(|e| ConfigError::for_now(ConfigField::Wan, e.to_string()))?;
    if lan_idx == wan_idx {
        return Err(ConfigError::new(
            ConfigField::Wan,
            format!("LAN and WAN are the same interface ({lan}); give two different interfaces"),
        ));
    }
    let lan_mac = netlink::mac(lan, lan_idx).map_err(|e| mac_error(ConfigField::Lan, &e))?;
    let wan_mac = netlink::mac(wan, wan_idx).map_err(|e| mac_error(ConfigField::Wan, &e))?;
    let wan_addrs = netlink::ipv4_addrs(wan)
        .map_err(|e| ConfigError::for_now(ConfigField::Wan, e.to_string()))?;
    let wan_addr = resolve_wan_addr(a, &wan_addrs, say)?;
    if a.max_flows.checked_mul(2).is_none() {
        return Err(ConfigError::new(
            ConfigField::MaxFlows,
            "--max-flows too large",
        ));
    }
    Ok(RouterConfig {
        admit: a.admit,
        filtering: a.filtering,
        mss_clamp,
        lan: a.lan.clone(),
        wan: a.wan.clone(),
        lan_ifindex: lan_idx,
        wan_ifindex: wan_idx,
        lan_mac,
        wan_mac,
        wan_addr,
        wan_addr_auto: matches!(a.wan_addr, WanAddr::Auto),
        port_min: a.port_range.0,
        port_max: a.port_range.1,
        kernel_nat_ports,
        max_flows: a.max_flows,
        timeouts: a.timeouts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(lan: &str, wan: &str) -> AttachArgs {
        AttachArgs {
            admit: AdmitMode::Xdp,
            filtering: FilteringMode::default(),
            mss_clamp: None,
            lan: lan.into(),
            wan: wan.into(),
            mode: Mode::Auto,
            wan_addr: WanAddr::Auto,
            port_range: (1024, 65535),
            kernel_nat: false,
            kernel_nat_ports: standalone::DEFAULT_KERNEL_PORTS,
            max_flows: 10,
            timeouts: Timeouts::default(),
            force: false,
            forward_rules: ForwardRules::Refuse,
            bypass_how: None,
            apply_file: None,
            reload: false,
            object: None,
        }
    }

    #[test]
    fn errors_name_their_field() {
        let e = resolve(&args("no-such-lan0", "lo")).unwrap_err();
        assert_eq!(e.field, ConfigField::Lan);
        assert!(
            e.to_string().contains("no such interface \"no-such-lan0\""),
            "{e}"
        );
        let e = resolve(&args("lo", "no-such-wan0")).unwrap_err();
        assert_eq!(e.field, ConfigField::Wan);
        let e = resolve(&args("lo", "lo")).unwrap_err();
        assert_eq!(e.field, ConfigField::Wan);
        assert!(e.to_string().contains("same interface (lo)"), "{e}");
    }

    #[test]
    fn kernel_nat_ports_must_not_overlap_xdp_ports() {
        let mut a = args("lo", "lo");
        a.kernel_nat = true;
        // Checked before the interfaces, so `lo` twice does not matter.
        let e = resolve(&a).unwrap_err();
        assert_eq!(e.field, ConfigField::PortRange, "{e}");
        assert!(e.to_string().contains("overlap"), "{e}");
    }

    #[test]
    fn filtering_other_than_linux_is_refused_in_offload_mode() {
        let mut a = args("lo", "lo");
        a.admit = AdmitMode::Kernel;
        a.filtering = FilteringMode::EndpointIndependent;
        let e = resolve(&a).unwrap_err();
        assert_eq!(e.field, ConfigField::Filtering, "{e}");
        assert!(
            e.to_string().contains("kernel's NAT decides filtering"),
            "{e}"
        );
        assert!(e.to_string().contains("--admit xdp"), "{e}");
        a.filtering = FilteringMode::AddressPortDependent;
        // Past the filtering check: refused for `lo` twice instead.
        assert_eq!(resolve(&a).unwrap_err().field, ConfigField::Wan);
    }

    #[test]
    fn mss_clamp_defaults_per_mode_and_offload_refuses_clamping() {
        let mut a = args("lo", "lo");
        a.admit = AdmitMode::Kernel;
        for c in [MssClamp::Pmtu, MssClamp::Mtu(1492)] {
            a.mss_clamp = Some(c);
            let e = resolve(&a).unwrap_err();
            assert_eq!(e.field, ConfigField::MssClamp, "{e}");
            assert!(e.to_string().contains("TCPMSS --clamp-mss-to-pmtu"), "{e}");
            assert!(e.to_string().contains("--admit xdp"), "{e}");
        }
        // Off, said or not, passes the check: refused for `lo` instead.
        for c in [None, Some(MssClamp::Off)] {
            a.mss_clamp = c;
            assert_eq!(resolve(&a).unwrap_err().field, ConfigField::Wan);
        }
        assert_eq!(MssClamp::default_for(AdmitMode::Xdp), MssClamp::Pmtu);
        assert_eq!(MssClamp::default_for(AdmitMode::Kernel), MssClamp::Off);
    }

    #[test]
    fn mss_clamp_parses_maps_and_round_trips() {
        assert_eq!(MssClamp::parse("off"), Ok(MssClamp::Off));
        assert_eq!(MssClamp::parse("pmtu"), Ok(MssClamp::Pmtu));
        assert_eq!(MssClamp::parse(" 1492 "), Ok(MssClamp::Mtu(1492)));
        assert_eq!(MssClamp::parse("65535"), Ok(MssClamp::Pmtu));
        assert_eq!(MssClamp::parse("576"), Ok(MssClamp::Mtu(576)));
        let low = MssClamp::parse("575").unwrap_err();
        assert!(low.contains("below 576"), "{low}");
        for bad in ["", "on", "-1", "65536", "1492b"] {
            let e = MssClamp::parse(bad).unwrap_err();
            assert!(e.contains("is not off, pmtu or an MTU"), "{bad}: {e}");
        }
        assert_eq!(MssClamp::Off.to_map(), 0);
        assert_eq!(MssClamp::Pmtu.to_map(), u16::MAX);
        assert_eq!(MssClamp::Mtu(1492).to_map(), 1492);
        for c in [MssClamp::Off, MssClamp::Pmtu, MssClamp::Mtu(1400)] {
            let j = serde_json::to_value(c).unwrap();
            assert_eq!(j, c.name());
            assert_eq!(serde_json::from_value::<MssClamp>(j).unwrap(), c);
        }
        assert!(serde_json::from_value::<MssClamp>(serde_json::json!("9")).is_err());
    }

    #[test]
    fn filtering_names_round_trip_and_match_serde() {
        for f in FilteringMode::ALL {
            assert_eq!(FilteringMode::from_name(f.name()), Some(f));
            assert_eq!(serde_json::to_value(f).unwrap(), f.name());
            assert_eq!(
                clap::ValueEnum::to_possible_value(&f).unwrap().get_name(),
                f.name()
            );
        }
        assert_eq!(FilteringMode::from_name("full-cone"), None);
    }

    #[test]
    fn mode_names_round_trip() {
        for m in [Mode::Auto, Mode::Native, Mode::Generic] {
            assert_eq!(Mode::from_name(m.name()), Some(m));
        }
        assert_eq!(Mode::from_name("fast"), None);
    }

    #[test]
    fn interface_names_fit_nftables_strings() {
        assert!(nft_safe_name(ConfigField::Lan, "br-lan").is_ok());
        assert!(nft_safe_name(ConfigField::Lan, "eth0.10").is_ok());
        for bad in ["a\"b", "a\\b", "a\nb", "lan*"] {
            assert!(nft_safe_name(ConfigField::Wan, bad).is_err(), "{bad:?}");
        }
    }
}
