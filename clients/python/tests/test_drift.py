"""The client cannot drift from the server: every schema the server's `/openapi.json` reaches
from its routes, and every field of it, has a home in the client."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Dict, Iterator, Set

from kernelbox_client import Commands, KernelboxError, Session, WrittenFile
from kernelbox_client import _types, _wire

# Schemas the client handles without a dataclass of their own, and the names it reads of each.
HANDLED: Dict[str, Set[str]] = {
    # `{"error": {code, message}}` -> KernelboxError.code / .message
    "Error": {"error"},
    # interrupt() / close() of a session / close() of a child return these counts
    "Count": {"interrupted", "cleared", "released"},
    # session.set_network(allow=..., deny=...) sends it (and run(network=...)); returns `closed`
    "NetworkPolicy": set(inspect.signature(Session.set_network).parameters) - {"self"},
    "NetworkApplied": {"closed"},
}


def refs(node: Any) -> Iterator[str]:
    """Every `#/components/schemas/NAME` below `node`."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            yield ref.split("/")[3]
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def reachable(spec: Dict[str, Any]) -> Set[str]:
    """Schemas the routes use, directly or through other schemas."""
    schemas = spec["components"]["schemas"]
    todo = list(refs(spec["paths"]))
    seen: Set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(refs(schemas[name]))
    return seen


def test_every_field_the_server_defines_is_in_the_clients_types(spec: Dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    missing = []
    for name in sorted(reachable(spec)):
        props = set(schemas[name].get("properties", {}))
        if name in _types.MIRRORS:
            cls = _types.MIRRORS[name]
            wire = getattr(cls, "WIRE_NAMES", {})  # fields named for Python (`from_`)
            fields = {wire.get(f.name, f.name) for f in dataclasses.fields(cls)}
            missing += [f"{name}.{p} (client type {_types.MIRRORS[name].__name__})"
                        for p in sorted(props - fields)]  # fmt: skip
        elif name in HANDLED:
            missing += [f"{name}.{p}" for p in sorted(props - HANDLED[name])]
        elif name in ("ExecuteRequest", "StreamEvent", "CommandRequest", "CommandEvent"):
            continue  # the tests below
        elif props:
            missing.append(f"{name} (the client has no type for it)")
    assert not missing, "the server defines what the client lacks: " + ", ".join(missing)
    assert {"code", "message"} == set(schemas["Error"]["properties"]["error"]["properties"])
    assert {"code", "message"} <= set(inspect.signature(KernelboxError).parameters)


# Answers the spec describes inline (no schema name), by route: the fields the client reads.
INLINE: Dict[str, Set[str]] = {
    "get /v1/kernels": {"kernels"},
    "put /v1/sessions/{session}/files/{path}": {f.name for f in dataclasses.fields(WrittenFile)},
    "put /v1/sessions/{session}/files": {f.name for f in dataclasses.fields(WrittenFile)},
    # files.restore_workspace() returns it
    "put /v1/sessions/{session}/workspace": {f.name for f in dataclasses.fields(WrittenFile)},
    # files.remove() returns it
    "delete /v1/sessions/{session}/files/{path}": {"deleted"},
    # client.workspaces() returns the list; client.delete_workspace() the name
    "get /v1/workspaces": {"workspaces"},
    "delete /v1/workspaces/{name}": {"deleted"},
}


def test_every_field_of_an_inline_answer_is_read(spec: Dict[str, Any]) -> None:
    missing = []
    for path, methods in spec["paths"].items():
        # The cluster's admin routes take the admin token, not a tenant's: not this client's.
        if path.startswith("/v1/nodes"):
            continue
        for method, op in methods.items():
            if not isinstance(op, dict):
                continue  # path-level `parameters`
            for status, response in op.get("responses", {}).items():
                if not status.startswith("2"):
                    continue
                for media in response.get("content", {}).values():
                    props = set(media.get("schema", {}).get("properties", {}))
                    known = INLINE.get(f"{method} {path}")
                    if props and known is None:
                        missing.append(f"{method.upper()} {path} {status} (no client type)")
                    elif props:
                        missing += [f"{method.upper()} {path} {status}: {p}" for p in props - known]
    assert not missing, "inline answers the client does not read: " + ", ".join(missing)


def test_every_execute_field_is_a_run_parameter(spec: Dict[str, Any]) -> None:
    fields = set(spec["components"]["schemas"]["ExecuteRequest"]["properties"])
    params = set(inspect.signature(Session.run).parameters) | {"child"}  # child: the session's
    assert fields - params == set(), "ExecuteRequest fields session.run() cannot send"


def test_every_command_field_is_a_run_parameter(spec: Dict[str, Any]) -> None:
    fields = set(spec["components"]["schemas"]["CommandRequest"]["properties"])
    params = set(inspect.signature(Commands.run).parameters)
    assert fields - params == set(), "CommandRequest fields commands.run() cannot send"


def test_every_command_stream_event_is_understood(spec: Dict[str, Any]) -> None:
    events = {
        variant["properties"]["event"]["const"]
        for variant in spec["components"]["schemas"]["CommandEvent"]["oneOf"]
    }
    assert events - set(_wire.COMMAND_STREAM_EVENTS) == set(), "command events the client ignores"


def test_every_stream_event_is_understood(spec: Dict[str, Any]) -> None:
    events = {
        variant["properties"]["event"]["const"]
        for variant in spec["components"]["schemas"]["StreamEvent"]["oneOf"]
    }
    assert events - set(_wire.STREAM_EVENTS) == set(), "stream events the client ignores"


def test_the_walk_sees_the_result_types(spec: Dict[str, Any]) -> None:
    # Guards the test itself: the walk must reach what execute and kernels return.
    assert {"CellResult", "KernelInfo", "StateLost", "KernelSummary", "Error"} <= reachable(spec)
    assert {"CommandRequest", "CommandResult", "CommandEvent"} <= reachable(spec)
