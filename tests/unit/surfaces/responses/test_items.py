"""Item ids that name their response, item_reference resolution and input_items paging
(surfaces/responses/items.py)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.errors import GatewayError
from homelab_frontend.surfaces.responses import items
from homelab_frontend.surfaces.responses.store import Record

RESP = "resp_" + "ab" * 12


def test_item_ids_name_their_response_and_are_unique():
    make = items.item_ids(RESP)
    ids = [make(p) for p in ("rs_", "msg_", "fc_", "msg_")]
    assert len(set(ids)) == 4 and all(items.response_of(i) == RESP for i in ids)
    assert not make("call_").startswith("call_" + "ab" * 12)  # call ids are the client's to echo, not ours
    inputs = items.number_inputs([{"type": "message"}, {"type": "function_call", "id": "fc_client"}], RESP)
    assert items.response_of(inputs[0]["id"]) == RESP and inputs[1]["id"] == "fc_client"
    assert inputs[0]["id"] not in ids  # input items are numbered apart from the output
    for other in ("rs_x", "resp_" + "ab" * 12, "msg_" + "ab" * 12, "fc_" + "zz" * 14):
        assert items.response_of(other) is None
    assert items.is_response_id(RESP) and not items.is_response_id("resp_test")


def test_resolve_reads_each_response_once_and_404s_what_is_not_there():
    make = items.item_ids(RESP)
    rs, fc = make("rs_"), make("fc_")
    rec = Record("alice", {"output": [{"id": rs, "type": "reasoning"}, {"id": fc, "type": "function_call"}]}, [], [])
    loads = []

    async def load(resp_id):
        loads.append(resp_id)
        return rec if resp_id == RESP else None

    got = asyncio.run(items.resolve([("input[0].id", rs), ("input[1].id", fc)], load))
    assert got == {rs: rec.response["output"][0], fc: rec.response["output"][1]} and loads == [RESP]
    for ref in ("rs_" + "cd" * 14, "unknown", make("msg_")):
        with pytest.raises(GatewayError) as exc:
            asyncio.run(items.resolve([("input[2].id", ref)], load))
        assert exc.value.kind == "not_found" and exc.value.param == "input[2].id" and ref in exc.value.message


def test_reasoning_text_reads_content_or_summary():
    assert items.reasoning_text({"content": [{"type": "reasoning_text", "text": "a"}], "summary": []}) == "a"
    assert items.reasoning_text({"content": [], "summary": [{"type": "summary_text", "text": "b"}]}) == "b"
    assert items.reasoning_text({}) == ""


LIST = [{"id": f"i{n}"} for n in range(5)]


def test_page_is_the_openai_list_newest_first():
    p = items.page(LIST, {})
    assert [i["id"] for i in p["data"]] == ["i4", "i3", "i2", "i1", "i0"]
    assert (p["object"], p["first_id"], p["last_id"], p["has_more"]) == ("list", "i4", "i0", False)
    p = items.page(LIST, {"order": "asc", "limit": "2", "after": "i0"})
    assert [i["id"] for i in p["data"]] == ["i1", "i2"] and p["has_more"]
    assert items.page([], {}) == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
    for query, param in (({"order": "up"}, "order"), ({"limit": "0"}, "limit"), ({"limit": "x"}, "limit"),
                         ({"after": "nope"}, "after")):
        with pytest.raises(GatewayError) as exc:
            items.page(LIST, query)
        assert exc.value.param == param


@given(st.integers(0, 12), st.integers(1, 5), st.sampled_from(["asc", "desc"]))
def test_walking_the_pages_yields_every_item_once(n, limit, order):
    xs = [{"id": f"i{k}"} for k in range(n)]
    seen, after = [], None
    while True:
        q = {"order": order, "limit": str(limit), **({"after": after} if after else {})}
        p = items.page(xs, q)
        seen += [i["id"] for i in p["data"]]
        if not p["has_more"]:
            break
        after = p["last_id"]
    expect = [x["id"] for x in xs]
    assert seen == (expect if order == "asc" else expect[::-1])
