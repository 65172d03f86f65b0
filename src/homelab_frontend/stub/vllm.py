"""vLLM's OpenAI-compatible wire format, as of vLLM 0.11-0.16+ (`vllm serve`).

Shapes follow vLLM's pydantic models and how it serialises them:
- stream chunks use `model_dump_json(exclude_unset=True)`: the first chunk is
  `delta: {"role": "assistant", "content": ""}` with `logprobs: null, finish_reason: null`
  and `prompt_token_ids: null`; token chunks carry `token_ids: null`; only the finishing chunk
  has `stop_reason` (null for EOS, the matched string for stop strings, an int for stop
  token ids); the usage chunk has `choices: []` and no null fields;
- tool calls stream like the hermes parser: a first delta with id/type/index/function.name
  (no `arguments` key), then `{"index": 0, "function": {"arguments": "..."}}` fragments, each
  inside `{"content": null, "tool_calls": [...]}`; the finishing chunk's delta is `{}`;
- the non-streaming body is a full `model_dump()`, so unset optional fields appear as null;
- errors are `{"error": {"message", "type", "param", "code": <http status>}}` (the flat
  `{"object": "error", ...}` shape is pre-0.10), mid-stream errors are a `data: {"error": ...}`
  frame followed by `data: [DONE]`, and `--api-key` failures are `{"error": "Unauthorized"}`.
"""

from __future__ import annotations

import uuid
from http import HTTPStatus
from typing import Any

from .flavour import Aggregate, Flavour, Rejection, ResponseContext
from .timeline import Event, Step

_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    422: "UnprocessableEntityError",
    500: "InternalServerError",
    501: "NotImplementedError",
}


def _error_type(status: int) -> str:
    if status in _ERROR_TYPES:
        return _ERROR_TYPES[status]
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "InternalServerError"


