//! # kernelbox
//!
//! Stateful Python kernels in hardened Docker containers, one per agent conversation, managed
//! for a whole host: state survives between cells, nothing leaks between owners, idle kernels
//! are reaped, the live count is capped (fairly between tenants), timeouts kill, tool calls from inside a kernel
//! run under the authority of the cell that made them, and no container outlives its
//! orchestrator.
//!
//! ## Layout
//!
//! | module | concern |
//! |---|---|
//! | [`config`] | the validated configuration value |
//! | [`cell`] | the cell contract: [`CellResult`], statuses, loss reasons, output capping |
//! | [`owner`] | owners (session / delegated child, per tenant) and kernel keys |
//! | [`protocol`] | the runner protocol: frames, line splitting, end markers |
//! | [`docker`] | the intent-level [`Engine`](docker::Engine) trait and its bollard implementation |
//! | [`kernel`] | one kernel container: spawn, I/O task, cell execution, state enum |
//! | [`stdin`] | a kernel's stdin: frames written inline when the pipe takes them, else by a task |
//! | [`catalog`] | the durable owner catalog: live keys, generations, unreported losses |
//! | [`registry`] | which kernel serves which key; caps and fair shares, idle reaping, losses (pure bookkeeping) |
//! | [`authority`] | per-cell tool-call authority and the [`ToolDispatcher`] trait |
//! | [`monitor`] | engine events: tells OOM, outside kills and crashes apart |
//! | [`orchestrator`] | the front door: [`Orchestrator::execute`] and lifecycle verbs |
//! | [`adopt`] | work driven by its caller that a tracker adopts if the caller goes away |
//! | [`server`] | the multi-tenant HTTP API behind `kernelbox serve` |
//! | [`sweep`] | label sweeps: dead instances' leftovers, stale staging volumes |
//! | [`instance`] | this instance's identity and other instances' liveness |
//! | [`watchdog`] | the process that cleans up after an orchestrator that died |
//! | [`labels`] | the Docker labels kernelbox writes and reads |
//! | [`image`] | building the kernel image offline |
//!
//! The runner that executes cells inside each container is `runner/kernel_runner.py`
//! (standard library only), started by `runner/bootstrap.py` as `python3 -c`, so any image
//! with python3 >= 3.8 works.

pub mod adopt;
pub mod authority;
pub mod catalog;
pub mod cell;
pub mod config;
pub mod docker;
pub mod image;
pub mod instance;
pub mod kernel;
pub mod labels;
pub mod monitor;
pub mod orchestrator;
pub mod owner;
pub mod protocol;
pub mod registry;
pub mod server;
pub mod stdin;
pub mod sweep;
pub mod watchdog;

pub use authority::{CellAuthority, FnDispatcher, RawToolCall, ToolCall, ToolDispatcher};
pub use cell::{CellResult, CellStatus, KernelInfo, LossReason, StateLost};
pub use config::{Config, Sandbox, WorkMode};
pub use docker::{BollardEngine, Engine, EngineError};
pub use orchestrator::{
    AdmissionNotice, ExecuteError, ExecuteRequest, KernelSummary, Orchestrator, StartError,
};
pub use registry::{Cap, TenantLimits};
