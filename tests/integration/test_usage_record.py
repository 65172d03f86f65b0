"""The request record's counts (the access log, the metrics) against the stub's own figures, in
every dialect, also for a stream the client leaves: the stub's log says how many tokens it sent
before it saw the cancel, its /tokenize (the rule behind its usage) how long the prompt was.
Each stub token here is 2.5 s apart, so the client is long gone before the next one exists."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

from conftest import R1
from rawhttp import post_and_vanish, post_raw
from stubproc import wait_for

PROMPT = "[stub reasoning=0 content=3 first_ms=0 delay_ms=2500]"
# dialect: (path, body, bytes that show the first text token arrived)
CANCELLED = {
    "anthropic": ("/messages", {"model": "reasoning", "stream": True, "max_tokens": 64,
                                "messages": [{"role": "user", "content": PROMPT}]}, b"text_delta"),
    "responses": ("/responses", {"model": "reasoning", "stream": True, "input": PROMPT},
                  b"response.output_text.delta"),
    # the upstream reports the prompt before the end only when the client asks for vLLM's
    # continuous usage (the relay asks for no more than the client did)
    "openai": ("/chat/completions", {"model": "reasoning", "stream": True,
                                     "messages": [{"role": "user", "content": PROMPT}],
                                     "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
               b'"content":"H'),
}


def _request_id(raw: bytes) -> str:
    m = re.search(rb"\r\nrequest-id: *([^\r]+)\r\n", raw, re.I)
    assert m, raw[:400]
    return m.group(1).decode()


def _line(gateway, rid: str) -> dict:
    return wait_for(lambda: next((x for x in gateway.access_log() if x["id"] == rid), None), 5)


def _stub_prompt_tokens(vllm_stub) -> int:
    """The stub's count of the prompt it was sent (the rule its usage.prompt_tokens follows)."""
    messages = vllm_stub.requests()[-1]["body"]["messages"]
    req = urllib.request.Request(vllm_stub.url + "/tokenize", json.dumps({"model": R1, "messages": messages}).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)["count"]


def _sent_before_cancel(vllm_stub, before: int) -> int:
    lines = wait_for(lambda: [x for x in vllm_stub.log_lines() if x.startswith("cancelled")][before:] or None, 5)
    return int(re.search(r"after (\d+) tokens", lines[0]).group(1))


@pytest.mark.parametrize("dialect", list(CANCELLED))
def test_a_cancelled_stream_records_what_the_stub_generated_and_read(gateway, vllm_stub, stubs, dialect):
    path, body, first_text = CANCELLED[dialect]
    before = len([x for x in vllm_stub.log_lines() if x.startswith("cancelled")])
    raw = post_and_vanish(gateway.base + path, body, until=first_text)
    assert first_text in raw
    sent = _sent_before_cancel(vllm_stub, before)
    assert sent == 1  # the stub's next token was seconds away
    line = _line(gateway, _request_id(raw))
    assert line["outcome"] == "cancelled_streaming"
    assert line["tokens_out"] == sent
    assert line["tokens_in"] == _stub_prompt_tokens(vllm_stub)
    assert line["ttft_ms"] is not None


def test_openai_stream_with_continuous_usage_records_its_first_token(gateway, vllm_stub, stubs):
    body = {"model": "reasoning", "stream": True, "messages": [{"role": "user", "content": "[stub content=5]"}],
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    status, hdrs, raw = post_raw(gateway.base + "/chat/completions", body)
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    assert vllm_stub.requests()[-1]["body"]["stream_options"]["continuous_usage_stats"] is True
    chunks = [json.loads(x[6:]) for x in raw.split(b"\n\n") if x.startswith(b"data: {")]
    assert all("usage" in ch for ch in chunks)  # the stub did send usage on every chunk
    line = _line(gateway, hdrs["request-id"])
    assert line["outcome"] == "ok"
    assert line["ttft_ms"] is not None and 0 < line["ttft_ms"] <= line["duration_ms"]
    done = wait_for(lambda: [x for x in vllm_stub.log_lines() if x.startswith("completed")], 5)[-1]
    assert line["tokens_out"] == int(re.search(r"tokens=(\d+)", done).group(1)) == chunks[-1]["usage"]["completion_tokens"]
    assert line["tokens_in"] == _stub_prompt_tokens(vllm_stub) == chunks[-1]["usage"]["prompt_tokens"]
