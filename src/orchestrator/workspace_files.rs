//! A workspace's files in and out as a tar without its session's kernel (docs/workspaces.md,
//! "A workspace's files without its kernel"). A workspace a live kernel has mounted goes
//! through that kernel, as the session's file API does. Otherwise a transfer kernel is made
//! for the one transfer: the session's image and sandbox (no network, its user, read-only
//! root, its limits) with the workspace at `/work`, outside the registry (it is nobody's
//! kernel: no caps, no generation, no catalog row), disposed of when the transfer ends. The
//! files are read and written by the file helper inside that sandbox, never by the host
//! (a hostile tenant's symlinks and special files stay out of the server's reach). Transfer
//! kernels are few at once: [`MAX_TRANSFERS_PER_TENANT`] per tenant, [`MAX_TRANSFERS`] on the
//! host; one more is `429 too_many_transfers`. A transfer kernel is made, and its transfer
//! started, in work that outlives the request (`adopt.rs`): a client that goes away mid-start
//! leaves nothing behind.

use std::sync::Arc;

use super::{FileError, FileRequest, Orchestrator, Scope};
use crate::files::{ByteStream, Download, FilePath, TransferError, Written};
use crate::kernel::{Kernel, SpawnRequest};
use crate::owner::Owner;
use crate::services::{TransferSlot, MAX_TRANSFERS, MAX_TRANSFERS_PER_TENANT};

/// A transfer kernel and its count: disposed of by [`TransferKernel::finish`], or in the
/// background when dropped (a download's stream ended or was dropped); counted until it is
/// gone.
struct TransferKernel {
    /// Owns the disposal of a transfer kernel dropped.
    tracker: tokio_util::task::TaskTracker,
    kernel: Arc<Kernel>,
    slot: Option<TransferSlot>,
    /// The workspace was made for this transfer (a failed upload deletes it again).
    made: bool,
    /// Which opening of the workspace this transfer's is (`Workspaces::open`).
    opening: u64,
}

impl TransferKernel {
    /// Disposes of the kernel now.
    async fn finish(mut self) {
        let slot = self.slot.take();
        crate::services::dispose_kernel(&self.kernel).await;
        drop(slot);
    }
}

impl Drop for TransferKernel {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            let kernel = self.kernel.clone();
            self.tracker.spawn(async move {
                crate::services::dispose_kernel(&kernel).await;
                drop(slot);
            });
        }
    }
}

impl Orchestrator {
    /// The files of the workspace of the owner `scope` names, as a tar stream of its `/work`:
    /// through its live kernel, or a transfer kernel when it has none. `workspace_not_found`
    /// when the tenant has no such workspace.
    pub async fn read_workspace(&self, scope: &Scope) -> Result<Download, FileError> {
        let request = FileRequest::new(scope.clone());
        match self.read_file(&request, &FilePath::root(), true).await {
            Err(FileError::NoKernel { .. }) => {}
            other => return other,
        }
        let owner = workspace_owner(self, scope)?;
        let (me, scope, who) = (self.clone(), scope.clone(), owner.clone());
        // The transfer kernel is made and its download started even if the caller goes away
        // meanwhile: dropped then, it is removed (never half made and left).
        let started =
            crate::orchestrator::adopt::run_adopted(&self.inner.tasks.tracker, async move {
                let transfer = TransferKernel::open(&me, &scope, &who, false).await?;
                let download = transfer.kernel.read_file(&FilePath::root(), true).await?;
                Ok::<_, FileError>((transfer, download))
            })
            .await
            .unwrap_or_else(|panic| {
                Err(TransferError::Helper(format!("the download task failed: {panic}")).into())
            });
        let (transfer, download) = started?;
        let Download::Tar { body } = download else {
            return Err(TransferError::Helper("a tar was asked for".into()).into());
        };
        let (rate, grace) = (
            self.inner.config.files.download_min_rate,
            self.inner.config.files.download_rate_grace,
        );
        let files = &self.inner.services.files;
        Ok(Download::Tar {
            body: files.download(&owner, body, Box::new(transfer), rate, grace),
        })
    }

