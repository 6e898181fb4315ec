//! Network egress by policy against the real engine and the real proxy
//! (`docs/reliability.md`, "Network egress"). Destinations are servers this test starts on
//! the host's loopback, and the real package index for the pip case only.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::collections::BTreeMap;

use common::Case;
use hyper::{Method, StatusCode};
use kernelbox::config::{EgressConfig, DEFAULT_CA_BUNDLE};
use kernelbox::wire::NetworkPolicy;
use kernelbox::{CellStatus, ExecuteRequest, Scope};
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

fn policy(allow: &[&str], deny: &[&str]) -> NetworkPolicy {
    NetworkPolicy {
        allow: allow.iter().map(|s| s.to_string()).collect(),
        deny: deny.iter().map(|s| s.to_string()).collect(),
    }
}

async fn with_egress(name: &str, tenants: BTreeMap<String, NetworkPolicy>) -> Case {
    Case::with(name, |c| {
        c.egress = Some(EgressConfig {
            tenants,
            ca_bundle: DEFAULT_CA_BUNDLE.into(),
            limits: Default::default(),
            audit: None,
            credentials: None,
        });
    })
    .await
}

async fn run_as(case: &Case, tenant: &str, session: &str, code: &str) -> kernelbox::CellResult {
    case.exec(ExecuteRequest {
        scope: Scope::session(session).tenant(tenant),
        ..ExecuteRequest::new(session, code)
    })
    .await
}

const FETCH: &str = r#"
import urllib.request, urllib.error
def fetch(url):
    try:
        return urllib.request.urlopen(url, timeout=15).read().decode()
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}: {e.read().decode().strip()}"
    except Exception as e:
        return f"ERR {type(e).__name__}: {e}"
"#;

async fn docker() -> bollard::Docker {
    bollard::Docker::connect_with_defaults().unwrap()
}

#[tokio::test]
async fn no_policy_is_exactly_network_none() {
    let case = Case::new("egress-none").await;
    let result = case.run("s", "print(1)").await;
    assert_eq!(result.status, CellStatus::Success, "{result:?}");
    let info = docker()
        .await
        .inspect_container(&result.kernel.id, None)
        .await
        .unwrap();
    let host = info.host_config.unwrap();
    assert_eq!(host.network_mode.as_deref(), Some("none"));
    assert_eq!(info.config.unwrap().network_disabled, Some(true));
    case.finish().await;
}

#[tokio::test]
async fn allowed_hosts_pass_and_everything_else_is_refused_clearly() {
    let port = http_server("127.0.0.1:0").await;
    let other = http_server("0.0.0.0:0").await;
    let tenants = BTreeMap::from([
        (
            "a".to_string(),
            policy(
                &[&format!("127.0.0.1:{port}"), &format!("localhost:{port}")],
                &[],
            ),
        ),
        ("b".to_string(), policy(&["example.com"], &[])),
    ]);
    let case = with_egress("egress-http", tenants).await;
    let code = format!(
        "{FETCH}\nprint(fetch('http://127.0.0.1:{port}/'))\nprint(fetch('http://127.0.0.2:{port}/'))\nprint(fetch('https://example.com/'))"
    );
    let r = run_as(&case, "a", "s", &code).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let lines: Vec<&str> = r.output.lines().collect();
    assert_eq!(lines[0], format!("hello from {port}"), "{}", r.output);
    assert!(
        lines[1].contains("HTTP 403") && lines[1].contains("refused (not_allowed)"),
        "{}",
        r.output
    );
    assert!(lines[2].contains("403"), "HTTPS refused: {}", r.output);

    // The kernel is on the egress network, not `none`.
    let info = docker()
        .await
        .inspect_container(&r.kernel.id, None)
        .await
        .unwrap();
    let mode = info.host_config.unwrap().network_mode.unwrap();
    assert!(mode.starts_with("kernelbox-egress-"), "{mode}");

    // A CONNECT to an allowed name whose TLS server name is another host: refused.
    let sni = format!(
        r#"
import os, socket, ssl, base64, urllib.parse
p = urllib.parse.urlparse(os.environ["HTTPS_PROXY"])
s = socket.create_connection((p.hostname, p.port), timeout=10)
auth = base64.b64encode(f"{{p.username}}:{{p.password}}".encode()).decode()
s.sendall(f"CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost:{port}\r\nProxy-Authorization: Basic {{auth}}\r\n\r\n".encode())
print(s.recv(100).split(b"\r\n")[0].decode())
ctx = ssl.create_default_context()
try:
    ctx.wrap_socket(s, server_hostname="evil.example").do_handshake()
    print("handshake")
except Exception as e:
    print("closed", type(e).__name__)
"#
    );
    let r = run_as(&case, "a", "s", &sni).await;
    assert!(
        r.output.contains("200") && r.output.contains("closed"),
        "{}",
        r.output
    );
    let counters = case.kb.sessions().egress().unwrap().counters();
    let a = &counters.iter().find(|(t, _)| t == "a").unwrap().1;
    assert_eq!(a.refusals.get("host_mismatch"), Some(&1), "{a:?}");

    // Raw TCP to any address, the host's other ports, UDP and DNS reach nothing.
    let gw = case.kb.sessions().egress().unwrap().proxy_addr().ip();
    let raw = format!(
        r#"
import socket
for host, port in [("1.1.1.1", 80), ("{gw}", {other}), ("{gw}", 22)]:
    try:
        socket.create_connection((host, port), timeout=2); print("reached", host, port)
    except OSError as e:
        print("no", host, port)
try:
    socket.getaddrinfo("pypi.org", 443); print("resolved")
except OSError:
    print("no dns")
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(2)
try:
    u.sendto(b"x", ("8.8.8.8", 53)); u.recvfrom(10); print("udp answered")
except OSError:
    print("no udp")
"#
    );
    let r = run_as(&case, "a", "s", &raw).await;
    assert!(
        !r.output.contains("reached")
            && !r.output.contains("resolved")
            && !r.output.contains("answered"),
        "{}",
        r.output
    );
    assert_eq!(r.output.matches("no ").count(), 5, "{}", r.output);

    // Tenant a's allow-list never applies to tenant b's kernel.
    let r = run_as(
        &case,
        "b",
        "s",
        &format!("{FETCH}\nprint(fetch('http://127.0.0.1:{port}/'))"),
    )
    .await;
    assert!(r.output.contains("HTTP 403"), "{}", r.output);
    case.finish().await;
}

