"""surfaces/usage.py: the one fold of an answer's counts into its record, chunk by chunk."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend import canonical as c
from homelab_frontend.surfaces.usage import UsageFold


@dataclass
class _Record:  # the counts of request.tracker.Tracked that the fold writes
    tokens_in: int | None = None
    tokens_out: int = 0
    tokens_cached: int | None = None


class _Exchange:  # what of request.exchange.Exchange the fold calls
    def __init__(self) -> None:
        self.first_tokens = 0

    def first_token(self) -> None:
        self.first_tokens += 1


def _fold(first: bool = True) -> tuple[UsageFold, _Record, _Exchange]:
    t, ex = _Record(), _Exchange()
    return UsageFold(t, ex, first=first), t, ex  # type: ignore[arg-type]


_DELTAS = st.sampled_from([c.TextDelta("a"), c.ReasoningDelta("r"), c.ToolArgsDelta(0, "{")])
# an upstream chunk: its generated deltas (0 for the opening or a finish-only chunk)
_CHUNKS = st.lists(st.lists(_DELTAS, max_size=2), min_size=1, max_size=30)


@given(chunks=_CHUNKS, prompt=st.integers(0, 10_000))
def test_continuous_usage_counts_each_token_once(chunks, prompt):
    # vLLM's continuous usage: each chunk's report counts the tokens generated so far, its own included
    fold, t, _ = _fold()
    generated = 0
    for deltas in chunks:
        generated += len(deltas)
        fold.chunk([c.Usage(prompt, generated, None), *deltas])
        assert t.tokens_out == generated and t.tokens_in == prompt


@given(chunks=_CHUNKS)
def test_without_reports_each_delta_is_one_token(chunks):
    fold, t, _ = _fold()
    for deltas in chunks:
        fold.chunk(list(deltas))
    assert t.tokens_out == sum(map(len, chunks)) and t.tokens_in is None and t.tokens_cached is None


@given(chunks=_CHUNKS, reported=st.integers(0, 10_000))
def test_the_last_report_replaces_the_running_count(chunks, reported):
    fold, t, _ = _fold()
    for deltas in chunks:
        fold.chunk(list(deltas))
    fold.chunk([c.Usage(7, reported, 3)])  # the usage-only last chunk
    assert (t.tokens_in, t.tokens_out, t.tokens_cached) == (7, reported, 3)


def test_a_count_left_out_keeps_its_value():
    fold, t, _ = _fold()
    fold.chunk([c.Usage(10, 0, 4)])
    fold.chunk([c.Usage(None, 2, None), c.TextDelta("x")])
    fold.chunk([c.TextDelta("y")])
    assert (t.tokens_in, t.tokens_out, t.tokens_cached) == (10, 3, 4)


def test_the_first_token_is_reported_once_at_the_first_generating_chunk():
    fold, t, ex = _fold()
    assert fold.chunk([c.Usage(5, 0, None)]) is False  # vLLM's opening chunk: usage, no token
    assert fold.chunk([]) is False
    assert ex.first_tokens == 0
    assert fold.chunk([c.Usage(5, 1, None), c.TextDelta("a")]) is True
    assert fold.chunk([c.TextDelta("b")]) is False
    assert ex.first_tokens == 1


def test_a_tool_call_start_is_a_first_token_but_not_a_counted_one():
    fold, t, ex = _fold()
    assert fold.chunk([c.ToolCallStart(0, "call_1", "Bash")]) is True
    assert ex.first_tokens == 1 and t.tokens_out == 0


def test_add_is_the_same_fold_for_a_relay_that_decodes_no_events():
    fold, t, ex = _fold()
    assert fold.add(6, 0, None, 0) is False  # usage, nothing generated
    assert fold.add(6, 1, None, 1) is True  # continuous usage on the first token (it once hid it)
    assert fold.add(None, None, None, 1) is False
    assert (t.tokens_in, t.tokens_out, ex.first_tokens) == (6, 2, 1)


def test_a_whole_answer_takes_only_its_usage_and_awaits_no_first_token():
    fold, t, ex = _fold(first=False)
    fold.whole([c.TextDelta("the whole message"), c.Usage(9, 4, 2), c.Finish("stop")])
    assert (t.tokens_in, t.tokens_out, t.tokens_cached) == (9, 4, 2)
    fold.whole([c.TextDelta("no usage")])
    assert t.tokens_out == 4 and ex.first_tokens == 0
    fold.chunk([c.TextDelta("streamed for a client that waits")])
    assert ex.first_tokens == 0
