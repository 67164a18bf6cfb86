//! Tiny XDP programs written as raw instructions and loaded with the
//! `bpf(2)` syscall: the benchmark's floor (`return XDP_PASS`), the
//! live-frame traffic generator and its sink, the limit (a minimal
//! `bpf_fib_lookup` + redirect forwarder), the limit with one flow-table
//! lookup (a control: what the kernel's hash table alone costs) and the
//! "cable" (redirect everything to one interface). They are a handful of
//! instructions each, not part of the product, and need no ELF object or
//! second eBPF crate. Little-endian hosts only: `struct bpf_insn` packs the
//! registers in a bitfield whose order follows the host's byte order.

#[cfg(target_endian = "big")]
compile_error!("tests::rawbpf encodes bpf_insn registers for little-endian hosts");

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use router_common::maps::{FlowCount, FlowEntry, FlowKey};

pub const XDP_DROP: i32 = 1;
pub const XDP_PASS: i32 = 2;
pub const XDP_TX: i32 = 3;

pub use router_common::bpf_insn::Insn;
use router_common::bpf_insn::{insn, map_update};

// Opcodes (include/uapi/linux/bpf.h, bpf_common.h).
const LDX_W: u8 = 0x61;
const LDX_H: u8 = 0x69;
const LDX_B: u8 = 0x71;
const LDX_DW: u8 = 0x79;
const STX_DW: u8 = 0x7b;
/// `BPF_LD | BPF_IMM | BPF_DW`: a 64-bit immediate over two instructions.
const LD_IMM64: u8 = 0x18;
const ST_W: u8 = 0x62;
const STX_H: u8 = 0x6b;
const STX_B: u8 = 0x73;
const STX_W: u8 = 0x63;
const ST_B: u8 = 0x72;
const ST_DW: u8 = 0x7a;
const ALU64_ADD_K: u8 = 0x07;
const ALU64_RSH_K: u8 = 0x77;
const ALU64_AND_K: u8 = 0x57;
const ALU64_XOR_K: u8 = 0xa7;
const ALU64_MOD_K: u8 = 0x97;
const ALU64_MOV_K: u8 = 0xb7;
const ALU64_MOV_X: u8 = 0xbf;
const ALU64_ADD_X: u8 = 0x0f;
/// `BPF_ALU | BPF_END | BPF_TO_BE`: to big endian (a byte swap on x86).
const ALU_END_TO_BE: u8 = 0xdc;
const JMP_JGT_X: u8 = 0x2d;
const JMP_JEQ_K: u8 = 0x15;
const JMP_JNE_K: u8 = 0x55;
const JMP_JLT_K: u8 = 0xa5;
const JMP_JLE_K: u8 = 0xb5;
const JMP_CALL: u8 = 0x85;
const JMP_EXIT: u8 = 0x95;

/// `bpf_map_lookup_elem(map, key)`.
const FN_MAP_LOOKUP_ELEM: i32 = 1;
/// `bpf_get_prandom_u32`.
const FN_GET_PRANDOM_U32: i32 = 7;
/// `bpf_redirect(ifindex, flags)`.
const FN_REDIRECT: i32 = 23;
/// `bpf_fib_lookup(ctx, params, plen, flags)`.
const FN_FIB_LOOKUP: i32 = 69;
/// The frame pointer (read-only stack base).
const FP: u8 = 10;

/// Packet offsets of the fields the programs touch (Ethernet + IPv4
/// without options + UDP, or Ethernet + IPv6 without extension headers).
const ETHERTYPE_OFF: i16 = 12;
const IP_PROTO_OFF: i16 = 23;
/// The IPv6 next header (the L4 protocol without extension headers).
const IP6_NEXT_HEADER_OFF: i16 = 20;
const IP_TOS_OFF: i16 = 15;
const IP_TOT_LEN_OFF: i16 = 16;
const IP_TTL_OFF: i16 = 22;
const IP_CSUM_OFF: i16 = 24;
const IP_SRC_OFF: i16 = 26;
const IP_DST_OFF: i16 = 30;
/// Ethernet + IPv4 without options.
const IPV4_HDRS_LEN: i32 = 34;
/// The UDP or TCP ports right after an IPv4 header without options.
const L4_SPORT_OFF: i16 = 34;
const L4_DPORT_OFF: i16 = 36;
/// `struct xdp_md`: `ingress_ifindex`.
const XDP_MD_INGRESS_IFINDEX: i16 = 12;
/// Ethernet + IPv4 + UDP headers.
pub const UDP_HDRS_LEN: usize = 42;
/// Ethernet + IPv6 + UDP headers.
pub const UDP6_HDRS_LEN: usize = 62;

/// Where the generator finds the UDP header in its frame template: the
/// same program serves IPv4 and IPv6. IPv6 has no header checksum, and
/// IPv4's does not cover the ports, so on either only the UDP checksum
/// changes with the source port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpLayout {
    /// Offset of the UDP source port in the frame.
    pub sport_off: usize,
    /// Offset of the UDP checksum: the last two bytes of the headers.
    pub csum_off: usize,
    /// Whether a checksum of 0 means "none" (IPv4) rather than being
    /// invalid (IPv6, RFC 8200 8.1).
    pub csum_optional: bool,
}

impl UdpLayout {
    /// Ethernet + IPv4 without options + UDP.
    pub const IPV4: Self = Self {
        sport_off: 34,
        csum_off: 40,
        csum_optional: true,
    };
    /// Ethernet + IPv6 without extension headers + UDP.
    pub const IPV6: Self = Self {
        sport_off: 54,
        csum_off: 60,
        csum_optional: false,
    };

