//! The admin token (`serve --admin-token`): the operator's, no tenant's. Kept as its SHA-256
//! digest only; the operator's routes (`api/admin.rs`) and the console (`console/`) check a
//! bearer token against it.

use sha2::{Digest, Sha256};

/// The admin token's digest.
#[derive(Debug, Clone)]
pub struct AdminToken {
    sha256: [u8; 32],
}

impl AdminToken {
    /// The admin token `token`; `None` when it is blank.
    pub fn new(token: &str) -> Option<AdminToken> {
        (!token.trim().is_empty()).then(|| AdminToken {
            sha256: Sha256::digest(token.as_bytes()).into(),
        })
    }

    /// True when `token` is the admin token.
    pub fn is(&self, token: &str) -> bool {
        Sha256::digest(token.as_bytes()).as_slice() == self.sha256
    }
}
