//! `status`: what is attached where, in which mode, since when, which
//! object, how full the maps are, and whether anything is wrong (pins lost
//! after a reboot, an interrupted attach or replace, a foreign program).

use std::{fmt::Write as _, net::Ipv4Addr};

use router_common::maps::{MAX_PINHOLES6, MAX_PORT_FORWARDS, VirtualMacKey};
use serde_json::{Value, json};

use crate::{
    clock::{format_age, format_time, now_unix},
    config,
    ctx::Ctx,
    daemon, forward,
    inspect::{Running, inspect},
    maps::PinnedMaps,
    netlink,
    object::Object,
    pins::LINK_PINS,
    standalone,
    state::{self, State},
    vmac,
};

/// Exit code of `status` when nothing is attached.
pub const EXIT_NOT_ATTACHED: i32 = 3;

/// Exit code of `status` while another router-ctl changes the router
/// (`EX_TEMPFAIL` of sysexits.h: look again).
pub const EXIT_CHANGING: i32 = 75;

/// The verdict on what `inspect` found and the record says.
#[must_use]
#[expect(
    clippy::too_many_lines,
    reason = "one linear sequence of checks or steps, in order"
)]
pub fn diagnose(
    running: &Running,
    record: Option<&State>,
    tmp: bool,
) -> (&'static str, Vec<String>) {
    let mut problems = Vec::new();
    if tmp {
        problems.push(
            "an interrupted attach left a temporary pin directory (traffic is on the kernel \
             path); the next attach or detach removes it"
                .to_owned(),
        );
    }
    if !running.any_pins() {
        return match record {
            Some(r) => {
                problems.insert(
                    0,
                    format!(
                        "PINS LOST: the router was attached to {} and {} (at {}) but its pins \
                         are gone (a reboot, or bpffs unmounted): the fast path is NOT running \
                         and traffic takes the kernel path; run `router-ctl attach` or \
                         `router-ctl apply FILE` again (or `router-ctl detach` to forget it)",
                        r.config.lan,
                        r.config.wan,
                        format_time(r.attached_at)
                    ),
                );
                ("pins_lost", problems)
            }
            None => ("not_attached", problems),
        };
    }
    if !running.complete() {
        let missing: Vec<&str> = PinnedMaps::required()
            .filter(|m| !running.maps_present.contains(m))
            .chain(
                LINK_PINS
                    .iter()
                    .copied()
                    .filter(|l| running.link(l).is_none()),
            )
            .collect();
        problems.insert(
            0,
            format!(
                "pins incomplete (missing or unreadable: {}); run `router-ctl detach` and attach \
                 again",
                missing.join(", ")
            ),
        );
        return ("incomplete", problems);
    }
    if let Some(e) = &running.config_error {
        problems.insert(
            0,
            format!(
                "this router-ctl cannot read the pinned configuration ({e}): the router was \
                 attached by another build whose map layouts differ, and its program keeps \
                 running; use that build's router-ctl, or `router-ctl detach` and attach again \
                 to switch to this one"
            ),
        );
        return ("other_build", problems);
    }
    if let Some(m) = &running.layout_mismatch {
        problems.insert(
            0,
            format!(
                "the router was {}; its program keeps running, but `stats`, `metrics` and a \
                 live replace (the service's start) refuse its maps; `router-ctl detach` resets \
                 the fast path's flows",
                crate::inspect::other_build_message(m)
            ),
        );
        return ("other_build", problems);
    }
    if !running.configured() {
        problems.insert(
            0,
            "not configured: an attach or detach was interrupted; every packet goes to the \
             kernel path; run `router-ctl attach` again (or detach)"
                .to_owned(),
        );
        return ("unconfigured", problems);
    }
    let ids = running.prog_ids();
    if ids.len() == 2 && ids[0] != ids[1] {
        problems.insert(
            0,
            format!(
                "inconsistent: the LAN link runs program {} and the WAN link program {} (an \
                 interrupted replace); run `router-ctl attach` again to finish it",
                ids[0], ids[1]
            ),
        );
        return ("inconsistent", problems);
    }
    // A deleted interface leaves its link detached (ifindex 0, no name
    // left to read): named from the record.
    let recorded = |role: usize| {
        record.map(|r| match role {
            0 => r.config.lan.as_str(),
            _ => r.config.wan.as_str(),
        })
    };
    for (role, pin) in LINK_PINS.iter().enumerate() {
        if let Some(l) = running.link(pin)
            && l.mode.is_none()
        {
            let name = l.iface.as_deref().or(recorded(role)).unwrap_or("?");
            problems.push(if l.info.ifindex == 0 {
                format!(
                    "{name} is gone: its XDP link to program {} is detached; once an interface \
                     of that name is back, `router-ctl run` gives it a new link (or \
                     `router-ctl attach` does), the flows kept",
                    l.info.prog_id
                )
            } else {
                format!(
                    "{name} (ifindex {}) does not run the link's program {}: is the interface \
                     gone?",
                    l.info.ifindex, l.info.prog_id
                )
            });
        }
    }
    let links: Vec<_> = LINK_PINS.iter().filter_map(|p| running.link(p)).collect();
    if let [lan, wan] = links.as_slice()
        && let Some(p) = mixed_modes(
            (lan.iface.as_deref().unwrap_or("?"), lan.mode),
            (wan.iface.as_deref().unwrap_or("?"), wan.mode),
        )
    {
        problems.push(p);
    }
    let added_maps = running.maps_added_later_missing();
    if !added_maps.is_empty() {
        problems.push(format!(
            "{} not pinned (the router was attached by an earlier router-ctl: keepalived \
             use_vmac's virtual MACs go the slow way, a flow left to the kernel's NAT may move \
             to XDP's at a replace, connections routed by their mark stay in the kernel, and \
             neighbours only the fast path uses are not re-validated); run `router-ctl attach` \
             again: a live replace creates them",
            added_maps.join(", ")
        ));
    }
    match record {
        None => problems.push(
            "no attach record (interrupted attach, or the record was removed); run \
             `router-ctl attach` again to write it"
                .to_owned(),
        ),
        Some(r) => {
            if r.pending.is_some() {
                problems.push(
                    "a replace was interrupted after it started; run `router-ctl attach` again"
                        .to_owned(),
                );
            } else if ids.first() != Some(&r.prog_id) {
                problems.push(format!(
                    "the links run program {} but the record says {}; run `router-ctl attach` \
                     again",
                    ids.first().copied().unwrap_or(0),
                    r.prog_id
                ));
            }
        }
    }
    if problems.is_empty() {
        ("attached", problems)
    } else {
        ("degraded", problems)
    }
}

