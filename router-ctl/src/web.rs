//! The HTTP side of `run`: the live status page at `/`, its data at
//! `/api/status`, and the Prometheus metrics at `/metrics`, all on one
//! listener. A small HTTP/1.1 responder on tokio (GET and HEAD, one
//! request per connection): the daemon is a single-threaded runtime, and
//! three read-only routes need no framework.
//!
//! The listener is bound in the caller's network namespace before the
//! daemon enters the router's (see [`bind`]), as `metrics` does: with
//! `-n rtr` the page is reached from where the command was started, not
//! from inside the router's namespace.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    sync::{Notify, OwnedSemaphorePermit, Semaphore, watch},
};

use crate::{ctx::Ctx, metrics};

/// The default listen address of `run` and `metrics`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9469";
/// A request head larger than this is refused (431). Room for a browser's
/// cookies: every `localhost` cookie of the user's other local apps comes
/// along to a page opened through an SSH tunnel on localhost.
const MAX_HEAD: usize = 32 * 1024;
/// A client that has not sent its request head by then is dropped, and
/// one that does not take its response by then.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; one more is closed at once, so idle
/// connections cannot use up the daemon's file descriptors.
pub const MAX_CONNECTIONS: usize = 64;
/// The body of the 421 a loopback listener answers a request for another
/// name with ([`host_allowed`]), here and in `metrics`.
pub(crate) const MISDIRECTED: &str =
    "this listener answers requests to its address or localhost only\n";
/// After a failed `accept` (out of file descriptors, say) the listener
/// rests this long: the error would otherwise repeat at once, in a loop.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The page: one file, no assets from elsewhere (the CSP below refuses
/// them too), so it works on a router without internet access.
const PAGE: &str = include_str!("web/status.html");

/// A page that fetched within this long counts as open: the daemon walks
/// the table (conntrack fill, flows) only then.
pub const VIEW_TTL: Duration = Duration::from_secs(15);
/// How long the first fetch of a newly opened page waits for the daemon to
/// walk the table, rather than answer without flows.
const FIRST_VIEW_WAIT: Duration = Duration::from_secs(2);

/// Between the daemon and the connections: the JSON document it last
/// rendered, when a page last asked for it, and the wake-up a newly opened
/// page sends so it need not wait for the next sample.
#[derive(Debug)]
pub struct Shared {
    pub doc: watch::Sender<String>,
    last_view: Mutex<Option<Instant>>,
    pub wake: Notify,
    /// [`MAX_CONNECTIONS`] permits, one per connection being served.
    slots: Arc<Semaphore>,
    /// `router-ctl metrics`'s listener: `/metrics` and a line at `/`, no
    /// status page.
    metrics_only: bool,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            doc: watch::Sender::new(String::from("{}")),
            last_view: Mutex::new(None),
            wake: Notify::new(),
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
            metrics_only: false,
        }
    }
}

impl Shared {
    /// The state of `router-ctl metrics`'s listener (see
    /// [`Shared::metrics_only`]'s field).
    #[must_use]
    pub fn metrics_only() -> Self {
        Self {
            metrics_only: true,
            ..Self::default()
        }
    }

