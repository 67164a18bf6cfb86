//! Capability checks from the effective set (`CapEff` in
//! `/proc/self/status`), not the uid: root without `CAP_NET_ADMIN` cannot
//! attach, and a non-root process with the capabilities can.

use anyhow::{Result, bail};

pub const CAP_DAC_OVERRIDE: u32 = 1;
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
/// entering a namespace, `CAP_SYS_ADMIN`); `root`: the effective uid is 0.
/// Another uid also needs `CAP_DAC_OVERRIDE`: the pins, the records and
/// their directories are root's, owner-only (0600, 0700), and without it
/// they would look absent ("not attached").
#[must_use]
pub fn missing(set: u64, need: Need, netns: bool, root: bool) -> Vec<&'static str> {
    let mut m = Vec::new();
    if need == Need::Nothing {
        return m;
    }
    if !root && !has(set, CAP_DAC_OVERRIDE) {
        m.push("CAP_DAC_OVERRIDE (the pins and records are root's, owner-only)");
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
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let m = missing(set, need, netns, root);
    if m.is_empty() {
        return Ok(());
    }
    let missing = m.join(", ");
    // No setcap advice: capabilities on the binary would let every local
    // user attach, detach and rewrite the router.
    if root {
        bail!(
            "`router-ctl {command}` needs {missing}, which this root process lacks (a \
             container or a service with a reduced capability bounding set): run it with \
             them (e.g. `CapabilityBoundingSet=` of the unit, `docker run --privileged`)"
        )
    }
    bail!(
        "`router-ctl {command}` needs {missing}, which a user other than root lacks: run it \
         as root (sudo router-ctl ...) or from a service running as root"
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
        assert!(missing(all, Need::Change, true, true).is_empty());
        assert!(missing(0, Need::Nothing, true, false).is_empty());
        assert_eq!(missing(0, Need::Read, false, true), vec!["CAP_BPF"]);
        assert_eq!(
            missing(0, Need::Change, false, true),
            vec!["CAP_BPF", "CAP_NET_ADMIN"]
        );
        let no_net_admin = all & !(1 << CAP_NET_ADMIN);
        assert_eq!(
            missing(no_net_admin, Need::Change, true, true),
            vec!["CAP_NET_ADMIN"]
        );
        assert!(missing(no_net_admin, Need::Read, true, true).is_empty());
        // CAP_SYS_ADMIN stands in for CAP_BPF (kernels before 5.8).
        let sys_admin_only = (1 << CAP_SYS_ADMIN) | (1 << CAP_NET_ADMIN);
        assert!(missing(sys_admin_only, Need::Change, true, true).is_empty());
        // Another uid with CAP_BPF alone cannot open root's 0600 pins.
        let bpf_only = 1 << CAP_BPF;
        assert_eq!(missing(bpf_only, Need::Read, false, false).len(), 1);
        assert!(missing(bpf_only | (1 << CAP_DAC_OVERRIDE), Need::Read, false, false).is_empty());
    }
}
