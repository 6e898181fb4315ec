//! The OpenAPI 3.1 description served at `/openapi.json`. This file writes the routes only:
//! their parameters, statuses and which schema each body has. Every schema (`CellResult`, the
//! stream events, errors, listings, counts, ...) is generated with schemars from the Rust type
//! the server builds the body from (`src/wire/`, [`generated_schemas`]), so the document cannot
//! drift from what the server sends and reads; a test checks every route of [`super::ROUTES`]
//! appears.

use serde_json::{json, Value};

use schemars::generate::Contract;

use crate::cell::CellResult;
use crate::wire::{self, CommandBody, CommandResult, ExecuteBody};

/// The `/files` routes, described in [`files_paths`].
fn file_param() -> Value {
    json!({
        "name": "path", "in": "path", "required": true,
        "description": "Relative to the kernel's working directory (/work). Absolute paths, `.`/`..` components and any symlink on the way (or, for GET, as the last component) are refused with 400.",
        "schema": {"type": "string"}
    })
}

fn child_query() -> Value {
    json!({
        "name": "child", "in": "query", "required": false,
        "description": "A delegated child of the session: its kernel is meant.",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._@:-]{1,128}$"}
    })
}

fn files_paths(auth_errors: &Value) -> Value {
    let common = with(
        auth_errors,
        json!({
            "400": error_response("`invalid_path`: absolute, `..` or too long; `symlink` / `not_a_directory`: a symlink (e.g. one a cell planted) or a non-directory on the way; `is_a_directory`, `not_a_file`; `tar_member_refused` (a link, device, absolute or `..` member: the whole archive is refused), `invalid_tar`; `invalid_name`: bad session or child name."),
            "404": error_response("`no_kernel`: the session (or child) has no live kernel, or belongs to another tenant; files live and die with the kernel. `not_found`: nothing at that path."),
            "503": error_response("The Docker engine failed or the server is shutting down."),
        }),
    );
    let written = json!({"201": answer("Written (parents created, written to a temporary name then renamed). For a tar: `files` extracted, `size` their bytes.", "Written")});
    let put_errors = json!({
        "413": error_response("`file_too_large`: over the upload cap (100 MiB by default, `--max-upload`); nothing was written."),
        "429": error_response("A new kernel would pass a cap (`at_capacity`), or the kernel has 8 calls attached (`session_busy`), or the tenant's responses not yet read reach its budget (`too_many_pending_results`)."),
        "507": error_response("`no_space`: the kernel's working directory is full; nothing was written."),
    });
    let read = json!({"200": {
        "description": "A file's bytes (`Content-Length` set, streamed); a directory's listing; with `Accept: application/x-tar`, a directory as a tar stream (regular files, directories, symlinks as links).",
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {"schema": {"$ref": "#/components/schemas/Listing"}},
            "application/x-tar": {"schema": {"type": "string", "format": "binary"}}
        }
    }});
    let body = json!({"required": true, "content": {
        "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        "application/x-tar": {"schema": {"type": "string", "format": "binary", "description": "Extracted into the directory at the path (regular files and directories only)."}}
    }});
    let accept = json!({"name": "Accept", "in": "header", "required": false, "description": "`application/x-tar` streams a directory as a tar.", "schema": {"type": "string"}});
    json!({
        "/v1/sessions/{session}/files/{path}": {
            "put": {
                "summary": "Upload a file (streamed); `Content-Type: application/x-tar` extracts an archive into the directory at the path. Starts the session's kernel when it has none.",
                "parameters": [session_param(), file_param(), child_query()],
                "requestBody": body,
                "responses": with(&with(&common, put_errors.clone()), written.clone())
            },
            "get": {
                "summary": "Download a file, list a directory, or stream a directory as a tar.",
                "parameters": [session_param(), file_param(), child_query(), accept],
                "responses": with(&common, read.clone())
            },
            "delete": {
                "summary": "Remove a file or a directory tree (a symlink itself, never its target).",
                "parameters": [session_param(), file_param(), child_query()],
                "responses": with(&common, json!({"200": answer("Removed.", "Deleted")}))
            }
        },
        "/v1/sessions/{session}/files": {
            "put": {
                "summary": "Extract a tar (`Content-Type: application/x-tar`) into the working directory (also at `.../files/`).",
                "parameters": [session_param(), child_query()],
                "requestBody": body,
                "responses": with(&with(&common, put_errors.clone()), written.clone())
            },
            "get": {
                "summary": "List the working directory, or stream it as a tar (also at `.../files/`).",
                "parameters": [session_param(), child_query(), accept],
                "responses": with(&common, read)
            }
        },
        "/v1/sessions/{session}/workspace": {
            "get": {
                "summary": "The session's workspace (docs/workspaces.md) as a tar of its /work, without starting the session's kernel: through its live kernel, or a transfer kernel made for this one download (the session's image and sandbox, outside its caps).",
                "parameters": [session_param(), child_query()],
                "responses": with(&common, json!({
                    "200": {"description": "The tar stream.", "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}},
                    "404": error_response("`workspace_not_found`: the tenant has no workspaces, or none of this name."),
                    "429": error_response("`too_many_transfers`: 2 per tenant (16 on the host) run at once; retry.")
                }))
            },
            "put": {
                "summary": "Extract a tar into the session's workspace (made when it has none), without starting the session's kernel: through its live kernel, or a transfer kernel. Nothing is left of a failed upload.",
                "parameters": [session_param(), child_query()],
                "requestBody": {"required": true, "content": {"application/x-tar": {"schema": {"type": "string", "format": "binary"}}}},
                "responses": with(&with(&with(&common, put_errors), written), json!({
                    "404": error_response("`workspace_not_found`: the tenant has no workspaces."),
                    "429": error_response("`too_many_transfers`, `too_many_workspaces`."),
                    "507": error_response("`no_space`: past the workspace's quota; nothing was written.")
                }))
            }
        }
    })
}

/// The schemas of every body the API reads and answers, generated from the Rust types and
/// referencing each other under `#/components/schemas/`. A body the server reads is described
/// as it may be sent (a field with a default is optional); an answer as it is sent (a field
/// skipped when empty is optional, one always written is required). A type both read and
/// answered (`SessionSettings`) is described the same both ways (a test checks it).
pub fn generated_schemas() -> serde_json::Map<String, Value> {
    let (mut all, answers) = definitions();
    for (name, schema) in answers {
        all.entry(name).or_insert(schema);
    }
    all
}

