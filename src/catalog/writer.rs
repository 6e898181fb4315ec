//! The writer thread: changes in through a bounded channel, applied in batches.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};

use super::{Catalog, Change, BATCH, QUEUE};

/// Answers once a change is durable; dropped unanswered when it could not be written.
pub type Durable = tokio::sync::oneshot::Receiver<()>;

enum Msg {
    Change(Change, Option<tokio::sync::oneshot::Sender<()>>),
    /// Everything queued before it is applied; then the sender is answered.
    Flush(SyncSender<()>),
    /// Apply what is queued and stop.
    Close,
}

/// Feeds a [`Catalog`] from one dedicated thread. Recording never blocks: a change that does
/// not fit the bounded queue is dropped, logged and counted as a failure, as is a change the
/// catalog refused.
pub struct CatalogWriter {
    tx: Mutex<Option<SyncSender<Msg>>>,
    closed: AtomicBool,
    failures: Arc<AtomicU64>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for CatalogWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CatalogWriter")
            .field("failures", &self.failures())
            .finish_non_exhaustive()
    }
}

impl CatalogWriter {
    /// Starts the writer thread for `catalog`.
    pub fn start(catalog: Arc<dyn Catalog>) -> std::io::Result<CatalogWriter> {
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let failures = Arc::new(AtomicU64::new(0));
        let counted = failures.clone();
        let thread = std::thread::Builder::new()
            .name("kernelbox-catalog".into())
            .spawn(move || write_forever(catalog.as_ref(), &rx, &counted))?;
        Ok(CatalogWriter {
            tx: Mutex::new(Some(tx)),
            closed: AtomicBool::new(false),
            failures,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Queues a change without blocking. After [`CatalogWriter::close`] changes are ignored.
    pub fn record(&self, change: Change) {
        self.send(change, None);
    }

    /// [`CatalogWriter::record`], and a receiver answered once the change is durable (it
    /// errs at once when the change was dropped or ignored, or later when the write failed).
    pub fn record_durable(&self, change: Change) -> Durable {
        let (ack, durable) = tokio::sync::oneshot::channel();
        self.send(change, Some(ack));
        durable
    }

    fn send(&self, change: Change, ack: Option<tokio::sync::oneshot::Sender<()>>) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let Some(tx) = tx.as_ref() else { return };
        match tx.try_send(Msg::Change(change, ack)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("catalog queue full; a change was dropped");
            }
            Err(TrySendError::Disconnected(_)) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("catalog writer stopped; a change was dropped");
            }
        }
    }

    /// Changes dropped or refused so far.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Waits (blocking) until everything recorded so far is applied or has failed.
    pub fn flush(&self) {
        let (ack, done) = std::sync::mpsc::sync_channel(1);
        let sent = {
            let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
            tx.as_ref()
                .is_some_and(|tx| tx.send(Msg::Flush(ack)).is_ok())
        };
        if sent {
            let _ = done.recv();
        }
    }

    /// Applies everything queued, stops the thread and waits for it (blocking). Idempotent.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(tx) = tx {
            let _ = tx.send(Msg::Close);
        }
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

/// What one pass of the writer collected.
#[derive(Default)]
struct Batch {
    changes: Vec<Change>,
    durable: Vec<tokio::sync::oneshot::Sender<()>>,
    flushed: Vec<SyncSender<()>>,
}

fn write_forever(catalog: &dyn Catalog, rx: &Receiver<Msg>, failures: &AtomicU64) {
    let mut batch = Batch::default();
    loop {
        let mut close = false;
        match rx.recv() {
            Ok(msg) => close |= batch.take(msg),
            Err(_) => return,
        }
        while !close && batch.changes.len() < BATCH {
            match rx.try_recv() {
                Ok(msg) => close |= batch.take(msg),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    close = true;
                }
            }
        }
        if !batch.changes.is_empty() {
            match catalog.apply(&batch.changes) {
                Ok(()) => {
                    for ack in batch.durable.drain(..) {
                        let _ = ack.send(());
                    }
                }
                Err(e) => {
                    failures.fetch_add(batch.changes.len() as u64, Ordering::Relaxed);
                    tracing::warn!(error = %e, changes = batch.changes.len(), "catalog write failed");
                    batch.durable.clear();
                }
            }
            batch.changes.clear();
        }
        for ack in batch.flushed.drain(..) {
            let _ = ack.send(());
        }
        if close {
            return;
        }
    }
}

impl Batch {
    /// Sorts a message into the batch; true for `Close`.
    fn take(&mut self, msg: Msg) -> bool {
        match msg {
            Msg::Change(c, ack) => {
                self.changes.push(c);
                self.durable.extend(ack);
            }
            Msg::Flush(ack) => self.flushed.push(ack),
            Msg::Close => return true,
        }
        false
    }
}