#[tokio::test]
async fn private_addresses_need_an_explicit_range_and_a_new_policy_applies_at_once() {
    let port = http_server("127.0.0.1:0").await;
    let tenants = BTreeMap::from([(
        "a".to_string(),
        policy(&["localhost", &format!("127.0.0.1:{port}")], &[]),
    )]);
    let case = with_egress("egress-change", tenants).await;
    // `localhost` is allowed by name, but resolves to loopback: only the explicit range passes.
    let code = format!(
        "{FETCH}\nprint(fetch('http://localhost:80/'))\nprint(fetch('http://127.0.0.1:{port}/'))"
    );
    let r = run_as(&case, "a", "s", &code).await;
    assert!(
        r.output.contains("refused (private_address)"),
        "{}",
        r.output
    );
    assert!(
        r.output.contains(&format!("hello from {port}")),
        "{}",
        r.output
    );

    // An open tunnel, then a session policy that no longer allows it: closed at once.
    let open = format!(
        r#"
import os, socket, base64, urllib.parse
p = urllib.parse.urlparse(os.environ["HTTPS_PROXY"])
t = socket.create_connection((p.hostname, p.port), timeout=10)
auth = base64.b64encode(f"{{p.username}}:{{p.password}}".encode()).decode()
t.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nProxy-Authorization: Basic {{auth}}\r\n\r\n".encode())
print(t.recv(100).split(b"\r\n")[0].decode())
"#
    );
    let r = run_as(&case, "a", "s", &open).await;
    assert!(r.output.contains("200"), "{}", r.output);
    let closed = case
        .kb
        .sessions()
        .set_network("a", "s", &policy(&["example.com"], &[]))
        .unwrap();
    assert_eq!(closed, 1);
    let r = run_as(
        &case,
        "a",
        "s",
        &format!("print(t.recv(10))\n{FETCH}\nprint(fetch('http://127.0.0.1:{port}/'))"),
    )
    .await;
    assert!(r.output.starts_with("b''"), "{}", r.output);
    assert!(r.output.contains("refused (not_allowed)"), "{}", r.output);
    case.finish().await;
}

#[tokio::test]
async fn pip_installs_from_the_index_with_the_pypi_preset() {
    let tenants = BTreeMap::from([("a".to_string(), policy(&["pypi"], &[]))]);
    let case = with_egress("egress-pip", tenants).await;
    let r = run_as(&case, "a", "s", PIP_SIX).await;
    assert!(r.output.contains("six 1.16.0"), "{}", r.output);
    case.finish().await;
}

/// `pip install` of a small pure-Python package mid-session, then a plain import: no `site`
/// workaround (the runner put the user site directory on `sys.path` at start).
const PIP_SIX: &str = "import subprocess, sys\ntry:\n    import six\nexcept ImportError:\n    print('not installed yet')\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', 'six==1.16.0'], capture_output=True, text=True)\nprint(r.returncode, r.stdout[-300:], r.stderr[-600:])\nimport six; print('six', six.__version__)";

#[tokio::test]
async fn serve_network_allow_pypi_installs_and_imports_through_the_real_binary() {
    let served = http::Served::start(
        "egress-serve-pypi",
        "token",
        &["--pool", "0", "--network-allow", "pypi"],
    )
    .await;
    let r = served.api.run("token", "s", PIP_SIX).await;
    let out = r["output"].as_str().unwrap();
    assert!(out.starts_with("not installed yet"), "{r}");
    assert!(out.contains("six 1.16.0"), "{r}");
    // Anything else is refused, clearly.
    let code = CALL.replace("URL", "'https://example.com/'");
    let r = served.api.run("token", "s", &code).await;
    assert!(r["output"].as_str().unwrap().contains("403"), "{r}");
    served.finish().await;
}

