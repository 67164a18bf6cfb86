//! Frames not link-layer addressed to the router (broadcast, multicast,
//! another host's unicast MAC): passed to the kernel untouched and counted
//! as `pass_not_for_us`, before any flow work (RFC 1812 5.3.4; the kernel
//! forwards only `PACKET_HOST` frames). Frames to a VRRP virtual MAC the
//! controller accepted (keepalived `use_vmac`, this router the master) are
//! forwarded as frames to the router's own MAC are. In standalone mode a
//! WAN frame of no flow to a LAN host is dropped as unsolicited whatever
//! MAC it is sent to (a macvlan on the WAN, a backup's `use_vmac`, would
//! take it and the kernel forward it).

use router_common::maps::{VMAC_IPV4, VMAC_IPV6};
use tests::frames::{BROADCAST_MAC, IPV4_MULTICAST_MAC, NOBODY_MAC};

use super::*;

/// The destinations a frame may carry that are not the ingress
/// interface's MAC, with the other attached interface's own MAC (a router
/// MAC, but not this interface's).
fn foreign_macs(env: &ResolvedTopology, from_lan: bool) -> [(&'static str, [u8; 6]); 4] {
    let other = if from_lan { env.wan_mac } else { env.lan_mac };
    [
        ("broadcast", BROADCAST_MAC),
        ("IPv4 multicast", IPV4_MULTICAST_MAC),
        ("another host's unicast MAC", NOBODY_MAC),
        ("the other interface's MAC", other),
    ]
}

/// `ip` as sent by the client (`from_lan`) or the server to `dst_mac`.
fn sent_to(env: &ResolvedTopology, from_lan: bool, dst_mac: [u8; 6], ip: &Ipv4) -> Vec<u8> {
    let src_mac = if from_lan {
        env.client_mac
    } else {
        env.server_mac
    };
    Frame::new(dst_mac, src_mac, ip.clone()).bytes()
}

/// An established UDP flow: its packets (both ways) and an ICMP error
/// quoting it, each to a MAC that is not the ingress interface's, are
/// passed untouched with only `pass_not_for_us` counted; the flow's
/// entries (state, times, packet counts) do not change. The same
/// packets to the router's MAC are then forwarded as before.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn established_flow_frames_not_for_the_router_are_passed() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let f = Flow::masq(udp_key(CLIENT, 40000, SERVER, 53), 40000);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"query"));
        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"answer"));
        r.redirect(
            "UDP out",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        r.redirect(
            "UDP reply",
            &env.server_sends(&a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        let flows = r.flows();
        let counts = (r.raw_entry(&f.orig).count, r.raw_entry(&f.reply()).count);
        assert_eq!(counts.0.packets, 1, "the opening packet is counted");

        let quoted = snat(&q, 40000).bytes();
        let icmp_error = Ipv4::new(
            SERVER,
            WAN,
            Icmp::error(ICMP_DEST_UNREACH, 3, &quoted[..28]),
        );
        for (from_lan, ip) in [(true, &q), (false, &a), (false, &icmp_error)] {
            for (what, mac) in foreign_macs(&env, from_lan) {
                let ingress = if from_lan { lan } else { wan };
                r.pass(
                    &format!("{} to {what}", if from_lan { "LAN" } else { "WAN" }),
                    &sent_to(&env, from_lan, mac, ip),
                    ingress,
                    Counter::PassNotForUs,
                );
            }
        }
        assert_eq!(r.flows(), flows, "no entry changed");
        assert_eq!(
            (r.raw_entry(&f.orig).count, r.raw_entry(&f.reply()).count),
            counts,
            "the flow's packet counts did not move"
        );

        r.redirect(
            "UDP out to the router's MAC",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[],
        );
    });
}

/// A new flow's first packet to a MAC that is not the router's admits
/// nothing: no entry, no mapping, no new-flow event (TCP SYN and UDP from
/// the LAN; from the WAN a packet to a LAN host that standalone mode would
/// otherwise drop as unsolicited, and one to a port-forward rule's port).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn new_flows_to_a_foreign_mac_admit_nothing() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        r.forward(IPPROTO_TCP, 8080, CLIENT, 80);
        let syn = Ipv4::new(CLIENT, SERVER, Tcp::new(40001, 80, TCP_SYN));
        let udp = Ipv4::new(CLIENT, SERVER, Udp::new(40002, 53, b"query"));
        let to_lan_host = Ipv4::new(SERVER, CLIENT, Udp::new(53, 40003, b"unsolicited"));
        let to_forward = Ipv4::new(SERVER, WAN, Tcp::new(50000, 8080, TCP_SYN));
        for (from_lan, ip, unsolicited) in [
            (true, &syn, false),
            (true, &udp, false),
            (false, &to_lan_host, true),
            (false, &to_forward, false),
        ] {
            for (what, mac) in foreign_macs(&env, from_lan) {
                let what = format!("{} to {what}", if from_lan { "LAN" } else { "WAN" });
                let frame = sent_to(&env, from_lan, mac, ip);
                if unsolicited {
                    // Judged as unsolicited all the same: a device on top
                    // of the WAN (a macvlan) would take the frame, and
                    // the kernel forward it.
                    r.drop_frame(&what, &frame, wan, Counter::DropUnsolicited);
                } else {
                    r.pass(
                        &what,
                        &frame,
                        if from_lan { lan } else { wan },
                        Counter::PassNotForUs,
                    );
                }
            }
        }
        r.assert_flows("after the foreign frames", []);
        assert_eq!(r.mappings.iter().count(), 0, "no NAT mapping claimed");
    });
}

