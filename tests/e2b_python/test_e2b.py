"""E2B's own SDKs, unchanged, against `kernelbox serve --e2b-listen` (docs/e2b.md): the code
interpreter's `run_code` with its callbacks, a PNG result, errors, `!cmd` lines, files written
and read, the control plane (create, list by metadata, info, timeout, connect, kill), a bad key,
two tenants kept apart. What a sandbox holds is asked of the Docker engine by the run's labels.
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Callable, List

import httpx
import pytest
from e2b import AuthenticationException, CommandExitException, NotFoundException, SandboxQuery
from e2b.exceptions import SandboxException
from e2b_code_interpreter import Sandbox

from conftest import Server

SESSION_LABEL = "io.kernelbox.session"


def wait_for(what: str, check: Callable[[], bool], deadline: float = 60.0) -> None:
    """Polls `check` (bounded) until it holds; fails naming `what` otherwise."""
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not so within {deadline}s")
        time.sleep(0.2)


def kernels_of(server: Server, sandbox_id: str) -> List[str]:
    return server.containers(f"{SESSION_LABEL}={sandbox_id}")


def test_run_code_streams_stdout_results_and_count_through_the_callbacks(server: Server) -> None:
    sbx = Sandbox.create()
    try:
        stdout: List[str] = []
        results = []
        execution = sbx.run_code(
            "import sys\nprint('hello from kernelbox')\nx = 41\nx + 1",
            on_stdout=lambda m: stdout.append(m.line),
            on_result=results.append,
        )
        assert execution.error is None
        assert execution.logs.stdout == ["hello from kernelbox\n"]
        assert stdout == ["hello from kernelbox\n"]
        assert execution.text == "42"
        assert [r.text for r in results] == ["42"] and results[0].is_main_result
        assert execution.execution_count == 1
        # State is kept between calls: the sandbox is one kernelbox session.
        assert sbx.run_code("x").text == "41"
        # The sandbox's kernel is a container of this server, labelled with the sandbox's id.
        assert len(kernels_of(server, sbx.sandbox_id)) == 1
    finally:
        sbx.kill()


def test_a_png_result_arrives_base64_under_its_e2b_name(server: Server) -> None:
    sbx = Sandbox.create()
    try:
        code = (
            "import struct, zlib\n"
            "def chunk(t, d):\n"
            "    return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))\n"
            "png = b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 1, 1, 8, 0, 0, 0, 0))"
            " + chunk(b'IDAT', zlib.compress(b'\\x00\\x00')) + chunk(b'IEND', b'')\n"
            "class Picture:\n"
            "    def _repr_png_(self):\n"
            "        return png\n"
            "Picture()"
        )
        execution = sbx.run_code(code)
        assert execution.error is None, execution.error
        pngs = [r.png for r in execution.results if r.png]
        assert len(pngs) == 1
        assert base64.b64decode(pngs[0]).startswith(b"\x89PNG\r\n\x1a\n")
    finally:
        sbx.kill()


def test_an_exception_is_an_error_with_name_value_and_traceback(server: Server) -> None:
    sbx = Sandbox.create()
    try:
        errors = []
        execution = sbx.run_code("print('before')\n1 / 0", on_error=errors.append)
        assert execution.error is not None
        assert execution.error.name == "ZeroDivisionError"
        assert execution.error.value == "division by zero"
        assert "Traceback" in execution.error.traceback
        assert errors and errors[0].name == "ZeroDivisionError"
        # The traceback is the error's, not the output's (as E2B's kernel sends it).
        assert execution.logs.stdout == ["before\n"]
        # The kernel and its state survive an exception.
        assert sbx.run_code("'still here'").text == "'still here'"
    finally:
        sbx.kill()


def test_bang_lines_run_shell_commands(server: Server) -> None:
    sbx = Sandbox.create()
    try:
        execution = sbx.run_code("!echo shell-says-hi\nprint('python too')")
        assert execution.error is None, execution.error
        out = "".join(execution.logs.stdout)
        assert "shell-says-hi" in out and "python too" in out
    finally:
        sbx.kill()


def test_files_written_in_home_are_the_kernels_working_directory(server: Server) -> None:
    sbx = Sandbox.create()
    try:
        info = sbx.files.write("/home/user/notes.txt", "written by the SDK")
        assert info.path == "/home/user/notes.txt" and info.name == "notes.txt"
        assert sbx.files.read("notes.txt") == "written by the SDK"
        assert sbx.run_code("open('notes.txt').read()").text == "'written by the SDK'"
        sbx.run_code("open('made.bin', 'wb').write(bytes(range(256)))")
        assert bytes(sbx.files.read("/home/user/made.bin", format="bytes")) == bytes(range(256))
        with pytest.raises(Exception) as outside:
            sbx.files.write("/etc/passwd", "no")
        assert "outside /home/user" in str(outside.value)
    finally:
        sbx.kill()


def test_list_by_metadata_info_connect_and_kill(server: Server) -> None:
    tag = uuid.uuid4().hex[:8]
    a = Sandbox.create(metadata={"case": tag, "role": "a"}, envs={"GREETING": "bonjour"})
    b = Sandbox.create(metadata={"case": tag, "role": "b"})
    try:
        def listed(metadata) -> List[str]:
            paginator = Sandbox.list(query=SandboxQuery(metadata=metadata), limit=1)
            ids: List[str] = []
            while paginator.has_next:
                ids += [s.sandbox_id for s in paginator.next_items()]
            return ids

        assert sorted(listed({"case": tag})) == sorted([a.sandbox_id, b.sandbox_id])
        assert listed({"case": tag, "role": "a"}) == [a.sandbox_id]
        info = Sandbox.get_info(a.sandbox_id)
        assert info.metadata == {"case": tag, "role": "a"}
        assert info.template_id == "code-interpreter-v1"
        # The sandbox's environment is its session's.
        assert a.run_code("import os; os.environ['GREETING']").text == "'bonjour'"
        a.run_code("kept = 'state'")
        again = Sandbox.connect(a.sandbox_id)
        assert again.run_code("kept").text == "'state'"
        assert again.is_running()
        b.kill()
        wait_for("b's kernel removed", lambda: kernels_of(server, b.sandbox_id) == [])
        assert listed({"case": tag}) == [a.sandbox_id]
        with pytest.raises(NotFoundException):
            Sandbox.get_info(b.sandbox_id)
        assert not b.is_running()
    finally:
        for s in (a, b):
            try:
                s.kill()
            except Exception:
                pass


def test_a_sandbox_ends_at_its_timeout(server: Server) -> None:
    sbx = Sandbox.create(timeout=3)
    sbx.run_code("1")
    assert len(kernels_of(server, sbx.sandbox_id)) == 1
    wait_for("the sandbox gone after its timeout", lambda: not sbx.is_running())
    wait_for("its kernel removed", lambda: kernels_of(server, sbx.sandbox_id) == [])
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_a_huge_timeout_or_refresh_is_capped_not_an_error(server: Server, url: str) -> None:
    sbx = Sandbox.create()
    try:
        headers = {"X-API-Key": server.token("main")}
        huge = 2**64 - 1
        r = httpx.post(f"{url}/sandboxes/{sbx.sandbox_id}/refreshes", json={"duration": huge}, headers=headers)
        assert r.status_code == 204, r.text
        r = httpx.post(f"{url}/sandboxes/{sbx.sandbox_id}/timeout", json={"timeout": huge}, headers=headers)
        assert r.status_code == 204, r.text
        assert sbx.is_running()
    finally:
        sbx.kill()


def test_a_bad_key_is_401_in_e2bs_shape(server: Server, url: str) -> None:
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key="not-a-token")
    r = httpx.post(f"{url}/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-Key": "nope"})
    assert r.status_code == 401
    body = r.json()
    assert body["code"] == 401 and "message" in body


def test_two_tenants_never_reach_each_others_sandboxes(server: Server, url: str) -> None:
    mine = Sandbox.create(metadata={"owner": "main"})
    other_key = server.token("other")
    try:
        mine.run_code("secret = 'main only'")
        with pytest.raises(NotFoundException):
            Sandbox.get_info(mine.sandbox_id, api_key=other_key)
        # E2B's kill answers False for a sandbox it does not find.
        assert Sandbox.kill(mine.sandbox_id, api_key=other_key) is False
        with pytest.raises(NotFoundException):
            Sandbox.connect(mine.sandbox_id, api_key=other_key)
        paginator = Sandbox.list(query=SandboxQuery(metadata={"owner": "main"}), api_key=other_key)
        seen = paginator.next_items() if paginator.has_next else []
        assert mine.sandbox_id not in [s.sandbox_id for s in seen]
        # The code interpreter with the other tenant's key and no access token: 401.
        headers = {"E2b-Sandbox-Id": mine.sandbox_id, "E2b-Sandbox-Port": "49999", "X-API-Key": other_key}
        r = httpx.post(f"{url}/execute", json={"code": "secret"}, headers=headers)
        assert r.status_code == 401 and r.json()["code"] == 401
        # Files too.
        headers["E2b-Sandbox-Port"] = "49983"
        r = httpx.get(f"{url}/files", params={"path": "x"}, headers=headers)
        assert r.status_code == 401
        # The owner's sandbox is untouched.
        assert mine.run_code("secret").text == "'main only'"
    finally:
        mine.kill()


def test_what_is_not_there_answers_in_e2bs_shape(server: Server) -> None:
    sbx = Sandbox.create()
    try:
        with pytest.raises(SandboxException):
            sbx.pause()
        with pytest.raises(Exception) as language:
            sbx.run_code("1", language="r")
        assert "not available" in str(language.value)
    finally:
        sbx.kill()


def test_a_foreground_command_streams_stdout_and_stderr_and_its_exit_code(server: Server) -> None:
    sbx = Sandbox.create()
    try:
        out: List[str] = []
        result = sbx.commands.run(
            "echo to-stdout; echo to-stderr >&2; pwd; echo $GREETING",
            envs={"GREETING": "salut"},
            on_stdout=out.append,
        )
        assert result.exit_code == 0
        assert result.stdout == "to-stdout\n/work\nsalut\n"
        assert result.stderr == "to-stderr\n"
        assert "".join(out) == result.stdout
        with pytest.raises(CommandExitException) as failed:
            sbx.commands.run("echo bye; exit 3")
        assert failed.value.exit_code == 3 and failed.value.stdout == "bye\n"
        # A command and a cell share the sandbox's files.
        sbx.commands.run("echo from-shell > shared.txt")
        assert sbx.run_code("open('shared.txt').read()").text == "'from-shell\\n'"
    finally:
        sbx.kill()


def test_code_contexts_are_kernels_of_their_own_by_language(server: Server) -> None:
    sbx = Sandbox.create()
    try:
        sbx.run_code("x = 'default'")
        ctx = sbx.create_code_context()
        assert ctx.language == "python" and ctx.cwd == "/home/user"
        sbx.run_code("x = 'own'", context=ctx)
        assert sbx.run_code("x", context=ctx).text == "'own'"
        assert sbx.run_code("x").text == "'default'"
        bash = sbx.create_code_context(language="bash")
        assert sbx.run_code("V=7; echo $((V*6))", context=bash).logs.stdout == ["42\n"]
        assert sbx.run_code("echo $V", context=bash).logs.stdout == ["7\n"]
        assert sbx.run_code("echo hi", language="bash").logs.stdout == ["hi\n"]
        ids = {c.id for c in sbx.list_code_contexts()}
        assert {"python", "bash", ctx.id, bash.id} <= ids
        sbx.restart_code_context(ctx)
        assert sbx.run_code("x", context=ctx).error.name == "NameError"
        sbx.remove_code_context(ctx)
        assert ctx.id not in {c.id for c in sbx.list_code_contexts()}
        with pytest.raises(Exception):
            sbx.run_code("1", context=ctx)
        # A JavaScript context keeps its own state (docs/contract.md, "Languages").
        js = sbx.create_code_context(language="javascript")
        sbx.run_code("const a = 6 * 7", context=js)
        assert sbx.run_code("a", context=js).text == "42"
        # A language the server does not run is E2B's 400, its reason named.
        with pytest.raises(Exception) as refused:
            sbx.create_code_context(language="r")
        assert "not served" in str(refused.value) or "not available" in str(refused.value)
    finally:
        sbx.kill()


def test_the_filesystem_service_stats_lists_makes_moves_and_removes(server: Server) -> None:
    from e2b import FileType
    from e2b.exceptions import FileNotFoundException

    sbx = Sandbox.create()
    try:
        assert sbx.files.make_dir("tree/a/deep") is True
        assert sbx.files.make_dir("tree/a/deep") is False
        sbx.files.write("tree/f.txt", "four")
        assert sbx.files.exists("tree/f.txt")
        assert not sbx.files.exists("tree/none.txt")
        info = sbx.files.get_info("/home/user/tree/f.txt")
        assert (info.name, info.type, info.size, info.path) == ("f.txt", FileType.FILE, 4, "/home/user/tree/f.txt")
        assert info.mode == 0o644 and info.permissions == "-rw-r--r--"
        assert sbx.files.get_info("tree").type == FileType.DIR
        with pytest.raises(FileNotFoundException):
            sbx.files.get_info("tree/none.txt")
        # One level, then all, in path order, named as E2B names them.
        assert [e.path for e in sbx.files.list("tree")] == ["/home/user/tree/a", "/home/user/tree/f.txt"]
        assert [e.name for e in sbx.files.list("tree", depth=3)] == ["a", "deep", "f.txt"]
        moved = sbx.files.rename("tree/f.txt", "tree/a/g.txt")
        assert moved.path == "/home/user/tree/a/g.txt"
        assert sbx.files.read("tree/a/g.txt") == "four"
        assert not sbx.files.exists("tree/f.txt")
        with pytest.raises(FileNotFoundException):
            sbx.files.rename("tree/f.txt", "tree/h.txt")
        # A cell sees the same files.
        assert sbx.run_code("import os; sorted(os.listdir('tree/a'))").text == "['deep', 'g.txt']"
        sbx.files.remove("tree")
        sbx.files.remove("tree")  # as `rm -rf`: not there is no error
        assert not sbx.files.exists("tree")
        # Escapes are refused, never reached.
        for bad in ("/etc/passwd", "../x", "/home/user/../../etc"):
            with pytest.raises(SandboxException):
                sbx.files.get_info(bad)
    finally:
        sbx.kill()


def test_a_watcher_sees_files_made_written_and_removed(server: Server) -> None:
    from e2b import FilesystemEventType

    sbx = Sandbox.create()
    try:
        sbx.files.make_dir("watched")
        sbx.files.write("watched/old.txt", "1")
        handle = sbx.files.watch_dir("watched", include_entry=True)
        assert handle.get_new_events() == []
        sbx.files.write("watched/new.txt", "hello")
        sbx.files.write("watched/old.txt", "longer")
        sbx.files.make_dir("watched/sub")
        events = {(e.name, e.type) for e in handle.get_new_events()}
        assert ("new.txt", FilesystemEventType.CREATE) in events
        assert ("old.txt", FilesystemEventType.WRITE) in events
        assert ("sub", FilesystemEventType.CREATE) in events
        sbx.files.remove("watched/new.txt")
        assert [(e.name, e.type) for e in handle.get_new_events()] == [("new.txt", FilesystemEventType.REMOVE)]
        handle.stop()
        # A sandbox's watchers are bounded: the ninth is refused, and a stopped one frees its place.
        handles = [sbx.files.watch_dir("watched") for _ in range(8)]
        with pytest.raises(SandboxException) as refused:
            sbx.files.watch_dir("watched")
        assert "watchers" in str(refused.value)
        handles[0].stop()
        sbx.files.watch_dir("watched").stop()
    finally:
        sbx.kill()


def test_background_commands_take_stdin_list_connect_and_die_by_kill(server: Server) -> None:
    sbx = Sandbox.create()
    try:
        echo = sbx.commands.run("read line; echo got:$line", background=True, stdin=True)
        sbx.commands.send_stdin(echo.pid, "hello\n")
        assert echo.wait().stdout == "got:hello\n"
        cat = sbx.commands.run("cat", background=True, stdin=True)
        sbx.commands.send_stdin(cat.pid, "abc")
        sbx.commands.close_stdin(cat.pid)
        assert cat.wait().stdout == "abc"
        sleeper = sbx.commands.run("echo started; sleep 300", background=True)
        assert sleeper.pid in [p.pid for p in sbx.commands.list()]
        again = sbx.commands.connect(sleeper.pid)
        assert again.pid == sleeper.pid
        assert sbx.commands.kill(sleeper.pid) is True
        with pytest.raises(CommandExitException):
            again.wait()
        assert sleeper.pid not in [p.pid for p in sbx.commands.list()]
        assert sbx.commands.kill(99999) is False
        # Pids count per sandbox: another sandbox's starts do not show in this one's pids.
        other = Sandbox.create()
        try:
            assert other.commands.run("true", background=True).pid == 1
        finally:
            other.kill()
    finally:
        sbx.kill()
