//! The cell contract: what every execute returns (`docs/contract.md`), and output capping.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the result's types ([`CellResult`], [`CellStatus`], [`LossReason`], [`KernelInfo`], [`CellException`], [`OutputStream`]) and output capping ([`OutputBuffer`], [`StreamBuffers`]) |
//! | `messages.rs` | every exact message of the contract |
//! | `ending.rs` | [`Ending`], the one type for how a cell ended (the kernel's cell loop ends a cell with one, the orchestrator refines it), and how it becomes its result's status, error and loss (a pure function, unit-tested row by row) |

pub mod messages;

mod ending;

pub(crate) use ending::{Ending, KernelDeath};

use serde::{Deserialize, Serialize};

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CellStatus {
    /// The cell ran to the end (or called `sys.exit()`).
    Success,
    /// The cell raised, or the kernel died under it.
    Error,
    /// The cell ran past its timeout; the kernel was killed.
    Timeout,
    /// The caller interrupted the cell (`POST .../interrupt`): it stopped on its
    /// KeyboardInterrupt with its kernel and state kept, or, queued behind another cell, ended
    /// without running, or, still running when the interrupt grace passed, was killed with its
    /// kernel (the owner's next call reports `state_lost: killed`; docs/contract.md, "How an
    /// interrupt works").
    Interrupted,
}

impl CellStatus {
    /// The wire name, for metrics and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CellStatus::Success => "success",
            CellStatus::Error => "error",
            CellStatus::Timeout => "timeout",
            CellStatus::Interrupted => "interrupted",
        }
    }
}

/// Why a kernel was lost without its owner asking.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LossReason {
    /// Reaped after `kernels.idle_timeout` without a cell.
    IdleReaped,
    /// Evicted as least recently used past `kernels.max_session_kernels`.
    Evicted,
    /// A cell ran past its timeout and the kernel was killed.
    Timeout,
    /// The kernel ran out of memory.
    Oom,
    /// The kernel died on its own (the runner crashed).
    Crashed,
    /// The container was killed or removed from outside kernelbox, or an interrupted cell did
    /// not stop within the interrupt grace.
    Killed,
    /// The Docker engine restarted and took the kernel with it.
    EngineRestarted,
    /// The kernelbox server stopped or died (and was started again) while the kernel was
    /// live; known from the durable catalog in the server's state directory.
    ServerRestarted,
    /// The kernel broke the runner protocol (its code forged or flooded the runner's private
    /// channel past a bound) and kernelbox killed it.
    Protocol,
    /// The node the kernel ran on stopped renewing its lease (died, was cut off, or was
    /// fenced) and the cluster gave its sessions up (docs/cluster.md, "Catalog schema").
    NodeLost,
    /// The kernel kept computing with no cell running (its code forged the end of a cell, or
    /// left work running after it) for longer than its last cell's timeout allowed, and
    /// kernelbox killed it (`docs/reliability.md`, "Runaway kernels").
    Runaway,
    /// The node the kernel ran on was drained (`kernelbox drain`, or a stop with
    /// `--drain-deadline`) and the session was still live at the drain's deadline
    /// (docs/cluster.md, "Draining and upgrades").
    NodeDrained,
    /// The kernel's tenant was removed from the tenants by a reload, and its kernels with it
    /// (docs/http-api.md, "Reloading the tenants"); told if the tenant is ever added back.
    TenantRemoved,
}

impl LossReason {
    /// Every reason, for pre-initialised metric labels.
    pub const ALL: [LossReason; 13] = [
        LossReason::IdleReaped,
        LossReason::Evicted,
        LossReason::Timeout,
        LossReason::Oom,
        LossReason::Crashed,
        LossReason::Killed,
        LossReason::EngineRestarted,
        LossReason::ServerRestarted,
        LossReason::Protocol,
        LossReason::NodeLost,
        LossReason::Runaway,
        LossReason::NodeDrained,
        LossReason::TenantRemoved,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            LossReason::IdleReaped => "idle_reaped",
            LossReason::Evicted => "evicted",
            LossReason::Timeout => "timeout",
            LossReason::Oom => "oom",
            LossReason::Crashed => "crashed",
            LossReason::Killed => "killed",
            LossReason::EngineRestarted => "engine_restarted",
            LossReason::ServerRestarted => "server_restarted",
            LossReason::Protocol => "protocol",
            LossReason::NodeLost => "node_lost",
            LossReason::Runaway => "runaway",
            LossReason::NodeDrained => "node_drained",
            LossReason::TenantRemoved => "tenant_removed",
        }
    }
}

