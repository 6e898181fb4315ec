//! E2B's control plane: sandboxes created, listed, read, given a new end of life, connected
//! to and killed, behind the caller's `X-API-Key` (a tenant's token). A sandbox is the
//! tenant's session of the same name: its environment (`envVars`) and metadata are the
//! session's settings (`env`, `labels`), checked against the tenant's session limits as
//! `PUT /v1/sessions/{session}/settings` checks them; a kill clears the session's kernels as
//! `DELETE /v1/sessions/{session}` does.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::de::DeserializeOwned;

use super::sandboxes::{self, Sandbox, DEFAULT_TIMEOUT};
use super::wire::{self, Created, Detail, NewSandbox, ENVD_VERSION};
use super::{ApiKey, E2bError, Facade};
use crate::server::api;
use crate::server::tenants::Tenant;
use crate::server::AppState;
use crate::wire::SessionSettings;

/// The templates a sandbox may be created from; each runs the tenant's kernel image (the
/// server's, or the one its tenant entry names), which has the data-science stack when the
/// server runs the `datascience` preset (docs/e2b.md, "Templates").
pub(crate) const TEMPLATES: [&str; 3] = ["base", "code-interpreter-v1", "code-interpreter"];

/// The most sandboxes one list page holds (E2B's cap), and the default.
const MAX_PAGE: usize = 100;

async fn body<T: DeserializeOwned + Default>(
    state: &AppState,
    tenant: &Tenant,
    headers: &HeaderMap,
    body: Body,
) -> Result<T, E2bError> {
    let bytes = api::read_body_of(state, tenant, headers, body).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    Ok(api::json_object(&bytes)?)
}

fn sandbox_id(id: Result<Path<String>, PathRejection>) -> Result<String, E2bError> {
    id.map(|Path(id)| id)
        .map_err(|e| E2bError::bad_request(e.body_text()))
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

fn detail(state: &AppState, s: &Sandbox) -> Detail {
    let limits = &state.orchestrator().config().spec.sandbox;
    Detail {
        template_id: s.template.clone(),
        alias: s.template.clone(),
        sandbox_id: s.id.clone(),
        client_id: "kernelbox".into(),
        started_at: rfc3339(s.started_at),
        end_at: rfc3339(s.end_at),
        envd_version: ENVD_VERSION,
        cpu_count: (limits.nano_cpus.max(0) as u64)
            .div_ceil(1_000_000_000)
            .max(1),
        memory_mb: limits.memory_bytes.max(0) as u64 / (1024 * 1024),
        disk_size_mb: 0,
        state: "running",
        metadata: s.metadata.clone(),
    }
}

fn created(s: &Sandbox, token: String) -> Created {
    Created {
        template_id: s.template.clone(),
        sandbox_id: s.id.clone(),
        client_id: "kernelbox".into(),
        envd_version: ENVD_VERSION,
        envd_access_token: token.clone(),
        traffic_access_token: token,
        domain: None,
    }
}

fn seconds(timeout: Option<u64>) -> Duration {
    // Capped here, before any `now +` (a huge `duration` would overflow the clock).
    timeout
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs)
        .min(super::sandboxes::MAX_TIMEOUT)
}

