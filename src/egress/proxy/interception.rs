//! What intercepting a credential rule's host needs (`docs/reliability.md`, "Credentials at
//! the boundary"): the tenants' rules, the kernelbox CA, the upstream TLS configuration.

use std::sync::Arc;

use super::super::ca::Ca;
use super::super::secrets::Secrets;

/// What interception needs: the tenants' rules, the CA, the upstream TLS configuration.
#[derive(Debug)]
pub struct Interception {
    /// Every tenant's secrets and rules, swapped whole by a reload (`Egress::set_secrets`).
    pub secrets: arc_swap::ArcSwap<Secrets>,
    pub(super) ca: Ca,
    pub(super) upstream: Arc<rustls::ClientConfig>,
}

impl Interception {
    /// Interception by `secrets`' rules, leaves signed by `ca`, upstream verified by `upstream`.
    pub fn new(secrets: Secrets, ca: Ca, upstream: Arc<rustls::ClientConfig>) -> Interception {
        Interception {
            secrets: arc_swap::ArcSwap::from_pointee(secrets),
            ca,
            upstream,
        }
    }
}
