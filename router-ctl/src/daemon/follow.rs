//! What the daemon follows besides conntrack, in both modes: the attached
//! interfaces over rtnetlink (a new MAC into the data path's
//! configuration, a new WAN address, a deleted interface reported), the
//! VRRP virtual MACs, and standalone mode's kernel side (put back when a
//! firewall reload removed it).

use std::{io, net::Ipv4Addr};

use anyhow::{Context, Result};
use router_common::maps::Config;
use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    clock::monotonic_ns,
    config::{AdmitMode, RouterConfig},
    conntrack::{self, old_addresses},
    ctx::Ctx,
    netlink::{self, LinkEvent, LinkEvents},
    shaping, standalone, state, vmac,
};

use super::DaemonStatus;

/// How often (ns) standalone mode's kernel side is looked at, and the
/// attached interfaces and virtual MACs without a notification.
const KERNEL_SIDE_CHECK_NS: u64 = 15 * 1_000_000_000;

/// The attached interfaces, followed over rtnetlink link notifications.
pub(super) struct LinkWatch {
    pub(super) events: AsyncFd<LinkEvents>,
    /// Look at the links again at the next tick: notifications were lost
    /// (`ENOBUFS`) or following one failed.
    pub(super) recheck: bool,
    /// Look at the attached interfaces' traffic shaping at the next tick:
    /// a qdisc or tc filter of one of them changed.
    pub(super) shaping_due: bool,
}

/// `TCM_IFINDEX_MAGIC_BLOCK`: the interface index of a notification about
/// a shared filter block's filter (any interface using the block).
const TC_SHARED_BLOCK: u32 = 0xffff_ffff;

impl LinkWatch {
    /// Subscribes; the first look at the links ([`Self::recheck`]) comes
    /// after, so no change falls between the two.
    pub(super) fn open() -> Result<Self> {
        let s = LinkEvents::subscribe()
            .context("subscribing to link, address and tc notifications (rtnetlink RTMGRP_LINK, RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR, RTMGRP_TC)")?;
        // SAFETY: LinkEvents owns its fd and never changes or closes it
        // before it is dropped, which the AsyncFd does.
        let events = unsafe { AsyncFd::register_with_interest(s, Interest::READABLE) }
            .map_err(|e| io::Error::other(e.to_string()))
            .context("registering the link notification socket")?;
        Ok(Self {
            events,
            recheck: true,
            shaping_due: false,
        })
    }

    /// Follows the notifications queued on `events` until none is left;
    /// whether the links must be looked at again ([`Self::recheck`]) and
    /// whether an attached interface's qdiscs or tc filters changed
    /// ([`Self::shaping_due`]). Any link or address notification (a
    /// macvlan created, up or down, a virtual address added or removed) is
    /// followed by one look at the virtual MACs.
    pub(super) fn drain(
        events: &LinkEvents,
        ctx: &Ctx,
        status: &mut DaemonStatus,
        buf: &mut [u8],
    ) -> Drained {
        let mut recheck = false;
        let mut tc = false;
        let mut any = false;
        loop {
            match events.recv(buf) {
                Ok(Some(events)) => {
                    let is_tc = |e: &LinkEvent| matches!(e, LinkEvent::Tc { .. });
                    any |= !events.iter().all(is_tc);
                    if !tc
                        && events.iter().any(is_tc)
                        && let Some(cfg) = attached_config(ctx)
                    {
                        tc = events.iter().any(|e| {
                            matches!(e, LinkEvent::Tc { ifindex }
                                if [cfg.lan_ifindex, cfg.wan_ifindex, TC_SHARED_BLOCK]
                                    .contains(ifindex))
                        });
                    }
                    for e in events {
                        let followed = match e {
                            LinkEvent::Changed(l) => l.mac.map_or(Ok(Followed::Done), |mac| {
                                follow_mac(ctx, l.ifindex, mac, status)
                            }),
                            LinkEvent::Deleted { ifindex, name } => {
                                interface_gone(ctx, ifindex, &name, status);
                                Ok(Followed::Done)
                            }
                            LinkEvent::Address { ifindex } => follow_wan_addr(ctx, ifindex, status),
                            // Looked at above.
                            LinkEvent::Tc { .. } => Ok(Followed::Done),
                        };
                        match followed {
                            Ok(Followed::Done) => {}
                            Ok(Followed::LockBusy) => recheck = true,
                            Err(e) => {
                                tracing::warn!("following a link change: {e:#}; trying again");
                                recheck = true;
                            }
                        }
                    }
                }
                Ok(None) => {
                    if any && let Err(e) = follow_virtual_macs(ctx) {
                        tracing::warn!("following the VRRP virtual MACs: {e:#}; trying again");
                        recheck = true;
                    }
                    return Drained { recheck, tc };
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
                    tracing::warn!("link notifications lost; reading the interfaces again");
                    recheck = true;
                    tc = true;
                }
                Err(e) => {
                    tracing::warn!("reading link notifications: {e}; reading the interfaces again");
                    return Drained {
                        recheck: true,
                        tc: true,
                    };
                }
            }
        }
    }

