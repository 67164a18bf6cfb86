//! Helpers shared by the integration tests (lifecycle, apply, metrics,
//! doctor, errors, offload, reliability, failover): running router-ctl,
//! reading its status, pins and records, object variants, a TCP stream
//! that runs while the router changes (and its two ends, checked byte for
//! byte), waiting for a condition, killing a process group.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tests::{LAN_IF, Ns, PIN_ROOT, Topology, WAN_IF, router_ctl_bin};

/// Where router-ctl keeps its attach records.
pub const STATE_DIR: &str = "/var/lib/xdp-router";

/// A standalone attach over the router's forward rules, bypassing them as
/// the owner asks.
pub const ATTACH_STANDALONE_BYPASSING: [&str; 6] = [
    "attach",
    LAN_IF,
    WAN_IF,
    "--admit",
    "xdp",
    "--bypass-forward-rules",
];

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// `router-ctl -n ROUTER ARGS` with extra environment variables.
pub fn ctl_env(t: &Topology, env: &[(&str, &str)], args: &[&str]) -> Output {
    ctl_in(t.ns_name(Ns::Router), env, args)
}

/// `router-ctl -n NETNS ARGS` (bounded by `timeout`) with extra
/// environment variables, for a router namespace of any topology.
pub fn ctl_in(netns: &str, env: &[(&str, &str)], args: &[&str]) -> Output {
    Command::new("timeout")
        .args(["-k", "5", "60"])
        .arg(router_ctl_bin())
        .arg("-n")
        .arg(netns)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("running router-ctl")
}

/// Asserts failure (an error's exit status: 1, or 78 for a refusal
/// trying again does not change) and returns stderr.
pub fn ctl_fails(t: &Topology, args: &[&str]) -> String {
    let o = t.router_ctl(args);
    assert!(
        !o.status.success(),
        "router-ctl {args:?} should fail:\nstdout: {}\nstderr: {}",
        stdout(&o),
        stderr(&o)
    );
    assert!(
        matches!(o.status.code(), Some(1 | 78)),
        "exit code of {args:?}: {:?}",
        o.status.code()
    );
    stderr(&o)
}

/// `status --json` parsed, with its exit code.
pub fn status(t: &Topology) -> (Value, i32) {
    let o = t.router_ctl(&["status", "--json"]);
    let v: Value = serde_json::from_str(&stdout(&o))
        .unwrap_or_else(|e| panic!("status --json: {e}: {}{}", stdout(&o), stderr(&o)));
    (v, o.status.code().unwrap_or(-1))
}

/// An offload-mode router attached and configured, whose daemon does not
/// run: `status` says degraded (exit 1) and why.
pub fn assert_offload_without_daemon(t: &Topology) {
    let (v, code) = status(t);
    assert_eq!(
        (v["admit"].as_str(), &v["configured"]),
        (Some("kernel"), &Value::Bool(true)),
        "not an attached offload router: {v}"
    );
    assert_eq!((v["state"].as_str(), code), (Some("degraded"), 1), "{v}");
    assert!(
        v["problems"]
            .to_string()
            .contains("offload mode without its daemon"),
        "{v}"
    );
}

/// The program ids of the two links in `status --json`.
pub fn prog_ids(v: &Value) -> Vec<u64> {
    let ids: Vec<u64> = v["links"]
        .as_array()
        .map(|a| a.iter().filter_map(|l| l["prog_id"].as_u64()).collect())
        .unwrap_or_default();
    // Two links (LAN, WAN) each with its program: a missing or renamed
    // field would make "the program is unchanged" compare nothing.
    assert_eq!(
        ids.len(),
        2,
        "status --json without the two links' programs: {v}"
    );
    ids
}

pub fn pin_dir(t: &Topology) -> PathBuf {
    Path::new(PIN_ROOT).join(t.ns_name(Ns::Router))
}

pub fn state_file(t: &Topology) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{}.json", t.ns_name(Ns::Router)))
}

pub fn tmp_pin_dir(t: &Topology) -> PathBuf {
    Path::new(&format!("{PIN_ROOT}-staging")).join(t.ns_name(Ns::Router))
}

