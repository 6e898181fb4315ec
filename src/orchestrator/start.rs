//! The start, in named steps: the configuration validated once, the durable catalog restored
//! (kernels live at its last use become losses by restart), the engine checked, the file
//! channels' directory prepared, hibernated kernels of an earlier run found by their records,
//! leftovers of dead instances swept (hibernated kernels left), the watchdog started, the
//! hibernated kernels taken over, then the event monitor, the reaper, the runaway watch and
//! the warm pool's refill.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{pool, spawner, tenancy, Inner, Orchestrator, StartError};
use crate::catalog::{Catalog, CatalogError, CatalogWriter, Change, Entry, EntryState};
use crate::cell::{LossReason, StateLost};
use crate::config::{IntoValidConfig, ValidConfig};
use crate::docker::monitor::EventMonitor;
use crate::docker::Engine;
use crate::instance::sweep;
use crate::instance::watchdog::Watchdog;
use crate::instance::Instance;
use crate::labels;
use crate::registry::Registry;
use crate::services;

/// What the catalog held at start.
struct Restored {
    /// The catalog itself: the usage ledger is read and written there directly.
    store: Arc<dyn Catalog>,
    /// Writes later changes, on its own thread.
    writer: Arc<CatalogWriter>,
    /// Every row, those left live by the previous run turned into losses by restart.
    entries: Vec<Entry>,
    /// How many rows were live.
    live: u64,
}

impl Orchestrator {
    /// Validates the config (a [`Config`](crate::Config); a [`ValidConfig`] is not checked
    /// again), opens the catalog in `config.housekeeping.state_dir` (if set), checks the
    /// engine, sweeps leftovers of dead instances, and starts the event monitor, the reaper
    /// and the watchdog.
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
        start_validated(config, engine, catalog).await
    }

    /// [`Orchestrator::start`] with the given catalog (`config.housekeeping.state_dir` is not
    /// used): kernels live in it at its last use are reported lost by a restart, and
    /// generations continue from it.
    pub async fn start_with_catalog(
        config: ValidConfig,
        engine: Arc<dyn Engine>,
        catalog: Option<Arc<dyn Catalog>>,
    ) -> Result<Orchestrator, StartError> {
        start_validated(config, engine, catalog).await
    }
}