class Vllm(Flavour):
    name = "vllm"
    default_model = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
    stream_content_type = "text/event-stream; charset=utf-8"
    vllm_extras = True

    def completion_id(self, headers: Any) -> str:
        # vLLM takes the request id from X-Request-Id when the caller sends one.
        given = headers.get("X-Request-Id") if headers is not None else None
        return f"chatcmpl-{given or uuid.uuid4().hex}"

    def tool_call_id(self) -> str:
        return f"chatcmpl-tool-{uuid.uuid4().hex}"

    def error(self, status: int, message: str, *, param: str | None = None) -> Rejection:
        body = {"error": {"message": message, "type": _error_type(status), "param": param, "code": status}}
        return Rejection(status, body)

    def unauthorized(self) -> Rejection:
        return Rejection(401, {"error": "Unauthorized"})

    def model_not_found(self, model: str) -> Rejection:
        return self.error(404, f"The model `{model}` does not exist.")

    def check_request(self, body: dict) -> Rejection | None:
        # pydantic validator on ChatCompletionRequest; bites gateways that always send it.
        if body.get("stream_options") and not body.get("stream"):
            return self.error(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
        return None

    def check_context(self, prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> Rejection | None:
        if prompt_tokens > max_model_len or (max_tokens is None and prompt_tokens >= max_model_len):
            return self.error(
                400,
                f"This model's maximum context length is {max_model_len} tokens. However, your "
                f"request has {prompt_tokens} input tokens. Please reduce the length of the input "
                f"messages. (parameter=input_tokens, value={prompt_tokens})",
                param="input_tokens",
            )
        if max_tokens is not None and prompt_tokens + max_tokens > max_model_len:
            return self.error(
                400,
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                f"maximum context length is {max_model_len} tokens and your request has "
                f"{prompt_tokens} input tokens ({max_tokens} > {max_model_len} - {prompt_tokens}). "
                f"(parameter=max_tokens, value={max_tokens})",
                param="max_tokens",
            )
        return None

    def models_list(self, models: list[str], max_model_len: int, created: int) -> dict:
        def card(model: str) -> dict:
            permission = {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
            return {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": model,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [permission],
            }

        return {"object": "list", "data": [card(m) for m in models]}

    def embeddings(self, model: str, vectors: list[list[float]], prompt_tokens: int, created: int) -> dict:
        return {
            "id": f"embd-{uuid.uuid4().hex}",
            "object": "list",
            "created": created,
            "model": model,
            "data": [{"index": i, "object": "embedding", "embedding": v} for i, v in enumerate(vectors)],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens,
                "completion_tokens": 0,
                "prompt_tokens_details": None,
            },
        }

    # -- streaming --
    def _chunk(self, ctx: ResponseContext, choice: dict, completion_tokens: int | None) -> dict:
        chunk = {
            "id": ctx.id,
            "object": "chat.completion.chunk",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [choice],
        }
        if ctx.continuous_usage and completion_tokens is not None:
            chunk["usage"] = _usage(ctx.prompt_tokens, completion_tokens, reasoning_tokens=ctx.reasoning_tokens)
        return chunk

    def stream_open(self, ctx: ResponseContext) -> list[dict]:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        chunk = self._chunk(ctx, choice, 0)
        chunk["prompt_token_ids"] = None
        return [chunk]

    def _delta(self, ctx: ResponseContext, step: Step) -> dict:
        delta: dict[str, Any] = {}
        if step.tool_calls:
            delta["content"] = step.content  # the hermes parser sets it, even to None
        elif step.content is not None:
            delta["content"] = step.content
        if step.reasoning is not None and ctx.include_reasoning:
            for name in ctx.reasoning_fields:
                delta[name] = step.reasoning
        if step.tool_calls:
            delta["tool_calls"] = [self._tool_delta(ctx, d) for d in step.tool_calls]
        return delta

    def _tool_delta(self, ctx: ResponseContext, d: Any) -> dict:
        if d.name is not None:
            tool_id = ctx.tool_ids.setdefault(d.index, self.tool_call_id())
            out = {"id": tool_id, "type": "function", "index": d.index, "function": {"name": d.name}}
            if d.arguments is not None:
                out["function"]["arguments"] = d.arguments
            return out
        return {"index": d.index, "function": {"arguments": d.arguments or ""}}

    def stream_step(self, ctx: ResponseContext, step: Step, completion_tokens: int) -> dict | None:
        if step.reasoning is not None:
            ctx.reasoning_tokens += step.tokens
        delta = self._delta(ctx, step)
        if not delta and step.finish is None:
            return None  # hidden reasoning (include_reasoning=false): vLLM sends nothing
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
        choice["finish_reason"] = step.finish
        if step.finish is not None:
            choice["stop_reason"] = step.stop_reason
        choice["token_ids"] = None
        return self._chunk(ctx, choice, completion_tokens)

    def stream_usage(self, ctx: ResponseContext, completion_tokens: int) -> dict:
        return {
            "id": ctx.id,
            "object": "chat.completion.chunk",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [],
            "usage": _usage(ctx.prompt_tokens, completion_tokens, ctx.cached_tokens, ctx.reasoning_tokens),
        }

    def stream_error(self, ctx: ResponseContext) -> dict:
        return self.error(500, "Internal server error").body

    # -- non-streaming --
    def completion(self, ctx: ResponseContext, events: list[Event]) -> dict:
        agg = Aggregate.of(events)
        message: dict[str, Any] = {
            "role": "assistant",
            "content": agg.content if agg.saw_content else (None if agg.saw_reasoning or agg.tool_name else ""),
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        if agg.tool_name is not None:
            tool_id = ctx.tool_ids.setdefault(0, self.tool_call_id())
            function = {"name": agg.tool_name, "arguments": agg.tool_arguments}
            message["tool_calls"] = [{"id": tool_id, "type": "function", "function": function}]
        for name in ctx.reasoning_fields:
            message[name] = agg.reasoning if agg.saw_reasoning and ctx.include_reasoning else None
        usage = _usage(ctx.prompt_tokens, agg.tokens, ctx.cached_tokens, agg.reasoning_tokens)
        usage.setdefault("prompt_tokens_details", None)
        return {
            "id": ctx.id,
            "object": "chat.completion",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": agg.finish,
                    "stop_reason": agg.stop_reason,
                    "token_ids": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
        }


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None,
           reasoning_tokens: int = 0) -> dict:
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    # As vLLM with --enable-prompt-tokens-details: the final usage (not the continuous per-chunk
    # stats) gets the cached count, and only when it is not 0 (`if ... and num_cached_tokens`).
    if cached_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    # As vLLM 0.32 with a reasoning parser: every usage object (continuous ones too) says how many
    # of the completion tokens were reasoning, 0 included.
    usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return usage
