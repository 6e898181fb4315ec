//! The egress proxy (`docs/reliability.md`, "Network egress"): HTTP CONNECT (TLS only: the
//! ClientHello's server name must be the CONNECT host) and plain HTTP (the Host header must be
//! the request's host), for kernels it knows by their address on the egress network and the
//! credential in their proxy URL. Every destination is judged by the kernel's [`Grant`] on its
//! name, then on each address the proxy resolved it to; the upstream connection goes to a
//! judged address only. Bounded: request heads, connections in all and per kernel, bytes per
//! second per kernel, every wait. A tunnel's bytes are copied as they are, which keeps the
//! place open for TLS interception at the boundary: `tunnel` is where it would go.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::future::Future;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::policy::{Grant, Refusal};
use super::sni::{self, Hello};

/// Longest request head a kernel may send (request line and headers).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// How long a kernel has to send a request head, a ClientHello, and the proxy to resolve and
/// connect.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// How the proxy is bounded.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once from one kernel.
    pub connections_per_kernel: usize,
    /// Connections open at once in all (accepted, not yet known to be a kernel's included).
    pub connections: usize,
    /// Bytes per second one kernel moves (in and out together).
    pub bytes_per_second: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections_per_kernel: 64,
            connections: 4096,
            bytes_per_second: 50 * 1024 * 1024,
        }
    }
}

/// Why a connection was refused or failed, beyond the policy's own reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// The policy refused it.
    Refused(Refusal),
    /// The CONNECT host, the TLS server name or the Host header disagree.
    Mismatch,
    /// A CONNECT tunnel that does not begin with a TLS ClientHello.
    NotTls,
    /// No valid credential for the kernel at that address.
    Unauthenticated,
    /// Past the kernel's connection limit.
    TooManyConnections,
    /// The request was malformed (no host, a relative URL, ...).
    BadRequest,
    /// The name did not resolve (or not in time).
    ResolveFailed,
    /// The destination did not answer.
    ConnectFailed,
    /// Closed because the session's policy changed and no longer allows it.
    PolicyChanged,
    /// The destination is on the egress network itself (another kernel): never, whatever
    /// the policy.
    KernelNetwork,
}

impl Outcome {
    /// Every outcome (its `name` is a refusal reason of metrics and audit lines).
    pub const ALL: [Outcome; 12] = [
        Outcome::Refused(Refusal::NotAllowed),
        Outcome::Refused(Refusal::Denied),
        Outcome::Refused(Refusal::PrivateAddress),
        Outcome::Mismatch,
        Outcome::NotTls,
        Outcome::Unauthenticated,
        Outcome::TooManyConnections,
        Outcome::BadRequest,
        Outcome::ResolveFailed,
        Outcome::ConnectFailed,
        Outcome::PolicyChanged,
        Outcome::KernelNetwork,
    ];

    /// The name in metrics and audit lines.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Refused(r) => r.name(),
            Outcome::Mismatch => "host_mismatch",
            Outcome::NotTls => "not_tls",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::TooManyConnections => "too_many_connections",
            Outcome::BadRequest => "bad_request",
            Outcome::ResolveFailed => "resolve_failed",
            Outcome::ConnectFailed => "connect_failed",
            Outcome::PolicyChanged => "policy_changed",
            Outcome::KernelNetwork => "kernel_network",
        }
    }
}

/// Counters of one tenant (`kernelbox_egress_*` in `/metrics`).
#[derive(Debug, Default, Clone)]
pub struct TenantCounters {
    /// Bytes sent by kernels to destinations.
    pub bytes_out: u64,
    /// Bytes received from destinations.
    pub bytes_in: u64,
    /// Connections allowed.
    pub connections: u64,
    /// Refusals and failures by reason.
    pub refusals: HashMap<&'static str, u64>,
}

/// One kernel the proxy serves.
pub struct KernelEntry {
    /// The credential in its proxy URL (`kernelbox:TOKEN`).
    pub token: String,
    /// Its tenant.
    pub tenant: String,
    /// Its session.
    pub session: String,
    grant: Mutex<Grant>,
    connections: Arc<Semaphore>,
    bucket: Arc<Bucket>,
    live: Mutex<Vec<Live>>,
    next_live: AtomicU64,
    /// Cancelled when the kernel goes: every connection of it ends.
    pub cancel: CancellationToken,
}