/// Polls `probe` until it answers (10 s at most): for counters that move when a connection
/// ends, after the cell that made it has returned.
async fn until<T, F: std::future::Future<Output = Option<T>>>(probe: impl Fn() -> F) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "not within 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A tenants file: `a` allowed `allow`, `b` without `network`; the file is kept by the caller.
fn tenants_file(allow: &[String]) -> tempfile::NamedTempFile {
    let mut a = http::tenant("a", "token-a");
    a["network"] = json!({ "allow": allow });
    let text = json!({"tenants": [a, http::tenant("b", "token-b")]}).to_string();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}

const CALL: &str = r#"
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen(URL, timeout=15).read().decode())
except urllib.error.HTTPError as e:
    print(f"HTTP {e.code}: {e.read().decode().strip()}")
except Exception as e:
    print(f"ERR {type(e).__name__}: {e}")
"#;

#[tokio::test]
async fn the_tenants_files_network_reaches_each_tenants_kernels_in_a_real_server() {
    let port = http_server("127.0.0.1:0").await;
    let file = tenants_file(&[format!("127.0.0.1:{port}")]);
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let served = http::Served::start(
        "egress-tenants",
        "unused",
        &[
            "--pool",
            "0",
            "--tenants",
            file.path().to_str().unwrap(),
            "--egress-audit",
            audit.to_str().unwrap(),
        ],
    )
    .await;
    let api = &served.api;
    let code = CALL.replace("URL", &format!("'http://127.0.0.1:{port}/'"));

    // Tenant a, allowed 127.0.0.1:PORT by the file, reaches it.
    let r = api.run("token-a", "s", &code).await;
    assert_eq!(r["output"], format!("hello from {port}\n"), "{r}");
    // Tenant b, with no `network`, has none: a kernel on `none`, no proxy in its environment.
    let r = api.run("token-b", "s", &code).await;
    assert!(r["output"].as_str().unwrap().starts_with("ERR"), "{r}");
    let id = r["kernel"]["id"].as_str().unwrap().to_string();
    let info = docker().await.inspect_container(&id, None).await.unwrap();
    assert_eq!(
        info.host_config.unwrap().network_mode.as_deref(),
        Some("none")
    );

    // A session narrows its tenant's policy (intersected): a's session allowed only
    // example.com loses 127.0.0.1:PORT; it can never widen it.
    let put = |token: &'static str, body: serde_json::Value| {
        let api = api.clone();
        async move {
            api.send(
                Method::PUT,
                "/v1/sessions/s/network",
                token,
                false,
                Some(body),
            )
            .await
        }
    };
    let reply = put("token-a", json!({"allow": ["example.com"]})).await;
    assert_eq!(reply.status, StatusCode::OK, "{:?}", reply.json());
    let r = api.run("token-a", "s", &code).await;
    assert!(
        r["output"]
            .as_str()
            .unwrap()
            .contains("refused (not_allowed)"),
        "{r}"
    );
    let reply = put(
        "token-a",
        json!({"allow": [format!("127.0.0.1:{port}"), "pypi"]}),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK);
    let r = api.run("token-a", "s", &code).await;
    assert_eq!(r["output"], format!("hello from {port}\n"), "{r}");
    // Tenant b has no network: a session policy allowing anything is refused, clearly.
    let reply = put("token-b", json!({"allow": ["pypi"]})).await;
    assert!(
        reply
            .error(StatusCode::BAD_REQUEST)
            .contains("network_not_allowed"),
        "{:?}",
        reply.json()
    );
    let reply = put("token-b", json!({"allow": []})).await;
    assert_eq!(reply.status, StatusCode::OK);

    // Metrics per tenant (a counter moves when its connection ends: polled, 10 s at most).
    let wanted = [
        "kernelbox_egress_connections_total{tenant=\"a\"} 2".to_string(),
        "kernelbox_egress_refusals_total{tenant=\"a\",reason=\"not_allowed\"} 1".to_string(),
        "kernelbox_egress_refusals_total{tenant=\"a\",reason=\"host_mismatch\"} 0".to_string(),
    ];
    let metrics = until(|| async {
        let text = api.metrics("token-a").await;
        wanted
            .iter()
            .all(|w| text.contains(w.as_str()))
            .then_some(text)
    })
    .await;
    let bytes_in = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("kernelbox_egress_bytes_total{tenant=\"a\",direction=\"in\"} ")
        })
        .unwrap();
    assert!(bytes_in.parse::<u64>().unwrap() > 0, "{metrics}");
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("kernelbox_egress") && l.contains("tenant=\"b\"")),
        "no egress series for a tenant without network"
    );
    assert!(!metrics.contains("session="), "never a session label");

    // The audit file: one JSON line per connection.
    let lines = until(|| async {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (lines.len() >= 3).then_some(lines)
    })
    .await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|l| l["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["allowed", "not_allowed", "allowed"], "{lines:?}");
    for line in &lines {
        assert_eq!(line["tenant"], "a");
        assert_eq!(line["session"], "s");
        assert_eq!(line["host"], "127.0.0.1");
        assert_eq!(line["port"], port);
    }
    assert!(lines[0]["bytes_in"].as_u64().unwrap() > 0, "{lines:?}");
    assert!(lines[0]["bytes_out"].as_u64().unwrap() > 0, "{lines:?}");
    served.finish().await;

    // A bad entry in the file: the server does not start, and says which field.
    let bad = tenants_file(&["not a host".into()]);
    let out = common::serve_command(&common::unique("egress-bad"), "unused")
        .args(["--pool", "0", "--tenants", bad.path().to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("tenants[0].network") && stderr.contains("network policy entry"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_kernel_never_reaches_another_kernel_directly_or_through_the_proxy() {
    // Even a tenant allowed every private range: the egress network itself is never a
    // destination (docs/reliability.md, "Network egress").
    let tenants = BTreeMap::from([(
        "a".to_string(),
        policy(&["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"], &[]),
    )]);
    let case = with_egress("egress-peers", tenants).await;
    let listen = "import socket, threading\nsrv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\nsrv.bind(('0.0.0.0', 8000)); srv.listen()\ndef serve():\n    while True:\n        c, _ = srv.accept(); c.sendall(b'HTTP/1.0 200 OK\\r\\n\\r\\npeer'); c.close()\nthreading.Thread(target=serve, daemon=True).start()\nprint(open('/etc/hosts').read().split()[-2])";
    let r = run_as(&case, "a", "one", listen).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let ip = r.output.trim().to_string();
    assert!(ip.parse::<std::net::IpAddr>().is_ok(), "{}", r.output);
    let probe = format!(
        "{FETCH}\nimport socket\ntry:\n    socket.create_connection(('{ip}', 8000), timeout=3); print('reached directly')\nexcept OSError:\n    print('no direct route')\nprint(fetch('http://{ip}:8000/'))"
    );
    let r = run_as(&case, "a", "two", &probe).await;
    assert!(r.output.contains("no direct route"), "{}", r.output);
    assert!(
        r.output.contains("refused (kernel_network)"),
        "{}",
        r.output
    );
    case.finish().await;
}

/// An HTTP server on loopback answering every request with `size` bytes of `x`.
async fn sized_server(size: usize) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {size}\r\nconnection: close\r\n\r\n"
                );
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(&vec![b'x'; size]).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn bytes_through_the_proxy_are_in_the_usage_ledger_of_the_session_that_moved_them() {
    const SIZE: u64 = 100_000;
    let port = sized_server(SIZE as usize).await;
    let allowed = policy(&[&format!("127.0.0.1:{port}")], &[]);
    let tenants = BTreeMap::from([
        ("a".to_string(), allowed.clone()),
        ("b".to_string(), allowed),
    ]);
    let case = with_egress("egress-usage", tenants).await;
    let code =
        format!("{FETCH}\nprint([len(fetch('http://127.0.0.1:{port}/')) for _ in range(3)])");
    let r = run_as(&case, "a", "mover", &code).await;
    assert_eq!(r.output, format!("[{SIZE}, {SIZE}, {SIZE}]\n"), "{r:?}");
    let quiet = run_as(&case, "b", "still", "x = 1").await;
    assert_eq!(quiet.status, CellStatus::Success, "{quiet:?}");
    let now = kernelbox::clock::unix_now();
    // A connection is counted when it ends, just after the cell that read it returned.
    let row = until(|| async {
        let rows = case
            .kb
            .usage(
                None,
                now - 3600,
                now + 1,
                kernelbox::usage::GroupBy::Session,
            )
            .await
            .unwrap();
        rows.into_iter()
            .find(|r| r.session == "mover" && r.network_bytes_in >= 3 * SIZE)
    })
    .await;
    assert_eq!(row.tenant, "a");
    // The bodies and the response heads; the requests went out.
    assert!(row.network_bytes_in < 3 * SIZE + 3 * 1024, "{row:?}");
    assert!(
        (3 * 30..3 * 1024).contains(&row.network_bytes_out),
        "{row:?}"
    );
    let rows = case
        .kb
        .usage(
            Some("b"),
            now - 3600,
            now + 1,
            kernelbox::usage::GroupBy::Session,
        )
        .await
        .unwrap();
    assert!(
        rows.iter()
            .all(|r| r.network_bytes_in == 0 && r.network_bytes_out == 0),
        "{rows:?}"
    );
    case.finish().await;
}

/// An HTTP server on loopback that answers one request with `2 * half` bytes of `x`: the
/// first half at once, the second when `rest` fires, then closes.
async fn halting_server(half: usize, rest: tokio::sync::oneshot::Receiver<()>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        let mut buf = [0u8; 4096];
        let _ = s.read(&mut buf).await;
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            2 * half
        );
        let _ = s.write_all(head.as_bytes()).await;
        let _ = s.write_all(&vec![b'x'; half]).await;
        let _ = rest.await;
        let _ = s.write_all(&vec![b'x'; half]).await;
    });
    port
}

