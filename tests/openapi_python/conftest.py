"""Fixtures for the OpenAPI test: a real `kernelbox serve` (tests/pytest_support/kernelbox_serve.py,
shared with the other Python suites), its `/openapi.json`, and a client generated from that
document by openapi-python-client into a temporary directory, imported as `kernelbox_openapi`.
Nothing is skipped: a missing binary, engine or generator fails the run."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any, Dict, Iterator

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytest_support"))
import kernelbox_serve  # noqa: E402
from kernelbox_serve import Server, stop_and_check  # noqa: E402

#: The generated package's name (not `kernelbox_client`, the hand-written client's).
PACKAGE = "kernelbox_openapi"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server: tenant `main` with workspaces (its routes answer only then), audited (so
    that `GET /v1/audit` has a trail file to read), and the usage ledger every server keeps."""
    tenants = {"main": {"max_kernels": 4, "workspaces": {"quota": "64m", "max": 4}, "audit": True}}
    case = f"openapi-{uuid.uuid4().hex[:8]}"
    s = kernelbox_serve.start_server(tmp_path_factory.mktemp("server"), case, tenants, "--pool", "0")
    yield s
    # Workspaces outlive their kernels by design: a test that failed half-way leaves some,
    # deleted here (each session cleared first) so that the check below finds only leaks.
    auth = {"Authorization": f"Bearer {s.token('main')}"}
    with httpx.Client(base_url=s.url, headers=auth, timeout=120) as http:
        for space in http.get("/v1/workspaces").json().get("workspaces", []):
            session = space["name"].split("::")[0]
            http.delete(f"/v1/sessions/{session}")
            http.delete(f"/v1/workspaces/{space['name']}")
    stop_and_check(s)


@pytest.fixture(scope="session")
def spec(server: Server) -> Dict[str, Any]:
    r = httpx.get(server.url + "/openapi.json", timeout=30)
    r.raise_for_status()
    document: Dict[str, Any] = r.json()
    return document


@pytest.fixture(scope="session")
def generated(spec: Dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> ModuleType:
    """The client openapi-python-client generates from the served document, imported."""
    out = tmp_path_factory.mktemp("generated")
    (out / "openapi.json").write_text(json.dumps(spec))
    (out / "config.json").write_text(json.dumps({
        "package_name_override": PACKAGE,
        "project_name_override": "kernelbox-openapi",
        "post_hooks": [],
    }))  # fmt: skip
    run = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", "openapi.json",
         "--config", "config.json", "--meta", "none", "--output-path", PACKAGE],
        cwd=out, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, f"openapi-python-client failed:\n{run.stdout}\n{run.stderr}"
    sys.path.insert(0, str(out))
    return importlib.import_module(PACKAGE)
