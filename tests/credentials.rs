//! Credentials added at the boundary against the real engine and the real proxy
//! (`docs/reliability.md`, "Credentials at the boundary"). Destinations are HTTPS servers this
//! test starts on the host's loopback with a test CA of its own (`localhost` and `vm` both
//! name 127.0.0.1 here), reached through the explicit-loopback allow rule.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::Case;
use kernelbox::config::{CredentialsConfig, EgressConfig};
use kernelbox::egress::secrets::Secrets;
use kernelbox::wire::NetworkPolicy;
use kernelbox::{CellStatus, ExecuteRequest, Scope};
use serde_json::json;

/// What one test server saw: (path, Host header, Authorization, x-api-key).
type Seen = Arc<Mutex<Vec<(String, String, String, String)>>>;

fn ca(name: &str) -> (rcgen::Issuer<'static, rcgen::KeyPair>, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    (rcgen::Issuer::new(params, key), cert.pem())
}

/// An HTTPS server on 127.0.0.1 with a certificate for `localhost`, `vm` and 127.0.0.1 signed
/// by `issuer`: answers `/redirect` with a redirect to `vm`, everything else with what it saw
/// (whether a credential came, never its value).
async fn https_server(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, seen: Seen) -> u16 {
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".into(), "vm".into(), "127.0.0.1".into()])
            .unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                    let seen = seen.clone();
                    async move {
                        let h = |n: &str| {
                            req.headers()
                                .get(n)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_string()
                        };
                        let path = req.uri().path().to_string();
                        let (host, auth, key) = (h("host"), h("authorization"), h("x-api-key"));
                        seen.lock().unwrap().push((
                            path.clone(),
                            host.clone(),
                            auth.clone(),
                            key.clone(),
                        ));
                        let mut r = hyper::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(format!(
                                "path={path} host={host} auth={} key={}",
                                if auth.is_empty() { "none" } else { "some" },
                                if key.is_empty() { "none" } else { "some" },
                            )),
                        ));
                        if path == "/redirect" {
                            *r.status_mut() = hyper::StatusCode::FOUND;
                            let to = format!("https://vm:{port}/landing");
                            r.headers_mut().insert("location", to.parse().unwrap());
                        }
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    port
}

const CELL: &str = r#"
import os, ssl, socket, base64, urllib.request, urllib.error, urllib.parse
def fetch(url, headers={}):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=15).read().decode()
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}: {e.read().decode().strip()}"
    except Exception as e:
        return f"ERR {type(e).__name__}: {e}"
def tunnel(host, port, sni=None):
    p = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
    s = socket.create_connection((p.hostname, p.port), timeout=15)
    auth = base64.b64encode(f"{p.username}:{p.password}".encode()).decode()
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
    assert b" 200 " in s.recv(4096)
    return ssl.create_default_context().wrap_socket(s, server_hostname=sni or host)
def issuer(host, port):
    t = tunnel(host, port)
    return dict(x[0] for x in t.getpeercert()["issuer"])["commonName"]
def raw(host, port, head):
    try:
        t = tunnel(host, port)
    except Exception as e:
        return f"ERR {type(e).__name__}"
    t.sendall(head.encode())
    return t.recv(4096).decode(errors="replace").split("\r\n")[0]
"#;

async fn run_as(case: &Case, tenant: &str, code: &str) -> kernelbox::CellResult {
    case.exec(ExecuteRequest {
        scope: Scope::session("s").tenant(tenant),
        ..ExecuteRequest::new("s", code)
    })
    .await
}

