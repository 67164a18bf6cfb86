//! The router's lifecycle: `attach` (a fresh attach, or on a running
//! router nothing or a live replace), `detach`, and the loader both share.
//!
//! Crash consistency (every step below can be cut short by `kill -9`):
//! - fresh attach: the maps, the program and both links are made and pinned
//!   in a private staging directory (`xdp-router-staging/<ns>`) with the configuration
//!   left empty (the data path passes every packet to the kernel while
//!   `CONFIG` is empty), then the directory is renamed into place, the
//!   record is written, and only then the configuration: that one map
//!   write turns the fast path on for both interfaces at once. A crash
//!   before it leaves traffic on the kernel path (the old state); leftovers
//!   are removed by the next router-ctl that takes the lock, and `status`
//!   reports them.
//! - replace: the new program is loaded against the pinned maps (conntrack,
//!   counters, rules, devices and config are shared, so flows survive); the
//!   record gets a `pending` entry, the configuration is written in place
//!   (one map write, both interfaces at once), then each pinned link is
//!   switched to the new program with `BPF_LINK_UPDATE` (atomic per
//!   interface, no gap). Termination signals are blocked throughout; only
//!   `kill -9` between the two link updates leaves the interfaces on
//!   different program versions (same maps and config), which `status`
//!   detects from the link program ids and `attach` repairs.
//! - detach: the configuration is cleared first (one write: both
//!   interfaces back on the kernel path at once), then the record, the
//!   links and the maps are removed.

mod counters_carry;
mod detach;
mod fresh;
pub(crate) mod loader;
pub(crate) mod relink;
mod replace;

use std::{fs, net::Ipv4Addr};

use anyhow::{Context, Result, bail};
use aya::programs::XdpMode;
use router_common::maps::{Config, PortForwardKey, PortForwardTarget};
use tracing::{info, warn};

pub use detach::{detach, detach_orphaned, links_still_run, orphaned};
pub use fresh::check_interfaces;

use crate::{
    clock,
    config::{self, AdmitMode, AttachArgs, ForwardRules, RouterConfig},
    ctx::Ctx,
    doctor,
    inspect::inspect,
    object::Object,
    pins::ensure_bpffs,
    standalone,
    state::{self, State},
    vmac,
};

/// An attach refused for a reason trying again does not change: only a
/// detach (a live replace whose pinned maps do not fit the new object,
/// other interfaces, another XDP mode, incomplete pins) or a change of the
/// file or the host (a file that does not parse or validate, another
/// tool's XDP program, a firewall standalone mode would bypass, or a tool
/// missing to read it) can. `router-ctl` exits with [`Unretryable::EXIT_CODE`] then, so a
/// service that applies its file at start (`RestartPreventExitStatus=`)
/// stops instead of trying again every few seconds.
#[derive(Debug)]
pub struct Unretryable(pub String);

impl Unretryable {
    /// `EX_CONFIG` of sysexits.h.
    pub const EXIT_CODE: i32 = 78;
}

impl std::fmt::Display for Unretryable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unretryable {}

/// Puts standalone mode's kernel side back as it was before a failed
/// attach set it up: as the running router's record has it (a standalone
/// router), or gone (none was attached, or an offload router, which has
/// none); left alone when a router runs without a record. Best effort: a
/// failure is reported, the attach's own error is the one returned.
fn undo_standalone_set_up(ctx: &Ctx, attached: bool, record: Option<&State>) {
    let undone = match (attached, record) {
        (true, Some(r)) if r.config.admit == AdmitMode::Xdp => {
            standalone::set_up(ctx.ns(), &standalone::Wanted::of(&r.config))
        }
        (false, _) | (true, Some(_)) => standalone::tear_down(ctx.ns()).map(|_| ()),
        // Attached without a record: what was set up before is unknown.
        (true, None) => return,
    };
    if let Err(e) = undone {
        warn!(
            "putting the kernel side of standalone mode (nftables table ip {}, the LAN's \
             accept_local and rp_filter) back as it was before this attach: {e:#}; \
             `router-ctl status` and `doctor` show what is set up",
            standalone::TABLE
        );
    }
}

