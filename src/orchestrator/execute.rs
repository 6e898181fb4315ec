//! One execute: find or start the owner's kernel (caps, fair shares and evictions through the
//! registry), run the cell, and turn its [`CellOutcome`] into a [`CellResult`] with the exact
//! messages of `docs/contract.md`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{AdmissionNotice, ExecuteError, ExecuteRequest, Orchestrator, CLEARED_MESSAGE};
use crate::authority::CellAuthority;
use crate::catalog::Change;
use crate::cell::{
    timeout_message, CellResult, CellStatus, KernelInfo, LossReason, INTERRUPTED_MESSAGE,
};
use crate::kernel::{CellOptions, CellOutcome, Death, Kernel, SpawnRequest};
use crate::orchestrator::adopt::run_adopted;
use crate::owner::KernelKey;
use crate::registry::{Refusal, Slot, TenantLimits};

impl Orchestrator {
    /// Runs one cell and returns its result. The cell keeps running to its end even if the
    /// returned future is dropped (cancel `request.cancel` to interrupt it). The caller's task
    /// drives the cell, so like any future it progresses only while polled: hold it in a
    /// `select!` loop only if that loop keeps polling it.
    pub async fn execute(&self, request: ExecuteRequest) -> Result<CellResult, ExecuteError> {
        if self.inner.cancel.is_cancelled() {
            return Err(ExecuteError::ShuttingDown);
        }
        let this = self.clone();
        // The cell finishes even if the caller stops waiting (see `adopt`).
        run_adopted(&self.inner.tracker, async move {
            this.execute_owned(request).await
        })
        .await
        .unwrap_or_else(|panic| {
            Err(ExecuteError::Internal(format!(
                "the execute task failed: {panic}"
            )))
        })
    }

    /// The image a new kernel of a request runs: the one it names, else `Config::spec.image`.
    pub(super) fn image_for(&self, named: Option<&str>) -> Result<String, ExecuteError> {
        match named {
            None => Ok(self.inner.config.spec.image.clone()),
            Some(image) if image.trim().is_empty() => {
                Err(ExecuteError::Invalid("image must not be empty".into()))
            }
            Some(image) => Ok(image.to_string()),
        }
    }

