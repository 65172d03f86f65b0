"""The bounded readers of an upstream's answer (upstream/read.py): the SSE line reader over
scripted reads, the whole-body reader against a real server."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend.errors import GatewayError
from homelab_frontend.upstream.read import UpstreamTooLarge, read_body, sse_payloads


class _Content:
    """What sse_payloads reads from: `readany()` returning the given reads, then b""."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = list(reads)

    async def readany(self) -> bytes:
        return self.reads.pop(0) if self.reads else b""


def _collect(reads: list[bytes], max_line: int) -> list[bytes]:
    async def go():
        out = []
        async for batch in sse_payloads(_Content(reads), "b", max_line):
            out.extend(batch)
        return out

    return asyncio.run(go())


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    parts, last = [], 0
    for p in points:
        if p > last:
            parts.append(data[last:p])
            last = p
    parts.append(data[last:])
    return [p for p in parts if p]


@settings(max_examples=examples(200))
@given(payloads=st.lists(st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b),
                         min_size=1, max_size=8),
       cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=10))
def test_sse_payloads_under_the_limit_whatever_the_splits(payloads, cuts):
    stream = b"".join(b"data: " + p + b"\n\n" for p in payloads)
    assert _collect(_split(stream, cuts), max_line=1024) == payloads


@pytest.mark.parametrize("reads", [
    [b"data: " + b"x" * 3000],  # an open line, one read
    [b"data: ", b"x" * 1000, b"x" * 1000, b"x" * 1000],  # an open line over several reads
    [b"data: " + b"x" * 1500, b"x" * 1500 + b"\n\n"],  # a line that ends, but too long
    [b"data: ok\n\ndata: " + b"y" * 3000],  # the open tail after good lines
])
def test_sse_line_over_the_limit_raises_too_large(reads):
    with pytest.raises(UpstreamTooLarge) as exc:
        _collect(reads, max_line=2048)
    assert exc.value.kind == "upstream_too_large" and "max_line_bytes" in exc.value.message


def test_sse_a_line_of_exactly_the_limit_passes():
    line = b"data: " + b"z" * (2048 - 6)
    assert _collect([line[:1000], line[1000:], b"\n\n"], max_line=2048) == [b"z" * (2048 - 6)]


# -- the whole-body reader, against a real aiohttp server on 127.0.0.1 ---------------------------


def _read(handler, limit: int) -> bytes:
    async def main() -> bytes:
        app = web.Application()
        app.router.add_get("/", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{runner.addresses[0][1]}/") as resp:
                    return await read_body(resp, "b", limit)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def _chunked(parts: list[bytes]):
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)  # no content-length: chunked, its size unknown up front
        for p in parts:
            await resp.write(p)
        await resp.write_eof()
        return resp
    return handler


def test_a_body_up_to_the_limit_is_read_whole():
    async def sized(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 100)

    assert _read(sized, 100) == b"x" * 100
    assert _read(_chunked([b"ab", b"cd", b"ef"]), 6) == b"abcdef"


def test_a_declared_length_over_the_limit_is_refused():
    async def sized(request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 101)

    with pytest.raises(UpstreamTooLarge) as exc:
        _read(sized, 100)
    assert exc.value.kind == "upstream_too_large" and "max_body_bytes" in exc.value.message and "'b'" in exc.value.message


def test_a_chunked_body_growing_past_the_limit_is_refused():
    with pytest.raises(UpstreamTooLarge):
        _read(_chunked([b"a" * 60, b"b" * 60]), 100)


def test_a_body_cut_short_is_the_backends_failure():
    async def cut(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-length": "1000"})
        await resp.prepare(request)
        await resp.write(b"x" * 10)
        request.transport.close()  # hangs up 990 bytes short
        return resp

    with pytest.raises(GatewayError) as exc:
        _read(cut, 10_000)
    assert exc.value.kind == "upstream_error" and "closed the connection before its answer was complete" in exc.value.message
