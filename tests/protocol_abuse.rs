//! A cell that abuses the runner's private protocol descriptors hurts only its own session:
//! the host holds a bounded amount of memory for it, the abusing kernel is killed with a clear
//! message, the next call reports `state_lost: protocol`, and other sessions keep their state.
//!
//! The headline test runs the real `kernelbox serve` binary and measures its resident memory
//! while a cell writes a gigabyte of forged frames. Each test labels what it creates with a
//! unique `io.kernelbox-test.case` and asserts through the Docker API that nothing is left.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use common::{assert_clean, engine, memory_of, unique, Case, CASE, MIB};
use kernelbox::{CellStatus, ExecuteRequest};

/// The runner's protocol channel, found the way a hostile cell would find it.
const FIND_CHANNEL: &str = "import gc, os\n\
ch = [o for o in gc.get_objects() if type(o).__name__ == '_Channel'][0]\n";

/// Tries to write 1 GiB of forged frames to the runner's protocol descriptor from the cell's
/// own thread, so the runner never reads its stdin meanwhile: first frames nobody asked for
/// (padded `pong`s), then tool calls for absent and settled cells (each answered by a
/// refusal the runner never reads), then garbage and an over-long line. The host has no use
/// for any of it and kills the kernel once it has parsed 1 MiB of such input. Stops quietly
/// when the kernel goes.
const GIGABYTE_ATTACK: &str = "\
pong = b'{\"op\":\"pong\",\"pad\":\"' + b'p' * 4000 + b'\"}\\n'
forged = b''.join(b'{\"op\":\"tool_call\",\"cell\":%s,\"call\":%d,\"tool\":\"x\",\"args\":{}}\\n'
                  % (c, i) for i, c in enumerate([b'null', b'0', b'7', b'999999'] * 4096))
