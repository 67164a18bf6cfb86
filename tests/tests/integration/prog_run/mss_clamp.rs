//! TCP MSS clamping (standalone mode, `attach --clamp-mss`) through
//! `BPF_PROG_RUN`: a SYN's and a SYN-ACK's MSS option lowered to what the
//! narrower of the two links carries, wherever the option sits; what is
//! left as it is. Expected frames are built from scratch with the MSS they
//! should carry (checksums computed anew), so a wrong value or a wrong
//! checksum update shows in the bytes.

use router_common::mss::{CLAMP_OFF, CLAMP_PMTU};

use super::*;

/// A Linux SYN's options: MSS `mss`, SACK permitted, timestamps, NOP,
/// window scale 7.
fn linux_options(mss: u16) -> Vec<u8> {
    let m = mss.to_be_bytes();
    vec![
        2, 4, m[0], m[1], 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
    ]
}

/// `CONFIG` with `Config::mss_clamp_mtu` = `mtu`.
fn clamping(env: &ResolvedTopology, mtu: u16) -> Config {
    let mut c = config(env);
    c.mss_clamp_mtu = mtu;
    c
}

/// The router's WAN link at `mtu` bytes (`PPPoE`'s 1492 against the LAN's
/// 1500).
fn wan_mtu(env: &ResolvedTopology, mtu: u16) {
    env.t.exec_ok(
        Ns::Router,
        &["ip", "link", "set", WAN_IF, "mtu", &mtu.to_string()],
    );
}

/// A SYN from `CLIENT:sport` to `SERVER:80` with `options`.
fn syn(sport: u16, options: &[u8]) -> Ipv4 {
    Ipv4::new(
        CLIENT,
        SERVER,
        Tcp::new(sport, 80, TCP_SYN).options(options),
    )
}

/// `ip` (TCP) with `options` instead of its own.
fn with_options(ip: &Ipv4, options: &[u8]) -> Ipv4 {
    let mut o = ip.clone();
    let L4::Tcp(t) = &mut o.l4 else {
        panic!("not TCP: {ip:?}")
    };
    t.options = options.to_vec();
    o
}

impl Router {
    /// The SYN `ip` opens its flow, masqueraded to its own port, and
    /// leaves with `options`; `clamped`: counted as clamped.
    fn syn_out(
        &self,
        env: &ResolvedTopology,
        what: &str,
        ip: &Ipv4,
        options: &[u8],
        clamped: bool,
    ) {
        let L4::Tcp(t) = &ip.l4 else {
            panic!("not TCP: {ip:?}")
        };
        let events: &[Counter] = if clamped {
            &[Counter::FlowNewMasquerade, Counter::TcpMssClamped]
        } else {
            &[Counter::FlowNewMasquerade]
        };
        self.redirect(
            what,
            &env.client_sends(ip),
            self.lan,
            &env.to_server(&snat(&with_options(ip, options), t.sport)),
            Counter::FwdOutbound,
            events,
        );
    }
}

/// Over a WAN of 1492 bytes (LAN 1500): a LAN host's SYN advertising 1460
/// leaves with 1452, the server's SYN-ACK advertising 1460 reaches the
/// host with 1452 (the ingress WAN is the narrower link there), a
/// retransmitted SYN (a hit) is clamped again, and a segment that is not
/// a SYN keeps an MSS option it carries.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_syn_and_its_syn_ack_are_clamped_to_the_narrower_link() {
    let env = ResolvedTopology::new(false);
    wan_mtu(&env, 1492);
    with_router(&env, Some(clamping(&env, CLAMP_PMTU)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let out = syn(40000, &linux_options(1460));
        r.syn_out(&env, "SYN out, MSS 1460", &out, &linux_options(1452), true);
        r.redirect(
            "the SYN again (a hit)",
            &env.client_sends(&out),
            lan,
            &env.to_server(&snat(&with_options(&out, &linux_options(1452)), 40000)),
            Counter::FwdOutbound,
            &[Counter::TcpMssClamped],
        );
        let L4::Tcp(syn_tcp) = &out.l4 else {
            unreachable!()
        };
        let syn_ack = Ipv4::new(
            SERVER,
            WAN,
            Tcp::syn_ack_to(syn_tcp).options(&linux_options(1460)),
        );
        r.redirect(
            "SYN-ACK in, MSS 1460",
            &env.server_sends(&syn_ack),
            wan,
            &env.to_client(&dnat(
                &with_options(&syn_ack, &linux_options(1452)),
                CLIENT,
                40000,
            )),
            Counter::FwdInbound,
            &[Counter::TcpMssClamped],
        );
        // The handshake's last ACK, carrying an MSS option a SYN would
        // have: not a SYN, not touched.
        let ack = Ipv4::new(
            CLIENT,
            SERVER,
            Tcp::new(40000, 80, TCP_ACK)
                .numbered(0x1000_0002, 0x1000_0002)
                .options(&MSS),
        );
        r.redirect(
            "ACK with an MSS option",
            &env.client_sends(&ack),
            lan,
            &env.to_server(&snat(&ack, 40000)),
            Counter::FwdOutbound,
            &[],
        );
    });
}