/// Every tracing event of this process at every level, to look for secrets in.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn kernels_call_with_keys_they_never_see_and_only_the_rules_host_gets_them() {
    let log = Log::default();
    let writer = log.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .init();

    let (test_ca, test_ca_pem) = ca("kernelbox test CA");
    let (rogue_ca, _) = ca("rogue CA");
    let seen: Seen = Arc::default();
    let rogue_seen: Seen = Arc::default();
    let port = https_server(&test_ca, seen.clone()).await;
    let rogue = https_server(&rogue_ca, rogue_seen.clone()).await;
    // The same host on another port, no rule there: a rule names one port.
    let other_seen: Seen = Arc::default();
    let other = https_server(&test_ca, other_seen.clone()).await;

    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("roots.crt");
    std::fs::write(&bundle, &test_ca_pem).unwrap();
    let key_a = format!("sk-test-a-{}", uuid::Uuid::new_v4().simple());
    let key_b = format!("sk-test-b-{}", uuid::Uuid::new_v4().simple());
    let secrets = Secrets::parse(
        &json!({"tenants": {
            "a": {"secrets": {"KEY": key_a},
                  "rules": [{"host": format!("localhost:{port}"),
                             "headers": {"Authorization": "Bearer ${secrets.KEY}"}},
                            {"host": format!("localhost:{rogue}"),
                             "headers": {"Authorization": "Bearer ${secrets.KEY}"}}]},
            "b": {"secrets": {"KEY": key_b},
                  "rules": [{"host": format!("vm:{port}"), "headers": {"x-api-key": "${secrets.KEY}"}}]}
        }}),
        &|_| None,
    )
    .unwrap();
    let allow = NetworkPolicy {
        allow: [
            format!("localhost:{port}"),
            format!("vm:{port}"),
            format!("127.0.0.1:{port}"),
            format!("localhost:{rogue}"),
            format!("127.0.0.1:{rogue}"),
            format!("localhost:{other}"),
            format!("127.0.0.1:{other}"),
        ]
        .into(),
        deny: vec![],
    };
    let tenants = BTreeMap::from([("a".to_string(), allow.clone()), ("b".to_string(), allow)]);
    let ca_dir = dir.path().join("ca");
    let case = Case::with("creds", |c| {
        c.egress = Some(EgressConfig {
            tenants,
            ca_bundle: bundle.clone(),
            limits: Default::default(),
            audit: None,
            credentials: Some(CredentialsConfig {
                secrets,
                ca_dir: ca_dir.clone(),
                rotate_ca: false,
            }),
        });
    })
    .await;

    let mut outputs = String::new();
    let a = run_as(
        &case,
        "a",
        &format!(
            r#"{CELL}
print("plain", fetch("https://localhost:{port}/plain"))
print("placeholder", fetch("https://localhost:{port}/ph", {{"Authorization": "Bearer ${{secrets.KEY}}"}}))
print("issuer-rule", issuer("localhost", {port}))
print("issuer-tunnel", issuer("vm", {port}))
print("tunnel", fetch("https://vm:{port}/tunnel"))
print("redirect", fetch("https://localhost:{port}/redirect"))
print("host-mismatch", raw("localhost", {port}, "GET /hm HTTP/1.1\r\nHost: vm:{port}\r\n\r\n"))
print("absolute", raw("localhost", {port}, "GET https://vm:{port}/abs HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n"))
print("two-hosts", raw("localhost", {port}, "GET /two HTTP/1.1\r\nHost: localhost:{port}\r\nHost: vm:{port}\r\n\r\n"))
print("userinfo", raw("localhost", {port}, "GET /ui HTTP/1.1\r\nHost: vm@localhost:{port}\r\n\r\n"))
print("other-port", fetch("https://localhost:{other}/other"))
print("issuer-other-port", issuer("localhost", {other}))
import http.client
p = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
c = http.client.HTTPSConnection(p.hostname, p.port, timeout=15)
c.set_tunnel("localhost", {port}, headers={{"Proxy-Authorization": "Basic " + base64.b64encode(f"{{p.username}}:{{p.password}}".encode()).decode()}})
c.request("GET", "/ka1"); r1 = c.getresponse(); r1.read()
c.request("GET", "/ka2", headers={{"Host": "vm:{port}"}}); r2 = c.getresponse(); r2.read()
print("keep-alive", r1.status, r2.status)
try:
    tunnel("localhost", {port}, sni="vm").sendall(b"GET /sni HTTP/1.1\r\nHost: vm\r\n\r\n")
    print("sni-mismatch", "connected")
except Exception as e:
    print("sni-mismatch", "refused", type(e).__name__)
print("rogue", fetch("https://localhost:{rogue}/rogue"))
"#
        ),
    )
    .await;
    assert_eq!(a.status, CellStatus::Success, "{a:?}");
    let out = a.output.clone();
    outputs.push_str(&format!("{a:?}"));
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or("")
            .to_string()
    };
    assert!(line("plain").contains("auth=some"), "{out}");
    assert!(line("placeholder").contains("auth=some"), "{out}");
    assert_eq!(
        line("issuer-rule"),
        "issuer-rule kernelbox egress CA",
        "{out}"
    );
    assert_eq!(
        line("issuer-tunnel"),
        "issuer-tunnel kernelbox test CA",
        "{out}"
    );
    assert!(line("tunnel").contains("auth=none"), "{out}");
    assert!(
        line("redirect").contains("path=/landing") && line("redirect").contains("auth=none"),
        "{out}"
    );
    assert!(line("host-mismatch").contains("421"), "{out}");
    assert!(line("absolute").contains("421"), "{out}");
    assert!(line("two-hosts").contains("421"), "{out}");
    // Userinfo in Host (`vm@localhost`) may name `vm` to a lenient destination.
    assert!(line("userinfo").contains("421"), "{out}");
    assert!(line("other-port").contains("auth=none"), "{out}");
    assert_eq!(
        line("issuer-other-port"),
        "issuer-other-port kernelbox test CA",
        "{out}"
    );
    assert!(
        other_seen.lock().unwrap().iter().all(|s| s.2.is_empty()),
        "the other port got a credential"
    );
    assert!(line("sni-mismatch").contains("refused"), "{out}");
    assert_eq!(line("keep-alive"), "keep-alive 200 421", "{out}");
    assert!(
        line("rogue").contains("HTTP 502") && line("rogue").contains("upstream_tls"),
        "{out}"
    );
    assert!(
        rogue_seen.lock().unwrap().is_empty(),
        "the rogue server got a request"
    );

    // What the servers received: the secret on the rule's host only, never elsewhere.
    let bearer_a = format!("Bearer {key_a}");
    for (path, host, auth, key) in seen.lock().unwrap().iter() {
        let ruled = ["/plain", "/ph", "/redirect", "/ka1"].contains(&path.as_str());
        assert_eq!(ruled, auth == &bearer_a, "{path} {host}");
        assert!(host.starts_with("localhost:") || !ruled, "{path} {host}");
        assert!(key.is_empty(), "{path}");
    }
    for path in ["/hm", "/abs", "/sni", "/ka2", "/two"] {
        assert!(
            !seen.lock().unwrap().iter().any(|s| s.0 == path),
            "{path} reached the server"
        );
    }

    // No trace in the kernel: environment, /proc, files.
    let trace = run_as(
        &case,
        "a",
        r#"
import os, subprocess
needle = "sk-test-"
print("env", any(needle in v for v in os.environ.values()))
found = []
for pid in os.listdir("/proc"):
    if pid.isdigit():
        for f in ("environ", "cmdline"):
            try:
                if needle.encode() in open(f"/proc/{pid}/{f}", "rb").read():
                    found.append(f"/proc/{pid}/{f}")
            except OSError:
                pass
r = subprocess.run(["grep", "-rIl", "--exclude-dir=proc", "--exclude-dir=sys", "--exclude-dir=dev", needle, "/etc", "/tmp", "/home", "/root", "/opt", "/var", "/usr/local", "/srv", "/run"], capture_output=True, text=True)
print("files", found + r.stdout.split())
"#
    )
    .await;
    assert_eq!(trace.status, CellStatus::Success, "{trace:?}");
    assert!(trace.output.contains("env False"), "{trace:?}");
    assert!(trace.output.contains("files []"), "{trace:?}");
    outputs.push_str(&format!("{trace:?}"));

    // Another tenant: its own rule's host only, and never tenant a's key.
    seen.lock().unwrap().clear();
    let b = run_as(
        &case,
        "b",
        &format!(
            r#"{CELL}
print("b-localhost", fetch("https://localhost:{port}/b-localhost"))
print("b-vm", fetch("https://vm:{port}/b-vm"))
"#
        ),
    )
    .await;
    assert_eq!(b.status, CellStatus::Success, "{b:?}");
    assert!(
        b.output
            .contains("b-localhost path=/b-localhost host=localhost"),
        "{b:?}"
    );
    assert!(b.output.contains("auth=none key=none"), "{b:?}");
    assert!(
        b.output.contains("b-vm path=/b-vm host=vm") && b.output.contains("key=some"),
        "{b:?}"
    );
    outputs.push_str(&format!("{b:?}"));
    for (path, _, auth, key) in seen.lock().unwrap().iter() {
        assert!(auth.is_empty(), "{path}");
        assert_eq!(key == &key_b, path == "/b-vm", "{path}");
    }

    // Nothing a cell got back, the kernels' container configuration, nor any log line at any
    // level carries a secret.
    let docker = bollard::Docker::connect_with_defaults().unwrap();
    for id in case.container_ids().await {
        let info = docker.inspect_container(&id, None).await.unwrap();
        outputs.push_str(&format!("{:?}", info.config));
    }
    let logs = String::from_utf8_lossy(&log.0.lock().unwrap()).to_string();
    assert!(logs.contains("TRACE") || logs.contains("DEBUG") || !logs.is_empty());
    for secret in [&key_a, &key_b] {
        assert!(
            !outputs.contains(secret.as_str()),
            "a result or the container holds a secret"
        );
        assert!(!logs.contains(secret.as_str()), "the log holds a secret");
    }
    case.finish().await;
}

