//! Capability checks from the effective set (`CapEff` in
//! `/proc/self/status`), not the uid: root without `CAP_NET_ADMIN` cannot
//! attach, and a non-root process with the capabilities can.

use anyhow::{Result, bail};

pub const CAP_NET_ADMIN: u32 = 12;
pub const CAP_SYS_ADMIN: u32 = 21;
pub const CAP_BPF: u32 = 39;

/// What a command needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Nothing (help, completions, man page).
    Nothing,
    /// Reading pinned maps: `CAP_BPF` (or `CAP_SYS_ADMIN`).
    Read,
    /// Changing state: also `CAP_NET_ADMIN` (XDP attach, map writes).
    Change,
}

/// Parses the `CapEff:` line of a `/proc/PID/status` text.
#[must_use]
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

fn effective() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| parse_cap_eff(&s))
        .unwrap_or(0)
}

const fn has(set: u64, cap: u32) -> bool {
    set & (1 << cap) != 0
}

/// The names of the capabilities missing from `set` for `need` (and for
/// entering a namespace, `CAP_SYS_ADMIN`).
#[must_use]
pub fn missing(set: u64, need: Need, netns: bool) -> Vec<&'static str> {
    let mut m = Vec::new();
    if need == Need::Nothing {
        return m;
    }
    if !has(set, CAP_BPF) && !has(set, CAP_SYS_ADMIN) {
        m.push("CAP_BPF");
    }
    if need == Need::Change && !has(set, CAP_NET_ADMIN) {
        m.push("CAP_NET_ADMIN");
    }
    if netns && !has(set, CAP_SYS_ADMIN) {
        m.push("CAP_SYS_ADMIN (for -n NETNS)");
    }
    m
}

/// Fails with a message naming the missing capabilities.
pub fn require(command: &str, need: Need, netns: bool) -> Result<()> {
    let set = effective();
    let m = missing(set, need, netns);
    if m.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let who = if root {
        "running as root, but without"
    } else {
        "not root and without"
    };
    bail!(
        "`router-ctl {command}` needs CAP_BPF and CAP_NET_ADMIN ({who} {}); run it as root \
         (sudo router-ctl ...), or grant the capabilities: \
         `setcap cap_bpf,cap_net_admin,cap_sys_admin+ep router-ctl`",
        m.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cap_eff() {
        let s = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n";
        assert_eq!(parse_cap_eff(s), Some(0x01ff_ffff_ffff));
        assert_eq!(parse_cap_eff("Name: x\n"), None);
    }

    #[test]
    fn names_what_is_missing() {
        let all = u64::MAX;
        assert!(missing(all, Need::Change, true).is_empty());
        assert!(missing(0, Need::Nothing, true).is_empty());
        assert_eq!(missing(0, Need::Read, false), vec!["CAP_BPF"]);
        assert_eq!(
            missing(0, Need::Change, false),
            vec!["CAP_BPF", "CAP_NET_ADMIN"]
        );
        let no_net_admin = all & !(1 << CAP_NET_ADMIN);
        assert_eq!(
            missing(no_net_admin, Need::Change, true),
            vec!["CAP_NET_ADMIN"]
        );
        assert!(missing(no_net_admin, Need::Read, true).is_empty());
        // CAP_SYS_ADMIN stands in for CAP_BPF (kernels before 5.8).
        let sys_admin_only = (1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN);
        assert!(missing(sys_admin_only, Need::Change, true).is_empty());
    }
}