/// The schemas of the bodies the server reads, and of those it sends.
fn definitions() -> (
    serde_json::Map<String, Value>,
    serde_json::Map<String, Value>,
) {
    let (mut requests, mut answers) = (
        generator(Contract::Deserialize),
        generator(Contract::Serialize),
    );
    requests.subschema_for::<ExecuteBody>();
    requests.subschema_for::<CommandBody>();
    requests.subschema_for::<wire::NetworkPolicy>();
    requests.subschema_for::<wire::SessionSettings>();
    requests.subschema_for::<wire::SnapshotBody>();
    requests.subschema_for::<wire::RestoreBody>();
    requests.subschema_for::<wire::ForkBody>();
    requests.subschema_for::<wire::ProcessBody>();
    requests.subschema_for::<wire::SignalBody>();
    answers.subschema_for::<wire::ErrorBody>();
    answers.subschema_for::<CellResult>();
    answers.subschema_for::<wire::StreamEvent>();
    answers.subschema_for::<CommandResult>();
    answers.subschema_for::<wire::CommandEvent>();
    answers.subschema_for::<wire::SessionSettings>();
    answers.subschema_for::<wire::SettingsApplied>();
    answers.subschema_for::<wire::NetworkApplied>();
    answers.subschema_for::<wire::Interrupted>();
    answers.subschema_for::<wire::Cleared>();
    answers.subschema_for::<wire::Released>();
    answers.subschema_for::<wire::KernelList>();
    answers.subschema_for::<wire::ContextList>();
    answers.subschema_for::<wire::WorkspaceList>();
    answers.subschema_for::<wire::Deleted>();
    answers.subschema_for::<crate::files::Listing>();
    answers.subschema_for::<crate::files::Written>();
    answers.subschema_for::<wire::UsageReport>();
    answers.subschema_for::<wire::Health>();
    answers.subschema_for::<wire::NodeList>();
    answers.subschema_for::<wire::NodeDrain>();
    answers.subschema_for::<wire::NodeKernels>();
    answers.subschema_for::<wire::SnapshotInfo>();
    answers.subschema_for::<wire::SnapshotList>();
    answers.subschema_for::<wire::ForkOutcome>();
    answers.subschema_for::<wire::ForkResult>();
    answers.subschema_for::<wire::Identity>();
    answers.subschema_for::<wire::KernelPage>();
    answers.subschema_for::<wire::TenantOverview>();
    answers.subschema_for::<wire::ProcessInfo>();
    answers.subschema_for::<wire::ProcessList>();
    answers.subschema_for::<wire::StdinWritten>();
    answers.subschema_for::<wire::ProcessEvent>();
    answers.subschema_for::<wire::SessionEvents>();
    answers.subschema_for::<wire::RecentSessions>();
    answers.subschema_for::<wire::AuditTail>();
    answers.subschema_for::<wire::EgressRefusals>();
    (
        requests.take_definitions(true),
        answers.take_definitions(true),
    )
}

fn generator(contract: Contract) -> schemars::SchemaGenerator {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.contract = contract;
    settings
        .transforms
        .push(Box::new(schemars::transform::RecursiveTransform(
            plain_enum,
        )));
    settings.into_generator()
}

/// An enumeration of strings whose values schemars describes one by one (a `oneOf` of
/// `const`s, each with its doc comment) becomes `{"type": "string", "enum": [...]}`, each
/// value's description appended to the schema's: client generators parse an `enum`, while a
/// `oneOf` of constants is beyond some (openapi-python-client tries only the first).
fn plain_enum(schema: &mut schemars::Schema) {
    let Some(Value::Array(options)) = schema.get("oneOf") else {
        return;
    };
    let mut values = Vec::new();
    let mut notes = Vec::new();
    for option in options {
        let (Some(Value::String(value)), Some("string")) = (
            option.get("const"),
            option.get("type").and_then(Value::as_str),
        ) else {
            return;
        };
        if let Some(note) = option.get("description").and_then(Value::as_str) {
            notes.push(format!("`{value}`: {note}"));
        }
        values.push(Value::String(value.clone()));
    }
    let mut description = schema
        .get("description")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_default();
    if !notes.is_empty() {
        if !description.is_empty() {
            description.push_str("\n\n");
        }
        description.push_str(&notes.join("\n"));
    }
    schema.remove("oneOf");
    schema.insert("type".into(), "string".into());
    schema.insert("enum".into(), Value::Array(values));
    if !description.is_empty() {
        schema.insert("description".into(), Value::String(description));
    }
}

/// A JSON answer of the generated schema `name`.
fn answer(description: &str, name: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{name}")}}}
    })
}

fn error_response(description: &str) -> Value {
    json!({
        "description": description,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    })
}

fn session_param() -> Value {
    json!({
        "name": "session", "in": "path", "required": true,
        "description": "Conversation id: 1-128 of A-Z a-z 0-9 . _ - @ : (no \"::\"; not \".\" or \"..\").",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._@:-]{1,128}$"}
    })
}

