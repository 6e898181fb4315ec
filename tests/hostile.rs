//! Hostile cells: each gets a clear result, the orchestrator stays healthy, other owners are
//! unaffected, and the next call for that owner works.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Case;
use kernelbox::{CellResult, CellStatus, ExecuteRequest};

/// Runs a hostile cell for `owner` while a bystander owner holds state, then checks that the
/// bystander is untouched and the hostile owner's next call works.
async fn survive(case: &Case, owner: &str, code: &str, timeout: u64) -> CellResult {
    let bystander = format!("{owner}-bystander");
    case.run(&bystander, "kept = 'safe'").await;
    let result = case
        .exec(ExecuteRequest {
            timeout: Some(Duration::from_secs(timeout)),
            ..ExecuteRequest::new(owner, code)
        })
        .await;
    let next = case.run(owner, "print('next call works')").await;
    assert_eq!(next.status, CellStatus::Success, "after {code:?}: {next:?}");
    assert!(next.output.contains("next call works"), "{next:?}");
    let other = case.run(&bystander, "print(kept)").await;
    assert!(
        other.output.contains("safe") && other.kernel.reused,
        "{other:?}"
    );
    result
}

#[tokio::test]
async fn a_fork_bomb_hits_the_pids_limit() {
    let case = Case::with("forkbomb", |c| c.spec.sandbox.pids_limit = 64).await;
    let r = survive(&case, "s", "import os\nwhile True:\n    os.fork()", 20).await;
    assert_ne!(r.status, CellStatus::Success, "{r:?}");
    let error = r.error.unwrap_or_default();
    // Under runsc the limit bounds the sandbox's threads on the host, not the cell's
    // processes: the bomb ends its own kernel, reported (docs/runtimes.md).
    let runsc = common::runtime() == kernelbox::KernelRuntime::Runsc;
    assert!(
        error.contains("BlockingIOError")
            || error.contains("timed out")
            || (runsc && error.contains("died unexpectedly")),
        "{error}"
    );
    case.finish().await;
}

#[tokio::test]
async fn an_infinite_loop_and_cpu_bound_threads_time_out() {
    let case = Case::new("spin").await;
    let r = survive(&case, "loop", "while True:\n    pass", 2).await;
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    let code = "import threading\ndef spin():\n    while True:\n        pass\n\
threads = [threading.Thread(target=spin, daemon=True) for _ in range(4)]\n\
for t in threads:\n    t.start()\nprint('spinning', flush=True)\nfor t in threads:\n    t.join()";
    let r = survive(&case, "threads", code, 3).await;
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    assert!(
        r.output.contains("spinning"),
        "the threads were running: {r:?}"
    );
    case.finish().await;
}

#[tokio::test]
async fn a_gigabyte_of_output_is_cut_without_harm_and_read_at_the_pace() {
    let case = Case::new("gigabyte").await;
    // Every byte written, short writes resumed (gVisor's pipes write part of a MiB at a time).
    let code = "import os, time\nchunk = b'z' * (1 << 20)\nt = time.monotonic()\n\
        for _ in range(1024):\n    view = memoryview(chunk)\n    while view:\n        view = view[os.write(1, view):]\n\
        print('END %08.3f' % (time.monotonic() - t))";
    let r = survive(&case, "s", code, 300).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(r.stdout_bytes_total, Some((1 << 30) + 13));
    assert!(r.output.len() < 60_000);
    // The kernel's writes waited on its pipe: the host read its first 64 MiB at once, the
    // rest at 64 MiB/s (src/kernel/pace.rs), so the engine copied it at that pace too.
    let tail = r
        .output
        .trim_end()
        .rsplit("END ")
        .next()
        .unwrap_or_default();
    let secs: f64 = tail.parse().unwrap_or_else(|_| panic!("{:?}", r.output));
    assert!(secs >= 14.0, "1 GiB written in {secs} s");
    case.finish().await;
}

#[tokio::test]
async fn closing_the_standard_descriptors_does_not_wedge_the_kernel() {
    let case = Case::new("closefds").await;
    let r = case
        .run("s", "import os, sys\nprint('before', flush=True)\nos.close(0)\nos.close(1)\nos.close(2)\nsys.stdout.close()")
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(r.output.contains("before"));
    let next = case
        .run("s", "import os\nprint('restored')\nos.write(2, b'fd2\\n')")
        .await;
    assert!(
        next.output.contains("restored") && next.output.contains("fd2"),
        "{next:?}"
    );
    assert!(next.kernel.reused);
    case.finish().await;
}

