//! Reloading the tenants of a real `kernelbox serve` without a restart (docs/http-api.md,
//! "Reloading the tenants"): the tenants file edited, then SIGHUP or `POST /v1/admin/reload`.
//! A tenant added, a token rotated, a network policy narrowed (a live tunnel closed), a tenant
//! removed (its containers gone, its owner told `tenant_removed` when it comes back), while
//! another tenant's kernel keeps its state; an invalid edit is refused whole. A file past the
//! size limit (or `/dev/zero`) is refused unread; a reload whose client hangs up runs to its
//! end; a kernel starting while its tenant's network is narrowed gets the narrowed policy; a
//! removed tenant's request whose body was still arriving is refused, an upload too (never
//! committed). A tenant removed then added back under its name inherits neither its sessions'
//! settings and network policies nor its MCP sessions.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::time::Duration;

use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

const ADMIN: &str = "admin-reload-token";

/// A tiny HTTP server on loopback answering every request `hello from PORT`.
async fn http_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let body = format!("hello from {port}");
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes()).await;
            });
        }
    });
    port
}

/// A tenant entry allowed `allow` (no `network` when empty).
fn tenant(name: &str, token: &str, allow: &[String]) -> Value {
    let mut t = http::tenant(name, token);
    if !allow.is_empty() {
        t["network"] = json!({ "allow": allow });
    }
    t
}

fn write(file: &std::path::Path, tenants: &[Value]) {
    std::fs::write(file, json!({ "tenants": tenants }).to_string()).unwrap();
}

/// A cell opening a CONNECT tunnel through the proxy to 127.0.0.1:PORT, kept in `t`.
fn open_tunnel(port: u16) -> String {
    format!(
        r#"
import os, socket, base64, urllib.parse
p = urllib.parse.urlparse(os.environ["HTTPS_PROXY"])
t = socket.create_connection((p.hostname, p.port), timeout=30)
auth = base64.b64encode(f"{{p.username}}:{{p.password}}".encode()).decode()
t.sendall(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nProxy-Authorization: Basic {{auth}}\r\n\r\n".encode())
print(t.recv(100).split(b"\r\n")[0].decode())
"#
    )
}

fn fetch(port: u16) -> String {
    format!(
        r#"
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=15).read().decode())
except urllib.error.HTTPError as e:
    print(f"HTTP {{e.code}}: {{e.read().decode().strip()}}")
except Exception as e:
    print(f"ERR {{e}}")
"#
    )
}

/// POST /v1/admin/reload with `token`.
async fn reload(api: &http::Api, token: &str) -> http::Reply {
    api.send(Method::POST, "/v1/admin/reload", token, false, None)
        .await
}

