"""Where system content goes in the upstream's messages: one leading system message, and every
later system turn merged, in place, into the neighbouring user or tool message.

Why: clients put system turns mid-conversation (Claude Code: a `<total_tokens>` turn after each
tool result, `role: system` entries with their own output_config). Sent as they are, the models'
own chat templates do three different things with a system message that is not first
(tests/unit/upstream/test_system_turns_templates.py renders them; README "System turns"):
  - DeepSeek-R1-Distill-Qwen keeps only the LAST system message and renders it at the top, so a
    trailing `<total_tokens>` turn replaces the whole system prompt and the start of the prompt
    changes on every turn: no prefix-cache hit, and the model loses its instructions;
  - Gemma 3 and Mistral raise ("Conversation roles must alternate"): a 400 on every turn;
  - Qwen2.5 and Llama 3.1 render it in place.
Merged (the default, `system_turns: merge`), every template accepts the conversation, and what
was rendered for a turn is still the start of the next turn's rendering. A model whose template
renders system turns in place can keep them native (`system_turns: native` on the model).

Rules (merge), decided only by what came BEFORE a system turn, so the rendering of a conversation
never changes when later turns are added:
  - system messages before any other message are joined into one (blank line between);
  - a later one after a user or tool message is appended to that message, wrapped in
    `<system>...</system>` so the model can tell it from what the user or the tool said (after
    tool results that is the last tool message: a user message there would break the templates
    that require user/assistant alternation around tool calls, Mistral's);
  - one after an assistant message goes first in the next user message; if none follows (the
    conversation ends there, or an assistant follows) it is a user message of its own, which a
    later user message continues. Between an assistant's tool calls and their results (tool
    messages must follow the calls; the Anthropic surface already moves such a turn to after the
    results) it goes first in the first tool message: the one case decided by what follows.
  - a user message right after another user message is joined into it (blank line between):
    Codex sends its `<environment_context>` and the prompt as two user items in a row, which
    Gemma 3's and Mistral's templates refuse ("roles must alternate"). This too depends only on
    the message before it.
"""

from __future__ import annotations

from typing import Literal

SystemTurns = Literal["merge", "native"]
OPEN, CLOSE = "<system>\n", "\n</system>"


def wrap(text: str) -> str:
    return OPEN + text + CLOSE


def _join(content, text: str, *, first: bool):
    """`text` added to a message's content (a string, a list of parts, or None)."""
    if isinstance(content, list):
        part = {"type": "text", "text": text}
        return [part, *content] if first else [*content, part]
    if not content:
        return text
    return text + "\n\n" + content if first else content + "\n\n" + text


def _parts(content) -> list:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": content}] if content else []


def _concat(a, b):
    """Two user messages' contents as one: strings joined by a blank line, else their parts."""
    if (a is None or isinstance(a, str)) and (b is None or isinstance(b, str)):
        return "\n\n".join(x for x in (a, b) if x)
    return _parts(a) + _parts(b)


def _leading(messages: list[dict]) -> tuple[list[dict], int]:
    """The leading system messages joined into one, and where the rest begins."""
    i = 0
    texts = []
    while i < len(messages) and messages[i]["role"] == "system":
        content = messages[i]["content"]
        if not isinstance(content, str):
            break
        texts.append(content)
        i += 1
    if len(texts) <= 1:
        return messages[:i], i
    return [{"role": "system", "content": "\n\n".join(texts)}], i


def place(messages: list[dict], mode: SystemTurns = "merge") -> list[dict]:
    """OpenAI-shaped messages with their system turns placed as the module docstring says."""
    head, start = _leading(messages)
    if mode == "native":
        return head + messages[start:]
    out: list[dict] = list(head)
    body_start = len(out)
    pending: list[str] = []
    for m in messages[start:]:
        role = m["role"]
        if role == "system":
            text = m["content"] if isinstance(m["content"], str) else ""
            if not isinstance(m["content"], str):  # not produced by our translators; be safe
                text = "\n".join(p.get("text", "") for p in m["content"] if isinstance(p, dict))
            if len(out) > body_start and out[-1]["role"] in ("user", "tool"):
                last = dict(out[-1])
                last["content"] = _join(last.get("content"), wrap(text), first=False)
                out[-1] = last
            else:
                pending.append(wrap(text))
            continue
        if pending:
            if role in ("user", "tool"):
                m = dict(m)
                m["content"] = _join(m.get("content"), "\n\n".join(pending), first=True)
            else:
                out.append({"role": "user", "content": "\n\n".join(pending)})
            pending = []
        if role == "user" and len(out) > body_start and out[-1]["role"] == "user":
            last = dict(out[-1])
            last["content"] = _concat(last.get("content"), m.get("content"))
            out[-1] = last
            continue
        out.append(m)
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    return out
