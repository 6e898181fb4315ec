//! Hibernation of idle kernels (`docs/runtimes.md`, "Hibernation"): who hibernates, and the
//! bounds on what is kept.

use std::collections::BTreeSet;
use std::time::Duration;

use super::KernelRuntime;

/// Default most hibernated kernels on the host.
pub const DEFAULT_HIBERNATE_MAX_KERNELS: usize = 256;
/// Default most hibernated kernels of one tenant.
pub const DEFAULT_HIBERNATE_MAX_PER_TENANT: usize = 32;
/// Default most bytes of checkpoints on the host's disk.
pub const DEFAULT_HIBERNATE_MAX_BYTES: u64 = 8 << 30;
/// Default most bytes of one tenant's checkpoints.
pub const DEFAULT_HIBERNATE_MAX_TENANT_BYTES: u64 = 2 << 30;
/// How long a stopping server spends hibernating its idle kernels (those of tenants that
/// hibernate) so that they survive its restart; the rest are lost as before.
pub const HIBERNATE_AT_STOP_LIMIT: Duration = Duration::from_secs(60);
/// Default age past which a checkpoint is discarded (and the loss reported).
pub const DEFAULT_HIBERNATE_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
/// How long after it hibernated every sweep leaves a hibernated kernel's stopped container,
/// whatever instance made it (`instance::sweep`): the longest `max_age` allowed.
pub const HIBERNATED_SPARED_FOR: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long the runner has to answer the host's request to hibernate.
pub const HIBERNATE_ANSWER_LIMIT: Duration = Duration::from_secs(5);
/// How long a call waits for its kernel's hibernation under way before it gives up on it.
pub const HIBERNATE_WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Hibernation: idle kernels of these tenants, on a runtime that can checkpoint (runsc),
/// are checkpointed and stopped instead of reaped, and restored by their owner's next call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HibernateConfig {
    /// Every tenant (`serve --hibernate`), or only these (the tenants file's `hibernate`).
    pub tenants: Option<BTreeSet<String>>,
    /// Most hibernated kernels on the host; past it the oldest checkpoint goes.
    pub max_kernels: usize,
    /// Most hibernated kernels of one tenant; past it the tenant's oldest goes.
    pub max_per_tenant: usize,
    /// Most bytes of checkpoints kept on disk; past it the oldest checkpoint goes.
    pub max_bytes: u64,
    /// Most bytes of one tenant's checkpoints; past it the tenant's oldest goes.
    pub max_tenant_bytes: u64,
    /// Checkpoints survive a restart of the server: kept at its stop (its idle kernels
    /// hibernated too, `restored.from: restart`) and after its death, restored after its
    /// start. Only where checkpoints go to a lasting directory (`dir`, or the state
    /// directory); otherwise they are discarded at stop as before.
    pub across_restarts: bool,
    /// Age past which a checkpoint is discarded.
    pub max_age: Duration,
    /// Where checkpoints are written (`None`: `checkpoints` in the state directory, else in
    /// the system's temporary directory); created mode 0700.
    pub dir: Option<std::path::PathBuf>,
}

impl Default for HibernateConfig {
    fn default() -> Self {
        HibernateConfig {
            tenants: None,
            max_kernels: DEFAULT_HIBERNATE_MAX_KERNELS,
            max_per_tenant: DEFAULT_HIBERNATE_MAX_PER_TENANT,
            max_bytes: DEFAULT_HIBERNATE_MAX_BYTES,
            max_tenant_bytes: DEFAULT_HIBERNATE_MAX_TENANT_BYTES,
            across_restarts: true,
            max_age: DEFAULT_HIBERNATE_MAX_AGE,
            dir: None,
        }
    }
}

impl HibernateConfig {
    /// Whether `tenant`'s idle kernels on `runtime` hibernate.
    pub fn applies(&self, tenant: &str, runtime: KernelRuntime) -> bool {
        runtime == KernelRuntime::Runsc && self.tenants.as_ref().is_none_or(|t| t.contains(tenant))
    }

    /// Where checkpoints go: `dir`, else `checkpoints` in the state directory, else a
    /// directory of this instance (`instance`) in the system's temporary directory.
    pub fn checkpoint_dir(
        &self,
        state_dir: Option<&std::path::Path>,
        instance: &str,
    ) -> std::path::PathBuf {
        match (&self.dir, state_dir) {
            (Some(dir), _) => dir.clone(),
            (None, Some(state)) => state.join("checkpoints"),
            (None, None) => std::env::temp_dir().join(format!("kernelbox-checkpoints-{instance}")),
        }
    }

    /// Whether checkpoints outlive this run of the server (`across_restarts`, and a lasting
    /// directory for them).
    pub fn lasts(&self, state_dir: Option<&std::path::Path>) -> bool {
        self.across_restarts && (self.dir.is_some() || state_dir.is_some())
    }
}
