//! A plain HTTP request forwarded to its destination.

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::super::secrets::carries_placeholder;
use super::finish::Finish;
use super::limits::{idle, Metered, STEP_TIMEOUT, TUNNEL_IDLE_TIMEOUT};
use super::outcome::{refusal_message, text, Body, Outcome};

/// A plain HTTP request sent on to the destination (origin-form, without the proxy's headers),
/// its response streamed back.
pub(super) async fn forward(
    req: Request<Incoming>,
    upstream: Metered<TcpStream>,
    done: Finish,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    if !to_origin_form(&mut parts) {
        return text(StatusCode::BAD_REQUEST, "bad path".into());
    }
    // No credential rule ever names a plain HTTP host: a placeholder here is a misconfiguration
    // (`docs/reliability.md`, "Credentials at the boundary").
    if carries_placeholder(parts.uri.to_string().as_bytes())
        || parts
            .headers
            .values()
            .any(|v| carries_placeholder(v.as_bytes()))
    {
        done.fail(Outcome::Placeholder);
        return text(
            StatusCode::FORBIDDEN,
            refusal_message(&done.host, done.port, Outcome::Placeholder),
        );
    }
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
    // The upstream connection holds the kernel connection's permits (`finish.rs`) until it
    // ends, the policy no longer allows it, or nothing moves for `TUNNEL_IDLE_TIMEOUT`.
    let cancel = done._live.cancel.clone();
    tokio::spawn(async move {
        let done = done;
        tokio::select! {
            _ = cancel.cancelled() => {
                if !done.entry.cancel.is_cancelled() {
                    done.fail(Outcome::PolicyChanged);
                }
            }
            _ = idle(&done.bytes.bytes_in, &done.bytes.bytes_out, TUNNEL_IDLE_TIMEOUT) => {}
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

/// Rewrites a request forwarded upstream to origin form (the URI's path and query only) and
/// drops the proxy's and the hop's own headers; false when the path does not parse. Shared by
/// plain HTTP and intercepted TLS (`intercept.rs`).
pub(super) fn to_origin_form(parts: &mut hyper::http::request::Parts) -> bool {
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    match path.parse() {
        Ok(uri) => parts.uri = uri,
        Err(_) => return false,
    }
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
    true
}
