"""The gateway in front of the llama.cpp-flavoured stub (fast; tests/real/ runs the real server):
kind detection, plain answers streamed upstream (and cancelled with the client), usage after a
gateway-side stop, count_tokens through /apply-template + /tokenize, the context error, the
leak check, and connections the upstream closes right after a stream."""

from __future__ import annotations

import re

import anthropic
import openai
import pytest

from gwproc import Gateway, config_for
from rawhttp import post_and_vanish, post_raw
from stubproc import start_stub, wait_for

MODEL = "gemma"


@pytest.fixture(scope="module")
def llama_stub():
    with start_stub("llamacpp", "--max-model-len", "200") as s:
        yield s


@pytest.fixture(scope="module")
def gw(llama_stub):
    # no `kind`: detected from the stub's /v1/models
    cfg = config_for({"llama": {"url": llama_stub.base, "slots": 2, "health_interval_s": 0.5}},
                     {MODEL: {"backend": "llama", "upstream_model": "gemma-3-270m"}})
    with Gateway(cfg) as g:
        wait_for(lambda: "detected llamacpp" in g.stderr(), 5)
        yield g


def test_plain_answers_are_streamed_upstream_and_assembled(gw, llama_stub):
    llama_stub.reset()
    oai = openai.OpenAI(base_url=gw.base, api_key="x", max_retries=0)
    r = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi [stub content=3]"}])
    assert r.model == MODEL and r.choices[0].message.content == "Hello from the "
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 3
    ant = anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
    m = ant.messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "hi [stub content=3]"}])
    assert m.content[0].text == "Hello from the " and m.usage.output_tokens == 3
    r = oai.responses.create(model=MODEL, input="hi [stub content=3]", store=False)
    assert r.output_text == "Hello from the " and r.status == "completed" and r.usage.output_tokens == 3
    assert [req["body"].get("stream") for req in llama_stub.requests()[-3:]] == [True, True, True]


PROMPT = "[stub content=400 delay_ms=20]"
PLAIN = {"/chat/completions": {"max_tokens": 500, "messages": [{"role": "user", "content": PROMPT}]},
         "/messages": {"max_tokens": 500, "messages": [{"role": "user", "content": PROMPT}]},
         "/responses": {"max_output_tokens": 500, "store": False, "input": PROMPT}}


@pytest.mark.parametrize("path", list(PLAIN))
def test_a_plain_request_whose_client_leaves_is_cancelled_upstream(gw, llama_stub, path):
    llama_stub.reset()
    before = llama_stub.log_text().count("cancelled")
    completed = llama_stub.log_text().count("completed")
    post_and_vanish(gw.base + path, {"model": MODEL, **PLAIN[path]}, after_s=0.4)
    # the upstream's own word: its generation (400 tokens at 20 ms, 8 s) was cut short, not
    # read to its end; how soon is load, not behaviour (a busy machine took over a second)
    wait_for(lambda: llama_stub.log_text().count("cancelled") == before + 1, 30)
    cut = re.findall(r"cancelled id=\S+ after (\d+) tokens", llama_stub.log_text())[-1]
    assert int(cut) < 400 and llama_stub.log_text().count("completed") == completed
    wait_for(lambda: llama_stub.stats()["in_flight"] == 0, 10)


def test_stop_sequence_matched_by_the_gateway_has_integer_usage(gw):
    ant = anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "hi [stub content=12]"}]
    m = ant.messages.create(model=MODEL, max_tokens=50, messages=msgs, stop_sequences=["demo"])
    assert (m.stop_reason, m.stop_sequence, m.content[0].text) == ("stop_sequence", "demo", "Hello from the homelab ")
    assert isinstance(m.usage.input_tokens, int) and m.usage.output_tokens >= 4
    with ant.messages.stream(model=MODEL, max_tokens=50, messages=msgs, stop_sequences=["demo"]) as s:
        f = s.get_final_message()
    assert f.stop_sequence == "demo" and f.usage.output_tokens >= 4


def test_after_a_gateway_side_stop_input_tokens_are_the_tokenizers_count(gw):
    # the upstream never reports usage for a generation the gateway stopped: the prompt is
    # counted by llama.cpp's own tokenizer (/apply-template + /tokenize), not estimated
    ant = anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "hi there, a prompt of some words [stub content=12]"}]
    counted = ant.messages.count_tokens(model=MODEL, messages=msgs).input_tokens
    m = ant.messages.create(model=MODEL, max_tokens=50, messages=msgs, stop_sequences=["demo"])
    assert m.stop_sequence == "demo" and m.usage.input_tokens == counted
    seen = len(gw.access_log())
    with ant.messages.stream(model=MODEL, max_tokens=50, messages=msgs, stop_sequences=["demo"]) as s:
        f = s.get_final_message()
    assert f.stop_sequence == "demo" and f.usage.input_tokens == counted
    line = wait_for(lambda: [x for x in gw.access_log()[seen:] if x["stream"]], 5)[0]
    assert line["tokens_in"] == counted


