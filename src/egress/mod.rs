//! Network egress by policy (`docs/reliability.md`, "Network egress"): a kernel with a policy
//! reaches only kernelbox's own proxy, which judges every destination against its tenant's and
//! session's policy.
//!
//! | file | what |
//! |---|---|
//! | `policy.rs` | policies parsed and matched: entries, presets, the special address ranges, a kernel's [`Grant`] (tenant ∩ session) |
//! | `sni.rs` | the server name of a TLS ClientHello, read with every length checked |
//! | `secrets.rs` | credentials added at the boundary: each tenant's secrets (never printed) and rules `host -> headers` |
//! | `ca.rs` | the kernelbox egress CA (kept `0600`, rotated on request), its cached leaves, the upstream TLS configuration |
//! | `host.rs` | the host's own addresses (its interfaces, the networks they are on, kernelbox's listeners), refreshed |
//! | `network.rs` | the egress network (internal, no traffic between kernels) and its host firewall rules, named after it |
//! | `proxy/` | the proxy: CONNECT (TLS, server name checked) and plain HTTP, kernels known by address and credential, limits, counters, the audit line (its `mod.rs` says which file does what) |
//! | `config.rs` | [`EgressConfig`], [`CredentialsConfig`]: what egress is started with |
//! | `mod.rs` | [`Egress`]: the network, firewall and proxy of one instance, the tenants' and sessions' policies, what a kernel with a policy is made with |

pub mod policy;
mod sessions;
pub mod sni;

pub use sessions::{policy_bytes, MAX_NETWORK_BYTES_PER_TENANT};

pub use config::{CredentialsConfig, EgressConfig};
pub use policy::{Grant, Policy, PolicyError, Refusal};

pub mod ca;
pub mod config;
pub mod host;
pub mod network;
pub mod proxy;
pub mod secrets;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::docker::{Engine, Mount};
use crate::wire::NetworkPolicy;

/// Where the CA bundle is mounted (read-only) in kernels with a policy.
pub const CA_BUNDLE_PATH: &str = "/etc/kernelbox/ca-bundle.crt";

/// Egress could not start.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// Parsing a tenant's policy failed.
    #[error("tenant {tenant}: {source}")]
    Policy {
        /// The tenant whose policy is refused.
        tenant: String,
        /// What is wrong.
        source: PolicyError,
    },
    /// Setting up the network or its firewall failed.
    #[error(transparent)]
    Network(#[from] network::NetworkError),
    /// Binding the proxy on the network's gateway failed.
    #[error("binding the egress proxy on {addr}: {message}")]
    Bind {
        /// The gateway address the proxy was to listen on.
        addr: IpAddr,
        /// What the system said.
        message: String,
    },
    /// Opening the audit file (`--egress-audit`) failed.
    #[error("opening the egress audit file {path}: {message}")]
    Audit {
        /// The audit file as given.
        path: PathBuf,
        /// What the system said.
        message: String,
    },
    /// The egress CA or the upstream trust store could not be set up.
    #[error(transparent)]
    Ca(#[from] ca::CaError),
    /// The CA bundle is not a readable file.
    #[error("the CA bundle {0} is not a readable file")]
    CaBundle(PathBuf),
}

/// A session's policy that cannot be set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionPolicyError {
    /// Parsing the session's policy failed.
    #[error(transparent)]
    Invalid(#[from] PolicyError),
    /// Setting a session policy with any entry, for a tenant allowed no network: a session's
    /// policy only narrows its tenant's, and nothing is kept for a tenant with none.
    #[error(
        "tenant {tenant:?} has no network, so its sessions have no network policy of their own (the tenants file's `network`, or --network-allow, gives it one)"
    )]
    TenantHasNone {
        /// The tenant with no network.
        tenant: String,
    },
    /// The tenant's sessions' policies already hold [`MAX_NETWORK_BYTES_PER_TENANT`] bytes (a
    /// new session's policy is refused rather than an older one forgotten: a forgotten
    /// narrowing would widen that session's network).
    #[error(
        "tenant {tenant:?}'s sessions' network policies would hold more than {max_bytes} bytes, the most kept; delete sessions no longer used (DELETE /v1/sessions/{{session}}) or use the tenant's policy"
    )]
    TooMany {
        /// The tenant at its bound.
        tenant: String,
        /// The bound, in bytes ([`MAX_NETWORK_BYTES_PER_TENANT`]).
        max_bytes: usize,
    },
}