/// The admit mode of an attach or an `apply` file that states none: the
/// attached router's (its pinned configuration's, else its record's, which
/// outlives a reboot that took the pins), else the mode of the router last
/// detached here (a detach for a resize or a layout-changing upgrade), so
/// attaching again or applying a file written before the mode existed
/// never switches a standalone router to offload mode (and its LAN flows
/// to a kernel that may have no NAT rule); offload mode for a router never
/// attached. `how_to_choose` names the option or key that states it.
pub fn unstated_admit(ctx: &Ctx, how_to_choose: &str) -> AdmitMode {
    let default = AdmitMode::default_for_attach();
    let (admit, whose) = if let Some(admit) = attached_mode(ctx) {
        (admit, "the attached router's mode")
    } else if let Some(admit) = state::last_mode(ctx.ns()) {
        (admit, "the mode the router had when it was detached")
    } else {
        return default;
    };
    if admit != default {
        println!(
            "keeping {whose}, admit {} ({how_to_choose} chooses one)",
            admit.name()
        );
    }
    admit
}

/// What standalone mode masqueraded to before this attach that `desired`
/// moves away from.
#[derive(Debug, Default, PartialEq, Eq)]
struct MasqueradeMove {
    /// The old addresses: the pinned configuration's and the record's (one
    /// ahead of the other after a replace or a daemon's follow cut short),
    /// each once, never the new one nor none (0.0.0.0).
    olds: Vec<Ipv4Addr>,
    /// Whether the data path itself moves now (its pinned address is an
    /// old one): only then do its NAT mappings go, which are otherwise the
    /// new address's already.
    data_path_moves: bool,
}

/// [`MasqueradeMove`] from the pinned configuration `pinned`, the record
/// `record` and the configuration `desired`.
fn masquerade_moved_from(
    pinned: Option<Config>,
    record: Option<&State>,
    desired: &RouterConfig,
) -> MasqueradeMove {
    if desired.admit != AdmitMode::Xdp {
        return MasqueradeMove::default();
    }
    // None (0.0.0.0) where there is no standalone mode's address.
    let pinned = pinned
        .filter(|c| c.admit == router_common::maps::Admit::Xdp as u8)
        .map_or(Ipv4Addr::UNSPECIFIED, |c| c.wan_addr.into());
    let recorded = record
        .filter(|r| r.config.admit == AdmitMode::Xdp)
        .map_or(Ipv4Addr::UNSPECIFIED, |r| r.config.wan_addr);
    let olds: Vec<Ipv4Addr> =
        crate::conntrack::old_addresses(pinned, recorded, desired.wan_addr).collect();
    MasqueradeMove {
        data_path_moves: olds.contains(&pinned),
        olds,
    }
}

