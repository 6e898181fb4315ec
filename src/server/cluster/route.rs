//! Where a session's request is served (docs/cluster.md, "Routing"), as the middleware on
//! every `/v1/sessions/{session}/...` route of a cluster node (`server/api/routing.rs`) asks.
//!
//! A session with a kernel here is served here without asking the catalog (a warm cell reads
//! nothing from it). Otherwise a request that starts a kernel (an execute, an upload) claims
//! the session in the catalog, here when this node has room and is not draining, else on the
//! freer of two other nodes with room; a claim that finds the session live on another node
//! forwards there; a session of a tenant with workspaces goes back to the live node that
//! holds its workspace. Any other request (interrupt, clear, a download, a listing) looks the
//! session up and forwards to the node that holds it, or is served here. A forwarded request
//! is served here or refused, never forwarded again; the placements found are remembered
//! until their node's epoch moves on.

use axum::http::StatusCode;

use crate::cluster::{Claim, ClaimRequest, NodeState, Placement};
use crate::registry::ClusterShares;
use crate::server::error::ApiError;
use crate::server::tenants::Tenant;
use crate::server::AppState;

use super::{ClusterNode, Target};

/// Whether a request may start the session's kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An execute or an upload: the session is claimed if no node holds it.
    Starts,
    /// Anything else: served where the session is, or here.
    Finds,
}

/// Where a request goes.
#[derive(Debug)]
pub(crate) enum Route {
    /// Served by this node; `claimed` when this request claimed the session here (to be
    /// given back if it starts no kernel).
    Here {
        /// The session was claimed for this request.
        claimed: bool,
    },
    /// Sent to the node that holds the session.
    Forward(Target),
}

