"""UTC windows and time parsing (usage/windows.py): pure."""

from __future__ import annotations

import calendar
import math
from datetime import datetime, timezone

import pytest
from hypothesis import given, strategies as st

from homelab_frontend.usage import windows

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