/// The spec, as JSON.
pub fn spec() -> Value {
    let auth_errors = json!({
        "401": error_response("Missing or unknown bearer token."),
    });
    let mut execute_responses = json!({
        "200": {
            "description": "The cell result; with `Accept: application/x-ndjson`, a stream of events, one JSON object a line: `output` events as the cell writes and `display` events (rich results, MIME bundles) as it displays, in the order produced, then one `result` (or `error`) event.",
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/CellResult"}},
                "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/StreamEvent"}}
            }
        },
        "400": error_response("`invalid_json`: the body is not a JSON object of the documented fields; `invalid_timeout`: `timeout` is not a number of seconds in (0, max]; `invalid_name`: bad session/child name; `tool_not_allowed`: a tool outside the tenant's allow-list."),
        "413": error_response("Request body over 1 MiB."),
        "429": {
            "description": "A new kernel would pass a cap (`at_capacity`): the tenant's max_kernels, or the host's kernel cap with no kernel the tenant may evict (its own idle ones, or those of a tenant over its fair share) idle. The message names the cap. Or the session's kernel already has 8 calls running or queued (`session_busy`). Or the tenant's responses built and not yet read by its clients reach --max-pending-results-per-tenant, or all tenants' reach --max-pending-results (`too_many_pending_results`). Retry after the `Retry-After` seconds.",
            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        },
        "503": error_response("The Docker engine failed, the kernel could not start, or the server is shutting down."),
    });
    merge(&mut execute_responses, &auth_errors);
    let mut not_found = json!({
        "404": error_response("The caller's tenant has nothing by that name."),
        "400": error_response("Bad session or child name."),
    });
    merge(&mut not_found, &auth_errors);

    let mut spec = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "kernelbox",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Stateful Python kernels in hardened Docker containers, one per conversation. Every call is namespaced by the caller's tenant. Every request body is a JSON object. A connection the server has no slot for (its connection limits, with a smaller share for connections no request with a token has come on yet) is answered 503 `too_many_connections` and closed; one whose request head or body does not arrive in time, or that idles past the keep-alive timeout, is closed, and so may be one that has not authenticated and is doing nothing when a new connection needs its slot. `/metrics` may be served on a separate address (`--metrics-listen`)."
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {}
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/sessions/{session}/execute": {
                "post": {
                    "summary": "Run one cell in the session's kernel (started on first use).",
                    "parameters": [session_param(), {
                        "name": "Accept", "in": "header", "required": false,
                        "description": "`application/x-ndjson` streams output and display events, then the result.",
                        "schema": {"type": "string"}
                    }],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ExecuteRequest"}}}},
                    "responses": execute_responses
                }
            },
            "/v1/sessions/{session}/interrupt": {
                "post": {
                    "summary": "Interrupt the session's running cells: each gets KeyboardInterrupt and returns status `interrupted` with its kernel and state kept; one that has not stopped within the grace (5 s by default, `--interrupt-grace`) is killed with its kernel.",
                    "parameters": [session_param()],
                    "responses": with(&not_found, json!({"200": answer("How many cells were interrupted.", "Interrupted")}))
                }
            },
            "/v1/sessions/{session}/network": {
                "put": {
                    "summary": "Set the session's network egress policy, intersected with its tenant's (a destination must pass both; deny wins), applied at once to its running kernel and kept for its next ones (docs/reliability.md, \"Network egress\").",
                    "parameters": [session_param()],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NetworkPolicy"}}}},
                    "responses": with(&auth_errors, json!({
                        "200": answer("Applied.", "NetworkApplied"),
                        "400": error_response("`invalid_network`: a malformed entry (the message names it); `network_not_allowed`: the policy has an entry and the tenant has no network (nothing is kept); `invalid_name`, `invalid_json`."),
                        "429": error_response("`too_many_session_policies`: the tenant's sessions' policies would hold more than 4 MiB (`DELETE /v1/sessions/{session}` forgets a session's)."),
                        "503": error_response("In a cluster: `catalog_unavailable`, or `session_moved` (its kernel is starting on another node; retry).")
                    }))
                }
            },
            "/v1/sessions/{session}/settings": {
                "put": {
                    "summary": "Replace the session's settings (environment, memory and CPU limits, idle timeout, labels) within its tenant's `session_limits`. Environment, memory and CPU apply from the session's next kernel (`restart_required` says whether a live one runs with others); the idle timeout and labels at once (docs/http-api.md, \"Session settings\").",
                    "parameters": [session_param()],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SessionSettings"}}}},
                    "responses": with(&auth_errors, json!({
                        "200": {"description": "Kept.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SettingsApplied"}}}},
                        "400": error_response("`invalid_settings`: a malformed field (the message names it); `settings_not_allowed`: more than the tenant's maximum; `invalid_name`, `invalid_json`."),
                        "429": error_response("`too_many_settings`: the tenant has settings for 16,384 sessions with live kernels.")
                    }))
                },
                "get": {
                    "summary": "The session's settings (`{}` when it set none).",
                    "parameters": [session_param()],
                    "responses": with(&auth_errors, json!({
                        "200": {"description": "Settings.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SessionSettings"}}}}
                    }))
                }
            },
            "/v1/sessions/{session}/commands": {
                "post": {
                    "summary": "Run one shell command in the session's kernel container (started on first use), beside its cells: as the kernel's user, in its sandbox and working directory. Past its timeout the command's process group is killed; the kernel and its state stay.",
                    "parameters": [session_param(), {
                        "name": "Accept", "in": "header", "required": false,
                        "description": "`application/x-ndjson` streams stdout and stderr events, then the result.",
                        "schema": {"type": "string"}
                    }],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CommandRequest"}}}},
                    "responses": with(&auth_errors, json!({
                        "200": {"description": "The command's result (or, streamed, its events).", "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/CommandResult"}},
                            "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/CommandEvent"}}
                        }},
                        "400": error_response("`invalid_command`, `invalid_timeout`, `invalid_name`, `invalid_json`."),
                        "404": error_response("`no_kernel`: the kernel went before the command could start."),
                        "429": error_response("`too_many_commands`: the session's kernel already runs 4 commands; `at_capacity`, `session_busy`, `too_many_pending_results` as for an execute."),
                        "503": error_response("The Docker engine failed or the server is shutting down.")
                    }))
                }
            },
            "/v1/sessions/{session}": {
                "delete": {
                    "summary": "Clear a session: dispose of its kernels, its children's included.",
                    "parameters": [session_param()],
                    "responses": with(&not_found, json!({"200": answer("How many kernels were disposed of.", "Cleared")}))
                }
            },
            "/v1/sessions/{session}/children/{child}": {
                "delete": {
                    "summary": "Release a finished delegated child: dispose of its kernels.",
                    "parameters": [session_param(), {
                        "name": "child", "in": "path", "required": true,
                        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._@:-]{1,128}$"}
                    }],
                    "responses": with(&not_found, json!({"200": answer("How many kernels were disposed of.", "Released")}))
                }
            },
            "/v1/sessions/{session}/contexts": {
                "get": {
                    "summary": "The session's contexts that have a kernel (not its children's): each its kernel, with its `context` and `language` (docs/contract.md, \"Languages\").",
                    "parameters": [session_param()],
                    "responses": with(&auth_errors, json!({"400": error_response("`invalid_name`."), "200": answer("Contexts.", "ContextList")}))
                }
            },
            "/v1/sessions/{session}/contexts/{context}": {
                "delete": {
                    "summary": "End one context of a session: its kernel goes; the session's other contexts and their shared /work stay.",
                    "parameters": [session_param(), {
                        "name": "context", "in": "path", "required": true,
                        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._@:-]{1,128}$"}
                    }],
                    "responses": with(&not_found, json!({"200": answer("How many kernels were disposed of.", "Released")}))
                }
            },
            "/v1/kernels": {
                "get": {
                    "summary": "The caller's tenant's live kernels; with `label=key:value` (repeatable), those of sessions whose settings carry every label given.",
                    "parameters": [{
                        "name": "label", "in": "query", "required": false,
                        "description": "`key:value`; repeat to require several.",
                        "schema": {"type": "string"}
                    }],
                    "responses": with(&auth_errors, json!({"400": error_response("`invalid_settings`: a filter without `:`; `invalid_query`: another parameter."), "200": answer("Kernels.", "KernelList")}))
                }
            },
            "/v1/workspaces": {
                "get": {
                    "summary": "The caller's tenant's workspaces: a session's /work kept past its kernel (docs/workspaces.md).",
                    "responses": with(&auth_errors, json!({
                        "200": answer("Workspaces.", "WorkspaceList"),
                        "404": error_response("`workspace_not_found`: the tenant has no workspaces.")
                    }))
                }
            },
            "/v1/workspaces/{name}": {
                "parameters": [{"name": "name", "in": "path", "required": true, "schema": {"type": "string"}}],
                "delete": {
                    "summary": "Deletes one of the caller's tenant's workspaces (its files are gone).",
                    "responses": with(&auth_errors, json!({
                        "200": answer("Deleted.", "Deleted"),
                        "404": error_response("`workspace_not_found`: none of this tenant's has that name."),
                        "409": error_response("`workspace_in_use`: a kernel has it mounted; clear the session first.")
                    }))
                }
            },
            "/v1/usage": {
                "get": {
                    "summary": "The usage ledger (docs/usage.md): the caller's tenant's usage per session, day or hour; a tenant with usage_admin, or the admin token, reads every tenant's, or one's with `tenant`.",
                    "parameters": [
                        {"name": "from", "in": "query", "required": false, "description": "Start: RFC 3339 or seconds since the epoch (default a day before `to`).", "schema": {"type": "string"}},
                        {"name": "to", "in": "query", "required": false, "description": "End (exclusive): RFC 3339 or seconds since the epoch (default now).", "schema": {"type": "string"}},
                        {"name": "group_by", "in": "query", "required": false, "description": "`session` (default): per tenant and session; `day`: per tenant and UTC day; `hour`: per tenant and hour.", "schema": {"type": "string", "enum": ["session", "day", "hour"]}},
                        {"name": "tenant", "in": "query", "required": false, "description": "One tenant (usage admins; others only their own).", "schema": {"type": "string"}}
                    ],
                    "responses": with(&auth_errors, json!({
                        "200": {"description": "The rows.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/UsageReport"}}}},
                        "400": error_response("A bad time or range (`invalid`)."),
                        "403": error_response("Another tenant's usage, asked by a tenant that is not a usage admin (`forbidden`)."),
                        "503": error_response("The ledger could not be read (`usage_unavailable`).")
                    }))
                }
            },
            "/v1/admin/reload": reload_path(),
            "/v1/nodes": {
                "get": {
                    "summary": "A cluster's nodes: state, epoch, live kernels, capacity, lease age, draining (docs/cluster.md, \"Admin\"). The admin token (`--admin-token`); 404 on a server that is not a cluster node or has no admin token.",
                    "responses": {
                        "200": answer("The nodes, and which one answered.", "NodeList"),
                        "401": error_response("Missing or wrong admin token."),
                        "404": error_response("Not a cluster node, or no admin token configured."),
                        "503": error_response("The cluster catalog is unavailable.")
                    }
                }
            },
            "/v1/nodes/{node}/drain": {
                "parameters": [{"name": "node", "in": "path", "required": true, "schema": {"type": "string"}}],
                "post": {
                    "summary": "Drain a node: no new session is placed on it (the admin token).",
                    "responses": {
                        "200": answer("Draining.", "NodeDrain"),
                        "401": error_response("Missing or wrong admin token."),
                        "404": error_response("No such node, or not a cluster node.")
                    }
                },
                "delete": {
                    "summary": "Take a drain back: sessions may be placed on the node again (the admin token).",
                    "responses": {
                        "200": answer("Not draining.", "NodeDrain"),
                        "401": error_response("Missing or wrong admin token."),
                        "404": error_response("No such node, or not a cluster node.")
                    }
                }
            },
            "/v1/nodes/{node}/kernels": {
                "parameters": [{"name": "node", "in": "path", "required": true, "schema": {"type": "string"}}],
                "get": {
                    "summary": "One node's live kernels, every tenant's (the admin token); any node answers, forwarding to that node.",
                    "responses": {
                        "200": answer("The node's kernels.", "NodeKernels"),
                        "401": error_response("Missing or wrong admin token."),
                        "404": error_response("No such node, or not a cluster node.")
                    }
                }
            },
            "/v1/mcp": mcp_path(&auth_errors),
            "/healthz": {
                "get": {
                    "summary": "Liveness; 503 while shutting down. No authentication.",
                    "security": [],
                    "responses": {
                        "200": answer("Serving.", "Health"),
                        "503": error_response("Shutting down.")
                    }
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (text exposition format), every tenant's activity. Any tenant's token, unless the server runs with `--public-metrics`.",
                    "description": "When the server runs with `--metrics-listen ADDR`, this path is served, to anyone, only on that separate address and answers 404 on the API's.",
                    "security": [{"bearer": []}, {}],
                    "responses": {
                        "200": {"description": "Metrics.", "content": {"text/plain": {"schema": {"type": "string"}}}},
                        "401": error_response("Missing or unknown bearer token (unless `--public-metrics`)."),
                        "404": error_response("Metrics are served on a separate listen address (`--metrics-listen`).")
                    }
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document. No authentication.",
                    "security": [],
                    "responses": {"200": {"description": "OpenAPI 3.1.", "content": {"application/json": {"schema": {"type": "object"}}}}}
                }
            }
        }
    });
    if let Some(paths) = spec["paths"].as_object_mut() {
        if let Some(files) = files_paths(&auth_errors).as_object() {
            paths.extend(files.clone());
        }
        if let Some(snapshots) = snapshot_paths(&auth_errors).as_object() {
            paths.extend(snapshots.clone());
        }
        if let Some(admin) = admin_paths().as_object() {
            paths.extend(admin.clone());
        }
        if let Some(processes) = process_paths(&auth_errors).as_object() {
            paths.extend(processes.clone());
        }
        if let Some(recent) = recent_paths().as_object() {
            paths.extend(recent.clone());
        }
    }
    if let Some(schemas) = spec["components"]["schemas"].as_object_mut() {
        schemas.extend(generated_schemas());
    }
    name_operations(&mut spec);
    spec
}

