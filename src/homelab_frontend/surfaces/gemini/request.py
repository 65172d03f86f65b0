"""Gemini `GenerateContentRequest` -> canonical `Request` (pure: bytes in, a `Request` or a
`GatewayError` out).

The model and whether to stream come from the URL (`models/{model}:generateContent` or
`:streamGenerateContent`), everything else from the body. Every failure is
`GatewayError("invalid_request", "<field path>: <what is wrong>", param=<field path>)`, the
path in Google's camelCase spelling (`generationConfig.candidateCount`,
`contents[2].parts[0].inlineData.mimeType`); no other exception escapes.

Spellings
    Google's clients send camelCase, but the Python SDK passes nested dicts through unconverted,
    so snake_case arrives too (`include_thoughts`, `parameters_json_schema`,
    `function_declarations`): every field is read under both spellings, camelCase first. Names
    the client chose (schema properties, function arguments, tool results) are never rewritten.
Contents
    Roles `user` and `model` (missing: `user`, as Google takes a single-turn request; the legacy
    `function` role: `user`). Any other role: 400.
    user parts: `text` -> TextPart; `inlineData` with an image type -> ImagePart (a `data:` URL),
    with a text type (`text/*`, JSON, XML) -> its decoded text; `fileData` with an http(s) URL
    and an image type -> ImagePart; any other media (PDF, audio, video, a Files API URI) -> 400
    naming the part and its type (no upstream here reads them). `functionResponse` -> a
    canonical `tool` message, placed before the rest of that user turn (OpenAI-shaped upstreams
    want tool messages right after the assistant's tool calls): its `response` is the text of
    `output` when that is all there is (Gemini CLI's shape), `"[tool error] " + error` for an
    `error` alone, else the object as JSON; images in its `parts` stay parts of the message.
    model parts: `text` -> TextPart, `functionCall` -> ToolCall (arguments re-encoded as JSON;
    id: the client's, else `call_<turn>_<part>`, stable, so a replayed history renders the same
    every turn and the upstream's prefix cache holds).
    Both: `thought: true` parts are dropped (the reasoning travels in the signature, and a thought
    part a client sends was never verified), so are `executableCode` / `codeExecutionResult`
    (Google-hosted code execution; our upstreams never ran it), empty text parts, `videoMetadata`
    and other annotations. A part with none of the known fields: 400.
Matching function responses to calls
    A `functionResponse` answers a call of the latest model turn: the one with its `id`, else the
    first still unanswered call with its `name` (Gemini CLI rewrites ids to `name__id`, the SDKs
    may send none), and its tool message gets that call's id. A response that answers no call
    (its model turn was cut from the history) becomes user text, "Result of NAME: ...": a tool
    message without its call would be refused by the upstream's chat template.
thoughtSignature
    On any part of a model turn: the reasoning it carries (rules.reasoning_from) becomes that
    turn's Message.reasoning, several joined with "\\n\\n", each only once. A signature the
    gateway did not make (Google's own, Gemini CLI's `skip_thought_signature_validator`, a
    forgery) is dropped.
systemInstruction
    A Content (or, tolerated, a string): its text parts joined with "\\n\\n" -> one system
    message; other parts: 400.
Tools
    `functionDeclarations` -> Tool(name, description, parameters), the schema from `parameters`
    (a Google Schema) or `parametersJsonSchema`, both through schema.to_json_schema; both at once,
    a missing or repeated name: 400. Google-hosted tools (`googleSearch`, `codeExecution`,
    `urlContext`, `googleMaps`, `fileSearch`, `computerUse`, `retrieval`, ...) are dropped.
    `toolConfig.functionCallingConfig`: mode AUTO / VALIDATED -> auto, ANY -> required (named
    when `allowedFunctionNames` has exactly one), NONE -> none; `allowedFunctionNames` narrows
    the tools sent upstream to those names (each must be declared). No function left: no
    tool_choice either (upstreams refuse a tool_choice without tools).
generationConfig
    temperature (>= 0), topP (0..1), topK (an integer, sent as a float by the Python SDK),
    maxOutputTokens (>= 1; the exchange clamps it to the context), stopSequences (non-empty
    strings), seed, presencePenalty, frequencyPenalty -> the canonical fields / `extra`.
    candidateCount other than 1: 400 (one candidate only). responseMimeType `application/json`
    -> response_format json_object, and with responseSchema or responseJsonSchema (a schema
    alone implies JSON) -> json_schema, which vLLM enforces with guided decoding (Gemini CLI's
    router call needs that); `text/plain` or none -> text; anything else (`text/x.enum`): 400.
    responseModalities without TEXT: 400. thinkingConfig: `includeThoughts` true shows the
    reasoning as thought parts (else it is done but not shown: reasoning_hidden);
    `thinkingBudget` 0 -> reasoning off, -1 -> on, > 0 -> on with an effort by budget (< 4096
    low, < 16384 medium, else high, the Anthropic surface's bands); `thinkingLevel`
    MINIMAL / LOW -> low, MEDIUM -> medium, HIGH -> high, and it wins over the budget.
    Malformed thinking values are ignored, never an error. `responseLogprobs`, `mediaResolution`,
    `speechConfig` and the like are accepted and ignored.
Ignored and refused
    `safetySettings`, `labels`: accepted and ignored. `cachedContent`: 400 (there is no caches
    API here; send the contents inline).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import msgspec

from ... import canonical as c
from ..fields import as_list as _list, as_obj as _obj, integer as _integer, invalid as _invalid, kind_of as _kind, \
    number as _number
from ..signature import ThinkingSigner
from .fields import get as _get
from .rules import reasoning_from
from .schema import to_json_schema

__all__ = ["parse_request", "parse_body", "request_from"]

_decode = msgspec.json.decode
_encode = msgspec.json.encode
_TOOL_ERROR_PREFIX = "[tool error] "
_EFFORT_LEVELS = {"MINIMAL": "low", "LOW": "low", "MEDIUM": "medium", "HIGH": "high"}
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-yaml", "application/yaml")


def parse_body(body: bytes) -> dict:
    """The request body as a JSON object, or a 400."""
    if not body or not bytes(body).strip():
        raise _invalid(None, "request body is empty; expected a JSON object")
    try:
        raw = _decode(body)
    except msgspec.DecodeError as exc:
        raise _invalid(None, f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise _invalid(None, "request body is nested too deeply") from None
    if not isinstance(raw, dict):
        raise _invalid(None, f"request body must be a JSON object, got {_kind(raw)}")
    return raw


def parse_request(body: bytes, *, model: str, stream: bool, signer: ThinkingSigner) -> c.Request:
    """Decode and validate a GenerateContentRequest body into a canonical `Request`."""
    return request_from(parse_body(body), model=model, stream=stream, signer=signer)


def request_from(raw: dict, *, model: str, stream: bool, signer: ThinkingSigner,
                 require_contents: bool = True) -> c.Request:
    try:
        return _Translator(signer).request(raw, model, stream, require_contents)
    except RecursionError:  # re-encoding pathologically nested arguments
        raise _invalid(None, "request body is nested too deeply") from None


class _Call:
    __slots__ = ("id", "name", "answered")

    def __init__(self, id: str, name: str) -> None:
        self.id = id
        self.name = name
        self.answered = False


def _text(part: dict, path: str) -> str | None:
    """A text part's text (None: the part is not a text part); a text that is no string is a 400
    naming `<path>.text`."""
    text = part.get("text")
    if text is not None and not isinstance(text, str):
        raise _invalid(f"{path}.text", f"expected a string, got {_kind(text)}")
    return text


class _Translator:
    def __init__(self, signer: ThinkingSigner) -> None:
        self._signer = signer
        self._calls: list[_Call] = []  # the latest model turn's calls

    # -- top level ---------------------------------------------------------------------------

    def request(self, raw: dict, model: str, stream: bool, require_contents: bool) -> c.Request:
        if not model:
            raise _invalid("model", "must be a non-empty model name (models/{model}:generateContent)")
        if _get(raw, "cachedContent") is not None:
            raise _invalid("cachedContent", "cached content is not supported by this gateway (it has no caches "
                                            "API); send the contents inline")
        messages: list[c.Message] = []
        system = self._system(_get(raw, "systemInstruction"))
        if system:
            messages.append(c.Message(role="system", parts=[c.TextPart(system)]))
        contents = _get(raw, "contents")
        if contents is None:
            contents = []
        for i, content in enumerate(_list(contents, "contents")):
            messages.extend(self._content(_obj(content, f"contents[{i}]"), i))
        if require_contents and not any(m.role != "system" for m in messages):
            raise _invalid("contents", "must hold at least one content with parts")

        tools = self._tools(_get(raw, "tools"))
        tool_choice, tools = self._tool_config(_get(raw, "toolConfig"), tools)
        gen = _get(raw, "generationConfig")
        gen = _obj(gen, "generationConfig") if gen is not None else {}
        extra: dict[str, Any] = {}
        req = c.Request(model=model, messages=messages, stream=stream, tools=tools,
                        tool_choice=tool_choice, extra=extra)
        self._generation(gen, req)
        return req

    def _system(self, value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        texts = []
        content = _obj(value, "systemInstruction")
        parts = _get(content, "parts")
        for j, part in enumerate(_list(parts if parts is not None else [], "systemInstruction.parts")):
            path = f"systemInstruction.parts[{j}]"
            text = _obj(part, path).get("text")
            if text is None:
                raise _invalid(path, "only text parts are supported in a system instruction")
            if not isinstance(text, str):
                raise _invalid(f"{path}.text", f"expected a string, got {_kind(text)}")
            if text:
                texts.append(text)
        return "\n\n".join(texts)

    # -- contents ----------------------------------------------------------------------------

    def _content(self, content: dict, i: int) -> list[c.Message]:
        path = f"contents[{i}]"
        role = content.get("role")
        if role is None or role == "":
            role = "user"
        if role not in ("user", "model", "function"):
            raise _invalid(f"{path}.role", f"must be 'user' or 'model', got {role!r}")
        parts = content.get("parts")
        parts = _list(parts if parts is not None else [], f"{path}.parts")
        if role == "model":
            return self._model_turn(parts, path, i)
        return self._user_turn(parts, path)

    def _model_turn(self, parts: list, path: str, i: int) -> list[c.Message]:
        msg = c.Message(role="assistant")
        reasoning: list[str] = []
        signatures: set[str] = set()
        self._calls = []
        for j, part in enumerate(parts):
            ppath = f"{path}.parts[{j}]"
            part = _obj(part, ppath)
            sig = _get(part, "thoughtSignature")
            if sig is not None and sig not in signatures:
                signatures.add(sig)
                text = reasoning_from(self._signer, sig)
                if text:
                    reasoning.append(text)
            if part.get("thought") is True:
                continue
            text = _text(part, ppath)
            if text is not None:
                if text:
                    msg.parts.append(c.TextPart(text))
                continue
            fc = _get(part, "functionCall")
            if fc is not None:
                msg.tool_calls.append(self._function_call(_obj(fc, f"{ppath}.functionCall"), f"{ppath}.functionCall", i, j))
                continue
            if _get(part, "inlineData") is not None or _get(part, "fileData") is not None:
                raise _invalid(ppath, "media parts are not supported in a model turn")
            if _get(part, "functionResponse") is not None:
                raise _invalid(f"{ppath}.functionResponse", "a function response belongs in a user turn")
            if self._ignorable(part, sig):
                continue
            raise _invalid(ppath, "expected a part with text, functionCall or functionResponse")
        if reasoning:
            msg.reasoning = "\n\n".join(reasoning)
        if not msg.parts and not msg.tool_calls and msg.reasoning is None:
            return []
        return [msg]

    def _function_call(self, fc: dict, path: str, i: int, j: int) -> c.ToolCall:
        name = fc.get("name")
        if not isinstance(name, str) or not name:
            raise _invalid(f"{path}.name", "must be a non-empty string")
        args = fc.get("args")
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise _invalid(f"{path}.args", f"expected an object, got {_kind(args)}")
        cid = fc.get("id")
        if not isinstance(cid, str) or not cid:
            cid = f"call_{i}_{j}"
        self._calls.append(_Call(cid, name))
        return c.ToolCall(id=cid, name=name, arguments=_encode(args).decode())

    def _user_turn(self, parts: list, path: str) -> list[c.Message]:
        tool_msgs: list[c.Message] = []
        user = c.Message(role="user")
        for j, part in enumerate(parts):
            ppath = f"{path}.parts[{j}]"
            part = _obj(part, ppath)
            if part.get("thought") is True:
                continue
            text = _text(part, ppath)
            if text is not None:
                if text:
                    user.parts.append(c.TextPart(text))
                continue
            fr = _get(part, "functionResponse")
            if fr is not None:
                msg = self._function_response(_obj(fr, f"{ppath}.functionResponse"), f"{ppath}.functionResponse")
                if msg.role == "tool":
                    tool_msgs.append(msg)
                else:
                    user.parts.extend(msg.parts)
                continue
            inline = _get(part, "inlineData")
            if inline is not None:
                user.parts.append(self._inline(_obj(inline, f"{ppath}.inlineData"), f"{ppath}.inlineData"))
                continue
            file = _get(part, "fileData")
            if file is not None:
                user.parts.append(self._file(_obj(file, f"{ppath}.fileData"), f"{ppath}.fileData"))
                continue
            if _get(part, "functionCall") is not None:
                raise _invalid(f"{ppath}.functionCall", "a function call belongs in a model turn")
            if self._ignorable(part, _get(part, "thoughtSignature")):
                continue
            raise _invalid(ppath, "expected a part with text, inlineData, fileData or functionResponse")
        return tool_msgs + ([user] if user.parts else [])

    @staticmethod
    def _ignorable(part: dict, sig: Any) -> bool:
        # Google-hosted code execution and pure annotations; a part carrying only a signature
        return (sig is not None or _get(part, "executableCode") is not None
                or _get(part, "codeExecutionResult") is not None or _get(part, "videoMetadata") is not None
                or _get(part, "partMetadata") is not None or part.get("thought") is not None)

    def _function_response(self, fr: dict, path: str) -> c.Message:
        name = fr.get("name")
        if not isinstance(name, str) or not name:
            raise _invalid(f"{path}.name", "must be a non-empty string")
        response = fr.get("response")
        if response is not None and not isinstance(response, dict):
            raise _invalid(f"{path}.response", f"expected an object, got {_kind(response)}")
        text = _response_text(response)
        parts: list[c.Part] = [c.TextPart(text)] if text else []
        extra_parts = fr.get("parts")
        for k, p in enumerate(_list(extra_parts, f"{path}.parts") if extra_parts is not None else ()):
            ppath = f"{path}.parts[{k}]"
            p = _obj(p, ppath)
            inline = _get(p, "inlineData")
            if inline is not None:
                parts.append(self._inline(_obj(inline, f"{ppath}.inlineData"), f"{ppath}.inlineData"))
            elif _get(p, "fileData") is not None:
                parts.append(self._file(_obj(_get(p, "fileData"), f"{ppath}.fileData"), f"{ppath}.fileData"))
        call = self._match(fr.get("id"), name)
        if call is None:
            body = text or "(no output)"
            return c.Message(role="user", parts=[c.TextPart(f"Result of {name}: {body}"),
                                                 *(p for p in parts if not isinstance(p, c.TextPart))])
        return c.Message(role="tool", parts=parts or [c.TextPart("")], tool_call_id=call.id)

    def _match(self, rid: Any, name: str) -> _Call | None:
        if isinstance(rid, str) and rid:
            for call in self._calls:
                if call.id == rid and not call.answered:
                    call.answered = True
                    return call
        for call in self._calls:
            if call.name == name and not call.answered:
                call.answered = True
                return call
        return None

    @staticmethod
    def _inline(inline: dict, path: str) -> c.Part:
        mime = _get(inline, "mimeType")
        data = inline.get("data")
        if not isinstance(mime, str) or not mime:
            raise _invalid(f"{path}.mimeType", "must be a non-empty string")
        if not isinstance(data, str):
            raise _invalid(f"{path}.data", "must be base64 data in a string")
        mime = mime.strip().lower()
        if mime.startswith("image/"):
            return c.ImagePart(f"data:{mime};base64,{data}")
        if mime.startswith(_TEXT_TYPES) or mime.endswith(("+json", "+xml")):
            try:
                return c.TextPart(base64.b64decode(data, validate=False).decode("utf-8"))
            except (binascii.Error, ValueError, UnicodeDecodeError):
                raise _invalid(f"{path}.data", f"is not base64 of UTF-8 text ({mime})") from None
        raise _invalid(f"{path}.mimeType", f"{mime!r} is not supported (images and text only)")

    @staticmethod
    def _file(file: dict, path: str) -> c.Part:
        uri = _get(file, "fileUri")
        mime = _get(file, "mimeType")
        if not isinstance(uri, str) or not uri:
            raise _invalid(f"{path}.fileUri", "must be a non-empty string")
        if not uri.lower().startswith(("http://", "https://")):
            raise _invalid(f"{path}.fileUri", "only http(s) image URLs are supported (there is no Files API here)")
        if isinstance(mime, str) and mime and not mime.lower().startswith("image/"):
            raise _invalid(f"{path}.mimeType", f"{mime!r} is not supported (images only)")
        return c.ImagePart(uri)

    # -- tools -------------------------------------------------------------------------------

    def _tools(self, value: Any) -> list[c.Tool]:
        if value is None:
            return []
        tools: list[c.Tool] = []
        seen: set[str] = set()
        for i, tool in enumerate(_list(value, "tools")):
            tool = _obj(tool, f"tools[{i}]")
            decls = _get(tool, "functionDeclarations")
            if decls is None:
                continue  # a Google-hosted tool (googleSearch, codeExecution, ...): dropped
            for k, d in enumerate(_list(decls, f"tools[{i}].functionDeclarations")):
                path = f"tools[{i}].functionDeclarations[{k}]"
                d = _obj(d, path)
                name = d.get("name")
                if not isinstance(name, str) or not name:
                    raise _invalid(f"{path}.name", "must be a non-empty string")
                if name in seen:
                    raise _invalid(f"{path}.name", f"function {name!r} is declared twice")
                seen.add(name)
                desc = d.get("description")
                if desc is not None and not isinstance(desc, str):
                    raise _invalid(f"{path}.description", f"expected a string, got {_kind(desc)}")
                params, json_params = d.get("parameters"), _get(d, "parametersJsonSchema")
                if params is not None and json_params is not None:
                    raise _invalid(f"{path}.parametersJsonSchema", "set either parameters or parametersJsonSchema, not both")
                schema = params if params is not None else json_params
                if schema is None:
                    schema = {"type": "object", "properties": {}}
                elif not isinstance(schema, dict):
                    which = "parameters" if params is not None else "parametersJsonSchema"
                    raise _invalid(f"{path}.{which}", f"expected a schema object, got {_kind(schema)}")
                tools.append(c.Tool(name=name, description=desc or None, parameters=to_json_schema(schema)))
        return tools

    def _tool_config(self, value: Any, tools: list[c.Tool]) -> tuple[c.ToolChoice | None, list[c.Tool]]:
        if value is None:
            return None, tools
        fcc = _get(_obj(value, "toolConfig"), "functionCallingConfig")
        if fcc is None:
            return None, tools
        path = "toolConfig.functionCallingConfig"
        fcc = _obj(fcc, path)
        mode = fcc.get("mode")
        if mode is not None and not isinstance(mode, str):
            raise _invalid(f"{path}.mode", f"expected a string, got {_kind(mode)}")
        mode = (mode or "MODE_UNSPECIFIED").upper()
        if mode not in ("AUTO", "ANY", "NONE", "VALIDATED", "MODE_UNSPECIFIED"):
            raise _invalid(f"{path}.mode", f"must be AUTO, ANY, NONE or VALIDATED, got {mode!r}")
        allowed = _get(fcc, "allowedFunctionNames")
        if allowed is not None:
            names = set()
            for k, n in enumerate(_list(allowed, f"{path}.allowedFunctionNames")):
                if not isinstance(n, str) or not any(t.name == n for t in tools):
                    raise _invalid(f"{path}.allowedFunctionNames[{k}]", f"{n!r} is not a declared function")
                names.add(n)
            if names:
                tools = [t for t in tools if t.name in names]
        if not tools:
            return None, tools
        if mode == "NONE":
            return c.ToolChoice("none"), tools
        if mode == "ANY":
            if allowed and len(tools) == 1:
                return c.ToolChoice("named", tools[0].name), tools
            return c.ToolChoice("required"), tools
        if mode in ("AUTO", "VALIDATED"):
            return c.ToolChoice("auto"), tools
        return None, tools

    # -- generationConfig --------------------------------------------------------------------

    def _generation(self, gen: dict, req: c.Request) -> None:
        p = "generationConfig"
        t = _number(_get(gen, "temperature"), f"{p}.temperature")
        if t is not None and t < 0:
            raise _invalid(f"{p}.temperature", f"must be >= 0, got {t}")
        top_p = _number(_get(gen, "topP"), f"{p}.topP")
        if top_p is not None and not 0 <= top_p <= 1:
            raise _invalid(f"{p}.topP", f"must be between 0 and 1, got {top_p}")
        top_k = _integer(_get(gen, "topK"), f"{p}.topK")
        if top_k is not None and top_k < 0:
            raise _invalid(f"{p}.topK", f"must be >= 0, got {top_k}")
        max_out = _integer(_get(gen, "maxOutputTokens"), f"{p}.maxOutputTokens")
        if max_out is not None and max_out < 1:
            raise _invalid(f"{p}.maxOutputTokens", f"must be >= 1, got {max_out}")
        n = _integer(_get(gen, "candidateCount"), f"{p}.candidateCount")
        if n is not None and n != 1:
            raise _invalid(f"{p}.candidateCount", f"only 1 candidate is supported, got {n}")
        stops = _get(gen, "stopSequences")
        for k, s in enumerate(_list(stops, f"{p}.stopSequences") if stops is not None else ()):
            if not isinstance(s, str) or not s:
                raise _invalid(f"{p}.stopSequences[{k}]", "must be a non-empty string")
            req.stop.append(s)
        req.temperature, req.top_p, req.top_k, req.max_tokens = t, top_p, top_k, max_out
        seed = _integer(_get(gen, "seed"), f"{p}.seed")
        if seed is not None:
            req.extra["seed"] = seed
        for name, key in (("presencePenalty", "presence_penalty"), ("frequencyPenalty", "frequency_penalty")):
            v = _number(_get(gen, name), f"{p}.{name}")
            if v is not None:
                req.extra[key] = v
        modalities = _get(gen, "responseModalities")
        if modalities is not None:
            mods = _list(modalities, f"{p}.responseModalities")
            if mods and not any(isinstance(m, str) and m.upper() == "TEXT" for m in mods):
                raise _invalid(f"{p}.responseModalities", "only TEXT output is supported")
        fmt = self._response_format(gen, p)
        if fmt is not None:
            req.extra["response_format"] = fmt
        self._thinking(_get(gen, "thinkingConfig"), req)

    @staticmethod
    def _response_format(gen: dict, p: str) -> dict | None:
        mime = _get(gen, "responseMimeType")
        if mime is not None and not isinstance(mime, str):
            raise _invalid(f"{p}.responseMimeType", f"expected a string, got {_kind(mime)}")
        schema, which = _get(gen, "responseJsonSchema"), "responseJsonSchema"
        if schema is None:
            schema, which = _get(gen, "responseSchema"), "responseSchema"
        mime = (mime or "").strip().lower()
        if mime not in ("", "text/plain", "application/json"):
            raise _invalid(f"{p}.responseMimeType", f"{mime!r} is not supported (text/plain or application/json)")
        if schema is not None:
            if not isinstance(schema, dict):
                raise _invalid(f"{p}.{which}", f"expected a schema object, got {_kind(schema)}")
            if mime == "text/plain":
                raise _invalid(f"{p}.responseMimeType", f"must be application/json with a {which}")
            return {"type": "json_schema", "json_schema": {"name": "response", "schema": to_json_schema(schema)}}
        if mime == "application/json":
            return {"type": "json_object"}
        return None

    @staticmethod
    def _thinking(cfg: Any, req: c.Request) -> None:
        # Google shows no thoughts unless asked: hidden is the default, not the exception
        req.reasoning_hidden = not (isinstance(cfg, dict) and _get(cfg, "includeThoughts") is True)
        if not isinstance(cfg, dict):
            return
        budget = _get(cfg, "thinkingBudget")
        if isinstance(budget, (int, float)) and not isinstance(budget, bool):
            if budget == 0:
                req.reasoning_enabled = False
            elif budget < 0:
                req.reasoning_enabled = True
            else:
                req.reasoning_enabled = True
                req.reasoning_effort = "low" if budget < 4096 else "medium" if budget < 16384 else "high"
        level = _get(cfg, "thinkingLevel")
        if isinstance(level, str) and level.upper() in _EFFORT_LEVELS:
            req.reasoning_enabled = True
            req.reasoning_effort = _EFFORT_LEVELS[level.upper()]


def _response_text(response: dict | None) -> str:
    if not response:
        return ""
    if len(response) == 1:
        ((key, value),) = response.items()
        if key in ("output", "result", "content") and isinstance(value, str):
            return value
        if key == "error" and isinstance(value, str):
            return _TOOL_ERROR_PREFIX + value
    return _encode(response).decode()
