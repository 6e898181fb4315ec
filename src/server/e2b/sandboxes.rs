//! The E2B API's sandboxes: which tenant owns each, its template, metadata, start and end of
//! life, and the hash of its access token; the task that kills a sandbox at its end of life.
//!
//! A sandbox is a kernelbox session of its tenant named by the sandbox's id; its kernel is
//! started by its first cell or file call, reaped when idle like any other (the next call
//! starts a new one), and cleared when the sandbox is killed or reaches its end. The table is
//! the facade's own state, in memory: a restart of the server forgets the sandboxes (their
//! kernels go with the instance anyway).
//!
//! Bounds: at most [`MAX_SANDBOXES_PER_TENANT`] sandboxes per tenant and
//! [`MAX_SANDBOXES`] on the host (one more is refused 429), each row at most
//! [`MAX_METADATA_BYTES`] of metadata; an end of life at most [`MAX_TIMEOUT`] away.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::E2bError;
use crate::server::AppState;
use crate::wire::Language;

/// Sandboxes one tenant may hold at once.
pub(crate) const MAX_SANDBOXES_PER_TENANT: usize = 256;
/// Sandboxes on the host at once.
pub(crate) const MAX_SANDBOXES: usize = 8192;
/// Bytes of one sandbox's metadata (keys and values).
pub(crate) const MAX_METADATA_BYTES: usize = 8 * 1024;
/// The longest a sandbox may live from a create, a connect or a timeout call (E2B's own cap
/// for its paid tier).
pub(crate) const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// A sandbox's life when the request names none (E2B's default).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The prefix of every sandbox id (a valid session name: `owner::validate_name`).
const ID_PREFIX: &str = "e2b-";
/// Code contexts a sandbox may make besides its languages' default ones (each is a kernel,
/// counted against the tenant's caps as any).
pub(crate) const MAX_CONTEXTS_PER_SANDBOX: usize = 8;

/// One sandbox.
#[derive(Debug, Clone)]
pub(crate) struct Sandbox {
    pub(crate) id: String,
    pub(crate) tenant: String,
    pub(crate) template: String,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) started_at: SystemTime,
    pub(crate) end_at: SystemTime,
    token_sha256: [u8; 32],
    /// The code contexts made by `POST /contexts` (id: language), each a named kernelbox
    /// context of the session (docs/e2b.md, "Contexts").
    pub(crate) contexts: BTreeMap<String, Language>,
}

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Sandbox>,
    per_tenant: HashMap<String, usize>,
}

struct Inner {
    table: Mutex<Table>,
    /// Woken when an end of life moves earlier (a create, a timeout call).
    changed: Notify,
    stop: CancellationToken,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

/// The E2B API's state: its sandboxes and the task ending them. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Facade {
    inner: Arc<Inner>,
}

fn hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn metadata_bytes(metadata: &BTreeMap<String, String>) -> usize {
    metadata.iter().map(|(k, v)| k.len() + v.len()).sum()
}

impl Facade {
    /// The facade for `state`'s server, its end-of-life task started (stopped by
    /// [`Facade::stop`]).
    pub(crate) fn start(state: &AppState) -> Facade {
        let facade = Facade {
            inner: Arc::new(Inner {
                table: Mutex::new(Table::default()),
                changed: Notify::new(),
                stop: CancellationToken::new(),
                task: Mutex::new(None),
            }),
        };
        let task = tokio::spawn(end_of_life(facade.clone(), state.clone()));
        *lock(&facade.inner.task) = Some(task);
        facade
    }