/// The next `kernelbox: reload ...` line of the server's stderr (its report as JSON), after a
/// SIGHUP.
async fn hangup_report(
    child: &tokio::process::Child,
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
) -> (String, Value) {
    let pid = child.id().expect("running").to_string();
    let kill = tokio::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .await
        .unwrap();
    assert!(kill.success());
    tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let line = lines
                .next_line()
                .await
                .unwrap()
                .expect("the server exited after SIGHUP");
            if let Some(rest) = line.strip_prefix("kernelbox: reload ") {
                let (verdict, report) = rest.split_once(": ").expect("verdict: report");
                return (verdict.to_string(), serde_json::from_str(report).unwrap());
            }
        }
    })
    .await
    .expect("a reload line after SIGHUP")
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_change_live_and_another_tenants_kernel_keeps_its_state() {
    let port = http_server().await;
    let allowed = vec![format!("127.0.0.1:{port}")];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("gone", "token-gone", &[]),
            tenant("net", "token-net-1", &allowed),
        ],
    );
    let label = common::unique("reload");
    let engine = common::engine().await;
    let mut child = common::serve_command(&label, "unused")
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .args(["--pool", "0", "--admin-token", ADMIN, "--tenants"])
        .arg(&file)
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let api = http::Api::new(common::serving_addr(&mut lines).await);

    // Before: a variable in keep's kernel, a kernel of gone's, a tunnel open in net's.
    let before = api.run("token-keep", "s", "x = 41").await;
    api.run("token-gone", "s", "y = 1").await;
    let gone_id = |cs: &[kernelbox::docker::ContainerInfo]| {
        cs.iter()
            .filter(|c| c.labels.get(kernelbox::labels::TENANT).map(String::as_str) == Some("gone"))
            .count()
    };
    assert_eq!(gone_id(&common::containers(&engine, &label).await), 1);
    let r = api.run("token-net-1", "s", &open_tunnel(port)).await;
    assert!(r["output"].as_str().unwrap().contains("200"), "{r}");

    // The edit: `new` added, net's token rotated and its network narrowed, `gone` removed.
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("net", "token-net-2", &["example.com".to_string()]),
            tenant("new", "token-new", &[]),
        ],
    );
    let (verdict, report) = hangup_report(&child, &mut lines).await;
    assert_eq!(verdict, "applied", "{report}");
    assert_eq!(report["added"], json!(["new"]), "{report}");
    assert_eq!(report["removed"], json!(["gone"]), "{report}");
    assert_eq!(report["changed"], json!(["net"]), "{report}");
    assert_eq!(report["kernels_removed"], 1, "{report}");
    assert_eq!(report["connections_closed"], 1, "{report}");
    assert_eq!(report["needs_restart"], json!([]), "{report}");

    // The old token is refused, the new one and the new tenant's are accepted.
    let old = api.execute("token-net-1", "s", json!({"code": "1"})).await;
    assert_eq!(old.status, StatusCode::UNAUTHORIZED);
    api.run("token-new", "s", "z = 3").await;
    // The narrowed policy: the tunnel was closed, a new request refused.
    let r = api
        .run(
            "token-net-2",
            "s",
            &format!("print(t.recv(10))\n{}", fetch(port)),
        )
        .await;
    let out = r["output"].as_str().unwrap();
    assert!(out.starts_with("b''"), "{r}");
    assert!(out.contains("not_allowed"), "{r}");
    // The removed tenant's container is gone from the engine; its token is refused.
    assert_eq!(gone_id(&common::containers(&engine, &label).await), 0);
    let refused = api.execute("token-gone", "s", json!({"code": "1"})).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    // keep's kernel is the same, with its state.
    let after = api.run("token-keep", "s", "print(x)").await;
    assert_eq!(after["output"], "41\n", "{after}");
    assert_eq!(after["kernel"]["id"], before["kernel"]["id"], "{after}");
    assert_eq!(
        after["kernel"]["generation"], before["kernel"]["generation"],
        "{after}"
    );
    assert!(after["kernel"]["state_lost"].is_null(), "{after}");

    // The route: without the admin token it is refused; `gone` added back through it, and its
    // owner told what became of its kernel.
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("net", "token-net-2", &["example.com".to_string()]),
            tenant("new", "token-new", &[]),
            tenant("gone", "token-gone", &[]),
        ],
    );
    assert_eq!(
        reload(&api, "token-keep").await.status,
        StatusCode::UNAUTHORIZED
    );
    let reply = reload(&api, ADMIN).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["added"], json!(["gone"]));
    let back = api.run("token-gone", "s", "print('back')").await;
    assert_eq!(
        back["kernel"]["state_lost"]["reason"], "tenant_removed",
        "{back}"
    );

    // Invalid edits are refused whole: the running tenants are kept.
    for (tenants, why) in [
        (
            json!({"tenants": [{"name": "keep", "token_sha256": "zz"}]}),
            "tenants[0].token_sha256",
        ),
        (
            json!({"tenants": [{"name": "keep",
                "token_sha256": hex::encode(kernelbox::server::tenants::token_hash("t")),
                "image": "kernelbox/no-such-image:reload"}]}),
            "not in the engine",
        ),
    ] {
        std::fs::write(&file, tenants.to_string()).unwrap();
        let reply = reload(&api, ADMIN).await;
        let body = reply.json();
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert_eq!(body["applied"], false, "{body}");
        assert!(body["reason"].as_str().unwrap().contains(why), "{body}");
    }
    std::fs::write(&file, "{not json").unwrap();
    let (verdict, report) = hangup_report(&child, &mut lines).await;
    assert_eq!(verdict, "refused", "{report}");
    assert!(
        report["reason"]
            .as_str()
            .unwrap()
            .contains("not valid JSON"),
        "{report}"
    );
    api.run("token-net-2", "s", "1").await;
    api.run("token-new", "s", "1").await;
    let after = api.run("token-keep", "s", "print(x)").await;
    assert_eq!(after["output"], "41\n", "{after}");
    assert_eq!(
        after["kernel"]["generation"], before["kernel"]["generation"],
        "{after}"
    );

    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let status = common::terminate(&mut child, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    common::assert_clean(&engine, &label).await;
}

type Lines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>;

/// A `kernelbox serve` with the tenants of `file` and the admin token; its stderr lines.
async fn serve(
    label: &str,
    dir: &std::path::Path,
    file: &std::path::Path,
) -> (tokio::process::Child, Lines, std::net::SocketAddr) {
    let mut child = common::serve_command(label, "unused")
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(["--pool", "0", "--admin-token", ADMIN, "--tenants"])
        .arg(file)
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let addr = common::serving_addr(&mut lines).await;
    (child, lines, addr)
}

