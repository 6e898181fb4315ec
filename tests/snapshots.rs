//! Snapshots, restore and fork (docs/snapshots.md) against the real engine under gVisor's
//! runsc (`.ci/runsc`): a fork's kernels have the source's variables, a 50 MB object and its
//! files, and each goes its own way; a snapshot outlives its kernel and starts a new session;
//! a hibernated kernel forks without being resumed; another tenant's snapshot is not found;
//! the bounds refuse the next snapshot (a fork's checkpoint counted, concurrent snapshots
//! counted together) and leave nothing behind; a fork at the tenant's cap keeps its source;
//! a snapshot sent during a cell waits for the kernel; a runc kernel gets a files-only
//! snapshot (`memory: false`) without the links out of its working directory; and over real
//! HTTP, a `kill -9` of the server during a fork leaves nothing behind and loses no snapshot.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::time::Duration;

use common::Case;
use kernelbox::config::HibernateConfig;
use kernelbox::{CellStatus, KernelRuntime, Scope, SnapshotError};

/// Fills a kernel: a variable, a 50 MB object, a file in its working directory, a file in
/// `/tmp`; prints the object's hash.
const FILL: &str = "import hashlib, os\nx = 41\nbig = bytearray(os.urandom(50 << 20))\nopen('note.txt', 'w').write('kept')\nopen('/tmp/t.txt', 'w').write('tmp')\nprint(hashlib.sha256(big).hexdigest())";

/// What a kernel filled by [`FILL`] answers.
const CHECK: &str =
    "print(x, hashlib.sha256(big).hexdigest(), open('note.txt').read(), open('/tmp/t.txt').read())";

/// A runsc case whose snapshots go to `dir`.
async fn case(
    name: &str,
    dir: &std::path::Path,
    tweak: impl FnOnce(&mut kernelbox::Config),
) -> Case {
    let dir = dir.to_path_buf();
    Case::with(name, move |c| {
        c.spec.sandbox.runtime = KernelRuntime::Runsc;
        c.pool.size = 0;
        c.snapshots.dir = Some(dir);
        tweak(c);
    })
    .await
}

/// A filled session `s`: its expected [`CHECK`] answer.
async fn filled(case: &Case, session: &str) -> String {
    let r = case.run(session, FILL).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    format!("41 {} kept tmp\n", r.output.trim())
}

/// The entries of the snapshots' directory (snapshots, and anything half-made).
fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test]
async fn forks_have_the_sources_memory_and_files_and_each_goes_its_own_way() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-fork", dir.path(), |_| {}).await;
    let expected = filled(&case, "src").await;
    let forks = case
        .kb
        .snapshots()
        .fork(
            &Scope::session("src"),
            vec!["f1".into(), "f2".into(), "f3".into()],
        )
        .await
        .unwrap();
    assert_eq!(forks.forks.len(), 3);
    for fork in &forks.forks {
        let kernel = fork.kernel.as_ref().unwrap_or_else(|| panic!("{fork:?}"));
        assert_eq!(kernel.generation, 1, "{fork:?}");
        let r = case.run(&fork.session, CHECK).await;
        assert_eq!(r.output, expected, "{} {r:?}", fork.session);
        assert!(
            r.kernel.reused,
            "a fork's kernel is the restored one: {r:?}"
        );
        assert!(r.kernel.state_lost.is_none(), "{r:?}");
    }
    // The source goes on, the same kernel.
    let r = case.run("src", CHECK).await;
    assert_eq!(r.output, expected, "{r:?}");
    assert!(r.kernel.reused && r.kernel.state_lost.is_none(), "{r:?}");
    // Four kernels, four containers: each its own.
    assert_eq!(case.kb.list_kernels(None).len(), 4);
    assert_eq!(case.containers().await.len(), 4);
    // A change in one is seen in none of the others.
    case.run("f1", "x = 1\nos.remove('note.txt')").await;
    for session in ["f2", "f3", "src"] {
        let r = case.run(session, CHECK).await;
        assert_eq!(r.output, expected, "{session} {r:?}");
    }
    let r = case.run("f1", "print(x, os.path.exists('note.txt'))").await;
    assert_eq!(r.output, "1 False\n");
    // A fork's snapshot is not kept; its forks' links are gone.
    assert_eq!(entries(dir.path()), Vec::<String>::new());
    // A fork into a session that has a kernel fails on its own.
    let again = case
        .kb
        .snapshots()
        .fork(&Scope::session("src"), vec!["f1".into(), "f4".into()])
        .await
        .unwrap();
    assert_eq!(
        again.forks[0].error.as_ref().map(|e| e.code.as_str()),
        Some("session_exists"),
        "{again:?}"
    );
    assert!(again.forks[1].kernel.is_some(), "{again:?}");
    case.finish().await;
}

