"""What every upstream flavour must provide: ids, error bodies, and chunk/response encoders.

A flavour turns the flavour-neutral `timeline` events into its own wire shapes. The handler
(`chat.py`) owns timing, sockets and cancellation; a flavour owns bytes-to-be, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from .timeline import Event, Step


@dataclass
class ResponseContext:
    """Per-response facts the encoders need."""

    id: str
    model: str
    created: int
    prompt_tokens: int
    include_usage: bool = False
    continuous_usage: bool = False
    reasoning_fields: tuple[str, ...] = ("reasoning",)
    include_reasoning: bool = True
    tool_ids: dict[int, str] = field(default_factory=dict)
    # Prompt tokens the prefix cache held; None: the stub models no cache.
    cached_tokens: int | None = None
    # Prompt tokens this request adds to the cache (whole blocks); None: no cache modelled.
    created_cache_tokens: int | None = None
    # vLLM with a reasoning parser counts reasoning tokens in usage.completion_tokens_details.
    reasoning_parser: bool = False
    reasoning_tokens: int = 0  # sent so far


@dataclass(frozen=True)
class Rejection:
    status: int
    body: Any


class Flavour:
    name = ""
    default_model = ""
    default_models: tuple[str, ...] = ()  # the models it lists when none are given: default_model alone if empty
    stream_tool_args = True
    separate_finish = False
    supports_reasoning = True
    honour_tool_choice = True
    # vLLM closes an errored stream with [DONE]; Ollama just stops.
    done_after_error = True
    stream_content_type = "text/event-stream"
    # vLLM-only request knobs: include_stop_str_in_output, continuous_usage_stats, stop token
    # ids in stop_reason, and max_tokens defaulting to what is left of the context window.
    vllm_extras = False
    # vLLM < 0.17's context refusals (StubConfig.legacy_context_errors)
    legacy_context_errors = False

    def completion_id(self, headers: Any) -> str:
        raise NotImplementedError

    def tool_call_id(self) -> str:
        raise NotImplementedError

    def dump_arguments(self, arguments: Any) -> str:
        return json.dumps(arguments)

    def error(self, status: int, message: str, *, param: str | None = None) -> Rejection:
        raise NotImplementedError

    def unauthorized(self) -> Rejection:
        return self.error(401, "Unauthorized")

    def model_not_found(self, model: str, served: tuple[str, ...] = ()) -> Rejection:
        raise NotImplementedError

    def no_messages(self) -> Rejection:
        return self.error(400, "[] is too short - 'messages'")

    def missing_model(self) -> Rejection | None:
        """None: serve the default model (vLLM); else the refusal."""
        return None

    def resolve_model(self, requested: Any, served: tuple[str, ...]) -> str | Rejection:
        if not requested:
            return self.missing_model() or served[0]
        if requested not in served:
            return self.model_not_found(str(requested), served)
        return requested

    def max_tokens(self, body: dict) -> int | None:
        value = body.get("max_completion_tokens")
        if not isinstance(value, int) or isinstance(value, bool):
            value = body.get("max_tokens")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def check_request(self, body: dict) -> Rejection | None:
        """Flavour-specific request validation beyond model and messages."""
        return None

    def check_context(self, prompt_tokens: int, max_tokens: int | None, max_model_len: int,
                      *, param: str = "max_tokens") -> Rejection | None:
        return None

    def output_budget(self, prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int | None:
        """The tokens an accepted request may generate (None: no limit but the plan's)."""
        return max_tokens

    def models_list(self, models: list[str], max_model_len: int, created: int) -> dict:
        raise NotImplementedError

    def embeddings(self, model: str, vectors: list[list[float]], prompt_tokens: int, created: int) -> dict:
        raise NotImplementedError

    # -- streaming --
    def stream_open(self, ctx: ResponseContext) -> list[dict]:
        return []

    def stream_step(self, ctx: ResponseContext, step: Step, completion_tokens: int) -> dict | None:
        """The chunk for one step, or None when the flavour sends nothing for it."""
        raise NotImplementedError

    def stream_usage(self, ctx: ResponseContext, completion_tokens: int) -> dict:
        raise NotImplementedError

    def stream_error(self, ctx: ResponseContext) -> dict:
        raise NotImplementedError

    # -- non-streaming --
    def completion(self, ctx: ResponseContext, events: list[Event]) -> dict:
        raise NotImplementedError

    def completion_error(self) -> Rejection:
        return self.error(500, "Internal server error")


@dataclass
class Aggregate:
    """A whole generation folded into message parts, for non-streaming answers."""

    reasoning: str = ""
    content: str = ""
    saw_reasoning: bool = False
    saw_content: bool = False
    tool_name: str | None = None
    tool_arguments: str = ""
    finish: str | None = None
    stop_reason: str | int | None = None
    tokens: int = 0
    reasoning_tokens: int = 0

    @classmethod
    def of(cls, events: list[Event]) -> "Aggregate":
        agg = cls()
        for event in events:
            if not isinstance(event, Step):
                continue
            agg.tokens += event.tokens
            if event.reasoning is not None:
                agg.reasoning += event.reasoning
                agg.saw_reasoning = True
                agg.reasoning_tokens += event.tokens
            if event.content:
                agg.content += event.content
                agg.saw_content = True
            for delta in event.tool_calls:
                agg.tool_name = delta.name or agg.tool_name
                agg.tool_arguments += delta.arguments or ""
            if event.finish is not None:
                agg.finish, agg.stop_reason = event.finish, event.stop_reason
        return agg


def embedding_vector(text: str, dims: int = 8) -> list[float]:
    """A deterministic unit vector derived from the text."""
    digest = hashlib.sha256(text.encode()).digest()
    raw = [(b - 127.5) / 127.5 for b in digest[:dims]]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [round(x / norm, 6) for x in raw]
