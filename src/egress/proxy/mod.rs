//! The egress proxy (`docs/reliability.md`, "Network egress"): HTTP CONNECT (TLS only: the
//! ClientHello's server name must be the CONNECT host) and plain HTTP (the Host header must be
//! the request's host), for kernels it knows by their address on the egress network and the
//! credential in their proxy URL. Every destination is judged by the kernel's
//! [`Grant`](super::Grant) on its name, then on each address the proxy resolved it to; the
//! upstream connection goes to a judged address only. Bounded: request heads, connections in
//! all and per kernel (held for as long as a tunnel or upstream connection lives), bytes per
//! second per kernel, every wait (a tunnel's whole ClientHello, an idle tunnel).
//!
//! | file | what |
//! |---|---|
//! | `listener.rs` | accepting connections, the kernel's credential, dispatching CONNECT and plain HTTP |
//! | `lookup.rs` | one bounded lookup of a name, and the cache of the addresses names denied exactly resolved to |
//! | `resolve.rs` | judging and resolving a destination: names before any lookup, every address against the special ranges, the host's own addresses and the addresses of denied names |
//! | `connect.rs` | a CONNECT tunnel: the ClientHello's server name checked, then bytes copied as they are |
//! | `intercept.rs` | a CONNECT tunnel to a host a credential rule names: TLS ended with a kernelbox CA leaf and begun again to the verified host, each request checked and given the rule's headers |
//! | `interception.rs` | what interception needs: the rules, the CA, the upstream TLS configuration |
//! | `http.rs` | a plain HTTP request forwarded (origin-form, hop headers removed), its response streamed back |
//! | `table.rs` | the kernels served ([`KernelEntry`]: credential, grant, live connections) and the shared [`Table`] |
//! | `limits.rs` | [`Limits`], the step timeout and head size, the per-kernel byte budget and the metered upstream stream |
//! | `outcome.rs` | why a connection was refused or failed ([`Outcome`]), the message a cell sees, plain-text responses |
//! | `audit.rs` | tenants' counters and the `--egress-audit` file's writer (rotation, repeated refusals counted) |
//! | `finish.rs` | the accounting of one connection: its audit line and its tenant's counters, when refused or ended |
//! | `refusals.rs` | [`Refusals`]: the recent refusals, bounded per tenant and host, for `GET /v1/egress/refusals` |

mod audit;
mod connect;
mod finish;
mod http;
mod intercept;
mod interception;
mod limits;
mod listener;
mod lookup;
mod outcome;
mod refusals;
mod resolve;
mod table;

pub use audit::{
    AuditFile, AuditLine, Rotation, TenantCounters, AUDIT_BACKLOG, AUDIT_KEEP, AUDIT_ROTATE_BYTES,
    MAX_AUDIT_HOST_BYTES, MAX_REPEAT_KEYS, REPEAT_WINDOW,
};
pub use interception::Interception;
pub use limits::{
    Limits, DEFAULT_TOTAL_CONNECTIONS, HELLO_TIMEOUT, MAX_HEAD_BYTES, STEP_TIMEOUT,
    TUNNEL_IDLE_TIMEOUT,
};
pub use listener::serve;
pub use lookup::{DENIED_NAME_TTL, MAX_DENIED_NAMES};
pub use outcome::Outcome;
pub use refusals::{Refusals, MAX_REFUSALS, REFUSALS_PER_TENANT};
pub use table::{KernelEntry, Table};
