//! docs/cluster.md, "What is guaranteed": two agents of one node name (an engine briefly
//! running an old and a new task) never both serve: the one that registers while its
//! namesake's lease is fresh serves only once that lease has run out, and the namesake fences
//! when its renewal finds its epoch moved on.

use serde_json::json;

use crate::harness::{success, Cluster, Options, TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_agents_of_one_node_name_never_both_serve() {
    let mut cluster = Cluster::start("cl-namesake", Options::default()).await;
    let old = 1;
    success(
        &cluster.nodes[old]
            .api
            .execute(TOKEN, "held", json!({"code": "x = 1"}))
            .await,
    );
    let name = cluster.nodes[old].name.clone();
    let state = std::env::temp_dir().join(format!("kbswarm-namesake-{}", std::process::id()));
    // The namesake's "serving" line comes once it may serve.
    let twin = cluster.spawn(&name, "127.0.0.1:0", state.clone()).await;
    cluster.nodes.push(twin);
    let (a, b) = (old, cluster.nodes.len() - 1);
    // Sampled many times while they contend for the name: never both answer ready.
    let mut both = 0;
    let mut one = 0;
    for _ in 0..60 {
        let (ha, hb) = tokio::join!(cluster.nodes[a].health(), cluster.nodes[b].health());
        match (ha.0.is_success(), hb.0.is_success()) {
            (true, true) => both += 1,
            (true, false) | (false, true) => one += 1,
            _ => {}
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        both, 0,
        "two agents of node {name} served at once ({one} samples with one)"
    );
    cluster.finish().await;
    let _ = std::fs::remove_dir_all(state);
}
