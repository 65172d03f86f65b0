"""Canonical events -> Ollama's NDJSON stream (`/api/chat`, `/api/generate`): a pure state machine.

Theory of operation
-------------------
Ollama streams one JSON object a line (`application/x-ndjson`), each a piece of the answer, and
ends with one object carrying `done: true`. What the real clients hold it to (their sources):

* every object of a chat stream has `message` with `role` (the Python library's `ChatResponse`
  requires both, the last object too); a generate stream has `response` instead;
* one object a line for every line reader: U+0085, U+2028 and U+2029, which Python's
  `splitlines` (httpx's `iter_lines`) treats as line breaks, are written escaped;
* no blank line, ever: the Python library runs `json.loads` on every line (a keep-alive blank
  line would crash it), so while the upstream is silent nothing is written at all;
* the last object has `done: true`, `done_reason` (`stop` or `length`), `prompt_eval_count` (when
  the upstream reported it: never invented), `eval_count` and the durations as integer
  nanoseconds (`total_duration`, `load_duration`, `prompt_eval_duration`, `eval_duration`),
  measured by the gateway and handed to `finish`; the JavaScript library throws on a stream
  that ends without `done: true`;
* a failure after the answer began ends the stream with one `{"error": "..."}` object and no
  `done` object, so no client mistakes it for a complete answer (both libraries raise on it);
* tool call `arguments` are JSON objects, as Ollama sends them, so a call is held until its
  arguments are complete (the finish, or the end) and goes out whole, in one object, as Ollama's
  own parser emits it. Arguments that are not a JSON object (a generation cut off by its
  length) cannot be given as one: the stream then ends with an error, not a made-up call.

Transitions
-----------
    event            open                              ended (after finish/fail)
    TextDelta        one object (content / response)   nothing
    ReasoningDelta   one object (thinking)             nothing
    ToolCallStart    held (a new call)                 nothing
    ToolArgsDelta    held (appended to its call)       nothing
    Usage            counts kept                       nothing
    Finish           held calls written; reason kept   nothing
    UpstreamError    the error object; -> ended        nothing
    finish(t)        held calls, the done object; -> ended
    fail(code, msg)  the error object; -> ended

`created_at` on every object comes from the `clock` the caller gives (a function returning the
RFC 3339 timestamp: `wall_clock` in the gateway, a constant in tests), so this stays pure. The
durations are the caller's too: `durations()` computes them from the request record's figures.
"""

from __future__ import annotations

import time
from typing import Callable, Literal

import msgspec

from ... import canonical as c
from ..one_line import one_line

__all__ = ["Durations", "NdjsonEncoder", "ToolCalls", "done_reason", "durations", "wall_clock"]

_msgspec_encode = msgspec.json.Encoder().encode


def dump(obj: object) -> bytes:
    """JSON that stays one line for every line reader (surfaces/one_line.py)."""
    return one_line(_msgspec_encode(obj))


_TextDelta, _ReasoningDelta, _Usage = c.TextDelta, c.ReasoningDelta, c.Usage
_ToolArgsDelta, _ToolCallStart, _Finish, _UpstreamError = c.ToolArgsDelta, c.ToolCallStart, c.Finish, c.UpstreamError


class Durations(msgspec.Struct, frozen=True):
    """Nanoseconds, measured by the gateway: start -> the upstream answering (load: queueing,
    connecting, a backend starting) -> the first token (prompt evaluation) -> the end."""

    total: int
    load: int
    prompt_eval: int
    eval: int


