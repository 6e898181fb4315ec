//! Results clients never read cannot grow the server (docs/reliability.md, "Bounded host
//! resources"; docs/http-api.md, "Slow and idle clients cannot hold the server"): response
//! bytes in flight are bounded per tenant (429 `too_many_pending_results` past the budget)
//! and every response must be read at a minimum rate once its grace has passed.
//!
//! Against a real `kernelbox serve` process, whose RSS is read from /proc.

mod common;
#[path = "common/http.rs"]
mod http;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use http::{tenant, Served};

const EVIL: &str = "tok-unread-evil";
const GOOD: &str = "tok-unread-good";
const MIB: f64 = 1024.0 * 1024.0;

/// A cell whose result is about 18 MB of JSON: four displays of 4.5 MB (each under the 5 MiB
/// display cap, all under the 20 MiB cell cap).
const BIG: &str = "for i in range(4):\n    display({'text/plain': str(i) * 4_500_000}, raw=True)";

fn proc_kib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

fn execute_request(token: &str, session: &str, code: &str) -> Vec<u8> {
    let body = json!({ "code": code }).to_string();
    format!(
        "POST /v1/sessions/{session}/execute HTTP/1.1\r\nhost: kernelbox\r\n\
         authorization: Bearer {token}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends an execute and reads only the response's status line; the socket is returned open.
async fn status_only(addr: SocketAddr, token: &str, session: &str, code: &str) -> (u16, TcpStream) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(&execute_request(token, session, code))
        .await
        .expect("send");
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(120), async {
        while !line.ends_with(b"\r\n") {
            stream.read_exact(&mut byte).await.expect("status line");
            line.push(byte[0]);
        }
    })
    .await
    .expect("a status line within 120 s");
    let text = String::from_utf8_lossy(&line).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("status line {text:?}"));
    (status, stream)
}

fn addr_of(served: &Served) -> SocketAddr {
    served
        .api
        .base
        .trim_start_matches("http://")
        .parse()
        .expect("server address")
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{name} in metrics:\n{text}"))
}

async fn start(name: &str, extra: &[&str]) -> (Served, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("tenants.json");
    let tenants = json!({"tenants": [tenant("evil", EVIL), tenant("good", GOOD)]});
    std::fs::write(&file, tenants.to_string()).expect("tenants file");
    let mut flags = vec!["--tenants", file.to_str().expect("utf-8 path")];
    flags.extend_from_slice(extra);
    (Served::start(name, EVIL, &flags).await, dir)
}

