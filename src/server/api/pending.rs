//! Response bytes in flight: every response body's bytes are counted from when they are built
//! (a whole JSON body, an NDJSON event queued for a stream) until they are handed to the
//! connection, per tenant and for the host, and every response body must be read at a
//! minimum rate once a grace has passed (docs/reliability.md, "Bounded host resources";
//! docs/http-api.md, "Slow and idle clients cannot hold the server").
//!
//! - [`ResponseLimits`]: the budgets and the rate, with their defaults.
//! - [`Pending`]: the totals; a tenant at its budget (or the host at its) is refused a new
//!   cell with 429 `too_many_pending_results` until its responses drain.
//! - [`Meter`]: one response's bytes, charged by its producers and its body; while it holds
//!   any, the body's reader is on the clock, and a reader slower than the rate is cut.
//! - [`counted`]: the body wrapper. It hands the connection at most [`CHUNK`] bytes at a
//!   time (copies, so the connection never keeps a large buffer alive), releases a frame's
//!   bytes once the last of it is handed over, and everything it holds when dropped or cut.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use hyper::body::{Frame, SizeHint};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::server::error::ApiError;

/// The bounds on response bytes in flight and on how slowly a response may be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResponseLimits {
    /// Response bytes one tenant may have built and not yet sent; past it the tenant's new
    /// cells are refused (429 `too_many_pending_results`) until they drain.
    pub tenant_bytes: u64,
    /// The same for every tenant together (and unauthenticated responses).
    pub host_bytes: u64,
    /// Slowest a response may be read, in bytes per second, on average while it holds bytes
    /// once `rate_grace` has passed; 0 sets no minimum.
    pub min_rate: u64,
    /// How long a response may hold bytes before `min_rate` applies.
    pub rate_grace: Duration,
}

impl Default for ResponseLimits {
    fn default() -> Self {
        ResponseLimits {
            tenant_bytes: 64 * 1024 * 1024,
            host_bytes: 512 * 1024 * 1024,
            min_rate: 64 * 1024,
            rate_grace: Duration::from_secs(30),
        }
    }
}

impl ResponseLimits {
    /// What makes these limits unusable, if anything.
    pub fn problem(&self) -> Option<&'static str> {
        if self.tenant_bytes == 0 {
            Some("the per-tenant pending response budget must be positive")
        } else if self.host_bytes == 0 {
            Some("the host's pending response budget must be positive")
        } else {
            None
        }
    }
}

/// Most bytes handed to the connection at once. hyper asks for the next piece only when its
/// own queue has room, so a small piece also means a cut response is noticed (and its
/// connection closed) soon after the reader takes a few more bytes.
pub(crate) const CHUNK: usize = 8 * 1024;

#[derive(Debug, Default)]
struct Totals {
    host: u64,
    tenants: HashMap<Arc<str>, u64>,
}

/// Response bytes in flight, per tenant and for the host.
#[derive(Debug)]
pub(crate) struct Pending {
    limits: ResponseLimits,
    totals: Mutex<Totals>,
    cut: std::sync::atomic::AtomicU64,
}