impl std::fmt::Debug for KernelEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelEntry")
            .field("tenant", &self.tenant)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// A connection under way: where it goes, to be judged again when the policy changes.
struct Live {
    id: u64,
    host: String,
    port: u16,
    addr: IpAddr,
    cancel: CancellationToken,
}

impl KernelEntry {
    /// A kernel of `tenant`'s `session` under `grant`.
    pub fn new(
        token: String,
        tenant: String,
        session: String,
        grant: Grant,
        limits: &Limits,
    ) -> Self {
        KernelEntry {
            token,
            tenant,
            session,
            grant: Mutex::new(grant),
            connections: Arc::new(Semaphore::new(limits.connections_per_kernel)),
            bucket: Arc::new(Bucket::new(limits.bytes_per_second)),
            live: Mutex::new(Vec::new()),
            next_live: AtomicU64::new(0),
            cancel: CancellationToken::new(),
        }
    }

    fn grant(&self) -> Grant {
        self.grant.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Applies `grant` at once: connections it no longer allows are closed. Returns how many.
    pub fn set_grant(&self, grant: Grant) -> usize {
        *self.grant.lock().unwrap_or_else(|p| p.into_inner()) = grant.clone();
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let mut closed = 0;
        for conn in live.iter() {
            let ok = grant.check_name(&conn.host, conn.port).is_ok()
                && grant
                    .check_address(&conn.host, conn.port, conn.addr)
                    .is_ok();
            if !ok {
                conn.cancel.cancel();
                closed += 1;
            }
        }
        closed
    }

    fn enter(self: &Arc<Self>, host: &str, port: u16, addr: IpAddr) -> LiveGuard {
        let id = self.next_live.fetch_add(1, Ordering::Relaxed);
        let cancel = self.cancel.child_token();
        self.live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Live {
                id,
                host: host.to_string(),
                port,
                addr,
                cancel: cancel.clone(),
            });
        LiveGuard {
            entry: self.clone(),
            id,
            cancel,
        }
    }
}

/// Removes its connection from the kernel's live list when dropped.
struct LiveGuard {
    entry: Arc<KernelEntry>,
    id: u64,
    cancel: CancellationToken,
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        self.entry
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|l| l.id != self.id);
    }
}

/// Most audit lines waiting for the audit file's writer; past it a line goes to the log
/// instead (the proxy never waits on the disk).
pub const AUDIT_BACKLOG: usize = 4096;

/// Where audit lines go when `--egress-audit PATH` is given: one JSON line per connection,
/// appended by a writer thread of its own.
#[derive(Debug)]
pub struct AuditFile {
    lines: std::sync::mpsc::SyncSender<String>,
}

impl AuditFile {
    /// Opens `path` for appending (created if missing) and starts its writer.
    pub fn open(path: &std::path::Path) -> std::io::Result<AuditFile> {
        use std::io::Write as _;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let (lines, rx) = std::sync::mpsc::sync_channel::<String>(AUDIT_BACKLOG);
        let path = path.to_path_buf();
        std::thread::Builder::new()
            .name("kernelbox-egress-audit".into())
            .spawn(move || {
                let mut out = std::io::BufWriter::new(file);
                // Ends when the last sender (the proxy's table) is dropped.
                while let Ok(line) = rx.recv() {
                    let mut batch = Some(line);
                    while let Some(line) = batch {
                        if let Err(e) = out.write_all(line.as_bytes()) {
                            tracing::warn!(path = %path.display(), error = %e, line = %line.trim_end(), "writing the egress audit file");
                        }
                        batch = rx.try_recv().ok();
                    }
                    if let Err(e) = out.flush() {
                        tracing::warn!(path = %path.display(), error = %e, "flushing the egress audit file");
                    }
                }
            })?;
        Ok(AuditFile { lines })
    }
}

/// What the proxy shares with its owner: the kernels it serves, the tenants' counters, where
/// audit lines go, and the egress network's own range (never a destination).
#[derive(Debug, Default)]
pub struct Table {
    kernels: Mutex<HashMap<IpAddr, Arc<KernelEntry>>>,
    counters: Mutex<HashMap<String, TenantCounters>>,
    audit: Option<AuditFile>,
    kernel_network: Option<(IpAddr, u8)>,
}

