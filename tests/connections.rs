//! Connection bounds of the HTTP server, on the wire against the real server and engine:
//! a client sending its headers or its body slowly, one sending nothing, one idling on
//! keep-alive, and clients beyond `max_connections` cannot hold the server; a long cell, streamed or not, is
//! never cut by those timeouts; `/metrics` can live on a listener of its own (the real
//! `kernelbox serve` binary).
//!
//! Each test labels what it creates with a unique `io.kernelbox-test.case` and ends by
//! asserting through the Docker API that nothing with that label is left.

mod common;
#[path = "common/raw.rs"]
mod raw;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use kernelbox::docker::Engine;
use kernelbox::server::{self, AppState, Limits, ServeOptions, Tenant, Tenants};
use kernelbox::Orchestrator;

const TOKEN: &str = "tok-conn";

/// A server running in this process on 127.0.0.1:0 with the given limits.
struct Server {
    addr: SocketAddr,
    label: String,
    engine: Arc<dyn Engine>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    async fn start(name: &str, limits: Limits) -> Server {
        let label = common::unique(&format!("conn-{name}"));
        let engine = common::engine().await;
        let orchestrator = Orchestrator::start(common::config(&label), engine.clone())
            .await
            .expect("orchestrator starts");
        let tenants = Tenants::new(vec![Tenant::with_token("acme", TOKEN)]).expect("valid tenants");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server::serve_with(
            listener,
            AppState::new(orchestrator, tenants),
            shutdown.clone(),
            ServeOptions {
                drain: Duration::from_secs(10),
                limits,
                metrics: None,
                public_metrics: false,
                e2b: None,
                console: false,
            },
        ));
        Server {
            addr,
            label,
            engine,
            shutdown,
            task,
        }
    }

    /// Stops the server (the SIGTERM path) and asserts nothing of this case is left.
    async fn finish(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the server stops")
            .expect("server task")
            .expect("server ran cleanly");
        common::assert_clean(&self.engine, &self.label).await;
    }
}

fn limits(header: u64, keepalive: u64, body: u64, max_connections: usize) -> Limits {
    Limits {
        header_timeout: Duration::from_secs(header),
        keepalive_timeout: Duration::from_secs(keepalive),
        body_timeout: Duration::from_secs(body),
        max_connections,
        ..Limits::default()
    }
}

