"""The `Response` object of the OpenAI Responses API, as openai-python's
`types/responses/response.py` defines it: envelope, output items, usage, status. Pure.

Both answer paths build it the same way: the stream encoder (stream.py) holds the output items as
it emits them, and a plain (non-streaming) request runs the same encoder without writing its
frames, then takes `encoder.response()`. So a streamed answer's final `response.completed` and the
plain answer to the same upstream output are equal by construction.

Choices
-------
* `id` is `resp_` + 24 hex digits; items are `rs_` (reasoning), `msg_` (message), `fc_`
  (function call) + hex; a function call's `call_id` is the upstream's tool-call id when it is a
  plausible id, else `call_` + hex.
* `model` is the name the client sent; `created_at` whole seconds (as OpenAI sends it).
* Output order is emission order: a reasoning item (raw reasoning as `content: [{type:
  "reasoning_text"}]` with `summary: []`, as vLLM serves it) before the message it led to.
* `status`: `completed`, or `incomplete` with `incomplete_details.reason` `max_output_tokens`
  (upstream finish_reason length) or `content_filter`; the item cut short is `incomplete` too.
  After a failure: `failed` with `error: {code, message}`.
* `usage` from the upstream: `input_tokens` / `output_tokens` / `total_tokens`; null when the
  upstream reported no counts (never invented). `input_tokens_details.cached_tokens` and
  `output_tokens_details.reasoning_tokens` are always there, as OpenAI sends them (openai-python's
  `ResponseUsage` requires both): the upstream's cached count, or 0 when it reported none; the
  upstream's reasoning count (vLLM's completion_tokens_details.reasoning_tokens), else the
  gateway's count of reasoning deltas (stream.py), at most `output_tokens`.
* A reasoning item carries its text as `content` (`reasoning_text`), or, when the client asked
  for `reasoning.summary`, as its one `summary_text` part with `content` empty (stream.py says
  why); `items.reasoning_text(item)` reads it back either way.
* The request's `tools`, `tool_choice`, `text`, `reasoning`, `metadata`, ... are echoed as sent;
  `parallel_tool_calls` defaults to true and `tool_choice` to auto, as the API does.
"""

from __future__ import annotations

import secrets
import time
from typing import TypedDict

from .request import ParsedRequest


class _InputDetails(TypedDict):
    cached_tokens: int


class _OutputDetails(TypedDict):
    reasoning_tokens: int


class ResponseUsage(TypedDict):
    """openai-python's `ResponseUsage`: every field required."""

    input_tokens: int
    input_tokens_details: _InputDetails
    output_tokens: int
    output_tokens_details: _OutputDetails
    total_tokens: int


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def base_response(resp_id: str, req: ParsedRequest, previous_response_id: str | None) -> dict:
    """The envelope with every field that does not depend on the answer, in OpenAI's order."""
    echo = req.echo
    return {
        "id": resp_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": req.model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
        "previous_response_id": previous_response_id,
        "reasoning": echo.get("reasoning") or {"effort": None, "summary": None},
        "store": req.store,
        "temperature": req.temperature,
        "text": echo.get("text") or {"format": {"type": "text"}},
        "tool_choice": echo.get("tool_choice", "auto"),
        "tools": echo.get("tools", []),
        "top_p": req.top_p,
        "truncation": echo.get("truncation", "disabled"),
        "usage": None,
        "user": req.user,
        "metadata": echo.get("metadata", {}),
    }


def usage_object(input_tokens: int | None, output_tokens: int | None, cached: int | None,
                 reasoning: int = 0) -> ResponseUsage | None:
    if input_tokens is None and output_tokens is None:
        return None
    i, o = input_tokens or 0, output_tokens or 0
    return {"input_tokens": i, "input_tokens_details": {"cached_tokens": cached or 0},
            "output_tokens": o, "output_tokens_details": {"reasoning_tokens": min(reasoning, o)},
            "total_tokens": i + o}


def reasoning_item(item_id: str, text: str, status: str, sealed: str | None, *, summary: bool = False) -> dict:
    part = [{"type": "summary_text" if summary else "reasoning_text", "text": text}]
    item = {"id": item_id, "type": "reasoning", "summary": part if summary else [],
            "content": [] if summary else part, "status": status}
    if sealed is not None:
        item["encrypted_content"] = sealed
    return item


def message_item(item_id: str, text: str, status: str) -> dict:
    return {"id": item_id, "type": "message", "role": "assistant", "status": status,
            "content": [output_text_part(text)]}


def output_text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call_id: str, name: str, namespace: str | None,
                       arguments: str, status: str) -> dict:
    item = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}
    if namespace is not None:
        item["namespace"] = namespace
    return item