/// Reported once, on the first call after an involuntary loss.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StateLost {
    /// Why the previous kernel is gone.
    pub reason: LossReason,
    /// When it was lost, RFC 3339.
    pub at: String,
    /// The session's workspace went too: the new kernel's `/work` is a new, empty workspace
    /// (the old one was on a lost cluster node, or deleted meanwhile; `docs/workspaces.md`).
    /// Absent (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub workspace_lost: bool,
}

/// The kernel part of a result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, schemars::JsonSchema)]
pub struct KernelInfo {
    /// Container id (short).
    pub id: String,
    /// False when this call gave the owner a new kernel: started it, or took it from the warm
    /// pool (a kernel no cell ever ran in).
    pub reused: bool,
    /// Cells this kernel executed, this one included.
    pub execution_count: u64,
    /// True when `reset=true` discarded a previous kernel.
    pub state_reset: bool,
    /// True when the cell called `sys.exit()`: the kernel is gone.
    pub ended: bool,
    /// Which kernel of this key this is (1, 2, ...).
    pub generation: u64,
    /// Present on the first call after an involuntary loss.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub state_lost: Option<StateLost>,
    /// The session's workspace mounted at `/work`, when its tenant has workspaces
    /// (`docs/workspaces.md`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub workspace: Option<WorkspaceInfo>,
    /// Present on the first call after the kernel came back from hibernation: its memory,
    /// variables and files are as they were (`docs/runtimes.md`, "Hibernation").
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub restored: Option<Restored>,
    /// Present on the first call after the kernel moved here from a drained node, its
    /// memory, variables and generation intact (`docs/cluster.md`, "Migration on drain").
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub migrated: Option<Migrated>,
}

/// Where a migrated kernel came from (`docs/cluster.md`, "Migration on drain").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Migrated {
    /// The node the kernel ran on before its drain.
    pub from_node: String,
}

/// How a hibernated kernel came back (`docs/runtimes.md`, "Hibernation").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Restored {
    /// Why it had hibernated: `idle` (past its idle timeout), `evicted` (to make room), or
    /// `restart` (idle at the server's stop).
    pub from: String,
    /// How long its checkpoint took.
    pub checkpoint_seconds: f64,
    /// How long its restore took (the container started from the checkpoint and the runner
    /// reconnected), part of this call's time.
    pub restore_seconds: f64,
}

/// The workspace a kernel's `/work` is (`docs/workspaces.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkspaceInfo {
    /// The workspace's name: the owner it belongs to (`session`, or `session::child::id`).
    pub name: String,
    /// True when the workspace was there before this kernel started: its files are an
    /// earlier kernel's.
    pub restored: bool,
}

/// The result of one execute (`docs/contract.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CellResult {
    /// How the cell ended.
    pub status: CellStatus,
    /// What the cell wrote (stdout and stderr interleaved in write order), then the traceback.
    pub output: String,
    /// Present when status is not success: the traceback or kernelbox's message.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub error: Option<String>,
    /// 0 success, 1 the cell raised, -1 timeout, interrupt or kernel death.
    pub exit_code: i32,
    /// Tool calls this cell dispatched.
    pub tool_calls_made: u32,
    /// Wall time of the call, spawn included.
    pub duration_seconds: f64,
    /// The kernel that ran the cell.
    pub kernel: KernelInfo,
    /// What the cell wrote on its stdout (fd 1), under the inline cap (docs/contract.md,
    /// "stdout and stderr").
    #[serde(default)]
    pub stdout: String,
    /// What the cell wrote on its stderr (fd 2), under the inline cap; the traceback of a cell
    /// that raised is not in it (it is in `exception`).
    #[serde(default)]
    pub stderr: String,
    /// The exception a cell raised, typed: present when the cell raised (status `error`, or
    /// `interrupted` by its KeyboardInterrupt), absent when it ended otherwise or kernelbox
    /// ended it (timeout, kernel death: `error` says why).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub exception: Option<CellException>,
    /// True when `output` was cut.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stdout_truncated: Option<bool>,
    /// Bytes the cell wrote in all, when output was cut.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stdout_bytes_total: Option<u64>,
    /// Bytes left out of `output`, when it was cut.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub stdout_bytes_omitted: Option<u64>,
    /// Human guidance, e.g. where the full output was spilled.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub warning: Option<String>,
    /// A hint on what to do next.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub hint: Option<String>,
    /// Rich results (MIME bundles) in the order the cell displayed them; absent when none.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub results: Vec<crate::rich::RichResult>,
}

