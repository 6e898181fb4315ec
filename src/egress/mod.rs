//! Network egress by policy (`docs/reliability.md`, "Network egress"): a kernel with a policy
//! reaches only kernelbox's own proxy, which judges every destination against its tenant's and
//! session's policy.
//!
//! | file | what |
//! |---|---|
//! | `policy.rs` | policies parsed and matched: entries, presets, the special address ranges, a kernel's [`Grant`] (tenant ∩ session) |
//! | `sni.rs` | the server name of a TLS ClientHello, read with every length checked |

pub mod policy;
pub mod sni;

pub use policy::{Grant, Policy, PolicyError, Refusal};
