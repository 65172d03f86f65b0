"""The OpenAI Responses SSE encoder: canonical events in, SSE frames out. One state machine, no I/O.

Theory of operation
===================
Modelled on h11, like the Anthropic encoder (surfaces/anthropic/stream.py): this module owns the
whole grammar of a streamed Responses answer and nothing else. The I/O layer feeds it canonical
events and writes the bytes it returns; the encoder never touches a socket, a clock or a task.

    enc = ResponsesStreamEncoder(base=base_response(...), names=parsed.names, sealer=sealer_or_None)
    for event in events:          # from ChunkDecoder (optionally through a StopMatcher)
        write(enc.feed(event))    # zero or more complete frames, at once (unbuffered)
    write(enc.finish())           # the upstream ended normally
    # or, on failure after the headers were sent:  write(enc.fail(code, message))
    enc.response()                # the Response object as it stands (what a plain request returns)

A frame is `event: <type>\\ndata: <json>\\n\\n`, the JSON's `type` equal to `<type>`, and every
frame carries `sequence_number`: 0, 1, 2, ... in emission order, no gaps. The grammar of a whole
answer is

    response.created response.in_progress item* response.completed

with, per output item (at output_index 0, 1, 2, ... in emission order, one open at a time):

    reasoning:      output_item.added content_part.added reasoning_text.delta+
                    reasoning_text.done content_part.done output_item.done
      (summary asked: output_item.added reasoning_summary_part.added
                    reasoning_summary_text.delta+ reasoning_summary_text.done
                    reasoning_summary_part.done output_item.done)
    message:        output_item.added content_part.added output_text.delta+
                    output_text.done content_part.done output_item.done
    function_call:  output_item.added function_call_arguments.delta* function_call_arguments.done
                    output_item.done

or, after a failure, `... response.failed` (the open item is left unfinished, as OpenAI does) and
nothing more. There is no `[DONE]` in this dialect. `response.completed` is sent for an answer cut
short by max_output_tokens too, its `status` then `incomplete` (as vLLM does; the openai SDK's
stream helper and Codex both require `response.completed` to finish a stream).

States and transitions
----------------------
States: IDLE (nothing sent), OPEN (created + in_progress sent, no item open), REASONING / MESSAGE /
CALL (that kind of item open), ENDED (completed or failed sent). `_TRANSITIONS` is the table the
code dispatches on:

    state \\ event   ReasoningDelta      TextDelta             ToolCallStart     ToolArgsDelta(i)
    OPEN            open reasoning      open message          open call         drop
    REASONING       delta               close, open message   close, open call  drop
    MESSAGE         close, open reason  delta                 close, open call  drop
    CALL(j)         close, open reason  close, open msg       close, open call  delta if i == j, else drop

    open X = output_item.added (+ content_part.added for reasoning and message), then the delta.
    close  = the item's .done events with its whole text / arguments, then output_item.done with
             the complete item, which is also appended to the response's `output`.

Every other event:

    any event in IDLE     -> response.created + response.in_progress first, then as above.
    Usage                 -> remember the counts; no frame.
    Finish                -> remember the finish reason (the first Finish wins); no frame.
    UpstreamError(kind,m) -> fail("rate_limit_exceeded" for overloaded_error, else "server_error").
    finish()              -> [start if IDLE], close the open item (status incomplete when the answer
                             was cut short), response.completed with the whole Response; ENDED.
    fail(code, message)   -> [start if IDLE], response.failed with status failed, the error and
                             the items finished so far; ENDED.
    anything in ENDED     -> b"".

Choices (and why)
-----------------
* Empty deltas never open an item and emit nothing.
* Reasoning after text or a call opens a NEW reasoning item, text after a call a new message.
* Whitespace after a call that vLLM streams before the call's last argument bytes (vllm PR #45287)
  is the chunk decoder's to hold (upstream/decode.py): here text after a call closes it.
* Arguments for a call whose item is no longer open are dropped (counted in `dropped_tool_args`):
  no upstream interleaves calls, and an item that is done cannot grow.
* Function names come back un-flattened: `names` maps the upstream name to (namespace, name).
* With a sealer (the client asked for `reasoning.encrypted_content`), each finished reasoning item
  carries its text sealed (sealed.py).
* `summary=True` (the operator's `responses.reasoning_as_summary`, and the client asked for
  `reasoning.summary`): the gateway has no summarizer, so the reasoning text is given as the
  item's one `summary_text` part, streamed as `reasoning_summary_text.delta`, and `content` stays
  empty (the same text twice would be shown twice by a client that reads both). By default
  (False) the raw reasoning is `content` whatever the client asked, as vLLM's own Responses
  server answers (vLLM 0.32: responses/streaming_events.py and utils.py: `summary: []`,
  `reasoning_text` deltas).
* usage.output_tokens_details.reasoning_tokens is the upstream's own count when it reports one
  (vLLM: completion_tokens_details.reasoning_tokens). Else `reasoning_tokens` counts reasoning
  deltas: one token each where the upstream streams a token per chunk (llama.cpp, Ollama); a
  whole (non-streamed) upstream answer has its reasoning as one text: the I/O layer sets
  `counts_reasoning = False` and the figure is 0, as for an upstream that reports none.
"""

