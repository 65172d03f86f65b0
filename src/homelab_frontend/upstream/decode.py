"""Upstream OpenAI-shaped answers -> canonical events (sans-I/O).

Every upstream quirk of the chat-completions dialect ends here; what leaves is the canonical
`Event` vocabulary of `canonical.py`.

`ChunkDecoder.feed(payload)` takes the payload of one upstream SSE `data:` line (the bytes after
`data: `) and returns the canonical events it carries; `decode_completion(body)` does the same for
a whole non-streaming `chat.completion`, in the order a stream would have given them.

This module is the one place that decides what a chat completion and a chunk are. The OpenAI
surface relays the upstream's own bytes, but only after `decode_chunk` / `validate_completion`
accepted them; the Anthropic surface translates what the same checks accepted. A body or chunk
that is not one raises `Malformed` (a 502 / error chunk for the client, `error_upstream_*` in the
log); an error sent with 200 raises `ErrorBody`. A chunk is malformed when it is not JSON, has a
field of the wrong type (`"choices": null` in a completion, `"message": "x"`,
`"finish_reason": 42`) or an `object` that is neither `chat.completion[.chunk]` nor `error`; a
completion when it also has no choices or a first choice without a message. A chunk with
neither choices nor usage is tolerated (it carries nothing).

Quirks handled (and the choices made)
-------------------------------------
* `[DONE]` returns `[]` and sets `.done`; anything fed afterwards is ignored.
* One msgspec decode per chunk into typed Structs (unknown fields ignored). Malformed JSON, a
  chunk of the wrong shape, or an error chunk (`{"error": {...}}`, `{"error": "..."}` or
  vLLM's older `{"object": "error", "message": ...}`) become one `UpstreamError`; `feed` never
  raises. An error with HTTP-ish code 503/529 or an "overloaded" type becomes
  `kind="overloaded_error"`, everything else `"api_error"`.
* Only `choices[0]` is read (the gateway always asks for n=1).
* Order of events from one chunk: `Usage` first (so a surface knows `input_tokens` before the first
  content, e.g. vLLM's `continuous_usage_stats` on the first chunk), then reasoning, then argument
  fragments that CONTINUE a tool call started in an earlier chunk, then content, then tool calls
  that START in this chunk (with their arguments), then `Finish`.
  Why continuation fragments go before content: vLLM can put a content delta (e.g. the `"\n"`
  after `</tool_call>`, vllm PR #45287) in the same delta as the last argument bytes of the call
  that text follows; those bytes were generated before the text. New calls go after content
  (GLM-style "text, then a call" in one delta, vllm PR #32266).
* Whitespace-only text right after a tool call is held: vLLM can stream the `"\n"` after
  `</tool_call>` as content in a chunk of its own and only then send the call's last argument
  bytes (its end-of-stream "unstreamed arguments" fix-up, vllm PR #45287). A dialect that closes
  a call's block or item when text follows (Anthropic, Responses, Gemini) could not place those
  bytes any more. So, from a call's start until text or reasoning follows it, whitespace-only
  text is not emitted: it goes out in front of the next text that is not only whitespace, and
  is dropped when reasoning, another call or the end comes first (a
  whitespace-only block carries nothing, and the Anthropic API rejects blank text blocks in
  history). This is the only text the decoder ever holds, and only whitespace.
* Reasoning: `delta.reasoning` (vLLM >= 0.11.1, Ollama) else `delta.reasoning_content`
  (vLLM <= 0.15 compat alias, llama.cpp). When both are present only `reasoning` is used, so the
  text is emitted once. An empty string is treated as absent (never an event for "").
  The first reasoning text of an answer loses a leading `<think>` (`strip_think`): vLLM's
  think-tag parsers (deepseek_r1 among them, 0.32) put the tag into the reasoning when it arrives
  in one delta with the next tokens, which happens when its API server falls behind the engine
  (a busy machine) and merges steps; a whole answer never has it (vLLM partitions it off), so a
  stream now says what the same answer unstreamed says.
* Tool calls: fragments are keyed by the upstream `index`; the canonical `ToolCallStart.index` is
  assigned by the decoder in start order (0, 1, 2, ...), so the encoder can rely on it. The first
  fragment that carries a `name` starts the call (`ToolCallStart(index, id or "", name)`; an id
  of "" means "upstream gave none", the surface generates one); its `arguments`, if non-empty,
  follow as a `ToolArgsDelta`. Fragments seen before the name is known are held until it is. A
  fragment whose upstream index is already in use but which carries a name and a DIFFERENT
  non-empty id is a new call (some servers number each chunk's calls from 0). A fragment without
  an index continues the last call (or starts a new one if it has an id or a name).
  `arguments` sent as a JSON object instead of a string (non-standard) are re-encoded to JSON text.
  `tool_calls: []` is ignored.
* `finish_reason`: stop / length / tool_calls / content_filter map to themselves
  (`function_call` -> tool_calls). vLLM's `choices[].stop_reason`: a non-empty STRING with
  finish_reason stop means a client stop string fired -> `Finish("stop_sequence", s)`; an int
  (a stop token id) or None -> plain "stop". A finish_reason "stop" after tool calls were emitted
  becomes "tool_calls" (vLLM reports "stop" for a forced/named tool choice; the client must still
  learn it has calls to run). vLLM's "abort" / "error" finish reasons become an `UpstreamError`.
  Any other unknown value -> "stop".
* Usage: `usage` on any chunk (including the `choices: []` usage-only final chunk and vLLM's
  continuous usage on every chunk) -> `Usage(input_tokens=prompt_tokens,
  output_tokens=completion_tokens, cached_input_tokens=prompt_tokens_details.cached_tokens,
  reasoning_tokens=completion_tokens_details.reasoning_tokens)` (vLLM since 0.3x reports the
  last), each None when not reported (never invented). A usage object with no counts at all yields
  nothing.
"""

