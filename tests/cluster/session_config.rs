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

/// A session policy of 255 deny entries of 253 bytes each (distinct host names, tagged) and
/// one allow entry: the most one policy holds (about 80 KiB as the bound counts it).
fn big_policy(tag: &str) -> serde_json::Value {
    let deny: Vec<String> = (0..255)
        .map(|i| {
            let first = format!("{tag}x{i}");
            let first = format!("{first}{}", "a".repeat(63 - first.len()));
            format!(
                "{first}.{}.{}.{}",
                "b".repeat(63),
                "c".repeat(63),
                "d".repeat(61)
            )
        })
        .collect();
    json!({"allow": ["example.com"], "deny": deny})
}

/// A session claimed by a node, whose policy that node loaded while the request's body is
/// still arriving, keeps its policy there until its kernel starts: another session's policy
/// needing room on that node (its copies of policies deleted elsewhere, stale, over the
/// bound) never makes room with it, so its kernel never starts under the tenant's wider
/// policy.
#[tokio::test(flavor = "multi_thread")]
async fn a_claimed_sessions_policy_is_not_forgotten_for_room_before_its_kernel_starts() {
    let port = http_server().await;
    let cluster = Cluster::start(
        "cluster-config-hold",
        Options {
            network: Some(json!({"allow": [format!("127.0.0.1:{port}")]})),
            ..Options::default()
        },
    )
    .await;
    let [n1, n2] = [&cluster.nodes[0], &cluster.nodes[1]];
    let put = |node: &crate::harness::Node, path: String, body: serde_json::Value| {
        let api = node.api.clone();
        async move {
            api.put(&path, TOKEN, body.to_string(), Some("application/json"))
                .await
        }
    };
    let r = put(
        n2,
        "/v1/sessions/b/network".into(),
        json!({"allow": ["example.com"]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());

    // b's execute reaches n1, its body held back: n1 claims b and loads its policy.
    let fetch = CALL.replace("URL", &format!("'http://127.0.0.1:{port}/'"));
    let body = json!({ "code": fetch }).to_string();
    let mut raw = tokio::net::TcpStream::connect(n1.addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/sessions/b/execute HTTP/1.1\r\nhost: n1\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    raw.write_all(head.as_bytes()).await.expect("head");
    raw.write_all(&body.as_bytes()[..1])
        .await
        .expect("first byte");
    let db = cluster.db.clone();
    crate::harness::poll("n1 claims b", crate::harness::SLOW, || {
        let db = db.clone();
        async move {
            let live: i64 = crate::postgres::raw(&db)
                .await
                .query_one(
                    "SELECT count(*) FROM kb_sessions WHERE session = 'b' AND live",
                    &[],
                )
                .await
                .expect("kb_sessions")
                .get(0);
            (live == 1).then_some(())
        }
    })
    .await;

    // Policies set through n1 (kept there too), then deleted through n2: n1's copies are
    // stale, newer than b's. Then more policies through n1: the catalog has room (b's and
    // theirs), n1's table needs room.
    for i in 0..26 {
        let r = put(
            n1,
            format!("/v1/sessions/d{i}/network"),
            big_policy(&format!("d{i}")),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    }
    for i in 0..26 {
        let r = n2.api.delete(&format!("/v1/sessions/d{i}"), TOKEN).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{:?}", r.json());
    }
    for i in 0..45 {
        let r = put(
            n1,
            format!("/v1/sessions/c{i}/network"),
            big_policy(&format!("c{i}")),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{:?}", r.json());
    }

    // b's body ends: its kernel starts on n1 under b's own policy.
    raw.write_all(&body.as_bytes()[1..]).await.expect("rest");
    let mut answer = Vec::new();
    raw.read_to_end(&mut answer).await.expect("answer");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("refused (not_allowed)"), "{answer}");
    cluster.finish().await;
}