/// What on the host keeps an attached router from forwarding: an
/// interface down or gone, IPv4 forwarding off on one (the FIB lookups of
/// XDP then say so, `pass_fib_forwarding_disabled`, and the kernel
/// forwards nothing either), standalone mode's masquerade address no
/// longer the WAN's (replies to it do not come back).
fn host_problems(c: &config::RouterConfig) -> Vec<String> {
    let mut found = Vec::new();
    for (role, name, ifindex) in [
        ("LAN", &c.lan, c.lan_ifindex),
        ("WAN", &c.wan, c.wan_ifindex),
    ] {
        match crate::netlink::link(ifindex) {
            Ok(l) if l.up => {}
            Ok(_) => {
                found.push(format!(
                    "{role} interface {name} is down: nothing crosses it (`ip link set {name} \
                     up`)"
                ));
                continue;
            }
            // Gone (deleted; one of the name that came back is another
            // interface): the link's own problem says what to do.
            Err(_) => continue,
        }
        let forwarding =
            std::fs::read_to_string(format!("/proc/sys/net/ipv4/conf/{name}/forwarding"));
        if let Some(p) = forwarding_problem(name, forwarding.ok().as_deref()) {
            found.push(p);
        }
    }
    found.extend(wan_addr_problem(c));
    found
}

/// What is wrong with the address standalone mode masquerades to, as the
/// router's configuration `c` records it, against the WAN's addresses now
/// (`status` and the status page): only for an address attach took from
/// the WAN (`--wan-addr auto`, which the daemon follows); one given by
/// hand may be routed to the router.
pub fn wan_addr_problem(c: &config::RouterConfig) -> Option<String> {
    if c.admit != config::AdmitMode::Xdp || !c.wan_addr_auto {
        return None;
    }
    let has = crate::netlink::ipv4_addrs(&c.wan).ok()?;
    wan_addr_mismatch(&c.wan, c.wan_addr, &has)
}