/// Stops the server (its stderr drained meanwhile) and checks nothing of `label` is left.
async fn stop(mut child: tokio::process::Child, mut lines: Lines, label: &str) {
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let status = common::terminate(&mut child, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    common::assert_clean(&common::engine().await, label).await;
}

/// The containers of `tenant` among `label`'s.
async fn containers_of(label: &str, tenant: &str) -> usize {
    common::containers(&common::engine().await, label)
        .await
        .iter()
        .filter(|c| c.labels.get(kernelbox::labels::TENANT).map(String::as_str) == Some(tenant))
        .count()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_oversized_tenants_file_is_refused_without_being_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    write(&file, &[tenant("keep", "token-keep", &[])]);
    let label = common::unique("reload-big");
    let (child, lines, addr) = serve(&label, dir.path(), &file).await;
    let api = http::Api::new(addr);

    // Valid tenants, padded past the limit with white space (valid JSON all the same).
    let big = dir.path().join("big.json");
    let mut text = json!({"tenants": [
        tenant("keep", "token-keep", &[]),
        tenant("other", "token-other", &[]),
    ]})
    .to_string();
    text.push_str(&" ".repeat(kernelbox::server::tenants::MAX_TENANTS_FILE_BYTES as usize + 1));
    std::fs::write(&big, text).unwrap();
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink(&big, &file).unwrap();
    let reply = reload(&api, ADMIN).await;
    let body = reply.json();
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["reason"].as_str().unwrap().contains("larger than"),
        "{body}"
    );
    let other = api.execute("token-other", "s", json!({"code": "1"})).await;
    assert_eq!(other.status, StatusCode::UNAUTHORIZED);

    // A device that never ends is refused the same way.
    std::fs::remove_file(&file).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &file).unwrap();
    let reply = reload(&api, ADMIN).await;
    let body = reply.json();
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert!(
        body["reason"].as_str().unwrap().contains("larger than"),
        "{body}"
    );
    api.run("token-keep", "s", "1").await;
    stop(child, lines, &label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reload_whose_client_hangs_up_still_runs_to_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("gone", "token-gone", &[]),
        ],
    );
    let label = common::unique("reload-cut");
    let (child, mut lines, addr) = serve(&label, dir.path(), &file).await;
    let api = http::Api::new(addr);
    api.run("token-gone", "s", "1").await;
    assert_eq!(containers_of(&label, "gone").await, 1);

    // The admin's client sends the reload and hangs up while the server reads the tenants
    // (a FIFO: opening it to write waits for the reload to open it to read).
    std::fs::remove_file(&file).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(&file)
        .status()
        .unwrap();
    assert!(made.success());
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    raw.write_all(
        format!(
            "POST /v1/admin/reload HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN}\r\ncontent-length: 0\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let fifo = file.clone();
    let writer = tokio::task::spawn_blocking(move || std::fs::File::create(fifo).unwrap())
        .await
        .unwrap();
    drop(raw);
    let text = json!({ "tenants": [tenant("keep", "token-keep", &[])] }).to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::Write as _;
        let mut writer = writer;
        writer.write_all(text.as_bytes()).unwrap();
    })
    .await
    .unwrap();
    std::fs::remove_file(&file).unwrap();
    write(&file, &[tenant("keep", "token-keep", &[])]);
    // It is applied all the same, to its end: the tenant's kernel removed, the reload logged
    // (at the default levels too).
    tokio::time::timeout(Duration::from_secs(120), async {
        let mut lost = false;
        loop {
            let line = lines.next_line().await.unwrap().expect("the server's log");
            lost |= line.contains("kernel lost") && line.contains("tenant_removed");
            if line.contains("tenants reloaded") {
                assert!(line.contains("kernels_removed=1"), "{line}");
                assert!(lost, "the kernel lost before the reload's report: {line}");
                return;
            }
        }
    })
    .await
    .expect("the reload whose client hung up, its kernel removed and its report logged");
    // The next reload waits for it (one at a time) and finds nothing left to do.
    let reply = reload(&api, ADMIN).await;
    let body = reply.json();
    assert_eq!(reply.status, StatusCode::OK, "{body}");
    assert_eq!(body["removed"], json!([]), "{body}");
    assert_eq!(containers_of(&label, "gone").await, 0);
    let refused = api.execute("token-gone", "s", json!({"code": "1"})).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    stop(child, lines, &label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kernel_starting_while_its_network_is_narrowed_gets_the_narrowed_policy() {
    let port = http_server().await;
    let allowed = vec![format!("127.0.0.1:{port}")];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    write(&file, &[tenant("net", "token-net", &allowed)]);
    let label = common::unique("reload-start");
    let (child, lines, addr) = serve(&label, dir.path(), &file).await;
    let api = http::Api::new(addr);

    // A cold start begins; the policy is narrowed once its container exists, before its
    // kernel is ready.
    let starting = {
        let api = api.clone();
        tokio::spawn(async move { api.run("token-net", "s", &fetch(port)).await })
    };
    tokio::time::timeout(Duration::from_secs(120), async {
        while containers_of(&label, "net").await == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the kernel's container");
    write(
        &file,
        &[tenant("net", "token-net", &["example.com".to_string()])],
    );
    let reply = reload(&api, ADMIN).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let r = starting.await.unwrap();
    let out = r["output"].as_str().unwrap();
    assert!(out.contains("not_allowed"), "{r}");
    stop(child, lines, &label).await;
}

/// A kernel starting when a reload removes its tenant is not started again for it: the call
/// ends (401 when the removal found it starting) and no container of the tenant is left.
#[tokio::test(flavor = "multi_thread")]
async fn a_kernel_starting_when_its_tenant_is_removed_is_not_started_again() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("gone", "token-gone", &[]),
        ],
    );
    let label = common::unique("reload-starting");
    let (child, lines, addr) = serve(&label, dir.path(), &file).await;
    let api = http::Api::new(addr);

    // A cold start begins; the tenant is removed once its container exists, before its
    // kernel is ready.
    let starting = {
        let api = api.clone();
        tokio::spawn(async move {
            api.execute("token-gone", "s", json!({"code": "print('ran')"}))
                .await
        })
    };
    tokio::time::timeout(Duration::from_secs(120), async {
        while containers_of(&label, "gone").await == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the kernel's container");
    write(&file, &[tenant("keep", "token-keep", &[])]);
    let reply = reload(&api, ADMIN).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["removed"], json!(["gone"]), "{}", reply.json());
    let answer = starting.await.unwrap();
    assert_eq!(
        containers_of(&label, "gone").await,
        0,
        "a kernel was started again for the removed tenant: {} {}",
        answer.status,
        answer.json()
    );
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{}", answer.json());
    stop(child, lines, &label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_of_a_removed_tenant_still_sending_its_body_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("gone", "token-gone", &[]),
        ],
    );
    let label = common::unique("reload-body");
    let (child, lines, addr) = serve(&label, dir.path(), &file).await;
    let api = http::Api::new(addr);

    // Authenticated (its headers sent), its body half sent when the tenant is removed.
    let body = json!({"code": "print('ran after removal')"}).to_string();
    let (first, rest) = body.split_at(body.len() / 2);
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    raw.write_all(
        format!(
            "POST /v1/sessions/s/execute HTTP/1.1\r\nhost: x\r\nauthorization: Bearer token-gone\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{first}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    write(&file, &[tenant("keep", "token-keep", &[])]);
    let reply = reload(&api, ADMIN).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["removed"], json!(["gone"]));
    raw.write_all(rest.as_bytes()).await.unwrap();
    let mut head = tokio::io::BufReader::new(raw);
    let mut status = String::new();
    head.read_line(&mut status).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    assert_eq!(containers_of(&label, "gone").await, 0);
    stop(child, lines, &label).await;
}

/// What only a restart can apply is reported, not dropped: a tenant given a network by a
/// reload on a server started with no tenant network (so no egress proxy) stays without one,
/// and credential rules wait too; the report says so. Without an admin token the route is 404; SIGHUP still reloads.
#[tokio::test(flavor = "multi_thread")]
async fn what_needs_a_restart_is_reported_and_the_route_needs_an_admin_token() {
    let port = http_server().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    write(&file, &[tenant("a", "token-a", &[])]);
    // Credential rules, read again by each reload: with no egress at start, they wait too.
    let secrets = dir.path().join("secrets.json");
    let rules = json!({"tenants": {"a": {"secrets": {"KEY": "k"},
        "rules": [{"host": "api.example.com", "headers": {"x-api-key": "${secrets.KEY}"}}]}}});
    std::fs::write(&secrets, rules.to_string()).unwrap();
    let label = common::unique("reload-restart");
    let engine = common::engine().await;
    let mut child = common::serve_command(&label, "unused")
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--egress-secrets")
        .arg(&secrets)
        .args(["--pool", "0", "--tenants"])
        .arg(&file)
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let api = http::Api::new(common::serving_addr(&mut lines).await);

    let reply = reload(&api, "token-a").await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.json());

    write(
        &file,
        &[tenant("a", "token-a", &[format!("127.0.0.1:{port}")])],
    );
    let (verdict, report) = hangup_report(&child, &mut lines).await;
    assert_eq!(verdict, "applied", "{report}");
    assert_eq!(report["changed"], json!(["a"]), "{report}");
    let needs = report["needs_restart"].as_array().unwrap();
    assert_eq!(needs.len(), 2, "{report}");
    assert!(
        needs[0]
            .as_str()
            .unwrap()
            .starts_with("network of tenant(s) a:"),
        "{report}"
    );
    assert!(
        needs[1].as_str().unwrap().starts_with("credential rules:"),
        "{report}"
    );
    // Not applied: the tenant's kernel has no network.
    let r = api.run("token-a", "s", &fetch(port)).await;
    assert!(r["output"].as_str().unwrap().starts_with("ERR"), "{r}");

    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let status = common::terminate(&mut child, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    common::assert_clean(&engine, &label).await;
}

/// The configuration file's `[[tenants]]` (`serve --config`, docs/configuration.md) reloaded:
/// `[cluster] admin_token` is the route's token, and
/// a tenant added, a token rotated and a network narrowed by editing the TOML and sending
/// SIGHUP while another tenant's kernel keeps its state; a token given as `{ file = ... }`
/// rotated by changing that file alone; one given as `{ env = ... }` kept across every reload;
/// invalid edits (an unknown key, a bad tenant value, a bad server value) refused whole by
/// SIGHUP and by the route, the running tenants kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_config_files_tenants_change_live_and_an_invalid_edit_changes_nothing() {
    let port = http_server().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kernelbox.toml");
    let token_file = dir.path().join("token-c");
    std::fs::write(&token_file, "token-c-1\n").unwrap();
    let head = format!(
        "[server]\nstate_dir = {:?}\n[pool]\nsize = 0\n[cluster]\nadmin_token = \"{ADMIN}\"\n",
        dir.path().join("state")
    );
    let a = "[[tenants]]\nname = \"a\"\ntoken = { env = \"RELOAD_TOML_TOKEN_A\" }\n";
    let b = |token: &str, allow: &str, extra: &str| {
        format!(
            "[[tenants]]\nname = \"b\"\ntoken = \"{token}\"\nnetwork = {{ allow = [\"{allow}\"] }}\n{extra}"
        )
    };
    let c = |extra: &str| {
        format!("[[tenants]]\nname = \"c\"\ntoken = {{ file = {token_file:?} }}\n{extra}")
    };
    let allowed = format!("127.0.0.1:{port}");
    std::fs::write(&file, format!("{head}{a}{}", b("token-b-1", &allowed, ""))).unwrap();

    let label = common::unique("reload-config");
    let engine = common::engine().await;
    let mut child = common::serve_command(&label, "unused")
        .arg("--config")
        .arg(&file)
        .env("RELOAD_TOML_TOKEN_A", "token-a")
        .env_remove("KERNELBOX_STATE_DIR")
        .env_remove("KERNELBOX_ADMIN_TOKEN")
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let api = http::Api::new(common::serving_addr(&mut lines).await);
    let status = |token: &'static str| {
        let api = &api;
        async move { api.execute(token, "t", json!({"code": "1"})).await.status }
    };

    // Before: a variable in a's kernel, a tunnel open in b's.
    let before = api.run("token-a", "s", "x = 41").await;
    let r = api.run("token-b-1", "s", &open_tunnel(port)).await;
    assert!(r["output"].as_str().unwrap().contains("200"), "{r}");

    // The edit: c added, b's token rotated and its network narrowed.
    let edited = format!("{head}{a}{}{}", b("token-b-2", "example.com", ""), c(""));
    std::fs::write(&file, &edited).unwrap();
    let (verdict, report) = hangup_report(&child, &mut lines).await;
    assert_eq!(verdict, "applied", "{report}");
    assert_eq!(report["added"], json!(["c"]), "{report}");
    assert_eq!(report["removed"], json!([]), "{report}");
    assert_eq!(report["changed"], json!(["b"]), "{report}");
    assert_eq!(report["connections_closed"], 1, "{report}");
    assert_eq!(report["needs_restart"], json!([]), "{report}");

    assert_eq!(status("token-b-1").await, StatusCode::UNAUTHORIZED);
    assert_eq!(status("token-b-2").await, StatusCode::OK);
    api.run("token-c-1", "s", "z = 3").await;
    // The narrowed policy: b's tunnel was closed, a new request refused.
    let r = api
        .run(
            "token-b-2",
            "s",
            &format!("print(t.recv(10))\n{}", fetch(port)),
        )
        .await;
    let out = r["output"].as_str().unwrap();
    assert!(out.starts_with("b''"), "{r}");
    assert!(out.contains("not_allowed"), "{r}");
    // a's kernel is the same, with its state.
    let same_kernel = |after: &Value| {
        assert_eq!(after["output"], "41\n", "{after}");
        assert_eq!(after["kernel"]["id"], before["kernel"]["id"], "{after}");
        assert_eq!(
            after["kernel"]["generation"], before["kernel"]["generation"],
            "{after}"
        );
        assert!(after["kernel"]["state_lost"].is_null(), "{after}");
    };
    same_kernel(&api.run("token-a", "s", "print(x)").await);

    // c's token rotated in its file alone, the TOML untouched: read again by the reload.
    std::fs::write(&token_file, "token-c-2\n").unwrap();
    let (verdict, report) = hangup_report(&child, &mut lines).await;
    assert_eq!(verdict, "applied", "{report}");
    assert_eq!(report["changed"], json!(["c"]), "{report}");
    assert_eq!(status("token-c-1").await, StatusCode::UNAUTHORIZED);
    assert_eq!(status("token-c-2").await, StatusCode::OK);
    // a's token, from the server's environment, is the same after every reload.
    assert_eq!(status("token-a").await, StatusCode::OK);

    // A key outside the tenants changed: not applied, and said so (never silently ignored);
    // the tenants of the same file still apply.
    let pooled = edited.replace(
        "[pool]\nsize = 0\n",
        "[pool]\nsize = 0\nmax_age = \"10m\"\n",
    );
    assert_ne!(pooled, edited);
    std::fs::write(&file, &pooled).unwrap();
    let (verdict, report) = hangup_report(&child, &mut lines).await;
    assert_eq!(verdict, "applied", "{report}");
    let needs = report["needs_restart"].as_array().unwrap();
    assert_eq!(needs.len(), 1, "{report}");
    assert!(
        needs[0].as_str().unwrap().starts_with("pool.max_age:"),
        "{report}"
    );
    assert_eq!(status("token-c-2").await, StatusCode::OK);

    // Invalid edits, each also rotating b's token to token-b-3: refused whole, by SIGHUP and
    // by the route (the admin token of `[cluster]`); b keeps token-b-2.
    let reload_route_refuses = |why: &'static str| {
        let api = &api;
        async move {
            assert_eq!(
                reload(api, "token-a").await.status,
                StatusCode::UNAUTHORIZED
            );
            let reply = reload(api, ADMIN).await;
            let body = reply.json();
            assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
            assert_eq!(body["applied"], false, "{body}");
            assert!(body["reason"].as_str().unwrap().contains(why), "{body}");
        }
    };
    let b3 = |extra: &str| b("token-b-3", "example.com", extra);
    for (text, why) in [
        (
            format!("{head}{a}{}{}", b3(""), c("max_kernls = 3\n")),
            "tenants[2].max_kernls",
        ),
        (
            format!("{head}{a}{}{}", b3("max_kernels = 0\n"), c("")),
            "tenants[1].max_kernels",
        ),
        (
            format!(
                "{head}[limits]\nmax_connections = 0\n{a}{}{}",
                b3(""),
                c("")
            ),
            "limits.max_connections",
        ),
    ] {
        std::fs::write(&file, &text).unwrap();
        let (verdict, report) = hangup_report(&child, &mut lines).await;
        assert_eq!(verdict, "refused", "{text}\n{report}");
        let reason = report["reason"].as_str().unwrap();
        assert!(reason.contains(why), "{why}: {report}");
        reload_route_refuses(why).await;
        assert_eq!(status("token-b-2").await, StatusCode::OK, "{why}");
        assert_eq!(status("token-b-3").await, StatusCode::UNAUTHORIZED, "{why}");
        assert_eq!(status("token-c-2").await, StatusCode::OK, "{why}");
    }
    same_kernel(&api.run("token-a", "s", "print(x)").await);

    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let status = common::terminate(&mut child, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    common::assert_clean(&engine, &label).await;
}

