//! A running helper, the kernel's resident one, and the lease a transfer holds on a helper
//! (`src/kernel/files/mod.rs`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Buf;
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::channel::{self, Rendezvous};
use super::frame::{breach, Frame, Reader};
use super::FILE_IDLE_TIMEOUT;
use crate::docker::ExecSpec;
use crate::files::{FilePath, TransferError};
use crate::kernel::{Kernel, WORK_DIR};

/// The helper's source, sent on its command line.
const HELPER_SOURCE: &str = include_str!("../../../runner/file_helper.py");

/// How long a helper has to take its channel (its invitation written, its `Y` or `N` read,
/// its connection accepted): it normally takes a Python start, well under a second. Shorter
/// than the server's body timeout, so that an upload whose helper never came up is answered
/// (`transfer_stalled`) before the client's connection is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long ending an idle helper may take (its input closed, its output drained).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) type Input = std::pin::Pin<Box<dyn AsyncWrite + Send>>;

/// A running helper: its output and its input (its channel's socket, or its stdin).
pub(super) struct Helper {
    pub(super) reader: Reader,
    pub(super) input: Input,
    /// The exec's stdin when the channel is the socket: held for the helper's life.
    _stdin: Option<Input>,
}

impl Helper {
    /// Sends `request` and reads the first frame of the answer. [`Begin::Dead`] when the
    /// helper took none of it (the request could not be written, or its output ended before
    /// any byte): nothing of the transfer was consumed, so it may be retried on a new helper.
    async fn begin(&mut self, request: &[u8]) -> Result<Frame, Begin> {
        self.reader.received = 0;
        let head = (request.len() as u32).to_be_bytes();
        let mut buf = (&head[..]).chain(request);
        match tokio::time::timeout(FILE_IDLE_TIMEOUT, self.input.write_all_buf(&mut buf)).await {
            Err(_) => return Err(Begin::Failed(TransferError::Stalled(FILE_IDLE_TIMEOUT))),
            Ok(Err(e)) => {
                return Err(Begin::Dead(TransferError::Helper(format!(
                    "writing to it: {e}"
                ))))
            }
            Ok(Ok(())) => {}
        }
        let _ = self.input.flush().await;
        match self.reader.frame().await {
            Ok(Some(frame)) => Ok(frame),
            Ok(None) => Err(Begin::Dead(self.reader.stderr.ended())),
            Err(TransferError::Engine(e)) if self.reader.received == 0 => {
                Err(Begin::Dead(TransferError::Engine(e)))
            }
            Err(e) => Err(Begin::Failed(e)),
        }
    }

    /// Ends an idle helper: EOF on its input (it exits between requests), its output drained
    /// and dropped as it comes.
    async fn close(mut self) {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, async {
            let _ = self.input.shutdown().await;
            while let Some(Ok(_)) = self.reader.output.next().await {}
        })
        .await;
    }
}

/// Why a request could not begin.
enum Begin {
    /// The helper took nothing of it (it had died): a new helper may retry it.
    Dead(TransferError),
    /// It failed otherwise.
    Failed(TransferError),
}

/// The kernel's resident helper: absent, in use by one transfer, or idle with its timer.
enum Slot {
    Empty,
    Busy,
    Idle {
        helper: Helper,
        timer: CancellationToken,
    },
}

/// Where a kernel keeps its resident helper (docs/files.md "Files in and out of a kernel").
pub(in crate::kernel) struct Resident {
    slot: Mutex<Slot>,
    /// How long it may stay idle before it is ended.
    idle: Duration,
    /// The host directory of the helpers' channels ([`Config::files.sockets`]); `None`: the
    /// exec streams.
    ///
    /// [`Config::files.sockets`]: crate::config::FileTransfer::sockets
    sockets: Option<std::path::PathBuf>,
    /// Owns the idle timers.
    pub(super) tracker: TaskTracker,
    /// The kernel's: cancelled when the kernel goes, which ends the helper.
    cancel: CancellationToken,
}

/// What a transfer found in the slot.
enum Take {
    /// The idle resident helper, now the transfer's.
    Reuse(Helper),
    /// No resident helper: the transfer starts one and it becomes the resident one.
    Start,
    /// The resident helper is in use: the transfer runs on a one-shot helper.
    OneShot,
}

impl Resident {
    /// The channels' directory this kernel's helpers use, when it is mounted.
    pub(in crate::kernel) fn sockets(&self) -> Option<std::path::PathBuf> {
        self.sockets.clone()
    }

