//! The egress proxy stays bounded whatever a cell does with its connections
//! (`docs/reliability.md`, "Network egress" and "Descriptors"), against a real `kernelbox
//! serve` with the proxy and a kernel allowed one loopback server of this test:
//!
//! - 2,000 connections held open mid-request and a download read a few bytes at a time: the
//!   server's resident memory and the bytes the upstream server got rid of stay small (the
//!   proxy buffers neither the connections' heads nor the slow reader's body);
//! - CONNECT tunnels (each after a small ClientHello) held open by the hundred under a
//!   1,024-descriptor limit: each kernel's limit and the proxy's total hold for the tunnels'
//!   whole life, the rest are refused, another tenant's API calls all succeed, and a
//!   ClientHello trickled a byte at a time is cut at its one deadline;
//! - the open-file limit is raised to the hard limit at start.

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

/// A server on loopback that takes connections and holds each until its peer closes, reading
/// off what it sends; counts the connections it accepted.
async fn holder(accepted: Arc<AtomicU64>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// `cmd` (a `kernelbox serve` command) run under `sh` after `ulimit` with `limits` (e.g.
/// `-n 1024`): the same program, arguments and environment.
fn under_ulimit(cmd: tokio::process::Command, limits: &str) -> tokio::process::Command {
    let std = cmd.as_std();
    let mut out = tokio::process::Command::new("sh");
    out.arg("-c")
        .arg(format!("ulimit {limits} && exec \"$@\""))
        .arg("sh")
        .arg(std.get_program())
        .args(std.get_args());
    for (key, value) in std.get_envs() {
        match value {
            Some(value) => out.env(key, value),
            None => out.env_remove(key),
        };
    }
    out.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    out
}

/// Starts `cmd`; returns the process, its address, and its stderr lines before it served.
async fn spawn(
    mut cmd: tokio::process::Command,
) -> (tokio::process::Child, std::net::SocketAddr, Vec<String>) {
    use tokio::io::AsyncBufReadExt;
    let mut child = cmd.spawn().expect("spawn kernelbox serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let mut before = Vec::new();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let line = lines
                .next_line()
                .await
                .expect("stderr")
                .expect("the server exited before serving");
            if let Some(rest) = line.split("on http://").nth(1) {
                let addr = rest.split_whitespace().next().expect("address");
                return addr.parse().expect("socket address");
            }
            before.push(line);
        }
    })
    .await
    .expect("the server serves within 60 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr, before)
}

/// The cell's tunnels: `tunnel()` sends a CONNECT to the allowed loopback server, and on a
/// `200` a 55-byte ClientHello (no server name: the CONNECT host is an address); every tunnel
/// answered 200 is kept open in `held`. `hold(N)` prints how many of N got each answer.
const TUNNELS: &str = r#"
import base64, collections, os, socket, urllib.parse
proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
auth = base64.b64encode(f"{proxy.username}:{proxy.password}".encode()).decode()
def hello():
    body = bytes([3, 3]) + bytes([7]) * 32 + bytes([0]) + bytes([0, 2, 0x13, 0x01]) + bytes([1, 0])
    exts = bytes([0, 0x2b, 0, 3, 2, 3, 4])
    body += len(exts).to_bytes(2, "big") + exts
    hs = bytes([1]) + len(body).to_bytes(3, "big") + body
    return bytes([22, 3, 1]) + len(hs).to_bytes(2, "big") + hs
