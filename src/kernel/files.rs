//! The file transport: `runner/file_helper.py` run inside the kernel's container with the
//! engine's exec API, as the kernel's user, in its working directory and cgroup. Bytes stream
//! through the exec's stdin (length-prefixed frames, a zero frame to commit) and stdout (one
//! JSON header line, then exactly the bytes it announces); the helper's last stderr line is
//! its status. Every read from the helper and every write to it must progress within
//! [`FILE_IDLE_TIMEOUT`]; the header and the status are size-bounded; the host holds at most
//! one chunk of a transfer at a time.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Deserialize;
use tokio::io::{AsyncWrite, AsyncWriteExt};

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

/// Stderr kept from the helper (its status is the last line).
const MAX_STDERR: usize = 64 * 1024;

/// Largest frame written to the helper's stdin.
const MAX_FRAME: usize = 1024 * 1024;

type Output = BoxStream<'static, Result<Chunk, EngineError>>;
type Input = std::pin::Pin<Box<dyn AsyncWrite + Send>>;

/// The helper's final status line.
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

/// What the helper wrote on stderr, bounded to its last [`MAX_STDERR`] bytes.
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

    /// The status the helper ended with; an error unless it says ok.
    fn status(&self) -> Result<Status, TransferError> {
        let text = String::from_utf8_lossy(&self.0);
        let line = text.lines().rev().find(|l| !l.trim().is_empty());
        let Some(status) = line.and_then(|l| serde_json::from_str::<Status>(l).ok()) else {
            return Err(TransferError::Helper(format!(
                "it ended without a status: {}",
                text.chars().take(500).collect::<String>()
            )));
        };
        if status.ok {
            Ok(status)
        } else {
            Err(TransferError::from_helper(
                status.code.as_deref().unwrap_or("internal"),
                status.message.unwrap_or_default(),
            ))
        }
    }
}

/// The next chunk of the helper's output, within the idle deadline.
async fn next(output: &mut Output) -> Result<Option<Chunk>, TransferError> {
    match tokio::time::timeout(FILE_IDLE_TIMEOUT, output.next()).await {
        Err(_) => Err(TransferError::Stalled(FILE_IDLE_TIMEOUT)),
        Ok(None) => Ok(None),
        Ok(Some(chunk)) => Ok(Some(chunk?)),
    }
}

/// Reads the helper's output to its end, keeping stderr; stdout there is a protocol breach.
async fn finish(output: &mut Output, stderr: &mut Stderr) -> Result<Status, TransferError> {
    let mut extra = false;
    while let Some(chunk) = next(output).await? {
        match chunk {
            Chunk::Stderr(bytes) => stderr.push(&bytes),
            Chunk::Stdout(bytes) => extra |= !bytes.is_empty(),
        }
    }
    let status = stderr.status()?;
    if extra {
        return Err(TransferError::Helper(
            "it wrote more than it announced".into(),
        ));
    }
    Ok(status)
}

/// Writes within the idle deadline.
async fn send(input: &mut Input, bytes: &[u8]) -> Result<(), TransferError> {
    match tokio::time::timeout(FILE_IDLE_TIMEOUT, input.write_all(bytes)).await {
        Err(_) => Err(TransferError::Stalled(FILE_IDLE_TIMEOUT)),
        Ok(Err(e)) => Err(TransferError::Helper(format!("writing to it: {e}"))),
        Ok(Ok(())) => Ok(()),
    }
}

/// Sends the body as frames, then the end frame; fails past `cap` bytes.
async fn pump(input: &mut Input, mut body: ByteStream, cap: u64) -> Result<u64, TransferError> {
    let mut total = 0u64;
    loop {
        let chunk = match tokio::time::timeout(FILE_IDLE_TIMEOUT, body.next()).await {
            Err(_) => return Err(TransferError::Stalled(FILE_IDLE_TIMEOUT)),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(TransferError::Body(e.to_string())),
            Ok(Some(Ok(chunk))) => chunk,
        };
        total += chunk.len() as u64;
        if total > cap {
            return Err(TransferError::TooLarge { cap });
        }
        for piece in chunk.chunks(MAX_FRAME) {
            let mut frame = BytesMut::with_capacity(4 + piece.len());
            frame.extend_from_slice(&(piece.len() as u32).to_be_bytes());
            frame.extend_from_slice(piece);
            send(input, &frame).await?;
        }
    }
    send(input, &[0, 0, 0, 0]).await?;
    let _ = input.flush().await;
    Ok(total)
}

