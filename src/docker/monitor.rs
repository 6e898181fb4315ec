//! Watches the engine's container events for this instance, so a kernel that dies on its own
//! can be told apart: out of memory, killed from outside, or crashed.
//!
//! With auto-removal, `OOMKilled` is visible only as an `oom` event before `die`, so the fate of
//! each container is recorded from the event stream and looked up when its attach stream ends.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::Engine;

/// How close before a container's `die` an `oom` event must be for the death to be the
/// out-of-memory kill. The kernel's own kill is followed by `die` within milliseconds; an
/// older `oom` is of a process the kernel outlived (a cell's subprocess killed at the limit).
pub const OOM_DEATH_WINDOW: Duration = Duration::from_secs(5);

/// How long a container's death by SIGKILL with no `oom` or `kill` event yet waits for an
/// `oom` event before it is taken for a crash. The engine usually reports `oom` before `die`,
/// but the containerd shim sends the two from different goroutines (the cgroup's OOM
/// notification, the reaper of the exited process), so on a loaded host `die` can come first.
pub const OOM_AFTER_DIE: Duration = Duration::from_secs(1);

/// How a container ended, as its events tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Fate {
    /// An `oom` event was seen (at any time in the container's life).
    pub oom: bool,
    /// When the last `oom` event arrived.
    pub oom_at: Option<tokio::time::Instant>,
    /// When the `die` event arrived.
    pub died_at: Option<tokio::time::Instant>,
    /// A `kill` event was seen (someone sent it a signal through the engine).
    pub killed: bool,
    /// The signal of the last `kill` event.
    pub kill_signal: Option<i64>,
    /// `die` was seen, with this exit code.
    pub died: Option<i64>,
}

impl Fate {
    /// Whether the container itself died of running out of memory: it died by SIGKILL (exit
    /// code 137, or unknown) within [`OOM_DEATH_WINDOW`] after an `oom` event. A container
    /// whose process was killed at the limit earlier and that died later of something else
    /// (an exit code of its own) did not.
    pub fn died_of_oom(&self) -> bool {
        let by_sigkill = matches!(self.died, Some(137) | Some(-1) | None);
        match (self.oom_at, self.died_at) {
            (Some(oom), Some(died)) => {
                by_sigkill && died.saturating_duration_since(oom) <= OOM_DEATH_WINDOW
            }
            // No `die` seen (yet): only a recent `oom` counts.
            (Some(oom), None) => by_sigkill && oom.elapsed() <= OOM_DEATH_WINDOW,
            (None, _) => false,
        }
    }
}

/// The signal of an interrupt (`Engine::interrupt`).
const SIGINT: i64 = 2;

/// Fates are kept for this many containers at most.
const MAX_TRACKED: usize = 4096;

#[derive(Default)]
struct Fates {
    by_id: HashMap<String, Fate>,
    order: VecDeque<String>,
}

/// The event watcher of one orchestrator instance.
#[derive(Clone, Default)]
pub struct EventMonitor {
    fates: Arc<Mutex<Fates>>,
    changed: Arc<Notify>,
    /// Counts breaks of the event stream: the engine restarted or went away.
    epoch: Arc<std::sync::atomic::AtomicU64>,
}

impl EventMonitor {
    /// How many times the engine's event stream has broken so far.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks a break of the event stream (engine restart) and wakes waiters.
    pub fn record_break(&self) {
        self.epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// Waits (up to `limit`) for the event stream to break after `epoch`; true if it did.
    pub async fn wait_break(&self, epoch: u64, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            if self.epoch() != epoch {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.epoch() != epoch;
            }
        }
    }

    /// Records one event.
    #[cfg(test)]
    pub fn record(&self, id: &str, action: &str, exit_code: Option<i64>) {
        self.record_signal(id, action, exit_code, None);
    }

