//! Migration on drain, the cluster's side (docs/cluster.md, "Migration on drain"): while
//! this node drains, each renewal starts a pass (one at a time) that moves its idle runsc
//! kernels, one after another, to other live nodes with room (picked as routing picks,
//! [`ClusterNode::other_with_room`]); and the hop route that receives one.
//!
//! One move: the session is marked moving here (its calls are told to retry: 503
//! `session_migrating`), its kernel checkpointed with its container left running, the
//! checkpoint streamed to the target over the cluster's hop (the hop secret authenticates
//! it, as for a forwarded request), and the target moves the session in the catalog (fenced
//! by both nodes' epochs) and seeds the checkpoint; on its 200 this node closes the
//! kernel's books and removes its container. A failure after the checkpoint (the target
//! refused, the stream broke, no answer within [`SEND_DEADLINE`]) ends the kernel here
//! `node_drained`, unless the catalog shows the session moved after all (an answer lost on
//! the way): never a kernel on two nodes, never a hang.
//!
//! Nodes trust each other: a node holding the hop secret may send any tenant's kernel (as it
//! may forward any tenant's request). The receiver bounds what one sender makes it hold
//! (`services/migration/`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::Json;
use futures::TryStreamExt;
use http_body_util::BodyExt;

use crate::cluster::SessionMove;
use crate::orchestrator::migration::{self, Outgoing};
use crate::orchestrator::Orchestrator;
use crate::owner::KernelKey;
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::services::migration::{list_files, receive, send, Manifest, RECEIVE_DEADLINE};
use crate::services::MigrationError;

use super::{ClusterNode, Target, FORWARDED_HEADER, HOP_HEADER};

/// How long sending one checkpoint and getting the target's answer may take.
pub const SEND_DEADLINE: Duration = Duration::from_secs(75);

/// Kernels one pass looks at; the next pass (a renewal later) takes the rest.
const PASS_BATCH: usize = 64;

/// Bytes of a refusal's body read at most.
const MAX_ANSWER_BYTES: usize = 4 << 10;

/// The bytes in flight between the file reader and the connection.
const PIPE_BYTES: usize = 512 << 10;

/// The hop route that receives a kernel: `POST /v1/nodes/{node}/migrations`.
pub(crate) fn migrations_path(node: &str) -> String {
    format!("/v1/nodes/{node}/migrations")
}

impl ClusterNode {
    /// Starts a pass over this node's idle runsc kernels unless one runs (called at each
    /// renewal while draining). It stops at the drain's deadline.
    pub(super) fn migrate_idle(self: &Arc<Self>, orchestrator: &Orchestrator) {
        if !self.is_draining() || !self.serving() {
            return;
        }
        let since = self
            .drain_state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .since();
        let until = match (since, self.options.drain_deadline) {
            (Some(since), Some(deadline)) => Some(since + deadline),
            _ => None,
        };
        let node = self.clone();
        let orchestrator = orchestrator.clone();
        if !migration::migrations(&orchestrator).pass_free() {
            return;
        }
        self.tracker.spawn(async move {
            let migrations = migration::migrations(&orchestrator);
            let Some(_pass) = migrations.begin_pass() else {
                return;
            };
            for key in migration::migratable(&orchestrator, PASS_BATCH) {
                if node.cancel.is_cancelled()
                    || until.is_some_and(|u| Instant::now() >= u)
                    || !node.is_draining()
                {
                    return;
                }
                if migrations.was_tried(&key) {
                    continue;
                }
                let Some(target) = node.other_with_room() else {
                    tracing::info!("draining: no other node has room for a migration");
                    return;
                };
                let started = Instant::now();
                match node.migrate_one(&orchestrator, &key, &target).await {
                    Ok(()) => {
                        migrations.moved_out();
                        tracing::info!(owner = %key.owner, to = %target.node, seconds = started.elapsed().as_secs_f64(), "kernel migrated");
                    }
                    Err(e) => {
                        migrations.failed(&key);
                        tracing::warn!(owner = %key.owner, to = %target.node, error = %e, "migrating a kernel failed");
                    }
                }
            }
        });
    }

