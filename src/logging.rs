//! Logs an operator can ship (`docs/logs.md`): the format (text or one JSON object per line),
//! the levels (an `EnvFilter` directive string), and the two targets of structured events an
//! operator reads: [`ACCESS_TARGET`] (one event per HTTP request, `server/api/access.rs`) and
//! [`LIFECYCLE_TARGET`] (a kernel started, restored, hibernated or lost, and why).
//!
//! | what | where |
//! |---|---|
//! | [`LogFormat`], [`init`] | the subscriber: format, levels, stderr |
//! | [`say`], [`say_at`] | a line a verb always prints (`serving ... on http://...`), as a JSON object in the JSON format |
//! | [`kernel_started`], [`kernel_restored`], [`kernel_hibernated`], [`kernel_ended`], [`kernel_lost`] | the lifecycle events, one home for their fields |

use std::io::Write as _;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

use crate::cell::LossReason;
use crate::owner::Owner;

/// The target of the access log: one `info` event per request, when its response ends.
pub const ACCESS_TARGET: &str = "kernelbox::access";

/// The target of kernels' lifecycle decisions.
pub const LIFECYCLE_TARGET: &str = "kernelbox::lifecycle";

/// The levels when none are given: warnings and errors.
pub const DEFAULT_LEVEL: &str = "warn";

/// What a server logs besides [`DEFAULT_LEVEL`] unless the directives given say otherwise: its
/// access log, the lifecycle events and its tenants' reloads (applied ones too), at `info`. A later directive for the same target wins
/// (`kernelbox::access=off` turns the access log off).
const SERVER_DIRECTIVES: &str =
    "kernelbox::access=info,kernelbox::lifecycle=info,kernelbox::server::reload=info";

/// The format [`init`] set, for [`say`].
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, the event's fields (its
    /// `message` among them) at the top level, and the request's `span` when in one.
    Json,
}

/// A log format's name is neither `text` nor `json`.
#[derive(Debug, thiserror::Error)]
#[error("unknown log format {0:?} (expected text or json)")]
pub struct UnknownFormat(String);

impl std::str::FromStr for LogFormat {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<LogFormat, UnknownFormat> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(UnknownFormat(other.to_string())),
        }
    }
}

/// Setting the log subscriber up failed.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    /// The level directives do not parse.
    #[error("log levels {directives:?} (--log-level / KERNELBOX_LOG): {error}")]
    Directives {
        /// What was given.
        directives: String,
        /// Why it does not parse.
        error: tracing_subscriber::filter::ParseError,
    },
    /// A subscriber was already set.
    #[error("setting the log subscriber: {0}")]
    Install(String),
}

/// The filter: [`DEFAULT_LEVEL`] unless `directives` (an `EnvFilter` string, e.g.
/// `warn,kernelbox::server=info`) are given; for a server, the access log and lifecycle events
/// at `info` first, so a directive naming their targets overrides them.
pub fn filter(directives: Option<&str>, server: bool) -> Result<EnvFilter, LoggingError> {
    let given = directives
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .unwrap_or(DEFAULT_LEVEL);
    let all = if server {
        format!("{SERVER_DIRECTIVES},{given}")
    } else {
        given.to_string()
    };
    EnvFilter::builder()
        .parse(&all)
        .map_err(|error| LoggingError::Directives {
            directives: given.to_string(),
            error,
        })
}

/// Installs the process's subscriber, writing to stderr in `format` at the levels `directives`
/// give ([`filter`]).
pub fn init(format: LogFormat, directives: Option<&str>, server: bool) -> Result<(), LoggingError> {
    let filter = filter(directives, server)?;
    let _ = FORMAT.set(format);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a terminal: a pipe or a file (a shipped log) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // A failed log write is dropped: reporting it uses `eprintln!`, which panics when
        // stderr is gone (a supervisor that closed the log pipe), mid-shutdown or mid-cleanup.
        .log_internal_errors(false);
    let installed = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init(),
    };
    installed.map_err(|e| LoggingError::Install(e.to_string()))
}

/// Writes `message` to stderr whatever the levels, as a line of its own in the text format or
/// an `info` object of `target` `kernelbox` in the JSON format, so a JSON log stays one object
/// per line. A failed write is ignored: `eprintln!` panics when stderr is gone (a supervisor
/// that closed the log pipe), and a server must still serve and stop on SIGTERM.
pub fn say(message: &str) {
    say_at(tracing::Level::INFO, message);
}

/// [`say`] at `level` (an error a verb ends with).
pub fn say_at(level: tracing::Level, message: &str) {
    let line = match FORMAT.get().copied().unwrap_or_default() {
        LogFormat::Text => format!("{message}\n"),
        LogFormat::Json => {
            let object = serde_json::json!({
                "timestamp": humantime::format_rfc3339_micros(std::time::SystemTime::now())
                    .to_string(),
                "level": level.as_str(),
                "message": message,
                "target": "kernelbox",
            });
            format!("{object}\n")
        }
    };
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// A kernel was started for `owner` (`how`: `cold`, or `pool` when a warm one was taken).
pub(crate) fn kernel_started(owner: &Owner, container: &str, generation: u64, how: &'static str) {
    tracing::info!(
        target: LIFECYCLE_TARGET,
        event = "started",
        tenant = %owner.tenant,
        session = %owner.session,
        owner = %owner,
        container,
        generation,
        how,
        "kernel started"
    );
}

/// `owner`'s hibernated kernel was restored (same generation, its state intact).
pub(crate) fn kernel_restored(owner: &Owner, container: &str, generation: u64) {
    tracing::info!(
        target: LIFECYCLE_TARGET,
        event = "restored",
        tenant = %owner.tenant,
        session = %owner.session,
        owner = %owner,
        container,
        generation,
        "kernel restored"
    );
}

/// `owner`'s idle kernel was checkpointed and its container stopped (`why`: `idle`,
/// `evicted`, `restart`).
pub(crate) fn kernel_hibernated(
    owner: &Owner,
    container: &str,
    generation: u64,
    why: &str,
    seconds: f64,
) {
    tracing::info!(
        target: LIFECYCLE_TARGET,
        event = "hibernated",
        tenant = %owner.tenant,
        session = %owner.session,
        owner = %owner,
        container,
        generation,
        reason = why,
        seconds,
        "kernel hibernated"
    );
}

/// `owner`'s kernel was removed on purpose (`why`: `cleared` by a `DELETE` of its session or
/// a drain, `reset`, `ended` after a one-shot call): no loss is owed.
pub(crate) fn kernel_ended(owner: &Owner, container: &str, generation: u64, why: &'static str) {
    tracing::info!(
        target: LIFECYCLE_TARGET,
        event = "ended",
        tenant = %owner.tenant,
        session = %owner.session,
        owner = %owner,
        container,
        generation,
        reason = why,
        "kernel ended"
    );
}

/// `owner`'s kernel (or its checkpoint) is gone with its state, for `reason`: what its next
/// call reports as `state_lost` (`docs/contract.md`).
pub(crate) fn kernel_lost(
    owner: &Owner,
    container: Option<&str>,
    generation: u64,
    reason: LossReason,
) {
    tracing::info!(
        target: LIFECYCLE_TARGET,
        event = "lost",
        tenant = %owner.tenant,
        session = %owner.session,
        owner = %owner,
        container,
        generation,
        reason = reason.as_str(),
        "kernel lost"
    );
}