/// Ends what standalone mode's masquerade to the old addresses of `moved`
/// left, once the configuration says another (as the daemon's follow
/// does): the NAT mappings if the data path moved (after the configuration
/// changed, so a failed attach leaves its flows their mappings; a flow
/// opened in between loses its mapping, not its entries), the XDP flows
/// and the kernel slow path's
/// connections translated to them, whose replies could not come back and
/// which a LAN host that keeps sending would keep alive, the old address
/// on the wire. Warns on a failure (the router is attached by then).
fn end_masquerade_to(ctx: &Ctx, moved: &MasqueradeMove) {
    if moved.data_path_moves
        && let Err(e) = crate::conntrack::clear_mappings(&ctx.maps())
    {
        warn!("clearing the NAT mappings of the old WAN address: {e:#}");
    }
    for &old in &moved.olds {
        let xdp = crate::conntrack::remove_translated_to(&ctx.maps(), old.octets());
        let kernel = crate::conntrack::end_kernel_flows_translated_to(old);
        match (xdp, kernel) {
            (Ok(0), Ok(0)) => {}
            (Ok(x), Ok(k)) => println!(
                "ended {x} XDP flows and {k} slow-path connections translated to {old}, the \
                 WAN address masqueraded to before"
            ),
            (x, k) => warn!(
                "ending the flows translated to {old}, the WAN address masqueraded to before, \
                 failed ({}); `router-ctl conntrack flush` ends the XDP flows, the kernel's end \
                 with their timeouts",
                [
                    x.err().map(|e| format!("XDP: {e:#}")),
                    k.err().map(|e| format!("kernel: {e}"))
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join("; ")
            ),
        }
    }
}

/// The configuration `desired`, its WAN address (`--wan-addr auto`) and
/// the interfaces' MACs read again: a daemon may have followed a new one
/// since they were resolved, before the lock (an attach that waited for
/// it would write the old one back).
fn with_addresses_now(mut desired: RouterConfig) -> RouterConfig {
    if desired.wan_addr_auto
        && let Ok(addrs) = crate::netlink::ipv4_addrs(&desired.wan)
    {
        desired.wan_addr = addrs.first().copied().unwrap_or(Ipv4Addr::UNSPECIFIED);
    }
    if let Ok(m) = crate::netlink::mac(&desired.lan, desired.lan_ifindex) {
        desired.lan_mac = m;
    }
    if let Ok(m) = crate::netlink::mac(&desired.wan, desired.wan_ifindex) {
        desired.wan_mac = m;
    }
    desired
}

/// The admit mode of the router attached here, if any: its pinned
/// configuration's, else its record's.
pub fn attached_mode(ctx: &Ctx) -> Option<AdmitMode> {
    mode_of(
        ctx.maps().read_config().ok(),
        state::load(ctx.ns()).ok().flatten().as_ref(),
    )
}

/// [`attached_mode`] from the pinned configuration `pinned` and the
/// attach record `record`, as read.
pub fn mode_of(pinned: Option<Config>, record: Option<&State>) -> Option<AdmitMode> {
    // An all-zero CONFIG (a detach cut short after clearing it) configures
    // nothing; its `admit` byte reads as xdp.
    let pinned = pinned.filter(|c| c.lan_ifindex != 0).map(|c| {
        if c.admit == AdmitMode::Xdp.to_map() as u8 {
            AdmitMode::Xdp
        } else {
            AdmitMode::Kernel
        }
    });
    pinned.or_else(|| record.map(|r| r.config.admit))
}

/// What `attach` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Attached,
    Replaced,
    Unchanged,
}

/// What a standalone attach looks at on the host first: the forward rules
/// it would bypass (refused unless forced), the router's own local ports
/// and source NAT rules (warned of). The forward chains it bypasses, as
/// asked ([`check_firewall`]); none in offload mode, which looks at none.
fn check_standalone_host(a: &AttachArgs, desired: &config::RouterConfig) -> Result<Vec<String>> {
    if desired.admit != AdmitMode::Xdp {
        return Ok(Vec::new());
    }
    let ruleset = standalone::Ruleset::read();
    let bypasses = check_firewall(
        a.forward_rules,
        &ruleset,
        a.bypass_how
            .as_deref()
            .unwrap_or("pass --bypass-forward-rules to bypass them anyway"),
    )?;
    let ports = doctor::local_ports_now(
        (desired.port_min, desired.port_max),
        desired.kernel_nat_ports,
    );
    if ports.level != doctor::Level::Ok {
        warn!("{}", ports.line());
    }
    let own_nat = standalone::foreign_source_nat(&ruleset);
    if desired.kernel_nat_ports.is_some() && !own_nat.is_empty() {
        warn!("{}", standalone::source_nat_message(&own_nat));
    }
    Ok(bypasses)
}

/// Attaches, replaces, or finds nothing to do. `forwards` are put into a
/// freshly created rule map before the fast path turns on (apply).
pub fn attach(
    ctx: &Ctx,
    a: &AttachArgs,
    forwards: &[(PortForwardKey, PortForwardTarget)],
) -> Result<Outcome> {
    attach_held(ctx, a, forwards).map(|held| held.outcome)
}

