"""The seeds' 2.11 (Anthropic non-streaming translation) and 2.12 (the Anthropic SSE state machine)
on the real vLLM's own answers: the criteria one by one, their Verify commands as written (curl),
and usage equal to what vLLM reports for the same chat sent to it directly.

vLLM runs Gemma 3 270M with `--reasoning-parser deepseek_r1`, as the seeds' `reasoning` model
does; its answers are made exact by the test logits processor (tests/support/vllm_script.py):
a prompt's `[[hlf:NAME]]` names the answer, "hi" gets the default (reasoning, then text).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time

import anthropic
import pytest

from rawhttp import _request_bytes, post_raw, sse_events
from stubproc import wait_for
from support.vllm_script import DEFAULT, SCRIPTS, directive

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(600)]


def _ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def ant(vllm_gw, idle_vllm):
    return anthropic.Anthropic(base_url=vllm_gw.llm, api_key="x", max_retries=0)


def _prompt(usage) -> int:
    """The whole prompt: Anthropic's input_tokens is the part vLLM did not read from its cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


# -- 2.11: the whole answer -------------------------------------------------------------------------


def test_2_11_reasoning_answer_is_a_message_with_thinking_then_text(vllm_gw, idle_vllm):
    status, headers, raw = post_raw(vllm_gw.llm + "/v1/messages", {
        "model": "reasoning", "max_tokens": 64, "messages": _ask("hi")}, timeout=120)
    assert status == 200, raw
    assert headers["content-type"].startswith("application/json")
    doc = json.loads(raw)
    assert set(doc) == {"id", "type", "role", "content", "model", "stop_reason", "stop_sequence", "usage"}
    assert (doc["type"], doc["role"], doc["model"]) == ("message", "assistant", "reasoning")
    assert [b["type"] for b in doc["content"]] == ["thinking", "text"]
    assert doc["content"][0]["thinking"] == DEFAULT.reasoning
    assert doc["content"][1]["text"] == DEFAULT.content
    assert doc["stop_reason"] == "end_turn" and "stop_sequence" in doc and doc["stop_sequence"] is None
    for name in ("choices", "finish_reason", "object"):
        assert f'"{name}"' not in raw.decode()
    # usage: vLLM's own figures for the same chat, nothing invented (cache_read_input_tokens is
    # vLLM's prompt_tokens_details.cached_tokens: reported, so passed on)
    direct = idle_vllm.chat(_ask("hi"), max_tokens=64)["usage"]
    assert set(doc["usage"]) <= {"input_tokens", "output_tokens", "cache_read_input_tokens"}
    assert doc["usage"]["output_tokens"] == direct["completion_tokens"]
    assert doc["usage"]["input_tokens"] + doc["usage"].get("cache_read_input_tokens", 0) == direct["prompt_tokens"]


def test_2_11_length_stop_sequence_no_reasoning_and_reasoning_only(ant, idle_vllm):
    m = ant.messages.create(model="reasoning", max_tokens=5, messages=_ask("hi"))
    assert (m.stop_reason, m.usage.output_tokens) == ("max_tokens", 5)
    assert m.content[0].type == "thinking"

    msgs = _ask("Count. " + directive("stop"))
    m = ant.messages.create(model="reasoning", max_tokens=64, messages=msgs, stop_sequences=["STOP"])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "STOP")
    assert m.content[-1].text == SCRIPTS["stop"].content.split("STOP")[0]
    direct = idle_vllm.chat(msgs, max_tokens=64, stop=["STOP"])
    assert direct["choices"][0]["stop_reason"] == "STOP"
    assert m.usage.output_tokens == direct["usage"]["completion_tokens"]
    assert _prompt(m.usage) == direct["usage"]["prompt_tokens"]

    m = ant.messages.create(model="reasoning", max_tokens=64, messages=_ask("Answer. " + directive("plain")))
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == SCRIPTS["plain"].content

    m = ant.messages.create(model="reasoning", max_tokens=64, messages=_ask("Think. " + directive("think-only")))
    assert [b.type for b in m.content] == ["thinking"]
    assert m.content[0].thinking == SCRIPTS["think-only"].reasoning


