"""A strict checker of Anthropic Messages SSE streams, for tests (unit and integration).

`check_stream(raw)` parses the bytes a client received and asserts the grammar the gateway
promises, independently of the encoder's implementation (stdlib `json`, its own state machine):

Framing
  * UTF-8; frames end with a blank line; every frame is exactly `event: <name>` then
    `data: <one JSON object>` (no bare `data:` frame, no comment frame, no `data: [DONE]`, no
    CR line endings); the JSON's `type` equals `<name>`.
Order
  * `message_start` first and once (a stream may instead be a lone `error` frame: a failure before
    anything was sent); `ping` anywhere after message_start.
  * Blocks: `content_block_start` indices 0, 1, 2, ... in order, no gaps; one block open at a time;
    every delta / stop names the open block; a block is closed before the next opens and before
    `message_delta`.
  * Each block has >= 1 content delta; the delta type matches the block: text -> text_delta
    (non-empty), thinking -> thinking_delta (non-empty) then exactly one signature_delta (non-empty)
    as its last delta (with thinking display "omitted", the signature_delta alone: Anthropic
    sends no thinking text then, and the signature carries the reasoning), tool_use -> input_json_delta (an empty partial_json is allowed, as
    Anthropic sends one).
  * `message_delta` once, after all blocks; then `message_stop` once, as the last frame.
  * After `error`: nothing (no message_stop). A complete stream ends with message_stop or error
    (`complete=False` accepts a stream cut anywhere, to check a prefix).
Content
  * message_start.message: id `msg_...`, type message, role assistant, content [], model a string
    (equal to `model` if given), stop_reason / stop_sequence null, usage.input_tokens and
    output_tokens ints >= 0, cache counts (if present) ints >= 0.
  * content_block_start: text {"text": ""}, thinking {"thinking": "", "signature": ""},
    tool_use {"id": ^[A-Za-z0-9_-]+$, "name": non-empty, "input": {}}.
  * message_delta: delta.stop_reason one of Anthropic's; stop_sequence a non-empty string iff
    stop_reason is "stop_sequence", else null; usage.output_tokens int >= 0, input_tokens and
    cache counts ints >= 0 if present.
  * error: {"type": "error", "error": {"type": <an Anthropic error type>, "message": str}}.

Returns the parsed `data` objects in order. `assemble(events)` folds them into the final message
(content blocks with their text / thinking / signature / parsed tool input), which is what a
client sees.
"""

from __future__ import annotations

import json
import re

__all__ = ["check_stream", "parse_frames", "assemble", "STOP_REASONS", "ERROR_TYPES"]

STOP_REASONS = frozenset(
    {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"}
)
ERROR_TYPES = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "billing_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "timeout_error",
        "api_error",
        "overloaded_error",
    }
)
_TOOL_ID = re.compile(r"[A-Za-z0-9_-]+")
_EVENT_NAMES = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }
)
_DELTA_FOR = {"text": "text_delta", "thinking": "thinking_delta", "tool_use": "input_json_delta"}


def _fail(n: int, msg: str) -> None:
    raise AssertionError(f"SSE frame #{n}: {msg}")


def _is_count(v: object) -> bool:
    return type(v) is int and v >= 0


def parse_frames(raw: bytes, *, complete: bool = True) -> list[tuple[str, dict]]:
    """Split `raw` into (event name, data object) pairs, asserting the framing rules."""
    assert isinstance(raw, (bytes, bytearray)), f"expected bytes, got {type(raw).__name__}"
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AssertionError(f"stream is not valid UTF-8: {exc}") from None
    assert "\r" not in text, "stream contains a CR character (frames must use LF line endings)"
    if not text:
        return []
    parts = text.split("\n\n")
    tail = parts.pop()
    if tail:
        if complete:
            raise AssertionError(f"stream does not end with a complete frame: trailing {tail[:80]!r}")
    frames: list[tuple[str, dict]] = []
    for n, part in enumerate(parts):
        lines = part.split("\n")
        if len(lines) != 2:
            _fail(n, f"expected exactly an `event:` line and a `data:` line, got {part[:200]!r}")
        ev, data = lines
        if not ev.startswith("event: "):
            _fail(n, f"first line is not `event: <name>`: {ev[:80]!r} (a bare data frame?)")
        if not data.startswith("data: "):
            _fail(n, f"second line is not `data: <json>`: {data[:80]!r}")
        name = ev[7:]
        if name not in _EVENT_NAMES:
            _fail(n, f"unknown event name {name!r}")
        try:
            obj = json.loads(data[6:])
        except ValueError as exc:
            _fail(n, f"data is not JSON ({exc}): {data[:120]!r}")
        if not isinstance(obj, dict):
            _fail(n, f"data is not a JSON object: {data[:120]!r}")
        if obj.get("type") != name:
            _fail(n, f"data type {obj.get('type')!r} differs from event name {name!r}")
        frames.append((name, obj))
    return frames


