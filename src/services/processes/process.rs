//! One background process: what it is, its pump task (its output into its ring, its leader's
//! pid, its exit code), its stdin, and an attach to its output (what is kept, then live).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::ring::Ring;
use super::{LiveSlot, ProcessError, EXIT_CODE_LIMIT, MAX_READERS, OUTPUT_BUFFER_BYTES};
use crate::docker::{Chunk, EngineError};
use crate::kernel::{CommandStream, Kernel, Leader, LeaderHead};

/// A process's output as the engine sends it.
type ProcessOutput = futures::stream::BoxStream<'static, Result<Chunk, EngineError>>;
use crate::wire::ProcessInfo;

/// A background process.
pub(crate) struct Process {
    pub(super) id: u64,
    argv: Vec<String>,
    cwd: Option<String>,
    started_at: String,
    pub(super) kernel: Arc<Kernel>,
    state: Mutex<State>,
    /// Bumped at every change of `state` (output, pid, exit), for attached readers.
    changed: watch::Sender<u64>,
    stdin: tokio::sync::Mutex<Option<Pin<Box<dyn AsyncWrite + Send>>>>,
    stdin_open: AtomicBool,
    readers: AtomicUsize,
}

/// What the pump changes.
struct State {
    ring: Ring,
    leader: Option<Leader>,
    exit: Option<i64>,
}

/// What an attached reader gets, in order.
#[derive(Debug)]
pub(crate) enum OutputItem {
    /// Output bytes of one stream.
    Chunk(CommandStream, Bytes),
    /// Bytes dropped from the kept output before this reader read them.
    Missed(u64),
    /// The process ended with this exit code; the last item.
    Exit(i64),
}

