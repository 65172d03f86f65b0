"""surfaces/one_line.py: a JSON frame stays one line for every line reader, and means the same."""

from __future__ import annotations

import json

import msgspec
from hypothesis import given, strategies as st

from homelab_frontend.surfaces.one_line import one_line

_breaks = st.sampled_from(["\u0085", "\u2028", "\u2029", "\u2027", "\u20ac", "a", "é"])


@given(st.lists(_breaks | st.text(max_size=4), max_size=12).map("".join))
def test_any_text_is_one_line_and_the_same_text(text):
    frame = one_line(msgspec.json.encode({"t": text}))
    assert len(frame.decode().splitlines()) == 1  # Python's reader: the strictest
    assert json.loads(frame) == {"t": text}


def test_untouched_without_separators():
    frame = msgspec.json.encode({"t": "plain \u20ac"})
    assert one_line(frame) is frame
    assert one_line(msgspec.json.encode("\u0085\u2028\u2029")) == b'"\\u0085\\u2028\\u2029"'
