//! Configuration: resolved and validated once ([`Config::validate`] gives a [`ValidConfig`]),
//! then passed around as a value. Its fields are grouped by who consumes them: what a kernel is
//! made from ([`KernelSpec`], `src/kernel/spawn.rs`), what one cell may do ([`CellLimits`]:
//! the orchestrator's execute path, and `src/kernel/run.rs` for the output and display caps),
//! the host's kernels ([`KernelLimits`]: the registry, the reaper, the spawn deadline), the
//! warm pool ([`PoolConfig`]), file transfers ([`FileTransfer`]: `src/kernel/files/` and the
//! orchestrator's file calls), and what this instance leaves behind ([`Housekeeping`]). Every
//! default is here.
//!
//! | file | what |
//! |---|---|
//! | `kernel.rs` | [`KernelSpec`], [`WorkMode`]: what a kernel is made from (its [`Sandbox`] and [`KernelRuntime`] are the engine's, `src/docker/sandbox.rs`) |
//! | `limits.rs` | [`CellLimits`], [`OutputCaps`], [`DisplayCaps`], [`KernelLimits`], [`PoolConfig`], [`FileTransfer`] and their defaults |
//! | `hibernate.rs` | [`HibernateConfig`]: which idle kernels hibernate, and the bounds |
//! | `snapshots.rs` | [`SnapshotConfig`]: where snapshots are kept, their bounds and age |
//! | `housekeeping.rs` | [`Housekeeping`], [`RunawayWatch`] |
//! | `file/` | the configuration file of `kernelbox serve --config` ([`file::ConfigFile`]), its schema and errors |
//! | `egress.rs` | [`EgressConfig`], [`CredentialsConfig`], held here, defined by egress (`src/egress/config.rs`) |
//! | `workspaces.rs` | [`WorkspacesConfig`], [`WorkspacePolicy`] and their defaults |
//! | `validate.rs` | [`Config::validate`], [`ValidConfig`], the errors, duration and size parsers |
//! | `tests.rs` | unit tests |

use std::collections::BTreeMap;

mod egress;
pub mod file;
mod hibernate;
mod housekeeping;
mod kernel;
mod limits;
mod snapshots;
mod validate;
mod workspaces;

pub use crate::units::{parse_bytes, parse_duration};
pub use egress::*;
pub use hibernate::*;
pub use housekeeping::*;
pub use kernel::*;
pub use limits::*;
pub use snapshots::*;
pub use validate::*;
pub use workspaces::*;

/// Everything an [`Orchestrator`](crate::Orchestrator) needs, checked once by
/// [`Config::validate`].
#[derive(Debug, Clone)]
pub struct Config {
    /// What every kernel is made from: image, working mode, confinement.
    pub spec: KernelSpec,
    /// What one cell may take: its timeout, tool calls, output and displays.
    pub cells: CellLimits,
    /// How many kernels the host runs, how long one may take to start and stay idle.
    pub kernels: KernelLimits,
    /// The warm pool: ready kernels kept for new owners, and for how long.
    pub pool: PoolConfig,
    /// File transfers in and out of kernels.
    pub files: FileTransfer,
    /// What this instance labels, sweeps, watches and keeps on disk.
    pub housekeeping: Housekeeping,
    /// Tenant recorded on kernels created by library callers that name none.
    pub default_tenant: String,
    /// Network egress by policy (`docs/reliability.md`, "Network egress"); `None`: no kernel
    /// has a network.
    pub egress: Option<EgressConfig>,
    /// Tenants whose kernels run under another runtime than the server's
    /// (`spec.sandbox.runtime`): the tenants file's `runtime` (`docs/runtimes.md`).
    pub tenant_runtimes: BTreeMap<String, KernelRuntime>,
    /// Tenants' own maximums for their sessions (the tenants file's `session_limits`): a
    /// limit below the server's default also caps a session that sets nothing
    /// (`crate::settings::Limits::ceiling`).
    pub tenant_session_limits: BTreeMap<String, crate::settings::Limits>,
    /// Workspaces: a session's `/work` kept past its kernel (`docs/workspaces.md`); `None`:
    /// no tenant has them.
    pub workspaces: Option<WorkspacesConfig>,
    /// The audit trail of what ran, for the tenants that opt in (`docs/usage.md`, "Audit
    /// trail"); `None`: none is kept.
    pub audit: Option<crate::audit::AuditConfig>,
    /// Idle kernels checkpointed instead of reaped (`docs/runtimes.md`, "Hibernation");
    /// `None`: none hibernates.
    pub hibernate: Option<HibernateConfig>,
    /// Snapshots and forks of kernels (`docs/snapshots.md`): where they are kept, their
    /// bounds.
    pub snapshots: SnapshotConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            spec: KernelSpec::default(),
            cells: CellLimits::default(),
            kernels: KernelLimits::default(),
            pool: PoolConfig::default(),
            files: FileTransfer::default(),
            housekeeping: Housekeeping::default(),
            default_tenant: "default".into(),
            egress: None,
            tenant_runtimes: BTreeMap::new(),
            tenant_session_limits: BTreeMap::new(),
            workspaces: None,
            audit: None,
            hibernate: None,
            snapshots: SnapshotConfig::default(),
        }
    }
}

impl Config {
    /// The server's own memory, CPU and idle timeout, against which a tenant's session limits
    /// are judged (`crate::settings::Limits::bounds` and `ceiling`).
    pub fn session_defaults(&self) -> crate::settings::Defaults {
        crate::settings::Defaults {
            memory_bytes: self.spec.sandbox.memory_bytes,
            nano_cpus: self.spec.sandbox.nano_cpus,
            idle_timeout: self.kernels.idle_timeout,
        }
    }
}

#[cfg(test)]
mod tests;
