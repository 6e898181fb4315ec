//! The orchestrator: the library's front door. Resolves owners to kernels through the
//! registry, runs cells, turns outcomes into [`CellResult`]s, and owns every background task
//! (event monitor, reaper) and the watchdog.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::adopt::run_adopted;
use crate::authority::{CellAuthority, ToolDispatcher};
use crate::catalog::{Catalog, CatalogError, CatalogWriter, Change, Entry, EntryState};
use crate::cell::{
    timeout_message, CellResult, CellStatus, KernelInfo, LossReason, StateLost, INTERRUPTED_MESSAGE,
};
use crate::config::Config;
use crate::docker::{Engine, EngineError};
use crate::instance::Instance;
use crate::kernel::{CellEnd, Death, Kernel, KernelError, KernelState, OutputSink};
use crate::labels;
use crate::monitor::EventMonitor;
use crate::owner::{KernelKey, NameError, Owner};
use crate::protocol::DoneStatus;
use crate::registry::{Cap, EvictionCounts, Refusal, Registry, Slot, TenantLimits};
use crate::sweep::{self, SweepReport};
use crate::watchdog::Watchdog;

/// One execute call.
#[derive(Clone, Default)]
pub struct ExecuteRequest {
    /// Tenant namespace (the configured default when `None`).
    pub tenant: Option<String>,
    /// The conversation.
    pub session: String,
    /// The turn; changes every turn and never keys a kernel.
    pub task_id: Option<String>,
    /// The delegated child making the call, if any.
    pub child: Option<String>,
    /// Python source of the cell.
    pub code: String,
    /// Discard the kernel and run in a fresh one.
    pub reset: bool,
    /// Cell timeout (the configured default when `None`).
    pub timeout: Option<Duration>,
    /// Tools the cell may call (part of the kernel key).
    pub tools: BTreeSet<String>,
    /// Where tool calls go.
    pub dispatcher: Option<Arc<dyn ToolDispatcher>>,
    /// Cancelling it interrupts the cell (the kernel is killed).
    pub cancel: Option<CancellationToken>,
    /// Receives output live.
    pub sink: Option<OutputSink>,
    /// The tenant's own cap and reservation (see [`crate::registry`] for the fairness rule).
    pub tenant_limits: TenantLimits,
    /// Told, once, whether the request got a kernel slot or was refused at a cap, before any
    /// kernel starts (the HTTP layer answers 429 instead of starting a stream).
    pub admission: Option<AdmissionNotice>,
}

type AdmissionSender = tokio::sync::oneshot::Sender<Result<(), ExecuteError>>;

/// Where [`ExecuteRequest::admission`] is told; cloning shares the one notice.
#[derive(Clone, Debug, Default)]
pub struct AdmissionNotice(Arc<Mutex<Option<AdmissionSender>>>);

impl AdmissionNotice {
    /// A notice and the receiver that learns the outcome (closed without one when the request
    /// failed before admission, e.g. on a bad name).
    pub fn new() -> (
        AdmissionNotice,
        tokio::sync::oneshot::Receiver<Result<(), ExecuteError>>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (AdmissionNotice(Arc::new(Mutex::new(Some(tx)))), rx)
    }

    fn send(&self, outcome: Result<(), ExecuteError>) {
        let tx = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = tx {
            let _ = tx.send(outcome);
        }
    }
}

impl std::fmt::Debug for ExecuteRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecuteRequest")
            .field("tenant", &self.tenant)
            .field("session", &self.session)
            .field("child", &self.child)
            .field("reset", &self.reset)
            .field("timeout", &self.timeout)
            .field("tools", &self.tools)
            .field("tenant_limits", &self.tenant_limits)
            .finish_non_exhaustive()
    }
}

impl ExecuteRequest {
    /// A request to run `code` for `session`.
    pub fn new(session: impl Into<String>, code: impl Into<String>) -> ExecuteRequest {
        ExecuteRequest {
            session: session.into(),
            code: code.into(),
            ..ExecuteRequest::default()
        }
    }
}

