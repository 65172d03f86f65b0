"""Task 2.12: Anthropic SSE through a real gateway; the seed's Verify commands as tests, the
official SDK's stream accumulator as the oracle, and the strict grammar checker on every stream."""

from __future__ import annotations

import json
import time

import anthropic
import pytest

from conftest import QWEN
from support.anthropic_sse_grammar import check_stream
from rawhttp import post_and_vanish, post_raw, sse_events
from stubproc import wait_for


def _stream(gateway, prompt, model="reasoning", max_tokens=64, **extra):
    body = {"model": model, "max_tokens": max_tokens, "stream": True,
            "messages": [{"role": "user", "content": prompt}], **extra}
    status, hdrs, raw = post_raw(gateway.base + "/messages", body)
    return status, hdrs, raw


def _names(raw: bytes) -> list[str]:
    return [line[len(b"event: "):].decode() for line in raw.split(b"\n") if line.startswith(b"event:")]


@pytest.fixture
def client(gateway):
    return anthropic.Anthropic(base_url=gateway.llm, api_key="unused", max_retries=0)


# -- Verify 1 and 2 -----------------------------------------------------------------------------


def test_verify_event_sequence_reasoning_then_text(gateway, stubs):
    status, hdrs, raw = _stream(gateway, "hi")
    assert status == 200
    assert hdrs["content-type"].startswith("text/event-stream")
    names = _names(raw)
    assert names[0] == "message_start"
    assert names[-2:] == ["message_delta", "message_stop"]
    body = [n for n in names[1:-2] if n != "ping"]
    # thinking block, then text block
    i = body.index("content_block_stop")
    assert body[0] == "content_block_start" and set(body[1:i]) == {"content_block_delta"} and i > 1
    rest = body[i + 1:]
    assert rest[0] == "content_block_start" and rest[-1] == "content_block_stop"
    assert set(rest[1:-1]) == {"content_block_delta"} and len(rest) > 2
    check_stream(raw)


def test_verify_index0_stop_precedes_index1(gateway, stubs):
    _, _, raw = _stream(gateway, "hi")
    # grep -n -E 'content_block_stop|"index":1' | head -3
    lines = [ln for ln in raw.decode().split("\n") if "content_block_stop" in ln or '"index":1' in ln][:3]
    assert "content_block_stop" in lines[0] and '"index":1' not in lines[0]
    stop_data = [ln for ln in lines if ln.startswith("data:") and "content_block_stop" in ln][0]
    assert '"index":0' in stop_data
    assert lines.index(stop_data) < min(i for i, ln in enumerate(lines) if '"index":1' in ln)


def test_every_frame_has_event_and_data(gateway, stubs):
    _, _, raw = _stream(gateway, "hi")
    frames = [f for f in raw.split(b"\n\n") if f.strip()]
    for f in frames:
        lines = f.split(b"\n")
        assert any(x.startswith(b"event: ") for x in lines) and any(x.startswith(b"data: ") for x in lines), f
        name = [x for x in lines if x.startswith(b"event: ")][0][7:].decode()
        data = json.loads([x for x in lines if x.startswith(b"data: ")][0][6:])
        assert data["type"] == name
    assert b"[DONE]" not in raw


def test_message_start_envelope_and_usage(gateway, stubs):
    _, _, raw = _stream(gateway, "[stub reasoning=2 content=3]")
    events = sse_events(raw)
    name, start = events[0]
    assert name == "message_start"
    m = start["message"]
    assert m["model"] == "reasoning" and m["role"] == "assistant" and m["content"] == []
    assert m["usage"]["input_tokens"] > 0  # the real prompt size (vLLM continuous usage)
    deltas = [d for n, d in events if n == "message_delta"]
    assert len(deltas) == 1
    assert deltas[0]["delta"]["stop_reason"] == "end_turn"
    assert deltas[0]["usage"]["output_tokens"] == 5


def test_block_types_and_delta_types(gateway, stubs):
    _, _, raw = _stream(gateway, "[stub reasoning=3 content=3]")
    events = sse_events(raw)
    starts = [d for n, d in events if n == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "thinking"), (1, "text")]
    deltas = [(d["index"], d["delta"]["type"]) for n, d in events if n == "content_block_delta"]
    assert {t for i, t in deltas if i == 0} <= {"thinking_delta", "signature_delta"}
    assert {t for i, t in deltas if i == 1} == {"text_delta"}


def test_no_reasoning_text_is_index0(gateway, stubs):
    _, _, raw = _stream(gateway, "[stub content=3]", model=QWEN)
    events = sse_events(raw)
    starts = [d for n, d in events if n == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "text")]
    check_stream(raw)