    /// The links as they are now, when a notification may have been
    /// missed (at the start: a change while no daemon ran).
    pub(super) fn recheck(&mut self, ctx: &Ctx, status: &mut DaemonStatus) {
        if !std::mem::take(&mut self.recheck) {
            return;
        }
        match check_links(ctx, status) {
            Ok(Followed::Done) => {}
            Ok(Followed::LockBusy) => self.recheck = true,
            Err(e) => {
                tracing::warn!("reading the attached interfaces: {e:#}; trying again");
                self.recheck = true;
            }
        }
    }
}

/// What [`LinkWatch::drain`] asks for at the next tick.
pub(super) struct Drained {
    /// A look at the links ([`LinkWatch::recheck`]).
    pub(super) recheck: bool,
    /// A look at the attached interfaces' shaping ([`LinkWatch::shaping_due`]).
    pub(super) tc: bool,
}

/// The data path's MAC of the attached interface `ifindex` (LAN or WAN)
/// in `cfg`, with the interface's role.
pub(super) fn attached_mac(cfg: &mut Config, ifindex: u32) -> Option<(&'static str, &mut [u8; 6])> {
    if ifindex == 0 {
        None
    } else if ifindex == cfg.lan_ifindex {
        Some(("LAN", &mut cfg.lan_mac))
    } else if ifindex == cfg.wan_ifindex {
        Some(("WAN", &mut cfg.wan_mac))
    } else {
        None
    }
}

/// The attached router's configuration; `None` when there is none to
/// follow (detached meanwhile: the pins are gone).
pub(super) fn attached_config(ctx: &Ctx) -> Option<Config> {
    ctx.maps()
        .read_config()
        .inspect_err(|e| tracing::debug!("no configuration to follow link changes in: {e:#}"))
        .ok()
}

/// Whether a link change was followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Followed {
    /// Followed, or nothing to follow.
    Done,
    /// Another router-ctl (an attach) holds the router's lock: the links
    /// are looked at again at the next tick.
    LockBusy,
}

/// Makes the data path's virtual MACs match the VRRP macvlans on the
/// attached interfaces as they are now ([`vmac`]).
pub(super) fn follow_virtual_macs(ctx: &Ctx) -> Result<()> {
    match attached_config(ctx) {
        Some(cfg) => follow_virtual_macs_of(ctx, &cfg),
        None => Ok(()),
    }
}

/// [`follow_virtual_macs`] for the router attached with `cfg`. Without the
/// lock: the map is written from the kernel's state alone, which an
/// attach writing it at the same time reads too. A router attached by a
/// router-ctl without the map has none to follow.
pub(super) fn follow_virtual_macs_of(ctx: &Ctx, cfg: &Config) -> Result<()> {
    let maps = ctx.maps();
    if cfg.lan_ifindex == 0
        || maps
            .map_id(router_common::maps::VIRTUAL_MACS_MAP)?
            .is_none()
    {
        return Ok(());
    }
    vmac::follow(&maps, cfg)
}

