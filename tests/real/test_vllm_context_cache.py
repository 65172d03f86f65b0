"""The real vLLM's context and prefix cache through every dialect:
- a `max_tokens` above the model's length (vLLM refuses it with a 400 when asked directly) is
  fitted by the gateway and answered;
- a prompt longer than the model's context is a 400 in the caller's dialect that says so;
- turn 2 of a conversation, turn 1's signed thinking sent back, hits vLLM's prefix cache by its own
  counter (`vllm:prefix_cache_hits_total`), and the cached tokens each dialect reports are the
  ones vLLM counted (`vllm:prompt_tokens_cached_total`). Ollama's API has no cached-token field.
"""

from __future__ import annotations

import json
import re

import anthropic
import openai
import pytest
from google import genai
from google.genai import types as gt

from rawhttp import post_raw
from stubproc import wait_for
from support.vllm_script import SCRIPTS, directive
from vllmproc import MAX_MODEL_LEN

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(900)]

MODEL = "gemma"
REASON = SCRIPTS["reason"]
HUGE = "hello " * 1500  # about 1500 tokens: more than the 1024 of the context


def _bodies(prompt: str, max_tokens: int) -> dict[str, tuple[str, dict]]:
    msgs = [{"role": "user", "content": prompt}]
    return {
        "openai": ("/llm/v1/chat/completions", {"model": MODEL, "max_tokens": max_tokens, "messages": msgs}),
        "anthropic": ("/llm/v1/messages", {"model": MODEL, "max_tokens": max_tokens, "messages": msgs}),
        "responses": ("/llm/v1/responses", {"model": MODEL, "max_output_tokens": max_tokens, "input": prompt,
                                            "store": False}),
        "gemini": (f"/llm/v1beta/models/{MODEL}:generateContent",
                   {"contents": [{"role": "user", "parts": [{"text": prompt}]}],
                    "generationConfig": {"maxOutputTokens": max_tokens}}),
        "ollama": ("/api/chat", {"model": MODEL, "stream": False, "messages": msgs,
                                 "options": {"num_predict": max_tokens}}),
    }


DIALECTS = ["openai", "anthropic", "responses", "gemini", "ollama"]


def test_vllm_itself_refuses_what_the_gateway_fits(idle_vllm):
    status, doc = idle_vllm.post("/chat/completions", {
        "model": "gemma-3-270m", "max_tokens": 5000, "messages": [{"role": "user", "content": directive("reason")}]})
    assert status == 400, doc


@pytest.mark.parametrize("dialect", DIALECTS)
def test_max_tokens_above_the_models_length_is_fitted(vllm_gw, idle_vllm, dialect):
    path, body = _bodies(f"Sum, please ({dialect}). " + directive("reason"), 5000)[dialect]
    status, _, raw = post_raw(vllm_gw.url + path, body, timeout=120)
    assert status == 200, raw
    assert REASON.content in raw.decode()
    # what vLLM was asked (its request log): no more than its context leaves after the prompt
    asked = re.findall(r"Received request .*?max_tokens=(\d+)", idle_vllm.log_text())
    assert asked and int(asked[-1]) < MAX_MODEL_LEN, asked[-1:]


def _says_context(dialect: str, status: int, doc) -> str:
    assert status == 400, doc
    if dialect == "openai":
        assert doc["error"]["type"] == "invalid_request_error"
        return doc["error"]["message"]
    if dialect == "anthropic":
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
        return doc["error"]["message"]
    if dialect == "responses":
        assert doc["error"]["type"] == "invalid_request_error"
        return doc["error"]["message"]
    if dialect == "gemini":
        assert doc["error"]["status"] == "INVALID_ARGUMENT" and doc["error"]["code"] == 400
        return doc["error"]["message"]
    assert set(doc) == {"error"}  # Ollama's error shape
    return doc["error"]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_prompt_over_the_context_is_a_400_in_the_callers_dialect(vllm_gw, idle_vllm, dialect):
    path, body = _bodies(HUGE, 50)[dialect]
    status, _, raw = post_raw(vllm_gw.url + path, body, timeout=120)
    message = _says_context(dialect, status, json.loads(raw))
    assert str(MAX_MODEL_LEN) in message and "context" in message.lower(), message
    wait_for(idle_vllm.idle, timeout=10)


# -- the prefix cache -------------------------------------------------------------------------------

SYSTEM = ("You are a careful assistant for a homelab. You answer questions about servers, networks, "
          "storage and the services that run on them, briefly and exactly. ") * 10  # > 2 blocks of 128


def _cache(vllm) -> tuple[float, float, float]:
    m = vllm.metrics()
    return (m.get("vllm:prefix_cache_hits_total", 0.0), m.get("vllm:prompt_tokens_cached_total", 0.0),
            m.get("vllm:request_success_total", 0.0))


