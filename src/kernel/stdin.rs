//! A kernel's stdin: [`Stdin::send`] writes a frame at once when the pipe takes it, and
//! otherwise queues it for a writer task, so frames stay in order and no cell, reader or
//! refusal ever waits on a runner that stopped reading.
//!
//! Writing inline matters for speed: handing every frame to a task costs a cross-thread
//! wake-up on a multi-threaded runtime, a sizeable part of a ~0.3 ms warm cell.
//!
//! The queue is bounded by [`MAX_STDIN_BACKLOG`]: a runner reads its stdin whenever one of its
//! threads waits for a frame, so only a kernel whose code forges tool calls (each answered by
//! a refusal) while keeping the runner from reading can pile frames up. Such a kernel trips its
//! [`Breach`] and is killed; the queue is dropped.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::protocol::Breach;

/// Bytes of host -> runner frames queued behind a kernel's stdin pipe (beyond the pipe's own
/// buffer) before a new frame is refused and the kernel is killed as a protocol breach. A frame
/// is queued when less than this is waiting, so the queue holds at most this plus one frame.
pub(super) const MAX_STDIN_BACKLOG: usize = 16 * 1024 * 1024;

/// What [`Stdin::send`] reports as the breach when the queue is full.
const BACKLOG_BREACH: &str =
    "it stopped reading its input while more than 16 MiB of host frames waited";

type Input = Pin<Box<dyn AsyncWrite + Send>>;

/// The sending side, cheap to clone.
#[derive(Clone)]
pub(super) struct Stdin {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    queued: Notify,
    breach: Breach,
}

struct State {
    /// The stream; `None` while the writer task is writing with it.
    input: Option<Input>,
    /// Frames (or the rest of one) waiting for the writer task.
    queue: VecDeque<Vec<u8>>,
    /// Bytes in `queue`.
    queued_bytes: usize,
    /// The stream failed or the kernel went away: frames are dropped.
    closed: bool,
}

impl Stdin {
    /// Wraps `input`; the returned future is the writer task, to be spawned: it ends when
    /// `cancel` fires or the stream fails. A full queue trips `breach`.
    pub(super) fn new(
        input: Input,
        cancel: CancellationToken,
        breach: Breach,
    ) -> (
        Stdin,
        impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                input: Some(input),
                queue: VecDeque::new(),
                queued_bytes: 0,
                closed: false,
            }),
            queued: Notify::new(),
            breach,
        });
        let task = writer_task(shared.clone(), cancel);
        (Stdin { shared }, task)
    }

    /// Writes `frame` now if nothing is queued before it and the pipe takes it without
    /// waiting; queues the rest for the writer task. A kernel that is gone drops it; one with
    /// [`MAX_STDIN_BACKLOG`] bytes already queued trips the breach and drops everything.
    pub(super) fn send(&self, frame: Vec<u8>) {
        let mut state = self.shared.lock();
        if state.closed {
            return;
        }
        let mut written = 0;
        if state.queue.is_empty() {
            if let Some(input) = state.input.as_mut() {
                // A no-op waker: if the pipe is full, the writer task polls again with its own.
                let mut cx = Context::from_waker(Waker::noop());
                while written < frame.len() {
                    match input.as_mut().poll_write(&mut cx, &frame[written..]) {
                        Poll::Ready(Ok(n)) if n > 0 => written += n,
                        Poll::Ready(_) => {
                            state.close();
                            return;
                        }
                        Poll::Pending => break,
                    }
                }
                if written == frame.len() {
                    match input.as_mut().poll_flush(&mut cx) {
                        Poll::Ready(Ok(())) => return,
                        Poll::Ready(Err(_)) => {
                            state.close();
                            return;
                        }
                        // An empty frame makes the writer task finish the flush.
                        Poll::Pending => {}
                    }
                }
            }
        }
        if state.queued_bytes >= MAX_STDIN_BACKLOG {
            state.close();
            drop(state);
            self.shared.breach.trip(BACKLOG_BREACH);
            return;
        }
        let rest = if written == 0 {
            frame
        } else {
            frame[written..].to_vec()
        };
        state.queued_bytes += rest.len();
        state.queue.push_back(rest);
        drop(state);
        self.shared.queued.notify_one();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes queued frames in order until the kernel goes away or the stream fails.
async fn writer_task(shared: Arc<Shared>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = shared.queued.notified() => {}
        }
        loop {
            let (mut input, frame) = {
                let mut state = shared.lock();
                let Some(frame) = state.queue.pop_front() else {
                    break;
                };
                state.queued_bytes -= frame.len();
                // Only this task takes the stream, so it is always there; if not, the frame
                // waits for it rather than being lost.
                let Some(input) = state.input.take() else {
                    state.queued_bytes += frame.len();
                    state.queue.push_front(frame);
                    break;
                };
                (input, frame)
            };
            let written = tokio::select! {
                _ = cancel.cancelled() => None,
                written = async {
                    input.write_all(&frame).await?;
                    input.flush().await
                } => Some(written),
            };
            let mut state = shared.lock();
            match written {
                Some(Ok(())) if !state.closed => state.input = Some(input),
                // Cancelled, failed or closed meanwhile: nothing more reaches this kernel.
                _ => {
                    state.close();
                    return;
                }
            }
        }
    }
    shared.lock().close();
}

