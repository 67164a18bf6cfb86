//! `router-ctl run`: the controller daemon. In offload mode it follows the
//! kernel's conntrack over ctnetlink (a dump at start and after lost events,
//! then NEW / UPDATE / DESTROY events) and keeps the XDP table in step
//! through [`Offloader`]; every tick it refreshes active flows and writes
//! its health and counters to a status file that `status`, `stats` and
//! `metrics` read. In both modes it follows the attached interfaces over
//! rtnetlink: a new MAC address goes into the data path's configuration
//! (which passes frames not addressed to it to the kernel), a deleted
//! interface is reported; and it has the kernel re-validate the STALE
//! neighbour entries of the next hops the fast path uses
//! ([`neighbours`]). Foreground; stops on SIGINT or SIGTERM.
//! Offloaded flows outlive it until their lease runs out, then the kernel
//! carries them.

use std::{
    collections::HashMap,
    io,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use anyhow::{Context, Result};
use router_common::maps::{Admit, Config, FlowEntry, FlowEntry6};
use tokio::{
    io::{
        Interest,
        unix::{AsyncFd, AsyncFdRegisterError},
    },
    signal::unix::{SignalKind, signal},
};

use crate::{
    apply,
    clock::monotonic_ns,
    conntrack,
    ctnetlink::{CtSocket, Event, event_needed, parse_events},
    ctx::Ctx,
    ebpf_log::DataPathLog,
    event_pace::{EventPace, POLL_EVERY, PaceRates, Pacing, ReadMode, WAIT_RETRY_AFTER},
    live::{DaemonView, Live},
    maps::{self},
    nlmsg::Datagrams,
    offload::{self, Kernel as _, KernelTimeouts, OffloadStats, Offloader},
    service,
    signals::SignalsBlocked,
    state, web,
};

mod egress_witness;
use egress_witness::Witness;
mod follow;
mod kernel_io;
mod neighbours;
mod status_file;

use follow::{LinkWatch, LookedAt, look_again};
use kernel_io::{IpsecSeen, NetlinkKernel, PinnedTable};
use status_file::unix_now;
pub use status_file::{
    DaemonStatus, add_stopped, health_json, health_line, status_path, without_daemon,
};

/// Receive buffer of the event socket: room for bursts of events between
/// two wake-ups or polls (overflow is detected and followed by a resync).
const EVENT_RCVBUF: usize = 8 << 20;
/// Event datagrams read per syscall: a 5 ms poll under ~25,000 events a
/// second takes one or two reads.
const EVENT_BATCH: usize = 128;
/// Room for one event datagram: a conntrack event message is well under
/// 1 KiB (tuples, status, timeout, counters, labels); a longer one would
/// be cut short, counted as lost events and followed by a resync.
const EVENT_DATAGRAM_MAX: usize = 8 << 10;
/// Between two looks at the TCP connections settling before their
/// offload ([`crate::offload::TCP_SETTLE_NS`]), while there are any: a
/// settled connection waits at most this much longer.
const SETTLE_EVERY: Duration = Duration::from_millis(50);
/// Between two samples of the counters for the status page's chart.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

type Daemon = Offloader<PinnedTable, NetlinkKernel>;

fn resync(off: &mut Daemon) -> Result<()> {
    off.resync_from_kernel(monotonic_ns())
        .context("dumping the kernel's conntrack table (ctnetlink)")
}

/// [`resync`], and when it fails, says that it is tried again at the next
/// tick (which [`tick`] does while it is owed).
fn resync_or_retry(off: &mut Daemon, why: &str) {
    if let Err(e) = resync(off) {
        // Said once for a run of failures, then at debug level.
        if off.resync_failed_in_row() == 1 {
            tracing::warn!("resynchronising after {why}: {e:#}; trying again later");
        } else {
            tracing::debug!("resynchronising after {why}: {e:#}; trying again later");
        }
    }
}

/// Removes the XDP entries an earlier session left behind: pending ones
/// (a daemon killed between writing a pair and activating it) and those
/// of connections the kernel's `dump` does not have (ended by `conntrack
/// -D` or `-F` while no daemon ran). Runs after the session's first
/// resync of `dump` ([`Offloader::sweep_left_behind`]). Returns the
/// pending entries removed.
fn sweep_left_behind(off: &mut Daemon, dump: &[crate::ctnetlink::Conn]) -> Result<u64> {
    use router_common::maps::FLAG_OFFLOADED;
    let offloaded = |e: &FlowEntry| e.flags & FLAG_OFFLOADED != 0;
    let offloaded6 = |e: &FlowEntry6| e.flags & FLAG_OFFLOADED != 0;
    let t = &off.table;
    let v4 = maps::snapshot_where(&t.v4, maps::capacity(&t.v4)?, offloaded)
        .context("reading CONNTRACK for entries an earlier daemon left")?;
    let v6 = match &t.v6 {
        Some(m) => maps::snapshot_where(m, maps::capacity(m)?, offloaded6)
            .context("reading CONNTRACK6 for entries an earlier daemon left")?,
        None => Vec::new(),
    };
    let swept = off.sweep_left_behind(&v4, &v6, dump);
    if swept.pending > 0 {
        tracing::info!(
            "removed {} XDP entries left pending by an earlier daemon (killed between writing \
             a connection's entries and activating them); the kernel carried their packets \
             meanwhile",
            swept.pending
        );
    }
    if swept.ended > 0 {
        tracing::info!(
            "removed {} XDP entries offloaded before this session (by an earlier daemon, or \
             this one before a detach and new attach) of connections the kernel no longer has \
             (ended while nothing followed them, by `conntrack -D` or `-F` or their timeout): \
             their packets now meet the firewall",
            swept.ended
        );
    }
    if swept == offload::Swept::default() {
        tracing::debug!("no XDP entries left behind by an earlier daemon");
    }
    Ok(swept.pending)
}

fn apply_events(off: &mut Daemon, events: impl IntoIterator<Item = Event>) {
    let now = monotonic_ns();
    for e in events {
        match e {
            // What the kernel's filter lets through (the same test, should
            // the socket have no filter).
            Event::New(c) | Event::Update(c) | Event::Destroy(c) if !event_needed(&c) => {}
            Event::New(c) | Event::Update(c) => off.conn(&c, now),
            Event::Destroy(c) => off.destroy(&c),
        }
    }
    // The settle timer gets no turn while events keep arriving (the drain
    // reads until the queue is empty, which under a burst it rarely is):
    // connections due are offloaded here too.
    off.settle(now);
}

/// What `run` is asked to do.
#[derive(Debug)]
pub struct RunOptions {
    /// Between refreshes of active flows (and watchdog pings).
    pub tick: Duration,
    /// Applied at start and again on SIGHUP, as `apply FILE` does.
    pub config: Option<PathBuf>,
    /// The status page's and metrics' listener, bound by the caller in its
    /// own namespace ([`web::bind`]).
    pub listener: Option<std::net::TcpListener>,
    /// Conntrack events always polled, never waited for (tests).
    pub poll_events: bool,
    /// The rates that switch between waiting for and polling conntrack
    /// events (tests set others to cross both switches).
    pub event_pace_rates: PaceRates,
    /// What the offloader reads of a connection's ct mark.
    pub marks: MarkOptions,
}

/// What the offloader reads of a connection's ct mark (`run` options).
#[derive(Clone, Copy, Debug)]
pub struct MarkOptions {
    /// Connections with this ct mark `(value, mask)` stay in the kernel.
    pub keep_in_kernel: Option<(u32, u32)>,
    /// The bits of the ct mark the packets are routed with.
    pub route_mask: u32,
    /// Whether the command line named either (standalone mode reads
    /// neither: said at the start).
    pub given: bool,
}

impl RunOptions {
    /// How the conntrack event socket is read.
    fn pacing(&self) -> Pacing {
        if self.poll_events {
            Pacing::AlwaysPolling
        } else {
            Pacing::ByLoad(self.event_pace_rates)
        }
    }
}

/// The part of the daemon that depends on the router's mode: the offloader
/// over the pinned table, and in offload mode the event subscription.
/// Built again when a reload switches the mode.
struct Session {
    off: Daemon,
    events: Option<EventSocket>,
    /// Whether `events` is waited for or polled, from its recent load.
    event_pace: EventPace,
    kernel_mode: bool,
    /// XDP entries a killed daemon had left pending, removed at the start.
    stale_pending_removed: u64,
    /// The attach whose maps it works on.
    attached: AttachedRouter,
    /// The `ct_entries_flushed` counter when last looked at: a `conntrack
    /// flush` since then took offloaded flows off the fast path, and a
    /// resync puts them back. (Not after evictions: under table pressure a
    /// resync would only evict others.)
    flushed_seen: Option<u64>,
    /// The next hops the data path uses, kept valid in the kernel.
    neighbours: neighbours::NeighbourUse,
}

impl Session {
    /// Reads the attached router's configuration, subscribes to conntrack
    /// events (offload mode) and loads the kernel's table. Must run inside
    /// the runtime (the event socket registers with it). Its offload
    /// counters go on from `carried` (a re-opened session's).
    fn open(ctx: &Ctx, carried: &OffloadStats, pacing: Pacing, marks: MarkOptions) -> Result<Self> {
        let maps = ctx.maps();
        // The map ids are read before the configuration: an attach
        // meanwhile gives new ids, which the next tick follows.
        let (attached, cfg) = AttachedRouter::pinned(ctx)?.context(
            "no attached router to follow (detached, or an attach under way); run \
             `router-ctl attach LAN WAN` first",
        )?;
        let kernel_mode = attached.kernel_mode;
        let table = PinnedTable::open(&maps, kernel_mode)?;
        let kernel = NetlinkKernel {
            ct: CtSocket::requests().context("opening a ctnetlink socket")?,
            routes: HashMap::new(),
            addrs: None,
            policy: None,
            ipsec: IpsecSeen::default(),
            witness: if kernel_mode {
                Witness::Wanted([cfg.lan_ifindex, cfg.wan_ifindex])
            } else {
                Witness::Off
            },
            neighbours: None,
        };
        let mut off = Offloader::new(
            table,
            kernel,
            cfg.lan_ifindex,
            cfg.wan_ifindex,
            KernelTimeouts::read(),
        );
        off.stats.clone_from(carried);
        off.keep_in_kernel_mark = marks.keep_in_kernel;
        off.route_mark_mask = marks.route_mask;
        let mut stale_pending_removed = 0;
        // Subscribe before the dump, so no event falls between the two.
        let events = if kernel_mode {
            // The egress witness from the start: every UDP and ICMP
            // connection's offload asks it whether one of its replies was
            // forwarded, and one attached only then has missed that reply.
            let _ = off.kernel.has_witness();
            // Without the echoes of the daemon's own writes (refreshes,
            // status bits): they tell it nothing, and by the thousand they
            // overflowed the socket.
            let own_port = off
                .kernel
                .ct
                .port()
                .context("reading the ctnetlink socket's port")?;
            let s = CtSocket::events(EVENT_RCVBUF, own_port)
                .context("subscribing to conntrack events (ctnetlink)")?;
            // The dump read here, not by `resync`: the sweep asks it which
            // connections the kernel has.
            let dump = off
                .kernel
                .dump()
                .context("dumping the kernel's conntrack table (ctnetlink)")?;
            off.resync(&dump, monotonic_ns());
            stale_pending_removed = sweep_left_behind(&mut off, &dump)?;
            Some(EventSocket::Waited(
                EventSocket::register(s)
                    .map_err(|e| io::Error::other(e.to_string()))
                    .context("registering the event socket")?,
            ))
        } else {
            tracing::info!(
                "standalone mode (attach --admit xdp): the data path admits flows itself; the \
                 daemon follows the interfaces, their addresses and the next hops the fast path \
                 alone uses"
            );
            None
        };
        let mut session = Self {
            off,
            events,
            event_pace: EventPace::start(monotonic_ns(), pacing),
            kernel_mode,
            stale_pending_removed,
            attached,
            // Read with the table loaded: a flush from now on is followed.
            flushed_seen: conntrack::flushed(&maps).ok(),
            neighbours: neighbours::NeighbourUse::open(&maps),
        };
        if pacing == Pacing::AlwaysPolling {
            session.read_events_by(ReadMode::Poll);
        }
        Ok(session)
    }

    fn admit(&self) -> &'static str {
        if self.kernel_mode { "kernel" } else { "xdp" }
    }

    /// Whether the event socket is read on the poll timer now.
    fn events_polled(&self) -> bool {
        matches!(self.events, Some(EventSocket::Polled(_)))
    }

    /// After a read of the event socket, when it woke the daemon (`polled`
    /// None) or on the poll timer (the datagrams it read): reads it the way
    /// its recent load says from now on. True when it just became polled
    /// (the caller starts the poll timer).
    fn pace_events(&mut self, polled: Option<u64>) -> bool {
        let now = monotonic_ns();
        let mode = match polled {
            None => self.event_pace.woke(now),
            Some(datagrams) => self.event_pace.polled(now, datagrams),
        };
        let was_polled = self.events_polled();
        self.read_events_by(mode);
        if was_polled && !self.events_polled() {
            self.off.stats.event_waits_again += 1;
        }
        !was_polled && self.events_polled()
    }

    /// Reads the event socket the way `mode` says from now on. Should
    /// registering it for waiting fail, it is polled again and waiting is
    /// tried again later ([`EventPace::wait_failed`]), with one warning per
    /// run of failures.
    fn read_events_by(&mut self, mode: ReadMode) {
        let Some(events) = self.events.take() else {
            return;
        };
        self.events = Some(match events.read_by(mode) {
            Ok(events) => {
                if events.waited().is_some() && self.event_pace.wait_worked() {
                    tracing::info!("the conntrack event socket is waited for again");
                }
                events
            }
            Err((s, e)) => {
                let retry = WAIT_RETRY_AFTER;
                if self.event_pace.wait_failed(monotonic_ns()) {
                    tracing::warn!(
                        "registering the conntrack event socket again: {e}; it stays read \
                         every {POLL_EVERY:?}, and waiting for it is tried again after \
                         {retry:?} (no further warning until that works)"
                    );
                } else {
                    tracing::debug!("registering the conntrack event socket again: {e}");
                }
                EventSocket::Polled(s)
            }
        });
    }
}