from __future__ import annotations

import re
from typing import Callable

import msgspec

from ...canonical import (
    Event,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolArgsDelta,
    ToolCallStart,
    UpstreamError,
    Usage,
    NO_USAGE,
)
from . import assemble as r
from .items import is_response_id, item_ids
from .sealed import ReasoningSealer

__all__ = ["ResponsesStreamEncoder"]

_encode = msgspec.json.Encoder().encode

IDLE = "IDLE"
OPEN = "OPEN"
REASONING = "REASONING"
MESSAGE = "MESSAGE"
CALL = "CALL"
ENDED = "ENDED"

# actions
NEW = "new"
DELTA = "delta"
SWITCH = "switch"
DROP = "drop"
ARGS = "args"

_TRANSITIONS: dict[tuple[str, type], str] = {
    (OPEN, ReasoningDelta): NEW,
    (OPEN, TextDelta): NEW,
    (OPEN, ToolCallStart): NEW,
    (OPEN, ToolArgsDelta): DROP,
    (REASONING, ReasoningDelta): DELTA,
    (REASONING, TextDelta): SWITCH,
    (REASONING, ToolCallStart): SWITCH,
    (REASONING, ToolArgsDelta): DROP,
    (MESSAGE, ReasoningDelta): SWITCH,
    (MESSAGE, TextDelta): DELTA,
    (MESSAGE, ToolCallStart): SWITCH,
    (MESSAGE, ToolArgsDelta): DROP,
    (CALL, ReasoningDelta): SWITCH,
    (CALL, TextDelta): SWITCH,
    (CALL, ToolCallStart): SWITCH,
    (CALL, ToolArgsDelta): ARGS,
}
_ITEM_FOR = {ReasoningDelta: REASONING, TextDelta: MESSAGE, ToolCallStart: CALL}
_DELTA_TYPE = {
    REASONING: b"response.reasoning_text.delta",
    MESSAGE: b"response.output_text.delta",
    CALL: b"response.function_call_arguments.delta",
}
_SUMMARY_DELTA = b"response.reasoning_summary_text.delta"
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}
_VALID_CALL_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}").fullmatch


def _frame(kind: str, body: dict) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _encode(body) + b"\n\n"


