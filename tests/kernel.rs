//! One kernel end to end against the real engine: the seed suite's session-state and
//! lifecycle tests, descriptor-level capture, output caps, and the sandbox seen from inside.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Case;
use kernelbox::{CellStatus, ExecuteRequest, LossReason};

#[tokio::test]
async fn state_persists_across_cells() {
    let case = Case::new("state").await;
    let first = case.run("s", "x = 41").await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    assert!(!first.kernel.reused);
    let second = case.run("s", "print(x + 1)").await;
    assert_eq!(second.status, CellStatus::Success, "{second:?}");
    assert!(second.output.contains("42"));
    assert!(second.kernel.reused);
    assert_eq!(second.kernel.execution_count, 2);
    assert_eq!(second.kernel.id, first.kernel.id);
    assert_eq!(case.container_ids().await, vec![first.kernel.id.clone()]);
    case.finish().await;
}

#[tokio::test]
async fn reset_discards_state() {
    let case = Case::new("reset").await;
    let first = case.run("s", "x = 41").await;
    let second = case
        .exec(ExecuteRequest {
            reset: true,
            ..ExecuteRequest::new("s", "print(x + 1)")
        })
        .await;
    assert_eq!(second.status, CellStatus::Error, "{second:?}");
    assert!(second.error.as_deref().unwrap_or("").contains("NameError"));
    assert!(second.kernel.state_reset);
    assert!(!second.kernel.reused);
    assert_eq!(second.kernel.generation, 2);
    // The discarded kernel's container is really gone.
    let ids = case.container_ids().await;
    assert!(!ids.contains(&first.kernel.id), "{ids:?}");
    assert_eq!(ids.len(), 1);
    case.finish().await;
}

#[tokio::test]
async fn exception_keeps_the_kernel_alive() {
    let case = Case::new("exception").await;
    case.run("s", "a = 7").await;
    let boom = case.run("s", "1 / 0").await;
    assert_eq!(boom.status, CellStatus::Error);
    assert_eq!(boom.exit_code, 1);
    assert!(boom
        .error
        .as_deref()
        .unwrap_or("")
        .contains("ZeroDivisionError"));
    assert!(
        boom.output.contains("ZeroDivisionError"),
        "traceback is in the output too"
    );
    let after = case.run("s", "print(a)").await;
    assert_eq!(after.status, CellStatus::Success, "{after:?}");
    assert!(after.output.contains('7'));
    assert!(after.kernel.reused);
    case.finish().await;
}