/// The conntrack event subscription, waited for or polled
/// ([`crate::event_pace`]).
enum EventSocket {
    /// In the runtime's epoll set: each datagram wakes the daemon.
    Waited(AsyncFd<CtSocket>),
    /// Out of the epoll set (an edge-triggered registration would wake the
    /// runtime, and the sender's softirq would wake it, for every datagram
    /// even with no task waiting): read on the poll timer.
    Polled(CtSocket),
}

/// What wakes the daemon for its waited event socket: a datagram queued,
/// or an error pending with none queued (`ENOBUFS`, events lost: kept by a
/// poll that ended its batch early, or met by a broadcast that could not
/// even queue its datagram). epoll reports the error as `EPOLLERR` alone,
/// netlink sets `EPOLLIN` only for a non-empty queue, and tokio's
/// `readable()` does not wake for an error: the daemon would learn of the
/// loss only at the next event, on a quiet router a long time later.
const EVENTS_READY: Interest = Interest::READABLE.add(Interest::ERROR);

impl EventSocket {
    /// `s` in the runtime's epoll set, for [`EVENTS_READY`].
    fn register(s: CtSocket) -> Result<AsyncFd<CtSocket>, AsyncFdRegisterError<CtSocket>> {
        // SAFETY: CtSocket owns its fd and never changes or closes it
        // before it is dropped, which the AsyncFd does (or hands it back
        // first: `into_inner` deregisters it).
        unsafe { AsyncFd::register_with_interest(s, EVENTS_READY) }
    }