impl Table {
    /// A table whose audit lines go to `audit` (else the log), refusing destinations in
    /// `kernel_network` (the egress network's subnet: base and prefix length).
    pub fn new(audit: Option<AuditFile>, kernel_network: Option<(IpAddr, u8)>) -> Table {
        Table {
            audit,
            kernel_network,
            ..Table::default()
        }
    }

    /// Serves `entry` for connections from `addr` (replacing any earlier kernel there).
    pub fn insert(&self, addr: IpAddr, entry: Arc<KernelEntry>) {
        if let Some(old) = self
            .kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(addr, entry)
        {
            old.cancel.cancel();
        }
    }

    /// Stops serving the kernel at `addr` (when it is `token`'s): its connections end.
    pub fn remove(&self, addr: IpAddr, token: &str) {
        let mut kernels = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
        if kernels.get(&addr).is_some_and(|e| e.token == token) {
            if let Some(e) = kernels.remove(&addr) {
                e.cancel.cancel();
            }
        }
    }

    /// The kernels of `tenant`'s `session`.
    pub fn of_session(&self, tenant: &str, session: &str) -> Vec<Arc<KernelEntry>> {
        self.kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|e| e.tenant == tenant && e.session == session)
            .cloned()
            .collect()
    }

    fn lookup(&self, addr: IpAddr) -> Option<Arc<KernelEntry>> {
        self.kernels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&addr)
            .cloned()
    }

    fn count(&self, tenant: &str, f: impl FnOnce(&mut TenantCounters)) {
        let mut counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        f(counters.entry(tenant.to_string()).or_default());
    }

    /// Every tenant's counters.
    pub fn counters(&self) -> Vec<(String, TenantCounters)> {
        let counters = self.counters.lock().unwrap_or_else(|p| p.into_inner());
        let mut all: Vec<_> = counters
            .iter()
            .map(|(t, c)| (t.clone(), c.clone()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

/// A per-kernel byte budget: `rate` a second, spent as bytes move; a connection that finds it
/// spent waits until it is positive again.
#[derive(Debug)]
struct Bucket {
    rate: u64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    fn new(rate: u64) -> Bucket {
        Bucket {
            rate: rate.max(1),
            state: Mutex::new((rate.max(1) as f64, Instant::now())),
        }
    }

    /// `None` when bytes may move now, else how long to wait.
    fn wait(&self) -> Option<Duration> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let rate = self.rate as f64;
        s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * rate).min(rate);
        s.1 = now;
        if s.0 > 0.0 {
            None
        } else {
            Some(Duration::from_secs_f64((-s.0 + 1.0) / rate))
        }
    }

    fn spend(&self, n: usize) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0 -= n as f64;
    }
}

/// An upstream connection: bytes counted (for the audit line and the tenant's counters) and
/// paced by the kernel's [`Bucket`].
struct Metered<S> {
    inner: S,
    bucket: Arc<Bucket>,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    bytes_in: Arc<AtomicU64>,
    bytes_out: Arc<AtomicU64>,
}

