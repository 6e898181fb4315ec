//! The runner protocol (version 2): newline-delimited JSON frames, and the byte plumbing that
//! turns Docker frames (which are not lines) back into lines and finds a cell's end marker.
//!
//! Host -> runner frames travel on the container's stdin; runner -> host frames (`ready`,
//! `tool_call`) on its stderr; cell output (fds 1 and 2 inside the kernel) on its stdout, ended
//! per cell by a marker the host chose, followed by the cell's `done` frame on the same line:
//! one write, one trip through the engine. See `runner/kernel_runner.py` for the other side.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The protocol version this host speaks; the runner announces its own in `ready`.
pub const PROTOCOL_VERSION: u64 = 2;

/// The runner's source; the kernel's environment carries it (see [`RUNNER_ENV`]), so no file
/// has to reach the container.
pub const RUNNER_SOURCE: &str = include_str!("../runner/kernel_runner.py");

/// The `python3 -c` program that compiles and starts the runner in pieces: the parser's peak
/// memory stays resident in every kernel, and a piece's peak is a fraction of the whole file's.
pub const RUNNER_BOOTSTRAP: &str = include_str!("../runner/bootstrap.py");

/// The environment variable that hands [`RUNNER_SOURCE`] to [`RUNNER_BOOTSTRAP`], which removes
/// it before any cell runs.
pub const RUNNER_ENV: &str = "KERNELBOX_RUNNER";

/// The kernel container's command: `python3 -c BOOTSTRAP`.
pub fn runner_command() -> Vec<String> {
    ["python3", "-c", RUNNER_BOOTSTRAP]
        .map(String::from)
        .to_vec()
}

/// The kernel container's environment entry that carries the runner.
pub fn runner_env() -> String {
    format!("{RUNNER_ENV}={RUNNER_SOURCE}")
}

/// Longest protocol line (one runner -> host frame) accepted from a kernel, in bytes. Real
/// frames are small but for a tool call's arguments, which a cell may have in flight up to
/// this many bytes at once (see `kernel::MAX_TOOL_ARGS_IN_FLIGHT`); a longer line is a
/// protocol violation and kills the kernel (see [`Breach`]).
pub const MAX_FRAME_LINE: usize = 1024 * 1024;

/// Longest `done` line (after a cell's end marker) read from a kernel, in bytes. The runner
/// never writes one over 4000 bytes (it shortens the traceback to fit); a longer one is
/// forged, and the cell's outcome is reported as unreadable rather than held.
pub const MAX_DONE_LINE: usize = 8 * 1024;

/// Lines on the protocol channel that are not frames, in bytes, a kernel may write over its
/// whole life (an interpreter warning before the runner starts is one); past this it is killed.
pub const MAX_GARBAGE_BYTES: usize = 1024 * 1024;

/// A kernel that broke the protocol: whoever notices trips it, and the kernel's reader task,
/// which owns the container's streams, kills the kernel. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Breach {
    inner: std::sync::Arc<BreachInner>,
}

#[derive(Debug, Default)]
struct BreachInner {
    what: std::sync::OnceLock<&'static str>,
    tripped: tokio_util::sync::CancellationToken,
}

impl Breach {
    /// Records the violation (the first one wins) and wakes the reader task.
    pub fn trip(&self, what: &'static str) {
        let _ = self.inner.what.set(what);
        self.inner.tripped.cancel();
    }

    /// The violation, once tripped.
    pub fn what(&self) -> Option<&'static str> {
        self.inner.what.get().copied()
    }

    /// Completes once tripped.
    pub async fn tripped(&self) {
        self.inner.tripped.cancelled().await
    }
}

