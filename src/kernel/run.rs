//! One cell: [`Kernel::run_cell`] sends the code, collects output up to the cell's end
//! marker and the `done` frame after it, dispatches the cell's tool calls to its authority,
//! and settles the cell (`docs/architecture.md`, protocol v2).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rand::Rng;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::display::Displays;
use super::protocol::{DoneStatus, HostFrame, KernelFrame, RunnerDisplayCaps};
use super::scanner::{MarkerScanner, Piece};
use super::stdin::Stdin;
use super::{
    CellIo, CellOptions, CellOutcome, CellRun, Death, IoEvent, Kernel, KernelState,
    MAX_TOOL_ARGS_IN_FLIGHT, MAX_TOOL_CALLS_IN_FLIGHT, MAX_TOOL_RESULT_BYTES,
    MAX_TOOL_RESULT_FRAME,
};
use crate::authority::{CellAuthority, RawToolCall, RETIRED_MESSAGE};
use crate::cell::OutputBuffer;

/// A tool call that the current cell's authority must answer: the call, the bytes of its
/// arguments, and the answer.
type ToolWork =
    Pin<Box<dyn std::future::Future<Output = (u64, usize, Result<Box<RawValue>, String>)> + Send>>;

/// How the cell loop ended, in the protocol's terms; [`CellOutcome`] is what leaves the kernel.
enum End {
    Done {
        status: DoneStatus,
        traceback: Option<String>,
    },
    TimedOut,
    Interrupted,
    Died(Death),
}

