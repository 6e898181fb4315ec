//! The warm pool (`docs/architecture.md`, "The warm pool"): kernels created, started and
//! runner-ready before anyone asks, owned by nobody, so a new owner's first cell skips the cold
//! start. The books (and the atomic take) are the registry's (`src/registry/pool.rs`); this
//! file does the Docker work: the refill task, disposal of expired or discarded pooled
//! kernels, and naming a taken kernel after its owner.
//!
//! The refill runs in the background, at most [`POOL_REFILL_CONCURRENCY`] spawns at a time (the
//! pool's share of the engine), starts one only once new owners stopped arriving for
//! [`REFILL_SETTLE`] and none is starting cold, and never holds the registry's lock across an
//! engine call. A new owner that finds the pool empty starts cold at once: nothing waits on a
//! refill.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::sync::Notify;
use tokio::time::Duration;

use super::Orchestrator;
use crate::config::KernelSpec;
use crate::histogram::Histogram;
use crate::kernel::{Kernel, KernelError, SpawnRequest, Yield};
use crate::owner::KernelKey;
use crate::registry::{Registry, Slot};
use crate::wire::Language;

/// Pooled kernels spawned at once by the refill. The refill also starts none while a new
/// owner's kernel is starting cold, and a refill under way gives way before each of its
/// engine steps while one is ([`crate::kernel::Yield`]), so a cold start competes with at
/// most this many engine steps of the pool for the engine.
pub const POOL_REFILL_CONCURRENCY: usize = 1;

/// Longest a refill spawn gives way to cold starts in all: a steady stream of new owners
/// delays the pool's refill by this much at most, never starves it.
const POOL_YIELD_MAX: Duration = Duration::from_secs(2);

/// The refill starts a spawn only once no new owner has got a kernel for this long: new
/// owners come in bursts, and a burst that empties the pool is often followed at once by a
/// miss, whose cold start would otherwise share the engine with the refill's first step
/// (later steps give way to it, [`crate::kernel::Yield`]).
pub(super) const REFILL_SETTLE: Duration = Duration::from_millis(25);

/// Longest time between two looks at the pool (kernels that died in it, room freed by
/// sessions that went away); takes and expiries wake the refill at once.
const POOL_CHECK: Duration = Duration::from_secs(5);

/// After a refill fails (image missing, engine down), the first wait before the next try;
/// doubled on each failure in a row up to [`REFILL_BACKOFF_MAX`].
const REFILL_BACKOFF: Duration = Duration::from_millis(500);
const REFILL_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Longest a take's follow-up (naming the kernel, waking the refill) waits for the taker's
/// first cell to end, so that a long first cell does not keep the pool short or the kernel
/// unnamed.
pub(super) const TAKE_SETTLE: Duration = Duration::from_millis(250);

/// A taken kernel is renamed only once none of its owner's cells began or ended for this
/// long ([`POOL_YIELD_MAX`] after its first cell ended, or [`TAKE_SETTLE`] after the take, at
/// most): a rename while the owner runs cells back to back made the next cell several times
/// slower.
pub(super) const RENAME_QUIET: Duration = Duration::from_millis(50);

/// Upper bounds of the refill-time histogram (one pooled kernel spawned), in seconds.
pub const REFILL_BUCKETS: [f64; 10] = [0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0];

/// One language's share of the warm pool, for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LanguagePool {
    /// Its configured size (`PoolConfig::size_of`).
    pub size: usize,
    /// Its ready pooled kernels now.
    pub ready: usize,
    /// New kernels of the language that came out of the pool.
    pub hits: u64,
    /// New kernels of the language started cold (its pool was empty).
    pub misses: u64,
}

/// The warm pool's counters, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolStats {
    /// The configured size, every language's (`PoolConfig::total`; 0: no pool).
    pub size: usize,
    /// Ready pooled kernels now.
    pub ready: usize,
    /// New kernels that came out of the pool.
    pub hits: u64,
    /// New kernels started cold while the pool was configured (it was empty).
    pub misses: u64,
    /// Time to spawn one pooled kernel, successful refills.
    pub refills: Histogram,
    /// Refills that failed.
    pub refill_failures: u64,
    /// Each pooled language's share (the languages with a size, `PoolConfig::size_of`).
    pub languages: BTreeMap<Language, LanguagePool>,
}