HELLO = hello()
held = globals().get("held", [])
def connect():
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=10)
    s.sendall(f"CONNECT 127.0.0.1:PORT HTTP/1.1\r\nHost: 127.0.0.1:PORT\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
    except OSError:
        pass
    status = head.split(b" ")[1].decode() if head.startswith(b"HTTP/") else "closed"
    return s, status
def tunnel():
    try:
        s, status = connect()
    except OSError:
        return "closed"
    if status == "200":
        s.sendall(HELLO)
        held.append(s)
    else:
        s.close()
    return status
def hold(n):
    print(dict(sorted(collections.Counter(tunnel() for _ in range(n)).items())))
"#;

/// A tunnel whose ClientHello comes one byte at a time (a 305-byte record, paced by a
/// half-second wait for the proxy to close it): prints `cut` and the bytes sent when the proxy
/// closed it, `whole` if it never did within 40 s.
const TRICKLE: &str = r#"
import time
s, status = connect()
assert status == "200", status
data = bytes([22, 3, 1, 1, 44]) + bytes(300)
s.settimeout(0.5)
sent, cut, end = 0, False, time.time() + 40
while time.time() < end and sent < len(data):
    try:
        s.sendall(data[sent:sent + 1])
        sent += 1
        if s.recv(1) == b"":
            cut = True
            break
    except socket.timeout:
        pass
    except OSError:
        cut = True
        break
print("cut" if cut else "whole", sent)
"#;

/// A GET /v1/kernels on a connection of its own: true when it was answered 200.
async fn fresh_call(addr: std::net::SocketAddr, token: &str) -> bool {
    let api = http::Api::new(addr);
    let req = api
        .build(hyper::Method::GET, "/v1/kernels", Some(token), false, false)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    matches!(
        tokio::time::timeout(Duration::from_secs(10), api.http.request(req)).await,
        Ok(Ok(r)) if r.status() == hyper::StatusCode::OK
    )
}

/// Parses a `hold` line (`{'200': 100, '429': 500}`) into (answer, count) pairs.
fn answers(output: &str) -> std::collections::BTreeMap<String, u64> {
    let line = output.lines().last().unwrap_or_default();
    line.trim_matches(|c| c == '{' || c == '}')
        .split(", ")
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once(": ").unwrap();
            (k.trim_matches('\'').to_string(), v.parse().unwrap())
        })
        .collect()
}

/// Tunnels one kernel may hold at once in the test below (`--egress-connections`).
const PER_KERNEL: u64 = 100;

