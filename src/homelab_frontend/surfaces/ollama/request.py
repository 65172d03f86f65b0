"""Ollama `/api/chat` and `/api/generate` bodies -> canonical `Request` (pure: bytes in, a `Call`
or a `GatewayError` out).

The body is decoded once into plain JSON and walked by hand, so every refusal names its field
(`messages[2].images[0]: not base64 data`) and `param` holds that path. Fields we do not use are
accepted and dropped; the canonical request is built field by field, so nothing unknown reaches
an upstream.

Choices, rule by rule
---------------------
stream
    Absent means true (Ollama's default; the official Python library always sends it anyway).
messages (/api/chat)
    `system`, `user`, `assistant`, `tool`; any other role is a 400 naming `messages[i].role`.
    `content` a string (absent or null: empty: the Python library drops an empty `content`, so an
    assistant tool-call turn arrives without one). `images`: base64 strings (Ollama's shape, no
    `data:` prefix; a `data:` URL is taken as it is) -> ImagePart `data:<type>;base64,...`, the
    type sniffed from the first bytes (PNG, JPEG, GIF, WebP; else image/jpeg, which vision
    servers decode by content anyway). `thinking` on an assistant turn -> Message.reasoning (sent
    back upstream as `reasoning`, as Ollama's OpenAI layer does).
tool calls and their answers
    Ollama's tool calls carry no id (newer servers and the JavaScript library may send one:
    honoured when sent) and its tool messages name the tool (`tool_name`) rather than the call;
    OpenAI-shaped upstreams need both tied by an id. A call without an id gets
    `call_<message index>_<call index>`: derived from its position, so each turn renders the
    earlier ones exactly as before (prefix cache). A tool message with `tool_call_id` keeps it;
    else it answers the earliest unanswered call of the turns before it with that `tool_name`
    (or, without a name, the earliest unanswered call at all); failing both, it gets
    `call_<message index>` and the upstream's template decides. `arguments` are an object (or a
    JSON text, which the JavaScript library passes through); anything else is a 400.
tools
    `[{"type": "function", "function": {name, description, parameters}}]`; `"tools": []` (the
    Python library always sends it) means none.
think
    true/false -> reasoning_enabled; "low"/"medium"/"high" -> enabled with that effort; any other
    value is a 400 (Ollama refuses it too). Absent: not said (the upstream's default).
format
    "json" -> `response_format: {"type": "json_object"}`; an object -> a JSON schema
    (`json_schema`, named "format"); "" or null -> none; anything else a 400.
options
    temperature, top_p, top_k, stop (a string or a list), seed, presence_penalty,
    frequency_penalty, min_p are used; `num_predict` becomes max_tokens (so it is fitted to the
    context like every max_tokens: request/context_clamp.py); -1 (no limit) and -2 (fill the
    context) mean none. Every other option (num_ctx, num_gpu, mirostat, repeat_penalty...) is
    accepted and ignored: no OpenAI-shaped backend changes its context or loading per request
    (vLLM's max_model_len and llama.cpp's -c are fixed at launch; Ollama's OpenAI layer reads no
    num_ctx). A used option of the wrong type is a 400 naming `options.<name>`.
keep_alive
    A duration string ("5m", "1h30m"), a number of seconds, 0 or -1 (forever). For a managed
    backend (`run:`) it replaces `run.idle_ttl_s` from this request on, and 0 unloads it once its
    running requests finish (handler.py); other backends have no lifetime to set, so it is
    validated and unused. Open WebUI's unload is `{"model", "prompt": "", "keep_alive": 0}`.
/api/generate
    `system` -> a system message, `prompt` (+ top-level `images`) -> one user message. A request
    with no prompt and no messages only loads (or with keep_alive 0 unloads) the model in Ollama:
    the Call says so and the handler answers one JSON object without an upstream request.
    `raw: true` (the prompt verbatim, no chat template) and `suffix` (fill in the middle) make it
    a completion instead (`Call.text`, a completions/request.TextCall: the backend's
    /v1/completions, the suffix through the model's FIM template; surfaces/completions/), with
    the same options; images and `format` cannot go with it (a 400 naming the field). A non-empty
    `context` (token ids of an earlier answer) and `template` cannot be honoured: each is a 400
    naming the field rather than an answer to a different question.
"""

