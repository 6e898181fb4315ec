//! This server as a node of a kernelbox cluster (docs/cluster.md): one PostgreSQL catalog
//! (`crate::cluster`), any node taking any request, each session served on the one node that
//! holds it, a lease that the node renews or fences itself before it can expire.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`ClusterNode`]: this node's name, address, epoch and lease, what it last read of the other nodes, the placements it remembers, its settings and counters |
//! | `lease.rs` | the lease loop: renew, expire dead nodes, refresh the view of the nodes, fence and rejoin |
//! | `config.rs` | sessions' network policies and settings in the catalog: written by a `PUT`, loaded by a claim, forgotten with the session |
//! | `route.rs` | where a session's request is served: here, one hop away, or refused (asked by the middleware in `server/api/routing.rs`) |
//! | `forward.rs` | the hop: the request streamed to the node that holds the session, its answer streamed back |
//! | `drain.rs` | draining: no new sessions, the deadline past which what is left is ended `node_drained`, the drain a stop waits for |
//! | `migrate.rs` | migration on drain: a pass moving idle runsc kernels to other nodes, the checkpoint streamed over the hop, the hop route receiving one |
//! | `workspaces.rs` | a tenant's workspaces across the nodes: the list gathered from every node holding some, a delete served by the node holding the workspace |
//! | `admin.rs` | `GET /v1/nodes`, `POST /v1/nodes/{node}/drain`, `GET /v1/nodes/{node}/kernels`, behind the admin token |

mod admin;
mod config;
mod drain;
mod forward;
mod lease;
mod migrate;
mod route;
mod workspaces;

pub(crate) use admin::{drain_node, list_nodes, node_kernels};
pub(crate) use migrate::receive_migration;
pub(crate) use route::{session_of, Kind, Route};
pub(crate) use workspaces::DeleteRoute;
pub use workspaces::{MAX_WORKSPACE_LIST_BYTES, WORKSPACE_HOP_DEADLINE};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cell::LossReason;
use crate::cluster::{ClusterError, NodeInfo, NodeRow, NodeState, PostgresCatalog, Store};
use crate::histogram::Histogram;
use crate::orchestrator::Orchestrator;

/// The header a forwarded request carries (the forwarding node's name): the node that gets it
/// serves the request itself or refuses it, never forwards it again.
pub const FORWARDED_HEADER: &str = "x-kernelbox-forwarded-by";

/// The header that proves a forwarded request came from a node of this cluster: the
/// cluster's hop secret (`kb_cluster` in the catalog). Without it, [`FORWARDED_HEADER`] is
/// ignored, so a client cannot skip the placement checks a hop would skip.
pub const HOP_HEADER: &str = "x-kernelbox-hop";

/// Connections of the lease's own pool (renewals never wait behind claims).
const LEASE_POOL: usize = 2;

/// Default time a node's lease lasts past its last renewal.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// Default margin: a node that could not renew fences itself this long before its lease
/// could expire.
pub const DEFAULT_FENCE_MARGIN: Duration = Duration::from_secs(3);

/// Most placements of sessions on other nodes remembered; past it the memory starts over
/// (a forgotten placement is looked up again).
const MAX_PLACEMENTS: usize = 65_536;

/// Upper bounds of the forward and renew latency histograms, in seconds.
const LATENCY_BUCKETS: [f64; 10] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0,
];

/// How a node joins its cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The PostgreSQL catalog (`postgres://...`).
    pub url: String,
    /// This node's name, unique in the cluster.
    pub node: String,
    /// How the other nodes reach this one (`http://ADDR:PORT`).
    pub advertise: String,
    /// How long a lease lasts past its last renewal (judged by the database's clock).
    pub lease_ttl: Duration,
    /// How long before its lease could expire a node that could not renew fences itself.
    pub fence_margin: Duration,
    /// The token `GET /v1/nodes` and `POST /v1/nodes/{node}/drain` need (none: they are 404).
    pub admin_token: Option<String>,
    /// How long a draining node keeps its live sessions before they are ended and reported
    /// `node_drained`; also makes a stop (SIGTERM) drain first (none: a drain waits for its
    /// sessions to end, and a stop does not drain).
    pub drain_deadline: Option<Duration>,
}