/// The session named by a `/v1/sessions/{session}...` path, percent-decoded.
pub(crate) fn session_of(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v1/sessions/")?;
    let segment = rest.split('/').next().filter(|s| !s.is_empty())?;
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

impl ClusterNode {
    /// Where a request of `tenant` for `session` goes (or why it is refused).
    pub(crate) async fn decide(
        &self,
        state: &AppState,
        tenant: &Tenant,
        session: &str,
        kind: Kind,
        forwarded: bool,
    ) -> Result<Route, ApiError> {
        if !self.serving() {
            return Err(fenced());
        }
        let orchestrator = state.orchestrator();
        if crate::orchestrator::migration::migrations(orchestrator).is_moving(&tenant.name, session)
        {
            return Err(super::migrate::migrating(session));
        }
        if orchestrator.has_session(&tenant.name, session) {
            return Ok(Route::Here { claimed: false });
        }
        if !forwarded {
            if let Some(target) = self.placement(&tenant.name, session) {
                return Ok(Route::Forward(target));
            }
        }
        match kind {
            Kind::Finds => self.find(tenant, session, forwarded).await,
            Kind::Starts => self.claim(state, tenant, session, forwarded).await,
        }
    }

    /// A request that starts nothing: to the node holding the session, else here.
    async fn find(
        &self,
        tenant: &Tenant,
        session: &str,
        forwarded: bool,
    ) -> Result<Route, ApiError> {
        let found = self.store.lookup(&tenant.name, session).await;
        match found {
            Ok(Some(p)) if p.live && p.node_current && p.node != self.options.node => {
                if forwarded {
                    return Err(second_hop(&p.node));
                }
                let target = target_of(&p);
                self.remember(&tenant.name, session, &target);
                Ok(Route::Forward(target))
            }
            // A session's workspace is read where it is (`GET .../workspace` needs no kernel).
            Ok(Some(p)) if !forwarded && tenant.workspaces.is_some() => match self.home_of(&p) {
                Some(home) => Ok(Route::Forward(home)),
                None => Ok(Route::Here { claimed: false }),
            },
            // Nowhere else (or the catalog is down): what this node has answers.
            _ => Ok(Route::Here { claimed: false }),
        }
    }

    /// A request that may start a kernel: the session claimed here or on a node with room.
    async fn claim(
        &self,
        state: &AppState,
        tenant: &Tenant,
        session: &str,
        forwarded: bool,
    ) -> Result<Route, ApiError> {
        let me = self.me();
        let target = self
            .claim_target(state, tenant, session, forwarded, &me)
            .await?;
        let claimed = self
            .store
            .claim(&ClaimRequest {
                tenant: tenant.name.clone(),
                session: session.to_string(),
                node: target.node.clone(),
                epoch: target.epoch,
                tenant_cap: tenant
                    .max_kernels
                    .map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
            })
            .await
            .map_err(|e| catalog_unavailable(&e.to_string()))?;
        match claimed {
            Claim::Claimed { entries } if target == me => {
                state
                    .orchestrator()
                    .adopt_session(&tenant.name, session, entries);
                Ok(Route::Here { claimed: true })
            }
            Claim::Claimed { .. } => {
                self.remember(&tenant.name, session, &target);
                Ok(Route::Forward(target))
            }
            Claim::Held(p) if forwarded => Err(second_hop(&p.node)),
            Claim::Held(p) => {
                let target = target_of(&p);
                self.remember(&tenant.name, session, &target);
                Ok(Route::Forward(target))
            }
            Claim::TenantAtCap { live } => Err(tenant_at_cap(&tenant.name, live)),
            Claim::Fenced if target == me => {
                // A claim made with an epoch this node has since left behind (it rejoined
                // meanwhile) says nothing about the new one.
                if target.epoch == self.epoch() {
                    self.fence_soon();
                }
                Err(fenced())
            }
            // The node picked for the session moved on: this node takes it after all.
            Claim::Fenced => Err(left_while_placed(&target.node)),
        }
    }

    /// This node as a target, at its current epoch.
    fn me(&self) -> Target {
        Target {
            node: self.options.node.clone(),
            epoch: self.epoch(),
            advertise: self.options.advertise.clone(),
        }
    }

    /// Where a new session is claimed: its workspace's node; else this node while it has
    /// room and is not draining (a forwarded request is served here even then); else a node
    /// with room, or this one (`me`) when there is none.
    async fn claim_target(
        &self,
        state: &AppState,
        tenant: &Tenant,
        session: &str,
        forwarded: bool,
        me: &Target,
    ) -> Result<Target, ApiError> {
        if let Some(home) = self.workspace_home(tenant, session, forwarded).await {
            return Ok(home);
        }
        let (live, cap) = state.orchestrator().session_kernels();
        let draining = self.is_draining();
        if live < cap && (forwarded || !draining) {
            return Ok(me.clone());
        }
        Ok(self
            .place_when_full(state, tenant, forwarded, draining)
            .await?
            .unwrap_or_else(|| me.clone()))
    }
}

/// 429 `at_capacity`: the tenant has its cap of live sessions across the cluster.
fn tenant_at_cap(tenant: &str, live: u32) -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "at_capacity",
            format!("tenant {tenant:?} has {live} live sessions across the cluster, its cap"),
        )
    }
}

/// 503 `node_unavailable`: the node picked for the session left the cluster meanwhile.
fn left_while_placed(node: &str) -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "node_unavailable",
            format!("node {node:?} left the cluster while the session was placed on it; retry"),
        )
    }
}

impl ClusterNode {
    /// The node holding the workspace of `tenant`'s `session` when it is another live node
    /// that is not draining (of any epoch: a node that restarted keeps its disk): a session of a tenant with
    /// workspaces is placed where its files are (docs/workspaces.md, "In a cluster"). `None`
    /// for a tenant without workspaces, a forwarded request, a session last served here or
    /// never placed, or one whose node is gone (its files with it: the next kernel reports
    /// `workspace_lost`).
    async fn workspace_home(
        &self,
        tenant: &Tenant,
        session: &str,
        forwarded: bool,
    ) -> Option<Target> {
        if tenant.workspaces.is_none() || forwarded {
            return None;
        }
        let placed = self.store.lookup(&tenant.name, session).await.ok()??;
        self.home_of(&placed)
    }

    /// The node of `placed` when it is another node that is live and not draining, as this
    /// node's view of the cluster (refreshed with every lease renewal) has it.
    fn home_of(&self, placed: &Placement) -> Option<Target> {
        if placed.node == self.options.node {
            return None;
        }
        self.live_peer(&placed.node)
            .filter(|_| !self.peer_draining(&placed.node))
    }

