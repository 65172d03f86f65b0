"""The Gemini stream encoder: canonical events in, `streamGenerateContent` bytes out. Pure.

    enc = GeminiStreamEncoder(model=req.model, response_id=new_response_id(), signer=signer,
                              include_thoughts=not req.reasoning_hidden, framing="sse")
    for event in events:
        write(enc.feed(event))       # zero or one chunk, at once (never buffered but for calls)
    write(enc.finish())              # the upstream ended normally: the last chunk
    # or, once something was written:  write(enc.fail("INTERNAL", "..."))

Every chunk is one whole `GenerateContentResponse`:

    {"candidates": [{"content": {"parts": [...], "role": "model"}, "index": 0}],
     "modelVersion": <the name the client sent>, "responseId": <one id for the whole answer>}

and the last one adds `"finishReason"` to the candidate and `"usageMetadata"` (rules.py) to the
response; its content holds the parts still held (function calls, a trailing signature) or no
parts at all (`{"role": "model"}`, as Google sends an empty repeated field). Which parts each
event makes is parts.py's business.

Framing
-------
`sse` (`?alt=sse`, what both SDKs and Gemini CLI ask for): `data: <json>\\r\\n\\r\\n` per chunk, as
Google frames them; no `event:` lines, no comments, no keep-alive frames, no `[DONE]` (both SDKs
fail on those). `array` (no `alt=sse`, Google's default for REST): one JSON array, written as it
grows: `[` + chunk, `,\\r\\n` + chunk, ..., `]`. U+0085, U+2028 and U+2029 are escaped in every
chunk (surfaces/one_line.py).

A failure after the first byte
------------------------------
The client must see it as a failure, never as an answer that happens to be short. Gemini CLI's
SDK (@google/genai) reads an SSE `data:` frame holding `{"error": ...}` as an empty chunk, and a
stream that then ends cleanly as an empty answer ("Model stream ended without a finish reason",
exit 0). What both SDKs do report is what Google itself sends: the error object *outside* the
SSE framing, a bare JSON line `{"error": {"code", "message", "status"}}`. The JS SDK (@google/genai,
1.30.0 in Gemini CLI 0.61.0 and unchanged through 2.28.0) parses each read of the body as JSON
first and throws `ApiError(code)` with the message for an `error` in it (Gemini CLI then retries
a 5xx at most 3 times and fails the turn, showing the message); if the line shares a read with
other bytes it is left in the SDK's buffer, and the stream ending with unparsed bytes throws
"Incomplete JSON segment at the end": a failure still, but without the gateway's words. The
Python SDK buffers non-`data:` lines until their braces balance and raises `APIError` for an
`{"error": ...}` chunk. So `fail()` writes that bare line, and nothing after it.

What makes the line a read of its own is not time (a pause loses to a busy client, which reads
everything buffered at once, and to any proxy that merges writes) but room: Node's fetch hands
its reader at most its stream buffer's high-water mark plus one socket read (16 or 64 KiB plus
64 KiB: at most 128 KiB) at a time, so the line of a stream that has begun follows
`FAILURE_GAP`, 256 KiB of spaces. The read that holds the line's first byte then begins within
the spaces: JSON with leading white space, which parses. Spaces, not newlines: no SSE reader
sees a line end in them (the newer SDK scans its buffer for a delimiter on every event it
splits off: newlines would make that quadratic), the Python SDK strips them with the JSON, and
the SDK's buffer holds nothing but white space when the stream ends. Only a read boundary that
falls inside the line itself still splits it: a failure then, without the words. In the `array`
framing the line is a last element with the array left open, so no JSON parser can take the
body for a complete answer.

fail() before anything was written is that same line alone; the I/O layer should prefer a real
HTTP error while it has not sent the response headers.
"""

from __future__ import annotations

from typing import Callable, Literal

import msgspec

from ... import canonical as c
from ..one_line import one_line
from ..signature import ThinkingSigner
from .errors import HTTP_STATUS
from .parts import CALL, TEXT, PartMachine, part_json
from .rules import finish_reason, new_call_id, usage_metadata

_encode = msgspec.json.Encoder().encode
_TextDelta = c.TextDelta
_Usage = c.Usage

IDLE = "IDLE"
STREAMING = "STREAMING"
ENDED = "ENDED"

Framing = Literal["sse", "array"]
# What precedes the error line of an SSE stream that has begun (module docstring)
FAILURE_GAP = b" " * (256 * 1024)


