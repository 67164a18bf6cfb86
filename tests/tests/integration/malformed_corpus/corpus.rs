//! The corpora: base frames and flows, the systematic corpus, wrong-side
//! tuples, the generated corpus.

use super::*;

/// The corpus's port-forward rules: protocol, WAN port, LAN address and
/// port. The last is to a LAN address without a neighbour: translated
/// passes.
pub(super) const PORT_FORWARDS: [(u8, u16, [u8; 4], u16); 3] = [
    (IPPROTO_TCP, 8080, CLIENT, 80),
    (IPPROTO_UDP, 5353, CLIENT, 53),
    (IPPROTO_UDP, 5354, LAN_NOBODY, 53),
];

pub(super) struct Base {
    pub(super) name: &'static str,
    pub(super) from_lan: bool,
    pub(super) frame: Vec<u8>,
}

/// Opens the flows the base frames refer to (asserting the setup works),
/// adds port-forward rules, and returns the bases.
#[expect(
    clippy::too_many_lines,
    reason = "a list of cases, or one check per field, read top to bottom"
)]
pub(super) fn setup(env: &ResolvedTopology, r: &mut LoadedRouter) -> Vec<Base> {
    for (proto, port, addr, to) in PORT_FORWARDS {
        r.forward(proto, port, addr, to);
    }
    let opening: Vec<(bool, Ipv4)> = vec![
        (
            true,
            Ipv4::new(
                CLIENT,
                SERVER,
                Tcp::new(40000, 80, TCP_SYN).options(&[2, 4, 5, 0xb4]),
            ),
        ),
        (
            false,
            Ipv4::new(
                SERVER,
                WAN,
                Tcp::new(80, 40000, TCP_SYN | TCP_ACK).options(&[2, 4, 5, 0xb4]),
            ),
        ),
        (
            true,
            Ipv4::new(CLIENT, SERVER, Udp::new(40001, 53, b"query")),
        ),
        (
            false,
            Ipv4::new(SERVER, WAN, Udp::new(53, 40001, b"answer")),
        ),
        (
            true,
            Ipv4::new(CLIENT, SERVER, Icmp::echo_request(ECHO_ID, 1, b"ping")),
        ),
        (
            false,
            Ipv4::new(SERVER, WAN, Tcp::new(50000, 8080, TCP_SYN)),
        ),
    ];
    for (from_lan, ip) in &opening {
        let f = env.sends(*from_lan, ip);
        let run = r.test_run(&f, if *from_lan { env.lan } else { env.wan });
        assert_eq!(
            run.verdict, XDP_REDIRECT,
            "setup frame {ip:?} not redirected: {:?}",
            run.delta
        );
    }
    assert_eq!(r.conntrack_entries().len(), 8, "four flows set up");

    let payload: Vec<u8> = (0..48u8).map(|i| i.wrapping_mul(37)).collect();
    // What the server got from the flows (and quotes in errors).
    let udp_wan = Ipv4::new(WAN, SERVER, Udp::new(40001, 53, b"query")).ttl(63);
    let tcp_wan = Ipv4::new(
        WAN,
        SERVER,
        Tcp::new(40000, 80, TCP_ACK | TCP_PSH).payload(&payload),
    )
    .ttl(63);
    let echo_wan = Ipv4::new(WAN, SERVER, Icmp::echo_request(ECHO_ID, 1, b"ping")).ttl(63);
    let nobody_wan = Ipv4::new(WAN, SERVER, Udp::new(33333, 53, b"x")).ttl(63);
    let err = |t: u8, c: u8, q: &[u8]| Ipv4::new(SERVER, WAN, Icmp::error(t, c, q));
    let udp0 = Udp::new(40001, 53, &payload).no_checksum();
    let lan = |name, ip: Ipv4| Base {
        name,
        from_lan: true,
        frame: env.client_sends(&ip),
    };
    let wan = |name, ip: Ipv4| Base {
        name,
        from_lan: false,
        frame: env.server_sends(&ip),
    };
    let mut bases = vec![
        lan(
            "LAN TCP data, flow",
            Ipv4::new(
                CLIENT,
                SERVER,
                Tcp::new(40000, 80, TCP_ACK | TCP_PSH).payload(&payload),
            ),
        ),
        lan(
            "LAN TCP SYN, new flow",
            Ipv4::new(
                CLIENT,
                SERVER,
                Tcp::new(40100, 443, TCP_SYN).options(&[2, 4, 5, 0xb4]),
            ),
        ),
        lan(
            "LAN TCP FIN, flow",
            Ipv4::new(CLIENT, SERVER, Tcp::new(40000, 80, TCP_FIN | TCP_ACK)),
        ),
        lan(
            "LAN UDP, flow",
            Ipv4::new(CLIENT, SERVER, Udp::new(40001, 53, &payload)),
        ),
        lan("LAN UDP checksum 0, flow", Ipv4::new(CLIENT, SERVER, udp0)),
        lan(
            "LAN UDP, new flow",
            Ipv4::new(CLIENT, SERVER, Udp::new(40200, 123, &payload)),
        ),
        lan(
            "LAN echo request, flow",
            Ipv4::new(CLIENT, SERVER, Icmp::echo_request(ECHO_ID, 2, &payload)),
        ),
        lan(
            "LAN echo request, new id",
            Ipv4::new(CLIENT, SERVER, Icmp::echo_request(77, 1, &payload)),
        ),
        lan(
            "LAN answer of a port forward",
            Ipv4::new(CLIENT, SERVER, Tcp::new(80, 50000, TCP_SYN | TCP_ACK)),
        ),
        wan(
            "WAN TCP reply, flow",
            Ipv4::new(
                SERVER,
                WAN,
                Tcp::new(80, 40000, TCP_ACK | TCP_PSH).payload(&payload),
            ),
        ),
        wan(
            "WAN TCP, no flow",
            Ipv4::new(SERVER, WAN, Tcp::new(81, 40000, TCP_ACK).payload(&payload)),
        ),
        wan(
            "WAN UDP reply, flow",
            Ipv4::new(SERVER, WAN, Udp::new(53, 40001, &payload)),
        ),
        wan(
            "WAN UDP, no flow",
            Ipv4::new(SERVER, WAN, Udp::new(54, 40001, &payload)),
        ),
        wan(
            "WAN echo reply, flow",
            Ipv4::new(SERVER, WAN, Icmp::echo_reply(ECHO_ID, 2, &payload)),
        ),
        wan(
            "WAN echo reply, no flow",
            Ipv4::new(SERVER, WAN, Icmp::echo_reply(78, 2, &payload)),
        ),
        wan(
            "WAN SYN to a port forward",
            Ipv4::new(SERVER, WAN, Tcp::new(50001, 8080, TCP_SYN)),
        ),
        wan(
            "WAN UDP to a port forward",
            Ipv4::new(SERVER, WAN, Udp::new(50002, 5353, &payload)),
        ),
        wan(
            "WAN UDP to a port forward, no neighbour",
            Ipv4::new(SERVER, WAN, Udp::new(50003, 5354, &payload)),
        ),
        wan(
            "WAN port unreachable quoting the UDP flow",
            err(ICMP_DEST_UNREACH, 3, &udp_wan.bytes()),
        ),
        wan(
            "WAN fragmentation needed quoting the TCP flow",
            err(ICMP_DEST_UNREACH, 4, &tcp_wan.bytes()),
        ),
        wan(
            "WAN time exceeded quoting the echo flow",
            err(ICMP_TIME_EXCEEDED, 0, &echo_wan.bytes()),
        ),
        wan(
            "WAN parameter problem quoting 28 bytes of the TCP flow",
            err(ICMP_PARAMETER_PROBLEM, 0, &tcp_wan.bytes()[..28]),
        ),
        wan(
            "WAN port unreachable quoting no flow",
            err(ICMP_DEST_UNREACH, 3, &nobody_wan.bytes()),
        ),
    ];
    // VLAN-tagged copies of two frames (802.1Q tag after the MACs).
    for i in [0, 11] {
        let b = &bases[i];
        let mut f = b.frame[..12].to_vec();
        f.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        f.extend_from_slice(&b.frame[12..]);
        let name = if b.from_lan {
            "LAN VLAN-tagged UDP"
        } else {
            "WAN VLAN-tagged UDP"
        };
        bases.push(Base {
            name,
            from_lan: b.from_lan,
            frame: f,
        });
    }
    // Priority-tagged copies (VLAN id 0, which the kernel strips) of a WAN
    // reply, a LAN datagram of its flow and a WAN datagram to a LAN host:
    // the data path takes the tags off and goes on with the packet inside
    // (docs/architecture.md "Per packet" step 0), carried, judged or passed as untagged.
    let to_lan_host = env.server_sends(&Ipv4::new(SERVER, CLIENT, Udp::new(53, 40009, &payload)));
    let reply = bases[11].frame.clone();
    bases.push(Base {
        name: "LAN priority-tagged UDP",
        from_lan: true,
        frame: frames::with_tags(&bases[0].frame, &[(0x8100, 0x6000)]),
    });
    for (name, frame, tags) in [
        ("WAN priority-tagged UDP reply", &reply, &[(0x8100, 0)][..]),
        (
            "WAN priority-tagged UDP to a LAN host",
            &to_lan_host,
            &[(0x8100, 0x2000)][..],
        ),
        (
            "WAN 802.1ad + 802.1Q priority-tagged UDP to a LAN host",
            &to_lan_host,
            &[(0x88a8, 0), (0x8100, 0)][..],
        ),
    ] {
        bases.push(Base {
            name,
            from_lan: false,
            frame: frames::with_tags(frame, tags),
        });
    }
    for b in &bases {
        if is_ipv4(&b.frame) {
            frames::verify_checksums(&b.frame);
        }
    }
    bases
}

