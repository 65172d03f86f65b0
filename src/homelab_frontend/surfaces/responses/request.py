"""OpenAI Responses request -> canonical messages, tools and sampling (pure: bytes in, a
`ParsedRequest` or a `GatewayError` out).

Every failure is `GatewayError("invalid_request", "<path>: <why>", param=<path>)` with the path in
the client's terms (`input[3].content[0].type`). Unknown fields are accepted and never forwarded:
the canonical request is built field by field.

Choices, rule by rule
---------------------
input
    A string (one user message) or a list of items. `message` items (also the type-less "easy"
    form `{role, content}`): roles `developer` and `system` -> system, `user`, `assistant`;
    content a string or parts `input_text` / `output_text` / `refusal` (text, in any role: Codex
    replays its own answers as `output_text`), `input_image` (`image_url`, a URL or data: URL;
    `file_id` -> 400: there is no Files API here); any other part -> 400 naming it.
    `function_call` -> a tool call on the assistant message it follows (a run of assistant text and
    calls is one assistant turn upstream, as chat templates expect), its name flattened as below.
    `function_call_output` -> a tool message (output a string or text parts).
    `reasoning` -> the next assistant turn's reasoning, only when its `encrypted_content` opens
    under this gateway's secret (sealed.py); plain `content` from a client cannot be verified and
    is dropped, as are forged blobs (never an error: the conversation goes on without it).
    `item_reference` ({id}): the stored item of that id, parsed as if sent in its place; parsing
    is then two passes: the first collects the ids (`ParsedRequest.references`), the handler reads
    them from the store (items.py: an id the key does not own is a 404), the second parses with
    `resolved`. A reasoning item from the store is the gateway's own: its text is trusted.
    Items of hosted tools (web_search_call, file_search_call, computer_call, ...), `compaction`
    and other item types the gateway cannot express -> dropped when they are hosted-tool records,
    else 400 naming `input[i].type`.
    `input_items`: the input as items (a string as one user message, string content as one text
    part, references replaced), what GET .../input_items lists.
instructions
    A system message before everything else (never stored with the conversation: the API does not
    carry instructions over a `previous_response_id`).
tools
    `function` tools as they are. `namespace` groups (Codex's `multi_agent_v1`) are flattened:
    each inner function becomes `<namespace>__<name>`, suffixed `_2`, `_3`, ... if that collides
    with another tool's name, and calls come back as `{name, namespace}` again. Hosted tools
    (`web_search`, `file_search`, `computer_use_preview`, `code_interpreter`, `image_generation`,
    `mcp`, `local_shell`, `custom`, ...) are dropped: a homelab runs none of them, and refusing
    would strand the client. With no tool left, `tool_choice` and `parallel_tool_calls` go too.
tool_choice
    `auto` / `none` / `required`; `{type: "function", name}` -> named (the flattened name);
    `allowed_tools` -> its mode; a hosted tool's choice -> auto.
sampling and limits
    `max_output_tokens` integer >= 1 (the context clamp applies as for `max_tokens`);
    `temperature` / `top_p` only when sent; `reasoning.effort`: none -> reasoning off, minimal ->
    low, low / medium / high, xhigh -> high; `reasoning.summary` (or the older
    `generate_summary`) auto / concise / detailed -> `reasoning_summary` (stream.py: the reasoning
    is then given as the summary); `text.format`: text (nothing), `json_schema` ->
    `response_format` json_schema, `json_object` -> json_object, else 400. `user` (or
    `safety_identifier`) -> user. There is no `stop` in this dialect.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ... import canonical as c
from ..body import decode_object
from ..fields import function_tool, invalid as _bad, kind_of as _kind, number, string as _str
from .items import reasoning_text
from .sealed import ReasoningSealer

__all__ = ["ParsedRequest", "parse_request", "ENCRYPTED_REASONING"]

ENCRYPTED_REASONING = "reasoning.encrypted_content"

# Records of tools the upstream never ran: dropped from history rather than refused.
_HOSTED_ITEMS = frozenset({
    "web_search_call", "file_search_call", "computer_call", "computer_call_output",
    "code_interpreter_call", "image_generation_call", "mcp_call", "mcp_list_tools",
    "mcp_approval_request", "mcp_approval_response", "local_shell_call", "local_shell_call_output",
    "custom_tool_call", "custom_tool_call_output", "tool_search_call", "tool_search_output",
    "compaction", "shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output",
})
_EFFORT = {"minimal": "low", "low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}


class ParsedRequest(msgspec.Struct):
    """What the handler needs: the canonical pieces and what the answer must echo."""

    model: str
    stream: bool
    store: bool
    include_encrypted: bool
    previous_response_id: str | None
    instructions: str | None
    messages: list[c.Message]  # this request's input (instructions not included)
    tools: list[c.Tool]
    tool_choice: c.ToolChoice | None
    parallel_tool_calls: bool | None
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    reasoning_effort: str | None
    reasoning_enabled: bool | None
    user: str | None
    extra: dict
    names: dict[str, tuple[str | None, str]]  # upstream tool name -> (namespace, name)
    echo: dict  # request fields the Response object repeats (tools, tool_choice, text, ...)
    cache_key: str | None = None  # `prompt_cache_key`: session affinity only, never forwarded
    reasoning_summary: bool = False  # `reasoning.summary` asked for
    references: list[tuple[str, str]] = msgspec.field(default_factory=list)  # (path, id) to resolve
    input_items: list[dict] = msgspec.field(default_factory=list)  # the input as items (docstring)

    def canonical(self, history: list[c.Message]) -> c.Request:
        msgs = ([c.Message("system", [c.TextPart(self.instructions)])] if self.instructions else [])
        return c.Request(
            model=self.model,
            messages=msgs + history + self.messages,
            stream=self.stream,
            max_tokens=self.max_output_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            tools=self.tools,
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
            user=self.user,
            reasoning_effort=self.reasoning_effort,
            reasoning_enabled=self.reasoning_enabled,
            extra=self.extra,
            cache_key=self.cache_key,
        )


def _between(raw: dict, key: str, lo: float, hi: float) -> float | None:
    v = number(raw.get(key), key)
    if v is not None and not lo <= v <= hi:
        raise _bad(key, f"must be between {lo:g} and {hi:g}, got {v}")
    return None if v is None else float(v)


# -- tools ------------------------------------------------------------------------------------


def _tools(raw: Any) -> tuple[list[c.Tool], dict[str, tuple[str | None, str]]]:
    if raw is None:
        return [], {}
    if not isinstance(raw, list):
        raise _bad("tools", f"expected an array of tools, got {_kind(raw)}")
    flat: list[c.Tool] = []
    grouped: list[tuple[str, c.Tool]] = []
    for i, t in enumerate(raw):
        path = f"tools[{i}]"
        if not isinstance(t, dict):
            raise _bad(path, f"expected a tool object, got {_kind(t)}")
        kind = t.get("type")
        if kind == "function":
            flat.append(function_tool(t, path))
        elif kind == "namespace":
            ns = _str(t, "name", f"{path}.name", required=True)
            inner = t.get("tools")
            if not isinstance(inner, list):
                raise _bad(f"{path}.tools", "expected an array of function tools")
            for j, it in enumerate(inner):
                if isinstance(it, dict) and it.get("type", "function") == "function":
                    grouped.append((ns, function_tool(it, f"{path}.tools[{j}]")))
        elif not isinstance(kind, str):
            raise _bad(f"{path}.type", "required string field is missing")
        # any other type is a hosted tool: dropped (module docstring)
    names: dict[str, tuple[str | None, str]] = {}
    out: list[c.Tool] = []
    for tool in flat:
        if tool.name not in names:
            names[tool.name] = (None, tool.name)
            out.append(tool)
    for ns, tool in grouped:
        base = f"{ns}__{tool.name}"
        flat_name, n = base, 2
        while flat_name in names:
            flat_name, n = f"{base}_{n}", n + 1
        names[flat_name] = (ns, tool.name)
        out.append(c.Tool(flat_name, tool.description, tool.parameters))
    return out, names


def upstream_name(names: dict[str, tuple[str | None, str]], namespace: str | None, name: str) -> str:
    """The flattened name a (namespace, name) call goes upstream as."""
    if namespace is None:
        return name
    for flat, key in names.items():
        if key == (namespace, name):
            return flat
    return f"{namespace}__{name}"  # a tool no longer offered: named as it was when it was


def _tool_choice(raw: Any, names: dict) -> c.ToolChoice | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        if raw not in ("auto", "none", "required"):
            raise _bad("tool_choice", f"expected auto, none, required or a tool, got {raw!r}")
        return c.ToolChoice(raw)  # type: ignore[arg-type]
    if not isinstance(raw, dict):
        raise _bad("tool_choice", f"expected a string or an object, got {_kind(raw)}")
    kind = raw.get("type")
    if kind == "function":
        name = _str(raw, "name", "tool_choice.name", required=True)
        flat = upstream_name(names, raw.get("namespace") if isinstance(raw.get("namespace"), str) else None, name)
        if flat not in names:
            raise _bad("tool_choice.name", f"no function tool named {name!r} in tools")
        return c.ToolChoice("named", flat)
    if kind == "allowed_tools":
        return c.ToolChoice("required" if raw.get("mode") == "required" else "auto")
    return c.ToolChoice("auto")  # a hosted tool's choice: the tool is not here


# -- input ------------------------------------------------------------------------------------


def _text_of(content: Any, path: str) -> str:
    """function_call_output.output: a string or text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(path, f"expected a string or an array of parts, got {_kind(content)}")
    texts = []
    for j, p in enumerate(content):
        if isinstance(p, dict) and p.get("type") in ("input_text", "output_text", "text") and isinstance(p.get("text"), str):
            texts.append(p["text"])
        elif isinstance(p, dict) and p.get("type") == "input_image":
            texts.append("[image]")
        else:
            kind = p.get("type") if isinstance(p, dict) else None
            raise _bad(f"{path}[{j}].type", f"unsupported part type {kind!r} in a tool output")
    return "\n".join(texts)


