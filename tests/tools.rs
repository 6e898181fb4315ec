//! Tool calls from inside a kernel, under the authority of the cell that is running now
//! (the seed's TestPerCellRpcAuthority, plus threads, allow-list and budget).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};

use common::Case;
use kernelbox::{CellStatus, ExecuteRequest, FnDispatcher, Scope, ToolCall, ToolDispatcher};
use serde_json::json;

type Seen = Arc<Mutex<Vec<ToolCall>>>;

/// A dispatcher that never answers.
struct Never;

#[async_trait::async_trait]
impl ToolDispatcher for Never {
    async fn dispatch(&self, _call: ToolCall) -> Result<serde_json::Value, String> {
        std::future::pending().await
    }
}

fn recorder(name: &'static str) -> (Arc<dyn ToolDispatcher>, Seen) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let dispatcher = FnDispatcher(move |call: ToolCall| {
        log.lock().unwrap().push(call.clone());
        Ok(json!({"ok": true, "by": name, "args": call.args}))
    });
    (Arc::new(dispatcher), seen)
}

fn with_tools(code: &str, dispatcher: &Arc<dyn ToolDispatcher>, task: &str) -> ExecuteRequest {
    ExecuteRequest {
        task_id: Some(task.into()),
        dispatcher: Some(dispatcher.clone()),
        ..ExecuteRequest::new(Scope::session("kernel-test").tools(["web_search"]), code)
    }
}

#[tokio::test]
async fn a_later_cells_rpc_runs_under_that_cells_authority() {
    let case = Case::new("rpc-later").await;
    let (one, seen_one) = recorder("one");
    let (two, seen_two) = recorder("two");
    let cell = "import kernel_tools\nprint(kernel_tools.web_search(query='q'))\n";
    let first = case.exec(with_tools(cell, &one, "turn-1")).await;
    let second = case.exec(with_tools(cell, &two, "turn-2")).await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    assert_eq!(second.status, CellStatus::Success, "{second:?}");
    assert!(first.output.contains("'by': 'one'"), "{first:?}");
    assert!(second.output.contains("'by': 'two'"), "{second:?}");
    let one = seen_one.lock().unwrap().clone();
    let two = seen_two.lock().unwrap().clone();
    assert_eq!(one.len(), 1);
    assert_eq!(two.len(), 1);
    assert_eq!(one[0].task_id.as_deref(), Some("turn-1"));
    assert_eq!(one[0].args, json!({"query": "q"}));
    assert_eq!(two[0].task_id.as_deref(), Some("turn-2"));
    assert_eq!(first.tool_calls_made, 1);
    assert!(second.kernel.reused);
    case.finish().await;
}

#[tokio::test]
async fn cross_cell_alias_dispatches_under_the_current_cell() {
    let case = Case::new("rpc-alias").await;
    let (one, seen_one) = recorder("one");
    let (two, seen_two) = recorder("two");
    let first = case
        .exec(with_tools(
            "import kernel_tools\nalias = kernel_tools.web_search\ncall = kernel_tools.call\n",
            &one,
            "turn-1",
        ))
        .await;
    let second = case
        .exec(with_tools(
            "print(alias(query='q'))\nprint(call('web_search', query='r'))\n",
            &two,
            "turn-2",
        ))
        .await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    assert_eq!(second.status, CellStatus::Success, "{second:?}");
    assert!(seen_one.lock().unwrap().is_empty());
    assert_eq!(seen_two.lock().unwrap().len(), 2);
    assert_eq!(second.tool_calls_made, 2);
    case.finish().await;
}

#[tokio::test]
async fn each_cell_installs_a_fresh_authority() {
    let case = Case::new("rpc-fresh").await;
    case.run("s", "x = 1").await;
    let kernel = case.kb.kernel_for(None, "s", None).expect("kernel");
    let first = kernel.cell_authority().expect("authority");
    assert!(!first.is_active(), "retired once the cell settled");
    case.run("s", "y = 2").await;
    let second = kernel.cell_authority().expect("authority");
    assert!(!Arc::ptr_eq(&first, &second));
    assert!(!second.is_active());
    case.finish().await;
}

#[tokio::test]
async fn a_thread_from_an_earlier_cell_is_refused_during_a_later_cell() {
    let case = Case::new("rpc-thread").await;
    let (one, seen_one) = recorder("one");
    let (two, seen_two) = recorder("two");
    let start_thread = "import threading, kernel_tools\n\
go, done, got = threading.Event(), threading.Event(), []\n\
def worker():\n    go.wait()\n    try:\n        got.append(kernel_tools.web_search(query='late'))\n    except kernel_tools.ToolError as e:\n        got.append('refused: ' + str(e))\n    done.set()\n\
threading.Thread(target=worker, daemon=True).start()\n";
    let first = case.exec(with_tools(start_thread, &one, "turn-1")).await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    let second = case
        .exec(with_tools(
            "go.set()\nassert done.wait(20)\nprint(got[0])\n",
            &two,
            "turn-2",
        ))
        .await;
    assert_eq!(second.status, CellStatus::Success, "{second:?}");
    assert!(
        second
            .output
            .contains("refused: No active execute_code cell"),
        "{second:?}"
    );
    assert!(seen_one.lock().unwrap().is_empty());
    assert!(
        seen_two.lock().unwrap().is_empty(),
        "cell 2's dispatcher never sees the call"
    );
    assert_eq!(second.tool_calls_made, 0);
    case.finish().await;
}

