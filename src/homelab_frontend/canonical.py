"""The canonical model: the one vocabulary between the client surfaces and the upstream client.

A surface (OpenAI, Anthropic) parses its dialect into a `Request`; the upstream client turns a
`Request` into the upstream's OpenAI-shaped body. Answers come back as a sequence of `Event`s
(from a streamed or a whole upstream completion alike), which a surface encodes into its dialect.
Upstream quirks end in the chunk decoder (`upstream/decode.py`), dialect quirks in the surface;
nothing here knows either.
"""

from __future__ import annotations

from typing import Literal, Union, final

import msgspec

# ---------------------------------------------------------------------------------------------
# Request
# ---------------------------------------------------------------------------------------------


class TextPart(msgspec.Struct, tag="text", frozen=True):
    text: str


class ImagePart(msgspec.Struct, tag="image", frozen=True):
    # An http(s) URL or a `data:<media type>;base64,<data>` URL: what OpenAI-shaped upstreams take.
    url: str


Part = Union[TextPart, ImagePart]


class ToolCall(msgspec.Struct, frozen=True):
    id: str
    name: str
    arguments: str  # a JSON text, exactly as the model produced it / the client sent it


class Message(msgspec.Struct):
    role: Literal["system", "user", "assistant", "tool"]
    parts: list[Part] = msgspec.field(default_factory=list)
    tool_calls: list[ToolCall] = msgspec.field(default_factory=list)
    tool_call_id: str | None = None  # role "tool": which call this answers
    reasoning: str | None = None  # role "assistant": earlier reasoning sent back upstream

    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))


class Tool(msgspec.Struct, frozen=True):
    name: str
    description: str | None = None
    parameters: dict = msgspec.field(default_factory=dict)  # a JSON schema


class ToolChoice(msgspec.Struct, frozen=True):
    mode: Literal["auto", "required", "none", "named"]
    name: str | None = None  # mode "named"


class Request(msgspec.Struct):
    model: str  # the name the client sent; answers echo it
    messages: list[Message]
    stream: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    tools: list[Tool] = msgspec.field(default_factory=list)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    # "low" | "medium" | "high", or None: the client did not ask (never invent one)
    reasoning_effort: str | None = None
    # False: the client asked for no reasoning. None: the client did not say.
    reasoning_enabled: bool | None = None
    # True: the client wants the reasoning done but not shown (Anthropic thinking.display
    # "omitted"); the surface hands it back sealed, so it can still go upstream next turn.
    reasoning_hidden: bool = False
    # OpenAI-surface parameters that have no canonical meaning but are safe to pass on
    # (seed, response_format, logprobs, ...): an allow-list in the OpenAI surface fills this.
    extra: dict = msgspec.field(default_factory=dict)
    # The client's name for the conversation (OpenAI `prompt_cache_key`): routing only, never
    # forwarded (see policy/affinity.py).
    cache_key: str | None = None


# ---------------------------------------------------------------------------------------------
# Answer events
# ---------------------------------------------------------------------------------------------

# Canonical finish reasons. "stop_sequence" means a client stop string fired (Finish.stop_sequence
# holds it); "stop" is a natural end of turn.
FinishReason = Literal["stop", "length", "tool_calls", "stop_sequence", "content_filter"]


@final
class ReasoningDelta(msgspec.Struct, tag="reasoning", frozen=True):
    text: str


@final
class TextDelta(msgspec.Struct, tag="text", frozen=True):
    text: str


@final
class ToolCallStart(msgspec.Struct, tag="tool_start", frozen=True):
    index: int  # the upstream's tool-call index; arguments for it follow as ToolArgsDelta
    id: str
    name: str


@final
class ToolArgsDelta(msgspec.Struct, tag="tool_args", frozen=True):
    index: int
    fragment: str


@final
class Usage(msgspec.Struct, tag="usage", frozen=True):
    # Counts as the upstream reported them so far; None: not reported (never invent a 0).
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None
    # of output_tokens, those spent reasoning (vLLM's completion_tokens_details.reasoning_tokens)
    reasoning_tokens: int | None = None

    def over(self, earlier: "Usage") -> "Usage":
        """This report laid over an earlier one: upstreams send usage more than once (vLLM's
        continuous usage, a final usage-only chunk), each count the latest reported, and a count
        left out now keeps its earlier value."""
        if ((self.input_tokens is not None or earlier.input_tokens is None)
                and (self.output_tokens is not None or earlier.output_tokens is None)
                and (self.cached_input_tokens is not None or earlier.cached_input_tokens is None)
                and (self.reasoning_tokens is not None or earlier.reasoning_tokens is None)):
            return self  # the common case (every chunk of vLLM's continuous usage): nothing to keep
        return Usage(
            self.input_tokens if self.input_tokens is not None else earlier.input_tokens,
            self.output_tokens if self.output_tokens is not None else earlier.output_tokens,
            self.cached_input_tokens if self.cached_input_tokens is not None else earlier.cached_input_tokens,
            self.reasoning_tokens if self.reasoning_tokens is not None else earlier.reasoning_tokens,
        )


NO_USAGE = Usage()


@final
class Finish(msgspec.Struct, tag="finish", frozen=True):
    reason: FinishReason
    stop_sequence: str | None = None


@final
class UpstreamError(msgspec.Struct, tag="error", frozen=True):
    """The upstream failed after the answer started (socket closed, error chunk, idle timeout)."""

    message: str
    kind: Literal["api_error", "overloaded_error", "timeout_error"] = "api_error"


# The event classes are final: encoders dispatch on `type(event) is X` (one identity test per
# event on the hot path), which a checker can narrow only for a class nothing subclasses.
Event = Union[ReasoningDelta, TextDelta, ToolCallStart, ToolArgsDelta, Usage, Finish, UpstreamError]