/// A frame the host sends to the runner.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum HostFrame<'a> {
    /// Run a cell.
    Exec {
        /// Cell number, unique within the kernel.
        cell: u64,
        /// Python source.
        code: &'a str,
        /// Bytes the runner writes to fd 1 when the cell is over.
        marker: &'a str,
    },
    /// The answer to a tool call.
    ToolResult {
        /// The call being answered.
        call: u64,
        /// Whether the call succeeded.
        ok: bool,
        /// The tool's JSON result, when ok, passed through as it came.
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<&'a RawValue>,
        /// Why it failed or was refused, when not ok.
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

impl HostFrame<'_> {
    /// The frame as one line.
    pub fn to_line(&self) -> Vec<u8> {
        // Serialising these types cannot fail: every field is a string, number, bool or
        // already valid JSON.
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

/// How the runner says a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DoneStatus {
    /// Ran to the end.
    Ok,
    /// Raised; the traceback comes along.
    Error,
    /// Called `sys.exit()`; the kernel ends.
    Exit,
}

/// A frame the runner sends to the host.
///
/// Parsed through a flat struct ([`WireFrame`]) rather than as an internally tagged enum:
/// serde buffers such an enum's whole input as a tree first, and a tool call's arguments stay
/// raw JSON text (no tree at all) until a dispatcher needs them.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "WireFrame")]
pub enum KernelFrame {
    /// The runner is up.
    Ready {
        /// Protocol version.
        v: u64,
        /// Python version.
        #[serde(default)]
        python: String,
    },
    /// A cell ended.
    Done {
        /// Which cell.
        cell: u64,
        /// How.
        status: DoneStatus,
        /// The traceback when it raised.
        #[serde(default)]
        traceback: Option<String>,
        /// Cells the kernel has executed.
        execution_count: u64,
    },
    /// Code in the kernel called a host tool.
    ToolCall {
        /// The cell the calling thread belongs to (none for threads of unknown origin).
        cell: Option<u64>,
        /// Call number, echoed in the answer.
        call: u64,
        /// Tool name.
        tool: String,
        /// Keyword arguments, as the kernel wrote them (valid JSON; absent when not sent).
        args: Option<Box<RawValue>>,
    },
    /// Answer to a ping.
    Pong,
}

/// The operation a frame names.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Op {
    Ready,
    Done,
    ToolCall,
    Pong,
}

/// Every field any [`KernelFrame`] has, as it travels; unknown fields are skipped unread.
#[derive(Deserialize)]
struct WireFrame {
    op: Op,
    v: Option<u64>,
    #[serde(default)]
    python: String,
    cell: Option<u64>,
    status: Option<DoneStatus>,
    #[serde(default)]
    traceback: Option<String>,
    execution_count: Option<u64>,
    call: Option<u64>,
    tool: Option<String>,
    args: Option<Box<RawValue>>,
}

impl TryFrom<WireFrame> for KernelFrame {
    type Error = &'static str;

    fn try_from(w: WireFrame) -> Result<KernelFrame, &'static str> {
        Ok(match w.op {
            Op::Ready => KernelFrame::Ready {
                v: w.v.ok_or("ready without v")?,
                python: w.python,
            },
            Op::Done => KernelFrame::Done {
                cell: w.cell.ok_or("done without cell")?,
                status: w.status.ok_or("done without status")?,
                traceback: w.traceback,
                execution_count: w.execution_count.ok_or("done without execution_count")?,
            },
            Op::ToolCall => KernelFrame::ToolCall {
                cell: w.cell,
                call: w.call.ok_or("tool_call without call")?,
                tool: w.tool.ok_or("tool_call without tool")?,
                args: w.args,
            },
            Op::Pong => KernelFrame::Pong,
        })
    }
}

/// A protocol line was longer than [`MAX_FRAME_LINE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a protocol line longer than {MAX_FRAME_LINE} bytes")]
pub struct LineTooLong;

/// Splits a byte stream into lines, whatever the chunking; holds at most [`MAX_FRAME_LINE`]
/// bytes of an unfinished line.
#[derive(Debug, Default)]
pub struct LineSplitter {
    buf: Vec<u8>,
}

impl LineSplitter {
    /// Feeds bytes; calls `line` for every complete line (without the newline). A line longer
    /// than [`MAX_FRAME_LINE`] is an error, and the splitter holds nothing more of it.
    pub fn feed(
        &mut self,
        mut data: &[u8],
        mut line: impl FnMut(&[u8]),
    ) -> Result<(), LineTooLong> {
        while let Some(pos) = data.iter().position(|&b| b == b'\n') {
            if self.buf.is_empty() {
                if pos > MAX_FRAME_LINE {
                    return Err(self.overflow());
                }
                line(&data[..pos]);
            } else {
                if self.buf.len() + pos > MAX_FRAME_LINE {
                    return Err(self.overflow());
                }
                self.buf.extend_from_slice(&data[..pos]);
                line(&self.buf);
                self.buf.clear();
            }
            data = &data[pos + 1..];
        }
        if self.buf.len() + data.len() > MAX_FRAME_LINE {
            return Err(self.overflow());
        }
        self.buf.extend_from_slice(data);
        Ok(())
    }

    fn overflow(&mut self) -> LineTooLong {
        self.buf = Vec::new();
        LineTooLong
    }
}

/// Finds a cell's end marker in its output stream, across chunk boundaries, hands back the
/// output that came before it, and collects the `done` line that follows it.
#[derive(Debug)]
pub struct MarkerScanner {
    marker: Vec<u8>,
    pending: Vec<u8>,
    found: bool,
    done: Vec<u8>,
    done_complete: bool,
}

impl MarkerScanner {
    /// A scanner for `marker`.
    pub fn new(marker: &str) -> Self {
        MarkerScanner {
            marker: marker.as_bytes().to_vec(),
            pending: Vec::new(),
            found: false,
            done: Vec::new(),
            done_complete: false,
        }
    }

