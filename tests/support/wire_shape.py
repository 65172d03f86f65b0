"""The shape of what a server sends, for comparing two servers (the stub and the real vLLM)
structurally: field names and JSON types, never values (ids, timestamps, text, token counts).

- `paths(doc)`: the set of `path: type` lines of a JSON document; list elements share one path
  (`choices[].delta.content: str`), so a document's shape does not depend on how many there are;
- `kind(chunk)`: what one chat-completion stream chunk is (the opening role chunk, reasoning,
  content, a tool call's start or its argument fragments, the finish, the usage-only chunk, an
  error), and `grammar(chunks)`: the stream as its run of kinds, repeats collapsed, so a stream of
  3 content tokens and one of 30 read the same;
- `stream_shapes(chunks)`: per kind, the union of its chunks' shapes;
- `uncoalesced(chunks)`: a stream as vLLM sends it when its API server keeps up with its engine:
  one chunk per kind of delta (see its docstring for why a busy machine's stream differs);
- `diff(a, b)`: what only one side has, as readable lines.
Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, Iterable


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def paths(doc: Any, prefix: str = "$") -> set[str]:
    """Every `path: type` of a JSON document (an int where a float may stand is still `int`:
    vLLM's pydantic models send 1.0 as `1.0`, never as `1`, so the two never mix by accident)."""
    out = {f"{prefix}: {type_name(doc)}"}
    if isinstance(doc, dict):
        for key, value in doc.items():
            out |= paths(value, f"{prefix}.{key}")
    elif isinstance(doc, list):
        for item in doc:
            out |= paths(item, f"{prefix}[]")
    return out


def kind(chunk: Any) -> str:
    """What one stream chunk is. Decided by what it carries, in this order: an error, the usage
    chunk (`choices: []`), the opening role chunk, the finish, a tool call's first delta (it names
    the function), argument fragments, reasoning, content; else `empty`."""
    if not isinstance(chunk, dict):
        return "not-an-object"
    if "error" in chunk:
        return "error"
    choices = chunk.get("choices")
    if choices == []:
        return "usage-only"
    if not isinstance(choices, list):
        return "no-choices"
    choice = choices[0] if isinstance(choices[0], dict) else {}
    delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
    if "role" in delta:
        return "open"
    if choice.get("finish_reason") is not None:
        return "finish"
    calls = delta.get("tool_calls")
    if isinstance(calls, list) and calls:
        named = any(isinstance(c, dict) and isinstance(c.get("function"), dict) and "name" in c["function"]
                    for c in calls)
        return "tool-start" if named else "tool-args"
    if delta.get("reasoning") or delta.get("reasoning_content"):
        return "reasoning"
    if delta.get("content"):
        return "content"
    return "empty"


def grammar(chunks: Iterable[Any]) -> list[str]:
    """The kinds of a stream in order, each run of one kind written once."""
    out: list[str] = []
    for chunk in chunks:
        k = kind(chunk)
        if not out or out[-1] != k:
            out.append(k)
    return out


def stream_shapes(chunks: Iterable[Any]) -> dict[str, set[str]]:
    """Per kind, the union of the shapes of its chunks."""
    out: dict[str, set[str]] = {}
    for chunk in chunks:
        out.setdefault(kind(chunk), set()).update(paths(chunk))
    return out


def diff(a: set[str], b: set[str], a_name: str = "stub", b_name: str = "vllm") -> list[str]:
    """The lines only one side has, sorted by path, each saying whose it is."""
    lines = [(p, f"only {a_name}: {p}") for p in a - b] + [(p, f"only {b_name}: {p}") for p in b - a]
    return [text for _, text in sorted(lines)]


_GROUPS = (("reasoning", "reasoning_content"), ("content",), ("tool_calls",))  # in vLLM's order


def _carries(delta: dict) -> list[tuple[str, ...]]:
    """The kinds of payload a delta carries (a field that is there but empty or null is none)."""
    return [g for g in _GROUPS if any(delta.get(k) for k in g)]


def _split_start(calls: list) -> list[list]:
    """Tool call deltas, a start that also carries argument text split into the start and then
    the fragment (the hermes parser streams them apart)."""
    out: list[list] = []
    for call in calls:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict) and "name" in fn and fn.get("arguments"):
            out.append([{**call, "function": {k: v for k, v in fn.items() if k != "arguments"}}])
            out.append([{"index": call.get("index"), "function": {"arguments": fn["arguments"]}}])
        else:
            out.append([call])
    return out


def _parts(delta: dict) -> list[dict]:
    """The deltas a coalesced delta stands for: one per kind of payload, each with the fields
    that are no payload (a hidden reasoning's `"reasoning": null`, a tool delta's `"content":
    null`)."""
    carried = _carries(delta)
    payload = {k for g in carried for k in g if delta.get(k)}
    parts: list[dict] = []
    for group in carried:
        own = {k: v for k, v in delta.items() if k not in payload or k in group}
        if group == ("tool_calls",):
            parts += [{**own, "tool_calls": calls} for calls in _split_start(own["tool_calls"])]
        else:
            parts.append(own)
    return parts


def uncoalesced(chunks: Iterable[Any]) -> list[Any]:
    """A stream with each coalesced chunk split into the chunks it stands for.

    vLLM's API server hands each request's output over through a collector
    (v1/engine/output_processor.py RequestOutputCollector) that MERGES the deltas the engine
    produced while the server's stream generator had not yet taken the last one. On an idle
    machine each step is its own chunk; on a busy one (the full suite at load 16) one chunk can
    carry the end of the reasoning, the content and the finish together
    (chat_completion/serving.py puts the merged delta on the finishing chunk). That is vLLM's
    own behaviour, not another wire shape, and the stub (like an idle vLLM) never does it. So
    before two streams are compared, a chunk carrying more than one kind of delta (reasoning,
    content, tool calls; a tool call's start with argument text) or a delta and the finish is
    split, in vLLM's order, into one chunk per kind with the same envelope: the parts before the
    finish have `finish_reason: null` and no `stop_reason` or `system_fingerprint`, and the
    finishing part has `delta: {}`, what vLLM with a reasoning or tool parser (as the suite's
    is run) sends for an end that brings no text."""
    out: list[Any] = []
    for chunk in chunks:
        choices = chunk.get("choices") if isinstance(chunk, dict) else None
        if not (isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict)):
            out.append(chunk)
            continue
        choice = choices[0]
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        parts = [] if "role" in delta else _parts(delta)
        finishing = choice.get("finish_reason") is not None
        if len(parts) + finishing <= 1:
            out.append(chunk)
            continue
        envelope = {k: v for k, v in chunk.items() if k not in ("choices", "system_fingerprint")}
        before = {k: v for k, v in choice.items() if k != "stop_reason"}
        out += [{**envelope, "choices": [{**before, "delta": part, "finish_reason": None}]} for part in parts]
        if finishing:
            out.append({**chunk, "choices": [{**choice, "delta": {}}]})
    return out


def stream_diff(a: list[Any], b: list[Any], a_name: str = "stub", b_name: str = "vllm") -> list[str]:
    """Differences of two streams (each `uncoalesced` first): their grammars, then each kind's
    shape."""
    a, b = uncoalesced(a), uncoalesced(b)
    out = []
    ga, gb = grammar(a), grammar(b)
    if ga != gb:
        out.append(f"chunk order: {a_name} {ga} != {b_name} {gb}")
    sa, sb = stream_shapes(a), stream_shapes(b)
    for k in sorted(set(sa) & set(sb)):
        out += [f"[{k}] {line}" for line in diff(sa[k], sb[k], a_name, b_name)]
    return out
