"""Upstream text completions -> canonical events (sans-I/O): OpenAI's legacy `/v1/completions`
stream (vLLM, llama.cpp, Ollama) and llama.cpp's own `/infill` stream.

The completion surfaces (surfaces/completions/) read every upstream answer as a stream, so these
two stream decoders are all they need; like upstream/decode.py's `ChunkDecoder`, `feed(payload)`
takes one SSE `data:` payload and returns canonical events (TextDelta, Finish, Usage,
UpstreamError), never raising, and `done` says the upstream finished.

`TextChunkDecoder` (legacy completions): `choices[0].text` -> TextDelta (an empty text is none);
`finish_reason` stop / length -> Finish (vLLM's string `stop_reason`: the stop string that fired);
`usage` on any chunk (the `choices: []` usage chunk, vLLM's continuous usage) -> Usage, read as
upstream/decode.py reads a chat chunk's usage, each figure None when not reported; `[DONE]` ->
done. An `object` other than `text_completion` (a chat chunk from a misrouted backend), a
malformed chunk, or an error chunk -> one UpstreamError.

`InfillDecoder` (llama.cpp's /infill and /completion, not OpenAI-shaped): each object has
`content` and `stop`; `tokens_predicted` / `tokens_evaluated` are the running counts (usage),
`timings.cache_n` the prompt tokens it took from its cache; the last object ends it, its
`stop_type` (`eos`, `word`: stop; `limit`: length). Every partial object says `"stop": false`;
the last says `"stop": true`, unless the request's `response_fields` trimmed it to the fields
named there (llama.cpp trims only the last object: `{}` for llama.vim's warm-up), so any object
without `"stop": false` is the last. The stream has no `[DONE]`.
"""

from __future__ import annotations

from typing import Union

import msgspec

from ..canonical import Event, Finish, TextDelta, Usage, UpstreamError
from ..errors import clean_message
from .decode import _ErrorInfo, _error_kind, _Usage, _usage_event

__all__ = ["InfillDecoder", "TextChunkDecoder"]


class _Choice(msgspec.Struct):
    text: Union[str, None] = None
    finish_reason: Union[str, None] = None
    stop_reason: Union[int, str, None] = None  # vLLM


class _Chunk(msgspec.Struct):
    object: Union[str, None] = None
    choices: Union[list[_Choice], None] = None
    usage: Union[_Usage, None] = None
    error: Union[_ErrorInfo, str, None] = None
    message: Union[str, None] = None
    type: Union[str, None] = None
    code: Union[int, str, None] = None


_chunk = msgspec.json.Decoder(_Chunk).decode


def _error(err: _ErrorInfo | str | None, chunk) -> UpstreamError | None:
    if err is not None:
        if isinstance(err, str):
            return UpstreamError(clean_message(err or "upstream error"))
        return UpstreamError(clean_message(err.message or err.type or "upstream error"), _error_kind(err.type, err.code))
    if getattr(chunk, "object", None) == "error":
        return UpstreamError(clean_message(chunk.message or chunk.type or "upstream error"),
                             _error_kind(chunk.type, chunk.code))
    return None


def _finish(reason: str | None, stop_reason: int | str | None) -> Finish | None:
    if reason is None:
        return None
    if reason == "length":
        return Finish("length")
    if reason in ("abort", "error"):
        return None  # reported as an UpstreamError by the caller
    if isinstance(stop_reason, str) and stop_reason:
        return Finish("stop_sequence", stop_reason)
    return Finish("stop")


class TextChunkDecoder:
    """Legacy `/v1/completions` stream chunks -> canonical events."""

    __slots__ = ("done", "finished", "failed")

    def __init__(self) -> None:
        self.done = False
        self.finished = False
        self.failed = False

    def feed(self, payload: bytes) -> list[Event]:
        if self.done or self.failed:
            return []
        if payload == b"[DONE]":
            self.done = True
            return []
        try:
            chunk = _chunk(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return self._fail(UpstreamError(f"the backend sent a malformed completion chunk: {clean_message(str(exc))}"))
        err = _error(chunk.error, chunk)
        if err is not None:
            return self._fail(err)
        if chunk.object is not None and chunk.object != "text_completion":
            return self._fail(UpstreamError(f"the backend sent a {chunk.object!r} chunk, not a text completion"))
        events: list[Event] = []
        usage = _usage_event(chunk.usage) if chunk.usage is not None else None
        if usage is not None:
            events.append(usage)
        if chunk.choices:
            ch = chunk.choices[0]
            if ch.text:
                events.append(TextDelta(ch.text))
            if ch.finish_reason in ("abort", "error"):
                events.append(UpstreamError(f"the backend ended the generation: {ch.finish_reason}"))
                self.failed = True
                return events
            fin = _finish(ch.finish_reason, ch.stop_reason)
            if fin is not None and not self.finished:
                self.finished = True
                events.append(fin)
        return events

    def _fail(self, err: UpstreamError) -> list[Event]:
        self.failed = True
        return [err]


class _Timings(msgspec.Struct):
    cache_n: Union[int, None] = None


class _Infill(msgspec.Struct):
    content: Union[str, None] = None
    stop: Union[bool, None] = None  # partials: false; the last: true, or absent when trimmed
    stop_type: Union[str, None] = None
    stopping_word: Union[str, None] = None
    tokens_predicted: Union[int, None] = None
    tokens_evaluated: Union[int, None] = None
    tokens_cached: Union[int, None] = None
    timings: Union[_Timings, None] = None
    error: Union[_ErrorInfo, str, None] = None


_infill = msgspec.json.Decoder(_Infill).decode


class InfillDecoder:
    """llama.cpp's native /infill (and /completion) stream objects -> canonical events."""

    __slots__ = ("done", "failed")

    def __init__(self) -> None:
        self.done = False
        self.failed = False

    def feed(self, payload: bytes) -> list[Event]:
        if self.done or self.failed:
            return []
        try:
            obj = _infill(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.failed = True
            return [UpstreamError(f"the backend sent a malformed infill chunk: {clean_message(str(exc))}")]
        err = _error(obj.error, None)
        if err is not None:
            self.failed = True
            return [err]
        events: list[Event] = []
        cached = obj.timings.cache_n if obj.timings is not None else None
        if obj.tokens_evaluated is not None or obj.tokens_predicted is not None or cached is not None:
            # the running count: what the backend generated so far, the prompt it evaluated
            events.append(Usage(obj.tokens_evaluated, obj.tokens_predicted, cached))
        if obj.content:
            events.append(TextDelta(obj.content))
        if obj.stop is not False:  # the last object, whatever fields it kept
            self.done = True
            if obj.stop_type == "limit":
                events.append(Finish("length"))
            elif obj.stop_type == "word" and obj.stopping_word:
                events.append(Finish("stop_sequence", obj.stopping_word))
            else:
                events.append(Finish("stop"))
        return events
