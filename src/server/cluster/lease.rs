//! The lease loop (docs/cluster.md, "Leases and fencing"): renew this node's lease every
//! `renew_every`, trusting it until the renewal's send time plus the TTL minus the fence
//! margin; expire the nodes whose leases ran out by the database's clock; refresh the view of
//! the nodes. A node that cannot renew in time, or learns its epoch moved on, fences itself:
//! it stops serving, removes every kernel (their owners told `node_lost`), and rejoins with a
//! new epoch before it serves again.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cell::LossReason;
use crate::cluster::{NodeInfo, Renewal};
use crate::orchestrator::Orchestrator;

use super::ClusterNode;

/// Why a node fences itself.
#[derive(Debug, Clone, Copy)]
enum Why {
    /// Its lease was not renewed before the fence margin.
    NotRenewed,
    /// The catalog says its epoch moved on (another node expired it).
    Expired,
}

impl ClusterNode {
    pub(super) async fn lease_loop(self: Arc<Self>, orchestrator: Orchestrator) {
        let every = self.options.renew_every();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if self.lease_valid() {
            orchestrator.kernels_trusted_until(self.trusted_until());
        }
        loop {
            let deadline = tokio::time::Instant::from_std(self.trusted_until());
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep_until(deadline) => {
                    self.fence(&orchestrator, Why::NotRenewed).await;
                    continue;
                }
                _ = self.fence_now.notified() => {
                    self.fence(&orchestrator, Why::Expired).await;
                    continue;
                }
                _ = tick.tick() => {}
            }
            // The process may have been stopped past its fence time: judge before renewing.
            if !self.lease_valid() {
                self.fence(&orchestrator, Why::NotRenewed).await;
                continue;
            }
            if let Some(Renewal::Fenced) = self.renew(&orchestrator, every).await {
                self.fence(&orchestrator, Why::Expired).await;
                continue;
            }
            self.expire_others(every).await;
            if let Ok(Ok(rows)) = tokio::time::timeout(every, self.lease_store.nodes()).await {
                self.refresh_view(rows);
            }
            self.migrate_idle(&orchestrator);
            self.watch_drain(&orchestrator).await;
        }
    }

    /// One renewal, within `every`; `None` when it failed or timed out.
    async fn renew(&self, orchestrator: &Orchestrator, every: Duration) -> Option<Renewal> {
        let sent = Instant::now();
        let (live, _) = orchestrator.session_kernels();
        let live = u32::try_from(live).unwrap_or(u32::MAX);
        let renewed = tokio::time::timeout(
            every,
            self.lease_store
                .renew(&self.options.node, self.epoch(), live),
        )
        .await;
        match renewed {
            Ok(Ok(Renewal::Renewed)) => {
                self.trust_until(sent);
                orchestrator.kernels_trusted_until(self.trusted_until());
                self.counters
                    .renew_seconds
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .observe(sent.elapsed().as_secs_f64());
                Some(Renewal::Renewed)
            }
            Ok(Ok(Renewal::Fenced)) => Some(Renewal::Fenced),
            Ok(Err(e)) => {
                self.counters.renew_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "renewing this node's lease failed");
                None
            }
            Err(_) => {
                self.counters.renew_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(after = ?every, "renewing this node's lease timed out");
                None
            }
        }
    }

    /// Expires the nodes whose leases ran out (any live node may; one transaction each).
    async fn expire_others(&self, every: Duration) {
        let expired = tokio::time::timeout(every, self.lease_store.expire_dead()).await;
        if let Ok(Ok(expired)) = expired {
            for node in expired {
                self.counters.node_losses.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    node = %node.name,
                    epoch = node.epoch,
                    kernels_lost = node.kernels_lost,
                    "a node's lease expired: its sessions are reported node_lost"
                );
            }
        }
    }

    /// Stops serving, removes every kernel, and rejoins with a new epoch (retrying until the
    /// catalog answers or the node is stopped).
    async fn fence(&self, orchestrator: &Orchestrator, why: Why) {
        self.distrust();
        self.counters.fences.fetch_add(1, Ordering::Relaxed);
        self.view
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .placements
            .clear();
        let removed = orchestrator.fence(LossReason::NodeLost).await;
        tracing::warn!(
            ?why,
            epoch = self.epoch(),
            kernels_removed = removed,
            "fenced: every kernel of this node was removed; rejoining with a new epoch"
        );
        let (_, capacity) = orchestrator.session_kernels();
        let info = NodeInfo {
            name: self.options.node.clone(),
            advertise: self.options.advertise.clone(),
            capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
            lease_ttl: self.options.lease_ttl,
        };
        let every = self.options.renew_every();
        loop {
            let twin = super::drain::namesake_may_serve(&self.lease_store, &self.options).await;
            let sent = Instant::now();
            let registered = tokio::time::timeout(
                every,
                self.lease_store.register(&info, LossReason::NodeLost),
            )
            .await;
            match registered {
                Ok(Ok(epoch)) => {
                    self.epoch.store(epoch, Ordering::Release);
                    self.trust_until(sent);
                    orchestrator.kernels_trusted_until(self.trusted_until());
                    if twin {
                        self.hold_off();
                    }
                    tracing::info!(epoch, "rejoined the cluster");
                    return;
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "rejoining the cluster failed"),
                Err(_) => tracing::warn!("rejoining the cluster: the catalog did not answer"),
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
        }
    }

    /// Asks the lease loop to fence now (a claim found this node's epoch not current).
    pub(super) fn fence_soon(&self) {
        self.distrust();
        self.fence_now.notify_one();
    }
}
