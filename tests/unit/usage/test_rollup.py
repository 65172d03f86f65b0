"""Ledger entries summed into rows and totals (usage/rollup.py): pure."""

from __future__ import annotations

from hypothesis import given, strategies as st

from support.records import usage_record

from homelab_frontend.usage.record import entry_of
from homelab_frontend.usage.rollup import METRICS, Rollup, aggregate, totals

T0 = 1_796_119_200.0  # 2026-12-01T10:00:00Z


_entries = st.lists(st.tuples(
    st.floats(0, 3 * 86400), st.sampled_from(["alice", "bob", ""]), st.sampled_from(["m1", "m2"]),
    st.sampled_from(["ok", "cancelled_streaming", "error_timeout", "rejected_rate_limit"]),
    st.integers(0, 5000), st.integers(0, 5000), st.floats(0, 10)), max_size=60)


@given(_entries, st.sampled_from(["hour", "day"]))
def test_rows_sum_to_the_entries_whatever_the_grouping(raw, by):
    roll = Rollup()
    entries = []
    for dt, key, model, outcome, tin, tout, slot in raw:
        e = entry_of(usage_record(key_name=key, model=model, outcome=outcome, tokens_in=tin, tokens_out=tout,
                          slot_seconds=slot, upstream_headers=0.0), T0 + dt)
        entries.append(e)
        roll.add(e)
    rows = aggregate(roll.take().items(), by)
    assert sum(r["requests"] for r in rows) == len(entries)
    assert sum(r["input_tokens"] for r in rows) == sum(e.input_tokens for e in entries)
    assert sum(r["output_tokens"] for r in rows) == sum(e.output_tokens for e in entries)
    assert all(r["ok"] + r["cancelled"] + r["failed"] + r["refused"] == r["requests"] for r in rows)
    step = 86400 if by == "day" else 3600
    assert all(r["start_unix"] % step == 0 for r in rows)
    assert len({(r["key"], r["model"], r["start"]) for r in rows}) == len(rows)
    per = totals(rows)
    assert sum(t["requests"] for t in per) == len(entries) and all(set(METRICS) <= t.keys() for t in per)


def test_a_relayed_calls_units_sum_in_its_row():
    e = entry_of(usage_record(units={"documents": 3.0, "characters": 11.0, "images": 2.0, "audio_seconds": 2.5},
                      tokens_in=40, slot_seconds=0.2, upstream_headers=0.01), T0)
    r = Rollup()
    r.add(e)
    r.add(e)
    [row] = aggregate(r.take().items())
    assert (row["documents"], row["characters"], row["images"], row["audio_seconds"]) == (6, 22, 4, 5.0)
