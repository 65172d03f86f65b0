"""surfaces/count_tokens.py: a prompt's size without a slot: routed and let in by the key like a
request, the backend's own count when it has one, else about four bytes of chat text per token,
never zero; either way the record's `tokens_in`."""

from __future__ import annotations

import asyncio
import json

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from homelab_frontend import canonical as c
from homelab_frontend import config as cfgmod
from homelab_frontend.errors import GatewayError
from homelab_frontend.request.tracker import Tracked
from homelab_frontend.surfaces import count_tokens

CFG = cfgmod.parse({"backends": {"u": {"url": "http://127.0.0.1:9/v1", "kind": "vllm"}},
                    "models": {"m": {"backend": "u", "upstream_model": "up/m"}}})


class _Backend:
    name = "u"
    cfg = CFG.backends["u"]


class _Route:
    upstream_model = "up/m"
    system_turns = "merge"

    def choose(self):
        return _Backend()


class _Gateway:
    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.router = self
        self.auth = self
        self.clients = {"u": "the client of u"}
        self.admitted: list[str] = []

    async def read_body(self, request) -> bytes:
        return request

    async def parse(self, body, parse):
        return parse(body)

    def resolve(self, model):
        return _Route()

    def admit(self, request, route, dialect):
        if self.refuse:
            raise GatewayError("permission", "not this model")
        self.admitted.append(dialect)


def _parse(body: bytes) -> c.Request:
    doc = json.loads(body)
    return c.Request(model=doc["model"], messages=[c.Message(role="user", parts=[c.TextPart(text=doc["text"])])])


def _count(text: str, backend_count: int | None, monkeypatch, gw=None):
    seen = {}

    async def count_prompt(client, kind, chat):
        seen.update(client=client, kind=kind, chat=chat)
        return backend_count

    monkeypatch.setattr(count_tokens, "count_prompt", count_prompt)

    async def main():
        t = Tracked("req_ct", "anthropic", "", None, False)
        n = await count_tokens.prompt_tokens(json.dumps({"model": "m", "text": text}).encode(),
                                             gw or _Gateway(), t, "anthropic", _parse)
        return n, t

    n, t = asyncio.run(main())
    return n, t, seen


def test_the_backends_own_count_is_the_answer_and_the_records(monkeypatch):
    n, t, seen = _count("hello", 12, monkeypatch)
    assert n == 12 == t.tokens_in
    assert (t.model, t.backend) == ("m", "u")
    assert seen["client"] == "the client of u" and seen["kind"] == "vllm"
    assert seen["chat"]["model"] == "up/m"  # the body the backend would have been sent


@settings(max_examples=30, deadline=None)
@given(st.text(max_size=200))
def test_without_the_backends_count_it_is_a_quarter_of_the_chat_text_and_never_zero(text):
    with pytest.MonkeyPatch.context() as mp:
        n, t, seen = _count(text, None, mp)
    msgs = msgspec.json.encode(seen["chat"]["messages"])
    assert n == t.tokens_in == max(1, len(msgs) // 4)


def test_a_key_that_may_not_use_the_model_gets_no_count(monkeypatch):
    with pytest.raises(GatewayError) as got:
        _count("hello", 12, monkeypatch, gw=_Gateway(refuse=True))
    assert got.value.kind == "permission"
