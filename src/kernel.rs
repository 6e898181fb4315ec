//! One kernel: a hardened container running the runner, its I/O task, and cell execution.
//!
//! A kernel owns a reader task that turns the attach stream into events: stdout chunks (cell
//! output) while a cell is active, and parsed protocol frames from stderr. Cells run one at a
//! time: the cell lock is a fair (FIFO) mutex, so they run in arrival order.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use rand::Rng;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::authority::{CellAuthority, RawToolCall, RETIRED_MESSAGE};
use crate::cell::OutputBuffer;
use crate::config::{Config, WorkMode};
use crate::docker::{Chunk, ContainerSpec, Engine, EngineError, Mount, TmpfsVolume};
use crate::monitor::EventMonitor;
use crate::owner::KernelKey;
use crate::protocol::{
    runner_command, runner_env, Breach, DoneStatus, HostFrame, KernelFrame, LineSplitter,
    MarkerScanner, MAX_FRAME_LINE, MAX_GARBAGE_BYTES, PROTOCOL_VERSION,
};
use crate::stdin::{Stdin, MAX_STDIN_BACKLOG};

/// Where the working directory is inside every kernel.
pub const WORK_DIR: &str = "/work";
/// Where the staging volume is mounted in project mode (in strict mode it is the work dir).
pub const STAGING_DIR_PROJECT: &str = "/kernelbox";

/// Bytes of events (cell output chunks, protocol frames as their line length) the reader task
/// has handed to the running cell and the cell has not consumed yet. When it is reached the
/// reader stops reading the container's streams until the cell catches up, so a flooding cell
/// is slowed down by its own pipes rather than buffered on the host. A parsed frame takes
/// about its line length in memory: a tool call's arguments stay raw JSON text.
pub const MAX_READER_BACKLOG: usize = 8 * 1024 * 1024;

/// Tool calls of one cell dispatched and not answered yet; a call past this is refused at once
/// (it does not count against the cell's budget) until one of them is answered.
pub const MAX_TOOL_CALLS_IN_FLIGHT: usize = 16;

/// Bytes of arguments (measured as their frames' line length) of one cell's tool calls in
/// flight; a call that would pass this is refused at once, like one past
/// [`MAX_TOOL_CALLS_IN_FLIGHT`]. One protocol line ([`MAX_FRAME_LINE`]) always fits.
pub const MAX_TOOL_ARGS_IN_FLIGHT: usize = MAX_FRAME_LINE;

/// Longest tool result passed to a kernel, in bytes of JSON; a larger result reaches the cell
/// as a `ToolError` saying so. The server's tool endpoint responses are bounded the same.
pub const MAX_TOOL_RESULT_BYTES: usize = 1024 * 1024;

/// Longest tool-result frame sent to a kernel, in bytes: a result of
/// [`MAX_TOOL_RESULT_BYTES`] and the frame around it.
pub const MAX_TOOL_RESULT_FRAME: usize = MAX_TOOL_RESULT_BYTES + 1024;

/// The most host memory one kernel can make kernelbox hold, in bytes, whatever its code does
/// (the bounds above and in [`crate::protocol`], [`crate::stdin`] and [`crate::cell`]):
///
/// - frames in: one unfinished protocol line, [`MAX_FRAME_LINE`] (1 MiB), plus the reader's
///   backlog of events for the cell, [`MAX_READER_BACKLOG`] (8 MiB; frames are held as their
///   text, a tool call's arguments unparsed);
/// - answers out: the stdin queue, [`MAX_STDIN_BACKLOG`] (16 MiB) plus the frame that reaches
///   it (at most [`MAX_TOOL_RESULT_FRAME`], 1 MiB, or the cell's own code);
/// - tool traffic: arguments in flight, [`MAX_TOOL_ARGS_IN_FLIGHT`] (1 MiB, held raw; the
///   server copies them once more into its request body), and up to
///   [`MAX_TOOL_CALLS_IN_FLIGHT`] (16) results being read, each bounded by the dispatcher (the
///   server's reads at most [`MAX_TOOL_RESULT_BYTES`], 1 MiB, per response and passes it
///   through without parsing it into a tree);
/// - output: the cell's result buffer, `output_inline_bytes` plus `output_spill_bytes`
///   (5 MB by default), and for a streaming request at most 1 MiB of undelivered events.
///
/// With the defaults that is about 34 MiB (this constant) plus the tool responses being read
/// (with the server's dispatcher at most 16 x 1 MiB more, and only while the cell's tools
/// answer); a kernel that goes past a bound on frames in or answers out is killed
/// (`state_lost.reason = "protocol"`). A library dispatcher that implements only
/// [`ToolDispatcher::dispatch`](crate::ToolDispatcher::dispatch) gets the arguments parsed
/// into a `serde_json::Value`, which can take up to about 16 times their text.
pub const MAX_HOST_BYTES_PER_KERNEL: usize = MAX_FRAME_LINE
    + MAX_READER_BACKLOG
    + MAX_STDIN_BACKLOG
    + MAX_TOOL_RESULT_FRAME
    + 2 * MAX_TOOL_ARGS_IN_FLIGHT
    + 5_050_000
    + 1024 * 1024;