/// A tenant removed then added back under its name (a new token) starts afresh: its sessions'
/// own settings and network policy went with it (docs/http-api.md, "Reloading the tenants").
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_added_back_does_not_inherit_its_sessions_settings_or_network() {
    let port = http_server().await;
    let allowed = vec![format!("127.0.0.1:{port}")];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("gone", "token-gone", &allowed),
        ],
    );
    let label = common::unique("reload-forget");
    let (child, lines, addr) = serve(&label, dir.path(), &file).await;
    let api = http::Api::new(addr);

    // The session's own settings and a policy denying what its tenant allows.
    let set = api
        .send(
            Method::PUT,
            "/v1/sessions/s/settings",
            "token-gone",
            false,
            Some(json!({"env": {"MARK": "old-customer"}, "labels": {"who": "old"}})),
        )
        .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.json());
    let denied = api
        .send(
            Method::PUT,
            "/v1/sessions/s/network",
            "token-gone",
            false,
            Some(json!({"deny": [format!("127.0.0.1:{port}")]})),
        )
        .await;
    assert_eq!(denied.status, StatusCode::OK, "{}", denied.json());
    let r = api.run("token-gone", "s", &fetch(port)).await;
    assert!(
        r["output"].as_str().unwrap().contains("refused (denied)"),
        "{r}"
    );

    // Removed, then added back under its name for someone else.
    write(&file, &[tenant("keep", "token-keep", &[])]);
    let reply = reload(&api, ADMIN).await;
    assert_eq!(reply.json()["removed"], json!(["gone"]), "{}", reply.json());
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("gone", "token-gone-2", &allowed),
        ],
    );
    let reply = reload(&api, ADMIN).await;
    assert_eq!(reply.json()["added"], json!(["gone"]), "{}", reply.json());

    // The session's settings are the defaults (as a session never touched), its network
    // the tenant's.
    let settings = api
        .get("/v1/sessions/s/settings", Some("token-gone-2"))
        .await;
    let fresh = api
        .get("/v1/sessions/untouched/settings", Some("token-gone-2"))
        .await;
    assert_eq!(settings.status, StatusCode::OK);
    assert_eq!(settings.json(), fresh.json(), "settings inherited");
    let r = api
        .run(
            "token-gone-2",
            "s",
            &format!("import os\nprint(os.environ.get('MARK'))\n{}", fetch(port)),
        )
        .await;
    assert_eq!(
        r["output"].as_str().unwrap(),
        format!("None\nhello from {port}\n"),
        "{r}"
    );
    stop(child, lines, &label).await;
}

