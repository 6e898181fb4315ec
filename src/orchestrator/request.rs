//! What callers hand the orchestrator and get back: requests, errors, kernel summaries and
//! lifecycle counters.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use crate::wire::KernelSummary;

use tokio_util::sync::CancellationToken;

use crate::authority::ToolDispatcher;
use crate::catalog::CatalogError;
use crate::docker::EngineError;
use crate::histogram::Histogram;
use crate::kernel::{KernelError, OutputSink};
use crate::owner::{KernelKey, NameError, Owner};
use crate::registry::{Cap, EvictionCounts, LossCounts, TenantLimits};
use crate::rich::DisplaySink;
use crate::wire::{Context, Language};

/// Whose kernel a request addresses, and how a kernel it starts is made: the part of an
/// [`ExecuteRequest`] and a [`FileRequest`](super::FileRequest) that names the owner and the
/// kernel's key (`docs/architecture.md`, "Lifecycle of a kernel"). A session's own kernel
/// under the default tenant is `Scope::session("s")` (or just `"s"` where a scope is taken);
/// the builders name the rest: `Scope::session("s").tenant("acme").child("helper")`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// Tenant namespace (the configured default when `None`).
    pub tenant: Option<String>,
    /// The conversation whose kernel it is.
    pub session: String,
    /// The session's delegated child whose own kernel is meant, if any.
    pub child: Option<String>,
    /// Tools the kernel's cells may call (part of the kernel key).
    pub tools: BTreeSet<String>,
    /// The tenant's own cap and reservation, for a kernel the request starts (the fairness
    /// rule is in `src/registry/admission.rs`).
    pub tenant_limits: TenantLimits,
    /// The image a new kernel runs (part of the kernel key; `None`: [`Config::image`]).
    ///
    /// [`Config::image`]: crate::Config::image
    pub image: Option<String>,
    /// The session's kernel meant: its context (a name and a language; part of the kernel
    /// key). The default: the session's Python kernel.
    pub context: Context,
}

impl Scope {
    /// A session's own kernel under the default tenant, with no tools and the configured
    /// image.
    pub fn session(session: impl Into<String>) -> Scope {
        Scope {
            session: session.into(),
            ..Scope::default()
        }
    }

    /// The same, under `tenant`.
    pub fn tenant(self, tenant: impl Into<String>) -> Scope {
        Scope {
            tenant: Some(tenant.into()),
            ..self
        }
    }

    /// The same, for the session's delegated `child`.
    pub fn child(self, child: impl Into<String>) -> Scope {
        Scope {
            child: Some(child.into()),
            ..self
        }
    }

    /// The same, its cells allowed `tools`.
    pub fn tools<I: IntoIterator<Item = S>, S: Into<String>>(self, tools: I) -> Scope {
        Scope {
            tools: tools.into_iter().map(Into::into).collect(),
            ..self
        }
    }

    /// The same, a new kernel running `image`.
    pub fn image(self, image: impl Into<String>) -> Scope {
        Scope {
            image: Some(image.into()),
            ..self
        }
    }

    /// The same, in the default context of `language` (`docs/contract.md`, "Languages").
    pub fn language(self, language: Language) -> Scope {
        Scope {
            context: Context::of(language),
            ..self
        }
    }

    /// The same, under the tenant's `limits`.
    pub fn tenant_limits(self, limits: TenantLimits) -> Scope {
        Scope {
            tenant_limits: limits,
            ..self
        }
    }
}

impl Scope {
    /// The owner this scope names, its tenant the configured default when it names none.
    pub(crate) fn owner(&self, config: &crate::config::Config) -> Result<Owner, NameError> {
        owner_of(
            config,
            self.tenant.as_deref(),
            &self.session,
            self.child.as_deref(),
        )
    }

    /// The key of `owner`'s kernel as this scope makes it: the configured mode, the image it
    /// names (else `Config::image`) and its tools.
    pub(crate) fn kernel_key(
        &self,
        owner: Owner,
        config: &crate::config::Config,
        policies: &crate::tenancy::TenantPolicies,
    ) -> Result<KernelKey, ExecuteError> {
        let image = match self.image.as_deref() {
            None => config.spec.image.clone(),
            Some(image) if image.trim().is_empty() => {
                return Err(ExecuteError::Invalid("image must not be empty".into()))
            }
            Some(image) => image.to_string(),
        };
        self.context
            .language
            .check_served()
            .map_err(|e| ExecuteError::Invalid(e.to_string()))?;
        crate::owner::validate_name("context", &self.context.name)?;
        Ok(KernelKey {
            // The tenant's runtime as now (a reload may change it: `crate::tenancy`).
            runtime: policies.runtime_of(&owner.tenant, config.spec.sandbox.runtime),
            owner,
            mode: config.spec.mode.clone(),
            image,
            tools: self.tools.clone(),
            context: self.context.clone(),
        })
    }
}