def _parts(content: Any, path: str) -> list[c.Part]:
    if isinstance(content, str):
        return [c.TextPart(content)]
    if not isinstance(content, list):
        raise _bad(path, f"expected a string or an array of content parts, got {_kind(content)}")
    parts: list[c.Part] = []
    for j, p in enumerate(content):
        where = f"{path}[{j}]"
        if not isinstance(p, dict):
            raise _bad(where, f"expected a content part object, got {_kind(p)}")
        kind = p.get("type")
        if kind in ("input_text", "output_text", "text"):
            parts.append(c.TextPart(_str(p, "text", f"{where}.text", required=True)))
        elif kind == "refusal":
            parts.append(c.TextPart(_str(p, "refusal", f"{where}.refusal", required=True)))
        elif kind == "input_image":
            url = p.get("image_url")
            if not isinstance(url, str) or not url:
                if p.get("file_id") is not None:
                    raise _bad(f"{where}.file_id", "file ids are not supported (no Files API here): send image_url")
                raise _bad(f"{where}.image_url", "required string field is missing")
            parts.append(c.ImagePart(url))
        elif kind == "input_file":
            raise _bad(f"{where}.type", "input_file is not supported: send the text as input_text")
        else:
            raise _bad(f"{where}.type", f"unsupported content part type {kind!r}")
    return parts


