//! One kernel: a hardened container running the runner, its I/O task, and cell execution.
//!
//! A kernel owns a reader task that turns the attach stream into events: stdout chunks (cell
//! output) while a cell is active, and parsed protocol frames from stderr. Cells run one at a
//! time: the cell lock is a fair (FIFO) mutex, so they run in arrival order. The kernel and its
//! reader share one `Shared` value: the running cell's number and the kernel's state, whose
//! `Dead` variant is the one record of why the kernel is gone.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the [`Kernel`] struct, its state and death, host-memory bounds, dispose |
//! | `spawn.rs` | create the volume and container (its mounts, the runner's container spec), attach, start, wait for `ready` |
//! | `hibernate.rs` | hibernation: an idle kernel checkpointed by the engine and stopped ([`Checkpoint`]), and started again from it, its runner reconnected by a relay |
//! | `snapshot.rs` | snapshots: an idle kernel checkpointed with its container left running, and a fork's checkpoint (the snapshot's, restored into a new container) |
//! | `record.rs` | a hibernated kernel's record beside its checkpoint, so it survives a restart of the server: written, read back bounded |
//! | `command.rs` | a shell command beside the kernel: run by the engine's exec in its own process group, its streams apart under the output caps, the group killed at its timeout |
//! | `process.rs` | a background process beside the kernel: the command's leader with no deadline, its stdin kept open, signalled and killed from inside the container (`docs/processes.md`) |
//! | `run.rs` | one cell: [`Kernel::run_cell`] waits its turn, begins the cell, turns its `RunningCell` until it ends (output, displays, tool calls dispatched and answered), settles it into a [`CellRun`] |
//! | `reader.rs` | the attach-stream reader task: output and frames to the cell, a breached kernel killed, deaths told apart |
//! | `pace.rs` | the pace the attach stream is read at (a flooding kernel waits on its own pipe) |
//! | `files/` | the file transport: `runner/file_helper.py` run in the container by exec, resident while files are used, streamed (its `mod.rs` lists its files) |
//! | `staging.rs` | files written into the kernel's staging volume (output spills) |
//! | `stdin.rs` | the kernel's stdin: frames written inline when the pipe takes them, else by a task |
//! | `display.rs` | a cell's displays: assembled from their pieces under the caps, as [`RichResult`](crate::RichResult)s |
//! | `protocol.rs` | the runner protocol v3: frames, line splitting, the display caps the runner is sent (`docs/architecture.md`) |
//! | `scanner.rs` | a cell's output stream taken apart: output, display pieces, the end marker |
//! | `protocol_tests.rs` | unit tests of `protocol.rs` |

mod command;
mod display;
mod files;
mod hibernate;
mod pace;
mod process;
mod protocol;
mod reader;
mod record;
mod run;
mod scanner;
mod snapshot;
mod spawn;
mod staging;
mod stdin;

pub use command::{CommandSink, CommandStream};
pub(crate) use command::{CommandSpec, Leader, LeaderHead};
pub(crate) use files::prepare_socket_dir;
pub(crate) use hibernate::{Checkpoint, Restore};
pub(crate) use process::{ProcessSpec, StartedProcess};
pub(crate) use record::Record;
pub(crate) use spawn::{Created, SpawnRequest, Yield};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use crate::authority::CellAuthority;
use crate::cell::{Ending, KernelDeath, OutputBuffer, OutputStream, StreamBuffers};
use crate::clock::unix_now;
use crate::config::{
    DisplayCaps, OutputCaps, DEFAULT_DISPLAY_BUNDLE_BYTES, DEFAULT_DISPLAY_CELL_BYTES,
    DEFAULT_OUTPUT_INLINE_BYTES, DEFAULT_OUTPUT_SPILL_BYTES, WORK_DIR,
};
use crate::docker::{remove_volume_when_free, short_id, Engine, EngineError};
use crate::owner::{KernelKey, Owner};
use crate::rich::{DisplaySink, RichResult};
use protocol::{KernelFrame, MAX_FRAME_LINE, PROTOCOL_VERSION};
use scanner::MAX_DISPLAY_PIECE;
use stdin::{Stdin, MAX_STDIN_BACKLOG};