/// Gives every operation an `operationId` made of its method and path (`get_v1_kernels`,
/// `post_v1_sessions_session_execute`): the names a generated client's functions take.
fn name_operations(spec: &mut Value) {
    let Some(paths) = spec["paths"].as_object_mut() else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            if method == "parameters" {
                continue;
            }
            let words: Vec<&str> = path
                .split(|c: char| !c.is_ascii_alphanumeric())
                .filter(|w| !w.is_empty())
                .collect();
            op["operationId"] = Value::String(format!("{method}_{}", words.join("_")));
        }
    }
}

/// `/v1/mcp`: MCP over streamable HTTP (the wire format is MCP's own; `api/mcp.rs`).
fn mcp_path(auth_errors: &Value) -> Value {
    let session_params = json!([
        {"name": "session", "in": "query", "required": false,
         "description": "The kernelbox session tool calls run in (as in /v1/sessions/{session}/...); the `Kernelbox-Session` header does the same and wins. Without either, an MCP session (`Mcp-Session-Id`) runs in its own session `mcp-{id}`, whose kernels go when it ends; a session-less call (protocol 2026-07-28 and later) naming no session runs in the tenant's default session `mcp-default`.",
         "schema": {"type": "string", "pattern": "^[A-Za-z0-9._@:-]{1,128}$"}},
        {"name": "Kernelbox-Session", "in": "header", "required": false,
         "schema": {"type": "string", "pattern": "^[A-Za-z0-9._@:-]{1,128}$"}},
        {"name": "Mcp-Session-Id", "in": "header", "required": false,
         "description": "An MCP session opened by this tenant; another tenant's is 404.",
         "schema": {"type": "string"}}
    ]);
    let not_theirs = with(
        auth_errors,
        json!({"404": error_response("The Mcp-Session-Id names no MCP session of the caller's tenant (ended, idle past --mcp-idle-timeout, or another tenant's).")}),
    );
    let sse = json!({"text/event-stream": {"schema": {"type": "string"}}, "application/json": {"schema": {"type": "object"}}});
    json!({
        "post": {
            "summary": "MCP over streamable HTTP: one JSON-RPC message (initialize, tools/list, tools/call execute_code, ...).",
            "description": "Tools: `execute_code {code, reset?, timeout?}`: the cell's output as text content, each image it displayed as image content, `isError` when the cell did not succeed (traceback or kernelbox's message as text). Requests must accept both application/json and text/event-stream. A tenant holds at most --mcp-max-sessions MCP sessions (one more initialize is 429 `at_capacity`); a session with no request for --mcp-idle-timeout ends and its kernels go.",
            "parameters": session_params,
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object"}}}},
            "responses": with(&not_theirs, json!({
                "200": {"description": "The JSON-RPC answer, as an event stream or JSON.", "content": sse},
                "202": {"description": "A notification or response was accepted."},
                "413": error_response("Request body over 1 MiB."),
                "429": {
                    "description": "`at_capacity`: the tenant already holds --mcp-max-sessions MCP sessions.",
                    "headers": {"Retry-After": {"schema": {"type": "integer"}}},
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
                }
            }))
        },
        "get": {
            "summary": "An MCP session's event stream (server-to-client messages); it ends with the session.",
            "parameters": session_params,
            "responses": with(&not_theirs, json!({"200": {"description": "Server-sent events.", "content": {"text/event-stream": {"schema": {"type": "string"}}}}}))
        },
        "delete": {
            "summary": "End an MCP session; its kernels go with it.",
            "parameters": session_params,
            "responses": with(&not_theirs, json!({"200": {"description": "Not used: an ended session answers 204."}, "204": {"description": "The session ended."}}))
        }
    })
}

