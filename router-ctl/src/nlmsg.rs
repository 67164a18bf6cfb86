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
    let mut off = 0;
    std::iter::from_fn(move || {
        if off + 16 > buf.len() {
            return None;
        }
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().ok()?) as usize;
        let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
        let flags = u16::from_ne_bytes([buf[off + 6], buf[off + 7]]);
        if len < 16 || off + len > buf.len() {
            return None;
        }
        let payload = &buf[off + 16..off + len];
        off += (len + 3) & !3;
        Some((ty, flags, payload))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
