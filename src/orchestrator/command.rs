//! A shell command in an owner's kernel container (`docs/contract.md`, "Commands"): the
//! kernel held (started when the owner has none, as an upload would: the registry's caps and
//! fair shares apply), at most [`MAX_COMMANDS_PER_SESSION`] commands of one kernel at once,
//! run beside its cells (`src/kernel/command.rs`), adopted by the tracker if the caller goes
//! away so that its timeout still kills what it started.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{ExecuteError, FileError, FileRequest, Orchestrator, Scope};
use crate::config::Config;
use crate::config::MAX_COMMANDS_PER_SESSION;
use crate::docker::EngineError;
use crate::kernel::{CommandSink, CommandSpec};
use crate::owner::Owner;
use crate::wire::{CommandBody, CommandResult, MAX_COMMAND_ENV};

/// One command to run in an owner's kernel container.
#[derive(Clone, Default)]
pub struct CommandRequest {
    /// Whose kernel (started as an execute would start it when the owner has none).
    pub scope: Scope,
    /// The program and its arguments (a shell line is `["/bin/sh", "-c", line]`).
    pub argv: Vec<String>,
    /// Working directory: relative to the kernel's, or absolute; default the kernel's.
    pub cwd: Option<String>,
    /// Environment variables added to the kernel's.
    pub env: BTreeMap<String, String>,
    /// Given on its stdin, then end of file.
    pub stdin: Bytes,
    /// Past this its process group is killed; default the configured cell timeout, bounded
    /// as a cell's.
    pub timeout: Option<Duration>,
    /// Receives its output live (for streaming).
    pub sink: Option<CommandSink>,
}

impl std::fmt::Debug for CommandRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandRequest")
            .field("scope", &self.scope)
            .field("argv", &self.argv)
            .field("cwd", &self.cwd)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl CommandRequest {
    /// A command for the kernel `scope` names.
    pub fn new(scope: impl Into<Scope>, argv: Vec<String>) -> CommandRequest {
        CommandRequest {
            scope: scope.into(),
            argv,
            ..CommandRequest::default()
        }
    }
}

impl CommandRequest {
    /// The request a command body makes for the kernel `scope` names (`docs/http-api.md`,
    /// "Commands"): the same rules on the server, in `kernelbox sh` and in MCP's
    /// `run_command`. The timeout is judged against `config` as an execute's is.
    pub fn from_body(
        scope: impl Into<Scope>,
        body: CommandBody,
        config: &Config,
    ) -> Result<CommandRequest, CommandError> {
        let timeout = match body.timeout {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Number(n)) => Some(
                n.as_f64()
                    .ok_or_else(|| config.invalid_timeout(&n))
                    .and_then(|s| config.cell_timeout_from_secs(s))
                    .map_err(ExecuteError::InvalidTimeout)?,
            ),
            Some(other) => {
                return Err(ExecuteError::InvalidTimeout(config.invalid_timeout(other)).into())
            }
        };
        let argv = body.command.argv().map_err(CommandError::Invalid)?;
        Ok(CommandRequest {
            scope: scope.into(),
            argv,
            cwd: body.cwd,
            env: body.env,
            stdin: body.stdin.map(Bytes::from).unwrap_or_default(),
            timeout,
            sink: None,
        })
    }
}

/// A command that could not run.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The request itself is wrong (an empty program, a bad environment variable).
    #[error("invalid command: {0}")]
    Invalid(String),
    /// Getting the kernel failed (names, timeout, caps, shutdown, spawn).
    #[error(transparent)]
    Execute(#[from] ExecuteError),
    /// The session's kernel already runs [`MAX_COMMANDS_PER_SESSION`] commands.
    #[error(
        "session {owner:?} already runs {max} commands, the most allowed; retry when one has ended"
    )]
    TooMany {
        /// Whose kernel.
        owner: String,
        /// The limit.
        max: usize,
    },
    /// The kernel went (cleared, evicted, died) before the command could start.
    #[error("{owner} has no live kernel to run the command in")]
    NoKernel {
        /// Whose kernel.
        owner: String,
    },
    /// The engine failed to start the command.
    #[error("running the command: {0}")]
    Engine(#[from] EngineError),
}

/// Commands running per kernel owner, under [`MAX_COMMANDS_PER_SESSION`].
#[derive(Debug, Default)]
pub(super) struct CommandCounts(Mutex<HashMap<Owner, usize>>);

/// One running command's place in [`CommandCounts`], given back when dropped.
struct CommandSlot {
    counts: Arc<CommandCounts>,
    owner: Owner,
}

impl CommandCounts {
    fn take(self: &Arc<Self>, owner: &Owner) -> Option<CommandSlot> {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(owner.clone()).or_default();
        if *n >= MAX_COMMANDS_PER_SESSION {
            return None;
        }
        *n += 1;
        Some(CommandSlot {
            counts: self.clone(),
            owner: owner.clone(),
        })
    }
}

