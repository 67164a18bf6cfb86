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

/// Where tests that could not run here record why ([`skipped`]):
/// `target/debug/skipped-tests.txt`, beside the `router-ctl` binary.
/// `cargo xtask test` empties it first and lists it last.
fn skipped_tests_file() -> std::path::PathBuf {
    router_ctl_bin().with_file_name("skipped-tests.txt")
}

/// Records that test `name` could not run on this machine, and why (the
/// test then returns without asserting anything): said on stderr and in
/// [`skipped_tests_file`], which `cargo xtask test` prints at its end,
/// so a skip shows as one, never as a pass. For limits of the machine
/// only (a kernel feature refused to the process), never for a failure.
pub fn skipped(name: &str, reason: &str) {
    use std::io::Write as _;
    eprintln!("SKIPPED {name}: {reason}");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skipped_tests_file())
    {
        let _ = writeln!(f, "{name}: {reason}");
    }
}

/// Where failing tests record the end of what they said
/// ([`record_failures`]): `target/debug/failed-tests.txt`, beside the
/// `router-ctl` binary. `cargo xtask test` empties it first and prints it
/// last, so the reason for a failure is in the last lines of a long run's
/// output (a log that keeps only its head and tail still has it).
fn failed_tests_file() -> std::path::PathBuf {
    router_ctl_bin().with_file_name("failed-tests.txt")
}

/// Of a failing test's message: this many first lines (what failed) and
/// this many last (the state it showed last), the middle left out.
const FAILURE_HEAD_LINES: usize = 6;
const FAILURE_TAIL_LINES: usize = 40;

/// Makes every panic of this process (a failing test: libtest names the
/// thread after it) also append its message, shortened to its first and
/// last lines, to [`failed_tests_file`]; the panic is then reported as
/// before. Installed once per process, by the kit's entry points (a
/// topology, a loaded program).
pub fn record_failures() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if EXPECTED_PANICS.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                return previous(info);
            }
            let name = std::thread::current()
                .name()
                .unwrap_or("(a thread a test started)")
                .to_owned();
            let message = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied())
                .unwrap_or("(a panic without a message)");
            let at = info.location().map(ToString::to_string).unwrap_or_default();
            append_failure(&name, &at, message);
            previous(info);
        }));
    });
}

/// How many [`catch_expected_panic`] calls are running, in any thread:
/// the closure may panic in a thread it starts (`Topology::in_ns`). Tests
/// run one at a time (`cargo xtask test`), so no other test's failure
/// falls in the window.
static EXPECTED_PANICS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `std::panic::catch_unwind` for a panic provoked or tolerated on
/// purpose (the kit's own unwinding test, the benchmark's loader): not
/// recorded as a failure ([`record_failures`]).
///
/// # Errors
/// The panic's payload, as `catch_unwind` returns it.
pub fn catch_expected_panic<R>(
    f: impl FnOnce() -> R + std::panic::UnwindSafe,
) -> std::thread::Result<R> {
    use std::sync::atomic::Ordering::SeqCst;
    EXPECTED_PANICS.fetch_add(1, SeqCst);
    let r = std::panic::catch_unwind(f);
    EXPECTED_PANICS.fetch_sub(1, SeqCst);
    r
}