/// Sends `head` a byte at a time, 100 ms apart, then header bytes forever, until the server
/// hangs up; panics if it answers anything or is still open at the deadline.
async fn trickle_until_closed(stream: &mut tokio::net::TcpStream, head: &[u8]) {
    let deadline = Instant::now() + raw::DEADLINE;
    let mut buf = [0u8; 1024];
    for i in 0.. {
        assert!(
            Instant::now() < deadline,
            "a slow client still holds its connection at the deadline"
        );
        let byte = head.get(i).copied().unwrap_or(b'a');
        if stream.write_all(&[byte]).await.is_err() {
            return;
        }
        // The pause is the slowness under test; a close is noticed during it.
        match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(n)) => panic!(
                "the server answered a request it never got: {:?}",
                String::from_utf8_lossy(&buf[..n])
            ),
            Err(_) => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_sending_headers_slowly_or_nothing_are_disconnected() {
    let srv = Server::start("slow", limits(1, 300, 300, 16)).await;

    // Headers one byte at a time, never finished.
    let mut slow = raw::connect(srv.addr).await;
    trickle_until_closed(
        &mut slow,
        b"GET /healthz HTTP/1.1\r\nHost: kernelbox\r\nX-Slow: ",
    )
    .await;

    // Connects and sends nothing.
    let mut silent = raw::connect(srv.addr).await;
    let seen = raw::until_closed(&mut silent)
        .await
        .expect("a silent client is disconnected");
    assert!(seen.is_empty(), "{:?}", String::from_utf8_lossy(&seen));

    // On a kept-alive connection, the next request's head is bounded the same way.
    let mut kept = raw::connect(srv.addr).await;
    kept.write_all(&raw::request("GET", "/healthz", None, b"", false))
        .await
        .expect("send");
    assert_eq!(raw::read_response(&mut kept).await.status, 200);
    trickle_until_closed(&mut kept, b"GET /healthz HTTP/1.1\r\n").await;

    // Well-behaved clients are still served.
    assert_eq!(raw::get(srv.addr, "/healthz").await.status, 200);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn clients_sending_a_body_slowly_or_not_at_all_are_disconnected() {
    let srv = Server::start("body", limits(300, 300, 1, 16)).await;
    let head = |len: usize| {
        format!(
            "POST /v1/sessions/body/execute HTTP/1.1\r\nHost: kernelbox\r\n\
             Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n\
             Content-Length: {len}\r\n\r\n"
        )
    };

    // Part of the body, then nothing.
    let mut stalled = raw::connect(srv.addr).await;
    stalled
        .write_all(format!("{}{{\"code\": \"pr", head(100)).as_bytes())
        .await
        .expect("send");
    let seen = raw::until_closed(&mut stalled)
        .await
        .expect("a stalled body is cut off");
    assert!(seen.is_empty(), "{:?}", String::from_utf8_lossy(&seen));

    // A body trickled a byte at a time, never finished.
    let mut slow = raw::connect(srv.addr).await;
    slow.write_all(head(1_000_000).as_bytes())
        .await
        .expect("send");
    trickle_until_closed(&mut slow, b"{\"code\": \"").await;

    assert!(
        common::containers(&srv.engine, &srv.label).await.is_empty(),
        "no cell ran"
    );
    let reply = raw::post(
        srv.addr,
        "/v1/sessions/body/execute",
        TOKEN,
        b"{\"code\": \"print(2)\"}",
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["output"], "2\n");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_keepalive_connection_is_closed_after_the_keepalive_timeout() {
    // Keep-alive shorter than the header timeout: only the idle rule can close it here.
    let srv = Server::start("idle", limits(300, 1, 300, 16)).await;
    let mut conn = raw::connect(srv.addr).await;
    for _ in 0..2 {
        conn.write_all(&raw::request("GET", "/healthz", None, b"", false))
            .await
            .expect("send");
        let reply = raw::read_response(&mut conn).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let seen = raw::until_closed(&mut conn)
        .await
        .expect("an idle keep-alive connection is closed");
    assert!(seen.is_empty(), "{:?}", String::from_utf8_lossy(&seen));
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_keepalive_connection_outlives_the_header_timeout() {
    // Header timeout 1 s, keep-alive 300 s: hyper's own header timeout would close the idle
    // connection with the header timeout; here only a half-sent head is bound by it.
    let srv = Server::start("keep", limits(1, 300, 300, 16)).await;
    let mut kept = raw::connect(srv.addr).await;
    kept.write_all(&raw::request("GET", "/healthz", None, b"", false))
        .await
        .expect("send");
    assert_eq!(raw::read_response(&mut kept).await.status, 200);
    // A connection opened after that response, sending nothing, is closed by the header
    // timeout: the kept-alive one has now been idle longer than the header timeout.
    let mut silent = raw::connect(srv.addr).await;
    raw::until_closed(&mut silent)
        .await
        .expect("a silent client is disconnected");
    kept.write_all(&raw::request("GET", "/healthz", None, b"", false))
        .await
        .expect("send on the kept-alive connection");
    assert_eq!(raw::read_response(&mut kept).await.status, 200);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn past_max_connections_a_client_gets_503_and_is_closed_until_a_slot_frees() {
    let srv = Server::start("limit", limits(300, 300, 300, 2)).await;
    // Two authenticated kept-alive connections hold both slots (an unauthenticated one
    // doing nothing would give its slot to the third).
    let holders = [hold(srv.addr).await, hold(srv.addr).await];
    let reply = raw::get(srv.addr, "/healthz").await;
    let (code, message) = reply.error(503);
    assert_eq!(code, "too_many_connections", "{message}");
    assert!(
        reply.head.to_ascii_lowercase().contains("retry-after: 1"),
        "{}",
        reply.head
    );

    // Once they are gone (the server notices the close), a normal request succeeds.
    drop(holders);
    let deadline = Instant::now() + raw::DEADLINE;
    loop {
        let reply = raw::get(srv.addr, "/healthz").await;
        if reply.status == 200 {
            break;
        }
        assert_eq!(reply.error(503).0, "too_many_connections");
        assert!(Instant::now() < deadline, "no slot freed by the deadline");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = raw::roundtrip(
        srv.addr,
        &raw::request("GET", "/metrics", Some(TOKEN), b"", true),
    )
    .await;
    assert_eq!(metrics.status, 200);
    let rejected = metrics
        .text()
        .lines()
        .find_map(|l| {
            l.strip_prefix("kernelbox_requests_rejected_total{reason=\"connections\"} ")
                .map(|n| n.parse::<u64>().expect("a count"))
        })
        .expect("the connections rejection series");
    assert!(rejected >= 1, "{rejected}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cell_longer_than_every_timeout_completes_streamed_or_not() {
    let srv = Server::start("long", limits(1, 1, 1, 16)).await;
    // Streamed: the response goes quiet for longer than both timeouts between lines.
    let code = "import time\nprint('a', flush=True)\ntime.sleep(2.5)\nprint('b', flush=True)\ntime.sleep(2.5)\nprint('c')";
    let body = serde_json::json!({ "code": code }).to_string();
    let mut request = raw::request(
        "POST",
        "/v1/sessions/long/execute",
        Some(TOKEN),
        body.as_bytes(),
        true,
    );
    let at = request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("head end");
    request.splice(
        at + 2..at + 2,
        b"Accept: application/x-ndjson\r\n".iter().copied(),
    );
    let reply = raw::roundtrip(srv.addr, &request).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let text = reply.text();
    let last: serde_json::Value =
        serde_json::from_str(text.lines().last().expect("a result line")).expect("JSON line");
    assert_eq!(last["event"], "result", "{text}");
    assert_eq!(last["result"]["status"], "success", "{text}");
    assert_eq!(last["result"]["output"], "a\nb\nc\n", "{text}");

    // Not streamed: nothing at all is sent until the cell ends.
    let body = serde_json::json!({"code": "import time\ntime.sleep(3)\nprint('done')"});
    let reply = raw::post(
        srv.addr,
        "/v1/sessions/long/execute",
        TOKEN,
        body.to_string().as_bytes(),
    )
    .await;
    let result = reply.json();
    assert_eq!(reply.status, 200, "{result}");
    assert_eq!(result["status"], "success", "{result}");
    assert_eq!(result["output"], "done\n", "{result}");
    srv.finish().await;
}

/// Reads the binary's stderr until a line containing `marker` followed by `http://ADDR`.
async fn address_after(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
    marker: &str,
) -> SocketAddr {
    loop {
        let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .expect("the server prints its addresses")
            .expect("stderr")
            .expect("the server exited before serving");
        if let Some(rest) = line.split(marker).nth(1) {
            let addr = rest
                .trim_start_matches("http://")
                .split(['/', ' '])
                .next()
                .expect("address");
            return addr.parse().expect("socket address");
        }
    }
}

/// A kept-alive connection that has been served an authenticated request (so it holds a
/// connection slot no newer connection can take), retrying while the slot of a connection
/// that just closed is still being released.
async fn hold(addr: SocketAddr) -> tokio::net::TcpStream {
    let deadline = Instant::now() + raw::DEADLINE;
    loop {
        let mut conn = raw::connect(addr).await;
        conn.write_all(&raw::request("GET", "/v1/kernels", Some(TOKEN), b"", false))
            .await
            .expect("send");
        let reply = raw::read_response(&mut conn).await;
        if reply.status == 200 {
            return conn;
        }
        assert_eq!(reply.error(503).0, "too_many_connections");
        assert!(Instant::now() < deadline, "no slot by the deadline");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_on_a_separate_listener_share_the_connection_limit_and_shutdown() {
    let label = common::unique("conn-metrics");
    let engine = common::engine().await;
    let mut child = common::serve_command(&label, TOKEN)
        .args([
            "--metrics-listen",
            "127.0.0.1:0",
            "--max-connections",
            "2",
            "--header-timeout",
            "300s",
        ])
        .spawn()
        .expect("spawn kernelbox serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let api = address_after(&mut lines, "on http://").await;
    let metrics = address_after(&mut lines, "metrics on ").await;
    assert_ne!(api, metrics);

    let reply = raw::get(api, "/metrics").await;
    assert_eq!(reply.error(404).0, "not_found");
    let reply = raw::get(metrics, "/metrics").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        reply.text().contains("kernelbox_kernels_live "),
        "{}",
        reply.text()
    );
    assert_eq!(
        raw::get(metrics, "/healthz").await.error(404).0,
        "not_found"
    );
    assert_eq!(
        raw::get(metrics, "/v1/kernels").await.error(404).0,
        "not_found"
    );
    assert_eq!(raw::get(api, "/healthz").await.status, 200);

    // Two connections in all: two kept-alive API connections leave none for metrics.
    let kept = [hold(api).await, hold(api).await];
    let reply = raw::get(metrics, "/metrics").await;
    assert_eq!(reply.error(503).0, "too_many_connections");
    drop(kept);
    let deadline = Instant::now() + raw::DEADLINE;
    while raw::get(metrics, "/metrics").await.status != 200 {
        assert!(Instant::now() < deadline, "no slot freed by the deadline");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let status = common::terminate(&mut child, Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0));
    for addr in [api, metrics] {
        assert!(
            tokio::net::TcpStream::connect(addr).await.is_err(),
            "{addr} is closed"
        );
    }
    common::assert_clean(&engine, &label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_request_with_a_body_is_answered_with_connection_close() {
    let srv = Server::start("refused", limits(30, 30, 30, 16)).await;
    let mut conn = raw::connect(srv.addr).await;
    // A wrong token: refused before the 256 KiB body is read.
    let body = vec![b' '; 256 * 1024];
    conn.write_all(&raw::request(
        "POST",
        "/v1/sessions/s/execute",
        Some("wrong"),
        &body,
        false,
    ))
    .await
    .expect("send");
    let reply = raw::read_response(&mut conn).await;
    assert_eq!(reply.status, 401, "{}", reply.text());
    assert!(
        reply
            .head
            .to_ascii_lowercase()
            .contains("connection: close"),
        "a refusal of a request with a body must say the connection closes: {}",
        reply.head
    );
    raw::until_closed(&mut conn)
        .await
        .expect("the server closes the connection it said it would");
    // A refusal without a body keeps the connection.
    let mut kept = raw::connect(srv.addr).await;
    kept.write_all(&raw::request(
        "GET",
        "/v1/kernels",
        Some("wrong"),
        b"",
        false,
    ))
    .await
    .expect("send");
    let reply = raw::read_response(&mut kept).await;
    assert_eq!(reply.status, 401);
    assert!(
        !reply
            .head
            .to_ascii_lowercase()
            .contains("connection: close"),
        "{}",
        reply.head
    );
    srv.finish().await;
}

/// A connection to `addr` from the loopback address `source` (127.0.0.x: every one of them
/// is this host's).
async fn connect_from(source: [u8; 4], addr: SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((source, 0)))
        .expect("bind a loopback source address");
    tokio::time::timeout(raw::DEADLINE, socket.connect(addr))
        .await
        .expect("connect within the deadline")
        .expect("connect")
}

/// Sends one request on `conn` and reads its response.
async fn ask(conn: &mut tokio::net::TcpStream, path: &str, token: Option<&str>) -> raw::Reply {
    conn.write_all(&raw::request("GET", path, token, b"", false))
        .await
        .expect("send");
    raw::read_response(conn).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connections_first_head_has_the_short_deadline_and_later_heads_the_long_one() {
    let srv = Server::start(
        "first-head",
        Limits {
            first_header_timeout: Duration::from_secs(1),
            ..limits(300, 300, 300, 16)
        },
    )
    .await;
    // Half a first head: closed after the first-head deadline, not the header timeout.
    let started = Instant::now();
    let mut slow = raw::connect(srv.addr).await;
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: k")
        .await
        .expect("send");
    let seen = raw::until_closed(&mut slow)
        .await
        .expect("a half-sent first head is cut off");
    assert!(seen.is_empty(), "{:?}", String::from_utf8_lossy(&seen));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    // A later head on a served connection has the header timeout: half of one, then a
    // pause longer than the first-head deadline, then the rest, is answered.
    let mut kept = raw::connect(srv.addr).await;
    assert_eq!(ask(&mut kept, "/healthz", None).await.status, 200);
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: k")
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    kept.write_all(b"ernelbox\r\n\r\n").await.expect("send");
    assert_eq!(raw::read_response(&mut kept).await.status, 200);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_address_holds_at_most_its_share_of_unauthenticated_connections_its_newest_first() {
    let srv = Server::start(
        "per-address",
        Limits {
            max_unauthenticated_per_address: 2,
            ..limits(300, 300, 300, 16)
        },
    )
    .await;
    let flood = [127, 0, 0, 2];
    let mut other = connect_from([127, 0, 0, 3], srv.addr).await;
    let mut silent = [
        connect_from(flood, srv.addr).await,
        connect_from(flood, srv.addr).await,
    ];
    // The third from that address takes the slot of the address's oldest idle one (closed
    // without a response), not another address's older one.
    let mut third = connect_from(flood, srv.addr).await;
    assert_eq!(ask(&mut third, "/healthz", None).await.status, 200);
    let seen = raw::until_closed(&mut silent[0])
        .await
        .expect("the address's oldest idle connection is closed");
    assert!(seen.is_empty(), "{:?}", String::from_utf8_lossy(&seen));
    assert_eq!(ask(&mut other, "/healthz", None).await.status, 200);
    drop(third);

    // An authenticated connection no longer counts against its address's share.
    drop(silent);
    let deadline = Instant::now() + raw::DEADLINE;
    let mut authenticated = loop {
        let mut conn = connect_from(flood, srv.addr).await;
        conn.write_all(&raw::request("GET", "/v1/kernels", Some(TOKEN), b"", false))
            .await
            .expect("send");
        let seen = tokio::time::timeout(raw::DEADLINE, async {
            let mut buf = vec![0u8; 4096];
            let mut seen = Vec::new();
            loop {
                if raw::parse(&seen).is_some() {
                    return seen;
                }
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => return seen,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await
        .expect("an answer");
        match raw::parse(&seen) {
            Some(reply) if reply.status == 200 => break conn,
            _ => {
                // The silent ones' slots are still being released.
                assert!(Instant::now() < deadline, "no room by the deadline");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let mut more = [
        connect_from(flood, srv.addr).await,
        connect_from(flood, srv.addr).await,
    ];
    for conn in &mut more {
        assert_eq!(ask(conn, "/healthz", None).await.status, 200);
    }
    assert_eq!(
        ask(&mut authenticated, "/v1/kernels", Some(TOKEN))
            .await
            .status,
        200
    );
    // The third unauthenticated one pushes out the address's oldest idle one, never the
    // authenticated connection.
    let mut third = connect_from(flood, srv.addr).await;
    assert_eq!(ask(&mut third, "/healthz", None).await.status, 200);
    assert_eq!(
        ask(&mut authenticated, "/v1/kernels", Some(TOKEN))
            .await
            .status,
        200
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_idle_unauthenticated_connection_gives_its_slot_to_a_new_one_an_authenticated_never() {
    // Four slots, of which two for unauthenticated connections.
    let srv = Server::start(
        "give-way",
        Limits {
            max_unauthenticated: Some(2),
            ..limits(300, 300, 300, 4)
        },
    )
    .await;
    let mut tenant = [hold(srv.addr).await, hold(srv.addr).await];
    let mut silent = [
        connect_from([127, 0, 0, 2], srv.addr).await,
        connect_from([127, 0, 0, 2], srv.addr).await,
    ];
    // Every slot is taken; a newcomer is served, and the oldest silent connection is the
    // one closed for it, without a response.
    let mut newcomer = connect_from([127, 0, 0, 3], srv.addr).await;
    assert_eq!(ask(&mut newcomer, "/healthz", None).await.status, 200);
    let seen = raw::until_closed(&mut silent[0])
        .await
        .expect("the oldest silent connection is closed");
    assert!(seen.is_empty(), "{:?}", String::from_utf8_lossy(&seen));
    // The authenticated connections are still served.
    for conn in &mut tenant {
        assert_eq!(ask(conn, "/v1/kernels", Some(TOKEN)).await.status, 200);
    }
    let metrics = raw::roundtrip(
        srv.addr,
        &raw::request("GET", "/metrics", Some(TOKEN), b"", true),
    )
    .await;
    let evicted = metrics
        .text()
        .lines()
        .find_map(|l| {
            l.strip_prefix("kernelbox_requests_rejected_total{reason=\"connection_evicted\"} ")
                .map(|n| n.parse::<u64>().expect("a count"))
        })
        .expect("the eviction series");
    assert!(evicted >= 1, "{evicted}");
    drop(silent);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_answer_sent_before_the_body_was_read_is_followed_by_a_close_not_a_reset() {
    let s = Server::start("early-answer", Limits::default()).await;
    let mut stream = raw::connect(s.addr).await;
    // A path that escapes the working directory: refused at once, the body never read. Head
    // and the body's first 512 KiB go in one write, so they are there when the answer is.
    let mut request = format!(
        "PUT /v1/sessions/early/files/..%2F..%2Fescape HTTP/1.1\r\nHost: kernelbox\r\n\
         Authorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n",
        64 << 20
    )
    .into_bytes();
    request.extend(std::iter::repeat_n(b'u', 512 * 1024));
    stream.write_all(&request).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 8192];
    while raw::parse(&seen).is_none() {
        match tokio::time::timeout(raw::DEADLINE, stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => seen.extend_from_slice(&buf[..n]),
            other => panic!("no answer: {other:?} {:?}", String::from_utf8_lossy(&seen)),
        }
    }
    // The client, not yet done with its body, sends more after the answer (as a client that
    // writes and reads at once does): a server that had closed its socket resets the
    // connection now, and a client still sending (hyper's, for one) then fails with
    // ECONNRESET before it has read the answer.
    stream
        .write_all(&request[request.len() - 65536..])
        .await
        .unwrap();
    stream.shutdown().await.unwrap();
    let ended = loop {
        match tokio::time::timeout(raw::DEADLINE, stream.read(&mut buf)).await {
            Err(_) => panic!("the server never closed the connection"),
            Ok(Ok(0)) => break Ok(()),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => break Err(e),
        }
    };
    let text = String::from_utf8_lossy(&seen);
    assert!(text.starts_with("HTTP/1.1 400"), "{text:?}");
    assert!(ended.is_ok(), "a reset after the answer: {ended:?}");
    s.finish().await;
}