fn merge(into: &mut Value, from: &Value) {
    if let (Some(into), Some(from)) = (into.as_object_mut(), from.as_object()) {
        for (k, v) in from {
            into.insert(k.clone(), v.clone());
        }
    }
}

fn with(base: &Value, extra: Value) -> Value {
    let mut v = base.clone();
    merge(&mut v, &extra);
    v
}

/// The operator's routes (`api/admin.rs`, docs/console.md): whom a token is, and behind the
/// admin token every tenant's kernels a page at a time, the tenants, ending any session.
fn admin_paths() -> Value {
    let admin_errors = || {
        json!({
            "401": error_response("Missing or wrong admin token."),
            "404": error_response("No admin token configured (`--admin-token`).")
        })
    };
    let query = |name: &str, description: &str, schema: Value| json!({"name": name, "in": "query", "required": false, "description": description, "schema": schema});
    json!({
        "/v1/whoami": {
            "get": {
                "summary": "Whom the bearer token stands for: the admin token, or a tenant's (and which); whether the server is a cluster node.",
                "responses": {
                    "200": answer("The caller.", "Identity"),
                    "401": error_response("Missing or unknown bearer token.")
                }
            }
        },
        "/v1/admin/kernels": {
            "get": {
                "summary": "Every tenant's live kernels on this server, one page at a time, ordered by tenant, owner and generation (the admin token).",
                "parameters": [
                    query("offset", "Kernels skipped (default 0).", json!({"type": "integer", "minimum": 0})),
                    query("limit", &format!("Page size (default {}, at most {}).", wire::DEFAULT_KERNEL_PAGE, wire::MAX_KERNEL_PAGE), json!({"type": "integer", "minimum": 1, "maximum": wire::MAX_KERNEL_PAGE})),
                    query("tenant", "Only this tenant's.", json!({"type": "string"})),
                    query("state", "Only kernels in this state.", json!({"type": "string", "enum": ["starting", "idle", "busy"]})),
                    query("q", "Only kernels whose id, owner or a label contains this text.", json!({"type": "string", "maxLength": wire::MAX_KERNEL_SEARCH}))
                ],
                "responses": with(&admin_errors(), json!({
                    "200": answer("One page, and how many match.", "KernelPage"),
                    "400": error_response("`invalid_query`: an unknown parameter, or one out of bounds.")
                }))
            }
        },
        "/v1/admin/tenants": {
            "get": {
                "summary": "Every tenant: its live kernels on this server, its cap and reserved share, its cells since the server started; and the server's cap (the admin token).",
                "responses": with(&admin_errors(), json!({"200": answer("The tenants.", "TenantOverview")}))
            }
        },
        "/v1/admin/tenants/{tenant}/sessions/{session}": {
            "parameters": [
                {"name": "tenant", "in": "path", "required": true, "schema": {"type": "string"}},
                session_param()
            ],
            "delete": {
                "summary": "End any tenant's session, as the tenant's own DELETE /v1/sessions/{session} does (the admin token).",
                "responses": with(&admin_errors(), json!({
                    "200": answer("How many kernels were disposed of.", "Cleared"),
                    "400": error_response("`invalid_name`: a bad session name.")
                }))
            }
        }
    })
}

