//! `/v1/mcp`: MCP over streamable HTTP inside `kernelbox serve`, behind the same bearer-token
//! authentication as the rest of the API (docs/mcp.md, "MCP").
//!
//! Which kernelbox session a tool call runs in, in order:
//! 1. the `Kernelbox-Session` header, or the `session` query parameter (`/v1/mcp?session=NAME`):
//!    a named session, shared with the HTTP API's `/v1/sessions/NAME/...`, kept until the
//!    server's idle timeout reaps its kernel;
//! 2. else the MCP session (`Mcp-Session-Id`, protocol versions before 2026-07-28): session
//!    `mcp-{id}`, whose kernels are removed when the MCP session ends (`DELETE /v1/mcp`, or
//!    `--mcp-idle-timeout` without a message, never less than the longest cell allowed plus
//!    10 seconds, so that a running cell does not end its own session);
//! 3. else (a session-less request, protocol 2026-07-28 and later, which has no MCP sessions)
//!    the tenant's default session, `mcp-default` (`mcp_session::DEFAULT_SESSION`): shared by
//!    all such requests of the tenant, kept until the server's idle timeout reaps its kernel.
//!
//! Every session name is namespaced by the caller's tenant. An MCP session belongs to the
//! tenant that opened it: another tenant's request naming it is answered 404, as for an
//! unknown one. A tenant may hold at most [`McpOptions::max_sessions_per_tenant`] MCP sessions
//! at once (one more `initialize` is refused 429 `at_capacity`), and each ends after
//! [`McpOptions::idle_timeout`] without a request, so neither sessions nor their event streams
//! can pile up.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::Stream;
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    create_local_session, LocalSessionManager, LocalSessionManagerError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionId, SessionManager,
};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::mcp_session::{kernel_session, mcp_session_id, node_session_id};
use super::Caller;
use crate::mcp::{Backend, KernelTools};
use crate::orchestrator::Orchestrator;
use crate::server::{ApiError, AppState, Metrics, MAX_BODY_BYTES};

/// How MCP sessions on `/v1/mcp` are bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McpOptions {
    /// An MCP session with no message for this long ends, and its kernels go (never sooner
    /// than the longest cell allowed, `Config::cells.max_timeout`, plus 10 seconds).
    pub idle_timeout: Duration,
    /// MCP sessions one tenant may hold open at once.
    pub max_sessions_per_tenant: usize,
}

impl Default for McpOptions {
    fn default() -> Self {
        McpOptions {
            idle_timeout: Duration::from_secs(30 * 60),
            max_sessions_per_tenant: 64,
        }
    }
}

/// The MCP service mounted at `/v1/mcp`, and its sessions. Cheap to clone.
#[derive(Clone)]
pub(crate) struct McpService {
    http: StreamableHttpService<KernelTools, TenantSessions>,
    sessions: Arc<TenantSessions>,
}

/// Builds the service for `state`; it stops (sessions end, streams close) when the server's
/// MCP token is cancelled at shutdown.
pub(crate) fn service(state: &AppState) -> McpService {
    let options = state.mcp_options();
    let mut local = LocalSessionManager::default();
    local.session_config.keep_alive = Some(session_idle_timeout(
        options.idle_timeout,
        state.orchestrator().config().cells.max_timeout,
    ));
    let sessions = Arc::new(TenantSessions {
        local,
        owners: tokio::sync::Mutex::new(HashMap::new()),
        orchestrator: state.orchestrator().clone(),
        metrics: state.metrics().clone(),
        max_per_tenant: options.max_sessions_per_tenant,
        node: state.cluster().map(|n| n.name().to_string()),
    });
    {
        let mut kept = state
            .inner
            .mcp_sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        kept.retain(|s| s.strong_count() > 0);
        kept.push(Arc::downgrade(&sessions));
    }
    let backend: Arc<dyn Backend> = Arc::new(super::mcp_backend::HttpBackend {
        state: state.clone(),
    });
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(state.mcp_stop().child_token())
        // Every request carries the tenant's bearer token, which a rebinding page cannot
        // send, and the server may be reached under any host name.
        .disable_allowed_hosts();
    config.max_request_body_bytes = MAX_BODY_BYTES;
    let http = StreamableHttpService::new(
        move || Ok(KernelTools::new(backend.clone())),
        sessions.clone(),
        config,
    );
    McpService { http, sessions }
}

