//! When the offload daemon waits for conntrack events and when it polls
//! for them. Waiting (the event socket in the runtime's epoll set) handles
//! each event at once, but every datagram the kernel queues wakes the
//! daemon: under a stream of short connections that is ~6 us of CPU per
//! wake-up between the daemon's `epoll_wait`, the sender's softirq and the
//! clients' extra context switches (REPORT-offperf). Polling (the socket out
//! of the epoll set, read on a timer, a batch per `recvmmsg`) costs one
//! timer wake-up per [`POLL_EVERY`] however many events came, and delays
//! them by at most that much: nothing next to the 200 ms a TCP connection
//! settles before its offload ([`crate::offload::TCP_SETTLE_NS`]).

use std::time::Duration;

/// Between two reads of the event socket while polling. Short next to the
/// TCP settle time, long enough that a busy socket gives a batch per read.
pub const POLL_EVERY: Duration = Duration::from_millis(5);
/// Over how long the rates that switch the mode are measured: long enough
/// that a short burst or a quiet moment does not flip it, short enough to
/// follow a load that starts or stops.
const WINDOW_NS: u64 = 100_000_000;
/// Wake-ups per second from which waiting costs more than polling would:
/// polling wakes 1 s / [`POLL_EVERY`] = 200 times a second; at 500 the
/// timer saves more than half the wake-ups.
const POLL_FROM_WAKES_PER_SEC: u64 = 500;
/// Datagrams per second below which polling goes back to waiting: then
/// waiting would wake no more often than the poll timer does (a datagram
/// wakes the daemon at most once), and events are handled at once again.
/// Below [`POLL_FROM_WAKES_PER_SEC`], so a load near either does not make
/// the mode flap.
const WAIT_BELOW_DATAGRAMS_PER_SEC: u64 = 200;
/// After registering the socket for waiting failed (`ENOSPC` at
/// `fs.epoll.max_user_watches`, `ENOMEM`), how long it is polled before
/// waiting is tried again: a cause that lasts costs one attempt a second,
/// not one per poll.
pub const WAIT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The rates that switch the mode, per second: the defaults
/// ([`POLL_FROM_WAKES_PER_SEC`], [`WAIT_BELOW_DATAGRAMS_PER_SEC`]) or, for
/// tests, others (`run --event-pace-rates`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PaceRates {
    /// Wake-ups per second from which waiting switches to polling.
    pub poll_from: u64,
    /// Datagrams per second below which polling goes back to waiting.
    pub wait_below: u64,
}

impl Default for PaceRates {
    fn default() -> Self {
        Self {
            poll_from: POLL_FROM_WAKES_PER_SEC,
            wait_below: WAIT_BELOW_DATAGRAMS_PER_SEC,
        }
    }
}

impl std::str::FromStr for PaceRates {
    type Err = String;

    /// `POLL_FROM,WAIT_BELOW`, e.g. `500,200` (the defaults).
    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || {
            format!(
                "{s:?}: expected POLL_FROM,WAIT_BELOW (wake-ups per second from which events \
                 are polled, datagrams per second below which they are waited for again; \
                 0 < WAIT_BELOW <= POLL_FROM), e.g. 500,200"
            )
        };
        let (poll_from, wait_below) = s.split_once(',').ok_or_else(usage)?;
        let rate = |r: &str| r.trim().parse::<u64>().map_err(|_| usage());
        let rates = Self {
            poll_from: rate(poll_from)?,
            wait_below: rate(wait_below)?,
        };
        // A wait_below above poll_from would flap between the modes.
        if rates.wait_below == 0 || rates.wait_below > rates.poll_from {
            return Err(usage());
        }
        Ok(rates)
    }
}

/// How the event socket is read over the daemon's life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pacing {
    /// Waited for or polled as the load says, at these rates.
    ByLoad(PaceRates),
    /// Polled whatever the load (`run --poll-events`, for tests of the
    /// polled path).
    AlwaysPolling,
}

