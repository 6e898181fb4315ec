//! envd's `filesystem.Filesystem` over Connect (JSON codec): Stat, ListDir (with its depth),
//! MakeDir, Move, Remove, and watching a directory: WatchDir (a server stream) and the
//! polled watcher (CreateWatcher, GetWatcherEvents, RemoveWatcher), which `watch.rs` keeps.
//!
//! Every call goes through the orchestrator's file calls, so through the kernel's file helper
//! (`runner/file_helper.py`: paths walked one name at a time from the working directory, a
//! symlink never followed), never through a host path. Paths are the facade's
//! (`envd::native_path`: `/home/user`, `~/` and relative paths are the kernel's working
//! directory; anything else is refused). A call on a sandbox whose kernel is not running
//! starts it, as an upload does (`Orchestrator::manage_file`).
//!
//! Bounds: a listing is at most [`MAX_LISTED`] entries and [`MAX_LISTED_DIRS`] directories
//! read, whatever its depth (a deeper tree is cut, the rest not listed); a request is at most
//! the API's body limit; the watchers' bounds are in `watch.rs`.

// A Connect error is the HTTP response itself, built once on the refusal path and answered
// as is: boxing it would only add an allocation.
#![allow(clippy::result_large_err)]

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;

use super::entries::{e2b_to_connect, entry_info, file_error, stat, walk, EntryInfo};
use super::envd::native_path;
use super::rpc::{self, error, from_api, unary_ok};
use super::watch::{self, Watchers};
use super::{Facade, InSandbox};
use crate::files::{FileOp, FileOpDone, FilePath, TransferError};
use crate::orchestrator::FileError;
use crate::server::api::file_request;
use crate::server::{ApiError, AppState};

/// Entries one listing answers at most (its depth included).
pub(crate) const MAX_LISTED: usize = 10_000;
/// Directories one listing reads at most (its depth included).
pub(crate) const MAX_LISTED_DIRS: usize = 512;

/// `{"path"}`: Stat, MakeDir, Remove.
#[derive(Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Deserialize)]
struct ListDirRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: u32,
}

#[derive(Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

fn path_of(path: &str) -> Result<FilePath, Response> {
    native_path(path).map_err(e2b_to_connect)
}

