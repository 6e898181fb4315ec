//! One cell: [`Kernel::run_cell`] sends the code, collects output up to the cell's end
//! marker and the `done` frame after it, dispatches the cell's tool calls to its authority,
//! and settles the cell (`docs/architecture.md`, "Runner protocol").

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rand::Rng;
use serde_json::value::RawValue;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::display::Displays;
use super::protocol::{DoneStatus, HostFrame, KernelFrame, RunnerDisplayCaps};
use super::scanner::{MarkerScanner, Piece};
use super::stdin::Stdin;
use super::{
    CellIo, CellOptions, CellRun, Death, IoEvent, Kernel, KernelState, OutputSink,
    MAX_TOOL_ARGS_IN_FLIGHT, MAX_TOOL_CALLS_IN_FLIGHT, MAX_TOOL_RESULT_BYTES,
    MAX_TOOL_RESULT_FRAME,
};
use crate::authority::{CellAuthority, RawToolCall, RETIRED_MESSAGE};
use crate::cell::{Ending, OutputBuffer, OutputStream, StreamBuffers};
use crate::rich::DisplaySink;

/// The answer to one of the cell's tool calls, from its authority.
struct ToolAnswer {
    /// The call being answered.
    call: u64,
    /// The bytes of its arguments, counted in [`ToolCalls::args_bytes`] until it is answered.
    size: usize,
    /// The tool's JSON result, or why it failed.
    result: Result<Box<RawValue>, String>,
}

/// A tool call that the current cell's authority must answer.
type ToolWork = Pin<Box<dyn std::future::Future<Output = ToolAnswer> + Send>>;

/// The `done` frame the runner writes after a cell's end marker.
struct Done {
    status: DoneStatus,
    traceback: Option<String>,
    /// The exception's class name and text, when the cell raised.
    exception: Option<(String, String)>,
    /// Cells the runner executed, this one included.
    execution_count: u64,
    /// Displays the runner could not send (past the caps, not saved to files).
    displays_dropped: u64,
    /// The exit status the runner gave (a Bash cell's last command's).
    exit_code: Option<i64>,
}

/// How the cell loop ended, in the protocol's terms (the `done` frame kept for what the result
/// takes from it); [`End::ending`] is what leaves the kernel.
enum End {
    Done(Done),
    TimedOut,
    /// Interrupted, and not stopped within the grace: the kernel is to be killed.
    InterruptKilled,
    Died(Death),
}

impl End {
    /// The cell's [`Ending`] (`cell/ending.rs`): `timeout` and `grace` it ran under, the
    /// memory limit an OOM's message names.
    fn ending(self, timeout: Duration, grace: Duration, memory_bytes: i64) -> Ending {
        match self {
            End::Done(Done {
                status: DoneStatus::Ok,
                ..
            }) => Ending::Completed,
            End::Done(Done {
                status: DoneStatus::Error,
                traceback,
                exit_code,
                ..
            }) => Ending::Raised {
                traceback: traceback.unwrap_or_default(),
                // A status that is no process's (0, or past a byte) is the runner's 1.
                exit_code: exit_code
                    .filter(|c| (1..=255).contains(c))
                    .map_or(1, |c| c as i32),
            },
            End::Done(Done {
                status: DoneStatus::Exit,
                ..
            }) => Ending::Exited,
            End::Done(Done {
                status: DoneStatus::Interrupted,
                ..
            }) => Ending::InterruptStopped,
            End::TimedOut => Ending::TimedOut { timeout },
            End::InterruptKilled => Ending::InterruptKilled { grace },
            End::Died(death) => Ending::Died(death.in_contract(memory_bytes)),
        }
    }
}

/// What woke the cell loop.
enum Wake {
    Interrupted,
    /// The interrupt's grace passed and the cell has not stopped.
    Unstopped,
    TimedOut,
    Answer(ToolAnswer),
    Event(Option<IoEvent>),
}

/// The cell's tool calls dispatched and not answered yet, under
/// [`MAX_TOOL_CALLS_IN_FLIGHT`] and [`MAX_TOOL_ARGS_IN_FLIGHT`].
#[derive(Default)]
struct ToolCalls {
    running: FuturesUnordered<ToolWork>,
    /// The calls of `running`, refused when the cell settles.
    pending: Vec<u64>,
    /// Bytes of their arguments.
    args_bytes: usize,
}