    /// Records one event with the signal of a `kill`.
    pub fn record_signal(
        &self,
        id: &str,
        action: &str,
        exit_code: Option<i64>,
        signal: Option<i64>,
    ) {
        let mut fates = self.fates.lock().unwrap_or_else(|p| p.into_inner());
        if !fates.by_id.contains_key(id) {
            if fates.order.len() >= MAX_TRACKED {
                if let Some(old) = fates.order.pop_front() {
                    fates.by_id.remove(&old);
                }
            }
            fates.order.push_back(id.to_string());
        }
        let fate = fates.by_id.entry(id.to_string()).or_default();
        match action {
            "oom" => {
                fate.oom = true;
                fate.oom_at = Some(tokio::time::Instant::now());
            }
            // SIGINT is kernelbox's own interrupt (`Engine::interrupt`), which a kernel
            // survives: it explains no death.
            "kill" if signal == Some(SIGINT) => {}
            "kill" => {
                fate.killed = true;
                fate.kill_signal = signal;
            }
            "die" => {
                fate.died = Some(exit_code.unwrap_or(-1));
                fate.died_at = Some(tokio::time::Instant::now());
            }
            _ => {}
        }
        drop(fates);
        self.changed.notify_waiters();
    }

    /// What is known of a container now.
    pub fn fate(&self, id: &str) -> Fate {
        let fates = self.fates.lock().unwrap_or_else(|p| p.into_inner());
        fates.by_id.get(id).copied().unwrap_or_default()
    }

