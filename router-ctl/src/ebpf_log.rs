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

use std::os::fd::AsRawFd as _;

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

/// One program's log being read.
struct Open {
    prog_id: u32,
    logs: AsyncFd<EbpfLogger<&'static dyn log::Log>>,
    level: LogLevelMap,
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
        let logs = self.logs.get_mut();
        logs.flush();
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
}

impl DataPathLog {
    /// Opens the log of the program attached in `ctx`'s namespace if the
    /// log filter wants lines of [`TARGET`]; else an idle reader that
    /// leaves the program's log off.
    #[must_use]
    pub fn start(ctx: &Ctx) -> Self {
        let mut me = Self {
            level: wanted_level(),
            open: None,
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
            o.logs.get_mut().flush();
        }
    }
}
