//! The machine the tests run on: bounded host commands, the kernel
//! version, root, the namespaces that exist, kernel SNMP counters, and the
//! workspace's `router-ctl` binary.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The `router-ctl` binary of this workspace (debug profile).
#[must_use]
pub fn router_ctl_bin() -> std::path::PathBuf {
    // Next to this test binary's target dir, so CARGO_TARGET_DIR is honoured.
    let exe = std::env::current_exe().expect("current_exe");
    // target/debug/deps/<test> -> target/debug/router-ctl; a binary of the
    // workspace (the benchmark, target/debug/router-bench) has it beside it.
    let dir = exe.parent().expect("a binary lives in a directory");
    let profile = dir.parent().unwrap_or(dir);
    [dir, profile]
        .map(|d| d.join("router-ctl"))
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| profile.join("router-ctl"))
}

/// Upper bound for any external command the harness runs.
pub(crate) const CMD_TIMEOUT: &str = "60";

/// Whether the running kernel is at least `major.minor` (from
/// `/proc/sys/kernel/osrelease`, e.g. `6.18.44-fc-v1045`).
#[must_use]
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    release_at_least(&release, major, minor)
}

fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|x| x.parse::<u32>().unwrap_or(0));
    let (a, b) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

/// Whether the process runs with effective uid 0.
#[must_use]
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Runs a host command (bounded by `timeout`) and returns its output
/// whatever the exit status. Only for commands that address a namespace
/// explicitly (`ip -n NAME`, `ip netns ...`) or change nothing.
///
/// # Panics
/// If the command cannot be started.
#[must_use]
pub fn run(cmd: &[&str]) -> Output {
    Command::new("timeout")
        .args(["-k", "5", CMD_TIMEOUT])
        .args(cmd)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

/// Panics (with stdout and stderr) unless `out`, the output of `cmd`,
/// says it succeeded.
pub fn check(cmd: &[&str], out: &Output) {
    assert!(
        out.status.success(),
        "command {cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// [`run`] that panics (with stdout and stderr) unless the command succeeds.
pub fn run_ok(cmd: &[&str]) {
    let out = run(cmd);
    check(cmd, &out);
}

/// Loads the nftables ruleset `rules` into namespace `ns` (`nft -f`, from
/// a temporary file named after the namespace and this process, removed
/// after); panics (with nft's output) unless it loads.
pub fn load_nft(ns: &str, rules: &str) {
    let path = std::env::temp_dir().join(format!("{ns}-{}.nft", std::process::id()));
    std::fs::write(&path, rules).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    let path_arg = path.to_string_lossy().into_owned();
    let cmd = ["ip", "netns", "exec", ns, "nft", "-f", path_arg.as_str()];
    let out = run(&cmd);
    let _ = std::fs::remove_file(&path);
    check(&cmd, &out);
}

/// Whether `/run/netns/NAME` exists.
#[must_use]
pub fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Finds `counter` (nstat naming: table prefix + field) in the text of
/// /proc/net/snmp or /proc/net/netstat (header line, value line pairs).
#[must_use]
pub fn parse_snmp(text: &str, counter: &str) -> Option<u64> {
    let mut lines = text.lines();
    while let (Some(head), Some(vals)) = (lines.next(), lines.next()) {
        let (Some((p1, names)), Some((p2, values))) = (head.split_once(':'), vals.split_once(':'))
        else {
            return None;
        };
        if p1 != p2 {
            return None;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if counter.strip_prefix(p1) == Some(n) {
                // Some fields (e.g. Tcp MaxConn) are -1; report them as 0.
                return Some(v.parse::<u64>().unwrap_or(0));
            }
        }
    }
    None
}

#[cfg(test)]
mod unit {
    use super::{parse_snmp, release_at_least};

    #[test]
    fn kernel_releases() {
        assert!(release_at_least("6.18.44-fc-v1045\n", 5, 18));
        assert!(release_at_least("5.18.0", 5, 18));
        assert!(!release_at_least("5.15.0-91-generic", 5, 18));
        assert!(!release_at_least("4.19.0", 5, 18));
        assert!(release_at_least("6.1.0-rc1", 5, 18));
    }

    #[test]
    fn parses_snmp_pairs() {
        let t = "Ip: Forwarding DefaultTTL ForwDatagrams\nIp: 1 64 42\n\
                 Tcp: RtoAlgorithm MaxConn\nTcp: 1 -1\n\
                 TcpExt: SyncookiesSent\nTcpExt: 7\n";
        assert_eq!(parse_snmp(t, "IpForwDatagrams"), Some(42));
        assert_eq!(parse_snmp(t, "TcpMaxConn"), Some(0));
        assert_eq!(parse_snmp(t, "TcpExtSyncookiesSent"), Some(7));
        assert_eq!(parse_snmp(t, "IpNope"), None);
    }
}
