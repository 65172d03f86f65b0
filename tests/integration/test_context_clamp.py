"""max_tokens fitted to the context right the first time: counted by the backend's tokenizer
where it has one, and a refusal (then retried once with the exact room) counted in /metrics."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from conftest import R1
from gwproc import Gateway, config_for
from rawhttp import post_raw
from stubproc import start_stub

BIG = "word " * 3000  # ~3000 stub tokens, ~15 kB: a low estimate (bytes/8) takes it for ~2000


def clamps(gw: Gateway) -> dict[tuple[str, str], float]:
    with urllib.request.urlopen(gw.url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {(s.labels["backend"], s.labels["how"]): s.value
            for fam in text_string_to_metric_families(text) if fam.name == "hlf_context_clamps"
            for s in fam.samples if s.name.endswith("_total")}


def ask(gw: Gateway, max_tokens: int, content: str) -> tuple[int, bytes]:
    status, _, raw = post_raw(gw.base + "/messages", {
        "model": "reasoning", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content + "[stub reasoning=0 content=2]"}]})
    return status, raw


def test_the_backend_tokenizer_gets_the_clamp_right_the_first_time(gateway, stubs):
    vllm, _ = stubs
    before = clamps(gateway)
    status, raw = ask(gateway, 4000, BIG)
    assert status == 200, raw
    sent = vllm.requests()
    assert len(sent) == 1, [r["body"]["max_tokens"] for r in sent]  # never refused, never retried
    # exactly the room the backend's own count leaves (the stub's /tokenize, as vLLM's)
    status, _, tok = post_raw(vllm.url + "/tokenize", {"model": R1, "messages": sent[0]["body"]["messages"]})
    assert status == 200
    assert sent[0]["body"]["max_tokens"] == 4096 - json.loads(tok)["count"]
    after = clamps(gateway)
    assert after.get(("gpu0", "tokenizer"), 0) == before.get(("gpu0", "tokenizer"), 0) + 1
    assert after.get(("gpu0", "retry"), 0) == before.get(("gpu0", "retry"), 0)


def test_small_requests_are_not_counted_at_all(gateway, stubs):
    vllm, _ = stubs
    before = clamps(gateway)
    status, raw = ask(gateway, 64, "hi")
    assert status == 200, raw
    assert vllm.requests()[0]["body"]["max_tokens"] == 64
    assert clamps(gateway) == before


def test_a_prompt_that_fills_the_context_is_a_clear_400_before_any_generation(gateway, stubs):
    vllm, _ = stubs
    status, raw = ask(gateway, 100, "word " * 4200)
    assert status == 400, raw
    err = json.loads(raw)["error"]
    assert err["type"] == "invalid_request_error" and "no room left" in err["message"]
    assert vllm.requests() == []  # refused by the gateway: no generation was even tried


def test_without_a_tokenizer_a_refusal_is_retried_once_with_the_exact_room_and_counted():
    """A backend with no tokenizer endpoint (kind openai, here in front of the vLLM stub): the
    clamp is a low estimate; when vLLM still refuses (vLLM before 0.17 refused prompt + max_tokens
    over the context; 0.32 fits max_tokens itself), its message says how long the prompt is and
    the gateway retries once with exactly what fits."""
    with start_stub("vllm", "--reasoning", "--model", R1, "--max-model-len", "4096",
                    "--legacy-context-errors") as legacy:
        cfg = config_for({"up": {"url": legacy.base, "kind": "openai"}},
                         {"reasoning": {"backend": "up", "upstream_model": R1, "max_model_len": 4096}})
        with Gateway(cfg) as gw:
            status, raw = ask(gw, 4000, BIG)
            assert status == 200, raw
            sent = [r["body"]["max_tokens"] for r in legacy.requests()]
            assert len(sent) == 2 and sent[1] < sent[0] < 4000
            assert clamps(gw) == {("up", "retry"): 1.0}
