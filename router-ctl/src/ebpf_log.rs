//! The data path's debug log, read by `router-ctl run`: the lines the XDP
//! program writes with aya-log (a flow admitted, ports exhausted, a
//! malformed packet dropped, an ICMP error translated) go through the `log`
//! bridge to the daemon's tracing subscriber, under the target
//! `router_ebpf` (`RUST_LOG=router_ebpf=debug router-ctl run`).
//!
//! The program writes nothing unless its `LOG_LEVEL` map says so: this
//! reader sets it to the level its filter wants for `router_ebpf` when it
//! opens the program's log and back to 0 when it lets go (on stop, or when
//! the attached program changed), so an attach without a daemon, or a
//! daemon that does not want the lines, never fills a ring buffer nobody
//! drains. The log map and the level map belong to one loaded program (they
//! are not pinned): after a replace the reader follows the new program
//! ([`DataPathLog::follow`]).
//!
//! aya-log (0.3) unwraps its parse of each record in `EbpfLogger::flush`:
//! a malformed record (an object whose log layout this aya-log does not
//! know) would panic the daemon. Its parser is private, so the reader
//! catches that panic instead ([`flush_past_bad_records`]): the bad record
//! is consumed all the same (the ring buffer item is released as the panic
//! unwinds), counted and reported, and reading goes on with the next one.
//! Such a panic is an expected, counted event, not a crash: the panic hook
//! stays quiet for it ([`quiet_flush_panics`]), the daemon's warning says
//! it (with the first one's message and location); every other panic, also
//! one in the daemon's own log sink during a flush, is reported as before.

use std::{
    cell::{Cell, RefCell},
    os::fd::AsRawFd as _,
    panic::{self, AssertUnwindSafe, catch_unwind},
    sync::Once,
};

use anyhow::{Context, Result};
use aya::{
    maps::{Array, Map, MapData, MapInfo},
    programs::loaded_programs,
};
use aya_log::EbpfLogger;
use router_common::maps::LOG_LEVEL_MAP;
use tokio::io::{Interest, unix::AsyncFd};

use crate::{ctx::Ctx, inspect::inspect};

/// The `LOG_LEVEL` map of one loaded program.
type LogLevelMap = Array<MapData, u32>;

/// The highest level the daemon's log filter wants for the data path's
/// target `router_ebpf` (the target its lines carry), in aya-log's
/// numbering (error 1 .. trace 5), 0 for none.
#[must_use]
pub fn wanted_level() -> u32 {
    use tracing::Level;
    // `enabled!` takes its target as a literal; aya-log's levels go from
    // error (1) to trace (5).
    let wanted = [
        tracing::enabled!(target: "router_ebpf", Level::ERROR),
        tracing::enabled!(target: "router_ebpf", Level::WARN),
        tracing::enabled!(target: "router_ebpf", Level::INFO),
        tracing::enabled!(target: "router_ebpf", Level::DEBUG),
        tracing::enabled!(target: "router_ebpf", Level::TRACE),
    ];
    wanted.iter().take_while(|on| **on).count() as u32
}

// `flush_past_bad_records` catches aya-log's panic on a malformed record;
// built with `panic = "abort"` that panic would end the daemon instead.
#[cfg(not(panic = "unwind"))]
compile_error!(
    "router-ctl must be built with panic = \"unwind\": the data path log reader catches \
     aya-log's panic on a malformed record (ebpf_log.rs)"
);

/// The most malformed records one drain skips: each is consumed as it is
/// skipped, so this only bounds a drain racing a program that writes
/// nothing else; the rest wait for the next drain.
const BAD_RECORDS_PER_DRAIN: u64 = 1024;

thread_local! {
    /// Set on the thread running [`flush_past_bad_records`] while it runs.
    static IN_LOG_FLUSH: Cell<bool> = const { Cell::new(false) };
    /// The panics the hook kept quiet during the current flush.
    static FLUSH_QUIETED: RefCell<Quieted> = const { RefCell::new(Quieted::NONE) };
}