/// One JSON-RPC message to `/v1/mcp` with `token` (in MCP session `id`, when given): the
/// answer's status, JSON-RPC message or error body, and the MCP session id it names.
async fn mcp(
    api: &http::Api,
    token: &str,
    id: Option<&str>,
    message: Value,
) -> (StatusCode, String, Option<String>) {
    let mut request = api
        .build(Method::POST, "/v1/mcp", Some(token), false, true)
        .header("accept", "application/json, text/event-stream");
    if let Some(id) = id {
        request = request.header("mcp-session-id", id);
    }
    let request = request
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            message.to_string(),
        )))
        .unwrap();
    let reply = http::Reply::read(api.http.request(request).await.unwrap()).await;
    let id = reply
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    (
        reply.status,
        String::from_utf8_lossy(&reply.body).to_string(),
        id,
    )
}

/// A removed tenant's MCP sessions end with it: their kernels go, and the session id, sent
/// again with the token of a tenant added back under the name, is unknown.
#[tokio::test(flavor = "multi_thread")]
async fn a_removed_tenants_mcp_sessions_end() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("gone", "token-gone", &[]),
        ],
    );
    let label = common::unique("reload-mcp");
    let (child, lines, addr) = serve(&label, dir.path(), &file).await;
    let api = http::Api::new(addr);

    let (status, body, id) = mcp(
        &api,
        "token-gone",
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-03-26", "capabilities": {},
            "clientInfo": {"name": "reload-test", "version": "1"}}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = id.expect("an MCP session id");
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let (status, body, _) = mcp(&api, "token-gone", Some(&id), initialized).await;
    assert!(status.is_success(), "{status} {body}");
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "execute_code", "arguments": {"code": "print(6 * 7)"}}});
    let (status, body, _) = mcp(&api, "token-gone", Some(&id), call.clone()).await;
    assert!(
        status.is_success() && body.contains("42"),
        "{status} {body}"
    );
    assert_eq!(containers_of(&label, "gone").await, 1);

    // Removed, then added back under its name with a new token.
    write(&file, &[tenant("keep", "token-keep", &[])]);
    let reply = reload(&api, ADMIN).await;
    assert_eq!(reply.json()["removed"], json!(["gone"]), "{}", reply.json());
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("gone", "token-gone-2", &[]),
        ],
    );
    let reply = reload(&api, ADMIN).await;
    assert_eq!(reply.json()["added"], json!(["gone"]), "{}", reply.json());

    let (status, body, _) = mcp(&api, "token-gone-2", Some(&id), call).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.contains("Session not found"), "{body}");
    assert_eq!(containers_of(&label, "gone").await, 0);
    stop(child, lines, &label).await;
}

