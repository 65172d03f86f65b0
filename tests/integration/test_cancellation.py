"""A client that goes away in any phase cancels the upstream generation at once and frees the
slot, in every dialect: the stub logs `cancelled` within a second and runs nothing."""

from __future__ import annotations

import time

import pytest

from rawhttp import post_and_vanish
from stubproc import wait_for

PHASES = {
    # phase: (directive, stream, how long the client stays)
    "waiting_for_upstream_headers": ("[stub headers_ms=5000 content=5]", True, dict(after_s=0.5)),
    "before_first_token": ("[stub ttft_ms=5000 content=5]", True, dict(after_s=0.5)),
    "mid_stream": ("[stub content=400 delay_ms=20]", True, dict(after_bytes=600)),
    "non_streaming": ("[stub content=400 delay_ms=20]", False, dict(after_s=0.5)),
}


def _body(dialect: str, prompt: str, stream: bool) -> tuple[str, dict]:
    if dialect == "openai":
        return "/chat/completions", {"model": "reasoning", "stream": stream, "messages": [{"role": "user", "content": prompt}]}
    if dialect == "responses":
        return "/responses", {"model": "reasoning", "stream": stream, "input": prompt}
    if dialect == "gemini":  # the GenAI SDK's default API version, v1
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return f"/models/reasoning:{method}", {"contents": [{"role": "user", "parts": [{"text": prompt}]}]}
    return "/messages", {"model": "reasoning", "stream": stream, "max_tokens": 1024,
                         "messages": [{"role": "user", "content": prompt}]}


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses", "gemini"])
@pytest.mark.parametrize("phase", list(PHASES))
def test_disconnect_cancels_upstream_and_frees_slot(gateway, vllm_stub, stubs, dialect, phase):
    prompt, stream, stay = PHASES[phase]
    path, body = _body(dialect, prompt, stream)
    before = vllm_stub.log_text().count("cancelled")
    post_and_vanish(gateway.base + path, body, **stay)
    gone = time.monotonic()
    wait_for(lambda: vllm_stub.log_text().count("cancelled") == before + 1, 1.0)
    assert time.monotonic() - gone <= 1.0
    wait_for(lambda: vllm_stub.stats()["in_flight"] == 0, 1.0)
    wait_for(lambda: gateway.admin()["backends"]["gpu0"]["in_use"] == 0, 1.0)
    assert gateway.admin()["requests"] == []
    rec = wait_for(lambda: [r for r in gateway.access_log() if r["outcome"].startswith("cancelled")], 2)
    assert rec[-1]["status"] == 499