    /// Stops the end-of-life task and waits for it.
    pub(crate) async fn stop(&self) {
        self.inner.stop.cancel();
        let task = lock(&self.inner.task).take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// A new sandbox of `tenant`, living `timeout`; answers it and its access token.
    pub(crate) fn create(
        &self,
        tenant: &str,
        template: &str,
        metadata: BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<(Sandbox, String), E2bError> {
        if metadata_bytes(&metadata) > MAX_METADATA_BYTES {
            return Err(E2bError::bad_request(format!(
                "metadata is limited to {MAX_METADATA_BYTES} bytes"
            )));
        }
        let mut random = [0u8; 32];
        rand::rng().fill_bytes(&mut random);
        let token = hex::encode(random);
        let id = format!("{ID_PREFIX}{}", &uuid_hex()[..20]);
        let now = SystemTime::now();
        let sandbox = Sandbox {
            id: id.clone(),
            tenant: tenant.to_owned(),
            template: template.to_owned(),
            metadata,
            started_at: now,
            end_at: now + timeout.min(MAX_TIMEOUT),
            token_sha256: hash(&token),
            contexts: BTreeMap::new(),
        };
        {
            let mut table = lock(&self.inner.table);
            let held = table.per_tenant.get(tenant).copied().unwrap_or(0);
            if held >= MAX_SANDBOXES_PER_TENANT || table.by_id.len() >= MAX_SANDBOXES {
                return Err(E2bError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "too many sandboxes: {MAX_SANDBOXES_PER_TENANT} per tenant, {MAX_SANDBOXES} on this host; kill some first"
                    ),
                ));
            }
            *table.per_tenant.entry(tenant.to_owned()).or_default() += 1;
            table.by_id.insert(id, sandbox.clone());
        }
        self.inner.changed.notify_one();
        Ok((sandbox, token))
    }

    /// Whether sandbox `id` exists (for `/health`, which carries no credential).
    pub(crate) fn exists(&self, id: &str) -> bool {
        lock(&self.inner.table).by_id.contains_key(id)
    }

    /// `tenant`'s sandbox `id`.
    pub(crate) fn get(&self, tenant: &str, id: &str) -> Result<Sandbox, E2bError> {
        lock(&self.inner.table)
            .by_id
            .get(id)
            .filter(|s| s.tenant == tenant)
            .cloned()
            .ok_or_else(|| E2bError::sandbox_not_found(id))
    }

