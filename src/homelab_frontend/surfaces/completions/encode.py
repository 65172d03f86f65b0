"""Canonical events -> the completion dialects' answers: OpenAI's legacy `text_completion` (SSE
chunks, or one body) and llama.cpp's `/infill` objects (pure state machines, no sockets).

OpenAI (`TextStream`, `text_whole`): every chunk is `{"id", "object": "text_completion",
"created", "model", "choices": [{"index": 0, "text", "logprobs": null, "finish_reason"}]}`, the
finish in a chunk of its own (empty text, `stop` or `length`), then with
`stream_options.include_usage` a `choices: []` chunk with the usage (the backend's own figures:
the encoder keeps the latest report), then `data: [DONE]`. An upstream failure mid-stream is one
`data: {"error": {...}}` chunk and no `[DONE]`, as on the chat surface.

llama.cpp (`InfillStream`, `infill_whole`): `data: {"index": 0, "content", "stop": false,
"tokens_predicted", "tokens_evaluated"}` per piece, then the object with `stop: true`, the
`stop_type` (`eos`, `limit`, `word` with `stopping_word`) and the counts (`tokens_cached` the
backend's cached prompt tokens where it reports them); no `[DONE]` (llama.cpp sends none on
/infill). A whole answer is that last object with all the `content`. With `response_fields` the
last object holds exactly the fields named, flattened as llama.cpp does (native.py `trimmed`).
This is the shape for a backend other than llama.cpp; a llama.cpp backend's own objects are
relayed (native.py).
"""

from __future__ import annotations

import msgspec

from ... import canonical as c
from .native import trimmed

_encode = msgspec.json.encode


def _sse(obj: object) -> bytes:
    return b"data: " + _encode(obj) + b"\n\n"


def finish_reason(fin: c.Finish | None) -> str:
    return "length" if fin is not None and fin.reason == "length" else "stop"


class _Counts:
    """The upstream's latest usage report, and the finish."""

    def __init__(self) -> None:
        self.usage = c.Usage()
        self.fin: c.Finish | None = None
        self.ended = False

    def note(self, ev: c.Event) -> bool:
        """Keep a usage or finish event. -> whether it was one."""
        if type(ev) is c.Usage:
            self.usage = ev.over(self.usage)
            return True
        if type(ev) is c.Finish:
            self.fin = ev
            return True
        return False


def _gather(events: list[c.Event]) -> tuple[str, _Counts] | str:
    """A whole answer's text and counts, or the message of its first UpstreamError (both
    dialects' whole bodies are read the same way)."""
    counts = _Counts()
    text = []
    for ev in events:
        if type(ev) is c.TextDelta:
            text.append(ev.text)
        elif type(ev) is c.UpstreamError:
            return ev.message
        else:
            counts.note(ev)
    return "".join(text), counts


def _usage_doc(u: c.Usage) -> dict | None:
    if u.input_tokens is None and u.output_tokens is None:
        return None
    doc: dict = {"prompt_tokens": u.input_tokens or 0, "completion_tokens": u.output_tokens or 0,
                 "total_tokens": (u.input_tokens or 0) + (u.output_tokens or 0)}
    if u.cached_input_tokens is not None:
        doc["prompt_tokens_details"] = {"cached_tokens": u.cached_input_tokens}
    return doc


def _error(message: str, kind: str = "api_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class TextStream(_Counts):
    """OpenAI legacy completions, streamed."""

    def __init__(self, *, id: str, created: int, model: str, include_usage: bool) -> None:
        super().__init__()
        self.head = {"id": id, "object": "text_completion", "created": created, "model": model}
        self.include_usage = include_usage
        # per token only the text is encoded: the fixed head and the choice's frame are bytes once
        head = _encode(self.head)[:-1]
        self._open = b"data: " + head + b',"choices":[{"index":0,"text":'
        self._token_end = b',"logprobs":null,"finish_reason":null}]}\n\n'

    def _chunk(self, text: str, finish: str | None) -> bytes:
        if finish is None:
            return self._open + _encode(text) + self._token_end
        return _sse({**self.head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]})

    def feed(self, ev: c.Event) -> bytes:
        if self.ended:
            return b""
        if type(ev) is c.TextDelta:
            return self._chunk(ev.text, None)
        if type(ev) is c.UpstreamError:
            self.ended = True
            return _sse(_error(f"the backend failed mid-stream: {ev.message}"))
        self.note(ev)
        return b""

    def finish(self) -> bytes:
        self.ended = True
        out = self._chunk("", finish_reason(self.fin))
        usage = _usage_doc(self.usage)
        if self.include_usage and usage is not None:
            out += _sse({**self.head, "choices": [], "usage": usage})
        return out + b"data: [DONE]\n\n"

    def fail(self, code: str, message: str) -> bytes:
        self.ended = True
        return _sse(_error(message, "timeout_error" if code == "timeout" else "api_error"))


