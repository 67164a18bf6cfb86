//! `forward add|del|list`: the port-forward rules in `PORT_FORWARDS`, and
//! the IPv6 pinholes in `PINHOLES6`.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use anyhow::{Context, Result, bail};
use router_common::maps::{
    MAX_PINHOLES6, MAX_PORT_FORWARDS, PinholeKey6, PortForwardKey, PortForwardTarget,
};
use serde::Serialize;

use crate::{
    maps::{PinnedMaps, errno, snapshot},
    parse::{Proto, proto_name},
};

/// `BPF_NOEXIST`: insert only if the key is new.
const BPF_NOEXIST: u64 = 1;

#[must_use]
pub const fn key(proto: Proto, port: u16) -> PortForwardKey {
    PortForwardKey {
        proto: proto.number(),
        pad: 0,
        port,
    }
}

#[must_use]
pub fn target(t: SocketAddrV4) -> PortForwardTarget {
    PortForwardTarget {
        addr: t.ip().octets(),
        port: t.port(),
        pad: 0,
    }
}

/// One rule as `forward list --json` prints it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Rule {
    pub proto: String,
    pub wan_port: u16,
    pub lan_addr: String,
    pub lan_port: u16,
    /// `ipv6` for a pinhole (no translation: `wan_port` is `lan_port`);
    /// absent for IPv4 rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<&'static str>,
}

impl Rule {
    #[must_use]
    pub fn new(k: PortForwardKey, t: PortForwardTarget) -> Self {
        Self {
            proto: proto_name(k.proto),
            wan_port: k.port,
            lan_addr: Ipv4Addr::from(t.addr).to_string(),
            lan_port: t.port,
            family: None,
        }
    }

    /// An IPv6 pinhole as a rule row.
    #[must_use]
    pub fn pinhole6(k: &PinholeKey6) -> Self {
        Self {
            proto: proto_name(k.proto),
            wan_port: k.port,
            lan_addr: Ipv6Addr::from(k.addr).to_string(),
            lan_port: k.port,
            family: Some("ipv6"),
        }
    }

    /// The `router-ctl forward add` command that puts this rule back on
    /// the router of `netns` (the IPv6 target quoted: a shell would take
    /// its brackets for a pattern).
    #[must_use]
    pub fn add_command(&self, netns: Option<&str>) -> String {
        // A namespace name is any file name: quoted for the shell unless
        // it is plain.
        let ns = netns.map_or_else(String::new, |n| {
            if n.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.@+".contains(c))
            {
                format!("-n {n} ")
            } else {
                format!("-n '{}' ", n.replace('\'', r"'\''"))
            }
        });
        if self.family.is_some() {
            return format!(
                "router-ctl {ns}forward add {} '[{}]:{}'",
                self.proto, self.lan_addr, self.lan_port
            );
        }
        format!(
            "router-ctl {ns}forward add {} {} {}:{}",
            self.proto, self.wan_port, self.lan_addr, self.lan_port
        )
    }

    #[must_use]
    pub fn describe(&self) -> String {
        if self.family.is_some() {
            return format!(
                "{} pinhole to [{}]:{}",
                self.proto, self.lan_addr, self.lan_port
            );
        }
        format!(
            "{} {} -> {}:{}",
            self.proto, self.wan_port, self.lan_addr, self.lan_port
        )
    }
}

#[must_use]
pub fn pinhole_key(proto: Proto, to: SocketAddrV6) -> PinholeKey6 {
    PinholeKey6 {
        addr: to.ip().octets(),
        port: to.port(),
        proto: proto.number(),
        pad: 0,
    }
}

/// A note when the router does not route `addr` out of its LAN interface
/// (a typo, a host on another network, the router's own address): the
/// rule is kept (the host may come later), but its flows go nowhere
/// until then.
fn lan_route_note(maps: &PinnedMaps, addr: std::net::IpAddr) -> Option<String> {
    lan_route_note_via(maps.read_config().ok()?.lan_ifindex, addr)
}

/// [`lan_route_note`] for the LAN interface `lan` (`apply`, before the
/// router is attached).
#[must_use]
pub fn lan_route_note_via(lan: u32, addr: std::net::IpAddr) -> Option<String> {
    match crate::netlink::route_oif(addr) {
        Ok(Some(oif)) if oif == lan => None,
        Ok(_) => Some(format!(
            "note: the router does not route {addr} out of its LAN interface (another \
             network, or one of its own addresses): the rule's connections go nowhere until \
             it does (check the address: `ip route get {addr}`)"
        )),
        Err(_) => None,
    }
}

