"""Fixtures for the console's browser tests: a real `kernelbox serve --console` with an admin
token and two tenants (tests/pytest_support/kernelbox_serve.py), kernels of both in several
states (idle, and one busy running a cell), and Debian's headless chromium driven by Selenium
through chromium-driver. Nothing is skipped: a missing binary, engine, browser or driver fails
the run. Screenshots are kept under target/console-screenshots (CI artefacts)."""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List

import httpx
import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytest_support"))
import kernelbox_serve  # noqa: E402
from kernelbox_serve import Server, stop_and_check  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SHOTS = REPO / "target" / "console-screenshots"
ADMIN = f"admin-{uuid.uuid4().hex}"
CHROMIUM = os.environ.get("KERNELBOX_CHROMIUM", "/usr/bin/chromium")
DRIVER = os.environ.get("KERNELBOX_CHROMEDRIVER", "/usr/bin/chromedriver")

#: The sessions made before the tests: tenant -> idle sessions; `busy` runs a long cell.
IDLE = {"acme": ["acme-one", "acme-two"], "globex": ["globex-one", "globex-two"]}
BUSY = ("acme", "acme-busy")
#: A session whose cell ran past its timeout: its kernel lost (`timeout`), gone from the list.
LOST = ("globex", "globex-lost")
#: A session whose cell asked for a destination its policy refuses.
REFUSED = ("acme", "acme-one")
REFUSED_HOST = "refused.example.com"
REFUSE_CODE = f"""import urllib.request
try:
    urllib.request.urlopen("http://{REFUSED_HOST}/", timeout=20)
except Exception as e:
    print(type(e).__name__)
"""


def run(server: Server, tenant: str, session: str, code: str, timeout: float = 120) -> Dict:
    r = httpx.post(
        f"{server.url}/v1/sessions/{session}/execute",
        headers={"Authorization": f"Bearer {server.token(tenant)}"},
        json={"code": code, "timeout": timeout},
        timeout=timeout + 60,
    )
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    # Both audited (acme with its code, globex hashes only), both with an egress policy that
    # allows one host, so that a refused destination is a refusal the console lists.
    network = {"allow": ["pypi.org"]}
    tenants = {
        "acme": {"max_kernels": 4, "audit": {"code": True}, "network": network},
        "globex": {"max_kernels": 3, "audit": True, "network": network},
    }
    case = f"console-{uuid.uuid4().hex[:8]}"
    s = kernelbox_serve.start_server(
        tmp_path_factory.mktemp("server"), case, tenants,
        "--pool", "0", "--max-kernels", "8", "--console", "--admin-token", ADMIN,
    )  # fmt: skip
    busy: List[threading.Thread] = []
    try:
        for tenant, sessions in IDLE.items():
            for session in sessions:
                assert run(s, tenant, session, "x = 1")["status"] == "success"
        # A refused destination (acme), and a cell past its timeout: its kernel lost (globex).
        tenant, session = REFUSED
        run(s, tenant, session, REFUSE_CODE)
        tenant, session = LOST
        assert run(s, tenant, session, "import time\ntime.sleep(60)", timeout=2)["status"] == "timeout"
        tenant, session = BUSY
        t = threading.Thread(
            target=run, args=(s, tenant, session, "import time\nfor _ in range(600): time.sleep(0.5)", 600),
            daemon=True,
        )  # fmt: skip
        t.start()
        busy.append(t)
        deadline = time.monotonic() + 120
        while not any(k["session"] == session and k["state"] == "busy" for k in httpx.get(
                f"{s.url}/v1/kernels", headers={"Authorization": f"Bearer {s.token(tenant)}"},
                timeout=30).json()["kernels"]):  # fmt: skip
            assert time.monotonic() < deadline, "the busy session's kernel never ran its cell"
            time.sleep(0.2)
        yield s
    finally:
        tenant, session = BUSY
        httpx.post(f"{s.url}/v1/sessions/{session}/interrupt",
                   headers={"Authorization": f"Bearer {s.token(tenant)}"}, timeout=60)  # fmt: skip
        for t in busy:
            t.join(timeout=60)
        stop_and_check(s)


@pytest.fixture(scope="session")
def admin_token() -> str:
    return ADMIN


def browser() -> webdriver.Chrome:
    for path in (CHROMIUM, DRIVER):
        if not shutil.which(path):
            pytest.fail(f"{path} is missing: apt-get install chromium chromium-driver", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1200,800", "--disable-extensions"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))


@pytest.fixture()
def driver() -> Iterator[webdriver.Chrome]:
    d = browser()
    try:
        yield d
    finally:
        d.quit()


def shot(driver: webdriver.Chrome, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    driver.save_screenshot(str(path))
    return path
