//! Accepting and driving HTTP/1 connections with bounds a slow or idle client cannot escape.
//!
//! hyper's own `header_read_timeout` starts when the server begins waiting for a request
//! head, and on a keep-alive connection that includes the idle wait before the next request,
//! so it cannot give an idle connection longer than a half-sent head. Each connection here
//! is therefore driven under its own clock instead:
//!
//! - the first request's head must arrive in full within `first_header_timeout` (at most
//!   `header_timeout`) of the accept: a connection that has not said what it wants holds a
//!   slot only briefly;
//! - once a response is sent, the connection may sit idle for `keepalive_timeout`; when the
//!   next request's first byte arrives, its head must be complete within `header_timeout`;
//! - a request's body must arrive in full within `body_timeout` of its head;
//! - once its body is in, while the request is in flight (its response, streamed or not, not
//!   yet fully sent) no deadline applies to the request as a whole, so long cells are never
//!   cut; but a write to the client must progress within `send_timeout`: a client that stops
//!   reading (its socket buffers full) has its connection closed, and the response it was
//!   sent (with whatever it held, such as a download's kernel) is dropped.
//!
//! At most `max_connections` connections are open at once across every listener, and of
//! them at most `max_unauthenticated` that no request with a valid tenant token has come on
//! yet (`slots.rs` keeps the books and says who gives way); a connection that cannot have a
//! slot is answered at once with a 503 (`too_many_connections`) and closed.
//!
//! A connection hyper closes after answering (a response sent before its request's body was
//! read: an upload refused mid-way, its session deleted) lingers before the socket closes:
//! what the client still sends is read off, up to [`LINGER_BYTES`] or [`LINGER_TIME`], so the
//! close is a FIN after the answer, never a reset that makes the client's TCP stack discard
//! the answer it has not read yet.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, Response};
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::Watcher;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::slots::{Caps, Doing, Promote, Slot};

/// Most a closing connection reads off its client before the socket closes (see the module
/// documentation).
pub const LINGER_BYTES: usize = 1024 * 1024;

/// Longest a closing connection waits for its client to stop sending.
pub const LINGER_TIME: Duration = Duration::from_secs(2);

/// Connection bounds of the HTTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A request head (request line and headers) must arrive in full within this time of its
    /// first byte, on a connection past its first request.
    pub header_timeout: Duration,
    /// A connection's first request head must arrive in full within this time of the accept
    /// (or `header_timeout`, if shorter).
    pub first_header_timeout: Duration,
    /// A connection with no request in flight is closed after this long without one.
    pub keepalive_timeout: Duration,
    /// A request's body must arrive in full within this time of its head.
    pub body_timeout: Duration,
    /// A write to the client blocked (the client not reading) longer than this closes the
    /// connection.
    pub send_timeout: Duration,
    /// Most connections open at once, across every listener (at least 1).
    pub max_connections: usize,
    /// Most connections open at once on which no request has yet carried a valid tenant
    /// token, in 1..=`max_connections`; `None`: a quarter of `max_connections` (at least 1).
    pub max_unauthenticated: Option<usize>,
    /// Most of those from one address (an IPv4 address or an IPv6 /64); 0 sets no cap. Behind
    /// a reverse proxy every connection comes from the proxy's address: set 0 there.
    pub max_unauthenticated_per_address: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(10),
            first_header_timeout: Duration::from_secs(3),
            keepalive_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(30),
            max_connections: 1024,
            max_unauthenticated: None,
            max_unauthenticated_per_address: 64,
        }
    }
}