/// Compares both attached interfaces with the configuration, and the
/// virtual MACs with the macvlans on them.
pub(super) fn check_links(ctx: &Ctx, status: &mut DaemonStatus) -> Result<Followed> {
    let Some(cfg) = attached_config(ctx) else {
        return Ok(Followed::Done);
    };
    let mut followed = Followed::Done;
    let mut gone = false;
    for ifindex in [cfg.lan_ifindex, cfg.wan_ifindex] {
        if ifindex == 0 {
            continue;
        }
        match netlink::link(ifindex) {
            Ok(l) => {
                if let Some(mac) = l.mac
                    && follow_mac(ctx, ifindex, mac, status)? == Followed::LockBusy
                {
                    followed = Followed::LockBusy;
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
                // Named as the record names it (the notification that
                // named it may have come while no daemon ran).
                let recorded = state::load(ctx.ns()).ok().flatten().and_then(|r| {
                    let c = r.config;
                    if c.lan_ifindex == ifindex {
                        Some(c.lan)
                    } else {
                        (c.wan_ifindex == ifindex).then_some(c.wan)
                    }
                });
                let name = recorded.unwrap_or_else(|| format!("ifindex {ifindex}"));
                interface_gone(ctx, ifindex, &name, status);
                gone = true;
            }
            Err(e) => return Err(e).context(format!("reading interface {ifindex}")),
        }
    }
    if gone && relink(ctx, status)? == Followed::LockBusy {
        return Ok(Followed::LockBusy);
    }
    if follow_wan_addr(ctx, cfg.wan_ifindex, status)? == Followed::LockBusy {
        followed = Followed::LockBusy;
    }
    follow_virtual_macs_of(ctx, &cfg)?;
    Ok(followed)
}

/// An attached interface has the MAC `mac`: if the data path still
/// compares frames' destinations with another (it passes every frame
/// addressed to the new one to the kernel, as `pass_not_for_us`), the
/// new one goes into the configuration, in one write of the whole value
/// as attach writes it, and into the attach record (so that the next
/// attach finds nothing to change), under the lock attach takes. While
/// another router-ctl holds it (an attach under way), the daemon does not
/// wait (its event loop would stall for as long): it looks again at the
/// next tick ([`Followed::LockBusy`]).
pub(super) fn follow_mac(
    ctx: &Ctx,
    ifindex: u32,
    mac: [u8; 6],
    status: &mut DaemonStatus,
) -> Result<Followed> {
    let Some(mut cfg) = attached_config(ctx) else {
        return Ok(Followed::Done);
    };
    if attached_mac(&mut cfg, ifindex).is_none_or(|(_, m)| *m == mac) {
        return Ok(Followed::Done);
    }
    let Some(_lock) = state::try_lock(ctx.ns())? else {
        tracing::debug!(
            "another router-ctl holds the router's lock; following the new MAC of ifindex \
             {ifindex} at the next tick"
        );
        return Ok(Followed::LockBusy);
    };
    // Again under the lock: an attach may have changed it meanwhile.
    let mut cfg = ctx.maps().read_config()?;
    let Some((role, slot)) = attached_mac(&mut cfg, ifindex) else {
        return Ok(Followed::Done);
    };
    if *slot == mac {
        return Ok(Followed::Done);
    }
    let old = std::mem::replace(slot, mac);
    ctx.maps()
        .config()?
        .set(0, cfg, 0)
        .context("writing the configuration")?;
    if let Some(mut rec) = state::load(ctx.ns())? {
        let configs =
            std::iter::once(&mut rec.config).chain(rec.pending.as_mut().map(|p| &mut p.config));
        for c in configs {
            if c.lan_ifindex == ifindex {
                c.lan_mac = mac;
            } else if c.wan_ifindex == ifindex {
                c.wan_mac = mac;
            }
        }
        state::save(ctx.ns(), &rec)?;
    }
    status.mac_changes_followed += 1;
    let name = netlink::ifname(ifindex).unwrap_or_else(|| format!("ifindex {ifindex}"));
    // On stderr at any log level, as the daemon's other lines a router
    // owner reads in the journal: rare, and what the router now does.
    eprintln!(
        "router-ctl run: {name} ({role}) changed its MAC from {} to {}: the data path now \
         forwards frames addressed to the new one",
        netlink::mac_str(old),
        netlink::mac_str(mac)
    );
    Ok(Followed::Done)
}

/// An address of interface `ifindex` was added or removed: if it is the
/// WAN of a router attached with `--wan-addr auto` whose first IPv4
/// address is now another one (a DHCP or PPP renumbering), the router
/// masquerades to the new one: the data path's configuration (one write),
/// standalone mode's slow-path NAT and its untranslated-source drop, and
/// the attach record; the XDP flows translated to the old address end
/// (their replies could not come back; the kernel's masquerade drops its
/// own likewise), so their hosts' next packets open flows on the new one.
/// A WAN left without an IPv4 address (a lease lost, or between two) is
/// followed to 0.0.0.0, none: the old address's flows end, and until an
/// address comes the data path opens no IPv4 flow from the LAN
/// (`pass_no_wan_addr`) and standalone mode's slow-path table drops what
/// the LAN sends to the WAN, as the kernel's masquerade does without an
/// address: nothing leaves with an address another subscriber may hold by
/// then.
pub(super) fn follow_wan_addr(
    ctx: &Ctx,
    ifindex: u32,
    status: &mut DaemonStatus,
) -> Result<Followed> {
    let Some(cfg) = attached_config(ctx) else {
        return Ok(Followed::Done);
    };
    if ifindex == 0 || ifindex != cfg.wan_ifindex {
        return Ok(Followed::Done);
    }
    let Some(rec) = state::load(ctx.ns())? else {
        return Ok(Followed::Done);
    };
    let Some(now) = wan_addr_now(&rec.config, cfg.wan_addr) else {
        return Ok(Followed::Done);
    };
    let Some(_lock) = state::try_lock(ctx.ns())? else {
        tracing::debug!(
            "another router-ctl holds the router's lock; following the WAN address at the \
             next tick"
        );
        return Ok(Followed::LockBusy);
    };
    // Again under the lock: an attach may have changed it meanwhile.
    let (Some(mut rec), Ok(mut cfg)) = (state::load(ctx.ns())?, ctx.maps().read_config()) else {
        return Ok(Followed::Done);
    };
    if wan_addr_now(&rec.config, cfg.wan_addr) != Some(now) {
        return Ok(Followed::Done);
    }
    if rec.pending.is_some() {
        // An interrupted replace: the next attach finishes it (with the
        // address as it is then); until then, looked at again each tick.
        return Ok(Followed::LockBusy);
    }
    let old = std::mem::replace(&mut rec.config.wan_addr, now);
    let standalone_mode = rec.config.admit == AdmitMode::Xdp;
    // The data path first: until it maps to the new address and the old
    // one's flows are gone, their packets leave with an address the router
    // no longer holds (the kernel's masquerade drops its connections of a
    // vanished address at once, in its address notifier). Its address is
    // the record's but after a failure below (then the record still names
    // the one before), so the record's and the data path's are both ended.
    let data_path_old = Ipv4Addr::from(cfg.wan_addr);
    if data_path_old != now {
        if standalone_mode {
            // Before the data path maps to the new address: every mapping
            // is an old address's (its flows end below), and a TCP one
            // would hold its port for days.
            conntrack::clear_mappings(&ctx.maps())?;
        }
        cfg.wan_addr = now.octets();
        ctx.maps()
            .config()?
            .set(0, cfg, 0)
            .context("writing the configuration")?;
    }
    // Offload mode: the flows are the kernel's, whose masquerade drops
    // them itself. Again at a retry (a walk that finds nothing ends
    // nothing).
    let mut xdp_ended = 0;
    if standalone_mode {
        for gone in old_addresses(data_path_old, old, now) {
            xdp_ended += conntrack::remove_translated_to(&ctx.maps(), gone.octets())?;
        }
    }
    // Then the kernel side (an `nft -f`, tens of milliseconds): if it
    // fails, the record still names the old address (it is saved last),
    // and the next tick tries again.
    if standalone_mode {
        standalone::set_up(ctx.ns(), &standalone::Wanted::of(&rec.config))
            .context("moving standalone mode's slow-path NAT to the new WAN address")?;
    }
    state::save(ctx.ns(), &rec)?;
    // The slow path's connections of the old addresses (the data path's
    // too: a follow whose record could not be saved had moved the slow
    // path to it).
    let mut kernel_ended = 0;
    if standalone_mode {
        for gone in old_addresses(data_path_old, old, now) {
            kernel_ended += conntrack::end_kernel_flows_translated_to(gone).unwrap_or_else(|e| {
                tracing::warn!(
                    "ending the kernel slow path's connections translated to {gone}: {e}; they \
                     end when they time out"
                );
                0
            });
        }
    }
    status.wan_addr_changes_followed += 1;
    say_wan_addr_followed(
        &rec.config.wan,
        Moved {
            recorded: old,
            data_path: data_path_old,
            now,
        },
        standalone_mode,
        (xdp_ended, kernel_ended),
    );
    Ok(Followed::Done)
}

/// A WAN address follow from the recorded address and the data path's
/// (ahead of it after a failed follow) to `now` (0.0.0.0: none).
#[derive(Clone, Copy)]
struct Moved {
    recorded: Ipv4Addr,
    data_path: Ipv4Addr,
    now: Ipv4Addr,
}

/// Says on stderr what a follow of the WAN `wan`'s address did (`ended`:
/// the XDP flows and the slow-path connections of the old addresses it
/// ended), at any log level, as the daemon's other changes.
fn say_wan_addr_followed(wan: &str, m: Moved, standalone_mode: bool, ended: (usize, usize)) {
    let Moved {
        recorded: old,
        data_path: data_path_old,
        now,
    } = m;
    let (xdp_ended, kernel_ended) = ended;
    if now.is_unspecified() {
        let drops = if standalone_mode {
            "opens no IPv4 flow from the LAN and drops what the LAN sends to the WAN"
        } else {
            "leaves IPv4 NAT to the kernel's masquerade, which drops what it cannot translate"
        };
        eprintln!(
            "router-ctl run: {wan} (WAN) lost its IPv4 address {data_path_old}: until it has one, \
             the router {drops}; {xdp_ended} XDP flows and {kernel_ended} slow-path connections \
             translated to it ended"
        );
    } else if data_path_old.is_unspecified() {
        let who = if standalone_mode {
            "the router masquerades to it"
        } else {
            "the kernel's masquerade translates to it"
        };
        eprintln!("router-ctl run: {wan} (WAN) has an IPv4 address, {now}, after none: {who}");
    } else if old == now {
        // Back to the recorded address after a follow whose kernel side
        // failed had moved the data path on.
        eprintln!(
            "router-ctl run: {wan} (WAN) has {now} again: the data path masquerades to it again; \
             {xdp_ended} XDP flows and {kernel_ended} slow-path connections translated to \
             {data_path_old} ended"
        );
    } else {
        eprintln!(
            "router-ctl run: {wan} (WAN) changed its IPv4 address from {old} to {now}: the router \
             masquerades to {now} now; {xdp_ended} XDP flows and {kernel_ended} slow-path \
             connections translated to the old address ended (their hosts' next packets open \
             new ones)"
        );
    }
}

/// When the daemon last looked at what it follows without notifications
/// (`CLOCK_MONOTONIC` ns).
#[expect(
    clippy::struct_field_names,
    reason = "each field is a time in ns, named for what was looked at"
)]
pub(super) struct LookedAt {
    /// Standalone mode's kernel side (0: at the first tick).
    kernel_side_ns: u64,
    /// The attached interfaces and the virtual MACs on them.
    links_ns: u64,
    /// The attached interfaces' traffic shaping (0: at the first tick).
    shaping_ns: u64,
}

