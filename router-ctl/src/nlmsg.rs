//! Netlink messages, as both netlink clients (`netlink`: rtnetlink,
//! `ctnetlink`: the kernel's conntrack) build and read them: a `nlmsghdr`,
//! a fixed part of the family's own, then type-length-value attributes
//! padded to 4 bytes.

pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 1;
pub const NLM_F_ACK: u16 = 4;
/// `NLM_F_ROOT | NLM_F_MATCH`: every object of the requested kind.
pub const NLM_F_DUMP: u16 = 0x300;
pub const NLA_F_NESTED: u16 = 1 << 15;
/// The attribute type without the nested and byte-order flags.
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | (1 << 14));

/// A netlink message being built: header, fixed part, attributes.
pub struct Msg(pub Vec<u8>);

impl Msg {
    /// A request of type `ty` with `flags` (`NLM_F_REQUEST` added) and the
    /// family's fixed header `fixed`.
    pub fn new(ty: u16, flags: u16, fixed: &[u8]) -> Self {
        let mut v = vec![0u8; 16];
        v[4..6].copy_from_slice(&ty.to_ne_bytes());
        v[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        v.extend_from_slice(fixed);
        Self(v)
    }

    /// Attributes only (the payload of a nested attribute, or a test's).
    pub const fn attrs_only() -> Self {
        Self(Vec::new())
    }

    pub fn attr(&mut self, ty: u16, data: &[u8]) {
        let len = u16::try_from(4 + data.len()).unwrap_or(u16::MAX);
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&ty.to_ne_bytes());
        self.0.extend_from_slice(data);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    /// A nested attribute whose content `build` appends.
    pub fn nested(&mut self, ty: u16, build: impl FnOnce(&mut Self)) {
        let start = self.0.len();
        self.attr(ty | NLA_F_NESTED, &[]);
        build(self);
        let len = u16::try_from(self.0.len() - start).unwrap_or(u16::MAX);
        self.0[start..start + 2].copy_from_slice(&len.to_ne_bytes());
    }

    /// The finished message with its length and sequence number.
    pub fn finish(mut self, seq: u32) -> Vec<u8> {
        let len = u32::try_from(self.0.len()).unwrap_or(u32::MAX);
        self.0[0..4].copy_from_slice(&len.to_ne_bytes());
        self.0[8..12].copy_from_slice(&seq.to_ne_bytes());
        self.0
    }
}

/// A netlink socket of `protocol` (`NETLINK_ROUTE`, `NETLINK_NETFILTER`)
/// bound to the multicast `groups` (0: none, requests only), close-on-exec
/// and, if `nonblocking`, non-blocking.
pub fn bound_socket(
    protocol: i32,
    groups: u32,
    nonblocking: bool,
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    let mut ty = libc::SOCK_RAW | libc::SOCK_CLOEXEC;
    if nonblocking {
        ty |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(libc::AF_NETLINK, ty, protocol) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new socket we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed sockaddr_nl is valid; fields set below.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    sa.nl_groups = groups;
    // SAFETY: sa is a valid sockaddr_nl.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sa).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// One datagram from netlink socket `fd` into `buf`: `Ok(None)` if none is
/// queued on a non-blocking socket. `ENOBUFS` means the kernel dropped
/// notifications for this socket (its receive buffer was full).
pub fn recv(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    // SAFETY: buf is writable for its length.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(usize::try_from(n).unwrap_or(0)))
}

/// Room to receive up to `slots` datagrams of at most `slot_len` bytes each
/// in one `recvmmsg` call: a socket that gets one datagram per
/// notification (ctnetlink sends each event in its own) is read a batch
/// per syscall instead of one.
pub struct Datagrams {
    slot_len: usize,
    /// The slots, one after the other; never resized (`iovs` points into it).
    bufs: Vec<u8>,
    /// One per slot, built once; never resized (`hdrs` points into it).
    iovs: Vec<libc::iovec>,
    /// One per slot, the kernel fills in each's length and flags.
    hdrs: Vec<libc::mmsghdr>,
    /// Lengths of the datagrams the last receive got, in order.
    lens: Vec<usize>,
    /// Datagrams the last receive got cut short (longer than a slot).
    truncated: usize,
}

impl Datagrams {
    pub fn new(slots: usize, slot_len: usize) -> Self {
        let mut bufs = vec![0; slots * slot_len];
        let mut iovs: Vec<libc::iovec> = bufs
            .chunks_exact_mut(slot_len)
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let hdrs = iovs
            .iter_mut()
            .map(|iov| {
                // SAFETY: all-zero is a valid mmsghdr (no name, no control).
                let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
                h.msg_hdr.msg_iov = iov;
                h.msg_hdr.msg_iovlen = 1;
                h
            })
            .collect();
        Self {
            slot_len,
            bufs,
            iovs,
            hdrs,
            lens: Vec::with_capacity(slots),
            truncated: 0,
        }
    }

    /// How many datagrams one receive takes at most.
    pub fn slots(&self) -> usize {
        self.bufs.len() / self.slot_len
    }

    /// Receives, without waiting, the datagrams queued on `fd` up to
    /// [`Self::slots`]: how many (0: none is queued). An error the socket
    /// holds (`ENOBUFS`: notifications dropped) comes first when nothing
    /// was received; after some were, the kernel keeps it for the next
    /// call, so the datagrams queued before it are read first.
    pub fn recv(&mut self, fd: std::os::fd::RawFd) -> std::io::Result<usize> {
        self.lens.clear();
        self.truncated = 0;
        debug_assert_eq!(self.iovs.len(), self.hdrs.len());
        let vlen = u32::try_from(self.hdrs.len()).unwrap_or(u32::MAX);
        // SAFETY: each header points to its own iovec in `iovs` over its
        // own slot of `bufs`; neither vector is resized after `new`, so the
        // pointers stay valid while `self` lives.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.hdrs.as_mut_ptr(),
                vlen,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(0);
            }
            return Err(e);
        }
        for h in &self.hdrs[..usize::try_from(n).unwrap_or(0)] {
            if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                self.truncated += 1;
            }
            self.lens
                .push(usize::try_from(h.msg_len).unwrap_or(0).min(self.slot_len));
        }
        Ok(self.lens.len())
    }

