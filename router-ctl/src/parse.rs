//! Pure parsers for command-line values. Each returns a message that names
//! what is wrong and what is expected; clap prefixes it with the argument.

use std::net::{Ipv4Addr, SocketAddrV4, SocketAddrV6};

use router_common::maps::{
    DEFAULT_MAX_FLOWS, FlowState, IPPROTO_ICMP, IPPROTO_TCP, IPPROTO_UDP, Timeouts,
};

/// Largest `--max-flows`: the conntrack map holds two entries per flow,
/// and the kernel's hash maps hold at most 2^27 entries (`htab_map_alloc`
/// refuses more buckets, of 16 bytes each, than a `u32` counts bytes of,
/// `E2BIG`). Memory runs out well before on most routers (about 200 bytes
/// an entry).
pub const MAX_FLOWS_LIMIT: u32 = 1 << 26;

/// Protocols a port-forward rule can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    #[must_use]
    pub const fn number(self) -> u8 {
        match self {
            Self::Tcp => IPPROTO_TCP,
            Self::Udp => IPPROTO_UDP,
        }
    }

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

/// Name of an IP protocol number as `conntrack list` shows it.
#[must_use]
pub fn proto_name(n: u8) -> String {
    match n {
        IPPROTO_TCP => "tcp".to_owned(),
        IPPROTO_UDP => "udp".to_owned(),
        IPPROTO_ICMP => "icmp".to_owned(),
        router_common::ipv6::IPPROTO_ICMPV6 => "icmpv6".to_owned(),
        other => format!("proto-{other}"),
    }
}

/// A TCP/UDP port, 1-65535.
pub fn parse_port(s: &str) -> Result<u16, String> {
    let n: u32 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a port number (expected 1-65535)"))?;
    match u16::try_from(n) {
        Ok(p) if p >= 1 => Ok(p),
        _ => Err(format!("port {n} is out of range (expected 1-65535)")),
    }
}

/// `--port-range MIN-MAX`, inclusive, 1 <= MIN <= MAX <= 65535.
pub fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let (lo, hi) = s
        .split_once('-')
        .ok_or_else(|| format!("{s:?} is not MIN-MAX (example: 1024-65535)"))?;
    let lo = parse_port(lo).map_err(|e| format!("minimum: {e}"))?;
    let hi = parse_port(hi).map_err(|e| format!("maximum: {e}"))?;
    if lo > hi {
        return Err(format!(
            "minimum {lo} is above maximum {hi} (example: 1024-65535)"
        ));
    }
    Ok((lo, hi))
}

/// `--keep-in-kernel-mark MARK[/MASK]`: a connection mark as nftables
/// and iptables write it (decimal or `0x` hexadecimal), the mask all ones
/// when left out; a mark with bits outside its mask never matches.
pub fn parse_mark(s: &str) -> Result<(u32, u32), String> {
    let number = |t: &str| {
        let t = t.trim();
        t.strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .map_or_else(|| t.parse::<u32>(), |h| u32::from_str_radix(h, 16))
            .map_err(|_| format!("{t:?} is not a 32-bit mark (decimal or 0x hexadecimal)"))
    };
    let (value, bits) = match s.split_once('/') {
        Some((m, k)) => (number(m)?, number(k)?),
        None => (number(s)?, u32::MAX),
    };
    if bits == 0 || value & !bits != 0 {
        return Err(format!(
            "{s:?}: the mark has bits outside its mask, or the mask is 0 (example: 0x100/0xff00)"
        ));
    }
    Ok((value, bits))
}

/// `--route-mark-mask MASK`: a nonzero 32-bit mask (decimal or 0x
/// hexadecimal).
pub fn parse_mark_mask(s: &str) -> Result<u32, String> {
    match parse_mark(s) {
        Ok((mask, _)) if !s.contains('/') && mask != 0 => Ok(mask),
        _ => Err(format!(
            "{s:?} is not a mark mask: a nonzero 32-bit number, decimal or 0x hexadecimal \
             (example: 0x3f00)"
        )),
    }
}

/// `--max-flows N`, 1 ..= [`MAX_FLOWS_LIMIT`].
pub fn parse_max_flows(s: &str) -> Result<u32, String> {
    let n: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number of flows (default {DEFAULT_MAX_FLOWS})"))?;
    match u32::try_from(n) {
        Ok(n) if (1..=MAX_FLOWS_LIMIT).contains(&n) => Ok(n),
        _ => Err(format!(
            "{n} flows is out of range (expected 1-{MAX_FLOWS_LIMIT})"
        )),
    }
}

/// `--wan-addr auto|ADDR`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WanAddr {
    Auto,
    Addr(Ipv4Addr),
}