from __future__ import annotations

import json
from typing import Literal, Protocol, Union

import msgspec

from ..canonical import (
    Event,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolArgsDelta,
    ToolCallStart,
    Usage,
    UpstreamError,
)
from ..errors import clean_message

__all__ = ["ChunkDecoder", "Chunk", "ChunkHead", "ChunkMalformed", "decode_head", "ErrorBody", "Malformed", "chunk_error", "decode_chunk",
           "decode_completion", "validate_completion", "validate_embeddings"]


class Malformed(ValueError):
    """An upstream body or chunk that is not a chat completion (chunk)."""


class ErrorBody(ValueError):
    """An upstream error sent where an answer was expected (with status 200)."""


# ---------------------------------------------------------------------------------------------
# Wire shapes (only the fields we read; everything else is ignored by msgspec)
# ---------------------------------------------------------------------------------------------


class _Function(msgspec.Struct):
    name: Union[str, None] = None
    arguments: Union[str, dict, None] = None


class _ToolCallDelta(msgspec.Struct):
    index: Union[int, None] = None
    id: Union[str, None] = None
    function: Union[_Function, None] = None


class _Delta(msgspec.Struct):
    content: Union[str, None] = None
    reasoning: Union[str, None] = None
    reasoning_content: Union[str, None] = None
    tool_calls: Union[list[_ToolCallDelta], None] = None


class _Choice(msgspec.Struct):
    delta: Union[_Delta, None] = None  # streaming
    message: Union[_Delta, None] = None  # non-streaming
    finish_reason: Union[str, None] = None
    stop_reason: Union[int, str, None] = None  # vLLM only


class _PromptDetails(msgspec.Struct):
    cached_tokens: Union[int, None] = None


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: Union[int, None] = None


class _Usage(msgspec.Struct):
    prompt_tokens: Union[int, None] = None
    completion_tokens: Union[int, None] = None
    prompt_tokens_details: Union[_PromptDetails, None] = None
    completion_tokens_details: Union[_CompletionDetails, None] = None

    @property
    def cached(self) -> Union[int, None]:
        d = self.prompt_tokens_details
        return d.cached_tokens if d is not None else None


class _ErrorInfo(msgspec.Struct):
    message: Union[str, None] = None
    type: Union[str, None] = None
    code: Union[int, str, None] = None


