//! The registry against the real engine: owners, single flight, LRU, pinning, idle reaping,
//! state-loss reporting, sweeps. Every claim is checked through the Docker API as well.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{Case, CASE};
use futures::StreamExt;
use kernelbox::{CellStatus, ExecuteRequest, LossReason, Scope};

fn turn(session: &str, code: &str, task: &str) -> ExecuteRequest {
    ExecuteRequest {
        task_id: Some(task.into()),
        ..ExecuteRequest::new(session, code)
    }
}

fn child(session: &str, child: &str, code: &str) -> ExecuteRequest {
    ExecuteRequest {
        task_id: Some(format!("{child}-task")),
        ..ExecuteRequest::new(Scope::session(session).child(child), code)
    }
}

#[tokio::test]
async fn state_survives_across_turns_of_one_conversation() {
    let case = Case::new("turns").await;
    let first = case.exec(turn("conv-a", "x = 41", "turn-1")).await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    let second = case.exec(turn("conv-a", "print(x + 1)", "turn-2")).await;
    assert!(second.output.contains("42"), "{second:?}");
    assert!(second.kernel.reused);
    case.finish().await;
}

#[tokio::test]
async fn sessions_are_isolated_from_each_other() {
    let case = Case::new("isolated").await;
    case.exec(turn("conv-a", "x = 41", "turn-1")).await;
    let other = case.exec(turn("conv-b", "print(x + 1)", "turn-1")).await;
    assert_eq!(other.status, CellStatus::Error);
    assert!(other.error.unwrap_or_default().contains("NameError"));
    assert_eq!(case.containers().await.len(), 2);
    case.finish().await;
}

#[tokio::test]
async fn delegated_children_get_their_own_kernels() {
    let case = Case::new("children").await;
    case.exec(turn("conv-a", "parent_secret = 'p'", "turn-1"))
        .await;
    let leak = case
        .exec(child(
            "conv-a",
            "child-1",
            "print(globals().get('parent_secret', 'ISOLATED'))",
        ))
        .await;
    case.exec(child("conv-a", "child-1", "child_secret = 'c'"))
        .await;
    let back = case
        .exec(turn(
            "conv-a",
            "print(globals().get('child_secret', 'ISOLATED'))",
            "turn-2",
        ))
        .await;
    assert!(leak.output.contains("ISOLATED"), "{leak:?}");
    assert!(back.output.contains("ISOLATED"), "{back:?}");
    let owners: BTreeSet<String> = case
        .containers()
        .await
        .iter()
        .map(|c| c.labels["io.kernelbox.owner"].clone())
        .collect();
    assert_eq!(
        owners,
        BTreeSet::from(["conv-a".to_string(), "conv-a::child::child-1".to_string()])
    );
    case.finish().await;
}

#[tokio::test]
async fn two_delegated_children_are_isolated_from_each_other() {
    let case = Case::new("siblings").await;
    case.exec(child("conv-a", "child-A", "sibling_secret = 'A'"))
        .await;
    let peek = case
        .exec(child(
            "conv-a",
            "child-B",
            "print(globals().get('sibling_secret', 'ISOLATED'))",
        ))
        .await;
    assert!(peek.output.contains("ISOLATED"), "{peek:?}");
    case.finish().await;
}

#[tokio::test]
async fn live_children_keep_their_kernels_past_the_lru_cap() {
    let case = Case::with("pinned", |c| c.kernels.max_session_kernels = 2).await;
    // Sessions fill the host's cap; live children are pinned past it, in a pool of their own
    // as large as the cap.
    for s in ["s0", "s1"] {
        assert_eq!(case.run(s, "x = 1").await.status, CellStatus::Success);
    }
    for i in 0..2 {
        let r = case
            .exec(child("conv", &format!("child-{i}"), &format!("v = {i}")))
            .await;
        assert_eq!(r.status, CellStatus::Success, "{r:?}");
    }
    let refused = case.kb.execute(child("conv", "child-2", "v = 2")).await;
    assert!(
        matches!(
            refused,
            Err(kernelbox::ExecuteError::AtCapacity {
                cap: kernelbox::Cap::Children { max: 2 },
                ..
            })
        ),
        "{refused:?}"
    );
    for i in 0..2 {
        let r = case
            .exec(child("conv", &format!("child-{i}"), "print(v)"))
            .await;
        assert_eq!(r.status, CellStatus::Success, "{r:?}");
        assert!(r.kernel.reused, "{r:?}");
        assert!(r.output.contains(&i.to_string()));
    }
    assert_eq!(case.containers().await.len(), 4);
    case.finish().await;
}