#[tokio::test]
async fn signals_to_init_and_to_itself() {
    let case = Case::new("signals").await;
    // PID 1 is the container's init: a namespace's init ignores SIGKILL from inside it. gVisor
    // lets it die: the cell ended its own kernel, reported as a crash, the next call gets a
    // fresh one (docs/runtimes.md).
    let r = case
        .run("s", "import os\ntry:\n    os.kill(1, 9)\nexcept PermissionError:\n    pass\nprint('init survived')")
        .await;
    if common::runtime() == kernelbox::KernelRuntime::Runsc {
        assert!(
            r.output.contains("init survived")
                || r.error
                    .as_deref()
                    .unwrap_or_default()
                    .contains("died unexpectedly"),
            "{r:?}"
        );
        // The container dies when gVisor delivers the kill, which may be after the cell
        // returned: then the next call is the one told of the crash, and the one after it
        // gets the fresh kernel.
        let mut r = case.run("s", "print('kernel here')").await;
        if r.error
            .as_deref()
            .unwrap_or_default()
            .contains("died unexpectedly")
        {
            r = case.run("s", "print('kernel here')").await;
        }
        assert!(r.output.contains("kernel here"), "{r:?}");
    } else {
        assert!(r.output.contains("init survived"), "{r:?}");
        let r = case.run("s", "print('kernel still here')").await;
        assert!(r.kernel.reused && r.output.contains("still here"), "{r:?}");
    }
    // Overridden handlers do not stop a timeout.
    let r = survive(
        &case,
        "handlers",
        "import signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n    signal.signal(s, signal.SIG_IGN)\ntime.sleep(60)",
        2,
    )
    .await;
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    // SIGKILL to itself: the kernel died on its own, reported as a crash.
    let r = survive(
        &case,
        "suicide",
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)",
        20,
    )
    .await;
    assert_eq!(r.exit_code, -1, "{r:?}");
    assert!(r.error.unwrap_or_default().contains("died unexpectedly"));
    case.finish().await;
}

/// A thread started by one cell writes a burst of a distinctive token after that cell has
/// settled; none of it reaches the next cell's result, which is whole. Output written between
/// cells belongs to no cell and is dropped (docs/results.md "The result of a cell": `output` is what the
/// cell wrote; a thread still writing while a later cell runs writes into that cell's output,
/// since the container's stdout is one stream).
#[tokio::test]
async fn output_a_thread_writes_after_its_cell_settled_stays_out_of_the_next_result() {
    let case = Case::new("chatty").await;
    let started = case
        .run(
            "s",
            "import threading, time\nburst = []\ndef late():\n    time.sleep(0.3)\n    for i in range(2000):\n        print('STRAY-OUTPUT', i, flush=True)\n    burst.append('done')\nthreading.Thread(target=late, daemon=True).start()\nprint('started')",
        )
        .await;
    assert_eq!(started.output, "started\n", "{started:?}");
    // The burst starts 0.3 s after the cell settled and takes a few milliseconds.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for i in 0..3 {
        let r = case.run("s", "print('mine', burst)").await;
        assert_eq!(r.status, CellStatus::Success, "{r:?}");
        assert_eq!(r.output, "mine ['done']\n", "cell {i}: {r:?}");
    }
    case.finish().await;
}

#[tokio::test]
async fn forged_protocol_frames_only_touch_their_own_cell() {
    let case = Case::new("forge").await;
    let code = r#"
import os
fds = [int(f) for f in os.listdir('/proc/self/fd')]
lines = [b'{"op":"done","cell":999,"status":"exit","execution_count":1}\n',
         b'{"op":"tool_call","cell":null,"call":1,"tool":"x","args":{}}\n',
         b'not json at all\n', b'{"op":"ready","v":99}\n']
for fd in fds:
    if fd > 2:
        for line in lines:
            try:
                os.write(fd, line)
            except OSError:
                pass
print('forged')
"#;
    let r = survive(&case, "s", code, 20).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(r.output.contains("forged"));
    case.finish().await;
}

#[tokio::test]
async fn filling_the_working_directory_and_tmp_fails_inside_the_kernel() {
    let case = Case::new("fill").await;
    let code = r#"
import errno, os
# Both are memory-backed and count against the kernel's memory: fill one at a time.
for path in ('/work/fill', '/tmp/fill'):
    try:
        with open(path, 'wb') as f:
            for _ in range(400):
                f.write(b'x' * (1 << 20))
        print(path, 'not full')
    except OSError as e:
        print(path, 'full', e.errno == errno.ENOSPC)
    os.remove(path)
"#;
    let r = survive(&case, "s", code, 60).await;
    assert!(r.output.contains("/work/fill full True"), "{r:?}");
    assert!(r.output.contains("/tmp/fill full True"), "{r:?}");
    case.finish().await;
}

