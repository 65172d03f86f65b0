"""Canonical events -> one non-streaming Anthropic Messages response body (pure, no I/O).

`MessageAssembler` takes the events of one answer (decoded from a whole upstream completion, or
from a stream) through `feed()`, and `result()` returns the body as a dict:

    {"id": "msg_...", "type": "message", "role": "assistant", "content": [...],
     "model": <the name the client sent>, "stop_reason": ..., "stop_sequence": ...,
     "usage": {"input_tokens": ..., "output_tokens": ...}}

Nothing of the OpenAI shape (`choices`, `finish_reason`, `object`, `chatcmpl-` ids, upstream model
names) can leak: the body is built only from canonical events and the constructor's arguments.

Choices
-------
Blocks
    Content blocks follow the order the events arrived in; consecutive deltas of one kind merge
    into one block, so a reasoning model's answer is `thinking` then `text` (then `tool_use`s).
    A tool's argument fragments go to its own block by tool index wherever they arrive (vLLM may
    put a content delta between fragments of one call). Each thinking block carries
    `signature = signer.sign(thinking)`, so the gateway recognises it when it comes back in history.
    With `hide_reasoning` (thinking.display "omitted") a thinking block has empty text and
    `signature = signer.seal(thinking)`: the reasoning goes back upstream next turn from there.
Empty and blank blocks
    Empty reasoning gives no thinking block. Blocks holding only whitespace (R1-style models often
    send "\\n\\n" of content after their reasoning, or between tool calls) are dropped when the
    message has any other block: a blank text block next to a thinking block or a tool call is
    noise, and Anthropic's API rejects blank text blocks when a client replays them. If nothing at
    all is left, content is `[{"type": "text", "text": ""}]`: Anthropic itself can answer with an
    empty `content` array (e.g. after an assistant prefill), but clients index `content[0]`, and the
    2.11 contract says never an empty array.
Tool calls
    `id`: the upstream's id is passed through unchanged (it comes back as `tool_use_id` and goes
    upstream again as `tool_call_id`, so the upstream sees its own ids) when it is a valid Anthropic
    id (`^[A-Za-z0-9_-]{1,128}$`, the rule stream.py applies too); a missing or invalid id (Kimi-K2's
    `functions.name:0`: Anthropic's API refuses history carrying it), or one repeated within the
    message, gets a fresh `toolu_<24 base62>`. `input`: the concatenated argument
    fragments parsed as JSON; empty or `null` -> `{}`; anything that is not a JSON object (truncated
    by max_tokens, malformed by a small model) -> `{"_raw_arguments": "<the text>"}`. A client like
    Claude Code then reports a schema error back to the model as a tool_result, and the model can
    retry; failing the whole answer with a 502 would throw the turn away (and a 500 is never right).
    Argument fragments for an index that never got a ToolCallStart are dropped (no name to call).
    (The argument parsing and the error mapping below are surfaces/assembly.py's, shared by every
    dialect.)
stop_reason
    stop -> end_turn (but tool_use when the message holds tool calls: Ollama and some parsers report
    `stop` for a tool call, and Anthropic clients run tools on `tool_use`), length -> max_tokens,
    tool_calls -> tool_use, stop_sequence -> stop_sequence with the matched string in
    `stop_sequence`, content_filter -> refusal. `stop_sequence` is always present, null unless a
    stop string fired. No Finish event at all: tool_use if there are tool calls, else end_turn
    (Anthropic documents stop_reason as never null in a non-streaming body).
usage
    `input_tokens` and `output_tokens`, the last values the upstream reported (prompt_tokens
    and completion_tokens). A count the upstream never reported is `null`, not 0: a 0 would be an
    invented value (and a wrong one that breaks client context meters); a JS client doing
    arithmetic on null still gets a number. When the upstream reported cached prompt tokens
    (`prompt_tokens_details.cached_tokens`: vLLM with --enable-prompt-tokens-details, llama.cpp),
    they are `cache_read_input_tokens` and `input_tokens` excludes them, as Anthropic defines it
    (total prompt = input + cache_read + cache_creation); otherwise no cache field at all, and
    `cache_creation_input_tokens` never (no upstream reports it: it would be invented).
Errors
    An `UpstreamError` event makes `result()` raise `GatewayError`: `timeout_error` -> kind
    `timeout` (504), `overloaded_error` -> `upstream_error` with status 503 (rendered as
    overloaded_error), anything else -> `upstream_error` (502).
"""

from __future__ import annotations

from typing import Any

from ... import canonical as c
from ..assembly import tool_arguments, upstream_failure
from ..signature import ThinkingSigner
from .rules import STOP_REASONS, new_message_id, new_tool_use_id, tool_use_id

__all__ = ["MessageAssembler", "new_message_id", "new_tool_use_id"]

class _Tool:
    __slots__ = ("id", "name", "fragments")

    def __init__(self, id: str, name: str) -> None:
        self.id = id
        self.name = name
        self.fragments: list[str] = []


