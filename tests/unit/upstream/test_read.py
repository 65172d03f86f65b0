"""The bounded readers of an upstream's answer (upstream/read.py): the SSE line reader over
scripted reads."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend.upstream.read import UpstreamTooLarge, sse_payloads


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
