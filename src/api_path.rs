//! The HTTP API's paths as a client writes them (README "HTTP server", "Files in and out of
//! a kernel"): the one percent-encoder for names and file paths in a URL, used by
//! `kernelbox cp` and by `kernelbox mcp --url`.

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// What is percent-encoded: every byte but the unreserved characters of RFC 3986 (letters,
/// digits, `-`, `.`, `_`, `~`) and `/`, which separates a file path's components. So `%`, a
/// space, `?`, `#`, `+` and every byte of a non-ASCII character are encoded.
const ENCODED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

/// Percent-encodes `text` for a URL's path or a query value, keeping `/` and the unreserved
/// characters (UTF-8 bytes otherwise, as the server decodes them).
pub fn encode(text: &str) -> String {
    utf8_percent_encode(text, ENCODED).to_string()
}

/// The file API's path for `path` in `session`'s kernel (`child`'s when one is named):
/// `/v1/sessions/{session}/files/{path}?child={child}`; the working directory itself when
/// `path` is empty.
pub fn files(session: &str, path: &str, child: Option<&str>) -> String {
    let mut url = format!("/v1/sessions/{}/files", encode(session));
    if !path.is_empty() {
        url.push('/');
        url.push_str(&encode(path));
    }
    if let Some(child) = child {
        url.push_str("?child=");
        url.push_str(&encode(child));
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slashes_and_unreserved_characters_stay_and_the_rest_is_encoded() {
        assert_eq!(
            encode("dir/sub/file-1.2_x~y.txt"),
            "dir/sub/file-1.2_x~y.txt"
        );
        assert_eq!(encode("a b"), "a%20b");
        assert_eq!(encode("100%"), "100%25");
        assert_eq!(encode("what?x=1"), "what%3Fx%3D1");
        assert_eq!(encode("part#2"), "part%232");
        assert_eq!(encode("a+b&c"), "a%2Bb%26c");
        assert_eq!(encode("données/日本"), "donn%C3%A9es/%E6%97%A5%E6%9C%AC");
        assert_eq!(encode("%2E%2E"), "%252E%252E");
        assert_eq!(encode(""), "");
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
            let encoded = encode(path);
            let decoded = percent_encoding::percent_decode_str(&encoded)
                .decode_utf8()
                .expect("UTF-8");
            assert_eq!(decoded, path);
        }
    }

    #[test]
    fn the_files_path_names_the_session_the_path_and_the_child() {
        assert_eq!(files("s", "", None), "/v1/sessions/s/files");
        assert_eq!(
            files("s", "out/r 1.txt", None),
            "/v1/sessions/s/files/out/r%201.txt"
        );
        assert_eq!(
            files("s", "a?b", Some("helper#1")),
            "/v1/sessions/s/files/a%3Fb?child=helper%231"
        );
    }
}
