//! `POST /v1/sessions/{session}/commands` (`docs/contract.md`, "Commands"), against the real
//! engine: stdout and stderr apart, exit codes, a timeout that kills the command's process
//! group (its `sleep 100 &` child too) while the kernel and a cell's `x` survive, streaming in
//! order, output bounded as a cell's, commands beside a running cell and the per-session limit;
//! and the clients of it: the Rust client (`Client::run_command`) and `kernelbox sh --url`
//! (`docs/cli.md`: its streams are the command's, its exit code the command's, 124 on a
//! timeout).

use std::time::Duration;

use hyper::StatusCode;
use serde_json::{json, Value};

use crate::http::{tenant, tenants, TestServer};

async fn command(srv: &TestServer, session: &str, body: Value) -> Value {
    let reply = srv
        .api
        .post(
            &format!("/v1/sessions/{session}/commands"),
            Some("tok"),
            body,
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    reply.json()
}

/// Counts the kernel's processes whose command line starts with `prefix`.
fn count_processes(prefix: &str) -> String {
    format!(
        "import os\nn = 0\nfor p in os.listdir('/proc'):\n    try:\n        \
         n += open('/proc/%s/cmdline' % p, 'rb').read().startswith({prefix:?}.encode())\n    \
         except OSError:\n        pass\nprint(n)"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_command_runs_beside_the_kernel_with_its_streams_apart() {
    let srv = TestServer::start("cmd-basic", tenants(vec![tenant("acme", "tok")]), |_| {}).await;
    // A command starts the session's kernel, as the kernel's user in its working directory.
    let r = command(
        &srv,
        "s",
        json!({"command": "echo out; echo err >&2; id -u; pwd; exit 3"}),
    )
    .await;
    assert_eq!(r["exit_code"], 3, "{r}");
    let uid = srv
        .api
        .run("tok", "s", "import os\nprint(os.getuid())")
        .await;
    let expected = format!("out\n{}/work\n", uid["output"].as_str().unwrap());
    assert_eq!(r["stdout"], expected.as_str(), "as the kernel's user: {r}");
    assert_eq!(r["stderr"], "err\n", "{r}");
    assert_eq!(r["timed_out"], false, "{r}");
    // An argv, stdin, env and cwd; the same kernel as the cells (files are shared).
    srv.api
        .run("tok", "s", "open('made-by-cell.txt', 'w').write('hi')")
        .await;
    let r = command(
        &srv,
        "s",
        json!({"command": ["sh", "-c", "cat; echo \"$GREETING\"; ls"], "stdin": "from stdin\n",
               "env": {"GREETING": "hello"}, "cwd": "."}),
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "from stdin\nhello\nmade-by-cell.txt\n", "{r}");
    // A program that does not exist, and bad requests.
    let r = command(&srv, "s", json!({"command": ["no-such-program"]})).await;
    assert_eq!(r["exit_code"], 127, "{r}");
    assert!(
        r["stderr"].as_str().unwrap().contains("no-such-program"),
        "{r}"
    );
    let bad = srv
        .api
        .post(
            "/v1/sessions/s/commands",
            Some("tok"),
            json!({"command": []}),
        )
        .await;
    assert_eq!(bad.error(StatusCode::BAD_REQUEST), "invalid_command");
    let bad = srv
        .api
        .post(
            "/v1/sessions/s/commands",
            Some("tok"),
            json!({"command": "true", "timeout": "soon"}),
        )
        .await;
    assert_eq!(bad.error(StatusCode::BAD_REQUEST), "invalid_timeout");
    // Output is bounded as a cell's: the first 40% and the last 60% of the cap.
    let r = command(
        &srv,
        "s",
        json!({"command": "head -c 200000 /dev/zero | tr '\\0' a"}),
    )
    .await;
    assert_eq!(r["stdout_truncated"], true, "{}", r["stdout_bytes_total"]);
    assert_eq!(r["stdout_bytes_total"], 200_000);
    assert!(r["stdout"].as_str().unwrap().len() < 51_000);
    assert_eq!(r["stderr_truncated"], Value::Null);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_kills_the_commands_process_group_and_nothing_else() {
    let srv = TestServer::start("cmd-timeout", tenants(vec![tenant("acme", "tok")]), |_| {}).await;
    let first = srv.api.run("tok", "s", "x = 41").await;
    let started = tokio::time::Instant::now();
    let r = command(
        &srv,
        "s",
        json!({"command": "sleep 100 & echo started; sleep 100", "timeout": 1}),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(10), "{r}");
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["exit_code"], -1, "{r}");
    assert_eq!(r["stdout"], "started\n", "{r}");
    // Both sleeps are gone; the kernel and its state stayed.
    let left = srv.api.run("tok", "s", &count_processes("sleep")).await;
    assert_eq!(left["output"], "0\n", "{left}");
    let next = srv.api.run("tok", "s", "print(x + 1)").await;
    assert_eq!(next["output"], "42\n", "{next}");
    assert_eq!(next["kernel"]["id"], first["kernel"]["id"], "{next}");
    assert_eq!(next["kernel"]["state_lost"], Value::Null, "{next}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_kills_processes_that_left_the_commands_group_or_session() {
    // `docs/reliability.md`, "Commands": a `setsid` child, a double fork and a `setpgid`
    // all stay in the leader's tree, so the timeout kills them with the command.
    let srv = TestServer::start("cmd-escape", tenants(vec![tenant("acme", "tok")]), |_| {}).await;
    let first = srv.api.run("tok", "s", "x = 41").await;
    let escapes = "setsid sleep 301 & (sleep 302 &) ; \
         python3 -c 'import os; os.setpgid(0, 0); os.execvp(\"sleep\", [\"sleep\", \"303\"])' & \
         (setsid sh -c 'sleep 304 & sleep 305' &) ; echo started; sleep 306";
    let r = command(&srv, "s", json!({"command": escapes, "timeout": 2})).await;
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["stdout"], "started\n", "{r}");
    // Listed from outside by the engine (`docker top`): no sleep is left.
    let containers = srv.tenant_containers("acme").await;
    assert_eq!(containers.len(), 1, "{containers:?}");
    let top = bollard::Docker::connect_with_defaults()
        .unwrap()
        .top_processes(
            &containers[0],
            Some(bollard::query_parameters::TopOptions {
                ps_args: "-eo pid,args".into(),
            }),
        )
        .await
        .expect("docker top");
    let left: Vec<String> = top
        .processes
        .unwrap_or_default()
        .into_iter()
        .map(|p| p.join(" "))
        .filter(|p| p.contains("sleep 30"))
        .collect();
    assert!(left.is_empty(), "left after the timeout: {left:?}");
    let left = srv.api.run("tok", "s", &count_processes("sleep")).await;
    assert_eq!(left["output"], "0\n", "{left}");
    // The kernel and its state stayed.
    let next = srv.api.run("tok", "s", "print(x + 1)").await;
    assert_eq!(next["output"], "42\n", "{next}");
    assert_eq!(next["kernel"]["id"], first["kernel"]["id"], "{next}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_kills_a_fork_bomb_that_took_every_pid() {
    // `docs/reliability.md`, "A command's processes at its timeout": a fork bomb fills the
    // container's pids limit, so no new process (the server's killer) can start, and every
    // process it kills would be replaced at once. The leader stops the tree at the timeout
    // (stopped processes neither fork nor free a pid), then kills it: none is left, and the
    // kernel and its state stay.
    let srv = TestServer::start("cmd-bomb", tenants(vec![tenant("acme", "tok")]), |_| {}).await;
    let first = srv.api.run("tok", "s", "x = 41").await;
    let bomb = "python3 -c '# kbbomb\nimport os, time\nwhile True:\n    try:\n        \
                os.fork()\n    except OSError:\n        time.sleep(0.001)\n'";
    let r = command(&srv, "s", json!({"command": bomb, "timeout": 2})).await;
    assert_eq!(r["timed_out"], true, "{r}");
    let left = srv
        .api
        .run("tok", "s", &count_processes("python3\0-c\0# kbbomb"))
        .await;
    assert_eq!(left["output"], "0\n", "{left}");
    let next = srv.api.run("tok", "s", "print(x + 1)").await;
    assert_eq!(next["output"], "42\n", "{next}");
    assert_eq!(next["kernel"]["id"], first["kernel"]["id"], "{next}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_timeout_spares_the_kernel_even_when_it_holds_the_commands_output() {
    // `docs/reliability.md`, "A command's processes at its timeout": a holder of the
    // command's output pipe is killed only when it started after the command's leader. A
    // cell that was handed the pipe (over a Unix socket) keeps its kernel and state.
    let srv = TestServer::start("cmd-holder", tenants(vec![tenant("acme", "tok")]), |_| {}).await;
    let cell = "import socket, threading, array\nx = 41\nheld = []\n\
                s = socket.socket(socket.AF_UNIX)\ns.bind('/tmp/kb-fd')\ns.listen(1)\n\
                def take():\n    c, _ = s.accept()\n    \
                _, anc, _, _ = c.recvmsg(1, socket.CMSG_LEN(4))\n    \
                held.extend(array.array('i', d)[0] for _, _, d in anc)\n\
                threading.Thread(target=take, daemon=True).start()";
    let first = srv.api.run("tok", "s", cell).await;
    assert_eq!(first["status"], "success", "{first}");
    let give = "python3 -c 'import socket, array\ns = socket.socket(socket.AF_UNIX)\n\
                s.connect(\"/tmp/kb-fd\")\n\
                s.sendmsg([b\"x\"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array(\"i\", [1]))])\n'\
                ; sleep 100";
    let r = command(&srv, "s", json!({"command": give, "timeout": 2})).await;
    assert_eq!(r["timed_out"], true, "{r}");
    let next = srv.api.run("tok", "s", "print(x + 1, len(held))").await;
    assert_eq!(next["output"], "42 1\n", "{next}");
    assert_eq!(next["kernel"]["id"], first["kernel"]["id"], "{next}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streamed_command_sends_its_streams_in_order_then_the_result() {
    let srv = TestServer::start("cmd-stream", tenants(vec![tenant("acme", "tok")]), |_| {}).await;
    let mut events = srv
        .api
        .stream_command(
            "tok",
            "s",
            json!({"command": "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three"}),
        )
        .await;
    let mut seen = Vec::new();
    let result = loop {
        let event = events.next().await.expect("a result");
        match event["event"].as_str() {
            Some("stdout" | "stderr") => seen.push((
                event["event"].as_str().unwrap().to_string(),
                event["data"].as_str().unwrap().to_string(),
            )),
            Some("result") => break event["result"].clone(),
            _ => panic!("unexpected {event}"),
        }
    };
    let order: Vec<(&str, &str)> = seen.iter().map(|(e, d)| (e.as_str(), d.as_str())).collect();
    assert_eq!(
        order,
        [
            ("stdout", "one\n"),
            ("stderr", "two\n"),
            ("stdout", "three\n")
        ]
    );
    assert_eq!(result["stdout"], "one\nthree\n", "{result}");
    assert_eq!(result["exit_code"], 0, "{result}");
    assert!(
        events.next().await.is_none(),
        "the stream ends after the result"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_run_beside_a_running_cell_up_to_the_sessions_limit() {
    let srv = TestServer::start(
        "cmd-concurrent",
        tenants(vec![tenant("acme", "tok")]),
        |_| {},
    )
    .await;
    let mut cell = srv
        .api
        .stream(
            "tok",
            "s",
            json!({"code": "import time\nprint('started', flush=True)\nwhile not __import__('os').path.exists('go'):\n    time.sleep(0.05)\nprint('done')"}),
        )
        .await;
    cell.until_output("started").await;
    // Four commands hold the session's limit while the cell runs.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut events = srv
            .api
            .stream_command(
                "tok",
                "s",
                json!({"command": "echo in; while [ ! -e go ]; do sleep 0.05; done"}),
            )
            .await;
        let first = events.next().await.expect("an event");
        assert_eq!(first["event"], "stdout", "{first}");
        held.push(events);
    }
    let refused = srv
        .api
        .post(
            "/v1/sessions/s/commands",
            Some("tok"),
            json!({"command": "true"}),
        )
        .await;
    assert_eq!(
        refused.error(StatusCode::TOO_MANY_REQUESTS),
        "too_many_commands"
    );
    // Another session is not limited by this one.
    let other = command(&srv, "t", json!({"command": "echo ok"})).await;
    assert_eq!(other["stdout"], "ok\n");
    // A file releases the cell and the held commands, which all end well.
    let put = srv
        .api
        .put("/v1/sessions/s/files/go", "tok", Vec::new(), None)
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.json());
    for mut events in held {
        let result = loop {
            let event = events.next().await.expect("a result");
            if event["event"] == "result" {
                break event["result"].clone();
            }
        };
        assert_eq!(result["exit_code"], 0, "{result}");
    }
    let result = cell.result().await;
    assert_eq!(result["status"], "success", "{result}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_rust_client_and_kernelbox_sh_run_commands_on_a_server() {
    let srv = TestServer::start("cmd-clients", tenants(vec![tenant("acme", "tok")]), |_| {}).await;
    let client = kernelbox::client::Client::new(&srv.api.base, Some("tok".into()));
    let body = kernelbox::wire::CommandBody {
        command: kernelbox::wire::CommandLine::Shell("cat; echo $K >&2; pwd; exit 4".into()),
        cwd: Some("/tmp".into()),
        env: [("K".to_string(), "v".to_string())].into(),
        stdin: Some("in\n".into()),
        timeout: Some(json!(20)),
    };
    let r = client
        .run_command("c", &body)
        .await
        .expect("a command result");
    assert_eq!(
        (
            r.exit_code,
            r.stdout.as_str(),
            r.stderr.as_str(),
            r.timed_out
        ),
        (4, "in\n/tmp\n", "v\n", false),
        "{r:?}"
    );
    // A refusal is the server's status and code.
    let bad = kernelbox::wire::CommandBody {
        command: kernelbox::wire::CommandLine::Argv(Vec::new()),
        ..Default::default()
    };
    match client.run_command("c", &bad).await {
        Err(kernelbox::client::ClientError::Refused { status, message }) => {
            assert_eq!(status, StatusCode::BAD_REQUEST, "{message}");
        }
        other => panic!("an empty command was not refused: {other:?}"),
    }
    // `kernelbox sh`: the command's stdout and stderr on its own, its exit code.
    let sh = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
            .args(["sh", "c", "--url", &srv.api.base, "--token", "tok"])
            .args(args)
            .output()
            .expect("kernelbox sh runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    assert_eq!(sh(&["--", "mkdir", "sub"]).0, Some(0));
    let (code, out, err) = sh(&[
        "--env",
        "K=v",
        "--cwd",
        "sub",
        "--",
        "sh",
        "-c",
        "pwd; echo $K >&2; exit 7",
    ]);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (Some(7), "/work/sub\n", "v\n")
    );
    // The kernel is the session's: a file the command wrote is the cell's.
    let (code, _, _) = sh(&["--cwd", "sub", "--", "sh", "-c", "echo shared > f"]);
    assert_eq!(code, Some(0));
    let read = srv
        .api
        .run("tok", "c", "print(open('sub/f').read().strip())")
        .await;
    assert_eq!(read["output"], "shared\n", "{read}");
    // A timeout exits 124 and says so on stderr.
    let (code, _, err) = sh(&["--timeout", "1", "--", "sleep", "30"]);
    assert_eq!(code, Some(124), "{err}");
    assert!(err.contains("timed out"), "{err}");
    // A refusal by the server is kernelbox's own exit code 2 (a 4xx), with its message.
    let (code, _, err) = sh(&["--cwd", "", "--", "true"]);
    assert_eq!(code, Some(2), "{err}");
    srv.finish().await;
}
