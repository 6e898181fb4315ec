//! Workspace transfers, a service of the orchestrator (docs/workspaces.md, "A workspace's
//! files without its kernel"): the workspaces, and the transfer kernels running per tenant
//! and per workspace, bounded ([`MAX_TRANSFERS_PER_TENANT`], [`MAX_TRANSFERS`]). The
//! orchestrator makes a transfer kernel (`orchestrator/workspace_files.rs`) once this service
//! counted it in ([`WorkspaceTransfers::take`]); a workspace is deleted here once its transfer
//! kernels are gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::config::WorkspacePolicy;
use crate::owner::Owner;
use crate::workspace::{WorkspaceError, Workspaces};

/// Transfer kernels on the host at once. Tenants are few (a tenants file), so the per-tenant
/// cap bounds them first; this one bounds a host with many tenants.
pub const MAX_TRANSFERS: usize = 16;
/// Transfer kernels of one tenant at once.
pub const MAX_TRANSFERS_PER_TENANT: usize = 2;

/// Transfer kernels running (until their disposal ends), per tenant and per workspace.
#[derive(Debug, Default)]
struct TransferCounts {
    counts: Mutex<Counts>,
    /// Told whenever a transfer kernel is gone.
    gone: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct Counts {
    tenants: HashMap<String, usize>,
    /// By `(tenant, owner)`.
    workspaces: HashMap<(String, String), usize>,
}

/// One transfer kernel counted; uncounted when dropped.
pub(crate) struct TransferSlot {
    counts: Arc<TransferCounts>,
    tenant: String,
    owner: String,
}

impl TransferCounts {
    fn take(self: &Arc<Self>, owner: &Owner) -> Result<TransferSlot, TooManyTransfers> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = counts.tenants.values().sum();
        let mine = counts.tenants.get(&owner.tenant).copied().unwrap_or(0);
        if total >= MAX_TRANSFERS || mine >= MAX_TRANSFERS_PER_TENANT {
            return Err(TooManyTransfers);
        }
        let (tenant, name) = (owner.tenant.clone(), owner.to_string());
        *counts.tenants.entry(tenant.clone()).or_insert(0) += 1;
        *counts
            .workspaces
            .entry((tenant.clone(), name.clone()))
            .or_insert(0) += 1;
        Ok(TransferSlot {
            counts: self.clone(),
            tenant,
            owner: name,
        })
    }

    /// True while a transfer kernel of `tenant`'s workspace `name` runs or is being removed.
    fn busy(&self, tenant: &str, name: &str) -> bool {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .workspaces
            .contains_key(&(tenant.to_string(), name.to_string()))
    }
}

impl Drop for TransferSlot {
    fn drop(&mut self) {
        {
            let mut counts = self.counts.counts.lock().unwrap_or_else(|p| p.into_inner());
            let Counts {
                tenants,
                workspaces,
            } = &mut *counts;
            uncount(tenants, self.tenant.clone());
            uncount(workspaces, (self.tenant.clone(), self.owner.clone()));
        }
        self.counts.gone.notify_waiters();
    }
}

fn uncount<K: std::hash::Hash + Eq>(map: &mut HashMap<K, usize>, key: K) {
    if let Some(n) = map.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            map.remove(&key);
        }
    }
}

/// One more transfer kernel would pass [`MAX_TRANSFERS_PER_TENANT`] or [`MAX_TRANSFERS`].
#[derive(Debug)]
pub(crate) struct TooManyTransfers;

/// How long deleting a workspace waits for its transfer kernels to go.
const DELETE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The workspaces, when configured, and their transfer kernels' counts.
#[derive(Default)]
pub(crate) struct WorkspaceTransfers {
    workspaces: Option<Arc<Workspaces>>,
    counts: Arc<TransferCounts>,
}

impl WorkspaceTransfers {
    pub(crate) fn new(workspaces: Option<Arc<Workspaces>>) -> WorkspaceTransfers {
        WorkspaceTransfers {
            workspaces,
            counts: Arc::default(),
        }
    }

    /// The workspaces, when configured (`docs/workspaces.md`).
    pub(crate) fn workspaces(&self) -> Option<&Arc<Workspaces>> {
        self.workspaces.as_ref()
    }

    /// `tenant`'s workspace policy: its sessions' `/work` is a workspace.
    pub(crate) fn policy(&self, tenant: &str) -> Option<WorkspacePolicy> {
        self.workspaces.as_ref().and_then(|w| w.policy(tenant))
    }

    /// One transfer kernel of `owner`'s workspace counted in, until the slot is dropped.
    pub(crate) fn take(&self, owner: &Owner) -> Result<TransferSlot, TooManyTransfers> {
        self.counts.take(owner)
    }

    /// Deletes `owner`'s workspace made for a transfer that failed, unless anything opened it
    /// since (a kernel, another transfer): nothing is left of a failed upload, and nobody
    /// else's files are lost.
    pub(crate) async fn forget_made(&self, owner: &Owner, opening: u64) {
        let Some(workspaces) = &self.workspaces else {
            return;
        };
        if let Err(e) = workspaces.delete_unless_reopened(owner, opening).await {
            tracing::warn!(workspace = %owner, error = %e, "deleting a workspace made for a failed upload");
        }
    }

    /// Deletes `tenant`'s workspace `name` (docs/workspaces.md), once the transfer kernels
    /// that have it are gone (at most [`DELETE_WAIT`]): a delete right after a download is
    /// not refused for the download's own kernel. Refused while a session's kernel has it.
    pub(crate) async fn delete(&self, tenant: &str, name: &str) -> Result<(), WorkspaceError> {
        let Some(workspaces) = &self.workspaces else {
            return Err(WorkspaceError::Disabled {
                tenant: tenant.to_string(),
            });
        };
        let transfers = &self.counts;
        let _ = tokio::time::timeout(DELETE_WAIT, async {
            loop {
                let gone = transfers.gone.notified();
                if !transfers.busy(tenant, name) {
                    return;
                }
                gone.await;
            }
        })
        .await;
        workspaces.delete(tenant, name).await
    }
}