    /// The datagrams the last receive got, in the order they were queued.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        self.bufs
            .chunks_exact(self.slot_len)
            .zip(&self.lens)
            .map(|(b, &n)| &b[..n])
    }

    /// Datagrams the last receive got only in part (longer than a slot).
    pub fn truncated(&self) -> usize {
        self.truncated
    }
}

/// The attributes in `data` as (type without flags, payload); stops at the
/// first malformed one.
pub fn attrs(mut data: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if data.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([data[0], data[1]]));
        let ty = u16::from_ne_bytes([data[2], data[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > data.len() {
            return None;
        }
        let payload = &data[4..len];
        data = &data[((len + 3) & !3).min(data.len())..];
        Some((ty, payload))
    })
}

/// The messages in a received buffer as (type, flags, payload after the
/// `nlmsghdr`); stops at the first malformed header.
pub fn messages(buf: &[u8]) -> impl Iterator<Item = (u16, u16, &[u8])> {
    sequenced_messages(buf).map(|(ty, flags, _seq, payload)| (ty, flags, payload))
}

/// [`messages`] with each one's sequence number: type, flags, sequence
/// number, payload.
pub fn sequenced_messages(buf: &[u8]) -> impl Iterator<Item = (u16, u16, u32, &[u8])> {
    let mut off = 0;
    std::iter::from_fn(move || {
        if off + 16 > buf.len() {
            return None;
        }
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().ok()?) as usize;
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        let flags = u16::from_ne_bytes([buf[off + 6], buf[off + 7]]);
        let seq = u32::from_ne_bytes(buf[off + 8..off + 12].try_into().ok()?);
        if len < 16 || off + len > buf.len() {
            return None;
        }
        let payload = &buf[off + 16..off + len];
        off += (len + 3) & !3;
        Some((ty, flags, seq, payload))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::{fd::AsRawFd, unix::net::UnixDatagram};

    #[test]
    fn datagrams_are_received_a_batch_at_a_time_in_order() {
        let (tx, rx) = UnixDatagram::pair().expect("socketpair");
        for d in [&b"one"[..], b"two", b"three"] {
            tx.send(d).expect("send");
        }
        let mut batch = Datagrams::new(2, 16);
        assert_eq!(batch.slots(), 2);
        assert_eq!(batch.recv(rx.as_raw_fd()).expect("recv"), 2);
        assert_eq!(batch.iter().collect::<Vec<_>>(), [&b"one"[..], b"two"]);
        assert_eq!(batch.recv(rx.as_raw_fd()).expect("recv"), 1);
        assert_eq!(batch.iter().collect::<Vec<_>>(), [&b"three"[..]]);
        assert_eq!(batch.truncated(), 0);
        // Nothing queued: none, without waiting.
        assert_eq!(batch.recv(rx.as_raw_fd()).expect("recv"), 0);
        assert_eq!(batch.iter().count(), 0);
    }

    #[test]
    fn a_datagram_longer_than_a_slot_is_reported_cut_short() {
        let (tx, rx) = UnixDatagram::pair().expect("socketpair");
        tx.send(b"0123456789").expect("send");
        tx.send(b"ok").expect("send");
        let mut batch = Datagrams::new(4, 4);
        assert_eq!(batch.recv(rx.as_raw_fd()).expect("recv"), 2);
        assert_eq!(batch.truncated(), 1);
        assert_eq!(batch.iter().collect::<Vec<_>>(), [&b"0123"[..], b"ok"]);
    }

    #[test]
    fn nested_attributes_round_trip() {
        let mut m = Msg::attrs_only();
        m.attr(3, b"eth0\0");
        m.nested(7, |m| m.attr(1, &1500u32.to_ne_bytes()));
        let a: Vec<_> = attrs(&m.0).collect();
        assert_eq!(a.len(), 2);
        assert_eq!(a[0], (3, &b"eth0\0"[..]));
        assert_eq!(a[1].0, 7);
        let inner: Vec<_> = attrs(a[1].1).collect();
        assert_eq!(inner, vec![(1, &1500u32.to_ne_bytes()[..])]);
    }

    #[test]
    fn messages_split_a_buffer_and_stop_at_garbage() {
        let mut buf = Msg::new(16, 0, &[0; 4]).finish(1);
        buf.extend_from_slice(&Msg::new(NLMSG_DONE, 0, &[]).finish(2));
        buf.extend_from_slice(&[0xff; 7]);
        let m: Vec<_> = messages(&buf).map(|(t, f, p)| (t, f, p.len())).collect();
        assert_eq!(
            m,
            vec![(16, NLM_F_REQUEST, 4), (NLMSG_DONE, NLM_F_REQUEST, 0)]
        );
        let seqs: Vec<u32> = sequenced_messages(&buf).map(|(_, _, s, _)| s).collect();
        assert_eq!(seqs, [1, 2]);
    }
}