#[tokio::test]
async fn finished_children_release_their_kernels() {
    let case = Case::new("release").await;
    let done = case.exec(child("conv", "child-done", "v = 1")).await;
    let live = case.exec(child("conv", "child-live", "v = 2")).await;
    assert_eq!(case.kb.release_child(None, "conv", "child-done").await, 1);
    let ids = case.container_ids().await;
    assert!(
        !ids.contains(&done.kernel.id),
        "released child's container is gone: {ids:?}"
    );
    assert!(ids.contains(&live.kernel.id), "the sibling's is untouched");
    assert_eq!(
        case.volumes().await.len(),
        1,
        "the released child's volume is gone too"
    );
    let still = case.exec(child("conv", "child-live", "print(v)")).await;
    assert!(still.output.contains('2'));
    case.finish().await;
}

#[tokio::test]
async fn session_clear_disposes_the_owners_kernels() {
    let case = Case::new("clear").await;
    case.exec(turn("conv-a", "x = 41", "turn-1")).await;
    case.exec(turn("conv-other", "y = 1", "turn-1")).await;
    assert_eq!(case.kb.clear_session(None, "conv-a").await, 1);
    let owners: Vec<String> = case
        .containers()
        .await
        .iter()
        .map(|c| c.labels["io.kernelbox.owner"].clone())
        .collect();
    assert_eq!(owners, vec!["conv-other".to_string()]);
    let after = case
        .exec(turn("conv-a", "print('x' in dir())", "turn-2"))
        .await;
    assert_eq!(after.status, CellStatus::Success, "{after:?}");
    assert!(after.output.contains("False"));
    assert!(!after.kernel.reused);
    assert!(
        after.kernel.state_lost.is_none(),
        "a clear is not an involuntary loss"
    );
    case.finish().await;
}

#[tokio::test]
async fn live_kernels_are_capped_lru_across_owners() {
    let case = Case::with("lru", |c| c.kernels.max_session_kernels = 2).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        let r = case.exec(turn(&format!("conv-{i}"), "x = 1", "t")).await;
        ids.push(r.kernel.id.clone());
    }
    let live: BTreeSet<String> = case
        .kb
        .list_kernels(None)
        .into_iter()
        .map(|k| k.owner)
        .collect();
    assert_eq!(
        live,
        BTreeSet::from(["conv-2".to_string(), "conv-3".to_string()])
    );
    // Evicted kernels are really removed, containers and volumes.
    let in_docker: BTreeSet<String> = case.container_ids().await.into_iter().collect();
    assert_eq!(in_docker, BTreeSet::from([ids[2].clone(), ids[3].clone()]));
    assert_eq!(case.volumes().await.len(), 2);
    let back = case.exec(turn("conv-0", "print('x' in dir())", "t")).await;
    assert_eq!(
        back.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::Evicted)
    );
    assert_eq!(back.kernel.generation, 2);
    case.finish().await;
}

#[tokio::test]
async fn idle_kernels_are_reaped_by_another_owners_call() {
    let case = Case::with("idle", |c| {
        c.kernels.idle_timeout = Duration::from_millis(300)
    })
    .await;
    let stale = case.exec(turn("conv-a", "x = 41", "turn-1")).await;
    // The subject of this test is elapsed time: let the idle timeout pass.
    tokio::time::sleep(Duration::from_millis(400)).await;
    case.exec(turn("conv-b", "y = 1", "turn-2")).await;
    let ids = case.container_ids().await;
    assert!(!ids.contains(&stale.kernel.id), "{ids:?}");
    let owners: Vec<String> = case
        .kb
        .list_kernels(None)
        .into_iter()
        .map(|k| k.owner)
        .collect();
    assert_eq!(owners, vec!["conv-b".to_string()]);
    let back = case
        .exec(turn("conv-a", "print('x' in dir())", "turn-3"))
        .await;
    assert_eq!(
        back.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::IdleReaped)
    );
    assert!(back.output.contains("False"));
    case.finish().await;
}

