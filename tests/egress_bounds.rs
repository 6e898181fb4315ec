//! The egress proxy's memory stays bounded whatever a cell does with its connections
//! (`docs/reliability.md`, "Network egress"): a real `kernelbox serve` with the proxy, a kernel
//! allowed one loopback server of this test, 2,000 connections held open mid-request and a
//! download read a few bytes at a time. The server's resident memory and the bytes the
//! upstream server got rid of stay small: the proxy buffers neither the connections' heads nor
//! the slow reader's body.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::MIB;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Connections the cell holds open at once.
const HELD: usize = 2000;
/// Growth of the server's resident memory the attack may cause: 2,000 connections at the
/// proxy's bounded head buffer, plus the tunnel's fixed buffers, are far below it; buffering
/// the download (1 GiB offered) or the heads without bound is far above.
const MAX_GROWTH: u64 = 96 * 1024 * 1024;
/// Bytes the upstream server may get rid of to a reader that takes a few KiB: the sockets'
/// buffers on both hops and the proxy's copy buffers, never the body.
const MAX_SENT: u64 = 48 * 1024 * 1024;

/// A server that answers every request with a 1 GiB body written as fast as its peer takes
/// it, counting the bytes its writes got rid of.
async fn firehose(sent: Arc<AtomicU64>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let sent = sent.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-length: 1073741824\r\n\r\n";
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; 64 * 1024];
                while s.write_all(&chunk).await.is_ok() {
                    sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    port
}

/// The cell: HELD raw connections to the proxy, each authenticated and stopped in the middle
/// of its request head, then a download through the proxy read 4 KiB at a time for a few
/// seconds; prints how many connections were held and how much was read.
const ATTACK: &str = r#"
import base64, os, socket, time, urllib.parse, urllib.request
proxy = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
held = []
for i in range(HELD):
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=5)
    s.sendall(f"GET http://127.0.0.1:PORT/{i} HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\nProxy-Authorization: Basic {auth}\r\nX-Pad: {'a' * 8000}".encode())
    held.append(s)
body = urllib.request.urlopen("http://127.0.0.1:PORT/slow", timeout=15)
got = 0
end = time.time() + 6
while time.time() < end:
    got += len(body.read(4096))
    time.sleep(0.05)
print("held", len(held), "read", got)
"#;

#[tokio::test]
async fn two_thousand_connections_and_a_slow_reader_leave_the_servers_memory_bounded() {
    let sent = Arc::new(AtomicU64::new(0));
    let port = firehose(sent.clone()).await;
    let allow = format!("127.0.0.1:{port}");
    let served = http::Served::start(
        "egress-bounds",
        "token",
        &[
            "--pool",
            "0",
            "--network-allow",
            &allow,
            "--egress-connections",
            "2100",
        ],
    )
    .await;
    let pid = served.process.id().unwrap();
    // The kernel first, so that its start is not counted as the attack's.
    let warm = served.api.run("token", "s", "print('up')").await;
    assert_eq!(warm["output"], "up\n", "{warm}");
    let (before, _) = common::memory_of(pid);

    let code = ATTACK
        .replace("HELD", &HELD.to_string())
        .replace("PORT", &port.to_string());
    let api = served.api.clone();
    let cell = tokio::spawn(async move { api.run("token", "s", &code).await });
    // The server's resident memory while the cell attacks, at its highest.
    let mut peak = before;
    while !cell.is_finished() {
        peak = peak.max(common::memory_of(pid).0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = cell.await.unwrap();
    let out = r["output"].as_str().unwrap_or_default().to_string();
    let read: u64 = out
        .split_whitespace()
        .last()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let sent = sent.load(Ordering::Relaxed);
    eprintln!(
        "server RSS {:.1} MiB before, {:.1} MiB at most during the attack; upstream sent {:.1} MiB, the cell read {:.1} KiB",
        before as f64 / MIB,
        peak as f64 / MIB,
        sent as f64 / MIB,
        read as f64 / 1024.0
    );
    assert!(
        out.starts_with(&format!("held {HELD} read ")),
        "every connection was held open and the download began: {r}"
    );
    assert!(read > 0, "the slow reader read: {r}");
    assert!(
        peak.saturating_sub(before) < MAX_GROWTH,
        "the server grew by {:.1} MiB",
        peak.saturating_sub(before) as f64 / MIB
    );
    assert!(
        sent < MAX_SENT,
        "the proxy took {:.1} MiB from upstream for a reader that read {read} bytes",
        sent as f64 / MIB
    );
    served.finish().await;
}
