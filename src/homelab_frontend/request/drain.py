"""Drain instead of abort: for a backend that must not be aborted mid-generation.

Closing the upstream connection is how the gateway cancels a generation whose client left
(exchange.py), and every server it fronts stops that one sequence and carries on. Not all do:
an OpenVINO model server crashed on an aborted request and took every sequence of its batch with
it (llama-swap #980). A backend set `on_client_gone: drain` is never aborted: when its client
leaves (or the gateway itself ends the request: a timeout, an operator's cancel) the client is let
go at once, and the upstream answer is read on to its end and thrown away, by a task of its own
that holds the request's slot until then, so the backend never runs more sequences than its
`slots` and the gateway never sends it a request for a slot it is still busy with.

The drain is bounded (a backend that goes silent, or will not finish, still gets its connection
closed): `timeouts.idle_s` between two reads, `timeouts.nonstream_s` (or `total_s`) in all. Its
record (request/tracker.py `Tracked`) keeps the outcome of the client's leaving (`cancelled_<phase>`)
and stays in the live set, in phase `draining`, until the drain ends; `drained` then says how the
upstream ended (`completed`: read to its end; `cut`: the bound ran out or the backend broke off),
and the usage the upstream reported at its end, when it did, replaces the gateway's count (so
the ledger counts what the backend really generated). Only then is it observed (access log,
metrics, ledger), with the slot seconds of the whole generation.
"""

from __future__ import annotations

import asyncio
from typing import Callable

import aiohttp
import msgspec

from .tracker import Tracked

_TAIL_BYTES = 16 * 1024  # the end of the answer kept, for the usage it reports there

_decode = msgspec.json.decode


def usage_in_tail(tail: bytes) -> tuple[int, int] | None:
    """(prompt_tokens, completion_tokens) of the last OpenAI-shaped usage in the end of an
    upstream answer (an SSE stream's last chunks, or a whole JSON body), or None. Pure."""
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if line.startswith(b"data:"):
            line = line[5:].strip()
        if b'"usage"' not in line or not line.startswith(b"{"):
            continue
        try:
            doc = _decode(line)
        except msgspec.DecodeError:
            continue
        usage = doc.get("usage") if isinstance(doc, dict) else None
        if not isinstance(usage, dict):
            continue
        p, c = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(p, int) and isinstance(c, int) and not isinstance(p, bool) and not isinstance(c, bool):
            return p, c
    return None


async def read_to_end(resp: aiohttp.ClientResponse, idle_s: float, total_s: float) -> tuple[bool, bytes]:
    """Read `resp` to its end, discarding it. -> (reached its end, its last bytes)."""
    tail = b""
    try:
        async with asyncio.timeout(total_s):
            while True:
                async with asyncio.timeout(idle_s):
                    chunk = await resp.content.readany()
                if not chunk:
                    return resp.content.at_eof(), tail
                tail = (tail + chunk)[-_TAIL_BYTES:]
    except (TimeoutError, aiohttp.ClientError, ConnectionError):
        return False, tail


async def drain(t: Tracked, answer: "aiohttp.ClientResponse | asyncio.Task[aiohttp.ClientResponse]",
                idle_s: float, total_s: float, release: Callable[[], None]) -> None:
    """The detached drain of one request's upstream answer (or of its request still waiting for
    the answer's headers: a task); `release` gives its slot back."""
    t.draining()
    completed = False
    resp: aiohttp.ClientResponse | None = None
    try:
        if isinstance(answer, asyncio.Task):
            try:
                async with asyncio.timeout(total_s):
                    resp = await answer
            except Exception:  # no answer (it failed, or did not come in time): nothing more to read
                if not answer.done():
                    answer.cancel()
                return
        else:
            resp = answer
        completed, tail = await read_to_end(resp, idle_s, total_s)
        usage = usage_in_tail(tail) if completed else None
        if usage is not None:
            t.tokens_in, t.tokens_out = usage
    finally:
        t.drained = "completed" if completed else "cut"
        if resp is not None:
            if completed:
                resp.release()
            else:
                resp.close()
        elif isinstance(answer, asyncio.Task) and not answer.done():
            answer.cancel()  # the drain itself was cancelled (shutdown) while the request waited
        release()