def _turn2(vllm, ask):
    """Run turn 1 then turn 2 (each `ask(turn)` -> the reported cached tokens of that turn); ->
    (turn 2's reported cached tokens, vLLM's prefix-cache hits for turn 2, its cached prompt tokens)."""
    ask(1)
    wait_for(vllm.idle, timeout=60, interval=0.1)
    hits0, cached0, done0 = _cache(vllm)
    reported = ask(2)
    hits1, cached1, _ = wait_for(lambda: (c := _cache(vllm))[2] > done0 and c, timeout=30, interval=0.1)
    return reported, hits1 - hits0, cached1 - cached0


def test_anthropic_turn_two_with_signed_thinking_hits_vllms_prefix_cache(vllm_gw, idle_vllm):
    client = anthropic.Anthropic(base_url=vllm_gw.llm, api_key="x", max_retries=0)
    first = [{"role": "user", "content": "Which port does SSH use? (anthropic) " + directive("reason")}]
    state = {}

    def ask(turn):
        if turn == 1:
            m = state["m1"] = client.messages.create(model=MODEL, max_tokens=200, system=SYSTEM, messages=first)
            return m.usage.cache_read_input_tokens
        m = client.messages.create(model=MODEL, max_tokens=200, system=SYSTEM, messages=first + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in state["m1"].content]},
            {"role": "user", "content": "And HTTPS? " + directive("plain")}])
        state["m2"] = m
        return m.usage.cache_read_input_tokens

    reported, hits, cached = _turn2(idle_vllm, ask)
    assert state["m1"].content[0].type == "thinking" and state["m1"].content[0].signature
    assert hits > 0 and cached > 0
    assert reported == cached


def test_openai_turn_two_hits_vllms_prefix_cache(vllm_gw, idle_vllm):
    client = openai.OpenAI(base_url=vllm_gw.base, api_key="x", max_retries=0)
    first = [{"role": "system", "content": SYSTEM},
             {"role": "user", "content": "Which port does SSH use? (openai) " + directive("reason")}]
    state = {}

    def ask(turn):
        msgs = first if turn == 1 else first + [state["r1"].choices[0].message.model_dump(exclude_none=True),
                                                {"role": "user", "content": "And HTTPS? " + directive("plain")}]
        r = client.chat.completions.create(model=MODEL, max_tokens=200, messages=msgs)
        state[f"r{turn}"] = r
        d = r.usage.prompt_tokens_details
        return d.cached_tokens if d else 0

    reported, hits, cached = _turn2(idle_vllm, ask)
    assert hits > 0 and cached > 0 and reported == cached


def test_responses_turn_two_with_its_reasoning_item_hits_vllms_prefix_cache(vllm_gw, idle_vllm):
    client = openai.OpenAI(base_url=vllm_gw.base, api_key="x", max_retries=0)
    first = [{"role": "user", "content": "Which port does SSH use? (responses) " + directive("reason")}]
    state = {}

    def ask(turn):
        items = first if turn == 1 else first + [o.model_dump(exclude_none=True) for o in state["r1"].output] + [
            {"role": "user", "content": "And HTTPS? " + directive("plain")}]
        r = client.responses.create(model=MODEL, store=False, max_output_tokens=200, instructions=SYSTEM,
                                    input=items, include=["reasoning.encrypted_content"])
        state[f"r{turn}"] = r
        return r.usage.input_tokens_details.cached_tokens

    reported, hits, cached = _turn2(idle_vllm, ask)
    assert state["r1"].output[0].type == "reasoning"
    assert hits > 0 and cached > 0 and reported == cached


def test_gemini_turn_two_with_its_thought_signature_hits_vllms_prefix_cache(vllm_gw, idle_vllm):
    client = genai.Client(api_key="unused", http_options=gt.HttpOptions(
        base_url=vllm_gw.llm, retry_options=gt.HttpRetryOptions(attempts=1)))
    config = gt.GenerateContentConfig(system_instruction=SYSTEM, max_output_tokens=200,
                                      thinking_config=gt.ThinkingConfig(include_thoughts=True))
    first = gt.Content(role="user", parts=[gt.Part(text="Which port does SSH use? (gemini) " + directive("reason"))])
    state = {}

    def ask(turn):
        contents = [first] if turn == 1 else [first, state["r1"].candidates[0].content,
                                              gt.Content(role="user", parts=[gt.Part(text="And HTTPS? " + directive("plain"))])]
        r = client.models.generate_content(model=MODEL, contents=contents, config=config)
        state[f"r{turn}"] = r
        return r.usage_metadata.cached_content_token_count or 0

    reported, hits, cached = _turn2(idle_vllm, ask)
    assert hits > 0 and cached > 0 and reported == cached
