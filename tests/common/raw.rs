//! HTTP/1.1 over a raw `TcpStream`, for tests that need to misbehave on the wire (send slowly,
//! send nothing, idle) or see exactly what the server sends. Every read is bounded by a
//! deadline.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The longest any single wait in these helpers may take.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// A parsed response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// The error code of a JSON error body, asserting the status.
    pub fn error(&self, status: u16) -> (String, String) {
        let json = self.json();
        assert_eq!(self.status, status, "{json}");
        (
            json["error"]["code"].as_str().expect("code").to_string(),
            json["error"]["message"]
                .as_str()
                .expect("message")
                .to_string(),
        )
    }
}

pub async fn connect(addr: SocketAddr) -> TcpStream {
    tokio::time::timeout(DEADLINE, TcpStream::connect(addr))
        .await
        .expect("connect within the deadline")
        .expect("connect")
}

/// A request; `Connection: close` when `close`.
pub fn request(method: &str, path: &str, token: Option<&str>, body: &[u8], close: bool) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: kernelbox\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if close {
        head.push_str("Connection: close\r\n");
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// Sends one request with `Connection: close` on a new connection and reads the whole
/// response (to EOF).
pub async fn roundtrip(addr: SocketAddr, request: &[u8]) -> Reply {
    let mut stream = connect(addr).await;
    stream.write_all(request).await.expect("send the request");
    let bytes = until_closed(&mut stream)
        .await
        .expect("the server closes after a Connection: close response");
    parse(&bytes).unwrap_or_else(|| {
        panic!(
            "not a whole HTTP response: {:?}",
            String::from_utf8_lossy(&bytes)
        )
    })
}

pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    roundtrip(addr, &request("GET", path, None, b"", true)).await
}

pub async fn post(addr: SocketAddr, path: &str, token: &str, body: &[u8]) -> Reply {
    roundtrip(addr, &request("POST", path, Some(token), body, true)).await
}

/// Reads until the peer closes the connection (EOF or reset); `None` if it is still open at
/// the deadline. Returns what arrived before the close.
pub async fn until_closed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut buf = [0u8; 8192];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(seen),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one response from a kept-alive connection (the body by Content-Length), within the
/// deadline.
pub async fn read_response(stream: &mut TcpStream) -> Reply {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let mut buf = [0u8; 8192];
    loop {
        if let Some(reply) = parse(&seen) {
            return reply;
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => panic!("no whole response within the deadline"),
            Ok(Ok(0)) => panic!(
                "the connection closed mid-response: {:?}",
                String::from_utf8_lossy(&seen)
            ),
            Ok(Err(e)) => panic!("reading the response: {e}"),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
        }
    }
}

/// Parses one complete response (Content-Length or chunked body); `None` if incomplete.
pub fn parse(bytes: &[u8]) -> Option<Reply> {
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let rest = &bytes[end + 4..];
    let header = |name: &str| {
        head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_ascii_lowercase())
        })
    };
    let body = if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        let mut body = Vec::new();
        let mut at = rest;
        loop {
            let line_end = at.windows(2).position(|w| w == b"\r\n")?;
            let size = usize::from_str_radix(
                String::from_utf8_lossy(&at[..line_end])
                    .split(';')
                    .next()?
                    .trim(),
                16,
            )
            .ok()?;
            at = &at[line_end + 2..];
            if size == 0 {
                break;
            }
            if at.len() < size + 2 {
                return None;
            }
            body.extend_from_slice(&at[..size]);
            at = &at[size + 2..];
        }
        body
    } else {
        let len: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        if rest.len() < len {
            return None;
        }
        rest[..len].to_vec()
    };
    Some(Reply { status, head, body })
}
