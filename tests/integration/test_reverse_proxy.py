"""The gateway behind a real reverse proxy (Debian's nginx, and Caddy), as homelabs run it, in
front of a real stub: streams reach the client unbuffered, the client's own address (not the
proxy's) is what the access log records and what latest-wins tells clients apart by, and a client
leaving the proxy still cancels the backend's generation. Clients connect from 127.0.0.2 and
127.0.0.3, so the proxy (127.0.0.1) and each client are told apart. Every judgement is the
stub's evidence (its log, its in-flight count) or the access log, never a timing."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import pytest

import proctree
import proxyproc
from gwproc import Gateway, config_for
from needs import require
from rawhttp import _request_bytes
from stubproc import start_stub, wait_for

pytestmark = pytest.mark.real  # nginx, caddy

CHAT = "/llm/v1/chat/completions"
# the first token now, the next ones ten minutes later: while the client holds the first, the
# stub has provably more to send
HELD = "[stub reasoning=0 content=3 first_ms=0 delay_ms=600000] hi"


@pytest.fixture(scope="module")
def stub():
    with start_stub("vllm", "--model", "m") as s:
        yield s


@pytest.fixture(scope="module")
def gw(stub):
    cfg = config_for({"gpu": {"url": stub.base, "kind": "vllm", "slots": 8}},
                     {"m": {"backend": "gpu"}, "coder": {"backend": "gpu", "upstream_model": "m", "supersede": True},
                      "fim": {"backend": "gpu", "upstream_model": "m", "fim": "Qwen2.5-Coder"}},
                     connections={"trusted_proxies": ["127.0.0.1"]})
    with Gateway(cfg) as g:
        yield g


@pytest.fixture(scope="module")
def nginx(gw):
    require(proxyproc.missing("nginx"))
    with proxyproc.nginx(urlsplit(gw.url).netloc) as p:
        yield p


class Client:
    """A curl-shaped client from a source address of its own, reading as the answer comes."""

    def __init__(self, url: str, body: dict, source: str, headers: dict | None = None) -> None:
        addr, req = _request_bytes(url, body, headers)
        self.sock = socket.create_connection(addr, timeout=60, source_address=(source, 0))
        self.sock.sendall(req)
        self.buf = b""

    def read_until(self, marker: bytes, what: str) -> bytes:
        while marker not in self.buf:
            got = self.sock.recv(65536)
            assert got, f"{what}: the answer ended without {marker!r}: {self.buf[-400:]!r}"
            self.buf += got
        return self.buf

    def read_all(self) -> bytes:
        while got := self.sock.recv(65536):
            self.buf += got
        return self.buf

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _chat(text: str) -> dict:
    return {"model": "m", "stream": True, "max_tokens": 50, "messages": [{"role": "user", "content": text}]}


def _line(stub, prefix: str, seq_after: int) -> list[str]:
    return [ln for ln in stub.log_lines()[seq_after:] if ln.startswith(prefix)]


def _settled(stub) -> None:
    wait_for(lambda: stub.stats()["in_flight"] == 0, 20)


def test_a_stream_through_nginx_is_unbuffered_names_its_client_and_is_cancelled_when_it_leaves(gw, nginx, stub):
    _settled(stub)
    seen = len(stub.log_lines())
    c = Client(nginx.url + CHAT, _chat(HELD), "127.0.0.2")
    try:
        c.read_until(b"Hello", "the first token")  # nginx's proxy_buffering is on: only the header lets it through
        # the backend's own evidence that more is to come: still generating, not completed
        assert stub.stats()["in_flight"] == 1 and not _line(stub, "completed", seen)
        assert b"200 OK" in c.buf.split(b"\r\n", 1)[0]
    finally:
        c.close()
    # the client left nginx: nginx closes its connection to the gateway, the gateway its to the stub
    line = wait_for(lambda: _line(stub, "cancelled", seen), 20)[0]
    assert "after 1 tokens" in line
    rec = wait_for(lambda: [r for r in gw.access_log() if r.get("outcome") == "cancelled_streaming"], 10)[-1]
    assert (rec["client"], rec["endpoint"], rec["path"]) == ("127.0.0.2", CHAT, CHAT)


def test_without_the_header_nginx_holds_a_stream_back_until_it_ends(gw, nginx, stub):
    """The control: the same stream through a location deaf to X-Accel-Buffering. Its first token
    reaches the client only together with the end of the answer (what every stream did before):
    nginx held the frames, sent over 0.6 s, and wrote them in one go at the backend's end."""
    _settled(stub)
    seen = len(stub.log_lines())
    c = Client(nginx.url + "/deaf" + CHAT, _chat("[stub reasoning=0 content=3 first_ms=0 delay_ms=300] hi"),
               "127.0.0.2")
    try:
        first = c.read_until(b"Hello", "the first token")
        assert b"[DONE]" in first, "nginx let a token through before the stream ended"
        c.read_all()
    finally:
        c.close()
    assert _line(stub, "completed", seen) or wait_for(lambda: _line(stub, "completed", seen), 10)


