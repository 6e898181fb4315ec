//! Interrupts (`docs/contract.md`, "Statuses"): a running cell gets KeyboardInterrupt and ends
//! `interrupted` with its kernel and state kept, whatever it is blocked in (`time.sleep`, a
//! busy loop, `input()`, a subprocess, a tool call); one that swallows it is killed after the
//! grace; a SIGINT landing anywhere leaves the runner working. And
//! `POST /v1/sessions/{session}/interrupt` with cells queued behind a running one: every
//! cancelled cell ends `interrupted` (the queued ones without running), and the count
//! answered covers them all.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::sync::Arc;
use std::time::Duration;

use hyper::StatusCode;
use kernelbox::{CellResult, CellStatus, ExecuteRequest, Scope, ToolCall, ToolDispatcher};
use serde_json::{json, Value};

use common::Case;
use http::{tenant, tenants, TestServer};

/// Waits (bounded) until the session's kernel has `attached` calls and is busy.
async fn wait_attached(srv: &TestServer, attached: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let kernels = srv.api.kernels("tok").await;
        if kernels
            .iter()
            .any(|k| k["session"] == "s" && k["state"] == "busy" && k["attached"] == attached)
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {attached} attached: {kernels:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_cells_of_an_interrupted_session_end_interrupted_without_running() {
    let srv = TestServer::start(
        "interrupt-queued",
        tenants(vec![tenant("acme", "tok")]),
        |_| {},
    )
    .await;
    let execute = |code: &'static str| {
        let api = srv.api.clone();
        tokio::spawn(async move {
            let reply = api
                .execute("tok", "s", json!({"code": code, "timeout": 300}))
                .await;
            assert_eq!(reply.status, StatusCode::OK);
            reply.json()
        })
    };
    let running = execute("import time\ntime.sleep(100)");
    wait_attached(&srv, 1).await;
    let queued = [execute("queued_one = 1"), execute("queued_two = 2")];
    wait_attached(&srv, 3).await;

    let reply = srv.api.interrupt("tok", "s").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        json!({"interrupted": 3}),
        "every cancelled cell counts"
    );

    let first: Value = running.await.unwrap();
    assert_eq!(first["status"], "interrupted", "{first}");
    assert_eq!(first["kernel"]["execution_count"], 1, "{first}");
    for cell in queued {
        let r: Value = cell.await.unwrap();
        assert_eq!(r["status"], "interrupted", "{r}");
        assert_eq!(r["exit_code"], -1, "{r}");
        assert_eq!(r["kernel"]["execution_count"], 0, "it never ran: {r}");
        let error = r["error"].as_str().unwrap_or_default();
        assert!(error.starts_with("Interrupted before it ran"), "{r}");
    }
    // Nothing of the queued cells ran, and the interrupted kernel's loss is reported once.
    let next = srv
        .api
        .run("tok", "s", "print('queued_one' in dir())")
        .await;
    assert_eq!(next["output"], "False\n", "{next}");
    assert_eq!(next["kernel"]["state_lost"], Value::Null, "kept: {next}");
    assert_eq!(next["kernel"]["reused"], true, "{next}");
    assert!(common::containers(&srv.engine, &srv.label).await.len() == 1);
    srv.finish().await;
}

/// Sets `x`, interrupts `code` once it printed `started`, and checks the contract: status
/// `interrupted`, the kept-kernel message, KeyboardInterrupt in the output, then `x` still
/// there in the same kernel with no loss.
async fn interrupted_keeps_state(case: &Case, session: &str, code: &str) -> CellResult {
    let first = case.run(session, "x = 41").await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    let cell = common::start_cell(&case.kb, session, code).await;
    let started = tokio::time::Instant::now();
    assert_eq!(case.kb.interrupt(None, session).await, 1, "{code}");
    let r = cell.await.unwrap().expect("execute");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "it stopped on the interrupt, not at the grace: {r:?}"
    );
    assert_eq!(r.status, CellStatus::Interrupted, "{code}: {r:?}");
    assert_eq!(r.exit_code, -1, "{r:?}");
    assert_eq!(r.error.as_deref(), Some(common::INTERRUPTED), "{r:?}");
    assert!(r.output.contains("KeyboardInterrupt"), "{code}: {r:?}");
    assert_eq!(r.hint, None, "{r:?}");
    let next = case.run(session, "print(x + 1)").await;
    assert_eq!(next.output, "42\n", "the state survived {code}: {next:?}");
    assert!(next.kernel.reused, "{next:?}");
    assert_eq!(next.kernel.id, first.kernel.id, "the same kernel");
    assert!(next.kernel.state_lost.is_none(), "{next:?}");
    r
}

