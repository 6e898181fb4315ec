//! Draining (docs/cluster.md, "Draining and upgrades"): a draining node takes no new session
//! (the catalog's claim skips it), its sessions end by idle reap or on request, and once it
//! has drained for `--drain-deadline` the sessions still live on it are ended and reported
//! `node_drained`, never silently lost. A drain starts with `kernelbox drain NODE` (read from
//! the catalog at each renewal) or with a stop (SIGTERM) of a node that has a deadline: it
//! marks itself draining, serves until it is empty or the deadline passes, then leaves.
//!
//! Namesakes: an engine may briefly run two agents of one node name (a Swarm task restarted
//! while the old one still runs). Each registration moves the epoch on, and the agent whose
//! epoch moved on learns it at its next renewal; until then it still trusts its lease. So an
//! agent that registers while a namesake's lease is fresh serves only once any lease that
//! namesake could still trust has run out (`ttl - margin` after the registration): never
//! two agents of one name serving at once.
//!
//! Before its deadline a draining node migrates its idle runsc kernels to other nodes
//! (`migrate.rs`, docs/cluster.md "Migration on drain"); what is left at the deadline is
//! ended as above.
//!
//! The lease loop calls [`ClusterNode::watch_drain`] at each renewal, so the deadline is kept
//! to within one renewal interval (at most 2 s).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::cell::LossReason;
use crate::cluster::{NodeState, Store};
use crate::orchestrator::Orchestrator;

use super::{ClusterNode, ClusterOptions};

/// True when the catalog shows a live agent of this node's name whose lease is fresh (it may
/// still serve), or when the catalog cannot tell (assumed so).
pub(super) async fn namesake_may_serve(store: &Store, options: &ClusterOptions) -> bool {
    match tokio::time::timeout(options.renew_every(), store.nodes()).await {
        Ok(Ok(rows)) => rows.iter().any(|r| {
            r.name == options.node
                && matches!(r.state, NodeState::Live)
                && r.lease_age < options.lease_ttl
        }),
        _ => true,
    }
}

/// How long a stopping node waits for the catalog to take its drain mark.
const MARK_TIMEOUT: Duration = Duration::from_secs(5);

/// Where this node's drain stands.
#[derive(Debug, Default)]
pub(super) struct DrainState {
    /// When the drain was first seen; `None` while not draining.
    since: Option<Instant>,
}

impl DrainState {
    /// When the drain was first seen; `None` while not draining.
    pub(super) fn since(&self) -> Option<Instant> {
        self.since
    }
}

impl ClusterNode {
    /// This node holds its lease and may serve (not waiting out a namesake's lease).
    pub(crate) fn serving(&self) -> bool {
        self.lease_valid() && self.nanos(Instant::now()) >= self.serve_from.load(Ordering::Acquire)
    }

    /// Serve only once a lease a namesake could still trust has run out: `ttl - margin`
    /// from now (just after this node's registration).
    pub(super) fn hold_off(&self) {
        let wait = self
            .options
            .lease_ttl
            .saturating_sub(self.options.fence_margin);
        self.serve_from
            .store(self.nanos(Instant::now() + wait), Ordering::Release);
        tracing::warn!(
            ?wait,
            "an agent of this node's name held a fresh lease: serving only once it has run out"
        );
    }

    /// Resolves once this node may serve (at once, unless it waits out a namesake's lease).
    pub async fn until_serving(&self) {
        let from = self.serve_from.load(Ordering::Acquire);
        let at = self.base + Duration::from_nanos(from);
        tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
    }

    /// True while this node drains: marked so in the catalog, or stopping with a deadline.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire) || self.stopping.load(Ordering::Acquire)
    }

    /// One look at the drain (from the lease loop): starts or clears its clock, ends what is
    /// still live here past the deadline (`node_drained`), and tells a stop waiting for the
    /// drain that the node is empty.
    pub(super) async fn watch_drain(&self, orchestrator: &Orchestrator) {
        if !self.is_draining() {
            self.drain_state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .since = None;
            self.drained.send_replace(false);
            crate::orchestrator::migration::migrations(orchestrator).drain_over();
            return;
        }
        let since = *self
            .drain_state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .since
            .get_or_insert_with(Instant::now);
        let (live, _) = orchestrator.session_kernels();
        // A kernel being migrated is out of the registry but not gone yet (`migrate.rs`).
        if live == 0 && !crate::orchestrator::migration::migrations(orchestrator).any_moving() {
            self.drained.send_replace(true);
            return;
        }
        let Some(deadline) = self.options.drain_deadline else {
            return;
        };
        if since.elapsed() >= deadline {
            let ended = orchestrator.fence(LossReason::NodeDrained).await;
            self.counters
                .drained_sessions
                .fetch_add(u64::try_from(ended).unwrap_or(u64::MAX), Ordering::Relaxed);
            tracing::warn!(
                kernels_ended = ended,
                after = ?deadline,
                "the drain's deadline passed: the kernels still live here were ended (node_drained)"
            );
            self.drained.send_replace(true);
        }
    }

    /// On a stop, with `--drain-deadline`: marks this node draining (here and in the
    /// catalog), then waits until it has no live kernel or the deadline has passed (the
    /// lease loop ends what is left, `node_drained`). Without a deadline it returns at once:
    /// the stop removes the kernels as on one host (`server_restarted`).
    pub async fn drain_before_stop(&self) {
        let Some(deadline) = self.options.drain_deadline.filter(|d| !d.is_zero()) else {
            return;
        };
        self.stopping.store(true, Ordering::Release);
        let marked = tokio::time::timeout(
            MARK_TIMEOUT,
            self.store.set_draining(&self.options.node, true),
        )
        .await;
        match marked {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "marking this node draining"),
            Err(_) => tracing::warn!("marking this node draining: the catalog did not answer"),
        }
        tracing::info!(
            ?deadline,
            "stopping: draining first (no new sessions here; live ones continue until they end or the deadline)"
        );
        // The lease loop looks at the drain at each renewal; past the deadline it ends what
        // is left, so this wait is bounded by the deadline plus two renewals.
        let bound = deadline + self.options.renew_every() * 2 + MARK_TIMEOUT;
        let mut drained = self.drained.subscribe();
        tokio::select! {
            _ = drained.wait_for(|d| *d) => {}
            _ = tokio::time::sleep(bound) => {
                tracing::warn!(?bound, "the drain did not finish in time: stopping anyway");
            }
            _ = self.cancel.cancelled() => {}
        }
    }
}
