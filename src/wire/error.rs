//! The body of every error answer (`docs/http-api.md`, "Endpoints"): `{"error": {"code",
//! "message"}}`, with a stable machine-readable code and a message for people.

use serde::{Deserialize, Serialize};

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "Error")]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What went wrong: the code and the message of an [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `invalid_timeout`, `at_capacity`.
    pub code: String,
    /// Human-readable message.
    pub message: String,
}

impl ErrorBody {
    /// The error with `code` and `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: code.into(),
                message: message.into(),
            },
        }
    }
}