impl Drop for CommandSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.owner);
            }
        }
    }
}

/// Checks a command's environment: names non-empty without `=` or NUL, values without NUL.
pub(super) fn env_entries(env: &BTreeMap<String, String>) -> Result<Vec<String>, CommandError> {
    if env.len() > MAX_COMMAND_ENV {
        return Err(CommandError::Invalid(format!(
            "at most {MAX_COMMAND_ENV} environment variables"
        )));
    }
    env.iter()
        .map(|(k, v)| {
            if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                Err(CommandError::Invalid(format!(
                    "environment variable {k:?}: a name must be non-empty without '=' or NUL, a value without NUL"
                )))
            } else {
                Ok(format!("{k}={v}"))
            }
        })
        .collect()
}

impl Orchestrator {
    /// Runs a command in the owner's kernel container, starting the kernel when it has none
    /// (`docs/contract.md`, "Commands"). It runs to its end or its timeout even if the
    /// returned future is dropped.
    pub async fn run_command(
        &self,
        request: CommandRequest,
    ) -> Result<CommandResult, CommandError> {
        let started = Instant::now();
        let config = &self.inner.config;
        let (owner, timeout, env) = checked(config, &request)?;
        let slot = self
            .inner
            .commands
            .take(&owner)
            .ok_or_else(|| CommandError::TooMany {
                owner: owner.to_string(),
                max: MAX_COMMANDS_PER_SESSION,
            })?;
        let files = FileRequest::new(request.scope.clone());
        let hold = match super::files::Hold::or_start(self, &files, &owner).await {
            Ok(hold) => hold,
            Err(FileError::Execute(e)) => return Err(e.into()),
            Err(_) => {
                return Err(CommandError::NoKernel {
                    owner: owner.to_string(),
                })
            }
        };
        let kernel = hold.kernel().map_err(|_| CommandError::NoKernel {
            owner: owner.to_string(),
        })?;
        let (kernel_id, generation) = (kernel.short_id().to_string(), hold.generation());
        let audited = crate::audit::AuditRecord::command_code(&request.argv);
        let spec = CommandSpec {
            argv: request.argv,
            cwd: request.cwd,
            env,
            stdin: request.stdin,
            timeout,
            caps: config.cells.output,
            sink: request.sink,
        };
        let ran = super::adopt::run_adopted(&self.inner.tasks.tracker, async move {
            let ran = kernel.run_command(spec).await;
            drop((hold, slot));
            ran
        })
        .await
        .unwrap_or_else(|panic| {
            Err(EngineError::Other {
                op: "command",
                target: owner.to_string(),
                message: format!("the command task failed: {panic}"),
            })
        });
        let mut result = ran?;
        result.duration_seconds = started.elapsed().as_secs_f64();
        account(self, &owner, &audited, &kernel_id, generation, &result);
        Ok(result)
    }
}

/// A command that ran, in the usage ledger and the audit trail.
fn account(
    orchestrator: &Orchestrator,
    owner: &Owner,
    audited: &str,
    kernel_id: &str,
    generation: u64,
    result: &CommandResult,
) {
    orchestrator
        .inner
        .services
        .usage
        .pending()
        .record(&owner.tenant, &owner.session, |r| r.commands += 1);
    orchestrator
        .inner
        .services
        .audit
        .record(crate::services::Ran {
            kind: crate::audit::AuditKind::Command,
            owner,
            code: audited,
            kernel: kernel_id,
            generation,
            duration_seconds: result.duration_seconds,
            status: match (result.timed_out, result.exit_code) {
                (true, _) => "timeout",
                (false, 0) => "success",
                _ => "error",
            },
            exit_code: Some(result.exit_code),
        });
}

/// A command request checked before any kernel is held: its owner, its timeout within the
/// server's bounds, a program named, a usable `cwd`, its environment as entries.
fn checked(
    config: &Config,
    request: &CommandRequest,
) -> Result<(Owner, Duration, Vec<String>), CommandError> {
    let owner = request.scope.owner(config).map_err(ExecuteError::Name)?;
    let timeout = config
        .check_cell_timeout(request.timeout.unwrap_or(config.cells.timeout))
        .map_err(ExecuteError::InvalidTimeout)?;
    if request.argv.first().is_none_or(|p| p.is_empty()) {
        return Err(CommandError::Invalid("the command names no program".into()));
    }
    if request
        .cwd
        .as_deref()
        .is_some_and(|c| c.is_empty() || c.contains('\0'))
    {
        return Err(CommandError::Invalid(
            "`cwd` must be a non-empty path without NUL".into(),
        ));
    }
    Ok((owner, timeout, env_entries(&request.env)?))
}