/// What happened lately (`api/recent.rs`, docs/console.md): sessions' kernel events, the
/// audit trail's tail, egress refusals; a tenant's own, or the admin token's every tenant's.
fn recent_paths() -> Value {
    let both = || {
        json!({
            "400": error_response("`invalid_query`: an unknown parameter, or `limit` out of bounds."),
            "401": error_response("Missing or unknown bearer token."),
            "403": error_response("`forbidden`: a tenant's token naming another tenant.")
        })
    };
    let params = json!([
        {"name": "limit", "in": "query", "required": false, "description": format!("Items answered, the most recent (default {}, at most {}).", wire::DEFAULT_RECENT, wire::MAX_RECENT), "schema": {"type": "integer", "minimum": 1, "maximum": wire::MAX_RECENT}},
        {"name": "tenant", "in": "query", "required": false, "description": "Only this tenant's (the admin token; a tenant's token may name only its own).", "schema": {"type": "string"}}
    ]);
    json!({
        "/v1/events": {
            "get": {
                "summary": "The sessions whose kernel lifecycle events changed last, the most recent first, each with its events (started, restored, hibernated, interrupted, ended, lost and why). A tenant's token: its own; the admin token: every tenant's.",
                "parameters": params.clone(),
                "responses": with(&both(), json!({"200": answer("The sessions.", "RecentSessions")}))
            }
        },
        "/v1/sessions/{session}/events": {
            "get": {
                "summary": "The session's recent kernel lifecycle events, oldest first (at most 32), and why its kernel was last lost. None kept: an empty list.",
                "parameters": [session_param()],
                "responses": {
                    "200": answer("The session's events.", "SessionEvents"),
                    "400": error_response("`invalid_name`: a bad session name."),
                    "401": error_response("Missing or unknown bearer token.")
                }
            }
        },
        "/v1/admin/tenants/{tenant}/sessions/{session}/events": {
            "parameters": [
                {"name": "tenant", "in": "path", "required": true, "schema": {"type": "string"}},
                session_param()
            ],
            "get": {
                "summary": "Any tenant's session's recent kernel lifecycle events (the admin token).",
                "responses": {
                    "200": answer("The session's events.", "SessionEvents"),
                    "400": error_response("`invalid_name`: a bad tenant or session name."),
                    "401": error_response("Missing or wrong admin token."),
                    "404": error_response("No admin token configured (`--admin-token`).")
                }
            }
        },
        "/v1/audit": {
            "get": {
                "summary": "The audit trail's last records (docs/usage.md, \"Audit trail\"), oldest first, read from the last 4 MiB of its current file: the code's hash always, the code only for a tenant that records it. A tenant's token: its own; the admin token: every tenant's.",
                "parameters": params.clone(),
                "responses": with(&both(), json!({
                    "200": answer("The records.", "AuditTail"),
                    "404": error_response("`no_audit_file`: the server writes no audit trail file."),
                    "503": error_response("`audit_unavailable`: the file could not be read.")
                }))
            }
        },
        "/v1/egress/refusals": {
            "get": {
                "summary": "The egress proxy's recent refusals (tenant, session, destination, reason), the most recent first; kept at most 200 per tenant and 2,000 per server. A tenant's token: its own; the admin token: every tenant's.",
                "parameters": params,
                "responses": with(&both(), json!({"200": answer("The refusals.", "EgressRefusals")}))
            }
        }
    })
}