def text_whole(events: list[c.Event], *, id: str, created: int, model: str) -> tuple[dict, str | None]:
    """The whole `text_completion` body, and the upstream's error message if it failed."""
    got = _gather(events)
    if isinstance(got, str):
        return {}, got
    text, counts = got
    doc = {"id": id, "object": "text_completion", "created": created, "model": model,
           "choices": [{"index": 0, "text": text, "logprobs": None,
                        "finish_reason": finish_reason(counts.fin)}]}
    usage = _usage_doc(counts.usage)
    if usage is not None:
        doc["usage"] = usage
    return doc, None


def _stop_fields(fin: c.Finish | None) -> dict:
    if fin is not None and fin.reason == "length":
        return {"stop_type": "limit", "stopping_word": ""}
    if fin is not None and fin.reason == "stop_sequence":
        return {"stop_type": "word", "stopping_word": fin.stop_sequence or ""}
    return {"stop_type": "eos", "stopping_word": ""}


def _infill_counts(u: c.Usage) -> dict:
    doc = {}
    if u.output_tokens is not None:
        doc["tokens_predicted"] = u.output_tokens
    if u.input_tokens is not None:
        doc["tokens_evaluated"] = u.input_tokens
    if u.cached_input_tokens is not None:
        doc["tokens_cached"] = u.cached_input_tokens
    return doc


class InfillStream(_Counts):
    """llama.cpp's /infill, streamed."""

    def __init__(self, *, model: str, fields: list[str] | None = None) -> None:
        super().__init__()
        self.model = model
        self.fields = fields
        self.pieces = 0

    def feed(self, ev: c.Event) -> bytes:
        if self.ended:
            return b""
        if type(ev) is c.TextDelta:
            self.pieces += 1
            predicted = self.usage.output_tokens if self.usage.output_tokens is not None else self.pieces
            doc = {"index": 0, "content": ev.text, "stop": False, "tokens_predicted": predicted}
            if self.usage.input_tokens is not None:
                doc["tokens_evaluated"] = self.usage.input_tokens
            return _sse(doc)
        if type(ev) is c.UpstreamError:
            self.ended = True
            return _sse(infill_error(500, f"the backend failed mid-stream: {ev.message}"))
        self.note(ev)
        return b""

    def finish(self) -> bytes:
        self.ended = True
        return _sse(trimmed({"index": 0, "content": "", "stop": True, "model": self.model,
                             **_infill_counts(self.usage), **_stop_fields(self.fin), "truncated": False},
                            self.fields))

    def fail(self, code: str, message: str) -> bytes:
        self.ended = True
        return _sse(infill_error(504 if code == "timeout" else 500, message))


def infill_whole(events: list[c.Event], *, model: str, fields: list[str] | None = None) -> tuple[dict, str | None]:
    got = _gather(events)
    if isinstance(got, str):
        return {}, got
    text, counts = got
    return trimmed({"index": 0, "content": text, "stop": True, "model": model,
                    **_infill_counts(counts.usage), **_stop_fields(counts.fin), "truncated": False}, fields), None


_LLAMA_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 429: "unavailable_error", 501: "not_supported_error",
                503: "unavailable_error"}


def infill_error(status: int, message: str) -> dict:
    """llama.cpp's error shape: {"error": {"code", "message", "type"}}."""
    return {"error": {"code": status, "message": message, "type": _LLAMA_TYPES.get(status, "server_error")}}
