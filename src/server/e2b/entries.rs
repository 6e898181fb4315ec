//! What envd's filesystem calls and its watchers share (`filesystem.rs`, `watch.rs`): an
//! entry as envd describes it, a file call's error as a Connect error, a stat and a bounded
//! walk of a directory tree through the orchestrator's file calls.

// A Connect error is the HTTP response itself, built once on the refusal path and answered
// as is: boxing it would only add an allocation.
#![allow(clippy::result_large_err)]

use std::collections::VecDeque;

use axum::response::Response;
use serde::Serialize;

use super::envd::e2b_path;
use super::interpreter::HOME;
use super::rpc::{self, error, from_api};
use super::E2bError;
use crate::files::{FileEntry, FileOp, FileOpDone, FilePath, TransferError};
use crate::orchestrator::{FileError, FileRequest};
use crate::server::{ApiError, AppState};

/// envd's `filesystem.EntryInfo` in Connect's JSON mapping.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EntryInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    /// An int64, which Connect's JSON mapping writes as a string.
    size: String,
    mode: u32,
    permissions: &'static str,
    owner: &'static str,
    group: &'static str,
    modified_time: String,
    is_symlink: bool,
}

/// An entry as envd describes it. The helper's entries carry no mode bits: a file is
/// `0o644`, a directory `0o755`, as a kernel's files are made (the owner is the kernel's
/// user, named `user` as E2B names it).
pub(crate) fn entry_info(path: &FilePath, entry: &FileEntry) -> EntryInfo {
    let (kind, mode, permissions) = match entry.kind.as_str() {
        "file" => ("FILE_TYPE_FILE", 0o644, "-rw-r--r--"),
        "dir" => ("FILE_TYPE_DIRECTORY", 0o755, "drwxr-xr-x"),
        "symlink" => ("FILE_TYPE_SYMLINK", 0o777, "Lrwxrwxrwx"),
        _ => ("FILE_TYPE_UNSPECIFIED", 0o644, "?rw-r--r--"),
    };
    let name = if path.is_root() {
        HOME.rsplit('/').next().unwrap_or_default().to_owned()
    } else {
        entry.name.clone()
    };
    EntryInfo {
        name,
        kind,
        path: e2b_path(path),
        size: entry.size.to_string(),
        mode,
        permissions,
        owner: "user",
        group: "user",
        modified_time: entry.modified.clone(),
        is_symlink: entry.kind == "symlink",
    }
}

/// A file call's error as a Connect error.
pub(super) fn file_error(e: FileError) -> Response {
    match e {
        FileError::Transfer(TransferError::NotFound(message))
        | FileError::NoKernel { owner: message } => error("not_found", message),
        FileError::Transfer(TransferError::Refused { code, message }) => {
            error("invalid_argument", format!("{code}: {message}"))
        }
        e => from_api(ApiError::from(e)),
    }
}

/// An [`E2bError`] (a refused path) as a Connect error.
pub(super) fn e2b_to_connect(e: E2bError) -> Response {
    error(rpc::code_of(e.status), e.message)
}

/// `name` inside the directory `dir`.
pub(crate) fn child(dir: &FilePath, name: &str) -> Option<FilePath> {
    let joined = if dir.is_root() {
        name.to_owned()
    } else {
        format!("{}/{name}", dir.as_str())
    };
    FilePath::parse(&joined).ok()
}

/// The entry at `path` (starting the sandbox's kernel when it has none).
pub(crate) async fn stat(
    state: &AppState,
    request: &FileRequest,
    path: &FilePath,
) -> Result<FileEntry, FileError> {
    match state
        .orchestrator()
        .manage_file(request, path, FileOp::Stat)
        .await?
    {
        FileOpDone::Entry(entry) => Ok(entry),
        _ => Err(FileError::Transfer(TransferError::Helper(
            "a stat without its entry".into(),
        ))),
    }
}

/// The entries under the directory `dir`, `depth` levels down (1: its own), breadth first,
/// at most `max` entries and `max_dirs` directories read; whether it was cut.
pub(crate) async fn walk(
    state: &AppState,
    request: &FileRequest,
    dir: &FilePath,
    depth: u32,
    max: usize,
    max_dirs: usize,
) -> Result<(Vec<(FilePath, FileEntry)>, bool), FileError> {
    let mut found = Vec::new();
    let mut queue = VecDeque::from([(dir.clone(), 1u32)]);
    let mut read = 0usize;
    while let Some((path, level)) = queue.pop_front() {
        if read == max_dirs {
            return Ok((found, true));
        }
        read += 1;
        let listing = match state.orchestrator().list_files(request, &path).await {
            Ok(listing) => listing,
            // A subdirectory gone (or replaced) since its parent was read: skipped.
            Err(FileError::Transfer(
                TransferError::NotFound(_) | TransferError::Refused { .. },
            )) if path != *dir => continue,
            Err(e) => return Err(e),
        };
        let mut cut = listing.truncated;
        for entry in listing.entries {
            if found.len() == max {
                cut = true;
                break;
            }
            let Some(at) = child(&path, &entry.name) else {
                continue;
            };
            if entry.kind == "dir" && level < depth {
                queue.push_back((at.clone(), level + 1));
            }
            found.push((at, entry));
        }
        if cut {
            return Ok((found, true));
        }
    }
    Ok((found, false))
}
