"""The outcome table (request/outcome.py) and the record that applies it (Tracked.end). The
record's own cancels and the Tracker: test_tracker.py."""

from __future__ import annotations


import pytest
from hypothesis import given
from hypothesis import strategies as st

from support.records import tracked

from homelab_frontend.request import tracker as tr
from homelab_frontend.request.outcome import DONE, FAILED, LEFT, OK, STALLED, outcome_of

PHASES = [tr.QUEUED, tr.CONNECTING, tr.FIRST_TOKEN, tr.STREAMING, tr.GENERATING]
KINDS = ["overloaded", "rate_limit", "timeout", "upstream_midstream", "upstream_unreachable", "invalid_request"]


@pytest.mark.parametrize("phase", PHASES)
def test_the_table(phase):
    assert outcome_of(phase, DONE) == OK
    assert outcome_of(phase, LEFT) == f"cancelled_{phase}"
    assert outcome_of(phase, STALLED) == "cancelled_client_stalled"
    assert outcome_of(phase, FAILED, "overloaded", begun=False) == "rejected_overloaded"
    assert outcome_of(phase, FAILED, "rate_limit", begun=False) == "rejected_rate_limit"
    assert outcome_of(phase, FAILED, "overloaded", begun=True) == "error_overloaded"
    assert outcome_of(phase, FAILED, "timeout", begun=False) == "error_timeout"
    assert outcome_of(phase, FAILED, "upstream_midstream") == "error_upstream_midstream"


def test_bad_causes_are_refused():
    with pytest.raises(ValueError):
        outcome_of(tr.QUEUED, "exploded")
    with pytest.raises(ValueError):
        outcome_of(tr.QUEUED, FAILED)  # a failure without its kind


@given(st.lists(st.tuples(st.sampled_from([DONE, LEFT, STALLED, FAILED]), st.sampled_from(KINDS),
                          st.booleans()), min_size=1, max_size=6))
def test_first_cause_wins_unless_overridden(causes):
    t = tracked()
    expected = OK
    for cause, kind, override in causes:
        t.end(cause, kind, override=override)
        if override or expected == OK:
            expected = outcome_of(t.phase, cause, kind)
        assert t.outcome == expected


def test_the_record_names_the_phase_it_left_in():
    t = tracked()
    t.connecting(), t.answering(stream=True), t.streaming()
    t.end(LEFT, override=True)
    assert t.outcome == "cancelled_streaming"