/// What an attach did, with the router's lock and the blocked signals it
/// held, so the caller can finish a change of its own under them (an
/// `apply`'s rule sync: a signal or another router-ctl between the two
/// would leave the new configuration with the old file's port forwards).
pub struct AttachHeld {
    pub outcome: Outcome,
    /// Held with the signals held off ([`state::Lock::holding_signals`]).
    _lock: state::Lock,
}

/// [`attach`], returning its lock and blocked signals held.
pub fn attach_held(
    ctx: &Ctx,
    a: &AttachArgs,
    forwards: &[(PortForwardKey, PortForwardTarget)],
) -> Result<AttachHeld> {
    let desired = config::resolve(a).map_err(|e| e.to_error(e.message.clone()))?;
    config::warn_standalone_only(a);
    let standalone_mode = desired.admit == AdmitMode::Xdp;
    let obj = Object::load(a.object.as_deref())?;
    ensure_bpffs()?;
    // Read-only checks before the lock. First what this router cannot do
    // in place (a resize, another XDP mode: a detach), which the firewall
    // check would otherwise hide; then the firewall, whose tools may wait
    // for their own locks (`iptables -w`): not while holding ours with
    // SIGINT and SIGTERM blocked.
    let seen = inspect(&ctx.pin_dir);
    if seen.any_pins() {
        replace::preflight(ctx, a, &desired, &obj, &seen)?;
    }
    let bypassed_chains = check_standalone_host(a, &desired)?;
    let lock = state::lock(ctx.ns())?.holding_signals();
    let desired = with_addresses_now(desired);
    detach::gc_tmp(ctx);
    let mut running = inspect(&ctx.pin_dir);
    // An interface deleted and made anew gets its new link first, keeping
    // the maps; the rest of the attach then sees it attached.
    if running.any_pins()
        && replace::gone_links(&running).contains(&true)
        && let Some(said) = relink::relink_gone(ctx, a.force, &fresh::force_how(a))?
    {
        println!("{said}");
        running = inspect(&ctx.pin_dir);
    }
    let record = state::load(ctx.ns()).unwrap_or_else(|e| {
        warn!("ignoring the attach record: {e:#}");
        None
    });
    // A switch from standalone mode in place leaves XDP's own flows in the
    // table (`warn_flows_admitted_by_xdp`); only then is it walked.
    let was_standalone =
        running.any_pins() && mode_of(running.config, record.as_ref()) == Some(AdmitMode::Xdp);
    // Again under the lock: another router-ctl may have changed the router.
    if running.any_pins() {
        replace::preflight(ctx, a, &desired, &obj, &running)?;
    }
    if standalone_mode {
        // Before the fast path turns on: its first packets towards
        // unresolved neighbours need the sysctls, what it passes the table.
        if let Err(e) = standalone::set_up(ctx.ns(), &standalone::Wanted::of(&desired)) {
            undo_standalone_set_up(ctx, running.any_pins(), record.as_ref());
            return Err(e);
        }
    }
    let moved_from = masquerade_moved_from(running.config, record.as_ref(), &desired);
    let outcome = if running.any_pins() {
        let before = record.clone();
        match replace::replace_or_keep(ctx, a, &desired, &obj, &running, record) {
            Ok(o) => o,
            Err(e) => {
                // Undone only if the replace failed before its journal (the
                // record unchanged): past it, the new configuration may be
                // live, and the next attach finishes the replace with the
                // kernel side it needs.
                let journaled = state::load(ctx.ns()).ok().flatten() != before;
                if standalone_mode && !journaled {
                    undo_standalone_set_up(ctx, true, before.as_ref());
                }
                return Err(e);
            }
        }
    } else {
        if record.is_some() {
            warn!(
                "the attach record says the router was attached, but its pins are gone \
                 (a reboot or bpffs unmounted?); attaching afresh"
            );
        }
        if let Err(e) = fresh::fresh(ctx, a, &desired, &obj, forwards) {
            if standalone_mode && let Err(t) = standalone::tear_down(ctx.ns()) {
                warn!("undoing the kernel side of standalone mode: {t:#}");
            }
            return Err(e);
        }
        Outcome::Attached
    };
    // Past the point where the router is attached: a failure only warns
    // (an error would tell `apply` the attach did not happen).
    record_forward_rules_answer(ctx, bypassed_chains);
    end_masquerade_to(ctx, &moved_from);
    if !standalone_mode {
        match standalone::tear_down(ctx.ns()) {
            Ok(true) => {
                info!("offload mode: removed standalone mode's kernel slow-path table and sysctls");
            }
            Ok(false) => {}
            Err(e) => warn!(
                "offload mode is on, but undoing standalone mode's kernel side failed: {e:#}; \
                 check `nft list table ip {}` and the LAN's accept_local and rp_filter, and \
                 remove that record file once they are as you want them",
                standalone::TABLE
            ),
        }
        if was_standalone && outcome != Outcome::Attached {
            warn_flows_admitted_by_xdp(ctx);
        }
    }
    // After the configuration turned the fast path on: until then frames
    // to a virtual MAC go to the kernel, which forwards them too.
    say_virtual_macs(ctx, &desired);
    Ok(AttachHeld {
        outcome,
        _lock: lock,
    })
}