/// The pool's state in the orchestrator.
pub(super) struct PoolState {
    /// What pooled kernels are made from (the configuration's one spec).
    pub(super) spec: KernelSpec,
    /// Wakes the refill: a take, a discard.
    pub(super) wake: Notify,
    pub(super) stats: Mutex<PoolStats>,
    /// The refill task, awaited at shutdown before the final sweep.
    pub(super) task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Ready pooled kernels, published after every change the orchestrator makes.
    pub(super) ready: tokio::sync::watch::Sender<usize>,
    /// Cold starts under way (see [`ColdStart`]); refills give way while it is not zero.
    cold: tokio::sync::watch::Sender<usize>,
    /// When the last new owner got its kernel (see [`REFILL_SETTLE`]).
    last_take: Mutex<Option<tokio::time::Instant>>,
}

/// A cold start under way; the refill starts no spawn while one is, and is woken when the
/// last one ends.
pub(super) struct ColdStart<'a>(&'a PoolState);

impl Drop for ColdStart<'_> {
    fn drop(&mut self) {
        let mut last = false;
        self.0.cold.send_modify(|n| {
            *n = n.saturating_sub(1);
            last = *n == 0;
        });
        if last {
            self.0.wake.notify_one();
        }
    }
}

impl PoolState {
    pub(super) fn new(spec: KernelSpec, config: &crate::config::PoolConfig) -> PoolState {
        let languages = Language::ALL.into_iter().filter_map(|language| {
            let size = config.size_of(language);
            (size > 0).then(|| {
                (
                    language,
                    LanguagePool {
                        size,
                        ..LanguagePool::default()
                    },
                )
            })
        });
        PoolState {
            spec,
            wake: Notify::new(),
            stats: Mutex::new(PoolStats {
                size: config.total(),
                ready: 0,
                hits: 0,
                misses: 0,
                refills: Histogram::new(&REFILL_BUCKETS),
                refill_failures: 0,
                languages: languages.collect(),
            }),
            task: Mutex::new(None),
            ready: tokio::sync::watch::Sender::new(0),
            cold: tokio::sync::watch::Sender::new(0),
            last_take: Mutex::new(None),
        }
    }

    /// Marks a cold start under way until the guard is dropped.
    pub(super) fn cold_start(&self) -> ColdStart<'_> {
        self.cold.send_modify(|n| *n += 1);
        ColdStart(self)
    }

    fn cold_starts(&self) -> usize {
        *self.cold.borrow()
    }

    pub(super) fn stats(&self) -> std::sync::MutexGuard<'_, PoolStats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes the number of ready pooled kernels (for [`Orchestrator::wait_pool_ready`]).
    pub(super) fn publish(&self, registry: &Registry) {
        self.ready.send_replace(registry.pool_ready());
    }

    /// Counts a new kernel of `language`: out of the pool, or cold while a pool is configured
    /// (in its language's share too when that language is pooled).
    pub(super) fn count_take(&self, registry: &Registry, language: Language, hit: bool) {
        if self.stats().size == 0 {
            return;
        }
        self.publish(registry);
        *self.last_take.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(tokio::time::Instant::now());
        let mut stats = self.stats();
        let share = stats.languages.get_mut(&language);
        match (hit, share) {
            (true, Some(share)) => share.hits += 1,
            (false, Some(share)) => share.misses += 1,
            _ => {}
        }
        if hit {
            stats.hits += 1;
        } else {
            stats.misses += 1;
        }
    }
}

/// Disposes of kernels that left the pool without an owner.
pub(super) async fn dispose_pooled(kernels: Vec<Arc<Kernel>>) {
    for kernel in kernels {
        crate::services::dispose_kernel(&kernel).await;
    }
}

impl Orchestrator {
    /// The spec a new owner of `key` may take a pooled kernel of: when the pool is on and the
    /// key asks for the pool's image and mode (a tenant or request naming another image, e.g.
    /// the data-science one, gets a kernel of its own image, cold).
    pub(super) fn pool_spec(&self, key: &KernelKey) -> Option<&KernelSpec> {
        let spec = &self.inner.pool.spec;
        // A kernel with a network policy is made on the egress network with its own proxy
        // credential: never a pooled one (docs/architecture.md, "The warm pool").
        if self.grant_of(&key.owner).is_some() {
            return None;
        }
        // Nor is a kernel whose `/work` is its session's workspace (`docs/workspaces.md`).
        if self.workspace_policy(&key.owner.tenant).is_some() {
            return None;
        }
        // A tenant on another runtime never gets a kernel of the pool's (docs/runtimes.md),
        // nor does a context of a language the pool holds none of (each pooled kernel runs
        // the language it was started with).
        (self.inner.config.pool.size_of(key.context.language) > 0
            && spec.image == key.image
            && spec.mode == key.mode
            && spec.sandbox.runtime == key.runtime
            // Nor a kernel of a session whose other contexts have a `/work` to share (a
            // pooled kernel's is its own: `docs/contract.md`, "Languages").
            && self.inner.registry.files_volume(key).is_none())
        .then_some(spec)
    }