    /// True once the marker has been seen.
    pub fn found(&self) -> bool {
        self.found
    }

    /// The line after the marker (the cell's `done` frame), once it is complete.
    pub fn done_line(&self) -> Option<&[u8]> {
        self.done_complete.then_some(self.done.as_slice())
    }

    fn feed_done(&mut self, bytes: &[u8]) {
        if self.done_complete {
            return;
        }
        match bytes.iter().position(|&b| b == b'\n') {
            Some(pos) if self.done.len() + pos > MAX_DONE_LINE => {
                // Not a frame the runner would write: give up on it, the cell still ended.
                self.done = Vec::new();
                self.done_complete = true;
            }
            Some(pos) => {
                self.done.extend_from_slice(&bytes[..pos]);
                self.done_complete = true;
            }
            None if self.done.len() + bytes.len() > MAX_DONE_LINE => {
                // Not a frame the runner would write: give up on it, the cell still ended.
                self.done = Vec::new();
                self.done_complete = true;
            }
            None => self.done.extend_from_slice(bytes),
        }
    }

    /// Feeds a chunk; `output` receives the cell's bytes (never the marker, nothing after it).
    pub fn feed(&mut self, chunk: &[u8], mut output: impl FnMut(&[u8])) {
        if self.found {
            self.feed_done(chunk);
            return;
        }
        // Only the last marker.len()-1 bytes can start a marker split across chunks.
        let joined: std::borrow::Cow<[u8]> = if self.pending.is_empty() {
            chunk.into()
        } else {
            let mut v = std::mem::take(&mut self.pending);
            v.extend_from_slice(chunk);
            v.into()
        };
        if let Some(pos) = find(&joined, &self.marker) {
            output(&joined[..pos]);
            self.found = true;
            let rest = joined[pos + self.marker.len()..].to_vec();
            self.feed_done(&rest);
            return;
        }
        let keep = (self.marker.len() - 1).min(joined.len());
        let split = joined.len() - keep;
        // Hold back only a suffix that could be the start of the marker.
        let hold = (split..joined.len())
            .find(|&i| self.marker.starts_with(&joined[i..]))
            .unwrap_or(joined.len());
        output(&joined[..hold]);
        self.pending = joined[hold..].to_vec();
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    let first = needle[0];
    let mut start = 0;
    while let Some(off) = haystack[start..=haystack.len() - needle.len()]
        .iter()
        .position(|&b| b == first)
    {
        let i = start + off;
        if &haystack[i..i + needle.len()] == needle {
            return Some(i);
        }
        start = i + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_survive_any_chunking() {
        let text = b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n";
        for size in 1..text.len() {
            let mut split = LineSplitter::default();
            let mut lines = Vec::new();
            for chunk in text.chunks(size) {
                split.feed(chunk, |l| lines.push(l.to_vec())).unwrap();
            }
            assert_eq!(lines.len(), 3, "chunk size {size}");
            assert_eq!(lines[2], b"{\"c\":3}");
        }
    }

    #[test]
    fn over_long_lines_are_an_error_and_not_buffered() {
        // In one chunk, with or without its newline, and across chunks.
        let big = vec![b'x'; MAX_FRAME_LINE + 10];
        let mut split = LineSplitter::default();
        assert_eq!(split.feed(&big, |_| panic!("no line")), Err(LineTooLong));
        assert!(split.buf.capacity() == 0);
        let mut with_newline = big.clone();
        with_newline.push(b'\n');
        let mut split = LineSplitter::default();
        assert_eq!(
            split.feed(&with_newline, |_| panic!("no line")),
            Err(LineTooLong)
        );
        let mut split = LineSplitter::default();
        let mut result = Ok(());
        for chunk in big.chunks(64 * 1024) {
            result = split.feed(chunk, |_| panic!("no line"));
            if result.is_err() {
                break;
            }
            assert!(split.buf.len() <= MAX_FRAME_LINE);
        }
        assert_eq!(result, Err(LineTooLong));
        // A line of exactly the limit is fine.
        let mut split = LineSplitter::default();
        let mut lines = Vec::new();
        let mut exact = vec![b'y'; MAX_FRAME_LINE];
        exact.extend_from_slice(b"\nok\n");
        for chunk in exact.chunks(1000) {
            split.feed(chunk, |l| lines.push(l.len())).unwrap();
        }
        assert_eq!(lines, vec![MAX_FRAME_LINE, 2]);
    }

    #[tokio::test]
    async fn a_breach_keeps_the_first_violation_and_wakes_waiters() {
        let breach = Breach::default();
        assert_eq!(breach.what(), None);
        let waiter = tokio::spawn({
            let breach = breach.clone();
            async move { breach.tripped().await }
        });
        breach.trip("first");
        breach.trip("second");
        waiter.await.unwrap();
        assert_eq!(breach.what(), Some("first"));
    }

    #[test]
    fn marker_is_found_across_chunks_and_output_is_exact() {
        let marker = "\u{0}kbx-end:1:abcdef\u{0}";
        let stream = format!("hello\nwor\u{0}ld{marker}{{\"op\":\"done\"}}\nafter");
        for size in 1..stream.len() {
            let mut scan = MarkerScanner::new(marker);
            let mut out = Vec::new();
            for chunk in stream.as_bytes().chunks(size) {
                scan.feed(chunk, |b| out.extend_from_slice(b));
            }
            assert!(scan.found(), "chunk size {size}");
            assert_eq!(out, b"hello\nwor\0ld", "chunk size {size}");
            assert_eq!(
                scan.done_line(),
                Some(&b"{\"op\":\"done\"}"[..]),
                "chunk size {size}"
            );
        }
    }

    #[test]
    fn a_done_line_past_its_bound_is_dropped_not_held() {
        let marker = "\u{1}m\u{1}";
        let mut scan = MarkerScanner::new(marker);
        scan.feed(marker.as_bytes(), |_| {});
        let big = vec![b'T'; MAX_DONE_LINE + 1];
        for chunk in big.chunks(1000) {
            scan.feed(chunk, |_| {});
        }
        assert_eq!(scan.done_line(), Some(&b""[..]));
        assert_eq!(scan.done.capacity(), 0);
        // At the bound, in one chunk with its newline, the line is kept.
        let mut scan = MarkerScanner::new(marker);
        let mut line = marker.as_bytes().to_vec();
        line.extend(vec![b'x'; MAX_DONE_LINE]);
        line.push(b'\n');
        scan.feed(&line, |_| {});
        assert_eq!(scan.done_line().map(<[u8]>::len), Some(MAX_DONE_LINE));
        // Past it, in one chunk with its newline, it is dropped.
        let mut scan = MarkerScanner::new(marker);
        let mut line = marker.as_bytes().to_vec();
        line.extend(vec![b'x'; MAX_DONE_LINE + 1]);
        line.push(b'\n');
        scan.feed(&line, |_| {});
        assert_eq!(scan.done_line(), Some(&b""[..]));
    }

    #[test]
    fn tool_call_arguments_stay_raw_text() {
        let f: KernelFrame = serde_json::from_str(
            r#"{"op":"tool_call","cell":2,"call":7,"tool":"web_search","args":{"q": [0, 0]},"x":[1]}"#,
        )
        .unwrap();
        match f {
            KernelFrame::ToolCall {
                cell: Some(2),
                call: 7,
                tool,
                args: Some(args),
            } => {
                assert_eq!(tool, "web_search");
                assert_eq!(args.get(), r#"{"q": [0, 0]}"#);
            }
            other => panic!("{other:?}"),
        }
        let bare: KernelFrame =
            serde_json::from_str(r#"{"op":"tool_call","cell":null,"call":1,"tool":"t"}"#).unwrap();
        assert!(matches!(
            bare,
            KernelFrame::ToolCall {
                cell: None,
                args: None,
                ..
            }
        ));
        for bad in [
            r#"{"op":"nope"}"#,
            r#"{"op":"tool_call","call":1}"#,
            r#"{"op":"done","cell":1,"status":"ok"}"#,
            r#"{"op":"ready"}"#,
            r#"{"op":"tool_call","call":1,"tool":"t","args":{"a":}}"#,
        ] {
            assert!(serde_json::from_str::<KernelFrame>(bad).is_err(), "{bad}");
        }
        let line = HostFrame::ToolResult {
            call: 3,
            ok: true,
            result: Some(&RawValue::from_string("[1, 2]".into()).unwrap()),
            error: None,
        }
        .to_line();
        assert_eq!(
            line,
            b"{\"op\":\"tool_result\",\"call\":3,\"ok\":true,\"result\":[1, 2]}\n"
        );
    }

    #[test]
    fn frames_parse() {
        let f: KernelFrame = serde_json::from_str(
            r#"{"op":"done","cell":3,"status":"error","traceback":"T","execution_count":3,"exit_code":1}"#,
        )
        .unwrap();
        assert!(matches!(
            f,
            KernelFrame::Done {
                cell: 3,
                status: DoneStatus::Error,
                ..
            }
        ));
        let line = HostFrame::Exec {
            cell: 1,
            code: "x=1",
            marker: "m",
        }
        .to_line();
        assert_eq!(line.last(), Some(&b'\n'));
    }
}
