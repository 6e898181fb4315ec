"""The blocking client: `Client`, `Session`, `Files` (same surface as `_async.py`)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional

import httpx

from . import _wire
from ._types import Execution, KernelSummary, Listing, Result, WrittenFile


class Client:
    """A kernelbox server. `url` and `token` default to `KERNELBOX_URL` and `KERNELBOX_TOKEN`.

    `timeout` (seconds) bounds connecting, sending and each read of a control call; a run
    waits for its cell's timeout (or the server's longest, 3600 s) plus this. Use it as a
    context manager, or call `close()`, to release its connections.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: Optional[float] = _wire.DEFAULT_TIMEOUT,
    ) -> None:
        self.url, self._token = _wire.resolve(url, token)
        self.timeout = timeout
        self._http = httpx.Client(headers=_wire.headers(self._token))

    def session(self, name: str, child: Optional[str] = None) -> "Session":
        """A conversation's kernel (started by its first run); `child` a delegated sub-agent's."""
        return Session(self, name, child)

    def kernels(self) -> List[KernelSummary]:
        """The live kernels of this token's tenant."""
        return _wire.kernels(self._send(_wire.Call("GET", "/v1/kernels")) or b"")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _send(self, call: _wire.Call, content: Any = None) -> Optional[bytes]:
        url = self.url + call.path
        attempt = 0
        while True:
            try:
                r = self._http.request(
                    call.method,
                    url,
                    json=call.json,
                    params=call.params,
                    headers=call.headers,
                    content=content,
                    timeout=call.timeout(self.timeout),
                )
                break
            except httpx.HTTPError as e:
                if not _wire.may_resend(e, content, attempt):
                    raise _wire.transport_error(e, call.method, url) from e
                attempt += 1
        if r.status_code == 404 and call.missing_ok:
            return None
        if not 200 <= r.status_code < 300:
            raise _wire.error_from_response(r.status_code, r.headers, r.content)
        return r.content

    def _download(self, call: _wire.Call, dest: Any) -> int:
        url = self.url + call.path
        sink = _wire.Sink(dest)
        try:
            with self._http.stream(
                call.method,
                url,
                params=call.params,
                headers=call.headers,
                timeout=call.timeout(self.timeout),
            ) as r:
                if r.status_code != 200:
                    raise _wire.error_from_response(r.status_code, r.headers, r.read())
                for chunk in r.iter_bytes():
                    sink.write(chunk)
        except httpx.HTTPError as e:
            sink.abort()
            raise _wire.transport_error(e, call.method, url) from e
        except BaseException:
            sink.abort()
            raise
        return sink.finish()

    def _stream(
        self,
        call: _wire.Call,
        on_output: Optional[Callable[[str], Any]],
        on_display: Optional[Callable[[Result], Any]],
    ) -> Execution:
        url = self.url + call.path
        reader = _wire.StreamReader()
        attempt = 0
        while True:
            try:
                with self._http.stream(
                    call.method,
                    url,
                    json=call.json,
                    headers=call.headers,
                    timeout=call.timeout(self.timeout),
                ) as r:
                    if r.status_code != 200:
                        raise _wire.error_from_response(r.status_code, r.headers, r.read())
                    for line in r.iter_lines():
                        action = reader.feed(line)
                        if action is None:
                            continue
                        kind, value = action
                        callback = on_output if kind == "output" else on_display
                        if callback is not None:
                            callback(value)
                break
            except httpx.HTTPError as e:
                if not _wire.may_resend(e, None, attempt):
                    raise _wire.transport_error(e, call.method, url) from e
                attempt += 1
        return reader.finish()


