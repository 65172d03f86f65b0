"""UTC windows and the budget verdict (usage/windows.py, usage/budgets.py): pure."""

from __future__ import annotations

import calendar
import math
from datetime import datetime, timezone

import pytest
from hypothesis import given, strategies as st

from homelab_frontend import config as cfgmod
from homelab_frontend.usage import budgets, windows

TS = st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False)  # 1970 .. 2100


@given(TS)
def test_windows_contain_the_instant_and_are_aligned(ts):
    d = datetime.fromtimestamp(math.floor(ts), timezone.utc)  # (fromtimestamp rounds to the microsecond)
    assert windows.hour_start(ts) <= ts < windows.hour_start(ts) + 3600
    assert windows.day_start(ts) == calendar.timegm((d.year, d.month, d.day, 0, 0, 0))
    assert windows.month_start(ts) == calendar.timegm((d.year, d.month, 1, 0, 0, 0))
    nxt = windows.next_month_start(ts)
    assert windows.month_start(ts) <= ts < nxt and time_is_first_of_month(nxt)
    assert 28 * 86400 <= nxt - windows.month_start(ts) <= 31 * 86400


def time_is_first_of_month(ts: int) -> bool:
    d = datetime.fromtimestamp(ts, timezone.utc)
    return (d.day, d.hour, d.minute, d.second) == (1, 0, 0, 0)


@pytest.mark.parametrize("text,want", [
    ("2026-12-01T10:00:00Z", 1_796_119_200), ("2026-12-01T10:00:00+00:00", 1_796_119_200),
    ("2026-12-01T11:00:00+01:00", 1_796_119_200), ("2026-12-01T10:00:00", 1_796_119_200),
    ("2026-12-01", 1_796_083_200), ("1796119200", 1_796_119_200), ("1796119200.5", 1_796_119_200.5),
])
def test_parse_time_takes_iso_8601_and_unix_seconds(text, want):
    assert windows.parse_time(text) == want


@pytest.mark.parametrize("text", ["yesterday", "", "2026-13-01", "12:00"])
def test_parse_time_says_what_it_could_not_read(text):
    with pytest.raises(ValueError, match="ISO 8601"):
        windows.parse_time(text)


DEC_1_10H = 1_796_119_200.0  # 2026-12-01T10:00:00Z


def test_under_the_budget_nothing_is_refused():
    b = cfgmod.Budget(tokens_per_day=100, tokens_per_month=1000)
    assert budgets.refusal("k", b, 99, 999, DEC_1_10H) is None


def test_past_the_day_retry_after_is_the_seconds_to_utc_midnight():
    err = budgets.refusal("guest", cfgmod.Budget(tokens_per_day=100), 100, 100, DEC_1_10H)
    assert err is not None and err.kind == "rate_limit" and err.status == 429
    assert err.retry_after == 14 * 3600
    assert "tokens_per_day" in err.message and "'guest'" in err.message and "2026-12-02T00:00:00Z" in err.message


def test_past_both_the_later_reset_wins_and_is_not_capped():
    err = budgets.refusal("k", cfgmod.Budget(tokens_per_day=10, tokens_per_month=10), 10, 10, DEC_1_10H)
    assert err is not None and "tokens_per_month" in err.message
    assert err.retry_after == calendar.timegm((2027, 1, 1, 0, 0, 0)) - DEC_1_10H  # a month, not a day


@given(TS, st.integers(0, 10**6), st.integers(1, 10**6))
def test_refused_exactly_when_the_count_reaches_the_limit(ts, used, limit):
    err = budgets.refusal("k", cfgmod.Budget(tokens_per_day=limit), used, 0, ts)
    assert (err is not None) == (used >= limit)
    if err is not None:
        assert 0 < err.retry_after <= 86400 or err.retry_after == 1.0


def test_limits_only_for_keys_with_a_budget():
    auth = cfgmod.parse({"auth": {"keys": [
        {"name": "a", "key": "x", "budget": {"tokens_per_day": 5}},
        {"name": "b", "key": "y"}, {"name": "c", "key": "z", "budget": {}}]}}).auth
    assert set(budgets.limits_of(auth)) == {"a"}


def test_a_budget_below_one_is_a_config_problem():
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.parse({"auth": {"keys": [{"name": "a", "key": "x", "budget": {"tokens_per_day": 0}}]},
                      "usage": {"retention_days": 7}})
    assert err.value.problems == ["auth.keys[0].budget.tokens_per_day: must be at least 1, got 0",
                                  "usage.retention_days: must be at least 32, got 7"]
