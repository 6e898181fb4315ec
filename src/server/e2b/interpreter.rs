//! The code interpreter (`E2b-Sandbox-Port: 49999`): `POST /execute` runs the code as a cell
//! of the sandbox's session through the server's streaming execute
//! (`api::stream::stream_shaped`), its output, displays and result written as E2B's NDJSON
//! lines by [`E2bShape`]; `/contexts` are kernelbox's contexts (docs/contract.md,
//! "Languages"): each language's default context (id: the language's name) and the named
//! contexts a sandbox makes (a kernel each, [`Facade::add_context`]).
//!
//! What one execute holds on the host is what a streamed native execute holds (the output
//! backlog, the display cap, the tenant's and the host's response bytes in flight:
//! docs/reliability.md); a line here is a few bytes longer than a native event, no more.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cell::OutputStream;
use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::{Extension, Json};
use futures::StreamExt;
use serde::Serialize;

use super::wire::{self, Context};
use super::{E2bError, Facade, InSandbox};
use crate::cell::{CellResult, CellStatus};
use crate::rich::{RawJson, RichResult};
use crate::server::api::{self, pending, stream};
use crate::server::AppState;
use crate::wire::{ErrorDetail, ExecuteBody, Language};

/// Where a context runs, as E2B names it (the session's `/work`: docs/e2b.md).
pub(crate) const HOME: &str = "/home/user";

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The E2B names of the MIME types a result carries; any other goes into `extra`.
const MIME_FIELDS: [(&str, &str); 10] = [
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
];

#[derive(Serialize)]
struct Text<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
    timestamp: u128,
}

#[derive(Serialize)]
struct ResultLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    fields: std::collections::BTreeMap<&'static str, &'a RawJson>,
    is_main_result: bool,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    extra: std::collections::BTreeMap<&'a str, &'a RawJson>,
}

#[derive(Serialize)]
struct ErrorLine<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    value: &'a str,
    traceback: &'a str,
}

/// A cell's error as E2B's `name`, `value` (a Python traceback's last line, `Name: value`)
/// and `traceback`; kernelbox's own endings (timeout, interrupt, a kernel lost) get a name
/// of their own.
fn error_parts(result: &CellResult) -> (String, String) {
    let message = result.error.as_deref().unwrap_or_default();
    match result.status {
        CellStatus::Timeout => return ("TimeoutError".into(), message.trim().into()),
        CellStatus::Interrupted => return ("KeyboardInterrupt".into(), message.trim().into()),
        _ => {}
    }
    if !message.contains("Traceback (most recent call last)") {
        return ("KernelError".into(), message.trim().into());
    }
    let last = message
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    match last.split_once(": ") {
        Some((name, value)) => (name.trim().into(), value.into()),
        None => (last.trim().into(), String::new()),
    }
}

/// How a Python traceback starts: output starting so is held back until the cell's end,
/// since E2B sends a raised exception's traceback in its `error` line only.
const TRACEBACK_HEAD: &str = "Traceback (most recent call last):";

fn stdout(text: &str) -> Bytes {
    stream::line(&Text {
        kind: "stdout",
        text,
        timestamp: now_ns(),
    })
}

/// E2B's code interpreter lines for one streamed execute. Output that starts like a
/// traceback is held back: it goes out with the next output, or, when it is the traceback of
/// the cell's error, only in the `error` line (the native result keeps it in `output`).
#[derive(Default)]
pub(crate) struct E2bShape {
    held: std::sync::Mutex<String>,
}

