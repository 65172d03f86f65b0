"""Items of stored responses: their ids, `item_reference` input items, and
`GET /llm/v1/responses/{id}/input_items`.

An item id names the response it belongs to: `<prefix>_<the response's 24 hex digits><4 hex
digits>` (`rs_`, `msg_`, `fc_`; output items count from 0, this request's input items from 0x8000),
so an `item_reference` (the Vercel AI SDK's second turn with `store` on sends
`{"type": "item_reference", "id": "rs_..."}` for every item of the answer before) is resolved by
reading that one response from the store, under the key's ownership like every read: an id the key
does not own, or that is not (or no longer) stored, is a 404 naming it. There is no index to keep
in step with the store's expiry and eviction.

`input_items` pages the OpenAI way: `{"object": "list", "data", "first_id", "last_id",
"has_more"}`, `order` `desc` (newest first, the API's default) or `asc`, `limit` 1..100 (default
20), `after` an item id of the list (the page starts past it).
"""

from __future__ import annotations

import re
import secrets
from typing import Awaitable, Callable

from ...errors import GatewayError
from .store import Record

_ITEM = re.compile(r"(?:rs|msg|fc|fco)_([0-9a-f]{24})[0-9a-f]{4}")
_RESPONSE = re.compile(r"resp_[0-9a-f]{24}")


def is_response_id(resp_id: object) -> bool:
    return isinstance(resp_id, str) and _RESPONSE.fullmatch(resp_id) is not None
INPUT_BASE = 0x8000  # input items' numbers start here, output items' at 0


def item_ids(resp_id: str, start: int = 0) -> Callable[[str], str]:
    """An id factory for the items of response `resp_id` (`resp_<24 hex>`): prefix -> item id.
    Other prefixes (`call_`) get plain fresh ids."""
    hexpart = resp_id[len("resp_"):]
    counter = iter(range(start, start + 0x8000))

    def make(prefix: str) -> str:
        if prefix == "call_":
            return prefix + secrets.token_hex(12)
        return f"{prefix}{hexpart}{next(counter):04x}"

    return make


def number_inputs(inputs: list[dict], resp_id: str) -> list[dict]:
    """This request's input items with ids: the client's own where it sent one, else one of ours
    (numbered from INPUT_BASE, so that it names this response too)."""
    make = item_ids(resp_id, INPUT_BASE)
    prefix = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}
    out = []
    for item in inputs:
        kind = item.get("type")
        fresh = make(prefix.get(kind, "msg_") if isinstance(kind, str) else "msg_")  # numbered by position either way
        out.append(item if isinstance(item.get("id"), str) and item["id"] else {"id": fresh, **item})
    return out


def response_of(item_id: str) -> str | None:
    """The response an item id of ours belongs to, or None (not an id the gateway made)."""
    m = _ITEM.fullmatch(item_id)
    return "resp_" + m.group(1) if m else None


def reasoning_text(item: dict) -> str:
    """The text of a reasoning item of ours, summary-shaped (`reasoning.summary` asked) or not."""
    parts = item.get("content") or item.get("summary") or []
    return "\n\n".join(x["text"] for x in parts if isinstance(x, dict) and isinstance(x.get("text"), str))


def find_item(record_response: dict, input_items: list[dict], item_id: str) -> dict | None:
    for item in (*record_response.get("output", ()), *input_items):
        if item.get("id") == item_id:
            return item
    return None


async def resolve(refs: list[tuple[str, str]],
                  load: Callable[[str], Awaitable[Record | None]]) -> dict[str, dict]:
    """`item_reference` ids -> the stored items. `refs`: (path, id) in input order; `load(resp_id)`
    reads a record under the caller's key (None: not theirs, or not there)."""
    out: dict[str, dict] = {}
    records: dict[str, Record | None] = {}
    for path, ref in refs:
        if ref in out:
            continue
        resp_id = response_of(ref)
        rec = None
        if resp_id is not None:
            if resp_id not in records:
                records[resp_id] = await load(resp_id)
            rec = records[resp_id]
        item = find_item(rec.response, rec.input_items, ref) if rec is not None else None
        if item is None:
            raise GatewayError("not_found", f"{path}: no item with id {ref!r}", param=path)
        out[ref] = item
    return out


def _int_param(query, name: str, default: int, low: int, high: int) -> int:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        raise GatewayError("invalid_request", f"{name}: expected an integer, got {raw!r}", param=name) from None
    if not low <= n <= high:
        raise GatewayError("invalid_request", f"{name}: must be between {low} and {high}, got {n}", param=name)
    return n


def page(items: list[dict], query) -> dict:
    """One page of `items` (in input order) as the OpenAI list object, for the query's
    `order`, `after` and `limit`."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise GatewayError("invalid_request", f"order: expected asc or desc, got {order!r}", param="order")
    limit = _int_param(query, "limit", 20, 1, 100)
    seq = list(reversed(items)) if order == "desc" else list(items)
    after = query.get("after")
    if after is not None:
        at = next((i for i, it in enumerate(seq) if it.get("id") == after), None)
        if at is None:
            raise GatewayError("invalid_request", f"after: no item with id {after!r} in this list", param="after")
        seq = seq[at + 1:]
    data = seq[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(seq) > limit}