    fn socket(&self) -> &CtSocket {
        match self {
            Self::Waited(fd) => fd.get_ref(),
            Self::Polled(s) => s,
        }
    }

    fn waited(&self) -> Option<&AsyncFd<CtSocket>> {
        match self {
            Self::Waited(fd) => Some(fd),
            Self::Polled(_) => None,
        }
    }

    /// The same socket, read the way `mode` says. Registering it again
    /// reports at once what is already there (epoll looks at the socket
    /// when it is added): queued datagrams, and an error kept from the last
    /// poll ([`EVENTS_READY`]), so neither waits for the next datagram.
    /// Should the registration fail, the socket comes back with the error,
    /// to be polled: slower to react, nothing lost.
    fn read_by(self, mode: ReadMode) -> Result<Self, (CtSocket, io::Error)> {
        match (self, mode) {
            (Self::Waited(fd), ReadMode::Poll) => Ok(Self::Polled(fd.into_inner())),
            (Self::Polled(s), ReadMode::Wait) => Self::register(s)
                .map(Self::Waited)
                .map_err(AsyncFdRegisterError::into_parts),
            (same, _) => Ok(same),
        }
    }
}

/// Runs the daemon until SIGINT or SIGTERM. The caller has entered the
/// router's namespace on this (the only) thread; the runtime stays on it.
pub fn run(ctx: &Ctx, opts: RunOptions) -> Result<()> {
    // Held until it returns; before anything, so a second daemon changes
    // nothing of the first's (not even its status file).
    let _one_daemon = state::daemon_lock(ctx.ns())?;
    // SIGHUP, SIGTERM and SIGINT held off until `serve` handles them: a
    // reload asked for (or a stop) during the start-up apply is then done
    // once the daemon runs, rather than ending it (SIGHUP's default).
    let early = SignalsBlocked::new();
    if let Some(l) = &opts.listener {
        web::announce(l);
    }
    if let Some(path) = &opts.config
        && let Err(e) = apply::apply(ctx, path, false)
    {
        // The daemon ends with the apply's error (and its exit status): a
        // signal that came meanwhile must not end it first, unsaid.
        for sig in crate::signals::HELD {
            // SAFETY: setting a disposition; SIG_IGN discards the pending one.
            unsafe { libc::signal(sig, libc::SIG_IGN) };
        }
        drop(early);
        return Err(e.context(format!("applying {} at start", path.display())));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let res = rt.block_on(serve(ctx, opts, early));
    remove_status_files(ctx);
    res
}

/// Removes the daemon's status file and the temporary file its writes go
/// through ([`state::write_private`]).
pub fn remove_status_files(ctx: &Ctx) {
    let path = status_path(ctx.ns());
    let _ = std::fs::remove_file(state::tmp_path(&path));
    let _ = std::fs::remove_file(path);
}

fn write_status(ctx: &Ctx, status: &mut DaemonStatus, s: &Session) -> Result<()> {
    status.heartbeat_unix = unix_now();
    status.admit = s.admit().into();
    status.offloaded_flows = s.off.len() as u64;
    status.settling_flows = s.off.settling() as u64;
    status.waiting_for_witness = s.off.waiting_for_witness() as u64;
    status.offload.clone_from(&s.off.stats);
    status.stale_pending_removed = s.stale_pending_removed;
    status.egress_witness = s.off.kernel.witness.describe();
    let data = serde_json::to_vec_pretty(status)?;
    state::write_private(&status_path(ctx.ns()), &data)
}

/// What the status page shows about the daemon.
fn daemon_view(status: &DaemonStatus, s: &Session) -> DaemonView {
    DaemonView {
        pid: status.pid,
        started_unix: status.started_unix,
        admit: s.admit(),
        offloaded_flows: s.off.len() as u64,
        offload: serde_json::to_value(&s.off.stats).unwrap_or_default(),
        mac_changes_followed: status.mac_changes_followed,
        wan_addr_changes_followed: status.wan_addr_changes_followed,
        standalone_repairs: status.standalone_repairs,
        interfaces_gone: status.interfaces_gone.clone(),
        stale_pending_removed: s.stale_pending_removed,
        reattaches_followed: status.reattaches_followed,
        detached: status.detached,
        log_records_malformed: status.log_records_malformed,
        shaping_skipped: status.shaping_skipped.clone(),
        forward_rules_bypassed: status.forward_rules_bypassed.clone(),
    }
}

/// The status line systemd shows.
fn status_line(s: &Session) -> String {
    if s.kernel_mode {
        format!("kernel mode, {} flows offloaded", s.off.len())
    } else {
        "xdp mode (standalone), following the WAN address, MACs and VRRP".to_owned()
    }
}

/// Seconds a reload may keep the daemon's loop busy: the apply lock's 5 s
/// and the router lock's 10 s, and the replace.
const RELOAD_BUSY_SECS: u64 = 30;

/// Says in the status file, before a reload, that the loop may go without
/// a heartbeat while it runs (its lock waits and replace run on it), so
/// `status` does not call the daemon dead meanwhile.
fn say_busy_reloading(ctx: &Ctx, status: &mut DaemonStatus, session: &Session) {
    status.busy_until_unix = unix_now() + RELOAD_BUSY_SECS;
    if let Err(e) = write_status(ctx, status, session) {
        tracing::warn!("writing the status before a reload: {e:#}");
    }
}

/// SIGHUP: the file applied again with `apply`'s validation and no-op
/// semantics. An error leaves the router as it was (apply validates the
/// whole file before it changes anything) and the daemon running. A mode
/// the file changed is followed by [`follow_attach`] right after.
fn reload(ctx: &Ctx, config: Option<&Path>) {
    let Some(path) = config else {
        tracing::warn!("SIGHUP: started without --config, nothing to reload");
        return;
    };
    service::reloading();
    // Not the command's 30 s: the event loop waits with it.
    match apply::apply_waiting(ctx, path, false, std::time::Duration::from_secs(5)) {
        Ok(()) => {
            tracing::info!("reloaded {}", path.display());
            eprintln!("router-ctl run: reloaded {}", path.display());
        }
        // One line each, not a log line too (both go to stderr, the
        // journal in a service).
        Err(e) if e.downcast_ref::<apply::PartlyApplied>().is_some() => {
            eprintln!("router-ctl run: reload of {} failed: {e:#}", path.display());
        }
        Err(e) => {
            let e = format!("{e:#}");
            // Most refusals say so already.
            let kept = if e.contains("nothing was changed") {
                ""
            } else {
                "; nothing was changed"
            };
            eprintln!(
                "router-ctl run: reload of {} refused: {e}{kept}; the router keeps its previous \
                 configuration",
                path.display()
            );
        }
    }
}

/// The attach a session works on: its maps by kernel id (a detach and
/// attach pin new maps, a replace keeps them) and its mode (a replace may
/// change it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AttachedRouter {
    config_map: u32,
    conntrack_map: u32,
    kernel_mode: bool,
    /// The interfaces: an attach that gave a deleted interface's link to
    /// the one that came back keeps the maps, and is followed too (the
    /// egress witness and the link watch move to the new interface).
    ifindexes: [u32; 2],
}

