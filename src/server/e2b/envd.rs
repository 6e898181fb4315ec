//! envd's HTTP part (`E2b-Sandbox-Port: 49983`): `GET /files` (a download), `POST /files`
//! (multipart or octet-stream uploads), `GET /health`; its Connect RPC services are
//! `connect.rs` (processes) and `filesystem.rs`.
//!
//! Paths: E2B's home directory `/home/user` (and a relative path, which E2B resolves there)
//! is the session's working directory, `/work` in the kernel, where the kernel's cells run;
//! `/work/...` is taken as itself. Other absolute paths are refused until kernelbox reaches
//! files outside `/work` (docs/e2b.md, "Files"). Every path is then checked by
//! [`FilePath::parse`], as the native file API checks it.
//!
//! Bounds: an upload is streamed to the kernel (never held whole), each file at most the
//! server's upload cap (`files.max_upload_bytes`), at most [`MAX_FILES_PER_UPLOAD`] files and
//! the cap times that in one request; a download is streamed from the kernel.

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures::{StreamExt, TryStreamExt};

use super::interpreter::HOME;
use super::wire::{self, WrittenEntry};
use super::{E2bError, Facade, InSandbox};
use crate::files::{Download, FilePath};
use crate::server::api::file_request;
use crate::server::{ApiError, AppState};

/// Files one `POST /files` may carry.
pub(crate) const MAX_FILES_PER_UPLOAD: u64 = 64;

/// The headers carrying an upload's file metadata (envd 0.6.2), which kernelbox does not keep.
const METADATA_HEADER_PREFIX: &str = "x-metadata-";

/// The kernel's working directory, as the native file API's paths are relative to it.
const WORK: &str = "/work";

fn under<'a>(path: &'a str, dir: &str) -> Option<&'a str> {
    if path == dir {
        return Some("");
    }
    path.strip_prefix(dir)?.strip_prefix('/')
}

/// An E2B path as the native file API's path (relative to `/work`).
pub(crate) fn native_path(path: &str) -> Result<FilePath, E2bError> {
    let relative = if let Some(rest) = under(path, HOME) {
        rest
    } else if let Some(rest) = under(path, WORK) {
        rest
    } else if path.starts_with('/') {
        return Err(E2bError::bad_request(format!(
            "{path:?} is outside {HOME}: kernelbox's sandboxes reach files under {HOME} (docs/e2b.md, \"Files\")"
        )));
    } else if let Some(rest) = path.strip_prefix("~/") {
        rest
    } else {
        path
    };
    FilePath::parse(relative).map_err(|e| E2bError::from(ApiError::from(e)))
}

/// A native path as E2B names it.
pub(crate) fn e2b_path(path: &FilePath) -> String {
    let inside = path.in_kernel();
    match under(&inside, WORK) {
        Some("") => HOME.to_owned(),
        Some(rest) => format!("{HOME}/{rest}"),
        None => inside,
    }
}

fn query(q: Result<Query<wire::FilesQuery>, QueryRejection>) -> Result<wire::FilesQuery, E2bError> {
    q.map(|Query(q)| q)
        .map_err(|e| E2bError::bad_request(e.body_text()))
}

fn user(q: &wire::FilesQuery) -> Result<(), E2bError> {
    match q.username.as_deref() {
        None | Some("user") | Some("") => Ok(()),
        Some(other) => Err(E2bError::bad_request(format!(
            "user {other:?} is not available: kernelbox's sandboxes have the one user \"user\""
        ))),
    }
}

/// `GET /files?path=`: the file's bytes.
pub(super) async fn read(
    State(state): State<AppState>,
    call: InSandbox,
    q: Result<Query<wire::FilesQuery>, QueryRejection>,
) -> Result<Response, E2bError> {
    let q = query(q)?;
    user(&q)?;
    let asked = q.path.as_deref().unwrap_or_default();
    let path = native_path(asked)?;
    if state.is_draining() {
        return Err(ApiError::shutting_down().into());
    }
    let request = file_request(&call.tenant, call.id, None);
    let download = state
        .orchestrator()
        .read_file(&request, &path, false)
        .await
        .map_err(ApiError::from)?;
    match download {
        Download::File { size, body } => {
            let mut response =
                Body::from_stream(body.map_err(std::io::Error::other)).into_response();
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            Ok(response)
        }
        Download::Dir(_) | Download::Tar { .. } => {
            Err(E2bError::bad_request(format!("{asked:?} is a directory")))
        }
    }
}

