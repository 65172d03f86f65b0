"""Ollama's OpenAI-compatibility wire format (`/v1/chat/completions` on port 11434).

Shapes follow ollama's `openai/openai.go` and `middleware/openai.go`:
- ids are `chatcmpl-<0..998>`, every chunk carries `system_fingerprint: "fp_ollama"`, every
  delta carries `role` and `content` (Go structs, no omission), no `logprobs`, no `stop_reason`;
- `finish_reason` appears only on the last chunk, which has empty content;
- a tool call arrives whole (id `call_xxxxxxxx`, name and compact JSON arguments with sorted
  keys, as Go marshals a map) in one delta; the last chunk then says `tool_calls`;
- with `stream_options.include_usage` the last chunk is followed by a copy with `choices: []`
  and `usage`, then `data: [DONE]`;
- only `max_tokens` is read (the request struct has no `max_completion_tokens`);
- errors are `{"error": {"message", "type", "param": null, "code": null}}`.
"""

from __future__ import annotations

import json
import random
import secrets
import string
from typing import Any

from .flavour import Aggregate, Flavour, Rejection, ResponseContext
from .timeline import Event, Step

_ALPHABET = string.ascii_lowercase + string.digits


def _error_type(status: int) -> str:
    if status == 400:
        return "invalid_request_error"
    if status == 404:
        return "not_found_error"
    return "api_error"


class Ollama(Flavour):
    name = "ollama"
    default_model = "qwen2.5:3b-instruct"
    stream_tool_args = False
    separate_finish = True
    supports_reasoning = False
    honour_tool_choice = False
    done_after_error = False

    def completion_id(self, headers: Any) -> str:
        return f"chatcmpl-{random.randrange(999)}"

    def tool_call_id(self) -> str:
        return "call_" + "".join(secrets.choice(_ALPHABET) for _ in range(8))

    def dump_arguments(self, arguments: Any) -> str:
        return json.dumps(arguments, separators=(",", ":"), sort_keys=True)

    def error(self, status: int, message: str, *, param: str | None = None) -> Rejection:
        error = {"message": message, "type": _error_type(status), "param": None, "code": None}
        return Rejection(status, {"error": error})

    def model_not_found(self, model: str, served: tuple[str, ...] = ()) -> Rejection:
        return self.error(404, f"model {json.dumps(model)} not found, try pulling it first")

    def missing_model(self) -> Rejection | None:
        return self.error(400, "model is required")

    def max_tokens(self, body: dict) -> int | None:
        value = body.get("max_tokens")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def models_list(self, models: list[str], max_model_len: int, created: int) -> dict:
        data = [{"id": m, "object": "model", "created": created, "owned_by": _owner(m)} for m in models]
        return {"object": "list", "data": data}

    def embeddings(self, model: str, vectors: list[list[float]], prompt_tokens: int, created: int) -> dict:
        return {
            "object": "list",
            "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(vectors)],
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }

    # -- streaming --
    def _chunk(self, ctx: ResponseContext, choices: list[dict]) -> dict:
        return {
            "id": ctx.id,
            "object": "chat.completion.chunk",
            "created": ctx.created,
            "model": ctx.model,
            "system_fingerprint": "fp_ollama",
            "choices": choices,
        }

    def _tool_calls(self, ctx: ResponseContext, step: Step) -> list[dict]:
        calls = []
        for d in step.tool_calls:
            tool_id = ctx.tool_ids.setdefault(d.index, self.tool_call_id())
            function = {"name": d.name or "", "arguments": d.arguments or ""}
            calls.append({"id": tool_id, "index": d.index, "type": "function", "function": function})
        return calls

    def stream_step(self, ctx: ResponseContext, step: Step, completion_tokens: int) -> dict:
        delta: dict[str, Any] = {"role": "assistant", "content": step.content or ""}
        if step.tool_calls:
            delta["tool_calls"] = self._tool_calls(ctx, step)
        return self._chunk(ctx, [{"index": 0, "delta": delta, "finish_reason": step.finish}])

    def stream_usage(self, ctx: ResponseContext, completion_tokens: int) -> dict:
        chunk = self._chunk(ctx, [])
        chunk["usage"] = _usage(ctx.prompt_tokens, completion_tokens)
        return chunk

    def stream_error(self, ctx: ResponseContext) -> dict:
        return self.error(500, "an error was encountered while running the model").body

    # -- non-streaming --
    def completion(self, ctx: ResponseContext, events: list[Event]) -> dict:
        agg = Aggregate.of(events)
        message: dict[str, Any] = {"role": "assistant", "content": agg.content}
        if agg.tool_name is not None:
            tool_id = ctx.tool_ids.setdefault(0, self.tool_call_id())
            function = {"name": agg.tool_name, "arguments": agg.tool_arguments}
            message["tool_calls"] = [{"id": tool_id, "index": 0, "type": "function", "function": function}]
        return {
            "id": ctx.id,
            "object": "chat.completion",
            "created": ctx.created,
            "model": ctx.model,
            "system_fingerprint": "fp_ollama",
            "choices": [{"index": 0, "message": message, "finish_reason": agg.finish}],
            "usage": _usage(ctx.prompt_tokens, agg.tokens),
        }

    def completion_error(self) -> Rejection:
        return self.error(500, "an error was encountered while running the model")


def _owner(model: str) -> str:
    # ollama reports the namespace of the model name; bare names live in "library".
    path = model.split(":", 1)[0]
    parts = path.split("/")
    return parts[-2] if len(parts) >= 2 else "library"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
