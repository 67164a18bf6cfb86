//! Machine-side measurements: CPU time from /proc/stat, the fd limit, a
//! description of the machine, percentiles.

use std::process::Command;

/// Clock ticks of the whole machine (all CPUs), from the first line of
/// /proc/stat.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuTicks {
    /// user + nice + system + irq + softirq + steal.
    pub busy: u64,
    pub softirq: u64,
    /// Everything, idle and iowait included.
    pub total: u64,
}

impl CpuTicks {
    pub fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        parse_proc_stat(&stat)
    }

    /// Ticks spent between `self` (earlier) and `later`.
    pub fn until(self, later: Self) -> Self {
        Self {
            busy: later.busy.saturating_sub(self.busy),
            softirq: later.softirq.saturating_sub(self.softirq),
            total: later.total.saturating_sub(self.total),
        }
    }

    /// Busy share of the machine in percent (100 = every core busy).
    pub fn busy_pct(self) -> f64 {
        pct(self.busy, self.total)
    }

    pub fn softirq_pct(self) -> f64 {
        pct(self.softirq, self.total)
    }

    /// Softirq time in nanoseconds.
    pub fn softirq_ns(self) -> f64 {
        self.softirq as f64 * 1e9 / clk_tck()
    }
}

fn pct(part: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        part as f64 * 100.0 / total as f64
    }
}

/// `cpu user nice system idle iowait irq softirq steal guest guest_nice`;
/// guest time is already part of user time.
pub fn parse_proc_stat(stat: &str) -> CpuTicks {
    let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return CpuTicks::default();
    };
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let f = |i: usize| v.get(i).copied().unwrap_or(0);
    CpuTicks {
        busy: f(0) + f(1) + f(2) + f(5) + f(6) + f(7),
        softirq: f(6),
        total: (0..8).map(f).sum(),
    }
}

/// CPU time (user + system) process `pid` has used, in clock ticks
/// ([`clk_tck`]); `None` when it is gone.
pub fn process_ticks(pid: u32) -> Option<u64> {
    parse_pid_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// `utime + stime` (fields 14 and 15) of a /proc/PID/stat line. The
/// command name (field 2, in parentheses) may hold spaces: fields are
/// counted after its closing parenthesis.
pub fn parse_pid_stat(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_comm.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// `sysconf(_SC_CLK_TCK)`, the unit of /proc/stat.
pub fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as f64 } else { 100.0 }
}

/// Raises `RLIMIT_NOFILE` (soft and, as root, hard) to at least `want` so
/// that iperf2 (which inherits it) can open thousands of sockets. Returns
/// the soft limit now in force.
pub fn raise_nofile(want: u64) -> u64 {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut cur);
        if cur.rlim_cur >= want {
            return cur.rlim_cur;
        }
        let raised = libc::rlimit {
            rlim_cur: want,
            rlim_max: want.max(cur.rlim_max),
        };
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const raised) != 0 {
            // Not allowed above the hard limit: take what there is.
            let capped = libc::rlimit {
                rlim_cur: cur.rlim_max,
                rlim_max: cur.rlim_max,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const capped);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut cur);
    }
    cur.rlim_cur
}

fn first_line_of(cmd: &[&str]) -> String {
    Command::new(cmd[0]).args(&cmd[1..]).output().map_or_else(
        |e| format!("{}: {e}", cmd[0]),
        |o| {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s.lines().next().unwrap_or_default().trim().to_owned()
        },
    )
}

/// The VM and the container layer `systemd-detect-virt --vm` and
/// `--container` named ("none" for a layer that is not there).
fn virtualization(vm: &str, container: &str) -> String {
    let known = |x: &str| !x.is_empty() && x != "none" && !x.contains(' ');
    match (known(vm), known(container)) {
        (true, true) => format!("{vm} VM, {container} container"),
        (true, false) => format!("{vm} VM"),
        (false, true) => format!("{container} container"),
        (false, false) => "none".to_owned(),
    }
}

/// What the figures were measured on.
pub fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or_else(|| "unknown".to_owned(), |(_, m)| m.trim().to_owned());
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .unwrap_or(0.0);
    // A container inside a VM: `systemd-detect-virt` alone names only the
    // container, so ask for each layer.
    let virt = virtualization(
        &first_line_of(&["systemd-detect-virt", "--vm"]),
        &first_line_of(&["systemd-detect-virt", "--container"]),
    );
    serde_json::json!({
        "cpu_model": model,
        "cores": cores,
        "mem_gib": (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        "kernel": first_line_of(&["uname", "-r"]),
        "virtualization": virt,
        "iperf": first_line_of(&["iperf", "-v"]),
        "clk_tck": clk_tck(),
        "date": first_line_of(&["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"]),
    })
}

/// Nearest-rank percentile `p` (0..=100) of `v` (sorted here); NaN when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let rank = (p / 100.0 * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn proc_stat_fields() {
        let t = parse_proc_stat("cpu  10 1 5 100 2 3 7 1 0 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n");
        assert_eq!(t.busy, 10 + 1 + 5 + 3 + 7 + 1);
        assert_eq!(t.softirq, 7);
        assert_eq!(t.total, 129);
    }

    #[test]
    fn virtualization_names_every_layer() {
        assert_eq!(virtualization("kvm", "docker"), "kvm VM, docker container");
        assert_eq!(virtualization("kvm", "none"), "kvm VM");
        assert_eq!(virtualization("none", "lxc"), "lxc container");
        assert_eq!(virtualization("none", "none"), "none");
        let missing = "systemd-detect-virt: No such file or directory (os error 2)";
        assert_eq!(virtualization(missing, missing), "none");
    }

    #[test]
    fn pid_stat_cpu_time_after_a_command_with_spaces() {
        let line = "4242 (router ctl) S 1 4242 4242 0 -1 4194560 500 0 0 0 37 12 0 0 20 0 1 0";
        assert_eq!(parse_pid_stat(line), Some(37 + 12));
        assert_eq!(parse_pid_stat("4242 (x) S 1"), None);
    }

    #[test]
    fn percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!((percentile(&mut v, 50.0) - 50.0).abs() < 1e-9);
        assert!((percentile(&mut v, 99.0) - 99.0).abs() < 1e-9);
        assert!(percentile(&mut [], 50.0).is_nan());
    }
}