class Session:
    """One conversation (or one delegated child of it) on a server."""

    def __init__(self, client: Client, name: str, child: Optional[str] = None) -> None:
        self.client = client
        self.name = name
        self.child = child
        self.files = Files(self)

    def run(
        self,
        code: str,
        timeout: Optional[float] = None,
        reset: bool = False,
        task_id: Optional[str] = None,
        on_output: Optional[Callable[[str], Any]] = None,
        on_display: Optional[Callable[[Result], Any]] = None,
        tools: Optional[Iterable[str]] = None,
        network: Optional[Dict[str, List[str]]] = None,
    ) -> Execution:
        """Runs one cell. With `on_output` (text as the cell writes it) or `on_display` (each
        rich result as it is displayed) the answer is streamed. `network`
        (`{"allow": [...], "deny": [...]}`) sets the session's network policy first, as
        `set_network` does. A cell that fails is a result (`status`), not an exception;
        errors are calls the server refused."""
        stream = on_output is not None or on_display is not None
        call = _wire.execute_call(
            self.name,
            self.child,
            code,
            timeout,
            reset,
            task_id,
            tools,
            stream,
            self.client.timeout,
            network,
        )
        if stream:
            return self.client._stream(call, on_output, on_display)
        return _wire.execution(self.client._send(call) or b"")

    def set_network(
        self, allow: Iterable[str] = (), deny: Iterable[str] = ()
    ) -> int:
        """Sets the session's network egress policy (docs/reliability.md, "Network egress"):
        entries are presets (`pypi`), hosts (`example.com`, `*.example.com`) or address ranges,
        each optionally with `:PORT`; deny wins. It is intersected with the tenant's policy and
        applied at once to the running kernel; returns how many of its connections it closed.
        A bad entry raises `BadRequest` (`invalid_network`); any allowed entry, for a tenant
        with no network, `BadRequest` (`network_not_allowed`)."""
        return _wire.closed(self.client._send(_wire.network_call(self.name, allow, deny)))

    def interrupt(self) -> int:
        """Stops the session's running and queued cells (they end `interrupted`, and a running
        cell's kernel is killed); returns how many, 0 when none was running."""
        return _wire.count(self.client._send(_wire.interrupt_call(self.name)), "interrupted")

    def close(self) -> int:
        """Disposes of the session's kernels (its children's too), or of this child's; returns
        how many, 0 when there were none (so closing twice is fine)."""
        body = self.client._send(_wire.close_call(self.name, self.child))
        return _wire.count(body, _wire.close_key(self.child))

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Files:
    """The files of a session's kernel, relative to its working directory (`/work`)."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def _call(self, method: str, path: str, **kw: Any) -> _wire.Call:
        s = self._session
        return _wire.Call(
            method, _wire.file_path(s.name, path), params=_wire.child_params(s.child), **kw
        )

    def write(self, path: str, data: Any, tar: bool = False) -> WrittenFile:
        """Stores `data` at `path`, creating parents; starts the kernel if needed. `data`:
        bytes, str, a local path, a binary file object or an iterable of bytes (files
        and iterables are streamed, never read whole). With `tar=True`, `data` is a tar archive
        extracted into the directory `path` (many files in one request)."""
        up, opened = _wire.upload(data)
        try:
            call = self._call("PUT", path, headers=_wire.upload_headers(up, tar))
            return _wire.written(self._session.client._send(call, content=up.content) or b"")
        finally:
            up.close(opened)

    def read(self, path: str, tar: bool = False) -> bytes:
        """The bytes of the file at `path`; with `tar=True`, the directory at `path` as a tar
        archive."""
        call = self._call("GET", path, headers={"Accept": _wire.TAR} if tar else {})
        return self._session.client._send(call) or b""

    def download(self, path: str, dest: Any, tar: bool = False) -> int:
        """Streams the file at `path` (with `tar=True`, the directory at `path` as a tar
        archive) into `dest`, a local path or a binary file object, never holding it whole;
        returns the bytes written. A local path is written whole or not at all."""
        call = self._call("GET", path, headers={"Accept": _wire.TAR} if tar else {})
        return self._session.client._download(call, dest)

    def list(self, path: str = ".") -> Listing:
        """The entries of the directory at `path` (a list of `FileEntry`)."""
        call = self._call("GET", path, headers={"Accept": "application/json"})
        return _wire.listing(self._session.client._send(call) or b"")

    def remove(self, path: str) -> str:
        """Deletes the file or directory tree at `path` (a symlink itself, never its target);
        returns the path removed, inside the kernel (`/work/...`)."""
        return _wire.deleted(self._session.client._send(self._call("DELETE", path)) or b"")
