"""An upstream's chat.completion.chunk stream folded into one chat.completion (sans-I/O).

For backends that are asked for a stream even when the client wants one whole answer
(`Backend.streams_upstream`: llama.cpp, which cannot stop a non-streaming generation whose client
left, see README "llama.cpp"). What the client gets is what the upstream would have answered
without `stream`: the id, created, model and system_fingerprint of the chunks; the message's
content, `reasoning_content` and tool calls joined in order; the last finish_reason; the usage
chunk as sent. Nothing is invented: a field no chunk carried is left out (content: null when
there was none, as OpenAI has it).

The chunk shape and its quirks are upstream/decode.py's, not repeated here: each payload is
decoded by `decode_chunk` (a malformed one raises ValueError) and turned into canonical events by
a `ChunkDecoder` (reasoning vs reasoning_content, index-less and re-indexed tool calls, arguments
sent as objects, finish reasons); only what the events leave out (the chunk's identity, `usage`
as sent) is read with decode's `ChunkHead`. Finish reasons go back to OpenAI's words (a stop
string the upstream named is `stop`).
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

import msgspec

from ... import canonical as c
from ...upstream.decode import ChunkDecoder, decode_chunk, decode_head

_HEAD = ("id", "created", "model", "system_fingerprint")
_FINISH = {"stop_sequence": "stop"}  # canonical reasons that are not OpenAI's


# The chat.completion the assembler builds (the fields OpenAI's ChatCompletion has that a stream
# can tell; NotRequired: left out when no chunk carried it)
class Function(TypedDict):
    name: str
    arguments: str  # JSON text, as the model produced it


class ToolCall(TypedDict):
    id: str | None
    type: Literal["function"]
    function: Function


class Message(TypedDict):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: NotRequired[str]
    tool_calls: NotRequired[list[ToolCall]]


class Choice(TypedDict):
    index: int
    message: Message
    finish_reason: str | None


class ChatCompletion(TypedDict):
    id: str | None
    object: Literal["chat.completion"]
    created: int | None
    model: str | None
    choices: list[Choice]
    system_fingerprint: NotRequired[str]
    usage: NotRequired[dict[str, Any]]  # as the upstream sent it, every field


class _Call(TypedDict):
    id: str | None
    name: str
    arguments: str


class CompletionAssembler:
    __slots__ = ("head", "content", "reasoning", "tools", "finish", "usage", "counts", "error", "pieces",
                 "_decoder")

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}  # the _HEAD fields some chunk carried
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.tools: dict[int, _Call] = {}  # canonical index -> the call
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None  # the last usage as the upstream sent it
        self.counts = c.NO_USAGE  # its counts, each the latest reported (canonical.Usage.over)
        self.error: str | None = None  # the message of an in-band error chunk
        self.pieces = 0  # chunks that carried generated text or tool arguments
        self._decoder = ChunkDecoder()

    def feed(self, payload: bytes) -> None:
        """One SSE data payload (not `[DONE]`). Raises ValueError for one that is not a chunk."""
        try:
            chunk = decode_chunk(payload)
        except msgspec.DecodeError as err:
            raise ValueError(f"the backend sent a malformed chunk ({err})") from None
        if len(self.head) < len(_HEAD) or chunk.usage is not None:
            head = decode_head(payload)  # decoded as a chunk just now: cannot fail
            for key in _HEAD:
                value = getattr(head, key)
                if value is not None and key not in self.head:
                    self.head[key] = value
            if head.usage is not None:
                self.usage = head.usage
        for ev in self._decoder.feed_chunk(chunk):
            if type(ev) is c.TextDelta:
                self.content.append(ev.text)
                self.pieces += 1
            elif type(ev) is c.ReasoningDelta:
                self.reasoning.append(ev.text)
                self.pieces += 1
            elif type(ev) is c.ToolCallStart:
                self.tools[ev.index] = {"id": ev.id or None, "name": ev.name, "arguments": ""}
            elif type(ev) is c.ToolArgsDelta:
                self.tools[ev.index]["arguments"] += ev.fragment
                self.pieces += 1
            elif type(ev) is c.Finish:
                self.finish = _FINISH.get(ev.reason, ev.reason)
            elif type(ev) is c.Usage:
                self.counts = ev.over(self.counts)
            elif type(ev) is c.UpstreamError:
                self.error = ev.message

    def result(self) -> ChatCompletion:
        message: Message = {"role": "assistant", "content": "".join(self.content) if self.content else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tools:
            message["tool_calls"] = [
                {"id": t["id"], "type": "function", "function": {"name": t["name"], "arguments": t["arguments"]}}
                for _, t in sorted(self.tools.items())
            ]
        out: ChatCompletion = {
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
