//! Reading and patching frame fields: checksum residuals, checksums
//! recomputed after a mutation, the lookup keys of a frame.

use super::*;

pub(super) fn is_ipv4(f: &[u8]) -> bool {
    f.len() >= IP_OFF && be16(f, frames::ETHERTYPE_OFF) == frames::ETHERTYPE_IPV4
}

pub(super) fn is_icmp_error_type(t: u8) -> bool {
    matches!(
        t,
        ICMP_DEST_UNREACH | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM
    )
}

/// One's-complement sum of `data` with a 16-bit field at `csum` included
/// (a valid checksum gives 0xffff; 0 and 0xffff are the same number).
pub(super) fn residual(acc: u32, data: &[u8]) -> u16 {
    match fold(sum_words(data, acc)) {
        0 => 0xffff,
        r => r,
    }
}

pub(super) fn pseudo(src: [u8; 4], dst: [u8; 4], proto: u8, len: usize) -> u32 {
    let mut acc = sum_words(&src, 0);
    acc = sum_words(&dst, acc);
    acc + u32::from(proto) + len as u32
}

/// The residual of every checksum [`frames::checksum_errors`] would look
/// at, in the same structure (a UDP checksum of 0, "none", as `None`).
pub(super) fn residuals(
    pkt: &[u8],
    quoted: bool,
    what: &str,
    out: &mut Vec<(String, Option<u16>)>,
) {
    if pkt.len() < 20 {
        return;
    }
    let hlen = usize::from(pkt[0] & 0x0f) * 4;
    if pkt[0] >> 4 != 4 || hlen < 20 || pkt.len() < hlen {
        return;
    }
    out.push((format!("{what} ip"), Some(residual(0, &pkt[..hlen]))));
    let total = usize::from(be16(pkt, 2));
    // A later fragment has no L4 header; a first one's L4 checksum covers
    // the whole datagram, but a translation changes it by exactly what it
    // changes in the header words, so the residual over the fragment's
    // own bytes stays too.
    if total < hlen || total > pkt.len() || be16(pkt, 6) & 0x1fff != 0 {
        return;
    }
    let (src, dst, proto) = (addr(pkt, 12), addr(pkt, 16), pkt[9]);
    let l4 = &pkt[hlen..total];
    match proto {
        IPPROTO_TCP if l4.len() >= 20 => {
            let acc = pseudo(src, dst, proto, l4.len());
            out.push((format!("{what} tcp"), Some(residual(acc, l4))));
        }
        IPPROTO_UDP if l4.len() >= 8 => {
            let r = (be16(l4, 6) != 0).then(|| residual(pseudo(src, dst, proto, l4.len()), l4));
            out.push((format!("{what} udp"), r));
        }
        IPPROTO_ICMP if l4.len() >= 8 => {
            out.push((format!("{what} icmp"), Some(residual(0, l4))));
            if !quoted && is_icmp_error_type(l4[0]) {
                residuals(&l4[8..], true, &format!("{what} > embedded"), out);
            }
        }
        _ => {}
    }
}

pub(super) fn frame_residuals(f: &[u8]) -> Vec<(String, Option<u16>)> {
    let mut v = Vec::new();
    if is_ipv4(f) {
        residuals(&f[IP_OFF..], false, "outer", &mut v);
    }
    v
}

/// Recomputes the checksums of an IPv4 packet (`pkt` may be a quote cut
/// short) where its structure allows; `l4` also the L4 ones.
pub(super) fn fix_packet(pkt: &mut [u8], l4: bool, quoted: bool) {
    if pkt.len() < 20 {
        return;
    }
    let hlen = usize::from(pkt[0] & 0x0f) * 4;
    if hlen < 20 || pkt.len() < hlen {
        return;
    }
    let total = usize::from(be16(pkt, 2));
    if l4 && total >= hlen && total <= pkt.len() && be16(pkt, 6) & 0x3fff == 0 {
        let (src, dst, proto) = (addr(pkt, 12), addr(pkt, 16), pkt[9]);
        let seg = &mut pkt[hlen..total];
        match proto {
            IPPROTO_TCP if seg.len() >= 18 => {
                put16(seg, 16, 0);
                let c = !fold(sum_words(seg, pseudo(src, dst, proto, seg.len())));
                put16(seg, 16, c);
            }
            IPPROTO_UDP if seg.len() >= 8 && be16(seg, 6) != 0 => {
                put16(seg, 6, 0);
                let c = match !fold(sum_words(seg, pseudo(src, dst, proto, seg.len()))) {
                    0 => 0xffff,
                    c => c,
                };
                put16(seg, 6, c);
            }
            IPPROTO_ICMP if seg.len() >= 4 => {
                if !quoted && seg.len() >= 8 && is_icmp_error_type(seg[0]) {
                    fix_packet(&mut seg[8..], true, true);
                }
                put16(seg, 2, 0);
                let c = !fold(sum_words(seg, 0));
                put16(seg, 2, c);
            }
            _ => {}
        }
    }
    pkt[10..12].fill(0);
    let c = !fold(sum_words(&pkt[..hlen], 0));
    pkt[10..12].copy_from_slice(&c.to_be_bytes());
}

