//! What the snapshots service works with (`services/mod.rs`: a service never calls the
//! orchestrator back by name): the registry, the hibernation service and the engine, given at
//! start ([`Handles`]), and, handed in with each call, the orchestrator's kernel starts and
//! releases ([`SnapshotKernels`]), which go through its admission exactly as a cell's.

use std::sync::Arc;

use super::SnapshotError;
use crate::cell::Restored;
use crate::docker::Engine;
use crate::kernel::{Kernel, SpawnRequest};
use crate::owner::KernelKey;
use crate::registry::{Registry, Slot, TenantLimits};
use crate::services::Hibernation;

/// What the service is given at start.
pub(crate) struct Handles {
    pub(crate) registry: Arc<Registry>,
    pub(crate) hibernation: Arc<Hibernation>,
    pub(crate) engine: Arc<dyn Engine>,
    /// A files-only snapshot's tar is written back through the file helper, as an upload of
    /// at most this many bytes (`FileTransfer::max_upload_bytes`).
    pub(crate) max_upload_bytes: u64,
}

/// A kernel held like a call holds it (not idle: never reaped nor evicted) until given back
/// with [`SnapshotKernels::release`].
pub(crate) struct Held {
    pub(crate) slot: Arc<Slot>,
    pub(crate) kernel: Arc<Kernel>,
    /// How it came back, when a checkpoint was restored into it.
    pub(crate) restored: Option<Restored>,
}

/// The orchestrator's side of a snapshot call, handed in with the call.
#[async_trait::async_trait]
pub(crate) trait SnapshotKernels: Send + Sync {
    /// Holds `key`'s kernel, started through admission (`limits` the tenant's) when it has
    /// none live: a checkpoint seeded for the key is restored (a snapshot's source
    /// reconnected, a fork started), else a new kernel is made. A refusal is
    /// [`SnapshotError::Refused`] with the API's code (`at_capacity`, ...).
    async fn hold(&self, key: &KernelKey, limits: TenantLimits) -> Result<Held, SnapshotError>;

    /// Gives back a kernel [`SnapshotKernels::hold`] (or the service) held.
    async fn release(&self, held: Held);

    /// Ends every kernel of `key`'s session (a failed restore's).
    async fn clear(&self, key: &KernelKey);

    /// What a new container is made with.
    fn spawn_request(&self) -> SpawnRequest<'_>;
}