impl LookedAt {
    /// The links were looked at just now, the kernel side not yet.
    pub(super) fn at_start() -> Self {
        Self {
            kernel_side_ns: 0,
            links_ns: monotonic_ns(),
            shaping_ns: 0,
        }
    }
}

/// At a tick: the attached interfaces and virtual MACs when a notification
/// asked for it, and every [`KERNEL_SIDE_CHECK_NS`] without one (an attach
/// or apply writes the virtual MACs from a look at the links it took
/// before a VRRP transition this daemon followed meanwhile, and would
/// leave them so until the next one); standalone mode's kernel side.
pub(super) fn look_again(
    ctx: &Ctx,
    status: &mut DaemonStatus,
    links: &mut LinkWatch,
    looked: &mut LookedAt,
) {
    // While an attached interface is gone, every tick: it may be back
    // (made anew in steps: created, then its peer's settings, which this
    // namespace hears nothing of).
    if monotonic_ns().saturating_sub(looked.links_ns) >= KERNEL_SIDE_CHECK_NS
        || !status.interfaces_gone.is_empty()
    {
        links.recheck = true;
        looked.links_ns = monotonic_ns();
    }
    let relinked = status.interfaces_relinked;
    links.recheck(ctx, status);
    if status.interfaces_relinked != relinked {
        // A LAN made anew has its sysctls at their defaults: standalone
        // mode's kernel side is looked at now, not in up to 15 s.
        looked.kernel_side_ns = 0;
    }
    repair_standalone(ctx, status, &mut looked.kernel_side_ns);
    if std::mem::take(&mut links.shaping_due) {
        looked.shaping_ns = 0;
    }
    follow_shaping(ctx, status, &mut looked.shaping_ns);
}