#[tokio::test]
async fn imports_persist() {
    let case = Case::new("imports").await;
    case.run("s", "import json as _j").await;
    let second = case.run("s", "print(_j.dumps({'k': 1}))").await;
    assert!(second.output.contains(r#"{"k": 1}"#), "{second:?}");
    case.finish().await;
}

#[tokio::test]
async fn timeout_kills_the_kernel_and_reports_state_loss() {
    let case = Case::new("timeout").await;
    let slow = case
        .exec(ExecuteRequest {
            timeout: Some(Duration::from_secs(1)),
            ..ExecuteRequest::new(
                "s",
                "import time\nprint('started', flush=True)\ntime.sleep(30)",
            )
        })
        .await;
    assert_eq!(slow.status, CellStatus::Timeout, "{slow:?}");
    assert_eq!(slow.exit_code, -1);
    assert_eq!(
        slow.error.as_deref(),
        Some("Cell timed out after 1s; the session kernel was killed and its state was lost. The next execute_code call starts a fresh kernel.")
    );
    assert!(
        slow.output.contains("started"),
        "output before the timeout is kept"
    );
    assert!(
        case.kb.list_kernels(None).is_empty(),
        "the registry no longer holds it"
    );
    assert!(
        case.containers().await.is_empty(),
        "the container is really gone"
    );
    assert!(case.volumes().await.is_empty(), "and its staging volume");
    let fresh = case.run("s", "print('alive')").await;
    assert_eq!(fresh.status, CellStatus::Success, "{fresh:?}");
    assert!(!fresh.kernel.reused);
    assert!(fresh.output.contains("alive"));
    assert_eq!(
        fresh.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::Timeout)
    );
    case.finish().await;
}

#[tokio::test]
async fn sys_exit_ends_the_kernel() {
    let case = Case::new("sysexit").await;
    case.run("s", "print('before')").await;
    let done = case.run("s", "import sys\nprint('bye')\nsys.exit(0)").await;
    assert_eq!(done.status, CellStatus::Success, "{done:?}");
    assert!(done.kernel.ended, "{done:?}");
    assert!(done.output.contains("bye"));
    assert!(case.kb.list_kernels(None).is_empty());
    assert!(case.containers().await.is_empty());
    let fresh = case.run("s", "print('respawned')").await;
    assert!(!fresh.kernel.reused);
    assert!(fresh.output.contains("respawned"));
    assert!(
        fresh.kernel.state_lost.is_none(),
        "sys.exit is not an involuntary loss"
    );
    case.finish().await;
}

#[tokio::test]
async fn subprocess_fd_output_reaches_the_result() {
    let case = Case::new("subprocess").await;
    let result = case
        .run(
            "s",
            "import subprocess, sys\nsubprocess.run([sys.executable, '-c', \"print('raw-passthrough')\"])\n",
        )
        .await;
    assert_eq!(result.status, CellStatus::Success, "{result:?}");
    assert!(result.output.contains("raw-passthrough"));
    case.finish().await;
}

#[tokio::test]
async fn descriptor_writes_are_captured_and_stdin_reads_eof() {
    let case = Case::new("fds").await;
    let result = case
        .run(
            "s",
            "import os, sys\nos.write(1, b'one\\n')\nos.write(2, b'two\\n')\nprint('three', file=sys.stderr)\n\
             print(repr(sys.stdin.read()))\ntry:\n    input()\nexcept EOFError:\n    print('eof')\n\
             print(repr(os.read(0, 10)))",
        )
        .await;
    assert_eq!(result.status, CellStatus::Success, "{result:?}");
    for want in ["one\n", "two\n", "three\n", "''\n", "eof\n", "b''\n"] {
        assert!(
            result.output.contains(want),
            "{want:?} missing from {:?}",
            result.output
        );
    }
    // Interleaved in write order.
    let one = result.output.find("one").unwrap_or(usize::MAX);
    let two = result.output.find("two").unwrap_or(0);
    assert!(one < two);
    case.finish().await;
}

#[tokio::test]
async fn fifty_megabytes_of_output_are_cut_and_the_kernel_stays_usable() {
    let case = Case::new("bigout").await;
    let result = case
        .run(
            "s",
            "import sys\nchunk = 'y' * 1023 + '\\n'\nfor _ in range(50 * 1024):\n    sys.stdout.write(chunk)\nprint('THE-END')",
        )
        .await;
    assert_eq!(result.status, CellStatus::Success, "{result:?}");
    assert_eq!(result.stdout_truncated, Some(true));
    let total = 50 * 1024 * 1024 + "THE-END\n".len() as u64;
    assert_eq!(result.stdout_bytes_total, Some(total));
    let omitted = result.stdout_bytes_omitted.expect("omitted count");
    assert_eq!(omitted, total - 50_000);
    assert!(result.output.len() < 51_000, "{}", result.output.len());
    assert!(result
        .output
        .contains(&format!("[{omitted} bytes of output omitted")));
    assert!(
        result.output.trim_end().ends_with("THE-END"),
        "the tail is kept"
    );
    let warning = result.warning.clone().expect("spill warning");
    let path = warning
        .split_whitespace()
        .find(|w| w.starts_with("/work/"))
        .expect("spill path in warning");
    let check = case
        .run("s", &format!("import os\nprint(os.path.getsize({path:?}))"))
        .await;
    assert!(check.output.contains("5000000"), "{check:?}");
    assert!(check.kernel.reused);
    case.finish().await;
}

#[tokio::test]
async fn output_that_cannot_be_saved_inside_the_kernel_says_so_in_the_warning() {
    let case = Case::with("spill-full", |c| {
        c.spec.sandbox.work_bytes = Some(8 * 1024 * 1024)
    })
    .await;
    // The working directory is full: the spill file cannot be written.
    let code = "import os\n\
        f = open('fill.bin', 'wb', buffering=0)\n\
        try:\n    while True:\n        f.write(b'f' * 65536)\n\
        except OSError as e:\n    print('full', e.errno)\n\
        f.close()\n\
        print('z' * 200000)";
    let result = case.run("s", code).await;
    assert_eq!(result.status, CellStatus::Success, "{result:?}");
    assert_eq!(result.stdout_truncated, Some(true));
    let warning = result.warning.clone().expect("a warning");
    assert!(
        warning.starts_with("Output was cut to 50000 bytes; saving the first ")
            && warning.contains(" bytes inside the kernel failed (")
            && warning.contains("no space left on device"),
        "{warning}"
    );
    case.finish().await;
}

#[tokio::test]
async fn the_sandbox_holds_from_inside() {
    let case = Case::new("sandbox").await;
    // One line per claim, each asserted exactly (docs/reliability.md "How it works": no network, no
    // capabilities, `no-new-privileges`, a read-only root, a non-root uid, writable `/tmp` and
    // working directory, nothing of the host's environment).
    let code = r#"
import os, socket
print('uid', os.getuid())
try:
    socket.create_connection(('1.1.1.1', 53), timeout=2)
    print('net open')
except OSError as e:
    print('net closed', type(e).__name__)
try:
    open('/etc/kernelbox-probe', 'w')
    print('root writable')
except OSError as e:
    print('root read-only', e.errno)
status = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
print('CapEff', status['CapEff'])
if 'NoNewPrivs' in status:
    print('NoNewPrivs', status['NoNewPrivs'])
else:  # gVisor's /proc does not show it: ask the kernel (PR_GET_NO_NEW_PRIVS)
    import ctypes
    print('NoNewPrivs', ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))
print('interfaces', sorted(name for _, name in socket.if_nameindex()))
for d in ('/tmp', '/work'):
    open(d + '/scratch', 'w').write('ok')
    print(d, 'writable', open(d + '/scratch').read())
print('docker variables', [k for k in os.environ if 'DOCKER' in k.upper()])
print('environment', sorted(os.environ))
"#;
    let r = case.run("s", code).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let lines: Vec<&str> = r.output.lines().collect();
    // gVisor checks the uid's permission on `/etc` before the mount's read-only flag: EACCES
    // (docs/runtimes.md).
    let read_only = match common::runtime() {
        kernelbox::KernelRuntime::Runc => "root read-only 30",
        kernelbox::KernelRuntime::Runsc => "root read-only 13",
    };
    let expected = [
        ("a non-root uid", "uid 10000"),
        ("no network", "net closed OSError"),
        ("a read-only root (EROFS)", read_only),
        ("no capabilities", "CapEff 0000000000000000"),
        ("no-new-privileges", "NoNewPrivs 1"),
        ("only the loopback interface", "interfaces ['lo']"),
        ("a writable /tmp", "/tmp writable ok"),
        ("a writable working directory", "/work writable ok"),
        ("no docker variables leak in", "docker variables []"),
        (
            "nothing of the host's environment",
            "environment ['HOME', 'HOSTNAME', 'LANG', 'PATH', 'PYTHONDONTWRITEBYTECODE', \
'PYTHONUNBUFFERED']",
        ),
    ];
    for (i, (claim, line)) in expected.iter().enumerate() {
        assert_eq!(lines.get(i), Some(line), "{claim}: {}", r.output);
    }
    assert_eq!(lines.len(), expected.len(), "{}", r.output);
    case.finish().await;
}