class _Chunk(msgspec.Struct):
    # A Literal: an odd `object` fails inside the one decode (and costs no string per chunk)
    object: Union[Literal["chat.completion.chunk", "chat.completion", "error"], None] = None
    # UNSET, not None: an absent `choices` is a chunk that carries nothing, `"choices": null` is
    # malformed (the OpenAI SDK iterates it and crashes)
    choices: Union[list[_Choice], msgspec.UnsetType] = msgspec.UNSET
    usage: Union[_Usage, None] = None
    error: Union[_ErrorInfo, str, None] = None
    # vLLM's older top-level error shape: {"object": "error", "message", "type", "code"}
    message: Union[str, None] = None
    type: Union[str, None] = None
    code: Union[int, str, None] = None


Chunk = _Chunk
_DECODER = msgspec.json.Decoder(_Chunk)


class ChunkHead(msgspec.Struct):
    """The fields of a chunk the events leave out, for a surface that rebuilds the upstream's own
    answer (surfaces/openai/assemble.py): its identity, and `usage` as sent (every field the
    upstream put there, not only the counts `_Usage` reads). Decoded apart, and only when
    wanted, so the per-chunk decode above stays as lean as it is."""

    id: Union[str, None] = None
    created: Union[int, None] = None
    model: Union[str, None] = None
    system_fingerprint: Union[str, None] = None
    usage: Union[dict, None] = None


decode_head = msgspec.json.Decoder(ChunkHead).decode
_JSON = msgspec.json.Encoder()

_FINISH_MAP: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "content_filter": "content_filter",
}
_FAILED_FINISH = frozenset({"abort", "error"})


def _error_kind(type_: str | None, code: int | str | None) -> Literal["api_error", "overloaded_error"]:
    if code in (503, 529, "503", "529") or (type_ and "overloaded" in type_.lower()):
        return "overloaded_error"
    return "api_error"


class _ErrorShape(Protocol):
    """Where an upstream says it failed, in a chunk or a whole body (_Chunk, _Embeddings)."""

    @property
    def object(self) -> str | None: ...
    @property
    def error(self) -> _ErrorInfo | str | None: ...
    @property
    def message(self) -> str | None: ...
    @property
    def type(self) -> str | None: ...
    @property
    def code(self) -> int | str | None: ...


def _chunk_error(chunk: _ErrorShape) -> UpstreamError | None:
    """An error chunk as an event; its text is cleaned here, at the source, since it is the
    upstream's own words and goes on to a client (no traceback, no internal address)."""
    err = chunk.error
    if err is not None:
        if isinstance(err, str):
            return UpstreamError(clean_message(err or "upstream error"))
        return UpstreamError(clean_message(err.message or err.type or "upstream error"), _error_kind(err.type, err.code))
    if chunk.object == "error":
        return UpstreamError(clean_message(chunk.message or chunk.type or "upstream error"),
                             _error_kind(chunk.type, chunk.code))
    return None


chunk_error = _chunk_error


# One streamed chunk (an SSE `data:` payload other than `[DONE]`), checked by its wire types
# alone; raises ChunkMalformed. An error chunk is returned as it is (see `chunk_error`). The bare
# msgspec decode, not a wrapper: the OpenAI relay calls it once per chunk.
decode_chunk = _DECODER.decode
ChunkMalformed = msgspec.DecodeError  # ValidationError (a wrong shape) is a DecodeError too


def _usage_event(u: _Usage) -> Usage | None:
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details is not None else None
    reasoning = u.completion_tokens_details.reasoning_tokens if u.completion_tokens_details is not None else None
    if u.prompt_tokens is None and u.completion_tokens is None and cached is None and reasoning is None:
        return None
    return Usage(u.prompt_tokens, u.completion_tokens, cached, reasoning)


class _Call:
    __slots__ = ("index", "id")

    def __init__(self, index: int, id: str) -> None:
        self.index = index
        self.id = id


