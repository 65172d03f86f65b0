"""Prompts stay cacheable: the recorded client sessions (bench/sessions: Claude Code 2.1.197 and
2.1.332, Anthropic SDK, OpenAI SDK chat completions and Responses, Codex CLI; tool calls, thinking
and sealed reasoning sent back, system and developer entries mid-conversation, Responses turns
chained by previous_response_id and stateless ones re-sending their input) replayed through a
real gateway to the agent stub, each upstream request rendered with real chat templates (bench.prefix).
Turn k+1's prompt must start with all of turn k's, wherever the client itself kept its
conversation append-only; and nothing the client said may be lost on the way."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import prefix
from bench.chat_render import TEMPLATES, TemplateRefused, render

pytestmark = pytest.mark.timeout(300)
SESSIONS = sorted(prefix.SESSIONS.glob("*.json"))
APPEND_ONLY_TEMPLATES = ("qwen2.5", "llama-3.1")
EXPECTED = {"claude-code-2.1.197", "claude-code-2.1.197-countdown", "claude-code-2.1.332",
            "claude-code-2.1.332-countdown", "anthropic-sdk", "openai-sdk", "openai-responses", "codex"}


@pytest.fixture(scope="module")
def results():
    assert {p.stem for p in SESSIONS} >= EXPECTED, SESSIONS
    return prefix.run(SESSIONS)


def test_every_session_replays_with_several_turns(results):
    for name, res in results.items():
        assert res["requests"] >= 6 and res["conversations"] >= 1, (name, res)
        assert res["templates"]["qwen2.5"]["pairs"] >= 4, (name, res)


def test_nothing_the_client_said_is_lost_in_the_gateway(results):
    for name, res in results.items():
        assert res["client_text_lost_in_gateway"] == 0, (name, res["lost_examples"])


@pytest.mark.parametrize("template", APPEND_ONLY_TEMPLATES)
def test_prompts_are_append_only_turn_after_turn(results, template):
    for name, res in results.items():
        s = res["templates"][template]
        assert s["refused_ours"] == 0 and s["refused_by_template"] == 0, (name, s)
        assert s["min_prefix_share"] == 1.0, (name, s)
        assert s["pairs_history_stable"] == s["pairs"], (name, s)
        assert s["requests_losing_text_in_template"] == 0, (name, s)


def test_only_claude_codes_own_edit_is_excused(results):
    """The one pair the client changed itself: Claude Code 2.1.197 rewrote a line of its system
    prompt (the model's name) between `claude -p` and `claude -p --continue`; 2.1.332 no longer does."""
    for name, res in results.items():
        edits = res["templates"]["qwen2.5"]["pairs_changed_by_client"]
        assert edits == (1 if name.startswith("claude-code-2.1.197") else 0), (name, edits)


def test_claude_codes_token_counter_does_not_rewrite_the_prompt(results):
    """CLAUDE_CODE_TOTAL_TOKENS_REMINDER=countdown: a `<total_tokens>` counter ends the system prompt
    and follows every tool result as a system entry. R1-distill's template puts the last system
    message first, so each new counter rewrote the beginning of the prompt (prefix share 0.003
    before the gateway dropped the counters); now every pair differs at most in the generation
    prompt."""
    for name in ("claude-code-2.1.197-countdown", "claude-code-2.1.332-countdown"):
        s = results[name]["templates"]["deepseek-r1-distill-qwen"]
        assert s["pairs"] >= 4 and s["pairs_history_stable"] == s["pairs"], (name, s)


def test_every_template_that_can_render_the_conversation_is_append_only(results):
    for name, res in results.items():
        for template, s in res["templates"].items():
            assert s["refused_ours"] == 0, (name, template, s)
            if s["pairs"]:
                assert s["pairs_history_stable"] == s["pairs"], (name, template, s)
            assert s["requests_losing_text_in_template"] == 0, (name, template, s)


def test_the_responses_sessions_are_what_they_claim():
    """Chained turns (previous_response_id, only the new input: tool outputs, a developer turn)
    and stateless ones (store: false, the input re-sent with sealed reasoning), as Codex runs."""
    doc = prefix.load_session(prefix.SESSIONS / "openai-responses.json")
    bodies = [r["body"] for r in doc["requests"]]
    chained = [b for b in bodies if b.get("previous_response_id")]
    stateless = [b for b in bodies if b.get("store") is False]
    assert len(chained) >= 8 and len(stateless) >= 6, len(bodies)
    assert any(i.get("type") == "function_call_output" for b in chained for i in b["input"])
    assert any(i.get("role") == "developer" for b in chained + stateless for i in b["input"])
    assert all(b.get("instructions") for b in bodies)
    sealed = [i for b in stateless for i in b["input"] if i.get("type") == "reasoning"]
    assert sealed and all(i.get("encrypted_content") for i in sealed)
    codex = prefix.load_session(prefix.SESSIONS / "codex.json")
    assert codex["client"].startswith("Codex CLI") and len(codex["requests"]) >= 6
    assert all(r["body"].get("store") is False for r in codex["requests"])


# -- the measurement itself can fail -----------------------------------------------------------------


def _req(conv: str, messages: list, system: str = "S") -> dict:
    return {"conversation": conv, "body": {"system": system, "messages": messages}, "path": "/llm/v1/messages"}


def test_a_prefix_break_is_measured():
    user1 = {"role": "user", "content": "hi"}
    turn1 = [{"role": "system", "content": "S at 10:00"}, user1]
    turn2 = [{"role": "system", "content": "S at 10:01"}, user1, {"role": "assistant", "content": "yo"},
             {"role": "user", "content": "more"}]
    requests = [_req("c", [user1]), _req("c", [user1, {"role": "assistant", "content": "yo"},
                                               {"role": "user", "content": "more"}])]
    res = prefix.analyze(requests, [{"messages": turn1}, {"messages": turn2}])
    for t in APPEND_ONLY_TEMPLATES:
        s = res["templates"][t]
        assert s["pairs"] == 1 and s["min_prefix_share"] < 0.9 and s["pairs_history_stable"] == 0, s
    # and a dropped client text is noticed
    res = prefix.analyze(requests, [{"messages": [user1]}, {"messages": [user1]}])
    assert res["client_text_lost_in_gateway"] >= 2  # "S" and "yo"/"more"


def test_a_responses_turn_extends_only_the_answer_it_names():
    base = {"instructions": "I", "tools": []}
    first = {"conversation": "c", "response_id": "resp_1", "body": {**base, "input": "hi"}}
    assert prefix.client_extends(first, {"conversation": "c", "body": {**base, "previous_response_id": "resp_1", "input": []}})
    assert not prefix.client_extends(first, {"conversation": "c", "body": {**base, "previous_response_id": "resp_0", "input": []}})
    assert not prefix.client_extends(first, {"conversation": "c", "body": {**base, "instructions": "J", "previous_response_id": "resp_1"}})
    resent = {"conversation": "c", "body": {**base, "input": [{"role": "user", "content": "hi"}, {"role": "user", "content": "more"}]}}
    assert prefix.client_extends(first, resent)
    assert not prefix.client_extends(resent, {"conversation": "c", "body": {**base, "input": [{"role": "user", "content": "more"}]}})
    # a replayed chained turn names the replay's own answer and tool calls
    body = {"previous_response_id": "resp_1", "input": [{"type": "function_call_output", "call_id": "call_a", "output": "x"}]}
    mapped = prefix._map_ids(body, {"resp_1": "resp_9", "call_a": "call_z"})
    assert mapped["previous_response_id"] == "resp_9" and mapped["input"][0]["call_id"] == "call_z"


def test_templates_render_as_their_models_expect():
    body = {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]}
    by = {t.name: t for t in TEMPLATES}
    assert render(by["qwen2.5"], body) == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert render(by["gemma-3"], body) == "<bos><start_of_turn>user\nS\n\nhi<end_of_turn>\n<start_of_turn>model\n"
    assert render(by["mistral-nemo"], body) == "<s>[INST]S\n\nhi[/INST]"
    assert render(by["deepseek-r1-distill-qwen"], body).startswith("<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜>")
    with pytest.raises(TemplateRefused):
        render(by["gemma-3"], {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})
