//! Downloads and listings: a read's header, its byte stream, and its cut when the kernel goes
//! (`src/kernel/files/mod.rs`).

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;

use super::frame::{breach, Frame, Reader};
use super::helper::Lease;
use crate::files::{Download, DownloadStream, FilePath, Listing, TransferError};
use crate::kernel::Kernel;

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

impl Kernel {
    /// tar stream. The returned stream yields exactly the announced bytes, then checks the
    /// helper's status; anything else ends it with an error.
    pub(crate) async fn read_file(
        &self,
        path: &FilePath,
        tar: bool,
    ) -> Result<Download, TransferError> {
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
                lease.helper()?.reader.end_of_read().await?;
                lease.clean = true;
                Download::Dir(Listing {
                    entries: entries.0,
                    truncated,
                })
            }
            Header::File { size: 0 } => {
                // Nothing to stream (a client may never poll an empty body): the status now.
                lease.helper()?.reader.end_of_read().await?;
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
}

/// Where a download's body stands.
struct Body {
    lease: Option<Lease>,
    /// Bytes still announced (a file's).
    left: Option<u64>,
    /// Bytes left in the current data frame.
    in_frame: u32,
}

impl Body {
    fn reader(&mut self) -> Result<&mut Reader, TransferError> {
        match self.lease.as_mut() {
            Some(lease) => Ok(&mut lease.helper()?.reader),
            None => Err(TransferError::Helper("no helper".into())),
        }
    }

    /// Reads the status that must end the read; a clean one gives the helper back.
    async fn end(&mut self) -> Result<(), TransferError> {
        self.reader()?.end_of_read().await?;
        if let Some(mut lease) = self.lease.take() {
            lease.clean = true;
        }
        Ok(())
    }

    /// The body's next bytes; `None` once it ended cleanly.
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

/// A read's data frames: `size` bytes exactly when given, else everything up to the status,
/// which must say ok. The helper goes back to its kernel as soon as its status was read: for a
/// file, before its last bytes are yielded (a client that stops polling once it has the
/// announced length still leaves a clean helper).
fn body_stream(lease: Lease, size: Option<u64>) -> DownloadStream {
    let body = Body {
        lease: Some(lease),
        left: size,
        in_frame: 0,
    };
    futures::stream::unfold(Some(body), |body| async move {
        let mut body = body?;
        match body.step().await {
            Ok(Some(bytes)) => Some((Ok(bytes), Some(body))),
            Ok(None) => None,
            Err(e) => Some((Err(e), None)),
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::Entries;

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
