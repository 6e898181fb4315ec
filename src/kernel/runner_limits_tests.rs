//! The limits the Python side keeps by hand, checked against the host's constants: the runner
//! and its display module (`docs/architecture.md`, "Runner protocol") and the file helper
//! (`docs/architecture.md`, "File transport"; docs/files.md "Files in and out of a kernel") are sent
//! to kernels as source and cannot import the host's numbers, so each keeps its own copy.
//! Each copy is read from its top-level `NAME = <int expr>` line.

use super::files::frame::MAX_HEADER;
use super::protocol::MAX_FRAME_LINE;
use super::scanner::MAX_DISPLAY_PIECE;
use crate::files::{FilePath, MAX_LIST_ENTRIES, MAX_NAME_BYTES, MAX_PATH_BYTES};

const RUNNER: (&str, &str) = (
    "runner/kernel_runner.py",
    include_str!("../../runner/kernel_runner.py"),
);
const RICH: (&str, &str) = ("runner/rich.py", include_str!("../../runner/rich.py"));
const HELPER: (&str, &str) = (
    "runner/file_helper.py",
    include_str!("../../runner/file_helper.py"),
);

/// What the host's header bound allows beyond the helper's listing bound (`MAX_HEADER` in
/// `src/kernel/files/frame.rs` is the listing's 2 MiB plus this).
const HEADER_ALLOWANCE: usize = 64 * 1024;

/// The value of `expr`: integers (`10_000` too), products (`a * b`) and left shifts
/// (`a << b`, binding looser than `*`, as in Python); `None` for anything else.
fn eval(expr: &str) -> Option<u64> {
    let product = |p: &str| {
        p.split('*').try_fold(1u64, |acc, n| {
            let n = n.trim().replace('_', "");
            if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            acc.checked_mul(n.parse().ok()?)
        })
    };
    let mut shifts = expr.split("<<");
    let first = product(shifts.next()?)?;
    shifts.try_fold(first, |acc, s| {
        let by = u32::try_from(product(s)?).ok().filter(|by| *by < 64)?;
        let value = acc << by;
        (value >> by == acc).then_some(value)
    })
}

/// The value of the top-level `NAME = <int expr>` line of a Python file; panics, naming the
/// file, when there is none, more than one, or its value is not such an expression.
fn python_int((file, source): (&str, &str), name: &str) -> usize {
    let prefix = format!("{name} = ");
    let mut lines = source.lines().filter_map(|l| l.strip_prefix(&prefix));
    let line = lines
        .next()
        .unwrap_or_else(|| panic!("{file} has no top-level line `{name} = ...`"));
    assert!(
        lines.next().is_none(),
        "{file} assigns {name} more than once"
    );
    let expr = line.split('#').next().unwrap_or_default();
    let value = eval(expr)
        .unwrap_or_else(|| panic!("{file}: `{name} = {line}` is not an integer expression"));
    usize::try_from(value).unwrap()
}

#[test]
fn python_int_expressions_are_read_as_python_reads_them() {
    assert_eq!(eval("10000"), Some(10_000));
    assert_eq!(eval(" 10_000 "), Some(10_000));
    assert_eq!(eval("2 * 1024 * 1024"), Some(2 << 20));
    assert_eq!(eval("1 << 20"), Some(1 << 20));
    assert_eq!(eval("2 * 4 << 2 * 2"), Some(128));
    for bad in [
        "",
        "x",
        "1 +  2",
        "-1",
        "1.5",
        "1 << 64",
        "1 << 99999999999",
        "1 <<",
    ] {
        assert_eq!(eval(bad), None, "{bad:?}");
    }
    let source = "A = 3  # three\n    B = 4\nB = 1 << 3\n";
    assert_eq!(python_int(("t.py", source), "A"), 3);
    assert_eq!(
        python_int(("t.py", source), "B"),
        8,
        "the indented B is not top-level"
    );
}

#[test]
fn the_runner_and_the_file_helper_keep_the_hosts_limits() {
    // (the Python file, its name; the host's constant, its value)
    let pairs = [
        (
            RUNNER,
            "MAX_FRAME_LINE",
            "src/kernel/protocol.rs MAX_FRAME_LINE (the longest protocol line the host reads)",
            MAX_FRAME_LINE,
        ),
        (
            RICH,
            "_PIPE_BUF",
            "src/kernel/scanner.rs MAX_DISPLAY_PIECE (a display piece and its marker, one \
             atomic pipe write)",
            MAX_DISPLAY_PIECE,
        ),
        (
            HELPER,
            "MAX_LIST",
            "src/files.rs MAX_LIST_ENTRIES (the entries of a listing)",
            MAX_LIST_ENTRIES,
        ),
        (
            HELPER,
            "MAX_LIST_BYTES",
            "src/kernel/files/frame.rs MAX_HEADER less its 64 KiB allowance (a listing's \
             header line)",
            MAX_HEADER - HEADER_ALLOWANCE,
        ),
    ];
    let mut differ = Vec::new();
    for (python, name, host, want) in pairs {
        let got = python_int(python, name);
        if got != want {
            differ.push(format!("{} {name} = {got}, {host} = {want}", python.0));
        }
    }
    assert!(
        differ.is_empty(),
        "the Python side differs from the host: {}",
        differ.join("; ")
    );
}

#[test]
fn the_longest_request_the_host_sends_fits_the_helpers_max_request() {
    // The host sends `{"op", "path": [names]}` (src/kernel/files/helper.rs), the path checked
    // by FilePath::parse. A path byte takes at most 6 bytes of JSON (a control character is
    // `\u0001`; a separator is `","`, 3), and the array 4 more (its brackets and the first
    // name's quotes).
    let envelope = serde_json::to_vec(&serde_json::json!({"op": "remove", "path": []}))
        .unwrap()
        .len();
    let bound = envelope - 2 + 6 * MAX_PATH_BYTES + 4;
    let max_request = python_int(HELPER, "MAX_REQUEST");
    assert!(
        bound <= max_request,
        "runner/file_helper.py MAX_REQUEST = {max_request} is under the longest request the \
         host can send, {bound} bytes (src/files.rs MAX_PATH_BYTES = {MAX_PATH_BYTES})"
    );
    // The bound holds for the worst path, names of control characters as long as allowed,
    // whose every name byte takes the 6 bytes.
    let name = "\u{1}".repeat(MAX_NAME_BYTES);
    let names = MAX_PATH_BYTES.div_ceil(MAX_NAME_BYTES + 1);
    let mut path = vec![name; names].join("/");
    path.truncate(MAX_PATH_BYTES);
    let path = FilePath::parse(&path).unwrap();
    let request =
        serde_json::to_vec(&serde_json::json!({"op": "remove", "path": path.parts()})).unwrap();
    assert!(
        request.len() > 6 * (MAX_PATH_BYTES - names),
        "{}",
        request.len()
    );
    assert!(request.len() <= bound, "{} > {bound}", request.len());
}
