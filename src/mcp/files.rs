//! The file tools' shared parts: the orchestrator calls behind `write_file`, `read_file` and
//! `list_files` (for the local backend and `/v1/mcp` alike), and a file read as an MCP tool
//! result (docs/mcp.md, "MCP" and "Files in and out of a kernel").

use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use rmcp::model::{CallToolResult, ContentBlock};

use super::backend::{FileHead, Refusal};
use crate::files::{Download, FilePath, Listing, Written};
use crate::orchestrator::{FileRequest, Orchestrator};

/// The most of a file `read_file` hands a model; past it the result says it was cut. Clients
/// bound one message (the official Python SDK: 1 MiB per server-sent event), and JSON escaping
/// at most doubles text (`"`, `\\`; other control characters make a file binary, sent as
/// base64, 4/3), so the result stays well under that.
pub(crate) const MAX_READ_BYTES: usize = 256 * 1024;

/// Whether `text` reads as text: no control characters but tab, newline and carriage return
/// (each of which JSON would escape to six bytes).
fn plain(text: &str) -> bool {
    !text
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
}

fn refusal(e: impl std::fmt::Display) -> Refusal {
    Refusal(format!("kernelbox: {e}"))
}

/// Writes `content` to `path` through the orchestrator.
pub(crate) async fn write(
    orchestrator: &Orchestrator,
    request: &FileRequest,
    path: &FilePath,
    content: Vec<u8>,
) -> Result<Written, Refusal> {
    let body = futures::stream::once(async move { Ok(Bytes::from(content)) }).boxed();
    orchestrator
        .write_file(request, path, false, body)
        .await
        .map_err(refusal)
}

/// Reads at most `max` bytes of the file at `path` through the orchestrator; the rest of the
/// stream is dropped unread (which releases the kernel).
pub(crate) async fn read(
    orchestrator: &Orchestrator,
    request: &FileRequest,
    path: &FilePath,
    max: usize,
) -> Result<FileHead, Refusal> {
    match orchestrator
        .read_file(request, path, false)
        .await
        .map_err(refusal)?
    {
        Download::File { size, mut body } => {
            let mut bytes = Vec::with_capacity((size as usize).min(max));
            while bytes.len() < max {
                match body.next().await {
                    Some(chunk) => bytes.extend_from_slice(&chunk.map_err(refusal)?),
                    None => break,
                }
            }
            bytes.truncate(max);
            Ok(FileHead { size, bytes })
        }
        Download::Dir(_) | Download::Tar { .. } => Err(Refusal(format!(
            "kernelbox: {path} is a directory; use list_files to see what it holds"
        ))),
    }
}

/// Lists the directory at `path` through the orchestrator.
pub(crate) async fn list(
    orchestrator: &Orchestrator,
    request: &FileRequest,
    path: &FilePath,
) -> Result<Listing, Refusal> {
    orchestrator
        .list_files(request, path)
        .await
        .map_err(refusal)
}

/// The image types a model is shown as images, by their leading bytes.
fn image_type(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else {
        None
    }
}