    /// A slot for one more connection, if fewer than [`MAX_CONNECTIONS`]
    /// are being served; held until the connection is done.
    #[must_use]
    pub fn slot(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    /// Whether a page fetched within [`VIEW_TTL`].
    #[must_use]
    pub fn viewed(&self) -> bool {
        self.last_view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some_and(|t| t.elapsed() < VIEW_TTL)
    }

    /// Notes a fetch; true if no page was open before it.
    fn view(&self) -> bool {
        let mut last = self
            .last_view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let first = last.is_none_or(|t| t.elapsed() >= VIEW_TTL);
        *last = Some(Instant::now());
        first
    }
}

pub type SharedState = Arc<Shared>;

/// `--listen ADDR:PORT`, or `none` for no listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Listen(pub Option<SocketAddr>);

pub fn parse_listen(s: &str) -> Result<Listen, String> {
    if s == "none" {
        return Ok(Listen(None));
    }
    s.parse()
        .map(|a| Listen(Some(a)))
        .map_err(|_| format!("{s:?} is not ADDR:PORT (e.g. 127.0.0.1:9469) or `none`"))
}

/// Binds in the calling thread's network namespace: call it before the
/// daemon enters the router's. A non-loopback address gets a warning.
pub fn bind(listen: Listen) -> Result<Option<std::net::TcpListener>> {
    let Some(addr) = listen.0 else {
        return Ok(None);
    };
    if !addr.ip().is_loopback() {
        tracing::warn!(
            "status page and metrics listen on {addr}, not loopback: anyone who reaches it \
             sees the router's traffic, flows and rules (read-only, no authentication)"
        );
    }
    let l = std::net::TcpListener::bind(addr).with_context(|| {
        format!("listening on {addr} (another router-ctl run or metrics on that port? --listen ADDR:PORT or none)")
    })?;
    l.set_nonblocking(true).context("a non-blocking listener")?;
    Ok(Some(l))
}

/// Says where the status page of `l` (bound by [`bind`]) is: once the
/// daemon is sure to serve it (it holds the router's daemon lock).
pub fn announce(l: &std::net::TcpListener) {
    if let Ok(bound) = l.local_addr() {
        println!("router-ctl run: status page on http://{bound}/ (metrics on /metrics)");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
}

struct Response {
    code: u16,
    reason: &'static str,
    content_type: &'static str,
    body: Vec<u8>,
    allow: bool,
}

impl Response {
    fn ok(content_type: &'static str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            code: 200,
            reason: "OK",
            content_type,
            body: body.into(),
            allow: false,
        }
    }

    fn text(code: u16, reason: &'static str, body: &str) -> Self {
        Self {
            code,
            reason,
            content_type: "text/plain; charset=utf-8",
            body: body.as_bytes().to_vec(),
            allow: code == 405,
        }
    }

    fn head(&self) -> String {
        let mut h = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\
             Cache-Control: no-store\r\nConnection: close\r\nX-Content-Type-Options: nosniff\r\n\
             Content-Security-Policy: default-src 'none'; script-src 'unsafe-inline'; \
             style-src 'unsafe-inline'; connect-src 'self'; img-src data:\r\n",
            self.code,
            self.reason,
            self.content_type,
            self.body.len()
        );
        if self.allow {
            h.push_str("Allow: GET, HEAD\r\n");
        }
        h.push_str("\r\n");
        h
    }
}

/// The answer to `method path`.
async fn route(ctx: &Ctx, shared: &SharedState, method: &str, path: &str) -> Response {
    if method != "GET" && method != "HEAD" {
        return Response::text(405, "Method Not Allowed", "only GET and HEAD\n");
    }
    match path {
        "/" if shared.metrics_only => Response::ok(
            "text/plain; charset=utf-8",
            "xdp-router metrics: /metrics\n",
        ),
        "/metrics" => match metrics::render(ctx) {
            Ok(body) => Response::ok(
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                body,
            ),
            Err(e) => Response::text(500, "Internal Server Error", &format!("{e:#}\n")),
        },
        _ if shared.metrics_only => Response::text(404, "Not Found", "not found; try /metrics\n"),
        "/" | "/index.html" => Response::ok("text/html; charset=utf-8", PAGE),
        "/api/status" => {
            if shared.view() {
                let mut rx = shared.doc.subscribe();
                rx.mark_unchanged();
                shared.wake.notify_one();
                let _ = tokio::time::timeout(FIRST_VIEW_WAIT, rx.changed()).await;
            }
            let doc = shared.doc.borrow().clone();
            Response::ok("application/json", doc)
        }
        _ => Response::text(404, "Not Found", "not found; try / or /metrics\n"),
    }
}

/// Method and path of a request head (`None`: not HTTP).
fn request_line(head: &[u8]) -> Option<(String, String)> {
    let text = std::str::from_utf8(head).ok()?;
    let line = text.lines().next()?;
    let mut parts = line.split_ascii_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?;
    parts.next()?.strip_prefix("HTTP/")?;
    let path = target.split(['?', '#']).next().unwrap_or("/").to_owned();
    Some((method, path))
}

