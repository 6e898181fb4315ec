//! Out-of-memory deaths are told apart from later, unrelated ones: a cell's subprocess killed
//! at the memory limit (the kernel survives) does not make a later crash of the kernel an
//! `oom`, while the kernel itself killed at the limit still is one.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use futures::StreamExt;

use common::{Case, CASE};
use kernelbox::{CellStatus, LossReason};

/// A subprocess that allocates past the kernel's memory limit and is killed for it.
const CHILD_OOM: &str = "import subprocess, sys\n\
r = subprocess.run([sys.executable, '-c', 'b = []\\nwhile True:\\n    b.append(bytearray(8 << 20))'])\n\
print('child', r.returncode)";

#[tokio::test]
async fn an_earlier_oom_of_a_subprocess_does_not_make_a_later_crash_an_oom() {
    let case = Case::with("oom-attribution", |c| {
        c.spec.sandbox.memory_bytes = 128 * 1024 * 1024
    })
    .await;
    case.run("s", "x = 1").await;
    let since = kernelbox::clock::unix_now() as i64 - 1;
    let r = case.run("s", CHILD_OOM).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(
        r.output, "child -9\n",
        "the subprocess was OOM-killed: {r:?}"
    );
    assert!(r.kernel.reused, "the kernel survived: {r:?}");
    // The engine reported the OOM kill (an `oom` event of the kernel's container) before the
    // crash below.
    let filter = [kernelbox::labels::filter(CASE, &case.label)];
    let mut events = case.engine.events(&filter, Some(since));
    let oom = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(Ok(event)) = events.next().await {
            if event.action == "oom" {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(
        oom,
        Ok(true),
        "the engine reported the subprocess's OOM kill"
    );
    drop(events);

    let r = case.run("s", "import os\nos._exit(3)").await;
    assert_eq!(r.status, CellStatus::Error, "{r:?}");
    let error = r.error.clone().unwrap_or_default();
    assert!(error.contains("died unexpectedly (exit code 3)"), "{r:?}");
    let next = case.run("s", "print('x' in dir())").await;
    assert_eq!(next.output, "False\n", "{next:?}");
    assert_eq!(
        next.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::Crashed),
        "{next:?}"
    );

    // The kernel itself killed at the limit is still an OOM.
    let r = case
        .run(
            "s",
            "blocks = []\nwhile True:\n    blocks.append(bytearray(16 << 20))",
        )
        .await;
    let error = r.error.clone().unwrap_or_default();
    assert!(error.contains("ran out of memory (limit 128 MiB)"), "{r:?}");
    let next = case.run("s", "print('fresh')").await;
    assert_eq!(
        next.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::Oom),
        "{next:?}"
    );
    case.finish().await;
}
