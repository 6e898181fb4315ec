//! Every exact message of the result contract, in one place and in the order
//! `docs/contract.md` gives them: the errors, warnings and hint of a [`CellResult`], the
//! refusals a cell's tool calls get, and the refusal of a call to a busy session. Tests assert
//! these texts; change them here and in `docs/contract.md` together.
//!
//! What MCP adds around a result (`docs/contract.md`, "Over MCP") is the MCP adapter's, in
//! `src/mcp/render.rs` and `src/mcp/files.rs`; what the runner writes inside the kernel (a
//! display's notes) is `runner/`'s.
//!
//! [`CellResult`]: super::CellResult

use std::time::Duration;

/// The end every message of a lost kernel shares (`NEXT` in `docs/contract.md`).
macro_rules! next {
    () => {
        "its state was lost. The next execute_code call starts a fresh kernel."
    };
}

/// The error of a cell past its timeout: `{T}` whole seconds when whole, else the decimal.
pub fn timeout_message(timeout: Duration) -> String {
    let shown = seconds(timeout);
    format!(
        "Cell timed out after {shown}s; the session kernel was killed and its state was lost. \
         The next execute_code call starts a fresh kernel."
    )
}

/// Seconds as the messages show them: whole when whole, else the decimal.
fn seconds(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs.fract() == 0.0 {
        format!("{}", secs as u64)
    } else {
        format!("{secs}")
    }
}

/// The error of a cell that stopped on its interrupt's KeyboardInterrupt.
pub const INTERRUPTED_MESSAGE: &str =
    "Interrupted (KeyboardInterrupt); the session kernel and its state were kept.";

/// The error of an interrupted cell that had not stopped when the grace (`{G}`) passed.
pub fn interrupt_killed_message(grace: Duration) -> String {
    format!(
        "Interrupted, but the cell did not stop within {}s of its KeyboardInterrupt; the \
         session kernel was killed and its state was lost.",
        seconds(grace)
    )
}

/// The refusal of a tool call the cell was waiting on when it was interrupted.
pub const INTERRUPTED_CALL_MESSAGE: &str =
    "The cell was interrupted while it waited on this tool call.";

/// The error of a cell interrupted while it waited for an earlier cell of its session.
pub const INTERRUPTED_BEFORE_IT_RAN: &str =
    "Interrupted before it ran: the cell was waiting for an earlier cell of this session and never executed.";

/// The error of a cell whose kernel was disposed of under it by a clear (`DELETE`), a reset
/// (`reset: true`) or a delegated child's release.
pub const CLEARED_MESSAGE: &str = concat!(
    "The session's kernel was cleared or reset by another request while this cell ran \
     (DELETE, reset: true, or the child's release) and was killed; ",
    next!()
);

/// The error of a cell whose kernel ran out of memory (`memory_bytes`: the kernel's limit).
pub fn oom_message(memory_bytes: i64) -> String {
    format!(
        concat!(
            "The kernel ran out of memory (limit {} MiB) and was killed; ",
            next!()
        ),
        memory_bytes / (1024 * 1024)
    )
}

/// The error of a cell whose kernel was killed or removed from outside kernelbox.
pub const KILLED_MESSAGE: &str = concat!("The kernel was killed from outside kernelbox; ", next!());

/// The error of a cell whose kernel was stopped because its node's cluster lease was no
/// longer trusted (its server stopped or stalled, or could not renew with the catalog): its
/// watchdog or its fence ended it (`docs/cluster.md`, "Leases and fencing").
pub const NODE_LOST_MESSAGE: &str = concat!(
    "The node running the kernel lost its cluster lease (its server was stopped or stalled, \
     or could not reach the catalog) and its kernels were stopped; ",
    next!()
);

/// The error of a cell whose runner died on its own with `exit_code`.
pub fn crash_message(exit_code: i64) -> String {
    format!(
        concat!("The kernel died unexpectedly (exit code {}); ", next!()),
        exit_code
    )
}

/// The error of a cell whose kernel the Docker engine took with it.
pub const ENGINE_RESTARTED_MESSAGE: &str = concat!(
    "The Docker engine restarted or went away and took the kernel with it; ",
    next!()
);