#[tokio::test]
async fn a_snapshot_outlives_its_kernel_and_a_restart_and_starts_a_new_session() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-keep", dir.path(), |_| {}).await;
    let expected = filled(&case, "src").await;
    let snap = case
        .kb
        .snapshots()
        .take(&Scope::session("src"), Some("before".into()))
        .await
        .unwrap();
    assert!(snap.memory && snap.bytes > 40 << 20, "{snap:?}");
    assert_eq!(snap.name.as_deref(), Some("before"));
    // The snapshot's files are the server's only.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.path().join(&snap.id))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    // The source goes on; clearing it (and `reset`) leaves the snapshot.
    assert_eq!(case.run("src", CHECK).await.output, expected);
    case.kb.clear_session(None, "src").await;
    let label = case.label.clone();
    let engine = case.engine.clone();
    case.kb.shutdown().await;
    // A new server over the same directory has it.
    let kb = kernelbox::Orchestrator::start(
        {
            let mut c = common::config(&label);
            c.spec.sandbox.runtime = KernelRuntime::Runsc;
            c.pool.size = 0;
            c.snapshots.dir = Some(dir.path().to_path_buf());
            c
        },
        engine.clone(),
    )
    .await
    .unwrap();
    let listed = kb.snapshots().list(None);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, snap.id);
    let restored = kb
        .snapshots()
        .restore(&Scope::session("new"), &snap.id)
        .await
        .unwrap();
    assert_eq!(restored.generation, 1);
    let r = kb
        .execute(kernelbox::ExecuteRequest::new("new", CHECK))
        .await
        .unwrap();
    assert_eq!(r.output, expected, "{r:?}");
    // Restored twice: a second session from the same snapshot.
    kb.snapshots()
        .restore(&Scope::session("new2"), &snap.id)
        .await
        .unwrap();
    let r = kb
        .execute(kernelbox::ExecuteRequest::new("new2", CHECK))
        .await
        .unwrap();
    assert_eq!(r.output, expected, "{r:?}");
    // Into a session that has a kernel: refused.
    let taken = kb
        .snapshots()
        .restore(&Scope::session("new"), &snap.id)
        .await;
    assert!(
        matches!(taken, Err(SnapshotError::SessionExists { .. })),
        "{taken:?}"
    );
    kb.snapshots().delete(None, &snap.id).await.unwrap();
    assert!(kb.snapshots().list(None).is_empty());
    assert_eq!(entries(dir.path()), Vec::<String>::new());
    kb.shutdown().await;
    common::assert_clean(&engine, &label).await;
}

#[tokio::test]
async fn a_hibernated_kernel_forks_without_being_resumed() {
    let dir = tempfile::tempdir().unwrap();
    let checkpoints = tempfile::tempdir().unwrap();
    let idle = Duration::from_millis(1500);
    let case = case("snap-hibernated", dir.path(), |c| {
        c.kernels.idle_timeout = idle;
        c.hibernate = Some(HibernateConfig {
            dir: Some(checkpoints.path().to_path_buf()),
            across_restarts: false,
            ..HibernateConfig::default()
        });
    })
    .await;
    let expected = filled(&case, "src").await;
    tokio::time::sleep(idle + Duration::from_millis(300)).await;
    case.kb.reap_once().await;
    assert_eq!(case.kb.hibernated(), 1);
    let forks = case
        .kb
        .snapshots()
        .fork(&Scope::session("src"), vec!["h1".into(), "h2".into()])
        .await
        .unwrap();
    assert_eq!(forks.checkpoint_seconds, 0.0, "no pause of its own");
    // Still hibernated: its container stopped, its checkpoint kept.
    assert_eq!(case.kb.hibernated(), 1);
    assert_eq!(case.kb.list_kernels(None).len(), 2);
    for fork in &forks.forks {
        assert!(fork.kernel.is_some(), "{fork:?}");
        let r = case.run(&fork.session, CHECK).await;
        assert_eq!(r.output, expected, "{r:?}");
    }
    // And it comes back as it was.
    let r = case.run("src", CHECK).await;
    assert_eq!(r.output, expected, "{r:?}");
    assert!(r.kernel.restored.is_some(), "{r:?}");
    case.finish().await;
}