/// What a kernel with a policy is made with: the network, its environment, its mounts.
#[derive(Debug, Clone)]
pub struct KernelNetwork {
    /// The egress network's name (the container's network mode).
    pub network: String,
    /// The credential in its proxy URL.
    pub token: String,
    /// `HTTP_PROXY` and the rest, `KEY=value`.
    pub env: Vec<String>,
    /// The CA bundle, read-only.
    pub mounts: Vec<Mount>,
}

/// Egress for one instance: the network, its firewall, the proxy and the policies.
pub struct Egress {
    engine: Arc<dyn Engine>,
    names: network::Names,
    proxy: SocketAddr,
    table: Arc<proxy::Table>,
    limits: proxy::Limits,
    ca_bundle: PathBuf,
    /// The tenants' policies, swapped whole by a reload (`set_tenants`).
    tenants: arc_swap::ArcSwap<HashMap<String, Arc<Policy>>>,
    /// Sessions' own policies; held while a kernel is registered with the proxy, so that a
    /// policy set during a kernel's start applies to it (`sessions.rs`).
    sessions: Mutex<sessions::SessionPolicies>,
    cancel: CancellationToken,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("network", &self.names.network)
            .field("proxy", &self.proxy)
            .finish_non_exhaustive()
    }
}

impl Egress {
    /// Creates the network (labelled `labels`), binds the proxy on its gateway, admits only the
    /// proxy's port from it, and serves.
    pub async fn start(
        engine: Arc<dyn Engine>,
        instance: &str,
        labels: &BTreeMap<String, String>,
        config: &EgressConfig,
    ) -> Result<Egress, EgressError> {
        let tenants = parse_tenants(&config.tenants)?;
        if !config.ca_bundle.is_file() {
            return Err(EgressError::CaBundle(config.ca_bundle.clone()));
        }
        // The instance's first 4 characters and 4 random ones: several orchestrators of one
        // process (tests) each have their own network; the label says whose it is.
        let tag = format!(
            "{}{}",
            instance
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .take(4)
                .collect::<String>(),
            &uuid::Uuid::new_v4().simple().to_string()[..4]
        );
        let names = network::Names::of(&tag);
        let crate::docker::NetworkAddrs { gateway, subnet } =
            network::create(engine.as_ref(), &names, labels).await?;
        let audit = match &config.audit {
            Some(path) => match proxy::AuditFile::open(path) {
                Ok(file) => Some(file),
                Err(e) => {
                    let _ = network::remove(engine.as_ref(), &names).await;
                    return Err(EgressError::Audit {
                        path: path.clone(),
                        message: e.to_string(),
                    });
                }
            },
            None => None,
        };
        let listener = match TcpListener::bind((gateway, 0)).await {
            Ok(l) => l,
            Err(e) => {
                let _ = network::remove(engine.as_ref(), &names).await;
                return Err(EgressError::Bind {
                    addr: gateway,
                    message: e.to_string(),
                });
            }
        };
        let proxy = listener.local_addr().map_err(|e| EgressError::Bind {
            addr: gateway,
            message: e.to_string(),
        })?;
        if let Err(e) = network::firewall(&names, gateway, proxy.port()) {
            let _ = network::remove(engine.as_ref(), &names).await;
            return Err(e.into());
        }
        // With credential rules, kernels trust the kernelbox CA too (docs/reliability.md,
        // "Credentials at the boundary"): a bundle of the operator's and the CA's certificate.
        let (interception, ca_bundle) = match &config.credentials {
            Some(c) if !c.secrets.is_empty() => {
                let made = ca::Ca::open(&c.ca_dir, &config.ca_bundle, c.rotate_ca)
                    .and_then(|(ca, bundle)| Ok((ca, bundle, ca::upstream(&config.ca_bundle)?)));
                match made {
                    Ok((ca, bundle, upstream)) => (
                        Some(Arc::new(proxy::Interception::new(
                            c.secrets.clone(),
                            ca,
                            upstream,
                        ))),
                        bundle,
                    ),
                    Err(e) => {
                        let _ = network::remove(engine.as_ref(), &names).await;
                        return Err(e.into());
                    }
                }
            }
            _ => (None, config.ca_bundle.clone()),
        };
        let table =
            Arc::new(proxy::Table::new(audit, Some(subnet)).with_interception(interception));
        table.refuse_listeners(&[proxy]);
        let cancel = CancellationToken::new();
        tokio::spawn(proxy::serve(
            listener,
            table.clone(),
            config.limits,
            cancel.clone(),
        ));
        tracing::info!(network = %names.network, proxy = %proxy, "egress proxy listening");
        Ok(Egress {
            engine,
            names,
            proxy,
            table,
            limits: config.limits,
            ca_bundle,
            tenants: arc_swap::ArcSwap::from_pointee(tenants),
            sessions: Mutex::new(sessions::SessionPolicies::default()),
            cancel,
        })
    }

