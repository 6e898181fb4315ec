"""kernelbox rich results: ``display()``, the value of a cell's last expression, matplotlib.

Standard library only. Loaded into the runner's namespace on first use (the host sends it in
the kernel's environment and the runner keeps only its text until a cell displays something,
ends with a non-None expression, or imports matplotlib), so an idle kernel pays nothing for it.
Definitions only; the state lives in the runner's ``_Display``.

A display is a MIME bundle as in nbformat's ``display_data``/``execute_result``:
``{"data": {MIME: value}, "metadata": {...}, "is_main_result": bool}``. It travels in-band on
the cell's output pipe, so it lands between the cell's output in the order written: the runner
flushes ``sys.stdout``/``sys.stderr``, then writes the bundle's JSON (ASCII, so it holds no
newline and no \\x01) in pieces of at most PIPE_BUF bytes, each ``MARKER FLAG PIECE \\n`` with
the cell's display marker (chosen by the host, like the end marker), FLAG ``+`` (more follows)
or ``.`` (last piece). A write of at most PIPE_BUF bytes to a pipe is atomic, so output of other
threads or subprocesses never lands inside a piece (see docs/architecture.md).

Caps (the host's, sent with each cell): a bundle over ``bundle`` bytes, or one that would take
the cell past ``cell`` bytes (each display counts its JSON plus ``overhead``), has its entries
other than ``text/plain`` written to files in the kernel's working directory and is sent as a
``text/plain`` note naming them, with ``"spilled": [paths]`` for the host's warning. When even
the note does not fit, the display is dropped and counted in the ``done`` frame. The host
enforces the same caps on what it receives.

matplotlib is never imported here: a finder on ``sys.meta_path`` waits for a cell to import it,
then points its default backend at ``kernelbox_inline`` (a backend module made on import whose
``show()`` displays the open figures); at the end of every cell that has ``matplotlib.pyplot``
loaded, open figures become ``image/png`` displays at their own size and dpi, and are closed.
"""

# (MIME type, method) in the order IPython's formatters try them; text/plain comes from repr.
_REPR_METHODS = (
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("image/svg+xml", "_repr_svg_"),
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
)
_BINARY_MIMES = ("image/png", "image/jpeg")
_EXTENSIONS = {
    "image/png": "png",
    "image/jpeg": "jpg",
    "image/svg+xml": "svg",
    "text/html": "html",
    "text/markdown": "md",
    "text/latex": "tex",
    "application/json": "json",
}
# A pipe write of at most this many bytes is atomic (POSIX PIPE_BUF on Linux).
_PIPE_BUF = 4096


def _show(display, objs, raw=False, metadata=None, main=False):
    for obj in objs:
        if raw and isinstance(obj, dict):
            data, md = dict(obj), {}
        else:
            data, md = _format(obj)
        if isinstance(metadata, dict):
            md.update(metadata)
        _emit(display, data, md, main)


def _emit(display, data, metadata, main=False):
    if display.marker is None:
        return  # no cell is running: a stray thread's display belongs to nobody
    bundle = {"data": data, "metadata": metadata, "is_main_result": bool(main)}
    bundle_cap = display.caps[0]
    # A value alone past the cap is spilled without encoding the whole bundle first.
    text = None
    if sum(len(v) for v in data.values() if isinstance(v, str)) <= bundle_cap:
        try:
            text = _dumps(bundle)
        except (TypeError, ValueError, RecursionError) as exc:
            _note("a display was not JSON-serialisable (%s); it was skipped" % exc)
            return
    with display.lock:
        marker = display.marker
        if marker is None:
            return
        bundle_cap, cell_cap, overhead = display.caps
        display.count += 1
        if text is None or len(text) > bundle_cap or display.used + len(text) + overhead > cell_cap:
            text = _spill(display, bundle)
            if text is None or display.used + len(text) + overhead > cell_cap:
                display.dropped += 1
                return
        display.used += len(text) + overhead
        _flush_quietly()
        _write_pieces(display.ch.cell_out, marker, text.encode("ascii"))