/// Where the staging volume is mounted in project mode (in strict mode it is the work dir).
const STAGING_DIR_PROJECT: &str = "/kernelbox";

/// Bytes of events (cell output chunks, protocol frames as their line length) the reader task
/// has handed to the running cell and the cell has not consumed yet. When it is reached the
/// reader stops reading the container's streams until the cell catches up, so a flooding cell
/// is slowed down by its own pipes rather than buffered on the host. A parsed frame takes
/// about its line length in memory: a tool call's arguments stay raw JSON text.
const MAX_READER_BACKLOG: usize = 8 * 1024 * 1024;

/// Tool calls of one cell dispatched and not answered yet; a call past this is refused at once
/// (it does not count against the cell's budget) until one of them is answered.
const MAX_TOOL_CALLS_IN_FLIGHT: usize = 16;

/// Bytes of arguments (measured as their frames' line length) of one cell's tool calls in
/// flight; a call that would pass this is refused at once, like one past
/// [`MAX_TOOL_CALLS_IN_FLIGHT`]. One protocol line ([`MAX_FRAME_LINE`]) always fits.
const MAX_TOOL_ARGS_IN_FLIGHT: usize = MAX_FRAME_LINE;

/// Longest tool result passed to a kernel, in bytes of JSON; a larger result reaches the cell
/// as a `ToolError` saying so. The server's tool endpoint responses are bounded the same.
pub(crate) const MAX_TOOL_RESULT_BYTES: usize = 1024 * 1024;

/// Longest tool-result frame sent to a kernel, in bytes: a result of
/// [`MAX_TOOL_RESULT_BYTES`] and the frame around it.
const MAX_TOOL_RESULT_FRAME: usize = MAX_TOOL_RESULT_BYTES + 1024;

/// The most host memory one kernel can make kernelbox hold, in bytes, whatever its code does
/// (the bounds above and in [`protocol`], [`stdin`] and [`crate::cell`]):
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
/// - output: the cell's result buffer, `cells.output.inline_bytes` plus
///   `cells.output.spill_bytes` (5 MB by default), and for a streaming request at most
///   [`STREAM_BACKLOG_BYTES`] (1 MiB) of undelivered events;
/// - displays (`display.rs`): the one being assembled, at most `cells.display.bundle_bytes`
///   (5 MiB by default) plus one piece ([`MAX_DISPLAY_PIECE`], 4 KiB), and the cell's finished
///   ones, at most `cells.display.cell_bytes` (20 MiB by default, each display counted with
///   1 KiB more for its structure); the same again as their JSON in the response, and for a
///   streaming request once more as `display` events the client has not read: three times the
///   cell cap.
///
/// With the defaults that is within this constant, 100 MiB ([`HOST_BYTES_PER_KERNEL`]: 34 MiB
/// without displays, 65 MiB for them; checked when the crate compiles), plus the tool
/// responses being read (with the server's dispatcher at most 16 x 1 MiB more, and only while
/// the cell's tools answer); a kernel that goes past a bound on frames in or answers out is
/// killed (`state_lost.reason = "protocol"`); displays past their caps are dropped. A library
/// dispatcher that implements only
/// [`ToolDispatcher::dispatch`](crate::ToolDispatcher::dispatch) gets the arguments parsed
/// into a `serde_json::Value`, which can take up to about 16 times their text.
/// `docs/reliability.md` ("Reliability and the trust boundary") states the same for
/// operators.
const MAX_HOST_BYTES_PER_KERNEL: usize = 100 * 1024 * 1024;

