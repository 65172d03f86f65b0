"""vLLM's OpenAI-compatible wire format, as of vLLM 0.32 (`vllm serve`, the one the suite runs:
tests/real/test_vllm_parity.py holds the two side by side).

Shapes follow vLLM's pydantic models and how it serialises them:
- stream chunks use `model_dump_json(exclude_unset=True)`: the first chunk is
  `delta: {"role": "assistant", "content": ""}` with `logprobs: null, finish_reason: null`,
  `prompt_token_ids: null` and `prompt_text: null`; token chunks carry `token_ids: null`; only the
  finishing chunk has `stop_reason` (null for the tokenizer's EOS and for `length`, the matched
  string for stop strings, the token id for a stop token such as Gemma's end of turn); with a
  reasoning (or tool) parser a token that brings no text (held back for a stop string, the end)
  sends no chunk, or `delta: {}` when it ends the answer, without one `{"content": ""}`; the last chunk (the usage chunk, `choices: []`, no
  null fields, when usage is asked for; else the finishing one) has `system_fingerprint`;
- with a reasoning parser, usage has `completion_tokens_details: {"reasoning_tokens": N}` (the
  continuous usage of every chunk too; without a parser that one says `null`); with
  `--enable-prompt-tokens-details` (the stub: a prefix cache modelled) the final usage has
  `prompt_tokens_details: {"cached_tokens", "created_cache_tokens"}`, 0s included;
- hidden reasoning (`include_reasoning: false`) sends no reasoning chunk, and each content delta
  says `"reasoning": null`;
- tool calls stream like the hermes parser: a first delta with id/type/index/function.name
  (no `arguments` key), then `{"index": 0, "function": {"arguments": "..."}}` fragments, each
  inside `{"content": null, "tool_calls": [...]}`; the finishing chunk's delta is `{}`;
- the non-streaming body is a full `model_dump()`, so unset optional fields appear as null;
- errors are `{"error": {"message", "type", "param", "code": <http status>}}`, a validation error's
  message ending ` (parameter=NAME, value=V)`; mid-stream errors are a `data: {"error": ...}` frame
  followed by `data: [DONE]`, and `--api-key` failures are `{"error": "Unauthorized"}`;
- the context: a prompt over it is refused, `max_tokens` over what the prompt leaves is fitted to
  it (vLLM before 0.17 refused that too: `legacy_context_errors`), `max_tokens` over the whole
  context or under 1 is refused.
"""

from __future__ import annotations

import uuid
from http import HTTPStatus
from typing import Any

from .flavour import Aggregate, Flavour, Rejection, ResponseContext
from .timeline import Event, Step