impl ClusterOptions {
    /// The options' own problem, if any (the margin must leave room to renew).
    pub fn problem(&self) -> Option<String> {
        if let Err(e) = crate::owner::validate_name("node", &self.node) {
            return Some(format!("the node name: {e}"));
        }
        if self.fence_margin.is_zero() || self.fence_margin >= self.lease_ttl {
            return Some(format!(
                "the fence margin ({:?}) must be more than 0 and less than the lease TTL ({:?})",
                self.fence_margin, self.lease_ttl
            ));
        }
        if self.renew_every() < Duration::from_millis(100) {
            return Some("the lease TTL minus the fence margin must be at least 400ms".into());
        }
        if !(self.advertise.starts_with("http://") && self.advertise.len() > 7) {
            return Some(format!(
                "--advertise {:?}: give an http://HOST:PORT the other nodes can reach",
                self.advertise
            ));
        }
        None
    }

    /// How often the lease is renewed: four tries fit in the time before the fence, at most
    /// every 2 s.
    fn renew_every(&self) -> Duration {
        (self.lease_ttl.saturating_sub(self.fence_margin) / 4).min(Duration::from_secs(2))
    }
}

/// What this node last read of another node.
#[derive(Debug, Clone)]
struct Peer {
    epoch: i64,
    advertise: String,
    live: bool,
    draining: bool,
    free: u32,
}

/// Where to send a request: a node and its epoch when it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub(crate) node: String,
    pub(crate) epoch: i64,
    pub(crate) advertise: String,
}

/// What this node knows of the others, and where it last found sessions held elsewhere.
#[derive(Debug, Default)]
struct View {
    peers: HashMap<String, Peer>,
    /// (tenant, session) -> the node holding it, at the epoch it was found there.
    placements: HashMap<(String, String), (String, i64)>,
}

/// Counters for `/metrics`.
#[derive(Debug)]
struct Counters {
    forwarded: AtomicU64,
    forward_failures: AtomicU64,
    fences: AtomicU64,
    node_losses: AtomicU64,
    renew_failures: AtomicU64,
    drained_sessions: AtomicU64,
    forward_seconds: Mutex<Histogram>,
    renew_seconds: Mutex<Histogram>,
}

