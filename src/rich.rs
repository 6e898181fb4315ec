//! Rich results: the MIME bundles a cell displays (`display()`, its last expression's value,
//! matplotlib figures), as nbformat's `display_data` / `execute_result` carry them
//! (`docs/contract.md`, "Rich results").

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A JSON value kept as its text: a display's values are passed through as the kernel wrote
/// them (checked to be JSON), never parsed into a tree on the host. Read it (and a
/// [`CellResult`](crate::CellResult) holding it) from JSON text (`serde_json::from_str`,
/// `from_slice`), not from a `serde_json::Value`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The value as a string, when it is a JSON string (text, or base64 for binary images).
    pub fn as_str(&self) -> Option<String> {
        serde_json::from_str::<String>(self.0.get()).ok()
    }

    /// An empty JSON object.
    pub fn empty_object() -> RawJson {
        // `{}` always parses; the default (`null`) only satisfies the type checker.
        RawJson(RawValue::from_string("{}".into()).unwrap_or_default())
    }

    /// JSON text (checked).
    pub fn from_json(text: String) -> Result<RawJson, serde_json::Error> {
        RawValue::from_string(text).map(RawJson)
    }

    pub(crate) fn from_raw(raw: Box<RawValue>) -> RawJson {
        RawJson(raw)
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &RawJson) -> bool {
        self.get() == other.get()
    }
}

impl schemars::JsonSchema for RawJson {
    fn schema_name() -> Cow<'static, str> {
        "AnyJson".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "description": "any JSON value" })
    }
}

/// One rich result: a MIME bundle (`docs/contract.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RichResult {
    /// MIME type -> value: `text/plain`, `text/html`, `text/markdown`, `text/latex` and
    /// `image/svg+xml` as text, `image/png` and `image/jpeg` as base64, `application/json` as
    /// JSON (as in nbformat).
    pub data: BTreeMap<String, RawJson>,
    /// Per-MIME metadata, as in nbformat (e.g. an image's `width` and `height`).
    pub metadata: RawJson,
    /// True for the value of the cell's last expression (Jupyter's `execute_result`).
    pub is_main_result: bool,
}

impl RichResult {
    /// The value of one MIME type when it is a string (text, or base64 for binary images).
    pub fn text(&self, mime: &str) -> Option<String> {
        self.data.get(mime).and_then(RawJson::as_str)
    }
}

/// Deepest nesting of arrays and objects a display may have as the kernel sends it (its
/// `{"data": {...}}` envelope counted): a deeper one is dropped. Values pass through to
/// clients as the kernel wrote them, and a result nested thousands deep breaks ordinary JSON
/// readers (Python's `json`, serde_json's default limit of 128) on the caller's side.
pub const MAX_DISPLAY_DEPTH: usize = 64;

/// Whether the JSON text `json` nests arrays and objects at most `max` deep (a byte scan: it
/// does not check that the text is JSON).
pub fn nesting_within(json: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut i = 0;
    while i < json.len() {
        let b = json[i];
        i += 1;
        match b {
            b'"' => {
                // Skip the string (a base64 image is most of a display): to its closing quote,
                // past escaped characters.
                loop {
                    let Some(rest) = json.get(i..) else {
                        return true;
                    };
                    match memchr::memchr2(b'"', b'\\', rest) {
                        None => return true,
                        Some(at) if json[i + at] == b'"' => {
                            i += at + 1;
                            break;
                        }
                        Some(at) => i += at + 2,
                    }
                }
            }
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return false;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    true
}

/// The pixel size of a PNG (width, height) from its header, or `None` if `png` is not one.
pub fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    if png.len() < 24 || !png.starts_with(SIGNATURE) || &png[12..16] != b"IHDR" {
        return None;
    }
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    Some((be(&png[16..20]), be(&png[20..24])))
}

/// Receives each rich result as the cell displays it, in order with its output (for
/// streaming); see [`ExecuteRequest::display_sink`](crate::ExecuteRequest::display_sink).
pub type DisplaySink = Arc<dyn Fn(&RichResult) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_serialises_as_an_nbformat_bundle_and_reads_back() {
        let text = r#"{"data":{"image/png":"iVBO","text/plain":"<Figure>"},"metadata":{"image/png":{"width":4}},"is_main_result":false}"#;
        let result: RichResult = serde_json::from_str(text).unwrap();
        assert_eq!(result.text("image/png").as_deref(), Some("iVBO"));
        assert_eq!(result.text("text/html"), None);
        assert_eq!(serde_json::to_string(&result).unwrap(), text);
        assert_eq!(RawJson::empty_object().get(), "{}");
    }

    #[test]
    fn png_size_reads_the_header() {
        let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        png.extend(640u32.to_be_bytes());
        png.extend(480u32.to_be_bytes());
        assert_eq!(png_size(&png), Some((640, 480)));
        assert_eq!(png_size(&png[..20]), None);
        assert_eq!(png_size(b"GIF89a and then some more bytes here"), None);
    }

    #[test]
    fn nesting_is_counted_outside_strings_only() {
        assert!(nesting_within(br#"{"a": [1, {"b": []}], "c": {}}"#, 4));
        assert!(!nesting_within(br#"{"a": [1, {"b": []}], "c": {}}"#, 3));
        // Brackets and escaped quotes inside strings do not count.
        assert!(nesting_within(br#"{"a": "[[[[{{{{\"[[["}"#, 1));
        // Unterminated strings, one ending in a backslash: no panic.
        assert!(nesting_within(b"[\"abc\\", 1));
        assert!(nesting_within(b"[\"abc\\\\", 1));
        assert!(nesting_within(b"[\"abc", 1));
        assert!(!nesting_within(&[b'['; 65], 64));
        assert!(nesting_within(&[b'['; 64], 64));
    }
}
