"""`/openapi.json` is a valid OpenAPI 3.1 document, and a client generated from it by
openapi-python-client calls every JSON route of a real `kernelbox serve` and parses what it
answers: each call succeeds (a 2xx, or on a server that is no cluster node the admin routes'
404) and its body parses into the generated model of the documented schema. The streamed
execute and command are read with httpx and each line parsed by the event model the union's
discriminator names: the unions are what a generator can use.

openapi-python-client does not handle `application/x-tar` bodies: it leaves out the tar
upload of `PUT .../workspace` and the tar bodies of the file routes (its warnings, checked to be
only those); that upload is sent with httpx and its JSON answer parsed by the generated model.
Nor does it read an answer that is only NDJSON (a background process's output, its one
other warning): that stream is read with httpx, each line parsed by the `ProcessEvent` union.
"""

from __future__ import annotations

import importlib
import io
import json
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from types import ModuleType
from typing import Any, Callable, Dict, List

import httpx
from kernelbox_serve import Server
from openapi_spec_validator import validate


SESSION = f"gen-{uuid.uuid4().hex[:6]}"


def api(generated: ModuleType, operation: str) -> Any:
    return importlib.import_module(f"{generated.__name__}.api.default.{operation}")


def model(generated: ModuleType, name: str) -> Any:
    return getattr(importlib.import_module(f"{generated.__name__}.models"), name)


def client(generated: ModuleType, server: Server) -> Any:
    return generated.AuthenticatedClient(
        base_url=server.url, token=server.token("main"), raise_on_unexpected_status=True,
        timeout=httpx.Timeout(120.0),
    )  # fmt: skip