impl Kernel {
    /// Starts the helper for `op` on `path`.
    async fn helper(&self, op: &str, path: &FilePath) -> Result<(Output, Input), TransferError> {
        let parts = serde_json::to_string(path.parts())
            .map_err(|e| TransferError::Helper(format!("encoding the path: {e}")))?;
        let spec = ExecSpec {
            cmd: vec![
                "python3".into(),
                "-I".into(),
                "-S".into(),
                "-c".into(),
                HELPER_SOURCE.into(),
                op.into(),
                parts,
            ],
            user: self.user.clone(),
            working_dir: WORK_DIR.into(),
            env: vec!["LANG=C.UTF-8".into(), "PYTHONDONTWRITEBYTECODE=1".into()],
        };
        let attached = self.engine.exec(&self.id, &spec).await?;
        Ok((attached.output, attached.input))
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
        let (mut output, mut input) = self
            .helper(if tar { "untar" } else { "write" }, path)
            .await?;
        let mut stderr = Stderr::default();
        enum First {
            Sent(Result<u64, TransferError>),
            Ended(Result<Status, TransferError>),
        }
        let first = {
            let sending = pump(&mut input, body, cap);
            let watching = finish(&mut output, &mut stderr);
            tokio::pin!(sending, watching);
            tokio::select! {
                sent = &mut sending => First::Sent(sent),
                ended = &mut watching => First::Ended(ended),
            }
        };
        let status = match first {
            // The helper ended before the body was sent: it refused or failed.
            First::Ended(status) => status,
            First::Sent(Ok(_)) => {
                let _ = input.shutdown().await;
                finish(&mut output, &mut stderr).await
            }
            First::Sent(Err(e)) => {
                // EOF without the end frame: the helper removes what it wrote, then answers.
                let _ = tokio::time::timeout(FILE_IDLE_TIMEOUT, input.shutdown()).await;
                let helper = finish(&mut output, &mut stderr).await;
                return Err(match (e, helper) {
                    // A write that failed because the helper gave up: its reason wins.
                    (TransferError::Helper(_), Err(reason)) => reason,
                    (e, _) => e,
                });
            }
        };
        let status = status?;
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
        let (mut output, input) = self.helper(if tar { "tar" } else { "read" }, path).await?;
        drop(input);
        let mut stderr = Stderr::default();
        let mut head = BytesMut::new();
        let (line, rest) = loop {
            match next(&mut output).await? {
                Some(Chunk::Stderr(bytes)) => stderr.push(&bytes),
                Some(Chunk::Stdout(bytes)) => {
                    head.extend_from_slice(&bytes);
                    if let Some(at) = head.iter().position(|b| *b == b'\n') {
                        let mut line = head.split_to(at + 1);
                        line.truncate(at);
                        break (line.freeze(), head.freeze());
                    }
                    if head.len() > MAX_HEADER {
                        return Err(TransferError::Helper("its header line is too long".into()));
                    }
                }
                None => {
                    stderr.status()?;
                    return Err(TransferError::Helper("it ended without a header".into()));
                }
            }
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
        Ok(match header {
            Header::Dir { entries, truncated } => {
                if !rest.is_empty() {
                    return Err(TransferError::Helper(
                        "it wrote more than it announced".into(),
                    ));
                }
                finish(&mut output, &mut stderr).await?;
                Download::Dir(Listing {
                    entries: entries.0,
                    truncated,
                })
            }
            Header::File { size } => Download::File {
                size,
                body: body_stream(output, stderr, rest, Some(size)),
            },
            Header::Tar => Download::Tar {
                body: body_stream(output, stderr, rest, None),
            },
        })
    }

    /// Removes a file or a directory tree (a symlink itself, never its target).
    pub async fn remove_file(&self, path: &FilePath) -> Result<(), TransferError> {
        let (mut output, input) = self.helper("remove", path).await?;
        drop(input);
        finish(&mut output, &mut Stderr::default())
            .await
            .map(|_| ())
    }
}

/// The helper's stdout after the header: `size` bytes exactly when given, else everything;
/// then its status must say ok.
fn body_stream(output: Output, stderr: Stderr, rest: Bytes, size: Option<u64>) -> DownloadStream {
    struct State {
        output: Output,
        stderr: Stderr,
        rest: Bytes,
        left: Option<u64>,
        done: bool,
    }
    let state = State {
        output,
        stderr,
        rest,
        left: size,
        done: false,
    };
    futures::stream::unfold(state, |mut s| async move {
        if s.done {
            return None;
        }
        loop {
            if !s.rest.is_empty() {
                let mut take = s.rest.len();
                if let Some(left) = s.left {
                    if left == 0 {
                        s.done = true;
                        return Some((
                            Err(TransferError::Helper(
                                "it wrote more than it announced".into(),
                            )),
                            s,
                        ));
                    }
                    take = take.min(left as usize);
                    s.left = Some(left - take as u64);
                }
                let chunk = s.rest.split_to(take);
                return Some((Ok(chunk), s));
            }
            if s.left == Some(0) {
                s.done = true;
                return match finish(&mut s.output, &mut s.stderr).await {
                    Ok(_) => None,
                    Err(e) => Some((Err(e), s)),
                };
            }
            match next(&mut s.output).await {
                Ok(Some(Chunk::Stdout(bytes))) => s.rest = bytes,
                Ok(Some(Chunk::Stderr(bytes))) => s.stderr.push(&bytes),
                Ok(None) => {
                    s.done = true;
                    let error = match (s.stderr.status(), s.left) {
                        (Err(e), _) => e,
                        (Ok(_), Some(left)) => {
                            TransferError::Helper(format!("it ended {left} bytes short"))
                        }
                        (Ok(_), None) => return None,
                    };
                    return Some((Err(error), s));
                }
                Err(e) => {
                    s.done = true;
                    return Some((Err(e), s));
                }
            }
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