pub fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The XDP programs on a router interface, from `ip -j -d link show`.
pub fn xdp_progs(t: &Topology, iface: &str) -> Vec<u64> {
    let out = t.exec_ok(
        Ns::Router,
        &["ip", "-j", "-d", "link", "show", "dev", iface],
    );
    let v: Value = serde_json::from_str(&out).expect("ip -j link");
    let x = &v[0]["xdp"];
    let mut ids = Vec::new();
    if let Some(id) = x["prog"]["id"].as_u64() {
        ids.push(id);
    }
    if let Some(a) = x["attached"].as_array() {
        for p in a {
            if let Some(id) = p["prog"]["id"].as_u64() {
                ids.push(id);
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Attach after warming the neighbours; returns stdout.
pub fn attach(t: &Topology, extra: &[&str]) -> String {
    t.warm_neighbours();
    let mut args = vec!["attach", LAN_IF, WAN_IF, "--admit", "xdp"];
    args.extend_from_slice(extra);
    t.router_ctl_ok(&args)
}

/// [`attach`] with its output printed (for the figures the tests print).
pub fn attach_and_print(t: &Topology, extra: &[&str]) {
    println!("{}", attach(t, extra));
}

static OBJ_COUNTER: AtomicU32 = AtomicU32::new(0);

/// A copy of the built XDP object with bytes appended after its end: a
/// different file (another SHA-256, so router-ctl sees a new version)
/// with the same code. Removed on drop.
/// Its file and the scratch directory that holds it (removed with it).
pub struct ObjectVariant(
    pub PathBuf,
    #[expect(dead_code, reason = "held: dropped, it removes the file's directory")] tests::Scratch,
);

/// The parts of `COUNTERS`'s definition an [`ObjectVariant`] changes.
struct CountersDef {
    value_size: u32,
    max_entries: u32,
}

impl ObjectVariant {
    #[must_use]
    pub fn new(tag: &str) -> Self {
        let n = OBJ_COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = tests::Scratch::new("object");
        let path = dir.path(&format!("variant-{n}-{tag}.o"));
        let mut bytes = std::fs::read(env!("ROUTER_EBPF_OBJ")).expect("read the XDP object");
        bytes.extend_from_slice(format!("\nvariant {tag}\n").as_bytes());
        std::fs::write(&path, bytes).expect("write the variant object");
        Self(path, dir)
    }

    /// A copy whose XDP program has an `exit` in place of the first
    /// register move of its body: the verifier rejects it (r0 unset, or the
    /// code after it unreachable).
    #[must_use]
    pub fn rejected_by_verifier() -> Self {
        let n = OBJ_COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = tests::Scratch::new("object");
        let path = dir.path(&format!("bad-{n}.o"));
        let mut bytes = std::fs::read(env!("ROUTER_EBPF_OBJ")).expect("read the XDP object");
        let body = program_body(&bytes).expect("find the XDP program's body in the object");
        // A move (BPF_ALU64 | BPF_MOV | BPF_X) is never the target of a
        // relocation, unlike a call or a 64-bit immediate load, which the
        // loader would fail to relocate before the verifier sees anything.
        let insn = (body.0..body.1)
            .step_by(8)
            .find(|&i| bytes[i] == 0xbf)
            .expect("the program has a register move");
        // BPF_JMP | BPF_EXIT, all other fields zero.
        bytes[insn..insn + 8].copy_from_slice(&[0x95, 0, 0, 0, 0, 0, 0, 0]);
        std::fs::write(&path, bytes).expect("write the bad object");
        Self(path, dir)
    }

    /// A copy whose `COUNTERS` map has one entry fewer: the object of a
    /// build from before the last counter was added.
    #[must_use]
    pub fn with_one_counter_fewer() -> Self {
        Self::with_counters_def("fewer", |def| def.max_entries -= 1)
    }

    /// A copy whose `COUNTERS` values are 8 bytes wider: a build whose
    /// counter value has another layout (its program still writes the
    /// first 16 bytes, which the verifier accepts).
    #[must_use]
    pub fn with_wider_counter_values() -> Self {
        Self::with_counters_def("wider", |def| def.value_size += 8)
    }

    /// A copy with `COUNTERS`'s definition changed by `change`. The map
    /// definitions are the legacy `maps` section's 28-byte `bpf_map_def`s
    /// (type, key size, value size, max entries, ...); `COUNTERS` is the
    /// per-CPU array of `Counter::COUNT` counter values.
    fn with_counters_def(tag: &str, change: impl FnOnce(&mut CountersDef)) -> Self {
        use router_common::maps::{Counter, CounterValue};
        const BPF_MAP_TYPE_PERCPU_ARRAY: u32 = 6;
        let n = OBJ_COUNTER.fetch_add(1, Ordering::SeqCst);
        let dir = tests::Scratch::new("object");
        let path = dir.path(&format!("{tag}-{n}.o"));
        let mut bytes = std::fs::read(env!("ROUTER_EBPF_OBJ")).expect("read the XDP object");
        let (off, size) = elf_section(&bytes, "maps").expect("the object has a maps section");
        let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let value_size = u32::try_from(std::mem::size_of::<CounterValue>()).unwrap();
        let defs: Vec<usize> = (off..off + size - 27)
            .step_by(28)
            .filter(|&d| {
                u32_at(&bytes, d) == BPF_MAP_TYPE_PERCPU_ARRAY
                    && u32_at(&bytes, d + 4) == 4
                    && u32_at(&bytes, d + 8) == value_size
                    && u32_at(&bytes, d + 12) == Counter::COUNT
            })
            .collect();
        assert_eq!(defs.len(), 1, "one COUNTERS definition in the maps section");
        let mut def = CountersDef {
            value_size,
            max_entries: Counter::COUNT,
        };
        change(&mut def);
        let d = defs[0];
        bytes[d + 8..d + 12].copy_from_slice(&def.value_size.to_le_bytes());
        bytes[d + 12..d + 16].copy_from_slice(&def.max_entries.to_le_bytes());
        std::fs::write(&path, bytes).expect("write the object variant");
        Self(path, dir)
    }

    #[must_use]
    pub fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

/// File range of the XDP program's body: the `xdp` section itself, or,
/// when that section only calls a function in `.text` (the entry point's
/// body compiled as a subprogram), `.text` from that function on.
fn program_body(b: &[u8]) -> Option<(usize, usize)> {
    let (off, size) = elf_section(b, "xdp")?;
    let Some((rel, rel_size)) = elf_section(b, ".relxdp") else {
        return Some((off, off + size));
    };
    // The first relocation of the section: is it the call at its start?
    let r_offset = u64::from_le_bytes(b[rel..rel + 8].try_into().ok()?);
    if rel_size < 16 || r_offset != 0 || b[off] != 0x85 {
        return Some((off, off + size));
    }
    let sym =
        usize::try_from(u64::from_le_bytes(b[rel + 8..rel + 16].try_into().ok()?) >> 32).ok()?;
    let (symtab, _) = elf_section(b, ".symtab")?;
    let entry = symtab + sym * 24;
    let st_info = b[entry + 4];
    let st_value = usize::try_from(u64::from_le_bytes(
        b[entry + 8..entry + 16].try_into().ok()?,
    ))
    .ok()?;
    let imm = i32::from_le_bytes(b[off + 4..off + 8].try_into().ok()?);
    // A section symbol (STT_SECTION) names the target by the call's
    // immediate; a function symbol by its value.
    let target = if st_info & 0xf == 3 {
        st_value.checked_add_signed(isize::try_from(imm).ok()?.checked_add(1)? * 8)?
    } else {
        st_value
    };
    let (text, text_size) = elf_section(b, ".text")?;
    (target < text_size).then_some((text + target, text + text_size))
}

/// File offset and size of an ELF64 little-endian section by name.
pub fn elf_section(b: &[u8], name: &str) -> Option<(usize, usize)> {
    let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap()) as usize;
    if b.get(0..4)? != b"\x7fELF" || b[4] != 2 {
        return None;
    }
    let shoff = u64_at(0x28);
    let shentsize = u16_at(0x3a);
    let shnum = u16_at(0x3c);
    let shstrndx = u16_at(0x3e);
    let sh = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(sh(shstrndx) + 0x18);
    for i in 0..shnum {
        let name_off = strtab + u32_at(sh(i));
        let end = b[name_off..].iter().position(|&c| c == 0)? + name_off;
        if &b[name_off..end] == name.as_bytes() {
            return Some((u64_at(sh(i) + 0x18), u64_at(sh(i) + 0x20)));
        }
    }
    None
}

/// What one end of a TCP stream sent or received: the byte count and the
/// bytes' FNV-1a hash, so the two ends can be compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tally {
    pub bytes: u64,
    pub hash: u64,
}

impl Tally {
    #[must_use]
    pub const fn new() -> Self {
        Self {
            bytes: 0,
            hash: 0xcbf2_9ce4_8422_2325,
        }
    }

    pub fn add(&mut self, data: &[u8]) {
        self.bytes += data.len() as u64;
        self.hash = data.iter().fold(self.hash, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    }
}

/// The sending end of a stream: writes `chunk`-byte pieces of a pattern
/// while `due(i)` gives the time (since the start) by which chunk `i` is
/// done, sleeping until then (after a stall the sender catches up from its
/// socket buffer); `None` ends the stream. Then half-closes and waits for
/// the receiver's ack.
pub fn send_paced(
    sock: &mut TcpStream,
    chunk: usize,
    mut due: impl FnMut(u32) -> Option<Duration>,
) -> Result<Tally, String> {
    let pattern = tests::pattern(chunk * 4);
    let mut sent = Tally::new();
    let start = Instant::now();
    let mut i: u32 = 0;
    while let Some(done_by) = due(i) {
        let off = (i % 3) as usize * chunk;
        let data = &pattern[off..off + chunk];
        sock.write_all(data)
            .map_err(|e| format!("client write after {} bytes: {e}", sent.bytes))?;
        sent.add(data);
        i += 1;
        if let Some(wait) = done_by.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
    }
    sock.shutdown(std::net::Shutdown::Write)
        .map_err(|e| format!("shutdown: {e}"))?;
    let mut ack = [0u8; 2];
    sock.read_exact(&mut ack)
        .map_err(|e| format!("client waiting for the ack: {e}"))?;
    Ok(sent)
}

/// The receiving end of a stream: reads until the sender half-closes (or
/// an error, or `deadline`), calling `on_data` after every read, then acks.
pub fn receive_all(
    sock: &mut TcpStream,
    deadline: Instant,
    mut on_data: impl FnMut(),
) -> Result<Tally, String> {
    let mut got = Tally::new();
    let mut buf = vec![0u8; 65536];
    loop {
        match sock.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                on_data();
                got.add(&buf[..k]);
            }
            Err(e) => return Err(format!("server read after {} bytes: {e}", got.bytes)),
        }
        if Instant::now() > deadline {
            return Err("the stream ran too long".into());
        }
    }
    sock.write_all(b"ok")
        .map_err(|e| format!("server ack: {e}"))?;
    Ok(got)
}

/// Panics unless both ends of a stream finished and every byte arrived
/// intact; returns the byte count.
pub fn same_bytes(client: Result<Tally, String>, server: Result<Tally, String>) -> u64 {
    let c = client.unwrap_or_else(|e| panic!("stream client: {e}"));
    let s = server.unwrap_or_else(|e| panic!("stream server: {e}"));
    assert_eq!(
        s.bytes, c.bytes,
        "the server got {} of {} bytes",
        s.bytes, c.bytes
    );
    assert_eq!(s.hash, c.hash, "the bytes arrived changed");
    s.bytes
}

/// A TCP stream from the client to a sink on the server that runs while
/// the test changes the router. The sink counts the bytes and hashes them.
pub struct Stream {
    client: std::thread::JoinHandle<Result<Tally, String>>,
    server: std::thread::JoinHandle<Result<Tally, String>>,
    /// A [`Stream::until_stopped`]'s flag, set by [`Stream::finish`].
    stop: Option<Arc<AtomicBool>>,
}

/// A 16 KiB chunk: the unit a stream is paced in.
const STREAM_CHUNK: usize = 16 * 1024;

impl Stream {
    /// Streams `total` bytes in chunks over about `secs` seconds.
    #[must_use]
    pub fn start(t: &Topology, dst: SocketAddr, total: usize, secs: f64) -> Self {
        let chunks = u32::try_from(total / STREAM_CHUNK).expect("chunk count");
        Self::spawn(t, dst, secs, chunks, None)
    }

    /// Streams `bytes_per_sec` until [`Stream::finish`], for at most
    /// `max_secs`: traffic for as long as the test's steps take, however
    /// slow the machine.
    #[must_use]
    pub fn until_stopped(t: &Topology, dst: SocketAddr, bytes_per_sec: f64, max_secs: f64) -> Self {
        let per_sec = bytes_per_sec / f64::from(u32::try_from(STREAM_CHUNK).expect("16 KiB"));
        // Chunk i is due at (i + 1) / per_sec; the last one at max_secs.
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a chunk count of a few thousand"
        )]
        let chunks = (max_secs * per_sec) as u32;
        let stop = Arc::new(AtomicBool::new(false));
        Self::spawn(t, dst, f64::from(chunks) / per_sec, chunks, Some(stop))
    }

    /// `chunks` chunks evenly over `secs` seconds (fewer if stopped); the
    /// sink gives up `secs` + 30 s after it bound.
    fn spawn(
        t: &Topology,
        dst: SocketAddr,
        secs: f64,
        chunks: u32,
        stop: Option<Arc<AtomicBool>>,
    ) -> Self {
        let srv_ns = t.ns_name(Ns::Server).to_owned();
        let (tx, rx) = std::sync::mpsc::channel();
        let server = std::thread::spawn(move || {
            tests::netns::enter(&srv_ns);
            let listener = TcpListener::bind(dst).map_err(|e| format!("bind {dst}: {e}"))?;
            tx.send(listener.local_addr().unwrap()).unwrap();
            listener.set_nonblocking(true).unwrap();
            let deadline = Instant::now() + Duration::from_secs_f64(secs + 30.0);
            let (mut sock, _) = loop {
                match listener.accept() {
                    Ok(x) => break x,
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(format!("accept: {e}")),
                }
            };
            sock.set_nonblocking(false).unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            receive_all(&mut sock, deadline, || {})
        });
        let server_addr = rx.recv_timeout(Duration::from_secs(5)).expect("sink bound");
        let cli_ns = t.ns_name(Ns::Client).to_owned();
        let stopped = stop.clone();
        let client = std::thread::spawn(move || {
            tests::netns::enter(&cli_ns);
            let mut sock = TcpStream::connect_timeout(&server_addr, Duration::from_secs(5))
                .map_err(|e| format!("connect: {e}"))?;
            sock.set_write_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            sock.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            // Pace: chunk i is due at (i + 1)/chunks of the duration.
            send_paced(&mut sock, STREAM_CHUNK, |i| {
                (i < chunks && !stopped.as_ref().is_some_and(|s| s.load(Ordering::Relaxed)))
                    .then(|| Duration::from_secs_f64(secs * f64::from(i + 1) / f64::from(chunks)))
            })
        });
        Self {
            client,
            server,
            stop,
        }
    }

    /// Ends an [`Stream::until_stopped`] and waits for both ends (a
    /// [`Stream::start`] runs its course); panics unless every byte
    /// arrived intact.
    pub fn finish(self) -> u64 {
        if let Some(stop) = &self.stop {
            stop.store(true, Ordering::Relaxed);
        }
        let c = self.client.join().expect("client thread");
        let s = self.server.join().expect("server thread");
        same_bytes(c, s)
    }
}