/// Traffic shaping and tc rules on the attached interfaces, which the
/// fast path's flows skip (`shaping.rs`): `attach` warns of them, but one
/// set up after it (an SQM service that starts after the router's at
/// boot) is not seen there. Looked at every [`KERNEL_SIDE_CHECK_NS`] (a
/// few rtnetlink dumps and `bpf` queries) and after a qdisc or tc filter
/// notification of an attached interface; a change is logged, the current
/// state kept in the status (`status`, the status page). An interface that
/// cannot be read keeps what was last seen of it.
pub(super) fn follow_shaping(ctx: &Ctx, status: &mut DaemonStatus, checked_ns: &mut u64) {
    let now = monotonic_ns();
    if *checked_ns != 0 && now.saturating_sub(*checked_ns) < KERNEL_SIDE_CHECK_NS {
        return;
    }
    *checked_ns = now;
    let Some(rec) = state::load(ctx.ns()).ok().flatten() else {
        status.shaping_skipped = None;
        return;
    };
    let before = status.shaping_skipped.clone();
    let mut seen = Vec::new();
    for (iface, ifindex) in [
        (&rec.config.lan, rec.config.lan_ifindex),
        (&rec.config.wan, rec.config.wan_ifindex),
    ] {
        let prefix = format!("{iface}: ");
        match shaping::skipped_on(ifindex) {
            Ok(skipped) if skipped.is_empty() => {}
            Ok(skipped) => seen.push(format!("{prefix}{}", skipped.join(", "))),
            Err(e) => {
                tracing::debug!("reading the traffic shaping of {iface}: {e}");
                seen.extend(
                    before
                        .iter()
                        .flatten()
                        .filter(|s| s.starts_with(&prefix))
                        .cloned(),
                );
            }
        }
    }
    if before.as_ref() == Some(&seen) {
        return;
    }
    if !seen.is_empty() {
        tracing::warn!(
            "traffic shaping or tc rules on the attached interfaces: {}; the flows on the fast \
             path skip them (an XDP redirect transmits past the egress qdisc, and XDP runs \
             before tc ingress): remove them if the fast path's rate is what you want, or \
             `router-ctl detach` to keep the shaping for every flow (`router-ctl doctor` says \
             more)",
            seen.join("; ")
        );
    } else if before.is_some_and(|b| !b.is_empty()) {
        tracing::info!("no traffic shaping or tc rules on the attached interfaces any more");
    }
    status.shaping_skipped = Some(seen);
}

