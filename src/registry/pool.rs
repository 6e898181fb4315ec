//! The warm pool's books: ready kernels that belong to nobody, kept under the registry's one
//! lock so that a take is atomic with the new owner's admission (no two owners can take one
//! kernel) and pooled kernels count toward the host's cap.
//!
//! A pooled kernel leaves the pool exactly once: taken by one owner (it is never returned),
//! discarded to admit a kernel of another spec at the host's cap, found dead or past its
//! maximum age, or drained at shutdown. The orchestrator's refill task (`src/orchestrator/
//! pool.rs`) does the Docker work outside the lock: it reserves refills here, spawns, and
//! offers what it spawned.

use std::sync::Arc;

use tokio::time::{Duration, Instant};

use super::{Inner, Registry};
use crate::config::KernelSpec;
use crate::kernel::Kernel;
use crate::owner::Owner;
use crate::wire::Language;

/// One ready kernel in the pool.
#[derive(Debug)]
pub(super) struct Pooled {
    kernel: Arc<Kernel>,
    spec: KernelSpec,
    /// The language it was started with (its runner hosts that language's interpreter).
    language: Language,
    since: Instant,
}

impl Inner {
    /// Where a live pooled kernel of `spec` and `language` is, if there is one: the newest first, the one
    /// whose processes sat idle the shortest (a round trip to a kernel costs more the longer
    /// it slept: docs/performance.md "Performance"); the older ones are replaced at their maximum age.
    pub(super) fn pool_find(&self, spec: &KernelSpec, language: Language) -> Option<usize> {
        if self.closed {
            return None;
        }
        self.pool
            .iter()
            .rposition(|p| p.spec == *spec && p.language == language && p.kernel.is_alive())
    }

    /// Takes the pooled kernel at `index` for `owner`.
    pub(super) fn pool_take(&mut self, index: usize, owner: &Owner) -> Arc<Kernel> {
        let kernel = self.pool.remove(index).kernel;
        // A pooled kernel never had an owner: this cannot fail.
        let assigned = kernel.assign(owner);
        debug_assert!(assigned, "a pooled kernel had an owner");
        kernel
    }

    /// Removes `n` pooled kernels (never the one at `keep`, about to be taken), the oldest
    /// first, for disposal.
    pub(super) fn pool_discard(&mut self, n: usize, keep: Option<usize>) -> Vec<Arc<Kernel>> {
        let mut out = Vec::with_capacity(n);
        let mut i = 0;
        let mut kept = keep;
        while out.len() < n && i < self.pool.len() {
            if kept == Some(i) {
                i += 1;
                continue;
            }
            out.push(self.pool.remove(i).kernel);
            if let Some(k) = kept.as_mut() {
                if *k > i {
                    *k -= 1;
                }
            }
        }
        out
    }

    /// One refill of `language` in flight ended.
    fn pool_unpend(&mut self, language: Language) {
        if let Some(n) = self.pool_pending.get_mut(&language) {
            *n = n.saturating_sub(1);
        }
    }

    /// Kernels the host's cap counts: unpinned slots, pooled kernels and refills in flight.
    fn host_count(&self) -> usize {
        let unpinned = self
            .slots
            .values()
            .filter(|s| !s.pinned(&self.released_children))
            .count();
        unpinned + self.pool.len() + self.pool_pending()
    }

    /// Refills in flight, every language's.
    fn pool_pending(&self) -> usize {
        self.pool_pending.values().sum()
    }
}

impl Registry {
    /// Reserves room for new pooled kernels of `spec` and `language` so that that language's
    /// pool (ready and in flight) reaches `target`, within the host's cap and at most
    /// `max_new` in flight in all (every language's). Returns how many the caller must spawn,
    /// then [`Registry::pool_offer`] or [`Registry::pool_unreserve`] each.
    pub fn pool_reserve(
        &self,
        spec: &KernelSpec,
        language: Language,
        target: usize,
        max_new: usize,
    ) -> usize {
        let mut inner = self.lock();
        if inner.closed {
            return 0;
        }
        let pending = inner.pool_pending.get(&language).copied().unwrap_or(0);
        let ready = inner.pool.iter();
        let ready = ready.filter(|p| p.spec == *spec && p.language == language);
        let have = ready.count() + pending;
        let room = self.max_kernels.saturating_sub(inner.host_count());
        let n = target
            .saturating_sub(have)
            .min(room)
            .min(max_new.saturating_sub(inner.pool_pending()));
        if n > 0 {
            *inner.pool_pending.entry(language).or_insert(0) += n;
        }
        n
    }

    /// A reserved refill of `language` failed: its room is free again.
    pub fn pool_unreserve(&self, language: Language) {
        self.lock().pool_unpend(language);
    }

    /// Puts a freshly spawned kernel (a reserved refill) in the pool. Hands it back for
    /// disposal when the registry is closed or it no longer fits the host's cap (sessions
    /// took the room while it started).
    pub fn pool_offer(
        &self,
        spec: KernelSpec,
        language: Language,
        kernel: Arc<Kernel>,
    ) -> Option<Arc<Kernel>> {
        let mut inner = self.lock();
        inner.pool_unpend(language);
        if inner.closed || inner.host_count() >= self.max_kernels {
            return Some(kernel);
        }
        inner.pool.push(Pooled {
            kernel,
            spec,
            language,
            since: Instant::now(),
        });
        None
    }

    /// Removes pooled kernels that died (killed from outside, the engine went away) or are
    /// older than `max_age`, for disposal.
    pub fn pool_expired(&self, max_age: Duration) -> Vec<Arc<Kernel>> {
        let now = Instant::now();
        let mut inner = self.lock();
        let (gone, kept) = std::mem::take(&mut inner.pool).into_iter().partition(|p| {
            !p.kernel.is_alive() || now.saturating_duration_since(p.since) >= max_age
        });
        inner.pool = kept;
        gone.into_iter().map(|p: Pooled| p.kernel).collect()
    }

    /// When the oldest pooled kernel entered the pool.
    pub fn pool_oldest(&self) -> Option<Instant> {
        self.lock().pool.iter().map(|p| p.since).min()
    }

    /// Ready pooled kernels.
    pub fn pool_ready(&self) -> usize {
        self.lock().pool.len()
    }

    /// Ready pooled kernels of `language`.
    pub fn pool_ready_of(&self, language: Language) -> usize {
        let inner = self.lock();
        inner.pool.iter().filter(|p| p.language == language).count()
    }

    /// Empties the pool (shutdown: call after [`Registry::drain`], which refuses later offers).
    pub fn pool_drain(&self) -> Vec<Arc<Kernel>> {
        self.lock().pool.drain(..).map(|p| p.kernel).collect()
    }
}