_ROLES: dict[str, Literal["system", "user", "assistant"]] = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}


def _as_item(item: dict, kind: str) -> dict:
    """An input item as input_items lists it: typed, string content as one text part."""
    item = {**item, "type": kind}
    if kind == "message" and isinstance(item.get("content"), str):
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        item["content"] = [{"type": part, "text": item["content"]}]
    return item


def _messages(raw: Any, names: dict, sealer: ReasoningSealer, resolved: dict[str, dict] | None,
              refs: list[tuple[str, str]], items: list[dict]) -> list[c.Message]:
    if isinstance(raw, str):
        items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": raw}]})
        return [c.Message("user", [c.TextPart(raw)])]
    if not isinstance(raw, list):
        raise _bad("input", f"expected a string or an array of items, got {_kind(raw)}")
    out: list[c.Message] = []
    reasoning: list[str] = []
    open_turn = False  # the last message is an assistant turn that calls may still join
    for i, item in enumerate(raw):
        path = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(path, f"expected an item object, got {_kind(item)}")
        kind = item.get("type", "message" if "role" in item else None)
        if not isinstance(kind, str):
            raise _bad(f"{path}.type", "required string field is missing")
        trusted = False
        if kind == "item_reference":
            ref = item.get("id")
            if not isinstance(ref, str) or not ref:
                raise _bad(f"{path}.id", "required string field is missing")
            if resolved is None:
                refs.append((f"{path}.id", ref))
                continue
            item, trusted = resolved[ref], True
            stored = item.get("type")
            kind = stored if isinstance(stored, str) else "message"
        items.append(_as_item(item, kind))
        if kind == "message":
            role_raw = item.get("role")
            role = _ROLES.get(role_raw) if isinstance(role_raw, str) else None
            if role is None:
                raise _bad(f"{path}.role", f"expected developer, system, user or assistant, got {role_raw!r}")
            if "content" not in item:
                raise _bad(f"{path}.content", "required field is missing")
            parts = _parts(item["content"], f"{path}.content")
            if role == "system" and any(isinstance(p, c.ImagePart) for p in parts):
                raise _bad(f"{path}.content", "a developer/system message takes text only")
            msg = c.Message(role, parts)
            if role == "assistant" and reasoning:
                msg.reasoning, reasoning = "\n\n".join(reasoning), []
            out.append(msg)
            open_turn = role == "assistant"
        elif kind == "function_call":
            call_id = _str(item, "call_id", f"{path}.call_id", required=True)
            name = _str(item, "name", f"{path}.name", required=True)
            args = _str(item, "arguments", f"{path}.arguments") or "{}"
            ns = item.get("namespace") if isinstance(item.get("namespace"), str) else None
            call = c.ToolCall(call_id, upstream_name(names, ns, name), args)
            if not open_turn:
                out.append(c.Message("assistant"))
                open_turn = True
            turn = out[-1]
            if reasoning:
                turn.reasoning = "\n\n".join(filter(None, [turn.reasoning, *reasoning]))
                reasoning = []
            turn.tool_calls.append(call)
        elif kind == "function_call_output":
            call_id = _str(item, "call_id", f"{path}.call_id", required=True)
            if "output" not in item:
                raise _bad(f"{path}.output", "required field is missing")
            text = _text_of(item["output"], f"{path}.output")
            out.append(c.Message("tool", [c.TextPart(text)], tool_call_id=call_id))
            open_turn = False
        elif kind == "reasoning":
            opened = reasoning_text(item) if trusted else sealer.open(item.get("encrypted_content"))
            if opened:
                reasoning.append(opened)
        elif kind in _HOSTED_ITEMS:
            continue
        else:
            raise _bad(f"{path}.type", f"unsupported input item type {kind!r}")
    return out


