"""W3C traceparent (tracing/traceparent.py): parsing, formatting and the headers sent upstream;
pure."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from homelab_frontend.tracing import traceparent

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_parse_a_valid_header():
    assert traceparent.parse(GOOD) == (0x4bf92f3577b34da6a3ce929d0e0e4736, 0x00f067aa0ba902b7, True)
    assert traceparent.parse(GOOD[:-2] + "00")[2] is False
    assert traceparent.parse(" " + GOOD.upper() + " ") is not None


@pytest.mark.parametrize("bad", [
    None, "", "garbage", "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01", GOOD + "-extra",
])
def test_an_invalid_header_starts_a_new_trace(bad):
    assert traceparent.parse(bad) is None


@given(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.booleans())
def test_format_and_parse_round_trip(trace_id, span_id, sampled):
    assert traceparent.parse(traceparent.format(trace_id, span_id, sampled)) == (trace_id, span_id, sampled)


def test_the_upstream_gets_the_upstream_spans_id_and_the_clients_tracestate():
    rt = traceparent.RequestTrace(7, 9, True, "vendor=x")
    h = rt.upstream_headers()
    assert traceparent.parse(h["traceparent"]) == (7, rt.upstream_id, True) and h["tracestate"] == "vendor=x"
    assert len({rt.span_id, rt.upstream_id}) == 2
