//! The HTTP API as a client sees it (`docs/http-api.md`): the paths a request is sent to and
//! the bodies it carries, one type each, shared by the server that parses them, the Rust
//! client that writes them (`src/client/`) and the OpenAPI document that describes them.
//!
//! | file | what |
//! |---|---|
//! | `path.rs` | the routes' paths, with the one percent-encoder for names and file paths in a URL |
//! | `execute.rs` | [`ExecuteBody`]: the body of `POST /v1/sessions/{session}/execute` |
//! | `language.rs` | [`Language`] and [`Context`]: the language of a cell and the kernel of a session that runs it |
//! | `command.rs` | [`CommandBody`] and [`CommandResult`]: `POST /v1/sessions/{session}/commands` |
//! | `error.rs` | [`ErrorBody`]: every error answer, `{"error": {"code", "message"}}` |
//! | `event.rs` | [`StreamEvent`] and [`CommandEvent`]: the lines of a streamed execute or command, one type per event |
//! | `answer.rs` | the other JSON answers: counts, listings ([`KernelSummary`], [`WorkspaceSummary`]), deletions, [`NetworkApplied`], [`Health`], the cluster's admin answers |
//! | `admin.rs` | [`Identity`] (`GET /v1/whoami`), [`KernelPage`] and [`TenantOverview`]: the operator's answers (docs/console.md) |
//! | `usage.rs` | [`UsageQuery`] and [`UsageReport`]: `GET /v1/usage` |
//! | `network.rs` | [`NetworkPolicy`]: a network egress policy (tenants file, execute body, `PUT .../network`) |
//! | `snapshot.rs` | [`SnapshotBody`], [`SnapshotInfo`], [`RestoreBody`], [`ForkBody`], [`ForkResult`]: snapshots, restore and fork (`docs/snapshots.md`) |
//! | `process.rs` | [`ProcessBody`], [`ProcessInfo`], [`ProcessList`], [`SignalBody`], [`StdinWritten`]: background processes (`docs/processes.md`); their output's events are [`ProcessEvent`] |
//! | `settings.rs` | [`SessionSettings`], [`SettingsApplied`]: `PUT`/`GET /v1/sessions/{session}/settings` |
//! | `recent.rs` | [`SessionEvents`], [`AuditTail`], [`EgressRefusals`], [`RecentQuery`]: what happened lately, bounded (docs/console.md) |
//!
//! Every type the server answers with derives `schemars::JsonSchema`, and `src/server/openapi.rs`
//! generates the document's schemas from them. Three answers have their own home: a cell result
//! is [`CellResult`](crate::cell::CellResult), an upload's answer [`Written`](crate::files::Written),
//! a directory [`Listing`](crate::files::Listing).

mod admin;
mod answer;
mod command;
mod error;
mod event;
mod execute;
mod language;
mod network;
pub mod path;
mod process;
mod recent;
mod settings;
mod snapshot;
mod usage;

pub use admin::{
    Identity, KernelPage, KernelPageQuery, Role, TenantEntry, TenantOverview, DEFAULT_KERNEL_PAGE,
    MAX_KERNEL_PAGE, MAX_KERNEL_SEARCH,
};
pub use answer::{
    Cleared, ContextList, Deleted, Health, HealthStatus, Interrupted, KernelList, KernelSummary,
    NetworkApplied, NodeDrain, NodeEntry, NodeKernels, NodeList, NodeStatus, Released,
    WorkspaceList, WorkspaceSummary,
};
pub use command::{CommandBody, CommandLine, CommandResult, MAX_COMMAND_BYTES, MAX_COMMAND_ENV};
pub use error::{ErrorBody, ErrorDetail};
pub use event::{
    CellResultEvent, CommandEvent, CommandResultEvent, DisplayEvent, ErrorEvent, EventName,
    OutputEvent, OutputTruncatedEvent, ProcessEvent, ProcessExitEvent, StderrEvent, StdoutEvent,
    StreamEvent, EVENT_FIELD,
};
pub use execute::{ExecuteBody, MAX_TASK_ID};
pub use language::{Context, Language, UnsupportedLanguage};
pub use network::NetworkPolicy;
pub use process::{ProcessBody, ProcessInfo, ProcessList, SignalBody, StdinWritten, SIGNALS};
pub use recent::{
    AuditTail, EgressRefusal, EgressRefusals, KernelEvent, LifecycleKind, RecentQuery,
    RecentSessions, SessionEvents, DEFAULT_RECENT, MAX_RECENT,
};
pub use settings::{SessionSettings, SettingsApplied};
pub use snapshot::{
    ForkBody, ForkOutcome, ForkResult, RestoreBody, RestoredKernel, SnapshotBody, SnapshotInfo,
    SnapshotList, MAX_SNAPSHOT_NAME,
};
pub use usage::{UsageQuery, UsageQueryError, UsageRange, UsageReport, MAX_USAGE_RANGE};