def test_2_11_verify_command(vllm_gw, idle_vllm):
    out = subprocess.run(
        ["curl", "-s", vllm_gw.url + "/llm/v1/messages", "-H", "content-type: application/json",
         "-d", '{"model":"reasoning","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}'],
        capture_output=True, check=True, timeout=120).stdout
    doc = json.loads(out)
    assert (doc["type"], doc["role"]) == ("message", "assistant")
    assert [b["type"] for b in doc["content"]] == ["thinking", "text"]


# -- 2.12: the stream -------------------------------------------------------------------------------


def _frames(raw: bytes) -> list[tuple[str | None, str | None]]:
    """(event line, data line) of every SSE frame, as sent."""
    out = []
    for frame in raw.decode().split("\n\n"):
        if not frame.strip():
            continue
        lines = frame.split("\n")
        ev = next((ln[len("event: "):] for ln in lines if ln.startswith("event:")), None)
        data = next((ln[len("data: "):] for ln in lines if ln.startswith("data:")), None)
        out.append((ev, data))
    return out


def _stream(vllm_gw, messages, **body) -> tuple[dict, bytes]:
    status, headers, raw = post_raw(vllm_gw.llm + "/v1/messages", {
        "model": "reasoning", "max_tokens": 64, "stream": True, "messages": messages, **body}, timeout=120)
    assert status == 200, raw
    return headers, raw


def _shape(events) -> list[str]:
    """The event sequence with each block's deltas folded: 'start:thinking', 'delta+', 'stop'..."""
    out: list[str] = []
    for name, data in events:
        if name == "content_block_start":
            out.append(f"start{data['index']}:{data['content_block']['type']}")
        elif name == "content_block_delta":
            tag = f"delta{data['index']}:{data['delta']['type']}"
            if not out or out[-1] != tag:
                out.append(tag)
        elif name == "content_block_stop":
            out.append(f"stop{data['index']}")
        else:
            out.append(name)
    return out


def test_2_12_reasoning_stream_is_the_exact_event_sequence(vllm_gw, idle_vllm):
    headers, raw = _stream(vllm_gw, _ask("hi"))
    assert headers["content-type"].startswith("text/event-stream")
    frames = _frames(raw)
    assert all(ev and data for ev, data in frames), "a frame without its event: or data: line"
    assert b"[DONE]" not in raw
    events = sse_events(raw)
    # the thinking block ends with its signature (a signature_delta), as Anthropic's does
    assert _shape(events) == ["message_start", "start0:thinking", "delta0:thinking_delta",
                              "delta0:signature_delta", "stop0",
                              "start1:text", "delta1:text_delta", "stop1", "message_delta", "message_stop"]
    start = events[0][1]["message"]
    assert (start["model"], start["role"], start["content"]) == ("reasoning", "assistant", [])
    delta = next(d for n, d in events if n == "message_delta")
    thinking = "".join(d["delta"].get("thinking", "") for n, d in events if n == "content_block_delta" and d["index"] == 0)
    text = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta" and d["index"] == 1)
    assert (thinking, text) == (DEFAULT.reasoning, DEFAULT.content)
    assert delta["delta"]["stop_reason"] == "end_turn"
    direct = idle_vllm.chat(_ask("hi"), max_tokens=64)["usage"]
    assert delta["usage"]["output_tokens"] == direct["completion_tokens"]
    assert start["usage"]["input_tokens"] + start["usage"].get("cache_read_input_tokens", 0) == direct["prompt_tokens"]
    assert [n for n, _ in events].count("message_stop") == 1


def test_2_12_no_reasoning_reasoning_only_and_length(vllm_gw, idle_vllm):
    _, raw = _stream(vllm_gw, _ask("Answer. " + directive("plain")))
    assert _shape(sse_events(raw)) == ["message_start", "start0:text", "delta0:text_delta", "stop0",
                                       "message_delta", "message_stop"]
    _, raw = _stream(vllm_gw, _ask("Think. " + directive("think-only")))
    assert _shape(sse_events(raw)) == ["message_start", "start0:thinking", "delta0:thinking_delta",
                                       "delta0:signature_delta", "stop0", "message_delta", "message_stop"]
    _, raw = _stream(vllm_gw, _ask("hi"), max_tokens=5)
    delta = next(d for n, d in sse_events(raw) if n == "message_delta")
    assert (delta["delta"]["stop_reason"], delta["usage"]["output_tokens"]) == ("max_tokens", 5)


