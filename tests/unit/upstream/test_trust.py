"""Pure logic of issue 14 (the upstream is untrusted input too): the decoder's verdicts, the
new error kinds in both dialects, and the new config keys with their defaults. (Its Retry-After
parsing, model rewrite and bounded readers are in test_retry_after.py, tests/unit/surfaces/
test_model_rewrite.py and test_read.py.)"""

from __future__ import annotations

import json

import pytest

from homelab_frontend import config as cfgmod
from homelab_frontend.errors import GatewayError
from homelab_frontend.upstream.retry_after import retry_after_seconds
from homelab_frontend.surfaces.openai import errors as openai_errors
from homelab_frontend.surfaces.anthropic import errors as anthropic_errors
from homelab_frontend.upstream.decode import (
    ChunkMalformed,
    ErrorBody,
    Malformed,
    decode_chunk,
    validate_completion,
    validate_embeddings,
)

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
