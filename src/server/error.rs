//! API errors: `{"error": {"code", "message"}}` with the matching status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::config::InvalidTimeout;
use crate::files::TransferError;
use crate::orchestrator::FileError;
use crate::orchestrator::{CommandError, ExecuteError};
use crate::wire::ErrorBody;

/// An error response.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// An error with a status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400 with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 401 `unauthorized`: no bearer token, or one no tenant has.
    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid `Authorization: Bearer TOKEN` header is required",
        )
    }

    /// 404 `not_found`, saying what was not found.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 503 while the server drains for shutdown.
    pub fn shutting_down() -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "kernelbox is shutting down",
            )
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody::new(self.code, self.message.clone())
    }
}

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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"kernelbox\""),
            );
        }
        response
    }
}