/// A file read as a tool result: its text when it is UTF-8, an image for a whole PNG or JPEG,
/// else its bytes as base64; a note says when only the first [`MAX_READ_BYTES`] were read.
pub(crate) fn render_read(path: &str, head: &FileHead) -> CallToolResult {
    let truncated = (head.bytes.len() as u64) < head.size;
    let note = format!(
        "[kernelbox] {path} is {} bytes; only its first {} are shown.",
        head.size,
        head.bytes.len()
    );
    if !truncated {
        if let Some(mime) = image_type(&head.bytes) {
            let b64 = base64::engine::general_purpose::STANDARD.encode(&head.bytes);
            return CallToolResult::success(vec![ContentBlock::image(b64, mime)]);
        }
    }
    let as_text = match std::str::from_utf8(&head.bytes) {
        Ok(text) => Some(text),
        // A cut may split a character: the bytes up to the split are still text.
        Err(e) if truncated && e.error_len().is_none() => {
            std::str::from_utf8(&head.bytes[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    };
    let text = match as_text.filter(|t| plain(t)) {
        Some(text) => text.to_owned(),
        None => format!(
            "[kernelbox] {path} is binary ({} bytes); its content as base64:\n{}",
            head.size,
            base64::engine::general_purpose::STANDARD.encode(&head.bytes)
        ),
    };
    let mut content = vec![ContentBlock::text(text)];
    if truncated {
        content.push(ContentBlock::text(note));
    }
    CallToolResult::success(content)
}

/// A directory listing as a tool result: one line per entry.
pub(crate) fn render_listing(path: &str, listing: &Listing) -> CallToolResult {
    let mut text = String::new();
    for entry in &listing.entries {
        let slash = if entry.kind == "dir" { "/" } else { "" };
        text.push_str(&format!(
            "{}{slash}\t{}\t{} bytes\t{}\n",
            entry.name, entry.kind, entry.size, entry.modified
        ));
    }
    if listing.entries.is_empty() {
        let shown = if path.is_empty() {
            "the working directory"
        } else {
            path
        };
        text.push_str(&format!("({shown} is empty)\n"));
    }
    if listing.truncated {
        text.push_str("[kernelbox] the directory holds more entries than were listed.\n");
    }
    CallToolResult::success(vec![ContentBlock::text(text)])
}

/// The bytes `write_file` writes: `content` as UTF-8 or `content_base64` decoded, exactly one.
pub(crate) fn content_of(
    content: Option<String>,
    content_base64: Option<String>,
) -> Result<Vec<u8>, Refusal> {
    match (content, content_base64) {
        (Some(text), None) => Ok(text.into_bytes()),
        (None, Some(b64)) => {
            let b64: String = b64.split_whitespace().collect();
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|e| Refusal(format!("kernelbox: content_base64 is not base64: {e}")))
        }
        _ => Err(Refusal(
            "kernelbox: give exactly one of content (text) and content_base64".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::FileEntry;

    #[test]
    fn text_is_text_and_a_cut_says_so() {
        let whole = render_read(
            "a.txt",
            &FileHead {
                size: 3,
                bytes: b"abc".to_vec(),
            },
        );
        assert_eq!(whole.content.len(), 1);
        assert_eq!(whole.content[0].as_text().unwrap().text, "abc");
        let cut = render_read(
            "a.txt",
            &FileHead {
                size: 9,
                bytes: b"abc".to_vec(),
            },
        );
        assert!(cut.content[1]
            .as_text()
            .unwrap()
            .text
            .contains("only its first 3"));
    }

    #[test]
    fn a_png_is_an_image_and_other_bytes_are_base64() {
        let png = b"\x89PNG\r\n\x1a\nrest".to_vec();
        let r = render_read(
            "p.png",
            &FileHead {
                size: png.len() as u64,
                bytes: png,
            },
        );
        assert_eq!(r.content[0].as_image().unwrap().mime_type, "image/png");
        let r = render_read(
            "b",
            &FileHead {
                size: 2,
                bytes: vec![0xff, 0x00],
            },
        );
        assert!(r.content[0].as_text().unwrap().text.ends_with("/wA="));
    }

    #[test]
    fn content_is_exactly_one_of_text_and_base64() {
        assert_eq!(content_of(Some("hi".into()), None).unwrap(), b"hi");
        assert_eq!(content_of(None, Some("aGk=".into())).unwrap(), b"hi");
        assert!(content_of(None, None).is_err());
        assert!(content_of(Some("a".into()), Some("YQ==".into())).is_err());
        assert!(content_of(None, Some("!!".into())).is_err());
    }

    #[test]
    fn a_listing_is_one_line_per_entry() {
        let r = render_listing(
            "",
            &Listing {
                entries: vec![FileEntry {
                    name: "d".into(),
                    kind: "dir".into(),
                    size: 0,
                    modified: "t".into(),
                }],
                truncated: false,
            },
        );
        assert!(r.content[0].as_text().unwrap().text.starts_with("d/\tdir"));
    }
}