// ---------------------------------------------------------------------------
// Systematic corpus
// ---------------------------------------------------------------------------

/// Inserts `n` 4-byte NOP option words after the IPv4 header.
pub(super) fn with_options(f: &[u8], words: usize) -> Vec<u8> {
    let mut v = f[..L4_OFF].to_vec();
    v.extend(std::iter::repeat_n(1u8, words * 4));
    v.extend_from_slice(&f[L4_OFF..]);
    v[IP_OFF] = 0x40 | u8::try_from(5 + words).unwrap();
    let l3 = v.len() - IP_OFF;
    set_total(&mut v, l3);
    fix_frame(&mut v, false);
    v
}

/// `f` (TCP) with `options` (a multiple of 4 bytes) instead of its own,
/// the data offset, total length and checksums following.
fn with_tcp_options(f: &[u8], options: &[u8]) -> Vec<u8> {
    let hlen = usize::from(f[L4_OFF + 12] >> 4) * 4;
    let mut v = f[..L4_OFF + 20].to_vec();
    v.extend_from_slice(options);
    v.extend_from_slice(&f[L4_OFF + hlen..]);
    v[L4_OFF + 12] = u8::try_from((20 + options.len()) / 4).unwrap() << 4;
    let l3 = v.len() - IP_OFF;
    set_total(&mut v, l3);
    fix_frame(&mut v, true);
    v
}