    /// Moves `key`'s kernel to `target` (see the module documentation).
    async fn migrate_one(
        &self,
        orchestrator: &Orchestrator,
        key: &KernelKey,
        target: &Target,
    ) -> Result<(), MigrationError> {
        let migrations = migration::migrations(orchestrator);
        let Some(_moving) = migrations.begin_move(&key.owner.tenant, &key.owner.session) else {
            return Err(MigrationError::Conflict {
                session: key.owner.session.clone(),
            });
        };
        let dir = migrations.fresh_dir("out-").await?;
        let result = self
            .checkpoint_and_send(orchestrator, key, target, &dir)
            .await;
        migrations.remove_dir(&dir).await;
        result
    }

    async fn checkpoint_and_send(
        &self,
        orchestrator: &Orchestrator,
        key: &KernelKey,
        target: &Target,
        dir: &std::path::Path,
    ) -> Result<(), MigrationError> {
        let out = migration::checkpoint_out(orchestrator, key, dir).await?;
        let sent = self.send_kernel(&out, target).await;
        let moved = match &sent {
            Ok(()) => true,
            // The answer may be what was lost: the catalog says where the session is.
            Err(_) => self
                .store
                .lookup(&key.owner.tenant, &key.owner.session)
                .await
                .ok()
                .flatten()
                .is_some_and(|p| p.node == target.node && p.epoch == target.epoch),
        };
        migration::finish_out(orchestrator, out, moved).await;
        if moved {
            Ok(())
        } else {
            sent
        }
    }

    /// Streams `out`'s checkpoint to `target`; `Ok` on its 200.
    async fn send_kernel(&self, out: &Outgoing, target: &Target) -> Result<(), MigrationError> {
        let files_dir = out.checkpoint.files();
        let files = {
            let dir = files_dir.clone();
            tokio::task::spawn_blocking(move || list_files(&dir))
                .await
                .map_err(|e| MigrationError::Io(e.to_string()))?
                .map_err(|e| MigrationError::Io(e.to_string()))?
        };
        let manifest = Manifest {
            key: out.key.clone(),
            generation: out.generation,
            from_node: self.options.node.clone(),
            from_epoch: self.epoch(),
            checkpoint: out.checkpoint.clone(),
            files,
        };
        let failed = |why: String| MigrationError::Target {
            node: target.node.clone(),
            why,
        };
        let uri: Uri = format!(
            "{}{}",
            target.advertise.trim_end_matches('/'),
            migrations_path(&target.node)
        )
        .parse()
        .map_err(|e| failed(format!("its address: {e}")))?;
        let (mut writer, reader) = tokio::io::duplex(PIPE_BYTES);
        let body = Body::from_stream(tokio_util::io::ReaderStream::new(reader));
        let mut request = Request::new(body);
        *request.method_mut() = Method::POST;
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        if let (Ok(me), Ok(secret)) = (
            HeaderValue::from_str(&self.options.node),
            HeaderValue::from_str(&self.hop_secret),
        ) {
            headers.insert(HeaderName::from_static(FORWARDED_HEADER), me);
            headers.insert(HeaderName::from_static(HOP_HEADER), secret);
        }
        let exchange = async {
            let (written, answered) = tokio::join!(
                async {
                    let r = send(&manifest, &files_dir, &mut writer).await;
                    drop(writer);
                    r
                },
                self.forwarder.client.request(request)
            );
            let response = answered.map_err(|e| failed(e.to_string()))?;
            let status = response.status();
            let body = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
                .collect()
                .await
                .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
                .unwrap_or_default();
            if status != StatusCode::OK {
                return Err(failed(format!("{status}: {body}")));
            }
            written
        };
        tokio::select! {
            r = tokio::time::timeout(SEND_DEADLINE, exchange) => {
                r.unwrap_or_else(|_| Err(failed(format!("no answer within {SEND_DEADLINE:?}"))))
            }
            () = self.lost(target) => Err(failed("its lease expired".into())),
        }
    }

    /// Receives a kernel (the hop route): the stream verified into a working directory, a
    /// container made, the session moved in the catalog, the checkpoint seeded.
    async fn receive_kernel(
        &self,
        orchestrator: &Orchestrator,
        body: Body,
    ) -> Result<(), MigrationError> {
        let migrations = migration::migrations(orchestrator);
        let Some(_permit) = migrations.incoming() else {
            return Err(MigrationError::Busy);
        };
        let dir = migrations.fresh_dir("in-").await?;
        let result = self.receive_into(orchestrator, body, &dir).await;
        if result.is_err() {
            migrations.remove_dir(&dir).await;
        }
        result
    }

