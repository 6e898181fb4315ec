//! What a call holds while it uses an owner's kernel, shared by an execute (`execute.rs`) and
//! an upload that starts a kernel (`files.rs`): the kernel's key, the [`Lease`] on its slot
//! that [`Orchestrator::acquire`] gets (admission through the registry's caps and fair shares,
//! then the kernel reused, taken from the warm pool or spawned), the catalog's confirmation of
//! a new kernel, and a call's entry among the running calls that an interrupt finds
//! ([`Running`]).
//!
//! `acquire` runs in named steps, an [`Attempt`] carrying the state between them: `admit` (the
//! registry's slot), `spawn_or_reuse` (its kernel), `hold` (the kernel checked, then leased).
//! A kernel found cleared or dead at the end of an attempt starts another
//! (`docs/architecture.md`, "Lifecycle of a kernel").

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{AdmissionNotice, ExecuteError, Orchestrator};
use crate::catalog::{Change, Durable};
use crate::cell::{KernelInfo, StateLost};
use crate::kernel::{Death, Kernel, KernelError, SpawnRequest};
use crate::owner::KernelKey;
use crate::registry::{Refusal, Slot, TenantLimits};
use crate::telemetry::Span;

/// How long a cold start waits for the catalog to confirm it (it writes during the cell).
const CATALOG_WAIT: Duration = Duration::from_secs(1);

/// A call's hold on an owner's kernel, from [`Orchestrator::acquire`]; the caller releases the
/// slot ([`Orchestrator::release`]) when it is done.
pub(super) struct Lease {
    /// Dropped when the call ends: lets the work after a pool take go.
    _taken: Option<tokio_util::sync::DropGuard>,
    pub(super) slot: Arc<Slot>,
    pub(super) kernel: Arc<Kernel>,
    /// The kernel served this owner before this call.
    reused: bool,
    /// `reset: true` discarded a previous kernel.
    state_reset: bool,
    /// The loss this call reports.
    state_lost: Option<StateLost>,
    /// Answers once the catalog holds this new kernel's start.
    started: Option<Durable>,
}

impl Lease {
    /// The result's `kernel` for a cell that ran on this lease.
    pub(super) fn kernel_info(&self, execution_count: u64, ended: bool) -> KernelInfo {
        let workspace = self.kernel.workspace().cloned();
        // A kernel moved here by a drain says so (`services/migration/`).
        let (restored, migrated) =
            crate::services::migration::split_restored(self.kernel.take_restored());
        // A lost kernel whose session's next one found no workspace to mount lost its files
        // too (`docs/workspaces.md`, "In a cluster").
        let state_lost = self.state_lost.clone().map(|lost| StateLost {
            workspace_lost: workspace.as_ref().is_some_and(|w| !w.restored),
            ..lost
        });
        KernelInfo {
            id: self.kernel.short_id().to_string(),
            // A restored kernel is the one the owner had.
            reused: self.reused || restored.is_some(),
            execution_count,
            state_reset: self.state_reset,
            ended,
            generation: self.slot.generation(),
            state_lost,
            workspace,
            restored,
            migrated,
        }
    }

    /// The loss this lease's call would have reported, taken (a call that reports nothing
    /// gives it back to the key's next call: `Orchestrator::give_back_loss`).
    pub(super) fn take_state_lost(&mut self) -> Option<StateLost> {
        self.state_lost.take()
    }

    /// The call is done with the kernel: the slot released (the kernel disposed of when it
    /// was cleared meanwhile), then the catalog's confirmation of a new kernel awaited
    /// ([`Self::confirm_start`]; its delay is logged, never an error).
    pub(super) async fn finish(&mut self, orchestrator: &Orchestrator) {
        orchestrator.release(&self.slot).await;
        // The catalog wrote a new kernel's start while the cell ran.
        if !self.confirm_start().await {
            tracing::warn!("the catalog did not confirm a kernel start in time");
        }
    }

    /// Waits (at most [`CATALOG_WAIT`]) until the catalog holds the start of the kernel this
    /// lease started, so a caller who saw the kernel is told about a later restart, even a
    /// `kill -9` right after this returns; a slow or failing catalog delays a cold start by at
    /// most that bound, never fails it. False when the catalog did not confirm it in time;
    /// true at once when there is nothing to confirm.
    pub(super) async fn confirm_start(&mut self) -> bool {
        match self.started.take() {
            Some(durable) => tokio::time::timeout(CATALOG_WAIT, durable).await.is_ok(),
            None => true,
        }
    }
}