def _spill(display, bundle):
    """Writes the bundle's entries but text/plain to files; returns the note bundle's JSON."""
    data = bundle["data"]
    paths = []
    for mime in list(data):
        if mime == "text/plain":
            continue
        value = data.pop(mime)
        path = "%s/display-%s-%d.%s" % (display.workdir, display.cell, display.count, _EXTENSIONS.get(mime, "txt"))
        try:
            if mime in _BINARY_MIMES and isinstance(value, str):
                import binascii

                blob = binascii.a2b_base64(value)
            elif isinstance(value, str):
                blob = value.encode("utf-8", "surrogatepass")
            else:
                blob = _dumps(value).encode("ascii")
            with open(path, "wb") as f:
                f.write(blob)
            paths.append(path)
            data["text/plain"] = "%s[%s, %d bytes, over the display cap: saved to %s]" % (
                _short(data.get("text/plain")), mime, len(blob), path)
        except Exception as exc:
            data["text/plain"] = "%s[%s could not be saved: %s]" % (_short(data.get("text/plain")), mime, exc)
    data["text/plain"] = _short(data.get("text/plain", ""), 4000)
    bundle["metadata"] = {}
    bundle["spilled"] = paths
    try:
        return _dumps(bundle)
    except Exception:
        return None


def _flush_figures(display):
    """Displays the open matplotlib figures as PNG and closes them."""
    try:
        helpers = _modules.get("matplotlib._pylab_helpers")
        managers = list(helpers.Gcf.get_all_fig_managers()) if helpers is not None else []
    except Exception as exc:
        _note("the open figures could not be listed: %s" % exc)
        return
    plt = _modules["matplotlib.pyplot"]
    for manager in managers:
        fig = getattr(getattr(manager, "canvas", None), "figure", None)
        if fig is None:
            continue
        png = _figure_png(fig)
        if png is not None:
            _emit(display, {"image/png": png, "text/plain": _safe_repr(fig)}, {})
        try:
            plt.close(fig)
        except Exception:
            pass


def _write_pieces(fd, marker, payload):
    room = _PIPE_BUF - len(marker) - 2
    start = 0
    while True:
        piece = payload[start:start + room]
        start += room
        last = start >= len(payload)
        _write_all(fd, marker + (b"." if last else b"+") + piece + b"\n")
        if last:
            return


def _short(text, limit=1000):
    if not isinstance(text, str):
        return ""
    if len(text) > limit:
        return text[:limit] + "...\n"
    return text + ("\n" if text and not text.endswith("\n") else "")


def _note(message):
    """Tells the cell, on its own stderr, what became of a display."""
    try:
        _flush_quietly()
        _write_all(2, ("kernelbox: display: %s\n" % message).encode("utf-8", "replace"))
    except Exception:
        pass


def _safe_repr(obj):
    try:
        return repr(obj)
    except Exception as exc:
        return "<%s object (repr raised %s)>" % (type(obj).__name__, type(exc).__name__)


def _repr_method(obj, name):
    # Classes are shown by repr only: their _repr_*_ are instance methods (as in IPython).
    if isinstance(obj, type):
        return None
    try:
        method = getattr(obj, name, None)
    except Exception:
        return None
    return method if callable(method) else None


