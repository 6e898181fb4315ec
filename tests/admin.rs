//! Admin verbs work from Docker labels alone, with no server: ps, inspect, logs, kill, sweep.
#![allow(clippy::unwrap_used)]

mod common;

use common::Case;
use serde_json::Value;

async fn kernelbox(args: &[&str]) -> (i32, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(args)
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn ps_inspect_logs_and_kill_work_from_labels() {
    let case = Case::new("admin").await;
    let tenant = format!("t{}", &case.label[case.label.len() - 8..]);
    let r = case
        .exec(kernelbox::ExecuteRequest {
            tenant: Some(tenant.clone()),
            ..kernelbox::ExecuteRequest::new("admin-s", "x = 1")
        })
        .await;
    let id = r.kernel.id.clone();

    let (code, out) = kernelbox(&["ps", "--tenant", &tenant, "--format", "json"]).await;
    assert_eq!(code, 0);
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["container"], id.as_str());
    assert_eq!(rows[0]["owner"], "admin-s");
    assert_eq!(rows[0]["cells"], 1);
    assert_eq!(rows[0]["busy"], false);
    assert!(rows[0]["idle_seconds"].is_u64());
    assert!(
        rows[0]["memory_bytes"].as_u64().unwrap_or(0) > 1 << 20,
        "{out}"
    );

    let (code, table) = kernelbox(&["ps", "--tenant", &tenant]).await;
    assert_eq!(code, 0);
    assert!(
        table.starts_with("CONTAINER") && table.contains(&id),
        "{table}"
    );

    let (code, out) = kernelbox(&["inspect", &id]).await;
    assert_eq!(code, 0);
    let inspected: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(inspected["labels"]["io.kernelbox.tenant"], tenant.as_str());

    let (code, out) = kernelbox(&["logs", &id]).await;
    assert_eq!(code, 0);
    assert!(out.contains("create") && out.contains("start"), "{out}");

    let (code, out) = kernelbox(&["kill", "--tenant", &tenant, "--format", "json"]).await;
    assert_eq!(code, 0);
    let killed: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(killed.len(), 1);
    assert!(case.containers().await.is_empty());
    assert!(
        case.volumes().await.is_empty(),
        "kill takes the staging volume too"
    );
    // The orchestrator notices on the next call and says why.
    let next = case
        .exec(kernelbox::ExecuteRequest {
            tenant: Some(tenant.clone()),
            ..kernelbox::ExecuteRequest::new("admin-s", "print('x' in dir())")
        })
        .await;
    assert!(next.output.contains("False"));
    assert_eq!(
        next.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(kernelbox::LossReason::Killed)
    );
    case.finish().await;
}

#[tokio::test]
async fn sweep_dry_run_reports_without_removing() {
    let (code, out) = kernelbox(&["sweep", "--dry-run", "--format", "json"]).await;
    assert_eq!(code, 0);
    let report: Value = serde_json::from_str(&out).unwrap();
    assert!(report["containers"].is_array() && report["volumes"].is_array());
    let (code, _) = kernelbox(&["kill"]).await;
    assert_eq!(code, 2, "kill needs a target");
}