#[tokio::test]
async fn an_interrupt_keeps_the_kernel_and_its_state_whatever_the_cell_is_blocked_in() {
    let case = Case::with("int-kept", |c| {
        c.cells.interrupt_grace = Duration::from_secs(10)
    })
    .await;
    let sleep = "import time\nprint('started', flush=True)\ntime.sleep(100)";
    interrupted_keeps_state(&case, "sleep", sleep).await;
    let busy = "print('started', flush=True)\nn = 0\nwhile True:\n    n += 1";
    interrupted_keeps_state(&case, "busy", busy).await;
    // A blocking input(): the cell's stdin is a pipe nobody writes to.
    let input = "import os, sys\nr, w = os.pipe()\nos.dup2(r, 0)\nsys.stdin = open(0)\n\
                 print('started', flush=True)\ninput()";
    interrupted_keeps_state(&case, "input", input).await;
    // `started` comes from the child once it runs, so the interrupt finds subprocess.run
    // waiting on it (one landing inside Popen's own start leaves the child running, as in
    // Python anywhere).
    let sub = "import subprocess\nsubprocess.run(['sh', '-c', 'echo started; exec sleep 100'])";
    interrupted_keeps_state(&case, "sub", sub).await;
    // subprocess.run killed its child on the way out (SIGKILL: gone within moments; a
    // zombie has no command line).
    let left = case
        .run(
            "sub",
            "import os, time\ndef sleeping():\n    n = 0\n    for p in os.listdir('/proc'):\n        \
             try:\n            n += open('/proc/%s/cmdline' % p, 'rb').read().startswith(b'sleep')\n        \
             except OSError:\n            pass\n    return n\nend = time.time() + 5\n\
             while sleeping() and time.time() < end:\n    time.sleep(0.05)\nprint(sleeping())",
        )
        .await;
    assert_eq!(left.output, "0\n", "{left:?}");
    // A `kill` event with SIGINT is no outside kill: a later crash is a crash.
    let crash = case.run("sleep", "import os\nos._exit(3)").await;
    assert_eq!(
        crash.error.as_deref(),
        Some(
            "The kernel died unexpectedly (exit code 3); its state was lost. The next \
             execute_code call starts a fresh kernel."
        ),
        "{crash:?}"
    );
    case.finish().await;
}

/// A dispatcher whose calls never return.
struct Never;