/// The bounds [`MAX_HOST_BYTES_PER_KERNEL`] lists, added up with the default caps.
const HOST_BYTES_PER_KERNEL: usize = MAX_FRAME_LINE
    + MAX_READER_BACKLOG
    + MAX_STDIN_BACKLOG
    + MAX_TOOL_RESULT_FRAME
    + 2 * MAX_TOOL_ARGS_IN_FLIGHT
    + DEFAULT_OUTPUT_INLINE_BYTES
    + DEFAULT_OUTPUT_SPILL_BYTES
    + STREAM_BACKLOG_BYTES
    + DEFAULT_DISPLAY_BUNDLE_BYTES
    + MAX_DISPLAY_PIECE
    + 3 * DEFAULT_DISPLAY_CELL_BYTES;

/// Undelivered events of a streaming execute, which the server holds (`docs/reliability.md`).
const STREAM_BACKLOG_BYTES: usize = 1024 * 1024;

// A bound raised past the documented total fails the build, so the documentation is revisited.
const _: () = assert!(HOST_BYTES_PER_KERNEL <= MAX_HOST_BYTES_PER_KERNEL);

/// The lifecycle of one kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KernelState {
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
pub(crate) enum Death {
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

impl Death {
    /// This death in the contract's terms (`memory_bytes`: the memory limit an OOM's message
    /// names).
    pub(crate) fn in_contract(self, memory_bytes: i64) -> KernelDeath {
        match self {
            Death::Oom => KernelDeath::Oom { memory_bytes },
            Death::Killed => KernelDeath::Killed,
            Death::Crashed(exit_code) => KernelDeath::Crashed { exit_code },
            Death::EngineRestarted => KernelDeath::EngineRestarted,
            Death::Protocol(what) => KernelDeath::Protocol { what },
            Death::Disposed => KernelDeath::ShutDown,
            Death::Exited => KernelDeath::Exited,
        }
    }
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
    /// A spawn that yielded to others was abandoned (shutdown) before it was done.
    #[error("starting a kernel was abandoned: kernelbox is shutting down")]
    Abandoned,
    /// The session's workspace could not be made ready.
    #[error("starting a kernel failed: {0}")]
    Workspace(#[from] crate::workspace::WorkspaceError),
    /// An idle kernel could not be checkpointed (`hibernate.rs`); it is disposed of and its
    /// loss reported as before.
    #[error("hibernating the kernel failed: {0}")]
    Hibernate(String),
    /// The session's files volume, shared by its contexts, went while the kernel was being
    /// made (its last kernel was removed meanwhile): the engine made a volume of that name by
    /// itself, which is removed with the container.
    #[error("starting a kernel failed: the session's files volume {volume} went meanwhile")]
    FilesGone {
        /// The volume's name.
        volume: String,
    },
}

/// What the reader task hands to the running cell.
/// Output and frames hold their share of [`MAX_READER_BACKLOG`] until the cell drops them.
#[derive(Debug)]
enum IoEvent {
    Output(Bytes, OwnedSemaphorePermit),
    Frame(KernelFrame, OwnedSemaphorePermit),
    Closed,
}

/// The outcome of one cell.
#[derive(Debug)]
pub(crate) struct CellRun {
    /// How it ended, as the kernel saw it (the orchestrator refines what only it can see:
    /// `orchestrator/execute.rs`).
    pub(crate) ending: Ending,
    /// What it wrote (stdout and stderr, one stream), under the cell's output caps.
    pub(crate) output: OutputBuffer,
    /// Its stdout, stderr and traceback apart, each under the inline cap.
    pub(crate) streams: StreamBuffers,
    /// The exception it raised, as the runner named it: class name and text.
    pub(crate) exception: Option<(String, String)>,
    /// Cells executed by the kernel, this one included; 0 when the cell never ran.
    pub(crate) execution_count: u64,
    /// The cell number (0 when it never ran).
    pub(crate) cell: u64,
    /// Whether the cell reached the kernel. A cell interrupted while it waited for earlier
    /// cells, or that found its kernel dead, never ran: the kernel is untouched by it.
    pub(crate) ran: bool,
    /// The cell's displays, in order.
    pub(crate) results: Vec<RichResult>,
    /// What became of displays past the caps (saved to files, dropped), when any were.
    pub(crate) display_warning: Option<String>,
}

/// Receives output live while a cell runs (for streaming), with the stream it came on.
pub type OutputSink = Arc<dyn Fn(OutputStream, &[u8]) + Send + Sync>;

/// What one cell may keep of its output and displays, and where they go live.
pub(crate) struct CellOptions {
    /// Output kept inline, and kept for the spill file.
    pub(crate) output: OutputCaps,
    /// The caps on the cell's displays.
    pub(crate) display: DisplayCaps,
    /// Receives output as it arrives.
    pub(crate) sink: Option<OutputSink>,
    /// Receives each display as it arrives, in order with the output.
    pub(crate) display_sink: Option<DisplaySink>,
    /// How long a cell may take to stop once interrupted before its kernel is killed.
    pub(crate) interrupt_grace: Duration,
    /// The memory limit an out-of-memory death's message names.
    pub(crate) memory_bytes: i64,
}

/// The I/O a running cell needs, behind the FIFO cell lock.
struct CellIo {
    rx: mpsc::Receiver<IoEvent>,
}

/// Longest a rename of a kernel's container may take ([`Kernel::rename`]); its removal waits
/// for a rename under way.
const RENAME_LIMIT: Duration = Duration::from_secs(5);

/// What a kernel and its reader task share.
struct Shared {
    /// The running cell's number, 0 between cells; read by the reader for every chunk.
    active_cell: AtomicU64,
    /// The kernel's state; once `Dead` it never changes again.
    state: Mutex<KernelState>,
    /// Held across a rename of the container and across its removal by kernelbox, so the two
    /// never overlap (as long as the engine answers a rename within [`RENAME_LIMIT`]): a
    /// rename that landed while the engine removed the container left it listed as removing.
    naming: tokio::sync::Mutex<()>,
    /// The attach streams ended: the container exited and the engine is removing it (it is
    /// created with auto-remove), while the reader may still be finding out why (up to 5 s)
    /// before the kernel is recorded dead. No rename starts after this.
    exited: std::sync::atomic::AtomicBool,
    /// The host asked the runner to hibernate and waits for its answer (`hibernate.rs`).
    hibernating: AtomicBool,
}

impl Shared {
    fn new() -> Shared {
        Shared {
            active_cell: AtomicU64::new(0),
            state: Mutex::new(KernelState::Starting),
            naming: tokio::sync::Mutex::new(()),
            exited: std::sync::atomic::AtomicBool::new(false),
            hibernating: AtomicBool::new(false),
        }
    }