/// Writes the virtual MACs of the attached interfaces and says which. Past
/// the point where the router is attached, so a failure here only warns:
/// an error would tell the caller (and `apply`, which would then skip the
/// rules) that the attach did not happen. Frames to a virtual MAC then go
/// to the kernel until the map is written.
fn say_virtual_macs(ctx: &Ctx, desired: &RouterConfig) {
    match sync_virtual_macs(ctx, [desired.lan_ifindex, desired.wan_ifindex]) {
        Ok(virtual_macs) => {
            for v in &virtual_macs {
                println!("forwarding frames to the virtual MAC {}", v.describe());
            }
        }
        Err(e) => warn!(
            "{e:#}; frames to a VRRP virtual MAC (keepalived use_vmac) go to the kernel until \
             `router-ctl run` writes them (at its start and at each link or address change) or \
             attach runs again"
        ),
    }
}

/// Offload mode on a router that ran standalone: the data path carries
/// every hit of its table whatever the mode, so the flows XDP admitted
/// itself stay on the fast path, past the firewall now in charge, until
/// they idle out. They are kept (the switch is in place, as the rest of
/// the table is, and removing them would break their connections as a
/// detach does); the user is told, with the command that ends them now.
fn warn_flows_admitted_by_xdp(ctx: &Ctx) {
    match crate::conntrack::OnFastPath::read(&ctx.maps()) {
        Ok(on) => {
            if let Some(w) = on.admitted_warning() {
                warn!("{w}");
            }
        }
        Err(e) => warn!(
            "could not count the flows XDP admitted in standalone mode ({e:#}); any there are \
             bypass the firewall until they idle out (`router-ctl conntrack list`), and \
             `router-ctl conntrack flush` ends them"
        ),
    }
}

/// The VRRP virtual MACs of the attached interfaces, written into the
/// pinned map.
fn sync_virtual_macs(ctx: &Ctx, attached: [u32; 2]) -> Result<Vec<vmac::VirtualMac>> {
    let virtual_macs = vmac::current(attached)?;
    vmac::sync(&ctx.maps(), &virtual_macs)
        .context("writing the VRRP virtual MACs (keepalived use_vmac) into the data path")?;
    Ok(virtual_macs)
}

