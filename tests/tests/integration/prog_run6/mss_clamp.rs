//! TCP MSS clamping of IPv6 SYNs (standalone mode, `attach --clamp-mss`)
//! through `BPF_PROG_RUN`: 60 bytes of headers, not IPv4's 40, and the
//! TCP checksum (with IPv6's pseudo-header) kept right; the expected frames
//! are built from scratch with the MSS they should carry.

use router_common::maps::IPPROTO_TCP;
use router_common::mss::{CLAMP_OFF, CLAMP_PMTU};
use tests::frames::{TCP_SYN, Tcp};
use tests::v6::{CLIENT6, SERVER6, o};

use super::*;

/// MSS `mss`, SACK permitted, timestamps, NOP, window scale 7.
fn options(mss: u16) -> Vec<u8> {
    let m = mss.to_be_bytes();
    vec![
        2, 4, m[0], m[1], 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
    ]
}

/// Over a WAN of 1400 bytes (LAN 1500): a LAN host's SYN advertising 1440
/// leaves with 1340, the server's SYN-ACK reaches it with 1340; with
/// clamping off both keep 1440 (the SYN of another flow).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn ipv6_syns_are_clamped_to_the_narrower_link() {
    let env = topology();
    env.t.exec_ok(
        tests::Ns::Router,
        &["ip", "link", "set", tests::WAN_IF, "mtu", "1400"],
    );
    let mut cfg = config(&env, Admit::Xdp);
    cfg.mss_clamp_mtu = CLAMP_PMTU;
    with_router(&env, cfg, |r| {
        let (lan, wan) = (r.lan(), r.wan());
        let (c, s) = (o(CLIENT6), o(SERVER6));
        let syn = Tcp::new(40000, 443, TCP_SYN).options(&options(1440));
        r.redirect(
            "SYN out, MSS 1440",
            &from_client(&env, &Ipv6::tcp(c, s, &syn)),
            lan,
            &to_server(&env, &Ipv6::tcp(c, s, &syn.clone().options(&options(1340)))),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound, Counter::TcpMssClamped],
        );
        let syn_ack = Tcp::syn_ack_to(&syn).options(&options(1440));
        r.redirect(
            "SYN-ACK in, MSS 1440",
            &from_server(&env, &Ipv6::tcp(s, c, &syn_ack)),
            wan,
            &to_client(
                &env,
                &Ipv6::tcp(s, c, &syn_ack.clone().options(&options(1340))),
            ),
            Counter::Fwd6Inbound,
            &[Counter::TcpMssClamped],
        );
        let mut off = cfg;
        off.mss_clamp_mtu = CLAMP_OFF;
        r.0.configure(&off);
        let other = Tcp::new(40001, 443, TCP_SYN).options(&options(1440));
        let p = Ipv6::tcp(c, s, &other);
        r.redirect(
            "off: SYN out as sent",
            &from_client(&env, &p),
            lan,
            &to_server(&env, &p),
            Counter::Fwd6Outbound,
            &[Counter::Flow6NewOutbound],
        );
        assert_eq!(
            r.conntrack6()
                .keys()
                .filter(|k| k.proto == IPPROTO_TCP)
                .count(),
            4,
            "two TCP flows, two entries each"
        );
    });
}