    fn state(&self) -> KernelState {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves a live kernel to `state`; a dead one stays dead.
    fn set_live(&self, state: KernelState) {
        let mut current = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(*current, KernelState::Dead(_)) {
            *current = state;
        }
    }

    /// Removes the container once no rename of it is under way (see `naming`): every
    /// removal of a kernel by kernelbox goes through here.
    async fn remove_container(&self, engine: &dyn Engine, id: &str) -> Result<(), EngineError> {
        let _naming = self.naming.lock().await;
        engine.remove_container(id).await
    }

    /// Records why the kernel is gone; the first cause recorded wins.
    fn die(&self, death: Death) {
        let mut current = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(*current, KernelState::Dead(_)) {
            *current = KernelState::Dead(death);
        }
    }

    fn death(&self) -> Option<Death> {
        match self.state() {
            KernelState::Dead(death) => Some(death),
            _ => None,
        }
    }
}

/// One live kernel container.
pub struct Kernel {
    /// Full (64 hex) container id.
    pub(crate) id: String,
    /// Name of its staging volume.
    volume: String,
    /// The session's files volume at `/work` when it is not `volume` (another context's:
    /// `docs/contract.md`, "Languages").
    files_volume: Option<String>,
    /// The workspace mounted at `/work`, when its tenant has workspaces.
    workspace: Option<crate::cell::WorkspaceInfo>,
    /// Who it belongs to: set at spawn, or when an owner takes it from the warm pool; tool
    /// calls are made on this owner's behalf.
    owner: OnceLock<Owner>,
    /// Where spills go inside the kernel.
    spill_dir: String,
    user: String,
    engine: Arc<dyn Engine>,
    shared: Arc<Shared>,
    io: tokio::sync::Mutex<CellIo>,
    writer: Stdin,
    next_cell: AtomicU64,
    execution_count: AtomicU64,
    /// The timeout the last cell that began ran under, in milliseconds (0: no cell yet).
    last_timeout_ms: AtomicU64,
    /// The runaway watch saw it computing with no cell running (`services/runaway.rs`):
    /// it counts as busy.
    computing: AtomicBool,
    authority: Mutex<Option<Arc<CellAuthority>>>,
    /// Tells the reader to stop handing events to the cell and just drain the streams, so the
    /// engine can finish removing the container.
    drain: CancellationToken,
    cancel: CancellationToken,
    /// The resident file helper (`files/helper.rs`), ended with the kernel.
    files: Arc<files::Resident>,
    /// How it came back from hibernation, until the first call reports it (`hibernate.rs`).
    restored: Mutex<Option<crate::cell::Restored>>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("id", &self.short_id())
            .field("owner", &self.owner.get())
            .field("state", &self.state())
            .finish()
    }
}

/// Labels of a kernel's container and volume.
fn kernel_labels(
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

/// Labels of a warm-pool kernel's container and volume: the instance's, and no owner.
fn pool_labels(base: &BTreeMap<String, String>, role: &str) -> BTreeMap<String, String> {
    use crate::labels as l;
    let mut labels = base.clone();
    labels.insert(l::ROLE.into(), role.into());
    labels.insert(l::POOL.into(), "true".into());
    labels.insert(l::CREATED_AT.into(), unix_now().to_string());
    labels
}

impl Kernel {
    /// Gives an ownerless (pooled) kernel its owner; false when it already had one (a kernel
    /// is never handed to a second owner).
    pub(crate) fn assign(&self, owner: &Owner) -> bool {
        self.owner.set(owner.clone()).is_ok()
    }

    /// Its owner, once it has one.
    fn owner(&self) -> Option<&Owner> {
        self.owner.get()
    }

    /// The workspace mounted at `/work`, when its session has one.
    pub(crate) fn workspace(&self) -> Option<&crate::cell::WorkspaceInfo> {
        self.workspace.as_ref()
    }

    /// The short (12 hex) container id.
    pub(crate) fn short_id(&self) -> &str {
        short_id(&self.id)
    }

    /// The current state.
    pub(crate) fn state(&self) -> KernelState {
        self.shared.state()
    }

    /// Why the kernel is gone, once it is.
    pub(crate) fn death(&self) -> Option<Death> {
        self.shared.death()
    }

    /// True while the kernel can run cells.
    /// Cancelled when the kernel goes (disposed of, or dead).
    pub(crate) fn gone(&self) -> CancellationToken {
        self.cancel.clone()
    }

    pub(crate) fn is_alive(&self) -> bool {
        self.shared.death().is_none()
    }

    /// Cells executed so far.
    pub(crate) fn execution_count(&self) -> u64 {
        self.execution_count.load(Ordering::Acquire)
    }

    /// Cells begun so far: a change between two samples of the kernel's CPU time means a cell
    /// ran between them.
    pub(crate) fn cells_begun(&self) -> u64 {
        self.next_cell.load(Ordering::Acquire)
    }

    /// The timeout the last cell that began ran under; `None` before its first cell.
    pub(crate) fn last_timeout(&self) -> Option<Duration> {
        match self.last_timeout_ms.load(Ordering::Acquire) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    /// True while a cell runs.
    pub(crate) fn is_running_cell(&self) -> bool {
        self.state() == KernelState::Busy || self.shared.active_cell.load(Ordering::Acquire) != 0
    }

    /// Whether the runaway watch last saw it computing with no cell running.
    pub(crate) fn is_computing(&self) -> bool {
        self.computing.load(Ordering::Acquire)
    }

    /// Set by the runaway watch after each sample.
    pub(crate) fn set_computing(&self, computing: bool) {
        self.computing.store(computing, Ordering::Release);
    }

    /// The authority of the running cell, or of the last one (retired) when idle.
    pub fn cell_authority(&self) -> Option<Arc<CellAuthority>> {
        self.authority
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Renames the container (a taken pooled kernel is named after its owner,
    /// `labels::owner_name`). Never overlaps a removal by kernelbox; a kernel already dead
    /// (disposed, killed, crashed) or whose container exited is left as it is. A container
    /// that exits while its rename is under way can still overlap the engine's own
    /// auto-removal; the window is the rename itself.
    pub(crate) async fn rename(&self, name: &str) -> Result<(), EngineError> {
        let _naming = self.shared.naming.lock().await;
        if !self.is_alive() || self.shared.exited.load(Ordering::Acquire) {
            return Ok(());
        }
        // Bounded: a removal waits for it.
        tokio::time::timeout(RENAME_LIMIT, self.engine.rename_container(&self.id, name))
            .await
            .unwrap_or_else(|_| {
                Err(EngineError::Other {
                    op: "rename container",
                    target: self.id.clone(),
                    message: format!("no answer within {RENAME_LIMIT:?}"),
                })
            })
    }

    /// Removes the container and its staging volume. Idempotent.
    pub(crate) async fn dispose(&self) -> Result<(), EngineError> {
        self.shared.die(Death::Disposed);
        self.drain.cancel();
        // Dead from here on: a rename under way ends first and none starts after.
        let removed = self
            .shared
            .remove_container(self.engine.as_ref(), &self.id)
            .await;
        self.cancel.cancel();
        removed?;
        match &self.files_volume {
            Some(files) => {
                remove_volume_when_free(self.engine.as_ref(), &self.volume).await?;
                staging::release_files(self.engine.as_ref(), files).await
            }
            None => staging::release_files(self.engine.as_ref(), &self.volume).await,
        }
    }

    /// The volume at this kernel's `/work` in strict mode without a workspace: its own staging
    /// volume, or its session's files volume (`docs/contract.md`, "Languages"); `None` with a
    /// workspace.
    pub(crate) fn files_volume(&self) -> Option<&str> {
        match (&self.workspace, &self.files_volume) {
            (Some(_), _) => None,
            (None, Some(files)) => Some(files),
            (None, None) => Some(&self.volume),
        }
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub(crate) fn parse_user(user: &str) -> (u64, u64) {
    let mut parts = user.split(':');
    let uid = parts.next().and_then(|u| u.parse().ok()).unwrap_or(0);
    let gid = parts.next().and_then(|g| g.parse().ok()).unwrap_or(uid);
    (uid, gid)
}

#[cfg(test)]
mod runner_limits_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_recorded_death_wins_and_a_dead_kernel_stays_dead() {
        let shared = Shared::new();
        assert_eq!(shared.state(), KernelState::Starting);
        shared.set_live(KernelState::Busy);
        shared.die(Death::Exited);
        // The reader's later finding (the streams closed) must not overwrite the exit.
        shared.die(Death::Crashed(1));
        shared.set_live(KernelState::Idle);
        assert_eq!(shared.state(), KernelState::Dead(Death::Exited));
        assert_eq!(shared.death(), Some(Death::Exited));
    }
}