/// Option layouts for a SYN's MSS clamping: the MSS at odd and even
/// offsets, first, after others and last; values around the corpus's clamp
/// ([`super::CLAMP_MSS`]); and walks that must stop before it.
fn mss_layouts() -> Vec<(&'static str, Vec<u8>)> {
    let mut last = vec![1u8; 36];
    last.extend_from_slice(&[2, 4, 0x05, 0xb4]);
    let [hi, lo] = super::CLAMP_MSS.to_be_bytes();
    let [hi1, lo1] = (super::CLAMP_MSS + 1).to_be_bytes();
    vec![
        (
            "MSS after a NOP (odd offset)",
            vec![1, 2, 4, 0x05, 0xb4, 1, 1, 0],
        ),
        (
            "MSS after three NOPs (odd)",
            vec![1, 1, 1, 2, 4, 0x05, 0xb4, 0],
        ),
        (
            "MSS 8960 after a window scale (odd)",
            vec![3, 3, 7, 2, 4, 0x23, 0x00, 0],
        ),
        (
            "MSS after timestamps",
            vec![8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 2, 4, 5, 0xb4, 1, 0],
        ),
        ("MSS last of 40 bytes", last),
        ("MSS 65535", vec![2, 4, 0xff, 0xff]),
        ("MSS at the clamp", vec![2, 4, hi, lo]),
        ("MSS one above the clamp", vec![2, 4, hi1, lo1]),
        ("MSS 0", vec![2, 4, 0, 0]),
        ("MSS option of length 3", vec![2, 3, 5, 0xb4]),
        ("MSS option of length 2", vec![2, 2, 1, 1]),
        ("MSS cut by the header's end", vec![1, 1, 1, 1, 1, 2, 4, 5]),
        (
            "an option of length 0 first",
            vec![3, 0, 2, 4, 5, 0xb4, 0, 0],
        ),
        (
            "an option of length 1 first",
            vec![3, 1, 2, 4, 5, 0xb4, 0, 0],
        ),
        (
            "an option past the header first",
            vec![3, 40, 2, 4, 5, 0xb4, 0, 0],
        ),
        ("end of list first", vec![0, 2, 4, 5, 0xb4, 0, 0, 0]),
        ("two MSS options", vec![2, 4, 0x05, 0xb4, 2, 4, 0x23, 0x00]),
    ]
}

