//! `router-ctl run` as the operator tests drive it: started with a config
//! file and a systemd notify socket, its stderr and notifications
//! collected, stopped with SIGTERM (SIGKILL on drop if still running).

use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::{Ns, Topology, router_ctl_bin};

/// A router TOML file in standalone mode for the topology's interfaces,
/// with the given `[[forward]]` rules as `(proto, wan_port, "addr:port")`.
#[must_use]
pub fn config_text(port_range: &str, forwards: &[(&str, u32, &str)]) -> String {
    let mut s = format!(
        "[router]\nadmit = \"xdp\"\n\n[interfaces]\nlan = \"{}\"\nwan = \"{}\"\n\n\
         [nat]\nport_range = \"{port_range}\"\n",
        tests::LAN_IF,
        tests::WAN_IF
    );
    for (proto, port, to) in forwards {
        let _ = write!(
            s,
            "\n[[forward]]\nproto = \"{proto}\"\nwan_port = {port}\nto = \"{to}\"\n"
        );
    }
    s
}

pub use tests::Scratch;

/// A child process killed (and reaped) on drop.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The daemon and what it said.
pub struct RunningDaemon {
    child: Child,
    log: Arc<Mutex<String>>,
    notify: UnixDatagram,
    notes: Vec<String>,
    /// Notes before this index were matched by [`Self::wait_note`] already.
    cursor: usize,
    status_file: PathBuf,
}

impl RunningDaemon {
    /// `router-ctl -n ROUTER run ARGS`, spawned from a thread in the
    /// namespace `caller` (so `--listen` binds there; the daemon enters the
    /// router's namespace itself), with `NOTIFY_SOCKET` pointing at a
    /// datagram socket in `scratch`. Waits for READY=1.
    pub fn start(t: &Topology, caller: Option<Ns>, scratch: &Scratch, args: &[&str]) -> Self {
        Self::start_env(t, caller, scratch, args, &[])
    }

    /// [`Self::start`] with the environment variables `env` set.
    pub fn start_env(
        t: &Topology,
        caller: Option<Ns>,
        scratch: &Scratch,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let sock_path = scratch.path("notify.sock");
        let _ = std::fs::remove_file(&sock_path);
        let notify = UnixDatagram::bind(&sock_path).expect("bind the notify socket");
        notify
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut cmd = Command::new(router_ctl_bin());
        cmd.args(["-n", t.ns_name(Ns::Router), "run"])
            .args(args)
            .env("NOTIFY_SOCKET", &sock_path)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = match caller {
            Some(ns) => t.in_ns(ns, || cmd.spawn()),
            None => cmd.spawn(),
        }
        .expect("starting router-ctl run");
        let log = Arc::new(Mutex::new(String::new()));
        for pipe in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let sink = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                    let mut l = sink.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let status_file =
            Path::new(tests::LOCK_DIR).join(format!("{}.daemon.json", t.ns_name(Ns::Router)));
        let mut d = Self {
            child,
            log,
            notify,
            notes: Vec::new(),
            cursor: 0,
            status_file,
        };
        d.wait_note("READY=1", Duration::from_secs(30));
        d
    }

    #[must_use]
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Every notification received so far, one string per datagram.
    pub fn notes(&mut self) -> &[String] {
        let mut buf = [0u8; 4096];
        while let Ok(n) = self.notify.recv(&mut buf) {
            self.notes
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        &self.notes
    }

    /// Waits for a datagram with the line `line` after the one the last
    /// call matched; returns it.
    pub fn wait_note(&mut self, line: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let _ = self.notes();
            if let Some(i) = self.notes[self.cursor..]
                .iter()
                .position(|n| n.lines().any(|l| l == line))
            {
                self.cursor += i + 1;
                return self.notes[self.cursor - 1].clone();
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "router-ctl run exited ({st}) before {line}:\n{}",
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no {line} from router-ctl run; notes {:?}; log:\n{}",
                self.notes,
                self.log()
            );
        }
    }

    #[must_use]
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn signal(&self, sig: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid");
        // SAFETY: plain kill(2) of our own, unreaped child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// SIGTERM and the exit status (within 10 s).
    pub fn stop(&mut self) -> ExitStatus {
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                return st;
            }
            assert!(Instant::now() < deadline, "router-ctl run ignored SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RunningDaemon {
    fn drop(&mut self) {
        if self.running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_file(&self.status_file);
        }
    }
}

impl RunningDaemon {
    /// The address the status page listens on, from the line `run` prints.
    #[must_use]
    pub fn page_addr(&self) -> std::net::SocketAddr {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let log = self.log();
            if let Some(a) = log.lines().find_map(|l| {
                l.split("status page on http://")
                    .nth(1)?
                    .split('/')
                    .next()?
                    .parse()
                    .ok()
            }) {
                return a;
            }
            assert!(Instant::now() < deadline, "no status page line in:\n{log}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `METHOD PATH` over HTTP/1.1 to `addr`, from the namespace `ns`:
/// (status code, head, body).
pub fn http(
    t: &Topology,
    ns: Ns,
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
) -> (u16, String, String) {
    use std::io::{Read as _, Write as _};
    t.in_ns(ns, || {
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(s, "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP response");
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("a status code");
        (code, head.to_owned(), body.to_owned())
    })
}