#[tokio::test]
async fn reap_once_sweeps_idle_kernels_without_a_new_acquire() {
    let case = Case::with("reaponce", |c| {
        c.kernels.idle_timeout = Duration::from_millis(300)
    })
    .await;
    case.exec(turn("conv-a", "x = 41", "turn-1")).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(case.kb.reap_once().await, 1);
    assert!(case.kb.list_kernels(None).is_empty());
    assert!(case.containers().await.is_empty());
    assert!(case.volumes().await.is_empty());
    case.finish().await;
}

#[tokio::test]
async fn reap_once_spares_attached_and_fresh_kernels() {
    let case = Case::with("spare", |c| {
        c.kernels.idle_timeout = Duration::from_millis(300)
    })
    .await;
    // A cell in flight: it has written its first line when start_cell returns.
    let busy = common::start_cell(
        &case.kb,
        "busy",
        "import time\nprint('go', flush=True)\ntime.sleep(1.5)\nprint('done')",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    case.exec(turn("fresh", "x = 1", "t")).await;
    assert_eq!(
        case.kb.reap_once().await,
        0,
        "attached and fresh kernels survive"
    );
    assert_eq!(case.containers().await.len(), 2);
    let busy = busy.await.expect("join").expect("execute");
    assert!(busy.output.contains("done"), "{busy:?}");
    case.finish().await;
}

#[tokio::test]
async fn parallel_cells_share_one_kernel_process() {
    let case = Case::new("single-flight").await;
    let since = kernelbox::clock::unix_now() as i64 - 1;
    let runs = (0..6).map(|_| case.run("conv-a", "import time; time.sleep(0.3)"));
    let results = futures::future::join_all(runs).await;
    assert!(
        results.iter().all(|r| r.status == CellStatus::Success),
        "{results:?}"
    );
    let ids: BTreeSet<&str> = results.iter().map(|r| r.kernel.id.as_str()).collect();
    assert_eq!(ids.len(), 1);
    let mut counts: Vec<u64> = results.iter().map(|r| r.kernel.execution_count).collect();
    counts.sort();
    assert_eq!(counts, vec![1, 2, 3, 4, 5, 6], "cells ran one at a time");
    assert_eq!(case.kb.list_kernels(None).len(), 1);
    assert_eq!(
        case.containers().await.len(),
        1,
        "no unowned container runs beside it"
    );
    case.kb.shutdown().await;
    // Exactly one container was ever created for the key: replay its create events.
    let mut events = case
        .engine
        .events(&[format!("{CASE}={}", case.label)], Some(since));
    let mut created = 0;
    while let Ok(Some(Ok(event))) =
        tokio::time::timeout(Duration::from_secs(10), events.next()).await
    {
        match event.action.as_str() {
            "create" => created += 1,
            "destroy" => break,
            _ => {}
        }
    }
    assert_eq!(created, 1);
    common::assert_clean(&case.engine, &case.label).await;
}

#[tokio::test]
async fn state_lost_is_reported_after_a_removal_from_outside() {
    let case = Case::new("outside").await;
    let first = case.run("s", "x = 1").await;
    let full = case.containers().await.remove(0).id;
    case.engine
        .remove_container(&full)
        .await
        .expect("docker rm -f");
    let next = case.run("s", "print('x' in dir())").await;
    assert_eq!(next.status, CellStatus::Success, "{next:?}");
    assert!(next.output.contains("False"));
    assert_ne!(next.kernel.id, first.kernel.id);
    assert_eq!(
        next.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::Killed)
    );
    assert_eq!(next.kernel.generation, 2);
    assert_eq!(
        case.volumes().await.len(),
        1,
        "the lost kernel's volume was removed"
    );
    case.finish().await;
}