    /// What follows a take, in the background once the taker's first cell ends (the returned
    /// guard is dropped) or [`TAKE_SETTLE`] passes, so neither competes with that cell for
    /// the engine: the refill is woken, and the kernel is named after its owner and
    /// generation (`labels::taken_name`) so the admin verbs (`kernelbox ps`, `inspect`, `kill
    /// --owner/--tenant`) see who has it. The rename waits for a gap between the owner's
    /// cells ([`RENAME_QUIET`]) and for no new owner to be starting cold, [`POOL_YIELD_MAX`]
    /// at most in all.
    pub(super) fn after_take(
        &self,
        key: &KernelKey,
        slot: &Arc<Slot>,
        kernel: &Arc<Kernel>,
    ) -> tokio_util::sync::DropGuard {
        let name = crate::labels::taken_name(
            &key.owner.tenant,
            &key.owner.to_string(),
            slot.generation(),
            kernel.short_id(),
        );
        let first_cell = tokio_util::sync::CancellationToken::new();
        let ended = first_cell.clone();
        let this = self.clone();
        let kernel = kernel.clone();
        let slot = slot.clone();
        self.inner.tasks.tracker.spawn(async move {
            let inner = &this.inner;
            tokio::select! {
                _ = ended.cancelled() => {}
                _ = tokio::time::sleep(TAKE_SETTLE) => {}
                _ = inner.tasks.cancel.cancelled() => return,
            }
            inner.pool.wake.notify_one();
            let until = tokio::time::Instant::now() + POOL_YIELD_MAX;
            // The rename takes the engine a millisecond or more: a cell of the owner's
            // starting meanwhile would wait on it, so it waits for a gap between cells (no
            // cell began or ended for RENAME_QUIET; a long cell running is such a gap).
            loop {
                let seen = slot.last_used();
                tokio::select! {
                    _ = tokio::time::sleep(RENAME_QUIET) => {}
                    _ = inner.tasks.cancel.cancelled() => return,
                }
                if slot.last_used() == seen || tokio::time::Instant::now() >= until {
                    break;
                }
            }
            // It also gives way to cold starts (a burst that emptied the pool is often
            // followed at once by a miss).
            let turn = Yield {
                priority: inner.pool.cold.subscribe(),
                until,
                cancel: inner.tasks.cancel.clone(),
            };
            if turn.give_way().await.is_err() {
                return;
            }
            if let Err(e) = kernel.rename(&name).await {
                // Removed meanwhile (cleared, killed): nothing left to name.
                if kernel.is_alive() {
                    tracing::warn!(container = %kernel.short_id(), error = %e, "naming a taken pooled kernel");
                }
            }
        });
        first_cell.drop_guard()
    }

    /// Starts the refill task (when the pool is on).
    pub(super) fn start_pool(&self) {
        if self.inner.config.pool.total() == 0 {
            return;
        }
        let this = self.clone();
        let handle = self
            .inner
            .tasks
            .tracker
            .spawn(async move { this.refill_forever().await });
        *self
            .inner
            .pool
            .task
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(handle);
    }

    /// Waits (at most `limit`) for the refill task to finish its spawns in flight after
    /// shutdown began; they find the registry closed and dispose of their kernels.
    pub(super) async fn stop_pool(&self, limit: Duration) {
        let task = self
            .inner
            .pool
            .task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(task) = task {
            let _ = tokio::time::timeout(limit, task).await;
        }
        let left = self.inner.registry.pool_drain();
        self.inner.pool.publish(&self.inner.registry);
        dispose_pooled(left).await;
    }