/// The panics raised in aya-log during one flush: how many, and the first
/// one's message and location (for the daemon's warning: what the hook
/// did not print).
#[derive(Debug, PartialEq, Eq)]
struct Quieted {
    count: u64,
    first: Option<String>,
}

impl Quieted {
    const NONE: Self = Self {
        count: 0,
        first: None,
    };
}

/// Whether a panic at source `file` (a panic's `Location::file()`) was
/// raised in aya-log: its record parser's `unwrap`s, whose panics mean a
/// record this aya-log cannot parse. A crate's sources sit under a
/// directory named after it (`.../aya-log-0.3.0/src/lib.rs`, or
/// `.../aya-log/src/lib.rs` from git); `aya_log` covers a renamed path.
fn raised_in_aya_log(file: &str) -> bool {
    file.contains("aya-log") || file.contains("aya_log")
}

/// Installs, once per process, a panic hook in front of the one before it
/// (the default prints the message and location on stderr): it stays
/// quiet for a panic raised in aya-log inside [`flush_past_bad_records`],
/// which catches and counts it, keeping the first one's message for the
/// warning, and hands every other panic on (one in the daemon's own log
/// sink during a flush too). Without it each malformed record would print
/// aya-log's `unwrap` message on the daemon's stderr (a journal full of
/// "panicked at" lines for a daemon that runs on).
fn quiet_flush_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let location = info.location();
            let quiet = IN_LOG_FLUSH.with(Cell::get)
                && location.is_some_and(|l| raised_in_aya_log(l.file()));
            if !quiet {
                previous(info);
                return;
            }
            FLUSH_QUIETED.with_borrow_mut(|q| {
                q.count += 1;
                if q.first.is_none() {
                    let message = info
                        .payload_as_str()
                        .unwrap_or("(a panic without a message)");
                    q.first = Some(match location {
                        Some(l) => format!("{message} at {l}"),
                        None => message.to_owned(),
                    });
                }
            });
        }));
    });
}

/// Clears [`IN_LOG_FLUSH`] when the flush is over, however it ends.
struct InLogFlush;

impl InLogFlush {
    fn enter() -> Self {
        IN_LOG_FLUSH.with(|f| f.set(true));
        FLUSH_QUIETED.set(Quieted::NONE);
        Self
    }
}

impl Drop for InLogFlush {
    fn drop(&mut self) {
        IN_LOG_FLUSH.with(|f| f.set(false));
    }
}

/// The records one drain skipped.
#[derive(Debug, PartialEq, Eq)]
struct Skipped {
    /// Records whose flush panicked, for any cause.
    records: u64,
    /// Of those, the panics raised in aya-log (malformed records, kept
    /// quiet), and the first one's message and location.
    malformed: Quieted,
}

/// Runs `flush` (aya-log's `EbpfLogger::flush`, which panics on a record it
/// cannot parse, having consumed it) until it returns, at most
/// [`BAD_RECORDS_PER_DRAIN`] times over; returns how many times it
/// panicked: the records skipped. The panics raised in aya-log print
/// nothing ([`quiet_flush_panics`]); the caller reports them.
fn flush_past_bad_records(mut flush: impl FnMut()) -> Skipped {
    quiet_flush_panics();
    let quiet = InLogFlush::enter();
    let mut records = 0;
    // The logger stays consistent across the panic: the ring buffer's
    // consumer position advances as the record's item is dropped.
    while records < BAD_RECORDS_PER_DRAIN && catch_unwind(AssertUnwindSafe(&mut flush)).is_err() {
        records += 1;
    }
    drop(quiet);
    Skipped {
        records,
        malformed: FLUSH_QUIETED.replace(Quieted::NONE),
    }
}

/// One program's log being read.
struct Open {
    prog_id: u32,
    logs: AsyncFd<EbpfLogger<&'static dyn log::Log>>,
    level: LogLevelMap,
}