/// The next connection on `listener` (`None`: no listener, or accepting
/// failed: after [`ACCEPT_BACKOFF`], since a listener that failed for want
/// of file descriptors stays readable and would fail again at once).
pub async fn accept(listener: Option<&tokio::net::TcpListener>) -> Option<(TcpStream, SocketAddr)> {
    match listener?.accept().await {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!("accepting an HTTP connection: {e}");
            tokio::time::sleep(ACCEPT_BACKOFF).await;
            None
        }
    }
}

/// Serves a connection from `peer` in a task of its own, if a slot is
/// free ([`MAX_CONNECTIONS`]); else closes it at once.
pub fn serve_connection(sock: TcpStream, peer: SocketAddr, ctx: &Ctx, shared: &SharedState) {
    let Some(slot) = shared.slot() else {
        tracing::debug!(
            "HTTP connection from {peer} closed: {MAX_CONNECTIONS} connections are being served"
        );
        return;
    };
    tracing::debug!("HTTP connection from {peer}");
    tokio::spawn(handle(sock, ctx.clone(), Arc::clone(shared), slot));
}

/// Whether a request whose `Host` header is `host` (`None`: it has none)
/// may be answered by a listener on `local`: one on a loopback address
/// answers only requests whose `Host` is an address or `localhost`, so a
/// web page whose name an attacker points at 127.0.0.1 (DNS rebinding)
/// cannot read the router's flows through the owner's browser or `ssh -L`
/// tunnel. A listener the owner exposed on another address answers any
/// name they give it. The rule of both listeners: this page's and
/// `metrics`'s. An IPv4 loopback connection to a dual-stack listener
/// (`[::]`) arrives on `::ffff:127.0.0.1`: loopback too.
pub(crate) fn host_allowed(host: Option<&str>, local: SocketAddr) -> bool {
    if !local.ip().to_canonical().is_loopback() {
        return true;
    }
    let Some(host) = host else {
        return true;
    };
    let host = host.trim();
    let name = match host.strip_prefix('[') {
        // `[v6]` or `[v6]:port`.
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok()
}

/// Where the request head in `buf` ends: after its empty line, `CRLF CRLF`
/// or, as RFC 9112 2.2 lets a recipient accept, a bare `LF LF`.
fn head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// [`head_end`] of `head` whose first `scanned` bytes held no end: only
/// the rest is scanned (with the 3 bytes before it, where an end split
/// across reads begins).
fn head_end_after(head: &[u8], scanned: usize) -> Option<usize> {
    let from = scanned.saturating_sub(3);
    head_end(&head[from..]).map(|end| from + end)
}

/// [`host_allowed`] for a raw request head. One that is not UTF-8 counts
/// as naming no address (its `Host` cannot be read): refused by a loopback
/// listener.
fn head_host_allowed(head: &[u8], local: SocketAddr) -> bool {
    let Ok(text) = std::str::from_utf8(head) else {
        return host_allowed(Some(""), local);
    };
    let host = text.lines().skip(1).find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim().eq_ignore_ascii_case("host").then_some(value)
    });
    host_allowed(host, local)
}