impl Process {
    /// A process just started on `kernel`.
    pub(super) fn new(
        id: u64,
        argv: Vec<String>,
        cwd: Option<String>,
        kernel: Arc<Kernel>,
        stdin: Pin<Box<dyn AsyncWrite + Send>>,
        stdin_open: bool,
    ) -> Process {
        Process {
            id,
            argv,
            cwd,
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            kernel,
            state: Mutex::new(State {
                ring: Ring::new(OUTPUT_BUFFER_BYTES),
                leader: None,
                exit: None,
            }),
            changed: watch::Sender::new(0),
            stdin: tokio::sync::Mutex::new(stdin_open.then_some(stdin)),
            stdin_open: AtomicBool::new(stdin_open),
            readers: AtomicUsize::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn changed(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// What it is, now.
    pub(crate) fn info(&self) -> ProcessInfo {
        let state = self.state();
        ProcessInfo {
            id: self.id,
            pid: state.leader.map(|l| l.pid),
            command: self.argv.clone(),
            cwd: self.cwd.clone(),
            started_at: self.started_at.clone(),
            running: state.exit.is_none(),
            exit_code: state.exit,
            stdin_open: self.stdin_open.load(Ordering::Acquire),
            output_bytes: state.ring.end(),
        }
    }

    /// Its leader, once it said its pid.
    pub(super) fn leader(&self) -> Option<Leader> {
        self.state().leader
    }

    /// Its exit code, once it ended.
    pub(super) fn exit(&self) -> Option<i64> {
        self.state().exit
    }

    /// Waits until its leader said its pid (or it ended), or `cancel`.
    pub(super) async fn started(&self, cancel: &CancellationToken) {
        let mut rx = self.changed.subscribe();
        loop {
            rx.borrow_and_update();
            if self.leader().is_some() || self.exit().is_some() {
                return;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
        }
    }

    /// Waits until it ended, or `cancel`.
    pub(super) async fn ended(&self, cancel: &CancellationToken) {
        let mut rx = self.changed.subscribe();
        loop {
            rx.borrow_and_update();
            if self.exit().is_some() {
                return;
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
            }
        }
    }

    fn push(&self, stream: CommandStream, bytes: Bytes) {
        if bytes.is_empty() {
            return;
        }
        self.state().ring.push(stream, bytes);
        self.changed();
    }

    /// Reads its output until it ends (or the service stops), then its exit code; gives its
    /// place under the bounds back when done (`slot`).
    pub(super) async fn pump(
        self: Arc<Self>,
        mut output: ProcessOutput,
        exit_code: futures::future::BoxFuture<'static, Result<Option<i64>, EngineError>>,
        cancel: CancellationToken,
        slot: LiveSlot,
    ) {
        let mut head = LeaderHead::new();
        let mut ended = false;
        while !ended {
            let chunk = tokio::select! {
                _ = cancel.cancelled() => None,
                chunk = output.next() => chunk,
            };
            match chunk {
                Some(Ok(Chunk::Stdout(bytes))) => self.push(CommandStream::Stdout, bytes),
                Some(Ok(Chunk::Stderr(bytes))) => {
                    let rest = Bytes::copy_from_slice(&head.feed(&bytes, false));
                    self.take_leader(&head);
                    self.push(CommandStream::Stderr, rest);
                }
                Some(Err(e)) => {
                    tracing::debug!(process = self.id, error = %e, "a background process's output ended");
                    ended = true;
                }
                None => ended = true,
            }
        }
        let rest = Bytes::copy_from_slice(&head.feed(&[], true));
        self.take_leader(&head);
        self.push(CommandStream::Stderr, rest);
        drop(output);
        let code = match tokio::time::timeout(EXIT_CODE_LIMIT, exit_code).await {
            Ok(Ok(Some(code))) => code,
            _ => -1,
        };
        // Its stdin goes with it.
        if let Ok(mut stdin) = self.stdin.try_lock() {
            stdin.take();
        }
        self.stdin_open.store(false, Ordering::Release);
        self.state().exit = Some(code);
        self.changed();
        drop(slot);
    }

    fn take_leader(&self, head: &LeaderHead) {
        if let Some(leader) = head.leader() {
            let mut state = self.state();
            if state.leader.is_none() {
                state.leader = Some(leader);
                drop(state);
                self.changed();
            }
        }
    }

    /// Writes `data` on its stdin within `limit`.
    pub(super) async fn write_stdin(
        &self,
        data: &[u8],
        limit: std::time::Duration,
    ) -> Result<(), ProcessError> {
        let id = self.id;
        let stuck = || ProcessError::StdinStuck {
            id,
            seconds: limit.as_secs(),
        };
        let deadline = tokio::time::Instant::now() + limit;
        let mut stdin = tokio::time::timeout_at(deadline, self.stdin.lock())
            .await
            .map_err(|_| stuck())?;
        let input = stdin.as_mut().ok_or(ProcessError::StdinClosed { id })?;
        match tokio::time::timeout_at(deadline, async {
            input.write_all(data).await?;
            input.flush().await
        })
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => {
                stdin.take();
                self.stdin_open.store(false, Ordering::Release);
                Err(ProcessError::StdinClosed { id })
            }
            Err(_) => Err(stuck()),
        }
    }

    /// Closes its stdin (end of file), within `limit`; closing a closed one is no error.
    pub(super) async fn close_stdin(&self, limit: std::time::Duration) -> Result<(), ProcessError> {
        let id = self.id;
        let mut stdin = tokio::time::timeout(limit, self.stdin.lock())
            .await
            .map_err(|_| ProcessError::StdinStuck {
                id,
                seconds: limit.as_secs(),
            })?;
        if let Some(mut input) = stdin.take() {
            let _ = tokio::time::timeout(limit, input.shutdown()).await;
        }
        self.stdin_open.store(false, Ordering::Release);
        Ok(())
    }

    /// A reader of its output, from what is kept on; at most [`MAX_READERS`] at once.
    pub(crate) fn attach(
        self: &Arc<Self>,
        cancel: CancellationToken,
    ) -> Result<Attach, ProcessError> {
        let readers = self.readers.fetch_add(1, Ordering::AcqRel);
        let attach = Attach {
            rx: self.changed.subscribe(),
            process: self.clone(),
            cursor: 0,
            done: false,
            cancel,
        };
        if readers >= MAX_READERS {
            return Err(ProcessError::TooManyReaders {
                id: self.id,
                max: MAX_READERS,
            });
        }
        Ok(attach)
    }
}

/// An attached reader of a process's output; gives its place back when dropped.
pub(crate) struct Attach {
    process: Arc<Process>,
    rx: watch::Receiver<u64>,
    cursor: u64,
    done: bool,
    cancel: CancellationToken,
}

impl Drop for Attach {
    fn drop(&mut self) {
        self.process.readers.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Attach {
    /// The next items: output from the reader's place on, or the exit once everything was
    /// read; None after the exit, or when the service stops.
    pub(crate) async fn next(&mut self) -> Option<Vec<OutputItem>> {
        if self.done {
            return None;
        }
        loop {
            self.rx.borrow_and_update();
            let (read, exit) = {
                let state = self.process.state();
                (state.ring.read_from(self.cursor), state.exit)
            };
            self.cursor = read.next;
            let mut items = Vec::new();
            if read.missed > 0 {
                items.push(OutputItem::Missed(read.missed));
            }
            items.extend(
                read.pieces
                    .into_iter()
                    .map(|(stream, bytes)| OutputItem::Chunk(stream, bytes)),
            );
            if !items.is_empty() {
                return Some(items);
            }
            if let Some(code) = exit {
                self.done = true;
                return Some(vec![OutputItem::Exit(code)]);
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return None,
                changed = self.rx.changed() => if changed.is_err() { return None },
            }
        }
    }
}