class MessageAssembler:
    def __init__(
        self, *, message_id: str, model: str, signer: ThinkingSigner, hide_reasoning: bool = False
    ) -> None:
        self._hide = hide_reasoning
        self._id = message_id
        self._model = model
        self._signer = signer
        # In arrival order: ("thinking", [str...]) | ("text", [str...]) | ("tool", _Tool)
        self._blocks: list[tuple[str, Any]] = []
        self._tools: dict[int, _Tool] = {}
        self._orphan_args: dict[int, list[str]] = {}
        self._usage_seen = c.NO_USAGE
        self._finish: c.Finish | None = None
        self._error: c.UpstreamError | None = None

    # -- input -------------------------------------------------------------------------------

    def feed(self, event: c.Event) -> None:
        if isinstance(event, c.TextDelta):
            self._delta("text", event.text)
        elif isinstance(event, c.ReasoningDelta):
            self._delta("thinking", event.text)
        elif isinstance(event, c.ToolArgsDelta):
            tool = self._tools.get(event.index)
            if tool is not None:
                tool.fragments.append(event.fragment)
            else:
                self._orphan_args.setdefault(event.index, []).append(event.fragment)
        elif isinstance(event, c.ToolCallStart):
            self._tool_start(event)
        elif isinstance(event, c.Usage):
            self._usage_seen = event.over(self._usage_seen)
        elif isinstance(event, c.Finish):
            self._finish = event
        elif isinstance(event, c.UpstreamError):
            if self._error is None:
                self._error = event

    def _delta(self, kind: str, text: str) -> None:
        if not text:
            return
        if self._blocks and self._blocks[-1][0] == kind:
            self._blocks[-1][1].append(text)
        else:
            self._blocks.append((kind, [text]))

    def _tool_start(self, event: c.ToolCallStart) -> None:
        tool = self._tools.get(event.index)
        if tool is not None:  # a repeated start for the same call: fill in what was missing
            tool.id = tool.id or event.id
            tool.name = tool.name or event.name
            return
        tool = _Tool(event.id, event.name)
        tool.fragments.extend(self._orphan_args.pop(event.index, ()))
        self._tools[event.index] = tool
        self._blocks.append(("tool", tool))

    # -- output ------------------------------------------------------------------------------

    def result(self) -> dict[str, Any]:
        if self._error is not None:
            raise upstream_failure(self._error)
        content = self._content()
        has_tools = any(b["type"] == "tool_use" for b in content)
        finish = self._finish
        if finish is None:
            stop_reason = "tool_use" if has_tools else "end_turn"
        elif finish.reason == "stop" and has_tools:
            stop_reason = "tool_use"
        else:
            stop_reason = STOP_REASONS.get(finish.reason, "end_turn")
        stop_sequence = (
            finish.stop_sequence
            if finish is not None and finish.reason == "stop_sequence"
            else None
        )
        return {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self._model,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": self._usage(),
        }

    def _usage(self) -> dict[str, Any]:
        u = self._usage_seen
        prompt, cached = u.input_tokens, u.cached_input_tokens
        if cached is None or prompt is None or cached > prompt:
            return {"input_tokens": prompt, "output_tokens": u.output_tokens}
        return {"input_tokens": prompt - cached, "output_tokens": u.output_tokens,
                "cache_read_input_tokens": cached}

    def _content(self) -> list[dict[str, Any]]:
        # 1. Join fragments; 2. drop blank blocks if anything else exists; 3. merge neighbours of
        # one kind that a dropped block separated; 4. render.
        joined: list[tuple[str, Any]] = [
            (kind, "".join(v)) if kind != "tool" else (kind, v) for kind, v in self._blocks
        ]
        blank = [kind != "tool" and not v.strip() for kind, v in joined]
        if not all(blank):
            joined = [b for b, is_blank in zip(joined, blank) if not is_blank]
        merged: list[tuple[str, Any]] = []
        for kind, v in joined:
            if merged and kind != "tool" and merged[-1][0] == kind:
                merged[-1] = (kind, merged[-1][1] + v)
            else:
                merged.append((kind, v))

        content: list[dict[str, Any]] = []
        seen_ids: set[str] = set()
        for kind, v in merged:
            if kind == "thinking":
                if v and self._hide:
                    content.append({"type": "thinking", "thinking": "", "signature": self._signer.seal(v)})
                elif v:
                    content.append(
                        {"type": "thinking", "thinking": v, "signature": self._signer.sign(v)}
                    )
            elif kind == "text":
                if v:
                    content.append({"type": "text", "text": v})
            else:
                tool_id = tool_use_id(v.id, seen_ids)
                content.append(
                    {
                        "type": "tool_use",
                        "id": tool_id,
                        "name": v.name,
                        "input": tool_arguments("".join(v.fragments)),
                    }
                )
        if not content:
            content.append({"type": "text", "text": ""})
        return content