    /// A new code context of `language` in `tenant`'s sandbox `id`; answers its id (a
    /// kernelbox context name). At most [`MAX_CONTEXTS_PER_SANDBOX`] (each is a kernel).
    pub(crate) fn add_context(
        &self,
        tenant: &str,
        id: &str,
        language: Language,
    ) -> Result<String, E2bError> {
        let mut table = lock(&self.inner.table);
        let sandbox = table
            .by_id
            .get_mut(id)
            .filter(|s| s.tenant == tenant)
            .ok_or_else(|| E2bError::sandbox_not_found(id))?;
        if sandbox.contexts.len() >= MAX_CONTEXTS_PER_SANDBOX {
            return Err(E2bError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "a sandbox has at most {MAX_CONTEXTS_PER_SANDBOX} code contexts of its own; remove one first"
                ),
            ));
        }
        let context = format!("ctx-{}", &uuid_hex()[..16]);
        sandbox.contexts.insert(context.clone(), language);
        Ok(context)
    }

    /// Forgets a code context of `tenant`'s sandbox `id`; false when it has none of that id.
    pub(crate) fn remove_context(&self, tenant: &str, id: &str, context: &str) -> bool {
        lock(&self.inner.table)
            .by_id
            .get_mut(id)
            .filter(|s| s.tenant == tenant)
            .is_some_and(|s| s.contexts.remove(context).is_some())
    }

    /// `tenant`'s sandboxes whose metadata holds every pair of `metadata`, by start.
    pub(crate) fn list(&self, tenant: &str, metadata: &BTreeMap<String, String>) -> Vec<Sandbox> {
        let mut found: Vec<Sandbox> = lock(&self.inner.table)
            .by_id
            .values()
            .filter(|s| s.tenant == tenant)
            .filter(|s| metadata.iter().all(|(k, v)| s.metadata.get(k) == Some(v)))
            .cloned()
            .collect();
        found.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        found
    }

    /// Sets `tenant`'s sandbox `id` to end `timeout` from now.
    pub(crate) fn set_timeout(
        &self,
        tenant: &str,
        id: &str,
        timeout: Duration,
    ) -> Result<Sandbox, E2bError> {
        let sandbox = {
            let mut table = lock(&self.inner.table);
            let sandbox = table
                .by_id
                .get_mut(id)
                .filter(|s| s.tenant == tenant)
                .ok_or_else(|| E2bError::sandbox_not_found(id))?;
            sandbox.end_at = SystemTime::now() + timeout.min(MAX_TIMEOUT);
            sandbox.clone()
        };
        self.inner.changed.notify_one();
        Ok(sandbox)
    }

    /// A new access token for `tenant`'s sandbox `id` (a connect hands one out; the old one
    /// stops working).
    pub(crate) fn new_token(&self, tenant: &str, id: &str) -> Result<String, E2bError> {
        let mut random = [0u8; 32];
        rand::rng().fill_bytes(&mut random);
        let token = hex::encode(random);
        let mut table = lock(&self.inner.table);
        let sandbox = table
            .by_id
            .get_mut(id)
            .filter(|s| s.tenant == tenant)
            .ok_or_else(|| E2bError::sandbox_not_found(id))?;
        sandbox.token_sha256 = hash(&token);
        Ok(token)
    }

    /// Removes `tenant`'s sandbox `id` from the table (its kernels are the caller's to clear).
    pub(crate) fn remove(&self, tenant: &str, id: &str) -> Result<Sandbox, E2bError> {
        let mut table = lock(&self.inner.table);
        match table.by_id.get(id) {
            Some(s) if s.tenant == tenant => {}
            _ => return Err(E2bError::sandbox_not_found(id)),
        }
        let sandbox = table
            .by_id
            .remove(id)
            .ok_or_else(|| E2bError::sandbox_not_found(id))?;
        if let Some(n) = table.per_tenant.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                table.per_tenant.remove(tenant);
            }
        }
        Ok(sandbox)
    }

    /// The tenant owning sandbox `id` when one of `tokens` is its access token or the caller's
    /// key is its owner's (`by_key`, the tenant that key authenticates).
    pub(crate) fn open(&self, id: &str, tokens: &[&str], by_key: Option<&str>) -> Option<String> {
        let table = lock(&self.inner.table);
        let sandbox = table.by_id.get(id)?;
        let by_token = tokens.iter().any(|t| {
            let h = hash(t);
            // Compared whole, without an early exit on the first differing byte.
            h.iter()
                .zip(sandbox.token_sha256.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
        });
        (by_token || by_key == Some(sandbox.tenant.as_str())).then(|| sandbox.tenant.clone())
    }

    /// Sandboxes past their end of life, taken out of the table, and the next end of life.
    fn take_ended(&self, now: SystemTime) -> (Vec<Sandbox>, Option<SystemTime>) {
        let mut table = lock(&self.inner.table);
        let ended: Vec<String> = table
            .by_id
            .values()
            .filter(|s| s.end_at <= now)
            .map(|s| s.id.clone())
            .collect();
        let mut taken = Vec::new();
        for id in ended {
            if let Some(s) = table.by_id.remove(&id) {
                if let Some(n) = table.per_tenant.get_mut(&s.tenant) {
                    *n = n.saturating_sub(1);
                }
                taken.push(s);
            }
        }
        table.per_tenant.retain(|_, n| *n > 0);
        let next = table.by_id.values().map(|s| s.end_at).min();
        (taken, next)
    }
}

fn uuid_hex() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Clears the kernels of `tenant`'s sandbox `id` and forgets its session's settings: what a
/// kill and an end of life both do.
pub(crate) async fn clear(state: &AppState, tenant: &str, id: &str) {
    let orchestrator = state.orchestrator();
    orchestrator.clear_session(Some(tenant), id).await;
    if let Some(node) = state.cluster() {
        if let Err(e) = node.forget_session_config(tenant, id).await {
            tracing::warn!(error = %e.message, sandbox = id, "forgetting an E2B sandbox's settings");
        }
    }
    orchestrator.sessions().forget(tenant, id);
}

/// The end-of-life task: sleeps until the next sandbox's end (or a change), then kills every
/// sandbox past it; ends when the facade stops.
async fn end_of_life(facade: Facade, state: AppState) {
    loop {
        let (ended, next) = facade.take_ended(SystemTime::now());
        for sandbox in ended {
            tracing::info!(
                sandbox = sandbox.id,
                tenant = sandbox.tenant,
                "an E2B sandbox reached its end of life"
            );
            clear(&state, &sandbox.tenant, &sandbox.id).await;
        }
        let wait = next
            .and_then(|t| t.duration_since(SystemTime::now()).ok())
            .unwrap_or(if next.is_some() {
                Duration::ZERO
            } else {
                MAX_TIMEOUT
            });
        tokio::select! {
            _ = facade.inner.stop.cancelled() => return,
            _ = facade.inner.changed.notified() => {}
            _ = tokio::time::sleep(wait) => {}
        }
    }
}