fn append_failure(name: &str, at: &str, message: &str) {
    use std::io::Write as _;
    let lines: Vec<&str> = message.lines().collect();
    let shortened = if lines.len() <= FAILURE_HEAD_LINES + FAILURE_TAIL_LINES {
        lines.join("\n")
    } else {
        format!(
            "{}\n[... {} lines left out ...]\n{}",
            lines[..FAILURE_HEAD_LINES].join("\n"),
            lines.len() - FAILURE_HEAD_LINES - FAILURE_TAIL_LINES,
            lines[lines.len() - FAILURE_TAIL_LINES..].join("\n")
        )
    };
    // One write of the whole record (appended: two failing at once do
    // not interleave their lines).
    let record = format!("== {name} (panicked at {at})\n{shortened}\n");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(failed_tests_file())
    {
        let _ = f.write_all(record.as_bytes());
    }
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

/// Loads the nftables ruleset `rules` into namespace `ns` (`nft -f` in a
/// scratch directory of its own); panics (with nft's output) unless it
/// loads.
pub fn load_nft(ns: &str, rules: &str) {
    let dir = crate::Scratch::new("nft");
    let path = dir.path("rules.nft");
    std::fs::write(&path, rules).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    let path_arg = path.to_string_lossy().into_owned();
    let cmd = ["ip", "netns", "exec", ns, "nft", "-f", path_arg.as_str()];
    let out = run(&cmd);
    check(&cmd, &out);
}

/// Whether `/run/netns/NAME` exists.
#[must_use]
pub fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// Kills (SIGKILL) every process whose network namespace is the named
/// namespace `name` (one of the run's own, about to be deleted): what
/// escaped its process group or outlived its guard (a daemon's helper, a
/// browser's crash handler) would otherwise keep running in a namespace
/// nobody deletes.
pub fn kill_processes_in(name: &str) {
    let Ok(out) = Command::new("timeout")
        .args(["-k", "2", "10", "ip", "netns", "pids", name])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    else {
        return;
    };
    let me = std::process::id();
    for pid in String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter(|&p| p > 1 && p.cast_unsigned() != me)
    {
        // SAFETY: kill(2) of a pid `ip netns pids` listed.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Removes what is left of the router of the run's own namespace `name`:
/// `router-ctl -n NAME detach` where its pins or only its record remain (a
/// crash test's, a detach cut short), then its files
/// ([`crate::addr::forget_router_files`]).
pub fn remove_router(name: &str) {
    let pins = Path::new(crate::PIN_ROOT).join(name);
    let record = Path::new(crate::STATE_DIR).join(format!("{name}.json"));
    if pins.exists() || record.exists() {
        let _ = Command::new("timeout")
            .args(["-k", "5", CMD_TIMEOUT])
            .arg(router_ctl_bin())
            .args(["-n", name, "detach"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    crate::addr::forget_router_files(name);
}

/// Whether nothing of a namespace or a router named `name` exists: no
/// namespace, no pins (or staging pins) and no record router-ctl keeps
/// for it. A name in use by another run (a shared bpffs or
/// `/var/lib/xdp-router`, records outliving a reboot) is never taken: the
/// run would adopt what it finds there, and remove it at its end.
#[must_use]
pub fn name_is_free(name: &str) -> bool {
    let state = Path::new(crate::STATE_DIR);
    let pins = Path::new(crate::PIN_ROOT);
    !netns_exists(name)
        && !pins.join(name).exists()
        && !Path::new(&format!("{}-staging", crate::PIN_ROOT))
            .join(name)
            .exists()
        && ["json", "standalone.json", "last-admit"]
            .iter()
            .all(|ext| !state.join(format!("{name}.{ext}")).exists())
}

/// A random token of this process (4 hex digits, from the kernel's
/// random pool), put into the names a run creates: pids repeat across
/// reboots and PID namespaces, what a name owns may outlive its run.
#[must_use]
pub fn run_token() -> &'static str {
    static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOKEN.get_or_init(|| {
        let mut b = [0u8; 2];
        let read = std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b));
        if read.is_err() {
            // Not random, but not the pid alone either.
            let ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos());
            b = ns.to_le_bytes()[..2].try_into().unwrap_or_default();
        }
        format!("{:02x}{:02x}", b[0], b[1])
    })
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

/// `NETLINK_NETFILTER` in `/proc/net/netlink`'s protocol column.
const NETLINK_NETFILTER: u32 = 12;
/// The conntrack event groups (`NFNLGRP_CONNTRACK_NEW`, `_UPDATE`,
/// `_DESTROY`) as the bits of `/proc/net/netlink`'s groups column.
const CONNTRACK_EVENT_GROUPS: u32 = 0b111;

/// The inodes of the sockets in a `/proc/net/netlink` table that listen to
/// conntrack events.
#[must_use]
pub fn conntrack_listeners_in(table: &str) -> Vec<u64> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            // sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode
            let f: Vec<&str> = line.split_whitespace().collect();
            let protocol: u32 = f.get(1)?.parse().ok()?;
            let groups = u32::from_str_radix(f.get(3)?, 16).ok()?;
            (protocol == NETLINK_NETFILTER && groups & CONNTRACK_EVENT_GROUPS != 0)
                .then(|| f.get(9)?.parse().ok())
                .flatten()
        })
        .collect()
}