    pub(in crate::kernel) fn new(
        idle: Duration,
        sockets: Option<std::path::PathBuf>,
        tracker: TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        Resident {
            slot: Mutex::new(Slot::Empty),
            idle,
            sockets,
            tracker,
            cancel,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the idle resident helper, if there is one (a kernel about to hibernate holds no
    /// exec's streams through its checkpoint); false when a transfer is using it.
    pub(in crate::kernel) async fn end_idle(&self) -> bool {
        let helper = {
            let mut slot = self.lock();
            match std::mem::replace(&mut *slot, Slot::Empty) {
                Slot::Empty => None,
                Slot::Busy => {
                    *slot = Slot::Busy;
                    return false;
                }
                Slot::Idle { helper, timer } => {
                    timer.cancel();
                    Some(helper)
                }
            }
        };
        if let Some(helper) = helper {
            helper.close().await;
        }
        true
    }

    fn take(&self) -> Take {
        let mut slot = self.lock();
        match std::mem::replace(&mut *slot, Slot::Busy) {
            Slot::Empty => Take::Start,
            Slot::Busy => Take::OneShot,
            Slot::Idle { helper, timer } => {
                timer.cancel();
                Take::Reuse(helper)
            }
        }
    }

    /// Ends the transfer that held the slot: a helper given back is kept, idle, until its
    /// timer ends it; without one (or once the kernel went) the slot is empty.
    fn give_back(self: &Arc<Self>, helper: Option<Helper>) {
        let mut slot = self.lock();
        let (Some(helper), false, Ok(_)) = (
            helper,
            self.cancel.is_cancelled(),
            tokio::runtime::Handle::try_current(),
        ) else {
            *slot = Slot::Empty;
            return;
        };
        let timer = CancellationToken::new();
        *slot = Slot::Idle {
            helper,
            timer: timer.clone(),
        };
        let resident = self.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                _ = timer.cancelled() => return,
                _ = resident.cancel.cancelled() => {}
                _ = tokio::time::sleep(resident.idle) => {}
            }
            let helper = {
                let mut slot = resident.lock();
                if timer.is_cancelled() {
                    return;
                }
                match std::mem::replace(&mut *slot, Slot::Empty) {
                    Slot::Idle { helper, .. } => helper,
                    other => {
                        *slot = other;
                        return;
                    }
                }
            };
            tracing::debug!("file helper idle: ended");
            helper.close().await;
        });
    }
}

/// The helper a transfer runs on, and where it goes when the transfer ends.
pub(super) struct Lease {
    helper: Option<Helper>,
    /// The kernel's slot when this is the resident helper.
    resident: Option<Arc<Resident>>,
    /// Set when the exchange ended with an ok status where the framing puts it: only then is
    /// the helper kept for the next transfer.
    pub(super) clean: bool,
}

impl Lease {
    pub(super) fn helper(&mut self) -> Result<&mut Helper, TransferError> {
        self.helper
            .as_mut()
            .ok_or_else(|| TransferError::Helper("no helper".into()))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(resident) = self.resident.take() {
            let helper = self.helper.take().filter(|_| self.clean);
            resident.give_back(helper);
        }
    }
}

/// Writes a new helper's invitation to its channel on its stdin.
async fn invite(stdin: &mut Input, rendezvous: &Rendezvous) -> Result<(), TransferError> {
    let line = rendezvous.invitation();
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
        stdin.write_all(line.as_bytes()).await?;
        stdin.flush().await
    })
    .await
    {
        Err(_) => Err(TransferError::Stalled(HANDSHAKE_TIMEOUT)),
        Ok(Err(e)) => Err(TransferError::Helper(format!("writing to it: {e}"))),
        Ok(Ok(())) => Ok(()),
    }
}

impl Kernel {
    /// Starts a helper, on its own channel when the kernel has the channels' directory.
    async fn start_helper(&self) -> Result<Helper, TransferError> {
        let rendezvous = self.rendezvous();
        let spec = self.helper_exec(rendezvous.is_some());
        let mut attached = self.engine.exec(&self.id, &spec).await?;
        if let Some(rendezvous) = &rendezvous {
            invite(&mut attached.input, rendezvous).await?;
        }
        let reader = Reader::new(attached.output.map(|c| c.map_err(Into::into)).boxed());
        match rendezvous {
            Some(rendezvous) => self.take_channel(rendezvous, reader, attached.input).await,
            None => Ok(Helper {
                reader,
                input: attached.input,
                _stdin: None,
            }),
        }
    }

    /// A new helper's channel, when the kernel has the channels' directory and it is usable.
    fn rendezvous(&self) -> Option<Rendezvous> {
        match self.files.sockets.as_deref().map(Rendezvous::open) {
            Some(Ok(rendezvous)) => Some(rendezvous),
            // The directory went away or filled up under the server: the exec streams still work.
            Some(Err(e)) => {
                tracing::warn!(container = %self.short_id(), error = %e, "file channel unavailable: using the exec streams");
                None
            }
            None => None,
        }
    }

