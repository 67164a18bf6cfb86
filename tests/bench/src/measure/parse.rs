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

/// One answered echo of `ping -D`: when it was printed (Unix time), its
/// round trip in ms and its sequence number (if ping printed one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ping {
    pub at: f64,
    pub rtt: f64,
    pub seq: Option<u64>,
}

/// What `ping -D` printed: the answered echoes, and the summary's
/// (transmitted, received) if ping got to print it (it is killed when the
/// client ends).
#[derive(Debug, Default)]
pub struct PingLog {
    pub answered: Vec<Ping>,
    pub summary: Option<(u64, u64)>,
}

/// The pings that count for a run: the round trips (ms) of the answered
/// ones and how many were lost among them.
#[derive(Debug, Default, Clone)]
pub struct Pings {
    pub rtts: Vec<f64>,
    pub lost: u64,
}

impl Pings {
    /// The lost share in percent (NaN when no ping counts).
    pub fn loss_pct(&self) -> f64 {
        let sent = self.rtts.len() as u64 + self.lost;
        if sent == 0 {
            f64::NAN
        } else {
            self.lost as f64 * 100.0 / sent as f64
        }
    }
}

/// Parses `ping -D` output.
pub fn parse_ping(text: &str) -> PingLog {
    let answered = text
        .lines()
        .filter_map(|l| {
            let at = l
                .strip_prefix('[')
                .and_then(|r| r.split_once(']'))
                .and_then(|(t, _)| t.parse().ok())
                .unwrap_or(f64::NAN);
            let (_, r) = l.split_once("time=")?;
            let rtt = r.split_whitespace().next()?.parse().ok()?;
            let seq = l
                .split_once("icmp_seq=")
                .and_then(|(_, x)| x.split_whitespace().next()?.parse().ok());
            Some(Ping { at, rtt, seq })
        })
        .collect();
    let summary = text.lines().find_map(|l| {
        let (tx, rest) = l.split_once(" packets transmitted, ")?;
        let rx = rest.split_whitespace().next()?;
        Some((tx.trim().parse().ok()?, rx.parse().ok()?))
    });
    PingLog { answered, summary }
}

/// Sequence numbers missing between the first and the last of `pings`
/// (echoes sent between two answered ones and never answered).
fn gaps(pings: &[Ping]) -> u64 {
    let seqs: Vec<u64> = pings.iter().filter_map(|p| p.seq).collect();
    match (seqs.iter().min(), seqs.iter().max()) {
        (Some(lo), Some(hi)) => (hi - lo + 1).saturating_sub(seqs.len() as u64),
        _ => 0,
    }
}

impl Ping {
    /// When it was sent (Unix time): printed at its answer, a round trip
    /// after.
    fn sent(&self) -> f64 {
        self.at - self.rtt / 1000.0
    }
}

impl PingLog {
    /// The pings of a window of a run that started at Unix time
    /// `start_unix`: those answered inside it, and as lost the echoes never
    /// answered that were sent inside it, each sent (ping's interval being
    /// steady) where its sequence number falls between the answered ones
    /// around it. Without a sequence number on both sides of a gap
    /// (ping killed before answers came again) the gap is not counted.
    /// With nothing inside it, every ping of the run (lost: from the
    /// summary, else from the gaps). `None` when ping answered nothing.
    pub fn within(&self, start_unix: f64, win: &Window) -> Option<Pings> {
        let (w0, w1) = (start_unix + win.from, start_unix + win.from + win.secs);
        let rtts: Vec<f64> = self
            .answered
            .iter()
            .filter(|p| p.at >= w0 && p.at <= w1)
            .map(|p| p.rtt)
            .collect();
        let mut by_seq: Vec<(u64, f64)> = self
            .answered
            .iter()
            .filter_map(|p| Some((p.seq?, p.sent())))
            .collect();
        by_seq.sort_by_key(|&(seq, _)| seq);
        let lost: u64 = by_seq
            .windows(2)
            .map(|w| {
                let ((a, ta), (b, tb)) = (w[0], w[1]);
                (a + 1..b)
                    .filter(|k| {
                        let t = ta + (tb - ta) * (k - a) as f64 / (b - a) as f64;
                        t >= w0 && t <= w1
                    })
                    .count() as u64
            })
            .sum();
        if rtts.is_empty() && lost == 0 {
            return self.all();
        }
        Some(Pings { rtts, lost })
    }