def ok(response: Any, schema: str, status: int = 200) -> Any:
    """The parsed body of a call that succeeded, checked to be the documented schema's model."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    parsed = response.parsed
    assert type(parsed).__name__ == schema, (schema, type(parsed).__name__, response.content[:500])
    return parsed


def wait_for(what: str, check: Callable[[], bool], deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not check():
        assert time.monotonic() < end, f"{what}: not so within {deadline}s"
        time.sleep(0.1)


def test_the_document_is_valid_openapi_3_1(spec: Dict[str, Any]) -> None:
    assert spec["openapi"].startswith("3.1")
    validate(spec)


def test_the_generator_warns_only_of_tar_bodies_and_the_process_output_stream(
    spec: Dict[str, Any], tmp_path: Any
) -> None:
    (tmp_path / "openapi.json").write_text(json.dumps(spec))
    run = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", "openapi.json",
         "--meta", "none", "--output-path", "out"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    warnings = [b for b in (run.stdout + run.stderr).split("WARNING")[1:]]
    output = "GET /v1/sessions/{session}/processes/{id}/output"
    assert all("application/x-tar" in w or (output in w and "application/x-ndjson" in w)
               for w in warnings), warnings  # fmt: skip


def test_every_json_route_through_the_generated_client(
    generated: ModuleType, server: Server, spec: Dict[str, Any]
) -> None:
    c = client(generated, server)
    ExecuteRequest = model(generated, "ExecuteRequest")
    # A cell: the result parses, and `GET /v1/kernels` lists its kernel (its labels omitted
    # while the session has none).
    run = api(generated, "post_v1_sessions_session_execute").sync_detailed(
        SESSION, client=c, body=ExecuteRequest(code="x = 41\nprint(x + 1)")
    )
    result = ok(run, "CellResult")
    assert (result.status, result.output) == ("success", "42\n")
    kernels = ok(api(generated, "get_v1_kernels").sync_detailed(client=c), "KernelList")
    assert [k.session for k in kernels.kernels] == [SESSION]

    # Settings with labels, then the kernels filtered by one.
    SessionSettings = model(generated, "SessionSettings")
    labels = model(generated, "SessionSettingsLabels").from_dict({"team": "blue"})
    applied = ok(
        api(generated, "put_v1_sessions_session_settings").sync_detailed(
            SESSION, client=c, body=SessionSettings(labels=labels)
        ),
        "SettingsApplied",
    )
    assert applied.settings.labels.additional_properties == {"team": "blue"}
    got = ok(
        api(generated, "get_v1_sessions_session_settings").sync_detailed(SESSION, client=c),
        "SessionSettings",
    )
    assert got.labels.additional_properties == {"team": "blue"}
    labelled = ok(
        api(generated, "get_v1_kernels").sync_detailed(client=c, label="team:blue"), "KernelList"
    )
    assert [k.labels.additional_properties for k in labelled.kernels] == [{"team": "blue"}]

    # The network policy: nothing allowed (the tenant has no network).
    NetworkPolicy = model(generated, "NetworkPolicy")
    ok(
        api(generated, "put_v1_sessions_session_network").sync_detailed(
            SESSION, client=c, body=NetworkPolicy()
        ),
        "NetworkApplied",
    )

    # A command.
    CommandRequest = model(generated, "CommandRequest")
    done = ok(
        api(generated, "post_v1_sessions_session_commands").sync_detailed(
            SESSION, client=c, body=CommandRequest(command="echo hi")
        ),
        "CommandResult",
    )
    assert (done.exit_code, done.stdout) == (0, "hi\n")

    # Files: write, list, delete.
    File = importlib.import_module(f"{generated.__name__}.types").File
    written = ok(
        api(generated, "put_v1_sessions_session_files_path").sync_detailed(
            SESSION, "d/a.txt", client=c, body=File(payload=io.BytesIO(b"abc"))
        ),
        "Written",
        201,
    )
    assert (written.path, written.size) == ("/work/d/a.txt", 3)
    listing = ok(
        api(generated, "get_v1_sessions_session_files_path").sync_detailed(SESSION, "d", client=c),
        "Listing",
    )
    assert [(e.name, e.kind) for e in listing.entries] == [("a.txt", "file")]
    ok(api(generated, "get_v1_sessions_session_files").sync_detailed(SESSION, client=c), "Listing")
    deleted = ok(
        api(generated, "delete_v1_sessions_session_files_path").sync_detailed(
            SESSION, "d/a.txt", client=c
        ),
        "Deleted",
    )
    assert deleted.deleted == "/work/d/a.txt"

    # A background process (docs/processes.md): started with its stdin open, listed, fed,
    # its stdin closed, its output read (NDJSON, each line parsed by the `ProcessEvent` union's
    # model), then one signalled and one killed.
    ProcessRequest = model(generated, "ProcessRequest")
    started = ok(api(generated, "post_v1_sessions_session_processes").sync_detailed(
        SESSION, client=c, body=ProcessRequest(command="read a; echo got $a", stdin=True)),
        "ProcessInfo")  # fmt: skip
    assert started.running and started.stdin_open
    listed = ok(api(generated, "get_v1_sessions_session_processes").sync_detailed(SESSION, client=c),
                "ProcessList")  # fmt: skip
    assert [p.id for p in listed.processes] == [started.id]
    fed = ok(api(generated, "post_v1_sessions_session_processes_id_stdin").sync_detailed(
        SESSION, started.id, client=c, body=File(payload=io.BytesIO(b"x\n"))), "StdinWritten")  # fmt: skip
    assert fed.written == 2
    ok(api(generated, "delete_v1_sessions_session_processes_id_stdin").sync_detailed(
        SESSION, started.id, client=c), "ProcessInfo")  # fmt: skip
    lines = output_lines(server, SESSION, started.id)
    parsed = [parse_union(generated, spec, "ProcessEvent", line) for line in lines]
    assert [type(p).__name__ for p in parsed] == ["StdoutEvent", "ProcessExitEvent"], lines
    assert (parsed[0].data, parsed[-1].exit_code) == ("got x\n", 0)
    ended = ok(api(generated, "get_v1_sessions_session_processes_id").sync_detailed(
        SESSION, started.id, client=c), "ProcessInfo")  # fmt: skip
    assert (ended.running, ended.exit_code) == (False, 0)
    SignalBody = model(generated, "SignalBody")
    for operation, kwargs in [
        ("post_v1_sessions_session_processes_id_signal", {"body": SignalBody(signal="SIGTERM")}),
        ("delete_v1_sessions_session_processes_id", {}),
    ]:
        sleeper = ok(api(generated, "post_v1_sessions_session_processes").sync_detailed(
            SESSION, client=c, body=ProcessRequest(command="sleep 300")), "ProcessInfo")  # fmt: skip
        answers: List[Any] = []

        def answered(op: str = operation, kw: Dict[str, Any] = kwargs, pid: int = sleeper.id) -> bool:
            # 409 `process_starting` until the process said its pid: retried.
            answers.append(api(generated, op).sync_detailed(SESSION, pid, client=c, **kw))
            return answers[-1].status_code != 409

        wait_for(f"{operation} answers", answered)
        ok(answers[-1], "ProcessInfo")
        assert parse_union(generated, spec, "ProcessEvent", output_lines(
            server, SESSION, sleeper.id)[-1]).exit_code in (128 + 15, 128 + 9)  # fmt: skip

    # Interrupt a running cell: it ends `interrupted`.
    ends: List[Any] = []
    cell = threading.Thread(
        target=lambda: ends.append(
            api(generated, "post_v1_sessions_session_execute").sync_detailed(
                SESSION, client=c, body=ExecuteRequest(code="import time\ntime.sleep(60)")
            )
        )
    )
    cell.start()

    def busy() -> bool:
        listed = api(generated, "get_v1_kernels").sync_detailed(client=c).parsed
        return any(k.state == "busy" for k in listed.kernels)

    wait_for("the cell is running", busy)
    interrupted = ok(
        api(generated, "post_v1_sessions_session_interrupt").sync_detailed(SESSION, client=c),
        "Interrupted",
    )
    cell.join(timeout=120)
    assert interrupted.interrupted == 1
    assert ok(ends[0], "CellResult").status == "interrupted"

    # A delegated child, released.
    child = ok(
        api(generated, "post_v1_sessions_session_execute").sync_detailed(
            SESSION, client=c, body=ExecuteRequest(code="1", child="helper")
        ),
        "CellResult",
    )
    assert child.status == "success"
    released = ok(
        api(generated, "delete_v1_sessions_session_children_child").sync_detailed(
            SESSION, "helper", client=c
        ),
        "Released",
    )
    assert released.released == 1
    # The child's own workspace, gone with it.
    ok(api(generated, "delete_v1_workspaces_name").sync_detailed(f"{SESSION}::child::helper",
       client=c), "Deleted")  # fmt: skip

    # The session's workspace, uploaded (a tar: sent with httpx, the answer parsed by the
    # generated model), listed, then the session cleared and its workspace deleted.
    tar = io.BytesIO()
    with tarfile.open(fileobj=tar, mode="w") as t:
        info = tarfile.TarInfo("w.txt")
        info.size = 1
        t.addfile(info, io.BytesIO(b"w"))
    up = httpx.put(
        f"{server.url}/v1/sessions/{SESSION}/workspace", content=tar.getvalue(),
        headers={"Authorization": f"Bearer {server.token('main')}",
                 "Content-Type": "application/x-tar"}, timeout=120,
    )  # fmt: skip
    assert up.status_code == 201, up.text
    model(generated, "Written").from_dict(up.json())
    spaces = ok(api(generated, "get_v1_workspaces").sync_detailed(client=c), "WorkspaceList")
    assert SESSION in [w.name for w in spaces.workspaces]
    cleared = ok(api(generated, "delete_v1_sessions_session").sync_detailed(SESSION, client=c),
                 "Cleared")  # fmt: skip
    assert cleared.cleared >= 1
    gone = ok(api(generated, "delete_v1_workspaces_name").sync_detailed(SESSION, client=c),
              "Deleted")  # fmt: skip
    assert gone.deleted == SESSION

    # The ledger, health, and this document.
    report = ok(api(generated, "get_v1_usage").sync_detailed(client=c), "UsageReport")
    assert report.rows, "the cells above are in the ledger"
    health = ok(api(generated, "get_healthz").sync_detailed(client=c), "Health")
    assert health.status == "ok"
    assert api(generated, "get_openapi_json").sync_detailed(client=c).status_code == 200

    # Snapshots (docs/snapshots.md): this server's kernels run under runc, whose memory the
    # engine cannot checkpoint: a snapshot is files-only (`memory` false), listed, read,
    # restored into a new session, forked, deleted; an unknown id is a 404.
    ok(api(generated, "post_v1_sessions_session_execute").sync_detailed(
        SESSION, client=c, body=ExecuteRequest(code="open('f.txt', 'w').write('f')")), "CellResult")  # fmt: skip
    SnapshotBody = model(generated, "SnapshotBody")
    snap = ok(api(generated, "post_v1_sessions_session_snapshots").sync_detailed(
        SESSION, client=c, body=SnapshotBody(name="n")), "SnapshotInfo")  # fmt: skip
    assert snap.memory is False
    listed = ok(api(generated, "get_v1_snapshots").sync_detailed(client=c), "SnapshotList")
    assert [s.id for s in listed.snapshots] == [snap.id]
    ok(api(generated, "get_v1_snapshots_id").sync_detailed(snap.id, client=c), "SnapshotInfo")
    RestoreBody = model(generated, "RestoreBody")
    ok(api(generated, "post_v1_sessions_session_restore").sync_detailed(
        SESSION + "-restored", client=c, body=RestoreBody(snapshot=snap.id)), "ForkOutcome")  # fmt: skip
    ForkBody = model(generated, "ForkBody")
    ok(api(generated, "post_v1_sessions_session_fork").sync_detailed(
        SESSION, client=c, body=ForkBody(count=1)), "ForkResult")  # fmt: skip
    ok(api(generated, "delete_v1_snapshots_id").sync_detailed(snap.id, client=c), "Deleted")
    ok(api(generated, "get_v1_snapshots_id").sync_detailed("snap-0", client=c), "Error", 404)
    ok(api(generated, "delete_v1_snapshots_id").sync_detailed("snap-0", client=c), "Error", 404)
    ok(api(generated, "post_v1_sessions_session_restore").sync_detailed(
        SESSION, client=c, body=RestoreBody(snapshot="snap-0")), "Error", 404)  # fmt: skip

    # The cluster's admin routes: this server is no cluster node, so each answers a 404
    # `Error`, parsed.
    for operation, args in [
        ("get_v1_nodes", ()),
        ("post_v1_nodes_node_drain", ("n1",)),
        ("delete_v1_nodes_node_drain", ("n1",)),
        ("get_v1_nodes_node_kernels", ("n1",)),
    ]:
        ok(api(generated, operation).sync_detailed(*args, client=c), "Error", 404)

    # The operator's routes (docs/console.md): whom the token is; the admin's, on a server
    # without an admin token, a 404 `Error`, parsed.
    who = ok(api(generated, "get_v1_whoami").sync_detailed(client=c), "Identity")
    assert (who.role, who.tenant, who.cluster) == ("tenant", "main", False)
    for operation, args in [
        ("get_v1_admin_kernels", ()),
        ("get_v1_admin_tenants", ()),
        ("delete_v1_admin_tenants_tenant_sessions_session", ("main", SESSION)),
        ("get_v1_admin_tenants_tenant_sessions_session_events", ("main", SESSION)),
    ]:
        ok(api(generated, operation).sync_detailed(*args, client=c), "Error", 404)
    # What happened lately (docs/console.md): the tenant's own sessions' kernel events, its
    # audit records, its egress refusals (none: egress is off here); another tenant's is a 403.
    mine = ok(api(generated, "get_v1_sessions_session_events").sync_detailed(SESSION, client=c),
              "SessionEvents")  # fmt: skip
    assert mine.tenant == "main" and mine.events and mine.events[0].event == "started", mine
    recent = ok(api(generated, "get_v1_events").sync_detailed(client=c, limit=200), "RecentSessions")
    assert SESSION in {s.session for s in recent.sessions}
    tail = ok(api(generated, "get_v1_audit").sync_detailed(client=c, limit=5), "AuditTail")
    assert 0 < len(tail.records) <= 5 and {r.tenant for r in tail.records} == {"main"}
    refusals = ok(api(generated, "get_v1_egress_refusals").sync_detailed(client=c), "EgressRefusals")
    assert (refusals.egress, refusals.refusals) == (False, [])
    ok(api(generated, "get_v1_egress_refusals").sync_detailed(client=c, tenant="other"), "Error", 403)


def events(server: Server, route: str, body: Dict[str, Any]) -> List[Dict[str, Any]]:
    with httpx.stream(
        "POST", f"{server.url}/v1/sessions/{SESSION}-stream/{route}", json=body, timeout=120,
        headers={"Authorization": f"Bearer {server.token('main')}",
                 "Accept": "application/x-ndjson"},
    ) as r:  # fmt: skip
        assert r.status_code == 200, r.read()
        return [json.loads(line) for line in r.iter_lines() if line]


def output_lines(server: Server, session: str, process_id: int) -> List[Dict[str, Any]]:
    """A background process's output stream, read to its `exit` line."""
    with httpx.stream(
        "GET", f"{server.url}/v1/sessions/{session}/processes/{process_id}/output", timeout=120,
        headers={"Authorization": f"Bearer {server.token('main')}"},
    ) as r:  # fmt: skip
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"] == "application/x-ndjson"
        return [json.loads(line) for line in r.iter_lines() if line]