/// Why an address cannot be a unicast host address, if it cannot.
#[must_use]
pub fn non_unicast_reason(a: Ipv4Addr) -> Option<&'static str> {
    if a.is_unspecified() {
        Some("is unspecified")
    } else if a.is_broadcast() {
        Some("is the broadcast address")
    } else if a.is_multicast() {
        Some("is a multicast address")
    } else if a.is_loopback() {
        Some("is a loopback address")
    } else {
        None
    }
}

/// A `-n` namespace name as `ip netns` names them (a file in /run/netns).
/// The name also names the router's pin directory, record and lock, so a
/// path (`/run/netns/rtr`, `../x`) would reach outside them, and
/// `default` is the root namespace's router.
pub fn parse_netns(s: &str) -> Result<String, String> {
    if s.is_empty() || s == "." || s == ".." || s.contains('/') || s.contains('\0') {
        return Err(format!(
            "{s:?} is not a namespace name: give the name `ip netns list` shows (rtr, not \
             /run/netns/rtr)"
        ));
    }
    // The names of a namespace's own files (`NS.standalone.json`,
    // `NS.daemon.lock`, `NS.apply.lock`...) would be another namespace's
    // record or lock.
    if [".standalone", ".daemon", ".apply"]
        .iter()
        .any(|suffix| s.ends_with(suffix))
    {
        return Err(format!(
            "a namespace named {s:?} would share the files router-ctl keeps for namespace \
             {:?}: rename it",
            s.rsplit_once('.').map_or(s, |(n, _)| n)
        ));
    }
    if s == "default" {
        return Err(
            "a namespace named \"default\" would share the root namespace router's pins and \
             record: rename it (`ip netns` names are files in /run/netns), or leave out -n to \
             work on the root namespace"
                .into(),
        );
    }
    Ok(s.to_owned())
}

pub fn parse_wan_addr(s: &str) -> Result<WanAddr, String> {
    if s == "auto" {
        return Ok(WanAddr::Auto);
    }
    let a: Ipv4Addr = s
        .parse()
        .map_err(|_| format!("{s:?} is neither `auto` nor an IPv4 address"))?;
    if let Some(why) = non_unicast_reason(a) {
        return Err(format!(
            "{a} {why}; give the WAN interface's unicast address"
        ));
    }
    Ok(WanAddr::Addr(a))
}

/// One `--timeout STATE=SECS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeoutArg {
    pub state: FlowState,
    pub secs: u32,
}

/// The help of `--timeout`, with the states of the shared table.
#[must_use]
pub fn timeout_help() -> String {
    format!(
        "Idle timeout of a flow state, repeatable. STATE is one of {}",
        FlowState::KEYS
    )
}

pub fn parse_timeout(s: &str) -> Result<TimeoutArg, String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not STATE=SECS (example: udp-unreplied=60)"))?;
    let state = FlowState::from_key(k.trim())
        .ok_or_else(|| format!("unknown state {k:?} (expected one of {})", FlowState::KEYS))?;
    let secs: u32 = v
        .trim()
        .parse()
        .map_err(|_| format!("{v:?} is not a number of seconds (expected 1-{})", u32::MAX))?;
    if secs == 0 {
        return Err(format!("timeout for {k} must be at least 1 second"));
    }
    Ok(TimeoutArg { state, secs })
}

/// The defaults with every `--timeout` applied. A state given twice is an
/// error (it is almost certainly a typo).
pub fn apply_timeouts(args: &[TimeoutArg]) -> Result<Timeouts, String> {
    let mut t = Timeouts::default();
    let mut seen = Vec::with_capacity(args.len());
    for a in args {
        if seen.contains(&a.state) {
            return Err(format!(
                "--timeout {} given more than once; give each state once",
                a.state.key()
            ));
        }
        seen.push(a.state);
        t.set(a.state, a.secs);
    }
    Ok(t)
}

/// Port-forward target `LAN_ADDR:PORT`: a unicast IPv4 address and a port
/// 1-65535.
pub fn parse_forward_target(s: &str) -> Result<SocketAddrV4, String> {
    let (a, p) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not LAN_ADDR:PORT (example: 192.168.50.2:80)"))?;
    let addr: Ipv4Addr = a.parse().map_err(|_| {
        format!("{a:?} is not an IPv4 address (expected LAN_ADDR:PORT, example 192.168.50.2:80)")
    })?;
    if let Some(why) = non_unicast_reason(addr) {
        return Err(format!("{addr} {why}; give the LAN host's address"));
    }
    let port = parse_port(p)?;
    Ok(SocketAddrV4::new(addr, port))
}

/// The second argument of `forward add|del`: a WAN port (IPv4, with a
/// translation to `LAN_ADDR:PORT`), or `[LAN_ADDR6]:PORT`, an IPv6 pinhole
/// (no translation: the WAN may open flows to that LAN address and port).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardFrom {
    WanPort(u16),
    Pinhole6(SocketAddrV6),
}