#[tokio::test]
async fn an_open_connections_bytes_reach_the_ledger_before_it_ends_and_only_once() {
    const HALF: u64 = 200_000;
    let (go, rest) = tokio::sync::oneshot::channel();
    let port = halting_server(HALF as usize, rest).await;
    let tenants = BTreeMap::from([(
        "a".to_string(),
        policy(&[&format!("127.0.0.1:{port}")], &[]),
    )]);
    let case = with_egress("egress-open-usage", tenants).await;
    let open = format!(
        "import urllib.request\n\
         resp = urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=30)\n\
         print(len(resp.read({HALF})))"
    );
    let r = run_as(&case, "a", "open", &open).await;
    assert_eq!(r.output, format!("{HALF}\n"), "{r:?}");
    let now = kernelbox::clock::unix_now();
    let bytes_in = || async {
        case.kb
            .usage(
                Some("a"),
                now - 3600,
                now + 3600,
                kernelbox::usage::GroupBy::Session,
            )
            .await
            .unwrap()
            .iter()
            .filter(|r| r.session == "open")
            .map(|r| r.network_bytes_in)
            .sum::<u64>()
    };
    // The connection is still open: a report (which flushes the ledger) already has its bytes.
    let so_far = bytes_in().await;
    assert!(
        (HALF..HALF + 1024).contains(&so_far),
        "{so_far} bytes counted while the connection is open"
    );
    // The rest, then the end: counted once, not twice.
    let _ = go.send(());
    let r = run_as(&case, "a", "open", "print(len(resp.read()))").await;
    assert_eq!(r.output, format!("{HALF}\n"), "{r:?}");
    let total = until(|| async {
        let n = bytes_in().await;
        (n >= 2 * HALF).then_some(n)
    })
    .await;
    assert!(
        total < 2 * HALF + 1024,
        "{total} bytes for {} sent",
        2 * HALF
    );
    case.finish().await;
}

