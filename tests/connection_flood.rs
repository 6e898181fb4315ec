//! A flood of unauthenticated connections cannot take the connection slots an authenticated
//! tenant needs (docs/http-api.md, "Slow and idle clients cannot hold the server"): the real
//! `kernelbox serve` binary with `--max-connections 64` and every other connection bound at
//! its default, hundreds of sockets without a token each sending half a request head and
//! reopened as soon as the server closes them, from several loopback addresses (or from the
//! tenant's own address, every bound at its default), while a tenant runs cells, each on a fresh connection (so that every one of its requests must be
//! admitted during the attack). The tenant must see no 503, every request answered within a
//! few seconds, and at least 99% of its cells succeed; once the attack stops, the server
//! answers at once.
//!
//! And a connection given away while its head was on its way never runs that request
//! unanswered (silent sockets from the tenant's own address, reopened at once).
//!
//! The figures (requests, outcomes, latencies, sockets the attack opened) are printed; run
//! with `--nocapture` to see them.

mod common;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const TOKEN: &str = "tok-flood";
/// Loopback addresses the attack comes from (127.0.0.2 and up; the tenant is 127.0.0.1).
const ATTACK_ADDRESSES: u8 = 4;
/// Sockets the attack keeps open (or reopens) per address.
const SOCKETS_PER_ADDRESS: usize = 60;
/// Sockets the attack keeps open (or reopens) from the tenant's own address: several times
/// that address's share of unauthenticated connections (64 by default).
const SHARED_SOCKETS: usize = 300;
/// An attacking socket closed by the server is reopened after this pause.
const REOPEN_PAUSE: Duration = Duration::from_millis(100);
/// The same, for the flood from the tenant's own address: its sockets hold the address at its
/// share all along (far more of them than the share), each reopened a second after the server
/// closes it.
const SHARED_REOPEN_PAUSE: Duration = Duration::from_secs(1);
/// How long the tenant runs cells under the attack.
const ATTACK: Duration = Duration::from_secs(8);
/// Longest a tenant request may take, during the attack or after it.
const BOUND: Duration = Duration::from_secs(5);
/// Longest the test waits for any one request before calling it unanswered.
const GIVE_UP: Duration = Duration::from_secs(30);

/// What one tenant request came to.
#[derive(Debug)]
enum Outcome {
    /// The cell ran and printed what it was asked to.
    Ok,
    /// An HTTP status other than 200.
    Status(u16, String),
    /// No whole response: refused, reset, or not answered within `GIVE_UP`.
    Failed(String),
}

/// Runs `print(n)` in `session` on a new connection from 127.0.0.1 (`Connection: close`).
async fn cell(addr: SocketAddr, session: &str, n: u64) -> (Outcome, Duration) {
    let started = Instant::now();
    let outcome = match tokio::time::timeout(GIVE_UP, cell_once(addr, session, n)).await {
        Ok(outcome) => outcome,
        Err(_) => Outcome::Failed(format!("no response within {GIVE_UP:?}")),
    };
    (outcome, started.elapsed())
}

async fn cell_once(addr: SocketAddr, session: &str, n: u64) -> Outcome {
    let body = serde_json::json!({ "code": format!("print({n})") }).to_string();
    let request = format!(
        "POST /v1/sessions/{session}/execute HTTP/1.1\r\nHost: kernelbox\r\n\
         Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = match TcpStream::connect(addr).await {
        Ok(s) => s,
        Err(e) => return Outcome::Failed(format!("connect: {e}")),
    };
    if let Err(e) = stream.write_all(request.as_bytes()).await {
        return Outcome::Failed(format!("send: {e}"));
    }
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => break,
            Ok(k) => bytes.extend_from_slice(&buf[..k]),
            // A reset after a whole response still counts as that response.
            Err(e) if bytes.is_empty() => return Outcome::Failed(format!("read: {e}")),
            Err(_) => break,
        }
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Outcome::Failed(format!("not a response: {text:?}"));
    };
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    if status != 200 {
        return Outcome::Status(status, body.to_string());
    }
    match serde_json::from_str::<serde_json::Value>(body) {
        Ok(v) if v["status"] == "success" && v["output"] == format!("{n}\n") => Outcome::Ok,
        _ => Outcome::Status(status, body.to_string()),
    }
}

