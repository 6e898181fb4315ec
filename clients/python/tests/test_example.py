"""The README's example script runs as written against a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import Server

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


def test_the_quickstart_example_runs(server: Server) -> None:
    env = dict(os.environ, KERNELBOX_URL=server.url, KERNELBOX_TOKEN=server.token())
    out = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "output: area = 12.57" in lines
    assert [line for line in lines if line.startswith("  live> tick")] == [
        "  live> tick 0", "  live> tick 1", "  live> tick 2",
    ]  # fmt: skip
    assert "a failing cell is a result: error ZeroDivisionError: division by zero" in lines
    assert any(line.startswith("timeout: timeout -> StateLost(reason='timeout'") for line in lines)
    refused = [line for line in lines if line.startswith("refused: ")]
    assert refused[0].startswith("refused: BadRequest 400 invalid_timeout: timeout -1")
    assert "closed kernels: 1" in lines and "execute_code: success 42" in lines