/// Opens an IPv6 pinhole: new flows of `proto` from the WAN to `to`
/// (standalone mode; in offload mode the kernel's firewall decides).
pub fn add_pinhole6(maps: &PinnedMaps, proto: Proto, to: SocketAddrV6) -> Result<()> {
    if maps.offload_mode() {
        bail!(
            "in offload mode (attach --admit kernel) inbound IPv6 is the kernel firewall's: \
             allow it there (e.g. `nft add rule inet filter forward iifname WAN ip6 daddr {} \
             {} dport {} accept`)",
            to.ip(),
            proto.name(),
            to.port()
        );
    }
    let mut holes = maps.pinholes6()?;
    let k = pinhole_key(proto, to);
    let want = Rule::pinhole6(&k);
    match holes.insert(k, 1, BPF_NOEXIST) {
        Ok(()) => {
            println!("added {}", want.describe());
            if let Some(note) = lan_route_note(maps, (*to.ip()).into()) {
                println!("{note}");
            }
        }
        Err(e) if errno(&e) == Some(libc::EEXIST) => {
            println!("{} already present; nothing changed", want.describe());
        }
        Err(e) if errno(&e) == Some(libc::E2BIG) => bail!(
            "the pinhole table is full ({MAX_PINHOLES6}); delete pinholes you no longer need \
             (`router-ctl forward list`)"
        ),
        Err(e) => return Err(e).context("inserting the pinhole"),
    }
    Ok(())
}

pub fn del_pinhole6(maps: &PinnedMaps, proto: Proto, to: SocketAddrV6) -> Result<()> {
    let mut holes = maps.pinholes6()?;
    let k = pinhole_key(proto, to);
    match holes.remove(&k) {
        Ok(()) => {
            println!(
                "deleted {}; flows it opened run until they expire",
                Rule::pinhole6(&k).describe()
            );
            Ok(())
        }
        Err(e) if errno(&e) == Some(libc::ENOENT) => bail!(
            "no {} pinhole to {to}; see `router-ctl forward list`",
            proto.name()
        ),
        Err(e) => Err(e).context("deleting the pinhole"),
    }
}

/// What a forward of `wan_port` inside `kernel_ports` (standalone mode's
/// kernel slow-path NAT range, when it has one) takes: the slow path
/// masquerades what XDP passes (fragments, other protocols, exhausted
/// ports) to ports of that range, and their replies, which XDP does not
/// know, would match the forward first and reach its host instead.
#[must_use]
pub fn kernel_range_note(wan_port: u16, kernel_ports: Option<(u16, u16)>) -> Option<String> {
    let (min, max) = kernel_ports?;
    (min..=max).contains(&wan_port).then(|| {
        format!(
            "note: WAN port {wan_port} is inside the kernel slow path's NAT range {min}-{max}: a \
             reply to a LAN flow the slow path masqueraded to that port would reach the \
             forward's host instead; attach with --kernel-nat-ports (apply: \
             nat.kernel_nat_ports) outside the forwarded ports to rule that out"
        )
    })
}

/// Adds the port forward `proto` `wan_port` -> `to`; `kernel_ports` is
/// the kernel slow path's NAT range, if any ([`kernel_range_note`]).
pub fn add(
    maps: &PinnedMaps,
    proto: Proto,
    wan_port: u16,
    to: SocketAddrV4,
    kernel_ports: Option<(u16, u16)>,
) -> Result<()> {
    if maps.offload_mode() {
        bail!(
            "in offload mode (attach --admit kernel) port forwards are the kernel's DNAT rules: \
             add one there (e.g. `nft add rule ip nat prerouting iifname WAN {} dport {wan_port} \
             dnat to {to}`), and `router-ctl run` offloads its flows",
            proto.name()
        );
    }
    let mut rules = maps.port_forwards()?;
    let k = key(proto, wan_port);
    let t = target(to);
    let want = Rule::new(k, t);
    // Two tries: another router-ctl may insert between our lookup and insert.
    for _ in 0..2 {
        match rules.get(&k, 0) {
            Ok(existing) if existing == t => {
                println!("rule {} already present; nothing changed", want.describe());
                return Ok(());
            }
            Ok(existing) => bail!(
                "{} conflicts with existing rule {}; delete it first \
                 (`router-ctl forward del {} {wan_port}`)",
                want.describe(),
                Rule::new(k, existing).describe(),
                proto.name()
            ),
            Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(e).context("reading the port-forward rules"),
        }
        match rules.insert(k, t, BPF_NOEXIST) {
            Ok(()) => {
                println!("added rule {}", want.describe());
                if let Some(note) = lan_route_note(maps, (*to.ip()).into()) {
                    println!("{note}");
                }
                if let Some(note) = kernel_range_note(wan_port, kernel_ports) {
                    println!("{note}");
                }
                if let Ok(cfg) = maps.read_config()
                    && (cfg.port_min..=cfg.port_max).contains(&wan_port)
                {
                    println!(
                        "note: {wan_port} is inside the masquerade port range {}-{}; \
                         new masqueraded flows no longer use it",
                        cfg.port_min, cfg.port_max
                    );
                }
                return Ok(());
            }
            Err(e) if errno(&e) == Some(libc::EEXIST) => {}
            Err(e) if errno(&e) == Some(libc::E2BIG) => bail!(
                "the port-forward table is full ({MAX_PORT_FORWARDS} rules); \
                 delete rules you no longer need (`router-ctl forward list`)"
            ),
            Err(e) => return Err(e).context("inserting the port-forward rule"),
        }
    }
    bail!(
        "the rule for {} {wan_port} keeps changing; try again",
        proto.name()
    )
}

