"""The client cannot drift from the server: every schema the server's `/openapi.json` reaches
from its routes, and every field of it, has a home in the client; and each field of a client
type mirroring a schema has the schema's type, its optionality (a field the server may omit
or send as null has a default) and, for an enumeration, exactly its values."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from kernelbox_client import Commands, KernelboxError, Processes, Session, WrittenFile
from kernelbox_client import _types, _wire

# Schemas the client handles without a dataclass of their own, and the names it reads of each.
HANDLED: Dict[str, Set[str]] = {
    # `{"error": {code, message}}` -> KernelboxError.code / .message
    "Error": {"error"},
    "ErrorDetail": {"code", "message"},
    # interrupt() / close() of a session / close() of a child return these counts
    "Interrupted": {"interrupted"},
    "Cleared": {"cleared"},
    "Released": {"released"},
    # client.kernels(), client.workspaces(): the lists; files.remove(), delete_workspace()
    "KernelList": {"kernels"},
    # session.contexts()
    "ContextList": {"contexts"},
    "WorkspaceList": {"workspaces"},
    "Deleted": {"deleted"},
    # session.set_network(allow=..., deny=...) sends it (and run(network=...)); returns `closed`
    "NetworkPolicy": set(inspect.signature(Session.set_network).parameters) - {"self"},
    "NetworkApplied": {"closed"},
    # client.snapshots() returns the list; session.snapshot(name), client.restore(id, session)
    # and session.fork(n, sessions) send these bodies (docs/snapshots.md)
    "SnapshotList": {"snapshots"},
    "SnapshotBody": {"name"},
    "RestoreBody": {"snapshot"},
    "ForkBody": {"count", "sessions"},
    # session.processes.list() returns the list; write_stdin() the count; signal(id, signal)
    # sends the body (docs/processes.md)
    "ProcessList": {"processes"},
    "StdinWritten": {"written"},
    "SignalBody": set(inspect.signature(Processes.signal).parameters) - {"self", "process_id"},
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


# Routes that are not this client's: the cluster's admin routes take the admin token, not a
# tenant's; health, metrics, this document and whom a token is (the console's,
# docs/console.md) are read by operators and tools, as are what happened lately (sessions'
# kernel events, the audit trail's tail, egress refusals: the console's, docs/console.md).
NOT_THE_CLIENTS = ("/v1/nodes", "/v1/admin", "/healthz", "/metrics", "/openapi.json", "/v1/mcp",
                   "/v1/whoami", "/v1/events", "/v1/audit", "/v1/egress/refusals",
                   "/v1/sessions/{session}/events")  # fmt: skip


def reachable(spec: Dict[str, Any]) -> Set[str]:
    """Schemas the client's routes use, directly or through other schemas."""
    schemas = spec["components"]["schemas"]
    paths = {p: op for p, op in spec["paths"].items() if not p.startswith(NOT_THE_CLIENTS)}
    todo = list(refs(paths))
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
        elif name in ("ExecuteRequest", "CommandRequest", "ProcessRequest") or name.endswith("Event"):
            continue  # the tests below
        elif props:
            missing.append(f"{name} (the client has no type for it)")
    assert not missing, "the server defines what the client lacks: " + ", ".join(missing)
    assert schemas["Error"]["properties"]["error"]["$ref"] == "#/components/schemas/ErrorDetail"
    assert {"code", "message"} == set(schemas["ErrorDetail"]["properties"])
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
        if path.startswith(NOT_THE_CLIENTS):
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


def test_every_process_field_is_a_start_parameter(spec: Dict[str, Any]) -> None:
    fields = set(spec["components"]["schemas"]["ProcessRequest"]["properties"])
    params = set(inspect.signature(Processes.start).parameters)
    assert fields - params == set(), "ProcessRequest fields processes.start() cannot send"


def events(spec: Dict[str, Any], union: str) -> Set[str]:
    """The `event` values of a stream's union: its discriminator's mapping, each checked
    against the `const` of the named schema it maps to."""
    schemas = spec["components"]["schemas"]
    one_of = schemas[union]["oneOf"]
    mapping = schemas[union]["discriminator"]["mapping"]
    assert schemas[union]["discriminator"]["propertyName"] == "event"
    assert sorted(v["$ref"] for v in one_of) == sorted(set(mapping.values())), union
    for event, ref in mapping.items():
        named = schemas[ref.split("/")[3]]
        assert named["properties"]["event"]["const"] == event, ref
        assert "event" in named["required"], ref
    return set(mapping)


def test_every_command_stream_event_is_understood(spec: Dict[str, Any]) -> None:
    got = events(spec, "CommandEvent")
    assert got == set(_wire.COMMAND_STREAM_EVENTS), "command events the client ignores"


def test_every_process_output_event_is_understood(spec: Dict[str, Any]) -> None:
    got = events(spec, "ProcessEvent")
    assert got == set(_wire.PROCESS_STREAM_EVENTS), "process output events the client ignores"


def test_every_stream_event_is_understood(spec: Dict[str, Any]) -> None:
    got = events(spec, "StreamEvent")
    assert got == set(_wire.STREAM_EVENTS), "stream events the client ignores"


# --- Types, optionality and enumerations of the mirrored schemas ---

SCALARS: Dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}