/// The error of a cell whose kernel broke the runner protocol (`what` it did).
pub fn protocol_message(what: &str) -> String {
    format!(
        concat!(
            "The kernel broke the kernelbox protocol ({}) and was killed; ",
            next!()
        ),
        what
    )
}

/// The error of a cell whose kernel kernelbox disposed of under it otherwise than by a clear
/// (at shutdown).
pub const SHUT_DOWN_MESSAGE: &str = concat!("The kernel was shut down by kernelbox; ", next!());

/// The error of a cell whose kernel had already ended by `sys.exit()` when it died.
pub const EXITED_MESSAGE: &str = "The kernel ended (sys.exit).";

/// The traceback of a cell whose `done` frame could not be read (status `error`).
pub const UNREADABLE_END_FRAME: &str =
    "kernelbox: the kernel's end-of-cell frame was unreadable; the cell's outcome is unknown";

/// The hint of a cell that timed out or was interrupted, its kernel gone.
pub const LONG_WORK_HINT: &str =
    "Long work can be split across cells, or run with a larger timeout.";

/// The refusal of a tool call whose cell has settled.
pub const RETIRED_MESSAGE: &str = "No active execute_code cell: the cell this kernel call belonged to has settled, so its tool authority is retired.";

/// The refusal of a tool the cell may not call; `available` lists those it may, or says
/// `none`.
pub fn unknown_tool_message(tool: &str, available: &str) -> String {
    format!(
        "Unknown tool {tool:?}: it is not available to this cell. Available tools: {available}."
    )
}

/// The refusal of a tool call past the cell's budget of `max_tool_calls`.
pub fn budget_message(max_tool_calls: u32) -> String {
    format!("Tool call budget exhausted: a cell may make at most {max_tool_calls} tool calls.")
}

/// The refusal of a tool call past the in-flight bounds (16 calls, 1 MiB of arguments).
pub const IN_FLIGHT_MESSAGE: &str = "Too many tool calls in flight: a cell may wait on at most 16 calls (1 MiB of arguments) at once; retry when one has returned.";

/// The error a cell's tool call gets for a result of `bytes` bytes of JSON, over `max`.
pub fn tool_result_too_large(bytes: usize, max: usize) -> String {
    format!("the tool's result is too large ({bytes} bytes; at most {max})")
}

/// The refusal of a call to a session whose kernel already has `max` calls running or
/// queued.
pub fn session_busy_message(owner: &str, max: usize) -> String {
    format!(
        "session {owner:?} already has {max} calls running or queued on its kernel, the most \
         allowed; retry later"
    )
}

/// What stands between the head and the tail of cut output.
pub fn omission_marker(omitted: u64, total: u64) -> String {
    format!("\n\n... [{omitted} bytes of output omitted; {total} bytes in all] ...\n\n")
}

/// The warning of cut output whose first `spilled` bytes were saved at `path` in the kernel.
pub fn output_spilled_warning(inline: usize, spilled: usize, path: &str) -> String {
    format!(
        "Output was cut to {inline} bytes; the first {spilled} bytes are in {path} inside the kernel."
    )
}

/// The warning of cut output whose spill into the kernel failed (`reason`).
pub fn output_spill_failed_warning(inline: usize, spilled: usize, reason: &str) -> String {
    format!(
        "Output was cut to {inline} bytes; saving the first {spilled} bytes inside the kernel failed ({reason})."
    )
}

/// The display caps as the display warnings name them.
fn display_caps(bundle: usize, cell: usize) -> String {
    format!("{bundle} bytes each, {cell} bytes per cell")
}

/// The warning of displays over the caps saved to files in the kernel (`paths`: at most 10,
/// then `and {n} more`).
pub fn displays_saved_warning(bundle: usize, cell: usize, paths: &str) -> String {
    format!(
        "Display data over the caps ({}) was saved to files inside the kernel: {paths}.",
        display_caps(bundle, cell)
    )
}

/// The warning of `dropped` displays past the caps.
pub fn displays_dropped_warning(dropped: u64, bundle: usize, cell: usize) -> String {
    format!(
        "{dropped} display(s) past the caps ({}) were dropped.",
        display_caps(bundle, cell)
    )
}