impl Open {
    /// Writes every line waiting in the ring buffer to the log; a record
    /// aya-log cannot parse is skipped, counted and reported; returns how
    /// many were.
    fn drain(&mut self) -> u64 {
        let logs = self.logs.get_mut();
        let skipped = flush_past_bad_records(|| logs.flush());
        let Quieted { count: bad, first } = skipped.malformed;
        if let Some(first) = first {
            tracing::warn!(
                "skipped {bad} malformed data path log record(s) of program {} (the daemon \
                 status counts them all; aya-log's first panic: {first}): the attached \
                 object's log format is not the one this router-ctl's aya-log reads; attach \
                 this router-ctl's object",
                self.prog_id
            );
        }
        let other = skipped.records - bad;
        if other > 0 {
            tracing::warn!(
                "skipped {other} data path log record(s) of program {}: writing them to the \
                 log panicked outside aya-log (the panic is printed above)",
                self.prog_id
            );
        }
        bad
    }
}

impl Open {
    /// Opens the log of program `prog_id` and turns it on at `level`.
    /// Must run inside the tokio runtime (the ring buffer registers with it).
    fn new(prog_id: u32, level: u32) -> Result<Self> {
        let logger = EbpfLogger::init_from_id(prog_id)
            .with_context(|| format!("opening the debug log (AYA_LOGS) of program {prog_id}"))?;
        // SAFETY: the logger owns its ring buffer's fd and never changes or
        // closes it before it is dropped, which the AsyncFd does.
        let logs = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) }
            .context("registering the debug log's ring buffer")?;
        let mut level_map = level_map(prog_id)?;
        level_map
            .set(0, level, 0)
            .context("turning the data path's debug log on")?;
        Ok(Self {
            prog_id,
            logs,
            level: level_map,
        })
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        // Nobody reads any more: the program stops writing. A program
        // already unloaded (replaced, detached) has nothing to turn off.
        let _ = self.level.set(0, 0, 0);
        // The lines written since the last drain; `DataPathLog::follow`
        // drains (and counts) before it lets go of a program.
        let _ = self.drain();
    }
}

/// The `LOG_LEVEL` map of the loaded program `prog_id`.
fn level_map(prog_id: u32) -> Result<LogLevelMap> {
    let prog = loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == prog_id)
        .with_context(|| format!("program {prog_id} is not loaded"))?;
    let id = prog
        .map_ids()
        .context("listing the program's maps")?
        .unwrap_or_default()
        .into_iter()
        .find(|id| MapInfo::from_id(*id).is_ok_and(|m| m.name_as_str() == Some(LOG_LEVEL_MAP)))
        .with_context(|| {
            format!(
                "program {prog_id} has no {LOG_LEVEL_MAP} map (an object built before the \
                 debug log: attach this router-ctl's object to get it)"
            )
        })?;
    let map = MapData::from_id(id).context("opening the log level map")?;
    Ok(LogLevelMap::try_from(Map::Array(map))?)
}

/// The data path's debug log while the daemon wants it: open on the
/// attached program, or not (not wanted, or the program has none).
pub struct DataPathLog {
    level: u32,
    open: Option<Open>,
    /// Malformed records skipped, of every program read so far.
    malformed: u64,
}

impl DataPathLog {
    /// Opens the log of the program attached in `ctx`'s namespace if the
    /// log filter wants lines of the data path's target (`router_ebpf`);
    /// else an idle reader that leaves the program's log off.
    #[must_use]
    pub fn start(ctx: &Ctx) -> Self {
        let mut me = Self {
            level: wanted_level(),
            open: None,
            malformed: 0,
        };
        me.follow(ctx);
        me
    }

