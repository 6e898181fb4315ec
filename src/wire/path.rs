//! The HTTP API's paths as a client writes them (`docs/http-api.md`, "Endpoints";
//! `docs/files.md`): the one percent-encoder for names and file paths in a URL.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// What is percent-encoded in a file path: every byte but the unreserved characters of
/// RFC 3986 (letters, digits, `-`, `.`, `_`, `~`) and `/`, which separates a file path's
/// components. So `%`, a space, `?`, `#`, `+` and every byte of a non-ASCII character are
/// encoded.
const PATH_ENCODED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// What is percent-encoded in a name (a session, a child): as in a file path, and `/` too,
/// so that a name is always one segment of the path (or one query value).
const NAME_ENCODED: &AsciiSet = &PATH_ENCODED.add(b'/');

/// Percent-encodes a file path, keeping `/` and the unreserved characters (UTF-8 bytes
/// otherwise, as the server decodes them).
fn encode_path(text: &str) -> String {
    utf8_percent_encode(text, PATH_ENCODED).to_string()
}

/// Percent-encodes a name for one path segment or a query value: everything but the
/// unreserved characters.
fn encode_name(text: &str) -> String {
    utf8_percent_encode(text, NAME_ENCODED).to_string()
}

/// `/v1/usage?...`: the usage ledger (docs/usage.md), the query's fields that are set.
pub fn usage(query: &super::UsageQuery) -> String {
    let fields = [
        ("from", query.from.as_deref()),
        ("to", query.to.as_deref()),
        ("group_by", query.group_by.map(|g| g.as_str())),
        ("tenant", query.tenant.as_deref()),
    ];
    let set: Vec<String> = fields
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={}", encode_name(v))))
        .collect();
    format!("/v1/usage?{}", set.join("&"))
}

/// `/v1/sessions/{session}`: the session itself (`DELETE` clears it).
pub fn session(session: &str) -> String {
    format!("/v1/sessions/{}", encode_name(session))
}

/// `/v1/sessions/{session}/execute`: run a cell.
pub fn execute(session: &str) -> String {
    format!("{}/execute", self::session(session))
}

/// `/v1/sessions/{session}/network`: the session's network policy (`PUT`).
pub fn network(session: &str) -> String {
    format!("{}/network", self::session(session))
}

/// `/v1/sessions/{session}/commands`: run a shell command in the session's kernel container.
pub fn commands(session: &str) -> String {
    format!("{}/commands", self::session(session))
}

/// The file API's path for `path` in `session`'s kernel (`child`'s when one is named):
/// `/v1/sessions/{session}/files/{path}?child={child}`; the working directory itself when
/// `path` is empty.
pub fn files(session: &str, path: &str, child: Option<&str>) -> String {
    let mut url = format!("{}/files", self::session(session));
    if !path.is_empty() {
        url.push('/');
        url.push_str(&encode_path(path));
    }
    if let Some(child) = child {
        url.push_str("?child=");
        url.push_str(&encode_name(child));
    }
    url
}

/// `/v1/sessions/{session}/settings`: the session's settings (`PUT`, `GET`).
pub fn settings(session: &str) -> String {
    format!("{}/settings", self::session(session))
}

/// `/v1/workspaces`: the tenant's workspaces (docs/workspaces.md).
pub const WORKSPACES: &str = "/v1/workspaces";

/// `/v1/workspaces/{name}`: one workspace (`DELETE`).
pub fn workspace(name: &str) -> String {
    format!("{WORKSPACES}/{}", encode_name(name))
}

/// `/v1/nodes`: a cluster's nodes (the admin token).
pub const NODES: &str = "/v1/nodes";

/// `/v1/nodes/{node}/kernels`: one node's kernels (the admin token).
pub fn node_kernels(node: &str) -> String {
    format!("{NODES}/{}/kernels", encode_name(node))
}

/// `/v1/nodes/{node}/drain`: `POST` drains the node, `DELETE` takes that back.
pub fn drain(node: &str) -> String {
    format!("{NODES}/{}/drain", encode_name(node))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slashes_and_unreserved_characters_stay_and_the_rest_is_encoded() {
        assert_eq!(
            encode_path("dir/sub/file-1.2_x~y.txt"),
            "dir/sub/file-1.2_x~y.txt"
        );
        assert_eq!(encode_path("a b"), "a%20b");
        assert_eq!(encode_path("100%"), "100%25");
        assert_eq!(encode_path("what?x=1"), "what%3Fx%3D1");
        assert_eq!(encode_path("part#2"), "part%232");
        assert_eq!(encode_path("a+b&c"), "a%2Bb%26c");
        assert_eq!(
            encode_path("données/日本"),
            "donn%C3%A9es/%E6%97%A5%E6%9C%AC"
        );
        assert_eq!(encode_path("%2E%2E"), "%252E%252E");
        assert_eq!(encode_path(""), "");
    }

    #[test]
    fn a_name_is_one_segment() {
        assert_eq!(encode_name("a/b c%d"), "a%2Fb%20c%25d");
        assert_eq!(encode_name("conv-1.x_y~z"), "conv-1.x_y~z");
    }

    #[test]
    fn an_encoded_path_decodes_to_the_same_bytes() {
        for path in [
            "a b/c%d?e#f/é",
            "../x",
            "/abs",
            "tab\there",
            "x\u{7f}y",
            "+;,=@:!$'()*",
        ] {
            for encoded in [encode_path(path), encode_name(path)] {
                let decoded = percent_encoding::percent_decode_str(&encoded)
                    .decode_utf8()
                    .expect("UTF-8");
                assert_eq!(decoded, path);
            }
        }
    }

    #[test]
    fn the_paths_name_the_session_the_file_and_the_child() {
        assert_eq!(files("s", "", None), "/v1/sessions/s/files");
        assert_eq!(
            files("s", "out/r 1.txt", None),
            "/v1/sessions/s/files/out/r%201.txt"
        );
        assert_eq!(
            files("s/t", "a?b", Some("helper#1/2")),
            "/v1/sessions/s%2Ft/files/a%3Fb?child=helper%231%2F2"
        );
        assert_eq!(execute("a b"), "/v1/sessions/a%20b/execute");
        assert_eq!(session("é"), "/v1/sessions/%C3%A9");
    }
}
