//! Work that runs on the caller's task and survives the caller: [`run_adopted`].
//!
//! A cell must finish (or time out) even when the caller stops waiting, or the kernel would be
//! left mid-cell. Spawning every call achieves that but costs two cross-thread wake-ups per
//! call on a multi-threaded runtime (tens of microseconds against a ~0.3 ms warm cell). Instead
//! the caller drives the work itself, and only if the caller's future is dropped before the
//! work is done does the rest of the work move to a task of the tracker.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::FutureExt;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

type Work<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Runs `work` to completion on the calling task; if the caller goes away first, the rest of
/// it runs as a task of `tracker`, on the runtime current when this was called. Like any
/// future, the work makes progress only while the caller polls it (or after it is dropped).
/// The work counts as one of the tracker's tasks throughout, so `tracker.wait()` waits for
/// it. A panic in `work` is returned as `Err(message)`.
pub async fn run_adopted<T: Send + 'static>(
    tracker: &TaskTracker,
    work: impl Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    Adopted {
        work: Some(Box::pin(AssertUnwindSafe(work).catch_unwind().map(|r| {
            r.map_err(|panic| {
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panicked".to_string())
            })
        }))),
        tracker: tracker.clone(),
        token: Some(tracker.token()),
        // Taken now: the caller's future may be dropped on a thread with no runtime.
        runtime: tokio::runtime::Handle::try_current().ok(),
    }
    .await
}

/// The work while the caller drives it.
struct Adopted<T: Send + 'static> {
    work: Option<Work<Result<T, String>>>,
    tracker: TaskTracker,
    token: Option<TaskTrackerToken>,
    runtime: Option<tokio::runtime::Handle>,
}

impl<T: Send + 'static> Future for Adopted<T> {
    type Output = Result<T, String>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Some(work) = this.work.as_mut() else {
            return Poll::Ready(Err("polled after completion".to_string()));
        };
        let out = std::task::ready!(work.as_mut().poll(cx));
        this.work = None;
        this.token = None;
        Poll::Ready(out)
    }
}

impl<T: Send + 'static> Drop for Adopted<T> {
    fn drop(&mut self) {
        let (Some(work), Some(token)) = (self.work.take(), self.token.take()) else {
            return;
        };
        // With no runtime at all (the caller polled it from elsewhere and the current thread
        // has none either) nothing can drive the work any more.
        let runtime = self
            .runtime
            .take()
            .or_else(|| tokio::runtime::Handle::try_current().ok());
        if let Some(runtime) = runtime {
            self.tracker.spawn_on(work, &runtime);
        }
        // The task now counts for the work; the token goes only after it is spawned, so the
        // tracker never looks empty in between.
        drop(token);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_caller_gets_the_result_and_the_tracker_counts_the_work() {
        let tracker = TaskTracker::new();
        let seen = tracker.clone();
        let out = run_adopted(&tracker, async move { seen.len() }).await;
        assert_eq!(out, Ok(1));
        assert!(tracker.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn work_outlives_a_caller_that_stops_waiting() {
        let tracker = TaskTracker::new();
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let caller = run_adopted(&tracker, async move {
            let _ = started_tx.send(());
            tokio::time::sleep(Duration::from_secs(5)).await;
            flag.store(true, Ordering::SeqCst);
        });
        // The caller gives up once the work is under way.
        tokio::select! {
            _ = caller => unreachable!("the work sleeps"),
            _ = started_rx => {}
        }
        assert_eq!(tracker.len(), 1);
        tracker.close();
        tracker.wait().await;
        assert!(done.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_panic_is_an_error_not_an_unwind() {
        let tracker = TaskTracker::new();
        let out: Result<(), String> = run_adopted(&tracker, async { panic!("boom") }).await;
        assert_eq!(out, Err("boom".to_string()));
        assert!(tracker.is_empty());
    }
}