#[tokio::test]
async fn week_old_staging_volumes_go_and_fresh_ones_stay() {
    let case = Case::new("staging").await;
    let now = kernelbox::clock::unix_now();
    let base = BTreeMap::from([
        (CASE.to_string(), case.label.clone()),
        (
            "io.kernelbox.managed-by".to_string(),
            "kernelbox".to_string(),
        ),
        ("io.kernelbox.role".to_string(), "staging".to_string()),
        (
            "io.kernelbox.instance".to_string(),
            case.kb.instance_id().to_string(),
        ),
    ]);
    let mut old = base.clone();
    old.insert(
        "io.kernelbox.created-at".into(),
        (now - 8 * 86400).to_string(),
    );
    let mut young = base.clone();
    young.insert("io.kernelbox.created-at".into(), now.to_string());
    let bystander = BTreeMap::from([(CASE.to_string(), case.label.clone())]);
    let names = [
        (format!("{}-old", case.label), old),
        (format!("{}-young", case.label), young),
        (format!("{}-bystander", case.label), bystander),
    ];
    for (name, labels) in &names {
        case.engine
            .create_volume(name, labels, None)
            .await
            .expect("create volume");
    }
    // The sweep `kernelbox sweep` runs, restricted to this case's label so that it neither
    // touches nor counts any other volume on the engine.
    let max_age = kernelbox::Config::default().housekeeping.staging_max_age;
    let mine = [format!("{CASE}={}", case.label)];
    let would =
        kernelbox::instance::sweep::sweep_stale_staging(case.engine.as_ref(), max_age, &mine, true)
            .await
            .expect("dry run");
    assert_eq!(
        would,
        vec![names[0].0.clone()],
        "a dry run reports the old one"
    );
    assert_eq!(case.volumes().await.len(), 3, "a dry run removes nothing");
    let removed = kernelbox::instance::sweep::sweep_stale_staging(
        case.engine.as_ref(),
        max_age,
        &mine,
        false,
    )
    .await
    .expect("sweep");
    assert_eq!(removed, vec![names[0].0.clone()]);
    let left: BTreeSet<String> = case.volumes().await.into_iter().map(|v| v.name).collect();
    assert_eq!(
        left,
        BTreeSet::from([names[1].0.clone(), names[2].0.clone()])
    );
    for (name, _) in &names[1..] {
        case.engine.remove_volume(name).await.expect("cleanup");
    }
    case.finish().await;
}

#[tokio::test]
async fn a_startup_sweep_removes_dead_instances_leftovers_only() {
    let label = common::unique("startup");
    let engine = common::engine().await;
    // A live instance with a kernel.
    let live = kernelbox::Orchestrator::start(common::config(&label), engine.clone())
        .await
        .expect("start");
    let r = live
        .execute(ExecuteRequest::new("s", "x = 1"))
        .await
        .expect("execute");
    // A dead instance's leftover: a created container and a volume labelled with a pid that
    // no longer runs.
    let me = kernelbox::instance::Instance::current();
    let dead = kernelbox::instance::Instance {
        id: "dead-instance".into(),
        pid: u32::MAX - 1,
        ..me
    };
    let mut labels = dead.labels(&BTreeMap::from([(CASE.to_string(), label.clone())]));
    labels.insert("io.kernelbox.role".into(), "staging".into());
    labels.insert(
        "io.kernelbox.created-at".into(),
        kernelbox::clock::unix_now().to_string(),
    );
    let dead_volume = format!("{label}-dead");
    engine
        .create_volume(&dead_volume, &labels, None)
        .await
        .expect("volume");
    let spec = kernelbox::docker::ContainerSpec {
        image: kernelbox::config::DEFAULT_IMAGE.into(),
        cmd: vec!["python3".into(), "-c".into(), "pass".into()],
        env: vec![],
        user: "10000:10000".into(),
        working_dir: "/".into(),
        labels: labels.clone(),
        mounts: vec![],
        sandbox: kernelbox::Sandbox::default(),
    };
    let dead_container = engine.create_container(&spec).await.expect("container");
    // A bystander without kernelbox's labels.
    let mut bystander = spec.clone();
    bystander.labels = BTreeMap::from([(CASE.to_string(), label.clone())]);
    let bystander_id = engine
        .create_container(&bystander)
        .await
        .expect("bystander");

    let second = kernelbox::Orchestrator::start(common::config(&label), engine.clone())
        .await
        .expect("second instance sweeps at start");
    let ids: BTreeSet<String> = common::containers(&engine, &label)
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert!(
        !ids.contains(&dead_container),
        "the dead instance's container was swept"
    );
    assert!(ids.contains(&bystander_id), "the bystander survives");
    assert!(
        ids.iter().any(|id| id.starts_with(&r.kernel.id)),
        "the live instance's kernel survives"
    );
    let vols: Vec<String> = common::volumes(&engine, &label)
        .await
        .into_iter()
        .map(|v| v.name)
        .collect();
    assert!(!vols.contains(&dead_volume));
    let again = live
        .execute(ExecuteRequest::new("s", "print(x)"))
        .await
        .expect("execute");
    assert!(
        again.kernel.reused && again.output.contains('1'),
        "{again:?}"
    );
    engine
        .remove_container(&bystander_id)
        .await
        .expect("cleanup");
    second.shutdown().await;
    live.shutdown().await;
    common::assert_clean(&engine, &label).await;
}

