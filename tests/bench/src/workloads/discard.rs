//! A TCP discard sink for the iperf2 client: one epoll thread inside the
//! server namespace accepts every connection and reads and drops what
//! arrives. iperf 2.1.8's `iperf -s` crashes (SIGSEGV, SIGABRT) or hangs
//! in a good share of runs with 1000+ streams; this sink does not, and it
//! costs the shared cores less than a thread per stream.

use std::collections::HashMap;
use std::io::{ErrorKind, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use socket2::{Domain, Socket, Type};

pub struct DiscardSink {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<(u64, u64)>,
}

fn epoll_add(ep: RawFd, fd: RawFd) -> bool {
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
        u64: fd as u64,
    };
    // SAFETY: valid epoll and socket fds; `ev` lives across the call.
    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &raw mut ev) == 0 }
}

impl DiscardSink {
    /// Listens on `addr` inside namespace `ns` (backlog 4096: thousands of
    /// streams connect at once).
    pub fn start(ns: &str, addr: SocketAddr) -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let ns = ns.to_owned();
        let (tx, rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let handle = std::thread::spawn(move || {
            tests::netns::enter(&ns);
            let listener = (|| {
                let s = Socket::new(Domain::IPV4, Type::STREAM, None)?;
                s.set_reuse_address(true)?;
                s.bind(&addr.into())?;
                s.listen(4096)?;
                s.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(std::net::TcpListener::from(s))
            })();
            let listener = match listener {
                Ok(l) => l,
                Err(e) => {
                    let _ = tx.send(Err(format!("discard sink on {addr}: {e}")));
                    return (0, 0);
                }
            };
            // SAFETY: plain syscall.
            let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if ep < 0 || !epoll_add(ep, listener.as_raw_fd()) {
                let _ = tx.send(Err(format!(
                    "discard sink: epoll: {}",
                    std::io::Error::last_os_error()
                )));
                return (0, 0);
            }
            let _ = tx.send(Ok(()));
            let lfd = listener.as_raw_fd();
            let mut conns: HashMap<RawFd, TcpStream> = HashMap::new();
            let mut buf = vec![0u8; 256 * 1024];
            // 256 slots, passed as the count below.
            let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
            let mut total = 0u64;
            let mut accepted = 0u64;
            while !flag.load(Ordering::Relaxed) {
                // SAFETY: `events` is a live buffer of the length passed.
                let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), 256, 100) };
                for ev in events.iter().take(usize::try_from(n).unwrap_or(0)) {
                    let fd = ev.u64 as RawFd;
                    if fd == lfd {
                        while let Ok((s, _)) = listener.accept() {
                            accepted += 1;
                            if s.set_nonblocking(true).is_ok() && epoll_add(ep, s.as_raw_fd()) {
                                conns.insert(s.as_raw_fd(), s);
                            }
                        }
                        continue;
                    }
                    let Some(s) = conns.get_mut(&fd) else {
                        continue;
                    };
                    match s.read(&mut buf) {
                        Ok(0) => {
                            // Dropping the stream closes it (and leaves epoll).
                            conns.remove(&fd);
                        }
                        Ok(k) => total += k as u64,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == ErrorKind::Interrupted => {}
                        Err(_) => {
                            conns.remove(&fd);
                        }
                    }
                }
            }
            drop(conns);
            // SAFETY: our own epoll fd.
            unsafe { libc::close(ep) };
            (total, accepted)
        });
        match rx.recv() {
            Ok(Ok(())) => Ok(Self { stop, handle }),
            Ok(Err(e)) => {
                let _ = handle.join();
                Err(e)
            }
            Err(_) => Err("discard sink thread died".into()),
        }
    }

    /// Stops, closes every connection; returns the bytes it read and the
    /// connections it accepted.
    pub fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or((0, 0))
    }
}