    /// Length of Ethernet + IP + UDP headers.
    #[must_use]
    pub const fn headers_len(self) -> usize {
        self.csum_off + 2
    }
}

/// Index of the jump in [`bounds`].
const BOUNDS_JUMP: usize = 4;

/// `r2 = ctx->data; r3 = ctx->data_end; r4 = r2 + len` from the context in
/// `ctx_reg`, then `if r4 > r3 goto` (at [`BOUNDS_JUMP`], offset patched by
/// the caller).
fn bounds(ctx_reg: u8, len: i32) -> [Insn; 5] {
    [
        insn(LDX_W, 2, ctx_reg, 0, 0),
        insn(LDX_W, 3, ctx_reg, 4, 0),
        insn(ALU64_MOV_X, 4, 2, 0, 0),
        insn(ALU64_ADD_K, 4, 0, 0, len),
        insn(JMP_JGT_X, 4, 3, 0, 0),
    ]
}

fn off16(x: usize) -> i16 {
    i16::try_from(x).expect("offset within a frame")
}

/// Points the jump at `at` to `target` (instruction indexes).
fn patch_jump(v: &mut [Insn], at: usize, target: usize) {
    v[at].off = i16::try_from(target - at - 1).expect("short program");
}

fn ret(verdict: i32) -> [Insn; 2] {
    [
        insn(ALU64_MOV_K, 0, 0, 0, verdict),
        insn(JMP_EXIT, 0, 0, 0, 0),
    ]
}

/// `return verdict`.
#[must_use]
pub fn constant(verdict: i32) -> Vec<Insn> {
    ret(verdict).to_vec()
}

/// The traffic generator, for `BPF_PROG_RUN` in live-frame mode: writes
/// `headers` (Ethernet + IP + UDP, laid out as `layout` says) over the
/// frame, sets the UDP source port to `base_port + random % flows`,
/// updates the UDP checksum for it (RFC 1624, from the port and checksum
/// in `headers`; a result of 0 is sent as 0xffff; an IPv4 checksum of 0,
/// "none", stays 0), and returns `XDP_TX`, which live-frame mode turns
/// into a transmit on the ingress interface.
///
/// It rewrites every header byte on every run because live-frame mode
/// recycles pages without re-initialising them: a page comes back after
/// the router has rewritten it (NAT, TTL or hop limit, MACs). Nobody
/// touches the payload, so it stays as initialised.
///
/// # Panics
/// If `flows` is 0, the ports do not fit in 16 bits, `headers` is not
/// `layout.headers_len()` long, the checksum is not 4-byte aligned or is
/// 0 where it is mandatory (IPv6).
#[must_use]
pub fn udp_generator(headers: &[u8], layout: UdpLayout, flows: u16, base_port: u16) -> Vec<Insn> {
    assert!(flows > 0 && u32::from(base_port) + u32::from(flows) <= 65536);
    assert_eq!(headers.len(), layout.headers_len(), "UDP frame headers");
    // Everything before the checksum is stored in 4-byte words.
    assert_eq!(layout.csum_off % 4, 0, "the UDP checksum is word-aligned");
    // One's complement sums commute with byte swapping, so the update is
    // computed on 16-bit words as a native load sees them: the fixed part
    // is ~HC + ~m (old checksum and old port), the program adds m'.
    let word = |at: usize| u32::from(u16::from_ne_bytes([headers[at], headers[at + 1]]));
    let csum = word(layout.csum_off);
    assert!(
        csum != 0 || layout.csum_optional,
        "the template's UDP checksum is mandatory here and must not be 0"
    );
    let fixed = (!csum & 0xffff) + (!word(layout.sport_off) & 0xffff);
    let mut v = vec![
        // r6 = ctx (the call clobbers r1-r5).
        insn(ALU64_MOV_X, 6, 1, 0, 0),
        insn(JMP_CALL, 0, 0, 0, FN_GET_PRANDOM_U32),
        insn(ALU64_MOD_K, 0, 0, 0, i32::from(flows)),
        insn(ALU64_ADD_K, 0, 0, 0, i32::from(base_port)),
        insn(ALU_END_TO_BE, 0, 0, 0, 16),
        // r7 = the new port as stored.
        insn(ALU64_MOV_X, 7, 0, 0, 0),
    ];
    if csum != 0 {
        // r0 = fold(constant + m'), twice; then ~, with 0 sent as 0xffff.
        v.push(insn(ALU64_ADD_K, 0, 0, 0, fixed.cast_signed()));
        for _ in 0..2 {
            v.extend([
                insn(ALU64_MOV_X, 1, 0, 0, 0),
                insn(ALU64_RSH_K, 1, 0, 0, 16),
                insn(ALU64_AND_K, 0, 0, 0, 0xffff),
                insn(ALU64_ADD_X, 0, 1, 0, 0),
            ]);
        }
        v.extend([
            insn(ALU64_XOR_K, 0, 0, 0, 0xffff),
            insn(JMP_JNE_K, 0, 0, 1, 0),
            insn(ALU64_MOV_K, 0, 0, 0, 0xffff),
        ]);
    } else {
        v.push(insn(ALU64_MOV_K, 0, 0, 0, 0));
    }
    let check = v.len() + BOUNDS_JUMP;
    v.extend(bounds(
        6,
        i32::try_from(layout.headers_len()).expect("short headers"),
    ));
    for (i, w) in headers[..layout.csum_off].chunks_exact(4).enumerate() {
        let off = off16(i * 4);
        let imm = i32::from_ne_bytes(w.try_into().unwrap());
        v.push(insn(ST_W, 2, 0, off, imm));
    }
    v.extend([
        insn(STX_H, 2, 7, off16(layout.sport_off), 0),
        insn(STX_H, 2, 0, off16(layout.csum_off), 0),
    ]);
    v.extend(ret(XDP_TX));
    let drop = v.len();
    v.extend(ret(XDP_DROP));
    patch_jump(&mut v, check, drop);
    v
}

