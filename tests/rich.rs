//! Rich results against the real engine: `display()`, the last expression's value, the
//! matplotlib inline path, the NDJSON `display` events in order with the output, the caps
//! (files and a warning; the host's memory bounded under a hostile flood) and the repl's
//! saved images (`docs/contract.md`, "Rich results").
//!
//! Each test labels what it creates with a unique `io.kernelbox-test.case` and ends by
//! asserting through the Docker API that nothing with that label is left.

mod common;
#[path = "common/http.rs"]
mod http;

use base64::Engine as _;
use serde_json::{json, Value};

use common::Case;
use kernelbox::rich::png_size;
use kernelbox::{CellResult, CellStatus, RichResult};

const TOKEN: &str = "tok-rich";

/// A PNG header (signature and IHDR) for a `w` x `h` image, then `pad` zero bytes.
const PNG_FN: &str = r#"
import struct, zlib
def png(w, h, pad=0):
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + bytes(pad)
"#;

fn texts(r: &CellResult, mime: &str) -> Vec<Option<String>> {
    r.results.iter().map(|b| b.text(mime)).collect()
}

fn decode(b64: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("base64")
}

#[tokio::test(flavor = "multi_thread")]
async fn display_shows_every_repr_method_as_one_bundle_each() {
    let case = Case::new("rich-display").await;
    let code = format!(
        "{PNG_FN}
class Both:
    def _repr_html_(self): return '<b>both</b>'
    def _repr_png_(self): return png(3, 2)
    def __repr__(self): return 'Both()'
class Svg:
    def _repr_svg_(self): return '<svg/>'
class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {{'text/markdown': '# hi', 'application/json': {{'a': [1, 2]}}}}, {{'x': 1}}
class Latex:
    def _repr_latex_(self): return r'$x^2$'
display(Both(), Svg())
display(Bundle(), Latex())
"
    );
    let r = case.run("s", &code).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(r.output, "");
    assert_eq!(r.results.len(), 4, "{:?}", r.results);
    assert!(r.results.iter().all(|b| !b.is_main_result));
    let both = &r.results[0];
    assert_eq!(both.text("text/html").as_deref(), Some("<b>both</b>"));
    assert_eq!(both.text("text/plain").as_deref(), Some("Both()"));
    let png = decode(&both.text("image/png").expect("png"));
    assert_eq!(png_size(&png), Some((3, 2)));
    // An object with only _repr_svg_: the SVG and its repr, nothing else.
    let svg = &r.results[1];
    assert_eq!(
        svg.data.keys().collect::<Vec<_>>(),
        ["image/svg+xml", "text/plain"]
    );
    assert_eq!(svg.text("image/svg+xml").as_deref(), Some("<svg/>"));
    let bundle = &r.results[2];
    assert_eq!(bundle.text("text/markdown").as_deref(), Some("# hi"));
    assert_eq!(bundle.data["application/json"].get(), r#"{"a":[1,2]}"#);
    assert_eq!(bundle.metadata.get(), r#"{"x":1}"#);
    assert_eq!(r.results[3].text("text/latex").as_deref(), Some("$x^2$"));
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_last_expression_is_the_main_result_and_nothing_else_is() {
    let case = Case::new("rich-main").await;
    let r = case.run("s", "x = 20\nx + 22").await;
    assert_eq!(r.output, "", "the value is not added to output");
    assert_eq!(r.results.len(), 1);
    assert!(r.results[0].is_main_result);
    assert_eq!(texts(&r, "text/plain"), [Some("42".to_string())]);
    // None, an expression in the middle, a `;`-silenced last expression, a statement: nothing,
    // and the result has no `results` field at all.
    for code in [
        "None",
        "print('p')",
        "x * 2\ny = 1",
        "x * 2;",
        "x * 2;  # silenced",
        "y = x",
    ] {
        let r = case.run("s", code).await;
        assert_eq!(r.status, CellStatus::Success, "{code}: {r:?}");
        assert!(r.results.is_empty(), "{code}: {:?}", r.results);
        let json = serde_json::to_value(&r).expect("json");
        assert!(json.get("results").is_none(), "{code}: {json}");
    }
    // The main result comes after the cell's displays, and a comment after the value is fine.
    let r = case.run("s", "display('a')\n'b'  # the value").await;
    assert_eq!(
        texts(&r, "text/plain"),
        [Some("'a'".to_string()), Some("'b'".to_string())]
    );
    assert_eq!(
        r.results
            .iter()
            .map(|b| b.is_main_result)
            .collect::<Vec<_>>(),
        [false, true]
    );
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cell_that_breaks_display_gets_a_clear_result_and_the_next_cell_works() {
    let case = Case::new("rich-broken").await;
    // A _repr_html_ that raises: its repr still shows, the output says what was skipped.
    let r = case
        .run(
            "s",
            "class Bad:\n    def _repr_html_(self): raise ValueError('boom')\n    def __repr__(self): return 'Bad()'\nBad()",
        )
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(
        r.output,
        "kernelbox: display: Bad._repr_html_ raised ValueError: boom; skipped\n"
    );
    assert_eq!(texts(&r, "text/plain"), [Some("Bad()".to_string())]);
    // A repr that raises too, and a bundle that is not JSON: clear, and the cell goes on.
    let r = case
        .run(
            "s",
            "class Worse:\n    def __repr__(self): raise KeyError(1)\ndisplay(Worse())\ndisplay({'text/plain': object()}, raw=True)\nprint('went on')",
        )
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(r.output.ends_with("went on\n"), "{}", r.output);
    assert!(r.output.contains("not JSON-serialisable"), "{}", r.output);
    assert_eq!(
        texts(&r, "text/plain"),
        [Some("<Worse object (repr raised KeyError)>".to_string())]
    );
    // The cell rebinds the builtin: its own display breaks, the next cell's works again.
    let r = case
        .run("s", "import builtins\nbuiltins.display = None\ndisplay(1)")
        .await;
    assert_eq!(r.status, CellStatus::Error);
    assert!(
        r.error.as_deref().unwrap_or("").contains("TypeError"),
        "{r:?}"
    );
    let r = case.run("s", "display(1)\n2").await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(
        texts(&r, "text/plain"),
        [Some("1".to_string()), Some("2".to_string())]
    );
    case.finish().await;
}

/// A matplotlib-shaped package (the plain kernel image has no matplotlib): pyplot loads the
/// backend named by `rcParams["backend"]` as matplotlib does, `show()` is the backend's, and
/// `savefig` writes a PNG header of the figure's size times its dpi.
const FAKE_MATPLOTLIB: &str = r#"
import os
files = {
 "matplotlib/__init__.py": "rcParams = {'backend': 'agg'}\n",
 "matplotlib/backends/__init__.py": "",
 "matplotlib/backends/backend_agg.py": "class FigureCanvasAgg:\n    pass\n",
 "matplotlib/backend_bases.py": "class FigureManagerBase:\n    pass\n",
 "matplotlib/_pylab_helpers.py": "class Gcf:\n    figs = []\n    @classmethod\n    def get_all_fig_managers(cls):\n        return list(cls.figs)\n",
 "matplotlib/pyplot.py": '''
import importlib, io, struct, zlib
import matplotlib
from matplotlib._pylab_helpers import Gcf
name = matplotlib.rcParams["backend"]
backend = importlib.import_module(name[len("module://"):]) if name.startswith("module://") else None
class Canvas:
    def __init__(self, figure): self.figure = figure
class Manager:
    def __init__(self, figure): self.canvas = Canvas(figure)
class Figure:
    def __init__(self, figsize, dpi): self.figsize, self.dpi = figsize, dpi
    def __repr__(self): return "<Figure size %dx%d>" % (self.figsize[0] * self.dpi, self.figsize[1] * self.dpi)
    def savefig(self, buf, format, dpi, bbox_inches):
        assert format == "png" and bbox_inches is None
        ihdr = struct.pack(">IIBBBBB", int(self.figsize[0] * dpi), int(self.figsize[1] * dpi), 8, 0, 0, 0, 0)
        buf.write(b"\\x89PNG\\r\\n\\x1a\\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)))
def figure(figsize=(6.4, 4.8), dpi=100):
    fig = Figure(figsize, dpi)
    Gcf.figs.append(Manager(fig))
    return fig
def plot(*args): return figure() if not Gcf.figs else Gcf.figs[-1].canvas.figure
def close(fig):
    Gcf.figs[:] = [m for m in Gcf.figs if m.canvas.figure is not fig]
def show(): backend.show()
''',
}
for path, text in files.items():
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
"#;

#[tokio::test(flavor = "multi_thread")]
async fn matplotlib_figures_become_pngs_at_their_own_size_and_are_closed() {
    let case = Case::new("rich-mpl").await;
    let r = case.run("s", FAKE_MATPLOTLIB).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    // Nothing of matplotlib is loaded until a cell imports it.
    let r = case
        .run("s", "import sys\nsorted(m for m in sys.modules if 'matplotlib' in m or m == 'kernelbox_inline')")
        .await;
    assert_eq!(texts(&r, "text/plain"), [Some("[]".to_string())]);
    // A figure left open: one image/png at its size times its dpi, then closed.
    let r = case
        .run(
            "s",
            "import matplotlib.pyplot as plt\nprint(plt.matplotlib.rcParams['backend'])\nfig = plt.figure(figsize=(4, 3), dpi=100)\nx = 1",
        )
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(r.output, "module://kernelbox_inline\n");
    assert_eq!(r.results.len(), 1, "{:?}", r.results);
    let png = decode(&r.results[0].text("image/png").expect("png"));
    assert_eq!(png_size(&png), Some((400, 300)));
    assert_eq!(
        r.results[0].text("text/plain").as_deref(),
        Some("<Figure size 400x300>")
    );
    let r = case.run("s", "len(plt.Gcf.figs)").await;
    assert_eq!(texts(&r, "text/plain"), [Some("0".to_string())], "{r:?}");
    // plt.show() twice: two images in order, output between them in place.
    let r = case
        .run(
            "s",
            "plt.figure(figsize=(1, 2), dpi=10)\nplt.show()\nprint('between')\nplt.figure(figsize=(3, 1), dpi=10)\nplt.show()",
        )
        .await;
    assert_eq!(r.output, "between\n");
    let sizes: Vec<_> = r
        .results
        .iter()
        .map(|b| png_size(&decode(&b.text("image/png").expect("png"))))
        .collect();
    assert_eq!(sizes, [Some((10, 20)), Some((30, 10))]);
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn displays_stream_as_ndjson_events_between_output_in_order() {
    let server = http::TestServer::start(
        "rich-stream",
        http::tenants(vec![http::tenant("acme", TOKEN)]),
        |_| {},
    )
    .await;
    let api = &server.api;
    let code = "print('a', end='')\ndisplay(1, 2, 3)\nprint('b')\nimport sys\nsys.stderr.write('c\\n')\ndisplay('<d>')\n4";
    let mut events = api.stream(TOKEN, "s", json!({ "code": code })).await;
    let mut seen = Vec::new();
    let result = loop {
        let event = events.next().await.expect("an event");
        match event["event"].as_str() {
            Some("output") => {
                let text = event["data"].as_str().expect("text").to_string();
                match seen.last_mut() {
                    Some(Value::String(last)) => last.push_str(&text),
                    _ => seen.push(Value::String(text)),
                }
            }
            Some("display") => seen.push(json!({ "display": event["data"]["data"]["text/plain"] })),
            Some("result") => break event["result"].clone(),
            _ => panic!("unexpected event {event}"),
        }
    };
    assert_eq!(
        seen,
        [
            json!("a"),
            json!({"display": "1"}),
            json!({"display": "2"}),
            json!({"display": "3"}),
            json!("b\nc\n"),
            json!({"display": "'<d>'"}),
            json!({"display": "4"}),
        ]
    );
    let results: Vec<RichResult> = serde_json::from_value::<Vec<Value>>(result["results"].clone())
        .expect("results")
        .into_iter()
        .map(|v| serde_json::from_str(&v.to_string()).expect("a bundle"))
        .collect();
    assert_eq!(results.len(), 5);
    assert!(results[4].is_main_result);
    assert_eq!(result["output"], "ab\nc\n");
    // A cell with no display: no `results` key in the result.
    let plain = api.run(TOKEN, "s", "print(5)").await;
    assert!(plain.get("results").is_none(), "{plain}");
    assert_eq!(plain["output"], "5\n");
    server.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_display_over_the_caps_is_saved_to_a_file_with_a_note_and_a_warning() {
    let case = Case::new("rich-spill").await;
    let code = format!(
        "{PNG_FN}
class Big:
    def _repr_png_(self): return png(640, 480, pad=50 * 1024 * 1024)
    def __repr__(self): return 'Big()'
display(Big())
print('done')"
    );
    let r = case.run("s", &code).await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(r.output, "done\n");
    let path = "/work/display-1-1.png";
    assert_eq!(r.results.len(), 1);
    let note = r.results[0].text("text/plain").expect("note");
    assert!(note.starts_with("Big()\n[image/png, 52428833 bytes, over the display cap: saved to /work/display-1-1.png]"), "{note}");
    assert_eq!(r.results[0].data.len(), 1, "only the note is inline");
    assert_eq!(
        r.warning.as_deref(),
        Some(
            "Display data over the caps (5242880 bytes each, 20971520 bytes per cell) was saved to files inside the kernel: /work/display-1-1.png."
        )
    );
    // The file holds the whole image.
    let r = case
        .run("s", &format!("import os\nwith open({path:?}, 'rb') as f: head = f.read(24)\n(os.path.getsize({path:?}), head[:4])"))
        .await;
    assert_eq!(
        texts(&r, "text/plain"),
        [Some("(52428833, b'\\x89PNG')".to_string())]
    );
    case.finish().await;
}

/// Bytes of the never-ending display the flood test forges.
const FORGED: usize = 512 * 1024 * 1024;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// Display values pass through to clients as the kernel wrote them: one nested thousands deep
/// would break the caller's JSON reader (Python's `json`, serde_json's default limit), so a
/// display nested past `MAX_DISPLAY_DEPTH` is dropped and counted, and the result stays
/// readable; one just within it is kept.
#[tokio::test]
async fn a_forged_display_nested_too_deep_is_dropped_and_the_result_stays_readable() {
    let case = Case::new("rich-deep").await;
    let code = r#"
import gc, os
d = [o for o in gc.get_objects() if type(o).__name__ == "_Display"][0]
m = d.marker
def forge(value):
    text = b'{"data":{"application/json":' + value + b'}}'
    pieces = [text[i:i + 4000] for i in range(0, len(text), 4000)]
    for i, p in enumerate(pieces):
        os.write(1, m + (b"." if i == len(pieces) - 1 else b"+") + p + b"\n")
forge(b"[" * 100000 + b"]" * 100000)
forge(b"[" * 62 + b'"kept"' + b"]" * 62)
print("forged")
"#;
    let r = case.run("s", code).await;
    assert_eq!(r.status, CellStatus::Success, "{:?}", r.error);
    assert_eq!(r.results.len(), 1, "{:?}", r.warning);
    assert!(r.results[0].data["application/json"].get().contains("kept"));
    let warning = r.warning.as_deref().expect("a warning");
    assert!(warning.starts_with("1 display(s)"), "{warning}");
    // The whole result reads back with serde_json's default recursion limit.
    let text = serde_json::to_string(&r).expect("json");
    serde_json::from_str::<serde_json::Value>(&text).expect("a readable result");
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_displays_and_forged_pieces_keeps_host_memory_bounded() {
    let case = Case::new("rich-flood").await;
    // Warm up: the kernel and the orchestrator's first-cell allocations.
    case.run("s", "1").await;
    let before = rss_kib();
    // The runner drops what is past the cell cap; a hostile cell then bypasses it: it takes the
    // display marker from the runner's memory and forges pieces on the output pipe itself, a
    // 512 MiB display that never ends and 200,000 tiny ones.
    let code = r#"
for i in range(30000):
    display(i)
import gc, os
d = [o for o in gc.get_objects() if type(o).__name__ == "_Display"][0]
m = d.marker
piece = m + b"+" + b"x" * (4094 - len(m)) + b"\n"
import time
t = time.time()
for _ in range(FORGED // len(piece)):
    os.write(1, piece)
tiny = m + b'.{"data":{"text/plain":"t"}}\n'
for _ in range(200):
    os.write(1, tiny * 1000)
print("flooded", time.time() - t)
"#;
    let started = std::time::Instant::now();
    let r = case.run("s", &format!("FORGED = {FORGED}\n{code}")).await;
    let grown = rss_kib().saturating_sub(before);
    eprintln!("flood cell took {:?}", started.elapsed());
    assert_eq!(r.status, CellStatus::Success, "{:?}", r.error);
    assert!(r.output.contains("flooded"), "{}", r.output);
    let kept: usize = r
        .results
        .iter()
        .map(|b| serde_json::to_string(b).expect("json").len() + 1024)
        .sum();
    assert!(
        kept <= 20 * 1024 * 1024 + 64 * 1024,
        "{kept} bytes of displays kept"
    );
    let warning = r.warning.as_deref().expect("a warning");
    assert!(
        warning.ends_with(
            "display(s) past the caps (5242880 bytes each, 20971520 bytes per cell) were dropped."
        ),
        "{warning}"
    );
    eprintln!(
        "flood: {} results kept ({} KiB), host RSS grew {} KiB; {warning}",
        r.results.len(),
        kept / 1024,
        grown
    );
    assert!(grown < 160 * 1024, "host RSS grew {grown} KiB");
    // The kernel is fine and the next cell is clean.
    let r = case.run("s", "'next'").await;
    assert_eq!(texts(&r, "text/plain"), [Some("'next'".to_string())]);
    assert!(r.warning.is_none());
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_repl_saves_images_and_prints_text_results() {
    let label = common::unique("rich-repl");
    let dir = tempfile::tempdir().expect("tempdir");
    let cells = format!(
        "{}\n\nprint('hi')\n\nclass I:\n    def _repr_png_(self): return png(640, 480)\ndisplay(I(), I())\n6 * 7\n",
        PNG_FN.trim()
    );
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args([
            "repl",
            "--session",
            "r",
            "--label",
            &format!("{}={label}", common::CASE),
        ])
        .current_dir(dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("repl starts");
    {
        use tokio::io::AsyncWriteExt;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(cells.as_bytes()).await.expect("cells");
    }
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        child.wait_with_output(),
    )
    .await
    .expect("the repl ends")
    .expect("output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "hi\n[image/png 640x480 -> cell-3-1.png]\n[image/png 640x480 -> cell-3-2.png]\n42\n"
    );
    for name in ["cell-3-1.png", "cell-3-2.png"] {
        let png = std::fs::read(dir.path().join(name)).expect(name);
        assert_eq!(png_size(&png), Some((640, 480)), "{name}");
    }
    common::assert_clean(&common::engine().await, &label).await;
}

/// The data-science image (`kernelbox image build --preset datascience`).
const DATASCIENCE_IMAGE: &str = "kernelbox/kernel-datascience:latest";

#[tokio::test(flavor = "multi_thread")]
async fn real_matplotlib_and_pandas_give_pngs_of_the_figure_size_and_html_tables() {
    let case = Case::with("rich-ds", |c| c.spec.image = DATASCIENCE_IMAGE.into()).await;
    // A line plot left open: one PNG of the figure's pixel size (4x3 inches at dpi 100).
    let r = case
        .run(
            "s",
            "import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 3), dpi=100)\nplt.plot([1, 2, 3], [1, 4, 9]);",
        )
        .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(r.output, "");
    assert_eq!(r.results.len(), 1, "{:?}", r.results);
    let png = decode(&r.results[0].text("image/png").expect("png"));
    assert_eq!(png_size(&png), Some((400, 300)));
    // plt.show() twice: two images in order, each figure closed after it is shown.
    let r = case
        .run(
            "s",
            "plt.figure(figsize=(2, 1), dpi=50)\nplt.plot([1, 2])\nplt.show()\nplt.figure(figsize=(3, 2), dpi=50)\nplt.plot([2, 1])\nplt.show()\nlen(plt.get_fignums())",
        )
        .await;
    let sizes: Vec<_> = r
        .results
        .iter()
        .filter_map(|b| b.text("image/png"))
        .map(|png| png_size(&decode(&png)))
        .collect();
    assert_eq!(sizes, [Some((100, 50)), Some((150, 100))], "{r:?}");
    assert_eq!(r.results[2].text("text/plain").as_deref(), Some("0"));
    // A figure kept from an earlier cell (closed there) shows as its PNG when it is the value.
    let r = case
        .run(
            "s",
            "fig = plt.figure(figsize=(2, 2), dpi=40)\nplt.close(fig)\nfig",
        )
        .await;
    assert_eq!(r.results.len(), 1, "{r:?}");
    assert!(r.results[0].is_main_result);
    let png = decode(&r.results[0].text("image/png").expect("png"));
    assert_eq!(png_size(&png), Some((80, 80)));
    // A DataFrame as the last expression: its HTML table and text, as the main result.
    let r = case
        .run("s", "import pandas as pd\npd.DataFrame({'a': [1, 2]})")
        .await;
    assert_eq!(r.results.len(), 1, "{r:?}");
    let table = &r.results[0];
    assert!(table.is_main_result);
    assert!(table.text("text/html").expect("html").contains("<table"));
    assert_eq!(
        table.text("text/plain").as_deref(),
        Some("   a\n0  1\n1  2")
    );
    case.finish().await;
}
