"""Every dialect through two hops, exactly: the same request through a front gateway -> a box's
gateway -> its stub answers the client byte for byte as the box's gateway alone does (after the
ids, times and signatures each gateway makes for itself are set aside), for the Anthropic stream
(held to the seeds' grammar too), Responses, Gemini, Ollama and OpenAI chat with tools and
reasoning; and a client that leaves the front cancels the generation at the box's stub at once."""

from __future__ import annotations

import json
import os
import re
import time

import pytest

from support.anthropic_sse_grammar import assemble, check_stream
from conftest import R1
from gwproc import Gateway, config_for
from rawhttp import post_and_vanish, post_raw, sse_events
from stubproc import start_stub, wait_for

KEY = "sk-peer-front"
ENV = {"HLF_PEER_KEY": KEY, "HLF_SIGN": "one-signing-key-for-both"}
H = {"Authorization": f"Bearer {KEY}"}
MODEL = "r1"


@pytest.fixture(scope="module")
def stub(tmpdir_session):
    with start_stub("vllm", "--reasoning", "--agent", "--model", R1, "--max-model-len", "4096",
                    log_path=os.path.join(tmpdir_session, "stub-peer-dialects.log")) as s:
        yield s


@pytest.fixture(scope="module")
def box(stub):
    cfg = config_for({"gpu0": {"url": stub.base, "kind": "vllm", "slots": 4}},
                     {MODEL: {"backend": "gpu0", "upstream_model": R1, "capabilities": ["completion", "tools", "thinking"]}},
                     auth={"keys": [{"name": "front", "key_env": "HLF_PEER_KEY", "peer": True}]},
                     anthropic={"signing_key_env": "HLF_SIGN"})
    with Gateway(cfg, env=ENV) as g:
        yield g


@pytest.fixture(scope="module")
def front(box):
    cfg = {"backends": {"box": {"url": box.base, "api_key_env": "HLF_PEER_KEY", "health_interval_s": 1.0}},
           "anthropic": {"signing_key_env": "HLF_SIGN"}}
    with Gateway(cfg, env=ENV) as g:
        wait_for(lambda: g.get("/llm/v1/models")[1]["data"], 15, 0.05)
        yield g


_VOLATILE = re.compile(r'"(id|created|created_at|createdAt|responseId|request_id|signature|call_id|item_id|'
                       r'response_id|system_fingerprint|modelVersion|total_duration|load_duration|'
                       r'prompt_eval_duration|eval_duration|thoughtSignature)"\s*:\s*("[^"]*"|-?\d+(\.\d+)?)')


_START_INPUT = re.compile(r'("type":"message_start".*?"input_tokens":)\d+')


def _data(raw: bytes) -> list[dict]:
    return [json.loads(line[6:]) for line in raw.decode().splitlines() if line.startswith("data: {")]


def _norm(raw: bytes) -> str:
    text = raw.decode()
    # message_start's input_tokens: the tokenizer's count if it has arrived by then, else an
    # estimate (surfaces/anthropic/handler.py): a race at one hop already; message_delta's is exact
    text = _START_INPUT.sub(r"\1*", text)
    text = _VOLATILE.sub(lambda m: f'"{m.group(1)}":"*"', text)
    return re.sub(r"\b(msg|resp|rs|fc|call|toolu|chatcmpl|req|msg_item)_[A-Za-z0-9_-]+", r"\1_*", text)


def _both(path: str, body: dict, headers: dict | None = None) -> tuple[tuple[int, bytes], tuple[int, bytes]]:
    def one(url):
        status, _, raw = post_raw(url + path, body, headers=headers, timeout=60)
        return status, raw
    return one(BOX_URL), one(FRONT_URL)


@pytest.fixture(autouse=True)
def _urls(box, front):
    global BOX_URL, FRONT_URL
    BOX_URL, FRONT_URL = box.url, front.url


BOX_URL = FRONT_URL = ""


def _same(path, body, headers=None) -> bytes:
    (s1, direct), (s2, hopped) = _both(path, body, {**H, **(headers or {})} if path.startswith("/llm") or path.startswith("/api") else headers)
    assert s1 == s2 == 200, (direct[:300], hopped[:300])
    assert _norm(hopped) == _norm(direct)
    return hopped