/// The exception a cell raised (docs/contract.md, "stdout and stderr").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CellException {
    /// The exception's class name, e.g. `ZeroDivisionError` (at most 200 characters).
    pub name: String,
    /// Its text, `str(exception)` (cut past about 1,000 characters).
    pub value: String,
    /// The formatted traceback, under the inline cap.
    pub traceback: String,
}

/// Which stream a piece of a cell's output came on, as a streamed execute's `output` events
/// name it (docs/contract.md, "stdout and stderr").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    /// The cell's fd 1.
    Stdout,
    /// The cell's fd 2.
    Stderr,
    /// The traceback of a cell that raised (part of `output`, in neither stdout nor stderr).
    Traceback,
}

/// A cell's stdout, stderr and traceback apart, each kept under the inline cap like `output`
/// (first 40%, last 60%), nothing spilled: what they hold is also in `output`.
#[derive(Debug)]
pub struct StreamBuffers {
    /// fd 1.
    pub stdout: OutputBuffer,
    /// fd 2.
    pub stderr: OutputBuffer,
    /// The traceback.
    pub traceback: OutputBuffer,
}

impl StreamBuffers {
    /// Buffers keeping `inline_cap` bytes each.
    pub fn new(inline_cap: usize) -> Self {
        StreamBuffers {
            stdout: OutputBuffer::new(inline_cap, 0),
            stderr: OutputBuffer::new(inline_cap, 0),
            traceback: OutputBuffer::new(inline_cap, 0),
        }
    }

    /// Appends what came on `stream`.
    pub fn push(&mut self, stream: OutputStream, data: &[u8]) {
        match stream {
            OutputStream::Stdout => self.stdout.push(data),
            OutputStream::Stderr => self.stderr.push(data),
            OutputStream::Traceback => self.traceback.push(data),
        }
    }
}

/// Collects a cell's output under the inline cap: the first 40% and the last 60% are kept,
/// and everything up to the spill cap is kept for the spill file.
#[derive(Debug)]
pub struct OutputBuffer {
    inline_cap: usize,
    spill_cap: usize,
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    spill: Vec<u8>,
    total: u64,
}

/// The capped output of a cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CappedOutput {
    /// The inline text (with an omission marker when cut).
    pub text: String,
    /// Bytes written in all.
    pub total: u64,
    /// Bytes left out of `text`; 0 when nothing was cut.
    pub omitted: u64,
    /// Up to the spill cap of the full output, when it was cut.
    pub spill: Option<Vec<u8>>,
}

impl OutputBuffer {
    /// A buffer keeping `inline_cap` bytes inline and `spill_cap` bytes for the spill file.
    pub fn new(inline_cap: usize, spill_cap: usize) -> Self {
        OutputBuffer {
            inline_cap,
            spill_cap,
            head: Vec::new(),
            tail: std::collections::VecDeque::new(),
            spill: Vec::new(),
            total: 0,
        }
    }

    fn head_cap(&self) -> usize {
        self.inline_cap * 2 / 5
    }

    fn tail_cap(&self) -> usize {
        self.inline_cap - self.head_cap()
    }