def test_2_12_each_chunk_is_flushed_as_vllm_sends_it(vllm_gw, idle_vllm):
    """Unbuffered: the deltas reach the client one read at a time, spread over the generation,
    not in one piece at its end (vLLM sends one token a chunk, ~10 a second here)."""
    addr, req = _request_bytes(vllm_gw.llm + "/v1/messages", {
        "model": "reasoning", "max_tokens": 64, "stream": True, "messages": _ask("Tell me. " + directive("long"))})
    arrivals: list[float] = []
    with socket.create_connection(addr, timeout=120) as sock:
        sock.sendall(req)
        buf = b""
        while b"message_stop" not in buf:
            got = sock.recv(65536)
            if not got:
                break
            buf += got
            arrivals += [time.monotonic()] * got.count(b"event: content_block_delta")
    assert len(arrivals) >= 40
    assert arrivals[-1] - arrivals[0] > 1.0  # spread over the generation
    assert len(set(arrivals)) >= 10  # many reads, not one


def test_2_12_verify_commands(vllm_gw, idle_vllm):
    body = '{"model":"reasoning","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}'
    out = subprocess.run(["curl", "-N", "-s", vllm_gw.url + "/llm/v1/messages", "-H", "content-type: application/json",
                          "-d", body], capture_output=True, check=True, timeout=120, text=True).stdout
    names = [ln[len("event: "):] for ln in out.splitlines() if ln.startswith("event:")]
    folded = [n for i, n in enumerate(names) if n != "content_block_delta" or names[i - 1] != n]
    assert folded == ["message_start", "content_block_start", "content_block_delta", "content_block_stop",
                      "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    # grep -n -E 'content_block_stop|"index":1' | head -3: index 0's stop comes before any index 1
    lines = out.splitlines()
    matched = [i for i, ln in enumerate(lines) if re.search(r'content_block_stop|"index":1', ln)][:3]
    first_index_1 = next(i for i, ln in enumerate(lines) if '"index":1' in ln)
    stop_0 = next(i for i, ln in enumerate(lines) if "content_block_stop" in ln and '"index":0' in ln)
    assert "content_block_stop" in lines[matched[0]] and stop_0 < first_index_1

    # the third: a client gone after a second; vLLM itself stops the generation (its counters; its
    # abort log line is best effort, VllmServer.aborted)
    vllm = idle_vllm
    aborted, gen0 = len(vllm.aborted()), vllm.generated()
    subprocess.run(["timeout", "1", "curl", "-N", "-s", vllm_gw.url + "/llm/v1/messages", "-H",
                    "content-type: application/json", "-d",
                    '{"model":"reasoning","max_tokens":512,"stream":true,"messages":[{"role":"user","content":"long"}]}'],
                   capture_output=True, timeout=30)
    # "within a second", judged in vLLM's own tokens rather than wall seconds on a busy machine: a
    # second of this stream is about a dozen tokens here; an orphan would have run to all 512
    vllm.stopped_short(gen0, 128)
    assert len(vllm.aborted()) - aborted <= 1
    wait_for(lambda: vllm_gw.admin()["backends"]["vllm"]["in_use"] == 0, timeout=30)


def test_a_stream_cut_mid_generation_is_aborted_in_vllm(vllm_gw, idle_vllm):
    """2.12: "a client disconnect mid-stream cancels the upstream request immediately and releases
    the slot", judged by vLLM: its running gauge drops to 0 a few tokens after the close."""
    vllm = idle_vllm
    aborted = len(vllm.aborted())
    addr, req = _request_bytes(vllm_gw.llm + "/v1/messages", {
        "model": "reasoning", "max_tokens": 500, "stream": True, "messages": _ask("Go on. " + directive("long"))})
    sock = socket.create_connection(addr, timeout=120)
    sock.sendall(req)
    buf = b""
    while buf.count(b"text_delta") < 3:
        buf += sock.recv(65536)
    assert vllm.running() == 1
    gen0 = vllm.metrics().get("vllm:generation_tokens_total", 0)
    sock.close()
    # "immediately", in vLLM's own tokens after the close (a few at most; an orphan runs to 500)
    vllm.stopped_short(gen0, 64)
    assert len(vllm.aborted()) - aborted <= 1
    wait_for(lambda: vllm_gw.admin()["backends"]["vllm"]["in_use"] == 0, timeout=30)
    m = vllm.metrics()
    assert m.get("vllm:generation_tokens_total", 0) > 0
