"""OpenAI Chat Completions request -> canonical Request.

Tolerant input, strict output: unknown fields are accepted and dropped; a short allow-list of
OpenAI sampling parameters that have no canonical meaning is passed on as-is (`EXTRA_PARAMS`).
Every validation error names the field (`messages[2].content: ...`).
"""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec

from ... import canonical as c
from ... import schema_errors
from ..body import decode_object
from ..fields import invalid as _bad

# Passed on untouched when the client sends them: all are understood by vLLM, Ollama (most) and
# llama.cpp, and none changes what the gateway must do with the answer.
EXTRA_PARAMS = (
    "seed", "response_format", "presence_penalty", "frequency_penalty", "logit_bias",
    "logprobs", "top_logprobs", "min_p", "repetition_penalty", "n", "guided_json",
    "guided_regex", "guided_choice", "structured_outputs", "chat_template_kwargs",
)


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class Function(msgspec.Struct):
    name: str
    arguments: str = ""


class WireToolCall(msgspec.Struct):
    function: Function
    id: str = ""
    type: str = "function"


class FunctionDef(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict | None = None


class WireTool(msgspec.Struct):
    function: FunctionDef
    type: str = "function"


class WireMessage(msgspec.Struct):
    role: str
    content: Union[str, list[dict[str, Any]], None] = None
    tool_calls: list[WireToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None


class WireRequest(msgspec.Struct):
    model: str
    messages: list[WireMessage]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stop: Union[str, list[str], None] = None
    tools: list[WireTool] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    user: str | None = None
    reasoning_effort: str | None = None



def _path(err: msgspec.ValidationError) -> tuple[str, str]:
    """msgspec's "Expected `int`, got `str` - at `$.messages[0].x`" -> ("messages[0].x", "...")."""
    e = schema_errors.read(err)
    if e.kind == "missing":
        return e.at(e.field), "required field is missing"
    return e.path, e.text


def _parts(content: Any, where: str) -> list[c.Part]:
    if content is None:
        return []
    if isinstance(content, str):
        return [c.TextPart(content)]
    parts: list[c.Part] = []
    for i, p in enumerate(content):
        kind = p.get("type")
        if kind == "text" and isinstance(p.get("text"), str):
            parts.append(c.TextPart(p["text"]))
        elif kind == "image_url":
            image = p.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str):
                raise _bad(f"{where}[{i}].image_url.url", "expected a string URL")
            parts.append(c.ImagePart(url))
        else:
            raise _bad(f"{where}[{i}].type", f"unsupported content part type {kind!r}")
    return parts


# the roles a message may have, as canonical roles ("developer" is OpenAI's newer "system")
_ROLES: dict[str, Literal["system", "user", "assistant", "tool"]] = {
    "developer": "system", "system": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def _message(i: int, m: WireMessage) -> c.Message:
    where = f"messages[{i}]"
    role = _ROLES.get(m.role)
    if role is None:
        raise _bad(f"{where}.role", f"unknown role {m.role!r}")
    parts = _parts(m.content, f"{where}.content")
    if role == "tool":
        if not m.tool_call_id:
            raise _bad(f"{where}.tool_call_id", "a tool message needs the id of the call it answers")
        return c.Message("tool", parts, tool_call_id=m.tool_call_id)
    calls = [
        c.ToolCall(tc.id, tc.function.name, tc.function.arguments or "{}") for tc in (m.tool_calls or [])
    ]
    return c.Message(role, parts, tool_calls=calls, reasoning=m.reasoning or m.reasoning_content)


def _tool_choice(tc: Any) -> c.ToolChoice | None:
    if tc is None:
        return None
    if isinstance(tc, str):
        if tc not in ("auto", "required", "none"):
            raise _bad("tool_choice", f"expected auto, required, none or a function, got {tc!r}")
        return c.ToolChoice(tc)  # type: ignore[arg-type]
    fn = tc.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise _bad("tool_choice.function.name", "expected the name of a function")
    return c.ToolChoice("named", fn["name"])


def parse_request(body: bytes) -> tuple[c.Request, StreamOptions]:
    """-> (canonical request, what the client asked of its stream's usage reports)."""
    raw = decode_object(body)
    try:
        w = msgspec.convert(raw, WireRequest)
    except msgspec.ValidationError as err:
        param, msg = _path(err)
        raise _bad(param, msg[0].lower() + msg[1:] if msg else "invalid") from None
    if not w.model:
        raise _bad("model", "must not be empty")
    if not w.messages:
        raise _bad("messages", "must contain at least one message")
    max_tokens = w.max_completion_tokens if w.max_completion_tokens is not None else w.max_tokens
    if max_tokens is not None and max_tokens < 1:
        param = "max_completion_tokens" if w.max_completion_tokens is not None else "max_tokens"
        raise _bad(param, f"must be at least 1, got {max_tokens}")
    stop = [w.stop] if isinstance(w.stop, str) else list(w.stop or [])
    extra = {key: raw[key] for key in EXTRA_PARAMS if key in raw}
    req = c.Request(
        model=w.model,
        messages=[_message(i, m) for i, m in enumerate(w.messages)],
        stream=w.stream,
        max_tokens=max_tokens,
        temperature=w.temperature,
        top_p=w.top_p,
        top_k=w.top_k,
        stop=stop,
        tools=[
            c.Tool(t.function.name, t.function.description, t.function.parameters or {})
            for t in (w.tools or [])
        ],
        tool_choice=_tool_choice(w.tool_choice),
        parallel_tool_calls=w.parallel_tool_calls,
        user=w.user,
        reasoning_effort=w.reasoning_effort,
        extra=extra,
        cache_key=raw["prompt_cache_key"] if isinstance(raw.get("prompt_cache_key"), str) else None,
    )
    return req, w.stream_options or StreamOptions()