/// One cell between its `exec` frame and its end: the state the loop reads and changes.
struct RunningCell<'k> {
    kernel: &'k Kernel,
    cell: u64,
    authority: Arc<CellAuthority>,
    deadline: Instant,
    /// The memory limit an OOM's message names (`CellOptions::memory_bytes`).
    memory_bytes: i64,
    cancel: CancellationToken,
    /// Once the cell was interrupted (SIGINT sent to the runner): when its grace ends.
    interrupted: Option<Instant>,
    /// How long the cell may take to stop once interrupted.
    interrupt_grace: Duration,
    output: OutputBuffer,
    streams: StreamBuffers,
    sink: Option<OutputSink>,
    scanner: MarkerScanner,
    displays: Displays,
    display_sink: Option<DisplaySink>,
    /// The `done` frame, once read; the cell ends when the end marker was seen too.
    done: Option<Done>,
    tools: ToolCalls,
}

impl Kernel {
    /// Runs one cell under `authority`, waiting behind earlier cells (FIFO). Cancelling
    /// `cancel` interrupts the cell (SIGINT to the runner); the caller disposes of the kernel
    /// after a timeout, or an interrupt the cell did not stop on within its grace. A cell
    /// cancelled before its turn ends `InterruptedWhileQueued` at once without running (whatever became
    /// of the kernel meanwhile) and does not count as executed.
    pub(crate) async fn run_cell(
        &self,
        code: &str,
        timeout: Duration,
        authority: Arc<CellAuthority>,
        cancel: CancellationToken,
        options: CellOptions,
    ) -> CellRun {
        let deadline = Instant::now() + timeout;
        let output = OutputBuffer::new(options.output.inline_bytes, options.output.spill_bytes);
        // An interrupt while waiting for the earlier cells ends this one at once.
        let mut io = tokio::select! {
            biased;
            _ = cancel.cancelled() => return CellRun::never_ran(Ending::InterruptedWhileQueued, output),
            io = self.io.lock() => io,
        };
        if cancel.is_cancelled() {
            return CellRun::never_ran(Ending::InterruptedWhileQueued, output);
        }
        // Whatever arrived between cells (late output of old threads) is not this cell's.
        self.drain_stale(&mut io).await;
        if let Some(death) = self.death() {
            let died = Ending::Died(death.in_contract(options.memory_bytes));
            return CellRun::never_ran(died, output);
        }
        let timeout_ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.last_timeout_ms.store(timeout_ms, Ordering::Release);
        let mut running = self.begin_cell(code, authority, cancel, deadline, options, output);
        let end = loop {
            if let Some(end) = running.turn(&mut io).await {
                break end;
            }
        };
        self.settle(running, end, timeout, &mut io).await
    }

    /// Numbers the cell, chooses its markers, makes the kernel busy under `authority` and
    /// sends the `exec` frame.
    fn begin_cell(
        &self,
        code: &str,
        authority: Arc<CellAuthority>,
        cancel: CancellationToken,
        deadline: Instant,
        options: CellOptions,
        output: OutputBuffer,
    ) -> RunningCell<'_> {
        let cell = self.next_cell.fetch_add(1, Ordering::AcqRel) + 1;
        let nonce: u64 = rand::rng().random();
        let marker = format!("\u{1}kernelbox-end:{cell}:{nonce:016x}\u{1}");
        let display_marker = format!("\u{1}kernelbox-display:{cell}:{nonce:016x}\u{1}");
        let display_caps = RunnerDisplayCaps::from(options.display);
        let displays = Displays::new(display_caps);
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
        RunningCell {
            kernel: self,
            cell,
            authority,
            deadline,
            memory_bytes: options.memory_bytes,
            cancel,
            interrupted: None,
            interrupt_grace: options.interrupt_grace,
            output,
            streams: StreamBuffers::new(options.output.inline_bytes),
            sink: options.sink,
            scanner: MarkerScanner::with_display(&marker, &display_marker),
            displays,
            display_sink: options.display_sink,
            done: None,
            tools: ToolCalls::default(),
        }
    }

    /// Settles an ended cell: the authority is retired before anything else can run, and
    /// threads of the cell still waiting on a call are told so instead of waiting forever.
    async fn settle(
        &self,
        running: RunningCell<'_>,
        end: End,
        timeout: Duration,
        io: &mut CellIo,
    ) -> CellRun {
        let RunningCell {
            cell,
            interrupt_grace,
            memory_bytes,
            authority,
            output,
            streams,
            displays,
            tools,
            ..
        } = running;
        authority.retire();
        self.shared.active_cell.store(0, Ordering::Release);
        let ToolCalls {
            running, pending, ..
        } = tools;
        drop(running);
        if matches!(end, End::Done(_)) {
            for call in pending {
                refuse(&self.writer, call, RETIRED_MESSAGE);
            }
            // A call the reader forwarded just as the cell settled is refused now, not left
            // waiting for the next cell.
            self.drain_stale(io).await;
        }
        let (execution_count, displays_dropped) = match &end {
            End::Done(done) => (self.execution_count(), done.displays_dropped),
            _ => {
                // The runner counted the cell when it began; mirror that.
                let c = self.execution_count.load(Ordering::Acquire) + 1;
                self.execution_count.store(c, Ordering::Release);
                (c, 0)
            }
        };
        let exception = match &end {
            End::Done(done) => done.exception.clone(),
            _ => None,
        };
        let ending = end.ending(timeout, interrupt_grace, memory_bytes);
        if ending == Ending::Exited {
            self.shared.die(Death::Exited);
        } else {
            self.shared.set_live(KernelState::Idle);
        }
        let (results, display_warning) = displays.finish(displays_dropped);
        CellRun {
            ending,
            output,
            streams,
            exception,
            execution_count,
            cell,
            ran: true,
            results,
            display_warning,
        }
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
            let result = Err("kernelbox: this kernel has no owner yet".to_string());
            return Box::pin(async move { ToolAnswer { call, size, result } });
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
                let result = Err(format!(
                    "kernelbox could not build the call's arguments: {e}"
                ));
                return Box::pin(async move { ToolAnswer { call, size, result } });
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
            ToolAnswer { call, size, result }
        })
    }
}