/// `POST /filesystem.Filesystem/{method}`.
pub(super) async fn filesystem(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    Extension(watchers): Extension<Watchers>,
    call: InSandbox,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if state.is_draining() {
        return from_api(ApiError::shutting_down());
    }
    let request = file_request(&call.tenant, call.id.clone(), None);
    if method == "WatchDir" {
        let asked: watch::WatchRequest =
            match rpc::stream_request(&state, &call, &headers, body, "filesystem.WatchDirRequest")
                .await
            {
                Ok(a) => a,
                Err(e) => return e,
            };
        let deadline = rpc::client_deadline(&headers);
        return watchers
            .stream(&state, &facade, &call, request, asked, deadline)
            .await;
    }
    let bytes = match rpc::unary_body(&state, &call, &headers, body).await {
        Ok(b) => b,
        Err(e) => return e,
    };
    match method.as_str() {
        "Stat" => {
            let asked: PathRequest = match rpc::parse(&bytes, "filesystem.StatRequest") {
                Ok(a) => a,
                Err(e) => return e,
            };
            let path = match path_of(&asked.path) {
                Ok(p) => p,
                Err(e) => return e,
            };
            match stat(&state, &request, &path).await {
                Ok(entry) => unary_ok(serde_json::json!({"entry": entry_info(&path, &entry)})),
                Err(e) => file_error(e),
            }
        }
        "ListDir" => {
            let asked: ListDirRequest = match rpc::parse(&bytes, "filesystem.ListDirRequest") {
                Ok(a) => a,
                Err(e) => return e,
            };
            let path = match path_of(&asked.path) {
                Ok(p) => p,
                Err(e) => return e,
            };
            match stat(&state, &request, &path).await {
                Ok(entry) if entry.kind == "dir" => {}
                Ok(_) => {
                    return error(
                        "invalid_argument",
                        format!("path {:?} is not a directory", asked.path),
                    )
                }
                Err(e) => return file_error(e),
            }
            let depth = asked.depth.max(1);
            match walk(&state, &request, &path, depth, MAX_LISTED, MAX_LISTED_DIRS).await {
                Ok((mut found, _cut)) => {
                    found.sort_by(|a, b| a.0.parts().cmp(b.0.parts()));
                    let entries: Vec<EntryInfo> =
                        found.iter().map(|(p, e)| entry_info(p, e)).collect();
                    unary_ok(serde_json::json!({"entries": entries}))
                }
                Err(e) => file_error(e),
            }
        }
        "MakeDir" => {
            let asked: PathRequest = match rpc::parse(&bytes, "filesystem.MakeDirRequest") {
                Ok(a) => a,
                Err(e) => return e,
            };
            let path = match path_of(&asked.path) {
                Ok(p) => p,
                Err(e) => return e,
            };
            match state
                .orchestrator()
                .manage_file(&request, &path, FileOp::MakeDir)
                .await
            {
                Ok(FileOpDone::Created(false)) => error(
                    "already_exists",
                    format!("directory {:?} already exists", asked.path),
                ),
                Ok(_) => match stat(&state, &request, &path).await {
                    Ok(entry) => unary_ok(serde_json::json!({"entry": entry_info(&path, &entry)})),
                    Err(e) => file_error(e),
                },
                Err(e) => file_error(e),
            }
        }
        "Move" => {
            let asked: MoveRequest = match rpc::parse(&bytes, "filesystem.MoveRequest") {
                Ok(a) => a,
                Err(e) => return e,
            };
            let (from, to) = match (path_of(&asked.source), path_of(&asked.destination)) {
                (Ok(from), Ok(to)) => (from, to),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            match state
                .orchestrator()
                .manage_file(&request, &from, FileOp::Move(to.clone()))
                .await
            {
                Ok(_) => match stat(&state, &request, &to).await {
                    Ok(entry) => unary_ok(serde_json::json!({"entry": entry_info(&to, &entry)})),
                    Err(e) => file_error(e),
                },
                Err(e) => file_error(e),
            }
        }
        "Remove" => {
            let asked: PathRequest = match rpc::parse(&bytes, "filesystem.RemoveRequest") {
                Ok(a) => a,
                Err(e) => return e,
            };
            let path = match path_of(&asked.path) {
                Ok(p) => p,
                Err(e) => return e,
            };
            // envd removes as `rm -rf` does: a path that is not there is no error.
            match state.orchestrator().remove_file(&request, &path).await {
                Ok(())
                | Err(FileError::NoKernel { .. })
                | Err(FileError::Transfer(TransferError::NotFound(_))) => {
                    unary_ok(serde_json::json!({}))
                }
                Err(e) => file_error(e),
            }
        }
        "CreateWatcher" => {
            let asked: watch::WatchRequest =
                match rpc::parse(&bytes, "filesystem.CreateWatcherRequest") {
                    Ok(a) => a,
                    Err(e) => return e,
                };
            watchers
                .create(&state, &facade, &call, request, asked)
                .await
        }
        "GetWatcherEvents" => {
            let asked: watch::WatcherId =
                match rpc::parse(&bytes, "filesystem.GetWatcherEventsRequest") {
                    Ok(a) => a,
                    Err(e) => return e,
                };
            watchers.events(&state, &call, &asked.watcher_id).await
        }
        "RemoveWatcher" => {
            let asked: watch::WatcherId =
                match rpc::parse(&bytes, "filesystem.RemoveWatcherRequest") {
                    Ok(a) => a,
                    Err(e) => return e,
                };
            watchers.remove(&call, &asked.watcher_id)
        }
        other => rpc::unimplemented(&format!("filesystem.Filesystem/{other}")),
    }
}
