"""An upstream's chat.completion.chunk stream folded into one chat.completion (sans-I/O).

For backends that are asked for a stream even when the client wants one whole answer
(`Backend.streams_upstream`: llama.cpp, which cannot stop a non-streaming generation whose client
left, see README "llama.cpp"). What the client gets is what the upstream would have answered
without `stream`: the id, created, model and system_fingerprint of the chunks; the message's
content, `reasoning_content` and tool calls joined in order (tool calls by their `index`); the
last finish_reason; the usage chunk as sent. Nothing is invented: a field no chunk carried is
left out (content: null when there was none, as OpenAI has it).
"""

from __future__ import annotations

from typing import Union

import msgspec


class _Fn(msgspec.Struct):
    name: Union[str, None] = None
    arguments: Union[str, None] = None


class _ToolDelta(msgspec.Struct):
    index: int = 0
    id: Union[str, None] = None
    type: Union[str, None] = None
    function: Union[_Fn, None] = None


class _Delta(msgspec.Struct):
    content: Union[str, None] = None
    reasoning_content: Union[str, None] = None
    reasoning: Union[str, None] = None
    tool_calls: Union[list[_ToolDelta], None] = None


class _Choice(msgspec.Struct):
    delta: Union[_Delta, None] = None
    finish_reason: Union[str, None] = None


class _Chunk(msgspec.Struct):
    id: Union[str, None] = None
    created: Union[int, None] = None
    model: Union[str, None] = None
    system_fingerprint: Union[str, None] = None
    choices: list[_Choice] = []
    usage: Union[dict, None] = None
    error: object = None


_decode = msgspec.json.Decoder(_Chunk).decode


class CompletionAssembler:
    __slots__ = ("head", "content", "reasoning", "tools", "finish", "usage", "error", "pieces")

    def __init__(self) -> None:
        self.head: dict = {}
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, dict] = {}
        self.finish: str | None = None
        self.usage: dict | None = None
        self.error: object = None  # an in-band `{"error": ...}` chunk
        self.pieces = 0  # chunks that carried generated text or tool arguments

    def feed(self, payload: bytes) -> None:
        """One SSE data payload (not `[DONE]`). Raises ValueError for one that is not a chunk."""
        try:
            chunk = _decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as err:
            raise ValueError(f"the backend sent a malformed chunk ({err})") from None
        if chunk.error is not None:
            self.error = chunk.error
            return
        for key in ("id", "created", "model", "system_fingerprint"):
            value = getattr(chunk, key)
            if value is not None and key not in self.head:
                self.head[key] = value
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices[:1]:  # n is never sent upstream: one choice
            d = choice.delta
            if d is not None:
                if d.content:
                    self.content.append(d.content)
                    self.pieces += 1
                reasoning = d.reasoning_content or d.reasoning
                if reasoning:
                    self.reasoning.append(reasoning)
                    self.pieces += 1
                for t in d.tool_calls or ():
                    call = self.tools.setdefault(t.index, {"id": None, "type": "function", "name": "", "arguments": ""})
                    if t.id:
                        call["id"] = t.id
                    if t.function is not None:
                        call["name"] += t.function.name or ""
                        if t.function.arguments:
                            call["arguments"] += t.function.arguments
                            self.pieces += 1
            if choice.finish_reason is not None:
                self.finish = choice.finish_reason

    def result(self) -> dict:
        message: dict = {"role": "assistant", "content": "".join(self.content) if self.content else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tools:
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for _, c in sorted(self.tools.items())
            ]
        out = {
            "id": self.head.get("id"),
            "object": "chat.completion",
            "created": self.head.get("created"),
            "model": self.head.get("model"),
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish}],
        }
        if "system_fingerprint" in self.head:
            out["system_fingerprint"] = self.head["system_fingerprint"]
        if self.usage is not None:
            out["usage"] = self.usage
        return out