/// Runs `router-ctl detach` on drop (before the topology's own drop), so
/// a failing test leaves no staging pins or attach record behind.
pub struct DetachOnDrop<'a>(pub &'a Topology);

impl Drop for DetachOnDrop<'_> {
    fn drop(&mut self) {
        let _ = self.0.router_ctl(&["detach"]);
    }
}

/// Waits until `f` holds, polling every 50 ms; panics after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    wait_for_or_show(what, timeout, f, String::new);
}

/// [`wait_for`] whose panic message ends with `context()` (logs, tables).
pub fn wait_for_or_show(
    what: &str,
    timeout: Duration,
    f: impl FnMut() -> bool,
    context: impl FnOnce() -> String,
) {
    assert!(
        read_until(timeout, f, |held| *held),
        "timed out waiting for {what}\n{}",
        context()
    );
}

/// Takes a reading every 50 ms until `done` holds of one or `timeout`
/// passed, and returns the last: for counts a test wants to see grow by
/// at least so much, however slowly a loaded machine runs the traffic,
/// and then asserts on with the numbers in its message.
pub fn read_until<T>(
    timeout: Duration,
    mut read: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let r = read();
        if done(&r) || Instant::now() >= deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGKILL to the process group of `child` (started with
/// `process_group(0)`, so this reaches what it forked too), then reaps it.
pub fn kill_group(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id())
        // Only while it is our unreaped child: neither its pid nor its
        // group id can have been reused (see Topology::kill_children).
        && matches!(child.try_wait(), Ok(None))
    {
        // SAFETY: kill(2) on the process group of our own unreaped child.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Holds the lock of the router in `t`'s router namespace, as an attach
/// under way does, until dropped.
pub fn hold_router_lock(t: &Topology) -> std::fs::File {
    use std::os::fd::AsRawFd as _;
    // The lock attach and detach take (router-ctl's `state::lock`).
    std::fs::create_dir_all(tests::LOCK_DIR).unwrap();
    let path = format!("{}/{}.lock", tests::LOCK_DIR, t.ns_name(Ns::Router));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening {path}: {e}"));
    // SAFETY: flock on a valid fd.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "locking {path}: {}", std::io::Error::last_os_error());
    f
}
