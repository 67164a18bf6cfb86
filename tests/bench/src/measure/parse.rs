//! Parsers of what the tools and the kernel print: `/proc/net/dev`,
//! `/proc/net/softnet_stat`, iperf2's CSV reports, `ping -D`.

use crate::measure::sampler::Window;

/// Receive packets and bytes summed over `devs` from a `/proc/net/dev` text.
pub fn parse_net_dev(text: &str, devs: &[&str]) -> (u64, u64) {
    let mut pk = 0;
    let mut by = 0;
    for l in text.lines() {
        let Some((dev, rest)) = l.split_once(':') else {
            continue;
        };
        if !devs.contains(&dev.trim()) {
            continue;
        }
        let v: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        if v.len() >= 2 {
            by += v[0];
            pk += v[1];
        }
    }
    (pk, by)
}

/// Column 2 of `/proc/net/softnet_stat` (hex, one line per CPU): packets
/// dropped because the backlog queue was full.
pub fn parse_softnet_drops(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|x| u64::from_str_radix(x, 16).ok())
        .sum()
}

/// Parsed iperf2 `-y C` client lines.
#[derive(Debug, Default)]
pub struct ClientCsv {
    pub bytes: u64,
    /// Longest stream duration (seconds).
    pub secs: f64,
    pub streams: u32,
}

/// `time,src,sport,dst,dport,id,interval,bytes,bps[,udp fields]`; iperf
/// 2.1.8 prints one line per stream and no sum line in CSV mode.
pub fn parse_client_csv(text: &str) -> ClientCsv {
    let mut c = ClientCsv::default();
    for l in text.lines() {
        let f: Vec<&str> = l.trim().split(',').collect();
        if f.len() < 9 || f[5] == "-1" {
            continue;
        }
        let Some(end) = f[6]
            .split_once('-')
            .and_then(|(_, e)| e.parse::<f64>().ok())
        else {
            continue;
        };
        c.bytes += f[7].parse::<u64>().unwrap_or(0);
        c.secs = c.secs.max(end);
        c.streams += 1;
    }
    c
}

/// Parsed iperf2 `-u -y C` server lines: datagrams received and lost.
#[derive(Debug, Default)]
pub struct ServerUdp {
    pub received: u64,
    pub lost: u64,
    pub secs: f64,
    pub streams: u32,
}

/// UDP server line: `...,interval,bytes,bps,jitter,lost,total,pct,ooo`.
pub fn parse_server_udp(text: &str) -> ServerUdp {
    let mut s = ServerUdp::default();
    for l in text.lines() {
        let f: Vec<&str> = l.trim().split(',').collect();
        if f.len() < 12 || f[5] == "-1" {
            continue;
        }
        let (Ok(lost), Ok(total)) = (f[10].parse::<i64>(), f[11].parse::<i64>()) else {
            continue;
        };
        let end = f[6]
            .split_once('-')
            .and_then(|(_, e)| e.parse::<f64>().ok())
            .unwrap_or(0.0);
        s.lost += lost.max(0).cast_unsigned();
        s.received += (total - lost).max(0).cast_unsigned();
        s.secs = s.secs.max(end);
        s.streams += 1;
    }
    s
}

/// `ping -D` output: (Unix time, round-trip ms) per answered echo, and the
/// loss in percent: from the summary line if ping got to print it, else
/// from the gaps in the answered sequence numbers (ping is killed when the
/// client ends).
pub fn parse_ping(text: &str) -> (Vec<(f64, f64)>, f64) {
    let mut seqs: Vec<u64> = Vec::new();
    let rtts: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let at = l
                .strip_prefix('[')
                .and_then(|r| r.split_once(']'))
                .and_then(|(t, _)| t.parse().ok())
                .unwrap_or(f64::NAN);
            let (_, r) = l.split_once("time=")?;
            let rtt = r.split_whitespace().next()?.parse().ok()?;
            if let Some(seq) = l
                .split_once("icmp_seq=")
                .and_then(|(_, x)| x.split_whitespace().next()?.parse().ok())
            {
                seqs.push(seq);
            }
            Some((at, rtt))
        })
        .collect();
    let summary = text.lines().find_map(|l| {
        let (tx, rest) = l.split_once(" packets transmitted, ")?;
        let rx = rest.split_whitespace().next()?;
        let (tx, rx): (f64, f64) = (tx.trim().parse().ok()?, rx.parse().ok()?);
        (tx > 0.0).then(|| (tx - rx) * 100.0 / tx)
    });
    let from_seqs = || {
        let (lo, hi) = (seqs.iter().min()?, seqs.iter().max()?);
        let sent = (hi - lo + 1) as f64;
        Some((sent - seqs.len() as f64).max(0.0) * 100.0 / sent)
    };
    let loss = summary.or_else(from_seqs).unwrap_or(f64::NAN);
    (rtts, loss)
}

/// Round-trip times of the pings answered inside `win` (a window of a run
/// that started at Unix time `start_unix`).
pub fn rtts_within(pings: &[(f64, f64)], start_unix: f64, win: &Window) -> Vec<f64> {
    let (w0, w1) = (start_unix + win.from, start_unix + win.from + win.secs);
    pings
        .iter()
        .filter(|(at, _)| *at >= w0 && *at <= w1)
        .map(|p| p.1)
        .collect()
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn client_csv_sums_streams() {
        let t = "19700101000000,192.168.50.2,1,203.0.113.2,5001,2,0.0-2.0,100,400\n\
                 19700101000000,192.168.50.2,2,203.0.113.2,5001,1,0.0-6.1,300,400\n";
        let c = parse_client_csv(t);
        assert_eq!((c.bytes, c.streams), (400, 2));
        assert!((c.secs - 6.1).abs() < 1e-9);
    }

    #[test]
    fn server_udp_counts() {
        let t = "1,203.0.113.1,45418,203.0.113.2,5001,1,0.0-2.0,10132760,40588757,0.000,\
                 77564,235888,32.882,125\n";
        let s = parse_server_udp(t);
        assert_eq!(
            (s.received, s.lost, s.streams),
            (235_888 - 77_564, 77_564, 1)
        );
    }

    #[test]
    fn ping_times_and_loss() {
        let t = "[1.5] 64 bytes from 203.0.113.2: icmp_seq=1 ttl=63 time=0.123 ms\n\
                 [2.5] 64 bytes from 203.0.113.2: icmp_seq=2 ttl=63 time=1.5 ms\n\
                 4 packets transmitted, 2 received, 50% packet loss, time 3ms\n";
        let (r, loss) = parse_ping(t);
        assert_eq!(r, vec![(1.5, 0.123), (2.5, 1.5)]);
        assert!((loss - 50.0).abs() < 1e-9);
        // Killed before the summary: loss from the sequence gaps.
        let t = "[1.0] 64 bytes from x: icmp_seq=1 ttl=63 time=0.1 ms\n\
                 [1.2] 64 bytes from x: icmp_seq=4 ttl=63 time=0.1 ms\n";
        let (_, loss) = parse_ping(t);
        assert!((loss - 50.0).abs() < 1e-9);
    }
}
