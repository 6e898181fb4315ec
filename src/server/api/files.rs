//! `/v1/sessions/{session}/files[/{path}]`: files in and out of a session's kernel, streamed
//! both ways (docs/files.md "Files in and out of a kernel"). `PUT` writes (a tar with
//! `Content-Type: application/x-tar` extracts into a directory), `GET` reads (a directory is
//! listed, or with `Accept: application/x-tar` streamed as a tar), `DELETE` removes;
//! `?child=NAME` addresses a delegated child's kernel.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;

use super::{invalid, name, path_error, Caller};
use crate::files::{ByteStream, Download, FilePath};
use crate::orchestrator::{FileRequest, Scope};
use crate::server::error::ApiError;
use crate::server::tenants::Tenant;
use crate::server::AppState;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileQuery {
    #[serde(default)]
    child: Option<String>,
}

/// The session and path of a request, checked; `path` is `""` for the working directory.
type Target = (String, String);

fn target(state: &AppState, path: Result<Path<Target>, PathRejection>) -> Result<Target, ApiError> {
    let Path((session, path)) = path.map_err(|e| invalid(state, path_error(e)))?;
    name("session", &session).map_err(|e| invalid(state, e))?;
    Ok((session, path))
}

fn root_target(
    state: &AppState,
    path: Result<Path<String>, PathRejection>,
) -> Result<Target, ApiError> {
    let session = super::one_name(state, path)?;
    Ok((session, String::new()))
}

fn request(
    state: &AppState,
    tenant: &Tenant,
    session: String,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<FileRequest, ApiError> {
    let Query(query) =
        query.map_err(|e| invalid(state, ApiError::bad_request("invalid_query", e.body_text())))?;
    if let Some(child) = &query.child {
        name("child", child).map_err(|e| invalid(state, e))?;
    }
    if state.is_draining() {
        return Err(ApiError::shutting_down());
    }
    Ok(file_request(tenant, session, query.child))
}

/// The file request of `tenant` for `session` (or its delegated `child`): its image, tools and
/// limits, as for its cells. Also what `/v1/mcp`'s file tools use.
pub(crate) fn file_request(tenant: &Tenant, session: String, child: Option<String>) -> FileRequest {
    FileRequest::new(kernel_scope(tenant, session, child))
}

/// The kernel of `tenant`'s `session` (or its delegated `child`) as a file call or a command
/// names it: the image, tools and limits a cell with no `tools` of its own gets, so that a
/// kernel one of them starts is the one the session's next cell reuses.
pub(crate) fn kernel_scope(tenant: &Tenant, session: String, child: Option<String>) -> Scope {
    Scope {
        tenant: Some(tenant.name.clone()),
        session,
        child,
        image: tenant.image.clone(),
        tools: tenant
            .tools
            .as_ref()
            .map(|t| t.allow.clone())
            .unwrap_or_default(),
        tenant_limits: tenant.limits(),
        context: Default::default(),
    }
}

fn header_says(headers: &HeaderMap, name: header::HeaderName, what: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains(what))
}

/// An upload whose declared length is past the cap, refused before any kernel is touched.
fn refuse_declared_too_large(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let cap = state.inner.orchestrator.config().files.max_upload_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > cap) {
        state.inner.metrics.rejected("too_large");
        return Err(crate::files::TransferError::TooLarge { cap }.into());
    }
    Ok(())
}

/// The body of `tenant`'s upload, streamed: when it ends after a reload removed the tenant
/// or rotated its token, it ends in an error instead, so that the upload is never committed
/// (the helper commits only on a clean end: docs/files.md; docs/http-api.md, "Reloading
/// the tenants").
fn upload_body(state: &AppState, tenant: &Arc<Tenant>, body: Body) -> ByteStream {
    let (state, tenant) = (state.clone(), tenant.clone());
    let end = futures::stream::once(async move {
        (!state.inner.tenants.holds(&tenant)).then(|| {
            Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "the tenant was removed or its token rotated during the upload",
            ))
        })
    })
    .filter_map(futures::future::ready);
    body.into_data_stream()
        .map_err(std::io::Error::other)
        .chain(end)
        .boxed()
}

/// 401 when a reload removed `tenant` or rotated its token while its upload ran (whatever
/// the upload's outcome: it was not committed, see [`upload_body`]). A kernel the upload
/// started for a tenant the reload had already removed goes too.
async fn refuse_if_removed(state: &AppState, tenant: &Tenant) -> Result<(), ApiError> {
    if state.inner.tenants.holds(tenant) {
        return Ok(());
    }
    if state.inner.tenants.current().get(&tenant.name).is_none() {
        state.inner.orchestrator.remove_tenant(&tenant.name).await;
    }
    state.inner.metrics.rejected("unauthorized");
    Err(ApiError::unauthorized())
}

