"""The client's model name put back into an upstream's JSON, whatever its spelling
(surfaces/model_rewrite.py): pure."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend.surfaces.model_rewrite import ModelRewriter

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=examples(300))
@given(
    others=st.dictionaries(st.text(max_size=6).filter(lambda k: k != "model"), _json_values, max_size=4),
    upstream=st.sampled_from(["fake", "internal/secret.gguf", "a\"b", "ünï", "/models/q4.gguf"]),
    position=st.integers(min_value=0, max_value=4),
    spacing=st.sampled_from([(",", ":"), (", ", ": "), (",", " : "), (" ,", ":  ")]),
    ensure_ascii=st.booleans(),
    escape_slash=st.booleans(),
)
def test_model_rewrite_is_exact_for_any_spacing_and_key_order(others, upstream, position, spacing, ensure_ascii,
                                                              escape_slash):
    items = list(others.items())
    items.insert(min(position, len(items)), ("model", upstream))
    raw = json.dumps(dict(items), separators=spacing, ensure_ascii=ensure_ascii)
    if escape_slash:
        raw = raw.replace("/", "\\/")  # PHP and some servers escape slashes
    rw = ModelRewriter("fake", "client-name")
    out = rw(raw.encode())
    doc = json.loads(out)
    assert doc["model"] == "client-name"
    assert {k: v for k, v in doc.items() if k != "model"} == others


def test_model_rewrite_compact_fast_path_and_a_learnt_name():
    rw = ModelRewriter("asked-for", "client")
    compact = b'{"id":"x","model":"asked-for","choices":[]}'
    assert rw(compact) == b'{"id":"x","model":"client","choices":[]}'
    # llama.cpp answers with the file it loaded: the needle is learnt, later chunks are fast again
    other = b'{"model":"/m/gemma.gguf","choices":[]}'
    assert json.loads(rw(other))["model"] == "client"
    assert rw.needle == b'"model":"/m/gemma.gguf"'
    assert rw(other) == b'{"model":"client","choices":[]}'
    # no model, or already the client's: the very bytes
    assert rw(b'{"choices":[]}') == b'{"choices":[]}'
    assert rw(b'{"model":"client"}') == b'{"model":"client"}'
    # "model": inside string content is escaped, so it is never touched
    text = b'{"model":"client","choices":[{"delta":{"content":"\\"model\\":\\"asked-for\\""}}]}'
    assert rw(text) == text