def test_anthropic_stream_with_thinking_and_a_tool_call(front):
    body = {"model": MODEL, "max_tokens": 256, "stream": True,
            "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "messages": [{"role": "user", "content": '[stub reasoning=6 content=4 tool=get_weather args={"city":"Oslo"}] hi'}]}
    raw = _same("/llm/v1/messages", body, {"anthropic-version": "2023-06-01"})
    events = check_stream(raw, model=MODEL)  # the seeds' grammar, through two hops
    message = assemble(events)
    kinds = [b["type"] for b in message["content"]]
    assert kinds[0] == "thinking" and "tool_use" in kinds
    assert message["stop_reason"] == "tool_use"
    assert message["content"][0]["signature"]


def test_anthropic_stream_plain_text_usage_and_stop_reason(front):
    body = {"model": MODEL, "max_tokens": 5, "stream": True,
            "messages": [{"role": "user", "content": "[stub reasoning=0 content=40] hi"}]}
    raw = _same("/llm/v1/messages", body, {"anthropic-version": "2023-06-01"})
    message = assemble(check_stream(raw, model=MODEL))
    assert message["stop_reason"] == "max_tokens" and message["usage"]["output_tokens"] == 5


def test_openai_chat_with_tools_and_reasoning(front):
    body = {"model": MODEL, "stream": True, "stream_options": {"include_usage": True},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "messages": [{"role": "user", "content": '[stub reasoning=3 content=2 tool=f args={"a":1}] go'}]}
    raw = _same("/llm/v1/chat/completions", body)
    chunks = _data(raw)
    assert any((c["choices"] or [{}])[0].get("delta", {}).get("reasoning") for c in chunks if c.get("choices"))
    assert any((c["choices"] or [{}])[0].get("delta", {}).get("tool_calls") for c in chunks if c.get("choices"))
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    whole = _same("/llm/v1/chat/completions", {**body, "stream": False})
    doc = json.loads(whole)
    assert doc["choices"][0]["finish_reason"] == "tool_calls" and doc["choices"][0]["message"]["reasoning"]


def test_responses_stream(front):
    body = {"model": MODEL, "stream": True, "store": False, "input": "[stub reasoning=3 content=5] hi"}
    raw = _same("/llm/v1/responses", body)
    names = [n for n, _ in sse_events(raw)]
    assert names[0] == "response.created" and names[-1] == "response.completed"


def test_gemini_stream(front):
    body = {"contents": [{"role": "user", "parts": [{"text": "[stub reasoning=2 content=4] hi"}]}],
            "generationConfig": {"thinkingConfig": {"includeThoughts": True}}}
    raw = _same(f"/llm/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", body, {"x-goog-api-key": KEY})
    parts = [p for e in _data(raw) for c in e.get("candidates", []) for p in c.get("content", {}).get("parts", [])]
    assert any(p.get("thought") for p in parts) and any(p.get("text") and not p.get("thought") for p in parts)


def test_ollama_chat_stream(front):
    body = {"model": MODEL, "stream": True, "think": True,
            "messages": [{"role": "user", "content": "[stub reasoning=2 content=3] hi"}]}
    raw = _same("/api/chat", body)
    lines = [json.loads(x) for x in raw.splitlines() if x.strip()]
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    assert any(x["message"].get("thinking") for x in lines[:-1])


def test_a_client_leaving_the_front_cancels_at_the_boxs_stub_at_once(front, stub):
    stub.reset()
    before = stub.log_text().count("cancelled")
    got = post_and_vanish(front.base + "/chat/completions",
                          {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "[stub content=400 delay_ms=20] go"}]},
                          until=b"data: {", headers=H)
    assert got
    left = time.monotonic()
    wait_for(lambda: stub.log_text().count("cancelled") > before, 5, 0.01)
    took = time.monotonic() - left
    assert took < 2.0, took  # one hop more: still the next token's time, not the generation's
    wait_for(lambda: stub.stats()["in_flight"] == 0, 5)


def test_prompt_counts_are_the_boxs_tokenizers(front, box, stub):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count these few words please"}]}
    status, direct = box.post("/llm/v1/messages/count_tokens", body, H)
    assert status == 200
    stub.reset()
    status, hopped = front.post("/llm/v1/messages/count_tokens", body)
    assert status == 200 and hopped == direct
    assert any(r.get("path", "").endswith("/tokenize") for r in box.access_log())  # asked of the box, not estimated
    status, doc = box.post("/llm/v1/tokenize", {"model": MODEL}, H)
    assert status == 400 and "messages" in doc["error"]["message"]


@pytest.mark.parametrize("path,body,headers", [
    ("/llm/v1/messages", {"model": MODEL, "max_tokens": 64, "thinking": {"type": "disabled"}, "temperature": 0.3,
                          "top_k": 5,
                          "tools": [{"name": "f", "input_schema": {"type": "object"}}],
                          "messages": [{"role": "user", "content": "hi"}]}, {"anthropic-version": "2023-06-01"}),
    ("/llm/v1/chat/completions", {"model": MODEL, "max_tokens": 32, "seed": 7, "top_p": 0.9, "reasoning_effort": "low",
                                  "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}, {}),
    ("/api/chat", {"model": MODEL, "stream": False, "think": False, "options": {"temperature": 0.1, "num_predict": 20},
                   "messages": [{"role": "user", "content": "hi"}]}, {}),
])
def test_the_boxs_server_is_asked_the_same_through_two_hops(front, stub, path, body, headers):
    """(Stop strings aside: the front matches them itself, as for any backend that does not say
    which one fired, so the box is asked for a stream without them; the answer is the same.)"""
    stub.reset()
    _same(path, body, headers)
    direct, hopped = (r["body"] for r in stub.requests()[-2:])
    assert hopped == direct


def test_a_stop_sequence_through_two_hops(front):
    body = {"model": MODEL, "max_tokens": 64, "stream": True, "stop_sequences": ["from"],
            "messages": [{"role": "user", "content": "[stub reasoning=0 content=10] hi"}]}
    (s1, direct), (s2, hopped) = _both("/llm/v1/messages", body, {**H, "anthropic-version": "2023-06-01"})
    assert s1 == s2 == 200
    # the same message; its text deltas may be cut elsewhere (the front holds back what could be
    # the start of a stop string, where the box's vLLM said which one fired)
    message, alone = (assemble(check_stream(r, model=MODEL)) for r in (hopped, direct))
    assert message["stop_reason"] == "stop_sequence" and message["stop_sequence"] == "from"
    assert message["content"] == alone["content"]
    # (usage is not compared: the front counts what reached it before its cut, docs/several-boxes.md)
