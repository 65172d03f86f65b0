"""lifecycle/keep_alive.py: Ollama's keep_alive read as Ollama reads it (numbers, Go durations,
negative as forever), and the idle time a backend then gets within the operator's bounds: the
default when nobody asked or clients are ignored, never more than the cap, 0 without a prompt as
the only unload."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from homelab_frontend.config import ClientKeepAlive
from homelab_frontend.lifecycle.keep_alive import FOREVER, idle_ttl, seconds, unloads


@pytest.mark.parametrize("value, expected", [
    (300, 300.0), (2.5, 2.5), (0, 0.0), (-1, FOREVER), ("-1", FOREVER), ("-1m", FOREVER),
    ("5m", 300.0), ("1h30m", 5400.0), ("300ms", 0.3), ("90", 90.0), (" 10s ", 10.0), ("0", 0.0),
    ("1.5h", 5400.0),
])
def test_durations_as_ollama_reads_them(value, expected):
    assert seconds(value) == expected


@pytest.mark.parametrize("value", ["soon", "", "5 m", "m", "5d", True, None, [], {}, float("nan"), float("inf"), "1e999"])
def test_anything_else_is_refused_saying_what_is_accepted(value):
    with pytest.raises(ValueError) as err:
        seconds(value)
    assert "expected" in str(err.value)


def test_the_default_stands_when_nobody_asked_or_clients_are_ignored():
    assert idle_ttl(None, ClientKeepAlive(), 300.0) == 300.0
    assert idle_ttl(FOREVER, ClientKeepAlive(honour=False), 300.0) == 300.0
    assert idle_ttl(5.0, ClientKeepAlive(honour=False), None) is None


def test_forever_is_no_idle_stop_unless_capped():
    assert idle_ttl(FOREVER, ClientKeepAlive(), 300.0) is None
    assert idle_ttl(FOREVER, ClientKeepAlive(max_s=600.0), 300.0) == 600.0


def test_only_zero_without_a_prompt_unloads_and_only_when_honoured():
    assert unloads(0.0, ClientKeepAlive(), prompt=False)
    assert not unloads(0.0, ClientKeepAlive(), prompt=True)  # answered first, then a TTL of 0
    assert not unloads(0.0, ClientKeepAlive(honour=False), prompt=False)
    assert not unloads(5.0, ClientKeepAlive(), prompt=False) and not unloads(None, ClientKeepAlive(), prompt=False)
    assert not unloads(FOREVER, ClientKeepAlive(), prompt=False)


asked = st.one_of(st.none(), st.just(FOREVER), st.floats(0, 1e7, allow_nan=False))
caps = st.one_of(st.none(), st.floats(0, 1e7, allow_nan=False))
defaults = st.one_of(st.none(), st.floats(0.001, 1e7, allow_nan=False))


@given(asked, caps, st.booleans(), defaults)
def test_the_ttl_never_exceeds_the_cap_and_is_what_was_asked_within_it(a, cap, honour, default):
    rule = ClientKeepAlive(honour=honour, max_s=cap)
    ttl = idle_ttl(a, rule, default)
    if not honour or a is None:
        assert ttl == default
        return
    if cap is not None:
        assert ttl is not None and ttl <= cap
    if a is FOREVER:
        assert ttl == cap
    else:
        assert ttl == (a if cap is None else min(a, cap))


@given(st.integers(0, 10**6), st.sampled_from(["h", "m", "s", "ms"]))
def test_a_go_duration_is_its_number_times_its_unit(n, unit):
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}[unit]
    assert seconds(f"{n}{unit}") == pytest.approx(n * scale)
    assert seconds(f"-{n}{unit}") == (FOREVER if n else 0.0)