#[expect(
    clippy::too_many_lines,
    reason = "a list of cases, or one check per field, read top to bottom"
)]
pub(super) fn systematic(b: &Base) -> Vec<(String, Vec<u8>)> {
    let f = &b.frame;
    let mut v: Vec<(String, Vec<u8>)> = Vec::new();
    let patched = |g: &dyn Fn(&mut Vec<u8>), l4: bool| {
        let mut x = f.clone();
        g(&mut x);
        fix_frame(&mut x, l4);
        x
    };
    // Every truncation point, as cut off (total length now beyond the
    // frame) and as a shorter consistent packet.
    for len in frames::ETH_HLEN..f.len() {
        v.push((format!("cut to {len}"), f[..len].to_vec()));
        if is_ipv4(f) && len > L4_OFF {
            v.push((
                format!("consistent cut to {len}"),
                consistent_truncation(f, len),
            ));
        }
    }
    if !is_ipv4(f) {
        return v;
    }
    let l3 = f.len() - IP_OFF;
    for ihl in 0..16u8 {
        v.push((
            format!("IHL {ihl}"),
            patched(&|x| x[IP_OFF] = 0x40 | ihl, false),
        ));
    }
    for version in [0u8, 5, 6, 15] {
        v.push((
            format!("version {version}"),
            patched(&|x| x[IP_OFF] = (version << 4) | 5, false),
        ));
    }
    for total in [
        0,
        1,
        19,
        20,
        21,
        27,
        28,
        39,
        40,
        55,
        56,
        65,
        66,
        l3 - 1,
        l3,
        l3 + 1,
        l3 + 100,
    ] {
        v.push((
            format!("total length {total} (frame {l3})"),
            patched(&|x| set_total(x, total), false),
        ));
    }
    v.push((
        "total length 65535".to_owned(),
        patched(&|x| set_total(x, 0xffff), false),
    ));
    if f[IP_OFF + 9] == IPPROTO_TCP {
        for doff in 0..16u8 {
            v.push((
                format!("TCP data offset {doff}"),
                patched(&|x| x[L4_OFF + 12] = doff << 4, true),
            ));
        }
        for flags in [
            0,
            TCP_SYN,
            TCP_SYN | TCP_ACK,
            TCP_RST,
            TCP_SYN | TCP_FIN,
            0xff,
        ] {
            v.push((
                format!("TCP flags {flags:#04x}"),
                patched(&|x| x[L4_OFF + 13] = flags, true),
            ));
        }
        if f[L4_OFF + 13] & TCP_SYN != 0 {
            for (what, options) in mss_layouts() {
                v.push((
                    format!("SYN options: {what}"),
                    with_tcp_options(f, &options),
                ));
            }
        }
    }
    for (what, frag) in [
        ("first fragment (MF)", IP_MF),
        ("first fragment MF+DF", IP_MF | IP_DF),
        ("later fragment, offset 1", 1),
        ("last fragment, offset 0x1fff", 0x1fff),
        ("middle fragment", IP_MF | 0xb9),
        ("reserved flag", 0x8000),
        ("no DF", 0),
    ] {
        v.push((
            what.to_owned(),
            patched(&|x| put16(x, IP_OFF + 6, frag), false),
        ));
    }
    for ttl in [0u8, 1, 2, 255] {
        v.push((
            format!("TTL {ttl}"),
            patched(&|x| x[IP_OFF + 8] = ttl, false),
        ));
    }
    for words in [1, 2, 10] {
        v.push((format!("{words} option words"), with_options(f, words)));
    }
    for proto in [0u8, 2, 4, 41, 47, 50, 132, 255] {
        v.push((
            format!("protocol {proto}"),
            patched(&|x| x[IP_OFF + 9] = proto, false),
        ));
    }
    for a in ODD_ADDRS {
        v.push((
            format!("source {}", Ipv4Addr::from(a)),
            patched(&|x| put_addr(x, IP_OFF + 12, a), true),
        ));
        v.push((
            format!("destination {}", Ipv4Addr::from(a)),
            patched(&|x| put_addr(x, IP_OFF + 16, a), true),
        ));
    }
    // A frame longer than the packet (Ethernet padding).
    let mut padded = f.clone();
    padded.extend_from_slice(&[0xa5; 18]);
    v.push(("18 bytes of padding".to_owned(), padded));
    if f[IP_OFF + 9] == IPPROTO_ICMP && is_icmp_error_type(f[L4_OFF]) {
        for b in [0x44u8, 0x46, 0x55, 0x00] {
            v.push((
                format!("quoted version/IHL {b:#04x}"),
                patched(&|x| x[INNER_IP_OFF] = b, true),
            ));
        }
        for proto in [0u8, 1, 47] {
            v.push((
                format!("quoted protocol {proto}"),
                patched(&|x| x[INNER_IP_OFF + 9] = proto, true),
            ));
        }
        for t in [0u8, 3, 8, 13] {
            v.push((
                format!("quoted ICMP type {t}"),
                patched(&|x| x[INNER_L4_OFF] = t, true),
            ));
        }
        for code in [0u8, 1, 4, 13, 255] {
            v.push((
                format!("code {code}"),
                patched(&|x| x[L4_OFF + 1] = code, true),
            ));
        }
        v.push((
            "quoted ports swapped".to_owned(),
            patched(
                &|x| {
                    let (s, d) = (be16(x, INNER_L4_OFF), be16(x, INNER_L4_OFF + 2));
                    put16(x, INNER_L4_OFF, d);
                    put16(x, INNER_L4_OFF + 2, s);
                },
                true,
            ),
        ));
        v.push((
            "quoted source = client (already translated)".to_owned(),
            patched(&|x| put_addr(x, INNER_IP_OFF + 12, CLIENT), true),
        ));
    }
    v
}