#[tokio::test]
async fn tunnels_hold_their_permits_and_another_tenants_calls_succeed_under_a_low_descriptor_limit()
{
    let accepted = Arc::new(AtomicU64::new(0));
    let port = holder(accepted.clone()).await;
    let mut a = http::tenant("a", "token-a");
    a["network"] = serde_json::json!({ "allow": [format!("127.0.0.1:{port}")] });
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        file.path(),
        serde_json::json!({"tenants": [a, http::tenant("b", "token-b")]}).to_string(),
    )
    .unwrap();
    let label = common::unique("egress-tunnels");
    let state = tempfile::tempdir().unwrap();
    let mut cmd = common::serve_command(&label, "unused");
    cmd.arg("--state-dir")
        .arg(state.path())
        .args(["--pool", "0", "--tenants"])
        .arg(file.path())
        .args(["--egress-connections", &PER_KERNEL.to_string()])
        // Room for a loaded machine; the trickle below gives up after 40 s.
        .args(["--timeout", "2m"]);
    // 1,024 descriptors, soft and hard: the server cannot raise it, and fits its totals in.
    let (mut process, addr, early) = spawn(under_ulimit(cmd, "-n 1024")).await;
    let engine = common::engine().await;
    let api = http::Api::new(addr);
    let notice = early
        .iter()
        .find(|l| l.contains("open-file limit is 1024"))
        .unwrap_or_else(|| panic!("no notice of the fitted totals: {early:?}"));
    // "... egress proxy 4096 -> N)": the proxy's total under this limit.
    let total: u64 = notice
        .split("egress proxy 4096 -> ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{notice}"));
    assert!(
        total > PER_KERNEL && 2 * total < 1024,
        "the proxy's total {total} fits well within 1,024 descriptors"
    );

    // A ClientHello trickled a byte at a time is cut at the one deadline (the kernel started
    // first, so that its start is not in the cell's time).
    let r = api.run("token-a", "t", "print('up')").await;
    assert_eq!(r["output"], "up\n", "{r}");
    let tunnels = TUNNELS.replace("PORT", &port.to_string());
    let trickle = format!("{tunnels}\n{TRICKLE}");
    let r = api.run("token-a", "t", &trickle).await;
    let out = r["output"].as_str().unwrap().to_string();
    assert!(
        out.starts_with("cut "),
        "the trickled hello was not cut: {r}"
    );
    let sent: usize = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(sent < 305, "{out}");

    // One kernel: 600 tunnels asked, its own limit held, the rest refused 429.
    let r = api
        .run("token-a", "one", &format!("{tunnels}\nhold(600)"))
        .await;
    let one = answers(r["output"].as_str().unwrap());
    assert_eq!(one.get("200"), Some(&PER_KERNEL), "{r}");
    assert_eq!(one.get("429"), Some(&(600 - PER_KERNEL)), "{r}");
    // Another kernel: what is left of the total, the rest closed at once.
    let r = api
        .run("token-a", "two", &format!("{tunnels}\nhold(300)"))
        .await;
    let two = answers(r["output"].as_str().unwrap());
    let held_two = two.get("200").copied().unwrap_or(0);
    assert!(
        held_two > 0 && PER_KERNEL + held_two <= total,
        "{r} (total {total})"
    );
    assert!(two.get("closed").copied().unwrap_or(0) > 0, "{r}");
    assert_eq!(
        accepted.load(Ordering::Relaxed),
        PER_KERNEL + held_two + 1,
        "the destination got the held tunnels (and the trickled one) only"
    );

    eprintln!(
        "proxy total {total} under 1,024 descriptors; kernel one {one:?}, kernel two {two:?}"
    );
    // While they are held, another tenant's calls, each on a new connection, all succeed.
    let mut failed = 0;
    for _ in 0..40 {
        if !fresh_call(addr, "token-b").await {
            failed += 1;
        }
    }
    assert_eq!(failed, 0, "{failed} of 40 of tenant b's calls failed");
    let r = api.run("token-b", "s", "print('b ok')").await;
    assert_eq!(r["output"], "b ok\n", "{r}");

    // The tunnels' permits go with them: once the first kernel closes its tunnels, the
    // second one can open more.
    let r = api
        .run(
            "token-a",
            "one",
            "for s in held: s.close()\nheld.clear()\nprint('closed')",
        )
        .await;
    assert_eq!(r["output"], "closed\n", "{r}");
    // The total was spent; now the second kernel gets up to its own limit again.
    let want = PER_KERNEL - held_two;
    let more = format!(
        r#"
import time
end, got = time.time() + 20, 0
while got < {want} and time.time() < end:
    if tunnel() == "200":
        got += 1
    else:
        time.sleep(0.2)
print("more", got, tunnel())
"#
    );
    let r = api
        .run("token-a", "two", &format!("{tunnels}\n{more}"))
        .await;
    assert_eq!(r["output"], format!("more {want} 429\n"), "{r}");

    let status = common::terminate(&mut process, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    common::assert_clean(&engine, &label).await;
}

#[tokio::test]
async fn the_servers_open_file_limit_is_raised_to_the_hard_limit() {
    let label = common::unique("egress-nofile");
    let state = tempfile::tempdir().unwrap();
    let mut cmd = common::serve_command(&label, "token");
    cmd.arg("--state-dir")
        .arg(state.path())
        .args(["--pool", "0"]);
    let (mut process, _addr, _) = spawn(under_ulimit(cmd, "-S -n 512")).await;
    let pid = process.id().unwrap();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_string();
    let fields: Vec<&str> = line.split_whitespace().collect();
    let (soft, hard) = (fields[3], fields[4]);
    assert_ne!(soft, "512", "{line}");
    assert_eq!(soft, hard, "{line}");
    let status = common::terminate(&mut process, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    common::assert_clean(&common::engine().await, &label).await;
}
