"""Canonical events -> one whole Ollama answer (`"stream": false`): pure.

The same answer the NDJSON stream (stream.py) gives, folded into its last object as Ollama does:
`message` with all of the content, `thinking` (when there was any) and `tool_calls` (objects as
arguments, held by the same `ToolCalls`), then the `done` fields. A generate answer has
`response` (and `thinking`) instead of `message`. A failure raises `AnswerFailed`: the handler
renders it as the error response it is, never a partial answer with `done: true`.
"""

from __future__ import annotations

from typing import Callable, Literal

from ... import canonical as c
from .stream import BadArguments, Durations, NdjsonEncoder, wall_clock

__all__ = ["AnswerFailed", "WholeAssembler"]


class AnswerFailed(Exception):
    pass


class WholeAssembler:
    def __init__(self, *, model: str, endpoint: Literal["chat", "generate"] = "chat",
                 id_prefix: str = "call_", clock: Callable[[], str] = wall_clock,
                 hide_reasoning: bool = False) -> None:
        # the stream encoder's counting and tool-call holding, without its lines
        self._enc = NdjsonEncoder(model=model, endpoint=endpoint, id_prefix=id_prefix)
        self.hide_reasoning = hide_reasoning  # think: false, and the backend thought anyway
        self.model = model
        self.endpoint = endpoint
        self.clock = clock
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.calls: list[dict] = []

    @property
    def usage(self) -> c.Usage:
        return self._enc.usage

    @property
    def eval_count(self) -> int:
        return self._enc.eval_count

    def feed(self, ev: c.Event) -> None:
        if isinstance(ev, c.TextDelta):
            if ev.text:
                self.text.append(ev.text)
                self._enc.deltas += 1
        elif isinstance(ev, c.ReasoningDelta):
            if ev.text:
                if not self.hide_reasoning:
                    self.thinking.append(ev.text)
                self._enc.deltas += 1  # counted either way: the backend generated it
        elif isinstance(ev, c.UpstreamError):
            raise AnswerFailed(ev.message)
        elif isinstance(ev, c.Finish):
            self._enc.finish_reason = self._enc.finish_reason or ev.reason
            self._take()
        else:
            self._enc.feed(ev)

    def _take(self) -> None:
        try:
            self.calls.extend(self._enc.tools.take())
        except BadArguments as err:
            raise AnswerFailed(str(err)) from None

    def result(self, t: Durations) -> dict:
        self._take()
        out: dict = {"model": self.model, "created_at": self.clock()}
        text, thinking = "".join(self.text), "".join(self.thinking)
        if self.endpoint == "chat":
            message: dict = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if self.calls:
                message["tool_calls"] = self.calls
            out["message"] = message
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        out.update(self._enc.final_fields(t))
        return out