/// Standalone mode bypasses netfilter's forward chains: refuses when the
/// router has forward rules or a drop policy (`ruleset`'s, and
/// iptables-legacy's), or when they could not be read (a firewall not
/// looked at is not known to be absent), unless `rules` says to bypass
/// them, naming `bypass_how` (the way this command's user does that).
/// The chains there were, bypassed as asked (as [`ForwardChain`]
/// describes them).
///
/// [`ForwardChain`]: standalone::ForwardChain
pub fn check_firewall(
    rules: ForwardRules,
    ruleset: &standalone::Ruleset,
    bypass_how: &str,
) -> Result<Vec<String>> {
    if rules == ForwardRules::Checked {
        return Ok(Vec::new());
    }
    let (chains, notes) = standalone::forward_chains(ruleset);
    if !chains.is_empty() {
        if rules == ForwardRules::Refuse {
            bail!(Unretryable(standalone::bypass_message(&chains, bypass_how)));
        }
        warn!("{}", standalone::bypassing_message(&chains));
    }
    let bypassed: Vec<String> = chains
        .iter()
        .map(standalone::ForwardChain::describe)
        .collect();
    if notes.is_empty() {
        return Ok(bypassed);
    }
    let why = notes
        .iter()
        .map(|n| n.why.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    if rules != ForwardRules::Refuse {
        warn!(
            "the router's forward rules could not all be checked ({why}); standalone mode \
             bypasses any it has, as asked (offload mode, --admit kernel, keeps them in \
             charge)"
        );
        return Ok(bypassed);
    }
    let msg = format!(
        "the router's forward rules could not all be checked ({why}); standalone mode \
         (--admit xdp) would bypass any it has. Fix: make them readable, use offload mode \
         (--admit kernel), or {bypass_how}"
    );
    // A tool missing stays missing; a failed run (a firewall reload at
    // boot) may pass, and the service's next start tries again.
    if notes.iter().any(|n| n.transient) {
        bail!("{msg}");
    }
    bail!(Unretryable(msg))
}

/// A random per-attach seed for the SNAT port choice.
fn random_u32() -> Result<u32> {
    let mut buf = [0u8; 4];
    // SAFETY: buf is valid for 4 bytes.
    let n = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if usize::try_from(n).ok() != Some(buf.len()) {
        use std::io::Read as _;
        fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut buf))
            .context("reading random bytes for the port hash seed")?;
    }
    Ok(u32::from_ne_bytes(buf))
}

/// `native` or `generic`, as the record and the messages say it.
fn xdp_mode_name(m: XdpMode) -> &'static str {
    if m == XdpMode::Skb {
        "generic"
    } else {
        "native"
    }
}

/// A new attach record, attached now, nothing pending.
fn new_record(
    ctx: &Ctx,
    a: &AttachArgs,
    desired: &RouterConfig,
    obj: &Object,
    lan_mode: &str,
    wan_mode: &str,
    prog_id: u32,
) -> State {
    State {
        format: state::FORMAT,
        netns: ctx.netns.clone(),
        pin_dir: ctx.pin_dir.display().to_string(),
        config: desired.clone(),
        requested_mode: a.mode.name().to_owned(),
        lan_mode: lan_mode.to_owned(),
        wan_mode: wan_mode.to_owned(),
        object: obj.id.clone(),
        prog_id,
        attached_at: clock::now_unix(),
        replaced_at: None,
        replacements: 0,
        pending: None,
        // Written by `attach` once the router is attached.
        bypasses_forward_rules: false,
        bypassed_forward_chains: Vec::new(),
        netns_inode: None,
    }
}

