//! Files in and out of an owner's kernel: write (from a byte stream, a file or a tar),
//! read (to a byte stream, a listing or a tar), list and remove; stat, mkdir and move
//! ([`FileOp`], which start the kernel as an upload does). An upload to an owner with
//! no live kernel starts one through the same acquire path as an execute (so the registry's
//! caps and fair shares apply); every other operation needs a live kernel. Each operation
//! holds its kernel as a cell does (never reaped mid-transfer; its last use is touched) and
//! runs beside a running cell. The transport is in `kernel/files/`.

use std::sync::Arc;

use super::{ExecuteError, Orchestrator, Scope};
use crate::files::{
    ByteStream, Download, FileOp, FileOpDone, FilePath, Listing, TransferError, Written,
};
use crate::kernel::Kernel;
use crate::owner::Owner;
use crate::registry::{Refusal, Slot};
use crate::telemetry::Span;

/// A file operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The path, the content or the transfer failed (see [`TransferError`]).
    #[error(transparent)]
    Transfer(#[from] TransferError),
    /// The owner has no live kernel (files live and die with it).
    #[error("{owner} has no live kernel (files live and die with the session's kernel)")]
    NoKernel {
        /// Whose kernel was asked for (`session` or `session::child::child`).
        owner: String,
    },
    /// Getting a kernel for an upload failed (names, caps, shutdown, spawn).
    #[error(transparent)]
    Execute(#[from] ExecuteError),
    /// The workspace asked for is not there, or the tenant has none
    /// (`workspace_files.rs`).
    #[error(transparent)]
    Workspace(#[from] crate::workspace::WorkspaceError),
    /// Too many workspace transfers without a kernel run at once (`workspace_files.rs`).
    #[error(
        "too many workspace transfers at once (at most {max} per tenant, {host} on the host); \
         retry, or go through the session's kernel"
    )]
    TooManyTransfers {
        /// Per tenant.
        max: usize,
        /// On the host.
        host: usize,
    },
}

fn refused(code: &'static str, message: String) -> FileError {
    FileError::Transfer(TransferError::Refused { code, message })
}

/// Whose kernel a file operation addresses, and how a kernel an upload starts is made: a
/// [`Scope`], as an [`ExecuteRequest`](super::ExecuteRequest) names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileRequest {
    /// Whose kernel; its tools, tenant limits and image are those of a kernel an upload
    /// starts (as for an execute).
    pub scope: Scope,
}

impl FileRequest {
    /// A request for the kernel `scope` names: a session's name (its own kernel under the
    /// default tenant) or a [`Scope`].
    pub fn new(scope: impl Into<Scope>) -> FileRequest {
        FileRequest {
            scope: scope.into(),
        }
    }

    /// A request for a session's own kernel under the default tenant.
    pub fn session(session: impl Into<String>) -> FileRequest {
        FileRequest::new(Scope::session(session))
    }
}

impl From<Scope> for FileRequest {
    fn from(scope: Scope) -> FileRequest {
        FileRequest { scope }
    }
}

/// A kernel held for a file operation; released (its last use touched) when dropped.
pub(super) struct Hold {
    orchestrator: Orchestrator,
    slot: Arc<Slot>,
}

impl Hold {
    /// Which kernel of its key the held one is.
    pub(super) fn generation(&self) -> u64 {
        self.slot.generation()
    }

    pub(super) fn kernel(&self) -> Result<Arc<Kernel>, FileError> {
        self.slot
            .kernel
            .get()
            .cloned()
            .ok_or_else(|| FileError::NoKernel {
                owner: self.slot.key.owner.to_string(),
            })
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.orchestrator.inner.registry.release(&self.slot) {
            // Cleared while the transfer ran: the last one out disposes of the kernel.
            let slot = self.slot.clone();
            self.orchestrator
                .inner
                .tasks
                .tracker
                .spawn(async move { crate::services::dispose_slots(vec![slot]).await });
        }
    }
}

