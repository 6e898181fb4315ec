//! Per-tenant usage over real HTTP against the real engine (`docs/usage.md`): the metrics
//! carry tenant labels and never session ones.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use serde_json::json;

use http::{tenant, tenants, TestServer};

/// The value of the one metrics line starting with `series ` (0 when absent).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_cells_and_kernels_per_tenant_and_never_name_a_session() {
    let srv = TestServer::start(
        "usage-metrics",
        tenants(vec![tenant("ua", "tok-a"), tenant("ub", "tok-b")]),
        |_| {},
    )
    .await;
    let api = &srv.api;
    api.run("tok-a", "sess-secret-1", "x = 1").await;
    let failed = api
        .execute("tok-a", "sess-secret-1", json!({"code": "1/0"}))
        .await;
    assert_eq!(failed.json()["status"], "error");
    api.run("tok-a", "sess-secret-2", "y = 2").await;
    let failed = api
        .execute(
            "tok-b",
            "sess-secret-3",
            json!({"code": "raise ValueError()"}),
        )
        .await;
    assert_eq!(failed.json()["status"], "error");
    let text = api.metrics("tok-a").await;

    let cells = |t: &str, s: &str| {
        value(
            &text,
            &format!("kernelbox_tenant_cells_total{{tenant=\"{t}\",status=\"{s}\"}}"),
        )
    };
    assert_eq!(cells("ua", "success"), 2.0, "{text}");
    assert_eq!(cells("ua", "error"), 1.0, "{text}");
    assert_eq!(cells("ub", "success"), 0.0, "{text}");
    assert_eq!(cells("ub", "error"), 1.0, "{text}");
    let cold = |t: &str| {
        value(
            &text,
            &format!("kernelbox_tenant_new_kernels_total{{tenant=\"{t}\",how=\"cold_start\"}}"),
        )
    };
    assert_eq!(cold("ua"), 2.0, "{text}");
    assert_eq!(cold("ub"), 1.0, "{text}");
    let live = |t: &str| {
        value(
            &text,
            &format!("kernelbox_tenant_kernels_live{{tenant=\"{t}\"}}"),
        )
    };
    assert_eq!(live("ua"), 2.0, "{text}");
    assert_eq!(live("ub"), 1.0, "{text}");
    assert_eq!(srv.tenant_containers("ua").await.len(), 2);
    assert!(
        !text.contains("sess-secret"),
        "a session became a label: {text}"
    );
    assert!(!text.contains("session="), "{text}");

    // A cleared session is not a loss; an OOM-free workload loses nothing.
    let lost = value(
        &text,
        "kernelbox_tenant_kernel_losses_total{tenant=\"ua\",reason=\"idle_reaped\"}",
    );
    assert_eq!(lost, 0.0, "{text}");
    srv.finish().await;
}
