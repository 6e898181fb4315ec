"""Seeds matplotlib's font cache in a kernel of the data-science image (docs/images.md "Images").

matplotlib keeps its font list in MPLCONFIGDIR, which must be writable; in a kernel that is
/tmp/matplotlib, on the kernel's own empty tmpfs, so without this every new kernel would scan
the fonts again on its first ``import matplotlib``. The image builds the list once into
/usr/share/kernelbox/matplotlib; this module, imported at interpreter start by
``kernelbox-mplcache.pth``, puts a finder first on ``sys.meta_path`` that copies it into
MPLCONFIGDIR when ``matplotlib`` is first imported, then removes itself. It imports nothing
until then: kernels that never import matplotlib pay one small module and no memory.
"""

import sys

BAKED = "/usr/share/kernelbox/matplotlib"


def _seed():
    import os

    target = os.environ.get("MPLCONFIGDIR")
    if not target:
        return
    try:
        os.makedirs(target, exist_ok=True)
        for name in os.listdir(BAKED):
            dst = os.path.join(target, name)
            if not os.path.exists(dst):
                with open(os.path.join(BAKED, name), "rb") as src, open(dst, "wb") as out:
                    out.write(src.read())
    except OSError:
        # matplotlib then builds its own list, as it would without this module.
        pass


class _SeedOnImport:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "matplotlib":
            try:
                sys.meta_path.remove(_SeedOnImport)
            except ValueError:
                pass
            _seed()
        return None


sys.meta_path.insert(0, _SeedOnImport)