def durations(elapsed: float, queue_wait: float | None, load_wait: float | None,
              ttft: float | None) -> Durations:
    """Seconds since arrival (now), waiting for a slot, of that waiting for the model's server to
    start (a managed backend, lifecycle/), and from arrival to the first token (None: none) ->
    Ollama's four durations in nanoseconds: load is the server's start, prompt_eval from the slot
    to the first token (the prefill), eval from the first token on. Without a first token (a
    whole answer from a backend that answers whole, whose headers come with its last byte) the
    split is not known and all of it after the slot is eval: a client's eval_count / eval_duration
    is then the answer's real rate, never a division by zero."""
    admitted = min(queue_wait or 0.0, elapsed)
    load = min(load_wait or 0.0, admitted)
    first = min(max(ttft, admitted), elapsed) if ttft is not None else admitted
    ns = 1_000_000_000
    return Durations(int(elapsed * ns), int(load * ns), int((first - admitted) * ns), int((elapsed - first) * ns))


def _wall_clock() -> Callable[[], str]:
    """RFC 3339, UTC, as Go writes a time.Time, to the millisecond (the nanosecond digits are the
    millisecond's): one text per millisecond, so a stream's lines mostly share the one before's
    (and the encoder its bytes). A closure: it runs once per line."""
    time_ns, gmtime, strftime = time.time_ns, time.gmtime, time.strftime
    last = [-1, -1]  # ms, second
    text = ["", ""]  # the second's text, the text

    def clock() -> str:
        ms = time_ns() // 1_000_000
        if ms != last[0]:
            sec, frac = divmod(ms, 1000)
            if sec != last[1]:
                last[1], text[0] = sec, strftime("%Y-%m-%dT%H:%M:%S", gmtime(sec))
            last[0], text[1] = ms, f"{text[0]}.{frac:03d}000000Z"
        return text[1]

    return clock


wall_clock = _wall_clock()


def done_reason(finish: str | None) -> str:
    return "length" if finish == "length" else "stop"


class BadArguments(ValueError):
    pass


class ToolCalls:
    """Tool calls held until their arguments are complete, then given out as Ollama's objects."""

    def __init__(self, id_prefix: str) -> None:
        self.id_prefix = id_prefix
        self.held: dict[int, list] = {}  # index -> [id, name, [fragments]]
        self.count = 0
        self.dropped = 0  # argument fragments for a call never started

    def start(self, ev: c.ToolCallStart) -> None:
        self.held[ev.index] = [ev.id, ev.name, []]

    def args(self, ev: c.ToolArgsDelta) -> None:
        call = self.held.get(ev.index)
        if call is not None:
            call[2].append(ev.fragment)
        elif ev.fragment:
            self.dropped += 1

    def take(self) -> list[dict]:
        """The held calls as Ollama tool call objects; raises BadArguments for a call whose
        arguments are not a JSON object."""
        out = []
        for index in sorted(self.held):
            call_id, name, fragments = self.held[index]
            text = "".join(fragments).strip() or "{}"
            try:
                arguments = msgspec.json.decode(text)
            except msgspec.DecodeError:
                arguments = None
            if not isinstance(arguments, dict):
                raise BadArguments(f"the model's call to tool {name!r} has arguments that are not a JSON object")
            out.append({
                "id": call_id or f"{self.id_prefix}{self.count}",
                "function": {"index": self.count, "name": name, "arguments": arguments},
            })
            self.count += 1
        self.held.clear()
        return out


