//! What every kernel this orchestrator starts shares (an owner's, a pooled one, a transfer
//! kernel): the labels it carries, the event monitor that follows it, whether the engine
//! refused the file channels' directory, and the starts counted for metrics.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Mutex;

use super::{Orchestrator, StartStats};
use crate::docker::monitor::EventMonitor;
use crate::kernel::SpawnRequest;

/// The shared part of every kernel start.
pub(super) struct Spawner {
    /// The labels every kernel of this instance carries.
    pub(super) labels: BTreeMap<String, String>,
    /// Follows the kernels' containers' events (OOM, outside kills, crashes).
    pub(super) monitor: EventMonitor,
    /// Set once the engine refused to mount the file channels' directory
    /// (`SpawnRequest::sockets_refused`).
    pub(super) sockets_refused: AtomicBool,
    /// Kernel starts, by outcome, with durations.
    pub(super) starts: Mutex<StartStats>,
}

impl Spawner {
    pub(super) fn new(labels: BTreeMap<String, String>, monitor: EventMonitor) -> Spawner {
        Spawner {
            labels,
            monitor,
            sockets_refused: AtomicBool::new(false),
            starts: Mutex::new(StartStats::default()),
        }
    }

    /// Counts one start, its outcome and how long it took.
    pub(super) fn count_start(&self, ok: bool, seconds: f64) {
        self.starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(ok, seconds);
    }

    /// The starts counted so far.
    pub(super) fn starts(&self) -> StartStats {
        self.starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Orchestrator {
    /// A start of a kernel of nobody's with the configured image and sandbox, no network, no
    /// workspace, nothing preloaded: callers set what differs.
    pub(super) fn spawn_request(&self) -> SpawnRequest<'_> {
        let inner = &self.inner;
        let spawner = &inner.spawner;
        SpawnRequest {
            engine: inner.engine.clone(),
            spec: &inner.config.spec,
            spawn_timeout: inner.config.kernels.spawn_timeout,
            files: &inner.config.files,
            base_labels: &spawner.labels,
            owner: None,
            monitor: spawner.monitor.clone(),
            tracker: &inner.tasks.tracker,
            sockets_refused: &spawner.sockets_refused,
            network: None,
            workspace: None,
            files_volume: None,
            preload: &[],
            settings: None,
            yield_to: None,
            pool_language: crate::wire::Language::Python,
        }
    }
}
