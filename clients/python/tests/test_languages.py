"""`language` on a run against a real server (docs/contract.md, "Languages"): a session's Bash
kernel keeps its own state beside the Python one, both are listed with their language, and a
language the server does not serve is refused."""

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


def test_a_language_not_served_is_refused(client: Client, session_name: str) -> None:
    with pytest.raises(BadRequest) as refused:
        client.session(session_name).run("1", language="javascript")
    assert refused.value.code == "unsupported_language"
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