impl Pending {
    pub(crate) fn new(limits: ResponseLimits) -> Pending {
        Pending {
            limits,
            totals: Mutex::new(Totals::default()),
            cut: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn totals(&self) -> std::sync::MutexGuard<'_, Totals> {
        self.totals.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, tenant: Option<&Arc<str>>, n: u64) {
        let mut totals = self.totals();
        totals.host += n;
        if let Some(tenant) = tenant {
            *totals.tenants.entry(tenant.clone()).or_default() += n;
        }
    }

    fn sub(&self, tenant: Option<&Arc<str>>, n: u64) {
        let mut totals = self.totals();
        totals.host = totals.host.saturating_sub(n);
        if let Some(tenant) = tenant {
            if let Some(held) = totals.tenants.get_mut(tenant) {
                *held = held.saturating_sub(n);
                if *held == 0 {
                    totals.tenants.remove(tenant);
                }
            }
        }
    }

    /// Whether `tenant` may start a new cell: refused (429 `too_many_pending_results`) while
    /// its responses built and not yet sent reach its budget, or everyone's reach the host's.
    pub(crate) fn admit(&self, tenant: &str) -> Result<(), ApiError> {
        let totals = self.totals();
        let mine = totals.tenants.get(tenant).copied().unwrap_or(0);
        let refusal = if mine >= self.limits.tenant_bytes {
            format!(
                "tenant {tenant:?} has {mine} bytes of responses its clients have not read \
                 (at most {}); read or close them, then retry",
                self.limits.tenant_bytes
            )
        } else if totals.host >= self.limits.host_bytes {
            format!(
                "kernelbox holds {} bytes of responses clients have not read (at most {}); \
                 retry later",
                totals.host, self.limits.host_bytes
            )
        } else {
            return Ok(());
        };
        Err(ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_pending_results",
                refusal,
            )
        })
    }

    /// Bytes of responses held now, for the host and for `tenant`.
    pub(crate) fn held(&self, tenant: Option<&str>) -> (u64, u64) {
        let totals = self.totals();
        let mine = tenant.and_then(|t| totals.tenants.get(t).copied());
        (totals.host, mine.unwrap_or(0))
    }

    /// Responses cut for being read too slowly, since the server started.
    pub(crate) fn cut_count(&self) -> u64 {
        self.cut.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
struct Clock {
    /// Bytes of this response held now.
    held: u64,
    /// Since when it has held bytes, and how many it handed over since.
    episode: Option<(Instant, u64)>,
    cut: bool,
    /// The body is gone: the rate watcher stops.
    done: bool,
}

/// One response's bytes in flight and its reader's clock.
#[derive(Debug)]
pub(crate) struct Meter {
    pending: Arc<Pending>,
    tenant: OnceLock<Arc<str>>,
    clock: Mutex<Clock>,
    changed: Notify,
}

impl Meter {
    pub(crate) fn new(pending: Arc<Pending>) -> Arc<Meter> {
        Arc::new(Meter {
            pending,
            tenant: OnceLock::new(),
            clock: Mutex::new(Clock::default()),
            changed: Notify::new(),
        })
    }

    /// Charges this response's bytes to `tenant` from now on (set once it is authenticated).
    pub(crate) fn set_tenant(&self, tenant: &str) {
        let _ = self.tenant.set(Arc::from(tenant));
    }

    fn clock(&self) -> std::sync::MutexGuard<'_, Clock> {
        self.clock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts `n` bytes of this response until the returned charge is dropped.
    pub(crate) fn charge(self: &Arc<Meter>, n: usize) -> Charge {
        let n = n as u64;
        let tenant = self.tenant.get().cloned();
        self.pending.add(tenant.as_ref(), n);
        let started = {
            let mut clock = self.clock();
            clock.held += n;
            let start = clock.episode.is_none() && clock.held > 0;
            if start {
                clock.episode = Some((Instant::now(), 0));
            }
            start
        };
        if started {
            self.changed.notify_one();
        }
        Charge {
            meter: self.clone(),
            tenant,
            bytes: n,
        }
    }

    fn release(&self, tenant: Option<&Arc<str>>, n: u64) {
        self.pending.sub(tenant, n);
        let mut clock = self.clock();
        clock.held = clock.held.saturating_sub(n);
        if clock.held == 0 {
            clock.episode = None;
        }
    }

    fn handed_over(&self, n: usize) {
        if let Some((_, sent)) = &mut self.clock().episode {
            *sent += n as u64;
        }
    }

    fn is_cut(&self) -> bool {
        self.clock().cut
    }

    /// When the reader falls below the rate, if it holds bytes and a rate is set.
    fn due(&self) -> Option<Instant> {
        let limits = self.pending.limits;
        let clock = self.clock();
        let (since, sent) = clock.episode?;
        if limits.min_rate == 0 || clock.done || clock.cut {
            return None;
        }
        // No deadline at all past what a clock can hold (a grace of centuries).
        let at = Duration::try_from_secs_f64(sent as f64 / limits.min_rate as f64).ok()?;
        since.checked_add(
            at.max(limits.rate_grace)
                .checked_add(Duration::from_millis(10))?,
        )
    }
}

/// Bytes of one response counted until dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    meter: Arc<Meter>,
    tenant: Option<Arc<str>>,
    bytes: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.meter.release(self.tenant.as_ref(), self.bytes);
    }
}

