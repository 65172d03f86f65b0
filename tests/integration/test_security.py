"""Keys, limits and upstream hygiene, against real gateway processes in front of real upstreams.

Keys: accepted as x-api-key or Authorization: Bearer on both surfaces; 401 / 403 / 429 in each
dialect's shape; the client's key never reaches the upstream, the backend's own key does; no key
ever shows in the logs, an error, the admin API or the dashboard. Limits: body, headers, JSON
depth, number of messages and tools. Upstream hygiene: redirects are not followed, upstream
tracebacks and internal addresses do not reach the client. And the start-up warning for an open
gateway on all interfaces.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import secrets
import socket
import threading
from urllib.parse import urlsplit

import anthropic
import openai
import pytest
from aiohttp import web

from gwproc import Gateway, config_for
from stubproc import start_stub, wait_for

# Distinctive secrets, so that a search of every output for them cannot miss a leak.
ALICE = "sk-alice-" + secrets.token_hex(12)
CAROL = "sk-carol-" + secrets.token_hex(12)
DAVE = "sk-dave-" + secrets.token_hex(12)
EVE = "sk-eve-literal-" + secrets.token_hex(12)  # a literal `key:` in the config
ADMIN = "sk-admin-" + secrets.token_hex(12)
BACKEND = "sk-backend-" + secrets.token_hex(12)  # the upstream's own key (api_key_env)
WRONG = "sk-wrong-" + secrets.token_hex(12)
SECRETS = (ALICE, CAROL, DAVE, EVE, ADMIN, BACKEND, WRONG)

ENV = {"ALICE_KEY": ALICE, "CAROL_KEY": CAROL, "DAVE_KEY": DAVE, "HF_ADMIN_KEY": ADMIN, "GPU0_KEY": BACKEND}

LIMITS = {"max_body_bytes": 256 * 1024, "max_header_bytes": 8192, "max_json_depth": 32,
          "max_messages": 50, "max_tools": 8}

HI = [{"role": "user", "content": "hi"}]

# (dialect, method, path, a valid body for model m1)
ENDPOINTS = [
    ("openai", "POST", "/llm/v1/chat/completions", {"model": "m1", "max_tokens": 5, "messages": HI}),
    ("openai", "GET", "/llm/v1/models", None),
    ("openai", "POST", "/llm/v1/embeddings", {"model": "m1", "input": "hi"}),
    ("anthropic", "POST", "/llm/v1/messages", {"model": "m1", "max_tokens": 5, "messages": HI}),
    ("anthropic", "POST", "/llm/v1/messages/count_tokens", {"model": "m1", "messages": HI}),
]


@pytest.fixture(scope="module")
def keyed_stub():
    with start_stub("vllm", "--model", "m1", "--model", "m2", "--api-key", BACKEND) as s:
        yield s


@pytest.fixture(scope="module")
def gw(keyed_stub):
    cfg = config_for(
        {"gpu0": {"url": keyed_stub.base, "kind": "vllm", "slots": 4, "api_key_env": "GPU0_KEY"}},
        {"m1": {"backend": "gpu0"}, "m2": {"backend": "gpu0"}},
        aliases={"claude-*": "m1"},
        auth={
            "keys": [
                {"name": "alice", "key_env": "ALICE_KEY"},
                {"name": "carol", "key_env": "CAROL_KEY", "models": ["m1"]},
                {"name": "dave", "key_env": "DAVE_KEY", "max_concurrent": 1},
                {"name": "eve", "key": EVE},
            ],
            "admin_key_env": "HF_ADMIN_KEY",
        },
        limits=LIMITS,
    )
    with Gateway(cfg, env=ENV) as g:
        wait_for(lambda: g.get("/readyz")[0] == 200, 10)
        yield g


# -- helpers ---------------------------------------------------------------------------------


def call(g: Gateway, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """One request on a fresh connection -> (status, lower-cased headers, body)."""
    u = urlsplit(g.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        hdrs = {"content-type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def assert_error(dialect: str, status: int, raw: bytes, want_status: int, want_type: str) -> dict:
    assert status == want_status, raw
    doc = json.loads(raw)
    if dialect == "anthropic":
        assert doc["type"] == "error" and set(doc["error"]) == {"type", "message"}, doc
        assert doc["error"]["type"] == want_type, doc
        return doc["error"]
    assert set(doc) == {"error"} and set(doc["error"]) == {"message", "type", "param", "code"}, doc
    assert doc["error"]["type"] == want_type, doc
    return doc["error"]


def admin_requests(g: Gateway) -> dict:
    return g.admin({"x-api-key": ADMIN})


# -- keys ------------------------------------------------------------------------------------


# (shape, method, path, body): every surface but Gemini's, and the gateway's own endpoints
# (GET /llm/v1/models is Gemini's for a request with ?key=: Google's clients list models there)
NOT_GEMINI = [
    *[(d, m, p, b) for d, m, p, b in ENDPOINTS if (m, p) != ("GET", "/llm/v1/models")],
    ("openai", "POST", "/v1/chat/completions", {"model": "m1", "max_tokens": 5, "messages": HI}),
    ("responses", "POST", "/llm/v1/responses", {"model": "m1", "max_output_tokens": 5, "input": "hi"}),
    ("ollama", "POST", "/api/chat", {"model": "m1", "messages": HI, "stream": False}),
    ("ollama", "GET", "/api/tags", None),
    ("ollama", "POST", "/llm/api/generate", {"model": "m1", "prompt": "hi", "stream": False}),
    ("openai", "GET", "/llm/v1/usage", None),
    ("admin", "GET", "/admin/requests", None),
    ("admin", "GET", "/metrics", None),
]


@pytest.mark.parametrize("shape, method, path, body", NOT_GEMINI, ids=[f"{m} {p}" for _, m, p, _ in NOT_GEMINI])
def test_a_key_in_the_url_is_refused_off_the_gemini_routes(gw, shape, method, path, body):
    """`?key=` is Google's clients' way, and only the Gemini routes take it: a URL ends up in
    proxy logs and shell history. Elsewhere a valid key there is no key, and the 401 comes in the
    surface's own shape; the key is written nowhere."""
    key = ADMIN if shape == "admin" else ALICE
    status, _, raw = call(gw, method, f"{path}?key={key}", body)
    assert status == 401, (path, raw)
    doc = json.loads(raw)
    if shape == "ollama":
        assert set(doc) == {"error"} and "?key=" in doc["error"], doc
    elif shape == "admin":
        assert doc["error"]["type"] == "authentication_error", doc
    else:
        err = assert_error("anthropic" if shape == "anthropic" else "openai", status, raw, 401, "authentication_error")
        if path != "/llm/v1/usage":
            assert "?key=" in err["message"] and "Gemini" in err["message"], err
    assert key.encode() not in raw
    # the same key in a header is let in, so the 401 above was the URL's doing
    status, _, raw = call(gw, method, path, body, {"authorization": f"Bearer {key}"})
    assert status == 200, (path, raw)
    assert key not in gw.stderr()


