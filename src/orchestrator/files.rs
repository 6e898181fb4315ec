//! Files in and out of an owner's kernel: write (from a byte stream, a file or a tar),
//! read (to a byte stream, a listing or a tar), list and remove; stat, mkdir and move
//! ([`FileOp`], which start the kernel as an upload does). An upload to an owner with
//! no live kernel starts one through the same acquire path as an execute (so the registry's
//! caps and fair shares apply); every other operation needs a live kernel. Each operation
//! holds its kernel as a cell does (never reaped mid-transfer; its last use is touched) and
//! runs beside a running cell. The transport is in `kernel/files/`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};

use super::{ExecuteError, FileBytes, Orchestrator, Scope};
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

impl Orchestrator {
    fn file_owner(&self, request: &FileRequest) -> Result<Owner, FileError> {
        request
            .scope
            .owner(&self.inner.config)
            .map_err(|e| FileError::Execute(ExecuteError::Name(e)))
    }

    /// Holds the owner's live kernel; [`FileError::NoKernel`] when it has none.
    fn hold_live(&self, owner: &Owner) -> Result<Hold, FileError> {
        if self.inner.tasks.cancel.is_cancelled() {
            return Err(ExecuteError::ShuttingDown.into());
        }
        match self.inner.registry.attach_live(owner) {
            Ok(Some(slot)) => Ok(Hold {
                orchestrator: self.clone(),
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

    /// Holds the owner's live kernel, restored first when it hibernated (`services/hibernation/`): its
    /// files are the kernel's; [`FileError::NoKernel`] when it has neither.
    async fn hold_awake(&self, request: &FileRequest, owner: &Owner) -> Result<Hold, FileError> {
        match self.hold_live(owner) {
            Err(FileError::NoKernel { .. }) => {}
            other => return other,
        }
        let key = request.scope.kernel_key(
            owner.clone(),
            &self.inner.config,
            &self.inner.tenancy.load(),
        )?;
        if !self.inner.registry.is_hibernated(&key) {
            return Err(FileError::NoKernel {
                owner: owner.to_string(),
            });
        }
        self.hold_or_start(request, owner).await
    }

    /// Holds the owner's live kernel, starting one (as an execute would) when it has none.
    pub(super) async fn hold_or_start(
        &self,
        request: &FileRequest,
        owner: &Owner,
    ) -> Result<Hold, FileError> {
        match self.hold_live(owner) {
            Err(FileError::NoKernel { .. }) => {}
            other => return other,
        }
        let scope = &request.scope;
        let key = scope.kernel_key(
            owner.clone(),
            &self.inner.config,
            &self.inner.tenancy.load(),
        )?;
        let mut lease = self.acquire(&key, false, scope.tenant_limits, None).await?;
        // As for a cold start by an execute: a caller who saw this kernel is told about a
        // later restart.
        lease.confirm_start().await;
        Ok(Hold {
            orchestrator: self.clone(),
            slot: lease.slot.clone(),
        })
    }

    /// `body`, its bytes counted as `owner`'s upload (metrics and the usage ledger).
    pub(super) fn count_upload(&self, owner: &Owner, body: ByteStream) -> ByteStream {
        let counters = self.inner.file_bytes.clone();
        let ledger = self.inner.services.usage.pending().clone();
        let (tenant, session) = (owner.tenant.clone(), owner.session.clone());
        body.inspect_ok(move |chunk| {
            counters.uploaded(chunk.len());
            ledger.record(&tenant, &session, |r| r.file_bytes_in += chunk.len() as u64);
        })
        .boxed()
    }

    /// `body`, its bytes counted as `owner`'s download (metrics and the usage ledger).
    pub(super) fn count_download(
        &self,
        owner: &Owner,
        body: crate::files::DownloadStream,
    ) -> crate::files::DownloadStream {
        let counters = self.inner.file_bytes.clone();
        let ledger = self.inner.services.usage.pending().clone();
        let (tenant, session) = (owner.tenant.clone(), owner.session.clone());
        body.inspect_ok(move |chunk| {
            counters.downloaded(chunk.len());
            ledger.record(&tenant, &session, |r| {
                r.file_bytes_out += chunk.len() as u64;
            });
        })
        .boxed()
    }

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
            .within(self.write_file_traced(request, path, tar, body))
            .await;
        match &written {
            Ok(written) => span.set("kernelbox.file.bytes", written.size as i64),
            Err(e) => span.fail(e.to_string()),
        }
        written
    }

    async fn write_file_traced(
        &self,
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
        let owner = self.file_owner(request)?;
        let hold = self.hold_or_start(request, &owner).await?;
        let kernel = hold.kernel()?;
        let cap = self.inner.config.files.max_upload_bytes;
        let body = self.count_upload(&owner, body);
        let slot = hold.slot.clone();
        let path = path.clone();
        // Runs to its end even if the caller goes away (a client cut mid-body): the helper
        // confirms its clean-up before the kernel is released.
        let upload = crate::telemetry::carry(async move {
            let written = kernel.write_file(&path, tar, body, cap).await;
            drop(hold);
            written
        });
        let written = crate::orchestrator::adopt::run_adopted(&self.inner.tasks.tracker, upload)
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
                if !self.inner.registry.is_registered(&slot) =>
            {
                Err(FileError::NoKernel {
                    owner: owner.to_string(),
                })
            }
            other => other.map_err(FileError::from),
        }
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
        let read = span.within(self.read_file_traced(request, path, tar)).await;
        match &read {
            // The span ends when the download starts: the size is the file's.
            Ok(Download::File { size, .. }) => span.set("kernelbox.file.bytes", *size as i64),
            Ok(_) => {}
            Err(e) => span.fail(e.to_string()),
        }
        read
    }

    async fn read_file_traced(
        &self,
        request: &FileRequest,
        path: &FilePath,
        tar: bool,
    ) -> Result<Download, FileError> {
        let owner = self.file_owner(request)?;
        let hold = self.hold_awake(request, &owner).await?;
        let kernel = hold.kernel()?;
        let (rate, grace) = (
            self.inner.config.files.download_min_rate,
            self.inner.config.files.download_rate_grace,
        );
        let held = |body: crate::files::DownloadStream| {
            let body = self.slow_cut(body, Box::new(hold), rate, grace);
            self.count_download(&owner, body)
        };
        Ok(match kernel.read_file(path, tar).await? {
            Download::File { size, body } => Download::File {
                size,
                body: held(body),
            },
            Download::Tar { body } => Download::Tar { body: held(body) },
            dir => dir,
        })
    }

    /// Lists a directory of the owner's live kernel.
    pub async fn list_files(
        &self,
        request: &FileRequest,
        path: &FilePath,
    ) -> Result<Listing, FileError> {
        match self.read_file_traced(request, path, false).await? {
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
        let owner = self.file_owner(request)?;
        let hold = self.hold_or_start(request, &owner).await?;
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
        let owner = self.file_owner(request)?;
        let hold = self.hold_awake(request, &owner).await?;
        Ok(hold.kernel()?.remove_file(path).await?)
    }
}

/// The counters behind [`FileBytes`]: every byte an upload's body yields and every byte a
/// download's reader takes, counted as it passes.
#[derive(Debug, Default)]
pub(super) struct FileCounters {
    upload: AtomicU64,
    download: AtomicU64,
}

impl FileCounters {
    fn uploaded(&self, n: usize) {
        self.upload.fetch_add(n as u64, Ordering::Relaxed);
    }

    fn downloaded(&self, n: usize) {
        self.download.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(super) fn snapshot(&self) -> FileBytes {
        FileBytes {
            upload: self.upload.load(Ordering::Relaxed),
            download: self.download.load(Ordering::Relaxed),
        }
    }
}

/// A download's stream and the kernel hold it keeps, shared with its rate watchdog.
/// What a download keeps until it ends: the kernel held (a registry slot, or a transfer
/// kernel of `workspace_files.rs`).
type Guard = Box<dyn Send>;

type Held = std::sync::Mutex<Option<(crate::files::DownloadStream, Guard)>>;

/// A download's stream holding its kernel, cut (the stream and the hold dropped; the reader
/// then gets an error) when, `grace` after it started, it has been read slower than `rate`
/// bytes/s on average, or when the orchestrator shuts down. A timer task owned by the
/// orchestrator's tracker keeps the clock, so a reader hyper no longer polls (its socket
/// full) is cut all the same. A reader that stops reading altogether is also cut by the
/// server's send timeout (`server::Limits::send_timeout`).
impl Orchestrator {
    pub(super) fn slow_cut(
        &self,
        body: crate::files::DownloadStream,
        hold: Guard,
        rate: u64,
        grace: std::time::Duration,
    ) -> crate::files::DownloadStream {
        use std::task::Poll;
        let held: Arc<Held> = Arc::new(std::sync::Mutex::new(Some((body, hold))));
        let sent = Arc::new(AtomicU64::new(0));
        let done = tokio_util::sync::CancellationToken::new();
        let started = tokio::time::Instant::now();
        {
            let (held, sent, done) = (held.clone(), sent.clone(), done.clone());
            let shutdown = self.inner.tasks.cancel.clone();
            self.inner.tasks.tracker.spawn(async move {
                loop {
                    // The earliest moment the reader can fall below the rate.
                    let due = if rate == 0 {
                        None
                    } else {
                        let at = std::time::Duration::from_secs_f64(
                            sent.load(Ordering::Acquire) as f64 / rate as f64,
                        );
                        Some(started + at.max(grace) + std::time::Duration::from_millis(10))
                    };
                    tokio::select! {
                        _ = done.cancelled() => return,
                        _ = shutdown.cancelled() => break,
                        _ = sleep_until(due) => {
                            let elapsed = started.elapsed().as_secs_f64();
                            if (sent.load(Ordering::Acquire) as f64) < rate as f64 * elapsed {
                                break;
                            }
                        }
                    }
                }
                // Dropping the stream and the hold releases the kernel now.
                let cut = held.lock().unwrap_or_else(|p| p.into_inner()).take();
                drop(cut);
            });
        }
        let guard = done.drop_guard();
        let mut ended = false;
        futures::stream::poll_fn(move |cx| {
            let _ = &guard;
            if ended {
                return Poll::Ready(None);
            }
            let mut slot = held.lock().unwrap_or_else(|p| p.into_inner());
            let Some((body, _)) = slot.as_mut() else {
                ended = true;
                return Poll::Ready(Some(Err(TransferError::TooSlow(rate))));
            };
            let polled = body.poll_next_unpin(cx);
            match &polled {
                Poll::Ready(Some(Ok(bytes))) => {
                    sent.fetch_add(bytes.len() as u64, Ordering::AcqRel);
                }
                Poll::Ready(None | Some(Err(_))) => {
                    ended = true;
                    *slot = None;
                }
                Poll::Pending => {}
            }
            polled
        })
        .boxed()
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