/// What is wrong with standalone mode masquerading to `masquerading`
/// (0.0.0.0: none) while the WAN `wan` has the IPv4 addresses `has`.
fn wan_addr_mismatch(wan: &str, masquerading: Ipv4Addr, has: &[Ipv4Addr]) -> Option<String> {
    match has.first() {
        None if masquerading.is_unspecified() => Some(format!(
            "{wan} has no IPv4 address (a DHCP lease lost, or still to come?): nothing is \
             masqueraded and what the LAN sends to the WAN over IPv4 is dropped until it has \
             one, which `router-ctl run` follows"
        )),
        Some(now) if masquerading.is_unspecified() => Some(format!(
            "{wan} has the IPv4 address {now}, but the router masquerades to none (it had \
             none): `router-ctl run` follows it (is the daemon running?), or attach again"
        )),
        _ if !has.contains(&masquerading) => Some(format!(
            "masquerading to {masquerading}, which {wan} no longer has: replies to it do not \
             come back; `router-ctl run` follows a new WAN address, or attach again \
             (--wan-addr)"
        )),
        _ => None,
    }
}

/// The problem of IPv4 forwarding off on `iface`, from the value of its
/// `net.ipv4.conf.IFACE.forwarding` (`None`: unreadable, no problem said).
fn forwarding_problem(iface: &str, value: Option<&str>) -> Option<String> {
    (value?.trim() == "0").then(|| {
        format!(
            "IPv4 forwarding is off on {iface} (net.ipv4.conf.{iface}.forwarding=0): neither \
             XDP nor the kernel forwards what comes in on it; `sysctl -w \
             net.ipv4.conf.{iface}.forwarding=1` (or net.ipv4.ip_forward=1, every interface)"
        )
    })
}

/// The problem of a router whose interfaces run different XDP modes,
/// each given as (name, mode). A native program redirects into the other
/// interface through its driver's XDP transmit, which an interface without
/// native XDP (the reason it runs generic) lacks: those frames are
/// dropped. `attach` no longer mixes the modes; a router attached so
/// before still can.
fn mixed_modes(lan: (&str, Option<&str>), wan: (&str, Option<&str>)) -> Option<String> {
    let ((native, _), (generic, _)) = match (lan.1?, wan.1?) {
        ("native", "generic") => (lan, wan),
        ("generic", "native") => (wan, lan),
        _ => return None,
    };
    Some(format!(
        "{native} runs native XDP and {generic} generic: frames the program on {native} \
         redirects into {generic} are dropped; run `router-ctl detach` and `router-ctl attach` \
         again (auto attaches both in generic mode)"
    ))
}

/// An attached router in offload mode whose daemon does not run: no flow
/// moves to its fast path (only the daemon moves them there), and those
/// there leave it as their leases end; a monitor reading the exit status
/// must see it.
fn offload_without_daemon(v: &Value) -> Option<String> {
    let healthy_else = matches!(v["state"].as_str(), Some("attached" | "degraded"));
    (healthy_else && v["admit"] == "kernel" && v["daemon"]["running"] != true).then(|| {
        format!(
            "offload mode without its daemon: no new flow is offloaded, and {}; start it \
             (`systemctl start xdp-router`, or `router-ctl run`)",
            daemon::without_daemon(&v["daemon"])
        )
    })
}

fn maps_json(ctx: &Ctx) -> Value {
    let mut m = serde_json::Map::new();
    let maps = ctx.maps();
    // Only entries and capacity are shown here: no counters needed.
    if let Some(t) = crate::table_fill::table_use(&maps, &[]) {
        m.insert(
            "conntrack".into(),
            json!({"entries": t.entries, "capacity": t.capacity}),
        );
        if let Some(t6) = t.ipv6 {
            m.insert(
                "conntrack6".into(),
                json!({"entries": t6.entries, "capacity": t6.capacity}),
            );
        }
    }
    if let Ok(r) = forward::rules(&maps) {
        // `rules` lists IPv6 pinholes too: they have a map of their own.
        let pinholes = r.iter().filter(|r| r.family.is_some()).count();
        m.insert(
            "port_forwards".into(),
            json!({"entries": r.len() - pinholes, "capacity": MAX_PORT_FORWARDS}),
        );
        if maps.pinholes6().is_ok() {
            m.insert(
                "pinholes6".into(),
                json!({"entries": pinholes, "capacity": MAX_PINHOLES6}),
            );
        }
    }
    if let Ok(d) = maps.devices() {
        let n = d.keys().take(64).flatten().count();
        let cap = aya::maps::IterableMap::map(&d)
            .info()
            .map_or(0, |i| i.max_entries());
        m.insert("devices".into(), json!({"entries": n, "capacity": cap}));
    }
    Value::Object(m)
}