/// `WAN_PORT` or `[LAN_ADDR6]:PORT` (a global unicast IPv6 address).
pub fn parse_forward_from(s: &str) -> Result<ForwardFrom, String> {
    if !s.starts_with('[') {
        return parse_port(s).map(ForwardFrom::WanPort);
    }
    let a: SocketAddrV6 = s
        .parse()
        .map_err(|_| format!("{s:?} is not [LAN_ADDR6]:PORT (example: [2001:db8:50::2]:22)"))?;
    let ip = a.ip();
    if ip.is_multicast()
        || ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_unicast_link_local()
        || ip.to_ipv4_mapped().is_some()
    {
        return Err(format!(
            "{ip} is not a global unicast address; give the LAN host's address"
        ));
    }
    if a.port() == 0 {
        return Err("port 0 is out of range 1-65535".to_owned());
    }
    Ok(ForwardFrom::Pinhole6(SocketAddrV6::new(
        *ip,
        a.port(),
        0,
        0,
    )))
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum as _;

    use super::*;

    #[test]
    fn marks_parse_with_or_without_a_mask() {
        assert_eq!(parse_mark("0x100"), Ok((0x100, u32::MAX)));
        assert_eq!(parse_mark("256/0xff00"), Ok((0x100, 0xff00)));
        for bad in [
            "",
            "0x",
            "x1",
            "0x100/0",
            "0x100/0xff",
            "4294967296",
            "1/2/3",
        ] {
            assert!(parse_mark(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn mark_masks_are_nonzero_numbers() {
        assert_eq!(parse_mark_mask("0x3f00"), Ok(0x3f00));
        assert_eq!(parse_mark_mask("65280"), Ok(0xff00));
        for bad in ["", "0", "0x0", "0x100/0xff00", "mask"] {
            assert!(parse_mark_mask(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn namespace_names_are_names() {
        assert_eq!(parse_netns("rtr"), Ok("rtr".to_owned()));
        assert_eq!(parse_netns("rtr.lan"), Ok("rtr.lan".to_owned()));
        for bad in [
            "",
            ".",
            "..",
            "/run/netns/rtr",
            "a/b",
            "default",
            "rtr.daemon",
            "rtr.standalone",
            "rtr.apply",
        ] {
            assert!(parse_netns(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn forward_from_port_or_pinhole() {
        assert_eq!(parse_forward_from("8080"), Ok(ForwardFrom::WanPort(8080)));
        assert!(parse_forward_from("0").is_err());
        let ForwardFrom::Pinhole6(a) = parse_forward_from("[2001:db8:50::2]:22").unwrap() else {
            panic!("not a pinhole");
        };
        assert_eq!(a.to_string(), "[2001:db8:50::2]:22");
        for bad in [
            "[fe80::1]:22",
            "[ff02::1]:22",
            "[::]:22",
            "[::ffff:1.2.3.4]:22",
            "[2001:db8::2]:0",
            "[2001:db8::2]",
        ] {
            assert!(parse_forward_from(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ports() {
        assert_eq!(parse_port("1"), Ok(1));
        assert_eq!(parse_port("65535"), Ok(65535));
        assert!(parse_port("0").unwrap_err().contains("out of range"));
        assert!(parse_port("65536").unwrap_err().contains("out of range"));
        assert!(parse_port("-1").unwrap_err().contains("not a port"));
        assert!(parse_port("http").unwrap_err().contains("not a port"));
        assert!(parse_port("").is_err());
    }

    #[test]
    fn port_ranges() {
        assert_eq!(parse_port_range("1024-65535"), Ok((1024, 65535)));
        assert_eq!(parse_port_range("1-1"), Ok((1, 1)));
        assert_eq!(parse_port_range("40000-40010"), Ok((40000, 40010)));
        assert!(
            parse_port_range("0-100")
                .unwrap_err()
                .starts_with("minimum")
        );
        assert!(
            parse_port_range("100-70000")
                .unwrap_err()
                .starts_with("maximum")
        );
        assert!(parse_port_range("2000-1000").unwrap_err().contains("above"));
        assert!(parse_port_range("1024").unwrap_err().contains("MIN-MAX"));
        assert!(parse_port_range("a-b").is_err());
        assert!(parse_port_range("-5").is_err());
        assert!(parse_port_range("1-2-3").is_err());
    }

    #[test]
    fn max_flows() {
        assert_eq!(parse_max_flows("1"), Ok(1));
        assert_eq!(parse_max_flows("262144"), Ok(262_144));
        assert_eq!(
            parse_max_flows(&MAX_FLOWS_LIMIT.to_string()),
            Ok(MAX_FLOWS_LIMIT)
        );
        assert!(parse_max_flows("0").unwrap_err().contains("out of range"));
        assert!(parse_max_flows(&(MAX_FLOWS_LIMIT + 1).to_string()).is_err());
        assert!(parse_max_flows("99999999999999999999").is_err());
        assert!(parse_max_flows("many").is_err());
    }

    #[test]
    fn wan_addrs() {
        assert_eq!(parse_wan_addr("auto"), Ok(WanAddr::Auto));
        assert_eq!(
            parse_wan_addr("203.0.113.1"),
            Ok(WanAddr::Addr(Ipv4Addr::new(203, 0, 113, 1)))
        );
        for bad in ["0.0.0.0", "255.255.255.255", "224.0.0.1", "127.0.0.1"] {
            assert!(parse_wan_addr(bad).is_err(), "{bad}");
        }
        assert!(parse_wan_addr("Auto").is_err());
        assert!(parse_wan_addr("::1").is_err());
        assert!(parse_wan_addr("203.0.113.1/24").is_err());
    }

    #[test]
    fn timeouts_parse_every_key() {
        for &state in FlowState::ALL {
            assert_eq!(
                parse_timeout(&format!("{}=7", state.key())),
                Ok(TimeoutArg { state, secs: 7 })
            );
        }
        assert!(
            parse_timeout("udp=5")
                .unwrap_err()
                .ends_with(&format!("(expected one of {})", FlowState::KEYS))
        );
        assert!(
            parse_timeout("udp-unreplied=0")
                .unwrap_err()
                .contains("at least 1")
        );
        assert!(
            parse_timeout("udp=5")
                .unwrap_err()
                .contains("unknown state")
        );
        assert!(parse_timeout("icmp").unwrap_err().contains("STATE=SECS"));
        assert!(parse_timeout("icmp=-1").unwrap_err().contains("seconds"));
        assert!(parse_timeout("icmp=1.5").is_err());
        assert!(parse_timeout("icmp=4294967296").is_err());
    }

    #[test]
    fn timeouts_apply_to_the_right_fields() {
        let args: Vec<TimeoutArg> = FlowState::ALL
            .iter()
            .zip(1..)
            .map(|(s, v)| parse_timeout(&format!("{}={v}", s.key())).unwrap())
            .collect();
        let t = apply_timeouts(&args).unwrap();
        assert_eq!(
            (
                t.tcp_syn_sent,
                t.tcp_established,
                t.tcp_fin_wait,
                t.tcp_closed,
                t.udp_unreplied,
                t.udp_replied,
                t.icmp,
                t.pad
            ),
            (1, 2, 3, 4, 5, 6, 7, 0)
        );
        assert_eq!(apply_timeouts(&[]).unwrap(), Timeouts::default());
        let one = apply_timeouts(&[parse_timeout("udp-replied=300").unwrap()]).unwrap();
        assert_eq!(
            one,
            Timeouts {
                udp_replied: 300,
                ..Timeouts::default()
            }
        );
        let twice = [
            parse_timeout("icmp=5").unwrap(),
            parse_timeout("icmp=6").unwrap(),
        ];
        assert!(
            apply_timeouts(&twice)
                .unwrap_err()
                .contains("more than once")
        );
    }

    #[test]
    fn forward_targets() {
        assert_eq!(
            parse_forward_target("192.168.50.2:80"),
            Ok(SocketAddrV4::new(Ipv4Addr::new(192, 168, 50, 2), 80))
        );
        assert!(
            parse_forward_target("192.168.50.2")
                .unwrap_err()
                .contains("LAN_ADDR:PORT")
        );
        assert!(
            parse_forward_target("192.168.50.2:0")
                .unwrap_err()
                .contains("out of range")
        );
        assert!(parse_forward_target("192.168.50.2:65536").is_err());
        assert!(
            parse_forward_target("192.168.50:80")
                .unwrap_err()
                .contains("IPv4")
        );
        assert!(
            parse_forward_target("host:80")
                .unwrap_err()
                .contains("IPv4")
        );
        assert!(
            parse_forward_target("0.0.0.0:80")
                .unwrap_err()
                .contains("unspecified")
        );
        assert!(
            parse_forward_target("224.1.2.3:80")
                .unwrap_err()
                .contains("multicast")
        );
        assert!(parse_forward_target("[::1]:80").is_err());
        assert!(parse_forward_target(":80").is_err());
    }

    #[test]
    fn protocols() {
        for p in [Proto::Tcp, Proto::Udp] {
            assert_eq!(proto_name(p.number()), p.name());
        }
        assert_eq!(proto_name(IPPROTO_ICMP), "icmp");
        assert_eq!(proto_name(47), "proto-47");
        assert_eq!(Proto::from_str("tcp", false), Ok(Proto::Tcp));
        assert_eq!(Proto::from_str("udp", false), Ok(Proto::Udp));
        assert!(Proto::from_str("icmp", false).is_err());
    }
}