    pub(super) async fn execute_owned(
        &self,
        request: ExecuteRequest,
    ) -> Result<CellResult, ExecuteError> {
        let started = Instant::now();
        let config = &self.inner.config;
        let owner = self.owner_of(
            request.tenant.as_deref(),
            &request.session,
            request.child.as_deref(),
        )?;
        let timeout = config.check_cell_timeout(request.timeout.unwrap_or(config.cells.timeout))?;
        let key = KernelKey {
            owner: owner.clone(),
            mode: config.spec.mode.clone(),
            image: self.image_for(request.image.as_deref())?,
            tools: request.tools.clone(),
        };
        // Interruptible from the start: an interrupt during a cold start is not lost (the cell
        // then never runs and the new kernel is killed, as for any interrupt).
        let cancel = request.cancel.clone().unwrap_or_default();
        let (run_id, outcome) = self.track_running(&owner, &cancel);
        let lease = match self
            .acquire(
                &key,
                request.reset,
                request.tenant_limits,
                request.admission.as_ref(),
            )
            .await
        {
            Ok(lease) => lease,
            Err(e) => {
                // The outcome is dropped unsent: an interrupt waiting on it counts nothing.
                self.untrack_running(&owner, run_id);
                return Err(e);
            }
        };
        let mut lease = lease;
        let kernel = lease.kernel.clone();
        let authority = Arc::new(CellAuthority::new(
            request.task_id.clone(),
            request.dispatcher.clone(),
            request.tools.clone(),
            config.cells.max_tool_calls,
        ));
        let run = kernel
            .run_cell(
                &request.code,
                timeout,
                authority.clone(),
                cancel.clone(),
                CellOptions {
                    output: config.cells.output,
                    display: config.cells.display,
                    sink: request.sink.clone(),
                    display_sink: request.display_sink.clone(),
                },
            )
            .await;
        // Published before the run is untracked: an interrupt counts only cells that really
        // ended as interrupted.
        let _ = outcome.send(Some(run.outcome == CellOutcome::Interrupted));
        self.untrack_running(&owner, run_id);

        let mut info = KernelInfo {
            id: kernel.short_id().to_string(),
            reused: lease.reused,
            execution_count: run.execution_count,
            state_reset: lease.state_reset,
            ended: false,
            generation: lease.slot.generation,
            state_lost: lease.state_lost.clone(),
        };
        let (status, exit_code, error, loss) = match &run.outcome {
            CellOutcome::Completed => (CellStatus::Success, 0, None, None),
            CellOutcome::Raised { traceback } => {
                (CellStatus::Error, 1, Some(traceback.clone()), None)
            }
            CellOutcome::Exited => {
                info.ended = true;
                (CellStatus::Success, 0, None, None)
            }
            CellOutcome::TimedOut => (
                CellStatus::Timeout,
                -1,
                Some(timeout_message(timeout)),
                Some(LossReason::Timeout),
            ),
            CellOutcome::Interrupted if !run.ran => (
                CellStatus::Interrupted,
                -1,
                Some(INTERRUPTED_BEFORE_IT_RAN.to_string()),
                None,
            ),
            CellOutcome::Interrupted => (
                CellStatus::Interrupted,
                -1,
                Some(INTERRUPTED_MESSAGE.to_string()),
                Some(LossReason::Killed),
            ),
            CellOutcome::Died(death) => {
                let (message, reason) = death_message(*death, config.spec.sandbox.memory_bytes);
                (CellStatus::Error, -1, Some(message), reason)
            }
        };
        // Killed under its cell by a clear, a reset or a child's release (not by shutdown).
        let error = match (&run.outcome, error) {
            (CellOutcome::Died(Death::Disposed), Some(_))
                if !self.inner.cancel.is_cancelled()
                    && !self.inner.registry.is_registered(&lease.slot) =>
            {
                Some(CLEARED_MESSAGE.to_string())
            }
            (_, error) => error,
        };
        // A cell that never ran leaves its kernel as it found it.
        let kernel_gone = (run.ran
            && !matches!(
                run.outcome,
                CellOutcome::Completed | CellOutcome::Raised { .. }
            ))
            || !kernel.is_alive();
        let capped = run.output.finish();
        let mut result = CellResult {
            status,
            output: capped.text,
            error,
            exit_code,
            tool_calls_made: authority.calls_made(),
            duration_seconds: 0.0,
            kernel: info,
            stdout_truncated: None,
            stdout_bytes_total: None,
            stdout_bytes_omitted: None,
            warning: None,
            hint: None,
            results: run.results,
        };
        if capped.omitted > 0 {
            result.stdout_truncated = Some(true);
            result.stdout_bytes_total = Some(capped.total);
            result.stdout_bytes_omitted = Some(capped.omitted);
            if let (Some(spill), false) = (capped.spill, kernel_gone) {
                let name = format!("output-{}.txt", run.cell);
                match kernel.write_staging_file(&name, &spill).await {
                    Ok(path) => {
                        result.warning = Some(format!(
                            "Output was cut to {} bytes; the first {} bytes are in {path} inside the kernel.",
                            config.cells.output.inline_bytes,
                            spill.len()
                        ));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "spilling output failed");
                        result.warning = Some(format!(
                            "Output was cut to {} bytes; saving the first {} bytes inside the kernel failed ({e}).",
                            config.cells.output.inline_bytes,
                            spill.len()
                        ));
                    }
                }
            }
        }
        if let Some(display) = run.display_warning {
            result.warning = Some(match result.warning.take() {
                Some(output) => format!("{output} {display}"),
                None => display,
            });
        }
        if kernel_gone {
            self.inner.registry.forget(&lease.slot, loss);
            if let Err(e) = kernel.dispose().await {
                tracing::warn!(container = %kernel.short_id(), error = %e, "disposing a finished kernel");
            }
            if status == CellStatus::Timeout || status == CellStatus::Interrupted {
                result.hint = Some(
                    "Long work can be split across cells, or run with a larger timeout.".into(),
                );
            }
        }
        self.release(&lease.slot).await;
        if let Some(durable) = lease.started.take() {
            // The catalog wrote the start while the cell ran; a caller who saw this kernel
            // is told about a later restart, even a `kill -9` right after this returns. A
            // slow or failing catalog delays a cold start by at most this bound, never fails it.
            if tokio::time::timeout(CATALOG_WAIT, durable).await.is_err() {
                tracing::warn!("the catalog did not confirm a kernel start in time");
            }
        }
        result.duration_seconds = started.elapsed().as_secs_f64();
        Ok(result)
    }

    pub(super) async fn acquire(
        &self,
        key: &KernelKey,
        reset: bool,
        limits: TenantLimits,
        admission: Option<&AdmissionNotice>,
    ) -> Result<Lease, ExecuteError> {
        let inner = &self.inner;
        let mut reset = reset;
        let mut state_reset = false;
        loop {
            let attach =
                match inner
                    .registry
                    .attach_from_pool(key, reset, limits, self.pool_spec(key))
                {
                    Ok(attach) => attach,
                    Err(Refusal::Busy { owner, max }) => {
                        let refusal = || ExecuteError::SessionBusy {
                            owner: owner.clone(),
                            max,
                        };
                        if let Some(notice) = admission {
                            notice.send(Err(refusal()));
                        }
                        return Err(refusal());
                    }
                    Err(Refusal::AtCapacity(full)) => {
                        let refusal = || ExecuteError::AtCapacity {
                            tenant: full.tenant.clone(),
                            cap: full.cap,
                            held: full.held,
                        };
                        if let Some(notice) = admission {
                            notice.send(Err(refusal()));
                        }
                        let error = refusal();
                        self.dispose_slots(full.victims).await;
                        return Err(error);
                    }
                };
            if inner.registry.is_closed() {
                // Shutdown drained the registry; nothing new may start (and a pooled kernel
                // this attach took goes).
                inner.registry.forget(&attach.slot, None);
                inner.registry.release(&attach.slot);
                let taken = attach
                    .discarded
                    .into_iter()
                    .chain(attach.slot.kernel.get().cloned());
                self.dispose_pooled(taken.collect()).await;
                self.give_back_loss(key, attach.state_lost);
                if let Some(notice) = admission {
                    notice.send(Err(ExecuteError::ShuttingDown));
                }
                return Err(ExecuteError::ShuttingDown);
            }
            if let Some(notice) = admission {
                notice.send(Ok(()));
            }
            let mut doomed = attach.victims;
            if let Some(old) = attach.reset {
                state_reset = true;
                // At once, busy or not: a kernel the registry no longer counts must not
                // outlive this call (the old kernel's running cell ends).
                doomed.push(old);
            }
            self.dispose_slots(doomed).await;
            self.dispose_pooled(attach.discarded).await;
            let slot = attach.slot;
            let state_lost = attach.state_lost;
            // A kernel taken from the warm pool is new to its owner, like a cold one.
            let pooled = attach.pooled;
            let mut reused = !pooled;
            let spawned = slot
                .kernel
                .get_or_try_init(|| {
                    reused = false;
                    let started = Instant::now();
                    let spawn = Kernel::spawn(SpawnRequest {
                        engine: inner.engine.clone(),
                        spec: &inner.config.spec,
                        spawn_timeout: inner.config.kernels.spawn_timeout,
                        files: &inner.config.files,
                        base_labels: &inner.labels,
                        owner: Some((key.clone(), slot.generation)),
                        monitor: inner.monitor.clone(),
                        tracker: &inner.tracker,
                        sockets_refused: &inner.sockets_refused,
                        yield_to: None,
                    });
                    async move {
                        // The pool's refill holds off while a new owner waits on a cold start.
                        let _cold = inner.pool.cold_start();
                        let result = spawn.await;
                        inner
                            .starts
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .observe(result.is_ok(), started.elapsed().as_secs_f64());
                        result
                    }
                })
                .await;
            let kernel = match spawned {
                Ok(kernel) => kernel.clone(),
                Err(e) => {
                    inner.registry.forget(&slot, None);
                    inner.registry.release(&slot);
                    self.give_back_loss(key, state_lost);
                    return Err(e.into());
                }
            };
            if inner.registry.is_closed() {
                // A spawn that finished after shutdown drained the registry: nobody else would
                // remove this kernel.
                inner.registry.forget(&slot, None);
                inner.registry.release(&slot);
                self.dispose_kernel(&kernel).await;
                self.give_back_loss(key, state_lost);
                return Err(ExecuteError::ShuttingDown);
            }
            if !inner.registry.is_registered(&slot) {
                // Cleared or reset while it started: whoever removed the slot found no kernel
                // to dispose of, so this call does, and starts over on the key's current slot.
                inner.registry.release(&slot);
                self.dispose_kernel(&kernel).await;
                self.give_back_loss(key, state_lost);
                reset = false;
                continue;
            }
            if kernel.is_alive() {
                if !reused {
                    self.count_take(pooled);
                }
                // Naming the kernel and refilling the pool wait for this first cell (or a
                // moment): they would compete with it for the engine.
                let taken = pooled.then(|| self.after_take(key, &slot, &kernel));
                let started = match (&inner.catalog, reused) {
                    (Some(catalog), false) => Some(catalog.record_durable(Change::Started {
                        key_hash: key.hash(),
                        tenant: key.owner.tenant.clone(),
                        owner: key.owner.to_string(),
                        generation: slot.generation,
                    })),
                    _ => None,
                };
                return Ok(Lease {
                    _taken: taken,
                    started,
                    slot,
                    kernel,
                    reused,
                    state_reset,
                    state_lost,
                });
            }
            // It died between cells (killed from outside, OOM from a stray thread, engine
            // restart): report the loss on this very call and start afresh. A pooled kernel
            // that died just as it was taken was never its owner's: no loss, and the loss
            // this attach took is reported on the retry.
            let reason = match pooled {
                true => {
                    self.give_back_loss(key, state_lost);
                    None
                }
                false => death_message(kernel.death().unwrap_or(Death::Crashed(-1)), 0).1,
            };
            // Recorded in the registry, the loss comes back to this very call on the retry.
            inner.registry.forget(&slot, reason);
            if inner.registry.release(&slot) {
                self.dispose_kernel(&kernel).await;
            }
            reset = false;
        }
    }

    /// Puts back a loss an attach took for a call that then failed before reporting it.
    fn give_back_loss(&self, key: &KernelKey, loss: Option<crate::cell::StateLost>) {
        if let Some(loss) = loss {
            self.inner.registry.restore_loss(key, loss);
        }
    }
}

