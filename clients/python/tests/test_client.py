"""The blocking client against a real server: runs, state, streaming, interrupt, close,
children, kernels, timeouts."""

from __future__ import annotations

import threading

import pytest

from kernelbox_client import BadRequest, Client, Execution, KernelInfo, KernelSummary, StateLost


def test_state_persists_across_runs_of_a_session(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    first = s.run("x = 41")
    second = s.run("print(x + 1)")
    assert isinstance(second, Execution) and isinstance(second.kernel, KernelInfo)
    assert (first.status, first.output, first.exit_code, first.error) == ("success", "", 0, None)
    assert first.kernel.reused is False and first.kernel.execution_count == 1
    assert second.output == "42\n" and second.ok
    assert second.kernel.reused is True and second.kernel.execution_count == 2
    assert second.kernel.id == first.kernel.id and len(second.kernel.id) == 12
    assert second.raw["output"] == "42\n" and second.duration_seconds > 0
    s.close()


def test_sessions_do_not_share_state(client: Client, session_name: str) -> None:
    a, b = client.session(session_name + "-a"), client.session(session_name + "-b")
    a.run("secret = 1")
    r = b.run("print(secret)")
    assert r.status == "error" and "NameError" in (r.error or "")
    assert r.kernel.id != a.run("pass").kernel.id
    a.close(), b.close()


def test_a_cell_that_raises_is_a_result_not_an_exception(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    r = s.run("print('before')\n1 / 0")
    assert (r.status, r.exit_code) == ("error", 1)
    assert r.output.startswith("before\n") and "ZeroDivisionError" in (r.error or "")
    assert s.run("print('kernel kept')").output == "kernel kept\n"
    s.close()


def test_streamed_output_arrives_while_the_cell_runs(client: Client, session_name: str) -> None:
    """`on_output` gets the first line while the cell is still running: interrupting it from
    the callback stops a cell that would otherwise sleep a minute, and keeps its kernel."""
    s = client.session(session_name)
    seen = []
    interrupted = []

    def on_output(text: str) -> None:
        seen.append(text)
        if "started" in "".join(seen) and not interrupted:
            interrupted.append(s.interrupt())

    r = s.run(
        "import time\nprint('started', flush=True)\ntime.sleep(60)\nprint('never')",
        on_output=on_output,
    )
    assert interrupted == [1], "the cell had already ended when its first output arrived"
    assert (r.status, r.exit_code) == ("interrupted", -1)
    assert r.error == "Interrupted (KeyboardInterrupt); the session kernel and its state were kept."
    # The cell got KeyboardInterrupt: its traceback follows what it wrote, streamed too.
    assert r.output.startswith("started\n") and "KeyboardInterrupt" in r.output
    assert "".join(seen) == r.output and "never" not in r.output
    assert s.run("print('kept')").kernel.reused, "the interrupt did not keep the kernel"
    s.close()


def test_streamed_run_returns_the_same_result_as_a_plain_one(
    client: Client, session_name: str
) -> None:
    s = client.session(session_name)
    chunks = []
    r = s.run("for i in range(3):\n    print(i, flush=True)", on_output=chunks.append)
    assert "".join(chunks) == "0\n1\n2\n" == r.output and r.ok and r.stream_bytes_dropped == 0
    plain = s.run("1 / 0")
    streamed = s.run("1 / 0", on_output=lambda _: None)
    assert (plain.status, plain.exit_code) == (streamed.status, streamed.exit_code) == ("error", 1)
    assert plain.error.replace("<cell-2>", "<cell-3>") == streamed.error
    s.close()


def test_interrupt_with_nothing_running_returns_zero(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    assert s.interrupt() == 0
    s.run("pass")
    assert s.interrupt() == 0
    s.close()


def test_close_removes_the_kernel_and_closing_twice_is_fine(
    server, client: Client, session_name: str
) -> None:
    s = client.session(session_name)
    first = s.run("x = 1")
    owner = f"io.kernelbox.session={session_name}"
    assert len(server.containers(owner)) == 1
    assert s.close() == 1
    assert server.containers(owner) == [], "the container outlived close()"
    assert s.close() == 0
    again = s.run("print('x' in globals())")
    assert again.output == "False\n" and again.kernel.reused is False
    assert again.kernel.id != first.kernel.id and again.kernel.state_lost is None
    assert s.close() == 1


def test_a_child_has_its_own_kernel_and_close_releases_only_it(
    server, client: Client, session_name: str
) -> None:
    parent = client.session(session_name)
    child = client.session(session_name, child="helper-1")
    parent.run("who = 'parent'")
    child.run("who = 'child'")
    assert parent.run("print(who)").output == "parent\n"
    assert child.run("print(who)").output == "child\n"
    assert len(server.containers("io.kernelbox.child=helper-1")) >= 1
    assert child.close() == 1
    assert parent.run("print(who)").output == "parent\n"
    assert child.run("print('who' in globals())").output == "False\n"
    assert parent.close() == 2, "closing a session disposes of its children's kernels too"


def test_kernels_lists_this_tenants_live_kernels(server, session_name: str) -> None:
    with (
        Client(server.url, server.token("main")) as main,
        Client(server.url, server.token("other")) as other,
    ):
        s = main.session(session_name)
        r = s.run("pass")
        main.session(session_name, child="sub").run("pass")
        mine = {k.child: k for k in main.kernels() if k.session == session_name}
        assert set(mine) == {None, "sub"} and isinstance(mine[None], KernelSummary)
        k = mine[None]
        assert (k.id, k.tenant, k.owner, k.generation, k.execution_count) == (
            r.kernel.id, "main", session_name, r.kernel.generation, 1,
        )  # fmt: skip
        assert k.state == "idle" and k.attached == 0 and k.idle_seconds >= 0
        assert mine["sub"].owner != session_name and mine["sub"].tenant == "main"
        assert all(k.tenant == "other" for k in other.kernels())
        assert not [k for k in other.kernels() if k.session == session_name]
        assert s.close() == 2


def test_another_tenant_cannot_reach_or_close_a_session(server, session_name: str) -> None:
    with (
        Client(server.url, server.token("main")) as main,
        Client(server.url, server.token("other")) as other,
    ):
        main.session(session_name).run("x = 'main'")
        theirs = other.session(session_name)
        assert theirs.close() == 0
        assert theirs.run("print('x' in globals())").output == "False\n"
        assert main.session(session_name).run("print(x)").output == "main\n"
        theirs.close(), main.session(session_name).close()


def test_a_cell_past_its_timeout_is_reported_and_the_loss_told_next_time(
    client: Client, session_name: str
) -> None:
    s = client.session(session_name)
    r = s.run("import time\ntime.sleep(30)", timeout=1)
    assert (r.status, r.exit_code) == ("timeout", -1)
    assert r.error == (
        "Cell timed out after 1s; the session kernel was killed and its state was lost. "
        "The next execute_code call starts a fresh kernel."
    )
    nxt = s.run("pass")
    assert isinstance(nxt.kernel.state_lost, StateLost)
    assert nxt.kernel.state_lost.reason == "timeout" and nxt.kernel.state_lost.at
    assert s.run("pass").kernel.state_lost is None
    s.close()


def test_reset_starts_a_fresh_kernel(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    s.run("x = 1")
    r = s.run("print('x' in globals())", reset=True)
    assert r.output == "False\n" and r.kernel.state_reset is True
    s.close()


def test_one_client_serves_concurrent_threads(client: Client, session_name: str) -> None:
    out = {}

    def work(i: int) -> None:
        s = client.session(f"{session_name}-{i}")
        out[i] = s.run(f"print({i} * 2)").output
        s.close()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert out == {i: f"{i * 2}\n" for i in range(4)}


def test_task_id_and_tools_reach_the_tenants_tool_endpoint(
    client: Client, session_name: str, tool_endpoint
) -> None:
    s = client.session(session_name)
    r = s.run(
        "import kernel_tools\nprint(kernel_tools.echo(word='hi'))", task_id="turn-9", tools=["echo"]
    )
    assert r.output == "{'tool': 'echo', 'args': {'word': 'hi'}}\n" and r.tool_calls_made == 1
    call = [c for c in tool_endpoint.calls if c["session"] == session_name][-1]
    assert (call["task_id"], call["tool"], call["tenant"]) == ("turn-9", "echo", "main")
    # `tools` narrows the cell's tools to a subset of the tenant's allow-list.
    r = s.run("import kernel_tools\nkernel_tools.other()", tools=["echo"])
    assert r.status == "error" and 'Unknown tool "other"' in (r.error or "")
    with pytest.raises(BadRequest) as e:
        s.run("pass", tools=["rm_rf"])
    assert e.value.code == "tool_not_allowed"
    s.close()