/// The breach reported for a protocol line over [`MAX_FRAME_LINE`].
const LINE_BREACH: &str = "a protocol line longer than 1 MiB";
/// The breach reported for more than [`MAX_GARBAGE_BYTES`] of lines that are not frames.
const GARBAGE_BREACH: &str = "more than 1 MiB of protocol lines that are not frames";

/// The lifecycle of one kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelState {
    /// Container being created and started; the runner has not said ready yet.
    Starting,
    /// Ready, no cell running.
    Idle,
    /// A cell is running.
    Busy,
    /// Gone (ended, killed or died); never comes back.
    Dead(Death),
}

/// Why a kernel is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Death {
    /// kernelbox removed it (timeout, interrupt, eviction, reaping, clear, shutdown).
    Disposed,
    /// A cell called `sys.exit()`.
    Exited,
    /// The kernel ran out of memory.
    Oom,
    /// The container was killed or removed from outside kernelbox.
    Killed,
    /// The runner died on its own with this exit code.
    Crashed(i64),
    /// The Docker engine restarted or went away and took the kernel with it.
    EngineRestarted,
    /// The kernel broke the runner protocol (what it did) and kernelbox killed it.
    Protocol(&'static str),
}

/// A kernel could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// A Docker operation failed while spawning.
    #[error("starting a kernel failed: {0}")]
    Spawn(#[from] EngineError),
    /// The runner did not say ready in time.
    #[error("the kernel did not become ready within {0:?}")]
    SpawnTimeout(Duration),
    /// The runner exited before saying ready (no python3 in the image?).
    #[error("the kernel exited while starting ({0}); does the image have python3 >= 3.8?")]
    SpawnDied(String),
    /// The runner speaks another protocol version.
    #[error("the kernel runner speaks protocol {0}, this kernelbox speaks {PROTOCOL_VERSION}")]
    Protocol(u64),
}

/// What the reader task hands to the running cell.
/// Output and frames hold their share of [`MAX_READER_BACKLOG`] until the cell drops them.
#[derive(Debug)]
enum IoEvent {
    Output(Bytes, OwnedSemaphorePermit),
    Frame(KernelFrame, OwnedSemaphorePermit),
    Closed,
}

/// A tool call that the current cell's authority must answer: the call, the bytes of its
/// arguments, and the answer.
type ToolWork =
    Pin<Box<dyn std::future::Future<Output = (u64, usize, Result<Box<RawValue>, String>)> + Send>>;

/// How a cell ended, before the orchestrator turns it into a [`CellResult`](crate::CellResult).
#[derive(Debug)]
pub enum CellEnd {
    /// The runner reported the cell done.
    Done {
        /// ok, error or exit.
        status: DoneStatus,
        /// The traceback when it raised.
        traceback: Option<String>,
    },
    /// The deadline passed; the caller must dispose of the kernel.
    TimedOut,
    /// The caller cancelled; the caller must dispose of the kernel.
    Interrupted,
    /// The kernel died under the cell.
    Died(Death),
}