def test_a_forwarded_header_is_believed_from_nginx_only(gw, nginx, stub):
    _settled(stub)
    forged = {"X-Forwarded-For": "198.51.100.7"}
    # through nginx: what the client wrote stays left of the address nginx appends
    status = Client(nginx.url + CHAT, _chat("[stub content=2] a"), "127.0.0.3", forged).read_all()
    assert b" 200 " in status.split(b"\r\n", 1)[0]
    # straight to the gateway from 127.0.0.2, which is no trusted proxy: not believed at all
    direct = Client(gw.url + CHAT, _chat("[stub content=2] b"), "127.0.0.2", forged).read_all()
    assert b" 200 " in direct.split(b"\r\n", 1)[0]
    recs = wait_for(lambda: [r for r in gw.access_log() if r.get("outcome") == "ok" and r["path"] == CHAT][-2:], 10)
    assert [r["client"] for r in recs] == ["127.0.0.3", "127.0.0.2"]
    assert all(r["client"] != "198.51.100.7" for r in gw.access_log())


def test_two_clients_completions_through_nginx_do_not_supersede_each_other(gw, nginx, stub):
    _settled(stub)
    seen = len(stub.log_lines())
    body = lambda text: {"model": "coder", "prompt": text + " [stub delay_ms=100]", "max_tokens": 600,  # noqa: E731
                         "stream": True}
    url = nginx.url + "/llm/v1/completions"
    ann, bob = Client(url, body("ann"), "127.0.0.2"), Client(url, body("bob"), "127.0.0.3")
    newer = None
    try:
        ann.read_until(b" c1", "ann's completion")
        bob.read_until(b" c1", "bob's completion")
        # both generate at once: one proxy address in front, two clients behind it
        assert stub.stats()["in_flight"] == 2 and not _line(stub, "cancelled", seen)
        # ann's next completion replaces hers, and only hers
        newer = Client(url, body("ann again"), "127.0.0.2")
        newer.read_until(b" c1", "ann's newer completion")
        assert b"superseded" in ann.read_all()
        assert len(wait_for(lambda: _line(stub, "cancelled", seen), 10)) == 1
        bob.read_until(b" c3", "bob's completion, still running")
        wait_for(lambda: stub.stats()["in_flight"] == 2, 10)  # bob's and ann's newer one
    finally:
        for c in (ann, bob, newer):
            if c is not None:
                c.close()
    _settled(stub)
    sup = [r for r in gw.access_log() if r.get("outcome") == "cancelled_superseded"]
    assert [r["client"] for r in sup] == ["127.0.0.2"]