/// Standalone mode's kernel side as attach set it up: put back (and
/// said, once per repair) when something removed it behind the router's
/// back ([`standalone::kernel_side_gaps`]). Looked at every
/// [`KERNEL_SIDE_CHECK_NS`] (it runs `nft`, a process); while another
/// router-ctl holds the lock (an attach, which sets it up itself), at the
/// next tick.
pub(super) fn repair_standalone(ctx: &Ctx, status: &mut DaemonStatus, checked_ns: &mut u64) {
    let now = monotonic_ns();
    if *checked_ns != 0 && now.saturating_sub(*checked_ns) < KERNEL_SIDE_CHECK_NS {
        return;
    }
    let standalone = |ctx: &Ctx| {
        state::load(ctx.ns())
            .ok()
            .flatten()
            .filter(|r| r.config.admit == AdmitMode::Xdp && r.pending.is_none())
    };
    let Some(rec) = state::load(ctx.ns()).ok().flatten() else {
        return;
    };
    if rec.config.admit != AdmitMode::Xdp {
        status.forward_rules_bypassed = None;
        return;
    }
    // A pending replace says nothing yet.
    if rec.pending.is_some() {
        return;
    }
    note_bypassed_forward_rules(status, &rec);
    let gaps = standalone::kernel_side_gaps(ctx.ns());
    if gaps.is_empty() {
        *checked_ns = now;
        return;
    }
    let Ok(Some(_lock)) = state::try_lock(ctx.ns()) else {
        return;
    };
    *checked_ns = now;
    // Again under the lock: a detach or another mode meanwhile.
    let Some(rec) = standalone(ctx) else {
        return;
    };
    match standalone::set_up(ctx.ns(), &standalone::Wanted::of(&rec.config)) {
        Ok(()) => {
            status.standalone_repairs += 1;
            tracing::warn!(
                "standalone mode's kernel side was changed behind the router's back: {}; put \
                 back",
                gaps.join("; ")
            );
        }
        Err(e) => tracing::error!(
            "standalone mode's kernel side is not in place ({}) and putting it back failed: \
             {e:#}; run `router-ctl attach` again",
            gaps.join("; ")
        ),
    }
}