    /// Whether a program's log is being read.
    #[must_use]
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Reopens on the attached program when it changed (a replace, a
    /// detach and attach); cheap when it did not.
    pub fn follow(&mut self, ctx: &Ctx) {
        if self.level == 0 {
            return;
        }
        let attached = inspect(&ctx.pin_dir).prog_ids().first().copied();
        if attached == self.open.as_ref().map(|o| o.prog_id) {
            return;
        }
        // Drain and turn off the old one first.
        self.drain();
        self.open = None;
        let Some(prog_id) = attached else {
            return;
        };
        match Open::new(prog_id, self.level) {
            Ok(o) => {
                tracing::info!(
                    "reading the data path's debug log of program {prog_id} (fd {})",
                    o.logs.get_ref().as_raw_fd()
                );
                self.open = Some(o);
            }
            Err(e) => tracing::warn!("the data path's debug log stays off: {e:#}"),
        }
    }

    /// Waits until the program wrote log lines (forever when not open).
    pub async fn readable(&self) {
        match &self.open {
            Some(o) => {
                if let Ok(mut guard) = o.logs.readable().await {
                    // Edge-triggered: the lines are read right after by
                    // [`Self::drain`], and a line written later wakes again.
                    guard.clear_ready();
                }
            }
            None => std::future::pending().await,
        }
    }

    /// Writes every line waiting in the ring buffer to the log.
    pub fn drain(&mut self) {
        if let Some(o) = &mut self.open {
            self.malformed += o.drain();
        }
    }

    /// The malformed records skipped so far (records this router-ctl's
    /// aya-log cannot parse: the attached object's log layout differs).
    #[must_use]
    pub fn malformed_records(&self) -> u64 {
        self.malformed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A closure that panics in a file under an `aya-log` directory, as
    /// aya-log's parser does.
    fn aya_log_panic() -> impl Fn() {
        include!("testdata/aya-log/raise.rs")
    }

    #[test]
    fn a_malformed_record_is_counted_not_a_panic() {
        // A flush that meets two bad records (each consumed by its panic)
        // before the ring buffer is empty.
        let mut records = vec![true, false, true, false, true];
        let mut logged = 0;
        let raise = aya_log_panic();
        let skipped = flush_past_bad_records(|| {
            while !records.is_empty() {
                if !records.remove(0) {
                    raise();
                }
                logged += 1;
            }
        });
        assert_eq!(
            (skipped.records, skipped.malformed.count, logged),
            (2, 2, 3)
        );
        let first = skipped.malformed.first.expect("the first panic's message");
        assert!(
            first.starts_with("a record aya-log cannot parse (expected in this test) at ")
                && first.contains("testdata/aya-log/raise.rs:"),
            "{first}"
        );
        let nothing = flush_past_bad_records(|| {});
        assert_eq!((nothing.records, nothing.malformed), (0, Quieted::NONE));
        // A flush that never stops panicking is given up on.
        assert_eq!(
            flush_past_bad_records(aya_log_panic()).records,
            BAD_RECORDS_PER_DRAIN
        );
    }

    #[test]
    fn only_the_panics_of_aya_log_in_a_log_flush_are_kept_quiet() {
        // What the hook kept quiet since the last flush ended (each flush
        // takes its own count and leaves none behind).
        let quieted_since = || FLUSH_QUIETED.with_borrow(|q| q.count);
        let skipped = flush_past_bad_records(aya_log_panic());
        assert_eq!(skipped.malformed.count, BAD_RECORDS_PER_DRAIN);
        assert_eq!(quieted_since(), 0);
        // A panic in the flush outside aya-log (the daemon's log sink) is
        // skipped too, but reaches the hook before ours (here the test
        // harness's, which prints it) and is not counted as malformed.
        let mut calls = 0;
        let skipped = flush_past_bad_records(|| {
            calls += 1;
            assert!(
                calls > 1,
                "a log sink's bug, in a flush (expected in this test)"
            );
        });
        assert_eq!((skipped.records, skipped.malformed), (1, Quieted::NONE));
        assert_eq!(quieted_since(), 0);
        // Nor is any panic on this thread after the flush.
        let other = catch_unwind(aya_log_panic());
        assert!(other.is_err());
        assert_eq!(quieted_since(), 0);
    }

    #[test]
    fn aya_logs_sources_are_told_from_others() {
        for file in [
            "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/aya-log-0.3.0/src/lib.rs",
            "/root/.cargo/git/checkouts/aya-c55fbc69175ac116/2a3f4c1/aya-log/src/lib.rs",
            "/build/vendor/aya_log/src/lib.rs",
        ] {
            assert!(raised_in_aya_log(file), "{file}");
        }
        for file in [
            "router-ctl/src/ebpf_log.rs",
            "/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/tracing-log-0.2.0/src/lib.rs",
        ] {
            assert!(!raised_in_aya_log(file), "{file}");
        }
    }
}