    /// Keeps the pool at its size until shutdown: replaces dead and expired kernels, spawns
    /// into free room at most [`POOL_REFILL_CONCURRENCY`] at a time, backs off after failures.
    async fn refill_forever(&self) {
        let inner = &self.inner;
        let config = &inner.config;
        let mut spawning = FuturesUnordered::new();
        let mut backoff = Duration::ZERO;
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            let gone = inner.registry.pool_expired(config.pool.max_age);
            if !gone.is_empty() {
                tracing::debug!(kernels = gone.len(), "pooled kernels expired or died");
                self.inner.pool.publish(&self.inner.registry);
                dispose_pooled(gone).await;
            }
            let now = tokio::time::Instant::now();
            let settled_at = inner
                .pool
                .last_take
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .map(|t| t + REFILL_SETTLE)
                .filter(|at| *at > now);
            let may_spawn = retry_at.is_none_or(|at| now >= at) && settled_at.is_none();
            if may_spawn && inner.pool.cold_starts() == 0 {
                retry_at = None;
                // Python's share first, then the other languages' (`PoolConfig::languages`),
                // POOL_REFILL_CONCURRENCY spawns in flight in all.
                for language in Language::ALL {
                    let n = inner.registry.pool_reserve(
                        &inner.pool.spec,
                        language,
                        config.pool.size_of(language),
                        POOL_REFILL_CONCURRENCY,
                    );
                    for _ in 0..n {
                        spawning.push(self.spawn_pooled(language));
                    }
                }
            }
            let mut next = tokio::time::Instant::now() + POOL_CHECK;
            if let Some(oldest) = inner.registry.pool_oldest() {
                next = next.min(oldest + config.pool.max_age);
            }
            if let Some(at) = retry_at.into_iter().chain(settled_at).min() {
                next = next.min(at);
            }
            tokio::select! {
                _ = inner.tasks.cancel.cancelled() => break,
                _ = inner.pool.wake.notified() => {}
                _ = tokio::time::sleep_until(next) => {}
                Some(spawned) = spawning.next(), if !spawning.is_empty() => {
                    match spawned {
                        Ok(()) => backoff = Duration::ZERO,
                        Err(e) => {
                            backoff = (backoff * 2).clamp(REFILL_BACKOFF, REFILL_BACKOFF_MAX);
                            retry_at = Some(tokio::time::Instant::now() + backoff);
                            tracing::warn!(error = %e, retry_in = ?backoff, "refilling the warm pool failed");
                        }
                    }
                }
            }
        }
        // Shutdown: the spawns in flight end (each within spawn_timeout) and, finding the
        // registry closed, dispose of what they made.
        while spawning.next().await.is_some() {}
    }

    /// Spawns one pooled kernel of `language` for a reserved refill and offers it to the
    /// pool.
    async fn spawn_pooled(&self, language: Language) -> Result<(), KernelError> {
        let inner = &self.inner;
        let started = Instant::now();
        // The preloaded modules are Python's (`PoolConfig::preload`).
        let preload: &[String] = match language {
            Language::Python => &inner.config.pool.preload,
            _ => &[],
        };
        let spawned = Kernel::spawn(SpawnRequest {
            preload,
            pool_language: language,
            yield_to: Some(Yield {
                priority: inner.pool.cold.subscribe(),
                until: tokio::time::Instant::now() + POOL_YIELD_MAX,
                cancel: inner.tasks.cancel.clone(),
            }),
            ..self.spawn_request()
        })
        .await;
        let seconds = started.elapsed().as_secs_f64();
        match spawned {
            Ok(kernel) => {
                inner.pool.stats().refills.observe(seconds);
                let spec = inner.pool.spec.clone();
                if let Some(unwanted) = inner.registry.pool_offer(spec, language, kernel) {
                    crate::services::dispose_kernel(&unwanted).await;
                }
                self.inner.pool.publish(&self.inner.registry);
                Ok(())
            }
            Err(e) => {
                inner.registry.pool_unreserve(language);
                if !matches!(e, KernelError::Abandoned) {
                    inner.pool.stats().refill_failures += 1;
                }
                Err(e)
            }
        }
    }

    /// Ready pooled kernels now.
    pub fn pool_ready(&self) -> usize {
        self.inner.registry.pool_ready()
    }

    /// Waits until the warm pool holds at least `n` ready kernels, at most `limit`; returns
    /// whether it does. Event-driven (for tests, benches and readiness checks).
    pub async fn wait_pool_ready(&self, n: usize, limit: Duration) -> bool {
        let mut rx = self.inner.pool.ready.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|ready| *ready >= n))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}
