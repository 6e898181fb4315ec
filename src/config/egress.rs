//! Network egress and credentials at the boundary (`docs/reliability.md`, "Network egress"):
//! the types are egress's own (`src/egress/config.rs`), held here as part of [`Config`](super::Config).

pub use crate::egress::config::{CredentialsConfig, EgressConfig, DEFAULT_CA_BUNDLE};
