"""stdout and stderr apart, and the typed exception (docs/contract.md, "stdout and stderr"):
`Execution.stdout`, `.stderr`, `.exception`, and the `on_stdout` / `on_stderr` callbacks."""

from __future__ import annotations

from typing import List

from kernelbox_client import Client

CELL = """
import os, subprocess, sys
print('o1', flush=True)
sys.stderr.write('e1\\n'); sys.stderr.flush()
os.write(2, b'e2\\n')
subprocess.run('echo o2; echo e3 >&2', shell=True)
1 / 0
"""


def test_stdout_stderr_and_the_exception_come_apart(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    everything: List[str] = []
    out: List[str] = []
    err: List[str] = []
    r = s.run(CELL, on_output=everything.append, on_stdout=out.append, on_stderr=err.append)
    assert r.stdout == "".join(out) == "o1\no2\n"
    assert r.stderr == "".join(err) == "e1\ne2\ne3\n"
    assert "".join(everything) == r.output
    assert r.exception is not None
    assert (r.exception.name, r.exception.value) == ("ZeroDivisionError", "division by zero")
    assert r.exception.traceback.startswith("Traceback") and r.output.endswith(r.exception.traceback)
    assert "Traceback" not in r.stderr and r.error == r.exception.traceback
    # Not streamed: the same fields.
    plain = s.run(CELL)
    assert (plain.stdout, plain.stderr) == (r.stdout, r.stderr)
    assert plain.exception is not None and plain.exception.name == "ZeroDivisionError"
    ok = s.run("import sys; sys.stderr.write('only')")
    assert (ok.stdout, ok.stderr, ok.exception, ok.output) == ("", "only", None, "only")
    s.close()