/// A VRRP virtual MAC (RFC 5798 7.3: `00:00:5e:00:01:VRID` for IPv4).
const fn vrrp_mac(vrid: u8) -> [u8; 6] {
    [0x00, 0x00, 0x5e, 0x00, 0x01, vrid]
}

/// keepalived `use_vmac`: frames to a virtual MAC that the controller
/// accepts on the ingress interface (this router the VRRP master) are
/// forwarded as frames to the interface's own MAC are, with the same
/// output bytes (the next hop's MACs from the FIB), both ways; the flow
/// opens as it would.
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn frames_to_an_accepted_virtual_mac_are_forwarded() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        r.accept_virtual_mac(lan, vrrp_mac(61), VMAC_IPV4);
        r.accept_virtual_mac(wan, vrrp_mac(62), VMAC_IPV4);
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"query"));
        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"answer"));
        r.redirect(
            "UDP out to the LAN's virtual MAC",
            &sent_to(&env, true, vrrp_mac(61), &q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[Counter::FlowNewMasquerade],
        );
        r.redirect(
            "UDP reply to the WAN's virtual MAC",
            &sent_to(&env, false, vrrp_mac(62), &a),
            wan,
            &env.to_client(&dnat(&a, CLIENT, 40000)),
            Counter::FwdInbound,
            &[],
        );
        r.redirect(
            "UDP out to the LAN interface's own MAC",
            &env.client_sends(&q),
            lan,
            &env.to_server(&snat(&q, 40000)),
            Counter::FwdOutbound,
            &[],
        );
    });
}

/// Virtual MACs the controller did not accept for this frame are passed as
/// `pass_not_for_us` and open nothing: another VRID's (a backup's
/// instance), an accepted one arriving on the other interface, one
/// accepted for IPv6 only, and group addresses even when the map holds
/// them (broadcast, the VRRP advert's multicast MAC, a virtual MAC with
/// the group bit set).
#[test]
#[ignore = "needs root: run cargo xtask test"]
fn frames_to_other_virtual_macs_are_passed() {
    let env = ResolvedTopology::new(false);
    with_router(&env, Some(config(&env)), |r| {
        let (lan, wan) = (r.lan, r.wan);
        let group_vmac = {
            let mut m = vrrp_mac(63);
            m[0] |= 1;
            m
        };
        // The VRRP adverts' destination, 224.0.0.18.
        let vrrp_multicast = [0x01, 0x00, 0x5e, 0x00, 0x00, 0x12];
        r.accept_virtual_mac(lan, vrrp_mac(61), VMAC_IPV4);
        r.accept_virtual_mac(wan, vrrp_mac(62), VMAC_IPV4);
        r.accept_virtual_mac(lan, vrrp_mac(64), VMAC_IPV6);
        for mac in [BROADCAST_MAC, vrrp_multicast, group_vmac] {
            r.accept_virtual_mac(lan, mac, VMAC_IPV4 | VMAC_IPV6);
        }
        let q = Ipv4::new(CLIENT, SERVER, Udp::new(40000, 53, b"query"));
        let a = Ipv4::new(SERVER, WAN, Udp::new(53, 40000, b"answer"));
        let to_lan_host = Ipv4::new(SERVER, CLIENT, Udp::new(53, 40003, b"unsolicited"));
        for (what, mac) in [
            ("another VRID's virtual MAC", vrrp_mac(51)),
            ("the WAN's virtual MAC", vrrp_mac(62)),
            ("a virtual MAC accepted for IPv6 only", vrrp_mac(64)),
            ("broadcast", BROADCAST_MAC),
            ("the VRRP multicast MAC", vrrp_multicast),
            ("a virtual MAC with the group bit", group_vmac),
        ] {
            r.pass(
                &format!("LAN to {what}"),
                &sent_to(&env, true, mac, &q),
                lan,
                Counter::PassNotForUs,
            );
        }
        r.pass(
            "WAN reply to the LAN's virtual MAC",
            &sent_to(&env, false, vrrp_mac(61), &a),
            wan,
            Counter::PassNotForUs,
        );
        // A virtual MAC this router is no master of (a backup's macvlan
        // takes it, and the kernel would forward it): judged.
        for (what, mac) in [
            ("the LAN's virtual MAC", vrrp_mac(61)),
            ("another VRID's virtual MAC", vrrp_mac(52)),
        ] {
            r.drop_frame(
                &format!("WAN unsolicited to {what}"),
                &sent_to(&env, false, mac, &to_lan_host),
                wan,
                Counter::DropUnsolicited,
            );
        }
        r.assert_flows("after the frames to other virtual MACs", []);
        assert_eq!(r.mappings.iter().count(), 0, "no NAT mapping claimed");
    });
}