/// A call the host could not read is refused in the kernel with a `ToolError`, the kernel and
/// its state kept: one whose frame would pass the host's longest protocol line (1 MiB; sent, a
/// protocol breach that kills the kernel), and one carrying text that is not Unicode (sent,
/// never answered). One just under 1 MiB is made.
#[tokio::test]
async fn a_tool_call_the_host_could_not_read_is_a_tool_error_in_the_kernel() {
    let case = Case::new("rpc-too-large").await;
    let (d, seen) = recorder("d");
    let code = "import kernel_tools\nkept = 'state'\n\
try:\n    kernel_tools.web_search(q='a' * (2 << 20))\nexcept kernel_tools.ToolError as e:\n    print('refused:', e)\n\
print(kernel_tools.web_search(q='b' * ((1 << 20) - 200))['ok'], kept)";
    let r = case.exec(with_tools(code, &d, "t")).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(
        r.output.starts_with("refused: tool call too large: 20")
            && r.output
                .contains("bytes as JSON; at most 1048576 per call\n"),
        "{}",
        r.output
    );
    assert!(r.output.ends_with("True state\n"), "{}", r.output);
    assert_eq!(seen.lock().unwrap().len(), 1);
    // Text the host cannot read (a lone surrogate, as a file name decoded with
    // surrogateescape gives) is refused at once, not sent to wait for an answer that never comes.
    let code = "import os\n\
name = os.fsdecode(b'bad\\xff')\n\
for args in ({'q': name}, {name: 1}):\n    \
    try:\n        kernel_tools.web_search(**args)\n    \
    except kernel_tools.ToolError as e:\n        print('refused:', str(e)[:40])\n\
print(kept)";
    let r = case.exec(with_tools(code, &d, "t")).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(
        r.output,
        "refused: tool arguments must be JSON-serialisable\n".repeat(2) + "state\n",
        "{r:?}"
    );
    assert!(r.kernel.state_lost.is_none());
    case.finish().await;
}

#[tokio::test]
async fn allow_list_and_budget_refusals_are_clear_and_not_counted() {
    let case = Case::with("rpc-budget", |c| c.cells.max_tool_calls = 3).await;
    let (d, seen) = recorder("d");
    let code = "import kernel_tools\n\
try:\n    kernel_tools.delete_everything(path='/')\nexcept kernel_tools.ToolError as e:\n    print('A:', e)\n\
for i in range(4):\n    try:\n        kernel_tools.web_search(query=str(i))\n        print('ok', i)\n    except kernel_tools.ToolError as e:\n        print('B:', e)\n";
    let r = case.exec(with_tools(code, &d, "t")).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(
        r.output.contains("A: Unknown tool \"delete_everything\""),
        "{}",
        r.output
    );
    assert!(
        r.output.contains("Available tools: web_search"),
        "{}",
        r.output
    );
    assert!(
        r.output.contains("ok 2") && !r.output.contains("ok 3"),
        "{}",
        r.output
    );
    assert!(
        r.output.contains("B: Tool call budget exhausted"),
        "{}",
        r.output
    );
    assert_eq!(r.tool_calls_made, 3);
    assert_eq!(seen.lock().unwrap().len(), 3);
    // Without a dispatcher, nothing is available.
    let bare = case.run("other", "import kernel_tools\ntry:\n    kernel_tools.web_search(q=1)\nexcept kernel_tools.ToolError as e:\n    print(e)").await;
    assert!(bare.output.contains("Available tools: none"), "{bare:?}");
    case.finish().await;
}

#[tokio::test]
async fn a_dispatcher_that_never_answers_cannot_outlive_the_timeout() {
    let case = Case::new("rpc-never").await;
    let never: Arc<dyn ToolDispatcher> = Arc::new(Never);
    let r = case
        .exec(ExecuteRequest {
            timeout: Some(std::time::Duration::from_secs(1)),
            ..with_tools(
                "import kernel_tools\nkernel_tools.web_search(query='q')",
                &never,
                "t",
            )
        })
        .await;
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    assert!(case.containers().await.is_empty());
    case.finish().await;
}