def test_message_start_carries_the_counted_prompt_when_it_arrives_before_the_first_token(gw):
    # llama.cpp reports usage only at the end; the count runs beside the upstream call, and its
    # figure is in message_start when the first token comes later than the count
    ant = anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "a few words to count, more than four bytes each [stub content=3 ttft_ms=300]"}]
    counted = ant.messages.count_tokens(model=MODEL, messages=msgs).input_tokens
    raw = len(str(msgs))  # the four-bytes-a-token estimate would be about this over 4
    assert counted != raw // 4
    with ant.messages.stream(model=MODEL, max_tokens=20, messages=msgs) as s:
        start = next(ev for ev in s if ev.type == "message_start")
        final = s.get_final_message()
    assert start.message.usage.input_tokens == counted == final.usage.input_tokens


def test_count_tokens_is_the_upstreams_prompt_count(gw):
    ant = anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
    msgs = [{"role": "user", "content": "one two three four [stub content=1]"}]
    counted = ant.messages.count_tokens(model=MODEL, messages=msgs, system="be brief").input_tokens
    m = ant.messages.create(model=MODEL, max_tokens=5, messages=msgs, system="be brief")
    assert counted == m.usage.input_tokens


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_over_the_context_is_a_400(gw, stream):
    huge = [{"role": "user", "content": "word " * 300}]
    status, _, body = post_raw(gw.llm + "/v1/messages", {"model": MODEL, "max_tokens": 5, "stream": stream,
                                                         "messages": huge})
    assert status == 400 and b"invalid_request_error" in body and b"context of 200 tokens" in body
    status, _, body = post_raw(gw.base + "/chat/completions", {"model": MODEL, "max_tokens": 5, "stream": stream,
                                                                "messages": huge})
    assert status == 400 and b"invalid_request_error" in body


def test_context_length_from_meta_n_ctx(gw):
    status, doc = gw.get("/llm/v1/models")
    assert status == 200 and doc["data"][0]["max_model_len"] == 200


def test_leak_check_reads_requests_processing(gw, llama_stub):
    import socket

    from rawhttp import _request_bytes

    # a long stream, held open (and not read) until the check is done, then abandoned
    addr, req = _request_bytes(gw.base + "/chat/completions", {
        "model": MODEL, "stream": True, "messages": [{"role": "user", "content": "[stub content=1000 delay_ms=20]"}]})
    sock = socket.create_connection(addr, timeout=10)
    try:
        sock.sendall(req)
        # the upstream's own evidence that the stream runs there; then /admin/requests reads
        # the backend's count on demand, so the figure is today's, whatever the probe interval
        wait_for(lambda: llama_stub.stats()["in_flight"] == 1, 30)
        llama = gw.admin()["backends"]["llama"]
        assert (llama["upstream_running"], llama["slot_mismatch"]) == (1, 0)
        assert llama["upstream_running_age_s"] is not None and llama["upstream_running_age_s"] >= 0
    finally:
        sock.close()
    wait_for(lambda: llama_stub.stats()["in_flight"] == 0, 10)


def test_requests_right_after_streams_never_meet_a_closed_connection(gw):
    statuses = []
    for _ in range(40):
        post_raw(gw.base + "/chat/completions", {"model": MODEL, "stream": True,
                                                 "messages": [{"role": "user", "content": "[stub content=2]"}]})
        statuses.append(post_raw(gw.base + "/chat/completions", {
            "model": MODEL, "messages": [{"role": "user", "content": "[stub content=2]"}]})[0])
    assert statuses == [200] * 40


def test_running_count_is_reread_while_a_slot_is_held(llama_stub):
    """With a probe only once a minute, the backend's running count (here through /metrics,
    which does not read it on demand) still follows a stream the gateway holds a slot for."""
    import socket
    import urllib.request

    from rawhttp import _request_bytes

    def gauge() -> float | None:
        with urllib.request.urlopen(g.url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith('hlf_backend_upstream_running_requests{backend="llama"}'):
                    return float(line.rsplit(" ", 1)[1])
        return None

    cfg = config_for({"llama": {"url": llama_stub.base, "kind": "llamacpp", "slots": 2, "health_interval_s": 60}},
                     {MODEL: {"backend": "llama", "upstream_model": "gemma-3-270m"}})
    with Gateway(cfg) as g:
        wait_for(lambda: gauge() == 0, 30)  # the first probe
        addr, req = _request_bytes(g.base + "/chat/completions", {
            "model": MODEL, "stream": True, "messages": [{"role": "user", "content": "[stub content=2000 delay_ms=20]"}]})
        sock = socket.create_connection(addr, timeout=10)
        try:
            sock.sendall(req)
            wait_for(lambda: llama_stub.stats()["in_flight"] == 1, 30)
            wait_for(lambda: gauge() == 1, 30)  # long before the next probe, a minute on
        finally:
            sock.close()
    wait_for(lambda: llama_stub.stats()["in_flight"] == 0, 5)
