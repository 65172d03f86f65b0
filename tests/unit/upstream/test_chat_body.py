"""Canonical request -> upstream body: only what the client asked for, per backend kind."""

from __future__ import annotations

import msgspec

from homelab_frontend import canonical as c
from homelab_frontend.request.context_clamp import context_refusal
from homelab_frontend.config import Backend
from homelab_frontend.upstream.chat_body import build_body

VLLM = Backend(url="http://h/v1", kind="vllm")
OLLAMA = Backend(url="http://h/v1", kind="ollama")
OPENAI = Backend(url="http://h/v1", kind="openai")


def body(req, backend=VLLM, **kw):
    kw.setdefault("stream", False)
    kw.setdefault("max_tokens", req.max_tokens)
    return msgspec.json.decode(build_body(req, upstream_model="up", backend=backend, **kw))


def req(**kw):
    return c.Request(model="client", messages=[c.Message("user", [c.TextPart("hi")])], **kw)


def test_minimal_body_invents_nothing():
    assert body(req()) == {"model": "up", "messages": [{"role": "user", "content": "hi"}]}


def test_sampling_only_when_sent_and_top_k_only_where_understood():
    r = req(temperature=0.6, top_p=0.9, top_k=20, max_tokens=5, stop=["x"], user="u")
    b = body(r)
    assert (b["temperature"], b["top_p"], b["top_k"], b["max_tokens"], b["stop"], b["user"]) == (0.6, 0.9, 20, 5, ["x"], "u")
    assert "top_k" not in body(r, OPENAI)
    assert "stop" not in body(r, send_stop=False)


def test_stream_options_only_when_streaming_and_continuous_only_for_vllm():
    assert "stream_options" not in body(req())  # vLLM 400s on stream_options without stream
    assert body(req(), stream=True, continuous_usage=True)["stream_options"] == {
        "include_usage": True, "continuous_usage_stats": True}
    assert body(req(), OLLAMA, stream=True, continuous_usage=True)["stream_options"] == {"include_usage": True}


def test_tools_tool_choice_and_parallel():
    r = req(tools=[c.Tool("f", "does f", {"type": "object"})], tool_choice=c.ToolChoice("named", "f"),
            parallel_tool_calls=False)
    b = body(r)
    assert b["tools"] == [{"type": "function", "function": {"name": "f", "description": "does f", "parameters": {"type": "object"}}}]
    assert b["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert b["parallel_tool_calls"] is False
    assert body(req(tools=[c.Tool("f")], tool_choice=c.ToolChoice("required")))["tool_choice"] == "required"


def test_history_with_tool_calls_reasoning_images_and_tool_results():
    r = c.Request(model="m", messages=[
        c.Message("system", [c.TextPart("a")]),
        c.Message("system", [c.TextPart("b")]),
        c.Message("user", [c.TextPart("look"), c.ImagePart("data:image/png;base64,AAAA")]),
        c.Message("assistant", [], tool_calls=[c.ToolCall("t1", "f", '{"x":1}')], reasoning="because"),
        c.Message("tool", [c.TextPart("out"), c.ImagePart("http://i")], tool_call_id="t1"),
        c.Message("system", [c.TextPart("late")]),
    ])
    m = body(r)["messages"]
    assert m[0] == {"role": "system", "content": "a\n\nb"}
    assert m[1]["content"][1] == {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    assert m[2] == {"role": "assistant", "content": None, "reasoning": "because",
                    "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}]}
    # by default a later system message is merged, wrapped, into the message before it
    assert m[3] == {"role": "tool", "tool_call_id": "t1", "content": "out\n[image]\n\n<system>\nlate\n</system>"}
    assert len(m) == 4
    # kept native (system_turns: native), it stays in place
    native = body(r, system_turns="native")["messages"]
    assert native[:3] == m[:3]
    assert native[3] == {"role": "tool", "tool_call_id": "t1", "content": "out\n[image]"}
    assert native[4] == {"role": "system", "content": "late"}


def test_reasoning_controls_per_backend():
    assert body(req(reasoning_effort="high"))["reasoning_effort"] == "high"
    assert body(req(reasoning_enabled=False))["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in body(req(reasoning_enabled=False), OLLAMA)


def test_text_parts_are_joined_line_by_line():
    r = c.Request(model="m", messages=[c.Message("user", [c.TextPart("<reminder>x</reminder>"), c.TextPart("fix it")])])
    assert body(r)["messages"][0]["content"] == "<reminder>x</reminder>\nfix it"


def test_extra_params_pass_through():
    assert body(req(extra={"seed": 7}))["seed"] == 7


def test_context_refusal_both_vllm_wordings():
    old = ("This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
           "(1000 in the messages, 4000 in the completion). Please reduce the length of the messages or completion.")
    new = ("'max_tokens' or 'max_completion_tokens' is too large: 4000. This model's maximum context length is "
           "4096 tokens and your request has 1000 input tokens (4000 > 4096 - 1000). (parameter=max_tokens, value=4000)")
    assert context_refusal(old) == (4096, 1000)
    assert context_refusal(new) == (4096, 1000)
    assert context_refusal("model not found") is None


def test_context_refusal_vllm_032_wording():
    """vLLM 0.32 refuses only a prompt that alone exceeds the context (it fits max_tokens itself),
    counting a prompt it cut at one token past the context."""
    msg = ("This model's maximum context length is 1024 tokens. However, your prompt contains at least 1025 "
           "input tokens, which exceeds this limit even without any output tokens. Please reduce the length of "
           "the input prompt. (parameter=input_tokens, value=1025)")
    assert context_refusal(msg) == (1024, 1025)
    assert context_refusal(msg.replace("at least ", "")) == (1024, 1025)
