//! The body of `POST /v1/sessions/{session}/commands` (`docs/http-api.md`, "Commands") and its
//! answer: what the server parses, what the Rust clients send, and what `/openapi.json`
//! describes as `CommandRequest` and `CommandResult` (generated from these types).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest command (its arguments, or the shell string), in bytes.
pub const MAX_COMMAND_BYTES: usize = 256 * 1024;

/// Most environment variables a command may be given.
pub const MAX_COMMAND_ENV: usize = 256;

/// The program to run: an argument vector, or one string run by `/bin/sh -c`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum CommandLine {
    /// The program and its arguments, run as given (no shell).
    Argv(Vec<String>),
    /// A shell command line, run by `/bin/sh -c`.
    Shell(String),
}

impl Default for CommandLine {
    fn default() -> Self {
        CommandLine::Argv(Vec::new())
    }
}

impl CommandLine {
    /// The argument vector the kernel runs, or why there is none.
    pub fn argv(&self) -> Result<Vec<String>, String> {
        let argv = match self {
            CommandLine::Argv(argv) => argv.clone(),
            CommandLine::Shell(line) => vec!["/bin/sh".into(), "-c".into(), line.clone()],
        };
        if argv.first().is_none_or(|p| p.is_empty()) {
            return Err("`command` must name a program".into());
        }
        if argv.iter().any(|a| a.contains('\0')) {
            return Err("`command` must not contain NUL".into());
        }
        if argv.iter().map(String::len).sum::<usize>() > MAX_COMMAND_BYTES {
            return Err(format!(
                "`command` is longer than {MAX_COMMAND_BYTES} bytes"
            ));
        }
        Ok(argv)
    }
}

/// One command to run in the session's kernel container. Unknown fields are refused
/// (`invalid_json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "CommandRequest")]
pub struct CommandBody {
    /// An argument vector (`["ls", "-l"]`), or a string run by `/bin/sh -c`.
    pub command: CommandLine,
    /// Working directory, relative to the kernel's (`/work`) or absolute; default `/work`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Environment variables added to the kernel's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Text given to the command on its stdin (then end of file); none: end of file at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Seconds, as for an execute: any JSON value is read so that the server judges it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        schema_with = "timeout_schema",
        description = "Command timeout in seconds, at most the server's max_cell_timeout; absent or null: the server's cell timeout. Past it the command's process group is killed (the kernel stays). Anything else is 400 `invalid_timeout`."
    )]
    pub timeout: Option<Value>,
}

fn timeout_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": ["number", "null"], "exclusiveMinimum": 0})
}

/// What a command did (`docs/contract.md`, "Commands").
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CommandResult {
    /// The command's exit code; -1 when it was killed at its timeout or the engine could
    /// not tell.
    pub exit_code: i64,
    /// What it wrote on stdout (lossy UTF-8), cut as a cell's output is.
    pub stdout: String,
    /// What it wrote on stderr (lossy UTF-8), cut as a cell's output is.
    pub stderr: String,
    /// Wall time of the call, a kernel's start included.
    pub duration_seconds: f64,
    /// It ran past its timeout and its process group was killed.
    pub timed_out: bool,
    /// The stdout was cut (the first 40% and the last 60% of the cap kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_truncated: Option<bool>,
    /// Bytes written on stdout in all, when cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_bytes_total: Option<u64>,
    /// The stderr was cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_truncated: Option<bool>,
    /// Bytes written on stderr in all, when cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_bytes_total: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_command_is_an_argv_or_a_shell_string() {
        let body: CommandBody =
            serde_json::from_value(json!({"command": ["ls", "-l"]})).expect("parse");
        assert_eq!(body.command.argv().unwrap(), vec!["ls", "-l"]);
        let body: CommandBody =
            serde_json::from_value(json!({"command": "echo hi | wc -c"})).expect("parse");
        assert_eq!(
            body.command.argv().unwrap(),
            vec!["/bin/sh", "-c", "echo hi | wc -c"]
        );
        let empty: CommandBody = serde_json::from_value(json!({"command": []})).expect("parse");
        assert!(empty.command.argv().is_err());
        assert!(serde_json::from_value::<CommandBody>(json!({"command": "x", "y": 1})).is_err());
    }
}
