"""UTC windows: the hour a usage row belongs to, and the day and month a budget counts in.
Pure arithmetic on Unix seconds; a month ends at the first second of the next one."""

from __future__ import annotations

import calendar
import time
from datetime import datetime, timezone

HOUR = 3600
DAY = 86400


def hour_start(ts: float) -> int:
    return int(ts // HOUR) * HOUR


def day_start(ts: float) -> int:
    return int(ts // DAY) * DAY


def month_start(ts: float) -> int:
    d = time.gmtime(ts)
    return calendar.timegm((d.tm_year, d.tm_mon, 1, 0, 0, 0))


def next_month_start(ts: float) -> int:
    d = time.gmtime(ts)
    year, month = (d.tm_year + 1, 1) if d.tm_mon == 12 else (d.tm_year, d.tm_mon + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0))


def bucket_start(ts: float, by: str) -> int:
    return day_start(ts) if by == "day" else hour_start(ts)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    """ISO 8601 (a date, or a date and time; no zone means UTC) or Unix seconds. ValueError
    with a reason otherwise."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    raw = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        dt = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"{text!r} is neither ISO 8601 nor Unix seconds") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()