/// One try at a kernel for a key, between the steps of [`Orchestrator::acquire`].
struct Attempt {
    slot: Arc<Slot>,
    /// The loss the attach took for this call to report (given back if the call fails first).
    state_lost: Option<StateLost>,
    /// The slot took its kernel from the warm pool.
    pooled: bool,
    /// `reset: true` discarded a previous kernel (on this attempt or an earlier one).
    state_reset: bool,
    /// The kernel served this owner before this call (set by `spawn_or_reuse`).
    reused: bool,
}

impl Orchestrator {
    /// A live kernel for `key`: admitted under the caps (`admission`, when given, is told
    /// whether it was before any kernel starts), then the slot's own kernel, one taken from
    /// the warm pool, or one spawned now. `reset` discards the key's kernel first.
    pub(super) async fn acquire(
        &self,
        key: &KernelKey,
        reset: bool,
        limits: TenantLimits,
        admission: Option<&AdmissionNotice>,
    ) -> Result<Lease, ExecuteError> {
        let (mut reset, mut state_reset) = (reset, false);
        let hibernation = &self.inner.services.hibernation;
        let this = Acquisition {
            orchestrator: self,
            key,
        };
        let limits = hibernation.limits_for(key, limits);
        hibernation.wait_for(key).await;
        if reset {
            // A reset discards a hibernated kernel too: the next one is new.
            hibernation.discard_where(|k| k == key).await;
        }
        let mut retry = false;
        loop {
            let span = Span::start("admission");
            let admitted = span.within(this.admit(reset, limits, admission)).await;
            match &admitted {
                Ok(attempt) => span.set("kernelbox.kernel.pooled", attempt.pooled),
                Err(e) => span.fail(e.to_string()),
            }
            drop(span);
            let mut attempt = admitted?;
            if retry && removed_meanwhile(&attempt) {
                // The slot this call was starting a kernel in went with its tenant (a reload
                // removed it): no new kernel is started for a tenant that is gone, nor for one
                // added back under its name (`docs/http-api.md`, "Reloading the tenants").
                let registry = &self.inner.registry;
                registry.forget(&attempt.slot, None);
                registry.release(&attempt.slot);
                // A kernel the admission took from the warm pool goes too.
                super::pool::dispose_pooled(
                    attempt.slot.kernel.get().cloned().into_iter().collect(),
                )
                .await;
                this.give_back(attempt.state_lost.take());
                return Err(ExecuteError::TenantRemoved);
            }
            retry = true;
            state_reset |= attempt.state_reset;
            attempt.state_reset = state_reset;
            let kernel = this.spawn_or_reuse(&mut attempt).await?;
            if let Some(lease) = this.hold(attempt, kernel).await? {
                return Ok(lease);
            }
            // The kernel was cleared or died: start over on the key's current slot (a reset
            // already discarded the old kernel).
            reset = false;
        }
    }

    /// Releases a call's hold on `slot`; the last one out of a slot cleared meanwhile disposes
    /// of its kernel.
    pub(super) async fn release(&self, slot: &Arc<Slot>) {
        if self.inner.registry.release(slot) {
            crate::services::dispose_slots(vec![slot.clone()]).await;
        }
    }

    /// Puts back a loss an attach took for a call that then failed before reporting it.
    pub(super) fn give_back_loss(&self, key: &KernelKey, loss: Option<StateLost>) {
        Acquisition {
            orchestrator: self,
            key,
        }
        .give_back(loss);
    }

    /// The network grant of `owner`'s kernels (`SessionConfigs::grant_of`).
    pub(super) fn grant_of(&self, owner: &crate::owner::Owner) -> Option<crate::egress::Grant> {
        self.inner.services.sessions.grant_of(owner)
    }
}

/// One [`Orchestrator::acquire`] between its steps: the orchestrator and the key it gets a
/// kernel for.
struct Acquisition<'a> {
    orchestrator: &'a Orchestrator,
    key: &'a KernelKey,
}

