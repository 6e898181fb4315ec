//! The file transport: `runner/file_helper.py` run inside the kernel's container with the
//! engine's exec API, as the kernel's user, in its working directory and cgroup
//! (docs/architecture.md "File transport"). A helper serves requests one after another: the
//! kernel keeps one resident, started by the first file operation, reused by the next ones
//! and ended after [`Config::file_helper_idle`](crate::Config::file_helper_idle) without use
//! or when the kernel goes; a transfer that finds it busy runs on a one-shot helper.
//!
//! Framing: a request frame in (a 4-byte length and its JSON), then for an upload, once the
//! helper acknowledged it, length-prefixed frames and a zero frame to commit; out, frames of
//! a kind byte and a 4-byte length: `A` (send the upload), `H` (a read's JSON header), `D`
//! (data) and `S`, the status that ends every request. The host trusts none of it: every read
//! from the helper and every write to it must progress within [`FILE_IDLE_TIMEOUT`], the
//! header and the status are size-bounded, a file's announced size is enforced, and the host
//! holds at most one chunk of a transfer at a time. A helper is reused only after an
//! exchange that ended with an ok status exactly where the framing puts it; anything else
//! (an error, a deadline, a protocol doubt, a download dropped mid-way) drops it, and the
//! next transfer starts a fresh one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Deserialize;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Kernel, WORK_DIR};
use crate::docker::{Chunk, EngineError, ExecSpec};
use crate::files::{
    ByteStream, Download, DownloadStream, FilePath, Listing, TransferError, Written,
};
/// The helper's source, sent on its command line.
const HELPER_SOURCE: &str = include_str!("../../runner/file_helper.py");

/// How long any one step of a transfer (a chunk from the client, a write to the helper, a
/// chunk from the helper) may take before the transfer is abandoned.
pub const FILE_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Longest header line read from the helper: the helper truncates a listing before its line
/// passes 2 MiB (`MAX_LIST_BYTES` in `runner/file_helper.py`), which a listing of
/// [`crate::files::MAX_LIST_ENTRIES`] entries of ordinary names fits. A cell can forge what
/// its own helper writes (README "Files in and out of a kernel"), so this and the entry
/// count checked while parsing bound what a forged header makes the host hold.
const MAX_HEADER: usize = 2 * 1024 * 1024 + 64 * 1024;

/// A listing's entries, refused past [`crate::files::MAX_LIST_ENTRIES`] while parsing (a
/// forged header never grows the host past that count).
struct Entries(Vec<crate::files::FileEntry>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bounded;
        impl<'de> serde::de::Visitor<'de> for Bounded {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "at most {} entries", crate::files::MAX_LIST_ENTRIES)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Entries, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = seq.next_element()? {
                    if entries.len() == crate::files::MAX_LIST_ENTRIES {
                        return Err(serde::de::Error::custom(format!(
                            "more than {} entries",
                            crate::files::MAX_LIST_ENTRIES
                        )));
                    }
                    entries.push(entry);
                }
                Ok(Entries(entries))
            }
        }
        deserializer.deserialize_seq(Bounded)
    }
}

/// Longest status frame read from the helper.
const MAX_STATUS: usize = 64 * 1024;

/// Stderr kept from a helper (shown when it ends without a status).
const MAX_STDERR: usize = 64 * 1024;

/// Largest frame written to the helper's stdin.
const MAX_FRAME: usize = 1024 * 1024;

/// How long ending an idle helper may take (its stdin closed, its output drained).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

type Output = BoxStream<'static, Result<Chunk, EngineError>>;
type Input = std::pin::Pin<Box<dyn AsyncWrite + Send>>;

/// A helper's status frame.
#[derive(Debug, Default, Deserialize)]
struct Status {
    ok: bool,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    files: Option<u64>,
}

impl Status {
    /// The status; an error unless it says ok.
    fn result(self) -> Result<Status, TransferError> {
        if self.ok {
            Ok(self)
        } else {
            Err(TransferError::from_helper(
                self.code.as_deref().unwrap_or("internal"),
                self.message.unwrap_or_default(),
            ))
        }
    }
}