def deref(spec: Dict[str, Any], schema: Dict[str, Any]) -> Tuple[Optional[str], Dict[str, Any]]:
    """The schema's name (when it is a `$ref`) and what it points at."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.split("/")[3]
        return name, spec["components"]["schemas"][name]
    return None, schema


def nullable(schema: Dict[str, Any]) -> Tuple[bool, Dict[str, Any]]:
    """Whether the schema allows null, and the schema without the null."""
    types = schema.get("type")
    if isinstance(types, list) and "null" in types:
        rest = [t for t in types if t != "null"]
        return True, {**schema, "type": rest[0] if len(rest) == 1 else rest}
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list) and {"type": "null"} in options:
            rest = [o for o in options if o != {"type": "null"}]
            return True, rest[0] if len(rest) == 1 else {**schema, key: rest}
    return False, schema


def enum_values(schema: Dict[str, Any]) -> Optional[Set[str]]:
    """The values of a string enumeration (`enum`, or a `oneOf` of `const`s), else None."""
    if isinstance(schema.get("enum"), list):
        return set(schema["enum"])
    options = schema.get("oneOf")
    if isinstance(options, list) and options and all("const" in o for o in options):
        return {o["const"] for o in options}
    return None


def optional_of(hint: Any) -> Tuple[bool, Any]:
    """Whether the Python annotation admits None, and the annotation without it."""
    if typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) < len(typing.get_args(hint)):
            return True, args[0] if len(args) == 1 else typing.Union[tuple(args)]
    return False, hint


def mismatch(spec: Dict[str, Any], schema: Dict[str, Any], hint: Any, where: str) -> List[str]:
    """How the Python annotation `hint` differs from the (non-null) schema, if it does."""
    if hint is Any:
        return []
    name, target = deref(spec, schema)
    if name is not None and name in _types.MIRRORS:
        return [] if hint is _types.MIRRORS[name] else [f"{where}: {hint} is not {name}'s type"]
    if enum_values(target) is not None:
        return [] if hint is str else [f"{where}: {hint} for a string enumeration"]
    types = target.get("type")
    if isinstance(types, list):
        want = {SCALARS[t] for t in types}
        got = set(typing.get_args(hint)) if typing.get_origin(hint) is typing.Union else {hint}
        return [] if want == got else [f"{where}: {hint} for {types}"]
    if types in SCALARS:
        ok = hint is SCALARS[types] or (types == "number" and hint in (int, float))
        return [] if ok else [f"{where}: {hint} for {types}"]
    if types == "array":
        if typing.get_origin(hint) is not list:
            return [f"{where}: {hint} for an array"]
        return mismatch(spec, target.get("items", {}), typing.get_args(hint)[0], where + "[]")
    if types == "object" or not types:
        if typing.get_origin(hint) is not dict:
            return [f"{where}: {hint} for an object"]
        values = target.get("additionalProperties", {})
        values = values if isinstance(values, dict) else {}
        return mismatch(spec, values, typing.get_args(hint)[1], where + "{}")
    return [f"{where}: the test cannot compare {target}"]


def has_default(f: "dataclasses.Field[Any]") -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def test_every_mirrored_field_has_the_schemas_type_optionality_and_values(
    spec: Dict[str, Any],
) -> None:
    schemas = spec["components"]["schemas"]
    wrong: List[str] = []
    for name, cls in sorted(_types.MIRRORS.items()):
        schema = schemas[name]
        required = set(schema.get("required", []))
        wire = getattr(cls, "WIRE_NAMES", {})
        hints = typing.get_type_hints(cls)
        enums = getattr(cls, "ENUMS", {})
        for f in dataclasses.fields(cls):
            prop = schema.get("properties", {}).get(wire.get(f.name, f.name))
            if prop is None:
                continue  # the client's own (`raw`, `stream_bytes_dropped`)
            where = f"{name}.{f.name}"
            may_be_null, inner = nullable(prop)
            may_be_absent = wire.get(f.name, f.name) not in required
            admits_none, hint = optional_of(hints[f.name])
            if (may_be_absent or may_be_null) and not has_default(f):
                wrong.append(f"{where}: the server may omit it; the client's field has no default")
            if may_be_null and not admits_none:
                wrong.append(f"{where}: the server may send null; the client's type is {hint}")
            if admits_none and not (may_be_null or may_be_absent):
                wrong.append(f"{where}: always sent; the client's type says it may be None")
            wrong += mismatch(spec, inner, hint, where)
            values = enum_values(deref(spec, inner)[1])
            if values is not None and set(enums.get(f.name, ())) != values:
                wrong.append(f"{where}: values {sorted(values)}, the client knows "
                             f"{sorted(enums.get(f.name, ()))}")  # fmt: skip
    assert not wrong, "the client's types differ from the schema:\n" + "\n".join(wrong)


def test_the_walk_sees_the_result_types(spec: Dict[str, Any]) -> None:
    # Guards the test itself: the walk must reach what execute and kernels return.
    assert {"CellResult", "KernelInfo", "StateLost", "KernelSummary", "Error"} <= reachable(spec)
    assert {"CommandRequest", "CommandResult", "CommandEvent"} <= reachable(spec)
    assert {"ProcessRequest", "ProcessInfo", "ProcessList", "ProcessEvent", "SignalBody",
            "StdinWritten"} <= reachable(spec)  # fmt: skip