impl<S> Metered<S> {
    fn paced(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.bucket.wait() {
                None => return Poll::Ready(()),
                Some(d) => self.sleep = Some(Box::pin(tokio::time::sleep(d))),
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.paced(cx).is_pending() {
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.bucket.spend(n);
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.paced(cx).is_pending() {
            return Poll::Pending;
        }
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.bucket.spend(n);
            self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The proxy: serves `listener` until `cancel`.
pub async fn serve(
    listener: TcpListener,
    table: Arc<Table>,
    limits: Limits,
    cancel: CancellationToken,
) {
    let total = Arc::new(Semaphore::new(limits.connections));
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, peer)) = accepted else {
            continue;
        };
        // Past the total, a connection is closed at once: memory stays bounded.
        let Ok(permit) = total.clone().try_acquire_owned() else {
            continue;
        };
        let Some(entry) = table.lookup(peer.ip()) else {
            continue;
        };
        let table = table.clone();
        tokio::spawn(async move {
            let _permit = permit;
            connection(stream, peer, entry, table).await;
        });
    }
}

type Body = BoxBody<Bytes, hyper::Error>;

fn text(status: StatusCode, message: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(message + "\n"))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The message a cell sees (pip and `requests` show the status line and body).
fn refusal_message(host: &str, port: u16, outcome: Outcome) -> String {
    let why = match outcome {
        Outcome::Refused(Refusal::NotAllowed) => {
            "the network policy (the tenant's or the session's) does not allow it"
        }
        Outcome::Refused(Refusal::Denied) => "the network policy denies it",
        Outcome::Refused(Refusal::PrivateAddress) => {
            "it resolves to a private, loopback or link-local address the policy does not name"
        }
        Outcome::Mismatch => "the Host header (or TLS server name) is not the requested host",
        Outcome::NotTls => "a tunnel must carry TLS",
        Outcome::Unauthenticated => "no valid kernel credential",
        Outcome::TooManyConnections => "the kernel has too many connections open",
        Outcome::BadRequest => "the request names no host (send an absolute http:// URL)",
        Outcome::ResolveFailed => "the name did not resolve",
        Outcome::ConnectFailed => "the destination did not answer",
        Outcome::PolicyChanged => "the session's network policy changed",
        Outcome::KernelNetwork => "it is another kernel on the egress network",
    };
    format!(
        "kernelbox egress: {host}:{port} refused ({}): {why}",
        outcome.name()
    )
}

fn audit(
    table: &Table,
    entry: &KernelEntry,
    host: &str,
    port: u16,
    out: u64,
    inb: u64,
    outcome: Result<(), Outcome>,
) {
    let verdict = match outcome {
        Ok(()) => "allowed",
        Err(o) => o.name(),
    };
    if let Some(file) = &table.audit {
        let time = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let line = serde_json::json!({
            "time": time,
            "tenant": entry.tenant,
            "session": entry.session,
            "host": host,
            "port": port,
            "bytes_out": out,
            "bytes_in": inb,
            "outcome": verdict,
        })
        .to_string()
            + "\n";
        match file.lines.try_send(line) {
            Ok(()) => return,
            // A full backlog (or a writer gone): the line goes to the log below.
            Err(_) => tracing::warn!("the egress audit file's backlog is full; logging instead"),
        }
    }
    tracing::info!(
        target: "kernelbox::egress::audit",
        tenant = %entry.tenant,
        session = %entry.session,
        host = %host,
        port,
        bytes_out = out,
        bytes_in = inb,
        outcome = verdict,
        "egress connection"
    );
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    entry: Arc<KernelEntry>,
    table: Arc<Table>,
) {
    let Ok(permit) = entry.connections.clone().try_acquire_owned() else {
        table.count(&entry.tenant, |c| {
            *c.refusals
                .entry(Outcome::TooManyConnections.name())
                .or_default() += 1
        });
        audit(
            &table,
            &entry,
            "-",
            0,
            0,
            0,
            Err(Outcome::TooManyConnections),
        );
        let mut stream = stream;
        let message = refusal_message(
            &peer.ip().to_string(),
            peer.port(),
            Outcome::TooManyConnections,
        );
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            stream.write_all(
                format!(
                    "HTTP/1.1 429 Too Many Requests\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{message}\n",
                    message.len() + 1
                )
                .as_bytes(),
            ),
        )
        .await;
        return;
    };
    let cancel = entry.cancel.clone();
    let service = {
        let entry = entry.clone();
        let table = table.clone();
        hyper::service::service_fn(move |req| {
            let entry = entry.clone();
            let table = table.clone();
            async move { Ok::<_, Infallible>(handle(req, entry, table).await) }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD_BYTES.max(8192))
        .timer(TokioTimer::new())
        .header_read_timeout(STEP_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = conn => {}
    }
    drop(permit);
}

fn authorised(req: &Request<Incoming>, entry: &KernelEntry) -> bool {
    use base64::Engine as _;
    let Some(value) = req.headers().get(hyper::header::PROXY_AUTHORIZATION) else {
        return false;
    };
    let Some(encoded) = value.to_str().ok().and_then(|v| v.strip_prefix("Basic ")) else {
        return false;
    };
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(encoded.trim()) else {
        return false;
    };
    let expected = format!("kernelbox:{}", entry.token);
    // Constant time over the expected length.
    decoded.len() == expected.len()
        && decoded
            .iter()
            .zip(expected.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Judges `host:port` and resolves it: the address to connect to. An address on the egress
/// network itself (another kernel) is refused whatever the policy.
async fn judge(
    grant: &Grant,
    kernel_network: Option<(IpAddr, u8)>,
    host: &str,
    port: u16,
) -> Result<SocketAddr, Outcome> {
    grant.check_name(host, port).map_err(Outcome::Refused)?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = match bare.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => tokio::time::timeout(STEP_TIMEOUT, tokio::net::lookup_host((bare, port)))
            .await
            .map_err(|_| Outcome::ResolveFailed)?
            .map_err(|_| Outcome::ResolveFailed)?
            .take(16)
            .collect(),
    };
    if addrs.is_empty() {
        return Err(Outcome::ResolveFailed);
    }
    // Every address must pass: a name with one private address among public ones is refused.
    for addr in &addrs {
        if kernel_network.is_some_and(|(base, len)| super::policy::in_range(addr.ip(), base, len)) {
            return Err(Outcome::KernelNetwork);
        }
        grant
            .check_address(host, port, addr.ip())
            .map_err(Outcome::Refused)?;
    }
    Ok(addrs[0])
}

fn split_authority(authority: &hyper::http::uri::Authority, default_port: u16) -> (String, u16) {
    let host = authority.host().to_ascii_lowercase();
    (host, authority.port_u16().unwrap_or(default_port))
}

async fn handle(
    req: Request<Incoming>,
    entry: Arc<KernelEntry>,
    table: Arc<Table>,
) -> Response<Body> {
    let refuse = |host: &str, port: u16, outcome: Outcome| {
        table.count(&entry.tenant, |c| {
            *c.refusals.entry(outcome.name()).or_default() += 1
        });
        audit(&table, &entry, host, port, 0, 0, Err(outcome));
        let status = match outcome {
            Outcome::Unauthenticated => StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            Outcome::BadRequest | Outcome::Mismatch => StatusCode::BAD_REQUEST,
            Outcome::ResolveFailed | Outcome::ConnectFailed => StatusCode::BAD_GATEWAY,
            _ => StatusCode::FORBIDDEN,
        };
        let mut response = text(status, refusal_message(host, port, outcome));
        if outcome == Outcome::Unauthenticated {
            response.headers_mut().insert(
                hyper::header::PROXY_AUTHENTICATE,
                hyper::header::HeaderValue::from_static("Basic realm=\"kernelbox\""),
            );
        }
        response
    };
    let connect = req.method() == Method::CONNECT;
    let Some(authority) = req.uri().authority().cloned() else {
        return refuse("-", 0, Outcome::BadRequest);
    };
    if !connect && req.uri().scheme_str() != Some("http") {
        return refuse("-", 0, Outcome::BadRequest);
    }
    let (host, port) = split_authority(&authority, if connect { 443 } else { 80 });
    if !authorised(&req, &entry) {
        return refuse(&host, port, Outcome::Unauthenticated);
    }
    if !connect {
        // The Host header, when given, must name the URL's host.
        if let Some(h) = req.headers().get(hyper::header::HOST) {
            let same = h
                .to_str()
                .ok()
                .and_then(|h| h.parse::<hyper::http::uri::Authority>().ok())
                .map(|a| split_authority(&a, 80) == (host.clone(), port))
                .unwrap_or(false);
            if !same {
                return refuse(&host, port, Outcome::Mismatch);
            }
        }
    }
    let grant = entry.grant();
    let addr = match judge(&grant, table.kernel_network, &host, port).await {
        Ok(addr) => addr,
        Err(outcome) => return refuse(&host, port, outcome),
    };
    let upstream = match tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        _ => return refuse(&host, port, Outcome::ConnectFailed),
    };
    let live = entry.enter(&host, port, addr.ip());
    let (bytes_in, bytes_out) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let upstream = Metered {
        inner: upstream,
        bucket: entry.bucket.clone(),
        sleep: None,
        bytes_in: bytes_in.clone(),
        bytes_out: bytes_out.clone(),
    };
    let done = Finish {
        entry: entry.clone(),
        table: table.clone(),
        host: host.clone(),
        port,
        bytes_in,
        bytes_out,
        outcome: Mutex::new(Ok(())),
        _live: live,
    };
    if connect {
        tokio::spawn(tunnel(req, upstream, done));
        Response::new(
            http_body_util::Empty::new()
                .map_err(|never: Infallible| match never {})
                .boxed(),
        )
    } else {
        forward(req, upstream, done).await
    }
}

/// Counts and audits one allowed connection when it ends.
struct Finish {
    entry: Arc<KernelEntry>,
    table: Arc<Table>,
    host: String,
    port: u16,
    bytes_in: Arc<AtomicU64>,
    bytes_out: Arc<AtomicU64>,
    outcome: Mutex<Result<(), Outcome>>,
    _live: LiveGuard,
}

impl Finish {
    fn fail(&self, outcome: Outcome) {
        *self.outcome.lock().unwrap_or_else(|p| p.into_inner()) = Err(outcome);
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        let (inb, out) = (
            self.bytes_in.load(Ordering::Relaxed),
            self.bytes_out.load(Ordering::Relaxed),
        );
        let outcome = *self.outcome.lock().unwrap_or_else(|p| p.into_inner());
        self.table.count(&self.entry.tenant, |c| {
            c.bytes_in += inb;
            c.bytes_out += out;
            match outcome {
                Ok(()) => c.connections += 1,
                Err(o) => *c.refusals.entry(o.name()).or_default() += 1,
            }
        });
        audit(
            &self.table,
            &self.entry,
            &self.host,
            self.port,
            out,
            inb,
            outcome,
        );
    }
}

/// A CONNECT tunnel once answered 200: the ClientHello read and judged, then bytes copied both
/// ways until either side ends, the kernel goes or the policy no longer allows it.
async fn tunnel(req: Request<Incoming>, mut upstream: Metered<TcpStream>, done: Finish) {
    let Ok(Ok(upgraded)) = tokio::time::timeout(STEP_TIMEOUT, hyper::upgrade::on(req)).await else {
        return;
    };
    let mut client = TokioIo::new(upgraded);
    let mut hello = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    let server_name = loop {
        match sni::parse(&hello) {
            Hello::ClientHello(name) => break name,
            Hello::NotTls => return done.fail(Outcome::NotTls),
            Hello::Incomplete(_) if hello.len() >= sni::MAX_CLIENT_HELLO => {
                return done.fail(Outcome::NotTls)
            }
            Hello::Incomplete(need) => {
                let want = need.saturating_sub(hello.len()).min(chunk.len());
                match tokio::time::timeout(STEP_TIMEOUT, client.read(&mut chunk[..want])).await {
                    Ok(Ok(n)) if n > 0 => hello.extend_from_slice(&chunk[..n]),
                    _ => return done.fail(Outcome::NotTls),
                }
            }
        }
    };
    let literal = done
        .host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok();
    let matches = match &server_name {
        Some(name) => name.trim_end_matches('.') == done.host,
        None => literal,
    };
    if !matches {
        return done.fail(Outcome::Mismatch);
    }
    if upstream.write_all(&hello).await.is_err() {
        return done.fail(Outcome::ConnectFailed);
    }
    let cancel = done._live.cancel.clone();
    tokio::select! {
        _ = cancel.cancelled() => {
            if !done.entry.cancel.is_cancelled() {
                done.fail(Outcome::PolicyChanged);
            }
        }
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
    }
}

/// A plain HTTP request sent on to the destination (origin-form, without the proxy's headers),
/// its response streamed back.
async fn forward(
    req: Request<Incoming>,
    upstream: Metered<TcpStream>,
    done: Finish,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    parts.uri = match path.parse() {
        Ok(uri) => uri,
        Err(_) => return text(StatusCode::BAD_REQUEST, "bad path".into()),
    };
    for hop in [
        hyper::header::PROXY_AUTHORIZATION,
        hyper::header::PROXY_AUTHENTICATE,
        hyper::header::CONNECTION,
        hyper::header::TE,
        hyper::header::TRAILER,
        hyper::header::UPGRADE,
    ] {
        parts.headers.remove(hop);
    }
    parts.headers.remove("proxy-connection");
    parts.headers.remove("keep-alive");
    let (mut sender, conn) = match tokio::time::timeout(
        STEP_TIMEOUT,
        hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(upstream)),
    )
    .await
    {
        Ok(Ok(pair)) => pair,
        _ => {
            done.fail(Outcome::ConnectFailed);
            return text(
                StatusCode::BAD_GATEWAY,
                refusal_message(&done.host, done.port, Outcome::ConnectFailed),
            );
        }
    };
    let cancel = done._live.cancel.clone();
    tokio::spawn(async move {
        let done = done;
        tokio::select! {
            _ = cancel.cancelled() => {
                if !done.entry.cancel.is_cancelled() {
                    done.fail(Outcome::PolicyChanged);
                }
            }
            _ = conn => {}
        }
    });
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => response.map(|b| b.boxed()),
        Err(_) => text(
            StatusCode::BAD_GATEWAY,
            "kernelbox egress: the destination closed the connection".into(),
        ),
    }
}
