//! Socket options `socket2` does not offer (`SO_REUSEPORT` without its
//! "all" feature, `SO_RCVBUFFORCE`, `IP_MTU_DISCOVER`, `IP_MTU`,
//! `TCP_INFO`, `PACKET_STATISTICS`), set and read through libc in one
//! place. Each panics naming the option when the kernel refuses.

use std::os::fd::AsRawFd;

/// Sets the `int` socket option `name` at `level` of `sock` to `value`.
///
/// # Panics
/// If the kernel refuses it (the message names `what`).
pub fn set_int(
    sock: &impl AsRawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
    what: &str,
) {
    // SAFETY: a valid socket and an int option of its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            len_of::<libc::c_int>(),
        )
    };
    assert_eq!(rc, 0, "{what}: {}", std::io::Error::last_os_error());
}

/// Reads the socket option `name` at `level` of `sock` as a `T`.
///
/// # Safety
/// `T` must be a plain C type that the option fills (an `int`, or the
/// kernel's struct for it) and for which all-zero bytes are a valid value
/// (what the kernel does not write stays zero).
///
/// # Panics
/// If the kernel refuses it (the message names `what`).
pub unsafe fn get<T>(sock: &impl AsRawFd, level: libc::c_int, name: libc::c_int, what: &str) -> T {
    // SAFETY: all-zero bytes are a valid `T` (the caller's promise).
    let mut value: T = unsafe { std::mem::zeroed() };
    let mut len = len_of::<T>();
    // SAFETY: a valid socket, and a buffer of `len` bytes.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw mut value).cast(),
            &raw mut len,
        )
    };
    assert_eq!(rc, 0, "{what}: {}", std::io::Error::last_os_error());
    value
}

/// The size of a `T` as a socket option length.
fn len_of<T>() -> libc::socklen_t {
    libc::socklen_t::try_from(size_of::<T>()).expect("a socket option of a few bytes")
}
