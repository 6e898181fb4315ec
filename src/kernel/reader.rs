//! The reader task: reads a kernel's attach stream until it ends, at the pace of
//! `pace.rs`, hands stdout chunks (while a cell is active) and protocol frames to the running
//! cell under a byte budget, kills a kernel that breaks the protocol, and finds out why a
//! kernel died before telling the cell.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::pace::{Pace, LINE_COST, READ_BURST, READ_RATE};
use super::protocol::{Breach, KernelFrame, LineSplitter, MAX_WASTE_BYTES, WASTE_BREACH};
use super::run::refuse;
use super::stdin::Stdin;
use super::{Death, IoEvent, Shared, MAX_READER_BACKLOG};
use crate::authority::RETIRED_MESSAGE;
use crate::docker::monitor::EventMonitor;
use crate::docker::{short_id, Chunk, Engine, EngineError};

/// The breach reported for a protocol line over [`MAX_FRAME_LINE`].
const LINE_BREACH: &str = "a protocol line longer than 1 MiB";

pub(super) struct ReaderTask {
    pub(super) id: String,
    pub(super) engine: Arc<dyn Engine>,
    pub(super) output: futures::stream::BoxStream<'static, Result<Chunk, EngineError>>,
    pub(super) events: Events,
    pub(super) breach: Breach,
    pub(super) writer: Stdin,
    pub(super) shared: Arc<Shared>,
    pub(super) monitor: EventMonitor,
    pub(super) epoch: u64,
    pub(super) cancel: CancellationToken,
}

/// The reader's side of the channel to the running cell.
pub(super) struct Events {
    pub(super) tx: mpsc::Sender<IoEvent>,
    /// Permits for [`MAX_READER_BACKLOG`] bytes of events.
    pub(super) backlog: Arc<Semaphore>,
    pub(super) breach: Breach,
    pub(super) drain: CancellationToken,
    pub(super) cancel: CancellationToken,
}

impl Events {
    /// Hands an event of `size` bytes to the cell once the backlog has room for it; false when
    /// the kernel is going away (dropped, disposed or breached) instead.
    async fn forward(
        &self,
        size: usize,
        event: impl FnOnce(OwnedSemaphorePermit) -> IoEvent,
    ) -> bool {
        // Clamped: a permit count is a u32, and no single event may need more than the whole.
        let permits = size.clamp(1, MAX_READER_BACKLOG) as u32;
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = self.drain.cancelled() => false,
            _ = self.breach.tripped() => false,
            sent = async {
                let Ok(permit) = self.backlog.clone().acquire_many_owned(permits).await else {
                    return false;
                };
                self.tx.send(event(permit)).await.is_ok()
            } => sent,
        }
    }
}

/// What the reader keeps of the kernel's stderr between reads: the line being split, whether
/// the runner said `ready`, and the protocol input with no use over the kernel's life
/// ([`MAX_WASTE_BYTES`]).
#[derive(Default)]
struct Frames {
    lines: LineSplitter,
    /// The runner sends `ready` once; spawning waits for it.
    ready_seen: bool,
    wasted: usize,
}

impl Frames {
    /// The frames a stderr chunk completes, each with its line length; the breach when the
    /// chunk breaks the protocol (a line too long, too much input with no use).
    fn split(&mut self, bytes: &[u8], id: &str) -> Result<Vec<(KernelFrame, usize)>, &'static str> {
        let mut frames = Vec::new();
        let wasted = &mut self.wasted;
        let fed = self.lines.feed(bytes, |line| match serde_json::from_slice::<KernelFrame>(line) {
            Ok(frame) => frames.push((frame, line.len())),
            Err(e) => {
                *wasted += line.len() + 1;
                tracing::debug!(container = %short_id(id), error = %e, "unparseable kernel frame dropped");
            }
        });
        if fed.is_err() {
            return Err(LINE_BREACH);
        }
        if self.wasted > MAX_WASTE_BYTES {
            return Err(WASTE_BREACH);
        }
        Ok(frames)
    }

    /// Counts a frame nothing waits for; the breach once too much input had no use.
    fn waste(&mut self, size: usize) -> Result<(), &'static str> {
        self.wasted += size;
        if self.wasted > MAX_WASTE_BYTES {
            return Err(WASTE_BREACH);
        }
        Ok(())
    }
}

/// Reads the attach stream until it ends, the kernel is dropped, or the kernel breaks the
/// protocol (then it kills the kernel).
pub(super) async fn reader_task(mut task: ReaderTask) {
    let started = Instant::now();
    task.read().await;
    if let Some(what) = task.breach.what() {
        task.kill(what).await;
        return;
    }
    if task.cancel.is_cancelled() {
        return;
    }
    if task.events.drain.is_cancelled() {
        // kernelbox is removing the kernel: read and drop what is left until the streams end.
        tokio::select! {
            _ = task.cancel.cancelled() => return,
            _ = async { while task.output.next().await.is_some() {} } => {}
        }
    }
    // The streams closed: the container is gone or going. Find out why before telling the cell.
    task.shared.exited.store(true, Ordering::Release);
    let death = task.why_closed().await;
    tracing::debug!(container = %short_id(&task.id), ?death, lived = ?started.elapsed(), "kernel streams closed");
    task.shared.die(death);
    let _ = task.events.tx.send(IoEvent::Closed).await;
}