def test_the_gemini_routes_take_a_key_in_the_url_and_log_it_nowhere(gw):
    body = {"contents": [{"parts": [{"text": "hi"}]}]}
    for path in ("/llm/v1beta/models/m1:generateContent", "/llm/v1/models/m1:generateContent"):
        status, _, raw = call(gw, "POST", f"{path}?key={ALICE}", body)
        assert status == 200, raw
        status, _, raw = call(gw, "POST", f"{path}?key={WRONG}", body)
        assert status == 401 and json.loads(raw)["error"]["status"] == "UNAUTHENTICATED", raw
    # GET /llm/v1/models: a ?key= makes it Google's list, and the key is taken
    status, _, raw = call(gw, "GET", f"/llm/v1/models?key={ALICE}")
    assert status == 200 and "models" in json.loads(raw), raw
    status, _, raw = call(gw, "GET", "/llm/v1beta/models", None, {"x-goog-api-key": ALICE})
    assert status == 200, raw
    log = gw.stderr()
    assert ALICE not in log and WRONG not in log
    lines = [r for r in gw.access_log() if r.get("dialect") == "gemini"]
    assert lines and all("key=" not in json.dumps(r) for r in lines)
    assert {r["key"] for r in lines if r["status"] == 200} == {"alice"}  # its name, never the key