/// `POST /sandboxes`, `POST /v2/sandboxes`: a new sandbox, 201.
pub(super) async fn create(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    ApiKey(tenant): ApiKey,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, E2bError> {
    let bytes = api::read_body_of(&state, &tenant, &headers, request).await?;
    let new: NewSandbox = api::json_object(&bytes)?;
    if state.is_draining() {
        return Err(crate::server::ApiError::shutting_down().into());
    }
    if !TEMPLATES.contains(&new.template_id.as_str()) {
        return Err(E2bError::not_found(format!(
            "template {:?} not found: kernelbox serves {}",
            new.template_id,
            TEMPLATES.join(", ")
        )));
    }
    if new.auto_pause == Some(true) {
        return Err(E2bError::not_available("autoPause"));
    }
    if new.allow_internet_access == Some(true) && tenant.network.is_none() {
        return Err(E2bError::new(
            StatusCode::FORBIDDEN,
            format!(
                "tenant {:?} has no network policy: its sandboxes have no internet access (docs/reliability.md, \"Network egress\")",
                tenant.name
            ),
        ));
    }
    let metadata = new.metadata.unwrap_or_default();
    let env = new.env_vars.unwrap_or_default();
    let (sandbox, token) = facade.create(
        &tenant.name,
        &new.template_id,
        metadata.clone(),
        seconds(new.timeout),
    )?;
    if !env.is_empty() || !metadata.is_empty() {
        let settings = SessionSettings {
            env,
            labels: metadata,
            ..SessionSettings::default()
        };
        if let Err(e) = api::settings::apply(&state, &tenant, &sandbox.id, &settings).await {
            let _ = facade.remove(&tenant.name, &sandbox.id);
            sandboxes::clear(&state, &tenant.name, &sandbox.id).await;
            return Err(e.into());
        }
    }
    tracing::info!(
        sandbox = sandbox.id,
        tenant = tenant.name,
        template = sandbox.template,
        "an E2B sandbox was created"
    );
    Ok((StatusCode::CREATED, Json(created(&sandbox, token))).into_response())
}

/// `GET /sandboxes/{id}`.
pub(super) async fn info(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    ApiKey(tenant): ApiKey,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Detail>, E2bError> {
    let id = sandbox_id(id)?;
    let sandbox = facade.get(&tenant.name, &id)?;
    Ok(Json(detail(&state, &sandbox)))
}

/// `DELETE /sandboxes/{id}`: the sandbox and its kernels go, 204.
pub(super) async fn kill(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    ApiKey(tenant): ApiKey,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, E2bError> {
    let id = sandbox_id(id)?;
    facade.remove(&tenant.name, &id)?;
    sandboxes::clear(&state, &tenant.name, &id).await;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/timeout`: the sandbox now ends `timeout` seconds from now, 204.
pub(super) async fn set_timeout(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    ApiKey(tenant): ApiKey,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    request: Body,
) -> Result<StatusCode, E2bError> {
    let id = sandbox_id(id)?;
    let asked: wire::Timeout = body(&state, &tenant, &headers, request).await?;
    facade.set_timeout(&tenant.name, &id, seconds(asked.timeout))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/refreshes`: the sandbox lives `duration` seconds more from now, 204.
pub(super) async fn refresh(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    ApiKey(tenant): ApiKey,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    request: Body,
) -> Result<StatusCode, E2bError> {
    let id = sandbox_id(id)?;
    let asked: wire::Timeout = body(&state, &tenant, &headers, request).await?;
    let sandbox = facade.get(&tenant.name, &id)?;
    let wanted = SystemTime::now() + seconds(asked.duration.or(asked.timeout));
    if wanted > sandbox.end_at {
        facade.set_timeout(&tenant.name, &id, seconds(asked.duration.or(asked.timeout)))?;
    }
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/connect`, `/v2/...`, `/resume`: the sandbox, with a fresh access
/// token and, when `timeout` is given and later than its end, that end. Sandboxes are never
/// paused here, so a connect always finds it running (200).
pub(super) async fn connect(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    ApiKey(tenant): ApiKey,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    request: Body,
) -> Result<Response, E2bError> {
    let id = sandbox_id(id)?;
    let asked: wire::Timeout = body(&state, &tenant, &headers, request).await?;
    let mut sandbox = facade.get(&tenant.name, &id)?;
    if let Some(timeout) = asked.timeout {
        if SystemTime::now() + Duration::from_secs(timeout) > sandbox.end_at {
            sandbox = facade.set_timeout(&tenant.name, &id, Duration::from_secs(timeout))?;
        }
    }
    let token = facade.new_token(&tenant.name, &id)?;
    Ok((StatusCode::OK, Json(created(&sandbox, token))).into_response())
}

/// `POST /sandboxes/{id}/pause`: not available (docs/e2b.md).
pub(super) async fn pause(
    Extension(facade): Extension<Facade>,
    ApiKey(tenant): ApiKey,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, E2bError> {
    facade.get(&tenant.name, &sandbox_id(id)?)?;
    Err(E2bError::not_available("pausing a sandbox"))
}

/// `POST /sandboxes/{id}/snapshots`: not available (docs/e2b.md).
pub(super) async fn snapshot(
    Extension(facade): Extension<Facade>,
    ApiKey(tenant): ApiKey,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, E2bError> {
    facade.get(&tenant.name, &sandbox_id(id)?)?;
    Err(E2bError::not_available("snapshots"))
}

/// `POST /sandboxes/{id}/fork`: not available (docs/e2b.md).
pub(super) async fn fork(
    Extension(facade): Extension<Facade>,
    ApiKey(tenant): ApiKey,
    id: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, E2bError> {
    facade.get(&tenant.name, &sandbox_id(id)?)?;
    Err(E2bError::not_available("forking a sandbox"))
}

/// The `metadata` query's pairs: `k=v` joined by `&`, each side percent-encoded.
fn metadata_query(query: Option<&str>) -> Result<BTreeMap<String, String>, E2bError> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(&s.replace('+', " "))
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|_| E2bError::bad_request("the metadata query is not UTF-8"))
    };
    let mut pairs = BTreeMap::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = pair.split_once('=').ok_or_else(|| {
            E2bError::bad_request(format!("metadata query {pair:?} is not key=value"))
        })?;
        pairs.insert(decode(k)?, decode(v)?);
    }
    Ok(pairs)
}

/// `GET /v2/sandboxes`: the tenant's sandboxes whose metadata matches, a page at a time (the
/// next page's token in `x-next-token`). Every sandbox is `running`: a `state` filter without
/// it finds none.
pub(super) async fn list(
    State(state): State<AppState>,
    Extension(facade): Extension<Facade>,
    ApiKey(tenant): ApiKey,
    query: Result<Query<wire::ListQuery>, QueryRejection>,
) -> Result<Response, E2bError> {
    let Query(query) = query.map_err(|e| E2bError::bad_request(e.body_text()))?;
    let metadata = metadata_query(query.metadata.as_deref())?;
    let wants_running = query
        .state
        .as_deref()
        .is_none_or(|s| s.split(',').any(|s| s.trim() == "running"));
    let all = if wants_running {
        facade.list(&tenant.name, &metadata)
    } else {
        Vec::new()
    };
    let limit = query.limit.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE);
    let start = match query.next_token.as_deref() {
        None | Some("") => 0,
        Some(token) => all.iter().position(|s| s.id == token).ok_or_else(|| {
            E2bError::bad_request(format!("nextToken {token:?} is not a sandbox of this list"))
        })?,
    };
    let page: Vec<Detail> = all
        .iter()
        .skip(start)
        .take(limit)
        .map(|s| detail(&state, s))
        .collect();
    let mut response = Json(page).into_response();
    if let Some(next) = all.get(start + limit) {
        if let Ok(value) = HeaderValue::from_str(&next.id) {
            response.headers_mut().insert("x-next-token", value);
        }
    }
    Ok(response)
}

/// `GET /sandboxes` (E2B's first list): every running sandbox of the tenant, filtered by
/// metadata.
pub(super) async fn list_v1(
    state: State<AppState>,
    facade: Extension<Facade>,
    caller: ApiKey,
    query: Result<Query<wire::ListQuery>, QueryRejection>,
) -> Result<Response, E2bError> {
    list(state, facade, caller, query).await
}