/// The owner `tenant` (the configured default when `None`), `session` and `child` name.
pub(crate) fn owner_of(
    config: &crate::config::Config,
    tenant: Option<&str>,
    session: &str,
    child: Option<&str>,
) -> Result<Owner, NameError> {
    Owner::new(tenant.unwrap_or(&config.default_tenant), session, child)
}

impl From<&str> for Scope {
    fn from(session: &str) -> Scope {
        Scope::session(session)
    }
}

impl From<String> for Scope {
    fn from(session: String) -> Scope {
        Scope::session(session)
    }
}

impl From<&String> for Scope {
    fn from(session: &String) -> Scope {
        Scope::session(session.as_str())
    }
}

/// One execute call.
#[derive(Clone, Default)]
pub struct ExecuteRequest {
    /// Whose kernel runs the cell, and how a kernel the call starts is made.
    pub scope: Scope,
    /// The turn; changes every turn and never keys a kernel.
    pub task_id: Option<String>,
    /// Python source of the cell.
    pub code: String,
    /// Discard the kernel and run in a fresh one.
    pub reset: bool,
    /// Cell timeout (the configured default when `None`).
    pub timeout: Option<Duration>,
    /// Where tool calls go.
    pub dispatcher: Option<Arc<dyn ToolDispatcher>>,
    /// Cancelling it interrupts the cell: KeyboardInterrupt, the kernel kept unless the cell
    /// outlives the interrupt grace (docs/contract.md, "How an interrupt works").
    pub cancel: Option<CancellationToken>,
    /// Receives output live.
    pub sink: Option<OutputSink>,
    /// Receives each rich result live, in order with the output given to `sink`.
    pub display_sink: Option<DisplaySink>,
}

type AdmissionSender = tokio::sync::oneshot::Sender<Result<(), ExecuteError>>;

/// Told, once, whether an execute got a kernel slot or was refused at a cap, before any
/// kernel starts ([`Orchestrator::execute_with_admission`]: the HTTP layer answers 429 instead
/// of starting a stream); cloning shares the one notice.
///
/// [`Orchestrator::execute_with_admission`]: super::Orchestrator::execute_with_admission
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

    pub(super) fn send(&self, outcome: Result<(), ExecuteError>) {
        let tx = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = tx {
            let _ = tx.send(outcome);
        }
    }
}