class ResponsesStreamEncoder:
    """Encodes one answer as Responses SSE. See the module docstring for the grammar and choices.

    Constructor: `base` (the envelope from response.base_response), `names` (upstream tool name
    -> (namespace, name)), `sealer` (None unless encrypted reasoning was asked for), `new_id`
    (id factory, for tests). Readable state: `state`, `started`, `ended`, `failed`, `seq` (the
    next sequence number), `prompt_tokens` / `output_tokens` / `cached_input_tokens`,
    `finish_reason`, `dropped_tool_args`, `output` (finished items)."""

    __slots__ = ("state", "seq", "base", "names", "sealer", "output", "finish_reason", "failed",
                 "usage", "dropped_tool_args", "summary", "reasoning_tokens", "counts_reasoning",
                 "_new_id", "_item_id", "_index", "_parts", "_call", "_call_index",
                 "_head", "_call_ids", "_error")

    def __init__(self, *, base: dict, names: dict[str, tuple[str | None, str]] | None = None,
                 sealer: ReasoningSealer | None = None, new_id: Callable[[str], str] | None = None,
                 summary: bool = False) -> None:
        self.state = IDLE
        self.seq = 0
        self.base = base
        self.names = names or {}
        self.sealer = sealer
        self.output: list[dict] = []
        self.finish_reason: str | None = None
        self.failed = False
        self.usage = NO_USAGE
        self.dropped_tool_args = 0
        self.summary = summary  # reasoning given as its summary (module docstring)
        self.reasoning_tokens = 0  # reasoning deltas seen: the gateway's own count
        self.counts_reasoning = True  # the deltas are tokens (a stream), see the module docstring
        # item ids name their response (items.py), so an item_reference finds them
        self._new_id = new_id or (item_ids(base["id"]) if is_response_id(base.get("id")) else r.new_id)
        self._item_id = ""
        self._index = -1
        self._parts: list[str] = []  # the open item's text or argument fragments
        self._call: tuple[str, str | None, str] | None = None  # (call_id, namespace, name)
        self._call_index = -1  # canonical index of the open call
        self._head = b""  # the open item's delta frame up to its sequence number
        self._call_ids: set[str] = set()
        self._error: dict | None = None

    @property
    def started(self) -> bool:
        return self.state is not IDLE

    @property
    def ended(self) -> bool:
        return self.state is ENDED

    # the upstream's counts so far (canonical.Usage.over folds each report in)
    @property
    def prompt_tokens(self) -> int | None:  # as the upstream reported (cached included)
        return self.usage.input_tokens

    @property
    def output_tokens(self) -> int | None:
        return self.usage.output_tokens

    @property
    def cached_input_tokens(self) -> int | None:
        return self.usage.cached_input_tokens


    # -- the API -----------------------------------------------------------------------------

    def feed(self, event: Event) -> bytes:
        state = self.state
        if type(event) is TextDelta and state is MESSAGE:  # the hot path: the open message's delta
            return self._delta(event.text) if event.text else b""
        if state is ENDED:
            return b""
        kind = type(event)
        if type(event) is Usage:
            self.usage = event.over(self.usage)
            return b""
        if type(event) is UpstreamError:
            return self.fail("rate_limit_exceeded" if event.kind == "overloaded_error" else "server_error",
                             event.message)
        head = b""
        if state is IDLE:
            head = self._start()
            state = OPEN
        if type(event) is Finish:
            if self.finish_reason is None:
                self.finish_reason = event.reason
            return head
        call = None
        if type(event) is ToolCallStart:
            call = event
            payload = ""
        else:
            payload = event.fragment if type(event) is ToolArgsDelta else event.text
            if not payload:
                return head
        if kind is ReasoningDelta:
            self.reasoning_tokens += 1
        action = _TRANSITIONS[(state, kind)]
        if action is DELTA:
            return head + self._delta(payload)
        if action is ARGS:
            if type(event) is ToolArgsDelta and event.index == self._call_index:
                return head + self._delta(payload)
            self.dropped_tool_args += 1
            return head
        if action is DROP:
            self.dropped_tool_args += 1
            return head
        out = head + self._close("completed") if action is not NEW else head
        return out + self._open(_ITEM_FOR[kind], call, payload)

    def finish(self) -> bytes:
        if self.state is ENDED:
            return b""
        out = self._start() if self.state is IDLE else b""
        incomplete = _INCOMPLETE.get(self.finish_reason or "")
        out += self._close("incomplete" if incomplete else "completed")
        self.state = ENDED
        return out + self._emit("response.completed", {"response": self.response()})

    def fail(self, code: str, message: str) -> bytes:
        if self.state is ENDED:
            return b""
        out = self._start() if self.state is IDLE else b""
        self.state = ENDED
        self.failed = True
        self._error = {"code": code, "message": message}
        return out + self._emit("response.failed", {"response": self.response()})

    def response(self) -> dict:
        """The Response object as it stands: in_progress while streaming, then final."""
        resp = dict(self.base)
        resp["output"] = list(self.output)
        if self.failed:
            resp["status"] = "failed"
            resp["error"] = self._error
        elif self.state is ENDED:
            reason = _INCOMPLETE.get(self.finish_reason or "")
            resp["status"] = "incomplete" if reason else "completed"
            resp["incomplete_details"] = {"reason": reason} if reason else None
        reasoning = self.usage.reasoning_tokens  # the upstream's own count (vLLM), else ours
        if reasoning is None:
            reasoning = self.reasoning_tokens if self.counts_reasoning else 0
        resp["usage"] = r.usage_object(self.prompt_tokens, self.output_tokens, self.cached_input_tokens, reasoning)
        return resp

    # -- internals ---------------------------------------------------------------------------

    def _emit(self, kind: str, body: dict) -> bytes:
        body = {"type": kind, "sequence_number": self.seq, **body}
        self.seq += 1
        return _frame(kind, body)

    def _start(self) -> bytes:
        self.state = OPEN
        snapshot = dict(self.base)  # status in_progress, output []
        return (self._emit("response.created", {"response": snapshot})
                + self._emit("response.in_progress", {"response": snapshot}))

    def _delta(self, payload: str) -> bytes:
        # The hot path (one call per streamed token): a fixed head per item, the sequence number,
        # the payload as a JSON string; the same JSON as encoding the event's dict.
        self._parts.append(payload)
        seq = self.seq
        self.seq = seq + 1
        return b"%s%d,\"delta\":%s}\n\n" % (self._head, seq, _encode(payload))

    def _open(self, item: str, call: ToolCallStart | None, payload: str) -> bytes:
        """Open an output item of kind `item` (a function call for `call`), `payload` its first
        delta ("" for none)."""
        self._index += 1
        self.state = item
        self._parts = []
        idx = self._index
        if item is REASONING:
            iid = self._item_id = self._new_id("rs_")
            added = {"id": iid, "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
        elif item is MESSAGE:
            iid = self._item_id = self._new_id("msg_")
            added = {"id": iid, "type": "message", "role": "assistant", "status": "in_progress", "content": []}
        else:
            assert call is not None  # a CALL item opens for its ToolCallStart
            iid = self._item_id = self._new_id("fc_")
            call_id = call.id
            if not (call_id and _VALID_CALL_ID(call_id)) or call_id in self._call_ids:
                call_id = self._new_id("call_")
            self._call_ids.add(call_id)
            ns, name = self.names.get(call.name, (None, call.name))
            self._call = (call_id, ns, name)
            self._call_index = call.index
            added = r.function_call_item(iid, call_id, name, ns, "", "in_progress")
        out = self._emit("response.output_item.added", {"output_index": idx, "item": added})
        if item is REASONING and self.summary:
            out += self._emit("response.reasoning_summary_part.added",
                              {"item_id": iid, "output_index": idx, "summary_index": 0,
                               "part": {"type": "summary_text", "text": ""}})
        elif item is REASONING:
            out += self._emit("response.content_part.added", {"item_id": iid, "output_index": idx, "content_index": 0,
                                                               "part": {"type": "reasoning_text", "text": ""}})
        elif item is MESSAGE:
            out += self._emit("response.content_part.added", {"item_id": iid, "output_index": idx, "content_index": 0,
                                                               "part": r.output_text_part("")})
        summary = item is REASONING and self.summary
        dtype = _SUMMARY_DELTA if summary else _DELTA_TYPE[item]
        content = b'"summary_index":0,' if summary else b'"content_index":0,' if item is not CALL else b""
        logprobs = b'"logprobs":[],' if item is MESSAGE else b""
        self._head = b'event: %s\ndata: {"type":"%s","item_id":"%s","output_index":%d,%s%s"sequence_number":' % (
            dtype, dtype, iid.encode(), idx, content, logprobs)
        if payload:
            out += self._delta(payload)
        return out

    def _close(self, status: str) -> bytes:
        state = self.state
        if state is OPEN or state is IDLE:
            return b""
        iid, idx = self._item_id, self._index
        text = "".join(self._parts)
        self._parts = []
        ref = {"item_id": iid, "output_index": idx}
        if state is REASONING:
            sealed = self.sealer.seal(text) if self.sealer is not None else None
            item = r.reasoning_item(iid, text, status, sealed, summary=self.summary)
            if self.summary:
                part = {"type": "summary_text", "text": text}
                out = (self._emit("response.reasoning_summary_text.done", {**ref, "summary_index": 0, "text": text})
                       + self._emit("response.reasoning_summary_part.done", {**ref, "summary_index": 0, "part": part}))
            else:
                part = {"type": "reasoning_text", "text": text}
                out = (self._emit("response.reasoning_text.done", {**ref, "content_index": 0, "text": text})
                       + self._emit("response.content_part.done", {**ref, "content_index": 0, "part": part}))
        elif state is MESSAGE:
            item = r.message_item(iid, text, status)
            out = (self._emit("response.output_text.done", {**ref, "content_index": 0, "text": text, "logprobs": []})
                   + self._emit("response.content_part.done", {**ref, "content_index": 0, "part": r.output_text_part(text)}))
        else:
            assert self._call is not None  # set when the call's item opened (_open)
            call_id, ns, name = self._call
            text = text or "{}"  # a call that streamed no arguments takes none: still JSON
            item = r.function_call_item(iid, call_id, name, ns, text, status)
            self._call = None
            self._call_index = -1
            out = self._emit("response.function_call_arguments.done", {**ref, "name": name, "arguments": text})
        self.output.append(item)
        self.state = OPEN
        return out + self._emit("response.output_item.done", {"output_index": idx, "item": item})