impl State {
    /// Drops the stream (the runner sees EOF once nothing else holds it) and every frame.
    fn close(&mut self) {
        self.closed = true;
        self.input = None;
        self.queue = VecDeque::new();
        self.queued_bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn frames_arrive_in_order_when_the_pipe_is_full() {
        // A tiny pipe: most frames cannot be written inline and go through the task.
        let (client, mut server) = tokio::io::duplex(64);
        let cancel = CancellationToken::new();
        let (stdin, task) = Stdin::new(Box::pin(client), cancel.clone(), Breach::default());
        let task = tokio::spawn(task);
        let mut expected = Vec::new();
        for i in 0..200 {
            let frame = format!("frame {i} {}\n", "x".repeat(i % 50)).into_bytes();
            expected.extend_from_slice(&frame);
            stdin.send(frame);
        }
        let mut got = vec![0; expected.len()];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, expected);
        cancel.cancel();
        task.await.unwrap();
        // After the task ended, frames are dropped, not queued forever.
        stdin.send(b"late\n".to_vec());
        assert!(stdin.shared.lock().queue.is_empty());
    }

    #[tokio::test]
    async fn a_reader_that_stops_reading_blocks_nobody() {
        let (client, _server) = tokio::io::duplex(16);
        let breach = Breach::default();
        let (stdin, task) = Stdin::new(Box::pin(client), CancellationToken::new(), breach.clone());
        let _task = tokio::spawn(task);
        for _ in 0..100 {
            stdin.send(vec![b'y'; 1000]);
        }
        // send never waited: everything past the pipe's 16 bytes is queued.
        assert!(!stdin.shared.lock().queue.is_empty());
        assert_eq!(breach.what(), None);
    }

    #[tokio::test]
    async fn a_reader_that_never_reads_trips_the_breach_at_the_bound() {
        let (client, server) = tokio::io::duplex(16);
        let breach = Breach::default();
        let (stdin, task) = Stdin::new(Box::pin(client), CancellationToken::new(), breach.clone());
        let task = tokio::spawn(task);
        let frame = vec![b'z'; 64 * 1024];
        let mut sent = 0;
        while breach.what().is_none() {
            stdin.send(frame.clone());
            sent += frame.len();
            let queued = stdin.shared.lock().queued_bytes;
            assert!(queued <= MAX_STDIN_BACKLOG + frame.len(), "{queued}");
            assert!(sent <= 2 * MAX_STDIN_BACKLOG, "never tripped");
        }
        assert_eq!(breach.what(), Some(BACKLOG_BREACH));
        // Everything queued is dropped, the stream is closed, and later frames are dropped.
        {
            let state = stdin.shared.lock();
            assert!(state.closed && state.queue.is_empty() && state.queued_bytes == 0);
        }
        stdin.send(frame);
        assert!(stdin.shared.lock().queue.is_empty());
        drop(server);
        task.abort();
    }
}
