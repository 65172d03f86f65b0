"""Stored responses in Redis when a `cluster:` section is configured: a conversation started on
one replica continues on another, retrieve/delete work from either, another key's response is a
404, and the store stays under its max_bytes by dropping the oldest. Needs redis-server
(.ci/deps/redis.sh): without it these tests fail, they do not skip."""

from __future__ import annotations

import openai
import pytest

from conftest import standard_config
from gwproc import Gateway
from redisproc import RedisServer


@pytest.fixture
def replicas(vllm_stub, ollama_stub):
    with RedisServer() as redis:
        def cfg(replica: str, **store) -> dict:
            return standard_config(vllm_stub.base, ollama_stub.base,
                                   cluster={"redis_url": redis.url, "replica_id": replica, "lease_s": 2},
                                   auth={"keys": [{"name": "alice", "key": "sk-a"}, {"name": "bob", "key": "sk-b"}]},
                                   responses={"store": store} if store else {})
        with Gateway(cfg("r1")) as a, Gateway(cfg("r2", max_bytes=8000)) as b:
            yield a, b, redis


def _client(gw: Gateway, key: str = "sk-a") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.base, api_key=key, max_retries=0)


def test_any_replica_continues_a_conversation(replicas, vllm_stub, stubs):
    a, b, redis = replicas
    r1 = _client(a).responses.create(model="reasoning", input="first [stub content=2]")
    r2 = _client(b).responses.create(model="reasoning", input="second [stub content=2]", previous_response_id=r1.id)
    msgs = vllm_stub.requests()[-1]["body"]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"] and msgs[1]["content"] == r1.output_text
    assert _client(a).responses.retrieve(r2.id).id == r2.id
    assert redis.client().exists(f"hlf:responses:r:{r1.id}")
    with pytest.raises(openai.NotFoundError):
        _client(b, "sk-b").responses.retrieve(r1.id)
    _client(b).responses.delete(r1.id)
    with pytest.raises(openai.NotFoundError):
        _client(a).responses.retrieve(r1.id)
    assert not redis.client().exists(f"hlf:responses:r:{r1.id}")


def test_redis_store_is_bounded_by_size_and_ttl(replicas, stubs):
    a, b, redis = replicas
    ids = [_client(b).responses.create(model="reasoning", input=f"n{i} [stub content=3]").id for i in range(15)]
    r = redis.client()
    assert int(r.get("hlf:responses:bytes")) <= 8000
    assert not r.exists(f"hlf:responses:r:{ids[0]}") and r.exists(f"hlf:responses:r:{ids[-1]}")
    assert r.zcard("hlf:responses:index") == sum(1 for i in ids if r.exists(f"hlf:responses:r:{i}"))
    ttl_ms = r.pttl(f"hlf:responses:r:{ids[-1]}")
    assert 0 < ttl_ms <= 30 * 24 * 3600 * 1000
