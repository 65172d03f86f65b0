"""Claude Code's `<total_tokens>N tokens left</total_tokens>` counter (CLAUDE_CODE_TOTAL_TOKENS_REMINDER)
never reaches the upstream: in `countdown` mode it changes every turn, and at the end of the system
prompt it would rewrite the beginning of every prompt (no prefix cache hit, ever)."""

from __future__ import annotations

import json

from homelab_frontend.surfaces.anthropic.request import parse_request
from homelab_frontend.surfaces.signature import ThinkingSigner

SIGNER = ThinkingSigner(b"counter")
PROMPT = "\nYou are an interactive agent.\n\nGive a recommendation, not an exhaustive survey"


def _req(left: int, *extra: dict):
    # the shapes Claude Code 2.1.197 sends (recorded with CLAUDE_CODE_TOTAL_TOKENS_REMINDER=countdown)
    body = {
        "model": "m", "max_tokens": 8,
        "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.a56;"},
                   {"type": "text", "text": "You are a Claude agent."},
                   {"type": "text", "text": f"{PROMPT}\n\n<total_tokens>{left} tokens left</total_tokens>"}],
        "messages": [{"role": "user", "content": "hi"}, *extra],
    }
    return parse_request(json.dumps(body).encode(), signer=SIGNER)


def test_the_counter_leaves_the_system_prompt_and_the_rest_stays_as_sent():
    a, b = _req(5_000_000), _req(4_981_233)
    assert a.messages[0].role == "system"
    assert a.messages[0].text() == "You are a Claude agent.\n\n" + PROMPT.rstrip()
    assert a.messages[0] == b.messages[0]  # the same first bytes whatever the count


def test_a_system_entry_holding_only_a_counter_is_no_message():
    tool_use = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]}
    counter = {"role": "system", "content": "<total_tokens>4990000 tokens left</total_tokens>"}
    req = _req(5_000_000, tool_use, result, counter)
    assert [m.role for m in req.messages] == ["system", "user", "assistant", "tool"]
    blocks = {"role": "system", "content": [{"type": "text", "text": "<total_tokens>Infinite tokens left</total_tokens>"},
                                            {"type": "text", "text": "Plan mode is on."}]}
    req = _req(5_000_000, tool_use, result, blocks, {"role": "user", "content": "go"})
    assert [(m.role, m.text()) for m in req.messages[3:]] == [("tool", "ok"), ("system", "Plan mode is on."), ("user", "go")]


def test_text_without_a_counter_is_untouched():
    req = parse_request(json.dumps({"model": "m", "max_tokens": 8, "system": "  keep <this> as is  ",
                                    "messages": [{"role": "user", "content": "hi"}]}).encode(), signer=SIGNER)
    assert req.messages[0].text() == "  keep <this> as is  "
