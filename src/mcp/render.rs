//! A cell result (`docs/contract.md`) as an MCP tool result: the text a model reads, each image
//! the cell displayed as image content, and `isError` when the cell did not succeed; and a
//! command's result (`docs/contract.md`, "Commands"): its exit code, stdout and stderr apart,
//! `isError` when it exited non-zero or timed out.

use rmcp::model::{CallToolResult, ContentBlock};

use crate::cell::{CellResult, CellStatus};
use crate::wire::CommandResult;

/// Image types MCP clients display; other rich results are given as their `text/plain`.
const IMAGE_TYPES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// The tool result for a command's result: a status line, then `stdout:` and `stderr:`
/// sections (each only when the stream has text), with a note where the server cut one.
pub(crate) fn render_command(result: &CommandResult) -> CallToolResult {
    let mut text = if result.timed_out {
        format!(
            "[kernelbox] the command timed out after {:.1} s: it and every process it started were killed (the Python kernel and its state are kept)",
            result.duration_seconds
        )
    } else {
        format!("exit code {}", result.exit_code)
    };
    for (name, data, cut, total) in [
        (
            "stdout",
            &result.stdout,
            result.stdout_truncated,
            result.stdout_bytes_total,
        ),
        (
            "stderr",
            &result.stderr,
            result.stderr_truncated,
            result.stderr_bytes_total,
        ),
    ] {
        if !data.is_empty() {
            text.push_str(&format!("\n{name}:\n{data}"));
            if !data.ends_with('\n') {
                text.push('\n');
            }
        }
        if cut == Some(true) {
            let total = total.map(|t| format!(" of {t} bytes")).unwrap_or_default();
            text.push_str(&format!(
                "[kernelbox] {name} was cut{total}: its start and end are kept\n"
            ));
        }
    }
    let content = vec![ContentBlock::text(text)];
    if result.timed_out || result.exit_code != 0 {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

/// The tool result for a cell result.
pub(crate) fn render(result: &CellResult) -> CallToolResult {
    let mut text = String::new();
    if let Some(lost) = &result.kernel.state_lost {
        text.push_str(&format!(
            "[kernelbox] this session's previous kernel was lost ({}); the cell ran in a fresh kernel with no earlier state.\n",
            lost.reason.as_str()
        ));
    }
    text.push_str(&result.output);
    let mut images = Vec::new();
    for rich in &result.results {
        if let Some((mime, b64)) = IMAGE_TYPES
            .iter()
            .find_map(|m| rich.text(m).map(|d| (*m, d)))
        {
            // Jupyter wraps long base64 in lines; MCP wants it whole.
            let b64: String = b64.split_whitespace().collect();
            images.push(ContentBlock::image(b64, mime));
        } else if let Some(plain) = rich.text("text/plain") {
            push_line(&mut text, &plain);
        }
    }
    let success = result.status == CellStatus::Success;
    if !success {
        // A raised exception's traceback is already the tail of `output`.
        if let Some(error) = result
            .error
            .as_deref()
            .filter(|e| !result.output.contains(e))
        {
            push_line(&mut text, error);
        }
    }
    if let Some(warning) = &result.warning {
        push_line(&mut text, &format!("[kernelbox] {warning}"));
    }
    if result.kernel.ended {
        push_line(
            &mut text,
            "[kernelbox] the cell called sys.exit(): the kernel ended; the next call starts a fresh one.",
        );
    }
    if text.is_empty() && images.is_empty() {
        text.push_str("(no output)");
    }
    let mut content = Vec::with_capacity(images.len() + 1);
    if !text.is_empty() {
        content.push(ContentBlock::text(text));
    }
    content.extend(images);
    if success {
        CallToolResult::success(content)
    } else {
        CallToolResult::error(content)
    }
}

fn push_line(text: &mut String, line: &str) {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cell::{KernelInfo, LossReason, StateLost};
    use crate::rich::{RawJson, RichResult};

    fn texts(r: &CallToolResult) -> Vec<String> {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect()
    }

    /// A result of `status` that wrote `output`.
    fn cell(status: CellStatus, output: &str) -> CellResult {
        CellResult {
            status,
            output: output.into(),
            stdout: output.into(),
            stderr: String::new(),
            exception: None,
            error: None,
            exit_code: 0,
            tool_calls_made: 0,
            duration_seconds: 0.0,
            kernel: KernelInfo::default(),
            stdout_truncated: None,
            stdout_bytes_total: None,
            stdout_bytes_omitted: None,
            warning: None,
            hint: None,
            results: Vec::new(),
        }
    }

    /// A rich result of `(mime, JSON text)` pairs.
    fn rich(data: &[(&str, &str)], is_main_result: bool) -> RichResult {
        RichResult {
            data: data
                .iter()
                .map(|(m, v)| {
                    (
                        m.to_string(),
                        RawJson::from_json(v.to_string()).expect("JSON"),
                    )
                })
                .collect(),
            metadata: RawJson::empty_object(),
            is_main_result,
        }
    }

    #[test]
    fn success_is_the_output() {
        let r = render(&cell(CellStatus::Success, "42\n"));
        assert_eq!(r.is_error, Some(false));
        assert_eq!(texts(&r), vec!["42\n".to_string()]);
    }

    #[test]
    fn a_raised_cell_is_an_error_with_its_traceback_once() {
        let tb = "Traceback (most recent call last):\nZeroDivisionError: division by zero\n";
        let r = render(&CellResult {
            error: Some(tb.into()),
            exit_code: 1,
            ..cell(CellStatus::Error, tb)
        });
        assert_eq!(r.is_error, Some(true));
        assert_eq!(texts(&r), vec![tb.to_string()]);
    }

    #[test]
    fn a_timeout_carries_kernelbox_message_and_a_loss_is_announced() {
        let r = render(&CellResult {
            error: Some("Cell timed out after 1s; ...".into()),
            exit_code: -1,
            kernel: KernelInfo {
                state_lost: Some(StateLost {
                    reason: LossReason::Oom,
                    at: "x".into(),
                    workspace_lost: false,
                }),
                ..KernelInfo::default()
            },
            ..cell(CellStatus::Timeout, "partial\n")
        });
        assert_eq!(r.is_error, Some(true));
        let t = texts(&r).join("");
        assert!(
            t.starts_with("[kernelbox] this session's previous kernel was lost (oom)"),
            "{t}"
        );
        assert!(t.ends_with("partial\nCell timed out after 1s; ..."), "{t}");
    }

    #[test]
    fn images_become_image_content_and_other_results_their_text() {
        let r = render(&CellResult {
            results: vec![
                rich(
                    &[
                        ("image/png", r#""iVBO\nRw0KGgo=\n""#),
                        ("text/plain", r#""<Figure>""#),
                    ],
                    false,
                ),
                rich(&[("text/plain", r#""3""#)], true),
            ],
            ..cell(CellStatus::Success, "")
        });
        assert_eq!(texts(&r), vec!["3".to_string()]);
        let image = r
            .content
            .iter()
            .find_map(|c| c.as_image())
            .expect("an image");
        assert_eq!(image.mime_type, "image/png");
        assert_eq!(image.data, "iVBORw0KGgo=");
    }

    #[test]
    fn nothing_written_says_so() {
        let r = render(&cell(CellStatus::Success, ""));
        assert_eq!(texts(&r), vec!["(no output)".to_string()]);
    }
}