/// A frame being handed over in pieces, with its charge.
struct Current {
    data: Bytes,
    offset: usize,
    _charge: Charge,
}

/// What a counted body holds: dropped at once when it is cut.
struct Held {
    inner: Body,
    current: Option<Current>,
    /// The charge of a whole body counted when the response was built, for its first frame.
    prepaid: Option<Charge>,
}

/// A response body counted by its [`Meter`] and cut when read too slowly.
struct Counted {
    meter: Arc<Meter>,
    held: Arc<Mutex<Option<Held>>>,
    /// Exact length of the whole body, when known (kept for `Content-Length`).
    exact: Option<u64>,
    yielded: u64,
}

/// The error a cut body ends with: hyper then closes the connection.
#[derive(Debug, thiserror::Error)]
#[error("the response was read slower than the server's minimum rate and was cut")]
struct TooSlow;

impl Drop for Counted {
    fn drop(&mut self) {
        self.meter.clock().done = true;
        self.meter.changed.notify_one();
        // What it held is released with it.
        drop(self.held.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

impl hyper::body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let mut slot = this.held.lock().unwrap_or_else(|p| p.into_inner());
        let Some(held) = slot.as_mut() else {
            return Poll::Ready(if this.meter.is_cut() {
                Some(Err(axum::Error::new(TooSlow)))
            } else {
                None
            });
        };
        loop {
            if let Some(current) = &mut held.current {
                let end = (current.offset + CHUNK).min(current.data.len());
                let piece = Bytes::copy_from_slice(&current.data[current.offset..end]);
                current.offset = end;
                if end >= current.data.len() {
                    held.current = None;
                }
                this.meter.handed_over(piece.len());
                this.yielded += piece.len() as u64;
                return Poll::Ready(Some(Ok(Frame::data(piece))));
            }
            match Pin::new(&mut held.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => {
                        let charge = match held.prepaid.take() {
                            Some(prepaid) => prepaid,
                            None => this.meter.charge(data.len()),
                        };
                        held.current = Some(Current {
                            data,
                            offset: 0,
                            _charge: charge,
                        });
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Poll::Ready(None) => {
                    *slot = None;
                    return Poll::Ready(None);
                }
                other => return other,
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let slot = self.held.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_ref() {
            None => !self.meter.is_cut(),
            Some(held) => held.current.is_none() && held.inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact {
            Some(n) => SizeHint::with_exact(n.saturating_sub(self.yielded)),
            None => SizeHint::default(),
        }
    }
}

/// `body` counted by `meter` (a body of known length from now, as it is already built) and
/// cut when read slower than the rate: a timer keeps the clock, so a reader the connection no
/// longer polls (its socket full) is cut all the same, and what the body held is released at
/// once; the connection closes when it next asks for bytes.
pub(crate) fn counted(meter: Arc<Meter>, body: Body) -> Body {
    let exact = hyper::body::Body::size_hint(&body).exact();
    let prepaid = exact.filter(|n| *n > 0).map(|n| meter.charge(n as usize));
    let held = Arc::new(Mutex::new(Some(Held {
        inner: body,
        current: None,
        prepaid,
    })));
    if meter.pending.limits.min_rate > 0 {
        tokio::spawn(watch(meter.clone(), held.clone()));
    }
    Body::new(Counted {
        meter,
        held,
        exact,
        yielded: 0,
    })
}

/// Cuts the body when its reader falls below the rate; returns when the body is gone.
async fn watch(meter: Arc<Meter>, held: Arc<Mutex<Option<Held>>>) {
    loop {
        if meter.clock().done {
            return;
        }
        let due = meter.due();
        tokio::select! {
            _ = meter.changed.notified() => continue,
            _ = sleep_until(due) => {}
        }
        if meter.due().is_some_and(|d| d <= Instant::now()) {
            meter.clock().cut = true;
            meter
                .pending
                .cut
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::debug!("cutting a response read slower than the minimum rate");
            drop(held.lock().unwrap_or_else(|p| p.into_inner()).take());
            return;
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
