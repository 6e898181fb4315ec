//! Authentication, once per request on a node: the caller's tenant from its bearer token.
//! On a cluster node the routing middleware (`routing.rs`) authenticates a session's request
//! to decide where it is served, and hands the tenant on in the request's extensions, so the
//! handler's [`Caller`] does not look it up again.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::HeaderMap;

use super::{access, pending};
use crate::server::error::ApiError;
use crate::server::tenants::Tenant;
use crate::server::AppState;

/// The tenant a request was authenticated as, as the routing middleware hands it on.
#[derive(Clone)]
pub(super) struct Authenticated(pub(super) Arc<Tenant>);

/// The authenticated caller's tenant.
pub(crate) struct Caller(pub(crate) Arc<Tenant>);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        if let Some(Authenticated(tenant)) = parts.extensions.get::<Authenticated>() {
            return Ok(Caller(tenant.clone()));
        }
        match authenticate(state, &parts.headers, &parts.extensions) {
            Some(tenant) => {
                parts.extensions.insert(Authenticated(tenant.clone()));
                Ok(Caller(tenant))
            }
            None => {
                state.inner.metrics.rejected("unauthorized");
                Err(ApiError::unauthorized())
            }
        }
    }
}

/// The tenant whose token the request carries, if any. The connection then leaves the
/// unauthenticated pool (docs/http-api.md, "Slow and idle clients cannot hold the server")
/// and the response's bytes count against the tenant's budget.
pub(crate) fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
) -> Option<Arc<Tenant>> {
    let token = crate::server::tenants::bearer(headers)?;
    authenticate_token(state, token, extensions)
}

/// The tenant whose token is `token`, if any, as [`authenticate`] (the E2B API's `X-API-Key`
/// comes here too).
pub(crate) fn authenticate_token(
    state: &AppState,
    token: &str,
    extensions: &axum::http::Extensions,
) -> Option<Arc<Tenant>> {
    let tenant = state.inner.tenants.authenticate(token)?;
    Some(admit_tenant(tenant, extensions))
}

/// Marks the request as `tenant`'s: its connection leaves the unauthenticated pool, its
/// response's bytes count against the tenant, the access log and the trace name it.
pub(crate) fn admit_tenant(
    tenant: Arc<Tenant>,
    extensions: &axum::http::Extensions,
) -> Arc<Tenant> {
    if let Some(slot) = extensions.get::<crate::server::slots::Promote>() {
        slot.authenticated();
    }
    if let Some(meter) = extensions.get::<Arc<pending::Meter>>() {
        meter.set_tenant(&tenant.name);
    }
    if let Some(who) = extensions.get::<Arc<access::Who>>() {
        who.set_tenant(&tenant.name);
    }
    crate::telemetry::set_current("kernelbox.tenant", || tenant.name.clone());
    tenant
}