/// Where the option sits: after a NOP (an odd offset, whose checksum update
/// takes the bytes swapped) and as the last option of the longest header;
/// left as it is: an MSS already small enough, a SYN without the option,
/// one after the end of the option list, one behind a malformed option.
/// A SYN towards a host without a neighbour is passed translated and
/// clamped (the egress interface's MTU asked of the kernel).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn the_option_is_found_wherever_it_sits_and_only_lowered() {
    let env = ResolvedTopology::new(false);
    wan_mtu(&env, 1492);
    with_router(&env, Some(clamping(&env, CLAMP_PMTU)), |r| {
        let clamped = [
            (
                "after a NOP",
                vec![1, 2, 4, 0x05, 0xb4, 1, 1, 0],
                vec![1, 2, 4, 0x05, 0xac, 1, 1, 0],
            ),
            (
                "last of 40 option bytes",
                {
                    let mut o = vec![1u8; 36];
                    o.extend_from_slice(&[2, 4, 0x23, 0x00]);
                    o
                },
                {
                    let mut o = vec![1u8; 36];
                    o.extend_from_slice(&[2, 4, 0x05, 0xac]);
                    o
                },
            ),
        ];
        let mut sport = 41000;
        for (what, options, want) in clamped {
            r.syn_out(&env, what, &syn(sport, &options), &want, true);
            sport += 1;
        }
        let unchanged: [(&str, Vec<u8>); 5] = [
            ("MSS 1400, below the limit", linux_options(1400)),
            ("MSS 1452, at the limit", linux_options(1452)),
            ("no MSS option", vec![1, 1, 4, 2]),
            (
                "after the end of the list",
                vec![0, 0, 0, 0, 2, 4, 0x05, 0xb4],
            ),
            (
                "behind an option of length 0",
                vec![3, 0, 2, 4, 0x05, 0xb4, 0, 0],
            ),
        ];
        for (what, options) in unchanged {
            r.syn_out(&env, what, &syn(sport, &options), &options, false);
            sport += 1;
        }

        let to_nobody = Ipv4::new(
            CLIENT,
            WAN_NOBODY,
            Tcp::new(sport, 443, TCP_SYN).options(&linux_options(1460)),
        );
        let mut want = snat(&with_options(&to_nobody, &linux_options(1452)), sport);
        want.ttl = to_nobody.ttl;
        let run = r.check(
            "SYN, no neighbour: passed translated and clamped",
            &env.client_sends(&to_nobody),
            r.lan,
            XDP_PASS,
            &env.client_sends(&want),
            Counter::PassNoNeighbour,
            &[Counter::FlowNewMasquerade, Counter::TcpMssClamped],
        );
        frames::verify_checksums(&run.out);
    });
}

/// The configured MTU lowers the limit further (a narrower link beyond the
/// router: 1400 -> MSS 1360); off leaves every MSS as sent; with both
/// links at 1500 a jumbo LAN host's 8960 is lowered to 1460 and 1460 kept;
/// a locked route MTU (1300) counts where the devices' do not.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn the_configured_mtu_lowers_the_limit_and_off_clamps_nothing() {
    let env = ResolvedTopology::new(false);
    wan_mtu(&env, 1492);
    with_router(&env, Some(clamping(&env, 1400)), |r| {
        let o = linux_options(1460);
        r.syn_out(
            &env,
            "configured 1400",
            &syn(42000, &o),
            &linux_options(1360),
            true,
        );
        let cfg = clamping(&env, CLAMP_OFF);
        r.configure(&cfg);
        r.syn_out(
            &env,
            "off, over the 1492-byte WAN",
            &syn(42001, &o),
            &o,
            false,
        );
        wan_mtu(&env, 1500);
        let cfg = clamping(&env, CLAMP_PMTU);
        r.configure(&cfg);
        r.syn_out(
            &env,
            "MSS 1460, both links 1500",
            &syn(42002, &o),
            &o,
            false,
        );
        r.syn_out(
            &env,
            "MSS 8960 (a jumbo LAN host)",
            &syn(42003, &linux_options(8960)),
            &o,
            true,
        );
        // A route's MTU, not the device's: the FIB's answer decides (for
        // forwarding, Linux takes a route's MTU only when it is locked).
        let server = std::net::Ipv4Addr::from(SERVER).to_string();
        env.t.exec_ok(
            Ns::Router,
            &[
                "ip", "route", "add", &server, "dev", WAN_IF, "mtu", "lock", "1300",
            ],
        );
        r.syn_out(
            &env,
            "a route MTU of 1300 over 1500-byte devices",
            &syn(42004, &o),
            &linux_options(1260),
            true,
        );
    });
}

/// A policy rule on a LAN host's source (`ip rule add from <host> table
/// 100`) whose table routes the server with a locked MTU of 1400, the main
/// table over 1500-byte links: the SYN leaves by the policy's route and is
/// clamped to 1360, first packet and retransmission (a hit) alike. The
/// translated SYN's source, the WAN address, would match the main table.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn a_source_policy_routes_mtu_is_the_one_clamped_to() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(clamping(&env, CLAMP_PMTU)), |r| {
        let server = std::net::Ipv4Addr::from(SERVER).to_string();
        let client = std::net::Ipv4Addr::from(CLIENT).to_string();
        env.t.exec_ok(
            Ns::Router,
            &[
                "ip", "route", "add", &server, "dev", WAN_IF, "mtu", "lock", "1400", "table", "100",
            ],
        );
        env.t.exec_ok(
            Ns::Router,
            &[
                "ip", "rule", "add", "from", &client, "table", "100", "priority", "100",
            ],
        );
        let out = syn(43000, &linux_options(1460));
        r.syn_out(
            &env,
            "SYN out by the policy's 1400-byte route",
            &out,
            &linux_options(1360),
            true,
        );
        r.redirect(
            "the SYN again (a hit)",
            &env.client_sends(&out),
            r.lan,
            &env.to_server(&snat(&with_options(&out, &linux_options(1360)), 43000)),
            Counter::FwdOutbound,
            &[Counter::TcpMssClamped],
        );
    });
}
