//! The body of `POST /v1/sessions/{session}/execute` (`docs/http-api.md`, "Endpoints"): what
//! the server parses, what the Rust clients send, and what `/openapi.json` describes as
//! `ExecuteRequest` (generated from this type).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest `task_id` accepted, in bytes.
pub const MAX_TASK_ID: usize = 256;

/// One cell to run. Unknown fields are refused (`invalid_json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ExecuteRequest")]
pub struct ExecuteBody {
    /// Source of the cell, in `language`.
    pub code: String,
    /// The cell's language (`python` when absent): it runs in the session's kernel of that
    /// language (`docs/contract.md`, "Languages").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<super::Language>,
    /// A named context of the session (E2B-style code contexts): its own kernel of
    /// `language`, apart from the language's default one (`docs/contract.md`, "Languages").
    /// Absent: the language's default context, named by the language.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Discard the kernel and run in a fresh one.
    #[serde(default)]
    pub reset: bool,
    /// Seconds. Any JSON value is read, so that the server judges it: a number in
    /// (0, max_cell_timeout], or null for the default; anything else is answered
    /// `invalid_timeout` with its message (`docs/http-api.md`), never a parse error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        schema_with = "timeout_schema",
        description = "Cell timeout in seconds, at most the server's max_cell_timeout (3600 by default); absent or null: the server default. Anything else is 400 `invalid_timeout`."
    )]
    pub timeout: Option<Value>,
    /// The turn; passed to tool calls, never keys a kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_TASK_ID))]
    pub task_id: Option<String>,
    /// Delegated child making the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child: Option<String>,
    /// Tools the cell may call; a subset of the tenant's allow-list (all of it when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// The session's network egress policy, within the tenant's (`docs/reliability.md`,
    /// "Network egress"); it stays the session's until changed. Absent: unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<super::NetworkPolicy>,
}

/// What `timeout` should be, whatever is read: a number of seconds above 0, or null.
fn timeout_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": ["number", "null"], "exclusiveMinimum": 0})
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_body_round_trips_and_absent_fields_stay_absent() {
        let body = ExecuteBody {
            code: "1".into(),
            timeout: Some(json!(2.5)),
            child: Some("c".into()),
            ..ExecuteBody::default()
        };
        let text = serde_json::to_value(&body).expect("serialise");
        assert_eq!(
            text,
            json!({"code": "1", "reset": false, "timeout": 2.5, "child": "c"})
        );
        assert_eq!(
            serde_json::from_value::<ExecuteBody>(text).expect("parse"),
            body
        );
    }

    #[test]
    fn any_timeout_is_read_and_unknown_fields_are_refused() {
        let body: ExecuteBody =
            serde_json::from_value(json!({"code": "", "timeout": "abc"})).expect("parse");
        assert_eq!(body.timeout, Some(json!("abc")));
        let body: ExecuteBody =
            serde_json::from_value(json!({"code": "", "timeout": null})).expect("parse");
        assert_eq!(body.timeout, None);
        assert!(serde_json::from_value::<ExecuteBody>(json!({"code": "", "x": 1})).is_err());
    }
}