/// Serves one connection: one request, one response, closed; `_slot` is
/// its place among the [`MAX_CONNECTIONS`], given back when it is done.
pub async fn handle(
    mut sock: TcpStream,
    ctx: Ctx,
    shared: SharedState,
    _slot: OwnedSemaphorePermit,
) {
    let mut head = Vec::with_capacity(1024);
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        let mut buf = [0u8; 1024];
        // Each read's bytes are scanned once (with the 3 before them, where
        // an end split across reads begins): a head trickled in byte by
        // byte costs its length, not its length squared, on the daemon's
        // one thread.
        let mut scanned = 0;
        loop {
            if let Some(end) = head_end_after(&head, scanned) {
                return Some(end <= MAX_HEAD);
            }
            scanned = head.len();
            if head.len() > MAX_HEAD {
                // Ended or not, too long: refused, not served from a part.
                return Some(false);
            }
            let n = sock.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            head.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    let local = sock.local_addr().ok();
    let unread_rest = matches!(read, Ok(Some(false)));
    let (resp, head_only) = match (read, request_line(&head)) {
        (Ok(Some(false)), _) => (
            Response::text(
                431,
                "Request Header Fields Too Large",
                "the request head is over 32 KiB\n",
            ),
            false,
        ),
        (Ok(Some(true)), Some(_)) if local.is_some_and(|l| !head_host_allowed(&head, l)) => (
            Response::text(421, "Misdirected Request", MISDIRECTED),
            false,
        ),
        (Ok(Some(true)), Some((method, path))) => {
            tracing::debug!("{method} {path}");
            (route(&ctx, &shared, &method, &path).await, method == "HEAD")
        }
        (Ok(_), _) => (
            Response::text(400, "Bad Request", "not an HTTP request\n"),
            false,
        ),
        (Err(_), _) => return,
    };
    // A refused head's rest is still coming in (`unread_rest`): closed with
    // unread data, the socket would send a reset, which can take the 431
    // away from the client before it reads it. So the rest is read
    // (bounded) first.
    let _ = tokio::time::timeout(READ_TIMEOUT, async {
        sock.write_all(resp.head().as_bytes()).await?;
        if !head_only {
            sock.write_all(&resp.body).await?;
        }
        sock.shutdown().await?;
        let mut buf = [0u8; 1024];
        let mut drained = 0;
        while unread_rest && drained < 4 * MAX_HEAD {
            match sock.read(&mut buf).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<_, std::io::Error>(())
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_fed_byte_by_byte_ends_where_a_whole_one_does() {
        for head in [
            &b"GET / HTTP/1.1\r\nHost: a\r\n\r\nbody"[..],
            b"GET / HTTP/1.0\nHost: a\n\nbody",
        ] {
            let whole = head_end(head).expect("an end");
            let mut scanned = 0;
            let fed = (1..=head.len()).find_map(|n| {
                let end = head_end_after(&head[..n], scanned);
                scanned = n;
                end
            });
            assert_eq!(fed, Some(whole), "{head:?}");
            assert_eq!(&head[whole..], b"body");
        }
    }

    #[test]
    fn request_lines() {
        assert_eq!(
            request_line(b"GET /api/status?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(("GET".into(), "/api/status".into()))
        );
        assert_eq!(request_line(b"garbage\r\n\r\n"), None);
        assert_eq!(request_line(b"GET / SMTP\r\n\r\n"), None);
    }

    #[test]
    fn a_loopback_listener_answers_addresses_and_localhost_only() {
        let lo: SocketAddr = "127.0.0.1:9469".parse().unwrap();
        let req = |host: &str| format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").into_bytes();
        for ok in [
            "127.0.0.1:9469",
            "localhost:9469",
            "LOCALHOST",
            "[::1]:9469",
            "10.0.0.1",
        ] {
            assert!(head_host_allowed(&req(ok), lo), "{ok}");
        }
        for refused in ["evil.example:9469", "router.lan", "127.0.0.1.nip.io:9469"] {
            assert!(!head_host_allowed(&req(refused), lo), "{refused}");
        }
        assert!(
            head_host_allowed(b"GET / HTTP/1.0\r\n\r\n", lo),
            "no Host header"
        );
        assert!(
            !head_host_allowed(b"GET / HTTP/1.1\r\nHost: \xff\r\n\r\n", lo),
            "a head that is not UTF-8"
        );
        let exposed: SocketAddr = "0.0.0.0:9469".parse().unwrap();
        assert!(head_host_allowed(&req("router.lan:9469"), exposed));
        // IPv4 loopback through a dual-stack listener.
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:9469".parse().unwrap();
        assert!(!head_host_allowed(&req("router.lan:9469"), mapped));
    }

    #[test]
    fn listen_values() {
        assert_eq!(parse_listen("none"), Ok(Listen(None)));
        assert_eq!(
            parse_listen(DEFAULT_LISTEN).unwrap().0.unwrap().port(),
            9469
        );
        assert!(parse_listen("localhost").is_err());
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere() {
        for needle in ["http://", "https://", "<link", "src=\"", "@import"] {
            assert!(!PAGE.contains(needle), "the page has {needle}");
        }
        assert!(PAGE.contains("/api/status"));
        assert!(PAGE.contains("name=\"viewport\""));
    }
}