/// What a helper wrote on stderr, bounded to its last [`MAX_STDERR`] bytes.
#[derive(Default)]
struct Stderr(Vec<u8>);

impl Stderr {
    fn push(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
        if self.0.len() > MAX_STDERR {
            let cut = self.0.len() - MAX_STDERR;
            self.0.drain(..cut);
        }
    }

    /// The error for a helper whose output ended without a status.
    fn ended(&self) -> TransferError {
        let text = String::from_utf8_lossy(&self.0);
        let tail: String = text.trim().chars().rev().take(500).collect();
        TransferError::Helper(format!(
            "it ended without a status: {}",
            tail.chars().rev().collect::<String>()
        ))
    }
}

/// One frame from a helper; a data frame's bytes are read after it, piece by piece.
enum Frame {
    Ack,
    Header(Bytes),
    Data(u32),
    Status(Status),
}

fn breach(what: &str) -> TransferError {
    TransferError::Helper(format!("it broke its protocol: {what}"))
}

/// A helper's output, read frame by frame.
struct Reader {
    output: Output,
    /// Stdout bytes read and not consumed yet (the rest of an engine chunk).
    rest: Bytes,
    stderr: Stderr,
    /// Stdout bytes received since the current request was sent.
    received: u64,
}

/// When a step must be done: `None` for no deadline of its own.
type Deadline = Option<tokio::time::Instant>;

/// A deadline [`FILE_IDLE_TIMEOUT`] from now.
fn step_deadline() -> Deadline {
    Some(tokio::time::Instant::now() + FILE_IDLE_TIMEOUT)
}

impl Reader {
    /// The next stdout bytes (all of them that arrived at once) by `deadline`; `None` when
    /// the output ended. Stderr arriving meanwhile is kept but does not move the deadline (a
    /// cell writing to its helper's stderr cannot keep a stalled transfer alive).
    async fn stdout(&mut self, deadline: Deadline) -> Result<Option<Bytes>, TransferError> {
        if !self.rest.is_empty() {
            return Ok(Some(std::mem::take(&mut self.rest)));
        }
        loop {
            let next = match deadline {
                Some(at) => tokio::time::timeout_at(at, self.output.next()).await,
                None => Ok(self.output.next().await),
            };
            let chunk = match next {
                Err(_) => return Err(TransferError::Stalled(FILE_IDLE_TIMEOUT)),
                Ok(None) => return Ok(None),
                Ok(Some(chunk)) => chunk?,
            };
            match chunk {
                Chunk::Stderr(bytes) => self.stderr.push(&bytes),
                Chunk::Stdout(bytes) if !bytes.is_empty() => {
                    self.received += bytes.len() as u64;
                    return Ok(Some(bytes));
                }
                Chunk::Stdout(_) => {}
            }
        }
    }

    /// At most `max` bytes, no copy, within [`FILE_IDLE_TIMEOUT`]; `None` when the output
    /// ended.
    async fn take(&mut self, max: usize) -> Result<Option<Bytes>, TransferError> {
        self.take_by(max, step_deadline()).await
    }

    /// At most `max` bytes by `deadline`, no copy; `None` when the output ended.
    async fn take_by(
        &mut self,
        max: usize,
        deadline: Deadline,
    ) -> Result<Option<Bytes>, TransferError> {
        let Some(mut bytes) = self.stdout(deadline).await? else {
            return Ok(None);
        };
        if bytes.len() > max {
            self.rest = bytes.split_off(max);
        }
        Ok(Some(bytes))
    }

    /// Exactly `n` bytes (bounded by the caller) by `deadline`; `None` when the output
    /// ended first.
    async fn exact(
        &mut self,
        n: usize,
        deadline: Deadline,
    ) -> Result<Option<BytesMut>, TransferError> {
        let mut buf = BytesMut::with_capacity(n);
        while buf.len() < n {
            let Some(bytes) = self.take_by(n - buf.len(), deadline).await? else {
                return Ok(None);
            };
            buf.extend_from_slice(&bytes);
        }
        Ok(Some(buf))
    }

