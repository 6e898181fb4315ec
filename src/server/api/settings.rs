//! A session's settings (`docs/http-api.md`, "Session settings"): `PUT
//! /v1/sessions/{session}/settings` checks them against the tenant's `session_limits` and keeps
//! them for the session's kernels; `GET` answers them. `GET /v1/kernels?label=k:v` filters the
//! tenant's kernels on their sessions' labels.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde_json::json;

use super::{invalid, json_object, one_name, read_body, Caller};
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::settings::{Settings, SettingsError};
use crate::wire::{SessionSettings, SettingsApplied};

impl From<SettingsError> for ApiError {
    fn from(e: SettingsError) -> ApiError {
        let status = match e {
            SettingsError::TooMany { .. } => StatusCode::TOO_MANY_REQUESTS,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, e.code(), e.to_string())
    }
}

/// `PUT /v1/sessions/{session}/settings`: replaces the session's settings.
pub(super) async fn put(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    session: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<SettingsApplied>, ApiError> {
    let session = one_name(&state, session)?;
    let bytes = read_body(&headers, body)
        .await
        .map_err(|e| invalid(&state, e))?;
    let wire: SessionSettings = json_object(&bytes).map_err(|e| invalid(&state, e))?;
    let orchestrator = &state.inner.orchestrator;
    let bounds = tenant.session_limits.bounds(orchestrator.config());
    let settings = Settings::check(&wire, &bounds).map_err(|e| invalid(&state, e.into()))?;
    let answer = settings.to_wire();
    let restart_required = orchestrator.set_settings(Some(&tenant.name), &session, settings)?;
    Ok(Json(SettingsApplied {
        settings: answer,
        restart_required,
    }))
}

/// `GET /v1/sessions/{session}/settings`: the session's settings (`{}` when it set none).
pub(super) async fn get(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    session: Result<Path<String>, PathRejection>,
) -> Result<Json<SessionSettings>, ApiError> {
    let session = one_name(&state, session)?;
    let settings = state
        .inner
        .orchestrator
        .settings(Some(&tenant.name), &session);
    Ok(Json(settings.to_wire()))
}

/// `GET /v1/kernels[?label=k:v...]`: the tenant's live kernels, those of sessions carrying
/// every label given.
pub(super) async fn kernels(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let mut filters = Vec::new();
    for (key, value) in &query {
        if key != "label" {
            return Err(invalid(
                &state,
                ApiError::bad_request(
                    "invalid_query",
                    format!("unknown query parameter {key:?} (use label=key:value)"),
                ),
            ));
        }
        filters.push(value.as_str());
    }
    let filters = crate::settings::label_filters(filters).map_err(|e| invalid(&state, e.into()))?;
    let list: Vec<_> = state
        .inner
        .orchestrator
        .list_kernels(Some(&tenant.name))
        .into_iter()
        .filter(|k| {
            filters
                .iter()
                .all(|(key, value)| k.labels.get(key).is_some_and(|have| have == value))
        })
        .collect();
    Ok(Json(json!({ "kernels": list })))
}
