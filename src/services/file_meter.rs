//! [`FileMeter`]: what the bytes of file transfers are held to (`docs/files.md`): every byte an
//! upload's body yields and every byte a download's reader takes is counted as it passes (for
//! `/metrics` and the usage ledger), and a download read slower than the configured rate is
//! cut, its kernel let go.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::files::{ByteStream, DownloadStream, TransferError};
use crate::owner::Owner;
use crate::usage::Pending;

/// File bytes moved through the orchestrator's file calls ([`write_file`], [`read_file`]),
/// whoever called them: the HTTP file API, the MCP file tools, the library. The one count
/// behind `kernelbox_file_bytes_total{direction}` (docs/files.md "Files in and out of a kernel").
///
/// [`write_file`]: crate::Orchestrator::write_file
/// [`read_file`]: crate::Orchestrator::read_file
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileBytes {
    /// Bytes taken from uploads' bodies, into kernels.
    pub upload: u64,
    /// Bytes handed to the readers of downloads (files and tars; not listings), out of
    /// kernels.
    pub download: u64,
}

/// What a download keeps until it ends: the kernel held (a registry slot, or a workspace's
/// transfer kernel).
pub(crate) type Guard = Box<dyn Send>;

type Held = std::sync::Mutex<Option<(DownloadStream, Guard)>>;

/// The file transfers' counters and the slow downloads' cut.
pub(crate) struct FileMeter {
    upload: Arc<AtomicU64>,
    download: Arc<AtomicU64>,
    /// The usage ledger's pending hours (`services/usage.rs`).
    ledger: Arc<Pending>,
    /// Owns each download's rate timer.
    tracker: TaskTracker,
    /// Cuts every download at shutdown.
    shutdown: CancellationToken,
}

impl FileMeter {
    pub(crate) fn new(
        ledger: Arc<Pending>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
    ) -> FileMeter {
        FileMeter {
            upload: Arc::default(),
            download: Arc::default(),
            ledger,
            tracker,
            shutdown,
        }
    }

    /// The bytes counted so far.
    pub(crate) fn snapshot(&self) -> FileBytes {
        FileBytes {
            upload: self.upload.load(Ordering::Relaxed),
            download: self.download.load(Ordering::Relaxed),
        }
    }

    /// `body`, its bytes counted as `owner`'s upload (metrics and the usage ledger).
    pub(crate) fn count_upload(&self, owner: &Owner, body: ByteStream) -> ByteStream {
        let (counter, ledger) = (self.upload.clone(), self.ledger.clone());
        let (tenant, session) = (owner.tenant.clone(), owner.session.clone());
        body.inspect_ok(move |chunk| {
            counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            ledger.record(&tenant, &session, |r| r.file_bytes_in += chunk.len() as u64);
        })
        .boxed()
    }

    /// `body`, its bytes counted as `owner`'s download (metrics and the usage ledger).
    pub(crate) fn count_download(&self, owner: &Owner, body: DownloadStream) -> DownloadStream {
        let (counter, ledger) = (self.download.clone(), self.ledger.clone());
        let (tenant, session) = (owner.tenant.clone(), owner.session.clone());
        body.inspect_ok(move |chunk| {
            counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            ledger.record(&tenant, &session, |r| {
                r.file_bytes_out += chunk.len() as u64;
            });
        })
        .boxed()
    }

    /// `owner`'s download: counted ([`Self::count_download`]), holding `hold` until it ends,
    /// and cut (the stream and the hold dropped; the reader then gets an error) when, `grace`
    /// after it started, it has been read slower than `rate` bytes/s on average, or when the
    /// orchestrator shuts down. A timer task owned by the tracker keeps the clock, so a reader
    /// hyper no longer polls (its socket full) is cut all the same. A reader that stops
    /// reading altogether is also cut by the server's send timeout
    /// (`server::Limits::send_timeout`).
    pub(crate) fn download(
        &self,
        owner: &Owner,
        body: DownloadStream,
        hold: Guard,
        rate: u64,
        grace: Duration,
    ) -> DownloadStream {
        let cut = self.slow_cut(body, hold, rate, grace);
        self.count_download(owner, cut)
    }

    /// `body` holding `hold`, cut as [`Self::download`] says.
    fn slow_cut(
        &self,
        body: DownloadStream,
        hold: Guard,
        rate: u64,
        grace: Duration,
    ) -> DownloadStream {
        use std::task::Poll;
        let held: Arc<Held> = Arc::new(std::sync::Mutex::new(Some((body, hold))));
        let sent = Arc::new(AtomicU64::new(0));
        let done = CancellationToken::new();
        let started = tokio::time::Instant::now();
        {
            let (held, sent, done) = (held.clone(), sent.clone(), done.clone());
            let shutdown = self.shutdown.clone();
            self.tracker.spawn(async move {
                loop {
                    // The earliest moment the reader can fall below the rate.
                    let due = if rate == 0 {
                        None
                    } else {
                        let at = Duration::from_secs_f64(
                            sent.load(Ordering::Acquire) as f64 / rate as f64,
                        );
                        Some(started + at.max(grace) + Duration::from_millis(10))
                    };
                    tokio::select! {
                        _ = done.cancelled() => return,
                        _ = shutdown.cancelled() => break,
                        _ = sleep_until(due) => {
                            let elapsed = started.elapsed().as_secs_f64();
                            if (sent.load(Ordering::Acquire) as f64) < rate as f64 * elapsed {
                                break;
                            }
                        }
                    }
                }
                // Dropping the stream and the hold releases the kernel now.
                let cut = held.lock().unwrap_or_else(|p| p.into_inner()).take();
                drop(cut);
            });
        }
        let guard = done.drop_guard();
        let mut ended = false;
        futures::stream::poll_fn(move |cx| {
            let _ = &guard;
            if ended {
                return Poll::Ready(None);
            }
            let mut slot = held.lock().unwrap_or_else(|p| p.into_inner());
            let Some((body, _)) = slot.as_mut() else {
                ended = true;
                return Poll::Ready(Some(Err(TransferError::TooSlow(rate))));
            };
            let polled = body.poll_next_unpin(cx);
            match &polled {
                Poll::Ready(Some(Ok(bytes))) => {
                    sent.fetch_add(bytes.len() as u64, Ordering::AcqRel);
                }
                Poll::Ready(None | Some(Err(_))) => {
                    ended = true;
                    *slot = None;
                }
                Poll::Pending => {}
            }
            polled
        })
        .boxed()
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