def test_every_dialects_stream_says_x_accel_buffering_no(gw, stub):
    """Straight to the gateway: the header on each dialect's streamed answer, whatever its framing."""
    msgs = [{"role": "user", "content": "[stub content=2] hi"}]
    cases = {
        "openai": (CHAT, {"model": "m", "stream": True, "messages": msgs}),
        "anthropic": ("/llm/v1/messages", {"model": "m", "stream": True, "max_tokens": 8, "messages": msgs}),
        "responses": ("/llm/v1/responses", {"model": "m", "stream": True, "input": "[stub content=2] hi"}),
        "gemini sse": ("/llm/v1beta/models/m:streamGenerateContent?alt=sse",
                       {"contents": [{"role": "user", "parts": [{"text": "[stub content=2] hi"}]}]}),
        "gemini array": ("/llm/v1beta/models/m:streamGenerateContent",
                         {"contents": [{"role": "user", "parts": [{"text": "[stub content=2] hi"}]}]}),
        "ollama": ("/api/chat", {"model": "m", "messages": msgs}),  # streams unless told not to
        "completions": ("/llm/v1/completions", {"model": "m", "stream": True, "prompt": "x", "max_tokens": 2}),
        "infill": ("/infill", {"model": "fim", "stream": True, "input_prefix": "a", "input_suffix": "b",
                               "n_predict": 2}),
        "ollama generate": ("/api/generate", {"model": "m", "prompt": "x", "options": {"num_predict": 2}}),
    }
    for name, (path, body) in cases.items():
        raw = Client(gw.url + path, body, "127.0.0.1").read_all()
        head = raw.split(b"\r\n\r\n", 1)[0].decode().lower()
        assert " 200 " in head.split("\r\n")[0], (name, raw[:300])
        assert "\r\nx-accel-buffering: no" in head, (name, head)
    # and each came in on its endpoint, as its route is written (a model in the path as {model})
    want = [p.split("?")[0].replace("/m:", "/{model}:") for p, _ in cases.values()]
    got = wait_for(lambda: [r["endpoint"] for r in gw.access_log() if r.get("client") == "127.0.0.1"][-len(want):], 10)
    assert got == want
    # a whole (non-streamed) answer has nothing to flush early: no header
    raw = Client(gw.url + CHAT, {"model": "m", "messages": msgs}, "127.0.0.1").read_all()
    assert "x-accel-buffering" not in raw.split(b"\r\n\r\n", 1)[0].decode().lower()


def test_the_same_through_caddy(gw, stub):
    require(proxyproc.missing("caddy"))
    _settled(stub)
    seen = len(stub.log_lines())
    with proxyproc.caddy(urlsplit(gw.url).netloc) as caddy:
        c = Client(caddy.url + CHAT, _chat(HELD), "127.0.0.2", {"X-Forwarded-For": "198.51.100.7"})
        try:
            c.read_until(b"Hello", "the first token through Caddy")
            assert stub.stats()["in_flight"] == 1 and not _line(stub, "completed", seen)
        finally:
            c.close()
        assert "after 1 tokens" in wait_for(lambda: _line(stub, "cancelled", seen), 20)[0]
        rec = wait_for(lambda: [r for r in gw.access_log() if r.get("outcome") == "cancelled_streaming"], 10)[-1]
        assert rec["client"] == "127.0.0.2"  # not the address the client wrote
        # NDJSON too (no text/event-stream for Caddy to know it by): passed on as it comes
        _settled(stub)
        seen = len(stub.log_lines())
        c = Client(caddy.url + "/api/chat", {"model": "m", "messages": [{"role": "user", "content": HELD}]},
                   "127.0.0.3")
        try:
            c.read_until(b"Hello", "Ollama's first line through Caddy")
            assert stub.stats()["in_flight"] == 1 and not _line(stub, "completed", seen)
        finally:
            c.close()
        assert "after 1 tokens" in wait_for(lambda: _line(stub, "cancelled", seen), 20)[0]


def test_nginx_is_gone_after_its_block(gw):
    require(proxyproc.missing("nginx"))
    with proxyproc.nginx(urlsplit(gw.url).netloc) as p:
        # the master and its worker (forked once the master listens)
        tree = wait_for(lambda: len(t := proctree.tree(p.proc.pid, include_root=True)) >= 2 and t, 10)
    assert proctree.survivors(tree) == []
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", p.port), timeout=2).close()
