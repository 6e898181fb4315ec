//! The runner protocol (version 3): newline-delimited JSON frames, and the byte plumbing that
//! turns Docker frames (which are not lines) back into lines (the cell's output stream is taken
//! apart in `scanner.rs`).
//!
//! Host -> runner frames travel on the container's stdin; runner -> host frames (`ready`,
//! `tool_call`) on its stderr; cell output (fds 1 and 2 inside the kernel) on its stdout, with
//! the cell's displays in-band behind a display marker the host chose, and ended per cell by an
//! end marker the host chose, followed by the cell's `done` frame on the same line: one write,
//! one trip through the engine. See `runner/kernel_runner.py` and `runner/rich.py` for the
//! other side.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::config::{DisplayCaps, DISPLAY_OVERHEAD_BYTES};

/// The protocol version this host speaks; the runner announces its own in `ready`.
pub(super) const PROTOCOL_VERSION: u64 = 3;

/// The runner's source; the kernel's environment carries it (see [`RUNNER_ENV`]), so no file
/// has to reach the container.
pub(super) const RUNNER_SOURCE: &str = include_str!("../../runner/kernel_runner.py");

/// The runner's rich-results part, which the runner keeps as text and compiles on first use
/// (an idle kernel pays nothing for it); the kernel's environment carries it ([`RICH_ENV`]).
const RICH_SOURCE: &str = include_str!("../../runner/rich.py");

/// The environment variable that hands [`RICH_SOURCE`] to the runner, which removes it before
/// any cell runs.
const RICH_ENV: &str = "KERNELBOX_RICH";

/// The `python3 -c` program that compiles and starts the runner in pieces: the parser's peak
/// memory stays resident in every kernel, and a piece's peak is a fraction of the whole file's.
const RUNNER_BOOTSTRAP: &str = include_str!("../../runner/bootstrap.py");

/// The environment variable that hands [`RUNNER_SOURCE`] to [`RUNNER_BOOTSTRAP`], which removes
/// it before any cell runs.
const RUNNER_ENV: &str = "KERNELBOX_RUNNER";

/// The environment variable that names a kernel's language when it is not Python (`bash`,
/// `javascript`, `typescript`): the runner then hosts that language's interpreter
/// (`runner/kernel_runner.py`, "Bash", `_Node`).
const LANGUAGE_ENV: &str = "KERNELBOX_LANGUAGE";

/// The JavaScript/TypeScript kernel's driver, which the runner writes to the kernel's /tmp and
/// runs under Node (`runner/kernel_runner.py`, `_Node`); only a kernel of those languages gets
/// it, in [`NODE_ENV`].
const NODE_SOURCE: &str = include_str!("../../runner/node_kernel.js");

/// The environment variable that hands [`NODE_SOURCE`] to the runner, which removes it before
/// any cell runs.
const NODE_ENV: &str = "KERNELBOX_NODE";

/// The environment entries a kernel of `language` needs beyond the runner's own: the language's
/// name when it is not Python ([`LANGUAGE_ENV`]), and Node's driver for JavaScript and
/// TypeScript.
pub(super) fn language_env(language: crate::wire::Language) -> Vec<String> {
    use crate::wire::Language;
    match language {
        Language::Python => Vec::new(),
        Language::Bash => vec![format!("{LANGUAGE_ENV}={}", language.name())],
        Language::Javascript | Language::Typescript => vec![
            format!("{LANGUAGE_ENV}={}", language.name()),
            format!("{NODE_ENV}={NODE_SOURCE}"),
        ],
    }
}

/// The kernel container's command: `python3 -c BOOTSTRAP`.
pub(super) fn runner_command() -> Vec<String> {
    ["python3", "-c", RUNNER_BOOTSTRAP]
        .map(String::from)
        .to_vec()
}

/// The kernel container's environment entries that carry the runner and its rich-results part.
pub(super) fn runner_env() -> [String; 2] {
    [
        format!("{RUNNER_ENV}={RUNNER_SOURCE}"),
        format!("{RICH_ENV}={RICH_SOURCE}"),
    ]
}

/// Longest protocol line (one runner -> host frame) accepted from a kernel, in bytes. Real
/// frames are small but for a tool call's arguments, which a cell may have in flight up to
/// this many bytes at once (see `kernel::MAX_TOOL_ARGS_IN_FLIGHT`); a longer line is a
/// protocol violation and kills the kernel (see [`Breach`]).
pub(super) const MAX_FRAME_LINE: usize = 1024 * 1024;

/// Longest `done` line (after a cell's end marker) read from a kernel, in bytes. The runner
/// never writes one over 4000 bytes (it shortens the traceback to fit); a longer one is
/// forged, and the cell's outcome is reported as unreadable rather than held.
pub(super) const MAX_DONE_LINE: usize = 8 * 1024;