/// Why an execute could not produce a cell result at all.
#[derive(Debug, thiserror::Error)]
pub enum ExecuteError {
    /// The request is malformed.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The cell timeout is outside `(0, max_cell_timeout]`.
    #[error(transparent)]
    InvalidTimeout(#[from] crate::config::InvalidTimeout),
    /// A name would break labels or keys.
    #[error(transparent)]
    Name(#[from] NameError),
    /// The kernel could not be started.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The orchestrator is shutting down.
    #[error("kernelbox is shutting down")]
    ShuttingDown,
    /// A new kernel would pass a cap, and no kernel may be evicted to make room.
    #[error("{}", at_capacity_message(.tenant, .cap, *.held))]
    AtCapacity {
        /// The tenant.
        tenant: String,
        /// The cap that refused it.
        cap: Cap,
        /// Kernels the tenant held, as that cap counts them.
        held: usize,
    },
    /// The session's kernel already has this many calls attached (one running, the others
    /// queued behind it); one more is refused rather than queued.
    #[error(
        "session {owner:?} already has {max} calls running or queued on its kernel, the most \
         allowed; retry later"
    )]
    SessionBusy {
        /// The owner (session, or `session::child::child`).
        owner: String,
        /// The bound ([`crate::registry::MAX_ATTACHED_PER_SLOT`]).
        max: usize,
    },
    /// A bug in kernelbox: the task running the cell failed.
    #[error("internal error: {0}")]
    Internal(String),
}

fn at_capacity_message(tenant: &str, cap: &Cap, held: usize) -> String {
    match cap {
        Cap::Tenant { max } => format!(
            "tenant {tenant:?} is at its max_kernels ({held} of {max}) and none of its kernels \
             is idle and unpinned to make room; retry later"
        ),
        Cap::Children { max } => format!(
            "the host's pool of live delegated children is full ({max} children; tenant \
             {tenant:?} holds {held}); release finished children or retry later"
        ),
        Cap::Host { max, share } => format!(
            "the host is at its kernel cap ({max} kernels): tenant {tenant:?} holds {held} \
             (its fair share is {share}) and no kernel it may evict is idle; retry later"
        ),
    }
}