pub fn del(maps: &PinnedMaps, proto: Proto, wan_port: u16) -> Result<()> {
    let mut rules = maps.port_forwards()?;
    let k = key(proto, wan_port);
    let existing = match rules.get(&k, 0) {
        Ok(t) => Some(t),
        Err(aya::maps::MapError::KeyNotFound) => None,
        Err(e) => return Err(e).context("reading the port-forward rules"),
    };
    match rules.remove(&k) {
        Ok(()) => {
            let what = existing.map_or_else(
                || format!("{} {wan_port}", proto.name()),
                |t| Rule::new(k, t).describe(),
            );
            println!(
                "deleted rule {what}; flows it opened run until they expire \
                 (`router-ctl conntrack flush` ends them)"
            );
            Ok(())
        }
        Err(e) if errno(&e) == Some(libc::ENOENT) => bail!(
            "no {} rule for WAN port {wan_port}; see `router-ctl forward list`",
            proto.name()
        ),
        Err(e) => Err(e).context("deleting the port-forward rule"),
    }
}

/// The rules sorted by protocol and port.
pub fn rules(maps: &PinnedMaps) -> Result<Vec<Rule>> {
    let map = maps.port_forwards()?;
    let mut out: Vec<Rule> = snapshot(&map, MAX_PORT_FORWARDS)?
        .iter()
        .map(|&(k, t)| Rule::new(k, t))
        .collect();
    out.sort_by(|a, b| (&a.proto, a.wan_port).cmp(&(&b.proto, b.wan_port)));
    // A router attached by an older router-ctl has no PINHOLES6 pinned.
    if let Ok(holes) = maps.pinholes6() {
        let mut v6: Vec<Rule> = snapshot(&holes, MAX_PINHOLES6)?
            .iter()
            .map(|(k, _)| Rule::pinhole6(k))
            .collect();
        v6.sort();
        out.extend(v6);
    }
    Ok(out)
}

/// "N port-forward rules and M IPv6 pinholes" of `rules` (either part left
/// out when it is zero), or `None` when there are none.
#[must_use]
pub fn rules_count(rules: &[Rule]) -> Option<String> {
    let holes = rules.iter().filter(|r| r.family.is_some()).count();
    let fwds = rules.len() - holes;
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", if n == 1 { one } else { many });
    match (fwds, holes) {
        (0, 0) => None,
        (f, 0) => Some(plural(f, "port-forward rule", "port-forward rules")),
        (0, h) => Some(plural(h, "IPv6 pinhole", "IPv6 pinholes")),
        (f, h) => Some(format!(
            "{} and {}",
            plural(f, "port-forward rule", "port-forward rules"),
            plural(h, "IPv6 pinhole", "IPv6 pinholes")
        )),
    }
}

/// What a change that needs a detach costs the rules in the pin
/// directory `dir`: "" if it has none, else a clause for the message.
#[must_use]
pub fn detach_loses(dir: &std::path::Path) -> String {
    rules(&PinnedMaps::at(dir))
        .ok()
        .and_then(|r| rules_count(&r))
        .map_or_else(String::new, |n| {
            format!(
                "; the detach also removes its {n} (they live in the fast path's maps): \
                 detach lists them with the `router-ctl forward add` commands that put them \
                 back"
            )
        })
}