from __future__ import annotations

import binascii
from typing import Any, Literal

import msgspec

from ... import canonical as c
from ...lifecycle.keep_alive import Forever, seconds as keep_alive_seconds
from ..body import decode_object
from ..completions.request import TextCall
from ..fields import boolean as _bool, function_tool, integer, invalid as _bad, kind_of as _kind, number, string as _str

__all__ = ["Call", "parse_chat", "parse_generate"]

_EFFORTS = ("low", "medium", "high")
_ROLES = ("system", "user", "assistant", "tool")


class Call(msgspec.Struct):
    """A parsed /api/chat or /api/generate body."""

    endpoint: Literal["chat", "generate"]
    model: str
    stream: bool
    request: c.Request | None  # None: only load / unload the model (no prompt, no messages)
    keep_alive: float | Forever | None = None  # in seconds (lifecycle/keep_alive.py)
    # /api/generate with `raw: true` or a `suffix`: a completion (surfaces/completions/), not a chat
    text: TextCall | None = None

    @property
    def unload(self) -> bool:
        return self.keep_alive == 0


_SNIFF = (
    (b"\x89PNG", "image/png"),
    (b"\xff\xd8", "image/jpeg"),
    (b"GIF8", "image/gif"),
    (b"RIFF", "image/webp"),
)


def _image(v: Any, path: str) -> c.ImagePart:
    if not isinstance(v, str) or not v:
        raise _bad(path, f"expected base64 image data, got {_kind(v)}")
    if v.startswith("data:"):
        return c.ImagePart(v)
    try:
        head = binascii.a2b_base64(v[:16].encode())
        binascii.a2b_base64(v.encode(), strict_mode=False)
    except (binascii.Error, ValueError, UnicodeEncodeError):
        raise _bad(path, "not base64 image data") from None
    media = next((t for magic, t in _SNIFF if head.startswith(magic)), "image/jpeg")
    return c.ImagePart(f"data:{media};base64,{v}")


def _images(raw: dict, path: str) -> list[c.Part]:
    v = raw.get("images")
    if v is None:
        return []
    if not isinstance(v, list):
        raise _bad(path, f"expected a list of base64 images, got {_kind(v)}")
    return [_image(img, f"{path}[{j}]") for j, img in enumerate(v)]


def _arguments(v: Any, path: str) -> str:
    if v is None:
        return "{}"
    if isinstance(v, dict):
        return msgspec.json.encode(v).decode()
    if isinstance(v, str):
        try:
            parsed = msgspec.json.decode(v) if v.strip() else {}
        except msgspec.DecodeError:
            raise _bad(path, "expected an object, or a JSON text of one") from None
        if isinstance(parsed, dict):
            return v if v.strip() else "{}"
    raise _bad(path, f"expected an object, got {_kind(v)}")


class _Calls:
    """The tool calls of the turns so far, for tool messages that name a tool, not a call."""

    def __init__(self) -> None:
        self.open: list[c.ToolCall] = []  # not yet answered, in order

    def add(self, calls: list[c.ToolCall]) -> None:
        self.open.extend(calls)

    def answer(self, call_id: str | None, name: str | None) -> str | None:
        if call_id is not None:
            self.open = [t for t in self.open if t.id != call_id]
            return call_id
        for k, t in enumerate(self.open):
            if name is None or t.name == name:
                del self.open[k]
                return t.id
        return None


def _functions(v: Any, path: str):
    """(`<path>[j]`, the entry, its `function` object) for each entry of a tools or tool_calls list
    (none for a missing one); a list that is no list, an entry that is no object, or one with no
    `function` object, is a 400 naming it."""
    if v is None:
        return
    if not isinstance(v, list):
        raise _bad(path, f"expected a list, got {_kind(v)}")
    for j, entry in enumerate(v):
        where = f"{path}[{j}]"
        if not isinstance(entry, dict):
            raise _bad(where, f"expected an object, got {_kind(entry)}")
        fn = entry.get("function")
        if not isinstance(fn, dict):
            raise _bad(f"{where}.function", "required object field is missing")
        yield where, entry, fn


