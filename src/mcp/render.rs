//! A cell result (JSON, `docs/contract.md`) as an MCP tool result: the text a model reads, each
//! image the cell displayed as image content, and `isError` when the cell did not succeed.

use rmcp::model::{CallToolResult, ContentBlock};
use serde_json::Value;

/// Image types MCP clients display; other rich results are given as their `text/plain`.
const IMAGE_TYPES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

/// The tool result for a cell result.
pub(crate) fn render(result: &Value) -> CallToolResult {
    let str_of = |v: &Value| v.as_str().map(str::to_owned);
    let mut text = String::new();
    if let Some(lost) = result["kernel"].get("state_lost") {
        let reason = lost["reason"].as_str().unwrap_or("unknown");
        text.push_str(&format!(
            "[kernelbox] this session's previous kernel was lost ({reason}); the cell ran in a fresh kernel with no earlier state.\n"
        ));
    }
    let output = str_of(&result["output"]).unwrap_or_default();
    text.push_str(&output);
    let mut images = Vec::new();
    for rich in result["results"].as_array().into_iter().flatten() {
        let data = &rich["data"];
        if let Some((mime, b64)) = IMAGE_TYPES
            .iter()
            .find_map(|m| data[*m].as_str().map(|d| (*m, d)))
        {
            // Jupyter wraps long base64 in lines; MCP wants it whole.
            let b64: String = b64.split_whitespace().collect();
            images.push(ContentBlock::image(b64, mime));
        } else if let Some(plain) = data["text/plain"].as_str() {
            push_line(&mut text, plain);
        }
    }
    let success = result["status"] == "success";
    if !success {
        // A raised exception's traceback is already the tail of `output`.
        if let Some(error) = str_of(&result["error"]).filter(|e| !output.contains(e.as_str())) {
            push_line(&mut text, &error);
        }
    }
    if let Some(warning) = str_of(&result["warning"]) {
        push_line(&mut text, &format!("[kernelbox] {warning}"));
    }
    if result["kernel"]["ended"] == true {
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
    use serde_json::json;

    fn texts(r: &CallToolResult) -> Vec<String> {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect()
    }

    #[test]
    fn success_is_the_output() {
        let r =
            render(&json!({"status": "success", "output": "42\n", "exit_code": 0, "kernel": {}}));
        assert_eq!(r.is_error, Some(false));
        assert_eq!(texts(&r), vec!["42\n".to_string()]);
    }

    #[test]
    fn a_raised_cell_is_an_error_with_its_traceback_once() {
        let tb = "Traceback (most recent call last):\nZeroDivisionError: division by zero\n";
        let r = render(
            &json!({"status": "error", "output": tb, "error": tb, "exit_code": 1, "kernel": {}}),
        );
        assert_eq!(r.is_error, Some(true));
        assert_eq!(texts(&r), vec![tb.to_string()]);
    }

    #[test]
    fn a_timeout_carries_kernelbox_message_and_a_loss_is_announced() {
        let r = render(
            &json!({"status": "timeout", "output": "partial\n", "error": "Cell timed out after 1s; ...",
            "exit_code": -1, "kernel": {"state_lost": {"reason": "oom", "at": "x"}}}),
        );
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
        let r = render(
            &json!({"status": "success", "output": "", "exit_code": 0, "kernel": {},
            "results": [
                {"data": {"image/png": "iVBO\nRw0KGgo=\n", "text/plain": "<Figure>"}, "metadata": {}, "is_main_result": false},
                {"data": {"text/plain": "3"}, "metadata": {}, "is_main_result": true}
            ]}),
        );
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
        let r = render(&json!({"status": "success", "output": "", "exit_code": 0, "kernel": {}}));
        assert_eq!(texts(&r), vec!["(no output)".to_string()]);
    }
}
