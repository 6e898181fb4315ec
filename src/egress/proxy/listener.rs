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
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::connect::tunnel;
use super::finish::{audit, Finish};
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
