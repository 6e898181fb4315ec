//! The events of a streamed execute or command (`Accept: application/x-ndjson`,
//! `docs/http-api.md`): one JSON object a line, its `event` first. Each event is a type of its
//! own, named in the OpenAPI document; [`StreamEvent`] and [`CommandEvent`] are the unions a
//! stream's lines belong to, described as a `oneOf` of those names with a discriminator on
//! `event`, which client generators parse.
//!
//! The events borrow what they carry: a stream serializes each one once, as it queues its line.

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::Serialize;

use super::command::CommandResult;
use super::error::ErrorDetail;
use crate::cell::{CellResult, OutputStream};
use crate::rich::RichResult;

/// The field every event names itself in.
pub const EVENT_FIELD: &str = "event";

/// An event's name: a constant string, serialized as itself and described as a `const`.
pub trait EventName {
    /// The value of the event's `event` field.
    const NAME: &'static str;
}

macro_rules! event_tag {
    ($(#[$doc:meta])* $tag:ident = $name:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct $tag;

        impl EventName for $tag {
            const NAME: &'static str = $name;
        }

        impl Serialize for $tag {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str($name)
            }
        }

        impl JsonSchema for $tag {
            fn inline_schema() -> bool {
                true
            }
            fn schema_name() -> Cow<'static, str> {
                stringify!($tag).into()
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({"type": "string", "const": $name})
            }
        }
    };
}

event_tag!(
    /// `"output"`.
    OutputTag = "output"
);
event_tag!(
    /// `"display"`.
    DisplayTag = "display"
);
event_tag!(
    /// `"output_truncated"`.
    TruncatedTag = "output_truncated"
);
event_tag!(
    /// `"result"`.
    ResultTag = "result"
);
event_tag!(
    /// `"error"`.
    ErrorTag = "error"
);
event_tag!(
    /// `"stdout"`.
    StdoutTag = "stdout"
);
event_tag!(
    /// `"stderr"`.
    StderrTag = "stderr"
);
event_tag!(
    /// `"exit"`.
    ExitTag = "exit"
);

/// A background process ended (`docs/processes.md`): the last event of its output stream.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ProcessExitEvent {
    /// `exit`.
    pub event: ExitTag,
    /// Its exit code (128 + the signal when a signal ended it); -1 when the engine could not
    /// tell (the kernel went with it).
    pub exit_code: i64,
}

/// A line of a background process's output stream (`GET .../processes/{id}/output`):
/// `stdout` and `stderr` events (what is kept of its output first, then live), an
/// `output_truncated` before output the stream could not give (dropped from the kept
/// output before it was read), and `exit` last once the process ended.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum ProcessEvent<'a> {
    /// See [`StdoutEvent`].
    Stdout(StdoutEvent<'a>),
    /// See [`StderrEvent`].
    Stderr(StderrEvent<'a>),
    /// See [`OutputTruncatedEvent`].
    OutputTruncated(OutputTruncatedEvent),
    /// See [`ProcessExitEvent`].
    Exit(ProcessExitEvent),
}

impl ProcessEvent<'_> {
    /// A `stdout` event.
    pub fn stdout(data: &str) -> ProcessEvent<'_> {
        ProcessEvent::Stdout(StdoutEvent {
            event: StdoutTag,
            data,
        })
    }

    /// A `stderr` event.
    pub fn stderr(data: &str) -> ProcessEvent<'_> {
        ProcessEvent::Stderr(StderrEvent {
            event: StderrTag,
            data,
        })
    }

    /// An `output_truncated` event.
    pub fn truncated(bytes: u64) -> Self {
        ProcessEvent::OutputTruncated(OutputTruncatedEvent {
            event: TruncatedTag,
            bytes,
        })
    }

    /// The `exit` event.
    pub fn exit(exit_code: i64) -> Self {
        ProcessEvent::Exit(ProcessExitEvent {
            event: ExitTag,
            exit_code,
        })
    }
}

impl JsonSchema for ProcessEvent<'_> {
    fn schema_name() -> Cow<'static, str> {
        "ProcessEvent".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        union(
            "A line of a background process's output stream: `stdout` and `stderr` events (what is kept first, then live), `output_truncated` before output dropped unread, `exit` last once it ended.",
            vec![
                (StdoutTag::NAME, generator.subschema_for::<StdoutEvent>()),
                (StderrTag::NAME, generator.subschema_for::<StderrEvent>()),
                (
                    TruncatedTag::NAME,
                    generator.subschema_for::<OutputTruncatedEvent>(),
                ),
                (ExitTag::NAME, generator.subschema_for::<ProcessExitEvent>()),
            ],
        )
    }
}