def test_sdks_authenticate_with_either_header_form(gw, keyed_stub):
    a = anthropic.Anthropic(base_url=gw.llm, api_key=ALICE, max_retries=0)  # x-api-key
    assert a.messages.create(model="m1", max_tokens=5, messages=HI).content[0].text
    a = anthropic.Anthropic(base_url=gw.llm, auth_token=ALICE, max_retries=0)  # Bearer
    assert a.messages.create(model="claude-x", max_tokens=5, messages=HI).model == "claude-x"
    o = openai.OpenAI(base_url=gw.base, api_key=ALICE, max_retries=0)  # Bearer
    assert o.chat.completions.create(model="m1", max_tokens=5, messages=HI).choices[0].message.content
    assert [m.id for m in o.models.list().data] == ["m1", "m2"]
    # the other header form on the OpenAI surface, and a literal key from the config
    body = {"model": "m1", "max_tokens": 5, "messages": HI}
    assert call(gw, "POST", "/llm/v1/chat/completions", body, {"x-api-key": EVE})[0] == 200
    assert call(gw, "POST", "/llm/v1/messages", body, {"authorization": f"bearer {EVE}"})[0] == 200

    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=gw.llm, api_key=WRONG, max_retries=0).messages.create(
            model="m1", max_tokens=5, messages=HI)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gw.base, api_key=WRONG, max_retries=0).models.list()


@pytest.mark.parametrize("dialect,method,path,body", ENDPOINTS, ids=[e[2] for e in ENDPOINTS])
def test_missing_or_wrong_key_is_401_on_every_endpoint(gw, dialect, method, path, body):
    for headers in ({}, {"x-api-key": WRONG}, {"authorization": f"Bearer {WRONG}"},
                    {"authorization": ALICE}, {"x-api-key": ALICE[:-1]}):  # no scheme / one char short
        status, resp_headers, raw = call(gw, method, path, body, headers)
        err = assert_error(dialect, status, raw, 401, "authentication_error")
        assert resp_headers["request-id"].startswith("req_")
        if dialect == "openai":
            assert err["code"] == "invalid_api_key"
    # The key is checked before the body is read: a stranger's garbage is not even parsed.
    if method == "POST":
        status, _, raw = call(gw, method, path, b"{not json", {})
        assert_error(dialect, status, raw, 401, "authentication_error")
        status, _, raw = call(gw, method, path, b"{not json", {"x-api-key": ALICE})
        assert_error(dialect, status, raw, 400, "invalid_request_error")
    else:
        assert call(gw, method, path, None, {"x-api-key": ALICE})[0] == 200


def test_model_the_key_may_not_use_is_403_and_hidden_from_models(gw):
    body = {"model": "m2", "max_tokens": 5, "messages": HI}
    for dialect, path in (("openai", "/llm/v1/chat/completions"), ("anthropic", "/llm/v1/messages"),
                          ("anthropic", "/llm/v1/messages/count_tokens")):
        status, _, raw = call(gw, "POST", path, body, {"x-api-key": CAROL})
        err = assert_error(dialect, status, raw, 403, "permission_error")
        assert "carol" in err["message"] and "m2" in err["message"] and CAROL not in err["message"]
    status, _, raw = call(gw, "POST", "/llm/v1/embeddings", {"model": "m2", "input": "x"}, {"x-api-key": CAROL})
    assert_error("openai", status, raw, 403, "permission_error")
    # m1 directly and through the alias are allowed
    assert call(gw, "POST", "/llm/v1/messages", {**body, "model": "m1"}, {"x-api-key": CAROL})[0] == 200
    assert call(gw, "POST", "/llm/v1/messages", {**body, "model": "claude-3"}, {"x-api-key": CAROL})[0] == 200
    status, _, raw = call(gw, "GET", "/llm/v1/models", None, {"authorization": f"Bearer {CAROL}"})
    assert status == 200 and [m["id"] for m in json.loads(raw)["data"]] == ["m1"]
    with pytest.raises(anthropic.PermissionDeniedError):
        anthropic.Anthropic(base_url=gw.llm, api_key=CAROL, max_retries=0).messages.create(
            model="m2", max_tokens=5, messages=HI)