/// How the event socket is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// In the epoll set: each datagram wakes the daemon.
    Wait,
    /// Out of the epoll set, read every [`POLL_EVERY`].
    Poll,
}

/// The mode switch: counts wake-ups (waiting) or datagrams (polling) over
/// windows of [`WINDOW_NS`] and says which mode the next read uses.
#[derive(Debug)]
pub struct EventPace {
    mode: ReadMode,
    /// How it was started: at which rates the mode switches, or never.
    pacing: Pacing,
    window_start_ns: u64,
    /// Wake-ups (waiting) or datagrams (polling) since `window_start_ns`.
    count: u64,
    /// Polling, whatever the load, before this time: waiting failed
    /// ([`EventPace::wait_failed`]).
    no_wait_before_ns: u64,
    /// Waiting failed at the last attempt (and has not succeeded since).
    wait_failing: bool,
}

impl EventPace {
    /// As `pacing` says, with a window from `now_ns`: waiting, switched at
    /// its rates, or polling whatever the load (`run --poll-events`, for
    /// tests of the polled path).
    pub fn start(now_ns: u64, pacing: Pacing) -> Self {
        Self {
            mode: match pacing {
                Pacing::ByLoad(_) => ReadMode::Wait,
                Pacing::AlwaysPolling => ReadMode::Poll,
            },
            pacing,
            window_start_ns: now_ns,
            count: 0,
            no_wait_before_ns: 0,
            wait_failing: false,
        }
    }

    /// How it was started ([`EventPace::start`]).
    pub fn pacing(&self) -> Pacing {
        self.pacing
    }

    /// After a read the socket woke the daemon for (waiting): the mode of
    /// the next read.
    pub fn woke(&mut self, now_ns: u64) -> ReadMode {
        self.count += 1;
        self.close_window(now_ns)
    }

    /// After a read on the poll timer that got `datagrams`: the mode of the
    /// next read.
    pub fn polled(&mut self, now_ns: u64, datagrams: u64) -> ReadMode {
        self.count += datagrams;
        self.close_window(now_ns)
    }

    /// Waiting was decided but the socket could not be registered for it:
    /// polling again, for [`WAIT_RETRY_AFTER`] at least, with a new
    /// window. True for the first failure since waiting last worked (the
    /// one to warn about; the attempts after it while the cause lasts are
    /// the same occurrence).
    pub fn wait_failed(&mut self, now_ns: u64) -> bool {
        self.mode = ReadMode::Poll;
        self.window_start_ns = now_ns;
        self.count = 0;
        self.no_wait_before_ns = now_ns.saturating_add(WAIT_RETRY_AFTER.as_nanos() as u64);
        !std::mem::replace(&mut self.wait_failing, true)
    }

    /// The socket was registered for waiting: true when that ends a run of
    /// failures ([`EventPace::wait_failed`]).
    pub fn wait_worked(&mut self) -> bool {
        std::mem::replace(&mut self.wait_failing, false)
    }