impl Limits {
    /// What makes these limits unusable, if anything.
    pub fn problem(&self) -> Option<&'static str> {
        if self.header_timeout.is_zero() {
            Some("header_timeout must be positive")
        } else if self.first_header_timeout.is_zero() {
            Some("first_header_timeout must be positive")
        } else if self.keepalive_timeout.is_zero() {
            Some("keepalive_timeout must be positive")
        } else if self.body_timeout.is_zero() {
            Some("body_timeout must be positive")
        } else if self.send_timeout.is_zero() {
            Some("send_timeout must be positive")
        } else if self.max_connections == 0 {
            Some("max_connections must be at least 1")
        } else if self
            .max_unauthenticated
            .is_some_and(|n| n == 0 || n > self.max_connections)
        {
            Some("max_unauthenticated must be at least 1 and at most max_connections")
        } else {
            None
        }
    }

    /// The unauthenticated pool's size.
    pub fn unauthenticated(&self) -> usize {
        self.max_unauthenticated
            .unwrap_or(self.max_connections / 4)
            .clamp(1, self.max_connections.max(1))
    }

    /// The caps of the slot books.
    pub(super) fn caps(&self) -> Caps {
        Caps {
            total: self.max_connections.max(1),
            unauthenticated: self.unauthenticated(),
            per_address: self.max_unauthenticated_per_address,
        }
    }
}

/// Answers a connection over the limit with a 503 and closes it, without waiting on it: a
/// fresh socket's send buffer takes the small answer whole, and whatever the client already
/// sent is read off first (up to 64 KiB) so that the close is a FIN after the answer rather
/// than a reset that could discard it.
pub(super) fn refuse(stream: TcpStream) {
    let _ = stream.try_write(&over_limit_response());
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        match stream.try_read(&mut sink) {
            Ok(n) if n > 0 => continue,
            _ => break,
        }
    }
}