def check_stream(raw: bytes, *, model: str | None = None, complete: bool = True) -> list[dict]:
    """Assert every rule of the module docstring on `raw`; return the parsed data objects."""
    frames = parse_frames(raw, complete=complete)
    events = [obj for _, obj in frames]
    if complete:
        assert frames, "empty stream"
    started = False
    open_block: dict | None = None  # {"index", "type", "deltas", "signed"}
    next_index = 0
    delta_seen = False
    ended: str | None = None  # "message_stop" | "error"

    for n, (name, obj) in enumerate(frames):
        if ended is not None:
            _fail(n, f"{name} after {ended}: nothing may follow it")
        if name == "error":
            err = obj.get("error")
            if not isinstance(err, dict):
                _fail(n, f"error frame without an error object: {obj}")
            if err.get("type") not in ERROR_TYPES:
                _fail(n, f"error.type {err.get('type')!r} is not an Anthropic error type")
            if not isinstance(err.get("message"), str):
                _fail(n, "error.message is not a string")
            ended = "error"
            continue
        if not started:
            if name != "message_start":
                _fail(n, f"first frame is {name}, expected message_start")
            _check_message_start(n, obj, model)
            started = True
            continue
        if name == "message_start":
            _fail(n, "a second message_start")
        if name == "ping":
            continue
        if delta_seen and name != "message_stop":
            _fail(n, f"{name} after message_delta (only message_stop may follow)")
        if name == "content_block_start":
            if open_block is not None:
                _fail(n, f"content_block_start while block {open_block['index']} is still open")
            idx = obj.get("index")
            if idx != next_index:
                _fail(n, f"content_block_start index {idx!r}, expected {next_index} (emission order, no gaps)")
            cb = obj.get("content_block")
            btype = _check_block_start(n, cb)
            open_block = {"index": idx, "type": btype, "deltas": 0, "signed": False}
            next_index += 1
        elif name == "content_block_delta":
            if open_block is None:
                _fail(n, "content_block_delta with no open block")
            if obj.get("index") != open_block["index"]:
                _fail(n, f"delta for index {obj.get('index')!r} while block {open_block['index']} is open")
            _check_delta(n, open_block, obj.get("delta"))
        elif name == "content_block_stop":
            if open_block is None:
                _fail(n, "content_block_stop with no open block")
            if obj.get("index") != open_block["index"]:
                _fail(n, f"content_block_stop for index {obj.get('index')!r}, open block is {open_block['index']}")
            if open_block["deltas"] == 0 and not open_block["signed"]:  # signed: display omitted
                _fail(n, f"{open_block['type']} block {open_block['index']} closed without any content delta")
            if open_block["type"] == "thinking" and not open_block["signed"]:
                _fail(n, f"thinking block {open_block['index']} closed without a signature_delta")
            open_block = None
        elif name == "message_delta":
            if open_block is not None:
                _fail(n, f"message_delta while block {open_block['index']} is still open")
            _check_message_delta(n, obj)
            delta_seen = True
        elif name == "message_stop":
            if not delta_seen:
                _fail(n, "message_stop without a preceding message_delta")
            ended = "message_stop"
    if complete:
        assert ended is not None, (
            "stream ended without message_stop or error (truncated but apparently successful?)"
        )
    return events


def _check_message_start(n: int, obj: dict, model: str | None) -> None:
    m = obj.get("message")
    if not isinstance(m, dict):
        _fail(n, "message_start without a message object")
    if not (isinstance(m.get("id"), str) and m["id"].startswith("msg_")):
        _fail(n, f"message.id {m.get('id')!r} is not a msg_... string")
    for key, want in (("type", "message"), ("role", "assistant"), ("stop_reason", None), ("stop_sequence", None)):
        if key not in m or m[key] != want:
            _fail(n, f"message.{key} is {m.get(key, '<missing>')!r}, expected {want!r}")
    if m.get("content") != []:
        _fail(n, f"message.content is {m.get('content')!r}, expected []")
    if not isinstance(m.get("model"), str) or not m["model"]:
        _fail(n, "message.model is not a non-empty string")
    if model is not None and m["model"] != model:
        _fail(n, f"message.model is {m['model']!r}, expected the client's {model!r}")
    u = m.get("usage")
    if not isinstance(u, dict):
        _fail(n, "message.usage is missing")
    for key in ("input_tokens", "output_tokens"):
        if not _is_count(u.get(key)):
            _fail(n, f"message.usage.{key} is {u.get(key, '<missing>')!r}, expected an int >= 0")
    for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
        if key in u and not _is_count(u[key]):
            _fail(n, f"message.usage.{key} is {u[key]!r}: present cache counts must be real ints")