    /// At the end of a window, the rate over it decides the mode (and a new
    /// window starts, also when the mode changes: each mode counts its own).
    fn close_window(&mut self, now_ns: u64) -> ReadMode {
        let elapsed = now_ns.saturating_sub(self.window_start_ns);
        let Pacing::ByLoad(rates) = self.pacing else {
            return self.mode;
        };
        if elapsed < WINDOW_NS {
            return self.mode;
        }
        // count / elapsed s compared with the per-second thresholds, in
        // integers: count * 1e9 vs rate * elapsed ns.
        let scaled = u128::from(self.count) * 1_000_000_000;
        let per = |rate: u64| u128::from(rate) * u128::from(elapsed);
        self.mode = match self.mode {
            ReadMode::Wait if scaled >= per(rates.poll_from) => ReadMode::Poll,
            ReadMode::Poll
                if now_ns >= self.no_wait_before_ns && scaled < per(rates.wait_below) =>
            {
                ReadMode::Wait
            }
            same => same,
        };
        self.window_start_ns = now_ns;
        self.count = 0;
        self.mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Waiting at the default rates, with a window from 0.
    fn waiting() -> EventPace {
        EventPace::start(0, Pacing::ByLoad(PaceRates::default()))
    }

    /// Wakes `pace` `n` times evenly over `ms` milliseconds from `from_ms`:
    /// the mode after the last.
    fn wake_evenly(pace: &mut EventPace, from_ms: u64, ms: u64, n: u64) -> ReadMode {
        (1..=n)
            .map(|i| pace.woke(from_ms * MS + i * ms * MS / n))
            .last()
            .expect("at least one read")
    }

    /// Polls `pace` every 5 ms for `ms` milliseconds from `from_ms`, with
    /// `per_poll` datagrams each time: the mode after the last.
    fn poll_evenly(pace: &mut EventPace, from_ms: u64, ms: u64, per_poll: u64) -> ReadMode {
        (1..=ms / 5)
            .map(|i| pace.polled((from_ms + i * 5) * MS, per_poll))
            .last()
            .expect("at least one read")
    }

    #[test]
    fn a_few_events_a_second_are_waited_for() {
        let mut pace = waiting();
        // 10 a second for 10 s, then one after a long quiet.
        assert_eq!(wake_evenly(&mut pace, 0, 10_000, 100), ReadMode::Wait);
        assert_eq!(pace.woke(3_600_000 * MS), ReadMode::Wait);
    }

    #[test]
    fn a_short_burst_does_not_switch_to_polling() {
        let mut pace = waiting();
        // 40 wake-ups within 10 ms, then quiet: the window that closes
        // holds fewer than 500 a second.
        assert_eq!(wake_evenly(&mut pace, 0, 10, 40), ReadMode::Wait);
        assert_eq!(pace.woke(150 * MS), ReadMode::Wait);
    }

    #[test]
    fn sustained_wake_ups_switch_to_polling_after_a_window() {
        let mut pace = waiting();
        // 2000 a second: still waiting within the first window...
        assert_eq!(wake_evenly(&mut pace, 0, 90, 180), ReadMode::Wait);
        // ...polling once it closed.
        assert_eq!(wake_evenly(&mut pace, 90, 20, 40), ReadMode::Poll);
    }

    #[test]
    fn the_switch_to_polling_is_at_the_threshold() {
        // Exactly 500 a second over a window switches; just under does not.
        let mut at = waiting();
        assert_eq!(wake_evenly(&mut at, 0, 100, 50), ReadMode::Poll);
        let mut under = waiting();
        assert_eq!(wake_evenly(&mut under, 0, 100, 49), ReadMode::Wait);
    }

    #[test]
    fn polling_goes_on_while_events_keep_coming() {
        let mut pace = waiting();
        assert_eq!(wake_evenly(&mut pace, 0, 100, 100), ReadMode::Poll);
        // 2 datagrams per 5 ms poll = 400 a second: between the thresholds,
        // it stays polling (no flapping).
        assert_eq!(poll_evenly(&mut pace, 100, 1_000, 2), ReadMode::Poll);
        // An empty poll now and then does not stop it either.
        assert_eq!(pace.polled(1_105 * MS, 0), ReadMode::Poll);
        assert_eq!(poll_evenly(&mut pace, 1_105, 200, 3), ReadMode::Poll);
    }

    #[test]
    fn polling_goes_back_to_waiting_when_events_thin_out() {
        let mut pace = waiting();
        assert_eq!(wake_evenly(&mut pace, 0, 100, 100), ReadMode::Poll);
        // 1 datagram every other 5 ms poll = 100 a second: waiting again
        // once a window closed.
        let mut mode = ReadMode::Poll;
        for i in 1..=40u64 {
            mode = pace.polled((100 + i * 5) * MS, i % 2);
        }
        assert_eq!(mode, ReadMode::Wait);
        // And a new window starts: one wake-up does not switch back.
        assert_eq!(pace.woke(400 * MS), ReadMode::Wait);
    }

    #[test]
    fn a_failed_switch_to_waiting_polls_for_a_second_and_is_reported_once() {
        let mut pace = waiting();
        assert_eq!(wake_evenly(&mut pace, 0, 100, 100), ReadMode::Poll);
        assert_eq!(poll_evenly(&mut pace, 100, 100, 0), ReadMode::Wait);
        // Registering failed at 200 ms: polled again, and an idle socket is
        // not tried again every window, only after WAIT_RETRY_AFTER.
        assert!(pace.wait_failed(200 * MS), "the first failure is reported");
        assert_eq!(poll_evenly(&mut pace, 200, 995, 0), ReadMode::Poll);
        assert_eq!(pace.polled(1_200 * MS, 0), ReadMode::Wait);
        // Failing again is the same occurrence: not reported again...
        assert!(!pace.wait_failed(1_200 * MS));
        assert_eq!(poll_evenly(&mut pace, 1_200, 995, 0), ReadMode::Poll);
        assert_eq!(pace.polled(2_200 * MS, 0), ReadMode::Wait);
        // ...until waiting worked once.
        assert!(pace.wait_worked(), "the end of the failures is reported");
        assert!(!pace.wait_worked());
        assert_eq!(wake_evenly(&mut pace, 2_200, 100, 100), ReadMode::Poll);
        assert_eq!(poll_evenly(&mut pace, 2_300, 100, 0), ReadMode::Wait);
        assert!(pace.wait_failed(2_400 * MS), "a new failure is reported");
    }

    #[test]
    fn a_busy_socket_stays_polled_after_a_failed_switch() {
        let mut pace = waiting();
        assert_eq!(wake_evenly(&mut pace, 0, 100, 100), ReadMode::Poll);
        assert!(pace.wait_failed(100 * MS));
        // 400 a second after the retry time: still between the thresholds.
        assert_eq!(poll_evenly(&mut pace, 100, 2_000, 2), ReadMode::Poll);
    }

    #[test]
    fn other_rates_switch_at_their_thresholds() {
        let rates: PaceRates = "100,10".parse().unwrap();
        assert_eq!(
            rates,
            PaceRates {
                poll_from: 100,
                wait_below: 10
            }
        );
        let mut pace = EventPace::start(0, Pacing::ByLoad(rates));
        assert_eq!(pace.pacing(), Pacing::ByLoad(rates));
        // 10 wake-ups in 100 ms = 100 a second: polling.
        assert_eq!(wake_evenly(&mut pace, 0, 100, 10), ReadMode::Poll);
        // 1 datagram per 100 ms = 10 a second: polling still...
        let mut mode = ReadMode::Poll;
        for i in 1..=20u64 {
            mode = pace.polled((100 + i * 5) * MS, u64::from(i == 20));
        }
        assert_eq!(mode, ReadMode::Poll);
        // ...and a window without any: waiting.
        assert_eq!(poll_evenly(&mut pace, 200, 100, 0), ReadMode::Wait);
        assert_eq!(PaceRates::default(), "500,200".parse().unwrap());
        for bad in ["", "500", "500,", "200,500", "10,0", "a,b", "1,1,1"] {
            assert!(bad.parse::<PaceRates>().is_err(), "{bad}");
        }
        assert_eq!(
            EventPace::start(0, Pacing::AlwaysPolling).pacing(),
            Pacing::AlwaysPolling
        );
    }

    #[test]
    fn always_polling_stays_polling_without_events() {
        let mut pace = EventPace::start(0, Pacing::AlwaysPolling);
        assert_eq!(poll_evenly(&mut pace, 0, 1_000, 0), ReadMode::Poll);
    }

    #[test]
    fn a_stalled_daemon_counts_the_time_it_was_away() {
        // A window that closes late (the daemon was busy) counts the rate
        // over the whole time: 55 wake-ups in its first 90 ms and one at
        // 1 s are 56 a second, waiting (over the window's nominal length
        // they would be 560 a second, polling).
        let mut pace = waiting();
        assert_eq!(wake_evenly(&mut pace, 0, 90, 55), ReadMode::Wait);
        assert_eq!(pace.woke(1_000 * MS), ReadMode::Wait);
    }
}
