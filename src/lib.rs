//! # kernelbox
//!
//! Stateful Python kernels in hardened Docker containers, one per agent conversation, managed
//! for a whole host: state survives between cells, nothing leaks between owners, idle kernels
//! are reaped, the live count is capped (fairly between tenants), timeouts kill, tool calls from
//! inside a kernel run under the authority of the cell that made them, and no container
//! outlives its orchestrator.
//!
//! ## Layout
//!
//! | module | concern |
//! |---|---|
//! | [`clock`] | seconds since the Unix epoch (the bottom of the module graph) |
//! | [`labels`] | the Docker labels kernelbox writes and reads |
//! | `histogram` (crate-internal) | a Prometheus histogram (kernel start times, cell durations); the type is `orchestrator::Histogram`, as `Stats` holds it |
//! | [`cell`] | the cell contract (folder): [`CellResult`], statuses, loss reasons, output capping, every exact message, how an ending becomes a result (`docs/contract.md`) |
//! | [`rich`] | rich results: the MIME bundles a cell displays ([`RichResult`]) |
//! | [`audit`] | the audit trail (folder): one hash-chained JSON line per cell and command of the tenants that opt in, its writer and its verifier (`docs/usage.md`) |
//! | [`usage`] | what each tenant used (folder): per-tenant metric counters with bounded labels (`docs/usage.md`) |
//! | [`config`] | the validated configuration value |
//! | `owner` (crate-internal) | owners (session / delegated child, per tenant) and kernel keys |
//! | [`docker`] | the intent-level [`Engine`] trait, its bollard implementation, volume removal, the engine's events (OOM, outside kills and crashes told apart) |
//! | [`instance`] | no container outlives its instance (folder): identity and liveness, label sweeps, the watchdog process |
//! | [`image`] | building the kernel image offline |
//! | [`egress`] | network egress by policy (folder): policies parsed and matched, the TLS server name |
//! | [`authority`] | per-cell tool-call authority and the [`ToolDispatcher`] trait |
//! | `kernel` (crate-internal) | one kernel container (folder): spawn, reader task, one cell, stdin, the runner protocol |
//! | [`catalog`] | the durable owner catalog (folder): rows and rules, memory and redb stores, the writer thread |
//! | `registry` (crate-internal) | which kernel serves which key (folder): bookkeeping, caps and fair shares |
//! | [`cluster`] | the cluster's shared catalog in PostgreSQL (folder): nodes and epochs, where sessions live, kernels' rows; the catalog trait over it, fenced by epoch |
//! | [`files`] | files in and out of a kernel: path checks, what the file operations return, their errors |
//! | [`wire`] | the HTTP API as a client sees it (folder): its paths (the one percent-encoder for names and file paths in a URL), the execute body, the error body |
//! | [`client`] | the Rust client of the HTTP API (folder): execute, files, clearing a session; the one reader of the server's error JSON (`exec --url`, `cp`, `mcp --url`) |
//! | `services` (crate-internal) | the orchestrator's services (folder), each with its own state: hibernation, the usage ledger, the audit trail, workspace transfers, the runaway watch |
//! | [`orchestrator`] | the front door (folder): [`Orchestrator::execute`], lifecycle verbs, shutdown |
//! | [`server`] | the multi-tenant HTTP API behind `kernelbox serve` |
//! | [`settings`] | per-session settings: environment, memory and CPU limits, idle timeout, labels, checked against the tenant's maximums |
//! | [`tenancy`] | the per-tenant settings the orchestrator reads at the moment of use, swapped whole by a reload of the tenants |
//! | [`workspace`] | workspaces (folder): a session's `/work` kept past its kernel on a quota'd disk image, listed, deleted, swept by TTL |
//! | [`telemetry`] | OpenTelemetry traces, off unless `serve --otlp-endpoint`: the OTLP/HTTP pipeline, W3C `traceparent` in and out, spans of the current request (`docs/usage.md`, "Traces") |
//! | [`lifecycle`] | kernels' lifecycle events: logged, and kept in a bounded ring per session for the console's routes (`docs/console.md`) |
//! | [`logging`] | the log: text or JSON lines, `EnvFilter` levels, the access log's and lifecycle events' targets, the lifecycle events (`docs/logs.md`) |
//! | [`mcp`] | MCP (folder): tools over stdio (`kernelbox mcp`) and streamable HTTP (`/v1/mcp`) |
//!
//! Layers, the lifecycle of a kernel, task ownership, the runner protocol and the trust
//! boundary are described in `docs/architecture.md`.
//!
//! The runner that executes cells inside each container is `runner/kernel_runner.py`, with
//! `runner/rich.py` for rich results (standard library only), started by `runner/bootstrap.py` as `python3 -c`, so any image
//! with python3 >= 3.8 works.

pub mod audit;
pub mod authority;
pub mod catalog;
pub mod cell;
pub mod client;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod docker;
pub mod egress;
pub mod files;
pub(crate) mod histogram;
pub mod image;
pub mod instance;
pub(crate) mod kernel;
pub mod labels;
pub mod lifecycle;
pub mod logging;
pub mod mcp;
pub mod orchestrator;
pub(crate) mod owner;
pub(crate) mod registry;
pub mod rich;
pub mod server;
pub(crate) mod services;
pub mod settings;
pub mod telemetry;
pub mod tenancy;
pub mod units;
pub mod usage;
pub mod wire;
pub mod workspace;

pub use authority::{CellAuthority, FnDispatcher, RawToolCall, ToolCall, ToolDispatcher};
pub use cell::{
    CellException, CellResult, CellStatus, KernelInfo, LossReason, Migrated, OutputStream,
    Restored, StateLost, WorkspaceInfo,
};
pub use config::{Config, KernelRuntime, Sandbox, WorkMode};
pub use docker::{BollardEngine, Engine, EngineError};
pub use files::{Download, FileEntry, FilePath, Listing, TransferError, Written};
pub use kernel::{CommandSink, CommandStream, OutputSink};
pub use orchestrator::{
    AdmissionNotice, CommandError, CommandRequest, ExecuteError, ExecuteRequest, FileError,
    FileRequest, KernelSummary, Orchestrator, Scope, SnapshotError, StartError,
};
pub use registry::{Cap, TenantLimits, MAX_ATTACHED_PER_SLOT};
pub use rich::{DisplaySink, RawJson, RichResult};
