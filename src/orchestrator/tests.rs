//! The orchestrator's logic against the in-memory fake engine, in paused time: fast and
//! deterministic. The real engine is exercised by the integration tests in `tests/`.

use super::*;
use crate::catalog::Catalog;
use crate::cell::messages::{timeout_message, CLEARED_MESSAGE};
use crate::cell::{CellResult, CellStatus, LossReason};
use crate::docker::fake::FakeEngine;
use crate::docker::EngineError;
use crate::kernel::KernelError;

async fn start(tweak: impl FnOnce(&mut Config)) -> (Orchestrator, FakeEngine) {
    let fake = FakeEngine::default();
    let mut config = Config::default();
    tweak(&mut config);
    let kb = Orchestrator::start(config, Arc::new(fake.clone()))
        .await
        .expect("start");
    (kb, fake)
}

async fn run(kb: &Orchestrator, session: &str, code: &str) -> CellResult {
    kb.execute(ExecuteRequest::new(session, code))
        .await
        .expect("execute")
}

#[tokio::test(start_paused = true)]
async fn concurrent_first_calls_spawn_exactly_one_container() {
    let (kb, fake) = start(|_| {}).await;
    let calls = (0..6).map(|_| run(&kb, "conv-a", "x = 1"));
    let results = futures::future::join_all(calls).await;
    assert_eq!(fake.created(), 1);
    let mut counts: Vec<u64> = results.iter().map(|r| r.kernel.execution_count).collect();
    counts.sort_unstable();
    assert_eq!(counts, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(results.iter().filter(|r| !r.kernel.reused).count(), 1);
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
    assert_eq!(fake.live_volumes(), 0);
}

#[tokio::test(start_paused = true)]
async fn eviction_removes_containers_and_volumes_and_reports_the_loss() {
    let (kb, fake) = start(|c| c.kernels.max_session_kernels = 2).await;
    for i in 0..4 {
        run(&kb, &format!("conv-{i}"), "x = 1").await;
        tokio::time::advance(Duration::from_millis(5)).await;
    }
    assert_eq!(fake.created(), 4);
    assert_eq!(fake.live_containers(), 2);
    assert_eq!(fake.live_volumes(), 2);
    let back = run(&kb, "conv-0", "x").await;
    assert_eq!(
        back.kernel.state_lost.map(|l| l.reason),
        Some(LossReason::Evicted)
    );
    assert_eq!(back.kernel.generation, 2);
    kb.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_timeout_kills_in_virtual_time_and_the_next_call_is_fresh() {
    let (kb, fake) = start(|_| {}).await;
    let slow = kb
        .execute(ExecuteRequest {
            timeout: Some(Duration::from_secs(5)),
            ..ExecuteRequest::new("s", "sleep")
        })
        .await
        .expect("execute");
    assert_eq!(slow.status, CellStatus::Timeout);
    assert_eq!(
        slow.error.as_deref(),
        Some(timeout_message(Duration::from_secs(5)).as_str())
    );
    assert_eq!(fake.live_containers(), 0);
    assert!(kb.list_kernels(None).is_empty());
    let next = run(&kb, "s", "x = 1").await;
    assert!(!next.kernel.reused);
    assert_eq!(
        next.kernel.state_lost.map(|l| l.reason),
        Some(LossReason::Timeout)
    );
    kb.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_loss_survives_a_failed_start_of_the_next_kernel() {
    let (kb, fake) = start(|_| {}).await;
    let slow = kb
        .execute(ExecuteRequest {
            timeout: Some(Duration::from_secs(5)),
            ..ExecuteRequest::new("s", "sleep")
        })
        .await
        .expect("execute");
    assert_eq!(slow.status, CellStatus::Timeout);
    // The next kernel cannot start: the call fails, and the loss stays owed.
    *fake.images.lock().unwrap() = vec!["no-such-image".into()];
    let failed = kb.execute(ExecuteRequest::new("s", "x = 1")).await;
    assert!(matches!(failed, Err(ExecuteError::Kernel(_))), "{failed:?}");
    fake.images.lock().unwrap().clear();
    let next = run(&kb, "s", "x = 1").await;
    assert_eq!(
        next.kernel.state_lost.map(|l| l.reason),
        Some(LossReason::Timeout)
    );
    kb.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn clear_and_reset_kill_a_busy_kernel_at_once() {
    let (kb, fake) = start(|c| c.kernels.max_session_kernels = 1).await;
    // A clear during a running cell: the kernel goes now and the cell says why.
    let busy = tokio::spawn({
        let kb = kb.clone();
        async move { run(&kb, "s", "sleep").await }
    });
    while kb.running_cells() == 0 || fake.live_containers() == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(kb.clear_session(None, "s").await, 1);
    assert_eq!(fake.live_containers(), 0);
    let ended = busy.await.expect("join");
    assert_eq!(ended.status, CellStatus::Error);
    assert_eq!(ended.error.as_deref(), Some(CLEARED_MESSAGE));
    // A reset during a running cell: one kernel live, the listed one.
    let busy = tokio::spawn({
        let kb = kb.clone();
        async move { run(&kb, "r", "sleep").await }
    });
    while kb.running_cells() == 0 || fake.live_containers() == 0 {
        tokio::task::yield_now().await;
    }
    let fresh = kb
        .execute(ExecuteRequest {
            reset: true,
            ..ExecuteRequest::new("r", "x = 1")
        })
        .await
        .expect("reset");
    assert!(fresh.kernel.state_reset);
    assert_eq!(
        busy.await.expect("join").error.as_deref(),
        Some(CLEARED_MESSAGE)
    );
    assert_eq!(fake.live_containers(), 1);
    assert_eq!(kb.list_kernels(None).len(), 1);
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cell_whose_caller_goes_away_still_runs_to_its_end() {
    let (kb, fake) = start(|_| {}).await;
    run(&kb, "s", "x = 1").await;
    let abandoned = kb.execute(ExecuteRequest {
        timeout: Some(Duration::from_secs(5)),
        ..ExecuteRequest::new("s", "sleep")
    });
    // The caller gives up after a second; the cell goes on.
    assert!(tokio::time::timeout(Duration::from_secs(1), abandoned)
        .await
        .is_err());
    assert_eq!(fake.live_containers(), 1);
    assert_eq!(kb.list_kernels(None).len(), 1);
    // It times out on its own and the kernel is killed: a call queued behind it learns
    // that the kernel went away, and the call after that gets a fresh one.
    let queued = run(&kb, "s", "x = 1").await;
    assert_eq!(queued.status, CellStatus::Error, "{queued:?}");
    assert_eq!(fake.live_containers(), 0);
    let next = run(&kb, "s", "x = 1").await;
    assert!(!next.kernel.reused);
    assert_eq!(
        next.kernel.state_lost.map(|l| l.reason),
        Some(LossReason::Timeout)
    );
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
}

#[tokio::test(start_paused = true)]
async fn idle_kernels_go_on_a_reaper_pass_and_attached_ones_stay() {
    // Idle 65 s: the background reaper ticks every 30 s, so at 66 s only an explicit pass
    // can have retired the kernel.
    let (kb, fake) = start(|c| c.kernels.idle_timeout = Duration::from_secs(65)).await;
    run(&kb, "idle", "x = 1").await;
    let busy = {
        let kb = kb.clone();
        tokio::spawn(async move {
            kb.execute(ExecuteRequest {
                timeout: Some(Duration::from_secs(600)),
                ..ExecuteRequest::new("busy", "sleep")
            })
            .await
        })
    };
    // Let the busy call attach before time moves on.
    while kb.list_kernels(None).iter().all(|k| k.state != "busy") {
        tokio::task::yield_now().await;
    }
    tokio::time::advance(Duration::from_secs(66)).await;
    assert_eq!(kb.reap_once().await, 1);
    assert_eq!(fake.live_containers(), 1, "the busy kernel is spared");
    assert_eq!(kb.list_kernels(None)[0].session, "busy");
    assert_eq!(kb.interrupt(None, "busy").await, 1);
    let interrupted = busy.await.expect("join").expect("execute");
    assert_eq!(interrupted.status, CellStatus::Interrupted);
    assert_eq!(fake.live_containers(), 1, "an interrupt keeps the kernel");
    kb.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn interrupt_counts_only_the_cells_that_ended_interrupted() {
    let (kb, fake) = start(|_| {}).await;
    run(&kb, "s", "x = 1").await;
    let spawn_cell = |code: &'static str| {
        let kb = kb.clone();
        tokio::spawn(async move {
            kb.execute(ExecuteRequest {
                timeout: Some(Duration::from_secs(600)),
                ..ExecuteRequest::new("s", code)
            })
            .await
        })
    };
    let running = spawn_cell("sleep");
    while kb.list_kernels(None).iter().all(|k| k.state != "busy") {
        tokio::task::yield_now().await;
    }
    // A second cell queued behind it: cancelled too, so it ends interrupted without
    // running, and counts.
    let queued = spawn_cell("x = 2");
    while kb.list_kernels(None)[0].attached < 2 {
        tokio::task::yield_now().await;
    }
    assert_eq!(kb.interrupt(None, "s").await, 2);
    let first = running.await.expect("join").expect("execute");
    assert_eq!(first.status, CellStatus::Interrupted);
    let second = queued.await.expect("join").expect("execute");
    assert_eq!(second.status, CellStatus::Interrupted, "{second:?}");
    assert_eq!(second.kernel.execution_count, 0, "it never ran: {second:?}");
    assert_eq!(kb.interrupt(None, "s").await, 0, "nothing runs now");
    assert_eq!(
        fake.live_containers(),
        1,
        "the interrupted cell stopped: its kernel stays"
    );
    let next = run(&kb, "s", "x").await;
    assert!(
        next.kernel.reused && next.kernel.state_lost.is_none(),
        "{next:?}"
    );
    kb.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_cell_that_ignores_its_interrupt_is_killed_after_the_grace() {
    let (kb, fake) = start(|c| c.cells.interrupt_grace = Duration::from_secs(3)).await;
    run(&kb, "s", "x = 1").await;
    let stubborn = {
        let kb = kb.clone();
        tokio::spawn(async move {
            kb.execute(ExecuteRequest {
                timeout: Some(Duration::from_secs(600)),
                ..ExecuteRequest::new("s", "stubborn")
            })
            .await
        })
    };
    while kb.list_kernels(None).iter().all(|k| k.state != "busy") {
        tokio::task::yield_now().await;
    }
    let started = tokio::time::Instant::now();
    assert_eq!(kb.interrupt(None, "s").await, 1);
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "it waited the grace"
    );
    let r = stubborn.await.expect("join").expect("execute");
    assert_eq!(r.status, CellStatus::Interrupted);
    assert_eq!(
        r.error.as_deref(),
        Some(
            "Interrupted, but the cell did not stop within 3s of its KeyboardInterrupt; the \
             session kernel was killed and its state was lost."
        )
    );
    assert_eq!(fake.live_containers(), 0);
    let next = run(&kb, "s", "x").await;
    assert_eq!(
        next.kernel.state_lost.map(|l| l.reason),
        Some(crate::cell::LossReason::Killed)
    );
    kb.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn sys_exit_unregisters_and_a_missing_image_leaves_nothing() {
    let (kb, fake) = start(|_| {}).await;
    let done = run(&kb, "s", "exit").await;
    assert!(done.kernel.ended);
    assert!(kb.list_kernels(None).is_empty());
    assert_eq!(fake.live_containers(), 0);
    fake.images.lock().unwrap().push("other".into());
    let err = kb.execute(ExecuteRequest::new("s", "x")).await.unwrap_err();
    assert!(
        matches!(
            err,
            ExecuteError::Kernel(KernelError::Spawn(EngineError::ImageMissing { .. }))
        ),
        "{err}"
    );
    assert_eq!(
        fake.live_volumes(),
        0,
        "the volume of a failed spawn is removed"
    );
    assert!(kb.list_kernels(None).is_empty());
    kb.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_kernel_killed_from_outside_is_reported_on_the_next_call() {
    let (kb, fake) = start(|_| {}).await;
    let first = run(&kb, "s", "x = 1").await;
    let id = kb.kernel_for(None, "s", None).expect("kernel").id.clone();
    fake.kill_from_outside(&id);
    // Wait until the kernel's reader has seen its streams close.
    while kb.kernel_for(None, "s", None).is_some_and(|k| k.is_alive()) {
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    let next = run(&kb, "s", "x").await;
    assert_ne!(next.kernel.id, first.kernel.id);
    assert!(next.kernel.state_lost.is_some());
    assert_eq!(fake.live_volumes(), 1);
    kb.shutdown().await;
}

/// Real time: a flood never lets paused time advance, which is the point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cell_flooding_output_still_times_out() {
    let (kb, fake) = start(|_| {}).await;
    let r = kb
        .execute(ExecuteRequest {
            timeout: Some(Duration::from_millis(300)),
            ..ExecuteRequest::new("s", "flood")
        })
        .await
        .expect("execute");
    assert_eq!(r.status, CellStatus::Timeout);
    assert_eq!(r.stdout_truncated, Some(true));
    assert_eq!(fake.live_containers(), 0);
    kb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_that_stops_reading_cannot_block_a_timeout() {
    let (kb, fake) = start(|_| {}).await;
    run(&kb, "s", "deaf").await;
    // Far more code than the kernel's stdin buffer holds, to a kernel that never reads.
    let big = format!("x = 1\n#{}", "y".repeat(300_000));
    let r = kb
        .execute(ExecuteRequest {
            timeout: Some(Duration::from_millis(300)),
            ..ExecuteRequest::new("s", big)
        })
        .await
        .expect("execute");
    assert_eq!(r.status, CellStatus::Timeout);
    assert_eq!(fake.live_containers(), 0);
    kb.shutdown().await;
}

/// The file channel's directory is mounted into kernels only when the engine can mount it:
/// an engine that does not see it (on another host) refuses the first kernel made with it,
/// which is made again without it, as are the next ones.
#[tokio::test(start_paused = true)]
async fn kernels_get_the_file_channel_only_where_the_engine_can_mount_it() {
    let dir = std::env::temp_dir().join(format!("kb-probe-{}", std::process::id()));
    for unseen in [false, true] {
        let fake = FakeEngine::default();
        if unseen {
            fake.unseen_paths.lock().unwrap().push(dir.clone());
        }
        let mut config = Config::default();
        config.files.sockets = Some(dir.clone());
        let kb = Orchestrator::start(config, Arc::new(fake.clone()))
            .await
            .expect("start");
        for session in ["first", "second"] {
            assert_eq!(run(&kb, session, "x = 1").await.status, CellStatus::Success);
            let summary = kb.list_kernels(None);
            let id = &summary.iter().find(|k| k.session == session).unwrap().id;
            let mounted = fake.mounts_of(id).unwrap().iter().any(|m| {
                matches!(m, crate::docker::Mount::Bind { target, read_only: true, .. } if target == "/run/kernelbox")
            });
            assert_eq!(mounted, !unseen, "unseen: {unseen}, {session}");
        }
        kb.shutdown().await;
        assert_eq!(fake.live_containers(), 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(start_paused = true)]
async fn shutdown_refuses_new_work_and_leaves_nothing() {
    let (kb, fake) = start(|_| {}).await;
    run(&kb, "s", "x = 1").await;
    kb.shutdown().await;
    let err = kb.execute(ExecuteRequest::new("t", "x")).await.unwrap_err();
    assert!(matches!(err, ExecuteError::ShuttingDown), "{err}");
    assert_eq!(fake.live_containers(), 0);
    assert_eq!(fake.live_volumes(), 0);
}

async fn start_on(
    catalog: &Arc<crate::catalog::MemoryCatalog>,
    tweak: impl FnOnce(&mut Config),
) -> (Orchestrator, FakeEngine) {
    let fake = FakeEngine::default();
    let mut config = Config::default();
    tweak(&mut config);
    let kb = Orchestrator::start_with_catalog(
        config.validate().expect("valid config"),
        Arc::new(fake.clone()),
        Some(catalog.clone() as Arc<dyn Catalog>),
    )
    .await
    .expect("start");
    (kb, fake)
}

fn reason(r: &CellResult) -> Option<LossReason> {
    r.kernel.state_lost.as_ref().map(|l| l.reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_restart_reports_the_loss_once_and_generations_keep_counting() {
    let catalog = Arc::new(crate::catalog::MemoryCatalog::default());
    let (kb, _fake) = start_on(&catalog, |_| {}).await;
    assert_eq!(run(&kb, "s", "x = 1").await.kernel.generation, 1);
    run(&kb, "gone", "x = 1").await;
    assert_eq!(kb.clear_session(None, "gone").await, 1);
    kb.shutdown().await;

    let (kb, _fake) = start_on(&catalog, |_| {}).await;
    let first = run(&kb, "s", "x").await;
    assert_eq!(reason(&first), Some(LossReason::ServerRestarted));
    assert_eq!(first.kernel.generation, 2);
    let second = run(&kb, "s", "x").await;
    assert_eq!(reason(&second), None);
    assert_eq!(second.kernel.generation, 2);
    let cleared = run(&kb, "gone", "x").await;
    assert_eq!(reason(&cleared), None, "a cleared session lost nothing");
    assert_eq!(cleared.kernel.generation, 2);
    let fresh = run(&kb, "never", "x").await;
    assert_eq!(reason(&fresh), None);
    assert_eq!(fresh.kernel.generation, 1);
    assert_eq!(kb.stats().catalog_failures, 0);
    kb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_is_reported_and_unreported_losses_survive_restarts() {
    let catalog = Arc::new(crate::catalog::MemoryCatalog::default());
    let (kb, _fake) = start_on(&catalog, |c| c.kernels.max_session_kernels = 1).await;
    run(&kb, "evicted", "x = 1").await;
    run(&kb, "live", "x = 1").await;
    kb.sync_catalog().await;
    // The process dies here: no shutdown, the catalog still says `live` is running.
    let (kb2, _fake) = start_on(&catalog, |_| {}).await;
    let restarted = LossReason::ALL
        .iter()
        .position(|r| *r == LossReason::ServerRestarted)
        .expect("listed");
    assert_eq!(
        kb2.stats().losses[restarted],
        1,
        "the live kernel is counted lost when the restart finds it"
    );
    assert_eq!(
        reason(&run(&kb2, "live", "x").await),
        Some(LossReason::ServerRestarted)
    );
    kb2.shutdown().await;
    // Another restart: the eviction, never reported, is still owed.
    let (kb3, _fake) = start_on(&catalog, |_| {}).await;
    let back = run(&kb3, "evicted", "x").await;
    assert_eq!(reason(&back), Some(LossReason::Evicted));
    assert_eq!(back.kernel.generation, 2);
    let live = run(&kb3, "live", "x").await;
    assert_eq!(reason(&live), Some(LossReason::ServerRestarted));
    assert_eq!(live.kernel.generation, 3);
    kb3.shutdown().await;
    kb.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn bad_names_and_timeouts_are_refused_before_any_container() {
    let (kb, fake) = start(|_| {}).await;
    let err = kb
        .execute(ExecuteRequest::new("a b", "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, ExecuteError::Name(_)), "{err}");
    let err = kb
        .execute(ExecuteRequest {
            timeout: Some(Duration::from_secs(100_000)),
            ..ExecuteRequest::new("s", "x")
        })
        .await
        .unwrap_err();
    let ExecuteError::InvalidTimeout(invalid) = &err else {
        panic!("not the timeout error: {err}");
    };
    assert_eq!(
        invalid,
        &kb.config().invalid_timeout("100000.0"),
        "the same error as the HTTP edge's"
    );
    let err = kb
        .execute(ExecuteRequest {
            timeout: Some(Duration::ZERO),
            ..ExecuteRequest::new("s", "x")
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ExecuteError::InvalidTimeout(_)), "{err}");
    assert_eq!(fake.created(), 0);
    kb.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn the_admission_notice_hears_once_whether_a_call_got_its_kernel() {
    let (kb, _fake) = start(|c| c.kernels.max_session_kernels = 1).await;
    let (notice, admitted) = AdmissionNotice::new();
    let scope = Scope::session("s").tenant("acme").child("helper");
    let r = kb
        .execute_with_admission(ExecuteRequest::new(scope, "x = 1"), notice)
        .await
        .expect("execute");
    assert_eq!(r.status, CellStatus::Success);
    assert!(matches!(admitted.await, Ok(Ok(()))));
    assert_eq!(kb.list_kernels(Some("acme"))[0].owner, "s::child::helper");
    // A bad name fails before admission: the notice goes untold.
    let (notice, admitted) = AdmissionNotice::new();
    let err = kb
        .execute_with_admission(ExecuteRequest::new("a b", "x"), notice)
        .await
        .unwrap_err();
    assert!(matches!(err, ExecuteError::Name(_)), "{err}");
    assert!(admitted.await.is_err());
    kb.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_kernel_computing_with_no_cell_is_busy_never_reaped_or_evicted_as_idle() {
    // The fake engine has no cgroups: the runaway watch leaves its kernels alone, and the
    // test sets what the watch would have found.
    let (kb, _fake) = start(|c| {
        c.kernels.max_session_kernels = 1;
        c.kernels.idle_timeout = Duration::from_secs(60);
    })
    .await;
    run(&kb, "a", "x = 1").await;
    let kernel = kb.kernel_for(None, "a", None).expect("a's kernel");
    kernel.set_computing(true);
    assert_eq!(kb.list_kernels(None)[0].state, "busy");
    // At the host's cap the computing kernel is not evicted for another session: refused.
    let refused = kb.execute(ExecuteRequest::new("b", "x = 1")).await;
    assert!(
        matches!(refused, Err(ExecuteError::AtCapacity { .. })),
        "{refused:?}"
    );
    // Past the idle timeout it is not reaped either.
    tokio::time::advance(Duration::from_secs(120)).await;
    assert_eq!(kb.reap_once().await, 0);
    // Quiet again: idle, reaped like any other.
    kernel.set_computing(false);
    assert_eq!(kb.list_kernels(None)[0].state, "idle");
    assert_eq!(kb.reap_once().await, 1);
    kb.shutdown().await;
}

#[tokio::test]
async fn snapshots_being_made_count_against_the_tenants_bytes_in_one_step() {
    use crate::services::SnapshotError;
    let dir = tempfile::tempdir().expect("tempdir");
    let (kb, _) = start(|c| {
        c.snapshots.dir = Some(dir.path().to_path_buf());
        c.snapshots.max_tenant_bytes = 3 << 20;
    })
    .await;
    let service = &kb.inner.services.snapshots;
    // Three snapshots of 1.5 MB being made at once: each counted as it is held, so the third
    // passes the bound with the two others not yet kept.
    let mut making = Vec::new();
    for _ in 0..3 {
        let r = service.reserve("t").await.expect("reserve");
        std::fs::write(r.dir.join("memory"), vec![0u8; 1536 << 10]).expect("write");
        making.push(r);
    }
    let mut held = Vec::new();
    let mut refused = 0;
    for mut r in making {
        match service.hold(&mut r).await {
            Ok(_) => held.push(r),
            Err(SnapshotError::Limit { .. }) => {
                refused += 1;
                service.abort(r).await;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!((held.len(), refused), (2, 1));
    assert_eq!(service.room("t"), 0);
    // Given back, their bytes are free again.
    for r in held {
        service.abort(r).await;
    }
    assert_eq!(service.room("t"), 3 << 20);
    kb.shutdown().await;
}
