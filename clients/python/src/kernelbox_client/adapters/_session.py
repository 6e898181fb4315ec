"""How an adapter gets its kernelbox session: the caller's own `Session`, or one the adapter
makes (named `PREFIX-<random>` unless named, on the server at `url`/`token`, default
`KERNELBOX_URL` / `KERNELBOX_TOKEN`) and disposes of on `close()`."""

from __future__ import annotations

import uuid
from typing import Optional

from .._sync import Client, Session


class OwnedSession:
    """The session an adapter runs in, and whether closing the adapter disposes of it."""

    def __init__(
        self,
        prefix: str,
        session: Optional[Session],
        url: Optional[str],
        token: Optional[str],
        session_name: Optional[str],
    ) -> None:
        self._client: Optional[Client] = None
        if session is None:
            self._client = Client(url, token)
            session = self._client.session(session_name or f"{prefix}-{uuid.uuid4().hex[:12]}")
        self.session = session

    def close(self) -> None:
        """Disposes of the session's kernel when the adapter made the session (idempotent)."""
        if self._client is not None:
            client, self._client = self._client, None
            try:
                self.session.close()
            finally:
                client.close()
