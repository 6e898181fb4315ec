//! Every node reloads its own copy of the same tenants file (docs/http-api.md, "Reloading the
//! tenants"): while the nodes disagree a forwarded request is authenticated again by the node
//! that serves it, so a rotated token works only where both nodes know it; once every node
//! has reloaded, the new token works everywhere and the old nowhere, and the sessions kept
//! their kernels.

use hyper::{Method, StatusCode};
use serde_json::{json, Value};

use crate::harness::{success, Cluster, Options, ADMIN, TOKEN};

const OLD: &str = "other-token-old";
const NEW: &str = "other-token-new";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_rotated_node_by_node_works_where_both_nodes_know_it() {
    let cluster = Cluster::start(
        "cl-reload",
        Options {
            more_tenants: &[("other", OLD)],
            ..Options::default()
        },
    )
    .await;
    let [a, b, c] = [&cluster.nodes[0], &cluster.nodes[1], &cluster.nodes[2]];
    let before = success(&a.api.execute(OLD, "s", json!({"code": "x = 7"})).await);
    success(&b.api.execute(TOKEN, "t", json!({"code": "y = 8"})).await);
    // other's session lives on a (GET /v1/kernels is answered by the node itself).
    assert_eq!(a.api.kernels(OLD).await.len(), 1);
    assert_eq!(b.sessions().await, ["t"]);

    // The file rotates other's token; only node a reloads.
    let file = cluster.tenants_file();
    let mut tenants: Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    for t in tenants["tenants"].as_array_mut().unwrap() {
        if t["name"] == "other" {
            t["token_sha256"] = json!(hex::encode(kernelbox::server::tenants::token_hash(NEW)));
        }
    }
    std::fs::write(&file, tenants.to_string()).unwrap();
    let reload = |api: crate::http::Api| async move {
        let reply = api
            .send(Method::POST, "/v1/admin/reload", ADMIN, false, None)
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
        assert_eq!(reply.json()["changed"], json!(["other"]));
    };
    reload(a.api.clone()).await;

    // The nodes disagree. On a (reloaded, the session's holder) the new token is served.
    success(&a.api.execute(NEW, "s", json!({"code": "print(x)"})).await);
    // b has not reloaded: it refuses the new token itself...
    let r = b.api.execute(NEW, "s", json!({"code": "print(x)"})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.json());
    // ...and accepts the old one, but a, where the session lives, refuses it.
    let r = b.api.execute(OLD, "s", json!({"code": "print(x)"})).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.json());

    // Every node reloaded: the new token everywhere, the old nowhere, the state kept.
    reload(b.api.clone()).await;
    reload(c.api.clone()).await;
    for node in [a, b, c] {
        let r = node.api.execute(OLD, "s", json!({"code": "1"})).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED, "on {}", node.name);
        let r = success(
            &node
                .api
                .execute(NEW, "s", json!({"code": "print(x)"}))
                .await,
        );
        assert_eq!(r["output"], "7\n", "on {}: {r}", node.name);
        assert_eq!(r["kernel"]["generation"], before["kernel"]["generation"]);
        let r = success(
            &node
                .api
                .execute(TOKEN, "t", json!({"code": "print(y)"}))
                .await,
        );
        assert_eq!(r["output"], "8\n", "on {}: {r}", node.name);
    }
    cluster.finish().await;
}