/// Text the cell wrote, whole UTF-8, in write order (stdout, stderr and a traceback
/// interleaved as they came; `stream` says which each event is: docs/contract.md, "stdout and
/// stderr").
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct OutputEvent<'a> {
    /// `output`.
    pub event: OutputTag,
    /// The text.
    pub data: &'a str,
    /// The stream it came on: `stdout`, `stderr`, or `traceback` (a raised cell's traceback,
    /// in neither).
    pub stream: OutputStream,
}

/// A rich result the cell displayed (a MIME bundle), in order with its output.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct DisplayEvent<'a> {
    /// `display`.
    pub event: DisplayTag,
    /// The bundle, as in the result's `results`.
    pub data: &'a RichResult,
}

/// Output the client did not read in time, dropped (the run never waits for a reader); sent
/// once, before the last event.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct OutputTruncatedEvent {
    /// `output_truncated`.
    pub event: TruncatedTag,
    /// Bytes of output dropped.
    pub bytes: u64,
}

/// The cell's result: the last event of a streamed execute that ran.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CellResultEvent<'a> {
    /// `result`.
    pub event: ResultTag,
    /// The result, as the JSON answer carries it.
    pub result: &'a CellResult,
}

/// The error the call ended with instead of a result (what a JSON answer would carry in its
/// `error`): the last event.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorEvent<'a> {
    /// `error`.
    pub event: ErrorTag,
    /// Its code and message.
    pub error: &'a ErrorDetail,
}

/// Text the command wrote on its standard output, whole UTF-8.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StdoutEvent<'a> {
    /// `stdout`.
    pub event: StdoutTag,
    /// The text.
    pub data: &'a str,
}

/// Text the command wrote on its standard error, whole UTF-8.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct StderrEvent<'a> {
    /// `stderr`.
    pub event: StderrTag,
    /// The text.
    pub data: &'a str,
}

/// The command's result: the last event of a streamed command that ran.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CommandResultEvent<'a> {
    /// `result`.
    pub event: ResultTag,
    /// The result, as the JSON answer carries it.
    pub result: &'a CommandResult,
}

/// A line of a streamed execute: `output` and `display` events as the cell produces them,
/// then `output_truncated` when output was dropped, then one `result` or `error`.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum StreamEvent<'a> {
    /// See [`OutputEvent`].
    Output(OutputEvent<'a>),
    /// See [`DisplayEvent`].
    Display(DisplayEvent<'a>),
    /// See [`OutputTruncatedEvent`].
    OutputTruncated(OutputTruncatedEvent),
    /// See [`CellResultEvent`].
    Result(CellResultEvent<'a>),
    /// See [`ErrorEvent`].
    Error(ErrorEvent<'a>),
}

/// A line of a streamed command: `stdout` and `stderr` events as the command writes, then
/// `output_truncated` when output was dropped, then one `result` or `error`.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum CommandEvent<'a> {
    /// See [`StdoutEvent`].
    Stdout(StdoutEvent<'a>),
    /// See [`StderrEvent`].
    Stderr(StderrEvent<'a>),
    /// See [`OutputTruncatedEvent`].
    OutputTruncated(OutputTruncatedEvent),
    /// See [`CommandResultEvent`].
    Result(CommandResultEvent<'a>),
    /// See [`ErrorEvent`].
    Error(ErrorEvent<'a>),
}

impl StreamEvent<'_> {
    /// An `output` event of text that came on `stream`.
    pub fn output(data: &str, stream: OutputStream) -> StreamEvent<'_> {
        StreamEvent::Output(OutputEvent {
            event: OutputTag,
            data,
            stream,
        })
    }

    /// A `display` event.
    pub fn display(data: &RichResult) -> StreamEvent<'_> {
        StreamEvent::Display(DisplayEvent {
            event: DisplayTag,
            data,
        })
    }

    /// An `output_truncated` event.
    pub fn truncated(bytes: usize) -> Self {
        StreamEvent::OutputTruncated(truncated(bytes))
    }

    /// The `result` event.
    pub fn result(result: &CellResult) -> StreamEvent<'_> {
        StreamEvent::Result(CellResultEvent {
            event: ResultTag,
            result,
        })
    }

    /// The `error` event.
    pub fn error(error: &ErrorDetail) -> StreamEvent<'_> {
        StreamEvent::Error(ErrorEvent {
            event: ErrorTag,
            error,
        })
    }
}

impl CommandEvent<'_> {
    /// A `stdout` event.
    pub fn stdout(data: &str) -> CommandEvent<'_> {
        CommandEvent::Stdout(StdoutEvent {
            event: StdoutTag,
            data,
        })
    }

    /// A `stderr` event.
    pub fn stderr(data: &str) -> CommandEvent<'_> {
        CommandEvent::Stderr(StderrEvent {
            event: StderrTag,
            data,
        })
    }

    /// An `output_truncated` event.
    pub fn truncated(bytes: usize) -> Self {
        CommandEvent::OutputTruncated(truncated(bytes))
    }

    /// The `result` event.
    pub fn result(result: &CommandResult) -> CommandEvent<'_> {
        CommandEvent::Result(CommandResultEvent {
            event: ResultTag,
            result,
        })
    }

    /// The `error` event.
    pub fn error(error: &ErrorDetail) -> CommandEvent<'_> {
        CommandEvent::Error(ErrorEvent {
            event: ErrorTag,
            error,
        })
    }
}

