//! A CONNECT tunnel: the TLS ClientHello's server name must be the CONNECT host, then bytes
//! are copied as they are, unless a credential rule names the host (`intercept.rs`).

use std::net::IpAddr;

use hyper::body::Incoming;
use hyper::Request;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::super::sni::{self, Hello};
use super::finish::Finish;
use super::intercept::{intercept, Prefixed};
use super::limits::{idle, Metered, HELLO_TIMEOUT, TUNNEL_IDLE_TIMEOUT};
use super::outcome::Outcome;

/// Reads a ClientHello into `hello`: its server name, if any. Unbounded in time: the caller
/// gives the whole hello one deadline.
async fn read_hello<S: AsyncRead + Unpin>(
    client: &mut S,
    hello: &mut Vec<u8>,
) -> Result<Option<String>, Outcome> {
    let mut chunk = [0u8; 4096];
    loop {
        match sni::parse(hello) {
            Hello::ClientHello(name) => return Ok(name),
            Hello::NotTls => return Err(Outcome::NotTls),
            Hello::Incomplete(_) if hello.len() >= sni::MAX_CLIENT_HELLO => {
                return Err(Outcome::NotTls)
            }
            Hello::Incomplete(need) => {
                let want = need.saturating_sub(hello.len()).min(chunk.len());
                match client.read(&mut chunk[..want]).await {
                    Ok(n) if n > 0 => hello.extend_from_slice(&chunk[..n]),
                    _ => return Err(Outcome::NotTls),
                }
            }
        }
    }
}

/// A CONNECT tunnel once answered 200: the ClientHello read (all of it within
/// [`HELLO_TIMEOUT`]) and judged, then bytes copied both ways until either side ends, the
/// kernel goes, the policy no longer allows it or nothing moves for [`TUNNEL_IDLE_TIMEOUT`].
/// `done` holds the connection's permits (`finish.rs`) until then.
pub(super) async fn tunnel(req: Request<Incoming>, mut upstream: Metered<TcpStream>, done: Finish) {
    // One deadline for the upgrade and the whole hello, not one per read: a hello trickled a
    // byte at a time is cut at it.
    let deadline = tokio::time::Instant::now() + HELLO_TIMEOUT;
    let Ok(Ok(upgraded)) = tokio::time::timeout_at(deadline, hyper::upgrade::on(req)).await else {
        return;
    };
    let mut client = TokioIo::new(upgraded);
    let mut hello = Vec::with_capacity(1024);
    // A policy change (or the kernel's end) closes a tunnel still waiting for its ClientHello
    // too, at once.
    let cancel = done._live.cancel.clone();
    let server_name = tokio::select! {
        _ = cancel.cancelled() => {
            if !done.entry.cancel.is_cancelled() {
                done.fail(Outcome::PolicyChanged);
            }
            return;
        }
        read = tokio::time::timeout_at(deadline, read_hello(&mut client, &mut hello)) => match read {
            Ok(Ok(name)) => name,
            Ok(Err(outcome)) => return done.fail(outcome),
            // Not all of a ClientHello in time.
            Err(_) => return done.fail(Outcome::NotTls),
        },
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
    let interception = done.table.interception.clone().filter(|i| {
        i.secrets.load().has_rule(
            &done.entry.tenant,
            &done.entry.session,
            &done.host,
            done.port,
        )
    });
    if let Some(interception) = interception {
        return intercept(interception, Prefixed::new(hello, client), upstream, done).await;
    }
    if upstream.write_all(&hello).await.is_err() {
        return done.fail(Outcome::ConnectFailed);
    }
    tokio::select! {
        _ = cancel.cancelled() => {
            if !done.entry.cancel.is_cancelled() {
                done.fail(Outcome::PolicyChanged);
            }
        }
        _ = idle(&done.bytes.bytes_in, &done.bytes.bytes_out, TUNNEL_IDLE_TIMEOUT) => {}
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
    }
}