impl AttachedRouter {
    /// The router attached now, with the configuration it was read from;
    /// `None` when it is detached (its maps are not pinned) or not
    /// configured yet (an attach under way).
    fn pinned(ctx: &Ctx) -> Result<Option<(Self, Config)>> {
        use router_common::maps::{CONFIG_MAP, CONNTRACK_MAP};
        let maps = ctx.maps();
        let (Some(config_map), Some(conntrack_map)) =
            (maps.map_id(CONFIG_MAP)?, maps.map_id(CONNTRACK_MAP)?)
        else {
            return Ok(None);
        };
        let cfg = maps.read_config()?;
        if cfg.lan_ifindex == 0 {
            return Ok(None);
        }
        let router = Self {
            config_map,
            conntrack_map,
            kernel_mode: cfg.admit == Admit::Kernel as u8,
            ifindexes: [cfg.lan_ifindex, cfg.wan_ifindex],
        };
        Ok(Some((router, cfg)))
    }
}

/// Opens a new session on the attached router in place of `session`
/// (whose maps may be orphans of a detach): the offload counters go on
/// from the old session's, the old one's flows are left to their maps.
fn reopen(ctx: &Ctx, session: &mut Session) -> Result<()> {
    let pacing = session.event_pace.pacing();
    let marks = MarkOptions {
        keep_in_kernel: session.off.keep_in_kernel_mark,
        route_mask: session.off.route_mark_mask,
        given: false,
    };
    let old = std::mem::replace(
        session,
        Session::open(ctx, &session.off.stats, pacing, marks)?,
    );
    session.stale_pending_removed += old.stale_pending_removed;
    Ok(())
}