/// Why the orchestrator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The engine is unreachable or refused the startup sweep.
    #[error("docker engine: {0}")]
    Engine(#[from] EngineError),
    /// The durable catalog in the state directory could not be opened or read.
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    /// The catalog's writer thread could not be started.
    #[error("starting the catalog writer thread: {0}")]
    CatalogWriter(std::io::Error),
    /// The watchdog process could not be started.
    #[error("starting the watchdog {path}: {source}")]
    Watchdog {
        /// The binary.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

/// A live kernel, as `list_kernels` reports it.
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct KernelSummary {
    /// Short container id.
    pub id: String,
    /// Tenant.
    pub tenant: String,
    /// Owner string.
    pub owner: String,
    /// Session.
    pub session: String,
    /// Delegated child.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child: Option<String>,
    /// Generation within the key.
    pub generation: u64,
    /// `starting`, `idle` or `busy`.
    pub state: String,
    /// Cells executed.
    pub execution_count: u64,
    /// Seconds since last use.
    pub idle_seconds: f64,
    /// Calls attached.
    pub attached: usize,
}

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
    config: Config,
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
    watchdog: Mutex<Option<Watchdog>>,
    catalog: Option<Arc<CatalogWriter>>,
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
    /// Validates the config, opens the catalog in `config.state_dir` (if set), checks the
    /// engine, sweeps leftovers of dead instances, and starts the event monitor, the reaper
    /// and the watchdog.
    pub async fn start(
        config: Config,
        engine: Arc<dyn Engine>,
    ) -> Result<Orchestrator, StartError> {
        let config = config.validate()?;
        let catalog = match config.state_dir.clone() {
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

    /// [`Orchestrator::start`] with the given catalog (`config.state_dir` is not used):
    /// kernels live in it at its last use are reported lost by a restart, and generations
    /// continue from it.
    pub async fn start_with_catalog(
        config: Config,
        engine: Arc<dyn Engine>,
        catalog: Option<Arc<dyn Catalog>>,
    ) -> Result<Orchestrator, StartError> {
        let config = config.validate()?;
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
        let labels = instance.labels(&config.extra_labels);
        if config.sweep_on_start {
            let report = sweep::sweep_orphans(engine.as_ref(), &instance, false).await?;
            if !report.containers.is_empty() || !report.volumes.is_empty() {
                tracing::info!(
                    containers = report.containers.len(),
                    volumes = report.volumes.len(),
                    "swept leftovers of dead instances"
                );
            }
        }
        let watchdog = match &config.watchdog {
            Some(path) => Some(Watchdog::spawn(path, &instance.id).map_err(|source| {
                StartError::Watchdog {
                    path: path.display().to_string(),
                    source,
                }
            })?),
            None => None,
        };
        let inner = Arc::new(Inner {
            registry: Registry::new(config.max_session_kernels, config.kernel_idle_timeout),
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

    /// Runs one cell and returns its result. The cell keeps running to its end even if the
    /// returned future is dropped (cancel `request.cancel` to interrupt it). The caller's task
    /// drives the cell, so like any future it progresses only while polled: hold it in a
    /// `select!` loop only if that loop keeps polling it.
    pub async fn execute(&self, request: ExecuteRequest) -> Result<CellResult, ExecuteError> {
        if self.inner.cancel.is_cancelled() {
            return Err(ExecuteError::ShuttingDown);
        }
        let this = self.clone();
        // The cell finishes even if the caller stops waiting (see `adopt`).
        run_adopted(&self.inner.tracker, async move {
            this.execute_owned(request).await
        })
        .await
        .unwrap_or_else(|panic| {
            Err(ExecuteError::Internal(format!(
                "the execute task failed: {panic}"
            )))
        })
    }

    async fn execute_owned(&self, request: ExecuteRequest) -> Result<CellResult, ExecuteError> {
        let started = Instant::now();
        let config = &self.inner.config;
        let owner = self.owner_of(
            request.tenant.as_deref(),
            &request.session,
            request.child.as_deref(),
        )?;
        let timeout = config.check_cell_timeout(request.timeout.unwrap_or(config.cell_timeout))?;
        let key = KernelKey {
            owner: owner.clone(),
            mode: config.mode.clone(),
            image: config.image.clone(),
            tools: request.tools.clone(),
        };
        // Interruptible from the start: an interrupt during a cold start is not lost (the cell
        // then never runs and the new kernel is killed, as for any interrupt).
        let cancel = request.cancel.clone().unwrap_or_default();
        let (run_id, outcome) = self.track_running(&owner, &cancel);
        let lease = match self
            .acquire(
                &key,
                request.reset,
                request.tenant_limits,
                request.admission.as_ref(),
            )
            .await
        {
            Ok(lease) => lease,
            Err(e) => {
                // The outcome is dropped unsent: an interrupt waiting on it counts nothing.
                self.untrack_running(&owner, run_id);
                return Err(e);
            }
        };
        let mut lease = lease;
        let kernel = lease.kernel.clone();
        let authority = Arc::new(CellAuthority::new(
            request.task_id.clone(),
            request.dispatcher.clone(),
            request.tools.clone(),
            config.max_tool_calls,
        ));
        let run = kernel
            .run_cell(
                &request.code,
                timeout,
                authority.clone(),
                cancel.clone(),
                request.sink.clone(),
                (config.output_inline_bytes, config.output_spill_bytes),
            )
            .await;
        // Published before the run is untracked: an interrupt counts only cells that really
        // ended as interrupted.
        let _ = outcome.send(Some(matches!(run.end, CellEnd::Interrupted)));
        self.untrack_running(&owner, run_id);

        let mut info = KernelInfo {
            id: kernel.short_id().to_string(),
            reused: lease.reused,
            execution_count: run.execution_count,
            state_reset: lease.state_reset,
            ended: false,
            generation: lease.slot.generation,
            state_lost: lease.state_lost.clone(),
        };
        let (status, exit_code, error, loss) = match &run.end {
            CellEnd::Done {
                status: DoneStatus::Ok,
                ..
            } => (CellStatus::Success, 0, None, None),
            CellEnd::Done {
                status: DoneStatus::Error,
                traceback,
            } => (
                CellStatus::Error,
                1,
                Some(traceback.clone().unwrap_or_default()),
                None,
            ),
            CellEnd::Done {
                status: DoneStatus::Exit,
                ..
            } => {
                info.ended = true;
                (CellStatus::Success, 0, None, None)
            }
            CellEnd::TimedOut => (
                CellStatus::Timeout,
                -1,
                Some(timeout_message(timeout)),
                Some(LossReason::Timeout),
            ),
            CellEnd::Interrupted if !run.ran => (
                CellStatus::Interrupted,
                -1,
                Some(INTERRUPTED_BEFORE_IT_RAN.to_string()),
                None,
            ),
            CellEnd::Interrupted => (
                CellStatus::Interrupted,
                -1,
                Some(INTERRUPTED_MESSAGE.to_string()),
                Some(LossReason::Killed),
            ),
            CellEnd::Died(death) => {
                let (message, reason) = death_message(*death, config.sandbox.memory_bytes);
                (CellStatus::Error, -1, Some(message), reason)
            }
        };
        // Killed under its cell by a clear, a reset or a child's release (not by shutdown).
        let error = match (&run.end, error) {
            (CellEnd::Died(Death::Disposed), Some(_))
                if !self.inner.cancel.is_cancelled()
                    && !self.inner.registry.is_registered(&lease.slot) =>
            {
                Some(CLEARED_MESSAGE.to_string())
            }
            (_, error) => error,
        };
        // A cell that never ran leaves its kernel as it found it.
        let kernel_gone = (run.ran
            && !matches!(
                run.end,
                CellEnd::Done {
                    status: DoneStatus::Ok | DoneStatus::Error,
                    ..
                }
            ))
            || !kernel.is_alive();
        let capped = run.output.finish();
        let mut result = CellResult {
            status,
            output: capped.text,
            error,
            exit_code,
            tool_calls_made: authority.calls_made(),
            duration_seconds: 0.0,
            kernel: info,
            stdout_truncated: None,
            stdout_bytes_total: None,
            stdout_bytes_omitted: None,
            warning: None,
            hint: None,
        };
        if capped.omitted > 0 {
            result.stdout_truncated = Some(true);
            result.stdout_bytes_total = Some(capped.total);
            result.stdout_bytes_omitted = Some(capped.omitted);
            if let (Some(spill), false) = (capped.spill, kernel_gone) {
                let name = format!("output-{}.txt", run.cell);
                match kernel.write_staging_file(&name, &spill).await {
                    Ok(path) => {
                        result.warning = Some(format!(
                            "Output was cut to {} bytes; the first {} bytes are in {path} inside the kernel.",
                            config.output_inline_bytes,
                            spill.len()
                        ));
                    }
                    Err(e) => tracing::warn!(error = %e, "spilling output failed"),
                }
            }
        }
        if kernel_gone {
            self.inner.registry.forget(&lease.slot, loss);
            if let Err(e) = kernel.dispose().await {
                tracing::warn!(container = %kernel.short_id(), error = %e, "disposing a finished kernel");
            }
            if status == CellStatus::Timeout || status == CellStatus::Interrupted {
                result.hint = Some(
                    "Long work can be split across cells, or run with a larger timeout.".into(),
                );
            }
        }
        self.release(&lease.slot).await;
        if let Some(durable) = lease.started.take() {
            // The catalog wrote the start while the cell ran; a caller who saw this kernel
            // is told about a later restart, even a `kill -9` right after this returns. A
            // slow or failing catalog delays a cold start by at most this bound, never fails it.
            if tokio::time::timeout(CATALOG_WAIT, durable).await.is_err() {
                tracing::warn!("the catalog did not confirm a kernel start in time");
            }
        }
        result.duration_seconds = started.elapsed().as_secs_f64();
        Ok(result)
    }

    /// Registers a running cell's interrupt token; returns its id for [`Self::untrack_running`]
    /// and where to publish whether the cell ended as interrupted.
    fn track_running(
        &self,
        owner: &Owner,
        token: &CancellationToken,
    ) -> (u64, tokio::sync::watch::Sender<Option<bool>>) {
        let id = self
            .inner
            .next_run
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (tx, rx) = tokio::sync::watch::channel(None);
        let mut running = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
        running.entry(owner.clone()).or_default().push(Run {
            id,
            token: token.clone(),
            outcome: rx,
        });
        self.inner.running_count.send_modify(|n| *n += 1);
        (id, tx)
    }

    fn untrack_running(&self, owner: &Owner, id: u64) {
        let mut running = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(runs) = running.get_mut(owner) {
            let before = runs.len();
            runs.retain(|r| r.id != id);
            let gone = before - runs.len();
            if runs.is_empty() {
                running.remove(owner);
            }
            self.inner
                .running_count
                .send_modify(|n| *n = n.saturating_sub(gone));
        }
    }

    /// Calls running now: acquiring a kernel or running a cell, whether or not their caller
    /// still waits.
    pub fn running_cells(&self) -> usize {
        *self.inner.running_count.borrow()
    }

    /// Waits until no call is running (see [`Orchestrator::running_cells`]); event-driven.
    /// Returns at once when none is.
    pub async fn wait_no_running_cells(&self) {
        let mut rx = self.inner.running_count.subscribe();
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Interrupts every running cell of a session (children included) and returns how many
    /// of them ended as `interrupted`. It waits for the cells it cancelled to settle, at most
    /// `spawn_timeout` plus [`INTERRUPT_SETTLE`] (a cell still starting its kernel sees the
    /// interrupt once the kernel is up); a cell that finished first (success or error), or
    /// that has not settled by then, is not counted.
    pub async fn interrupt(&self, tenant: Option<&str>, session: &str) -> usize {
        let tenant = tenant.unwrap_or(&self.inner.config.default_tenant);
        let outcomes: Vec<tokio::sync::watch::Receiver<Option<bool>>> = {
            let running = self.inner.running.lock().unwrap_or_else(|p| p.into_inner());
            running
                .iter()
                .filter(|(owner, _)| owner.tenant == tenant && owner.session == session)
                .flat_map(|(_, runs)| runs.iter())
                .map(|run| {
                    run.token.cancel();
                    run.outcome.clone()
                })
                .collect()
        };
        let limit = self.inner.config.spawn_timeout + INTERRUPT_SETTLE;
        let settled = outcomes.into_iter().map(|mut outcome| async move {
            match tokio::time::timeout(limit, outcome.wait_for(Option::is_some)).await {
                Ok(Ok(ended)) => *ended == Some(true),
                // Failed before it ran (the outcome was dropped unsent), or still unsettled.
                _ => false,
            }
        });
        futures::future::join_all(settled)
            .await
            .into_iter()
            .filter(|interrupted| *interrupted)
            .count()
    }

    async fn acquire(
        &self,
        key: &KernelKey,
        reset: bool,
        limits: TenantLimits,
        admission: Option<&AdmissionNotice>,
    ) -> Result<Lease, ExecuteError> {
        let inner = &self.inner;
        let mut reset = reset;
        let mut state_reset = false;
        loop {
            let attach = match inner.registry.attach(key, reset, limits) {
                Ok(attach) => attach,
                Err(Refusal::Busy { owner, max }) => {
                    let refusal = || ExecuteError::SessionBusy {
                        owner: owner.clone(),
                        max,
                    };
                    if let Some(notice) = admission {
                        notice.send(Err(refusal()));
                    }
                    return Err(refusal());
                }
                Err(Refusal::AtCapacity(full)) => {
                    let refusal = || ExecuteError::AtCapacity {
                        tenant: full.tenant.clone(),
                        cap: full.cap,
                        held: full.held,
                    };
                    if let Some(notice) = admission {
                        notice.send(Err(refusal()));
                    }
                    let error = refusal();
                    self.dispose_slots(full.victims).await;
                    return Err(error);
                }
            };
            if inner.registry.is_closed() {
                // Shutdown drained the registry; nothing new may start.
                inner.registry.forget(&attach.slot, None);
                inner.registry.release(&attach.slot);
                self.give_back_loss(key, attach.state_lost);
                if let Some(notice) = admission {
                    notice.send(Err(ExecuteError::ShuttingDown));
                }
                return Err(ExecuteError::ShuttingDown);
            }
            if let Some(notice) = admission {
                notice.send(Ok(()));
            }
            let mut doomed = attach.victims;
            if let Some(old) = attach.reset {
                state_reset = true;
                // At once, busy or not: a kernel the registry no longer counts must not
                // outlive this call (the old kernel's running cell ends).
                doomed.push(old);
            }
            self.dispose_slots(doomed).await;
            let slot = attach.slot;
            let state_lost = attach.state_lost;
            let mut reused = true;
            let spawned = slot
                .kernel
                .get_or_try_init(|| {
                    reused = false;
                    let started = Instant::now();
                    let spawn = Kernel::spawn(
                        inner.engine.clone(),
                        &inner.config,
                        &inner.labels,
                        key.clone(),
                        slot.generation,
                        inner.monitor.clone(),
                        &inner.tracker,
                    );
                    async move {
                        let result = spawn.await;
                        inner
                            .starts
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .observe(result.is_ok(), started.elapsed().as_secs_f64());
                        result
                    }
                })
                .await;
            let kernel = match spawned {
                Ok(kernel) => kernel.clone(),
                Err(e) => {
                    inner.registry.forget(&slot, None);
                    inner.registry.release(&slot);
                    self.give_back_loss(key, state_lost);
                    return Err(e.into());
                }
            };
            if inner.registry.is_closed() {
                // A spawn that finished after shutdown drained the registry: nobody else would
                // remove this kernel.
                inner.registry.forget(&slot, None);
                inner.registry.release(&slot);
                self.dispose_kernel(&kernel).await;
                self.give_back_loss(key, state_lost);
                return Err(ExecuteError::ShuttingDown);
            }
            if !inner.registry.is_registered(&slot) {
                // Cleared or reset while it started: whoever removed the slot found no kernel
                // to dispose of, so this call does, and starts over on the key's current slot.
                inner.registry.release(&slot);
                self.dispose_kernel(&kernel).await;
                self.give_back_loss(key, state_lost);
                reset = false;
                continue;
            }
            if kernel.is_alive() {
                let started = match (&inner.catalog, reused) {
                    (Some(catalog), false) => Some(catalog.record_durable(Change::Started {
                        key_hash: key.hash(),
                        tenant: key.owner.tenant.clone(),
                        owner: key.owner.to_string(),
                        generation: slot.generation,
                    })),
                    _ => None,
                };
                return Ok(Lease {
                    started,
                    slot,
                    kernel,
                    reused,
                    state_reset,
                    state_lost,
                });
            }
            // It died between cells (killed from outside, OOM from a stray thread, engine
            // restart): report the loss on this very call and start afresh.
            let reason = death_message(kernel.death().unwrap_or(Death::Crashed(-1)), 0).1;
            // Recorded in the registry, the loss comes back to this very call on the retry.
            inner.registry.forget(&slot, reason);
            if inner.registry.release(&slot) {
                self.dispose_kernel(&kernel).await;
            }
            reset = false;
        }
    }

    /// Puts back a loss an attach took for a call that then failed before reporting it.
    fn give_back_loss(&self, key: &KernelKey, loss: Option<StateLost>) {
        if let Some(loss) = loss {
            self.inner.registry.restore_loss(key, loss);
        }
    }

    async fn release(&self, slot: &Arc<Slot>) {
        if self.inner.registry.release(slot) {
            self.dispose_slots(vec![slot.clone()]).await;
        }
    }

    async fn dispose_kernel(&self, kernel: &Kernel) {
        if let Err(e) = kernel.dispose().await {
            tracing::warn!(container = %kernel.short_id(), error = %e, "disposing a kernel");
        }
    }

    async fn dispose_slots(&self, slots: Vec<Arc<Slot>>) {
        let kernels: Vec<Arc<Kernel>> = slots
            .iter()
            .filter_map(|s| s.kernel.get().cloned())
            .collect();
        // Bounded: a thousand concurrent force-removals overwhelm the engine (seen in the
        // 1000-kernel density run), while a few dozen keep it busy.
        let disposals = kernels.into_iter().map(|kernel| async move {
            if let Err(e) = kernel.dispose().await {
                tracing::warn!(container = %kernel.short_id(), error = %e, "disposing a kernel");
            }
        });
        futures::stream::iter(disposals)
            .buffer_unordered(crate::docker::REMOVAL_CONCURRENCY)
            .collect::<Vec<()>>()
            .await;
    }

    /// Disposes of every kernel of a session, its delegated children's included, at once: a
    /// cell running in one of them ends with an error saying the session was cleared.
    pub async fn clear_session(&self, tenant: Option<&str>, session: &str) -> usize {
        let tenant = tenant
            .unwrap_or(&self.inner.config.default_tenant)
            .to_string();
        let (n, slots) = self.inner.registry.remove_where(
            |o| o.tenant == tenant && o.session == session,
            None,
            false,
        );
        self.dispose_slots(slots).await;
        n
    }

    /// Evicts a session's kernels (its children's included) to make room, as the LRU cap
    /// would: the loss is reported to the session's next call as `evicted`.
    pub async fn evict_session(&self, tenant: Option<&str>, session: &str) -> usize {
        let tenant = tenant
            .unwrap_or(&self.inner.config.default_tenant)
            .to_string();
        // Only idle kernels go: a call that attached meanwhile keeps its kernel.
        let (n, slots) = self.inner.registry.remove_where(
            |o| o.tenant == tenant && o.session == session,
            Some(LossReason::Evicted),
            true,
        );
        self.dispose_slots(slots).await;
        n
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
        }
    }

    /// Disposes of a finished delegated child's kernels at once (a cell running in one ends)
    /// and unpins it.
    pub async fn release_child(&self, tenant: Option<&str>, session: &str, child: &str) -> usize {
        let tenant = tenant
            .unwrap_or(&self.inner.config.default_tenant)
            .to_string();
        if let Ok(owner) = Owner::new(&tenant, session, Some(child)) {
            self.inner.registry.release_child(&owner);
        }
        let (n, slots) = self.inner.registry.remove_where(
            |o| o.tenant == tenant && o.session == session && o.child.as_deref() == Some(child),
            None,
            false,
        );
        self.dispose_slots(slots).await;
        n
    }

    /// The live kernels, optionally of one tenant.
    pub fn list_kernels(&self, tenant: Option<&str>) -> Vec<KernelSummary> {
        let now = tokio::time::Instant::now();
        let mut list: Vec<KernelSummary> = self
            .inner
            .registry
            .slots()
            .into_iter()
            .filter(|s| tenant.is_none_or(|t| s.key.owner.tenant == t))
            .map(|s| {
                let kernel = s.kernel.get();
                KernelSummary {
                    id: kernel.map(|k| k.short_id().to_string()).unwrap_or_default(),
                    tenant: s.key.owner.tenant.clone(),
                    owner: s.key.owner.to_string(),
                    session: s.key.owner.session.clone(),
                    child: s.key.owner.child.clone(),
                    generation: s.generation,
                    state: match kernel.map(|k| k.state()) {
                        None | Some(KernelState::Starting) => "starting",
                        Some(KernelState::Idle) => "idle",
                        Some(KernelState::Busy) => "busy",
                        Some(KernelState::Dead(_)) => "dead",
                    }
                    .to_string(),
                    execution_count: kernel.map(|k| k.execution_count()).unwrap_or(0),
                    idle_seconds: now.saturating_duration_since(s.last_used()).as_secs_f64(),
                    attached: s.attached(),
                }
            })
            .collect();
        list.sort_by(|a, b| (&a.tenant, &a.owner).cmp(&(&b.tenant, &b.owner)));
        list
    }

    /// The kernel currently serving a key's owner (for tests and admin), if any.
    pub fn kernel_for(
        &self,
        tenant: Option<&str>,
        session: &str,
        child: Option<&str>,
    ) -> Option<Arc<Kernel>> {
        let owner = self.owner_of(tenant, session, child).ok()?;
        self.inner
            .registry
            .slots()
            .into_iter()
            .find(|s| s.key.owner == owner)
            .and_then(|s| s.kernel.get().cloned())
    }

    /// One reaper pass: retire idle kernels, and sweep staging volumes older than
    /// `staging_max_age` that no container uses, of this instance or of instances known dead
    /// (never a live neighbour's). Returns how many kernels were reaped.
    pub async fn reap_once(&self) -> usize {
        let slots = self.inner.registry.reap_idle();
        let n = slots.len();
        self.dispose_slots(slots).await;
        match sweep::sweep_stale_staging_of_dead(
            self.inner.engine.as_ref(),
            &self.inner.instance,
            self.inner.config.staging_max_age,
        )
        .await
        {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(volumes = removed.len(), "stale staging volumes swept");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "staging sweep failed"),
        }
        n
    }

    /// Removes staging volumes older than `staging_max_age` (any instance's) no container uses.
    pub async fn sweep_stale_staging(&self) -> Result<Vec<String>, EngineError> {
        sweep::sweep_stale_staging(
            self.inner.engine.as_ref(),
            self.inner.config.staging_max_age,
            &[],
            false,
        )
        .await
    }

    /// Removes leftovers of dead instances.
    pub async fn sweep_orphans(&self, dry_run: bool) -> Result<SweepReport, EngineError> {
        sweep::sweep_orphans(self.inner.engine.as_ref(), &self.inner.instance, dry_run).await
    }

    async fn reap_forever(&self) {
        let interval = self.inner.config.reap_interval();
        loop {
            tokio::select! {
                _ = self.inner.cancel.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            let n = self.reap_once().await;
            if n > 0 {
                tracing::info!(reaped = n, "idle kernels reaped");
            }
        }
    }

    /// Stops intake, kills every kernel, removes every container and volume of this instance,
    /// and stops the background tasks. Idempotent.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.cancel.cancel();
        let slots = inner.registry.drain();
        self.dispose_slots(slots).await;
        // Anything the registry no longer knows (a spawn racing the shutdown) goes by label.
        if let Err(e) =
            crate::watchdog::remove_instance(inner.engine.as_ref(), &inner.instance.id).await
        {
            tracing::warn!(error = %e, "final sweep of this instance failed");
        }
        if let Some(catalog) = &inner.catalog {
            // Every kernel this instance had is gone: their owners learn it after a restart.
            catalog.record(Change::AllLiveLost {
                loss: restart_loss(),
            });
            let writer = catalog.clone();
            let closed = tokio::task::spawn_blocking(move || writer.close());
            if tokio::time::timeout(Duration::from_secs(10), closed)
                .await
                .is_err()
            {
                tracing::warn!("the catalog writer did not finish within 10s");
            }
        }
        inner.tracker.close();
        let _ = tokio::time::timeout(Duration::from_secs(10), inner.tracker.wait()).await;
        let watchdog = inner
            .watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(w) = watchdog {
            let _ = tokio::task::spawn_blocking(move || w.finish()).await;
        }
    }
}

/// Upper bounds of the kernel start-time histogram, in seconds.
pub const START_BUCKETS: [f64; 10] = [0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0];

/// Kernel start times by outcome (index 0: started, 1: failed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StartStats {
    /// Per outcome: cumulative counts per bucket of [`START_BUCKETS`].
    pub buckets: [[u64; START_BUCKETS.len()]; 2],
    /// Per outcome: number of starts.
    pub count: [u64; 2],
    /// Per outcome: total seconds.
    pub sum: [f64; 2],
}

impl StartStats {
    fn observe(&mut self, ok: bool, seconds: f64) {
        let i = usize::from(!ok);
        for (b, bound) in START_BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.buckets[i][b] += 1;
            }
        }
        self.count[i] += 1;
        self.sum[i] += seconds;
    }
}

/// A snapshot of the orchestrator's lifecycle counters.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Kernel starts by outcome.
    pub starts: StartStats,
    /// Involuntary losses by reason, indexed as [`LossReason::ALL`].
    pub losses: crate::registry::LossCounts,
    /// Kernels evicted to admit new ones, by cap.
    pub evictions: EvictionCounts,
    /// Catalog changes dropped or refused (0 without a catalog).
    pub catalog_failures: u64,
}

struct Lease {
    slot: Arc<Slot>,
    kernel: Arc<Kernel>,
    reused: bool,
    state_reset: bool,
    state_lost: Option<crate::cell::StateLost>,
    /// Answers once the catalog holds this new kernel's start.
    started: Option<crate::catalog::Durable>,
}

/// How long a cold start waits for the catalog to confirm it (it writes during the cell).
const CATALOG_WAIT: Duration = Duration::from_secs(1);

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

/// The error of a cell interrupted while it waited for earlier cells of its session.
const INTERRUPTED_BEFORE_IT_RAN: &str =
    "Interrupted before it ran: the cell was waiting for an earlier cell of this session and never executed.";

/// The message and loss reason for a kernel that died under a cell.
fn death_message(death: Death, memory: i64) -> (String, Option<LossReason>) {
    const NEXT: &str = "its state was lost. The next execute_code call starts a fresh kernel.";
    match death {
        Death::Oom => (
            format!(
                "The kernel ran out of memory (limit {} MiB) and was killed; {NEXT}",
                memory / (1024 * 1024)
            ),
            Some(LossReason::Oom),
        ),
        Death::Killed => (
            format!("The kernel was killed from outside kernelbox; {NEXT}"),
            Some(LossReason::Killed),
        ),
        Death::Crashed(code) => (
            format!("The kernel died unexpectedly (exit code {code}); {NEXT}"),
            Some(LossReason::Crashed),
        ),
        Death::EngineRestarted => (
            format!("The Docker engine restarted or went away and took the kernel with it; {NEXT}"),
            Some(LossReason::EngineRestarted),
        ),
        Death::Protocol(what) => (
            format!("The kernel broke the kernelbox protocol ({what}) and was killed; {NEXT}"),
            Some(LossReason::Protocol),
        ),
        Death::Disposed => (
            format!("The kernel was shut down by kernelbox; {NEXT}"),
            None,
        ),
        Death::Exited => ("The kernel ended (sys.exit).".to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    //! The orchestrator's logic against the in-memory fake engine, in paused time: fast and
    //! deterministic. The real engine is exercised by the integration tests in `tests/`.

    use super::*;
    use crate::docker::fake::FakeEngine;

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
        let (kb, fake) = start(|c| c.max_session_kernels = 2).await;
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
        let (kb, fake) = start(|c| c.max_session_kernels = 1).await;
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
        let (kb, fake) = start(|c| c.kernel_idle_timeout = Duration::from_secs(65)).await;
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
        assert_eq!(fake.live_containers(), 0);
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
        assert_eq!(fake.live_containers(), 0);
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
            config,
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
        let (kb, _fake) = start_on(&catalog, |c| c.max_session_kernels = 1).await;
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
}