#[tokio::test]
async fn the_egress_ca_is_kept_under_the_state_directory_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (state, home) = (dir.path().join("state"), dir.path().join("home"));
    std::fs::create_dir_all(&home).unwrap();
    let secrets = dir.path().join("secrets.json");
    std::fs::write(
        &secrets,
        json!({"tenants": {"default": {"secrets": {"KEY": "sk-x"},
            "rules": [{"host": "api.example.com", "headers": {"Authorization": "Bearer ${secrets.KEY}"}}]}}})
        .to_string(),
    )
    .unwrap();
    let label = common::unique("creds-ca-dir");
    let mut cmd = common::serve_command(&label, "token");
    cmd.arg("--state-dir")
        .arg(&state)
        .args(["--pool", "0", "--network-allow", "api.example.com"])
        .arg("--egress-secrets")
        .arg(&secrets)
        .env("HOME", &home)
        .env_remove("XDG_STATE_HOME")
        .env_remove("KERNELBOX_EGRESS_CA_DIR");
    let (mut process, _addr) = common::spawn_serving(cmd).await;
    assert!(
        state.join("egress-ca").join("egress-ca.crt").is_file(),
        "the CA is in --state-dir"
    );
    assert!(
        !home.join(".local/state/kernelbox/egress-ca").exists(),
        "nothing under HOME"
    );
    let status = common::terminate(&mut process, std::time::Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    common::assert_clean(&common::engine().await, &label).await;
}

