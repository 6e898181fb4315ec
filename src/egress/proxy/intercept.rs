//! A CONNECT tunnel to a host a credential rule names (`docs/reliability.md`, "Credentials at
//! the boundary"): TLS ended with a leaf of the kernelbox CA, TLS begun again to the real host
//! verified against the CA bundle, and every request of the connection checked (its Host and
//! any absolute URI must name the tunnel's host) and given the rule's headers. Nothing here
//! logs a header, a body or a secret.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use super::finish::Finish;
use super::interception::Interception;
use super::limits::{idle, Metered, MAX_HEAD_BYTES, STEP_TIMEOUT, TUNNEL_IDLE_TIMEOUT};
use super::outcome::{refusal_message, text, Body, Outcome};
use http_body_util::BodyExt;

/// A stream whose first bytes (the ClientHello the proxy already read) are given back first.
pub(super) struct Prefixed<S> {
    prefix: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub(super) fn new(prefix: Vec<u8>, inner: S) -> Self {
        Prefixed {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.at < self.prefix.len() {
            let n = (self.prefix.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.prefix[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Incoming>;

/// The upstream's TLS begun and an HTTP/1 connection over it, driven until it ends or the
/// kernel's connection is cancelled; `None` when the destination's certificate is not
/// trusted by the bundle (or it answered no TLS): the kernel is told so on its first
/// request.
async fn upstream_sender(
    interception: &Interception,
    name: rustls::pki_types::ServerName<'static>,
    upstream: Metered<TcpStream>,
    done: &Finish,
) -> Option<Arc<Mutex<Sender>>> {
    let connector = tokio_rustls::TlsConnector::from(interception.upstream.clone());
    let tls = match tokio::time::timeout(STEP_TIMEOUT, connector.connect(name, upstream)).await {
        Ok(Ok(tls)) => tls,
        _ => return None,
    };
    let handshake = hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(tls));
    let Ok(Ok((sender, conn))) = tokio::time::timeout(STEP_TIMEOUT, handshake).await else {
        return None;
    };
    let cancel = done._live.cancel.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = conn => {}
        }
    });
    Some(Arc::new(Mutex::new(sender)))
}

/// Ends the kernel's TLS, begins the upstream's, and serves the connection's requests until
/// either side ends, the kernel goes or the policy no longer allows it.
pub(super) async fn intercept<S>(
    interception: Arc<Interception>,
    client: S,
    upstream: Metered<TcpStream>,
    done: Finish,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let leaf = match interception.ca.leaf(&done.host) {
        Ok(leaf) => leaf,
        Err(e) => {
            tracing::warn!(host = %done.host, error = %e, "egress interception");
            return done.fail(Outcome::KernelTls);
        }
    };
    let client = match tokio::time::timeout(
        STEP_TIMEOUT,
        tokio_rustls::TlsAcceptor::from(leaf).accept(client),
    )
    .await
    {
        Ok(Ok(tls)) => tls,
        _ => return done.fail(Outcome::KernelTls),
    };
    let name = match rustls::pki_types::ServerName::try_from(done.host.clone()) {
        Ok(name) => name,
        Err(_) => return done.fail(Outcome::BadRequest),
    };
    let sender = upstream_sender(&interception, name, upstream, &done).await;
    if sender.is_none() {
        done.fail(Outcome::UpstreamTls);
    }
    let done = Arc::new(done);
    let cancel: CancellationToken = done._live.cancel.clone();
    let service = {
        let done = done.clone();
        let interception = interception.clone();
        hyper::service::service_fn(move |req| {
            let done = done.clone();
            let interception = interception.clone();
            let sender = sender.clone();
            async move { Ok::<_, Infallible>(request(req, &interception, sender, &done).await) }
        })
    };
    let conn = hyper::server::conn::http1::Builder::new()
        .max_buf_size(MAX_HEAD_BYTES.max(8192))
        .timer(TokioTimer::new())
        .header_read_timeout(STEP_TIMEOUT)
        .serve_connection(TokioIo::new(client), service);
    tokio::select! {
        _ = cancel.cancelled() => {
            if !done.entry.cancel.is_cancelled() {
                done.fail(Outcome::PolicyChanged);
            }
        }
        _ = idle(&done.bytes.bytes_in, &done.bytes.bytes_out, TUNNEL_IDLE_TIMEOUT) => {}
        _ = conn => {}
    }
}

/// True when `authority` names `host` (and `port`, or no port when it is 443), without
/// userinfo (`other@host` could name `other` to a lenient destination).
fn names(authority: &str, host: &str, port: u16) -> bool {
    if authority.contains('@') {
        return false;
    }
    match authority.parse::<hyper::http::uri::Authority>() {
        Ok(a) => a.host().eq_ignore_ascii_case(host) && a.port_u16().unwrap_or(443) == port,
        Err(_) => false,
    }
}

/// One request of an intercepted connection: checked, given the rule's headers, sent on.
async fn request(
    req: Request<Incoming>,
    interception: &Interception,
    sender: Option<Arc<Mutex<Sender>>>,
    done: &Finish,
) -> Response<Body> {
    let refuse = |status: StatusCode, outcome: Outcome| {
        done.table.count(&done.entry.tenant, |c| {
            *c.refusals.entry(outcome.name()).or_default() += 1
        });
        let name = outcome.name();
        let (entry, host) = (&done.entry, &done.host);
        done.table
            .refusals
            .push(&entry.tenant, &entry.session, host, done.port, name);
        let mut r = text(status, refusal_message(&done.host, done.port, outcome));
        r.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
        r
    };
    let Some(sender) = sender else {
        return refuse(StatusCode::BAD_GATEWAY, Outcome::UpstreamTls);
    };
    // The Host header (and an absolute URI's authority) must name the tunnel's host: a request
    // meant for another host never gets this host's headers.
    // Exactly one Host: a second one could reach the destination unchecked.
    let mut hosts = req.headers().get_all(hyper::header::HOST).iter();
    let host_ok = match (hosts.next(), hosts.next()) {
        (Some(h), None) => h
            .to_str()
            .ok()
            .is_some_and(|h| names(h, &done.host, done.port)),
        _ => false,
    };
    let uri_ok = req.uri().authority().is_none_or(|a| {
        names(a.as_str(), &done.host, done.port) && req.uri().scheme_str() == Some("https")
    });
    if !host_ok || !uri_ok {
        return refuse(StatusCode::MISDIRECTED_REQUEST, Outcome::Mismatch);
    }
    let Some(headers) = interception.secrets.load().headers(
        &done.entry.tenant,
        &done.entry.session,
        &done.host,
        done.port,
    ) else {
        return refuse(StatusCode::FORBIDDEN, Outcome::Placeholder);
    };
    let (mut parts, body) = req.into_parts();
    if !super::http::to_origin_form(&mut parts) {
        return refuse(StatusCode::BAD_REQUEST, Outcome::BadRequest);
    }
    for (name, value) in headers {
        parts.headers.insert(name, value);
    }
    let mut sender = sender.lock().await;
    if sender.ready().await.is_err() {
        return refuse(StatusCode::BAD_GATEWAY, Outcome::ConnectFailed);
    }
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(response) => response.map(|b| b.boxed()),
        Err(_) => refuse(StatusCode::BAD_GATEWAY, Outcome::ConnectFailed),
    }
}
