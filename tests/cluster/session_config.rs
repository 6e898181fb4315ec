//! docs/cluster.md, "Session policies and settings": the catalog keeps a session's own network
//! policy and settings, so a session's kernel starts under them on whichever node it starts;
//! a `PUT` of them starts nothing, so a tenant at its cap is not refused; deleting the session
//! forgets them on every node.

use hyper::StatusCode;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{success, Cluster, Options, TOKEN};

/// A tiny HTTP server on loopback answering every request `hello from PORT`.
async fn http_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
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

const CALL: &str = r#"
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen(URL, timeout=15).read().decode())
except urllib.error.HTTPError as e:
    print(f"HTTP {e.code}: {e.read().decode().strip()}")
except Exception as e:
    print(f"ERR {type(e).__name__}: {e}")
"#;

#[tokio::test(flavor = "multi_thread")]
async fn a_sessions_policy_and_settings_set_on_one_node_apply_on_another_and_never_count_as_a_start(
) {
    let port = http_server().await;
    let cluster = Cluster::start(
        "cluster-session-config",
        Options {
            tenant_cap: Some(2),
            network: Some(json!({"allow": [format!("127.0.0.1:{port}")]})),
            ..Options::default()
        },
    )
    .await;
    let [n1, n2, n3] = [&cluster.nodes[0], &cluster.nodes[1], &cluster.nodes[2]];
    let put = |node: &crate::harness::Node, path: String, body: serde_json::Value| {
        let api = node.api.clone();
        async move {
            api.put(&path, TOKEN, body.to_string(), Some("application/json"))
                .await
        }
    };
    let fetch = CALL.replace("URL", &format!("'http://127.0.0.1:{port}/'"));

    // Set on n1 before the sessions' first kernels, which then start on n2.
    let r = put(
        n1,
        "/v1/sessions/s/network".into(),
        json!({"allow": ["example.com"]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let r = put(
        n1,
        "/v1/sessions/s2/settings".into(),
        json!({"env": {"FOO": "bar"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let r = success(&n2.api.execute(TOKEN, "s", json!({ "code": fetch })).await);
    assert!(
        r["output"]
            .as_str()
            .unwrap_or_default()
            .contains("refused (not_allowed)"),
        "the session's own policy applies on n2: {r}"
    );
    let r = success(
        &n2.api
            .execute(
                TOKEN,
                "s2",
                json!({"code": "import os; print(os.environ.get('FOO'))"}),
            )
            .await,
    );
    assert_eq!(
        r["output"], "bar\n",
        "the session's settings apply on n2: {r}"
    );

    // The tenant is at its cap (2 live sessions): setting another session's settings or
    // policy starts nothing, so it is not refused.
    let r = put(
        n3,
        "/v1/sessions/s3/settings".into(),
        json!({"env": {"X": "1"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let r = put(n1, "/v1/sessions/s3/network".into(), json!({"allow": []})).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    // Any node answers the settings, as the catalog has them.
    let r = n3.api.get("/v1/sessions/s2/settings", Some(TOKEN)).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json(), json!({"env": {"FOO": "bar"}}));
    let r = n2.api.get("/v1/sessions/s3/settings", Some(TOKEN)).await;
    assert_eq!(r.json(), json!({"env": {"X": "1"}}));

    // Deleted through n3 (the request goes to n2, which holds it): its policy is forgotten,
    // so its next kernel, on n1, has the tenant's.
    let r = n3.api.delete("/v1/sessions/s", TOKEN).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    let r = success(&n1.api.execute(TOKEN, "s", json!({ "code": fetch })).await);
    assert_eq!(r["output"], format!("hello from {port}\n"), "{r}");
    cluster.finish().await;
}
