"""The outcome table (request/outcome.py) and the record that applies it (Tracked.end)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from homelab_frontend.request import tracker as tr
from homelab_frontend.request.outcome import DONE, FAILED, LEFT, OK, STALLED, outcome_of
from homelab_frontend.request.tracker import Tracked, Tracker

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


def _record() -> Tracked:
    """A record made where the gateway makes them: inside a task (it notes its own)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        async def make() -> Tracked:
            return Tracked(tr.new_request_id(), "openai", "m", None, False)
        return asyncio.run(make())
    return Tracked(tr.new_request_id(), "openai", "m", None, False)


@given(st.lists(st.tuples(st.sampled_from([DONE, LEFT, STALLED, FAILED]), st.sampled_from(KINDS),
                          st.booleans()), min_size=1, max_size=6))
def test_first_cause_wins_unless_overridden(causes):
    t = _record()
    expected = OK
    for cause, kind, override in causes:
        t.end(cause, kind, override=override)
        if override or expected == OK:
            expected = outcome_of(t.phase, cause, kind)
        assert t.outcome == expected


def test_the_record_names_the_phase_it_left_in():
    t = _record()
    t.connecting(), t.answering(stream=True), t.streaming()
    t.end(LEFT, override=True)
    assert t.outcome == "cancelled_streaming"


def test_a_stalled_client_is_its_own_cancel_not_a_timeout():
    async def main():
        t = _record()
        task = asyncio.current_task()
        t.task = task
        assert t.cancel("client_stalled", "stopped reading")
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            err = t.own_cancel_error()
        assert err is not None and err.kind == "timeout"
        assert t.outcome == "cancelled_client_stalled"
        assert not task.cancelling()  # taken back: the error is answered, not propagated

    asyncio.run(main())


def test_own_cancel_reasons_map_to_errors():
    async def main():
        out = {}
        for reason in ("timeout", "shutdown", "slot_lost", "admin"):
            t = _record()
            t.task = asyncio.current_task()
            t.cancel(reason, "why")
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                err = t.own_cancel_error()
            out[reason] = (err.kind, err.status)
        return out

    got = asyncio.run(main())
    assert got["timeout"][0] == "timeout"
    assert got["shutdown"] == ("overloaded", 503)
    assert got["slot_lost"] == ("overloaded", 503)
    assert got["admin"] == ("api_error", 503)


def test_a_client_leaving_is_no_own_cancel():
    t = _record()
    assert t.own_cancel_error() is None  # nothing of ours cancelled it
    assert not t.cancel("timeout")  # its task is over: nothing left to cancel


def test_tracker_lists_finds_and_cancels():
    async def main():
        trk = Tracker()
        t = _record()
        t.task = asyncio.current_task()
        trk.add(t)
        assert len(trk) == 1 and trk.get(t.id) is t and list(trk) == [t]
        assert not trk.cancel("req_nope", "admin")
        assert trk.cancel(t.id, "admin")
        assert not trk.cancel(t.id, "admin")  # once
        try:
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            t.own_cancel_error()
        trk.remove(t)
        trk.remove(t)  # idempotent
        assert len(trk) == 0 and trk.get(t.id) is None

    asyncio.run(main())


def test_as_dict_has_no_message_text_and_the_fields_the_admin_api_shows():
    t = _record()
    d = t.as_dict()
    assert set(d) == {"id", "dialect", "model", "backend", "key", "phase", "stream", "age_s", "started",
                      "tokens_out", "backends_tried", "served_model", "client", "endpoint"}
    assert d["phase"] == tr.QUEUED