impl Acquisition<'_> {
    /// Step one of [`Orchestrator::acquire`]: the key's slot from the registry (a new one admitted
    /// atomically with the caps), and the slots and pooled kernels the admission displaced
    /// disposed of.
    async fn admit(
        &self,
        reset: bool,
        limits: TenantLimits,
        admission: Option<&AdmissionNotice>,
    ) -> Result<Attempt, ExecuteError> {
        let (key, registry) = (self.key, &self.orchestrator.inner.registry);
        let attach =
            match registry.attach_from_pool(key, reset, limits, self.orchestrator.pool_spec(key)) {
                Ok(attach) => attach,
                Err(refusal) => return Err(refused(refusal, admission).await),
            };
        if registry.is_closed() {
            // Shutdown drained the registry; nothing new may start (and a pooled kernel
            // this attach took goes).
            registry.forget(&attach.slot, None);
            registry.release(&attach.slot);
            let taken = attach
                .discarded
                .into_iter()
                .chain(attach.slot.kernel.get().cloned());
            super::pool::dispose_pooled(taken.collect()).await;
            self.give_back(attach.state_lost);
            if let Some(notice) = admission {
                notice.send(Err(ExecuteError::ShuttingDown));
            }
            return Err(ExecuteError::ShuttingDown);
        }
        if let Some(notice) = admission {
            notice.send(Ok(()));
        }
        let mut doomed = attach.victims;
        let state_reset = attach.reset.is_some();
        // At once, busy or not: a kernel the registry no longer counts must not outlive this
        // call (the old kernel's running cell ends).
        doomed.extend(attach.reset);
        self.orchestrator
            .inner
            .services
            .hibernation
            .park_evicted(&mut doomed);
        crate::services::dispose_slots(doomed).await;
        super::pool::dispose_pooled(attach.discarded).await;
        Ok(Attempt {
            slot: attach.slot,
            state_lost: attach.state_lost,
            // A kernel taken from the warm pool is new to its owner, like a cold one.
            pooled: attach.pooled,
            state_reset,
            reused: false,
        })
    }

    /// Step two of [`Orchestrator::acquire`]: the slot's kernel, spawned by this call when it has
    /// none yet (concurrent first calls wait on the same spawn). Sets `attempt.reused`.
    async fn spawn_or_reuse(&self, attempt: &mut Attempt) -> Result<Arc<Kernel>, ExecuteError> {
        let (key, slot) = (self.key, &attempt.slot);
        let mut spawned_here = false;
        let mut restore_lost = None;
        let spawned = slot
            .kernel
            .get_or_try_init(|| {
                spawned_here = true;
                self.restore_or_spawn(slot, &mut restore_lost)
            })
            .await;
        attempt.reused = !attempt.pooled && !spawned_here;
        if restore_lost.is_some() {
            attempt.state_lost = restore_lost;
        }
        match spawned {
            Ok(kernel) => {
                if attempt.pooled {
                    self.orchestrator.inner.registry.events().started(
                        &key.owner,
                        kernel.short_id(),
                        slot.generation(),
                        "pool",
                    );
                }
                Ok(kernel.clone())
            }
            Err(e) => {
                let registry = &self.orchestrator.inner.registry;
                registry.forget(slot, None);
                registry.release(slot);
                self.give_back(attempt.state_lost.take());
                Err(e.into())
            }
        }
    }

    /// The slot's kernel: its key's hibernated kernel restored when there is one (a failed
    /// restore sets `lost`), else one started cold.
    async fn restore_or_spawn(
        &self,
        slot: &Slot,
        lost: &mut Option<StateLost>,
    ) -> Result<Arc<Kernel>, KernelError> {
        // The reaper may have taken the key's idle slot just before this call's: its
        // hibernation is then awaited here, and restored.
        let (key, hibernation) = (self.key, &self.orchestrator.inner.services.hibernation);
        hibernation.wait_for(key).await;
        match hibernation.restore(key).await {
            Some(Ok(kernel)) => {
                self.orchestrator.inner.registry.events().restored(
                    &key.owner,
                    kernel.short_id(),
                    slot.generation(),
                );
                return Ok(kernel);
            }
            Some(Err(reason)) => {
                // The kernel started instead is a new one.
                self.orchestrator.inner.registry.renew_generation(slot);
                *lost = Some(StateLost {
                    reason,
                    at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
                    workspace_lost: false,
                });
            }
            None => {}
        }
        self.spawn_cold(slot.generation(), slot.settings.clone())
            .await
    }

    /// A new owner's kernel started cold, its start time counted; the pool's refill holds off
    /// meanwhile.
    fn spawn_cold(
        &self,
        generation: u64,
        settings: Option<crate::settings::Shared>,
    ) -> impl Future<Output = Result<Arc<Kernel>, KernelError>> + '_ {
        let inner = &self.orchestrator.inner;
        let started = Instant::now();
        let key = self.key;
        let grant = inner.services.sessions.grant_of(&key.owner);
        let network = grant
            .as_ref()
            .and(inner.services.sessions.egress_shared())
            .map(|egress| egress.kernel_network());
        async move {
            let _cold = inner.pool.cold_start();
            let span = Span::start("cold_start");
            let result = span
                .within(self.spawn_with(generation, network.as_ref(), grant, settings.as_deref()))
                .await;
            match &result {
                Ok(kernel) => inner.registry.events().started(
                    &key.owner,
                    kernel.short_id(),
                    generation,
                    "cold",
                ),
                Err(e) => span.fail(e.to_string()),
            }
            drop(span);
            inner
                .spawner
                .count_start(result.is_ok(), started.elapsed().as_secs_f64());
            result
        }
    }

    /// The spawn of [`Self::spawn_cold`]; a kernel with a network policy is then served by the
    /// proxy (known by its address) until it goes.
    async fn spawn_with(
        &self,
        generation: u64,
        network: Option<&crate::egress::KernelNetwork>,
        grant: Option<crate::egress::Grant>,
        settings: Option<&crate::settings::Settings>,
    ) -> Result<Arc<Kernel>, KernelError> {
        let (key, inner) = (self.key, &self.orchestrator.inner);
        // A session's workspace is its default Python kernel's: one mount at a time, never
        // another context's (`docs/contract.md`, "Languages").
        let workspace = match (
            inner.services.transfers.policy(&key.owner.tenant),
            inner.services.transfers.workspaces(),
        ) {
            (Some(policy), Some(workspaces)) if key.context.is_default_python() => {
                let (uid, gid) = crate::kernel::parse_user(&inner.config.spec.sandbox.user);
                let prepared = workspaces.prepare(&key.owner, &policy, uid, gid);
                Some(crate::telemetry::in_span("workspace", prepared).await?)
            }
            _ => None,
        };
        // The session's other contexts' `/work`, shared (`docs/contract.md`, "Languages").
        let files_volume = match workspace {
            Some(_) => None,
            None => inner.registry.files_volume(key),
        };
        let shares = files_volume.is_some();
        let spawned = Kernel::spawn(SpawnRequest {
            workspace,
            network,
            owner: Some((key.clone(), generation)),
            settings,
            files_volume,
            ..self.orchestrator.spawn_request()
        })
        .await;
        let kernel = match spawned {
            // The session's other contexts all went meanwhile, and their volume with them:
            // this kernel's `/work` is its own, as the first of a session's.
            Err(KernelError::FilesGone { .. }) if shares => {
                Kernel::spawn(SpawnRequest {
                    network,
                    owner: Some((key.clone(), generation)),
                    settings,
                    ..self.orchestrator.spawn_request()
                })
                .await?
            }
            other => other?,
        };
        // The grant is read again as the kernel is entered (`Egress::register`).
        let (Some(net), Some(_), Some(egress)) = (
            network,
            grant,
            inner.services.sessions.egress_shared().cloned(),
        ) else {
            return Ok(kernel);
        };
        let owner = &key.owner;
        match egress
            .register(&kernel.id, net, &owner.tenant, &owner.session)
            .await
        {
            Ok(addr) => {
                let (gone, token) = (kernel.gone(), net.token.clone());
                inner.tasks.tracker.spawn(async move {
                    gone.cancelled().await;
                    egress.unregister(addr, &token);
                });
                Ok(kernel)
            }
            Err(e) => {
                crate::services::dispose_kernel(&kernel).await;
                Err(e.into())
            }
        }
    }

    /// Step three of [`Orchestrator::acquire`]: the attempt's kernel leased when it is still
    /// registered and alive; `None` (try again) when it was cleared or reset while it started,
    /// or died since its last cell.
    async fn hold(
        &self,
        mut attempt: Attempt,
        kernel: Arc<Kernel>,
    ) -> Result<Option<Lease>, ExecuteError> {
        let registry = &self.orchestrator.inner.registry;
        let slot = &attempt.slot;
        if registry.is_closed() {
            // A spawn that finished after shutdown drained the registry: nobody else would
            // remove this kernel.
            registry.forget(slot, None);
            registry.release(slot);
            crate::services::dispose_kernel(&kernel).await;
            self.give_back(attempt.state_lost.take());
            return Err(ExecuteError::ShuttingDown);
        }
        if !registry.is_registered(slot) {
            // Cleared or reset while it started: whoever removed the slot found no kernel to
            // dispose of, so this call does.
            registry.release(slot);
            crate::services::dispose_kernel(&kernel).await;
            self.give_back(attempt.state_lost.take());
            return Ok(None);
        }
        if kernel.is_alive() {
            return Ok(Some(self.lease(attempt, kernel)));
        }
        self.lost_between_cells(attempt, &kernel).await;
        Ok(None)
    }

    /// The lease on a live kernel; a new one is counted (a pool take or a cold start), and its
    /// start recorded in the catalog.
    fn lease(&self, attempt: Attempt, kernel: Arc<Kernel>) -> Lease {
        let key = self.key;
        if !attempt.reused {
            let inner = &self.orchestrator.inner;
            let (language, pooled) = (key.context.language, attempt.pooled);
            inner.pool.count_take(&inner.registry, language, pooled);
            self.orchestrator
                .inner
                .registry
                .tenants()
                .new_kernel(&key.owner.tenant, attempt.pooled);
            if attempt.pooled {
                let owner = &key.owner;
                self.orchestrator.inner.services.usage.pending().record(
                    &owner.tenant,
                    &owner.session,
                    |r| r.pool_hits += 1,
                );
            }
        }
        let slot = attempt.slot;
        // Naming the kernel and refilling the pool wait for this first cell (or a moment):
        // they would compete with it for the engine.
        let taken = attempt
            .pooled
            .then(|| self.orchestrator.after_take(key, &slot, &kernel));
        let started = match (&self.orchestrator.inner.catalog, attempt.reused) {
            (Some(catalog), false) => Some(catalog.record_durable(Change::Started {
                key_hash: key.hash(),
                tenant: key.owner.tenant.clone(),
                owner: key.owner.to_string(),
                generation: slot.generation(),
            })),
            _ => None,
        };
        Lease {
            _taken: taken,
            started,
            slot,
            kernel,
            reused: attempt.reused,
            state_reset: attempt.state_reset,
            state_lost: attempt.state_lost,
        }
    }

    /// A kernel that died between cells (killed from outside, OOM from a stray thread, engine
    /// restart): its loss is recorded in the registry, so it comes back to this very call on
    /// the retry. A pooled kernel that died just as it was taken was never its owner's: no
    /// loss, and the loss this attach took is reported on the retry.
    async fn lost_between_cells(&self, attempt: Attempt, kernel: &Kernel) {
        let reason = match attempt.pooled {
            true => {
                self.give_back(attempt.state_lost);
                None
            }
            false => kernel
                .death()
                .unwrap_or(Death::Crashed(-1))
                .in_contract(0)
                .loss(),
        };
        self.orchestrator
            .inner
            .registry
            .forget(&attempt.slot, reason);
        if self.orchestrator.inner.registry.release(&attempt.slot) {
            crate::services::dispose_kernel(kernel).await;
        }
    }

    /// Puts back a loss an attach took for a call that then failed before reporting it.
    fn give_back(&self, loss: Option<StateLost>) {
        if let Some(loss) = loss {
            self.orchestrator
                .inner
                .registry
                .restore_loss(self.key, loss);
        }
    }
}

/// The registry's refusal as the call's error, told to `admission` first; slots reaped on
/// the way are disposed of.
async fn refused(refusal: Refusal, admission: Option<&AdmissionNotice>) -> ExecuteError {
    if let Some(notice) = admission {
        notice.send(Err(refusal_error(&refusal)));
    }
    let error = refusal_error(&refusal);
    if let Refusal::AtCapacity(full) = refusal {
        crate::services::dispose_slots(full.victims).await;
    }
    error
}

/// The error of a call the registry refused.
fn refusal_error(refusal: &Refusal) -> ExecuteError {
    match refusal {
        Refusal::Busy { owner, max } => ExecuteError::SessionBusy {
            owner: owner.clone(),
            max: *max,
        },
        Refusal::AtCapacity(full) => ExecuteError::AtCapacity {
            tenant: full.tenant.clone(),
            cap: full.cap,
            held: full.held,
        },
    }
}

/// The key's slot was removed with its tenant since this call began (the registry records the
/// loss for the key's next call, which is this call's retry).
fn removed_meanwhile(attempt: &Attempt) -> bool {
    attempt
        .state_lost
        .as_ref()
        .is_some_and(|lost| lost.reason == crate::cell::LossReason::TenantRemoved)
}
