"""llama.cpp's `llama-server` OpenAI-compatible wire format, as the real server (11434.0.0, the
build tests/real runs) sends it:
- ids are `chatcmpl-` + 32 letters and digits, every chunk carries `system_fingerprint`
  (the build, `b0-unknown` without a git commit); the model in answers is the server's own
  alias whatever the request named (it serves one model);
- the first chunk is `delta: {"role": "assistant", "content": null}`; text chunks carry only
  `content` (`reasoning_content` for reasoning); the finish chunk has `delta: {}`; usage comes in a
  separate `choices: []` chunk only with `stream_options.include_usage`, with `timings` beside
  it and `prompt_tokens_details.cached_tokens` inside it; `[DONE]` ends the stream;
- no `stop_reason`: a stop string is cut and the answer says only `stop`;
- a prompt longer than a slot's context is HTTP 400 `exceed_context_size_error` with
  `n_prompt_tokens` and `n_ctx`, for `stream: true` too; a prompt that fits but leaves less room
  than max_tokens is not refused (the answer stops at the context's end);
- `/v1/models` has `owned_by: "llamacpp"` and `meta.n_ctx` (a slot's context), plus a top-level
  Ollama-style `models` list; `/metrics` has `llamacpp:requests_processing` /
  `requests_deferred`; `/slots` has `is_processing`; `/tokenize` and `/apply-template` exist;
- answers carry `Keep-Alive: timeout=5, max=100`, and the server closes the connection after a
  streamed answer (what made a reused connection fail before any byte, see upstream/client.py).
"""

from __future__ import annotations

import random
import secrets
import string
from typing import Any

from .flavour import Aggregate, Flavour, Rejection, ResponseContext
from .timeline import Event, Step

_ALNUM = string.ascii_letters + string.digits
FINGERPRINT = "b0-unknown"
KEEP_ALIVE = "timeout=5, max=100"


def _error_type(status: int) -> str:
    return {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
            501: "not_supported_error", 503: "unavailable_error"}.get(status, "server_error")


def _timings(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"cache_n": 0, "prompt_n": prompt_tokens, "prompt_ms": 1.0, "prompt_per_token_ms": 0.1,
            "prompt_per_second": 1000.0, "predicted_n": completion_tokens, "predicted_ms": 1.0,
            "predicted_per_token_ms": 0.1, "predicted_per_second": 1000.0}


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"completion_tokens": completion_tokens, "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": 0}}


class LlamaCpp(Flavour):
    name = "llamacpp"
    default_model = "gemma-3-270m"
    separate_finish = True
    done_after_error = False
    stream_tool_args = True

    def completion_id(self, headers: Any) -> str:
        return "chatcmpl-" + "".join(secrets.choice(_ALNUM) for _ in range(32))

    def tool_call_id(self) -> str:
        return "".join(random.choice(_ALNUM) for _ in range(32))

    def error(self, status: int, message: str, *, param: str | None = None) -> Rejection:
        return Rejection(status, {"error": {"code": status, "message": message, "type": _error_type(status)}})

    def unauthorized(self) -> Rejection:
        return self.error(401, "Invalid API Key")

    def model_not_found(self, model: str, served: tuple[str, ...] = ()) -> Rejection:
        return self.error(404, f"model '{model}' not found")

    def resolve_model(self, requested: Any, served: tuple[str, ...]) -> str | Rejection:
        return served[0]  # one model per server: the name in a request is not checked

    def check_context(self, prompt_tokens: int, max_tokens: int | None, max_model_len: int,
                      *, param: str = "max_tokens") -> Rejection | None:
        if prompt_tokens <= max_model_len:
            return None
        rejection = self.error(400, f"request ({prompt_tokens} tokens) exceeds the available context size "
                                    f"({max_model_len} tokens), try increasing it")
        rejection.body["error"].update(type="exceed_context_size_error", n_prompt_tokens=prompt_tokens,
                                       n_ctx=max_model_len)
        return rejection

    def models_list(self, models: list[str], max_model_len: int, created: int) -> dict:
        return {
            "models": [{"name": m, "model": m, "type": "model", "capabilities": ["completion"]} for m in models],
            "object": "list",
            "data": [{"id": m, "aliases": [m], "tags": [], "object": "model", "created": created,
                      "owned_by": "llamacpp", "meta": {"n_ctx": max_model_len, "n_ctx_train": 32768}}
                     for m in models],
        }

    def embeddings(self, model: str, vectors: list[list[float]], prompt_tokens: int, created: int) -> dict:
        return {"model": model, "object": "list",
                "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
                "data": [{"embedding": v, "index": i, "object": "embedding"} for i, v in enumerate(vectors)]}

    # -- streaming --
    def _chunk(self, ctx: ResponseContext, choices: list[dict]) -> dict:
        return {"choices": choices, "created": ctx.created, "id": ctx.id, "model": ctx.model,
                "system_fingerprint": FINGERPRINT, "object": "chat.completion.chunk"}

    def stream_open(self, ctx: ResponseContext) -> list[dict]:
        return [self._chunk(ctx, [{"finish_reason": None, "index": 0,
                                   "delta": {"role": "assistant", "content": None}}])]

    def stream_step(self, ctx: ResponseContext, step: Step, completion_tokens: int) -> dict | None:
        delta: dict[str, Any] = {}
        if step.content:
            delta["content"] = step.content
        if step.reasoning is not None and ctx.include_reasoning:
            delta["reasoning_content"] = step.reasoning
        if step.tool_calls:
            delta["tool_calls"] = [self._tool_delta(ctx, d) for d in step.tool_calls]
        if not delta and step.finish is None:
            return None
        return self._chunk(ctx, [{"finish_reason": step.finish, "index": 0, "delta": delta}])

    def _tool_delta(self, ctx: ResponseContext, d: Any) -> dict:
        out: dict[str, Any] = {"index": d.index, "function": {}}
        if d.name is not None:
            out.update(id=ctx.tool_ids.setdefault(d.index, self.tool_call_id()), type="function")
            out["function"]["name"] = d.name
        if d.arguments is not None:
            out["function"]["arguments"] = d.arguments
        return out

    def stream_usage(self, ctx: ResponseContext, completion_tokens: int) -> dict:
        chunk = self._chunk(ctx, [])
        chunk["usage"] = _usage(ctx.prompt_tokens, completion_tokens)
        chunk["timings"] = _timings(ctx.prompt_tokens, completion_tokens)
        return chunk

    def stream_error(self, ctx: ResponseContext) -> dict:
        return {"error": self.error(500, "stub: generation failed").body["error"]}

    # -- non-streaming --
    def completion(self, ctx: ResponseContext, events: list[Event]) -> dict:
        agg = Aggregate.of(events)
        message: dict[str, Any] = {"role": "assistant", "content": agg.content}
        if agg.saw_reasoning and ctx.include_reasoning:
            message["reasoning_content"] = agg.reasoning
        if agg.tool_name is not None:
            message["tool_calls"] = [{"type": "function", "id": ctx.tool_ids.setdefault(0, self.tool_call_id()),
                                      "function": {"name": agg.tool_name, "arguments": agg.tool_arguments}}]
        return {
            "choices": [{"finish_reason": agg.finish, "index": 0, "message": message}],
            "created": ctx.created, "model": ctx.model, "system_fingerprint": FINGERPRINT,
            "object": "chat.completion", "usage": _usage(ctx.prompt_tokens, agg.tokens), "id": ctx.id,
            "timings": _timings(ctx.prompt_tokens, agg.tokens),
        }