impl RunningCell<'_> {
    /// Waits for the next thing that happens to the cell and takes it in; the cell's end once
    /// it has one.
    async fn turn(&mut self, io: &mut CellIo) -> Option<End> {
        // Checked first, every turn: a cell that floods output still times out.
        if Instant::now() >= self.deadline {
            return Some(End::TimedOut);
        }
        let interrupted = self.interrupted;
        let wake = tokio::select! {
            biased;
            _ = self.cancel.cancelled(), if interrupted.is_none() => Wake::Interrupted,
            _ = sleep_until(interrupted) => Wake::Unstopped,
            _ = tokio::time::sleep_until(self.deadline) => Wake::TimedOut,
            // Before the output: a cell that floods output still gets its tool results (and a
            // dispatcher running a child kernel's cell keeps being driven).
            Some(answer) = self.tools.running.next(), if !self.tools.running.is_empty() => {
                Wake::Answer(answer)
            }
            event = io.rx.recv() => Wake::Event(event),
        };
        match wake {
            Wake::Interrupted => self.interrupt().await,
            Wake::Unstopped => return Some(End::InterruptKilled),
            Wake::TimedOut => return Some(End::TimedOut),
            Wake::Answer(answer) => self.answered(answer),
            Wake::Event(Some(IoEvent::Output(bytes, _backlog))) => self.output(&bytes),
            Wake::Event(Some(IoEvent::Frame(
                KernelFrame::ToolCall {
                    cell,
                    call,
                    tool,
                    args,
                },
                backlog,
            ))) => {
                let size = backlog.num_permits();
                drop(backlog);
                self.tool_call(cell, call, size, tool, args);
            }
            Wake::Event(Some(IoEvent::Frame(..))) => {}
            Wake::Event(Some(IoEvent::Closed) | None) => {
                // The reader records the death before it closes the channel.
                let death = self.kernel.death().unwrap_or(Death::Crashed(-1));
                return Some(End::Died(death));
            }
        }
        self.ended()
    }

    /// Interrupts the cell (`docs/contract.md`, "Statuses"): SIGINT to the runner, which
    /// raises KeyboardInterrupt in the cell's code; the cell then has its grace to end. Its
    /// tool calls waiting on an answer are refused at once, so a cell blocked in one sees the
    /// interrupt as soon as the call returns.
    async fn interrupt(&mut self) {
        let grace = self.interrupt_grace;
        self.interrupted = Some(Instant::now() + grace);
        let kernel = self.kernel;
        // Bounded by the grace: an engine that does not answer leaves the kernel to be killed.
        match tokio::time::timeout(grace, kernel.engine.interrupt(&kernel.id)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(container = %kernel.short_id(), error = %e, "interrupting a cell");
                self.interrupted = Some(Instant::now());
            }
            Err(_) => self.interrupted = Some(Instant::now()),
        }
        let tools = std::mem::take(&mut self.tools);
        for call in tools.pending {
            refuse(&kernel.writer, call, INTERRUPTED_CALL_MESSAGE);
        }
    }

    /// Sends a tool's answer to the kernel.
    fn answered(&mut self, answer: ToolAnswer) {
        let ToolAnswer { call, size, result } = answer;
        self.tools.pending.retain(|c| *c != call);
        self.tools.args_bytes -= size;
        self.kernel.writer.send(tool_result_line(call, result));
    }

    /// Takes a chunk of the cell's output stream apart: output (stdout, stderr, traceback) to
    /// the buffers and the sink, display pieces to the displays, and the `done` line once the
    /// end marker passed.
    fn output(&mut self, bytes: &[u8]) {
        let (output, streams, sink) = (&mut self.output, &mut self.streams, &self.sink);
        let (displays, display_sink) = (&mut self.displays, &self.display_sink);
        let mut written = |stream: OutputStream, b: &[u8]| {
            if b.is_empty() {
                return;
            }
            output.push(b);
            streams.push(stream, b);
            if let Some(sink) = sink {
                // A caller's sink that panics loses its stream, not the cell.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink(stream, b)));
            }
        };
        self.scanner.feed(bytes, |piece| match piece {
            Piece::Output(b) => written(OutputStream::Stdout, b),
            Piece::Stderr(b) => written(OutputStream::Stderr, b),
            Piece::Traceback(b) => written(OutputStream::Traceback, b),
            Piece::Display { bytes, last } => {
                if let (Some(result), Some(sink)) = (displays.piece(bytes, last), display_sink) {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink(result)));
                }
            }
            Piece::Broken => displays.broken(),
        });
        if let (None, Some(line)) = (&self.done, self.scanner.done_line()) {
            self.done = Some(parse_done(line, self.cell));
        }
    }

    /// Dispatches a tool call of this cell, or refuses it: a call of another (settled) cell,
    /// or one past the bounds on calls in flight.
    fn tool_call(
        &mut self,
        cell: Option<u64>,
        call: u64,
        size: usize,
        tool: String,
        args: Option<Box<RawValue>>,
    ) {
        let writer = &self.kernel.writer;
        if cell != Some(self.cell) {
            refuse(writer, call, RETIRED_MESSAGE);
        } else if self.interrupted.is_some() {
            // A call the cell made after its interrupt was sent (the SIGINT landed in the
            // runner's own work, held until the cell's code resumes) is refused at once too.
            refuse(writer, call, INTERRUPTED_CALL_MESSAGE);
        } else if self.tools.running.len() >= MAX_TOOL_CALLS_IN_FLIGHT
            || self.tools.args_bytes + size > MAX_TOOL_ARGS_IN_FLIGHT
        {
            refuse(writer, call, IN_FLIGHT_MESSAGE);
        } else {
            self.tools.pending.push(call);
            self.tools.args_bytes += size;
            let authority = self.authority.clone();
            let work = self
                .kernel
                .dispatch(authority, self.cell, call, size, tool, args);
            self.tools.running.push(work);
        }
    }

    /// The cell's end, once both its end marker and its `done` frame arrived: the kernel's
    /// execution count is the runner's from then on.
    fn ended(&mut self) -> Option<End> {
        if !self.scanner.found() {
            return None;
        }
        let done = self.done.take()?;
        self.kernel
            .execution_count
            .store(done.execution_count, Ordering::Release);
        Some(End::Done(done))
    }
}