/// The start proper, of a configuration already validated.
async fn start_validated(
    mut config: ValidConfig,
    engine: Arc<dyn Engine>,
    catalog: Option<Arc<dyn Catalog>>,
) -> Result<Orchestrator, StartError> {
    let restored = match catalog {
        Some(catalog) => Some(Restored::load(catalog).await?),
        None => None,
    };
    engine.ping().await?;
    check_runtimes(&config, engine.as_ref()).await?;
    let instance = Instance::current();
    prepare_file_sockets(&mut config).await;
    // Hibernated kernels of an earlier run outlive it (the sweep leaves them by name).
    let recorded = services::recorded(&config, engine.as_ref()).await?;
    if config.housekeeping.sweep_on_start {
        sweep_leftovers(engine.as_ref(), &instance).await?;
    }
    let watchdog = match &config.housekeeping.watchdog {
        Some(path) => Some(
            Watchdog::spawn(path, &instance.id, recorded.tag.as_deref()).map_err(|source| {
                StartError::Watchdog {
                    path: path.display().to_string(),
                    source,
                }
            })?,
        ),
        None => None,
    };
    let egress = match &config.egress {
        Some(egress) => Some(Arc::new(
            crate::egress::Egress::start(
                engine.clone(),
                &instance.id,
                &instance.labels(&config.housekeeping.extra_labels),
                egress,
            )
            .await?,
        )),
        None => None,
    };
    let workspaces = match &config.workspaces {
        Some(ws) => Some(Arc::new(crate::workspace::Workspaces::new(
            engine.clone(),
            ws.clone(),
            config.housekeeping.extra_labels.clone(),
        )?)),
        None => None,
    };
    let tracker = TaskTracker::new();
    let policies = Arc::new(crate::tenancy::LivePolicies::from_pointee(
        crate::tenancy::TenantPolicies::of_config(&config),
    ));
    let audit = services::AuditTrail::start(config.audit.as_ref(), policies.clone(), &tracker)?;
    let registry = Arc::new(Registry::new(
        config.kernels.max_session_kernels,
        config.kernels.idle_timeout,
    ));
    let monitor = EventMonitor::default();
    let hibernation = Arc::new(services::Hibernation::new(
        &config,
        registry.clone(),
        engine.clone(),
        tracker.clone(),
        monitor.clone(),
        &instance,
        policies.clone(),
    ));
    let snapshots = Arc::new(services::Snapshots::new(
        &config.snapshots,
        config.housekeeping.state_dir.as_deref(),
        &instance.id,
        services::SnapshotHandles {
            registry: registry.clone(),
            hibernation: hibernation.clone(),
            engine: engine.clone(),
            max_upload_bytes: config.files.max_upload_bytes,
        },
    ));
    // Migrations work under the snapshots' root (`docs/cluster.md`, "Migration on drain").
    let migrations = services::Migrations::new(
        config
            .snapshots
            .location(config.housekeeping.state_dir.as_deref(), &instance.id)
            .0
            .join(".migrations"),
        config.snapshots.max_bytes,
    );
    let usage = Arc::new(services::UsageLedger::new(
        match &restored {
            Some(r) => r.store.clone(),
            None => Arc::new(crate::catalog::MemoryCatalog::default()),
        },
        egress.clone(),
    ));
    let cancel = CancellationToken::new();
    let reaper = Arc::new(services::Reaper {
        registry: registry.clone(),
        engine: engine.clone(),
        instance: instance.clone(),
        hibernation: hibernation.clone(),
        snapshots: snapshots.clone(),
        workspaces: workspaces.clone(),
        staging_max_age: config.housekeeping.staging_max_age,
        interval: config.reap_interval(),
    });
    let inner = Arc::new(Inner {
        tenancy: policies,
        services: super::Services {
            processes: services::Processes::new(tracker.clone(), cancel.clone()),
            sessions: services::SessionConfigs::new(
                registry.clone(),
                egress,
                config.default_tenant.clone(),
            ),
            files: services::FileMeter::new(
                usage.pending().clone(),
                tracker.clone(),
                cancel.clone(),
            ),
            reaper,
            transfers: services::WorkspaceTransfers::new(workspaces),
            audit,
            hibernation,
            usage,
            snapshots,
            migrations,
        },
        pool: pool::PoolState::new(config.spec.clone(), &config.pool),
        registry,
        spawner: spawner::Spawner::new(
            {
                let mut labels = instance.labels(&config.housekeeping.extra_labels);
                if let Some(tag) = &recorded.tag {
                    labels.insert(labels::CHECKPOINTS.into(), tag.clone());
                }
                labels
            },
            monitor,
        ),
        config,
        engine,
        tasks: super::Tasks { tracker, cancel },
        running: Default::default(),
        commands: Arc::default(),
        watchdog: super::node::WatchdogSlot::new(watchdog),
        instance,
        catalog: restored.as_ref().map(|r| r.writer.clone()),
    });
    inner.registry.set_ceilings(tenancy::ceilings(
        &inner.config,
        &inner.config.tenant_session_limits,
    ));
    let live = match restored {
        Some(restored) => restored.seed(&inner.registry),
        None => 0,
    };
    let orchestrator = Orchestrator { inner };
    let adopted = orchestrator
        .inner
        .services
        .hibernation
        .adopt(recorded.records);
    let registry = &orchestrator.inner.registry;
    registry.count_losses(LossReason::ServerRestarted, live.saturating_sub(adopted));
    // Before any call can take a checkpoint: what no kept checkpoint claims goes.
    orchestrator.inner.services.hibernation.clear_dir().await;
    // The snapshots an earlier run kept (`docs/snapshots.md`); half-made ones go.
    let kept = orchestrator.inner.services.snapshots.load().await;
    if kept > 0 {
        tracing::info!(snapshots = kept, "snapshots of an earlier run kept");
    }
    start_tasks(&orchestrator);
    Ok(orchestrator)
}