/// Packets carrying a flow's tuple on the wrong interface: the LAN side's
/// tuple arriving on the WAN and the WAN side's on the LAN (spoofed).
pub(super) fn wrong_side(env: &ResolvedTopology, r: &LoadedRouter) -> Vec<(String, bool, Vec<u8>)> {
    let mut v = Vec::new();
    for (k, e) in r.conntrack_entries() {
        // The interface this entry's packets arrive on: an original entry
        // of a masqueraded flow and a reply entry of a port forward on the
        // LAN, the others on the WAN.
        let lan_side = (e.flags & FLAG_ORIGINAL != 0) != (e.flags & FLAG_PORT_FORWARD != 0);
        let l4: tests::frames::L4 = match k.proto {
            IPPROTO_TCP => Tcp::new(k.src_port, k.dst_port, TCP_ACK)
                .payload(b"spoofed")
                .into(),
            IPPROTO_UDP => Udp::new(k.src_port, k.dst_port, b"spoofed").into(),
            _ => {
                if lan_side {
                    Icmp::echo_reply(k.src_port, 9, b"spoofed").into()
                } else {
                    Icmp::echo_request(k.src_port, 9, b"spoofed").into()
                }
            }
        };
        let ip = Ipv4::new(k.src_addr, k.dst_addr, l4);
        let from_lan = !lan_side;
        v.push((
            format!(
                "{} side tuple {}:{} -> {}:{} proto {} on the {}",
                if lan_side { "LAN" } else { "WAN" },
                Ipv4Addr::from(k.src_addr),
                k.src_port,
                Ipv4Addr::from(k.dst_addr),
                k.dst_port,
                k.proto,
                if from_lan { "LAN" } else { "WAN" }
            ),
            from_lan,
            env.sends(from_lan, &ip),
        ));
        if lan_side {
            // An ICMP error from the WAN quoting a packet a reply to which
            // would carry this LAN-side tuple.
            let quoted: tests::frames::L4 = match k.proto {
                IPPROTO_TCP => Tcp::new(k.dst_port, k.src_port, TCP_ACK).into(),
                IPPROTO_UDP => Udp::new(k.dst_port, k.src_port, b"q").into(),
                _ => Icmp::echo_request(k.src_port, 9, b"q").into(),
            };
            let q = Ipv4::new(k.dst_addr, k.src_addr, quoted).bytes();
            let ip = Ipv4::new(SERVER, WAN, Icmp::error(ICMP_DEST_UNREACH, 3, &q));
            v.push((
                format!(
                    "ICMP error from the WAN quoting the LAN side tuple {}:{} -> {}:{} proto {}",
                    Ipv4Addr::from(k.src_addr),
                    k.src_port,
                    Ipv4Addr::from(k.dst_addr),
                    k.dst_port,
                    k.proto
                ),
                false,
                env.server_sends(&ip),
            ));
        }
    }
    v
}