#[tokio::test]
async fn repeated_refusals_are_one_counted_line_in_the_audit_file() {
    let port = http_server("127.0.0.1:0").await;
    let file = tenants_file(&[format!("127.0.0.1:{port}")]);
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let served = http::Served::start(
        "egress-audit-repeats",
        "unused",
        &[
            "--pool",
            "0",
            "--tenants",
            file.path().to_str().unwrap(),
            "--egress-audit",
            audit.to_str().unwrap(),
        ],
    )
    .await;
    // 200 requests to a destination the policy refuses, and one allowed.
    let code = format!(
        "{FETCH}\nrefused = [fetch('http://127.0.0.2:{port}/') for _ in range(200)]\nprint(sum('refused (not_allowed)' in r for r in refused))\nprint(fetch('http://127.0.0.1:{port}/'))"
    );
    let r = served.api.run("token-a", "s", &code).await;
    assert_eq!(r["output"], format!("200\nhello from {port}\n"), "{r}");
    // The first refusal is written at once; the others are one counted line when the
    // repeat window ends (10 s after the first).
    let lines = until_long(|| async {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        lines
            .iter()
            .any(|l| l.get("count").is_some())
            .then_some(lines)
    })
    .await;
    let refused: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["outcome"] == "not_allowed")
        .collect();
    assert_eq!(refused.len(), 2, "{lines:?}");
    assert!(refused[0].get("count").is_none(), "{lines:?}");
    assert_eq!(refused[1]["count"], 199, "{lines:?}");
    assert_eq!(refused[1]["host"], "127.0.0.2");
    assert_eq!(refused[1]["port"], port);
    assert_eq!(refused[1]["session"], "s");
    assert!(
        refused[1]["first"].as_f64().unwrap() <= refused[1]["time"].as_f64().unwrap(),
        "{lines:?}"
    );
    let allowed = lines.iter().filter(|l| l["outcome"] == "allowed").count();
    assert_eq!(allowed, 1, "{lines:?}");
    served.finish().await;
}

#[tokio::test]
async fn the_audit_files_pending_counts_are_written_at_shutdown() {
    let port = http_server("127.0.0.1:0").await;
    let file = tenants_file(&[format!("127.0.0.1:{port}")]);
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let served = http::Served::start(
        "egress-audit-shutdown",
        "unused",
        &[
            "--pool",
            "0",
            "--tenants",
            file.path().to_str().unwrap(),
            "--egress-audit",
            audit.to_str().unwrap(),
        ],
    )
    .await;
    // 50 refusals, then the server stops at once, within their repeat window: the 49 counted
    // after the first are still written, as one counted line. And a refused CONNECT naming a
    // 15,000-byte host: its line (and its key in the counting table) keeps 255 bytes of it.
    let code = format!(
        r#"{FETCH}
refused = [fetch('http://127.0.0.2:{port}/') for _ in range(50)]
print(sum('refused (not_allowed)' in r for r in refused))
import base64, os, socket, urllib.parse
p = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
auth = base64.b64encode(f"{{p.username}}:{{p.password}}".encode()).decode()
s = socket.create_connection((p.hostname, p.port), timeout=10)
s.sendall(f"CONNECT {{'a' * 15000}}.example:443 HTTP/1.1\r\nProxy-Authorization: Basic {{auth}}\r\n\r\n".encode())
print(s.recv(4096).split(b"\r\n")[0].decode())"#
    );
    let r = served.api.run("token-a", "s", &code).await;
    assert_eq!(r["output"], "50\nHTTP/1.1 403 Forbidden\n", "{r}");
    served.finish().await;
    let text = std::fs::read_to_string(&audit).unwrap();
    let refused: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["outcome"] == "not_allowed")
        .collect();
    assert_eq!(refused.len(), 3, "{text}");
    let counted: Vec<_> = refused
        .iter()
        .filter(|l| l.get("count").is_some())
        .collect();
    assert_eq!(counted.len(), 1, "{text}");
    assert_eq!(counted[0]["count"], 49, "{text}");
    assert_eq!(counted[0]["host"], "127.0.0.2", "{text}");
    let long = refused
        .iter()
        .find(|l| l["port"] == 443)
        .and_then(|l| l["host"].as_str())
        .unwrap_or_else(|| panic!("{text}"));
    assert_eq!(long, format!("{}...", "a".repeat(255)), "{text}");
}