/// How long an MCP session may go without a message. rmcp's clock counts MCP messages only,
/// and a running cell sends none, so it is never shorter than the longest cell allowed plus
/// 10 seconds: a session never ends under one of its own cells.
fn session_idle_timeout(configured: Duration, max_cell: Duration) -> Duration {
    configured.max(max_cell + Duration::from_secs(10))
}

/// The handler of `/v1/mcp` (POST, GET and DELETE): authenticates, checks that a named MCP
/// session is the caller's, and hands the request to the MCP service.
pub(crate) async fn handle(
    service: McpService,
    State(state): State<AppState>,
    Caller(tenant): Caller,
    mut request: Request,
) -> Response {
    if state.is_draining() {
        return ApiError::shutting_down().into_response();
    }
    if let Some(id) = mcp_session_id(request.headers()) {
        let owner = service.sessions.owner(&id).await;
        if owner.is_some_and(|owner| owner != tenant.name) {
            return ApiError::not_found("no such MCP session").into_response();
        }
    }
    let ending = request.method() == axum::http::Method::DELETE;
    request.extensions_mut().insert(tenant.clone());
    let scope = CallScope {
        tenant: tenant.name.clone(),
        refused: Cell::new(false),
    };
    let (response, refused) = CALL
        .scope(scope, async {
            let response = service.http.handle(request).await;
            (response, CALL.with(|c| c.refused.get()))
        })
        .await;
    if refused {
        let max = state.mcp_options().max_sessions_per_tenant;
        return ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "at_capacity",
                format!(
                    "tenant {:?} already has {max} MCP sessions open, the most allowed; end one (DELETE /v1/mcp with its Mcp-Session-Id) or retry when one has idled out",
                    tenant.name
                ),
            )
        }
        .into_response();
    }
    let mut response = response.map(Body::new);
    if ending && response.status() == StatusCode::ACCEPTED {
        // The session is gone once DELETE returns (its kernels too): 204, which clients
        // expect, rather than rmcp's 202.
        *response.status_mut() = StatusCode::NO_CONTENT;
    }
    as_api_error(response).await
}

/// rmcp answers transport errors (no session id, unknown session, wrong media type, ...) in
/// plain text; like every other route, `/v1/mcp` answers them as `{"error": {"code",
/// "message"}}` with the same status. JSON answers (JSON-RPC errors) pass unchanged.
async fn as_api_error(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if status.is_success() || is_json {
        return response;
    }
    let text = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let code = match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_ACCEPTABLE => "not_acceptable",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        s if s.is_server_error() => "internal",
        _ => "invalid_request",
    };
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("MCP request failed")
            .to_string()
    } else {
        text
    };
    ApiError::new(status, code, message).into_response()
}

tokio::task_local! {
    /// The caller of the `/v1/mcp` request being handled, for [`TenantSessions`].
    static CALL: CallScope;
}

struct CallScope {
    tenant: String,
    /// Set when the request would have opened an MCP session past the tenant's cap.
    refused: Cell<bool>,
}

/// rmcp's in-memory sessions, each bound to the tenant that opened it, at most
/// `max_per_tenant` per tenant; a session's kernels are cleared when it ends.
pub(crate) struct TenantSessions {
    local: LocalSessionManager,
    /// MCP session -> the tenant that opened it.
    owners: tokio::sync::Mutex<HashMap<SessionId, String>>,
    orchestrator: Orchestrator,
    metrics: Arc<Metrics>,
    max_per_tenant: usize,
    /// On a cluster node, its name: carried in each MCP session id it makes, so that any
    /// node sends the session's requests here (docs/cluster.md, "Routing").
    node: Option<String>,
}

