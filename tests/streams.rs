//! stdout and stderr apart, and the typed exception, against the real engine
//! (docs/contract.md, "stdout and stderr"): the streams each in their own field and in
//! `output` together, a stream flooded past the cap, a cell that kills the stderr relay.

#![allow(clippy::unwrap_used)]

mod common;

use common::Case;
use kernelbox::CellStatus;

/// Writes on fd 1 and fd 2 every way a cell does: print, sys.stderr, os.write, a subprocess.
const BOTH_STREAMS: &str = "import os, subprocess, sys
print('o1', flush=True)
sys.stderr.write('e1\\n'); sys.stderr.flush()
os.write(2, b'e2\\n')
print('o2', flush=True)
subprocess.run('echo o3; echo e3 >&2', shell=True)
print('caf\\u00e9', file=sys.stderr)
";

#[tokio::test]
async fn stdout_and_stderr_come_apart_and_output_keeps_both() {
    let case = Case::new("streams").await;
    let r = case.run("s", BOTH_STREAMS).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(r.stdout, "o1\no2\no3\n", "{r:?}");
    assert_eq!(r.stderr, "e1\ne2\ne3\ncafé\n", "{r:?}");
    assert!(r.exception.is_none());
    // `output` has every line, each stream in its own order.
    let mut lines: Vec<&str> = r.output.lines().collect();
    assert_eq!(lines.len(), 7, "{:?}", r.output);
    lines.retain(|l| l.starts_with('o'));
    assert_eq!(lines, ["o1", "o2", "o3"]);
    // The next cell's streams are its own.
    let next = case.run("s", "print('only out')").await;
    assert_eq!(
        (next.stdout.as_str(), next.stderr.as_str()),
        ("only out\n", "")
    );
    case.finish().await;
}

#[tokio::test]
async fn a_raised_cell_has_a_typed_exception_and_its_traceback_in_neither_stream() {
    let case = Case::new("exception-typed").await;
    let r = case
        .run(
            "s",
            "import sys\nsys.stderr.write('before\\n')\nclass Oops(ValueError): pass\nraise Oops('bad ' * 3)",
        )
        .await;
    assert_eq!(r.status, CellStatus::Error, "{r:?}");
    let e = r.exception.clone().expect("a typed exception");
    assert_eq!(e.name, "Oops");
    assert_eq!(e.value, "bad bad bad ");
    assert!(
        e.traceback.starts_with("Traceback (most recent call last)"),
        "{e:?}"
    );
    assert!(e.traceback.ends_with("Oops: bad bad bad \n"), "{e:?}");
    assert_eq!(r.stderr, "before\n");
    assert_eq!(r.stdout, "");
    // Today's fields keep their meaning: the traceback ends `output` and is `error`.
    assert!(r.output.ends_with(&e.traceback), "{r:?}");
    assert_eq!(r.error.as_deref(), Some(e.traceback.as_str()));
    // A cell kernelbox ends has no exception (its `error` says why).
    let ok = case.run("s", "x = 1").await;
    assert!(ok.exception.is_none() && ok.error.is_none(), "{ok:?}");
    case.finish().await;
}

#[tokio::test]
async fn a_stderr_flood_is_cut_like_output_and_the_kernel_stays_usable() {
    let case = Case::new("stderr-flood").await;
    let r = case
        .run(
            "s",
            "import sys\nchunk = 'e' * 1023 + '\\n'\nfor _ in range(20 * 1024):\n    sys.stderr.write(chunk)\nprint('THE-END')",
        )
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let total = 20 * 1024 * 1024 + "THE-END\n".len() as u64;
    assert_eq!(
        r.stdout_bytes_total,
        Some(total),
        "the flood is all in output"
    );
    assert!(r.stderr.len() < 51_000, "{}", r.stderr.len());
    assert!(
        r.stderr.contains(&format!(
            "bytes of output omitted; {} bytes in all",
            20 * 1024 * 1024
        )),
        "{}",
        &r.stderr[..200]
    );
    assert_eq!(r.stdout, "THE-END\n");
    let next = case
        .run("s", "import sys; sys.stderr.write('e'); print('o')")
        .await;
    assert_eq!((next.stdout.as_str(), next.stderr.as_str()), ("o\n", "e"));
    assert!(next.kernel.reused);
    case.finish().await;
}

/// Kills every child of the runner (the stderr relay is one), then writes on stderr.
const KILL_THE_RELAY: &str = "import os, signal
me = str(os.getpid())
for pid in os.listdir('/proc'):
    if not pid.isdigit():
        continue
    try:
        stat = open('/proc/%s/stat' % pid).read().rsplit(')', 1)[1].split()
    except OSError:
        continue
    if stat[1] == me:
        os.kill(int(pid), signal.SIGKILL)
        print('killed', pid)
";

#[tokio::test]
async fn a_cell_that_kills_the_stderr_relay_loses_the_split_not_its_output() {
    let case = Case::new("relay-kill").await;
    let first = case.run("s", "x = 42").await;
    let killed = case.run("s", KILL_THE_RELAY).await;
    assert_eq!(killed.status, CellStatus::Success, "{killed:?}");
    assert!(killed.stdout.contains("killed"), "{killed:?}");
    // stderr now goes to stdout: nothing is lost, the kernel and its state stay.
    let after = case
        .run(
            "s",
            "import sys; sys.stderr.write('e\\n'); sys.stderr.flush(); print(x)",
        )
        .await;
    assert_eq!(after.status, CellStatus::Success, "{after:?}");
    assert_eq!(after.output, "e\n42\n");
    assert_eq!(after.stdout, "e\n42\n");
    assert_eq!(after.kernel.id, first.kernel.id);
    case.finish().await;
}
