//! The orchestrator: the library's front door. Resolves owners to kernels through the
//! registry, runs cells, turns outcomes into [`CellResult`](crate::CellResult)s, and owns every background task
//! (event monitor, reaper) and the watchdog.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Orchestrator`] and its shared `Inner`, `start` (restore, sweep, monitor, reaper, watchdog), accessors, stats |
//! | `request.rs` | what callers hand in and get back: [`ExecuteRequest`], errors, [`KernelSummary`], [`Stats`] |
//! | `execute.rs` | one execute: acquire a kernel (spawn or reuse), run the cell, build the [`CellResult`](crate::CellResult) |
//! | `files.rs` | files in and out of an owner's kernel: write, read, list, remove ([`FileRequest`]) |
//! | `lifecycle.rs` | running cells and interrupt, clear, evict, release a child, list, reap, sweeps |
//! | `pool.rs` | the warm pool: the refill task, pooled kernels' disposal, naming a taken kernel after its owner |
//! | `adopt.rs` | work driven by its caller that the tracker adopts if the caller goes away (an upload, a cell) |
//! | `shutdown.rs` | the graceful stop: refuse new work, drain, remove every kernel |
//! | `tests.rs`, `pool_tests.rs` | unit tests against the fake engine in paused time |

mod adopt;
mod execute;
mod files;
mod lifecycle;
mod pool;
#[cfg(test)]
mod pool_tests;
mod request;
mod shutdown;
#[cfg(test)]
mod tests;

pub use files::{FileError, FileRequest};
pub use pool::{PoolStats, POOL_REFILL_CONCURRENCY, REFILL_BUCKETS};
pub use request::{
    AdmissionNotice, ExecuteError, ExecuteRequest, FileBytes, KernelSummary, StartError,
    StartStats, Stats, START_BUCKETS,
};

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::catalog::{Catalog, CatalogError, CatalogWriter, Change, Entry, EntryState};
use crate::cell::{LossReason, StateLost};
use crate::config::{Config, IntoValidConfig, ValidConfig};
use crate::docker::monitor::EventMonitor;
use crate::docker::Engine;
use crate::instance::sweep::{self};
use crate::instance::watchdog::Watchdog;
use crate::instance::Instance;
use crate::labels;
use crate::owner::{NameError, Owner};
use crate::registry::Registry;

/// The error of a cell whose kernel was disposed of under it by a clear (`DELETE`), a reset
/// (`reset: true`) or a delegated child's release.
pub const CLEARED_MESSAGE: &str = "The session's kernel was cleared or reset by another \
    request while this cell ran (DELETE, reset: true, or the child's release) and was killed; \
    its state was lost. The next execute_code call starts a fresh kernel.";

/// How long past `spawn_timeout` an interrupt waits for the cells it cancelled to settle.
pub const INTERRUPT_SETTLE: Duration = Duration::from_secs(10);

/// A cell in flight, as an interrupt finds it.
struct Run {
    id: u64,
    token: CancellationToken,
    /// `Some(true)` once it ended as interrupted, `Some(false)` once it ended otherwise.
    outcome: tokio::sync::watch::Receiver<Option<bool>>,
}

struct Inner {
    config: ValidConfig,
    engine: Arc<dyn Engine>,
    instance: Instance,
    labels: BTreeMap<String, String>,
    registry: Registry,
    monitor: EventMonitor,
    tracker: TaskTracker,
    cancel: CancellationToken,
    running: Mutex<HashMap<Owner, Vec<Run>>>,
    /// How many calls are in `running` (acquiring a kernel or running a cell).
    running_count: tokio::sync::watch::Sender<usize>,
    next_run: std::sync::atomic::AtomicU64,
    starts: Mutex<StartStats>,
    /// File bytes moved by `write_file` (uploads) and `read_file` (downloads).
    file_bytes: Arc<files::FileCounters>,
    /// Set once the engine refused to mount the file channels' directory
    /// (`SpawnRequest::sockets_refused`).
    sockets_refused: std::sync::atomic::AtomicBool,
    watchdog: Mutex<Option<Watchdog>>,
    catalog: Option<Arc<CatalogWriter>>,
    pool: pool::PoolState,
}

