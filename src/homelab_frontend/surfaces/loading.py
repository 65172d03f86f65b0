"""While a managed model loads, a streaming client sees that it is loading (llama-swap #366).

A request for a managed backend (`run:`) that is starting waits in its queue in phase `loading`
for as long as the server takes to load: tens of seconds, minutes for a large vLLM. Without a
byte in that time a client cannot tell a loading model from a dead gateway, and proxies and
clients with read timeouts give up. So once a *streaming* request is seen waiting in phase
`loading`, its answer's headers go out at once and a keep-alive frame every
`lifecycle.loading_keepalive_s` until it is admitted; the answer then continues on that response.

What is written, per dialect (each checked against its SDK's stream reader):
* SSE dialects (OpenAI Chat, completions, Anthropic, Responses): an SSE comment line,
  `: loading model "NAME" (12 s)`, which the SSE grammar tells every reader to ignore (the
  openai and anthropic SDKs' decoders skip lines that start with ":"; Codex's and Claude Code's
  readers are SSE parsers too). The note is part of the comment, so it costs nothing: curl shows
  it, SDKs skip it.
* Gemini (`alt=sse`): a blank line. google-genai's Python reader hands a line that is not
  `data: ` to its raw-JSON buffer, which would yield `: loading...` as a chunk to parse and fail;
  a blank line with no data pending is skipped there, as by any SSE reader.
* Ollama's NDJSON: a chunk with empty content and `done: false`, which is what Ollama's own
  stream is made of (the `ollama` library parses every line as JSON: a blank one, or a comment,
  would break it).

`lifecycle.loading_note: true` adds a visible note where a dialect has a place for one that does
not end up in the answer: OpenAI Chat's `reasoning_content` and Ollama's `thinking`, once, when the
load begins (`loading model NAME...`). Off by default: a client shows it as the model's
reasoning, and a client that sends reasoning back (few do, for Chat) would send the note too.
Anthropic (a thinking block needs a signature and Claude Code sends it back), Responses (a
reasoning item is stored and sent back by Codex) and Gemini (a thought part is the answer's) get
no visible note.

A failure once the headers have gone out (the server failed to start, the queue timed out) can no
longer be an HTTP status: it is the dialect's in-stream error frame, written by app/request_scope.py
through the `Early` this module leaves on the request. Only a request that waits for a *load*
gets early headers; one that waits for a busy backend's slot is refused with a status as before.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Protocol

from aiohttp import web

from ..errors import GatewayError
from ..request.tracker import LOADING, Tracked

EARLY = "hlf_early_stream"  # request key: the Early of a stream whose headers went out while loading
_STEP_S = 0.05  # how often the phase is looked at while the request waits


class Announcer(Protocol):
    """What a streaming dialect writes while its model loads (a surfaces.skeleton.Turn has it)."""

    stream_headers: dict[str, str]

    def loading_frame(self, model: str, waited_s: float, first: bool, note: bool) -> bytes: ...

    def early_failure(self, err: GatewayError) -> bytes: ...


class Early:
    """A stream answered early: its response, and how to end it with an error in its dialect."""

    __slots__ = ("out", "fail")

    def __init__(self, out: web.StreamResponse, fail: Callable[[GatewayError], bytes]) -> None:
        self.out = out
        self.fail = fail


def sse_comment(model: str, waited_s: float) -> bytes:
    """The SSE keep-alive while loading: a comment line (readers ignore it), saying what waits."""
    name = model.replace("\n", " ").replace("\r", " ")[:200]
    return f': loading model "{name}" ({waited_s:.0f} s)\n\n'.encode()


async def admit(request: web.Request, t: Tracked, admit: Callable[[], Awaitable[object]],
                announcer: Announcer, headers: Callable[[], dict[str, str]], interval_s: float,
                note: bool) -> None:
    """`admit()` (the Exchange's), with the stream's headers sent and keep-alive frames written
    while the request waits in phase loading. A stop event, not a cancel, ends the writer when
    the admission ends: a write is never cut in the middle."""
    if not interval_s or not t.stream:
        await admit()
        return
    stop = asyncio.Event()

    async def announce() -> None:
        out: web.StreamResponse | None = None
        since = last = 0.0
        while not stop.is_set():
            if t.phase == LOADING:
                now = time.monotonic()
                if out is None:
                    out = web.StreamResponse(headers={**announcer.stream_headers, **headers()})
                    await out.prepare(request)
                    request[EARLY] = Early(out, announcer.early_failure)
                    since = now
                    await out.write(announcer.loading_frame(t.model, 0.0, True, note))
                    last = now
                elif now - last >= interval_s:
                    await out.write(announcer.loading_frame(t.model, now - since, False, note))
                    last = now
            try:
                await asyncio.wait_for(stop.wait(), _STEP_S)
            except TimeoutError:
                pass

    writer = asyncio.get_running_loop().create_task(announce())
    try:
        await admit()
    finally:
        stop.set()
        me = asyncio.current_task()
        assert me is not None  # a coroutine run by a task
        if me.cancelling():  # the client left: nobody to write to
            writer.cancel()
        else:
            try:
                await writer
            except (ConnectionError, RuntimeError):
                pass  # the client went while a frame was written: its own cancel follows
