//! Every domain error as the API answers it: its status, its stable `code` and, where the
//! caller may retry, its `Retry-After` (docs/http-api.md). The library's errors
//! name the failed operation; this is the one place they become HTTP answers.

use axum::http::StatusCode;

use super::ApiError;
use crate::config::InvalidTimeout;
use crate::files::TransferError;
use crate::orchestrator::{
    CommandError, ExecuteError, FileError, ProcessStartError, SnapshotError,
};
use crate::services::ProcessError;
use crate::settings::SettingsError;
use crate::workspace::WorkspaceError;

impl From<ExecuteError> for ApiError {
    fn from(e: ExecuteError) -> ApiError {
        match &e {
            ExecuteError::Invalid(_) => ApiError::bad_request(e.code(), e.to_string()),
            ExecuteError::InvalidTimeout(t) => t.clone().into(),
            ExecuteError::Name(_) => ApiError::bad_request(e.code(), e.to_string()),
            ExecuteError::Kernel(crate::kernel::KernelError::Workspace(w))
                if matches!(w, crate::workspace::WorkspaceError::TooMany { .. }) =>
            {
                ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.code(), w.to_string())
            }
            ExecuteError::Kernel(crate::kernel::KernelError::Workspace(w))
                if matches!(w, crate::workspace::WorkspaceError::HostFull { .. }) =>
            {
                ApiError::new(StatusCode::INSUFFICIENT_STORAGE, e.code(), w.to_string())
            }
            ExecuteError::Kernel(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                e.code(),
                format!("the kernel could not be started: {e}"),
            ),
            ExecuteError::Engine(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                e.code(),
                format!("docker engine: {e}"),
            ),
            ExecuteError::ShuttingDown => ApiError::shutting_down(),
            ExecuteError::TenantRemoved => ApiError::unauthorized(),
            ExecuteError::AtCapacity { .. } => ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.code(), e.to_string())
            },
            ExecuteError::SessionBusy { .. } => ApiError {
                retry_after: Some(1),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.code(), e.to_string())
            },
            ExecuteError::Internal(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.code(), e.to_string())
            }
        }
    }
}

impl From<CommandError> for ApiError {
    fn from(e: CommandError) -> ApiError {
        match e {
            CommandError::Invalid(_) => ApiError::bad_request("invalid_command", e.to_string()),
            CommandError::Execute(e) => e.into(),
            CommandError::TooMany { .. } => ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_commands",
                    e.to_string(),
                )
            },
            CommandError::NoKernel { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "no_kernel", e.to_string())
            }
            CommandError::Engine(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_unavailable",
                format!("docker engine: {e}"),
            ),
        }
    }
}

impl From<FileError> for ApiError {
    fn from(e: FileError) -> ApiError {
        match e {
            FileError::Transfer(e) => e.into(),
            FileError::NoKernel { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "no_kernel", e.to_string())
            }
            FileError::Execute(e) => e.into(),
            FileError::Workspace(e) => e.into(),
            e @ FileError::TooManyTransfers { .. } => ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_transfers",
                    e.to_string(),
                )
            },
        }
    }
}

impl From<TransferError> for ApiError {
    fn from(e: TransferError) -> ApiError {
        let message = e.to_string();
        match e {
            TransferError::InvalidPath { .. } => ApiError::bad_request("invalid_path", message),
            TransferError::Refused { code, .. } => ApiError::bad_request(code, message),
            TransferError::NotFound(_) => ApiError::not_found(message),
            TransferError::TooLarge { .. } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "file_too_large", message)
            }
            TransferError::NoSpace => {
                ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "no_space", message)
            }
            TransferError::Body(_) => ApiError::bad_request("invalid_body", message),
            TransferError::Stalled(_) | TransferError::TooSlow(_) => {
                ApiError::new(StatusCode::GATEWAY_TIMEOUT, "transfer_stalled", message)
            }
            TransferError::Engine(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_unavailable",
                message,
            ),
            TransferError::Helper(_) => {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "file_helper", message)
            }
        }
    }
}

