//! The HTTP API as a client sees it (`docs/http-api.md`): the paths a request is sent to and
//! the bodies it carries, one type each, shared by the server that parses them, the Rust
//! client that writes them (`src/client/`) and the OpenAPI document that describes them.
//!
//! | file | what |
//! |---|---|
//! | `path.rs` | the routes' paths, with the one percent-encoder for names and file paths in a URL |
//! | `execute.rs` | [`ExecuteBody`]: the body of `POST /v1/sessions/{session}/execute` |
//! | `command.rs` | [`CommandBody`] and [`CommandResult`]: `POST /v1/sessions/{session}/commands` |
//! | `error.rs` | [`ErrorBody`]: every error answer, `{"error": {"code", "message"}}` |
//! | `usage.rs` | [`UsageQuery`] and [`UsageReport`]: `GET /v1/usage` |
//! | `network.rs` | [`NetworkPolicy`]: a network egress policy (tenants file, execute body, `PUT .../network`) |
//! | `settings.rs` | [`SessionSettings`], [`SettingsApplied`]: `PUT`/`GET /v1/sessions/{session}/settings` |
//!
//! What the server answers besides errors has its own home: a cell result is
//! [`CellResult`](crate::cell::CellResult), an upload's answer [`Written`](crate::files::Written),
//! a directory [`Listing`](crate::files::Listing).

mod command;
mod error;
mod execute;
mod network;
pub mod path;
mod settings;
mod usage;

pub use command::{CommandBody, CommandLine, CommandResult, MAX_COMMAND_BYTES, MAX_COMMAND_ENV};
pub use error::{ErrorBody, ErrorDetail};
pub use execute::{ExecuteBody, MAX_TASK_ID};
pub use network::NetworkPolicy;
pub use settings::{SessionSettings, SettingsApplied};
pub use usage::{UsageQuery, UsageQueryError, UsageRange, UsageReport, MAX_USAGE_RANGE};