/// The sink: drops IPv4 and IPv6 UDP (an IPv6 header without extension
/// headers), passes everything else (ARP, NDP, and ICMP and `ICMPv6` so
/// that ping measures latency through the router during the load).
#[must_use]
pub fn udp_sink() -> Vec<Insn> {
    let mut v = bounds(1, 34).to_vec();
    let mut to_pass = vec![BOUNDS_JUMP];
    // r5 = the Ethernet type, r3 = the byte at the IPv6 next header (the
    // bounds cover both candidate protocol bytes).
    v.extend([
        insn(LDX_H, 5, 2, ETHERTYPE_OFF, 0),
        insn(LDX_B, 3, 2, IP6_NEXT_HEADER_OFF, 0),
        // 0x86dd as a native load sees it: r3 is the protocol.
        insn(
            JMP_JEQ_K,
            5,
            0,
            2,
            i32::from(u16::from_ne_bytes([0x86, 0xdd])),
        ),
        // 0x0800 likewise.
        insn(
            JMP_JNE_K,
            5,
            0,
            0,
            i32::from(u16::from_ne_bytes([0x08, 0x00])),
        ),
        insn(LDX_B, 3, 2, IP_PROTO_OFF, 0),
    ]);
    to_pass.push(v.len() - 2);
    v.push(insn(JMP_JNE_K, 3, 0, 0, 17));
    to_pass.push(v.len() - 1);
    v.extend(ret(XDP_DROP));
    let pass = v.len();
    v.extend(ret(XDP_PASS));
    for at in to_pass {
        patch_jump(&mut v, at, pass);
    }
    v
}

/// `struct bpf_fib_lookup` on the stack at `FP + FIB`: its size and the
/// offsets of the fields the limit fills or reads.
const FIB: i16 = -64;
const FIB_SIZE: i32 = 64;
const FIB_FAMILY: i16 = FIB;
const FIB_L4_PROTO: i16 = FIB + 1;
const FIB_TOT_LEN: i16 = FIB + 6;
const FIB_IFINDEX: i16 = FIB + 8;
const FIB_TOS: i16 = FIB + 12;
const FIB_SRC: i16 = FIB + 16;
const FIB_DST: i16 = FIB + 32;
const FIB_SMAC: i16 = FIB + 52;
const FIB_DMAC: i16 = FIB + 58;
const AF_INET: i32 = 2;

/// The limit: a minimal XDP forwarder as xdp-tools' `xdp-forward` does it
/// in fib mode, and nothing more (no NAT, no flow table, no counters).
/// IPv4 with TTL > 1: `bpf_fib_lookup` on the addresses, TOS and length;
/// on success the TTL is decremented (checksum updated as the kernel's
/// `ip_decrease_ttl` does), the MACs are set from the lookup and the frame
/// is redirected to the egress interface (`bpf_redirect`: the same bulk
/// queue as a devmap, without the map). Everything else, and every lookup
/// that does not succeed (no neighbour yet, too big, local), is passed to
/// the kernel. What a NAT router cannot beat on the same topology.
#[must_use]
pub fn fib_forwarder() -> Vec<Insn> {
    forwarder(None)
}

/// The limit ([`fib_forwarder`]) plus one lookup of the packet's 5-tuple
/// in `table` and, on a hit, one plain 8-byte add of 1 at `count_off` in
/// the value (as the router counts a flow's packets): a control for the
/// router's flow table, what the kernel's hash table alone costs per
/// packet at a given working set. The key has [`FlowKey`]'s layout, built
/// from any IPv4 packet with at least 4 bytes after a 20-byte header (the
/// ports of UDP or TCP; other protocols simply miss). The lookup comes
/// before the FIB's, so it happens (and counts) also for packets the FIB
/// then passes to the kernel.
///
/// # Panics
/// If the 8 bytes at `count_off` do not fit in the table's value.
#[must_use]
pub fn flow_lookup_forwarder(table: &FlowTable, count_off: u32) -> Vec<Insn> {
    assert!(
        count_off
            .checked_add(8)
            .is_some_and(|end| end <= table.value_size),
        "the count at {count_off} lies outside the {}-byte value",
        table.value_size
    );
    let count_off = i16::try_from(count_off).expect("small value");
    forwarder(Some((table.fd.as_raw_fd(), count_off)))
}

/// Where the router counts a direction's packets in its [`FlowEntry`]:
/// where [`flow_lookup_forwarder`] adds, for a table of its values.
pub const FLOW_ENTRY_PACKETS_OFF: u32 =
    (std::mem::offset_of!(FlowEntry, count) + std::mem::offset_of!(FlowCount, packets)) as u32;

/// `bpf_map_lookup_elem`'s key on the stack at `FP + KEY`, below the FIB
/// parameters: a [`FlowKey`].
const KEY: i16 = FIB - 16;
const _: () = assert!(size_of::<FlowKey>() == 16);

/// The stack offset of the key's field at `field` (bytes into [`FlowKey`]).
fn key_at(field: usize) -> i16 {
    KEY + off16(field)
}

