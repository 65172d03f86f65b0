"""Turn a token plan into the engine's output steps, applying the request's limits.

One `Step` is what one engine iteration hands the server: a bit of text (or a tool-call delta),
the number of tokens it cost, and, on the last one, why generation finished. The rules mirror
vLLM's engine:

- `max_tokens` counts every generated token (reasoning, content, tool-call fragments) and ends
  with `length` in the same step as the last token;
- stop strings are matched against content only (never reasoning), the output is cut before
  the match (or after it with `include_stop_str_in_output`), and, as vLLM's detokenizer does,
  the last `len(longest stop) - 1` characters are held back while streaming so a stop string
  split across tokens never leaks;
- a natural end (EOS) is a step of its own carrying no token and `finish="stop"`
  (or `"tool_calls"` after a tool call).

`Abort` (drop the connection) and `Fail` (send an error chunk) are test faults injected after
a number of tokens. Pure: no I/O, no clocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .script import Plan

ARGUMENT_FRAGMENT_CHARS = 8


@dataclass(frozen=True)
class ToolDelta:
    index: int
    name: str | None = None  # set on the first delta of a call
    arguments: str | None = None


@dataclass(frozen=True)
class Step:
    reasoning: str | None = None
    content: str | None = None
    tool_calls: tuple[ToolDelta, ...] = ()
    finish: str | None = None
    stop_reason: str | int | None = None
    tokens: int = 0

    @property
    def has_payload(self) -> bool:
        return bool(self.reasoning) or bool(self.content) or bool(self.tool_calls)


@dataclass(frozen=True)
class Abort:
    """Close the connection abruptly: no finish, no terminator."""

    after_tokens: int


@dataclass(frozen=True)
class Fail:
    """Report an engine error in-band, the way the flavour does mid-stream."""

    after_tokens: int


Event = Step | Abort | Fail


@dataclass(frozen=True)
class Limits:
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    include_stop: bool = False
    fail_after: int | None = None
    error_after: int | None = None
    stop_token: int | None = None
    tool_finish: str = "tool_calls"
    # True: name first, then argument fragments (vLLM). False: whole call in one delta (Ollama).
    stream_tool_args: bool = True
    # Ollama sends finish_reason on an empty chunk of its own after the last token.
    separate_finish: bool = False
    # split=1: last content and first tool delta share a step; finish rides on the last payload.
    merge: bool = False


def parse_stop(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list):
        return tuple(s for s in value if isinstance(s, str) and s)
    return ()


def fragments(text: str, size: int = ARGUMENT_FRAGMENT_CHARS) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


@dataclass
class _Raw:
    kind: str  # reasoning | content | tool
    text: str = ""
    delta: ToolDelta | None = None
    tokens: int = 1


def _raw_tokens(plan: Plan, stream_tool_args: bool) -> list[_Raw]:
    raw = [_Raw("reasoning", t) for t in plan.reasoning]
    raw += [_Raw("content", t) for t in plan.content]
    call = plan.tool_call
    if call is not None:
        pieces = fragments(call.arguments)
        if stream_tool_args:
            raw.append(_Raw("tool", delta=ToolDelta(0, name=call.name)))
            raw += [_Raw("tool", delta=ToolDelta(0, arguments=p)) for p in pieces]
        else:
            whole = ToolDelta(0, name=call.name, arguments=call.arguments)
            raw.append(_Raw("tool", delta=whole, tokens=1 + len(pieces)))
    return raw


@dataclass
class _StopFilter:
    stops: tuple[str, ...]
    include: bool
    text: str = ""
    sent: int = 0
    holdback: int = field(init=False)

    def __post_init__(self) -> None:
        longest = max((len(s) for s in self.stops), default=0)
        self.holdback = 0 if self.include or not longest else longest - 1

    def feed(self, piece: str) -> tuple[str, str | None]:
        """Add generated text; return (text safe to send now, matched stop string or None).
        Only the unsent text and the last `longest` characters are kept: a whole generation
        kept and appended to was quadratic (a 6 MB answer took 8 s to plan)."""
        longest = max((len(s) for s in self.stops), default=0)
        start = max(0, len(self.text) - longest)
        self.text += piece
        best: tuple[int, str] | None = None
        for stop in self.stops:
            at = self.text.find(stop, start)
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        if best is not None:
            at, stop = best
            end = at + len(stop) if self.include else at
            out = self.text[self.sent : max(end, self.sent)]
            self.sent = max(end, self.sent)
            return out, stop
        safe = len(self.text) - self.holdback
        out = self.text[self.sent : safe] if safe > self.sent else ""
        self.sent = max(self.sent, safe)
        keep = max(0, min(self.sent, len(self.text) - longest))
        if keep:
            self.text, self.sent = self.text[keep:], self.sent - keep
        return out, None

    def flush(self) -> str:
        out = self.text[self.sent :]
        self.sent = len(self.text)
        return out


def _generate(plan: Plan, limits: Limits) -> list[Event]:
    raw = _raw_tokens(plan, limits.stream_tool_args)
    stop_filter = _StopFilter(limits.stop, limits.include_stop)
    events: list[Event] = []
    emitted = 0

    def fault() -> Event | None:
        if limits.fail_after is not None and emitted >= limits.fail_after:
            return Abort(emitted)
        if limits.error_after is not None and emitted >= limits.error_after:
            return Fail(emitted)
        return None

    for i, token in enumerate(raw):
        if (f := fault()) is not None:
            return events + [f]
        emitted += token.tokens
        if token.kind == "reasoning":
            step = Step(reasoning=token.text, tokens=token.tokens)
        elif token.kind == "content":
            text, matched = stop_filter.feed(token.text)
            step = Step(content=text, tokens=token.tokens)
            if matched is not None:
                return events + [replace(step, finish="stop", stop_reason=matched)]
        else:
            assert token.delta is not None  # a tool token: _raw_tokens gives each its delta
            # Content held back for a possible stop string is released when the call starts.
            held = stop_filter.flush()
            step = Step(content=held or None, tool_calls=(token.delta,), tokens=token.tokens)
        more = i + 1 < len(raw)
        if limits.max_tokens is not None and emitted >= limits.max_tokens and more:
            held = stop_filter.flush()
            if held:
                step = replace(step, content=(step.content or "") + held)
            return events + [replace(step, finish="length")]
        events.append(step)

    if (f := fault()) is not None:
        return events + [f]
    if plan.tool_call is not None:
        finish = "stop" if plan.named_tool_choice else limits.tool_finish
        return events + [Step(finish=finish, stop_reason=limits.stop_token)]
    # EOS decodes to nothing; whatever the stop filter held back goes out with it.
    return events + [Step(content=stop_filter.flush(), finish="stop", stop_reason=limits.stop_token)]


def _merge(events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for event in events:
        prev = out[-1] if out else None
        if isinstance(event, Step) and isinstance(prev, Step):
            first_tool = any(d.name for d in event.tool_calls) and not prev.tool_calls
            if first_tool and prev.content and prev.finish is None:
                content = prev.content + (event.content or "")
                out[-1] = replace(event, content=content, tokens=prev.tokens + event.tokens)
                continue
            bare = not event.reasoning and not event.tool_calls and not event.tokens
            if event.finish is not None and bare and prev.finish is None:
                content = (prev.content or "") + (event.content or "")
                out[-1] = replace(
                    prev,
                    content=content if content or prev.content is not None else None,
                    finish=event.finish,
                    stop_reason=event.stop_reason,
                )
                continue
        out.append(event)
    return out


def _separate_finish(events: list[Event]) -> list[Event]:
    out: list[Event] = []
    for event in events:
        if isinstance(event, Step) and event.finish is not None and event.has_payload:
            out.append(replace(event, finish=None, stop_reason=None))
            out.append(Step(content="", finish=event.finish, stop_reason=event.stop_reason))
        else:
            out.append(event)
    return out


def timeline(plan: Plan, limits: Limits) -> list[Event]:
    events = _generate(plan, limits)
    if limits.merge:
        return _merge(events)
    if limits.separate_finish:
        return _separate_finish(events)
    return events


def completion_tokens(events: list[Event]) -> int:
    return sum(e.tokens for e in events if isinstance(e, Step))