fn truncated(bytes: usize) -> OutputTruncatedEvent {
    OutputTruncatedEvent {
        event: TruncatedTag,
        bytes: u64::try_from(bytes).unwrap_or(u64::MAX),
    }
}

/// A union of named event schemas: a `oneOf` of their `$ref`s with a discriminator mapping
/// each `event` value to its schema (OpenAPI 3.1, "Discriminator Object").
fn union(description: &str, variants: Vec<(&str, Schema)>) -> Schema {
    let mut mapping = serde_json::Map::new();
    let mut one_of = Vec::new();
    for (name, schema) in variants {
        if let Some(reference) = schema.get("$ref") {
            mapping.insert(name.to_owned(), reference.clone());
        }
        one_of.push(schema.to_value());
    }
    json_schema!({
        "description": description,
        "oneOf": one_of,
        "discriminator": {"propertyName": EVENT_FIELD, "mapping": mapping},
    })
}

impl JsonSchema for StreamEvent<'_> {
    fn schema_name() -> Cow<'static, str> {
        "StreamEvent".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        union(
            "A line of a streamed execute: `output` and `display` events as the cell produces them, then `output_truncated` when output was dropped, then one `result` or `error`.",
            vec![
                (OutputTag::NAME, generator.subschema_for::<OutputEvent>()),
                (DisplayTag::NAME, generator.subschema_for::<DisplayEvent>()),
                (
                    TruncatedTag::NAME,
                    generator.subschema_for::<OutputTruncatedEvent>(),
                ),
                (ResultTag::NAME, generator.subschema_for::<CellResultEvent>()),
                (ErrorTag::NAME, generator.subschema_for::<ErrorEvent>()),
            ],
        )
    }
}

impl JsonSchema for CommandEvent<'_> {
    fn schema_name() -> Cow<'static, str> {
        "CommandEvent".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        union(
            "A line of a streamed command: `stdout` and `stderr` events as the command writes, then `output_truncated` when output was dropped, then one `result` or `error`.",
            vec![
                (StdoutTag::NAME, generator.subschema_for::<StdoutEvent>()),
                (StderrTag::NAME, generator.subschema_for::<StderrEvent>()),
                (
                    TruncatedTag::NAME,
                    generator.subschema_for::<OutputTruncatedEvent>(),
                ),
                (
                    ResultTag::NAME,
                    generator.subschema_for::<CommandResultEvent>(),
                ),
                (ErrorTag::NAME, generator.subschema_for::<ErrorEvent>()),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_one_line_its_name_first() {
        let line = serde_json::to_string(&StreamEvent::output("a\"b", OutputStream::Stdout))
            .expect("JSON");
        assert_eq!(
            line,
            r#"{"event":"output","data":"a\"b","stream":"stdout"}"#
        );
        let line = serde_json::to_string(&CommandEvent::truncated(7)).expect("JSON");
        assert_eq!(line, r#"{"event":"output_truncated","bytes":7}"#);
        let error = ErrorDetail {
            code: "no_kernel".into(),
            message: "gone".into(),
        };
        let line = serde_json::to_string(&CommandEvent::error(&error)).expect("JSON");
        assert_eq!(
            line,
            r#"{"event":"error","error":{"code":"no_kernel","message":"gone"}}"#
        );
    }
}