/// What is wrong with an attached standalone router's host side: its
/// kernel side changed behind its back, forward rules added since the
/// attach (which it bypasses, unless the attach said to).
fn standalone_problems(ctx: &Ctx, r: &State) -> Vec<String> {
    let mut found: Vec<String> = standalone::kernel_side_gaps(ctx.ns())
        .into_iter()
        .map(|g| {
            format!(
                "standalone mode's kernel side: {g}; a running `router-ctl run` puts it back \
                 within 15 s, else run `router-ctl attach` again"
            )
        })
        .collect();
    if let Some(accepted) = r.accepted_forward_chains() {
        found.extend(standalone::bypassed_unasked(accepted).ok().flatten());
    }
    found
}

/// `diagnosis`, or `changing` when what it found is not the attached state
/// while another process held the router's lock before it looked
/// (`held_before`) and still does: half-done is what an attach, apply or
/// detach under way looks like from outside, not a problem to act on
/// (monitoring on the exit status would fire at every reload). Held across
/// the look, not for an instant (a daemon's follow takes it that long).
fn unless_changing(
    ctx: &Ctx,
    held_before: bool,
    diagnosis: (&'static str, Vec<String>),
) -> (&'static str, Vec<String>) {
    let (verdict, _) = &diagnosis;
    if *verdict == "attached" || !held_before || !state::held_by_another(ctx.ns()) {
        return diagnosis;
    }
    (
        "changing",
        vec![format!(
            "another router-ctl is changing this router (an attach, apply or detach under way \
             holds its lock{}): look again once it is done (meanwhile: {verdict})",
            state::lock_holder(ctx.ns())
        )],
    )
}

/// The status as JSON (the `--json` output; the text is rendered from it).
#[must_use]
pub fn status_json(ctx: &Ctx) -> Value {
    let held_before = state::held_by_another(ctx.ns());
    let running = inspect(&ctx.pin_dir);
    let record = state::load(ctx.ns()).ok().flatten();
    let tmp = ctx.tmp_dir().exists();
    let (verdict, mut problems) =
        unless_changing(ctx, held_before, diagnose(&running, record.as_ref(), tmp));
    if verdict == "pins_lost" && standalone::kernel_side_left(ctx.ns()) {
        problems.push(format!(
            "standalone mode's kernel side is still set up (the nftables table ip {}, the \
             LAN's accept_local and rp_filter): an attach uses it again, `router-ctl detach` \
             removes it",
            standalone::TABLE
        ));
    }
    let now = now_unix();
    let mut v = json!({
        "state": verdict,
        "problems": problems,
        "netns": ctx.netns,
        "pin_dir": ctx.pin_dir.display().to_string(),
        "ctl_object": Object::embedded_id().version(),
    });
    let links: Vec<Value> = LINK_PINS
        .iter()
        .zip(["lan", "wan"])
        .filter_map(|(pin, role)| {
            running.link(pin).map(|l| {
                json!({
                    "role": role,
                    "name": l.iface,
                    "ifindex": l.info.ifindex,
                    "mode": l.mode,
                    "link_id": l.info.id,
                    "prog_id": l.info.prog_id,
                })
            })
        })
        .collect();
    v["links"] = Value::Array(links);
    if let Some(r) = &record {
        v["record"] = json!({
            "lan": r.config.lan,
            "wan": r.config.wan,
            "requested_mode": r.requested_mode,
            "lan_mode": r.lan_mode,
            "wan_mode": r.wan_mode,
            "attached_at": r.attached_at,
            "attached_for_secs": now.saturating_sub(r.attached_at),
            "replaced_at": r.replaced_at,
            "replacements": r.replacements,
            "version": r.object.version(),
            "object": r.object,
            "prog_id": r.prog_id,
            "config": r.config,
            "pending": r.pending,
        });
        v["admit"] = json!(r.config.admit.name());
        v["filtering"] = json!(r.config.filtering.name());
        v["daemon"] = daemon::health_json(ctx.ns());
        let mut found = Vec::new();
        if r.config.admit == config::AdmitMode::Kernel && running.configured() {
            // What the data path carries by itself: it forwards every hit
            // of its table, whatever the mode.
            let on = crate::conntrack::OnFastPath::read(&ctx.maps()).ok();
            if v["daemon"]["running"] != true {
                daemon::add_stopped(&mut v["daemon"], on.as_ref());
            }
            found.extend(on.and_then(|on| on.admitted_warning()));
        }
        if r.config.admit == config::AdmitMode::Xdp && running.any_pins() {
            found.extend(standalone_problems(ctx, r));
        }
        if running.configured() {
            found.extend(host_problems(&r.config));
        }
        if let Some(problem) = offload_without_daemon(&v) {
            found.push(problem);
        }
        if !found.is_empty() && v["state"] == "attached" {
            v["state"] = json!("degraded");
        }
        if let Some(p) = v["problems"].as_array_mut() {
            p.extend(found.into_iter().map(Value::from));
        }
    } else {
        // Detached: a daemon still running waits for the next attach.
        let d = daemon::health_json(ctx.ns());
        if d["running"] == true {
            v["daemon"] = d;
        }
    }
    if running.any_pins() {
        v["configured"] = json!(running.configured());
        v["maps"] = maps_json(ctx);
        if let Ok(macs) = vmac::pinned(&ctx.maps()) {
            v["virtual_macs"] = virtual_macs_json(&macs);
        }
    }
    v
}

/// The VRRP virtual MACs the data path accepts (keepalived `use_vmac`, this
/// router the master), sorted by interface and MAC.
fn virtual_macs_json(macs: &[(VirtualMacKey, u8)]) -> Value {
    let mut macs = macs.to_vec();
    macs.sort_unstable();
    macs.iter()
        .map(|(k, families)| {
            json!({
                "interface": netlink::ifname(k.ifindex),
                "ifindex": k.ifindex,
                "mac": netlink::mac_str(k.mac),
                "families": vmac::families_str(*families),
            })
        })
        .collect()
}

/// Who admits flows, and standalone mode's NAT settings, from the
/// record's configuration `c`.
fn admit_text(c: &Value, v: &Value) -> String {
    if c["admit"] == "kernel" {
        return "admit kernel (offload)".to_owned();
    }
    format!(
        "admit xdp (standalone), masquerade to {} ports {}-{}, filtering {}, {}",
        c["wan_addr"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .map_or_else(|| "?".to_owned(), config::masquerade_target),
        c["port_min"],
        c["port_max"],
        v["filtering"].as_str().unwrap_or("?"),
        c["mss_clamp"]
            .as_str()
            .and_then(|m| config::MssClamp::parse(m).ok())
            .map_or_else(|| "MSS clamping ?".to_owned(), config::MssClamp::describe)
    )
}

/// The human-readable rendering of [`status_json`].
#[must_use]
pub fn status_text(v: &Value) -> String {
    let mut s = String::new();
    let st = v["state"].as_str().unwrap_or("?");
    let _ = writeln!(s, "state: {st}");
    let _ = writeln!(s, "pins: {}", v["pin_dir"].as_str().unwrap_or("?"));
    if let Some(r) = v.get("record") {
        let _ = writeln!(
            s,
            "attached: {} ({} ago){}",
            format_time(r["attached_at"].as_u64().unwrap_or(0)),
            format_age(r["attached_for_secs"].as_u64().unwrap_or(0)),
            r["replaced_at"].as_u64().map_or(String::new(), |t| format!(
                ", program replaced {} time(s), last at {}",
                r["replacements"],
                format_time(t)
            ))
        );
        let _ = writeln!(
            s,
            "object: {} ({}), program id {}",
            r["version"].as_str().unwrap_or("?"),
            r["object"]["source"].as_str().unwrap_or("?"),
            r["prog_id"]
        );
        let c = &r["config"];
        let kernel_mode = c["admit"] == "kernel";
        let admit = admit_text(c, v);
        let _ = writeln!(
            s,
            "config: {admit}, table {} flows, mode asked {}",
            c["max_flows"],
            r["requested_mode"].as_str().unwrap_or("?")
        );
        let _ = writeln!(s, "{}", daemon::health_line(&v["daemon"], kernel_mode));
    }
    if let Some(links) = v["links"].as_array() {
        for l in links {
            let _ = writeln!(
                s,
                "{}: {} (ifindex {}), {} mode, link {}, program {}",
                l["role"].as_str().unwrap_or("?"),
                l["name"].as_str().map_or_else(
                    || {
                        // The record still names a deleted interface.
                        let recorded = v["record"][l["role"].as_str().unwrap_or("")].as_str();
                        format!("{} (gone)", recorded.unwrap_or("?"))
                    },
                    str::to_owned
                ),
                l["ifindex"],
                l["mode"].as_str().unwrap_or("NOT RUNNING"),
                l["link_id"],
                l["prog_id"]
            );
        }
    }
    if let Some(m) = v.get("maps").and_then(Value::as_object) {
        for (name, u) in m {
            let (e, c) = (
                u["entries"].as_u64().unwrap_or(0),
                u["capacity"].as_u64().unwrap_or(0),
            );
            #[expect(clippy::cast_precision_loss, reason = "a percentage")]
            let pct = if c == 0 {
                0.0
            } else {
                e as f64 * 100.0 / c as f64
            };
            let _ = writeln!(s, "map {name}: {e} of {c} entries ({pct:.1}%)");
        }
    }
    for m in v["virtual_macs"].as_array().into_iter().flatten() {
        let _ = writeln!(
            s,
            "virtual MAC {} on {} ({}): forwarded (VRRP master, keepalived use_vmac)",
            m["mac"].as_str().unwrap_or("?"),
            m["interface"].as_str().unwrap_or("(gone)"),
            m["families"].as_str().unwrap_or("?")
        );
    }
    if let Some(p) = v["problems"].as_array() {
        for x in p {
            let _ = writeln!(s, "problem: {}", x.as_str().unwrap_or("?"));
        }
    }
    if v.get("record").is_none() && v["daemon"]["running"] == true {
        let _ = writeln!(s, "{}", daemon::health_line(&v["daemon"], false));
    }
    if st == "not_attached" {
        let _ = writeln!(
            s,
            "not attached; `router-ctl attach LAN WAN` starts the fast path"
        );
    }
    s
}

/// Prints the status; returns the exit code: 0 attached and healthy,
/// 3 not attached, 75 while another router-ctl changes it, 1 anything
/// wrong.
pub fn status(ctx: &Ctx, json: bool) -> i32 {
    let v = status_json(ctx);
    if json {
        println!("{v}");
    } else {
        print!("{}", status_text(&v));
    }
    match v["state"].as_str() {
        Some("attached") => 0,
        Some("not_attached") => EXIT_NOT_ATTACHED,
        Some("changing") => EXIT_CHANGING,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wan_address_problem_for_each_mismatch() {
        let (a, b, none) = (
            Ipv4Addr::new(203, 0, 113, 1),
            Ipv4Addr::new(203, 0, 113, 9),
            Ipv4Addr::UNSPECIFIED,
        );
        assert_eq!(wan_addr_mismatch("wan0", a, &[a, b]), None);
        assert_eq!(
            wan_addr_mismatch("wan0", none, &[]).map(|p| p.contains("has no IPv4 address")),
            Some(true)
        );
        let back = wan_addr_mismatch("wan0", none, &[b]).unwrap();
        assert!(
            back.contains("has the IPv4 address 203.0.113.9") && back.contains("none"),
            "{back}"
        );
        let moved = wan_addr_mismatch("wan0", a, &[b]).unwrap();
        assert!(
            moved.starts_with("masquerading to 203.0.113.1, which wan0 no longer has"),
            "{moved}"
        );
        assert!(wan_addr_mismatch("wan0", a, &[]).is_some());
    }

    #[test]
    fn offload_mode_needs_its_daemon() {
        let v = |state: &str, admit: &str, running: bool| json!({"state": state, "admit": admit, "daemon": {"running": running}});
        assert!(offload_without_daemon(&v("attached", "kernel", false)).is_some());
        assert!(offload_without_daemon(&v("attached", "kernel", true)).is_none());
        assert!(offload_without_daemon(&v("attached", "xdp", false)).is_none());
        assert!(offload_without_daemon(&v("degraded", "kernel", false)).is_some());
        // Already a problem of its own: the first one stays the verdict.
        assert!(offload_without_daemon(&v("inconsistent", "kernel", false)).is_none());
        let mut stopped = v("attached", "kernel", false);
        stopped["daemon"]["leased_flows"] = json!(3);
        stopped["daemon"]["lease_left_secs"] = json!(12);
        let p = offload_without_daemon(&stopped).unwrap();
        assert!(
            p.contains(
                "3 offloaded flow(s) stay on the fast path until their leases end (within 12 s)"
            ),
            "{p}"
        );
    }

    #[test]
    fn nothing_pinned() {
        let r = Running::default();
        assert_eq!(diagnose(&r, None, false).0, "not_attached");
    }

    /// A pinned link of program `prog_id` on interface `ifindex`.
    fn link(prog_id: u32, ifindex: u32) -> crate::inspect::LinkNow {
        crate::inspect::LinkNow {
            info: crate::bpfsys::LinkInfo {
                id: 1,
                prog_id,
                link_type: 6,
                ifindex,
            },
            iface: None,
            mode: Some("native"),
        }
    }

    /// Pins of another build (an older `CONFIG` layout): said so, with
    /// what to do, not "unconfigured".
    #[test]
    fn configuration_of_another_build() {
        let r = Running {
            maps_present: PinnedMaps::NAMES.to_vec(),
            links: vec![
                (LINK_PINS[0], Ok(link(7, 2))),
                (LINK_PINS[1], Ok(link(7, 3))),
            ],
            config: None,
            config_error: Some("invalid value size".to_owned()),
            layout_mismatch: None,
        };
        let (state, problems) = diagnose(&r, None, false);
        assert_eq!(state, "other_build");
        assert!(problems[0].contains("another build"), "{problems:?}");
        assert!(problems[0].contains("detach"), "{problems:?}");
    }

    /// A map other than CONFIG of another layout (a wider counter value,
    /// say): `other_build`, naming the map.
    #[test]
    fn counters_of_another_build() {
        use crate::lifecycle::loader::{Layout, Mismatch};
        let counters = |value_size| Layout {
            map_type: 6,
            key_size: 4,
            value_size,
            max_entries: 60,
        };
        let r = Running {
            maps_present: PinnedMaps::NAMES.to_vec(),
            links: vec![
                (LINK_PINS[0], Ok(link(7, 2))),
                (LINK_PINS[1], Ok(link(7, 3))),
            ],
            config: Some(router_common::maps::Config {
                lan_ifindex: 2,
                ..Default::default()
            }),
            config_error: None,
            layout_mismatch: Some(Mismatch {
                map: "COUNTERS",
                object: counters(16),
                pinned: counters(24),
            }),
        };
        let (state, problems) = diagnose(&r, None, false);
        assert_eq!(state, "other_build");
        assert!(
            problems[0].contains("map COUNTERS's layout differs"),
            "{problems:?}"
        );
        assert!(problems[0].contains("router-ctl detach"), "{problems:?}");
    }

    #[test]
    fn mixed_modes_are_a_problem() {
        let p = mixed_modes(("lan0", Some("native")), ("br0", Some("generic"))).unwrap();
        assert!(p.starts_with("lan0 runs native XDP and br0 generic"), "{p}");
        let p = mixed_modes(("lan0", Some("generic")), ("wan0", Some("native"))).unwrap();
        assert!(
            p.starts_with("wan0 runs native XDP and lan0 generic"),
            "{p}"
        );
        for same in ["native", "generic"] {
            assert_eq!(mixed_modes(("a", Some(same)), ("b", Some(same))), None);
        }
        // A gone interface is a problem of its own.
        assert_eq!(mixed_modes(("a", None), ("b", Some("native"))), None);
    }

    #[test]
    fn forwarding_off_is_a_problem() {
        assert!(
            forwarding_problem("lan0", Some("0\n"))
                .unwrap()
                .starts_with("IPv4 forwarding is off on lan0")
        );
        assert_eq!(forwarding_problem("lan0", Some("1\n")), None);
        assert_eq!(forwarding_problem("lan0", None), None);
    }
}
