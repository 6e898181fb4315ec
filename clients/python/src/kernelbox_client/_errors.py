"""Typed errors: every failure of a call is a `KernelboxError` carrying the server's `code`
and `message` (the docs/http-api.md lists them), or a clear transport error.

This module is the one place that turns an HTTP status, or an `error` event of a stream, into
an exception class.
"""

from __future__ import annotations

from typing import Dict, Optional, Type


class KernelboxError(Exception):
    """Base of every error this client raises.

    `code` is the server's stable machine-readable code (`unauthorized`, `at_capacity`,
    `invalid_timeout`, ...) or, for transport failures, `timeout` / `connection_failed`;
    `message` the server's human-readable text; `status` the HTTP status (None when no
    response arrived); `retry_after` the seconds of a `Retry-After` header, if any.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: Optional[int] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after
        where = f"HTTP {status} " if status is not None else ""
        super().__init__(f"{where}{code}: {message}")


class BadRequest(KernelboxError):
    """400: bad input (names, timeouts, bodies, paths); nothing was run or changed."""


class Unauthorized(KernelboxError):
    """401: a missing or unknown bearer token."""


class NotFound(KernelboxError):
    """404: the caller's tenant has nothing by that name (or the URL is not kernelbox's API)."""


class Conflict(KernelboxError):
    """409: what was asked for is in use (a workspace a kernel has mounted); nothing changed."""


class PayloadTooLarge(KernelboxError):
    """413: the request body is over the server's limit."""


class RateLimited(KernelboxError):
    """429: a capacity cap (`at_capacity`) or a busy session (`session_busy`); retry after
    `retry_after` seconds."""


class ServerError(KernelboxError):
    """5xx: the engine failed, the kernel could not start, the server is shutting down or at
    its connection limit, or its storage is full."""


class Timeout(KernelboxError):
    """No answer from the server in time (connect, send or read). A cell may still be
    running: `session.interrupt()` stops it."""


class ConnectionFailed(KernelboxError):
    """The server could not be reached, or the connection broke mid-answer."""


class ProtocolError(KernelboxError):
    """The server's answer was not what the API describes (e.g. not JSON)."""


_BY_STATUS: Dict[int, Type[KernelboxError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: RateLimited,
}

# A streamed execute reports a failure after its 200 as an `error` event carrying only the
# code; these are the codes the server sends with a status other than 5xx.
_BY_CODE: Dict[str, Type[KernelboxError]] = {
    "unauthorized": Unauthorized,
    "not_found": NotFound,
    "payload_too_large": PayloadTooLarge,
    "at_capacity": RateLimited,
    "session_busy": RateLimited,
}


def error_for(
    status: Optional[int],
    code: str,
    message: str,
    retry_after: Optional[float] = None,
) -> KernelboxError:
    """The typed error for an HTTP status (or, with `status` None, a stream's error code)."""
    if status is not None:
        cls = _BY_STATUS.get(status)
        if cls is None:
            cls = ServerError if status >= 500 else KernelboxError
    else:
        cls = _BY_CODE.get(code)
        if cls is None:
            cls = BadRequest if code.startswith("invalid") else ServerError
    return cls(code, message, status=status, retry_after=retry_after)