#[async_trait::async_trait]
impl ToolDispatcher for Never {
    async fn dispatch(&self, _call: ToolCall) -> Result<Value, String> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_cell_waiting_on_a_tool_call_is_interrupted_and_keeps_its_state() {
    let case = Case::new("int-tool").await;
    let scope = || Scope::session("t").tools(["slow"]);
    case.exec(ExecuteRequest::new(scope(), "x = 41")).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let request = ExecuteRequest {
        dispatcher: Some(Arc::new(Never)),
        sink: Some(Arc::new(move |_, _b: &[u8]| {
            let _ = tx.send(());
        })),
        ..ExecuteRequest::new(
            scope(),
            "import kernel_tools\nprint('started', flush=True)\nkernel_tools.slow()",
        )
    };
    let kb = case.kb.clone();
    let cell = tokio::spawn(async move { kb.execute(request).await });
    rx.recv().await.unwrap();
    // The call may or may not have reached the dispatcher yet: either way the cell stops.
    assert_eq!(case.kb.interrupt(None, "t").await, 1);
    let r = cell.await.unwrap().unwrap();
    assert_eq!(r.status, CellStatus::Interrupted, "{r:?}");
    assert!(r.output.contains("KeyboardInterrupt"), "{r:?}");
    let next = case
        .exec(ExecuteRequest::new(scope(), "print(x + 1)"))
        .await;
    assert_eq!(next.output, "42\n", "{next:?}");
    assert!(next.kernel.state_lost.is_none(), "{next:?}");
    case.finish().await;
}

#[tokio::test]
async fn a_cell_that_swallows_keyboard_interrupt_is_killed_after_the_grace() {
    let case = Case::with("int-grace", |c| {
        c.cells.interrupt_grace = Duration::from_secs(2)
    })
    .await;
    case.run("s", "x = 1").await;
    let code = "import time\nprint('started', flush=True)\nwhile True:\n    try:\n        \
                time.sleep(100)\n    except KeyboardInterrupt:\n        pass";
    let cell = common::start_cell(&case.kb, "s", code).await;
    let started = tokio::time::Instant::now();
    assert_eq!(case.kb.interrupt(None, "s").await, 1);
    let r = cell.await.unwrap().unwrap();
    assert!(started.elapsed() >= Duration::from_secs(2), "{r:?}");
    assert_eq!(r.status, CellStatus::Interrupted, "{r:?}");
    assert_eq!(
        r.error.as_deref(),
        Some(common::INTERRUPT_KILLED_2S),
        "{r:?}"
    );
    let next = case.run("s", "print('x' in globals())").await;
    assert_eq!(next.output, "False\n", "{next:?}");
    assert_eq!(
        next.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(kernelbox::LossReason::Killed),
        "{next:?}"
    );
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigint_landing_anywhere_leaves_the_runner_working() {
    use rand::Rng;
    let case = Case::new("int-anywhere").await;
    let first = case.run("s", "x = 0").await;
    let id = first.kernel.id.clone();
    // Cells that spend their time in the runner's own work: output, displays (in pieces),
    // the main result, and short cells (the signal then lands between cells).
    let cells = [
        "for i in range(3000):\n    print('line', i)\nx += 1",
        "for i in range(200):\n    display({'text/plain': 'd' * 9000}, raw=True)\nx += 1",
        "x += 1\n{'a': list(range(1000))}",
        "x += 1",
    ];
    for round in 0..40 {
        let code = cells[round % cells.len()];
        let kb = case.kb.clone();
        let cell = tokio::spawn(async move { kb.execute(ExecuteRequest::new("s", code)).await });
        let jitter = rand::rng().random_range(0..80_000);
        tokio::time::sleep(Duration::from_micros(jitter)).await;
        // Straight to the engine: it lands whether a cell runs or not.
        case.engine.interrupt(&id).await.unwrap();
        let r = cell.await.unwrap().unwrap();
        // It ran to its end, or it was hit in its own code (KeyboardInterrupt).
        assert!(
            r.status == CellStatus::Success
                || (r.status == CellStatus::Interrupted && r.output.contains("KeyboardInterrupt")),
            "round {round}: {r:?}"
        );
        // Whatever it hit, the kernel answers the next cell, with its state. The container's
        // init (docker-init) forwards the signal to the runner on its own time, so one sent
        // as a short cell ended can land in this probe instead: it then ends interrupted like
        // any cell, and the probe is asked again.
        let mut next = case.run("s", "print(type(x).__name__)").await;
        if next.status == CellStatus::Interrupted && next.output.contains("KeyboardInterrupt") {
            next = case.run("s", "print(type(x).__name__)").await;
        }
        assert_eq!(next.output, "int\n", "round {round}: {next:?}");
        assert_eq!(next.kernel.id, first.kernel.id, "round {round}: {next:?}");
    }
    case.finish().await;
}
