"""Pure logic of issue 14 (the upstream is untrusted input too): Retry-After parsing, the model
rewrite over any JSON spelling, the bounded SSE and body readers, the decoder's verdicts, the
new error kinds in both dialects, and the new config keys with their defaults."""

from __future__ import annotations

import asyncio
import json
import time
from email.utils import formatdate

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend import config as cfgmod
from homelab_frontend.errors import GatewayError
from homelab_frontend.upstream.retry_after import MAX_S, retry_after_seconds
from homelab_frontend.surfaces.openai import errors as openai_errors
from homelab_frontend.surfaces.anthropic import errors as anthropic_errors
from homelab_frontend.surfaces.model_rewrite import ModelRewriter
from homelab_frontend.upstream.decode import (
    ChunkMalformed,
    ErrorBody,
    Malformed,
    decode_chunk,
    validate_completion,
    validate_embeddings,
)
from homelab_frontend.upstream.read import UpstreamTooLarge, sse_payloads

# -- Retry-After --------------------------------------------------------------------------------


@given(st.integers(min_value=0, max_value=10**9))
def test_retry_after_delay_seconds(n):
    assert retry_after_seconds(str(n)) == min(float(n), MAX_S)


@given(st.integers(min_value=-3600, max_value=80_000))
def test_retry_after_http_date(delta):
    now = 1_800_000_000.0
    got = retry_after_seconds(formatdate(now + delta, usegmt=True), now=now)
    assert got == max(0.0, float(delta))


@pytest.mark.parametrize("value", [None, "", "-5", "1.5", "soon", "Mon, 99 Foo 2026", "٣", "1" * 100,
                                   "Fri, 31 Dec 1999 23:59:59"])  # no zone: not an HTTP-date
def test_retry_after_that_cannot_be_read_is_none(value):
    assert retry_after_seconds(value) is None


def test_retry_after_obsolete_date_forms():
    now = time.time()
    assert 0 <= retry_after_seconds(time.strftime("%A, %d-%b-%y %H:%M:%S GMT", time.gmtime(now + 30)), now=now) <= 30


# -- the model rewrite --------------------------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=examples(300))
@given(
    others=st.dictionaries(st.text(max_size=6).filter(lambda k: k != "model"), _json_values, max_size=4),
    upstream=st.sampled_from(["fake", "internal/secret.gguf", "a\"b", "ünï", "/models/q4.gguf"]),
    position=st.integers(min_value=0, max_value=4),
    spacing=st.sampled_from([(",", ":"), (", ", ": "), (",", " : "), (" ,", ":  ")]),
    ensure_ascii=st.booleans(),
    escape_slash=st.booleans(),
)
def test_model_rewrite_is_exact_for_any_spacing_and_key_order(others, upstream, position, spacing, ensure_ascii,
                                                              escape_slash):
    items = list(others.items())
    items.insert(min(position, len(items)), ("model", upstream))
    raw = json.dumps(dict(items), separators=spacing, ensure_ascii=ensure_ascii)
    if escape_slash:
        raw = raw.replace("/", "\\/")  # PHP and some servers escape slashes
    rw = ModelRewriter("fake", "client-name")
    out = rw(raw.encode())
    doc = json.loads(out)
    assert doc["model"] == "client-name"
    assert {k: v for k, v in doc.items() if k != "model"} == others


def test_model_rewrite_compact_fast_path_and_a_learnt_name():
    rw = ModelRewriter("asked-for", "client")
    compact = b'{"id":"x","model":"asked-for","choices":[]}'
    assert rw(compact) == b'{"id":"x","model":"client","choices":[]}'
    # llama.cpp answers with the file it loaded: the needle is learnt, later chunks are fast again
    other = b'{"model":"/m/gemma.gguf","choices":[]}'
    assert json.loads(rw(other))["model"] == "client"
    assert rw.needle == b'"model":"/m/gemma.gguf"'
    assert rw(other) == b'{"model":"client","choices":[]}'
    # no model, or already the client's: the very bytes
    assert rw(b'{"choices":[]}') == b'{"choices":[]}'
    assert rw(b'{"model":"client"}') == b'{"model":"client"}'
    # "model": inside string content is escaped, so it is never touched
    text = b'{"model":"client","choices":[{"delta":{"content":"\\"model\\":\\"asked-for\\""}}]}'
    assert rw(text) == text


# -- bounded readers ----------------------------------------------------------------------------