impl E2bShape {
    fn take_held(&self) -> String {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl stream::Shape for E2bShape {
    fn output(&self, text: &str, stream: OutputStream) -> Option<Bytes> {
        match stream {
            // The traceback goes out in the `error` line only.
            OutputStream::Traceback => return None,
            OutputStream::Stderr => {
                return Some(stream::line(&Text {
                    kind: "stderr",
                    text,
                    timestamp: now_ns(),
                }))
            }
            OutputStream::Stdout => {}
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_empty() && text.starts_with(TRACEBACK_HEAD) {
            held.push_str(text);
            return None;
        }
        let text = std::mem::take(&mut *held) + text;
        Some(stdout(&text))
    }

    fn display(&self, result: &RichResult) -> Bytes {
        let mut fields = std::collections::BTreeMap::new();
        let mut extra = std::collections::BTreeMap::new();
        for (mime, value) in &result.data {
            match MIME_FIELDS.iter().find(|(m, _)| m == mime) {
                Some((_, field)) => {
                    fields.insert(*field, value);
                }
                None => {
                    extra.insert(mime.as_str(), value);
                }
            }
        }
        stream::line(&ResultLine {
            kind: "result",
            fields,
            is_main_result: result.is_main_result,
            extra,
        })
    }

    fn truncated(&self, bytes: usize) -> Bytes {
        let text = format!(
            "[kernelbox: {bytes} bytes of output were dropped: the client did not read them in time]\n"
        );
        stream::line(&Text {
            kind: "stderr",
            text: &text,
            timestamp: now_ns(),
        })
    }

    fn result(&self, result: &CellResult) -> Vec<Bytes> {
        let mut lines = Vec::new();
        let held = self.take_held();
        let traceback = result.error.as_deref().unwrap_or_default();
        if !held.is_empty() && (traceback.is_empty() || !traceback.starts_with(held.trim_end())) {
            lines.push(stdout(&held));
        }
        if result.status != CellStatus::Success {
            let (name, value) = error_parts(result);
            lines.push(stream::line(&ErrorLine {
                kind: "error",
                name: &name,
                value: &value,
                traceback: result.error.as_deref().unwrap_or_default(),
            }));
        }
        lines.push(stream::line(&serde_json::json!({
            "type": "number_of_executions",
            "execution_count": result.kernel.execution_count,
        })));
        lines.push(stream::line(
            &serde_json::json!({"type": "end_of_execution"}),
        ));
        lines
    }

    fn error(&self, error: &ErrorDetail) -> Vec<Bytes> {
        let held = self.take_held();
        let held = (!held.is_empty()).then(|| stdout(&held));
        held.into_iter()
            .chain([
                stream::line(&ErrorLine {
                    kind: "error",
                    name: &error.code,
                    value: &error.message,
                    traceback: &error.message,
                }),
                stream::line(&serde_json::json!({"type": "end_of_execution"})),
            ])
            .collect()
    }
}

/// IPython's leading indentation removed, as E2B's Jupyter kernel removes it: when the first
/// non-blank line is indented and every non-blank line starts with that indentation, it is
/// taken off every line (code in an indented triple-quoted string of the caller's runs).
pub(crate) fn dedent(code: &str) -> String {
    let Some(first) = code.lines().find(|l| !l.trim().is_empty()) else {
        return code.to_owned();
    };
    let indent = &first[..first.len() - first.trim_start().len()];
    if indent.is_empty()
        || !code
            .lines()
            .all(|l| l.trim().is_empty() || l.starts_with(indent))
    {
        return code.to_owned();
    }
    code.split_inclusive('\n')
        .map(|l| {
            l.strip_prefix(indent)
                .unwrap_or(l.trim_start_matches([' ', '\t']))
        })
        .collect()
}

/// IPython's `!cmd` lines (as E2B's Jupyter kernel accepts them) as Python that runs the
/// command in a shell, its output in the cell's: a line whose first non-blank character is
/// `!` is never valid Python, so nothing else changes meaning. (A `!` line inside a
/// triple-quoted string would be changed too.)
pub(crate) fn shell_lines(code: &str) -> String {
    if !code.lines().any(|l| l.trim_start().starts_with('!')) {
        return code.to_owned();
    }
    let mut out = String::with_capacity(code.len() + 64);
    for line in code.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        let indent = &body[..body.len() - body.trim_start().len()];
        match body.trim_start().strip_prefix('!') {
            Some(command) => {
                let quoted = serde_json::to_string(command).unwrap_or_else(|_| "\"\"".into());
                out.push_str(indent);
                out.push_str("__import__(\"subprocess\").run(");
                out.push_str(&quoted);
                out.push_str(", shell=True)");
                out.push_str(&line[body.len()..]);
            }
            None => out.push_str(line),
        }
    }
    out
}

/// An E2B language name as kernelbox's language (E2B's names and their short forms); a
/// language kernelbox has no name for is 400.
fn language_of(name: Option<&str>) -> Result<Language, E2bError> {
    let name = name.map(str::to_ascii_lowercase);
    match name.as_deref() {
        None | Some("") | Some("python") | Some("python3") => Ok(Language::Python),
        Some("bash") | Some("sh") | Some("shell") => Ok(Language::Bash),
        Some("js") | Some("javascript") | Some("node") => Ok(Language::Javascript),
        Some("ts") | Some("typescript") => Ok(Language::Typescript),
        Some(other) => Err(E2bError::bad_request(format!(
            "language {other:?} is not available: kernelbox's E2B API runs python and bash, \
             javascript and typescript where the server serves them (docs/e2b.md, \"Contexts\")"
        ))),
    }
}

/// A language this server does not run, as E2B's 400.
fn served(language: Language) -> Result<(), E2bError> {
    language.check_served().map_err(|e| {
        E2bError::bad_request(format!(
            "{e}: not available on this server (docs/e2b.md, \"Contexts\")"
        ))
    })
}

/// The language and the kernelbox context name (None: the language's default context) a
/// context id names in `call`'s sandbox.
fn context_of(
    facade: &Facade,
    call: &InSandbox,
    id: &str,
) -> Result<(Language, Option<String>), E2bError> {
    if let Some(language) = Language::parse(id) {
        return Ok((language, None));
    }
    let sandbox = facade.get(&call.tenant.name, &call.id)?;
    match sandbox.contexts.get(id) {
        Some(language) => Ok((*language, Some(id.to_owned()))),
        None => Err(E2bError::not_found(format!("context {id:?} not found"))),
    }
}

/// `POST /execute`: the code as a cell of the sandbox's session, streamed as E2B's lines.
pub(super) async fn execute(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    call: InSandbox,
    meter: Option<Extension<Arc<pending::Meter>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, E2bError> {
    let tenant = call.tenant.clone();
    let bytes = api::read_body_of(&state, &tenant, &headers, body).await?;
    let asked: wire::Execute = api::json_object(&bytes)?;
    let (language, context) = match asked.context_id.as_deref() {
        Some(id) => context_of(&facade, &call, id)?,
        None => (language_of(asked.language.as_deref())?, None),
    };
    served(language)?;
    if asked.env_vars.as_ref().is_some_and(|e| !e.is_empty()) {
        return Err(E2bError::not_available(
            "environment variables for one execution (give them to Sandbox.create)",
        ));
    }
    let code = match language {
        Language::Python => shell_lines(&dedent(&asked.code)),
        _ => asked.code,
    };
    let body = ExecuteBody {
        code,
        language: Some(language),
        context,
        ..ExecuteBody::default()
    };
    let mut request = api::parse_execute(&state, &tenant, call.id.clone(), body)
        .map_err(|e| api::invalid(&state, e))?;
    // E2B's code interpreter interrupts the cell when its client goes away (a `run_code`
    // past its `timeout` closes the connection): the response's body cancels this token when
    // it is dropped, which interrupts the cell as `POST .../interrupt` does, kernel kept.
    let gone = tokio_util::sync::CancellationToken::new();
    request.cancel = Some(gone.clone());
    if state.is_draining() {
        return Err(crate::server::ApiError::shutting_down().into());
    }
    api::admit(&state, &tenant)?;
    let meter = match meter {
        Some(Extension(meter)) => meter,
        None => pending::Meter::new(state.inner.pending.clone()),
    };
    let (notice, admitted) = crate::orchestrator::AdmissionNotice::new();
    let response = stream::stream_shaped(
        state.clone(),
        request,
        notice,
        meter,
        Arc::new(E2bShape::default()),
    );
    if let Ok(Err(e)) = admitted.await {
        return Err(api::refused(&state, e).into());
    }
    let (parts, body) = response.into_parts();
    let guard = gone.drop_guard();
    let body = body.into_data_stream().map(move |chunk| {
        let _ = &guard;
        chunk
    });
    Ok(Response::from_parts(parts, Body::from_stream(body)))
}

fn context(id: &str, language: Language) -> Context {
    Context {
        id: id.to_owned(),
        language: language.name().into(),
        cwd: HOME.into(),
    }
}

/// `GET /contexts`: each served language's default context, then the sandbox's own.
pub(super) async fn list_contexts(
    Extension(facade): Extension<Facade>,
    call: InSandbox,
) -> Result<Json<Vec<Context>>, E2bError> {
    let sandbox = facade.get(&call.tenant.name, &call.id)?;
    let defaults = Language::ALL
        .into_iter()
        .filter(|l| l.is_served())
        .map(|l| context(l.name(), l));
    let own = sandbox.contexts.iter().map(|(id, l)| context(id, *l));
    Ok(Json(defaults.chain(own).collect()))
}

/// `POST /contexts`: a new context of `language` (a kernel of its own, started by its first
/// cell), in the home directory.
pub(super) async fn create_context(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    call: InSandbox,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Context>, E2bError> {
    let bytes = api::read_body_of(&state, &call.tenant, &headers, body).await?;
    let asked: wire::NewContext = if bytes.iter().all(u8::is_ascii_whitespace) {
        wire::NewContext::default()
    } else {
        api::json_object(&bytes)?
    };
    let language = language_of(asked.language.as_deref())?;
    served(language)?;
    if let Some(cwd) = asked.cwd.as_deref() {
        if cwd.trim_end_matches('/') != HOME {
            return Err(E2bError::not_available(&format!(
                "a context in {cwd:?} (a context runs in {HOME})"
            )));
        }
    }
    let id = facade.add_context(&call.tenant.name, &call.id, language)?;
    Ok(Json(context(&id, language)))
}

/// `DELETE /contexts/{id}`: forgets a context the sandbox made (its kernel goes when idle,
/// `kernels.idle_timeout`, or with the sandbox); a language's default context stays.
pub(super) async fn remove_context(
    Extension(facade): Extension<Facade>,
    call: InSandbox,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, E2bError> {
    let id = id.map(|Path(id)| id).unwrap_or_default();
    if Language::parse(&id).is_some() {
        return Err(E2bError::not_available(
            "removing a language's default context",
        ));
    }
    if facade.remove_context(&call.tenant.name, &call.id, &id) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(E2bError::not_found(format!("context {id:?} not found")))
    }
}

/// `POST /contexts/{id}/restart`: a fresh kernel for the context (`reset`), its variables
/// gone. The default Python context is not restarted: its kernel holds the sandbox's files.
pub(super) async fn restart_context(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    call: InSandbox,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, E2bError> {
    let id = id.map(|Path(id)| id).unwrap_or_default();
    let (language, context) = context_of(&facade, &call, &id)?;
    if language == Language::Python && context.is_none() {
        return Err(E2bError::not_available(
            "restarting the default Python context (its kernel holds the sandbox's files in /home/user)",
        ));
    }
    served(language)?;
    if state.is_draining() {
        return Err(crate::server::ApiError::shutting_down().into());
    }
    api::admit(&state, &call.tenant)?;
    let body = ExecuteBody {
        code: String::new(),
        language: Some(language),
        context,
        reset: true,
        ..ExecuteBody::default()
    };
    api::run_cell(&state, &call.tenant, call.id.clone(), body).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::{dedent, shell_lines};

    #[test]
    fn leading_indentation_goes_as_ipython_takes_it_off() {
        assert_eq!(
            dedent("\n    x = 1\n    if x:\n        y = 2\n"),
            "\nx = 1\nif x:\n    y = 2\n"
        );
        assert_eq!(dedent("x = 1\n  y\n"), "x = 1\n  y\n");
        assert_eq!(dedent("  x = 1\ny = 2\n"), "  x = 1\ny = 2\n");
    }

    #[test]
    fn bang_lines_become_shell_commands_and_nothing_else_changes() {
        assert_eq!(shell_lines("x = 1\nx != 2\n"), "x = 1\nx != 2\n");
        assert_eq!(
            shell_lines("for i in range(2):\n    !echo \"hi\"\nprint(1)"),
            "for i in range(2):\n    __import__(\"subprocess\").run(\"echo \\\"hi\\\"\", shell=True)\nprint(1)"
        );
    }
}
