//! Uploads: the body sent to a helper as gathered, vectored frames, committed by the end
//! frame (`src/kernel/files/mod.rs`).

use bytes::{Buf, Bytes};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::frame::{breach, Frame, Reader, Status};
use super::helper::{Helper, Input};
use super::FILE_IDLE_TIMEOUT;
use crate::files::{ByteStream, FilePath, TransferError, Written};
use crate::kernel::Kernel;

/// Largest frame written to the helper's channel.
const MAX_FRAME: usize = 1024 * 1024;

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
    /// Writes `body` to `path` (a file), or extracts it there when `tar` (a directory):
    /// into a temporary name first, renamed into place only once all of it arrived. On any
    /// failure (over `cap`, a full directory, the body failing) nothing is left. The kernel
    /// going (disposed of, or dead) ends the upload at once: a transport whose streams do not
    /// close with the container (the engine's exec streams under gVisor, docs/runtimes.md)
    /// would otherwise keep it waiting on the body's deadline.
    pub(crate) async fn write_file(
        &self,
        path: &FilePath,
        tar: bool,
        body: ByteStream,
        cap: u64,
    ) -> Result<Written, TransferError> {
        let gone = self.gone();
        tokio::select! {
            biased;
            () = gone.cancelled() => Err(TransferError::Helper(
                "the kernel went during the upload".into(),
            )),
            written = self.upload(path, tar, body, cap) => written,
        }
    }

    /// The upload of [`Self::write_file`].
    async fn upload(
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
        let Helper { reader, input, .. } = lease.helper()?;
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
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tokio::io::AsyncWriteExt;

    use super::Gather;

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
}