    /// Every ping of the run; `None` when none was answered.
    pub fn all(&self) -> Option<Pings> {
        if self.answered.is_empty() {
            return None;
        }
        let rx = self.answered.len() as u64;
        Some(Pings {
            rtts: self.answered.iter().map(|p| p.rtt).collect(),
            lost: self.summary.map_or_else(
                || gaps(&self.answered),
                |(tx, got)| tx.saturating_sub(got.max(rx)),
            ),
        })
    }
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
        let log = parse_ping(t);
        let rtts: Vec<f64> = log.answered.iter().map(|p| p.rtt).collect();
        assert_eq!(rtts, vec![0.123, 1.5]);
        assert_eq!(log.summary, Some((4, 2)));
        let all = log.all().unwrap();
        assert_eq!(all.lost, 2);
        assert!((all.loss_pct() - 50.0).abs() < 1e-9);
        // Killed before the summary: lost from the sequence gaps.
        let t = "[1.0] 64 bytes from x: icmp_seq=1 ttl=63 time=0.1 ms\n\
                 [1.2] 64 bytes from x: icmp_seq=4 ttl=63 time=0.1 ms\n";
        assert_eq!(parse_ping(t).all().unwrap().lost, 2);
        assert!(parse_ping("").all().is_none());
    }

    #[test]
    fn pings_of_a_window_count_its_lost_ones() {
        // Echoes 1-10 printed at 100.1 .. 101.0; 4, 5 and 9 lost; a run
        // that started at 100.0 with a window from 0.25 s for 0.6 s
        // (100.25 .. 100.85): 3, 6, 7, 8 answered inside, 4 and 5 lost
        // between them (9 lies after the window's last answered echo).
        let t = [1, 2, 3, 6, 7, 8, 10]
            .iter()
            .map(|n| {
                format!(
                    "[{}] 64 bytes from x: icmp_seq={n} ttl=63 time={n}.0 ms\n",
                    100.0 + f64::from(*n) / 10.0
                )
            })
            .collect::<Vec<_>>()
            .concat();
        let log = parse_ping(&t);
        let win = Window {
            from: 0.25,
            secs: 0.6,
            ..Window::default()
        };
        let p = log.within(100.0, &win).unwrap();
        assert_eq!(p.rtts, vec![3.0, 6.0, 7.0, 8.0]);
        assert_eq!(p.lost, 2);
        // A loss at the window's end, after its last answer (9, sent at
        // about 100.89 between 8 and 10): counted too.
        let to_the_end = Window {
            from: 0.25,
            secs: 0.7,
            ..Window::default()
        };
        let p = log.within(100.0, &to_the_end).unwrap();
        assert_eq!((p.rtts.len(), p.lost), (4, 3));
        // A window with no answered echo between two answered ones: the
        // echoes between them (4 and 5), all lost.
        let starved = Window {
            from: 0.35,
            secs: 0.2,
            ..Window::default()
        };
        let p = log.within(100.0, &starved).unwrap();
        assert_eq!((p.rtts.len(), p.lost), (0, 2));
        assert!((p.loss_pct() - 100.0).abs() < 1e-9);
        // One after the last answer: the whole run's.
        let after = Window {
            from: 5.0,
            secs: 1.0,
            ..Window::default()
        };
        let p = log.within(100.0, &after).unwrap();
        assert_eq!((p.rtts.len(), p.lost), (7, 3));
    }
}
