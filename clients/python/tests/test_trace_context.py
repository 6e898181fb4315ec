"""The current OpenTelemetry trace context goes out on every request (docs/usage.md,
"Traces"): checked at the transport, no server needed."""

from __future__ import annotations

import asyncio
from typing import Iterator, List

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Span

from kernelbox_client import AsyncClient, Client, _wire

# A provider of the test's own: the global one is left alone.
TRACER = TracerProvider().get_tracer("kernelbox-client-test")


def traceparent(span: Span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


@pytest.fixture
def seen() -> Iterator[List[httpx.Request]]:
    yield []


def transport(seen: List[httpx.Request]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"interrupted": 0})

    return httpx.MockTransport(answer)


def test_a_call_carries_the_current_spans_traceparent_and_none_without_one() -> None:
    call = _wire.interrupt_call("s")
    assert "traceparent" not in _wire.request_headers(call)
    with TRACER.start_as_current_span("agent turn") as span:
        sent = _wire.request_headers(call)
        assert sent["traceparent"] == traceparent(span)
    assert "traceparent" not in call.headers, "the call itself is left as it was"
    assert "traceparent" not in _wire.request_headers(call)


def test_the_sync_client_sends_it(seen: List[httpx.Request]) -> None:
    client = Client("http://kernelbox.invalid", "tok")
    client._http = httpx.Client(transport=transport(seen), headers=_wire.headers("tok"))
    with client, TRACER.start_as_current_span("agent turn") as span:
        assert client.session("s").interrupt() == 0
    (request,) = seen
    assert request.headers["traceparent"] == traceparent(span)
    assert request.headers["authorization"] == "Bearer tok"


def test_the_async_client_sends_it(seen: List[httpx.Request]) -> None:
    async def main() -> str:
        client = AsyncClient("http://kernelbox.invalid", "tok")
        client._http = httpx.AsyncClient(
            transport=transport(seen), headers=_wire.headers("tok")
        )
        async with client:
            with TRACER.start_as_current_span("agent turn") as span:
                assert await client.session("s").interrupt() == 0
                return traceparent(span)

    expected = asyncio.run(main())
    (request,) = seen
    assert request.headers["traceparent"] == expected
