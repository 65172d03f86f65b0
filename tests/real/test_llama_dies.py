"""llama.cpp killed mid-stream (its own instance: the shared one must live on): each dialect
ends its stream with its error form and never with a clean ending; kind detection on the way."""

from __future__ import annotations

import signal
import socket

import pytest

from llamaproc import llama_config, require_llama
from gwproc import Gateway
from llamaproc import MODEL, LlamaServer
from rawhttp import _dechunk, _request_bytes, sse_data, sse_events
from stubproc import wait_for

pytestmark = pytest.mark.timeout(180)
LONG = [{"role": "user", "content": "Write a very long story about a dragon."}]


def _stream_then_kill(server: LlamaServer, url: str, body: dict) -> bytes:
    """Read the stream until a few chunks arrived, SIGKILL llama-server, read to the end."""
    addr, req = _request_bytes(url, body)
    with socket.create_connection(addr, timeout=30) as s:
        s.sendall(req)
        got = b""
        while got.count(b"data:") < 4:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return _dechunk(rest)


@pytest.mark.parametrize("dialect", ["anthropic", "openai"])
def test_upstream_killed_mid_stream(dialect):
    require_llama()
    with LlamaServer() as server, Gateway(llama_config(server.base)) as gw:
        if dialect == "anthropic":
            body = _stream_then_kill(server, gw.llm + "/v1/messages", {
                "model": MODEL, "max_tokens": 600, "stream": True, "messages": LONG})
            names = [n for n, _ in sse_events(body)]
            assert names[0] == "message_start"
            assert names[-1] == "error" and "message_stop" not in names, names
            err = [d for n, d in sse_events(body) if n == "error"][0]
            assert err["type"] == "error" and err["error"]["type"] == "api_error"
        else:
            body = _stream_then_kill(server, gw.base + "/chat/completions", {
                "model": MODEL, "max_tokens": 600, "stream": True, "messages": LONG})
            data = sse_data(body)
            assert b"[DONE]" not in data
            assert b'"error"' in data[-1], data[-3:]
        rec = wait_for(lambda: [r for r in gw.access_log() if r.get("stream")], 5)[-1]
        assert rec["outcome"] == "error_upstream_midstream" and rec["status"] == 200


def test_kind_is_detected_from_the_models_probe():
    """No `kind` in the config: llama.cpp is recognised from /v1/models (owned_by llamacpp), and
    the gateway then matches stop sequences itself (llama.cpp does not say which one fired)."""
    require_llama()
    import anthropic

    with LlamaServer() as server:
        cfg = llama_config(server.base)
        del cfg["backends"]["llama"]["kind"]
        with Gateway(cfg) as gw:
            wait_for(lambda: "detected llamacpp" in gw.stderr(), 10)
            ant = anthropic.Anthropic(base_url=gw.llm, api_key="x", max_retries=0)
            m = ant.messages.create(model=MODEL, max_tokens=100, stop_sequences=["0.0.0"],
                                    messages=[{"role": "user", "content": "Count from 1 to 10."}],
                                    extra_body={"temperature": 0})
            assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "0.0.0")
            assert m.content[0].text == "1."