/// Protocol input the host has no use for, in bytes, a kernel may send over its whole life:
/// lines that are not frames (an interpreter warning before the runner starts is one) and
/// frames the runner never sends unasked (a `pong`, a second `ready`, a `done` on this
/// channel). Past this the kernel is killed: each such line still costs the host a parse.
/// (Tool calls the host refuses are answered, never counted here: a cell may legitimately make
/// many, e.g. retrying past the in-flight cap; the read pace bounds what they cost,
/// `src/kernel/pace.rs`.)
pub(super) const MAX_WASTE_BYTES: usize = 1024 * 1024;

/// The breach reported past [`MAX_WASTE_BYTES`].
pub(super) const WASTE_BREACH: &str =
    "more than 1 MiB of protocol input kernelbox had no use for: lines that are not frames or \
     frames the runner never sends unasked";

/// A kernel that broke the protocol: whoever notices trips it, and the kernel's reader task,
/// which owns the container's streams, kills the kernel. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub(super) struct Breach {
    inner: std::sync::Arc<BreachInner>,
}

#[derive(Debug, Default)]
struct BreachInner {
    what: std::sync::OnceLock<&'static str>,
    tripped: tokio_util::sync::CancellationToken,
}

impl Breach {
    /// Records the violation (the first one wins) and wakes the reader task.
    pub(super) fn trip(&self, what: &'static str) {
        let _ = self.inner.what.set(what);
        self.inner.tripped.cancel();
    }

    /// The violation, once tripped.
    pub(super) fn what(&self) -> Option<&'static str> {
        self.inner.what.get().copied()
    }

    /// Completes once tripped.
    pub(super) async fn tripped(&self) {
        self.inner.tripped.cancelled().await
    }
}

/// A frame the host sends to the runner.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum HostFrame<'a> {
    /// Run a cell.
    Exec {
        /// Cell number, unique within the kernel.
        cell: u64,
        /// The cell's Python source, as the caller sent it.
        code: &'a str,
        /// Bytes the runner writes to fd 1 when the cell is over.
        marker: &'a str,
        /// Bytes the runner writes before each piece of a display.
        display: &'a str,
        /// The display caps the runner applies (the host enforces them too).
        display_caps: RunnerDisplayCaps,
    },
    /// The answer to a tool call.
    ToolResult {
        /// The call being answered.
        call: u64,
        /// Whether the call succeeded.
        ok: bool,
        /// The tool's JSON result, when ok, passed through as it came.
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<&'a RawValue>,
        /// Why it failed or was refused, when not ok.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// Drop the channel and wait for the relay that presents `token` after a restore
    /// (`docs/runtimes.md`, "Hibernation").
    Hibernate {
        /// Names the abstract socket the runner waits on; the relay presents it.
        token: &'a str,
        /// Where the staging volume is mounted: its files are kept in the sandbox's memory.
        staging: &'a str,
    },
}

impl HostFrame<'_> {
    /// The frame as one line.
    pub(super) fn to_line(&self) -> Vec<u8> {
        // Serialising these types cannot fail: every field is a string, number, bool or
        // already valid JSON.
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// The caps on a cell's displays, in bytes of each display's JSON: one display at most
/// `bundle`; all of a cell's at most `cell`, each counted with `overhead` more. The runner
/// saves a display past them to files and sends a note instead (`runner/rich.py`); the host
/// drops any display past them (`src/kernel/display.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(super) struct RunnerDisplayCaps {
    /// Largest display.
    pub(super) bundle: usize,
    /// Largest total of a cell's displays.
    pub(super) cell: usize,
    /// What each display counts beyond its JSON, for the host's memory per display.
    pub(super) overhead: usize,
}

impl From<DisplayCaps> for RunnerDisplayCaps {
    /// The configured caps, each display counted with [`DISPLAY_OVERHEAD_BYTES`] more.
    fn from(caps: DisplayCaps) -> Self {
        RunnerDisplayCaps {
            bundle: caps.bundle_bytes,
            cell: caps.cell_bytes,
            overhead: DISPLAY_OVERHEAD_BYTES,
        }
    }
}

/// How the runner says a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum DoneStatus {
    /// Ran to the end.
    Ok,
    /// Raised; the traceback comes along.
    Error,
    /// Called `sys.exit()`; the kernel ends.
    Exit,
    /// Ended by the KeyboardInterrupt of the host's SIGINT (an interrupt); the traceback
    /// comes along, the kernel stays.
    Interrupted,
}

