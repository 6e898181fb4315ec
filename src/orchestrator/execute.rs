//! One execute, in named steps, a [`Call`] carrying the request between them: `resolve` the
//! request (owner, timeout, kernel key), enter it among the running calls and `acquire` a
//! kernel (`lease.rs`), `run_cell`, then `settle` the result: the cell's ending named in the
//! contract's terms (`ending`) and turned into a [`CellResult`] by [`Ending::verdict`]
//! (`src/cell/ending.rs`, `docs/contract.md`), its output capped and spilled into the kernel,
//! and a kernel the cell took with it disposed of.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::lease::Lease;
use super::{AdmissionNotice, ExecuteError, ExecuteRequest, Orchestrator};
use crate::authority::CellAuthority;
use crate::cell::{messages, CappedOutput, CellException, CellResult, Ending, KernelDeath};
use crate::kernel::{CellOptions, CellRun, Kernel};
use crate::orchestrator::adopt::run_adopted;
use crate::owner::KernelKey;
use crate::registry::Slot;
use crate::telemetry::Span;

/// One execute between its steps: the request, resolved.
struct Call {
    /// When the call began: the result's `duration_seconds` counts from here.
    started: Instant,
    key: KernelKey,
    timeout: Duration,
    /// Interrupts the cell: the request's token, or one nobody else holds.
    cancel: CancellationToken,
    /// The cell's tool authority.
    authority: Arc<CellAuthority>,
    request: ExecuteRequest,
}

impl Orchestrator {
    /// Runs one cell and returns its result. The cell keeps running to its end even if the
    /// returned future is dropped (cancel `request.cancel` to interrupt it). The caller's task
    /// drives the cell, so like any future it progresses only while polled: hold it in a
    /// `select!` loop only if that loop keeps polling it.
    pub async fn execute(&self, request: ExecuteRequest) -> Result<CellResult, ExecuteError> {
        execute_adopted(self, request, None).await
    }

    /// [`Orchestrator::execute`], telling `admission` once whether the call got a kernel slot
    /// or was refused at a cap, before any kernel starts: the HTTP API answers a refused
    /// streaming execute 429 instead of starting a stream. A call that fails before its
    /// admission (a bad name, shutting down) drops the notice untold.
    pub async fn execute_with_admission(
        &self,
        request: ExecuteRequest,
        admission: AdmissionNotice,
    ) -> Result<CellResult, ExecuteError> {
        execute_adopted(self, request, Some(admission)).await
    }
}

/// [`Orchestrator::execute`] on the caller's task, adopted by the tracker if the caller
/// goes away (`adopt.rs`).
async fn execute_adopted(
    orchestrator: &Orchestrator,
    request: ExecuteRequest,
    admission: Option<AdmissionNotice>,
) -> Result<CellResult, ExecuteError> {
    if orchestrator.inner.tasks.cancel.is_cancelled() {
        return Err(ExecuteError::ShuttingDown);
    }
    let this = orchestrator.clone();
    // The cell finishes even if the caller stops waiting (see `adopt`), in the caller's
    // trace still (`docs/usage.md`, "Traces").
    run_adopted(
        &orchestrator.inner.tasks.tracker,
        crate::telemetry::carry(async move { execute_owned(&this, request, admission).await }),
    )
    .await
    .unwrap_or_else(|panic| {
        Err(ExecuteError::Internal(format!(
            "the execute task failed: {panic}"
        )))
    })
}

