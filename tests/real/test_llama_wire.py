"""The gateway in front of llama.cpp's real llama-server, driven by the real SDKs: both dialects
plain and streaming, model echo, stop sequences, max_tokens, count_tokens, context errors,
slots, and what llama.cpp itself reports about them.

Gemma 3 270M (the base model) at temperature 0 answers "Count from 1 to 10." with
"1.0.0.0.0...", which makes stop sequences and lengths deterministic."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
import uuid

import anthropic
import openai
import pytest

from llamaproc import MODEL
from rawhttp import post_raw, sse_data, sse_events
from stubproc import wait_for

COUNT = [{"role": "user", "content": "Count from 1 to 10."}]
LONG = [{"role": "user", "content": "Write a very long story about a dragon."}]
T0 = {"temperature": 0}  # this anthropic SDK has no temperature argument

pytestmark = pytest.mark.timeout(300)


def _prompt(usage) -> int:
    """The whole prompt: Anthropic's input_tokens is its uncached part, and llama.cpp serves the
    rest of a repeated prompt from its cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


@pytest.fixture
def oai(llama_gw, idle_llama):
    return openai.OpenAI(base_url=llama_gw.base, api_key="x", max_retries=0)


@pytest.fixture
def ant(llama_gw, idle_llama):
    return anthropic.Anthropic(base_url=llama_gw.llm, api_key="x", max_retries=0)


# -- both dialects, plain and streaming -------------------------------------------------------


def test_openai_plain_echoes_the_model_and_reports_usage(oai):
    r = oai.chat.completions.create(model=MODEL, messages=COUNT, max_tokens=12, temperature=0)
    assert r.model == MODEL
    assert r.choices[0].message.content.startswith("1.0.0")
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens > 5


def test_openai_stream_echoes_the_model_and_ends_with_done(llama_gw, idle_llama):
    status, _, body = post_raw(llama_gw.base + "/chat/completions", {
        "model": MODEL, "messages": COUNT, "max_tokens": 12, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}})
    assert status == 200
    data = sse_data(body)
    assert data[-1] == b"[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["model"] for c in chunks} == {MODEL}
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c["choices"])
    assert text.startswith("1.0.0")
    assert chunks[-1]["usage"]["completion_tokens"] == 12


