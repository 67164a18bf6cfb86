//! The offload daemon's egress witness (`router-ebpf/src/egress_witness.rs`,
//! a tc program) under `BPF_PROG_RUN` on crafted frames: every frame goes
//! on unchanged (`TCX_NEXT`, the output bytes equal the input), and
//! `EGRESS_SEEN` holds exactly the expected note (the packet's addresses,
//! IPv4 as IPv4-mapped, ports or echo identifier, protocol -> the
//! interface, the mark and the destination MAC) for the packets it can
//! read, nothing for the others.

use std::collections::BTreeMap;

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap, MapData},
    programs::{SchedClassifier, TestRun as _, TestRunOptions},
};
use router_common::maps::{EGRESS_SEEN_MAP, EGRESS_WITNESS_PROGRAM, EgressKey, EgressSeen};
use tests::frames::{self, Frame, IP_MF, Icmp, Ipv4, TCP_ACK, Tcp, Udp};
use tests::v6::Ipv6;

/// `TCX_NEXT`: the packet goes on as it was.
const TCX_NEXT: i32 = -1;
/// `BPF_PROG_RUN` of a tc program without an interface in its context
/// runs on the loopback device.
const LOOPBACK: u32 = 1;
const GATEWAY_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const ROUTER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const SRC: [u8; 4] = [203, 0, 113, 1];
const DST: [u8; 4] = [198, 51, 100, 7];
const SRC6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const DST6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7];

struct Witness {
    ebpf: Ebpf,
    seen: HashMap<MapData, EgressKey, EgressSeen>,
}

impl Witness {
    fn load() -> Self {
        let mut ebpf = EbpfLoader::new()
            .load(aya::include_bytes_aligned!(env!("ROUTER_EBPF_OBJ")))
            .expect("load the object");
        let seen = HashMap::try_from(ebpf.take_map(EGRESS_SEEN_MAP).expect("EGRESS_SEEN"))
            .expect("EGRESS_SEEN is a hash");
        let prog: &mut SchedClassifier = ebpf
            .program_mut(EGRESS_WITNESS_PROGRAM)
            .expect("the witness program")
            .try_into()
            .expect("a tc program");
        prog.load().expect("the verifier accepts the witness");
        Self { ebpf, seen }
    }

    /// Runs the witness on `frame` with `mark` as the packet's mark; checks
    /// the verdict and that the frame went on unchanged.
    fn run(&self, frame: &[u8], mark: u32) {
        let prog: &SchedClassifier = self
            .ebpf
            .program(EGRESS_WITNESS_PROGRAM)
            .unwrap()
            .try_into()
            .unwrap();
        // struct __sk_buff up to its mark: len and pkt_type must be zero.
        let mut ctx = [0u8; 12];
        ctx[8..12].copy_from_slice(&mark.to_ne_bytes());
        let mut out = vec![0u8; frame.len() + 64];
        let mut opts = TestRunOptions::new();
        opts.data_in = Some(frame);
        opts.data_out = Some(&mut out);
        opts.ctx_in = Some(&ctx);
        let r = prog.test_run(opts).expect("BPF_PROG_RUN");
        out.truncate(r.data_size_out as usize);
        assert_eq!(r.return_value.cast_signed(), TCX_NEXT, "verdict");
        assert_eq!(out, frame, "the frame changed");
    }

    fn notes(&self) -> BTreeMap<EgressKey, EgressSeen> {
        self.seen.iter().map(Result::unwrap).collect()
    }
}

fn mapped(a: [u8; 4]) -> [u8; 16] {
    std::net::Ipv4Addr::from(a).to_ipv6_mapped().octets()
}

fn key(src: [u8; 16], dst: [u8; 16], ports: (u16, u16), proto: u8) -> EgressKey {
    EgressKey::new(src, dst, ports.0, ports.1, proto)
}

fn seen(mark: u32) -> EgressSeen {
    EgressSeen {
        ifindex: LOOPBACK,
        mark,
        dst_mac: GATEWAY_MAC,
        pad: 0,
    }
}

fn frame4(ip: Ipv4) -> Vec<u8> {
    Frame::new(GATEWAY_MAC, ROUTER_MAC, ip).bytes()
}

#[test]
#[ignore = "needs root: run cargo xtask test"]
fn the_egress_witness_notes_how_the_kernel_sent_a_packet_and_changes_nothing() {
    let w = Witness::load();
    let mut want = BTreeMap::new();

    // TCP, then the same connection with another mark: the note follows.
    let tcp = frame4(Ipv4::new(SRC, DST, Tcp::new(40000, 443, TCP_ACK)));
    w.run(&tcp, 0x100);
    let tcp_key = key(mapped(SRC), mapped(DST), (40000, 443), 6);
    want.insert(tcp_key, seen(0x100));
    assert_eq!(w.notes(), want);
    w.run(&tcp, 0x200);
    want.insert(tcp_key, seen(0x200));
    assert_eq!(w.notes(), want);

    // UDP behind IP options: the ports after them.
    let mut ip = Ipv4::new(SRC, DST, Udp::new(5353, 53, b"query"));
    ip.options = vec![1, 1, 1, 0];
    w.run(&frame4(ip), 0);
    want.insert(key(mapped(SRC), mapped(DST), (5353, 53), 17), seen(0));

    // A fragmented datagram: its first fragment is noted, a later one
    // (no ports) is not.
    let whole = Ipv4::new(SRC, DST, Udp::new(6000, 7000, &[7; 64]));
    let [first, second] = frames::fragments(&whole, 32);
    assert_ne!(second.frag & 0x1fff, 0);
    assert_ne!(first.frag & IP_MF, 0);
    w.run(&frame4(second), 0);
    assert_eq!(w.notes(), want, "a later fragment");
    w.run(&frame4(first), 0);
    want.insert(key(mapped(SRC), mapped(DST), (6000, 7000), 17), seen(0));

    // ICMP echo: the identifier in both ports; an error: nothing.
    w.run(
        &frame4(Ipv4::new(SRC, DST, Icmp::echo_request(77, 1, b"ping"))),
        0,
    );
    want.insert(key(mapped(SRC), mapped(DST), (77, 77), 1), seen(0));
    w.run(
        &frame4(Ipv4::new(SRC, DST, Icmp::error(3, 1, &[0x45; 28]))),
        0,
    );
    assert_eq!(w.notes(), want, "an ICMP error");

    // IPv6: UDP and an echo reply.
    w.run(
        &Ipv6::udp(SRC6, DST6, &Udp::new(41000, 4500, b"v6")).frame(GATEWAY_MAC, ROUTER_MAC),
        5,
    );
    want.insert(key(SRC6, DST6, (41000, 4500), 17), seen(5));
    w.run(
        &Ipv6::echo(SRC6, DST6, true, 9, 1).frame(GATEWAY_MAC, ROUTER_MAC),
        0,
    );
    want.insert(key(SRC6, DST6, (9, 9), 58), seen(0));
    assert_eq!(w.notes(), want);

    // Frames it cannot read: cut short before the ports, not IP, a bad
    // IPv4 header length.
    let mut short = tcp.clone();
    short.truncate(frames::ETH_HLEN + 20 + 2);
    w.run(&short, 0);
    let mut arp = tcp.clone();
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    w.run(&arp, 0);
    let mut bad_ihl = frame4(Ipv4::new(SRC, [10, 0, 0, 1], Tcp::new(1, 2, TCP_ACK)));
    bad_ihl[frames::ETH_HLEN] = 0x44;
    w.run(&bad_ihl, 0);
    assert_eq!(w.notes(), want, "frames it cannot read");
}