/// The snapshot, restore and fork routes (`docs/snapshots.md`).
fn snapshot_paths(auth_errors: &Value) -> Value {
    let body = |name: &str| json!({"required": true, "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{name}")}}}});
    let id_param =
        json!([{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]);
    json!({
        "/v1/sessions/{session}/snapshots": {
            "post": {
                "summary": "Snapshots the session's kernel, idle or hibernated (runsc: its memory, variables, imports, /tmp and staging files; runc: its working directory's files only, `memory: false`); the kernel goes on. A kernel running a cell is waited for (bounded). An empty body is allowed.",
                "parameters": [session_param()],
                "requestBody": {"required": false, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SnapshotBody"}}}},
                "responses": with(auth_errors, json!({
                    "200": answer("The snapshot.", "SnapshotInfo"),
                    "404": error_response("`no_kernel`: the session has no kernel."),
                    "409": error_response("`session_busy`: the kernel stayed busy for as long as a snapshot waits; `snapshot_limit`: the tenant's count or bytes, or the host's bytes, would pass their bound (snapshots and forks being made counted)."),
                    "500": error_response("`snapshot_failed`: the checkpoint failed.")
                }))
            }
        },
        "/v1/snapshots": {
            "get": {
                "summary": "The caller's tenant's snapshots, oldest first.",
                "responses": with(auth_errors, json!({"200": answer("The snapshots.", "SnapshotList")}))
            }
        },
        "/v1/snapshots/{id}": {
            "parameters": id_param,
            "get": {
                "summary": "One of the caller's tenant's snapshots.",
                "responses": with(auth_errors, json!({
                    "200": answer("The snapshot.", "SnapshotInfo"),
                    "404": error_response("`snapshot_not_found`: none of this tenant's has that id.")
                }))
            },
            "delete": {
                "summary": "Deletes one of the caller's tenant's snapshots and its files.",
                "responses": with(auth_errors, json!({
                    "200": answer("Deleted (`deleted`: its id).", "Deleted"),
                    "404": error_response("`snapshot_not_found`: none of this tenant's has that id.")
                }))
            }
        },
        "/v1/sessions/{session}/restore": {
            "post": {
                "summary": "Starts the session, which has no kernel, from one of the tenant's snapshots: a new kernel (generation 1) with the snapshot's state.",
                "parameters": [session_param()],
                "requestBody": body("RestoreBody"),
                "responses": with(auth_errors, json!({
                    "200": answer("The session and its kernel.", "ForkOutcome"),
                    "404": error_response("`snapshot_not_found`."),
                    "409": error_response("`session_exists`: the session has a kernel."),
                    "429": error_response("`at_capacity`: the new kernel would pass a cap."),
                    "500": error_response("`restore_failed`: nothing of it is left.")
                }))
            }
        },
        "/v1/sessions/{session}/fork": {
            "post": {
                "summary": "Snapshots the session's kernel once (idle or hibernated; it goes on) and starts new sessions from it in parallel: `count` (named `<session>-fork-<n>-<hex>`) or `sessions`. Each fork succeeds or fails on its own.",
                "parameters": [session_param()],
                "requestBody": body("ForkBody"),
                "responses": with(auth_errors, json!({
                    "200": answer("The forks, in order, each with its kernel or its error.", "ForkResult"),
                    "400": error_response("`invalid_request`: not exactly one of `count` and `sessions`, or not 1 to 16 new distinct sessions."),
                    "404": error_response("`no_kernel`: the session has no kernel."),
                    "409": error_response("`session_busy`, or `snapshot_limit` (the fork's checkpoint is counted by the tenant's count and byte bounds).")
                }))
            }
        }
    })
}

/// The background process routes (`docs/processes.md`, `api/processes.rs`).
fn process_paths(auth_errors: &Value) -> Value {
    let id_param = json!({
        "name": "id", "in": "path", "required": true,
        "description": "The process's id in the session (`ProcessInfo.id`).",
        "schema": {"type": "integer", "format": "int64", "minimum": 0}
    });
    let params = json!([session_param(), id_param]);
    let info = |description: &str| answer(description, "ProcessInfo");
    let common = with(
        auth_errors,
        json!({
            "400": error_response("`invalid_name`: a bad session name; `invalid_path`: an id that is not a number."),
            "404": error_response("`no_process`: the session has no process of that id (never started, ended and forgotten, or another tenant's)."),
        }),
    );
    let retry = |description: &str| {
        json!({
            "description": description,
            "headers": {"Retry-After": {"schema": {"type": "integer"}}},
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
        })
    };
    json!({
        "/v1/sessions/{session}/processes": {
            "post": {
                "summary": "Start a background process in the session's kernel container (the kernel started when the session has none), beside its cells, as the kernel's user, with no deadline of its own: it runs until it ends, is killed, or its kernel goes.",
                "parameters": [session_param()],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ProcessRequest"}}}},
                "responses": with(auth_errors, json!({
                    "200": info("The process, running."),
                    "400": error_response("`invalid_process`: an empty command, a bad environment variable or working directory; `invalid_name`, `invalid_json`."),
                    "404": error_response("`no_kernel`: the kernel went before the process could start."),
                    "413": error_response("Request body over 1 MiB."),
                    "429": retry("`too_many_processes`: the session runs 16, the tenant 64 or the host 512 processes; `at_capacity`, `session_busy` as for an execute."),
                    "503": error_response("`engine_unavailable`: the Docker engine failed; or the server is shutting down.")
                }))
            },
            "get": {
                "summary": "The session's background processes, running and recently ended, oldest first.",
                "parameters": [session_param()],
                "responses": with(auth_errors, json!({
                    "200": answer("The processes.", "ProcessList"),
                    "400": error_response("`invalid_name`: a bad session name.")
                }))
            }
        },
        "/v1/sessions/{session}/processes/{id}": {
            "get": {
                "summary": "One background process: its pid, whether it runs, its exit code once it ended.",
                "parameters": params.clone(),
                "responses": with(&common, json!({"200": info("The process.")}))
            },
            "delete": {
                "summary": "Kill a background process and everything it started (its leader's whole tree), waiting (10 s at most) for it to end; nothing to do once it ended.",
                "parameters": params.clone(),
                "responses": with(&common, json!({
                    "200": info("The process, ended unless it outlived the wait."),
                    "409": retry("`process_starting`: it has not said its pid yet; retry."),
                    "503": error_response("`engine_unavailable`: the Docker engine failed.")
                }))
            }
        },
        "/v1/sessions/{session}/processes/{id}/output": {
            "get": {
                "summary": "A background process's output as NDJSON: what is kept of it (its newest 256 KiB) first, then live, then `exit` once it ended (the stream ends there). A client that goes away stops reading, not the process.",
                "parameters": params.clone(),
                "responses": with(&common, json!({
                    "200": {"description": "One event a line.", "content": {"application/x-ndjson": {"schema": {"$ref": "#/components/schemas/ProcessEvent"}}}},
                    "429": retry("`too_many_readers`: the process has 8 readers of its output already.")
                }))
            }
        },
        "/v1/sessions/{session}/processes/{id}/stdin": {
            "post": {
                "summary": "Write the request's body, as it is, on the process's stdin (started with `stdin: true`).",
                "parameters": params.clone(),
                "requestBody": {"required": true, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                "responses": with(&common, json!({
                    "200": answer("Written.", "StdinWritten"),
                    "409": error_response("`stdin_closed`: its stdin is closed (never opened, closed, or the process ended); `stdin_stuck`: the process did not take the write within 10 s."),
                    "413": error_response("`payload_too_large`: a write is at most 1 MiB.")
                }))
            },
            "delete": {
                "summary": "Close the process's stdin (end of file).",
                "parameters": params.clone(),
                "responses": with(&common, json!({
                    "200": info("The process, its stdin closed."),
                    "409": error_response("`stdin_stuck`: the process did not take what was written before within 10 s.")
                }))
            }
        },
        "/v1/sessions/{session}/processes/{id}/signal": {
            "post": {
                "summary": "Send a signal to the process's command (its process group); nothing to do once it ended.",
                "parameters": params,
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SignalBody"}}}},
                "responses": with(&common, json!({
                    "200": info("The process."),
                    "400": error_response("`invalid_signal`: not one of the signals a process may be sent; `invalid_json`."),
                    "409": retry("`process_starting`: it has not said its pid yet; retry."),
                    "503": error_response("`engine_unavailable`: the Docker engine failed.")
                }))
            }
        }
    })
}

/// `POST /v1/admin/reload` (its own `json!`, past the macro's recursion limit otherwise).
fn reload_path() -> Value {
    json!({
        "post": {
            "summary": "Re-read the tenants source and apply it without a restart (docs/http-api.md, \"Reloading the tenants\"). The admin token (`--admin-token`); 404 on a server without one or without a tenants source.",
            "responses": {
                "200": {"description": "Applied: the tenants added, removed and changed, the kernels removed, the egress connections closed, the settings that need a restart.", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["applied", "added", "removed", "changed", "kernels_removed", "connections_closed", "needs_restart"],
                    "properties": {
                        "applied": {"type": "boolean"}, "reason": {"type": "string"},
                        "added": {"type": "array", "items": {"type": "string"}},
                        "removed": {"type": "array", "items": {"type": "string"}},
                        "changed": {"type": "array", "items": {"type": "string"}},
                        "kernels_removed": {"type": "integer"},
                        "connections_closed": {"type": "integer"},
                        "needs_restart": {"type": "array", "items": {"type": "string"}}
                    }
                }}}},
                "401": error_response("Missing or wrong admin token."),
                "404": error_response("No admin token or no tenants source configured."),
                "422": {"description": "Refused: the running tenants are kept; `reason` says why (the same body, `applied` false).", "content": {"application/json": {"schema": {"type": "object"}}}}
            }
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_execute_body_is_described_from_its_wire_type() {
        let spec = super::spec();
        let body = &spec["components"]["schemas"]["ExecuteRequest"];
        assert_eq!(body["required"], serde_json::json!(["code"]));
        assert_eq!(body["additionalProperties"], false);
        let props = &body["properties"];
        let names: std::collections::BTreeSet<_> = props
            .as_object()
            .into_iter()
            .flatten()
            .map(|p| p.0.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "child", "code", "context", "language", "network", "reset", "task_id", "timeout",
                "tools"
            ]
            .into()
        );
        assert_eq!(
            props["timeout"]["type"],
            serde_json::json!(["number", "null"])
        );
        assert_eq!(props["timeout"]["exclusiveMinimum"], 0);
        assert!(props["timeout"]["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("Cell timeout in seconds")));
        assert_eq!(props["task_id"]["maxLength"], 256);
        assert_eq!(props["reset"]["default"], false);
        assert_eq!(
            props["code"]["description"],
            "Source of the cell, in `language`."
        );
        // The one policy type: the execute body's `network` and the PUT's body.
        assert!(
            props["network"].to_string().contains("NetworkPolicy"),
            "{props}"
        );
        let put = &spec["paths"]["/v1/sessions/{session}/network"]["put"];
        assert_eq!(
            put["requestBody"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/NetworkPolicy"
        );
        let policy = &spec["components"]["schemas"]["NetworkPolicy"];
        assert_eq!(policy["additionalProperties"], false);
    }

    #[test]
    fn a_field_the_server_may_omit_is_optional_and_the_unions_are_named() {
        let spec = super::spec();
        let schemas = &spec["components"]["schemas"];
        // Skipped when empty: not required (a generated client must not demand it).
        let kernel = &schemas["KernelSummary"];
        let required: Vec<&str> = kernel["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str())
            .collect();
        assert!(!required.contains(&"labels") && !required.contains(&"child"));
        assert!(required.contains(&"id") && required.contains(&"idle_seconds"));
        // Each event a named schema, its `event` a const; the union a oneOf of their
        // references with a discriminator.
        for (union, first) in [
            ("StreamEvent", "OutputEvent"),
            ("CommandEvent", "StdoutEvent"),
        ] {
            let u = &schemas[union];
            assert_eq!(u["discriminator"]["propertyName"], "event");
            let mapping = u["discriminator"]["mapping"]
                .as_object()
                .expect("a mapping");
            for (event, target) in mapping {
                let name = target.as_str().unwrap_or_default().rsplit('/').next();
                let named = &schemas[name.unwrap_or_default()];
                assert_eq!(named["properties"]["event"]["const"], event.as_str());
                assert_eq!(named["required"][0], "event");
            }
            assert_eq!(
                u["oneOf"][0]["$ref"],
                format!("#/components/schemas/{first}").as_str()
            );
            assert_eq!(u["oneOf"].as_array().map(Vec::len), Some(mapping.len()));
        }
        // An enumeration is an `enum` of strings, its values described.
        assert_eq!(
            schemas["CellStatus"]["enum"],
            serde_json::json!(["success", "error", "timeout", "interrupted"])
        );
        assert!(schemas["CellStatus"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("`interrupted`: The caller interrupted the cell")));
    }

    #[test]
    fn a_type_both_read_and_answered_is_described_the_same_both_ways() {
        let (read, sent) = super::definitions();
        let both: Vec<&String> = read.keys().filter(|k| sent.contains_key(*k)).collect();
        assert!(both.iter().any(|k| *k == "SessionSettings"), "{both:?}");
        for name in both {
            assert_eq!(read[name], sent[name], "{name} read and sent differ");
        }
    }

    #[test]
    fn every_route_is_described() {
        let spec = super::spec();
        for (method, path) in super::super::ROUTES {
            let op = &spec["paths"][path][method.to_ascii_lowercase()];
            assert!(op.is_object(), "{method} {path} missing from the spec");
            // A PUT creates (a file), except a session's network policy and settings, which
            // are set.
            let success = if *method == "PUT"
                && !path.ends_with("/network")
                && !path.ends_with("/settings")
            {
                "201"
            } else {
                "200"
            };
            assert!(
                op["responses"][success].is_object(),
                "{method} {path} has no {success}"
            );
        }
        let paths = spec["paths"].as_object().map(|p| p.len()).unwrap_or(0);
        // Every $ref points at a schema that exists.
        let text = spec.to_string();
        for piece in text.split("\"#/components/schemas/").skip(1) {
            let name = piece.split(['"', '/']).next().unwrap_or_default();
            assert!(
                spec["components"]["schemas"][name].is_object(),
                "dangling $ref to {name}"
            );
        }
        // Rich results: in the result and as stream events.
        let schemas = &spec["components"]["schemas"];
        assert_eq!(
            schemas["CellResult"]["properties"]["results"]["items"]["$ref"],
            "#/components/schemas/RichResult"
        );
        assert!(schemas["RichResult"]["properties"]["is_main_result"].is_object());
        let distinct: std::collections::BTreeSet<_> =
            super::super::ROUTES.iter().map(|r| r.1).collect();
        assert_eq!(
            paths,
            distinct.len(),
            "the spec describes a route the server lacks"
        );
    }
}