#[tokio::test]
async fn a_thread_left_waiting_on_a_call_is_refused_when_its_cell_settles() {
    let case = Case::new("rpc-orphan").await;
    let never: Arc<dyn ToolDispatcher> = Arc::new(Never);
    let first = case
        .exec(with_tools(
            "import threading, kernel_tools\ngot, calling = [], threading.Event()\n\
def worker():\n    calling.set()\n    try:\n        kernel_tools.web_search(query='slow')\n    except kernel_tools.ToolError as e:\n        got.append(str(e))\n\
t = threading.Thread(target=worker)\nt.start()\ncalling.wait()\n",
            &never,
            "turn-1",
        ))
        .await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    let second = case
        .exec(with_tools(
            "t.join(20)\nprint(t.is_alive(), got)",
            &never,
            "turn-2",
        ))
        .await;
    assert!(
        second
            .output
            .contains("False ['No active execute_code cell"),
        "{second:?}"
    );
    case.finish().await;
}

/// A dispatcher whose calls wait until the test releases them.
struct Held {
    gate: Arc<tokio::sync::Semaphore>,
    max_in_flight: Arc<std::sync::atomic::AtomicUsize>,
    in_flight: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl ToolDispatcher for Held {
    async fn dispatch(&self, _call: ToolCall) -> Result<serde_json::Value, String> {
        use std::sync::atomic::Ordering;
        let now = self.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        self.max_in_flight.fetch_max(now, Ordering::AcqRel);
        let _permit = self.gate.acquire().await.map_err(|e| e.to_string())?;
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        Ok(json!("done"))
    }
}

#[tokio::test]
async fn tool_calls_in_flight_are_bounded_and_the_excess_refused_at_once() {
    let case = Case::new("rpc-in-flight").await;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let max_in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let dispatcher: Arc<dyn ToolDispatcher> = Arc::new(Held {
        gate: gate.clone(),
        max_in_flight: max_in_flight.clone(),
        in_flight: Default::default(),
    });
    // 20 threads call at once; the calls past the bound are refused while the others wait.
    let code = "import kernel_tools, threading\n\
results = []\n\
def call():\n    try:\n        results.append(kernel_tools.web_search(query='q'))\n    \
except kernel_tools.ToolError as e:\n        print('refused:', e, flush=True)\n        results.append('refused')\n\
threads = [threading.Thread(target=call) for _ in range(20)]\n\
for t in threads:\n    t.start()\n\
for t in threads:\n    t.join()\n\
print(results.count('done'), results.count('refused'))";
    let (refused_tx, mut refused_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let seen = Arc::new(Mutex::new(String::new()));
    let sink: kernelbox::OutputSink = Arc::new(move |_, b: &[u8]| {
        let mut seen = seen.lock().unwrap();
        seen.push_str(&String::from_utf8_lossy(b));
        if seen.matches("refused:").count() >= 4 {
            let _ = refused_tx.send(());
        }
    });
    let request = ExecuteRequest {
        sink: Some(sink),
        ..with_tools(code, &dispatcher, "turn-1")
    };
    let kb = case.kb.clone();
    let run = tokio::spawn(async move { kb.execute(request).await });
    let refused = tokio::time::timeout(std::time::Duration::from_secs(60), refused_rx.recv()).await;
    gate.add_permits(100);
    let r = run.await.unwrap().unwrap();
    assert!(
        refused.is_ok(),
        "four calls are refused while 16 wait: {r:?}"
    );
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(r.output.trim_end().ends_with("16 4"), "{r:?}");
    assert!(r.output.contains("Too many tool calls in flight"), "{r:?}");
    assert_eq!(max_in_flight.load(std::sync::atomic::Ordering::Acquire), 16);
    assert_eq!(r.tool_calls_made, 16, "refusals do not count");
    case.finish().await;
}

#[tokio::test]
async fn a_tool_result_over_one_mebibyte_reaches_the_cell_as_a_clear_error() {
    let case = Case::new("rpc-result-bound").await;
    let dispatcher: Arc<dyn ToolDispatcher> = Arc::new(FnDispatcher(|call: ToolCall| {
        let n = call.args["n"].as_u64().unwrap_or(0) as usize;
        Ok(json!("r".repeat(n)))
    }));
    let code = "import kernel_tools\n\
print(len(kernel_tools.web_search(n=1000000)))\n\
try:\n    kernel_tools.web_search(n=2 << 20)\n    print('passed')\n\
except kernel_tools.ToolError as e:\n    print('refused:', e)";
    let r = case.exec(with_tools(code, &dispatcher, "turn-1")).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(r.output.starts_with("1000000\n"), "{r:?}");
    assert!(
        r.output
            .contains("refused: the tool's result is too large (2097154 bytes; at most 1048576)"),
        "{r:?}"
    );
    assert_eq!(r.tool_calls_made, 2);
    case.finish().await;
}
