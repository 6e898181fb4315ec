//! What a cluster node asks of its orchestrator (docs/cluster.md): whether a session has a
//! kernel here, taking over what the cluster's catalog knows of a session it claims, how many
//! session kernels live here, and the fence: every kernel gone at once when the node's lease
//! can no longer be trusted.

use std::sync::Mutex;
use std::time::Instant;

use crate::catalog::Entry;
use crate::cell::LossReason;
use crate::instance::watchdog::Watchdog;
use crate::registry::{ClusterShares, TenantLimits};

use super::Orchestrator;

impl Orchestrator {
    /// True when a kernel of `tenant`'s `session` (or of one of its delegated children) is
    /// registered on this orchestrator.
    pub fn has_session(&self, tenant: &str, session: &str) -> bool {
        self.inner.registry.has_session(tenant, session)
    }

    /// Takes what the cluster's catalog knows of a session this node claimed: its keys'
    /// generations and owed losses (`Registry::adopt`).
    pub fn adopt_session(&self, tenant: &str, session: &str, entries: Vec<Entry>) {
        self.inner.registry.adopt(tenant, session, entries);
    }

    /// Session kernels registered here (the warm pool's not counted), and the host's cap.
    pub fn session_kernels(&self) -> (usize, usize) {
        (
            self.inner.registry.len(),
            self.inner.config.kernels.max_session_kernels,
        )
    }

    /// Fair shares from now on of the cluster's capacity, counting the tenants' kernels on
    /// other nodes (`Registry::set_cluster_shares`).
    pub fn set_cluster_shares(&self, shares: ClusterShares) {
        self.inner.registry.set_cluster_shares(shares);
    }

    /// True when a new session of `tenant` fits here, at most by evicting an idle kernel of a
    /// tenant above its cluster-wide share (`Registry::room_for`).
    pub fn room_for(&self, tenant: &str, limits: TenantLimits) -> bool {
        self.inner.registry.room_for(tenant, limits)
    }

    /// Tells this instance's watchdog that its kernels may run until `until` (the node's
    /// lease trusted until then): past it, with no later time told, the watchdog kills them
    /// from outside this process (`docs/cluster.md`, "Leases and fencing"). Nothing without
    /// a watchdog.
    pub fn kernels_trusted_until(&self, until: Instant) {
        self.inner.watchdog.trust_until(until);
    }

    /// Disposes of every session kernel at once, busy or not (a running cell ends with the
    /// cleared message), each owner's next call here reporting `reason`. Returns how many
    /// went. The orchestrator keeps serving: a kernel started after the fence is a new one.
    pub async fn fence(&self, reason: LossReason) -> usize {
        let (n, slots) = self
            .inner
            .registry
            .remove_where(|_| true, Some(reason), false);
        crate::services::dispose_slots(slots).await;
        n
    }
}

/// This instance's watchdog (`crate::instance::watchdog`), when one runs: told until when the
/// node's lease is trusted, asked whether that time passed, finished at the stop.
pub(super) struct WatchdogSlot(Mutex<Option<Watchdog>>);

impl WatchdogSlot {
    pub(super) fn new(watchdog: Option<Watchdog>) -> WatchdogSlot {
        WatchdogSlot(Mutex::new(watchdog))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Watchdog>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// [`Orchestrator::kernels_trusted_until`].
    fn trust_until(&self, until: Instant) {
        if let Some(w) = self.lock().as_ref() {
            w.trust_until(until);
        }
    }

    /// Whether the last time told ([`Orchestrator::kernels_trusted_until`]) has passed: the
    /// watchdog kills, or the fence removes, this node's kernels. False without a watchdog or
    /// before any time was told.
    pub(super) fn deadline_passed(&self) -> bool {
        self.lock().as_ref().is_some_and(Watchdog::deadline_passed)
    }

    /// The watchdog, taken for the stop to finish it.
    pub(super) fn take(&self) -> Option<Watchdog> {
        self.lock().take()
    }
}