def test_openai_stream_through_the_sdk(oai):
    stream = oai.chat.completions.create(model=MODEL, messages=COUNT, max_tokens=12, temperature=0,
                                         stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.model == MODEL for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("1.0.0")
    assert chunks[-1].usage.completion_tokens == 12


def test_anthropic_plain(ant):
    m = ant.messages.create(model=MODEL, max_tokens=12, messages=COUNT, extra_body=T0)
    assert m.model == MODEL
    assert m.content[0].text.startswith("1.0.0")
    assert m.stop_reason == "max_tokens"
    assert m.usage.output_tokens == 12 and _prompt(m.usage) > 5


def test_anthropic_stream(ant):
    with ant.messages.stream(model=MODEL, max_tokens=12, messages=COUNT, extra_body=T0) as s:
        m = s.get_final_message()
    assert m.model == MODEL
    assert m.content[0].text.startswith("1.0.0")
    assert m.stop_reason == "max_tokens"
    assert m.usage.output_tokens == 12 and _prompt(m.usage) > 5


# -- stop sequences and max_tokens ----------------------------------------------------------------


def test_anthropic_stop_sequence_plain_has_the_string_and_integer_usage(ant):
    m = ant.messages.create(model=MODEL, max_tokens=200, messages=COUNT, extra_body=T0, stop_sequences=["0.0.0"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "0.0.0"
    assert m.content[0].text == "1."
    assert isinstance(m.usage.input_tokens, int) and _prompt(m.usage) > 5
    assert isinstance(m.usage.output_tokens, int) and m.usage.output_tokens >= 1
    # the gateway stopped the generation before llama.cpp reported usage: the prompt is still
    # llama.cpp's own count (its tokenizer), the figure count_tokens gives, not an estimate
    counted = ant.messages.count_tokens(model=MODEL, messages=COUNT).input_tokens
    assert _prompt(m.usage) == counted


def test_anthropic_stop_sequence_stream_counts_output_tokens(ant):
    with ant.messages.stream(model=MODEL, max_tokens=200, messages=COUNT, extra_body=T0,
                             stop_sequences=["0.0.0"]) as s:
        m = s.get_final_message()
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "0.0.0"
    assert m.content[0].text == "1."
    assert m.usage.output_tokens >= 1
    assert _prompt(m.usage) == ant.messages.count_tokens(model=MODEL, messages=COUNT).input_tokens


def test_anthropic_message_start_has_llama_cpps_prompt_count(ant):
    # counted beside the generation: back long before the first token of a real prefill. A prompt
    # of its own, so the prefill is real: COUNT, asked by the tests before, came 13 of its 18 tokens
    # from llama.cpp's cache, and once in a full run its first token beat the count (message_start
    # then says the estimate, as designed, and message_delta the real figure)
    fresh = [{"role": "user", "content": f"Count from 1 to 10, slowly, for run {uuid.uuid4().hex}."}]
    with ant.messages.stream(model=MODEL, max_tokens=5, messages=fresh, extra_body=T0) as s:
        start = next(ev for ev in s if ev.type == "message_start")
        m = s.get_final_message()
    assert start.message.usage.input_tokens == _prompt(m.usage)


def test_openai_stop_is_applied_by_llama_cpp(oai):
    r = oai.chat.completions.create(model=MODEL, messages=COUNT, max_tokens=200, temperature=0, stop=["0.0.0"])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == "1."
    assert isinstance(r.usage.completion_tokens, int)


def test_max_tokens_is_honoured_exactly(ant, oai):
    for n in (1, 7):
        m = ant.messages.create(model=MODEL, max_tokens=n, messages=LONG, extra_body=T0)
        assert (m.stop_reason, m.usage.output_tokens) == ("max_tokens", n)
        r = oai.chat.completions.create(model=MODEL, messages=LONG, max_tokens=n, temperature=0)
        assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", n)


# -- count_tokens --------------------------------------------------------------------------------


def test_count_tokens_is_llama_cpps_own_prompt_count(ant):
    for messages, system in ((COUNT, None), (LONG, "You are a storyteller.")):
        extra = {"system": system} if system else {}
        counted = ant.messages.count_tokens(model=MODEL, messages=messages, **extra).input_tokens
        m = ant.messages.create(model=MODEL, max_tokens=1, messages=messages, extra_body=T0, **extra)
        # input_tokens is the uncached part; llama.cpp reports what it took from its prompt cache
        assert counted == _prompt(m.usage)


# -- context errors -------------------------------------------------------------------------------

HUGE = [{"role": "user", "content": "hello " * 1500}]  # ~1500 tokens: more than a slot's 1024


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_is_a_400_in_each_dialect(llama_gw, idle_llama, stream):
    status, _, body = post_raw(llama_gw.llm + "/v1/messages", {
        "model": MODEL, "max_tokens": 50, "stream": stream, "messages": HUGE})
    doc = json.loads(body)
    assert status == 400, doc
    assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
    assert "context of 1024 tokens" in doc["error"]["message"]
    status, _, body = post_raw(llama_gw.base + "/chat/completions", {
        "model": MODEL, "max_tokens": 50, "stream": stream, "messages": HUGE})
    doc = json.loads(body)
    assert status == 400, doc
    assert doc["error"]["type"] == "invalid_request_error"
    assert "1024" in doc["error"]["message"]


def test_the_sdk_sees_a_bad_request_not_a_server_error(ant, oai):
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.create(model=MODEL, max_tokens=50, messages=HUGE, extra_body=T0)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=MODEL, max_tokens=50, messages=HUGE)


# -- slots ----------------------------------------------------------------------------------------


def test_six_streams_on_two_slots_never_run_more_than_two_upstream(llama_gw, idle_llama):
    llama = idle_llama
    results: list[tuple[int, bytes]] = []

    def one(i: int) -> None:
        path, body = (("/chat/completions", {"model": MODEL, "messages": LONG, "max_tokens": 40,
                                              "temperature": 0, "stream": True})
                      if i % 2 else
                      ("/messages", {"model": MODEL, "messages": LONG, "max_tokens": 40, "stream": True}))
        status, _, raw = post_raw(llama_gw.base + path, body, timeout=120)
        results.append((status, raw))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    most = 0
    while any(t.is_alive() for t in threads):
        most = max(most, llama.processing())
        assert llama.metrics().get("llamacpp:requests_deferred", 0) == 0
        time.sleep(0.02)
    for t in threads:
        t.join()
    assert most == 2, f"llama.cpp ran at most {most} at once"
    assert [s for s, _ in results] == [200] * 6
    for _, raw in results:
        assert b"[DONE]" in raw or b"message_stop" in raw


def test_admin_shows_llama_cpps_own_running_count(llama_gw, idle_llama):
    """upstream_running comes from llama.cpp's llamacpp:requests_processing: 1 during a stream."""
    body = json.dumps({"model": MODEL, "messages": LONG, "max_tokens": 400, "stream": True}).encode()
    req = urllib.request.Request(llama_gw.base + "/chat/completions", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.readline()
        seen = wait_for(lambda: llama_gw.admin()["backends"]["llama"]["upstream_running"] == 1, timeout=30)
        assert seen
        assert llama_gw.admin()["backends"]["llama"]["slot_mismatch"] == 0
    wait_for(lambda: llama_gw.admin()["backends"]["llama"]["upstream_running"] == 0, timeout=30)


def test_plain_requests_right_after_streams_never_meet_a_stale_connection(llama_gw, idle_llama):
    """llama.cpp closes some keep-alive connections right after an answer; a request that the
    gateway sent on such a connection is resent once on a fresh one, never a 502."""
    statuses = []
    for i in range(30):
        post_raw(llama_gw.base + "/chat/completions", {"model": MODEL, "messages": COUNT, "max_tokens": 3,
                                                       "stream": True})
        status, _, body = post_raw(llama_gw.base + "/chat/completions", {"model": MODEL, "messages": COUNT,
                                                                         "max_tokens": 3})
        statuses.append(status)
    assert statuses == [200] * 30


# -- sse shapes ------------------------------------------------------------------------------------


def test_anthropic_stream_grammar_on_the_wire(llama_gw, idle_llama):
    status, _, body = post_raw(llama_gw.llm + "/v1/messages", {
        "model": MODEL, "max_tokens": 5, "stream": True, "messages": COUNT})
    names = [n for n, _ in sse_events(body)]
    assert status == 200
    assert names[0] == "message_start" and names[-1] == "message_stop"
    delta = [d for n, d in sse_events(body) if n == "message_delta"][0]
    assert delta["usage"]["output_tokens"] == 5


def test_consecutive_user_items_render_with_gemmas_template(oai):
    """Codex's shape: its <environment_context> and the prompt as two user items in a row. Gemma
    3's chat template raises on two user messages in a row ("roles must alternate"): the gateway
    joins them (system_turns: merge), so llama.cpp renders the conversation and answers."""
    r = oai.responses.create(model=MODEL, store=False, max_output_tokens=8, temperature=0, input=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "<environment_context>cwd: /work</environment_context>"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count from 1 to 10."}]},
    ])
    assert r.status in ("completed", "incomplete") and r.output_text
    c = oai.chat.completions.create(model=MODEL, max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": "Hello."}, {"role": "user", "content": "Count from 1 to 10."}])
    assert c.choices[0].message.content