def _check_block_start(n: int, cb: object) -> str:
    if not isinstance(cb, dict):
        _fail(n, "content_block_start without a content_block object")
    t = cb.get("type")
    if t == "text":
        if cb.get("text") != "":
            _fail(n, f"text block starts with text {cb.get('text')!r}, expected ''")
    elif t == "thinking":
        if cb.get("thinking") != "" or cb.get("signature") != "":
            _fail(n, f"thinking block must start with thinking '' and signature '': {cb}")
    elif t == "tool_use":
        tid = cb.get("id")
        if not (isinstance(tid, str) and _TOOL_ID.fullmatch(tid)):
            _fail(n, f"tool_use id {tid!r} does not match ^[A-Za-z0-9_-]+$")
        if not (isinstance(cb.get("name"), str) and cb["name"]):
            _fail(n, f"tool_use name {cb.get('name')!r} is not a non-empty string")
        if cb.get("input") != {}:
            _fail(n, f"tool_use block starts with input {cb.get('input')!r}, expected {{}}")
    else:
        _fail(n, f"unknown content block type {t!r}")
    return t


def _check_delta(n: int, block: dict, d: object) -> None:
    if not isinstance(d, dict):
        _fail(n, "content_block_delta without a delta object")
    t = d.get("type")
    btype = block["type"]
    if btype == "thinking" and block["signed"]:
        _fail(n, f"{t} after the signature_delta of thinking block {block['index']}")
    if t == "signature_delta":
        if btype != "thinking":
            _fail(n, f"signature_delta in a {btype} block")
        if not (isinstance(d.get("signature"), str) and d["signature"]):
            _fail(n, "signature_delta.signature is not a non-empty string")
        block["signed"] = True
        return
    if t != _DELTA_FOR[btype]:
        _fail(n, f"{t} in a {btype} block (expected {_DELTA_FOR[btype]})")
    if t == "text_delta":
        if not (isinstance(d.get("text"), str) and d["text"]):
            _fail(n, f"text_delta.text is {d.get('text')!r}, expected a non-empty string")
    elif t == "thinking_delta":
        if not (isinstance(d.get("thinking"), str) and d["thinking"]):
            _fail(n, f"thinking_delta.thinking is {d.get('thinking')!r}, expected a non-empty string")
    elif not isinstance(d.get("partial_json"), str):
        _fail(n, "input_json_delta.partial_json is not a string")
    block["deltas"] += 1


def _check_message_delta(n: int, obj: dict) -> None:
    d = obj.get("delta")
    if not isinstance(d, dict):
        _fail(n, "message_delta without a delta object")
    sr = d.get("stop_reason")
    if sr not in STOP_REASONS:
        _fail(n, f"message_delta.delta.stop_reason {sr!r} is not an Anthropic stop reason")
    ss = d.get("stop_sequence", "<missing>")
    if sr == "stop_sequence":
        if not (isinstance(ss, str) and ss):
            _fail(n, f"stop_reason stop_sequence with stop_sequence {ss!r}")
    elif ss is not None:
        _fail(n, f"stop_sequence {ss!r} with stop_reason {sr!r} (must be null)")
    u = obj.get("usage")
    if not isinstance(u, dict):
        _fail(n, "message_delta without usage")
    if not _is_count(u.get("output_tokens")):
        _fail(n, f"message_delta.usage.output_tokens is {u.get('output_tokens', '<missing>')!r}")
    for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        if key in u and u[key] is not None and not _is_count(u[key]):
            _fail(n, f"message_delta.usage.{key} is {u[key]!r}")


def assemble(events: list[dict]) -> dict:
    """Fold checked events into the message a client ends up with.

    A tool_use block gets the concatenated partial_json under the extra key `input_json` and, once
    closed, `input` parsed from it (left {} if that is not valid JSON).
    """
    msg: dict = {}
    for ev in events:
        t = ev["type"]
        if t == "message_start":
            msg = json.loads(json.dumps(ev["message"]))
        elif t == "content_block_start":
            block = dict(ev["content_block"])
            if block["type"] == "tool_use":
                block["input_json"] = ""
            msg["content"].append(block)
        elif t == "content_block_delta":
            block, d = msg["content"][ev["index"]], ev["delta"]
            if d["type"] == "text_delta":
                block["text"] += d["text"]
            elif d["type"] == "thinking_delta":
                block["thinking"] += d["thinking"]
            elif d["type"] == "signature_delta":
                block["signature"] = d["signature"]
            else:
                block["input_json"] += d["partial_json"]
        elif t == "content_block_stop":
            block = msg["content"][ev["index"]]
            if block["type"] == "tool_use":
                raw = block["input_json"]
                if raw:
                    try:
                        block["input"] = json.loads(raw)
                    except ValueError:
                        pass  # left as {}; the raw text is in "input_json"
        elif t == "message_delta":
            msg["stop_reason"] = ev["delta"]["stop_reason"]
            msg["stop_sequence"] = ev["delta"].get("stop_sequence")
            for k, v in ev["usage"].items():
                if v is not None:
                    msg["usage"][k] = v
        elif t == "error":
            msg["error"] = ev["error"]
    return msg
