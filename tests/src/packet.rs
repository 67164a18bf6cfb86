//! `AF_PACKET` sockets bound to one interface, for the tests that capture
//! what a namespace's interface carries (in and out) without tcpdump,
//! and send crafted frames ([`send_frame`]).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// What the socket hands over per packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// The whole frame, Ethernet header included (`SOCK_RAW`).
    Frame,
    /// The packet after the link-layer header (`SOCK_DGRAM`).
    Packet,
}

/// Opens an `AF_PACKET` socket in the calling thread's namespace that
/// receives every packet of `ethertype` (host order, e.g. `ETH_P_IP`)
/// crossing interface `ifindex`; `nonblocking` sets `SOCK_NONBLOCK`.
///
/// # Errors
/// `socket(2)` or `bind(2)` failed (not root, no such interface).
pub fn packet_socket(
    ifindex: u32,
    ethertype: u16,
    framing: Framing,
    nonblocking: bool,
) -> io::Result<OwnedFd> {
    let proto = ethertype.to_be();
    let mut kind = libc::SOCK_CLOEXEC;
    kind |= match framing {
        Framing::Frame => libc::SOCK_RAW,
        Framing::Packet => libc::SOCK_DGRAM,
    };
    if nonblocking {
        kind |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_PACKET, kind, i32::from(proto)) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed is a valid sockaddr_ll.
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = proto;
    sll.sll_ifindex = i32::try_from(ifindex).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: a valid address of the given length.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const sll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Sends `frame` (Ethernet header included, as it is: any destination
/// MAC) out of interface `ifindex` of the calling thread's namespace,
/// through a send-only `AF_PACKET` socket.
///
/// # Errors
/// `socket(2)`, `bind(2)` or `send(2)` failed, or sent only part of it.
pub fn send_frame(ifindex: u32, frame: &[u8]) -> io::Result<()> {
    // Ethertype 0: the socket receives nothing, it only sends.
    let fd = packet_socket(ifindex, 0, Framing::Frame, false)?;
    // SAFETY: a live buffer of the given length.
    let sent = unsafe { libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    match usize::try_from(sent) {
        Ok(n) if n == frame.len() => Ok(()),
        Ok(n) => Err(io::Error::other(format!(
            "sent {n} of the frame's {} bytes",
            frame.len()
        ))),
        Err(_) => Err(io::Error::last_os_error()),
    }
}
