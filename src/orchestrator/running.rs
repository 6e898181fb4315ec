//! The calls running now (acquiring a kernel or running a cell), by owner: what an interrupt
//! cancels and waits for, what the drain counts.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::owner::Owner;

/// A cell in flight, as an interrupt finds it.
struct Run {
    id: u64,
    token: CancellationToken,
    /// `Some(true)` once it ended as interrupted, `Some(false)` once it ended otherwise.
    outcome: watch::Receiver<Option<bool>>,
}

/// The running calls, by owner, and how many there are.
pub(super) struct RunningCalls {
    by_owner: Mutex<HashMap<Owner, Vec<Run>>>,
    /// How many calls are in `by_owner`.
    count: watch::Sender<usize>,
    next: AtomicU64,
}

impl Default for RunningCalls {
    fn default() -> Self {
        RunningCalls {
            by_owner: Mutex::new(HashMap::new()),
            count: watch::Sender::new(0),
            next: AtomicU64::new(0),
        }
    }
}

impl RunningCalls {
    /// Enters a call among the running calls, interruptible by `token`, until the returned
    /// entry is dropped.
    pub(super) fn track(&self, owner: &Owner, token: &CancellationToken) -> Running<'_> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = watch::channel(None);
        let mut running = self.by_owner.lock().unwrap_or_else(|p| p.into_inner());
        running.entry(owner.clone()).or_default().push(Run {
            id,
            token: token.clone(),
            outcome: rx,
        });
        self.count.send_modify(|n| *n += 1);
        Running {
            calls: self,
            owner: owner.clone(),
            id,
            outcome: tx,
        }
    }

    /// Calls running now.
    pub(super) fn count(&self) -> usize {
        *self.count.borrow()
    }

    /// Waits until no call is running; returns at once when none is.
    pub(super) async fn wait_none(&self) {
        let mut rx = self.count.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Cancels every running call of `tenant`'s `session` (children included); returns what
    /// tells how each ended.
    pub(super) fn cancel_session(
        &self,
        tenant: &str,
        session: &str,
    ) -> Vec<watch::Receiver<Option<bool>>> {
        let running = self.by_owner.lock().unwrap_or_else(|p| p.into_inner());
        running
            .iter()
            .filter(|(owner, _)| owner.tenant == tenant && owner.session == session)
            .flat_map(|(_, runs)| runs.iter())
            .map(|run| {
                run.token.cancel();
                run.outcome.clone()
            })
            .collect()
    }
}

/// A call's entry among the running calls (acquiring a kernel or running a cell), from
/// [`RunningCalls::track`]; dropping it removes the entry. Dropped without
/// [`Running::finish`] (the call failed before its cell ran), an interrupt waiting on it
/// counts nothing.
pub(super) struct Running<'a> {
    calls: &'a RunningCalls,
    owner: Owner,
    id: u64,
    outcome: watch::Sender<Option<bool>>,
}

impl Running<'_> {
    /// Publishes how the cell ended, then removes the entry: an interrupt counts only cells
    /// that really ended as interrupted.
    pub(super) fn finish(self, interrupted: bool) {
        let _ = self.outcome.send(Some(interrupted));
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let calls = self.calls;
        let mut running = calls.by_owner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(runs) = running.get_mut(&self.owner) {
            let before = runs.len();
            runs.retain(|r| r.id != self.id);
            let gone = before - runs.len();
            if runs.is_empty() {
                running.remove(&self.owner);
            }
            calls.count.send_modify(|n| *n = n.saturating_sub(gone));
        }
    }
}