def _format(obj):
    """The MIME bundle of one object: _repr_mimebundle_, then the _repr_*_ methods, then repr.
    A method that raises is skipped with a note; the others still count."""
    data, metadata = {}, {}
    method = _repr_method(obj, "_repr_mimebundle_")
    if method is not None:
        try:
            got = method(include=None, exclude=None)
            if isinstance(got, tuple) and len(got) == 2:
                got, md = got
                if isinstance(md, dict):
                    metadata.update(md)
            if isinstance(got, dict):
                for mime, value in got.items():
                    if isinstance(mime, str):
                        data[mime] = _encode(mime, value)
        except Exception as exc:
            _note("%s._repr_mimebundle_ raised %s: %s; skipped" % (type(obj).__name__, type(exc).__name__, exc))
    for mime, name in _REPR_METHODS:
        if mime in data:
            continue
        method = _repr_method(obj, name)
        if method is None:
            continue
        try:
            value = method()
        except Exception as exc:
            _note("%s.%s raised %s: %s; skipped" % (type(obj).__name__, name, type(exc).__name__, exc))
            continue
        if isinstance(value, tuple) and len(value) == 2:
            value, md = value
            if isinstance(md, dict):
                metadata[mime] = md
        if value is not None:
            data[mime] = _encode(mime, value)
    if "image/png" not in data and _is_figure(obj):
        # A matplotlib figure shows as its PNG (as Jupyter's inline backend registers).
        png = _figure_png(obj)
        if png is not None:
            data["image/png"] = png
    if "text/plain" not in data:
        data["text/plain"] = _safe_repr(obj)
    return data, metadata


def _is_figure(obj):
    return type(obj).__module__ == "matplotlib.figure" and callable(getattr(obj, "savefig", None))


def _figure_png(fig):
    """The figure as base64 PNG at its own size and dpi, without a tight bounding box (as
    Jupyter's inline backend); None (with a note) when it cannot be rendered."""
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=fig.dpi, bbox_inches=None)
        import binascii

        return binascii.b2a_base64(buf.getvalue(), newline=False).decode("ascii")
    except Exception as exc:
        _note("a figure could not be rendered: %s" % exc)
        return None


def _encode(mime, value):
    """A value as nbformat stores it: base64 for binary images, text for the rest, JSON as is."""
    if mime in _BINARY_MIMES and isinstance(value, (bytes, bytearray, memoryview)):
        import binascii

        return binascii.b2a_base64(bytes(value), newline=False).decode("ascii")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if mime == "application/json" and isinstance(value, str):
        try:
            return _loads(value)
        except Exception:
            return value
    return value


def _inline_spec(finder, name, path, target):
    """The spec of ``kernelbox_inline`` (made here), or matplotlib's own with its loader
    wrapped so that its default backend becomes ``kernelbox_inline`` once it is loaded."""
    if name == _INLINE_BACKEND:
        return type(sys.__spec__)(name, _InlineBackend(finder.display))
    spec = None
    for other in list(sys.meta_path):
        if other is finder or not hasattr(other, "find_spec"):
            continue
        spec = other.find_spec(name, path, target)
        if spec is not None:
            break
    if spec is None or spec.loader is None:
        return spec
    spec.loader = _AfterLoad(spec.loader, _use_inline_backend)
    return spec


class _InlineBackend:
    """The loader of ``kernelbox_inline``: Agg's canvas; ``show()`` displays the open figures."""

    def __init__(self, display):
        self.display = display

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        agg = __import__("matplotlib.backends.backend_agg", fromlist=["FigureCanvasAgg"])
        bases = __import__("matplotlib.backend_bases", fromlist=["FigureManagerBase"])
        display = self.display

        def show(*args, **kwargs):
            _guarded(display.flush_figures)()

        module.FigureCanvas = agg.FigureCanvasAgg
        module.FigureManager = bases.FigureManagerBase
        module.show = show


class _AfterLoad:
    """A loader that runs ``then(module)`` after the real loader; everything else is its."""

    def __init__(self, loader, then):
        self._loader = loader
        self._then = then

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._then(module)


def _use_inline_backend(matplotlib):
    # kernelbox_inline is Agg with a show() that displays: an image's headless default
    # (MPLBACKEND=Agg) is taken as no choice; any other backend named there is kept.
    if os.environ.get("MPLBACKEND", "").lower() not in ("", "agg"):
        return
    try:
        matplotlib.rcParams["backend"] = "module://" + _INLINE_BACKEND
    except Exception as exc:
        _note("matplotlib's inline backend could not be set: %s" % exc)

