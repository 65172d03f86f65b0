"""Bounded reads from an upstream: the SSE line reader and the whole-body reader.

An upstream is untrusted input like a client. One that answers 200 and then writes `data: `
followed by 100 MiB without a newline, or a body that never ends, would otherwise grow a buffer
until the process is gone, and every other client's stream with it. So both readers stop at the
backend's `limits` (`max_line_bytes`, `max_body_bytes`) with `UpstreamTooLarge`, a GatewayError
of its own kind (502, counted as `too_large` in hlf_upstream_errors_total). The caller's Exchange
then closes the connection (nothing of it goes back to the pool) and drops what was read, so
memory comes back: at most about one limit, plus the HTTP client's read buffers (well under
1 MiB), is ever held per request (tests/integration/test_hostile_upstream.py measures it).
"""

from __future__ import annotations

from typing import AsyncIterator

import aiohttp

from ..errors import GatewayError


class UpstreamTooLarge(GatewayError):
    def __init__(self, backend: str, what: str, limit: int, key: str) -> None:
        super().__init__(
            "upstream_too_large",
            f"backend {backend!r} sent {what} larger than {limit} bytes (backends.{backend}.limits.{key})",
        )


async def read_body(resp: aiohttp.ClientResponse, backend: str, limit: int) -> bytes:
    """A whole body of at most `limit` bytes (a declared length over it is refused unread).
    A connection that breaks before the end is the backend's failure."""
    if resp.content_length is not None and resp.content_length > limit:
        raise UpstreamTooLarge(backend, "a body", limit, "max_body_bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        while True:
            chunk = await resp.content.readany()
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise UpstreamTooLarge(backend, "a body", limit, "max_body_bytes")
            chunks.append(chunk)
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, ConnectionResetError):
        raise GatewayError(
            "upstream_error", f"backend {backend!r} closed the connection before its answer was complete"
        ) from None
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def sse_payloads(content: aiohttp.StreamReader, backend: str = "?",
                       max_line: int = 1 << 20) -> AsyncIterator[list[bytes]]:
    """The `data:` payloads of an SSE body, in batches of whatever has already arrived: a batch
    is never held back to wait for more, so relaying a batch as one write adds no latency.
    A line (complete or still open) longer than `max_line` raises UpstreamTooLarge.

    An open line is kept as a list of the reads that make it up and joined only once its
    newline arrives: growing one bytes object would hold two copies of it at every step."""
    parts: list[bytes] = []  # the line still open, read by read
    held = 0
    while True:
        data = await content.readany()
        if not data:
            tail = b"".join(parts).strip()
            if tail.startswith(b"data:"):
                yield [tail[5:].lstrip()]
            return
        if b"\n" not in data:
            held += len(data)
            if held > max_line:
                raise UpstreamTooLarge(backend, "an SSE line", max_line, "max_line_bytes")
            parts.append(data)
            continue
        if parts:
            parts.append(data)
            data = b"".join(parts)
        lines = data.split(b"\n")
        rest = lines.pop()
        # Only the first line (it holds the open one) and the open tail can be long: every
        # other line is a part of one socket read, which the HTTP client's buffer bounds.
        if len(rest) > max_line or (parts and len(lines[0]) > max_line):
            raise UpstreamTooLarge(backend, "an SSE line", max_line, "max_line_bytes")
        parts = [rest] if rest else []
        held = len(rest)
        batch = []
        for line in lines:
            if line.startswith(b"data:"):
                payload = line[6:] if line[5:6] == b" " else line[5:]
                batch.append(payload.rstrip(b"\r"))
        if batch:
            yield batch