// ---------------------------------------------------------------------------
// Generated corpus
// ---------------------------------------------------------------------------

/// Applies one random mutation to `f`; returns its name.
#[expect(
    clippy::too_many_lines,
    reason = "a list of cases, or one check per field, read top to bottom"
)]
pub(super) fn mutate(rng: &mut SplitMix64, f: &mut Vec<u8>) -> &'static str {
    const BYTES: [u8; 12] = [0, 1, 2, 5, 6, 8, 0x11, 0x40, 0x45, 0x7f, 0x80, 0xff];
    let len = f.len();
    match rng.below(12) {
        0 => {
            // One bit, mostly in the headers.
            let at = if rng.chance(5) {
                rng.below(len)
            } else {
                rng.below(len.min(90))
            };
            f[at] ^= 1 << rng.below(8);
            "bit flip"
        }
        1 => {
            let at = rng.below(len.min(90));
            f[at] = if rng.chance(2) {
                rng.pick(&BYTES)
            } else {
                rng.byte()
            };
            "byte"
        }
        2 => {
            let any = rng.byte();
            poke(
                f,
                IP_OFF,
                rng.pick(&[0x45, 0x44, 0x40, 0x46, 0x4f, 0x55, 0x65, 0x05, any]),
            );
            "version/IHL"
        }
        3 => {
            let l3 = len.saturating_sub(IP_OFF);
            let t = rng.pick(&[0, 19, 20, 28, 40, 56, 66, l3 - 1, l3, l3 + 1, 0xffff]);
            set_total(f, if rng.chance(4) { rng.u16().into() } else { t });
            "total length"
        }
        4 => {
            let any = rng.u16();
            let v = rng.pick(&[0, IP_DF, IP_MF, IP_MF | IP_DF, 1, 0x1fff, any]);
            put16(f, IP_OFF + 6, v);
            "fragment word"
        }
        5 => {
            let any = rng.byte();
            poke(f, IP_OFF + 8, rng.pick(&[0, 1, 2, 255, any]));
            if rng.chance(3) {
                poke(f, IP_OFF + 9, rng.pick(&[0, 1, 6, 17, 47, 132, 255]));
            }
            "TTL/protocol"
        }
        6 => {
            // TCP data offset/flags, or the ICMP type/code.
            if rng.chance(2) {
                let b = rng.byte() & 0xf0;
                poke(f, L4_OFF + 12, b);
            } else {
                let flags = [
                    0,
                    TCP_SYN,
                    TCP_SYN | TCP_ACK,
                    TCP_ACK,
                    TCP_RST,
                    TCP_FIN | TCP_ACK,
                    TCP_SYN | TCP_FIN,
                    0xff,
                ];
                poke(f, L4_OFF + 13, rng.pick(&flags));
                if f.get(IP_OFF + 9) == Some(&IPPROTO_ICMP) {
                    poke(f, L4_OFF, rng.pick(&[0, 3, 4, 5, 8, 11, 12, 13, 255]));
                    let code = rng.byte() & 0x0f;
                    poke(f, L4_OFF + 1, code);
                }
            }
            "L4 header byte"
        }
        7 => {
            let p = if rng.chance(2) {
                rng.pick(&ODD_PORTS)
            } else {
                rng.u16()
            };
            let at = rng.pick(&[
                L4_OFF,
                L4_OFF + 2,
                L4_OFF + 4,
                INNER_L4_OFF,
                INNER_L4_OFF + 2,
                INNER_L4_OFF + 4,
            ]);
            put16(f, at, p);
            "port/identifier"
        }
        8 => {
            let a = rng.pick(&ODD_ADDRS);
            let at = rng.pick(&[
                IP_OFF + 12,
                IP_OFF + 16,
                INNER_IP_OFF + 12,
                INNER_IP_OFF + 16,
            ]);
            put_addr(f, at, a);
            "address"
        }
        9 => {
            f.truncate(frames::ETH_HLEN + rng.below(len - frames::ETH_HLEN));
            "truncated"
        }
        10 => {
            let n = frames::ETH_HLEN + rng.below(len - frames::ETH_HLEN);
            *f = consistent_truncation(f, n.max(frames::ETH_HLEN));
            "consistent truncation"
        }
        _ => {
            let n = 1 + rng.below(64);
            for _ in 0..n {
                f.push(rng.byte());
            }
            if rng.chance(2) {
                let l3 = f.len() - IP_OFF;
                set_total(f, l3);
            }
            "extended"
        }
    }
}

pub(super) fn generated(rng: &mut SplitMix64, bases: &[Base]) -> (String, bool, Vec<u8>) {
    let b = &bases[rng.below(bases.len())];
    let mut f = b.frame.clone();
    let mut names = Vec::new();
    for _ in 0..=rng.below(3) {
        if f.len() <= frames::ETH_HLEN + 1 {
            break;
        }
        names.push(mutate(rng, &mut f));
    }
    // Outer IPv4 header checksum always fixed; L4 checksums (inner first)
    // in half of the cases, else left as the mutation made them.
    let l4 = rng.chance(2);
    fix_frame(&mut f, l4);
    let what = format!(
        "{}: {} ({})",
        b.name,
        names.join(", "),
        if l4 {
            "checksums fixed"
        } else {
            "L4 checksums as mutated"
        }
    );
    (what, b.from_lan, f)
}