/// [`until`] with 30 s: for the audit file's counted lines, written when their window ends.
async fn until_long<T, F: std::future::Future<Output = Option<T>>>(probe: impl Fn() -> F) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "not within 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[test]
fn the_egress_audit_file_rotates_and_keeps_its_last_files() {
    use kernelbox::egress::proxy::{AuditFile, AuditLine, Rotation};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("egress.jsonl");
    let rotation = Rotation {
        bytes: 4096,
        keep: 3,
    };
    let file = AuditFile::open_with(&path, rotation, std::time::Duration::from_secs(60)).unwrap();
    let mut queued = 0;
    for i in 0..2000u16 {
        // Allowed connections, each its own line; refusals of one destination, collapsed.
        let line = AuditLine {
            tenant: "a".into(),
            session: "s".into(),
            host: format!("h{i}.example"),
            port: 443,
            bytes_out: 1,
            bytes_in: 2,
            outcome: "allowed",
        };
        if file.record(&line) {
            queued += 1;
        }
        let refused = AuditLine {
            host: "refused.example".into(),
            outcome: "not_allowed",
            ..line
        };
        assert!(file.record(&refused), "a refusal is written or counted");
        // The writer keeps up: never more than its backlog waiting.
        if i % 256 == 0 {
            std::thread::yield_now();
        }
    }
    file.close();
    assert!(queued > 0);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "egress.jsonl",
            "egress.jsonl.1",
            "egress.jsonl.2",
            "egress.jsonl.3"
        ],
        "the file and at most 3 rotated ones"
    );
    for name in &names {
        let size = std::fs::metadata(dir.path().join(name)).unwrap().len();
        assert!(size <= 4096, "{name} is {size} bytes");
    }
    // The current file ends with the counted line of the 1,999 refusals after the first
    // (written when the writer stopped), their bytes summed.
    let text = std::fs::read_to_string(&path).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["outcome"], "not_allowed", "{last}");
    assert_eq!(last["count"], 1999, "{last}");
    assert_eq!(last["bytes_in"], 2 * 1999, "{last}");
}

#[tokio::test]
async fn the_firewall_admits_the_proxys_port_on_the_gateway_only_and_one_host_header() {
    let port = http_server("127.0.0.1:0").await;
    let tenants = BTreeMap::from([(
        "a".to_string(),
        policy(&[&format!("127.0.0.1:{port}")], &[]),
    )]);
    let case = with_egress("egress-gateway", tenants).await;
    let egress = case.kb.sessions().egress().unwrap();
    let proxy = egress.proxy_addr();
    // The firewall's chain admits TCP to the proxy's port on the gateway's address only: no
    // other address of the host (docker0's, the host's own) at that port.
    let chain = kernelbox::egress::network::Names::of_network(egress.network_name())
        .unwrap()
        .chain;
    let rules = std::process::Command::new("iptables")
        .args(["-w", "-S", &chain])
        .output()
        .unwrap();
    let rules = String::from_utf8_lossy(&rules.stdout).to_string();
    let accepts: Vec<&str> = rules.lines().filter(|l| l.contains("-j ACCEPT")).collect();
    assert_eq!(accepts.len(), 1, "{rules}");
    assert!(
        accepts[0].contains(&format!("-d {}/32", proxy.ip()))
            && accepts[0].contains(&format!("--dport {}", proxy.port())),
        "{rules}"
    );
    assert!(
        rules.lines().last().unwrap().ends_with("-j DROP"),
        "{rules}"
    );
    let code = format!(
        r#"
import base64, os, socket, urllib.parse
p = urllib.parse.urlsplit(os.environ["HTTP_PROXY"])
auth = base64.b64encode(f"{{p.username}}:{{p.password}}".encode()).decode()
def ask(head):
    s = socket.create_connection((p.hostname, p.port), timeout=10)
    s.sendall(head.replace("AUTH", auth).encode())
    return s.recv(4096).split(b"\r\n")[0].decode()
print("one", ask("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nProxy-Authorization: Basic AUTH\r\n\r\n"))
print("two", ask("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.example\r\nProxy-Authorization: Basic AUTH\r\n\r\n"))
print("connect-other", ask("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: evil.example:443\r\nProxy-Authorization: Basic AUTH\r\n\r\n"))
print("connect-bare", ask("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1\r\nProxy-Authorization: Basic AUTH\r\n\r\n"))
print("userinfo", ask("GET http://127.0.0.1:{port}/ HTTP/1.1\r\nHost: evil.example@127.0.0.1:{port}\r\nProxy-Authorization: Basic AUTH\r\n\r\n"))
print("connect-userinfo", ask("CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: evil.example@127.0.0.1:{port}\r\nProxy-Authorization: Basic AUTH\r\n\r\n"))
"#
    );
    let r = run_as(&case, "a", "s", &code).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let out = &r.output;
    assert!(out.contains("one HTTP/1.1 200"), "{out}");
    assert!(out.contains("two HTTP/1.1 400"), "{out}");
    assert!(out.contains("connect-other HTTP/1.1 400"), "{out}");
    assert!(out.contains("connect-bare HTTP/1.1 200"), "{out}");
    // A Host with userinfo names another host to a lenient destination: refused too.
    assert!(out.contains("userinfo HTTP/1.1 400"), "{out}");
    assert!(out.contains("connect-userinfo HTTP/1.1 400"), "{out}");
    let counters = egress.counters();
    let a = &counters.iter().find(|(t, _)| t == "a").unwrap().1;
    assert_eq!(a.refusals.get("host_mismatch"), Some(&4), "{a:?}");
    case.finish().await;
}