impl Kernel {
    /// Runs one cell under `authority`, waiting behind earlier cells (FIFO). The caller
    /// disposes of the kernel after a timeout or an interrupt of a cell that ran. A cell
    /// cancelled before its turn ends `Interrupted` at once without running (whatever became
    /// of the kernel meanwhile) and does not count as executed.
    pub async fn run_cell(
        &self,
        code: &str,
        timeout: Duration,
        authority: Arc<CellAuthority>,
        cancel: CancellationToken,
        options: CellOptions,
    ) -> CellRun {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut output = OutputBuffer::new(options.output.inline_bytes, options.output.spill_bytes);
        let never_ran = |outcome, output| CellRun {
            outcome,
            output,
            execution_count: 0,
            cell: 0,
            ran: false,
            results: Vec::new(),
            display_warning: None,
        };
        // An interrupt while waiting for the earlier cells ends this one at once.
        let mut io = tokio::select! {
            biased;
            _ = cancel.cancelled() => return never_ran(CellOutcome::Interrupted, output),
            io = self.io.lock() => io,
        };
        if cancel.is_cancelled() {
            return never_ran(CellOutcome::Interrupted, output);
        }
        // Whatever arrived between cells (late output of old threads) is not this cell's.
        self.drain_stale(&mut io).await;
        if let Some(death) = self.death() {
            return never_ran(CellOutcome::Died(death), output);
        }
        let cell = self.next_cell.fetch_add(1, Ordering::AcqRel) + 1;
        let finish = |outcome, output, count, (results, display_warning)| CellRun {
            outcome,
            output,
            execution_count: count,
            cell,
            ran: true,
            results,
            display_warning,
        };
        let nonce: u64 = rand::rng().random();
        let marker = format!("\u{1}kernelbox-end:{cell}:{nonce:016x}\u{1}");
        let display_marker = format!("\u{1}kernelbox-display:{cell}:{nonce:016x}\u{1}");
        let display_caps = RunnerDisplayCaps::from(options.display);
        let mut displays = Displays::new(display_caps);
        let mut displays_dropped = 0;
        *self.authority.lock().unwrap_or_else(|p| p.into_inner()) = Some(authority.clone());
        self.shared.active_cell.store(cell, Ordering::Release);
        self.shared.set_live(KernelState::Busy);
        let frame = HostFrame::Exec {
            cell,
            code,
            marker: &marker,
            display: &display_marker,
            display_caps,
        }
        .to_line();
        self.writer.send(frame);
        let sink = options.sink;
        let display_sink = options.display_sink;
        let mut scanner = MarkerScanner::with_display(&marker, &display_marker);
        let mut done: Option<(DoneStatus, Option<String>, u64, u64)> = None;
        let mut tools: FuturesUnordered<ToolWork> = FuturesUnordered::new();
        let mut pending_calls: Vec<u64> = Vec::new();
        let mut args_in_flight = 0usize;
        let end = loop {
            // Checked first, every turn: a cell that floods output still times out.
            if tokio::time::Instant::now() >= deadline {
                break End::TimedOut;
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break End::Interrupted,
                _ = tokio::time::sleep_until(deadline) => break End::TimedOut,
                // Before the output: a cell that floods output still gets its tool results
                // (and a dispatcher running a child kernel's cell keeps being driven).
                Some((call, size, result)) = tools.next(), if !tools.is_empty() => {
                    pending_calls.retain(|c| *c != call);
                    args_in_flight -= size;
                    self.writer.send(tool_result_line(call, result));
                }
                event = io.rx.recv() => match event {
                    Some(IoEvent::Output(bytes, _backlog)) => {
                        // A caller's sink that panics loses its stream, not the cell.
                        scanner.feed(&bytes, |piece| match piece {
                            Piece::Output(b) => {
                                output.push(b);
                                if let Some(sink) = &sink {
                                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink(b)));
                                }
                            }
                            Piece::Display { bytes, last } => {
                                if let (Some(result), Some(sink)) = (displays.piece(bytes, last), &display_sink) {
                                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink(result)));
                                }
                            }
                            Piece::Broken => displays.broken(),
                        });
                        if let (None, Some(line)) = (&done, scanner.done_line()) {
                            done = Some(parse_done(line, cell));
                        }
                    }
                    Some(IoEvent::Frame(KernelFrame::ToolCall { cell: c, call, tool, args }, backlog)) => {
                        let size = backlog.num_permits();
                        drop(backlog);
                        if c != Some(cell) {
                            refuse(&self.writer, call, RETIRED_MESSAGE);
                        } else if tools.len() >= MAX_TOOL_CALLS_IN_FLIGHT
                            || args_in_flight + size > MAX_TOOL_ARGS_IN_FLIGHT
                        {
                            refuse(&self.writer, call, IN_FLIGHT_MESSAGE);
                        } else {
                            pending_calls.push(call);
                            args_in_flight += size;
                            tools.push(self.dispatch(authority.clone(), cell, call, size, tool, args));
                        }
                    }
                    Some(IoEvent::Frame(..)) => {}
                    Some(IoEvent::Closed) | None => {
                        // The reader records the death before it closes the channel.
                        break End::Died(self.death().unwrap_or(Death::Crashed(-1)));
                    }
                },
            }
            if let (Some((status, _, _, _)), true) = (&done, scanner.found()) {
                let status = *status;
                let (_, traceback, count, dropped) = done.take().unwrap_or((status, None, 0, 0));
                displays_dropped = dropped;
                self.execution_count.store(count, Ordering::Release);
                break End::Done { status, traceback };
            }
        };
        // Settle: the authority is retired before anything else can run, and threads of the
        // cell still waiting on a call are told so instead of waiting forever.
        authority.retire();
        self.shared.active_cell.store(0, Ordering::Release);
        drop(tools);
        if matches!(end, End::Done { .. }) {
            for call in pending_calls {
                refuse(&self.writer, call, RETIRED_MESSAGE);
            }
            // A call the reader forwarded just as the cell settled is refused now, not left
            // waiting for the next cell.
            self.drain_stale(&mut io).await;
        }
        let count = match &end {
            End::Done { .. } => self.execution_count(),
            _ => {
                // The runner counted the cell when it began; mirror that.
                let c = self.execution_count.load(Ordering::Acquire) + 1;
                self.execution_count.store(c, Ordering::Release);
                c
            }
        };
        let outcome = match end {
            End::Done {
                status: DoneStatus::Ok,
                ..
            } => CellOutcome::Completed,
            End::Done {
                status: DoneStatus::Error,
                traceback,
            } => CellOutcome::Raised {
                traceback: traceback.unwrap_or_default(),
            },
            End::Done {
                status: DoneStatus::Exit,
                ..
            } => CellOutcome::Exited,
            End::TimedOut => CellOutcome::TimedOut,
            End::Interrupted => CellOutcome::Interrupted,
            End::Died(death) => CellOutcome::Died(death),
        };
        if outcome == CellOutcome::Exited {
            self.shared.die(Death::Exited);
        } else {
            self.shared.set_live(KernelState::Idle);
        }
        finish(outcome, output, count, displays.finish(displays_dropped))
    }

    /// Empties the event channel between cells: output is dropped, tool calls of settled
    /// cells are refused so their threads do not wait forever.
    async fn drain_stale(&self, io: &mut CellIo) {
        while let Ok(event) = io.rx.try_recv() {
            match event {
                IoEvent::Frame(KernelFrame::ToolCall { call, .. }, _) => {
                    refuse(&self.writer, call, RETIRED_MESSAGE);
                }
                IoEvent::Closed => break,
                _ => {}
            }
        }
    }

    fn dispatch(
        &self,
        authority: Arc<CellAuthority>,
        cell: u64,
        call: u64,
        size: usize,
        tool: String,
        args: Option<Box<RawValue>>,
    ) -> ToolWork {
        let Some(owner) = self.owner() else {
            // Unreachable: a pooled kernel runs its first cell only after it is assigned.
            let failed = Err("kernelbox: this kernel has no owner yet".to_string());
            return Box::pin(async move { (call, size, failed) });
        };
        // Keyword arguments are an object; anything else is taken as none. The text is valid
        // JSON already (the frame parsed), so its first byte tells.
        let args = match args.filter(|raw| raw.get().starts_with('{')) {
            Some(args) => Ok(args),
            None => RawValue::from_string("{}".to_string()),
        };
        let args = match args {
            Ok(args) => args,
            Err(e) => {
                let failed = Err(format!(
                    "kernelbox could not build the call's arguments: {e}"
                ));
                return Box::pin(async move { (call, size, failed) });
            }
        };
        let request = RawToolCall {
            tool,
            args,
            task_id: authority.task_id().map(str::to_string),
            tenant: owner.tenant.clone(),
            session: owner.session.clone(),
            child: owner.child.clone(),
            cell,
        };
        Box::pin(async move {
            // A dispatcher that panics fails this call, not the orchestrator.
            let result = std::panic::AssertUnwindSafe(authority.dispatch_raw(request))
                .catch_unwind()
                .await
                .unwrap_or_else(|_| Err("the tool dispatcher failed (panicked)".to_string()));
            (call, size, result)
        })
    }
}