def _tool_calls(v: Any, i: int, path: str) -> list[c.ToolCall]:
    out = []
    for j, (where, tc, fn) in enumerate(_functions(v, path)):
        name = _str(fn, "name", f"{where}.function.name", required=True)
        call_id = tc.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{i}_{j}"
        out.append(c.ToolCall(call_id, name or "", _arguments(fn.get("arguments"), f"{where}.function.arguments")))
    return out


def _message(i: int, m: Any, calls: _Calls) -> c.Message:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _bad(where, f"expected an object, got {_kind(m)}")
    role = m.get("role")
    if role not in _ROLES:
        raise _bad(f"{where}.role", f"expected system, user, assistant or tool, got {role!r}")
    content = _str(m, "content", f"{where}.content") or ""
    parts: list[c.Part] = [c.TextPart(content)] if content else []
    parts.extend(_images(m, f"{where}.images"))
    if role == "tool":
        call_id = _str(m, "tool_call_id", f"{where}.tool_call_id") or None
        name = _str(m, "tool_name", f"{where}.tool_name") or _str(m, "name", f"{where}.name")
        answered = calls.answer(call_id, name)
        return c.Message("tool", parts, tool_call_id=answered or f"call_{i}")
    if role == "assistant":
        tool_calls = _tool_calls(m.get("tool_calls"), i, f"{where}.tool_calls")
        calls.add(tool_calls)
        reasoning = _str(m, "thinking", f"{where}.thinking") or None
        return c.Message("assistant", parts, tool_calls=tool_calls, reasoning=reasoning)
    return c.Message(role, parts)


def _tools(v: Any) -> list[c.Tool]:
    out = []
    for where, _, fn in _functions(v, "tools"):
        out.append(function_tool(fn, f"{where}.function"))
    return out


def _think(v: Any) -> tuple[bool | None, str | None]:
    if v is None:
        return None, None
    if isinstance(v, bool):
        return v, None
    if isinstance(v, str) and v in _EFFORTS:
        return True, v
    raise _bad("think", f"expected true, false, or one of low, medium, high, got {v!r}")