/// Fixes the checksums of a frame: the outer IPv4 header always, the L4
/// ones (inner first) when `l4`.
pub(super) fn fix_frame(f: &mut [u8], l4: bool) {
    if is_ipv4(f) {
        fix_packet(&mut f[IP_OFF..], l4, false);
    }
}

/// Sets byte `at` if the frame has it.
pub(super) fn poke(f: &mut [u8], at: usize, v: u8) {
    if let Some(b) = f.get_mut(at) {
        *b = v;
    }
}

pub(super) fn set_total(f: &mut [u8], total: usize) {
    put16(f, IP_OFF + 2, u16::try_from(total.min(0xffff)).unwrap());
}

/// `f` cut to `len` with the IPv4 total length (and the UDP length, for
/// UDP) following, checksums recomputed: a shorter but consistent packet.
pub(super) fn consistent_truncation(f: &[u8], len: usize) -> Vec<u8> {
    let mut v = f[..len].to_vec();
    if len >= L4_OFF {
        set_total(&mut v, len - IP_OFF);
        if v[IP_OFF + 9] == IPPROTO_UDP && len >= L4_OFF + 6 {
            put16(&mut v, L4_OFF + 4, u16::try_from(len - L4_OFF).unwrap());
        }
    }
    fix_frame(&mut v, true);
    v
}

/// Where the L4 header of an IPv4 frame starts: after its options.
pub(super) fn l4_off(f: &[u8]) -> usize {
    IP_OFF + usize::from(f[IP_OFF] & 0x0f).max(5) * 4
}

/// The key a packet is looked up with (its 5-tuple; ICMP echo: the
/// identifier in both port fields). Only for frames the model lets through
/// to the lookup.
pub(super) fn lookup_key(f: &[u8]) -> FlowKey {
    let proto = f[IP_OFF + 9];
    let l4 = l4_off(f);
    let (sport, dport) = if proto == IPPROTO_ICMP {
        (be16(f, l4 + 4), be16(f, l4 + 4))
    } else {
        (be16(f, l4), be16(f, l4 + 2))
    };
    FlowKey::new(
        addr(f, IP_OFF + 12),
        addr(f, IP_OFF + 16),
        sport,
        dport,
        proto,
    )
}

/// The `FRAGMENTS` key of a fragment arriving on the LAN (`from_lan`) or
/// the WAN.
pub(super) fn fragment_key(f: &[u8], from_lan: bool) -> FragmentKey {
    FragmentKey {
        src_addr: addr(f, IP_OFF + 12),
        dst_addr: addr(f, IP_OFF + 16),
        id: [f[IP_OFF + 4], f[IP_OFF + 5]],
        proto: f[IP_OFF + 9],
        from_lan: u8::from(from_lan),
    }
}

/// The key an ICMP error is looked up with: a reply to the quoted packet.
pub(super) fn icmp_error_key(f: &[u8]) -> FlowKey {
    let proto = f[INNER_IP_OFF + 9];
    let (qs, qd) = if proto == IPPROTO_ICMP {
        (be16(f, INNER_L4_OFF + 4), be16(f, INNER_L4_OFF + 4))
    } else {
        (be16(f, INNER_L4_OFF), be16(f, INNER_L4_OFF + 2))
    };
    FlowKey::new(
        addr(f, INNER_IP_OFF + 16),
        addr(f, INNER_IP_OFF + 12),
        qd,
        qs,
        proto,
    )
}

/// Where the MSS option's value of the TCP SYN `f` (IPv4 without options,
/// not a fragment: what the core path carries) sits in the frame, if it
/// has one and all of it is in the frame: the two bytes MSS clamping may
/// lower.
pub(super) fn syn_mss_at(f: &[u8]) -> Option<usize> {
    let carried = f.get(IP_OFF + 9) == Some(&IPPROTO_TCP)
        && f.get(IP_OFF).is_some_and(|b| b & 0x0f == 5)
        && f.len() >= IP_OFF + 8
        && be16(f, IP_OFF + 6) & 0x3fff == 0;
    if !carried {
        return None;
    }
    mss_value_at(f, L4_OFF)
}

/// Where the MSS option's value of the TCP header at `l4` in `f` sits, if
/// the segment is a SYN with one and all of it is in the frame (both
/// families' corpus).
///
/// Walked here from RFC 9293 3.1's layout, apart from the data path's own
/// walk (`router_common::mss::find_mss_value`), whose oracle this is: the
/// options run from byte 20 to the data offset's end; end of list stops,
/// a no-operation is one byte, any other option gives its length, which
/// must be at least 2 and end within the header; the first MSS option
/// counts, and only with its length of 4.
pub(super) fn mss_value_at(f: &[u8], l4: usize) -> Option<usize> {
    if f.get(l4 + 13).is_none_or(|fl| fl & TCP_SYN == 0) {
        return None;
    }
    let header = usize::from(f[l4 + 12] >> 4) * 4;
    let mut pos = 20;
    while pos < header {
        match *f.get(l4 + pos)? {
            0 => return None,
            1 => pos += 1,
            kind => {
                let len = usize::from(*f.get(l4 + pos + 1)?);
                if len < 2 || pos + len > header {
                    return None;
                }
                if kind == 2 {
                    return (len == 4 && l4 + pos + 4 <= f.len()).then_some(l4 + pos + 2);
                }
                pos += len;
            }
        }
    }
    None
}
