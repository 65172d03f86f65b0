"""A canonical Request -> the OpenAI chat-completions body the upstream receives.

Only what the client asked for is sent: no default temperature, no copied-through fields the
upstream might reject. Per backend kind, the wire extras it understands are added (vLLM's
continuous usage stats) and the ones it does not are left out.
"""

from __future__ import annotations

import msgspec

from .. import canonical as c
from ..config import Backend
from .system_turns import SystemTurns, place

_encode = msgspec.json.Encoder().encode


def _content(parts: list[c.Part]) -> str | list[dict]:
    if all(isinstance(p, c.TextPart) for p in parts):
        # One string, its parts on separate lines: what vLLM makes of a list of text parts, and
        # what Ollama (which would turn each part into a message of its own) should see too.
        return "\n".join(p.text for p in parts)  # type: ignore[union-attr]
    out: list[dict] = []
    for p in parts:
        if isinstance(p, c.TextPart):
            out.append({"type": "text", "text": p.text})
        else:
            out.append({"type": "image_url", "image_url": {"url": p.url}})
    return out


def _message(m: c.Message) -> dict:
    if m.role == "tool":
        # OpenAI tool messages carry text only; an image a tool returned is named, not dropped
        text = "\n".join(p.text if isinstance(p, c.TextPart) else "[image]" for p in m.parts)
        return {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": text}
    msg: dict = {"role": m.role, "content": _content(m.parts)}
    if m.role == "assistant":
        if m.tool_calls:
            msg["tool_calls"] = [
                {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                for t in m.tool_calls
            ]
            if msg["content"] == "":
                msg["content"] = None
        if m.reasoning:
            # vLLM (since 0.16) and Ollama read `reasoning`; vLLM still takes the old name too.
            msg["reasoning"] = m.reasoning
    return msg


def build_body(
    req: c.Request,
    *,
    upstream_model: str,
    backend: Backend,
    stream: bool,
    max_tokens: int | None,
    send_stop: bool = True,
    continuous_usage: bool = False,
    system_turns: SystemTurns = "merge",
) -> bytes:
    body: dict = {
        "model": upstream_model,
        # one leading system message; later system turns merged in place (upstream/system_turns.py)
        "messages": place([_message(m) for m in req.messages], system_turns),
    }
    if stream:
        body["stream"] = True
        opts: dict = {"include_usage": True}
        if continuous_usage and backend.kind == "vllm":
            opts["continuous_usage_stats"] = True
        body["stream_options"] = opts
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.top_k is not None and backend.kind in ("vllm", "llamacpp", "ollama", "peer"):
        body["top_k"] = req.top_k  # not an OpenAI parameter: only for servers that take it
    if req.stop and send_stop:
        body["stop"] = req.stop
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    **({"description": t.description} if t.description else {}),
                    "parameters": t.parameters or {"type": "object", "properties": {}},
                },
            }
            for t in req.tools
        ]
        if req.tool_choice is not None:
            tc = req.tool_choice
            body["tool_choice"] = (
                {"type": "function", "function": {"name": tc.name}} if tc.mode == "named" else tc.mode
            )
        if req.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.user is not None:
        body["user"] = req.user
    _reasoning_controls(req, backend, body)
    body.update(req.extra)
    return _encode(body)


def _reasoning_controls(req: c.Request, backend: Backend, body: dict) -> None:
    """Map the client's thinking wishes onto what each backend understands (README: Thinking).

    vLLM: `reasoning_effort` is passed on (models whose template reads it use it), and thinking
    off becomes `chat_template_kwargs.enable_thinking=false` (Qwen3-style templates). R1-distill
    always reasons; there the request is honoured as far as the template allows.
    Ollama: `reasoning_effort` is passed on (its OpenAI layer maps it to `think`).
    llama.cpp / other: only `reasoning_effort`.
    """
    if req.reasoning_effort is not None:
        body["reasoning_effort"] = req.reasoning_effort
    # a peer box takes vLLM's form and passes it on to its own backend
    if req.reasoning_enabled is False and backend.kind in ("vllm", "peer"):
        body["chat_template_kwargs"] = {"enable_thinking": False}