/// Why an MCP session operation failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionsError {
    /// rmcp's session store failed.
    #[error(transparent)]
    Local(#[from] LocalSessionManagerError),
    /// The tenant already holds as many MCP sessions as allowed.
    #[error("tenant {0:?} holds as many MCP sessions as allowed")]
    AtCapacity(String),
    /// A session was to be opened outside an authenticated request.
    #[error("an MCP session can only be opened by an authenticated request")]
    NoCaller,
}

impl TenantSessions {
    async fn owner(&self, id: &SessionId) -> Option<String> {
        self.owners.lock().await.get(id).cloned()
    }

    /// Ends every MCP session of `tenant` (as `DELETE /v1/mcp` would: its kernels go);
    /// returns how many.
    async fn end_tenant(&self, tenant: &str) -> usize {
        let ids: Vec<SessionId> = self
            .owners
            .lock()
            .await
            .iter()
            .filter(|(_, t)| t.as_str() == tenant)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            if let Err(e) = self.close_session(id).await {
                tracing::warn!(tenant, session = %id, error = %e, "ending a removed tenant's MCP session failed");
            }
        }
        ids.len()
    }
}

impl AppState {
    /// Ends every MCP session of `tenant`, a tenant a reload removed (docs/http-api.md,
    /// "Reloading the tenants"): its next request is answered as for an unknown session, and
    /// its kernels go now rather than at the idle timeout. Returns the sessions ended.
    pub(crate) async fn end_mcp_sessions(&self, tenant: &str) -> usize {
        let services: Vec<Arc<TenantSessions>> = self
            .inner
            .mcp_sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .collect();
        let mut ended = 0;
        for sessions in services {
            ended += sessions.end_tenant(tenant).await;
        }
        ended
    }
}

impl SessionManager for TenantSessions {
    type Error = SessionsError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let tenant = CALL
            .try_with(|c| c.tenant.clone())
            .map_err(|_| SessionsError::NoCaller)?;
        let mut owners = self.owners.lock().await;
        if owners.values().filter(|t| **t == tenant).count() >= self.max_per_tenant {
            let _ = CALL.try_with(|c| c.refused.set(true));
            self.metrics.rejected("mcp_sessions");
            return Err(SessionsError::AtCapacity(tenant));
        }
        let (id, transport) = match self.node.as_deref().and_then(node_session_id) {
            Some(id) => {
                // rmcp's own session, under an id naming this node.
                let id = SessionId::from(id);
                let (handle, worker) =
                    create_local_session(id.clone(), self.local.session_config.clone());
                self.local.sessions.write().await.insert(id.clone(), handle);
                (id, rmcp::transport::worker::WorkerTransport::spawn(worker))
            }
            None => self.local.create_session().await?,
        };
        owners.insert(id.clone(), tenant);
        self.metrics.mcp_session(true);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        Ok(self.local.initialize_session(id, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        Ok(self.local.has_session(id).await?)
    }

    /// Called on `DELETE /v1/mcp` and when the session's worker ends (idle timeout, shutdown):
    /// the session's kernels go with it.
    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let closed = self.local.close_session(id).await;
        let owner = self.owners.lock().await.remove(id);
        if let Some(tenant) = owner {
            self.metrics.mcp_session(false);
            self.orchestrator
                .clear_session(Some(&tenant), &kernel_session(id))
                .await;
        }
        Ok(closed?)
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.local.create_stream(id, message).await?)
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        Ok(self.local.accept_message(id, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.local.create_standalone_stream(id).await?)
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        Ok(self.local.resume(id, last_event_id).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_outlasts_the_longest_cell() {
        let min = Duration::from_secs(60);
        assert_eq!(
            session_idle_timeout(30 * min, 60 * min),
            60 * min + Duration::from_secs(10)
        );
        assert_eq!(session_idle_timeout(90 * min, 60 * min), 90 * min);
    }
}