impl CellRun {
    /// A cell that never reached the kernel.
    fn never_ran(ending: Ending, output: OutputBuffer) -> CellRun {
        CellRun {
            ending,
            output,
            streams: StreamBuffers::new(0),
            exception: None,
            execution_count: 0,
            cell: 0,
            ran: false,
            results: Vec::new(),
            display_warning: None,
        }
    }
}

/// Reads the `done` line that follows a cell's end marker.
fn parse_done(line: &[u8], cell: u64) -> Done {
    match serde_json::from_slice::<KernelFrame>(line) {
        Ok(KernelFrame::Done {
            cell: c,
            status,
            traceback,
            ename,
            evalue,
            execution_count,
            displays_dropped,
            exit_code,
        }) if c == cell => Done {
            status,
            traceback,
            exception: ename.map(|name| (name, evalue.unwrap_or_default())),
            execution_count,
            displays_dropped,
            exit_code,
        },
        _ => Done {
            status: DoneStatus::Error,
            traceback: Some(crate::cell::messages::UNREADABLE_END_FRAME.into()),
            exception: None,
            execution_count: 0,
            displays_dropped: 0,
            exit_code: None,
        },
    }
}

/// Sleeps until `at`, or forever when there is none.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The refusal of a tool call the cell was waiting on when it was interrupted.
const INTERRUPTED_CALL_MESSAGE: &str = crate::cell::messages::INTERRUPTED_CALL_MESSAGE;

/// The refusal for a tool call past [`MAX_TOOL_CALLS_IN_FLIGHT`] or [`MAX_TOOL_ARGS_IN_FLIGHT`].
const IN_FLIGHT_MESSAGE: &str = crate::cell::messages::IN_FLIGHT_MESSAGE;

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
        error: Some(crate::cell::messages::tool_result_too_large(
            bytes,
            MAX_TOOL_RESULT_BYTES,
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