/// A reload swaps the credential rules (docs/http-api.md, "Reloading the tenants"): the
/// connections a kernel opens afterwards get the new rule's header, in the same kernel.
#[tokio::test]
async fn a_reload_swaps_the_rules_for_the_next_connection_of_a_live_kernel() {
    let (test_ca, test_ca_pem) = ca("kernelbox test CA");
    let seen: Seen = Arc::default();
    let port = https_server(&test_ca, seen.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("roots.crt");
    std::fs::write(&bundle, &test_ca_pem).unwrap();
    let rule = |header: &str| {
        Secrets::parse(
            &json!({"tenants": {"a": {"secrets": {"KEY": "sk-reload-test"},
                "rules": [{"host": format!("localhost:{port}"), "headers": {header: "${secrets.KEY}"}}]}}}),
            &|_| None,
        )
        .unwrap()
    };
    let allow = NetworkPolicy {
        allow: vec![format!("localhost:{port}"), format!("127.0.0.1:{port}")],
        deny: vec![],
    };
    let ca_dir = dir.path().join("ca");
    let case = Case::with("creds-reload", |c| {
        c.egress = Some(EgressConfig {
            tenants: BTreeMap::from([("a".to_string(), allow)]),
            ca_bundle: bundle.clone(),
            limits: Default::default(),
            audit: None,
            credentials: Some(CredentialsConfig {
                secrets: rule("Authorization"),
                ca_dir: ca_dir.clone(),
                rotate_ca: false,
            }),
        });
    })
    .await;
    let fetch = format!("{CELL}\nprint(fetch('https://localhost:{port}/f'))");
    let before = run_as(&case, "a", &fetch).await;
    assert!(before.output.contains("auth=some key=none"), "{before:?}");

    assert!(case
        .kb
        .sessions()
        .egress()
        .unwrap()
        .set_secrets(rule("x-api-key")));
    let after = run_as(&case, "a", &fetch).await;
    assert!(after.output.contains("auth=none key=some"), "{after:?}");
    assert_eq!(after.kernel.id, before.kernel.id, "the same kernel");
    assert_eq!(seen.lock().unwrap().len(), 2);
    case.finish().await;
}
