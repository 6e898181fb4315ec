//! Background processes (`docs/processes.md`): the body of
//! `POST /v1/sessions/{session}/processes`, what a process is (`ProcessInfo`), a list of them,
//! the signal body, and what a stdin write answers. The events of a process's output stream
//! are in `event.rs` ([`ProcessEvent`](super::ProcessEvent)).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::command::CommandLine;

/// A background process to start in the session's kernel container. Unknown fields are
/// refused (`invalid_json`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "ProcessRequest")]
pub struct ProcessBody {
    /// An argument vector (`["python3", "-m", "http.server"]`), or a string run by
    /// `/bin/sh -c`.
    pub command: CommandLine,
    /// Working directory, relative to the kernel's (`/work`) or absolute; default `/work`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Environment variables added to the kernel's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// True: its stdin stays open for `POST .../stdin` until `DELETE .../stdin`; false (the
    /// default): end of file at once.
    #[serde(default)]
    pub stdin: bool,
}

/// A background process (`docs/processes.md`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcessInfo {
    /// Its id in the session (1, 2, ... counted per session, so no session sees another's
    /// starts; not reused until the session is cleared).
    pub id: u64,
    /// The process id of its leader inside the container, once known (the command is the
    /// leader's child, in its own process group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The argument vector it runs.
    pub command: Vec<String>,
    /// Its working directory, as asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// When it started, RFC 3339.
    pub started_at: String,
    /// True until its output ended (it and everything holding its output are gone).
    pub running: bool,
    /// Its exit code once it ended (128 + the signal when a signal ended it); -1 when the
    /// engine could not tell (the kernel went with it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// True while its stdin is open.
    pub stdin_open: bool,
    /// Bytes it wrote on stdout and stderr in all.
    pub output_bytes: u64,
}

/// The session's background processes, running and recently ended, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcessList {
    /// The processes.
    pub processes: Vec<ProcessInfo>,
}

/// A signal for a background process's command. Unknown fields are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    /// Its name: `SIGTERM`, `SIGKILL`, `SIGINT`, `SIGHUP`, `SIGQUIT`, `SIGUSR1`, `SIGUSR2`,
    /// `SIGSTOP` or `SIGCONT` (the `SIG` may be left out).
    pub signal: String,
}

/// The signals a process may be sent, with their numbers (Linux).
pub const SIGNALS: [(&str, i32); 9] = [
    ("SIGHUP", 1),
    ("SIGINT", 2),
    ("SIGQUIT", 3),
    ("SIGKILL", 9),
    ("SIGUSR1", 10),
    ("SIGUSR2", 12),
    ("SIGTERM", 15),
    ("SIGCONT", 18),
    ("SIGSTOP", 19),
];

impl SignalBody {
    /// The signal's number, or why it is not one a process may be sent.
    pub fn number(&self) -> Result<i32, String> {
        let name = self.signal.trim().to_ascii_uppercase();
        let name = if name.starts_with("SIG") {
            name
        } else {
            format!("SIG{name}")
        };
        SIGNALS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, number)| *number)
            .ok_or_else(|| {
                format!(
                    "signal {:?} is not one of {}",
                    self.signal,
                    SIGNALS.map(|(n, _)| n).join(", ")
                )
            })
    }
}

/// What a stdin write did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StdinWritten {
    /// Bytes written to the process's stdin.
    pub written: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn signals_are_named_with_or_without_sig() {
        let number = |s: &str| {
            SignalBody {
                signal: s.to_string(),
            }
            .number()
        };
        assert_eq!(number("SIGTERM"), Ok(15));
        assert_eq!(number("kill"), Ok(9));
        assert!(number("SIGSEGV").unwrap_err().contains("not one of SIGHUP"));
        let body: ProcessBody =
            serde_json::from_value(json!({"command": "sleep 1", "stdin": true})).expect("parse");
        assert!(body.stdin);
        assert!(serde_json::from_value::<ProcessBody>(json!({"command": "x", "y": 1})).is_err());
    }
}