    /// Extracts the tar `body` into the workspace of the owner `scope` names (made when it
    /// has none, as a kernel of its session would make it): through its live kernel, or a
    /// transfer kernel. Nothing is left of a failed upload; past the quota, `no_space`.
    pub async fn write_workspace(
        &self,
        scope: &Scope,
        body: ByteStream,
    ) -> Result<Written, FileError> {
        let owner = workspace_owner(self, scope)?;
        let root = FilePath::root();
        if self.inner.registry.has_live(&owner) {
            return self
                .write_file(&FileRequest::new(scope.clone()), &root, true, body)
                .await;
        }
        let cap = self.inner.config.files.max_upload_bytes;
        let body = self.inner.services.files.count_upload(&owner, body);
        let (me, scope) = (self.clone(), scope.clone());
        // Runs to its end even if the caller goes away: the transfer kernel is made, the
        // helper confirms its clean-up, and the kernel is gone before the answer.
        crate::orchestrator::adopt::run_adopted(&self.inner.tasks.tracker, async move {
            let transfer = TransferKernel::open(&me, &scope, &owner, true).await?;
            let kernel = transfer.kernel.clone();
            let (made, opening) = (transfer.made, transfer.opening);
            let written = kernel.write_file(&root, true, body, cap).await;
            transfer.finish().await;
            if written.is_err() && made {
                me.inner
                    .services
                    .transfers
                    .forget_made(&owner, opening)
                    .await;
            }
            written.map_err(FileError::from)
        })
        .await
        .unwrap_or_else(|panic| {
            Err(TransferError::Helper(format!("the upload task failed: {panic}")).into())
        })
    }

    /// Deletes `tenant`'s workspace `name` (docs/workspaces.md) once its transfer kernels
    /// are gone ([`WorkspaceTransfers::delete`](crate::services::WorkspaceTransfers)).
    pub async fn delete_workspace(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<(), crate::workspace::WorkspaceError> {
        self.inner.services.transfers.delete(tenant, name).await
    }
}

/// The owner `scope` names, when its tenant has workspaces.
fn workspace_owner(orchestrator: &Orchestrator, scope: &Scope) -> Result<Owner, FileError> {
    let owner = orchestrator.owner_of_scope(scope)?;
    if orchestrator.workspace_policy(&owner.tenant).is_none() {
        return Err(crate::workspace::WorkspaceError::Disabled {
            tenant: owner.tenant.clone(),
        }
        .into());
    }
    Ok(owner)
}

impl TransferKernel {
    /// A kernel for one transfer of `owner`'s workspace (made when `create` and it has none).
    async fn open(
        orchestrator: &Orchestrator,
        scope: &Scope,
        owner: &Owner,
        create: bool,
    ) -> Result<TransferKernel, FileError> {
        let inner = &orchestrator.inner;
        if inner.tasks.cancel.is_cancelled() {
            return Err(super::ExecuteError::ShuttingDown.into());
        }
        let slot =
            inner
                .services
                .transfers
                .take(owner)
                .map_err(|_| FileError::TooManyTransfers {
                    max: MAX_TRANSFERS_PER_TENANT,
                    host: MAX_TRANSFERS,
                })?;
        let transfers = &inner.services.transfers;
        let (Some(policy), Some(workspaces)) =
            (transfers.policy(&owner.tenant), transfers.workspaces())
        else {
            return Err(crate::workspace::WorkspaceError::Disabled {
                tenant: owner.tenant.clone(),
            }
            .into());
        };
        let key = scope.kernel_key(owner.clone(), &inner.config, &inner.tenancy.load())?;
        let (uid, gid) = crate::kernel::parse_user(&inner.config.spec.sandbox.user);
        let workspace = workspaces.open(owner, &policy, uid, gid, create).await?;
        let (made, opening) = (!workspace.info.restored, workspace.opening);
        let spawned = Kernel::spawn(SpawnRequest {
            workspace: Some(workspace),
            // Generation 0: no kernel of the session is ever that one.
            owner: Some((key, 0)),
            ..orchestrator.spawn_request()
        })
        .await;
        let kernel = match spawned {
            Ok(kernel) => kernel,
            Err(e) => {
                if made {
                    inner.services.transfers.forget_made(owner, opening).await;
                }
                return Err(FileError::Execute(e.into()));
            }
        };
        Ok(TransferKernel {
            tracker: inner.tasks.tracker.clone(),
            kernel,
            slot: Some(slot),
            made,
            opening,
        })
    }
}
