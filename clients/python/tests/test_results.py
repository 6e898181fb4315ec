"""Rich results as typed objects: `Execution.results` and streamed `display` events (the
rich results contract, docs/contract.md). They need nothing beyond the plain kernel image:
the PNG is made with the standard library."""

from __future__ import annotations

import struct

from kernelbox_client import Client, Result

# A cell-side helper: a valid RGB PNG of w x h pixels, standard library only.
MAKE_PNG = """
import struct, zlib, base64
def make_png(w, h):
    def chunk(kind, data):
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc
    rows = b"".join(b"\\x00" + b"\\xff\\x00\\x00" * w for _ in range(h))
    return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
class Picture:
    def __init__(self, w, h): self.w, self.h = w, h
    def _repr_png_(self): return make_png(self.w, self.h)
    def __repr__(self): return f"Picture({self.w}x{self.h})"
class Table:
    def _repr_html_(self): return "<table><tr><td>1</td></tr></table>"
    def __repr__(self): return "Table()"
"""


def png_size(png: bytes) -> tuple:
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    return struct.unpack(">II", png[16:24])


def test_the_last_expression_is_the_main_result_with_typed_helpers(
    client: Client, session_name: str
) -> None:
    s = client.session(session_name)
    s.run(MAKE_PNG)
    r = s.run("Picture(4, 3)")
    assert r.output == "" and len(r.results) == 1
    main = r.main_result
    assert isinstance(main, Result) and main.is_main_result
    assert png_size(main.png) == (4, 3)
    assert main.text == "Picture(4x3)" and "image/png" in main.formats
    html = s.run("Table()").main_result
    assert html.html == "<table><tr><td>1</td></tr></table>" and html.png is None
    assert s.run("x = 1\nx").main_result.text == "1"
    assert s.run("None").results == []
    s.close()


def test_display_events_stream_in_order_between_output(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    s.run(MAKE_PNG)
    events = []
    r = s.run(
        "print('a', flush=True)\ndisplay(Picture(1, 2))\nprint('b', flush=True)\n"
        "display(Table(), Picture(2, 1))",
        on_output=lambda text: events.append(("output", text)),
        on_display=lambda result: events.append(("display", result)),
    )
    kinds = [(k, v if k == "output" else v.formats[0] if v.png is None else png_size(v.png))
             for k, v in events]  # fmt: skip
    assert kinds == [
        ("output", "a\n"), ("display", (1, 2)), ("output", "b\n"),
        ("display", "text/html"), ("display", (2, 1)),
    ]  # fmt: skip
    assert [x.is_main_result for x in r.results] == [False, False, False]
    assert [x.data for x in r.results] == [v.data for k, v in events if k == "display"]
    s.close()
