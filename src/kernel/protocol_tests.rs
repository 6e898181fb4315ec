//! Unit tests of the runner protocol: line splitting, end markers, frame bounds.

use super::*;
use crate::kernel::scanner::{MarkerScanner, Piece, MAX_DISPLAY_PIECE};

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
            scan.feed(chunk, |p| match p {
                Piece::Output(b) => out.extend_from_slice(b),
                other => panic!("{other:?}"),
            });
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

/// What a scanner makes of a stream fed in chunks of `size`: output runs merged, displays and
/// breaks as tokens.
fn scan_all(stream: &[u8], size: usize) -> (Vec<String>, bool) {
    let mut scan = MarkerScanner::with_display("\u{1}end\u{1}", "\u{1}dsp\u{1}");
    let mut seen: Vec<String> = Vec::new();
    let mut display = Vec::new();
    for chunk in stream.chunks(size) {
        scan.feed(chunk, |p| match p {
            Piece::Output([]) => {}
            Piece::Output(b) => match seen.last_mut() {
                Some(last) if last.starts_with("out:") => {
                    last.push_str(&String::from_utf8_lossy(b))
                }
                _ => seen.push(format!("out:{}", String::from_utf8_lossy(b))),
            },
            Piece::Display { bytes, last } => {
                display.extend_from_slice(bytes);
                if last {
                    seen.push(format!("display:{}", String::from_utf8_lossy(&display)));
                    display.clear();
                }
            }
            Piece::Broken => {
                display.clear();
                seen.push("broken".into());
            }
            Piece::Stderr(b) => match seen.last_mut() {
                Some(last) if last.starts_with("err:") => {
                    last.push_str(&String::from_utf8_lossy(b))
                }
                _ => seen.push(format!("err:{}", String::from_utf8_lossy(b))),
            },
            Piece::Traceback(b) => match seen.last_mut() {
                Some(last) if last.starts_with("tb:") => last.push_str(&String::from_utf8_lossy(b)),
                _ => seen.push(format!("tb:{}", String::from_utf8_lossy(b))),
            },
        });
    }
    (seen, scan.found())
}

#[test]
fn stderr_and_traceback_frames_come_apart_from_stdout_across_chunks() {
    // A stderr frame whose bytes hold a newline, a marker's first byte and the end marker
    // itself (frame bytes are not searched), then stdout, then a traceback in two frames.
    let stream =
        b"a\x01dsp\x01e0009E\n\x01end\x01!!b\x01dsp\x01t0002Tr\x01dsp\x01t0002ac\x01end\x01{}\n";
    for size in 1..stream.len() {
        let (seen, found) = scan_all(stream, size);
        assert!(found, "chunk size {size}");
        assert_eq!(
            seen,
            ["out:a", "err:E\n\x01end\x01!!", "out:b", "tb:Trac"].map(String::from),
            "chunk size {size}"
        );
    }
}

#[test]
fn a_forged_stderr_length_is_dropped_and_output_goes_on() {
    // Not hex, and longer than any frame the runner writes.
    let stream = b"\x01dsp\x01ezzzzA\x01dsp\x01effffB\x01end\x01{}\n";
    for size in [1, 3, stream.len()] {
        let (seen, found) = scan_all(stream, size);
        assert!(found, "chunk size {size}");
        assert_eq!(seen, ["out:AB"].map(String::from), "chunk size {size}");
    }
}

#[test]
fn displays_are_found_between_output_in_order_across_chunks() {
    let stream = b"a\n\x01dsp\x01+{\"x\"\nb\x01dsp\x01.:1}\nc\x01end\x01{\"op\":\"done\"}\n";
    for size in 1..stream.len() {
        let (seen, found) = scan_all(stream, size);
        assert!(found, "chunk size {size}");
        assert_eq!(
            seen,
            ["out:a\nb", "display:{\"x\":1}", "out:c"].map(String::from),
            "chunk size {size}"
        );
    }
}

#[test]
fn a_forged_display_piece_breaks_without_hiding_the_end_marker() {
    // A piece cut by a marker, a piece with no flag, and one past its bound.
    let mut stream = b"\x01dsp\x01+abc\x01dsp\x01\n\x01dsp\x01".to_vec();
    stream.extend(vec![b'y'; MAX_DISPLAY_PIECE + 10]);
    stream.extend(b"\nz\x01end\x01{}\n");
    for size in [1, 7, 1000, stream.len()] {
        let (seen, found) = scan_all(&stream, size);
        assert!(found, "chunk size {size}");
        assert_eq!(seen[..2], ["broken", "broken"], "chunk size {size}");
        assert_eq!(seen[2], "broken", "chunk size {size}");
        assert!(seen.last().unwrap().ends_with('z'), "{seen:?}");
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
        display: "d",
        display_caps: RunnerDisplayCaps {
            bundle: 1,
            cell: 2,
            overhead: 3,
        },
    }
    .to_line();
    assert_eq!(line.last(), Some(&b'\n'));
}

#[test]
fn the_fake_engine_speaks_this_protocol_version() {
    assert_eq!(crate::docker::fake::RUNNER_PROTOCOL, PROTOCOL_VERSION);
}

#[test]
fn the_runner_speaks_this_protocol_version() {
    let line = format!("PROTOCOL_VERSION = {PROTOCOL_VERSION}\n");
    assert!(
        RUNNER_SOURCE.contains(&line),
        "runner/kernel_runner.py must say {line:?}"
    );
}