impl From<InvalidTimeout> for ApiError {
    fn from(e: InvalidTimeout) -> ApiError {
        ApiError::bad_request("invalid_timeout", e.to_string())
    }
}

impl From<SnapshotError> for ApiError {
    fn from(e: SnapshotError) -> ApiError {
        let e = match e {
            // The orchestrator's refusal is answered as everywhere else (`at_capacity` a 429
            // with its retry, ...).
            SnapshotError::Refused { code, source } => {
                return match source.downcast::<crate::orchestrator::ExecuteError>() {
                    Ok(inner) => ApiError::from(*inner),
                    Err(other) => {
                        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, code, other.to_string())
                    }
                };
            }
            e => e,
        };
        let status = match &e {
            SnapshotError::NotFound { .. } | SnapshotError::NoKernel { .. } => {
                StatusCode::NOT_FOUND
            }
            SnapshotError::Limit { .. }
            | SnapshotError::Busy { .. }
            | SnapshotError::SessionExists { .. } => StatusCode::CONFLICT,
            SnapshotError::Invalid(_) => StatusCode::BAD_REQUEST,
            SnapshotError::Refused { .. }
            | SnapshotError::Checkpoint(_)
            | SnapshotError::Restore(_)
            | SnapshotError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

impl From<ProcessError> for ApiError {
    fn from(e: ProcessError) -> ApiError {
        let (status, code) = match &e {
            ProcessError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_process"),
            ProcessError::NotFound { .. } => (StatusCode::NOT_FOUND, "no_process"),
            ProcessError::TooMany { .. } => (StatusCode::TOO_MANY_REQUESTS, "too_many_processes"),
            ProcessError::TooManyReaders { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, "too_many_readers")
            }
            ProcessError::StdinClosed { .. } => (StatusCode::CONFLICT, "stdin_closed"),
            ProcessError::StdinStuck { .. } => (StatusCode::CONFLICT, "stdin_stuck"),
            ProcessError::StdinTooLarge { .. } => {
                (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
            }
            ProcessError::Starting { .. } => (StatusCode::CONFLICT, "process_starting"),
            ProcessError::Engine { .. } => (StatusCode::SERVICE_UNAVAILABLE, "engine_unavailable"),
        };
        let retry = matches!(
            e,
            ProcessError::TooMany { .. }
                | ProcessError::TooManyReaders { .. }
                | ProcessError::Starting { .. }
        );
        ApiError {
            retry_after: retry.then_some(1),
            ..ApiError::new(status, code, e.to_string())
        }
    }
}

impl From<ProcessStartError> for ApiError {
    fn from(e: ProcessStartError) -> ApiError {
        match e {
            ProcessStartError::Execute(e) => e.into(),
            ProcessStartError::NoKernel { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "no_kernel", e.to_string())
            }
            ProcessStartError::Process(e) => e.into(),
        }
    }
}

impl From<SettingsError> for ApiError {
    fn from(e: SettingsError) -> ApiError {
        let status = match e {
            SettingsError::TooMany { .. } => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

impl From<WorkspaceError> for ApiError {
    fn from(e: WorkspaceError) -> ApiError {
        match &e {
            WorkspaceError::NotFound { .. } | WorkspaceError::Disabled { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "workspace_not_found", e.to_string())
            }
            WorkspaceError::InUse { .. } | WorkspaceError::Starting { .. } => {
                ApiError::new(StatusCode::CONFLICT, "workspace_in_use", e.to_string())
            }
            WorkspaceError::TooMany { .. } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_workspaces",
                e.to_string(),
            ),
            WorkspaceError::HostFull { .. } => ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "workspaces_full",
                e.to_string(),
            ),
            WorkspaceError::Io { .. }
            | WorkspaceError::Tool { .. }
            | WorkspaceError::Engine(_)
            | WorkspaceError::NotOurs { .. }
            | WorkspaceError::Ledger { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "workspace_unavailable",
                e.to_string(),
            ),
        }
    }
}
