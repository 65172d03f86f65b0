"""The usage ledger against a real llama-server's own counters (its /metrics
`llamacpp:prompt_tokens_total`, the prompt tokens it processed, and
`llamacpp:tokens_predicted_total`, the tokens it generated), through every dialect, streamed and
not, and for a stream the client cut short."""

from __future__ import annotations

import pytest

from rawhttp import post_and_vanish, post_raw
from stubproc import wait_for

pytestmark = pytest.mark.timeout(300)


def _body(dialect: str, prompt: str, stream: bool, max_tokens: int) -> tuple[str, dict]:
    msgs = [{"role": "user", "content": prompt}]
    if dialect == "openai":
        return "/llm/v1/chat/completions", {"model": "gemma", "stream": stream, "max_tokens": max_tokens, "messages": msgs}
    if dialect == "responses":
        return "/llm/v1/responses", {"model": "gemma", "stream": stream, "max_output_tokens": max_tokens,
                                     "input": prompt, "store": False}
    return "/llm/v1/messages", {"model": "gemma", "stream": stream, "max_tokens": max_tokens, "messages": msgs}


def _ledger(gw) -> dict:
    status, doc = gw.get("/admin/usage?model=gemma")
    assert status == 200
    out: dict = {}
    for r in doc["rows"]:
        for k in ("requests", "input_tokens", "cached_tokens", "output_tokens", "estimated_output", "cancelled"):
            out[k] = out.get(k, 0) + r[k]
    return out


def _counters(llama) -> tuple[float, float]:
    m = llama.metrics()
    return m.get("llamacpp:prompt_tokens_total", 0), m.get("llamacpp:tokens_predicted_total", 0)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses"])
def test_the_ledger_counts_what_llamacpp_processed_and_generated(idle_llama, llama_gw, dialect, stream):
    before, (p0, g0) = _ledger(llama_gw), _counters(idle_llama)
    path, body = _body(dialect, f"Name three colours ({dialect}, {stream}).", stream, 12)
    status, _, raw = post_raw(llama_gw.url + path, body)
    assert status == 200, raw
    wait_for(idle_llama.idle, timeout=30, interval=0.25)
    after = wait_for(lambda: (a := _ledger(llama_gw)).get("requests", 0) > before.get("requests", 0) and a, 10)
    p1, g1 = wait_for(lambda: (c := _counters(idle_llama))[1] > g0 and c, 10)
    d = {k: after[k] - before.get(k, 0) for k in after}
    assert d["requests"] == 1 and d["estimated_output"] == 0
    assert d["output_tokens"] == g1 - g0 > 0  # every token it generated, none more
    # the prompt: what it processed plus what its cache already held
    assert d["input_tokens"] - d["cached_tokens"] == p1 - p0


def test_a_cut_stream_counts_no_more_than_llamacpp_generated(idle_llama, llama_gw):
    before, (_, g0) = _ledger(llama_gw), _counters(idle_llama)
    path, body = _body("openai", "Write a long story about a lighthouse keeper.", True, 400)
    post_and_vanish(llama_gw.url + path, body, after_bytes=2000)
    wait_for(idle_llama.idle, timeout=30, interval=0.25)
    after = wait_for(lambda: (a := _ledger(llama_gw)).get("cancelled", 0) > before.get("cancelled", 0) and a, 10)
    _, g1 = _counters(idle_llama)
    out = after["output_tokens"] - before.get("output_tokens", 0)
    assert after["estimated_output"] - before.get("estimated_output", 0) == 1
    assert 0 < out <= g1 - g0 < 400  # what the gateway read before the cut, the backend stopped too
