"""Render what the gateway sends upstream with real chat templates (jinja2), turn by turn.

The measurement behind the default of `system_turns` (src/homelab_frontend/upstream/system_turns.py):
a Claude Code-shaped session (system prompt, a system turn after the first user message, a
Bash call, its result followed by a `<total_tokens>` system turn, a text answer, a follow-up
with a system turn of its own) goes through the real Anthropic translator and `build_body`, one
request per turn, in both modes; each request is rendered with each template in
`tests/support/templates/` (origins in its README) as vLLM / llama.cpp would, and we record
    - whether the template accepted it (or its exception),
    - whether the rendered system prompt (the start of the prompt) stayed the same every turn,
    - whether each turn's rendering is the start of the next turn's (the prefix cache's hit).

    .venv/bin/python tests/support/chat_templates.py     # prints the table (docs/anthropic.md: System turns)
"""

from __future__ import annotations

import datetime
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import jinja2
import jinja2.sandbox
import msgspec

from homelab_frontend.config import Backend
from homelab_frontend.surfaces.anthropic.request import parse_request
from homelab_frontend.surfaces.signature import ThinkingSigner
from homelab_frontend.upstream.chat_body import build_body

TEMPLATES = Path(__file__).resolve().parent / "templates"
SYSTEM_PROMPT = "You are a coding agent. Follow the user's instructions."
BASH = {
    "name": "Bash",
    "description": "Runs a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}
# Mistral's templates insist on 9-character alphanumeric tool-call ids
CALL_ID = "call00001"

# Template -> (BOS, EOS) and whether it can hold a tool conversation at all (Gemma 3's template
# knows only user and assistant: a `tool` message fails it whatever the gateway does).
MODELS = {
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", True),
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>", True),
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>", True),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>", True),
    "Mistral-Small-3.2-24B-Instruct-2506": ("<s>", "</s>", True),
    "google-gemma-3-it": ("<bos>", "<eos>", False),
}


def session(with_tools: bool) -> list[list[dict]]:
    """Anthropic `messages` of each request of one session, in order."""
    turns: list[list[dict]] = []
    msgs: list[dict] = [
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>\nBe brief.\n</system-reminder>"},
                                     {"type": "text", "text": "Run echo hello and tell me what it printed."}]},
        {"role": "system", "content": "# Environment\nPrimary working directory: /work", "output_config": {"effort": "medium"}},
    ]
    turns.append(list(msgs))
    if with_tools:
        msgs += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": CALL_ID, "name": "Bash", "input": {"command": "echo hello"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": CALL_ID, "content": "hello"}]},
            {"role": "system", "content": "<total_tokens>190000 tokens left</total_tokens>"},
        ]
        turns.append(list(msgs))
    msgs += [
        {"role": "assistant", "content": [{"type": "text", "text": "It printed hello."}]},
        {"role": "user", "content": "Thanks. And now?"},
        {"role": "system", "content": "<total_tokens>189000 tokens left</total_tokens>"},
    ]
    turns.append(list(msgs))
    return turns


def upstream_messages(anthropic_messages: list[dict], mode: str, with_tools: bool) -> tuple[list[dict], list[dict] | None]:
    body = {"model": "m", "max_tokens": 100, "system": SYSTEM_PROMPT, "messages": anthropic_messages}
    if with_tools:
        body["tools"] = [BASH]
    req = parse_request(json.dumps(body).encode(), signer=ThinkingSigner(b"k" * 32))
    out = msgspec.json.decode(build_body(req, upstream_model="m", backend=Backend(url="http://h/v1"),
                                         stream=True, max_tokens=100, system_turns=mode))
    return out["messages"], out.get("tools")


def _environment() -> jinja2.Environment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.date(2026, 1, 1).strftime(fmt)
    env.filters["tojson"] = lambda v, indent=None, **_: json.dumps(v, indent=indent, ensure_ascii=False)
    return env


_ENV = _environment()


def render(template: str, messages: list[dict], tools: list[dict] | None, *, generation: bool) -> str:
    bos, eos, _ = MODELS[template]
    tpl = _ENV.from_string((TEMPLATES / f"{template}.jinja").read_text())
    return tpl.render(messages=messages, tools=tools, add_generation_prompt=generation,
                      bos_token=bos, eos_token=eos)


@dataclass
class Row:
    template: str
    mode: str
    tools: bool
    error: str | None  # the template's exception on any turn
    late_system: bool  # a system message after a non-system one reached the template
    start_stable: bool  # the system prompt opens every turn's prompt, unchanged
    prefix_stable: bool  # every turn's rendering starts with the previous turn's


def measure(template: str, mode: str, with_tools: bool) -> Row:
    renders: list[str] = []
    late = False
    error = None
    for turn in session(with_tools):
        messages, tools = upstream_messages(turn, mode, with_tools)
        seen_other = False
        for m in messages:
            late |= m["role"] == "system" and seen_other
            seen_other |= m["role"] != "system"
        try:
            # the prompt as the model sees it (generation prompt added), and the same turn as
            # history (what the next turn's prompt should start with)
            render(template, messages, tools, generation=True)
            renders.append(render(template, messages, tools, generation=False))
        except jinja2.exceptions.TemplateError as exc:
            error = f"{type(exc).__name__}: {exc}"
            break
    if error is not None:
        return Row(template, mode, with_tools, error, late, False, False)
    opening = SYSTEM_PROMPT[:40]
    start_stable = all(r.find(opening) == renders[0].find(opening) >= 0 for r in renders)
    start_stable &= all(r[: r.find(opening) + len(SYSTEM_PROMPT)] == renders[0][: renders[0].find(opening) + len(SYSTEM_PROMPT)] for r in renders)
    prefix_stable = all(b.startswith(_history(a)) for a, b in zip(renders, renders[1:]))
    return Row(template, mode, with_tools, None, late, start_stable, prefix_stable)


def _history(rendered: str) -> str:
    # A turn's rendering, less the closing of a trailing open tool-output run that a template
    # (R1's) emits only at the very end: the next turn continues from before it.
    return rendered.removesuffix("<｜tool▁outputs▁end｜>")


def table() -> list[Row]:
    return [measure(t, mode, tools) for t in MODELS for tools in (True, False) for mode in ("native", "merge")]


if __name__ == "__main__":
    print("| template | conversation | system_turns | template error | late system msg | start stable | prefix stable |")
    print("|---|---|---|---|---|---|---|")
    for r in table():
        err = (r.error or "")[:60] or "none"
        print(f"| {r.template} | {'tool call' if r.tools else 'plain'} | {r.mode} | {err} | {r.late_system} | "
              f"{r.start_stable} | {r.prefix_stable} |")
    sys.exit(0)
