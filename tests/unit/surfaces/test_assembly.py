"""surfaces/assembly.py: what every dialect's encoders do alike (tool-call arguments, an upstream
failure in a whole answer)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend import canonical as c
from homelab_frontend.surfaces.assembly import tool_arguments, upstream_failure


@pytest.mark.parametrize("raw, want", [
    ("", {}), ("   ", {}), ("null", {}),
    ('{"path": "a.txt"}', {"path": "a.txt"}),
    ('{"path": "a.t', {"_raw_arguments": '{"path": "a.t'}),  # cut off by the token limit
    ("[1, 2]", {"_raw_arguments": "[1, 2]"}),  # JSON, but not an object
    ('"text"', {"_raw_arguments": '"text"'}),
    ("[" * 5000 + "]" * 5000, {"_raw_arguments": "[" * 5000 + "]" * 5000}),  # deep: no RecursionError out
])
def test_tool_arguments(raw, want):
    assert tool_arguments(raw) == want


@given(st.dictionaries(st.text(max_size=8), st.one_of(st.none(), st.integers(), st.text(max_size=8)), max_size=5))
def test_any_object_comes_back_as_itself(obj):
    assert tool_arguments(json.dumps(obj)) == obj


@given(st.text(max_size=40))
def test_any_text_is_an_object_never_an_exception(raw):
    out = tool_arguments(raw)
    assert isinstance(out, dict)
    if out and "_raw_arguments" in out and len(out) == 1 and not raw.strip().startswith("{"):
        assert out["_raw_arguments"] == raw


@pytest.mark.parametrize("kind, want_kind, want_status", [
    ("timeout_error", "timeout", 504),
    ("overloaded_error", "upstream_error", 503),
    ("api_error", "upstream_error", 502),
])
def test_an_upstream_failure_in_a_whole_answer(kind, want_kind, want_status):
    err = upstream_failure(c.UpstreamError("backend 'b' stopped", kind=kind))
    assert (err.kind, err.status, err.message) == (want_kind, want_status, "backend 'b' stopped")


def test_a_failure_without_words_still_says_something():
    assert upstream_failure(c.UpstreamError("")).message == "the upstream failed while answering"
