"""Render an upstream chat request the way vLLM does with a Hugging Face chat template: the prompt
text the model (and its prefix cache) really sees.

What vLLM does before the template runs, and so what this does:
- the template runs in jinja2's ImmutableSandboxedEnvironment with `trim_blocks` and
  `lstrip_blocks`, the `loopcontrols` extension, `raise_exception`, `strftime_now` and a
  `tojson` filter that keeps non-ASCII text (transformers' `apply_chat_template`);
- text-only content lists are joined into one string (vLLM's "string" content format, which
  these templates expect); mixed content stays a list of parts;
- an assistant's `tool_calls[].function.arguments` JSON text is parsed into an object (vLLM's
  `_postprocess_messages`), since templates serialise it themselves;
- `tools`, `add_generation_prompt=True`, the tokenizer's `bos_token` / `eos_token`, and the
  request's `chat_template_kwargs` are passed in.

The templates live in bench/templates/ (SOURCES.md there says where each came from).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"


@dataclass(frozen=True)
class Template:
    name: str
    file: str
    bos: str
    eos: str
    # What the template cannot render at all, whatever a gateway does (reported as the
    # template's, not ours): no tool role, or the system prompt moved into the last user turn.
    tool_role: bool = True
    system_in_last_user: bool = False


TEMPLATES = [
    Template("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>"),
    Template("deepseek-r1-distill-qwen", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
             "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    Template("llama-3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    Template("gemma-3", "google-gemma-3-it.jinja", "<bos>", "<eos>", tool_role=False),
    Template("mistral-nemo", "mistralai-Mistral-Nemo-Instruct-2407.jinja", "<s>", "</s>",
             system_in_last_user=True),
]


class TemplateRefused(Exception):
    """The template raised (raise_exception) or failed on the conversation."""


def _raise(message: str) -> None:
    raise TemplateRefused(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


@lru_cache(maxsize=None)
def _compiled(file: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime(2026, 1, 1).strftime(fmt)  # fixed: reproducible
    return env.from_string((TEMPLATE_DIR / file).read_text())


def _message(m: dict) -> dict:
    m = dict(m)
    content = m.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        m["content"] = "\n".join(p.get("text", "") for p in content)
    if m.get("role") == "assistant" and m.get("tool_calls"):
        calls = []
        for call in m["tool_calls"]:
            call = json.loads(json.dumps(call))
            fn = call.get("function") or {}
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass
            calls.append(call)
        m["tool_calls"] = calls
    return m


def render(template: Template, body: dict, *, add_generation_prompt: bool = True) -> str:
    """The prompt for an upstream chat-completions body. Raises TemplateRefused."""
    kwargs = body.get("chat_template_kwargs") if isinstance(body.get("chat_template_kwargs"), dict) else {}
    context = {
        **kwargs,
        "messages": [_message(m) for m in body.get("messages", [])],
        "add_generation_prompt": add_generation_prompt,
        "bos_token": template.bos,
        "eos_token": template.eos,
    }
    if body.get("tools"):
        context["tools"] = body["tools"]
    try:
        return _compiled(template.file).render(**context)
    except TemplateRefused:
        raise
    except (jinja2.TemplateError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise TemplateRefused(f"{type(exc).__name__}: {exc}") from None