#[tokio::test]
async fn stress_many_first_calls_over_few_owners_respect_the_cap() {
    let case = Case::with("stress", |c| c.kernels.max_session_kernels = 4).await;
    let runs = (0..50).map(|i| {
        let session = format!("owner-{}", i % 10);
        let kb = case.kb.clone();
        async move {
            kb.execute(ExecuteRequest::new(session, format!("v = {i}\nprint(v)")))
                .await
        }
    });
    let results = futures::future::join_all(runs).await;
    // The cap is hard at admission: a call that needs a new kernel while every kernel is
    // busy is refused rather than overflowing it.
    let mut ran = 0;
    for r in &results {
        match r {
            Ok(r) => {
                assert_eq!(r.status, CellStatus::Success, "{r:?}");
                ran += 1;
            }
            Err(kernelbox::ExecuteError::AtCapacity {
                cap: kernelbox::Cap::Host { max: 4, .. },
                ..
            }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert!(ran >= 4, "{results:?}");
    // With nothing attached any more, the cap holds in Docker too.
    assert!(case.kb.list_kernels(None).len() <= 4);
    assert!(
        case.containers().await.len() <= 4,
        "{:?}",
        case.containers().await
    );
    case.finish().await;
}

#[tokio::test]
async fn the_reaper_sweeps_dead_instances_old_staging_volumes_only() {
    let case = Case::new("reapdead").await;
    let now = kernelbox::clock::unix_now();
    let me = kernelbox::instance::Instance::current();
    let dead = kernelbox::instance::Instance {
        id: format!("{}-dead", case.label),
        pid: u32::MAX - 1,
        ..me.clone()
    };
    // Another live instance: this very process under another id.
    let live = kernelbox::instance::Instance {
        id: format!("{}-live", case.label),
        ..me
    };
    let staging = |owner: &kernelbox::instance::Instance, created: u64| {
        let mut labels = owner.labels(&BTreeMap::from([(CASE.to_string(), case.label.clone())]));
        labels.insert("io.kernelbox.role".into(), "staging".into());
        labels.insert("io.kernelbox.created-at".into(), created.to_string());
        labels
    };
    let mut own = staging(&live, now);
    own.insert(
        "io.kernelbox.instance".into(),
        case.kb.instance_id().to_string(),
    );
    let week_ago = now - 8 * 86400;
    // (A young volume of a dead instance would be fair game for any orchestrator starting
    // meanwhile on this engine; the age rule for those is covered by the sweep's unit test.)
    let names = [
        (format!("{}-dead-old", case.label), staging(&dead, week_ago)),
        (format!("{}-live-old", case.label), staging(&live, week_ago)),
        (format!("{}-own-young", case.label), own),
    ];
    for (name, labels) in &names {
        case.engine
            .create_volume(name, labels, None)
            .await
            .expect("create volume");
    }
    case.kb.reap_once().await;
    let left: BTreeSet<String> = case.volumes().await.into_iter().map(|v| v.name).collect();
    assert_eq!(
        left,
        BTreeSet::from([names[1].0.clone(), names[2].0.clone()]),
        "only the dead instance's old volume goes"
    );
    for (name, _) in &names[1..] {
        case.engine.remove_volume(name).await.expect("cleanup");
    }
    case.finish().await;
}

#[tokio::test]
async fn interrupt_counts_every_cell_that_ended_interrupted_the_queued_one_included() {
    let case = Case::new("intqueue").await;
    case.run("s", "x = 1").await;
    let first = common::start_cell(
        &case.kb,
        "s",
        "print('started', flush=True)\nimport time\ntime.sleep(60)",
    )
    .await;
    let queued = {
        let kb = case.kb.clone();
        tokio::spawn(async move { kb.execute(ExecuteRequest::new("s", "x = 2")).await })
    };
    while case.kb.list_kernels(None)[0].attached < 2 {
        tokio::task::yield_now().await;
    }
    let n = case.kb.interrupt(None, "s").await;
    let results = [
        first.await.unwrap().expect("execute"),
        queued.await.unwrap().expect("execute"),
    ];
    // The running cell is killed; the queued one ends at once without running.
    assert_eq!(results[0].status, CellStatus::Interrupted, "{results:?}");
    assert_eq!(results[0].error.as_deref(), Some(common::INTERRUPTED));
    assert_eq!(results[1].status, CellStatus::Interrupted, "{results:?}");
    assert_eq!(
        results[1].error.as_deref(),
        Some(common::INTERRUPTED_QUEUED)
    );
    assert_eq!(results[1].kernel.execution_count, 0, "{results:?}");
    for r in &results {
        assert_eq!(r.exit_code, -1, "{r:?}");
    }
    assert_eq!(n, 2, "{results:?}");
    assert_eq!(case.kb.interrupt(None, "s").await, 0, "nothing runs now");
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupt_racing_a_short_cell_reports_what_the_cell_did() {
    use rand::Rng;
    const CELL: &str = "sum(range(300000))";
    let case = Case::new("intrace").await;
    let mut counted = [0usize; 2];
    for i in 0..60 {
        // A warm kernel (the last interrupt killed it), and how long the cell takes on it:
        // the interrupt lands at a random point up to twice that after the cell is sent.
        let warm = case.run("s", CELL).await;
        let spread = (2.0 * warm.duration_seconds * 1e6) as u64 + 1;
        let kb = case.kb.clone();
        let cell = tokio::spawn(async move { kb.execute(ExecuteRequest::new("s", CELL)).await });
        let jitter = rand::rng().random_range(0..spread);
        tokio::time::sleep(Duration::from_micros(jitter)).await;
        let n = case.kb.interrupt(None, "s").await;
        let r = cell.await.unwrap().expect("execute");
        match r.status {
            CellStatus::Interrupted => {
                assert_eq!(n, 1, "run {i}: the cell was interrupted: {r:?}");
                // Interrupted while it ran, or before it ran: the interrupt landed while the
                // cell still waited its turn behind the previous call's last steps, and the
                // result says it never executed.
                let error = r.error.as_deref();
                assert!(
                    error == Some(common::INTERRUPTED)
                        || (error == Some(common::INTERRUPTED_QUEUED)
                            && r.kernel.execution_count == 0),
                    "run {i}: {r:?}"
                );
                counted[0] += 1;
            }
            _ => {
                assert_eq!(r.status, CellStatus::Success, "run {i}: {r:?}");
                assert_eq!(n, 0, "run {i}: the cell succeeded: {r:?}");
                counted[1] += 1;
            }
        }
    }
    eprintln!("interrupted {}, succeeded {}", counted[0], counted[1]);
    case.finish().await;
}