/// This server as a node of its cluster.
#[derive(Debug)]
pub struct ClusterNode {
    options: ClusterOptions,
    store: Store,
    /// The lease's own connections: renewals, expiries, the view, rejoining.
    lease_store: Store,
    /// SHA-256 of the cluster's hop secret, and the secret itself for the hops this node makes.
    hop_sha256: [u8; 32],
    hop_secret: String,
    /// The node's current epoch (shared with its catalog, whose writes carry it).
    epoch: Arc<AtomicI64>,
    /// Nanoseconds after `base` until which the lease is trusted; 0 while fenced.
    valid_until: AtomicU64,
    base: Instant,
    /// Woken when a request learns the node is fenced (a claim refused for its epoch).
    fence_now: tokio::sync::Notify,
    /// Whether this node is draining, as last read from the catalog.
    draining: AtomicBool,
    /// Nanoseconds after `base` before which this node does not serve although it holds its
    /// lease: a namesake may still trust the lease it held (`drain.rs`); 0: no wait.
    serve_from: AtomicU64,
    /// Whether this node is stopping after a drain (`drain.rs`).
    stopping: AtomicBool,
    /// When the drain began (`drain.rs`).
    drain_state: Mutex<drain::DrainState>,
    /// True once a drain left no live kernel here (`drain.rs`).
    drained: tokio::sync::watch::Sender<bool>,
    view: Mutex<View>,
    /// Notified each time the view of the nodes is refreshed.
    view_changed: tokio::sync::Notify,
    admin_sha256: Option<[u8; 32]>,
    forwarder: forward::Forwarder,
    counters: Counters,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl ClusterNode {
    /// Connects to the catalog, applies its migrations, and registers this node with a new
    /// epoch (kernels an earlier run of this node left live are reported
    /// `server_restarted`). Returns the node and the catalog its orchestrator writes to.
    pub async fn join(
        options: ClusterOptions,
        capacity: usize,
    ) -> Result<(Arc<ClusterNode>, PostgresCatalog), ClusterError> {
        let store = Store::connect(&options.url).await?;
        let lease_store = Store::connect_sized(&options.url, LEASE_POOL).await?;
        let hop_secret = store.hop_secret().await?;
        let info = NodeInfo {
            name: options.node.clone(),
            advertise: options.advertise.clone(),
            capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
            lease_ttl: options.lease_ttl,
        };
        let twin = drain::namesake_may_serve(&lease_store, &options).await;
        let sent = Instant::now();
        let epoch = lease_store
            .register(&info, LossReason::ServerRestarted)
            .await?;
        let epoch = Arc::new(AtomicI64::new(epoch));
        let catalog = PostgresCatalog::new(
            store.clone(),
            options.node.clone(),
            epoch.clone(),
            tokio::runtime::Handle::current(),
        );
        let admin_sha256 = options
            .admin_token
            .as_deref()
            .map(|t| Sha256::digest(t.as_bytes()).into());
        let node = Arc::new(ClusterNode {
            store,
            lease_store,
            hop_sha256: Sha256::digest(hop_secret.as_bytes()).into(),
            hop_secret,
            epoch,
            valid_until: AtomicU64::new(0),
            base: Instant::now(),
            fence_now: tokio::sync::Notify::new(),
            draining: AtomicBool::new(false),
            serve_from: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            drain_state: Mutex::new(drain::DrainState::default()),
            drained: tokio::sync::watch::Sender::new(false),
            view: Mutex::new(View::default()),
            view_changed: tokio::sync::Notify::new(),
            admin_sha256,
            forwarder: forward::Forwarder::new(),
            counters: Counters {
                forwarded: AtomicU64::new(0),
                forward_failures: AtomicU64::new(0),
                fences: AtomicU64::new(0),
                node_losses: AtomicU64::new(0),
                renew_failures: AtomicU64::new(0),
                drained_sessions: AtomicU64::new(0),
                forward_seconds: Mutex::new(Histogram::new(&LATENCY_BUCKETS)),
                renew_seconds: Mutex::new(Histogram::new(&LATENCY_BUCKETS)),
            },
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
            options,
        });
        node.trust_until(sent);
        if twin {
            node.hold_off();
        }
        Ok((node, catalog))
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.options.node
    }

    /// This node's current epoch.
    pub fn epoch(&self) -> i64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Starts the lease loop for `orchestrator` (owned by the node: [`ClusterNode::leave`]
    /// stops it).
    pub fn start(self: &Arc<Self>, orchestrator: Orchestrator) {
        let node = self.clone();
        self.tracker
            .spawn(async move { node.lease_loop(orchestrator).await });
    }

    /// Stops the lease loop and marks this node as gone on purpose (its kernels were
    /// already removed and reported by the orchestrator's shutdown), so no one expires it.
    pub async fn leave(&self) {
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        let left = tokio::time::timeout(
            Duration::from_secs(5),
            self.lease_store.leave(&self.options.node, self.epoch()),
        )
        .await;
        match left {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "leaving the cluster"),
            Err(_) => tracing::warn!("leaving the cluster: the catalog did not answer in 5s"),
        }
    }

    /// True while the lease is trusted: the node serves.
    pub(crate) fn lease_valid(&self) -> bool {
        let until = self.valid_until.load(Ordering::Acquire);
        until != 0 && self.nanos(Instant::now()) < until
    }

    /// The lease renewed by a call sent at `sent` is trusted until `sent + ttl - margin`.
    fn trust_until(&self, sent: Instant) {
        let ttl = self
            .options
            .lease_ttl
            .saturating_sub(self.options.fence_margin);
        self.valid_until
            .store(self.nanos(sent + ttl).max(1), Ordering::Release);
    }

    /// The lease is no longer trusted: requests are refused until the node rejoins.
    fn distrust(&self) {
        self.valid_until.store(0, Ordering::Release);
    }

    /// When the lease stops being trusted (now, if it is not).
    fn trusted_until(&self) -> Instant {
        let until = self.valid_until.load(Ordering::Acquire);
        self.base + Duration::from_nanos(until)
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Takes in what the catalog says of the nodes; placements on a node whose epoch moved
    /// on, or that is no longer live, are forgotten.
    fn refresh_view(&self, rows: Vec<NodeRow>) {
        let mut view = self.view.lock().unwrap_or_else(|p| p.into_inner());
        let mut peers = HashMap::new();
        for row in rows {
            if row.name == self.options.node {
                self.draining.store(row.draining, Ordering::Release);
            }
            peers.insert(
                row.name,
                Peer {
                    epoch: row.epoch,
                    advertise: row.advertise,
                    live: matches!(row.state, NodeState::Live),
                    draining: row.draining,
                    free: row.capacity.saturating_sub(row.live_kernels),
                },
            );
        }
        view.placements.retain(|_, (node, epoch)| {
            peers.get(node).is_some_and(|p| p.live && p.epoch == *epoch)
        });
        view.peers = peers;
        drop(view);
        self.view_changed.notify_waiters();
    }

    /// Resolves once the view shows `target` no longer live at its epoch (it expired, left
    /// or rejoined): a forward to it stops waiting then. A node the view does not know yet
    /// is waited for.
    pub(crate) async fn lost(&self, target: &Target) {
        loop {
            let changed = self.view_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let gone = self
                .view
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .peers
                .get(&target.node)
                .is_some_and(|p| !p.live || p.epoch != target.epoch);
            if gone {
                return;
            }
            changed.await;
        }
    }

    /// Where `tenant`'s `session` was last found on another node, if that node is still live
    /// at the same epoch.
    fn placement(&self, tenant: &str, session: &str) -> Option<Target> {
        let view = self.view.lock().unwrap_or_else(|p| p.into_inner());
        let (node, epoch) = view
            .placements
            .get(&(tenant.to_string(), session.to_string()))?;
        let peer = view.peers.get(node)?;
        (peer.live && peer.epoch == *epoch).then(|| Target {
            node: node.clone(),
            epoch: *epoch,
            advertise: peer.advertise.clone(),
        })
    }

    /// Node `name`, if the view has it live.
    fn live_peer(&self, name: &str) -> Option<Target> {
        let view = self.view.lock().unwrap_or_else(|p| p.into_inner());
        let peer = view.peers.get(name).filter(|p| p.live)?;
        Some(Target {
            node: name.to_string(),
            epoch: peer.epoch,
            advertise: peer.advertise.clone(),
        })
    }

    /// True when this node's view has `name` draining.
    fn peer_draining(&self, name: &str) -> bool {
        let view = self.view.lock().unwrap_or_else(|p| p.into_inner());
        view.peers.get(name).is_some_and(|p| p.draining)
    }

    fn remember(&self, tenant: &str, session: &str, target: &Target) {
        let mut view = self.view.lock().unwrap_or_else(|p| p.into_inner());
        if view.placements.len() >= MAX_PLACEMENTS {
            view.placements.clear();
        }
        view.placements.insert(
            (tenant.to_string(), session.to_string()),
            (target.node.clone(), target.epoch),
        );
    }

    pub(crate) fn forget(&self, tenant: &str, session: &str) {
        let mut view = self.view.lock().unwrap_or_else(|p| p.into_inner());
        view.placements
            .remove(&(tenant.to_string(), session.to_string()));
    }

    /// Another live node with room, not draining: the freer of two picked at random.
    fn other_with_room(&self) -> Option<Target> {
        let view = self.view.lock().unwrap_or_else(|p| p.into_inner());
        let candidates: Vec<(&String, &Peer)> = view
            .peers
            .iter()
            .filter(|(name, p)| *name != &self.options.node && p.live && !p.draining && p.free > 0)
            .collect();
        let pick = match candidates.len() {
            0 => return None,
            1 => candidates[0],
            n => {
                let a = rand::random_range(0..n);
                let b = (a + 1 + rand::random_range(0..n - 1)) % n;
                if candidates[a].1.free >= candidates[b].1.free {
                    candidates[a]
                } else {
                    candidates[b]
                }
            }
        };
        Some(Target {
            node: pick.0.clone(),
            epoch: pick.1.epoch,
            advertise: pick.1.advertise.clone(),
        })
    }

    /// True when a request carries this cluster's hop secret: it was forwarded by a node.
    pub(crate) fn is_hop(&self, headers: &axum::http::HeaderMap) -> bool {
        headers
            .get(HOP_HEADER)
            .is_some_and(|v| Sha256::digest(v.as_bytes()).as_slice() == self.hop_sha256)
    }

    /// Gives back a claim whose request started no kernel here (in the background).
    pub(crate) fn release(self: &Arc<Self>, tenant: &str, session: &str) {
        let (node, tenant, session) = (self.clone(), tenant.to_string(), session.to_string());
        let epoch = self.epoch();
        self.tracker.spawn(async move {
            let released = node
                .store
                .release(&tenant, &session, &node.options.node, epoch)
                .await;
            if let Err(e) = released {
                tracing::warn!(error = %e, "giving back a claim that started no kernel");
            }
        });
    }

    /// True when `token` is the admin token.
    pub(crate) fn is_admin(&self, token: &str) -> bool {
        self.admin_sha256
            .is_some_and(|want| Sha256::digest(token.as_bytes()).as_slice() == want)
    }

    /// The cluster's lines of `/metrics`.
    pub(crate) fn render_metrics(&self, out: &mut String) -> std::fmt::Result {
        use std::fmt::Write;
        let c = &self.counters;
        let n = &self.options.node;
        for (name, help, value) in [
            (
                "kernelbox_cluster_forwarded_total",
                "Requests forwarded to the node holding their session.",
                &c.forwarded,
            ),
            (
                "kernelbox_cluster_forward_failures_total",
                "Forwards whose target node did not answer.",
                &c.forward_failures,
            ),
            (
                "kernelbox_cluster_fences_total",
                "Times this node fenced itself (every kernel removed, rejoined with a new epoch).",
                &c.fences,
            ),
            (
                "kernelbox_cluster_node_losses_total",
                "Nodes this node found with an expired lease and reported lost.",
                &c.node_losses,
            ),
            (
                "kernelbox_cluster_lease_renew_failures_total",
                "Lease renewals that failed or timed out.",
                &c.renew_failures,
            ),
            (
                "kernelbox_cluster_drained_kernels_total",
                "Kernels still live at a drain's deadline, ended and reported node_drained.",
                &c.drained_sessions,
            ),
        ] {
            writeln!(out, "# HELP {name} {help}")?;
            writeln!(out, "# TYPE {name} counter")?;
            writeln!(
                out,
                "{name}{{node=\"{n}\"}} {}",
                value.load(Ordering::Relaxed)
            )?;
        }
        writeln!(
            out,
            "# HELP kernelbox_cluster_epoch This node's current epoch."
        )?;
        writeln!(out, "# TYPE kernelbox_cluster_epoch gauge")?;
        writeln!(
            out,
            "kernelbox_cluster_epoch{{node=\"{n}\"}} {}",
            self.epoch()
        )?;
        for (name, help, histogram) in [
            (
                "kernelbox_cluster_forward_seconds",
                "Time to a forwarded request's response head.",
                &c.forward_seconds,
            ),
            (
                "kernelbox_cluster_lease_renew_seconds",
                "Time a lease renewal took.",
                &c.renew_seconds,
            ),
        ] {
            writeln!(out, "# HELP {name} {help}")?;
            writeln!(out, "# TYPE {name} histogram")?;
            let h = histogram.lock().unwrap_or_else(|p| p.into_inner());
            h.render(out, name, &format!("node=\"{n}\""))?;
        }
        Ok(())
    }
}