/// Keeps in the attach record which forward chains this attach bypassed as
/// asked ([`State::bypassed_forward_chains`]; none where there were none:
/// rules added later are then reported, as are chains added or changed
/// after a bypass), also when nothing else changed. A failure only warns:
/// the router is attached.
fn record_forward_rules_answer(ctx: &Ctx, chains: Vec<String>) {
    let Ok(Some(mut r)) = state::load(ctx.ns()) else {
        return;
    };
    let bypasses = !chains.is_empty();
    if r.bypasses_forward_rules == bypasses && r.bypassed_forward_chains == chains {
        return;
    }
    r.bypasses_forward_rules = bypasses;
    r.bypassed_forward_chains = chains;
    if let Err(e) = state::save(ctx.ns(), &r) {
        warn!(
            "writing the attach record: {e:#}; `status` may report the forward rules as \
             bypassed unasked until the next attach"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The old addresses of an attach are the pinned configuration's and
    /// the record's, each once, never the new one nor none; the mappings
    /// go only when the data path itself moves.
    #[test]
    fn a_masquerade_move_takes_the_pinned_and_the_recorded_address() {
        let record = |addr: [u8; 4]| {
            let text = r#"{"format": 1, "netns": "rtr", "pin_dir": "/sys/fs/bpf/xdp-router/rtr",
              "config": {"lan": "lan0", "wan": "wan0", "lan_ifindex": 2, "wan_ifindex": 3,
                "wan_addr": "203.0.113.1", "port_min": 1024, "port_max": 65535,
                "max_flows": 1000, "timeouts": {"tcp-syn-sent": 120,
                  "tcp-established": 432000, "tcp-fin-wait": 120, "tcp-closed": 10,
                  "udp-unreplied": 30, "udp-replied": 120, "icmp": 7}},
              "requested_mode": "auto", "lan_mode": "native", "wan_mode": "native",
              "object": {"sha256": "ab", "ctl_version": "0.1.0", "source": "embedded"},
              "prog_id": 42, "attached_at": 1700000000, "replaced_at": null,
              "replacements": 0, "pending": null}"#;
            let mut s: State = serde_json::from_str(text).unwrap();
            s.config.admit = AdmitMode::Xdp;
            s.config.wan_addr = addr.into();
            s
        };
        let pinned = |addr: [u8; 4]| {
            Some(Config {
                admit: router_common::maps::Admit::Xdp as u8,
                wan_addr: addr,
                ..Config::default()
            })
        };
        let moved = |p: [u8; 4], r: [u8; 4], d: [u8; 4]| {
            masquerade_moved_from(pinned(p), Some(&record(r)), &record(d).config)
        };
        let (a, b, c, none) = ([203, 0, 113, 1], [203, 0, 113, 2], [203, 0, 113, 3], [0; 4]);
        let m = |olds: &[[u8; 4]], data_path_moves| MasqueradeMove {
            olds: olds.iter().map(|&o| Ipv4Addr::from(o)).collect(),
            data_path_moves,
        };
        assert_eq!(moved(a, a, b), m(&[a], true), "a new address");
        assert_eq!(moved(a, a, none), m(&[a], true), "to none");
        assert_eq!(moved(none, none, a), m(&[], false), "from none");
        assert_eq!(moved(a, a, a), m(&[], false), "unchanged");
        assert_eq!(
            moved(b, a, b),
            m(&[a], false),
            "the record behind the data path"
        );
        assert_eq!(
            moved(a, b, c),
            m(&[a, b], true),
            "each ahead, on to a third"
        );
        let mut offload = record(b).config;
        offload.admit = AdmitMode::Kernel;
        assert_eq!(
            masquerade_moved_from(pinned(a), Some(&record(a)), &offload),
            m(&[], false),
            "offload mode translates nothing itself"
        );
        assert_eq!(
            masquerade_moved_from(None, None, &record(b).config),
            m(&[], false)
        );
    }

    #[test]
    fn a_firewall_that_could_not_be_read_is_refused_unless_bypassed() {
        let unread =
            standalone::Ruleset::unreadable("nftables not checked: `nft` not found", false);
        let e = check_firewall(ForwardRules::Refuse, &unread, "pass --bypass-forward-rules")
            .expect_err("an unread firewall must not count as none");
        let msg = format!("{e:#}");
        assert!(
            msg.contains("`nft` not found") && msg.contains("pass --bypass-forward-rules"),
            "{msg}"
        );
        assert!(
            e.downcast_ref::<Unretryable>().is_some(),
            "not exit 78: {msg}"
        );
        // A run of nft that failed may pass: refused, but not for good.
        let failed = standalone::Ruleset::unreadable(
            "nftables not checked: nft -j -t list ruleset failed: Interrupted system call",
            true,
        );
        let e = check_firewall(ForwardRules::Refuse, &failed, "pass --bypass-forward-rules")
            .expect_err("an unread firewall must not count as none");
        assert!(e.downcast_ref::<Unretryable>().is_none(), "exit 78: {e:#}");
        check_firewall(ForwardRules::Bypass, &unread, "pass --bypass-forward-rules")
            .expect("bypassed");
        check_firewall(
            ForwardRules::Checked,
            &unread,
            "pass --bypass-forward-rules",
        )
        .expect("checked before");
    }
}
