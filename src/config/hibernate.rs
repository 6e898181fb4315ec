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
/// Default age past which a checkpoint is discarded (and the loss reported).
pub const DEFAULT_HIBERNATE_MAX_AGE: Duration = Duration::from_secs(24 * 3600);
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
}
