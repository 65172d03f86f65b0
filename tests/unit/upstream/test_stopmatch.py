"""StopMatcher: examples and hypothesis properties (any text, any split, any stop list)."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from homelab_frontend.canonical import (
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolArgsDelta,
    ToolCallStart,
    UpstreamError,
    Usage,
)
from homelab_frontend.upstream.stopmatch import StopMatcher


def examples(n: int) -> int:
    """Example count; HLF_HYPOTHESIS_SCALE=10 runs a deeper search locally."""
    return int(n * float(os.environ.get("HLF_HYPOTHESIS_SCALE", "1")))


def run(stops, events):
    m = StopMatcher(stops)
    out = []
    for ev in events:
        out.extend(m.feed(ev))
    return m, out


def texts(events):
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def test_match_inside_one_delta():
    m, out = run(["###"], [TextDelta("abc###def"), Finish("stop")])
    assert out == [TextDelta("abc"), Finish("stop_sequence", "###")]
    assert m.matched == "###"


def test_match_spanning_deltas_and_hold_back():
    m = StopMatcher(["STOP"])
    assert m.feed(TextDelta("hello ST")) == [TextDelta("hello ")]
    assert m.held == "ST"
    assert m.feed(TextDelta("O")) == []
    assert m.feed(TextDelta("P and more")) == [Finish("stop_sequence", "STOP")]
    assert m.matched == "STOP"


def test_false_start_is_released():
    m = StopMatcher(["STOP"])
    assert m.feed(TextDelta("ST")) == []
    assert m.feed(TextDelta("ar")) == [TextDelta("STar")]
    assert m.held == ""


def test_no_hold_when_no_prefix_can_match():
    m = StopMatcher(["</answer>"])
    assert m.feed(TextDelta("plain text")) == [TextDelta("plain text")]


def test_finish_flushes_held_text_first():
    m, out = run(["STOP"], [TextDelta("abc S"), Finish("length")])
    assert out == [TextDelta("abc "), TextDelta("S"), Finish("length")]
    assert m.matched is None


def test_tool_call_flushes_held_text_first():
    _, out = run(["STOP"], [TextDelta("x ST"), ToolCallStart(0, "c", "f"), TextDelta("OP")])
    assert out == [TextDelta("x "), TextDelta("ST"), ToolCallStart(0, "c", "f"), TextDelta("OP")]


def test_earliest_match_wins_even_if_a_later_one_completes_first():
    # "bcd" completes before "abcde" could, but "abcde" would start earlier: wait and see
    m = StopMatcher(["bcd", "abcde"])
    assert m.feed(TextDelta("xabcd")) == [TextDelta("x")]
    assert m.feed(TextDelta("e")) == [Finish("stop_sequence", "abcde")]
    m = StopMatcher(["bcd", "abcde"])
    m.feed(TextDelta("xabcd"))
    assert m.feed(TextDelta("Z")) == [TextDelta("a"), Finish("stop_sequence", "bcd")]


def test_tie_goes_to_the_shortest():
    _, out = run(["abc", "ab"], [TextDelta("xabc")])
    assert out == [TextDelta("x"), Finish("stop_sequence", "ab")]


def test_complete_match_inside_held_text_resolves_at_finish():
    m = StopMatcher(["bc", "abcd"])
    assert m.feed(TextDelta("abc")) == []
    assert m.feed(Finish("stop")) == [TextDelta("a"), Finish("stop_sequence", "bc")]


def test_after_match_only_usage_passes():
    m, out = run(
        ["X"],
        [TextDelta("aXb"), TextDelta("more"), ReasoningDelta("r"), Finish("stop"), Usage(1, 2), UpstreamError("e")],
    )
    assert out == [TextDelta("a"), Finish("stop_sequence", "X"), Usage(1, 2)]


def test_usage_passes_without_flushing():
    m = StopMatcher(["STOP"])
    assert m.feed(TextDelta("aS")) == [TextDelta("a")]
    assert m.feed(Usage(3, 4)) == [Usage(3, 4)]
    assert m.held == "S"


def test_empty_stops_and_empty_text():
    m, out = run(["", ""], [TextDelta(""), TextDelta("abc"), Finish("stop")])
    assert out == [TextDelta("abc"), Finish("stop")]
    _, out = run(["Q"], [TextDelta(""), ReasoningDelta("Q"), ToolArgsDelta(0, "Q")])
    assert out == [ReasoningDelta("Q"), ToolArgsDelta(0, "Q")]  # only answer text is matched


# ---------------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------------

ALPHABET = "ab\n#"
stop_lists = st.lists(st.text(ALPHABET, min_size=1, max_size=4), min_size=1, max_size=3)


@st.composite
def split_text(draw, text_strategy=st.text(ALPHABET, max_size=30)):
    text = draw(text_strategy)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    return text, [text[i:j] for i, j in zip(bounds, bounds[1:])]  # may contain "" pieces


def expected(text, stops):
    hits = [(text.find(s), len(s), s) for s in stops if text.find(s) != -1]
    if not hits:
        return text, None
    pos, _, s = min(hits)
    return text[:pos], s


@settings(max_examples=examples(300), deadline=None)
@given(stop_lists, split_text())
def test_property_any_split_cuts_at_the_first_occurrence(stops, split):
    text, pieces = split
    m, out = run(stops, [TextDelta(p) for p in pieces] + [Finish("length"), Usage(7, 8)])
    want_text, want_stop = expected(text, stops)
    assert texts(out) == want_text
    assert all(e.text for e in out if isinstance(e, TextDelta)), "empty TextDelta emitted"
    finishes = [e for e in out if isinstance(e, Finish)]
    assert len(finishes) == 1
    if want_stop is None:
        assert finishes[0] == Finish("length")
        assert m.matched is None
    else:
        assert finishes[0] == Finish("stop_sequence", want_stop)
        assert m.matched == want_stop
    assert out[-1] == Usage(7, 8)
    assert out[-2] == finishes[0]


@settings(max_examples=examples(200), deadline=None)
@given(stop_lists, split_text())
def test_property_hold_back_is_bounded_and_emission_is_prompt(stops, split):
    text, pieces = split
    m = StopMatcher(stops)
    longest = max(len(s) for s in stops)
    emitted = ""
    fed = ""
    for p in pieces:
        fed += p
        out = m.feed(TextDelta(p))
        emitted += texts(out)
        if m.matched is not None:
            break
        assert len(m.held) <= longest - 1
        assert emitted + m.held == fed  # nothing lost, nothing reordered
        # what is held is exactly a proper prefix of some stop string: it could still match
        if m.held:
            assert any(len(s) > len(m.held) and s.startswith(m.held) for s in stops)


@settings(max_examples=examples(150), deadline=None)
@given(
    stop_lists,
    st.lists(
        st.one_of(
            st.text(ALPHABET, max_size=6).map(TextDelta),
            st.just(ToolCallStart(0, "c", "f")),
            st.text(ALPHABET, max_size=3).map(ReasoningDelta),
            st.just(Usage(1, 1)),
        ),
        max_size=12,
    ),
)
def test_property_other_events_break_text_and_keep_order(stops, events):
    """Segments of text between non-text events are matched independently, order kept."""
    m, out = run(stops, events + [Finish("stop")])
    # expected: walk segments
    want = []
    seg = ""
    done = False
    for ev in events + [Finish("stop")]:
        if isinstance(ev, TextDelta):
            seg += ev.text
            continue
        if isinstance(ev, Usage):
            want.append(ev)
            continue
        t, s = expected(seg, stops)
        if t:
            want.append(("text", t))
        seg = ""
        if s is not None:
            want.append(Finish("stop_sequence", s))
            done = True
            break
        want.append(ev)
    got = []
    for ev in out:
        if isinstance(ev, Usage):
            continue
        if isinstance(ev, TextDelta):
            if got and isinstance(got[-1], tuple):
                got[-1] = ("text", got[-1][1] + ev.text)
            else:
                got.append(("text", ev.text))
        else:
            got.append(ev)
    # Usage events always pass (before and after a match) but are not positional: compare the
    # rest in order, and the Usage count
    strip = lambda xs: [x for x in xs if not isinstance(x, Usage)]  # noqa: E731
    assert got == strip(want)
    n_usage = sum(isinstance(e, Usage) for e in events)
    assert sum(isinstance(e, Usage) for e in out) == n_usage
    assert (m.matched is not None) == done