/// Follows the router's attach, at each tick: when it is detached, says
/// so (once), stops offloading into the orphaned maps and waits; when
/// another attach is there (new maps after a
/// detach and attach, or a replace that changed the mode), re-opens the
/// session on it (a resync follows, as at the start), forgets the
/// interfaces gone with the old attach and looks at the new one's links.
/// A replace that keeps maps and mode changes nothing here.
fn follow_attach(
    ctx: &Ctx,
    session: &mut Session,
    status: &mut DaemonStatus,
    links: &mut LinkWatch,
) {
    let now = match AttachedRouter::pinned(ctx) {
        Ok(now) => now,
        Err(e) => {
            // Read between the pins and the configuration of an attach or
            // a detach under way: the next tick looks again.
            tracing::debug!("reading the attached router: {e:#}");
            return;
        }
    };
    let Some((now, _)) = now else {
        if !status.detached {
            tracing::info!(
                "the router was detached; waiting for the next `router-ctl attach`, which this \
                 daemon follows"
            );
            status.detached = true;
        }
        // The session's maps are orphans now (no program reads them): no
        // new connection is offloaded into them. The next attach re-opens
        // the session, with a new subscription and a resync. Nor is the
        // egress witness left on the interfaces (the next session attaches
        // its own).
        session.events = None;
        session.off.kernel.witness = Witness::Off;
        return;
    };
    let same = now == session.attached;
    // The same maps on other interfaces: a deleted interface given a new
    // link (`lifecycle::relink`), not a new attach.
    let relinked = now.ifindexes != session.attached.ifindexes
        && AttachedRouter {
            ifindexes: now.ifindexes,
            ..session.attached
        } == now;
    // Unsubscribed while it looked detached (an attach under way): the
    // events since are lost, a re-open reads the table again.
    let unsubscribed = session.kernel_mode && session.events.is_none();
    if same && !unsubscribed {
        status.detached = false;
        return;
    }
    // Under the lock attach takes, not waiting for it (the event loop
    // would stall): an attach under way is followed once it finished.
    let opened = match state::try_lock(ctx.ns()) {
        Ok(Some(_lock)) => reopen(ctx, session),
        Ok(None) => {
            tracing::debug!("an attach or detach is under way; following it at the next tick");
            return;
        }
        Err(e) => Err(e),
    };
    if let Err(e) = opened {
        tracing::warn!("following the new attach: {e:#}; trying again at the next tick");
        return;
    }
    if !same {
        if !relinked {
            status.reattaches_followed += 1;
        }
        status.interfaces_gone.clear();
        status.relink_failed = None;
    }
    status.detached = false;
    links.recheck = true;
    tracing::info!(
        "following {} ({} mode, CONFIG map {}, CONNTRACK map {}): {} flows offloaded from the \
         kernel's table",
        if same {
            "the attach again (its maps unchanged)"
        } else if relinked {
            "the interface made anew (the maps unchanged)"
        } else {
            "the new attach"
        },
        session.admit(),
        session.attached.config_map,
        session.attached.conntrack_map,
        session.off.len()
    );
}

