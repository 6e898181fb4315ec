//! Which kernelbox session a `/v1/mcp` request runs in (the order is in `mcp.rs`): the
//! `Kernelbox-Session` header, the `session` query parameter, else the MCP session's own, else
//! (a session-less request) the tenant's [`DEFAULT_SESSION`].

use axum::http::request::Parts;
use rmcp::transport::streamable_http_server::session::SessionId;

use crate::mcp::Refusal;
use crate::owner::validate_name;

/// The request header naming the kernelbox session of an MCP request.
pub const SESSION_HEADER: &str = "kernelbox-session";

/// The kernelbox session of a `/v1/mcp` request that names none and has no MCP session (the
/// session-less protocol, 2026-07-28 and later): one per tenant, shared by all such requests
/// of the tenant and with the HTTP API's `/v1/sessions/mcp-default/...` (docs/mcp.md). No MCP
/// session's kernel session can take the name: those are `mcp-` and an rmcp UUID.
pub const DEFAULT_SESSION: &str = "mcp-default";

/// The first MCP protocol version with no MCP sessions (a request of it, or later, that names
/// no session runs in [`DEFAULT_SESSION`]). Versions are dates, so they compare as text.
const SESSIONLESS_PROTOCOL: &str = "2026-07-28";

/// The kernelbox session of an MCP session.
pub(super) fn kernel_session(id: &SessionId) -> String {
    format!("mcp-{id}")
}

/// Between an MCP session id's random part and the name of the cluster node that made it.
const NODE_MARK: char = '@';

/// A new MCP session id for a cluster node: random, then the node's name, so that any node
/// can tell where the session lives (`None` when the id's kernel session would be too long a
/// name: rmcp's own id is used then, and the session is found only where it lives).
pub(super) fn node_session_id(node: &str) -> Option<String> {
    let id = format!("{}{NODE_MARK}{node}", uuid::Uuid::new_v4());
    validate_name("session", &kernel_session(&SessionId::from(id.clone()))).ok()?;
    Some(id)
}

/// The cluster node that made the MCP session `id` (see [`node_session_id`]).
pub(crate) fn creator_node(id: &str) -> Option<&str> {
    id.split_once(NODE_MARK)
        .map(|(_, node)| node)
        .filter(|node| !node.is_empty())
}

pub(crate) fn mcp_session_id(headers: &axum::http::HeaderMap) -> Option<SessionId> {
    headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| SessionId::from(v.to_string()))
}

/// The kernelbox session a `/v1/mcp` request runs in (see the module documentation).
pub(crate) fn session_of(parts: &Parts) -> Result<String, Refusal> {
    let named = parts
        .headers
        .get(SESSION_HEADER)
        .map(|v| {
            v.to_str()
                .map(str::to_owned)
                .map_err(|_| Refusal("the Kernelbox-Session header is not text".into()))
        })
        .transpose()?
        .or_else(|| query_param(parts.uri.query().unwrap_or(""), "session"));
    let session = match named {
        Some(name) => name,
        None => match mcp_session_id(&parts.headers) {
            Some(id) => kernel_session(&id),
            None => DEFAULT_SESSION.to_string(),
        },
    };
    validate_name("session", &session).map_err(|e| Refusal(e.to_string()))?;
    Ok(session)
}

/// On a cluster node, the kernelbox session a `/v1/mcp` request is routed by
/// (docs/cluster.md, "Routing"), and whether it names it: a session named by the header or
/// the query (the request may start its kernel: it is claimed), else the MCP session's own
/// (served where it lives), else for a session-less request (its `MCP-Protocol-Version`
/// header 2026-07-28 or later) [`DEFAULT_SESSION`], claimed as a named one. `None`: nothing
/// to route by (an `initialize` with no named session is served here).
pub(crate) fn routed_session(
    headers: &axum::http::HeaderMap,
    query: Option<&str>,
) -> Option<(String, bool)> {
    let named = headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| query_param(query.unwrap_or(""), "session"));
    match named {
        Some(name) => Some((name, true)),
        None => match mcp_session_id(headers) {
            Some(id) => Some((kernel_session(&id), false)),
            None => sessionless(headers).then(|| (DEFAULT_SESSION.to_string(), true)),
        },
    }
}

/// Whether a request says (by its `MCP-Protocol-Version` header) that it speaks a protocol
/// with no MCP sessions.
fn sessionless(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get("mcp-protocol-version")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v >= SESSIONLESS_PROTOCOL)
}

/// The first value of `key` in a query string, percent-decoded (`None` when absent or not
/// UTF-8).
fn query_param(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == key).then(|| percent_decode(v)).flatten()
    })
}

fn percent_decode(text: &str) -> Option<String> {
    // A `%` not followed by two hex digits is malformed: refused, not passed through.
    let bytes = text.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(i, &b)| {
        b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return None;
    }
    let spaced = text.replace('+', " ");
    percent_encoding::percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(|text| text.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params_are_found_and_decoded() {
        assert_eq!(
            query_param("session=demo", "session").as_deref(),
            Some("demo")
        );
        assert_eq!(
            query_param("a=1&session=team%3Aconv-1", "session").as_deref(),
            Some("team:conv-1")
        );
        assert_eq!(query_param("sessions=x", "session"), None);
        assert_eq!(query_param("session=%zz", "session"), None);
        assert_eq!(query_param("session=%4", "session"), None);
    }

    fn parts(uri: &str, headers: &[(&str, &str)]) -> Parts {
        let mut request = axum::http::Request::builder().uri(uri);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        request.body(()).expect("request").into_parts().0
    }

    #[test]
    fn the_session_comes_from_the_header_then_the_query_then_the_mcp_session() {
        let both = parts(
            "/v1/mcp?session=q",
            &[(SESSION_HEADER, "h"), ("mcp-session-id", "m")],
        );
        assert_eq!(session_of(&both), Ok("h".into()));
        let query = parts("/v1/mcp?session=q", &[("mcp-session-id", "m")]);
        assert_eq!(session_of(&query), Ok("q".into()));
        let mcp = parts("/v1/mcp", &[("mcp-session-id", "abc")]);
        assert_eq!(session_of(&mcp), Ok("mcp-abc".into()));
        assert_eq!(
            session_of(&parts("/v1/mcp", &[])),
            Ok(DEFAULT_SESSION.into())
        );
        let bad = session_of(&parts("/v1/mcp?session=a%2Fb", &[])).expect_err("bad name");
        assert!(bad.0.contains("invalid session name"), "{}", bad.0);
    }

    #[test]
    fn a_sessionless_request_naming_nothing_is_routed_by_the_default_session() {
        let mut headers = axum::http::HeaderMap::new();
        assert_eq!(routed_session(&headers, None), None, "an initialize");
        headers.insert("mcp-protocol-version", "2025-11-25".parse().expect("value"));
        assert_eq!(routed_session(&headers, None), None, "a legacy request");
        headers.insert("mcp-protocol-version", "2026-07-28".parse().expect("value"));
        assert_eq!(
            routed_session(&headers, None),
            Some((DEFAULT_SESSION.to_string(), true))
        );
        assert_eq!(
            routed_session(&headers, Some("session=s")),
            Some(("s".to_string(), true))
        );
    }
}