class ChunkDecoder:
    """Decodes one upstream chat-completion stream, chunk by chunk (see the module docstring)."""

    __slots__ = ("done", "finished", "_calls", "_pending", "_next_index", "_last_key", "_anon", "_thought",
                 "_after_call", "_held_ws")

    def __init__(self) -> None:
        self.done = False  # `[DONE]` seen
        self.finished = False  # a finish_reason seen
        self._calls: dict[int, _Call] = {}  # upstream index (or synthetic key) -> call
        self._pending: dict[int, list] = {}  # key -> [id, args] while the name is unknown
        self._next_index = 0  # next canonical tool-call index
        self._last_key: int | None = None
        self._anon = -1  # synthetic keys for index-less calls: -1, -2, ...
        self._thought = False  # reasoning seen (only the first may carry a stray <think>)
        self._after_call = False  # a call started, and no text or reasoning came after it yet
        self._held_ws = ""  # whitespace-only text held after a call (module docstring)

    def feed(self, payload: bytes) -> list[Event]:
        if self.done:
            return []
        if payload[:1] != b"{" and payload.strip() == b"[DONE]":
            self.done = True
            return []
        try:
            chunk = _DECODER.decode(payload)
        except msgspec.DecodeError as exc:
            return [UpstreamError(f"malformed upstream chunk: {exc}")]
        return self._events(chunk, streaming=True)

    def feed_chunk(self, chunk: _Chunk) -> list[Event]:
        """The events of a chunk already decoded (`decode_chunk`), for a caller that needs the
        chunk itself too."""
        return self._events(chunk, streaming=True)

    # -- shared by the streaming and non-streaming paths ------------------------------------

    def _events(self, chunk: _Chunk, *, streaming: bool) -> list[Event]:
        err = _chunk_error(chunk)
        if err is not None:
            return [err]
        out: list[Event] = []
        if chunk.usage is not None:
            u = _usage_event(chunk.usage)
            if u is not None:
                out.append(u)
        choices = chunk.choices
        if not choices:
            return out
        choice = choices[0]
        delta = choice.delta if streaming else choice.message
        if delta is None:
            delta = choice.message if streaming else choice.delta
        if delta is not None:
            r = delta.reasoning or delta.reasoning_content
            if r:
                if not self._thought:
                    self._thought = True
                    r = r[len(THINK_TAG):] if r.startswith(THINK_TAG) else r
                if r:
                    out.append(ReasoningDelta(r))
            if delta.tool_calls:
                later = self._tool_calls(delta.tool_calls, out)
                if delta.content:
                    out.append(TextDelta(delta.content))
                out.extend(later)
            elif delta.content:
                out.append(TextDelta(delta.content))
        if choice.finish_reason is not None:
            out.append(self._finish(choice.finish_reason, choice.stop_reason))
        return self._hold_whitespace(out) if self._next_index else out

    def _hold_whitespace(self, events: list[Event]) -> list[Event]:
        """The events of a chunk with whitespace-only text after a tool call held (see the module
        docstring). Runs only once a call has started: before that, no chunk pays for it."""
        out: list[Event] = []
        for ev in events:
            if type(ev) is TextDelta and self._after_call:
                if ev.text.isspace():
                    self._held_ws += ev.text
                    continue
                self._after_call = False
                if self._held_ws:
                    ev, self._held_ws = TextDelta(self._held_ws + ev.text), ""
            elif type(ev) is ToolCallStart:
                self._after_call, self._held_ws = True, ""
            elif type(ev) is ReasoningDelta:
                self._after_call, self._held_ws = False, ""
            out.append(ev)
        return out

    def _finish(self, reason: str, stop_reason: int | str | None) -> Event:
        self.finished = True
        if reason in _FAILED_FINISH:
            return UpstreamError(f"upstream ended the generation with finish_reason {reason!r}")
        mapped = _FINISH_MAP.get(reason, "stop")
        if mapped == "stop":
            if isinstance(stop_reason, str) and stop_reason:
                return Finish("stop_sequence", stop_reason)
            if self._next_index:  # tool calls were emitted
                return Finish("tool_calls")
        return Finish(mapped)

    def _tool_calls(self, fragments: list[_ToolCallDelta], before: list[Event]) -> list[Event]:
        """Appends continuation fragments to `before`; returns the events of calls started now."""
        later: list[Event] = []
        started_now: set[int] = set()
        for tc in fragments:
            fn = tc.function
            name = fn.name if fn is not None else None
            args = fn.arguments if fn is not None else None
            if args is not None and not isinstance(args, str):
                args = _JSON.encode(args).decode()
            key = tc.index
            if key is None:
                if tc.id or name:
                    key = self._anon
                    self._anon -= 1
                elif self._last_key is not None:
                    key = self._last_key
                else:
                    continue  # arguments for no call at all: nothing to attach them to
            self._last_key = key
            call = self._calls.get(key)
            if call is not None and name and tc.id and call.id and tc.id != call.id:
                call = None  # the index was reused for a new call
                del self._calls[key]
            if call is not None:
                if args:
                    ev = ToolArgsDelta(call.index, args)
                    (later if call.index in started_now else before).append(ev)
                continue
            pend = self._pending.get(key)
            if not name:
                if pend is None:
                    pend = self._pending[key] = [tc.id or "", ""]
                if tc.id:
                    pend[0] = tc.id
                if args:
                    pend[1] += args
                continue
            call_id = tc.id or (pend[0] if pend is not None else "")
            if pend is not None:
                args = pend[1] + (args or "")
                del self._pending[key]
            call = self._calls[key] = _Call(self._next_index, call_id)
            self._next_index += 1
            started_now.add(call.index)
            later.append(ToolCallStart(call.index, call_id, name))
            if args:
                later.append(ToolArgsDelta(call.index, args))
        return later