/// Batches of datagrams one [`drain_events`] reads at most: under a flood
/// of events the loop's other work (lease renewals, the heartbeat, the
/// systemd watchdog, the status page) must still run between reads.
const DRAIN_BATCHES: u32 = 32;

/// Reads the conntrack events queued on the socket until none is left, a
/// batch of datagrams per syscall, at most [`DRAIN_BATCHES`]: how many
/// datagrams it read, and whether more may be queued (the caller keeps the
/// socket's readiness and reads on at the loop's next turn). The kernel
/// ends a batch early at an empty queue, or at an error it then keeps for
/// the next call (`ENOBUFS`: events lost, and a dump is read, after which
/// the loop's other work runs first). A `polled` read stops at a short
/// batch (the next poll, or the registration when it goes back to
/// waiting, gets such an error: [`EVENTS_READY`]); one the socket woke the
/// daemon for reads on until nothing is left.
fn drain_events(
    sock: &CtSocket,
    off: &mut Daemon,
    batch: &mut Datagrams,
    polled: bool,
) -> Result<(u64, bool)> {
    let mut read = 0;
    for _ in 0..DRAIN_BATCHES {
        match sock.recv_events(batch) {
            Ok(n) => {
                read += n as u64;
                if batch.truncated() > 0 {
                    // An event cut short is an event lost: as below (the
                    // batch's other events are older than the dump too).
                    read += events_lost(sock, off, batch);
                    return Ok((read, true));
                }
                off.stats.events_read += n as u64;
                apply_events(off, batch.iter().flat_map(parse_events));
                if n == 0 || (polled && n < batch.slots()) {
                    return Ok((read, false));
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                read += events_lost(sock, off, batch);
                return Ok((read, true));
            }
            Err(e) => {
                return Err(e).context(format!(
                    "reading conntrack events (fd {})",
                    sock.as_raw_fd()
                ));
            }
        }
    }
    Ok((read, true))
}

/// A warning of lost events at most this often (ns); the ones between go
/// to the debug log (the count in `status` and the metrics has them all).
const LOSS_WARN_EVERY_NS: u64 = 60_000_000_000;

/// When (`CLOCK_MONOTONIC` ns) [`events_lost`] last warned; 0: never.
static LOSS_WARNED_NS: AtomicU64 = AtomicU64::new(0);

/// Batches of stale events [`events_lost`] discards at most before its
/// dump: as many events as the receive buffer (`SO_RCVBUFFORCE` doubles
/// it) holds at once, each counted at the smallest size the kernel charges
/// for one (an skb's truesize, some 768 bytes), so a flood that keeps
/// queueing new ones holds the loop only for about 170 receives.
const STALE_BATCHES_MAX: usize = EVENT_RCVBUF * 2 / 768 / EVENT_BATCH + 1;

/// The kernel dropped events (or one was cut short): discards what is still
/// queued, all of it older than the dump it then reads (applied after it,
/// an event from before the loss undid what the dump found: a connection
/// marked to stay in the kernel was offloaded again from its old event),
/// and starts over from the dump. How many datagrams it discarded.
fn events_lost(sock: &CtSocket, off: &mut Daemon, batch: &mut Datagrams) -> u64 {
    let mut discarded = 0;
    for _ in 0..STALE_BATCHES_MAX {
        match sock.recv_events(batch) {
            Ok(0) => break,
            Ok(n) => discarded += n as u64,
            // Lost again meanwhile: what is queued is stale all the same.
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {}
            Err(_) => break,
        }
    }
    off.stats.events_lost += 1;
    let now = monotonic_ns();
    let warned = LOSS_WARNED_NS.load(Ordering::Relaxed);
    if warned == 0 || now.saturating_sub(warned) >= LOSS_WARN_EVERY_NS {
        tracing::warn!(
            "conntrack events lost ({} times since the daemon started: it could not read them \
             as fast as the kernel sent them); resynchronising from a dump",
            off.stats.events_lost
        );
        LOSS_WARNED_NS.store(now, Ordering::Relaxed);
    } else {
        tracing::debug!("conntrack events lost; resynchronising from a dump");
    }
    resync_or_retry(off, "lost events");
    discarded
}

/// Samples the counters (and the table when a page is open) and renders
/// the status page's document.
fn publish(
    ctx: &Ctx,
    live: &mut Live,
    shared: &web::Shared,
    viewed: bool,
    status: &DaemonStatus,
    session: &Session,
) {
    live.sample(ctx, viewed);
    shared
        .doc
        .send_replace(live.render(ctx, &daemon_view(status, session)).to_string());
}

/// A timer whose missed ticks are delayed, not bunched: the daemon's
/// periodic work runs once after a stall.
fn interval(every: Duration) -> tokio::time::Interval {
    let mut i = tokio::time::interval(every);
    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    i
}

/// The periodic work: settled connections offloaded, the kernel timeout
/// and lease of active flows refreshed and flows gone forgotten
/// ([`Offloader::tick`]), the data path's log, the status file and
/// systemd's watchdog and status line.
fn tick(
    ctx: &Ctx,
    session: &mut Session,
    status: &mut DaemonStatus,
    dp_log: &mut DataPathLog,
    watchdog: bool,
) {
    session.off.settle(monotonic_ns());
    if session.kernel_mode {
        // The sysctls as they are now (failover review L4: read once, a
        // lowered established timeout never reached the offloaded
        // connections' kernel entries).
        session.off.set_timeouts(KernelTimeouts::read());
    }
    let evicted = session.off.tick(monotonic_ns());
    if session.kernel_mode
        && let Ok(flushed) = conntrack::flushed(&ctx.maps())
        && session
            .flushed_seen
            .replace(flushed)
            .is_some_and(|seen| flushed != seen)
    {
        // Flows the kernel still has go back onto the fast path.
        tracing::info!("conntrack flush: {evicted} offloaded flows left the fast path");
        resync_or_retry(&mut session.off, "a conntrack flush");
    } else if session.events.is_some() && session.off.resync_retry_due(monotonic_ns()) {
        resync_or_retry(
            &mut session.off,
            "what asked for one (a failed dump, connections to decide on again)",
        );
    }
    session.off.kernel.routes.clear();
    session.off.kernel.addrs = None;
    session.off.kernel.neighbours = None;
    status.neighbours_revalidated += session
        .neighbours
        .tick(monotonic_ns(), status.tick_secs * 1_000_000_000);
    dp_log.drain();
    dp_log.follow(ctx);
    status.log_records_malformed = dp_log.malformed_records();
    if let Err(e) = write_status(ctx, status, session) {
        tracing::warn!("writing the daemon status: {e:#}");
    }
    if watchdog {
        service::watchdog();
    }
    service::status(&status_line(session));
}

/// The daemon's first line on stderr: its mode and what it follows.
fn say_started(session: &Session) {
    if session.kernel_mode {
        eprintln!(
            "router-ctl run: kernel mode, {} flows offloaded from the kernel's table ({} TCP \
             connections to follow once settled); stop with Ctrl-C",
            session.off.len(),
            session.off.settling()
        );
    } else {
        eprintln!(
            "router-ctl run: xdp mode (standalone): following the WAN address, MAC changes \
             and VRRP; stop with Ctrl-C"
        );
    }
}

/// Said once at the start when the command line set what only offload
/// mode reads (a router switched to it later reads them then).
fn say_marks_unused(session: &Session, marks: MarkOptions) {
    if marks.given && !session.kernel_mode {
        tracing::warn!(
            "--keep-in-kernel-mark and --route-mark-mask are read in offload mode only (attach \
             --admit kernel); this router admits flows in XDP (standalone), where the kernel \
             sees none of their connections: they do nothing until it is switched"
        );
    }
}

/// The daemon's last line on stderr: what goes on without it.
fn say_stopping(session: &Session, detached: bool) {
    if detached {
        // Detached while it ran (it waited for the next attach): nothing
        // of the router stays, on the fast path or off it.
        eprintln!("router-ctl run: stopping; the router is detached, nothing is on the fast path");
    } else if session.kernel_mode {
        eprintln!(
            "router-ctl run: stopping; the data path stays attached, {} offloaded flows stay \
             on the fast path until their lease ends, then the kernel carries them",
            session.off.len()
        );
    } else {
        eprintln!(
            "router-ctl run: stopping; the data path stays attached and carries its flows, \
             but a new WAN address, MAC or VRRP state is not followed until it runs again"
        );
    }
}

/// Ends the daemon when its namespace's name now names another namespace
/// (deleted and made again: a restart script, a container made anew): it
/// entered the old one, whose interfaces, conntrack and links it would go
/// on serving while the new one's router goes without a daemon. A name
/// that is gone keeps it (the namespace lives on while it holds it).
fn refuse_a_namespace_made_anew(ctx: &Ctx) -> Result<()> {
    let Some(ns) = ctx.ns() else {
        return Ok(());
    };
    match (
        crate::ctx::named_netns_inode(ns),
        crate::ctx::own_netns_inode(),
    ) {
        (Some(now), Some(mine)) if now != mine => anyhow::bail!(
            "the network namespace {ns:?} was deleted and made again: this daemon served the old \
             one, and stops. Once its router's pins are removed (`router-ctl -n {ns} detach`) \
             and a router attached in the new one, start `router-ctl -n {ns} run` there (the \
             service restarts it)"
        ),
        _ => Ok(()),
    }
}

async fn serve(ctx: &Ctx, opts: RunOptions, early: SignalsBlocked) -> Result<()> {
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    // Handled from here on: one that came during the start is delivered now.
    drop(early);
    let mut session = Session::open(ctx, &OffloadStats::default(), opts.pacing(), opts.marks)?;
    let mut links = LinkWatch::open()?;
    let mut status = DaemonStatus {
        pid: std::process::id(),
        started_unix: unix_now(),
        tick_secs: opts.tick.as_secs().max(1),
        ..DaemonStatus::default()
    };
    links.recheck(ctx, &mut status);
    write_status(ctx, &mut status, &session)?;
    // Kept for the daemon's lifetime: dropping it turns the log off. Opened
    // before the daemon says it runs, so the log is on once it has said so.
    let mut dp_log = DataPathLog::start(ctx);
    say_started(&session);
    say_marks_unused(&session, opts.marks);
    service::ready(&status_line(&session));
    let watchdog = service::watchdog_enabled();
    let listener = match opts.listener {
        Some(l) => {
            Some(tokio::net::TcpListener::from_std(l).context("registering the HTTP listener")?)
        }
        None => None,
    };
    let shared = web::SharedState::default();
    let mut live = Live::default();
    let mut sampler = interval(SAMPLE_EVERY);
    let mut settler = interval(SETTLE_EVERY);
    let mut ticker = interval(opts.tick);
    let mut looked = LookedAt::at_start();
    let mut events_batch = Datagrams::new(EVENT_BATCH, EVENT_DATAGRAM_MAX);
    // Armed (reset) when the event socket is polled, idle while waited for.
    let mut event_poller = interval(POLL_EVERY);
    let mut link_buf = vec![0u8; 1 << 16];
    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => {
                say_busy_reloading(ctx, &mut status, &session);
                reload(ctx, opts.config.as_deref());
                // A reload that changed the mode is followed (and counted)
                // as an attach that changed it is, at once.
                follow_attach(ctx, &mut session, &mut status, &mut links);
                service::ready(&status_line(&session));
                // A reload may have replaced the program (and its log).
                dp_log.follow(ctx);
            }
            () = dp_log.readable(), if dp_log.is_open() => dp_log.drain(),
            // A page just opened: sample now rather than at the next tick.
            () = shared.wake.notified() => publish(ctx, &mut live, &shared, true, &status, &session),
            _ = sampler.tick() => {
                publish(ctx, &mut live, &shared, shared.viewed(), &status, &session);
            }
            conn = web::accept(listener.as_ref()), if listener.is_some() => {
                if let Some((sock, peer)) = conn {
                    web::serve_connection(sock, peer, ctx, &shared);
                }
            }
            ready = links.events.readable() => {
                let Ok(mut guard) = ready else { continue };
                let drained = LinkWatch::drain(guard.get_inner(), ctx, &mut status, &mut link_buf);
                links.recheck |= drained.recheck;
                links.shaping_due |= drained.tc;
                guard.clear_ready();
            }
            _ = settler.tick(), if session.off.settle_due() => {
                session.off.settle(monotonic_ns());
            }
            _ = ticker.tick() => {
                refuse_a_namespace_made_anew(ctx)?;
                follow_attach(ctx, &mut session, &mut status, &mut links);
                look_again(ctx, &mut status, &mut links, &mut looked);
                tick(ctx, &mut session, &mut status, &mut dp_log, watchdog);
            }
            ready = async { session.events.as_ref()?.waited()?.ready(EVENTS_READY).await.ok() },
                if session.events.as_ref().is_some_and(|e| e.waited().is_some()) => {
                let Some(mut guard) = ready else { continue };
                let (_, more) =
                    drain_events(guard.get_inner(), &mut session.off, &mut events_batch, false)?;
                if !more {
                    guard.clear_ready();
                }
                if session.pace_events(None) {
                    event_poller.reset();
                }
            }
            _ = event_poller.tick(), if session.events_polled() => {
                let Some(events) = session.events.as_ref() else { continue };
                let (read, _) =
                    drain_events(events.socket(), &mut session.off, &mut events_batch, true)?;
                session.off.stats.event_polls += 1;
                session.pace_events(Some(read));
            }
        }
    }
    service::stopping();
    drop(dp_log);
    say_stopping(&session, status.detached);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error pending on a waited socket with nothing queued wakes the
    /// daemon (review finding 5): a connected UDP socket on loopback whose
    /// datagram met a closed port holds `ECONNREFUSED` and an empty queue,
    /// as an event socket holds `ENOBUFS` after a batch ended early.
    #[test]
    fn a_pending_error_without_a_datagram_wakes_the_waited_socket() {
        use std::net::UdpSocket;
        let closed = UdpSocket::bind("127.0.0.1:0").expect("binding a UDP socket on loopback");
        let closed_addr = closed.local_addr().expect("its address");
        drop(closed);
        let sock = UdpSocket::bind("127.0.0.1:0").expect("binding a UDP socket on loopback");
        sock.connect(closed_addr).expect("connecting it");
        sock.set_nonblocking(true).expect("making it non-blocking");
        sock.send(b"x").expect("sending to the closed port");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(async {
            // Registered as `EventSocket::register` does, waited for as the
            // event loop does: the bound only keeps a broken build from
            // hanging.
            // SAFETY: the UdpSocket owns its fd; the AsyncFd owns the
            // socket until it is dropped.
            let fd = unsafe { AsyncFd::register_with_interest(sock, EVENTS_READY) }
                .expect("registering");
            let mut guard = tokio::time::timeout(Duration::from_secs(10), fd.ready(EVENTS_READY))
                .await
                .expect("the pending error woke the waiter")
                .expect("waiting for the socket");
            assert!(guard.ready().is_error(), "{:?}", guard.ready());
            let e = guard
                .get_inner()
                .recv(&mut [0; 8])
                .expect_err("the error, no datagram");
            assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
            guard.clear_ready();
        });
    }
}
