"""`language` on a run against a real server (docs/contract.md, "Languages"): a session's Bash
kernel keeps its own state beside the Python one, both are listed with their language; a
JavaScript and a TypeScript kernel keep state and show values; a name that is no language is
refused."""

from __future__ import annotations

import pytest

from kernelbox_client import BadRequest, Client


def test_a_bash_run_keeps_its_own_state_beside_python(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    s.run("x = 41")
    first = s.run("cd /tmp && n=7 && greet() { echo hi $1; }", language="bash")
    second = s.run("greet $n; pwd; ls /nonexistent", language="bash")
    assert first.ok and first.kernel.execution_count == 1
    assert second.status == "error" and second.exit_code == 2, second.raw
    assert second.output.startswith("hi 7\n/tmp\n") and "No such file" in second.output
    assert second.kernel.id == first.kernel.id and second.kernel.reused
    py = s.run("print(x + 1)")
    assert py.output == "42\n" and py.kernel.id != first.kernel.id
    mine = {k.language: k for k in client.kernels() if k.session == session_name}
    assert set(mine) == {"python", "bash"}
    assert (mine["bash"].id, mine["bash"].context) == (first.kernel.id, "bash")
    assert mine["python"].context == "python"
    other = s.run("echo ${n:-unset}", language="bash", context="second")
    assert other.output == "unset\n" and other.kernel.id != first.kernel.id
    assert s.close() == 3


def test_a_javascript_run_keeps_its_state_and_shows_its_value(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    first = s.run("const base = 40; function add(a, b) { return a + b }", language="javascript")
    second = s.run("console.log('hi'); add(base, await Promise.resolve(2))", language="javascript")
    assert first.ok and second.ok, second.raw
    assert second.stdout == "hi\n" and second.kernel.id == first.kernel.id
    assert second.main_result is not None and second.main_result.text == "42"
    failed = s.run("null.x", language="javascript")
    assert failed.status == "error" and failed.exception is not None
    assert failed.exception.name == "TypeError"
    ts = s.run("const n: number = 41; n + 1", language="typescript")
    assert ts.main_result is not None and ts.main_result.text == "42", ts.raw
    mine = {k.language for k in client.kernels() if k.session == session_name}
    assert mine == {"javascript", "typescript"}


def test_a_name_that_is_no_language_is_refused(client: Client, session_name: str) -> None:
    with pytest.raises(BadRequest):
        client.session(session_name).run("1", language="cobol")  # type: ignore[arg-type]
    assert not [k for k in client.kernels() if k.session == session_name]


def test_a_sessions_contexts_share_files_are_listed_and_one_ends(
    client: Client, session_name: str
) -> None:
    s = client.session(session_name)
    assert s.run("echo shared > f.txt", language="bash").ok
    assert s.run("print(open('f.txt').read(), end='')").output == "shared\n"
    assert sorted((k.context, k.language) for k in s.contexts()) == [
        ("bash", "bash"),
        ("python", "python"),
    ]
    assert s.end_context("bash") == 1
    assert s.end_context("bash") == 0
    assert [k.context for k in s.contexts()] == ["python"]
    assert s.run("print(open('f.txt').read(), end='')").output == "shared\n"
    assert s.close() == 1
