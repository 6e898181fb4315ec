//! A cluster node's middleware on every `/v1/sessions/{session}/...` route and `/v1/mcp`
//! (docs/cluster.md, "Routing"): the node decides where the session's request is served (`server/cluster/`);
//! one held by another node is forwarded there, one this node serves goes on to its handler.
//! On one host it does nothing. Each route declares whether it may start the session's
//! kernel (`mod.rs`, [`declare`]); this middleware authenticates the caller once and hands
//! the tenant on to the handler (`auth.rs`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;

use super::auth::Authenticated;

use crate::owner::validate_name;
use crate::server::cluster::{session_of, ClusterNode, Kind, Route, FORWARDED_HEADER};
use crate::server::AppState;

/// What a route of a session may do to the session's kernel, as the router declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Declared {
    /// It may start the kernel (an execute, a command, a process, an upload, a restore, a
    /// fork): it claims the session when no node holds it.
    Starts,
    /// It only finds the kernel (reading, removing, interrupting, a process's calls, the
    /// session's network policy or settings, kept in the catalog: docs/cluster.md "Session
    /// policies and settings"): it starts nothing, so it never counts against a cap.
    Finds,
    /// `/v1/mcp`: a request naming its session may start the kernel; one in an MCP
    /// session's own is served where that session lives.
    Mcp,
}

/// `route` with this middleware, as `declared`.
pub(super) fn declare(
    route: MethodRouter<AppState>,
    state: &AppState,
    declared: Declared,
) -> MethodRouter<AppState> {
    route.route_layer(axum::middleware::from_fn_with_state(
        (state.clone(), declared),
        self::route,
    ))
}

/// The middleware: a request for a session held elsewhere goes there.
async fn route(
    State((state, declared)): State<(AppState, Declared)>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(node) = state.cluster().cloned() else {
        return next.run(request).await;
    };
    let Some((session, named)) = session_named(&request) else {
        return next.run(request).await;
    };
    // An unauthenticated request or a bad name is answered by the handler, as on one host.
    let Some(tenant) = super::authenticate(&state, request.headers(), request.extensions()) else {
        return next.run(request).await;
    };
    request
        .extensions_mut()
        .insert(Authenticated(tenant.clone()));
    // Only a node of this cluster can mark a request forwarded (the hop secret).
    let forwarded =
        request.headers().contains_key(FORWARDED_HEADER) && node.is_hop(request.headers());
    if named == Some(false) {
        if let Some(creator) = mcp_creator(&node, &request) {
            return to_mcp_creator(&state, &node, &creator, forwarded, request, next).await;
        }
    }
    if validate_name("session", &session).is_err() {
        return next.run(request).await;
    }
    let kind = kind_of(declared, named);
    match node
        .decide(&state, &tenant, &session, kind, forwarded)
        .await
    {
        Ok(Route::Here { claimed }) => {
            serve_here(
                &state,
                &node,
                &tenant.name,
                &session,
                claimed,
                request,
                next,
            )
            .await
        }
        Ok(Route::Forward(target)) => match node
            .forward(&target, request, state.forward_deadline())
            .await
        {
            Ok(response) => response,
            Err(e) => {
                node.forget(&tenant.name, &session);
                e.into_response()
            }
        },
        Err(e) => e.into_response(),
    }
}

/// The session a request is for, and, for `/v1/mcp`, whether the request named it (`Some(true)`)
/// or runs in its MCP session's own (`Some(false)`); `None` for a request of no session. A
/// session's routes name it in the path; `/v1/mcp` by its header, query or MCP session.
fn session_named(request: &Request) -> Option<(String, Option<bool>)> {
    match session_of(request.uri().path()) {
        Some(session) => Some((session, None)),
        None => super::mcp_session::routed_session(request.headers(), request.uri().query())
            .map(|(session, named)| (session, Some(named))),
    }
}

/// The node that made the request's MCP session (its id names it), when it is another: an
/// MCP request in an MCP session's own kernel session is served there, the only place that
/// session lives, tool run or not.
fn mcp_creator(node: &ClusterNode, request: &Request) -> Option<String> {
    let id = super::mcp_session::mcp_session_id(request.headers())?;
    super::mcp_session::creator_node(&id)
        .filter(|creator| *creator != node.name())
        .map(str::to_string)
}

/// Serves an MCP request on the node that made its MCP session (here, when that node says
/// so).
async fn to_mcp_creator(
    state: &AppState,
    node: &Arc<ClusterNode>,
    creator: &str,
    forwarded: bool,
    request: Request,
    next: Next,
) -> Response {
    match node.mcp_route(creator, forwarded).await {
        Err(e) => e.into_response(),
        Ok(None) => next.run(request).await,
        Ok(Some(target)) => node
            .forward(&target, request, state.forward_deadline())
            .await
            .unwrap_or_else(|e| e.into_response()),
    }
}

/// Whether the request may start the session's kernel (and so claims it) or only finds it,
/// as its route declares.
fn kind_of(declared: Declared, named: Option<bool>) -> Kind {
    match (declared, named) {
        (Declared::Mcp, Some(false)) | (Declared::Finds, _) => Kind::Finds,
        (Declared::Mcp, _) | (Declared::Starts, _) => Kind::Starts,
    }
}

/// Serves a session's request on this node. A session claimed here starts its kernel under
/// its policy and settings as the catalog has them (docs/cluster.md, "Session policies and
/// settings"), held until the request is served: meanwhile they are not forgotten to make
/// room for another session's, which would start the kernel without them. A claim whose
/// request started no kernel (refused, invalid) is given back, so failed requests leave no
/// live session behind.
async fn serve_here(
    state: &AppState,
    node: &Arc<ClusterNode>,
    tenant: &str,
    session: &str,
    claimed: bool,
    request: Request,
    next: Next,
) -> Response {
    let hold = claimed.then(|| state.orchestrator().sessions().hold(tenant, session));
    if claimed {
        if let Err(e) = node.load_session_config(state, tenant, session).await {
            node.release(tenant, session);
            return e.into_response();
        }
    }
    let response = next.run(request).await;
    drop(hold);
    if claimed && !state.orchestrator().has_session(tenant, session) {
        node.release(tenant, session);
    }
    response
}