def parse_union(generated: ModuleType, spec: Dict[str, Any], union: str, line: Dict[str, Any]) -> Any:
    """A line parsed as the generated model its `event` maps to in the union's discriminator."""
    mapping = spec["components"]["schemas"][union]["discriminator"]["mapping"]
    name = mapping[line["event"]].split("/")[-1]
    parsed = model(generated, name).from_dict(line)
    assert parsed.to_dict() == line or name.endswith("ResultEvent"), (name, line)
    return parsed


def test_stream_events_parse_by_their_union(
    generated: ModuleType, server: Server, spec: Dict[str, Any]
) -> None:
    lines = events(server, "execute", {
        "code": "print('a')\ndisplay({'text/plain': 'hi'}, raw=True)\n1 / 0",
    })  # fmt: skip
    parsed = [parse_union(generated, spec, "StreamEvent", line) for line in lines]
    names = [type(p).__name__ for p in parsed]
    assert names[0] == "OutputEvent" and names[-1] == "CellResultEvent", names
    assert parsed[-1].result.status == "error"
    lines = events(server, "commands", {"command": "echo out; echo err >&2; exit 3"})
    parsed = [parse_union(generated, spec, "CommandEvent", line) for line in lines]
    assert {type(p).__name__ for p in parsed} == {"StdoutEvent", "StderrEvent", "CommandResultEvent"}
    assert parsed[-1].result.exit_code == 3
    c = client(generated, server)
    ok(api(generated, "delete_v1_sessions_session").sync_detailed(f"{SESSION}-stream", client=c),
       "Cleared")  # fmt: skip
    # Every session of the tenant has a workspace (it has workspaces): deleted, none is left.
    ok(api(generated, "delete_v1_workspaces_name").sync_detailed(f"{SESSION}-stream", client=c),
       "Deleted")  # fmt: skip