/// A removed tenant's upload whose body was still arriving is refused 401 once its body is
/// in and never committed: with the tenant gone, no kernel of it is left; added back under
/// its name (another token), the file is not in the session.
#[tokio::test(flavor = "multi_thread")]
async fn an_upload_of_a_removed_tenant_still_sending_its_body_is_refused() {
    trickled_upload_of_a_removed_tenant(false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upload_of_a_removed_tenant_is_not_committed_when_its_name_comes_back() {
    trickled_upload_of_a_removed_tenant(true).await;
}

async fn trickled_upload_of_a_removed_tenant(added_back: bool) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    write(
        &file,
        &[
            tenant("keep", "token-keep", &[]),
            tenant("gone", "token-gone", &[]),
        ],
    );
    let label = common::unique("reload-upload");
    let (child, lines, addr) = serve(&label, dir.path(), &file).await;
    let api = http::Api::new(addr);

    // Authenticated (its headers sent), its body half sent when the tenant is removed.
    let body = "x".repeat(64 * 1024);
    let (first, rest) = body.split_at(body.len() / 2);
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    raw.write_all(
        format!(
            "PUT /v1/sessions/s/files/late.txt HTTP/1.1\r\nhost: x\r\nauthorization: Bearer token-gone\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n{first}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    write(&file, &[tenant("keep", "token-keep", &[])]);
    let reply = reload(&api, ADMIN).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    assert_eq!(reply.json()["removed"], json!(["gone"]));
    if added_back {
        write(
            &file,
            &[
                tenant("keep", "token-keep", &[]),
                tenant("gone", "token-gone-2", &[]),
            ],
        );
        let reply = reload(&api, ADMIN).await;
        assert_eq!(reply.json()["added"], json!(["gone"]), "{}", reply.json());
    }
    raw.write_all(rest.as_bytes()).await.unwrap();
    let mut head = tokio::io::BufReader::new(raw);
    let mut status = String::new();
    head.read_line(&mut status).await.unwrap();
    assert!(status.starts_with("HTTP/1.1 401"), "{status}");
    if added_back {
        let read = api
            .get("/v1/sessions/s/files/late.txt", Some("token-gone-2"))
            .await;
        assert_eq!(
            read.status,
            StatusCode::NOT_FOUND,
            "the upload was committed"
        );
    } else {
        assert_eq!(containers_of(&label, "gone").await, 0);
    }
    stop(child, lines, &label).await;
}

/// Workspaces follow a reload on a server that has them: a tenant given workspaces has one on
/// its sessions' next kernels, and one whose workspaces are taken away has none from then on,
/// while another tenant's kernel keeps its state.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenants_workspaces_change_live() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.json");
    let ws = json!({"quota": "8m", "ttl": "1h", "max": 4});
    let mut keep = tenant("keep", "token-keep", &[]);
    keep["workspaces"] = ws.clone();
    let plain = tenant("w", "token-w", &[]);
    let mut given = plain.clone();
    given["workspaces"] = ws;
    write(&file, &[keep.clone(), plain.clone()]);
    let label = common::unique("reload-ws");
    let (child, lines, addr) = serve(&label, dir.path(), &file).await;
    let api = http::Api::new(addr);
    let before = api.run("token-keep", "k", "x = 7").await;

    let r = api.run("token-w", "s1", "print(1)").await;
    assert!(r["kernel"]["workspace"].is_null(), "{r}");

    write(&file, &[keep.clone(), given]);
    let reply = reload(&api, ADMIN).await;
    let report = reply.json();
    assert_eq!(reply.status, StatusCode::OK, "{report}");
    assert_eq!(report["changed"], json!(["w"]), "{report}");
    assert_eq!(report["needs_restart"], json!([]), "{report}");
    let r = api
        .run("token-w", "s2", "open('/work/f', 'w').write('x')")
        .await;
    assert_eq!(
        r["kernel"]["workspace"],
        json!({"name": "s2", "restored": false}),
        "{r}"
    );

    write(&file, &[keep.clone(), plain]);
    let reply = reload(&api, ADMIN).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let r = api.run("token-w", "s3", "print(1)").await;
    assert!(r["kernel"]["workspace"].is_null(), "{r}");

    let after = api.run("token-keep", "k", "print(x)").await;
    assert_eq!(after["output"], "7\n", "{after}");
    assert_eq!(after["kernel"]["id"], before["kernel"]["id"], "{after}");

    // The workspace made while the tenant had them: deleted once it has them again.
    for s in ["s1", "s2", "s3"] {
        api.delete(&format!("/v1/sessions/{s}"), "token-w").await;
    }
    api.delete("/v1/sessions/k", "token-keep").await;
    let mut w = tenant("w", "token-w", &[]);
    w["workspaces"] = json!({"quota": "8m"});
    write(&file, &[keep, w]);
    assert_eq!(reload(&api, ADMIN).await.status, StatusCode::OK);
    for (name, token) in [("s2", "token-w"), ("k", "token-keep")] {
        let r = api.delete(&format!("/v1/workspaces/{name}"), token).await;
        assert!(r.status.is_success(), "{name}: {}", r.json());
    }
    stop(child, lines, &label).await;
}
