//! How the proxy is bounded: [`Limits`], the step timeout and head size, and the per-kernel
//! byte budget an upstream stream is metered by.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use std::future::Future;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Longest request head a kernel may send (request line and headers).
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// How long a kernel has to send a request head, and the proxy to resolve and connect.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a CONNECT tunnel has, from the proxy's `200` answer, to deliver its whole TLS
/// ClientHello: one deadline for all of it, however the bytes trickle in.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// A tunnel (plain or intercepted) that moves no byte either way for this long is closed.
pub const TUNNEL_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Resolves once `bytes` (a connection's bytes in and out) have not moved for `limit` (to
/// within a quarter of it).
pub(super) async fn idle(bytes_in: &AtomicU64, bytes_out: &AtomicU64, limit: Duration) {
    let moved = || {
        bytes_in
            .load(Ordering::Relaxed)
            .wrapping_add(bytes_out.load(Ordering::Relaxed))
    };
    let step = (limit / 4).max(Duration::from_millis(10));
    let mut last = moved();
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(step).await;
        let now = moved();
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= limit {
            return;
        }
    }
}

/// Connections open at once through the proxy in all, by default (each uses two descriptors:
/// the kernel's and the destination's).
pub const DEFAULT_TOTAL_CONNECTIONS: usize = 4096;

/// How the proxy is bounded.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections open at once from one kernel.
    pub connections_per_kernel: usize,
    /// Connections open at once in all (accepted, not yet known to be a kernel's included);
    /// each holds its permit, and its kernel's, until its tunnel or upstream connection ends.
    /// `kernelbox serve` lowers it to fit the descriptor limit (`server::descriptors`).
    pub connections: usize,
    /// Bytes per second one kernel moves (in and out together).
    pub bytes_per_second: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections_per_kernel: 64,
            connections: DEFAULT_TOTAL_CONNECTIONS,
            bytes_per_second: 50 * 1024 * 1024,
        }
    }
}

/// A per-kernel byte budget: `rate` a second, spent as bytes move; a connection that finds it
/// spent waits until it is positive again.
#[derive(Debug)]
pub(super) struct Bucket {
    rate: u64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub(super) fn new(rate: u64) -> Bucket {
        Bucket {
            rate: rate.max(1),
            state: Mutex::new((rate.max(1) as f64, Instant::now())),
        }
    }

    /// `None` when bytes may move now, else how long to wait.
    fn wait(&self) -> Option<Duration> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let rate = self.rate as f64;
        s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * rate).min(rate);
        s.1 = now;
        if s.0 > 0.0 {
            None
        } else {
            Some(Duration::from_secs_f64((-s.0 + 1.0) / rate))
        }
    }

    fn spend(&self, n: usize) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).0 -= n as f64;
    }
}

/// An upstream connection: bytes counted (for the audit line and the tenant's counters) and
/// paced by the kernel's [`Bucket`].
pub(super) struct Metered<S> {
    pub(super) inner: S,
    pub(super) bucket: Arc<Bucket>,
    pub(super) sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    pub(super) bytes_in: Arc<AtomicU64>,
    pub(super) bytes_out: Arc<AtomicU64>,
}

impl<S> Metered<S> {
    fn paced(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.bucket.wait() {
                None => return Poll::Ready(()),
                Some(d) => self.sleep = Some(Box::pin(tokio::time::sleep(d))),
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.paced(cx).is_pending() {
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        self.bucket.spend(n);
        self.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if self.paced(cx).is_pending() {
            return Poll::Pending;
        }
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.bucket.spend(n);
            self.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