/// The resident memory of process `pid`, in KiB (`VmRSS` in `/proc/PID/status`).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// A session policy of 255 deny entries of 253 bytes each (distinct host names) and one
/// allow entry: 256, the most one policy holds.
fn big_policy(tag: usize) -> serde_json::Value {
    let deny: Vec<String> = (0..255)
        .map(|i| {
            let first = format!("e{tag}x{i}");
            let first = format!("{first}{}", "a".repeat(63 - first.len()));
            format!(
                "{first}.{}.{}.{}",
                "b".repeat(63),
                "c".repeat(63),
                "d".repeat(61)
            )
        })
        .collect();
    assert!(deny.iter().all(|d| d.len() == 253));
    json!({"allow": ["example.com"], "deny": deny})
}

/// Sessions' own policies are bounded in bytes per tenant (docs/reliability.md, "Network
/// egress"): past the bound a new one is refused (429), another tenant is not touched; a
/// tenant with no network has none kept (400, nothing stored); deleting a session forgets its
/// policy, which gives its bytes back and lets its next kernel have the tenant's policy.
#[tokio::test]
async fn session_policies_are_bounded_per_tenant_refused_without_network_and_forgotten_with_their_session(
) {
    let port = http_server("127.0.0.1:0").await;
    let file = tenants_file(&[format!("127.0.0.1:{port}")]);
    let served = http::Served::start(
        "egress-session-bounds",
        "unused",
        &["--pool", "0", "--tenants", file.path().to_str().unwrap()],
    )
    .await;
    let api = &served.api;
    let pid = served.process.id().unwrap();
    let put = |token: &'static str, session: String, body: serde_json::Value| {
        let api = api.clone();
        async move {
            api.send(
                Method::PUT,
                &format!("/v1/sessions/{session}/network"),
                token,
                false,
                Some(body),
            )
            .await
        }
    };

    // Tenant b has no network: not even a deny-only policy is kept.
    let r = put("token-b", "s".into(), json!({"deny": ["example.com"]})).await;
    assert!(
        r.error(StatusCode::BAD_REQUEST)
            .contains("network_not_allowed"),
        "{:?}",
        r.json()
    );

    // Tenant a: as many big policies as its bound holds, then 429.
    let wire: NetworkPolicy = serde_json::from_value(big_policy(0)).unwrap();
    let fit =
        kernelbox::egress::MAX_NETWORK_BYTES_PER_TENANT / kernelbox::egress::policy_bytes(&wire);
    let before = rss_kib(pid);
    let mut accepted = 0;
    let refused = loop {
        let r = put("token-a", format!("s{accepted}"), big_policy(accepted)).await;
        if r.status != StatusCode::OK {
            break r;
        }
        accepted += 1;
        assert!(accepted <= fit, "more than {fit} policies kept");
    };
    assert!(
        refused
            .error(StatusCode::TOO_MANY_REQUESTS)
            .contains("too_many_session_policies"),
        "{:?}",
        refused.json()
    );
    assert_eq!(accepted, fit);
    eprintln!(
        "{accepted} policies of 255 x 253-byte entries kept: RSS {before} KiB -> {} KiB",
        rss_kib(pid)
    );
    // Replacing a kept session's own policy is still allowed; another tenant is not touched
    // (b has no network, so its refusal is b's own, not a's bound).
    let r = put("token-a", "s1".into(), big_policy(1)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());

    // A session with a kernel and a narrowing policy: refused by it; deleted, the policy is
    // forgotten (its bytes given back: a new session's policy fits again) and the session's
    // next kernel has the tenant's policy.
    let code = CALL.replace("URL", &format!("'http://127.0.0.1:{port}/'"));
    let r = api.run("token-a", "s0", &code).await;
    assert!(
        r["output"]
            .as_str()
            .unwrap()
            .contains("refused (not_allowed)"),
        "{r}"
    );
    let r = api.delete("/v1/sessions/s0", "token-a").await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let r = put("token-a", "fresh".into(), big_policy(999)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let r = api.run("token-a", "s0", &code).await;
    assert_eq!(r["output"], format!("hello from {port}\n"), "{r}");
    // A session without a kernel is forgotten too (404: it has no kernel).
    let r = api.delete("/v1/sessions/s2", "token-a").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = put("token-a", "fresh2".into(), big_policy(998)).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    served.finish().await;
}