/// The response an over-limit connection gets before it is closed.
fn over_limit_response() -> Vec<u8> {
    let body = serde_json::to_string(&crate::wire::ErrorBody::new(
        "too_many_connections",
        "kernelbox has as many connections open as it allows; retry later",
    ))
    .unwrap_or_default();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Where a connection stands, for its deadline.
#[derive(Debug)]
struct Clock {
    /// Requests whose responses are not yet fully sent.
    in_flight: usize,
    /// Whether a response has been sent (the connection is past its first request).
    served: bool,
    /// When the current wait for a request began (the accept, or the last response).
    waiting_since: Instant,
    /// When the first byte of the next request arrived, on a connection past its first.
    head_started: Option<Instant>,
    /// Whether bytes of a request head have arrived and its request has not started yet.
    head_bytes: bool,
    /// When the head of the request whose body is still arriving was read.
    body_since: Option<Instant>,
    /// Since when a write to the client has been waiting for room in the socket.
    write_blocked_since: Option<Instant>,
}

/// A connection's clock, shared by its IO, its service and its driver.
#[derive(Debug)]
struct ConnState {
    clock: Mutex<Clock>,
    changed: Notify,
    limits: Limits,
    /// The connection's slot, told when the connection may give it up (`slots.rs`).
    slot: Promote,
}

impl ConnState {
    fn new(limits: Limits, slot: Promote) -> ConnState {
        ConnState {
            clock: Mutex::new(Clock {
                in_flight: 0,
                served: false,
                waiting_since: Instant::now(),
                head_started: None,
                head_bytes: false,
                body_since: None,
                write_blocked_since: None,
            }),
            changed: Notify::new(),
            limits,
            slot,
        }
    }

    /// Tells the slot books what the connection is doing (`slots.rs`, `Doing`): who gives way
    /// first to a newer connection, and who never.
    fn note_evictable(&self, clock: &Clock) {
        self.slot.set_doing(if clock.write_blocked_since.is_some() {
            Doing::Idle
        } else if clock.in_flight > 0 {
            Doing::Busy
        } else if clock.head_bytes {
            Doing::Stalled
        } else if clock.served {
            Doing::Idle
        } else {
            Doing::Silent
        });
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, Clock> {
        self.clock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the connection is to be closed: unless a request starts, a request's body
    /// arrives, or a blocked write to the client progresses. `None` while none applies.
    fn deadline(&self) -> Option<Instant> {
        let clock = self.clock();
        let sending = clock
            .write_blocked_since
            .map(|at| at + self.limits.send_timeout);
        let waiting = if clock.in_flight > 0 {
            clock.body_since.map(|at| at + self.limits.body_timeout)
        } else {
            Some(match (clock.served, clock.head_started) {
                (false, _) => {
                    clock.waiting_since
                        + self
                            .limits
                            .first_header_timeout
                            .min(self.limits.header_timeout)
                }
                (true, Some(head)) => head + self.limits.header_timeout,
                (true, None) => clock.waiting_since + self.limits.keepalive_timeout,
            })
        };
        match (sending, waiting) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Notes whether the last write to the client had to wait for room in the socket.
    fn write_polled<T>(&self, polled: &Poll<T>) {
        let mut clock = self.clock();
        match (polled.is_pending(), clock.write_blocked_since.is_some()) {
            (true, false) => clock.write_blocked_since = Some(Instant::now()),
            (false, true) => clock.write_blocked_since = None,
            _ => return,
        }
        self.note_evictable(&clock);
        drop(clock);
        self.changed.notify_one();
    }

    fn bytes_read(&self) {
        let mut clock = self.clock();
        if clock.in_flight == 0 {
            // Told to the slot books only once the read finds no more (`read_waiting`): a
            // head that arrived whole starts its request first.
            clock.head_bytes = true;
        }
        if clock.in_flight == 0 && clock.served && clock.head_started.is_none() {
            clock.head_started = Some(Instant::now());
            drop(clock);
            self.changed.notify_one();
        }
    }

    /// A read found nothing more to read: a head begun and not finished is being withheld.
    fn read_waiting(&self) {
        let clock = self.clock();
        if clock.in_flight == 0 && clock.head_bytes {
            self.note_evictable(&clock);
        }
    }

    fn request_started(self: &Arc<Self>, body_pending: bool) -> (InFlight, Option<BodyPending>) {
        let mut clock = self.clock();
        clock.in_flight += 1;
        clock.head_bytes = false;
        let body = body_pending.then(|| {
            clock.body_since = Some(Instant::now());
            BodyPending(self.clone())
        });
        self.note_evictable(&clock);
        drop(clock);
        // The deadline moved (to the body's, or none).
        self.changed.notify_one();
        (InFlight(self.clone()), body)
    }
}

/// Held while a request's body is still arriving.
struct BodyPending(Arc<ConnState>);

impl Drop for BodyPending {
    fn drop(&mut self) {
        self.0.clock().body_since = None;
        self.0.changed.notify_one();
    }
}

/// A request body that notes when it has arrived in full (or is no longer wanted).
struct WatchedBody {
    inner: Incoming,
    pending: Option<BodyPending>,
}

impl hyper::body::Body for WatchedBody {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) || self.inner.is_end_stream() {
            self.pending = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Held while a request is in flight: from the parsed head until its response body is sent
/// or dropped.
struct InFlight(Arc<ConnState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        {
            let mut clock = self.0.clock();
            clock.in_flight = clock.in_flight.saturating_sub(1);
            if clock.in_flight == 0 {
                clock.served = true;
                clock.waiting_since = Instant::now();
                clock.head_started = None;
            }
            self.0.note_evictable(&clock);
        }
        self.0.changed.notify_one();
    }
}

/// The TCP stream, noting when bytes arrive.
struct Tracked {
    stream: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.state.bytes_read();
        } else if polled.is_pending() {
            self.state.read_waiting();
        }
        polled
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.state.write_polled(&polled);
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.state.write_polled(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.state.write_polled(&polled);
        polled
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Everything one connection needs from the server.
pub(super) struct Conn {
    pub stream: TcpStream,
    pub app: Router,
    pub limits: Limits,
    /// Signals the drain: hyper then closes the connection at once when no request is
    /// under way, or after the one in flight.
    pub watcher: Watcher,
    /// Cancelled when the server stops for good: the connection closes whatever it does.
    pub stop: CancellationToken,
    /// The connection's slot, released once it is closed.
    pub slot: Slot,
}

/// Serves one connection until the client closes it, a deadline passes, or the server stops.
pub(super) async fn drive(conn: Conn) {
    let Conn {
        stream,
        app,
        limits,
        watcher,
        stop,
        slot,
    } = conn;
    // `slot` is bound before everything below, so it is released last: after the socket is
    // closed.
    let _ = stream.set_nodelay(true);
    // A second handle on the socket, for the lingering close: hyper's is closed when the
    // connection ends, this one keeps the socket open while the rest is read off.
    let (stream, linger) = match duplicate(stream) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(error = %e, "a connection's socket could not be duplicated");
            return;
        }
    };
    if serve(stream, app, limits, watcher, &stop, &slot).await {
        tokio::select! {
            _ = lingering_close(linger) => {}
            _ = stop.cancelled() => {}
        }
    }
}

/// The stream, and a second handle on its socket (not registered with the runtime).
fn duplicate(stream: TcpStream) -> std::io::Result<(TcpStream, std::net::TcpStream)> {
    let std = stream.into_std()?;
    let dup = std.try_clone()?;
    Ok((TcpStream::from_std(std)?, dup))
}

/// Reads off what the client still sends (at most [`LINGER_BYTES`], for at most
/// [`LINGER_TIME`]) after the server's side is shut, so the socket closes with nothing
/// unread.
async fn lingering_close(socket: std::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let _ = socket.shutdown(std::net::Shutdown::Write);
    let Ok(mut socket) = TcpStream::from_std(socket) else {
        return;
    };
    let mut sink = vec![0u8; 16 * 1024];
    let mut read = 0;
    let _ = tokio::time::timeout(LINGER_TIME, async {
        while read < LINGER_BYTES {
            match socket.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    })
    .await;
}

/// The answer to a request that arrived on a connection whose slot was given away: 503
/// `connection_evicted`, close (the connection is being closed; the request did not run;
/// docs/http-api.md, "Slow and idle clients cannot hold the server").
fn evicted_response() -> Response<Body> {
    let mut response = Response::new(Body::from(
        r#"{"error":{"code":"connection_evicted","message":"this connection's slot was given to a newer one; the request did not run: retry it on a new connection"}}"#,
    ));
    *response.status_mut() = axum::http::StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    headers.insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from_static("1"),
    );
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Serves the connection; true when hyper ended it (the client closed, or hyper closed after
/// an answer), false when it was cut (a deadline, an eviction, the server's stop): only the
/// former lingers.
async fn serve(
    stream: TcpStream,
    app: Router,
    limits: Limits,
    watcher: Watcher,
    stop: &CancellationToken,
    slot: &Slot,
) -> bool {
    let state = Arc::new(ConnState::new(limits, slot.promote()));
    let io = TokioIo::new(Tracked {
        stream,
        state: state.clone(),
    });
    let router = TowerToHyperService::new(app);
    let service = {
        let state = state.clone();
        let promote = slot.promote();
        hyper::service::service_fn(move |request: Request<Incoming>| {
            let body_pending = !hyper::body::Body::is_end_stream(request.body());
            // A connection whose slot a newer one took (its head was on its way) is being
            // closed: its request must not run unanswered (`slots.rs`, `begin_request`).
            let admitted = promote.begin_request();
            let (guard, pending) = state.request_started(body_pending);
            let mut request = request.map(|inner| WatchedBody { inner, pending });
            // The API's authentication promotes the connection with it (`slots.rs`).
            request.extensions_mut().insert(promote.clone());
            let call = admitted.then(|| hyper::service::Service::call(&router, request));
            async move {
                let response: Response<Body> = match call {
                    Some(call) => call.await?,
                    None => evicted_response(),
                };
                // The request stays in flight until its body is sent (or dropped).
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    Body::new(body.map_err(move |e| {
                        let _in_flight = &guard;
                        e
                    }))
                }))
            }
        })
    };
    let connection = hyper::server::conn::http1::Builder::new()
        // Deadlines are kept by this driver (see the module documentation).
        .header_read_timeout(None)
        .serve_connection(io, service);
    let connection = watcher.watch(connection);
    tokio::pin!(connection);
    loop {
        let deadline = state.deadline();
        tokio::select! {
            result = &mut connection => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return true;
            }
            _ = stop.cancelled() => return false,
            _ = slot.evicted().cancelled() => {
                tracing::debug!("closing an unauthenticated connection whose slot a newer one took");
                return false;
            }
            _ = state.changed.notified() => {}
            _ = sleep_until(deadline) => {
                if state.deadline().is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!("closing a connection past its header, body, send or keep-alive deadline");
                    return false;
                }
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