sent = 0
try:
    for phase, chunk in (('pong', pong * 256), ('tool_call', forged * ((1 << 20) // len(forged) + 1))):
        total = sent + (1 << 30)
        while sent < total:
            sent += os.write(ch.out, chunk)
        print(phase, 'phase done', sent >= total, flush=True)
    os.write(ch.out, b'not a frame\\n' * 100000)
    os.write(ch.out, b'x' * (64 << 20) + b'\\n')
except OSError:
    pass
print('attack finished', sent)
";

type Http = Client<HttpConnector, Full<Bytes>>;

struct Api {
    base: String,
    token: String,
    http: Http,
}

impl Api {
    async fn execute(&self, session: &str, code: &str, timeout: u64) -> Value {
        let body = json!({"code": code, "timeout": timeout}).to_string();
        let req = hyper::Request::post(format!("{}/v1/sessions/{session}/execute", self.base))
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = self.http.request(req).await.expect("HTTP request");
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let value: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{status}: {e}: {}", String::from_utf8_lossy(&body)));
        assert!(status.is_success(), "{status}: {value}");
        value
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gigabyte_of_forged_frames_costs_the_server_little_and_kills_only_the_abuser() {
    let label = unique("abuse-gigabyte");
    let engine = engine().await;
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--timeout",
            "600s",
            "--label",
        ])
        .arg(format!("{CASE}={label}"))
        .env("KERNELBOX_TOKEN", "tok-abuse")
        .env_remove("KERNELBOX_TENANTS")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn kernelbox serve");
    let pid = server.id().expect("pid");
    let mut lines = tokio::io::BufReader::new(server.stderr.take().expect("stderr")).lines();
    let addr = common::serving_addr(&mut lines).await;
    // Keep draining the server's stderr so it never blocks on a full pipe.
    let drain = tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let api = std::sync::Arc::new(Api {
        base: format!("http://{addr}"),
        token: "tok-abuse".into(),
        http: Client::builder(TokioExecutor::new()).build_http(),
    });

    // Both sessions have their kernels before the first measurement.
    let r = api.execute("bystander", "kept = 'safe'\nn = 0", 60).await;
    assert_eq!(r["status"], "success", "{r}");
    let r = api.execute("attacker", "x = 1", 60).await;
    assert_eq!(r["status"], "success", "{r}");
    let (rss_before, hwm_before) = memory_of(pid);

    let attack = {
        let api = api.clone();
        tokio::spawn(async move {
            api.execute("attacker", &format!("{FIND_CHANNEL}{GIGABYTE_ATTACK}"), 600)
                .await
        })
    };
    // The bystander keeps working during the attack and keeps its state (each of its cells
    // takes a moment inside its kernel, so it does not starve the attack of CPU).
    let mut during = 0;
    while !attack.is_finished() {
        let r = api
            .execute(
                "bystander",
                "import time\ntime.sleep(0.2)\nn += 1\nprint(kept, n)",
                60,
            )
            .await;
        assert_eq!(r["status"], "success", "{r}");
        assert_eq!(r["kernel"]["reused"], true, "{r}");
        during += 1;
    }
    let attacked = attack.await.unwrap();
    let (rss_after, hwm_after) = memory_of(pid);
    let growth = rss_after.saturating_sub(rss_before);
    let peak_growth = hwm_after.saturating_sub(hwm_before);
    eprintln!(
        "server VmRSS {:.1} MiB -> {:.1} MiB (+{:.1} MiB); VmHWM {:.1} MiB -> {:.1} MiB (+{:.1} MiB); \
         {during} bystander cells ran during the attack",
        rss_before as f64 / MIB,
        rss_after as f64 / MIB,
        growth as f64 / MIB,
        hwm_before as f64 / MIB,
        hwm_after as f64 / MIB,
        peak_growth as f64 / MIB,
    );
    assert!(
        growth < 50 * 1024 * 1024,
        "the server grew by {:.1} MiB",
        growth as f64 / MIB
    );

    // The abuser's cell says what happened; its next call reports the loss.
    assert_eq!(attacked["status"], "error", "{attacked}");
    assert_eq!(attacked["exit_code"], -1, "{attacked}");
    let error = attacked["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("broke the kernelbox protocol") && error.contains("was killed"),
        "{attacked}"
    );
    // Cut in the first phase: the host parses 1 MiB of frames nobody asked for, not 1 GiB.
    assert!(error.contains("had no use for"), "{attacked}");
    let output = attacked["output"].as_str().unwrap_or_default();
    assert!(!output.contains("phase done"), "{attacked}");
    let next = api.execute("attacker", "print(x)", 60).await;
    assert_eq!(next["kernel"]["state_lost"]["reason"], "protocol", "{next}");
    assert_eq!(next["kernel"]["reused"], false, "{next}");
    assert_eq!(next["status"], "error", "x is gone: {next}");
    let again = api.execute("attacker", "print('fresh')", 60).await;
    assert_eq!(again["status"], "success", "{again}");

    let r = api.execute("bystander", "print(kept, n)", 60).await;
    assert_eq!(r["status"], "success", "{r}");
    assert_eq!(r["output"], format!("safe {during}\n"), "{r}");
    assert_eq!(r["kernel"]["reused"], true, "{r}");

    let status = common::terminate(&mut server, Duration::from_secs(60)).await;
    assert_eq!(status.code(), Some(0));
    drain.abort();
    assert_clean(&engine, &label).await;
}

/// Asserts `r` is the protocol-violation result and that the next call reports the loss.
async fn assert_killed_for_protocol(case: &Case, session: &str, r: &kernelbox::CellResult) {
    assert_eq!(r.status, CellStatus::Error, "{r:?}");
    assert_eq!(r.exit_code, -1, "{r:?}");
    let error = r.error.clone().unwrap_or_default();
    assert!(
        error.starts_with("The kernel broke the kernelbox protocol (")
            && error.ends_with(
                "and was killed; its state was lost. The next execute_code call starts a fresh kernel."
            ),
        "{error}"
    );
    let next = case.run(session, "print('fresh')").await;
    assert_eq!(next.status, CellStatus::Success, "{next:?}");
    assert_eq!(
        next.kernel.state_lost.as_ref().map(|l| l.reason.as_str()),
        Some("protocol"),
        "{next:?}"
    );
    assert!(!next.kernel.reused, "{next:?}");
}

#[tokio::test]
async fn within_bounds_nothing_trips_and_an_over_long_frame_line_kills_the_kernel() {
    let case = Case::new("abuse-long-line").await;
    // Forged frames within bounds are refused and mislead nobody but their own session.
    let code = format!(
        "{FIND_CHANNEL}for i in range(100):\n    \
         os.write(ch.out, b'{{\"op\":\"tool_call\",\"cell\":null,\"call\":%d,\"tool\":\"x\",\"args\":{{}}}}\\n' % (10**6 + i))\n\
         os.write(ch.out, b'not a frame\\n{{\"op\":\"pong\"}}\\n')\n\
         x = 41"
    );
    let r = case.run("s", &code).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    // A big but honest cell (2 MiB of code, 32 MiB of output) stays within bounds.
    let code = format!(
        "s = '{}'\nos.write(1, b'y' * (32 << 20))\nprint(len(s), x + 1)",
        "a".repeat(2 << 20)
    );
    let r = case.exec(ExecuteRequest::new("s", &code)).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(
        r.output.trim_end().ends_with(&format!("{} 42", 2 << 20)),
        "{r:?}"
    );
    assert!(r.kernel.reused && r.kernel.state_lost.is_none(), "{r:?}");
    // One protocol line over the limit kills the kernel.
    let code = format!("{FIND_CHANNEL}os.write(ch.out, b'{{' * (16 << 20))\nprint('survived')");
    let r = case.run("s", &code).await;
    assert_killed_for_protocol(&case, "s", &r).await;
    case.finish().await;
}

#[tokio::test]
async fn a_flood_of_garbage_lines_kills_the_kernel() {
    let case = Case::new("abuse-garbage").await;
    let code = format!(
        "{FIND_CHANNEL}for _ in range(64):\n    os.write(ch.out, b'garbage\\n' * 65536)\nprint('survived')"
    );
    let r = case.run("s", &code).await;
    assert_killed_for_protocol(&case, "s", &r).await;
    case.finish().await;
}

/// Each line still costs the host a parse, and the runner never sends these unasked: past
/// 1 MiB of them over its life the kernel is killed, whichever kind it sends.
#[tokio::test]
async fn a_flood_of_frames_nobody_asked_for_kills_the_kernel() {
    let case = Case::new("abuse-waste").await;
    let floods = [
        ("pong", "b'{\"op\":\"pong\"}\\n'"),
        (
            "ready",
            "b'{\"op\":\"ready\",\"v\":3,\"python\":\"3\",\"pid\":1}\\n'",
        ),
        (
            "done",
            "b'{\"op\":\"done\",\"cell\":1,\"status\":\"ok\"}\\n'",
        ),
    ];
    for (session, frame) in floods {
        // Small writes, as an attacker after CPU would send: 20 s of them unless cut.
        let code = format!(
            "{FIND_CHANNEL}import time\n\
             frame = {frame} * 64\n\
             t = time.time()\n\
             while time.time() - t < 20:\n    os.write(ch.out, frame)\n\
             print('survived')"
        );
        let r = case.run(session, &code).await;
        assert!(
            r.error
                .as_deref()
                .unwrap_or_default()
                .contains("had no use for"),
            "{session}: {r:?}"
        );
        assert_killed_for_protocol(&case, session, &r).await;
    }
    case.finish().await;
}

/// A refused tool call is answered, however many a cell makes (a cell retrying past the
/// in-flight cap, a thread pool of an earlier cell, a typo in a loop): refusals are no
/// protocol abuse, and what they cost the host is bounded by the read pace instead.
#[tokio::test]
async fn refused_tool_calls_are_answered_however_many_a_cell_makes() {
    let case = Case::new("abuse-refused").await;
    case.run("s", "kept = 'state'").await;
    // 20,000 calls to a tool this cell may not use: about 1.5 MB of call frames.
    let code = "import kernel_tools\n\
        refused = 0\n\
        for i in range(20000):\n    \
            try:\n        kernel_tools.call('no_such_tool', i=i)\n    \
            except kernel_tools.ToolError:\n        refused += 1\n\
        print(refused, kept)";
    let r = case.run("s", code).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(r.output, "20000 state\n", "{r:?}");
    assert!(r.kernel.reused, "{r:?}");
    case.finish().await;
}

/// A thread keeps forging tool calls once its cell has settled: each is refused (a settled
/// cell's thread may legitimately call), and the runner reads the refusals, so nothing
/// overflows. What bounds the flood is the read pace: 4,096 lines at once, then 4,096 a second
/// (`src/kernel/pace.rs`), whatever the thread writes; the kernel keeps its state.
#[tokio::test]
async fn a_flood_between_cells_is_read_at_the_pace_and_the_kernel_keeps_working() {
    let case = Case::new("abuse-idle").await;
    let code = format!(
        "{FIND_CHANNEL}import _thread, time\n\
         runner = [o for o in gc.get_objects() if type(o).__name__ == '_Runner'][0]\n\
         flood = {{'sent': 0, 'stop': False, 'start': None}}\n\
         def forge():\n    \
             while runner.current_cell is not None:\n        time.sleep(0.01)\n    \
             frame = b'{{\"op\":\"tool_call\",\"cell\":null,\"call\":1,\"tool\":\"x\",\"args\":{{}}}}\\n' * 100\n    \
             flood['start'] = time.monotonic()\n    \
             while not flood['stop']:\n        os.write(ch.out, frame)\n        flood['sent'] += 100\n\
         _thread.start_new_thread(forge, ())\n\
         y = 1"
    );
    let r = case.run("s", &code).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    // The measured interval: the thread floods meanwhile.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let r = case
        .run(
            "s",
            "flood['stop'] = True\n\
             print(flood['sent'], time.monotonic() - flood['start'], y)",
        )
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(r.kernel.reused && r.kernel.state_lost.is_none(), "{r:?}");
    let fields: Vec<f64> = r
        .output
        .split_whitespace()
        .map(|f| f.parse().expect("a number"))
        .collect();
    let (sent, secs) = (fields[0], fields[1]);
    // The burst, the rate over the interval, and what the pipes and buffers between the
    // kernel and the server hold (about 50,000 such lines, measured); unpaced, hundreds of
    // thousands.
    let most = 4096.0 * (1.0 + secs) + 64_000.0;
    eprintln!("{sent} forged calls in {secs:.1} s (at most {most:.0} allowed)");
    assert!(sent <= most, "{sent} forged calls in {secs:.1} s");
    case.finish().await;
}

#[tokio::test]
async fn a_forged_end_of_cell_frame_of_megabytes_is_unreadable_and_not_held() {
    let case = Case::new("abuse-done-line").await;
    // The cell writes its own end marker, then a `done` frame with a 4 MiB traceback; the
    // runner never writes a `done` line over 4000 bytes.
    let code = "import os, sys\n\
f = sys._getframe(1).f_locals\n\
line = f['marker'] + b'{\"op\":\"done\",\"cell\":%d,\"status\":\"error\",\"traceback\":\"' % f['cell'] \
+ b'T' * (4 << 20) + b'\",\"execution_count\":1}\\n'\n\
while line:\n    line = line[os.write(1, line):]\n";
    let r = case.run("s", code).await;
    assert_eq!(r.status, CellStatus::Error, "{r:?}");
    let error = r.error.clone().unwrap_or_default();
    assert!(
        error == "kernelbox: the kernel's end-of-cell frame was unreadable; the cell's outcome is unknown",
        "{} bytes of error: {:?}...",
        error.len(),
        &error[..error.len().min(100)]
    );
    let size = serde_json::to_vec(&r).unwrap().len();
    assert!(size < 64 * 1024, "the result is {size} bytes");
    let next = case.run("s", "print('still here')").await;
    assert_eq!(next.status, CellStatus::Success, "{next:?}");
    assert!(next.kernel.reused, "{next:?}");
    case.finish().await;
}