/// The flow lookup of [`flow_lookup_forwarder`], with the context in r6;
/// ends with the packet pointers loaded again (r2, r3) and checked for
/// the IPv4 headers, jumps that fail pushed to `to_pass`. The key's ports
/// are stored in host order, as [`FlowKey`] keeps them.
fn flow_lookup(v: &mut Vec<Insn>, to_pass: &mut Vec<usize>, map_fd: i32, count_off: i16) {
    let short = v.len() + BOUNDS_JUMP;
    v.extend(bounds(6, i32::from(L4_DPORT_OFF) + 2));
    v.extend([
        // Proto and padding first: the helper reads all 16 bytes.
        insn(
            ST_DW,
            FP,
            0,
            key_at(std::mem::offset_of!(FlowKey, src_port)),
            0,
        ),
        insn(LDX_W, 5, 2, IP_SRC_OFF, 0),
        insn(
            STX_W,
            FP,
            5,
            key_at(std::mem::offset_of!(FlowKey, src_addr)),
            0,
        ),
        insn(LDX_W, 5, 2, IP_DST_OFF, 0),
        insn(
            STX_W,
            FP,
            5,
            key_at(std::mem::offset_of!(FlowKey, dst_addr)),
            0,
        ),
        insn(LDX_H, 5, 2, L4_SPORT_OFF, 0),
        insn(ALU_END_TO_BE, 5, 0, 0, 16),
        insn(
            STX_H,
            FP,
            5,
            key_at(std::mem::offset_of!(FlowKey, src_port)),
            0,
        ),
        insn(LDX_H, 5, 2, L4_DPORT_OFF, 0),
        insn(ALU_END_TO_BE, 5, 0, 0, 16),
        insn(
            STX_H,
            FP,
            5,
            key_at(std::mem::offset_of!(FlowKey, dst_port)),
            0,
        ),
        insn(LDX_B, 5, 2, IP_PROTO_OFF, 0),
        insn(
            STX_B,
            FP,
            5,
            key_at(std::mem::offset_of!(FlowKey, proto)),
            0,
        ),
    ]);
    v.extend(ld_map_fd(1, map_fd));
    v.extend([
        insn(ALU64_MOV_X, 2, FP, 0, 0),
        insn(ALU64_ADD_K, 2, 0, 0, KEY.into()),
        insn(JMP_CALL, 0, 0, 0, FN_MAP_LOOKUP_ELEM),
        // A miss: nothing to count.
        insn(JMP_JEQ_K, 0, 0, 3, 0),
        insn(LDX_DW, 1, 0, count_off, 0),
        insn(ALU64_ADD_K, 1, 0, 0, 1),
        insn(STX_DW, 0, 1, count_off, 0),
    ]);
    let after = v.len();
    patch_jump(v, short, after);
    // The call invalidated the packet pointers: load and check them again.
    to_pass.push(v.len() + BOUNDS_JUMP);
    v.extend(bounds(6, IPV4_HDRS_LEN));
}

/// [`fib_forwarder`], with [`flow_lookup`] in the map of the fd given
/// (counting at the offset given) after the checks of the IPv4 header.
fn forwarder(lookup: Option<(i32, i16)>) -> Vec<Insn> {
    let mut v = vec![insn(ALU64_MOV_X, 6, 1, 0, 0)];
    let mut to_pass = vec![v.len() + BOUNDS_JUMP];
    v.extend(bounds(6, IPV4_HDRS_LEN));
    v.extend([
        insn(LDX_H, 5, 2, ETHERTYPE_OFF, 0),
        insn(
            JMP_JNE_K,
            5,
            0,
            0,
            i32::from(u16::from_ne_bytes([0x08, 0x00])),
        ),
    ]);
    to_pass.push(v.len() - 1);
    v.extend([
        insn(LDX_B, 5, 2, IP_TTL_OFF, 0),
        insn(JMP_JLE_K, 5, 0, 0, 1),
    ]);
    to_pass.push(v.len() - 1);
    if let Some((map_fd, count_off)) = lookup {
        flow_lookup(&mut v, &mut to_pass, map_fd, count_off);
    }
    // The lookup's parameters, zeroed first (the helper reads all of them).
    for i in 0..FIB_SIZE / 8 {
        v.push(insn(
            ST_DW,
            FP,
            0,
            FIB + off16(usize::try_from(i * 8).unwrap()),
            0,
        ));
    }
    v.extend([
        insn(ST_B, FP, 0, FIB_FAMILY, AF_INET),
        insn(LDX_B, 5, 2, IP_PROTO_OFF, 0),
        insn(STX_B, FP, 5, FIB_L4_PROTO, 0),
        // tot_len in host order (the helper's MTU check).
        insn(LDX_H, 5, 2, IP_TOT_LEN_OFF, 0),
        insn(ALU_END_TO_BE, 5, 0, 0, 16),
        insn(STX_H, FP, 5, FIB_TOT_LEN, 0),
        insn(LDX_W, 5, 6, XDP_MD_INGRESS_IFINDEX, 0),
        insn(STX_W, FP, 5, FIB_IFINDEX, 0),
        insn(LDX_B, 5, 2, IP_TOS_OFF, 0),
        insn(STX_B, FP, 5, FIB_TOS, 0),
        insn(LDX_W, 5, 2, IP_SRC_OFF, 0),
        insn(STX_W, FP, 5, FIB_SRC, 0),
        insn(LDX_W, 5, 2, IP_DST_OFF, 0),
        insn(STX_W, FP, 5, FIB_DST, 0),
        insn(ALU64_MOV_X, 1, 6, 0, 0),
        insn(ALU64_MOV_X, 2, FP, 0, 0),
        insn(ALU64_ADD_K, 2, 0, 0, FIB.into()),
        insn(ALU64_MOV_K, 3, 0, 0, FIB_SIZE),
        insn(ALU64_MOV_K, 4, 0, 0, 0),
        insn(JMP_CALL, 0, 0, 0, FN_FIB_LOOKUP),
        // BPF_FIB_LKUP_RET_SUCCESS is 0.
        insn(JMP_JNE_K, 0, 0, 0, 0),
    ]);
    to_pass.push(v.len() - 1);
    // The call invalidated the packet pointers: load and check them again.
    to_pass.push(v.len() + BOUNDS_JUMP);
    v.extend(bounds(6, IPV4_HDRS_LEN));
    // ip_decrease_ttl: check += htons(0x0100), with the end-around carry.
    v.extend([
        insn(LDX_H, 5, 2, IP_CSUM_OFF, 0),
        insn(
            ALU64_ADD_K,
            5,
            0,
            0,
            i32::from(u16::from_ne_bytes([0x01, 0x00])),
        ),
        insn(JMP_JLT_K, 5, 0, 1, 0xffff),
        insn(ALU64_ADD_K, 5, 0, 0, 1),
        insn(STX_H, 2, 5, IP_CSUM_OFF, 0),
        insn(LDX_B, 5, 2, IP_TTL_OFF, 0),
        insn(ALU64_ADD_K, 5, 0, 0, -1),
        insn(STX_B, 2, 5, IP_TTL_OFF, 0),
        // Destination MAC (bytes 0-5) from dmac, source (6-11) from smac;
        // every load and store naturally aligned on the stack.
        insn(LDX_H, 5, FP, FIB_DMAC, 0),
        insn(STX_H, 2, 5, 0, 0),
        insn(LDX_W, 5, FP, FIB_DMAC + 2, 0),
        insn(STX_W, 2, 5, 2, 0),
        insn(LDX_W, 5, FP, FIB_SMAC, 0),
        insn(STX_W, 2, 5, 6, 0),
        insn(LDX_H, 5, FP, FIB_SMAC + 4, 0),
        insn(STX_H, 2, 5, 10, 0),
        insn(LDX_W, 1, FP, FIB_IFINDEX, 0),
        insn(ALU64_MOV_K, 2, 0, 0, 0),
        insn(JMP_CALL, 0, 0, 0, FN_REDIRECT),
        insn(JMP_EXIT, 0, 0, 0, 0),
    ]);
    let pass = v.len();
    v.extend(ret(XDP_PASS));
    for at in to_pass {
        patch_jump(&mut v, at, pass);
    }
    v
}

