//! What a helper writes, read frame by frame (`src/kernel/files/mod.rs` has the framing).

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Deserialize;

use super::FILE_IDLE_TIMEOUT;
use crate::docker::Chunk;
use crate::files::TransferError;

/// Longest header line read from the helper: the helper truncates a listing before its line
/// passes 2 MiB (`MAX_LIST_BYTES` in `runner/file_helper.py`), which a listing of
/// [`crate::files::MAX_LIST_ENTRIES`] entries of ordinary names fits. A cell can forge what
/// its own helper writes (docs/files.md "Files in and out of a kernel"), so this and the entry
/// count checked while parsing bound what a forged header makes the host hold.
pub(crate) const MAX_HEADER: usize = 2 * 1024 * 1024 + 64 * 1024;

/// Longest status frame read from the helper.
const MAX_STATUS: usize = 64 * 1024;

/// Stderr kept from a helper (shown when it ends without a status).
const MAX_STDERR: usize = 64 * 1024;

/// What a helper writes: its frames as stdout chunks (from the exec's stdout, or from its
/// channel's socket), its stderr as stderr chunks.
pub(super) type Output = BoxStream<'static, Result<Chunk, TransferError>>;

/// A helper's status frame.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Status {
    pub(super) ok: bool,
    #[serde(default)]
    pub(super) code: Option<String>,
    #[serde(default)]
    pub(super) message: Option<String>,
    #[serde(default)]
    pub(super) path: Option<String>,
    #[serde(default)]
    pub(super) size: Option<u64>,
    #[serde(default)]
    pub(super) files: Option<u64>,
    /// A `stat`'s entry.
    #[serde(default)]
    pub(super) entry: Option<crate::files::FileEntry>,
    /// Whether a `mkdir` made the directory.
    #[serde(default)]
    pub(super) created: Option<bool>,
}

impl Status {
    /// The status; an error unless it says ok.
    pub(super) fn result(self) -> Result<Status, TransferError> {
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
pub(super) struct Stderr(Vec<u8>);

impl Stderr {
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
        if self.0.len() > MAX_STDERR {
            let cut = self.0.len() - MAX_STDERR;
            self.0.drain(..cut);
        }
    }

    /// The error for a helper whose output ended without a status.
    pub(super) fn ended(&self) -> TransferError {
        let text = String::from_utf8_lossy(&self.0);
        let tail: String = text.trim().chars().rev().take(500).collect();
        TransferError::Helper(format!(
            "it ended without a status: {}",
            tail.chars().rev().collect::<String>()
        ))
    }
}

/// One frame from a helper; a data frame's bytes are read after it, piece by piece.
pub(super) enum Frame {
    Ack,
    Header(Bytes),
    Data(u32),
    Status(Status),
}

pub(super) fn breach(what: &str) -> TransferError {
    TransferError::Helper(format!("it broke its protocol: {what}"))
}

/// A helper's output, read frame by frame.
pub(super) struct Reader {
    pub(super) output: Output,
    /// Stdout bytes read and not consumed yet (the rest of an engine chunk).
    rest: Bytes,
    pub(super) stderr: Stderr,
    /// Stdout bytes received since the current request was sent.
    pub(super) received: u64,
}

/// When a step must be done: `None` for no deadline of its own.
type Deadline = Option<tokio::time::Instant>;

/// A deadline [`FILE_IDLE_TIMEOUT`] from now.
fn step_deadline() -> Deadline {
    Some(tokio::time::Instant::now() + FILE_IDLE_TIMEOUT)
}

impl Reader {
    /// Reads `output`, a helper's.
    pub(super) fn new(output: Output) -> Reader {
        Reader {
            output,
            rest: Bytes::new(),
            stderr: Stderr::default(),
            received: 0,
        }
    }

    /// The same output with its frames from elsewhere: `output(self.output)` gives the new
    /// output (`src/kernel/files/channel.rs`); what stderr said so far is kept. Stdout bytes
    /// read and not consumed are a breach.
    pub(super) fn rebuild(
        self,
        output: impl FnOnce(Output) -> Output,
    ) -> Result<Reader, TransferError> {
        if !self.rest.is_empty() {
            return Err(breach("bytes on stdout after its first"));
        }
        Ok(Reader {
            output: output(self.output),
            rest: Bytes::new(),
            stderr: self.stderr,
            received: 0,
        })
    }

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
    pub(super) async fn take(&mut self, max: usize) -> Result<Option<Bytes>, TransferError> {
        self.take_by(max, step_deadline()).await
    }

    /// At most `max` bytes within `limit`, no copy; `None` when the output ended.
    pub(super) async fn take_within(
        &mut self,
        max: usize,
        limit: std::time::Duration,
    ) -> Result<Option<Bytes>, TransferError> {
        match self
            .take_by(max, Some(tokio::time::Instant::now() + limit))
            .await
        {
            Err(TransferError::Stalled(_)) => Err(TransferError::Stalled(limit)),
            other => other,
        }
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
    pub(super) async fn frame(&mut self) -> Result<Option<Frame>, TransferError> {
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
    pub(super) async fn expect(&mut self) -> Result<Frame, TransferError> {
        match self.frame().await? {
            Some(frame) => Ok(frame),
            None => Err(self.stderr.ended()),
        }
    }

    /// The status that must end a read: more data than announced, or any other frame, is
    /// refused.
    pub(super) async fn end_of_read(&mut self) -> Result<(), TransferError> {
        match self.expect().await? {
            Frame::Status(status) => status.result().map(drop),
            Frame::Data(_) => Err(TransferError::Helper(
                "it wrote more than it announced".into(),
            )),
            Frame::Ack | Frame::Header(_) => Err(breach("a frame inside a read")),
        }
    }

    /// The next frame, which must be there, without a deadline of its own: what the helper
    /// says while an upload is being sent, which runs as long as the upload's own steps
    /// (each within [`FILE_IDLE_TIMEOUT`], the body within the server's body timeout) do.
    pub(super) async fn watch(&mut self) -> Result<Frame, TransferError> {
        match self.frame_by(None).await? {
            Some(frame) => Ok(frame),
            None => Err(self.stderr.ended()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use bytes::Bytes;
    use futures::StreamExt;

    use super::{Chunk, Frame, Reader};

    fn reader(chunks: Vec<Chunk>) -> Reader {
        Reader::new(futures::stream::iter(chunks.into_iter().map(Ok)).boxed())
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
            let mut r = Reader::new(output);
            let error = match r.frame().await {
                Err(e) => e.to_string(),
                Ok(_) => panic!("a {} frame of 4 GiB was accepted", kind as char),
            };
            assert!(error.contains(says), "{error}");
            assert_eq!(pulled.load(Ordering::Relaxed), 0, "read past the head");
        }
    }
}
