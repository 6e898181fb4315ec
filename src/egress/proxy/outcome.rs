//! Why a connection was refused or failed, and what the cell is told.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::{Response, StatusCode};

use super::super::policy::Refusal;

/// Why a connection was refused or failed, beyond the policy's own reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// The policy refused it.
    Refused(Refusal),
    /// The CONNECT host, the TLS server name or the Host header disagree.
    Mismatch,
    /// A CONNECT tunnel that does not begin with a TLS ClientHello.
    NotTls,
    /// No valid credential for the kernel at that address.
    Unauthenticated,
    /// Past the kernel's connection limit.
    TooManyConnections,
    /// The request was malformed (no host, a relative URL, ...).
    BadRequest,
    /// The name did not resolve (or not in time).
    ResolveFailed,
    /// The destination did not answer.
    ConnectFailed,
    /// Closed because the session's policy changed and no longer allows it.
    PolicyChanged,
    /// The destination is on the egress network itself (another kernel): never, whatever
    /// the policy.
    KernelNetwork,
    /// The destination is the host itself (an address of its interfaces other than loopback,
    /// the unspecified address) or one of kernelbox's own listening addresses: never,
    /// whatever the policy.
    HostAddress,
    /// The kernel's TLS to an intercepted host failed (it does not trust the kernelbox CA?).
    KernelTls,
    /// An intercepted host's certificate is not trusted by the CA bundle (or it spoke no TLS).
    UpstreamTls,
    /// A `${secrets.NAME}` placeholder sent to a host no credential rule names.
    Placeholder,
}

impl Outcome {
    /// Every outcome (its `name` is a refusal reason of metrics and audit lines).
    pub const ALL: [Outcome; 16] = [
        Outcome::Refused(Refusal::NotAllowed),
        Outcome::Refused(Refusal::Denied),
        Outcome::Refused(Refusal::PrivateAddress),
        Outcome::Mismatch,
        Outcome::NotTls,
        Outcome::Unauthenticated,
        Outcome::TooManyConnections,
        Outcome::BadRequest,
        Outcome::ResolveFailed,
        Outcome::ConnectFailed,
        Outcome::PolicyChanged,
        Outcome::KernelNetwork,
        Outcome::HostAddress,
        Outcome::KernelTls,
        Outcome::UpstreamTls,
        Outcome::Placeholder,
    ];

    /// The name in metrics and audit lines.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Refused(r) => r.name(),
            Outcome::Mismatch => "host_mismatch",
            Outcome::NotTls => "not_tls",
            Outcome::Unauthenticated => "unauthenticated",
            Outcome::TooManyConnections => "too_many_connections",
            Outcome::BadRequest => "bad_request",
            Outcome::ResolveFailed => "resolve_failed",
            Outcome::ConnectFailed => "connect_failed",
            Outcome::PolicyChanged => "policy_changed",
            Outcome::KernelNetwork => "kernel_network",
            Outcome::HostAddress => "host_address",
            Outcome::KernelTls => "kernel_tls",
            Outcome::UpstreamTls => "upstream_tls",
            Outcome::Placeholder => "placeholder_without_rule",
        }
    }
}

pub(super) type Body = BoxBody<Bytes, hyper::Error>;

pub(super) fn text(status: StatusCode, message: String) -> Response<Body> {
    let mut response = Response::new(
        Full::new(Bytes::from(message + "\n"))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The message a cell sees (pip and `requests` show the status line and body).
pub(super) fn refusal_message(host: &str, port: u16, outcome: Outcome) -> String {
    let why = match outcome {
        Outcome::Refused(Refusal::NotAllowed) => {
            "the network policy (the tenant's or the session's) does not allow it"
        }
        Outcome::Refused(Refusal::Denied) => "the network policy denies it",
        Outcome::Refused(Refusal::PrivateAddress) => {
            "it resolves to a private, loopback, link-local or host-network address no allow entry inside its special range names"
        }
        Outcome::Mismatch => "the Host header (or TLS server name) is not the requested host",
        Outcome::NotTls => "a tunnel must carry TLS",
        Outcome::Unauthenticated => "no valid kernel credential",
        Outcome::TooManyConnections => "the kernel has too many connections open",
        Outcome::BadRequest => "the request names no host (send an absolute http:// URL)",
        Outcome::ResolveFailed => "the name did not resolve",
        Outcome::ConnectFailed => "the destination did not answer",
        Outcome::PolicyChanged => "the session's network policy changed",
        Outcome::KernelNetwork => "it is another kernel on the egress network",
        Outcome::HostAddress => "it is the host itself or kernelbox's own address",
        Outcome::KernelTls => "the kernel's TLS failed (it must trust the kernelbox egress CA: SSL_CERT_FILE)",
        Outcome::UpstreamTls => {
            "the destination's certificate is not trusted by the CA bundle (or it spoke no TLS)"
        }
        Outcome::Placeholder => {
            "the request carries a ${secrets.NAME} placeholder, and no credential rule names this host"
        }
    };
    format!(
        "kernelbox egress: {host}:{port} refused ({}): {why}",
        outcome.name()
    )
}
