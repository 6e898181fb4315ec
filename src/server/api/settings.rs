//! A session's settings (`docs/http-api.md`, "Session settings"): `PUT
//! /v1/sessions/{session}/settings` checks them against the tenant's `session_limits` and keeps
//! them for the session's kernels; `GET` answers them. `GET /v1/kernels?label=k:v` filters the
//! tenant's kernels on their sessions' labels.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;

use super::extract::{JsonBody, SessionName};
use super::{invalid, Caller};
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::settings::{Settings, SettingsError};
use crate::wire::{SessionSettings, SettingsApplied};

/// `PUT /v1/sessions/{session}/settings`: replaces the session's settings.
pub(super) async fn put(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
    JsonBody(wire): JsonBody<SessionSettings>,
) -> Result<Json<SettingsApplied>, ApiError> {
    apply(&state, &tenant, &session, &wire).await.map(Json)
}

/// Checks `wire` against `tenant`'s bounds and keeps it as `session`'s settings (in the
/// cluster's catalog first on a cluster node): the one path of `PUT .../settings` and of the
/// E2B API's sandbox environment and metadata (`server/e2b/`).
pub(crate) async fn apply(
    state: &AppState,
    tenant: &crate::server::Tenant,
    session: &str,
    wire: &SessionSettings,
) -> Result<SettingsApplied, ApiError> {
    let orchestrator = &state.inner.orchestrator;
    let bounds = tenant
        .session_limits
        .bounds(&orchestrator.config().session_defaults());
    let settings = Settings::check(wire, &bounds).map_err(|e| invalid(state, e.into()))?;
    let answer = settings.to_wire();
    let restart_required = match state.cluster() {
        None => orchestrator
            .sessions()
            .set_settings(Some(&tenant.name), session, settings)?,
        // The catalog keeps them first, so the session's kernel gets them on any node
        // (docs/cluster.md, "Session policies and settings").
        Some(node) => {
            let text = serde_json::to_string(&answer).map_err(|e| {
                ApiError::bad_request("invalid_settings", format!("the settings as JSON: {e}"))
            })?;
            let field = crate::cluster::ConfigField::Settings(Some(&text), settings.bytes());
            let written = node
                .put_session_config(
                    &tenant.name,
                    session,
                    field,
                    crate::settings::MAX_SETTINGS_BYTES_PER_TENANT,
                )
                .await?;
            let Some(version) = written else {
                return Err(SettingsError::TooMany {
                    tenant: tenant.name.clone(),
                }
                .into());
            };
            orchestrator.sessions().set_settings_at(
                &tenant.name,
                session,
                Some(settings),
                version,
            )?
        }
    };
    Ok(SettingsApplied {
        settings: answer,
        restart_required,
    })
}

/// `GET /v1/sessions/{session}/settings`: the session's settings (`{}` when it set none).
pub(super) async fn get(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
) -> Result<Json<SessionSettings>, ApiError> {
    let orchestrator = &state.inner.orchestrator;
    // On a cluster node, the catalog's unless the session's kernel is here (the request was
    // routed to the node holding it).
    if let Some(node) = state
        .cluster()
        .filter(|_| !orchestrator.has_session(&tenant.name, &session))
    {
        let kept = node.session_config(&tenant.name, &session).await?;
        let wire = match kept.settings {
            None => SessionSettings::default(),
            Some(text) => serde_json::from_str(&text).map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "catalog_unreadable",
                    format!("the session's settings in the cluster catalog cannot be read: {e}"),
                )
            })?,
        };
        return Ok(Json(wire));
    }
    let settings = orchestrator
        .sessions()
        .settings(Some(&tenant.name), &session);
    Ok(Json(settings.to_wire()))
}

/// `GET /v1/kernels[?label=k:v...]`: the tenant's live kernels, those of sessions carrying
/// every label given.
pub(super) async fn kernels(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Json<crate::wire::KernelList>, ApiError> {
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
    Ok(Json(crate::wire::KernelList { kernels: list }))
}