/// `POST /files[?path=]`: each file of a multipart body (named by `path` when it is the only
/// one, else by its part's file name), or the octet-stream body at `path`; answers what was
/// written.
pub(super) async fn write(
    State(state): State<AppState>,
    call: InSandbox,
    q: Result<Query<wire::FilesQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Vec<WrittenEntry>>, E2bError> {
    let q = query(q)?;
    user(&q)?;
    if headers
        .keys()
        .any(|k| k.as_str().starts_with(METADATA_HEADER_PREFIX))
    {
        return Err(E2bError::not_available(
            "file metadata (extended attributes set by an upload)",
        ));
    }
    if state.is_draining() {
        return Err(ApiError::shutting_down().into());
    }
    let cap = state.orchestrator().config().files.max_upload_bytes;
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let request = file_request(&call.tenant, call.id, None);
    let orchestrator = state.orchestrator().clone();
    let mut written = Vec::new();
    let entry = |path: &FilePath| WrittenEntry {
        name: path
            .in_kernel()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_owned(),
        kind: "file",
        path: e2b_path(path),
    };
    if !content_type.starts_with("multipart/form-data") {
        let path = native_path(q.path.as_deref().unwrap_or_default())?;
        let stream = body
            .into_data_stream()
            .map_err(std::io::Error::other)
            .boxed();
        orchestrator
            .write_file(&request, &path, false, stream)
            .await
            .map_err(ApiError::from)?;
        written.push(entry(&path));
    } else {
        let boundary = multer::parse_boundary(content_type)
            .map_err(|e| E2bError::bad_request(format!("the multipart body: {e}")))?;
        let limits = multer::SizeLimit::new()
            .per_field(cap)
            .whole_stream(cap.saturating_mul(MAX_FILES_PER_UPLOAD));
        let mut parts = multer::Multipart::with_constraints(
            body.into_data_stream(),
            boundary,
            multer::Constraints::new().size_limit(limits),
        );
        let mut count = 0u64;
        while let Some(field) = parts
            .next_field()
            .await
            .map_err(|e| E2bError::bad_request(format!("the multipart body: {e}")))?
        {
            count += 1;
            if count > MAX_FILES_PER_UPLOAD {
                return Err(E2bError::bad_request(format!(
                    "one upload carries at most {MAX_FILES_PER_UPLOAD} files"
                )));
            }
            let name = match (&q.path, field.file_name()) {
                (Some(path), _) if count == 1 => path.clone(),
                (_, Some(name)) => name.to_owned(),
                (_, None) => {
                    return Err(E2bError::bad_request(
                        "a multipart part without a file name, and no path",
                    ))
                }
            };
            let path = native_path(&name)?;
            let stream = field.map_err(std::io::Error::other).boxed();
            orchestrator
                .write_file(&request, &path, false, stream)
                .await
                .map_err(ApiError::from)?;
            written.push(entry(&path));
        }
    }
    if !state.inner.tenants.holds(&call.tenant) {
        return Err(E2bError::unauthorized());
    }
    Ok(Json(written))
}

/// `GET /health`: 204 while the sandbox named by the request exists, 502 once it is gone (the
/// SDK's `is_running` reads a 502 as "not running").
pub(super) async fn health(
    Extension(facade): Extension<Facade>,
    headers: HeaderMap,
) -> Result<StatusCode, E2bError> {
    let id = headers
        .get(super::SANDBOX_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if facade.exists(id) {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(E2bError::new(
            StatusCode::BAD_GATEWAY,
            format!("sandbox {id:?} is not running"),
        ))
    }
}