/// Forward rules standalone mode bypasses unasked: added since an attach
/// that bypassed none, or chains added or changed since the bypass the
/// record `rec` keeps (one from an older router-ctl, which kept no list:
/// nothing said). Said once when they appear, with what to do, and once
/// when they are gone; `status` and the status page say it meanwhile.
fn note_bypassed_forward_rules(status: &mut DaemonStatus, rec: &state::State) {
    let now = match rec.accepted_forward_chains() {
        None => None,
        // Unreadable (nft failing): as it was.
        Some(accepted) => {
            let Ok(now) = standalone::bypassed_unasked(accepted) else {
                return;
            };
            now
        }
    };
    if now == status.forward_rules_bypassed {
        return;
    }
    if let Some(problem) = &now {
        tracing::warn!("{problem}");
    } else {
        tracing::info!(
            "no netfilter forward rules bypassed unasked any more (none left, or the bypass was \
             accepted with attach --bypass-forward-rules)"
        );
    }
    status.forward_rules_bypassed = now;
}

/// The WAN's first IPv4 address now (0.0.0.0 if it has none), if the
/// router follows it (`--wan-addr auto`) and it differs from the recorded
/// one or from the data path's (`data_path`, CONFIG's: ahead of the record
/// after a failed follow, which a return to the recorded address must
/// undo too). `None` also when the WAN's addresses cannot be read (the
/// interface is gone: its relink is followed, not its addresses).
pub(super) fn wan_addr_now(c: &RouterConfig, data_path: [u8; 4]) -> Option<Ipv4Addr> {
    if !c.wan_addr_auto {
        return None;
    }
    let addrs = netlink::ipv4_addrs(&c.wan).ok()?;
    let now = addrs.first().copied().unwrap_or(Ipv4Addr::UNSPECIFIED);
    address_moved(now, c.wan_addr, data_path).then_some(now)
}

/// Whether the WAN's address `now` is not yet the recorded one or the
/// data path's ([`wan_addr_now`]).
fn address_moved(now: Ipv4Addr, recorded: Ipv4Addr, data_path: [u8; 4]) -> bool {
    now != recorded || now.octets() != data_path
}

