"""The scripts of the real vLLM's test logits processor (tests/support/vllm_script.py): which
script a prompt names, and the token plan each forces (with a toy tokenizer: one id per char)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from support.vllm_script import (
    DEFAULT, END_OF_TURN, END_THINK, SCRIPTS, THINK, Script, directive, plan, script_for,
)


def encode(text: str) -> list[int]:
    return [1000 + ord(ch) for ch in text]


def decode(ids) -> str:
    return "".join({THINK: "<think>", END_THINK: "</think>"}.get(i) or chr(i - 1000) for i in ids)


def test_the_last_directive_wins_and_none_is_the_default():
    assert script_for("hi") is DEFAULT
    assert script_for("x " + directive("weather")) is SCRIPTS["weather"]
    prompt = "<start_of_turn>user\nweather? " + directive("weather") + "<end_of_turn>\n" + \
             "<start_of_turn>user\n<tool_response>\nsunny " + directive("after-weather") + "\n</tool_response>"
    assert script_for(prompt) is SCRIPTS["after-weather"]
    assert script_for(directive("free")) is None
    assert script_for("[[hlf:no-such-script]]") is DEFAULT


def test_a_plan_is_think_reasoning_end_think_content_tools_then_the_end_of_turn():
    s = SCRIPTS["weather"]
    p = plan(s, encode)
    text = decode(p.tokens)
    assert text.startswith("<think>" + s.reasoning + "</think><tool_call>\n")
    call = json.loads(text.split("<tool_call>\n")[1].split("\n</tool_call>")[0])
    assert call == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert p.at(len(p.tokens)) == p.at(len(p.tokens) + 5) == END_OF_TURN
    assert decode(plan(SCRIPTS["plain"], encode).tokens) == "<think></think>" + SCRIPTS["plain"].content
    assert THINK not in plan(Script(content="x"), encode).tokens


@given(st.integers(min_value=0, max_value=5000))
def test_a_repeating_script_never_ends(n):
    p = plan(SCRIPTS["long"], encode)
    assert p.at(n) != END_OF_TURN
    if n >= len(p.tokens):
        assert p.at(n) == p.repeat[(n - len(p.tokens)) % len(p.repeat)]


def test_no_script_writes_a_directive_or_a_think_tag_in_its_text():
    # an answer sent back in a later turn must not name a script, nor end reasoning early
    for s in SCRIPTS.values():
        for text in (s.reasoning or "", s.content, s.repeat or "", s.tool_text()):
            assert "[[hlf:" not in text and "<think>" not in text and "</think>" not in text