def validate_completion(body: bytes) -> _Chunk:
    """A whole non-streaming `chat.completion`, checked. Raises Malformed, or ErrorBody for an
    error body (its message cleaned for a client)."""
    try:
        chunk = _DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Malformed(f"upstream body is not a chat completion: {exc}") from None
    err = _chunk_error(chunk)
    if err is not None:
        raise ErrorBody(f"upstream returned an error instead of a completion: {err.message}")
    if chunk.object is not None and chunk.object != "chat.completion":
        raise Malformed(f"upstream body is not a chat completion: object is {chunk.object!r}")
    if not chunk.choices:
        raise Malformed("upstream body is not a chat completion: no choices")
    if chunk.choices[0].message is None:
        raise Malformed("upstream body is not a chat completion: choices[0] has no message")
    return chunk


THINK_TAG = "<think>"


def strip_think(payload: bytes) -> bytes:
    """A chunk whose reasoning starts with a stray `<think>` (see the module docstring), without
    it: re-encoded, for a surface that relays the upstream's own chunks. Rare (once per answer at
    most), so a plain JSON round trip; the chunk's other fields and their order are kept."""
    doc = json.loads(payload)
    delta = doc["choices"][0]["delta"]
    for key in ("reasoning", "reasoning_content"):
        text = delta.get(key)
        if isinstance(text, str) and text.startswith(THINK_TAG):
            delta[key] = text[len(THINK_TAG):]
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def decode_completion(body: bytes) -> list[Event]:
    """A whole non-streaming `chat.completion` -> the events a stream of it would have given.

    Raises Malformed or ErrorBody (both ValueError, with the reason) on a body that is not a
    completion: malformed JSON, an error body, no choices, or a first choice without a message.
    A completion without a finish_reason ends with `Finish("stop")` (a whole body is by
    definition finished).
    """
    chunk = validate_completion(body)
    dec = ChunkDecoder()
    events = dec._events(chunk, streaming=False)
    if not dec.finished:
        events.append(dec._finish("stop", None))
    return events


class _Embeddings(msgspec.Struct):
    object: Union[str, None] = None
    data: Union[list[dict], None] = None
    error: Union[_ErrorInfo, str, None] = None
    message: Union[str, None] = None
    type: Union[str, None] = None
    code: Union[int, str, None] = None


_EMBEDDINGS = msgspec.json.Decoder(_Embeddings)


def validate_embeddings(body: bytes) -> _Embeddings:
    """A whole `/embeddings` answer, checked: an object with a `data` list of objects."""
    try:
        doc = _EMBEDDINGS.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise Malformed(f"upstream body is not an embeddings list: {exc}") from None
    if doc.error is not None or doc.object == "error":
        err = _chunk_error(doc)  # the same error shapes as a chat chunk
        raise ErrorBody(f"upstream returned an error instead of embeddings: {err.message if err else 'error'}")
    if doc.data is None:
        raise Malformed("upstream body is not an embeddings list: no data")
    return doc