impl Hold {
    /// Holds the owner's live kernel; [`FileError::NoKernel`] when it has none.
    fn live(orchestrator: &Orchestrator, owner: &Owner) -> Result<Hold, FileError> {
        let inner = &orchestrator.inner;
        if inner.tasks.cancel.is_cancelled() {
            return Err(ExecuteError::ShuttingDown.into());
        }
        match inner.registry.attach_live(owner) {
            Ok(Some(slot)) => Ok(Hold {
                orchestrator: orchestrator.clone(),
                slot,
            }),
            Ok(None) => Err(FileError::NoKernel {
                owner: owner.to_string(),
            }),
            Err(Refusal::Busy { owner, max }) => {
                Err(ExecuteError::SessionBusy { owner, max }.into())
            }
            Err(Refusal::AtCapacity(_)) => Err(FileError::Transfer(TransferError::Helper(
                "unexpected refusal".into(),
            ))),
        }
    }

    /// Holds the owner's live kernel, restored first when it hibernated
    /// (`services/hibernation/`): its files are the kernel's; [`FileError::NoKernel`] when it
    /// has neither.
    async fn awake(
        orchestrator: &Orchestrator,
        request: &FileRequest,
        owner: &Owner,
    ) -> Result<Hold, FileError> {
        match Hold::live(orchestrator, owner) {
            Err(FileError::NoKernel { .. }) => {}
            other => return other,
        }
        let inner = &orchestrator.inner;
        let key = request
            .scope
            .kernel_key(owner.clone(), &inner.config, &inner.tenancy.load())?;
        if !inner.registry.is_hibernated(&key) {
            return Err(FileError::NoKernel {
                owner: owner.to_string(),
            });
        }
        Hold::or_start(orchestrator, request, owner).await
    }

    /// Holds the owner's live kernel, starting one (as an execute would) when it has none.
    pub(super) async fn or_start(
        orchestrator: &Orchestrator,
        request: &FileRequest,
        owner: &Owner,
    ) -> Result<Hold, FileError> {
        match Hold::live(orchestrator, owner) {
            Err(FileError::NoKernel { .. }) => {}
            other => return other,
        }
        let inner = &orchestrator.inner;
        let scope = &request.scope;
        let key = scope.kernel_key(owner.clone(), &inner.config, &inner.tenancy.load())?;
        let mut lease = orchestrator
            .acquire(&key, false, scope.tenant_limits, None)
            .await?;
        // As for a cold start by an execute: a caller who saw this kernel is told about a
        // later restart.
        lease.confirm_start().await;
        Ok(Hold {
            orchestrator: orchestrator.clone(),
            slot: lease.slot.clone(),
        })
    }
}

/// Whose kernel a file request addresses.
fn file_owner(orchestrator: &Orchestrator, request: &FileRequest) -> Result<Owner, FileError> {
    orchestrator
        .owner_of_scope(&request.scope)
        .map_err(FileError::Execute)
}

impl Orchestrator {
    /// Writes `body` to `path` in the owner's kernel (parents created), starting the kernel
    /// when it has none; with `tar`, `path` is a directory and `body` a tar archive of regular
    /// files and directories extracted there. Capped at `Config::files.max_upload_bytes`; on any
    /// failure nothing is left.
    pub async fn write_file(
        &self,
        request: &FileRequest,
        path: &FilePath,
        tar: bool,
        body: ByteStream,
    ) -> Result<Written, FileError> {
        let span = Span::start("file_transfer");
        span.set("kernelbox.file.direction", "upload");
        span.set("kernelbox.file.tar", tar);
        let written = span
            .within(write_traced(self, request, path, tar, body))
            .await;
        match &written {
            Ok(written) => span.set("kernelbox.file.bytes", written.size as i64),
            Err(e) => span.fail(e.to_string()),
        }
        written
    }

    /// Reads `path` in the owner's live kernel: a file's bytes, a directory's listing, or
    /// with `tar` a directory as a tar stream. The kernel is held until the stream ends or
    /// is dropped.
    pub async fn read_file(
        &self,
        request: &FileRequest,
        path: &FilePath,
        tar: bool,
    ) -> Result<Download, FileError> {
        let span = Span::start("file_transfer");
        span.set("kernelbox.file.direction", "download");
        span.set("kernelbox.file.tar", tar);
        let read = span.within(read_traced(self, request, path, tar)).await;
        match &read {
            // The span ends when the download starts: the size is the file's.
            Ok(Download::File { size, .. }) => span.set("kernelbox.file.bytes", *size as i64),
            Ok(_) => {}
            Err(e) => span.fail(e.to_string()),
        }
        read
    }