    /// Waits (up to `limit`) for the container's `die` event, then reports its fate. A death
    /// by SIGKILL that nothing explains yet (no recent `oom`, no `kill` event) waits until
    /// [`OOM_AFTER_DIE`] after the `die` for an `oom` event that arrives late (see there), so
    /// the whole wait can last up to `limit` plus that.
    pub async fn wait_died(&self, id: &str, limit: Duration) -> Fate {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            let fate = self.fate(id);
            if let (Some(code), Some(died_at)) = (fate.died, fate.died_at) {
                // An `oom` older than the window (a subprocess killed at the limit long ago)
                // explains nothing: only one that makes this death an OOM kill does.
                if !matches!(code, 137 | -1) || fate.died_of_oom() || fate.killed {
                    return fate;
                }
                if tokio::time::timeout_at(died_at + OOM_AFTER_DIE, notified)
                    .await
                    .is_err()
                {
                    return self.fate(id);
                }
                continue;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.fate(id);
            }
        }
    }

    /// Follows the engine's events for containers matching `labels` until cancelled; when the
    /// stream ends (engine restart), resubscribes.
    pub async fn run(
        self,
        engine: Arc<dyn Engine>,
        labels: Vec<String>,
        cancel: CancellationToken,
    ) {
        let mut backoff = Duration::from_millis(100);
        // Replay from a little before now, so events of containers created while the
        // subscription was being set up are not missed; resubscriptions replay the gap.
        let mut since = crate::clock::unix_now() as i64 - 1;
        while !cancel.is_cancelled() {
            let mut events = engine.events(&labels, Some(since));
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    item = events.next() => match item {
                        Some(Ok(event)) => {
                            backoff = Duration::from_millis(100);
                            since = crate::clock::unix_now() as i64 - 1;
                            self.record_signal(&event.id, &event.action, event.exit_code, event.signal);
                        }
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "docker event stream broke; resubscribing");
                            self.record_break();
                            break;
                        }
                        None => {
                            tracing::warn!("docker event stream ended; resubscribing");
                            self.record_break();
                            break;
                        }
                    }
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `wait_died` of `id` in a task of its own, already waiting.
    async fn waiting(
        monitor: &EventMonitor,
        id: &'static str,
        limit: Duration,
    ) -> tokio::task::JoinHandle<Fate> {
        let monitor = monitor.clone();
        let waiter = tokio::spawn(async move { monitor.wait_died(id, limit).await });
        tokio::task::yield_now().await;
        waiter
    }

    #[tokio::test(start_paused = true)]
    async fn oom_then_die_is_reported_and_unknown_ids_time_out() {
        let monitor = EventMonitor::default();
        let waiter = waiting(&monitor, "c1", Duration::from_secs(5)).await;
        monitor.record("c1", "oom", None);
        monitor.record("c1", "die", Some(137));
        let fate = waiter.await.unwrap();
        assert!(fate.oom);
        assert!(fate.died_of_oom());
        assert_eq!(fate.died, Some(137));
        let unknown = monitor.wait_died("nope", Duration::from_secs(1)).await;
        assert_eq!(unknown, Fate::default());
    }

    #[tokio::test(start_paused = true)]
    async fn an_oom_reported_just_after_the_die_is_still_the_cause_of_death() {
        let monitor = EventMonitor::default();
        let waiter = waiting(&monitor, "c1", Duration::from_secs(3)).await;
        monitor.record("c1", "die", Some(137));
        tokio::time::sleep(OOM_AFTER_DIE / 2).await;
        monitor.record("c1", "oom", None);
        let fate = waiter.await.unwrap();
        assert!(fate.died_of_oom(), "{fate:?}");

        // A SIGKILL nothing explains is a crash, once the wait for a late `oom` is over.
        monitor.record("c2", "die", Some(137));
        let started = tokio::time::Instant::now();
        let fate = monitor.wait_died("c2", Duration::from_secs(3)).await;
        assert!(!fate.died_of_oom());
        assert_eq!(started.elapsed(), OOM_AFTER_DIE);
        // An `oom` of long ago (a subprocess killed at the limit) does not explain a later
        // SIGKILL: the wait for a late one still happens, and finds it.
        monitor.record("c5", "oom", None);
        tokio::time::advance(OOM_DEATH_WINDOW + Duration::from_secs(1)).await;
        let waiter = waiting(&monitor, "c5", Duration::from_secs(3)).await;
        monitor.record("c5", "die", Some(137));
        tokio::time::sleep(OOM_AFTER_DIE / 2).await;
        monitor.record("c5", "oom", None);
        assert!(waiter.await.unwrap().died_of_oom());
        // A wait that starts late ends 1 s after the `die`, not 1 s after it started.
        monitor.record("c6", "die", Some(137));
        tokio::time::advance(OOM_AFTER_DIE / 2).await;
        let started = tokio::time::Instant::now();
        monitor.wait_died("c6", Duration::from_secs(3)).await;
        assert_eq!(started.elapsed(), OOM_AFTER_DIE / 2);
        // An exit code of its own, or a `kill` through the engine, needs no wait.
        monitor.record("c3", "die", Some(3));
        monitor.record("c4", "kill", None);
        monitor.record("c4", "die", Some(137));
        let started = tokio::time::Instant::now();
        assert_eq!(
            monitor.wait_died("c3", Duration::from_secs(3)).await.died,
            Some(3)
        );
        assert!(monitor.wait_died("c4", Duration::from_secs(3)).await.killed);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_old_oom_or_an_exit_of_its_own_is_not_an_oom_death() {
        let monitor = EventMonitor::default();
        // A subprocess killed at the limit; the kernel exits later with a code of its own.
        monitor.record("c1", "oom", None);
        monitor.record("c1", "die", Some(3));
        assert!(monitor.fate("c1").oom && !monitor.fate("c1").died_of_oom());
        // A subprocess killed at the limit long before the kernel is killed by a signal.
        monitor.record("c2", "oom", None);
        tokio::time::advance(OOM_DEATH_WINDOW + Duration::from_secs(1)).await;
        monitor.record("c2", "die", Some(137));
        assert!(!monitor.fate("c2").died_of_oom());
        // The kernel itself killed at the limit.
        monitor.record("c3", "oom", None);
        monitor.record("c3", "die", Some(137));
        assert!(monitor.fate("c3").died_of_oom());
    }
}