class NdjsonEncoder:
    def __init__(self, *, model: str, endpoint: Literal["chat", "generate"] = "chat",
                 id_prefix: str = "call_", clock: Callable[[], str] = wall_clock,
                 hide_reasoning: bool = False) -> None:
        self.endpoint = endpoint
        # `think: false` and a backend that thinks anyway (it cannot always be told not to): the
        # reasoning is dropped from the answer, and still counted (eval_count: it was generated)
        self.hide_reasoning = hide_reasoning
        self.hidden = 0  # reasoning pieces dropped
        self.model = model
        self.clock = clock
        self.ended = False
        self.failed = False  # ended with an error object, not a done one
        self.finish_reason: str | None = None
        self.usage = c.NO_USAGE
        self.deltas = 0  # generated pieces: eval_count when the upstream reports none
        self.tools = ToolCalls(id_prefix)
        self._stamp_text: str | None = None
        self._stamp_bytes = b""
        self._head = b'{"model":' + dump(model) + b',"created_at":"'
        if endpoint == "chat":
            self._text = b'","message":{"role":"assistant","content":'
            self._think = b'","message":{"role":"assistant","content":"","thinking":'
            self._tail = b'},"done":false}\n'
        else:
            self._text = b'","response":'
            self._think = b'","response":"","thinking":'
            self._tail = b',"done":false}\n'

    @property
    def dropped_tool_args(self) -> int:
        return self.tools.dropped

    def _line(self, obj: dict) -> bytes:
        return dump({"model": self.model, "created_at": self.clock(), **obj}) + b"\n"

    def feed(self, ev: c.Event) -> bytes:
        if self.ended:
            return b""
        kind = type(ev)  # the hot path: one text delta per upstream chunk
        if kind is _TextDelta or kind is _ReasoningDelta:
            # `kind` (one type() call on the hot path) narrows nothing for mypy; ev is one of the two
            text = ev.text  # type: ignore[union-attr]
            if not text:
                return b""
            self.deltas += 1
            if kind is _ReasoningDelta and self.hide_reasoning:
                self.hidden += 1
                return b""
            stamp = self.clock()
            if stamp is not self._stamp_text:  # the wall clock gives the same text within a millisecond
                self._stamp_text, self._stamp_bytes = stamp, stamp.encode()
            body = _msgspec_encode(text) if text.isascii() else dump(text)
            return b"".join((self._head, self._stamp_bytes, self._text if kind is _TextDelta else self._think,
                             body, self._tail))
        if type(ev) is _Usage:
            self.usage = ev.over(self.usage)
        elif type(ev) is _ToolArgsDelta:
            self.deltas += 1
            self.tools.args(ev)
        elif type(ev) is _ToolCallStart:
            self.tools.start(ev)
        elif type(ev) is _Finish:
            if self.finish_reason is None:
                self.finish_reason = ev.reason
            return self._calls()
        elif type(ev) is _UpstreamError:
            return self.fail("api_error", ev.message)
        return b""

    def _calls(self) -> bytes:
        if not self.tools.held:
            return b""
        try:
            calls = self.tools.take()
        except BadArguments as err:
            return self.fail("api_error", str(err))
        if self.endpoint != "chat":
            return b""  # /api/generate has no tool calls to give
        return self._line({"message": {"role": "assistant", "content": "", "tool_calls": calls}, "done": False})

    @property
    def eval_count(self) -> int:
        out = self.usage.output_tokens
        return out if out is not None else self.deltas

    def final_fields(self, t: Durations) -> dict:
        fields: dict = {"done": True, "done_reason": done_reason(self.finish_reason),
                        "total_duration": t.total, "load_duration": t.load}
        if self.usage.input_tokens is not None:
            fields["prompt_eval_count"] = self.usage.input_tokens
        fields["prompt_eval_duration"] = t.prompt_eval
        fields["eval_count"] = self.eval_count
        fields["eval_duration"] = t.eval
        return fields

    def finish(self, t: Durations = Durations(0, 0, 0, 0)) -> bytes:
        """The held calls and the `done` object (or nothing, if the stream has already ended)."""
        if self.ended:
            return b""
        out = self._calls()
        if self.ended:  # the held calls could not be given: the stream ended with an error
            return out
        self.ended = True
        empty = {"message": {"role": "assistant", "content": ""}} if self.endpoint == "chat" else {"response": ""}
        return out + self._line({**empty, **self.final_fields(t)})

    def fail(self, code: str, message: str) -> bytes:
        """One `{"error"}` object; Ollama's errors have only text (`code` is the skeleton's)."""
        if self.ended:
            return b""
        self.ended = self.failed = True
        return dump({"error": message}) + b"\n"