/// The conntrack event listeners on the whole machine (socket inodes), in
/// every network namespace a process lives in or `/run/netns` names.
///
/// The kernel keeps whether anyone listens machine-wide, not per network
/// namespace (`nf_ctnetlink_has_listener`, "can't be pernet due to
/// `NETLINK_LISTEN_ALL_NSID`", include/linux/netfilter.h; and netlink's
/// per-protocol listener bitmap, which `ctnetlink_conntrack_event` asks): while one socket anywhere listens, the
/// conntrack of every namespace builds an event message for each state
/// change, also where nobody receives it. A benchmark of the kernel's
/// forwarding pays for every listener on the machine (the offload daemon
/// of another topology, conntrackd, another suite's tests).
#[must_use]
pub fn conntrack_event_listeners() -> std::collections::BTreeSet<u64> {
    let mut found = std::collections::BTreeSet::new();
    let numbered = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .map(|e| e.path().join("net/netlink"));
    for path in numbered {
        // A process may end while this reads: skipped.
        if let Ok(table) = std::fs::read_to_string(path) {
            found.extend(conntrack_listeners_in(&table));
        }
    }
    // Namespaces no process lives in: read from a thread inside each (a
    // daemon started with `router-ctl -n` keeps its sockets there while it
    // runs in its caller's namespace).
    let named = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten();
    for entry in named {
        let table = std::thread::scope(|s| {
            s.spawn(|| {
                crate::netns::try_enter(&entry.path()).ok()?;
                std::fs::read_to_string("/proc/thread-self/net/netlink").ok()
            })
            .join()
            .ok()
            .flatten()
        });
        if let Some(table) = table {
            found.extend(conntrack_listeners_in(&table));
        }
    }
    found
}

#[cfg(test)]
mod unit {
    use super::{conntrack_listeners_in, parse_snmp, release_at_least};

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

    /// A socket of this process subscribed to conntrack's NEW events is
    /// found while it is open, and gone once closed (as root: the groups
    /// need `CAP_NET_ADMIN`).
    #[test]
    #[ignore = "needs root (conntrack event groups): run cargo xtask test"]
    fn finds_a_listener_of_this_process() {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        assert!(
            super::is_root(),
            "subscribing to conntrack events needs root"
        );
        // SAFETY: plain socket(2); the fd is owned below.
        let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_NETFILTER) };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: a fresh fd of our own.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: zeroed sockaddr_nl is valid; family and groups set below.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as u16;
        addr.nl_groups = 1; // NFNLGRP_CONNTRACK_NEW
        // SAFETY: addr is a valid sockaddr_nl of the given size.
        let rc = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (&raw const addr).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0, "bind: {}", std::io::Error::last_os_error());
        // SAFETY: fstat into a zeroed stat of our own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(sock.as_raw_fd(), &raw mut st) }, 0);
        let inode = st.st_ino;
        assert!(
            super::conntrack_event_listeners().contains(&inode),
            "our listening socket (inode {inode}) found"
        );
        drop(sock);
        assert!(
            !super::conntrack_event_listeners().contains(&inode),
            "a closed socket is no listener"
        );
    }

    /// The table's netfilter sockets with an event group; not those of
    /// another protocol, nor a request socket (groups 0), nor a netfilter
    /// socket of other groups only (`NFNLGRP_CONNTRACK_EXP_NEW`, bit 4).
    #[test]
    fn finds_conntrack_event_listeners_in_a_netlink_table() {
        let t = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n\
                 00000000a1 0   1234       00000000 0        0        0     2        0        100\n\
                 00000000a2 12  2000       00000007 0        0        0     2        0        201\n\
                 00000000a3 12  2001       00000000 0        0        0     2        0        202\n\
                 00000000a4 12  2002       00000008 0        0        0     2        0        203\n\
                 00000000a5 12  2003       00000004 0        0        0     2        0        204\n\
                 00000000a6 0   2004       00000007 0        0        0     2        0        205\n";
        assert_eq!(conntrack_listeners_in(t), [201, 204]);
    }
}
