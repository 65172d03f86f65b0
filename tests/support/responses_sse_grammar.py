"""A strict checker of the Responses SSE grammar (stream.py's docstring), for tests: unit tests
run every encoder output through it, integration tests every stream read off the wire.

`check_stream(raw, model=...)` parses the frames and asserts, with a message saying which rule
broke: `event:` name equals the JSON `type`; `sequence_number` 0, 1, 2, ... without gaps;
`response.created` then `response.in_progress` first, carrying the same response id and the
client's model; items added at output_index 0, 1, 2, ... one open at a time; content parts and
deltas only inside their own open item, of its kind, naming its item_id; each item's `.done`
events carry the concatenation of its deltas; `output_item.done` the complete item; exactly one
terminal event (`response.completed` or `response.failed`), last, whose `response.output` is the
items finished so far; no `[DONE]`; frames end in LF, never CRLF. A reasoning item streams either
its content (`reasoning_text`) or, when a summary was asked for, its one summary part
(`reasoning_summary_part.added`, `reasoning_summary_text.delta`, `.done`, `reasoning_summary_part.done`),
never both. Returns the event list.
"""

from __future__ import annotations

import json

__all__ = ["check_stream", "parse_frames"]

_DELTA = {"reasoning": "response.reasoning_text.delta", "message": "response.output_text.delta",
          "function_call": "response.function_call_arguments.delta"}
_TEXT_DONE = {"reasoning": "response.reasoning_text.done", "message": "response.output_text.done",
              "function_call": "response.function_call_arguments.done"}


def parse_frames(raw: bytes) -> list[dict]:
    assert b"\r" not in raw, "CRLF in the stream"
    assert b"[DONE]" not in raw, "[DONE] is not part of the Responses dialect"
    assert raw.endswith(b"\n\n") or not raw, "the stream does not end with a whole frame"
    events = []
    for block in raw.decode().split("\n\n")[:-1]:
        lines = block.split("\n")
        assert len(lines) == 2 and lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        ev = json.loads(lines[1][6:])
        assert ev.get("type") == lines[0][7:], f"event {lines[0][7:]!r} carries type {ev.get('type')!r}"
        events.append(ev)
    return events


def check_stream(raw: bytes, *, model: str | None = None) -> list[dict]:
    events = parse_frames(raw)
    assert len(events) >= 3, f"too short a stream: {[e['type'] for e in events]}"
    for i, ev in enumerate(events):
        assert ev.get("sequence_number") == i, f"event {i} ({ev['type']}) has sequence_number {ev.get('sequence_number')}"
    assert events[0]["type"] == "response.created", events[0]["type"]
    assert events[1]["type"] == "response.in_progress", events[1]["type"]
    rid = events[0]["response"]["id"]
    assert rid.startswith("resp_"), rid
    for ev in events[:2]:
        r = ev["response"]
        assert r["id"] == rid and r["object"] == "response" and r["status"] == "in_progress" and r["output"] == []
        if model is not None:
            assert r["model"] == model, r["model"]
    done_items: list[dict] = []
    open_item: dict | None = None
    index = -1
    acc = ""
    part_open = False
    terminal = None
    for ev in events[2:]:
        kind = ev["type"]
        assert terminal is None, f"{kind} after {terminal}"
        if kind == "response.output_item.added":
            assert open_item is None, "an item was added while another was open"
            index += 1
            assert ev["output_index"] == index, f"output_index {ev['output_index']}, expected {index}"
            open_item = ev["item"]
            assert open_item["type"] in _DELTA, open_item["type"]
            assert open_item.get("status") == "in_progress"
            acc, part_open = "", False
            continue
        if kind in ("response.completed", "response.failed"):
            terminal = kind
            r = ev["response"]
            assert r["id"] == rid
            assert r["output"] == done_items, "the final output is not the items finished"
            if kind == "response.completed":
                assert open_item is None, "response.completed with an item still open"
                assert r["status"] in ("completed", "incomplete"), r["status"]
                if r["status"] == "incomplete":
                    assert r["incomplete_details"]["reason"] in ("max_output_tokens", "content_filter")
            else:
                assert r["status"] == "failed" and r["error"]["code"] and r["error"]["message"], r
            continue
        assert open_item is not None, f"{kind} outside an item"
        assert ev["output_index"] == index, f"{kind} at output_index {ev['output_index']}, open is {index}"
        item_type = open_item["type"]
        if kind != "response.output_item.done":
            assert ev["item_id"] == open_item["id"], f"{kind} names item {ev['item_id']}"
        summary_kind = kind.startswith("response.reasoning_summary_")
        if summary_kind:
            assert item_type == "reasoning", f"{kind} in a {item_type} item"
            assert ev["summary_index"] == 0
            open_item["_summary"] = True
        if kind == "response.reasoning_summary_part.added":
            assert not part_open
            part_open = True
        elif kind == "response.reasoning_summary_text.delta":
            assert part_open and ev["delta"], f"{kind} outside its part, or empty"
            acc += ev["delta"]
        elif kind == "response.reasoning_summary_text.done":
            assert ev["text"] == acc, f"{kind}: {ev['text']!r} != {acc!r}"
        elif kind == "response.reasoning_summary_part.done":
            assert part_open and ev["part"] == {"type": "summary_text", "text": acc}
            part_open = False
        elif kind == "response.content_part.added":
            assert not open_item.get("_summary"), "reasoning content and summary in one item"
            assert item_type != "function_call" and not part_open, "content part in a call or twice"
            assert ev["content_index"] == 0
            part_open = True
        elif kind == _DELTA[item_type]:
            assert item_type == "function_call" or part_open, f"{kind} before content_part.added"
            assert ev["delta"], "empty delta"
            acc += ev["delta"]
        elif kind == _TEXT_DONE[item_type]:
            got = ev["arguments"] if item_type == "function_call" else ev["text"]
            assert got == acc or (item_type == "function_call" and acc == "" and got == "{}"), f"{kind}: {got!r} != {acc!r}"
        elif kind == "response.content_part.done":
            assert part_open
            part_open = False
            assert ev["part"]["text"] == acc
        elif kind == "response.output_item.done":
            assert not part_open, "output_item.done with its content part open"
            item = ev["item"]
            assert item["id"] == open_item["id"] and item["type"] == item_type
            assert item["status"] in ("completed", "incomplete")
            if item_type == "message":
                assert [p["text"] for p in item["content"]] == [acc]
            elif item_type == "reasoning" and open_item.get("_summary"):
                assert item["summary"] == [{"type": "summary_text", "text": acc}] and item["content"] == []
            elif item_type == "reasoning":
                assert [p["text"] for p in item["content"]] == [acc]
            else:
                assert item["arguments"] in (acc, "{}" if not acc else acc)
                assert item["call_id"] == open_item["call_id"] and item["name"] == open_item["name"]
            done_items.append(item)
            open_item = None
        else:
            raise AssertionError(f"unexpected {kind} inside a {item_type} item")
    assert terminal is not None, "the stream ends without response.completed or response.failed"
    return events
