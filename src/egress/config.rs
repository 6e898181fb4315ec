//! What egress is started with (`docs/reliability.md`, "Network egress"): the tenants'
//! policies, the CA bundle, the proxy's limits, the audit file and the credentials added at the
//! boundary. The configuration (`src/config/`) holds it as [`EgressConfig`]; [`Egress::start`](super::Egress::start) takes it.

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Network egress: the tenants' policies, the CA bundle kernels trust, the proxy's limits.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Each tenant's policy (the tenants file's `network`, or `--network-allow` for the
    /// default tenant); a tenant not here has no network.
    pub tenants: BTreeMap<String, crate::wire::NetworkPolicy>,
    /// The CA bundle mounted read-only into kernels with a policy (`--ca-bundle`).
    pub ca_bundle: PathBuf,
    /// Connections and bytes per second.
    pub limits: super::proxy::Limits,
    /// Where audit lines go, one JSON line per connection (`--egress-audit`: rotated, repeated
    /// refusals counted, `proxy::AuditFile`); `None`: the log.
    pub audit: Option<PathBuf>,
    /// Credentials added at the boundary (`--egress-secrets`); `None`: every tunnel carries
    /// its bytes untouched.
    pub credentials: Option<CredentialsConfig>,
}

/// Credentials added at the boundary (`docs/reliability.md`, "Credentials at the boundary").
#[derive(Debug, Clone)]
pub struct CredentialsConfig {
    /// Every tenant's secrets and rules.
    pub secrets: super::secrets::Secrets,
    /// Where the kernelbox egress CA is kept (generated there when missing).
    pub ca_dir: PathBuf,
    /// Replace the CA with a new one at start.
    pub rotate_ca: bool,
}

/// The CA bundle kernels with a policy trust unless told otherwise: the host's.
pub const DEFAULT_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
