"""surfaces/responses/handler.py: the Responses dialect's decisions on the skeleton, without
sockets: what a continuation starts from (`conversation`), a store that fails on read (a 503 said
plainly) or on write (the answer still goes out), a whole answer the upstream failed, and what
`before_final` stores (only `store: true`, never a failed response)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from homelab_frontend import canonical as c
from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.responses import handler
from homelab_frontend.surfaces.responses.request import parse_request
from homelab_frontend.surfaces.responses.sealed import ReasoningSealer
from homelab_frontend.surfaces.responses.store import Record
from homelab_frontend.surfaces.signature import ThinkingSigner

SEALER = ReasoningSealer(ThinkingSigner(b"k"))


def _parsed(**fields):
    return parse_request(json.dumps({"model": "m", "input": "what is 2+2?", **fields}).encode(), sealer=SEALER)


class _Store:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.puts: dict[str, Record] = {}

    async def get(self, resp_id, owner):
        if self.fail:
            raise OSError("disk gone")
        return None

    async def put(self, resp_id, rec):
        if self.fail:
            raise OSError("disk full")
        self.puts[resp_id] = rec


def _state(store: _Store):
    return SimpleNamespace(store=store, sealer=SEALER)


def test_a_continuation_starts_from_history_this_input_and_this_answer_as_one_assistant_turn():
    parsed = _parsed()
    earlier = [c.Message("user", [c.TextPart("hello")]), c.Message("assistant", [c.TextPart("hi")])]
    output = [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "add them"}]},
              {"type": "message", "content": [{"type": "output_text", "text": "4"}, {"type": "output_text", "text": ""}]},
              {"type": "function_call", "call_id": "call_1", "name": "calc", "arguments": "{}"}]
    conv = handler.conversation(earlier, parsed, output)
    assert conv[:2] == earlier and conv[2:-1] == parsed.messages
    last = conv[-1]
    assert last.role == "assistant" and last.text() == "4" and last.reasoning == "add them"
    assert [(t.id, t.name, t.arguments) for t in last.tool_calls] == [("call_1", "calc", "{}")]


def test_an_answer_with_no_reasoning_carries_none_not_an_empty_string():
    conv = handler.conversation([], _parsed(), [{"type": "message", "content": [{"type": "output_text", "text": "x"}]}])
    assert conv[-1].reasoning is None


def test_a_store_that_fails_on_read_is_a_503_naming_the_parameter():
    with pytest.raises(GatewayError) as got:
        asyncio.run(handler._load(_state(_Store(fail=True)), "resp_1", "alice", "previous_response_id"))
    assert got.value.status == 503 and got.value.param == "previous_response_id"
    assert "disk gone" not in got.value.message  # the store's own words stay in the log


def test_a_store_that_fails_on_write_loses_only_the_continuation():
    asyncio.run(handler._save(_state(_Store(fail=True)), "resp_1", Record("alice", {}, [])))  # no raise


def test_the_owner_is_the_keys_name_or_nobody():
    assert handler._owner(SimpleNamespace(name="alice")) == "alice"
    assert handler._owner(SimpleNamespace(name=None)) == ""


def _ex(streams_upstream: bool = False):
    return SimpleNamespace(backend=SimpleNamespace(name="b", cfg=SimpleNamespace(streams_upstream=streams_upstream)))


def _turn(s: _Store, **fields):
    return handler._Response(_state(s), _parsed(**fields), [], "alice")


@pytest.mark.parametrize("store", [True, False])
def test_a_whole_answer_is_the_response_and_is_stored_only_when_asked(store):
    s = _Store()
    turn = _turn(s, store=store)
    doc = turn.whole([c.TextDelta("4"), c.Finish("stop")], _ex())
    assert doc["id"] == turn.resp_id and doc["status"] == "completed"
    asyncio.run(turn.before_final())
    assert list(s.puts) == ([turn.resp_id] if store else [])
    if store:
        rec = s.puts[turn.resp_id]
        assert rec.owner == "alice" and rec.history[-1].text() == "4"


def test_a_whole_answer_the_upstream_failed_is_an_upstream_error_and_is_not_stored():
    s = _Store()
    turn = _turn(s, store=True)
    with pytest.raises(GatewayError) as got:
        turn.whole([c.TextDelta("4"), c.UpstreamError("the backend fell over")], _ex())
    assert got.value.kind == "upstream_error" and "'b'" in got.value.message
    asyncio.run(turn.before_final())
    assert s.puts == {}


def test_the_dialects_failure_codes():
    turn = _turn(_Store())
    assert turn.midstream_code == "server_error"
    assert isinstance(turn.own_failure_code(GatewayError("timeout", "slow")), str)


@pytest.mark.parametrize("asked,as_summary,summary", [(True, False, False), (True, True, True), (False, True, False)])
def test_the_reasoning_is_a_summary_only_when_asked_and_the_operator_says_so(asked, as_summary, summary):
    """vLLM's own Responses server gives raw reasoning as `content` whatever `reasoning.summary`
    says; `responses.reasoning_as_summary` makes it the summary a client asked for."""
    turn = handler._Response(_state(_Store()), _parsed(reasoning={"summary": "auto"} if asked else {}), [], "alice", as_summary)
    doc = turn.whole([c.ReasoningDelta("hmm"), c.TextDelta("4"), c.Finish("stop")], _ex())
    rs = doc["output"][0]
    if summary:
        assert rs["summary"] == [{"type": "summary_text", "text": "hmm"}] and rs["content"] == []
    else:
        assert rs["summary"] == [] and rs["content"] == [{"type": "reasoning_text", "text": "hmm"}]