/// The cable: redirects every frame to `ifindex` (`bpf_redirect`), as a
/// wire between two interfaces would carry it.
///
/// # Panics
/// If `ifindex` does not fit an instruction's immediate.
#[must_use]
pub fn redirect_all(ifindex: u32) -> Vec<Insn> {
    vec![
        insn(
            ALU64_MOV_K,
            1,
            0,
            0,
            i32::try_from(ifindex).expect("ifindex < 2^31"),
        ),
        insn(ALU64_MOV_K, 2, 0, 0, 0),
        insn(JMP_CALL, 0, 0, 0, FN_REDIRECT),
        insn(JMP_EXIT, 0, 0, 0, 0),
    ]
}

#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
    rest: [u64; 4],
}

/// `BPF_MAP_*_ELEM`'s part of `union bpf_attr`.
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;
/// How [`Prog::run_live`]'s error starts where the kernel refuses
/// live-frame mode to this process (`EPERM`): not a fault of the program
/// or the generator, a limit of the machine the tests run on.
pub const LIVE_FRAMES_NOT_PERMITTED: &str = "BPF_PROG_RUN live-frame mode is not permitted here";
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// `BPF_F_XDP_HAS_FRAGS`: the program handles multi-buffer frames (what
/// `#[xdp(frags)]` sets).
pub const BPF_F_XDP_HAS_FRAGS: u32 = 1 << 5;
const LOG_SIZE: usize = 64 * 1024;

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> libc::c_long {
    // SAFETY: `attr` is a live, fully initialised repr(C) bpf_attr prefix
    // of the given size; the kernel zero-extends it.
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            size_of::<T>(),
        )
    }
}

/// The bytes of a map key or value as the kernel stores them.
#[must_use]
pub fn pod_bytes<T: aya::Pod>(v: &T) -> &[u8] {
    // SAFETY: `Pod` types are `repr(C)` without padding (router-common
    // asserts their sizes), so every byte is initialised; the slice
    // borrows `v`.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref(v).cast::<u8>(), size_of::<T>()) }
}

/// `what: <the last OS error>`.
#[must_use]
pub fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

/// `struct xdp_md` with `ingress_ifindex` set.
///
/// # Panics
/// If `len` does not fit in 32 bits.
#[must_use]
pub fn xdp_ctx(len: usize, ingress: u32) -> [u8; 24] {
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&u32::try_from(len).unwrap().to_ne_bytes());
    ctx[12..16].copy_from_slice(&ingress.to_ne_bytes());
    ctx
}

/// A loaded XDP program (closed on drop).
pub struct Prog {
    fd: OwnedFd,
}

/// An XDP program attached in native mode through a BPF link: detached
/// when dropped (or when the process exits).
pub struct XdpLink {
    _fd: OwnedFd,
}

impl Prog {
    /// Loads `insns` as an XDP program called `name`.
    ///
    /// # Errors
    /// If the kernel refuses it; a verifier error carries the verifier's log.
    ///
    /// # Panics
    /// If the program has more than `u32::MAX` instructions.
    pub fn load(name: &str, insns: &[Insn]) -> Result<Self, String> {
        Self::load_with_flags(name, insns, 0)
    }