    /// The helper's exec: `runner/file_helper.py` as the kernel's user in its working
    /// directory, told to take its channel when it has one.
    fn helper_exec(&self, channel: bool) -> ExecSpec {
        let mut cmd = vec![
            "python3".into(),
            "-I".into(),
            "-S".into(),
            "-c".into(),
            HELPER_SOURCE.into(),
            "serve".into(),
        ];
        if channel {
            cmd.push("--channel".into());
        }
        ExecSpec {
            cmd,
            user: self.user.clone(),
            working_dir: WORK_DIR.into(),
            env: vec!["LANG=C.UTF-8".into(), "PYTHONDONTWRITEBYTECODE=1".into()],
        }
    }

    /// Waits for a new helper to reach its channel: its first byte on stdout says whether it
    /// did (`Y`, then its connection is the helper's input and output) or not (`N`: it stays
    /// on the exec streams).
    async fn take_channel(
        &self,
        rendezvous: Rendezvous,
        mut reader: Reader,
        stdin: Input,
    ) -> Result<Helper, TransferError> {
        // Connections are taken meanwhile, so that others filling the socket's queue cannot
        // keep it out.
        let kernel = channel::Peer::Kernel {
            container: &self.id,
            uid: self.user.split(':').next().and_then(|uid| uid.parse().ok()),
        };
        let accepting = rendezvous.accept(&kernel, HANDSHAKE_TIMEOUT);
        tokio::pin!(accepting);
        let mut accepted = None;
        let first = {
            // One deadline for the first byte, however the accept goes meanwhile.
            let taking = reader.take_within(1, HANDSHAKE_TIMEOUT);
            tokio::pin!(taking);
            loop {
                tokio::select! {
                    first = &mut taking => break first?,
                    socket = &mut accepting, if accepted.is_none() => accepted = Some(socket?),
                }
            }
        };
        match first.as_deref() {
            Some(b"Y") => {}
            Some(b"N") => {
                tracing::warn!(
                    container = %self.short_id(),
                    "file helper could not reach its channel (the kernel lacks {}): using the exec streams",
                    channel::IN_KERNEL_DIR
                );
                return Ok(Helper {
                    reader,
                    input: stdin,
                    _stdin: None,
                });
            }
            Some(_) => return Err(breach("a first byte other than Y or N")),
            None => return Err(reader.stderr.ended()),
        }
        let socket = match accepted {
            Some(socket) => socket,
            None => accepting.await?,
        };
        let (read, write) = socket.into_split();
        let reader = reader.rebuild(|exec| channel::output(read, exec))?;
        Ok(Helper {
            reader,
            input: Box::pin(write),
            _stdin: Some(stdin),
        })
    }

    /// Sends `op` on `path` to a helper (the resident one when it is free) and reads the
    /// first frame of its answer. A resident helper that took none of the request (a cell
    /// killed it) is replaced by a new one, once.
    pub(super) async fn open(
        &self,
        op: &str,
        path: &FilePath,
    ) -> Result<(Lease, Frame), TransferError> {
        self.open_to(op, path, None).await
    }

    /// [`Kernel::open`] with a second path (`to`, a move's destination).
    pub(super) async fn open_to(
        &self,
        op: &str,
        path: &FilePath,
        to: Option<&FilePath>,
    ) -> Result<(Lease, Frame), TransferError> {
        let mut request = serde_json::json!({"op": op, "path": path.parts()});
        if let Some(to) = to {
            request["to"] = serde_json::json!(to.parts());
        }
        let request = serde_json::to_vec(&request)
            .map_err(|e| TransferError::Helper(format!("encoding the request: {e}")))?;
        let mut lease = Lease {
            helper: None,
            resident: None,
            clean: false,
        };
        let mut reused = false;
        match self.files.take() {
            Take::Reuse(helper) => {
                lease.resident = Some(self.files.clone());
                lease.helper = Some(helper);
                reused = true;
            }
            Take::Start => lease.resident = Some(self.files.clone()),
            Take::OneShot => {}
        }
        loop {
            if lease.helper.is_none() {
                lease.helper = Some(self.start_helper().await?);
            }
            match lease.helper()?.begin(&request).await {
                Ok(frame) => return Ok((lease, frame)),
                Err(Begin::Dead(e)) if reused => {
                    tracing::debug!(container = %self.short_id(), error = %e, "file helper gone: a new one");
                    lease.helper = None;
                    reused = false;
                }
                Err(Begin::Dead(e) | Begin::Failed(e)) => return Err(e),
            }
        }
    }
}