    /// The next frame, all of it (for all but data, its bounded payload too) within
    /// [`FILE_IDLE_TIMEOUT`]: the helper writes each one at once, so a frame trickled a byte
    /// at a time (a cell writing to its helper's stdout) cannot stretch a step past it.
    /// `None` when the output ended cleanly between frames.
    async fn frame(&mut self) -> Result<Option<Frame>, TransferError> {
        self.frame_by(step_deadline()).await
    }

    /// The next frame by `deadline` (see [`Reader::frame`]).
    async fn frame_by(&mut self, deadline: Deadline) -> Result<Option<Frame>, TransferError> {
        let mut head = [0u8; 5];
        let mut got = 0;
        while got < head.len() {
            match self.take_by(head.len() - got, deadline).await? {
                Some(bytes) => {
                    head[got..got + bytes.len()].copy_from_slice(&bytes);
                    got += bytes.len();
                }
                None if got == 0 => return Ok(None),
                None => return Err(self.stderr.ended()),
            }
        }
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]);
        let bounded = |max: usize| {
            if len as usize > max {
                Err(breach(&format!(
                    "a {} frame of {len} bytes (at most {max})",
                    head[0] as char
                )))
            } else {
                Ok(len as usize)
            }
        };
        Ok(Some(match head[0] {
            b'A' if len == 0 => Frame::Ack,
            b'D' => Frame::Data(len),
            b'H' => {
                let n = bounded(MAX_HEADER)
                    .map_err(|_| TransferError::Helper("its header line is too long".into()))?;
                let payload = self
                    .exact(n, deadline)
                    .await?
                    .ok_or_else(|| self.stderr.ended())?;
                Frame::Header(payload.freeze())
            }
            b'S' => {
                let n = bounded(MAX_STATUS)?;
                let payload = self
                    .exact(n, deadline)
                    .await?
                    .ok_or_else(|| self.stderr.ended())?;
                let status = serde_json::from_slice(&payload)
                    .map_err(|e| breach(&format!("an unreadable status: {e}")))?;
                Frame::Status(status)
            }
            other => return Err(breach(&format!("an unknown frame kind {other:#04x}"))),
        }))
    }

    /// The next frame, which must be there.
    async fn expect(&mut self) -> Result<Frame, TransferError> {
        match self.frame().await? {
            Some(frame) => Ok(frame),
            None => Err(self.stderr.ended()),
        }
    }

    /// The next frame, which must be there, without a deadline of its own: what the helper
    /// says while an upload is being sent, which runs as long as the upload's own steps
    /// (each within [`FILE_IDLE_TIMEOUT`], the body within the server's body timeout) do.
    async fn watch(&mut self) -> Result<Frame, TransferError> {
        match self.frame_by(None).await? {
            Some(frame) => Ok(frame),
            None => Err(self.stderr.ended()),
        }
    }
}

/// A running helper: its output and its stdin.
struct Helper {
    reader: Reader,
    input: Input,
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

