"""Packaging (pyproject.toml): the client builds in pip's isolated build environment with a
backend that writes nothing into the source tree, so `pip install ./clients/python` leaves a
checkout as it found it; the wheel carries the SPDX licence expression, the project's URLs
and the `py.typed` marker. Builds a wheel from this checkout (the build backend comes from
the package index, as for any user)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Set

#: The client's source tree (clients/python).
ROOT = Path(__file__).resolve().parents[1]

#: What running the tests themselves leaves beside the sources.
IGNORED = {"__pycache__", ".pytest_cache", ".mypy_cache"}


def tree() -> Set[str]:
    return {
        str(p.relative_to(ROOT))
        for p in ROOT.rglob("*")
        if not IGNORED.intersection(p.relative_to(ROOT).parts)
    }


def test_a_wheel_built_from_the_checkout_leaves_it_clean_and_says_licence_and_urls(
    tmp_path: Path,
) -> None:
    before = tree()
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    assert tree() == before, f"the build wrote into the source tree: {sorted(tree() - before)}"
    (wheel,) = tmp_path.glob("kernelbox_client-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = z.read(metadata_name).decode()
    assert "kernelbox_client/py.typed" in names, names
    assert "kernelbox_client/adapters/smolagents.py" in names, names
    headers = [line for line in metadata.splitlines() if ": " in line]
    assert "License-Expression: Apache-2.0" in headers, metadata
    urls = [h for h in headers if h.startswith("Project-URL: ")]
    assert any(u.startswith("Project-URL: Source, https://") for u in urls), urls
    assert any(u.startswith("Project-URL: Documentation, https://") for u in urls), urls