    /// Where a request of an MCP session made by node `creator` (not this one) goes: to that
    /// node while it is live (a node the view does not have live is read from the catalog
    /// again: the view may not have caught up with a node that just joined); `None` (served
    /// here, which answers that there is no such session) when it is not, or when the
    /// request was forwarded already.
    pub(crate) async fn mcp_route(
        &self,
        creator: &str,
        forwarded: bool,
    ) -> Result<Option<Target>, ApiError> {
        if !self.lease_valid() {
            return Err(fenced());
        }
        if forwarded {
            return Ok(None);
        }
        if let Some(target) = self.live_peer(creator) {
            return Ok(Some(target));
        }
        let rows = self
            .store
            .nodes()
            .await
            .map_err(|e| catalog_unavailable(&e.to_string()))?;
        self.refresh_view(rows);
        Ok(self.live_peer(creator))
    }

    /// Where a new session goes when this host is full or draining (docs/cluster.md, "Caps
    /// and fair shares"): the fair shares are refreshed from the catalog (of the cluster's
    /// capacity, counting every node's kernels); here when an idle kernel of a tenant above
    /// its share may be evicted here; else the freer of two other nodes with room; else
    /// `None`: here, where the single-host rules decide (the requester's own idle kernel, or
    /// 429 `at_capacity` with `Retry-After`). A forwarded request stays here.
    async fn place_when_full(
        &self,
        state: &AppState,
        tenant: &Tenant,
        forwarded: bool,
        draining: bool,
    ) -> Result<Option<Target>, ApiError> {
        let orchestrator = state.orchestrator();
        let rows = self
            .store
            .nodes()
            .await
            .map_err(|e| catalog_unavailable(&e.to_string()))?;
        let elsewhere = self
            .store
            .tenants_elsewhere(&self.options.node)
            .await
            .map_err(|e| catalog_unavailable(&e.to_string()))?;
        let capacity = rows
            .iter()
            .filter(|r| matches!(r.state, NodeState::Live))
            .map(|r| usize::try_from(r.capacity).unwrap_or(usize::MAX))
            .fold(0usize, usize::saturating_add);
        self.refresh_view(rows);
        orchestrator.set_cluster_shares(ClusterShares {
            capacity,
            elsewhere: elsewhere
                .into_iter()
                .map(|(t, n)| (t, usize::try_from(n).unwrap_or(usize::MAX)))
                .collect(),
        });
        if forwarded || (!draining && orchestrator.room_for(&tenant.name, tenant.limits())) {
            return Ok(None);
        }
        Ok(self.other_with_room())
    }
}

fn target_of(p: &Placement) -> Target {
    Target {
        node: p.node.clone(),
        epoch: p.epoch,
        advertise: p.advertise.clone(),
    }
}

/// This node's lease is not trusted: it serves nothing until it rejoins.
fn fenced() -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "node_fenced",
            "this node could not renew its cluster lease and is rejoining; retry (another node may answer)",
        )
    }
}

/// The catalog did not answer: a session with no kernel here cannot be placed.
pub(super) fn catalog_unavailable(why: &str) -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "catalog_unavailable",
            format!("the cluster catalog is unavailable, so a new session cannot be placed (sessions with a kernel keep working): {why}"),
        )
    }
}

/// A forwarded request for a session this node does not hold: never a second hop.
fn second_hop(holder: &str) -> ApiError {
    ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        "second_hop_refused",
        format!("this forwarded request's session is held by node {holder:?}; a request is forwarded once at most, retry"),
    )
}

#[cfg(test)]
mod tests {
    use super::session_of;

    #[test]
    fn the_session_is_the_first_segment_after_sessions_percent_decoded() {
        assert_eq!(session_of("/v1/sessions/a/execute").as_deref(), Some("a"));
        assert_eq!(session_of("/v1/sessions/a%3Ab").as_deref(), Some("a:b"));
        assert_eq!(session_of("/v1/sessions/s/files/x/y").as_deref(), Some("s"));
        assert_eq!(session_of("/v1/sessions/"), None);
        assert_eq!(session_of("/v1/kernels"), None);
    }
}
