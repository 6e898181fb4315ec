//! Accepting kernels' connections and answering their requests: the credential, the
//! destination judged and resolved, then a CONNECT tunnel or a forwarded plain HTTP request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::connect::tunnel;
use super::finish::{audit, Finish, Permits};
use super::http::forward;
use super::limits::{Limits, Metered, MAX_HEAD_BYTES, STEP_TIMEOUT};
use super::outcome::{refusal_message, text, Body, Outcome};
use super::resolve::judge;
use super::table::{ConnBytes, KernelEntry, Table};

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
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                if !is_connection_error(&e) {
                    // Out of descriptors or similar: back off briefly instead of spinning, as
                    // the API listener does (`src/server/mod.rs`).
                    tracing::warn!(error = %e, "egress proxy: accepting a connection failed");
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    }
                }
                continue;
            }
        };
        // Past the total, a connection is closed at once: memory stays bounded.
        let Ok(permit) = total.clone().try_acquire_owned() else {
            continue;
        };
        let Some(entry) = table.lookup(peer.ip()) else {
            continue;
        };
        let table = table.clone();
        tokio::spawn(connection(stream, peer, entry, table, permit));
    }
}

/// How long the accept loop waits after an error that is not one connection's.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Errors that concern one connection only, not the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    entry: Arc<KernelEntry>,
    table: Arc<Table>,
    total: OwnedSemaphorePermit,
) {
    let Ok(kernel) = entry.connections.clone().try_acquire_owned() else {
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
    // Held by this connection and by whatever it becomes (a tunnel, an upstream connection):
    // a tunnel keeps both permits for its whole life.
    let permits = Arc::new(Permits {
        _total: total,
        _kernel: kernel,
    });
    let cancel = entry.cancel.clone();
    let service = {
        let entry = entry.clone();
        let table = table.clone();
        hyper::service::service_fn(move |req| {
            let entry = entry.clone();
            let table = table.clone();
            let permits = permits.clone();
            async move { Ok::<_, Infallible>(handle(req, entry, table, permits).await) }
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

/// True when the request's `Host` header, if any, names the request's own `host` and `port`:
/// at most one `Host` (a second one could reach the destination unjudged); for plain HTTP the
/// port is the header's or 80; for CONNECT the header may leave the port out.
fn host_header_agrees(req: &Request<Incoming>, connect: bool, host: &str, port: u16) -> bool {
    let mut all = req.headers().get_all(hyper::header::HOST).iter();
    let (Some(h), None) = (all.next(), all.next()) else {
        // None at all is fine (HTTP/1.0, CONNECT); more than one never is.
        return req.headers().get(hyper::header::HOST).is_none();
    };
    // A Host is `host[:port]`: userinfo (`evil.example@host`) is refused, as a lenient
    // destination could route by the part the proxy did not judge.
    let Some(authority) = h
        .to_str()
        .ok()
        .filter(|h| !h.contains('@'))
        .and_then(|h| h.parse::<hyper::http::uri::Authority>().ok())
    else {
        return false;
    };
    if connect && authority.port_u16().is_none() {
        return authority.host().eq_ignore_ascii_case(host);
    }
    split_authority(&authority, 80) == (host.to_string(), port)
}

fn split_authority(authority: &hyper::http::uri::Authority, default_port: u16) -> (String, u16) {
    let host = authority.host().to_ascii_lowercase();
    (host, authority.port_u16().unwrap_or(default_port))
}

/// Refuses a request: counted and audited under `outcome`, answered with its status and
/// message (`407` with the realm for a missing credential).
fn refused(
    table: &Table,
    entry: &KernelEntry,
    host: &str,
    port: u16,
    outcome: Outcome,
) -> Response<Body> {
    table.count(&entry.tenant, |c| {
        *c.refusals.entry(outcome.name()).or_default() += 1
    });
    audit(table, entry, host, port, 0, 0, Err(outcome));
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
}

/// The destination a request names (a CONNECT's authority, or a plain `http://` URL's), from
/// the kernel it claims to be and agreeing with its `Host`; else what is wrong, and where.
fn destination(
    req: &Request<Incoming>,
    entry: &KernelEntry,
    connect: bool,
) -> Result<(String, u16), (String, u16, Outcome)> {
    let Some(authority) = req.uri().authority().cloned() else {
        return Err(("-".into(), 0, Outcome::BadRequest));
    };
    if !connect && req.uri().scheme_str() != Some("http") {
        return Err(("-".into(), 0, Outcome::BadRequest));
    }
    let (host, port) = split_authority(&authority, if connect { 443 } else { 80 });
    if !authorised(req, entry) {
        return Err((host, port, Outcome::Unauthenticated));
    }
    if !host_header_agrees(req, connect, &host, port) {
        return Err((host, port, Outcome::Mismatch));
    }
    Ok((host, port))
}

async fn handle(
    req: Request<Incoming>,
    entry: Arc<KernelEntry>,
    table: Arc<Table>,
    permits: Arc<Permits>,
) -> Response<Body> {
    let refuse =
        |host: &str, port: u16, outcome: Outcome| refused(&table, &entry, host, port, outcome);
    let connect = req.method() == Method::CONNECT;
    let (host, port) = match destination(&req, &entry, connect) {
        Ok(destination) => destination,
        Err((host, port, outcome)) => return refuse(&host, port, outcome),
    };
    let grant = entry.grant();
    let judged = match judge(&table, &entry.tenant, &grant, &host, port).await {
        Ok(judged) => judged,
        Err(outcome) => return refuse(&host, port, outcome),
    };
    let addr = judged.addr;
    let upstream = match tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => s,
        _ => return refuse(&host, port, Outcome::ConnectFailed),
    };
    let bytes = Arc::new(ConnBytes::default());
    let live = entry.enter(&host, port, addr.ip(), judged.special, bytes.clone());
    // The policy may have changed while the destination was resolved and connected: judged
    // again now that the connection is live (a change from here on closes it, as any).
    let grant = entry.grant();
    let still = grant.check_name(&host, port).is_ok()
        && grant
            .check_address(&host, port, addr.ip(), judged.special)
            .is_ok();
    if !still {
        return refuse(&host, port, Outcome::PolicyChanged);
    }
    let upstream = Metered {
        inner: upstream,
        bucket: entry.bucket.clone(),
        sleep: None,
        bytes_in: bytes.bytes_in.clone(),
        bytes_out: bytes.bytes_out.clone(),
    };
    let done = Finish {
        entry: entry.clone(),
        table: table.clone(),
        host: host.clone(),
        port,
        bytes,
        outcome: Mutex::new(Ok(())),
        _live: live,
        _permits: permits,
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