    async fn receive_into(
        &self,
        orchestrator: &Orchestrator,
        body: Body,
        dir: &std::path::Path,
    ) -> Result<(), MigrationError> {
        let migrations = migration::migrations(orchestrator);
        let stream = TryStreamExt::map_err(body.into_data_stream(), std::io::Error::other);
        let mut reader = tokio_util::io::StreamReader::new(stream);
        let manifest = tokio::time::timeout(
            RECEIVE_DEADLINE,
            receive(&mut reader, dir, migrations.max_bytes()),
        )
        .await
        .map_err(|_| {
            MigrationError::Transfer(format!("not received within {RECEIVE_DEADLINE:?}"))
        })??;
        let key = &manifest.key;
        if key.runtime != crate::docker::KernelRuntime::Runsc || key.owner.child.is_some() {
            return Err(MigrationError::Transfer(
                "only a session's runsc kernel migrates".into(),
            ));
        }
        crate::owner::Owner::new(&key.owner.tenant, &key.owner.session, None)
            .map_err(|e| MigrationError::Transfer(e.to_string()))?;
        let conflict = || MigrationError::Conflict {
            session: key.owner.session.clone(),
        };
        let Some(_moving) = migrations.begin_move(&key.owner.tenant, &key.owner.session) else {
            return Err(conflict());
        };
        if orchestrator.has_session(&key.owner.tenant, &key.owner.session) {
            return Err(conflict());
        }
        let created = migration::create_in(orchestrator, key, manifest.generation).await?;
        let moved = self
            .store
            .move_session(&SessionMove {
                tenant: key.owner.tenant.clone(),
                session: key.owner.session.clone(),
                from: (manifest.from_node.clone(), manifest.from_epoch),
                to: (self.options.node.clone(), self.epoch()),
            })
            .await;
        let entries = match moved {
            Ok(Some(entries)) => entries,
            Ok(None) => {
                migration::discard_created(orchestrator, &created).await;
                return Err(MigrationError::Refused);
            }
            Err(e) => {
                migration::discard_created(orchestrator, &created).await;
                return Err(MigrationError::Catalog(e.to_string()));
            }
        };
        if let Err(e) = migration::seed_in(orchestrator, &manifest, &created, dir, entries) {
            migration::discard_created(orchestrator, &created).await;
            return Err(e);
        }
        migrations.arrived();
        tracing::info!(owner = %key.owner, from = %manifest.from_node, bytes = manifest.bytes(), "kernel arrived by migration");
        Ok(())
    }
}

/// `POST /v1/nodes/{node}/migrations`: a kernel sent by a draining node of this cluster
/// (the hop secret required; anything else is 404, as an unknown route).
pub(crate) async fn receive_migration(
    State(state): State<AppState>,
    Path(name): Path<String>,
    request: Request,
) -> Result<Json<serde_json::Value>, ApiError> {
    let node = state
        .cluster()
        .filter(|n| n.is_hop(request.headers()) && n.options.node == name)
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(format!("no route for POST /v1/nodes/{name}/migrations"))
        })?;
    if !node.serving() || node.is_draining() {
        return Err(ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "node_unavailable",
                "this node does not take migrations now (fenced or draining)",
            )
        });
    }
    let orchestrator = state.orchestrator().clone();
    match node
        .receive_kernel(&orchestrator, request.into_body())
        .await
    {
        Ok(()) => Ok(Json(serde_json::json!({"migrated": true}))),
        Err(e) => {
            let (status, code) = match &e {
                MigrationError::Busy => (StatusCode::SERVICE_UNAVAILABLE, "migration_busy"),
                MigrationError::TooLarge { .. } => {
                    (StatusCode::PAYLOAD_TOO_LARGE, "migration_too_large")
                }
                MigrationError::Transfer(_) => (StatusCode::BAD_REQUEST, "migration_transfer"),
                MigrationError::Conflict { .. } | MigrationError::Refused => {
                    (StatusCode::CONFLICT, "migration_refused")
                }
                _ => (StatusCode::INTERNAL_SERVER_ERROR, "migration_failed"),
            };
            Err(ApiError::new(status, code, e.to_string()))
        }
    }
}

/// The answer to a call for a session moving to or from this node: retry in a second.
pub(super) fn migrating(session: &str) -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "session_migrating",
            format!("session {session:?} is moving to another node (its node drains); retry"),
        )
    }
}