#[must_use]
pub fn rules_table(rules: &[Rule]) -> String {
    use std::fmt::Write as _;
    if rules.is_empty() {
        return "no port-forward rules\n".to_owned();
    }
    let mut s = format!("{:<6} {:>8}    {}\n", "proto", "wan_port", "lan");
    for r in rules {
        if r.family.is_some() {
            let _ = writeln!(
                s,
                "{:<6} {:>8} -> [{}]:{} (IPv6 pinhole)",
                r.proto, r.wan_port, r.lan_addr, r.lan_port
            );
            continue;
        }
        let _ = writeln!(
            s,
            "{:<6} {:>8} -> {}:{}",
            r.proto, r.wan_port, r.lan_addr, r.lan_port
        );
    }
    s
}

pub fn list(maps: &PinnedMaps, json: bool) -> Result<()> {
    let rules = rules(maps)?;
    if json {
        println!("{}", serde_json::to_string(&rules)?);
    } else {
        print!("{}", rules_table(&rules));
        let offload = maps.offload_mode();
        if offload && !rules.is_empty() {
            // Kept in the maps (a switch back to standalone mode uses
            // them again), but nothing reads them now.
            println!(
                "offload mode (--admit kernel): these rules are not used; the kernel's \
                 firewall and NAT decide what comes in (its DNAT rules, its IPv6 forward \
                 rules). They take effect again in standalone mode (`router-ctl attach \
                 --admit xdp`)."
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_forward_inside_the_kernel_nat_range_is_noted() {
        let range = Some((61000, 65535));
        assert!(super::kernel_range_note(64738, range).is_some());
        assert!(super::kernel_range_note(61000, range).is_some());
        assert!(super::kernel_range_note(60999, range).is_none());
        assert!(super::kernel_range_note(64738, None).is_none());
    }

    use super::*;
    use router_common::maps::{IPPROTO_TCP, IPPROTO_UDP};

    #[test]
    fn keys_and_targets() {
        let k = key(Proto::Tcp, 8080);
        assert_eq!((k.proto, k.pad, k.port), (IPPROTO_TCP, 0, 8080));
        assert_eq!(key(Proto::Udp, 53).proto, IPPROTO_UDP);
        let t = target("192.168.50.2:80".parse().unwrap());
        assert_eq!((t.addr, t.port, t.pad), ([192, 168, 50, 2], 80, 0));
    }

    #[test]
    fn json_shape() {
        let r = Rule::new(
            key(Proto::Tcp, 8080),
            target("192.168.50.2:80".parse().unwrap()),
        );
        assert_eq!(
            serde_json::to_string(&vec![r]).unwrap(),
            r#"[{"proto":"tcp","wan_port":8080,"lan_addr":"192.168.50.2","lan_port":80}]"#
        );
        assert_eq!(serde_json::to_string(&Vec::<Rule>::new()).unwrap(), "[]");
    }

    #[test]
    fn table() {
        let r = Rule::new(
            key(Proto::Udp, 5353),
            target("192.168.50.3:53".parse().unwrap()),
        );
        assert_eq!(r.describe(), "udp 5353 -> 192.168.50.3:53");
        let t = rules_table(&[r]);
        assert!(
            t.lines()
                .nth(1)
                .unwrap()
                .contains("5353 -> 192.168.50.3:53"),
            "{t}"
        );
        assert_eq!(rules_table(&[]), "no port-forward rules\n");
    }

    #[test]
    fn commands_that_put_rules_back() {
        let r = Rule::new(
            key(Proto::Tcp, 8080),
            target("192.168.50.2:80".parse().unwrap()),
        );
        assert_eq!(
            r.add_command(Some("rtr")),
            "router-ctl -n rtr forward add tcp 8080 192.168.50.2:80"
        );
        assert_eq!(
            r.add_command(Some("my rtr's")),
            r"router-ctl -n 'my rtr'\''s' forward add tcp 8080 192.168.50.2:80"
        );
        let hole = Rule::pinhole6(&pinhole_key(
            Proto::Udp,
            "[2001:db8::5]:53".parse().unwrap(),
        ));
        assert_eq!(
            hole.add_command(None),
            "router-ctl forward add udp '[2001:db8::5]:53'"
        );
        assert_eq!(rules_count(&[]), None);
        assert_eq!(
            rules_count(&[r.clone(), r.clone(), hole.clone()]).as_deref(),
            Some("2 port-forward rules and 1 IPv6 pinhole")
        );
        assert_eq!(rules_count(&[hole]).as_deref(), Some("1 IPv6 pinhole"));
        assert_eq!(rules_count(&[r]).as_deref(), Some("1 port-forward rule"));
    }
}