    /// [`Prog::load`] with `BPF_PROG_LOAD` flags (e.g. [`BPF_F_XDP_HAS_FRAGS`]).
    ///
    /// # Errors
    /// If the kernel refuses it; a verifier error carries the verifier's log.
    ///
    /// # Panics
    /// If the program has more than `u32::MAX` instructions.
    pub fn load_with_flags(name: &str, insns: &[Insn], prog_flags: u32) -> Result<Self, String> {
        let license = c"GPL";
        let mut prog_name = [0u8; 16];
        let n = name.len().min(15);
        prog_name[..n].copy_from_slice(&name.as_bytes()[..n]);
        let mut log = vec![0u8; LOG_SIZE];
        let mut attr = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_XDP,
            insn_cnt: u32::try_from(insns.len()).unwrap(),
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_flags,
            prog_name,
            ..ProgLoadAttr::default()
        };
        let mut fd = bpf(BPF_PROG_LOAD, &mut attr);
        if fd < 0 {
            let err = os_err(&format!("loading the XDP program {name}"));
            // Again with the verifier's log, for the message.
            attr.log_level = 1;
            attr.log_size = LOG_SIZE as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            fd = bpf(BPF_PROG_LOAD, &mut attr);
            if fd >= 0 {
                // SAFETY: our own new fd, not used elsewhere.
                unsafe { libc::close(i32::try_from(fd).unwrap()) };
            }
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            return Err(format!(
                "{err}; verifier log: {}",
                String::from_utf8_lossy(&log[..end]).trim()
            ));
        }
        // SAFETY: a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).unwrap()) };
        Ok(Self { fd })
    }

    fn raw_fd(&self) -> u32 {
        self.fd.as_raw_fd().cast_unsigned()
    }

    /// One `BPF_PROG_RUN` on a copy of `frame` as if it arrived on
    /// `ingress`, `repeat` times: (verdict, ns per run, output frame).
    ///
    /// # Errors
    /// If `BPF_PROG_RUN` fails.
    ///
    /// # Panics
    /// If the frame is longer than 4 GiB.
    pub fn test_run(
        &self,
        frame: &[u8],
        ingress: u32,
        repeat: u32,
    ) -> Result<(u32, f64, Vec<u8>), String> {
        let mut out = vec![0u8; frame.len() + 256];
        let ctx = xdp_ctx(frame.len(), ingress);
        let mut attr = TestRunAttr {
            prog_fd: self.raw_fd(),
            data_size_in: u32::try_from(frame.len()).unwrap(),
            data_size_out: u32::try_from(out.len()).unwrap(),
            data_in: frame.as_ptr() as u64,
            data_out: out.as_mut_ptr() as u64,
            repeat,
            ctx_size_in: ctx.len() as u32,
            ctx_in: ctx.as_ptr() as u64,
            ..TestRunAttr::default()
        };
        if bpf(BPF_PROG_TEST_RUN, &mut attr) != 0 {
            return Err(os_err("BPF_PROG_RUN"));
        }
        out.truncate(attr.data_size_out as usize);
        Ok((attr.retval, f64::from(attr.duration), out))
    }

    /// `BPF_PROG_RUN` in live-frame mode: runs the program `repeat` times
    /// on fresh frames initialised from `frame`, as if received on
    /// `ingress` (an interface of the calling thread's network namespace),
    /// and carries out each verdict for real (`XDP_TX` transmits on
    /// `ingress`). Kernel >= 5.18.
    ///
    /// # Errors
    /// If `BPF_PROG_RUN` fails (`EINVAL` on kernels without live frames).
    ///
    /// # Panics
    /// If the frame is longer than 4 GiB.
    pub fn run_live(
        &self,
        frame: &[u8],
        ingress: u32,
        repeat: u32,
        batch: u32,
    ) -> Result<(), String> {
        let ctx = xdp_ctx(frame.len(), ingress);
        let mut attr = TestRunAttr {
            prog_fd: self.raw_fd(),
            data_size_in: u32::try_from(frame.len()).unwrap(),
            data_in: frame.as_ptr() as u64,
            repeat,
            ctx_size_in: ctx.len() as u32,
            ctx_in: ctx.as_ptr() as u64,
            flags: BPF_F_TEST_XDP_LIVE_FRAMES,
            batch_size: batch,
            ..TestRunAttr::default()
        };
        if bpf(BPF_PROG_TEST_RUN, &mut attr) != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EPERM) {
                return Err(format!(
                    "{LIVE_FRAMES_NOT_PERMITTED} ({e}: the kernel refuses this process \
                     BPF_F_TEST_XDP_LIVE_FRAMES, as some sandboxes do, although it loads and \
                     test-runs programs)"
                ));
            }
            return Err(format!("BPF_PROG_RUN with BPF_F_TEST_XDP_LIVE_FRAMES: {e}"));
        }
        Ok(())
    }

    /// Attaches the program in native (driver) mode to `ifindex` of the
    /// calling thread's network namespace.
    ///
    /// # Errors
    /// If the kernel refuses (no such interface, a program already there,
    /// no native XDP).
    pub fn attach_native(&self, ifindex: u32) -> Result<XdpLink, String> {
        let mut attr = LinkCreateAttr {
            prog_fd: self.raw_fd(),
            target_ifindex: ifindex,
            attach_type: BPF_XDP,
            flags: XDP_FLAGS_DRV_MODE,
            ..LinkCreateAttr::default()
        };
        let fd = bpf(BPF_LINK_CREATE, &mut attr);
        if fd < 0 {
            return Err(os_err(&format!("attaching XDP to ifindex {ifindex}")));
        }
        // SAFETY: a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).unwrap()) };
        Ok(XdpLink { _fd: fd })
    }
}

