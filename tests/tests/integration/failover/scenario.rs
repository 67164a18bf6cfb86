//! One scenario: both flows through r1, r1 fails, r2 takes over, r1
//! returns and takes the addresses back; its figures, what is asserted on
//! them, and the table of all scenarios.

use std::{
    fmt::Write as _,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use super::{
    R1, R2, Router,
    pair::Pair,
    traffic::{
        Arrivals, TCP_DOWNLOAD_PORT, TCP_PORT, TcpFlow, UDP_GAP, UDP_PORT, UdpFlow, longest_gap,
        udp_lost_in,
    },
};
use crate::ctl::{read_until, wait_for_or_show};

/// What one scenario measured.
pub(super) struct Figures {
    name: &'static str,
    /// Failure -> the backup's keepalived ran notify primary (VRRP detection).
    takeover: Duration,
    /// ... -> conntrackd's external cache committed.
    committed: Duration,
    tcp_gap: Duration,
    udp_gap: Duration,
    udp_lost_failover: u32,
    /// Packets the backup's XDP forwarded while it was master.
    backup_xdp: Option<u64>,
    failback_tcp_gap: Duration,
    failback_udp_gap: Duration,
    udp_lost_failback: u32,
    /// Packets r1's XDP forwarded after the failback.
    failback_xdp: Option<u64>,
    tcp_bytes: u64,
    udp_sent: u32,
    udp_lost: u32,
}

/// The failover half of a scenario: when r1 failed, and what followed.
struct Failover {
    at: Instant,
    at_unix: f64,
    takeover: Duration,
    committed: Duration,
    backup_xdp: Option<u64>,
}

/// The failback half: when r1 returned, the end of the scenario, and what
/// r1's XDP carried in between.
struct Failback {
    at: Instant,
    end: Instant,
    xdp: Option<u64>,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// One failover and failback with both flows running.
pub(super) fn scenario(name: &'static str, fast_path: bool, advert_int: &str) -> Figures {
    let pair = Pair::new();
    start_routers(&pair, fast_path, advert_int);
    let tcp = TcpFlow::start(&pair);
    let udp = UdpFlow::start(&pair);
    flows_through_r1(&pair, &udp, fast_path);
    let failover = fail_over(&pair, &tcp, &udp, fast_path);
    let failback = fail_back(&pair, &tcp, &udp, fast_path);
    if fast_path {
        // The router that stepped down flushes its kernel table
        // `PurgeTimeout` (15 s) later (primary-backup.sh `ctl -t`), and
        // the DESTROY events take the flows out of its XDP table.
        wait_for_or_show(
            "r2 to drop the flows it no longer carries",
            Duration::from_secs(40),
            || pair.offloaded(R2) == 0,
            || pair.ha_logs(),
        );
    }

    println!("{name}: {}", pair.timeline(failover.at_unix));
    let (tcp_bytes, tcp_arrivals) = tcp.finish();
    let (udp_sent, udp_echoed, udp_arrivals) = udp.finish();
    let (fail_at, back_at, end) = (failover.at, failback.at, failback.end);
    let f = Figures {
        name,
        takeover: failover.takeover,
        committed: failover.committed,
        tcp_gap: longest_gap(&tcp_arrivals, fail_at, back_at),
        udp_gap: longest_gap(&udp_arrivals, fail_at, back_at),
        udp_lost_failover: udp_lost_in(&udp_arrivals, fail_at, back_at),
        backup_xdp: failover.backup_xdp,
        failback_tcp_gap: longest_gap(&tcp_arrivals, back_at, end),
        failback_udp_gap: longest_gap(&udp_arrivals, back_at, end),
        udp_lost_failback: udp_lost_in(&udp_arrivals, back_at, end),
        failback_xdp: failback.xdp,
        tcp_bytes,
        udp_sent,
        udp_lost: udp_sent - udp_echoed,
    };
    check_figures(&pair, &f, fast_path);
    f
}

/// Both routers' VRRP and conntrackd, r1 master; with `fast_path` offload
/// mode on both.
fn start_routers(pair: &Pair, fast_path: bool, advert_int: &str) {
    for r in [R1, R2] {
        pair.warm_neighbours(r);
    }
    pair.start_ha(R1, advert_int);
    pair.start_ha(R2, advert_int);
    wait_for_or_show(
        "r1 to be master with both VIPs and r2 backup",
        Duration::from_secs(20),
        || {
            pair.has_vips(R1)
                && !pair.has_vips(R2)
                && !pair.notified(R1, "primary-committed").is_empty()
                && !pair.notified(R2, "backup-done").is_empty()
        },
        || pair.ha_logs(),
    );
    if fast_path {
        pair.start_fast_path(R1);
        pair.start_fast_path(R2);
    }
}

/// The flows run through r1 (on its fast path with `fast_path`), and the
/// backup knows them only in conntrackd's external cache.
fn flows_through_r1(pair: &Pair, udp: &UdpFlow, fast_path: bool) {
    wait_for_or_show(
        "UDP echoes through r1",
        Duration::from_secs(10),
        || udp.echoes() > 20,
        || pair.ha_logs(),
    );
    if fast_path {
        wait_offloaded(pair, R1);
        // About 250 packets in half a second; read until 100 went by.
        let before = pair.xdp_forwarded(R1);
        let carried = read_until(
            Duration::from_secs(5),
            || pair.xdp_forwarded(R1) - before,
            |n| *n >= 100,
        );
        assert!(
            carried >= 100,
            "r1's XDP carried only {carried} packets in 5 s"
        );
    }
    // The backup knows both flows, in conntrackd's external cache (its
    // kernel and its XDP table do not have them yet).
    wait_for_or_show(
        "r2's conntrackd to hold both flows",
        Duration::from_secs(10),
        || {
            let cache = pair.external_cache(R2);
            cache.contains(&format!("dport={TCP_PORT}"))
                && cache.contains(&format!("dport={UDP_PORT}"))
        },
        || format!("{}\n{}", pair.external_cache(R2), pair.ha_logs()),
    );
    if fast_path {
        assert_eq!(
            pair.offloaded(R2),
            0,
            "the backup offloaded flows it does not carry"
        );
    }
    std::thread::sleep(Duration::from_millis(500));
}

/// Waits (bounded) for router `r`'s XDP table to carry both flows.
fn wait_offloaded(pair: &Pair, r: Router) {
    wait_for_or_show(
        &format!("{} to offload both flows", r.role),
        Duration::from_secs(10),
        || pair.offloaded(r) >= 2,
        || pair.ha_logs(),
    );
}

/// Waits (bounded) for more than 50 arrivals after `since`.
fn wait_resumed(pair: &Pair, what: &str, arrivals: &Arrivals, since: Instant) {
    wait_for_or_show(
        what,
        Duration::from_secs(20),
        || {
            arrivals
                .lock()
                .unwrap()
                .iter()
                .filter(|&&t| t > since)
                .count()
                > 50
        },
        || pair.ha_logs(),
    );
}

/// r1 fails; r2 takes over, commits, and (with `fast_path`) offloads both
/// flows; both flows resume through it.
fn fail_over(pair: &Pair, tcp: &TcpFlow, udp: &UdpFlow, fast_path: bool) -> Failover {
    let r2_xdp0 = fast_path.then(|| pair.xdp_forwarded(R2));
    let (at, at_unix) = (Instant::now(), unix_now());
    pair.set_links(R1, false);
    wait_for_or_show(
        "r2 to take over and commit",
        Duration::from_secs(20),
        || !pair.notified(R2, "primary-committed").is_empty(),
        || pair.ha_logs(),
    );
    let takeover = Duration::from_secs_f64(pair.notified(R2, "primary-begin")[0] - at_unix);
    let committed = Duration::from_secs_f64(pair.notified(R2, "primary-committed")[0] - at_unix);
    wait_resumed(
        pair,
        "the TCP stream to resume through r2",
        &tcp.arrivals,
        at + takeover,
    );
    wait_resumed(
        pair,
        "the UDP flow to resume through r2",
        &udp.arrivals,
        at + takeover,
    );
    if fast_path {
        wait_offloaded(pair, R2);
    }
    // The flows run through r2 alone for a while (the UDP loss is counted
    // up to the failback).
    std::thread::sleep(Duration::from_secs(2));
    Failover {
        at,
        at_unix,
        takeover,
        committed,
        backup_xdp: r2_xdp0.map(|x0| xdp_carried(pair, R2, x0)),
    }
}

/// r1 returns and, preferred, takes the addresses back; both flows resume
/// through it.
fn fail_back(pair: &Pair, tcp: &TcpFlow, udp: &UdpFlow, fast_path: bool) -> Failback {
    let r1_xdp0 = fast_path.then(|| pair.xdp_forwarded(R1));
    let commits_before = pair.notified(R1, "primary-committed").len();
    let at = Instant::now();
    pair.set_links(R1, true);
    wait_for_or_show(
        "r1 to take the addresses back and commit",
        Duration::from_secs(20),
        || pair.notified(R1, "primary-committed").len() > commits_before && !pair.has_vips(R2),
        || pair.ha_logs(),
    );
    let r1_master = Instant::now();
    wait_resumed(
        pair,
        "the TCP stream to resume through r1",
        &tcp.arrivals,
        r1_master,
    );
    wait_resumed(
        pair,
        "the UDP flow to resume through r1",
        &udp.arrivals,
        r1_master,
    );
    std::thread::sleep(Duration::from_secs(2));
    let xdp = r1_xdp0.map(|x0| xdp_carried(pair, R1, x0));
    Failback {
        at,
        end: Instant::now(),
        xdp,
    }
}

/// Packets router `r`'s XDP forwarded since it counted `since`, read until
/// they reach [`MASTER_XDP_MIN`] (at most 10 s: a count over a fixed time
/// would be a rate, which a loaded machine lowers).
fn xdp_carried(pair: &Pair, r: Router, since: u64) -> u64 {
    read_until(
        Duration::from_secs(10),
        || pair.xdp_forwarded(r) - since,
        |n| *n >= MASTER_XDP_MIN,
    )
}

/// What a master's fast path must carry of the flows: at least half of the
/// UDP flow's packets of 2 s (a datagram each [`UDP_GAP`] and its echo), and
/// the TCP stream's segments on top.
const MASTER_XDP_MIN: u64 = 2 * 200;

/// The fast path carried the flows on each master, and the UDP loss is
/// bounded (the TCP stream's bytes are checked when it finishes).
fn check_figures(pair: &Pair, f: &Figures, fast_path: bool) {
    let name = f.name;
    if fast_path {
        // The backup's fast path carried the flows while it was master.
        let min = MASTER_XDP_MIN;
        assert!(
            f.backup_xdp.unwrap_or(0) >= min,
            "{name}: r2's XDP forwarded only {:?} packets as master\n{}",
            f.backup_xdp,
            pair.ha_logs()
        );
        assert!(
            f.failback_xdp.unwrap_or(0) >= min,
            "{name}: r1's XDP forwarded only {:?} packets after the failback\n{}",
            f.failback_xdp,
            pair.ha_logs()
        );
    }
    // Bounded UDP loss: the failover loses what is sent until the backup
    // notices (3 adverts plus the skew, ~3.6 s at 1 s adverts); allow 10 s
    // of datagrams. The failback is planned (r2 stays up and hands over
    // at r1's first advert): allow 2 s. Both also bound the whole flow.
    let datagrams = |d: Duration| u32::try_from(d.as_millis() / UDP_GAP.as_millis()).unwrap();
    let (failover_bound, failback_bound) = (
        datagrams(Duration::from_secs(10)),
        datagrams(Duration::from_secs(2)),
    );
    assert!(
        f.udp_lost_failover <= failover_bound && f.udp_lost <= failover_bound + failback_bound,
        "{name}: {} of {} UDP datagrams lost, {} at the failover (bound {failover_bound})\n{}",
        f.udp_lost,
        f.udp_sent,
        f.udp_lost_failover,
        pair.ha_logs()
    );
    assert!(
        f.udp_lost_failback <= failback_bound,
        "{name}: {} UDP datagrams lost at the failback (bound {failback_bound})\n{}",
        f.udp_lost_failback,
        pair.ha_logs()
    );
}

/// The figures of all scenarios as a Markdown table.
pub(super) fn report(figs: &[Figures]) -> String {
    let mut s = String::from(
        "| scenario | takeover ms | commit ms | TCP gap ms | UDP gap ms | UDP lost | backup XDP pkts | failback TCP gap ms | failback UDP gap ms | failback UDP lost | failback XDP pkts | TCP bytes (all arrived) | UDP lost / sent |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let opt = |x: Option<u64>| x.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for f in figs {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} |",
            f.name,
            ms(f.takeover),
            ms(f.committed),
            ms(f.tcp_gap),
            ms(f.udp_gap),
            f.udp_lost_failover,
            opt(f.backup_xdp),
            ms(f.failback_tcp_gap),
            ms(f.failback_udp_gap),
            f.udp_lost_failback,
            opt(f.failback_xdp),
            f.tcp_bytes,
            f.udp_lost,
            f.udp_sent,
        );
    }
    s
}

/// A download (the server sends, paced, every byte checked) through r1's
/// fast path; r1 fails while r2's conntrackd is held stopped, so r2 owns
/// the VIPs for 2 s before its commit gives it the connection (a large
/// table's commit takes that long); the server's retransmissions in that
/// window reach r2 with no conntrack entry. The firewall's input rule
/// drops them (the router's own stack would answer with a RST, which ends
/// the download at the server); after the commit the download goes on
/// through r2. Returns the bytes downloaded.
pub(super) fn download_through_a_slow_commit() -> u64 {
    let pair = Pair::new();
    start_routers(&pair, true, "0.2");
    let download = TcpFlow::download(&pair);
    wait_for_or_show(
        "r1 to offload the download",
        Duration::from_secs(10),
        || pair.offloaded(R1) >= 1,
        || pair.ha_logs(),
    );
    wait_for_or_show(
        "r2's conntrackd to hold the download",
        Duration::from_secs(10),
        || {
            pair.external_cache(R2)
                .contains(&format!("dport={TCP_DOWNLOAD_PORT}"))
        },
        || format!("{}\n{}", pair.external_cache(R2), pair.ha_logs()),
    );
    pair.signal_conntrackd(R2, "STOP");
    let at = Instant::now();
    pair.set_links(R1, false);
    wait_for_or_show(
        "r2 to take over (its commit held back)",
        Duration::from_secs(20),
        || !pair.notified(R2, "primary-begin").is_empty() && pair.has_vips(R2),
        || pair.ha_logs(),
    );
    // The server retransmits at 0.2, 0.6, 1.4, 3.0 s after the loss: with
    // 0.2 s adverts r2 takes over at ~0.7 s, so at least one lands here.
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        pair.notified(R2, "primary-committed").is_empty(),
        "r2 committed while its conntrackd was stopped"
    );
    // The window was tested: the rule dropped the server's segments in it
    // (read before the commit, which ends it).
    let rule = pair.exec_ok(
        R2.role,
        &["nft", "list", "chain", "inet", "xdp_failover", "input"],
    );
    let dropped: u64 = rule
        .split_once("counter packets ")
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no counter in r2's input chain:\n{rule}"));
    assert!(
        dropped > 0,
        "r2's input rule dropped no segment of the download before its commit (none \
         reached r2, or the rule did not match them):\n{rule}"
    );
    pair.signal_conntrackd(R2, "CONT");
    wait_for_or_show(
        "r2 to commit",
        Duration::from_secs(20),
        || !pair.notified(R2, "primary-committed").is_empty(),
        || pair.ha_logs(),
    );
    wait_resumed(
        &pair,
        "the download to resume through r2",
        &download.arrivals,
        at + Duration::from_secs(2),
    );
    download.finish().0
}