    /// Lists a directory of the owner's live kernel.
    pub async fn list_files(
        &self,
        request: &FileRequest,
        path: &FilePath,
    ) -> Result<Listing, FileError> {
        match read_traced(self, request, path, false).await? {
            Download::Dir(listing) => Ok(listing),
            _ => Err(refused(
                "not_a_directory",
                format!("{path} is not a directory"),
            )),
        }
    }

    /// Runs `op` (stat, mkdir, move) on `path` in the owner's kernel, starting the kernel
    /// when it has none, as an upload does (the E2B API's filesystem, docs/e2b.md: a sandbox's
    /// files are there from its creation).
    pub async fn manage_file(
        &self,
        request: &FileRequest,
        path: &FilePath,
        op: FileOp,
    ) -> Result<FileOpDone, FileError> {
        if path.is_root() && matches!(op, FileOp::Move(_)) {
            return Err(refused(
                "invalid_path",
                "the working directory itself cannot be moved".into(),
            ));
        }
        let owner = file_owner(self, request)?;
        let hold = Hold::or_start(self, request, &owner).await?;
        Ok(hold.kernel()?.manage_file(path, &op).await?)
    }

    /// Removes a file or a directory tree from the owner's live kernel.
    pub async fn remove_file(
        &self,
        request: &FileRequest,
        path: &FilePath,
    ) -> Result<(), FileError> {
        if path.is_root() {
            return Err(refused(
                "invalid_path",
                "the working directory itself cannot be removed".into(),
            ));
        }
        let owner = file_owner(self, request)?;
        let hold = Hold::awake(self, request, &owner).await?;
        Ok(hold.kernel()?.remove_file(path).await?)
    }
}

/// [`Orchestrator::write_file`] in its span.
async fn write_traced(
    orchestrator: &Orchestrator,
    request: &FileRequest,
    path: &FilePath,
    tar: bool,
    body: ByteStream,
) -> Result<Written, FileError> {
    if !tar && path.is_root() {
        return Err(refused(
            "is_a_directory",
            "the working directory itself is a directory".into(),
        ));
    }
    let owner = file_owner(orchestrator, request)?;
    let hold = Hold::or_start(orchestrator, request, &owner).await?;
    let kernel = hold.kernel()?;
    let cap = orchestrator.inner.config.files.max_upload_bytes;
    let body = orchestrator.inner.services.files.count_upload(&owner, body);
    let slot = hold.slot.clone();
    let path = path.clone();
    // Runs to its end even if the caller goes away (a client cut mid-body): the helper
    // confirms its clean-up before the kernel is released.
    let upload = crate::telemetry::carry(async move {
        let written = kernel.write_file(&path, tar, body, cap).await;
        drop(hold);
        written
    });
    let written =
        crate::orchestrator::adopt::run_adopted(&orchestrator.inner.tasks.tracker, upload)
            .await
            .unwrap_or_else(|panic| {
                Err(TransferError::Helper(format!(
                    "the upload task failed: {panic}"
                )))
            });
    match written {
        // The kernel went (the session deleted or reset, evicted, shut down) while the
        // upload ran: that, not the helper's broken pipe or its channel's reset socket, is
        // what the caller is told.
        Err(TransferError::Helper(_) | TransferError::Engine(_))
            if !orchestrator.inner.registry.is_registered(&slot) =>
        {
            Err(FileError::NoKernel {
                owner: owner.to_string(),
            })
        }
        other => other.map_err(FileError::from),
    }
}

/// [`Orchestrator::read_file`] in its span.
async fn read_traced(
    orchestrator: &Orchestrator,
    request: &FileRequest,
    path: &FilePath,
    tar: bool,
) -> Result<Download, FileError> {
    let owner = file_owner(orchestrator, request)?;
    let hold = Hold::awake(orchestrator, request, &owner).await?;
    let kernel = hold.kernel()?;
    let (rate, grace) = (
        orchestrator.inner.config.files.download_min_rate,
        orchestrator.inner.config.files.download_rate_grace,
    );
    let files = &orchestrator.inner.services.files;
    let held = |body| files.download(&owner, body, Box::new(hold), rate, grace);
    Ok(match kernel.read_file(path, tar).await? {
        Download::File { size, body } => Download::File {
            size,
            body: held(body),
        },
        Download::Tar { body } => Download::Tar { body: held(body) },
        dir => dir,
    })
}
