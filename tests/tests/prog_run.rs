//! `BPF_PROG_RUN` on crafted frames: verdict and every output byte, with the
//! IPv4 checksum verified by full recomputation. Runs inside the router
//! namespace of a test topology so `bpf_fib_lookup` sees real routes and
//! neighbours.

use std::process::Command;

use aya::{
    Ebpf,
    maps::DevMapHash,
    programs::{TestRun, TestRunOptions, Xdp},
};
use router_common::checksum::checksum;
use tests::{Ns, Topology, is_root};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;

fn mac(t: &Topology, ns: Ns, dev: &str) -> [u8; 6] {
    let o = t.exec(ns, &["cat", &format!("/sys/class/net/{dev}/address")]);
    let s = String::from_utf8(o.stdout).unwrap();
    let v: Vec<u8> = s
        .trim()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    v.try_into().unwrap()
}

fn ifindex(t: &Topology, dev: &str) -> u32 {
    let o = t.exec(
        Ns::Router,
        &["cat", &format!("/sys/class/net/{dev}/ifindex")],
    );
    String::from_utf8(o.stdout).unwrap().trim().parse().unwrap()
}

/// Ethernet + IPv4 + UDP frame from the client to the server.
fn udp_frame(dst_mac: [u8; 6], ttl: u8) -> Vec<u8> {
    let payload = b"prog-run";
    let total = 20 + 8 + payload.len();
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f.extend_from_slice(&[0x08, 0x00]);
    let mut ip = [
        0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, ttl, 17, 0, 0, 192, 168, 50, 2, 203, 0, 113, 2,
    ];
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    let c = checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[0x30, 0x39, 0x13, 0x8a]);
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]); // no UDP checksum
    f.extend_from_slice(payload);
    f
}

fn run(prog: &Xdp, frame: &[u8], ifindex: u32) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; frame.len() + 64];
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(frame.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ifindex.to_ne_bytes());
    let mut opts = TestRunOptions::new();
    opts.data_in = Some(frame);
    opts.data_out = Some(&mut out);
    opts.ctx_in = Some(&ctx);
    let r = prog.test_run(opts).expect("BPF_PROG_RUN");
    out.truncate(r.data_size_out as usize);
    (r.return_value, out)
}

#[test]
fn crafted_frames_get_the_right_verdict_and_bytes() {
    if !is_root() {
        eprintln!("SKIP: needs root for BPF_PROG_RUN and namespaces");
        return;
    }
    let t = Topology::new();
    t.route_back();
    let o = t.exec(
        Ns::Client,
        &[
            "ping",
            "-c",
            "1",
            "-W",
            "1",
            &tests::SERVER_ADDR.to_string(),
        ],
    );
    assert!(o.status.success(), "ping to fill neighbour tables failed");
    let lan_mac = mac(&t, Ns::Router, "lan0");
    let wan_mac = mac(&t, Ns::Router, "wan0");
    let srv_mac = mac(&t, Ns::Server, "eth0");
    let (lan, wan) = (ifindex(&t, "lan0"), ifindex(&t, "wan0"));

    t.in_ns(Ns::Router, || {
        let mut ebpf = Ebpf::load(aya::include_bytes_aligned!(env!("ROUTER_EBPF_OBJ"))).unwrap();
        {
            let mut devs = DevMapHash::try_from(ebpf.map_mut("DEVICES").unwrap()).unwrap();
            devs.insert(lan, lan, None, 0).unwrap();
            devs.insert(wan, wan, None, 0).unwrap();
        }
        let prog: &mut Xdp = ebpf.program_mut("router").unwrap().try_into().unwrap();
        prog.load().unwrap();

        // Forwarded: TTL 64 -> 63, checksum valid, MACs rewritten, rest same.
        let f = udp_frame(lan_mac, 64);
        let (v, out) = run(prog, &f, lan);
        assert_eq!(v, XDP_REDIRECT);
        assert_eq!(out.len(), f.len());
        assert_eq!(out[0..6], srv_mac, "dst MAC = server");
        assert_eq!(out[6..12], wan_mac, "src MAC = router wan0");
        assert_eq!(out[14 + 8], 63, "TTL decremented");
        assert_eq!(
            checksum(&out[14..34]),
            0,
            "IPv4 checksum recomputes to valid"
        );
        let mut expect = f.clone();
        expect[0..12].copy_from_slice(&out[0..12]);
        expect[22] = 63;
        expect[24..26].copy_from_slice(&out[24..26]);
        assert_eq!(out, expect, "only MACs, TTL and checksum change");

        // TTL 1: the kernel sends time exceeded; frame untouched.
        let f = udp_frame(lan_mac, 1);
        assert_eq!(run(prog, &f, lan), (XDP_PASS, f.clone()));
        let f = udp_frame(lan_mac, 0);
        assert_eq!(run(prog, &f, lan), (XDP_PASS, f.clone()));

        // Fragment (MF set): pass untouched.
        let mut f = udp_frame(lan_mac, 64);
        f[20] = 0x20;
        assert_eq!(run(prog, &f, lan), (XDP_PASS, f.clone()));

        // IP options (IHL 6): pass untouched.
        let mut f = udp_frame(lan_mac, 64);
        f[14] = 0x46;
        assert_eq!(run(prog, &f, lan), (XDP_PASS, f.clone()));

        // IHL < 5 and total length beyond the frame: malformed, dropped.
        let mut f = udp_frame(lan_mac, 64);
        f[14] = 0x44;
        assert_eq!(run(prog, &f, lan).0, XDP_DROP);
        let mut f = udp_frame(lan_mac, 64);
        f[16..18].copy_from_slice(&1000u16.to_be_bytes());
        assert_eq!(run(prog, &f, lan).0, XDP_DROP);

        // Every truncation of the Ethernet+IPv4 headers: dropped or, for a
        // frame too short for an ethertype, dropped as truncated.
        let full = udp_frame(lan_mac, 64);
        for len in 14..34 {
            assert_eq!(
                run(prog, &full[..len], lan).0,
                XDP_DROP,
                "truncated at {len}"
            );
        }

        // ARP: not IPv4, the kernel handles it.
        let mut f = udp_frame(lan_mac, 64);
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(run(prog, &f, lan), (XDP_PASS, f.clone()));
    });
    drop(t);
    let _ = Command::new("true").status();
}
