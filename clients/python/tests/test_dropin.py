"""`kernelbox_client.execute_code`: the result JSON string, one session per task id, the
client from `KERNELBOX_URL` / `KERNELBOX_TOKEN`."""

from __future__ import annotations

import json
import uuid
from typing import Iterator

import pytest

import kernelbox_client
from conftest import Server
from kernelbox_client import Client, _dropin, execute_code, session_for_task

CONTRACT = {"status", "output", "exit_code", "tool_calls_made", "duration_seconds", "kernel"}


@pytest.fixture
def env_client(server: Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The default client, made from the environment as an agent process would."""
    monkeypatch.setenv("KERNELBOX_URL", server.url)
    monkeypatch.setenv("KERNELBOX_TOKEN", server.token())
    monkeypatch.setattr(_dropin, "_client", None)
    yield
    if _dropin._client is not None:
        _dropin._client.close()


def test_execute_code_returns_the_result_json_with_state_per_task(
    server: Server, env_client: None
) -> None:
    t1, t2 = f"task {uuid.uuid4()}", f"task {uuid.uuid4()}"
    first = json.loads(execute_code("x = 41", task_id=t1))
    assert CONTRACT <= set(first) and first["status"] == "success"
    second = execute_code("print(x + 1)", task_id=t1)
    assert isinstance(second, str)
    assert json.loads(second)["output"] == "42\n"
    other = json.loads(execute_code("print(x)", task_id=t2))
    assert other["status"] == "error" and "NameError" in other["error"]
    fresh = json.loads(execute_code("print('x' in globals())", task_id=t1, reset=True))
    assert fresh["output"] == "False\n", fresh
    # One session per task id, named from it, and that session is the server's (the kernel
    # the reset discarded may still be on its way out).
    assert fresh["kernel"]["id"] in server.containers(
        f"io.kernelbox.session={session_for_task(t1)}"
    )
    timed = json.loads(execute_code("import time; time.sleep(10)", task_id=t1, timeout=1))
    assert timed["status"] == "timeout" and timed["exit_code"] == -1
    assert (
        json.loads(execute_code("pass", task_id=t1))["kernel"]["state_lost"]["reason"] == "timeout"
    )
    assert kernelbox_client.execute_code is execute_code
    with Client(server.url, server.token()) as c:
        assert c.session(session_for_task(t1)).close() == 1
        assert c.session(session_for_task(t2)).close() == 1


def test_execute_code_without_a_task_uses_one_default_session(
    server: Server, env_client: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"dropin-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("KERNELBOX_SESSION", name)
    execute_code("y = 'kept'")
    assert json.loads(execute_code("print(y)"))["output"] == "kept\n"
    with Client(server.url, server.token()) as c:
        assert c.session(name).close() == 1


def test_execute_code_returns_a_refusal_as_an_error_result(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNELBOX_URL", server.url)
    monkeypatch.setenv("KERNELBOX_TOKEN", "wrong")
    monkeypatch.setattr(_dropin, "_client", None)
    r = json.loads(execute_code("print(1)", task_id="t"))
    assert (r["status"], r["exit_code"], r["error_code"]) == ("error", -1, "unauthorized")
    assert r["error"] == (
        "kernelbox: HTTP 401 unauthorized: a valid `Authorization: Bearer TOKEN` header is required"
    )
    r = json.loads(execute_code("1", timeout=-1))
    assert r["error_code"] == "unauthorized" and CONTRACT <= set(r) | {"kernel"}, r
    _dropin._client.close()


def test_session_names_from_task_ids_are_stable_and_valid() -> None:
    assert session_for_task("a") == session_for_task("a") != session_for_task("b")
    name = session_for_task("x" * 256 + " :: ../ ünïcode")
    assert name.startswith("task-") and len(name) == 37 and name.replace("-", "").isalnum()