/// `BPF_MAP_TYPE_LRU_HASH`: the router's flow table's type.
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// `BPF_PSEUDO_MAP_FD`: the `src_reg` of an `ld_imm64` whose immediate is
/// a map's fd, which the kernel replaces by the map at load time.
const BPF_PSEUDO_MAP_FD: u8 = 1;

/// `r<dst> = the map of map_fd`: the `ld_imm64` that names a map by fd,
/// which the kernel relocates to the map when the program is loaded (so
/// the fd must be open then; the program keeps the map alive after).
fn ld_map_fd(dst: u8, map_fd: i32) -> [Insn; 2] {
    [
        insn(LD_IMM64, dst, BPF_PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0),
    ]
}

/// The start of `union bpf_attr` for `BPF_MAP_CREATE`.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
}

/// `union bpf_attr` for the batch commands.
#[repr(C)]
struct MapBatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Writes `keys[i] -> values[i]` into the map `map` (`BPF_ANY`) with one
/// `BPF_MAP_UPDATE_BATCH` call (kernel >= 5.6).
///
/// # Errors
/// The OS error if the call fails (`EINVAL` on kernels or map types
/// without batch updates), or if the kernel wrote fewer entries.
///
/// # Panics
/// If `keys` and `values` differ in length.
pub fn update_batch<K: Copy, V: Copy>(
    map: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> std::io::Result<()> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    let count = u32::try_from(keys.len()).map_err(std::io::Error::other)?;
    let mut attr = MapBatchAttr {
        in_batch: 0,
        out_batch: 0,
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count,
        map_fd: map.as_raw_fd().cast_unsigned(),
        elem_flags: 0,
        flags: 0,
    };
    // The caller's key and value types have the map's sizes (the kernel
    // reads `count` of each) and outlive the call.
    if bpf(BPF_MAP_UPDATE_BATCH, &mut attr) < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if attr.count != count {
        return Err(std::io::Error::other(format!(
            "the kernel wrote {} of {count} entries",
            attr.count
        )));
    }
    Ok(())
}

/// A `BPF_MAP_TYPE_LRU_HASH` of [`FlowKey`] to values of `value_size`
/// bytes, created with the `bpf(2)` syscall for a raw program (closed on
/// drop; a program that uses it keeps it alive while loaded).
pub struct FlowTable {
    fd: OwnedFd,
    value_size: u32,
}

impl FlowTable {
    /// A new, empty table of `max_entries` entries (preallocated, as the
    /// kernel does every LRU hash) named `name`.
    ///
    /// # Errors
    /// If the kernel refuses (memory, limits).
    pub fn create(name: &str, value_size: u32, max_entries: u32) -> Result<Self, String> {
        let mut map_name = [0u8; 16];
        let n = name.len().min(15);
        map_name[..n].copy_from_slice(&name.as_bytes()[..n]);
        let mut attr = MapCreateAttr {
            map_type: BPF_MAP_TYPE_LRU_HASH,
            key_size: size_of::<FlowKey>() as u32,
            value_size,
            max_entries,
            map_name,
            ..MapCreateAttr::default()
        };
        let fd = bpf(BPF_MAP_CREATE, &mut attr);
        if fd < 0 {
            return Err(os_err(&format!(
                "creating the LRU hash {name} ({max_entries} entries of {value_size}-byte values)"
            )));
        }
        // SAFETY: a new fd that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).unwrap()) };
        Ok(Self { fd, value_size })
    }

    /// Bytes per value.
    #[must_use]
    pub fn value_size(&self) -> u32 {
        self.value_size
    }

    /// Where a packet count goes in this table's values: where the router
    /// counts a direction's packets ([`FLOW_ENTRY_PACKETS_OFF`]), or the
    /// last 8 bytes of a value too small for that.
    ///
    /// # Panics
    /// If the values are shorter than 8 bytes.
    #[must_use]
    pub fn packets_off(&self) -> u32 {
        FLOW_ENTRY_PACKETS_OFF.min(self.value_size.checked_sub(8).expect("8-byte values"))
    }

    /// The packet count of `key` at [`FlowTable::packets_off`], if the
    /// table has the key.
    #[must_use]
    pub fn packets(&self, key: &FlowKey) -> Option<u64> {
        let at = self.packets_off() as usize;
        let v = self.get(key)?;
        Some(u64::from_ne_bytes(
            v[at..at + 8].try_into().expect("8 bytes"),
        ))
    }

    /// Writes `key -> value` (`BPF_ANY`).
    ///
    /// # Errors
    /// If the kernel refuses.
    ///
    /// # Panics
    /// If `value` is not [`FlowTable::value_size`] long.
    pub fn insert(&self, key: &FlowKey, value: &[u8]) -> Result<(), String> {
        assert_eq!(value.len(), self.value_size as usize, "value size");
        map_update(self.fd.as_fd(), pod_bytes(key), value)
            .map_err(|e| format!("BPF_MAP_UPDATE_ELEM: {e}"))
    }

    /// The value of `key`, if the table has it.
    #[must_use]
    pub fn get(&self, key: &FlowKey) -> Option<Vec<u8>> {
        let mut value = vec![0u8; self.value_size as usize];
        let mut attr = MapElemAttr {
            map_fd: self.fd.as_raw_fd().cast_unsigned(),
            pad: 0,
            key: std::ptr::from_ref(key) as u64,
            value: value.as_mut_ptr() as u64,
            flags: 0,
        };
        (bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) == 0).then_some(value)
    }
}