/// The outcome of one cell.
#[derive(Debug)]
pub struct CellRun {
    /// How it ended.
    pub end: CellEnd,
    /// What it wrote.
    pub output: OutputBuffer,
    /// Cells executed by the kernel, this one included; 0 when the cell never ran.
    pub execution_count: u64,
    /// The cell number (0 when it never ran).
    pub cell: u64,
    /// Whether the cell reached the kernel. A cell interrupted while it waited for earlier
    /// cells, or that found its kernel dead, never ran: the kernel is untouched by it.
    pub ran: bool,
}

/// Receives output live while a cell runs (for streaming).
pub type OutputSink = Arc<dyn Fn(&[u8]) + Send + Sync>;

/// The I/O a running cell needs, behind the FIFO cell lock.
struct CellIo {
    rx: mpsc::Receiver<IoEvent>,
}

/// One live kernel container.
pub struct Kernel {
    /// Full container id.
    pub id: String,
    /// Name of its staging volume.
    pub volume: String,
    /// The key it serves.
    pub key: KernelKey,
    /// Which kernel of the key it is.
    pub generation: u64,
    /// When it was created.
    pub created: SystemTime,
    /// Where spills go inside the kernel.
    pub spill_dir: String,
    user: String,
    engine: Arc<dyn Engine>,
    state: Mutex<KernelState>,
    io: tokio::sync::Mutex<CellIo>,
    writer: Stdin,
    active_cell: Arc<AtomicU64>,
    next_cell: AtomicU64,
    execution_count: AtomicU64,
    authority: Mutex<Option<Arc<CellAuthority>>>,
    disposing: Arc<AtomicBool>,
    /// Tells the reader to stop handing events to the cell and just drain the streams, so the
    /// engine can finish removing the container.
    drain: CancellationToken,
    cancel: CancellationToken,
    death: Arc<Mutex<Option<Death>>>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("id", &self.short_id())
            .field("generation", &self.generation)
            .field("state", &self.state())
            .finish()
    }
}