    /// Ends an idle helper: EOF on its stdin (it exits between requests), its output drained
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

/// Where a kernel keeps its resident helper (README "Files in and out of a kernel").
pub(super) struct Resident {
    slot: Mutex<Slot>,
    /// How long it may stay idle before it is ended.
    idle: Duration,
    /// Owns the idle timers.
    tracker: TaskTracker,
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
    pub(super) fn new(idle: Duration, tracker: TaskTracker, cancel: CancellationToken) -> Self {
        Resident {
            slot: Mutex::new(Slot::Empty),
            idle,
            tracker,
            cancel,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
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
struct Lease {
    helper: Option<Helper>,
    /// The kernel's slot when this is the resident helper.
    resident: Option<Arc<Resident>>,
    /// Set when the exchange ended with an ok status where the framing puts it: only then is
    /// the helper kept for the next transfer.
    clean: bool,
}

impl Lease {
    fn helper(&mut self) -> Result<&mut Helper, TransferError> {
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

/// One upload frame: its 4-byte length, then the client's chunks as they came, written with
/// vectored writes (no copy into a frame buffer).
struct Gather {
    head: [u8; 4],
    at: usize,
    pieces: std::collections::VecDeque<Bytes>,
}

impl Gather {
    fn new(pieces: std::collections::VecDeque<Bytes>) -> Gather {
        let len: usize = pieces.iter().map(Bytes::len).sum();
        Gather {
            head: (len as u32).to_be_bytes(),
            at: 0,
            pieces,
        }
    }
}

impl Buf for Gather {
    fn remaining(&self) -> usize {
        4 - self.at + self.pieces.iter().map(Bytes::len).sum::<usize>()
    }

    fn chunk(&self) -> &[u8] {
        if self.at < 4 {
            &self.head[self.at..]
        } else {
            self.pieces.front().map(|p| &p[..]).unwrap_or_default()
        }
    }

    fn chunks_vectored<'a>(&'a self, dst: &mut [std::io::IoSlice<'a>]) -> usize {
        let mut n = 0;
        if self.at < 4 && n < dst.len() {
            dst[n] = std::io::IoSlice::new(&self.head[self.at..]);
            n += 1;
        }
        for piece in &self.pieces {
            if n == dst.len() {
                break;
            }
            dst[n] = std::io::IoSlice::new(piece);
            n += 1;
        }
        n
    }

    fn advance(&mut self, mut cnt: usize) {
        let head = (4 - self.at).min(cnt);
        self.at += head;
        cnt -= head;
        while cnt > 0 {
            let Some(front) = self.pieces.front_mut() else {
                return;
            };
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.pieces.pop_front();
        }
    }
}

/// Writes one upload frame of `pieces` (empty: the end frame).
async fn send_frame(
    input: &mut Input,
    pieces: std::collections::VecDeque<Bytes>,
) -> Result<(), TransferError> {
    let mut frame = Gather::new(pieces);
    match tokio::time::timeout(FILE_IDLE_TIMEOUT, input.write_all_buf(&mut frame)).await {
        Err(_) => Err(TransferError::Stalled(FILE_IDLE_TIMEOUT)),
        Ok(Err(e)) => Err(TransferError::Helper(format!("writing to it: {e}"))),
        Ok(Ok(())) => Ok(()),
    }
}

/// Sends the body as frames, then the end frame; fails past `cap` bytes. A frame carries the
/// chunks that are ready at once, up to [`MAX_FRAME`] bytes: fewer, larger frames for the
/// helper to read, and the host still holds no more than one frame.
async fn pump(input: &mut Input, mut body: ByteStream, cap: u64) -> Result<u64, TransferError> {
    use futures::FutureExt;
    let mut total = 0u64;
    let mut pieces = std::collections::VecDeque::new();
    let mut ended = false;
    while !ended {
        let first = match tokio::time::timeout(FILE_IDLE_TIMEOUT, body.next()).await {
            Err(_) => return Err(TransferError::Stalled(FILE_IDLE_TIMEOUT)),
            Ok(next) => next,
        };
        let mut next = Some(first);
        let mut len = 0usize;
        while let Some(item) = next.take() {
            let mut chunk = match item {
                None => {
                    ended = true;
                    break;
                }
                Some(Err(e)) => return Err(TransferError::Body(e.to_string())),
                Some(Ok(chunk)) => chunk,
            };
            total += chunk.len() as u64;
            if total > cap {
                return Err(TransferError::TooLarge { cap });
            }
            while len + chunk.len() > MAX_FRAME {
                let head = chunk.split_to(MAX_FRAME - len);
                pieces.push_back(head);
                send_frame(input, std::mem::take(&mut pieces)).await?;
                len = 0;
            }
            len += chunk.len();
            if !chunk.is_empty() {
                pieces.push_back(chunk);
            }
            if len < MAX_FRAME {
                next = body.next().now_or_never();
            }
        }
        if len > 0 {
            send_frame(input, std::mem::take(&mut pieces)).await?;
        }
    }
    send_frame(input, std::collections::VecDeque::new()).await?;
    let _ = input.flush().await;
    Ok(total)
}

/// The frames after an upload ended early (EOF sent): up to the helper's status.
async fn status_after_abort(reader: &mut Reader) -> Result<Status, TransferError> {
    loop {
        match reader.expect().await? {
            Frame::Status(status) => return status.result(),
            Frame::Data(_) => return Err(breach("data during an upload")),
            Frame::Ack | Frame::Header(_) => {}
        }
    }
}

impl Kernel {
    /// Starts a helper.
    async fn start_helper(&self) -> Result<Helper, TransferError> {
        let spec = ExecSpec {
            cmd: vec![
                "python3".into(),
                "-I".into(),
                "-S".into(),
                "-c".into(),
                HELPER_SOURCE.into(),
                "serve".into(),
            ],
            user: self.user.clone(),
            working_dir: WORK_DIR.into(),
            env: vec!["LANG=C.UTF-8".into(), "PYTHONDONTWRITEBYTECODE=1".into()],
        };
        let attached = self.engine.exec(&self.id, &spec).await?;
        Ok(Helper {
            reader: Reader {
                output: attached.output,
                rest: Bytes::new(),
                stderr: Stderr::default(),
                received: 0,
            },
            input: attached.input,
        })
    }

    /// Sends `op` on `path` to a helper (the resident one when it is free) and reads the
    /// first frame of its answer. A resident helper that took none of the request (a cell
    /// killed it) is replaced by a new one, once.
    async fn open(&self, op: &str, path: &FilePath) -> Result<(Lease, Frame), TransferError> {
        let request = serde_json::to_vec(&serde_json::json!({"op": op, "path": path.parts()}))
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

    /// Writes `body` to `path` (a file), or extracts it there when `tar` (a directory):
    /// into a temporary name first, renamed into place only once all of it arrived. On any
    /// failure (over `cap`, a full directory, the body failing) nothing is left.
    pub async fn write_file(
        &self,
        path: &FilePath,
        tar: bool,
        body: ByteStream,
        cap: u64,
    ) -> Result<Written, TransferError> {
        let (mut lease, first) = self.open(if tar { "untar" } else { "write" }, path).await?;
        match first {
            Frame::Ack => {}
            // Refused before the upload (a symlink or a file on the way).
            Frame::Status(status) => {
                status.result()?;
                return Err(breach("an ok status before the upload"));
            }
            Frame::Header(_) | Frame::Data(_) => {
                return Err(breach("a read's answer to an upload"))
            }
        }
        let Helper { reader, input } = lease.helper()?;
        enum First {
            Sent(Result<u64, TransferError>),
            Ended(Result<Frame, TransferError>),
        }
        let first = {
            let sending = pump(input, body, cap);
            let watching = reader.watch();
            tokio::pin!(sending, watching);
            tokio::select! {
                sent = &mut sending => First::Sent(sent),
                ended = &mut watching => First::Ended(ended),
            }
        };
        let status = match first {
            // The helper answered before the body was sent: it refused or failed.
            First::Ended(frame) => match frame? {
                Frame::Status(status) => {
                    status.result()?;
                    return Err(breach("an ok status before the end of the upload"));
                }
                _ => return Err(breach("a frame during an upload")),
            },
            First::Sent(Ok(_)) => match reader.expect().await? {
                Frame::Status(status) => status.result()?,
                _ => return Err(breach("a frame other than the status after an upload")),
            },
            First::Sent(Err(e)) => {
                // EOF without the end frame: the helper removes what it wrote, then answers.
                let _ = tokio::time::timeout(FILE_IDLE_TIMEOUT, input.shutdown()).await;
                let helper = status_after_abort(reader).await;
                return Err(match (e, helper) {
                    // A write that failed because the helper gave up: its reason wins.
                    (TransferError::Helper(_), Err(reason)) => reason,
                    (e, _) => e,
                });
            }
        };
        lease.clean = true;
        Ok(Written {
            path: status.path.unwrap_or_else(|| path.in_kernel()),
            size: status.size.unwrap_or(0),
            files: if tar { status.files } else { None },
        })
    }

    /// Reads `path`: a file's bytes, a directory's listing, or with `tar` a directory as a
    /// tar stream. The returned stream yields exactly the announced bytes, then checks the
    /// helper's status; anything else ends it with an error.
    pub async fn read_file(&self, path: &FilePath, tar: bool) -> Result<Download, TransferError> {
        let (mut lease, first) = self.open(if tar { "tar" } else { "read" }, path).await?;
        let line = match first {
            Frame::Header(line) => line,
            Frame::Status(status) => {
                status.result()?;
                return Err(TransferError::Helper("it ended without a header".into()));
            }
            Frame::Ack | Frame::Data(_) => return Err(breach("a frame before the header")),
        };
        #[derive(Deserialize)]
        #[serde(tag = "kind", rename_all = "lowercase")]
        enum Header {
            File { size: u64 },
            Dir { entries: Entries, truncated: bool },
            Tar,
        }
        let header: Header = serde_json::from_slice(&line)
            .map_err(|e| TransferError::Helper(format!("unreadable header: {e}")))?;
        drop(line);
        Ok(match header {
            Header::Dir { entries, truncated } => {
                match lease.helper()?.reader.expect().await? {
                    Frame::Status(status) => status.result()?,
                    _ => {
                        return Err(TransferError::Helper(
                            "it wrote more than it announced".into(),
                        ))
                    }
                };
                lease.clean = true;
                Download::Dir(Listing {
                    entries: entries.0,
                    truncated,
                })
            }
            Header::File { size: 0 } => {
                // Nothing to stream (a client may never poll an empty body): the status now.
                match lease.helper()?.reader.expect().await? {
                    Frame::Status(status) => status.result()?,
                    _ => {
                        return Err(TransferError::Helper(
                            "it wrote more than it announced".into(),
                        ))
                    }
                };
                lease.clean = true;
                Download::File {
                    size: 0,
                    body: futures::stream::empty().boxed(),
                }
            }
            Header::File { size } => Download::File {
                size,
                body: self.cut_at_dispose(body_stream(lease, Some(size))),
            },
            Header::Tar => Download::Tar {
                body: self.cut_at_dispose(body_stream(lease, None)),
            },
        })
    }

    /// Hands a download's bytes on through a task of the kernel that also ends the download
    /// the moment the kernel is disposed of: a client that stopped reading otherwise leaves
    /// the helper's exec output unread, and the engine's removal of the container waits on it
    /// (about 20 s here). The task reads at most one chunk ahead of the client (the channel
    /// holds one), so backpressure is kept; a download cut so ends with an error, never as a
    /// clean short body.
    fn cut_at_dispose(&self, mut body: DownloadStream) -> DownloadStream {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, TransferError>>(1);
        let gone = self.drain.clone();
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let ended_in_task = ended.clone();
        self.files.tracker.spawn(async move {
            loop {
                let permit = tokio::select! {
                    biased;
                    _ = gone.cancelled() => return,
                    permit = tx.reserve() => match permit {
                        Ok(permit) => permit,
                        // The client went away: the download's helper goes with `body`.
                        Err(_) => return,
                    },
                };
                let item = tokio::select! {
                    biased;
                    _ = gone.cancelled() => return,
                    item = body.next() => item,
                };
                match item {
                    Some(Ok(bytes)) => permit.send(Ok(bytes)),
                    Some(Err(e)) => {
                        ended_in_task.store(true, std::sync::atomic::Ordering::Release);
                        permit.send(Err(e));
                        return;
                    }
                    None => {
                        ended_in_task.store(true, std::sync::atomic::Ordering::Release);
                        return;
                    }
                }
            }
        });
        futures::stream::unfold(Some(rx), move |rx| {
            let ended = ended.clone();
            async move {
                let mut rx = rx?;
                match rx.recv().await {
                    Some(item) => Some((item, Some(rx))),
                    None if ended.load(std::sync::atomic::Ordering::Acquire) => None,
                    None => Some((
                        Err(TransferError::Helper(
                            "the kernel went away during the download".into(),
                        )),
                        None,
                    )),
                }
            }
        })
        .boxed()
    }

    /// Removes a file or a directory tree (a symlink itself, never its target).
    pub async fn remove_file(&self, path: &FilePath) -> Result<(), TransferError> {
        let (mut lease, first) = self.open("remove", path).await?;
        match first {
            Frame::Status(status) => {
                status.result()?;
                lease.clean = true;
                Ok(())
            }
            _ => Err(breach("a frame other than the status")),
        }
    }
}

/// A read's data frames: `size` bytes exactly when given, else everything up to the status,
/// which must say ok. The helper goes back to its kernel as soon as its status was read: for a
/// file, before its last bytes are yielded (a client that stops polling once it has the
/// announced length still leaves a clean helper).
fn body_stream(lease: Lease, size: Option<u64>) -> DownloadStream {
    struct State {
        lease: Option<Lease>,
        /// Bytes still announced (a file's).
        left: Option<u64>,
        /// Bytes left in the current data frame.
        in_frame: u32,
    }
    impl State {
        fn reader(&mut self) -> Result<&mut Reader, TransferError> {
            match self.lease.as_mut() {
                Some(lease) => Ok(&mut lease.helper()?.reader),
                None => Err(TransferError::Helper("no helper".into())),
            }
        }

        /// Reads the status that must end the read; a clean one gives the helper back.
        async fn end(&mut self) -> Result<(), TransferError> {
            match self.reader()?.expect().await? {
                Frame::Status(status) => {
                    status.result()?;
                }
                Frame::Data(_) => {
                    return Err(TransferError::Helper(
                        "it wrote more than it announced".into(),
                    ))
                }
                Frame::Ack | Frame::Header(_) => return Err(breach("a frame inside a read")),
            }
            if let Some(mut lease) = self.lease.take() {
                lease.clean = true;
            }
            Ok(())
        }

        async fn step(&mut self) -> Result<Option<Bytes>, TransferError> {
            if self.lease.is_none() {
                return Ok(None);
            }
            loop {
                if self.in_frame > 0 {
                    let want = self.in_frame as usize;
                    let reader = self.reader()?;
                    let Some(bytes) = reader.take(want).await? else {
                        return Err(reader.stderr.ended());
                    };
                    self.in_frame -= bytes.len() as u32;
                    if let Some(left) = self.left {
                        if bytes.len() as u64 > left {
                            return Err(TransferError::Helper(
                                "it wrote more than it announced".into(),
                            ));
                        }
                        self.left = Some(left - bytes.len() as u64);
                        if self.left == Some(0) && self.in_frame == 0 {
                            self.end().await?;
                        }
                    }
                    return Ok(Some(bytes));
                }
                match self.reader()?.expect().await? {
                    Frame::Data(n) => self.in_frame = n,
                    Frame::Status(status) => {
                        status.result()?;
                        if let Some(left @ 1..) = self.left {
                            return Err(TransferError::Helper(format!(
                                "it ended {left} bytes short"
                            )));
                        }
                        if let Some(mut lease) = self.lease.take() {
                            lease.clean = true;
                        }
                        return Ok(None);
                    }
                    Frame::Ack | Frame::Header(_) => return Err(breach("a frame inside a read")),
                }
            }
        }
    }
    let state = State {
        lease: Some(lease),
        left: size,
        in_frame: 0,
    };
    futures::stream::unfold(Some(state), |state| async move {
        let mut s = state?;
        match s.step().await {
            Ok(Some(bytes)) => Some((Ok(bytes), Some(s))),
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use bytes::Bytes;
    use futures::StreamExt;
    use tokio::io::AsyncWriteExt;

    use super::{Chunk, Entries, Frame, Gather, Reader, Stderr};

    fn reader(chunks: Vec<Chunk>) -> Reader {
        Reader {
            output: futures::stream::iter(chunks.into_iter().map(Ok)).boxed(),
            rest: Bytes::new(),
            stderr: Stderr::default(),
            received: 0,
        }
    }

    fn out(bytes: &[u8]) -> Chunk {
        Chunk::Stdout(Bytes::copy_from_slice(bytes))
    }

    #[tokio::test]
    async fn frames_split_anywhere_across_engine_chunks_are_read_whole() {
        let mut wire = Vec::new();
        for (kind, payload) in [
            (b'H', &br#"{"kind":"file","size":6}"#[..]),
            (b'D', b"abcdef"),
            (b'S', br#"{"ok":true,"size":6}"#),
        ] {
            wire.push(kind);
            wire.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            wire.extend_from_slice(payload);
        }
        // Every split point, with a stderr chunk in the middle.
        for cut in 1..wire.len() {
            let mut r = reader(vec![
                out(&wire[..cut]),
                Chunk::Stderr(Bytes::from_static(b"noise")),
                out(&wire[cut..]),
            ]);
            let Some(Frame::Header(h)) = r.frame().await.unwrap() else {
                panic!("cut {cut}: no header");
            };
            assert_eq!(&h[..], br#"{"kind":"file","size":6}"#);
            let Some(Frame::Data(n)) = r.frame().await.unwrap() else {
                panic!("cut {cut}: no data");
            };
            let mut data = Vec::new();
            while data.len() < n as usize {
                data.extend_from_slice(&r.take(n as usize - data.len()).await.unwrap().unwrap());
            }
            assert_eq!(data, b"abcdef", "cut {cut}");
            let Some(Frame::Status(status)) = r.frame().await.unwrap() else {
                panic!("cut {cut}: no status");
            };
            assert!(status.ok && status.size == Some(6));
            assert!(r.frame().await.unwrap().is_none(), "cut {cut}");
        }
    }

    #[tokio::test]
    async fn oversized_headers_and_statuses_are_refused_from_their_length_alone() {
        for (kind, says) in [(b'H', "header line is too long"), (b'S', "a S frame")] {
            // 4 MiB follow the head: a frame read past its head pulls them.
            let pulled = Arc::new(AtomicUsize::new(0));
            let counted = pulled.clone();
            let mut head = vec![kind];
            head.extend_from_slice(&u32::MAX.to_be_bytes());
            let output = futures::stream::iter([Ok(Chunk::Stdout(Bytes::from(head)))])
                .chain(
                    futures::stream::repeat_with(move || {
                        counted.fetch_add(1, Ordering::Relaxed);
                        Ok(Chunk::Stdout(Bytes::from(vec![b'x'; 64 * 1024])))
                    })
                    .take(64),
                )
                .boxed();
            let mut r = Reader {
                output,
                rest: Bytes::new(),
                stderr: Stderr::default(),
                received: 0,
            };
            let error = match r.frame().await {
                Err(e) => e.to_string(),
                Ok(_) => panic!("a {} frame of 4 GiB was accepted", kind as char),
            };
            assert!(error.contains(says), "{error}");
            assert_eq!(pulled.load(Ordering::Relaxed), 0, "read past the head");
        }
    }

    #[tokio::test]
    async fn a_gathered_upload_frame_is_its_length_then_its_pieces() {
        let pieces = [&b"ab"[..], b"", b"cde", b"f"]
            .into_iter()
            .map(Bytes::from_static)
            .collect::<std::collections::VecDeque<_>>();
        let mut frame = Gather::new(pieces);
        let mut written: Vec<u8> = Vec::new();
        written.write_all_buf(&mut frame).await.unwrap();
        assert_eq!(written, b"\0\0\0\x06abcdef");
    }

    #[test]
    fn a_listing_header_past_the_entry_count_is_refused_while_parsing() {
        let entry = r#"{"name":"a","kind":"file","size":0,"modified":""}"#;
        let list = |n: usize| format!("[{}]", vec![entry; n].join(","));
        let ok: Entries = serde_json::from_str(&list(crate::files::MAX_LIST_ENTRIES)).unwrap();
        assert_eq!(ok.0.len(), crate::files::MAX_LIST_ENTRIES);
        let over = serde_json::from_str::<Entries>(&list(crate::files::MAX_LIST_ENTRIES + 1));
        assert!(over.is_err());
    }
}