def _hold_request(g: Gateway, key: str) -> socket.socket:
    """A request that waits for upstream headers for a long time, held open on a raw socket."""
    u = urlsplit(g.url)
    body = json.dumps({"model": "m1", "max_tokens": 5,
                       "messages": [{"role": "user", "content": "[stub headers_ms=20000]"}]}).encode()
    s = socket.create_connection((u.hostname, u.port), timeout=30)
    s.sendall(b"POST /llm/v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
              + f"x-api-key: {key}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
    return s


def test_over_max_concurrent_is_429_in_each_dialect_and_frees_on_disconnect(gw):
    held = _hold_request(gw, DAVE)
    try:
        wait_for(lambda: [r["key"] for r in admin_requests(gw)["requests"]] == ["dave"], 5)
        body = {"model": "m1", "max_tokens": 5, "messages": HI}
        for dialect, path in (("openai", "/llm/v1/chat/completions"), ("anthropic", "/llm/v1/messages")):
            status, headers, raw = call(gw, "POST", path, body, {"x-api-key": DAVE})
            err = assert_error(dialect, status, raw, 429, "rate_limit_error")
            assert "dave" in err["message"] and "max_concurrent" in err["message"]
            assert headers["retry-after"] == "1"
        # other keys are not limited by dave's count
        assert call(gw, "POST", "/llm/v1/messages", body, {"x-api-key": ALICE})[0] == 200
    finally:
        held.close()
    wait_for(lambda: admin_requests(gw)["requests"] == [], 5)
    assert call(gw, "POST", "/llm/v1/messages", {"model": "m1", "max_tokens": 5, "messages": HI},
                {"x-api-key": DAVE})[0] == 200


def test_client_key_and_headers_never_reach_the_upstream_but_backend_key_does(gw, keyed_stub):
    keyed_stub.reset()
    sneaky = {"cookie": "session=abc", "x-forwarded-for": "6.6.6.6", "proxy-authorization": f"Basic {WRONG}",
              "x-upstream-url": "http://127.0.0.1:1/evil", "te": "trailers", "x-custom": "client-value"}
    body = {"model": "m1", "max_tokens": 5, "messages": HI}
    assert call(gw, "POST", "/llm/v1/chat/completions", body, {"authorization": f"Bearer {ALICE}", **sneaky})[0] == 200
    assert call(gw, "POST", "/llm/v1/messages", {**body, "stream": True}, {"x-api-key": ALICE, **sneaky})[0] == 200
    seen = keyed_stub.requests()
    assert len(seen) == 2
    for r in seen:
        h = r["headers"]
        assert h["authorization"] == f"Bearer {BACKEND}"  # the backend's own key (api_key_env)
        assert "x-api-key" not in h
        for name in sneaky:
            assert name not in h, name
        everything = json.dumps(r)
        assert ALICE not in everything and WRONG not in everything


def test_no_secret_in_logs_errors_admin_or_dashboard(gw):
    outputs: list[str] = []
    body = {"model": "m1", "max_tokens": 5, "messages": HI}
    for headers in ({"x-api-key": ALICE}, {"x-api-key": WRONG}, {"authorization": f"Bearer {WRONG}"},
                    {"x-api-key": CAROL}, {"x-api-key": EVE}):
        for path in ("/llm/v1/messages", "/llm/v1/chat/completions"):
            for b in (body, {**body, "model": "m2"}, b"{broken"):
                outputs.append(call(gw, "POST", path, b, headers)[2].decode())
    outputs.append(call(gw, "GET", "/", None, {"x-api-key": ALICE})[2].decode(errors="replace"))
    outputs.append(json.dumps(admin_requests(gw)))
    for path in ("/metrics", "/admin/stats", "/readyz"):
        outputs.append(call(gw, "GET", path, None, {"x-api-key": ADMIN})[2].decode(errors="replace"))
    # the admin API wants the admin key: none, a client key, a wrong one are refused
    for headers in ({}, {"x-api-key": ALICE}, {"authorization": f"Bearer {WRONG}"}):
        status, _, raw = call(gw, "GET", "/admin/requests", None, headers)
        assert status == 401, raw
        outputs.append(raw.decode())
    log = gw.stderr()
    outputs.append(log)
    for text in outputs:
        for secret in SECRETS:
            assert secret not in text
    names = {r.get("key") for r in gw.access_log()}
    assert {"alice", "carol", "eve"} <= names  # the key's name is logged, never the key


# -- limits ----------------------------------------------------------------------------------


def _raw_exchange(g: Gateway, head: bytes, body_parts: list[bytes]) -> tuple[int, bytes]:
    """Send a request head and body parts, tolerate the server hanging up early, read the answer."""
    u = urlsplit(g.url)
    with socket.create_connection((u.hostname, u.port), timeout=30) as s:
        s.sendall(head)
        try:
            for part in body_parts:
                s.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass
        buf = b""
        try:
            while b"\r\n\r\n" not in buf or len(buf) < buf.index(b"\r\n\r\n") + 4 + _length(buf):
                got = s.recv(65536)
                if not got:
                    break
                buf += got
        except ConnectionResetError:
            pass
    head_, _, rest = buf.partition(b"\r\n\r\n")
    return int(head_.split(b" ")[1]), rest


def _length(buf: bytes) -> int:
    for line in buf.split(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


@pytest.mark.parametrize("dialect,path", [("anthropic", "/llm/v1/messages"), ("openai", "/llm/v1/chat/completions")])
def test_body_over_the_limit_is_413(gw, dialect, path):
    big = json.dumps({"model": "m1", "max_tokens": 5,
                      "messages": [{"role": "user", "content": "x" * (300 * 1024)}]}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nx-api-key: {ALICE}\r\n"
            "connection: close\r\n").encode()
    status, raw = _raw_exchange(gw, head + f"content-length: {len(big)}\r\n\r\n".encode(), [big])
    err = assert_error(dialect, status, raw, 413, "request_too_large" if dialect == "anthropic" else "invalid_request_error")
    assert "limits.max_body_bytes" in err["message"]
    # chunked, no length announced: counted while read
    chunks = [b"%x\r\n%s\r\n" % (len(big[i:i + 65536]), big[i:i + 65536]) for i in range(0, len(big), 65536)]
    status, raw = _raw_exchange(gw, head + b"transfer-encoding: chunked\r\n\r\n", chunks + [b"0\r\n\r\n"])
    err = assert_error(dialect, status, raw, 413, "request_too_large" if dialect == "anthropic" else "invalid_request_error")
    if dialect == "openai":
        assert err["code"] == "request_too_large"
    # just under the limit is fine
    ok = json.dumps({"model": "m1", "max_tokens": 5,
                     "messages": [{"role": "user", "content": "x" * (250 * 1024)}]}).encode()
    assert call(gw, "POST", path, ok, {"x-api-key": ALICE})[0] == 200


def test_headers_over_the_limit_are_refused_without_echoing_them(gw):
    many = {f"x-filler-{i}": "v" * 1000 for i in range(10)}  # each small, 10 KB together
    for dialect, path in (("anthropic", "/llm/v1/messages"), ("openai", "/llm/v1/chat/completions")):
        status, _, raw = call(gw, "POST", path, {"model": "m1", "max_tokens": 5, "messages": HI},
                              {"x-api-key": ALICE, **many})
        err = assert_error(dialect, status, raw, 413, "request_too_large" if dialect == "anthropic" else "invalid_request_error")
        assert "limits.max_header_bytes" in err["message"]
    # One header past aiohttp's own cap (4x the limit) is refused by its parser with a bare 400;
    # what the client sent there (a key, say) is not written to the log.
    marker = "sk-giant-" + secrets.token_hex(8)
    status, _, raw = call(gw, "POST", "/llm/v1/messages", b"{}", {"authorization": "Bearer " + marker * 3000})
    assert status == 400
    assert marker not in gw.stderr()
    assert call(gw, "GET", "/llm/v1/models", None, {"x-api-key": ALICE})[0] == 200  # still serving


def _deep(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("dialect,path", [("anthropic", "/llm/v1/messages"), ("openai", "/llm/v1/chat/completions"),
                                          ("anthropic", "/llm/v1/messages/count_tokens"), ("openai", "/llm/v1/embeddings")])
def test_json_depth_and_counts_are_limited_with_clear_errors(gw, dialect, path):
    auth = {"x-api-key": ALICE}
    base = {"model": "m1", "max_tokens": 5, "messages": HI, "input": "hi"}

    def tool(name: str, schema: dict) -> dict:
        if dialect == "openai":
            return {"type": "function", "function": {"name": name, "parameters": schema}}
        return {"name": name, "input_schema": schema}

    # 100,000 nested arrays: far past what msgspec decodes (RecursionError inside), still a 400
    status, _, raw = call(gw, "POST", path, b"[" * 100_000 + b"]" * 100_000, auth)
    err = assert_error(dialect, status, raw, 400, "invalid_request_error")
    assert "limits.max_json_depth" in err["message"]
    # past our limit but well within the decoder's: the error names the field
    status, _, raw = call(gw, "POST", path, {**base, "tools": [tool("t", _deep(20))]}, auth)
    err = assert_error(dialect, status, raw, 400, "invalid_request_error")
    assert err["message"].startswith("tools[0].") and "limits.max_json_depth" in err["message"]
    if dialect == "openai":
        assert err["param"].startswith("tools[0].function.parameters")
    if path.endswith("embeddings"):
        return  # neither messages nor tools there
    status, _, raw = call(gw, "POST", path, {**base, "messages": HI * 51}, auth)
    err = assert_error(dialect, status, raw, 400, "invalid_request_error")
    assert err["message"].startswith("messages: 51 messages") and "limits.max_messages" in err["message"]
    status, _, raw = call(gw, "POST", path, {**base, "tools": [tool(f"t{i}", {"type": "object"}) for i in range(9)]}, auth)
    err = assert_error(dialect, status, raw, 400, "invalid_request_error")
    assert err["message"].startswith("tools: 9 tools") and "limits.max_tools" in err["message"]
    if dialect == "openai":
        assert err["param"] == "tools"
    # at the limits: accepted
    ok = {**base, "messages": HI * 49 + [{"role": "user", "content": "[stub content=1]"}],
          "tools": [tool(f"t{i}", _deep(10)) for i in range(8)]}
    status, _, raw = call(gw, "POST", path, ok, auth)
    assert status == 200, raw


# -- start-up warning ------------------------------------------------------------------------


def test_open_gateway_on_all_interfaces_warns_at_start(keyed_stub):
    cfg = config_for({"gpu0": {"url": keyed_stub.base, "api_key_env": "GPU0_KEY"}}, {"m1": {"backend": "gpu0"}})
    with Gateway(cfg, env=ENV, extra_args=("--host", "0.0.0.0")) as g:
        err = g.stderr()
    assert "WARNING: listening on 0.0.0.0 without client keys" in err
    cfg["auth"] = {"keys": [{"name": "alice", "key_env": "ALICE_KEY"}]}
    with Gateway(cfg, env=ENV, extra_args=("--host", "0.0.0.0")) as g:
        err = g.stderr()
    assert "without client keys" not in err and "open to anyone" not in err
    assert ALICE not in err


# -- upstream hygiene --------------------------------------------------------------------------

TRACE_MSG = ("worker at http://10.20.30.40:8001/generate failed, peer gpu3.lan:8000\n"
             "Traceback (most recent call last):\n  File \"/opt/vllm/engine.py\", line 99, in step\n"
             "RuntimeError: CUDA error on 10.20.30.40")
LEAKS = ("10.20.30.40", "gpu3.lan", "Traceback", "/opt/vllm", "engine.py")


class Trap:
    """A port that only counts who connects to it."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            self.hits += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


class HostileUpstream:
    """A one-off OpenAI-shaped upstream: redirects elsewhere, or fails with a traceback that
    names internal addresses, depending on the model asked for."""

    MODELS = ("redirect", "crash", "crash-stream")

    def __init__(self, trap_port: int) -> None:
        self.trap = f"http://127.0.0.1:{trap_port}"
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)
        self.base = f"http://127.0.0.1:{self.port}/v1"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_route("*", "/{tail:.*}", self.elsewhere)  # /metrics, /tokenize, ...
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        self._ready.set()
        self.loop.run_forever()

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": m, "object": "model"} for m in self.MODELS]})

    async def elsewhere(self, request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(self.trap + request.path)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body["model"] == "redirect":
            raise web.HTTPTemporaryRedirect(self.trap + "/v1/chat/completions")
        if body["model"] == "crash":
            return web.json_response({"error": {"message": TRACE_MSG, "type": "InternalServerError"}}, status=500)
        if not body.get("stream"):  # an error in a 200 body, as some servers send
            return web.json_response({"object": "error", "error": {"message": TRACE_MSG, "code": 500}})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        chunk = {"id": "c1", "object": "chat.completion.chunk", "model": body["model"],
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": "partial"}, "finish_reason": None}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await resp.write(b"data: " + json.dumps({"error": {"message": TRACE_MSG, "code": 500}}).encode() + b"\n\n")
        await resp.write_eof()
        return resp

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def hostile():
    trap = Trap()
    up = HostileUpstream(trap.port)
    cfg = config_for({"evil": {"url": up.base, "kind": "vllm", "health_interval_s": 0.2}},
                     {m: {"backend": "evil"} for m in HostileUpstream.MODELS})
    try:
        with Gateway(cfg) as g:
            wait_for(lambda: g.get("/readyz")[0] == 200, 10)
            yield g, trap
    finally:
        up.close()
        trap.close()


@pytest.mark.parametrize("dialect,path", [("anthropic", "/llm/v1/messages"), ("openai", "/llm/v1/chat/completions")])
def test_upstream_redirect_is_not_followed(hostile, dialect, path):
    g, trap = hostile
    for stream in (False, True):
        status, _, raw = call(g, "POST", path, {"model": "redirect", "max_tokens": 5, "messages": HI, "stream": stream})
        err = assert_error(dialect, status, raw, 502, "api_error" if dialect == "anthropic" else "upstream_error")
        assert "307" in err["message"] and str(trap.port) not in err["message"]
    status, _, raw = call(g, "POST", "/llm/v1/messages/count_tokens", {"model": "redirect", "messages": HI})
    assert status == 200  # /tokenize redirected: not followed, the count is an estimate
    # The health probe's GET /metrics is redirected too, every 0.2 s (and at least once before
    # /readyz said ready, which the fixture waited for).
    assert g.admin()["backends"]["evil"]["upstream_running"] is None
    assert trap.hits == 0


@pytest.mark.parametrize("dialect,path", [("anthropic", "/llm/v1/messages"), ("openai", "/llm/v1/chat/completions")])
def test_upstream_tracebacks_and_addresses_do_not_reach_the_client(hostile, dialect, path):
    g, _ = hostile
    status, _, raw = call(g, "POST", path, {"model": "crash", "max_tokens": 5, "messages": HI})
    err = assert_error(dialect, status, raw, 500, "api_error")
    assert err["message"] == "backend 'evil' answered 500: worker at <backend> failed, peer <backend>"
    for leak in LEAKS:
        assert leak not in raw.decode()
    for stream in (True, False):
        status, _, raw = call(g, "POST", path, {"model": "crash-stream", "max_tokens": 5, "messages": HI, "stream": stream})
        text = raw.decode()
        assert "worker at <backend>" in text, text  # the upstream's message is passed on ...
        for leak in LEAKS:  # ... without its traceback and addresses
            assert leak not in text, text


def test_metrics_need_the_admin_key_when_one_is_configured(vllm_stub):
    from gwproc import Gateway as _Gateway, config_for as _config_for

    cfg = _config_for({"b": vllm_stub.base}, {"m": {"backend": "b"}},
                      auth={"keys": [{"name": "alice", "key": "sk-alice-1"}], "admin_key_env": "HLF_TEST_ADMIN"})
    with _Gateway(cfg, env={"HLF_TEST_ADMIN": "adm-secret-9"}) as gw:
        assert gw.get("/metrics")[0] == 401
        assert gw.get("/metrics", {"authorization": "Bearer sk-alice-1"})[0] == 401
        status, text = gw.get("/metrics", {"authorization": "Bearer adm-secret-9"})
        assert status == 200 and "hlf_backend_slots" in text and "adm-secret-9" not in text