/// Runs stateful Python kernels in containers, one per key. Cheap to clone.
#[derive(Clone)]
pub struct Orchestrator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator")
            .field("instance", &self.inner.instance.id)
            .field("kernels", &self.inner.registry.len())
            .finish()
    }
}

impl Orchestrator {
    /// Validates the config (a [`Config`]; a [`ValidConfig`] is not checked again), opens the
    /// catalog in `config.housekeeping.state_dir` (if set), checks the engine, sweeps
    /// leftovers of dead instances, and starts the event monitor, the reaper and the watchdog.
    pub async fn start(
        config: impl IntoValidConfig,
        engine: Arc<dyn Engine>,
    ) -> Result<Orchestrator, StartError> {
        let config = config.into_valid()?;
        let catalog = match config.housekeeping.state_dir.clone() {
            Some(dir) => {
                let opened =
                    tokio::task::spawn_blocking(move || crate::catalog::RedbCatalog::open(&dir))
                        .await
                        .map_err(|e| {
                            StartError::CatalogWriter(std::io::Error::other(e.to_string()))
                        })??;
                Some(Arc::new(opened) as Arc<dyn Catalog>)
            }
            None => None,
        };
        Self::start_with_catalog(config, engine, catalog).await
    }

    /// [`Orchestrator::start`] with the given catalog (`config.housekeeping.state_dir` is not used):
    /// kernels live in it at its last use are reported lost by a restart, and generations
    /// continue from it.
    pub async fn start_with_catalog(
        config: ValidConfig,
        engine: Arc<dyn Engine>,
        catalog: Option<Arc<dyn Catalog>>,
    ) -> Result<Orchestrator, StartError> {
        let restored = match catalog {
            Some(catalog) => {
                let blocking = catalog.clone();
                let (entries, live) = tokio::task::spawn_blocking(move || restore(&*blocking))
                    .await
                    .map_err(|e| {
                        StartError::CatalogWriter(std::io::Error::other(e.to_string()))
                    })??;
                let writer = CatalogWriter::start(catalog).map_err(StartError::CatalogWriter)?;
                Some((Arc::new(writer), entries, live))
            }
            None => None,
        };
        engine.ping().await?;
        let instance = Instance::current();
        let labels = instance.labels(&config.housekeeping.extra_labels);
        let mut config = config;
        if let Some(dir) = config.files.sockets.clone() {
            let prepared =
                tokio::task::spawn_blocking(move || crate::kernel::prepare_socket_dir(&dir)).await;
            let why = match prepared {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(why) = why {
                // Files still move, through the engine's exec streams (slower).
                tracing::warn!(
                    dir = %config.files.sockets.as_ref().map(|d| d.display().to_string()).unwrap_or_default(),
                    "file channel directory unusable ({why}): files go through the engine's exec streams"
                );
                config.drop_file_sockets();
            }
        }
        if config.housekeeping.sweep_on_start {
            let report = sweep::sweep_orphans(engine.as_ref(), &instance, false).await?;
            if !report.containers.is_empty() || !report.volumes.is_empty() {
                tracing::info!(
                    containers = report.containers.len(),
                    volumes = report.volumes.len(),
                    "swept leftovers of dead instances"
                );
            }
        }
        let watchdog = match &config.housekeeping.watchdog {
            Some(path) => Some(Watchdog::spawn(path, &instance.id).map_err(|source| {
                StartError::Watchdog {
                    path: path.display().to_string(),
                    source,
                }
            })?),
            None => None,
        };
        let pool = pool::PoolState::new(config.spec.clone(), config.pool.size);
        let inner = Arc::new(Inner {
            pool,
            registry: Registry::new(
                config.kernels.max_session_kernels,
                config.kernels.idle_timeout,
            ),
            config,
            engine,
            labels,
            monitor: EventMonitor::default(),
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
            running: Mutex::new(HashMap::new()),
            running_count: tokio::sync::watch::Sender::new(0),
            next_run: std::sync::atomic::AtomicU64::new(0),
            starts: Mutex::new(StartStats::default()),
            file_bytes: Arc::default(),
            sockets_refused: std::sync::atomic::AtomicBool::new(false),
            watchdog: Mutex::new(watchdog),
            instance,
            catalog: restored.as_ref().map(|(writer, _, _)| writer.clone()),
        });
        if let Some((writer, entries, live)) = restored {
            let seeded = inner.registry.use_catalog(writer, entries);
            inner
                .registry
                .count_losses(LossReason::ServerRestarted, live);
            if seeded > 0 {
                tracing::info!(
                    keys = seeded,
                    lost_by_restart = live,
                    "restored the owner catalog"
                );
            }
        }
        let orchestrator = Orchestrator { inner };
        let i = &orchestrator.inner;
        i.tracker.spawn(i.monitor.clone().run(
            i.engine.clone(),
            vec![
                labels::managed(),
                labels::filter(labels::INSTANCE, &i.instance.id),
            ],
            i.cancel.child_token(),
        ));
        let reaper = orchestrator.clone();
        i.tracker.spawn(async move { reaper.reap_forever().await });
        orchestrator.start_pool();
        Ok(orchestrator)
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// This instance's id (its containers carry it as a label).
    pub fn instance_id(&self) -> &str {
        &self.inner.instance.id
    }

    /// The engine this orchestrator drives.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.inner.engine
    }

    fn owner_of(
        &self,
        tenant: Option<&str>,
        session: &str,
        child: Option<&str>,
    ) -> Result<Owner, NameError> {
        Owner::new(
            tenant.unwrap_or(&self.inner.config.default_tenant),
            session,
            child,
        )
    }

    /// Waits until every catalog change recorded so far is written (or has failed). Nothing
    /// to wait for without a catalog.
    pub async fn sync_catalog(&self) {
        if let Some(catalog) = &self.inner.catalog {
            let writer = catalog.clone();
            let _ = tokio::task::spawn_blocking(move || writer.flush()).await;
        }
    }

    /// Lifecycle counters for metrics: kernel starts (by outcome, with durations) and
    /// involuntary losses as they happened, by reason.
    pub fn stats(&self) -> Stats {
        let starts = self
            .inner
            .starts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Stats {
            starts,
            losses: self.inner.registry.loss_counts(),
            evictions: self.inner.registry.eviction_counts(),
            catalog_failures: self.inner.catalog.as_ref().map_or(0, |c| c.failures()),
            pool: PoolStats {
                ready: self.inner.registry.pool_ready(),
                ..self.inner.pool.stats().clone()
            },
            file_bytes: self.inner.file_bytes.snapshot(),
        }
    }
}

/// A loss by restart, now.
fn restart_loss() -> StateLost {
    StateLost {
        reason: LossReason::ServerRestarted,
        at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    }
}

/// Reads the catalog at start. Rows still `live` belong to a previous run that died without
/// a clean shutdown: their kernels are gone (its watchdog or this start's sweep removed them),
/// so they become losses by restart, durably, before anything else is recorded. Returns the
/// rows and how many were live. Blocking.
fn restore(catalog: &dyn Catalog) -> Result<(Vec<Entry>, u64), CatalogError> {
    let mut entries = catalog.load()?;
    let loss = restart_loss();
    let mut live = 0;
    for entry in &mut entries {
        if entry.state == EntryState::Live {
            entry.state = EntryState::Lost { loss: loss.clone() };
            live += 1;
        }
    }
    if live > 0 {
        catalog.apply(&[Change::AllLiveLost { loss }])?;
    }
    Ok((entries, live))
}