# -- the request ------------------------------------------------------------------------------


def _text_format(raw: Any) -> dict | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _bad("text", f"expected an object, got {_kind(raw)}")
    fmt = raw.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise _bad("text.format", f"expected an object, got {_kind(fmt)}")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise _bad("text.format.schema", "expected a JSON schema object")
        js: dict = {"name": fmt.get("name") if isinstance(fmt.get("name"), str) else "response", "schema": schema}
        if isinstance(fmt.get("strict"), bool):
            js["strict"] = fmt["strict"]
        if isinstance(fmt.get("description"), str):
            js["description"] = fmt["description"]
        return {"type": "json_schema", "json_schema": js}
    raise _bad("text.format.type", f"expected text, json_schema or json_object, got {kind!r}")


def parse_request(body: bytes, *, sealer: ReasoningSealer, resolved: dict[str, dict] | None = None) -> ParsedRequest:
    raw = decode_object(body)
    model = _str(raw, "model", "model", required=True)
    if not model:
        raise _bad("model", "must not be empty")
    stream = raw.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream", f"expected a boolean, got {_kind(stream)}")
    store = raw.get("store", True)
    if store is None:
        store = True
    if not isinstance(store, bool):
        raise _bad("store", f"expected a boolean, got {_kind(store)}")
    include = raw.get("include") or []
    if not isinstance(include, list):
        raise _bad("include", f"expected an array of strings, got {_kind(include)}")
    prev = _str(raw, "previous_response_id", "previous_response_id")
    instructions = raw.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("instructions", f"expected a string, got {_kind(instructions)}")
    tools, names = _tools(raw.get("tools"))
    if "input" not in raw:
        raise _bad("input", "required field is missing")
    refs: list[tuple[str, str]] = []
    items: list[dict] = []
    messages = _messages(raw["input"], names, sealer, resolved, refs, items)
    tool_choice = _tool_choice(raw.get("tool_choice"), names)
    ptc = raw.get("parallel_tool_calls")
    if ptc is not None and not isinstance(ptc, bool):
        raise _bad("parallel_tool_calls", f"expected a boolean, got {_kind(ptc)}")
    mot = raw.get("max_output_tokens")
    if mot is not None:
        if isinstance(mot, bool) or not isinstance(mot, int):
            raise _bad("max_output_tokens", f"expected an integer, got {_kind(mot)}")
        if mot < 1:
            raise _bad("max_output_tokens", f"must be at least 1, got {mot}")
    effort, enabled, summary = None, None, False
    reasoning = raw.get("reasoning")
    if isinstance(reasoning, dict):
        asked = reasoning.get("summary") or reasoning.get("generate_summary")
        summary = asked in ("auto", "concise", "detailed")
        e = reasoning.get("effort")
        if e == "none":
            enabled = False
        elif isinstance(e, str) and e in _EFFORT:
            effort, enabled = _EFFORT[e], True
    extra = {}
    fmt = _text_format(raw.get("text"))
    if fmt is not None:
        extra["response_format"] = fmt
    user = raw.get("user") if isinstance(raw.get("user"), str) else raw.get("safety_identifier")
    echo = {k: raw[k] for k in ("tools", "tool_choice", "text", "metadata", "reasoning", "truncation",
                                "prompt_cache_key", "service_tier", "top_logprobs") if raw.get(k) is not None}
    return ParsedRequest(
        model=model,
        stream=stream,
        store=store,
        include_encrypted=ENCRYPTED_REASONING in include,
        previous_response_id=prev,
        instructions=instructions or None,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice if tools else None,
        parallel_tool_calls=ptc if tools else None,
        max_output_tokens=mot,
        temperature=_between(raw, "temperature", 0, 2),
        top_p=_between(raw, "top_p", 0, 1),
        reasoning_effort=effort,
        reasoning_enabled=enabled,
        user=user if isinstance(user, str) else None,
        extra=extra,
        names=names,
        echo=echo,
        cache_key=raw["prompt_cache_key"] if isinstance(raw.get("prompt_cache_key"), str) else None,
        reasoning_summary=summary,
        references=refs,
        input_items=items,
    )