/// One execute, its steps in order: resolve, track, acquire, run, settle, release, record.
async fn execute_owned(
    orchestrator: &Orchestrator,
    request: ExecuteRequest,
    admission: Option<AdmissionNotice>,
) -> Result<CellResult, ExecuteError> {
    let call = Call::resolve(orchestrator, request)?;
    // Interruptible from the start: an interrupt during a cold start is not lost (the cell
    // then never runs and ends interrupted at once, leaving the new kernel as it is).
    let running = orchestrator
        .inner
        .running
        .track(&call.key.owner, &call.cancel);
    let (reset, limits) = (call.request.reset, call.request.scope.tenant_limits);
    let mut lease = orchestrator
        .acquire(&call.key, reset, limits, admission.as_ref())
        .await?;
    let span = Span::start("cell");
    let run = span
        .within(call.run_cell(orchestrator, &lease.kernel))
        .await;
    // Published before the run is untracked: an interrupt counts only cells that really
    // ended as interrupted.
    running.finish(matches!(
        run.ending,
        Ending::InterruptKilled { .. } | Ending::InterruptedWhileQueued | Ending::InterruptStopped
    ));
    let mut result = call.settle(orchestrator, &lease, run).await;
    if span.is_on() {
        span.set("kernelbox.cell.status", result.status.as_str());
        span.set(
            "kernelbox.cell.tool_calls",
            i64::from(result.tool_calls_made),
        );
        span.set(
            "kernelbox.cell.duration_seconds",
            call.started.elapsed().as_secs_f64(),
        );
        span.set(
            "kernelbox.kernel.generation",
            result.kernel.generation as i64,
        );
    }
    drop(span);
    orchestrator
        .inner
        .registry
        .tenants()
        .cell(&call.key.owner.tenant, result.status);
    lease.finish(orchestrator).await;
    result.duration_seconds = call.started.elapsed().as_secs_f64();
    let owner = &call.key.owner;
    orchestrator
        .inner
        .services
        .usage
        .pending()
        .record(&owner.tenant, &owner.session, |r| {
            r.cells += 1;
            r.cell_seconds += result.duration_seconds;
        });
    orchestrator
        .inner
        .services
        .audit
        .record(crate::services::Ran {
            kind: crate::audit::AuditKind::Cell,
            owner,
            code: &call.request.code,
            kernel: &result.kernel.id,
            generation: result.kernel.generation,
            duration_seconds: result.duration_seconds,
            status: result.status.as_str(),
            exit_code: None,
        });
    Ok(result)
}

impl Call {
    /// Step one: the request's owner, timeout and kernel key, checked in that order, and the
    /// cell's tool authority.
    fn resolve(orchestrator: &Orchestrator, request: ExecuteRequest) -> Result<Call, ExecuteError> {
        let inner = &orchestrator.inner;
        let started = Instant::now();
        let config = &inner.config;
        let owner = request.scope.owner(config)?;
        let timeout = config.check_cell_timeout(request.timeout.unwrap_or(config.cells.timeout))?;
        let key = request
            .scope
            .kernel_key(owner, config, &inner.tenancy.load())?;
        let authority = Arc::new(CellAuthority::new(
            request.task_id.clone(),
            request.dispatcher.clone(),
            request.scope.tools.clone(),
            config.cells.max_tool_calls,
        ));
        Ok(Call {
            started,
            key,
            timeout,
            cancel: request.cancel.clone().unwrap_or_default(),
            authority,
            request,
        })
    }

    /// Step three (after [`Self::acquire`]): the cell on the leased kernel, under its timeout,
    /// its tool authority and the configured output and display caps.
    async fn run_cell(&self, orchestrator: &Orchestrator, kernel: &Kernel) -> CellRun {
        let (call, config) = (self, &orchestrator.inner.config);
        let request = &call.request;
        let options = CellOptions {
            output: config.cells.output,
            display: config.cells.display,
            sink: request.sink.clone(),
            display_sink: request.display_sink.clone(),
            interrupt_grace: config.cells.interrupt_grace,
            memory_bytes: config.spec.sandbox.memory_bytes,
        };
        kernel
            .run_cell(
                &request.code,
                call.timeout,
                call.authority.clone(),
                call.cancel.clone(),
                options,
            )
            .await
    }

