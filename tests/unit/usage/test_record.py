"""A finished request read off its record into a ledger entry (usage/record.py): pure."""

from __future__ import annotations

import asyncio

from support.records import usage_record

from homelab_frontend.usage.record import entry_of

T0 = 1_796_119_200.0  # 2026-12-01T10:00:00Z


def test_reported_usage_is_exact():
    e = entry_of(usage_record(tokens_in=30, tokens_out=7, tokens_cached=16, slot_seconds=0.5, queue_wait=0.1,
                      upstream_headers=0.01), T0)
    assert (e.input_tokens, e.cached_tokens, e.output_tokens, e.input_exact, e.output_exact) == (30, 16, 7, True, True)
    assert e.tokens == 37 and e.slot_seconds == 0.5 and e.queue_seconds == 0.1


def test_a_cut_stream_without_usage_is_estimated():
    e = entry_of(usage_record(tokens_out=12, slot_seconds=1.0, upstream_headers=0.01, outcome="cancelled_streaming"), T0)
    assert (e.input_tokens, e.output_tokens, e.input_exact, e.output_exact) == (100, 12, False, False)


def test_nothing_ran_nothing_counted():
    queued = entry_of(usage_record(outcome="cancelled_queued", queue_wait=2.0), T0)
    assert (queued.input_tokens, queued.output_tokens, queued.input_exact) == (0, 0, True)
    refused_upstream = entry_of(usage_record(outcome="error_upstream_error", slot_seconds=0.01), T0)
    assert refused_upstream.tokens == 0
    budget = entry_of(usage_record(upstream_model=None, outcome="rejected_rate_limit"), T0)
    assert budget is not None and budget.tokens == 0 and budget.upstream == ""


def test_what_generates_nothing_is_not_a_row():
    assert entry_of(usage_record(model=""), T0) is None  # a model listing, a 401
    assert entry_of(usage_record(upstream_model=None, tokens_in=12), T0) is None  # count_tokens, a stored response read


def test_the_load_wait_is_the_records():
    assert entry_of(usage_record(load_wait=3.5), T0).load_seconds == 3.5


def test_the_request_record_has_every_field_the_ledger_reads():
    from homelab_frontend.request.tracker import Tracked
    from homelab_frontend.usage.record import Record

    async def record() -> Tracked:  # a record belongs to a running loop
        return Tracked("r", "openai", "m", None, False)

    t = asyncio.run(record())
    assert [f for f in Record.__annotations__ if not hasattr(t, f)] == []


def test_a_relayed_calls_units_are_counted_beside_its_tokens():
    e = entry_of(usage_record(units={"documents": 3.0, "characters": 11.0, "images": 2.0, "audio_seconds": 2.5},
                      tokens_in=40, slot_seconds=0.2, upstream_headers=0.01), T0)
    assert (e.documents, e.characters, e.images, e.audio_seconds) == (3, 11, 2, 2.5)
    assert e.tokens == 40


def test_a_call_that_never_reached_a_backend_cost_no_units():
    e = entry_of(usage_record(units={"characters": 11.0}, outcome="rejected_rate_limit", upstream_model=None), T0)
    assert e.characters == 0
