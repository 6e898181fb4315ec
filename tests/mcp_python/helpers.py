"""Small helpers shared by the MCP tests: the SDK's clients over stdio and HTTP, and raw
streamable-HTTP requests for what the SDK does not expose (session ids, status codes)."""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from conftest import CASE_KEY, binary, clean_env

#: The protocol version with MCP sessions (2026-07-28 has none).
SESSION_PROTOCOL = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


def text(result: Any) -> str:
    """The text content of a tool result, joined."""
    return "".join(c.text for c in result.content if c.type == "text")


def stdio_client(case: str, *args: str, mode: str = "auto") -> Client:
    """The SDK's client running `kernelbox mcp` as a subprocess, its kernels labelled `case`."""
    params = StdioServerParameters(
        command=binary(),
        args=["mcp", "--label", f"{CASE_KEY}={case}", *args],
        env=clean_env(),
    )
    return Client(params, mode=mode)


def http_client(url: str, token: Optional[str], mode: str = "auto", headers=None) -> Client:
    """The SDK's client over streamable HTTP with a bearer token."""
    h = dict(headers or {})
    if token is not None:
        h["Authorization"] = f"Bearer {token}"
    http = httpx2.AsyncClient(headers=h, timeout=120)
    return Client(streamable_http_client(url, http_client=http), mode=mode)


def sse_messages(body: str) -> List[Dict[str, Any]]:
    """The JSON-RPC messages in an SSE body (or a plain JSON one)."""
    body = body.strip()
    if body.startswith("{"):
        return [json.loads(body)]
    out = []
    for line in body.splitlines():
        if line.startswith("data:") and line[5:].strip():
            out.append(json.loads(line[5:]))
    return out


class RawSession:
    """An MCP session (protocol 2025-11-25) driven with plain HTTP requests."""

    def __init__(self, url: str, token: Optional[str]):
        self.url = url
        self.token = token
        self.id: Optional[str] = None
        self.http = httpx2.Client(timeout=60)
        self.next_id = 1

    def headers(self, token: Optional[str] = None) -> Dict[str, str]:
        h = {"Accept": ACCEPT, "Content-Type": "application/json",
             "MCP-Protocol-Version": SESSION_PROTOCOL}  # fmt: skip
        token = token if token is not None else self.token
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        if self.id:
            h["Mcp-Session-Id"] = self.id
        return h

    def initialize(self) -> httpx2.Response:
        body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": SESSION_PROTOCOL, "capabilities": {},
            "clientInfo": {"name": "kernelbox-tests", "version": "1"}}}  # fmt: skip
        h = self.headers()
        h.pop("MCP-Protocol-Version")
        r = self.http.post(self.url, json=body, headers=h)
        if r.status_code == 200:
            self.id = r.headers["mcp-session-id"]
            n = self.http.post(self.url, headers=self.headers(),
                               json={"jsonrpc": "2.0", "method": "notifications/initialized"})  # fmt: skip
            assert n.status_code in (200, 202), n.text
        return r

    def request(self, method: str, params: Dict[str, Any], token: Optional[str] = None) -> httpx2.Response:
        self.next_id += 1
        body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        return self.http.post(self.url, json=body, headers=self.headers(token))

    def call(self, code: str, **args: Any) -> Dict[str, Any]:
        r = self.request("tools/call", {"name": "execute_code", "arguments": {"code": code, **args}})
        assert r.status_code == 200, (r.status_code, r.text)
        return sse_messages(r.text)[-1]["result"]