/// Labels of a kernel's container and volume.
pub fn kernel_labels(
    base: &BTreeMap<String, String>,
    key: &KernelKey,
    generation: u64,
    role: &str,
) -> BTreeMap<String, String> {
    use crate::labels as l;
    let mut labels = base.clone();
    labels.insert(l::ROLE.into(), role.into());
    labels.insert(l::TENANT.into(), key.owner.tenant.clone());
    labels.insert(l::OWNER.into(), key.owner.to_string());
    labels.insert(l::SESSION.into(), key.owner.session.clone());
    if let Some(child) = &key.owner.child {
        labels.insert(l::CHILD.into(), child.clone());
    }
    labels.insert(l::KEY.into(), key.hash());
    labels.insert(l::GENERATION.into(), generation.to_string());
    labels.insert(l::CREATED_AT.into(), unix_now().to_string());
    labels
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Kernel {
    /// Creates, attaches and starts a kernel container, and waits for the runner to be ready.
    /// On any failure nothing is left behind.
    pub async fn spawn(
        engine: Arc<dyn Engine>,
        config: &Config,
        base_labels: &BTreeMap<String, String>,
        key: KernelKey,
        generation: u64,
        monitor: EventMonitor,
        tracker: &TaskTracker,
    ) -> Result<Arc<Kernel>, KernelError> {
        let suffix: u32 = rand::rng().random();
        let volume = format!("kernelbox-{}-{generation}-{suffix:08x}", key.hash());
        let mut labels = kernel_labels(base_labels, &key, generation, "staging");
        let tmpfs = config.sandbox.work_bytes.map(|size_bytes| {
            let (uid, gid) = parse_user(&config.sandbox.user);
            TmpfsVolume {
                size_bytes,
                uid,
                gid,
            }
        });
        engine.create_volume(&volume, &labels, tmpfs).await?;
        labels.insert(crate::labels::ROLE.into(), "kernel".into());
        labels.insert(crate::labels::VOLUME.into(), volume.clone());
        labels.insert(
            crate::labels::MEMORY.into(),
            config.sandbox.memory_bytes.to_string(),
        );
        let (mounts, spill_dir) = match &key.mode {
            WorkMode::Strict => (
                vec![Mount::Volume {
                    name: volume.clone(),
                    target: WORK_DIR.into(),
                }],
                format!("{WORK_DIR}/.kernelbox"),
            ),
            WorkMode::Project(dir) => (
                vec![
                    Mount::Volume {
                        name: volume.clone(),
                        target: STAGING_DIR_PROJECT.into(),
                    },
                    Mount::Bind {
                        source: dir.to_string_lossy().into_owned(),
                        target: WORK_DIR.into(),
                    },
                ],
                STAGING_DIR_PROJECT.to_string(),
            ),
        };
        let status_path = format!("{spill_dir}/status");
        labels.insert(crate::labels::STATUS.into(), status_path.clone());
        let spec = ContainerSpec {
            image: key.image.clone(),
            cmd: runner_command(),
            env: vec![
                runner_env(),
                format!("KERNELBOX_STATUS={status_path}"),
                "PYTHONUNBUFFERED=1".into(),
                "PYTHONDONTWRITEBYTECODE=1".into(),
                "HOME=/tmp".into(),
                "LANG=C.UTF-8".into(),
            ],
            user: config.sandbox.user.clone(),
            working_dir: WORK_DIR.into(),
            labels,
            mounts,
            sandbox: config.sandbox.clone(),
        };
        let id = match engine.create_container(&spec).await {
            Ok(id) => id,
            Err(e) => {
                let _ = engine.remove_volume(&volume).await;
                return Err(e.into());
            }
        };
        let started = Self::start(
            engine.clone(),
            config,
            id.clone(),
            volume.clone(),
            key,
            generation,
            spill_dir,
            monitor,
            tracker,
        )
        .await;
        match started {
            Ok(kernel) => Ok(kernel),
            Err(e) => {
                if let Err(err) = engine.remove_container(&id).await {
                    tracing::warn!(container = %id, error = %err, "cleanup after failed spawn");
                }
                let _ = engine.remove_volume(&volume).await;
                Err(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn start(
        engine: Arc<dyn Engine>,
        config: &Config,
        id: String,
        volume: String,
        key: KernelKey,
        generation: u64,
        spill_dir: String,
        monitor: EventMonitor,
        tracker: &TaskTracker,
    ) -> Result<Arc<Kernel>, KernelError> {
        let attached = engine.attach(&id).await?;
        let cancel = CancellationToken::new();
        let drain = CancellationToken::new();
        let breach = Breach::default();
        let (writer, writer_task) = Stdin::new(attached.input, cancel.clone(), breach.clone());
        let (tx, rx) = mpsc::channel(256);
        let active_cell = Arc::new(AtomicU64::new(0));
        let disposing = Arc::new(AtomicBool::new(false));
        let death = Arc::new(Mutex::new(None));
        let kernel = Arc::new(Kernel {
            id: id.clone(),
            volume,
            key,
            generation,
            created: SystemTime::now(),
            spill_dir,
            user: config.sandbox.user.clone(),
            engine: engine.clone(),
            state: Mutex::new(KernelState::Starting),
            io: tokio::sync::Mutex::new(CellIo { rx }),
            writer: writer.clone(),
            active_cell: active_cell.clone(),
            next_cell: AtomicU64::new(0),
            execution_count: AtomicU64::new(0),
            authority: Mutex::new(None),
            disposing: disposing.clone(),
            drain: drain.clone(),
            cancel: cancel.clone(),
            death: death.clone(),
        });
        tracker.spawn(writer_task);
        tracker.spawn(reader_task(ReaderTask {
            id: id.clone(),
            engine: engine.clone(),
            events: Events {
                tx,
                backlog: Arc::new(Semaphore::new(MAX_READER_BACKLOG)),
                breach: breach.clone(),
                drain: drain.clone(),
                cancel: cancel.clone(),
            },
            breach,
            output: attached.output,
            writer,
            active_cell,
            disposing,
            death,
            epoch: monitor.epoch(),
            monitor,
            cancel,
        }));
        engine.start(&id).await?;
        let mut io = kernel.io.lock().await;
        let ready = tokio::time::timeout(config.spawn_timeout, async {
            loop {
                match io.rx.recv().await {
                    Some(IoEvent::Frame(KernelFrame::Ready { v, python }, _)) => {
                        return Ok((v, python));
                    }
                    Some(IoEvent::Closed) | None => {
                        return Err(KernelError::SpawnDied(
                            kernel
                                .death()
                                .map(|d| format!("{d:?}"))
                                .unwrap_or_else(|| "no output".into()),
                        ));
                    }
                    Some(_) => {}
                }
            }
        })
        .await
        .map_err(|_| KernelError::SpawnTimeout(config.spawn_timeout))??;
        drop(io);
        if ready.0 != PROTOCOL_VERSION {
            return Err(KernelError::Protocol(ready.0));
        }
        tracing::debug!(container = %kernel.short_id(), python = %ready.1, "kernel ready");
        kernel.set_state(KernelState::Idle);
        Ok(kernel)
    }

    /// The short (12 hex) container id.
    pub fn short_id(&self) -> &str {
        &self.id[..self.id.len().min(12)]
    }

    /// The current state.
    pub fn state(&self) -> KernelState {
        let death = *self.death.lock().unwrap_or_else(|p| p.into_inner());
        match death {
            Some(d) => KernelState::Dead(d),
            None => *self.state.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    fn set_state(&self, state: KernelState) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner()) = state;
    }

    /// Why the kernel is gone, once it is.
    pub fn death(&self) -> Option<Death> {
        *self.death.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// True while the kernel can run cells.
    pub fn is_alive(&self) -> bool {
        !matches!(self.state(), KernelState::Dead(_))
    }

    /// Cells executed so far.
    pub fn execution_count(&self) -> u64 {
        self.execution_count.load(Ordering::Acquire)
    }

    /// The authority of the running cell, or of the last one (retired) when idle.
    pub fn cell_authority(&self) -> Option<Arc<CellAuthority>> {
        self.authority
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

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
        sink: Option<OutputSink>,
        output_caps: (usize, usize),
    ) -> CellRun {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut output = OutputBuffer::new(output_caps.0, output_caps.1);
        let never_ran = |end, output| CellRun {
            end,
            output,
            execution_count: 0,
            cell: 0,
            ran: false,
        };
        // An interrupt while waiting for the earlier cells ends this one at once.
        let mut io = tokio::select! {
            biased;
            _ = cancel.cancelled() => return never_ran(CellEnd::Interrupted, output),
            io = self.io.lock() => io,
        };
        if cancel.is_cancelled() {
            return never_ran(CellEnd::Interrupted, output);
        }
        // Whatever arrived between cells (late output of old threads) is not this cell's.
        self.drain_stale(&mut io).await;
        if let Some(death) = self.death() {
            return never_ran(CellEnd::Died(death), output);
        }
        let cell = self.next_cell.fetch_add(1, Ordering::AcqRel) + 1;
        let finish = |end, output, count| CellRun {
            end,
            output,
            execution_count: count,
            cell,
            ran: true,
        };
        let nonce: u64 = rand::rng().random();
        let marker = format!("\u{1}kernelbox-end:{cell}:{nonce:016x}\u{1}");
        *self.authority.lock().unwrap_or_else(|p| p.into_inner()) = Some(authority.clone());
        self.active_cell.store(cell, Ordering::Release);
        self.set_state(KernelState::Busy);
        let frame = HostFrame::Exec {
            cell,
            code,
            marker: &marker,
        }
        .to_line();
        self.writer.send(frame);
        let mut scanner = MarkerScanner::new(&marker);
        let mut done: Option<(DoneStatus, Option<String>, u64)> = None;
        let mut tools: FuturesUnordered<ToolWork> = FuturesUnordered::new();
        let mut pending_calls: Vec<u64> = Vec::new();
        let mut args_in_flight = 0usize;
        let end = loop {
            // Checked first, every turn: a cell that floods output still times out.
            if tokio::time::Instant::now() >= deadline {
                break CellEnd::TimedOut;
            }
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break CellEnd::Interrupted,
                _ = tokio::time::sleep_until(deadline) => break CellEnd::TimedOut,
                // Before the output: a cell that floods output still gets its tool results
                // (and a dispatcher running a child kernel's cell keeps being driven).
                Some((call, size, result)) = tools.next(), if !tools.is_empty() => {
                    pending_calls.retain(|c| *c != call);
                    args_in_flight -= size;
                    self.writer.send(tool_result_line(call, result));
                }
                event = io.rx.recv() => match event {
                    Some(IoEvent::Output(bytes, _backlog)) => {
                        scanner.feed(&bytes, |b| {
                            output.push(b);
                            if let Some(sink) = &sink {
                                // A caller's sink that panics loses its stream, not the cell.
                                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink(b)));
                            }
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
                        break CellEnd::Died(self.death().unwrap_or(Death::Crashed(-1)));
                    }
                },
            }
            if let (Some((status, _, _)), true) = (&done, scanner.found()) {
                let status = *status;
                let (_, traceback, count) = done.take().unwrap_or((status, None, 0));
                self.execution_count.store(count, Ordering::Release);
                break CellEnd::Done { status, traceback };
            }
        };
        // Settle: the authority is retired before anything else can run, and threads of the
        // cell still waiting on a call are told so instead of waiting forever.
        authority.retire();
        self.active_cell.store(0, Ordering::Release);
        drop(tools);
        if matches!(end, CellEnd::Done { .. }) {
            for call in pending_calls {
                refuse(&self.writer, call, RETIRED_MESSAGE);
            }
            // A call the reader forwarded just as the cell settled is refused now, not left
            // waiting for the next cell.
            self.drain_stale(&mut io).await;
        }
        let count = match &end {
            CellEnd::Done { .. } => self.execution_count(),
            _ => {
                // The runner counted the cell when it began; mirror that.
                let c = self.execution_count.load(Ordering::Acquire) + 1;
                self.execution_count.store(c, Ordering::Release);
                c
            }
        };
        if matches!(
            end,
            CellEnd::Done {
                status: DoneStatus::Exit,
                ..
            }
        ) {
            self.disposing.store(true, Ordering::Release);
            let mut death = self.death.lock().unwrap_or_else(|p| p.into_inner());
            death.get_or_insert(Death::Exited);
        } else if self.is_alive() {
            self.set_state(KernelState::Idle);
        }
        finish(end, output, count)
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
        let owner = &self.key.owner;
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

    /// Waits for the reader to record why the kernel died.
    /// Removes the container and its staging volume. Idempotent.
    pub async fn dispose(&self) -> Result<(), EngineError> {
        self.disposing.store(true, Ordering::Release);
        {
            let mut death = self.death.lock().unwrap_or_else(|p| p.into_inner());
            death.get_or_insert(Death::Disposed);
        }
        self.drain.cancel();
        let removed = self.engine.remove_container(&self.id).await;
        self.cancel.cancel();
        removed?;
        remove_volume_when_free(self.engine.as_ref(), &self.volume).await
    }

    /// Writes a file into the kernel's staging volume (used for output spills).
    pub async fn write_staging_file(&self, name: &str, data: &[u8]) -> Result<String, EngineError> {
        // Spills are owned by the kernel's user so cells can read and delete them.
        let (uid, gid) = parse_user(&self.user);
        let mut builder = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_size(0);
        dir.set_mode(0o755);
        dir.set_uid(uid);
        dir.set_gid(gid);
        dir.set_mtime(unix_now());
        dir.set_cksum();
        let staging = self.spill_dir.clone();
        let (upload_root, rel_dir) = match staging.strip_prefix(&format!("{WORK_DIR}/")) {
            Some(rel) => (WORK_DIR.to_string(), format!("{rel}/")),
            None => (staging.clone(), String::new()),
        };
        if !rel_dir.is_empty() {
            builder
                .append_data(&mut dir, &rel_dir, std::io::empty())
                .map_err(|e| tar_err(&self.id, e))?;
        }
        let mut file = tar::Header::new_gnu();
        file.set_size(data.len() as u64);
        file.set_mode(0o644);
        file.set_uid(uid);
        file.set_gid(gid);
        file.set_mtime(unix_now());
        file.set_cksum();
        builder
            .append_data(&mut file, format!("{rel_dir}{name}"), data)
            .map_err(|e| tar_err(&self.id, e))?;
        let archive = builder.into_inner().map_err(|e| tar_err(&self.id, e))?;
        self.engine
            .upload(&self.id, &upload_root, Bytes::from(archive))
            .await?;
        Ok(format!("{staging}/{name}"))
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Reads the `done` line that follows a cell's end marker.
fn parse_done(line: &[u8], cell: u64) -> (DoneStatus, Option<String>, u64) {
    match serde_json::from_slice::<KernelFrame>(line) {
        Ok(KernelFrame::Done {
            cell: c,
            status,
            traceback,
            execution_count,
        }) if c == cell => (status, traceback, execution_count),
        _ => (
            DoneStatus::Error,
            Some("kernelbox: the kernel's end-of-cell frame was unreadable; the cell's outcome is unknown".into()),
            0,
        ),
    }
}

fn parse_user(user: &str) -> (u64, u64) {
    let mut parts = user.split(':');
    let uid = parts.next().and_then(|u| u.parse().ok()).unwrap_or(0);
    let gid = parts.next().and_then(|g| g.parse().ok()).unwrap_or(uid);
    (uid, gid)
}

fn tar_err(id: &str, e: std::io::Error) -> EngineError {
    EngineError::Other {
        op: "build archive",
        target: id.to_string(),
        message: e.to_string(),
    }
}

/// Removes a volume, waiting briefly while the engine finishes removing its container.
pub async fn remove_volume_when_free(engine: &dyn Engine, name: &str) -> Result<(), EngineError> {
    let mut delay = Duration::from_millis(20);
    for _ in 0..8 {
        match engine.remove_volume(name).await {
            Err(EngineError::VolumeInUse { .. }) => {
                // The container's removal is still being committed by the engine; there is no
                // event for "volume released", so back off and retry a few times.
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            other => return other,
        }
    }
    engine.remove_volume(name).await
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

fn refuse(writer: &Stdin, call: u64, message: &str) {
    let frame = HostFrame::ToolResult {
        call,
        ok: false,
        result: None,
        error: Some(message.to_string()),
    };
    writer.send(frame.to_line());
}

struct ReaderTask {
    id: String,
    engine: Arc<dyn Engine>,
    output: futures::stream::BoxStream<'static, Result<Chunk, EngineError>>,
    events: Events,
    breach: Breach,
    writer: Stdin,
    active_cell: Arc<AtomicU64>,
    disposing: Arc<AtomicBool>,
    death: Arc<Mutex<Option<Death>>>,
    monitor: EventMonitor,
    epoch: u64,
    cancel: CancellationToken,
}

/// The reader's side of the channel to the running cell.
struct Events {
    tx: mpsc::Sender<IoEvent>,
    /// Permits for [`MAX_READER_BACKLOG`] bytes of events.
    backlog: Arc<Semaphore>,
    breach: Breach,
    drain: CancellationToken,
    cancel: CancellationToken,
}

impl Events {
    /// Hands an event of `size` bytes to the cell once the backlog has room for it; false when
    /// the kernel is going away (dropped, disposed or breached) instead.
    async fn forward(
        &self,
        size: usize,
        event: impl FnOnce(OwnedSemaphorePermit) -> IoEvent,
    ) -> bool {
        // Clamped: a permit count is a u32, and no single event may need more than the whole.
        let permits = size.clamp(1, MAX_READER_BACKLOG) as u32;
        tokio::select! {
            _ = self.cancel.cancelled() => false,
            _ = self.drain.cancelled() => false,
            _ = self.breach.tripped() => false,
            sent = async {
                let Ok(permit) = self.backlog.clone().acquire_many_owned(permits).await else {
                    return false;
                };
                self.tx.send(event(permit)).await.is_ok()
            } => sent,
        }
    }
}

/// Reads the attach stream until it ends, the kernel is dropped, or the kernel breaks the
/// protocol (then it kills the kernel).
async fn reader_task(mut task: ReaderTask) {
    let mut lines = LineSplitter::default();
    let mut garbage = 0usize;
    let started = Instant::now();
    'read: loop {
        let item = tokio::select! {
            _ = task.cancel.cancelled() => break,
            _ = task.breach.tripped() => break,
            item = task.output.next() => item,
        };
        match item {
            Some(Ok(Chunk::Stdout(bytes))) => {
                // Output between cells belongs to nobody and is dropped here, not buffered.
                if task.active_cell.load(Ordering::Acquire) != 0
                    && !task
                        .events
                        .forward(bytes.len(), |permit| IoEvent::Output(bytes, permit))
                        .await
                {
                    break;
                }
            }
            Some(Ok(Chunk::Stderr(bytes))) => {
                let mut frames = Vec::new();
                let fed = lines.feed(&bytes, |line| match serde_json::from_slice::<KernelFrame>(line) {
                    Ok(frame) => frames.push((frame, line.len())),
                    Err(e) => {
                        garbage += line.len() + 1;
                        tracing::debug!(container = %short(&task.id), error = %e, "unparseable kernel frame dropped");
                    }
                });
                if fed.is_err() {
                    task.breach.trip(LINE_BREACH);
                    break;
                }
                if garbage > MAX_GARBAGE_BYTES {
                    task.breach.trip(GARBAGE_BREACH);
                    break;
                }
                for (frame, size) in frames {
                    match &frame {
                        KernelFrame::ToolCall { cell, call, .. } => {
                            let active = task.active_cell.load(Ordering::Acquire);
                            if active == 0 || *cell != Some(active) {
                                // A settled cell's thread: refuse here, nobody else is listening.
                                refuse(&task.writer, *call, RETIRED_MESSAGE);
                                continue;
                            }
                        }
                        KernelFrame::Ready { .. } => {}
                        // Nothing waits for these on this channel (a cell's outcome travels
                        // after its end marker on stdout).
                        KernelFrame::Done { .. } | KernelFrame::Pong => continue,
                    }
                    if !task
                        .events
                        .forward(size, |permit| IoEvent::Frame(frame, permit))
                        .await
                    {
                        break 'read;
                    }
                }
            }
            Some(Err(e)) => {
                tracing::debug!(container = %short(&task.id), error = %e, "attach stream error");
                break;
            }
            None => break,
        }
    }
    if let Some(what) = task.breach.what() {
        // Recorded before the container goes, so nothing mistakes the kill for a crash.
        task.death
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(Death::Protocol(what));
        task.disposing.store(true, Ordering::Release);
        tracing::warn!(container = %short(&task.id), breach = what, "kernel broke the protocol; killing it");
        // The streams are drained (and dropped) meanwhile: the engine does not finish removing
        // a container while its write to an attach connection nobody reads is blocked. The cell
        // (if any) learns of the death at once; nothing more is read from this kernel.
        let output = &mut task.output;
        let drain = async { while output.next().await.is_some() {} };
        let closed = async {
            let _ = task.events.tx.send(IoEvent::Closed).await;
        };
        let remove = task.engine.remove_container(&task.id);
        tokio::select! {
            _ = task.cancel.cancelled() => {}
            (removed, (), ()) = futures::future::join3(remove, drain, closed) => {
                if let Err(e) = removed {
                    tracing::warn!(container = %short(&task.id), error = %e, "killing a kernel that broke the protocol");
                }
            }
        }
        return;
    }
    if task.cancel.is_cancelled() {
        return;
    }
    if task.events.drain.is_cancelled() {
        // kernelbox is removing the kernel: read and drop what is left until the streams end.
        tokio::select! {
            _ = task.cancel.cancelled() => return,
            _ = async { while task.output.next().await.is_some() {} } => {}
        }
    }
    // The streams closed: the container is gone or going. Find out why before telling the cell.
    let death = if task.disposing.load(Ordering::Acquire) {
        Death::Disposed
    } else {
        let fate = task
            .monitor
            .wait_died(&task.id, Duration::from_secs(3))
            .await;
        // No `die` event, or a polite stop (SIGTERM, as the daemon does when it shuts down):
        // find out whether the engine itself went away.
        let engine_gone = (fate.died.is_none() || fate.kill_signal == Some(15))
            && task
                .monitor
                .wait_break(task.epoch, Duration::from_secs(2))
                .await;
        if task.disposing.load(Ordering::Acquire) {
            Death::Disposed
        } else if fate.died_of_oom() {
            Death::Oom
        } else if engine_gone {
            Death::EngineRestarted
        } else if fate.killed {
            Death::Killed
        } else {
            Death::Crashed(fate.died.unwrap_or(-1))
        }
    };
    tracing::debug!(container = %short(&task.id), ?death, lived = ?started.elapsed(), "kernel streams closed");
    task.death
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert(death);
    let _ = task.events.tx.send(IoEvent::Closed).await;
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}