/// Starts the background tasks: the event monitor, the reaper, the runaway watch, the
/// pool's refill.
fn start_tasks(orchestrator: &Orchestrator) {
    let i = &orchestrator.inner;
    // Kernels restored from an earlier run's checkpoints carry its labels: with any taken
    // over, every kernelbox container's events are followed.
    let events = match i.registry.hibernated_count() {
        0 => vec![
            labels::managed(),
            labels::filter(labels::INSTANCE, &i.instance.id),
        ],
        _ => vec![labels::managed()],
    };
    i.tasks.tracker.spawn(i.spawner.monitor.clone().run(
        i.engine.clone(),
        events,
        i.tasks.cancel.child_token(),
    ));
    let reaper = i.services.reaper.clone();
    i.tasks.tracker.spawn(reaper.run(i.tasks.cancel.clone()));
    let watch = services::RunawayWatcher::new(&i.config, i.registry.clone());
    i.tasks.tracker.spawn(watch.run(i.tasks.cancel.clone()));
    let (usage, registry, cancel) = (
        i.services.usage.clone(),
        i.registry.clone(),
        i.tasks.cancel.clone(),
    );
    i.tasks
        .tracker
        .spawn(async move { usage.keep(&registry, cancel).await });
    orchestrator.start_pool();
}

impl Restored {
    /// Reads the catalog ([`restore`], off the runtime) and starts its writer.
    async fn load(catalog: Arc<dyn Catalog>) -> Result<Restored, StartError> {
        let blocking = catalog.clone();
        let (entries, live) = tokio::task::spawn_blocking(move || restore(&*blocking))
            .await
            .map_err(|e| StartError::CatalogWriter(std::io::Error::other(e.to_string())))??;
        let store = catalog.clone();
        let writer = CatalogWriter::start(catalog).map_err(StartError::CatalogWriter)?;
        Ok(Restored {
            store,
            writer: Arc::new(writer),
            entries,
            live,
        })
    }

    /// Seeds the registry: generations continue, losses are reported. Returns how many
    /// kernels were live (lost by the restart, but those whose checkpoints are taken over).
    fn seed(self, registry: &Registry) -> u64 {
        let seeded = registry.use_catalog(self.writer, self.entries);
        if seeded > 0 {
            tracing::info!(
                keys = seeded,
                lost_by_restart = self.live,
                "restored the owner catalog"
            );
        }
        self.live
    }
}

/// Prepares the file channels' directory (`Config::file_sockets`); when it is unusable, files
/// still move, through the engine's exec streams (slower), and the setting is dropped.
async fn prepare_file_sockets(config: &mut ValidConfig) {
    let Some(dir) = config.files.sockets.clone() else {
        return;
    };
    let prepared =
        tokio::task::spawn_blocking(move || crate::kernel::prepare_socket_dir(&dir)).await;
    let why = match prepared {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    tracing::warn!(
        dir = %config.files.sockets.as_ref().map(|d| d.display().to_string()).unwrap_or_default(),
        "file channel directory unusable ({why}): files go through the engine's exec streams"
    );
    config.drop_file_sockets();
}

/// Removes what dead instances left behind (`Housekeeping::sweep_on_start`).
async fn sweep_leftovers(engine: &dyn Engine, instance: &Instance) -> Result<(), StartError> {
    let report = sweep::sweep_orphans(engine, instance, false).await?;
    if !report.containers.is_empty() || !report.volumes.is_empty() {
        tracing::info!(
            containers = report.containers.len(),
            volumes = report.volumes.len(),
            "swept leftovers of dead instances"
        );
    }
    services::sweep_expired_hibernated(engine, instance).await;
    Ok(())
}

/// A loss by restart, now.
pub(super) fn restart_loss() -> StateLost {
    StateLost {
        reason: LossReason::ServerRestarted,
        at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        workspace_lost: false,
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

/// Every runtime the configuration names must be one the engine has: refused at start, not
/// found out by a tenant's first cell (`docs/runtimes.md`).
async fn check_runtimes(config: &ValidConfig, engine: &dyn Engine) -> Result<(), StartError> {
    let registered = engine.runtimes().await?;
    for runtime in config.runtimes() {
        if !registered.iter().any(|r| r == runtime.name()) {
            let mut names = registered.clone();
            names.sort();
            return Err(StartError::RuntimeMissing {
                runtime: runtime.name().into(),
                registered: names.join(", "),
            });
        }
    }
    Ok(())
}
