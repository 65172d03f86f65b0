"""Wire fidelity at the edges: odd answers and odd requests through a real gateway, read by the
official `anthropic` and `openai` SDKs and as raw bytes.

Two kinds of upstream: the session's vLLM-like and Ollama-like stub processes (directives in the
prompt), and a scripted upstream on a real socket for answer shapes the stubs never produce (two
or parallel tool calls, cached-token usage, tool ids that are not valid Anthropic ids). Every
Anthropic stream is also run through the strict grammar checker.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import threading

import anthropic
import openai
import pytest
from aiohttp import web

from conftest import QWEN, standard_config
from gwproc import Gateway, config_for
from support.anthropic_sse_grammar import check_stream
from rawhttp import post_raw, sse_events
from stubproc import free_port

_TOOL_ID = re.compile(r"[A-Za-z0-9_-]{1,128}").fullmatch


@pytest.fixture
def client(gateway):
    return anthropic.Anthropic(base_url=gateway.llm, api_key="unused", max_retries=0)


def _user(text):
    return [{"role": "user", "content": text}]


def _stream_raw(gw, body):
    status, hdrs, raw = post_raw(gw.base + "/messages", {**body, "stream": True})
    assert status == 200, raw
    check_stream(raw)
    return sse_events(raw)


def _blocks(msg):
    return [(b.type, getattr(b, "text", None) or getattr(b, "thinking", None) or getattr(b, "input", None))
            for b in msg.content]


# -- a scripted upstream, for answer shapes the stubs do not produce -------------------------------


class Scripted:
    """An OpenAI-shaped upstream on a real socket: each chat request takes the next queued answer,
    ("json", body) or ("sse", [payload, ...]) with payloads as dicts or raw strings."""

    def __init__(self) -> None:
        self.answers: list[tuple[str, object]] = []
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}/v1"
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(5)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app)
        self.loop.run_until_complete(self._runner.setup())
        self.loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self.loop.run_forever()

    async def _models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "up", "object": "model"}]})

    async def _chat(self, request):
        await request.read()
        kind, answer = self.answers.pop(0)
        if kind == "json":
            return web.json_response(answer)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for p in answer:
                data = p if isinstance(p, str) else json.dumps(p)
                await resp.write(b"data: " + data.encode() + b"\n\n")
            await resp.write_eof()
        except ConnectionError:
            pass  # the gateway hung up after [DONE]
        return resp

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@pytest.fixture(scope="module")
def scripted():
    up = Scripted()
    try:
        with Gateway(config_for({"b": {"url": up.base, "kind": "vllm"}}, {"m": {"backend": "b"}})) as gw:
            yield up, gw, anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
    finally:
        up.close()


def _chunk(delta=None, finish=None, usage=None, choices=True):
    c = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "up"}
    c["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    if usage is not None:
        c["usage"] = usage
    return c


def _call(index, id=None, name=None, args=None):
    d: dict = {"index": index, "function": {}}
    if id:
        d["id"], d["type"] = id, "function"
    if name:
        d["function"]["name"] = name
    if args is not None:
        d["function"]["arguments"] = args
    return d


def _completion(message, finish, usage):
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "up",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}


USAGE = {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37}
TOOLS = [{"name": "f", "input_schema": {"type": "object"}}, {"name": "g", "input_schema": {"type": "object"}}]


def _both_ways(up, client, stream_script, completion, **kw):
    """The same answer, once streamed and once whole: (final stream message, non-stream message)."""
    kw = {"model": "m", "max_tokens": 50, "messages": _user("hi"), **kw}
    up.answers.append(("sse", stream_script))
    with client.messages.stream(**kw) as s:
        streamed = s.get_final_message()
    up.answers.append(("json", completion))
    return streamed, client.messages.create(**kw)


# -- answer shapes --------------------------------------------------------------------------------


def test_reasoning_only_and_empty_answers(client, stubs):
    msg = client.messages.create(model="reasoning", max_tokens=50, messages=_user("[stub reasoning=3 content=0]"))
    assert [b.type for b in msg.content] == ["thinking"] and msg.content[0].signature
    with client.messages.stream(model="reasoning", max_tokens=50, messages=_user("[stub reasoning=3 content=0]")) as s:
        final = s.get_final_message()
    assert final.content[0].thinking == msg.content[0].thinking
    assert final.content[0].signature == msg.content[0].signature  # the same HMAC both ways
    for model in ("reasoning", QWEN):
        empty = client.messages.create(model=model, max_tokens=50, messages=_user("[stub reasoning=0 content=0]"))
        assert [(b.type, b.text) for b in empty.content] == [("text", "")]
        assert empty.stop_reason == "end_turn" and empty.stop_sequence is None


def test_max_tokens_inside_reasoning(client, gateway, stubs):
    body = {"model": "reasoning", "max_tokens": 3, "messages": _user("[stub reasoning=10 content=5]")}
    msg = client.messages.create(**body)
    assert [b.type for b in msg.content] == ["thinking"] and msg.stop_reason == "max_tokens"
    events = _stream_raw(gateway, body)
    names = [e for e, _ in events]
    # the thinking block is signed and closed before message_delta
    assert names[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert events[-4][1]["delta"]["type"] == "signature_delta"
    assert events[-2][1]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[-2][1]["usage"]["output_tokens"] == 3


@pytest.mark.parametrize("model", ["reasoning", QWEN])
def test_tool_call_with_empty_arguments(client, gateway, stubs, model):
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    body = {"model": model, "max_tokens": 50, "tools": tools, "messages": _user("[stub tool=f args={} content=0]")}
    msg = client.messages.create(**body)
    assert msg.stop_reason == "tool_use"
    [tool] = [b for b in msg.content if b.type == "tool_use"]
    assert tool.input == {} and _TOOL_ID(tool.id)
    events = _stream_raw(gateway, body)
    start = next(d for e, d in events if e == "content_block_start" and d["content_block"]["type"] == "tool_use")
    assert start["content_block"]["input"] == {}
    # every block has at least one delta: an empty input_json_delta for a call without arguments
    deltas = [d["delta"] for e, d in events if e == "content_block_delta" and d["index"] == start["index"]]
    assert deltas and all(x["type"] == "input_json_delta" for x in deltas)


def test_two_tool_calls_one_after_the_other(scripted):
    up, _, client = scripted
    script = [_chunk({"role": "assistant", "content": ""}),
              _chunk({"tool_calls": [_call(0, "call_a", "f", '{"x":')]}),
              _chunk({"tool_calls": [_call(0, args="1}")]}),
              _chunk({"tool_calls": [_call(1, "call_b", "g", "")]}),
              _chunk({"tool_calls": [_call(1, args='{"y":2}')]}),
              _chunk({}, "tool_calls"), _chunk(choices=False, usage=USAGE), "[DONE]"]
    whole = _completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
        {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": '{"y":2}'}}]}, "tool_calls", USAGE)
    streamed, plain = _both_ways(up, client, script, whole, tools=TOOLS)
    for msg in (streamed, plain):
        assert [(b.type, b.id, b.name, b.input) for b in msg.content] == [
            ("tool_use", "call_a", "f", {"x": 1}), ("tool_use", "call_b", "g", {"y": 2})]
        assert msg.stop_reason == "tool_use"
        assert (msg.usage.input_tokens, msg.usage.output_tokens) == (30, 7)


def test_parallel_tool_calls_in_one_chunk(scripted):
    up, _, client = scripted
    script = [_chunk({"role": "assistant", "content": None, "tool_calls": [
                  _call(0, "call_a", "f", '{"x":1}'), _call(1, "call_b", "g", "{}")]}),
              _chunk({}, "tool_calls"), _chunk(choices=False, usage=USAGE), "[DONE]"]
    whole = _completion({"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}},
        {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}, "tool_calls", USAGE)
    streamed, plain = _both_ways(up, client, script, whole, tools=TOOLS)
    for msg in (streamed, plain):
        assert [(b.type, b.name, b.input) for b in msg.content] == [("tool_use", "f", {"x": 1}), ("tool_use", "g", {})]
        assert msg.stop_reason == "tool_use"


def test_tool_use_ids_are_valid_anthropic_ids_both_ways(scripted):
    """Upstream ids such as Kimi-K2's `functions.get_weather:0` are not valid Anthropic ids
    (`^[a-zA-Z0-9_-]+$`; Anthropic's API refuses the history that carries them): the stream
    replaced them, the whole-message path passed them through."""
    up, _, client = scripted
    script = [_chunk({"tool_calls": [_call(0, "functions.f:0", "f", "{}")]}), _chunk({}, "tool_calls"), "[DONE]"]
    whole = _completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": "functions.f:0", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "call_ok-1", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}, "tool_calls", USAGE)
    streamed, plain = _both_ways(up, client, script, whole, tools=TOOLS)
    ids = [b.id for b in streamed.content + plain.content if b.type == "tool_use"]
    assert len(ids) == 3 and all(_TOOL_ID(i) for i in ids), ids
    assert ids[-1] == "call_ok-1"  # a valid upstream id is kept (it goes back upstream as tool_call_id)


def test_no_cache_fields_invented(scripted):
    up, _, client = scripted
    script = [_chunk({"content": "hi"}), _chunk({}, "stop"), _chunk(choices=False, usage=USAGE), "[DONE]"]
    whole = _completion({"role": "assistant", "content": "hi"}, "stop", USAGE)
    streamed, plain = _both_ways(up, client, script, whole)
    for msg in (streamed, plain):
        assert (msg.usage.input_tokens, msg.usage.output_tokens) == (30, 7)
        assert msg.usage.cache_read_input_tokens is None and msg.usage.cache_creation_input_tokens is None


# -- stop sequences -------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["reasoning", QWEN])
def test_stop_sequence_spanning_chunks(client, stubs, model):
    # "demo backend" spans two streamed tokens ("demo ", "backend. "); on the Ollama flavour the
    # gateway itself finds it (Ollama does not say which stop string fired)
    kw = {"model": model, "max_tokens": 50, "stop_sequences": ["xyz", "demo backend"], "messages": _user("hi")}
    msg = client.messages.create(**kw)
    with client.messages.stream(**kw) as s:
        final = s.get_final_message()
    for m in (msg, final):
        assert m.stop_reason == "stop_sequence" and m.stop_sequence == "demo backend"
        assert m.content[-1].text == "Hello from the homelab "
    ollama = stubs[1]
    if model == QWEN:
        assert "stop" not in ollama.requests()[-1]["body"]


def test_stop_sequence_prefix_at_the_end_is_released(client, stubs):
    # the answer ends inside a possible match: the held tail is text, not a stop
    kw = {"model": QWEN, "max_tokens": 50, "stop_sequences": ["generated by a stub"], "messages": _user("hi")}
    with client.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert final.stop_reason == "end_turn" and final.stop_sequence is None
    assert final.content[0].text.endswith("is generated by a ")


# -- requests -------------------------------------------------------------------------------------


def test_sampling_parameters_pass_through_exactly(gateway, stubs):
    vllm, ollama = stubs
    for model, stub in (("reasoning", vllm), (QWEN, ollama)):
        status, _, raw = post_raw(gateway.base + "/messages", {
            "model": model, "max_tokens": 20, "temperature": 0, "top_k": 5, "stop_sequences": [],
            "messages": _user("[stub content=2]")})
        assert status == 200, raw
        sent = stub.requests()[-1]["body"]
        assert sent["temperature"] == 0 and sent["top_k"] == 5
        assert "stop" not in sent and "stop_sequences" not in sent and "top_p" not in sent


def test_images_in_user_content_and_tool_results(client, stubs):
    vllm, _ = stubs
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 60).decode()
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "look"}, img,
                                     {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_01", "name": "shot", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01", "content": [{"type": "text", "text": "here"}, img]},
            {"type": "text", "text": "and? [stub content=2]"}]},
    ]
    msg = client.messages.create(model="reasoning", max_tokens=20, messages=messages,
                                 tools=[{"name": "shot", "input_schema": {"type": "object"}}])
    assert msg.stop_reason == "end_turn"
    sent = vllm.requests()[-1]["body"]["messages"]
    assert sent[0]["content"][1] == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    assert sent[0]["content"][2] == {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    assert sent[1]["tool_calls"][0]["id"] == "toolu_01"
    assert sent[2] == {"role": "tool", "tool_call_id": "toolu_01", "content": "here\n[image]"}


def test_a_large_image_does_not_shrink_max_tokens(client, stubs):
    """The context clamp estimates the prompt from the upstream body's size; base64 image data is
    not prompt text (a vision model spends a few hundred tokens on an image). Counted as text, an
    80 kB image clamped max_tokens to 1 against a 4096-token context: a one-token answer."""
    vllm, _ = stubs
    data = base64.b64encode(os.urandom(60_000)).decode()
    msg = client.messages.create(model="reasoning", max_tokens=500, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        {"type": "text", "text": "describe [stub reasoning=1 content=5]"}]}])
    assert vllm.requests()[-1]["body"]["max_tokens"] == 500
    assert msg.stop_reason == "end_turn" and msg.usage.output_tokens == 6


def test_unicode_both_ways_and_lone_surrogates_refused(client, gateway, stubs):
    vllm, _ = stubs
    text = "emoji 😀👩‍👩‍👧 CJK 漢字かな 한국어"
    msg = client.messages.create(model="reasoning", max_tokens=50, system="系统 😀",
                                 messages=_user(text + " [stub reasoning=0 content=3 text=😀漢]"))
    assert msg.content[0].text == "😀漢 😀漢 😀漢 "
    sent = vllm.requests()[-1]["body"]["messages"]
    assert sent[0]["content"] == "系统 😀" and sent[1]["content"].startswith(text)
    events = _stream_raw(gateway, {"model": QWEN, "max_tokens": 50, "messages": _user("[stub content=2 text=漢😀]")})
    assert "".join(d["delta"]["text"] for e, d in events if e == "content_block_delta") == "漢😀 漢😀 "
    # a lone surrogate escape is not valid Unicode text: a clean 400, never a 500
    for body in (b'{"model":"reasoning","max_tokens":5,"messages":[{"role":"user","content":"a \\ud800 b"}]}',
                 b'{"model":"reasoning","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"\\udc00"}]}'):
        status, hdrs, raw = post_raw(gateway.base + "/messages", body)
        assert status == 400 and hdrs["content-type"].startswith("application/json")
        assert json.loads(raw)["error"]["type"] == "invalid_request_error"


def test_very_long_system_prompt(client, stubs):
    vllm, _ = stubs
    system = [{"type": "text", "text": "rule " * 2000}, {"type": "text", "text": "more rules"}]
    msg = client.messages.create(model="reasoning", max_tokens=50, system=system,
                                 messages=_user("[stub reasoning=0 content=2]"))
    assert msg.stop_reason == "end_turn"
    sent = vllm.requests()[-1]["body"]
    assert sent["messages"][0] == {"role": "system", "content": "rule " * 2000 + "\n\nmore rules"}
    assert sent["max_tokens"] == 50


def test_count_tokens(client, stubs):
    for model in ("reasoning", QWEN):
        r = client.messages.count_tokens(model=model, messages=_user("hello there"), system="s", tools=TOOLS)
        assert isinstance(r.input_tokens, int) and r.input_tokens > 0


# -- message_start usage --------------------------------------------------------------------------


def test_message_start_input_tokens_are_an_estimate_until_the_upstream_says(vllm_stub, ollama_stub):
    """message_start must carry input_tokens (clients size their context from it). When the
    upstream has not reported the prompt by then (Ollama reports usage only at the end; vLLM on its
    first chunk, which a keep-alive ping during a long prefill precedes), it was 0; it is now an
    estimate, and message_delta carries the real count."""
    prompt = "word " * 300 + "[stub reasoning=0 content=2 ttft_ms=1000]"
    with Gateway(standard_config(vllm_stub.base, ollama_stub.base, anthropic={"ping_interval_s": 0.2})) as gw:
        for model in ("reasoning", QWEN):
            events = _stream_raw(gw, {"model": model, "max_tokens": 20, "messages": _user(prompt)})
            assert events[1][0] == "ping"  # message_start went out before the first chunk
            start = events[0][1]["message"]["usage"]["input_tokens"]
            real = next(d for e, d in events if e == "message_delta")["usage"]["input_tokens"]
            assert real > 300 and real / 2 <= start <= real * 2, (model, start, real)


# -- the OpenAI dialect ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["reasoning", QWEN])
def test_openai_relay_usage_done_and_errors(gateway, stubs, model):
    url = gateway.base + "/chat/completions"
    body = {"model": model, "stream": True, "messages": _user("[stub reasoning=1 content=2]")}
    _, _, raw = post_raw(url, body)
    assert raw.count(b"data: [DONE]") == 1 and raw.endswith(b"data: [DONE]\n\n")
    assert b'"usage"' not in raw  # the gateway asked for usage; the client did not
    _, _, raw = post_raw(url, {**body, "stream_options": {"include_usage": True}})
    usage = [json.loads(p) for e, p in _data_lines(raw) if b'"usage"' in p]
    assert len(usage) == 1 and usage[0]["choices"] == [] and usage[0]["usage"]["completion_tokens"] > 0
    assert raw.count(b"data: [DONE]") == 1
    c = openai.OpenAI(base_url=gateway.base, api_key="x", max_retries=0)
    for fault in ("fail_after=2", "error_after=2"):
        with pytest.raises(openai.APIError) as ei:
            for _ in c.chat.completions.create(model=model, stream=True, messages=_user(f"[stub content=10 {fault}]")):
                pass
        assert "mid-stream" in str(ei.value)
        _, _, raw = post_raw(url, {"model": model, "stream": True, "messages": _user(f"[stub content=10 {fault}]")})
        assert b"[DONE]" not in raw and b'"error"' in raw.rsplit(b"data: ", 1)[1]


def _data_lines(raw: bytes):
    for line in raw.split(b"\n"):
        if line.startswith(b"data: "):
            yield b"data", line[6:]