    /// The proxy's address (on the egress network's gateway).
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy
    }

    /// Refuses `addrs` (kernelbox's own listening addresses: the API's, the metrics') as
    /// destinations whatever the policy (`docs/reliability.md`, "Special and host addresses").
    pub fn refuse_listeners(&self, addrs: &[SocketAddr]) {
        self.table.refuse_listeners(addrs);
    }

    /// The egress network's name.
    pub fn network_name(&self) -> &str {
        &self.names.network
    }

    /// The grant of `tenant`'s `session`: `None` when the tenant allows nothing (its kernels
    /// have no network at all).
    pub fn grant(&self, tenant: &str, session: &str) -> Option<Grant> {
        let tenant_policy = self.tenants.load().get(tenant)?.clone();
        let session_policy = self.lock_sessions().get(tenant, session);
        Some(Grant {
            tenant: tenant_policy,
            session: session_policy,
        })
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, sessions::SessionPolicies> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `wire` parsed as a session policy of `tenant`, and the bytes it counts: refused for a
    /// tenant with no network when it holds any entry; `None` for a policy with no entry of a
    /// tenant with no network (nothing to keep: its sessions have no network anyway).
    pub fn check_session(
        &self,
        tenant: &str,
        wire: &NetworkPolicy,
    ) -> Result<Option<(Arc<Policy>, usize)>, SessionPolicyError> {
        check_session_policy(self.tenants.load().contains_key(tenant), tenant, wire)
    }

    /// The bytes `tenant`'s sessions' policies hold here.
    pub fn session_bytes(&self, tenant: &str) -> usize {
        self.lock_sessions().bytes(tenant)
    }

    /// Forgets the own policies of all of `tenant`'s sessions (the tenant was removed by a
    /// reload, its kernels first: a tenant added back under its name starts with none).
    pub fn forget_tenant_sessions(&self, tenant: &str) {
        self.lock_sessions().forget_tenant(tenant);
    }

    /// Sets `tenant`'s `session`'s own policy (`None`: forgets it) at `version` (the catalog's,
    /// 0 on one host; an older version never replaces a newer) and applies it at once to its
    /// running kernels and to one registering meanwhile: connections it no longer allows are
    /// closed (their number is returned). The session's policy is intersected with the
    /// tenant's (a destination must pass both). `evictable` says which other sessions'
    /// policies may go to make room (on a cluster node, those with no kernel here); without
    /// it, a policy past [`MAX_NETWORK_BYTES_PER_TENANT`] is refused. `forced` keeps it even
    /// then (the catalog accepted it).
    pub fn set_session(
        &self,
        tenant: &str,
        session: &str,
        policy: Option<(Arc<Policy>, usize)>,
        version: u64,
        evictable: Option<&dyn Fn(&str) -> bool>,
        forced: bool,
    ) -> Result<usize, SessionPolicyError> {
        let mut sessions = self.lock_sessions();
        let changed = sessions.keep(sessions::Keep {
            tenant,
            session,
            policy,
            version,
            max_bytes: MAX_NETWORK_BYTES_PER_TENANT,
            evictable,
            forced,
        })?;
        let tenants = self.tenants.load();
        let Some(tenant_policy) = tenants.get(tenant).filter(|_| changed) else {
            return Ok(0);
        };
        let grant = Grant {
            tenant: tenant_policy.clone(),
            session: sessions.get(tenant, session),
        };
        Ok(self
            .table
            .of_session(tenant, session)
            .iter()
            .map(|k| k.set_grant(grant.clone()))
            .sum())
    }

    /// Replaces the tenants' policies (a reload of the tenants) and judges every registered
    /// kernel's live connections again against its tenant's new policy intersected with its
    /// session's, as a session's policy change does (`set_session`): those no longer allowed
    /// are closed, and their number is returned. A tenant now without a policy allows nothing
    /// (its kernels keep the egress network, whose proxy refuses every destination). A
    /// policy that does not parse changes nothing.
    pub fn set_tenants(
        &self,
        policies: &BTreeMap<String, NetworkPolicy>,
    ) -> Result<usize, EgressError> {
        let parsed = parse_tenants(policies)?;
        // The sessions' lock is held across the swap, so a session's change meanwhile is
        // judged against one tenant policy or the other, never lost.
        let sessions = self.lock_sessions();
        self.tenants.store(Arc::new(parsed));
        let tenants = self.tenants.load();
        Ok(self
            .table
            .all()
            .iter()
            .map(|k| {
                k.set_grant(Grant {
                    tenant: tenants.get(&k.tenant).cloned().unwrap_or_default(),
                    session: sessions.get(&k.tenant, &k.session),
                })
            })
            .sum())
    }

    /// Replaces every tenant's credential secrets and rules (a reload; docs/reliability.md,
    /// "Credentials at the boundary"): connections opened from now on are judged by them.
    /// False, with nothing changed, when this proxy intercepts nothing (it started with no
    /// rule, so without the kernelbox CA in its kernels) and `secrets` holds a rule: only a
    /// restart can apply them.
    pub fn set_secrets(&self, secrets: secrets::Secrets) -> bool {
        match self.table.interception() {
            Some(interception) => {
                interception.secrets.store(Arc::new(secrets));
                true
            }
            None => secrets.is_empty(),
        }
    }

    /// What a new kernel of a session with `grant` is made with.
    pub fn kernel_network(&self) -> KernelNetwork {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let url = format!("http://kernelbox:{token}@{}", self.proxy);
        let mut env = Vec::new();
        for var in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "http_proxy",
            "https_proxy",
            "ALL_PROXY",
            "all_proxy",
        ] {
            env.push(format!("{var}={url}"));
        }
        for var in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "PIP_CERT",
            "CURL_CA_BUNDLE",
        ] {
            env.push(format!("{var}={CA_BUNDLE_PATH}"));
        }
        env.extend(
            [
                "PIP_INDEX_URL=https://pypi.org/simple",
                "PIP_USER=1",
                "PIP_BREAK_SYSTEM_PACKAGES=1",
                "PIP_DISABLE_PIP_VERSION_CHECK=1",
                "PIP_NO_INPUT=1",
            ]
            .map(String::from),
        );
        KernelNetwork {
            network: self.names.network.clone(),
            token,
            env,
            mounts: vec![Mount::Bind {
                source: self.ca_bundle.to_string_lossy().into_owned(),
                target: CA_BUNDLE_PATH.into(),
                read_only: true,
            }],
        }
    }

    /// Serves the started container `id` (made with `net`) as `tenant`'s `session`'s kernel,
    /// known by its address on the network. Returns its address. The tenant's and the
    /// session's policies are read while the kernel is entered, under the lock a policy change
    /// takes: a change (a reload of the tenants included) made during the kernel's start
    /// applies to it.
    pub async fn register(
        &self,
        id: &str,
        net: &KernelNetwork,
        tenant: &str,
        session: &str,
    ) -> Result<IpAddr, crate::docker::EngineError> {
        let addr = self
            .engine
            .container_address(id, &self.names.network)
            .await?
            .ok_or_else(|| crate::docker::EngineError::Other {
                op: "inspect container",
                target: id.to_string(),
                message: "the kernel has no address on the egress network".into(),
            })?;
        // The tenant's policy and the session's are read again under the sessions' lock, which
        // `set_tenants` and `set_session` hold across their swap and their judging of the
        // registered kernels: a kernel whose start straddled a reload (or a session's change)
        // is registered under the new policy, never the one its start began with.
        let sessions = self.lock_sessions();
        let grant = Grant {
            tenant: self.tenants.load().get(tenant).cloned().unwrap_or_default(),
            session: sessions.get(tenant, session),
        };
        let entry = proxy::KernelEntry::new(
            net.token.clone(),
            tenant.to_string(),
            session.to_string(),
            grant,
            &self.limits,
        );
        self.table.insert(addr, Arc::new(entry));
        drop(sessions);
        Ok(addr)
    }

    /// Stops serving the kernel at `addr` made with `token`.
    pub fn unregister(&self, addr: IpAddr, token: &str) {
        self.table.remove(addr, token);
    }

    /// The tenants with a policy, sorted (their metric series exist from the first scrape).
    pub fn tenants(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tenants.load().keys().cloned().collect();
        names.sort();
        names
    }

    /// The proxy's last `limit` refusals, of `tenant` when given, the most recent first.
    pub fn refusals(&self, tenant: Option<&str>, limit: usize) -> Vec<crate::wire::EgressRefusal> {
        self.table.refusals.recent(tenant, limit)
    }

    /// Every tenant's counters, for `/metrics`.
    pub fn counters(&self) -> Vec<(String, proxy::TenantCounters)> {
        self.table.counters()
    }

    /// Counts each connection's bytes in the usage ledger's `pending` rows for its kernel's
    /// session, when the connection ends (`docs/usage.md`).
    pub fn count_usage_in(&self, pending: Arc<crate::usage::Pending>) {
        self.table.count_usage_in(pending);
    }

    /// Gives the usage ledger the bytes open connections moved since it was last asked
    /// (called before each ledger flush).
    pub fn settle_usage(&self) {
        self.table.settle_usage();
    }

    /// Stops the proxy, closes its audit file and removes the network and its firewall rules.
    pub async fn stop(&self) {
        self.cancel.cancel();
        // The audit file's last counted refusals are written before the process ends (its
        // writer is a thread the process would not wait for).
        let table = self.table.clone();
        if tokio::task::spawn_blocking(move || table.close_audit())
            .await
            .is_err()
        {
            tracing::warn!("closing the egress audit file failed");
        }
        if let Err(e) = network::remove(self.engine.as_ref(), &self.names).await {
            tracing::warn!(network = %self.names.network, error = %e, "removing the egress network");
        }
    }
}