#[tokio::test]
async fn another_tenants_snapshot_is_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-tenant", dir.path(), |_| {}).await;
    let r = case
        .exec(kernelbox::ExecuteRequest {
            scope: Scope::session("s").tenant("a"),
            code: "x = 1".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let snap = case
        .kb
        .snapshots()
        .take(&Scope::session("s").tenant("a"), None)
        .await
        .unwrap();
    assert!(case.kb.snapshots().list(Some("b")).is_empty());
    assert!(matches!(
        case.kb.snapshots().get(Some("b"), &snap.id),
        Err(SnapshotError::NotFound { .. })
    ));
    let stolen = case
        .kb
        .snapshots()
        .restore(&Scope::session("s").tenant("b"), &snap.id)
        .await;
    assert!(
        matches!(stolen, Err(SnapshotError::NotFound { .. })),
        "{stolen:?}"
    );
    assert!(matches!(
        case.kb.snapshots().delete(Some("b"), &snap.id).await,
        Err(SnapshotError::NotFound { .. })
    ));
    assert_eq!(case.kb.snapshots().list(Some("a")).len(), 1);
    // Nothing started for b.
    assert!(case.kb.list_kernels(Some("b")).is_empty());
    case.finish().await;
}

#[tokio::test]
async fn the_bounds_refuse_the_next_snapshot_and_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-bounds", dir.path(), |c| {
        c.snapshots.max_per_tenant = 2;
    })
    .await;
    case.run("s", "x = 1").await;
    for _ in 0..2 {
        case.kb
            .snapshots()
            .take(&Scope::session("s"), None)
            .await
            .unwrap();
    }
    let third = case.kb.snapshots().take(&Scope::session("s"), None).await;
    match &third {
        Err(e @ SnapshotError::Limit { .. }) => {
            assert!(e.to_string().contains("at most 2 snapshots"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // A fork's own snapshot counts too.
    let fork = case
        .kb
        .snapshots()
        .fork(&Scope::session("s"), vec!["f".into()])
        .await;
    assert!(matches!(fork, Err(SnapshotError::Limit { .. })), "{fork:?}");
    assert_eq!(entries(dir.path()).len(), 2, "{:?}", entries(dir.path()));
    assert_eq!(case.containers().await.len(), 1);
    // The kernel goes on.
    assert_eq!(case.run("s", "print(x)").await.output, "1\n");
    case.finish().await;
}

#[tokio::test]
async fn a_snapshot_past_the_tenants_bytes_is_refused_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-bytes", dir.path(), |c| {
        c.snapshots.max_tenant_bytes = 1 << 20;
    })
    .await;
    case.run("s", "x = bytearray(8 << 20)").await;
    let refused = case.kb.snapshots().take(&Scope::session("s"), None).await;
    assert!(
        matches!(refused, Err(SnapshotError::Limit { .. })),
        "{refused:?}"
    );
    assert_eq!(entries(dir.path()), Vec::<String>::new());
    assert_eq!(case.run("s", "print(len(x))").await.output, "8388608\n");
    case.finish().await;
}