/// A frame the runner sends to the host.
///
/// Parsed through a flat struct ([`WireFrame`]) rather than as an internally tagged enum:
/// serde buffers such an enum's whole input as a tree first, and a tool call's arguments stay
/// raw JSON text (no tree at all) until a dispatcher needs them.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "WireFrame")]
pub(super) enum KernelFrame {
    /// The runner is up.
    Ready {
        /// The protocol version the runner speaks (the host refuses all but its own).
        v: u64,
        /// The kernel's Python version (`3.12.1`), for the log.
        #[serde(default)]
        python: String,
    },
    /// A cell ended.
    Done {
        /// The cell that ended (the host checks it is the running one).
        cell: u64,
        /// Whether it ran to its end, raised or called `sys.exit()`.
        status: DoneStatus,
        /// The traceback when it raised.
        #[serde(default)]
        traceback: Option<String>,
        /// The exception's class name when it raised.
        #[serde(default)]
        ename: Option<String>,
        /// The exception's text when it raised.
        #[serde(default)]
        evalue: Option<String>,
        /// Cells the kernel has executed.
        execution_count: u64,
        /// Displays the runner dropped past the caps (not even a note fitted).
        displays_dropped: u64,
        /// The cell's exit status when it raised (a Bash cell's last command's; absent: 1).
        exit_code: Option<i64>,
    },
    /// Code in the kernel called a host tool.
    ToolCall {
        /// The cell the calling thread belongs to (none for threads of unknown origin).
        cell: Option<u64>,
        /// Call number, echoed in the answer.
        call: u64,
        /// The tool, as the cell named it (its authority decides whether it may).
        tool: String,
        /// Keyword arguments, as the kernel wrote them (valid JSON; absent when not sent).
        args: Option<Box<RawValue>>,
    },
    /// Answer to a ping.
    Pong,
    /// Answer to [`HostFrame::Hibernate`]: the runner waits for its relay (`ok`), or could
    /// not (`error`).
    Hibernating {
        /// Whether the runner is waiting.
        ok: bool,
        /// Why it is not.
        error: Option<String>,
    },
}

/// The operation a frame names.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Op {
    Ready,
    Done,
    ToolCall,
    Pong,
    Hibernating,
}

/// Every field any [`KernelFrame`] has, as it travels; unknown fields are skipped unread.
#[derive(Deserialize)]
struct WireFrame {
    op: Op,
    v: Option<u64>,
    #[serde(default)]
    python: String,
    cell: Option<u64>,
    status: Option<DoneStatus>,
    #[serde(default)]
    traceback: Option<String>,
    #[serde(default)]
    ename: Option<String>,
    #[serde(default)]
    evalue: Option<String>,
    execution_count: Option<u64>,
    #[serde(default)]
    displays_dropped: u64,
    #[serde(default)]
    exit_code: Option<i64>,
    call: Option<u64>,
    tool: Option<String>,
    args: Option<Box<RawValue>>,
    ok: Option<bool>,
    error: Option<String>,
}

impl TryFrom<WireFrame> for KernelFrame {
    type Error = &'static str;

    fn try_from(w: WireFrame) -> Result<KernelFrame, &'static str> {
        Ok(match w.op {
            Op::Ready => KernelFrame::Ready {
                v: w.v.ok_or("ready without v")?,
                python: w.python,
            },
            Op::Done => KernelFrame::Done {
                cell: w.cell.ok_or("done without cell")?,
                status: w.status.ok_or("done without status")?,
                traceback: w.traceback,
                ename: w.ename,
                evalue: w.evalue,
                execution_count: w.execution_count.ok_or("done without execution_count")?,
                displays_dropped: w.displays_dropped,
                exit_code: w.exit_code,
            },
            Op::ToolCall => KernelFrame::ToolCall {
                cell: w.cell,
                call: w.call.ok_or("tool_call without call")?,
                tool: w.tool.ok_or("tool_call without tool")?,
                args: w.args,
            },
            Op::Pong => KernelFrame::Pong,
            Op::Hibernating => KernelFrame::Hibernating {
                ok: w.ok.ok_or("hibernating without ok")?,
                error: w.error,
            },
        })
    }
}

/// A protocol line was longer than [`MAX_FRAME_LINE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a protocol line longer than {MAX_FRAME_LINE} bytes")]
pub(super) struct LineTooLong;

/// Splits a byte stream into lines, whatever the chunking; holds at most [`MAX_FRAME_LINE`]
/// bytes of an unfinished line.
#[derive(Debug, Default)]
pub(super) struct LineSplitter {
    buf: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes; calls `line` for every complete line (without the newline). A line longer
    /// than [`MAX_FRAME_LINE`] is an error, and the splitter holds nothing more of it.
    pub(super) fn feed(
        &mut self,
        mut data: &[u8],
        mut line: impl FnMut(&[u8]),
    ) -> Result<(), LineTooLong> {
        while let Some(pos) = data.iter().position(|&b| b == b'\n') {
            if self.buf.is_empty() {
                if pos > MAX_FRAME_LINE {
                    return Err(self.overflow());
                }
                line(&data[..pos]);
            } else {
                if self.buf.len() + pos > MAX_FRAME_LINE {
                    return Err(self.overflow());
                }
                self.buf.extend_from_slice(&data[..pos]);
                line(&self.buf);
                self.buf.clear();
            }
            data = &data[pos + 1..];
        }
        if self.buf.len() + data.len() > MAX_FRAME_LINE {
            return Err(self.overflow());
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    fn overflow(&mut self) -> LineTooLong {
        self.buf = Vec::new();
        LineTooLong
    }
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