    /// Step four: the result of a cell that ran. Its ending gives the status, error and loss
    /// ([`Ending::verdict`]); its output is capped; a kernel the cell took with it is
    /// forgotten (its loss kept for the owner's next call) and disposed of.
    async fn settle(&self, orchestrator: &Orchestrator, lease: &Lease, run: CellRun) -> CellResult {
        let call = self;
        let kernel = &lease.kernel;
        let verdict = ending(orchestrator, run.ending, run.ran, &lease.slot).verdict();
        // A cell that never ran leaves its kernel as it found it.
        let kernel_gone = (run.ran && !verdict.kernel_kept) || !kernel.is_alive();
        let hint = verdict.hint(kernel_gone);
        let streams = run.streams;
        let exception = run.exception.map(|(name, value)| CellException {
            name,
            value,
            traceback: streams.traceback.finish().text,
        });
        let mut result = CellResult {
            status: verdict.status,
            output: String::new(),
            stdout: streams.stdout.finish().text,
            stderr: streams.stderr.finish().text,
            exception,
            error: verdict.error,
            exit_code: verdict.exit_code,
            tool_calls_made: call.authority.calls_made(),
            duration_seconds: 0.0,
            kernel: lease.kernel_info(run.execution_count, verdict.ended),
            stdout_truncated: None,
            stdout_bytes_total: None,
            stdout_bytes_omitted: None,
            warning: None,
            hint,
            results: run.results,
        };
        let spill_to = (!kernel_gone).then_some(kernel.as_ref());
        let inline = orchestrator.inner.config.cells.output.inline_bytes;
        put_output(&mut result, run.output.finish(), spill_to, run.cell, inline).await;
        if let Some(display) = run.display_warning {
            result.warning = Some(match result.warning.take() {
                Some(output) => format!("{output} {display}"),
                None => display,
            });
        }
        if kernel_gone {
            orchestrator
                .inner
                .registry
                .forget(&lease.slot, verdict.loss);
            if let Err(e) = kernel.dispose().await {
                tracing::warn!(container = %kernel.short_id(), error = %e, "disposing a finished kernel");
            }
        }
        result
    }
}

/// How a cell that ran on `slot`'s kernel ended, the kernel's [`Ending`] refined with what
/// only the orchestrator sees: a cell whose interrupt killed its kernel before it ran never
/// ran; a kernel killed, or disposed of by the fence, once the node's lease is no longer
/// trusted was ended by the watchdog or the fence (`docs/cluster.md`, "Leases and fencing"),
/// never a kill from outside or a clear; a kernel disposed of under its cell by a clear, a
/// reset or a child's release (its slot gone, and not by shutdown) was cleared.
fn ending(orchestrator: &Orchestrator, ending: Ending, ran: bool, slot: &Arc<Slot>) -> Ending {
    let inner = &orchestrator.inner;
    let cleared = || !inner.tasks.cancel.is_cancelled() && !inner.registry.is_registered(slot);
    match ending {
        Ending::InterruptKilled { .. } if !ran => Ending::InterruptedWhileQueued,
        Ending::Died(KernelDeath::Killed) if inner.watchdog.deadline_passed() => {
            Ending::Died(KernelDeath::NodeLost)
        }
        Ending::Died(KernelDeath::ShutDown) if cleared() && inner.watchdog.deadline_passed() => {
            Ending::Died(KernelDeath::NodeLost)
        }
        Ending::Died(KernelDeath::ShutDown) if cleared() => Ending::Cleared,
        other => other,
    }
}

/// Puts a cell's capped output in its result (`docs/contract.md`, "The output cap"):
/// output past the inline cap is spilled into `spill_to`, the kernel when it is still
/// there, and the warning says where.
async fn put_output(
    result: &mut CellResult,
    output: CappedOutput,
    spill_to: Option<&Kernel>,
    cell: u64,
    inline: usize,
) {
    result.output = output.text;
    if output.omitted == 0 {
        return;
    }
    result.stdout_truncated = Some(true);
    result.stdout_bytes_total = Some(output.total);
    result.stdout_bytes_omitted = Some(output.omitted);
    let (Some(spill), Some(kernel)) = (output.spill, spill_to) else {
        return;
    };
    let name = format!("output-{cell}.txt");
    result.warning = Some(match kernel.write_staging_file(&name, &spill).await {
        Ok(path) => messages::output_spilled_warning(inline, spill.len(), &path),
        Err(e) => {
            tracing::warn!(error = %e, "spilling output failed");
            messages::output_spill_failed_warning(inline, spill.len(), &e.to_string())
        }
    });
}
