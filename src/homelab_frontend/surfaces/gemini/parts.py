"""Canonical events -> Gemini parts, in the order a client should see them. Pure; the one core
of both the stream encoder (stream.py frames each step's parts as a chunk) and the whole-answer
assembler (assemble.py merges them into one candidate), so the two cannot drift apart.

A step (`feed(event)`) returns the parts that event completes, each a tuple:

    (TEXT, text, signature | None)      {"text": ..., "thoughtSignature"?: ...}
    (THOUGHT, text, None)               {"text": ..., "thought": true}   (only with include_thoughts)
    (CALL, _Call, signature | None)     {"functionCall": {"id", "name", "args"}, "thoughtSignature"?}

Rules
-----
* Reasoning deltas become thought parts at once when the client asked for thoughts
  (`includeThoughts`), and nothing otherwise; either way their text is kept until the next
  non-thought part goes out, which then carries `thoughtSignature` = the kept reasoning, sealed
  (rules.signature_for). So every stretch of reasoning travels back upstream with the history,
  which is all a Gemini client sends back (Gemini CLI drops thought parts, keeps signatures).
  Reasoning with nothing after it is sealed onto an empty text part at the end.
* A function call's arguments arrive in fragments, but a Gemini part holds a whole call: the
  call is held until it is complete, which is when the next call starts, when text follows it,
  or at the end; then it goes out as one part. (Whitespace that vLLM streams after a call before
  the call's last argument bytes, vllm PR #45287, never reaches here: the chunk decoder holds
  it, upstream/decode.py.)
* Argument fragments for a call already sent, or for an index never started, cannot be placed:
  they are dropped and counted in `dropped_tool_args`.
* Empty deltas produce nothing.
"""

from __future__ import annotations

from typing import Callable

from ... import canonical as c
from ..assembly import tool_arguments
from ..signature import ThinkingSigner
from .rules import call_id, new_call_id, signature_for

TEXT = "text"
THOUGHT = "thought"
CALL = "call"


class _Call:
    __slots__ = ("index", "id", "name", "fragments")

    def __init__(self, index: int, id: str, name: str) -> None:
        self.index = index
        self.id = id
        self.name = name
        self.fragments: list[str] = []

    def function_call(self) -> dict:
        return {"id": self.id, "name": self.name, "args": tool_arguments("".join(self.fragments))}


Part = tuple  # (kind, payload, signature | None)


class PartMachine:
    # Readable: `reasoning`, `calls` (what is held; while both are empty a text
    # delta is just a text part, which is the encoder's hot path), `usage`, `finish`, `error`.
    __slots__ = ("usage", "finish", "error", "dropped_tool_args", "_signer", "_show", "reasoning",
                 "calls", "_ids", "_new_id")

    def __init__(self, *, signer: ThinkingSigner, include_thoughts: bool,
                 new_call_id: Callable[[], str] = new_call_id) -> None:
        self.usage = c.NO_USAGE
        self.finish: c.Finish | None = None
        self.error: c.UpstreamError | None = None
        self.dropped_tool_args = 0
        self._signer = signer
        self._show = include_thoughts
        self.reasoning: list[str] = []  # reasoning not yet sealed onto a part
        self.calls: list[_Call] = []  # started, not yet sent
        self._ids: set[str] = set()
        self._new_id = new_call_id

    def feed(self, ev: c.Event) -> list[Part]:
        if type(ev) is c.TextDelta:
            text = ev.text
            if not text:
                return []
            if self.calls:
                out = self._flush_calls()
                out.append((TEXT, text, self._seal()))
                return out
            return [(TEXT, text, self._seal())]
        if type(ev) is c.ReasoningDelta:
            if not ev.text:
                return []
            self.reasoning.append(ev.text)
            return [(THOUGHT, ev.text, None)] if self._show else []
        if type(ev) is c.ToolCallStart:
            out = self._flush_calls()
            self.calls.append(_Call(ev.index, call_id(ev.id, self._ids, self._new_id), ev.name))
            return out
        if type(ev) is c.ToolArgsDelta:
            if ev.fragment:
                for call in self.calls:
                    if call.index == ev.index:
                        call.fragments.append(ev.fragment)
                        return []
                self.dropped_tool_args += 1
            return []
        if type(ev) is c.Usage:
            self.usage = ev.over(self.usage)
        elif type(ev) is c.Finish:
            if self.finish is None:
                self.finish = ev
        elif type(ev) is c.UpstreamError:
            if self.error is None:
                self.error = ev
        return []

    def end(self) -> list[Part]:
        """The parts still held, at the end of the answer."""
        out = self._flush_calls()
        if self.reasoning:
            out.append((TEXT, "", self._seal()))
        return out

    def _flush_calls(self) -> list[Part]:
        if not self.calls:
            return []
        out = [(CALL, call, self._seal() if i == 0 else None) for i, call in enumerate(self.calls)]
        self.calls = []
        return out

    def _seal(self) -> str | None:
        if not self.reasoning:
            return None
        sig = signature_for(self._signer, "".join(self.reasoning))
        self.reasoning = []
        return sig


def part_json(part: Part) -> dict:
    kind, payload, sig = part
    if kind is CALL:
        out: dict = {"functionCall": payload.function_call()}
    elif kind is THOUGHT:
        out = {"text": payload, "thought": True}
    else:
        out = {"text": payload}
    if sig is not None:
        out["thoughtSignature"] = sig
    return out