pub(super) struct Lease {
    /// Dropped when the call ends: lets the work after a pool take go.
    _taken: Option<tokio_util::sync::DropGuard>,
    pub(super) slot: Arc<Slot>,
    kernel: Arc<Kernel>,
    reused: bool,
    state_reset: bool,
    state_lost: Option<crate::cell::StateLost>,
    /// Answers once the catalog holds this new kernel's start.
    pub(super) started: Option<crate::catalog::Durable>,
}

/// How long a cold start waits for the catalog to confirm it (it writes during the cell).
pub(super) const CATALOG_WAIT: Duration = Duration::from_secs(1);

/// The error of a cell interrupted while it waited for earlier cells of its session.
const INTERRUPTED_BEFORE_IT_RAN: &str =
    "Interrupted before it ran: the cell was waiting for an earlier cell of this session and never executed.";

/// The message and loss reason for a kernel that died under a cell.
fn death_message(death: Death, memory: i64) -> (String, Option<LossReason>) {
    const NEXT: &str = "its state was lost. The next execute_code call starts a fresh kernel.";
    match death {
        Death::Oom => (
            format!(
                "The kernel ran out of memory (limit {} MiB) and was killed; {NEXT}",
                memory / (1024 * 1024)
            ),
            Some(LossReason::Oom),
        ),
        Death::Killed => (
            format!("The kernel was killed from outside kernelbox; {NEXT}"),
            Some(LossReason::Killed),
        ),
        Death::Crashed(code) => (
            format!("The kernel died unexpectedly (exit code {code}); {NEXT}"),
            Some(LossReason::Crashed),
        ),
        Death::EngineRestarted => (
            format!("The Docker engine restarted or went away and took the kernel with it; {NEXT}"),
            Some(LossReason::EngineRestarted),
        ),
        Death::Protocol(what) => (
            format!("The kernel broke the kernelbox protocol ({what}) and was killed; {NEXT}"),
            Some(LossReason::Protocol),
        ),
        Death::Disposed => (
            format!("The kernel was shut down by kernelbox; {NEXT}"),
            None,
        ),
        Death::Exited => ("The kernel ended (sys.exit).".to_string(), None),
    }
}
