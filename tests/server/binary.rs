//! The `kernelbox serve` binary: SIGTERM cleanup, tenants-file errors, who may read `/metrics`.

use std::time::Duration;

use serde_json::json;
use tokio::io::AsyncBufReadExt;

use crate::common;
use crate::http::Api;

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_the_running_cell_finish_then_removes_everything_and_exits_0() {
    let label = common::unique("srv-sigterm");
    let engine = common::engine().await;
    let state = tempfile::tempdir().expect("state dir");
    let mut child = common::serve_command(&label, "tok-bin")
        .env("KERNELBOX_STATE_DIR", state.path())
        .spawn()
        .expect("spawn kernelbox serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let addr = crate::common::serving_addr(&mut lines).await;
    let api = Api::new(addr);
    api.run("tok-bin", "idle", "a = 1").await;
    let mut events = api
        .stream(
            "tok-bin",
            "s",
            json!({"code": "print('started', flush=True)\nimport time\ntime.sleep(2)\nprint('done')"}),
        )
        .await;
    events.until_output("started").await;

    common::sigterm(&child).await;

    // The running cell finishes (drain), then the process exits 0 with nothing left.
    let result = events.result().await;
    assert_eq!(result["status"], "success", "{result}");
    assert!(result["output"].as_str().expect("output").contains("done"));
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the server exits after SIGTERM")
        .expect("wait");
    assert_eq!(status.code(), Some(0));
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
    common::assert_clean(&engine, &label).await;
}

/// A supervisor that closed the server's log pipe (or died) must still be able to stop it:
/// SIGTERM shuts it down cleanly, exit 0, every kernel removed.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_stops_the_server_even_with_its_stderr_closed() {
    let label = common::unique("srv-stderr-closed");
    let engine = common::engine().await;
    let state = tempfile::tempdir().expect("state dir");
    let mut child = common::serve_command(&label, "tok-bin")
        .args(["--pool", "1"])
        .env("KERNELBOX_STATE_DIR", state.path())
        // Log lines all along the shutdown: each write to the closed stderr fails.
        .env("KERNELBOX_LOG", "debug")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn kernelbox serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let addr = crate::common::serving_addr(&mut lines).await;
    // The read end goes: every later write to the server's stderr fails.
    drop(lines);
    Api::new(addr).run("tok-bin", "s", "a = 1").await;
    let status = common::terminate(&mut child, Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0));
    common::assert_clean(&engine, &label).await;
}

#[tokio::test]
async fn bad_tenants_files_fail_with_exit_2_naming_the_file_and_field() {
    let dir = std::env::temp_dir().join(common::unique("srv-tenants"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bad = dir.join("tenants.json");
    std::fs::write(
        &bad,
        r#"{"tenants": [{"name": "acme", "token_sha256": "xyz"}]}"#,
    )
    .expect("write");
    let missing = dir.join("missing.json");
    for (file, field) in [(&bad, "tenants[0].token_sha256"), (&missing, "cannot read")] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
            .args(["serve", "--listen", "127.0.0.1:0", "--tenants"])
            .arg(file)
            .output()
            .await
            .expect("run kernelbox serve");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(&file.display().to_string()), "{stderr}");
        assert!(stderr.contains(field), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/metrics` shows every tenant's activity: on the API listener it needs a tenant's token
/// (401 without one), unless the operator opts out with `--public-metrics`
/// (`KERNELBOX_PUBLIC_METRICS`); `--metrics-listen` serves it to anyone on an address of its
/// own (tests/connections.rs). docs/http-api.md, "Metrics".
#[tokio::test(flavor = "multi_thread")]
async fn metrics_on_the_api_listener_need_a_token_unless_the_operator_makes_them_public() {
    for public in [
        None,
        Some("--public-metrics"),
        Some("KERNELBOX_PUBLIC_METRICS"),
    ] {
        let label = common::unique("srv-metrics");
        let engine = common::engine().await;
        let state = tempfile::tempdir().expect("state dir");
        let mut command = common::serve_command(&label, "tok-bin");
        command
            .args(["--pool", "0"])
            .env("KERNELBOX_STATE_DIR", state.path())
            .env_remove("KERNELBOX_PUBLIC_METRICS")
            .env_remove("KERNELBOX_METRICS_LISTEN");
        match public {
            Some(flag) if flag.starts_with("--") => {
                command.arg(flag);
            }
            Some(var) => {
                command.env(var, "true");
            }
            None => {}
        }
        let mut child = command.spawn().expect("spawn kernelbox serve");
        let stderr = child.stderr.take().expect("stderr");
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let addr = crate::common::serving_addr(&mut lines).await;
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let api = Api::new(addr);

        let anonymous = api.get("/metrics", None).await;
        let wrong = api.get("/metrics", Some("not-a-token")).await;
        if public.is_some() {
            assert_eq!(anonymous.status, hyper::StatusCode::OK, "{public:?}");
            assert_eq!(wrong.status, hyper::StatusCode::OK, "{public:?}");
        } else {
            assert_eq!(
                anonymous.error(hyper::StatusCode::UNAUTHORIZED),
                "unauthorized"
            );
            assert_eq!(wrong.error(hyper::StatusCode::UNAUTHORIZED), "unauthorized");
            assert!(
                !String::from_utf8_lossy(&anonymous.body).contains("kernelbox_"),
                "no metric leaks in the refusal"
            );
        }
        let authenticated = api.get("/metrics", Some("tok-bin")).await;
        assert_eq!(authenticated.status, hyper::StatusCode::OK, "{public:?}");
        assert!(String::from_utf8_lossy(&authenticated.body).contains("kernelbox_kernels_live "));
        // Health and the API description stay open.
        assert_eq!(
            api.get("/healthz", None).await.status,
            hyper::StatusCode::OK
        );
        assert_eq!(
            api.get("/openapi.json", None).await.status,
            hyper::StatusCode::OK
        );

        let status = common::terminate(&mut child, Duration::from_secs(60)).await;
        assert_eq!(status.code(), Some(0));
        common::assert_clean(&engine, &label).await;
    }
}