#[tokio::test]
async fn out_of_memory_is_reported_and_the_next_call_gets_a_fresh_kernel() {
    let case = Case::with("oom", |c| c.spec.sandbox.memory_bytes = 64 * 1024 * 1024).await;
    case.run("s", "x = 1").await;
    let r = case
        .run(
            "s",
            "blocks = []\nwhile True:\n    blocks.append(bytearray(16 * 1024 * 1024))",
        )
        .await;
    assert_eq!(r.exit_code, -1, "{r:?}");
    let error = r.error.clone().unwrap_or_default();
    // Python may see MemoryError first; otherwise the kernel is OOM-killed.
    if r.status == CellStatus::Error && error.contains("MemoryError") {
        panic!("expected the OOM killer, got a MemoryError: {r:?}");
    }
    assert!(error.contains("ran out of memory (limit 64 MiB)"), "{r:?}");
    assert!(case.containers().await.is_empty());
    let next = case.run("s", "print('x' in dir())").await;
    assert!(!next.kernel.reused);
    assert!(next.output.contains("False"));
    assert_eq!(
        next.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::Oom)
    );
    case.finish().await;
}

#[tokio::test]
async fn a_missing_image_is_a_clear_error_and_leaves_nothing() {
    let case = Case::with("noimage", |c| {
        c.spec.image = "kernelbox/does-not-exist:never".into()
    })
    .await;
    let err = case
        .kb
        .execute(ExecuteRequest::new("s", "print(1)"))
        .await
        .expect_err("no image");
    assert!(err.to_string().contains("kernelbox image build"), "{err}");
    assert!(case.kb.list_kernels(None).is_empty());
    case.finish().await;
}