impl ReaderTask {
    /// Reads at the pace of `pace.rs` until the streams end, the kernel is dropped or breached,
    /// or the cell's channel is gone.
    async fn read(&mut self) {
        let mut frames = Frames::default();
        let mut pace = Pace::new(READ_RATE, READ_BURST);
        // How long to wait before the next read (the pace; zero within its burst).
        let mut owed = Duration::ZERO;
        loop {
            if !owed.is_zero() {
                tokio::select! {
                    _ = self.cancel.cancelled() => break,
                    _ = self.breach.tripped() => break,
                    _ = tokio::time::sleep(owed) => {}
                }
            }
            let item = tokio::select! {
                _ = self.cancel.cancelled() => break,
                _ = self.breach.tripped() => break,
                item = self.output.next() => item,
            };
            owed = match &item {
                Some(Ok(Chunk::Stdout(bytes))) => pace.spend(bytes.len()),
                Some(Ok(Chunk::Stderr(bytes))) => {
                    let lines = memchr::memchr_iter(b'\n', bytes).count();
                    pace.spend(bytes.len().saturating_add(lines.saturating_mul(LINE_COST)))
                }
                _ => Duration::ZERO,
            };
            let read_on = match item {
                Some(Ok(Chunk::Stdout(bytes))) => self.stdout(bytes).await,
                Some(Ok(Chunk::Stderr(bytes))) => self.stderr(&bytes, &mut frames).await,
                Some(Err(e)) => {
                    tracing::debug!(container = %short_id(&self.id), error = %e, "attach stream error");
                    ControlFlow::Break(())
                }
                None => ControlFlow::Break(()),
            };
            if read_on.is_break() {
                break;
            }
        }
    }

    /// Hands cell output to the running cell. Output between cells belongs to nobody and is
    /// dropped here, not buffered.
    async fn stdout(&mut self, bytes: Bytes) -> ControlFlow<()> {
        if self.shared.active_cell.load(Ordering::Acquire) != 0
            && !self
                .events
                .forward(bytes.len(), |permit| IoEvent::Output(bytes, permit))
                .await
        {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    /// Hands the frames of a stderr chunk to the running cell: a tool call of no running cell
    /// is refused here, frames nothing waits for are counted as waste, a breach trips.
    async fn stderr(&mut self, bytes: &[u8], frames: &mut Frames) -> ControlFlow<()> {
        let split = match frames.split(bytes, &self.id) {
            Ok(split) => split,
            Err(what) => return self.trip(what),
        };
        for (frame, size) in split {
            match &frame {
                KernelFrame::ToolCall { cell, call, .. } => {
                    let active = self.shared.active_cell.load(Ordering::Acquire);
                    if active == 0 || *cell != Some(active) {
                        // A settled cell's thread: refuse here, nobody else is listening.
                        refuse(&self.writer, *call, RETIRED_MESSAGE);
                        continue;
                    }
                }
                KernelFrame::Ready { .. } if !frames.ready_seen => frames.ready_seen = true,
                // Forwarded only while the host waits for it (`Kernel::hibernate`).
                KernelFrame::Hibernating { .. }
                    if self.shared.hibernating.load(Ordering::Acquire) => {}
                // Nothing waits for these on this channel (a cell's outcome travels after its
                // end marker on stdout; the host sends no `ping`).
                KernelFrame::Ready { .. }
                | KernelFrame::Done { .. }
                | KernelFrame::Pong
                | KernelFrame::Hibernating { .. } => {
                    if let Err(what) = frames.waste(size) {
                        return self.trip(what);
                    }
                    continue;
                }
            }
            if !self
                .events
                .forward(size, |permit| IoEvent::Frame(frame, permit))
                .await
            {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    /// Records a breach of the protocol; reading stops.
    fn trip(&self, what: &'static str) -> ControlFlow<()> {
        self.breach.trip(what);
        ControlFlow::Break(())
    }

    /// Kills a kernel that broke the protocol (`what` it did).
    async fn kill(mut self, what: &'static str) {
        // Recorded before the container goes, so nothing mistakes the kill for a crash.
        self.shared.die(Death::Protocol(what));
        tracing::warn!(container = %short_id(&self.id), breach = what, "kernel broke the protocol; killing it");
        // The streams are drained (and dropped) meanwhile: the engine does not finish removing
        // a container while its write to an attach connection nobody reads is blocked. The cell
        // (if any) learns of the death at once; nothing more is read from this kernel.
        let output = &mut self.output;
        let drain = async { while output.next().await.is_some() {} };
        let closed = async {
            let _ = self.events.tx.send(IoEvent::Closed).await;
        };
        let remove = self.shared.remove_container(self.engine.as_ref(), &self.id);
        tokio::select! {
            _ = self.cancel.cancelled() => {}
            (removed, (), ()) = futures::future::join3(remove, drain, closed) => {
                if let Err(e) = removed {
                    tracing::warn!(container = %short_id(&self.id), error = %e, "killing a kernel that broke the protocol");
                }
            }
        }
    }

    /// Why the streams closed, asked of the engine's events. A death recorded already
    /// (disposal, `sys.exit()`) means kernelbox is removing the kernel.
    async fn why_closed(&mut self) -> Death {
        if self.shared.death().is_some() {
            return Death::Disposed;
        }
        let fate = self
            .monitor
            .wait_died(&self.id, Duration::from_secs(3))
            .await;
        // No `die` event, or a polite stop (SIGTERM, as the daemon does when it shuts down):
        // find out whether the engine itself went away.
        let engine_gone = (fate.died.is_none() || fate.kill_signal == Some(15))
            && self
                .monitor
                .wait_break(self.epoch, Duration::from_secs(2))
                .await;
        if self.shared.death().is_some() {
            Death::Disposed
        } else if fate.died_of_oom() {
            Death::Oom
        } else if engine_gone {
            Death::EngineRestarted
        } else if fate.killed {
            Death::Killed
        } else {
            Death::Crashed(fate.died.unwrap_or(-1))
        }
    }
}