def test_reasoning_only_closes_thinking_before_message_delta(gateway, stubs):
    _, _, raw = _stream(gateway, "[stub reasoning=4 content=0]")
    names = [n for n in _names(raw) if n != "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert names.count("content_block_start") == 1
    check_stream(raw)


def test_length_is_max_tokens_and_message_stop_once(gateway, stubs):
    _, _, raw = _stream(gateway, "[stub reasoning=1 content=50]", max_tokens=6)
    events = sse_events(raw)
    assert [d for n, d in events if n == "message_delta"][0]["delta"]["stop_reason"] == "max_tokens"
    assert _names(raw).count("message_stop") == 1 and _names(raw)[-1] == "message_stop"


def test_stop_sequence_streaming_vllm_and_ollama(gateway, stubs):
    for model in ("reasoning", QWEN):
        _, _, raw = _stream(gateway, "hi", model=model, stop_sequences=["demo"])
        events = sse_events(raw)
        delta = [d for n, d in events if n == "message_delta"][0]["delta"]
        assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "demo"}, model
        text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
        assert "demo" not in text
        check_stream(raw)


# -- the SDK as the oracle ------------------------------------------------------------------------


def test_sdk_stream_assembles_thinking_and_text(client, stubs):
    with client.messages.stream(model="reasoning", max_tokens=64,
                                messages=[{"role": "user", "content": "[stub reasoning=3 content=4]"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[1].text == text and len(text.split()) == 4
    assert final.content[0].signature
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 7


def test_sdk_stream_tool_use_with_parsed_input(client, stubs):
    tools = [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    for model in ("reasoning", QWEN):
        with client.messages.stream(model=model, max_tokens=128, tools=tools,
                                    messages=[{"role": "user", "content": '[stub tool=get_weather args={"city":"Oslo"}]'}]) as s:
            final = s.get_final_message()
        uses = [b for b in final.content if b.type == "tool_use"]
        assert final.stop_reason == "tool_use", model
        assert uses and uses[0].name == "get_weather" and uses[0].input == {"city": "Oslo"}


def test_content_and_tool_in_one_chunk(client, stubs):
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    with client.messages.stream(model="reasoning", max_tokens=128, tools=tools,
                                messages=[{"role": "user", "content": '[stub tool=f args={"a":1} split=1 content=3]'}]) as s:
        final = s.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"] == [{"a": 1}]


FIELDS = ["reasoning", "reasoning_content", "both"]


@pytest.fixture(scope="module")
def field_gateway():
    """One gateway in front of three vLLM stubs, one per name of the reasoning field (model `m-`
    and the name): one gateway start instead of three."""
    from contextlib import ExitStack

    from gwproc import Gateway, config_for
    from stubproc import start_stub

    with ExitStack() as stack:
        stubs = {f: stack.enter_context(start_stub("vllm", "--reasoning", "--reasoning-field", f, "--model", "m"))
                 for f in FIELDS}
        yield stack.enter_context(Gateway(config_for(
            {f: stub.base for f, stub in stubs.items()},
            {f"m-{f}": {"backend": f, "upstream_model": "m"} for f in FIELDS})))


@pytest.mark.parametrize("field", FIELDS)
def test_both_reasoning_field_names(field_gateway, field):
    c = anthropic.Anthropic(base_url=field_gateway.llm, api_key="x", max_retries=0)
    model = f"m-{field}"
    with c.messages.stream(model=model, max_tokens=64, messages=[{"role": "user", "content": "[stub reasoning=3 content=2]"}]) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert len(final.content[0].thinking.split()) == 3  # once, even when both names are sent
    plain = c.messages.create(model=model, max_tokens=64, messages=[{"role": "user", "content": "[stub reasoning=3 content=2]"}])
    assert plain.content[0].thinking == final.content[0].thinking


# -- unbuffered, failures, disconnects ------------------------------------------------------------


def test_first_delta_arrives_long_before_the_end(gateway, stubs):
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(gateway.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    body = json.dumps({"model": "reasoning", "max_tokens": 512, "stream": True,
                       "messages": [{"role": "user", "content": "[stub reasoning=0 content=60 delay_ms=50]"}]})
    t0 = time.monotonic()
    conn.request("POST", "/llm/v1/messages", body, {"content-type": "application/json"})
    resp = conn.getresponse()
    first = None
    while True:
        line = resp.fp.readline()
        if not line:
            break
        if first is None and b"text_delta" in line:
            first = time.monotonic() - t0
        if b"message_stop" in line:
            break
    total = time.monotonic() - t0
    conn.close()
    assert first is not None and total > 2.5
    assert first < total / 5  # streamed, not accumulated


def test_upstream_failure_midstream_is_an_error_frame(gateway, stubs):
    for directive in ("[stub content=20 fail_after=5]", "[stub content=20 error_after=5]"):
        _, _, raw = _stream(gateway, directive)
        names = _names(raw)
        assert names[0] == "message_start"
        assert names[-1] == "error" and "message_stop" not in names, directive
        err = sse_events(raw)[-1][1]
        assert err["type"] == "error" and err["error"]["type"] in ("api_error", "overloaded_error")
        check_stream(raw)
    wait_for(lambda: gateway.admin()["backends"]["gpu0"]["in_use"] == 0, 2)


def test_sdk_raises_on_midstream_failure(client, stubs):
    with pytest.raises(anthropic.APIError):
        with client.messages.stream(model="reasoning", max_tokens=64,
                                    messages=[{"role": "user", "content": "[stub content=20 fail_after=3]"}]) as s:
            for _ in s:
                pass


def test_failure_before_start_is_an_http_error(gateway, stubs):
    status, hdrs, raw = _stream(gateway, "[stub status=500]")
    assert status >= 500 and hdrs["content-type"].startswith("application/json")
    assert json.loads(raw)["type"] == "error"


def test_verify_disconnect_cancels_within_a_second(gateway, vllm_stub, stubs):
    before = vllm_stub.log_text().count("cancelled")
    post_and_vanish(gateway.base + "/messages", {"model": "reasoning", "max_tokens": 512, "stream": True,
                                                  "messages": [{"role": "user", "content": "[stub content=400 delay_ms=20]"}]}, after_s=1.0)
    wait_for(lambda: vllm_stub.log_text().count("cancelled") == before + 1, 1.0)
    wait_for(lambda: vllm_stub.stats()["in_flight"] == 0, 1.0)
    wait_for(lambda: gateway.admin()["backends"]["gpu0"]["in_use"] == 0, 1.0)


def test_ping_while_upstream_is_silent(vllm_stub):
    from conftest import standard_config
    from gwproc import Gateway

    cfg = standard_config(vllm_stub.base, vllm_stub.base, anthropic={"ping_interval_s": 0.2})
    with Gateway(cfg) as gw:
        _, _, raw = _stream(gw, "[stub reasoning=1 content=3 ttft_ms=1000]")
        names = _names(raw)
        assert names.count("ping") >= 2
        assert names[-1] == "message_stop"
        check_stream(raw)


def test_hidden_reasoning_streams_no_text_keeps_pinging_and_comes_back_as_reasoning(vllm_stub):
    """thinking.display "omitted": the thinking block carries no text on the wire, the client
    still hears a `ping` while the upstream reasons, and the block sent back in history restores
    the reasoning upstream (judged at the stub)."""
    from conftest import standard_config
    from gwproc import Gateway

    cfg = standard_config(vllm_stub.base, vllm_stub.base, anthropic={"ping_interval_s": 0.2})
    with Gateway(cfg) as gw:
        vllm_stub.reset()
        thinking = {"type": "adaptive", "display": "omitted"}
        status, _, raw = _stream(gw, "[stub reasoning=20 content=2 delay_ms=40]", thinking=thinking)
        assert status == 200
        events = check_stream(raw)
        names = _names(raw)
        opened = names.index("content_block_start")
        signed = next(i for i, e in enumerate(events) if e.get("delta", {}).get("type") == "signature_delta")
        assert "ping" in names[opened:signed]  # ~0.8 s of hidden reasoning, pinged every 0.2 s
        assert not any(e.get("delta", {}).get("type") == "thinking_delta" for e in events)
        assert b"Let me think" not in raw
        block = {"type": "thinking", "thinking": "", "signature": events[signed]["delta"]["signature"]}
        text = "".join(e["delta"]["text"] for e in events if e.get("delta", {}).get("type") == "text_delta")
        status, _, raw = post_raw(gw.base + "/messages", {
            "model": "reasoning", "max_tokens": 16, "thinking": thinking,
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": [block, {"type": "text", "text": text}]},
                         {"role": "user", "content": "and?"}]})
        assert status == 200, raw
        upstream = vllm_stub.requests()[-1]["body"]["messages"]
        assert upstream[1]["role"] == "assistant"
        from homelab_frontend.stub.script import REASONING_TEXT, cycle_words

        assert upstream[1]["reasoning"] == "".join(cycle_words(REASONING_TEXT, 20))  # what the stub reasoned