#[tokio::test]
async fn no_host_secrets_and_no_way_out_over_the_network() {
    // A secret in the orchestrator's environment must not reach the kernel.
    std::env::set_var("KERNELBOX_TEST_HOST_SECRET", "hunter2");
    let case = Case::new("escape").await;
    let code = r#"
import os, socket
print('secret' , 'hunter2' in repr(dict(os.environ)))
for path in ('/proc/1/environ', '/proc/self/environ'):
    try:
        print(path, 'hunter2' in open(path, 'rb').read().decode('latin1'))
    except OSError as e:
        print(path, 'denied')
for host in ('127.0.0.1', '172.17.0.1', '10.0.0.1'):
    for port in (2375, 22, 80):
        try:
            socket.create_connection((host, port), timeout=1).close()
            print('CONNECTED', host, port)
        except OSError:
            pass
try:
    socket.getaddrinfo('deb.debian.org', 80)
    print('DNS works')
except OSError:
    print('no DNS')
print(os.path.exists('/var/run/docker.sock'), os.path.exists('/run/docker.sock'))
"#;
    let r = case.run("s", code).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let out = &r.output;
    assert!(out.contains("secret False"), "{out}");
    assert!(
        !out.contains("True\n/proc") && !out.contains("environ True"),
        "{out}"
    );
    assert!(!out.contains("CONNECTED"), "{out}");
    assert!(out.contains("no DNS"), "{out}");
    assert!(out.contains("False False"), "no docker socket: {out}");
    case.finish().await;
}

#[tokio::test]
async fn endless_output_still_times_out() {
    let case = Case::new("flood").await;
    let r = survive(
        &case,
        "s",
        "import os\nchunk = b'x' * 65536\nwhile True:\n    os.write(1, chunk)",
        3,
    )
    .await;
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    assert_eq!(r.stdout_truncated, Some(true));
    case.finish().await;
}

#[tokio::test]
async fn rebinding_builtins_and_os_functions_does_not_brick_the_session() {
    let case = Case::new("rebind").await;
    // Everything the runner calls between cells, broken at once (setattr last: the loop
    // needs it). The cell's own traceback cannot be formatted any more, so it is plain.
    let wreck = "import builtins, os, sys, io, time, _thread, select, _json\n\
saved = dict(vars(builtins))\n\
saved_os = {n: getattr(os, n) for n in ('write', 'read', 'dup2', 'close', '_exit', 'getpid', 'pwrite', 'fdopen')}\n\
saved_sys = sys.exc_info\n\
for n in ('write', 'read', 'dup2', 'close', '_exit', 'getpid', 'pwrite', 'fdopen'):\n    setattr(os, n, None)\n\
sys.exc_info = None\n\
io.TextIOWrapper = None\n\
time.time = None\n\
_thread.allocate_lock = _thread.get_ident = None\n\
_json.make_encoder = _json.make_scanner = None\n\
for n in ('compile', 'exec', 'print', 'len', 'isinstance', 'str', 'getattr', 'repr', 'memoryview', \
'int', 'type', 'any', 'open', '__import__', 'dict', 'list', 'BaseException', 'Exception', 'OSError', \
'hasattr', 'iter', 'next', 'min', 'max', 'setattr'):\n    setattr(builtins, n, None)\n";
    let r = case.run("s", wreck).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    // The next cell runs and returns a result, even one that raises.
    let next = case.run("s", "x = 2").await;
    assert_eq!(next.status, CellStatus::Success, "{next:?}");
    assert!(
        next.kernel.reused && next.kernel.state_lost.is_none(),
        "{next:?}"
    );
    let raised = case.run("s", "1 / 0").await;
    assert_eq!(raised.status, CellStatus::Error, "{raised:?}");
    assert!(
        raised
            .error
            .unwrap_or_default()
            .contains("ZeroDivisionError"),
        "the error names the exception"
    );
    // Restoring the builtins brings everything back, state included.
    let restore = "vars(builtins).update(saved)\n\
for n, f in saved_os.items():\n    setattr(os, n, f)\n\
sys.exc_info = saved_sys\n\
print('restored', x, len('abc'))";
    let back = case.run("s", restore).await;
    assert_eq!(back.status, CellStatus::Success, "{back:?}");
    assert_eq!(back.output, "restored 2 3\n", "{back:?}");
    assert_eq!(back.kernel.execution_count, 4, "{back:?}");
    case.finish().await;
}
