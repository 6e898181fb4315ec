//! The warm pool against the in-memory fake engine, in paused time.

use std::collections::HashSet;

use super::*;
use crate::docker::fake::FakeEngine;
use crate::docker::Engine;

async fn start(size: usize, max: usize) -> (Orchestrator, FakeEngine) {
    let fake = FakeEngine::default();
    let mut config = Config::default();
    config.pool.size = size;
    config.kernels.max_session_kernels = max;
    let kb = Orchestrator::start(config, Arc::new(fake.clone()))
        .await
        .expect("start");
    (kb, fake)
}

async fn run(kb: &Orchestrator, session: &str, code: &str) -> crate::cell::CellResult {
    kb.execute(super::ExecuteRequest::new(session, code))
        .await
        .expect("execute")
}

#[tokio::test(start_paused = true)]
async fn new_owners_take_distinct_pooled_kernels_and_the_pool_refills() {
    let (kb, fake) = start(2, 8).await;
    assert!(kb.wait_pool_ready(2, Duration::from_secs(5)).await);
    assert_eq!(fake.created(), 2);
    let a = run(&kb, "a", "x = 1").await;
    let b = run(&kb, "b", "x = 1").await;
    for r in [&a, &b] {
        assert!(!r.kernel.reused);
        assert_eq!(r.kernel.execution_count, 1);
        assert_eq!(r.kernel.generation, 1);
    }
    assert_ne!(a.kernel.id, b.kernel.id);
    assert_eq!(kb.stats().pool.hits, 2);
    // Both were taken: the pool refills to its size in the background.
    assert!(kb.wait_pool_ready(2, Duration::from_secs(5)).await);
    assert_eq!(fake.created(), 4);
    // A kernel is never returned: a cleared owner's next kernel is another pooled one.
    kb.clear_session(None, "a").await;
    let again = run(&kb, "a", "x = 1").await;
    assert!(!again.kernel.reused);
    let ids: HashSet<String> = [&a, &b, &again]
        .iter()
        .map(|r| r.kernel.id.clone())
        .collect();
    assert_eq!(ids.len(), 3);
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
    assert_eq!(fake.live_volumes(), 0);
}

#[tokio::test(start_paused = true)]
async fn pooled_kernels_count_toward_the_host_cap_and_never_evict_an_owner() {
    let (kb, fake) = start(2, 3).await;
    assert!(kb.wait_pool_ready(2, Duration::from_secs(5)).await);
    run(&kb, "a", "x = 1").await;
    // One owner and one pooled kernel fill two of three; the refill takes the last place.
    assert!(kb.wait_pool_ready(2, Duration::from_secs(5)).await);
    run(&kb, "b", "x = 1").await;
    run(&kb, "c", "x = 1").await;
    // Three owners fill the cap: no pooled kernel, none evicted.
    assert_eq!(kb.pool_ready(), 0);
    assert_eq!(kb.list_kernels(None).len(), 3);
    assert_eq!(fake.live_containers(), 3);
    kb.clear_session(None, "a").await;
    // Room again: the pool takes it back within its check interval.
    assert!(kb.wait_pool_ready(1, Duration::from_secs(10)).await);
    assert_eq!(fake.live_containers(), 3);
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
}