    /// Bytes written so far.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Appends what the cell wrote.
    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if self.spill.len() < self.spill_cap {
            let take = data.len().min(self.spill_cap - self.spill.len());
            self.spill.extend_from_slice(&data[..take]);
        }
        let head_room = self.head_cap().saturating_sub(self.head.len());
        if head_room > 0 {
            let take = data.len().min(head_room);
            self.head.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        let tail_cap = self.tail_cap();
        if data.len() >= tail_cap {
            self.tail.clear();
            self.tail.extend(&data[data.len() - tail_cap..]);
        } else {
            let overflow = (self.tail.len() + data.len()).saturating_sub(tail_cap);
            self.tail.drain(..overflow);
            self.tail.extend(data);
        }
    }

    /// Appends text (a traceback) to the output.
    pub fn push_str(&mut self, text: &str) {
        self.push(text.as_bytes());
    }

    /// The capped output.
    pub fn finish(self) -> CappedOutput {
        let kept = (self.head.len() + self.tail.len()) as u64;
        if self.total <= self.inline_cap as u64 {
            let mut all = self.head;
            all.extend(self.tail);
            return CappedOutput {
                text: String::from_utf8_lossy(&all).into_owned(),
                total: self.total,
                omitted: 0,
                spill: None,
            };
        }
        let omitted = self.total - kept;
        let tail: Vec<u8> = self.tail.into_iter().collect();
        let text = format!(
            "{}{}{}",
            String::from_utf8_lossy(&self.head),
            messages::omission_marker(omitted, self.total),
            String::from_utf8_lossy(&tail)
        );
        CappedOutput {
            text,
            total: self.total,
            omitted,
            spill: Some(self.spill),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_output_is_kept_whole() {
        let mut buf = OutputBuffer::new(100, 1000);
        buf.push(b"hello ");
        buf.push(b"world");
        let out = buf.finish();
        assert_eq!(out.text, "hello world");
        assert_eq!(out.omitted, 0);
        assert!(out.spill.is_none());
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_counts_the_gap() {
        let mut buf = OutputBuffer::new(100, 150);
        for i in 0..100u8 {
            buf.push(&[b'a' + (i % 26); 3]);
        }
        let out = buf.finish();
        assert_eq!(out.total, 300);
        assert_eq!(out.omitted, 200);
        assert!(out.text.starts_with("aaabbb"));
        assert!(out
            .text
            .contains("[200 bytes of output omitted; 300 bytes in all]"));
        assert_eq!(out.spill.as_ref().map(Vec::len), Some(150));
        // The tail is the last 60 bytes.
        assert!(out.text.ends_with("vvv"));
    }

    #[test]
    fn one_huge_write_is_cut_too() {
        let mut buf = OutputBuffer::new(1000, 2000);
        buf.push(&vec![b'x'; 1_000_000]);
        let out = buf.finish();
        assert_eq!(out.omitted, 999_000);
        assert!(out.text.len() < 1100);
    }

    #[test]
    fn timeout_message_is_exact() {
        assert_eq!(
            messages::timeout_message(std::time::Duration::from_secs(1)),
            "Cell timed out after 1s; the session kernel was killed and its state was lost. \
             The next execute_code call starts a fresh kernel."
        );
        assert!(
            messages::timeout_message(std::time::Duration::from_millis(1500))
                .contains("after 1.5s")
        );
    }

    #[test]
    fn results_serialise_with_the_contract_names() {
        let result = CellResult {
            status: CellStatus::Success,
            output: "42\n".into(),
            error: None,
            exit_code: 0,
            tool_calls_made: 0,
            duration_seconds: 0.01,
            stdout: "42\n".into(),
            stderr: String::new(),
            exception: None,
            kernel: KernelInfo {
                state_lost: Some(StateLost {
                    reason: LossReason::IdleReaped,
                    at: "2026-01-01T00:00:00Z".into(),
                    workspace_lost: false,
                }),
                ..KernelInfo::default()
            },
            stdout_truncated: None,
            stdout_bytes_total: None,
            stdout_bytes_omitted: None,
            warning: None,
            hint: None,
            results: Vec::new(),
        };
        let json = serde_json::to_value(&result).unwrap();
        assert_eq!(json["status"], "success");
        assert_eq!(json["kernel"]["state_lost"]["reason"], "idle_reaped");
        assert!(json.get("error").is_none());
        assert!(json.get("stdout_truncated").is_none());
        assert!(json.get("results").is_none());
    }
}