/// A session policy set while the session's kernel starts applies to that kernel (never a
/// 200 that the kernel then runs without): the kernel is held in its start (its container
/// paused as soon as it runs, before the runner says it is ready) while the policy is set.
#[tokio::test]
async fn a_session_policy_set_during_its_kernels_cold_start_applies_to_that_kernel() {
    let port = http_server("127.0.0.1:0").await;
    let file = tenants_file(&[format!("127.0.0.1:{port}")]);
    let served = http::Served::start(
        "egress-cold-start-policy",
        "unused",
        &["--pool", "0", "--tenants", file.path().to_str().unwrap()],
    )
    .await;
    let api = served.api.clone();
    let code = CALL.replace("URL", &format!("'http://127.0.0.1:{port}/'"));
    let cell = tokio::spawn({
        let api = api.clone();
        async move { api.run("token-a", "cold", &code).await }
    });
    let docker = docker().await;
    // The kernel's container, once it runs (a generous deadline: the machine is shared).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let id = loop {
        let found = common::containers(&served.engine, &served.label)
            .await
            .into_iter()
            .find(|c| {
                c.state == "running"
                    && c.labels.get("io.kernelbox.session").map(String::as_str) == Some("cold")
            });
        if let Some(c) = found {
            break c.id;
        }
        assert!(std::time::Instant::now() < deadline, "no kernel container");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    docker.pause_container(&id).await.unwrap();
    let r = api
        .send(
            Method::PUT,
            "/v1/sessions/cold/network",
            "token-a",
            false,
            Some(json!({"allow": ["example.com"]})),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    docker.unpause_container(&id).await.unwrap();
    let r = cell.await.unwrap();
    assert!(
        r["output"]
            .as_str()
            .unwrap()
            .contains("refused (not_allowed)"),
        "the policy set during the start applies: {r}"
    );
    served.finish().await;
}

/// The cell's half of a tunnel opened as `t`: its answer, then a TLS ClientHello (no server
/// name: the CONNECT names an address) and how many bytes come back.
const HELLO_THEN_READ: &str = r#"
import ssl
print(t.recv(100).split(b"\r\n")[0].decode())
inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
o = ctx.wrap_bio(inc, out)
try:
    o.do_handshake()
except ssl.SSLWantReadError:
    pass
try:
    t.sendall(out.read())
    print("got", len(t.recv(10)), "bytes")
except OSError as e:
    print("got 0 bytes", type(e).__name__)
"#;

/// Whether some socket of this network namespace is connecting (`SYN_SENT`) to
/// `127.0.0.1:port` (`/proc/net/tcp`).
fn connecting_to(port: u16) -> bool {
    let remote = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap()
        .lines()
        .skip(1)
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(2) == Some(&remote.as_str()) && f.get(3) == Some(&"02")
        })
}

/// A connection still being made when a narrowing session policy is set (judged under the
/// old policy, its upstream not yet connected) is judged again under the new one once
/// connected and refused: it never outlives the narrowing (docs/reliability.md, "Network egress"). The upstream's accept
/// queue is full, so the proxy's connect waits until the test accepts.
#[tokio::test]
async fn a_connection_being_made_when_a_narrowing_policy_is_set_is_judged_again() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let port = listener.local_addr().unwrap().port();
    // Two connections fill a backlog of 1: the next one's SYN is dropped until an accept.
    let _fillers = [
        std::net::TcpStream::connect(("127.0.0.1", port)).unwrap(),
        std::net::TcpStream::connect(("127.0.0.1", port)).unwrap(),
    ];
    let tenants = BTreeMap::from([(
        "a".to_string(),
        policy(&["example.com", &format!("127.0.0.1:{port}")], &[]),
    )]);
    let case = with_egress("egress-narrow-race", tenants).await;
    let open = format!(
        r#"
import os, socket, base64, urllib.parse
p = urllib.parse.urlparse(os.environ["HTTPS_PROXY"])
t = socket.create_connection((p.hostname, p.port), timeout=30)
auth = base64.b64encode(f"{{p.username}}:{{p.password}}".encode()).decode()
t.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nProxy-Authorization: Basic {{auth}}\r\n\r\n".encode())
print("sent")
"#
    );
    let r = run_as(&case, "a", "s", &open).await;
    assert!(r.output.contains("sent"), "{}", r.output);
    // The proxy judged the CONNECT and is connecting upstream: narrow the session now.
    until(|| async { connecting_to(port).then_some(()) }).await;
    let closed = case
        .kb
        .sessions()
        .set_network("a", "s", &policy(&["example.com"], &[]))
        .unwrap();
    assert_eq!(closed, 0);
    // Let the proxy's connection in and echo what it sends.
    let echo = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            if held.len() < 2 {
                held.push(s);
                continue;
            }
            let mut buf = [0u8; 4];
            if s.read_exact(&mut buf).await.is_ok() {
                let _ = s.write_all(&buf).await;
            }
            return;
        }
    });
    let r = run_as(&case, "a", "s", HELLO_THEN_READ).await;
    let lines: Vec<&str> = r.output.lines().collect();
    // Judged again once connected, under the narrowed policy: refused (`policy_changed`), no
    // tunnel, so nothing the cell sends reaches the upstream.
    assert_eq!(lines[0], "HTTP/1.1 403 Forbidden", "{}", r.output);
    echo.abort();
    case.finish().await;
}