#[tokio::test(start_paused = true)]
async fn pooled_kernels_past_their_maximum_age_are_replaced() {
    let fake = FakeEngine::default();
    let mut config = Config::default();
    config.pool.size = 1;
    config.pool.max_age = Duration::from_secs(60);
    let kb = Orchestrator::start(config, Arc::new(fake.clone()))
        .await
        .expect("start");
    assert!(kb.wait_pool_ready(1, Duration::from_secs(5)).await);
    assert_eq!(fake.created(), 1);
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert!(kb.wait_pool_ready(1, Duration::from_secs(5)).await);
    assert_eq!(fake.created(), 2);
    assert_eq!(fake.live_containers(), 1);
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
    assert_eq!(fake.live_volumes(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_refill_starts_once_new_owners_stop_arriving() {
    let (kb, fake) = start(2, 8).await;
    assert!(kb.wait_pool_ready(2, Duration::from_secs(5)).await);
    assert_eq!(fake.live_volumes(), 2);
    run(&kb, "a", "x = 1").await;
    run(&kb, "b", "x = 1").await;
    // Right after the takes the refill has not begun (its first step makes a volume), so a
    // miss arriving now would have the engine to itself...
    tokio::time::sleep(super::pool::REFILL_SETTLE / 2).await;
    assert_eq!(
        fake.live_volumes(),
        2,
        "the refill began within the settle time"
    );
    // ...and once new owners stopped arriving, the pool refills.
    assert!(kb.wait_pool_ready(2, Duration::from_secs(5)).await);
    assert_eq!(fake.live_volumes(), 4);
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
    assert_eq!(fake.live_volumes(), 0);
}

/// Names of the containers that carry an owner's name (`labels::owner_name`).
async fn owner_named(fake: &FakeEngine) -> usize {
    fake.list_containers(&[])
        .await
        .expect("list")
        .iter()
        .filter(|c| c.name.starts_with(crate::labels::OWNER_NAME_PREFIX))
        .count()
}

#[tokio::test(start_paused = true)]
async fn a_taken_kernel_is_named_once_no_new_owner_is_starting_cold() {
    let (kb, fake) = start(1, 8).await;
    assert!(kb.wait_pool_ready(1, Duration::from_secs(5)).await);
    // Owner a takes the pooled kernel with a first cell that does not end.
    let a = {
        let kb = kb.clone();
        tokio::spawn(async move { kb.execute(super::ExecuteRequest::new("a", "sleep")).await })
    };
    while kb.stats().pool.hits == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Owner c finds the pool empty and starts cold, for a second.
    *fake.create_delay.lock().unwrap() = Duration::from_secs(1);
    let c = {
        let kb = kb.clone();
        tokio::spawn(async move { kb.execute(super::ExecuteRequest::new("c", "x = 1")).await })
    };
    // Past the wait for a's first cell (TAKE_SETTLE), a's kernel is still not renamed...
    tokio::time::sleep(super::pool::TAKE_SETTLE * 2).await;
    assert_eq!(owner_named(&fake).await, 0, "renamed during a cold start");
    // ...until c's cold start is over.
    c.await.expect("join").expect("c");
    *fake.create_delay.lock().unwrap() = Duration::ZERO;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(owner_named(&fake).await, 1);
    kb.clear_session(None, "a").await;
    let _ = a.await;
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_taken_kernel_is_named_in_a_gap_between_its_owners_cells() {
    let (kb, fake) = start(1, 8).await;
    assert!(kb.wait_pool_ready(1, Duration::from_secs(5)).await);
    // Owner a takes the pooled kernel and runs cells every 10 ms for a second: never a gap
    // long enough, so the rename waits...
    let began = tokio::time::Instant::now();
    while began.elapsed() < Duration::from_secs(1) {
        run(&kb, "a", "x = 1").await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(kb.stats().pool.hits, 1);
    assert_eq!(
        owner_named(&fake).await,
        0,
        "renamed between back-to-back cells"
    );
    // ...until a pause.
    tokio::time::sleep(super::pool::RENAME_QUIET * 3).await;
    assert_eq!(owner_named(&fake).await, 1, "not renamed in a pause");
    // An owner that never pauses is named all the same, 2 s after the take at most.
    run(&kb, "b", "x = 1").await;
    let began = tokio::time::Instant::now();
    while began.elapsed() < Duration::from_millis(2300) {
        run(&kb, "b", "x = 1").await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(kb.stats().pool.hits, 2);
    assert_eq!(
        owner_named(&fake).await,
        2,
        "never named while cells kept coming"
    );
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_taken_kernel_is_never_removed_while_it_is_being_renamed() {
    let (kb, fake) = start(1, 8).await;
    assert!(kb.wait_pool_ready(1, Duration::from_secs(5)).await);
    *fake.rename_delay.lock().unwrap() = Duration::from_secs(1);
    run(&kb, "a", "x = 1").await;
    // The rename begins in the first gap after the first cell and takes a second...
    tokio::time::sleep(super::pool::RENAME_QUIET * 2).await;
    assert_eq!(fake.renames(), 1, "no rename under way");
    // ...and the owner's session is cleared meanwhile: the removal waits for it.
    assert_eq!(kb.clear_session(None, "a").await, 1);
    assert_eq!(fake.rename_removal_overlaps(), 0, "removed while renamed");
    assert_eq!(fake.live_containers(), 1, "the pool's next kernel only");
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_taken_kernel_whose_container_exited_is_not_renamed() {
    let (kb, fake) = start(1, 8).await;
    assert!(kb.wait_pool_ready(1, Duration::from_secs(5)).await);
    let a = run(&kb, "a", "x = 1").await;
    // The container goes (as when its process exits and the engine auto-removes it) before
    // the rename's gap is over; while the kernel finds out why (seconds, with no engine
    // event), nothing renames it.
    let id = fake
        .list_containers(&[])
        .await
        .expect("list")
        .into_iter()
        .map(|c| c.id)
        .find(|id| id.starts_with(&a.kernel.id))
        .expect("the taken kernel");
    fake.kill_from_outside(&id);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(fake.renames(), 0, "renamed after its container exited");
    kb.shutdown().await;
    assert_eq!(fake.live_containers(), 0);
}