class GeminiStreamEncoder:
    __slots__ = ("model", "response_id", "state", "failed", "_parts", "_framing", "_lead", "_next_lead",
                 "_trail", "_text_head", "_text_tail", "_thought_tail", "_tail_obj")

    def __init__(self, *, model: str, response_id: str, signer: ThinkingSigner, include_thoughts: bool,
                 framing: Framing = "sse", new_call_id: Callable[[], str] = new_call_id) -> None:
        self.model = model
        self.response_id = response_id
        self.state = IDLE
        self.failed = False
        self._parts = PartMachine(signer=signer, include_thoughts=include_thoughts, new_call_id=new_call_id)
        self._framing = framing
        # what goes before and after each chunk: `data: ` ... blank line, or the array's punctuation
        if framing == "sse":
            self._lead = self._next_lead = b"data: "
            self._trail = b"\r\n\r\n"
        else:
            self._lead, self._next_lead, self._trail = b"[", b",\r\n", b""
        # the hot path (one chunk per streamed token) is a fixed head, the text, a fixed tail
        tail = one_line(b',"index":0}],"modelVersion":' + _encode(model) + b',"responseId":'
                                 + _encode(response_id) + b"}") + self._trail
        self._text_head = b'{"candidates":[{"content":{"parts":[{"text":'
        self._text_tail = b'}],"role":"model"}' + tail
        self._thought_tail = b',"thought":true}],"role":"model"}' + tail
        self._tail_obj = {"modelVersion": model, "responseId": response_id}

    # -- readable state ----------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self.state is ENDED

    @property
    def usage(self) -> c.Usage:
        return self._parts.usage

    @property
    def dropped_tool_args(self) -> int:
        return self._parts.dropped_tool_args

    # -- the API -----------------------------------------------------------------------------

    def feed(self, event: c.Event) -> bytes:
        if self.state is ENDED:
            return b""
        pm = self._parts
        # the hot path, one call per streamed token: a text delta with nothing held before it,
        # and the usage report that rides on most of vLLM's chunks
        if type(event) is _TextDelta and not (pm.calls or pm.reasoning):
            return self._text(event.text, self._text_tail) if event.text else b""
        if type(event) is _Usage:
            pm.usage = event.over(pm.usage)
            return b""
        if type(event) is c.UpstreamError:
            return self.fail(midstream_status(event.kind), event.message)
        parts = pm.feed(event)
        if not parts:
            return b""
        if len(parts) == 1:
            kind, text, sig = parts[0]
            if sig is None and kind is not CALL:
                return self._text(text, self._text_tail if kind is TEXT else self._thought_tail)
        return self._frame(self._chunk([part_json(p) for p in parts]))

    def finish(self) -> bytes:
        if self.state is ENDED:
            return b""
        pm = self._parts
        parts = [part_json(p) for p in pm.end()]
        out = self._frame(self._chunk(parts, finish_reason(pm.finish), usage_metadata(pm.usage)))
        self.state = ENDED
        return out + (b"]" if self._framing == "array" else b"")

    def fail(self, status: str, message: str) -> bytes:
        """`status`: a google.rpc.Code name (INTERNAL, UNAVAILABLE, DEADLINE_EXCEEDED, ...)."""
        if self.state is ENDED:
            return b""
        code = HTTP_STATUS.get(status, 500)
        line = one_line(_encode({"error": {"code": code, "message": message, "status": status}}))
        if self._framing == "array":
            out = (b"[" if self.state is IDLE else b",\r\n") + line
        else:  # the module docstring: a read of its own, whatever the reads before it held
            out = (FAILURE_GAP if self.state is STREAMING else b"") + line + b"\n"
        self.state = ENDED
        self.failed = True
        return out

    # -- internals ---------------------------------------------------------------------------

    def _chunk(self, parts: list[dict], finish: str | None = None, usage: dict | None = None) -> bytes:
        candidate: dict = {"content": {"parts": parts, "role": "model"} if parts else {"role": "model"}}
        if finish is not None:
            candidate["finishReason"] = finish
        candidate["index"] = 0
        obj: dict = {"candidates": [candidate]}
        if usage is not None:
            obj["usageMetadata"] = usage
        obj.update(self._tail_obj)
        return _encode(obj)

    def _text(self, text: str, tail: bytes) -> bytes:
        # only the text varies: it alone needs the separators escaped
        lead = self._lead
        self._lead = self._next_lead
        self.state = STREAMING
        return lead + self._text_head + one_line(_encode(text)) + tail

    def _frame(self, chunk: bytes) -> bytes:
        lead = self._lead
        self._lead = self._next_lead
        self.state = STREAMING
        return lead + one_line(chunk) + self._trail


# canonical UpstreamError.kind -> the status of the error the client is sent
_STATUS_OF_KIND: dict[str, str] = {
    "api_error": "INTERNAL",
    "overloaded_error": "UNAVAILABLE",
    "timeout_error": "DEADLINE_EXCEEDED",
}


def midstream_status(kind: str) -> str:
    """The status for a failure of `kind` (an UpstreamError kind) after the stream began."""
    return _STATUS_OF_KIND.get(kind, "INTERNAL")
