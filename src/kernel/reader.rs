//! The reader task: reads a kernel's attach stream until it ends, at the pace of
//! `pace.rs`, hands stdout chunks (while a cell is active) and protocol frames to the running
//! cell under a byte budget, kills a kernel that breaks the protocol, and finds out why a
//! kernel died before telling the cell.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Reads the attach stream until it ends, the kernel is dropped, or the kernel breaks the
/// protocol (then it kills the kernel).
pub(super) async fn reader_task(mut task: ReaderTask) {
    let mut lines = LineSplitter::default();
    // The runner sends `ready` once; spawning waits for it.
    let mut ready_seen = false;
    // Protocol input with no use, over the kernel's life (`MAX_WASTE_BYTES`).
    let mut wasted = 0usize;
    let mut pace = Pace::new(READ_RATE, READ_BURST);
    // How long to wait before the next read (the pace; zero within its burst).
    let mut owed = Duration::ZERO;
    let started = Instant::now();
    'read: loop {
        if !owed.is_zero() {
            tokio::select! {
                _ = task.cancel.cancelled() => break,
                _ = task.breach.tripped() => break,
                _ = tokio::time::sleep(owed) => {}
            }
        }
        let item = tokio::select! {
            _ = task.cancel.cancelled() => break,
            _ = task.breach.tripped() => break,
            item = task.output.next() => item,
        };
        owed = match &item {
            Some(Ok(Chunk::Stdout(bytes))) => pace.spend(bytes.len()),
            Some(Ok(Chunk::Stderr(bytes))) => {
                let lines = memchr::memchr_iter(b'\n', bytes).count();
                pace.spend(bytes.len().saturating_add(lines.saturating_mul(LINE_COST)))
            }
            _ => Duration::ZERO,
        };
        match item {
            Some(Ok(Chunk::Stdout(bytes))) => {
                // Output between cells belongs to nobody and is dropped here, not buffered.
                if task.shared.active_cell.load(Ordering::Acquire) != 0
                    && !task
                        .events
                        .forward(bytes.len(), |permit| IoEvent::Output(bytes, permit))
                        .await
                {
                    break;
                }
            }
            Some(Ok(Chunk::Stderr(bytes))) => {
                let mut frames = Vec::new();
                let fed = lines.feed(&bytes, |line| match serde_json::from_slice::<KernelFrame>(line) {
                    Ok(frame) => frames.push((frame, line.len())),
                    Err(e) => {
                        wasted += line.len() + 1;
                        tracing::debug!(container = %short_id(&task.id), error = %e, "unparseable kernel frame dropped");
                    }
                });
                if fed.is_err() {
                    task.breach.trip(LINE_BREACH);
                    break;
                }
                if wasted > MAX_WASTE_BYTES {
                    task.breach.trip(WASTE_BREACH);
                    break;
                }
                for (frame, size) in frames {
                    match &frame {
                        KernelFrame::ToolCall { cell, call, .. } => {
                            let active = task.shared.active_cell.load(Ordering::Acquire);
                            if active == 0 || *cell != Some(active) {
                                // A settled cell's thread: refuse here, nobody else is listening.
                                refuse(&task.writer, *call, RETIRED_MESSAGE);
                                continue;
                            }
                        }
                        KernelFrame::Ready { .. } if !ready_seen => ready_seen = true,
                        // Nothing waits for these on this channel (a cell's outcome travels
                        // after its end marker on stdout; the host sends no `ping`).
                        KernelFrame::Ready { .. }
                        | KernelFrame::Done { .. }
                        | KernelFrame::Pong => {
                            wasted += size;
                            if wasted > MAX_WASTE_BYTES {
                                task.breach.trip(WASTE_BREACH);
                                break 'read;
                            }
                            continue;
                        }
                    }
                    if !task
                        .events
                        .forward(size, |permit| IoEvent::Frame(frame, permit))
                        .await
                    {
                        break 'read;
                    }
                }
            }
            Some(Err(e)) => {
                tracing::debug!(container = %short_id(&task.id), error = %e, "attach stream error");
                break;
            }
            None => break,
        }
    }
    if let Some(what) = task.breach.what() {
        // Recorded before the container goes, so nothing mistakes the kill for a crash.
        task.shared.die(Death::Protocol(what));
        tracing::warn!(container = %short_id(&task.id), breach = what, "kernel broke the protocol; killing it");
        // The streams are drained (and dropped) meanwhile: the engine does not finish removing
        // a container while its write to an attach connection nobody reads is blocked. The cell
        // (if any) learns of the death at once; nothing more is read from this kernel.
        let output = &mut task.output;
        let drain = async { while output.next().await.is_some() {} };
        let closed = async {
            let _ = task.events.tx.send(IoEvent::Closed).await;
        };
        let remove = task.shared.remove_container(task.engine.as_ref(), &task.id);
        tokio::select! {
            _ = task.cancel.cancelled() => {}
            (removed, (), ()) = futures::future::join3(remove, drain, closed) => {
                if let Err(e) = removed {
                    tracing::warn!(container = %short_id(&task.id), error = %e, "killing a kernel that broke the protocol");
                }
            }
        }
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
    task.shared
        .exited
        .store(true, std::sync::atomic::Ordering::Release);
    // A death recorded already (disposal, `sys.exit()`) means kernelbox is removing it.
    let death = if task.shared.death().is_some() {
        Death::Disposed
    } else {
        let fate = task
            .monitor
            .wait_died(&task.id, Duration::from_secs(3))
            .await;
        // No `die` event, or a polite stop (SIGTERM, as the daemon does when it shuts down):
        // find out whether the engine itself went away.
        let engine_gone = (fate.died.is_none() || fate.kill_signal == Some(15))
            && task
                .monitor
                .wait_break(task.epoch, Duration::from_secs(2))
                .await;
        if task.shared.death().is_some() {
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
    };
    tracing::debug!(container = %short_id(&task.id), ?death, lived = ?started.elapsed(), "kernel streams closed");
    task.shared.die(death);
    let _ = task.events.tx.send(IoEvent::Closed).await;
}
