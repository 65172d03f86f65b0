"""Client keys (policy/auth.py): who is asking, which models they may use, how many at once."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import make_mocked_request

from homelab_frontend import config as cfgmod
from homelab_frontend.errors import GatewayError
from homelab_frontend.policy.auth import ANONYMOUS, Auth, Principal


def _auth(**kw) -> Auth:
    keys = [cfgmod.AuthKey(name="alice", key_env="A_KEY", max_concurrent=1, priority=3, models=["qwen*"]),
            cfgmod.AuthKey(name="bob", key="bob-secret")]
    return Auth(cfgmod.Auth(keys=keys, admin_key_env="ADMIN"), env={"A_KEY": "alice-secret", "ADMIN": "root", **kw})


def _req(**headers):
    return make_mocked_request("POST", "/llm/v1/messages", headers=headers)


class _Route:
    def __init__(self, client_model: str, model: str | None = None) -> None:
        self.client_model, self.model = client_model, model or client_model
        self.requested = self.model


def test_open_without_keys():
    auth = Auth(cfgmod.Auth(), env={})
    assert auth.open
    assert auth.authenticate(_req()) is ANONYMOUS
    assert auth.is_admin(_req())  # open and no admin key: a trusted-network setup, admin allowed
    assert auth.may_read_metrics(_req())


def test_with_client_keys_but_no_admin_key_admin_calls_are_refused():
    auth = Auth(cfgmod.Auth(keys=[cfgmod.AuthKey(name="bob", key="bob-secret")]), env={})
    assert not auth.is_admin(_req(Authorization="Bearer bob-secret"))
    assert auth.may_read_metrics(_req())  # metrics stay open to a LAN scraper


def test_either_header_form_and_the_principal_it_names():
    auth = _auth()
    p = auth.authenticate(_req(**{"x-api-key": "alice-secret"}))
    assert (p.name, p.priority) == ("alice", 3)
    p = auth.authenticate(_req(Authorization="Bearer  bob-secret "))
    assert p.name == "bob"


def test_the_key_name_the_access_log_reads_is_the_one_authenticated():
    auth = _auth()
    req = _req(**{"x-api-key": "alice-secret"})
    assert Auth.key_name(req) is None  # not yet authenticated
    auth.authenticate(req)
    assert Auth.key_name(req) == "alice"


def test_googles_forms_header_and_query_parameter():
    auth = _auth()
    assert auth.authenticate(_req(**{"x-goog-api-key": "alice-secret"})).name == "alice"
    by_query = make_mocked_request("POST", "/llm/v1beta/models/m:generateContent?key=bob-secret&alt=sse")
    assert auth.authenticate(by_query, query_key=True).name == "bob"
    with pytest.raises(GatewayError) as e:
        auth.authenticate(make_mocked_request("GET", "/llm/v1beta/models?key=wrong"), query_key=True)
    assert e.value.kind == "authentication" and "invalid API key" in e.value.message


@pytest.mark.parametrize("path", ["/llm/v1/messages?key=bob-secret", "/llm/v1/chat/completions?key=bob-secret",
                                  "/api/chat?key=bob-secret", "/llm/v1/responses?beta=true&key=bob-secret"])
def test_a_key_in_the_url_counts_only_where_asked_for(path):
    """Only the Gemini routes pass query_key: elsewhere a valid key in the URL is no key at all,
    and the 401 says where a key goes instead (never echoing it)."""
    auth = _auth()
    with pytest.raises(GatewayError) as e:
        auth.authenticate(make_mocked_request("POST", path))
    assert e.value.kind == "authentication"
    assert "?key=" in e.value.message and "Gemini" in e.value.message and "bob-secret" not in e.value.message
    assert not auth.is_admin(make_mocked_request("GET", "/admin/requests?key=root"))
    assert not auth.may_read_metrics(make_mocked_request("GET", "/metrics?key=root"))
    # a header key still works with a stray ?key= beside it
    assert auth.authenticate(make_mocked_request("POST", path, headers={"x-api-key": "alice-secret"})).name == "alice"


@pytest.mark.parametrize("headers, message", [
    ({}, "missing API key"),
    ({"x-api-key": "   "}, "missing API key"),
    ({"Authorization": "Basic Ym9i"}, "missing API key"),
    ({"x-api-key": "alice-secret-but-longer"}, "invalid API key"),
])
def test_401s(headers, message):
    with pytest.raises(GatewayError) as e:
        _auth().authenticate(_req(**headers))
    assert e.value.kind == "authentication" and message in e.value.message


def test_a_missing_key_env_is_a_config_problem_naming_the_key():
    with pytest.raises(cfgmod.ConfigError) as e:
        Auth(cfgmod.Auth(keys=[cfgmod.AuthKey(name="x", key_env="NOPE")], admin_key_env="ADM"), env={})
    assert e.value.problems == ["auth.keys[0].key_env: environment variable 'NOPE' is not set",
                                "auth.admin_key_env: environment variable 'ADM' is not set"]


def test_models_a_key_may_use_by_glob_on_client_or_configured_name():
    auth = _auth()
    r = _req(**{"x-api-key": "alice-secret"})
    assert auth.admit(r, _Route("qwen2.5:3b"), "anthropic").name == "alice"
    assert auth.may_use(r, _Route("alias", "qwen-big"))
    with pytest.raises(GatewayError) as e:
        auth.admit(r, _Route("llama3"), "anthropic")
    assert e.value.kind == "permission" and e.value.param == "model" and "'llama3'" in e.value.message
    assert auth.may_use(_req(**{"x-api-key": "bob-secret"}), _Route("llama3"))  # no list: all models


def test_max_concurrent_is_counted_and_survives_a_reload():
    async def main():
        auth = _auth()
        alice = Principal("alice", 3)
        async with auth.hold(alice):
            with pytest.raises(GatewayError) as e:
                async with auth.hold(alice):
                    pass
            assert e.value.kind == "rate_limit" and e.value.retry_after == 1
            new = _auth()
            new.inherit(auth)  # a reload while alice's request runs
            with pytest.raises(GatewayError):
                async with new.hold(alice):
                    pass
        async with auth.hold(alice):  # given back
            pass
        async with auth.hold(Principal("bob")):  # no limit
            async with auth.hold(Principal("bob")):
                pass

    asyncio.run(main())


def test_admin_key():
    auth = _auth()
    assert auth.is_admin(_req(Authorization="Bearer root"))
    assert not auth.is_admin(_req(Authorization="Bearer alice-secret"))
    assert not auth.is_admin(_req())
    assert auth.may_read_metrics(_req(Authorization="Bearer root"))
    assert not auth.may_read_metrics(_req())


def test_a_peer_key_names_the_person_and_the_backend_others_cannot():
    keys = [cfgmod.AuthKey(name="front", key="front-secret", peer=True, priority=2),
            cfgmod.AuthKey(name="bob", key="bob-secret")]
    auth = Auth(cfgmod.Auth(keys=keys), env={})
    req = _req(authorization="Bearer front-secret", **{"x-hlf-on-behalf-of": "alice", "x-hlf-peer-backend": "gpu0"})
    p = auth.authenticate(req)
    assert (p.name, p.via, p.pin, p.priority) == ("alice", "front", "gpu0", 2)
    assert auth.authenticate(req) is p and Auth.key_name(req) == "alice"  # remembered, and what is counted
    alone = auth.authenticate(_req(authorization="Bearer front-secret"))
    assert (alone.name, alone.via) == ("front", None)  # no person named: the front's key is counted
    odd = auth.authenticate(_req(authorization="Bearer front-secret", **{"x-hlf-on-behalf-of": "x" * 200}))
    assert odd.name == "front"
    spoof = _req(authorization="Bearer bob-secret", **{"x-hlf-on-behalf-of": "alice", "x-hlf-peer-backend": "gpu0"})
    p = auth.authenticate(spoof)
    assert (p.name, p.via, p.pin) == ("bob", None, None) and Auth.key_name(spoof) == "bob"
