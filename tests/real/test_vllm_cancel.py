"""No generation outlives its client on the real vLLM, judged by vLLM's own evidence: its counters
(`vllm:num_requests_running` back to 0, `vllm:generation_tokens_total` short of what the request
would have run to) and its log ("Aborted request(s) ..." with --enable-log-requests: best effort in
vLLM, so read only as "no more aborts than expected"; VllmServer.aborted says why). A stream cut mid-generation in each dialect, a plain request whose client
leaves while vLLM generates, and one that leaves while queued in the gateway (both slots held):
that one never reaches vLLM. And the dashboard's "backend running" figure is vLLM's own.
"""

from __future__ import annotations

import socket

import pytest

from rawhttp import HeldStream, _request_bytes, post_and_vanish
from stubproc import wait_for
from support.vllm_script import directive
from vllmproc import SLOTS

pytestmark = [pytest.mark.xdist_group("vllm"), pytest.mark.timeout(900)]

MODEL = "gemma"
LONG = "Tell me a story. " + directive("long")  # never ends by itself: runs to max_tokens


def _body(dialect: str, stream: bool, max_tokens: int = 800, prompt: str = LONG) -> tuple[str, dict]:
    msgs = [{"role": "user", "content": prompt}]
    if dialect == "openai":
        return "/llm/v1/chat/completions", {"model": MODEL, "max_tokens": max_tokens, "stream": stream, "messages": msgs}
    if dialect == "anthropic":
        return "/llm/v1/messages", {"model": MODEL, "max_tokens": max_tokens, "stream": stream, "messages": msgs}
    if dialect == "responses":
        return "/llm/v1/responses", {"model": MODEL, "max_output_tokens": max_tokens, "stream": stream,
                                     "input": prompt, "store": False}
    if dialect == "gemini":
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        return f"/llm/v1beta/models/{MODEL}:{method}", {"contents": [{"role": "user", "parts": [{"text": prompt}]}],
                                                        "generationConfig": {"maxOutputTokens": max_tokens}}
    return "/api/chat", {"model": MODEL, "stream": stream, "messages": msgs, "options": {"num_predict": max_tokens}}


class Holder(HeldStream):
    """A long stream through the gateway, read on a thread until closed: it holds one slot."""

    def __init__(self, gw, dialect: str = "openai") -> None:
        path, body = _body(dialect, True)
        # past the headers and the opening frames: tokens flow
        super().__init__(gw.url + path, body, timeout=120, start_timeout=120,
                         started=lambda got, total: total > 600)


def _gw(gw) -> dict:
    """The gateway's own view of the vLLM backend (slots in use, requests queued)."""
    return gw.admin()["backends"]["vllm"]


# How long vLLM may go on after a client left, counted in the tokens it generates meanwhile
# (`vllm:generation_tokens_total`, every running sequence's): an abort at the next steps costs a
# few, an orphan runs to its max_tokens (800). Counted in tokens, not seconds, so that a loaded
# machine, which slows vLLM and the gateway alike, does not fail a prompt abort.
TOKEN_BUDGET = 64  # per request that left (about 5 s of one stream here when idle)
SPENT: list[float] = []  # what each abort took in tokens, for the printed summary


def _aborted(vllm, before: int, n: int) -> float:
    """Call as the `n` clients have left: vLLM runs nothing again, having generated fewer than
    TOKEN_BUDGET tokens per request meanwhile (its counters, VllmServer.stopped_short), and logged
    no more than `n` aborts (its log lines are best effort). -> seconds until it ran none."""
    took, spent = vllm.stopped_short(vllm.generated(), TOKEN_BUDGET * n)
    SPENT.append(spent)
    logged = len(vllm.aborted()) - before
    assert logged <= n, f"vLLM logged {logged} aborts (expected {n} at most)"
    return took


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "responses", "gemini", "ollama"])
def test_a_stream_cut_mid_generation_is_aborted_in_vllm(vllm_gw, idle_vllm, dialect):
    vllm = idle_vllm
    before, gen0 = len(vllm.aborted()), vllm.generated()
    path, body = _body(dialect, True)
    post_and_vanish(vllm_gw.url + path, body, after_bytes=1500)
    took = _aborted(vllm, before, 1)
    assert vllm.generated() - gen0 < 800  # it did not run to the end
    wait_for(lambda: _gw(vllm_gw)["in_use"] == 0, timeout=30)
    rec = wait_for(lambda: [r for r in vllm_gw.access_log() if r.get("outcome", "").startswith("cancelled")], 30)
    assert rec[-1]["outcome"] == "cancelled_streaming"
    print(f"{dialect}: vLLM aborted {took:.2f} s, {SPENT[-1]:g} tokens after the client left")


@pytest.mark.parametrize("dialect", ["openai", "anthropic", "gemini"])
def test_a_plain_request_whose_client_leaves_is_aborted_in_vllm(vllm_gw, idle_vllm, dialect):
    vllm = idle_vllm
    before = len(vllm.aborted())
    path, body = _body(dialect, False)
    addr, req = _request_bytes(vllm_gw.url + path, body)
    sock = socket.create_connection(addr, timeout=120)
    sock.sendall(req)
    wait_for(lambda: vllm.running() == 1, timeout=60, interval=0.05)  # vLLM is generating it
    sock.close()
    _aborted(vllm, before, 1)
    wait_for(lambda: _gw(vllm_gw)["in_use"] == 0, timeout=30)


def test_a_request_whose_client_leaves_while_queued_never_reaches_vllm(vllm_gw, idle_vllm):
    vllm = idle_vllm
    before = len(vllm.aborted())
    received = vllm.log_text().count("Received request")
    holders = [Holder(vllm_gw) for _ in range(SLOTS)]
    try:
        wait_for(lambda: vllm.running() == SLOTS, timeout=30, interval=0.05)
        for i, dialect in enumerate(["openai", "anthropic", "responses", "gemini", "ollama"]):
            path, body = _body(dialect, stream=bool(i % 2), max_tokens=50)
            post_and_vanish(vllm_gw.url + path, body, when=lambda: _gw(vllm_gw)["queued"] == 1)
            wait_for(lambda: _gw(vllm_gw)["queued"] == 0, timeout=30)
            m = vllm.metrics()
            assert (m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]) == (SLOTS, 0), m
        # vLLM received the two holders' requests and nothing else
        assert vllm.log_text().count("Received request") == received + SLOTS
        assert len(vllm.aborted()) == before
    finally:
        for h in holders:
            h.close()
    _aborted(vllm, before, SLOTS)
    queued = [r for r in vllm_gw.access_log() if r.get("outcome") == "cancelled_queued"]
    assert len(queued) >= 5


def test_the_dashboards_backend_running_figure_is_vllms_own(vllm_gw, idle_vllm):
    vllm = idle_vllm

    def figure():
        return vllm_gw.admin()["backends"]["vllm"]["upstream_running"]  # what the dashboard shows

    wait_for(lambda: figure() == 0, timeout=10, interval=0.1)
    holders = []
    try:
        for n in range(1, SLOTS + 1):
            holders.append(Holder(vllm_gw, "anthropic" if n % 2 else "openai"))
            wait_for(lambda: vllm.running() == n, timeout=30, interval=0.05)
            wait_for(lambda: figure() == n, timeout=10, interval=0.1)
            assert vllm.running() == n == figure()
            assert vllm_gw.admin()["backends"]["vllm"]["slot_mismatch"] == 0
    finally:
        for h in holders:
            h.close()
    wait_for(lambda: vllm.running() == 0, timeout=10, interval=0.05)
    wait_for(lambda: figure() == 0, timeout=10, interval=0.1)
