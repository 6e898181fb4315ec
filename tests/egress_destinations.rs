//! Which destinations the egress proxy reaches, against a real `kernelbox serve` with the
//! proxy and real kernels (`docs/reliability.md`, "Special and host addresses", "Deny by
//! name"): a range covering everything never reaches the host, its networks or special
//! addresses; the host's own addresses and kernelbox's own API are refused whatever the
//! policy; a name no name entry allows is never looked up; a denied name's address is not
//! reached by its literal. Destinations are servers this test starts on the host (reached, if
//! at all, only through loopback, the host's own address and docker0); nothing is sent off
//! the host.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use hyper::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A tiny HTTP server on `addr` answering every request `hello from PORT`.
async fn http_server(addr: &str) -> u16 {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let body = format!("hello from {port}");
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    port
}

/// Prints one line per URL: the body, or `HTTP CODE: message`, or `ERR ...`.
fn fetch_all(urls: &[String]) -> String {
    let list = urls
        .iter()
        .map(|u| format!("{u:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        r#"
import urllib.request, urllib.error
for url in [{list}]:
    try:
        print(urllib.request.urlopen(url, timeout=15).read().decode())
    except urllib.error.HTTPError as e:
        print(f"HTTP {{e.code}}: {{e.read().decode().strip()}}")
    except Exception as e:
        print(f"ERR {{type(e).__name__}}: {{e}}")
"#
    )
}

/// Runs `urls` in `session` and returns one output line per URL.
async fn fetch(served: &http::Served, session: &str, urls: &[String]) -> Vec<String> {
    let r = served.api.run("token", session, &fetch_all(urls)).await;
    let out = r["output"].as_str().unwrap_or_default().to_string();
    let lines: Vec<String> = out.lines().map(String::from).collect();
    assert_eq!(lines.len(), urls.len(), "{r}");
    lines
}

fn refused(line: &str, reason: &str) -> bool {
    line.contains(&format!("refused ({reason})"))
}

/// The host's own primary address (the source address of its default route; a UDP socket's
/// `connect` sends nothing).
fn host_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("198.51.100.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// docker0's gateway (an address of the host's) and the last address of its network, from
/// the engine's `bridge` network.
async fn docker0() -> Option<(String, String)> {
    let docker = bollard::Docker::connect_with_defaults().ok()?;
    let bridge = docker.inspect_network("bridge", None).await.ok()?;
    bridge.ipam?.config?.into_iter().find_map(|c| {
        let gateway: std::net::Ipv4Addr = c.gateway?.parse().ok()?;
        let (base, len) = c
            .subnet?
            .split_once('/')
            .map(|(b, l)| (b.to_string(), l.to_string()))?;
        let base: std::net::Ipv4Addr = base.parse().ok()?;
        let len: u32 = len.parse().ok().filter(|l| *l <= 30)?;
        let last = std::net::Ipv4Addr::from(u32::from(base) | ((1u32 << (32 - len)) - 2));
        Some((gateway.to_string(), last.to_string()))
    })
}

async fn put_network(served: &http::Served, session: &str, policy: serde_json::Value) {
    let reply = served
        .api
        .send(
            Method::PUT,
            &format!("/v1/sessions/{session}/network"),
            "token",
            false,
            Some(policy),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
}

#[tokio::test]
async fn allowing_everything_never_reaches_the_host_its_networks_or_kernelboxs_own_api() {
    let loopback = http_server("127.0.0.1:0").await;
    // On every host address: the host's own address and docker0's gateway among them.
    let everywhere = http_server("0.0.0.0:0").await;
    let host = host_address()
        .expect("the host has an address of its own")
        .to_string();
    let (docker0, docker0_net) = docker0().await.expect("docker0's gateway and network");
    // The tenant allows everything, and names loopback, the host's address and docker0's
    // gateway explicitly too.
    let allow = [
        "0.0.0.0/0",
        "::/0",
        "127.0.0.0/8",
        host.as_str(),
        docker0.as_str(),
    ];
    let mut args = vec!["--pool", "0"];
    for a in &allow {
        args.extend(["--network-allow", a]);
    }
    let served = http::Served::start("egress-host", "token", &args).await;
    let api_port = served
        .api
        .base
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();

    // Loopback named explicitly is reached; the host's own addresses and kernelbox's own
    // API are refused even so.
    let urls = [
        format!("http://127.0.0.1:{loopback}/"),
        format!("http://127.0.0.1:{api_port}/v1/health"),
        format!("http://{host}:{everywhere}/"),
        format!("http://{docker0}:{everywhere}/"),
        format!("http://0.0.0.0:{everywhere}/"),
    ];
    let lines = fetch(&served, "explicit", &urls).await;
    assert_eq!(lines[0], format!("hello from {loopback}"), "{lines:?}");
    for (url, line) in urls.iter().zip(&lines).skip(1) {
        assert!(refused(line, "host_address"), "{url}: {line}");
    }

    // A session allowed only `0.0.0.0/0` and `::/0` (within the tenant's): special addresses
    // need their own allowance, a range covering them wholesale is none.
    put_network(&served, "broad", json!({"allow": ["0.0.0.0/0", "::/0"]})).await;
    let urls = [
        format!("http://127.0.0.1:{loopback}/"),
        format!("http://[::1]:{loopback}/"),
        // docker0's network (the last address of the engine's default bridge).
        format!("http://{docker0_net}:{everywhere}/"),
        format!("http://{host}:{everywhere}/"),
    ];
    let lines = fetch(&served, "broad", &urls).await;
    for (url, line) in urls.iter().zip(&lines).take(3) {
        assert!(refused(line, "private_address"), "{url}: {line}");
    }
    assert!(refused(&lines[3], "host_address"), "{lines:?}");
    let metrics = served.api.metrics("token").await;
    for (reason, n) in [("host_address", 5), ("private_address", 3)] {
        let line = format!(
            "kernelbox_egress_refusals_total{{tenant=\"default\",reason=\"{reason}\"}} {n}"
        );
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    served.finish().await;
}

/// The metric line of the names the proxy looked up for the default tenant.
fn lookups(n: u64) -> String {
    format!("kernelbox_egress_lookups_total{{tenant=\"default\"}} {n}")
}

#[tokio::test]
async fn a_name_no_name_entry_allows_is_never_looked_up_and_a_denied_names_address_stays_denied() {
    let port = http_server("0.0.0.0:0").await;
    let served = http::Served::start(
        "egress-dns",
        "token",
        &[
            "--pool",
            "0",
            "--network-allow",
            "0.0.0.0/0",
            "--network-allow",
            "::/0",
            "--network-allow",
            "127.0.0.0/8",
            // `localhost` may resolve to ::1 too.
            "--network-allow",
            "::1",
            "--network-allow",
            "localhost",
        ],
    )
    .await;

    // Data in a name the policy does not list: refused before any lookup (the address ranges
    // are no reason to resolve it), over plain HTTP and CONNECT alike.
    // An address literal with a trailing dot is that address, never a name to look up.
    let urls = [
        "http://secret-4f2a9c.exfil.kernelbox-test.invalid/".to_string(),
        "https://secret-77d0e1.exfil.kernelbox-test.invalid/".to_string(),
        format!("http://127.0.0.1.:{port}/"),
    ];
    let lines = fetch(&served, "s", &urls).await;
    assert!(refused(&lines[0], "not_allowed"), "{lines:?}");
    assert!(lines[1].contains("403"), "{lines:?}");
    assert_eq!(lines[2], format!("hello from {port}"), "{lines:?}");
    let metrics = served.api.metrics("token").await;
    assert!(metrics.contains(&lookups(0)), "{metrics}");
    assert!(
        metrics.contains(
            "kernelbox_egress_refusals_total{tenant=\"default\",reason=\"not_allowed\"} 2"
        ),
        "{metrics}"
    );

    // A name the policy lists is looked up (and counted): the counter does count lookups.
    let lines = fetch(&served, "s", &[format!("http://localhost:{port}/")]).await;
    assert_eq!(lines[0], format!("hello from {port}"), "{lines:?}");
    let metrics = served.api.metrics("token").await;
    assert!(metrics.contains(&lookups(1)), "{metrics}");

    // A session denying `localhost` within an allowed range: its address by literal is
    // denied too; another loopback address stays reachable.
    put_network(
        &served,
        "deny",
        json!({"allow": ["127.0.0.0/8", "localhost"], "deny": ["localhost"]}),
    )
    .await;
    let urls = [
        format!("http://localhost:{port}/"),
        format!("http://127.0.0.1:{port}/"),
        format!("http://127.0.0.2:{port}/"),
    ];
    let lines = fetch(&served, "deny", &urls).await;
    assert!(refused(&lines[0], "denied"), "{lines:?}");
    assert!(refused(&lines[1], "denied"), "{lines:?}");
    assert_eq!(lines[2], format!("hello from {port}"), "{lines:?}");
    served.finish().await;
}

/// A tenant filling the proxy's cache of denied names' addresses (4,096 names,
/// `docs/reliability.md`, "Deny by name") with its own session's deny entries never makes the
/// operator's denied name reachable by its address: each judgement's answer counts every
/// denied name of its grant, however full the cache.
#[tokio::test]
async fn a_full_denied_names_cache_never_lets_a_denied_names_address_through() {
    let port = http_server("127.0.0.1:0").await;
    let served = http::Served::start(
        "egress-deny-cache",
        "token",
        &[
            "--pool",
            "0",
            "--network-allow",
            "127.0.0.0/8",
            "--network-deny",
            "localhost",
        ],
    )
    .await;
    let url = [format!("http://127.0.0.1:{port}/")];
    // 17 policies of 255 denied names each (names the resolver answers without asking DNS:
    // `0x5.17` is 5.0.0.17), each judged once: more names than the cache keeps.
    for k in 0..17 {
        let deny: Vec<String> = (0..255).map(|i| format!("0x{:x}.{i}", k + 1)).collect();
        put_network(
            &served,
            "filler",
            json!({"allow": ["127.0.0.0/8"], "deny": deny}),
        )
        .await;
        let lines = fetch(&served, "filler", &url).await;
        assert!(refused(&lines[0], "denied"), "policy {k}: {lines:?}");
    }
    served.finish().await;
}

/// True when a connection to `127.0.0.1:port` is waiting for its SYN to be answered (the
/// proxy's connect, held by a full accept queue).
fn connect_waiting(port: u16) -> bool {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let remote = format!("0100007F:{port:04X}");
    tcp.lines().skip(1).any(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        f.len() > 3 && f[2] == remote && f[3] == "02"
    })
}

/// A session's policy narrowed while the proxy is still connecting to a destination it judged
/// under the old one applies to that connection: it is refused `policy_changed`, never
/// served (`docs/reliability.md`, "Network egress").
#[tokio::test]
async fn a_policy_narrowed_while_the_proxy_connects_applies_to_that_connection() {
    // A listener whose accept queue (of one) a connection of the test's fills: the proxy's
    // connect waits, its SYN unanswered, until the test accepts that one.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(0).unwrap();
    let port = listener.local_addr().unwrap().port();
    let filler = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let served = http::Served::start(
        "egress-toctou",
        "token",
        &["--pool", "0", "--network-allow", "127.0.0.0/8"],
    )
    .await;
    put_network(&served, "s", json!({"allow": ["127.0.0.0/8"]})).await;
    let api = served.api.clone();
    let url = format!("http://127.0.0.1:{port}/");
    let cell = tokio::spawn(async move {
        let r = api.run("token", "s", &fetch_all(&[url])).await;
        r["output"].as_str().unwrap_or_default().trim().to_string()
    });
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
    while !connect_waiting(port) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the proxy never connected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The session no longer allows 127.0.0.1, then the proxy's connect completes.
    put_network(&served, "s", json!({"allow": ["127.0.0.2"]})).await;
    let (first, _) = listener.accept().await.unwrap();
    drop((first, filler));
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\nconnection: close\r\n\r\nreached",
                )
                .await;
        }
    });
    let line = cell.await.unwrap();
    assert!(refused(&line, "policy_changed"), "{line}");
    served.finish().await;
}