/// The attack: one tenant runs 4 sessions of cells whose results are ~18 MB each and reads
/// only each response's status line, keeping the sockets open (the send timeout is set long:
/// it stands for a reader taking 4 KiB every 10 s, which no send timeout cuts). With a 32 MiB
/// budget the server grows by the budget plus the results of the cells already running when
/// it filled, the rest of the attacker's cells are refused with 429, and a bystander tenant's
/// cells keep succeeding. Before the budget every result stayed in memory: 16 cells grew the
/// server by hundreds of MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn results_nobody_reads_are_bounded_per_tenant_and_bystanders_go_on() {
    let (served, _dir) = start(
        "unread-budget",
        &[
            "--max-pending-results-per-tenant",
            "32m",
            "--send-timeout",
            "300s",
            "--send-rate-grace",
            "300s",
            "--max-kernels",
            "8",
        ],
    )
    .await;
    let addr = addr_of(&served);
    let pid = served.process.id().expect("pid");
    // Warm both tenants' sessions up, so kernel starts are not counted as growth.
    for s in 0..4 {
        let r = served.api.run(EVIL, &format!("s{s}"), "1").await;
        assert_eq!(r["status"], "success", "{r}");
    }
    let r = served.api.run(GOOD, "by", "1").await;
    assert_eq!(r["status"], "success", "{r}");
    let before = proc_kib(pid, "VmRSS:");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bystander = {
        let api = served.api.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut ok, mut total) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let r = api
                    .execute(GOOD, "by", json!({"code": "print(6 * 7)"}))
                    .await
                    .json();
                total += 1;
                if r["status"] == "success" && r["output"] == "42\n" {
                    ok += 1;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (ok, total)
        })
    };
    let attackers = (0..4).map(|s| {
        tokio::spawn(async move {
            let mut held = Vec::new();
            let (mut answered, mut refused) = (0, 0);
            for _ in 0..4 {
                let (status, stream) = status_only(addr, EVIL, &format!("s{s}"), BIG).await;
                match status {
                    200 => answered += 1,
                    429 => refused += 1,
                    other => panic!("unexpected status {other}"),
                }
                held.push(stream);
            }
            (answered, refused, held)
        })
    });
    let mut sockets = Vec::new();
    let (mut answered, mut refused) = (0, 0);
    for attacker in attackers.collect::<Vec<_>>() {
        let (a, r, held) = attacker.await.expect("attacker");
        answered += a;
        refused += r;
        sockets.extend(held);
    }
    // Let the server settle while every socket is still open and unread.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = proc_kib(pid, "VmRSS:");
    let peak = proc_kib(pid, "VmHWM:");
    let metrics = served.api.metrics(GOOD).await;
    let pending = metric(&metrics, "kernelbox_response_bytes_pending");
    stop.store(true, std::sync::atomic::Ordering::Release);
    let (ok, total) = bystander.await.expect("bystander");
    let growth = (after - before) / 1024.0;
    eprintln!(
        "attack: {answered} results unread, {refused} cells refused 429; server VmRSS \
         {:.0} -> {:.0} MiB (+{growth:.0} MiB), VmHWM {:.0} MiB; {:.0} MiB pending; \
         bystander {ok}/{total} cells succeeded",
        before / 1024.0,
        after / 1024.0,
        peak / 1024.0,
        pending / MIB,
    );
    assert!(total >= 3 && ok == total, "bystander: {ok}/{total}");
    assert!(refused > 0, "no cell was refused: {answered} answered");
    // The budget is checked when a cell is admitted, so what is held is the budget (32 MiB)
    // plus the results of the attacker's cells running when it filled (up to one per session,
    // ~18 MB each), plus what the allocator keeps of building them.
    let held = pending / MIB;
    assert!(held < 32.0 + 4.0 * 18.0, "{held:.0} MiB of responses held");
    assert!(growth < held + 75.0, "server grew by {growth:.0} MiB");
    assert!(growth < 200.0, "server grew by {growth:.0} MiB");
    drop(sockets);
    // Released once the clients go away.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = served.api.metrics(GOOD).await;
        if metric(&metrics, "kernelbox_response_bytes_pending") == 0.0 {
            break;
        }
        assert!(Instant::now() < deadline, "pending bytes never released");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = served.api.run(EVIL, "s0", "print('again')").await;
    assert_eq!(r["output"], "again\n", "{r}");
    served.finish().await;
}

/// A reader taking 4 KiB every half second (8 KiB/s, under a 1 MiB/s minimum: what the
/// socket buffers took counts as read, so a high minimum keeps the test short) is cut once the
/// grace has passed: the server counts the cut, releases the bytes at once and closes the
/// connection, so the client never gets the whole body. Before the minimum rate such a reader
/// held its response for as long as it kept reading.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_reader_is_cut_after_the_grace() {
    let (served, _dir) = start(
        "unread-trickle",
        &[
            "--min-send-rate",
            "1m",
            "--send-rate-grace",
            "3s",
            "--send-timeout",
            "300s",
        ],
    )
    .await;
    let addr = addr_of(&served);
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(16 * 1024).expect("rcvbuf");
    let mut stream = socket.connect(addr).await.expect("connect");
    stream
        .write_all(&execute_request(EVIL, "t", BIG))
        .await
        .expect("send");
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    // Trickle until the server says it cut the response (at most 60 s).
    loop {
        let n = tokio::time::timeout(Duration::from_secs(120), stream.read(&mut buf))
            .await
            .expect("a read within 120 s")
            .expect("read");
        got.extend_from_slice(&buf[..n]);
        let metrics = served.api.metrics(GOOD).await;
        if metric(&metrics, "kernelbox_responses_cut_total") >= 1.0 {
            assert_eq!(metric(&metrics, "kernelbox_response_bytes_pending"), 0.0);
            break;
        }
        assert!(
            n > 0 && started.elapsed() < Duration::from_secs(60),
            "not cut after {:?} ({} bytes read)",
            started.elapsed(),
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let cut_after = started.elapsed();
    // Now read fast: the connection ends before the whole body.
    let rest = tokio::time::timeout(Duration::from_secs(30), async {
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest).await;
        rest
    })
    .await
    .expect("the connection is closed within 30 s of the cut");
    got.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&got[..got.len().min(2048)]).into_owned();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let declared: usize = text
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_string())
        })
        .and_then(|v| v.parse().ok())
        .expect("content-length");
    let head = got
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of head")
        + 4;
    eprintln!(
        "trickle: cut after {cut_after:?}; {} of {declared} body bytes received",
        got.len() - head
    );
    assert!(got.len() - head < declared, "the whole body arrived");
    // The server goes on.
    let r = served.api.run(EVIL, "t", "print('still here')").await;
    assert_eq!(r["output"], "still here\n", "{r}");
    served.finish().await;
}