FINGERPRINT = "vllm-0.32.0-5f7c0a1e"  # vLLM's is its version and a hash of its configuration

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
        return f"chatcmpl-{given or uuid.uuid4().hex[:16]}"

    def tool_call_id(self) -> str:
        return f"chatcmpl-tool-{uuid.uuid4().hex[:16]}"

    def error(self, status: int, message: str, *, param: str | None = None) -> Rejection:
        body = {"error": {"message": message, "type": _error_type(status), "param": param, "code": status}}
        return Rejection(status, body)

    def unauthorized(self) -> Rejection:
        return Rejection(401, {"error": "Unauthorized"})

    def validation_error(self, message: str, param: str, value: Any = None) -> Rejection:
        """A VLLMValidationError: its parameter and value appended to the message."""
        extras = f"parameter={param}" + (f", value={value}" if value is not None else "")
        return self.error(400, f"{message} ({extras})", param=param)

    def model_not_found(self, model: str, served: tuple[str, ...] = ()) -> Rejection:
        aliases = f" Valid aliases: {', '.join(served)}." if served else ""
        return self.error(404, f"The model `{model}` does not exist.{aliases}", param="model")

    def no_messages(self) -> Rejection:
        return self.error(400, "Cannot apply chat template to an empty conversation. Provide at least one message.")

    def check_request(self, body: dict) -> Rejection | None:
        for key in ("max_tokens", "max_completion_tokens"):
            value = body.get(key)
            if isinstance(value, str) and not value.strip().lstrip("+-").isdigit():
                # pydantic's own refusal of the field (FastAPI's RequestValidationError)
                detail = {"type": "int_parsing", "loc": f"body.{key}",
                          "msg": "Input should be a valid integer, unable to parse string as an integer",
                          "input": value}
                return Rejection(400, {"error": {"message": f"1 validation error:\n  {detail!r}",
                                                 "type": "Bad Request", "param": f"body.{key}", "code": 400}})
        # pydantic validator on ChatCompletionRequest; bites gateways that always send it.
        if body.get("stream_options") and not body.get("stream"):
            return self.validation_error("Stream options can only be defined when `stream=True`.", "stream_options")
        return None

    def check_context(self, prompt_tokens: int, max_tokens: int | None, max_model_len: int,
                      *, param: str = "max_tokens") -> Rejection | None:
        if self.legacy_context_errors:
            return self._legacy_check_context(prompt_tokens, max_tokens, max_model_len)
        # in vLLM's order: the request's own limits (TokenizeParams), the prompt once rendered,
        # then the sampling parameters with max_tokens fitted to what the prompt leaves
        if max_tokens is not None and max_tokens > max_model_len:
            return self.validation_error(
                f"{param}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                f"Please request fewer output tokens.", param, max_tokens)
        if prompt_tokens > max_model_len:
            # vLLM tokenizes a prompt truncated to one token past the context: it counts that many
            seen = min(prompt_tokens, max_model_len + 1)
            at_least = "at least " if seen == max_model_len + 1 else ""
            return self.validation_error(
                f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                f"contains {at_least}{seen} input tokens, which exceeds this limit even without any output "
                f"tokens. Please reduce the length of the input prompt.", "input_tokens", seen)
        budget = self.output_budget(prompt_tokens, max_tokens, max_model_len)
        if budget is not None and budget < 1:
            return self.validation_error(f"max_tokens must be at least 1, got {budget}.", "max_tokens", budget)
        return None

    def output_budget(self, prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int | None:
        room = max_model_len - prompt_tokens  # what vLLM generates at most (get_max_tokens)
        if self.legacy_context_errors:
            return room if max_tokens is None else max_tokens
        return room if max_tokens is None else min(room, max_tokens)

    def _legacy_check_context(self, prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> Rejection | None:
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
                "id": f"modelperm-{uuid.uuid4().hex[:16]}",
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
            usage = _usage(ctx.prompt_tokens, completion_tokens)
            # set on every chunk, so serialised even when None (exclude_unset, not exclude_none)
            usage["completion_tokens_details"] = _reasoning_details(ctx)
            chunk["usage"] = usage
        return chunk

    def stream_open(self, ctx: ResponseContext) -> list[dict]:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        chunk = self._chunk(ctx, choice, 0)
        chunk["prompt_token_ids"] = None
        chunk["prompt_text"] = None
        return [chunk]

    def _delta(self, ctx: ResponseContext, step: Step) -> dict:
        delta: dict[str, Any] = {}
        if step.tool_calls:
            delta["content"] = step.content  # the hermes parser sets it, even to None
        elif step.content or (step.content is not None and not ctx.reasoning_parser):
            # With a parser vLLM sends no text it does not have: no chunk for a token it holds
            # back (a stop string may begin there), and `delta: {}` for an end that brings none.
            # Without one each such token is a `{"content": ""}` of its own.
            delta["content"] = step.content
        if step.reasoning is not None and ctx.include_reasoning:
            for name in ctx.reasoning_fields:
                delta[name] = step.reasoning
        elif "content" in delta and not ctx.include_reasoning and ctx.reasoning_parser:
            for name in ctx.reasoning_fields:
                delta[name] = None  # hidden reasoning: the parser's delta keeps the field, emptied
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
        chunk = self._chunk(ctx, choice, completion_tokens)
        if step.finish is not None and not ctx.include_usage:
            chunk["system_fingerprint"] = FINGERPRINT  # the last chunk has it
        return chunk

    def stream_usage(self, ctx: ResponseContext, completion_tokens: int) -> dict:
        # exclude_none: the details only when there are some
        usage = _usage(ctx.prompt_tokens, completion_tokens)
        if ctx.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": ctx.cached_tokens,
                                              "created_cache_tokens": ctx.created_cache_tokens or 0}
        if ctx.reasoning_parser:
            usage["completion_tokens_details"] = _reasoning_details(ctx)
        return {
            "id": ctx.id,
            "object": "chat.completion.chunk",
            "created": ctx.created,
            "model": ctx.model,
            "choices": [],
            "usage": usage,
            "system_fingerprint": FINGERPRINT,
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
        ctx.reasoning_tokens = agg.reasoning_tokens
        usage = _usage(ctx.prompt_tokens, agg.tokens)
        usage["prompt_tokens_details"] = None if ctx.cached_tokens is None else {
            "cached_tokens": ctx.cached_tokens, "created_cache_tokens": ctx.created_cache_tokens or 0,
            "multimodal_tokens": None}
        usage["completion_tokens_details"] = _reasoning_details(ctx)
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
                    "routed_experts": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": usage,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "prompt_text": None,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _reasoning_details(ctx: ResponseContext) -> dict | None:
    """usage.completion_tokens_details: the reasoning tokens, counted when a reasoning parser runs."""
    return {"reasoning_tokens": ctx.reasoning_tokens} if ctx.reasoning_parser else None