pub(super) async fn put_file(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    path: Result<Path<Target>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let target = target(&state, path)?;
    put(state, tenant, target, query, headers, body).await
}

pub(super) async fn put_root(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let target = root_target(&state, path)?;
    put(state, tenant, target, query, headers, body).await
}

async fn put(
    state: AppState,
    tenant: std::sync::Arc<Tenant>,
    (session, path): Target,
    query: Result<Query<FileQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let request = request(&state, &tenant, session, query)?;
    let tar = header_says(&headers, header::CONTENT_TYPE, "application/x-tar");
    let orchestrator = state.inner.orchestrator.clone();
    refuse_declared_too_large(&state, &headers)?;
    let path = FilePath::parse(&path)?;
    let stream = upload_body(&state, &tenant, body);
    let written = orchestrator.write_file(&request, &path, tar, stream).await;
    refuse_if_removed(&state, &tenant).await?;
    let written = written.map_err(ApiError::from)?;
    Ok((StatusCode::CREATED, Json(written)).into_response())
}

pub(super) async fn get_file(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    path: Result<Path<Target>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let target = target(&state, path)?;
    get(state, tenant, target, query, headers).await
}

pub(super) async fn get_root(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let target = root_target(&state, path)?;
    get(state, tenant, target, query, headers).await
}

async fn get(
    state: AppState,
    tenant: std::sync::Arc<Tenant>,
    (session, path): Target,
    query: Result<Query<FileQuery>, QueryRejection>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let request = request(&state, &tenant, session, query)?;
    let tar = header_says(&headers, header::ACCEPT, "application/x-tar");
    let path = FilePath::parse(&path)?;
    let download = state
        .inner
        .orchestrator
        .read_file(&request, &path, tar)
        .await
        .map_err(ApiError::from)?;
    let body = |stream: crate::files::DownloadStream| {
        Body::from_stream(stream.map_err(std::io::Error::other))
    };
    Ok(match download {
        Download::Dir(listing) => Json(listing).into_response(),
        Download::File { size, body: stream } => {
            let mut response = body(stream).into_response();
            let headers = response.headers_mut();
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            response
        }
        Download::Tar { body: stream } => {
            let mut response = body(stream).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/x-tar"),
            );
            response
        }
    })
}

/// `GET /v1/sessions/{session}/workspace[?child=]`: the session's workspace as a tar of its
/// `/work`, through its live kernel or, with none, a transfer kernel (docs/workspaces.md, "A
/// workspace's files without its kernel"); nothing is started for the session.
pub(super) async fn get_workspace(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let (session, _) = root_target(&state, path)?;
    let request = request(&state, &tenant, session, query)?;
    let download = state
        .inner
        .orchestrator
        .read_workspace(&request.scope)
        .await
        .map_err(ApiError::from)?;
    let Download::Tar { body: stream } = download else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "a workspace download answered something else than a tar",
        ));
    };
    let mut response = Body::from_stream(stream.map_err(std::io::Error::other)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    Ok(response)
}

/// `PUT /v1/sessions/{session}/workspace[?child=]` with a tar: extracted into the session's
/// workspace (made when it has none), through its live kernel or a transfer kernel.
pub(super) async fn put_workspace(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (session, _) = root_target(&state, path)?;
    let request = request(&state, &tenant, session, query)?;
    let orchestrator = state.inner.orchestrator.clone();
    refuse_declared_too_large(&state, &headers)?;
    let stream = upload_body(&state, &tenant, body);
    let written = orchestrator.write_workspace(&request.scope, stream).await;
    refuse_if_removed(&state, &tenant).await?;
    let written = written.map_err(ApiError::from)?;
    Ok((StatusCode::CREATED, Json(written)).into_response())
}

pub(super) async fn delete_file(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    path: Result<Path<Target>, PathRejection>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Json<crate::wire::Deleted>, ApiError> {
    let (session, path) = target(&state, path)?;
    let request = request(&state, &tenant, session, query)?;
    let checked = FilePath::parse(&path)?;
    state
        .inner
        .orchestrator
        .remove_file(&request, &checked)
        .await?;
    Ok(Json(crate::wire::Deleted {
        deleted: checked.in_kernel(),
    }))
}
