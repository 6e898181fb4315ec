//! How a call to a server fails ([`ClientError`], by the step that failed), the one reader of
//! the server's error JSON (`{"error": {"code", "message"}}`, `docs/http-api.md`), and a call
//! under a deadline ([`within`]).
//!
//! Messages name the step and carry the cause in their text, as `kernelbox cp`,
//! `kernelbox exec --url` and `kernelbox mcp --url` print them.

use std::time::Duration;

use hyper::StatusCode;

use crate::wire::ErrorBody;

/// A call to a kernelbox server that failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request could not be made: the server's URL is not one.
    #[error("bad server URL {uri:?}: {error}")]
    BadUrl {
        /// The URL the request was for.
        uri: String,
        /// Why it is not one.
        error: hyper::http::Error,
    },
    /// The request body could not be written as JSON.
    #[error("writing the request: {0}")]
    Encode(serde_json::Error),
    /// Connecting to the server or sending the request failed.
    #[error("cannot reach the kernelbox server at {base}: {error}")]
    Unreachable {
        /// The server's base URL.
        base: String,
        /// What the connection said.
        error: hyper_util::client::legacy::Error,
    },
    /// The server refused the request; `message` is the one of its error JSON.
    #[error("server answered {status}: {message}")]
    Refused {
        /// The answer's status (4xx, 5xx).
        status: StatusCode,
        /// The server's message, or `request failed` when the answer carried none.
        message: String,
    },
    /// The answer broke off (or passed the size read) while it was read: a JSON answer, or
    /// the bytes of a download.
    #[error("reading the server's answer: {0}")]
    Read(Box<dyn std::error::Error + Send + Sync>),
    /// A successful answer is not JSON.
    #[error("the server answered {status} with something that is not JSON")]
    NotJson {
        /// The answer's status.
        status: StatusCode,
    },
    /// A successful answer is JSON, but not what the call returns.
    #[error("the server answered {status} with JSON that is not {what}: {error}")]
    Unexpected {
        /// The answer's status.
        status: StatusCode,
        /// What was expected, e.g. `a cell result`.
        what: &'static str,
        /// Where it differs.
        error: serde_json::Error,
    },
    /// The call took longer than its deadline and was abandoned.
    #[error("the server did not answer within {}", humantime::format_duration(*.0))]
    Deadline(Duration),
}

impl ClientError {
    /// The refusal an unsuccessful answer carries: the message of the server's error JSON
    /// (`ErrorBody`), or `request failed` when the body is not one (a proxy's page, nothing).
    pub(super) fn refused(status: StatusCode, body: &[u8]) -> ClientError {
        let message = serde_json::from_slice::<ErrorBody>(body)
            .map(|body| body.error.message)
            .unwrap_or_else(|_| "request failed".to_string());
        ClientError::Refused { status, message }
    }

    /// A successful answer that `serde_json` could not read as `what`.
    pub(super) fn decode(
        status: StatusCode,
        what: &'static str,
        error: serde_json::Error,
    ) -> ClientError {
        if error.is_data() {
            ClientError::Unexpected {
                status,
                what,
                error,
            }
        } else {
            ClientError::NotJson { status }
        }
    }
}

/// `call`, abandoned (dropped, which closes its connection) when it takes longer than
/// `deadline`.
pub async fn within<T>(
    deadline: Duration,
    call: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    tokio::time::timeout(deadline, call)
        .await
        .unwrap_or(Err(ClientError::Deadline(deadline)))
}
