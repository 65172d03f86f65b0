"""Deferred tools (tool search), tool_reference blocks and hidden thinking on the Anthropic
surface: what reaches the canonical request (surfaces/anthropic/request.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from homelab_frontend import canonical as c
from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.anthropic.request import parse_request
from homelab_frontend.surfaces.signature import ThinkingSigner

SIGNER = ThinkingSigner(b"unit-test-secret")
SCHEMA = {"type": "object", "properties": {}}


def parse(body: dict) -> c.Request:
    return parse_request(json.dumps(body).encode(), signer=SIGNER)


def tool(name: str, deferred: bool = False) -> dict:
    t: dict[str, Any] = {"name": name, "description": f"{name} tool", "input_schema": SCHEMA}
    if deferred:
        t["defer_loading"] = True
    return t


TOOLS = [tool("Bash"), tool("ToolSearch"), tool("DeferredToolPlaceholder", True), tool("WebFetch", True),
         tool("WebSearch", True)]


def tool_search_turns(result_content: Any) -> list[dict]:
    return [
        {"role": "user", "content": "fetch example.com"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch",
                                           "input": {"query": "select:WebFetch"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": result_content}]},
    ]


def test_deferred_tools_are_not_sent_until_a_tool_reference_loads_them():
    req = parse({"model": "m", "max_tokens": 8, "tools": TOOLS, "messages": [{"role": "user", "content": "hi"}]})
    assert [t.name for t in req.tools] == ["Bash", "ToolSearch"]


def test_a_tool_reference_loads_its_tool_and_is_named_to_the_model():
    content = [{"type": "tool_reference", "tool_name": "WebFetch"}, {"type": "text", "text": "Tool loaded."}]
    req = parse({"model": "m", "max_tokens": 8, "tools": TOOLS, "messages": tool_search_turns(content)})
    # the loaded tool in the request's place; the placeholder and unloaded WebSearch never
    assert [t.name for t in req.tools] == ["Bash", "ToolSearch", "WebFetch"]
    tool_msg = next(m for m in req.messages if m.role == "tool")
    assert tool_msg.parts == [c.TextPart("Tool loaded: WebFetch"), c.TextPart("Tool loaded.")]
    assert tool_msg.tool_call_id == "t1"


def test_tool_choice_may_name_a_loaded_deferred_tool_but_not_an_unloaded_one():
    content = [{"type": "tool_reference", "tool_name": "WebFetch"}]
    body = {"model": "m", "max_tokens": 8, "tools": TOOLS, "messages": tool_search_turns(content),
            "tool_choice": {"type": "tool", "name": "WebFetch"}}
    assert parse(body).tool_choice == c.ToolChoice("named", "WebFetch")
    body["tool_choice"] = {"type": "tool", "name": "WebSearch"}
    with pytest.raises(GatewayError) as info:
        parse(body)
    assert info.value.param == "tool_choice.name"


@pytest.mark.parametrize("item, param", [
    ({"type": "tool_reference"}, "messages[2].content[0].content[0].tool_name"),
    ({"type": "tool_reference", "tool_name": ""}, "messages[2].content[0].content[0].tool_name"),
    ({"type": "search_result", "source": "x", "title": "t", "content": []}, "messages[2].content[0].content[0].type"),
    ({"type": "no_such_block"}, "messages[2].content[0].content[0].type"),
])
def test_malformed_or_unknown_tool_result_items_are_a_400_naming_the_path(item, param):
    with pytest.raises(GatewayError) as info:
        parse({"model": "m", "max_tokens": 8, "tools": TOOLS, "messages": tool_search_turns([item])})
    assert info.value.status == 400 and info.value.param == param
    assert info.value.message.startswith(param)


# -- thinking display "omitted" ------------------------------------------------------------


def test_display_omitted_asks_for_hidden_reasoning():
    for thinking in ({"type": "adaptive", "display": "omitted"}, {"type": "enabled", "budget_tokens": 2048, "display": "omitted"}):
        req = parse({"model": "m", "max_tokens": 8, "thinking": thinking, "messages": [{"role": "user", "content": "hi"}]})
        assert req.reasoning_enabled is True and req.reasoning_hidden is True
    for thinking in ({"type": "adaptive"}, {"type": "adaptive", "display": "summarized"},
                     {"type": "disabled", "display": "omitted"}, None, "junk"):
        req = parse({"model": "m", "max_tokens": 8, "thinking": thinking, "messages": [{"role": "user", "content": "hi"}]})
        assert req.reasoning_hidden is False


def _replay(block: dict) -> c.Message:
    req = parse({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [block, {"type": "text", "text": "answer"}]},
        {"role": "user", "content": "more"},
    ]})
    return next(m for m in req.messages if m.role == "assistant")


def test_an_empty_thinking_block_with_a_sealed_signature_restores_the_reasoning():
    sealed = SIGNER.seal("step one, step two")
    assert _replay({"type": "thinking", "thinking": "", "signature": sealed}).reasoning == "step one, step two"


@pytest.mark.parametrize("signature", [
    ThinkingSigner(b"another gateway").seal("forged"),  # someone else's key
    SIGNER.seal("x")[:-3] + "AAA",  # altered
    SIGNER.sign("x"),  # a plain signature carries no text
    "hlf2.", "hlf2.!!!!", "", None, "é" * 10,
], ids=["foreign", "altered", "plain", "empty-seal", "junk-seal", "empty", "none", "non-ascii"])
def test_foreign_altered_or_junk_sealed_signatures_restore_nothing(signature):
    assert _replay({"type": "thinking", "thinking": "", "signature": signature}).reasoning is None
