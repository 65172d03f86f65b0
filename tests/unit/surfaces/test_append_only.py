"""History rendering never depends on later turns: for any valid conversation, the upstream
messages the gateway builds for turn k are a prefix of those for turn k+1 (same conversation, one
more assistant answer and user turn). A property over both surfaces' translation, before any chat
template (bench.prefix measures the templates)."""

from __future__ import annotations

import json

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend import config as cfgmod
from homelab_frontend.surfaces.anthropic.request import parse_request as parse_anthropic
from homelab_frontend.surfaces.signature import ThinkingSigner
from homelab_frontend.surfaces.openai.request import parse_request as parse_openai
from homelab_frontend.upstream.chat_body import build_body

SIGNER = ThinkingSigner(b"append-only")
BACKEND = cfgmod.Backend(url="http://127.0.0.1:1/v1")
words = st.text(alphabet="abc xyz\n", min_size=1, max_size=12)


def _upstream(body: dict, parse) -> list[dict]:
    req = parse(json.dumps(body).encode())
    if isinstance(req, tuple):
        req = req[0]
    out = build_body(req, upstream_model="m", backend=BACKEND, stream=False, max_tokens=16)
    return msgspec.json.decode(out)["messages"]


# One step of an Anthropic conversation after a user turn: the assistant's answer (text, a signed
# thinking block, tool calls), optional system entries, and the next user turn (tool results for
# the calls, then text).
@st.composite
def anthropic_step(draw, k: int) -> list[dict]:
    calls = draw(st.integers(0, 2))
    content = []
    if draw(st.booleans()):
        t = draw(words)
        content.append({"type": "thinking", "thinking": t, "signature": SIGNER.sign(t)})
    if draw(st.booleans()) or not calls:
        content.append({"type": "text", "text": draw(words)})
    ids = [f"toolu_{k}_{i}" for i in range(calls)]
    content += [{"type": "tool_use", "id": i, "name": "Bash", "input": {"command": draw(words)}} for i in ids]
    step = [{"role": "assistant", "content": content}]
    for _ in range(draw(st.integers(0, 2))):
        step.append({"role": "system", "content": draw(words)})
    user = [{"type": "tool_result", "tool_use_id": i, "content": draw(words), "is_error": draw(st.booleans())}
            for i in ids]
    if draw(st.booleans()) or not ids:
        user.append({"type": "text", "text": draw(words)})
    step.append({"role": "user", "content": user if draw(st.booleans()) or ids else user[0]["text"]})
    for _ in range(draw(st.integers(0, 1))):
        step.append({"role": "system", "content": draw(words)})  # Claude Code: a system entry last
    return step


@settings(max_examples=examples(150), deadline=None)
@given(st.data(), st.integers(1, 4), st.booleans())
def test_anthropic_history_is_append_only(data, turns, system):
    messages = [{"role": "user", "content": data.draw(words)}]
    base = {"model": "m", "max_tokens": 16}
    if system:
        base["system"] = [{"type": "text", "text": "x-anthropic-billing-header: cc=1;"},
                          {"type": "text", "text": data.draw(words)}]
    prev = _upstream({**base, "messages": messages}, lambda b: parse_anthropic(b, signer=SIGNER))
    for k in range(turns):
        messages = messages + data.draw(anthropic_step(k))
        cur = _upstream({**base, "messages": messages}, lambda b: parse_anthropic(b, signer=SIGNER))
        assert cur[: len(prev)] == prev, (prev, cur)
        prev = cur


@settings(max_examples=100, deadline=None)
@given(st.data(), st.integers(1, 4))
def test_openai_history_is_append_only(data, turns):
    messages = [{"role": "system", "content": data.draw(words)}, {"role": "user", "content": data.draw(words)}]
    prev = _upstream({"model": "m", "messages": messages}, parse_openai)
    for k in range(turns):
        step = []
        if data.draw(st.booleans()):
            call = {"id": f"call_{k}", "type": "function", "function": {"name": "Bash", "arguments": '{"c":1}'}}
            step += [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": f"call_{k}", "content": data.draw(words)}]
        step.append({"role": "assistant", "content": data.draw(words)})
        if data.draw(st.booleans()):
            step.append({"role": "system", "content": data.draw(words)})
        step.append({"role": "user", "content": data.draw(words)})
        messages = messages + step
        cur = _upstream({"model": "m", "messages": messages}, parse_openai)
        assert cur[: len(prev)] == prev, (prev, cur)
        prev = cur
