//! Wall-clock and monotonic time, and how times are shown (`status`,
//! `stats --watch`, the attach record).

use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds since the epoch.
#[must_use]
pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `CLOCK_MONOTONIC` in nanoseconds, the base of the data path's
/// `bpf_ktime_get_coarse_ns`.
#[must_use]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec; CLOCK_MONOTONIC always exists.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

/// `YYYY-MM-DD HH:MM:SS UTC`.
#[must_use]
pub fn format_time(unix: u64) -> String {
    let t = libc::time_t::try_from(unix).unwrap_or(0);
    // SAFETY: gmtime_r writes into the zeroed tm.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers.
    unsafe { libc::gmtime_r(&raw const t, &raw mut tm) };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// `3d 4h`, `5m 2s`...
#[must_use]
pub fn format_age(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m {s}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_time(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(format_age(5), "5s");
        assert_eq!(format_age(125), "2m 5s");
        assert_eq!(format_age(3 * 3600 + 60), "3h 1m");
        assert_eq!(format_age(2 * 86400 + 3600), "2d 1h");
    }

    #[test]
    fn monotonic_moves_forward() {
        let a = monotonic_ns();
        assert!(monotonic_ns() >= a);
    }
}
