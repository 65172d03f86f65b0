"""The Anthropic wire rules both encoders share (surfaces/anthropic/rules.py)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.surfaces.anthropic import assemble, rules, stream
from homelab_frontend.surfaces.anthropic.rules import STOP_REASONS, new_message_id, new_tool_use_id, tool_use_id


def test_one_table_for_both_encoders():
    assert stream.STOP_REASONS is STOP_REASONS and assemble.STOP_REASONS is STOP_REASONS
    assert STOP_REASONS == {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                            "stop_sequence": "stop_sequence", "content_filter": "refusal"}


def test_id_shapes():
    assert re.fullmatch(r"toolu_[A-Za-z0-9]{24}", new_tool_use_id())
    assert re.fullmatch(r"msg_[A-Za-z0-9]{24}", new_message_id())
    assert len({new_tool_use_id() for _ in range(1000)}) == 1000


@given(st.lists(st.one_of(st.none(), st.text(max_size=140), st.sampled_from(["call_1", "call_1", "a-b_C9"])),
                max_size=12))
def test_tool_ids_are_valid_and_unique_within_a_message(upstream_ids):
    used: set[str] = set()
    out = [tool_use_id(i, used) for i in upstream_ids]
    assert len(set(out)) == len(out) and set(out) == used
    for given_id, got in zip(upstream_ids, out):
        assert re.fullmatch(r"[A-Za-z0-9_-]{1,128}", got)
        if got != given_id:
            assert got.startswith("toolu_")


def test_a_valid_unused_upstream_id_is_kept_and_the_generator_is_injectable():
    used: set[str] = set()
    assert tool_use_id("call_abc", used) == "call_abc"
    assert tool_use_id("call_abc", used, new=lambda: "toolu_x") == "toolu_x"  # used already
    assert tool_use_id("bad id!", used, new=lambda: "toolu_y") == "toolu_y"
    assert rules.tool_use_id(None, used, new=lambda: "toolu_z") == "toolu_z"
