"""Anthropic Messages request -> canonical `Request` (pure: bytes in, a `Request` or a `GatewayError` out).

The wire shape is decoded in one pass by msgspec into the private `_W*` structs below, which name
only the fields we use: every other field (`cache_control`, `citations`, `context_management`,
`service_tier`, `container`, `mcp_servers`, any unknown key) is accepted and ignored, and because the
canonical request is built field by field, nothing unknown can ever reach an upstream.

Every failure is `GatewayError("invalid_request", message, param=path)`: the message starts with the
field path (`messages[2].content: expected a string or a list of content blocks`) and `param` holds
that path. Invalid JSON, invalid UTF-8, a non-object body, nesting too deep for the decoder: all the
same error kind. No other exception escapes (the unit tests fuzz this with hypothesis).

Choices, rule by rule
---------------------
Roles
    `user` and `assistant`; `system` entries inside `messages` (Claude Code >= 2.1.154 sends them)
    become canonical system messages *in place*, so each turn's prompt stays an extension of the
    previous one (prefix cache). One exception: a system message that sits between an assistant
    `tool_use` and the user message answering it is moved to just after that answer's tool
    messages, because OpenAI-shaped upstreams require the tool messages right after the assistant's
    tool calls. `ctx` and `msg` (also sent by recent Claude Code, see vllm-project/vllm#44000) are
    read as `user`, as vLLM does. Any other role: 400 naming `messages[i].role`.
System text
    A string, or text blocks joined with "\\n\\n". A text block starting with
    `x-anthropic-billing-header` is dropped: Claude Code puts a per-request attribution hash there,
    which means nothing to a local model and would defeat the upstream's prefix cache (vLLM drops
    it too). So is Claude Code's token counter, `<total_tokens>N tokens left</total_tokens>`
    (CLAUDE_CODE_TOTAL_TOKENS_REMINDER; at the end of its system prompt and as a `role: system`
    entry after each tool result): it counts the context of Claude's model, not ours, and in its
    `countdown` mode it changes every turn, so in the system prompt it would rewrite the start of
    every prompt (bench.prefix measures it). An empty system prompt produces no system message,
    and a system entry holding only a counter none.
Content blocks
    text -> TextPart. image (base64 -> `data:` URL, url -> URL; `file` sources -> 400: no Files
    API here). document with a plain-text source -> TextPart (other sources -> 400 naming the
    source type). tool_use (assistant) -> ToolCall with the input re-encoded as JSON text.
    tool_result (user) -> a canonical `tool` message, placed before the rest of that user message
    (OpenAI wants tool messages right after the assistant's tool calls); its content is a string or
    text/image/document blocks; `is_error: true` prefixes the text with "[tool error] " so the
    model can see the call failed (no upstream has an error flag on tool messages); images stay
    parts of the tool message; a `tool_reference` item (tool search: Claude Code's ToolSearch
    answers with them) becomes the text "Tool loaded: NAME" and loads that deferred tool (below).
    thinking (assistant) -> Message.reasoning only if `signer.verify` says the gateway signed it
    (or, for an empty block from display "omitted", if `signer.unseal` restores it from the
    signature);
    otherwise dropped, because a forged or foreign (e.g. real-Claude) block must not be replayed to
    our model as *its own* reasoning, and it must never turn into visible text either. Several
    verified blocks in one message are joined with "\\n\\n".
    redacted_thinking -> dropped (Anthropic-encrypted; meaningless to our upstreams).
    server_tool_use and the results of Anthropic-hosted tools (web_search/web_fetch/code execution/
    tool search/MCP results, container_upload) -> dropped: they only appear when a client replays a
    conversation held with Anthropic's API; our upstreams never ran those tools, and refusing the
    whole conversation would strand the user.
    Any other block type (search_result included) -> 400 naming the path and the type. Blocks
    that make no sense in a role (image or tool_result in an assistant turn, tool_use in a user
    turn, anything but text in a system message) -> 400.
Tools
    `{name, description?, input_schema}` -> Tool(parameters=input_schema). A tool without an
    `input_schema` whose `type` is not `custom` is an Anthropic server tool (`web_search_20250305`,
    `bash_20250124`, `text_editor_...`): dropped. A `defer_loading: true` tool is sent upstream only
    once a `tool_reference` naming it is somewhere in the conversation (Anthropic's tool search:
    until then the model knows only its name), so Claude Code's `DeferredToolPlaceholder` ("never
    call this tool") and the deferred tools it has not loaded never reach the model. If no tool is left, `tool_choice` and
    `disable_parallel_tool_use` are dropped too (upstreams reject a tool_choice without tools).
    tool_choice auto/any/tool/none -> auto/required/named/none; a named tool must be among the
    (kept) tools. `disable_parallel_tool_use: true` -> parallel_tool_calls False; false or absent ->
    None (the upstream default; never invented).
Sampling and limits
    `model` non-empty string; `max_tokens` integer >= 1; `messages` a list holding at least one
    user or assistant message; `stream` bool.
    `temperature` >= 0, `top_p` in [0, 1], `top_k` >= 0, only when sent (null counts as not sent).
    `stop_sequences` -> stop (each a non-empty string). `metadata.user_id` -> user.
Reasoning
    thinking enabled -> reasoning_enabled True and an effort from `budget_tokens`: < 4096 low,
    < 16384 medium, else high (the budgets Claude Code uses for think / think hard / ultrathink fall
    in those three bands). adaptive -> True (effort only if `output_config.effort` says).
    `display: "omitted"` (with enabled or adaptive) -> reasoning_hidden: the answer's thinking
    blocks have empty text and a sealed signature that carries the reasoning back next turn.
    disabled -> False, and no effort is passed on (some upstreams switch reasoning on when they see
    one). `output_config.effort` low/medium/high -> same; max/xhigh -> high; it wins over the
    budget. Malformed or unknown `thinking` / `effort` values are ignored, never an error.
Structured output
    `output_config.format` (or the older top-level `output_format`) `{"type": "json_schema",
    "schema": {...}}` -> `extra["response_format"]` in the OpenAI json_schema shape; any other
    shape -> 400 (silently ignoring it would hand back unparseable text).
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from ... import canonical as c
from ... import schema_errors
from ...errors import GatewayError
from ..fields import invalid as _invalid
from ..signature import ThinkingSigner

__all__ = ["parse_request"]

# ---------------------------------------------------------------------------------------------
# Wire shape (only the fields we read; everything else is ignored by msgspec)
# ---------------------------------------------------------------------------------------------


class _WSource(msgspec.Struct):
    # image / document sources; checked by hand for clear messages
    type: str
    media_type: str | None = None
    data: Any = None
    url: Any = None


class _WText(msgspec.Struct, tag="text"):
    text: str


class _WImage(msgspec.Struct, tag="image"):
    source: _WSource


class _WDocument(msgspec.Struct, tag="document"):
    source: _WSource


class _WToolReference(msgspec.Struct, tag="tool_reference"):
    tool_name: str


_WToolResultItem = _WText | _WImage | _WDocument | _WToolReference


class _WToolUse(msgspec.Struct, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


class _WToolResult(msgspec.Struct, tag="tool_result"):
    tool_use_id: str
    content: str | list[_WToolResultItem] | None = None
    is_error: bool | None = None


class _WThinking(msgspec.Struct, tag="thinking"):
    thinking: str
    signature: str | None = None


class _WRedactedThinking(msgspec.Struct, tag="redacted_thinking"):
    pass


# Blocks produced by Anthropic-hosted tools: dropped (see the module docstring).
_SERVER_BLOCK_TYPES = (
    "server_tool_use",
    "web_search_tool_result",
    "web_fetch_tool_result",
    "code_execution_tool_result",
    "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result",
    "tool_search_tool_result",
    "mcp_tool_use",
    "mcp_tool_result",
    "container_upload",
)
_WServerBlocks: tuple[type[msgspec.Struct], ...] = tuple(
    msgspec.defstruct(f"_WServer_{t}", [], tag=t) for t in _SERVER_BLOCK_TYPES
)

_WBlock = (
    _WText
    | _WImage
    | _WDocument
    | _WToolUse
    | _WToolResult
    | _WThinking
    | _WRedactedThinking
)
# the generated server-tool blocks join the union at run time (msgspec reads it then); a checker
# sees the static members only
for _t in _WServerBlocks:
    _WBlock = _WBlock | _t  # type: ignore[assignment,misc]


class _WMessage(msgspec.Struct):
    role: str
    content: str | list[_WBlock]  # type: ignore[valid-type]


class _WTool(msgspec.Struct):
    name: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    defer_loading: bool | None = None


class _WToolChoice(msgspec.Struct):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class _WMetadata(msgspec.Struct):
    user_id: str | None = None


class _WRequest(msgspec.Struct):
    model: str
    max_tokens: int
    messages: list[_WMessage]
    system: str | list[_WText] | None = None
    stream: bool | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: _WMetadata | None = None
    tools: list[_WTool] | None = None
    tool_choice: _WToolChoice | None = None
    # Read leniently by hand: never an error (see the module docstring).
    thinking: Any = None
    output_config: Any = None
    output_format: Any = None


_DECODER = msgspec.json.Decoder(_WRequest)

# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


_TYPE_WORDS = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "a boolean",
    "array": "a list",
    "object": "an object",
    "null": "null",
}

# Better words for the fields whose msgspec type is a union.
_HINTS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^messages\[\d+\]\.content$"), "a string or a list of content blocks"),
    (re.compile(r"^messages\[\d+\]\.content\[\d+\]\.content$"), "a string or a list of content blocks"),
    (re.compile(r"^messages\[\d+\]\.content\[\d+\]$"), "a content block object"),
    (re.compile(r"^messages\[\d+\]\.content\[\d+\]\.content\[\d+\]$"), "a content block object"),
    (re.compile(r"^system$"), "a string or a list of text blocks"),
    (re.compile(r"^system\[\d+\]$"), "a text block object"),
    (re.compile(r"^messages\[\d+\]$"), "a message object"),
    (re.compile(r"^messages$"), "a non-empty list of messages"),
]


def _words(types: str, *, drop_null: bool = False) -> str:
    names = [t.strip() for t in types.split("|")]
    if drop_null and len(names) > 1:  # optional fields: "null" is accepted but not worth saying
        names = [n for n in names if n != "null"]
    return " or ".join(_TYPE_WORDS.get(n, n) for n in names)


def _from_validation_error(exc: msgspec.ValidationError) -> GatewayError:
    e = schema_errors.read(exc)  # msgspec: "Expected `str | array`, got `int` - at `$.messages[0].content`"
    path = e.path
    if e.kind == "expected":
        want = next((h for p, h in _HINTS if p.match(path)), _words(e.want, drop_null=True))
        got = _words(e.got)
        if not path:
            return _invalid(None, f"request body must be a JSON object, got {got}")
        return _invalid(path, f"expected {want}, got {got}")
    if e.kind == "missing":
        return _invalid(e.at(e.field), "required field is missing")
    if e.kind == "value":  # a tag no variant has (an enum's "invalid enum value" is said as msgspec says it)
        if path.endswith(".type") and "content" in path:
            return _invalid(path, f"unsupported content block type {e.value}")
        if path.startswith("system["):
            return _invalid(path, f"unsupported system block type {e.value} (only text blocks)")
        return _invalid(path, f"invalid value {e.value}")
    detail = e.text[:1].lower() + e.text[1:] if e.text else "invalid value"
    return _invalid(path or None, detail)


# ---------------------------------------------------------------------------------------------
# Translation
# ---------------------------------------------------------------------------------------------

_BILLING_HEADER = "x-anthropic-billing-header"
# Claude Code's token counter (see the module docstring), with the whitespace around it
_TOKEN_COUNTER = re.compile(r"\s*<total_tokens>[^<>]{0,64}</total_tokens>\s*")


def _without_counters(text: str) -> str:
    if "<total_tokens>" not in text:  # the common case: untouched, not even stripped
        return text
    return "\n\n".join(part for part in _TOKEN_COUNTER.split(text) if part)
_EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "high", "xhigh": "high"}
_TOOL_ERROR_PREFIX = "[tool error] "
# What the model reads for a tool_reference: the tool's definition itself is in `tools` from now on.
_TOOL_LOADED = "Tool loaded: {}"


def parse_request(body: bytes, *, signer: ThinkingSigner) -> c.Request:
    """Decode and validate an Anthropic Messages request body into a canonical `Request`."""
    try:
        wire = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        raise _from_validation_error(exc) from None
    except msgspec.DecodeError as exc:
        if not body or not bytes(body).strip():
            raise _invalid(None, "request body is empty; expected a JSON object") from None
        raise _invalid(None, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise _invalid(None, "request body is nested too deeply") from None
    try:
        return _Translator(signer).request(wire)
    except RecursionError:  # re-encoding a pathologically nested tool input
        raise _invalid(None, "request body is nested too deeply") from None


class _Translator:
    def __init__(self, signer: ThinkingSigner) -> None:
        self._signer = signer

    # -- top level ---------------------------------------------------------------------------

    def request(self, w: _WRequest) -> c.Request:
        if not w.model:
            raise _invalid("model", "must be a non-empty string")
        if w.max_tokens < 1:
            raise _invalid("max_tokens", f"must be an integer >= 1, got {w.max_tokens}")
        if not w.messages:
            raise _invalid("messages", "must be a non-empty list of messages")

        messages: list[c.Message] = []
        self._loaded: set[str] = set()  # tool names a tool_reference in the conversation loaded
        system = self._system_text(w.system)
        if system:
            messages.append(c.Message(role="system", parts=[c.TextPart(system)]))
        conversation = self._messages(w.messages)
        if all(m.role == "system" for m in conversation):
            raise _invalid("messages", "must contain at least one user or assistant message")
        messages.extend(conversation)

        tools = self._tools(w.tools)
        tool_choice, parallel = self._tool_choice(w.tool_choice, tools)
        enabled, effort = self._reasoning(w.thinking, w.output_config)
        hidden = (
            enabled is True and isinstance(w.thinking, dict) and w.thinking.get("display") == "omitted"
        )

        if w.temperature is not None and not w.temperature >= 0:
            raise _invalid("temperature", f"must be >= 0, got {w.temperature}")
        if w.top_p is not None and not 0 <= w.top_p <= 1:
            raise _invalid("top_p", f"must be between 0 and 1, got {w.top_p}")
        if w.top_k is not None and w.top_k < 0:
            raise _invalid("top_k", f"must be an integer >= 0, got {w.top_k}")
        stop: list[str] = []
        for i, s in enumerate(w.stop_sequences or ()):
            if not s:
                raise _invalid(f"stop_sequences[{i}]", "must be a non-empty string")
            stop.append(s)

        extra: dict[str, Any] = {}
        response_format = self._response_format(w.output_config, w.output_format)
        if response_format is not None:
            extra["response_format"] = response_format

        return c.Request(
            model=w.model,
            messages=messages,
            stream=bool(w.stream),
            max_tokens=w.max_tokens,
            temperature=w.temperature,
            top_p=w.top_p,
            top_k=w.top_k,
            stop=stop,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel,
            user=w.metadata.user_id if w.metadata is not None else None,
            reasoning_effort=effort,
            reasoning_enabled=enabled,
            reasoning_hidden=hidden,
            extra=extra,
        )

    # -- system text ---------------------------------------------------------------------------

    @staticmethod
    def _system_text(system: str | list[_WText] | None) -> str:
        if system is None:
            return ""
        if isinstance(system, str):
            return _without_counters(system)
        texts = []
        for block in system:
            if not block.text or block.text.startswith(_BILLING_HEADER):
                continue
            text = _without_counters(block.text)
            if text:
                texts.append(text)
        return "\n\n".join(texts)

    def _inline_system_text(self, content: Any, path: str) -> str:
        if isinstance(content, str):
            return _without_counters(content)
        texts = []
        for j, block in enumerate(content):
            if not isinstance(block, _WText):
                raise _invalid(
                    f"{path}.content[{j}]",
                    f"a system message may only hold text blocks, got {_type_of(block)!r}",
                )
            if block.text and not block.text.startswith(_BILLING_HEADER):
                text = _without_counters(block.text)
                if text:
                    texts.append(text)
        return "\n\n".join(texts)

    # -- messages ------------------------------------------------------------------------------

    def _messages(self, wire: list[_WMessage]) -> list[c.Message]:
        out: list[c.Message] = []
        held: list[c.Message] = []  # system messages waiting for the tool results to pass
        awaiting_results = False
        for i, m in enumerate(wire):
            path = f"messages[{i}]"
            role = m.role
            if role in ("ctx", "msg"):
                role = "user"
            if role == "system":
                text = self._inline_system_text(m.content, path)
                if text:
                    msg = c.Message(role="system", parts=[c.TextPart(text)])
                    (held if awaiting_results else out).append(msg)
            elif role == "user":
                tool_messages, user = self._user(m.content, path)
                out.extend(tool_messages)
                out.extend(held)
                held.clear()
                if user is not None:
                    out.append(user)
                awaiting_results = False
            elif role == "assistant":
                out.extend(held)
                held.clear()
                assistant = self._assistant(m.content, path)
                out.append(assistant)
                awaiting_results = bool(assistant.tool_calls)
            else:
                raise _invalid(
                    f"{path}.role",
                    f"unknown role {role!r} (expected 'user', 'assistant' or 'system')",
                )
        out.extend(held)
        return out

    def _user(self, content: Any, path: str) -> tuple[list[c.Message], c.Message | None]:
        if isinstance(content, str):
            return [], c.Message(role="user", parts=[c.TextPart(content)] if content else [])
        tool_messages: list[c.Message] = []
        parts: list[c.Part] = []
        for j, block in enumerate(content):
            bpath = f"{path}.content[{j}]"
            if isinstance(block, _WText):
                parts.append(c.TextPart(block.text))
            elif isinstance(block, _WImage):
                parts.append(self._image(block, bpath))
            elif isinstance(block, _WDocument):
                parts.append(self._document(block, bpath))
            elif isinstance(block, _WToolResult):
                tool_messages.append(self._tool_result(block, bpath))
            elif isinstance(block, _WToolUse):
                raise _invalid(
                    f"{bpath}.type",
                    "tool_use blocks belong in assistant messages, not user messages",
                )
            elif isinstance(block, _WThinking) or _is_dropped(block):
                continue  # thinking outside an assistant turn has no meaning: dropped
            else:  # pragma: no cover - the decoder admits no other type
                raise _invalid(f"{bpath}.type", f"unsupported content block type {_type_of(block)!r}")
        if tool_messages and not parts:
            return tool_messages, None
        return tool_messages, c.Message(role="user", parts=parts)

    def _assistant(self, content: Any, path: str) -> c.Message:
        if isinstance(content, str):
            return c.Message(role="assistant", parts=[c.TextPart(content)] if content else [])
        parts: list[c.Part] = []
        calls: list[c.ToolCall] = []
        reasoning: list[str] = []
        for j, block in enumerate(content):
            bpath = f"{path}.content[{j}]"
            if isinstance(block, _WText):
                parts.append(c.TextPart(block.text))
            elif isinstance(block, _WToolUse):
                calls.append(
                    c.ToolCall(
                        id=block.id,
                        name=block.name,
                        arguments=msgspec.json.encode(block.input).decode(),
                    )
                )
            elif isinstance(block, _WThinking):
                if block.thinking and self._verified(block.thinking, block.signature):
                    reasoning.append(block.thinking)
                elif not block.thinking:  # display "omitted": the reasoning rides in the signature
                    sealed = self._signer.unseal(block.signature)
                    if sealed:
                        reasoning.append(sealed)
            elif _is_dropped(block):
                continue
            else:
                raise _invalid(
                    f"{bpath}.type",
                    f"{_type_of(block)!r} blocks are not allowed in assistant messages",
                )
        return c.Message(
            role="assistant",
            parts=parts,
            tool_calls=calls,
            reasoning="\n\n".join(reasoning) if reasoning else None,
        )

    def _verified(self, text: str, signature: str | None) -> bool:
        if not signature or not signature.isascii():
            return False
        try:
            return self._signer.verify(text, signature)
        except (TypeError, ValueError, UnicodeError):
            return False

    # -- blocks --------------------------------------------------------------------------------

    @staticmethod
    def _image(block: _WImage, path: str) -> c.ImagePart:
        src = block.source
        spath = f"{path}.source"
        if src.type == "base64":
            if not isinstance(src.media_type, str) or not src.media_type:
                raise _invalid(f"{spath}.media_type", "required for a base64 image source")
            if not isinstance(src.data, str) or not src.data:
                raise _invalid(f"{spath}.data", "expected a non-empty base64 string")
            return c.ImagePart(url=f"data:{src.media_type};base64,{src.data}")
        if src.type == "url":
            if not isinstance(src.url, str) or not src.url:
                raise _invalid(f"{spath}.url", "expected a non-empty URL string")
            return c.ImagePart(url=src.url)
        if src.type == "file":
            raise _invalid(
                f"{spath}.type", "image source type 'file' is not supported (no Files API here)"
            )
        raise _invalid(
            f"{spath}.type",
            f"unsupported image source type {src.type!r} (expected 'base64' or 'url')",
        )

    @staticmethod
    def _document(block: _WDocument, path: str) -> c.TextPart:
        src = block.source
        spath = f"{path}.source"
        if src.type != "text":
            raise _invalid(
                f"{spath}.type",
                f"document source type {src.type!r} is not supported "
                "(only plain-text documents: source type 'text')",
            )
        if not isinstance(src.data, str):
            raise _invalid(f"{spath}.data", "expected a string")
        return c.TextPart(src.data)

    def _tool_result(self, block: _WToolResult, path: str) -> c.Message:
        parts: list[c.Part] = []
        content = block.content
        if isinstance(content, str):
            if content:
                parts.append(c.TextPart(content))
        elif content is not None:
            for k, item in enumerate(content):
                ipath = f"{path}.content[{k}]"
                if isinstance(item, _WText):
                    parts.append(c.TextPart(item.text))
                elif isinstance(item, _WImage):
                    parts.append(self._image(item, ipath))
                elif isinstance(item, _WDocument):
                    parts.append(self._document(item, ipath))
                elif isinstance(item, _WToolReference):
                    if not item.tool_name:
                        raise _invalid(f"{ipath}.tool_name", "must be a non-empty string")
                    self._loaded.add(item.tool_name)
                    parts.append(c.TextPart(_TOOL_LOADED.format(item.tool_name)))
        if block.is_error:
            if parts and isinstance(parts[0], c.TextPart):
                parts[0] = c.TextPart(_TOOL_ERROR_PREFIX + parts[0].text)
            else:
                parts.insert(0, c.TextPart(_TOOL_ERROR_PREFIX.rstrip()))
        return c.Message(role="tool", parts=parts, tool_call_id=block.tool_use_id)

    # -- tools ---------------------------------------------------------------------------------

    def _tools(self, wire: list[_WTool] | None) -> list[c.Tool]:
        tools: list[c.Tool] = []
        for i, t in enumerate(wire or ()):
            path = f"tools[{i}]"
            if t.input_schema is None:
                if t.type is not None and t.type != "custom":
                    continue  # an Anthropic server tool: dropped
                raise _invalid(f"{path}.input_schema", "required field is missing")
            if not t.name:
                raise _invalid(f"{path}.name", "must be a non-empty string")
            if t.defer_loading and t.name not in self._loaded:
                continue  # deferred, and no tool_reference has loaded it yet
            tools.append(c.Tool(name=t.name, description=t.description, parameters=t.input_schema))
        return tools

    @staticmethod
    def _tool_choice(
        wire: _WToolChoice | None, tools: list[c.Tool]
    ) -> tuple[c.ToolChoice | None, bool | None]:
        if wire is None:
            return None, None
        if wire.type == "auto":
            choice = c.ToolChoice(mode="auto")
        elif wire.type == "any":
            choice = c.ToolChoice(mode="required")
        elif wire.type == "none":
            choice = c.ToolChoice(mode="none")
        elif wire.type == "tool":
            if not wire.name:
                raise _invalid("tool_choice.name", "required when tool_choice.type is 'tool'")
            if not any(t.name == wire.name for t in tools):
                raise _invalid(
                    "tool_choice.name", f"no tool named {wire.name!r} among the request's tools"
                )
            choice = c.ToolChoice(mode="named", name=wire.name)
        else:
            raise _invalid(
                "tool_choice.type",
                f"unknown tool_choice type {wire.type!r} (expected 'auto', 'any', 'tool' or 'none')",
            )
        if not tools:
            return None, None
        return choice, (False if wire.disable_parallel_tool_use else None)

    # -- reasoning and output ------------------------------------------------------------------

    @staticmethod
    def _reasoning(thinking: Any, output_config: Any) -> tuple[bool | None, str | None]:
        enabled: bool | None = None
        effort: str | None = None
        if isinstance(thinking, dict):
            kind = thinking.get("type")
            if kind == "enabled":
                enabled = True
                budget = thinking.get("budget_tokens")
                if isinstance(budget, int) and not isinstance(budget, bool):
                    effort = "low" if budget < 4096 else "medium" if budget < 16384 else "high"
            elif kind == "adaptive":
                enabled = True
            elif kind == "disabled":
                enabled = False
        if isinstance(output_config, dict):
            asked = output_config.get("effort")
            if isinstance(asked, str) and asked in _EFFORTS:
                effort = _EFFORTS[asked]
        if enabled is False:
            effort = None
        return enabled, effort

    @staticmethod
    def _response_format(output_config: Any, output_format: Any) -> dict | None:
        path, fmt = "output_format", output_format
        if isinstance(output_config, dict) and output_config.get("format") is not None:
            path, fmt = "output_config.format", output_config["format"]
        if fmt is None:
            return None
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            raise _invalid(path, "expected an object with type 'json_schema' and a 'schema'")
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise _invalid(f"{path}.schema", "expected a JSON schema object")
        return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def _type_of(block: Any) -> str:
    return type(block).__struct_config__.tag or type(block).__name__


_DROPPED: tuple[type, ...] = (_WRedactedThinking, *_WServerBlocks)


def _is_dropped(block: Any) -> bool:
    return isinstance(block, _DROPPED)