#[tokio::test]
async fn a_forks_checkpoint_is_counted_by_the_tenants_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-fork-bytes", dir.path(), |c| {
        c.snapshots.max_tenant_bytes = 1 << 20;
    })
    .await;
    case.run("s", "x = bytearray(8 << 20)").await;
    let refused = case
        .kb
        .snapshots()
        .fork(&Scope::session("s"), vec!["f".into()])
        .await;
    match &refused {
        Err(e @ SnapshotError::Limit { .. }) => {
            assert!(e.to_string().contains("bytes of snapshots"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    // Nothing started, nothing left; the source goes on.
    assert_eq!(entries(dir.path()), Vec::<String>::new());
    assert_eq!(case.containers().await.len(), 1);
    assert_eq!(case.run("s", "print(len(x))").await.output, "8388608\n");
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_snapshots_never_pass_the_tenants_bytes_together() {
    let dir = tempfile::tempdir().unwrap();
    // Measured first: one snapshot's bytes, then a bound that holds two and a half.
    let probe = tempfile::tempdir().unwrap();
    let one = {
        let case = case("snap-conc-probe", probe.path(), |_| {}).await;
        case.run("p", "x = bytearray(4 << 20)").await;
        let snap = case
            .kb
            .snapshots()
            .take(&Scope::session("p"), None)
            .await
            .unwrap();
        case.finish().await;
        snap.bytes
    };
    let bound = one * 5 / 2;
    let case = case("snap-conc", dir.path(), move |c| {
        c.snapshots.max_tenant_bytes = bound;
    })
    .await;
    let sessions = ["a", "b", "c", "d"];
    for s in sessions {
        case.run(s, "x = bytearray(4 << 20)").await;
    }
    let taken = futures::future::join_all(sessions.iter().map(|s| {
        let kb = case.kb.clone();
        async move { kb.snapshots().take(&Scope::session(*s), None).await }
    }))
    .await;
    let kept: u64 = case.kb.snapshots().list(None).iter().map(|s| s.bytes).sum();
    assert!(
        kept <= bound,
        "{kept} bytes kept against {bound}: {taken:?}"
    );
    for t in &taken {
        assert!(
            matches!(t, Ok(_) | Err(SnapshotError::Limit { .. })),
            "{t:?}"
        );
    }
    assert!(taken.iter().any(|t| t.is_err()), "{taken:?}");
    case.finish().await;
}

#[tokio::test]
async fn a_fork_at_the_tenants_cap_keeps_its_source_and_says_at_capacity() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-cap", dir.path(), |_| {}).await;
    let limits = kernelbox::TenantLimits {
        max_kernels: Some(2),
        ..Default::default()
    };
    let src = Scope::session("src").tenant_limits(limits);
    let r = case
        .exec(kernelbox::ExecuteRequest {
            scope: src.clone(),
            code: "x = 41".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let forks = case
        .kb
        .snapshots()
        .fork(&src, vec!["f1".into(), "f2".into()])
        .await
        .unwrap();
    let ok: Vec<_> = forks.forks.iter().filter(|f| f.kernel.is_some()).collect();
    let refused: Vec<_> = forks
        .forks
        .iter()
        .filter_map(|f| f.error.as_ref())
        .collect();
    assert_eq!((ok.len(), refused.len()), (1, 1), "{forks:?}");
    assert_eq!(refused[0].code, "at_capacity", "{forks:?}");
    // The source was not evicted for a fork: the same kernel, its memory kept.
    let r = case
        .exec(kernelbox::ExecuteRequest {
            scope: src.clone(),
            code: "print(x)".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(r.output, "41\n", "{r:?}");
    assert!(r.kernel.reused && r.kernel.state_lost.is_none(), "{r:?}");
    // Nor the fork that started.
    let r = case
        .exec(kernelbox::ExecuteRequest {
            scope: Scope::session(&ok[0].session).tenant_limits(limits),
            code: "print(x)".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(r.output, "41\n", "{r:?}");
    assert!(r.kernel.state_lost.is_none(), "{r:?}");
    assert_eq!(case.containers().await.len(), 2);
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_sent_during_a_cell_waits_for_the_kernel_instead_of_refusing() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-wait", dir.path(), |_| {}).await;
    case.run("s", "x = 1").await;
    let cell = common::start_cell(
        &case.kb,
        "s",
        "print('go', flush=True)\nimport time\ntime.sleep(2)\ny = 2",
    )
    .await;
    // The cell is running: the snapshot waits for it to end, then takes the kernel.
    let snap = case
        .kb
        .snapshots()
        .take(&Scope::session("s"), None)
        .await
        .unwrap();
    let ran = cell.await.unwrap().unwrap();
    assert_eq!(ran.status, CellStatus::Success, "{ran:?}");
    // So does a fork.
    let _cell = common::start_cell(&case.kb, "s", "print('go', flush=True)\ntime.sleep(2)").await;
    let forks = case
        .kb
        .snapshots()
        .fork(&Scope::session("s"), vec!["f".into()])
        .await
        .unwrap();
    assert!(forks.forks[0].kernel.is_some(), "{forks:?}");
    // The snapshot holds what the cell did.
    case.kb
        .snapshots()
        .restore(&Scope::session("back"), &snap.id)
        .await
        .unwrap();
    assert_eq!(case.run("back", "print(x, y)").await.output, "1 2\n");
    case.finish().await;
}

#[tokio::test]
async fn a_runc_kernel_gets_a_files_only_snapshot_that_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-runc", dir.path(), |c| {
        c.spec.sandbox.runtime = KernelRuntime::Runc;
    })
    .await;
    // Files, a subdirectory, and what a restore must not take: links out of /work.
    let setup = "import os\nx = 1\nopen('note.txt', 'w').write('kept')\nos.makedirs('d/e')\nopen('d/e/f.txt', 'w').write('deep')\nos.symlink('/etc/passwd', 'pw')\nos.symlink('../../..', 'up')\nos.symlink('/etc', 'd/etc')\nos.link('note.txt', 'hard.txt')";
    let r = case.run("s", setup).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let snap = case
        .kb
        .snapshots()
        .take(&Scope::session("s"), Some("files".into()))
        .await
        .unwrap();
    assert!(!snap.memory, "never pretends to hold memory: {snap:?}");
    assert_eq!(snap.runtime, "runc");
    assert!(snap.bytes > 0, "{snap:?}");
    // The source goes on as it was.
    assert_eq!(case.run("s", "print(x)").await.output, "1\n");
    // Restored: a fresh kernel with the files, no memory, no links.
    let restored = case
        .kb
        .snapshots()
        .restore(&Scope::session("new"), &snap.id)
        .await
        .unwrap();
    assert_eq!(restored.generation, 1);
    let check = "import os\nprint(open('note.txt').read(), open('d/e/f.txt').read(), open('hard.txt').read(), sorted(n for n in os.listdir('.') if os.path.islink(n)), os.path.lexists('d/etc'), 'x' in globals())";
    let r = case.run("new", check).await;
    assert_eq!(r.output, "kept deep kept [] False False\n", "{r:?}");
    // A fork likewise, each its own.
    let forks = case
        .kb
        .snapshots()
        .fork(&Scope::session("s"), vec!["f1".into(), "f2".into()])
        .await
        .unwrap();
    assert_eq!(
        forks.forks.iter().filter(|f| f.kernel.is_some()).count(),
        2,
        "{forks:?}"
    );
    case.run("f1", "os.remove('note.txt')").await;
    let r = case
        .run("f2", "import os\nprint(os.path.exists('note.txt'))")
        .await;
    assert_eq!(r.output, "True\n", "{r:?}");
    let r = case.run("s", "print(os.path.exists('note.txt'))").await;
    assert_eq!(r.output, "True\n", "{r:?}");
    // Only the kept snapshot is on disk.
    assert_eq!(entries(dir.path()), vec![snap.id.clone()]);
    case.finish().await;
}

/// A caller that goes away mid-snapshot (its request dropped while the snapshot waits for a
/// running cell) leaves nothing held: no reservation counted against the tenant, no
/// half-made directory, no call attached to the kernel (docs/snapshots.md, "Bounds").
#[tokio::test]
async fn a_snapshot_whose_caller_goes_away_leaves_nothing_held() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-dropped", dir.path(), |c| {
        c.spec.sandbox.runtime = KernelRuntime::Runc;
        c.snapshots.max_per_tenant = 2;
    })
    .await;
    case.run("s", "open('note.txt', 'w').write('kept')").await;
    let cell = common::start_cell(
        &case.kb,
        "s",
        "print('go', flush=True)\nimport time\ntime.sleep(3)",
    )
    .await;
    // Five callers give up while the snapshot waits for the cell: each call is dropped.
    let snapshots = case.kb.snapshots();
    let scope = Scope::session("s");
    for _ in 0..5 {
        // Dropped at 200 ms (or refused at once at the bound: the earlier ones are held).
        let call = snapshots.take(&scope, None);
        let _ = tokio::time::timeout(Duration::from_millis(200), call).await;
    }
    cell.await.unwrap().unwrap();
    // The abandoned calls end on their own (each takes its snapshot once the cell is done,
    // or is refused at the bound); then the tenant's books hold only what was kept.
    let mut kept = Vec::new();
    for _ in 0..100 {
        kept = case.kb.snapshots().list(None);
        let attached = case
            .kb
            .list_kernels(None)
            .iter()
            .map(|k| k.attached)
            .sum::<usize>();
        if attached == 0 && !entries(dir.path()).iter().any(|e| e.starts_with('.')) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(kept.len() <= 2, "{kept:?}");
    let attached: usize = case.kb.list_kernels(None).iter().map(|k| k.attached).sum();
    assert_eq!(attached, 0, "no call is left attached to the kernel");
    let names = entries(dir.path());
    assert!(
        !names.iter().any(|e| e.starts_with('.')),
        "nothing half-made is left: {names:?}"
    );
    assert_eq!(names.len(), kept.len(), "{names:?} vs {kept:?}");
    // Deleting what was kept gives the room back: the next snapshot is taken.
    for snap in &kept {
        case.kb.snapshots().delete(None, &snap.id).await.unwrap();
    }
    case.kb
        .snapshots()
        .take(&Scope::session("s"), None)
        .await
        .unwrap();
    case.finish().await;
}

#[tokio::test]
async fn a_files_only_snapshot_past_the_tenants_bytes_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("snap-runc-bytes", dir.path(), |c| {
        c.spec.sandbox.runtime = KernelRuntime::Runc;
        c.snapshots.max_tenant_bytes = 1 << 20;
    })
    .await;
    let r = case
        .run("s", "open('big.bin', 'wb').write(b'y' * (4 << 20))")
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let refused = case.kb.snapshots().take(&Scope::session("s"), None).await;
    assert!(
        matches!(refused, Err(SnapshotError::Limit { .. })),
        "{refused:?}"
    );
    assert_eq!(entries(dir.path()), Vec::<String>::new());
    let r = case
        .run("s", "import os\nprint(os.path.getsize('big.bin'))")
        .await;
    assert_eq!(r.output, "4194304\n", "{r:?}");
    case.finish().await;
}

/// `kernelbox serve --runtime runsc --pool 0` on `state` (snapshots in `state/snapshots`).
async fn serve(
    label: &str,
    state: &std::path::Path,
) -> (tokio::process::Child, std::net::SocketAddr) {
    let mut cmd = common::serve_command(label, "tok");
    cmd.args(["--runtime", "runsc", "--pool", "0"])
        .arg("--state-dir")
        .arg(state)
        .env_remove("KERNELBOX_STATE_DIR")
        .env_remove("KERNELBOX_RUNTIME");
    common::spawn_serving(cmd).await
}

/// Polls Docker (bounded) until the case's containers and volumes are `done`.
async fn wait_until(
    engine: &std::sync::Arc<dyn kernelbox::Engine>,
    label: &str,
    what: &str,
    done: impl Fn(usize, usize) -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let cs = common::containers(engine, label).await;
        let vs = common::volumes(engine, label).await;
        if done(cs.len(), vs.len()) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {cs:?} {vs:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_a_fork_leaves_nothing_behind_and_loses_no_snapshot() {
    let label = common::unique("snap-kill");
    let engine = common::engine().await;
    let state = tempfile::tempdir().unwrap();
    let snapshots = state.path().join("snapshots");
    let (mut first, addr) = serve(&label, state.path()).await;
    let api = http::Api::new(addr);
    let filled = api.run("tok", "src", FILL).await;
    assert_eq!(filled["status"], "success", "{filled}");
    let expected = format!(
        "41 {} kept tmp\n",
        filled["output"].as_str().unwrap().trim()
    );
    let kept = api
        .post(
            "/v1/sessions/src/snapshots",
            Some("tok"),
            serde_json::json!({"name": "kept"}),
        )
        .await
        .json();
    let id = kept["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{kept}"))
        .to_string();
    // A fork in flight: the server is killed once its forks' containers exist.
    let forking = tokio::spawn(async move {
        http::Api::new(addr)
            .post(
                "/v1/sessions/src/fork",
                Some("tok"),
                serde_json::json!({"count": 4}),
            )
            .await
    });
    wait_until(&engine, &label, "the forks' containers", |cs, _| cs > 1).await;
    first.kill().await.unwrap();
    forking.abort();
    // The watchdog removes every kernel of the killed server, the forks' too.
    wait_until(&engine, &label, "the watchdog's sweep", |cs, vs| {
        cs == 0 && vs == 0
    })
    .await;
    // The restarted server has the snapshot, whole; nothing half-made is left.
    let (mut second, addr) = serve(&label, state.path()).await;
    assert_eq!(entries(&snapshots), vec![id.clone()]);
    let api = http::Api::new(addr);
    let listed = api.get("/v1/snapshots", Some("tok")).await.json();
    assert_eq!(listed["snapshots"][0]["id"], id.as_str(), "{listed}");
    let restored = api
        .post(
            "/v1/sessions/back/restore",
            Some("tok"),
            serde_json::json!({"snapshot": id}),
        )
        .await
        .json();
    assert_eq!(restored["kernel"]["generation"], 1, "{restored}");
    let back = api.run("tok", "back", CHECK).await;
    assert_eq!(back["output"], expected.as_str(), "{back}");
    // Another tenant's token cannot reach it over HTTP either (one token here: a wrong one
    // is refused before any lookup).
    let other = api.get(&format!("/v1/snapshots/{id}"), Some("nope")).await;
    assert_eq!(other.status, hyper::StatusCode::UNAUTHORIZED);
    common::terminate(&mut second, Duration::from_secs(120)).await;
    common::assert_clean(&engine, &label).await;
}