impl AsFd for FlowTable {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// One raw program attached in native mode to several interfaces of the
/// calling thread's network namespace; detached from all when dropped.
pub struct Attached {
    _links: Vec<XdpLink>,
    _prog: Prog,
}

impl Attached {
    /// Loads `insns` as `name` and attaches it to every one of `ifindexes`.
    ///
    /// # Errors
    /// If the program cannot be loaded or one attach fails (the ones
    /// already made are undone).
    pub fn new(name: &str, insns: &[Insn], ifindexes: &[u32]) -> Result<Self, String> {
        let prog = Prog::load(name, insns)?;
        let links = ifindexes
            .iter()
            .map(|&i| prog.attach_native(i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            _links: links,
            _prog: prog,
        })
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn jumps_land_on_the_verdicts() {
        let mut h = [0; UDP_HDRS_LEN];
        for csum in [[0, 0], [0x12, 0x34]] {
            h[40..].copy_from_slice(&csum);
            let g = udp_generator(&h, UdpLayout::IPV4, 100, 0);
            let j = g.iter().position(|i| i.code == JMP_JGT_X).unwrap();
            let target = j + 1 + usize::try_from(g[j].off).unwrap();
            assert_eq!((g[target].code, g[target].imm), (ALU64_MOV_K, XDP_DROP));
        }
        let mut h6 = [0; UDP6_HDRS_LEN];
        h6[UDP6_HDRS_LEN - 1] = 1;
        let g = udp_generator(&h6, UdpLayout::IPV6, 1000, 20_000);
        let j = g.iter().position(|i| i.code == JMP_JGT_X).unwrap();
        assert_eq!(g[j].imm, 0);
        let target = j + 1 + usize::try_from(g[j].off).unwrap();
        assert_eq!((g[target].code, g[target].imm), (ALU64_MOV_K, XDP_DROP));
        // The bounds cover the IPv6 checksum, the last byte stored.
        assert_eq!(g[j - 1].imm, 62);
        let stores: Vec<i16> = g
            .iter()
            .filter(|i| i.code == STX_H)
            .map(|i| i.off)
            .collect();
        assert_eq!(stores, [54, 60]);
        // The sink's IPv6 branch lands on the protocol check.
        let sink = udp_sink();
        let j = sink.iter().position(|i| i.code == JMP_JEQ_K).unwrap();
        let t = &sink[j + 1 + usize::try_from(sink[j].off).unwrap()];
        assert_eq!((t.code, t.regs, t.imm), (JMP_JNE_K, 3, 17));
        for s in [udp_sink(), fib_forwarder()] {
            for (at, i) in s.iter().enumerate() {
                if matches!(i.code, JMP_JGT_X | JMP_JNE_K | JMP_JLE_K) {
                    let t = &s[at + 1 + usize::try_from(i.off).unwrap()];
                    assert_eq!((t.code, t.imm), (ALU64_MOV_K, XDP_PASS));
                }
            }
        }
    }

    #[test]
    fn the_lookup_builds_a_flow_key_and_its_jumps_land_where_they_should() {
        let v = forwarder(Some((7, 80)));
        // The key's stores: the field offsets of FlowKey, with the bytes
        // after the ports zeroed first.
        let stores: Vec<(u8, i16)> = v
            .iter()
            .filter(|i| i.regs & 0xf == FP && i.off < FIB)
            .map(|i| (i.code, i.off - KEY))
            .collect();
        assert_eq!(
            stores,
            [
                (ST_DW, 8),
                (STX_W, 0),
                (STX_W, 4),
                (STX_H, 8),
                (STX_H, 10),
                (STX_B, 12)
            ]
        );
        let key = FlowKey::new([1; 4], [2; 4], 3, 4, 5);
        assert_eq!(
            [
                std::mem::offset_of!(FlowKey, src_addr),
                std::mem::offset_of!(FlowKey, dst_addr),
                std::mem::offset_of!(FlowKey, src_port),
                std::mem::offset_of!(FlowKey, dst_port),
                std::mem::offset_of!(FlowKey, proto),
            ],
            [0, 4, 8, 10, 12]
        );
        assert_eq!((key.pad, key.pad2), (0, 0));
        // The map's fd, relocated by the kernel.
        let ld = v.iter().position(|i| i.code == LD_IMM64).unwrap();
        assert_eq!((v[ld].regs, v[ld].imm, v[ld + 1].code), (0x11, 7, 0));
        let target = |at: usize| at + 1 + usize::try_from(v[at].off).unwrap();
        // A miss skips the count, a hit adds 1 at the offset given.
        let miss = v.iter().position(|i| i.code == JMP_JEQ_K).unwrap();
        assert_eq!(
            v[miss + 1..target(miss)]
                .iter()
                .map(|i| (i.code, i.off))
                .collect::<Vec<_>>(),
            [(LDX_DW, 80), (ALU64_ADD_K, 0), (STX_DW, 80)]
        );
        // A packet too short for the ports skips the lookup to the new
        // bounds check after it; every other failed check passes.
        let bounds_checks: Vec<usize> =
            (0..v.len()).filter(|&at| v[at].code == JMP_JGT_X).collect();
        assert_eq!(bounds_checks.len(), 4);
        let short = bounds_checks[1];
        assert_eq!(v[short - 1].imm, 38);
        assert_eq!(target(short), miss + 4);
        assert_eq!(target(short) + BOUNDS_JUMP, bounds_checks[2]);
        for (at, i) in v.iter().enumerate() {
            if at != short && matches!(i.code, JMP_JGT_X | JMP_JNE_K | JMP_JLE_K) {
                assert_eq!(
                    (v[target(at)].code, v[target(at)].imm),
                    (ALU64_MOV_K, XDP_PASS)
                );
            }
        }
    }
}
