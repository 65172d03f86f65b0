"""The shape of what a server sends, for comparing two servers (the stub and the real vLLM)
structurally: field names and JSON types, never values (ids, timestamps, text, token counts).

- `paths(doc)`: the set of `path: type` lines of a JSON document; list elements share one path
  (`choices[].delta.content: str`), so a document's shape does not depend on how many there are;
- `kind(chunk)`: what one chat-completion stream chunk is (the opening role chunk, reasoning,
  content, a tool call's start or its argument fragments, the finish, the usage-only chunk, an
  error), and `grammar(chunks)`: the stream as its run of kinds, repeats collapsed, so a stream of
  3 content tokens and one of 30 read the same;
- `stream_shapes(chunks)`: per kind, the union of its chunks' shapes;
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


def stream_diff(a: list[Any], b: list[Any], a_name: str = "stub", b_name: str = "vllm") -> list[str]:
    """Differences of two streams: their grammars, then each kind's shape."""
    out = []
    ga, gb = grammar(a), grammar(b)
    if ga != gb:
        out.append(f"chunk order: {a_name} {ga} != {b_name} {gb}")
    sa, sb = stream_shapes(a), stream_shapes(b)
    for k in sorted(set(sa) & set(sb)):
        out += [f"[{k}] {line}" for line in diff(sa[k], sb[k], a_name, b_name)]
    return out
