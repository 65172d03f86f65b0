"""The budget verdict (usage/budgets.py): pure."""

from __future__ import annotations

import calendar

import pytest
from hypothesis import given, strategies as st

from homelab_frontend import config as cfgmod
from homelab_frontend.usage import budgets

TS = st.floats(min_value=0, max_value=4_102_444_800, allow_nan=False)  # 1970 .. 2100

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
