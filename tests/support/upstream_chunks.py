"""Hypothesis strategies: upstream chat-completion streams in vLLM, Ollama (OpenAI layer) and
llama.cpp shapes, their text and tool arguments cut at arbitrary points, with what a client
should end up with. For the surfaces' encoders, fed through the one decoder."""

from __future__ import annotations

import json

from hypothesis import strategies as st

TOOL_JSON = ['{"city": "Paris"}', '{"q": "a \\"quoted\\" é"}', "{}", '{"n": [1, 2, {"x": null}]}']
answer_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


def cuts(draw, s: str, max_pieces: int = 6) -> list[str]:
    if not s:
        return []
    points = sorted(set(draw(st.lists(st.integers(1, max(1, len(s) - 1)), max_size=max_pieces - 1))))
    bounds = [0, *[p for p in points if 0 < p < len(s)], len(s)]
    return [s[i:j] for i, j in zip(bounds, bounds[1:])]


def chunk(delta: dict | None = None, finish=None, usage=None, choices=True) -> bytes:
    obj: dict = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1, "model": "up"}
    obj["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []
    if usage is not None:
        obj["usage"] = usage
    return json.dumps(obj).encode()


@st.composite
def upstream_streams(draw):
    """-> (SSE payloads ending in [DONE], expected: reasoning, content, tools [(id, name, args)],
    finish, prompt tokens or None)."""
    flavor = draw(st.sampled_from(["vllm", "ollama", "llamacpp"]))
    reasoning = draw(answer_text) if flavor != "ollama" else ""
    content = draw(answer_text)
    n_tools = draw(st.integers(0, 2))
    tools = [(f"call_{i}x", draw(st.sampled_from(["get_weather", "lookup"])), draw(st.sampled_from(TOOL_JSON)))
             for i in range(n_tools)]
    finish = "tool_calls" if tools else draw(st.sampled_from(["stop", "length"]))
    prompt = draw(st.integers(1, 500))
    rkey = "reasoning" if flavor == "vllm" else "reasoning_content"
    chunks = [chunk({"role": "assistant", "content": "" if flavor != "llamacpp" else None})]
    for piece in cuts(draw, reasoning):
        chunks.append(chunk({rkey: piece}))
    for piece in cuts(draw, content):
        chunks.append(chunk({"content": piece}))
        if draw(st.integers(0, 5)) == 0:
            chunks.append(chunk({"content": ""}))
    for i, (tid, name, args) in enumerate(tools):
        if flavor == "ollama":  # whole, in one delta
            chunks.append(chunk({"role": "assistant", "content": "", "tool_calls": [
                {"id": tid, "index": i, "type": "function", "function": {"name": name, "arguments": args}}]}))
            continue
        pieces = cuts(draw, args)
        chunks.append(chunk({"tool_calls": [{"id": tid, "type": "function", "index": i, "function": {"name": name}}]}))
        for piece in pieces:
            chunks.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
    usage = {"prompt_tokens": prompt, "completion_tokens": len(chunks), "total_tokens": 0}
    if flavor == "llamacpp":
        chunks.append(chunk({}, finish=finish, usage=usage))
    else:
        chunks.append(chunk({}, finish=finish))
        chunks.append(chunk(choices=False, usage=usage))
    chunks.append(b"[DONE]")
    return chunks, {"reasoning": reasoning, "content": content, "tools": tools, "finish": finish, "prompt": prompt}