/// Reads the `done` line that follows a cell's end marker: status, traceback, execution
/// count, displays the runner dropped.
fn parse_done(line: &[u8], cell: u64) -> (DoneStatus, Option<String>, u64, u64) {
    match serde_json::from_slice::<KernelFrame>(line) {
        Ok(KernelFrame::Done {
            cell: c,
            status,
            traceback,
            execution_count,
            displays_dropped,
        }) if c == cell => (status, traceback, execution_count, displays_dropped),
        _ => (
            DoneStatus::Error,
            Some("kernelbox: the kernel's end-of-cell frame was unreadable; the cell's outcome is unknown".into()),
            0,
            0,
        ),
    }
}

/// The refusal for a tool call past [`MAX_TOOL_CALLS_IN_FLIGHT`] or [`MAX_TOOL_ARGS_IN_FLIGHT`].
const IN_FLIGHT_MESSAGE: &str = "Too many tool calls in flight: a cell may wait on at most 16 calls (1 MiB of arguments) at once; retry when one has returned.";

/// A tool's answer as a frame; a result over [`MAX_TOOL_RESULT_BYTES`] (or a frame over
/// [`MAX_TOOL_RESULT_FRAME`]) becomes an error.
fn tool_result_line(call: u64, result: Result<Box<RawValue>, String>) -> Vec<u8> {
    if let Ok(value) = &result {
        if value.get().len() > MAX_TOOL_RESULT_BYTES {
            return too_large(call, value.get().len());
        }
    }
    let frame = match &result {
        Ok(value) => HostFrame::ToolResult {
            call,
            ok: true,
            result: Some(value),
            error: None,
        },
        Err(message) => HostFrame::ToolResult {
            call,
            ok: false,
            result: None,
            error: Some(message.clone()),
        },
    };
    let line = frame.to_line();
    if line.len() <= MAX_TOOL_RESULT_FRAME {
        return line;
    }
    too_large(call, line.len())
}

fn too_large(call: u64, bytes: usize) -> Vec<u8> {
    HostFrame::ToolResult {
        call,
        ok: false,
        result: None,
        error: Some(format!(
            "the tool's result is too large ({bytes} bytes; at most {MAX_TOOL_RESULT_BYTES})"
        )),
    }
    .to_line()
}

pub(super) fn refuse(writer: &Stdin, call: u64, message: &str) {
    let frame = HostFrame::ToolResult {
        call,
        ok: false,
        result: None,
        error: Some(message.to_string()),
    };
    writer.send(frame.to_line());
}