impl std::fmt::Debug for ExecuteRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecuteRequest")
            .field("scope", &self.scope)
            .field("reset", &self.reset)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ExecuteRequest {
    /// A request to run `code` in `scope`'s kernel: a session's name (its own kernel under
    /// the default tenant) or a [`Scope`].
    pub fn new(scope: impl Into<Scope>, code: impl Into<String>) -> ExecuteRequest {
        ExecuteRequest {
            scope: scope.into(),
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
    /// An engine call failed (the error names the operation).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The orchestrator is shutting down.
    #[error("kernelbox is shutting down")]
    ShuttingDown,
    /// A reload of the tenants removed the call's tenant while its kernel started
    /// (`docs/http-api.md`, "Reloading the tenants"): no kernel is left for it.
    #[error("the tenant was removed while its kernel started")]
    TenantRemoved,
    /// A new kernel would pass a cap, and no kernel may be evicted to make room.
    #[error("{}", at_capacity_message(.tenant, .cap, *.held))]
    AtCapacity {
        /// The tenant whose request was refused.
        tenant: String,
        /// The cap that refused it.
        cap: Cap,
        /// Kernels the tenant held, as that cap counts them.
        held: usize,
    },
    /// The session's kernel already has this many calls attached (one running, the others
    /// queued behind it); one more is refused rather than queued.
    #[error("{}", crate::cell::messages::session_busy_message(.owner, *.max))]
    SessionBusy {
        /// The owner (session, or `session::child::child`).
        owner: String,
        /// The bound ([`MAX_ATTACHED_PER_SLOT`](crate::MAX_ATTACHED_PER_SLOT)).
        max: usize,
    },
    /// A bug in kernelbox: the task running the cell failed.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ExecuteError {
    /// The error's stable code in an answer (`docs/http-api.md`): what the server answers it
    /// with, and what a fork that failed on it says (`docs/snapshots.md`).
    pub fn code(&self) -> &'static str {
        use crate::workspace::WorkspaceError;
        match self {
            ExecuteError::Invalid(_) => "invalid_request",
            ExecuteError::InvalidTimeout(_) => "invalid_timeout",
            ExecuteError::Name(_) => "invalid_name",
            ExecuteError::Kernel(KernelError::Workspace(WorkspaceError::TooMany { .. })) => {
                "too_many_workspaces"
            }
            ExecuteError::Kernel(KernelError::Workspace(WorkspaceError::HostFull { .. })) => {
                "workspaces_full"
            }
            ExecuteError::Kernel(_) => "kernel_unavailable",
            ExecuteError::Engine(_) => "engine_unavailable",
            ExecuteError::ShuttingDown => "shutting_down",
            ExecuteError::TenantRemoved => "unauthorized",
            ExecuteError::AtCapacity { .. } => "at_capacity",
            ExecuteError::SessionBusy { .. } => "session_busy",
            ExecuteError::Internal(_) => "internal",
        }
    }
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
    /// Network egress could not be set up.
    #[error("network egress: {0}")]
    Egress(#[from] crate::egress::EgressError),
    /// A runtime some kernel would run under is not registered with the engine
    /// (`docs/runtimes.md`).
    #[error("kernel runtime {runtime}: the engine has no runtime of that name (it has: {registered}); register it (for runsc, `bash .ci/runsc`; docs/runtimes.md)")]
    RuntimeMissing {
        /// The runtime configured (`--runtime`, a tenant's `runtime`).
        runtime: String,
        /// The runtimes the engine has.
        registered: String,
    },
    /// The workspaces' directory could not be made (`docs/workspaces.md`).
    #[error(transparent)]
    Workspace(#[from] crate::workspace::WorkspaceError),
    /// The audit trail could not be opened (`docs/usage.md`, "Audit trail").
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    /// The watchdog process could not be started.
    #[error("starting the watchdog {path}: {source}")]
    Watchdog {
        /// The binary started as the watchdog (`Config::watchdog`).
        path: String,
        /// Why spawning it failed.
        source: std::io::Error,
    },
}

/// Upper bounds of the kernel start-time histogram, in seconds.
pub const START_BUCKETS: [f64; 10] = [0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0];

/// Kernel start times by outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct StartStats {
    /// Starts that brought a kernel up.
    pub started: Histogram,
    /// Starts that failed.
    pub failed: Histogram,
}

impl Default for StartStats {
    fn default() -> Self {
        StartStats {
            started: Histogram::new(&START_BUCKETS),
            failed: Histogram::new(&START_BUCKETS),
        }
    }
}

impl StartStats {
    pub(super) fn observe(&mut self, ok: bool, seconds: f64) {
        if ok {
            self.started.observe(seconds);
        } else {
            self.failed.observe(seconds);
        }
    }
}

/// A snapshot of the orchestrator's lifecycle counters.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// Kernel starts by outcome.
    pub starts: StartStats,
    /// Involuntary losses by reason, indexed as [`LossReason::ALL`](crate::cell::LossReason::ALL).
    pub losses: LossCounts,
    /// Kernels evicted to admit new ones, by cap.
    pub evictions: EvictionCounts,
    /// Catalog changes dropped or refused (0 without a catalog).
    pub catalog_failures: u64,
    /// The warm pool's size, ready kernels, takes and refills.
    pub pool: super::PoolStats,
    /// File bytes moved in and out of kernels.
    pub file_bytes: crate::services::FileBytes,
    /// What the audit trail dropped, cut or rotated out (zeros without a trail).
    pub audit: crate::audit::AuditStats,
}

/// Per-tenant counters for metrics (`docs/usage.md`, "Per-tenant metrics"), by label value: a
/// tenant's name, or [`OTHER_TENANTS`](crate::usage::OTHER_TENANTS) past the cap.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantStats {
    /// Cells, new kernels and losses.
    pub counts: BTreeMap<String, crate::usage::TenantCounts>,
    /// Kernels registered now (starting, idle or busy).
    pub live: BTreeMap<String, usize>,
}