def _format(v: Any) -> dict | None:
    if v is None or v == "":
        return None
    if v == "json":
        return {"type": "json_object"}
    if isinstance(v, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": v}}
    raise _bad("format", f'expected "json" or a JSON schema object, got {v!r}'[:200])


def _keep_alive(v: Any) -> float | Forever | None:
    if v is None:
        return None
    try:
        return keep_alive_seconds(v)
    except ValueError as err:
        raise _bad("keep_alive", str(err)) from None


def _options(v: Any, req: c.Request) -> None:
    if v is None:
        return
    if not isinstance(v, dict):
        raise _bad("options", f"expected an object, got {_kind(v)}")
    for key in ("temperature", "top_p", "presence_penalty", "frequency_penalty", "min_p"):
        sent = number(v.get(key), f"options.{key}")
        if sent is None:
            continue
        value = float(sent)
        if key == "temperature":
            if value < 0:
                raise _bad("options.temperature", f"must be at least 0, got {v[key]}")
            req.temperature = value
        elif key == "top_p":
            if not 0 <= value <= 1:
                raise _bad("options.top_p", f"must be between 0 and 1, got {v[key]}")
            req.top_p = value
        else:
            req.extra[key] = v[key]
    top_k = integer(v.get("top_k"), "options.top_k")
    if top_k is not None:
        if top_k < 0:
            raise _bad("options.top_k", f"must be at least 0, got {top_k}")
        req.top_k = top_k
    if v.get("seed") is not None:
        req.extra["seed"] = integer(v["seed"], "options.seed")
    n = integer(v.get("num_predict"), "options.num_predict")
    if n is not None:
        if n in (-1, -2):
            req.max_tokens = None
        elif n < 1:
            raise _bad("options.num_predict", f"must be at least 1, or -1 (no limit) or -2 (fill the context), got {n}")
        else:
            req.max_tokens = n
    stop = v.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            stop = [stop]
        if not isinstance(stop, list):
            raise _bad("options.stop", f"expected a list of strings, got {_kind(stop)}")
        for k, s in enumerate(stop):
            if not isinstance(s, str):
                raise _bad(f"options.stop[{k}]", f"expected a string, got {_kind(s)}")
        req.stop = [s for s in stop if s]


def _common(raw: dict, endpoint: Literal["chat", "generate"], messages: list[c.Message]) -> Call:
    model = _str(raw, "model", "model", required=True) or ""
    if not model:
        raise _bad("model", "must not be empty")
    stream = _bool(raw, "stream", "stream")
    stream = True if stream is None else stream
    enabled, effort = _think(raw.get("think"))
    req = c.Request(model=model, messages=messages, stream=stream, tools=_tools(raw.get("tools")),
                    reasoning_enabled=enabled, reasoning_effort=effort)
    fmt = _format(raw.get("format"))
    if fmt is not None:
        req.extra["response_format"] = fmt
    _options(raw.get("options"), req)
    return Call(endpoint, model, stream, req, _keep_alive(raw.get("keep_alive")))


def parse_chat(body: bytes) -> Call:
    raw = decode_object(body)
    v = raw.get("messages")
    if v is not None and not isinstance(v, list):
        raise _bad("messages", f"expected a list of messages, got {_kind(v)}")
    calls = _Calls()
    messages = [_message(i, m, calls) for i, m in enumerate(v or [])]
    call = _common(raw, "chat", messages)
    if not messages:
        call.request = None  # Ollama: an empty chat loads the model
    return call


def _text_call(call: Call, prompt: str, suffix: str | None) -> TextCall:
    """The completion a raw or suffix generate asks for, its options as the chat's (validated by
    _options): num_predict, temperature, top_p, top_k, stop, seed, penalties, min_p."""
    req = call.request
    assert req is not None
    params: dict = {k: v for k, v in req.extra.items() if k in ("seed", "presence_penalty", "frequency_penalty", "min_p")}
    for key in ("max_tokens", "temperature", "top_p", "top_k"):
        if getattr(req, key) is not None:
            params[key] = getattr(req, key)
    if req.stop:
        params["stop"] = list(req.stop)
    return TextCall("generate", call.model, call.stream, prompt, suffix, params=params, include_usage=True)


def parse_generate(body: bytes) -> Call:
    raw = decode_object(body)
    if _str(raw, "template", "template"):
        raise _bad("template", "a per-request prompt template is not available through this gateway: "
                               "send the prompt already in the form you want with raw: true")
    suffix = _str(raw, "suffix", "suffix") or None
    raw_prompt = bool(_bool(raw, "raw", "raw"))
    context = raw.get("context")
    if context is not None and context != []:
        raise _bad("context", "the token context of an earlier answer cannot be continued through this "
                              "gateway (it never returns one); send the conversation to /api/chat instead")
    prompt = _str(raw, "prompt", "prompt") or ""
    system = _str(raw, "system", "system") or ""
    images = _images(raw, "images")
    if raw_prompt or suffix is not None:
        if images:
            raise _bad("images", "images cannot go with a raw prompt or a suffix through this gateway "
                                 "(its completions endpoint takes text)")
        if raw.get("format") not in (None, ""):
            raise _bad("format", "a structured format cannot go with a raw prompt or a suffix through this gateway")
        call = _common(raw, "generate", [c.Message("user", [c.TextPart(prompt)])])
        if not (prompt or suffix):
            call.request = None  # nothing to complete: a load (or an unload), as without raw
            return call
        # `system` has no place in a raw prompt (Ollama ignores it there too)
        call.text = _text_call(call, prompt, suffix)
        return call
    messages: list[c.Message] = []
    if system:
        messages.append(c.Message("system", [c.TextPart(system)]))
    if prompt or images:
        parts: list[c.Part] = [c.TextPart(prompt)] if prompt else []
        messages.append(c.Message("user", parts + images))
    call = _common(raw, "generate", messages)
    if not (prompt or images):
        call.request = None  # Ollama: no prompt loads the model (keep_alive 0: unloads it)
    return call