class _Content:
    """What sse_payloads reads from: `readany()` returning the given reads, then b""."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = list(reads)

    async def readany(self) -> bytes:
        return self.reads.pop(0) if self.reads else b""


def _collect(reads: list[bytes], max_line: int) -> list[bytes]:
    async def go():
        out = []
        async for batch in sse_payloads(_Content(reads), "b", max_line):
            out.extend(batch)
        return out

    return asyncio.run(go())


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    parts, last = [], 0
    for p in points:
        if p > last:
            parts.append(data[last:p])
            last = p
    parts.append(data[last:])
    return [p for p in parts if p]


@settings(max_examples=examples(200))
@given(payloads=st.lists(st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b"\r" not in b),
                         min_size=1, max_size=8),
       cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=10))
def test_sse_payloads_under_the_limit_whatever_the_splits(payloads, cuts):
    stream = b"".join(b"data: " + p + b"\n\n" for p in payloads)
    assert _collect(_split(stream, cuts), max_line=1024) == payloads


@pytest.mark.parametrize("reads", [
    [b"data: " + b"x" * 3000],  # an open line, one read
    [b"data: ", b"x" * 1000, b"x" * 1000, b"x" * 1000],  # an open line over several reads
    [b"data: " + b"x" * 1500, b"x" * 1500 + b"\n\n"],  # a line that ends, but too long
    [b"data: ok\n\ndata: " + b"y" * 3000],  # the open tail after good lines
])
def test_sse_line_over_the_limit_raises_too_large(reads):
    with pytest.raises(UpstreamTooLarge) as exc:
        _collect(reads, max_line=2048)
    assert exc.value.kind == "upstream_too_large" and "max_line_bytes" in exc.value.message


def test_sse_a_line_of_exactly_the_limit_passes():
    line = b"data: " + b"z" * (2048 - 6)
    assert _collect([line[:1000], line[1000:], b"\n\n"], max_line=2048) == [b"z" * (2048 - 6)]


# -- the decoder's verdicts ---------------------------------------------------------------------

GOOD_COMPLETION = {"object": "chat.completion", "model": "m",
                   "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}]}


@pytest.mark.parametrize("body", [
    b"not json", b"<html>nginx</html>", b"", b"[1, 2]", b'"a string"',
    json.dumps({"choices": None}).encode(),
    json.dumps({"choices": [{"message": "x"}]}).encode(),
    json.dumps({"choices": [{"message": {"content": "a"}, "finish_reason": 42}]}).encode(),
    json.dumps({"choices": []}).encode(),
    json.dumps({**GOOD_COMPLETION, "object": "list"}).encode(),
])
def test_a_completion_that_is_not_one_is_malformed(body):
    with pytest.raises(Malformed):
        validate_completion(body)


def test_an_error_body_is_an_error_not_malformed():
    with pytest.raises(ErrorBody):
        validate_completion(b'{"error": {"message": "boom"}}')
    assert validate_completion(json.dumps(GOOD_COMPLETION).encode()).choices[0].message.content == "hi"


@pytest.mark.parametrize("payload", [
    b"{bad", b"<html>", b'{"choices": null}', b'{"choices": [{"delta": "x"}]}',
    b'{"choices": [{"delta": {"content": "a"}, "finish_reason": 42}]}', b'{"object": "list", "choices": []}',
    b'{"usage": {"prompt_tokens": "many"}}',
])
def test_a_chunk_that_is_not_one_is_malformed(payload):
    with pytest.raises(ChunkMalformed):
        decode_chunk(payload)


def test_embeddings_checked():
    assert validate_embeddings(b'{"object":"list","data":[{"embedding":[0.1]}],"model":"e"}').data
    for bad in (b"junk", b'{"data": null}', b'{"object": "list"}'):
        with pytest.raises(Malformed):
            validate_embeddings(bad)
    with pytest.raises(ErrorBody):
        validate_embeddings(b'{"error": "nope"}')


# -- error kinds in both dialects ---------------------------------------------------------------


def test_a_down_backend_is_503_down_not_overloaded_in_both_dialects():
    err = GatewayError("backend_down", "model 'm': backend 'a' is down", retry_after=10)
    status, body, headers = openai_errors.render_error(err)
    doc = json.loads(body)["error"]
    assert status == 503 and doc["code"] == "backend_down" and doc["type"] == "server_error"
    assert headers == {"retry-after": "10"}
    status, body, headers = anthropic_errors.render_error(err)
    assert status == 503 and json.loads(body)["error"]["type"] == "backend_down_error"
    assert headers == {"retry-after": "10"}


@pytest.mark.parametrize("kind", ["upstream_too_large", "upstream_malformed"])
def test_too_large_and_malformed_are_502_with_their_own_code(kind):
    err = GatewayError(kind, "x")
    status, body, _ = openai_errors.render_error(err)
    assert status == 502 and json.loads(body)["error"]["code"] == kind
    status, body, _ = anthropic_errors.render_error(err)
    assert status == 502 and json.loads(body)["error"]["type"] == "api_error"


def test_an_upstream_retry_after_is_passed_on():
    err = GatewayError("upstream_error", "busy", status=503, retry_after=retry_after_seconds("42"))
    assert openai_errors.render_error(err)[2] == {"retry-after": "42"}
    assert anthropic_errors.render_error(err)[2] == {"retry-after": "42"}


# -- config ---------------------------------------------------------------------------------------


def test_new_limits_and_timeouts_defaults_and_problems():
    cfg = cfgmod.parse({"backends": {"b": {"url": "http://127.0.0.1:1/v1"}}})
    assert cfg.backends["b"].limits.max_line_bytes == 1 << 20
    assert cfg.backends["b"].limits.max_body_bytes == 16 << 20
    assert (cfg.connections.head_timeout_s, cfg.connections.keepalive_timeout_s,
            cfg.connections.max_connections) == (15.0, 75.0, 1000)
    with pytest.raises(cfgmod.ConfigError) as exc:
        cfgmod.parse({"backends": {"b": {"url": "http://127.0.0.1:1/v1", "limits": {"max_line_bytes": 10}}},
                      "connections": {"head_timeout_s": 0, "max_connections": 0, "idle": 3}})
    text = "\n".join(exc.value.problems)
    assert "backends.b.limits.max_line_bytes: must be at least 1024" in text
    assert "connections.idle: unknown key" in text