/// The tenants' policies parsed, those allowing nothing left out (their kernels have no
/// network).
fn parse_tenants(
    wires: &BTreeMap<String, NetworkPolicy>,
) -> Result<HashMap<String, Arc<Policy>>, EgressError> {
    let mut tenants = HashMap::new();
    for (tenant, wire) in wires {
        let policy = Policy::parse(wire).map_err(|source| EgressError::Policy {
            tenant: tenant.clone(),
            source,
        })?;
        if !policy.is_none() {
            tenants.insert(tenant.clone(), Arc::new(policy));
        }
    }
    Ok(tenants)
}

/// `wire` as a session policy of `tenant` (`has_network`: the tenant is allowed any): see
/// [`Egress::check_session`]; without egress, no tenant has a network.
pub fn check_session_policy(
    has_network: bool,
    tenant: &str,
    wire: &NetworkPolicy,
) -> Result<Option<(Arc<Policy>, usize)>, SessionPolicyError> {
    let policy = Policy::parse(wire)?;
    if has_network {
        return Ok(Some((Arc::new(policy), policy_bytes(wire))));
    }
    if wire.allow.is_empty() && wire.deny.is_empty() {
        return Ok(None);
    }
    Err(SessionPolicyError::TenantHasNone {
        tenant: tenant.to_string(),
    })
}

/// Removes egress networks (and their firewall rules) matching every label filter (the sweep
/// of a dead instance's objects).
pub async fn sweep(engine: &dyn Engine, labels: &[String]) {
    let mut filters = labels.to_vec();
    filters.push(format!("{}=true", network::NETWORK_LABEL));
    let Ok(found) = engine.list_networks(&filters).await else {
        return;
    };
    for name in found {
        if let Some(names) = network::Names::of_network(&name) {
            let _ = network::remove(engine, &names).await;
        }
    }
}