/// An attached interface is gone: if one of its name is back, it gets a
/// new link (`lifecycle::relink`), the maps and flows kept; the session
/// follows the new interface at the next tick (`follow_attach`). A
/// failure is logged once and kept in the status until it changes.
fn relink(ctx: &Ctx, status: &mut DaemonStatus) -> Result<Followed> {
    let Some(_lock) = state::try_lock(ctx.ns())? else {
        return Ok(Followed::LockBusy);
    };
    match crate::lifecycle::relink::relink_gone(ctx, false, "run `router-ctl attach` with --force")
    {
        Ok(Some(said)) => {
            // On stderr at any log level, as the other changes it follows.
            eprintln!("router-ctl run: {said}");
            status.interfaces_relinked += 1;
            status.relink_failed = None;
        }
        Ok(None) => {}
        Err(e) => {
            let why = format!("{e:#}");
            if status.relink_failed.as_ref() != Some(&why) {
                tracing::error!("giving a re-created interface its XDP link: {why}");
                status.relink_failed = Some(why);
            }
        }
    }
    Ok(Followed::Done)
}

/// An interface was deleted (or moved to another namespace): if it was
/// an attached one, its XDP program went with it; says so once, in the
/// log and the status.
pub(super) fn interface_gone(ctx: &Ctx, ifindex: u32, name: &str, status: &mut DaemonStatus) {
    let Some(mut cfg) = attached_config(ctx) else {
        return;
    };
    let Some((role, _)) = attached_mac(&mut cfg, ifindex) else {
        return;
    };
    let what = format!("{name} ({role})");
    let suffix = format!(" ({role})");
    if status.interfaces_gone.iter().any(|g| g.ends_with(&suffix)) {
        return;
    }
    tracing::error!(
        "the {role} interface {name} (ifindex {ifindex}) is gone (deleted or moved to another \
         namespace): its XDP program went with it, and nothing goes through XDP on it; once \
         an interface of that name is back, this daemon gives it a new link, keeping the \
         flows"
    );
    status.interfaces_gone.push(what);
}

#[cfg(test)]
mod address_tests {
    use super::*;

    /// A follow whose kernel side failed left the data path on the new
    /// address and the record on the old one: a return to the old address
    /// must still move the data path back.
    #[test]
    fn the_data_paths_address_counts_as_well_as_the_records() {
        let (a, b) = (Ipv4Addr::new(203, 0, 113, 1), Ipv4Addr::new(203, 0, 113, 9));
        assert!(!address_moved(a, a, a.octets()), "all in place");
        assert!(address_moved(b, a, a.octets()), "a new address");
        assert!(address_moved(b, a, b.octets()), "the record behind");
        assert!(
            address_moved(a, a, b.octets()),
            "back to the recorded one, data path ahead"
        );
    }

    #[test]
    fn a_follow_ends_the_flows_of_each_old_address_once() {
        let [a, b, c] = [1, 2, 3].map(|n| Ipv4Addr::new(203, 0, 113, n));
        let ended = |d, r, n| old_addresses(d, r, n).collect::<Vec<_>>();
        assert_eq!(ended(a, a, b), [a], "a plain change");
        assert_eq!(
            ended(b, a, c),
            [b, a],
            "after a failed follow, on to a third"
        );
        assert_eq!(ended(b, a, a), [b], "back to the recorded one");
        assert_eq!(ended(b, a, b), [a], "a retry");
        let none = Ipv4Addr::UNSPECIFIED;
        assert_eq!(ended(a, a, none), [a], "the address lost");
        assert_eq!(
            ended(none, none, b),
            [] as [Ipv4Addr; 0],
            "an address after none"
        );
        assert_eq!(ended(none, a, b), [a], "after a failed follow to none");
    }

    /// A WAN without an IPv4 address is followed to 0.0.0.0, once.
    #[test]
    fn an_address_lost_is_a_move_to_none() {
        let (a, none) = (Ipv4Addr::new(203, 0, 113, 1), Ipv4Addr::UNSPECIFIED);
        assert!(address_moved(none, a, a.octets()), "the address lost");
        assert!(!address_moved(none, none, [0; 4]), "followed already");
        assert!(address_moved(a, none, [0; 4]), "an address again");
    }
}
