//! A background process started on an owner's kernel (`docs/processes.md`): the request
//! checked as a command's is, the kernel held (started when the owner has none, as a
//! command's), then handed to the processes service (`services/processes/`), which owns the
//! process from then on; its other verbs are the service's ([`Orchestrator::processes`]).

use std::collections::BTreeMap;

use super::command::env_entries;
use super::{CommandError, ExecuteError, FileError, FileRequest, Orchestrator, Scope};
use crate::kernel::ProcessSpec;
use crate::owner::Owner;
use crate::services::{ProcessError, Processes};
use crate::wire::{ProcessBody, ProcessInfo};

/// A background process to start in an owner's kernel container.
#[derive(Debug, Clone, Default)]
pub struct ProcessRequest {
    /// Whose kernel (started as an execute would start it when the owner has none).
    pub scope: Scope,
    /// The program and its arguments (a shell line is `["/bin/sh", "-c", line]`).
    pub argv: Vec<String>,
    /// Working directory: relative to the kernel's, or absolute; default the kernel's.
    pub cwd: Option<String>,
    /// Environment variables added to the kernel's.
    pub env: BTreeMap<String, String>,
    /// True: its stdin stays open for writes until closed.
    pub stdin: bool,
}

impl ProcessRequest {
    /// The request a process body makes for the kernel `scope` names: the command's rules.
    pub fn from_body(
        scope: impl Into<Scope>,
        body: ProcessBody,
    ) -> Result<ProcessRequest, ProcessStartError> {
        let argv = body
            .command
            .argv()
            .map_err(|e| ProcessStartError::Process(ProcessError::Invalid(e)))?;
        Ok(ProcessRequest {
            scope: scope.into(),
            argv,
            cwd: body.cwd,
            env: body.env,
            stdin: body.stdin,
        })
    }
}

/// A background process that could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProcessStartError {
    /// Getting the kernel failed (names, caps, shutdown, spawn).
    #[error(transparent)]
    Execute(#[from] ExecuteError),
    /// The kernel went (cleared, evicted, died) before the process could start.
    #[error("{owner} has no live kernel to run the process in")]
    NoKernel {
        /// Whose kernel.
        owner: String,
    },
    /// The request or the service refused it, or the engine failed.
    #[error(transparent)]
    Process(#[from] ProcessError),
}

impl Orchestrator {
    /// The background processes (`docs/processes.md`): listing, output, stdin, signals, kill.
    pub(crate) fn processes(&self) -> &Processes {
        &self.inner.services.processes
    }

    /// Whose kernel `scope` names, as every verb judges it.
    pub(crate) fn owner_of_scope(&self, scope: &Scope) -> Result<Owner, ExecuteError> {
        scope.owner(&self.inner.config).map_err(ExecuteError::Name)
    }

    /// Starts a background process in the owner's kernel container, starting the kernel when
    /// it has none.
    pub async fn start_process(
        &self,
        request: ProcessRequest,
    ) -> Result<ProcessInfo, ProcessStartError> {
        let owner = self.owner_of_scope(&request.scope)?;
        if request
            .cwd
            .as_deref()
            .is_some_and(|c| c.is_empty() || c.contains('\0'))
        {
            return Err(
                ProcessError::Invalid("`cwd` must be a non-empty path without NUL".into()).into(),
            );
        }
        let env = env_entries(&request.env).map_err(|e| match e {
            CommandError::Invalid(message) => ProcessError::Invalid(message),
            other => ProcessError::Invalid(other.to_string()),
        })?;
        let files = FileRequest::new(request.scope.clone());
        let hold = match super::files::Hold::or_start(self, &files, &owner).await {
            Ok(hold) => hold,
            Err(FileError::Execute(e)) => return Err(e.into()),
            Err(_) => {
                return Err(ProcessStartError::NoKernel {
                    owner: owner.to_string(),
                })
            }
        };
        let kernel = hold.kernel().map_err(|_| ProcessStartError::NoKernel {
            owner: owner.to_string(),
        })?;
        let spec = ProcessSpec {
            argv: request.argv,
            cwd: request.cwd,
            env,
            stdin_open: request.stdin,
        };
        let info = self.processes().start(&owner, kernel, spec).await?;
        drop(hold);
        Ok(info)
    }
}
