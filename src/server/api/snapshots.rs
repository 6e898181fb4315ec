//! Snapshots, restore and fork (`docs/snapshots.md`): `POST /v1/sessions/{session}/snapshots`,
//! `GET /v1/snapshots`, `GET`/`DELETE /v1/snapshots/{id}`, `POST
//! /v1/sessions/{session}/restore` and `POST /v1/sessions/{session}/fork`. A snapshot is its
//! tenant's only: another tenant's id answers 404, as one that does not exist.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;

use super::extract::{JsonBody, SessionName};
use super::files::kernel_scope;
use super::{invalid, json_object, read_body_of, Caller};
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::wire::{
    Deleted, ForkBody, ForkOutcome, ForkResult, RestoreBody, SnapshotBody, SnapshotInfo,
    SnapshotList,
};

/// A body that may be empty (no fields set).
fn body_or_default<T: serde::de::DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(T::default());
    }
    json_object(bytes)
}

/// `POST /v1/sessions/{session}/snapshots`: snapshots the session's kernel.
pub(super) async fn create(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<SnapshotInfo>, ApiError> {
    let bytes = read_body_of(&state, &tenant, &headers, body).await?;
    let wire: SnapshotBody = body_or_default(&bytes).map_err(|e| invalid(&state, e))?;
    let scope = kernel_scope(&tenant, session, None);
    let info = state
        .inner
        .orchestrator
        .snapshots()
        .take(&scope, wire.name)
        .await?;
    Ok(Json(info))
}

/// `GET /v1/snapshots`: the caller's snapshots.
pub(super) async fn list(
    State(state): State<AppState>,
    Caller(tenant): Caller,
) -> Json<SnapshotList> {
    Json(SnapshotList {
        snapshots: state
            .inner
            .orchestrator
            .snapshots()
            .list(Some(&tenant.name)),
    })
}

/// `GET /v1/snapshots/{id}`: one of the caller's snapshots.
pub(super) async fn get(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<SnapshotInfo>, ApiError> {
    Ok(Json(
        state
            .inner
            .orchestrator
            .snapshots()
            .get(Some(&tenant.name), &id)?,
    ))
}

/// `DELETE /v1/snapshots/{id}`: deletes one of the caller's snapshots and its files
/// (`deleted`: its id).
pub(super) async fn delete(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<Deleted>, ApiError> {
    state
        .inner
        .orchestrator
        .snapshots()
        .delete(Some(&tenant.name), &id)
        .await?;
    Ok(Json(Deleted { deleted: id }))
}

/// `POST /v1/sessions/{session}/restore`: starts the session from a snapshot.
pub(super) async fn restore(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
    JsonBody(wire): JsonBody<RestoreBody>,
) -> Result<Json<ForkOutcome>, ApiError> {
    let scope = kernel_scope(&tenant, session.clone(), None);
    let kernel = state
        .inner
        .orchestrator
        .snapshots()
        .restore(&scope, &wire.snapshot)
        .await?;
    Ok(Json(ForkOutcome {
        session,
        kernel: Some(kernel),
        error: None,
    }))
}

/// `POST /v1/sessions/{session}/fork`: snapshots the session's kernel once and starts new
/// sessions from it.
pub(super) async fn fork(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
    JsonBody(wire): JsonBody<ForkBody>,
) -> Result<Json<ForkResult>, ApiError> {
    let sessions = match (wire.count, wire.sessions) {
        (Some(n), None) => {
            let suffix = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
            (1..=n)
                .map(|i| format!("{session}-fork-{i}-{suffix}"))
                .collect()
        }
        (None, Some(names)) => names,
        _ => {
            return Err(invalid(
                &state,
                ApiError::bad_request(
                    "invalid_request",
                    "a fork names exactly one of `count` and `sessions`",
                ),
            ))
        }
    };
    let scope = kernel_scope(&tenant, session, None);
    Ok(Json(
        state
            .inner
            .orchestrator
            .snapshots()
            .fork(&scope, sessions)
            .await?,
    ))
}
