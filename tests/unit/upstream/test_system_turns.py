"""system_turns.place: one leading system message, later system turns merged in place, and a
conversation's rendering never changed by the turns added after it (property-tested)."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support.scale import examples

from homelab_frontend.upstream.system_turns import place, wrap


def test_leading_system_messages_are_joined_and_later_ones_merged_into_the_message_before():
    msgs = [
        {"role": "system", "content": "a"},
        {"role": "system", "content": "b"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "env"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "tool_call_id": "1", "content": "out"},
        {"role": "system", "content": "<total_tokens>5</total_tokens>"},
    ]
    assert place(msgs) == [
        {"role": "system", "content": "a\n\nb"},
        {"role": "user", "content": "hi\n\n<system>\nenv\n</system>"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]},
        {"role": "tool", "tool_call_id": "1", "content": "out\n\n<system>\n<total_tokens>5</total_tokens>\n</system>"},
    ]
    assert msgs[2] == {"role": "user", "content": "hi"}  # the input is not modified


def test_after_an_assistant_a_system_turn_opens_the_next_user_message_or_stands_alone():
    a = {"role": "assistant", "content": "done"}
    assert place([{"role": "user", "content": "u"}, a, {"role": "system", "content": "s"}]) == [
        {"role": "user", "content": "u"}, a, {"role": "user", "content": wrap("s")}]
    assert place([{"role": "user", "content": "u"}, a, {"role": "system", "content": "s"},
                  {"role": "user", "content": [{"type": "text", "text": "v"}]}])[-1] == {
        "role": "user", "content": [{"type": "text", "text": wrap("s")}, {"type": "text", "text": "v"}]}


def test_native_keeps_later_system_turns_in_place():
    msgs = [{"role": "system", "content": "a"}, {"role": "user", "content": "u"}, {"role": "system", "content": "s"}]
    assert place(msgs, "native") == msgs


_roles = st.lists(st.sampled_from(["system", "user", "assistant", "tool"]), min_size=1, max_size=12)


def _conversation(roles: list[str]) -> list[dict]:
    return [{"role": r, "content": f"{r}{i}"} for i, r in enumerate(roles)]


def _render(messages: list[dict]) -> str:
    # any template is a function of the messages in order; this one hides nothing
    return "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)


@settings(max_examples=examples(300), deadline=None)
@given(_roles, st.integers(min_value=1, max_value=12))
def test_merged_no_system_after_other_and_history_never_rerendered(roles, cut):
    # Tool results follow the assistant's calls directly (OpenAI requires it; the Anthropic
    # surface moves a system turn that sits between them to after the results). A system turn
    # between the two is the one case placed by what follows (first in the first tool message).
    squeezed = "".join("s" if r == "system" else r[0] for r in roles)
    assume(not any(seg.startswith("a") and seg.endswith("t") and set(seg[1:-1]) == {"s"}
                   for seg in (squeezed[i:j] for i in range(len(squeezed)) for j in range(i + 3, len(squeezed) + 1))))
    full = _conversation(roles)
    cut = min(cut, len(full))
    placed = place(full)
    seen_other = False
    for m in placed:
        assert not (m["role"] == "system" and seen_other)
        seen_other |= m["role"] != "system"
    # what a shorter conversation rendered is where the longer one's rendering starts (less
    # the closing of its last message, which a later system turn may extend)
    assert _render(placed).startswith(_render(place(full[:cut])).removesuffix("<|end|>"))
    # nothing is lost: every message's text is still there, in order
    text = _render(placed)
    positions = [text.find(m["content"]) for m in full]
    assert all(p >= 0 for p in positions) and positions == sorted(positions)


def test_consecutive_user_messages_are_joined_so_every_template_sees_roles_alternate():
    # Codex: its <environment_context>, then the prompt, as two user items in a row
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "<environment_context>"},
            {"role": "user", "content": "do it"}, {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]},
            {"role": "user", "content": "and this"}]
    assert place(msgs) == [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "<environment_context>\n\ndo it"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}},
                                     {"type": "text", "text": "and this"}]},
    ]
    assert place(msgs, "native") == msgs  # native: the template's own business