#[tokio::test]
async fn any_image_with_python3_works_as_it_is() {
    // The offline base has python3 and nothing of kernelbox's: no /work, no kernel user.
    let case = Case::with("anyimage", |c| {
        c.spec.image = kernelbox::image::OFFLINE_BASE.into()
    })
    .await;
    case.run("s", "x = 41\nopen('note.txt', 'w').write('kept')")
        .await;
    let r = case
        .run(
            "s",
            "import os\nprint(x + 1, open('note.txt').read(), os.getcwd(), os.getuid())",
        )
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(r.output.contains("42 kept /work 10000"), "{r:?}");
    case.finish().await;
}

/// The runner is invisible to cells (no variable in the environment, `sys.argv` as under
/// `python3 -c`, cell code runs in `__main__`, whose globals are a new module's) and stays small: an idle kernel has not loaded
/// the modules the runner avoids for memory's sake, and a cell importing them still works.
#[tokio::test]
async fn the_runner_leaves_no_trace_in_a_cell() {
    let case = Case::new("runner-trace").await;
    let probe = case
        .run(
            "s",
            "print('globals', sorted(globals()))\n\
             import sys\n\
             print('loaded', [m for m in ('json', 're', 'enum', 'threading', 'collections') if m in sys.modules])\n\
             import os, subprocess\n\
             print('argv', sys.argv)\n\
             print('env', [k for k in os.environ if k.startswith('KERNELBOX_')])\n\
             print('envb', [k for k in os.environb if k.startswith(b'KERNELBOX_')])\n\
             print('child', subprocess.run(['env'], capture_output=True, text=True).stdout.count('KERNELBOX_'))\n\
             print('main', __name__, sys.modules['__main__'].__dict__ is globals())",
        )
        .await;
    assert_eq!(probe.status, CellStatus::Success, "{probe:?}");
    // The runner runs its cell path before ready (warming it up): no cell is counted and
    // nothing of it is left in the cells' namespace.
    assert_eq!(probe.kernel.execution_count, 1, "{probe:?}");
    let out = &probe.output;
    assert!(
        out.contains(
            "globals ['__builtins__', '__doc__', '__loader__', '__name__', '__package__', '__spec__']"
        ),
        "{out}"
    );
    assert!(out.contains("argv ['-c']"), "{out}");
    assert!(out.contains("env []"), "{out}");
    assert!(out.contains("envb []"), "{out}");
    assert!(out.contains("child 0"), "{out}");
    assert!(out.contains("loaded []"), "{out}");
    assert!(out.contains("main __main__ True"), "{out}");
    let used = case
        .run(
            "s",
            "import json, threading, collections\n\
             box = []\n\
             t = threading.Thread(target=lambda: box.append(json.loads('[1, 2.5, null]')))\n\
             t.start(); t.join()\n\
             print(box, collections.Counter('aab')['a'])",
        )
        .await;
    assert!(used.output.contains("[[1, 2.5, None]] 2"), "{used:?}");
    case.finish().await;
}
