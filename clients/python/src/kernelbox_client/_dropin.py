"""`execute_code`: a drop-in for agent code written against the execute_code tool contract
kernelbox implements (`docs/contract.md`): the result as a JSON string, one session per task."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from typing import Optional

from ._errors import KernelboxError
from ._sync import Client

_lock = threading.Lock()
_client: Optional[Client] = None


def _default_client() -> Client:
    global _client
    with _lock:
        if _client is None:
            _client = Client()
        return _client


def session_for_task(task_id: Optional[str]) -> str:
    """The session `execute_code` uses for `task_id`: `KERNELBOX_SESSION` (else `default`)
    without one, else `task-` and a hash of it (any task id gives a valid session name)."""
    if task_id is None:
        return os.environ.get("KERNELBOX_SESSION") or "default"
    return "task-" + hashlib.sha256(task_id.encode()).hexdigest()[:32]


def execute_code(
    code: str,
    task_id: Optional[str] = None,
    reset: bool = False,
    timeout: Optional[float] = None,
    *,
    client: Optional[Client] = None,
) -> str:
    """Runs `code` in the task's kernel (state persists across calls with the same `task_id`)
    and returns the result JSON as the server sent it. A call the server refuses, or that
    cannot reach it, returns a result too, never raises: `status` `error`, `exit_code` -1,
    `error` saying why, and `error_code` (the server's code, `timeout`, `connection_failed`).
    The client comes from `KERNELBOX_URL` / `KERNELBOX_TOKEN` unless one is given."""
    started = time.monotonic()
    client = client or _default_client()
    try:
        result = client.session(session_for_task(task_id)).run(
            code, timeout=timeout, reset=reset, task_id=task_id
        )
        return json.dumps(result.raw)
    except KernelboxError as e:
        refused = {
            "status": "error",
            "output": "",
            "error": f"kernelbox: {e}",
            "error_code": e.code,
            "exit_code": -1,
            "tool_calls_made": 0,
            "duration_seconds": time.monotonic() - started,
        }
        if e.retry_after is not None:
            refused["retry_after"] = e.retry_after
        return json.dumps(refused)