/// One attacking socket, reopened as it closes: connects from `source`, sends half a request
/// head with no token, and holds the connection until the server closes it. Returns how many
/// connections it opened.
async fn attacker(
    addr: SocketAddr,
    source: Ipv4Addr,
    pause: Duration,
    stop: CancellationToken,
) -> u64 {
    const HALF_HEAD: &[u8] = b"GET /v1/kernels HTTP/1.1\r\nHost: kernelbox\r\nX-Padding: ";
    let mut opened = 0;
    while !stop.is_cancelled() {
        let connected = async {
            let socket = TcpSocket::new_v4()?;
            socket.bind(SocketAddr::from((source, 0)))?;
            socket.connect(addr).await
        };
        let stream = tokio::select! {
            _ = stop.cancelled() => break,
            connected = tokio::time::timeout(GIVE_UP, connected) => connected,
        };
        if let Ok(Ok(mut stream)) = stream {
            opened += 1;
            if stream.write_all(HALF_HEAD).await.is_ok() {
                let mut buf = [0u8; 1024];
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = async {
                        while let Ok(1..) = stream.read(&mut buf).await {}
                    } => {}
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
    opened
}

/// The server's connection refusals and evictions, from `/metrics`.
async fn rejections(addr: SocketAddr) -> String {
    let request = format!(
        "GET /metrics HTTP/1.1\r\nHost: kernelbox\r\nAuthorization: Bearer {TOKEN}\r\n\
         Connection: close\r\n\r\n"
    );
    let mut text = String::new();
    if let Ok(Ok(mut stream)) = tokio::time::timeout(GIVE_UP, TcpStream::connect(addr)).await {
        if stream.write_all(request.as_bytes()).await.is_ok() {
            let _ = tokio::time::timeout(GIVE_UP, stream.read_to_string(&mut text)).await;
        }
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("kernelbox_requests_rejected_total{reason=\"connection"))
        .map(|l| format!("connection{l}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The figures of a run of tenant requests.
fn summary(what: &str, results: &[(Outcome, Duration)]) -> (usize, usize, Duration) {
    let ok = results
        .iter()
        .filter(|(o, _)| matches!(o, Outcome::Ok))
        .count();
    let refused = results
        .iter()
        // Refused a slot; a request whose connection gave way is `connection_evicted` (it did not
        // run) and counts only against the success rate.
        .filter(|(o, _)| matches!(o, Outcome::Status(503, body) if body.contains("too_many_connections")))
        .count();
    let max = results.iter().map(|(_, d)| *d).max().unwrap_or_default();
    let mut sorted: Vec<Duration> = results.iter().map(|(_, d)| *d).collect();
    sorted.sort();
    let median = sorted.get(sorted.len() / 2).copied().unwrap_or_default();
    println!(
        "{what}: {} requests, {ok} ok ({:.1}%), {refused} answered 503, max latency {max:?}, \
         median {median:?}",
        results.len(),
        100.0 * ok as f64 / results.len().max(1) as f64,
    );
    for (outcome, took) in results
        .iter()
        .filter(|(o, _)| !matches!(o, Outcome::Ok))
        .take(5)
    {
        let what = match outcome {
            Outcome::Ok => "ok".to_string(),
            Outcome::Status(status, body) => format!("{status} {body}"),
            Outcome::Failed(why) => why.clone(),
        };
        println!("  e.g. {what} after {took:?}");
    }
    (ok, refused, max)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_unauthenticated_half_heads_does_not_starve_an_authenticated_tenant() {
    let sources: Vec<Ipv4Addr> = (0..ATTACK_ADDRESSES)
        .map(|a| Ipv4Addr::new(127, 0, 0, 2 + a))
        .collect();
    let attack = Attack {
        sources,
        sockets: SOCKETS_PER_ADDRESS,
        pause: REOPEN_PAUSE,
    };
    flood("flood", attack, &["--max-connections", "64"]).await;
}

/// The tenant and the flood share one address (a NAT, a proxy with the per-address cap left
/// on), every bound at its default: the address is at its share of unauthenticated
/// connections all along, and each of the tenant's new connections takes the slot of the
/// address's oldest idle one instead of being refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_flood_from_the_tenants_own_address_does_not_starve_it() {
    let attack = Attack {
        sources: vec![Ipv4Addr::LOCALHOST],
        sockets: SHARED_SOCKETS,
        pause: SHARED_REOPEN_PAUSE,
    };
    flood("flood-nat", attack, &[]).await;
}

/// Where an attack comes from and how hard it presses.
struct Attack {
    /// The addresses it connects from.
    sources: Vec<Ipv4Addr>,
    /// Sockets per address.
    sockets: usize,
    /// How long a socket the server closed waits before it reconnects.
    pause: Duration,
}

/// Runs a tenant's cells from 127.0.0.1, each on a fresh connection, while `attack` holds half
/// request heads (each socket reopened as the server closes it), on a `kernelbox serve` with
/// `args`; asserts the tenant is never refused and recovers at once.
async fn flood(name: &str, attack: Attack, args: &[&str]) {
    let Attack {
        sources,
        sockets,
        pause,
    } = attack;
    let label = common::unique(name);
    let engine = common::engine().await;
    let state = tempfile::tempdir().expect("state directory");
    let mut child = common::serve_command(&label, TOKEN)
        .arg("--state-dir")
        .arg(state.path())
        .args(["--pool", "0"])
        .args(args)
        .spawn()
        .expect("spawn kernelbox serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let addr = common::serving_addr(&mut lines).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });

    // The tenant's sessions have their kernels before the attack starts.
    let sessions = ["flood-a", "flood-b"];
    for session in sessions {
        let (outcome, _) = cell(addr, session, 0).await;
        assert!(matches!(outcome, Outcome::Ok), "{outcome:?}");
    }

    let stop = CancellationToken::new();
    let mut attack = Vec::new();
    for &source in &sources {
        for _ in 0..sockets {
            attack.push(tokio::spawn(attacker(addr, source, pause, stop.clone())));
        }
    }
    // Let the attack take hold of whatever it can.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let until = Instant::now() + ATTACK;
    let tenant: Vec<_> = sessions
        .into_iter()
        .map(|session| {
            tokio::spawn(async move {
                let mut results = Vec::new();
                let mut n = 1;
                while Instant::now() < until {
                    results.push(cell(addr, session, n).await);
                    n += 1;
                }
                results
            })
        })
        .collect();
    let mut during = Vec::new();
    for task in tenant {
        during.extend(task.await.expect("tenant task"));
    }
    stop.cancel();
    let mut opened = 0;
    for task in attack {
        opened += task.await.expect("attacker task");
    }
    println!(
        "attack: {} sockets from {} addresses opened {opened} connections",
        sources.len() * sockets,
        sources.len()
    );
    let (ok, refused, max) = summary("tenant during the attack", &during);
    println!("server: {}", rejections(addr).await);

    // Recovery: at once.
    let mut after = Vec::new();
    for (i, session) in sessions.into_iter().enumerate() {
        after.push(cell(addr, session, 1_000 + i as u64).await);
    }
    let (after_ok, _, after_max) = summary("tenant right after the attack", &after);

    assert!(
        opened >= 2 * (sources.len() * sockets) as u64,
        "the attack did not reopen its sockets as they closed ({opened} connections)"
    );
    assert!(during.len() >= 20, "the tenant made too few requests");
    assert_eq!(refused, 0, "the tenant was refused 503");
    assert!(
        ok * 100 >= during.len() * 99,
        "the tenant's success rate fell below 99%"
    );
    assert!(max <= BOUND, "a tenant request took {max:?}");
    assert_eq!(after_ok, after.len(), "the server did not recover at once");
    assert!(
        after_max <= BOUND,
        "after the attack a request took {after_max:?}"
    );

    let status = common::terminate(&mut child, Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0));
    common::assert_clean(&engine, &label).await;
}

/// Runs `code` in `session` on a new connection (`Connection: close`): the response's status
/// and body, or `None` when no whole response came (reset, closed).
async fn run_once(addr: SocketAddr, session: &str, code: &str) -> Option<(u16, String)> {
    let body = serde_json::json!({ "code": code }).to_string();
    let request = format!(
        "POST /v1/sessions/{session}/execute HTTP/1.1\r\nHost: kernelbox\r\n\
         Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.ok()?;
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut bytes = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => break,
                Ok(k) => bytes.extend_from_slice(&buf[..k]),
                Err(_) => break,
            }
        }
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let status = head.split_whitespace().nth(1)?.parse().ok()?;
        // Only a whole body counts (a cut one is no answer).
        serde_json::from_str::<serde_json::Value>(body).ok()?;
        Some((status, body.to_string()))
    };
    tokio::time::timeout(GIVE_UP, exchange).await.ok().flatten()
}

/// One socket from 127.0.0.1 that connects, sends nothing, and reconnects at once when the
/// server closes it: its new connections keep taking the address's oldest silent slots, so a
/// tenant's new connection (silent until its head is read) is sometimes the one given away.
async fn silent_attacker(addr: SocketAddr, stop: CancellationToken) {
    while !stop.is_cancelled() {
        let Ok(Ok(mut stream)) = tokio::time::timeout(GIVE_UP, TcpStream::connect(addr)).await
        else {
            continue;
        };
        let mut buf = [0u8; 64];
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = stream.read(&mut buf) => {}
        }
    }
}

/// A connection given away while its head was on its way never runs that request unanswered:
/// under a flood of silent connections from the tenant's own address, reopened at once, every
/// cell the kernel ran was answered 200, and every other request got a 503 or no answer (and
/// did not run), so a client may retry it.
#[tokio::test(flavor = "multi_thread")]
async fn a_request_whose_connection_is_given_away_does_not_run_unanswered() {
    let label = common::unique("flood-unanswered");
    let engine = common::engine().await;
    let state = tempfile::tempdir().expect("state directory");
    let mut child = common::serve_command(&label, TOKEN)
        .arg("--state-dir")
        .arg(state.path())
        .args(["--pool", "0"])
        .spawn()
        .expect("spawn kernelbox serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let addr = common::serving_addr(&mut lines).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let session = "unanswered";
    let started = run_once(addr, session, "n = 0").await;
    assert_eq!(started.map(|(s, _)| s), Some(200));

    let stop = CancellationToken::new();
    let attack: Vec<_> = (0..SHARED_SOCKETS / 2)
        .map(|_| tokio::spawn(silent_attacker(addr, stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut answered, mut refused, mut unanswered) = (0u64, 0u64, 0u64);
    for _ in 0..60 {
        match run_once(addr, session, "n += 1").await {
            Some((200, _)) => answered += 1,
            Some((503, _)) => refused += 1,
            Some((status, body)) => panic!("{status} {body}"),
            None => unanswered += 1,
        }
    }
    stop.cancel();
    for task in attack {
        task.await.expect("attacker task");
    }
    println!("under the flood: {answered} answered, {refused} refused 503, {unanswered} no answer");
    let mut attempts = 0;
    let ran = loop {
        attempts += 1;
        assert!(attempts <= 20, "the server does not answer after the flood");
        if let Some((200, body)) = run_once(addr, session, "print(n)").await {
            let v: serde_json::Value = serde_json::from_str(&body).expect("json");
            break v["output"]
                .as_str()
                .and_then(|o| o.trim().parse::<u64>().ok())
                .expect("n");
        }
    };
    assert_eq!(
        ran, answered,
        "cells ran that were never answered ({answered} answered, {refused} refused, \
         {unanswered} without an answer)"
    );
    let status = common::terminate(&mut child, Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0));
    common::assert_clean(&engine, &label).await;
}
